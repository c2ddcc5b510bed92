// Four consecutive elements of an SSM state pool as float32, moved as one access where the caller
// has checked it can be (`vec`: a 16-byte float32 or 8-byte float16/bfloat16 access, 4-element
// aligned); otherwise element by element, with the elements past `valid` read as 0 and never
// written. The state-update kernels of mamba1 and gdn keep a lane's state rows in such quads. Also
// 16-byte runs of a pool's own element held as raw bits (the GDN and Mamba-2 decode updates), and a
// lane's run of a float32 activation row (the decode updates' q̂, k̂, B, C), in 16-byte loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "common/elements.cuh"
#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

__host__ __device__ __forceinline__ bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// Elements of a pool of element T (float, __half, __nv_bfloat16) in one 16-byte run.
template <typename T>
inline constexpr int kPoolRun = 16 / static_cast<int>(sizeof(T));

// Pool elements [e, e + kPoolRun<T>) as their raw bits: one streaming 16-byte load (evict-first: each
// state is read once) where `vec` (the caller checked that the run is whole and aligned), else
// element by element with those past `valid` read as 0 (exact: T is the pool's element).
template <typename T>
__device__ __forceinline__ uint4 load_pool_run(const PoolRef& pool, int64_t e, int valid, bool vec) {
  if (vec) return __ldcs(reinterpret_cast<const uint4*>(static_cast<const T*>(pool.data) + e));
  T x[kPoolRun<T>];
#pragma unroll
  for (int i = 0; i < kPoolRun<T>; ++i) {
    x[i] = float_to_element<T>(i < valid ? load_element(pool.data, e + i, pool.kind) : 0.0f);
  }
  uint4 raw;
  memcpy(&raw, x, sizeof(raw));
  return raw;
}

// The run's elements as float32.
template <typename T>
__device__ __forceinline__ void widen_pool_run(const uint4& raw, float (&v)[kPoolRun<T>]) {
  T x[kPoolRun<T>];
  memcpy(x, &raw, sizeof(raw));
#pragma unroll
  for (int i = 0; i < kPoolRun<T>; ++i) v[i] = element_to_float(x[i]);
}

// Pool elements [e, e + valid) ← v rounded to T (RNE, as store_element): one streaming 16-byte store
// where `vec`, else element by element.
template <typename T>
__device__ __forceinline__ void store_pool_run(const PoolRef& pool, int64_t e, int valid, bool vec,
                                               const float (&v)[kPoolRun<T>]) {
  if (vec) {
    const ElementVec<T, kPoolRun<T>> x = pack_elements<T, kPoolRun<T>>(v);
    uint4 raw;
    memcpy(&raw, &x, sizeof(raw));
    __stcs(reinterpret_cast<uint4*>(static_cast<T*>(pool.data) + e), raw);
    return;
  }
#pragma unroll
  for (int i = 0; i < kPoolRun<T>; ++i) {
    if (i < valid) store_element(pool.data, e + i, pool.kind, v[i]);
  }
}

// Elements [k0, k0 + kRun) of a float32 activation row (past `valid`: 0), 16-byte loads where
// `vec` (k0 4-aligned) and the quad is whole.
template <int kRun>
__device__ __forceinline__ void load_float_run(const float* row, int k0, int valid, bool vec, float (&x)[kRun]) {
#pragma unroll
  for (int j = 0; j < kRun; j += 4) {
    if (vec && valid - j >= 4) {
      const float4 v = *reinterpret_cast<const float4*>(row + k0 + j);
      x[j] = v.x, x[j + 1] = v.y, x[j + 2] = v.z, x[j + 3] = v.w;
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) x[j + s] = j + s < valid ? row[k0 + j + s] : 0.0f;
    }
  }
}

// Elements [e, e + 4) of the pool (past `valid`: 0).
__device__ __forceinline__ void load_quad(const PoolRef& pool, int64_t e, int valid, bool vec, float (&x)[4]) {
  if (vec) {
    if (pool.kind == ElementKind::kFloat32) {
      const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(pool.data) + e);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(pool.data) + e);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const auto bits = static_cast<unsigned short>((s < 2 ? v.x : v.y) >> (16 * (s % 2)));
        x[s] = pool.kind == ElementKind::kFloat16 ? __half2float(__ushort_as_half(bits))
                                                  : __bfloat162float(__ushort_as_bfloat16(bits));
      }
    }
    return;
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) x[s] = s < valid ? load_element(pool.data, e + s, pool.kind) : 0.0f;
}

// Elements [e, e + valid) of the pool ← x (rounded to the pool's kind).
__device__ __forceinline__ void store_quad(const PoolRef& pool, int64_t e, int valid, bool vec, const float (&x)[4]) {
  if (vec) {
    if (pool.kind == ElementKind::kFloat32) {
      *reinterpret_cast<float4*>(static_cast<float*>(pool.data) + e) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      uint16_t bits[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) store_element(bits, s, pool.kind, x[s]);
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(pool.data) + e) =
          make_uint2(bits[0] | (uint32_t{bits[1]} << 16), bits[2] | (uint32_t{bits[3]} << 16));
    }
    return;
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if (s < valid) store_element(pool.data, e + s, pool.kind, x[s]);
  }
}

}  // namespace hybridtb::cuda::ssm
