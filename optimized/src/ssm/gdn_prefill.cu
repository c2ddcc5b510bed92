// gdn on the GPU, the prefills (gdn_kernels.h: launch_gdn_prefill): the chunked WY form of the gated
// delta rule, after the preparation (gdn_kernels.cu) has normalised q and k and computed the gates.
//
// Prefills (fla's chunk_gated_delta_rule with chunk C = 64, V-major). Chunks never straddle a
// request and end after every block-boundary token (mamba_cache_mode all), so each boundary state
// is a chunk's exit state. Chunks are not aligned to absolute positions: any block size and any
// continuation position work, at the cost of chunks shorter than 64 around boundaries. With
// G_i the in-chunk inclusive cumsum of g and Γ_ij = e^(G_i − G_j) (j ≤ i, so ≤ 1):
//   (1) chunk_intra_kernel, per chunk × value head, parallel over all chunks of the wave:
//         A_ij = β_i·Γ_ij·(k̂_i·k̂_j) for j < i (strictly lower),  P_ij = (q̂_i·k̂_j)·Γ_ij for j ≤ i,
//         [W | U] = (I + A)^-1·[diag(β·e^G)·K | diag(β)·V]  by forward substitution, one column
//         per thread held in registers (no synchronisation inside the solve);
//   (2) chunk_state_kernel, per prefill × value head × tile of 16 rows of M, sequential over the
//       request's chunks — only the chain that must be sequential (M's tile in registers, float32,
//       entering from read_slot or zeros; the next chunk's W, K, U, G arrive by cp.async while the
//       current one computes, two barriers per chunk):
//         h_c = M (the entry state, stored),  V_new = U − W·Mᵀ (stored over U),
//         M ← e^(G_n)·M + V_newᵀ·diag(e^(G_n − G_j))·K;
//       the exit state of a chunk ending at a boundary row goes to its slot, the last to write_slot;
//   (3) chunk_output_kernel, per chunk × value head × 64 value channels, parallel:
//         O = diag(e^G)·Q·h_cᵀ + P·V_new.
// Every thread of (2) owns the same elements of M when loading, updating and storing them, so a
// slot read and written by one request (read_slot == write_slot) is safe. The h_c scratch holds
// Hv·dv·dk float32 per chunk (64 KiB per value head at 128/128: 512 MiB at 64k tokens × 8 heads).
// Every product runs on the tensor cores in 3xTF32 (mma.cuh: each float32 operand split into TF32
// hi + lo, three m16n8k8 products with float32 accumulation: float32-level accuracy, the parity
// tests unchanged); the substitution, decays and gates stay float32 on the CUDA cores. Fixed
// summation orders, no atomics: bitwise reproducible. H100 (hybridtb_bench_linear, prepare +
// prefill of one fresh request): 64k tokens × 8 value heads 8.28 ms = 4.1 nominal TFLOP/s (47.8 ms
// on the CUDA cores before; FlashInfer's published sm90 figure 0.40 ms), 8k at Qwen3-Next's 32 value
// heads 2.84 ms. The sequential state pass dominates (64 of 132 SMs busy at 8 value heads, each
// chunk a chain of dependent tensor-core steps): the next step is splitting it over more blocks.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/mma.cuh"
#include "ssm/gdn_kernels.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

// --- (3) prefills: the chunked WY form --------------------------------------------------------------

constexpr int kC = kGdnChunk;
constexpr int kPrefillThreads = 256;  // 8 warps in each of the three kernels
constexpr int kStateRows = 16;        // rows of M (value channels) per block of the state pass
constexpr int kOutCols = 64;          // value channels per block of the output pass
// Row strides (floats) of the shared tiles, for conflict-free fragment loads: element (g, t) of a
// tile read row-major with a stride ≡ 4 (mod 32) sits in bank 4g + t; element (t, g) of a tile read
// transposed with a stride ≡ 8 (mod 32) in bank 8t + g (g < 8, t < 4: 32 distinct banks). Every
// stride is a multiple of 4 floats: 16-byte cp.async rows.
constexpr int kRowMajor128 = kGdnMaxHeadDim + 4;  // 132: [·][dk] read row-major
constexpr int kColMajor128 = kGdnMaxHeadDim + 8;  // 136: [·][dk] read transposed
constexpr int kRowMajor64 = kC + 4;               // 68
constexpr int kColMajor64 = kOutCols + 8;         // 72
constexpr int kColMajor16 = kStateRows + 8;       // 24
static_assert(kOutCols == kC, "the output pass's state rows copy as a chunk-sized tile");

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

