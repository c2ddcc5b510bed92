// median_ms: the benchmarks' one timing loop — CUDA events on the given stream around each
// repetition, optional untimed warm-up launches, the median of the repetitions in milliseconds.
// Host-only (cuda_runtime_api.h), usable from .cpp and .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "common/cuda_check.h"

namespace hybridtb::cuda::bench {

template <typename Fn>
double median_ms(int reps, cudaStream_t stream, Fn fn, int warmup = 0) {
  cudaEvent_t start;
  cudaEvent_t stop;
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&start));
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&stop));
  for (int w = 0; w < warmup; ++w) fn();
  std::vector<float> times;
  for (int r = 0; r < reps; ++r) {
    HYBRIDTB_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    HYBRIDTB_CUDA_CHECK(cudaEventRecord(stop, stream));
    HYBRIDTB_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    HYBRIDTB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  HYBRIDTB_CUDA_CHECK(cudaEventDestroy(start));
  HYBRIDTB_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return static_cast<double>(times[times.size() / 2]);
}

}  // namespace hybridtb::cuda::bench
