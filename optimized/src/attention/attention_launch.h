// Kernel launches of the paged attention, one function per instantiation file
// (attention_inst_*.cu). What each kernel takes is in attention_caps.h (shared with the planner).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "attention/attention_caps.h"
#include "attention/attention_params.h"

namespace hybridtb::cuda {

// Largest head size of the generic kernel (its shared memory grows with D).
int64_t generic_max_head_size();
// Generic kernel over `num_items` GenericItems; kv_kind is the cache element (or the model dtype
// for encoder_only layers, which read key/value).
void launch_generic_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                              cudaStream_t stream);

// SIMT decode kernel over `num_items` DecodeItems (grid: items × kv heads × head passes).
void launch_decode_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                             int heads_per_pass, int block_shift, cudaStream_t stream);
// Per element type (attention_inst_decode_<kind>.cu).
void launch_decode_f16(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                       cudaStream_t stream);
void launch_decode_bf16(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                        cudaStream_t stream);
void launch_decode_u8(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                      cudaStream_t stream);
// Tensor-core decode kernel over `num_items` DecodeItems (grid: items × kv heads × head passes).
void launch_decode_mma(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
// Per model dtype with a cache of that dtype (attention_inst_decode_mma_<kind>.cu), a per-tensor fp8
// cache (_fp8.cu) and a per-token-head cache (_pth.cu).
void launch_decode_mma_f16(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
void launch_decode_mma_bf16(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
void launch_decode_mma_f16_fp8(const AttentionParams& params, int64_t num_items, int block_shift,
                               cudaStream_t stream);
void launch_decode_mma_bf16_fp8(const AttentionParams& params, int64_t num_items, int block_shift,
                                cudaStream_t stream);
void launch_decode_mma_f16_pth(const AttentionParams& params, int64_t num_items, int block_shift,
                               cudaStream_t stream);
void launch_decode_mma_bf16_pth(const AttentionParams& params, int64_t num_items, int block_shift,
                                cudaStream_t stream);
// A paged K/V cache as the wgmma prefill's tensor map describes it: AttentionParams' cache fields
// and the cache's block count (what a PrefillKvMap was encoded for).
struct PrefillKvLayout {
  const void* cache = nullptr;
  int64_t num_blocks = 0;
  int64_t stride_block = 0;
  int64_t stride_half = 0;
  int64_t stride_slot = 0;
  int64_t stride_head = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_size = 0;
  ElementKind q_kind = ElementKind::kFloat32;
  ElementKind kv_kind = ElementKind::kFloat32;
  int32_t encoder = 0;

  static PrefillKvLayout of(const AttentionParams& p, int64_t num_blocks) {
    PrefillKvLayout l;
    l.cache = p.kv_cache;
    l.num_blocks = num_blocks;
    l.stride_block = p.cache_stride_block;
    l.stride_half = p.cache_stride_half;
    l.stride_slot = p.cache_stride_slot;
    l.stride_head = p.cache_stride_head;
    l.block_size = p.block_size;
    l.num_kv_heads = p.num_kv_heads;
    l.head_size = p.head_size;
    l.q_kind = p.q_kind;
    l.kv_kind = p.kv_kind;
    l.encoder = p.encoder;
    return l;
  }
  bool same(const PrefillKvLayout& o) const {
    return cache == o.cache && num_blocks == o.num_blocks && stride_block == o.stride_block &&
           stride_half == o.stride_half && stride_slot == o.stride_slot && stride_head == o.stride_head &&
           block_size == o.block_size && num_kv_heads == o.num_kv_heads && head_size == o.head_size &&
           q_kind == o.q_kind && kv_kind == o.kv_kind && encoder == o.encoder;
  }
};

// The wgmma prefill's tensor map over a paged K/V cache (prefill_wgmma_kernel.cuh: its K/V tiles of
// whole pages go by TMA through it), encoded on the host once per cache layout. ok: `map` describes
// `layout`; otherwise `why` says why the layout has none (and every tile takes cp.async).
struct PrefillKvMap {
  CUtensorMap map{};
  int32_t block_step = 0;  // AttentionParams::kv_tma_block_step / _half_step for this map
  int32_t half_step = 0;
  PrefillKvLayout layout;
  bool ok = false;
  std::string why;

  // Whether the kernel may use the map with these params (the cache it was encoded for).
  bool usable_for(const AttentionParams& p) const {
    return ok && layout.same(PrefillKvLayout::of(p, layout.num_blocks));
  }
};
// The map of the cache that `params` name (kv_cache, its strides, block size, kv heads, element
// kinds), `num_blocks` blocks. Not ok (with the reason) where the layout has no exact TMA form —
// encoder_only, a head size other than 64, 128, 256 or a cache element other than the model dtype, a
// block size that is no multiple of 8 dividing the tile's keys (128; 64 at head size 256), a base or
// stride that is no multiple of 16 bytes — or where the driver has no tensor maps or refuses this one. Host only; sm_90a builds only (attention_inst_prefill_wgmma.cu).
PrefillKvMap encode_prefill_kv_map(const AttentionParams& params, int64_t num_blocks);

// Tensor-core prefill kernel over `num_items` GenericItems of tile variant `variant`; the wgmma
// variant copies K/V pages by TMA where `kv_map` (nullptr: none) is usable for `params`.
void launch_prefill_attention(const AttentionParams& params, int64_t num_items, int variant,
                              const PrefillKvMap* kv_map, cudaStream_t stream);
// Per model dtype with a cache of that dtype (attention_inst_prefill_<kind>.cu), a per-tensor fp8
// cache (_fp8.cu) and a per-token-head cache (_pth.cu).
void launch_prefill_f16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_f16_fp8(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16_fp8(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_f16_pth(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16_pth(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
// The wgmma variant (kPrefillWgmma, prefill_wgmma_kernel.cuh; sm_90a builds only): float16 /
// bfloat16 with a cache of the model dtype at head size 64, 128 or 256 (at 64 and 256 the instances
// of attention_inst_prefill_wgmma_d64.cu / _d256.cu), or a 1-byte cache at head size 128. Throws
// Error on a device other than compute capability 9.0, or for another dtype or head size. K/V tiles of whole
// pages of a 16-bit cache go by TMA where `kv_map` (nullptr: none) is usable for `params` (it sets
// params.kv_tma accordingly); all tiles take cp.async otherwise (a 1-byte cache's always).
void launch_prefill_wgmma(const AttentionParams& params, int64_t num_items, const PrefillKvMap* kv_map,
                          cudaStream_t stream);
// Its 1-byte caches: per-tensor fp8 (attention_inst_prefill_wgmma_fp8.cu), per token-head (_pth.cu).
void launch_prefill_wgmma_fp8(const AttentionParams& params, int64_t num_items, cudaStream_t stream);
void launch_prefill_wgmma_pth(const AttentionParams& params, int64_t num_items, cudaStream_t stream);
// The mixed kernel (mixed_kernel.cuh) over `num_ctas` MixedItems (params.mixed_items; decode CTAs
// index params.decode_items, the tensor-core decode list, prefill CTAs params.prefill_items).
void launch_mixed(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream);
// Per model dtype with a cache of that dtype (attention_inst_mixed_<kind>.cu).
void launch_mixed_f16(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream);
void launch_mixed_bf16(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream);
// The casts of a 1-byte cache (byte_cache.cuh) over `count` stored elements of `kind` (fp8
// e4m3/e5m2, int8) into the model dtype `model` (float16/bfloat16), for tests of their exactness on
// every stored value: cast_byte_elements is the prefill kernel's per-tile cast (count a multiple of
// 16; out in element order), cast_byte_words the decode kernel's cast of 4-byte words into fragment
// pairs (count a multiple of 4; out holds elements 0, 2, 1, 3 of each word).
void cast_byte_elements(const void* bytes, void* out, int64_t count, ElementKind kind, ElementKind model,
                        cudaStream_t stream);
void cast_byte_words(const void* bytes, void* out, int64_t count, ElementKind kind, ElementKind model,
                     cudaStream_t stream);
// The split-KV combine over `num_items` CombineItems (grid: items × query heads).
void launch_decode_combine(const AttentionParams& params, int64_t num_items, cudaStream_t stream);

}  // namespace hybridtb::cuda
