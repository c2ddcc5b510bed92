// split_decodes_and_prefills, check_decodes_first, decode_first_order and reorder_requests
// (harness/spec/src/split_and_order.cpp) against hand-worked cases from vLLM's rule (notes §3.2) and
// against simpler formulations on seeded random batches.
// Run: ctest --test-dir build -L builders
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "builder_test_batches.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"

namespace hybridtb::testing {
namespace {

using spec::DecodePrefillSplit;

void expect_split(const DecodePrefillSplit& split, int64_t decodes, int64_t prefills, int64_t decode_tokens,
                  int64_t prefill_tokens) {
  EXPECT_EQ(split.num_decodes, decodes);
  EXPECT_EQ(split.num_prefills, prefills);
  EXPECT_EQ(split.num_decode_tokens, decode_tokens);
  EXPECT_EQ(split.num_prefill_tokens, prefill_tokens);
}

TEST(SplitDecodesAndPrefills, MixedBatchDecodesFirst) {
  // Three decodes (1 token each), a chunked-prefill extend of 7, a fresh prefill of 12.
  const auto batch = make_batch({{10, 1}, {4, 1}, {30, 1}, {16, 7}, {0, 12}});
  expect_split(spec::split_decodes_and_prefills(batch, 1), 3, 2, 3, 19);
}

TEST(SplitDecodesAndPrefills, AllDecodesAndAllPrefills) {
  expect_split(spec::split_decodes_and_prefills(make_batch({{3, 1}, {9, 1}}), 1), 2, 0, 2, 0);
  // The first request is a prefill, so nothing is a decode (even the later 1-token request).
  expect_split(spec::split_decodes_and_prefills(make_batch({{0, 5}, {9, 1}}), 1), 0, 2, 0, 6);
}

TEST(SplitDecodesAndPrefills, CountIsPositional) {
  // decode, prefill, decode: everything from the first prefill on counts as prefill.
  expect_split(spec::split_decodes_and_prefills(make_batch({{3, 1}, {0, 4}, {9, 1}}), 1), 1, 2, 1, 5);
}

TEST(SplitDecodesAndPrefills, ThresholdCountsShortQueriesAsDecodes) {
  // Speculative decoding: threshold 1 + 2.
  const auto batch = make_batch({{10, 3}, {5, 1}, {7, 2}, {0, 9}});
  expect_split(spec::split_decodes_and_prefills(batch, 3), 3, 1, 6, 9);
  expect_split(spec::split_decodes_and_prefills(batch, 1), 0, 4, 0, 15);
}

TEST(SplitDecodesAndPrefills, PaddingRequestsAreDecodesInADecodeBatch) {
  const auto batch = make_batch({{3, 1}, {9, 1}, kPaddingRequest, kPaddingRequest}, 8, 2);
  expect_split(spec::split_decodes_and_prefills(batch, 1), 4, 0, 2, 0);
  // ... and prefills (positionally) after a prefill.
  const auto mixed = make_batch({{3, 1}, {0, 6}, kPaddingRequest});
  expect_split(spec::split_decodes_and_prefills(mixed, 1), 1, 2, 1, 6);
}

TEST(SplitDecodesAndPrefills, RequireUniform) {
  // Uniform 2-token queries with zero-length padding: all decodes.
  expect_split(spec::split_decodes_and_prefills(make_batch({{4, 2}, {6, 2}, kPaddingRequest}), 2, true), 3, 0,
               4, 0);
  // Below the threshold but not uniform: the first differing query starts the prefills.
  expect_split(spec::split_decodes_and_prefills(make_batch({{4, 2}, {6, 1}, {5, 2}}), 2, true), 1, 2, 2, 3);
  // Threshold 1: the early exit applies even with require_uniform.
  expect_split(spec::split_decodes_and_prefills(make_batch({{4, 1}, {6, 1}, kPaddingRequest}), 1, true), 3, 0,
               2, 0);
  // First query above the threshold.
  expect_split(spec::split_decodes_and_prefills(make_batch({{4, 3}, {6, 3}}), 2, true), 0, 2, 0, 6);
}

TEST(SplitDecodesAndPrefills, EmptyBatch) {
  expect_split(spec::split_decodes_and_prefills(make_batch({}), 1), 0, 0, 0, 0);
  expect_split(spec::split_decodes_and_prefills(make_batch({}), 3, true), 0, 0, 0, 0);
}

// Random decode-first batches: counts built from the generated request kinds, not the rule.
TEST(SplitDecodesAndPrefills, RandomDecodeFirstBatchesMatchGeneratedCounts) {
  std::mt19937 rng(1234);
  for (int iteration = 0; iteration < 2000; ++iteration) {
    const int64_t threshold = uniform(rng, 1, 4);
    const int64_t num_decodes = uniform(rng, 0, 6);
    const int64_t num_prefills = uniform(rng, 0, 5);
    const int64_t num_padding = uniform(rng, 0, 3);
    std::vector<Req> requests;
    int64_t decode_tokens = 0;
    int64_t prefill_tokens = 0;
    for (int64_t i = 0; i < num_decodes; ++i) {
      requests.push_back({uniform(rng, 0, 50), uniform(rng, 1, threshold)});
      decode_tokens += requests.back().query_len;
    }
    for (int64_t i = 0; i < num_prefills; ++i) {
      requests.push_back({uniform(rng, 0, 50), uniform(rng, threshold + 1, threshold + 30)});
      prefill_tokens += requests.back().query_len;
    }
    for (int64_t i = 0; i < num_padding; ++i) requests.push_back(kPaddingRequest);
    const auto batch = make_batch(requests, 4, uniform(rng, 0, 3));
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const auto split = spec::split_decodes_and_prefills(batch, threshold);
    // Padding requests (no tokens) join the decodes of a decode-only batch, else the prefills.
    if (num_prefills == 0) {
      expect_split(split, num_decodes + num_padding, 0, decode_tokens, 0);
    } else {
      expect_split(split, num_decodes, num_prefills + num_padding, decode_tokens, prefill_tokens);
    }
    EXPECT_NO_THROW(spec::check_decodes_first(batch, threshold));
  }
}

TEST(CheckDecodesFirst, RejectsADecodeAfterAPrefillNamingIt) {
  const auto batch = make_batch({{3, 1}, {0, 5}, {8, 6}, {9, 1}});
  try {
    spec::check_decodes_first(batch, 1);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("/batch/query_start_loc"), std::string::npos) << message;
    EXPECT_NE(message.find("request 3"), std::string::npos) << message;
    EXPECT_NE(message.find("request 1"), std::string::npos) << message;
    EXPECT_NE(message.find("decode_first_order"), std::string::npos) << message;
    EXPECT_NE(message.find("reorder_requests"), std::string::npos) << message;
  }
  // With a threshold of 6 every request is a decode.
  EXPECT_NO_THROW(spec::check_decodes_first(batch, 6));
}

TEST(CheckDecodesFirst, AcceptsTrailingPaddingAfterPrefills) {
  EXPECT_NO_THROW(spec::check_decodes_first(make_batch({{3, 1}, {0, 5}, kPaddingRequest, kPaddingRequest}), 1));
  EXPECT_NO_THROW(spec::check_decodes_first(make_batch({}), 1));
  // A zero-length request with context is no padding request: a decode after a prefill.
  EXPECT_THROW(spec::check_decodes_first(make_batch({{3, 1}, {0, 5}, {4, 0}}), 1), Error);
}

// --- decode_first_order + reorder_requests ------------------------------------------------------

// Token-row tag: request id (in the original order) and position within the request.
float tag_of(int64_t request, int64_t index) { return static_cast<float>(request * 256 + index); }
constexpr float kPaddingRowTag = -7.0f;

// Every element of token row t holds tag(t) + element index / 64, so a row that moved as a unit is
// recognisable.
Tensor tagged_tokens(const BatchDescription& batch, int64_t heads, int64_t dim) {
  const int64_t num_tokens = batch.num_tokens();
  Tensor tensor = Tensor::host(DType::kFloat32, {num_tokens, heads, dim});
  auto* data = tensor.data_as<float>();
  for (int64_t t = 0; t < num_tokens; ++t) {
    float tag = kPaddingRowTag;
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      if (t >= batch.query_start_loc[r] && t < batch.query_start_loc[r + 1]) tag = tag_of(r, t - batch.query_start_loc[r]);
    }
    for (int64_t e = 0; e < heads * dim; ++e) data[t * heads * dim + e] = tag + static_cast<float>(e) / 64.0f;
  }
  return tensor;
}

