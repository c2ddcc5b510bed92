// BatchDescription helpers and the consistency checks of a batch against its config. Every
// failure names the field (schema path) and the constraint, so `hybridtb info` can say exactly
// what is wrong with a captured file.
#include "hybridtb/batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"

namespace hybridtb {

int64_t BatchDescription::max_query_len() const {
  int64_t m = 0;
  for (int64_t r = 0; r < num_reqs(); ++r) m = std::max(m, query_len(r));
  return m;
}

int64_t BatchDescription::max_seq_len() const {
  int64_t m = 0;
  for (int64_t r = 0; r < num_reqs(); ++r) m = std::max(m, seq_len(r));
  return m;
}

IntArray BatchDescription::num_computed_tokens() const {
  std::vector<int32_t> computed;
  for (int64_t r = 0; r < num_reqs(); ++r) computed.push_back(static_cast<int32_t>(context_len(r)));
  return IntArray::vector(std::move(computed));
}

int64_t BatchInputs::nbytes() const {
  int64_t bytes = query.nbytes() + key.nbytes() + value.nbytes() + kv_cache.nbytes() + k_scale_cache.nbytes() +
                  v_scale_cache.nbytes() + ssm_hidden.nbytes();
  for (const auto* tensors : {&ssm_state, &weights, &linear_inputs}) {
    for (const auto& [name, t] : *tensors) bytes += t.nbytes();
  }
  return bytes;
}

StepTensors BatchInputs::views() const {
  StepTensors t;
  t.query = query;
  t.key = key;
  t.value = value;
  t.kv_cache = kv_cache;
  t.k_scale_cache = k_scale_cache;
  t.v_scale_cache = v_scale_cache;
  t.k_scale = k_scale;
  t.v_scale = v_scale;
  t.output_scale = output_scale;
  t.q_scale = q_scale;
  for (const auto& [name, pool] : ssm_state) t.ssm_state[name] = pool;
  for (const auto& [name, weight] : weights) t.weights[name] = weight;
  t.ssm_hidden = ssm_hidden;
  for (const auto& [name, input] : linear_inputs) t.linear_inputs[name] = input;
  return t;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_query_start_loc(const BatchDescription& b) {
  const IntArray& qsl = b.query_start_loc;
  HYBRIDTB_CHECK(qsl.rank() == 1 && qsl.numel() >= 1, "/batch/query_start_loc must be int32 [R+1] with R >= 0, got ",
                 qsl.describe());
  HYBRIDTB_CHECK(qsl[0] == 0, "/batch/query_start_loc[0] must be 0, got ", qsl[0]);
  for (int64_t r = 0; r + 1 < qsl.numel(); ++r) {
    HYBRIDTB_CHECK(qsl[r + 1] >= qsl[r], "/batch/query_start_loc must be non-decreasing: [", r, "] = ", qsl[r],
                   " > [", r + 1, "] = ", qsl[r + 1]);
  }
  HYBRIDTB_CHECK(b.num_actual_tokens >= 0 && b.num_actual_tokens <= b.num_tokens(),
                 "/batch num_actual_tokens (", b.num_actual_tokens, ") must be in [0, T = ", b.num_tokens(),
                 "] (T = length of /batch/slot_mapping)");
  HYBRIDTB_CHECK(qsl[qsl.numel() - 1] == b.num_actual_tokens, "/batch/query_start_loc[R] (",
                 qsl[qsl.numel() - 1], ") must equal num_actual_tokens (", b.num_actual_tokens, ")");
}

void check_requests(const AttentionConfig& config, const BatchDescription& b) {
  const int64_t R = b.num_reqs();
  HYBRIDTB_CHECK(b.seq_lens.rank() == 1 && b.seq_lens.numel() == R, "/batch/seq_lens must be int32 [R = ", R,
                 "], got ", b.seq_lens.describe());
  bool seen_padding_request = false;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q = b.query_len(r);
    const int64_t s = b.seq_len(r);
    HYBRIDTB_CHECK(s >= q, "/batch/seq_lens[", r, "] = ", s, " is smaller than the request's query_len ", q,
                   " (seq_len counts context + this step's tokens)");
    if (q == 0) {
      HYBRIDTB_CHECK(s == 0, "request ", r, " has query_len 0 but /batch/seq_lens[", r, "] = ", s,
                     ": a padding request must have seq_len 0");
      seen_padding_request = true;
    } else {
      HYBRIDTB_CHECK(!seen_padding_request, "request ", r,
                     " has tokens but follows a padding request (query_len 0): padding requests must be trailing");
    }
    if (config.attn_type == AttnType::kEncoderOnly) {
      HYBRIDTB_CHECK(s == q, "/batch/seq_lens[", r, "] = ", s, " must equal query_len ", q,
                     " for attn_type encoder_only (no KV cache, no context)");
    }
  }
}

void check_paging(const AttentionConfig& config, const BatchDescription& b, int64_t num_blocks) {
  const int64_t R = b.num_reqs();
  const int64_t BS = config.block_size;
  const IntArray& table = b.block_table;
  HYBRIDTB_CHECK(table.rank() == 2 && table.size(0) == R, "/batch/block_table must be int32 [R = ", R,
                 ", max_blocks], got ", table.describe());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t needed = ceil_div(b.seq_len(r), BS);
    HYBRIDTB_CHECK(table.size(1) >= needed, "/batch/block_table has ", table.size(1), " columns but request ", r,
                   " needs ceil(seq_len ", b.seq_len(r), " / block_size ", BS, ") = ", needed);
    for (int64_t i = 0; i < needed; ++i) {
      const int32_t block = table.at(r, i);
      HYBRIDTB_CHECK(0 <= block && block < num_blocks, "/batch/block_table[", r, ", ", i, "] = ", block,
                     " is not a block of the KV cache [0, ", num_blocks, ")");
    }
  }
  // Every real token's slot must be where its request's block table puts its position: the KV write
  // and the attention read must agree, or the batch was captured inconsistently.
  for (int64_t r = 0; r < R; ++r) {
    const int64_t context = b.context_len(r);
    for (int64_t i = 0; i < b.query_len(r); ++i) {
      const int64_t t = b.query_start_loc[r] + i;
      const int64_t pos = context + i;
      const int64_t expected = int64_t{table.at(r, pos / BS)} * BS + pos % BS;
      HYBRIDTB_CHECK(b.slot_mapping[static_cast<size_t>(t)] == expected, "/batch/slot_mapping[", t, "] = ",
                     b.slot_mapping[static_cast<size_t>(t)], " but request ", r, " position ", pos,
                     " lives at block_table[", r, ", ", pos / BS, "]·", BS, " + ", pos % BS, " = ", expected);
    }
  }
}

