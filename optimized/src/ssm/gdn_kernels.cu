// gdn on the GPU (gdn_kernels.h): the per-token preparation, the single-token decode update, the
// chunked WY prefill and the mode's gated RMSNorm. The math is reference/ssm/gdn.cpp's
// (../shared/notes/ssm-modes.md §1.4), in float32 throughout (IEEE expf/log1pf/sqrtf, no TF32):
//   q̂ = q·dk^-1/2 / sqrt(Σq² + 1e-6),  k̂ = k / sqrt(Σk² + 1e-6)             per key head
//   g = −exp(A_log)·softplus(a + dt_bias) (threshold 20),  α = e^g,  β = sigmoid(b)   per value head
//   per value head, V-major M [dv, dk]:  M ← α·M;  u = β·(v − M k̂);  M ← M + u k̂ᵀ;  o = M q̂
//
// Decodes (decode_kernel): bandwidth-bound. Each row of M (one value channel, dk contiguous
// states) is held by kLanes lanes of one 16-byte run each whatever the pool's element (4 float32
// or 8 16-bit states; streaming accesses, the kernel templated on the element), each lane group
// owns kDecodeRows rows (64 bytes in flight per thread), and every state load of the thread is
// issued as raw bits before the first is widened or stored: M is read and written exactly once;
// q̂, k̂, v, g, β are a few hundred bytes per head. The dots over k are per-lane partial sums (the
// lane's run in k order) joined by xor shuffles within the row's lanes, the trees of a thread's
// rows interleaved (a row's chain of dependent shuffles no longer waits for the previous row's).
//
// Prefills (fla's chunk_gated_delta_rule with chunk C = 64, V-major). Chunks never straddle a
// request and end after every block-boundary token (mamba_cache_mode all), so each boundary state
// is a chunk's exit state. Chunks are not aligned to absolute positions: any block size and any
// continuation position work, at the cost of chunks shorter than 64 around boundaries. With
// G_i the in-chunk inclusive cumsum of g and Γ_ij = e^(G_i − G_j) (j ≤ i, so ≤ 1):
//   (1) chunk_intra_kernel, per chunk × value head, parallel over all chunks of the wave:
//         A_ij = β_i·Γ_ij·(k̂_i·k̂_j) for j < i (strictly lower),  P_ij = (q̂_i·k̂_j)·Γ_ij for j ≤ i,
//         [W | U] = (I + A)^-1·[diag(β·e^G)·K | diag(β)·V]  by forward substitution, one column
//         per thread (no synchronisation inside the solve);
//   (2) chunk_state_kernel, per prefill × value head × tile of 32 rows of M, sequential over the
//       request's chunks (M's tile in shared memory, float32, entering from read_slot or zeros):
//         V_new = U − W·Mᵀ,   O = diag(e^G)·Q·Mᵀ + P·V_new,
//         M ← e^(G_n)·M + V_newᵀ·diag(e^(G_n − G_j))·K;
//       the exit state of a chunk ending at a boundary row goes to its slot, the last to write_slot.
// Every thread of (2) owns the same elements of M when loading, updating and storing them, so a
// slot read and written by one request (read_slot == write_slot) is safe. The products run on the
// CUDA cores in float32 (no tensor cores yet), each shared-memory value loaded feeding 8–32
// independent accumulators. Fixed summation orders, no atomics: bitwise reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "ssm/gdn_kernels.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr float kL2NormEps = 1e-6f;   // fla's l2norm_fwd, inside the square root
constexpr float kRmsNormEps = 1e-6f;  // Qwen3-Next's rms_norm_eps

__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

__device__ __forceinline__ int conv_dim(const GdnParams& p) { return 2 * p.Hk * p.dk + p.Hv * p.dv; }

// Sum over the `lanes` lanes of a group (a power of two ≤ 32, groups aligned within the warp); every
// lane of the warp must take part.
template <int kLanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// group_sum of each of x[0 … kCount) (the same sums), the kCount trees interleaved level by level.
template <int kLanes, int kCount>
__device__ __forceinline__ void group_sums(float (&x)[kCount]) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int s = 0; s < kCount; ++s) x[s] += __shfl_xor_sync(0xffffffffu, x[s], offset);
  }
}

// --- (1) preparation ------------------------------------------------------------------------------

