// GPU ssm_mode "mamba1" (reference/ssm/mamba1.cpp: vLLM's MambaMixer), float32 arithmetic:
//   xz  = hidden·in_proj^T                       cuBLAS, [T, 2I] float32 (in_proj_bias added where used)
//   per wave: causal conv1d + SiLU over x (+ in_proj_bias) with its conv state (causal_conv.h)
//   dbc = c·x_proj^T                             cuBLAS, [T, R + 2N]
//   dt  = dbc[:, :R]·dt_proj^T                   cuBLAS, [T, I] (dt_proj_bias + softplus in the scan)
//   per wave: decodes: one bandwidth-bound state-update launch; prefills: one one-pass block scan; y gated
//   out = y·out_proj^T                           cuBLAS, [T, H]; + out_proj_bias, stored for active rows
// A tensor-parallel rank (the rank's channels; hybridtb/spec/tensor_parallel.h) reads ssm_hidden,
// sums dbc and out over its group (all_reduce_over_ranks) and stores its heads' columns of out.
// A fixed decode step (ssm_gpu_mode.h) runs the same GEMMs over all T padded rows (padding rows'
// results stay in scratch) and, for its one wave of R entries, the single-token conv update and the
// decode scan straight from the request table: no host-side chunk lists, no uploads.
// GEMMs take the weights' and activations' stored dtypes directly when they agree (bf16/fp16/fp32
// inputs, float32 output, float32 compute — never TF32); otherwise both sides are widened to
// float32 exactly first. Every intermediate stays float32 (the reference rounds nothing either).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "hybridtb/error.h"
#include "hybridtb/tensor_parallel_group.h"
#include "ssm/causal_conv.h"
#include "ssm/gemm_rows.h"
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

// The sum over the tensor-parallel group of `count` float32 device values, in place, at one of
// mamba1's all-reduce points (vLLM's RowParallelLinear x_proj and out_proj); nothing on an unsharded
// layer. A group that sums device tensors (NCCL) does it on the stream; any other gets them through
// host memory while the stream waits.
void all_reduce_over_ranks(const GpuStep& step, float* data, int64_t count) {
  const AttentionConfig& config = *step.config;
  if (!config.is_tensor_parallel_rank()) return;
  TensorParallelGroup& group = rank_group_of(config, step.context->tp_group());
  const cudaStream_t stream = step.context->stream();
  if (group.sums_device_tensors()) {
    group.all_reduce_sum_on_stream(TensorView(data, DType::kFloat32, {count}, Device::kCuda), stream);
    return;
  }
  std::vector<float> host(static_cast<size_t>(count));
  const size_t bytes = host.size() * sizeof(float);
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream));
  HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream));
  group.all_reduce_sum(TensorView(host.data(), DType::kFloat32, {count}));
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(data, host.data(), bytes, cudaMemcpyHostToDevice, stream));
  HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `host` is freed
}

// The eager form of one wave's scan: its decode and prefill ranges (the conv needs no plan).
Mamba1Params plan_wave(const GpuWave& wave, const Mamba1Params& base) {
  Mamba1Params p = base;
  p.wave = wave.device;
  // Decodes first (the driver's order): the scan's two launches cover [0, decode_end) and
  // [prefill_begin, n); empty ranges launch nothing.
  p.decode_end = 0;
  p.prefill_begin = static_cast<int32_t>(wave.host.size());
  for (size_t r = 0; r < wave.host.size(); ++r) {
    if (wave.host[r].decode) {
      p.decode_end = static_cast<int32_t>(r + 1);
    } else {
      p.prefill_begin = std::min(p.prefill_begin, static_cast<int32_t>(r));
    }
  }
  return p;
}

class Mamba1GpuMode final : public GpuMode {
 public:
  std::string name() const override { return "mamba1"; }
  bool uses_cublas() const override { return true; }

  void check_supported(const GpuStep& step) const override {
    const auto& p = step.config->ssm_params;
    const int64_t N = p.at("state_size");
    const int64_t K = p.at("conv_kernel");
    if (K < 2 || K > kCausalConvMaxKernel || N > kMamba1MaxState) {
      throw NotSupported(detail::concat("cuda backend: ssm_mode mamba1 with conv_kernel ", K, " and state_size ", N,
                                        " (the GPU kernels take conv_kernel 2..", kCausalConvMaxKernel,
                                        " and state_size <= ", kMamba1MaxState, ")"));
    }
  }

