// Instantiations of the decode kernel for __nv_bfloat16 caches: head sizes 64/128/256 × heads per pass 1/4/8.
#include "attention/attention_inst_decode.cuh"

namespace hybridtb::cuda {

void launch_decode_bf16(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                        cudaStream_t stream) {
  launch_decode_typed<__nv_bfloat16>(params, num_items, heads_per_pass, block_shift, stream);
}

}  // namespace hybridtb::cuda
