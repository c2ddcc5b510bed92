// Comparison helpers of tests/cuda: a step run on the "cuda" backend against the same step on the
// reference, element by element with the tolerance table (hybridtb/tolerance.h), KV cache bytes
// exactly, padding rows untouched (still NaN), metadata field by field.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/step.h"
#include "hybridtb/tolerance.h"

namespace hybridtb::testing {

// "" if a CUDA device is usable, else the reason ("no CUDA device: <cudaGetErrorString>").
std::string cuda_unavailable_reason();

// Skips the current test, with the reason, on a machine without a usable CUDA device.
#define HYBRIDTB_SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                                      \
    const std::string skip_reason_ = ::hybridtb::testing::cuda_unavailable_reason();        \
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;                                 \
  } while (0)

// The fixture of GPU tests: SetUp skips them, with the reason, where no CUDA device is usable.
template <typename Base = ::testing::Test>
class CudaFixture : public Base {
 protected:
  void SetUp() override { HYBRIDTB_SKIP_WITHOUT_CUDA(); }
};
template <typename Param>
using CudaParamFixture = CudaFixture<::testing::TestWithParam<Param>>;

// Throws hybridtb::Error naming `what` and the CUDA error unless `status` is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

// A graph captured by a test and its executable, destroyed together (best effort) when the test
// leaves its scope, assertions included.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph();
};

// Puts `file`'s step inputs (rows, KV and scale caches, state pools) into `layer`'s fixed device
// tensors, as a CUDA-graph runner does before a replay, and poisons its outputs again.
void load_step(Backend& backend, const LayerBuffers& layer, const BatchFile& file);

// The row of the tolerance table for the CUDA backend's output of this step.
Tolerance cuda_attention_tolerance(const BatchFile& step);

// Rows [num_actual_tokens, T) of output, attn_output and ssm_output (where present) still hold the
// NaN poison.
::testing::AssertionResult outputs_padding_untouched(const StepOutputs& out, const BatchFile& step);

// Every check of a CUDA step against the reference's (see the file comment).
::testing::AssertionResult cuda_matches_reference(const BatchFile& step, const StepOutputs& cuda,
                                                  const StepOutputs& reference);
// `step` run on the reference and on the cuda backend, each created with `settings`, and compared
// (cuda_matches_reference).
::testing::AssertionResult cuda_run_matches_reference(const BatchFile& step, const BackendSettings& settings);
// The same, and a second run of the step on the same cuda backend stores the same bits (output,
// attn_output, KV cache: fixed reduction orders, no atomics).
::testing::AssertionResult cuda_run_matches_reference_reproducibly(const BatchFile& step,
                                                                   const BackendSettings& settings);

}  // namespace hybridtb::testing
