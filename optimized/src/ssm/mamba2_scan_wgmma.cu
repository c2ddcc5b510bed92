// The chunk scan of the mamba2 prefill (mamba2_kernels.cu's chunk_scan_kernel: its math, buffers and
// numerics) with 16-bit product operands on Hopper's warpgroup MMAs. Compiled for sm_90a only
// (optimized/CMakeLists.txt); mamba2_kernels.cu launches it where Mamba2Params::chunk_wgmma is set
// (compute capability 9.0 devices, unless BackendSettings::ssm_prefill_wgmma asks for mma.sync).
//
// Block = (chunk, head, kTile = 64 rows t0 … of the chunk, kPTile = 128 columns p0 … of P: the whole
// of Falcon-H1's P = 128, so that M is formed once per (chunk, t tile, head)), one-dimensional grid
// with the P tiles, t tiles and heads of a chunk consecutive (ScanWgmmaGrid: the resident blocks
// share a few chunks' C and C·Bᵀ, which every head of a group reads: one DRAM read of them, L2 for
// the other heads; the t tiles of a head share its entering state and x). Two warpgroups;
// warpgroup w owns the outputs' columns 64·w … 64·w + 63 of the tile and all its 64 rows (warp
// w·4 + r: rows 16·r …; the wgmma accumulator is the mma.sync m16n8 C fragment tiled along the 64
// columns, wgmma.cuh).
//   1. off[t, p] = Σ_n C_t[n]·H[p, n] over N in slabs of kSlabN = 64 (one 128-byte swizzle row of 16-bit
//      elements): per slab the C tile [64 t][64 n] and the H tile [128 p][64 n] (K-major, 128-byte
//      swizzle) in a ring of three stages, one block barrier per slab; C read as T (rounded once
//      for every head by the C·Bᵀ kernel: Mamba2Params::bc16), H as T where the state passing
//      rounded it already (Mamba2Params::chunk_states16). Where both are whole 16-byte vectors (N a
//      multiple of 8) they are copied by cp.async straight into the stages, two slabs ahead;
//      otherwise (float32 entering states, odd N) staged through registers, rounded as stored, the
//      next slab's loads in flight over this slab's MMAs. Per warpgroup and slab 4 wgmma m64n64k16
//      (A = C, B = its 64 rows of H, both from shared memory).
//   2. M[t, s] = cb[t, s]·exp(Λ_t − Λ_s)·Δ_s (s ≤ t < length, else 0), rounded to T → shared [t][s]
//      (K-major), once for the block; the x tile [s][p] of s < t0 + 64 rounded → shared (MN-major,
//      two 64-column slabs), both over the consumed ring; the tile's float32 C·Bᵀ rows were copied
//      by cp.async at the block's start (in flight over step 1).
//   3. diag[t, p] = Σ_s M[t, s]·x_s[p]: per warpgroup (t0 + 64) / 16 wgmma m64n64k16 (M is lower
//      triangular: s < t0 + 64), B = x by its transposed descriptor.
//   4. y = diag + exp(Λ_t)·off + D·x_t, x_t float32 (cp.async over the C·Bᵀ rows during step 3).
// The values rounded to 16 bits are the mma.sync kernel's (C, H entering the chunk, M, x, RNE), the
// accumulation is float32, the slabs and k steps run in a fixed order (one accumulator chain per
// product; the order within one MMA instruction is the hardware's): bitwise reproducible run to
// run. Staged values past the chunk, P or N are zeros (partial tiles and odd sizes cost padded
// work only; where rows are not whole aligned 16-byte vectors, the element path of SwizzleRegs,
// mamba2_wgmma_tiles.cuh, as mamba2_kernels.cu's TileRegs16 has).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/warp_mma_3xtf32.cuh"
#include "common/wgmma.cuh"
#include "ssm/mamba2_cb_rows.cuh"
#include "ssm/mamba2_scan_wgmma.h"
#include "ssm/mamba2_wgmma_tiles.cuh"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kQ = kMamba2ChunkTokens;  // tokens per chunk
constexpr int kTile = 64;               // t rows per block (one wgmma M extent)
constexpr int kTBlocks = kQ / kTile;    // t tiles of a chunk
constexpr float kLog2e = 1.4426950408889634f;

