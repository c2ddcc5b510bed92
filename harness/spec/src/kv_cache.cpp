// The paged KV cache as both backends read it (kv_cache.h).
#include "hybridtb/spec/kv_cache.h"

#include "hybridtb/error.h"

namespace hybridtb::spec {

KvCacheFormat kv_cache_format(KvCacheDtype kv, DType model_dtype) {
  return {.storage = kv_storage_dtype(kv, model_dtype),
          .scaling = is_per_token_head(kv) ? KvCacheScaling::kPerTokenHead
                     : is_quantized(kv)    ? KvCacheScaling::kPerTensor
                                           : KvCacheScaling::kNone};
}

KvCacheBinding bind_kv_cache(const AttentionConfig& config, const StepTensors& tensors, Device device) {
  KvCacheBinding binding;
  binding.format = kv_cache_format(config.kv_cache_dtype, config.dtype);
  const TensorView& cache = tensors.kv_cache;
  const int64_t hkv = config.num_kv_heads;
  const int64_t d = config.head_size;
  HYBRIDTB_CHECK(!cache.empty() && cache.rank() == 5, "kv_cache must be [NB, 2, BS, Hkv, D], got ", cache.describe());
  const Shape cache_shape{cache.size(0), 2, config.block_size, hkv, d};
  HYBRIDTB_CHECK(cache.shape() == cache_shape, "kv_cache must be ", shape_to_string(cache_shape), ", got ",
                 cache.describe());
  HYBRIDTB_CHECK(cache.dtype() == binding.format.storage, "kv_cache dtype must be ", to_string(binding.format.storage),
                 " for kv_cache_dtype ", to_string(config.kv_cache_dtype), ", got ", cache.describe());
  HYBRIDTB_CHECK(cache.device() == device && cache.stride(4) == 1, "kv_cache must be a ", to_string(device),
                 " tensor contiguous in its last dimension, got ", cache.describe());
  binding.cache = cache;
  binding.num_blocks = cache.size(0);
  binding.num_slots = cache.size(0) * config.block_size;
  if (binding.format.scaling == KvCacheScaling::kPerTokenHead) {
    const Shape scale_shape{cache.size(0), config.block_size, hkv};
    for (const TensorView* scales : {&tensors.k_scale_cache, &tensors.v_scale_cache}) {
      HYBRIDTB_CHECK(scales->shape() == scale_shape && scales->dtype() == DType::kFloat32 &&
                         scales->device() == device && scales->is_contiguous(),
                     "k_scale_cache and v_scale_cache must be ", to_string(device), " float32 ",
                     shape_to_string(scale_shape), " contiguous tensors, got ", scales->describe());
    }
    binding.k_scale_cache = tensors.k_scale_cache;
    binding.v_scale_cache = tensors.v_scale_cache;
  }
  return binding;
}

}  // namespace hybridtb::spec
