// The one place that counts what a step costs: FLOPs and the minimum bytes it must move, for the
// benchmark counters (achieved GB/s, TFLOP/s, % of the ceilings), the results JSON and the
// roofline of notebooks/benchmark_report.ipynb. Window-aware: a key outside a query's window is
// neither read nor multiplied (full-causal counting over-reports windowed cases by up to 16×).
// Documented with worked examples in experiments/README.md ("Counting FLOPs and bytes"); checked
// on hand-countable cases by tests/bench/test_perf_model.cpp.
//
// Conventions (per request r with context c, query_len q, seq_len s = c + q, window w, 0 = none):
//   * query i (absolute position p = c + i) sees n_i = min(p + 1, w) keys (decoder: keys p−w+1 … p);
//     encoder-only: keys k of the request with |p − k| < w (all of them without a window).
//     mm_prefix_range (bidirectional multimodal spans) is not counted: causal pairs only.
//   * attention FLOPs = 4 · Hq · D · Σ n_i   (Q·Kᵀ and P·V, 2 FLOPs per multiply-add; softmax,
//     scaling, soft cap, ALiBi are not counted).
//   * bytes are the step's MINIMUM traffic, each byte once, whatever the backend does:
//       - cached K/V read: the union of the query windows, min(s, q − 1 + w) keys
//         × Hkv · D · 2 · s_kv (+ 2 · Hkv · 4 per key for per-token-head scales);
//       - block table: ⌈keys read / block_size⌉ · 4 per request;
//       - Q read and O written: tokens · Hq · D · (s_q + s_o) (s_o = 1 with an fp8 output);
//       - the KV write: tokens · Hkv · D · 2 · (s_q + s_kv) (+ scales) + the slot mapping (8/token);
//       - the SSM branch (when present): every weight once, the hidden rows in and the contribution
//         out (tokens · Hq · D · (s_q + s_o)), and per request one read and one write of its state
//         slot (the pools' bytes per slot).
//   * SSM FLOPs per token, H = Hq·D: zero 0; prefix_sum/prefix_sum_flat H; ema 3·H; mamba1
//     2·2I·H + 2·I·K + 2·(R + 2N)·I + 2·I·R + 7·I·N + 2·I·H (the projections, the conv, the scan);
//     another mode: 0 and ssm_flops_known = false.
//   * a linear-attention layer (layer_kind gdn / mamba2; linear_layer_step_cost): no attention; bytes
//     = every core weight once + the layer's input rows in and output rows out + per request one read
//     and one write of its state slot; FLOPs nominal per token, as FlashInfer counts GDN prefill
//     (the outer product into the state and the read-out, 2 FLOPs per multiply-add; gates, norms and
//     the conv not counted): gdn 4·Hv·dk·dv, mamba2 4·Hs·P·N.
// Padding rows (≥ num_actual_tokens) and padding requests (query_len 0) count nothing.
#pragma once

#include <cstdint>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"

namespace hybridtb {

// Visible (query, key) pairs of one decoder request: Σ_{i<q} min(c + i + 1, w) (w = 0: no window).
int64_t causal_attention_pairs(int64_t context_len, int64_t query_len, int64_t window);
// Distinct keys a decoder request reads: the union of its queries' windows, min(c + q, q − 1 + w).
int64_t causal_keys_read(int64_t context_len, int64_t query_len, int64_t window);
// Pairs of an encoder-only request of q tokens: Σ_p |{k < q : |p − k| < w}| (q² without a window).
int64_t encoder_attention_pairs(int64_t query_len, int64_t window);

struct StepCost {
  int64_t tokens = 0;            // num_actual_tokens
  int64_t requests = 0;          // requests with query_len > 0
  int64_t attention_pairs = 0;   // visible (query, key) pairs over the batch
  int64_t keys_read = 0;         // Σ over requests of the keys read (per KV head)
  double attention_flops = 0.0;
  double ssm_flops = 0.0;
  bool ssm_flops_known = true;   // false: an SSM mode this model has no formula for (counted 0)
  double kv_read_bytes = 0.0;    // cached K/V (and scales) read
  double kv_write_bytes = 0.0;   // K/V rows read + cache (and scales) written + slot mapping
  double qo_bytes = 0.0;         // query read + output written
  double block_table_bytes = 0.0;
  double ssm_bytes = 0.0;        // weights + hidden in + contribution out + state slots read/written

  double flops() const { return attention_flops + ssm_flops; }
  double bytes() const { return kv_read_bytes + kv_write_bytes + qo_bytes + block_table_bytes + ssm_bytes; }
  // FLOPs per byte (0 when no byte moves).
  double arithmetic_intensity() const { return bytes() > 0 ? flops() / bytes() : 0.0; }
};

// The cost of the attention part of a step (KV write, attention, output), without the SSM branch.
StepCost attention_step_cost(const AttentionConfig& config, const BatchDescription& batch, bool fp8_output = false);

// A linear-attention layer's step (above), its bytes from the actual tensors of `inputs`; the cost
// lands in ssm_flops / ssm_bytes. Error for a full-attention layer.
StepCost linear_layer_step_cost(const AttentionConfig& config, const BatchDescription& batch,
                                const BatchInputs& inputs);

// The whole step: attention_step_cost plus the SSM branch of config.ssm_mode, whose bytes come from
// the actual weight and state-pool tensors of `inputs` (so every mode is covered without a table);
// linear_layer_step_cost for a linear-attention layer.
StepCost step_cost(const AttentionConfig& config, const BatchDescription& batch, const BatchInputs& inputs);

}  // namespace hybridtb
