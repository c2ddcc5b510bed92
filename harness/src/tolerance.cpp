// The tolerance table (see tolerance.h for the derivation of each row).
#include "hybridtb/tolerance.h"

#include <cmath>
#include <string_view>
#include <utility>

#include "hybridtb/error.h"

namespace hybridtb {

bool Tolerance::allows(double actual, double expected) const {
  if (std::isnan(actual) || std::isnan(expected)) return std::isnan(actual) && std::isnan(expected);
  if (std::isinf(actual) || std::isinf(expected)) return actual == expected;
  return std::fabs(actual - expected) <= atol + rtol * std::fabs(expected);
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return std::ldexp(1.0, -53);
    case DType::kFloat32:
      return std::ldexp(1.0, -24);
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    case DType::kFloat8E4M3:
      return std::ldexp(1.0, -4);
    case DType::kFloat8E5M2:
      return std::ldexp(1.0, -3);
    default:
      throw Error(detail::concat("unit_roundoff: ", to_string(dtype), " is not a floating type"));
  }
}

double gamma_n(DType dtype, int64_t n) {
  const double nu = static_cast<double>(n) * unit_roundoff(dtype);
  HYBRIDTB_CHECK(nu < 1.0, "gamma_n: n·u = ", nu, " >= 1 for n = ", n, " in ", to_string(dtype));
  return nu / (1.0 - nu);
}

Tolerance tolerance_for(ToleranceCase which, int64_t reduction_length, int64_t inner_length) {
  switch (which) {
    case ToleranceCase::kAttentionFloat64: {
      // Both sides evaluate q·k (length D), exp, and two sums of n terms in float64 in different
      // orders. Each side is within γ_{n+D}·(1 + |logit|)·max|v| of the exact value; logits of O(1)
      // normal inputs times sqrt(D) scale stay below ~30, so the factor 32 covers (1 + |logit|),
      // and the two sides together contribute twice that.
      const double bound = 2.0 * gamma_n(DType::kFloat64, reduction_length + inner_length) * 32.0;
      return Tolerance{bound, bound,
                       detail::concat("float64 vs float64: 2·γ_{n+D}(float64)·32 with n=", reduction_length,
                                      ", D=", inner_length)};
    }
    case ToleranceCase::kMamba1Float64: {
      // ~8 chained stages of ≤ m-term sums per token; errors in the state add over n steps (the
      // decay is ≤ 1); 64 covers Σ|terms|/|result| over the chain; two sides.
      const double bound = 2.0 * gamma_n(DType::kFloat64, reduction_length + inner_length) * 64.0;
      return Tolerance{bound, bound,
                       detail::concat("float64 vs float64 (mamba1): 2·γ_{n+m}(float64)·64 with n=",
                                      reduction_length, " tokens, m=", inner_length)};
    }
    case ToleranceCase::kSsmModeFloat64: {
      // A short chain of ≤ m-term sums per token, errors adding (not growing) over n steps of a
      // non-expanding recurrence; 1024 for the chain's magnitude ratio, 8·n for a running sum's
      // Σ|x_j|; two sides.
      const double factor = 1024.0 + 8.0 * static_cast<double>(reduction_length);
      const double bound = 2.0 * gamma_n(DType::kFloat64, reduction_length + inner_length) * factor;
      return Tolerance{bound, bound,
                       detail::concat("float64 vs float64 (SSM mode recurrence): 2·γ_{n+m}(float64)·(1024 + 8n) with n=",
                                      reduction_length, " tokens, m=", inner_length)};
    }
  }
  throw Error("tolerance_for: unknown case");
}

std::string_view to_string(Quantity quantity) {
  switch (quantity) {
    case Quantity::kOutput:
      return "output";
    case Quantity::kAttnOutput:
      return "attn_output";
    case Quantity::kSsmOutput:
      return "ssm_output";
    case Quantity::kKvCache:
      return "kv_cache";
    case Quantity::kScaleCache:
      return "scale_cache";
    case Quantity::kSsmState:
      return "ssm_state";
  }
  return "?";
}

