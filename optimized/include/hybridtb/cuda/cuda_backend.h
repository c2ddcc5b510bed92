// The CUDA backend ("cuda"): the KV-cache write and the paged attention of the reference on one
// NVIDIA GPU (built for sm_90). Host-only header: no CUDA types cross it.
// Checked against the reference by tests/cuda (ctest -L cuda, on a machine with a GPU).
#pragma once

#include <memory>

#include "hybridtb/backend.h"

namespace hybridtb::cuda {

// Throws Error if no CUDA device is usable, NotSupported if the layer configuration is outside
// what the kernels implement (see optimized/README.md, "What is supported").
std::unique_ptr<Backend> make_cuda_backend(const BackendSettings& settings);

// Adds "cuda" to the registry (called by register_builtin_backends()).
void register_cuda_backend(BackendRegistry& registry);

}  // namespace hybridtb::cuda
