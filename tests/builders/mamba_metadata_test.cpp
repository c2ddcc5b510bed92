// build_mamba_metadata, mamba_get_block_table_tensor, compute_causal_conv1d_metadata,
// update_block_table and build_hybrid_metadata (harness/spec/src/mamba_metadata_builder.cpp) against
// vLLM's worked example (notes §3.5), small hand-computed batches, and, on seeded random batches,
// an independent per-request formulation of every field.
// Run: ctest --test-dir build -L builders
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "builder_test_batches.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"

namespace hybridtb::testing {
namespace {

IntArray vec(std::vector<int32_t> values) { return IntArray::vector(std::move(values)); }
IntArray mat(int64_t rows, int64_t cols, std::vector<int32_t> values) { return IntArray({rows, cols}, std::move(values)); }

// Field-by-field comparison through the library's flattened view; prints every difference.
void expect_same_mamba(const MambaAttentionMetadata& actual, const MambaAttentionMetadata& expected) {
  HybridMetadata a;
  HybridMetadata b;
  a.mamba = actual;
  b.mamba = expected;
  const auto differences = metadata_differences(a, b);
  std::string report;
  for (const auto& line : differences) report += line + "\n";
  EXPECT_TRUE(differences.empty()) << "actual vs expected:\n" << report;
}

// --- compute_causal_conv1d_metadata --------------------------------------------------------------

// Per-token formulation: walk every prefill token; a new 8-token program starts at each token whose
// index within its request is a multiple of 8.
CausalConv1dMetadata expected_conv1d(const IntArray& query_start_loc_p) {
  CausalConv1dMetadata expected;
  const int64_t num_prefills = query_start_loc_p.numel() - 1;
  std::vector<int32_t> nums(static_cast<size_t>(num_prefills), 0);
  std::vector<int32_t> mlist;
  std::vector<int32_t> offsets;
  for (int64_t i = 0; i < num_prefills; ++i) {
    for (int64_t token = query_start_loc_p[i]; token < query_start_loc_p[i + 1]; ++token) {
      const int64_t index = token - query_start_loc_p[i];
      if (index % 8 == 0) {
        ++nums[i];
        mlist.push_back(static_cast<int32_t>(i));
        offsets.push_back(static_cast<int32_t>(index / 8));
      }
    }
  }
  expected.block_m = 8;
  expected.nums = vec(nums);
  expected.tot = static_cast<int64_t>(mlist.size());
  const int64_t capacity = 2 * std::max<int64_t>(1024, expected.tot);
  expected.batch_ptr = IntArray::filled({capacity}, -1);
  expected.token_chunk_offset_ptr = IntArray::filled({capacity}, -1);
  for (size_t p = 0; p < mlist.size(); ++p) {
    expected.batch_ptr.values[p] = mlist[p];
    expected.token_chunk_offset_ptr.values[p] = offsets[p];
  }
  expected.mlist = vec(mlist);
  expected.offsetlist = vec(offsets);
  return expected;
}

void expect_same_conv1d(const CausalConv1dMetadata& actual, const CausalConv1dMetadata& expected) {
  EXPECT_EQ(actual.block_m, expected.block_m);
  EXPECT_EQ(actual.nums, expected.nums) << actual.nums.describe();
  EXPECT_EQ(actual.tot, expected.tot);
  EXPECT_EQ(actual.mlist, expected.mlist) << actual.mlist.describe();
  EXPECT_EQ(actual.offsetlist, expected.offsetlist) << actual.offsetlist.describe();
  EXPECT_EQ(actual.batch_ptr, expected.batch_ptr) << actual.batch_ptr.describe();
  EXPECT_EQ(actual.token_chunk_offset_ptr, expected.token_chunk_offset_ptr)
      << actual.token_chunk_offset_ptr.describe();
}

TEST(CausalConv1dMetadata, VllmWorkedExample) {
  const auto metadata = spec::compute_causal_conv1d_metadata(vec({0, 5, 6, 22}));
  EXPECT_EQ(metadata.block_m, 8);
  EXPECT_EQ(metadata.nums, vec({1, 1, 2}));
  EXPECT_EQ(metadata.tot, 4);
  EXPECT_EQ(metadata.mlist, vec({0, 1, 2, 2}));
  EXPECT_EQ(metadata.offsetlist, vec({0, 0, 0, 1}));
  ASSERT_EQ(metadata.batch_ptr.numel(), 2048);
  ASSERT_EQ(metadata.token_chunk_offset_ptr.numel(), 2048);
  EXPECT_EQ(metadata.batch_ptr.rows(0, 4), vec({0, 1, 2, 2}));
  EXPECT_EQ(metadata.token_chunk_offset_ptr.rows(0, 4), vec({0, 0, 0, 1}));
  for (int64_t i = 4; i < 2048; ++i) {
    ASSERT_EQ(metadata.batch_ptr[i], kPadSlotId);
    ASSERT_EQ(metadata.token_chunk_offset_ptr[i], kPadSlotId);
  }
}

TEST(CausalConv1dMetadata, ManyProgramsGrowTheBuffers) {
  // 3 × 4000 tokens = 1500 programs > 1024: the buffers are 2 × 1500 long.
  const auto metadata = spec::compute_causal_conv1d_metadata(vec({0, 4000, 8000, 12000}));
  EXPECT_EQ(metadata.tot, 1500);
  EXPECT_EQ(metadata.batch_ptr.numel(), 3000);
  EXPECT_EQ(metadata.batch_ptr[1499], 2);
  EXPECT_EQ(metadata.token_chunk_offset_ptr[1499], 499);
  EXPECT_EQ(metadata.batch_ptr[1500], kPadSlotId);
}

TEST(CausalConv1dMetadata, EdgeCases) {
  expect_same_conv1d(spec::compute_causal_conv1d_metadata(vec({0})), expected_conv1d(vec({0})));
  // A zero-length request gets no program; 8 and 9 tokens straddle the chunk boundary.
  expect_same_conv1d(spec::compute_causal_conv1d_metadata(vec({0, 0, 8, 17})), expected_conv1d(vec({0, 0, 8, 17})));
  EXPECT_THROW(spec::compute_causal_conv1d_metadata(vec({0, 5, 3})), Error);
  EXPECT_THROW(spec::compute_causal_conv1d_metadata(IntArray::filled({0}, 0)), Error);
}

TEST(CausalConv1dMetadata, RandomAgainstPerTokenLoop) {
  std::mt19937 rng(31);
  for (int iteration = 0; iteration < 500; ++iteration) {
    std::vector<int32_t> starts{0};
    const int64_t num_prefills = uniform(rng, 0, 12);
    for (int64_t i = 0; i < num_prefills; ++i) {
      starts.push_back(static_cast<int32_t>(starts.back() + uniform(rng, 0, uniform(rng, 0, 1) ? 40 : 900)));
    }
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    expect_same_conv1d(spec::compute_causal_conv1d_metadata(vec(starts)), expected_conv1d(vec(starts)));
  }
}

// --- mamba_get_block_table_tensor ---------------------------------------------------------------

TEST(MambaGetBlockTableTensor, NoneAndAllPassTheTableThrough) {
  const IntArray table = mat(2, 3, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(spec::mamba_get_block_table_tensor(table, vec({5, 9}), 4, 0, MambaCacheMode::kNone), table);
  EXPECT_EQ(spec::mamba_get_block_table_tensor(table, vec({5, 9}), 4, 0, MambaCacheMode::kAll), table);
}

TEST(MambaGetBlockTableTensor, AlignGathersTheBlockOfTheLastToken) {
  // Block size 4: seq_len 4 → last token at position 3 → block 0; 5 → block 1; 12 → block 2;
  // 0 (padding) → clamped to block 0.
  const IntArray table = mat(4, 4, {10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33, 40, 41, 42, 43});
  const IntArray seq_lens = vec({4, 5, 12, 0});
  EXPECT_EQ(spec::mamba_get_block_table_tensor(table, seq_lens, 4, 0, MambaCacheMode::kAlign),
            mat(4, 1, {10, 21, 32, 40}));
  EXPECT_EQ(spec::mamba_get_block_table_tensor(table, seq_lens, 4, 1, MambaCacheMode::kAlign),
            mat(4, 2, {10, 11, 21, 22, 32, 33, 40, 41}));
  // Two speculative blocks after block 2 would need column 4.
  EXPECT_THROW(spec::mamba_get_block_table_tensor(table, seq_lens, 4, 2, MambaCacheMode::kAlign), Error);
}

// --- build_mamba_metadata: hand-computed batches ----------------------------------------------

TEST(MambaMetadata, PrefixCachingBlockIndicesByHand) {
  // Mamba block size 4. One decode (7 computed + 1), then prefills of 6 tokens with 0, 3, 4 and 5
  // tokens computed. Positions: last computed token nc-1, first scheduled nc, last scheduled
  // seq_len-1; block = position / 4 (a fresh request's "last computed" block is clamped to 0).
  //   nc 7, seq 8 : last computed pos 6 → 1, last scheduled pos 7 → 1
  //   nc 0, seq 6 : last computed → 0 (clamped), first scheduled pos 0 → 0, last scheduled pos 5 → 1
  //   nc 3, seq 9 : pos 2 → 0, pos 3 → 0, pos 8 → 2
  //   nc 4, seq 10: pos 3 → 0, pos 4 → 1, pos 9 → 2
  //   nc 5, seq 11: pos 4 → 1, pos 5 → 1, pos 10 → 2
  const auto batch = make_batch({{7, 1}, {0, 6}, {3, 6}, {4, 6}, {5, 6}}, 4);
  const auto metadata = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kAll, 4),
                                                        builder_config(CudaGraphMode::kNone), batch);
  MambaAttentionMetadata expected;
  expected.num_prefills = 4;
  expected.num_prefill_tokens = 24;
  expected.num_decodes = 1;
  expected.num_decode_tokens = 1;
  expected.num_reqs = 5;
  expected.query_start_loc_p = vec({0, 6, 12, 18, 24});
  expected.has_initial_states_p = vec({0, 1, 1, 1});
  expected.state_indices_tensor_d = mat(1, 4, {1000, 1001, 1002, 1003});
  expected.state_indices_tensor_p =
      mat(4, 4, {2000, 2001, 2002, 2003, 3000, 3001, 3002, 3003, 4000, 4001, 4002, 4003, 5000, 5001, 5002, 5003});
  expected.block_idx_last_scheduled_token = vec({1, 1, 2, 2, 2});
  expected.block_idx_first_scheduled_token_p = vec({0, 0, 1, 1});
  expected.block_idx_last_computed_token = vec({1, 0, 0, 0, 1});
  expected.num_computed_tokens_p = vec({0, 3, 4, 5});
  expected.seq_lens = vec({8, 6, 9, 10, 11});
  expected.causal_conv1d = expected_conv1d(vec({0, 6, 12, 18, 24}));
  expect_same_mamba(metadata, expected);
}

TEST(MambaMetadata, AlignModeByHand) {
  // Block size 4; the state block is the one holding the last token (seq_len − 1) / 4. The padding
  // request after the prefills is a prefill (positional rule) and gets PAD_SLOT_ID (our rule).
  const auto batch = make_batch({{7, 1}, {2, 1}, {0, 6}, {5, 6}, kPaddingRequest}, 4);
  const auto metadata = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kAlign, 4),
                                                        builder_config(CudaGraphMode::kFull), batch);
  EXPECT_EQ(metadata.num_decodes, 2);
  EXPECT_EQ(metadata.num_prefills, 3);
  EXPECT_EQ(metadata.num_decode_tokens, 2);
  EXPECT_EQ(metadata.num_prefill_tokens, 12);
  EXPECT_EQ(metadata.state_indices_tensor_d, mat(2, 1, {1001, 2000}));  // seq 8 → block 1, seq 3 → 0
  EXPECT_EQ(metadata.state_indices_tensor_p, vec({3001, 4002, -1}));  // seq 6 → 1, 11 → 2, padding → −1
  EXPECT_EQ(metadata.query_start_loc_p, vec({0, 6, 12, 12}));
  EXPECT_EQ(metadata.has_initial_states_p, vec({0, 1, 0}));
  EXPECT_EQ(metadata.cudagraph_padded, 0);  // a prefill is present
  EXPECT_FALSE(metadata.block_idx_last_scheduled_token.has_value());
  EXPECT_FALSE(metadata.num_computed_tokens_p.has_value());
}

