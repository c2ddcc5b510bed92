// 1-byte KV caches on the tensor-core paths. The kernels stage the stored fp8 (e4m3 / e5m2) or int8
// bytes of a tile and cast them once per tile, exactly, to the model dtype T (cast_16; every value
// fits T exactly: fp8 → float16 by one cvt, fp8 → bfloat16 by moving bit fields, int8 through
// float). The scales never round a K or V element; they act in float32 as vLLM 0.33's Triton kernel
// applies them (CacheScales):
//   per tensor     the logit's dot product × k_scale, the output × v_scale;
//   per token-head each key's dot products × its k scale, and its probability × its v scale before
//                  P is rounded to T for P·V (tolerance.h, e_P), while Σp takes the unscaled p.
// P is kept scaled by 2^shift (exact, it cancels in Σp·v / Σp): 15 keeps float16's small weights
// normal; with the per-token-head v scales inside P, float16 takes 6, so that P·v_scale stays finite
// (a v scale is absmax / 127 or absmax / 448 of float16 values: at most 65504 / 127 ≈ 516, and
// 2^6 · 516 < 65504).
// Used by the tensor-core prefill (prefill_mma_kernel.cuh) and decode (decode_mma_kernel.cuh) kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/attention_params.h"
#include "common/mma.cuh"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

// The Cache parameter of the tensor-core kernels for a 1-byte cache: the scale mode is a compile-time
// property (a 16-bit cache is T itself).
template <bool PerTokenHead>
struct ByteCache {};
using PerTensorBytes = ByteCache<false>;    // fp8 e4m3 / e5m2 with k_scale / v_scale
using PerTokenHeadBytes = ByteCache<true>;  // int8 / fp8 e4m3 with a scale per (token, kv head)
template <typename Cache>
inline constexpr bool kIsByteCache = false;
template <bool PerTokenHead>
inline constexpr bool kIsByteCache<ByteCache<PerTokenHead>> = true;
template <typename Cache>
inline constexpr bool kIsPerTokenHeadCache = false;
template <bool PerTokenHead>
inline constexpr bool kIsPerTokenHeadCache<ByteCache<PerTokenHead>> = PerTokenHead;

// Two fp8 values (the low 16 bits of `pair`, e4m3 or e5m2) as a pair of T, exactly. float16: the
// hardware cvt (e5m2 is float16's top byte). bfloat16: the sign, exponent and mantissa bits move
// into bfloat16's fields with integer operations, then one multiply by 2^(127 − bias) rebiases the
// exponent (exact; an fp8 subnormal becomes a bfloat16 subnormal times a power of two, which the
// multiply normalises: bfloat16 arithmetic keeps subnormals) — no conversion-pipe instruction.
template <typename T>
__device__ __forceinline__ uint32_t fp8_pair_to(uint32_t pair, bool e5m2) {
  const uint32_t high = __byte_perm(pair, 0, 0x1404);  // byte b of each half at bits 8..15 of it
  if constexpr (std::is_same_v<T, __half>) {
    if (e5m2) return high;
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return static_cast<uint32_t>(h2.x) | (static_cast<uint32_t>(h2.y) << 16);
  } else {
    // e4m3 s.eeee.mmm → bfloat16 s.0000eeee.mmm0000 (× 2^120); e5m2 s.eeeee.mm → s.000eeeee.mm00000 (× 2^112).
    const uint32_t bits = e5m2 ? ((high >> 3) & 0x0FE00FE0u) | (high & 0x80008000u)
                               : ((high >> 4) & 0x07F007F0u) | (high & 0x80008000u);
    const uint32_t rebias = e5m2 ? 0x77807780u : 0x7B807B80u;  // 2^112, 2^120 as bfloat16 pairs
    __nv_bfloat162 x;
    __nv_bfloat162 f;
    memcpy(&x, &bits, 4);
    memcpy(&f, &rebias, 4);
    const __nv_bfloat162 y = __hmul2(x, f);
    uint32_t out;
    memcpy(&out, &y, 4);
    return out;
  }
}

// 16 stored bytes (kind: p.kv_kind) → two 16-byte chunks of 8 elements of T (the low 8 bytes, then
// the high 8), each the stored value exactly.
template <typename T>
__device__ __forceinline__ void cast_16(const uint4& raw, ElementKind kind, uint4 (&out)[2]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t packed[8];
  const bool e5m2 = kind == ElementKind::kFp8E5M2;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pair = (words[w] >> (16 * h)) & 0xffffu;
      if (kind == ElementKind::kInt8) {
        packed[2 * w + h] = mma::Mma<T>::pack(static_cast<float>(static_cast<int8_t>(pair & 0xff)),
                                              static_cast<float>(static_cast<int8_t>(pair >> 8)));
      } else {
        packed[2 * w + h] = fp8_pair_to<T>(pair, e5m2);
      }
    }
  }
  out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// How a kernel applies the scales of the cache it reads (Cache: T, PerTensorBytes or
// PerTokenHeadBytes): per tensor, k × every dot product and v × the output; per token-head
// (kPerToken), each key's staged scales; kPShift: P ∈ [0, 2^kPShift].
template <typename T, typename Cache>
struct CacheScales {
  static constexpr bool kPerToken = kIsPerTokenHeadCache<Cache>;
  static constexpr float kPShift = std::is_same_v<T, __half> && kPerToken ? 6.0f : 15.0f;
  float k = 1.0f;
  float v = 1.0f;
  __device__ __forceinline__ explicit CacheScales(const AttentionParams& p) {
    if constexpr (kIsByteCache<Cache> && !kPerToken) {
      k = p.k_scale;
      v = p.v_scale;
    }
  }
};

}  // namespace hybridtb::cuda
