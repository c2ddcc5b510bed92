// Instantiations of the tensor-core prefill kernel for __half: head sizes 64/128/256 × plain/featured logits.
#include "attention/attention_inst_prefill.cuh"

namespace hybridtb::cuda {

// Head size 128: variant 1 (2 m-tiles per warp, 128 rows × 32 keys) measured 185–192 TFLOP/s on an
// H100 against 132–153 for variant 0 and 155–166 for variant 2 (optimized/README.md).
int prefill_default_variant(int64_t head_size) { return head_size == 128 ? 1 : 0; }
int prefill_num_variants() { return 3; }
bool prefill_variant_supported(int64_t head_size, int variant) {
  return variant == 0 || (head_size == 128 && variant < prefill_num_variants());
}
int64_t prefill_rows_per_item(int64_t head_size, int variant) {
  return prefill_rows(static_cast<int>(head_size), variant);
}

void launch_prefill_f16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  launch_prefill_typed<__half>(params, num_items, variant, stream);
}

}  // namespace hybridtb::cuda
