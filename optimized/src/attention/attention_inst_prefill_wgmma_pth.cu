// Instantiations of the wgmma prefill kernel (prefill_wgmma_kernel.cuh) with a per-token-head cache (int8/fp8), cast by
// the producer warpgroup: float16/bfloat16 × plain/featured logits, head size 128. Compiled for
// sm_90a only (optimized/CMakeLists.txt).
#include "attention/attention_inst_prefill_wgmma.cuh"

namespace hybridtb::cuda {

void launch_prefill_wgmma_pth(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  launch_wgmma_bytes<PerTokenHeadBytes>(params, num_items, stream);
}

}  // namespace hybridtb::cuda