__device__ __forceinline__ uint32_t smem_address(const float* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One warp's C[16, 8·kTiles] += X·Yᵀ over k ∈ [0, 8·ksteps) in 3xTF32 (mma.cuh: near-float32
// products, float32 accumulation), X(m, k) = x[m·kXm + k·kXk] for the warp's 16 rows, Y(n, k) =
// y[n·kYn + k·kYk] for its 8·kTiles columns; both in shared memory, read through the fragment
// layout of mma_tf32 (each X fragment feeds kTiles products). The hi·hi products accumulate in c,
// the lo·hi and hi·lo ones in a second accumulator added at the end: two dependent mma chains
// in flight instead of one three times as long (a fixed order all the same).
template <int kTiles, int kXm, int kXk, int kYn, int kYk>
__device__ __forceinline__ void warp_mma_3xtf32(float (&c)[kTiles][4], const float* x, const float* y, int ksteps) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float* xg = x + (lane / 4) * kXm + (lane % 4) * kXk;
  const float* yg = y + (lane / 4) * kYn + (lane % 4) * kYk;
  float small[kTiles][4] = {};
#pragma unroll 4
  for (int s = 0; s < ksteps; ++s) {
    const int k = 8 * s;
    uint32_t a_hi[4], a_lo[4];
    mma::split_tf32(xg[k * kXk], a_hi[0], a_lo[0]);
    mma::split_tf32(xg[8 * kXm + k * kXk], a_hi[1], a_lo[1]);
    mma::split_tf32(xg[(k + 4) * kXk], a_hi[2], a_lo[2]);
    mma::split_tf32(xg[8 * kXm + (k + 4) * kXk], a_hi[3], a_lo[3]);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      uint32_t b_hi0, b_lo0, b_hi1, b_lo1;
      mma::split_tf32(yg[8 * j * kYn + k * kYk], b_hi0, b_lo0);
      mma::split_tf32(yg[8 * j * kYn + (k + 4) * kYk], b_hi1, b_lo1);
      mma::mma_tf32(small[j], a_lo, b_hi0, b_hi1);
      mma::mma_tf32(small[j], a_hi, b_lo0, b_lo1);
      mma::mma_tf32(c[j], a_hi, b_hi0, b_hi1);
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) c[j][e] += small[j][e];
  }
}

// Row r and column c of the 16×8 C fragment element e < 4 of this lane (mma.cuh's layout).
__device__ __forceinline__ int frag_row(int e) { return static_cast<int>(threadIdx.x) % 32 / 4 + 8 * (e / 2); }
__device__ __forceinline__ int frag_col(int e) { return 2 * (static_cast<int>(threadIdx.x) % 4) + e % 2; }

// Shared rows [0, kC) × columns [0, width) (row stride `ss`, width a multiple of 4) ← global rows
// [0, n) × columns [0, cols) (rows `gs` floats apart), zeros elsewhere, by cp.async: 16 bytes per
// copy where `vec` (cols and gs multiples of 4, src 16-byte aligned), else 4. The caller commits.
__device__ void copy_tile_async(float* dst, int ss, const float* src, int64_t gs, int n, int cols, int width,
                                bool vec) {
  const int tid = static_cast<int>(threadIdx.x);
  if (vec) {
    const int quads = width / 4;
    for (int e = tid; e < kC * quads; e += kPrefillThreads) {
      const int i = e / quads, c = 4 * (e % quads);
      const bool ok = i < n && c < cols;
      mma::cp_async_16(smem_address(dst + i * ss + c), ok ? src + i * gs + c : src, ok);
    }
  } else {
    for (int e = tid; e < kC * width; e += kPrefillThreads) {
      const int i = e / width, c = e % width;
      const bool ok = i < n && c < cols;
      mma::cp_async_4(smem_address(dst + i * ss + c), ok ? src + i * gs + c : src, ok);
    }
  }
}

