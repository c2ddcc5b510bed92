// The chunk states of the mamba2 prefill (mamba2_kernels.cu's chunk_state_kernel: its math, buffers
// and numerics) with 16-bit product operands on Hopper's warpgroup MMAs. Compiled for sm_90a only
// (optimized/CMakeLists.txt); mamba2_kernels.cu launches it where Mamba2Params::chunk_wgmma is set
// (compute capability 9.0 devices, unless BackendSettings::ssm_prefill_wgmma asks for mma.sync).
//
// S_c[p, n] = Σ_s (exp(Λ_last − Λ_s)·Δ_s·x_s[p])·B_s[n]: per (chunk, head) a GEMM [P × chunk]·[chunk × N]
// with the weights folded into the x operand. Block = (chunk, head, kPTile = 128 rows p0 … of P: the
// whole of Falcon-H1's P, so that B is staged once per chunk and head), one-dimensional grid with
// the P tiles and heads of a chunk consecutive (the resident blocks share a few chunks' B: one DRAM
// read of B, L2 for the other heads). Two warpgroups; warpgroup w owns rows 64·w … 64·w + 63 of the
// tile (warp w·4 + r: rows 16·r …; the wgmma accumulator is the mma.sync m16n8 C fragment tiled
// along the 64 columns, wgmma.cuh).
//   1. The weighted x tile x_s[p]·weight_s [s][p] (all kQ tokens × 128 p), formed in float32 and
//      rounded to T once as it is staged through registers (all of the tile's 16-byte loads in
//      flight at once, 64 registers per thread), into shared memory (MN-major: two 64-column slabs
//      of the 128-byte swizzle layout), once for the block.
//   2. Over N in tiles of kNTile = 64 (one 128-byte swizzle row of 16-bit elements): B [s][n]
//      as T (rounded once for every head by the C·Bᵀ kernel: Mamba2Params::bc16), MN-major, a
//      stage per tile: where its rows are whole 16-byte vectors (N a multiple of 8) every tile is
//      copied by cp.async at the block's start, in flight over step 1, and one barrier serves all
//      tiles; otherwise staged through registers, the next tile's loads in flight over this tile's
//      MMAs, one block barrier per tile. Per
//      warpgroup and tile kQ / 16 wgmma m64n64k16 with both operands MN-major from shared memory
//      (A = its 64-row slab of the weighted x, by the transposed descriptor), then its 64 × 64
//      float32 states stored straight from the accumulators (8-byte pairs: whole 32-byte sectors).
// The values rounded to 16 bits are the mma.sync kernel's (x·weight formed in float32, then B,
// RNE), the accumulation is float32 over the chunk's tokens in a fixed order (one accumulator chain
// per tile; the order within one MMA instruction is the hardware's): bitwise reproducible run to
// run. The mma.sync kernel stops its k steps at the chunk's length rounded up to 16; this one
// always runs all kQ / 16 (a compile-time count), over staged zeros past the chunk: the sums are
// the same but for the order inside the MMA instructions (the 16-bit-operand row of the tolerance
// table bounds both). Staged values past the chunk, P or N are zeros (partial tiles and odd sizes
// cost padded work only; 4-byte element loads where rows are not whole aligned 16-byte vectors).
// This kernel reads x once and writes the float32 states (twice x's bytes) once, both far more
// than L2 holds at long prefills: x's loads and the states' stores are evict-first (__ldcs,
// __stcs), so that L2 keeps the B of the chunks in flight, which every head of the group reads.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/wgmma.cuh"
#include "ssm/mamba2_state_wgmma.h"
#include "ssm/mamba2_wgmma_tiles.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kQ = kMamba2ChunkTokens;  // tokens per chunk: the product's k extent