// Block = token blockIdx.x of request blockIdx.y of the wave, 32·min(2·Hk, 32) threads: warp w
// normalises the vectors w, w + warps, … of the 2·Hk (q heads, then k heads) in place, each lane
// loading all of its elements before reducing (one memory round trip per vector, not one per
// element); threads then compute the Hv gates.
constexpr int kPrepareMaxThreads = 1024;
constexpr int kPerLane = kGdnMaxHeadDim / 32;  // elements of one vector per lane

__global__ void __launch_bounds__(kPrepareMaxThreads) prepare_kernel(GdnParams p) {
  const GpuRequest r = p.wave.requests[blockIdx.y];
  const int64_t t = int64_t{r.begin} + blockIdx.x;
  if (t >= r.end) return;  // past the request (empty entries: always)
  const int dk = p.dk;
  float* row = p.qkv + t * conv_dim(p);
  const int warps = static_cast<int>(blockDim.x) / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dk));
  for (int vec = warp; vec < 2 * p.Hk; vec += warps) {
    float* x = row + int64_t{vec} * dk;  // q_all is Hk·dk, k_all follows: vector `vec` starts at vec·dk
    float xs[kPerLane];
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) xs[s] = lane + 32 * s < dk ? x[lane + 32 * s] : 0.0f;
    float ss = 0.0f;
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) ss = fmaf(xs[s], xs[s], ss);
    ss = group_sum<32>(ss);
    const float factor = (vec < p.Hk ? q_scale : 1.0f) / sqrtf(ss + kL2NormEps);
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      if (lane + 32 * s < dk) x[lane + 32 * s] = xs[s] * factor;
    }
  }
  for (int h = static_cast<int>(threadIdx.x); h < p.Hv; h += static_cast<int>(blockDim.x)) {
    const float a = p.a[t * p.gate_stride + h];
    const float b = p.b[t * p.gate_stride + h];
    const float A = -expf(load_element(p.A_log.data, h, p.A_log.kind));
    p.g[t * p.Hv + h] = A * softplus(a + load_element(p.dt_bias.data, h, p.dt_bias.kind));
    p.beta[t * p.Hv + h] = sigmoid(b);
  }
}

// --- (2) decodes ----------------------------------------------------------------------------------

constexpr int kDecodeThreads = 256;

// A lane moves a run of kDecodeRun<T> consecutive k of a state row per access: 16 bytes whatever the
// pool's element T (float, __half, __nv_bfloat16): 4 float32 or 8 16-bit states. A lane group holds
// kDecodeRows rows: 64 bytes of state loads in flight per thread. Measured on an H100 at Qwen3-Next's
// sizes, 64 / 256 sequences (hybridtb_bench_linear): bfloat16 pools 85 / 88% of the copy bandwidth;
// 16-bit runs of 4 (8-byte accesses: twice the lanes, shuffles and loads per byte) 77 / 81%, and
// 60 / 62% before the rows' shuffle trees were interleaved; 8 rows of runs of 8 no faster.
template <typename T>
inline constexpr int kDecodeRun = 16 / static_cast<int>(sizeof(T));
template <typename T>
inline constexpr int kDecodeRows = 4;
template <typename T>
using RunBits = std::conditional_t<kDecodeRun<T> * sizeof(T) == 16, uint4, uint2>;

// Elements [e, e + kDecodeRun<T>) of the pool as their raw bits, streaming (evict-first: each state
// is read once); the caller checked the vector access (run-aligned).
template <typename T>
__device__ __forceinline__ RunBits<T> load_run_bits(const PoolRef& pool, int64_t e) {
  return __ldcs(reinterpret_cast<const RunBits<T>*>(static_cast<const T*>(pool.data) + e));
}
template <typename T>
__device__ __forceinline__ void widen_run(const RunBits<T>& raw, float (&x)[kDecodeRun<T>]) {
  T elements[kDecodeRun<T>];
  memcpy(elements, &raw, sizeof(raw));
#pragma unroll
  for (int s = 0; s < kDecodeRun<T>; ++s) x[s] = element_to_float(elements[s]);
}
// Elements [e, e + kDecodeRun<T>) of the pool ← x rounded to T (RNE, as store_element), streaming.
template <typename T>
__device__ __forceinline__ void store_run_bits(const PoolRef& pool, int64_t e, const float (&x)[kDecodeRun<T>]) {
  const ElementVec<T, kDecodeRun<T>> packed = pack_elements<T, kDecodeRun<T>>(x);
  RunBits<T> raw;
  memcpy(&raw, &packed, sizeof(raw));
  __stcs(reinterpret_cast<RunBits<T>*>(static_cast<T*>(pool.data) + e), raw);
}

