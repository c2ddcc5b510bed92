// gdn on the GPU (gdn_kernels.h): the per-token preparation, the single-token decode update and the
// mode's gated RMSNorm; the chunked WY prefill is gdn_prefill.cu. The math is reference/ssm/gdn.cpp's,
// in float32 (IEEE expf/log1pf/sqrtf):
//   q̂ = q·dk^-1/2 / sqrt(Σq² + 1e-6),  k̂ = k / sqrt(Σk² + 1e-6)             per key head
//   g = −exp(A_log)·softplus(a + dt_bias) (threshold 20),  α = e^g,  β = sigmoid(b)   per value head
//   per value head, V-major M [dv, dk]:  M ← α·M;  u = β·(v − M k̂);  M ← M + u k̂ᵀ;  o = M q̂
//
// Decodes (decode_kernel): bandwidth-bound. Each row of M (one value channel, dk contiguous
// states) is held by kLanes lanes of one 16-byte run each whatever the pool's element (4 float32
// or 8 16-bit states; streaming accesses, the kernel templated on the element), each lane group
// owns kDecodeRows rows (64 bytes in flight per thread), and every state load of the thread is
// issued as raw bits before the first is widened or stored: M is read and written exactly once;
// q̂, k̂, v, g, β are a few hundred bytes per head. The rows stay raw bits until used (widened in each
// of the two passes: a 16-bit pool's thread holds 16 registers of rows instead of 32). The dots over
// k are per-lane partial sums (the lane's run in k order) joined over the row's lanes by shuffles
// that exchange half of the rows at each level (common/group_sums.cuh), α taken out of the
// prediction's sum (α·(M·k̂): one multiply per row, not per state).
// The preparation is launched as a programmatic dependent of the conv and the decode update as one
// of the preparation (common/pdl.cuh): the preparation's launch overlaps the conv's tail, and the
// decode's state and v loads go out while the preparation still runs (it waits for the preparation
// only before reading q̂, k̂ and the gates). The preparation runs in
// two grids, one block per decode token and max_tokens × prefills for the prefills' rows, so that a
// long prefill does not spread empty blocks over every decode of its wave.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/group_sums.cuh"
#include "common/pdl.cuh"
#include "ssm/activations.cuh"
#include "ssm/gdn_kernels.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr float kL2NormEps = 1e-6f;   // fla's l2norm_fwd, inside the square root

// --- (1) preparation ------------------------------------------------------------------------------

// Block = token blockIdx.x of one request of the wave, 32·min(2·Hk, 32) threads: warp w normalises
// the vectors w, w + warps, … of the 2·Hk (q heads, then k heads) in place, each lane loading all of
// its elements before reducing (one memory round trip per vector, not one per element); threads
// then compute the Hv gates. The request is wave entry blockIdx.y (the decodes' grid) or the wave's
// prefill blockIdx.y (the prefills' grid): launch_gdn_prepare launches one grid each, so that a long
// prefill does not spread a column of empty blocks over every decode of its wave.
constexpr int kPrepareMaxThreads = 1024;
constexpr int kPerLane = kGdnMaxHeadDim / 32;  // elements of one vector per lane

__global__ void __launch_bounds__(kPrepareMaxThreads) prepare_kernel(GdnParams p, bool prefills) {
  // Launched as a dependent of the conv (pdl.cuh): its launch overlaps the conv's tail. The decode
  // update after it may start once every block of this grid is past the wait, i.e. once the conv
  // has completed: the decode then reads the pool and the conv's v before waiting for this grid.
  pdl_wait_for_predecessor();
  pdl_allow_dependents();
  const int32_t entry = prefills ? p.prefills[blockIdx.y].request : static_cast<int32_t>(blockIdx.y);
  const GpuRequest r = p.wave.requests[entry];
  const int64_t t = int64_t{r.begin} + blockIdx.x;
  if (t >= r.end || (!prefills && !r.decode)) return;  // past the request (empty entries: always); prefills: their grid
  const int dk = p.dk;
  float* row = p.qkv + t * gdn_conv_dim(p);
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
    const float a = load_element(p.a.data, t * p.a.row_stride + h, p.a.kind);
    const float b = load_element(p.b.data, t * p.b.row_stride + h, p.b.kind);
    const float A = -expf(load_element(p.A_log.data, h, p.A_log.kind));
    p.g[t * p.Hv + h] = A * softplus(a + load_element(p.dt_bias.data, h, p.dt_bias.kind));
    p.beta[t * p.Hv + h] = sigmoid(b);
  }
}

