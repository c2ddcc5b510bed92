// The sizes of the model-layer SSM modes (ssm_mode_sizes.h).
#include "hybridtb/spec/ssm_mode_sizes.h"

#include <cmath>
#include <utility>

#include "hybridtb/error.h"
#include "ssm_modes/tensor_spec_helpers.h"

namespace hybridtb::spec::ssm {

Mamba1Sizes mamba1_sizes(const ModeShape& shape) {
  const Mamba1Sizes s{.hidden = shape.hidden_size,
                      .intermediate = shape.param("intermediate_size"),
                      .state = shape.param("state_size"),
                      .kernel = shape.param("conv_kernel"),
                      .dt_rank = shape.param("dt_rank")};
  HYBRIDTB_CHECK(s.kernel >= 2, "/config/ssm conv_kernel must be >= 2 for ssm_mode mamba1 (the conv state keeps ",
                 "conv_kernel - 1 inputs), got ", s.kernel);
  return s;
}

void check_mamba2_sizes(const Mamba2Sizes& s) {
  for (const auto& [name, value] : {std::pair{"num_ssm_heads", s.heads}, std::pair{"head_dim", s.head_dim},
                                    std::pair{"state_size", s.state}, std::pair{"n_groups", s.groups},
                                    std::pair{"conv_kernel", s.kernel}}) {
    HYBRIDTB_CHECK(value > 0, "/config/ssm ", name, " must be > 0 for ssm_mode mamba2, got ", value);
  }
  HYBRIDTB_CHECK(s.heads % s.groups == 0, "/config/ssm n_groups = ", s.groups,
                 " must divide num_ssm_heads = ", s.heads,
                 " for ssm_mode mamba2 (head h reads the B and C of group h / (num_ssm_heads / n_groups))");
  HYBRIDTB_CHECK(s.kernel >= 2, "/config/ssm conv_kernel must be >= 2 for ssm_mode mamba2 (the conv state keeps ",
                 "conv_kernel - 1 inputs), got ", s.kernel);
}

Mamba2Sizes mamba2_sizes(const ModeShape& shape) {
  Mamba2Sizes s;
  s.heads = shape.param("num_ssm_heads");
  s.head_dim = shape.param("head_dim");
  s.state = shape.param("state_size");
  s.groups = shape.param("n_groups");
  s.kernel = shape.param("conv_kernel");
  check_mamba2_sizes(s);
  return s;
}

GdnSizes gdn_sizes(const ModeShape& shape) {
  const GdnSizes s{.num_k_heads = shape.param("num_k_heads"),
                   .num_v_heads = shape.param("num_v_heads"),
                   .head_k_dim = shape.param("head_k_dim"),
                   .head_v_dim = shape.param("head_v_dim"),
                   .conv_kernel = shape.param("conv_kernel")};
  HYBRIDTB_CHECK(s.num_v_heads % s.num_k_heads == 0, "/config/ssm num_v_heads = ", s.num_v_heads,
                 " must be a multiple of /config/ssm num_k_heads = ", s.num_k_heads,
                 " for ssm_mode gdn (each key head serves num_v_heads / num_k_heads value heads)");
  HYBRIDTB_CHECK(s.conv_kernel >= 2, "/config/ssm conv_kernel must be >= 2 for ssm_mode gdn (the conv state keeps ",
                 "conv_kernel - 1 inputs), got ", s.conv_kernel);
  return s;
}

std::vector<TensorSpec> gdn_state_specs(const GdnSizes& s, const ModeShape& shape) {
  // Random states are standard normal (the default init): conv inputs are projections of O(1)
  // hidden states, and M stays O(1) under the non-expanding transition α(I − β k̂ k̂ᵀ).
  return {
      conv_state_spec(shape, s.conv_dim(), s.conv_kernel - 1,
                      "the last conv_kernel - 1 mixed_qkv rows (q, k, v channels before the conv) per channel, "
                      "oldest first"),
      {"recurrent_state", {s.num_v_heads, s.head_v_dim, s.head_k_dim}, DType::kFloat32, false,
       "the delta-rule state M per value head, V-major [head_v_dim, head_k_dim] as vLLM, SGLang, FlashInfer and "
       "pymllm store it (fla/HF keep the transpose S = M^T)"},
  };
}

std::vector<TensorSpec> gdn_core_weight_specs(const GdnSizes& s) {
  // A_log uniform in [0, log 16) (HF draws A uniform in (0, 16)); dt_bias uniform in [−6.9, −2.25)
  // = softplus⁻¹ of [1e-3, 0.1) (fla/mamba's dt range), so with a ~ N(0, 1) most decays α lie well
  // inside (0, 1) and random models neither forget everything nor never forget.
  return {
      normal_spec("conv1d_weight", {s.conv_dim(), s.conv_kernel}, inv_sqrt(s.conv_kernel), false,
             "depthwise causal conv taps per channel (q, k, v order); column K-1 multiplies the current token"),
      normal_spec("conv1d_bias", {s.conv_dim()}, 0.1, true, "conv bias, before the SiLU (Qwen3-Next has none)"),
      uniform_spec("A_log", {s.num_v_heads}, 0.0, std::log(16.0), "per value head; g = -exp(A_log) * softplus(a + dt_bias)"),
      uniform_spec("dt_bias", {s.num_v_heads}, -6.9, -2.25, "per value head, added to a before the softplus (threshold 20)"),
  };
}

}  // namespace hybridtb::spec::ssm
