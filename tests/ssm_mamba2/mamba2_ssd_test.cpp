// The SSD chunked algorithm (Mamba-2's prefill kernels, as in mamba_ssm's ssd_minimal_discrete),
// written here from the Mamba-2 paper's equations, against the mode's core: chunked
// and sequential evaluation of the same recurrence must agree for any chunk size (1, 3, 8, larger
// than the sequence), with and without an initial state, at one group, one group per head and in
// between. The conv front end is the naive one (naive_mamba2.cpp), so the core is checked end to end.
// Run: ctest --test-dir <build> -L mamba2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mamba2_support.h"
#include "naive_ops.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

size_t at(int64_t i) { return static_cast<size_t>(i); }

// The recurrence's inputs for one request: x [L][Hs·P], B and C [L][G·N], Δ [L][Hs], A and D [Hs].
struct SsdInputs {
  Mamba2Dims dims;
  int64_t L = 0;
  std::vector<double> x, B, C, delta, A, D;
};

struct SsdResult {
  std::vector<double> y;      // [L][Hs·P], with the D skip
  std::vector<double> state;  // [Hs][P][N]
};

// Chunks of `chunk` tokens. Within a chunk, Λ_t = Σ_{r ≤ t} Δ_r·A (inclusive, from the chunk's
// start); with X_s = Δ_s·x_s and H the state entering the chunk:
//   y_t   = Σ_{s ≤ t} exp(Λ_t − Λ_s)·(C_t·B_s)·X_s  +  exp(Λ_t)·H·C_t  +  D·x_t
//   H'    = exp(Λ_last)·H + Σ_s exp(Λ_last − Λ_s)·X_s ⊗ B_s
SsdResult ssd_chunked(const SsdInputs& in, const std::vector<double>& initial_state, int64_t chunk) {
  const Mamba2Dims& d = in.dims;
  const int64_t P = d.P, N = d.N, G = d.G, L = in.L;
  SsdResult out{std::vector<double>(at(L * d.d_ssm())), initial_state};
  for (int64_t h = 0; h < d.Hs; ++h) {
    const int64_t g = h / (d.Hs / G);
    double* H = &out.state[at(h * P * N)];  // [P][N], carried across chunks
    for (int64_t begin = 0; begin < L; begin += chunk) {
      const int64_t end = std::min(begin + chunk, L);
      std::vector<double> cum(at(end - begin));  // Λ
      double running = 0.0;
      for (int64_t t = begin; t < end; ++t) cum[at(t - begin)] = running += in.delta[at(t * d.Hs + h)] * in.A[at(h)];
      const auto B = [&](int64_t s, int64_t n) { return in.B[at(s * G * N + g * N + n)]; };
      const auto C = [&](int64_t t, int64_t n) { return in.C[at(t * G * N + g * N + n)]; };
      const auto x = [&](int64_t t, int64_t p) { return in.x[at(t * d.d_ssm() + h * P + p)]; };

      for (int64_t t = begin; t < end; ++t) {
        for (int64_t p = 0; p < P; ++p) {
          double diag = 0.0;
          for (int64_t s = begin; s <= t; ++s) {
            double cb = 0.0;
            for (int64_t n = 0; n < N; ++n) cb += C(t, n) * B(s, n);
            diag += std::exp(cum[at(t - begin)] - cum[at(s - begin)]) * cb * in.delta[at(s * d.Hs + h)] * x(s, p);
          }
          double off = 0.0;
          for (int64_t n = 0; n < N; ++n) off += H[p * N + n] * C(t, n);
          out.y[at(t * d.d_ssm() + h * P + p)] = diag + std::exp(cum[at(t - begin)]) * off + in.D[at(h)] * x(t, p);
        }
      }
      const double last = cum[at(end - 1 - begin)];
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t n = 0; n < N; ++n) {
          double chunk_state = 0.0;
          for (int64_t s = begin; s < end; ++s) {
            chunk_state += std::exp(last - cum[at(s - begin)]) * in.delta[at(s * d.Hs + h)] * x(s, p) * B(s, n);
          }
          H[p * N + n] = std::exp(last) * H[p * N + n] + chunk_state;
        }
      }
    }
  }
  return out;
}

