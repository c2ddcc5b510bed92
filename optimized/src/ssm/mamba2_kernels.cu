// mamba2 on the GPU (mamba2_kernels.h): the single-step decode update, the chunked SSD prefill and
// the gated RMSNorm. The math is reference/ssm/mamba2.cpp's, in float32:
//   Δ_t = softplus(dt_t + dt_bias) (threshold 20),  A = −exp(A_log),  a_t = Δ_t·A  (per head)
//   S_t = exp(a_t)·S_{t−1} + Δ_t·x_t ⊗ B_t,  y_t = S_t·C_t + D·x_t        (S: [P, N] per head)
// Prefill, per chunk of ≤ kMamba2ChunkTokens tokens with Λ_t = Σ_{s ≤ t in the chunk} a_s (ssd_minimal's discrete
// form):
//   Δ, Λ, exp(Λ_last), exp(Λ_last − Λ_s)·Δ_s  per chunk × head, once  chunk_cumsum_kernel
//   C·Bᵀ                                       per chunk × group, once chunk_cb_kernel
//   own state sum  S_c   = Σ_s (exp(Λ_last − Λ_s)·Δ_s·x_s) ⊗ B_s       chunk_state_kernel
//   state passing  H_0 = saved state, H_{c+1} = exp(Λ_last)·H_c + S_c   state_passing_kernel
//   outputs        y_t = Σ_{s ≤ t} (C_t·B_s)·exp(Λ_t − Λ_s)·Δ_s·x_s + exp(Λ_t)·H_c·C_t + D·x_t
//                                                                       chunk_scan_kernel
// The chunk kernels' products — C·Bᵀ over N (once per chunk and group, shared by the group's heads
// and P tiles), (decay·Δ·x)ᵀ·B over the chunk's tokens (chunk state), C·Hᵀ over N and
// (C·Bᵀ ∘ decay)·x over the chunk's tokens (chunk scan) — run on the tensor cores with operands of
// one of two kinds (Mamba2Params::product_operands, a template parameter of the three kernels: one
// body each, common/warp_mma_3xtf32.cuh's warp_mma picks the product):
//  - float32 (the default): 3xTF32 (mma.cuh: each float32 operand split into TF32 hi + lo, three
//    m16n8k8 products with float32 accumulation): float32-level accuracy, the float32 SSM row of
//    the tolerance table holds;
//  - the model dtype (float16 / bfloat16), as vLLM's Triton SSD kernels: each operand rounded once
//    (x, B, C as the model's activations are; the float32 intermediates — the decayed C·Bᵀ weights
//    M, the weighted x of the chunk states, the state entering a chunk — rounded before the
//    product, as vLLM casts them), one m16n8k16 product per 16 of k with float32 accumulation: a
//    third of the tensor-core work and no hi/lo split; the 16-bit-operand SSM row of the tolerance
//    table holds. The staging, the decays and every sum stay float32.
// There is one path for every size: the operands are staged in shared memory as tiles of 64 rows
// (of a chunk's tokens, P or N: a chunk is one or more 64-row t tiles) with zeros past the chunk's
// tokens, P and N (the k extent rounded up to 8, to 16 for 16-bit operands: every staged k extent
// is a multiple of 16), so partial tiles and odd P or N (5, 6, …) only cost padded work; 16-byte
// copies where the rows allow it, 4-byte otherwise. float32 operands (and C·Bᵀ's 16-bit ones) are
// staged as float32 tiles by cp.async; the chunk scan's and chunk states' 16-bit operands as tiles
// of the model dtype, rounded as they are staged (TileRegs16) and read by ldmatrix; the chunk scan's
// float32 C·Bᵀ and output x rows by cp.async, in flight over its products.
// Where Mamba2Params::chunk_wgmma is set (the caller's choice, once per device: a compute capability
// 9.0 device and a build with sm_90a code, HYBRIDTB_MAMBA2_WGMMA) the chunk scan and the chunk
// states with 16-bit operands run on warpgroup MMAs instead (mamba2_scan_wgmma.cu: blocks of
// 64 t × 128 P, so that M is formed once per chunk, t tile and head; C·Hᵀ in 64-wide N slabs of
// m64n64k16 from shared 128-byte-swizzle tiles, M·x likewise; mamba2_state_wgmma.cu: blocks of
// 128 P per chunk and head, the weighted x staged once, B in 64-wide N tiles; where the scan reads
// 16-bit entering states, the chunk states and the state passing as one kernel, a block per
// sequence, head, 128 P and 64 N walking the chunks, the float32 sums kept in registers): the same
// values rounded to 16 bits at the same points, float32 accumulation, the slabs in a fixed order; only the
// order of the products inside one MMA instruction differs from mma.sync's (the 16-bit-operand row
// of the tolerance table bounds both). Elsewhere (other GPUs, or the mma.sync bodies asked for:
// BackendSettings::ssm_prefill_wgmma false) chunk_state_kernel and chunk_scan_kernel below run them.
// The decays, Δ, Λ, the masks, the state passing and the epilogues stay float32 on the CUDA cores.
// Chunks never straddle a block boundary (the host ends a chunk after each boundary row), so the
// state passing stores the boundary states between chunks. Λ is computed once per chunk and head
// (chunk_cumsum) and read by the chunk kernels. Every sum runs in a fixed order and no float is
// accumulated atomically: bitwise reproducible run to run.
// The decode update is bound by the state pool's bandwidth: each state row is read and written once
// in 16-byte runs of the pool's own element, its sums over the row's lanes exchange half of the rows
// per shuffle level (common/group_sums.cuh), and B, C are read by each lane from global memory (no
// staging behind a block barrier).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/group_sums.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/warp_mma_3xtf32.cuh"
#include "common/pdl.cuh"
#include "ssm/activations.cuh"
#include "ssm/mamba2_cb_rows.cuh"
#include "ssm/pool_quads.cuh"
#include "ssm/mamba2_kernels.h"
#include "ssm/mamba2_scan_wgmma.h"
#include "ssm/mamba2_state_wgmma.h"
#include "ssm/weight_ref.cuh"

namespace hybridtb::cuda::ssm {
namespace {

using mma::frag_col;
using mma::frag_row;
using mma::warp_mma;

constexpr int kQ = kMamba2ChunkTokens;  // tokens per chunk (the chunk kernels' s extent)
constexpr int kTile = 64;               // P, N and t tile of the chunk kernels
constexpr int kTBlocks = kQ / kTile;    // t tiles of a chunk
constexpr int kNStep = 32;              // N values staged per step of the chunk scan
constexpr int kChunkThreads = 256;      // 8 warps: 4 row blocks of 16 × 2 column blocks of 32
// Row strides (floats) of the chunk kernels' shared tiles, for conflict-free fragment loads:
// element (g, t) of a tile read row-major with a stride ≡ 4 (mod 32) sits in bank 4g + t; element
// (t, g) of a tile read transposed with a stride ≡ 8 (mod 32) in bank 8t + g (g < 8, t < 4: 32
// distinct banks). Every stride is a multiple of 4 floats: 16-byte cp.async rows.
constexpr int kStepStride = kNStep + 4;  // 36: the chunk scan's [·][n] staging tiles (row-major)
constexpr int kRowMajorQ = kQ + 4;      // 68 or 132: M [t][s] (row-major)
constexpr int kColMajor64 = kTile + 8;   // 72: [s][p] and [s][n] tiles (transposed)

static_assert(kQ % kTile == 0 && kQ % 32 == 0 && kQ <= kChunkThreads, "a chunk is whole t tiles, whole lanes' tokens");
static_assert(kChunkThreads == 256 && kTile == 64, "the warp tiles below cover 64 × 64 with 8 warps");
static_assert(kNStep % 16 == 0 && kTile % 16 == 0, "16-bit products read k in whole 16s of zero-padded tiles");

// The chunk kernels' launch configuration for product operands T (float: 3xTF32; __half,
// __nv_bfloat16: the model dtype, Mamba2Params::product_operands). The chunk scan and the chunk
// states stage 16-bit operands as tiles of T (ScanLayout, StateLayout: half the float32 tiles'
// shared memory and traffic; the chunk scan adds float32 C·Bᵀ rows, 68 KB in all at kQ 128), but
// keep the float32 path's blocks per SM: the registers bound them
// (sm_90, no spills: the 16-bit chunk scan uses all 80 at 3 blocks; the 16-bit chunk states 119 of
// 128 at 2, with a B tile's loads in flight over the product — at 3 blocks, 80 registers, it spills).
struct ChunkConfig {
  int state_blocks_per_sm;  // the chunk states' blocks per SM (__launch_bounds__)
  int scan_blocks_per_sm;   // the chunk scan's
};
template <typename T>
__host__ __device__ constexpr ChunkConfig chunk_config() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "product operands: float (3xTF32), __half or __nv_bfloat16");
  ChunkConfig c{};
  c.state_blocks_per_sm = kQ == 64 ? 3 : 2;  // 3 [kQ][72] tiles each (float: 110.6 KB at kQ 128; T: 55.3 KB)
  c.scan_blocks_per_sm = 3;
  return c;
}

// The sizes derived from the parameters.
struct Dims {
  int64_t d_ssm, conv_dim;
  int heads_per_group;
};
__device__ __forceinline__ Dims dims_of(const Mamba2Params& p) {
  const int64_t d_ssm = int64_t{p.heads} * p.head_dim;
  const int64_t conv_dim = d_ssm + 2 * int64_t{p.groups} * p.state;
  return Dims{d_ssm, conv_dim, p.heads / p.groups};
}

