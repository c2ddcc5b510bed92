// Linear-attention layers in hybrid-batch files (schema 1.2, datasets/SCHEMA.md §6.4): a gdn and a
// mamba2 layer file round-trip bit for bit (inputs, pools, weights, /outputs, /expected), files
// without layer_kind keep meaning full_attention, h5py's checker (read_batch_h5py.py) accepts them,
// and every malformed case is refused with an Error naming the field and the constraint, by the
// reader and by the writer.
// Run: ctest --test-dir <build> -L per_layer
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "batch_checks.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "io_fixtures.h"
#include "per_layer_support.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::vector<RequestSpec> kRequests = {{.context_len = 20, .query_len = 1},
                                            {.context_len = 9, .query_len = 6},
                                            {.context_len = 0, .query_len = 5}};

// A linear layer's file in bfloat16 with one CUDA-graph padding row, and the reference's results
// as both /outputs and /expected.
BatchFile linear_file(LayerKind kind) {
  AttentionConfig config = testing::linear_layer(kind);
  config.dtype = DType::kBFloat16;
  BatchFile file = testing::layer_file(config, kRequests, {.seed = 9, .padding_tokens = 1});
  file.outputs = testing::run_on_reference(file);
  file.expected = file.outputs;
  file.expected->backend = "reference (recorded)";
  return file;
}

fs::path written(const BatchFile& file, const std::string& name) {
  const fs::path path = testing::scratch_dir() / name;
  write_batch_file(path.string(), file);
  return path;
}

class LinearLayerFile : public ::testing::TestWithParam<LayerKind> {};
std::string kind_test_name(const ::testing::TestParamInfo<LayerKind>& param_info) {
  return testing::kind_name(param_info.param);
}

TEST_P(LinearLayerFile, RoundTripsBitForBit) {
  const BatchFile file = linear_file(GetParam());
  const BatchFile back = read_batch_file(written(file, "round_trip.h5").string());
  EXPECT_EQ(back.schema_version, testing::kWrittenSchemaVersion);
  EXPECT_EQ(back.config, file.config);
  EXPECT_EQ(back.builder, file.builder);
  testing::expect_same_batch_inputs(back, file);
  EXPECT_TRUE(back.inputs.query.empty());
  EXPECT_TRUE(back.inputs.kv_cache.empty());
  for (const auto* results : {&back.outputs, &back.expected}) {
    ASSERT_TRUE(results->has_value());
    const StepOutputs& original = results == &back.outputs ? *file.outputs : *file.expected;
    EXPECT_EQ((*results)->backend, original.backend);
    testing::expect_same_tensor(original.output, (*results)->output, "output");
    EXPECT_TRUE((*results)->attn_output.empty());
    ASSERT_EQ((*results)->ssm_state.size(), original.ssm_state.size());
    for (const auto& [name, pool] : original.ssm_state) testing::expect_same_tensor(pool, (*results)->ssm_state.at(name), name);
    EXPECT_EQ((*results)->metadata, original.metadata);
  }
}

