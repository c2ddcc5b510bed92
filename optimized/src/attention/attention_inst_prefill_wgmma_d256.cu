// Instantiations of the wgmma prefill kernel (prefill_wgmma_kernel.cuh) at head size 256
// (WgmmaConfig<256>): float16/bfloat16 with a cache of the model dtype, plain/featured logits.
// Compiled for sm_90a only (optimized/CMakeLists.txt).
#include "attention/attention_inst_prefill_wgmma.cuh"

namespace hybridtb::cuda {

void launch_prefill_wgmma_d256(const AttentionParams& params, const CUtensorMap& kv_map, int64_t num_items,
                               cudaStream_t stream) {
  launch_wgmma_16bit<WgmmaConfig<256>>(params, kv_map, num_items, stream);
}

}  // namespace hybridtb::cuda
