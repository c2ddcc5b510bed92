// BaseMambaAttentionMetadataBuilder (vllm/v1/attention/backends/mamba_attn.py, seed 001) on the
// host: _compute_common_metadata + _update_metadata_for_cudagraph_capture, update_block_table, and
// the helpers mamba_get_block_table_tensor and compute_causal_conv1d_metadata; plus the hybrid
// builder (seed 000) that runs it beside the Triton builder. Rules: the vLLM semantics notes, §3.
// Checked by tests/builders/mamba_metadata_test.cpp.
#include "hybridtb/spec/metadata_builders.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"

namespace hybridtb::spec {
namespace {

// compute_causal_conv1d_metadata's only BLOCK_M: tokens per conv1d program.
constexpr int64_t kConvBlockM = 8;
// The conv1d program-list buffers are at least this long (before doubling), so their size only
// changes for very large prefills (vLLM: MAX_NUM_PROGRAMS = max(1024, len(mlist)) * 2).
constexpr int64_t kMinConvPrograms = 1024;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0

// What the builder's __init__ derives from the configs.
struct MambaSettings {
  MambaCacheMode mode = MambaCacheMode::kNone;
  int64_t mamba_block_size = 0;
  int64_t num_spec_tokens = 0;
  bool use_spec_decode = false;
  int64_t reorder_batch_threshold = 1;  // _init_reorder_batch_threshold(1, use_spec_decode)
  int64_t decode_cudagraph_max_bs = 0;
  bool full_cudagraphs = false;
  const EngineRules* rules = nullptr;  // the batch's engine rules (config.engine_version)
};

MambaSettings mamba_settings(const AttentionConfig& config, const BuilderConfig& builder) {
  MambaSettings settings;
  settings.mode = config.mamba_cache_mode;
  settings.mamba_block_size = config.mamba_block_size;
  settings.num_spec_tokens = config.num_speculative_tokens;
  HYBRIDTB_CHECK(settings.num_spec_tokens >= 0, "/config/num_speculative_tokens must be >= 0, got ",
                 settings.num_spec_tokens);
  settings.use_spec_decode = settings.num_spec_tokens > 0;
  settings.reorder_batch_threshold = settings.use_spec_decode ? 1 + settings.num_spec_tokens : 1;
  settings.decode_cudagraph_max_bs = builder.decode_cudagraph_max_bs();
  settings.full_cudagraphs = has_full_cudagraphs(builder.cudagraph_mode);
  settings.rules = &engine_rules(config);
  HYBRIDTB_CHECK(settings.rules->has_mamba_cache_mode(settings.mode), "/config/mamba_cache_mode '",
                 to_string(settings.mode), "' does not exist in /config engine_version '", config.engine_version,
                 "' (its modes: ", settings.rules->mamba_cache_modes_text(), ")");
  // vLLM rejects this combination in its config ("Speculative decoding not supported with prefix
  // caching"); the builder's mode-all buffers have no room for the extra decode tokens.
  if (settings.mode == MambaCacheMode::kAll && settings.use_spec_decode) {
    throw NotSupported("/config/mamba_cache_mode 'all' does not support /config/num_speculative_tokens > 0 (vLLM: "
                       "speculative decoding is not supported with Mamba prefix caching)");
  }
  if (settings.mode != MambaCacheMode::kNone) {
    HYBRIDTB_CHECK(settings.mamba_block_size > 0, "/config/mamba_block_size must be positive in mamba_cache_mode '",
                   to_string(settings.mode), "', got ", settings.mamba_block_size);
  }
  return settings;
}

// Columns of state_indices_tensor_d: the whole table in mode all, else the block holding the
// running state plus one per speculative token.
int64_t decode_state_columns(const MambaSettings& settings, const IntArray& state_indices) {
  return settings.mode == MambaCacheMode::kAll ? state_indices.size(1) : 1 + settings.num_spec_tokens;
}

// torch.split(state_indices, [num_decodes, num_prefills]) and, outside mode all, the column cuts
// [:, :1 + num_spec] for decodes and [:, 0] for prefills.
void split_state_indices(const IntArray& state_indices, int64_t num_decodes, int64_t num_prefills,
                         const MambaSettings& settings, MambaAttentionMetadata& metadata) {
  const int64_t num_columns = state_indices.size(1);
  if (settings.mode == MambaCacheMode::kAll) {
    metadata.state_indices_tensor_d = state_indices.rows(0, num_decodes);
    metadata.state_indices_tensor_p = state_indices.rows(num_decodes, num_decodes + num_prefills);
    return;
  }
  const int64_t decode_columns = decode_state_columns(settings, state_indices);
  // Python's slice would silently keep fewer columns; vLLM's tables always have 1 + num_spec here.
  HYBRIDTB_CHECK(num_decodes + num_prefills == 0 || num_columns >= decode_columns, "the SSM state block table has ",
                 num_columns, " columns; mamba_cache_mode '", to_string(settings.mode),
                 "' with num_speculative_tokens ", settings.num_spec_tokens, " needs at least ", decode_columns);
  IntArray decode_rows = IntArray::matrix(num_decodes, decode_columns);
  for (int64_t r = 0; r < num_decodes; ++r) {
    for (int64_t c = 0; c < decode_columns; ++c) decode_rows.at(r, c) = state_indices.at(r, c);
  }
  metadata.state_indices_tensor_d = std::move(decode_rows);
  IntArray prefill_column = IntArray::filled({num_prefills}, 0);
  for (int64_t i = 0; i < num_prefills; ++i) prefill_column[i] = state_indices.at(num_decodes + i, 0);
  metadata.state_indices_tensor_p = std::move(prefill_column);
}

// mamba_get_block_table_tensor returns a 1-d table only if given one; the builder unsqueezes it.
IntArray as_matrix(const IntArray& state_indices) {
  if (state_indices.rank() == 2) return state_indices;
  return IntArray({state_indices.numel(), 1}, state_indices.values);
}

// KNOWINGLY DIFFERS from vLLM: trailing padding requests (query_len 0, seq_len 0; seq_len 0 alone
// identifies them, as seq_len >= query_len) get the engine rules' padding_state_index() (PAD_SLOT_ID
// −1; NULL_BLOCK_ID 0 from vLLM 0.33 on) in every state-index row they occupy. In vLLM
// split_decodes_and_prefills counts them as decodes (or, after a prefill, as prefills), so the
// CUDA-graph step's `[num_decodes:] = PAD_SLOT_ID / NULL_BLOCK_ID` pads nothing and their state
// index is whatever the runner left in the block table. We pad them always, with or without full
// CUDA graphs, so a padded entry can never write a live state slot.
void pad_state_indices_of_padding_requests(MambaAttentionMetadata& metadata, int32_t padded_index) {
  const auto& seq_lens = metadata.seq_lens;
  int64_t first_padding = seq_lens.numel();
  while (first_padding > 0 && seq_lens[first_padding - 1] == 0) --first_padding;
  IntArray& decode_rows = metadata.state_indices_tensor_d;
  for (int64_t r = first_padding; r < decode_rows.size(0); ++r) {
    for (int64_t c = 0; c < decode_rows.size(1); ++c) decode_rows.at(r, c) = padded_index;
  }
  if (!metadata.state_indices_tensor_p) return;
  IntArray& prefill_rows = *metadata.state_indices_tensor_p;  // request r is prefill row r − num_decodes
  const int64_t row_size = prefill_rows.size(0) == 0 ? 0 : prefill_rows.numel() / prefill_rows.size(0);
  for (int64_t r = std::max(first_padding, metadata.num_decodes); r < seq_lens.numel(); ++r) {
    const int64_t row = r - metadata.num_decodes;
    if (row >= prefill_rows.size(0)) break;
    for (int64_t c = 0; c < row_size; ++c) prefill_rows.values[static_cast<size_t>(row * row_size + c)] = padded_index;
  }
}

// _update_metadata_for_cudagraph_capture: a decode-only batch that fits a full CUDA graph is served
// from the builder's persistent buffers, cut to the padded batch size.
void update_metadata_for_cudagraph_capture(MambaAttentionMetadata& metadata, const MambaSettings& settings) {
  const int64_t num_decodes = metadata.num_decodes;
  if (!(metadata.num_prefills == 0 && num_decodes <= settings.decode_cudagraph_max_bs && settings.full_cudagraphs)) {
    return;
  }
  metadata.cudagraph_padded = 1;
  // The runner has already padded the request axis, so the padded size is the request count (and
  // since there are no prefills, it equals num_decodes: the PAD_SLOT_ID fill below covers rows
  // only when num_reqs > num_decodes, which split_decodes_and_prefills never produces).
  const int64_t padded_bs = metadata.num_reqs;

  IntArray& decode_rows = metadata.state_indices_tensor_d;
  // `state_indices_tensor_d[num_decodes:] = PAD_SLOT_ID` (NULL_BLOCK_ID from vLLM 0.33 on).
  IntArray padded_rows = IntArray::matrix(padded_bs, decode_rows.size(1), settings.rules->padding_state_index());
  for (int64_t r = 0; r < std::min(num_decodes, padded_bs); ++r) {
    for (int64_t c = 0; c < decode_rows.size(1); ++c) padded_rows.at(r, c) = decode_rows.at(r, c);
  }
  decode_rows = std::move(padded_rows);

  // vLLM asserts query_start_loc_d exists here; it is absent only for an empty batch (no decodes),
  // where there is nothing to pad.
  if (settings.use_spec_decode && metadata.query_start_loc_d) {
    const IntArray& query_start_loc_d = *metadata.query_start_loc_d;
    metadata.query_start_loc_d = query_start_loc_d.rows(0, std::min(padded_bs + 1, query_start_loc_d.numel()));
    // Padded requests accept one token: the first slot index.
    HYBRIDTB_CHECK(metadata.num_accepted_tokens.has_value(), "/batch/num_accepted_tokens is required for the ",
                   "speculative decodes of a CUDA-graph-padded batch");
    IntArray accepted = IntArray::filled({padded_bs}, 1);
    for (int64_t r = 0; r < std::min(num_decodes, padded_bs); ++r) accepted[r] = (*metadata.num_accepted_tokens)[r];
    metadata.num_accepted_tokens = std::move(accepted);
  }

  if (settings.mode == MambaCacheMode::kAll) {
    // buffer[:num_decodes] = indices[:num_decodes]; indices = buffer[:num_decode_tokens]. Without
    // speculative decoding (mode all excludes it) a decode has at most one token, so
    // num_decode_tokens <= num_decodes and the result is the leading num_decode_tokens entries:
    // trailing padding requests (no tokens) drop out.
    for (auto* indices : {&metadata.block_idx_last_scheduled_token, &metadata.block_idx_last_computed_token}) {
      HYBRIDTB_CHECK(indices->has_value(), "mamba metadata in mode all lacks its block_idx_last_* fields");
      const int64_t keep = std::min(metadata.num_decode_tokens, (*indices)->numel());
      *indices = (*indices)->rows(0, keep);
    }
  }
}

const char* state_block_table_field(const BatchDescription& batch) {
  return batch.ssm_block_table ? "/batch/ssm_block_table" : "/batch/block_table";
}

}  // namespace

IntArray mamba_get_block_table_tensor(const IntArray& block_table, const IntArray& seq_lens,
                                      int64_t mamba_block_size, int64_t num_speculative_blocks,
                                      MambaCacheMode mode) {
  // Modes all and none hand the kernels the whole table: in none the state lives in column 0 and
  // is updated in place; in all the kernels pick blocks with the block_idx_* fields.
  if (mode == MambaCacheMode::kAll || mode == MambaCacheMode::kNone) return block_table;

  // Mode align: gather the block holding the last scheduled token and one per speculative block.
  HYBRIDTB_CHECK(mamba_block_size > 0, "mamba_block_size must be positive, got ", mamba_block_size);
  HYBRIDTB_CHECK(num_speculative_blocks >= 0, "num_speculative_blocks must be >= 0, got ", num_speculative_blocks);
  HYBRIDTB_CHECK(block_table.rank() == 2, "the SSM block table must be 2-d, got ", block_table.describe());
  HYBRIDTB_CHECK(seq_lens.rank() == 1 && seq_lens.numel() == block_table.size(0), "seq_lens ",
                 seq_lens.describe(), " must have one entry per block-table row (", block_table.size(0), ")");
  const int64_t num_reqs = block_table.size(0);
  const int64_t width = 1 + num_speculative_blocks;
  IntArray gathered = IntArray::matrix(num_reqs, width);
  for (int64_t r = 0; r < num_reqs; ++r) {
    // Clamped: a padding request (seq_len 0) reads block 0 of its row.
    const int64_t start = std::max<int64_t>((seq_lens[r] - 1) / mamba_block_size, 0);
    HYBRIDTB_CHECK(start + width <= block_table.size(1), "SSM block table row ", r, " has ", block_table.size(1),
                   " columns; seq_len ", seq_lens[r], " with mamba_block_size ", mamba_block_size, " and ",
                   num_speculative_blocks, " speculative blocks needs columns up to ", start + width - 1);
    for (int64_t j = 0; j < width; ++j) gathered.at(r, j) = block_table.at(r, start + j);
  }
  return gathered;
}

CausalConv1dMetadata compute_causal_conv1d_metadata(const IntArray& query_start_loc_p) {
  HYBRIDTB_CHECK(query_start_loc_p.rank() == 1 && query_start_loc_p.numel() >= 1,
                 "query_start_loc_p must be 1-d with at least one entry, got ", query_start_loc_p.describe());
  const int64_t num_prefills = query_start_loc_p.numel() - 1;
  CausalConv1dMetadata metadata;
  metadata.block_m = kConvBlockM;
  metadata.nums = IntArray::filled({num_prefills}, 0);
  std::vector<int32_t> mlist;
  std::vector<int32_t> offsetlist;
  for (int64_t i = 0; i < num_prefills; ++i) {
    const int64_t length = query_start_loc_p[i + 1] - query_start_loc_p[i];
    HYBRIDTB_CHECK(length >= 0, "query_start_loc_p must be non-decreasing, got ", query_start_loc_p.describe());
    const int64_t programs = cdiv(length, kConvBlockM);
    metadata.nums[i] = static_cast<int32_t>(programs);
    for (int64_t chunk = 0; chunk < programs; ++chunk) {
      mlist.push_back(static_cast<int32_t>(i));
      offsetlist.push_back(static_cast<int32_t>(chunk));
    }
  }
  metadata.tot = static_cast<int64_t>(mlist.size());
  const int64_t max_num_programs = std::max(kMinConvPrograms, metadata.tot) * 2;
  metadata.batch_ptr = IntArray::filled({max_num_programs}, kPadSlotId);
  metadata.token_chunk_offset_ptr = IntArray::filled({max_num_programs}, kPadSlotId);
  std::copy(mlist.begin(), mlist.end(), metadata.batch_ptr.values.begin());
  std::copy(offsetlist.begin(), offsetlist.end(), metadata.token_chunk_offset_ptr.values.begin());
  metadata.mlist = IntArray::vector(std::move(mlist));
  metadata.offsetlist = IntArray::vector(std::move(offsetlist));
  return metadata;
}

// Inputs, as the hybrid builder feeds them (one CommonAttentionMetadata for both builders):
// - the state table is batch.state_block_table() (ssm_block_table, else block_table);
// - the MambaSpec block size is config.mamba_block_size and its num_speculative_blocks is taken as
//   num_speculative_tokens (vLLM's MambaSpec; the hybrid seed's dummy spec has 0);
// - num_accepted_tokens comes from the batch (vLLM's runner passes it as a build() argument).
MambaAttentionMetadata build_mamba_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                            const BatchDescription& batch) {
  const MambaSettings settings = mamba_settings(config, builder);
  HYBRIDTB_CHECK(batch.query_start_loc.rank() == 1 && batch.query_start_loc.numel() >= 1,
                 "/batch/query_start_loc must be 1-d with at least one entry, got ", batch.query_start_loc.describe());
  const int64_t num_reqs = batch.num_reqs();
  HYBRIDTB_CHECK(batch.seq_lens.rank() == 1 && batch.seq_lens.numel() == num_reqs, "/batch/seq_lens must be [",
                 num_reqs, "], got ", batch.seq_lens.describe());
  // An empty batch may come with a shapeless table; it has no rows either way.
  const IntArray table =
      num_reqs == 0 && batch.state_block_table().rank() != 2 ? IntArray::matrix(0, 0) : batch.state_block_table();
  HYBRIDTB_CHECK(table.rank() == 2 && table.size(0) == num_reqs, state_block_table_field(batch), " must be [",
                 num_reqs, ", max_blocks], got ", table.describe());
  if (batch.num_accepted_tokens) {
    HYBRIDTB_CHECK(batch.num_accepted_tokens->rank() == 1 && batch.num_accepted_tokens->numel() == num_reqs,
                   "/batch/num_accepted_tokens must be [", num_reqs, "], got ", batch.num_accepted_tokens->describe());
  }
  IntArray num_computed_tokens = IntArray::filled({num_reqs}, 0);
  for (int64_t r = 0; r < num_reqs; ++r) {
    HYBRIDTB_CHECK(batch.context_len(r) >= 0, "/batch/seq_lens[", r, "] = ", batch.seq_len(r),
                   " is shorter than the request's query_len ", batch.query_len(r));
    num_computed_tokens[r] = static_cast<int32_t>(batch.context_len(r));
  }

  // Multi-token queries are decodes only when the runner passes num_accepted_tokens (speculative
  // decoding); otherwise a short prefill chunk must not be taken for a decode.
  const int64_t decode_threshold = batch.num_accepted_tokens ? settings.reorder_batch_threshold : 1;
  // vLLM 0.33 splits with treat_short_extends_as_decodes = False: a request without context is a
  // prefill even with one token (older releases count it as a decode).
  const bool short_extends_are_decodes = settings.rules->short_extends_are_decodes();
  check_decodes_first(batch, decode_threshold, short_extends_are_decodes);
  const DecodePrefillSplit split =
      split_decodes_and_prefills(batch, decode_threshold, /*require_uniform=*/false, short_extends_are_decodes);

  MambaAttentionMetadata metadata;
  metadata.num_prefills = split.num_prefills;
  metadata.num_prefill_tokens = split.num_prefill_tokens;
  metadata.num_decodes = split.num_decodes;
  metadata.num_decode_tokens = split.num_decode_tokens;
  metadata.num_reqs = num_reqs;
  metadata.seq_lens = batch.seq_lens;

  IntArray state_indices;
  IntArray block_idx_first_scheduled_token;
  if (settings.mode == MambaCacheMode::kAll) {
    // _compute_prefix_caching_block_indices (cdiv elementwise; nc = num_computed_tokens):
    const int64_t block_size = settings.mamba_block_size;
    IntArray last_computed = IntArray::filled({num_reqs}, 0);
    IntArray first_scheduled = IntArray::filled({num_reqs}, 0);
    IntArray last_scheduled = IntArray::filled({num_reqs}, 0);
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t computed = num_computed_tokens[r];
      // The block holding the initial state; clamped since a fresh request (nc 0) gives -1.
      last_computed[r] = static_cast<int32_t>(std::max<int64_t>(cdiv(computed, block_size) - 1, 0));
      // <= the block of the first scheduled token; never negative (nc + 1 >= 1).
      first_scheduled[r] = static_cast<int32_t>(cdiv(computed + 1, block_size) - 1);
      // The block receiving the final state; clamped for a padding request (seq_len 0).
      last_scheduled[r] = static_cast<int32_t>(std::max<int64_t>(cdiv(batch.seq_len(r), block_size) - 1, 0));
    }
    metadata.block_idx_last_computed_token = std::move(last_computed);
    metadata.block_idx_last_scheduled_token = std::move(last_scheduled);
    block_idx_first_scheduled_token = std::move(first_scheduled);
    state_indices = table;
  } else {
    state_indices = as_matrix(mamba_get_block_table_tensor(table, batch.seq_lens, settings.mamba_block_size,
                                                           settings.num_spec_tokens, settings.mode));
  }
  split_state_indices(state_indices, split.num_decodes, split.num_prefills, settings, metadata);

  // Passed through uncut unless there are speculative decodes to cut it for (as the seed does).
  metadata.num_accepted_tokens = batch.num_accepted_tokens;
  if (split.num_decodes > 0 && settings.use_spec_decode) {
    HYBRIDTB_CHECK(batch.num_accepted_tokens.has_value(), "/batch/num_accepted_tokens is required: speculative ",
                   "decoding is on (num_speculative_tokens ", settings.num_spec_tokens, ") and the batch has ",
                   split.num_decodes, " decodes");
    metadata.query_start_loc_d = batch.query_start_loc.rows(0, split.num_decodes + 1);
    metadata.num_accepted_tokens = batch.num_accepted_tokens->rows(0, split.num_decodes);
  }

  if (split.num_prefills > 0) {
    // Prefill rows are [num_decodes, num_reqs); their token offsets are rebased to the first
    // prefill token, where the mixers' prefill half of the token axis starts.
    IntArray query_start_loc_p = batch.query_start_loc.rows(split.num_decodes, num_reqs + 1);
    for (auto& start : query_start_loc_p.values) start = static_cast<int32_t>(start - split.num_decode_tokens);
    IntArray has_initial_states = IntArray::filled({split.num_prefills}, 0);
    for (int64_t i = 0; i < split.num_prefills; ++i) {
      has_initial_states[i] = num_computed_tokens[split.num_decodes + i] > 0 ? 1 : 0;
    }
    metadata.causal_conv1d = compute_causal_conv1d_metadata(query_start_loc_p);
    metadata.query_start_loc_p = std::move(query_start_loc_p);
    metadata.has_initial_states_p = std::move(has_initial_states);
    if (settings.mode == MambaCacheMode::kAll) {
      metadata.num_computed_tokens_p = num_computed_tokens.rows(split.num_decodes, num_reqs);
      metadata.block_idx_first_scheduled_token_p = block_idx_first_scheduled_token.rows(split.num_decodes, num_reqs);
    }
  }

  pad_state_indices_of_padding_requests(metadata, settings.rules->padding_state_index());
  update_metadata_for_cudagraph_capture(metadata, settings);
  return metadata;
}

