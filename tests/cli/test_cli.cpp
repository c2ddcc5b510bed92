// The hybridtb command line, end to end: --help everywhere, --version, `run` on every shipped
// example, `info` on valid and broken files, --out checked before the run, FIFOs refused, and the
// rule that a failed or interrupted run leaves no output file and no temporary file.
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
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("does not exist"));
  EXPECT_FALSE(fs::exists(out_path));
}

// --out is checked before the run: a bad --out next to an unreadable batch is what is reported.
TEST(Cli, RunChecksOutBeforeComputing) {
  const fs::path dir = testing::scratch_dir();
  std::ofstream(dir / "garbage.h5") << "not an hdf5 file";
  const std::string garbage = (dir / "garbage.h5").string();
  std::string out;
  EXPECT_EQ(run_command(cli() + " run --batch " + garbage + " --out " + dir.string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("is a directory"));
  EXPECT_EQ(run_command(cli() + " run --batch " + garbage + " --out " + garbage + " --force", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("is the input file"));

  const fs::path input = dir / "in.h5";
  fs::copy_file(example_path("encoder_only_fp16.h5"), input);
  const fs::path existing = dir / "existing.h5";
  std::ofstream(existing) << "keep me";
  EXPECT_EQ(run_command(cli() + " run --quiet --batch " + input.string() + " --out " + existing.string(), &out), 2)
      << out;
  EXPECT_THAT(out, HasSubstr("--force"));
  EXPECT_EQ(fs::file_size(existing), 7u) << "an existing file is left alone without --force";
  EXPECT_EQ(run_command(cli() + " run --quiet --force --batch " + input.string() + " --out " + existing.string(), &out),
            0)
      << out;
  EXPECT_TRUE(read_batch_file(existing.string()).outputs.has_value());
}

TEST(Cli, AFifoIsRefusedNotReadFrom) {
  const fs::path dir = testing::scratch_dir();
  const fs::path fifo = dir / "pipe.h5";
  ASSERT_EQ(run_command("mkfifo " + fifo.string()), 0);
  std::string out;
  // `timeout` turns a hang into exit 124, which the assertion reports.
  EXPECT_EQ(run_command("timeout 20 " + cli() + " info " + fifo.string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("not a regular file"));
  EXPECT_EQ(run_command("timeout 20 " + cli() + " run --batch " + fifo.string() + " --out " +
                            (dir / "o.h5").string(),
                        &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("not a regular file"));
}

// On a machine without a GPU, a build with the cuda backend lists it as unavailable, and asking for
// it is its own status (3), not bad input (2) or a failed run (1).
TEST(Cli, NoDeviceIsItsOwnStatus) {
  std::string list;
  ASSERT_EQ(run_command(cli() + " backends", &list), 0) << list;
  EXPECT_THAT(list, HasSubstr("reference   available"));
  const auto line_start = list.find("\ncuda ");
  if (line_start == std::string::npos) GTEST_SKIP() << "this build has no cuda backend";
  const std::string line = list.substr(line_start + 1, list.find('\n', line_start + 1) - line_start - 1);
  if (line.find("UNAVAILABLE") == std::string::npos) GTEST_SKIP() << "a GPU is present: " << line;
  EXPECT_THAT(line, HasSubstr("no CUDA device"));
  const fs::path dir = testing::scratch_dir();
  const std::string example = example_path("encoder_only_fp16.h5").string();
  std::string out;
  EXPECT_EQ(run_command(cli() + " run --backend cuda --batch " + example + " --out " + (dir / "o.h5").string(), &out), 3)
      << out;
  EXPECT_THAT(out, HasSubstr("not available on this machine"));
  EXPECT_FALSE(fs::exists(dir / "o.h5"));
  EXPECT_EQ(run_command(cli() + " parity --backend cuda " + example, &out), 3) << out;
  EXPECT_EQ(run_command(cli() + " parity --backend reference --against cuda " + example, &out), 3) << out;
}

// A newer minor version is read, with a warning naming it and each item this build ignores.
TEST(Cli, NewerMinorVersionIsReadWithAWarningNamingWhatIsIgnored) {
  const std::string python = testing::python_with_h5py();
  if (python.empty()) GTEST_SKIP() << "no python3 with h5py found at configure time; install python3-h5py";
  const fs::path dir = testing::scratch_dir();
  const fs::path newer = dir / "newer.h5";
  fs::copy_file(example_path("encoder_only_fp16.h5"), newer);
  ASSERT_EQ(run_command(python + " -c \"import h5py; f = h5py.File('" + newer.string() +
                        "', 'r+'); f.attrs['schema_version'] = '1.9'; f.create_group('future')\""),
            0);
  std::string out;
  ASSERT_EQ(run_command(cli() + " run --quiet --batch " + newer.string() + " --out " + (dir / "o.h5").string(), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("warning: schema_version 1.9 is newer than this build's"));
  EXPECT_THAT(out, HasSubstr("warning: /future is not part of hybrid-batch"));
  ASSERT_EQ(run_command(cli() + " info " + newer.string(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("/future is not part of"));
  // The shipped files draw no warning.
  ASSERT_EQ(run_command(cli() + " info " + example_path("encoder_only_fp16.h5").string(), &out), 0) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("warning:")));
}

TEST(Cli, BackendsListsTheSsmModes) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " backends", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("SSM modes (reference):"));
  for (const char* mode : {"zero", "prefix_sum", "mamba1", "mamba2", "gdn"}) EXPECT_THAT(out, HasSubstr(mode));
}

TEST(Cli, VersionNamesTheRevisionAndTheSchema) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " --version", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("hybridtb "));
  EXPECT_THAT(out, HasSubstr("hybrid-batch 1."));
}

// SIGINT while a large file is being written: the temporary file is removed and no output appears.
TEST(Cli, AnInterruptedWriteLeavesNoTemporaryFile) {
  const fs::path dir = testing::scratch_dir();
  const fs::path script = dir / "interrupt.sh";
  std::ofstream(script) << "set -u\n"
                        << cli() << " gen --quiet --preset llama3-8b --mix d16@8k --out " << (dir / "big.h5").string()
                        << " &\npid=$!\n"
                        << "for i in $(seq 1 60000); do ls " << dir.string()
                        << "/big.h5.tmp-* >/dev/null 2>&1 && break; sleep 0.001; done\n"
                        << "kill -INT $pid\nwait $pid\necho \"exit $?\"\n";
  std::string out;
  ASSERT_EQ(run_command("bash " + script.string(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("exit 130")) << "the process dies of SIGINT (128 + 2)";
  EXPECT_FALSE(fs::exists(dir / "big.h5"));
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace hybridtb
