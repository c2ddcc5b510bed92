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
  // Two float64 evaluations of the mamba1 SSM mode (the reference's chunk scan or single-step
  // update against an independently written token-by-token loop, or split against one-shot
  // prefill): contribution rows and both states. Per token the mode is a fixed chain of about
  // eight stages (in_proj, conv, x_proj, dt_proj, softplus/exp/silu, the state update, h·C,
  // out_proj), each a sum of at most m = max(H, I, R + 2N) terms, so each stage is within
  // γ_m·Σ|terms|. The decay exp(Δ·A) is in (0, 1], so an error made in the state at one step is
  // never amplified later: over n steps they add, giving γ_{n+m} times the magnitude factor. With
  // the specs' initialisation (projections normal(0, 1/sqrt(fan_in)), |Δ| ≲ 1) every stage is
  // O(1) and Σ|terms|/|result| ≲ sqrt(m) per stage; 64 covers that ratio over the chain (the
  // tests see errors below 2·γ_{n+m} itself), and the two sides together contribute twice:
  // atol = rtol = 2·γ_{n+m}(float64)·64.
  kMamba1Float64,
  // Two float64 evaluations of one SSM mode's per-request recurrence, for ANY registered mode (the
  // generic suite, tests/ssm): chunked prefill + decode steps against one-shot prefill, prefix
  // states against the states of mamba_cache_mode all, or a simple mode against a naive loop.
  // n = tokens the recurrence ran; m = the longest sum inside one token's update (the generic
  // suite uses the largest dimension of H and of the mode's tensors). A mode's per-token update
  // is a short chain of sums of ≤ m terms, each within γ_m·Σ|terms|, and the suite requires the
  // state update to be non-expanding (decay ≤ 1: running sums, EMAs, Mamba's exp(Δ·A)), so errors
  // made at one step are passed on, never amplified: over n steps they add, giving γ_{n+m} times
  // a magnitude factor. 1024 covers Σ|terms|/|result| compounded over the chain (generous: the
  // mode is not known; mamba1's own row, with its specs' initialisation, needs 64);
  // a running sum additionally carries Σ|x_j| ≤ 8·n for n O(1) terms (|x| < 8); the two sides
  // contribute twice: atol = rtol = 2·γ_{n+m}(float64)·(1024 + 8·n).
  kSsmModeFloat64,
  // The CUDA backend's attention output (stored in the model dtype) against the float64 reference,
  // per output dtype. The kernels read the exact stored K/V (dequantised in float32), form logits
  // in float32 (a dot of length D, then scale, soft cap, ALiBi), run an online softmax with __expf
  // (ex2.approx: relative error ≲ 2^-22·(2 + |x|)) and accumulate P·V and Σp in float32 over the
  // n visible keys, then round once to the output dtype. P is NOT rounded to the model dtype before
  // P·V on any path of this increment (a tensor-core path that rounds P to bf16/fp16 must add
  // u(model)·max|v| to atol). Error budget of o = Σp·v / Σp: the positive-weight sums are within
  // γ_n relative, so o is within γ_n·(max|v| + |o|) ≤ 2γ_n·max|v|; a logit error δ changes each
  // weight by a factor e^δ, so o moves by ≤ 2δ·max|v|, with δ ≤ γ_D·max|logit| (the dot) + the exp
  // error 2^-22·(2 + max|logit|). With O(1) inputs (standard-normal data: |v| ≤ 6, |logit| ≤ 32 in
  // every test): e32 = (2γ_n(float32) + 2γ_D(float32)·32 + 2·2^-22·34)·6; the final store adds
  // u(out)·|o|: atol = e32 + u(out)·2^-6 (outputs near zero), rtol = u(out).
  kCudaAttentionFloat32,
  kCudaAttentionFloat16,
  kCudaAttentionBFloat16,
  // fp8 output (decoder with output_scale): the CUDA backend stores e4m3(clamp(o / output_scale))
  // (in the model dtype, which holds it exactly) against the reference's unrounded clamp: rtol =
  // u(e4m3) = 2^-4; atol = 2^-10 (half the e4m3 subnormal spacing) + e32 / 0.25, 0.25 being the
  // smallest output_scale the tests use.
  kCudaAttentionFp8Output,
};

// `reduction_length` is n (visible keys) and `inner_length` is the dot-product length (head size);
// for kMamba1Float64, n = tokens the recurrence ran and the inner length is max(H, I, R + 2N).
// For kSsmModeFloat64, n = tokens the recurrence ran and the inner length is m (above).
// For kCudaAttention*, n = the longest key range (max seq_len) + 1 (a sink) and the inner length
// is the head size.
Tolerance tolerance_for(ToleranceCase which, int64_t reduction_length, int64_t inner_length);

}  // namespace hybridtb
