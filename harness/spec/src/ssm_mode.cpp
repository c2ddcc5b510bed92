// The SSM mode descriptors (ssm_mode.h): shapes, the descriptor registry and the checks of a step's
// SSM tensors against a mode's specs.
#include "hybridtb/spec/ssm_mode.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/error.h"
#include "ssm_modes/tensor_spec_helpers.h"

namespace hybridtb::spec::ssm {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

Shape pool_shape(int64_t num_slots, const Shape& slot_shape) {
  Shape shape{num_slots};
  shape.insert(shape.end(), slot_shape.begin(), slot_shape.end());
  return shape;
}

}  // namespace

int64_t ModeShape::param(const std::string& name) const {
  const auto it = params.find(name);
  HYBRIDTB_CHECK(it != params.end(), "missing /config/ssm ", name, " (a parameter of the layer's ssm_mode)");
  HYBRIDTB_CHECK(it->second > 0, "/config/ssm ", name, " must be > 0, got ", it->second);
  return it->second;
}

ModeShape mode_shape(const AttentionConfig& config) {
  ModeShape shape;
  shape.hidden_size = config.ssm_hidden_size();
  shape.params = config.ssm_params;
  shape.num_heads = config.num_heads;
  shape.head_size = config.head_size;
  shape.conv_state_layout = engine_rules(config).conv_state_layout;
  shape.gdn_norm_eps = gated_norm_eps(config, "gdn");
  shape.mamba2_norm_eps = gated_norm_eps(config, "mamba2");
  shape.mamba2_rms_norm = config.mamba_rms_norm;
  return shape;
}

TensorSpec conv_state_spec(const ModeShape& shape, int64_t channels, int64_t past, std::string meaning) {
  TensorSpec spec;
  spec.name = "conv_state";
  spec.dtype = DType::kFloat32;
  if (shape.conv_state_layout == ConvStateLayout::kSD) {
    spec.shape = {past, channels};
    spec.transposed = true;
    spec.meaning = std::move(meaning) + "; stored [K-1, channels] (the engine's SD layout)";
  } else {
    spec.shape = {channels, past};
    spec.meaning = std::move(meaning) + "; stored [channels, K-1] (DS)";
  }
  return spec;
}

void check_step_tensors(const ModeShape& shape, const std::vector<std::string>& parameters,
                        const std::vector<TensorSpec>& weight_specs, const std::vector<TensorSpec>& state_specs,
                        const std::map<std::string, TensorView>& ssm_state,
                        const std::map<std::string, TensorView>& weights, const std::string& by) {
  for (const std::string& name : parameters) shape.param(name);
  for (const auto& [name, value] : shape.params) {
    bool known = false;
    for (const std::string& p : parameters) known = known || p == name;
    HYBRIDTB_CHECK(known, "/config/ssm ", name, " = ", value, " is not a parameter of ", by,
                   " (its parameters: ", join(parameters), ")");
  }

  std::vector<std::string> weight_names;
  for (const TensorSpec& spec : weight_specs) {
    weight_names.push_back(spec.name);
    const auto it = weights.find(spec.name);
    if (it == weights.end() || it->second.empty()) {
      HYBRIDTB_CHECK(spec.optional, "missing weight /weights/", spec.name, " (required by ", by, ": ",
                     shape_to_string(spec.shape), ", ", spec.meaning, ")");
      continue;
    }
    const TensorView& view = it->second;
    HYBRIDTB_CHECK(is_floating(view.dtype()), "/weights/", spec.name, ": dtype ", to_string(view.dtype()),
                   " is not a floating type");
    HYBRIDTB_CHECK(view.shape() == spec.shape, "/weights/", spec.name, ": shape ", shape_to_string(view.shape()),
                   " does not match ", shape_to_string(spec.shape), " (", by, ": ", spec.meaning, ")");
  }
  for (const auto& [name, view] : weights) {
    bool known = false;
    for (const std::string& w : weight_names) known = known || w == name;
    HYBRIDTB_CHECK(known, "/weights/", name, " is not a weight of ", by, " (its weights: ", join(weight_names), ")");
  }

  std::vector<std::string> pool_names;
  std::optional<std::pair<std::string, int64_t>> first_pool;  // (name, num_slots)
  for (const TensorSpec& spec : state_specs) {
    pool_names.push_back(spec.name);
    const auto it = ssm_state.find(spec.name);
    if (it == ssm_state.end() || it->second.empty()) {
      HYBRIDTB_CHECK(spec.optional, "missing state pool /inputs/ssm/", spec.name, " (required by ", by,
                     ": [num_slots, ", shape_to_string(spec.shape).substr(1), ", ", spec.meaning, ")");
      continue;
    }
    const TensorView& view = it->second;
    HYBRIDTB_CHECK(is_floating(view.dtype()), "/inputs/ssm/", spec.name, ": dtype ", to_string(view.dtype()),
                   " is not a floating type");
    const int64_t num_slots = view.rank() >= 1 ? view.size(0) : -1;
    HYBRIDTB_CHECK(
        view.rank() == static_cast<int>(spec.shape.size()) + 1 && view.shape() == pool_shape(num_slots, spec.shape),
        "/inputs/ssm/", spec.name, ": shape ", shape_to_string(view.shape()), " does not match [num_slots, ",
        shape_to_string(spec.shape).substr(1), " (", by, ": ", spec.meaning, ")");
    HYBRIDTB_CHECK(num_slots >= 1, "/inputs/ssm/", spec.name, " has no slots");
    if (!first_pool) {
      first_pool.emplace(spec.name, num_slots);
    } else {
      HYBRIDTB_CHECK(num_slots == first_pool->second, "/inputs/ssm/", spec.name, " has ", num_slots,
                     " slots but /inputs/ssm/", first_pool->first, " has ", first_pool->second,
                     " (all state pools of a layer are indexed by the same slots)");
    }
  }
  for (const auto& [name, view] : ssm_state) {
    bool known = false;
    for (const std::string& p : pool_names) known = known || p == name;
    HYBRIDTB_CHECK(known, "/inputs/ssm/", name, " is not a state pool of ", by, " (its pools: ", join(pool_names), ")");
  }
}

