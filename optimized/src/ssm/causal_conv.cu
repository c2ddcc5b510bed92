// The causal conv1d + SiLU front end (causal_conv.h): the eager form — saved windows stashed, a
// token-parallel conv that also writes the block-boundary and final windows — and the single-token
// update of a wave of decodes (the fixed decode step's, and an eager decode wave's). Thread =
// channel in both, so each thread owns its channel's window and its conv-state rows: no two threads
// ever touch the same element. The sum is bias + Σ_j w[j]·window[j] in j order (the same in both
// forms); silu(v) = v / (1 + e^−v).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/pdl.cuh"
#include "ssm/causal_conv.h"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kConvChannels = 128;          // channels (threads) per block of the conv kernels
constexpr int64_t kMinChunkTokens = 64;     // token-parallel conv: chunks of at least 64 tokens,
constexpr int64_t kMaxChunksPerRequest = 128;  // at most 128 chunks per request
// Tokens whose inputs a conv_kernel thread loads before computing any of them: the loop stores out
// rows (which may alias the input, as far as the compiler knows), so without the batch every token
// would wait a full memory latency for its input.
constexpr int kConvBatch = 8;

__device__ __forceinline__ float weight_or(const WeightRef& w, int64_t i, float absent) {
  return w.data != nullptr ? load_element(w.data, i, w.kind) : absent;
}
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// u_t[c]: the conv input of step row t, channel c (in_bias included).
__device__ __forceinline__ float conv_input(const CausalConvParams& p, int64_t t, int c) {
  return load_element(p.in.data, t * p.in.row_stride + c, p.in.kind) + weight_or(p.in_bias, c, 0.0f);
}

// silu(bias + Σ_j w[j]·window[j]) over the K window rows, the current token's u last.
__device__ __forceinline__ float conv_output(const float (&w)[kCausalConvMaxKernel],
                                             const float (&window)[kCausalConvMaxKernel], float u, float bias, int K) {
  float acc = bias;
#pragma unroll
  for (int j = 0; j < kCausalConvMaxKernel; ++j) {
    if (j < K) acc += w[j] * (j == K - 1 ? u : window[j]);
  }
  return silu(acc);
}

// window[0 … K−2] ← window[1 … K−2], u: the saved inputs after one more token.
__device__ __forceinline__ void shift_window(float (&window)[kCausalConvMaxKernel], float u, int K) {
#pragma unroll
  for (int j = 0; j + 1 < kCausalConvMaxKernel; ++j) {
    if (j < K - 2) window[j] = window[j + 1];
    else if (j == K - 2) window[j] = u;
  }
}

// Stores the K − 1 saved inputs of channel c to `slot`.
__device__ __forceinline__ void store_window(const CausalConvParams& p, int32_t slot, int c,
                                             const float (&window)[kCausalConvMaxKernel]) {
  const int km1 = p.kernel - 1;
#pragma unroll
  for (int j = 0; j + 1 < kCausalConvMaxKernel; ++j) {
    if (j < km1) store_element(p.state.data, slot * p.state.slot_size + int64_t{c} * km1 + j, p.state.kind, window[j]);
  }
}

// (1) The saved window of every request of the wave (zeros without one), read before any write.
__global__ void stash_kernel(CausalConvParams p) {
  const GpuRequest r = p.wave.requests[blockIdx.y];
  const int64_t size = int64_t{p.channels} * (p.kernel - 1);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < size; e += int64_t{gridDim.x} * blockDim.x) {
    p.stash[blockIdx.y * size + e] =
        r.read_slot >= 0 ? load_element(p.state.data, r.read_slot * p.state.slot_size + e, p.state.kind) : 0.0f;
  }
}

