// mamba1 on the GPU: the selective scan of prefills (gating fused), the launcher of the wave's
// decodes (whose single-step update is mamba1_decode.cu's) and the out_proj bias epilogue
// (ssm_kernels.h); the causal conv1d (+ SiLU) in front of them is the shared front end
// (causal_conv.h). The math is reference/ssm/mamba1.cpp's, in float32:
//   Δ = softplus(dt + dt_bias) (threshold 20),
//   h = exp(Δ·A)·h + Δ·c·B,  A = −exp(A_log),  y = (h·C + D·c)·silu(z).
//
// Layout: the activations are dense float32 token rows — dt and c [T, I], z the second half of
// in_proj's [T, 2I] rows, B and C the last 2N columns of x_proj's [T, R + 2N] rows, y [T, I] — and
// the state pool holds [I, N] per slot. A prefill block owns a tile of channels of one request and
// walks its tokens in chunks that TMA (or per-thread cp.async where TMA cannot map the tensors)
// copies ahead into a ring of shared-memory stages: the chunk's dt, c, z rows of the tile and its B/C
// rows, shared by every channel of the block.
//
// The scan is bound by the on-chip pipes, not by DRAM: every token·channel·state costs an ex2
// (exp(Δ·A) as ex2.approx of Δ·A·log2 e, as vLLM) and a few FMAs, and the inputs it reads per token
// are small. Two cores, chosen per state size by the table above launch_mamba1_scan:
//   - the sequential scan (scan_seq_kernel, N = 16 with TMA: Mamba-1): each lane walks the request's
//     tokens one by one for 1 or 2 states of one channel — no time segments, no join or rescan, no
//     block barrier in the chunk loop; y's shares are summed over the channel's lanes by shuffles;
//   - the tile scan (scan_tile_kernel, every other case): time segments of a chunk scanned in
//     parallel by the block's warps from zero, joined through shared memory and rescanned from
//     their carry-in, 4 states per lane.
// Both specialise their chunk loops at compile time (block-boundary states or not; for the tile
// scan also TMA, 16-byte or 4-byte copies) so that the loop carries no branch for the other cases.
// Fixed orders, no atomics: bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "ssm/mamba1_common.cuh"
#include "ssm/pool_quads.cuh"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm::mamba1 {
namespace {

// Whether the scan's rows move in 16-byte pieces: dt, c, z rows of whole quads of channels, B/C rows
// of whole quads of states, every tensor 16-byte aligned.
__host__ __device__ __forceinline__ bool rows_in_quads(const Mamba1Params& p) {
  return (p.I % 4) == 0 && aligned16(p.dt) && aligned16(p.c) && aligned16(p.xz) && (p.N % 4) == 0 &&
         (p.R % 4) == 0 && aligned16(p.dbc);
}

// The scan's TMA maps of dt, c, z (in_proj's second half) and B/C (x_proj's last 2N columns), each
// boxed as one chunk's rows of the block's tile; valid: every map encoded (otherwise cp.async copies).
struct ScanMaps {
  CUtensorMap dt, c, z, bc;
  bool valid = false;
};

// The four maps, boxed as box_rows tokens × box_cols channels (dt, c, z: `raw_swizzle`) and box_rows
// tokens × 2N (B/C); false where TMA cannot map one of them.
bool encode_scan_maps(const Mamba1Params& p, int box_rows, int box_cols, CUtensorMapSwizzle raw_swizzle,
                      ScanMaps* maps) {
  const int64_t I = p.I;
  return tma::encode_tile_map(&maps->dt, p.dt, p.num_tokens, I, I, box_rows, box_cols, raw_swizzle) &&
         tma::encode_tile_map(&maps->c, p.c, p.num_tokens, I, I, box_rows, box_cols, raw_swizzle) &&
         tma::encode_tile_map(&maps->z, p.xz + I, p.num_tokens, I, 2 * I, box_rows, box_cols, raw_swizzle) &&
         tma::encode_tile_map(&maps->bc, p.dbc + p.R, p.num_tokens, 2 * p.N, p.R + 2 * p.N, box_rows, 2 * p.N);
}

// The tile scan (prefills, channel tiles): block = kSegs time segments × (kCh channels × kLanes
// lanes), kCh the fewest channels that fill whole warps (32 / kLanes, at least 4: 8 channels of 4
// lanes for 16 states), all sizes compile-time constants so that no index needs a run-time
// division; the block walks its request in chunks of kL = kSegs·kSeg tokens, carrying the state
// across chunks. Memory: every chunk's dt, c, z rows of the channel tile (kCh·4 contiguous bytes per
// token row and tensor) and its B/C rows move to shared memory as four TMA boxes, issued by one
// thread and awaited on the stage's mbarrier (where the rows are 16-byte aligned and B/C fill whole
// quads, N = 4·kLanes: the shared layout is then the global one), or else in 16-byte cp.async
// copies (4-byte ones where sizes or alignment forbid), kStages chunks in flight ahead of the one
// being scanned;
// one pass over the chunk (all threads, element = channel × token) turns them into Δ =
// softplus(dt + bias), Δ·c, D·c and the gate silu(z + bias) once per token and channel, one chunk
// ahead of the scan (computed right after the local scan of the current chunk, branch-free, so
// that its ex2 / rcp chains overlap the scan's). Scan (thread = segment × channel × lane of 4
// states): a local scan of the segment's kSeg tokens from zero keeps every a = exp(Δ·A) and
// u = Δ·c·B in registers (one ex2 per token·channel·state) and yields (Π a = 2^(A·log2 e·ΣΔ),
// h_local); segment w composes the chunk's carry-in with the pairs of segments < w (in order) and
// rescans from it (two FMAs per state and token: h = a·h + u, y += h·C), writing y (reduce-scatter
// over the channel's lanes: each lane ends with whole sums of kSeg / kLanes tokens, + D·c, × gate)
// and the block-boundary states; the last segment's final h is the chunk's carry-out (tokens past
// the request's end have Δ = 0 and B = 0: a = 1, no input, the state passes unchanged), so after
// the last chunk it is the final state. Every copy loop has a compile-time trip count. Two barriers
// per chunk, fixed orders, no atomics.
template <class Cfg>
struct TileScan {
  static constexpr int kLanes = Cfg::lanes_per_channel;
  static constexpr int kSegs = Cfg::segments;
  static constexpr int kSeg = Cfg::segment_tokens;
  static constexpr int kStages = Cfg::stages;
  static constexpr int kMinBlocks = Cfg::min_blocks_per_sm;
  static constexpr bool kKeepU = Cfg::inputs_in_registers;
  static_assert(kSegs >= 2 && kStages >= 3 && (kLanes & (kLanes - 1)) == 0, "tile scan shape");
  static constexpr int kCh = 32 / kLanes > 4 ? 32 / kLanes : 4;  // channels per block (whole warps per segment)
  static constexpr int kGroup = kCh * kLanes;  // threads of one segment
  static constexpr int kThreads = kSegs * kGroup;
  static constexpr int kL = kSegs * kSeg;    // tokens per chunk
  static constexpr int kRow = 8 * kLanes;    // B/C floats per token in shared memory: B quads, then C quads
  // Shared memory: raw rows [kStages][3][kL·kCh] float, B/C rows [kStages][kL·kRow] float, segment
  // pairs [kSegs−1][kGroup] float4 ×2, carries [2][kGroup] float4, prepared values [2 buffers][kL·kCh]
  // float2 ×2 (Δ, Δ·c and D·c, gate), the stages' copy barriers [kStages] uint64 (TMA), boundary
  // slots [kStages][kL] int32.
  static constexpr size_t kSmemBytes = (2 * (kSegs - 1) + 2) * size_t{kGroup} * sizeof(float4) +
                                       size_t{4} * kL * kCh * sizeof(float2) +
                                       size_t{kStages} * 3 * kL * kCh * sizeof(float) +
                                       size_t{kStages} * kL * kRow * sizeof(float) + size_t{kStages} * sizeof(uint64_t) +
                                       size_t{kStages} * kL * sizeof(int32_t);
};

// Reduce-scatter of kM values over the kO·2 lanes of a channel (xor partners o = kO, kO/2, …, 1):
// at each level a lane keeps the half of its values selected by bit o of its lane g and adds the
// partner's copy of that half; once one value is left, both partners add (commutative: the same
// bits). Lane g ends with the whole sums of values [g·kM/kLanes, (g+1)·kM/kLanes) (kM ≥ kLanes),
// or of value g / (kLanes/kM) (kM < kLanes), plus bias[j] on its j-th sum: added to the kept half
// before the last exchange, so that the bias's shared-memory read overlaps the shuffles. Fixed
// order: reproducible.
// Where a channel's lanes are not adjacent (the sequential scan's runs, SeqScan::run): g's bits
// below kRun are the lane's, the higher ones are kHiStride times further apart.
template <int kO, int kM, int kRun = 32, int kHiStride = 1>
__device__ __forceinline__ void reduce_scatter(float* v, int g, const float* bias) {
  constexpr int kPartner = kO < kRun ? kO : kO * kHiStride;  // lane xor for g's bit kO
  if constexpr (kO >= 1) {
    if constexpr (kM >= 2) {
      constexpr int kHalf = kM / 2;
      const bool upper = (g & kO) != 0;
#pragma unroll
      for (int j = 0; j < kHalf; ++j) {
        const float send = upper ? v[j] : v[j + kHalf];
        float keep = upper ? v[j + kHalf] : v[j];
        if constexpr (kO == 1) keep += bias[j];
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kPartner);
      }
      reduce_scatter<kO / 2, kHalf, kRun, kHiStride>(v, g, bias);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kPartner);
      if constexpr (kO == 1) v[0] += bias[0];
      reduce_scatter<kO / 2, 1, kRun, kHiStride>(v, g, bias);
    }
  }
}

