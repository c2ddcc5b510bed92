// Metamorphic relations of the reference attention: two ways of asking the same question must
// give the same answer (bitwise where the arithmetic is the same, else within the float64
// tolerance): windows, GQA, paging, chunking, decoding, NaN null blocks, aliasing, batching.
// Run: ctest -L attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention_steps.h"

namespace hybridtb::testing {
namespace {

std::vector<float> ramp(int64_t n, float first, float step) {
  std::vector<float> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(first + step * static_cast<float>(i));
  return v;
}

AttentionConfig windowed_config(int64_t window) {
  AttentionConfig config = attention_config(8, 2, 64, 16);
  config.sliding_window = window;
  config.sinks = ramp(8, -1.0f, 0.4f);
  config.use_alibi_sqrt = true;
  config.alibi_slopes = ramp(8, 0.05f, 0.05f);
  return config;
}

std::vector<RequestSpec> mixed_requests() {
  return {{0, 70, {}}, {90, 1, {}}, {33, 17, {}}, {150, 1, {}}, {64, 2, {{60, 65}}}};
}

// Tolerance for comparing two float64 runs over requests of at most `max_seq_len` keys.
Tolerance float64_tolerance(const BatchFile& step) {
  return tolerance_for(ToleranceCase::kAttentionFloat64, step.batch.max_seq_len() + 1, step.config.head_size);
}

TEST(Metamorphic, WindowCoveringTheSequenceEqualsNoWindow) {
  const std::vector<RequestSpec> requests = mixed_requests();
  const BatchFile plain = synthetic_step(windowed_config(0), requests, {.seed = 7});
  const Tensor expected = run_reference(plain).output;
  for (int64_t window : {plain.batch.max_seq_len(), plain.batch.max_seq_len() + 1, int64_t{100000}}) {
    const BatchFile windowed = synthetic_step(windowed_config(window), requests, {.seed = 7});
    EXPECT_TRUE(rows_bitwise_equal(run_reference(windowed).output, 0, expected, 0, plain.batch.num_actual_tokens))
        << "window " << window;
  }
}

// [outer, heads, inner] → [outer, heads·group, inner] with new head j = old head j / group.
Tensor repeat_heads(const Tensor& tensor, int axis, int64_t group) {
  if (tensor.empty()) return tensor;
  Shape shape = tensor.shape();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t heads = shape[static_cast<size_t>(axis)];
  shape[static_cast<size_t>(axis)] = heads * group;
  Tensor repeated = Tensor::host(tensor.dtype(), shape);
  const int64_t bytes = inner * element_size(tensor.dtype());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < heads * group; ++j) {
      std::memcpy(static_cast<unsigned char*>(repeated.data()) + (o * heads * group + j) * bytes,
                  static_cast<const unsigned char*>(tensor.data()) + (o * heads + j / group) * bytes,
                  static_cast<size_t>(bytes));
    }
  }
  return repeated;
}

TEST(Metamorphic, GqaEqualsMhaWithRepeatedKvHeads) {
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kInt8PerTokenHead}) {
    AttentionConfig config = windowed_config(24);
    config.kv_cache_dtype = kv;
    const BatchFile gqa = synthetic_step(config, mixed_requests(), {.seed = 11});
    const int64_t group = config.num_queries_per_kv();
    BatchFile mha = gqa;
    mha.config.num_kv_heads = config.num_heads;
    mha.inputs.key = repeat_heads(gqa.inputs.key, 1, group);
    mha.inputs.value = repeat_heads(gqa.inputs.value, 1, group);
    mha.inputs.kv_cache = repeat_heads(gqa.inputs.kv_cache, 3, group);
    mha.inputs.k_scale_cache = repeat_heads(gqa.inputs.k_scale_cache, 2, group);
    mha.inputs.v_scale_cache = repeat_heads(gqa.inputs.v_scale_cache, 2, group);
    EXPECT_TRUE(rows_bitwise_equal(run_reference(gqa).output, 0, run_reference(mha).output, 0,
                                   gqa.batch.num_actual_tokens))
        << to_string(kv);
  }
}

TEST(Metamorphic, ShuffledPagingEqualsContiguousPaging) {
  const BatchFile shuffled = synthetic_step(windowed_config(24), mixed_requests(), {.seed = 13});
  const Tensor expected = run_reference(shuffled).output;
  const int64_t num_blocks = shuffled.inputs.kv_cache.size(0);

  // Contiguous: each request's blocks get consecutive ids in table order (the null block stays 0).
  std::vector<int32_t> contiguous(static_cast<size_t>(num_blocks), -1);
  contiguous[0] = 0;
  int32_t next = 1;
  for (int32_t block : shuffled.batch.block_table.values) {
    if (contiguous[static_cast<size_t>(block)] < 0) contiguous[static_cast<size_t>(block)] = next++;
  }
  for (int32_t& id : contiguous) {
    if (id < 0) id = next++;
  }
  // And a random relabelling of every block, the null block included.
  std::vector<int32_t> random(static_cast<size_t>(num_blocks));
  std::iota(random.begin(), random.end(), 0);
  std::shuffle(random.begin(), random.end(), std::mt19937(5));

  for (const auto& permutation : {contiguous, random}) {
    const BatchFile moved = remap_blocks(shuffled, permutation);
    EXPECT_TRUE(rows_bitwise_equal(run_reference(moved).output, 0, expected, 0, shuffled.batch.num_actual_tokens));
  }
}