// The launch configuration and the shared layout (bytes; every tile starts at a 1024-byte boundary:
// the swizzle atoms).
struct StateWgmmaLayout {
  static constexpr int kThreads = 256;    // two warpgroups
  static constexpr int kBlocksPerSm = 2;  // 97 KB of shared memory, ≤ 128 registers (at 3, 80: spills)
  static constexpr int kPTile = 128;      // P rows per block (64 per warpgroup)
  static constexpr int kNTile = 64;       // N columns per step: one 128-byte swizzle row
  static constexpr int kStages = kMamba2MaxState / 64;  // B's stages: the whole of N (≤ 256), 64 columns each
  static constexpr int kXPartRows = 64;   // tokens of the weighted x per SwizzleRegs (all in flight at once)
  static constexpr int kXSlabBytes = kQ * 128;      // 64 columns p of the weighted x [s][p]: A's leading offset
  static constexpr int kXBytes = kQ * kPTile * 2;   // the weighted x tile
  static constexpr int kBBytes = kQ * kNTile * 2;   // one B stage [s][n]
  static constexpr int kBOffset = kXBytes;
  static constexpr size_t kSmemBytes = size_t{kXBytes} + kStages * kBBytes + 1024;  // + the base's alignment
  static_assert(kQ % 16 == 0 && kQ % kXPartRows == 0 && kPTile == 128 && kNTile == 64, "the warpgroup tiles below");
};
using L = StateWgmmaLayout;

// The one-dimensional grid: block = chunk · heads · p_tiles + head · p_tiles + P tile.
struct StateWgmmaGrid {
  int heads, p_tiles;
  __host__ __device__ int blocks_per_chunk() const { return heads * p_tiles; }
  __device__ int chunk() const { return static_cast<int>(blockIdx.x) / blocks_per_chunk(); }
  __device__ int head() const { return static_cast<int>(blockIdx.x) % blocks_per_chunk() / p_tiles; }
  __device__ int p_tile() const { return static_cast<int>(blockIdx.x) % p_tiles; }
};

