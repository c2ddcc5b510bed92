// One step of a per-layer model (run_per_layer_step, hybridtb/per_layer.h): an attention layer and
// GDN (or Mamba-2) layers share one batch and one metadata build, and each layer's results are
// exactly what that layer gives run on its own; layers of different steps or configurations are
// refused by name; the comparison of `hybridtb parity` handles linear layers; the linear layers'
// input widths are their cores'.
// Run: ctest --test-dir <build> -L per_layer
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gdn_core.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/reference/linear_layer.h"
#include "mamba2_core.h"
#include "per_layer_support.h"
#include "ssm_test_support.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

const std::vector<RequestSpec> kRequests = {{.context_len = 33, .query_len = 1},
                                            {.context_len = 16, .query_len = 9},
                                            {.context_len = 0, .query_len = 18}};

// Qwen3-Next's pattern, scaled down: three GDN layers (their own weights and pools), then attention.
TEST(PerLayerStep, AttentionAndLinearLayersShareOneStepAndMatchEachLayerAlone) {
  for (const LayerKind kind : {LayerKind::kGdn, LayerKind::kMamba2}) {
    SCOPED_TRACE(testing::kind_name(kind));
    const AttentionConfig attention_config = testing::attention_layer(MambaCacheMode::kAll, 16);
    const AttentionConfig linear_config = testing::linear_layer(kind, MambaCacheMode::kAll, 16);
    const SyntheticOptions options{.seed = 21};
    std::vector<BatchFile> files;
    for (uint64_t seed : {31, 32, 33}) files.push_back(testing::layer_file(linear_config, kRequests, options, seed));
    files.push_back(testing::layer_file(attention_config, kRequests, options));

    auto backend = create_per_layer_backend("reference", {{attention_config, {}}, {linear_config, {}}});
    std::vector<const BatchFile*> layers;
    for (const BatchFile& file : files) layers.push_back(&file);
    const std::vector<StepOutputs> step = run_per_layer_step(*backend, layers);
    ASSERT_EQ(step.size(), files.size());

    for (size_t i = 0; i < files.size(); ++i) {
      SCOPED_TRACE("layer " + std::to_string(i));
      const StepOutputs alone = testing::run_on_reference(files[i]);
      EXPECT_TRUE(bitwise_equal(step[i].output, alone.output));
      EXPECT_TRUE(bitwise_equal(step[i].attn_output, alone.attn_output));
      EXPECT_TRUE(bitwise_equal(step[i].kv_cache, alone.kv_cache));
      ASSERT_EQ(step[i].ssm_state.size(), alone.ssm_state.size());
      for (const auto& [name, pool] : alone.ssm_state) EXPECT_TRUE(bitwise_equal(step[i].ssm_state.at(name), pool)) << name;
      EXPECT_EQ(step[i].metadata, step[0].metadata);  // one build, shared
    }
    // The linear layers kept their own pools: different weights, different states.
    EXPECT_FALSE(bitwise_equal(step[0].ssm_state.begin()->second, step[1].ssm_state.begin()->second));
  }
}

TEST(PerLayerStep, LayersOfAnotherStepOrConfigurationAreRefusedByName) {
  const AttentionConfig attention_config = testing::attention_layer();
  const AttentionConfig gdn_config = testing::linear_layer(LayerKind::kGdn);
  auto backend = create_per_layer_backend("reference", {{attention_config, {}}, {gdn_config, {}}});
  const BatchFile attention = testing::layer_file(attention_config, kRequests, {.seed = 1});
  const BatchFile gdn = testing::layer_file(gdn_config, kRequests, {.seed = 1});

  const BatchFile other_step = testing::layer_file(gdn_config, {{.context_len = 5, .query_len = 2}}, {.seed = 1});
  EXPECT_THAT(testing::error_of([&] { run_per_layer_step(*backend, {&attention, &other_step}); }),
              HasSubstr("layer 1 has another /batch/query_start_loc than layer 0"));

  BatchFile reshuffled = testing::layer_file(gdn_config, kRequests, {.seed = 2});  // same requests, other blocks
  EXPECT_THAT(testing::error_of([&] { run_per_layer_step(*backend, {&gdn, &reshuffled}); }),
              HasSubstr("layer 1 has another /batch/block_table"));

  const BatchFile mamba2 = testing::layer_file(testing::linear_layer(LayerKind::kMamba2), kRequests, {.seed = 1});
  EXPECT_THAT(testing::error_of([&] { run_per_layer_step(*backend, {&gdn, &mamba2}); }),
              HasSubstr("layer 1 (layer_kind mamba2, ssm_mode mamba2) has another /config than the backend's mamba2 layers"));

  BatchFile bigger = gdn;
  bigger.config.ssm_params["num_v_heads"] = 8;
  EXPECT_THAT(testing::error_of([&] { run_per_layer_step(*backend, {&bigger}); }),
              HasSubstr("has another /config than the backend's gdn layers"));
  EXPECT_THAT(testing::error_of([&] { run_per_layer_step(*backend, {}); }), HasSubstr("no layers"));
}