// Runs request 0 of `step` as consecutive chunks [bounds[i], bounds[i+1]) of its query, each chunk
// writing its keys into the same cache before attending; returns the stacked output rows.
Tensor run_in_chunks(const BatchFile& step, const std::vector<int64_t>& bounds) {
  const int64_t rows = step.batch.query_len(0);
  Tensor stacked = Tensor::host(DType::kFloat64, {rows, step.config.num_heads, step.config.head_size});
  const BatchInputs shared = clone_inputs(step.inputs);  // one cache for the whole sequence of steps
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    BatchFile chunk = sub_step(step, 0, bounds[i], bounds[i + 1]);
    chunk.inputs.kv_cache = shared.kv_cache;
    chunk.inputs.k_scale_cache = shared.k_scale_cache;
    chunk.inputs.v_scale_cache = shared.v_scale_cache;
    const Tensor out = run_reference_in_place(chunk.config, chunk.batch, chunk.inputs);
    const int64_t row_bytes = out.nbytes() / out.size(0);
    std::memcpy(static_cast<unsigned char*>(stacked.data()) + bounds[i] * row_bytes, out.data(),
                static_cast<size_t>(out.nbytes()));
  }
  return stacked;
}

TEST(Metamorphic, ChunkedPrefillEqualsOneShotPrefill) {
  // Sqrt ALiBi, sinks, soft cap and a window: all invariant under chunking. (Linear ALiBi with
  // sinks is not: its bias is relative to the chunk start, so it shifts against the sink.)
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8PerTokenHead}) {
    AttentionConfig config = windowed_config(40);
    config.logits_soft_cap = 4.0;
    config.kv_cache_dtype = kv;
    const BatchFile step = synthetic_step(config, {{0, 150, {}}}, {.seed = 17, .k_scale = 0.5f, .v_scale = 0.25f});
    const Tensor one_shot = run_reference(step).output;
    const Tensor chunked = run_in_chunks(step, {0, 50, 64, 65, 150});
    EXPECT_TRUE(rows_close(chunked, 0, one_shot, 0, 150, float64_tolerance(step))) << to_string(kv);
  }
}

TEST(Metamorphic, DecodeStepsEqualTheLastRowsOfAPrefill) {
  for (int64_t window : {int64_t{0}, int64_t{16}}) {
    const BatchFile step = synthetic_step(windowed_config(window), {{0, 100, {}}}, {.seed = 19});
    const Tensor one_shot = run_reference(step).output;
    const Tensor decoded = run_in_chunks(step, {0, 95, 96, 97, 98, 99, 100});
    EXPECT_TRUE(rows_close(decoded, 0, one_shot, 0, 100, float64_tolerance(step))) << "window " << window;
  }
}

TEST(Metamorphic, NanInNullBlocksChangesNothing) {
  const AttentionConfig config = windowed_config(20);
  const BatchFile clean = synthetic_step(config, mixed_requests(), {.seed = 23, .null_out_of_window = false});
  BatchFile nulled = synthetic_step(config, mixed_requests(), {.seed = 23, .null_out_of_window = true});
  ASSERT_NE(clean.batch.block_table, nulled.batch.block_table) << "the case must free some blocks";
  ASSERT_TRUE(std::isnan(load_as_double(nulled.inputs.kv_cache.data(), nulled.inputs.kv_cache.dtype(), 0)));
  const Tensor expected = run_reference(clean).output;
  EXPECT_TRUE(rows_bitwise_equal(run_reference(nulled).output, 0, expected, 0, clean.batch.num_actual_tokens));
}