// Elements [k0, k0 + kRun) of a float32 activation row (past `valid`: 0), 16-byte loads where
// `vec` (k0 4-aligned) and the quad is whole.
template <int kRun>
__device__ __forceinline__ void load_row_run(const float* row, int k0, int valid, bool vec, float (&x)[kRun]) {
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

// Block = tile blockIdx.x % tiles of value head blockIdx.x / tiles of wave entry blockIdx.y, pool
// element T. Lane group (kLanes lanes of kRun = kDecodeRun<T> consecutive k each: kLanes ≥ dk / kRun)
// j of the block owns rows tile·kRowsPerBlock + j + kGroups·s, s < kDecodeRows<T> (consecutive
// groups on consecutive rows: a warp reads contiguous memory). With the vector path (dk and the
// slot size multiples of kRun, the pool 16-byte aligned) every state load of the thread is issued as
// raw bits before any is widened; otherwise the states move element by element.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(GdnParams p, int tiles) {
  constexpr int kRun = kDecodeRun<T>;
  constexpr int kRows = kDecodeRows<T>;
  constexpr int kGroups = kDecodeThreads / kLanes;
  constexpr int kRowsPerBlock = kGroups * kRows;
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (!r.decode || r.end <= r.begin) return;  // uniform over the block: empty entries and prefills
  const int h = static_cast<int>(blockIdx.x) / tiles;
  const int tile = static_cast<int>(blockIdx.x) % tiles;
  const int lane = static_cast<int>(threadIdx.x) % kLanes;
  const int group = static_cast<int>(threadIdx.x) / kLanes;
  const int dk = p.dk, dv = p.dv;
  const int hk = h / (p.Hv / p.Hk);
  const int64_t t = r.begin;
  const float* row = p.qkv + t * conv_dim(p);
  const float* q_row = row + int64_t{hk} * dk;
  const float* k_row = row + int64_t{p.Hk + hk} * dk;
  const float* v_row = row + 2 * int64_t{p.Hk} * dk + int64_t{h} * dv;
  const int k0 = kRun * lane;
  const int valid = max(0, min(kRun, dk - k0));
  const bool row_vec = (dk % 4) == 0 && (conv_dim(p) % 4) == 0 && aligned16(p.qkv);
  const PoolRef& pool = p.recurrent_state;
  const bool pool_vec = (dk % kRun) == 0 && (pool.slot_size % kRun) == 0 && aligned16(pool.data);

  // Every load first: the state rows, then q̂, k̂, v and the gates.
  float m[kRows][kRun];
  float v[kRows];
  if (pool_vec) {
    RunBits<T> raw[kRows];
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const int i = tile * kRowsPerBlock + group + kGroups * s;
      const int64_t e = (int64_t{h} * dv + i) * dk + k0;
      raw[s] = i < dv && valid > 0 && r.read_slot >= 0 ? load_run_bits<T>(pool, r.read_slot * pool.slot_size + e)
                                                       : RunBits<T>{};  // zeros in every element kind
      v[s] = i < dv ? v_row[i] : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < kRows; ++s) widen_run<T>(raw[s], m[s]);
  } else {
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const int i = tile * kRowsPerBlock + group + kGroups * s;
      const int64_t e = r.read_slot * pool.slot_size + (int64_t{h} * dv + i) * dk + k0;
#pragma unroll
      for (int c = 0; c < kRun; ++c) {
        m[s][c] = i < dv && c < valid && r.read_slot >= 0 ? load_element(pool.data, e + c, pool.kind) : 0.0f;
      }
      v[s] = i < dv ? v_row[i] : 0.0f;
    }
  }
  float q[kRun], k[kRun];
  load_row_run<kRun>(q_row, k0, valid, row_vec, q);
  load_row_run<kRun>(k_row, k0, valid, row_vec, k);
  const float alpha = expf(p.g[t * p.Hv + h]);
  const float beta = p.beta[t * p.Hv + h];

  // Each row's two dots over k: the lane's partial sums in k order, then group_sum's xor tree, run
  // for all the thread's rows at once (group_sums) so that their shuffles overlap instead of
  // queueing row after row. The state is stored as soon as it is final.
  float predicted[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    predicted[s] = 0.0f;
#pragma unroll
    for (int c = 0; c < kRun; ++c) {
      m[s][c] *= alpha;
      predicted[s] = fmaf(m[s][c], k[c], predicted[s]);
    }
  }
  group_sums<kLanes, kRows>(predicted);
  float read[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int i = tile * kRowsPerBlock + group + kGroups * s;
    const float correction = beta * (v[s] - predicted[s]);
    read[s] = 0.0f;
#pragma unroll
    for (int c = 0; c < kRun; ++c) {
      m[s][c] = fmaf(correction, k[c], m[s][c]);
      read[s] = fmaf(m[s][c], q[c], read[s]);
    }
    if (i < dv && valid > 0) {
      const int64_t e = r.write_slot * pool.slot_size + (int64_t{h} * dv + i) * dk + k0;
      if (pool_vec) {
        store_run_bits<T>(pool, e, m[s]);
      } else {
#pragma unroll
        for (int c = 0; c < kRun; ++c) {
          if (c < valid) store_element(pool.data, e + c, pool.kind, m[s][c]);
        }
      }
    }
  }
  group_sums<kLanes, kRows>(read);
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const int i = tile * kRowsPerBlock + group + kGroups * s;
      if (i < dv) p.o[t * p.Hv * dv + int64_t{h} * dv + i] = read[s];
    }
  }
}