TEST(MambaMetadata, NoneModeUsesColumnZeroAndCutsSpecColumns) {
  const auto batch = make_batch({{7, 1}, {0, 6}}, 3);
  const auto none = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0),
                                                    builder_config(CudaGraphMode::kNone), batch);
  EXPECT_EQ(none.state_indices_tensor_d, mat(1, 1, {1000}));
  EXPECT_EQ(none.state_indices_tensor_p, vec({2000}));
  EXPECT_FALSE(none.num_accepted_tokens.has_value());
  EXPECT_FALSE(none.query_start_loc_d.has_value());

  // Speculative decoding (2 tokens): the decode rows keep 1 + 2 columns.
  BatchDescription spec = make_batch({{7, 3}, {0, 6}}, 3);
  spec.num_accepted_tokens = vec({2, 1});
  const auto with_spec = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2),
                                                         builder_config(CudaGraphMode::kNone), spec);
  EXPECT_EQ(with_spec.state_indices_tensor_d, mat(1, 3, {1000, 1001, 1002}));
  EXPECT_EQ(with_spec.state_indices_tensor_p, vec({2000}));
  // Too few columns for the speculative blocks.
  BatchDescription narrow = make_batch({{7, 3}, {0, 6}}, 2);
  narrow.num_accepted_tokens = vec({2, 1});
  EXPECT_THROW(spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2),
                                               builder_config(CudaGraphMode::kNone), narrow),
               Error);
}

