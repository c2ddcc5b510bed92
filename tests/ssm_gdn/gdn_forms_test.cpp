// The gdn core against other forms of the gated delta rule, written here from fla's and the
// Gated DeltaNet paper's equations and sharing no code with reference/ssm/gdn.cpp:
//   - the chunked WY form of fla's chunk_gated_delta_rule (in-chunk cumsum, (I + A)⁻¹ by forward
//     substitution, U, W, V_new, O and the exit state) at chunk sizes 1, 3, 64 and > L;
//   - the closed form S_t = α(I − β k̂ k̂ᵀ) S_{t−1} + β k̂ vᵀ;
//   - segments of chunks as affine maps of their entry state, formed apart and composed by a scan
//     (the chunk states in parallel);
// and metamorphic relations of the rule itself: β = 0 only decays the state, a huge A_log forgets
// the past, and writing the same (k, v) with α = β = 1 reaches the fixed point M k̂ = v while
// leaving M unchanged on k̂'s orthogonal complement. Run: ctest --test-dir <build> -L gdn
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gdn_support.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

size_t at(int64_t i) { return static_cast<size_t>(i); }

// {H, Hk, Hv, dk, dv, K}: grouped and plain value heads, dk ≠ dv both ways.
const std::vector<GdnDims> kDims = {{8, 1, 2, 4, 3, 4}, {12, 2, 2, 5, 6, 2}, {16, 2, 4, 8, 8, 4}};

// Random front-end inputs for L tokens and the naive front end's view of them.
struct Inputs {
  std::vector<double> mixed;  // [L][C]
  std::vector<double> a;      // [L][Hv]
  std::vector<double> b;      // [L][Hv]
};

Inputs random_inputs(const GdnDims& d, int64_t L, uint64_t seed) {
  return {normal_values(L * d.C(), seed), normal_values(L * d.Hv, seed + 1), normal_values(L * d.Hv, seed + 2)};
}

GdnTokens tokens_of(const NaiveGdn& model, const NaiveGdnState& state, const Inputs& in, int64_t L) {
  std::vector<double> conv = state.conv;
  return naive_gdn_tokens(model, conv, in.mixed, in.a, in.b, L);
}

double dot(const double* x, const double* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// --- the chunked WY form ---------------------------------------------------------------------------------

// fla's chunk_gated_delta_rule for all value heads, K-major S [Hv][dk][dv]; returns o [L][Hv][dv].
// Per chunk of n tokens (local i, j), with entry state S:
//   G_i = Σ_{r≤i} g_r,  Γ_ij = exp(G_i − G_j) (j ≤ i only, so ≤ 1)
//   A_ij = β_i Γ_ij (k̂_i·k̂_j) for j < i;  T = (I + A)⁻¹: T_i = e_i − Σ_{j<i} A_ij T_j
//   U = T diag(β) V,  W = T diag(β e^G) K,  V_new = U − W S
//   O_i = e^{G_i} Sᵀq̂_i + Σ_{j≤i} (q̂_i·k̂_j) Γ_ij V_new_j
//   S' = e^{G_n} S + Σ_i e^{G_n − G_i} k̂_i V_new_iᵀ
std::vector<double> chunked_delta_rule(const GdnDims& d, const GdnTokens& tk, std::vector<double>& S, int64_t chunk) {
  const int64_t L = tk.L, Hv = d.Hv, dk = d.dk, dv = d.dv;
  std::vector<double> o(at(L * Hv * dv), 0.0);
  for (int64_t h = 0; h < Hv; ++h) {
    double* s = &S[at(h * dk * dv)];
    for (int64_t start = 0; start < L; start += chunk) {
      const int64_t n = std::min(chunk, L - start);
      const auto q = [&](int64_t i) { return &tk.q[at(((start + i) * Hv + h) * dk)]; };
      const auto k = [&](int64_t i) { return &tk.k[at(((start + i) * Hv + h) * dk)]; };
      const auto v = [&](int64_t i) { return &tk.v[at(((start + i) * Hv + h) * dv)]; };
      const auto beta = [&](int64_t i) { return tk.beta[at((start + i) * Hv + h)]; };

      const ChunkWy wy = chunk_wy(tk, Hv, dk, h, start, n, k(0), Hv * dk);
      const std::vector<double>&G = wy.G, &T = wy.T;

      std::vector<double> v_new(at(n * dv), 0.0);  // U − W S
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> w(at(dk), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double t_ij = T[at(i * n + j)];
          for (int64_t c = 0; c < dv; ++c) v_new[at(i * dv + c)] += t_ij * beta(j) * v(j)[c];
          for (int64_t r = 0; r < dk; ++r) w[at(r)] += t_ij * beta(j) * std::exp(G[at(j)]) * k(j)[r];
        }
        for (int64_t c = 0; c < dv; ++c) {
          for (int64_t r = 0; r < dk; ++r) v_new[at(i * dv + c)] -= w[at(r)] * s[r * dv + c];
        }
      }

      for (int64_t i = 0; i < n; ++i) {
        double* out = &o[at(((start + i) * Hv + h) * dv)];
        for (int64_t c = 0; c < dv; ++c) {
          double from_state = 0.0;
          for (int64_t r = 0; r < dk; ++r) from_state += q(i)[r] * s[r * dv + c];
          out[c] = std::exp(G[at(i)]) * from_state;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double weight = dot(q(i), k(j), dk) * std::exp(G[at(i)] - G[at(j)]);
          for (int64_t c = 0; c < dv; ++c) out[c] += weight * v_new[at(j * dv + c)];
        }
      }

      const double G_last = G[at(n - 1)];
      for (int64_t e = 0; e < dk * dv; ++e) s[e] *= std::exp(G_last);
      for (int64_t i = 0; i < n; ++i) {
        const double decay = std::exp(G_last - G[at(i)]);
        for (int64_t r = 0; r < dk; ++r) {
          for (int64_t c = 0; c < dv; ++c) s[r * dv + c] += decay * k(i)[r] * v_new[at(i * dv + c)];
        }
      }
    }
  }
  return o;
}

