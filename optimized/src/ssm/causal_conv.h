// The causal depthwise conv1d + SiLU front end of the model-layer GPU modes (mamba1, mamba2, gdn),
// with its per-request conv state — vLLM's causal_conv1d_fn (prefill) and causal_conv1d_update
// (decode) over one contiguous range of channels. Per request, channel c and token t (float32):
//   u_t[c]   = in[t, c] + in_bias[c]                       (in_bias optional: in_proj's bias)
//   window   = [the K − 1 saved inputs of read_slot (zeros if −1), oldest first | u_first … u_t]
//   out[t,c] = silu(bias[c] + Σ_{j<K} weight[c, j]·window[t − (K − 1) + j])   (column K−1: u_t)
// and the conv state written back is the last K − 1 window entries (saved inputs included while the
// request has fewer than K − 1 tokens):
//   - after the request's last token → write_slot;
//   - mamba_cache_mode all: after every token row t with boundary_slot[t] ≥ 0 → that slot.
// The conv state pool is [slots, channels, K − 1] per slot (the reference's conv_state of mamba1,
// mamba2 and gdn), of any PoolRef kind (float32/float16/bfloat16: loads widen exactly, stores
// round to nearest even). The state holds u (in_bias included), as the reference's does.
//
// Input rows are of any RowsRef kind (float32/float16/bfloat16: widened exactly on load) with a row
// stride: a column range of a wider row (xBC inside in_proj's [z | xBC | dt] output) is `in` offset
// by its first column, and a linear layer's own 16-bit inputs are read where they lie (no widening
// pass). The output is dense float32 [T, channels]: row t of the step → out[t·channels …]; only rows
// of the wave's requests are written.
//
// Two entry points, as the GPU modes' two step forms (ssm_gpu_mode.h):
//   - eager, one launch group per wave (launch_causal_conv): (1) every request's saved window is
//     copied to `stash` (scratch [num_requests, channels, K − 1]) before anything is written, so a
//     request may read and write the same slot; (2) a token-parallel conv — grid (channel blocks,
//     requests, token chunks of ⌈max_tokens / chunks⌉ ≥ 64 tokens), each thread a channel sliding
//     its window down a chunk, its inputs (and boundary slots) loaded kConvBatch tokens ahead so
//     that a chunk costs a few memory latencies, not one per token — that writes out, the
//     block-boundary windows as it passes them and the final window. No host-side lists: everything
//     comes from the device request table and boundary_slot, so nothing is uploaded.
//   - decodes only (launch_causal_conv_decode: the fixed decode step, and an eager wave whose
//     entries are all decodes): every entry of the wave is empty (skipped) or one token; per entry
//     and channel one thread reads the K − 1 saved inputs into registers, stores out and then the
//     shifted window [saved[1:] | u] to write_slot (read_slot == write_slot is safe). A decode
//     writes no block-boundary state (its state goes to write_slot: harness/spec/src/ssm_plan.cpp's
//     plan_decode, vLLM's rule), so boundary_slot is not read. One kernel, grid from channels and
//     num_requests only, no stash.
// Both compute the same sums in the same order (bitwise the same c for a decode token either way).
// Reproducible: no atomics, fixed order.
//
// The .cu (C++17) sees the parameters and launchers; host code (C++20) also gets two wrappers over
// GpuStep / GpuWave below that fill in the wave, the stash scratch, the boundary rows and the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

inline constexpr int kCausalConvMaxKernel = 8;  // conv_kernel 2 … 8 (every model: 4)

struct CausalConvParams {
  int32_t channels = 0;  // C: the conv's columns
  int32_t kernel = 0;    // K (2 … kCausalConvMaxKernel)
  int64_t num_tokens = 0;  // T: rows of in / out (the step's rows)
  RowsRef in;  // [T, ≥ C] of in.kind: column c of row t at element t·in.row_stride + c
  WeightRef in_bias;  // optional [C], added to the input before the conv (and kept in the state)
  WeightRef weight;   // [C, K]; column K − 1 multiplies the current token
  WeightRef bias;     // optional [C], added before the SiLU
  float* out = nullptr;  // [T, C] dense
  PoolRef state;         // [slots, C, K − 1] per slot, oldest input first
  WaveRef wave;          // the wave's requests (device table)
  // Eager only: device [T] −1 or the slot receiving the window after row t (mode all; nullptr: none),
  // and scratch for the saved windows, causal_conv_stash_floats(·) floats (launch_causal_conv only).
  const int32_t* boundary_slot = nullptr;
  float* stash = nullptr;
};

