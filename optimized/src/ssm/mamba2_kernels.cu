// mamba2 on the GPU (mamba2_kernels.h): the single-step decode update, the chunked SSD prefill and
// the gated RMSNorm. The math is reference/ssm/mamba2.cpp's, in float32 (CUDA-core FMAs, no tensor
// cores: the float32 SSM row of the tolerance table assumes float32 products):
//   Δ_t = softplus(dt_t + dt_bias) (threshold 20),  A = −exp(A_log),  a_t = Δ_t·A  (per head)
//   S_t = exp(a_t)·S_{t−1} + Δ_t·x_t ⊗ B_t,  y_t = S_t·C_t + D·x_t        (S: [P, N] per head)
// Prefill, per chunk of ≤ 64 tokens with Λ_t = Σ_{s ≤ t in the chunk} a_s (ssd_minimal's discrete
// form):
//   own state sum  S_c   = Σ_s exp(Λ_last − Λ_s)·Δ_s·x_s ⊗ B_s          chunk_state_kernel
//   state passing  H_0 = saved state, H_{c+1} = exp(Λ_last)·H_c + S_c   state_passing_kernel
//   outputs        y_t = Σ_{s ≤ t} (C_t·B_s)·exp(Λ_t − Λ_s)·Δ_s·x_s + exp(Λ_t)·H_c·C_t + D·x_t
//                                                                       chunk_scan_kernel
// Chunks never straddle a block boundary (the host ends a chunk after each boundary row), so the
// state passing stores the boundary states between chunks. Λ is recomputed by the chunk kernels
// with one routine (same bits). Every sum runs in a fixed order and no float is accumulated
// atomically: bitwise reproducible run to run.
// The decode update is bound by the state pool's bandwidth: each state row is read and written once
// in 16-byte runs of the pool's own element, its sums over the row's lanes exchange half of the rows
// per shuffle level (common/group_sums.cuh), and B, C are read by each lane from global memory (no
// staging behind a block barrier).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/group_sums.cuh"
#include "common/pdl.cuh"
#include "ssm/activations.cuh"
#include "ssm/pool_quads.cuh"
#include "ssm/mamba2_kernels.h"
#include "ssm/weight_ref.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kQ = kMamba2ChunkTokens;  // tokens per chunk (the chunk kernels' t and s tiles)
constexpr int kTile = 64;               // P and N tile of the chunk kernels (16 × 16 threads × 4 × 4)
constexpr int kPad = 68;                // row stride of the shared tiles (float4-aligned, fewer conflicts)
constexpr int kNStep = 32;              // N values staged per step of the chunk scan
constexpr int kChunkThreads = 256;

static_assert(kQ == kTile, "the chunk kernels tile a chunk's tokens like P and N");

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

// Δ_s and the inclusive cumulative log decay Λ_s = Σ_{s' ≤ s} Δ_{s'}·A of a chunk's tokens, into
// shared memory (rows past the chunk's length: Δ = 0, Λ unused). Warp 0 scans, two tokens per
// lane, then a Hillis–Steele shuffle scan of the pair sums: a fixed order. Ends with __syncthreads.
__device__ __forceinline__ void chunk_cumsum(const Mamba2Params& p, const Dims& d, const Mamba2Chunk& chunk, int h,
                                             float* delta, float* lambda) {
  const int tid = static_cast<int>(threadIdx.x);
  const int length = chunk.end - chunk.begin;
  if (tid < 32) {
    const float A = decay_rate(p, h);
    float dl[2], a[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = 2 * tid + i;
      dl[i] = s < length ? delta_of(p, d, chunk.begin + s, h) : 0.0f;
      a[i] = dl[i] * A;
    }
    float inclusive = a[0] + a[1];  // the pair sums' inclusive scan
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const float other = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (tid >= o) inclusive += other;
    }
    const float previous = __shfl_up_sync(0xffffffffu, inclusive, 1);
    const float base = tid == 0 ? 0.0f : previous;  // Σ of the tokens before this lane's pair
    delta[2 * tid] = dl[0];
    delta[2 * tid + 1] = dl[1];
    lambda[2 * tid] = base + a[0];
    lambda[2 * tid + 1] = (base + a[0]) + a[1];
  }
  __syncthreads();
}

