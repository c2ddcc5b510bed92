// What mamba1's two kernel files share (mamba1_decode.cu: the single-step decode update;
// mamba1_kernels.cu: the chunked prefill scan and the launcher of both): the per-token·channel math
// in float32 on the special-function unit, so that a decode step and a one-token prefill agree to
// rounding, and the pool-access test of a channel's state quads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/elements.cuh"
#include "common/mma.cuh"
#include "ssm/ssm_kernels.h"
#include "ssm/weight_ref.cuh"

namespace hybridtb::cuda::ssm::mamba1 {

// --- the selective scan ---------------------------------------------------------------------------
// Both scan kernels give each lane 4 consecutive states n0 = 4g … 4g+3 of one channel (kLanes = the
// lanes per channel, a power of two ≥ ⌈N/4⌉; states ≥ N are inert: A = 0, B = C = 0, never stored),
// so a channel's [N] state row is read and written with 16-byte (float32) or 8-byte (16-bit)
// accesses where the pool allows, and y is the sum over the channel's lanes (xor shuffles).

constexpr float kLog2e = 1.4426950408889634f;

// exp(Δ·A) is computed as 2^(Δ·A·log2 e) on the special-function unit (mma::exp2_approx,
// ex2.approx.ftz: relative error ≤ 2^-22), the form vLLM's selective-scan kernels use.

// Whether states n0 … n0+3 of a channel can move as one 16-byte / 8-byte access.
__device__ __forceinline__ bool quad_vector_ok(const PoolRef& pool, int N) {
  return (N % 4) == 0 && (pool.slot_size % 4) == 0 && pool.kind != ElementKind::kFp8E4M3 &&
         pool.kind != ElementKind::kFp8E5M2 && pool.kind != ElementKind::kInt8;
}

// Per token and channel (the scans' Δ and gate), branch-free on the special-function unit and the
// FMA pipe: the prefill scan runs them once per token·channel, where log1pf's range reduction and
// __expf's subnormal guard cost more instructions than the 16 states' scan work.
// softplus(v) = max(v, 0) + log1p(y), y = e^−|v| ∈ (0, 1] (v itself above 20, as vLLM and torch:
// there log1p(y) < 2.1e-9 is below half an ulp of v ≥ 20, so the sum rounds to v and no branch is
// needed); log1p(y) = 2·atanh(s), s = y / (2 + y) ∈ (0, 1/3], by its odd series to s^15 (the next
// term is below 1e-9 of the sum), so the result keeps float32's relative precision for small Δ
// too (a few ulp from ex2.approx and the approximate division; far inside the float32 rows of
// the tolerance table). Branch-free, so the scan's compiler interleaves it with other work.
__device__ __forceinline__ float softplus_fast(float v) {
  const float y = mma::exp2_approx(-fabsf(v) * kLog2e);
  const float s = __fdividef(y, 2.0f + y);
  const float s2 = s * s;
  float series = 1.0f / 15.0f;
  series = fmaf(series, s2, 1.0f / 13.0f);
  series = fmaf(series, s2, 1.0f / 11.0f);
  series = fmaf(series, s2, 1.0f / 9.0f);
  series = fmaf(series, s2, 1.0f / 7.0f);
  series = fmaf(series, s2, 1.0f / 5.0f);
  series = fmaf(series, s2, 1.0f / 3.0f);
  series = fmaf(series, s2, 1.0f);
  return fmaxf(v, 0.0f) + 2.0f * s * series;
}
// silu(v) = v / (1 + e^−v); e^−v → ∞ for very negative v gives 0 (the approximate division's
// reciprocal of ∞ is 0).
__device__ __forceinline__ float silu_fast(float v) { return __fdividef(v, 1.0f + mma::exp2_approx(-v * kLog2e)); }

// The decode update of `count` decode requests (p.wave.requests[0, count)): mamba1_decode.cu.
void launch_decode(const Mamba1Params& p, int32_t count, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm::mamba1
