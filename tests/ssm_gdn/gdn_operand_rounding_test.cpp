// The Gated DeltaNet terms of the tolerance table's 16-bit-operand row (tolerance.h: "The same for a
// Gated DeltaNet chunked prefill") against a float64 emulation of what the cuda prefill rounds with
// ssm_prefill_operands model (optimized/src/ssm/gdn_prefill.cu): the chunked WY form of
// gdn_forms_test.cpp in 64-token chunks with, rounded once to the 16-bit model dtype,
//   q̂ and k̂ in k̂·k̂ᵀ, q̂·k̂ᵀ, the state update and the read-out; P = (q̂·k̂ᵀ)∘Γ; the in-chunk
//   inverse T and the right-hand sides β·v and β·e^G·k̂ in U = T·diag(β)·V and W = T·diag(β·e^G)·K;
//   W; the entering state (in W·Sᵀ and, as h_c, in the read-out); V_new (in P·V_new) and
//   V_new·decay (in the state update);
// and everything else exact: T itself (from the exact A of the rounded keys), U, the gates and
// decays, the carried state and every sum (the kernels' float32 sums are the float32 row's part). On the
// data the derivation assumes (weights drawn as the mode's specs say, unit-normal conv inputs, a
// standard-normal initial state), the emulation's errors against the exact recurrence must stay
// within the row's 16-bit term e16 — the row's atol with 16-bit operands minus its atol with float32
// ones — for the exit state and for the contribution (the core's o through the gated RMSNorm and
// out_proj, as a layer's output). The derivation's bounds are estimates for independent directions;
// this measures them on realistic head sizes. Run: ctest --test-dir <build> -L gdn
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gdn_support.h"
#include "hybridtb/dtype.h"
#include "naive_ops.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

constexpr int64_t kChunk = 64;  // the cuda prefill's chunk (kGdnChunk)

// x rounded as the kernels round a float32 value to the 16-bit operand dtype (to nearest even).
double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  return dtype == DType::kBFloat16 ? bfloat16_to_float(float_to_bfloat16(f)) : half_to_float(float_to_half(f));
}

