// The descriptor of ssm_mode "prefix_sum_flat" (hybridtb/spec/ssm_mode.h): its parameters, defaults and
// tensors. Its float64 math is reference/ssm/prefix_sum_flat.cpp, its GPU form optimized/src/ssm/.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {
namespace {

class PrefixSumFlatSpec final : public ModeSpec {
 public:
  std::string name() const override { return "prefix_sum_flat"; }
  std::string description() const override {
    return "the seed prototype's rule: cumsum of the first num_decode_tokens hidden states over the flattened "
           "token axis, across requests; zero elsewhere; no state";
  }
  std::vector<TensorSpec> state_specs(const ModeShape& /*shape*/) const override { return {}; }
  std::vector<TensorSpec> weight_specs(const ModeShape& /*shape*/) const override { return {}; }
};

}  // namespace

std::unique_ptr<ModeSpec> make_prefix_sum_flat_mode_spec() { return std::make_unique<PrefixSumFlatSpec>(); }

}  // namespace hybridtb::spec::ssm
