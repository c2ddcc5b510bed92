// GPU ssm_mode "gdn" (reference/ssm/gdn.cpp: Qwen3-Next's Gated DeltaNet as vLLM/fla/FlashInfer
// serve it), float32 arithmetic:
//   qkvz = hidden·in_proj_qkvz^T       cuBLAS, [T, conv_dim + Hv·dv]: q_all | k_all | v_all | z_all
//   ba   = hidden·in_proj_ba^T         cuBLAS, [T, 2·Hv]: b | a
//   o    = the GDN core (launch_gdn_core, below; gdn_kernels.h) of mixed_qkv = qkvz[:, :conv_dim], a, b
//   y    = o_h / sqrt(mean(o_h²) + eps) ⊙ norm_weight ⊙ silu(z_h)   per value head h (rows that run;
//          eps = gated_norm_eps: the layer's norm eps, 1e-6 by default)
//   out  = y·out_proj^T                cuBLAS, [T, H], stored for the rows that run
// The core, per wave: the shared causal conv + SiLU front end (causal_conv.h) over mixed_qkv with its
// conv-state stash and final/block-boundary writes; the per-token preparation (L2-normalised q and k,
// q·dk^-1/2, g, β); then the decodes' single-step update (one bandwidth-bound launch) and the
// prefills' chunked WY form (chunks of 64 cut after block-boundary tokens: the host plans them and
// uploads the list per wave). Every intermediate stays float32; with BackendSettings::
// ssm_prefill_operands model and a 16-bit model, the chunked prefill's product operands are rounded
// to the model dtype (gdn_kernels.h, product_operands), and their state pass runs on wgmma on a
// compute capability 9.0 device (state_wgmma; mma.sync elsewhere, or everywhere with
// BackendSettings::ssm_prefill_wgmma false). A fixed decode step (ssm_gpu_mode.h) runs
// the same GEMMs over all T padded rows and, for its one wave of R entries, the single-token conv,
// the preparation and the decode update straight from the request table: no host-side lists, no
// uploads.
// A GDN layer of a per-layer model (layer_kind gdn) runs the core alone on the layer's own inputs,
// read where they lie in their own element type, o written straight to the layer's output
// (linear_forward): a decode step is three launches, conv, preparation and decode update (the
// preparation stays a launch of its own: inside the decode kernel its registers and the gates'
// dependent loads would cost more than the launch).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "ssm/causal_conv.h"
#include "ssm/gdn_kernels.h"
#include "ssm/gemm_rows.h"
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

// The sizes of /config/ssm (the driver has checked every tensor against them).
struct GdnSizes {
  int64_t Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;
  int64_t conv_dim() const { return 2 * Hk * dk + Hv * dv; }
  int64_t value_width() const { return Hv * dv; }
};

GdnSizes sizes_of(const GpuStep& step) {
  const auto& params = step.config->ssm_params;
  return GdnSizes{.Hk = params.at("num_k_heads"),
                  .Hv = params.at("num_v_heads"),
                  .dk = params.at("head_k_dim"),
                  .dv = params.at("head_v_dim"),
                  .K = params.at("conv_kernel")};
}

