// What each attention kernel takes (element types, head sizes) and the tile shapes of the
// tensor-core prefill kernel: one source for the planner (host compiler, attention_work_plan.cpp)
// and the kernels (nvcc, prefill_mma_kernel.cuh). No CUDA runtime types; the tile functions are
// constexpr and usable on the device.
#pragma once

#include <cstdint>
#include <string>

#include "hybridtb/spec/host_device.h"
#include "kv_cache_write/kv_cache_write_params.h"  // ElementKind

namespace hybridtb::cuda {

// Decode kernels (SIMT): head sizes 64/128/256, cache elements float16, bfloat16 or 1 byte (fp8,
// int8). Must agree with attention_inst_decode.cuh.
bool decode_supported(ElementKind kv_kind, int64_t head_size);
// SIMT decode: query heads per CTA for a GQA ratio: 1, 4 or 8 (the instances of attention_inst_decode.cuh).
int decode_heads_per_pass(int64_t queries_per_kv);
// Tensor-core decode: model dtype float16/bfloat16 with the cache element equal to it (kv cache
// dtype auto) or of one byte (dequantised per tile), head sizes 64/128/256. Must agree with
// decode_mma_kernel.cuh's launches.
bool decode_mma_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size);
// Tensor-core decode: query heads per CTA (mma N columns): 8, or 16 for queries_per_kv > 8 with
// head size ≤ 128.
int decode_mma_heads_per_pass(int64_t queries_per_kv, int64_t head_size);
// Tensor-core prefill: model dtype float16/bfloat16 with the cache element equal to it (kv cache
// dtype auto, or encoder_only) or of one byte (fp8 e4m3/e5m2, int8: dequantised per tile), head
// sizes 64/128/256. Must agree with attention_inst_prefill.cuh.
bool prefill_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size);
// The mixed kernel (tensor-core prefill and decode CTAs of one step in one grid, mixed_kernel.cuh):
// float16/bfloat16 with a cache of the same dtype, head sizes 64/128 (where both kernels run 128
// threads), 8 MMA columns per decode CTA (the decode kernel's NT 1) and the head size's default
// prefill variant. Must agree with attention_inst_mixed.cuh.
bool mixed_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size, int decode_columns,
                     int prefill_variant);
// A 1-byte cache element (fp8 e4m3/e5m2, int8).
HYBRIDTB_HOST_DEVICE constexpr bool is_byte_element(ElementKind kind) {
  return kind == ElementKind::kFp8E4M3 || kind == ElementKind::kFp8E5M2 || kind == ElementKind::kInt8;
}