// (1) The chunk's own state sum S_c[p, n] = Σ_s x_s[p]·(exp(Λ_last − Λ_s)·Δ_s·B_s[n]) over a
// kTile × kTile (P, N) tile, and (tile 0) the chunk's decay exp(Λ_last). Grid (chunks, Hs, P tiles ×
// N tiles); thread (ty, tx) owns p = p0 + 4·ty + i, n = n0 + 4·tx + j.
__global__ void __launch_bounds__(kChunkThreads) chunk_state_kernel(Mamba2Params p) {
  __shared__ float delta[kQ], lambda[kQ];
  __shared__ __align__(16) float xs[kQ][kPad];  // x_s[p0 + ·]
  __shared__ __align__(16) float bs[kQ][kPad];  // exp(Λ_last − Λ_s)·Δ_s·B_s[n0 + ·]
  const Dims d = dims_of(p);
  const Mamba2Chunk chunk = p.chunks[blockIdx.x];
  const int h = static_cast<int>(blockIdx.y);
  const int g = h / d.heads_per_group;
  const int P = p.head_dim, N = p.state;
  const int p_tiles = (P + kTile - 1) / kTile;
  const int p0 = static_cast<int>(blockIdx.z % p_tiles) * kTile;
  const int n0 = static_cast<int>(blockIdx.z / p_tiles) * kTile;
  const int length = chunk.end - chunk.begin;
  const int tid = static_cast<int>(threadIdx.x);

  chunk_cumsum(p, d, chunk, h, delta, lambda);
  const float last = lambda[length - 1];  // Λ of the chunk's last token
  for (int idx = tid; idx < kQ * kTile; idx += kChunkThreads) {
    const int s = idx / kTile;
    const int c = idx % kTile;
    const bool token = s < length;
    const int64_t row = (chunk.begin + s) * d.conv_dim;
    xs[s][c] = token && p0 + c < P ? p.xbc[row + int64_t{h} * P + p0 + c] : 0.0f;
    const float weight = token ? expf(last - lambda[s]) * delta[s] : 0.0f;
    bs[s][c] = token && n0 + c < N ? p.xbc[row + d.d_ssm + int64_t{g} * N + n0 + c] * weight : 0.0f;
  }
  __syncthreads();

  const int ty = tid / 16, tx = tid % 16;
  float acc[4][4] = {};
  for (int s = 0; s < length; ++s) {
    const float4 xv = *reinterpret_cast<const float4*>(&xs[s][4 * ty]);
    const float4 bv = *reinterpret_cast<const float4*>(&bs[s][4 * tx]);
    const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
    const float ba[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xa[i], ba[j], acc[i][j]);
    }
  }
  float* out = p.chunk_states + (int64_t{blockIdx.x} * p.heads + h) * P * N;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = p0 + 4 * ty + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + 4 * tx + j;
      if (row < P && n < N) out[int64_t{row} * N + n] = acc[i][j];
    }
  }
  if (blockIdx.z == 0 && tid == 0) p.chunk_decay[int64_t{blockIdx.x} * p.heads + h] = expf(last);
}

// (2) State passing. Block = (a range of kPassThreads state elements of head blockIdx.y, sequence
// blockIdx.z), thread = element: H from the saved state (zeros without one), then chunk by chunk:
// chunk_states[c] ← H (the state entering chunk c), H ← decay_c·H + S_c, stored to the chunk's
// boundary slot if it has one; finally to write_slot. The thread reads its element of the saved
// state before writing any slot, so read_slot may be a slot it writes. Chunks go kPassBatch at a
// time: their decays and boundary slots staged once per block in shared memory (every thread of
// the grid needs the same few values: read per thread, they would queue on one L2 line), their
// S_c read by each thread before any is overwritten (one wait for memory per batch, not per chunk).
constexpr int kPassThreads = 256;
constexpr int kPassBatch = 8;

