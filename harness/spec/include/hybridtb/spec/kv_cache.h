// The paged KV cache as both backends read it: what a kv_cache_dtype means for the stored bytes
// (the one decoder of KvCacheDtype into a storage dtype and a scaling), and the one binding and
// validation of a step's cache tensors.
#pragma once

#include <cstdint>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/tensor.h"

namespace hybridtb::spec {

// Where the dequantisation scales of a cache live.
enum class KvCacheScaling : uint8_t {
  kNone,          // auto: the bits of key/value in the model dtype
  kPerTensor,     // fp8_e4m3 / fp8_e5m2: one k_scale and one v_scale for the layer
  kPerTokenHead,  // int8/fp8_per_token_head: k_scale_cache / v_scale_cache [NB, BS, Hkv] float32
};

struct KvCacheFormat {
  DType storage = DType::kFloat32;  // the dtype of kv_cache's elements
  KvCacheScaling scaling = KvCacheScaling::kNone;
};

// kv_cache_dtype decoded for a model dtype.
KvCacheFormat kv_cache_format(KvCacheDtype kv, DType model_dtype);

// The cache tensors of a step, checked.
struct KvCacheBinding {
  KvCacheFormat format;
  TensorView cache;          // [NB, 2, block_size, Hkv, D] in format.storage
  TensorView k_scale_cache;  // [NB, block_size, Hkv] float32 (kPerTokenHead only; empty otherwise)
  TensorView v_scale_cache;
  int64_t num_blocks = 0;
  int64_t num_slots = 0;  // num_blocks · block_size
};

// Checks tensors.kv_cache against config — rank 5, [NB, 2, block_size, num_kv_heads, head_size],
// the storage dtype of config.kv_cache_dtype, on `device`, contiguous in its last dimension — and,
// for the per-token-head modes, k_scale_cache and v_scale_cache: [NB, block_size, num_kv_heads]
// float32 contiguous tensors on `device`. Throws Error naming the tensor and the constraint.
KvCacheBinding bind_kv_cache(const AttentionConfig& config, const StepTensors& tensors, Device device);

}  // namespace hybridtb::spec
