// A side stream joined to a main stream by events — the fork-join pattern, stream-ordered and
// capturable in a CUDA graph: fork(main) makes the side stream wait for everything enqueued on
// `main` so far and returns it; join(main) makes `main` wait for everything enqueued on the side
// stream since. The attention runner uses it to run a mixed step's prefill items beside its decode
// items (attention_plan.h).
#pragma once

#include <cuda_runtime_api.h>

namespace hybridtb::cuda {

class StreamFork {
 public:
  StreamFork();  // on the current device
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  cudaStream_t fork(cudaStream_t main) const;
  void join(cudaStream_t main) const;

 private:
  cudaStream_t side_ = nullptr;
  cudaEvent_t forked_ = nullptr;
  cudaEvent_t joined_ = nullptr;
};

}  // namespace hybridtb::cuda