// The launch configuration and the shared layout (bytes; every tile starts at a 1024-byte boundary:
// the swizzle atoms).
struct ScanWgmmaLayout {
  static constexpr int kThreads = 256;     // two warpgroups
  static constexpr int kBlocksPerSm = 2;   // 108 KB of shared memory, ≤ 128 registers per thread
  static constexpr int kPTile = 128;       // P columns per block (64 per warpgroup)
  static constexpr int kSlabN = 64;        // N per step of step 1: one 128-byte swizzle row
  static constexpr int kStages = 3;        // the C, H ring
  static constexpr int kCBytes = kTile * 128;    // C [t][n] of one slab
  static constexpr int kHBytes = kPTile * 128;   // H [p][n] of one slab
  static constexpr int kStageBytes = kCBytes + kHBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // Over the ring after step 1: M [t][s] (kQ / 64 slabs of 64 s) and x [s][p] (2 slabs of 64 p).
  static constexpr int kMOffset = 0;
  static constexpr int kXOffset = kTile * kQ * 2;
  static constexpr int kXSlabBytes = kQ * 128;  // one 64-column slab of x: the MN-major leading offset
  static constexpr int kXBytes = kQ * kPTile * 2;
  // Past the ring: the tile's float32 C·Bᵀ rows [t − t0][s], then over them the outputs' x_t.
  static constexpr int kCbStride = kQ + 4;        // floats: 16-byte rows
  static constexpr int kXOutStride = kPTile + 8;  // floats, ≡ 8 (mod 32): the epilogue's pairs conflict-free
  static constexpr int kF32Offset = kRingBytes;
  static constexpr int kF32Bytes = 4 * kTile * (kCbStride > kXOutStride ? kCbStride : kXOutStride);
  static constexpr size_t kSmemBytes = size_t{kF32Offset} + kF32Bytes + 1024;  // + the base's alignment
  static_assert(kXOffset + kXBytes <= kRingBytes, "M and x fit over the ring");
  static_assert(kQ % kTile == 0 && kQ <= kThreads && kPTile == 128 && kSlabN == 64, "the warp tiles below");
};
using L = ScanWgmmaLayout;

// The one-dimensional grid: block = ((chunk · heads + head) · kTBlocks + t tile) · p_tiles + P tile.
// Chunk-fastest blocks (the chunks of one head, then the next head) would have every resident block
// read a different chunk's C (128 KB at N 256) and C·Bᵀ (64 KB at kQ 128): by the time the next head
// reads a chunk's again, a head's blocks later (512 at 32k tokens), the x, state and output streams
// have evicted them from L2, so both come from DRAM once per head: 192 of the 448 KB a (chunk, head)
// moves at Falcon-H1's sizes (float32 entering state 128, x 64, outputs 64). Adjacent, they come from DRAM
// once per chunk: some 40% less DRAM traffic (at 32k tokens about 2.7 GB: much of the kernel's time).
struct ScanWgmmaGrid {
  int heads, p_tiles;
  __host__ __device__ int blocks_per_chunk() const { return heads * kTBlocks * p_tiles; }
  __device__ int chunk() const { return static_cast<int>(blockIdx.x) / blocks_per_chunk(); }
  __device__ int head() const { return static_cast<int>(blockIdx.x) % blocks_per_chunk() / (kTBlocks * p_tiles); }
  __device__ int t_tile() const { return static_cast<int>(blockIdx.x) / p_tiles % kTBlocks; }
  __device__ int p_tile() const { return static_cast<int>(blockIdx.x) % p_tiles; }
};