// Stronger: NaN in every cached key/value that no query row of its request can see, and garbage
// block ids in every block-table column past seq_len (a read would throw).
TEST(Metamorphic, KeysNoRowCanSeeAreNeverRead) {
  for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kInt8PerTokenHead}) {
    AttentionConfig config = windowed_config(20);
    config.kv_cache_dtype = kv;
    const BatchFile clean = synthetic_step(config, mixed_requests(), {.seed = 29, .null_out_of_window = false});
    BatchFile poisoned = clean;
    poisoned.inputs = clone_inputs(clean.inputs);
    const BatchDescription& batch = poisoned.batch;
    const TensorView cache = poisoned.inputs.kv_cache.view();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      const int64_t seq_len = batch.seq_len(r), context_len = batch.context_len(r);
      for (int64_t k = 0; k < context_len; ++k) {  // this step's own keys are all visible to themselves
        bool seen = false;
        for (int64_t p = context_len; p < seq_len; ++p) seen = seen || (k <= p && p - k < config.sliding_window);
        if (seen) continue;
        const int64_t block = batch.block_table.at(r, k / config.block_size);
        const int64_t slot = k % config.block_size;
        for (int half = 0; half < 2; ++half) {
          for (int64_t h = 0; h < config.num_kv_heads; ++h) {
            const TensorView& scales = half == 0 ? poisoned.inputs.k_scale_cache.view() : poisoned.inputs.v_scale_cache.view();
            if (!scales.empty()) store_from_double(scales.data(), scales.dtype(), scales.offset({block, slot, h}), nan);
            for (int64_t c = 0; c < config.head_size; ++c) {
              const double poison = cache.dtype() == DType::kInt8 ? -128.0 : nan;
              store_from_double(cache.data(), cache.dtype(), cache.offset({block, half, slot, h, c}), poison);
            }
          }
        }
      }
      const int64_t used_blocks = (seq_len + config.block_size - 1) / config.block_size;
      for (int64_t b = used_blocks; b < batch.block_table.size(1); ++b) poisoned.batch.block_table.at(r, b) = -7;
    }
    // (Request 4's mm_prefix range 60..65 lies inside its rows' windows, so none of it is poisoned.)
    EXPECT_TRUE(rows_bitwise_equal(run_reference(poisoned).output, 0, run_reference(clean).output, 0,
                                   batch.num_actual_tokens))
        << to_string(kv);
  }
}

TEST(Metamorphic, PaddingRowsAndRequestsAreNeverWritten) {
  for (DType out : {DType::kFloat64, DType::kBFloat16, DType::kFloat8E4M3}) {
    const BatchFile step =
        synthetic_step(windowed_config(24), mixed_requests(), {.seed = 31, .padding_tokens = 5, .padding_requests = 3});
    ASSERT_EQ(step.batch.num_tokens(), step.batch.num_actual_tokens + 5);
    const ReferenceRun run = run_reference(step, out);
    EXPECT_TRUE(rows_untouched(run.output, step.batch.num_actual_tokens)) << to_string(out);
  }
}

TEST(Metamorphic, AliasedPrefixBlocksAreFine) {
  AttentionConfig config = windowed_config(0);
  const BatchFile separate = synthetic_step(config, {{40, 5, {}}, {40, 3, {}}}, {.seed = 37});
  // Request 1's first two (full, immutable) blocks become request 0's: a shared 32-token prefix.
  BatchFile aliased = separate;
  aliased.inputs = clone_inputs(separate.inputs);
  const TensorView cache = aliased.inputs.kv_cache.view();
  const int64_t block_bytes = cache.nbytes() / cache.size(0);
  BatchFile copied = aliased;  // the same keys, but in request 1's own blocks
  copied.inputs = clone_inputs(separate.inputs);
  for (int64_t b = 0; b < 2; ++b) {
    const int32_t shared = separate.batch.block_table.at(0, b);
    const int32_t own = separate.batch.block_table.at(1, b);
    aliased.batch.block_table.at(1, b) = shared;
    std::memcpy(static_cast<unsigned char*>(copied.inputs.kv_cache.data()) + own * block_bytes,
                static_cast<const unsigned char*>(separate.inputs.kv_cache.data()) + shared * block_bytes,
                static_cast<size_t>(block_bytes));
  }
  const ReferenceRun run = run_reference(aliased);
  EXPECT_TRUE(matches_naive(aliased, run));
  EXPECT_TRUE(rows_bitwise_equal(run.output, 0, run_reference(copied).output, 0, aliased.batch.num_actual_tokens));
}

TEST(Metamorphic, MixedBatchEqualsEachRequestAlone) {
  AttentionConfig config = windowed_config(24);
  config.use_alibi_sqrt = false;  // linear ALiBi with sinks: per request it is still well defined
  const BatchFile step = synthetic_step(config, mixed_requests(), {.seed = 41, .padding_requests = 2});
  const Tensor together = run_reference(step).output;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const int64_t rows = step.batch.query_len(r);
    if (rows == 0) continue;
    const BatchFile alone = sub_step(step, r, 0, rows);
    EXPECT_TRUE(rows_bitwise_equal(run_reference(alone).output, 0, together, step.batch.query_start_loc[r], rows))
        << "request " << r;
  }
}

TEST(Metamorphic, EncoderOnlyIgnoresSoftCapAlibiSinksAndOutputScale) {
  AttentionConfig plain = attention_config(8, 2, 64, 16);
  plain.attn_type = AttnType::kEncoderOnly;
  plain.sliding_window = 9;
  AttentionConfig decorated = plain;
  decorated.logits_soft_cap = 1.0;
  decorated.alibi_slopes = ramp(8, 0.5f, 0.5f);
  decorated.sinks = ramp(8, 1.0f, 1.0f);
  const std::vector<RequestSpec> requests{{0, 40, {}}, {0, 3, {}}};
  const BatchFile a = synthetic_step(plain, requests, {.seed = 43});
  const BatchFile b = synthetic_step(decorated, requests, {.seed = 43, .output_scale = 0.01f});
  EXPECT_TRUE(rows_bitwise_equal(run_reference(a).output, 0, run_reference(b).output, 0, a.batch.num_actual_tokens));
}

}  // namespace
}  // namespace hybridtb::testing