// --- (3) prefills: the chunked WY form --------------------------------------------------------------

constexpr int kC = kGdnChunk;
constexpr int kChunkThreads = 256;
constexpr int kTileRows = 32;  // rows of M per block of the state pass

// Shared memory of chunk_intra_kernel (floats): K, Q [C][dk + 1], V [C][dv + 1], A [C][C + 1], G, β [C]
// (rows padded by one float: a warp reading one column of 32 rows hits 32 banks).
size_t intra_smem_bytes(int dk, int dv) {
  return sizeof(float) * (size_t{kC} * (2 * (dk + 1) + (dv + 1) + (kC + 1)) + 2 * kC);
}

// Block = chunk blockIdx.x × value head blockIdx.y.
__global__ void __launch_bounds__(kChunkThreads) chunk_intra_kernel(GdnParams p) {
  const GdnChunk chunk = p.chunks[blockIdx.x];
  const int h = static_cast<int>(blockIdx.y);
  const int n = chunk.end - chunk.begin;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int hk = h / (Hv / p.Hk);
  const int ks = dk + 1, vs = dv + 1, as = kC + 1;
  const int tid = static_cast<int>(threadIdx.x);
  extern __shared__ float smem[];
  float* K = smem;
  float* Q = K + kC * ks;
  float* V = Q + kC * ks;
  float* A = V + kC * vs;
  float* G = A + kC * as;
  float* B = G + kC;

  for (int e = tid; e < n * dk; e += kChunkThreads) {
    const int i = e / dk, c = e % dk;
    const float* row = p.qkv + int64_t{chunk.begin + i} * conv_dim(p);
    Q[i * ks + c] = row[int64_t{hk} * dk + c];
    K[i * ks + c] = row[int64_t{p.Hk + hk} * dk + c];
  }
  for (int e = tid; e < n * dv; e += kChunkThreads) {
    const int i = e / dv, c = e % dv;
    V[i * vs + c] = p.qkv[int64_t{chunk.begin + i} * conv_dim(p) + 2 * int64_t{p.Hk} * dk + int64_t{h} * dv + c];
  }
  if (tid == 0) {  // the in-chunk inclusive cumsum of g, in token order
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
      acc += p.g[int64_t{chunk.begin + i} * Hv + h];
      G[i] = acc;
    }
  }
  for (int i = tid; i < n; i += kChunkThreads) B[i] = p.beta[int64_t{chunk.begin + i} * Hv + h];
  __syncthreads();

  // A (strictly lower) and P (lower with the diagonal; rows of the chunk, zeros above). The thread
  // takes column j = tid mod C and rows i = tid / C + 4s: each k̂_j[c] loaded feeds 2·kPairRows
  // independent products (a warp: one row i, 32 consecutive j). Pairs past the chunk's n tokens
  // read stale rows and are dropped.
  {
    constexpr int kRowStep = kChunkThreads / kC;
    constexpr int kPairRows = kC / kRowStep;
    const int j = tid % kC;
    const int i0 = tid / kC;
    float kk[kPairRows], qk[kPairRows];
#pragma unroll
    for (int s = 0; s < kPairRows; ++s) kk[s] = qk[s] = 0.0f;
    for (int c = 0; c < dk; ++c) {
      const float kj = K[j * ks + c];
#pragma unroll
      for (int s = 0; s < kPairRows; ++s) {
        const int i = i0 + kRowStep * s;
        kk[s] = fmaf(K[i * ks + c], kj, kk[s]);
        qk[s] = fmaf(Q[i * ks + c], kj, qk[s]);
      }
    }
#pragma unroll
    for (int s = 0; s < kPairRows; ++s) {
      const int i = i0 + kRowStep * s;
      float a = 0.0f, attn = 0.0f;
      if (i < n && j <= i) {
        const float decay = expf(G[i] - G[j]);
        if (j < i) a = B[i] * decay * kk[s];
        attn = qk[s] * decay;
      }
      A[i * as + j] = a;
      if (i < n) p.attn[(int64_t{chunk.begin + i} * Hv + h) * kC + j] = attn;
    }
  }
  __syncthreads();

  // The right-hand sides, in place: K_i ← β_i·e^(G_i)·K_i, V_i ← β_i·V_i.
  for (int e = tid; e < n * dk; e += kChunkThreads) {
    const int i = e / dk, c = e % dk;
    K[i * ks + c] *= B[i] * expf(G[i]);
  }
  for (int e = tid; e < n * dv; e += kChunkThreads) {
    const int i = e / dv, c = e % dv;
    V[i * vs + c] *= B[i];
  }
  __syncthreads();

  // (I + A)·X = rhs by forward substitution, column `col` of [W | U] per thread, in place:
  // X_i = rhs_i − Σ_{j<i} A_ij·X_j (A_ij is the same for the whole warp: a broadcast).
  for (int col = tid; col < dk + dv; col += kChunkThreads) {
    float* x = col < dk ? K + col : V + (col - dk);
    const int stride = col < dk ? ks : vs;
    for (int i = 1; i < n; ++i) {
      float acc = x[i * stride];
      for (int j = 0; j < i; ++j) acc = fmaf(-A[i * as + j], x[j * stride], acc);
      x[i * stride] = acc;
    }
  }
  __syncthreads();

  for (int e = tid; e < n * dk; e += kChunkThreads) {
    const int i = e / dk, c = e % dk;
    p.w[(int64_t{chunk.begin + i} * Hv + h) * dk + c] = K[i * ks + c];
  }
  for (int e = tid; e < n * dv; e += kChunkThreads) {
    const int i = e / dv, c = e % dv;
    p.u[(int64_t{chunk.begin + i} * Hv + h) * dv + c] = V[i * vs + c];
  }
  for (int i = tid; i < n; i += kChunkThreads) p.gcum[int64_t{chunk.begin + i} * Hv + h] = G[i];
}

