// Assertions shared by the tests that regenerate a batch and compare it with a stored one.
#pragma once

#include "hybridtb/batch_file.h"

namespace hybridtb::testing {

// Everything a generator writes is equal: the batch description, the config's sinks, SSM
// parameters and layer kind, and every input tensor, scale cache, state pool, weight and
// linear-layer input (bitwise).
void expect_same_batch_inputs(const BatchFile& a, const BatchFile& b);

}  // namespace hybridtb::testing
