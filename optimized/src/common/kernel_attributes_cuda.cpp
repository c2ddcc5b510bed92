// allow_dynamic_smem on the CUDA runtime (kernel_attributes.h): one process-wide table of the
// (kernel, device) pairs raised so far; the device is the calling thread's current one, the one
// the launch that follows will use.
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {

void allow_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= kDefaultDynamicSmemBytes) return;
  static DynamicSmemOptIns opt_ins([](const void* k, int /*device: the current one*/, size_t b) {
    HYBRIDTB_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(b)));
  });
  int device = 0;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  opt_ins.allow(kernel, device, bytes);
}

ComputeCapability current_compute_capability() {
  int device = 0;
  ComputeCapability cc;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&cc.major, cudaDevAttrComputeCapabilityMajor, device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&cc.minor, cudaDevAttrComputeCapabilityMinor, device));
  return cc;
}

}  // namespace hybridtb::cuda
