// Instantiations of the tensor-core prefill kernel for __half with a per-token-head cache (int8/fp8), cast per tile:
// head sizes 64/128/256 × plain/featured logits, each head size's default tile variant.
#include "attention/attention_inst_prefill.cuh"

namespace hybridtb::cuda {

void launch_prefill_f16_pth(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  launch_prefill_typed<__half, PerTokenHeadBytes>(params, num_items, variant, stream);
}

}  // namespace hybridtb::cuda
