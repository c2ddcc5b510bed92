// The descriptor of ssm_mode "mamba2" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/mamba2.cpp, its GPU form optimized/src/ssm/.
#include <algorithm>
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

class Mamba2Spec final : public ModeSpec {
 public:
  std::string name() const override { return "mamba2"; }

  std::string description() const override {
    return "Mamba-2 (SSD) mixer as vLLM's MambaMixer2: in_proj [z|x|B|C|dt] -> causal conv1d + SiLU over xBC -> "
           "scalar-decay recurrence per head (A = -exp(A_log), grouped B/C, D skip) -> gated RMSNorm with z -> "
           "out_proj";
  }

  std::vector<std::string> parameters() const override {
    return {"num_ssm_heads", "head_dim", "state_size", "n_groups", "conv_kernel"};
  }
  // Mamba-2's conventions (mamba_ssm Mamba2): expand 2 over heads of head_dim (default 64),
  // d_state 128, one group, d_conv 4.
  std::map<std::string, int64_t> default_parameters(const ModeShape& shape) const override {
    const auto given = shape.params.find("head_dim");
    const int64_t head_dim = given != shape.params.end() ? given->second : 64;
    return {{"head_dim", head_dim},
            {"num_ssm_heads", std::max<int64_t>(1, 2 * shape.hidden_size / head_dim)},
            {"state_size", 128},
            {"n_groups", 1},
            {"conv_kernel", 4}};
  }

  std::vector<TensorSpec> state_specs(const ModeShape& shape) const override {
    const Mamba2Sizes s = mamba2_sizes(shape);
    // Random states are standard normal (the default init): conv inputs are in_proj outputs of
    // O(1) hidden states, and S stays O(1) under a decay ≤ 1.
    return {
        conv_state_spec(shape, s.conv_dim(), s.kernel - 1,
                        "the last conv_kernel - 1 conv inputs (xBC after in_proj, before the conv) per channel, "
                        "oldest first"),
        {"ssm_state", {s.heads, s.head_dim, s.state}, DType::kFloat32, false,
         "the SSD state S per head, [num_ssm_heads, head_dim, state_size] (vLLM's layout)"},
    };
  }

  std::vector<TensorSpec> weight_specs(const ModeShape& shape) const override {
    const Mamba2Sizes s = mamba2_sizes(shape);
    const int64_t H = shape.hidden_size, Hs = s.heads, d_ssm = s.d_ssm(), conv_dim = s.conv_dim();
    // Random models follow mamba_ssm's Mamba2 initialisation where it keeps values sane: projections
    // normal(0, 1/sqrt(fan_in)) so every stage stays O(1); biases small; dt_bias uniform in
    // [−6.9, −2.25) = softplus⁻¹ of [1e-3, 0.1) (dt_min, dt_max); A_log uniform in [0, log 16)
    // so A spans A_init_range −1 … −16; D and the norm weight around 1 (mamba_ssm: ones).
    std::vector<TensorSpec> specs = {
        normal_spec("in_proj", {2 * d_ssm + 2 * s.groups * s.state + Hs, H}, inv_sqrt(H), false,
               "rows z (d_ssm), x (d_ssm), B (G*N), C (G*N), dt (num_ssm_heads), mamba_ssm's order"),
        normal_spec("in_proj_bias", {2 * d_ssm + 2 * s.groups * s.state + Hs}, 0.1, true,
               "added to in_proj's output, same order"),
        normal_spec("conv1d_weight", {conv_dim, s.kernel}, inv_sqrt(s.kernel), false,
               "depthwise causal conv taps per x|B|C channel; column K-1 multiplies the current token"),
        normal_spec("conv1d_bias", {conv_dim}, 0.1, true, "conv bias, before the SiLU"),
        uniform_spec("dt_bias", {Hs}, -6.9, -2.25, "added to dt before the softplus (threshold 20)"),
        uniform_spec("A_log", {Hs}, 0.0, std::log(16.0), "A = -exp(A_log), one scalar decay rate per head"),
        uniform_spec("D", {Hs}, 0.5, 1.5, "skip connection y += D * x per head"),
        uniform_spec("norm_weight", {d_ssm}, 0.5, 1.5,
                "gated RMSNorm scale: rmsnorm(y * silu(z)) * w over groups of d_ssm / n_groups, eps norm_eps"),
        normal_spec("out_proj", {H, d_ssm}, inv_sqrt(d_ssm), false, "d_ssm -> hidden (the contribution)"),
        normal_spec("out_proj_bias", {H}, 0.1, true, "added to out_proj's output"),
    };
    // Without rms_norm (mamba_rms_norm = 0) the gate has no weight, as vLLM registers none.
    if (!shape.mamba2_rms_norm) {
      specs.erase(std::remove_if(specs.begin(), specs.end(), [](const TensorSpec& t) { return t.name == "norm_weight"; }),
                  specs.end());
    }
    return specs;
  }
};

}  // namespace

std::unique_ptr<ModeSpec> make_mamba2_mode_spec() { return std::make_unique<Mamba2Spec>(); }

}  // namespace hybridtb::spec::ssm