template <typename T>
__global__ void __launch_bounds__(L::kThreads, L::kBlocksPerSm) chunk_state_wgmma_kernel(Mamba2Params p) {
  using Mmas = wgmma::WgmmaN64<T>;
  __shared__ float weight[kQ];
  extern __shared__ __align__(1024) uint8_t state_raw[];
  uint8_t* const smem = state_raw + ((1024u - (mma::shared_address(state_raw) & 1023u)) & 1023u);
  const uint32_t smem_addr = mma::shared_address(smem);

  const int64_t d_ssm = int64_t{p.heads} * p.head_dim;
  const int64_t conv_dim = d_ssm + 2 * int64_t{p.groups} * p.state;
  const int P = p.head_dim, N = p.state;
  const StateWgmmaGrid grid{p.heads, (P + L::kPTile - 1) / L::kPTile};
  const int c = grid.chunk();
  const int h = grid.head();
  const int p0 = grid.p_tile() * L::kPTile;
  const int g = h / (p.heads / p.groups);
  const Mamba2Chunk chunk = p.chunks[c];
  const int length = chunk.end - chunk.begin;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  // The warpgroup: rows 64·wg … of the tile. Broadcast from lane 0, the compiler knows it
  // warp-uniform and forms the descriptors that derive from it in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int wm = 16 * (warp % 4);   // the warp's rows of the accumulators
  const int lane = tid % 32;
  const int64_t item = int64_t{c} * p.heads + h;
  const float* rows = p.xbc + int64_t{chunk.begin} * conv_dim;  // the chunk's conv rows
  // B rounded once by the C·Bᵀ kernel (Mamba2Params::bc16: rows of B then C, 2·G·N apart).
  const int64_t bc_row = 2 * int64_t{p.groups} * N;
  const uint16_t* B = static_cast<const uint16_t*>(p.bc16) + int64_t{chunk.begin} * bc_row + int64_t{g} * N;

  // B [s][n] of 16-bit whole, aligned vectors (N a multiple of 8): every tile of N copied by
  // cp.async into its own stage first, in flight over step 1; otherwise staged through registers
  // tile by tile in step 2 (odd N).
  SwizzleRegs<T, uint16_t, L::kNTile, kQ, L::kThreads> b_regs;
  const auto b_src = [&](int i) { return SrcTile<uint16_t>{B + i * L::kNTile, bc_row, length, N - i * L::kNTile}; };
  const auto b_stage = [&](int i) { return smem + L::kBOffset + (i % L::kStages) * L::kBBytes; };
  const int n_tiles = (N + L::kNTile - 1) / L::kNTile;
  static_assert(L::kStages * L::kNTile >= kMamba2MaxState, "a stage for every tile of N");
  const bool copied = b_src(0).whole_vectors();  // block-uniform
  if (copied) {
    for (int i = 0; i < n_tiles; ++i) {
      copy_swizzled_async<L::kNTile, kQ, L::kThreads>(mma::shared_address(b_stage(i)), b_src(i));
    }
    mma::cp_async_commit();
  }

  // 1. The weighted x tile, once: every part's loads issued, then the weights, then the stores.
  {
    constexpr int kXParts = kQ / L::kXPartRows;
    SwizzleRegs<T, float, L::kPTile, L::kXPartRows, L::kThreads, LoadCache::kStreaming> x_regs[kXParts];
    const float* x = rows + int64_t{h} * P + p0;
#pragma unroll
    for (int k = 0; k < kXParts; ++k) {
      const int s0 = k * L::kXPartRows;
      x_regs[k].load(SrcTile<float>{x + int64_t{s0} * conv_dim, conv_dim, length - s0, P - p0});
    }
    if (tid < kQ) weight[tid] = p.chunk_cumsum[item * 3 * kQ + 2 * kQ + tid];  // 0 past the chunk
    __syncthreads();  // the weights
#pragma unroll
    for (int k = 0; k < kXParts; ++k) {
      x_regs[k].template store<kQ>(smem, k * L::kXPartRows, [&](int s) { return weight[s]; });
    }
  }

  // 2. Over N, tile by tile.
  if (copied) {
    mma::cp_async_wait<0>();
  } else {
    b_regs.load(b_src(0));
    b_regs.store(b_stage(0));
  }
  float* const out = p.chunk_states + item * P * N;
  const bool pairs = N % 2 == 0 && (reinterpret_cast<uintptr_t>(p.chunk_states) & 7) == 0;
  const uint64_t x_desc = wgmma::sw128_desc(smem_addr + static_cast<uint32_t>(wg * L::kXSlabBytes), L::kXSlabBytes, 1024);
  for (int i = 0; i < n_tiles; ++i) {
    if (!copied && i + 1 < n_tiles) b_regs.load(b_src(i + 1));  // in flight during tile i's MMAs
    if (!copied || i == 0) {  // copied: every tile has its own stage, landed before the loop
      wgmma::fence_proxy_async();
      __syncthreads();  // tile i (and x) staged; every warpgroup's MMAs of tile i − 1 done
    }
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    // Every warpgroup runs its MMAs, also one wholly past P (zeros; P ≤ 64 only): no wgmma on a
    // divergent path, which the compiler would serialize.
    const uint64_t b_desc = wgmma::sw128_desc(mma::shared_address(b_stage(i)), L::kBBytes, 1024);
    wgmma::pin(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {  // k step kk: tokens 16·kk … (16 rows of 128 bytes)
      const uint32_t k_rows = static_cast<uint32_t>(kk * 16 * 128);
      Mmas::mn_mn(acc, wgmma::sw128_desc_advance(x_desc, k_rows), wgmma::sw128_desc_advance(b_desc, k_rows), true);
    }
    wgmma::commit();
    if (!copied && i + 1 < n_tiles) b_regs.store(b_stage(i + 1));
    wgmma::wait<0>();
    wgmma::pin(acc);
    // The warp's rows p0 + 64·wg + wm + (lane / 4, + 8), columns n0 + 8·j + 2·(lane % 4) ….
    const int n0 = i * L::kNTile;
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // (e, e + 1): two adjacent columns of one row
      const int row = p0 + 64 * wg + wm + lane / 4 + (e == 0 ? 0 : 8);
      if (row >= P) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int n = n0 + 8 * j + 2 * (lane % 4);
        if (n >= N) continue;
        float* at = out + int64_t{row} * N + n;
        if (pairs) {
          __stcs(reinterpret_cast<float2*>(at), make_float2(acc[j][e], acc[j][e + 1]));
        } else {
          __stcs(at, acc[j][e]);
          if (n + 1 < N) __stcs(at + 1, acc[j][e + 1]);
        }
      }
    }
  }
}