// The rescan of one segment from its carry-in h: y partial sums per token (this lane's states) into
// acc and, with kBoundaries, the block-boundary states. The inputs u = Δ·c·B come from the local
// scan's registers (kKeepU) or are recomputed from shared memory (Δ·c of channel d, B), which costs
// a multiply per state and token but 4·kSeg fewer registers.
template <int kLanes, int kSeg, int kCh, bool kKeepU, bool kBoundaries, int kU>
__device__ __forceinline__ void tile_rescan(float (&h)[4], float (&acc)[kSeg], const float (&a)[kSeg][4],
                                            const float (&u)[kU][4], const float2* ddc, int d, const float* bc,
                                            const int32_t* slots, int base, int n0, bool store, const PoolRef& pool,
                                            int64_t e, int valid, bool vec) {
  constexpr int kRow = 8 * kLanes;
#pragma unroll
  for (int k = 0; k < kSeg; ++k) {
    const int tk = base + k;
    const float4 C = *reinterpret_cast<const float4*>(bc + tk * kRow + 4 * kLanes + n0);
    const float Cv[4] = {C.x, C.y, C.z, C.w};
    float uk[4];
    if constexpr (kKeepU) {
#pragma unroll
      for (int s = 0; s < 4; ++s) uk[s] = u[k][s];
    } else {
      const float dc = ddc[tk * kCh + d].y;
      const float4 B = *reinterpret_cast<const float4*>(bc + tk * kRow + n0);
      uk[0] = dc * B.x, uk[1] = dc * B.y, uk[2] = dc * B.z, uk[3] = dc * B.w;
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      h[s] = fmaf(a[k][s], h[s], uk[s]);
      sum = fmaf(h[s], Cv[s], sum);
    }
    acc[k] = sum;
    if constexpr (kBoundaries) {
      const int32_t slot = slots[tk];
      if (store && slot >= 0) store_quad(pool, slot * pool.slot_size + e, valid, vec, h);
    }
  }
}

