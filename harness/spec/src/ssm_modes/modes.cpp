// The built-in SSM mode descriptors, one line each, in the order ModeSpecRegistry::names() lists
// them. Each line names the file harness/spec/src/ssm_modes/<name>.cpp, which defines
// make_<name>_mode_spec(); the reference registers its math for the same names
// (reference/ssm/modes.cpp), the CUDA backend its GPU modes (optimized/src/ssm/gpu_modes.cpp).
#include <memory>

#include "hybridtb/spec/ssm_mode.h"

// A block-scope `extern` declaration refers to the factory in the enclosing namespace.
#define HYBRIDTB_SSM_MODE_SPEC(registry, name)                                              \
  do {                                                                                      \
    extern std::unique_ptr<::hybridtb::spec::ssm::ModeSpec> make_##name##_mode_spec();      \
    (registry).add(make_##name##_mode_spec());                                              \
  } while (0)

namespace hybridtb::spec::ssm {

void register_builtin_mode_specs(ModeSpecRegistry& registry) {
  HYBRIDTB_SSM_MODE_SPEC(registry, zero);
  HYBRIDTB_SSM_MODE_SPEC(registry, prefix_sum_flat);
  HYBRIDTB_SSM_MODE_SPEC(registry, prefix_sum);
  HYBRIDTB_SSM_MODE_SPEC(registry, mamba1);
  HYBRIDTB_SSM_MODE_SPEC(registry, ema);
  HYBRIDTB_SSM_MODE_SPEC(registry, mamba2);
  HYBRIDTB_SSM_MODE_SPEC(registry, gdn);
}

}  // namespace hybridtb::spec::ssm
