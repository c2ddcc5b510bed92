// The causal conv1d + SiLU front end (causal_conv.h): the eager form — saved windows stashed, a
// token-parallel conv that also writes the block-boundary and final windows — and the single-token
// update of a wave of decodes (the fixed decode step's, and an eager decode wave's). Thread =
// channel(s) in both, so each thread owns its channels' windows and their conv-state rows: no two
// threads ever touch the same element. The sum is bias + Σ_j w[j]·window[j] in j order (the same in
// both forms and every instance below); silu(v) = v / (1 + e^−v).
//
// The eager conv is memory-bound (≈ 8 B per token·channel: the input read, out written), so its
// per-token loop must cost few instructions. The launcher dispatches once, on the host, to an
// instance of conv_kernel templated on the input element type and the kernel width:
//   - float32 / float16 / bfloat16 rows whose channels, row stride and pointers allow it: 4
//     consecutive channels per thread (one 16- or 8-byte load of the input row, one 16-byte store
//     of out per token), K = 2, 3 or 4 compiled in (the window and weights in registers);
//   - anything else (other kinds, K > 4, odd channel counts or strides, unaligned column ranges):
//     one channel per thread, load_element's run-time kind switch, run-time K.
// Each thread loads the inputs and boundary slots of a batch of tokens before computing any of
// them (the loop stores out rows, which the compiler must assume may alias the input, so without
// the batch every token would wait a full memory latency). in_bias, bias and weights are loaded
// once per thread. The grid is sized to the wave: chunks of ≥ kMinChunkTokens tokens, as many as
// make about kTargetConvBlocks blocks (a few per SM), so a few hundred tokens still fill the GPU.
// The conv-state pool (stash reads, boundary and final writes) keeps load_element / store_element
// with its run-time kind: those run once per chunk or per block boundary, not per token.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/pdl.cuh"
#include "ssm/activations.cuh"
#include "ssm/causal_conv.h"
#include "ssm/weight_ref.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kConvChannels = 128;  // threads per block of the conv kernels
// Token-parallel conv grid: chunks of at least kMinChunkTokens tokens (the K − 1 inputs before a
// chunk are read again by it), as many as make about kTargetConvBlocks blocks over the wave.
constexpr int64_t kMinChunkTokens = 16;
constexpr int64_t kTargetConvBlocks = 2048;
// Channels per thread of the typed conv instances: one 16-byte load of a float32 input row per token.
constexpr int kVecChannels = 4;
// Tokens whose inputs a conv_kernel thread loads before computing any of them (see above): 8 or
// 16 input elements in flight per thread.
constexpr int kConvBatch = 8;     // one channel per thread
constexpr int kVecConvBatch = 4;  // kVecChannels per thread

// u_t[c]: the conv input of step row t, channel c (in_bias included); the decode kernel's.
__device__ __forceinline__ float conv_input(const CausalConvParams& p, int64_t t, int c) {
  return load_element(p.in.data, t * p.in.row_stride + c, p.in.kind) + weight_or(p.in_bias, c, 0.0f);
}

// The input rows of the conv kernel: kVec consecutive channels of one row, widened to float
// exactly (element `index` = t·row_stride + c; index a multiple of kVec).
template <typename T, int V>
struct TypedRows {  // T = float, __half, __nv_bfloat16: one ElementVec load
  static constexpr int kVec = V;
  static constexpr int kBatch = V == 1 ? kConvBatch : kVecConvBatch;
  __device__ __forceinline__ static void load(const CausalConvParams& p, int64_t index, float (&x)[V]) {
    const auto v = *reinterpret_cast<const ElementVec<T, V>*>(static_cast<const T*>(p.in.data) + index);
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = element_to_float(v.e[i]);
  }
};
struct AnyRows {  // any kind: load_element's run-time switch, one channel
  static constexpr int kVec = 1;
  static constexpr int kBatch = kConvBatch;
  __device__ __forceinline__ static void load(const CausalConvParams& p, int64_t index, float (&x)[1]) {
    x[0] = load_element(p.in.data, index, p.in.kind);
  }
};