// The tile scan of request r (the kernel below picks kVec: 16-byte copies of every row, and
// kBoundaries: r has block-boundary states to write, so that the chunk loop carries no branch or
// index arithmetic for the other cases).
template <class Cfg, bool kVec, bool kBoundaries, bool kTma>
__device__ __forceinline__ void tile_scan(const Mamba1Params& p, const ScanMaps& maps, const GpuRequest& r) {
  using S = TileScan<Cfg>;
  constexpr int kLanes = S::kLanes;
  constexpr int kSegs = S::kSegs;
  constexpr int kSeg = S::kSeg;
  constexpr int kStages = S::kStages;
  constexpr bool kKeepU = S::kKeepU;
  constexpr int kL = S::kL;
  constexpr int kRow = S::kRow;
  constexpr int kCh = S::kCh;
  constexpr int kGroup = S::kGroup;
  constexpr int kThreads = S::kThreads;
  constexpr int kPrepStep = kThreads / (kCh / 2);  // token rows per pass of the block (channel pairs)
  constexpr uint32_t kTmaBytes = (3 * kL * kCh + kL * kRow) * sizeof(float);  // one stage's boxes
  const int tid = static_cast<int>(threadIdx.x);
  const int seg = tid / kGroup;
  const int tcl = tid % kGroup;
  const int d = tcl / kLanes;
  const int g = tcl % kLanes;
  const int ch0 = static_cast<int>(blockIdx.x) * kCh;
  const int64_t I = p.I;
  const int N = p.N;
  // The scan thread: channel i, states n0 … n0+3.
  const int i = ch0 + d;
  const bool active = i < p.I;
  const int ic = active ? i : p.I - 1;
  const int n0 = 4 * g;
  const int valid = max(0, min(4, N - n0));
  const bool vec = quad_vector_ok(p.ssm_state, N);
  const int64_t e = int64_t{ic} * N + n0;
  const int64_t dbc_stride = p.R + 2 * N;

  // The copy destinations first (each stage's dt, c, z and B/C boxes 128-byte aligned for TMA).
  extern __shared__ __align__(128) float4 dynamic_smem[];
  float* raw_smem = reinterpret_cast<float*>(dynamic_smem);              // [kStages][3][kL·kCh] dt, c, z
  float* bc_smem = raw_smem + kStages * 3 * kL * kCh;                     // [kStages][kL·kRow]
  float4* pair_decay = reinterpret_cast<float4*>(bc_smem + kStages * kL * kRow);  // [kSegs−1][kGroup]
  float4* pair_local = pair_decay + (kSegs - 1) * kGroup;                // [kSegs−1][kGroup]
  float4* carry_smem = pair_local + (kSegs - 1) * kGroup;                // [2][kGroup]
  float2* ddc_smem = reinterpret_cast<float2*>(carry_smem + 2 * kGroup);  // [2][kL·kCh] (Δ, Δ·c)
  float2* dg_smem = ddc_smem + 2 * kL * kCh;                              // [2][kL·kCh] (D·c, gate)
  uint64_t* copied = reinterpret_cast<uint64_t*>(dg_smem + 2 * kL * kCh);  // [kStages] mbarriers (kTma)
  int32_t* slot_smem = reinterpret_cast<int32_t*>(copied + kStages);     // [kStages][kL]
  if constexpr (kTma) {
    static_assert(kVec && (kL * kCh) % 32 == 0 && (kL * kRow) % 32 == 0, "TMA boxes of whole 128-byte lines");
    if (tid == 0) {
      for (int q = 0; q < kStages; ++q) tma::mbarrier_init(&copied[q], 1);
      tma::fence_barrier_init();
    }
    __syncthreads();
  }

  float A2[4];  // A·log2 e
#pragma unroll
  for (int s = 0; s < 4; ++s) A2[s] = s < valid ? -expf(load_element(p.A_log.data, e + s, p.A_log.kind)) * kLog2e : 0.0f;
  float carry[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active && valid > 0 && r.read_slot >= 0) {
    load_quad(p.ssm_state, r.read_slot * p.ssm_state.slot_size + e, valid, vec, carry);
  }

  // The preparing thread: channels ch0 + dp, ch0 + dp + 1 (8-byte reads, 16-byte writes), token rows
  // tp, tp + kPrepStep, … of a chunk.
  static_assert(kCh % 2 == 0, "channel pairs");
  const int dp = 2 * (tid % (kCh / 2));
  const int tp = tid / (kCh / 2);
  bool prep_active[2];
  float dt_bias[2], z_bias[2], Dp[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    prep_active[k] = ch0 + dp + k < p.I;
    const int ipc = prep_active[k] ? ch0 + dp + k : p.I - 1;
    dt_bias[k] = load_element(p.dt_bias.data, ipc, p.dt_bias.kind);
    z_bias[k] = weight_or(p.in_bias, I + ipc, 0.0f);
    Dp[k] = load_element(p.D.data, ipc, p.D.kind);
  }
  // Token t's row of the channel tile in dt (which 0), c (1) or z (2: the second half of in_proj's rows).
  const auto tile_row = [&](int which, int64_t t) -> const float* {
    return which == 0 ? p.dt + t * I + ch0 : which == 1 ? p.c + t * I + ch0 : p.xz + t * 2 * I + I + ch0;
  };

  // Chunk `begin`'s rows → stage `st` (asynchronous; rows past the request's end or channels past I
  // are not copied and never read unmasked; B/C there are zeros). Every loop has a compile-time trip
  // count and splits its copy index by compile-time sizes, so a copy costs a few instructions (the
  // per-thread parts of the indices do not change from chunk to chunk).
  const auto stage = [&](int32_t begin, int st) {
    const int32_t rows = r.end - begin;  // tokens of the chunk inside the request (may exceed kL)
    float* raw = raw_smem + st * 3 * kL * kCh;
    float* bc = bc_smem + st * kL * kRow;
    if constexpr (kTma) {
      // One lane (elect.sync) of the last segment's warp, which has no segment pair to publish, copies
      // the four boxes (rows past the tensor's end arrive as zeros; rows past the request's end are
      // masked by the preparation, their B/C zeroed by stage_arrived): the barrier after the local
      // scans waits for the busiest warp, and this one has the least to do.
      if (seg == kSegs - 1 && tma::elect_one()) {
        tma::fence_proxy_async();  // the stage's previous contents were read (generic proxy) before the barrier
        tma::mbarrier_arrive_expect_tx(&copied[st], kTmaBytes);
        tma::load_tile_2d(raw, &maps.dt, ch0, begin, &copied[st]);
        tma::load_tile_2d(raw + kL * kCh, &maps.c, ch0, begin, &copied[st]);
        tma::load_tile_2d(raw + 2 * kL * kCh, &maps.z, ch0, begin, &copied[st]);
        tma::load_tile_2d(bc, &maps.bc, 0, begin, &copied[st]);
      }
    } else if constexpr (kVec) {
      constexpr int kQuads = kCh / 4;  // 16-byte columns per row
      constexpr int kItems = 3 * kL * kQuads;
#pragma unroll
      for (int k = 0; k < (kItems + kThreads - 1) / kThreads; ++k) {
        const int idx = tid + k * kThreads;  // row (which·kL + tk) · kQuads + q
        if (kItems % kThreads == 0 || idx < kItems) {
          const int row = idx / kQuads;
          const int q = idx % kQuads;
          const int which = row / kL;
          const int tk = row - which * kL;
          // (selects, not branches: tile_row of a run-time `which`)
          const float* tensor = which == 0 ? p.dt : which == 1 ? p.c : p.xz + I;
          const int64_t stride = which == 2 ? 2 * I : I;
          if (tk < rows && ch0 + 4 * q < p.I) {
            mma::cp_async_16(mma::shared_address(raw + 4 * idx), tensor + (begin + tk) * stride + ch0 + 4 * q, true);
          }
        }
      }
    } else {
      constexpr int kItems = 3 * kL * kCh;
#pragma unroll
      for (int k = 0; k < (kItems + kThreads - 1) / kThreads; ++k) {
        const int idx = tid + k * kThreads;  // row (which·kL + tk) · kCh + col
        if (kItems % kThreads == 0 || idx < kItems) {
          const int row = idx / kCh;
          const int col = idx % kCh;
          const int which = row / kL;
          const int tk = row - which * kL;
          if (tk < rows && ch0 + col < p.I) {
            mma::cp_async_4(mma::shared_address(raw + idx), tile_row(which, begin + tk) + col, true);
          }
        }
      }
    }
    const float* bc_src = p.dbc + int64_t{begin} * dbc_stride + p.R;
    if constexpr (kVec && !kTma) {  // (with TMA the B/C box was issued above)
      constexpr int kItems = kL * 2 * kLanes;  // per token: kLanes B quads, then kLanes C quads
#pragma unroll
      for (int k = 0; k < (kItems + kThreads - 1) / kThreads; ++k) {
        const int idx = tid + k * kThreads;
        if (kItems % kThreads == 0 || idx < kItems) {
          const int tk = idx / (2 * kLanes);
          const int qd = idx % (2 * kLanes);
          const int which = qd / kLanes;
          const int n = 4 * (qd % kLanes);
          float* dst = bc + 4 * idx;
          if (tk < rows && n < N) {
            mma::cp_async_16(mma::shared_address(dst), bc_src + tk * dbc_stride + which * N + n, true);
          } else {
            *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
      }
    } else if constexpr (!kVec) {
      constexpr int kItems = kL * kRow;
#pragma unroll
      for (int k = 0; k < (kItems + kThreads - 1) / kThreads; ++k) {
        const int idx = tid + k * kThreads;
        if (kItems % kThreads == 0 || idx < kItems) {
          const int tk = idx / kRow;
          const int col = idx % kRow;
          const int which = col / (4 * kLanes);
          const int n = col % (4 * kLanes);
          if (tk < rows && n < N) {
            mma::cp_async_4(mma::shared_address(bc + idx), bc_src + tk * dbc_stride + which * N + n, true);
          } else {
            bc[idx] = 0.0f;
          }
        }
      }
    }
    if constexpr (kBoundaries) {
      int32_t* slots = slot_smem + st * kL;
      for (int tk = tid; tk < kL; tk += kThreads) {
        if (tk < rows) {
          mma::cp_async_4(mma::shared_address(slots + tk), p.boundary_slot + begin + tk, true);
        } else {
          slots[tk] = -1;
        }
      }
    }
  };
  // Chunk q (starting at `begin`, in stage `st`) copied: with TMA, wait for its boxes, then zero the
  // B/C rows past the request's end (the rows of the next request or zeros arrived there; with Δ = 0
  // they add nothing as long as they are finite, zeros make that unconditional). The caller's block
  // barrier then makes the stage visible to all.
  const auto stage_arrived = [&](int32_t begin, int st, int q) {
    if constexpr (kTma) {
      if (begin < r.end) {
        tma::mbarrier_wait(&copied[st], static_cast<uint32_t>(q / kStages) & 1u);
        const int32_t rows = r.end - begin;
        if (rows < kL) {
          float* bc = bc_smem + st * kL * kRow;
          for (int idx = rows * kRow + tid; idx < kL * kRow; idx += kThreads) bc[idx] = 0.0f;
        }
      }
    }
  };
  // Chunk `begin` in stage `st` → prepared buffer `pb`: (Δ, Δ·c) and (D·c, gate), zeros past the
  // request's end and past I. Branch-free: every element is computed (past the end from whatever
  // the stage holds) and the zeros selected, so that the compiler interleaves this pass with the
  // local scan it follows.
  const auto prep = [&](int32_t begin, int st, int pb) {
    const float* raw = raw_smem + st * 3 * kL * kCh;
    float2* ddc = ddc_smem + pb * kL * kCh;
    float2* dg = dg_smem + pb * kL * kCh;
#pragma unroll
    for (int j = 0; j < (kL + kPrepStep - 1) / kPrepStep; ++j) {
      const int tk = tp + j * kPrepStep;
      if (kL % kPrepStep != 0 && tk >= kL) break;
      const int o = tk * kCh + dp;
      const bool in_request = begin + tk < r.end;
      const float2 dt = *reinterpret_cast<const float2*>(raw + o);
      const float2 c = *reinterpret_cast<const float2*>(raw + kL * kCh + o);
      const float2 z = *reinterpret_cast<const float2*>(raw + 2 * kL * kCh + o);
      const float dtv[2] = {dt.x, dt.y}, cv[2] = {c.x, c.y}, zv[2] = {z.x, z.y};
      float out_ddc[4], out_dg[4];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const bool ok = prep_active[k] && in_request;
        const float delta = softplus_fast(dtv[k] + dt_bias[k]);
        const float gate = silu_fast(zv[k] + z_bias[k]);
        out_ddc[2 * k] = ok ? delta : 0.0f;
        out_ddc[2 * k + 1] = ok ? delta * cv[k] : 0.0f;
        out_dg[2 * k] = ok ? Dp[k] * cv[k] : 0.0f;
        out_dg[2 * k + 1] = ok ? gate : 0.0f;
      }
      *reinterpret_cast<float4*>(ddc + o) = make_float4(out_ddc[0], out_ddc[1], out_ddc[2], out_ddc[3]);
      *reinterpret_cast<float4*>(dg + o) = make_float4(out_dg[0], out_dg[1], out_dg[2], out_dg[3]);
    }
  };

#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) {
    const int32_t begin = r.begin + q * kL;
    if (begin < r.end) stage(begin, q);
    mma::cp_async_commit();
  }
  mma::cp_async_wait<kStages - 2>();  // chunk 0
  stage_arrived(r.begin, 0, 0);
  __syncthreads();
  prep(r.begin, 0, 0);

  constexpr int kPer = kSeg >= kLanes ? kSeg / kLanes : 1;  // tokens whose y this lane stores
  constexpr int kShare = kSeg >= kLanes ? 1 : kLanes / kSeg;  // lanes holding the same token's sum
  const int base = seg * kSeg;
  // This lane's y: tokens y_first … y_first + kPer − 1 of each chunk, column i (stored only when
  // active); y_out walks the chunks' rows.
  const int y_first = base + (g / kShare) * kPer;
  float* y_out = p.y + (int64_t{r.begin} + y_first) * I + ic;
  int st = 0;
  int c = 0;
  for (int32_t chunk = r.begin; chunk < r.end; chunk += kL, ++c) {
    mma::cp_async_wait<kStages - 3>();  // chunk c + 1
    stage_arrived(chunk + kL, st + 1 == kStages ? 0 : st + 1, c + 1);
    __syncthreads();  // chunk c prepared and c + 1 copied, visible; everyone is done with chunk c − 1
    {
      const int32_t begin = chunk + (kStages - 1) * kL;
      const int target = st == 0 ? kStages - 1 : st - 1;  // (c + kStages − 1) mod kStages
      if (begin < r.end) stage(begin, target);
      mma::cp_async_commit();
    }
    const int st_next = st + 1 == kStages ? 0 : st + 1;

    const float2* ddc = ddc_smem + (c & 1) * kL * kCh;
    const float2* dg = dg_smem + (c & 1) * kL * kCh;
    const float* bc = bc_smem + st * kL * kRow;
    const int32_t* slots = slot_smem + st * kL;
    // Local scan of the segment from zero.
    float a[kSeg][4];
    float u[kKeepU ? kSeg : 1][4];  // (unused without kKeepU)
    float local[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float dsum = 0.0f;
#pragma unroll
    for (int k = 0; k < kSeg; ++k) {
      const int tk = base + k;
      const float2 dd = ddc[tk * kCh + d];
      const float4 B = *reinterpret_cast<const float4*>(bc + tk * kRow + n0);
      const float Bv[4] = {B.x, B.y, B.z, B.w};
      dsum += dd.x;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        a[k][s] = mma::exp2_approx(dd.x * A2[s]);
        const float uk = dd.y * Bv[s];
        if constexpr (kKeepU) u[k][s] = uk;
        local[s] = fmaf(a[k][s], local[s], uk);
      }
    }
    // The next chunk's Δ and gate (all zeros past the request's end), interleaved with the scan.
    prep(chunk + kL, st_next, (c + 1) & 1);
    if (seg < kSegs - 1) {
      pair_decay[seg * kGroup + tcl] =
          make_float4(mma::exp2_approx(dsum * A2[0]), mma::exp2_approx(dsum * A2[1]), mma::exp2_approx(dsum * A2[2]),
                      mma::exp2_approx(dsum * A2[3]));
      pair_local[seg * kGroup + tcl] = make_float4(local[0], local[1], local[2], local[3]);
    }
    __syncthreads();
    // Carry-in: the chunk's carry (the last segment's state after chunk c − 1) through segments < seg.
    if (c > 0 && seg < kSegs - 1) {
      const float4 v = carry_smem[(c & 1) * kGroup + tcl];
      carry[0] = v.x, carry[1] = v.y, carry[2] = v.z, carry[3] = v.w;
    }
    float h[4] = {carry[0], carry[1], carry[2], carry[3]};
#pragma unroll
    for (int w = 0; w < kSegs - 1; ++w) {
      if (w < seg) {
        const float4 dcy = pair_decay[w * kGroup + tcl];
        const float4 loc = pair_local[w * kGroup + tcl];
        h[0] = fmaf(dcy.x, h[0], loc.x);
        h[1] = fmaf(dcy.y, h[1], loc.y);
        h[2] = fmaf(dcy.z, h[2], loc.z);
        h[3] = fmaf(dcy.w, h[3], loc.w);
      }
    }
    float acc[kSeg];
    const bool store = active && valid > 0;
    tile_rescan<kLanes, kSeg, kCh, kKeepU, kBoundaries>(h, acc, a, u, ddc, d, bc, slots, base, n0, store, p.ssm_state,
                                                       e, valid, vec);
    // (D·c, gate) of the tokens whose y this lane stores (past the request's end read and not used):
    // y = (Σ h·C + D·c)·gate, D·c added inside the reduction.
    float dc[kPer], gate[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float2 v = dg[(y_first + j) * kCh + d];
      dc[j] = v.x, gate[j] = v.y;
    }
    if constexpr (kLanes == 1) {  // (a lane holds its channel's whole state: nothing to reduce)
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc[j] += dc[j];
    } else {
      reduce_scatter<kLanes / 2, kSeg>(acc, g, dc);
    }
    if (active && g % kShare == 0) {
      const int32_t left = r.end - chunk - y_first;  // tokens of the request from this lane's first
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (j < left) y_out[j * I] = acc[j] * gate[j];
      }
    }
    y_out += kL * I;
    if (seg == kSegs - 1) {
#pragma unroll
      for (int s = 0; s < 4; ++s) carry[s] = h[s];
      carry_smem[((c + 1) & 1) * kGroup + tcl] = make_float4(h[0], h[1], h[2], h[3]);
    }
    st = st_next;
  }
  // The final state: the last segment's state after the last chunk.
  if (seg == kSegs - 1 && active && valid > 0) {
    store_quad(p.ssm_state, r.write_slot * p.ssm_state.slot_size + e, valid, vec, carry);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(TileScan<Cfg>::kThreads, TileScan<Cfg>::kMinBlocks)
    scan_tile_kernel(Mamba1Params p, const __grid_constant__ ScanMaps maps) {
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (r.decode || r.end <= r.begin) return;  // uniform over the block
  if (maps.valid) {  // (implies rows_in_quads)
    if (r.num_boundaries > 0) {
      tile_scan<Cfg, true, true, true>(p, maps, r);
    } else {
      tile_scan<Cfg, true, false, true>(p, maps, r);
    }
  } else if (rows_in_quads(p)) {
    if (r.num_boundaries > 0) {
      tile_scan<Cfg, true, true, false>(p, maps, r);
    } else {
      tile_scan<Cfg, true, false, false>(p, maps, r);
    }
  } else {
    if (r.num_boundaries > 0) {
      tile_scan<Cfg, false, true, false>(p, maps, r);
    } else {
      tile_scan<Cfg, false, false, false>(p, maps, r);
    }
  }
}

// The sequential scan (prefills of Mamba-1's 16 states, where TMA applies): each lane walks its
// request's tokens one by one for kSpl states of one channel (16/kSpl lanes per channel), so that a
// token·channel·state costs one ex2 and four FMA-pipe instructions (Δ·A, Δ·c·B, the update, its
// share of y) with no local scan, rescan, join or block barrier: the tile scan's parallelism over
// time segments is traded for states per lane.
// Balance: the time is set by the busiest of an SM's four schedulers (each warp stays on one, warp w
// on scheduler w mod 4), so a block's warps may differ in kSpl (warp roles A and B): Mamba-1's block
// (SeqScanN16), one per SM, is 8 warps of 2 states per lane and 4 of 1 state per lane (2 channels a
// warp), so that each scheduler holds 4 + 4 + 2 channels and 5120 channels fill 128 blocks.
// Memory: the block's tokens arrive in a ring of kStages TMA stages of kTok rows (dt, c, z of the
// block's channels, swizzled where a row is 32 or 64 bytes so that the preparation reads them without
// bank conflicts; B/C), each awaited on its `full` mbarrier. Warp q mod kWarps refills the stage of
// chunk q − kLag with chunk q + kStages − kLag once every warp has handed that chunk back on its
// `empty` mbarrier, so warps drift apart by up to kLag chunks and meet at a block barrier only where
// a request's last chunk ends early (its rows past the end are made inert as it lands). Lane g of a
// channel prepares tokens g, g + lanes, … of the next chunk (Δ, Δ·c into its warp's buffer, two
// tokens' pairs per 16-byte read; D·c and the gate kept in registers), interleaved with the scan of
// the current one, and stores y of those tokens after each part's reduce-scatter over the channel's
// lanes.
// The kernel is bound by the L1 data pipe (one shared-memory wavefront per cycle per SM), so the
// lane order (SeqScan::run) and the (Δ, Δ·c) row padding (kPrepRow) are chosen to minimise the
// wavefronts of the per-token shared loads.
template <class Cfg>
struct SeqScan {
  // warps [0, kWarpsA): kSplA states per lane; the next kWarpsB warps: kSplB
  static constexpr int kWarpsA = Cfg::role_a_warps, kSplA = Cfg::role_a_states_per_lane;
  static constexpr int kWarpsB = Cfg::role_b_warps, kSplB = Cfg::role_b_states_per_lane;
  static constexpr int kWarps = kWarpsA + kWarpsB;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTok = Cfg::chunk_tokens;  // tokens per chunk
  static constexpr int kStages = Cfg::stages;
  static constexpr int kLag = Cfg::lag_chunks;
  static constexpr int kMinBlocks = Cfg::min_blocks_per_sm;
  static constexpr int kRow = 32;        // B/C floats per token
  static constexpr int lanes(int spl) { return 16 / spl; }         // lanes per channel
  static constexpr int channels(int spl) { return 2 * spl; }       // channels per warp
  // A warp's lanes in runs: run(spl) adjacent lanes of one channel (states g … of consecutive g),
  // then the same g's of the next channel, … (lane = (g / run)·run·channels + c·run + g % run).
  // The order decides how many wavefronts of the L1 data pipe (one per cycle per SM) a shared load
  // takes, and that pipe bounds this kernel. Per 2-state warp instruction, B/C LDS.64 and (Δ, Δ·c)
  // LDS.128 take 1 and 2 wavefronts with runs of 2 (channel-major lanes, run 8: 2 and 2; state-major,
  // run 1: 1 and 4). The 1-state warps are not sensitive to it (run 16: channel-major).
  static constexpr int run(int spl) { return spl == 2 ? 2 : lanes(spl); }
  static constexpr int kChA = kWarpsA * channels(kSplA);           // role A's channels come first
  static constexpr int kCh = kChA + kWarpsB * channels(kSplB);     // channels per block
  static_assert(kStages > kLag && kLag >= 1, "seq scan ring");
  static_assert(kTok % lanes(kSplA) == 0 && kTok % lanes(kSplB) == 0, "whole parts per chunk");
  // Shared memory: up to 1024 bytes to align the stages to the swizzle's period, raw rows
  // [kStages][3][kTok·kCh], B/C rows [kStages][kTok·kRow], prepared (Δ, Δ·c) per warp [2][its
  // channels][kPrepRow] float2, mbarriers full [kStages] and empty [kStages]. The raw rows arrive swizzled where
  // a row is 32 or 64 bytes (kSwizzleBits 1 or 2: a row's 16-byte pieces XOR its address bits 7…),
  // so that the preparation's lanes (one per token and channel) read them without bank conflicts
  // (2- or 4-way otherwise); the swizzled rows' bits come from the lane's g (≥ 8 lanes per channel).
  static constexpr int kSwizzleBits = kCh * 4 == 32 ? 1 : kCh * 4 == 64 ? 2 : 0;
  static_assert(kSwizzleBits == 0 || (lanes(kSplA) >= 8 && (kWarpsB == 0 || lanes(kSplB) >= 8)), "swizzle rows");
  // A warp's (Δ, Δ·c) buffer: [channel][token] float2, channels kPrepRow apart (two tokens' pairs in
  // one 16-byte read): kPrepRow ≡ 4 (mod 16), i.e. 32 bytes (mod 128), so that the preparation's
  // STS.64 (half a 2-state warp: 4 channels × 4 tokens) covers the 32 banks once.
  static constexpr int kPrepRow = kTok + ((4 - kTok % 16) + 16) % 16;
  static constexpr int kPrepA = 2 * kPrepRow * channels(kSplA);  // float2 per warp of role A (2 buffers)
  static constexpr int kPrepB = 2 * kPrepRow * channels(kSplB);
  static constexpr size_t kSmemBytes = 1024 + size_t{kStages} * (3 * kTok * kCh + kTok * kRow) * sizeof(float) +
                                       (size_t{kWarpsA} * kPrepA + size_t{kWarpsB} * kPrepB) * sizeof(float2) +
                                       size_t{2} * kStages * sizeof(uint64_t);
};

// A barrier of the block's kThreads threads that its warps may reach from different code (the roles'
// copies of the chunk loop): barrier 1 without .aligned (__syncthreads is barrier 0, .aligned: every
// thread at the same instruction).
template <int kThreads>
__device__ __forceinline__ void block_sync() {
  asm volatile("barrier.sync 1, %0;\n" ::"n"(kThreads) : "memory");
}

// The block's ring of token chunks (shared by its warps): chunk q lives in stage q % kStages.
template <class S>
struct SeqRing {
  const ScanMaps* maps;
  float* raw;    // [kStages][3][kTok·kCh]: dt, c, z
  float* bc;     // [kStages][kTok·kRow]
  uint64_t* full;
  uint64_t* empty;
  int ch0;       // the block's first channel
  int32_t begin, end;  // the request's tokens

  static constexpr uint32_t kBytes = (3 * S::kTok * S::kCh + S::kTok * S::kRow) * sizeof(float);
  __device__ int32_t num_chunks() const { return (end - begin + S::kTok - 1) / S::kTok; }
  // Tokens of the request from chunk q's first row on (≥ kTok: q is whole; ≤ 0: past the end).
  __device__ int32_t left_of(int32_t q) const { return end - (begin + q * S::kTok); }
  __device__ float* raw_of(int32_t q) const { return raw + (q % S::kStages) * 3 * S::kTok * S::kCh; }
  __device__ float* bc_of(int32_t q) const { return bc + (q % S::kStages) * S::kTok * S::kRow; }
  // Chunk q → its stage (one lane).
  __device__ void issue(int32_t q) const {
    const int st = q % S::kStages;
    const int32_t row = begin + q * S::kTok;
    float* dst = raw_of(q);
    tma::fence_proxy_async();
    tma::mbarrier_arrive_expect_tx(&full[st], kBytes);
    tma::load_tile_2d(dst, &maps->dt, ch0, row, &full[st]);
    tma::load_tile_2d(dst + S::kTok * S::kCh, &maps->c, ch0, row, &full[st]);
    tma::load_tile_2d(dst + 2 * S::kTok * S::kCh, &maps->z, ch0, row, &full[st]);
    tma::load_tile_2d(bc_of(q), &maps->bc, 0, row, &full[st]);
  }
  __device__ void wait_full(int32_t q) const {
    tma::mbarrier_wait(&full[q % S::kStages], static_cast<uint32_t>(q / S::kStages) & 1u);
  }
  // Chunk q has landed (the whole warp waits). If it is the request's last chunk and ends early, the
  // rows past the end (the next request's, or zeros) are made inert once, by the whole block, before
  // anyone prepares or scans them: dt = −inf (Δ = softplus(−inf) = 0 exactly: a = 1, the state
  // carries over unchanged), c = 0 (Δ·c = 0) and B = C = 0 (no input, no output whatever they held),
  // so the preparation needs no mask. Every warp lands every chunk at the same point of its loop, so
  // all reach the block barrier; the roles reach it from different code (block_sync). (A landed
  // chunk has left ≥ 1 token, so left < kTok only for the last one.)
  __device__ __forceinline__ void land(int32_t q) const {
    wait_full(q);
    __syncwarp();
    const int32_t left = left_of(q);
    if (left < S::kTok) {
      block_sync<S::kThreads>();
      float* dt_rows = raw_of(q);
      float* c_rows = dt_rows + S::kTok * S::kCh;
      float* bc_rows = bc_of(q);
      // (whole rows: the swizzle permutes 16-byte pieces within a row)
      for (int idx = left * S::kCh + static_cast<int>(threadIdx.x); idx < S::kTok * S::kCh; idx += S::kThreads) {
        dt_rows[idx] = -INFINITY;
        c_rows[idx] = 0.0f;
      }
      for (int idx = left * S::kRow + static_cast<int>(threadIdx.x); idx < S::kTok * S::kRow; idx += S::kThreads) {
        bc_rows[idx] = 0.0f;
      }
      block_sync<S::kThreads>();
    }
  }
};

// kSpl consecutive floats from shared memory (8- or 4-byte aligned).
template <int kSpl>
__device__ __forceinline__ void load_states(const float* src, float (&out)[kSpl]) {
  if constexpr (kSpl == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    out[0] = v.x, out[1] = v.y;
  } else {
    static_assert(kSpl == 1, "1 or 2 states per lane");
    out[0] = *src;
  }
}

// One warp's channels [wch0, wch0 + 2·kSpl) of the block's tile, kSpl states per lane, over all of
// the request's chunks; prep_smem: the warp's (Δ, Δ·c) buffers [2][channels][kPrepRow].
template <class S, int kSpl, bool kBoundaries>
__device__ __forceinline__ void seq_scan_warp(const Mamba1Params& p, const SeqRing<S>& ring, const GpuRequest& r,
                                              int wch0, float2* prep_smem) {
  constexpr int kLanes = S::lanes(kSpl);
  constexpr int kChWarp = S::channels(kSpl);
  constexpr int kParts = S::kTok / kLanes;  // a lane prepares (and stores y of) one token per part
  constexpr int kTok = S::kTok;
  constexpr int kCh = S::kCh;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  constexpr int kRun = S::run(kSpl);
  const int c = (lane / kRun) % kChWarp;                       // the lane's channel in its warp
  const int g = (lane / (kRun * kChWarp)) * kRun + lane % kRun;  // states kSpl·g …
  const auto lane_of = [](int channel, int gg) {
    return (gg / kRun) * kRun * kChWarp + channel * kRun + gg % kRun;
  };
  const int64_t I = p.I;
  const int wc = wch0 + c;  // the lane's channel in the block's tile
  const int i = ring.ch0 + wc;
  const bool active = i < p.I;
  const int ic = active ? i : p.I - 1;
  const int64_t e = int64_t{ic} * 16 + kSpl * g;

  float A2[kSpl], h[kSpl];
#pragma unroll
  for (int s = 0; s < kSpl; ++s) {
    A2[s] = -expf(load_element(p.A_log.data, e + s, p.A_log.kind)) * kLog2e;
    h[s] = active && r.read_slot >= 0
               ? load_element(p.ssm_state.data, r.read_slot * p.ssm_state.slot_size + e + s, p.ssm_state.kind)
               : 0.0f;
  }
  const float dt_bias = load_element(p.dt_bias.data, ic, p.dt_bias.kind);
  const float z_bias = weight_or(p.in_bias, I + ic, 0.0f);
  const float Dw = load_element(p.D.data, ic, p.D.kind);
  const int32_t num_chunks = ring.num_chunks();

  // Chunk q's (Δ, Δ·c) of the lane's channel, tokens g + kLanes·j → the warp's buffer q & 1; (D·c,
  // gate) of those tokens → dg. No masks: rows past the request's end were made inert when the chunk
  // landed (Δ = Δ·c = 0); channels past I (zero columns of the TMA box) are computed, never stored.
  // Channel wc's column in the raw rows of tokens ≡ g (mod kLanes) (the swizzle's row bits are g's).
  constexpr int kSwizzleShift = S::kSwizzleBits == 1 ? 2 : 1;
  const int raw_col = ((wc / 4) ^ ((g >> kSwizzleShift) & ((1 << S::kSwizzleBits) - 1))) * 4 + wc % 4;
  // The lane's channel's row of chunk q's (Δ, Δ·c) buffer.
  float2* const prep_row0 = prep_smem + c * S::kPrepRow;
  const auto prep_row = [&](int32_t q) { return prep_row0 + (q & 1) * S::kPrepRow * kChWarp; };
  const auto prep = [&](int32_t q, float (&dg)[kParts][2]) {
    const float* raw = ring.raw_of(q);
    float2* out = prep_row(q);
#pragma unroll
    for (int j = 0; j < kParts; ++j) {
      const int t = j * kLanes + g;
      const int o = t * kCh + raw_col;
      const float dt = raw[o], cv = raw[kTok * kCh + o], z = raw[2 * kTok * kCh + o];
      const float delta = softplus_fast(dt + dt_bias);
      out[t] = make_float2(delta, delta * cv);
      dg[j][0] = Dw * cv;
      dg[j][1] = silu_fast(z + z_bias);
    }
  };
  // The scan of chunk q: per part of kLanes tokens, the update of the lane's states, the
  // reduce-scatter of their y shares over the channel's lanes (lane g: token g of the part, + D·c)
  // and its y (× gate); with kBoundaries, the block-boundary states (slots read by lane g for token g,
  // shuffled).
  float dg[kParts][2];
  float* y_out = p.y + (int64_t{r.begin} + g) * I + i;  // token g of each part, walking the chunks
  const auto scan = [&](int32_t q, int32_t left) {
    const float* bc = ring.bc_of(q);
    const float2* dd = prep_row(q);
#pragma unroll
    for (int j = 0; j < kParts; ++j) {
      [[maybe_unused]] int32_t slot_g = -1;
      if constexpr (kBoundaries) {
        const int32_t t = r.begin + q * kTok + j * kLanes + g;
        if (j * kLanes + g < left) slot_g = p.boundary_slot[t];
      }
      float v[kLanes];
      float4 d2;  // (Δ, Δ·c) of tokens t and t + 1 (t even)
#pragma unroll
      for (int k = 0; k < kLanes; ++k) {
        const int t = j * kLanes + k;
        if (k % 2 == 0) d2 = *reinterpret_cast<const float4*>(dd + t);
        const float2 d = k % 2 == 0 ? make_float2(d2.x, d2.y) : make_float2(d2.z, d2.w);
        float B[kSpl], C[kSpl];
        load_states<kSpl>(bc + t * S::kRow + kSpl * g, B);
        load_states<kSpl>(bc + t * S::kRow + 16 + kSpl * g, C);
#pragma unroll
        for (int s = 0; s < kSpl; ++s) h[s] = fmaf(mma::exp2_approx(d.x * A2[s]), h[s], d.y * B[s]);
        v[k] = h[0] * C[0];
#pragma unroll
        for (int s = 1; s < kSpl; ++s) v[k] = fmaf(h[s], C[s], v[k]);
        if constexpr (kBoundaries) {
          const int32_t slot = __shfl_sync(0xffffffffu, slot_g, lane_of(c, k));
          if (active && slot >= 0) {
#pragma unroll
            for (int s = 0; s < kSpl; ++s) {
              store_element(p.ssm_state.data, slot * p.ssm_state.slot_size + e + s, p.ssm_state.kind, h[s]);
            }
          }
        }
      }
      float bias[1] = {dg[j][0]};
      reduce_scatter<kLanes / 2, kLanes, kRun, kChWarp>(v, g, bias);
      if (active && j * kLanes + g < left) y_out[j * kLanes * I] = v[0] * dg[j][1];
    }
    y_out += kTok * I;
  };

  if (num_chunks > 0) {
    ring.land(0);
    prep(0, dg);
  }
  __syncwarp();
  for (int32_t q = 0; q < num_chunks; ++q) {
    // This warp's turn to refill: chunk q + kStages − kLag into the stage chunk q − kLag used.
    // (Every wait is the whole warp's and ends in __syncwarp: try_wait may resume lanes at different
    // times, and a warp left diverged before the reduce-scatter's shuffles takes the compiler's slow
    // collective path.)
    const int32_t refill = q + S::kStages - S::kLag;
    if (q % S::kWarps == warp && refill < num_chunks) {
      if (refill >= S::kStages) {
        tma::mbarrier_wait(&ring.empty[refill % S::kStages], static_cast<uint32_t>(refill / S::kStages - 1) & 1u);
      }
      __syncwarp();
      if (tma::elect_one()) ring.issue(refill);
    }
    if (q + 1 < num_chunks) ring.land(q + 1);
    scan(q, ring.left_of(q));
    // The next chunk's (Δ, Δ·c), D·c and gate; after the last chunk, of a stage no one reads again
    // (its results unused). Unconditional, so that it interleaves with the scan.
    float dg_next[kParts][2];
    prep(q + 1, dg_next);
    __syncwarp();
    if (tma::elect_one()) tma::mbarrier_arrive(&ring.empty[q % S::kStages]);
#pragma unroll
    for (int j = 0; j < kParts; ++j) dg[j][0] = dg_next[j][0], dg[j][1] = dg_next[j][1];
  }
  if (active && r.write_slot >= 0) {
#pragma unroll
    for (int s = 0; s < kSpl; ++s) {
      store_element(p.ssm_state.data, r.write_slot * p.ssm_state.slot_size + e + s, p.ssm_state.kind, h[s]);
    }
  }
}

// The block: its shared memory, the ring's mbarriers and first chunks, then each warp's role.
template <class S, bool kBoundaries>
__device__ __forceinline__ void seq_scan(const Mamba1Params& p, const ScanMaps& maps, const GpuRequest& r) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  extern __shared__ __align__(128) float4 dynamic_smem[];
  // (the swizzle pattern repeats every 1024 bytes of shared-memory address: the stages start there)
  float* raw_smem = reinterpret_cast<float*>(dynamic_smem) + ((1024 - mma::shared_address(dynamic_smem) % 1024) % 1024) / 4;
  float* bc_smem = raw_smem + S::kStages * 3 * S::kTok * S::kCh;
  float2* prep_smem = reinterpret_cast<float2*>(bc_smem + S::kStages * S::kTok * S::kRow);
  uint64_t* full = reinterpret_cast<uint64_t*>(prep_smem + S::kWarpsA * S::kPrepA + S::kWarpsB * S::kPrepB);
  const SeqRing<S> ring{&maps, raw_smem, bc_smem, full, full + S::kStages, static_cast<int>(blockIdx.x) * S::kCh,
                        r.begin, r.end};
  if (tid == 0) {
    for (int q = 0; q < S::kStages; ++q) {
      tma::mbarrier_init(&ring.full[q], 1);
      tma::mbarrier_init(&ring.empty[q], S::kWarps);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 0 && tma::elect_one()) {
    for (int32_t q = 0; q < S::kStages - S::kLag && q < ring.num_chunks(); ++q) ring.issue(q);
  }
  if (warp < S::kWarpsA) {
    seq_scan_warp<S, S::kSplA, kBoundaries>(p, ring, r, warp * S::channels(S::kSplA),
                                                       prep_smem + warp * S::kPrepA);
  } else if constexpr (S::kWarpsB > 0) {
    seq_scan_warp<S, S::kSplB, kBoundaries>(
        p, ring, r, S::kChA + (warp - S::kWarpsA) * S::channels(S::kSplB),
        prep_smem + S::kWarpsA * S::kPrepA + (warp - S::kWarpsA) * S::kPrepB);
  }
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    scan_seq_kernel(Mamba1Params p, const __grid_constant__ ScanMaps maps) {
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (r.decode || r.end <= r.begin) return;  // uniform over the block
  if (r.num_boundaries > 0) {
    seq_scan<S, true>(p, maps, r);
  } else {
    seq_scan<S, false>(p, maps, r);
  }
}

// The sequential scan where it applies (N = 16, TMA maps of its boxes): false otherwise.
template <class Cfg>
bool launch_seq_scan(const Mamba1Params& p, int32_t count, cudaStream_t stream) {
  using S = SeqScan<Cfg>;
  if (p.N != 16 || !rows_in_quads(p) || p.num_tokens <= 0) return false;
  ScanMaps maps;
  constexpr CUtensorMapSwizzle kSwizzle = S::kSwizzleBits == 1   ? CU_TENSOR_MAP_SWIZZLE_32B
                                         : S::kSwizzleBits == 2 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                                : CU_TENSOR_MAP_SWIZZLE_NONE;
  maps.valid = encode_scan_maps(p, S::kTok, S::kCh, kSwizzle, &maps);
  if (!maps.valid) return false;
  constexpr auto kernel = scan_seq_kernel<S>;
  allow_dynamic_smem(kernel, S::kSmemBytes);
  kernel<<<dim3((p.I + S::kCh - 1) / S::kCh, count), S::kThreads, S::kSmemBytes, stream>>>(p, maps);
  return true;
}

__global__ void bias_rows_kernel(RowsRef out, FloatColumns in, WeightRef bias, int64_t width, int64_t num_tokens,
                                 const int32_t* flags) {
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    if (flags[t] != kRowActive) continue;
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < width; c += int64_t{gridDim.x} * blockDim.x) {
      const int64_t column = in.first_column + c;
      store_element(out.data, t * out.row_stride + c, out.kind,
                    in.data[t * in.row_stride + column] + weight_or(bias, column, 0.0f));
    }
  }
}

