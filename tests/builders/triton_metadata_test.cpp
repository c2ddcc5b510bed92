// build_triton_metadata (harness/spec/src/triton_metadata_builder.cpp): the 3D threshold and its
// snapping to CUDA-graph capture sizes, the head-size padding and the 2D/3D decision, on values
// worked out by hand from vLLM's TritonAttentionMetadataBuilder (notes §1.9).
// Run: ctest --test-dir build -L builders
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "builder_test_batches.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"

namespace hybridtb::testing {
namespace {

AttentionConfig attention_config(int64_t num_kv_heads, int64_t head_size = 64) {
  AttentionConfig config = mamba_config(MambaCacheMode::kNone, 0);
  config.num_heads = num_kv_heads * 2;
  config.num_kv_heads = num_kv_heads;
  config.head_size = head_size;
  return config;
}

int64_t threshold_for(int64_t num_kv_heads, const BuilderConfig& builder) {
  return spec::build_triton_metadata(attention_config(num_kv_heads), builder, make_batch({{3, 1}}))
      .seq_threshold_3d;
}

TEST(TritonMetadata, SeqThreshold3dIs128OverKvHeads) {
  const BuilderConfig piecewise = builder_config(CudaGraphMode::kPiecewise);
  EXPECT_EQ(threshold_for(1, piecewise), 128);
  EXPECT_EQ(threshold_for(8, piecewise), 16);
  EXPECT_EQ(threshold_for(128, piecewise), 1);
  EXPECT_EQ(threshold_for(3, piecewise), 42);  // 128 // 3
  EXPECT_EQ(threshold_for(200, piecewise), 0);
}

TEST(TritonMetadata, SeqThreshold3dSnapsToTheNearestCaptureSizeUnderFullGraphs) {
  const std::vector<int64_t> sizes{1, 2, 4, 8, 16, 32, 48, 64};
  for (const auto mode : {CudaGraphMode::kFull, CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    const BuilderConfig builder = builder_config(mode, sizes);
    EXPECT_EQ(threshold_for(8, builder), 16);   // exact
    EXPECT_EQ(threshold_for(3, builder), 48);   // 42: |48-42| = 6 < |32-42| = 10
    EXPECT_EQ(threshold_for(1, builder), 64);   // 128: the largest size is nearest
    EXPECT_EQ(threshold_for(200, builder), 1);  // 0: the smallest
  }
}

TEST(TritonMetadata, SnappingTieGoesToTheFirstSizeInListOrder) {
  // 16 is 4 away from both 12 and 20: Python's min(key=...) keeps the first.
  EXPECT_EQ(threshold_for(8, builder_config(CudaGraphMode::kFull, {12, 20})), 12);
  EXPECT_EQ(threshold_for(8, builder_config(CudaGraphMode::kFull, {20, 12})), 20);
  EXPECT_EQ(threshold_for(8, builder_config(CudaGraphMode::kFull, {64, 20, 12, 1})), 20);
}

TEST(TritonMetadata, NoSnappingWithoutFullGraphsOrCaptureSizes) {
  EXPECT_EQ(threshold_for(3, builder_config(CudaGraphMode::kNone, {32, 48})), 42);
  EXPECT_EQ(threshold_for(3, builder_config(CudaGraphMode::kPiecewise, {32, 48})), 42);
  EXPECT_EQ(threshold_for(3, builder_config(CudaGraphMode::kFull, {})), 42);
}

TEST(TritonMetadata, ConstantsAndHeadSizePadding) {
  const BuilderConfig builder = builder_config(CudaGraphMode::kNone);
  const auto batch = make_batch({{3, 1}});
  for (const auto& [head_size, padded] : std::vector<std::pair<int64_t, int64_t>>{
           {32, 32}, {64, 64}, {80, 128}, {96, 128}, {128, 128}, {129, 256}, {256, 256}}) {
    const auto metadata = spec::build_triton_metadata(attention_config(2, head_size), builder, batch);
    EXPECT_EQ(metadata.head_size_padded, padded) << "head_size " << head_size;
    EXPECT_EQ(metadata.num_par_softmax_segments, 16);
  }
}

TEST(TritonMetadata, BatchScalars) {
  const auto batch = make_batch({{10, 1}, {4, 1}, {16, 7}, {0, 12}}, 8, 5);
  const auto metadata =
      spec::build_triton_metadata(attention_config(2), builder_config(CudaGraphMode::kNone), batch);
  EXPECT_EQ(metadata.num_actual_tokens, 21);  // the 5 padding tokens excluded
  EXPECT_EQ(metadata.max_query_len, 12);
  EXPECT_EQ(metadata.max_seq_len, 23);
}

TEST(TritonMetadata, Use3dPathOnlyForSmallDecodeOnlyBatches) {
  // 8 kv heads: threshold 16.
  const AttentionConfig config = attention_config(8);
  const BuilderConfig builder = builder_config(CudaGraphMode::kPiecewise);
  auto decodes = [](int64_t n) { return make_batch(std::vector<Req>(static_cast<size_t>(n), Req{5, 1})); };
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(1)).use_3d_path, 1);
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(15)).use_3d_path, 1);
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(16)).use_3d_path, 1);
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(17)).use_3d_path, 0);
  // One 2-token query makes it a mixed batch: 2D.
  EXPECT_EQ(spec::build_triton_metadata(config, builder, make_batch({{5, 1}, {0, 2}})).use_3d_path, 0);
  // Padding requests count as sequences (num_seqs = len(seq_lens)).
  std::vector<Req> padded(16, Req{5, 1});
  padded.push_back(kPaddingRequest);
  EXPECT_EQ(spec::build_triton_metadata(config, builder, make_batch(padded)).use_3d_path, 0);
  // Threshold 0 (more than 128 kv heads): never 3D for a non-empty batch.
  EXPECT_EQ(spec::build_triton_metadata(attention_config(256), builder, decodes(1)).use_3d_path, 0);
}

