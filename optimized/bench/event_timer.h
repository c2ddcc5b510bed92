// median_ms: the benchmarks' one timing loop — CUDA events on the given stream around each
// repetition, optional untimed warm-up launches, the median of the repetitions in milliseconds;
// median_ms_after: the same with work enqueued before each repetition (an L2 flush).
// Host-only (cuda_runtime_api.h), usable from .cpp and .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "common/cuda_check.h"

namespace hybridtb::cuda::bench {

// As median_ms below, with before() called ahead of every repetition and every warm-up call,
// outside the events: what it enqueues on `stream` (a state restore, an L2 flush) runs before the
// timed work and keeps the GPU busy while the host enqueues it.
template <typename Before, typename Fn>
double median_ms_after(int reps, cudaStream_t stream, Before before, Fn fn, int warmup = 0) {
  cudaEvent_t start;
  cudaEvent_t stop;
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&start));
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&stop));
  for (int w = 0; w < warmup; ++w) {
    before();
    fn();
  }
  std::vector<float> times;
  for (int r = 0; r < reps; ++r) {
    before();
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

template <typename Fn>
double median_ms(int reps, cudaStream_t stream, Fn fn, int warmup = 0) {
  return median_ms_after(reps, stream, [] {}, fn, warmup);
}

}  // namespace hybridtb::cuda::bench