unsigned grid_for(int64_t n, int per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 4096));
}

// Lanes per channel: 4 states per lane, a power of two (N ≤ kMamba1MaxState = 64 → ≤ 16).
int lanes_for(int N) {
  const int quads = (N + 3) / 4;
  int lanes = 1;
  while (lanes < quads) lanes *= 2;
  return lanes;
}

// The launch configurations of the prefill scans, one per state-size class, named by the largest
// state size N of the class (lanes per channel = ⌈N/4⌉ rounded up to a power of two;
// launch_mamba1_scan picks one).
//
// Sequential scan (N = 16, Mamba-1): one block per SM of 8 warps of 2 states per lane and 4 warps of
// 1 (each of the SM's four schedulers then holds 4 + 4 + 2 channels), 48-token chunks in a ring of 4
// TMA stages, warps drifting apart by up to one chunk.
struct SeqScanN16 {
  static constexpr int role_a_warps = 8, role_a_states_per_lane = 2;
  static constexpr int role_b_warps = 4, role_b_states_per_lane = 1;
  static constexpr int chunk_tokens = 48;
  static constexpr int stages = 4;
  static constexpr int lag_chunks = 1;
  static constexpr int min_blocks_per_sm = 1;
};
// Tile scan (every state size; for N = 16 where the sequential scan does not apply): 4 time
// segments of 8 tokens per chunk, 4 copy stages, 5 blocks per SM (Mamba-2.8B's 5120 channels are
// 640 blocks of 4 warps for one request, which 132 SMs hold in one wave at 5 per SM; at 4 per SM the
// last 112 blocks would run a second full-length round).
struct TileScanDefaults {
  static constexpr int segments = 4;
  static constexpr int segment_tokens = 8;
  static constexpr int stages = 4;
  static constexpr int min_blocks_per_sm = 5;
  static constexpr bool inputs_in_registers = false;  // u = Δ·c·B kept from the local scan for the rescan
};
struct TileScanN4 : TileScanDefaults {
  static constexpr int lanes_per_channel = 1;
};
struct TileScanN8 : TileScanDefaults {
  static constexpr int lanes_per_channel = 2;
};
struct TileScanN16 : TileScanDefaults {
  static constexpr int lanes_per_channel = 4;
  static constexpr int segments = 3;
  static constexpr bool inputs_in_registers = true;
};
struct TileScanN32 : TileScanDefaults {
  static constexpr int lanes_per_channel = 8;
};
struct TileScanN64 : TileScanDefaults {
  static constexpr int lanes_per_channel = 16;
  static constexpr int stages = 3;
  static constexpr int min_blocks_per_sm = 2;
};

