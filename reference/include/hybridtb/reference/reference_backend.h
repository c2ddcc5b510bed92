// The reference backend: the CPU ground truth behind the Backend interface.
#pragma once

#include <memory>

#include "hybridtb/backend.h"

namespace hybridtb::reference {

std::unique_ptr<Backend> make_reference_backend(const BackendSettings& settings);

}  // namespace hybridtb::reference
