// The descriptor of ssm_mode "gdn" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/gdn.cpp, its GPU form optimized/src/ssm/.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/spec/ssm_mode_sizes.h"
#include "tensor_spec_helpers.h"

namespace hybridtb::spec::ssm {
namespace {

class GdnSpec final : public ModeSpec {
 public:
  std::string name() const override { return "gdn"; }

  std::string description() const override {
    return "Gated DeltaNet (Qwen3-Next): in_proj_qkvz/in_proj_ba -> causal conv1d + SiLU -> L2-normalised q, k -> "
           "gated delta rule on a V-major state -> RMSNormGated(o, z) -> out_proj";
  }

  std::vector<std::string> parameters() const override {
    return {"num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"};
  }
  // Qwen3-Next's shape scaled to the layer: one value head per query head of the layer's head
  // size, two value heads per key head (when the head count is even), d_conv 4.
  std::map<std::string, int64_t> default_parameters(const ModeShape& shape) const override {
    const int64_t heads = shape.num_heads;
    return {{"num_v_heads", heads},
            {"num_k_heads", heads % 2 == 0 ? heads / 2 : heads},
            {"head_k_dim", shape.head_size},
            {"head_v_dim", shape.head_size},
            {"conv_kernel", 4}};
  }

  std::vector<TensorSpec> state_specs(const ModeShape& shape) const override {
    return gdn_state_specs(gdn_sizes(shape), shape);
  }

  std::vector<TensorSpec> weight_specs(const ModeShape& shape) const override {
    const GdnSizes s = gdn_sizes(shape);
    const int64_t H = shape.hidden_size, value_width = s.num_v_heads * s.head_v_dim;
    // Projections normal(0, 1/sqrt(fan_in)) so mixed_qkv, z, a and b are O(1); norm_weight around
    // 1 (HF: ones).
    std::vector<TensorSpec> specs = {
        normal_spec("in_proj_qkvz", {s.conv_dim() + value_width, H}, inv_sqrt(H), false,
               "rows q_all (Hk*dk), k_all (Hk*dk), v_all (Hv*dv), z_all (Hv*dv), contiguous: vLLM's order after "
               "fix_query_key_value_ordering, not HF's per-key-head-group interleaving"),
        normal_spec("in_proj_ba", {2 * s.num_v_heads, H}, inv_sqrt(H), false,
               "rows b (Hv; beta = sigmoid(b)), then a (Hv; the decay's input), contiguous"),
    };
    for (TensorSpec& spec : gdn_core_weight_specs(s)) specs.push_back(std::move(spec));
    specs.push_back(uniform_spec("norm_weight", {s.head_v_dim}, 0.5, 1.5,
                            "RMSNormGated weight, shared by the value heads: o/rms(o) * w * silu(z), eps norm_eps"));
    specs.push_back(normal_spec("out_proj", {H, value_width}, inv_sqrt(value_width), false,
                           "num_v_heads*head_v_dim -> hidden (the contribution)"));
    return specs;
  }
};

}  // namespace

std::unique_ptr<ModeSpec> make_gdn_mode_spec() { return std::make_unique<GdnSpec>(); }

}  // namespace hybridtb::spec::ssm
