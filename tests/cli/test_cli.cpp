// The hybridtb command line, end to end: --help everywhere, `run` on every shipped example,
// `info` on valid and broken files, and the rule that a failed run leaves no output file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "examples.h"
#include "hybridtb/batch_file.h"
#include "batch_checks.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }
fs::path example_path(const std::string& name) { return testing::source_dir() / "datasets" / "examples" / name; }

TEST(Cli, HelpOnEverySubcommand) {
  for (const std::string sub : {"", "run", "info", "backends"}) {
    std::string out;
    EXPECT_EQ(run_command(cli() + " " + sub + " --help", &out), 0) << sub;
    EXPECT_THAT(out, HasSubstr("Usage")) << sub;
  }
  std::string out;
  EXPECT_EQ(run_command(cli() + " run --help", &out), 0);
  EXPECT_THAT(out, HasSubstr("--backend"));
  EXPECT_THAT(out, HasSubstr("--batch"));
  EXPECT_THAT(out, HasSubstr("--out"));
}

TEST(Cli, UsageErrorsExitNonZero) {
  EXPECT_EQ(run_command(cli()), 2);                           // no subcommand
  EXPECT_EQ(run_command(cli() + " run --batch /nonexistent.h5 --out x.h5"), 2);  // CLI11 ExistingFile check
}

TEST(Cli, BackendsListsTheReference) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " backends", &out), 0);
  EXPECT_THAT(out, HasSubstr("reference"));
}

TEST(Cli, CommittedExamplesMatchTheirGenerator) {
  for (const auto& example : examples::all()) {
    SCOPED_TRACE(example.file_name);
    const BatchFile committed = read_batch_file(example_path(example.file_name).string());
    const BatchFile regenerated = example.make();
    testing::expect_same_batch_inputs(committed, regenerated);
  }
}

TEST(Cli, RunWritesOutputsForEveryExampleAndLeavesPaddingRowsUnwritten) {
  const fs::path dir = testing::scratch_dir();
  for (const auto& example : examples::all()) {
    SCOPED_TRACE(example.file_name);
    const fs::path out_path = dir / ("out_" + example.file_name);
    std::string out;
    ASSERT_EQ(run_command(cli() + " run --backend reference --batch " + example_path(example.file_name).string() +
                              " --out " + out_path.string(),
                          &out),
              0)
        << out;
    EXPECT_THAT(out, HasSubstr("padding elements written 0"));
    const BatchFile result = read_batch_file(out_path.string());
    ASSERT_TRUE(result.outputs.has_value());
    EXPECT_EQ(result.outputs->backend, "reference");
    EXPECT_EQ(result.outputs->output.dtype(), DType::kFloat64);  // ground truth is not rounded
    const TensorView o = result.outputs->output;
    const int64_t row = o.numel() / o.size(0);  // Hq·D, or a linear layer's output width
    for (int64_t i = 0; i < o.numel(); ++i) {
      const double x = load_as_double(o.data(), o.dtype(), i);
      if (i < result.batch.num_actual_tokens * row) {
        ASSERT_TRUE(std::isfinite(x)) << "element " << i;
      } else {
        ASSERT_TRUE(std::isnan(x)) << "padding element " << i << " was written";
      }
    }
    EXPECT_EQ(result.outputs->metadata.attention.num_actual_tokens, result.batch.num_actual_tokens);
    // The fused output is the attention output plus the SSM contribution (seed HybridAttentionImpl).
    // A linear-attention layer's output is its core's alone, beside the pools after the step.
    if (result.config.is_linear_layer()) {
      EXPECT_TRUE(result.outputs->attn_output.empty());
      EXPECT_TRUE(result.outputs->kv_cache.empty());
      EXPECT_EQ(result.outputs->ssm_state.size(), result.inputs.ssm_state.size());
    } else if (result.config.has_ssm_branch()) {
      ASSERT_FALSE(result.outputs->ssm_output.empty());
      const TensorView a = result.outputs->attn_output, s = result.outputs->ssm_output;
      for (int64_t i = 0; i < result.batch.num_actual_tokens * row; ++i) {
        ASSERT_EQ(load_as_double(o.data(), o.dtype(), i),
                  load_as_double(a.data(), a.dtype(), i) + load_as_double(s.data(), s.dtype(), i))
            << "element " << i;
      }
      EXPECT_EQ(result.outputs->ssm_state.size(), result.inputs.ssm_state.size());
    } else {
      EXPECT_TRUE(result.outputs->ssm_output.empty());
      EXPECT_TRUE(bitwise_equal(result.outputs->output, result.outputs->attn_output));
    }
    std::string info;
    EXPECT_EQ(run_command(cli() + " info " + out_path.string(), &info), 0) << info;
    EXPECT_THAT(info, HasSubstr("valid:"));
    // Encoder-only layers have no recurrent state, hence no Mamba metadata.
    if (result.config.attn_type == AttnType::kDecoder) {
      EXPECT_THAT(info, HasSubstr("/outputs/metadata/mamba"));
    }
  }
}