// Checks the chunked form against the mode's core (the token recurrence on the V-major state) and
// the naive K-major loop, from a random initial state, at every chunk size.
void expect_chunked_equals_recurrence(const GdnDims& d, const ssm::Weights& weights, const NaiveGdn& naive,
                                      const NaiveGdnState& initial, const Inputs& in, int64_t L) {
  NaiveGdnState core_state = initial;
  const std::vector<double> core = run_core(weights, core_state, d, in.mixed, in.a, in.b, L, false);
  const GdnTokens tokens = tokens_of(naive, initial, in, L);
  std::vector<double> loop_S = initial.S;
  const std::vector<double> loop = naive_delta_rule(d, tokens, loop_S);
  for (const int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{64}, L + 7}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Tolerance tol = gdn_tolerance(d, L, chunk);
    std::vector<double> S = initial.S;
    const std::vector<double> chunked = chunked_delta_rule(d, tokens, S, chunk);
    expect_close(chunked, core, tol, "chunked o vs the core's recurrence");
    expect_close(S, core_state.S, tol, "chunked exit state vs the core's recurrence");
    expect_close(chunked, loop, tol, "chunked o vs the naive loop");
    expect_close(S, loop_S, tol, "chunked exit state vs the naive loop");
  }
}

TEST(GdnForms, ChunkedWyEqualsTheRecurrence) {
  uint64_t seed = 1000;
  for (const GdnDims& d : kDims) {
    for (const int64_t L : {1, 23, 130}) {  // 130 = 2·64 + 2: two full chunks of 64 and a partial one
      SCOPED_TRACE(describe(d) + " L=" + std::to_string(L));
      const auto tensors = random_weights(d, seed++);
      const NaiveGdnState initial = random_state(d, seed++);
      expect_chunked_equals_recurrence(d, to_weights(tensors), naive_gdn_model(d, views(tensors)), initial,
                                       random_inputs(d, L, seed), L);
      seed += 3;
    }
  }
}

