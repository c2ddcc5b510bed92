// Every attention feature against the independent naive formula (naive_attention.cpp), on seeded
// synthetic batches with shuffled paging, NaN null blocks and CUDA-graph padding. Each case also
// checks that padding rows keep their sentinel. Run: ctest -L attention.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "attention_steps.h"

namespace hybridtb::testing {
namespace {

struct FeatureCase {
  std::string name;
  AttentionConfig config;
  std::vector<RequestSpec> requests;
  SyntheticOptions options;
};

// Chunked prefill, decodes and a fresh prefill in one batch; the long contexts give the windowed
// cases null blocks.
// Includes a chunk of 150 rows so that position-dependent terms (ALiBi, windows) are checked on
// query-row tiles after the first (the reference tiles rows by 64).
std::vector<RequestSpec> mixed_requests() {
  return {{0, 37, {}}, {70, 1, {}}, {45, 20, {}}, {130, 1, {}}, {20, 3, {}}, {10, 150, {}}};
}

std::vector<float> slopes(int64_t heads) {
  std::vector<float> s;
  for (int64_t h = 0; h < heads; ++h) s.push_back(1.0f / static_cast<float>(2 << h % 6));
  return s;
}

std::vector<float> sinks(int64_t heads) {
  std::vector<float> s;
  for (int64_t h = 0; h < heads; ++h) s.push_back(-1.0f + 0.75f * static_cast<float>(h % 4));
  return s;
}

std::vector<FeatureCase> feature_cases() {
  std::vector<FeatureCase> cases;
  auto add = [&](std::string name, AttentionConfig config, std::vector<RequestSpec> requests = mixed_requests(),
                 SyntheticOptions options = {}) {
    options.seed = 1000 + cases.size();
    options.padding_tokens = 3;
    options.padding_requests = 2;
    cases.push_back({std::move(name), config, std::move(requests), options});
  };
  const AttentionConfig base = attention_config(4, 4, 64, 16);
  auto with = [&](auto change) {
    AttentionConfig c = base;
    change(c);
    return c;
  };

  add("causal", base);
  add("window_24", with([](AttentionConfig& c) { c.sliding_window = 24; }));
  add("window_1", with([](AttentionConfig& c) { c.sliding_window = 1; }));
  add("window_40_block_32", with([](AttentionConfig& c) {
        c.sliding_window = 40;
        c.block_size = 32;
      }));
  add("multi_tile_window_100", with([](AttentionConfig& c) { c.sliding_window = 100; }),
      {{10, 150, {}}, {300, 1, {}}, {0, 65, {}}});
  add("gqa_4", with([](AttentionConfig& c) {
        c.num_heads = 8;
        c.num_kv_heads = 2;
        c.sliding_window = 24;
      }));
  add("gqa_5", with([](AttentionConfig& c) {
        c.num_heads = 5;
        c.num_kv_heads = 1;
      }));
  add("gqa_8", with([](AttentionConfig& c) {
        c.num_heads = 16;
        c.num_kv_heads = 2;
        c.sliding_window = 24;
      }));
  add("soft_cap", with([](AttentionConfig& c) {
        c.logits_soft_cap = 1.5;
        c.scale = 0.5;
      }));
  add("alibi_linear", with([](AttentionConfig& c) { c.alibi_slopes = slopes(4); }));
  add("alibi_sqrt", with([](AttentionConfig& c) {
        c.alibi_slopes = slopes(4);
        c.use_alibi_sqrt = true;
      }));
  add("sinks", with([](AttentionConfig& c) { c.sinks = sinks(4); }));
  add("alibi_linear_sinks", with([](AttentionConfig& c) {
        c.alibi_slopes = slopes(4);
        c.sinks = sinks(4);
      }));
  add("alibi_sqrt_sinks_window", with([](AttentionConfig& c) {
        c.alibi_slopes = slopes(4);
        c.use_alibi_sqrt = true;
        c.sinks = sinks(4);
        c.sliding_window = 24;
      }));
  add("fp8_e4m3_per_tensor", with([](AttentionConfig& c) {
        c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
        c.sliding_window = 24;
      }),
      mixed_requests(), SyntheticOptions{.k_scale = 0.5f, .v_scale = 0.25f});
  add("fp8_e5m2_per_tensor", with([](AttentionConfig& c) { c.kv_cache_dtype = KvCacheDtype::kFp8E5M2; }),
      mixed_requests(), SyntheticOptions{.k_scale = 0.125f, .v_scale = 2.0f});
  add("int8_per_token_head", with([](AttentionConfig& c) {
        c.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
        c.sliding_window = 24;
      }));
  add("fp8_per_token_head", with([](AttentionConfig& c) {
        c.kv_cache_dtype = KvCacheDtype::kFp8PerTokenHead;
        c.sliding_window = 24;
      }));
  add("fp8_output", base, mixed_requests(), SyntheticOptions{.output_scale = 0.002f});
  add("mm_prefix", base,
      {{0, 37, {{3, 10}, {20, 30}}}, {70, 1, {}}, {45, 20, {{40, 55}}}, {20, 3, {{5, 21}}}});
  add("mm_prefix_window_8", with([](AttentionConfig& c) { c.sliding_window = 8; }),
      {{0, 37, {{3, 10}, {20, 30}}}, {45, 20, {{40, 55}}}, {130, 1, {}}});
  add("everything", with([](AttentionConfig& c) {
        c.num_heads = 8;
        c.num_kv_heads = 2;
        c.sliding_window = 24;
        c.logits_soft_cap = 5.0;
        c.alibi_slopes = slopes(8);
        c.sinks = sinks(8);
      }),
      {{0, 37, {{3, 10}}}, {70, 1, {}}, {45, 20, {}}, {130, 1, {}}});

  std::vector<RequestSpec> encoder{{0, 37, {}}, {0, 5, {}}, {0, 67, {}}, {0, 1, {}}};
  add("encoder_only", with([](AttentionConfig& c) { c.attn_type = AttnType::kEncoderOnly; }), encoder);
  add("encoder_only_window_10_gqa_4", with([](AttentionConfig& c) {
        c.attn_type = AttnType::kEncoderOnly;
        c.sliding_window = 10;
        c.num_heads = 8;
        c.num_kv_heads = 2;
      }),
      encoder);
  // vLLM's encoder path drops soft cap, ALiBi, sinks and the output scale; so does the naive side.
  add("encoder_only_ignores_logit_features_and_output_scale", with([](AttentionConfig& c) {
        c.attn_type = AttnType::kEncoderOnly;
        c.logits_soft_cap = 1.5;
        c.alibi_slopes = slopes(4);
        c.sinks = sinks(4);
      }),
      encoder, SyntheticOptions{.output_scale = 0.002f});

  add("float32", with([](AttentionConfig& c) { c.dtype = DType::kFloat32; }));
  add("float16", with([](AttentionConfig& c) { c.dtype = DType::kFloat16; }));
  add("head_size_32", with([](AttentionConfig& c) { c.head_size = 32; }));
  add("head_size_80_block_32", with([](AttentionConfig& c) {
        c.head_size = 80;
        c.block_size = 32;
        c.scale = 1.0 / 8.0;
      }));
  add("head_size_128_window_24", with([](AttentionConfig& c) {
        c.head_size = 128;
        c.sliding_window = 24;
        c.scale = 1.0 / 11.0;
      }));
  add("head_size_256_gqa_4", with([](AttentionConfig& c) {
        c.head_size = 256;
        c.num_heads = 8;
        c.num_kv_heads = 2;
        c.scale = 1.0 / 16.0;
      }));
  return cases;
}

// gtest prints a failing case by name instead of as raw bytes.
void PrintTo(const FeatureCase& c, std::ostream* out) { *out << c.name; }

class NaiveParity : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(NaiveParity, MatchesTheNaiveFormula) {
  const FeatureCase& c = GetParam();
  const BatchFile step = synthetic_step(c.config, c.requests, c.options);
  const ReferenceRun run = run_reference(step);
  EXPECT_TRUE(matches_naive(step, run));
  EXPECT_TRUE(rows_untouched(run.output, step.batch.num_actual_tokens));
  if (c.options.output_scale && c.config.attn_type == AttnType::kDecoder) {  // must exercise the clamp
    int64_t saturated = 0;
    const int64_t elements = step.batch.num_actual_tokens * c.config.num_heads * c.config.head_size;
    for (int64_t i = 0; i < elements; ++i) saturated += std::fabs(run.output.data_as<double>()[i]) == 448.0 ? 1 : 0;
    EXPECT_GT(saturated, 0);
    EXPECT_LT(saturated, elements);
  }
}

INSTANTIATE_TEST_SUITE_P(Features, NaiveParity, ::testing::ValuesIn(feature_cases()),
                         [](const ::testing::TestParamInfo<FeatureCase>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace hybridtb::testing
