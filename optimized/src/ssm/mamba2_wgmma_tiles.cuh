// The operand staging of the mamba2 prefill's warpgroup-MMA kernels (mamba2_scan_wgmma.cu,
// mamba2_state_wgmma.cu; sm_90a only, as wgmma.cuh): a global tile of float32 values, or of 16-bit
// values rounded already, becomes a tile of 16-bit product operands in the 128-byte swizzle layout
// that wgmma's shared-memory descriptors read, through registers, so that the next tile's global
// loads are in flight over the current tile's MMAs. One template serves both kernels and both
// source element types: what differs between them (the source's element type, a per-row scale,
// the loads' cache hint) is a compile-time parameter, so that an instantiation carries no work its
// kernel does not use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/mma.cuh"
#include "common/wgmma.cuh"

namespace hybridtb::cuda::ssm {

// A global tile of elements E (float: float32 values; uint16_t: the bits of values of the product
// dtype, rounded already): rows [0, rows) × columns [0, cols), rows `stride` elements apart; zeros
// elsewhere. Whole vectors (16 bytes: 4 float32 values or 8 16-bit elements) aligned to their size
// take one load each.
template <typename E>
struct SrcTile {
  static_assert(std::is_same_v<E, float> || std::is_same_v<E, uint16_t>, "float32 values or 16-bit bits");
  static constexpr int kVec = 16 / static_cast<int>(sizeof(E));  // elements per 16-byte load
  // A vector in registers: 4 floats, or the 8 16-bit elements as four packed pairs (low half first).
  using Vec = std::conditional_t<std::is_same_v<E, float>, float4, uint4>;
  const E* from;
  int64_t stride;
  int rows, cols;

  __device__ __forceinline__ bool whole_vectors() const {
    return stride % kVec == 0 && cols % kVec == 0 && (reinterpret_cast<uintptr_t>(from) & 15) == 0;
  }
};

// How SwizzleRegs' quad loads are cached: kStreaming evict-first (__ldcs), for data read once.
enum class LoadCache { kDefault, kStreaming };

// SwizzleRegs::store's default scale: the values as loaded (the multiply by 1 is exact and folds
// away; a 16-bit source is stored bit for bit and takes no other scale).
struct Unscaled {
  __device__ __forceinline__ float operator()(int) const { return 1.0f; }
};

// A SrcTile<E> as a [kRows][kWidth] tile of T (__half, __nv_bfloat16) in the 128-byte swizzle
// layout (slabs of 64 columns, wgmma::sw128_offset), staged through registers by a block of
// kThreads threads: load() issues the thread's 16-byte loads, store() writes each vector as T:
// float32 values multiplied by a per-row scale and rounded (RNE), 8 bytes; 16-bit bits as they
// are, one whole 16-byte chunk of the layout. Where vectors are not whole and aligned, load() only
// notes the source and store() loads element by element as it writes. Vector e = thread +
// kThreads·k covers row e / (kWidth / kVec): a warp's loads are whole rows.
template <typename T, typename E, int kWidth, int kRows, int kThreads, LoadCache kLoad = LoadCache::kDefault>
struct SwizzleRegs {
  using Src = SrcTile<E>;
  using Vec = typename Src::Vec;
  static constexpr int kVec = Src::kVec;
  static constexpr int kVecsPerRow = kWidth / kVec;
  static constexpr int kVecs = kRows * kVecsPerRow / kThreads;  // per thread
  static_assert(kWidth % 64 == 0 && kRows * kVecsPerRow % kThreads == 0, "whole slabs, whole vectors");
  Vec v[kVecs];
  Src src;
  bool whole;

  __device__ __forceinline__ void load(const Src& t) {
    const int tid = static_cast<int>(threadIdx.x);
    src = t;
    whole = t.whole_vectors();
    if (!whole) return;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int e = tid + kThreads * k;
      const int i = e / kVecsPerRow, c = kVec * (e % kVecsPerRow);
      // The address ahead of the bounds test: its column part is the same for all of the thread's
      // vectors where kThreads is a multiple of kVecsPerRow, formed once.
      const Vec* at = reinterpret_cast<const Vec*>(t.from + i * t.stride + c);
      v[k] = i < t.rows && c < t.cols ? (kLoad == LoadCache::kStreaming ? __ldcs(at) : *at) : Vec{};
    }
  }
  // Rows row0 … of a [kSlabRows][kWidth] tile; each float32 row i of the source multiplied by
  // scale(row0 + i) before the rounding.
  template <int kSlabRows, typename Scale = Unscaled>
  __device__ __forceinline__ void store(uint8_t* tile, int row0, Scale&& scale = Scale{}) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int e = tid + kThreads * k;
      const int i = e / kVecsPerRow, c = kVec * (e % kVecsPerRow);
      uint8_t* const to = tile + wgmma::sw128_offset<kSlabRows>(row0 + i, c / 8) + (c % 8) * 2;
      if constexpr (std::is_same_v<E, float>) {
        if (!whole) {  // element loads, zeros past rows and cols (int offsets: launchers check kQ·conv_dim < 2^31)
          const float* at = src.from + i * static_cast<int>(src.stride) + c;
          const bool row = i < src.rows;
          v[k].x = row && c < src.cols ? at[0] : 0.0f;
          v[k].y = row && c + 1 < src.cols ? at[1] : 0.0f;
          v[k].z = row && c + 2 < src.cols ? at[2] : 0.0f;
          v[k].w = row && c + 3 < src.cols ? at[3] : 0.0f;
        }
        const float w = scale(row0 + i);
        *reinterpret_cast<uint2*>(to) =
            make_uint2(mma::Mma<T>::pack(v[k].x * w, v[k].y * w), mma::Mma<T>::pack(v[k].z * w, v[k].w * w));
      } else {
        static_assert(std::is_same_v<std::decay_t<Scale>, Unscaled>, "16-bit sources are stored as they are");
        if (!whole) {
          const uint16_t* at = src.from + i * static_cast<int>(src.stride) + c;
          const bool row = i < src.rows;
          uint32_t h[kVec];
#pragma unroll
          for (int q = 0; q < kVec; ++q) h[q] = row && c + q < src.cols ? at[q] : 0u;
          v[k] = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
        }
        *reinterpret_cast<uint4*>(to) = v[k];
      }
    }
  }
  // The whole tile, unscaled.
  __device__ __forceinline__ void store(uint8_t* tile) { store<kRows>(tile, 0); }
};

// A SrcTile<uint16_t> of whole, aligned vectors (its whole_vectors()) as a [kRows][kWidth] tile of
// the 128-byte swizzle layout at shared address `tile`, by cp.async of a block of kThreads threads:
// one 16-byte copy per 8 elements, zeros past rows and cols. The caller commits and waits.
template <int kWidth, int kRows, int kThreads>
__device__ __forceinline__ void copy_swizzled_async(uint32_t tile, const SrcTile<uint16_t>& t) {
  constexpr int kVecsPerRow = kWidth / 8;
  static_assert(kWidth % 64 == 0 && kRows * kVecsPerRow % kThreads == 0, "whole slabs, whole vectors per thread");
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int k = 0; k < kRows * kVecsPerRow / kThreads; ++k) {
    const int e = tid + kThreads * k;
    const int i = e / kVecsPerRow, c = 8 * (e % kVecsPerRow);
    const bool ok = i < t.rows && c < t.cols;
    mma::cp_async_16(tile + wgmma::sw128_offset<kRows>(i, c / 8), ok ? t.from + i * t.stride + c : t.from, ok);
  }
}

}  // namespace hybridtb::cuda::ssm
