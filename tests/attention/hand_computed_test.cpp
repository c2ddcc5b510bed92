// Tiny attention cases whose answers are written down by hand: one head, D = 32, one-hot or
// small-integer vectors, so every softmax weight is a closed formula. Run: ctest -L attention.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_steps.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/paged_attention.h"

namespace hybridtb::testing {
namespace {

constexpr int64_t kD = 32;

std::vector<double> unit(int64_t index, double length = 1.0) {
  std::vector<double> v(kD, 0.0);
  v[static_cast<size_t>(index)] = length;
  return v;
}

AttentionConfig one_head() {
  AttentionConfig config = attention_config(1, 1, kD, 16, DType::kFloat32);
  config.scale = 1.0;
  return config;
}

// Decode at position `context_len`: keys j·key_step·e0 (logit j·key_step for q = e0) and values
// e_j for every position j; the new token's key/value go through the KV write.
BatchFile decode_with_unit_values(const AttentionConfig& config, int64_t context_len, double key_step) {
  BatchFile step = manual_step(config, context_len, 1);
  for (int64_t j = 0; j < context_len; ++j) {
    set_cache_row(step, 0, j, 0, unit(0, key_step * static_cast<double>(j)));
    set_cache_row(step, 1, j, 0, unit(j));
  }
  set_row(step.inputs.key, 0, 0, unit(0, key_step * static_cast<double>(context_len)));
  set_row(step.inputs.value, 0, 0, unit(context_len));
  set_row(step.inputs.query, 0, 0, unit(0));
  return step;
}

// Expects row t of the output to be Σ_j weights[j]·e_j.
void expect_weights(const Tensor& output, int64_t t, const std::vector<double>& weights) {
  const Tolerance tolerance = tolerance_for(ToleranceCase::kAttentionFloat64, static_cast<int64_t>(weights.size()) + 1, kD);
  for (int64_t c = 0; c < kD; ++c) {
    const double want = c < static_cast<int64_t>(weights.size()) ? weights[static_cast<size_t>(c)] : 0.0;
    EXPECT_TRUE(tolerance.allows(element(output, t, 0, c), want))
        << "row " << t << " dim " << c << ": " << element(output, t, 0, c) << " vs " << want;
  }
}

TEST(HandComputed, EqualLogitsAverageTheValues) {
  const BatchFile step = decode_with_unit_values(one_head(), 2, 0.0);
  expect_weights(run_reference(step).output, 0, {1.0 / 3, 1.0 / 3, 1.0 / 3});
}

TEST(HandComputed, LogitsZeroOneTwo) {
  const BatchFile step = decode_with_unit_values(one_head(), 2, 1.0);
  const double z = 1.0 + std::exp(1.0) + std::exp(2.0);
  expect_weights(run_reference(step).output, 0, {1.0 / z, std::exp(1.0) / z, std::exp(2.0) / z});
}

TEST(HandComputed, ScaleMultipliesTheDotProduct) {
  AttentionConfig config = one_head();
  config.scale = 0.5;
  const BatchFile step = decode_with_unit_values(config, 2, 2.0);  // dots 0, 2, 4 → logits 0, 1, 2
  const double z = 1.0 + std::exp(1.0) + std::exp(2.0);
  expect_weights(run_reference(step).output, 0, {1.0 / z, std::exp(1.0) / z, std::exp(2.0) / z});
}

TEST(HandComputed, SinkOfLogTwoHalvesTwoEqualWeights) {
  AttentionConfig config = one_head();
  config.sinks = std::vector<float>{std::log(2.0f)};
  const BatchFile with_sink = decode_with_unit_values(config, 1, 0.0);
  const BatchFile without = decode_with_unit_values(one_head(), 1, 0.0);
  const double sink_term = std::exp(static_cast<double>(std::log(2.0f)));  // ≈ 2, from the float sink
  expect_weights(run_reference(with_sink).output, 0, {1.0 / (2.0 + sink_term), 1.0 / (2.0 + sink_term)});
  expect_weights(run_reference(without).output, 0, {0.5, 0.5});
}

TEST(HandComputed, SinkOnASingleKeyHalvesItExactly) {
  AttentionConfig config = one_head();
  config.sinks = std::vector<float>{0.0f};
  BatchFile step = manual_step(config, 0, 1);
  set_row(step.inputs.query, 0, 0, unit(0));
  set_row(step.inputs.key, 0, 0, unit(1));  // q·k = 0
  std::vector<double> value(kD);
  for (int64_t c = 0; c < kD; ++c) value[static_cast<size_t>(c)] = static_cast<double>(2 * c - 7);
  set_row(step.inputs.value, 0, 0, value);
  const Tensor output = run_reference(step).output;
  for (int64_t c = 0; c < kD; ++c) EXPECT_EQ(element(output, 0, 0, c), value[static_cast<size_t>(c)] / 2) << c;
}

TEST(HandComputed, SoftCapOnAKnownLogit) {
  AttentionConfig config = one_head();
  config.logits_soft_cap = 2.0;
  BatchFile step = manual_step(config, 1, 1);
  set_row(step.inputs.query, 0, 0, unit(0));
  set_cache_row(step, 0, 0, 0, unit(0, 3.0));  // logit 3 → 2·tanh(1.5)
  set_cache_row(step, 1, 0, 0, unit(0));
  set_row(step.inputs.key, 0, 0, unit(1));  // logit 0 → 0
  set_row(step.inputs.value, 0, 0, unit(1));
  const double capped = std::exp(2.0 * std::tanh(1.5));
  expect_weights(run_reference(step).output, 0, {capped / (capped + 1.0), 1.0 / (capped + 1.0)});
}

TEST(HandComputed, AlibiLinearIsRelativeToTheChunkStart) {
  AttentionConfig config = one_head();
  config.alibi_slopes = std::vector<float>{0.5f};
  const BatchFile step = decode_with_unit_values(config, 2, 0.0);
  // Decode at p = 2, context_len = 2: biases 0.5·(k − 2) = −1, −0.5, 0.
  const double z = std::exp(-1.0) + std::exp(-0.5) + 1.0;
  expect_weights(run_reference(step).output, 0, {std::exp(-1.0) / z, std::exp(-0.5) / z, 1.0 / z});
}

TEST(HandComputed, AlibiSqrtUsesTheDistanceToTheQuery) {
  AttentionConfig config = one_head();
  config.alibi_slopes = std::vector<float>{0.5f};
  config.use_alibi_sqrt = true;
  const BatchFile step = decode_with_unit_values(config, 2, 0.0);
  // rel = k − p = −2, −1, 0: biases −0.5·√2, −0.5, 0.
  const double a = std::exp(-0.5 * std::sqrt(2.0)), b = std::exp(-0.5);
  const double z = a + b + 1.0;
  expect_weights(run_reference(step).output, 0, {a / z, b / z, 1.0 / z});
}

// With a sink the linear form's row constant no longer cancels: row p = 1 of a two-token prefill
// gets biases slope·(k − 0) = 0, 1 (vLLM), not slope·(k − p) = −1, 0.
TEST(HandComputed, AlibiLinearWithSinkKeepsVllmsForm) {
  AttentionConfig config = one_head();
  config.alibi_slopes = std::vector<float>{1.0f};
  config.sinks = std::vector<float>{0.0f};
  BatchFile step = manual_step(config, 0, 2);
  for (int64_t t = 0; t < 2; ++t) {
    set_row(step.inputs.query, t, 0, unit(0));
    set_row(step.inputs.key, t, 0, unit(1));  // all logits 0
    set_row(step.inputs.value, t, 0, unit(t));
  }
  const Tensor output = run_reference(step).output;
  expect_weights(output, 0, {0.5});  // one key (bias 0) against the sink e^0
  const double e = std::exp(1.0);
  expect_weights(output, 1, {1.0 / (2.0 + e), e / (2.0 + e)});
}

TEST(HandComputed, SlidingWindowKeepsExactlyWKeys) {
  AttentionConfig config = one_head();
  config.sliding_window = 2;
  const BatchFile step = decode_with_unit_values(config, 3, 0.0);  // p = 3 sees keys 2 and 3
  expect_weights(run_reference(step).output, 0, {0.0, 0.0, 0.5, 0.5});
}

BatchFile prefill_with_unit_values(const AttentionConfig& config, int64_t length) {
  BatchFile step = manual_step(config, 0, length);
  for (int64_t t = 0; t < length; ++t) {
    set_row(step.inputs.query, t, 0, unit(0));
    set_row(step.inputs.key, t, 0, unit(1));
    set_row(step.inputs.value, t, 0, unit(t));
  }
  return step;
}

TEST(HandComputed, MmPrefixRangeSeesFutureKeysInsideIt) {
  BatchFile step = prefill_with_unit_values(one_head(), 4);
  step.batch.mm_prefix_range = IntArray({1, 2, 2}, {1, 2, 0, 0});  // range [1, 2] and a (0, 0) pad
  const Tensor output = run_reference(step).output;
  const double third = 1.0 / 3;
  expect_weights(output, 0, {1.0});
  expect_weights(output, 1, {third, third, third});
  expect_weights(output, 2, {third, third, third});
  expect_weights(output, 3, {0.25, 0.25, 0.25, 0.25});
}

TEST(HandComputed, MmPrefixRangeOverridesTheWindow) {
  AttentionConfig config = one_head();
  config.sliding_window = 1;
  BatchFile step = prefill_with_unit_values(config, 4);
  step.batch.mm_prefix_range = IntArray({1, 1, 2}, {1, 2});
  const Tensor output = run_reference(step).output;
  expect_weights(output, 0, {1.0});
  expect_weights(output, 1, {0.0, 0.5, 0.5});
  expect_weights(output, 2, {0.0, 0.5, 0.5});
  expect_weights(output, 3, {0.0, 0.0, 0.0, 1.0});
}

TEST(HandComputed, EncoderOnlyIsBidirectionalWithinTheWindow) {
  AttentionConfig config = one_head();
  config.attn_type = AttnType::kEncoderOnly;
  const double third = 1.0 / 3;
  {
    const Tensor output = run_reference(prefill_with_unit_values(config, 3)).output;
    for (int64_t t = 0; t < 3; ++t) expect_weights(output, t, {third, third, third});
  }
  config.sliding_window = 2;  // |p − k| < 2
  const Tensor output = run_reference(prefill_with_unit_values(config, 3)).output;
  expect_weights(output, 0, {0.5, 0.5});
  expect_weights(output, 1, {third, third, third});
  expect_weights(output, 2, {0.0, 0.5, 0.5});
}

TEST(HandComputed, Fp8OutputIsDividedByTheScaleAndClamped) {
  BatchFile step = manual_step(one_head(), 0, 1);
  step.inputs.output_scale = 0.25f;
  set_row(step.inputs.query, 0, 0, unit(0));
  set_row(step.inputs.key, 0, 0, unit(0));
  set_row(step.inputs.value, 0, 0, {1.0, 200.0, -200.0, -0.5});  // one key: o = v
  const Tensor output = run_reference(step).output;
  EXPECT_EQ(element(output, 0, 0, 0), 4.0);
  EXPECT_EQ(element(output, 0, 0, 1), 448.0);
  EXPECT_EQ(element(output, 0, 0, 2), -448.0);
  EXPECT_EQ(element(output, 0, 0, 3), -2.0);
  // An fp8 output view gets the same values, rounded by the store.
  const Tensor fp8 = run_reference(step, DType::kFloat8E4M3).output;
  EXPECT_EQ(element(fp8, 0, 0, 1), 448.0);
  EXPECT_EQ(element(fp8, 0, 0, 3), -2.0);
}

TEST(HandComputed, PerTensorFp8CacheIsDequantisedWithItsScales) {
  AttentionConfig config = one_head();
  config.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  BatchFile step = manual_step(config, 1, 1);
  step.inputs.k_scale = 0.5f;
  step.inputs.v_scale = 0.25f;
  set_row(step.inputs.query, 0, 0, unit(0));
  set_cache_row(step, 0, 0, 0, unit(1, 4.0));  // stored 4·e1: logit 0
  set_cache_row(step, 1, 0, 0, unit(0, 4.0));  // stored 4 → value 1·e0
  set_row(step.inputs.key, 0, 0, unit(0, 2.0));    // written as 4, read back as 2: logit 2
  set_row(step.inputs.value, 0, 0, unit(1, 3.0));  // written as 12, read back as 3
  const double e2 = std::exp(2.0);
  expect_weights(run_reference(step).output, 0, {1.0 / (1.0 + e2), 3.0 * e2 / (1.0 + e2)});
}

TEST(HandComputed, PerTokenHeadCacheIsDequantisedPerSlot) {
  AttentionConfig config = one_head();
  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  BatchFile step = manual_step(config, 0, 1);
  step.inputs.k_scale_cache = Tensor::host(DType::kFloat32, {step.inputs.kv_cache.size(0), 16, 1});
  step.inputs.v_scale_cache = Tensor::host(DType::kFloat32, {step.inputs.kv_cache.size(0), 16, 1});
  set_row(step.inputs.query, 0, 0, unit(0));
  set_row(step.inputs.key, 0, 0, unit(0, 2.0));
  set_row(step.inputs.value, 0, 0, {127.0, -63.5, 0.0, 1.0});
  // absmax 127 → scale 1: stored 127, −63 (truncated), 0, 1; read back unchanged.
  expect_weights(run_reference(step).output, 0, {127.0, -63.0, 0.0, 1.0});
}

TEST(HandComputed, RowsAreWrittenInTheOutputDtype) {
  const BatchFile step = decode_with_unit_values(one_head(), 2, 1.0);
  const Tensor exact = run_reference(step).output;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Tensor rounded = run_reference(step, dtype).output;
    for (int64_t c = 0; c < kD; ++c) {
      Tensor want = Tensor::host(dtype, {1});
      store_from_double(want.data(), dtype, 0, element(exact, 0, 0, c));
      EXPECT_EQ(element(rounded, 0, 0, c), load_as_double(want.data(), dtype, 0)) << to_string(dtype) << " dim " << c;
    }
  }
}

TEST(HandComputed, EncoderOnlyWithAQuantizedCacheIsRejected) {
  for (KvCacheDtype kv : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2, KvCacheDtype::kInt8PerTokenHead,
                          KvCacheDtype::kFp8PerTokenHead}) {
    AttentionConfig config = one_head();
    config.attn_type = AttnType::kEncoderOnly;
    config.kv_cache_dtype = kv;
    BatchFile step = prefill_with_unit_values(one_head(), 3);
    step.config = config;
    step.config.dtype = DType::kFloat32;
    Tensor output = Tensor::host(DType::kFloat64, {3, 1, kD});
    try {
      reference::paged_attention(step.config, step.batch, step.inputs.views(), output);
      ADD_FAILURE() << "no error for " << to_string(kv);
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("not supported for encoder_only"), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace hybridtb::testing