// TH: the elements of the entering states, float (chunk_states, rounded here) or uint16_t (the
// product dtype's bits, chunk_states16).
template <typename T, typename TH>
__global__ void __launch_bounds__(L::kThreads, L::kBlocksPerSm) chunk_scan_wgmma_kernel(Mamba2Params p) {
  constexpr bool kStates32 = std::is_same_v<TH, float>;
  using Mmas = wgmma::WgmmaN64<T>;
  __shared__ __align__(16) float delta[kQ];  // 16-byte aligned: step 2 reads them by float4
  __shared__ __align__(16) float lambda[kQ];
  extern __shared__ __align__(1024) uint8_t scan_raw[];
  uint8_t* const smem = scan_raw + ((1024u - (mma::shared_address(scan_raw) & 1023u)) & 1023u);
  const uint32_t smem_addr = mma::shared_address(smem);
  float* const f32 = reinterpret_cast<float*>(smem + L::kF32Offset);

  const int64_t d_ssm = int64_t{p.heads} * p.head_dim;
  const int64_t conv_dim = d_ssm + 2 * int64_t{p.groups} * p.state;
  const int P = p.head_dim, N = p.state;
  const ScanWgmmaGrid grid{p.heads, (P + L::kPTile - 1) / L::kPTile};
  const int c = grid.chunk();
  const int t0 = grid.t_tile() * kTile;
  const Mamba2Chunk chunk = p.chunks[c];
  const int length = chunk.end - chunk.begin;
  if (t0 >= length) return;  // block-uniform: rows wholly past the chunk
  const int h = grid.head();
  const int g = h / (p.heads / p.groups);
  const int p0 = grid.p_tile() * L::kPTile;
  const int tid = static_cast<int>(threadIdx.x);
  // A block's thread index is nonnegative: its quotients (warp, warpgroup, rows of the staging
  // loops) are then shifts, with no sign fix-ups kept in registers (ptxas spilled them at the
  // 128-register bound of two blocks per SM).
  __builtin_assume(tid >= 0 && tid < L::kThreads);
  const int warp = tid / 32;
  // The warpgroup: columns 64·wg … of the tile. Broadcast from lane 0, the compiler knows it
  // warp-uniform and forms the descriptors that derive from it in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int wm = 16 * (warp % 4);      // the warp's rows of the accumulators
  const int64_t item = int64_t{c} * p.heads + h;
  const TH* H = static_cast<const TH*>(kStates32 ? static_cast<const void*>(p.chunk_states) : p.chunk_states16) +
                item * P * N;  // the state entering the chunk
  const float* rows = p.xbc + int64_t{chunk.begin} * conv_dim;  // the chunk's conv rows
  // C rounded once by the C·Bᵀ kernel (Mamba2Params::bc16: rows of B then C, 2·G·N apart).
  const int64_t bc_row = 2 * int64_t{p.groups} * N;
  const uint16_t* C =
      static_cast<const uint16_t*>(p.bc16) + (chunk.begin + int64_t{t0}) * bc_row + (int64_t{p.groups} + g) * N;
  const int s_end = t0 + kTile;  // s < s_end: the columns of M step 3 reads

  // The tile's C·Bᵀ values (rows t < length, quads of s ≤ t) by cp.async, in flight over step 1.
    copy_cb_rows_async<kTile, L::kThreads>(f32, L::kCbStride, p, c, g, t0, length, tid);

  // 1. off = C·Hᵀ over N, slab by slab.
  SwizzleRegs<T, uint16_t, L::kSlabN, kTile, L::kThreads> c_regs;
  SwizzleRegs<T, TH, L::kSlabN, L::kPTile, L::kThreads> h_regs;
  const auto c_src = [&](int i) { return SrcTile<uint16_t>{C + i * L::kSlabN, bc_row, length - t0, N - i * L::kSlabN}; };
  const auto h_src = [&](int i) {
    return SrcTile<TH>{H + int64_t{p0} * N + i * L::kSlabN, N, P - p0, N - i * L::kSlabN};
  };
  const auto load = [&](int i) {
    c_regs.load(c_src(i));
    h_regs.load(h_src(i));
  };
  const auto store = [&](int i) {
    uint8_t* const stage = smem + (i % L::kStages) * L::kStageBytes;
    c_regs.store(stage);
    h_regs.store(stage + L::kCBytes);
  };
  const int slabs = (N + L::kSlabN - 1) / L::kSlabN;
  float off[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) off[n][0] = off[n][1] = off[n][2] = off[n][3] = 0.0f;
  // Slab i's MMAs (its stage staged and fenced by every thread before the barrier; after it, every
  // warpgroup's MMAs of slab i − 1 are done, so its stage may be refilled), committed, not waited.
  const auto slab_mmas = [&](int i) {
    wgmma::fence_proxy_async();
    __syncthreads();
    const uint32_t a = smem_addr + static_cast<uint32_t>((i % L::kStages) * L::kStageBytes);
    const uint64_t a_desc = wgmma::sw128_desc(a, 16, 1024);
    const uint64_t b_desc = wgmma::sw128_desc(a + static_cast<uint32_t>(L::kCBytes + wg * 64 * 128), 16, 1024);
    wgmma::pin(off);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < L::kSlabN / 16; ++kk) {  // k step kk: 32 bytes into the 128-byte rows (zeros past N)
      Mmas::ss(off, wgmma::sw128_desc_advance(a_desc, 32u * kk), wgmma::sw128_desc_advance(b_desc, 32u * kk), true);
    }
    wgmma::commit();
  };
  const auto load_cumsum = [&] {
    if (tid < kQ) {
      delta[tid] = p.chunk_cumsum[item * 3 * kQ + tid];
      lambda[tid] = p.chunk_cumsum[item * 3 * kQ + kQ + tid];
    }
  };
  // 16-bit entering states and C of whole, aligned 16-byte vectors (N a multiple of 8): both
  // copied by cp.async straight into the swizzled stages, two slabs ahead (no registers, no stores
  // of their own); otherwise staged through registers, one slab ahead.
  bool copied = false;
  if constexpr (!kStates32) copied = c_src(0).whole_vectors() && h_src(0).whole_vectors();  // block-uniform
  if (copied) {
    const auto copy = [&](int i) {
      const uint32_t stage = smem_addr + static_cast<uint32_t>((i % L::kStages) * L::kStageBytes);
      copy_swizzled_async<L::kSlabN, kTile, L::kThreads>(stage, c_src(i));
      if constexpr (!kStates32) {
        copy_swizzled_async<L::kSlabN, L::kPTile, L::kThreads>(stage + static_cast<uint32_t>(L::kCBytes), h_src(i));
      }
      mma::cp_async_commit();
    };
    static_assert(L::kStages >= 3, "two slabs in flight beside the one the MMAs read");
    copy(0);
    if (slabs > 1) copy(1);
    load_cumsum();
    for (int i = 0; i < slabs; ++i) {
      if (i + 1 < slabs) {
        mma::cp_async_wait<1>();  // slab i landed (slab i + 1 may be in flight)
      } else {
        mma::cp_async_wait<0>();
      }
      slab_mmas(i);
      if (i + 2 < slabs) copy(i + 2);  // into slab i − 1's stage, free after slab_mmas' barrier
      wgmma::wait<0>();
      wgmma::pin(off);
    }
  } else {
    load(0);
    load_cumsum();
    store(0);
    for (int i = 0; i < slabs; ++i) {
      if (i + 1 < slabs) load(i + 1);  // in flight during slab i's MMAs
      slab_mmas(i);
      if (i + 1 < slabs) store(i + 1);
      wgmma::wait<0>();
      wgmma::pin(off);
    }
  }

  // 2. M and the x tile over the ring (every warpgroup's step-1 MMAs are done after the barrier).
  mma::cp_async_wait<0>();
  __syncthreads();  // the ring is free; C·Bᵀ staged
  uint8_t* const ms = smem + L::kMOffset;  // M [t − t0][s], slabs of 64 s
  uint8_t* const xs = smem + L::kXOffset;  // x [s][p − p0], slabs of 64 p
  const float* x_rows = rows + int64_t{h} * P + p0;
  constexpr int kMRows = kTile / kTBlocks;  // rows of M per 64-row x block
  {
    SwizzleRegs<T, float, L::kPTile, kTile, L::kThreads> x_regs;
    for (int bk = 0; bk < kTBlocks; ++bk) {
      const int sb = bk * kTile;
      const SrcTile<float> x_src{x_rows + int64_t{sb} * conv_dim, conv_dim, min(length, s_end) - sb, P - p0};
      if (sb < s_end) x_regs.load(x_src);
      // M's rows bk·kMRows … by 16-byte chunks of the layout (columns s0 … s0 + 7 of one row, one
      // 16-byte store): chunks at or past s_end are not read by step 3; chunks wholly above the
      // diagonal (s0 > t) or in rows past the chunk are zeros. Columns s > t inside a chunk select
      // zero (their C·Bᵀ values were not copied).
      constexpr int kChunksPerRow = kQ / 8;
      static_assert(kMRows * kChunksPerRow % L::kThreads == 0, "whole chunks per thread");
#pragma unroll
      for (int k = 0; k < kMRows * kChunksPerRow / L::kThreads; ++k) {
        const int e = tid + L::kThreads * k;
        const int i = bk * kMRows + e / kChunksPerRow, s0 = 8 * (e % kChunksPerRow);
        if (s0 >= s_end) continue;
        const int t = t0 + i;
        uint4 packed = make_uint4(0u, 0u, 0u, 0u);
        if (t < length && s0 <= t) {
          float cb[8], lam[8], del[8];
#pragma unroll
          for (int q = 0; q < 8; q += 4) {
            *reinterpret_cast<float4*>(cb + q) = *reinterpret_cast<const float4*>(f32 + i * L::kCbStride + s0 + q);
            *reinterpret_cast<float4*>(lam + q) = *reinterpret_cast<const float4*>(lambda + s0 + q);
            *reinterpret_cast<float4*>(del + q) = *reinterpret_cast<const float4*>(delta + s0 + q);
          }
          // exp(Λ_t − Λ_s) as exp2 of the difference scaled by log2(e), as Triton lowers tl.exp in
          // vLLM's chunk scan: MUFU.EX2 and a few instructions instead of expf's accurate path (the
          // two agree within a few float32 ulps, far below the 16-bit rounding that follows).
          const float lambda_t = lambda[t];
          float m[8];
#pragma unroll
          for (int q = 0; q < 8; ++q) {  // every column's product, then the select: no branch per column
            const float value = cb[q] * exp2f((lambda_t - lam[q]) * kLog2e) * del[q];
            m[q] = s0 + q <= t ? value : 0.0f;
          }
          packed = make_uint4(mma::Mma<T>::pack(m[0], m[1]), mma::Mma<T>::pack(m[2], m[3]),
                              mma::Mma<T>::pack(m[4], m[5]), mma::Mma<T>::pack(m[6], m[7]));
        }
        *reinterpret_cast<uint4*>(ms + wgmma::sw128_offset<kTile>(i, s0 / 8)) = packed;
      }
      if (sb < s_end) x_regs.template store<kQ>(xs, sb);
    }
  }
  wgmma::fence_proxy_async();
  __syncthreads();  // M and x staged; every thread's C·Bᵀ reads done
  // The outputs' x_t in float32 (the staged x is rounded) over the C·Bᵀ rows, in flight during step 3.
  {
    const float* src = x_rows + int64_t{t0} * conv_dim;
    const int nrows = length - t0, ncols = P - p0;
    if (conv_dim % 4 == 0 && ncols % 4 == 0 && aligned16(src)) {
      constexpr int kQuads = L::kPTile / 4;
      for (int e = tid; e < kTile * kQuads; e += L::kThreads) {
        const int i = e / kQuads, q = 4 * (e % kQuads);
        const bool ok = i < nrows && q < ncols;
        mma::cp_async_16(mma::shared_address(f32 + i * L::kXOutStride + q), ok ? src + i * conv_dim + q : src, ok);
      }
    } else {
      for (int e = tid; e < kTile * L::kPTile; e += L::kThreads) {
        const int i = e / L::kPTile, q = e % L::kPTile;
        const bool ok = i < nrows && q < ncols;
        mma::cp_async_4(mma::shared_address(f32 + i * L::kXOutStride + q), ok ? src + i * conv_dim + q : src, ok);
      }
    }
    mma::cp_async_commit();
  }

  // 3. diag = M·x over s < s_end in k steps of 16 (a compile-time count per t tile: no predicated
  // MMAs; M and x are zeros past the chunk).
  float diag[8][4];