// Shared memory of chunk_state_kernel (floats): M [32][dk + 1], W, Q, K [C][dk + 1],
// V_new [C][33], P [C][C + 1], G and the exit decays e^(G_n − G_j) [C].
size_t state_smem_bytes(int dk) {
  return sizeof(float) *
         (size_t{kTileRows} * (dk + 1) + size_t{3} * kC * (dk + 1) + size_t{kC} * (kTileRows + 1) +
          size_t{kC} * (kC + 1) + 2 * kC);
}

// Elements of a block's [kC, kTileRows] outputs (V_new, O) per thread: tokens kTokenStep apart.
constexpr int kTokenStep = kChunkThreads / kTileRows;
constexpr int kOutPerThread = kC / kTokenStep;
static_assert(kChunkThreads % kTileRows == 0 && kC % kTokenStep == 0, "the chunk × tile outputs split evenly");
// M's [kTileRows, dk] tile over the block: column tid mod 128, rows tid / 128 + 2s.
constexpr int kStateCols = kGdnMaxHeadDim;
constexpr int kStateRowStep = kChunkThreads / kStateCols;
constexpr int kStatePerThread = kTileRows / kStateRowStep;
static_assert(kChunkThreads % kStateCols == 0 && kTileRows % kStateRowStep == 0, "M's tile splits evenly");