// --- (2) decodes ----------------------------------------------------------------------------------

constexpr int kDecodeThreads = 256;

// A lane moves a run of kPoolRun<T> consecutive k of a state row per access (pool_quads.cuh): 16 bytes
// whatever the pool's element T (float, __half, __nv_bfloat16): 4 float32 or 8 16-bit states. A lane group holds
// kDecodeRows rows: 64 bytes of state loads in flight per thread, which keeps the memory system busy
// enough for the update to run near the copy bandwidth without spilling registers.
template <typename T>
inline constexpr int kDecodeRows = 4;

// Block = tile blockIdx.x % tiles of value head blockIdx.x / tiles of wave entry blockIdx.y, pool
// element T. Lane group (kLanes lanes of kRun = kPoolRun<T> consecutive k each: kLanes ≥ dk / kRun)
// j of the block owns rows tile·kRowsPerBlock + j + kGroups·s, s < kDecodeRows<T> (consecutive
// groups on consecutive rows: a warp reads contiguous memory). With the vector path (dk and the
// slot size multiples of kRun, the pool 16-byte aligned) every state load of the thread is issued as
// raw bits before any is widened; otherwise the states move element by element.
template <typename T, int kLanes>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(GdnParams p, int tiles) {
  constexpr int kRun = kPoolRun<T>;
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
  const float* row = p.qkv + t * gdn_conv_dim(p);
  const float* q_row = row + int64_t{hk} * dk;
  const float* k_row = row + int64_t{p.Hk + hk} * dk;
  const float* v_row = row + 2 * int64_t{p.Hk} * dk + int64_t{h} * dv;
  const int k0 = kRun * lane;
  const int valid = max(0, min(kRun, dk - k0));
  const bool row_vec = (dk % 4) == 0 && (gdn_conv_dim(p) % 4) == 0 && aligned16(p.qkv);
  const PoolRef& pool = p.recurrent_state;
  const bool pool_vec = (dk % kRun) == 0 && (pool.slot_size % kRun) == 0 && aligned16(pool.data);

  // Every load first: the state rows and v, then q̂, k̂ and the gates. The preparation in flight
  // (pdl.cuh) writes neither the pool nor v (the conv has completed: the preparation lets this grid
  // start only after its own wait for the conv), so those go out before the wait; q̂, k̂ and the
  // gates are the preparation's. The rows stay raw bits (16 bytes each) and are widened where used,
  // twice: widening is an integer instruction or two per pair, and holding a 16-bit row as float32
  // would double its registers (80 registers per thread: 3 resident blocks per SM instead of 4).
  uint4 raw[kRows];
  float v[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int i = tile * kRowsPerBlock + group + kGroups * s;
    const bool live = i < dv && valid > 0 && r.read_slot >= 0;
    const int64_t e = r.read_slot * pool.slot_size + (int64_t{h} * dv + i) * dk + k0;
    raw[s] = live ? load_pool_run<T>(pool, e, valid, pool_vec) : uint4{};  // zeros in every element kind
    v[s] = i < dv ? v_row[i] : 0.0f;
  }
  pdl_wait_for_predecessor();
  float q[kRun], k[kRun];
  load_float_run<kRun>(q_row, k0, valid, row_vec, q);
  load_float_run<kRun>(k_row, k0, valid, row_vec, k);
  const float alpha = expf(p.g[t * p.Hv + h]);
  const float beta = p.beta[t * p.Hv + h];

  // The prediction (α·M)·k̂ = α·(M·k̂) of every row: the lane's partial sums in k order, then the
  // group's sums (group_sums.cuh: scattered over the lanes, then gathered, fewer shuffles than a
  // tree per row); the same value in every lane of the group.
  float predicted[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    float m[kRun];
    widen_pool_run<T>(raw[s], m);
    predicted[s] = 0.0f;
#pragma unroll
    for (int c = 0; c < kRun; ++c) predicted[s] = fmaf(m[c], k[c], predicted[s]);
  }
  group_sums_all<kLanes, kRows>(predicted);

  // The update M ← α·M + β·(v − α·M·k̂)·k̂ᵀ row by row, stored as soon as it is final, and the
  // read-out partial sums M·q̂. The raw rows pass through an empty asm first so that the compiler
  // widens them again here instead of keeping the first pass's floats alive.
  float read[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int i = tile * kRowsPerBlock + group + kGroups * s;
    const float correction = beta * (v[s] - alpha * predicted[s]);
    uint4 bits = raw[s];
    asm("" : "+r"(bits.x), "+r"(bits.y), "+r"(bits.z), "+r"(bits.w));
    float m[kRun];
    widen_pool_run<T>(bits, m);
    read[s] = 0.0f;
#pragma unroll
    for (int c = 0; c < kRun; ++c) {
      m[c] = fmaf(correction, k[c], alpha * m[c]);
      read[s] = fmaf(m[c], q[c], read[s]);
    }
    if (i < dv && valid > 0) {
      store_pool_run<T>(pool, r.write_slot * pool.slot_size + (int64_t{h} * dv + i) * dk + k0, valid, pool_vec, m);
    }
  }
  // o: each row's sum ends in kLanes / kRows lanes of the group (scattered); the first stores it.
  const float read_sum = group_sums_scattered<kLanes, kRows>(read);
  if constexpr (kRows <= kLanes) {
    const int s = scattered_sum_index<kLanes, kRows>(lane);
    const int i = tile * kRowsPerBlock + group + kGroups * s;
    if (lane % (kLanes / kRows) == 0 && i < dv) {
      store_element(p.o.data, t * p.o.row_stride + int64_t{h} * dv + i, p.o.kind, read_sum);
    }
  } else if (lane == 0) {  // fewer lanes than rows: group_sums' sums in every lane
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const int i = tile * kRowsPerBlock + group + kGroups * s;
      if (i < dv) store_element(p.o.data, t * p.o.row_stride + int64_t{h} * dv + i, p.o.kind, read[s]);
    }
  }
}

