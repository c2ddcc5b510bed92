// Instantiations of the tensor-core decode kernel (decode_mma_kernel.cuh) for __nv_bfloat16 with a 1-byte
// cache (fp8 e4m3/e5m2, int8; dequantised per tile): head sizes 64/128/256 × 8 or 16 head columns ×
// plain / featured logits.
#include "attention/decode_mma_kernel.cuh"

namespace hybridtb::cuda {

void launch_decode_mma_bf16_u8(const AttentionParams& params, int64_t num_items, int block_shift,
                               cudaStream_t stream) {
  launch_decode_mma_typed<__nv_bfloat16, uint8_t>(params, num_items, block_shift, stream);
}

}  // namespace hybridtb::cuda
