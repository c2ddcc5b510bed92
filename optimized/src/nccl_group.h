// Tensor-parallel groups over NCCL for the cuda backend: one process drives N GPUs, one rank per GPU
// (ncclCommInitAll), and each rank's mamba1 all-reduces are in-place ncclAllReduce calls on its
// backend's stream — asynchronous, and capturable in a CUDA graph. Built when CMake finds NCCL
// (HYBRIDTB_HAVE_NCCL); registered as the cuda backend's rank placer (BackendRegistry::place_ranks).
#pragma once

#include <cstdint>

#include "hybridtb/backend.h"

namespace hybridtb::cuda {

// Ranks 0..size-1 on this process's GPUs 0..size-1 (as CUDA_VISIBLE_DEVICES orders them): each
// rank's group and the call that makes rank r's thread use GPU r. NotSupported when the process sees
// fewer than `size` GPUs; Error naming the NCCL call that failed.
BackendRegistry::RankPlacement place_ranks_on_gpus(int64_t size);

}  // namespace hybridtb::cuda
