// Launch of the KV-cache write (kv_cache_write.cu). Host-only.
#pragma once

#include <cuda_runtime_api.h>

#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

void launch_kv_cache_write(const KvWriteParams& params, cudaStream_t stream);

}  // namespace hybridtb::cuda