TEST(TritonMetadata, Use3dPathFollowsTheSnappedThreshold) {
  // 8 kv heads → 16, snapped to 12: 13 decodes are too many.
  const AttentionConfig config = attention_config(8);
  const BuilderConfig builder = builder_config(CudaGraphMode::kFull, {12, 20});
  auto decodes = [](int64_t n) { return make_batch(std::vector<Req>(static_cast<size_t>(n), Req{5, 1})); };
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(12)).use_3d_path, 1);
  EXPECT_EQ(spec::build_triton_metadata(config, builder, decodes(13)).use_3d_path, 0);
}

TEST(TritonMetadata, EmptyBatch) {
  const auto metadata =
      spec::build_triton_metadata(attention_config(2), builder_config(CudaGraphMode::kNone), make_batch({}));
  EXPECT_EQ(metadata.num_actual_tokens, 0);
  EXPECT_EQ(metadata.max_query_len, 0);
  EXPECT_EQ(metadata.max_seq_len, 0);
  // The condition holds vacuously (0 sequences, max query length 0); no kernel runs.
  EXPECT_EQ(metadata.use_3d_path, 1);
}

TEST(TritonMetadata, RejectsNonPositiveHeads) {
  EXPECT_THROW(spec::build_triton_metadata(attention_config(0), builder_config(CudaGraphMode::kNone),
                                                make_batch({{1, 1}})),
               Error);
}

// Random batches against a per-request loop for the batch scalars and the decision.
TEST(TritonMetadata, RandomBatches) {
  std::mt19937 rng(7);
  for (int iteration = 0; iteration < 1000; ++iteration) {
    SCOPED_TRACE("iteration " + std::to_string(iteration));
    const int64_t num_kv_heads = uniform(rng, 1, 40);
    std::vector<Req> requests;
    const int64_t num_reqs = uniform(rng, 0, 40);
    const bool decode_only = uniform(rng, 0, 1) == 1;
    for (int64_t i = 0; i < num_reqs; ++i) {
      requests.push_back({uniform(rng, 0, 300), decode_only ? uniform(rng, 0, 1) : uniform(rng, 0, 20)});
    }
    const auto batch = make_batch(requests, 2, uniform(rng, 0, 4));
    const auto metadata =
        spec::build_triton_metadata(attention_config(num_kv_heads), builder_config(CudaGraphMode::kNone), batch);
    int64_t tokens = 0;
    int64_t max_query = 0;
    int64_t max_seq = 0;
    for (const Req& req : requests) {
      tokens += req.query_len;
      max_query = std::max(max_query, req.query_len);
      max_seq = std::max(max_seq, req.context_len + req.query_len);
    }
    EXPECT_EQ(metadata.num_actual_tokens, tokens);
    EXPECT_EQ(metadata.max_query_len, max_query);
    EXPECT_EQ(metadata.max_seq_len, max_seq);
    EXPECT_EQ(metadata.seq_threshold_3d, 128 / num_kv_heads);
    bool all_single_token = true;
    for (const Req& req : requests) all_single_token = all_single_token && req.query_len <= 1;
    EXPECT_EQ(metadata.use_3d_path, all_single_token && num_reqs * num_kv_heads <= 128 ? 1 : 0);
  }
}

}  // namespace
}  // namespace hybridtb::testing