// Δ of row t, head h: softplus((dt + in_proj_bias) + dt_bias), as the reference adds them.
__device__ __forceinline__ float delta_of(const Mamba2Params& p, const Dims& d, int64_t t, int h) {
  const int64_t col = d.d_ssm + d.conv_dim + h;  // dt's column of in_proj (its bias)
  const float dt = load_element(p.dt.data, t * p.dt.row_stride + h, p.dt.kind) + weight_or(p.in_bias, col, 0.0f);
  return softplus(dt + load_element(p.dt_bias.data, h, p.dt_bias.kind));
}
__device__ __forceinline__ float decay_rate(const Mamba2Params& p, int h) {  // A = −exp(A_log)
  return -expf(load_element(p.A_log.data, h, p.A_log.kind));
}

// --- decode: the single-step update ------------------------------------------------------------------
// Block = (head, entry, a range of the head's P rows). Each state row (N values) is spread over
// kLanes consecutive lanes of a warp; a lane moves kAccesses runs of kVec = 16 / sizeof(T)
// consecutive states (n0 = kVec·(lane + kLanes·a)), each one 16-byte access (T: the pool's
// element: float, __half or __nv_bfloat16), streaming (evict-first: every state is touched once).
// A thread handles kRows rows (4; 8 for 16-bit rows of one access per lane, so that a thread keeps
// as many bytes in flight as with float32 rows of two): all their loads are issued first and held
// as raw 16-byte registers (4 per access whatever T: the update is bound by the state's
// bandwidth), then row by row widened, updated, summed and stored.
// Each lane reads its part of the group's B and C into registers once for all its rows (no shared
// memory, no barrier). y's sum over N is the lane's states in order, then the
// sums over the kLanes lanes of all the thread's rows at once, scattered over the lanes
// (group_sums.cuh: kRows − 1 + log2(kLanes / kRows) shuffles instead of a tree of log2 kLanes per
// row; fixed order). Sizes the vector path does not take (N or the slot size no multiple of kVec)
// move element by element.
constexpr int kDecodeThreads = 128;

template <typename T, int kLanes, int kAccesses, int kRows>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(Mamba2Params p) {
  constexpr int kVec = kPoolRun<T>;
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (r.end <= r.begin || (p.decode_all == 0 && r.decode == 0)) return;
  const Dims d = dims_of(p);
  const int h = static_cast<int>(blockIdx.x);
  const int g = h / d.heads_per_group;
  const int P = p.head_dim, N = p.state;
  const int64_t t = r.begin;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  constexpr int kRowsPerPass = kDecodeThreads / kLanes;
  const int row0 = static_cast<int>(blockIdx.z) * kRowsPerPass * kRows + static_cast<int>(threadIdx.x) / kLanes;
  const float* xbc = p.xbc + t * d.conv_dim;
  const bool vec = N % kVec == 0 && p.ssm_state.slot_size % kVec == 0 &&
                   (reinterpret_cast<uintptr_t>(p.ssm_state.data) & 15) == 0;
  const int64_t head_base = int64_t{h} * P * N;

  // Loads of every row first (raw bits in flight; nothing still running writes the pool, so they go
  // out before the wait for the conv, pdl.cuh), then x, B and C (the conv's) meanwhile.
  uint4 raw[kRows][kAccesses];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int row = row0 + k * kRowsPerPass;
    const bool row_ok = row < P;
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) {
      const int n0 = kVec * (lane + kLanes * a);
      const int64_t e = head_base + int64_t{row} * N + n0;
      raw[k][a] = row_ok && n0 < N && r.read_slot >= 0
                      ? load_pool_run<T>(p.ssm_state, r.read_slot * p.ssm_state.slot_size + e, N - n0, vec)
                      : make_uint4(0u, 0u, 0u, 0u);  // zeros in every element kind
    }
  }
  pdl_wait_for_predecessor();
  float x[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int row = row0 + k * kRowsPerPass;
    x[k] = row < P ? xbc[int64_t{h} * P + row] : 0.0f;
  }
  // The lane's B and C (the same for all its rows) into registers once, straight from the conv's
  // row (16-byte loads where aligned; past N: 0).
  const float* B_row = xbc + d.d_ssm + int64_t{g} * N;
  const float* C_row = B_row + int64_t{p.groups} * N;
  const bool bc_vec = aligned16(B_row) && aligned16(C_row);
  float B[kAccesses][kVec], C[kAccesses][kVec];
#pragma unroll
  for (int a = 0; a < kAccesses; ++a) {
    const int n0 = kVec * (lane + kLanes * a);
    const int valid = max(0, min(kVec, N - n0));
    load_float_run<kVec>(B_row, n0, valid, bc_vec, B[a]);
    load_float_run<kVec>(C_row, n0, valid, bc_vec, C[a]);
  }
  const float delta = delta_of(p, d, t, h);
  const float dA = expf(delta * decay_rate(p, h));
  const float Dh = load_element(p.D.data, h, p.D.kind);
  const int32_t boundary = p.boundary_slot != nullptr ? p.boundary_slot[t] : -1;

  // Row by row: widened, updated and stored (the state is final before y's sum); then y's sums.
  float acc[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int row = row0 + k * kRowsPerPass;
    const float dx = delta * x[k];
    acc[k] = 0.0f;
    float S[kAccesses][kVec];
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) {
      widen_pool_run<T>(raw[k][a], S[a]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        S[a][i] = fmaf(S[a][i], dA, dx * B[a][i]);
        acc[k] = fmaf(S[a][i], C[a][i], acc[k]);
      }
    }
    if (row >= P) continue;
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) {
      const int n0 = kVec * (lane + kLanes * a);
      if (n0 >= N) continue;
      const int64_t e = head_base + int64_t{row} * N + n0;
      store_pool_run<T>(p.ssm_state, r.write_slot * p.ssm_state.slot_size + e, N - n0, vec, S[a]);
      if (boundary >= 0) store_pool_run<T>(p.ssm_state, boundary * p.ssm_state.slot_size + e, N - n0, vec, S[a]);
    }
  }
  // y: each row's sum ends in kLanes / kRows lanes of the row's group (group_sums.cuh: scattered,
  // fewer shuffles than a tree per row); the first of them stores it.
  const float sum = group_sums_scattered<kLanes, kRows>(acc);
  if constexpr (kRows <= kLanes) {
    const int k = scattered_sum_index<kLanes, kRows>(lane);
    float x_k = 0.0f;  // x[k] without a dynamically indexed (local-memory) array
#pragma unroll
    for (int j = 0; j < kRows; ++j) x_k = j == k ? x[j] : x_k;
    const int row = row0 + k * kRowsPerPass;
    if (lane % (kLanes / kRows) == 0 && row < P) {
      store_element(p.y.data, t * p.y.row_stride + int64_t{h} * P + row, p.y.kind, fmaf(Dh, x_k, sum));
    }
  } else if (lane == 0) {  // fewer lanes than rows: group_sums' sums in every lane
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int row = row0 + k * kRowsPerPass;
      if (row < P) store_element(p.y.data, t * p.y.row_stride + int64_t{h} * P + row, p.y.kind, fmaf(Dh, x[k], acc[k]));
    }
  }
}

// --- prefill: the chunked SSD ---------------------------------------------------------------------

// Shared rows [0, kRows) × columns [0, kWidth) (row stride ds) ← global rows [0, rows) × columns
// [0, cols) (rows gs floats apart), zeros elsewhere, by cp.async of the block's threads: 16 bytes
// per copy where every copied quad is whole and aligned (gs and cols multiples of 4, src 16-byte
// aligned), else 4. The caller commits.
template <int kWidth, int kRows>
__device__ __forceinline__ void copy_tile_async(float* dst, int ds, const float* src, int64_t gs, int rows, int cols) {
  const int tid = static_cast<int>(threadIdx.x);
  if (gs % 4 == 0 && cols % 4 == 0 && aligned16(src)) {
    constexpr int kQuads = kWidth / 4;
    for (int e = tid; e < kRows * kQuads; e += kChunkThreads) {
      const int i = e / kQuads, c = 4 * (e % kQuads);
      const bool ok = i < rows && c < cols;
      mma::cp_async_16(mma::shared_address(dst + i * ds + c), ok ? src + i * gs + c : src, ok);
    }
  } else {
    for (int e = tid; e < kRows * kWidth; e += kChunkThreads) {
      const int i = e / kWidth, c = e % kWidth;
      const bool ok = i < rows && c < cols;
      mma::cp_async_4(mma::shared_address(dst + i * ds + c), ok ? src + i * gs + c : src, ok);
    }
  }
}

// Shared float32 rows [0, rows) × columns [0, min(cols, kWidth)) of a staged tile (row stride ds)
// rounded once to T (RNE: mma::Mma<T>::pack, float_to_element; the values the 16-bit staging of
// these floats stores) into global 16-bit rows `to` (gs elements apart), by the block's threads:
// 16-byte stores of 8 elements where every row allows it (gs and cols multiples of 8, `to` 16-byte
// aligned), else one element at a time. Nothing past rows or cols is written.
template <typename T, int kWidth, int kRows>
__device__ __forceinline__ void store_rounded_rows(uint16_t* to, int64_t gs, const float* tile, int ds, int rows,
                                                   int cols) {
  using Pack = mma::Mma<T>;
  const int tid = static_cast<int>(threadIdx.x);
  if (gs % 8 == 0 && cols % 8 == 0 && aligned16(to)) {
    constexpr int kOcts = kWidth / 8;
    static_assert(kWidth % 8 == 0, "whole 8-element groups");
    for (int e = tid; e < kRows * kOcts; e += kChunkThreads) {
      const int i = e / kOcts, c = 8 * (e % kOcts);
      if (i >= rows || c >= cols) continue;
      const float4 lo = *reinterpret_cast<const float4*>(tile + i * ds + c);
      const float4 hi = *reinterpret_cast<const float4*>(tile + i * ds + c + 4);
      *reinterpret_cast<uint4*>(to + i * gs + c) =
          make_uint4(Pack::pack(lo.x, lo.y), Pack::pack(lo.z, lo.w), Pack::pack(hi.x, hi.y), Pack::pack(hi.z, hi.w));
    }
  } else {
    for (int e = tid; e < kRows * kWidth; e += kChunkThreads) {
      const int i = e / kWidth, c = e % kWidth;
      if (i < rows && c < cols) reinterpret_cast<T*>(to)[i * gs + c] = float_to_element<T>(tile[i * ds + c]);
    }
  }
}