TEST(Mamba2Ssd, ChunkedAlgorithmEqualsTheCoresRecurrence) {
  const int64_t L = 23;  // not a multiple of any chunk below
  uint64_t seed = 50;
  // One group, one group per head, two heads per group.
  const std::vector<Mamba2Dims> shapes = {{8, 4, 3, 5, 1, 4}, {8, 4, 2, 6, 4, 2}, {8, 6, 4, 3, 3, 3}};
  for (const Mamba2Dims& d : shapes) {
    const auto tensors = random_weights(d, seed++);
    const NaiveMamba2 naive = naive_mamba2_model(d, views(tensors));
    const ssm::Mamba2CoreWeights core_weights = ssm::mamba2_core_weights(to_weights(tensors), core_sizes(d));
    const std::vector<double> xBC = normal_values(L * d.conv_dim(), seed++);
    const std::vector<double> dt = normal_values(L * d.Hs, seed++);
    for (const bool has_initial_state : {false, true}) {
      const NaiveMamba2State initial = has_initial_state ? random_state(d, seed++) : zero_state(d);

      // The recurrence's inputs from the naive conv and softplus, independent of the core.
      SsdInputs in{d, L, {}, {}, {}, std::vector<double>(at(L * d.Hs)), std::vector<double>(at(d.Hs)), naive.D};
      std::vector<double> conv_state = initial.conv;
      const std::vector<double> c = naive_mamba2_conv(naive, conv_state, xBC, L);
      for (int64_t t = 0; t < L; ++t) {
        const auto row = c.begin() + static_cast<std::ptrdiff_t>(t * d.conv_dim());
        in.x.insert(in.x.end(), row, row + d.d_ssm());
        in.B.insert(in.B.end(), row + d.d_ssm(), row + d.d_ssm() + d.G * d.N);
        in.C.insert(in.C.end(), row + d.d_ssm() + d.G * d.N, row + d.conv_dim());
        for (int64_t h = 0; h < d.Hs; ++h) {
          in.delta[at(t * d.Hs + h)] = naive_softplus(dt[at(t * d.Hs + h)] + naive.dt_bias[at(h)]);
        }
      }
      for (int64_t h = 0; h < d.Hs; ++h) in.A[at(h)] = -std::exp(naive.A_log[at(h)]);

      Eigen::VectorXd core_conv = to_eigen(initial.conv);
      Eigen::VectorXd core_ssm = to_eigen(initial.ssm);
      const std::vector<double> core_y =
          to_vector(ssm::mamba2_core(core_sizes(d), core_weights, to_matrix(xBC, L, d.conv_dim()),
                                     to_matrix(dt, L, d.Hs), core_conv, core_ssm, false));
      const Tolerance tol = mamba2_tolerance(d, L);
      expect_close(from_eigen(core_conv), conv_state, tol, describe(d) + " conv_state");
      for (const int64_t chunk : std::vector<int64_t>{1, 3, 8, L + 5}) {
        SCOPED_TRACE(describe(d) + " chunk " + std::to_string(chunk) +
                     (has_initial_state ? " initial state" : " zero state"));
        const SsdResult ssd = ssd_chunked(in, initial.ssm, chunk);
        expect_close(ssd.y, core_y, tol, "y");
        expect_close(ssd.state, from_eigen(core_ssm), tol, "final ssm_state");
      }
    }
  }
}

TEST(Mamba2Ssd, ChunkSizeDoesNotChangeTheResult) {
  // The chunked algorithm against itself: one chunk (the quadratic "attention" form of SSD) equals
  // single-token chunks (the pure recurrence) — the metamorphic relation the kernels rely on.
  const Mamba2Dims d{8, 4, 3, 2, 2, 2};
  const int64_t L = 17;
  SsdInputs in{d, L, normal_values(L * d.d_ssm(), 60), normal_values(L * d.G * d.N, 61),
               normal_values(L * d.G * d.N, 62), std::vector<double>(at(L * d.Hs)), {-1.0, -4.0, -0.5, -16.0},
               {1.0, 0.5, 1.5, 0.75}};
  const std::vector<double> raw = normal_values(L * d.Hs, 63);
  for (size_t i = 0; i < raw.size(); ++i) in.delta[i] = naive_softplus(raw[i] - 2.0);
  const std::vector<double> initial = normal_values(d.d_ssm() * d.N, 64);
  const SsdResult one_chunk = ssd_chunked(in, initial, L);
  const SsdResult per_token = ssd_chunked(in, initial, 1);
  const Tolerance tol = mamba2_tolerance(d, L);
  expect_close(one_chunk.y, per_token.y, tol, "y");
  expect_close(one_chunk.state, per_token.state, tol, "state");
}

}  // namespace
}  // namespace hybridtb::testing
