// The SSM modes' activations in float32 with the library's expf/log1pf (the conv front end, Mamba-2
// and Gated DeltaNet; mamba1's prefill scan has its own branch-free forms in mamba1_common.cuh).
// softplus follows vLLM and torch: v itself above the threshold 20, where log1p(e^v) rounds to v.
#pragma once

#include <cuda_runtime.h>

namespace hybridtb::cuda::ssm {

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

}  // namespace hybridtb::cuda::ssm