// The eager plan of one wave: its decodes' range and its prefills' chunks (uploaded to the step's
// scratch) with their entry-state scratch. A chunk ends after kGdnChunk tokens, after a block-boundary token (its exit state is the
// boundary state) or at the request's end, whichever comes first.
void plan_wave(const GpuStep& step, const GpuWave& wave, GdnParams& p) {
  std::vector<GdnPrefill> prefills;
  std::vector<GdnChunk> chunks;
  p.decode_end = 0;
  for (size_t r = 0; r < wave.host.size(); ++r) {
    const GpuRequest& request = wave.host[r];
    if (request.decode != 0) {
      p.decode_end = static_cast<int32_t>(r + 1);  // the driver lists decodes first
      continue;
    }
    GdnPrefill prefill;
    prefill.request = static_cast<int32_t>(r);
    prefill.first_chunk = static_cast<int32_t>(chunks.size());
    for (int32_t begin = request.begin; begin < request.end;) {
      int32_t end = std::min(request.end, begin + kGdnChunk);
      for (int32_t b = 0; b < request.num_boundaries; ++b) {
        const int32_t token = step.boundaries[static_cast<size_t>(request.first_boundary + b)].token;
        if (token >= begin && token + 1 < end) end = token + 1;
      }
      chunks.push_back(GdnChunk{static_cast<int32_t>(r), begin, end, 0});
      begin = end;
    }
    prefill.num_chunks = static_cast<int32_t>(chunks.size()) - prefill.first_chunk;
    prefills.push_back(prefill);
  }
  p.prefills = step.context->upload(prefills);
  p.num_prefills = static_cast<int32_t>(prefills.size());
  p.chunks = step.context->upload(chunks);
  p.num_chunks = static_cast<int32_t>(chunks.size());
  // Each chunk's entry state (Hv·dv·dk per chunk: 2 MiB float32 at Qwen3-Next's sizes, about 32 KiB
  // per prefill token; half that with 16-bit operands), for the prefill's output pass; each chunk's W
  // (per value head) and k̂ (per key head) in the state pass's fragment order: 32 KiB per chunk and
  // head float32, 16 KiB 16-bit. Elements of gdn_scratch_element_bytes.
  const size_t element = gdn_scratch_element_bytes(p.product_operands);
  const auto scratch_elements = [&](int64_t count) {
    return chunks.empty() ? nullptr : step.scratch(static_cast<size_t>(count) * element);
  };
  p.h = scratch_elements(int64_t{p.num_chunks} * p.Hv * p.dv * gdn_entry_state_row(p.dk, p.product_operands));
  p.w_frag = scratch_elements(int64_t{p.num_chunks} * p.Hv * kGdnFragTileElements);
  p.k_frag = scratch_elements(int64_t{p.num_chunks} * p.Hk * kGdnFragTileElements);
  if (p.product_operands != ElementKind::kFloat32) {  // V_new rounded to the operands (else over u)
    p.v_new = scratch_elements(int64_t{p.num_chunks} * p.Hv * p.dv * kGdnChunk);
    p.q_frag = scratch_elements(int64_t{p.num_chunks} * p.Hk * kGdnFragTileElements);
    p.attn_frag = scratch_elements(int64_t{p.num_chunks} * p.Hv * kGdnChunk * kGdnChunk);
  }
}

}  // namespace

void check_gdn_supported(const GpuStep& step) {
  const GdnSizes s = sizes_of(step);
  if (s.dk > kGdnMaxHeadDim || s.dv > kGdnMaxHeadDim) {
    throw NotSupported(detail::concat("cuda backend: ssm_mode gdn with head_k_dim ", s.dk, " and head_v_dim ", s.dv,
                                      " (the GPU kernels take head_k_dim and head_v_dim <= ", kGdnMaxHeadDim, ")"));
  }
  if (s.K < 2 || s.K > kCausalConvMaxKernel) {
    throw NotSupported(detail::concat("cuda backend: ssm_mode gdn with conv_kernel ", s.K,
                                      " (the GPU conv takes conv_kernel 2..", kCausalConvMaxKernel, ")"));
  }
}

void launch_gdn_core(const GpuStep& step, const GdnCoreIo& io) {
  const cudaStream_t stream = step.context->stream();
  const GdnSizes s = sizes_of(step);
  const int64_t T = step.num_tokens;


  GdnParams base;
  base.Hk = static_cast<int32_t>(s.Hk);
  base.Hv = static_cast<int32_t>(s.Hv);
  base.dk = static_cast<int32_t>(s.dk);
  base.dv = static_cast<int32_t>(s.dv);
  base.num_tokens = T;
  base.boundary_slot = step.boundary_slot;
  base.qkv = step.scratch_of<float>(T * s.conv_dim());
  base.a = io.a;
  base.b = io.b;
  base.g = step.scratch_of<float>(T * s.Hv);
  base.beta = step.scratch_of<float>(T * s.Hv);
  base.o = io.o;
  base.A_log = step.weight_ref("A_log");
  base.dt_bias = step.weight_ref("dt_bias");
  base.recurrent_state = step.pools.at("recurrent_state");
  // ssm_prefill_operands model: the chunked prefill's product operands in the model dtype when it is
  // 16-bit (a float32 model's operands are float32 already: 3xTF32). Decodes have no products.
  if (step.prefill.operands == SsmPrefillOperands::kModel) {
    if (step.config->dtype == DType::kFloat16) base.product_operands = ElementKind::kFloat16;
    if (step.config->dtype == DType::kBFloat16) base.product_operands = ElementKind::kBFloat16;
  }
  // Their state pass on wgmma where the device runs sm_90a code (its compute capability, queried once
  // with the context) and the build has it, unless the mma.sync body is asked for.
  const bool hopper = step.context->compute_capability().is_hopper();
  base.state_wgmma =
      base.product_operands != ElementKind::kFloat32 && step.prefill.wgmma && gdn_wgmma_built() && hopper ? 1 : 0;
  const CausalConvParams conv = mode_causal_conv(step, s.conv_dim(), io.mixed_qkv, base.qkv);

  if (step.fixed) {
    // One wave of R entries, each empty or one decode token: nothing host-side depends on the batch.
    GdnParams p = base;
    p.wave = step.waves.front().device;
    p.decode_end = p.wave.num_requests;
    causal_conv_silu_fixed(step, conv);
    launch_gdn_prepare(p, stream);
    launch_gdn_decode(p, stream);
    return;
  }

  // Eager: the chunk buffers (indexed by token row, so every wave's prefills share them) when any
  // wave has a prefill.
  const bool any_prefill = std::any_of(step.waves.begin(), step.waves.end(), [](const GpuWave& wave) {
    return std::any_of(wave.host.begin(), wave.host.end(), [](const GpuRequest& r) { return r.decode == 0; });
  });
  if (any_prefill) {
    base.u = step.scratch_of<float>(T * s.Hv * s.dv);
    if (base.product_operands == ElementKind::kFloat32) base.attn = step.scratch_of<float>(T * s.Hv * kGdnChunk);
    base.gcum = step.scratch_of<float>(T * s.Hv);
  }
  for (const GpuWave& wave : step.waves) {
    GdnParams p = base;
    p.wave = wave.device;
    plan_wave(step, wave, p);
    causal_conv_silu(step, wave, conv);
    launch_gdn_prepare(p, stream);
    launch_gdn_decode(p, stream);
    launch_gdn_prefill(p, stream);
  }
}