// (2) Chunk blockIdx.z (of `chunk_tokens` tokens) of request blockIdx.y, channel = thread: the
// window of the chunk's first token from the stash and the tokens before it, then a sliding window
// down the chunk, storing out and the windows after boundary rows and after the request's last row.
__global__ void __launch_bounds__(kConvChannels) conv_kernel(CausalConvParams p, int32_t chunk_tokens) {
  const int c = static_cast<int>(blockIdx.x) * kConvChannels + static_cast<int>(threadIdx.x);
  if (c >= p.channels) return;
  const GpuRequest r = p.wave.requests[blockIdx.y];
  const int32_t begin = r.begin + static_cast<int32_t>(blockIdx.z) * chunk_tokens;
  if (begin >= r.end) return;
  const int32_t end = min(r.end, begin + chunk_tokens);
  const int K = p.kernel;
  const int km1 = K - 1;
  float w[kCausalConvMaxKernel];
  float window[kCausalConvMaxKernel];
  const float* stash = p.stash + (int64_t{blockIdx.y} * p.channels + c) * km1;
#pragma unroll
  for (int j = 0; j < kCausalConvMaxKernel; ++j) {
    w[j] = j < K ? load_element(p.weight.data, int64_t{c} * K + j, p.weight.kind) : 0.0f;
    // Saved input j before token `begin` is the request's window row (begin − r.begin) + j of
    // [stash (K − 1 rows) | u_{r.begin} …].
    const int32_t row = (begin - r.begin) + j;
    window[j] = j >= km1 ? 0.0f : row < km1 ? stash[row] : conv_input(p, r.begin + row - km1, c);
  }
  const float bias = weight_or(p.bias, c, 0.0f);
  for (int32_t t0 = begin; t0 < end; t0 += kConvBatch) {
    float u[kConvBatch];
    int32_t slot[kConvBatch];
#pragma unroll
    for (int b = 0; b < kConvBatch; ++b) {
      const int32_t t = t0 + b;
      u[b] = t < end ? conv_input(p, t, c) : 0.0f;
      slot[b] = t < end && p.boundary_slot != nullptr ? p.boundary_slot[t] : -1;
    }
#pragma unroll
    for (int b = 0; b < kConvBatch; ++b) {
      const int32_t t = t0 + b;
      if (t >= end) break;
      p.out[int64_t{t} * p.channels + c] = conv_output(w, window, u[b], bias, K);
      shift_window(window, u[b], K);
      if (slot[b] >= 0) store_window(p, slot[b], c, window);
    }
  }
  if (end == r.end) store_window(p, r.write_slot, c, window);
}

// Decodes only: entry blockIdx.y's one token (or nothing), channel = thread; the saved inputs are in
// registers before the shifted window is stored, so read_slot == write_slot is safe.
__global__ void __launch_bounds__(kConvChannels) conv_decode_kernel(CausalConvParams p) {
  pdl_allow_dependents();  // the kernel after the conv (a state update, GDN's preparation) may launch now
  const int c = static_cast<int>(blockIdx.x) * kConvChannels + static_cast<int>(threadIdx.x);
  if (c >= p.channels) return;
  const GpuRequest r = p.wave.requests[blockIdx.y];
  if (r.end <= r.begin) return;  // an empty entry (padding or skipped request): nothing read or written
  const int K = p.kernel;
  const int km1 = K - 1;
  float w[kCausalConvMaxKernel];
  float window[kCausalConvMaxKernel];
#pragma unroll
  for (int j = 0; j < kCausalConvMaxKernel; ++j) {
    w[j] = j < K ? load_element(p.weight.data, int64_t{c} * K + j, p.weight.kind) : 0.0f;
    window[j] = j < km1 && r.read_slot >= 0
                    ? load_element(p.state.data, r.read_slot * p.state.slot_size + int64_t{c} * km1 + j, p.state.kind)
                    : 0.0f;
  }
  const int64_t t = r.begin;
  const float u = conv_input(p, t, c);
  p.out[t * p.channels + c] = conv_output(w, window, u, weight_or(p.bias, c, 0.0f), K);
  shift_window(window, u, K);
  store_window(p, r.write_slot, c, window);
}

unsigned grid_for(int64_t n, int per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 4096));
}

}  // namespace

void launch_causal_conv(const CausalConvParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.wave.max_tokens == 0 || p.channels == 0) return;
  const int64_t window_size = int64_t{p.channels} * (p.kernel - 1);
  stash_kernel<<<dim3(grid_for(window_size, 256), p.wave.num_requests), 256, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  const int64_t max_tokens = p.wave.max_tokens;
  const int64_t chunk = std::max(kMinChunkTokens, (max_tokens + kMaxChunksPerRequest - 1) / kMaxChunksPerRequest);
  const auto chunks = static_cast<unsigned>((max_tokens + chunk - 1) / chunk);
  conv_kernel<<<dim3((p.channels + kConvChannels - 1) / kConvChannels, p.wave.num_requests, chunks), kConvChannels, 0,
                stream>>>(p, static_cast<int32_t>(chunk));
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_causal_conv_decode(const CausalConvParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.channels == 0) return;
  conv_decode_kernel<<<dim3((p.channels + kConvChannels - 1) / kConvChannels, p.wave.num_requests), kConvChannels, 0,
                       stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
