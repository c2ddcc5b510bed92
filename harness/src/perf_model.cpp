// FLOP and byte counting of a step (see perf_model.h for the conventions).
#include "hybridtb/perf_model.h"

#include <algorithm>

#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb {

int64_t causal_attention_pairs(int64_t context_len, int64_t query_len, int64_t window) {
  HYBRIDTB_CHECK(context_len >= 0 && query_len >= 0 && window >= 0, "causal_attention_pairs: negative argument (c ",
                 context_len, ", q ", query_len, ", w ", window, ")");
  const int64_t first = context_len + 1;  // keys seen by query 0 without a window
  if (window == 0) return query_len * first + query_len * (query_len - 1) / 2;
  // Queries 0 … m−1 see c + i + 1 ≤ w keys; the rest see exactly w.
  const int64_t m = std::clamp<int64_t>(window - context_len, 0, query_len);
  return m * first + m * (m - 1) / 2 + (query_len - m) * window;
}

int64_t causal_keys_read(int64_t context_len, int64_t query_len, int64_t window) {
  if (query_len == 0) return 0;
  // Every key from the first one the first query (position context_len) sees to the last query.
  return context_len + query_len - spec::window_first_key(window, context_len);
}

int64_t encoder_attention_pairs(int64_t query_len, int64_t window) {
  if (window == 0) return query_len * query_len;
  int64_t pairs = 0;
  for (int64_t p = 0; p < query_len; ++p) {
    pairs += std::min(query_len, spec::window_key_end(true, window, query_len, p)) - spec::window_first_key(window, p);
  }
  return pairs;
}

StepCost attention_step_cost(const AttentionConfig& config, const BatchDescription& batch, bool fp8_output) {
  StepCost cost;
  const bool encoder = config.attn_type == AttnType::kEncoderOnly;
  const double hq = static_cast<double>(config.num_heads);
  const double hkv = static_cast<double>(config.num_kv_heads);
  const double d = static_cast<double>(config.head_size);
  const double s_q = static_cast<double>(element_size(config.dtype));
  const double s_o = fp8_output ? 1.0 : s_q;
  const double s_kv = static_cast<double>(element_size(kv_storage_dtype(config.kv_cache_dtype, config.dtype)));
  const double scale_bytes = is_per_token_head(config.kv_cache_dtype) ? 2.0 * hkv * 4.0 : 0.0;  // per token

  for (int64_t r = 0; r < batch.num_reqs(); ++r) {
    const int64_t q = batch.query_len(r);
    if (q <= 0) continue;  // a padding request
    ++cost.requests;
    const int64_t c = batch.context_len(r);
    if (encoder) {
      // No cache: the whole request's K/V rows are read from key/value, once.
      cost.attention_pairs += encoder_attention_pairs(q, config.sliding_window);
      cost.keys_read += q;
      cost.kv_read_bytes += static_cast<double>(q) * hkv * d * 2.0 * s_q;
    } else {
      const int64_t keys = causal_keys_read(c, q, config.sliding_window);
      cost.attention_pairs += causal_attention_pairs(c, q, config.sliding_window);
      cost.keys_read += keys;
      cost.kv_read_bytes += static_cast<double>(keys) * (hkv * d * 2.0 * s_kv + scale_bytes);
      cost.block_table_bytes += static_cast<double>((keys + config.block_size - 1) / config.block_size) * 4.0;
    }
  }
  cost.tokens = batch.num_actual_tokens;
  const double t = static_cast<double>(cost.tokens);
  cost.attention_flops = 4.0 * hq * d * static_cast<double>(cost.attention_pairs);
  cost.qo_bytes = t * hq * d * (s_q + s_o);
  if (!encoder) cost.kv_write_bytes = t * (hkv * d * 2.0 * (s_q + s_kv) + scale_bytes + 8.0);
  return cost;
}