TEST(GdnForms, ChunkedWyStaysFiniteWhenTheChunkDecayUnderflows) {
  // a = 30: g ≈ −(1…16)·26 per token, so Σg over a 64-token chunk reaches −1e4 and exp(G_i)
  // underflows to 0; the differences G_i − G_j (j ≤ i) keep Γ ≤ 1 and finite (fla's form; the
  // inverse-gamma form of pymllm's torch path would divide by 0 here).
  const GdnDims d{12, 2, 4, 4, 4, 3};
  const auto tensors = random_weights(d, 1100);
  Inputs in = random_inputs(d, 130, 1101);
  for (double& a : in.a) a = 30.0;
  const NaiveGdn naive = naive_gdn_model(d, views(tensors));
  const GdnTokens tokens = tokens_of(naive, random_state(d, 1102), in, 130);
  EXPECT_LT(*std::max_element(tokens.g.begin(), tokens.g.end()) * 64.0, -745.0) << "exp(G) must underflow";
  expect_chunked_equals_recurrence(d, to_weights(tensors), naive, random_state(d, 1102), in, 130);
}

// --- segments composed: the chunk states in parallel ------------------------------------------------------

// Per value head a chunk of the WY form is an affine map of its entry state S (K-major [dk][dv]):
//   S' = Φ·S + B,  Φ = e^{G_n}·I − Kᵀ·D·W,  B = Kᵀ·D·U,  D = diag(e^{G_n − G_i}),
// (S' = e^{G_n}·S + Kᵀ·D·V_new with V_new = U − W·S). A run of chunks is one such map, and maps
// compose as (Φ₂, B₂)∘(Φ₁, B₁) = (Φ₂·Φ₁, Φ₂·B₁ + B₂): a long prefill can form each segment's map in
// parallel, find every segment's entry state by a short scan over the segments, and run the
// segments' chunks from those states in parallel (what the per-head chunk chain cannot do when the
// heads are few). Returns the map of chunk [start, start + n) of value head h: Φ [dk][dk], B [dk][dv].
struct ChunkMap {
  std::vector<double> phi, b;
};
ChunkMap chunk_map(const GdnDims& d, const GdnTokens& tk, int64_t h, int64_t start, int64_t n) {
  const int64_t Hv = d.Hv, dk = d.dk, dv = d.dv;
  const auto k = [&](int64_t i) { return &tk.k[at(((start + i) * Hv + h) * dk)]; };
  const auto v = [&](int64_t i) { return &tk.v[at(((start + i) * Hv + h) * dv)]; };
  const auto beta = [&](int64_t i) { return tk.beta[at((start + i) * Hv + h)]; };
  const ChunkWy wy = chunk_wy(tk, Hv, dk, h, start, n, k(0), Hv * dk);
  const std::vector<double>&G = wy.G, &T = wy.T;
  ChunkMap map{std::vector<double>(at(dk * dk), 0.0), std::vector<double>(at(dk * dv), 0.0)};
  for (int64_t r = 0; r < dk; ++r) map.phi[at(r * dk + r)] = std::exp(G[at(n - 1)]);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> w(at(dk), 0.0), u(at(dv), 0.0);  // row i of W and of U
    for (int64_t j = 0; j <= i; ++j) {
      const double t_ij = T[at(i * n + j)];
      for (int64_t c = 0; c < dv; ++c) u[at(c)] += t_ij * beta(j) * v(j)[c];
      for (int64_t r = 0; r < dk; ++r) w[at(r)] += t_ij * beta(j) * std::exp(G[at(j)]) * k(j)[r];
    }
    const double decay = std::exp(G[at(n - 1)] - G[at(i)]);
    for (int64_t r = 0; r < dk; ++r) {
      for (int64_t m = 0; m < dk; ++m) map.phi[at(r * dk + m)] -= decay * k(i)[r] * w[at(m)];
      for (int64_t c = 0; c < dv; ++c) map.b[at(r * dv + c)] += decay * k(i)[r] * u[at(c)];
    }
  }
  return map;
}

// x [rows][inner] · y [inner][cols], row-major.
std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& y, int64_t rows, int64_t inner,
                           int64_t cols) {
  std::vector<double> z(at(rows * cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t m = 0; m < inner; ++m) {
      for (int64_t c = 0; c < cols; ++c) z[at(r * cols + c)] += x[at(r * inner + m)] * y[at(m * cols + c)];
    }
  }
  return z;
}