__global__ void __launch_bounds__(kPassThreads) state_passing_kernel(Mamba2Params p) {
  __shared__ float decay_smem[kPassBatch];
  __shared__ int32_t slot_smem[kPassBatch];
  const Mamba2Sequence sequence = p.sequences[blockIdx.z];
  const int h = static_cast<int>(blockIdx.y);
  const int64_t head_size = int64_t{p.head_dim} * p.state;
  const int64_t size = p.heads * head_size;
  const int64_t i = int64_t{blockIdx.x} * kPassThreads + threadIdx.x;  // element within the head
  const bool active = i < head_size;
  const int64_t e = int64_t{h} * head_size + i;
  float H = active && sequence.read_slot >= 0
                ? load_element(p.ssm_state.data, sequence.read_slot * p.ssm_state.slot_size + e, p.ssm_state.kind)
                : 0.0f;
  for (int32_t k0 = 0; k0 < sequence.num_chunks; k0 += kPassBatch) {
    const int32_t count = min(kPassBatch, sequence.num_chunks - k0);
    const int32_t first = sequence.first_chunk + k0;
    if (threadIdx.x < count) {
      decay_smem[threadIdx.x] = p.chunk_decay[int64_t{first + threadIdx.x} * p.heads + h];
      slot_smem[threadIdx.x] = p.chunks[first + threadIdx.x].boundary_slot;
    }
    float own[kPassBatch];
#pragma unroll
    for (int j = 0; j < kPassBatch; ++j) own[j] = active && j < count ? p.chunk_states[(first + j) * size + e] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPassBatch; ++j) {
      if (!active || j >= count) break;
      p.chunk_states[(first + j) * size + e] = H;
      H = fmaf(decay_smem[j], H, own[j]);
      const int32_t slot = slot_smem[j];
      if (slot >= 0) store_element(p.ssm_state.data, slot * p.ssm_state.slot_size + e, p.ssm_state.kind, H);
    }
    __syncthreads();  // the staged values are rewritten by the next batch
  }
  if (active) store_element(p.ssm_state.data, sequence.write_slot * p.ssm_state.slot_size + e, p.ssm_state.kind, H);
}