// The tile scan of a wave's prefills: grid = (channel tiles, prefill requests), Cfg::min_blocks_per_sm
// resident blocks per SM (the register budget). The dynamic shared memory limit is raised once per
// kernel and device (allow_dynamic_smem) where a tile needs more than the default 48 KB.
template <class Cfg>
void launch_tile_scan(const Mamba1Params& p, int32_t count, cudaStream_t stream) {
  using S = TileScan<Cfg>;
  constexpr auto kernel = scan_tile_kernel<Cfg>;
  allow_dynamic_smem(kernel, S::kSmemBytes);
  // TMA boxes of the chunk's rows where the tensors allow them and B/C fill whole quads (N = 4·lanes,
  // so that global and shared rows have the same layout); otherwise per-thread cp.async copies.
  ScanMaps maps;
  maps.valid = rows_in_quads(p) && p.N == 4 * S::kLanes && p.num_tokens > 0 &&
               encode_scan_maps(p, S::kL, S::kCh, CU_TENSOR_MAP_SWIZZLE_NONE, &maps);
  kernel<<<dim3((p.I + S::kCh - 1) / S::kCh, count), S::kThreads, S::kSmemBytes, stream>>>(p, maps);
}

}  // namespace
}  // namespace hybridtb::cuda::ssm::mamba1