// Tokens [begin, end) of tk.
GdnTokens slice(const GdnDims& d, const GdnTokens& tk, int64_t begin, int64_t end) {
  const auto rows = [&](const std::vector<double>& x, int64_t width) {
    return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(begin * width),
                               x.begin() + static_cast<std::ptrdiff_t>(end * width));
  };
  return {end - begin, rows(tk.q, d.Hv * d.dk), rows(tk.k, d.Hv * d.dk), rows(tk.v, d.Hv * d.dv), rows(tk.g, d.Hv),
          rows(tk.beta, d.Hv)};
}

TEST(GdnForms, SegmentMapsComposeToTheRecurrence) {
  uint64_t seed = 1100;
  constexpr int64_t kChunk = 16, kChunksPerSegment = 3;
  for (const GdnDims& d : kDims) {
    const int64_t L = 7 * kChunk + 5;  // three segments: 3, 3 and 2 chunks, the last one partial
    SCOPED_TRACE(describe(d) + " L=" + std::to_string(L));
    const auto tensors = random_weights(d, seed++);
    const NaiveGdnState initial = random_state(d, seed++);
    const GdnTokens tk = tokens_of(naive_gdn_model(d, views(tensors)), initial, random_inputs(d, L, seed), L);
    seed += 3;
    const Tolerance tol = gdn_tolerance(d, L, kChunk);
    std::vector<double> loop_S = initial.S;
    const std::vector<double> loop = naive_delta_rule(d, tk, loop_S);

    // Each segment's map from its chunks' (in any order of segments: they do not depend on each other).
    const int64_t segment_tokens = kChunksPerSegment * kChunk;
    const int64_t segments = (L + segment_tokens - 1) / segment_tokens;
    std::vector<std::vector<ChunkMap>> maps(at(segments), std::vector<ChunkMap>(at(d.Hv)));
    for (int64_t sg = 0; sg < segments; ++sg) {
      for (int64_t h = 0; h < d.Hv; ++h) {
        ChunkMap whole{std::vector<double>(at(d.dk * d.dk), 0.0), std::vector<double>(at(d.dk * d.dv), 0.0)};
        for (int64_t r = 0; r < d.dk; ++r) whole.phi[at(r * d.dk + r)] = 1.0;
        for (int64_t start = sg * segment_tokens; start < std::min(L, (sg + 1) * segment_tokens); start += kChunk) {
          const ChunkMap c = chunk_map(d, tk, h, start, std::min(kChunk, L - start));
          std::vector<double> b = matmul(c.phi, whole.b, d.dk, d.dk, d.dv);
          for (size_t e = 0; e < b.size(); ++e) b[e] += c.b[e];
          whole = {matmul(c.phi, whole.phi, d.dk, d.dk, d.dk), std::move(b)};
        }
        maps[at(sg)][at(h)] = std::move(whole);
      }
    }
    // The scan over the segments' maps alone gives every segment's entry state.
    std::vector<std::vector<double>> entry(at(segments + 1));
    entry[0] = initial.S;
    for (int64_t sg = 0; sg < segments; ++sg) {
      entry[at(sg + 1)].resize(initial.S.size());
      for (int64_t h = 0; h < d.Hv; ++h) {
        const auto s0 = static_cast<std::ptrdiff_t>(h * d.dk * d.dv);
        const std::vector<double> in(entry[at(sg)].begin() + s0, entry[at(sg)].begin() + s0 + d.dk * d.dv);
        const std::vector<double> out = matmul(maps[at(sg)][at(h)].phi, in, d.dk, d.dk, d.dv);
        for (size_t e = 0; e < out.size(); ++e) entry[at(sg + 1)][at(s0) + e] = out[e] + maps[at(sg)][at(h)].b[e];
      }
    }
    // Each segment's chunks run from its scanned entry state, independently of the others.
    std::vector<double> o;
    for (int64_t sg = 0; sg < segments; ++sg) {
      const int64_t begin = sg * segment_tokens, end = std::min(L, begin + segment_tokens);
      std::vector<double> S = entry[at(sg)];
      const std::vector<double> part = chunked_delta_rule(d, slice(d, tk, begin, end), S, kChunk);
      o.insert(o.end(), part.begin(), part.end());
      expect_close(S, entry[at(sg + 1)], tol, "segment " + std::to_string(sg) + ": its chunks' exit state vs the scan");
    }
    expect_close(o, loop, tol, "o of the segments run from the scanned entry states vs the naive loop");
    expect_close(entry[at(segments)], loop_S, tol, "the scan's exit state vs the naive loop");
  }
}

