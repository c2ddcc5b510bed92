// The built-in GPU SSM modes, one line each (ssm_gpu_mode.h). A mode descriptor without a line
// here is reported NotSupported by the cuda backend, never run on the CPU.
#include "ssm/ssm_gpu_mode.h"

namespace hybridtb::cuda::ssm {

void register_builtin_gpu_modes(GpuModeRegistry& registry) {
  HYBRIDTB_GPU_SSM_MODE(registry, zero);
  HYBRIDTB_GPU_SSM_MODE(registry, prefix_sum_flat);
  HYBRIDTB_GPU_SSM_MODE(registry, prefix_sum);
  HYBRIDTB_GPU_SSM_MODE(registry, mamba1);
  HYBRIDTB_GPU_SSM_MODE(registry, ema);
  HYBRIDTB_GPU_SSM_MODE(registry, mamba2);
  HYBRIDTB_GPU_SSM_MODE(registry, gdn);
}

}  // namespace hybridtb::cuda::ssm
