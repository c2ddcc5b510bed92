// 1-byte KV caches on the tensor-core paths. The kernels stage the stored fp8 (e4m3 / e5m2) or int8
// bytes of a tile and cast them once per tile, exactly, to the model dtype T (cast_16: fp8 pairs with
// one cvt to f16x2 — exact for both encodings, which fit float16's range and precision — and on to
// bfloat16 through float; int8 through float; every value fits T exactly). The scales never round
// a K or V element; they are applied in float32 as vLLM 0.33's Triton kernel applies them (ByteScales):
//   per tensor     the logit's dot product × k_scale, the output × v_scale;
//   per token-head each key's dot products × its k scale, and its probability × its v scale before
//                  P is rounded to T for P·V (tolerance.h, e_P), while Σp takes the unscaled p.
// P is kept scaled by 2^shift (exact, it cancels in Σp·v / Σp): 15 keeps float16's small weights
// normal; with the per-token-head v scales inside P, float16 takes 6, so that P·v_scale stays finite
// (a v scale is absmax / 127 or absmax / 448 of float16 values: at most 65504 / 127 < 2^9).
// Used by the tensor-core prefill (prefill_mma_kernel.cuh) and decode (decode_mma_kernel.cuh) kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_params.h"
#include "common/mma.cuh"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

// 16 stored bytes (kind: p.kv_kind) → two 16-byte chunks of 8 elements of T (the low 8 bytes, then
// the high 8), each the stored value exactly.
template <typename T>
__device__ __forceinline__ void cast_16(const uint4& raw, ElementKind kind, uint4 (&out)[2]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t packed[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<uint16_t>(words[w] >> (16 * h));
      if (kind == ElementKind::kInt8) {
        packed[2 * w + h] = mma::Mma<T>::pack(static_cast<float>(static_cast<int8_t>(pair & 0xff)),
                                              static_cast<float>(static_cast<int8_t>(pair >> 8)));
      } else {
        const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair),
                                                          kind == ElementKind::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3);
        if constexpr (std::is_same_v<T, __half>) {
          packed[2 * w + h] = static_cast<uint32_t>(h2.x) | (static_cast<uint32_t>(h2.y) << 16);
        } else {
          const float2 f = __half22float2(__half2(h2));
          packed[2 * w + h] = mma::Mma<T>::pack(f.x, f.y);
        }
      }
    }
  }
  out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// The scales of the cache a kernel reads (ones for a 16-bit cache): per-tensor factors for the dot
// products and the output, or per_token (each key's scales staged beside its bytes).
struct ByteScales {
  float k = 1.0f;          // per tensor: × every dot product
  float v = 1.0f;          // per tensor: × the output
  bool per_token = false;  // per token-head: the key's k scale × its dot products, its v scale × its p
  float p_shift = 15.0f;   // P ∈ [0, 2^p_shift]
};
template <typename T>
__device__ __forceinline__ ByteScales byte_scales(const AttentionParams& p, bool byte_cache) {
  ByteScales s;
  if (!byte_cache) return s;
  if (p.kv_scale_mode == KvScaleMode::kPerTokenHead) {
    s.per_token = true;
    if constexpr (std::is_same_v<T, __half>) s.p_shift = 6.0f;
  } else {
    s.k = p.k_scale;
    s.v = p.v_scale;
  }
  return s;
}

}  // namespace hybridtb::cuda
