// Instantiations of the tensor-core prefill kernel for __half with a __half cache (kv_cache_dtype auto,
// encoder_only): head sizes 64/128/256 × plain/featured logits × tile variants.
#include "attention/attention_inst_prefill.cuh"

namespace hybridtb::cuda {

void launch_prefill_f16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  launch_prefill_typed<__half, __half>(params, num_items, variant, stream);
}

}  // namespace hybridtb::cuda
