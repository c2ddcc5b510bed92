// Device conversions between the storage elements of hybridtb tensors and float32, with the same
// rounding points as harness/include/hybridtb/dtype.h (RNE; fp8 saturating to the largest finite
// value, NaN kept).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

__device__ __forceinline__ float fp8_e4m3_to_float(uint8_t bits) {
  __nv_fp8_e4m3 x;
  x.__x = bits;
  return static_cast<float>(x);
}
__device__ __forceinline__ float fp8_e5m2_to_float(uint8_t bits) {
  __nv_fp8_e5m2 x;
  x.__x = bits;
  return static_cast<float>(x);
}
__device__ __forceinline__ uint8_t float_to_fp8(float x, bool e5m2) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(x, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
}
// x rounded to e4m3 and back (exact in every model dtype).
__device__ __forceinline__ float round_to_e4m3(float x) { return fp8_e4m3_to_float(float_to_fp8(x, false)); }

// One 1-byte cache element (fp8 or int8) as float.
__device__ __forceinline__ float byte_to_float(uint8_t bits, ElementKind kind) {
  switch (kind) {
    case ElementKind::kFp8E4M3:
      return fp8_e4m3_to_float(bits);
    case ElementKind::kFp8E5M2:
      return fp8_e5m2_to_float(bits);
    default:
      return static_cast<float>(static_cast<int8_t>(bits));
  }
}

// Element `index` of a buffer of `kind`, as float (exact).
__device__ __forceinline__ float load_element(const void* base, int64_t index, ElementKind kind) {
  switch (kind) {
    case ElementKind::kFloat32:
      return static_cast<const float*>(base)[index];
    case ElementKind::kFloat16:
      return __half2float(static_cast<const __half*>(base)[index]);
    case ElementKind::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    default:
      return byte_to_float(static_cast<const uint8_t*>(base)[index], kind);
  }
}

// Stores `value` rounded to `kind` (model dtypes only: float32, float16, bfloat16).
__device__ __forceinline__ void store_element(void* base, int64_t index, ElementKind kind, float value) {
  switch (kind) {
    case ElementKind::kFloat32:
      static_cast<float*>(base)[index] = value;
      break;
    case ElementKind::kFloat16:
      static_cast<__half*>(base)[index] = __float2half_rn(value);
      break;
    default:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
      break;
  }
}

// Typed model-dtype elements (T = float, __half, __nv_bfloat16): the same rounding as
// store_element / load_element. ElementVec<T, N>: N consecutive elements moved with one access
// (the element index must be a multiple of N); pack_elements rounds a pair of 16-bit elements with
// one paired conversion.
template <typename T, int N>
struct alignas(sizeof(T) * N) ElementVec {
  T e[N];
};
__device__ __forceinline__ float element_to_float(float x) { return x; }
__device__ __forceinline__ float element_to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float element_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T float_to_element(float x);
template <>
__device__ __forceinline__ float float_to_element<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half float_to_element<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 float_to_element<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename T, int N>
__device__ __forceinline__ ElementVec<T, N> pack_elements(const float (&x)[N]) {
  ElementVec<T, N> v;
  if constexpr (N == 2 && std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(x[0], x[1]);
    memcpy(&v, &h, sizeof(v));
  } else if constexpr (N == 2 && std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x[0], x[1]);
    memcpy(&v, &h, sizeof(v));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v.e[i] = float_to_element<T>(x[i]);
  }
  return v;
}

__device__ __forceinline__ int element_bytes(ElementKind kind) {
  return kind == ElementKind::kFloat32 ? 4 : (kind == ElementKind::kFloat16 || kind == ElementKind::kBFloat16) ? 2 : 1;
}

}  // namespace hybridtb::cuda