// --- The chunk states and the state passing in one kernel ---------------------------------------
// Where the scan reads 16-bit entering states (chunk_states16), the float32 state sums S_c need
// not leave the SM: block = (sequence, head, P tile of 128 rows, N tile of 64 columns), walking the
// sequence's chunks in order with the state H of its 128 × 64 elements in float32 registers (the
// accumulators' layout). Per chunk c: S_c by the same MMAs as chunk_state_wgmma_kernel on the same
// staged operands (bitwise its sums), the entering state H rounded into chunk_states16 while they
// run, then H = fmaf(decay_c, H, S_c) and the boundary slot, as state_passing_kernel (bitwise its
// states). The float32 sums' write and read (two-thirds of the bytes of the two kernels apart) go;
// x is read by the N tiles of a head together (adjacent blocks: L2 serves the later ones), B by
// every head from L2. x is copied two chunks ahead by cp.async into float32 stages (each thread
// weighs and rounds the vectors it copied, into the 128-byte swizzle layout), B one chunk ahead
// into the other stage, the weights two chunks ahead into a ring of three: all in flight over
// this chunk's MMAs; the weighted x is double-buffered, so one block barrier per chunk orders
// every reuse. Each thread reads its
// elements of the saved state before it writes any slot (read_slot may be a slot it writes).
struct PassWgmmaLayout {
  static constexpr int kThreads = 256;    // two warpgroups: rows 64·w … of the P tile
  static constexpr int kPTile = 128;
  static constexpr int kNTile = 64;       // one 128-byte swizzle row of 16-bit elements
  static constexpr int kRawBytes = kQ * kPTile * 4;  // a chunk's float32 x [s][p] as copied
  static constexpr int kXSlabBytes = kQ * 128;       // 64 columns p of the weighted x [s][p]
  static constexpr int kXBytes = kQ * kPTile * 2;    // the weighted x tile of one chunk
  static constexpr int kBBytes = kQ * kNTile * 2;    // B [s][n] of one chunk
  // Two float32 x stages, two weighted x buffers, two B stages (226.5 KiB with the weights: one
  // block per SM).
  static constexpr int kXOffset = 2 * kRawBytes;
  static constexpr int kBOffset = kXOffset + 2 * kXBytes;
  static constexpr int kWeightStages = 3;
  static constexpr size_t kSmemBytes = size_t{kBOffset} + 2 * kBBytes + 1024;  // + the base's alignment
  static constexpr int kXVecs = kQ * kPTile / 4 / kThreads;  // a thread's 16-byte vectors of x
};