// A row stride of an odd number of 16-byte units puts 8 consecutive rows in 8 distinct 16-byte bank
// groups (an odd multiple of 1 … 7 is no multiple of 8): ldmatrix conflict-free.
// (Row strides in 16-bit elements.)
constexpr bool odd_units(int elements16) { return elements16 * 2 % 16 == 0 && elements16 * 2 / 16 % 2 == 1; }

// The 16-bit operands' staging (product operands T = __half / __nv_bfloat16): a tile of shared
// rows [0, kRows) × columns [0, kWidth) of T ← global float32 rows [0, rows) × columns [0, cols)
// (rows gs floats apart), zeros elsewhere, each element multiplied by scale(row) (the identity for
// x, B, C and the entering state) and rounded once to T (RNE: the value the fragments of the
// float32 staging rounded to). Through registers, in two halves so that a step's loads are in
// flight during the previous step's product: load() issues the thread's 16-byte global loads,
// store() scales, rounds and writes them (8 bytes per quad). Where the quads are not whole and
// aligned (gs or cols no multiple of 4, src not 16-byte aligned: odd sizes), load() only notes the
// source (an int stride: the launcher checks kRows·gs < 2^31) and store() loads element by element
// as it writes (4 bytes per element, not in flight over the product: the 4 bounds tests per quad
// held that long would spill).
// Quad e = thread + kChunkThreads·k covers row e / (kWidth / 4): a warp's loads are whole rows.
template <typename T, int kWidth, int kRows>
struct TileRegs16 {
  static constexpr int kQuadsPerRow = kWidth / 4;
  static constexpr int kQuads = kRows * kQuadsPerRow / kChunkThreads;  // per thread
  static_assert(kWidth % 4 == 0 && kRows * kQuadsPerRow % kChunkThreads == 0, "whole quads per thread");
  float4 v[kQuads];
  const float* src;  // the element path's source and bounds (rows gs floats apart)
  int gs, rows, cols;
  bool quads;

  __device__ __forceinline__ void load(const float* from, int64_t stride, int nrows, int ncols) {
    const int tid = static_cast<int>(threadIdx.x);
    src = from;
    gs = static_cast<int>(stride);
    rows = nrows;
    cols = ncols;
    quads = stride % 4 == 0 && ncols % 4 == 0 && aligned16(from);
    if (!quads) return;
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int e = tid + kChunkThreads * k;
      const int i = e / kQuadsPerRow, c = 4 * (e % kQuadsPerRow);
      v[k] = i < nrows && c < ncols ? *reinterpret_cast<const float4*>(from + i * stride + c)
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  template <typename Scale>
  __device__ __forceinline__ void store(T* dst, int ds, Scale&& scale) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int k = 0; k < kQuads; ++k) {
      const int e = tid + kChunkThreads * k;
      const int i = e / kQuadsPerRow, c = 4 * (e % kQuadsPerRow);
      if (!quads) {
        const float* at = src + i * gs + c;  // i·gs < kRows·gs < 2^31 (launch_chunk_kernels)
        const bool row = i < rows;
        v[k].x = row && c < cols ? at[0] : 0.0f;
        v[k].y = row && c + 1 < cols ? at[1] : 0.0f;
        v[k].z = row && c + 2 < cols ? at[2] : 0.0f;
        v[k].w = row && c + 3 < cols ? at[3] : 0.0f;
      }
      const float w = scale(i);
      const uint2 packed =
          make_uint2(mma::Mma<T>::pack(v[k].x * w, v[k].y * w), mma::Mma<T>::pack(v[k].z * w, v[k].w * w));
      *reinterpret_cast<uint2*>(dst + i * ds + c) = packed;
    }
  }
  __device__ __forceinline__ void store(T* dst, int ds) {
    store(dst, ds, [](int) { return 1.0f; });
  }
};

// The two-deep cp.async pipeline of the chunk kernels' loops over N: issues step i + 1's copies
// (stage, one commit group), when there is one, then waits for step i's and for every thread's.
template <typename Stage>
__device__ __forceinline__ void advance_step(int i, int steps, Stage&& stage) {
  if (i + 1 < steps) {
    stage(i + 1);
    mma::cp_async_wait<1>();
  } else {
    mma::cp_async_wait<0>();
  }
  __syncthreads();
}

// (0a) Per (chunk, head), once for all the chunk kernels: Δ_s, the inclusive cumulative log decay
// Λ_s = Σ_{s' ≤ s} Δ_{s'}·A and the chunk-state weight exp(Λ_last − Λ_s)·Δ_s of the chunk's tokens
// into chunk_cumsum (all three 0 past the chunk's length), the chunk's decay exp(Λ_last) into
// chunk_decay. One warp per (chunk, head): kPerLane consecutive tokens per lane summed in order,
// then a Hillis–Steele shuffle scan of the lanes' sums (a fixed order).
constexpr int kCumsumWarps = 4;
constexpr int kPerLane = kQ / 32;

__global__ void __launch_bounds__(32 * kCumsumWarps) chunk_cumsum_kernel(Mamba2Params p) {
  const int64_t item = int64_t{blockIdx.x} * kCumsumWarps + threadIdx.x / 32;  // chunk · Hs + head
  if (item >= int64_t{p.num_chunks} * p.heads) return;  // warp-uniform
  const Dims d = dims_of(p);
  const Mamba2Chunk chunk = p.chunks[item / p.heads];
  const int h = static_cast<int>(item % p.heads);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int length = chunk.end - chunk.begin;
  const float A = decay_rate(p, h);
  float dl[kPerLane], a[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = kPerLane * lane + i;
    dl[i] = s < length ? delta_of(p, d, chunk.begin + s, h) : 0.0f;
    a[i] = dl[i] * A;
  }
  float inclusive = a[0];  // the lanes' sums' inclusive scan
#pragma unroll
  for (int i = 1; i < kPerLane; ++i) inclusive += a[i];
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float other = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += other;
  }
  const float previous = __shfl_up_sync(0xffffffffu, inclusive, 1);
  float lambda[kPerLane];
  lambda[0] = (lane == 0 ? 0.0f : previous) + a[0];  // + Σ of the tokens before this lane's
#pragma unroll
  for (int i = 1; i < kPerLane; ++i) lambda[i] = lambda[i - 1] + a[i];
  // Λ of the chunk's last token, from its lane (past the chunk the scan's sums group differently,
  // so not lane 31's).
  float last = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const float v = __shfl_sync(0xffffffffu, lambda[i], (length - 1) / kPerLane);
    if ((length - 1) % kPerLane == i) last = v;
  }
  float* out = p.chunk_cumsum + item * 3 * kQ;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = kPerLane * lane + i;
    const bool token = s < length;
    out[s] = dl[i];
    out[kQ + s] = token ? lambda[i] : 0.0f;
    out[2 * kQ + s] = token ? expf(last - lambda[i]) * dl[i] : 0.0f;
  }
  if (lane == 0) p.chunk_decay[item] = expf(last);
}

// (0b) C·Bᵀ of each chunk and group, once for all the group's heads and P tiles of the chunk scan:
// chunk_cb[t, s] = Σ_n C_t[n]·B_s[n] for s ≤ t < the chunk's length. Grid (chunks, G, the
// kTBlocks·(kTBlocks + 1) / 2 kTile × kTile blocks (t block, s block ≤ t block)); of a diagonal
// block the 8-column tiles wholly above the diagonal are stored as zeros, blocks above the diagonal
// and rows past the chunk are never written (the chunk scan reads s ≤ t < length only). Warp w owns
// rows 16·(w % 4) … and columns 32·(w / 4) … of the block; C and B staged row-major ([t][n],
// [s][n]) by cp.async over N in steps of kNStep, two steps in flight. Where Mamba2Params::bc16 is
// set (16-bit operands for the wgmma chunk kernels) the diagonal blocks, whose C and B rows are the
// same 64 rows, also store those rows' B and C rounded to T there, once for every head.
constexpr int kStepFloats = kTile * kStepStride;  // one [64][36] staging tile

