#include "common/debug_slowdown.h"

#include "common/cuda_check.h"

namespace hybridtb::cuda {

namespace {

__global__ void spin_kernel(unsigned long long nanoseconds) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  unsigned long long now = start;
  while (now - start < nanoseconds) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

}  // namespace

void debug_slowdown(cudaStream_t stream) {
  if constexpr (kDebugSlowdownMicroseconds > 0) {
    spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(kDebugSlowdownMicroseconds) * 1000ull);
    HYBRIDTB_CUDA_CHECK_LAUNCH();
  } else {
    (void)stream;
  }
}

}  // namespace hybridtb::cuda