// Independent formulation of vLLM's region order: std::stable_sort on (region) with trailing
// padding requests appended unmoved.
std::vector<int64_t> expected_order(const std::vector<Req>& requests, int64_t threshold) {
  auto num_real = static_cast<int64_t>(requests.size());
  while (num_real > 0 && requests[num_real - 1].query_len == 0 && requests[num_real - 1].context_len == 0) --num_real;
  std::vector<int64_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  auto region = [&](int64_t r) {
    if (requests[r].query_len <= threshold) return 0;
    return requests[r].context_len > 0 ? 1 : 2;
  };
  std::stable_sort(order.begin(), order.begin() + num_real,
                   [&](int64_t a, int64_t b) { return region(a) < region(b); });
  return order;
}

TEST(DecodeFirstOrder, HandExample) {
  // prefill, decode, extend, decode, prefill, extend, padding
  const auto batch = make_batch({{0, 5}, {3, 1}, {7, 4}, {2, 1}, {0, 3}, {9, 2}, kPaddingRequest});
  const std::vector<int64_t> expected{1, 3, 2, 5, 0, 4, 6};
  EXPECT_EQ(spec::decode_first_order(batch, 1), expected);
}

TEST(ReorderRequests, RandomBatchesBecomeDecodeFirstAndKeepTheirRows) {
  std::mt19937 rng(99);
  for (int iteration = 0; iteration < 500; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const int64_t threshold = uniform(rng, 1, 3);
    std::vector<Req> requests;
    const int64_t num_real = uniform(rng, 0, 9);
    for (int64_t i = 0; i < num_real; ++i) {
      switch (uniform(rng, 0, 2)) {
        case 0: requests.push_back({uniform(rng, 0, 40), uniform(rng, 1, threshold)}); break;
        case 1: requests.push_back({uniform(rng, 1, 40), uniform(rng, threshold + 1, threshold + 12)}); break;
        default: requests.push_back({0, uniform(rng, threshold + 1, threshold + 12)}); break;
      }
    }
    const int64_t num_padding = uniform(rng, 0, 2);
    for (int64_t i = 0; i < num_padding; ++i) requests.push_back(kPaddingRequest);
    const auto num_reqs = static_cast<int64_t>(requests.size());
    const int64_t padding_tokens = uniform(rng, 0, 3);

    BatchDescription batch = make_batch(requests, 3, padding_tokens);
    batch.ssm_block_table = make_ssm_block_table(num_reqs, 2);
    std::vector<int32_t> accepted(static_cast<size_t>(num_reqs));
    std::iota(accepted.begin(), accepted.end(), 40);
    batch.num_accepted_tokens = IntArray::vector(accepted);
    IntArray mm = IntArray::filled({num_reqs, 2, 2}, 0);
    for (int64_t i = 0; i < mm.numel(); ++i) mm.values[i] = static_cast<int32_t>(7000 + i);
    batch.mm_prefix_range = mm;
    BatchInputs inputs;
    inputs.query = tagged_tokens(batch, 4, 3);
    inputs.key = tagged_tokens(batch, 2, 3);
    inputs.value = tagged_tokens(batch, 2, 3);
    const BatchDescription original = batch;

    const auto order = spec::decode_first_order(batch, threshold);
    ASSERT_EQ(order, expected_order(requests, threshold));
    spec::reorder_requests(order, batch, inputs);
    EXPECT_NO_THROW(spec::check_decodes_first(batch, threshold));

    ASSERT_EQ(batch.num_reqs(), num_reqs);
    EXPECT_EQ(batch.num_actual_tokens, original.num_actual_tokens);
    EXPECT_EQ(batch.query_start_loc[0], 0);
    for (int64_t i = 0; i < num_reqs; ++i) {
      const int64_t r = order[i];
      EXPECT_EQ(batch.query_len(i), original.query_len(r));
      EXPECT_EQ(batch.seq_len(i), original.seq_len(r));
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(batch.block_table.at(i, c), block_id(r, c));
      for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(batch.ssm_block_table->at(i, c), ssm_block_id(r, c));
      EXPECT_EQ((*batch.num_accepted_tokens)[i], 40 + r);
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(batch.mm_prefix_range->values[i * 4 + k], 7000 + r * 4 + k);
      for (int64_t j = 0; j < batch.query_len(i); ++j) {
        const int64_t t = batch.query_start_loc[i] + j;
        const int64_t old_t = original.query_start_loc[r] + j;
        EXPECT_EQ(batch.slot_mapping[t], slot_of_token(old_t));
        for (const Tensor* tensor : {&inputs.query, &inputs.key, &inputs.value}) {
          const int64_t width = tensor->size(1) * tensor->size(2);
          for (int64_t e = 0; e < width; ++e) {
            EXPECT_EQ(tensor->data_as<float>()[t * width + e], tag_of(r, j) + static_cast<float>(e) / 64.0f);
          }
        }
      }
    }
    // CUDA-graph padding token rows stay at the end.
    for (int64_t t = batch.num_actual_tokens; t < batch.num_tokens(); ++t) {
      EXPECT_EQ(batch.slot_mapping[t], -1);
      EXPECT_EQ(inputs.query.data_as<float>()[t * 12], kPaddingRowTag);
    }
  }
}

TEST(ReorderRequests, RejectsANonPermutation) {
  BatchDescription batch = make_batch({{3, 1}, {0, 4}});
  BatchInputs inputs;
  EXPECT_THROW(spec::reorder_requests({0, 0}, batch, inputs), Error);
  EXPECT_THROW(spec::reorder_requests({1}, batch, inputs), Error);
  EXPECT_THROW(spec::reorder_requests({0, 2}, batch, inputs), Error);
}

TEST(ReorderRequests, RejectsTokenTensorsOfTheWrongLength) {
  BatchDescription batch = make_batch({{0, 4}, {3, 1}});
  BatchInputs inputs;
  inputs.query = Tensor::host(DType::kFloat32, {3, 1, 1});  // the batch has 5 tokens
  EXPECT_THROW(spec::reorder_requests({1, 0}, batch, inputs), Error);
}

}  // namespace
}  // namespace hybridtb::testing