#pragma unroll
  for (int n = 0; n < 8; ++n) diag[n][0] = diag[n][1] = diag[n][2] = diag[n][3] = 0.0f;
  {
    const uint64_t m_desc = wgmma::sw128_desc(smem_addr + L::kMOffset, 16, 1024);
    const uint64_t x_desc =
        wgmma::sw128_desc(smem_addr + static_cast<uint32_t>(L::kXOffset + wg * L::kXSlabBytes), L::kXSlabBytes, 1024);
    const auto issue = [&](auto ksteps) {
      wgmma::pin(diag);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < decltype(ksteps)::value; ++kk) {  // M: slab kk / 4, 32 bytes per step; x: 16 rows
        const uint32_t slab_m = static_cast<uint32_t>((kk / 4) * kTile * 128 + (kk % 4) * 32);
        Mmas::ss_mn(diag, wgmma::sw128_desc_advance(m_desc, slab_m),
                    wgmma::sw128_desc_advance(x_desc, static_cast<uint32_t>(kk * 16 * 128)), true);
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::pin(diag);
    };
    static_assert(kTBlocks <= 2, "t tiles 0 and 1 below");
    if (t0 == 0) {
      issue(std::integral_constant<int, kTile / 16>{});
    } else {
      issue(std::integral_constant<int, kQ / 16>{});
    }
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // x_t staged

  // 4. The epilogue (rows wm + g, wm + g + 8 of the tile; columns 64·wg + 8·j + 2·(lane % 4) …).
  const float Dh = load_element(p.D.data, h, p.D.kind);
  const bool pairs = p.y.kind == ElementKind::kFloat32 && p.y.row_stride % 2 == 0 && P % 2 == 0 &&
                     (reinterpret_cast<uintptr_t>(p.y.data) & 7) == 0;
#pragma unroll
  for (int e = 0; e < 4; e += 2) {  // (e, e + 1): two adjacent columns of one row
    const int t = t0 + wm + mma::frag_row(e);
    if (t >= length) continue;
    const float carry_decay = expf(lambda[t]);
    const int64_t y_row = (chunk.begin + t) * p.y.row_stride + int64_t{h} * P + p0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = 64 * wg + 8 * j + mma::frag_col(e);
      if (p0 + col >= P) continue;
      const float2 x = *reinterpret_cast<const float2*>(f32 + (t - t0) * L::kXOutStride + col);
      float value[2];
      value[0] = fmaf(Dh, x.x, fmaf(carry_decay, off[j][e], diag[j][e]));
      value[1] = fmaf(Dh, x.y, fmaf(carry_decay, off[j][e + 1], diag[j][e + 1]));
      if (pairs) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.y.data) + y_row + col) = make_float2(value[0], value[1]);
      } else {
        store_element(p.y.data, y_row + col, p.y.kind, value[0]);
        if (p0 + col + 1 < P) store_element(p.y.data, y_row + col + 1, p.y.kind, value[1]);
      }
    }
  }
}

