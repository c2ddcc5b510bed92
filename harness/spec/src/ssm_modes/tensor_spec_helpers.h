// Private to harness/spec: TensorSpec builders for the model-layer modes' descriptors, with their
// random initialisation.
#pragma once

#include <cmath>
#include <cstdint>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {

inline double inv_sqrt(int64_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); }

// A float32 weight drawn normal(0, std), or uniform in [low, high) (never optional).
TensorSpec normal_spec(const char* name, Shape dims, double std, bool optional, const char* meaning);
TensorSpec uniform_spec(const char* name, Shape dims, double low, double high, const char* meaning);

}  // namespace hybridtb::spec::ssm
