// The one tolerance table of hybridtb. Every comparison of floating-point results in the tests
// and the parity tools takes its tolerance from here; none is written inline.
//
// Each entry is derived from the unit roundoff u of the arithmetic involved (u = 2^-(p) for a
// p-bit significand incl. the hidden bit, i.e. half the spacing of numbers in [1, 2)) and the
// length n of the longest reduction, using the standard forward-error bound for a sum of n terms,
// γ_n = n·u / (1 − n·u) (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1), scaled by
// the magnitude of the terms. A comparison passes when |a − b| ≤ atol + rtol·|b| elementwise.
#pragma once

#include <cstdint>
#include <string>

#include "hybridtb/dtype.h"

namespace hybridtb {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
  std::string rationale;  // the derivation, printed with every parity report
  bool allows(double actual, double expected) const;
};

// Unit roundoff of a floating dtype: float64 2^-53, float32 2^-24, float16 2^-11, bfloat16 2^-8,
// fp8 e4m3 2^-4, fp8 e5m2 2^-3.
double unit_roundoff(DType dtype);

// γ_n for `dtype` (throws Error if n·u ≥ 1, where the bound is meaningless).
double gamma_n(DType dtype, int64_t n);

// Which computation is being compared — the rows of the table.
enum class ToleranceCase {
  // Two float64 evaluations of the same attention output (e.g. the reference against an
  // independently written naive formula, or paged against contiguous order). Each output element
  // is a softmax-weighted average: a dot product of length head_size feeds each logit and a sum of
  // `n` = number of visible keys feeds numerator and denominator. Both sides round differently, so
  // the difference is bounded by 2·(γ_D·|s|·… ) ≲ 2·γ_{n + D}·(1 + max|logit|)·max|v|; inputs are
  // O(1) and logits O(10), so we use atol = rtol = 2·γ_{n+D}(float64)·32.
  kAttentionFloat64,
};

// `reduction_length` is n (visible keys) and `inner_length` is the dot-product length (head size).
Tolerance tolerance_for(ToleranceCase which, int64_t reduction_length, int64_t inner_length);

}  // namespace hybridtb
