// The synthetic batch generator: valid, seeded, vLLM-like paging with a NaN null block.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hybridtb/synthetic.h"

namespace hybridtb {
namespace {

AttentionConfig windowed_config() {
  AttentionConfig c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_size = 64;
  c.block_size = 16;
  c.scale = 0.125;
  c.sliding_window = 32;
  c.dtype = DType::kFloat16;
  return c;
}

TEST(Synthetic, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<RequestSpec> requests{{100, 1}, {0, 33}};
  const BatchFile a = make_synthetic_batch(windowed_config(), {}, requests, {.seed = 5});
  const BatchFile b = make_synthetic_batch(windowed_config(), {}, requests, {.seed = 5});
  const BatchFile c = make_synthetic_batch(windowed_config(), {}, requests, {.seed = 6});
  EXPECT_TRUE(bitwise_equal(a.inputs.query, b.inputs.query));
  EXPECT_TRUE(bitwise_equal(a.inputs.kv_cache, b.inputs.kv_cache));
  EXPECT_EQ(a.batch.block_table, b.batch.block_table);
  EXPECT_FALSE(bitwise_equal(a.inputs.query, c.inputs.query));
}

TEST(Synthetic, RequestsGetDistinctNonNullBlocksAndOutOfWindowBlocksPointAtNull) {
  // Context 100, window 32: the first query (position 100) sees keys 69..100, so blocks 0..3
  // (positions 0..63) are out of every query's window; block 4 (64..79) is partly visible.
  const BatchFile f = make_synthetic_batch(windowed_config(), {}, {{100, 1}, {0, 33}}, {.seed = 1});
  const IntArray& table = f.batch.block_table;
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(table.at(0, i), 0) << "block " << i;
  std::set<int32_t> used;
  for (int64_t i = 4; i < 7; ++i) used.insert(table.at(0, i));
  for (int64_t i = 0; i < 3; ++i) used.insert(table.at(1, i));
  EXPECT_EQ(used.size(), 6u);
  EXPECT_EQ(used.count(0), 0u);
  // The null block holds NaN in keys and values.
  const auto& cache = f.inputs.kv_cache;
  const int64_t per_block = cache.numel() / cache.size(0);
  for (int64_t i = 0; i < per_block; ++i) {
    EXPECT_TRUE(std::isnan(load_as_double(cache.data(), cache.dtype(), i)));
  }
}

TEST(Synthetic, ShuffledByDefaultConsecutiveOnRequest) {
  AttentionConfig c = windowed_config();
  c.sliding_window = 0;
  const BatchFile shuffled = make_synthetic_batch(c, {}, {{300, 1}}, {.seed = 2});
  const BatchFile ordered = make_synthetic_batch(c, {}, {{300, 1}}, {.seed = 2, .shuffle_blocks = false});
  std::vector<int32_t> row_ordered, row_shuffled;
  for (int64_t i = 0; i < 19; ++i) {
    row_ordered.push_back(ordered.batch.block_table.at(0, i));
    row_shuffled.push_back(shuffled.batch.block_table.at(0, i));
    EXPECT_EQ(row_ordered.back(), i + 1);
  }
  EXPECT_NE(row_shuffled, row_ordered);
}

TEST(Synthetic, PaddingRowsAndRequests) {
  const BatchFile f = make_synthetic_batch(windowed_config(), {}, {{5, 1}, {9, 1}},
                                           {.padding_tokens = 6, .padding_requests = 6});
  EXPECT_EQ(f.batch.num_reqs(), 8);
  EXPECT_EQ(f.batch.num_actual_tokens, 2);
  EXPECT_EQ(f.batch.num_tokens(), 8);
  for (int64_t t = 2; t < 8; ++t) EXPECT_EQ(f.batch.slot_mapping[static_cast<size_t>(t)], kPadSlotId);
  for (int64_t r = 2; r < 8; ++r) {
    EXPECT_EQ(f.batch.query_len(r), 0);
    EXPECT_EQ(f.batch.seq_len(r), 0);
  }
}

TEST(Synthetic, PerTokenHeadScalesAreStoredAndNullBlockScalesAreNaN) {
  AttentionConfig c = windowed_config();
  c.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  const BatchFile f = make_synthetic_batch(c, {}, {{20, 3}}, {});
  ASSERT_FALSE(f.inputs.k_scale_cache.empty());
  const auto* scales = f.inputs.k_scale_cache.data_as<float>();
  const int64_t per_block = c.block_size * c.num_kv_heads;
  EXPECT_TRUE(std::isnan(scales[0]));
  for (int64_t i = per_block; i < f.inputs.k_scale_cache.numel(); ++i) EXPECT_GT(scales[i], 0.0f);
}

TEST(Synthetic, SsmBlockTableGivesEachRequestDistinctNonNullSlots) {
  AttentionConfig c = windowed_config();
  c.mamba_cache_mode = MambaCacheMode::kAll;
  c.mamba_block_size = 16;
  // Request 0's early attention blocks are nulled by the window; its SSM slots must not be.
  const BatchFile f = make_synthetic_batch(c, {}, {{100, 1}, {0, 33}}, {.padding_requests = 1, .ssm_block_table = true});
  ASSERT_TRUE(f.batch.ssm_block_table.has_value());
  const IntArray& t = *f.batch.ssm_block_table;
  EXPECT_EQ(t.size(0), 3);
  EXPECT_EQ(t.size(1), 7);  // ceil(101 / 16) blocks for the longest request
  std::set<int32_t> slots;
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < t.size(1); ++i) {
      EXPECT_GT(t.at(r, i), 0);
      slots.insert(t.at(r, i));
    }
  }
  EXPECT_EQ(slots.size(), 14u);
  for (int64_t i = 0; i < t.size(1); ++i) EXPECT_EQ(t.at(2, i), 0);  // the padding request
  EXPECT_EQ(ssm_slots_needed(f.batch), 15);
}