template <typename T>
__global__ void __launch_bounds__(kChunkThreads) chunk_cb_kernel(Mamba2Params p) {
  __shared__ __align__(16) float stages[2][2][kStepFloats];  // [stage][C, B]
  const Dims d = dims_of(p);
  const Mamba2Chunk chunk = p.chunks[blockIdx.x];
  const int g = static_cast<int>(blockIdx.y);
  int tb = 0;  // blockIdx.z = tb·(tb + 1) / 2 + sb
  while ((tb + 1) * (tb + 2) / 2 <= static_cast<int>(blockIdx.z)) ++tb;
  const int sb = static_cast<int>(blockIdx.z) - tb * (tb + 1) / 2;
  const int t0 = tb * kTile, s0 = sb * kTile;
  const int N = p.state;
  const int length = chunk.end - chunk.begin;
  if (t0 >= length) return;  // block-uniform: rows wholly past the chunk
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int wm = 16 * (warp % 4), wn = 32 * (warp / 4);
  // Tiles with an s ≤ the warp's last t (all below the diagonal block).
  const int cb_tiles = sb < tb ? 4 : wn <= wm + 15 ? min(4, (wm + 15 - wn) / 8 + 1) : 0;
  const float* B = p.xbc + int64_t{chunk.begin} * d.conv_dim + d.d_ssm + int64_t{g} * N;
  const float* C = B + int64_t{p.groups} * N;
  const int steps = (N + kNStep - 1) / kNStep;
  const auto stage = [&](int i) {
    const int nb = i * kNStep;
    copy_tile_async<kNStep, kTile>(stages[i % 2][0], kStepStride, C + int64_t{t0} * d.conv_dim + nb, d.conv_dim,
                                   length - t0, N - nb);
    copy_tile_async<kNStep, kTile>(stages[i % 2][1], kStepStride, B + int64_t{s0} * d.conv_dim + nb, d.conv_dim,
                                   length - s0, N - nb);
    mma::cp_async_commit();
  };
  stage(0);
  float cb[4][4] = {};
  for (int i = 0; i < steps; ++i) {
    advance_step(i, steps, stage);
    if constexpr (!std::is_same_v<T, float>) {
      if (p.bc16 != nullptr && sb == tb) {  // block-uniform
        const int nb = i * kNStep;
        const int64_t row16 = 2 * int64_t{p.groups} * N;
        uint16_t* const rows16 = static_cast<uint16_t*>(p.bc16) + int64_t{chunk.begin + t0} * row16 + nb;
        store_rounded_rows<T, kNStep, kTile>(rows16 + int64_t{p.groups + g} * N, row16, stages[i % 2][0], kStepStride,
                                             length - t0, N - nb);
        store_rounded_rows<T, kNStep, kTile>(rows16 + int64_t{g} * N, row16, stages[i % 2][1], kStepStride,
                                             length - t0, N - nb);
      }
    }
    const int ksteps = (min(kNStep, N - i * kNStep) + 7) / 8;
    if (cb_tiles > 0 && t0 + wm < length) {
      warp_mma<T, 4, kStepStride, 1, kStepStride, 1>(cb, stages[i % 2][0] + wm * kStepStride,
                                                      stages[i % 2][1] + wn * kStepStride, ksteps, cb_tiles);
    }
    __syncthreads();  // stage i % 2 is refilled next
  }
  float* out = p.chunk_cb + (int64_t{blockIdx.x} * p.groups + g) * kQ * kQ;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // (e, e + 1): two adjacent columns of one row
      const int t = t0 + wm + frag_row(e);
      const int s = s0 + wn + 8 * j + frag_col(e);
      if (t < length) *reinterpret_cast<float2*>(out + t * kQ + s) = make_float2(cb[j][e], cb[j][e + 1]);
    }
  }
}

// (1) The chunk's own state sum S_c[p, n] = Σ_s (exp(Λ_last − Λ_s)·Δ_s·x_s[p])·B_s[n] for one
// (chunk, head, kTile-row P tile) per block, over all of N: the weighted x tile staged once,
// the B tiles of N streamed through two stages (the next tile in flight during each product). Both
// operands token-major ([s][p], [s][n], zeros past the chunk, P and N), the product on the tensor
// cores: warp w owns rows p0 + 16·(w % 4) … and columns n0 + 32·(w / 4) … of each tile, over the
// chunk's tokens rounded up to 8 (16 for 16-bit operands); its fragments stored as 8-byte pairs
// (whole 32-byte sectors) where N is even.
// Staging by operand type (StateLayout):
//  - float (3xTF32): float32 tiles by cp.async (B tile i + 2 in flight during tile i), the weights
//    applied in shared memory, fragments read element by element;
//  - __half / __nv_bfloat16: tiles of T through registers (TileRegs16: B tile i + 1's loads in
//    flight during tile i's product), x·weight formed in float32 and rounded once as it is staged,
//    B rounded as staged (the values the float32 staging rounded to as its fragments were read);
//    both operands MN-major, fragments by ldmatrix.trans; rows padded to 72 elements (9 16-byte
//    units: ldmatrix conflict-free). Half the shared memory (55.3 KB at kQ 128); the registers
//    keep it at 2 blocks per SM (ChunkConfig).
// The grid is one-dimensional, the P tiles and heads of a chunk consecutive (StateGrid): the blocks
// resident at once share a few chunks' B (every head of a group reads the same B), so B comes from
// DRAM about once and from L2 for the other heads and P tiles. Chunk-major blocks (chunk fastest)
// would have every resident block read a different chunk's B, a working set of all the wave's B
// that the x and state streams evict from L2 before the next head reads it again.
struct StateGrid {
  int heads, p_tiles;
  __host__ __device__ int blocks_per_chunk() const { return heads * p_tiles; }
  __device__ int chunk() const { return static_cast<int>(blockIdx.x) / blocks_per_chunk(); }
  __device__ int head() const { return static_cast<int>(blockIdx.x) % blocks_per_chunk() / p_tiles; }
  __device__ int p_tile() const { return static_cast<int>(blockIdx.x) % p_tiles; }
};
constexpr int kTileFloats = kQ * kColMajor64;  // one [kQ][72] tile
template <typename T>
struct StateLayout {
  static constexpr bool kFloat = std::is_same_v<T, float>;
  static constexpr int kStride = kTile + 8;  // 72: [s][p] and [s][n] tiles of T
  static constexpr int kTileElems = kQ * kStride;
  static constexpr size_t kSmemBytes = kFloat ? sizeof(float) * 3 * kTileFloats : sizeof(T) * 3 * kTileElems;
};
static_assert(odd_units(StateLayout<__half>::kStride), "16-bit tile rows of an odd number of 16-byte units");

// A warp's 16 × 32 block of chunk states (rows row0 …, columns col0 …, four 16×8 fragments) into
// out [P][N], float2 stores where `pairs` (N even, 8-byte aligned); nothing past P or N.
__device__ __forceinline__ void store_state_tile(const float (&acc)[4][4], float* out, int row0, int col0, int P,
                                                 int N, bool pairs) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // (e, e + 1): two adjacent columns of one row
      const int row = row0 + frag_row(e);
      const int n = col0 + 8 * j + frag_col(e);
      if (row >= P || n >= N) continue;
      float* at = out + int64_t{row} * N + n;
      if (pairs) {
        *reinterpret_cast<float2*>(at) = make_float2(acc[j][e], acc[j][e + 1]);
      } else {
        at[0] = acc[j][e];
        if (n + 1 < N) at[1] = acc[j][e + 1];
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kChunkThreads, chunk_config<T>().state_blocks_per_sm)
    chunk_state_kernel(Mamba2Params p) {
  using Layout = StateLayout<T>;
  extern __shared__ __align__(16) float state_smem[];
  float* xs = state_smem;                // x_s[p0 + ·]·weight_s
  float* bs = state_smem + kTileFloats;  // two stages of B_s[n0 + ·]
  __shared__ float weight[kQ];
  const Dims d = dims_of(p);
  const StateGrid grid{p.heads, (p.head_dim + kTile - 1) / kTile};
  const int c = grid.chunk();
  const Mamba2Chunk chunk = p.chunks[c];
  const int h = grid.head();
  const int g = h / d.heads_per_group;
  const int P = p.head_dim, N = p.state;
  const int p0 = grid.p_tile() * kTile;
  const int length = chunk.end - chunk.begin;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t item = int64_t{c} * p.heads + h;
  const float* rows = p.xbc + int64_t{chunk.begin} * d.conv_dim;
  const float* B = rows + d.d_ssm + int64_t{g} * N;
  const int n_tiles = (N + kTile - 1) / kTile;

  if constexpr (Layout::kFloat) {
    // Commit groups: (x, B tile 0), B tile 1, then B tile i + 2 during tile i (empty past N).
    copy_tile_async<kTile, kQ>(xs, kColMajor64, rows + int64_t{h} * P + p0, d.conv_dim, length, P - p0);
    copy_tile_async<kTile, kQ>(bs, kColMajor64, B, d.conv_dim, length, N);
    mma::cp_async_commit();
    if (n_tiles > 1) {
      copy_tile_async<kTile, kQ>(bs + kTileFloats, kColMajor64, B + kTile, d.conv_dim, length, N - kTile);
    }
    mma::cp_async_commit();
    if (tid < kQ) weight[tid] = p.chunk_cumsum[item * 3 * kQ + 2 * kQ + tid];
    mma::cp_async_wait<1>();
    __syncthreads();
    for (int e = tid; e < kQ * kTile; e += kChunkThreads) {
      xs[(e / kTile) * kColMajor64 + e % kTile] *= weight[e / kTile];
    }
    __syncthreads();

    const int warp = tid / 32;
    const int wm = 16 * (warp % 4), wn = 32 * (warp / 4);  // the warp's rows (p) and columns (n) in the tile
    const int ksteps = (length + 7) / 8;
    float* out = p.chunk_states + item * P * N;
    const bool pairs = N % 2 == 0 && (reinterpret_cast<uintptr_t>(p.chunk_states) & 7) == 0;
    for (int i = 0; i < n_tiles; ++i) {
      const int n0 = i * kTile;
      float acc[4][4] = {};
      if (p0 + wm < P && n0 + wn < N) {  // warp-uniform; a warp wholly past P or N stores nothing
        warp_mma<T, 4, 1, kColMajor64, 1, kColMajor64>(acc, xs + wm, bs + (i % 2) * kTileFloats + wn, ksteps);
      }
      __syncthreads();  // stage i % 2 is refilled next
      if (i + 2 < n_tiles) {
        copy_tile_async<kTile, kQ>(bs + (i % 2) * kTileFloats, kColMajor64, B + n0 + 2 * kTile, d.conv_dim, length,
                                   N - n0 - 2 * kTile);
      }
      mma::cp_async_commit();
      store_state_tile(acc, out, p0 + wm, n0 + wn, P, N, pairs);
      mma::cp_async_wait<1>();  // B tile i + 1 landed
      __syncthreads();
    }
  } else {
    T* const xs16 = reinterpret_cast<T*>(state_smem);  // x_s[p0 + ·]·weight_s, then two B stages
    const auto b_stage = [&](int i) { return xs16 + (1 + i % 2) * Layout::kTileElems; };
    TileRegs16<T, kTile, kQ> regs;  // the x tile, then B tile after B tile
    regs.load(rows + int64_t{h} * P + p0, d.conv_dim, length, P - p0);
    if (tid < kQ) weight[tid] = p.chunk_cumsum[item * 3 * kQ + 2 * kQ + tid];
    __syncthreads();  // the weights
    regs.store(xs16, Layout::kStride, [&](int s) { return weight[s]; });
    regs.load(B, d.conv_dim, length, N);
    regs.store(b_stage(0), Layout::kStride);

    const int warp = tid / 32;
    const int wm = 16 * (warp % 4), wn = 32 * (warp / 4);  // the warp's rows (p) and columns (n) in the tile
    const int steps16 = (length + 15) / 16;
    float* out = p.chunk_states + item * P * N;
    const bool pairs = N % 2 == 0 && (reinterpret_cast<uintptr_t>(p.chunk_states) & 7) == 0;
    for (int i = 0; i < n_tiles; ++i) {
      const int n0 = i * kTile;
      if (i + 1 < n_tiles) regs.load(B + n0 + kTile, d.conv_dim, length, N - n0 - kTile);  // during tile i
      __syncthreads();  // stage i % 2 written; stage (i + 1) % 2 read by every warp
      float acc[4][4] = {};
      if (p0 + wm < P && n0 + wn < N) {  // warp-uniform; a warp wholly past P or N stores nothing
        mma::warp_mma_smem16<T, 4, false, false>(acc, xs16 + wm, Layout::kStride, b_stage(i) + wn, Layout::kStride,
                                                 steps16);
      }
      if (i + 1 < n_tiles) regs.store(b_stage(i + 1), Layout::kStride);
      store_state_tile(acc, out, p0 + wm, n0 + wn, P, N, pairs);
    }
  }
}

