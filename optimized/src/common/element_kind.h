// The storage element the kernels use for a tensor's dtype: one mapping for the attention, KV-cache
// and SSM paths (ElementKind itself: kv_cache_write/kv_cache_write_params.h).
#pragma once

#include "hybridtb/dtype.h"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

// float32, float16, bfloat16, fp8 e4m3 / e5m2, int8; throws NotSupported for any other dtype.
ElementKind element_kind(DType dtype);

}  // namespace hybridtb::cuda