template <typename T, typename TH>
void launch_typed(const Mamba2Params& p, cudaStream_t stream) {
  allow_dynamic_smem(chunk_scan_wgmma_kernel<T, TH>, L::kSmemBytes);
  const ScanWgmmaGrid grid{p.heads, (p.head_dim + L::kPTile - 1) / L::kPTile};
  const unsigned blocks = static_cast<unsigned>(p.num_chunks) * static_cast<unsigned>(grid.blocks_per_chunk());
  chunk_scan_wgmma_kernel<T, TH><<<blocks, L::kThreads, L::kSmemBytes, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// The entering states as the state passing wrote them: 16-bit where chunk_states16 is set.
template <typename T>
void launch_states(const Mamba2Params& p, cudaStream_t stream) {
  if (p.chunk_states16 != nullptr) {
    launch_typed<T, uint16_t>(p, stream);
  } else {
    launch_typed<T, float>(p, stream);
  }
}

}  // namespace

void launch_mamba2_chunk_scan_wgmma(const Mamba2Params& p, cudaStream_t stream) {
  if (p.product_operands == ElementKind::kFloat16) {
    launch_states<__half>(p, stream);
  } else {
    launch_states<__nv_bfloat16>(p, stream);
  }
}

}  // namespace hybridtb::cuda::ssm