// (2) State passing. Block = (kPassThreads threads over kRuns·kVec·kPassThreads state elements of
// head blockIdx.y, sequence blockIdx.z), thread = kRuns runs of kVec consecutive elements (run r at
// ((blockIdx.x·kRuns + r)·kPassThreads + thread)·kVec: each run's accesses coalesced over the
// block): H from the saved state (zeros without one), then chunk by chunk: chunk_states[c] ← H (the
// state entering chunk c; rounded to the 16-bit product dtype into chunk_states16 instead where the
// wgmma chunk scan reads it from there), H ← decay_c·H + S_c, stored to the chunk's boundary slot if
// it has one;
// finally to write_slot. The thread reads its elements of the saved state before writing any slot,
// so read_slot may be a slot it writes. Chunks go kBatch at a time: their decays and boundary slots
// staged once per block in shared memory (every thread of the grid needs the same few values: read
// per thread, they would queue on one L2 line), their S_c read by each thread before any is
// overwritten (one wait for memory per batch, not per chunk). kVec = 4 (16-byte accesses of
// chunk_states) where the head's P·N is a multiple of 4 and chunk_states 16-byte aligned, else 1.
// Every thread walks all of its sequence's chunks, so a grid of more blocks than fit at once pays
// a whole second round for its tail: two runs of 4 per thread, 4 chunks per batch (the same 128
// bytes in flight per thread as one run of 8 chunks) fit one Falcon-H1 sequence's 24 heads in one
// wave (384 blocks, ≤ 3 per SM: 396 on 132 SMs).
constexpr int kPassThreads = 256;
constexpr int kPassBlocksPerSm = 3;  // ≤ 85 registers: runs·batch loads in flight per thread

// The state passing's launch configurations.
struct PassConfig {
  int vec;    // consecutive elements per run: 4 (one float4 access) or 1
  int runs;   // runs per thread
  int batch;  // chunks per wait for memory
};
enum class PassAccess { kFloat4, kScalar };  // 16-byte accesses; P·N no multiple of 4, or unaligned
__host__ __device__ constexpr PassConfig pass_config(PassAccess access) {
  PassConfig c{};
  const bool float4_runs = access == PassAccess::kFloat4;
  c.vec = float4_runs ? 4 : 1;
  c.runs = float4_runs ? 2 : 1;
  c.batch = float4_runs ? 4 : 8;
  return c;
}

// TEnter: where the state entering each chunk goes: float, over chunk_states (its own sum, read
// first); __half / __nv_bfloat16, to chunk_states16, rounded (RNE, mma::Mma<TEnter>::pack, as the
// chunk scan rounds the float32 state while staging it): the traffic of the kernel is one float32
// read and one write per element and chunk, so a 2-byte write makes it a quarter smaller (and the
// chunk scan's reads of it half).
template <PassAccess kAccess, typename TEnter>
__global__ void __launch_bounds__(kPassThreads, kPassBlocksPerSm) state_passing_kernel(Mamba2Params p) {
  constexpr PassConfig kConfig = pass_config(kAccess);
  constexpr int kVec = kConfig.vec, kRuns = kConfig.runs, kBatch = kConfig.batch;
  static_assert(kVec == 1 || kVec == 4, "state passing: float or float4 accesses");
  using Vec = std::conditional_t<kVec == 4, float4, float>;
  __shared__ float decay_smem[kBatch];
  __shared__ int32_t slot_smem[kBatch];
  const Mamba2Sequence sequence = p.sequences[blockIdx.z];
  const int h = static_cast<int>(blockIdx.y);
  const int64_t head_size = int64_t{p.head_dim} * p.state;
  const int64_t size = p.heads * head_size;
  constexpr int kRunStride = kPassThreads * kVec;  // elements between a thread's runs
  const int64_t i0 = (int64_t{blockIdx.x} * kRuns * kPassThreads + threadIdx.x) * kVec;  // run 0, within the head
  const int64_t e0 = int64_t{h} * head_size + i0;
  bool active[kRuns];  // kVec divides head_size: all kVec elements of a run or none
  float H[kRuns][kVec];
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {
    active[r] = i0 + r * kRunStride < head_size;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      H[r][v] = active[r] && sequence.read_slot >= 0
                    ? load_element(p.ssm_state.data,
                                   sequence.read_slot * p.ssm_state.slot_size + e0 + r * kRunStride + v,
                                   p.ssm_state.kind)
                    : 0.0f;
    }
  }
  for (int32_t k0 = 0; k0 < sequence.num_chunks; k0 += kBatch) {
    const int32_t count = min(kBatch, sequence.num_chunks - k0);
    const int32_t first = sequence.first_chunk + k0;
    if (threadIdx.x < count) {
      decay_smem[threadIdx.x] = p.chunk_decay[int64_t{first + threadIdx.x} * p.heads + h];
      slot_smem[threadIdx.x] = p.chunks[first + threadIdx.x].boundary_slot;
    }
    float* const states = p.chunk_states + first * size + e0;  // chunk first, run 0
    Vec own[kBatch][kRuns];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        own[j][r] = active[r] && j < count ? *reinterpret_cast<const Vec*>(states + j * size + r * kRunStride) : Vec{};
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (j >= count) break;
      const float decay = decay_smem[j];
      const int32_t slot = slot_smem[j];
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        if (!active[r]) continue;
        const int64_t at = (first + j) * size + e0 + r * kRunStride;  // the run's first element
        float own_j[kVec];
        if constexpr (std::is_same_v<TEnter, float>) {
          if constexpr (kVec == 4) {
            *reinterpret_cast<float4*>(p.chunk_states + at) = make_float4(H[r][0], H[r][1], H[r][2], H[r][3]);
          } else {
            p.chunk_states[at] = H[r][0];
          }
        } else {
          TEnter* const entering = static_cast<TEnter*>(p.chunk_states16) + at;
          if constexpr (kVec == 4) {  // 8-byte aligned: at is a multiple of 4
            *reinterpret_cast<uint2*>(entering) =
                make_uint2(mma::Mma<TEnter>::pack(H[r][0], H[r][1]), mma::Mma<TEnter>::pack(H[r][2], H[r][3]));
          } else {
            const uint32_t packed = mma::Mma<TEnter>::pack(H[r][0], 0.0f);  // the low half: H[r][0]
            *reinterpret_cast<uint16_t*>(entering) = static_cast<uint16_t>(packed & 0xffffu);
          }
        }
        if constexpr (kVec == 4) {
          own_j[0] = own[j][r].x;
          own_j[1] = own[j][r].y;
          own_j[2] = own[j][r].z;
          own_j[3] = own[j][r].w;
        } else {
          own_j[0] = own[j][r];
        }
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          H[r][v] = fmaf(decay, H[r][v], own_j[v]);
          if (slot >= 0) {
            store_element(p.ssm_state.data, slot * p.ssm_state.slot_size + e0 + r * kRunStride + v, p.ssm_state.kind,
                          H[r][v]);
          }
        }
      }
    }
    __syncthreads();  // the staged values are rewritten by the next batch
  }
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {
    if (!active[r]) continue;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      store_element(p.ssm_state.data, sequence.write_slot * p.ssm_state.slot_size + e0 + r * kRunStride + v,
                    p.ssm_state.kind, H[r][v]);
    }
  }
}