void check_padding_rows(const BatchDescription& b) {
  for (int64_t t = b.num_actual_tokens; t < b.num_tokens(); ++t) {
    HYBRIDTB_CHECK(b.slot_mapping[static_cast<size_t>(t)] == kPadSlotId, "/batch/slot_mapping[", t, "] = ",
                   b.slot_mapping[static_cast<size_t>(t)], " is a CUDA-graph padding row (>= num_actual_tokens ",
                   b.num_actual_tokens, ") and must be ", kPadSlotId);
  }
}

void check_optional_arrays(const AttentionConfig& config, const BatchDescription& b) {
  const int64_t R = b.num_reqs();
  if (b.mm_prefix_range) {
    const IntArray& m = *b.mm_prefix_range;
    HYBRIDTB_CHECK(m.rank() == 3 && m.size(0) == R && m.size(2) == 2, "/batch/mm_prefix_range must be int32 [R = ",
                   R, ", M, 2], got ", m.describe());
    for (int32_t v : m.values) {
      HYBRIDTB_CHECK(v >= 0, "/batch/mm_prefix_range entries must be >= 0 (absolute positions), got ", v);
    }
  }
  if (b.ssm_block_table) {
    const IntArray& table = *b.ssm_block_table;
    HYBRIDTB_CHECK(table.rank() == 2 && table.size(0) == R, "/batch/ssm_block_table must be int32 [R = ", R,
                   ", max_ssm_blocks], got ", table.describe());
    // The SSM branch treats a negative state index as PAD_SLOT_ID (no state): a negative entry in
    // the table would silently drop a request's state (and is an out-of-bounds index in vLLM's
    // kernels, which only skip −1 in the metadata). Slots past the pools are checked when the step
    // runs, against the pools the mode uses.
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < table.size(1); ++c) {
        HYBRIDTB_CHECK(table.at(r, c) >= 0, "/batch/ssm_block_table[", r, ", ", c, "] = ", table.at(r, c),
                       " is negative: state slots are >= 0 (PAD_SLOT_ID belongs in the Mamba metadata, not in the "
                       "table)");
      }
    }
  }
  if (b.num_accepted_tokens) {
    const IntArray& accepted = *b.num_accepted_tokens;
    HYBRIDTB_CHECK(accepted.rank() == 1 && accepted.numel() == R, "/batch/num_accepted_tokens must be int32 [R = ", R,
                   "], got ", accepted.describe());
    // The tokens accepted in the previous step pick one of the 1 + num_speculative_tokens state
    // slots a request holds (vLLM: state_indices[num_accepted_tokens − 1]), and a speculative
    // decode verifies query_len tokens; 0 marks padding. Anything past both is garbage.
    for (int64_t r = 0; r < R; ++r) {
      const int64_t most = std::max(config.num_speculative_tokens + 1, b.query_len(r));
      HYBRIDTB_CHECK(accepted[r] >= 0 && accepted[r] <= most, "/batch/num_accepted_tokens[", r, "] = ", accepted[r],
                     " must be in [0, max(1 + num_speculative_tokens, query_len) = ", most, "]");
    }
  }
}