double dot(const double* x, const double* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// The chunked WY form with the cuda prefill's 16-bit operand roundings (above), K-major S
// [Hv][dk][dv] advanced in place; returns o [L][Hv][dv].
std::vector<double> chunked_with_rounded_operands(const GdnDims& d, const GdnTokens& tk, std::vector<double>& S,
                                                  DType operands) {
  const int64_t L = tk.L, Hv = d.Hv, dk = d.dk, dv = d.dv;
  const auto r = [&](double x) { return round_to(operands, x); };
  std::vector<double> o(at(L * Hv * dv), 0.0);
  for (int64_t h = 0; h < Hv; ++h) {
    double* s = &S[at(h * dk * dv)];
    for (int64_t start = 0; start < L; start += kChunk) {
      const int64_t n = std::min(kChunk, L - start);
      const auto beta = [&](int64_t i) { return tk.beta[at((start + i) * Hv + h)]; };
      const auto k = [&](int64_t i) { return &tk.k[at(((start + i) * Hv + h) * dk)]; };
      const auto v = [&](int64_t i) { return &tk.v[at(((start + i) * Hv + h) * dv)]; };
      std::vector<double> qr(at(n * dk)), kr(at(n * dk));  // q̂, k̂ as the products' operands
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = 0; c < dk; ++c) {
          qr[at(i * dk + c)] = r(tk.q[at(((start + i) * Hv + h) * dk + c)]);
          kr[at(i * dk + c)] = r(k(i)[c]);
        }
      }
      // G, and T = (I + A)⁻¹ with A_ij = β_i·Γ_ij·(k̂_i·k̂_j) of the rounded keys, exact.
      const ChunkWy wy = chunk_wy(tk, Hv, dk, h, start, n, kr.data(), dk);
      const std::vector<double>&G = wy.G, &T = wy.T;
      // V_new = U − round(W)·round(S) with U = round(T)·round(diag(β)·V) and
      // W = round(T)·round(diag(β·e^G)·K), each summed exactly.
      std::vector<double> s_in(at(dk * dv));
      for (int64_t e = 0; e < dk * dv; ++e) s_in[at(e)] = r(s[e]);
      std::vector<double> v_new(at(n * dv), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> w(at(dk), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double t_ij = r(T[at(i * n + j)]);
          for (int64_t c = 0; c < dv; ++c) v_new[at(i * dv + c)] += t_ij * r(beta(j) * v(j)[c]);
          for (int64_t q = 0; q < dk; ++q) w[at(q)] += t_ij * r(beta(j) * std::exp(G[at(j)]) * k(j)[q]);
        }
        for (int64_t q = 0; q < dk; ++q) w[at(q)] = r(w[at(q)]);
        for (int64_t c = 0; c < dv; ++c) {
          for (int64_t q = 0; q < dk; ++q) v_new[at(i * dv + c)] -= w[at(q)] * s_in[at(q * dv + c)];
        }
      }
      // O_i = e^{G_i}·round(S)ᵀ·round(q̂_i) + Σ_{j≤i} round(P_ij)·round(V_new_j).
      for (int64_t i = 0; i < n; ++i) {
        double* out = &o[at(((start + i) * Hv + h) * dv)];
        for (int64_t c = 0; c < dv; ++c) {
          double from_state = 0.0;
          for (int64_t q = 0; q < dk; ++q) from_state += qr[at(i * dk + q)] * s_in[at(q * dv + c)];
          out[c] = std::exp(G[at(i)]) * from_state;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = r(dot(&qr[at(i * dk)], &kr[at(j * dk)], dk) * std::exp(G[at(i)] - G[at(j)]));
          for (int64_t c = 0; c < dv; ++c) out[c] += p * r(v_new[at(j * dv + c)]);
        }
      }
      // S ← e^{G_n}·S + Σ_i round(k̂_i)·round(V_new_i·e^{G_n − G_i})ᵀ, S itself exact.
      const double G_last = G[at(n - 1)];
      for (int64_t e = 0; e < dk * dv; ++e) s[e] *= std::exp(G_last);
      for (int64_t i = 0; i < n; ++i) {
        const double decay = std::exp(G_last - G[at(i)]);
        for (int64_t q = 0; q < dk; ++q) {
          for (int64_t c = 0; c < dv; ++c) s[q * dv + c] += kr[at(i * dk + q)] * r(v_new[at(i * dv + c)] * decay);
        }
      }
    }
  }
  return o;
}

// The layer's contribution from the core's o [L][Hv][dv]: the gated RMSNorm per value head with
// gate z [L][Hv·dv], then out_proj (naive_gdn's tail).
std::vector<double> contribution(const NaiveGdn& m, const std::vector<double>& o, const std::vector<double>& z,
                                 int64_t L) {
  const GdnDims& d = m.dims;
  const int64_t V = d.Hv * d.dv;
  std::vector<double> out(at(L * d.H));
  std::vector<double> y(at(V));
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t i = 0; i < d.Hv; ++i) {
      naive_gated_rms_norm(&o[at(t * V + i * d.dv)], &z[at(t * V + i * d.dv)], m.norm_weight.data(), d.dv, 1e-6, true,
                           &y[at(i * d.dv)]);
    }
    const std::vector<double> row = naive_linear(m.out_proj, y.data(), d.H, V);
    std::copy(row.begin(), row.end(), out.begin() + static_cast<std::ptrdiff_t>(t * d.H));
  }
  return out;
}

double max_abs_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0.0;
  for (size_t e = 0; e < got.size(); ++e) worst = std::max(worst, std::abs(got[e] - want[e]));
  return worst;
}

