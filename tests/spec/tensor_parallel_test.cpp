// Tensor parallelism of an attention layer (hybridtb/spec/tensor_parallel.h) against vLLM's rules:
// the head ranges of each rank (QKVParallelLinear's split and its kv-head replication when
// num_kv_heads < tp_size), every rejected input naming its field, the cut of a step (each element
// of a rank's tensors is the unsharded tensor's element at the rank's head), and the metamorphic
// relation that matters: the reference run of every rank's step, joined along the head axis, is the
// reference run of the unsharded step, bit for bit (output and KV cache after the write).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attention_steps.h"
#include "hybridtb/backend.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/metadata.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;
using spec::TpShard;

// A plain layer of these heads (tests/attention's attention_config: scale 1/sqrt(D), no features).
AttentionConfig heads_config(int64_t num_heads, int64_t num_kv_heads, int64_t head_size = 32, int64_t block_size = 16) {
  return attention_config(num_heads, num_kv_heads, head_size, block_size);
}

std::vector<float> ramp(int64_t n, float first, float step) {
  std::vector<float> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(first + step * static_cast<float>(i));
  return values;
}

// --- head ranges ----------------------------------------------------------------------------------

struct ExpectedShard {
  int64_t q_begin, q_end, kv_begin, kv_end, replicas;
};

void expect_shard(const AttentionConfig& config, int64_t tp, int64_t rank, const ExpectedShard& want) {
  const TpShard shard = spec::tp_shard(config, tp, rank);
  SCOPED_TRACE(::testing::Message() << "Hq " << config.num_heads << " Hkv " << config.num_kv_heads << " tp " << tp
                                    << " rank " << rank);
  EXPECT_EQ(shard.tp_size, tp);
  EXPECT_EQ(shard.tp_rank, rank);
  EXPECT_EQ(shard.q_head_begin, want.q_begin);
  EXPECT_EQ(shard.q_head_end, want.q_end);
  EXPECT_EQ(shard.kv_head_begin, want.kv_begin);
  EXPECT_EQ(shard.kv_head_end, want.kv_end);
  EXPECT_EQ(shard.num_kv_head_replicas, want.replicas);
}

TEST(TensorParallelShard, Hq32Hkv8SplitsBothHeadKindsUpToTp8) {
  const AttentionConfig config = heads_config(32, 8);
  expect_shard(config, 1, 0, {0, 32, 0, 8, 1});
  expect_shard(config, 2, 0, {0, 16, 0, 4, 1});
  expect_shard(config, 2, 1, {16, 32, 4, 8, 1});
  expect_shard(config, 4, 0, {0, 8, 0, 2, 1});
  expect_shard(config, 4, 2, {16, 24, 4, 6, 1});
  expect_shard(config, 4, 3, {24, 32, 6, 8, 1});
  expect_shard(config, 8, 0, {0, 4, 0, 1, 1});
  expect_shard(config, 8, 5, {20, 24, 5, 6, 1});
  expect_shard(config, 8, 7, {28, 32, 7, 8, 1});
}

TEST(TensorParallelShard, Hq32Hkv8ReplicatesKvHeadsAtTp16And32) {
  const AttentionConfig config = heads_config(32, 8);
  // tp 16: two query heads and one kv head per rank; ranks 2k and 2k+1 share kv head k.
  expect_shard(config, 16, 0, {0, 2, 0, 1, 2});
  expect_shard(config, 16, 1, {2, 4, 0, 1, 2});
  expect_shard(config, 16, 2, {4, 6, 1, 2, 2});
  expect_shard(config, 16, 9, {18, 20, 4, 5, 2});
  expect_shard(config, 16, 15, {30, 32, 7, 8, 2});
  // tp 32: one query head per rank; ranks 4k … 4k+3 share kv head k.
  expect_shard(config, 32, 0, {0, 1, 0, 1, 4});
  expect_shard(config, 32, 3, {3, 4, 0, 1, 4});
  expect_shard(config, 32, 4, {4, 5, 1, 2, 4});
  expect_shard(config, 32, 31, {31, 32, 7, 8, 4});
}

