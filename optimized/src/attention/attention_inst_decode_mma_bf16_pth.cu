// Instantiations of the tensor-core decode kernel (decode_mma_kernel.cuh) for __nv_bfloat16 with a per-token-head cache (int8/fp8),
// cast per tile: head sizes 64/128/256 × 8 or 16 head columns × plain / featured logits.
#include "attention/decode_mma_kernel.cuh"

namespace hybridtb::cuda {

void launch_decode_mma_bf16_pth(const AttentionParams& params, int64_t num_items, int block_shift,
                                  cudaStream_t stream) {
  launch_decode_mma_typed<__nv_bfloat16, PerTokenHeadBytes>(params, num_items, block_shift, stream);
}

}  // namespace hybridtb::cuda