// The state passing's launch with accesses kAccess, entering states TEnter.
template <PassAccess kAccess, typename TEnter>
void launch_state_passing(const Mamba2Params& p, cudaStream_t stream) {
  constexpr PassConfig kConfig = pass_config(kAccess);
  const int64_t threads = (int64_t{p.head_dim} * p.state + kConfig.vec - 1) / kConfig.vec;
  constexpr int64_t kPerBlock = int64_t{kPassThreads} * kConfig.runs;
  const dim3 grid(static_cast<unsigned>((threads + kPerBlock - 1) / kPerBlock), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.num_sequences));
  state_passing_kernel<kAccess, TEnter><<<grid, kPassThreads, 0, stream>>>(p);
}

// (3) Outputs of kTile rows t0 … of a chunk for one head and P tile (ScanGrid), every product on
// the tensor cores: warp w owns rows t = t0 + 16·(w % 4) … of the outputs and columns
// p − p0 = 32·(w / 4) ….
//   1. over N in steps of kNStep: off[t, p] = Σ_n C_t[n]·H[p, n], C and H staged row-major ([t][n],
//      [p][n]), two steps in flight;
//   2. M[t, s] = cb[t, s]·exp(Λ_t − Λ_s)·Δ_s for s ≤ t (else 0), cb the chunk's and group's C·Bᵀ
//      (chunk_cb_kernel), → shared [t − t0][s]; the x tile of s < t0 + kTile → shared [s][p] (over
//      the staging space);
//   3. diag[t, p] = Σ_s M[t, s]·x_s[p] over s < t0 + 16·(w % 4) + 16 (M is lower triangular);
//   4. y = diag + exp(Λ_t)·off + D·x_t (8-byte pairs where y is float32 and even-aligned).
// Staged values past the chunk, P or N are zeros. The t tiles and heads of a chunk are consecutive
// in the grid (ScanGrid): the t tiles of a head share its H and x tiles, the heads of a group the
// chunk's C and C·Bᵀ, each read from DRAM about once per P tile, then from L2. Chunk-fastest
// blocks would have every resident block read a different chunk's C and C·Bᵀ, evicted by the x,
// state and output streams long before the next head reads them again: at Falcon-H1's sizes
// 192 of the 448 KB a (chunk, head) moves, from DRAM once per head and P tile.
// Staging by operand type (ScanLayout):
//  - float (3xTF32): float32 tiles by cp.async, fragments read element by element (the strides
//    above: conflict-free);
//  - __half / __nv_bfloat16: tiles of T, each element rounded once as it is staged (C, H, x as
//    loaded, M as formed: the values the float32 staging rounded to as its fragments were read),
//    half the shared memory and traffic; C, H, x through registers (TileRegs16: step i + 1's loads
//    in flight during step i's product), fragments by ldmatrix (C, H, M: K-major) and
//    ldmatrix.trans (x: [s][p], MN-major). Rows padded by 8 elements (16 bytes: strides of 40, kQ + 8
//    and 72 elements, 5, 17 (9 for kQ 64) and 9 16-byte units), so the 8 rows an ldmatrix matrix
//    reads fall in 8 distinct bank groups: conflict-free. No global load sits on the block's critical
//    path outside the staging: the tile's C·Bᵀ rows (s ≤ t < length only) are copied as float32 by
//    cp.async at the block's start, in flight during step 1, and step 2 reads them from shared
//    memory (no L2 latency between its exps); D·x_t's x rows
//    (float32: the staged x is rounded) are copied by cp.async over the consumed C·Bᵀ rows during
//    step 3's product, and the epilogue reads them from shared memory (68 KB at kQ 128: still 3
//    blocks per SM).
template <typename T>
struct ScanLayout {
  static constexpr bool kFloat = std::is_same_v<T, float>;
  // N per step of step 1. 16-bit: 32, not 64 (half the barriers, but 32 registers of loads in
  // flight spill at the 80-register bound).
  static constexpr int kStepN = kNStep;
  static constexpr int kStep = kStepN + 8;  // 40: [t][n] and [p][n] stage tiles of T
  static constexpr int kM = kQ + 8;         // 72 or 136: M [t − t0][s] of T
  static constexpr int kX = kTile + 8;      // 72: x [s][p − p0] of T
  static constexpr int kStageElems = kTile * kStep;
  static constexpr size_t kTileBytes = sizeof(T) * std::max(2 * 2 * kStageElems, kTile * kM + kQ * kX);
  // 16-bit operands: float32 C·Bᵀ rows [t − t0][s] past the T tiles (cp.async, in flight over step 1).
  static constexpr int kCbStride = kQ + 4;  // floats: 16-byte rows; a warp reads one row's pairs
  // Then over them the float32 x_t [t − t0][p − p0] of the outputs (D·x_t).
  static constexpr int kXOutStride = kTile + 8;  // floats, ≡ 8 (mod 32): the epilogue's reads conflict-free
  static constexpr size_t kCbOffset = (kTileBytes + 15) / 16 * 16;
  static constexpr size_t kSmemBytes =
      kFloat ? sizeof(float) * std::max(2 * 2 * kStepFloats, kTile * kRowMajorQ + kQ * kColMajor64)
             : kCbOffset + sizeof(float) * kTile * kCbStride;
  static_assert(kStepN % 16 == 0 && kXOutStride <= kCbStride, "whole 16s of N; the x_t rows fit over C·Bᵀ's");
};
static_assert(odd_units(ScanLayout<__half>::kStep) && odd_units(ScanLayout<__half>::kM) &&
                  odd_units(ScanLayout<__half>::kX),
              "16-bit tile rows of an odd number of 16-byte units");

// The chunk scan's grid: blockIdx.x = (chunk · heads + head) · kTBlocks + t tile, blockIdx.y = P
// tile (a P tile's blocks all run before the next one's: C and C·Bᵀ come from DRAM once per P tile,
// twice at P 128, instead of once per head and P tile). Quotients of the unsigned index, and the
// P tile straight from blockIdx.y: values the compiler knows nonnegative or can read again, which
// keeps the 80-register bound of 3 blocks per SM free of spills.
struct ScanGrid {
  int heads;
  __host__ __device__ int blocks_per_chunk() const { return heads * kTBlocks; }
  __device__ int chunk() const { return static_cast<int>(blockIdx.x / static_cast<unsigned>(blocks_per_chunk())); }
  __device__ int head() const { return static_cast<int>(blockIdx.x / kTBlocks % static_cast<unsigned>(heads)); }
  __device__ int t_tile() const { return static_cast<int>(blockIdx.x % kTBlocks); }
  __device__ int p_tile() const { return static_cast<int>(blockIdx.y); }
};

