// HYBRIDTB_CUDA_CHECK(expr): every CUDA runtime call goes through it; a failure throws
// hybridtb::Error naming the expression, the file and the line. HYBRIDTB_CUDA_CHECK_LAUNCH()
// after every kernel launch catches launch-configuration errors.
#pragma once

#include <cuda_runtime_api.h>

#include "hybridtb/error.h"

namespace hybridtb::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line) {
  throw Error(detail::concat("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in ",
                             expr, " at ", file, ":", line));
}

}  // namespace hybridtb::cuda

#define HYBRIDTB_CUDA_CHECK(expr)                                                              \
  do {                                                                                         \
    const cudaError_t hybridtb_status_ = (expr);                                               \
    if (hybridtb_status_ != cudaSuccess)                                                       \
      ::hybridtb::cuda::throw_cuda_error(hybridtb_status_, #expr, __FILE__, __LINE__);         \
  } while (0)

#define HYBRIDTB_CUDA_CHECK_LAUNCH() HYBRIDTB_CUDA_CHECK(cudaGetLastError())