namespace {

double param_of(const AttentionConfig& config, const char* name) {
  const auto it = config.ssm_params.find(name);
  HYBRIDTB_CHECK(it != config.ssm_params.end(), "perf model: ", config.ssm_mode, " needs /config/ssm ", name);
  return static_cast<double>(it->second);
}

// FLOPs of the SSM branch for `tokens` tokens; known = false for a mode without a formula.
double ssm_flops(const AttentionConfig& config, double tokens, bool& known) {
  known = true;
  const double h = static_cast<double>(config.num_heads * config.head_size);
  const std::string& mode = config.ssm_mode;
  if (mode == "none" || mode == "zero") return 0.0;
  if (mode == "prefix_sum" || mode == "prefix_sum_flat") return tokens * h;
  if (mode == "ema") return tokens * 3.0 * h;
  if (mode == "mamba1") {
    const double i = param_of(config, "intermediate_size"), n = param_of(config, "state_size"),
                 k = param_of(config, "conv_kernel"), r = param_of(config, "dt_rank");
    const double per_token = 2.0 * 2.0 * i * h  // in_proj
                             + 2.0 * i * k      // causal conv1d
                             + 2.0 * (r + 2.0 * n) * i  // x_proj
                             + 2.0 * i * r              // dt_proj
                             + 7.0 * i * n              // selective scan: ΔA, exp, h update, (Δc)B, h·C
                             + 2.0 * i * h;             // out_proj
    return tokens * per_token;
  }
  known = false;
  return 0.0;
}


// A linear-attention layer's core per token, nominal (FlashInfer's GDN count: the outer product
// into the state and the read-out, 2 FLOPs per multiply-add each; gates, norms and the conv not
// counted): gdn 4·Hv·dk·dv, mamba2 4·Hs·P·N (Δ·x ⊗ B into the state, y = S·C).
double linear_core_flops_per_token(const AttentionConfig& config) {
  if (config.layer_kind == LayerKind::kGdn) {
    return 4.0 * param_of(config, "num_v_heads") * param_of(config, "head_k_dim") * param_of(config, "head_v_dim");
  }
  return 4.0 * param_of(config, "num_ssm_heads") * param_of(config, "head_dim") * param_of(config, "state_size");
}

// Bytes of one slot over every state pool of `inputs`.
double bytes_per_slot(const BatchInputs& inputs) {
  double per_slot = 0.0;
  for (const auto& [name, pool] : inputs.ssm_state) {
    if (pool.size(0) > 0) per_slot += static_cast<double>(pool.nbytes()) / static_cast<double>(pool.size(0));
  }
  return per_slot;
}

}  // namespace

StepCost linear_layer_step_cost(const AttentionConfig& config, const BatchDescription& batch,
                                const BatchInputs& inputs) {
  HYBRIDTB_CHECK(config.is_linear_layer(), "linear_layer_step_cost: layer_kind full_attention is not a linear layer");
  StepCost cost;
  cost.tokens = batch.num_actual_tokens;
  for (int64_t r = 0; r < batch.num_reqs(); ++r) cost.requests += batch.query_len(r) > 0 ? 1 : 0;
  const double t = static_cast<double>(cost.tokens);
  double weights = 0.0;
  for (const auto& [name, w] : inputs.weights) weights += static_cast<double>(w.nbytes());
  double row_in = 0.0;  // bytes of one token's inputs
  for (const auto& [name, input] : inputs.linear_inputs) {
    if (input.size(0) > 0) row_in += static_cast<double>(input.nbytes()) / static_cast<double>(input.size(0));
  }
  const double row_out = static_cast<double>(linear_layer_spec(config).output_width * element_size(config.dtype));
  cost.ssm_bytes = weights + t * (row_in + row_out) + static_cast<double>(cost.requests) * 2.0 * bytes_per_slot(inputs);
  cost.ssm_flops = t * linear_core_flops_per_token(config);
  return cost;
}

StepCost step_cost(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& inputs) {
  if (config.is_linear_layer()) return linear_layer_step_cost(config, batch, inputs);
  StepCost cost = attention_step_cost(config, batch, inputs.output_scale.has_value());
  if (!config.has_ssm_branch()) return cost;
  const double t = static_cast<double>(cost.tokens);
  const double h = static_cast<double>(config.num_heads * config.head_size);
  const double s_q = static_cast<double>(element_size(config.dtype));
  const double s_o = inputs.output_scale ? 1.0 : s_q;
  double weights = 0.0;
  for (const auto& [name, w] : inputs.weights) weights += static_cast<double>(w.nbytes());
  cost.ssm_bytes = weights + t * h * (s_q + s_o) + static_cast<double>(cost.requests) * 2.0 * bytes_per_slot(inputs);
  cost.ssm_flops = ssm_flops(config, t, cost.ssm_flops_known);
  return cost;
}

}  // namespace hybridtb