template <typename T>
__global__ void __launch_bounds__(kChunkThreads, chunk_config<T>().scan_blocks_per_sm)
    chunk_scan_kernel(Mamba2Params p) {
  using Layout = ScanLayout<T>;
  __shared__ float delta[kQ], lambda[kQ];
  // Step 1: two stages of (C, H) tiles; steps 2–4: M and the x tile over them.
  extern __shared__ __align__(16) float scan_smem[];
  float* mt = scan_smem;                       // M [t − t0][s]
  float* xs = scan_smem + kTile * kRowMajorQ;  // x [s][p − p0]

  const Dims d = dims_of(p);
  const int P = p.head_dim, N = p.state;
  const ScanGrid grid{p.heads};
  const int c = grid.chunk();
  const int t0 = grid.t_tile() * kTile;
  const Mamba2Chunk chunk = p.chunks[c];
  const int length = chunk.end - chunk.begin;
  if (t0 >= length) return;  // block-uniform: rows wholly past the chunk
  const int h = grid.head();
  const int g = h / d.heads_per_group;
  const int p0 = grid.p_tile() * kTile;
  const int tid = static_cast<int>(threadIdx.x);
  // A block's thread index is nonnegative: its quotients (warp, rows of the staging loops) are
  // then shifts, with no sign fix-ups kept in registers (at the 80-register bound of 3 blocks per
  // SM they spilled).
  __builtin_assume(tid >= 0 && tid < kChunkThreads);
  const int warp = tid / 32;
  const int wm = 16 * (warp % 4), wn = 32 * (warp / 4);
  // Warp-uniform: a warp wholly past the chunk or P stores nothing.
  const bool live = t0 + wm < length && p0 + wn < P;
  const int64_t item = int64_t{c} * p.heads + h;
  const float* H = p.chunk_states + item * P * N;                   // the state entering the chunk
  const float* rows = p.xbc + int64_t{chunk.begin} * d.conv_dim;  // the chunk's conv rows
  const float* C = rows + int64_t{t0} * d.conv_dim + d.d_ssm + (int64_t{p.groups} + g) * N;
  const int steps = (N + Layout::kStepN - 1) / Layout::kStepN;

  float off[4][4] = {};
  float diag[4][4] = {};
  if constexpr (Layout::kFloat) {
    // The C and H tiles of N step i into stage i % 2, one commit group.
    const auto stage = [&](int i) {
      float* ct = scan_smem + (i % 2) * 2 * kStepFloats;
      const int nb = i * kNStep;
      copy_tile_async<kNStep, kTile>(ct, kStepStride, C + nb, d.conv_dim, length - t0, N - nb);
      copy_tile_async<kNStep, kTile>(ct + kStepFloats, kStepStride, H + int64_t{p0} * N + nb, N, P - p0, N - nb);
      mma::cp_async_commit();
    };
    stage(0);
    if (tid < kQ) {
      delta[tid] = p.chunk_cumsum[item * 3 * kQ + tid];
      lambda[tid] = p.chunk_cumsum[item * 3 * kQ + kQ + tid];
    }

    for (int i = 0; i < steps; ++i) {
      advance_step(i, steps, stage);
      const float* ct = scan_smem + (i % 2) * 2 * kStepFloats;
      const int ksteps = (min(kNStep, N - i * kNStep) + 7) / 8;
      if (live) {
        warp_mma<T, 4, kStepStride, 1, kStepStride, 1>(off, ct + wm * kStepStride,
                                                        ct + kStepFloats + wn * kStepStride, ksteps);
      }
      __syncthreads();  // stage i % 2 is refilled next
    }

    // The x tile (cp.async over the consumed stages) while M is formed.
    const int s_end = t0 + kTile;  // s < s_end: the columns of M step 3 reads
    copy_tile_async<kTile, kQ>(xs, kColMajor64, rows + int64_t{h} * P + p0, d.conv_dim, min(length, s_end), P - p0);
    mma::cp_async_commit();
    const float* cb = p.chunk_cb + (int64_t{c} * p.groups + g) * kQ * kQ;
    for (int e = tid; e < kTile * kQ; e += kChunkThreads) {
      const int t = t0 + e / kQ, s = e % kQ;
      if (s >= s_end) continue;
      mt[(t - t0) * kRowMajorQ + s] =
          s <= t && t < length ? cb[t * kQ + s] * expf(lambda[t] - lambda[s]) * delta[s] : 0.0f;
    }
    mma::cp_async_wait<0>();
    __syncthreads();

    if (live) {
      warp_mma<T, 4, kRowMajorQ, 1, 1, kColMajor64>(diag, mt + wm * kRowMajorQ, xs + wn, (t0 + wm + 16) / 8);
    }
  } else {
    T* const tiles = reinterpret_cast<T*>(scan_smem);
    float* const cbs = scan_smem + Layout::kCbOffset / sizeof(float);  // C·Bᵀ [t − t0][s], float32
    const int s_end = t0 + kTile;  // s < s_end: the columns of M step 3 reads
        // The tile's C·Bᵀ values (rows t < length, quads of s ≤ t: s < s_end) by cp.async, one commit
    // group in flight over step 1; the rest of the rows is never read.
    copy_cb_rows_async<kTile, kChunkThreads>(cbs, Layout::kCbStride, p, c, g, t0, length, tid);
    const auto c_tile = [&](int i) { return tiles + (i % 2) * 2 * Layout::kStageElems; };  // [t][n], then [p][n]
    TileRegs16<T, Layout::kStepN, kTile> c_regs, h_regs;
    const auto load = [&](int i) {
      const int nb = i * Layout::kStepN;
      c_regs.load(C + nb, d.conv_dim, length - t0, N - nb);
      h_regs.load(H + int64_t{p0} * N + nb, N, P - p0, N - nb);
    };
    const auto store = [&](int i) {
      c_regs.store(c_tile(i), Layout::kStep);
      h_regs.store(c_tile(i) + Layout::kStageElems, Layout::kStep);
    };
    load(0);
    if (tid < kQ) {
      delta[tid] = p.chunk_cumsum[item * 3 * kQ + tid];
      lambda[tid] = p.chunk_cumsum[item * 3 * kQ + kQ + tid];
    }
    store(0);
    for (int i = 0; i < steps; ++i) {
      if (i + 1 < steps) load(i + 1);  // in flight during step i's product
      __syncthreads();                 // stage i % 2 written; stage (i + 1) % 2 read by every warp
      if (live) {
        const int steps16 = (min(Layout::kStepN, N - i * Layout::kStepN) + 15) / 16;
        mma::warp_mma_smem16<T, 4, true, true>(off, c_tile(i) + wm * Layout::kStep, Layout::kStep,
                                               c_tile(i) + Layout::kStageElems + wn * Layout::kStep, Layout::kStep,
                                               steps16);
      }
      if (i + 1 < steps) store(i + 1);
    }

    T* const mt16 = tiles;                       // M [t − t0][s]
    T* const xs16 = tiles + kTile * Layout::kM;  // x [s][p − p0]
    // The x tile in 64-row blocks, block b's loads in flight while rows part b of M are formed
    // (half the registers of the whole tile in flight); rows s ≥ s_end are never read.
    const float* x_rows = rows + int64_t{h} * P + p0;
    constexpr int kMRows = kTile / kTBlocks;  // rows of M per x block
    TileRegs16<T, kTile, kTile> x_regs;
    mma::cp_async_wait<0>();
    __syncthreads();  // every warp's last step-1 product has read the stages M and x overwrite; C·Bᵀ staged
    for (int b = 0; b < kTBlocks; ++b) {
      const int sb = b * kTile;
      if (sb < s_end) x_regs.load(x_rows + int64_t{sb} * d.conv_dim, d.conv_dim, min(length, s_end) - sb, P - p0);
      for (int e = tid; e < kMRows * kQ / 2; e += kChunkThreads) {  // pairs (s, s + 1) of one row
        const int t = t0 + b * kMRows + e / (kQ / 2), s = 2 * (e % (kQ / 2));
        if (s >= s_end) continue;
        const float* cb_row = cbs + (t - t0) * Layout::kCbStride;
        float m[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          m[k] = s + k <= t && t < length ? cb_row[s + k] * expf(lambda[t] - lambda[s + k]) * delta[s + k] : 0.0f;
        }
        *reinterpret_cast<uint32_t*>(mt16 + (t - t0) * Layout::kM + s) = mma::Mma<T>::pack(m[0], m[1]);
      }
      if (sb < s_end) x_regs.store(xs16 + sb * Layout::kX, Layout::kX);
    }
    __syncthreads();  // M and x staged; every thread's C·Bᵀ reads done
    // The outputs' x_t in float32 (the staged x is rounded) over the C·Bᵀ rows by cp.async, in
    // flight during the product.
    copy_tile_async<kTile, kTile>(cbs, Layout::kXOutStride, x_rows + int64_t{t0} * d.conv_dim, d.conv_dim,
                                  length - t0, P - p0);
    mma::cp_async_commit();

    if (live) {
      mma::warp_mma_smem16<T, 4, true, false>(diag, mt16 + wm * Layout::kM, Layout::kM, xs16 + wn, Layout::kX,
                                              (t0 + wm + 16) / 16);
    }
    mma::cp_async_wait<0>();
    __syncthreads();
  }

  const float Dh = load_element(p.D.data, h, p.D.kind);
  const bool pairs = p.y.kind == ElementKind::kFloat32 && p.y.row_stride % 2 == 0 && P % 2 == 0 &&
                     (reinterpret_cast<uintptr_t>(p.y.data) & 7) == 0;
#pragma unroll
  for (int e = 0; e < 4; e += 2) {  // (e, e + 1): two adjacent columns of one row
    const int t = t0 + wm + frag_row(e);
    if (t >= length) continue;
    const float carry_decay = expf(lambda[t]);
    const int64_t y_row = (chunk.begin + t) * p.y.row_stride + int64_t{h} * P + p0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = wn + 8 * j + frag_col(e);
      if (p0 + col >= P) continue;
      float value[2];
      float2 x16 = make_float2(0.0f, 0.0f);  // 16-bit operands: x_t of both columns (zeros past P)
      if constexpr (!Layout::kFloat) {
        x16 = *reinterpret_cast<const float2*>(scan_smem + Layout::kCbOffset / sizeof(float) +
                                               (t - t0) * Layout::kXOutStride + col);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        float x;
        if constexpr (Layout::kFloat) {
          x = xs[t * kColMajor64 + col + k];
        } else {
          x = k == 0 ? x16.x : x16.y;
        }
        value[k] = fmaf(Dh, x, fmaf(carry_decay, off[j][e + k], diag[j][e + k]));
      }
      if (pairs) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.y.data) + y_row + col) = make_float2(value[0], value[1]);
      } else {
        store_element(p.y.data, y_row + col, p.y.kind, value[0]);
        if (p0 + col + 1 < P) store_element(p.y.data, y_row + col + 1, p.y.kind, value[1]);
      }
    }
  }
}

// --- the gated RMSNorm --------------------------------------------------------------------------------
// Block = (group, row). Two passes over the group's channels: Σ v² (each thread a strided partial
// sum in order, then a fixed shuffle/shared tree), then the normalised, scaled values.
constexpr int kNormThreads = 256;

__device__ __forceinline__ float gated(const Mamba2NormParams& p, int64_t t, int64_t i) {
  const float z = p.z[t * p.z_stride + i] + weight_or(p.z_bias, i, 0.0f);
  return p.y[t * p.d_ssm + i] * silu(z);
}

__global__ void __launch_bounds__(kNormThreads, 1) gated_norm_kernel(Mamba2NormParams p) {
  __shared__ float partial[kNormThreads / 32];
  __shared__ float inv_rms;
  const int64_t group_size = p.d_ssm / p.groups;
  const int64_t first = int64_t{blockIdx.x} * group_size;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    if (p.flags[t] != kRowActive) continue;  // uniform over the block
    if (p.rms_norm == 0) {  // Falcon-H1's use_rms_norm = False: the gate alone (uniform over the grid)
      for (int64_t i = threadIdx.x; i < group_size; i += kNormThreads) p.out[t * p.d_ssm + first + i] = gated(p, t, first + i);
      continue;
    }
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < group_size; i += kNormThreads) {
      const float v = gated(p, t, first + i);
      sum = fmaf(v, v, sum);
    }
    sum = group_sum<32>(sum);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
      inv_rms = 1.0f / sqrtf(total / static_cast<float>(group_size) + p.eps);
    }
    __syncthreads();
    const float scale = inv_rms;
    for (int64_t i = threadIdx.x; i < group_size; i += kNormThreads) {
      const int64_t c = first + i;
      p.out[t * p.d_ssm + c] = gated(p, t, c) * scale * load_element(p.norm_weight.data, c, p.norm_weight.kind);
    }
    __syncthreads();  // partial and inv_rms are rewritten by the next row
  }
}