TEST(MambaMetadata, UsesTheSsmBlockTableWhenPresent) {
  BatchDescription batch = make_batch({{7, 1}, {0, 6}}, 3);
  batch.ssm_block_table = make_ssm_block_table(2, 2);
  const auto metadata = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0),
                                                        builder_config(CudaGraphMode::kNone), batch);
  EXPECT_EQ(metadata.state_indices_tensor_d, mat(1, 1, {ssm_block_id(0, 0)}));
  EXPECT_EQ(metadata.state_indices_tensor_p, vec({ssm_block_id(1, 0)}));
}

TEST(MambaMetadata, RejectsAnUnorderedBatchNamingTheRequest) {
  const auto batch = make_batch({{0, 5}, {7, 1}});
  try {
    spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0), builder_config(CudaGraphMode::kNone), batch);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("request 1"), std::string::npos) << message;
    EXPECT_NE(message.find("decode_first_order"), std::string::npos) << message;
  }
}

// --- CUDA-graph padding -------------------------------------------------------------------------

TEST(MambaCudaGraphPadding, PaddingRequestsGetPadSlotIdAndRealDecodesKeepTheirIndices) {
  const auto batch = make_batch({{5, 1}, {9, 1}, kPaddingRequest, kPaddingRequest}, 2, 2);
  const auto config = mamba_config(MambaCacheMode::kNone, 0);
  const auto padded = spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFull, {1, 2, 4}), batch);
  EXPECT_EQ(padded.cudagraph_padded, 1);
  EXPECT_EQ(padded.num_decodes, 4);  // vLLM counts the padding requests as decodes
  EXPECT_EQ(padded.num_decode_tokens, 2);
  EXPECT_EQ(padded.state_indices_tensor_d, mat(4, 1, {1000, 2000, -1, -1}));
  EXPECT_EQ(padded.state_indices_tensor_p, IntArray::filled({0}, 0));
  EXPECT_FALSE(padded.query_start_loc_p.has_value());
  EXPECT_FALSE(padded.causal_conv1d.has_value());

  // Without full graphs nothing is padded by the CUDA-graph step, but the padding requests still
  // get PAD_SLOT_ID (our deliberate difference from vLLM).
  for (const auto mode : {CudaGraphMode::kNone, CudaGraphMode::kPiecewise}) {
    const auto unpadded = spec::build_mamba_metadata(config, builder_config(mode, {1, 2, 4}), batch);
    EXPECT_EQ(unpadded.cudagraph_padded, 0);
    EXPECT_EQ(unpadded.state_indices_tensor_d, mat(4, 1, {1000, 2000, -1, -1}));
  }
}