void check_tensor(const TensorView& view, const char* name, DType dtype, const Shape& shape, const char* dims) {
  HYBRIDTB_CHECK(!view.empty(), "missing ", name, " (required: ", to_string(dtype), " ", dims, ")");
  HYBRIDTB_CHECK(view.dtype() == dtype, name, ": dtype ", to_string(view.dtype()), " does not match the expected ",
                 to_string(dtype));
  HYBRIDTB_CHECK(view.shape() == shape, name, ": shape ", shape_to_string(view.shape()), " does not match ", dims,
                 " = ", shape_to_string(shape));
}

}  // namespace

void validate(const AttentionConfig& config, const BatchDescription& batch, int64_t num_blocks) {
  check_query_start_loc(batch);
  check_requests(config, batch);
  check_padding_rows(batch);
  check_optional_arrays(config, batch);
  if (config.attn_type == AttnType::kDecoder) check_paging(config, batch, num_blocks);
}

namespace {

// A linear-attention layer: exactly its kind's inputs, [T, width] in config.dtype, and none of the
// attention tensors (a layer holding both would leave it unclear which mixer the file describes).
void validate_linear_layer(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& in) {
  const std::string kind(to_string(config.layer_kind));
  for (const auto& [name, tensor] : {std::pair<const char*, const Tensor*>{"query", &in.query},
                                     {"key", &in.key},
                                     {"value", &in.value},
                                     {"kv_cache", &in.kv_cache},
                                     {"k_scale_cache", &in.k_scale_cache},
                                     {"v_scale_cache", &in.v_scale_cache}}) {
    HYBRIDTB_CHECK(tensor->empty(), "/inputs/", name, " is present, but layer_kind ", kind,
                   " is a linear-attention layer: it has no query, key, value or KV cache (its inputs are ",
                   "its own, see datasets/SCHEMA.md §6.4)");
  }
  HYBRIDTB_CHECK(!in.q_scale, "/inputs/q_scale is present, but layer_kind ", kind,
                 " has no query (an fp8 query belongs to a full_attention layer)");
  HYBRIDTB_CHECK(!in.output_scale, "/inputs/output_scale is present, but layer_kind ", kind,
                 " has no fp8 output (its output is the core's, in the backend's output dtype)");
  HYBRIDTB_CHECK(in.k_scale == 1.0f && in.v_scale == 1.0f, "/inputs/k_scale and v_scale must keep their default 1 in ",
                 "a layer_kind ", kind, " layer (it has no KV cache to scale; the file does not store them)");
  const LinearLayerSpec spec = linear_layer_spec(config);
  const int64_t T = batch.num_tokens();
  for (const LinearInput& input : spec.inputs) {
    const auto it = in.linear_inputs.find(input.name);
    const std::string path = "/inputs/" + input.name;
    const std::string dims = "[T, " + input.width_formula + "]";
    HYBRIDTB_CHECK(it != in.linear_inputs.end() && !it->second.empty(), "missing ", path, " (required by layer_kind ",
                   kind, ": ", to_string(config.dtype), " ", dims, " = [", T, ", ", input.width, "], ", input.meaning,
                   ")");
    check_tensor(it->second, path.c_str(), config.dtype, {T, input.width}, dims.c_str());
  }
  for (const auto& [name, tensor] : in.linear_inputs) {
    bool known = false;
    for (const LinearInput& input : spec.inputs) known = known || input.name == name;
    HYBRIDTB_CHECK(known, "/inputs/", name, " is not an input of layer_kind ", kind);
  }
  // No KV cache bounds the block ids: the model's attention layers hold it. Slots are still
  // checked against the table, since the attention layers of the same step write through them.
  validate(config, batch, std::numeric_limits<int32_t>::max());
}

}  // namespace

