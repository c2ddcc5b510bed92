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
  }
  throw Error("tolerance_for: unknown case");
}

}  // namespace hybridtb