namespace {

class GdnGpuMode final : public GpuMode {
 public:
  std::string name() const override { return "gdn"; }
  bool uses_cublas() const override { return true; }
  void check_supported(const GpuStep& step) const override { check_gdn_supported(step); }

  void forward(const GpuStep& step) const override {
    const cudaStream_t stream = step.context->stream();
    const GdnSizes s = sizes_of(step);
    const int64_t T = step.num_tokens, H = step.hidden_size;
    const int64_t qkvz_width = s.conv_dim() + s.value_width();

    float* qkvz = step.scratch_of<float>(T * qkvz_width);
    float* ba = step.scratch_of<float>(T * 2 * s.Hv);
    float* o = step.scratch_of<float>(T * s.value_width());
    float* y = step.scratch_of<float>(T * s.value_width());
    float* out = step.scratch_of<float>(T * H);

    gemm_rows(step, qkvz, T, qkvz_width, step.hidden.data, step.hidden.kind, step.hidden.row_stride, H,
              step.weight_ref("in_proj_qkvz"), "gdn in_proj_qkvz");
    gemm_rows(step, ba, T, 2 * s.Hv, step.hidden.data, step.hidden.kind, step.hidden.row_stride, H,
              step.weight_ref("in_proj_ba"), "gdn in_proj_ba");
    GdnCoreIo io;
    io.mixed_qkv = RowsRef{qkvz, ElementKind::kFloat32, qkvz_width};  // the first conv_dim columns of each qkvz row
    io.b = RowsRef{ba, ElementKind::kFloat32, 2 * s.Hv};  // in_proj_ba rows: b, then a
    io.a = RowsRef{ba + s.Hv, ElementKind::kFloat32, 2 * s.Hv};
    io.o = RowsRef{o, ElementKind::kFloat32, s.value_width()};
    launch_gdn_core(step, io);
    launch_gdn_gated_norm(o, qkvz + s.conv_dim(), qkvz_width, step.weight_ref("norm_weight"), y,
                          static_cast<int32_t>(s.Hv), static_cast<int32_t>(s.dv), T, step.active,
                          static_cast<float>(gated_norm_eps(*step.config, "gdn")), stream);
    gemm_rows(step, out, T, H, y, ElementKind::kFloat32, s.value_width(), s.value_width(),
              step.weight_ref("out_proj"), "gdn out_proj");
    launch_bias_rows(step.contribution, FloatColumns{out, H, 0}, WeightRef{}, H, T, step.active, stream);
  }

  // A GDN layer of a per-layer model: the core alone on the layer's mixed_qkv, a and b, read where
  // they lie (the conv and the gates widen them exactly), its read-out o written straight to the
  // layer's output rows (the driver zeroes skipped rows).
  void linear_forward(const GpuStep& step) const override {
    GdnCoreIo io;
    io.mixed_qkv = step.linear_inputs.at("mixed_qkv");
    io.a = step.linear_inputs.at("a");
    io.b = step.linear_inputs.at("b");
    io.o = step.contribution;
    launch_gdn_core(step, io);
  }
};

}  // namespace

std::unique_ptr<GpuMode> make_gdn_gpu_mode() { return std::make_unique<GdnGpuMode>(); }

}  // namespace hybridtb::cuda::ssm