TEST(TensorParallelShard, Hq8Hkv1ReplicatesTheOneKvHeadOnEveryRank) {
  const AttentionConfig config = heads_config(8, 1);
  for (int64_t r = 0; r < 4; ++r) expect_shard(config, 4, r, {2 * r, 2 * r + 2, 0, 1, 4});
}

// For every valid split of several layers: the ranks' query ranges partition the heads in order,
// every kv head is held by tp / Hkv ranks when replicated (else by one), and the rank's own GQA rule
// (local head i reads local kv head i / (Hq_r / Hkv_r)) picks the kv head that query head reads in
// the unsharded layer (h / (Hq / Hkv)).
TEST(TensorParallelShard, RanksPartitionQueryHeadsAndKeepEachQueryHeadsKvHead) {
  for (const auto& [hq, hkv] : std::vector<std::pair<int64_t, int64_t>>{{32, 8}, {8, 1}, {16, 16}, {12, 4}, {64, 2}}) {
    const AttentionConfig config = heads_config(hq, hkv);
    for (int64_t tp : {1, 2, 4, 8, 16, 32, 64}) {
      if (hq % tp != 0 || (hkv >= tp ? hkv % tp : tp % hkv) != 0) continue;
      SCOPED_TRACE(::testing::Message() << "Hq " << hq << " Hkv " << hkv << " tp " << tp);
      std::vector<int64_t> kv_holders(static_cast<size_t>(hkv), 0);
      int64_t next_q = 0;
      for (int64_t r = 0; r < tp; ++r) {
        const TpShard shard = spec::tp_shard(config, tp, r);
        const AttentionConfig rank = spec::shard_config(config, shard);
        EXPECT_EQ(shard.q_head_begin, next_q);
        next_q = shard.q_head_end;
        EXPECT_EQ(rank.num_heads, hq / tp);
        EXPECT_EQ(rank.num_kv_heads, std::max<int64_t>(1, hkv / tp));
        for (int64_t kv = shard.kv_head_begin; kv < shard.kv_head_end; ++kv) ++kv_holders[static_cast<size_t>(kv)];
        for (int64_t i = 0; i < rank.num_heads; ++i) {
          const int64_t h = shard.q_head_begin + i;
          EXPECT_EQ(shard.kv_head_begin + i / rank.num_queries_per_kv(), h / (hq / hkv)) << "query head " << h;
        }
      }
      EXPECT_EQ(next_q, hq);
      for (int64_t kv = 0; kv < hkv; ++kv) {
        EXPECT_EQ(kv_holders[static_cast<size_t>(kv)], hkv < tp ? tp / hkv : 1) << "kv head " << kv;
      }
    }
  }
}

TEST(TensorParallelShard, RankConfigSlicesAlibiAndSinksPerQueryHead) {
  AttentionConfig config = heads_config(8, 2);
  config.alibi_slopes = ramp(8, 0.5f, 0.25f);
  config.sinks = ramp(8, -2.0f, 0.5f);
  config.sliding_window = 24;
  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  const AttentionConfig rank = spec::shard_config(config, spec::tp_shard(config, 4, 3));
  EXPECT_EQ(rank.alibi_slopes, (std::vector<float>{2.0f, 2.25f}));
  EXPECT_EQ(rank.sinks, (std::vector<float>{1.0f, 1.5f}));
  EXPECT_EQ(rank.num_heads, 2);
  EXPECT_EQ(rank.num_kv_heads, 1);
  // Everything else is the layer's.
  AttentionConfig same = rank;
  same.num_heads = config.num_heads;
  same.num_kv_heads = config.num_kv_heads;
  same.alibi_slopes = config.alibi_slopes;
  same.sinks = config.sinks;
  EXPECT_EQ(same.tp_size, 4);
  EXPECT_EQ(same.tp_rank, 3);
  same.tp_size = 1;
  same.tp_rank = 0;
  EXPECT_EQ(same, config);
  // Without ALiBi or sinks the rank has none either.
  const AttentionConfig plain = spec::shard_config(heads_config(8, 2), spec::tp_shard(heads_config(8, 2), 2, 1));
  EXPECT_FALSE(plain.alibi_slopes.has_value());
  EXPECT_FALSE(plain.sinks.has_value());
}