// Block = tile blockIdx.x % tiles of value head blockIdx.x / tiles of prefill blockIdx.y.
__global__ void __launch_bounds__(kChunkThreads) chunk_state_kernel(GdnParams p, int tiles) {
  const GdnPrefill prefill = p.prefills[blockIdx.y];
  const GpuRequest r = p.wave.requests[prefill.request];
  const int h = static_cast<int>(blockIdx.x) / tiles;
  const int v0 = (static_cast<int>(blockIdx.x) % tiles) * kTileRows;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int rows = min(kTileRows, dv - v0);
  const int hk = h / (Hv / p.Hk);
  const int ks = dk + 1, ns = kTileRows + 1, as = kC + 1;
  const int tid = static_cast<int>(threadIdx.x);
  extern __shared__ float smem[];
  float* M = smem;
  float* W = M + kTileRows * ks;
  float* Q = W + kC * ks;
  float* K = Q + kC * ks;
  float* Vn = K + kC * ks;
  float* P = Vn + kC * ns;
  float* G = P + kC * as;
  float* D = G + kC;

  // M's tile: the thread owns column mc of rows mv0 + kStateRowStep·s throughout (loads, updates,
  // stores); threads with mc ≥ dk own nothing.
  const PoolRef& pool = p.recurrent_state;
  const int64_t tile_offset = (int64_t{h} * dv + v0) * dk;  // within a slot: rows v0 … of head h
  const int mc = tid % kStateCols;
  const int mv0 = tid / kStateCols;
  const bool owns = mc < dk;
  if (owns) {
#pragma unroll
    for (int s = 0; s < kStatePerThread; ++s) {
      const int v = mv0 + kStateRowStep * s;
      const int64_t e = tile_offset + v * dk + mc;
      const bool saved = v < rows && r.read_slot >= 0;
      M[v * ks + mc] = saved ? load_element(pool.data, r.read_slot * pool.slot_size + e, pool.kind) : 0.0f;
    }
  }

  for (int ci = prefill.first_chunk; ci < prefill.first_chunk + prefill.num_chunks; ++ci) {
    const GdnChunk chunk = p.chunks[ci];
    const int n = chunk.end - chunk.begin;
    __syncthreads();  // the previous chunk is done with the chunk buffers (and M's loads are in)
    for (int e = tid; e < n * dk; e += kChunkThreads) {
      const int i = e / dk, c = e % dk;
      const int64_t t = chunk.begin + i;
      const float* row = p.qkv + t * conv_dim(p);
      W[i * ks + c] = p.w[(t * Hv + h) * dk + c];
      Q[i * ks + c] = row[int64_t{hk} * dk + c];
      K[i * ks + c] = row[int64_t{p.Hk + hk} * dk + c];
    }
    for (int e = tid; e < kC * kTileRows; e += kChunkThreads) {
      const int i = e / kTileRows, v = e % kTileRows;
      Vn[i * ns + v] = i < n && v < rows ? p.u[(int64_t{chunk.begin + i} * Hv + h) * dv + v0 + v] : 0.0f;
    }
    for (int e = tid; e < n * kC; e += kChunkThreads) {
      const int i = e / kC, j = e % kC;
      P[i * as + j] = p.attn[(int64_t{chunk.begin + i} * Hv + h) * kC + j];
    }
    for (int i = tid; i < n; i += kChunkThreads) G[i] = p.gcum[int64_t{chunk.begin + i} * Hv + h];
    __syncthreads();
    for (int j = tid; j < n; j += kChunkThreads) D[j] = expf(G[n - 1] - G[j]);

    // V_new = U − W·Mᵀ and the entry state's part of O, e^(G_i)·(M q̂_i), for the thread's elements
    // (i, v): row v = tid mod 32 of the tile, tokens i = tid / 32 + 8s, so each M value loaded feeds
    // 2·kOutPerThread independent products (a warp: one token, 32 consecutive rows). Tokens past
    // the chunk's n read stale rows and are dropped.
    const int v = tid % kTileRows;
    const int i0 = tid / kTileRows;
    float wm[kOutPerThread], qm[kOutPerThread];
#pragma unroll
    for (int s = 0; s < kOutPerThread; ++s) wm[s] = qm[s] = 0.0f;
    for (int c = 0; c < dk; ++c) {
      const float mv = M[v * ks + c];
#pragma unroll
      for (int s = 0; s < kOutPerThread; ++s) {
        const int i = i0 + kTokenStep * s;
        wm[s] = fmaf(W[i * ks + c], mv, wm[s]);
        qm[s] = fmaf(Q[i * ks + c], mv, qm[s]);
      }
    }
    float acc[kOutPerThread];
#pragma unroll
    for (int s = 0; s < kOutPerThread; ++s) {
      const int i = i0 + kTokenStep * s;
      acc[s] = i < n ? expf(G[i]) * qm[s] : 0.0f;
      wm[s] = i < n ? Vn[i * ns + v] - wm[s] : 0.0f;  // V_new
    }
    __syncthreads();  // every U and M read; D written
#pragma unroll
    for (int s = 0; s < kOutPerThread; ++s) Vn[(i0 + kTokenStep * s) * ns + v] = wm[s];
    __syncthreads();

    // O_i = e^(G_i)·M q̂_i + Σ_{j≤i} P_ij·V_new_j (j ascending), the same elements.
    for (int j = 0; j < n; ++j) {
      const float vn = Vn[j * ns + v];
#pragma unroll
      for (int s = 0; s < kOutPerThread; ++s) {
        const int i = i0 + kTokenStep * s;
        if (j <= i) acc[s] = fmaf(P[i * as + j], vn, acc[s]);
      }
    }
#pragma unroll
    for (int s = 0; s < kOutPerThread; ++s) {
      const int i = i0 + kTokenStep * s;
      if (i < n && v < rows) p.o[int64_t{chunk.begin + i} * Hv * dv + int64_t{h} * dv + v0 + v] = acc[s];
    }

    // The exit state: M ← e^(G_n)·M + Σ_j V_new_j e^(G_n − G_j) k̂_jᵀ (j ascending), the thread's own
    // elements: one e^(G_n − G_j)·k̂_j[mc] per j feeds kStatePerThread products.
    const int32_t boundary = p.boundary_slot != nullptr ? p.boundary_slot[chunk.end - 1] : -1;
    if (owns) {
      const float exit_decay = expf(G[n - 1]);
      float m_new[kStatePerThread];
#pragma unroll
      for (int s = 0; s < kStatePerThread; ++s) m_new[s] = exit_decay * M[(mv0 + kStateRowStep * s) * ks + mc];
      for (int j = 0; j < n; ++j) {
        const float dk_j = D[j] * K[j * ks + mc];
#pragma unroll
        for (int s = 0; s < kStatePerThread; ++s) {
          m_new[s] = fmaf(Vn[j * ns + mv0 + kStateRowStep * s], dk_j, m_new[s]);
        }
      }
#pragma unroll
      for (int s = 0; s < kStatePerThread; ++s) {
        const int v = mv0 + kStateRowStep * s;
        M[v * ks + mc] = m_new[s];
        if (boundary >= 0 && v < rows) {
          store_element(pool.data, boundary * pool.slot_size + tile_offset + v * dk + mc, pool.kind, m_new[s]);
        }
      }
    }
  }
  if (owns) {
#pragma unroll
    for (int s = 0; s < kStatePerThread; ++s) {
      const int v = mv0 + kStateRowStep * s;
      if (v < rows) {
        store_element(pool.data, r.write_slot * pool.slot_size + tile_offset + v * dk + mc, pool.kind, M[v * ks + mc]);
      }
    }
  }
}