// --- the closed form -------------------------------------------------------------------------------------

TEST(GdnForms, ClosedFormEqualsTheLoop) {
  uint64_t seed = 1200;
  for (const GdnDims& d : kDims) {
    SCOPED_TRACE(describe(d));
    const auto tensors = random_weights(d, seed++);
    const NaiveGdn naive = naive_gdn_model(d, views(tensors));
    const int64_t L = 17;
    const NaiveGdnState initial = random_state(d, seed++);
    const Inputs in = random_inputs(d, L, seed);
    seed += 3;
    const GdnTokens tk = tokens_of(naive, initial, in, L);

    // S_t = α(I − β k̂ k̂ᵀ) S_{t−1} + β k̂ vᵀ per value head, as explicit matrix products;
    // o_t = S_tᵀ q̂_t.
    std::vector<double> S = initial.S;
    std::vector<double> closed(at(L * d.Hv * d.dv), 0.0);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t h = 0; h < d.Hv; ++h) {
        const double* q = &tk.q[at((t * d.Hv + h) * d.dk)];
        const double* k = &tk.k[at((t * d.Hv + h) * d.dk)];
        const double* v = &tk.v[at((t * d.Hv + h) * d.dv)];
        const double alpha = std::exp(tk.g[at(t * d.Hv + h)]), beta = tk.beta[at(t * d.Hv + h)];
        double* s = &S[at(h * d.dk * d.dv)];
        std::vector<double> next(at(d.dk * d.dv), 0.0);
        for (int64_t r = 0; r < d.dk; ++r) {
          for (int64_t c = 0; c < d.dv; ++c) {
            double sum = beta * k[r] * v[c];
            for (int64_t m = 0; m < d.dk; ++m) {
              const double transition = alpha * ((r == m ? 1.0 : 0.0) - beta * k[r] * k[m]);
              sum += transition * s[m * d.dv + c];
            }
            next[at(r * d.dv + c)] = sum;
          }
        }
        std::copy(next.begin(), next.end(), s);
        for (int64_t c = 0; c < d.dv; ++c) {
          double read = 0.0;
          for (int64_t r = 0; r < d.dk; ++r) read += s[r * d.dv + c] * q[r];
          closed[at((t * d.Hv + h) * d.dv + c)] = read;
        }
      }
    }

    const Tolerance tol = gdn_tolerance(d, L);
    std::vector<double> loop_S = initial.S;
    expect_close(closed, naive_delta_rule(d, tk, loop_S), tol, "closed form o vs the naive loop");
    expect_close(S, loop_S, tol, "closed form state vs the naive loop");
    NaiveGdnState core_state = initial;
    expect_close(closed, run_core(to_weights(tensors), core_state, d, in.mixed, in.a, in.b, L, false), tol,
                 "closed form o vs the core");
    expect_close(S, core_state.S, tol, "closed form state vs the core");
  }
}

// --- metamorphic relations of the rule -----------------------------------------------------------------

