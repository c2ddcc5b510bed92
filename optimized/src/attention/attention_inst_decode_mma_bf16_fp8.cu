// Instantiations of the tensor-core decode kernel (decode_mma_kernel.cuh) for __nv_bfloat16 with a per-tensor fp8 cache (e4m3/e5m2),
// cast per tile: head sizes 64/128/256 × 8 or 16 head columns × plain / featured logits.
#include "attention/decode_mma_kernel.cuh"

namespace hybridtb::cuda {

void launch_decode_mma_bf16_fp8(const AttentionParams& params, int64_t num_items, int block_shift,
                                  cudaStream_t stream) {
  launch_decode_mma_typed<__nv_bfloat16, PerTensorBytes>(params, num_items, block_shift, stream);
}

}  // namespace hybridtb::cuda