// `hybridtb parity` / `replay` compare a linear layer's output token-major with the SSM row of the
// tolerance table, and its pools as for the branch (slots the metadata does not name must keep
// their input).
TEST(PerLayerStep, TheComparisonHandlesLinearLayers) {
  const BatchFile file = testing::layer_file(testing::linear_layer(LayerKind::kGdn), kRequests, {.seed = 3, .padding_tokens = 1});
  const StepOutputs expected = testing::run_on_reference(file);
  const ComparisonReport same = compare_step(file, testing::run_on_reference(file), expected);
  EXPECT_TRUE(same.passed());
  std::vector<std::string> names;
  for (const QuantityReport& q : same.quantities) names.push_back(q.name);
  EXPECT_THAT(names, ::testing::ElementsAre("output", "ssm/conv_state", "ssm/recurrent_state"));
  EXPECT_EQ(same.quantities[0].compared, file.batch.num_actual_tokens * 32);
  EXPECT_THAT(same.config_summary, HasSubstr("layer=gdn"));

  StepOutputs wrong = testing::run_on_reference(file);
  const int64_t row = file.batch.query_start_loc[2] + 3;  // request 2, its token 3
  store_from_double(wrong.output.data(), wrong.output.dtype(), row * 32 + 5, 7.0);
  store_from_double(wrong.ssm_state.at("conv_state").data(), DType::kFloat32, 0, 9.0f);  // slot 0: not the step's
  const ComparisonReport report = compare_step(file, wrong, expected);
  EXPECT_FALSE(report.passed());
  ASSERT_TRUE(report.quantities[0].worst.has_value());
  EXPECT_EQ(report.quantities[0].worst->to_string(), "(req=2, tok=3, col=5)");
  EXPECT_EQ(report.quantities[1].untouched_written, 1);
}

// The widths the file layer checks (harness/src/linear_layer.cpp) are the cores' (reference/ssm).
TEST(PerLayerStep, LinearInputWidthsAreTheCoresAndForeignNamesAreTheOtherKinds) {
  const AttentionConfig gdn = testing::linear_layer(LayerKind::kGdn);
  const LinearLayerSpec gdn_spec = linear_layer_spec(gdn);
  const reference::ssm::GdnSizes gdn_sizes = reference::ssm::gdn_sizes(reference::ssm::mode_shape(gdn));
  ASSERT_EQ(gdn_spec.inputs.size(), 3u);
  EXPECT_EQ(gdn_spec.inputs[0].width, gdn_sizes.conv_dim());
  EXPECT_EQ(gdn_spec.inputs[1].width, gdn_sizes.num_v_heads);
  EXPECT_EQ(gdn_spec.inputs[2].width, gdn_sizes.num_v_heads);
  EXPECT_EQ(gdn_spec.output_width, gdn_sizes.num_v_heads * gdn_sizes.head_v_dim);

  const AttentionConfig m2 = testing::linear_layer(LayerKind::kMamba2);
  const LinearLayerSpec m2_spec = linear_layer_spec(m2);
  reference::ssm::Mamba2Sizes m2_sizes;
  m2_sizes.heads = 4;
  m2_sizes.head_dim = 8;
  m2_sizes.state = 8;
  m2_sizes.groups = 2;
  m2_sizes.kernel = 4;
  ASSERT_EQ(m2_spec.inputs.size(), 2u);
  EXPECT_EQ(m2_spec.inputs[0].width, m2_sizes.conv_dim());
  EXPECT_EQ(m2_spec.inputs[1].width, m2_sizes.heads);
  EXPECT_EQ(m2_spec.output_width, m2_sizes.d_ssm());

  // Every kind's own inputs are exactly the names the others call foreign.
  for (const LayerKind kind : {LayerKind::kGdn, LayerKind::kMamba2}) {
    std::vector<std::string> own;
    for (const LinearInput& input : linear_layer_spec(testing::linear_layer(kind)).inputs) own.push_back(input.name);
    std::vector<std::string> foreign_elsewhere;
    for (const auto& [name, owner] : foreign_linear_inputs(LayerKind::kFullAttention)) {
      if (owner == kind) foreign_elsewhere.push_back(name);
    }
    EXPECT_EQ(own, foreign_elsewhere) << testing::kind_name(kind);
    for (const auto& [name, owner] : foreign_linear_inputs(kind)) EXPECT_NE(owner, kind);
  }

  // The pools and weights of a linear layer: its mode's pools, its core's weights.
  const reference::ssm::LinearLayerTensorSpecs specs = reference::ssm::linear_layer_tensor_specs(gdn);
  std::vector<std::string> weights, pools;
  for (const auto& spec : specs.weights) weights.push_back(spec.name);
  for (const auto& spec : specs.state) pools.push_back(spec.name);
  EXPECT_THAT(weights, ::testing::UnorderedElementsAre("conv1d_weight", "conv1d_bias", "A_log", "dt_bias"));
  EXPECT_THAT(pools, ::testing::ElementsAre("conv_state", "recurrent_state"));
}

}  // namespace
}  // namespace hybridtb