// Shared memory of chunk_intra_kernel (floats): K, Q [C][132], A [C][68], G, β, β·e^G [C].
size_t intra_smem_bytes() { return sizeof(float) * (2 * kC * kRowMajor128 + kC * kRowMajor64 + 3 * kC); }

// Block = chunk blockIdx.x × value head blockIdx.y.
__global__ void __launch_bounds__(kPrefillThreads) chunk_intra_kernel(GdnParams p) {
  const GdnChunk chunk = p.chunks[blockIdx.x];
  const int h = static_cast<int>(blockIdx.y);
  const int n = chunk.end - chunk.begin;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  constexpr int ks = kRowMajor128, as = kRowMajor64;
  extern __shared__ __align__(16) float intra_smem[];
  float* K = intra_smem;
  float* Q = K + kC * ks;
  float* A = Q + kC * ks;
  float* G = A + kC * as;
  float* B = G + kC;
  float* BE = B + kC;

  // q̂, k̂ of the chunk, zero past its n rows and past dk (to dk rounded up to 16: the mma tiles).
  const float* rows = p.qkv + int64_t{chunk.begin} * gdn_conv_dim(p);
  const bool qkv_vec = dk % 4 == 0 && gdn_conv_dim(p) % 4 == 0 && aligned16(p.qkv);
  copy_tile_async(Q, ks, rows + int64_t{hk} * dk, gdn_conv_dim(p), n, dk, round_up(dk, 16), qkv_vec);
  copy_tile_async(K, ks, rows + int64_t{p.Hk + hk} * dk, gdn_conv_dim(p), n, dk, round_up(dk, 16), qkv_vec);
  mma::cp_async_commit();
  if (tid == 0) {  // the in-chunk inclusive cumsum of g, in token order (0 past n)
    float acc = 0.0f;
    for (int i = 0; i < kC; ++i) {
      if (i < n) acc += p.g[int64_t{chunk.begin + i} * Hv + h];
      G[i] = i < n ? acc : 0.0f;
    }
  }
  for (int i = tid; i < kC; i += kPrefillThreads) B[i] = i < n ? p.beta[int64_t{chunk.begin + i} * Hv + h] : 0.0f;
  mma::cp_async_wait<0>();
  __syncthreads();
  for (int i = tid; i < kC; i += kPrefillThreads) BE[i] = B[i] * expf(G[i]);

  // A (strictly lower) and P (lower with the diagonal; rows of the chunk, zeros above) from k̂·k̂ᵀ and
  // q̂·k̂ᵀ on the tensor cores: warp w takes rows 16·(w mod 4) … and columns 32·(w / 4) … of both.
  {
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    float kk[4][4] = {}, qk[4][4] = {};
    warp_mma_3xtf32<4, ks, 1, ks, 1>(kk, K + m0 * ks, K + n0 * ks, round_up(dk, 8) / 8);
    warp_mma_3xtf32<4, ks, 1, ks, 1>(qk, Q + m0 * ks, K + n0 * ks, round_up(dk, 8) / 8);
#pragma unroll
    for (int jt = 0; jt < 4; ++jt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + frag_row(e), j = n0 + 8 * jt + frag_col(e);
        float a = 0.0f, attn = 0.0f;
        if (i < n && j <= i) {
          const float decay = expf(G[i] - G[j]);
          if (j < i) a = B[i] * decay * kk[jt][e];
          attn = qk[jt][e] * decay;
        }
        A[i * as + j] = a;
        if (i < n) p.attn[(int64_t{chunk.begin + i} * Hv + h) * kC + j] = attn;
      }
    }
  }
  __syncthreads();

  // (I + A)·X = [diag(β·e^G)·K | diag(β)·V] by forward substitution, one column per thread held in
  // registers (thread c < 128: column c of W, else column c − 128 of U): X_i = rhs_i − Σ_{j<i}
  // A_ij·X_j, j ascending; row i of A is a broadcast, read 4 floats at a time. Rows past n: A's are
  // zero and the right-hand side zero, so they stay finite and are not stored.
  const bool is_w = tid < kGdnMaxHeadDim;
  const int c = is_w ? tid : tid - kGdnMaxHeadDim;
  if (c < (is_w ? dk : dv)) {
    const float* v_col = rows + 2 * int64_t{p.Hk} * dk + int64_t{h} * dv + c;
    float x[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      x[i] = is_w ? K[i * ks + c] * BE[i] : (i < n ? v_col[int64_t{i} * gdn_conv_dim(p)] * B[i] : 0.0f);
    }
#pragma unroll
    for (int i = 1; i < kC; ++i) {
      const float* a_row = A + i * as;
      float acc = x[i];
#pragma unroll
      for (int j4 = 0; j4 < i; j4 += 4) {
        const float4 a4 = *reinterpret_cast<const float4*>(a_row + j4);
        acc = fmaf(-a4.x, x[j4], acc);
        if (j4 + 1 < i) acc = fmaf(-a4.y, x[j4 + 1], acc);
        if (j4 + 2 < i) acc = fmaf(-a4.z, x[j4 + 2], acc);
        if (j4 + 3 < i) acc = fmaf(-a4.w, x[j4 + 3], acc);
      }
      x[i] = acc;
    }
    float* out = is_w ? p.w + int64_t{h} * dk + c : p.u + int64_t{h} * dv + c;
    const int64_t out_stride = int64_t{Hv} * (is_w ? dk : dv);
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (i < n) out[int64_t{chunk.begin + i} * out_stride] = x[i];
    }
  }
  for (int i = tid; i < n; i += kPrefillThreads) p.gcum[int64_t{chunk.begin + i} * Hv + h] = G[i];
}