TEST(Cli, DecodeOnlyPaddedExampleRecordsTheCudaGraphPadding) {
  const fs::path out_path = testing::scratch_dir() / "padded.h5";
  ASSERT_EQ(run_command(cli() + " run --quiet --batch " + example_path("decode_cudagraph_padded_fp32.h5").string() +
                        " --out " + out_path.string()),
            0);
  const BatchFile result = read_batch_file(out_path.string());
  ASSERT_TRUE(result.outputs->metadata.mamba.has_value());
  const MambaAttentionMetadata& m = *result.outputs->metadata.mamba;
  EXPECT_EQ(m.cudagraph_padded, 1);
  ASSERT_EQ(m.state_indices_tensor_d.size(0), 8);
  for (int64_t r = 5; r < 8; ++r) EXPECT_EQ(m.state_indices_tensor_d.at(r, 0), kPadSlotId) << r;
  // Decode-only with 8 sequences; seq_threshold_3D = 128/4 = 32 snapped to the capture size 8.
  EXPECT_EQ(result.outputs->metadata.attention.seq_threshold_3d, 8);
  EXPECT_EQ(result.outputs->metadata.attention.use_3d_path, 1);
}

// Linear-attention layers (layer_kind gdn / mamba2) go through every command that runs a step.
TEST(Cli, LinearLayerFilesRunRecordReplayAndCompare) {
  const fs::path dir = testing::scratch_dir();
  const std::string files = example_path("linear_gdn_bf16.h5").string() + " " +
                            example_path("linear_mamba2_all_fp32.h5").string();
  std::string out;
  ASSERT_EQ(run_command(cli() + " parity --quiet --no-rationale --backend reference " + files, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("ssm/recurrent_state"));
  EXPECT_THAT(out, HasSubstr("2 passed, 0 failed"));
  ASSERT_EQ(run_command(cli() + " record --quiet --out-dir " + dir.string() + " " + files, &out), 0) << out;
  ASSERT_EQ(run_command(cli() + " replay --quiet --no-rationale --backend reference " + (dir / "linear_gdn_bf16.h5").string() +
                            " " + (dir / "linear_mamba2_all_fp32.h5").string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("2 passed, 0 failed"));
  ASSERT_EQ(run_command(cli() + " info " + (dir / "linear_gdn_bf16.h5").string(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("layer:    gdn (linear attention"));
}

void expect_failure_without_output(const fs::path& input, const std::string& expected_message) {
  const fs::path out_path = input.parent_path() / "must_not_exist.h5";
  std::string out;
  EXPECT_EQ(run_command(cli() + " run --batch " + input.string() + " --out " + out_path.string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr(expected_message));
  EXPECT_FALSE(fs::exists(out_path));
  for (const auto& entry : fs::directory_iterator(input.parent_path())) {
    EXPECT_EQ(entry.path().filename().string().find("must_not_exist"), std::string::npos) << entry.path();
  }
  std::string info;
  EXPECT_EQ(run_command(cli() + " info " + input.string(), &info), 2) << info;
}

TEST(Cli, TruncatedFileFailsCleanly) {
  const fs::path dir = testing::scratch_dir();
  const fs::path source = example_path("mixed_swa_bf16.h5");
  const fs::path truncated = dir / "truncated.h5";
  fs::copy_file(source, truncated);
  fs::resize_file(truncated, fs::file_size(source) / 2);
  expect_failure_without_output(truncated, "truncated.h5");
}

TEST(Cli, MissingDatasetAndWrongSchemaFailCleanly) {
  const std::string python = testing::python_with_h5py();
  if (python.empty()) GTEST_SKIP() << "no python3 with h5py found at configure time; install python3-h5py";
  const fs::path dir = testing::scratch_dir();
  const fs::path missing = dir / "missing_query.h5";
  fs::copy_file(example_path("mixed_swa_bf16.h5"), missing);
  ASSERT_EQ(run_command(python + " -c \"import h5py; f = h5py.File('" + missing.string() +
                        "', 'r+'); del f['/inputs/query']\""),
            0);
  expect_failure_without_output(missing, "/inputs/query");
  const fs::path schema2 = dir / "schema2.h5";
  fs::copy_file(example_path("mixed_swa_bf16.h5"), schema2);
  ASSERT_EQ(run_command(python + " -c \"import h5py; f = h5py.File('" + schema2.string() +
                        "', 'r+'); f.attrs['schema_version'] = '2.0'\""),
            0);
  expect_failure_without_output(schema2, "2.0");
}

TEST(Cli, UnwritableOutputFailsWithoutPartialFile) {
  const fs::path dir = testing::scratch_dir();
  const fs::path out_path = dir / "no_such_dir" / "out.h5";
  std::string out;
  EXPECT_EQ(run_command(cli() + " run --batch " + example_path("mixed_swa_bf16.h5").string() + " --out " +
                            out_path.string(),
                        &out),
            1)
      << out;
  EXPECT_FALSE(fs::exists(out_path));
}

}  // namespace
}  // namespace hybridtb
