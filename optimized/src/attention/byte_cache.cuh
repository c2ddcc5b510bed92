// 1-byte KV caches on the tensor-core paths: a 16-byte chunk of stored fp8 (e4m3 / e5m2) or int8
// elements dequantised to the model dtype T for the MMAs, T(float(stored) · scale) with the scale
// per tensor (k_scale / v_scale) or per (token, kv head). One rounding to T of the dequantised value,
// as vLLM's Triton kernel rounds dequantised K/V (tolerance.h, e_KV). fp8 pairs convert with one
// cvt to f16x2 (exact for both encodings: they fit float16's range and precision), int8 through
// float. Used by the tensor-core prefill (prefill_mma_kernel.cuh) and decode (decode_mma_kernel.cuh)
// kernels, which stage the raw bytes and dequantise them in shared memory once per tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/mma.cuh"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

// 16 stored bytes (kind: p.kv_kind) → two 16-byte chunks of 8 elements of T (the low 8 bytes, then
// the high 8).
template <typename T>
__device__ __forceinline__ void dequantise_16(const uint4& raw, ElementKind kind, float scale, uint4 (&out)[2]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t packed[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<uint16_t>(words[w] >> (16 * h));
      float2 f;
      if (kind == ElementKind::kInt8) {
        f.x = static_cast<float>(static_cast<int8_t>(pair & 0xff));
        f.y = static_cast<float>(static_cast<int8_t>(pair >> 8));
      } else {
        const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair),
                                                          kind == ElementKind::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3);
        f = __half22float2(__half2(h2));
      }
      packed[2 * w + h] = mma::Mma<T>::pack(f.x * scale, f.y * scale);
    }
  }
  out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

}  // namespace hybridtb::cuda