TEST(MambaCudaGraphPadding, NotAppliedWithAPrefillOrTooManyDecodes) {
  const auto config = mamba_config(MambaCacheMode::kNone, 0);
  const auto mixed = spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFull),
                                                     make_batch({{5, 1}, {0, 4}}));
  EXPECT_EQ(mixed.cudagraph_padded, 0);
  EXPECT_EQ(mixed.state_indices_tensor_d, mat(1, 1, {1000}));

  const auto three = make_batch({{5, 1}, {6, 1}, {7, 1}});
  // decode_cudagraph_max_bs = min(max_num_seqs, largest capture size).
  EXPECT_EQ(spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFull, {1, 2, 4}, 2), three)
                .cudagraph_padded,
            0);
  EXPECT_EQ(spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFull, {1, 2}, 256), three)
                .cudagraph_padded,
            0);
  EXPECT_EQ(spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFull, {1, 2, 4}, 3), three)
                .cudagraph_padded,
            1);
}

TEST(MambaCudaGraphPadding, ModeAllCutsBlockIndicesToTheDecodeTokens) {
  // Block size 4: nc 5, seq 6 → last computed 1, last scheduled 1; nc 8, seq 9 → 1, 2;
  // the padding request (seq 0) → 0, 0.
  const auto batch = make_batch({{5, 1}, {8, 1}, kPaddingRequest}, 3, 1);
  const auto config = mamba_config(MambaCacheMode::kAll, 4);
  const auto padded = spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kFullDecodeOnly), batch);
  EXPECT_EQ(padded.cudagraph_padded, 1);
  EXPECT_EQ(padded.block_idx_last_scheduled_token, vec({1, 2}));
  EXPECT_EQ(padded.block_idx_last_computed_token, vec({1, 1}));
  EXPECT_EQ(padded.state_indices_tensor_d, mat(3, 3, {1000, 1001, 1002, 2000, 2001, 2002, -1, -1, -1}));

  const auto unpadded = spec::build_mamba_metadata(config, builder_config(CudaGraphMode::kPiecewise), batch);
  EXPECT_EQ(unpadded.cudagraph_padded, 0);
  EXPECT_EQ(unpadded.block_idx_last_scheduled_token, vec({1, 2, 0}));
  EXPECT_EQ(unpadded.block_idx_last_computed_token, vec({1, 1, 0}));
  EXPECT_EQ(unpadded.state_indices_tensor_d, padded.state_indices_tensor_d);
}

// --- speculative decoding -----------------------------------------------------------------------

TEST(MambaSpecDecode, ThresholdIsOnePlusNumSpec) {
  BatchDescription batch = make_batch({{10, 3}, {5, 1}, {7, 2}, {0, 9}}, 3);
  batch.num_accepted_tokens = vec({3, 1, 2, 1});
  const auto metadata = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2),
                                                        builder_config(CudaGraphMode::kFull), batch);
  EXPECT_EQ(metadata.num_decodes, 3);
  EXPECT_EQ(metadata.num_prefills, 1);
  EXPECT_EQ(metadata.num_decode_tokens, 6);
  EXPECT_EQ(metadata.num_prefill_tokens, 9);
  EXPECT_EQ(metadata.query_start_loc_d, vec({0, 3, 4, 6}));
  EXPECT_EQ(metadata.num_accepted_tokens, vec({3, 1, 2}));
  EXPECT_EQ(metadata.state_indices_tensor_d, mat(3, 3, {1000, 1001, 1002, 2000, 2001, 2002, 3000, 3001, 3002}));
  EXPECT_EQ(metadata.state_indices_tensor_p, vec({4000}));
  EXPECT_EQ(metadata.query_start_loc_p, vec({0, 9}));
}

TEST(MambaSpecDecode, MissingNumAcceptedTokensIsAnError) {
  const auto batch = make_batch({{10, 1}, {5, 1}, {0, 9}}, 3);
  try {
    spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2), builder_config(CudaGraphMode::kNone),
                                    batch);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/batch/num_accepted_tokens"), std::string::npos) << error.what();
  }
  // No decodes: nothing needs it.
  const auto prefills = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2),
                                                        builder_config(CudaGraphMode::kNone), make_batch({{0, 9}}, 3));
  EXPECT_EQ(prefills.num_prefills, 1);
  EXPECT_FALSE(prefills.num_accepted_tokens.has_value());
}

TEST(MambaSpecDecode, ModeAllIsNotSupported) {
  BatchDescription batch = make_batch({{10, 1}}, 3);
  batch.num_accepted_tokens = vec({1});
  EXPECT_THROW(spec::build_mamba_metadata(mamba_config(MambaCacheMode::kAll, 4, 1),
                                               builder_config(CudaGraphMode::kNone), batch),
               NotSupported);
}

TEST(MambaSpecDecode, PaddedDecodeOnlyBatch) {
  BatchDescription batch = make_batch({{10, 3}, {4, 2}, kPaddingRequest}, 3, 1);
  batch.num_accepted_tokens = vec({3, 2, 1});
  const auto metadata = spec::build_mamba_metadata(mamba_config(MambaCacheMode::kNone, 0, 2),
                                                        builder_config(CudaGraphMode::kFull), batch);
  EXPECT_EQ(metadata.cudagraph_padded, 1);
  EXPECT_EQ(metadata.num_decodes, 3);
  EXPECT_EQ(metadata.query_start_loc_d, vec({0, 3, 5, 5}));
  EXPECT_EQ(metadata.num_accepted_tokens, vec({3, 2, 1}));
  EXPECT_EQ(metadata.state_indices_tensor_d, mat(3, 3, {1000, 1001, 1002, 2000, 2001, 2002, -1, -1, -1}));
}

// vLLM's step pads rows [num_decodes, num_reqs) when the metadata counts fewer decodes than
// requests (older split rules did): state indices with PAD_SLOT_ID, num_accepted_tokens with 1.
// split_decodes_and_prefills never produces that, so it is reached through update_block_table.
TEST(MambaSpecDecode, LiteralCudaGraphStepPadsNumAcceptedTokensWithOne) {
  MambaAttentionMetadata metadata;
  metadata.num_decodes = 2;
  metadata.num_decode_tokens = 5;
  metadata.num_reqs = 4;
  metadata.seq_lens = vec({9, 7});
  metadata.query_start_loc_d = vec({0, 3, 5});
  metadata.num_accepted_tokens = vec({2, 3});
  const auto updated = spec::update_block_table(mamba_config(MambaCacheMode::kNone, 0, 1),
                                                     builder_config(CudaGraphMode::kFull), metadata,
                                                     mat(2, 2, {11, 12, 21, 22}));
  EXPECT_EQ(updated.cudagraph_padded, 1);
  EXPECT_EQ(updated.state_indices_tensor_d, mat(4, 2, {11, 12, 21, 22, -1, -1, -1, -1}));
  EXPECT_EQ(updated.num_accepted_tokens, vec({2, 3, 1, 1}));
  EXPECT_EQ(updated.query_start_loc_d, vec({0, 3, 5}));
}

// --- empty batch, hybrid builder, update_block_table -------------------------------------------

TEST(MambaMetadata, EmptyBatch) {
  for (const auto mode : {MambaCacheMode::kNone, MambaCacheMode::kAlign, MambaCacheMode::kAll}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    const auto metadata =
        spec::build_mamba_metadata(mamba_config(mode, 4), builder_config(CudaGraphMode::kFull), make_batch({}, 5));
    EXPECT_EQ(metadata.num_reqs, 0);
    EXPECT_EQ(metadata.num_decodes, 0);
    EXPECT_EQ(metadata.num_prefills, 0);
    EXPECT_EQ(metadata.num_decode_tokens, 0);
    EXPECT_EQ(metadata.num_prefill_tokens, 0);
    const int64_t columns = mode == MambaCacheMode::kAll ? 5 : 1;
    EXPECT_EQ(metadata.state_indices_tensor_d, IntArray::matrix(0, columns));
    EXPECT_EQ(metadata.seq_lens.numel(), 0);
    EXPECT_FALSE(metadata.causal_conv1d.has_value());
    EXPECT_EQ(metadata.cudagraph_padded, 1);  // 0 decodes fit every graph
  }
  // A shapeless block table is fine for an empty batch.
  BatchDescription shapeless = make_batch({});
  shapeless.block_table = IntArray();
  EXPECT_NO_THROW(spec::build_hybrid_metadata(mamba_config(MambaCacheMode::kNone, 4),
                                                   builder_config(CudaGraphMode::kNone), shapeless));
}

TEST(HybridMetadata, ReturnsBothBuilders) {
  const auto config = mamba_config(MambaCacheMode::kAll, 4);
  const auto builder = builder_config(CudaGraphMode::kFullAndPiecewise);
  const auto batch = make_batch({{7, 1}, {0, 6}, {3, 6}}, 4);
  const auto hybrid = spec::build_hybrid_metadata(config, builder, batch);
  HybridMetadata expected;
  expected.attention = spec::build_triton_metadata(config, builder, batch);
  expected.mamba = spec::build_mamba_metadata(config, builder, batch);
  EXPECT_TRUE(metadata_differences(hybrid, expected).empty());
  EXPECT_EQ(hybrid.attention.max_query_len, 6);
  ASSERT_TRUE(hybrid.mamba.has_value());
  EXPECT_EQ(hybrid.mamba->num_prefills, 2);
}

TEST(UpdateBlockTable, RejectsAMismatchedRequestCount) {
  const auto config = mamba_config(MambaCacheMode::kNone, 0);
  const auto builder = builder_config(CudaGraphMode::kNone);
  const auto metadata = spec::build_mamba_metadata(config, builder, make_batch({{7, 1}, {0, 6}}, 2));
  EXPECT_THROW(spec::update_block_table(config, builder, metadata, IntArray::matrix(3, 2, 1)), Error);
  EXPECT_NO_THROW(spec::update_block_table(config, builder, metadata, IntArray::matrix(2, 2, 1)));
}

// --- random batches against an independent formulation -----------------------------------------

struct RandomCase {
  AttentionConfig config;
  BuilderConfig builder;
  BatchDescription batch;
  int64_t generated_decodes = 0;
  int64_t generated_prefills = 0;
  int64_t generated_padding = 0;
};

RandomCase random_case(std::mt19937& rng) {
  RandomCase c;
  const auto mode = static_cast<MambaCacheMode>(uniform(rng, 0, 2));
  const int64_t block_size = uniform(rng, 1, 8);
  const int64_t num_spec = mode == MambaCacheMode::kAll ? 0 : (uniform(rng, 0, 1) ? uniform(rng, 1, 3) : 0);
  c.config = mamba_config(mode, block_size, num_spec);
  const bool with_accepted = num_spec > 0 ? uniform(rng, 0, 9) < 8 : uniform(rng, 0, 9) < 2;
  const int64_t threshold = with_accepted ? 1 + num_spec : 1;

  std::vector<Req> requests;
  c.generated_decodes = uniform(rng, 0, 6);
  c.generated_prefills = uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 4);
  c.generated_padding = uniform(rng, 0, 3);
  for (int64_t i = 0; i < c.generated_decodes; ++i) {
    requests.push_back({uniform(rng, 0, 60), uniform(rng, 1, threshold)});
  }
  for (int64_t i = 0; i < c.generated_prefills; ++i) {
    requests.push_back({uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 60), uniform(rng, threshold + 1, threshold + 25)});
  }
  for (int64_t i = 0; i < c.generated_padding; ++i) requests.push_back(kPaddingRequest);
  const auto num_reqs = static_cast<int64_t>(requests.size());
  int64_t max_seq = 0;
  for (const Req& req : requests) max_seq = std::max(max_seq, req.context_len + req.query_len);
  const int64_t columns = std::max<int64_t>((max_seq + block_size - 1) / block_size, 1) + num_spec + uniform(rng, 0, 2);
  c.batch = make_batch(requests, columns, uniform(rng, 0, 3));
  if (uniform(rng, 0, 1)) c.batch.ssm_block_table = make_ssm_block_table(num_reqs, columns);
  if (with_accepted) {
    std::vector<int32_t> accepted;
    for (int64_t r = 0; r < num_reqs; ++r) accepted.push_back(static_cast<int32_t>(uniform(rng, 1, 1 + num_spec)));
    c.batch.num_accepted_tokens = vec(accepted);
  }

  std::vector<int64_t> sizes;
  for (const int64_t size : {1, 2, 4, 8, 16}) {
    if (uniform(rng, 0, 2) > 0) sizes.push_back(size);
  }
  c.builder = builder_config(static_cast<CudaGraphMode>(uniform(rng, 0, 4)), sizes, uniform(rng, 1, 12));
  return c;
}

// Every field from per-request formulas: which kind each request was generated as, the block
// holding a token position, and the padding rule.
MambaAttentionMetadata expected_mamba(const RandomCase& c) {
  const BatchDescription& batch = c.batch;
  const IntArray& table = batch.ssm_block_table ? *batch.ssm_block_table : batch.block_table;
  const MambaCacheMode mode = c.config.mamba_cache_mode;
  const int64_t block_size = c.config.mamba_block_size;
  const int64_t num_spec = c.config.num_speculative_tokens;
  const int64_t num_reqs = batch.num_reqs();
  const int64_t columns = table.size(1);

  MambaAttentionMetadata m;
  m.num_reqs = num_reqs;
  // Padding requests side with the decodes in a decode-only batch, else with the prefills.
  m.num_decodes = c.generated_prefills == 0 ? c.generated_decodes + c.generated_padding : c.generated_decodes;
  m.num_prefills = num_reqs - m.num_decodes;
  for (int64_t r = 0; r < num_reqs; ++r) {
    (r < m.num_decodes ? m.num_decode_tokens : m.num_prefill_tokens) += batch.query_len(r);
  }
  m.seq_lens = batch.seq_lens;
  auto is_padding = [&](int64_t r) { return r >= c.generated_decodes + c.generated_prefills; };
  // Block holding token position p.
  auto block_of = [&](int64_t position) { return position / block_size; };

  const int64_t decode_columns = mode == MambaCacheMode::kAll ? columns : 1 + num_spec;
  auto state_entry = [&](int64_t r, int64_t j) -> int32_t {
    switch (mode) {
      case MambaCacheMode::kAll:
      case MambaCacheMode::kNone: return table.at(r, j);
      case MambaCacheMode::kAlign: {
        const int64_t last_block = batch.seq_len(r) == 0 ? 0 : block_of(batch.seq_len(r) - 1);
        return table.at(r, last_block + j);
      }
    }
    return 0;
  };
  m.state_indices_tensor_d = IntArray::matrix(m.num_decodes, decode_columns);
  for (int64_t r = 0; r < m.num_decodes; ++r) {
    for (int64_t j = 0; j < decode_columns; ++j) m.state_indices_tensor_d.at(r, j) = is_padding(r) ? -1 : state_entry(r, j);
  }
  if (mode == MambaCacheMode::kAll) {
    IntArray prefill_rows = IntArray::matrix(m.num_prefills, columns);
    for (int64_t i = 0; i < m.num_prefills; ++i) {
      for (int64_t j = 0; j < columns; ++j) {
        prefill_rows.at(i, j) = is_padding(m.num_decodes + i) ? -1 : state_entry(m.num_decodes + i, j);
      }
    }
    m.state_indices_tensor_p = prefill_rows;
  } else {
    std::vector<int32_t> prefill_column;
    for (int64_t i = 0; i < m.num_prefills; ++i) {
      prefill_column.push_back(is_padding(m.num_decodes + i) ? -1 : state_entry(m.num_decodes + i, 0));
    }
    m.state_indices_tensor_p = vec(prefill_column);
  }

  std::vector<int32_t> last_computed, first_scheduled, last_scheduled;
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t computed = batch.context_len(r);
    last_computed.push_back(static_cast<int32_t>(computed == 0 ? 0 : block_of(computed - 1)));
    first_scheduled.push_back(static_cast<int32_t>(block_of(computed)));
    last_scheduled.push_back(static_cast<int32_t>(batch.seq_len(r) == 0 ? 0 : block_of(batch.seq_len(r) - 1)));
  }
  if (mode == MambaCacheMode::kAll) {
    m.block_idx_last_computed_token = vec(last_computed);
    m.block_idx_last_scheduled_token = vec(last_scheduled);
  }

  m.num_accepted_tokens = batch.num_accepted_tokens;
  if (num_spec > 0 && m.num_decodes > 0 && batch.num_accepted_tokens) {  // (else the build must fail)
    m.query_start_loc_d = batch.query_start_loc.rows(0, m.num_decodes + 1);
    m.num_accepted_tokens = batch.num_accepted_tokens->rows(0, m.num_decodes);
  }

  if (m.num_prefills > 0) {
    std::vector<int32_t> starts, initial, computed_p, first_p;
    for (int64_t r = m.num_decodes; r <= num_reqs; ++r) {
      starts.push_back(batch.query_start_loc[r] - batch.query_start_loc[m.num_decodes]);
    }
    for (int64_t r = m.num_decodes; r < num_reqs; ++r) {
      initial.push_back(batch.context_len(r) > 0 ? 1 : 0);
      computed_p.push_back(static_cast<int32_t>(batch.context_len(r)));
      first_p.push_back(first_scheduled[r]);
    }
    m.query_start_loc_p = vec(starts);
    m.has_initial_states_p = vec(initial);
    m.causal_conv1d = expected_conv1d(vec(starts));
    if (mode == MambaCacheMode::kAll) {
      m.num_computed_tokens_p = vec(computed_p);
      m.block_idx_first_scheduled_token_p = vec(first_p);
    }
  }

  // The largest decode batch a full graph exists for: min(max_num_seqs, largest capture size).
  int64_t largest_graph = c.builder.max_num_seqs;
  const auto& sizes = c.builder.cudagraph_capture_sizes;
  if (!sizes.empty()) largest_graph = std::min(largest_graph, *std::max_element(sizes.begin(), sizes.end()));
  const bool full = c.builder.cudagraph_mode == CudaGraphMode::kFull ||
                    c.builder.cudagraph_mode == CudaGraphMode::kFullDecodeOnly ||
                    c.builder.cudagraph_mode == CudaGraphMode::kFullAndPiecewise;
  if (m.num_prefills == 0 && m.num_decodes <= largest_graph && full) {
    m.cudagraph_padded = 1;
    if (mode == MambaCacheMode::kAll) {
      // Only the requests that have a token this step (the real decodes) remain.
      m.block_idx_last_computed_token = m.block_idx_last_computed_token->rows(0, m.num_decode_tokens);
      m.block_idx_last_scheduled_token = m.block_idx_last_scheduled_token->rows(0, m.num_decode_tokens);
    }
  }
  return m;
}

TEST(MambaMetadata, RandomBatchesAgainstPerRequestFormulas) {
  std::mt19937 rng(2024);
  int checked = 0;
  int rejected = 0;
  int64_t padded = 0;          // CUDA-graph step applied
  int64_t with_padding_rows = 0;  // padding requests among the decodes
  for (int iteration = 0; iteration < 3000; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const RandomCase c = random_case(rng);
    const MambaAttentionMetadata expected = expected_mamba(c);
    if (c.config.num_speculative_tokens > 0 && expected.num_decodes > 0 && !c.batch.num_accepted_tokens) {
      EXPECT_THROW(spec::build_mamba_metadata(c.config, c.builder, c.batch), Error);
      ++rejected;
      continue;
    }
    const MambaAttentionMetadata actual = spec::build_mamba_metadata(c.config, c.builder, c.batch);
    expect_same_mamba(actual, expected);
    ++checked;
    padded += actual.cudagraph_padded;
    with_padding_rows += c.generated_prefills == 0 && c.generated_padding > 0 ? 1 : 0;

    // update_block_table with a new state table == a fresh build on a batch carrying that table.
    IntArray new_table = IntArray::matrix(c.batch.num_reqs(), c.batch.state_block_table().size(1));
    for (auto& entry : new_table.values) entry = static_cast<int32_t>(uniform(rng, 1, 100000));
    BatchDescription rebuilt = c.batch;
    rebuilt.ssm_block_table = new_table;
    expect_same_mamba(spec::update_block_table(c.config, c.builder, actual, new_table),
                      spec::build_mamba_metadata(c.config, c.builder, rebuilt));
    if (::testing::Test::HasFailure()) break;  // one failing case says enough
  }
  EXPECT_GT(checked, 2000);
  EXPECT_GT(rejected, 20);
  EXPECT_GT(padded, 300);
  EXPECT_GT(with_padding_rows, 300);
}

}  // namespace
}  // namespace hybridtb::testing