// Tile configurations of the tensor-core prefill kernel ("variants"): mt m-tiles of 16 rows per
// warp (4 warps: 64·mt (token, head) rows per CTA), bn keys per K/V tile, and the CTAs per SM the
// register budget is capped for (__launch_bounds__).
struct PrefillConfig {
  int mt;          // m-tiles (16 rows) per warp
  int bn;          // keys per K/V tile
  int min_blocks;  // CTAs per SM for __launch_bounds__
};
// Variant 0, one m-tile per warp: 64 rows × 64 keys (D ≤ 128) or × 32 keys (D 256); every head size.
HYBRIDTB_HOST_DEVICE constexpr PrefillConfig prefill_one_mtile_config(int d) {
  PrefillConfig c{};
  c.mt = 1;
  c.bn = d <= 128 ? 64 : 32;
  c.min_blocks = 1;
  return c;
}
// Variant 1, two m-tiles per warp (each K/V fragment feeds both): 128 rows × 32 keys; D 128's default.
HYBRIDTB_HOST_DEVICE constexpr PrefillConfig prefill_two_mtile_config() {
  PrefillConfig c{};
  c.mt = 2;
  c.bn = 32;
  c.min_blocks = 1;
  return c;
}
// Variant 2, one m-tile per warp at 3 CTAs per SM: 64 rows × 32 keys (D 128 only).
HYBRIDTB_HOST_DEVICE constexpr PrefillConfig prefill_three_ctas_config() {
  PrefillConfig c{};
  c.mt = 1;
  c.bn = 32;
  c.min_blocks = 3;
  return c;
}
// Variant 3, Hopper warpgroup MMAs (prefill_wgmma_kernel.cuh): 128 rows (two consumer warpgroups of
// 64; mt counts 16-row m-tiles per warp of 4 as for the others) × 128 keys (D 64, 128) or 64 keys
// (D 256: a K/V stage of 256-wide rows is four times D 64's, and the consumers' O of 64 × 256 leaves
// registers for an S of 64 × 64 only), 384 threads with the producer warpgroup, 1 CTA per SM.
// D 64, 128, 256 with a 16-bit cache of the model dtype; D 128 also with a 1-byte cache (cast by the
// producer warpgroup); sm_90a builds on compute capability 9.0 devices only.
HYBRIDTB_HOST_DEVICE constexpr PrefillConfig prefill_wgmma_config(int d) {
  PrefillConfig c{};
  c.mt = 2;
  c.bn = d == 256 ? 64 : 128;
  c.min_blocks = 1;
  return c;
}
// The wgmma prefill's K and V tiles in shared memory (prefill_wgmma_kernel.cuh, "The K and V
// tiles"): the byte offset of 16-byte chunk `chunk` (dims 8·chunk …) of tile key `key` at head size
// D. Keys in groups of 8, each group its D / 64 slabs of 64 dims in turn, each slab one 1024-byte
// atom of the 128-byte swizzle.
template <int D>
HYBRIDTB_HOST_DEVICE constexpr uint32_t wgmma_kv_tile_offset(int key, int chunk) {
  return static_cast<uint32_t>((key / 8) * 16 * D + (chunk / 8) * 1024 + (key % 8) * 128 +
                               (((chunk % 8) ^ (key % 8)) << 4));
}
// Whether a 1-byte cache's products can run on float16 operands whatever the model dtype: every
// stored value is exact in float16 (its cast the cheapest), and P, which carries each key's v scale
// with a per-token-head cache (byte_cache.cuh, CacheScales), stays within float16's range — a
// float16 model's v scales are at most 65504 / 127, a bfloat16 model's have no such bound, so its
// per-token-head caches keep bfloat16 products.
HYBRIDTB_HOST_DEVICE constexpr bool byte_cache_float16_products(bool byte_cache, bool per_token_head, bool model_half) {
  return byte_cache && (model_half || !per_token_head);
}
// The wgmma prefill (prefill_wgmma_kernel.cuh, WgmmaOperands) takes them with plain logits (no soft
// cap, no ALiBi); its instances with featured logits keep the model dtype.
HYBRIDTB_HOST_DEVICE constexpr bool wgmma_float16_products(bool byte_cache, bool per_token_head, bool model_half,
                                                           bool plain_logits) {
  return plain_logits && byte_cache_float16_products(byte_cache, per_token_head, model_half);
}
// The tensor-core decode (decode_mma_kernel.cuh, DecodeOperands) takes them whatever the logits.
HYBRIDTB_HOST_DEVICE constexpr bool decode_float16_products(bool byte_cache, bool per_token_head, bool model_half) {
  return byte_cache_float16_products(byte_cache, per_token_head, model_half);
}
// The variants by number: the template argument V of prefill_mma_kernel and
// AttentionPathOverrides::prefill_variant.
constexpr int kPrefillOneMTile = 0;
constexpr int kPrefillTwoMTiles = 1;
constexpr int kPrefillThreeCtas = 2;
constexpr int kPrefillWgmma = 3;
constexpr int kPrefillVariants = 4;
// What each variant is, for the plan's text (AttentionPlanSummary::describe).
constexpr const char* prefill_variant_name(int variant) {
  switch (variant) {
    case kPrefillOneMTile:
      return "mma.sync, one m-tile";
    case kPrefillTwoMTiles:
      return "mma.sync, two m-tiles";
    case kPrefillThreeCtas:
      return "mma.sync, three CTAs";
    case kPrefillWgmma:
      return "wgmma";
  }
  return "?";
}
HYBRIDTB_HOST_DEVICE constexpr PrefillConfig prefill_config(int d, int variant) {
  if (variant == kPrefillTwoMTiles) return prefill_two_mtile_config();
  if (variant == kPrefillThreeCtas) return prefill_three_ctas_config();
  if (variant == kPrefillWgmma) return prefill_wgmma_config(d);
  return prefill_one_mtile_config(d);
}
HYBRIDTB_HOST_DEVICE constexpr int prefill_rows(int d, int variant) { return 64 * prefill_config(d, variant).mt; }

// The default variant per head size: D 128 takes the two-m-tile variant (each K/V fragment feeds two
// m-tiles; the fastest of the three there, experiments/results/README.md), D 64 and 256 the
// one-m-tile variant.
HYBRIDTB_HOST_DEVICE constexpr int prefill_default_variant(int64_t head_size) {
  return head_size == 128 ? kPrefillTwoMTiles : kPrefillOneMTile;
}
// How many variants exist, whether one is instantiated for a head size and cache element (16-bit
// caches: variants 1 and 2 at D 128 only, variant 3 at every head size in sm_90a builds; 1-byte
// caches: the default only, and variant 3 at D 128 in sm_90a builds), its (token, head) rows per item.
int prefill_num_variants();
bool prefill_variant_supported(int64_t head_size, int variant, ElementKind kv_kind);
// Whether this build has the wgmma variant's sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90).
bool prefill_wgmma_built();
// Why the wgmma variant does not take a layer of this head size and cache element ("" if it does).
std::string prefill_wgmma_unsupported(int64_t head_size, ElementKind kv_kind);
int64_t prefill_rows_per_item(int64_t head_size, int variant);

}  // namespace hybridtb::cuda
