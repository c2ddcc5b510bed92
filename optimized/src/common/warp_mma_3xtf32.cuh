// One warp's product on the tensor cores for the SSM prefills (GDN, Mamba-2), both operands float32
// in shared memory: float32-accurate in 3xTF32 (mma.cuh: each float32 operand split into TF32 hi +
// lo, the products lo·hi + hi·lo + hi·hi, float32 accumulation), for the tolerances that assume
// float32 products; or with the operands rounded to float16 / bfloat16 and one m16n8k16 product per
// 16 of k (float32 accumulation), as vLLM's Triton SSD kernels multiply model-dtype operands.
// warp_mma<T> picks one by the operand type, so one kernel body serves both. warp_mma_smem16 is the
// 16-bit product from tiles staged in the operand type (ldmatrix fragments); mma_16bit_ksteps the
// 16-bit product from float32 fragments loaded for two TF32 k-steps (GDN's state and output passes),
// or from such a fragment pair stored already rounded and packed (pack_16bit_ksteps: GDN's W, k̂).
#pragma once

#include <cstdint>
#include <type_traits>

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

// C[16, 8·kTiles] += X·Yᵀ as warp_mma_3xtf32 (same operands, strides and ksteps in units of 8 of
// k), with X and Y rounded to T (__half or __nv_bfloat16, round to nearest even) as they are read
// and one mma.sync m16n8k16 per 16 of k (float32 accumulation). k runs to 8·ksteps rounded up to
// 16: both operands must read as zeros in [8·ksteps, 16·⌈ksteps/2⌉) (the SSM tiles are zero past
// their k extent up to a multiple of 16). The mma's k slots are a permutation of the staged k, the
// same for X and Y (a sum over k does not depend on which slot a product takes): lane t's slot
// pairs (2t, 2t + 1) and (2t + 8, 2t + 9) hold k = (t, t + 4) and (t + 8, t + 12) of the 16, so a
// lane reads exactly the elements (and shared-memory banks) of two 3xTF32 k-steps: the strides
// chosen conflict-free for those stay conflict-free.
template <typename T, int kTiles, int kXm, int kXk, int kYn, int kYk>
__device__ __forceinline__ void warp_mma_16bit(float (&c)[kTiles][4], const float* x, const float* y, int ksteps,
                                               int tiles = kTiles) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float* xg = x + (lane / 4) * kXm + (lane % 4) * kXk;
  const float* yg = y + (lane / 4) * kYn + (lane % 4) * kYk;
  const int steps16 = (ksteps + 1) / 2;
#pragma unroll 2
  for (int s = 0; s < steps16; ++s) {
    const int k = 16 * s;
    uint32_t a[4];
    a[0] = Mma<T>::pack(xg[k * kXk], xg[(k + 4) * kXk]);
    a[1] = Mma<T>::pack(xg[8 * kXm + k * kXk], xg[8 * kXm + (k + 4) * kXk]);
    a[2] = Mma<T>::pack(xg[(k + 8) * kXk], xg[(k + 12) * kXk]);
    a[3] = Mma<T>::pack(xg[8 * kXm + (k + 8) * kXk], xg[8 * kXm + (k + 12) * kXk]);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j >= tiles) continue;
      const float* yj = yg + 8 * j * kYn;
      const uint32_t b0 = Mma<T>::pack(yj[k * kYk], yj[(k + 4) * kYk]);
      const uint32_t b1 = Mma<T>::pack(yj[(k + 8) * kYk], yj[(k + 12) * kYk]);
      Mma<T>::run(c[j], a, b0, b1);
    }
  }
}