// --- bad input ------------------------------------------------------------------------------------

void expect_shard_error(const AttentionConfig& config, int64_t tp, int64_t rank, const std::string& message) {
  try {
    (void)spec::tp_shard(config, tp, rank);
    ADD_FAILURE() << "no error for tp " << tp << " rank " << rank << "; wanted: " << message;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor parallel: "));
    EXPECT_THAT(e.what(), HasSubstr(message));
  }
}

TEST(TensorParallelShard, BadInputThrowsNamingTheFieldAndConstraint) {
  expect_shard_error(heads_config(32, 8), 0, 0, "tp_size must be at least 1, got 0");
  expect_shard_error(heads_config(32, 8), -2, 0, "tp_size must be at least 1, got -2");
  expect_shard_error(heads_config(32, 8), 4, 4, "tp_rank must be in [0, tp_size 4), got 4");
  expect_shard_error(heads_config(32, 8), 4, -1, "tp_rank must be in [0, tp_size 4), got -1");
  expect_shard_error(heads_config(10, 2), 4, 0, "num_heads 10 is not divisible by tp_size 4");
  expect_shard_error(heads_config(32, 8), 64, 0, "num_heads 32 is not divisible by tp_size 64");
  expect_shard_error(heads_config(24, 6), 4, 0, "num_kv_heads 6 is not divisible by tp_size 4");
  expect_shard_error(heads_config(12, 3), 4, 0, "tp_size 4 is not divisible by num_kv_heads 3");
  expect_shard_error(heads_config(8, 3), 2, 0, "num_heads 8 is not divisible by num_kv_heads 3");
  expect_shard_error(heads_config(0, 1), 1, 0, "num_heads and num_kv_heads must be at least 1");
  expect_shard_error(heads_config(8, 0), 1, 0, "num_heads and num_kv_heads must be at least 1");
}