namespace {

// Magnitudes of O(1) data (tolerance.h, "parity").
constexpr double kParityMaxAbsValue = 6.0;   // V
constexpr double kParityMaxAbsLogit = 32.0;  // Λ
constexpr double kParityLogitNorm2 = 1.0;    // Λ₂ = scale·‖q∘k‖₂
constexpr double kParityLambda = 6.0;        // probabilistic-bound confidence (Higham & Mary 2019)
constexpr double kParityMinOutputScale = 0.25;
constexpr double kSsmChainRatio = 64.0;
constexpr double kSsmMaxAbsInput = 8.0;

bool is_16bit_float(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// Smallest positive subnormal of a 16-bit model dtype (η_m): float16 2^-24, bfloat16 2^-133.
double smallest_subnormal(DType dtype) {
  return dtype == DType::kFloat16 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -133);
}

// Attention in a float32 kernel against float64: the atol before the final store, and its formula.
std::pair<double, std::string> attention_error_fp32(const ParityKey& key) {
  const double V = kParityMaxAbsValue;
  const bool model16 = is_16bit_float(key.model_dtype);
  // 16-bit models may run on the tensor-core (mma) prefill path, whose dot products truncate
  // (tolerance.h, e32): the dot-product length counts 3·D there.
  const int64_t dot_length = model16 ? 3 * key.inner_length : key.inner_length;
  const double e32 = (2.0 * gamma_n(DType::kFloat32, key.reduction_length) +
                      2.0 * gamma_n(DType::kFloat32, dot_length) * kParityMaxAbsLogit +
                      2.0 * std::ldexp(1.0, -22) * (2.0 + kParityMaxAbsLogit)) *
                     V;
  const double u_m = unit_roundoff(key.model_dtype);
  const double e_p =
      model16 ? (u_m + static_cast<double>(key.reduction_length) * smallest_subnormal(key.model_dtype) *
                           std::ldexp(1.0, -16)) *
                    V
              : 0.0;
  // float16 with per-token-head v scales inside P: P ∈ [0, 2^6] (tolerance.h, e_P; a bfloat16
  // model's P stays bfloat16 in [0, 2^15]).
  const double e_p_scaled =
      key.model_dtype == DType::kFloat16 && is_per_token_head(key.kv_cache_dtype)
          ? static_cast<double>(key.reduction_length) * smallest_subnormal(DType::kFloat16) * 448.0 * std::ldexp(1.0, -7)
          : 0.0;
  const bool per_tensor_fp8 = is_quantized(key.kv_cache_dtype) && !is_per_token_head(key.kv_cache_dtype);
  const double e_kv = per_tensor_fp8 ? u_m * V + 2.0 * kParityLambda * u_m * kParityLogitNorm2 * V : 0.0;
  std::string formula =
      model16 ? detail::concat("e32 = (2γ_n + 2γ_{3D}·32 + 2^-21·34)(float32)·6 = ", e32, " [n=", key.reduction_length,
                               " keys, D=", key.inner_length, "; 3D: truncating tensor-core dot products]")
              : detail::concat("e32 = (2γ_n + 2γ_D·32 + 2^-21·34)(float32)·6 = ", e32, " [n=", key.reduction_length,
                               " keys, D=", key.inner_length, "]");
  if (e_p > 0) {
    formula += detail::concat(" + e_P = (u_m + n·η_m·2^-16)·6 = ", e_p, " [P rounded to ", to_string(key.model_dtype),
                              " in [0, 2^15] before P·V]");
  }
  if (e_p_scaled > 0) {
    formula += detail::concat(" + n·(η_m/2)·448·2^-6 = ", e_p_scaled,
                              " [per-token-head v scales inside P ∈ [0, 2^6], float16 subnormals]");
  }
  if (e_kv > 0) {
    formula += detail::concat(" + e_KV = u_m·6 + 2·6·u_m·1·6 = ", e_kv, " [fp8 K/V dequantised to ",
                              to_string(key.model_dtype), "]");
  }
  return {e32 + e_p + e_p_scaled + e_kv, formula};
}

Tolerance ssm_tolerance(const ParityKey& key, DType stored) {
  if (key.compute_dtype == DType::kFloat64) {
    Tolerance t = tolerance_for(ToleranceCase::kSsmModeFloat64, key.reduction_length, key.inner_length);
    if (stored != DType::kFloat64) {
      // Both sides round their float64 result to the stored dtype once: at most one ulp apart.
      t.rtol += 2.0 * unit_roundoff(stored);
      t.rationale += detail::concat(", rtol += 2u(", to_string(stored), ") for the store");
    }
    return t;
  }
  const double factor = kSsmChainRatio + kSsmMaxAbsInput * static_cast<double>(key.history_length);
  const double bound = gamma_n(DType::kFloat32, key.reduction_length + key.inner_length) * factor;
  const double u_store = unit_roundoff(stored);
  Tolerance t{bound, bound + u_store,
              detail::concat("float32 SSM kernel vs float64: atol γ_{n+m}(float32)·(64 + 8N) = ", bound, " [n=",
                             key.reduction_length, " tokens, m=", key.inner_length, ", N=", key.history_length,
                             "], rtol += u(", to_string(stored), ") for the store")};
  if (is_16bit_float(key.ssm_operand_dtype)) {
    // 16-bit product operands (tolerance.h): Mamba-2 ≤ 4 (states: 2) independent relative roundings
    // of u_m per term, λ·u_m·2·‖terms‖₂ with ‖terms‖₂ ≤ √m (states: 2); Gated DeltaNet ≤ 8 (states:
    // 6), λ·u_m·√8·‖terms‖₂ with ‖terms‖₂ ≤ √m (states: λ·u_m·√6·‖terms‖₂ with ‖terms‖₂ ≤ 12).
    const double u_m = unit_roundoff(key.ssm_operand_dtype);
    const bool state = key.quantity == Quantity::kSsmState;
    const double sqrt_m = std::sqrt(static_cast<double>(key.inner_length));
    const std::string_view operands = to_string(key.ssm_operand_dtype);
    if (key.ssm_mode == "gdn") {
      const double e16 =
          state ? std::sqrt(6.0) * 12.0 * kParityLambda * u_m : std::sqrt(8.0) * kParityLambda * u_m * sqrt_m;
      t.atol += e16;
      t.rationale += state ? detail::concat(" + e16 = √6·6·12·u_m = ", e16, " [gdn state; product operands rounded to ",
                                            operands, "]")
                           : detail::concat(" + e16 = √8·6·u_m·√m = ", e16, " [gdn; product operands rounded to ",
                                            operands, ", m=", key.inner_length, "]");
    } else {
      const double e16 =
          state ? 2.0 * std::sqrt(2.0) * kParityLambda * u_m : 2.0 * kParityLambda * u_m * sqrt_m;
      t.atol += e16;
      t.rationale += state ? detail::concat(" + e16 = 2√2·6·u_m = ", e16, " [state; product operands rounded to ",
                                            operands, "]")
                           : detail::concat(" + e16 = 2·6·u_m·√m = ", e16, " [product operands rounded to ",
                                            operands, ", m=", key.inner_length, "]");
    }
  }
  return t;
}

}  // namespace