// The product with operands of type T: float → 3xTF32 (float32-accurate), __half / __nv_bfloat16 →
// rounded to T, one m16n8k16 per 16 of k (warp_mma_16bit's zero padding of k applies).
template <typename T, int kTiles, int kXm, int kXk, int kYn, int kYk>
__device__ __forceinline__ void warp_mma(float (&c)[kTiles][4], const float* x, const float* y, int ksteps,
                                         int tiles = kTiles) {
  if constexpr (std::is_same_v<T, float>) {
    warp_mma_3xtf32<kTiles, kXm, kXk, kYn, kYk>(c, x, y, ksteps, tiles);
  } else {
    warp_mma_16bit<T, kTiles, kXm, kXk, kYn, kYk>(c, x, y, ksteps, tiles);
  }
}

// C[16, 8·kTiles] += X·Yᵀ over k ∈ [0, 16·steps16) with X and Y tiles of T (__half or
// __nv_bfloat16: already rounded when staged) in shared memory, one m16n8k16 per 16 of k (float32
// accumulation), the fragments read by ldmatrix.x4 (4 8×8 matrices per instruction, kTiles even:
// one x4 serves two column tiles of Y):
//   X(m, k) = x[m·xs + k] (kXKMajor, ldmatrix) or x[k·xs + m] (MN-major, ldmatrix.trans),
//   Y(n, k) = y[n·ys + k] (kYKMajor, ldmatrix) or y[k·ys + n] (MN-major, ldmatrix.trans),
// for the warp's 16 rows and 8·kTiles columns; strides in elements, multiples of 8 (16-byte rows
// for ldmatrix), the tiles 16-byte aligned. ldmatrix reads 8 rows of 16 bytes per matrix: a row
// stride of an odd number of 16-byte units (padded tiles, e.g. 40 or 72 elements) puts them in 8
// distinct 16-byte bank groups, conflict-free.
template <typename T, int kTiles, bool kXKMajor, bool kYKMajor>
__device__ __forceinline__ void warp_mma_smem16(float (&c)[kTiles][4], const T* x, int xs, const T* y, int ys,
                                                int steps16) {
  static_assert(sizeof(T) == 2 && kTiles % 2 == 0, "16-bit tiles, column tiles in pairs");
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int r8 = lane % 8, q = lane / 8;  // this lane's row within matrix q of an x4
  // X: matrices (m 0–7, k 0–7), (m 8–15, k 0–7), (m 0–7, k 8–15), (m 8–15, k 8–15) = a0 … a3.
  const int xm = kXKMajor ? r8 + 8 * (q % 2) : 8 * (q % 2);
  const int xk = kXKMajor ? 8 * (q / 2) : r8 + 8 * (q / 2);
  // Y, per pair of column tiles (j, j + 1): (n j, k 0–7), (n j, k 8–15), (n j + 1, k 0–7), (n j + 1,
  // k 8–15) = b0, b1 of tile j, b0, b1 of tile j + 1.
  const int yn = kYKMajor ? r8 + 8 * (q / 2) : 8 * (q / 2);
  const int yk = kYKMajor ? 8 * (q % 2) : r8 + 8 * (q % 2);
  const uint32_t xa = shared_address(kXKMajor ? x + xm * xs + xk : x + xk * xs + xm);
  const uint32_t ya = shared_address(kYKMajor ? y + yn * ys + yk : y + yk * ys + yn);
  const uint32_t x_step = 2u * 16u * (kXKMajor ? 1u : static_cast<uint32_t>(xs));  // bytes per 16 of k
  const uint32_t y_step = 2u * 16u * (kYKMajor ? 1u : static_cast<uint32_t>(ys));
  const uint32_t y_pair = 2u * 16u * (kYKMajor ? static_cast<uint32_t>(ys) : 1u);  // bytes per 16 of n
  // Not unrolled: two steps' fragments live at once spill the chunk scan at its register bound
  // (80 at 3 blocks per SM, beside its two 16×32 accumulators); the other warps hide the latency.
#pragma unroll 1
  for (int s = 0; s < steps16; ++s) {
    uint32_t a[4];
    if constexpr (kXKMajor) {
      ldmatrix_x4(a, xa + s * x_step);
    } else {
      ldmatrix_x4_trans(a, xa + s * x_step);
    }
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      uint32_t b[4];
      if constexpr (kYKMajor) {
        ldmatrix_x4(b, ya + s * y_step + (j / 2) * y_pair);
      } else {
        ldmatrix_x4_trans(b, ya + s * y_step + (j / 2) * y_pair);
      }
      Mma<T>::run(c[j], a, b[0], b[1]);
      Mma<T>::run(c[j + 1], a, b[2], b[3]);
    }
  }
}

