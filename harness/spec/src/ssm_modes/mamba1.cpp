// The descriptor of ssm_mode "mamba1" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/mamba1.cpp, its GPU form optimized/src/ssm/.
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

class Mamba1Spec final : public ModeSpec {
 public:
  std::string name() const override { return "mamba1"; }

  std::string description() const override {
    return "Mamba-1 mixer as vLLM's MambaMixer: in_proj -> causal conv1d + SiLU -> x_proj -> dt_proj + softplus -> "
           "selective scan (A = -exp(A_log), D skip) -> silu(z) gate -> out_proj";
  }

  std::vector<std::string> parameters() const override {
    return {"intermediate_size", "state_size", "conv_kernel", "dt_rank"};
  }
  // Mamba's conventions: expand 2, d_state 16, d_conv 4, dt_rank ⌈hidden / 16⌉.
  std::map<std::string, int64_t> default_parameters(const ModeShape& shape) const override {
    const int64_t H = shape.hidden_size;
    return {{"intermediate_size", 2 * H}, {"state_size", 16}, {"conv_kernel", 4}, {"dt_rank", (H + 15) / 16}};
  }

  std::vector<TensorSpec> state_specs(const ModeShape& shape) const override {
    const Mamba1Sizes s = mamba1_sizes(shape);
    return {
        // Random states are standard normal (the default init): the conv inputs are in_proj
        // outputs of O(1) hidden states, and h stays O(1) under a decay ≤ 1.
        conv_state_spec(shape, s.intermediate, s.kernel - 1,
                        "the last conv_kernel - 1 conv inputs (x after in_proj, before the conv) per channel, "
                        "oldest first"),
        {"ssm_state", {s.intermediate, s.state}, DType::kFloat32, false, "the selective-scan state h"},
    };
  }

  std::vector<TensorSpec> weight_specs(const ModeShape& shape) const override {
    const Mamba1Sizes s = mamba1_sizes(shape);
    const int64_t H = s.hidden, I = s.intermediate, N = s.state, K = s.kernel, R = s.dt_rank;
    // Random models follow mamba_ssm's initialisation where it keeps values sane: projections
    // normal(0, 1/sqrt(fan_in)) so every stage stays O(1); biases small; dt_proj_bias uniform in
    // [−6.9, −2.25) = softplus⁻¹ of [1e-3, 0.1) (mamba draws dt log-uniform in that range);
    // A_log uniform in [0, log 16) so A spans mamba's S4D-real −1 … −16 for any N; D around 1
    // (mamba: ones).
    return {
        normal_spec("in_proj", {2 * I, H}, inv_sqrt(H), false, "x rows (0..I-1) first, then z (gate) rows"),
        normal_spec("in_proj_bias", {2 * I}, 0.1, true, "added to in_proj's output, x part first"),
        normal_spec("conv1d_weight", {I, K}, inv_sqrt(K), false,
               "depthwise causal conv taps per channel; column K-1 multiplies the current token"),
        normal_spec("conv1d_bias", {I}, 0.1, true, "conv bias, before the SiLU"),
        normal_spec("x_proj", {R + 2 * N, I}, inv_sqrt(I), false, "dt rows (R) first, then B rows (N), then C rows (N)"),
        normal_spec("dt_proj", {I, R}, inv_sqrt(R), false, "dt_rank -> intermediate_size"),
        uniform_spec("dt_proj_bias", {I}, -6.9, -2.25, "added before the softplus (threshold 20)"),
        uniform_spec("A_log", {I, N}, 0.0, std::log(16.0), "A = -exp(A_log)"),
        uniform_spec("D", {I}, 0.5, 1.5, "skip connection y += D * u"),
        normal_spec("out_proj", {H, I}, inv_sqrt(I), false, "intermediate_size -> hidden (the contribution)"),
        normal_spec("out_proj_bias", {H}, 0.1, true, "added to out_proj's output"),
    };
  }
};

}  // namespace

std::unique_ptr<ModeSpec> make_mamba1_mode_spec() { return std::make_unique<Mamba1Spec>(); }

}  // namespace hybridtb::spec::ssm