TEST(Synthetic, FastFillIsSeededNonZeroAndRoughlyStandardNormal) {
  const std::vector<RequestSpec> requests{{100, 1}, {0, 33}};
  const SyntheticOptions fast{.seed = 5, .fast_fill = true};
  const BatchFile a = make_synthetic_batch(windowed_config(), {}, requests, fast);
  const BatchFile b = make_synthetic_batch(windowed_config(), {}, requests, fast);
  const BatchFile historical = make_synthetic_batch(windowed_config(), {}, requests, {.seed = 5});
  EXPECT_TRUE(bitwise_equal(a.inputs.query, b.inputs.query));
  EXPECT_TRUE(bitwise_equal(a.inputs.kv_cache, b.inputs.kv_cache));
  EXPECT_EQ(a.batch.block_table, historical.batch.block_table);  // same paging, other data
  EXPECT_FALSE(bitwise_equal(a.inputs.query, historical.inputs.query));
  EXPECT_FALSE(bitwise_equal(a.inputs.query, a.inputs.key));  // tensors do not share a stream
  double sum = 0, sum_sq = 0;
  const auto& q = a.inputs.query;
  for (int64_t i = 0; i < q.numel(); ++i) {
    const double v = load_as_double(q.data(), q.dtype(), i);
    EXPECT_NE(v, 0.0);
    sum += v;
    sum_sq += v * v;
  }
  const double n = static_cast<double>(q.numel());
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.05);
}

// The fast fill reports its KV-cache blocks to a progress sink: one stage, counts that never go
// down, the last equal to the cache's blocks. Listening changes nothing in what is generated.
TEST(Synthetic, FastFillReportsItsBlocksAndIsUnchangedByListening) {
  struct RecordingSink final : ProgressSink {
    std::vector<std::tuple<std::string, int64_t, int64_t>> calls;
    void report(const std::string& stage, int64_t done, int64_t total, double) override {
      calls.emplace_back(stage, done, total);
    }
  } sink;
  const std::vector<RequestSpec> requests{{3000, 1}, {0, 700}, {1200, 40}};
  const BatchFile quiet = make_synthetic_batch(windowed_config(), {}, requests, {.seed = 3, .fast_fill = true});
  const BatchFile heard =
      make_synthetic_batch(windowed_config(), {}, requests, {.seed = 3, .fast_fill = true, .progress = &sink});
  EXPECT_TRUE(bitwise_equal(quiet.inputs.kv_cache, heard.inputs.kv_cache));
  const int64_t blocks = heard.inputs.kv_cache.size(0);
  ASSERT_GE(sink.calls.size(), 2u);
  int64_t previous = -1;
  for (const auto& [stage, done, total] : sink.calls) {
    EXPECT_EQ(stage, "generating the KV cache");
    EXPECT_EQ(total, blocks);
    EXPECT_GE(done, previous);
    previous = done;
  }
  EXPECT_EQ(std::get<1>(sink.calls.front()), 0);
  EXPECT_EQ(std::get<1>(sink.calls.back()), blocks);
}

TEST(Synthetic, CompactPagingDrawsNoBlockForNulledEntries) {
  const BatchFile loose = make_synthetic_batch(windowed_config(), {}, {{100, 1}, {0, 33}}, {.seed = 1});
  const BatchFile compact = make_synthetic_batch(windowed_config(), {}, {{100, 1}, {0, 33}}, {.seed = 1, .compact = true});
  // Request 0 has 7 blocks, 4 of them nulled; request 1 has 3: 6 live blocks + null + 3 spare.
  EXPECT_EQ(loose.inputs.kv_cache.size(0), 1 + 10 + 3);
  EXPECT_EQ(compact.inputs.kv_cache.size(0), 1 + 6 + 3);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(compact.batch.block_table.at(0, i), 0);
}

TEST(Synthetic, SharedPrefixAliasesTheFirstBlocks) {
  AttentionConfig c = windowed_config();
  c.sliding_window = 0;
  const BatchFile f = make_synthetic_batch(c, {}, {{70, 1}, {40, 8}, {20, 1}}, {.seed = 2, .shared_prefix_tokens = 32});
  const IntArray& t = f.batch.block_table;
  EXPECT_EQ(t.at(0, 0), t.at(1, 0));
  EXPECT_EQ(t.at(0, 1), t.at(1, 1));
  EXPECT_NE(t.at(0, 2), t.at(1, 2));
  EXPECT_NE(t.at(2, 0), t.at(0, 0));  // context 20 < 32: no hit
}

TEST(Synthetic, NumAcceptedTokensOnlyWhenGiven) {
  EXPECT_FALSE(make_synthetic_batch(windowed_config(), {}, {{10, 1}}, {}).batch.num_accepted_tokens.has_value());
  RequestSpec spec{.context_len = 10, .query_len = 3};
  spec.num_accepted_tokens = 2;
  const BatchFile f = make_synthetic_batch(windowed_config(), {}, {{5, 1}, spec}, {.padding_requests = 1});
  ASSERT_TRUE(f.batch.num_accepted_tokens.has_value());
  EXPECT_EQ(f.batch.num_accepted_tokens->values, (std::vector<int32_t>{1, 2, 1}));
}

}  // namespace
}  // namespace hybridtb
