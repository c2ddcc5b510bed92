// The built-in SSM modes, one line each, in the order ModeRegistry::names() lists them. Each line
// names the mode's file reference/ssm/<name>.cpp, which defines make_<name>_mode() (modes.h).
#include "modes.h"

namespace hybridtb::reference::ssm {

void register_builtin_modes(ModeRegistry& registry) {
  HYBRIDTB_SSM_MODE(registry, zero);
  HYBRIDTB_SSM_MODE(registry, prefix_sum_flat);
  HYBRIDTB_SSM_MODE(registry, prefix_sum);
  HYBRIDTB_SSM_MODE(registry, mamba1);
  HYBRIDTB_SSM_MODE(registry, ema);
  HYBRIDTB_SSM_MODE(registry, mamba2);
  HYBRIDTB_SSM_MODE(registry, gdn);
}

}  // namespace hybridtb::reference::ssm
