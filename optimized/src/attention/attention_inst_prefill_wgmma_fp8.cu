// Instantiations of the wgmma prefill kernel (prefill_wgmma_kernel.cuh) with a per-tensor fp8 cache (e4m3/e5m2), cast by
// the producer warpgroup: float16/bfloat16 × plain/featured logits, head size 128. Compiled for
// sm_90a only (optimized/CMakeLists.txt).
#include "attention/attention_inst_prefill_wgmma.cuh"

namespace hybridtb::cuda {

void launch_prefill_wgmma_fp8(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  launch_wgmma_bytes<PerTensorBytes>(params, num_items, stream);
}

}  // namespace hybridtb::cuda
