// Linear-attention layers on the reference (hybridtb/reference/linear_layer.h): one table entry per
// kind says which core runs and which of its mode's weights it reads; everything batch-shaped is the
// step runner's (step_runner.h), as for the parallel SSM branch.
#include "hybridtb/reference/linear_layer.h"

#include <algorithm>
#include <functional>

#include "gdn_core.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "layer_parts.h"
#include "mamba2_core.h"
#include "step_runner.h"

namespace hybridtb::reference::ssm {
namespace {

// The rows of one piece of a request, by input name ([L, width] each), and the core's output [L, width].
using InputRows = std::map<std::string, Matrix>;
using CoreAdvance = std::function<Matrix(const Weights& weights, State& state, const InputRows& rows, bool decode)>;

// A kind's core, for the sizes of one config (the weights it reads: spec::ssm::linear_core_weight_names).
struct LinearCore {
  CoreAdvance advance;
};

LinearCore linear_core(const AttentionConfig& config) {
  const ModeShape shape = mode_shape(config);
  switch (config.layer_kind) {
    case LayerKind::kGdn: {
      const GdnSizes sizes = gdn_sizes(shape);
      return {[sizes](const Weights& weights, State& state, const InputRows& rows, bool decode) {
                return gdn_core(sizes, weights, state, rows.at("mixed_qkv"), rows.at("a"), rows.at("b"), decode);
              }};
    }
    case LayerKind::kMamba2: {
      const Mamba2Sizes sizes = mamba2_sizes(shape);
      return {[sizes](const Weights& weights, State& state, const InputRows& rows, bool decode) {
                Eigen::VectorXd& conv = state_slot(state, "mamba2", "conv_state", sizes.conv_dim() * (sizes.kernel - 1));
                Eigen::VectorXd& ssm = state_slot(state, "mamba2", "ssm_state", sizes.d_ssm() * sizes.state);
                return mamba2_core(sizes, mamba2_core_weights(weights, sizes), rows.at("xBC"), rows.at("dt"), conv, ssm,
                                   decode);
              }};
    }
    case LayerKind::kFullAttention: break;
  }
  throw Error("a full_attention layer has no linear-attention core (use hybrid_forward)");
}

std::string owner(const AttentionConfig& config) { return "layer_kind " + std::string(to_string(config.layer_kind)); }

}  // namespace

void linear_attention_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                              const BatchDescription& batch, const StepTensors& tensors, const TensorView& output) {
  validate_linear_tensors(config, tensors.ssm_state, tensors.weights);
  const LinearLayerSpec spec = linear_layer_spec(config);
  const int64_t T = batch.num_tokens();
  const int64_t num_tokens = batch.num_actual_tokens;
  HYBRIDTB_CHECK(0 <= num_tokens && num_tokens <= T, "/batch num_actual_tokens = ", num_tokens, " is outside [0, T = ",
                 T, "]");
  HYBRIDTB_CHECK(output.device() == Device::kHost && is_floating(output.dtype()) &&
                     output.shape() == Shape({T, spec.output_width}),
                 "the linear layer's output buffer ", output.describe(), " must be a host float tensor [T, ",
                 spec.output_width, "] (", spec.output_meaning, ")");
  InputRows inputs;  // rows [0, num_actual_tokens) of every input
  for (const LinearInput& input : spec.inputs) {
    const auto it = tensors.linear_inputs.find(input.name);
    HYBRIDTB_CHECK(it != tensors.linear_inputs.end() && !it->second.empty(), "missing /inputs/", input.name,
                   " (required by ", owner(config), ": [T, ", input.width_formula, "], ", input.meaning, ")");
    const TensorView& view = it->second;
    HYBRIDTB_CHECK(view.device() == Device::kHost && view.shape() == Shape({T, input.width}), "/inputs/", input.name,
                   " must be a host tensor [T, ", input.width_formula, "] = [", T, ", ", input.width, "], got ",
                   view.describe());
    inputs[input.name] = load_token_rows(view, num_tokens);
  }

  const LinearCore core = linear_core(config);
  const LinearLayerTensorSpecs specs = linear_layer_tensor_specs(config);
  const Weights weights = load_weights(specs.weights, tensors.weights);
  const std::vector<Pool> pools = collect_pools(specs.state, tensors.ssm_state);
  Matrix out = Matrix::Zero(num_tokens, spec.output_width);
  const AdvanceRows advance = [&](State& state, int64_t begin, int64_t end, bool decode) {
    InputRows rows;
    for (const auto& [name, all] : inputs) rows[name] = all.middleRows(begin, end - begin);
    const Matrix y = core.advance(weights, state, rows, decode);
    HYBRIDTB_CHECK(y.rows() == end - begin && y.cols() == spec.output_width, owner(config), "'s core returned [",
                   y.rows(), ", ", y.cols(), "] for ", end - begin, " tokens; expected [", end - begin, ", ",
                   spec.output_width, "]");
    out.middleRows(begin, end - begin) = y;
  };
  run_requests(config, metadata, batch, pools, num_tokens, owner(config), advance);
  store_token_rows(output, out);
}

}  // namespace hybridtb::reference::ssm
