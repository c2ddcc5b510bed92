// The backend registry: name → factory; and the Backend defaults for optional capabilities.
#include "hybridtb/backend.h"

#include "hybridtb/error.h"

namespace hybridtb {

std::string_view to_string(SsmPrefillOperands operands) {
  return operands == SsmPrefillOperands::kModel ? "model" : "float32";
}

SsmPrefillOperands parse_ssm_prefill_operands(std::string_view text) {
  if (text == "float32") return SsmPrefillOperands::kFloat32;
  if (text == "model") return SsmPrefillOperands::kModel;
  throw Error(detail::concat("ssm_prefill_operands '", text, "': expected float32 or model"));
}

std::unique_ptr<StepGraph> Backend::capture_decode_step(const HybridMetadata& /*metadata*/,
                                                        const BatchDescription& /*batch*/,
                                                        const StepTensors& /*tensors*/,
                                                        const HybridOutputs& /*outputs*/) {
  throw NotSupported(detail::concat("backend '", name(), "' does not capture CUDA graphs"));
}

std::unique_ptr<Backend> Backend::create_sibling(const BackendSettings& settings) {
  return BackendRegistry::instance().create(name(), settings);
}

void Backend::linear_attention_forward(const HybridMetadata& /*metadata*/, const BatchDescription& /*batch*/,
                                       const StepTensors& /*tensors*/, const TensorView& /*output*/) {
  throw NotSupported(detail::concat("backend '", name(), "' does not run linear-attention layers (layer_kind gdn, mamba2)"));
}

void Backend::init_graph_state(int64_t /*max_num_reqs*/, int64_t /*max_num_tokens*/) {
  throw NotSupported(detail::concat("backend '", name(), "' has no CUDA-graph state (init_graph_state)"));
}

void Backend::init_capture_metadata(const HybridMetadata& /*metadata*/, const BatchDescription& /*batch*/) {
  throw NotSupported(detail::concat("backend '", name(), "' does not capture CUDA graphs (init_capture_metadata)"));
}

void Backend::init_replay_metadata(const HybridMetadata& /*metadata*/, const BatchDescription& /*batch*/) {
  throw NotSupported(detail::concat("backend '", name(), "' does not replay CUDA graphs (init_replay_metadata)"));
}

BackendRegistry& BackendRegistry::instance() {
  static BackendRegistry registry;
  return registry;
}

void BackendRegistry::add(const std::string& name, const std::string& description, Factory factory,
                          Availability availability) {
  HYBRIDTB_CHECK(!contains(name), "backend '", name, "' is registered twice");
  entries_.push_back({name, description, std::move(factory), std::move(availability), {}});
}

const BackendRegistry::Entry& BackendRegistry::entry(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e;
  }
  throw Error(detail::concat("unknown backend '", name, "'"));
}

void BackendRegistry::set_explainer(const std::string& name, Explainer explainer) {
  for (auto& e : entries_) {
    if (e.name != name) continue;
    HYBRIDTB_CHECK(!e.explainer, "backend '", name, "' has an explainer already");
    e.explainer = std::move(explainer);
    return;
  }
  throw Error(detail::concat("unknown backend '", name, "'"));
}

bool BackendRegistry::has_explainer(const std::string& name) const { return static_cast<bool>(entry(name).explainer); }

void BackendRegistry::set_rank_placer(const std::string& name, RankPlacer placer) {
  for (auto& e : entries_) {
    if (e.name != name) continue;
    HYBRIDTB_CHECK(!e.placer, "backend '", name, "' has a rank placer already");
    e.placer = std::move(placer);
    return;
  }
  throw Error(detail::concat("unknown backend '", name, "'"));
}

BackendRegistry::RankPlacement BackendRegistry::place_ranks(const std::string& name, int64_t size) const {
  const Entry& e = entry(name);
  if (!e.placer) {
    throw NotSupported(detail::concat("backend '", name, "' places no ranks of its own (its ranks meet through host "
                                      "memory in one place)"));
  }
  RankPlacement placement = e.placer(size);
  HYBRIDTB_CHECK(static_cast<int64_t>(placement.groups.size()) == size, "backend '", name, "' placed ",
                 placement.groups.size(), " ranks for a group of ", size);
  return placement;
}

std::string BackendRegistry::explain(const std::string& name, const BackendSettings& settings,
                                     const BatchDescription& batch, const HybridMetadata& metadata) const {
  const Entry& e = entry(name);
  if (!e.explainer) {
    return detail::concat("backend '", name, "' has no plan to explain: it runs every row the same way\n");
  }
  return e.explainer(settings, batch, metadata);
}

std::string BackendRegistry::unavailable_reason(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return entry.availability ? entry.availability() : std::string();
  }
  throw Error(detail::concat("unknown backend '", name, "'"));
}

bool BackendRegistry::contains(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return true;
  }
  return false;
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> result;
  for (const auto& entry : entries_) result.push_back(entry.name);
  return result;
}

std::string BackendRegistry::description(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return entry.description;
  }
  throw Error(detail::concat("unknown backend '", name, "'"));
}

std::unique_ptr<Backend> BackendRegistry::create(const std::string& name, const BackendSettings& settings) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return entry.factory(settings);
  }
  std::string known;
  for (const auto& entry : entries_) known += (known.empty() ? "" : ", ") + entry.name;
  throw Error(detail::concat("unknown backend '", name, "' (this build has: ", known.empty() ? "none" : known, ")"));
}

}  // namespace hybridtb
