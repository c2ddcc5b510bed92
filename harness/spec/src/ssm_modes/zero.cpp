// The descriptor of ssm_mode "zero" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/zero.cpp, its GPU form optimized/src/ssm/.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {
namespace {

class ZeroSpec final : public ModeSpec {
 public:
  std::string name() const override { return "zero"; }
  std::string description() const override {
    return "contributes zeros, no state (the seed adapter's default, \"disabled\")";
  }
  std::vector<TensorSpec> state_specs(const ModeShape& /*shape*/) const override { return {}; }
  std::vector<TensorSpec> weight_specs(const ModeShape& /*shape*/) const override { return {}; }
};

}  // namespace

std::unique_ptr<ModeSpec> make_zero_mode_spec() { return std::make_unique<ZeroSpec>(); }

}  // namespace hybridtb::spec::ssm
