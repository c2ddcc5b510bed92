// The descriptor of ssm_mode "ema" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/ema.cpp, its GPU form optimized/src/ssm/.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {
namespace {

class EmaSpec final : public ModeSpec {
 public:
  std::string name() const override { return "ema"; }
  std::string description() const override {
    return "exponential moving average h = a*h + (1-a)*x per channel; contributes h";
  }
  std::vector<TensorSpec> state_specs(const ModeShape& shape) const override {
    return {{.name = "state", .shape = {shape.hidden_size}, .meaning = "the request's moving average h"}};
  }
  std::vector<TensorSpec> weight_specs(const ModeShape& shape) const override {
    return {{.name = "a",
             .shape = {shape.hidden_size},
             .meaning = "per-channel decay in (0, 1)",
             .init_low = 0.5,
             .init_high = 0.99}};
  }
};

}  // namespace

std::unique_ptr<ModeSpec> make_ema_mode_spec() { return std::make_unique<EmaSpec>(); }

}  // namespace hybridtb::spec::ssm
