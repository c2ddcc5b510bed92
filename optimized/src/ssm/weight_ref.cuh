// Reading a WeightRef (ssm_params.h) on the GPU: element i of a weight of any float kind, or
// `absent` where the optional weight is missing (data == nullptr). One definition for every SSM
// kernel file.
#pragma once

#include <cstdint>

#include "common/elements.cuh"
#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

__device__ __forceinline__ float weight_or(const WeightRef& w, int64_t i, float absent) {
  return w.data != nullptr ? load_element(w.data, i, w.kind) : absent;
}

}  // namespace hybridtb::cuda::ssm
