// The projections of the model-layer GPU modes (mamba1, mamba2, gdn): one cuBLAS GEMM over token
// rows, float32 out, float32 compute (never TF32), on the SSM context's stream and handle.
#pragma once

#include <cstdint>

#include "ssm/ssm_gpu_mode.h"

namespace hybridtb::cuda::ssm {

// out[rows, out_cols] (float32, dense) = X[rows, k] · W[out_cols, k]^T, X row-strided by ldx.
// The GEMM takes the weight's and the activations' stored dtypes directly when they agree
// (bf16/fp16/fp32); otherwise both sides are widened to float32 exactly first, with scratch from
// the step (per-step or, in a fixed step, the same blocks each launch). `what` names the
// projection in cuBLAS errors.
void gemm_rows(const GpuStep& step, float* out, int64_t rows, int64_t out_cols, const void* x, ElementKind x_kind,
               int64_t ldx, int64_t k, const WeightRef& w, const char* what);

}  // namespace hybridtb::cuda::ssm
