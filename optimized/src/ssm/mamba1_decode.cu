// mamba1's single-step decode update on the GPU (launched by launch_mamba1_scan, mamba1_kernels.cu,
// for a wave's decode requests). The math is reference/ssm/mamba1.cpp's, in float32, with the
// prefill scan's per-token·channel forms (mamba1_common.cuh):
//   Δ = softplus(dt + dt_bias), h = exp(Δ·A)·h + Δ·c·B, A = −exp(A_log), y = (h·C + D·c)·silu(z).
// One launch; the state row of each channel is read and written once in 16-byte accesses, streaming
// (evict-first) for a float32 pool: the kernel is bound by the state pool's bandwidth.
// Layout: the pool holds [I, N] states per slot (any float kind, widened to float32), the inputs
// are the token rows of mamba1_kernels.cu's layout (one row per decode request). The grid is
// (channel blocks, decode requests); the lanes of a channel hold its states in quads of 4.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/group_sums.cuh"
#include "common/mma.cuh"
#include "ssm/mamba1_common.cuh"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm::mamba1 {
namespace {

// A channel's state quad (load_quad / store_quad); where the pool is float32 and the quad moves as
// one 16-byte access, streaming (ld.global.cs / st.global.cs, evict-first in L2): each state is
// read once and written once per step.
__device__ __forceinline__ void load_state_quad(const PoolRef& pool, int64_t e, int valid, bool vec, float (&x)[4]) {
  if (vec && pool.kind == ElementKind::kFloat32) {
    const float4 v = __ldcs(reinterpret_cast<const float4*>(static_cast<const float*>(pool.data) + e));
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    return;
  }
  load_quad(pool, e, valid, vec, x);
}
__device__ __forceinline__ void store_state_quad(const PoolRef& pool, int64_t e, int valid, bool vec,
                                                 const float (&x)[4]) {
  if (vec && pool.kind == ElementKind::kFloat32) {
    __stcs(reinterpret_cast<float4*>(static_cast<float*>(pool.data) + e), make_float4(x[0], x[1], x[2], x[3]));
    return;
  }
  store_quad(pool, e, valid, vec, x);
}

// Decodes, bandwidth-bound: kLanes lanes per channel, lane g holding quads g, g + kLanes, … (kQ
// of them) of the channel's states. Mamba-1's 16 states are 2 lanes of 2 quads: each warp access
// then reads whole 32-byte sectors (16 channels × 32 contiguous bytes), and Δ, the gate, the
// channel's input loads and the reduction of y are done by 2 lanes, not 4. A block is kThreads
// threads = kThreads / kLanes channels of one request. Each block's time is one chain of latencies
// (request entry → state loads → math → stores), so the chain is kept short: the channel's weights
// are loaded before the request entry (their latencies overlap), every load is issued before the
// first store, B and C move in 16-byte loads, the state with streaming hints. The arithmetic is the
// prefill scan's (ex2 of Δ·A·log2 e, softplus_fast, silu_fast), so a decode step and a one-token
// prefill agree to rounding.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::threads, Cfg::min_blocks_per_sm) decode_kernel(Mamba1Params p) {
  constexpr int kLanes = Cfg::lanes_per_channel;
  constexpr int kQ = Cfg::quads_per_lane;
  constexpr int kThreads = Cfg::threads;
  constexpr int kPerBlock = kThreads / kLanes;
  const int N = p.N;
  const int g = threadIdx.x % kLanes;
  const int i = blockIdx.x * kPerBlock + threadIdx.x / kLanes;
  const bool active = i < p.I;
  const int ic = active ? i : p.I - 1;  // inactive lanes compute on a valid channel, store nothing
  const bool vec = quad_vector_ok(p.ssm_state, N);
  const bool a_vec = vec && p.A_log.kind == ElementKind::kFloat32 && aligned16(p.A_log.data);
  const bool bc_vec = (p.R % 4) == 0 && (N % 4) == 0 && aligned16(p.dbc);
  // The channel's weights first: they do not depend on the request, so their loads share the
  // latency of the request entry's (which every other address waits for).
  float h[kQ][4], A[kQ][4], B[kQ][4], C[kQ][4];
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const int n0 = 4 * (g + kLanes * j);
    const int valid = max(0, min(4, N - n0));
    const int64_t e = int64_t{ic} * N + n0;
    if (a_vec && valid > 0) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.A_log.data) + e));
      A[j][0] = x.x, A[j][1] = x.y, A[j][2] = x.z, A[j][3] = x.w;
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) A[j][s] = s < valid ? load_element(p.A_log.data, e + s, p.A_log.kind) : 0.0f;
    }
  }
  const float dt_bias = load_element(p.dt_bias.data, ic, p.dt_bias.kind);
  const float z_bias = weight_or(p.in_bias, int64_t{p.I} + ic, 0.0f);
  const float Dv = load_element(p.D.data, ic, p.D.kind);
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (!r.decode || r.end <= r.begin) return;  // uniform over the block; empty entries: nothing to do
  const int64_t t = r.begin;
  const float* bc_row = p.dbc + t * (p.R + 2 * N) + p.R;  // B, then C
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const int n0 = 4 * (g + kLanes * j);
    const int valid = max(0, min(4, N - n0));
    const int64_t e = int64_t{ic} * N + n0;
    if (valid > 0 && r.read_slot >= 0) {
      load_state_quad(p.ssm_state, r.read_slot * p.ssm_state.slot_size + e, valid, vec, h[j]);
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) h[j][s] = 0.0f;
    }
    load_float_run<4>(bc_row, n0, valid, bc_vec, B[j]);
    load_float_run<4>(bc_row + N, n0, valid, bc_vec, C[j]);
  }
  const float dt = __ldg(p.dt + t * p.I + ic) + dt_bias;
  const float cv = p.c[t * p.I + ic];
  const float z = p.xz[t * 2 * p.I + p.I + ic] + z_bias;

  const float delta = softplus_fast(dt);
  const float dc = delta * cv;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const int n0 = 4 * (g + kLanes * j);
    const int valid = max(0, min(4, N - n0));
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const float A2 = s < valid ? -expf(A[j][s]) * kLog2e : 0.0f;
      h[j][s] = fmaf(mma::exp2_approx(delta * A2), h[j][s], dc * B[j][s]);
      acc = fmaf(h[j][s], C[j][s], acc);
    }
    if (active && valid > 0) {
      store_state_quad(p.ssm_state, r.write_slot * p.ssm_state.slot_size + int64_t{ic} * N + n0, valid,
                               vec, h[j]);
    }
  }
  acc = group_sum<kLanes>(acc);
  if (active && g == 0) p.y[t * p.I + ic] = (acc + Dv * cv) * silu_fast(z);
}


