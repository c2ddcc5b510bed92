// Batch and config validation: every broken precondition is reported with the field it concerns.
// Each test corrupts one field of an otherwise valid synthetic batch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridtb/batch.h"
#include "hybridtb/error.h"
#include "hybridtb/synthetic.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

AttentionConfig small_config() {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 0.125;
  c.dtype = DType::kBFloat16;
  return c;
}

BatchFile valid_batch() {
  return make_synthetic_batch(small_config(), {}, {{40, 1}, {0, 20}, {17, 5}}, SyntheticOptions{.seed = 1});
}

// Runs full validation and returns the error message ("" if valid).
std::string validation_error(const BatchFile& f) {
  try {
    validate(f.config, f.batch, f.inputs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Validation, SyntheticBatchIsValid) { EXPECT_EQ(validation_error(valid_batch()), ""); }

TEST(Validation, ConfigFieldsAreRangeChecked) {
  auto expect_error = [](auto mutate, const char* field) {
    AttentionConfig c = small_config();
    mutate(c);
    try {
      validate(c);
      ADD_FAILURE() << "no error for " << field;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(field));
    }
  };
  expect_error([](AttentionConfig& c) { c.num_kv_heads = 3; }, "num_kv_heads");
  expect_error([](AttentionConfig& c) { c.block_size = 24; }, "block_size");
  expect_error([](AttentionConfig& c) { c.head_size = 16; }, "head_size");
  expect_error([](AttentionConfig& c) { c.scale = 0; }, "scale");
  expect_error([](AttentionConfig& c) { c.sliding_window = -1; }, "sliding_window");
  expect_error([](AttentionConfig& c) { c.logits_soft_cap = -2; }, "logits_soft_cap");
  expect_error([](AttentionConfig& c) { c.dtype = DType::kFloat8E4M3; }, "dtype");
  expect_error([](AttentionConfig& c) { c.sinks = std::vector<float>(3, 0.f); }, "sinks");
  expect_error([](AttentionConfig& c) { c.alibi_slopes = std::vector<float>(5, 0.f); }, "alibi_slopes");
  expect_error(
      [](AttentionConfig& c) {
        c.attn_type = AttnType::kEncoderOnly;
        c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
      },
      "encoder_only");
}

TEST(Validation, QueryStartLocMustBeMonotonicAndEndAtNumActualTokens) {
  BatchFile f = valid_batch();
  f.batch.query_start_loc[1] = 30;  // [0, 30, 21, 26]
  EXPECT_THAT(validation_error(f), HasSubstr("query_start_loc must be non-decreasing"));
  f = valid_batch();
  f.batch.num_actual_tokens -= 1;
  EXPECT_THAT(validation_error(f), HasSubstr("query_start_loc[R]"));
}

TEST(Validation, SeqLenMustCoverQueryLen) {
  BatchFile f = valid_batch();
  f.batch.seq_lens[1] = 3;  // query_len is 20
  EXPECT_THAT(validation_error(f), HasSubstr("/batch/seq_lens[1]"));
}

TEST(Validation, BlockIdsAndSlotsMustBeInRangeAndConsistent) {
  BatchFile f = valid_batch();
  f.batch.block_table.at(0, 1) = static_cast<int32_t>(f.inputs.kv_cache.size(0));
  EXPECT_THAT(validation_error(f), HasSubstr("/batch/block_table[0, 1]"));
  f = valid_batch();
  f.batch.slot_mapping[2] += 1;
  EXPECT_THAT(validation_error(f), HasSubstr("/batch/slot_mapping[2]"));
}

TEST(Validation, PaddingRowsMustHavePadSlot) {
  BatchFile f = make_synthetic_batch(small_config(), {}, {{3, 1}}, SyntheticOptions{.padding_tokens = 3});
  EXPECT_EQ(validation_error(f), "");
  f.batch.slot_mapping[2] = 5;
  EXPECT_THAT(validation_error(f), HasSubstr("padding row"));
}

TEST(Validation, PaddingRequestsMustBeTrailingWithZeroSeqLen) {
  BatchFile f = make_synthetic_batch(small_config(), {}, {{3, 1}, {4, 1}}, SyntheticOptions{.padding_requests = 2});
  EXPECT_EQ(validation_error(f), "");
  f.batch.seq_lens[3] = 4;
  EXPECT_THAT(validation_error(f), HasSubstr("padding request"));
}

TEST(Validation, TensorShapesAndDtypesMustMatchTheConfig) {
  BatchFile f = valid_batch();
  f.inputs.key = Tensor::host(DType::kBFloat16, {f.batch.num_tokens(), 3, 32});
  EXPECT_THAT(validation_error(f), HasSubstr("/inputs/key: shape"));
  f = valid_batch();
  f.inputs.query = Tensor::host(DType::kFloat32, f.inputs.query.shape());
  EXPECT_THAT(validation_error(f), HasSubstr("/inputs/query: dtype float32"));
  f = valid_batch();
  f.config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  EXPECT_THAT(validation_error(f), HasSubstr("/inputs/kv_cache: dtype"));
}

TEST(Validation, ScaleCachesRequiredExactlyForPerTokenHeadModes) {
  AttentionConfig c = small_config();
  c.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  BatchFile f = make_synthetic_batch(c, {}, {{20, 2}}, SyntheticOptions{});
  EXPECT_EQ(validation_error(f), "");
  f.inputs.v_scale_cache = Tensor();
  EXPECT_THAT(validation_error(f), HasSubstr("missing /inputs/v_scale_cache"));
}

TEST(Validation, EncoderOnlyNeedsSeqLenEqualToQueryLen) {
  AttentionConfig c = small_config();
  c.attn_type = AttnType::kEncoderOnly;
  BatchFile f = make_synthetic_batch(c, {}, {{0, 7}, {0, 3}}, SyntheticOptions{});
  EXPECT_EQ(validation_error(f), "");
  f.batch.seq_lens[0] = 9;
  EXPECT_THAT(validation_error(f), HasSubstr("encoder_only"));
}

TEST(Validation, OptionalArraysMustHaveOneRowPerRequest) {
  BatchFile f = valid_batch();
  f.batch.num_accepted_tokens = IntArray::vector({1, 1});
  EXPECT_THAT(validation_error(f), HasSubstr("/batch/num_accepted_tokens"));
  f = valid_batch();
  f.batch.mm_prefix_range = IntArray::filled({3, 1, 3}, 0);
  EXPECT_THAT(validation_error(f), HasSubstr("/batch/mm_prefix_range"));
}

}  // namespace
}  // namespace hybridtb
