// Instantiations of the tensor-core prefill kernel for __half with a per-tensor fp8 cache (e4m3/e5m2), cast per tile:
// head sizes 64/128/256 × plain/featured logits, each head size's default tile variant.
#include "attention/attention_inst_prefill.cuh"

namespace hybridtb::cuda {

void launch_prefill_f16_fp8(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  launch_prefill_typed<__half, PerTensorBytes>(params, num_items, variant, stream);
}

}  // namespace hybridtb::cuda