// silu(bias + Σ_j w[j]·window[j]) over the K window rows, the current token's u last. N: the
// register arrays' size (K, or kCausalConvMaxKernel for a run-time K).
template <int N>
__device__ __forceinline__ float conv_output(const float (&w)[N], const float (&window)[N], float u, float bias,
                                             int K) {
  float acc = bias;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (j < K) acc += w[j] * (j == K - 1 ? u : window[j]);
  }
  return silu(acc);
}

// window[0 … K−2] ← window[1 … K−2], u: the saved inputs after one more token.
template <int N>
__device__ __forceinline__ void shift_window(float (&window)[N], float u, int K) {
#pragma unroll
  for (int j = 0; j + 1 < N; ++j) {
    if (j < K - 2) window[j] = window[j + 1];
    else if (j == K - 2) window[j] = u;
  }
}

// Stores the K − 1 saved inputs of channel c to `slot`.
template <int N>
__device__ __forceinline__ void store_window(const CausalConvParams& p, int32_t slot, int c, const float (&window)[N],
                                             int K) {
  const int km1 = K - 1;
#pragma unroll
  for (int j = 0; j + 1 < N; ++j) {
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

// (2) Chunk blockIdx.z (of `chunk_tokens` tokens) of request blockIdx.y, Rows::kVec consecutive
// channels per thread: the windows of the chunk's first token from the stash and the tokens before
// it, then sliding windows down the chunk, storing out and the windows after boundary rows and
// after the request's last row. kWidth: K, or 0 for p.kernel (≤ kCausalConvMaxKernel) at run time.
template <typename Rows, int kWidth>
__global__ void __launch_bounds__(kConvChannels) conv_kernel(CausalConvParams p, int32_t chunk_tokens) {
  constexpr int V = Rows::kVec;
  constexpr int kBatch = Rows::kBatch;
  constexpr int kTaps = kWidth > 0 ? kWidth : kCausalConvMaxKernel;  // register arrays' size
  const int c0 = (static_cast<int>(blockIdx.x) * kConvChannels + static_cast<int>(threadIdx.x)) * V;
  if (c0 >= p.channels) return;
  const GpuRequest r = p.wave.requests[blockIdx.y];
  const int32_t begin = r.begin + static_cast<int32_t>(blockIdx.z) * chunk_tokens;
  if (begin >= r.end) return;
  const int32_t end = min(r.end, begin + chunk_tokens);
  const int K = kWidth > 0 ? kWidth : p.kernel;
  const int km1 = K - 1;
  float w[V][kTaps];
  float window[V][kTaps];
  float bias[V];
  float in_bias[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    bias[v] = weight_or(p.bias, c0 + v, 0.0f);
    in_bias[v] = weight_or(p.in_bias, c0 + v, 0.0f);
#pragma unroll
    for (int j = 0; j < kTaps; ++j) {
      w[v][j] = j < K ? load_element(p.weight.data, int64_t{c0 + v} * K + j, p.weight.kind) : 0.0f;
    }
  }
  // Saved input j before token `begin` is the request's window row (begin − r.begin) + j of
  // [stash (K − 1 rows) | u_{r.begin} …].
  const float* stash = p.stash + (int64_t{blockIdx.y} * p.channels + c0) * km1;
#pragma unroll
  for (int j = 0; j < kTaps; ++j) {
    const int32_t row = (begin - r.begin) + j;
    float x[V] = {};
    if (j < km1 && row >= km1) Rows::load(p, int64_t{r.begin + row - km1} * p.in.row_stride + c0, x);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      window[v][j] = j >= km1 ? 0.0f : row < km1 ? stash[v * km1 + row] : x[v] + in_bias[v];
    }
  }
  for (int32_t t0 = begin; t0 < end; t0 += kBatch) {
    float u[kBatch][V];
    int32_t slot[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int32_t t = t0 + b;
      float x[V] = {};
      if (t < end) Rows::load(p, int64_t{t} * p.in.row_stride + c0, x);
#pragma unroll
      for (int v = 0; v < V; ++v) u[b][v] = t < end ? x[v] + in_bias[v] : 0.0f;
      slot[b] = t < end && p.boundary_slot != nullptr ? p.boundary_slot[t] : -1;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int32_t t = t0 + b;
      if (t >= end) break;
      ElementVec<float, V> y;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        y.e[v] = conv_output(w[v], window[v], u[b][v], bias[v], K);
        shift_window(window[v], u[b][v], K);
      }
      *reinterpret_cast<ElementVec<float, V>*>(p.out + int64_t{t} * p.channels + c0) = y;
      if (slot[b] >= 0) {
#pragma unroll
        for (int v = 0; v < V; ++v) store_window(p, slot[b], c0 + v, window[v], K);
      }
    }
  }
  if (end == r.end) {
#pragma unroll
    for (int v = 0; v < V; ++v) store_window(p, r.write_slot, c0 + v, window[v], K);
  }
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
  store_window(p, r.write_slot, c, window, K);
}