Tolerance parity_tolerance(const ParityKey& key) {
  const bool float64 = key.compute_dtype == DType::kFloat64 && key.candidate_dtype == DType::kFloat64;
  switch (key.quantity) {
    case Quantity::kKvCache:
    case Quantity::kScaleCache:
      return Tolerance{0.0, 0.0,
                       "bit-exact: the KV write is a deterministic quantisation (reshape_and_cache_flash) that "
                       "every correct backend reproduces exactly"};
    case Quantity::kSsmOutput:
      return ssm_tolerance(key, key.candidate_dtype);
    case Quantity::kSsmState:
      return ssm_tolerance(key, key.candidate_dtype);
    case Quantity::kAttnOutput:
    case Quantity::kOutput: {
      Tolerance attention;
      if (float64) {
        attention = tolerance_for(ToleranceCase::kAttentionFloat64, key.reduction_length, key.inner_length);
      } else if (key.fp8_output) {
        const auto [e, formula] = attention_error_fp32(key);
        attention = Tolerance{std::ldexp(1.0, -10) + e / kParityMinOutputScale, unit_roundoff(DType::kFloat8E4M3),
                              detail::concat("fp8 output vs float64: atol 2^-10 + (", formula, ")/0.25, rtol u(e4m3)")};
      } else {
        const double u_out = unit_roundoff(key.candidate_dtype);
        const auto [e, formula] = attention_error_fp32(key);
        attention = Tolerance{e + u_out * std::ldexp(1.0, -6), u_out,
                              detail::concat(to_string(key.candidate_dtype), " kernel vs float64: atol ", formula,
                                             " + u_out·2^-6, rtol u_out = u(", to_string(key.candidate_dtype), ")")};
      }
      return attention;  // the fused output of a layer with an SSM branch: fused_parity_tolerance
    }
  }
  throw Error("parity_tolerance: unknown quantity");
}

Tolerance fused_parity_tolerance(const ParityKey& attention_key, const ParityKey& ssm_key) {
  const Tolerance a = parity_tolerance(attention_key);
  const Tolerance s = parity_tolerance(ssm_key);
  return Tolerance{a.atol + s.atol, a.rtol + s.rtol,
                   detail::concat("fused = attention + SSM: (", a.rationale, ") + (", s.rationale, ")")};
}

}  // namespace hybridtb