// --- (4) the gated RMSNorm -------------------------------------------------------------------------

constexpr int kNormThreads = 128;

// Warp = value head (blockIdx.x·4 + warp) of token rows blockIdx.y, blockIdx.y + gridDim.y, ….
__global__ void __launch_bounds__(kNormThreads) gated_norm_kernel(const float* o, const float* z, int64_t z_stride,
                                                                  WeightRef norm_weight, float* y, int32_t Hv,
                                                                  int32_t dv, int64_t num_tokens,
                                                                  const int32_t* flags) {
  const int h = static_cast<int>(blockIdx.x) * (kNormThreads / 32) + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (h >= Hv) return;  // whole warps
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    if (flags[t] != kRowActive) continue;
    const float* o_h = o + (t * Hv + h) * dv;
    float ss = 0.0f;
    for (int i = lane; i < dv; i += 32) ss += o_h[i] * o_h[i];
    ss = group_sum<32>(ss);
    const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(dv) + kRmsNormEps);
    for (int i = lane; i < dv; i += 32) {
      const float gate = silu(z[t * z_stride + int64_t{h} * dv + i]);
      y[(t * Hv + h) * dv + i] = o_h[i] * inv_rms * load_element(norm_weight.data, i, norm_weight.kind) * gate;
    }
  }
}