TEST(GdnMetamorphic, BetaZeroOnlyDecaysTheState) {
  // b = −∞ → β = 0: nothing is written, M_t = α_t M_{t−1}, so M_t = exp(Σ_{r≤t} g_r) M_0 and
  // o_t = M_t q̂_t.
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode steps" : "prefill");
    const GdnDims d{12, 2, 4, 3, 5, 4};
    const auto tensors = random_weights(d, 1300);
    const int64_t L = 7;
    const NaiveGdnState initial = random_state(d, 1301);
    Inputs in = random_inputs(d, L, 1302);
    for (double& b : in.b) b = -std::numeric_limits<double>::infinity();
    const GdnTokens tk = tokens_of(naive_gdn_model(d, views(tensors)), initial, in, L);

    std::vector<double> expected(at(L * d.Hv * d.dv));
    std::vector<double> expected_S = initial.S;
    std::vector<double> log_decay(at(d.Hv), 0.0);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t h = 0; h < d.Hv; ++h) {
        log_decay[at(h)] += tk.g[at(t * d.Hv + h)];
        for (int64_t c = 0; c < d.dv; ++c) {
          double read = 0.0;
          for (int64_t r = 0; r < d.dk; ++r) {
            read += initial.S[at((h * d.dk + r) * d.dv + c)] * tk.q[at((t * d.Hv + h) * d.dk + r)];
          }
          expected[at((t * d.Hv + h) * d.dv + c)] = std::exp(log_decay[at(h)]) * read;
        }
      }
    }
    for (int64_t h = 0; h < d.Hv; ++h) {
      for (int64_t e = 0; e < d.dk * d.dv; ++e) expected_S[at(h * d.dk * d.dv + e)] *= std::exp(log_decay[at(h)]);
    }
    ASSERT_GT(max_abs_difference(expected_S, initial.S), 1e-3) << "the decay must be visible";

    const ssm::Weights weights = to_weights(tensors);
    NaiveGdnState state = initial;
    std::vector<double> o;
    if (decode) {
      for (int64_t t = 0; t < L; ++t) {
        const auto rows = [&](const std::vector<double>& v, int64_t width) {
          return std::vector<double>(v.begin() + t * width, v.begin() + (t + 1) * width);
        };
        const std::vector<double> step =
            run_core(weights, state, d, rows(in.mixed, d.C()), rows(in.a, d.Hv), rows(in.b, d.Hv), 1, true);
        o.insert(o.end(), step.begin(), step.end());
      }
    } else {
      o = run_core(weights, state, d, in.mixed, in.a, in.b, L, false);
    }
    const Tolerance tol = gdn_tolerance(d, L);
    expect_close(o, expected, tol, "o with beta = 0");
    expect_close(state.S, expected_S, tol, "state with beta = 0");
  }
}

TEST(GdnMetamorphic, HugeALogForgetsThePast) {
  // A_log = 50 → g ≈ −5e21·softplus(·) → α = 0 exactly: the state after each token is β k̂ vᵀ
  // whatever it was before, so the recurrent state a request starts from cannot matter.
  const GdnDims d{16, 2, 4, 4, 3, 4};
  auto tensors = random_weights(d, 1400);
  for (int64_t h = 0; h < d.Hv; ++h) store_from_double(tensors.at("A_log").data(), DType::kFloat32, h, 50.0);
  const ssm::Weights weights = to_weights(tensors);
  const int64_t L = 5;
  const std::vector<double> hidden = normal_values(L * d.H, 1401);
  const NaiveGdnState first = random_state(d, 1402);
  NaiveGdnState other = random_state(d, 1404);
  other.conv = first.conv;  // only the recurrent state differs
  NaiveGdnState zero = first;
  std::fill(zero.S.begin(), zero.S.end(), 0.0);

  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    const int64_t n = decode ? 1 : L;
    NaiveGdnState a = first, b = other, c = zero;
    const std::vector<double> out_a = run_mode(weights, a, hidden, d, 0, n, decode);
    EXPECT_EQ(run_mode(weights, b, hidden, d, 0, n, decode), out_a);
    EXPECT_EQ(run_mode(weights, c, hidden, d, 0, n, decode), out_a);
    EXPECT_EQ(a.S, b.S);
    EXPECT_EQ(a.S, c.S);
  }

  // After one token the state is exactly what that token wrote: β k̂ vᵀ.
  const NaiveGdn naive = naive_gdn_model(d, views(tensors));
  NaiveGdnState state = first;
  const Inputs in = random_inputs(d, 1, 1405);
  run_core(weights, state, d, in.mixed, in.a, in.b, 1, false);
  const GdnTokens tk = tokens_of(naive, first, in, 1);
  std::vector<double> written(at(d.Hv * d.dk * d.dv));
  for (int64_t h = 0; h < d.Hv; ++h) {
    for (int64_t r = 0; r < d.dk; ++r) {
      for (int64_t c = 0; c < d.dv; ++c) {
        written[at((h * d.dk + r) * d.dv + c)] = tk.beta[at(h)] * tk.k[at(h * d.dk + r)] * tk.v[at(h * d.dv + c)];
      }
    }
  }
  expect_close(state.S, written, gdn_tolerance(d, 1), "state after one token with alpha = 0");
}