  void forward(const GpuStep& step) const override {
    SsmContext& context = *step.context;
    const cudaStream_t stream = context.stream();
    const auto& params = step.config->ssm_params;
    const int64_t T = step.num_tokens, H = step.hidden_size;
    const int64_t I = params.at("intermediate_size"), N = params.at("state_size");
    const int64_t R = params.at("dt_rank");

    Mamba1Params base;
    base.I = static_cast<int32_t>(I);
    base.N = static_cast<int32_t>(N);
    base.R = static_cast<int32_t>(R);
    base.num_tokens = T;
    base.boundary_slot = step.boundary_slot;
    base.in_bias = step.weight_ref("in_proj_bias");
    base.dt_bias = step.weight_ref("dt_proj_bias");
    base.A_log = step.weight_ref("A_log");
    base.D = step.weight_ref("D");
    base.ssm_state = step.pools.at("ssm_state");

    float* xz = step.scratch_of<float>(T * 2 * I);
    float* c = step.scratch_of<float>(T * I);
    float* dbc = step.scratch_of<float>(T * (R + 2 * N));
    float* dt = step.scratch_of<float>(T * I);
    float* y = step.scratch_of<float>(T * I);
    float* out = step.scratch_of<float>(T * H);
    base.xz = xz;
    base.c = c;
    base.dbc = dbc;
    base.dt = dt;
    base.y = y;

    gemm_rows(step, xz, T, 2 * I, step.hidden.data, step.hidden.kind, step.hidden.row_stride, H, step.weight_ref("in_proj"),
              "mamba1 in_proj");

    // The conv over x (the first I columns of xz, + in_proj_bias) into c, with its conv state.
    const CausalConvParams conv = mode_causal_conv(step, I, xz, 2 * I, c, base.in_bias);
    std::vector<Mamba1Params> waves;
    if (step.fixed) {
      // One wave of R entries, each empty or one decode token: the single-token conv update reads
      // and writes the conv slots straight from the request table; the scan's decode launch covers
      // all R entries (both skip empty ones). Nothing host-side depends on the batch.
      Mamba1Params p = base;
      p.wave = step.waves.front().device;
      p.decode_end = p.wave.num_requests;
      p.prefill_begin = p.wave.num_requests;
      causal_conv_silu_fixed(step, conv);
      waves.push_back(p);
    } else {
      for (const GpuWave& wave : step.waves) {
        waves.push_back(plan_wave(wave, base));
        causal_conv_silu(step, wave, conv);
      }
    }

    gemm_rows(step, dbc, T, R + 2 * N, c, ElementKind::kFloat32, I, I, step.weight_ref("x_proj"), "mamba1 x_proj");
    all_reduce_over_ranks(step, dbc, T * (R + 2 * N));  // x_proj is row-parallel: its partial sums
    gemm_rows(step, dt, T, I, dbc, ElementKind::kFloat32, R + 2 * N, R, step.weight_ref("dt_proj"), "mamba1 dt_proj");
    for (const Mamba1Params& p : waves) launch_mamba1_scan(p, stream);
    gemm_rows(step, out, T, H, y, ElementKind::kFloat32, I, I, step.weight_ref("out_proj"), "mamba1 out_proj");
    WeightRef out_bias = step.weight_ref("out_proj_bias");
    if (step.config->is_tensor_parallel_rank()) {
      // out_proj is row-parallel too: rank 0 adds the bias (the only rank that holds it) before the
      // all-reduce, as RowParallelLinear does, so every rank's sum carries it once.
      launch_bias_rows(RowsRef{out, ElementKind::kFloat32, H}, FloatColumns{out, H, 0}, out_bias, H, T, step.active,
                       stream);
      all_reduce_over_ranks(step, out, T * H);
      out_bias = WeightRef{};
    }
    // A rank writes its heads' columns of the contribution; an unsharded layer all H of them.
    const int64_t first_column = step.config->tp_rank * step.output_width;
    launch_bias_rows(step.contribution, FloatColumns{out, H, first_column}, out_bias, step.output_width, T, step.active,
                     stream);
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_mamba1_gpu_mode() { return std::make_unique<Mamba1GpuMode>(); }

}  // namespace hybridtb::cuda::ssm
