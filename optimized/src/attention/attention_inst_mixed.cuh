// Dispatch of the mixed kernel (mixed_kernel.cuh) over (head size, plain/featured logits) for one
// model dtype; included by attention_inst_mixed_<kind>.cu. The combinations are the planner's
// (attention_caps.h mixed_supported): head sizes 64 and 128, a cache of the model dtype.
#pragma once

#include "attention/attention_launch.h"
#include "attention/mixed_kernel.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {

template <typename T, int D, bool Plain>
void launch_mixed_instance(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream) {
  constexpr int kSmem = mixed_smem_bytes(D);
  allow_dynamic_smem(mixed_kernel<T, D, Plain>, kSmem);
  mixed_kernel<T, D, Plain><<<static_cast<unsigned>(num_ctas), kPrefillThreads, kSmem, stream>>>(params, block_shift);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// The logit variant of both bodies: the prefill launch's test `!(soft_cap > 0)` and the decode
// launch's `soft_cap <= 0` agree because the configuration's soft cap is finite and ≥ 0.
template <typename T, int D>
void launch_mixed_d(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream) {
  const bool plain = params.soft_cap <= 0.0f && params.alibi_slopes == nullptr;
  if (plain) return launch_mixed_instance<T, D, true>(params, num_ctas, block_shift, stream);
  return launch_mixed_instance<T, D, false>(params, num_ctas, block_shift, stream);
}

template <typename T>
void launch_mixed_typed(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream) {
  if (params.kv_kind != params.q_kind || params.queries_per_kv > 8) {
    throw Error("mixed attention: the mixed kernel takes a cache of the model dtype and at most 8 query heads per "
                "kv head");
  }
  switch (params.head_size) {
    case 64:
      return launch_mixed_d<T, 64>(params, num_ctas, block_shift, stream);
    case 128:
      return launch_mixed_d<T, 128>(params, num_ctas, block_shift, stream);
    default:
      throw Error(detail::concat("mixed attention: no instance for head size ", params.head_size));
  }
}

}  // namespace hybridtb::cuda
