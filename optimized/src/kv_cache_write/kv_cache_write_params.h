// Parameters of the KV-cache write kernel (reshape_and_cache_flash and its per-token-head
// quantising variant). Host-only POD; strides are in elements.
#pragma once

#include <cstdint>

namespace hybridtb::cuda {

enum class KvWriteMode : int32_t {
  kCopy = 0,          // kv_cache_dtype auto: the bits of key/value
  kFp8PerTensor = 1,  // fp8(float32(x) / scale), saturating RNE
  kPerTokenHead = 2,  // one scale per (slot, kv head): int8 (truncating) or fp8 e4m3
};

enum class ElementKind : int32_t {  // storage element of a tensor the kernels read or write
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
  kInt8 = 5,
};

struct KvWriteParams {
  const void* key;             // [T, Hkv, D] model dtype, last dim contiguous
  const void* value;           // [T, Hkv, D]
  int64_t key_stride_token;    // elements
  int64_t key_stride_head;
  int64_t value_stride_token;
  int64_t value_stride_head;
  void* kv_cache;              // [NB, 2, BS, Hkv, D], last dim contiguous
  int64_t cache_stride_block;  // elements
  int64_t cache_stride_half;
  int64_t cache_stride_slot;
  int64_t cache_stride_head;
  float* k_scale_cache;        // [NB, BS, Hkv] contiguous (per-token-head only)
  float* v_scale_cache;
  const int64_t* slot_mapping; // [num_actual_tokens]; −1 = padding
  int64_t num_tokens;          // num_actual_tokens: rows at or past it are never read
  int32_t num_kv_heads;
  int32_t head_size;
  int32_t block_size;
  KvWriteMode mode;
  ElementKind source;          // model dtype
  ElementKind storage;         // cache element
  float k_scale;               // per-tensor fp8
  float v_scale;
};

}  // namespace hybridtb::cuda