namespace hybridtb::cuda::ssm {

void launch_mamba1_scan(const Mamba1Params& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0) return;
  const int lanes = mamba1::lanes_for(p.N);
  // Decodes: requests [0, decode_end) (one launch, none without decodes).
  const int32_t decodes = std::min(p.decode_end, p.wave.num_requests);
  if (decodes > 0) {
    mamba1::launch_decode(p, decodes, stream);
  }
  // Prefills: requests [prefill_begin, num_requests) (one launch, none without prefills).
  const int32_t begin = std::max(p.prefill_begin, 0);
  if (begin < p.wave.num_requests) {
    Mamba1Params q = p;
    q.wave.requests += begin;
    q.wave.num_requests -= begin;
    const int32_t count = q.wave.num_requests;
    switch (lanes) {
      case 1: mamba1::launch_tile_scan<mamba1::TileScanN4>(q, count, stream); break;
      case 2: mamba1::launch_tile_scan<mamba1::TileScanN8>(q, count, stream); break;
      case 4:
        // The sequential scan where its TMA boxes apply, otherwise the tile scan.
        if (!mamba1::launch_seq_scan<mamba1::SeqScanN16>(q, count, stream)) {
          mamba1::launch_tile_scan<mamba1::TileScanN16>(q, count, stream);
        }
        break;
      case 8: mamba1::launch_tile_scan<mamba1::TileScanN32>(q, count, stream); break;
      default: mamba1::launch_tile_scan<mamba1::TileScanN64>(q, count, stream); break;
    }
    HYBRIDTB_CUDA_CHECK_LAUNCH();
  }
}

void launch_bias_rows(const RowsRef& contribution, const FloatColumns& out, WeightRef bias, int64_t width,
                      int64_t num_tokens, const int32_t* flags, cudaStream_t stream) {
  if (num_tokens <= 0 || width == 0) return;
  const dim3 grid(mamba1::grid_for(std::min<int64_t>(width, 1024), 256), static_cast<unsigned>(std::min<int64_t>(num_tokens, 65535)));
  mamba1::bias_rows_kernel<<<grid, 256, 0, stream>>>(contribution, out, bias, width, num_tokens, flags);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