// c += A·B for one 16×8 tile and 16 of k with the operands rounded to T (__half or __nv_bfloat16)
// and one m16n8k16 product, from float32 operands held in the fragment layout of two consecutive
// TF32 k-steps (mma_tf32): a0, a1 the lane's A fragments {(g, t), (g + 8, t), (g, t + 4),
// (g + 8, t + 4)} of k-steps 0 and 1; b0 = {B(t, g), B(t + 4, g)} of k-step 0, b1 the same of k-step 1
// (g = lane / 4, t = lane % 4). The k slots are warp_mma_16bit's permutation (slots 2t, 2t + 1 ← k t,
// t + 4 of step 0; 2t + 8, 2t + 9 ← the same of step 1), so a kernel that stages its fragments for
// the TF32 products feeds the 16-bit product from the same loads.
template <typename T>
__device__ __forceinline__ void mma_16bit_ksteps(float (&c)[4], const float4& a0, const float4& a1, float2 b0,
                                                 float2 b1) {
  const uint32_t a[4] = {Mma<T>::pack(a0.x, a0.z), Mma<T>::pack(a0.y, a0.w), Mma<T>::pack(a1.x, a1.z),
                         Mma<T>::pack(a1.y, a1.w)};
  Mma<T>::run(c, a, Mma<T>::pack(b0.x, b0.y), Mma<T>::pack(b1.x, b1.y));
}

// mma_16bit_ksteps's A operand stored ahead: the four 32-bit registers it packs from a0, a1 (each
// element rounded to T to nearest even, Mma<T>::pack), so a kernel can keep a fragment pair in 16 bytes
// of 16-bit elements and feed it to the overload below with the same bits.
template <typename T>
__device__ __forceinline__ uint4 pack_16bit_ksteps(const float4& a0, const float4& a1) {
  return make_uint4(Mma<T>::pack(a0.x, a0.z), Mma<T>::pack(a0.y, a0.w), Mma<T>::pack(a1.x, a1.z),
                    Mma<T>::pack(a1.y, a1.w));
}

// mma_16bit_ksteps with its A fragments already packed (pack_16bit_ksteps): the same product.
template <typename T>
__device__ __forceinline__ void mma_16bit_ksteps(float (&c)[4], const uint4& a, float2 b0, float2 b1) {
  const uint32_t a_regs[4] = {a.x, a.y, a.z, a.w};
  Mma<T>::run(c, a_regs, Mma<T>::pack(b0.x, b0.y), Mma<T>::pack(b1.x, b1.y));
}

// mma_16bit_ksteps with both operands already packed: A as above, B as the two 32-bit registers
// Mma<T>::pack(b0.x, b0.y), Mma<T>::pack(b1.x, b1.y) would hold (k-steps (t, t + 4) and (t + 8, t + 12)
// of the lane's column): the same product.
template <typename T>
__device__ __forceinline__ void mma_16bit_ksteps(float (&c)[4], const uint4& a, const uint2& b) {
  const uint32_t a_regs[4] = {a.x, a.y, a.z, a.w};
  Mma<T>::run(c, a_regs, b.x, b.y);
}

// Row and column of element e < 4 of this lane's 16×8 C fragment (mma.cuh's layout).
__device__ __forceinline__ int frag_row(int e) { return static_cast<int>(threadIdx.x) % 32 / 4 + 8 * (e / 2); }
__device__ __forceinline__ int frag_col(int e) { return 2 * (static_cast<int>(threadIdx.x) % 4) + e % 2; }

}  // namespace hybridtb::cuda::mma