// The decode kernel for the pool's element T and lanes per state row (a power of two ≥ dk / kRun, ≤ 32).
template <typename T, int kLanes>
void launch_decode(const GdnParams& p, int32_t entries, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kDecodeThreads / kLanes * kDecodeRows<T>;
  const int tiles = (p.dv + kRowsPerBlock - 1) / kRowsPerBlock;
  decode_kernel<T, kLanes><<<dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(entries)),
                             kDecodeThreads, 0, stream>>>(p, tiles);
}

template <typename T>
void launch_decode_of(const GdnParams& p, int32_t entries, cudaStream_t stream) {
  const int runs = (p.dk + kDecodeRun<T> - 1) / kDecodeRun<T>;
  if (runs <= 1) {
    launch_decode<T, 1>(p, entries, stream);
  } else if (runs <= 2) {
    launch_decode<T, 2>(p, entries, stream);
  } else if (runs <= 4) {
    launch_decode<T, 4>(p, entries, stream);
  } else if (runs <= 8) {
    launch_decode<T, 8>(p, entries, stream);
  } else if (runs <= 16) {
    launch_decode<T, 16>(p, entries, stream);
  } else if constexpr (kDecodeRun<T> * 16 < kGdnMaxHeadDim) {
    launch_decode<T, 32>(p, entries, stream);  // float32 runs of 4: dk ≤ kGdnMaxHeadDim = 128
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

void launch_gdn_prepare(const GdnParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.wave.max_tokens == 0) return;
  const int threads = 32 * std::clamp(2 * p.Hk, 1, kPrepareMaxThreads / 32);
  prepare_kernel<<<dim3(static_cast<unsigned>(p.wave.max_tokens), static_cast<unsigned>(p.wave.num_requests)),
                   threads, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_gdn_decode(const GdnParams& p, cudaStream_t stream) {
  const int32_t entries = std::min(p.decode_end, p.wave.num_requests);
  if (entries <= 0) return;
  switch (p.recurrent_state.kind) {
    case ElementKind::kFloat32: launch_decode_of<float>(p, entries, stream); break;
    case ElementKind::kFloat16: launch_decode_of<__half>(p, entries, stream); break;
    default: launch_decode_of<__nv_bfloat16>(p, entries, stream); break;
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_gdn_prefill(const GdnParams& p, cudaStream_t stream) {
  if (p.num_prefills == 0 || p.num_chunks == 0) return;
  const size_t intra_smem = intra_smem_bytes(p.dk, p.dv);
  allow_smem(chunk_intra_kernel, intra_smem);
  chunk_intra_kernel<<<dim3(static_cast<unsigned>(p.num_chunks), static_cast<unsigned>(p.Hv)), kChunkThreads,
                       intra_smem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  const size_t state_smem = state_smem_bytes(p.dk);
  allow_smem(chunk_state_kernel, state_smem);
  const int tiles = (p.dv + kTileRows - 1) / kTileRows;
  chunk_state_kernel<<<dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(p.num_prefills)),
                       kChunkThreads, state_smem, stream>>>(p, tiles);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_gdn_gated_norm(const float* o, const float* z, int64_t z_stride, WeightRef norm_weight, float* y,
                           int32_t Hv, int32_t dv, int64_t num_tokens, const int32_t* flags, cudaStream_t stream) {
  if (num_tokens <= 0) return;
  constexpr int kHeadsPerBlock = kNormThreads / 32;
  const dim3 grid(static_cast<unsigned>((Hv + kHeadsPerBlock - 1) / kHeadsPerBlock),
                  static_cast<unsigned>(std::min<int64_t>(num_tokens, 65535)));
  gated_norm_kernel<<<grid, kNormThreads, 0, stream>>>(o, z, z_stride, norm_weight, y, Hv, dv, num_tokens, flags);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