TEST(TensorParallelShard, RankConfigRejectsAShardOfAnotherLayerAndMisSizedSlopes) {
  const AttentionConfig config = heads_config(8, 2);
  EXPECT_THAT([&] { (void)spec::shard_config(config, spec::tp_shard(heads_config(16, 2), 2, 1)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("does not belong to a layer of num_heads 8")));
  AttentionConfig bad = config;
  bad.alibi_slopes = ramp(4, 0.1f, 0.1f);
  EXPECT_THAT([&] { (void)spec::shard_config(bad, spec::tp_shard(bad, 2, 0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("alibi_slopes must have num_heads 8 values, got 4")));
  bad = config;
  bad.sinks = ramp(9, 0.1f, 0.1f);
  EXPECT_THAT([&] { (void)spec::shard_config(bad, spec::tp_shard(bad, 2, 0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("sinks must have num_heads 8 values, got 9")));
}

// --- cutting a step -------------------------------------------------------------------------------

BatchFile synthetic(const AttentionConfig& config, const std::vector<RequestSpec>& requests,
                    const SyntheticOptions& options = {}) {
  return make_synthetic_batch(config, BuilderConfig{}, requests, options);
}

// The bytes of `count` elements of a host tensor from `index` on (contiguous in the last dimension).
std::string element_bytes(const TensorView& t, std::initializer_list<int64_t> index, int64_t count = 1) {
  const int64_t size = element_size(t.dtype());
  return {static_cast<const char*>(t.data()) + t.offset(index) * size, static_cast<size_t>(count * size)};
}

TEST(TensorParallelCut, EveryElementOfARankIsTheUnshardedElementAtItsHead) {
  AttentionConfig config = heads_config(8, 4);
  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  const BatchFile file = synthetic(config, {{40, 1, {}}, {0, 20, {}}}, {.seed = 3, .padding_tokens = 1});
  for (int64_t tp : {2, 8}) {
    for (int64_t r = 0; r < tp; ++r) {
      const TpShard shard = spec::tp_shard(config, tp, r);
      const BatchFile rank = spec::shard_batch_file(file, shard);
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " rank " << r);
      const BatchInputs& in = file.inputs;
      const BatchInputs& out = rank.inputs;
      const int64_t T = in.query.size(0), d = config.head_size;
      ASSERT_EQ(out.query.shape(), (Shape{T, 8 / tp, d}));
      ASSERT_EQ(out.key.shape(), (Shape{T, std::max<int64_t>(1, 4 / tp), d}));
      ASSERT_EQ(out.value.shape(), out.key.shape());
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < d; ++c) {
          for (int64_t h = 0; h < out.query.size(1); ++h) {
            ASSERT_EQ(element_bytes(out.query, {t, h, c}), element_bytes(in.query, {t, shard.q_head_begin + h, c}));
          }
          for (int64_t h = 0; h < out.key.size(1); ++h) {
            ASSERT_EQ(element_bytes(out.key, {t, h, c}), element_bytes(in.key, {t, shard.kv_head_begin + h, c}));
            ASSERT_EQ(element_bytes(out.value, {t, h, c}), element_bytes(in.value, {t, shard.kv_head_begin + h, c}));
          }
        }
      }
      const int64_t nb = in.kv_cache.size(0), bs = config.block_size;
      const int64_t rank_hkv = out.key.size(1);
      ASSERT_EQ(out.kv_cache.shape(), (Shape{nb, 2, bs, rank_hkv, d}));
      ASSERT_EQ(out.k_scale_cache.shape(), (Shape{nb, bs, rank_hkv}));
      ASSERT_EQ(out.v_scale_cache.shape(), (Shape{nb, bs, rank_hkv}));
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t s = 0; s < bs; ++s) {
          for (int64_t h = 0; h < rank_hkv; ++h) {
            const int64_t g = shard.kv_head_begin + h;
            ASSERT_EQ(element_bytes(out.k_scale_cache, {b, s, h}), element_bytes(in.k_scale_cache, {b, s, g}));
            ASSERT_EQ(element_bytes(out.v_scale_cache, {b, s, h}), element_bytes(in.v_scale_cache, {b, s, g}));
            for (int64_t half = 0; half < 2; ++half) {
              for (int64_t c = 0; c < d; ++c) {
                ASSERT_EQ(element_bytes(out.kv_cache, {b, half, s, h, c}),
                          element_bytes(in.kv_cache, {b, half, s, g, c}));
              }
            }
          }
        }
      }
      // Per-request data and the builder settings are the step's.
      EXPECT_EQ(rank.batch.query_start_loc, file.batch.query_start_loc);
      EXPECT_EQ(rank.batch.seq_lens, file.batch.seq_lens);
      EXPECT_EQ(rank.batch.block_table, file.batch.block_table);
      EXPECT_EQ(rank.batch.slot_mapping, file.batch.slot_mapping);
      EXPECT_EQ(rank.batch.num_actual_tokens, file.batch.num_actual_tokens);
      EXPECT_EQ(rank.builder, file.builder);
      EXPECT_EQ(rank.provenance.at("tensor_parallel"), "rank " + std::to_string(r) + " of " + std::to_string(tp));
      // The rank's step is a valid step of the rank's layer.
      EXPECT_NO_THROW(validate(rank.config, rank.batch, rank.inputs));
      // A copy: writing the rank's cache leaves the file's untouched.
      EXPECT_NE(out.kv_cache.data(), in.kv_cache.data());
    }
  }
}

