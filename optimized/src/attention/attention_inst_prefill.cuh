// Dispatch of the tensor-core prefill kernel over (head size, plain/featured logits, tile variant)
// for one model dtype; included by the attention_inst_prefill_<kind>.cu files (one per dtype).
// Variants other than the one-m-tile variant are instantiated for head size 128 only (the default
// there, and the benchmark's comparison; attention_caps.h).
#pragma once

#include <mutex>

#include "attention/attention_launch.h"
#include "attention/prefill_mma_kernel.cuh"
#include "common/cuda_check.h"

namespace hybridtb::cuda {

template <typename T, int D, bool Plain, int V>
void launch_prefill_instance(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  constexpr auto kSmem = static_cast<int>(prefill_smem_bytes(D, V));
  static std::once_flag once;
  std::call_once(once, [] {
    HYBRIDTB_CUDA_CHECK(
        cudaFuncSetAttribute(prefill_mma_kernel<T, D, Plain, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  });
  prefill_mma_kernel<T, D, Plain, V><<<static_cast<unsigned>(num_items), kPrefillThreads, kSmem, stream>>>(params);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename T, int D, int V>
void launch_prefill_v(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  const bool plain = !(params.soft_cap > 0.0f) && params.alibi_slopes == nullptr;
  if (plain) return launch_prefill_instance<T, D, true, V>(params, num_items, stream);
  return launch_prefill_instance<T, D, false, V>(params, num_items, stream);
}

template <typename T, int D>
void launch_prefill_d(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  if constexpr (D == 128) {
    if (variant == kPrefillTwoMTiles) return launch_prefill_v<T, D, kPrefillTwoMTiles>(params, num_items, stream);
    if (variant == kPrefillThreeCtas) return launch_prefill_v<T, D, kPrefillThreeCtas>(params, num_items, stream);
  }
  if (variant != kPrefillOneMTile) {
    throw Error(detail::concat("prefill attention: no variant ", variant, " for head size ", D));
  }
  return launch_prefill_v<T, D, kPrefillOneMTile>(params, num_items, stream);
}

template <typename T>
void launch_prefill_typed(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  switch (params.head_size) {
    case 64:
      return launch_prefill_d<T, 64>(params, num_items, variant, stream);
    case 128:
      return launch_prefill_d<T, 128>(params, num_items, variant, stream);
    case 256:
      return launch_prefill_d<T, 256>(params, num_items, variant, stream);
    default:
      throw Error(detail::concat("prefill attention: no instance for head size ", params.head_size));
  }
}

}  // namespace hybridtb::cuda
