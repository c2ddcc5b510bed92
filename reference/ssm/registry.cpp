// ModeRegistry: the reference's SSM modes by name, filled once with the built-in modes (modes.cpp),
// each registered against its descriptor (hybridtb/spec/ssm_mode.h). Looked up by the driver
// (ssm_driver.cpp), the linear layers and the generic mode tests (tests/ssm).
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

const ModeSpec& Mode::spec() const { return spec::ssm::ModeSpecRegistry::instance().find(name()); }

void Mode::advance_rank(const ModeShape& /*shape*/, TensorParallelGroup& group, const Weights& /*weights*/,
                        State& /*state*/, const Matrix& /*x*/, Matrix& /*y*/, bool /*decode*/) const {
  throw NotSupported(detail::concat("ssm_mode ", name(), " has no tensor-parallel form (rank ", group.rank(), " of ",
                                    group.size(), "); sharded modes: mamba1, zero"));
}

std::map<std::string, Tensor> make_random_weights(const Mode& mode, const ModeShape& shape, uint64_t seed) {
  return spec::ssm::make_random_weights(mode.spec(), shape, seed);
}

ModeRegistry& ModeRegistry::instance() {
  // Built on first use (thread-safe static initialisation), so no static-initialisation order
  // problem and no registration that a static library could drop.
  static ModeRegistry* registry = [] {
    auto* built = new ModeRegistry();  // never destroyed: modes may be looked up during exit
    register_builtin_modes(*built);
    return built;
  }();
  return *registry;
}

void ModeRegistry::add(std::unique_ptr<Mode> mode) {
  HYBRIDTB_CHECK(mode != nullptr, "ModeRegistry::add: null mode");
  const std::string name = mode->name();
  HYBRIDTB_CHECK(!name.empty() && name != "none", "ModeRegistry::add: invalid ssm_mode name '", name,
                 "' (\"none\" means a layer without an SSM branch)");
  HYBRIDTB_CHECK(!contains(name), "ModeRegistry::add: ssm_mode ", name, " is registered twice");
  HYBRIDTB_CHECK(spec::ssm::ModeSpecRegistry::instance().contains(name), "ModeRegistry::add: ssm_mode ", name,
                 " has no descriptor (hybridtb/spec/ssm_mode.h: ModeSpecRegistry)");
  modes_.push_back(std::move(mode));
}

const Mode& ModeRegistry::find(const std::string& name) const {
  for (const auto& mode : modes_) {
    if (mode->name() == name) return *mode;
  }
  throw Error(detail::concat("unknown /config ssm_mode '", name, "' (known modes: ", join(names()), ")"));
}

bool ModeRegistry::contains(const std::string& name) const {
  return std::any_of(modes_.begin(), modes_.end(), [&](const auto& mode) { return mode->name() == name; });
}

std::vector<std::string> ModeRegistry::names() const {
  std::vector<std::string> out;
  out.reserve(modes_.size());
  for (const auto& mode : modes_) out.push_back(mode->name());
  return out;
}

}  // namespace hybridtb::reference::ssm