// Floats of `stash` the eager launch needs: num_requests · C · (K − 1) (at least 1).
inline int64_t causal_conv_stash_floats(const CausalConvParams& p) {
  const int64_t n = int64_t{p.wave.num_requests} * p.channels * (p.kernel - 1);
  return n > 0 ? n : 1;
}

// The eager form (see above): stash, token-parallel conv, final and boundary conv-state writes.
void launch_causal_conv(const CausalConvParams& p, cudaStream_t stream);
// The decodes-only form (see above): entries empty or one token; stash unused.
void launch_causal_conv_decode(const CausalConvParams& p, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm

// nvcc compiles the .cu files as C++17 and ssm_gpu_mode.h is C++20: the GpuStep wrappers are for
// host translation units only.
#ifndef __CUDACC__
#include <algorithm>

#include "ssm/ssm_gpu_mode.h"

namespace hybridtb::cuda::ssm {

// The conv of `step`'s mode by the names every mode with a conv front end uses (mamba1, mamba2, gdn):
// /config/ssm conv_kernel, weights conv1d_weight and conv1d_bias (optional), pool conv_state; over
// `channels` columns of `in` (in_bias added first if present) into `out`.
inline CausalConvParams mode_causal_conv(const GpuStep& step, int64_t channels, const RowsRef& in, float* out,
                                         WeightRef in_bias = {}) {
  CausalConvParams conv;
  conv.channels = static_cast<int32_t>(channels);
  conv.kernel = static_cast<int32_t>(step.config->ssm_params.at("conv_kernel"));
  conv.in = in;
  conv.in_bias = in_bias;
  conv.weight = step.weight_ref("conv1d_weight");
  conv.bias = step.weight_ref("conv1d_bias");
  conv.out = out;
  conv.state = step.pools.at("conv_state");
  return conv;
}
// The same over float32 rows in_stride apart (a column range of in_proj's output).
inline CausalConvParams mode_causal_conv(const GpuStep& step, int64_t channels, const float* in, int64_t in_stride,
                                         float* out, WeightRef in_bias = {}) {
  return mode_causal_conv(step, channels, RowsRef{const_cast<float*>(in), ElementKind::kFloat32, in_stride}, out,
                          in_bias);
}

// Eager step (step.fixed == false): the conv of one wave, stash from the step's scratch, the
// step's block-boundary rows, on the context's stream. `conv` gives sizes, in/out, weights, pool.
// A wave of decodes only (the common decode step) takes the single-token update: one kernel that
// reads each saved window where it lies, instead of a stash pass and the token-parallel conv (decodes
// write no block-boundary states, see above).
inline void causal_conv_silu(const GpuStep& step, const GpuWave& wave, CausalConvParams conv) {
  conv.num_tokens = step.num_tokens;
  conv.wave = wave.device;
  conv.boundary_slot = step.boundary_slot;
  const bool decodes_only = std::all_of(wave.host.begin(), wave.host.end(),
                                        [](const GpuRequest& r) { return r.decode != 0 || r.end <= r.begin; });
  if (decodes_only) {
    conv.stash = nullptr;
    launch_causal_conv_decode(conv, step.context->stream());
    return;
  }
  conv.stash = step.scratch_of<float>(causal_conv_stash_floats(conv));
  launch_causal_conv(conv, step.context->stream());
}

// Fixed decode step (step.fixed == true): the single-token update over its one wave of R entries.
inline void causal_conv_silu_fixed(const GpuStep& step, CausalConvParams conv) {
  conv.num_tokens = step.num_tokens;
  conv.wave = step.waves.front().device;
  conv.boundary_slot = nullptr;
  conv.stash = nullptr;
  launch_causal_conv_decode(conv, step.context->stream());
}

}  // namespace hybridtb::cuda::ssm
#endif
