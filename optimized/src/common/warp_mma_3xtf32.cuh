// One warp's float32-accurate product on the tensor cores, for the SSM prefills (GDN, Mamba-2) whose
// tolerances assume float32 products: 3xTF32 (mma.cuh: each float32 operand split into TF32 hi + lo,
// the products lo·hi + hi·lo + hi·hi, float32 accumulation), with both operands in shared memory.
#pragma once

#include <cstdint>

#include "common/mma.cuh"

namespace hybridtb::cuda::mma {

// C[16, 8·kTiles] += X·Yᵀ over k ∈ [0, 8·ksteps): X(m, k) = x[m·kXm + k·kXk] for the warp's 16 rows,
// Y(n, k) = y[n·kYn + k·kYk] for its 8·kTiles columns, read through the fragment layout of mma_tf32
// (each X fragment feeds kTiles products). The hi·hi products accumulate in c, the lo·hi and hi·lo
// ones in a second accumulator added at the end: two dependent mma chains in flight instead of one
// three times as long, in a fixed order all the same. Only the first `tiles` (warp-uniform) column
// tiles are computed; the others' Y is not read.
template <int kTiles, int kXm, int kXk, int kYn, int kYk>
__device__ __forceinline__ void warp_mma_3xtf32(float (&c)[kTiles][4], const float* x, const float* y, int ksteps,
                                                int tiles = kTiles) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float* xg = x + (lane / 4) * kXm + (lane % 4) * kXk;
  const float* yg = y + (lane / 4) * kYn + (lane % 4) * kYk;
  float small[kTiles][4] = {};
#pragma unroll 4
  for (int s = 0; s < ksteps; ++s) {
    const int k = 8 * s;
    uint32_t a_hi[4], a_lo[4];
    split_tf32(xg[k * kXk], a_hi[0], a_lo[0]);
    split_tf32(xg[8 * kXm + k * kXk], a_hi[1], a_lo[1]);
    split_tf32(xg[(k + 4) * kXk], a_hi[2], a_lo[2]);
    split_tf32(xg[8 * kXm + (k + 4) * kXk], a_hi[3], a_lo[3]);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j >= tiles) continue;
      uint32_t b_hi0, b_lo0, b_hi1, b_lo1;
      split_tf32(yg[8 * j * kYn + k * kYk], b_hi0, b_lo0);
      split_tf32(yg[8 * j * kYn + (k + 4) * kYk], b_hi1, b_lo1);
      mma_tf32(small[j], a_lo, b_hi0, b_hi1);
      mma_tf32(small[j], a_hi, b_lo0, b_lo1);
      mma_tf32(c[j], a_hi, b_hi0, b_hi1);
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) c[j][e] += small[j][e];
  }
}

// Row and column of element e < 4 of this lane's 16×8 C fragment (mma.cuh's layout).
__device__ __forceinline__ int frag_row(int e) { return static_cast<int>(threadIdx.x) % 32 / 4 + 8 * (e / 2); }
__device__ __forceinline__ int frag_col(int e) { return 2 * (static_cast<int>(threadIdx.x) % 4) + e % 2; }

}  // namespace hybridtb::cuda::mma