// The launch configurations, one per state-size class, named by the largest state size N of the
// class (4 states per quad; lanes × quads per lane = ⌈N/4⌉ rounded up to a power of two, N ≤
// kMamba1MaxState).
struct DecodeDefaults {
  static constexpr int min_blocks_per_sm = 4;
  static constexpr int threads = 256;
};
struct DecodeN4 : DecodeDefaults {
  static constexpr int lanes_per_channel = 1, quads_per_lane = 1;
};
struct DecodeN8 : DecodeDefaults {
  static constexpr int lanes_per_channel = 1, quads_per_lane = 2;
};
// Mamba-1's 16 states: 2 lanes of 2 quads (whole 32-byte sectors per warp access), 128-thread
// blocks, 8 per SM at 64 registers.
struct DecodeN16 {
  static constexpr int lanes_per_channel = 2, quads_per_lane = 2;
  static constexpr int min_blocks_per_sm = 8;
  static constexpr int threads = 128;
};
struct DecodeN32 : DecodeDefaults {
  static constexpr int lanes_per_channel = 2, quads_per_lane = 4;
  static constexpr int min_blocks_per_sm = 2;
};
struct DecodeN64 : DecodeDefaults {
  static constexpr int lanes_per_channel = 4, quads_per_lane = 4;
  static constexpr int min_blocks_per_sm = 2;
};

// The decode update: grid = (channel blocks, decode requests).
template <class Cfg>
void launch_decode_kernel(const Mamba1Params& p, int32_t count, cudaStream_t stream) {
  constexpr int kPerBlock = Cfg::threads / Cfg::lanes_per_channel;
  decode_kernel<Cfg><<<dim3((p.I + kPerBlock - 1) / kPerBlock, count), Cfg::threads, 0, stream>>>(p);
}

}  // namespace

void launch_decode(const Mamba1Params& p, int32_t decodes, cudaStream_t stream) {
  int lanes = 1;  // ⌈N/4⌉ rounded up to a power of two
  while (lanes < (p.N + 3) / 4) lanes *= 2;
  switch (lanes) {
    case 1: launch_decode_kernel<DecodeN4>(p, decodes, stream); break;
    case 2: launch_decode_kernel<DecodeN8>(p, decodes, stream); break;
    case 4: launch_decode_kernel<DecodeN16>(p, decodes, stream); break;
    case 8: launch_decode_kernel<DecodeN32>(p, decodes, stream); break;
    default: launch_decode_kernel<DecodeN64>(p, decodes, stream); break;
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm::mamba1
