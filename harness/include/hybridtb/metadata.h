// What the metadata builders produce: plain data, integers only, comparable field by field
// between backends and stored under /outputs/metadata in a batch file.
//
// Field names follow vLLM (TritonAttentionMetadata, BaseMambaAttentionMetadata) so a captured
// batch can be checked against them. Fields vLLM sets to None are std::nullopt here. Pass-through
// fields of the batch description (query_start_loc, seq_lens, block_table, slot_mapping) are not
// repeated in the attention metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "hybridtb/int_array.h"

namespace hybridtb {

// TritonAttentionMetadataBuilder (vllm/v1/attention/backends/triton_attn.py).
struct TritonAttentionMetadata {
  int64_t num_actual_tokens = 0;
  int64_t max_query_len = 0;
  int64_t max_seq_len = 0;
  int64_t seq_threshold_3d = 0;          // 128 / num_kv_heads, snapped to a capture size under full graphs
  int64_t num_par_softmax_segments = 0;  // 16
  int64_t head_size_padded = 0;          // next power of two ≥ head_size (3D segment-buffer width)
  int64_t use_3d_path = 0;               // 1: split-softmax over segments (decode-only, few sequences)
};

// compute_causal_conv1d_metadata: how the varlen causal-conv1d kernel splits prefill tokens into
// 8-token programs. Only partitions work; outputs do not depend on it.
struct CausalConv1dMetadata {
  int64_t block_m = 8;
  IntArray nums;                    // [num_prefills] programs per prefill request: ceil(len / 8)
  int64_t tot = 0;                  // Σ nums
  IntArray mlist;                   // [tot] program → prefill request index
  IntArray offsetlist;              // [tot] program → chunk index within its request
  IntArray batch_ptr;               // [max(1024, tot)·2] mlist padded with PAD_SLOT_ID
  IntArray token_chunk_offset_ptr;  // [max(1024, tot)·2] offsetlist padded with PAD_SLOT_ID
};

// BaseMambaAttentionMetadataBuilder._compute_common_metadata (seed 001) + CUDA-graph padding.
struct MambaAttentionMetadata {
  int64_t num_prefills = 0;
  int64_t num_prefill_tokens = 0;
  int64_t num_decodes = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_reqs = 0;
  std::optional<IntArray> query_start_loc_p;     // [num_prefills + 1], rebased to the first prefill token
  std::optional<IntArray> has_initial_states_p;  // [num_prefills] 0/1: num_computed_tokens > 0
  std::optional<IntArray> state_indices_tensor_p;  // [num_prefills] (mode none/align) or [num_prefills, max_blocks] (all)
  IntArray state_indices_tensor_d;                 // [decode rows, 1 + num_spec] (none/align) or [decode rows, max_blocks] (all)
  std::optional<IntArray> num_accepted_tokens;     // [decode rows] (speculative decoding)
  std::optional<IntArray> query_start_loc_d;       // [decode rows + 1] (speculative decoding)
  std::optional<IntArray> block_idx_last_scheduled_token;     // [num_reqs] (mode all)
  std::optional<IntArray> block_idx_first_scheduled_token_p;  // [num_prefills] (mode all)
  std::optional<IntArray> block_idx_last_computed_token;      // [num_reqs] (mode all)
  std::optional<IntArray> num_computed_tokens_p;              // [num_prefills] (mode all)
  IntArray seq_lens;                                          // [num_reqs]
  std::optional<CausalConv1dMetadata> causal_conv1d;          // present iff num_prefills > 0
  int64_t cudagraph_padded = 0;  // 1 if the decode-only full-CUDA-graph padding was applied
};

// HybridAttentionMetadataBuilder (seed 000, version fa75bcc3): both builders' results.
struct HybridMetadata {
  TritonAttentionMetadata attention;
  // Absent for encoder_only layers: they have no block table and no recurrent state (the seed's
  // HybridAttentionImpl rejects encoder attention), so there is nothing for the Mamba builder.
  std::optional<MambaAttentionMetadata> mamba;
};

// --- field-by-field access ---------------------------------------------------------------------
// Every field as (path, value), e.g. ("attention/use_3d_path", 1) or
// ("mamba/causal_conv1d/batch_ptr", IntArray). Absent optionals are left out.
struct MetadataField {
  std::string name;
  std::variant<int64_t, IntArray> value;
};
std::vector<MetadataField> flatten(const HybridMetadata& metadata);
// Inverse of flatten. Unknown names throw Error; missing required scalars throw Error.
HybridMetadata unflatten(const std::vector<MetadataField>& fields);

// Human-readable differences, one line per differing field ("mamba/num_decodes: 3 vs 4").
// Empty when equal.
std::vector<std::string> metadata_differences(const HybridMetadata& a, const HybridMetadata& b);
bool operator==(const HybridMetadata& a, const HybridMetadata& b);

}  // namespace hybridtb