HybridMetadata build_hybrid_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                     const BatchDescription& batch) {
  HybridMetadata metadata;
  metadata.attention = build_triton_metadata(config, builder, batch);
  // Encoder-only layers keep no recurrent state and have no block table to index one with.
  if (config.attn_type == AttnType::kDecoder) metadata.mamba = build_mamba_metadata(config, builder, batch);
  return metadata;
}

// vLLM disables update_block_table under speculative decoding (supports_update_block_table); here
// it still works, since re-applying the CUDA-graph step to already padded fields changes nothing.
MambaAttentionMetadata update_block_table(const AttentionConfig& config, const BuilderConfig& builder,
                                          const MambaAttentionMetadata& metadata, const IntArray& block_table) {
  const MambaSettings settings = mamba_settings(config, builder);
  const int64_t num_reqs = metadata.num_prefills + metadata.num_decodes;
  HYBRIDTB_CHECK(block_table.rank() == 2, "update_block_table: the block table must be 2-d, got ",
                 block_table.describe());
  HYBRIDTB_CHECK(block_table.size(0) == num_reqs, "update_block_table: mismatch in number of requests: the metadata has ",
                 num_reqs, ", the new block table has ", block_table.size(0), " rows");
  const IntArray state_indices = as_matrix(mamba_get_block_table_tensor(
      block_table, metadata.seq_lens, settings.mamba_block_size, settings.num_spec_tokens, settings.mode));

  MambaAttentionMetadata updated = metadata;
  split_state_indices(state_indices, metadata.num_decodes, metadata.num_prefills, settings, updated);
  pad_state_indices_of_padding_requests(updated, settings.rules->padding_state_index());
  update_metadata_for_cudagraph_capture(updated, settings);
  return updated;
}

}  // namespace hybridtb::spec