void validate(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& in) {
  validate(config);
  if (config.is_linear_layer()) {
    validate_linear_layer(config, batch, in);
    return;
  }
  for (const auto& [name, input] : in.linear_inputs) {
    HYBRIDTB_CHECK(input.empty(), "/inputs/", name, " is a linear-attention input, but /config layer_kind is ",
                   "full_attention (set layer_kind to the linear kind the file describes)");
  }
  const int64_t T = batch.num_tokens();
  // An fp8 query (schema 1.3) comes with its scale, and only beside a per-tensor fp8 KV cache: vLLM's
  // Triton backend applies q_descale only in that mode (KV_QUANT_MODE FP8_PER_TENSOR and Q_IS_FP8)
  // and quantises the query for no other cache.
  const bool fp8_query = !in.query.empty() && is_fp8(in.query.dtype());
  if (fp8_query) {
    HYBRIDTB_CHECK(in.q_scale.has_value(), "/inputs/query is ", to_string(in.query.dtype()),
                   " but /inputs/q_scale is missing (required with an fp8 query: float32 scalar, real query = "
                   "stored * q_scale)");
    HYBRIDTB_CHECK(config.kv_cache_dtype == KvCacheDtype::kFp8E4M3 || config.kv_cache_dtype == KvCacheDtype::kFp8E5M2,
                   "/inputs/query is ", to_string(in.query.dtype()), " but /config kv_cache_dtype is ",
                   to_string(config.kv_cache_dtype), ": an fp8 query needs a per-tensor fp8 KV cache (fp8_e4m3 or "
                   "fp8_e5m2), the only mode where vLLM applies q_descale");
    HYBRIDTB_CHECK(std::isfinite(*in.q_scale) && *in.q_scale > 0, "/inputs/q_scale must be finite and > 0, got ",
                   *in.q_scale);
  } else {
    HYBRIDTB_CHECK(!in.q_scale.has_value(), "/inputs/q_scale is present, but /inputs/query is ",
                   in.query.empty() ? std::string("missing") : std::string(to_string(in.query.dtype())),
                   ": q_scale belongs to an fp8 query (float8_e4m3fn or float8_e5m2) only");
  }
  check_tensor(in.query, "/inputs/query", fp8_query ? in.query.dtype() : config.dtype,
               {T, config.num_heads, config.head_size}, "[T, num_heads, head_size]");
  check_tensor(in.key, "/inputs/key", config.dtype, {T, config.num_kv_heads, config.head_size},
               "[T, num_kv_heads, head_size]");
  check_tensor(in.value, "/inputs/value", config.dtype, {T, config.num_kv_heads, config.head_size},
               "[T, num_kv_heads, head_size]");
  HYBRIDTB_CHECK(std::isfinite(in.k_scale) && in.k_scale > 0, "/inputs/k_scale must be finite and > 0, got ",
                 in.k_scale);
  HYBRIDTB_CHECK(std::isfinite(in.v_scale) && in.v_scale > 0, "/inputs/v_scale must be finite and > 0, got ",
                 in.v_scale);
  if (in.output_scale) {
    HYBRIDTB_CHECK(std::isfinite(*in.output_scale) && *in.output_scale > 0,
                   "/inputs/output_scale must be finite and > 0, got ", *in.output_scale);
  }
  int64_t num_blocks = 0;
  if (config.attn_type == AttnType::kDecoder || !in.kv_cache.empty()) {
    HYBRIDTB_CHECK(!in.kv_cache.empty() && in.kv_cache.view().rank() == 5,
                   "/inputs/kv_cache must be [num_blocks, 2, block_size, num_kv_heads, head_size], got ",
                   in.kv_cache.empty() ? std::string("nothing") : in.kv_cache.view().describe());
    num_blocks = in.kv_cache.size(0);
    HYBRIDTB_CHECK(num_blocks >= 1, "/inputs/kv_cache must hold at least one block");
    check_tensor(in.kv_cache, "/inputs/kv_cache", kv_storage_dtype(config.kv_cache_dtype, config.dtype),
                 {num_blocks, 2, config.block_size, config.num_kv_heads, config.head_size},
                 "[num_blocks, 2, block_size, num_kv_heads, head_size]");
  }
  if (is_per_token_head(config.kv_cache_dtype)) {
    const Shape scale_shape{num_blocks, config.block_size, config.num_kv_heads};
    check_tensor(in.k_scale_cache, "/inputs/k_scale_cache", DType::kFloat32, scale_shape,
                 "[num_blocks, block_size, num_kv_heads]");
    check_tensor(in.v_scale_cache, "/inputs/v_scale_cache", DType::kFloat32, scale_shape,
                 "[num_blocks, block_size, num_kv_heads]");
  } else {
    HYBRIDTB_CHECK(in.k_scale_cache.empty() && in.v_scale_cache.empty(),
                   "/inputs/k_scale_cache and v_scale_cache are only valid with a per-token-head kv_cache_dtype, "
                   "not ", to_string(config.kv_cache_dtype));
  }
  // A tensor-parallel rank's SSM branch reads every head's row (/inputs/ssm_hidden, schema 1.4); any
  // other layer's reads its own query.
  if (config.is_tensor_parallel_rank() && config.has_ssm_branch()) {
    check_tensor(in.ssm_hidden, "/inputs/ssm_hidden", config.dtype, {T, config.ssm_hidden_size()},
                 "[T, tp_size * num_heads * head_size] (a tensor-parallel rank's SSM input)");
  } else {
    HYBRIDTB_CHECK(in.ssm_hidden.empty(), "/inputs/ssm_hidden is present, but the file is not a tensor-parallel rank "
                   "(tp_size > 1) with an SSM branch (tp_size ", config.tp_size, ", ssm_mode '", config.ssm_mode,
                   "'): such a branch reads the query");
  }
  validate(config, batch, num_blocks);
}

}  // namespace hybridtb