// What a Python user sees: harness/scripts/read_batch_h5py.py --check knows the 1.2 items too.
TEST_P(LinearLayerFile, H5pyReadsAndChecksIt) {
  if (testing::python_with_h5py().empty()) GTEST_SKIP() << "no python3 with h5py and numpy";
  const fs::path path = written(linear_file(GetParam()), "h5py.h5");
  const fs::path script = testing::source_dir() / "harness" / "scripts" / "read_batch_h5py.py";
  std::string out;
  EXPECT_EQ(testing::run_command(testing::python_with_h5py() + " " + script.string() + " " + path.string() + " --check",
                                 &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("layer_kind="));
  EXPECT_THAT(out, HasSubstr("\nok\n"));
}

TEST(LinearLayerFile, FilesWithoutLayerKindAreFullAttentionLayers) {
  for (const char* name : {"hybrid_mamba1_bf16.h5", "mixed_swa_bf16.h5"}) {
    const BatchFile file = read_batch_file((testing::source_dir() / "datasets" / "examples" / name).string());
    EXPECT_EQ(file.config.layer_kind, LayerKind::kFullAttention) << name;
    EXPECT_TRUE(file.inputs.linear_inputs.empty()) << name;
  }
  // hybridtb writes layer_kind for linear layers only, so a full-attention file keeps the 1.1 layout.
  const BatchFile attention = testing::layer_file(testing::attention_layer(), kRequests, {.seed = 9});
  const fs::path path = written(attention, "attention.h5");
  testing::edit_file(path, [](const h5::Group& root) {
    EXPECT_FALSE(testing::group_at(root, "/config").has_attribute("layer_kind"));
  });
  EXPECT_EQ(read_batch_file(path.string()).config.layer_kind, LayerKind::kFullAttention);
}

// Writes the gdn file, applies `edit` to it and returns the reader's error.
std::string read_error_after(const std::function<void(const h5::Group& root)>& edit) {
  static const BatchFile file = linear_file(LayerKind::kGdn);
  const fs::path path = written(file, "malformed.h5");
  testing::edit_file(path, edit);
  return testing::error_of([&] { read_batch_file(path.string()); });
}

void set_string(const h5::Group& root, const std::string& group, const std::string& name, const std::string& value) {
  const h5::Group g = testing::group_at(root, group);
  if (g.has_attribute(name)) g.remove_attribute(name);
  g.write_string_attribute(name, value);
}

// A float32 dataset of zeros (T = 17: 16 real tokens and one padding row).
void put_float32(const h5::Group& root, const std::string& path, const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  const std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
  testing::replace_dataset(root, path, h5::storage_type(DType::kFloat32).id(), shape, zeros.data());
}

TEST(LinearLayerFile, EveryMalformedItemIsNamedByTheReader) {
  constexpr int64_t T = 13;  // 12 real tokens + 1 padding row
  EXPECT_THAT(read_error_after([](const h5::Group& root) { set_string(root, "/config", "layer_kind", "gated_delta"); }),
              HasSubstr("/config layer_kind: unknown value 'gated_delta' (expected full_attention | gdn | mamba2)"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { set_string(root, "/config", "ssm_mode", "mamba2"); }),
              HasSubstr("/config ssm_mode 'mamba2' does not match layer_kind gdn"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { set_string(root, "/config", "attn_type", "encoder_only"); }),
              HasSubstr("/config layer_kind gdn needs attn_type decoder"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { testing::group_at(root, "/inputs").remove_child("a"); }),
              HasSubstr("missing dataset /inputs/a (required: bfloat16 [T, num_v_heads], the decay's input"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { put_float32(root, "/inputs/b", {T, 5}); }),
              HasSubstr("/inputs/b: dtype float32 does not match /config dtype bfloat16"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) {
                const h5::Group inputs = testing::group_at(root, "/inputs");
                const Tensor wide = Tensor::host(DType::kBFloat16, {T, 5});
                inputs.remove_child("b");
                testing::replace_dataset(root, "/inputs/b", h5::storage_type(DType::kBFloat16).id(), wide.shape(),
                                         wide.data());
              }),
              HasSubstr("/inputs/b: shape [13, 5] does not match [T=13, num_v_heads=4]"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) {
                const Tensor short_rows = Tensor::host(DType::kBFloat16, {T - 1, 96});
                testing::group_at(root, "/inputs").remove_child("mixed_qkv");
                testing::replace_dataset(root, "/inputs/mixed_qkv", h5::storage_type(DType::kBFloat16).id(),
                                         short_rows.shape(), short_rows.data());
              }),
              HasSubstr("/inputs/mixed_qkv: shape [12, 96] does not match [T=13, "
                        "2*num_k_heads*head_k_dim + num_v_heads*head_v_dim=96]"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) { put_float32(root, "/inputs/query", {T, 4, 32}); }),
              HasSubstr("/inputs/query is present, but /config layer_kind gdn is a linear-attention layer"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) { put_float32(root, "/inputs/xBC", {T, 64}); }),
              HasSubstr("/inputs/xBC is an input of layer_kind mamba2, but /config layer_kind is gdn"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { testing::group_at(root, "/config").remove_attribute("layer_kind"); }),
              HasSubstr("/inputs/mixed_qkv is an input of layer_kind gdn, but /config layer_kind is full_attention (the "
                        "default when the attribute is absent)"));
  EXPECT_THAT(read_error_after([](const h5::Group& root) { testing::group_at(root, "/config/ssm").remove_attribute("num_v_heads"); }),
              HasSubstr("missing /config/ssm num_v_heads (a parameter of layer_kind gdn"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) { put_float32(root, "/outputs/output", {T, 33}); }),
              HasSubstr("/outputs/output: shape [13, 33] does not match [T=13, output_width=32]"));
  EXPECT_THAT(read_error_after([&](const h5::Group& root) { put_float32(root, "/expected/attn_output", {T, 4, 32}); }),
              HasSubstr("/expected/attn_output is present, but /config layer_kind gdn is a linear-attention layer"));
}

TEST(LinearLayerFile, TheWriterRefusesBeforeCreatingAnything) {
  const fs::path dir = testing::scratch_dir() / "refused";
  fs::create_directories(dir);
  const fs::path path = dir / "never.h5";
  const BatchFile good = linear_file(LayerKind::kMamba2);

  BatchFile with_query = good;
  with_query.inputs.query = Tensor::host(DType::kBFloat16, {good.batch.num_tokens(), 4, 32});
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), with_query); }),
              HasSubstr("/inputs/query is present, but layer_kind mamba2 is a linear-attention layer"));

  BatchFile missing = good;
  missing.inputs.linear_inputs.erase("dt");
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), missing); }),
              HasSubstr("missing /inputs/dt (required by layer_kind mamba2: bfloat16 [T, num_ssm_heads]"));

  BatchFile extra = good;
  extra.inputs.linear_inputs["a"] = Tensor::host(DType::kBFloat16, {good.batch.num_tokens(), 4});
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), extra); }),
              HasSubstr("/inputs/a is not an input of layer_kind mamba2"));

  BatchFile wide_output = good;
  wide_output.outputs->output = Tensor::host(DType::kFloat64, {good.batch.num_tokens(), 31});
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), wide_output); }),
              HasSubstr("/outputs/output: shape"));

  BatchFile attention_result = good;
  attention_result.outputs->attn_output = Tensor::host(DType::kFloat64, {good.batch.num_tokens(), 4, 32});
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), attention_result); }),
              HasSubstr("/outputs/attn_output: a linear-attention layer (layer_kind mamba2) has no such output"));

  BatchFile full_attention_with_inputs = good;
  full_attention_with_inputs.config.layer_kind = LayerKind::kFullAttention;
  EXPECT_THAT(testing::error_of([&] { write_batch_file(path.string(), full_attention_with_inputs); }),
              HasSubstr("is a linear-attention input, but /config layer_kind is full_attention"));
  EXPECT_THAT(testing::directory_listing(dir), ::testing::IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, LinearLayerFile, ::testing::Values(LayerKind::kGdn, LayerKind::kMamba2),
                         kind_test_name);

}  // namespace
}  // namespace hybridtb
