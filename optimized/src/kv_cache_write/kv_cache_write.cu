// Launch of the KV-cache write kernel (kv_cache_write_kernel.cuh).
#include "kv_cache_write/kv_cache_write.h"

#include "common/cuda_check.h"
#include "kv_cache_write/kv_cache_write_kernel.cuh"

namespace hybridtb::cuda {

void launch_kv_cache_write(const KvWriteParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.num_kv_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(params.num_tokens),
                  static_cast<unsigned>((2 * params.num_kv_heads + kv_write_detail::kWarpsPerBlock - 1) /
                                        kv_write_detail::kWarpsPerBlock));
  kv_cache_write_kernel<<<grid, kv_write_detail::kWarpsPerBlock * 32, 0, stream>>>(params);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda
