#include "batch_checks.h"

#include <gtest/gtest.h>

namespace hybridtb::testing {

namespace {
void expect_same_tensors(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                         const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, tensor] : a) {
    ASSERT_TRUE(b.count(name) == 1) << what << " " << name;
    EXPECT_TRUE(bitwise_equal(tensor, b.at(name))) << what << " " << name;
  }
}
}  // namespace

void expect_same_batch_inputs(const BatchFile& a, const BatchFile& b) {
  EXPECT_EQ(a.batch.query_start_loc, b.batch.query_start_loc);
  EXPECT_EQ(a.batch.seq_lens, b.batch.seq_lens);
  EXPECT_EQ(a.batch.block_table, b.batch.block_table);
  EXPECT_EQ(a.batch.slot_mapping, b.batch.slot_mapping);
  EXPECT_EQ(a.batch.num_actual_tokens, b.batch.num_actual_tokens);
  EXPECT_EQ(a.batch.mm_prefix_range, b.batch.mm_prefix_range);
  EXPECT_EQ(a.batch.ssm_block_table, b.batch.ssm_block_table);
  EXPECT_EQ(a.batch.num_accepted_tokens, b.batch.num_accepted_tokens);
  EXPECT_EQ(a.config.sinks, b.config.sinks);
  EXPECT_EQ(a.config.ssm_params, b.config.ssm_params);
  EXPECT_EQ(a.config.layer_kind, b.config.layer_kind);
  EXPECT_TRUE(bitwise_equal(a.inputs.query, b.inputs.query));
  EXPECT_TRUE(bitwise_equal(a.inputs.key, b.inputs.key));
  EXPECT_TRUE(bitwise_equal(a.inputs.value, b.inputs.value));
  EXPECT_TRUE(bitwise_equal(a.inputs.kv_cache, b.inputs.kv_cache));
  EXPECT_TRUE(bitwise_equal(a.inputs.k_scale_cache, b.inputs.k_scale_cache));
  EXPECT_TRUE(bitwise_equal(a.inputs.v_scale_cache, b.inputs.v_scale_cache));
  EXPECT_EQ(a.inputs.k_scale, b.inputs.k_scale);
  EXPECT_EQ(a.inputs.v_scale, b.inputs.v_scale);
  expect_same_tensors(a.inputs.ssm_state, b.inputs.ssm_state, "/inputs/ssm");
  expect_same_tensors(a.inputs.weights, b.inputs.weights, "/weights");
  expect_same_tensors(a.inputs.linear_inputs, b.inputs.linear_inputs, "/inputs (linear layer)");
}

}  // namespace hybridtb::testing