// The 16-bit term of the row for `quantity`: its atol with 16-bit operands minus its atol with
// float32 ones (the float32 part covers the kernels' float32 sums, exact here).
double e16_of(Quantity quantity, DType operands, int64_t L, int64_t m) {
  ParityKey key;
  key.quantity = quantity;
  key.model_dtype = operands;
  key.candidate_dtype = quantity == Quantity::kSsmState ? DType::kFloat32 : operands;
  key.reduction_length = L;
  key.inner_length = m;
  key.history_length = L;
  key.ssm_mode = "gdn";
  key.ssm_operand_dtype = operands;
  const double with_16bit = parity_tolerance(key).atol;
  key.ssm_operand_dtype = DType::kFloat32;
  return with_16bit - parity_tolerance(key).atol;
}

struct RoundingCase {
  GdnDims dims;
  bool contribution_covered;  // the derivation covers the contribution at dk ≥ 16 (at dk = 6 it does not)
};

// {H, Hk, Hv, dk, dv, K}: Qwen3-Next's head dims with two value heads per key head, smaller square
// heads, and the odd sizes of the cuda tests (dk 6: the state's bound only).
const std::vector<RoundingCase> kCases = {
    {{256, 1, 2, 128, 128, 4}, true}, {{128, 2, 4, 32, 32, 4}, true}, {{64, 2, 4, 16, 16, 4}, true},
    {{32, 2, 4, 6, 10, 3}, false}};

TEST(GdnOperandRounding, ErrorsStayWithinTheSixteenBitRow) {
  uint64_t seed = 5000;
  for (const RoundingCase& rc : kCases) {
    const GdnDims& d = rc.dims;
    const int64_t L = 2 * kChunk + 9;  // two whole chunks and a partial one
    // m as compare.cpp takes it for a linear layer: the largest dimension of its weights and pools.
    const int64_t m = std::max({d.C() + d.Hv * d.dv, d.H, d.dk * d.dv});
    for (const DType operands : {DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(describe(d) + " operands " + std::string(to_string(operands)));
      const auto tensors = random_weights(d, seed++);
      const NaiveGdn model = naive_gdn_model(d, views(tensors));
      const NaiveGdnState initial = random_state(d, seed++);
      std::vector<double> conv = initial.conv;
      const GdnTokens tokens =
          naive_gdn_tokens(model, conv, normal_values(L * d.C(), seed), normal_values(L * d.Hv, seed + 1),
                           normal_values(L * d.Hv, seed + 2), L);
      const std::vector<double> z = normal_values(L * d.Hv * d.dv, seed + 3);
      seed += 4;

      std::vector<double> exact_S = initial.S, rounded_S = initial.S;
      const std::vector<double> exact_o = naive_delta_rule(d, tokens, exact_S);
      const std::vector<double> rounded_o = chunked_with_rounded_operands(d, tokens, rounded_S, operands);

      const double state_error = max_abs_error(rounded_S, exact_S);
      const double state_e16 = e16_of(Quantity::kSsmState, operands, L, m);
      EXPECT_LE(state_error, state_e16) << "exit state: the emulated roundings exceed the row's 16-bit term";
      EXPECT_GT(state_error, 0.0) << "the emulation rounds nothing: the check would be vacuous";
      RecordProperty(describe(d) + " " + std::string(to_string(operands)) + " state error / e16",
                     std::to_string(state_error / state_e16));

      if (rc.contribution_covered) {
        const double output_error =
            max_abs_error(contribution(model, rounded_o, z, L), contribution(model, exact_o, z, L));
        const double output_e16 = e16_of(Quantity::kSsmOutput, operands, L, m);
        EXPECT_LE(output_error, output_e16) << "contribution: the emulated roundings exceed the row's 16-bit term";
        EXPECT_GT(output_error, 0.0);
        RecordProperty(describe(d) + " " + std::string(to_string(operands)) + " output error / e16",
                       std::to_string(output_error / output_e16));
      }
    }
  }
}

}  // namespace
}  // namespace hybridtb::testing
