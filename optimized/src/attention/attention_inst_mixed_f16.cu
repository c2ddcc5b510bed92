// Instantiations of the mixed kernel (mixed_kernel.cuh) for __half with a __half cache: head sizes
// 64/128 × plain/featured logits.
#include "attention/attention_inst_mixed.cuh"

namespace hybridtb::cuda {

void launch_mixed_f16(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream) {
  launch_mixed_typed<__half>(params, num_ctas, block_shift, stream);
}

}  // namespace hybridtb::cuda
