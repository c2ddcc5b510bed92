// reshape_and_cache_flash on the GPU: one warp per (token, kv head, key|value). Bit-exact with
// reference/src/kv_cache_write.cpp (tests/cuda checks the cache bytes after the write):
//   copy          the source bits;
//   fp8 per-tensor fp8(x / scale): IEEE float32 division, saturating RNE cast;
//   per-token-head scale = max(absmax / QMAX, 1e-6), y = clamp(x · (1/scale), QMIN, QMAX),
//                  int8 by truncation toward zero (cvt.rzi: NaN → 0), fp8 e4m3 by the saturating cast.
#pragma once

#include "common/elements.cuh"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

namespace kv_write_detail {
constexpr int kWarpsPerBlock = 4;
}  // namespace kv_write_detail

__global__ void __launch_bounds__(kv_write_detail::kWarpsPerBlock * 32)
    kv_cache_write_kernel(const __grid_constant__ KvWriteParams p) {
  const int64_t token = blockIdx.x;
  const int row = static_cast<int>(blockIdx.y) * kv_write_detail::kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (token >= p.num_tokens || row >= 2 * p.num_kv_heads) return;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;  // PAD_SLOT_ID
  const int half = row / p.num_kv_heads;
  const int head = row % p.num_kv_heads;
  const int64_t block = slot / p.block_size;
  const int64_t offset = slot % p.block_size;
  const void* source = half == 0 ? p.key : p.value;
  const int64_t src = token * (half == 0 ? p.key_stride_token : p.value_stride_token) +
                      head * (half == 0 ? p.key_stride_head : p.value_stride_head);
  const int64_t dst =
      block * p.cache_stride_block + half * p.cache_stride_half + offset * p.cache_stride_slot + head * p.cache_stride_head;
  const int d = p.head_size;

  if (p.mode == KvWriteMode::kCopy) {
    const int bytes = element_bytes(p.source);
    const auto* in = static_cast<const uint8_t*>(source) + src * bytes;
    auto* out = static_cast<uint8_t*>(p.kv_cache) + dst * bytes;
    if (bytes == 4) {
      for (int i = lane; i < d; i += 32) reinterpret_cast<uint32_t*>(out)[i] = reinterpret_cast<const uint32_t*>(in)[i];
    } else {
      for (int i = lane; i < d; i += 32) reinterpret_cast<uint16_t*>(out)[i] = reinterpret_cast<const uint16_t*>(in)[i];
    }
    return;
  }
  auto* out = static_cast<uint8_t*>(p.kv_cache) + dst;  // 1-byte storage from here on
  if (p.mode == KvWriteMode::kFp8PerTensor) {
    const float scale = half == 0 ? p.k_scale : p.v_scale;
    const bool e5m2 = p.storage == ElementKind::kFp8E5M2;
    for (int i = lane; i < d; i += 32) out[i] = float_to_fp8(__fdiv_rn(load_element(source, src + i, p.source), scale), e5m2);
    return;
  }
  // Per-token-head.
  const bool is_int8 = p.storage == ElementKind::kInt8;
  const float qmax = is_int8 ? 127.0f : 448.0f;
  const float qmin = is_int8 ? -128.0f : -448.0f;
  float absmax = 0.0f;
  for (int i = lane; i < d; i += 32) absmax = fmaxf(absmax, fabsf(load_element(source, src + i, p.source)));
  for (int offset_lane = 16; offset_lane > 0; offset_lane /= 2) {
    absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset_lane));
  }
  const float scale = fmaxf(__fdiv_rn(absmax, qmax), 1e-6f);
  const float inverse = __fdiv_rn(1.0f, scale);
  for (int i = lane; i < d; i += 32) {
    // std::clamp's order: NaN passes through (int8: cvt.rzi gives 0; fp8: NaN), as in the reference.
    float y = __fmul_rn(load_element(source, src + i, p.source), inverse);
    y = y < qmin ? qmin : (qmax < y ? qmax : y);
    out[i] = is_int8 ? static_cast<uint8_t>(static_cast<int8_t>(__float2int_rz(y))) : float_to_fp8(y, false);
  }
  if (lane == 0) {
    float* scales = half == 0 ? p.k_scale_cache : p.v_scale_cache;
    scales[(block * p.block_size + offset) * p.num_kv_heads + head] = scale;
  }
}

}  // namespace hybridtb::cuda
