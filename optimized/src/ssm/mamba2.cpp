// GPU ssm_mode "mamba2" (reference/ssm/mamba2.cpp: vLLM's MambaMixer2, Mamba-2 / SSD), float32
// arithmetic, with Hs heads of P channels, N = state_size, G = n_groups, d_ssm = Hs·P,
// conv_dim = d_ssm + 2·G·N:
//   zxbcdt = hidden·in_proj^T               cuBLAS, [T, z (d_ssm) | xBC (conv_dim) | dt (Hs)] float32
//                                           (in_proj_bias added where each part is used)
//   per wave: xBC → causal conv1d + SiLU (causal_conv.h, conv-state write-back incl. block
//             boundaries) → the SSM: decodes one bandwidth-bound single-step update, prefills the
//             chunked SSD (mamba2_kernels.h) — y [T, d_ssm] with the D skip; ssm_state written
//   v   = gated RMSNorm(y, z)               per row and group of d_ssm / G (norm_before_gate False)
//   out = v·out_proj^T                      cuBLAS, [T, H]; + out_proj_bias, stored for active rows
// Prefill chunks are ≤ kMamba2ChunkTokens (128) tokens cut from each request's first row and also
// ended after every block-boundary row (mamba_cache_mode all), so the state after a boundary row is
// a state between chunks; the chunk lists are planned on the host per wave and uploaded. A fixed
// decode step (ssm_gpu_mode.h) runs the same GEMMs over all T padded rows, and for its one wave of R
// entries the single-token conv update and the decode update straight from the request table: no
// uploads, grids from the shape only. Every intermediate stays float32 (the reference rounds
// nothing either); with BackendSettings::ssm_prefill_operands model and a 16-bit model, the chunked
// prefill's product operands are rounded to the model dtype (mamba2_kernels.h, product_operands),
// and its chunk states and chunk scan run on wgmma on a compute capability 9.0 device (chunk_wgmma;
// mma.sync elsewhere, or everywhere with BackendSettings::ssm_prefill_wgmma false); there the chunk
// states and the state passing run as one walk over each sequence's chunks unless
// BackendSettings::ssm_prefill_fused_state_pass is false (mamba2_fused_state_pass).
// A Mamba-2 layer of a per-layer model (layer_kind mamba2) runs the core alone on the layer's own
// xBC and dt (linear_forward).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "ssm/causal_conv.h"
#include "ssm/gemm_rows.h"
#include "ssm/mamba2_kernels.h"
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {


struct Mamba2Sizes {
  int64_t heads, head_dim, state, groups, kernel;
  int64_t d_ssm() const { return heads * head_dim; }
  int64_t conv_dim() const { return d_ssm() + 2 * groups * state; }
  int64_t proj() const { return d_ssm() + conv_dim() + heads; }  // in_proj's rows: z | xBC | dt
};

Mamba2Sizes sizes_of(const GpuStep& step) {
  const auto& p = step.config->ssm_params;
  return Mamba2Sizes{p.at("num_ssm_heads"), p.at("head_dim"), p.at("state_size"), p.at("n_groups"),
                     p.at("conv_kernel")};
}

// `w` from its element `first` on (absent stays absent): a part of in_proj_bias.
WeightRef weight_from(const WeightRef& w, int64_t first) {
  if (w.data == nullptr) return w;
  const int64_t bytes = w.kind == ElementKind::kFloat32                                      ? 4
                        : w.kind == ElementKind::kFloat16 || w.kind == ElementKind::kBFloat16 ? 2
                                                                                              : 1;
  return WeightRef{static_cast<const char*>(w.data) + first * bytes, w.kind};
}

// The chunked prefill's lists for the wave's prefill requests (decodes run the decode update):
// chunks of ≤ kMamba2ChunkTokens rows from each request's first row, a chunk also ending after
// every block-boundary row (its boundary_slot), consecutive per request; uploaded, with the
// chunk-state scratch. Returns false if the wave has no prefill.
bool plan_prefill(const GpuStep& step, const GpuWave& wave, const Mamba2Sizes& s, Mamba2Params& p) {
  std::vector<Mamba2Chunk> chunks;
  std::vector<Mamba2Sequence> sequences;
  for (const GpuRequest& request : wave.host) {
    if (request.decode != 0 || request.end <= request.begin) continue;
    std::vector<GpuBoundary> boundaries(step.boundaries.begin() + request.first_boundary,
                                        step.boundaries.begin() + request.first_boundary + request.num_boundaries);
    std::sort(boundaries.begin(), boundaries.end(),
              [](const GpuBoundary& a, const GpuBoundary& b) { return a.token < b.token; });
    Mamba2Sequence sequence;
    sequence.first_chunk = static_cast<int32_t>(chunks.size());
    sequence.read_slot = request.read_slot;
    sequence.write_slot = request.write_slot;
    size_t next = 0;
    for (int32_t begin = request.begin; begin < request.end;) {
      Mamba2Chunk chunk;
      chunk.begin = begin;
      chunk.end = std::min(request.end, begin + kMamba2ChunkTokens);
      if (next < boundaries.size() && boundaries[next].token < chunk.end) {
        chunk.end = boundaries[next].token + 1;
        chunk.boundary_slot = boundaries[next].slot;
        ++next;
      }
      chunks.push_back(chunk);
      begin = chunk.end;
    }
    sequence.num_chunks = static_cast<int32_t>(chunks.size()) - sequence.first_chunk;
    sequences.push_back(sequence);
  }
  if (chunks.empty()) return false;
  SsmContext& context = *step.context;
  p.chunks = context.upload(chunks);
  p.num_chunks = static_cast<int32_t>(chunks.size());
  p.sequences = context.upload(sequences);
  p.num_sequences = static_cast<int32_t>(sequences.size());
  p.chunk_decay = step.scratch_of<float>(p.num_chunks * s.heads);
  p.chunk_cumsum = step.scratch_of<float>(p.num_chunks * s.heads * 3 * kMamba2ChunkTokens);
  p.chunk_cb = step.scratch_of<float>(p.num_chunks * s.groups * kMamba2ChunkTokens * kMamba2ChunkTokens);
  if (p.product_operands != ElementKind::kFloat32 && p.chunk_wgmma != 0) {  // 16-bit entering states, B and C
    p.chunk_states16 = step.scratch_of<uint16_t>(p.num_chunks * s.heads * s.head_dim * s.state);
    p.bc16 = step.scratch_of<uint16_t>(p.num_tokens * 2 * s.groups * s.state);
  }
  // The float32 chunk states: none where one kernel computes and passes them (in registers).
  if (!mamba2_fused_state_pass(p)) {
    p.chunk_states = step.scratch_of<float>(p.num_chunks * s.heads * s.head_dim * s.state);
  }
  return true;
}

class Mamba2GpuMode final : public GpuMode {
 public:
  std::string name() const override { return "mamba2"; }
  bool uses_cublas() const override { return true; }

  void check_supported(const GpuStep& step) const override {
    const Mamba2Sizes s = sizes_of(step);
    const auto refuse = [](const std::string& what) {
      throw NotSupported("cuda backend: ssm_mode mamba2 with " + what);
    };
    if (s.kernel < 2 || s.kernel > kCausalConvMaxKernel) {
      refuse(detail::concat("conv_kernel ", s.kernel, " (the GPU conv takes conv_kernel 2..", kCausalConvMaxKernel,
                            ")"));
    }
    if (s.state < 1 || s.state > kMamba2MaxState) {
      refuse(detail::concat("state_size ", s.state, " (the GPU decode update takes state_size 1..", kMamba2MaxState,
                            ")"));
    }
    if (s.heads < 1 || s.heads > 65535 || s.head_dim < 1 || s.groups < 1 || s.heads % s.groups != 0) {
      refuse(detail::concat("num_ssm_heads ", s.heads, ", head_dim ", s.head_dim, " and n_groups ", s.groups,
                            " (the GPU kernels take 1..65535 heads, head_dim >= 1, n_groups dividing num_ssm_heads)"));
    }
    if (s.proj() > INT32_MAX) {
      refuse(detail::concat("in_proj width ", s.proj(), " (the GPU kernels index channels in 32 bits)"));
    }
  }

  void forward(const GpuStep& step) const override {
    const cudaStream_t stream = step.context->stream();
    const Mamba2Sizes s = sizes_of(step);
    const int64_t T = step.num_tokens, H = step.hidden_size;
    const int64_t d_ssm = s.d_ssm(), proj = s.proj();
    const WeightRef in_bias = step.weight_ref("in_proj_bias");

    float* zxbcdt = step.scratch_of<float>(T * proj);
    float* y = step.scratch_of<float>(T * d_ssm);
    float* v = step.scratch_of<float>(T * d_ssm);
    float* out = step.scratch_of<float>(T * H);

    gemm_rows(step, zxbcdt, T, proj, step.hidden.data, step.hidden.kind, step.hidden.row_stride, H, step.weight_ref("in_proj"),
              "mamba2 in_proj");
    run_core(step, s, RowsRef{zxbcdt + d_ssm, ElementKind::kFloat32, proj},
             RowsRef{zxbcdt + d_ssm + s.conv_dim(), ElementKind::kFloat32, proj}, in_bias,
             RowsRef{y, ElementKind::kFloat32, d_ssm});

    Mamba2NormParams norm;
    norm.d_ssm = static_cast<int32_t>(d_ssm);
    norm.groups = static_cast<int32_t>(s.groups);
    norm.num_tokens = T;
    norm.eps = static_cast<float>(gated_norm_eps(*step.config, "mamba2"));  // the reference's eps
    norm.y = y;
    norm.z = zxbcdt;
    norm.z_stride = proj;
    norm.z_bias = in_bias;
    norm.norm_weight = step.weight_ref("norm_weight");
    norm.rms_norm = step.config->mamba_rms_norm ? 1 : 0;
    norm.flags = step.active;
    norm.out = v;
    launch_mamba2_gated_norm(norm, stream);

    gemm_rows(step, out, T, H, v, ElementKind::kFloat32, d_ssm, d_ssm, step.weight_ref("out_proj"), "mamba2 out_proj");
    launch_bias_rows(step.contribution, FloatColumns{out, H, 0}, step.weight_ref("out_proj_bias"), H, T, step.active,
                     stream);
  }

  // A Mamba-2 layer of a per-layer model: the core alone on the layer's xBC and dt, read where they
  // lie (the conv and the SSM widen them exactly; z unused, no in_proj bias), y written straight to
  // the layer's output rows (the driver zeroes skipped rows): a decode step is two launches.
  void linear_forward(const GpuStep& step) const override {
    run_core(step, sizes_of(step), step.linear_inputs.at("xBC"), step.linear_inputs.at("dt"), WeightRef{},
             step.contribution);
  }

 private:
  // The core (conv + SiLU over xBC, the SSM with the D skip) from the rows xBC [T, conv_dim] and dt
  // [T, Hs] (in_proj's, + in_bias, whose parts sit at in_proj's columns, where each is used) into
  // the rows y [T, d_ssm] (written for the rows of the requests that run).
  static void run_core(const GpuStep& step, const Mamba2Sizes& s, const RowsRef& xBC, const RowsRef& dt,
                       const WeightRef& in_bias, const RowsRef& y) {
    const cudaStream_t stream = step.context->stream();
    const int64_t T = step.num_tokens;
    const int64_t d_ssm = s.d_ssm(), conv_dim = s.conv_dim();
    float* xbc = step.scratch_of<float>(T * conv_dim);

    const CausalConvParams conv = mode_causal_conv(step, conv_dim, xBC, xbc, weight_from(in_bias, d_ssm));

    Mamba2Params base;
    base.heads = static_cast<int32_t>(s.heads);
    base.head_dim = static_cast<int32_t>(s.head_dim);
    base.state = static_cast<int32_t>(s.state);
    base.groups = static_cast<int32_t>(s.groups);
    base.num_tokens = T;
    base.dt = dt;
    base.xbc = xbc;
    base.y = y;
    base.in_bias = in_bias;
    base.dt_bias = step.weight_ref("dt_bias");
    base.A_log = step.weight_ref("A_log");
    base.D = step.weight_ref("D");
    base.ssm_state = step.pools.at("ssm_state");
    // ssm_prefill_operands model: the chunk kernels' operands in the model dtype when it is 16-bit
    // (a float32 model's operands are float32 already: 3xTF32).
    if (step.prefill.operands == SsmPrefillOperands::kModel) {
      if (step.config->dtype == DType::kFloat16) base.product_operands = ElementKind::kFloat16;
      if (step.config->dtype == DType::kBFloat16) base.product_operands = ElementKind::kBFloat16;
    }
    // Their chunk states and chunk scan on wgmma where the device runs sm_90a code (its compute
    // capability, queried once with the context) and the build has it, unless the mma.sync bodies
    // are asked for.
    const bool hopper = step.context->compute_capability().is_hopper();
    base.chunk_wgmma = step.prefill.wgmma && mamba2_wgmma_built() && hopper ? 1 : 0;
    base.fuse_state_passing = step.prefill.fused_state_pass ? 1 : 0;

    if (step.fixed) {
      // One wave of R entries, each empty or one decode token: both updates read and write the
      // slots straight from the request table and skip empty entries.
      causal_conv_silu_fixed(step, conv);
      Mamba2Params p = base;
      p.wave = step.waves.front().device;
      p.decode_all = 1;
      launch_mamba2_decode(p, stream);
      return;
    }
    for (const GpuWave& wave : step.waves) {
      causal_conv_silu(step, wave, conv);
      Mamba2Params p = base;
      p.wave = wave.device;
      p.boundary_slot = step.boundary_slot;
      const bool has_decodes =
          std::any_of(wave.host.begin(), wave.host.end(), [](const GpuRequest& r) { return r.decode != 0; });
      if (has_decodes) launch_mamba2_decode(p, stream);
      if (plan_prefill(step, wave, s, p)) launch_mamba2_prefill(p, stream);
    }
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_mamba2_gpu_mode() { return std::make_unique<Mamba2GpuMode>(); }

}  // namespace hybridtb::cuda::ssm
