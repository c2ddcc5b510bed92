// A deliberately slowed build, for testing the benchmark compare: configure
// with -DHYBRIDTB_DEBUG_SLOWDOWN_US=N and every attention launch is followed by a kernel that
// spins for N microseconds on the same stream. 0 (the default) compiles it out.
#pragma once

#include <cuda_runtime_api.h>

#ifndef HYBRIDTB_DEBUG_SLOWDOWN_US
#define HYBRIDTB_DEBUG_SLOWDOWN_US 0
#endif

namespace hybridtb::cuda {

constexpr int kDebugSlowdownMicroseconds = HYBRIDTB_DEBUG_SLOWDOWN_US;

// Launches the spin kernel when kDebugSlowdownMicroseconds > 0; otherwise does nothing.
void debug_slowdown(cudaStream_t stream);

}  // namespace hybridtb::cuda