// Shared memory of chunk_state_kernel (floats): two stages of W [C][132], K [C][136], U [C][24],
// G [C] (the next chunk's arrive while the current one computes), M [16][132], V_new·e^(G_n − G_j)
// [C][24].
constexpr int kStageFloats = kC * (kRowMajor128 + kColMajor128 + kColMajor16 + 1);
size_t state_smem_bytes() {
  return sizeof(float) * (2 * size_t{kStageFloats} + kStateRows * kRowMajor128 + kC * kColMajor16);
}

// Block = tile blockIdx.x % tiles (rows v0 = 16·tile …) of value head blockIdx.x / tiles of prefill
// blockIdx.y, 8 warps. M's tile lives in registers as the accumulators of the update Mᵀ ← e^(G_n)·Mᵀ +
// Kᵀ·diag(e^(G_n − G_j))·V_new: warp w holds Mᵀ rows c ∈ 16·w + [0, 16) (w < ⌈dk/16⌉), all 16
// columns v as two 16×8 tiles sharing each K fragment. Each thread loads, updates
// and stores the same elements of M, so read_slot == write_slot is safe. Per chunk (two barriers):
// wait for its tiles, prefetch the next chunk's; store M (the entry state, from shared memory) to h;
// V_new = U − W·Mᵀ (warp w: tokens 16·(w mod 4) …, rows 8·(w / 4) …) stored over U and, scaled by
// e^(G_n − G_j), to shared memory; then the update, the boundary state and M back to shared memory.
__global__ void __launch_bounds__(kPrefillThreads, 1) chunk_state_kernel(GdnParams p, int tiles) {
  const GdnPrefill prefill = p.prefills[blockIdx.y];
  const GpuRequest r = p.wave.requests[prefill.request];
  const int h = static_cast<int>(blockIdx.x) / tiles;
  const int v0 = (static_cast<int>(blockIdx.x) % tiles) * kStateRows;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int rows = min(kStateRows, dv - v0);
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int dk16 = round_up(dk, 16);
  constexpr int ws = kRowMajor128, ks = kColMajor128, us = kColMajor16, ms = kRowMajor128, vs = kColMajor16;
  extern __shared__ __align__(16) float state_smem[];
  float* M = state_smem + 2 * kStageFloats;
  float* Vs = M + kStateRows * ms;
  const auto stage = [&](int buffer, float*& W, float*& K, float*& U, float*& G) {
    W = state_smem + buffer * kStageFloats;
    K = W + kC * ws;
    U = K + kC * ks;
    G = U + kC * us;
  };

  const bool qkv_vec = dk % 4 == 0 && gdn_conv_dim(p) % 4 == 0 && aligned16(p.qkv);
  const bool w_vec = dk % 4 == 0 && aligned16(p.w);
  const bool u_vec = dv % 4 == 0 && aligned16(p.u);
  const auto prefetch = [&](int ci, int buffer) {
    const GdnChunk chunk = p.chunks[ci];
    const int n = chunk.end - chunk.begin;
    float *W, *K, *U, *G;
    stage(buffer, W, K, U, G);
    copy_tile_async(W, ws, p.w + (int64_t{chunk.begin} * Hv + h) * dk, int64_t{Hv} * dk, n, dk, dk16, w_vec);
    copy_tile_async(K, ks, p.qkv + int64_t{chunk.begin} * gdn_conv_dim(p) + int64_t{p.Hk + hk} * dk, gdn_conv_dim(p), n,
                    dk, dk16, qkv_vec);
    copy_tile_async(U, us, p.u + (int64_t{chunk.begin} * Hv + h) * dv + v0, int64_t{Hv} * dv, n, rows, kStateRows,
                    u_vec);
    for (int i = tid; i < kC; i += kPrefillThreads) {
      mma::cp_async_4(smem_address(G + i), i < n ? p.gcum + int64_t{chunk.begin + i} * Hv + h : p.gcum, i < n);
    }
    mma::cp_async_commit();
  };
  prefetch(prefill.first_chunk, 0);

  // M's tile enters from read_slot (or zeros) into the accumulators, then to shared memory.
  const PoolRef& pool = p.recurrent_state;
  const int64_t tile_offset = (int64_t{h} * dv + v0) * dk;  // within a slot: rows v0 … of head h
  const bool owns = 16 * warp < dk16;
  float m_acc[2][4];
#pragma unroll
  for (int jt = 0; jt < 2; ++jt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 16 * warp + frag_row(e), v = 8 * jt + frag_col(e);
      const bool saved = owns && c < dk && v < rows && r.read_slot >= 0;
      m_acc[jt][e] = saved ? load_element(pool.data, r.read_slot * pool.slot_size + tile_offset + v * dk + c,
                                          pool.kind)
                           : 0.0f;
      if (owns) M[v * ms + c] = m_acc[jt][e];
    }
  }

  const bool h_vec = dk % 4 == 0 && aligned16(p.h);
  for (int ci = prefill.first_chunk; ci < prefill.first_chunk + prefill.num_chunks; ++ci) {
    const int buffer = (ci - prefill.first_chunk) % 2;
    float *W, *K, *U, *G;
    stage(buffer, W, K, U, G);
    mma::cp_async_wait<0>();
    __syncthreads();  // chunk ci's tiles and M's entry state visible; every warp is past chunk ci − 1
    if (ci + 1 < prefill.first_chunk + prefill.num_chunks) prefetch(ci + 1, buffer ^ 1);
    const GdnChunk chunk = p.chunks[ci];
    const int n = chunk.end - chunk.begin;

    // The entry state, for the output pass.
    float* h_tile = p.h + (int64_t{ci} * Hv + h) * dv * dk + int64_t{v0} * dk;
    if (h_vec) {
      for (int v = tid / 32; v < rows; v += kPrefillThreads / 32) {
        const int c = 4 * (tid % 32);
        if (c < dk) *reinterpret_cast<float4*>(h_tile + v * dk + c) = *reinterpret_cast<const float4*>(M + v * ms + c);
      }
    } else {
      for (int v = tid / kGdnMaxHeadDim; v < rows; v += kPrefillThreads / kGdnMaxHeadDim) {
        const int c = tid % kGdnMaxHeadDim;
        if (c < dk) h_tile[v * dk + c] = M[v * ms + c];
      }
    }

    // V_new = U − W·Mᵀ: stored over U (the output pass reads it) and as V_new·e^(G_n − G_j) for the
    // update. Rows past n: U and W are zero, so V_new is 0.
    {
      const int m0 = 16 * (warp % 4), n0 = 8 * (warp / 4);
      float wm[1][4] = {};
      warp_mma_3xtf32<1, ws, 1, ms, 1>(wm, W + m0 * ws, M + n0 * ms, round_up(dk, 8) / 8);
      const float g_last = G[n - 1];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = m0 + frag_row(e), v = n0 + frag_col(e);
        const float v_new = U[i * us + v] - wm[0][e];
        if (i < n && v < rows) p.u[(int64_t{chunk.begin + i} * Hv + h) * dv + v0 + v] = v_new;
        Vs[i * vs + v] = v_new * expf(g_last - G[i]);
      }
    }
    __syncthreads();  // Vs complete; every read of M done

    // M ← e^(G_n)·M + V_newᵀ·diag(e^(G_n − G_j))·K, then the boundary state and M for the next chunk.
    const float exit_decay = expf(G[n - 1]);
    const int32_t boundary = p.boundary_slot != nullptr ? p.boundary_slot[chunk.end - 1] : -1;
    if (owns) {
#pragma unroll
      for (int jt = 0; jt < 2; ++jt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) m_acc[jt][e] *= exit_decay;
      }
      warp_mma_3xtf32<2, 1, ks, 1, vs>(m_acc, K + 16 * warp, Vs, (n + 7) / 8);
