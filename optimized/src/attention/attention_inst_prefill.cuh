// Dispatch of the tensor-core prefill kernel over (head size, plain/featured logits, tile variant)
// for one model dtype and cache element; included by the attention_inst_prefill_<kind>[_fp8|_pth].cu
// files (per model dtype: a 16-bit cache, a per-tensor fp8 cache, a per-token-head cache). With a 16-bit
// cache, variants other than the one-m-tile variant are instantiated for head size 128 only (the
// default there, and the benchmark's comparison; attention_caps.h); a 1-byte cache has only each
// head size's default variant.
#pragma once

#include <type_traits>

#include "attention/attention_launch.h"
#include "attention/prefill_mma_kernel.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {

template <typename T, int D, bool Plain, int V, typename Cache>
void launch_prefill_instance(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  constexpr auto kSmem = static_cast<int>(prefill_smem_bytes(D, V, kIsByteCache<Cache>));
  allow_dynamic_smem(prefill_mma_kernel<T, D, Plain, V, Cache>, kSmem);
  prefill_mma_kernel<T, D, Plain, V, Cache>
      <<<static_cast<unsigned>(num_items), kPrefillThreads, kSmem, stream>>>(params);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename T, int D, int V, typename Cache>
void launch_prefill_v(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  const bool plain = !(params.soft_cap > 0.0f) && params.alibi_slopes == nullptr;
  if (plain) return launch_prefill_instance<T, D, true, V, Cache>(params, num_items, stream);
  return launch_prefill_instance<T, D, false, V, Cache>(params, num_items, stream);
}

template <typename T, int D, typename Cache>
void launch_prefill_d(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  if constexpr (kIsByteCache<Cache>) {
    if (!byte_kind_supported<Cache>(params.kv_kind)) {
      throw Error(detail::concat("prefill attention: stored element kind ", static_cast<int>(params.kv_kind),
                                 " is not one of this scale mode's"));
    }
    constexpr int kDefault = prefill_default_variant(D);
    if (variant != kDefault) {
      throw Error(detail::concat("prefill attention: a 1-byte cache has only variant ", kDefault, " at head size ", D));
    }
    return launch_prefill_v<T, D, kDefault, Cache>(params, num_items, stream);
  } else {
    if constexpr (D == 128) {
      if (variant == kPrefillTwoMTiles) return launch_prefill_v<T, D, kPrefillTwoMTiles, Cache>(params, num_items, stream);
      if (variant == kPrefillThreeCtas) return launch_prefill_v<T, D, kPrefillThreeCtas, Cache>(params, num_items, stream);
    }
    if (variant != kPrefillOneMTile) {
      throw Error(detail::concat("prefill attention: no variant ", variant, " for head size ", D));
    }
    return launch_prefill_v<T, D, kPrefillOneMTile, Cache>(params, num_items, stream);
  }
}

// Cache: T (16-bit cache or encoder_only), PerTensorBytes or PerTokenHeadBytes (1-byte cache).
template <typename T, typename Cache>
void launch_prefill_typed(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  switch (params.head_size) {
    case 64:
      return launch_prefill_d<T, 64, Cache>(params, num_items, variant, stream);
    case 128:
      return launch_prefill_d<T, 128, Cache>(params, num_items, variant, stream);
    case 256:
      return launch_prefill_d<T, 256, Cache>(params, num_items, variant, stream);
    default:
      throw Error(detail::concat("prefill attention: no instance for head size ", params.head_size));
  }
}

}  // namespace hybridtb::cuda