// A thread's elements of a state in the accumulators' layout, H[jn][e] at row row0 (+ 8 for e ≥ 2),
// column col0 + 8·jn (+ 1 for odd e), between a [P][N] head state of elements E at `head` and
// registers: pairs of columns (N even, head 8-byte aligned), rounded to E (RNE) on the way out.
template <typename E>
__device__ __forceinline__ void load_state_pairs(const void* head, int P, int N, int row0, int col0, float (&H)[8][4]) {
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const int row = row0 + (e == 0 ? 0 : 8);
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
      const int n = col0 + 8 * jn;
      float2 v = make_float2(0.0f, 0.0f);
      if (row < P && n < N) {
        const E* const at = static_cast<const E*>(head) + int64_t{row} * N + n;
        if constexpr (std::is_same_v<E, float>) {
          v = *reinterpret_cast<const float2*>(at);
        } else {
          v = make_float2(static_cast<float>(at[0]), static_cast<float>(at[1]));
        }
      }
      H[jn][e] = v.x;
      H[jn][e + 1] = v.y;
    }
  }
}
// A 16-bit E is packed for all pairs before the first store, so that no pack waits for an earlier
// store to release its register.
template <typename E>
__device__ __forceinline__ void store_state_pairs(void* head, int P, int N, int row0, int col0,
                                                  const float (&H)[8][4]) {
  [[maybe_unused]] uint32_t packed[2][8];
  if constexpr (!std::is_same_v<E, float>) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) packed[e / 2][jn] = mma::Mma<E>::pack(H[jn][e], H[jn][e + 1]);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const int row = row0 + (e == 0 ? 0 : 8);
    if (row >= P) continue;
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
      const int n = col0 + 8 * jn;
      if (n >= N) continue;
      E* const at = static_cast<E*>(head) + int64_t{row} * N + n;
      if constexpr (std::is_same_v<E, float>) {
        *reinterpret_cast<float2*>(at) = make_float2(H[jn][e], H[jn][e + 1]);
      } else {
        *reinterpret_cast<uint32_t*>(at) = packed[e / 2][jn];
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(PassWgmmaLayout::kThreads, 1) chunk_state_pass_wgmma_kernel(Mamba2Params p) {
  using Mmas = wgmma::WgmmaN64<T>;
  using W = PassWgmmaLayout;
  __shared__ float weight[W::kWeightStages][kQ];
  extern __shared__ __align__(1024) uint8_t pass_raw[];
  uint8_t* const smem = pass_raw + ((1024u - (mma::shared_address(pass_raw) & 1023u)) & 1023u);
  const uint32_t smem_addr = mma::shared_address(smem);

  const int64_t d_ssm = int64_t{p.heads} * p.head_dim;
  const int64_t conv_dim = d_ssm + 2 * int64_t{p.groups} * p.state;
  const int64_t bc_row = 2 * int64_t{p.groups} * p.state;
  const int P = p.head_dim, N = p.state;
  const int n_tiles = (N + W::kNTile - 1) / W::kNTile;
  const int p0 = static_cast<int>(blockIdx.x) / n_tiles * W::kPTile;
  const int n0 = static_cast<int>(blockIdx.x) % n_tiles * W::kNTile;
  const int h = static_cast<int>(blockIdx.y);
  const int g = h / (p.heads / p.groups);
  const Mamba2Sequence sequence = p.sequences[blockIdx.z];
  const int first = sequence.first_chunk, num_chunks = sequence.num_chunks;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);  // warp-uniform: descriptors in uniform registers
  const int wm = 16 * (warp % 4);

  // Chunk c's x rows [s][p] by cp.async, whole 16-byte vectors (mamba2_fused_state_pass), zeros past
  // the chunk and P; vector e = tid + kThreads·k at row e / 32, columns 4·(e % 32) …: the thread
  // converts the vectors it copied, so its own wait makes them visible to it.
  const auto copy_x = [&](const Mamba2Chunk& c, int j) {
    const float* const from = p.xbc + int64_t{c.begin} * conv_dim + int64_t{h} * P + p0;
    const int rows = c.end - c.begin, cols = P - p0;
    const uint32_t raw = smem_addr + static_cast<uint32_t>((j % 2) * W::kRawBytes);
#pragma unroll
    for (int k = 0; k < W::kXVecs; ++k) {
      const int e = tid + W::kThreads * k, i = e / 32, col = 4 * (e % 32);
      const bool ok = i < rows && col < cols;
      mma::cp_async_16(raw + static_cast<uint32_t>((i * W::kPTile + col) * 4), ok ? from + i * conv_dim + col : from,
                       ok);
    }
  };
  // Chunk j's copied x weighted (its weights' stage), rounded to T, into its weighted x buffer: the
  // shared loads of kWeighBatch vectors and their weights first, then their products and stores,
  // so that a batch's loads are in flight together rather than each product waiting for its own.
  constexpr int kWeighBatch = 4;
  static_assert(W::kXVecs % kWeighBatch == 0);
  const auto weigh_x = [&](int j) {
    const float* const raw = reinterpret_cast<const float*>(smem + (j % 2) * W::kRawBytes);
    uint8_t* const to = smem + W::kXOffset + (j % 2) * W::kXBytes;
#pragma unroll
    for (int k0 = 0; k0 < W::kXVecs; k0 += kWeighBatch) {
      float4 v[kWeighBatch];
      float w[kWeighBatch];
#pragma unroll
      for (int b = 0; b < kWeighBatch; ++b) {
        const int e = tid + W::kThreads * (k0 + b), i = e / 32, col = 4 * (e % 32);
        v[b] = *reinterpret_cast<const float4*>(raw + i * W::kPTile + col);
        w[b] = weight[j % W::kWeightStages][i];
      }
#pragma unroll
      for (int b = 0; b < kWeighBatch; ++b) {
        const int e = tid + W::kThreads * (k0 + b), i = e / 32, col = 4 * (e % 32);
        *reinterpret_cast<uint2*>(to + wgmma::sw128_offset<kQ>(i, col / 8) + (col % 8) * 2) = make_uint2(
            mma::Mma<T>::pack(v[b].x * w[b], v[b].y * w[b]), mma::Mma<T>::pack(v[b].z * w[b], v[b].w * w[b]));
      }
    }
  };
  const auto b_src = [&](const Mamba2Chunk& c) {
    return SrcTile<uint16_t>{static_cast<const uint16_t*>(p.bc16) + int64_t{c.begin} * bc_row + int64_t{g} * N + n0,
                             bc_row, c.end - c.begin, N - n0};
  };
  const auto x_buffer = [&](int j) { return smem + W::kXOffset + (j % 2) * W::kXBytes; };
  const auto b_stage = [&](int j) { return smem_addr + static_cast<uint32_t>(W::kBOffset + (j % 2) * W::kBBytes); };
  // Chunk j's weights: fetch_weight reads this thread's (tid < kQ; zero past the chunks) from global
  // memory, store_weight puts it into the chunk's stage. The loop fetches a chunk's weight an
  // iteration before it stores it, so that no store waits for its load's latency.
  const auto fetch_weight = [&](int j) {
    return tid < kQ && j < num_chunks ? p.chunk_cumsum[(int64_t{first + j} * p.heads + h) * 3 * kQ + 2 * kQ + tid]
                                      : 0.0f;
  };
  const auto store_weight = [&](int j, float w) {
    if (tid < kQ) weight[j % W::kWeightStages][tid] = w;
  };

  // The thread's elements: rows row0 (+ 8), columns col0 + 8·jn (+ 1): the accumulators' layout.
  const int row0 = p0 + 64 * wg + wm + lane / 4, col0 = n0 + 2 * (lane % 4);
  const int64_t head_base = int64_t{h} * P * N;  // head h's [P][N] state within a slot
  const PoolRef& pool = p.ssm_state;
  const auto pool_head = [&](int32_t slot) {
    return static_cast<uint8_t*>(pool.data) + (slot * pool.slot_size + head_base) * element_bytes(pool.kind);
  };
  float H[8][4] = {};
  if (sequence.read_slot >= 0) {
    const void* const from = pool_head(sequence.read_slot);
    switch (pool.kind) {
      case ElementKind::kFloat32: load_state_pairs<float>(from, P, N, row0, col0, H); break;
      case ElementKind::kFloat16: load_state_pairs<__half>(from, P, N, row0, col0, H); break;
      default: load_state_pairs<__nv_bfloat16>(from, P, N, row0, col0, H); break;
    }
  }
  const auto store_state = [&](int32_t slot) {
    void* const to = pool_head(slot);
    switch (pool.kind) {
      case ElementKind::kFloat32: store_state_pairs<float>(to, P, N, row0, col0, H); break;
      case ElementKind::kFloat16: store_state_pairs<__half>(to, P, N, row0, col0, H); break;
      default: store_state_pairs<__nv_bfloat16>(to, P, N, row0, col0, H); break;
    }
  };

  // The prologue of the loop's prefetch: chunk 0's B, the x of chunks 0 and 1, the weights of
  // chunks 0 and 1 (copy groups in the order B 0, x 0, x 1; then per chunk j, B j + 1 and x j + 2,
  // so that waiting for all but the newest group leaves only the next chunk's x in flight). The
  // chunk list is read a chunk ahead of the copies that need it.
  const auto chunk_at = [&](int j) { return j < num_chunks ? p.chunks[first + j] : Mamba2Chunk{}; };
  Mamba2Chunk chunk = chunk_at(0), next = chunk_at(1), after = chunk_at(2);
  if (num_chunks > 0) copy_swizzled_async<W::kNTile, kQ, W::kThreads>(b_stage(0), b_src(chunk));
  mma::cp_async_commit();
  if (num_chunks > 0) copy_x(chunk, 0);
  mma::cp_async_commit();
  if (num_chunks > 1) copy_x(next, 1);
  mma::cp_async_commit();
  float decay = num_chunks > 0 ? p.chunk_decay[int64_t{first} * p.heads + h] : 0.0f;
  store_weight(0, fetch_weight(0));
  store_weight(1, fetch_weight(1));
  float weight_ahead = fetch_weight(2);  // chunk j + 2's, stored in iteration j
  __syncthreads();  // the weights

  T* const entering = static_cast<T*>(p.chunk_states16);
  for (int j = 0; j < num_chunks; ++j) {
    const int ci = first + j;
    // Chunk j's x and B landed; its weighted x into its buffer.
    mma::cp_async_wait<1>();
    weigh_x(j);
    wgmma::fence_proxy_async();
    __syncthreads();  // chunk j staged; every warpgroup past chunk j − 1 (its buffers free)
    // Chunk j + 1's B and chunk j + 2's x (into chunk j's stage, converted above): in flight over
    // chunk j's MMAs and the next chunk's (chunk j + 2's weights are stored under the MMAs).
    if (j + 1 < num_chunks) copy_swizzled_async<W::kNTile, kQ, W::kThreads>(b_stage(j + 1), b_src(next));
    mma::cp_async_commit();
    if (j + 2 < num_chunks) copy_x(after, j + 2);
    mma::cp_async_commit();
    const float next_decay = j + 1 < num_chunks ? p.chunk_decay[int64_t{ci + 1} * p.heads + h] : 0.0f;
    const Mamba2Chunk after_next = chunk_at(j + 3);

    // S_c: the chunk states' MMAs (chunk_state_wgmma_kernel's, operand for operand).
    float acc[8][4];
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) acc[jn][0] = acc[jn][1] = acc[jn][2] = acc[jn][3] = 0.0f;
    const uint64_t x_desc =
        wgmma::sw128_desc(mma::shared_address(x_buffer(j)) + static_cast<uint32_t>(wg * W::kXSlabBytes),
                          W::kXSlabBytes, 1024);
    const uint64_t b_desc = wgmma::sw128_desc(b_stage(j), W::kBBytes, 1024);
    wgmma::pin(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      const uint32_t k_rows = static_cast<uint32_t>(kk * 16 * 128);
      Mmas::mn_mn(acc, wgmma::sw128_desc_advance(x_desc, k_rows), wgmma::sw128_desc_advance(b_desc, k_rows), true);
    }
    wgmma::commit();
    store_weight(j + 2, weight_ahead);  // chunk j − 1's stage: every thread is past weigh_x(j − 1)
    weight_ahead = fetch_weight(j + 3);
    // The state entering chunk c, rounded as the state passing rounds it.
    store_state_pairs<T>(entering + int64_t{ci} * p.heads * P * N + head_base, P, N, row0, col0, H);
    wgmma::wait<0>();
    wgmma::pin(acc);
    // H_{c+1} = exp(Λ_last)·H_c + S_c (state_passing_kernel's fmaf), to the chunk's boundary slot.
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
      for (int e = 0; e < 4; ++e) H[jn][e] = fmaf(decay, H[jn][e], acc[jn][e]);
    }
    if (chunk.boundary_slot >= 0) store_state(chunk.boundary_slot);  // the same for the whole block
    chunk = next;
    next = after;
    after = after_next;
    decay = next_decay;
  }
  store_state(sequence.write_slot);
}

