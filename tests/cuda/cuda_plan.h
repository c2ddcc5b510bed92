// The attention planner's split of a step, for tests/cuda that check which kernel each row takes
// (internal header attention/attention_plan.h; link hybridtb_cuda_internal).
#pragma once

#include <string>

#include "attention/attention_plan.h"
#include "hybridtb/batch_file.h"

namespace hybridtb::testing {

// AttentionRunner::prepare on device buffers of the step's shapes (metadata upload only, no
// kernel runs) and its summary.
cuda::AttentionPlanSummary plan_of(const BatchFile& step, const cuda::AttentionPathOverrides& overrides = {});

// Why the Hopper wgmma prefill variant cannot run here (no sm_90a code in the build, or device 0
// is not compute capability 9.0), for GTEST_SKIP; empty where it can.
std::string wgmma_prefill_unavailable();

}  // namespace hybridtb::testing
