// Kernel launches of the paged attention, one function per instantiation file
// (attention_inst_*.cu). What each kernel takes is in attention_caps.h (shared with the planner).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

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
// Tensor-core prefill kernel over `num_items` GenericItems of tile variant `variant`.
void launch_prefill_attention(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
// Per model dtype with a cache of that dtype (attention_inst_prefill_<kind>.cu), a per-tensor fp8
// cache (_fp8.cu) and a per-token-head cache (_pth.cu).
void launch_prefill_f16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_f16_fp8(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16_fp8(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_f16_pth(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
void launch_prefill_bf16_pth(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream);
// The wgmma variant (kPrefillWgmma, prefill_wgmma_kernel.cuh; sm_90a builds only): float16 /
// bfloat16 with a cache of the model dtype, head size 128. Throws Error on a device other than
// compute capability 9.0, or for another dtype or head size.
void launch_prefill_wgmma(const AttentionParams& params, int64_t num_items, cudaStream_t stream);
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
