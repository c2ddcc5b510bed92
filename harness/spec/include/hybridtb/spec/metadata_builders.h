// The metadata builders: vLLM's TritonAttentionMetadataBuilder and
// BaseMambaAttentionMetadataBuilder (seed 001) on the host, literally, plus the helpers they use.
// One implementation shared by every backend's build_metadata(), so parity does not compare it;
// tests/builders checks it against vLLM's semantics field by field.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"

namespace hybridtb::spec {

// utils.py: split_decodes_and_prefills (positional: everything from the first request with
// query_len > decode_threshold on is a prefill). With treat_short_extends_as_decodes false (vLLM
// 0.33's Mamba and GDN builders) a request that is still prefilling is a prefill whatever its
// query_len; a batch file does not record num_prompt_tokens, so "still prefilling" is taken as "has
// computed no token" (context_len 0 and query_len > 0), the case that differs between versions
// (0.33 turns a one-token prefill chunk *with* context back into a decode, so only requests without
// context stay prefills).
struct DecodePrefillSplit {
  int64_t num_decodes = 0;
  int64_t num_prefills = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_prefill_tokens = 0;
};
DecodePrefillSplit split_decodes_and_prefills(const BatchDescription& batch, int64_t decode_threshold,
                                              bool require_uniform = false,
                                              bool treat_short_extends_as_decodes = true);

// Throws Error naming the first offending request unless every request with
// query_len ≤ decode_threshold comes before every request with query_len > decode_threshold.
// Trailing padding requests (query_len 0, seq_len 0) are exempt: they may follow prefills.
// With treat_short_extends_as_decodes false, a request without context is a prefill whatever its
// query_len (as in the split above).
void check_decodes_first(const BatchDescription& batch, int64_t decode_threshold,
                         bool treat_short_extends_as_decodes = true);

// reorder_batch_to_split_decodes_and_prefills: the stable request order decode → extend → prefill
// (decode: query_len ≤ threshold; extend: has context; prefill: no context). Returns the new
// order as old request indices. Trailing padding requests keep their places at the end.
// With treat_short_extends_as_decodes false a short request without context goes to the prefill
// region (vLLM 0.33's reorder: no context → prefill, whatever the query length).
std::vector<int64_t> decode_first_order(const BatchDescription& batch, int64_t decode_threshold,
                                        bool treat_short_extends_as_decodes = true);
// Applies a request permutation to a batch description and its token-major tensors (query, key,
// value rows move with their requests; padding rows stay at the end).
void reorder_requests(const std::vector<int64_t>& order, BatchDescription& batch, BatchInputs& inputs);

// mamba_utils: mamba_get_block_table_tensor. Modes none/all return the table unchanged; align
// returns [R, 1 + num_speculative_blocks]: the block holding each request's last token onwards.
IntArray mamba_get_block_table_tensor(const IntArray& block_table, const IntArray& seq_lens,
                                      int64_t mamba_block_size, int64_t num_speculative_blocks,
                                      MambaCacheMode mode);

// compute_causal_conv1d_metadata (BLOCK_M = 8).
CausalConv1dMetadata compute_causal_conv1d_metadata(const IntArray& query_start_loc_p);

TritonAttentionMetadata build_triton_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                              const BatchDescription& batch);
MambaAttentionMetadata build_mamba_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                            const BatchDescription& batch);
HybridMetadata build_hybrid_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                     const BatchDescription& batch);

// BaseMambaAttentionMetadataBuilder.update_block_table: recomputes the state indices of already
// built metadata from a new block table (same requests), then re-applies CUDA-graph padding.
MambaAttentionMetadata update_block_table(const AttentionConfig& config, const BuilderConfig& builder,
                                          const MambaAttentionMetadata& metadata, const IntArray& block_table);

}  // namespace hybridtb::spec