template <typename T>
void launch_typed(const Mamba2Params& p, cudaStream_t stream) {
  allow_dynamic_smem(chunk_state_wgmma_kernel<T>, L::kSmemBytes);
  const StateWgmmaGrid grid{p.heads, (p.head_dim + L::kPTile - 1) / L::kPTile};
  const unsigned blocks = static_cast<unsigned>(p.num_chunks) * static_cast<unsigned>(grid.blocks_per_chunk());
  chunk_state_wgmma_kernel<T><<<blocks, L::kThreads, L::kSmemBytes, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_state_pass_typed(const Mamba2Params& p, cudaStream_t stream) {
  using W = PassWgmmaLayout;
  allow_dynamic_smem(chunk_state_pass_wgmma_kernel<T>, W::kSmemBytes);
  const int tiles = (p.head_dim + W::kPTile - 1) / W::kPTile * ((p.state + W::kNTile - 1) / W::kNTile);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.num_sequences));
  chunk_state_pass_wgmma_kernel<T><<<grid, W::kThreads, W::kSmemBytes, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_mamba2_state_pass_wgmma(const Mamba2Params& p, cudaStream_t stream) {
  if (p.product_operands == ElementKind::kFloat16) {
    launch_state_pass_typed<__half>(p, stream);
  } else {
    launch_state_pass_typed<__nv_bfloat16>(p, stream);
  }
}

void launch_mamba2_chunk_state_wgmma(const Mamba2Params& p, cudaStream_t stream) {
  if (p.product_operands == ElementKind::kFloat16) {
    launch_typed<__half>(p, stream);
  } else {
    launch_typed<__nv_bfloat16>(p, stream);
  }
}

}  // namespace hybridtb::cuda::ssm
