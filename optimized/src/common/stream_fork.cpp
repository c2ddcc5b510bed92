// The fork-join of a side stream (stream_fork.h).
#include "common/stream_fork.h"

#include "common/cuda_check.h"

namespace hybridtb::cuda {

StreamFork::StreamFork() {
  HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  HYBRIDTB_CUDA_CHECK(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
  HYBRIDTB_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
}

StreamFork::~StreamFork() {
  cudaStreamSynchronize(side_);  // NOLINT: best effort in a destructor
  cudaEventDestroy(joined_);     // NOLINT
  cudaEventDestroy(forked_);     // NOLINT
  cudaStreamDestroy(side_);      // NOLINT
}

cudaStream_t StreamFork::fork(cudaStream_t main) const {
  HYBRIDTB_CUDA_CHECK(cudaEventRecord(forked_, main));
  HYBRIDTB_CUDA_CHECK(cudaStreamWaitEvent(side_, forked_, 0));
  return side_;
}

void StreamFork::join(cudaStream_t main) const {
  HYBRIDTB_CUDA_CHECK(cudaEventRecord(joined_, side_));
  HYBRIDTB_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0));
}

}  // namespace hybridtb::cuda
