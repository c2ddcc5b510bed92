// The tolerance table (see tolerance.h for the derivation of each row).
#include "hybridtb/tolerance.h"

#include <cmath>

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
    case ToleranceCase::kCudaAttentionFloat32:
    case ToleranceCase::kCudaAttentionFloat16:
    case ToleranceCase::kCudaAttentionBFloat16:
    case ToleranceCase::kCudaAttentionFp8Output: {
      // float32 kernel arithmetic (dot of D, __expf, sums of n) on O(1) data (|v| ≤ 6, |logit| ≤ 32),
      // then one rounding to the stored dtype (tolerance.h).
      constexpr double kMaxAbsValue = 6.0;
      constexpr double kMaxAbsLogit = 32.0;
      const double exp_error = std::ldexp(1.0, -22) * (2.0 + kMaxAbsLogit);
      const double e32 = (2.0 * gamma_n(DType::kFloat32, reduction_length) +
                          2.0 * gamma_n(DType::kFloat32, inner_length) * kMaxAbsLogit + 2.0 * exp_error) *
                         kMaxAbsValue;
      if (which == ToleranceCase::kCudaAttentionFp8Output) {
        constexpr double kMinOutputScale = 0.25;
        return Tolerance{std::ldexp(1.0, -10) + e32 / kMinOutputScale, unit_roundoff(DType::kFloat8E4M3),
                         detail::concat("cuda fp8 output vs float64: atol 2^-10 + e32/0.25, rtol u(e4m3), ",
                                        "e32 = (2γ_n + 2γ_D·32 + 2^-21·34)(float32)·6 with n=", reduction_length,
                                        ", D=", inner_length)};
      }
      const DType out = which == ToleranceCase::kCudaAttentionFloat32   ? DType::kFloat32
                        : which == ToleranceCase::kCudaAttentionFloat16 ? DType::kFloat16
                                                                        : DType::kBFloat16;
      const double u = unit_roundoff(out);
      return Tolerance{e32 + u * std::ldexp(1.0, -6), u,
                       detail::concat("cuda ", to_string(out), " vs float64: atol e32 + u·2^-6, rtol u, ",
                                      "e32 = (2γ_n + 2γ_D·32 + 2^-21·34)(float32)·6 with n=", reduction_length,
                                      ", D=", inner_length)};
    }
  }
  throw Error("tolerance_for: unknown case");
}

}  // namespace hybridtb
