// GPU ssm_mode "mamba1" (reference/ssm/mamba1.cpp: vLLM's MambaMixer), float32 arithmetic:
//   xz  = hidden·in_proj^T                       cuBLAS, [T, 2I] float32 (in_proj_bias added where used)
//   per wave: conv stash → causal conv1d + SiLU → conv-state write-back (final + block boundaries)
//   dbc = c·x_proj^T                             cuBLAS, [T, R + 2N]
//   dt  = dbc[:, :R]·dt_proj^T                   cuBLAS, [T, I] (dt_proj_bias + softplus in the scan)
//   per wave: decodes: one bandwidth-bound state-update launch; prefills: one one-pass block scan; y gated
//   out = y·out_proj^T                           cuBLAS, [T, H]; + out_proj_bias, stored for active rows
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

#include "hybridtb/error.h"
#include "ssm/gemm_rows.h"
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

// Chunks of the token-parallel conv: at least 64 tokens, at most 128 chunks per request —
// ceil(L / 128) tokens for long requests.
constexpr int64_t kMinChunkTokens = 64;
constexpr int64_t kMaxChunksPerRequest = 128;

// The eager form of one wave's conv: its chunks (token-parallel conv) and conv-state writes (final
// and block-boundary), uploaded to the step's scratch, and its decode/prefill ranges.
Mamba1Params plan_wave(const GpuStep& step, const GpuWave& wave, const Mamba1Params& base) {
  SsmContext& context = *step.context;
  const int64_t I = base.I, K = base.K;
  Mamba1Params p = base;
  p.wave = wave.device;
  std::vector<GpuChunk> chunks;
  std::vector<int32_t> first_chunk;
  std::vector<GpuConvWrite> conv_writes;
  for (size_t r = 0; r < wave.host.size(); ++r) {
    const GpuRequest& request = wave.host[r];
    const int64_t length = request.end - request.begin;
    const int64_t size = std::max(kMinChunkTokens, (length + kMaxChunksPerRequest - 1) / kMaxChunksPerRequest);
    first_chunk.push_back(static_cast<int32_t>(chunks.size()));
    for (int64_t begin = request.begin; begin < request.end; begin += size) {
      const int64_t end = std::min<int64_t>(request.end, begin + size);
      chunks.push_back(GpuChunk{static_cast<int32_t>(r), static_cast<int32_t>(begin), static_cast<int32_t>(end),
                                end == request.end ? 1 : 0});
    }
    for (int32_t b = 0; b < request.num_boundaries; ++b) {
      const GpuBoundary& boundary = step.boundaries[static_cast<size_t>(request.first_boundary + b)];
      conv_writes.push_back(GpuConvWrite{static_cast<int32_t>(r), boundary.token - request.begin + 1, boundary.slot, 0});
    }
    conv_writes.push_back(
        GpuConvWrite{static_cast<int32_t>(r), request.end - request.begin, request.write_slot, 0});
  }
  p.chunks = context.upload(chunks);
  p.num_chunks = static_cast<int32_t>(chunks.size());
  p.request_first_chunk = context.upload(first_chunk);
  p.conv_writes = context.upload(conv_writes);
  p.num_conv_writes = static_cast<int32_t>(conv_writes.size());
  p.conv_stash = step.scratch_of<float>(std::max<int64_t>(1, wave.device.num_requests * I * (K - 1)));
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
    if (K < 2 || K > kMamba1MaxKernel || N > kMamba1MaxState) {
      throw NotSupported(detail::concat("cuda backend: ssm_mode mamba1 with conv_kernel ", K, " and state_size ", N,
                                        " (the GPU kernels take conv_kernel 2..", kMamba1MaxKernel,
                                        " and state_size <= ", kMamba1MaxState, ")"));
    }
  }

  void forward(const GpuStep& step) const override {
    SsmContext& context = *step.context;
    const cudaStream_t stream = context.stream();
    const auto& params = step.config->ssm_params;
    const int64_t T = step.num_tokens, H = step.hidden_size;
    const int64_t I = params.at("intermediate_size"), N = params.at("state_size");
    const int64_t K = params.at("conv_kernel"), R = params.at("dt_rank");
    const auto weight = [&](const char* name) -> WeightRef {
      const GpuWeight* w = step.weight(name);
      return w != nullptr ? w->ref : WeightRef{};
    };

    Mamba1Params base;
    base.I = static_cast<int32_t>(I);
    base.N = static_cast<int32_t>(N);
    base.K = static_cast<int32_t>(K);
    base.R = static_cast<int32_t>(R);
    base.num_tokens = T;
    base.boundary_slot = step.boundary_slot;
    base.in_bias = weight("in_proj_bias");
    base.conv_w = weight("conv1d_weight");
    base.conv_bias = weight("conv1d_bias");
    base.dt_bias = weight("dt_proj_bias");
    base.A_log = weight("A_log");
    base.D = weight("D");
    base.conv_state = step.pools.at("conv_state");
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

    gemm_rows(step, xz, T, 2 * I, step.hidden.data, step.hidden.kind, step.hidden.row_stride, H, weight("in_proj"),
              "mamba1 in_proj");

    std::vector<Mamba1Params> waves;
    if (step.fixed) {
      // One wave of R entries, each empty or one decode token: the single-token conv update reads
      // and writes the conv slots straight from the request table; the scan's decode launch covers
      // all R entries (both skip empty ones). Nothing host-side depends on the batch.
      Mamba1Params p = base;
      p.wave = step.waves.front().device;
      p.decode_end = p.wave.num_requests;
      p.prefill_begin = p.wave.num_requests;
      launch_mamba1_conv_decode(p, stream);
      waves.push_back(p);
    } else {
      // Eager: per wave, the plan of chunks and conv-state writes, then the conv.
      for (const GpuWave& wave : step.waves) {
        waves.push_back(plan_wave(step, wave, base));
        launch_mamba1_conv(waves.back(), stream);
      }
    }

    gemm_rows(step, dbc, T, R + 2 * N, c, ElementKind::kFloat32, I, I, weight("x_proj"), "mamba1 x_proj");
    gemm_rows(step, dt, T, I, dbc, ElementKind::kFloat32, R + 2 * N, R, weight("dt_proj"), "mamba1 dt_proj");
    for (const Mamba1Params& p : waves) launch_mamba1_scan(p, stream);
    gemm_rows(step, out, T, H, y, ElementKind::kFloat32, I, I, weight("out_proj"), "mamba1 out_proj");
    launch_bias_rows(step.contribution, out, weight("out_proj_bias"), H, T, step.active, stream);
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_mamba1_gpu_mode() { return std::make_unique<Mamba1GpuMode>(); }

}  // namespace hybridtb::cuda::ssm