#pragma unroll
      for (int jt = 0; jt < 2; ++jt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 16 * warp + frag_row(e), v = 8 * jt + frag_col(e);
          M[v * ms + c] = m_acc[jt][e];
          if (boundary >= 0 && c < dk && v < rows) {
            store_element(pool.data, boundary * pool.slot_size + tile_offset + v * dk + c, pool.kind, m_acc[jt][e]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int jt = 0; jt < 2; ++jt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 16 * warp + frag_row(e), v = 8 * jt + frag_col(e);
      if (owns && c < dk && v < rows) {
        store_element(pool.data, r.write_slot * pool.slot_size + tile_offset + v * dk + c, pool.kind, m_acc[jt][e]);
      }
    }
  }
}

// Shared memory of chunk_output_kernel (floats): Q [C][132], the entry state's rows [64][132], P
// [C][68], V_new [C][72], G [C].
size_t output_smem_bytes() {
  return sizeof(float) *
         (size_t{kC} * kRowMajor128 + size_t{kOutCols} * kRowMajor128 + kC * kRowMajor64 + kC * kColMajor64 + kC);
}

// Block = chunk blockIdx.x × value head blockIdx.y × value channels v0 = 64·blockIdx.z …, 8 warps:
// O = diag(e^G)·Q·Mᵀ + P·V_new with M the chunk's entry state (h) and V_new from the state pass;
// warp w takes tokens 16·(w mod 4) … and channels v0 + 32·(w / 4) …; P's zeros above the diagonal
// let the second product stop at the warp's last token.
__global__ void __launch_bounds__(kPrefillThreads) chunk_output_kernel(GdnParams p) {
  const int ci = static_cast<int>(blockIdx.x);
  const GdnChunk chunk = p.chunks[ci];
  const int h = static_cast<int>(blockIdx.y);
  const int v0 = static_cast<int>(blockIdx.z) * kOutCols;
  const int n = chunk.end - chunk.begin;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int cols = min(kOutCols, dv - v0);
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int dk16 = round_up(dk, 16);
  constexpr int qs = kRowMajor128, hs = kRowMajor128, ps = kRowMajor64, vs = kColMajor64;
  extern __shared__ __align__(16) float output_smem[];
  float* Q = output_smem;
  float* Hm = Q + kC * qs;
  float* P = Hm + kOutCols * hs;
  float* Vn = P + kC * ps;
  float* G = Vn + kC * vs;

  const bool qkv_vec = dk % 4 == 0 && gdn_conv_dim(p) % 4 == 0 && aligned16(p.qkv);
  copy_tile_async(Q, qs, p.qkv + int64_t{chunk.begin} * gdn_conv_dim(p) + int64_t{hk} * dk, gdn_conv_dim(p), n, dk, dk16,
                  qkv_vec);
  copy_tile_async(Hm, hs, p.h + ((int64_t{ci} * Hv + h) * dv + v0) * dk, dk, cols, dk, dk16,
                  dk % 4 == 0 && aligned16(p.h));
  copy_tile_async(P, ps, p.attn + int64_t{chunk.begin} * Hv * kC + int64_t{h} * kC, int64_t{Hv} * kC, n, kC, kC,
                  aligned16(p.attn));
  copy_tile_async(Vn, vs, p.u + (int64_t{chunk.begin} * Hv + h) * dv + v0, int64_t{Hv} * dv, n, cols, kOutCols,
                  dv % 4 == 0 && aligned16(p.u));
  mma::cp_async_commit();
  for (int i = tid; i < kC; i += kPrefillThreads) G[i] = i < n ? p.gcum[int64_t{chunk.begin + i} * Hv + h] : 0.0f;
  mma::cp_async_wait<0>();
  __syncthreads();

  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  float o[4][4] = {};
  warp_mma_3xtf32<4, qs, 1, hs, 1>(o, Q + m0 * qs, Hm + n0 * hs, round_up(dk, 8) / 8);
#pragma unroll
  for (int jt = 0; jt < 4; ++jt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[jt][e] *= expf(G[m0 + frag_row(e)]);
  }
  warp_mma_3xtf32<4, ps, 1, 1, vs>(o, P + m0 * ps, Vn + n0, (m0 + 16) / 8);
#pragma unroll
  for (int jt = 0; jt < 4; ++jt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = m0 + frag_row(e), v = n0 + 8 * jt + frag_col(e);
      if (i < n && v < cols) {
        store_element(p.o.data, int64_t{chunk.begin + i} * p.o.row_stride + int64_t{h} * dv + v0 + v, p.o.kind,
                      o[jt][e]);
      }
    }
  }
}