// (3) Outputs of a chunk for head blockIdx.y and P tile blockIdx.z: thread (ty, tx) owns rows
// t = 4·ty + i and columns p = p0 + 4·tx + j of y, and (step 1) columns s = 4·tx + j of C·Bᵀ.
//   1. over N in steps of kNStep: off[t, p] = Σ_n C_t[n]·H[p, n] and cb[t, s] = Σ_n C_t[n]·B_s[n];
//   2. M[t, s] = cb[t, s]·exp(Λ_t − Λ_s)·Δ_s for s ≤ t (else 0) → shared, x tile → shared;
//   3. diag[t, p] = Σ_s M[t, s]·x_s[p];
//   4. y = diag + exp(Λ_t)·off + D·x_t.
__global__ void __launch_bounds__(kChunkThreads) chunk_scan_kernel(Mamba2Params p) {
  __shared__ float delta[kQ], lambda[kQ];
  // Step 1 stages C, H and B transposed ([n][t], [n][p], [n][s]); steps 2–3 reuse the space for
  // M transposed ([s][t]) and x ([s][p]).
  __shared__ __align__(16) float tiles[2 * kQ * kPad];
  float (*ct)[kPad] = reinterpret_cast<float (*)[kPad]>(tiles);
  float (*ht)[kPad] = reinterpret_cast<float (*)[kPad]>(tiles + kNStep * kPad);
  float (*bt)[kPad] = reinterpret_cast<float (*)[kPad]>(tiles + 2 * kNStep * kPad);
  float (*mt)[kPad] = reinterpret_cast<float (*)[kPad]>(tiles);
  float (*xs)[kPad] = reinterpret_cast<float (*)[kPad]>(tiles + kQ * kPad);
  static_assert(3 * kNStep <= 2 * kQ, "chunk scan: the staging tiles fit the shared buffer");

  const Dims d = dims_of(p);
  const Mamba2Chunk chunk = p.chunks[blockIdx.x];
  const int h = static_cast<int>(blockIdx.y);
  const int g = h / d.heads_per_group;
  const int P = p.head_dim, N = p.state;
  const int p0 = static_cast<int>(blockIdx.z) * kTile;
  const int length = chunk.end - chunk.begin;
  const int tid = static_cast<int>(threadIdx.x);
  const int ty = tid / 16, tx = tid % 16;
  const float* H = p.chunk_states + (int64_t{blockIdx.x} * p.heads + h) * P * N;  // the state entering the chunk
  const int64_t b_col = d.d_ssm + int64_t{g} * N;
  const int64_t c_col = d.d_ssm + int64_t{p.groups} * N + int64_t{g} * N;

  chunk_cumsum(p, d, chunk, h, delta, lambda);

  float off[4][4] = {};
  float cb[4][4] = {};
  for (int nb = 0; nb < N; nb += kNStep) {
    for (int idx = tid; idx < kQ * kNStep; idx += kChunkThreads) {
      const int row = idx / kNStep;  // t, p or s
      const int n = idx % kNStep;
      const bool n_ok = nb + n < N;
      const bool token = row < length;
      const int64_t xbc_row = (chunk.begin + row) * d.conv_dim;
      ct[n][row] = token && n_ok ? p.xbc[xbc_row + c_col + nb + n] : 0.0f;
      bt[n][row] = token && n_ok ? p.xbc[xbc_row + b_col + nb + n] : 0.0f;
      ht[n][row] = p0 + row < P && n_ok ? H[int64_t{p0 + row} * N + nb + n] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int n = 0; n < kNStep; ++n) {
      const float4 cv = *reinterpret_cast<const float4*>(&ct[n][4 * ty]);
      const float4 hv = *reinterpret_cast<const float4*>(&ht[n][4 * tx]);
      const float4 bv = *reinterpret_cast<const float4*>(&bt[n][4 * tx]);
      const float ca[4] = {cv.x, cv.y, cv.z, cv.w};
      const float ha[4] = {hv.x, hv.y, hv.z, hv.w};
      const float ba[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          off[i][j] = fmaf(ca[i], ha[j], off[i][j]);
          cb[i][j] = fmaf(ca[i], ba[j], cb[i][j]);
        }
      }
    }
    __syncthreads();
  }

  // M (transposed: mt[s][t]) and the x tile.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 4 * ty + i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int s = 4 * tx + j;
      mt[s][t] = s <= t && t < length ? cb[i][j] * expf(lambda[t] - lambda[s]) * delta[s] : 0.0f;
    }
  }
  for (int idx = tid; idx < kQ * kTile; idx += kChunkThreads) {
    const int s = idx / kTile;
    const int c = idx % kTile;
    xs[s][c] = s < length && p0 + c < P ? p.xbc[(chunk.begin + s) * d.conv_dim + int64_t{h} * P + p0 + c] : 0.0f;
  }
  __syncthreads();

  float diag[4][4] = {};
  for (int s = 0; s < length; ++s) {
    const float4 mv = *reinterpret_cast<const float4*>(&mt[s][4 * ty]);
    const float4 xv = *reinterpret_cast<const float4*>(&xs[s][4 * tx]);
    const float ma[4] = {mv.x, mv.y, mv.z, mv.w};
    const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) diag[i][j] = fmaf(ma[i], xa[j], diag[i][j]);
    }
  }

  const float Dh = load_element(p.D.data, h, p.D.kind);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 4 * ty + i;
    if (t >= length) continue;
    const float carry_decay = expf(lambda[t]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = 4 * tx + j;
      if (p0 + col >= P) continue;
      const float value = fmaf(carry_decay, off[i][j], diag[i][j]);
      store_element(p.y.data, (chunk.begin + t) * p.y.row_stride + int64_t{h} * P + p0 + col, p.y.kind,
                    fmaf(Dh, xs[t][col], value));
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

}  // namespace

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
  const unsigned p_tiles = static_cast<unsigned>((p.head_dim + kTile - 1) / kTile);
  const unsigned n_tiles = static_cast<unsigned>((p.state + kTile - 1) / kTile);
  const dim3 chunk_grid(static_cast<unsigned>(p.num_chunks), static_cast<unsigned>(p.heads), p_tiles * n_tiles);
  chunk_state_kernel<<<chunk_grid, kChunkThreads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  const int64_t head_size = int64_t{p.head_dim} * p.state;
  const dim3 pass_grid(static_cast<unsigned>((head_size + kPassThreads - 1) / kPassThreads),
                       static_cast<unsigned>(p.heads), static_cast<unsigned>(p.num_sequences));
  state_passing_kernel<<<pass_grid, kPassThreads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  chunk_scan_kernel<<<dim3(static_cast<unsigned>(p.num_chunks), static_cast<unsigned>(p.heads), p_tiles),
                      kChunkThreads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_mamba2_gated_norm(const Mamba2NormParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.d_ssm == 0) return;
  const dim3 grid(static_cast<unsigned>(p.groups), static_cast<unsigned>(std::min<int64_t>(p.num_tokens, 65535)));
  gated_norm_kernel<<<grid, kNormThreads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