TEST(TensorParallelCut, SsmBranchesOtherThanMamba1AndLinearLayersAreNotSharded) {
  const AttentionConfig config = heads_config(8, 2);
  BatchFile file = synthetic(config, {{4, 1, {}}});
  file.config.ssm_mode = "ema";
  EXPECT_THAT([&] { (void)spec::shard_batch_file(file, spec::tp_shard(file.config, 2, 0)); },
              ::testing::ThrowsMessage<NotSupported>(
                  HasSubstr("tensor parallel: the SSM branch 'ema' is not sharded (sharded branches: mamba1, zero)")));
  file.config.ssm_mode = "gdn";
  file.config.layer_kind = LayerKind::kGdn;
  EXPECT_THAT([&] { (void)spec::shard_batch_file(file, spec::tp_shard(file.config, 2, 0)); },
              ::testing::ThrowsMessage<NotSupported>(HasSubstr("layer_kind 'gdn'")));
  // A cache whose head axis disagrees with the config is named.
  BatchFile wrong = synthetic(config, {{4, 1, {}}});
  wrong.config.num_kv_heads = 1;
  EXPECT_THAT([&] { (void)spec::shard_batch_file(wrong, spec::tp_shard(wrong.config, 2, 0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor parallel: key must have 1 heads in dimension 1")));
}

// --- the metamorphic relation ---------------------------------------------------------------------

StepOutputs run_reference(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

// Rows [0, rows) of a [T, H, D] tensor hold at least one finite value per row (the step ran).
bool rows_ran(const Tensor& t, int64_t rows) {
  const int64_t per_row = t.numel() / t.size(0);
  for (int64_t i = 0; i < rows; ++i) {
    bool finite = false;
    for (int64_t j = 0; j < per_row && !finite; ++j) {
      finite = std::isfinite(load_as_double(t.data(), t.dtype(), i * per_row + j));
    }
    if (!finite) return false;
  }
  return true;
}

struct TpCase {
  std::string name;
  AttentionConfig config;
  std::vector<RequestSpec> requests;
  SyntheticOptions options;
  std::vector<int64_t> tp_sizes;
};

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> cases;
  // Requests decodes first, as vLLM orders a batch (the builders require it).
  {  // GQA 4:1, bf16 cache, a mixed batch (decodes, a prefill, a chunk, an mm_prefix range), CUDA-graph padding
    TpCase c{"gqa_mixed_padded", heads_config(8, 2), {}, {}, {2, 4, 8}};
    c.requests = {{90, 1, {}}, {150, 1, {}}, {0, 37, {}}, {33, 17, {}}, {64, 2, {{60, 65}}}};
    c.options = {.seed = 5, .padding_tokens = 3, .padding_requests = 1};
    cases.push_back(c);
  }
  {  // decodes with a sliding window, linear ALiBi, sinks and an fp8 per-token-head cache
    TpCase c{"decodes_window_alibi_sinks_fp8_per_token_head", heads_config(8, 4), {}, {}, {2, 4, 8}};
    c.config.sliding_window = 24;
    c.config.alibi_slopes = ramp(8, 0.05f, 0.05f);
    c.config.sinks = ramp(8, -1.0f, 0.4f);
    c.config.kv_cache_dtype = KvCacheDtype::kFp8PerTokenHead;
    c.requests = {{40, 1, {}}, {100, 1, {}}, {7, 1, {}}, {0, 1, {}}};
    c.options = {.seed = 6};
    cases.push_back(c);
  }
  {  // prefills with sqrt ALiBi, soft cap, sinks and an int8 per-token-head cache, head size 64
    TpCase c{"prefills_alibi_sqrt_softcap_int8_per_token_head", heads_config(16, 8, 64), {}, {}, {2, 4, 8}};
    c.config.use_alibi_sqrt = true;
    c.config.alibi_slopes = ramp(16, 0.02f, 0.03f);
    c.config.sinks = ramp(16, -0.5f, 0.1f);
    c.config.logits_soft_cap = 30.0;
    c.config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
    c.requests = {{0, 37, {}}, {0, 16, {}}, {0, 5, {}}};
    c.options = {.seed = 7};
    cases.push_back(c);
  }
  {  // MQA: chunked prefill with a window and a per-tensor fp8 cache; every rank holds the kv head
    TpCase c{"mqa_chunked_window_fp8_e4m3", heads_config(8, 1), {}, {}, {2, 4, 8}};
    c.config.sliding_window = 19;
    c.config.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
    c.requests = {{5, 1, {}}, {33, 17, {}}, {64, 20, {}}, {16, 16, {}}};
    c.options = {.seed = 8, .k_scale = 0.5f, .v_scale = 0.25f};
    cases.push_back(c);
  }
  {  // MHA in float16 with a float16 cache, block size 32, chunks and decodes, and the stateless
     // SSM branch "zero" (its contribution, zeros, is per head too)
    TpCase c{"mha_float16_block32_ssm_zero", heads_config(8, 8, 32, 32), {}, {}, {2, 4, 8}};
    c.config.dtype = DType::kFloat16;
    c.config.ssm_mode = "zero";
    c.requests = {{3, 1, {}}, {70, 9, {}}, {31, 2, {}}};
    c.options = {.seed = 9, .padding_tokens = 2};
    cases.push_back(c);
  }
  return cases;
}

TEST(TensorParallelMetamorphic, JoinedRankStepsEqualTheUnshardedStepBitForBit) {
  for (const TpCase& c : tp_cases()) {
    const BatchFile file = synthetic(c.config, c.requests, c.options);
    const StepOutputs whole = run_reference(file);
    const int64_t rows = file.batch.num_actual_tokens;
    ASSERT_TRUE(rows_ran(whole.attn_output, rows)) << c.name;
    // The write changed the cache (otherwise the cache comparison below proves nothing).
    ASSERT_FALSE(bitwise_equal(whole.kv_cache, file.inputs.kv_cache)) << c.name;
    for (int64_t tp : c.tp_sizes) {
      SCOPED_TRACE(::testing::Message() << c.name << " tp " << tp);
      std::vector<StepOutputs> ranks;
      for (int64_t r = 0; r < tp; ++r) {
        const BatchFile rank_file = spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r));
        ranks.push_back(run_reference(rank_file));
        // Each rank's output is the unsharded output at its heads, row by row (checked here
        // without the join).
        const TpShard shard = spec::tp_shard(file.config, tp, r);
        const Tensor& part = ranks.back().attn_output;
        ASSERT_EQ(part.shape(), (Shape{whole.attn_output.size(0), shard.num_heads(), c.config.head_size}));
        const int64_t d = c.config.head_size;
        for (int64_t t = 0; t < part.size(0); ++t) {
          for (int64_t h = 0; h < shard.num_heads(); ++h) {
            ASSERT_EQ(element_bytes(part, {t, h, 0}, d),
                      element_bytes(whole.attn_output, {t, shard.q_head_begin + h, 0}, d))
                << "rank " << r << " token " << t << " head " << h;
          }
        }
      }
      const StepOutputs joined = spec::join_step_outputs(file.config, ranks);
      EXPECT_TRUE(bitwise_equal(joined.output, whole.output));
      EXPECT_TRUE(bitwise_equal(joined.attn_output, whole.attn_output));
      EXPECT_TRUE(bitwise_equal(joined.ssm_output, whole.ssm_output));
      EXPECT_EQ(joined.ssm_output.empty(), c.config.ssm_mode == "none");
      EXPECT_TRUE(bitwise_equal(joined.kv_cache, whole.kv_cache));
      EXPECT_TRUE(bitwise_equal(joined.k_scale_cache, whole.k_scale_cache));
      EXPECT_TRUE(bitwise_equal(joined.v_scale_cache, whole.v_scale_cache));
      EXPECT_EQ(joined.k_scale_cache.empty(), !is_per_token_head(c.config.kv_cache_dtype));
      // The metadata is the ranks': vLLM builds it per rank, whose 3D-path threshold is 128 over the
      // rank's kv heads; nothing else in it depends on the heads.
      const int64_t rank_kv_heads = std::max<int64_t>(1, c.config.num_kv_heads / tp);
      EXPECT_EQ(joined.metadata.attention.seq_threshold_3d, 128 / rank_kv_heads);
      EXPECT_EQ(whole.metadata.attention.seq_threshold_3d, 128 / c.config.num_kv_heads);
      for (const std::string& line : metadata_differences(joined.metadata, whole.metadata)) {
        EXPECT_THAT(line, ::testing::AnyOf(::testing::StartsWith("attention/seq_threshold_3d"),
                                           ::testing::StartsWith("attention/use_3d_path")));
      }
      // The pieces on their own too.
      std::vector<TensorView> outputs, caches;
      for (const StepOutputs& rank : ranks) {
        outputs.push_back(rank.attn_output);
        caches.push_back(rank.kv_cache);
      }
      EXPECT_TRUE(bitwise_equal(spec::join_query_heads(file.config, outputs), whole.attn_output));
      EXPECT_TRUE(bitwise_equal(spec::join_kv_caches(file.config, caches), whole.kv_cache));
    }
  }
}

// A file's recorded outputs are cut like its inputs: each rank's /outputs is the rank's own run.
TEST(TensorParallelMetamorphic, CutOutputsAreTheRanksOwnRuns) {
  AttentionConfig config = heads_config(8, 2);
  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  BatchFile file = synthetic(config, {{9, 1, {}}, {20, 5, {}}}, {.seed = 12});
  file.outputs = run_reference(file);
  for (int64_t r = 0; r < 4; ++r) {
    const BatchFile rank = spec::shard_batch_file(file, spec::tp_shard(config, 4, r));
    ASSERT_TRUE(rank.outputs.has_value());
    const StepOutputs own = run_reference(rank);
    EXPECT_EQ(first_bit_difference(*rank.outputs, own), "") << "rank " << r;
    EXPECT_TRUE(rank.outputs->has_metadata);
    EXPECT_EQ(metadata_differences(rank.outputs->metadata, own.metadata), std::vector<std::string>{}) << "rank " << r;
  }
}

TEST(TensorParallelJoin, ReplicatedKvHeadsMustAgreeAndPartsMustFit) {
  const AttentionConfig config = heads_config(8, 2);
  const BatchFile file = synthetic(config, {{30, 3, {}}}, {.seed = 4});
  std::vector<StepOutputs> ranks;
  for (int64_t r = 0; r < 4; ++r) {
    ranks.push_back(run_reference(spec::shard_batch_file(file, spec::tp_shard(config, 4, r))));
  }
  // Ranks 2 and 3 hold kv head 1; a byte of rank 3's copy changed is caught.
  std::vector<TensorView> caches;
  for (const StepOutputs& rank : ranks) caches.push_back(rank.kv_cache);
  const Tensor changed = clone_host(caches[3]);
  static_cast<unsigned char*>(changed.data())[changed.nbytes() - 1] ^= 0x01;
  caches[3] = changed;
  EXPECT_THAT([&] { (void)spec::join_kv_caches(config, caches); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("kv_cache of rank 3 differs from rank 2 in replicated kv head 1")));
  // An output with the wrong number of heads, or a missing rank, is named.
  std::vector<TensorView> outputs;
  for (const StepOutputs& rank : ranks) outputs.push_back(rank.attn_output);
  std::vector<TensorView> three(outputs.begin(), outputs.begin() + 3);
  EXPECT_THAT([&] { (void)spec::join_query_heads(config, three); },
              ::testing::ThrowsMessage<Error>(HasSubstr("num_heads 8 is not divisible by tp_size 3")));
  // Rank outputs of tp 4 (2 heads each) joined as if tp were 2.
  std::vector<TensorView> two = {outputs[0], outputs[1]};
  EXPECT_THAT([&] { (void)spec::join_query_heads(config, two); },
              ::testing::ThrowsMessage<Error>(HasSubstr("output of rank 0 must be [T, 4, D], got float64[3, 2, 32]")));
}

}  // namespace
}  // namespace hybridtb::testing
