// The descriptor of ssm_mode "prefix_sum" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/prefix_sum.cpp, its GPU form optimized/src/ssm/.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {
namespace {

class PrefixSumSpec final : public ModeSpec {
 public:
  std::string name() const override { return "prefix_sum"; }
  std::string description() const override {
    return "per-request running sum of the hidden states, carried in the state pool across steps";
  }
  std::vector<TensorSpec> state_specs(const ModeShape& shape) const override {
    return {{.name = "state",
             .shape = {shape.num_heads, shape.head_size},
             .meaning = "the request's running sum of hidden states, [num_heads, head_size] like the query"}};
  }
  std::vector<TensorSpec> weight_specs(const ModeShape& /*shape*/) const override { return {}; }
};

}  // namespace

std::unique_ptr<ModeSpec> make_prefix_sum_mode_spec() { return std::make_unique<PrefixSumSpec>(); }

}  // namespace hybridtb::spec::ssm
