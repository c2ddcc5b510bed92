// Private to reference/ssm: the one-line registration of a mode. A mode's file
// reference/ssm/<name>.cpp defines, in namespace hybridtb::reference::ssm (not in an anonymous
// namespace),
//   std::unique_ptr<Mode> make_<name>_mode();
// and register_builtin_modes (modes.cpp) registers it with the line
//   HYBRIDTB_SSM_MODE(registry, <name>);
// which declares that factory itself, so adding a mode is its file plus that line and nothing else
// (reference/ssm/README.md).
#pragma once

#include <memory>

#include "hybridtb/reference/ssm_mode.h"

// A block-scope `extern` declaration refers to the factory in the enclosing namespace.
#define HYBRIDTB_SSM_MODE(registry, name)                                             \
  do {                                                                                \
    extern std::unique_ptr<::hybridtb::reference::ssm::Mode> make_##name##_mode();    \
    (registry).add(make_##name##_mode());                                             \
  } while (0)
