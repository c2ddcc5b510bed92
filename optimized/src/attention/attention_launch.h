// Kernel launches of the paged attention, one function per instantiation file
// (attention_inst_*.cu), and the capability tables the planner consults. Host-only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace hybridtb::cuda {

// Largest head size of the generic kernel (its shared memory grows with D).
int64_t generic_max_head_size();
// Generic kernel over `num_items` GenericItems; kv_kind is the cache element (or the model dtype
// for encoder_only layers, which read key/value).
void launch_generic_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                              cudaStream_t stream);

// NOTE: decode_supported() and launch_decode_attention() must agree (attention_inst_decode_*.cu).
// Decode fast path: head sizes 64/128/256, cache elements float16, bfloat16 or 1 byte (fp8, int8).
bool decode_supported(ElementKind kv_kind, int64_t head_size);
// Heads per pass for a GQA ratio: 1, 4 or 8.
int decode_heads_per_pass(int64_t queries_per_kv);
void launch_decode_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                             int heads_per_pass, int block_shift, cudaStream_t stream);
// Per element type (attention_inst_decode_<kind>.cu).
void launch_decode_f16(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                       cudaStream_t stream);
void launch_decode_bf16(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                        cudaStream_t stream);
void launch_decode_u8(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                      cudaStream_t stream);
// NOTE: decode_mma_supported() and launch_decode_mma() must agree (attention_inst_decode_mma_*.cu).
// Tensor-core decode path: model dtype float16/bfloat16 with the cache element equal to it (kv
// cache dtype auto), head sizes 64/128/256; 1-byte caches stay on the SIMT decode kernel.
bool decode_mma_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size);
// Query heads per CTA (mma N columns): 8, or 16 for queries_per_kv > 8 with head size ≤ 128.
int decode_mma_heads_per_pass(int64_t queries_per_kv, int64_t head_size);
void launch_decode_mma(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
// Per model dtype (attention_inst_decode_mma_<kind>.cu).
void launch_decode_mma_f16(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
void launch_decode_mma_bf16(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream);
// NOTE: prefill_supported() and launch_prefill_attention() must agree (attention_inst_prefill_*.cu).
// Tensor-core prefill path: model dtype float16/bfloat16 with the cache element equal to it (kv
// cache dtype auto, or encoder_only), head sizes 64/128/256.
bool prefill_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size);
// Tile variants (prefill_mma_kernel.cuh, prefill_config): the default per head size, how many
// exist, and the (token, head) rows per item of one (the planner packs GQA heads of one kv head
// into them).
int prefill_default_variant(int64_t head_size);
int prefill_num_variants();
bool prefill_variant_supported(int64_t head_size, int variant);  // instantiated for this head size
int64_t prefill_rows_per_item(int64_t head_size, int variant);
void launch_prefill_attention(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
// Per model dtype (attention_inst_prefill_<kind>.cu).
void launch_prefill_f16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_decode_combine(const AttentionParams& params, int64_t num_items, cudaStream_t stream);

}  // namespace hybridtb::cuda
