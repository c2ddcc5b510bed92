// One step of a serving engine for one attention layer: the batch description (vLLM's
// CommonAttentionMetadata), the layer's input tensors and the KV cache before the step.
//
// Conventions (vLLM's): requests are the rows of query_start_loc; request r owns query tokens
// [query_start_loc[r], query_start_loc[r+1]); its context length is seq_lens[r] − query_len, so its
// query row i sits at absolute position context_len + i. Token rows at or past num_actual_tokens
// are CUDA-graph padding (slot_mapping −1) and are never written. Trailing requests with
// query_len 0 and seq_len 0 are padding requests (vLLM pads decode batches to a captured size so).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/config.h"
#include "hybridtb/int_array.h"
#include "hybridtb/progress.h"
#include "hybridtb/tensor.h"

namespace hybridtb {

struct BatchDescription {
  IntArray query_start_loc;       // int32 [R+1], non-decreasing, starts at 0, ends at num_actual_tokens
  IntArray seq_lens;              // int32 [R], context + this step's tokens
  IntArray block_table;           // int32 [R, max_blocks], physical KV block ids (may repeat/alias)
  std::vector<int64_t> slot_mapping;  // [T] block·block_size + offset per token; −1 = padding
  int64_t num_actual_tokens = 0;  // tokens excluding CUDA-graph padding (≤ T)
  std::optional<IntArray> mm_prefix_range;    // int32 [R, M, 2] inclusive absolute ranges; (0,0) = none
  std::optional<IntArray> ssm_block_table;    // int32 [R, max_ssm_blocks]; absent: use block_table
  std::optional<IntArray> num_accepted_tokens;  // int32 [R] (speculative decoding)

  int64_t num_reqs() const { return query_start_loc.numel() - 1; }
  int64_t num_tokens() const { return static_cast<int64_t>(slot_mapping.size()); }  // T, padded
  int64_t query_len(int64_t r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  int64_t seq_len(int64_t r) const { return seq_lens[r]; }
  int64_t context_len(int64_t r) const { return seq_len(r) - query_len(r); }
  int64_t max_query_len() const;  // 0 for an empty batch
  int64_t max_seq_len() const;
  // num_computed_tokens per request (CommonAttentionMetadata.compute_num_computed_tokens()).
  IntArray num_computed_tokens() const;
  // The table the SSM branch indexes: ssm_block_table if present, else block_table.
  const IntArray& state_block_table() const { return ssm_block_table ? *ssm_block_table : block_table; }

  bool operator==(const BatchDescription&) const = default;
};

// The layer's tensors for one step, as views on the memory of the backend that runs them.
struct StepTensors {
  TensorView query;          // [T, Hq, D] in config.dtype, or fp8 (float8_e4m3fn/e5m2) with q_scale
  TensorView key;            // [T, Hkv, D] in config.dtype (decoder: written into the cache)
  TensorView value;          // [T, Hkv, D] in config.dtype
  TensorView kv_cache;       // [NB, 2, BS, Hkv, D] in kv_storage_dtype(); updated by the KV write
  TensorView k_scale_cache;  // [NB, BS, Hkv] float32, per-token-head modes only (updated too)
  TensorView v_scale_cache;  // [NB, BS, Hkv] float32, per-token-head modes only
  float k_scale = 1.0f;      // per-tensor fp8 scales (dequantised value = stored · scale)
  float v_scale = 1.0f;
  std::optional<float> output_scale;  // fp8 output: stored output = clamp(o / output_scale)
  // fp8 query (schema 1.3): real query = stored · q_scale (vLLM's q_descale); set iff query is fp8.
  std::optional<float> q_scale;
  // SSM branch, by name (each mode documents its names; reference/ssm/README.md):
  std::map<std::string, TensorView> ssm_state;  // state pools [num_slots, ...]; updated in place
  std::map<std::string, TensorView> weights;    // the mode's weights (read only)
  // The hidden states the SSM branch reads, [T, tp_size·Hq·D] in config.dtype, when they are not the
  // query viewed flat: a tensor-parallel rank's branch reads every head's row (vLLM replicates the
  // hidden states on every rank), its query only its own heads. Empty: the query viewed flat.
  TensorView ssm_hidden;
  // A linear-attention layer's inputs (layer_kind gdn/mamba2; hybridtb/linear_layer.h), each
  // [T, width] in config.dtype. Such a layer has no query, key, value or KV cache (empty views).
  std::map<std::string, TensorView> linear_inputs;
  // Where a backend may report how far a long call got (progress.h); null: nobody is listening.
  ProgressSink* progress = nullptr;
};

// Host-owned inputs as read from (or written to) a batch file.
struct BatchInputs {
  Tensor query, key, value;
  Tensor kv_cache;                      // the cache before this step's KV write
  Tensor k_scale_cache, v_scale_cache;  // empty unless the KV cache dtype is per-token-head
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  std::optional<float> output_scale;
  std::optional<float> q_scale;  // /inputs/q_scale (1.3): present iff the query is stored in fp8
  std::map<std::string, Tensor> ssm_state;  // /inputs/ssm/<name>: pools before this step
  std::map<std::string, Tensor> weights;    // /weights/<name>
  Tensor ssm_hidden;  // /inputs/ssm_hidden (1.4): a tensor-parallel rank's SSM input (StepTensors)
  std::map<std::string, Tensor> linear_inputs;  // /inputs/<name> of a linear-attention layer

  StepTensors views() const;
  int64_t nbytes() const;  // bytes of every tensor above (summaries, progress totals)
};

// Throws Error naming the field unless the batch description is internally consistent and fits
// the config: monotonic query_start_loc, seq_len ≥ query_len, block ids and slots in range,
// padding rows/requests well formed, decode-first order is NOT required here (the Mamba builder
// checks it).
void validate(const AttentionConfig& config, const BatchDescription& batch, int64_t num_blocks);
// Also checks every tensor's dtype and shape against the config and the batch. A linear-attention
// layer (config.is_linear_layer()) has its linear inputs instead of query, key, value and the KV cache
// (present ones are an error), and its block ids are not bounded by a cache it does not hold.
void validate(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& inputs);

}  // namespace hybridtb