unsigned grid_for(int64_t n, int per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 4096));
}

// conv_kernel<Rows, kWidth> over chunks sized to fill the GPU (see above).
template <typename Rows, int kWidth>
void launch_conv_kernel(const CausalConvParams& p, cudaStream_t stream) {
  constexpr int64_t channels_per_block = int64_t{kConvChannels} * Rows::kVec;
  const auto channel_blocks = static_cast<unsigned>((p.channels + channels_per_block - 1) / channels_per_block);
  const int64_t max_tokens = p.wave.max_tokens;
  const int64_t blocks_per_chunk = int64_t{channel_blocks} * p.wave.num_requests;
  const int64_t wanted_chunks = std::max<int64_t>(1, (kTargetConvBlocks + blocks_per_chunk - 1) / blocks_per_chunk);
  int64_t chunk = std::max(kMinChunkTokens, (max_tokens + wanted_chunks - 1) / wanted_chunks);
  chunk = (chunk + Rows::kBatch - 1) / Rows::kBatch * Rows::kBatch;  // whole batches but the request's last
  const auto chunks = static_cast<unsigned>((max_tokens + chunk - 1) / chunk);
  conv_kernel<Rows, kWidth><<<dim3(channel_blocks, p.wave.num_requests, chunks), kConvChannels, 0, stream>>>(
      p, static_cast<int32_t>(chunk));
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// Whether rows of `element_bytes` elements allow the typed instances' kVecChannels-wide accesses:
// every thread's first channel a multiple of kVecChannels in every row, in and out aligned to it.
bool vector_rows_fit(const CausalConvParams& p, int64_t element_bytes) {
  const auto aligned = [](const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  return p.channels % kVecChannels == 0 && p.in.row_stride % kVecChannels == 0 &&
         aligned(p.in.data, kVecChannels * element_bytes) &&
         aligned(p.out, kVecChannels * static_cast<int64_t>(sizeof(float)));
}

// The typed instance for rows of T, if the rows allow it (vector_rows_fit) and K is 2, 3 or 4;
// false: nothing launched.
template <typename T>
bool launch_typed_conv_kernel(const CausalConvParams& p, cudaStream_t stream) {
  if (!vector_rows_fit(p, sizeof(T))) return false;
  using Rows = TypedRows<T, kVecChannels>;
  switch (p.kernel) {
    case 2:
      launch_conv_kernel<Rows, 2>(p, stream);
      return true;
    case 3:
      launch_conv_kernel<Rows, 3>(p, stream);
      return true;
    case 4:
      launch_conv_kernel<Rows, 4>(p, stream);
      return true;
    default:
      return false;
  }
}

}  // namespace

void launch_causal_conv(const CausalConvParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.wave.max_tokens == 0 || p.channels == 0) return;
  const int64_t window_size = int64_t{p.channels} * (p.kernel - 1);
  stash_kernel<<<dim3(grid_for(window_size, 256), p.wave.num_requests), 256, 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  bool launched = false;
  switch (p.in.kind) {
    case ElementKind::kFloat32:
      launched = launch_typed_conv_kernel<float>(p, stream);
      break;
    case ElementKind::kFloat16:
      launched = launch_typed_conv_kernel<__half>(p, stream);
      break;
    case ElementKind::kBFloat16:
      launched = launch_typed_conv_kernel<__nv_bfloat16>(p, stream);
      break;
    default:
      break;
  }
  if (!launched) launch_conv_kernel<AnyRows, 0>(p, stream);
}

void launch_causal_conv_decode(const CausalConvParams& p, cudaStream_t stream) {
  if (p.wave.num_requests == 0 || p.channels == 0) return;
  conv_decode_kernel<<<dim3((p.channels + kConvChannels - 1) / kConvChannels, p.wave.num_requests), kConvChannels, 0,
                       stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
