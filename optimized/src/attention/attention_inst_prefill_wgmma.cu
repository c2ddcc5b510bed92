// Instantiations of the wgmma prefill kernel (prefill_wgmma_kernel.cuh): float16 and bfloat16 with a
// cache of the model dtype, head size 128, plain/featured logits. Compiled for sm_90a only
// (optimized/CMakeLists.txt); the launcher checks that the device is compute capability 9.0.
#include <cuda_runtime.h>

#include "attention/attention_launch.h"
#include "attention/prefill_wgmma_kernel.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {
namespace {

template <typename T, bool Plain>
void launch_wgmma_instance(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  constexpr auto kSmem = static_cast<int>(prefill_wgmma_smem_bytes());
  allow_dynamic_smem(prefill_wgmma_kernel<T, Plain>, kSmem);
  prefill_wgmma_kernel<T, Plain><<<static_cast<unsigned>(num_items), kWgmmaThreads, kSmem, stream>>>(params);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_wgmma_typed(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  const bool plain = !(params.soft_cap > 0.0f) && params.alibi_slopes == nullptr;
  if (plain) return launch_wgmma_instance<T, true>(params, num_items, stream);
  return launch_wgmma_instance<T, false>(params, num_items, stream);
}

}  // namespace

void launch_prefill_wgmma(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  const ComputeCapability cc = current_compute_capability();
  if (!cc.is_hopper()) {
    throw Error(detail::concat("prefill attention: prefill_variant 3 (wgmma) needs a compute capability 9.0 device "
                               "(sm_90a code); the current device is ",
                               cc.major, ".", cc.minor, ": use prefill_variant -1"));
  }
  if (params.head_size != kWgmmaHead || (!params.encoder && params.kv_kind != params.q_kind)) {
    throw Error(detail::concat("prefill attention: prefill_variant 3 (wgmma) takes head size 128 with a cache of "
                               "the model dtype, not head size ",
                               params.head_size, " with cache element kind ", static_cast<int>(params.kv_kind)));
  }
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_wgmma_typed<__half>(params, num_items, stream);
    case ElementKind::kBFloat16:
      return launch_wgmma_typed<__nv_bfloat16>(params, num_items, stream);
    default:
      throw Error("prefill attention: prefill_variant 3 (wgmma) takes float16/bfloat16 only");
  }
}

}  // namespace hybridtb::cuda
