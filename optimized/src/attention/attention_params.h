// Parameters of the paged-attention kernels (host-only POD; strides in elements). One struct for
// the whole call; the per-CTA work comes from host-built item lists (attention_launch.cu).
#pragma once

#include <cstdint>

#include "kv_cache_write/kv_cache_write_params.h"  // ElementKind

namespace hybridtb::cuda {

enum class KvScaleMode : int32_t {
  kNone = 0,          // auto: stored values are the keys/values
  kPerTensor = 1,     // fp8: value = stored · k_scale (v_scale)
  kPerTokenHead = 2,  // value = stored · k_scale_cache[block, slot, kv head]
};

// A tile of the generic kernel (and of the tensor-core prefill kernel): query rows (token, head) of one request and one kv head, with the
// keys it may need. Rows: r → token token_begin + r / num_heads, head head_begin + r % num_heads.
struct GenericItem {
  int32_t request;
  int32_t token_begin;   // query row of the request (0-based within the request)
  int32_t num_tokens;
  int32_t head_begin;    // query head (all share kv head head_begin / queries_per_kv)
  int32_t num_heads;
  int32_t key_begin;     // keys [key_begin, key_end): the hull of every row's visible keys
  int32_t key_end;
  int32_t causal_begin;  // keys [causal_begin, causal_end): the union of the rows' causal/window
  int32_t causal_end;    //   intervals; outside it only mm_prefix ranges can make a key visible
};

// One CTA of the decode kernels (SIMT and tensor-core): keys [key_begin, key_end) of one decode
// request (for every kv head via gridDim.y), for its query rows token … token + num_tokens − 1 (a
// short query's consecutive rows packed into the tensor-core decode's MMA columns, each at its own
// position; the SIMT decode takes one row per item). With num_splits > 1 it writes a partial softmax
// state per row — row token + j into partial slot partial_slot + j·num_splits — and the combine
// kernel finishes the rows. request < 0: a sentinel (grids sized for a fixed capacity, e.g.
// CUDA-graph capture, padded with unused items): the CTA returns at once and touches nothing; the
// other fields are then ignored.
struct DecodeItem {
  int32_t request;        // < 0: sentinel (unused item)
  int32_t token;          // global query row (the first of the item's rows)
  int32_t key_begin;
  int32_t key_end;
  int32_t causal_begin;   // as in GenericItem: the union of the rows' causal/window intervals
  int32_t causal_end;
  int32_t num_splits;
  int32_t partial_slot;   // the first row's slot: first slot of its splits + split index
  int32_t num_tokens;     // query rows of the item (1 but for packed short queries)
};

// A decode row finished by the combine kernel: partial slots [first_slot, first_slot + num_splits).
// token < 0: a sentinel (padding of a fixed-capacity grid): the CTA returns at once, touching nothing.
struct CombineItem {
  int32_t token;          // < 0: sentinel (unused item)
  int32_t first_slot;
  int32_t num_splits;
  int32_t pad;
};

// One CTA of the mixed kernel (mixed_kernel.cuh), which runs the tensor-core prefill and decode
// items of one step in one grid: a prefill item, or one CTA of the tensor-core decode grid (a
// decode item × kv head × head pass, which the decode kernel takes from blockIdx.x/y/z).
enum class MixedKind : int32_t {
  kPrefill = 0,  // prefill_items[index]
  kDecode = 1,   // decode_items[index] (the tensor-core decode list) for kv head kv_head, pass head_pass
};
struct MixedItem {
  MixedKind kind;
  int32_t index;
  int32_t kv_head;    // kDecode only
  int32_t head_pass;  // kDecode only: query heads [head_pass·8·NT, …) of the kv head's group
};

struct AttentionParams {
  // --- tensors --------------------------------------------------------------------------------
  const void* query;           // [T, Hq, D], last dim contiguous
  int64_t q_stride_token;
  int64_t q_stride_head;
  void* output;                // [T, Hq, D]
  int64_t o_stride_token;
  int64_t o_stride_head;
  const void* kv_cache;        // [NB, 2, BS, Hkv, D] (decoder)
  int64_t cache_stride_block;
  int64_t cache_stride_half;
  int64_t cache_stride_slot;
  int64_t cache_stride_head;
  // 1: the wgmma prefill may copy K/V tiles of whole pages by TMA through the tensor map passed
  // beside these params (launch_prefill_wgmma sets it from the map it is given, PrefillKvMap in
  // attention_launch.h); 0: cp.async for every tile, and every other kernel ignores it.
  int32_t kv_tma;
  // With kv_tma at D 128 and 256: the map's outermost coordinate of page `block`, half `h` (0 K,
  // 1 V) is block·kv_tma_block_step + h·kv_tma_half_step (the map's view joins the two dimensions).
  int32_t kv_tma_block_step;
  int32_t kv_tma_half_step;
  const void* key;             // [T, Hkv, D] (encoder_only: keys/values come from here)
  const void* value;
  int64_t k_stride_token;
  int64_t k_stride_head;
  int64_t v_stride_token;
  int64_t v_stride_head;
  const float* k_scale_cache;  // [NB, BS, Hkv] contiguous (per-token-head)
  const float* v_scale_cache;
  // --- batch (device copies of the host description) -----------------------------------------
  const int32_t* query_start_loc;  // [R + 1]
  const int32_t* seq_lens;         // [R]
  const int32_t* block_table;      // [R, block_table_stride]
  int64_t block_table_stride;
  const int32_t* mm_prefix;        // (optional) [R, num_mm_ranges, 2] inclusive ranges
  int32_t num_mm_ranges;
  const float* alibi_slopes;       // (optional) [Hq]
  const float* sinks;              // (optional) [Hq]
  // --- layer ----------------------------------------------------------------------------------
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t queries_per_kv;
  int32_t decode_mma_columns;  // the tensor-core decode's MMA columns per CTA, 8 or 16 (AttentionPlan::mma_columns)
  int32_t head_size;
  int32_t block_size;
  int32_t sliding_window;  // 0 = none
  float scale;
  float soft_cap;          // 0 = off
  int32_t alibi_sqrt;      // 1: −slope·sqrt(p − k); 0: slope·(k − context_len)
  int32_t encoder;         // 1: encoder_only (bidirectional window, keys from key/value)
  KvScaleMode kv_scale_mode;
  ElementKind q_kind;      // model dtype: query, output (and keys/values for auto/encoder)
  ElementKind kv_kind;     // cache element
  float k_scale;
  float v_scale;
  int32_t fp8_output;      // 1: store e4m3(clamp(o / output_scale, ±448)) in the model dtype
  float output_scale;
  // --- fused hybrid add (optional) --------------------------------------------------------------
  // ssm_addend != nullptr: every output row a kernel finishes also stores
  //   hybrid_output[row] = store_element(q_kind, float(v) + float(ssm_addend[row]))
  // where v is exactly the element just stored to `output` (after the dtype rounding and the fp8
  // output quantisation), read back as float — bitwise what the separate add pass computes.
  // Both are [T, Hq, D] in q_kind with output's strides (o_stride_token, o_stride_head).
  // hybrid_output alone (ssm_addend == nullptr; a layer without an SSM branch): the kernels store
  // v there too (the bits of copying output's rows). Both nullptr: no fused add. Base pointers
  // aligned like output's (the tensor-core prefill stores element pairs).
  const void* ssm_addend;
  void* hybrid_output;
  // --- work -----------------------------------------------------------------------------------
  const GenericItem* generic_items;
  const GenericItem* prefill_items;  // tensor-core prefill path (rows ≤ prefill_rows_per_item per item)
  const DecodeItem* decode_items;
  const CombineItem* combine_items;
  const MixedItem* mixed_items;      // the mixed kernel's CTAs, in launch order
  float* partial_acc;      // [slots, Hq, D] unnormalised numerators
  float* partial_ml;       // [slots, Hq, 2] (running max, denominator)
};

}  // namespace hybridtb::cuda
