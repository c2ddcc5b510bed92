// The FLOP/byte model (hybridtb/perf_model.h) on cases small enough to count by hand.
#include <gtest/gtest.h>

#include "hybridtb/perf_model.h"

namespace hybridtb {
namespace {

AttentionConfig config(int64_t window, DType dtype = DType::kBFloat16, KvCacheDtype kv = KvCacheDtype::kAuto) {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 0.125;
  c.sliding_window = window;
  c.dtype = dtype;
  c.kv_cache_dtype = kv;
  return c;
}

// A batch description with the given (context, query) requests; only the lengths matter here.
BatchDescription batch(const std::vector<std::pair<int32_t, int32_t>>& requests, int64_t padding_tokens = 0) {
  BatchDescription b;
  std::vector<int32_t> qsl{0}, seq;
  for (const auto& [c, q] : requests) {
    qsl.push_back(qsl.back() + q);
    seq.push_back(c + q);
  }
  b.query_start_loc = IntArray::vector(qsl);
  b.seq_lens = IntArray::vector(seq);
  b.num_actual_tokens = qsl.back();
  b.slot_mapping.assign(static_cast<size_t>(qsl.back() + padding_tokens), 0);
  return b;
}

TEST(PerfModel, CausalPairsByHand) {
  // Prefill of 4, no window: 1 + 2 + 3 + 4.
  EXPECT_EQ(causal_attention_pairs(0, 4, 0), 10);
  // Prefill of 4, window 2: 1 + 2 + 2 + 2.
  EXPECT_EQ(causal_attention_pairs(0, 4, 2), 7);
  // Decode at context 10: 11 keys, or the window.
  EXPECT_EQ(causal_attention_pairs(10, 1, 0), 11);
  EXPECT_EQ(causal_attention_pairs(10, 1, 4), 4);
  EXPECT_EQ(causal_attention_pairs(10, 1, 100), 11);
  // Chunk of 3 at context 2, window 4: positions 2, 3, 4 see 3, 4, 4.
  EXPECT_EQ(causal_attention_pairs(2, 3, 4), 11);
  // perf-anchors §6.2: full prefill L = 8192, w = 4096 → w(w+1)/2 + (L − w)·w = 25,167,872.
  EXPECT_EQ(causal_attention_pairs(0, 8192, 4096), 25167872);
}

TEST(PerfModel, PairsAgreeWithBruteForce) {
  for (int64_t c : {0, 1, 5, 33}) {
    for (int64_t q : {1, 2, 7, 40}) {
      for (int64_t w : {0, 1, 3, 16, 64}) {
        int64_t pairs = 0;
        for (int64_t i = 0; i < q; ++i) {
          for (int64_t k = 0; k <= c + i; ++k) pairs += (w == 0 || c + i - k < w) ? 1 : 0;
        }
        EXPECT_EQ(causal_attention_pairs(c, q, w), pairs) << "c " << c << " q " << q << " w " << w;
      }
    }
  }
}

TEST(PerfModel, KeysReadAreTheUnionOfWindows) {
  EXPECT_EQ(causal_keys_read(100, 1, 0), 101);
  EXPECT_EQ(causal_keys_read(100, 1, 16), 16);
  EXPECT_EQ(causal_keys_read(100, 10, 16), 25);  // positions 100…109 see 85…109
  EXPECT_EQ(causal_keys_read(0, 10, 16), 10);
  EXPECT_EQ(causal_keys_read(5, 0, 16), 0);
}

TEST(PerfModel, EncoderPairs) {
  EXPECT_EQ(encoder_attention_pairs(3, 0), 9);
  // q = 4, w = 2: each token sees itself and its neighbours: 2 + 3 + 3 + 2.
  EXPECT_EQ(encoder_attention_pairs(4, 2), 10);
}

TEST(PerfModel, DecodeStepBytesAndFlopsByHand) {
  // Two decodes at context 15 (16 keys each) and 31 (32 keys), bf16, Hq 4, Hkv 2, D 32.
  const StepCost cost = attention_step_cost(config(0), batch({{15, 1}, {31, 1}}));
  EXPECT_EQ(cost.tokens, 2);
  EXPECT_EQ(cost.requests, 2);
  EXPECT_EQ(cost.attention_pairs, 16 + 32);
  EXPECT_DOUBLE_EQ(cost.attention_flops, 4.0 * 4 * 32 * 48);
  EXPECT_DOUBLE_EQ(cost.kv_read_bytes, 48.0 * 2 * 32 * 2 * 2);    // keys · Hkv · D · (K and V) · 2 B
  EXPECT_DOUBLE_EQ(cost.block_table_bytes, (1 + 2) * 4.0);         // 16 keys: 1 block; 32: 2 blocks
  EXPECT_DOUBLE_EQ(cost.qo_bytes, 2.0 * 4 * 32 * (2 + 2));          // q in, o out
  EXPECT_DOUBLE_EQ(cost.kv_write_bytes, 2.0 * (2 * 32 * 2 * (2 + 2) + 8));
  EXPECT_DOUBLE_EQ(cost.bytes(), cost.kv_read_bytes + cost.kv_write_bytes + cost.qo_bytes + cost.block_table_bytes);
  EXPECT_DOUBLE_EQ(cost.ssm_bytes, 0.0);
}

TEST(PerfModel, WindowCutsBytesAndFlops) {
  const StepCost full = attention_step_cost(config(0), batch({{1000, 1}}));
  const StepCost windowed = attention_step_cost(config(128), batch({{1000, 1}}));
  EXPECT_EQ(full.keys_read, 1001);
  EXPECT_EQ(windowed.keys_read, 128);
  EXPECT_DOUBLE_EQ(windowed.attention_flops, full.attention_flops * 128 / 1001);
}

TEST(PerfModel, QuantisedCacheAndPaddingAndFp8Output) {
  // fp8 cache: 1 byte per K/V element; per-token-head int8: plus 2 float32 scales per key and head.
  const StepCost fp8 = attention_step_cost(config(0, DType::kBFloat16, KvCacheDtype::kFp8E4M3), batch({{15, 1}}));
  EXPECT_DOUBLE_EQ(fp8.kv_read_bytes, 16.0 * 2 * 32 * 2 * 1);
  const StepCost pth =
      attention_step_cost(config(0, DType::kBFloat16, KvCacheDtype::kInt8PerTokenHead), batch({{15, 1}}));
  EXPECT_DOUBLE_EQ(pth.kv_read_bytes, 16.0 * (2 * 32 * 2 * 1 + 2 * 2 * 4));
  // Padding rows and padding requests count nothing.
  const StepCost padded = attention_step_cost(config(0), batch({{15, 1}, {0, 0}}, 3));
  const StepCost plain = attention_step_cost(config(0), batch({{15, 1}}));
  EXPECT_EQ(padded.requests, 1);
  EXPECT_DOUBLE_EQ(padded.bytes(), plain.bytes());
  // fp8 output: 1 byte per output element.
  const StepCost fp8_out = attention_step_cost(config(0), batch({{15, 1}}), true);
  EXPECT_DOUBLE_EQ(fp8_out.qo_bytes, 4.0 * 32 * (2 + 1));
}

TEST(PerfModel, SsmBranchFromTensors) {
  AttentionConfig c = config(0, DType::kFloat32);
  c.ssm_mode = "ema";
  BatchInputs inputs;
  inputs.weights["a"] = Tensor::host(DType::kFloat32, {128});                // 512 B
  inputs.ssm_state["state"] = Tensor::host(DType::kFloat32, {5, 128});       // 512 B per slot
  const StepCost cost = step_cost(c, batch({{15, 1}, {0, 3}}), inputs);
  // Weights once + hidden in and contribution out (4 tokens · 128 · 4 B each) + 2 requests · 2 · 512.
  EXPECT_DOUBLE_EQ(cost.ssm_bytes, 512.0 + 4 * 128 * (4 + 4) + 2 * 2 * 512.0);
  EXPECT_DOUBLE_EQ(cost.ssm_flops, 4.0 * 3 * 128);
  EXPECT_TRUE(cost.ssm_flops_known);

  c.ssm_mode = "mamba1";
  c.ssm_params = {{"intermediate_size", 8}, {"state_size", 2}, {"conv_kernel", 4}, {"dt_rank", 1}};
  const StepCost m = step_cost(c, batch({{0, 1}}), BatchInputs{});
  const double h = 128, i = 8, n = 2, k = 4, r = 1;
  EXPECT_DOUBLE_EQ(m.ssm_flops, 4 * i * h + 2 * i * k + 2 * (r + 2 * n) * i + 2 * i * r + 7 * i * n + 2 * i * h);

  c.ssm_mode = "some_future_mode";
  EXPECT_FALSE(step_cost(c, batch({{0, 1}}), BatchInputs{}).ssm_flops_known);
}

// A linear-attention layer: no attention, its own inputs and output, the state slots, and the
// nominal FLOPs FlashInfer counts for GDN (4·Hv·dk·dv per token) and the same for Mamba-2 (4·Hs·P·N).
TEST(PerfModel, LinearLayersByHand) {
  AttentionConfig c = config(0);
  c.layer_kind = LayerKind::kGdn;
  c.ssm_mode = "gdn";
  c.ssm_params = {{"num_k_heads", 1}, {"num_v_heads", 2}, {"head_k_dim", 4}, {"head_v_dim", 8}, {"conv_kernel", 4}};
  BatchInputs inputs;
  // conv_dim = 2·1·4 + 2·8 = 24; bf16 rows: mixed_qkv 48 B, a and b 4 B each per token.
  inputs.linear_inputs["mixed_qkv"] = Tensor::host(DType::kBFloat16, {5, 24});
  inputs.linear_inputs["a"] = Tensor::host(DType::kBFloat16, {5, 2});
  inputs.linear_inputs["b"] = Tensor::host(DType::kBFloat16, {5, 2});
  inputs.weights["A_log"] = Tensor::host(DType::kFloat32, {2});              // 8 B
  inputs.ssm_state["recurrent_state"] = Tensor::host(DType::kFloat32, {3, 2, 8, 4});  // 256 B per slot
  const StepCost cost = step_cost(c, batch({{15, 1}, {0, 3}, {0, 0}}, 1), inputs);
  EXPECT_EQ(cost.tokens, 4);
  EXPECT_EQ(cost.requests, 2);
  EXPECT_EQ(cost.attention_flops, 0.0);
  EXPECT_EQ(cost.kv_read_bytes + cost.kv_write_bytes + cost.qo_bytes + cost.block_table_bytes, 0.0);
  // Weights once + 4 tokens · (56 B in + output Hv·dv = 16 bf16 = 32 B out) + 2 requests · 2 · 256 B.
  EXPECT_DOUBLE_EQ(cost.ssm_bytes, 8.0 + 4 * (56.0 + 32.0) + 2 * 2 * 256.0);
  EXPECT_DOUBLE_EQ(cost.ssm_flops, 4 * 4.0 * 2 * 4 * 8);

  c.layer_kind = LayerKind::kMamba2;
  c.ssm_mode = "mamba2";
  c.ssm_params = {{"num_ssm_heads", 3}, {"head_dim", 5}, {"state_size", 7}, {"n_groups", 1}, {"conv_kernel", 4}};
  EXPECT_DOUBLE_EQ(step_cost(c, batch({{0, 2}}), BatchInputs{}).ssm_flops, 2 * 4.0 * 3 * 5 * 7);
}

}  // namespace
}  // namespace hybridtb