// Dynamic shared memory above the default 48 KiB needs an opt-in per kernel.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    HYBRIDTB_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

}  // namespace

void launch_gdn_prefill(const GdnParams& p, cudaStream_t stream) {
  if (p.num_prefills == 0 || p.num_chunks == 0) return;
  const size_t intra_smem = intra_smem_bytes();
  allow_smem(chunk_intra_kernel, intra_smem);
  chunk_intra_kernel<<<dim3(static_cast<unsigned>(p.num_chunks), static_cast<unsigned>(p.Hv)), kPrefillThreads,
                       intra_smem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  const size_t state_smem = state_smem_bytes();
  allow_smem(chunk_state_kernel, state_smem);
  const int tiles = (p.dv + kStateRows - 1) / kStateRows;
  chunk_state_kernel<<<dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(p.num_prefills)),
                       kPrefillThreads, state_smem, stream>>>(p, tiles);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  const size_t output_smem = output_smem_bytes();
  allow_smem(chunk_output_kernel, output_smem);
  const int col_tiles = (p.dv + kOutCols - 1) / kOutCols;
  chunk_output_kernel<<<dim3(static_cast<unsigned>(p.num_chunks), static_cast<unsigned>(p.Hv),
                             static_cast<unsigned>(col_tiles)),
                        kPrefillThreads, output_smem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