// Rows per thread of the decode update: 4, or 8 where one access covers a lane's part of a row of
// 16-bit states (kAccesses 1 of 16-bit elements: the same 128 bytes in flight per thread as float32
// rows of 2 accesses, and twice the rows per block for the block's fixed costs).
template <typename T, int kAccesses>
inline constexpr int kDecodeRowsOf = sizeof(T) == 2 && kAccesses == 1 ? 8 : 4;

// The decode update's launch: kLanes lanes × kAccesses accesses per lane cover a state row.
template <typename T, int kLanes, int kAccesses, int kRows = kDecodeRowsOf<T, kAccesses>>
void launch_decode(const Mamba2Params& p, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kDecodeThreads / kLanes * kRows;
  const dim3 grid(static_cast<unsigned>(p.heads), static_cast<unsigned>(p.wave.num_requests),
                  static_cast<unsigned>((p.head_dim + kRowsPerBlock - 1) / kRowsPerBlock));
  launch_pdl(decode_kernel<T, kLanes, kAccesses, kRows>, grid, dim3(kDecodeThreads), 0, stream, p);
}

// The fewest lanes (a power of two, ≤ 32) that cover N with ≤ 2 accesses each.
template <typename T>
void launch_decode_of(const Mamba2Params& p, cudaStream_t stream) {
  constexpr int kVec = kPoolRun<T>;
  const int accesses = (p.state + kVec - 1) / kVec;  // ≤ 64 (state_size ≤ kMamba2MaxState)
  if (accesses <= 1) launch_decode<T, 1, 1>(p, stream);
  else if (accesses <= 2) launch_decode<T, 2, 1>(p, stream);
  else if (accesses <= 4) launch_decode<T, 4, 1>(p, stream);
  else if (accesses <= 8) launch_decode<T, 8, 1>(p, stream);
  else if (accesses <= 16) launch_decode<T, 16, 1>(p, stream);
  else if (accesses <= 32) launch_decode<T, 32, 1>(p, stream);
  else if constexpr (kVec * 32 < kMamba2MaxState) launch_decode<T, 32, 2>(p, stream);  // float32, N > 128
}

// The chunk kernels with product operands T, around the state passing (which stays float32).
template <typename T>
void launch_chunk_kernels(const Mamba2Params& p, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {  // TileRegs16's element path indexes rows in int
    const int64_t conv_dim = int64_t{p.heads} * p.head_dim + 2 * int64_t{p.groups} * p.state;
    if (std::max<int64_t>(conv_dim, p.state) * kQ >= (int64_t{1} << 31)) {
      throw Error(detail::concat("mamba2 prefill: 16-bit operands with conv rows of ", conv_dim,
                                 " floats (at most 2^31 / ", kQ, ")"));
    }
    if (p.chunk_wgmma != 0 && !mamba2_wgmma_built()) {
      throw Error("mamba2 prefill: chunk_wgmma set, but this build has no sm_90a code (mamba2_wgmma_built)");
    }
    if (p.chunk_wgmma != 0 && p.bc16 == nullptr) {
      throw Error("mamba2 prefill: chunk_wgmma set with 16-bit operands, but bc16 (the rounded B and C rows) is null");
    }
  }
  const unsigned chunks = static_cast<unsigned>(p.num_chunks);
  const unsigned p_tiles = static_cast<unsigned>((p.head_dim + kTile - 1) / kTile);
  chunk_cb_kernel<T><<<dim3(chunks, static_cast<unsigned>(p.groups), kTBlocks * (kTBlocks + 1) / 2), kChunkThreads, 0,
                       stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
#if defined(HYBRIDTB_MAMBA2_WGMMA)
  if constexpr (!std::is_same_v<T, float>) {  // the states and their passing in one kernel
    if (mamba2_fused_state_pass(p)) {
      launch_mamba2_state_pass_wgmma(p, stream);
      launch_mamba2_chunk_scan_wgmma(p, stream);
      return;
    }
  }
#endif
  if (p.chunk_states == nullptr) {
    throw Error("mamba2 prefill: chunk_states is null, but the chunk states and the state passing run apart here");
  }
  bool states_launched = false;
#if defined(HYBRIDTB_MAMBA2_WGMMA)
  if constexpr (!std::is_same_v<T, float>) {
    if (p.chunk_wgmma != 0) {  // decided by the caller once per device: no query here
      launch_mamba2_chunk_state_wgmma(p, stream);
      states_launched = true;
    }
  }
#endif
  if (!states_launched) {
    constexpr size_t kStateSmem = StateLayout<T>::kSmemBytes;
    allow_dynamic_smem(chunk_state_kernel<T>, kStateSmem);
    const StateGrid state_grid{p.heads, static_cast<int>(p_tiles)};
    chunk_state_kernel<T><<<chunks * static_cast<unsigned>(state_grid.blocks_per_chunk()), kChunkThreads,
                            kStateSmem, stream>>>(p);
    HYBRIDTB_CUDA_CHECK_LAUNCH();
  }
  const bool float4_runs = int64_t{p.head_dim} * p.state % 4 == 0 && aligned16(p.chunk_states);
  bool passed = false;
  if constexpr (!std::is_same_v<T, float>) {
    // 16-bit entering states for the wgmma chunk scan (their 8-byte runs aligned where
    // chunk_states16 is 8-byte aligned).
    if (p.chunk_states16 != nullptr && p.chunk_wgmma != 0) {
      if (float4_runs && (reinterpret_cast<uintptr_t>(p.chunk_states16) & 7) == 0) {
        launch_state_passing<PassAccess::kFloat4, T>(p, stream);
      } else {
        launch_state_passing<PassAccess::kScalar, T>(p, stream);
      }
      passed = true;
    }
  }
  if (!passed) {
    if (float4_runs) {
      launch_state_passing<PassAccess::kFloat4, float>(p, stream);
    } else {
      launch_state_passing<PassAccess::kScalar, float>(p, stream);
    }
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
#if defined(HYBRIDTB_MAMBA2_WGMMA)
  if constexpr (!std::is_same_v<T, float>) {
    if (p.chunk_wgmma != 0) {  // decided by the caller once per device: no query here
      launch_mamba2_chunk_scan_wgmma(p, stream);
      return;
    }
  }
#endif
  constexpr size_t kScanSmem = ScanLayout<T>::kSmemBytes;
  allow_dynamic_smem(chunk_scan_kernel<T>, kScanSmem);
  const ScanGrid scan_grid{p.heads};
  chunk_scan_kernel<T><<<dim3(chunks * static_cast<unsigned>(scan_grid.blocks_per_chunk()), p_tiles), kChunkThreads,
                         kScanSmem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool mamba2_wgmma_built() {
#if defined(HYBRIDTB_MAMBA2_WGMMA)
  return true;
#else
  return false;
#endif
}

bool mamba2_fused_state_pass(const Mamba2Params& p) {
  const auto aligned = [](const void* at, uintptr_t bytes) {
    return (reinterpret_cast<uintptr_t>(at) & (bytes - 1)) == 0;
  };
  const bool sixteen_bit = p.product_operands == ElementKind::kFloat16 || p.product_operands == ElementKind::kBFloat16;
  const bool pool_pairs = aligned(p.ssm_state.data, 8) && p.ssm_state.slot_size % 2 == 0;
  const int64_t conv_dim = int64_t{p.heads} * p.head_dim + 2 * int64_t{p.groups} * p.state;
  const bool x_vectors = p.head_dim % 4 == 0 && conv_dim % 4 == 0 && aligned(p.xbc, 16);
  return p.fuse_state_passing != 0 && p.chunk_wgmma != 0 && sixteen_bit && mamba2_wgmma_built() &&
         p.chunk_states16 != nullptr && p.bc16 != nullptr && p.state % 8 == 0 && aligned(p.bc16, 16) &&
         aligned(p.chunk_states16, 4) && pool_pairs && x_vectors;
}

void launch_mamba2_decode(const Mamba2Params& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0) return;
  switch (p.ssm_state.kind) {
    case ElementKind::kFloat32: launch_decode_of<float>(p, stream); break;
    case ElementKind::kFloat16: launch_decode_of<__half>(p, stream); break;
    default: launch_decode_of<__nv_bfloat16>(p, stream); break;
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_mamba2_prefill(const Mamba2Params& p, cudaStream_t stream) {
  if (p.num_chunks == 0) return;
  const int64_t items = int64_t{p.num_chunks} * p.heads;
  chunk_cumsum_kernel<<<static_cast<unsigned>((items + kCumsumWarps - 1) / kCumsumWarps), 32 * kCumsumWarps, 0,
                        stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  switch (p.product_operands) {
    case ElementKind::kFloat32: launch_chunk_kernels<float>(p, stream); break;
    case ElementKind::kFloat16: launch_chunk_kernels<__half>(p, stream); break;
    case ElementKind::kBFloat16: launch_chunk_kernels<__nv_bfloat16>(p, stream); break;
    default:
      throw Error(detail::concat("mamba2 prefill: product operands of kind ", static_cast<int>(p.product_operands),
                                 " (float32, float16 or bfloat16 only)"));
  }
}

void launch_mamba2_gated_norm(const Mamba2NormParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.d_ssm == 0) return;
  const dim3 grid(static_cast<unsigned>(p.groups), static_cast<unsigned>(std::min<int64_t>(p.num_tokens, 65535)));
  gated_norm_kernel<<<grid, kNormThreads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
