// Launch of the wgmma prefill kernel (prefill_wgmma_kernel.cuh) for one head size configuration,
// model dtype and cache element, plain/featured logits; included by the
// attention_inst_prefill_wgmma[_d64|_d256|_fp8|_pth].cu files (a 16-bit cache at head size 128, 64,
// 256, a per-tensor fp8 cache, a per-token-head cache), compiled for sm_90a only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/attention_launch.h"
#include "attention/prefill_wgmma_kernel.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {

template <typename Config, typename T, bool Plain, typename Cache>
void launch_wgmma_instance(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                           cudaStream_t stream) {
  constexpr auto kSmem = static_cast<int>(prefill_wgmma_smem_bytes<Config, Cache>());
  constexpr int kThreads = WgmmaRegisters<Config, Plain, Cache>::kThreads;
  allow_dynamic_smem(prefill_wgmma_kernel<Config, T, Plain, Cache>, kSmem);
  prefill_wgmma_kernel<Config, T, Plain, Cache>
      <<<static_cast<unsigned>(num_items), kThreads, kSmem, stream>>>(params, kv_map);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// Config: WgmmaConfig of the head size; Cache: T (16-bit cache or encoder_only), PerTensorBytes or
// PerTokenHeadBytes (1-byte cache).
template <typename Config, typename T, typename Cache>
void launch_wgmma_typed(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                        cudaStream_t stream) {
  const bool plain = !(params.soft_cap > 0.0f) && params.alibi_slopes == nullptr;
  if (plain) return launch_wgmma_instance<Config, T, true, Cache>(params, kv_map, num_items, stream);
  return launch_wgmma_instance<Config, T, false, Cache>(params, kv_map, num_items, stream);
}

// A cache of the model dtype (or encoder_only) at Config's head size; K/V pages by TMA where
// params.kv_tma (kv_map then the cache's map).
template <typename Config>
void launch_wgmma_16bit(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                        cudaStream_t stream) {
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_wgmma_typed<Config, __half, __half>(params, kv_map, num_items, stream);
    case ElementKind::kBFloat16:
      return launch_wgmma_typed<Config, __nv_bfloat16, __nv_bfloat16>(params, kv_map, num_items, stream);
    default:
      throw Error("prefill attention: prefill_variant 3 (wgmma) takes float16/bfloat16 only");
  }
}

// launch_wgmma_16bit at head sizes 64 and 256, instantiated in their own translation units
// (attention_inst_prefill_wgmma_d64.cu / _d256.cu).
void launch_prefill_wgmma_d64(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                              cudaStream_t stream);
void launch_prefill_wgmma_d256(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                               cudaStream_t stream);

// A 1-byte cache (its K/V tiles by cp.async only: no tensor map) of scale mode Cache.
template <typename Cache>
void launch_wgmma_bytes(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  if (!byte_kind_supported<Cache>(params.kv_kind)) {
    throw Error(detail::concat("prefill attention: stored element kind ", static_cast<int>(params.kv_kind),
                               " is not one of this scale mode's"));
  }
  AttentionParams p = params;
  p.kv_tma = 0;
  const CUtensorMap none{};
  using Config = WgmmaConfig<kWgmmaByteHead>;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_wgmma_typed<Config, __half, Cache>(p, none, num_items, stream);
    case ElementKind::kBFloat16:
      return launch_wgmma_typed<Config, __nv_bfloat16, Cache>(p, none, num_items, stream);
    default:
      throw Error("prefill attention: prefill_variant 3 (wgmma) takes float16/bfloat16 only");
  }
}

}  // namespace hybridtb::cuda