// --- (4) the gated RMSNorm -------------------------------------------------------------------------

constexpr int kNormThreads = 128;

// Warp = value head (blockIdx.x·4 + warp) of token rows blockIdx.y, blockIdx.y + gridDim.y, ….
__global__ void __launch_bounds__(kNormThreads) gated_norm_kernel(const float* o, const float* z, int64_t z_stride,
                                                                  WeightRef norm_weight, float* y, int32_t Hv,
                                                                  int32_t dv, int64_t num_tokens,
                                                                  const int32_t* flags, float eps) {
  const int h = static_cast<int>(blockIdx.x) * (kNormThreads / 32) + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (h >= Hv) return;  // whole warps
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    if (flags[t] != kRowActive) continue;
    const float* o_h = o + (t * Hv + h) * dv;
    float ss = 0.0f;
    for (int i = lane; i < dv; i += 32) ss += o_h[i] * o_h[i];
    ss = group_sum<32>(ss);
    const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(dv) + eps);
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
  launch_pdl(decode_kernel<T, kLanes>, dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(entries)),
             dim3(kDecodeThreads), 0, stream, p, tiles);
}

template <typename T>
void launch_decode_of(const GdnParams& p, int32_t entries, cudaStream_t stream) {
  const int runs = (p.dk + kPoolRun<T> - 1) / kPoolRun<T>;
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
  } else if constexpr (kPoolRun<T> * 16 < kGdnMaxHeadDim) {
    launch_decode<T, 32>(p, entries, stream);  // float32 runs of 4: dk ≤ kGdnMaxHeadDim = 128
  }
}

}  // namespace

void launch_gdn_prepare(const GdnParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.wave.max_tokens == 0) return;
  const int threads = 32 * std::clamp(2 * p.Hk, 1, kPrepareMaxThreads / 32);
  const int32_t decodes = std::min(p.decode_end, p.wave.num_requests);
  if (decodes > 0) {  // one token each
    launch_pdl(prepare_kernel, dim3(1, static_cast<unsigned>(decodes)), dim3(threads), 0, stream, p, false);
  }
  if (p.num_prefills > 0) {
    launch_pdl(prepare_kernel, dim3(static_cast<unsigned>(p.wave.max_tokens), static_cast<unsigned>(p.num_prefills)),
               dim3(threads), 0, stream, p, true);
  }
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

void launch_gdn_gated_norm(const float* o, const float* z, int64_t z_stride, WeightRef norm_weight, float* y,
                           int32_t Hv, int32_t dv, int64_t num_tokens, const int32_t* flags, float eps,
                           cudaStream_t stream) {
  if (num_tokens <= 0) return;
  constexpr int kHeadsPerBlock = kNormThreads / 32;
  const dim3 grid(static_cast<unsigned>((Hv + kHeadsPerBlock - 1) / kHeadsPerBlock),
                  static_cast<unsigned>(std::min<int64_t>(num_tokens, 65535)));
  gated_norm_kernel<<<grid, kNormThreads, 0, stream>>>(o, z, z_stride, norm_weight, y, Hv, dv, num_tokens, flags, eps);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
