// Builder metadata as plain data: flatten/unflatten are inverse, differences name the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridtb/error.h"
#include "hybridtb/metadata.h"

namespace hybridtb {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

HybridMetadata full_metadata() {
  HybridMetadata m;
  m.attention = {.num_actual_tokens = 7, .max_query_len = 5, .max_seq_len = 40, .seq_threshold_3d = 16,
                 .num_par_softmax_segments = 16, .head_size_padded = 128, .use_3d_path = 0};
  m.mamba.emplace();
  m.mamba->num_prefills = 1;
  m.mamba->num_prefill_tokens = 5;
  m.mamba->num_decodes = 2;
  m.mamba->num_decode_tokens = 2;
  m.mamba->num_reqs = 3;
  m.mamba->query_start_loc_p = IntArray::vector({0, 5});
  m.mamba->has_initial_states_p = IntArray::vector({1});
  m.mamba->state_indices_tensor_p = IntArray::vector({9});
  m.mamba->state_indices_tensor_d = IntArray({2, 1}, {3, 4});
  m.mamba->block_idx_last_scheduled_token = IntArray::vector({0, 1, 2});
  m.mamba->seq_lens = IntArray::vector({10, 20, 40});
  CausalConv1dMetadata conv;
  conv.nums = IntArray::vector({1});
  conv.tot = 1;
  conv.mlist = IntArray::vector({0});
  conv.offsetlist = IntArray::vector({0});
  conv.batch_ptr = IntArray::vector({0, -1});
  conv.token_chunk_offset_ptr = IntArray::vector({0, -1});
  m.mamba->causal_conv1d = conv;
  return m;
}

TEST(MetadataFields, FlattenThenUnflattenIsIdentity) {
  const HybridMetadata m = full_metadata();
  const HybridMetadata back = unflatten(flatten(m));
  EXPECT_TRUE(back == m) << ::testing::PrintToString(metadata_differences(m, back));
}

TEST(MetadataFields, AbsentOptionalsAreLeftOutAndStayAbsent) {
  HybridMetadata m = full_metadata();
  m.mamba->causal_conv1d.reset();
  m.mamba->query_start_loc_p.reset();
  for (const MetadataField& f : flatten(m)) {
    EXPECT_EQ(f.name.find("causal_conv1d"), std::string::npos);
    EXPECT_NE(f.name, "mamba/query_start_loc_p");
  }
  const HybridMetadata back = unflatten(flatten(m));
  EXPECT_FALSE(back.mamba->causal_conv1d.has_value());
  EXPECT_FALSE(back.mamba->query_start_loc_p.has_value());
}

TEST(MetadataFields, DifferencesNameTheField) {
  const HybridMetadata a = full_metadata();
  HybridMetadata b = a;
  b.attention.use_3d_path = 1;
  b.mamba->state_indices_tensor_d.at(1, 0) = -1;
  b.mamba->has_initial_states_p.reset();
  EXPECT_THAT(metadata_differences(a, b),
              ElementsAre(HasSubstr("attention/use_3d_path: 0 vs 1"), HasSubstr("mamba/has_initial_states_p"),
                          HasSubstr("mamba/state_indices_tensor_d")));
  EXPECT_FALSE(a == b);
}

TEST(MetadataFields, EncoderOnlyMetadataHasNoMambaPart) {
  HybridMetadata m = full_metadata();
  m.mamba.reset();
  for (const MetadataField& f : flatten(m)) EXPECT_EQ(f.name.rfind("mamba/", 0), std::string::npos) << f.name;
  EXPECT_FALSE(unflatten(flatten(m)).mamba.has_value());
  EXPECT_FALSE(m == full_metadata());
}

TEST(MetadataFields, UnknownOrMissingFieldsAreErrors) {
  std::vector<MetadataField> fields = flatten(full_metadata());
  fields.push_back({"mamba/not_a_field", int64_t{3}});
  EXPECT_THROW(unflatten(fields), Error);
  fields = flatten(full_metadata());
  fields.erase(fields.begin());  // attention/num_actual_tokens
  try {
    unflatten(fields);
    ADD_FAILURE() << "missing scalar accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("attention/num_actual_tokens"));
  }
}

}  // namespace
}  // namespace hybridtb
