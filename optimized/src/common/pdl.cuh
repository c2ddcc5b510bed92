// Programmatic dependent launch (sm_90; PTX griddepcontrol): a kernel launched with launch_pdl may
// begin while the kernel before it in the stream is still running, as soon as every block of that
// kernel has called pdl_allow_dependents() (or exited). It must call pdl_wait_for_predecessor()
// before it touches anything the predecessor writes; the wait returns once the predecessor has
// completed and its memory is visible. Work before the wait may only read what no kernel still in
// flight writes. The SSM decode steps use it so that a bandwidth-bound state update issues its state
// loads while the small kernels in front of it (conv, preparation) finish, instead of after a
// launch gap. Without launch_pdl both calls are no-ops, and under stream capture the dependency
// becomes a programmatic edge of the graph.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.h"

namespace hybridtb::cuda {

__device__ __forceinline__ void pdl_allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  HYBRIDTB_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace hybridtb::cuda