TEST(GdnMetamorphic, RepeatedWriteReachesTheDeltaRuleFixedPoint) {
  // α = 1 (dt_bias = −1e4: softplus = 0, g = 0) and β = 1 (b = +∞), the conv an identity on the
  // current token (qkv = silu(mixed_qkv)), the same mixed_qkv every token, q channels = k channels.
  // Each write moves M k̂ to v but for the factor 1 − ‖k̂‖² ≈ 1e-6 (the L2 eps), so after a few
  // tokens M k̂ = v, hence o = M q̂ = dk^-1/2·v; and M x = M_0 x for every x ⊥ k̂ (the delta rule
  // only rewrites the k̂ direction).
  const GdnDims d{8, 1, 2, 4, 3, 3};
  ssm::Weights weights = to_weights(random_weights(d, 1500));
  weights.at("conv1d_weight").setZero();
  weights.at("conv1d_weight").col(d.K - 1).setOnes();
  weights.erase("conv1d_bias");
  weights.at("dt_bias").setConstant(-1e4);

  const int64_t L = 6;
  std::vector<double> row = normal_values(d.C(), 1501);
  for (int64_t r = 0; r < d.dk; ++r) row[at(r)] = row[at(d.Hk * d.dk + r)];  // q = k (one key head)
  std::vector<double> mixed;
  for (int64_t t = 0; t < L; ++t) mixed.insert(mixed.end(), row.begin(), row.end());
  const std::vector<double> a = normal_values(L * d.Hv, 1502);
  const std::vector<double> b(at(L * d.Hv), std::numeric_limits<double>::infinity());

  const auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  std::vector<double> k_hat(at(d.dk)), v(at(d.Hv * d.dv));
  double norm_squared = 0.0;
  for (int64_t r = 0; r < d.dk; ++r) norm_squared += silu(row[at(d.dk + r)]) * silu(row[at(d.dk + r)]);
  for (int64_t r = 0; r < d.dk; ++r) k_hat[at(r)] = silu(row[at(d.dk + r)]) / std::sqrt(norm_squared + 1e-6);
  for (int64_t c = 0; c < d.Hv * d.dv; ++c) v[at(c)] = silu(row[at(2 * d.dk + c)]);
  std::vector<double> orthogonal = normal_values(d.dk, 1503);  // x − (x·k̂)k̂/‖k̂‖²
  const double along = dot(orthogonal.data(), k_hat.data(), d.dk) / dot(k_hat.data(), k_hat.data(), d.dk);
  for (int64_t r = 0; r < d.dk; ++r) orthogonal[at(r)] -= along * k_hat[at(r)];

  // M x for the K-major S of every head: (Sᵀx)[c] = Σ_r S[r][c] x[r].
  const auto apply = [&](const std::vector<double>& S, const std::vector<double>& x) {
    std::vector<double> out(at(d.Hv * d.dv), 0.0);
    for (int64_t h = 0; h < d.Hv; ++h) {
      for (int64_t c = 0; c < d.dv; ++c) {
        for (int64_t r = 0; r < d.dk; ++r) out[at(h * d.dv + c)] += S[at((h * d.dk + r) * d.dv + c)] * x[at(r)];
      }
    }
    return out;
  };

  const NaiveGdnState initial = random_state(d, 1504);
  ASSERT_GT(max_abs_difference(apply(initial.S, k_hat), v), 0.1) << "the initial state must be off the fixed point";
  NaiveGdnState state = initial;
  const std::vector<double> o = run_core(weights, state, d, mixed, a, b, L, false);
  const Tolerance tol = gdn_tolerance(d, L);
  expect_close(apply(state.S, k_hat), v, tol, "M k^ after repeated writes");
  expect_close(apply(state.S, orthogonal), apply(initial.S, orthogonal), tol, "M x for x orthogonal to k^");
  std::vector<double> scaled_v = v;
  for (double& value : scaled_v) value /= std::sqrt(static_cast<double>(d.dk));
  const std::vector<double> last(o.end() - d.Hv * d.dv, o.end());
  expect_close(last, scaled_v, tol, "o = M q^ = v / sqrt(dk) at the fixed point");
}

}  // namespace
}  // namespace hybridtb::testing
