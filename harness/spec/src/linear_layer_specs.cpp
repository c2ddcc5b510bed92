// The descriptor of a linear-attention layer (linear_layer_specs.h).
#include "hybridtb/spec/linear_layer_specs.h"

#include <algorithm>
#include <string>
#include <vector>

#include "hybridtb/error.h"

namespace hybridtb::spec::ssm {
namespace {

std::string owner(const AttentionConfig& config) { return "layer_kind " + std::string(to_string(config.layer_kind)); }

}  // namespace

std::vector<std::string> linear_core_weight_names(LayerKind kind) {
  switch (kind) {
    case LayerKind::kGdn: return {"conv1d_weight", "conv1d_bias", "A_log", "dt_bias"};
    case LayerKind::kMamba2: return {"conv1d_weight", "conv1d_bias", "dt_bias", "A_log", "D"};
    case LayerKind::kFullAttention: break;
  }
  throw Error("a full_attention layer has no linear-attention core (use hybrid_forward)");
}

LinearLayerTensorSpecs linear_layer_tensor_specs(const AttentionConfig& config) {
  HYBRIDTB_CHECK(config.is_linear_layer(), "linear_layer_tensor_specs: layer_kind full_attention is not a linear layer");
  const ModeSpec& mode = ModeSpecRegistry::instance().find(config.ssm_mode);
  const ModeShape shape = mode_shape(config);
  const std::vector<std::string> names = linear_core_weight_names(config.layer_kind);
  LinearLayerTensorSpecs specs;
  specs.state = mode.state_specs(shape);
  for (const TensorSpec& spec : mode.weight_specs(shape)) {
    if (std::find(names.begin(), names.end(), spec.name) != names.end()) specs.weights.push_back(spec);
  }
  return specs;
}

void validate_linear_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                             const std::map<std::string, TensorView>& weights) {
  const LinearLayerTensorSpecs specs = linear_layer_tensor_specs(config);
  check_step_tensors(mode_shape(config), ModeSpecRegistry::instance().find(config.ssm_mode).parameters(), specs.weights,
                     specs.state, ssm_state, weights, owner(config));
}

}  // namespace hybridtb::spec::ssm