void validate_ssm_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                          const std::map<std::string, TensorView>& weights) {
  const ModeSpec& mode = ModeSpecRegistry::instance().find(config.ssm_mode);
  const ModeShape shape = mode_shape(config);
  check_step_tensors(shape, mode.parameters(), mode.weight_specs(shape), mode.state_specs(shape), ssm_state, weights,
                     "ssm_mode " + mode.name());
}

TensorSpec normal_spec(const char* name, Shape dims, double std, bool optional, const char* meaning) {
  TensorSpec spec{name, std::move(dims), DType::kFloat32, optional, meaning};
  spec.init_std = std;
  return spec;
}

TensorSpec uniform_spec(const char* name, Shape dims, double low, double high, const char* meaning) {
  TensorSpec spec{name, std::move(dims), DType::kFloat32, false, meaning};
  spec.init_low = low;
  spec.init_high = high;
  return spec;
}

ModeSpecRegistry& ModeSpecRegistry::instance() {
  // Built on first use (thread-safe static initialisation), so no static-initialisation order
  // problem and no registration that a static library could drop.
  static ModeSpecRegistry* registry = [] {
    auto* built = new ModeSpecRegistry();  // never destroyed: descriptors may be looked up during exit
    register_builtin_mode_specs(*built);
    return built;
  }();
  return *registry;
}

void ModeSpecRegistry::add(std::unique_ptr<ModeSpec> mode) {
  HYBRIDTB_CHECK(mode != nullptr, "ModeSpecRegistry::add: null mode");
  const std::string name = mode->name();
  HYBRIDTB_CHECK(!name.empty() && name != "none", "ModeSpecRegistry::add: invalid ssm_mode name '", name,
                 "' (\"none\" means a layer without an SSM branch)");
  HYBRIDTB_CHECK(!contains(name), "ModeSpecRegistry::add: ssm_mode ", name, " is registered twice");
  modes_.push_back(std::move(mode));
}

const ModeSpec& ModeSpecRegistry::find(const std::string& name) const {
  for (const auto& mode : modes_) {
    if (mode->name() == name) return *mode;
  }
  throw Error(detail::concat("unknown /config ssm_mode '", name, "' (known modes: ", join(names()), ")"));
}

bool ModeSpecRegistry::contains(const std::string& name) const {
  return std::any_of(modes_.begin(), modes_.end(), [&](const auto& mode) { return mode->name() == name; });
}

std::vector<std::string> ModeSpecRegistry::names() const {
  std::vector<std::string> out;
  out.reserve(modes_.size());
  for (const auto& mode : modes_) out.push_back(mode->name());
  return out;
}

}  // namespace hybridtb::spec::ssm
