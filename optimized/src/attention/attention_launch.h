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
void launch_decode_combine(const AttentionParams& params, int64_t num_items, cudaStream_t stream);

}  // namespace hybridtb::cuda
