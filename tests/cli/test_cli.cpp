// The hybridtb command line, end to end: --help everywhere, --version, `run` on every shipped
// example, `info` on valid and broken files, --out checked before the run, FIFOs refused, and the
// rule that a failed or interrupted run leaves no output file and no temporary file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "examples.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "batch_checks.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }

// Whether this build runs under AddressSanitizer (harness/scripts/sanitizer-tests.sh), whose memory
// overhead makes resident-memory bounds meaningless.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
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
  // Both backends build the metadata with the shared builders: parity says so instead of a check.
  EXPECT_THAT(out, HasSubstr("shared (not compared)"));
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

// run --explain prints the cuda backend's plan of a step — every request's path, the kernels' grids,
// the workspace — and exits 0 without computing or writing, on a machine with or without a GPU.
TEST(Cli, RunExplainPrintsTheCudaPlanWithoutAGpu) {
  std::string list;
  ASSERT_EQ(run_command(cli() + " backends", &list), 0) << list;
  if (list.find("\ncuda ") == std::string::npos) GTEST_SKIP() << "this build has no cuda backend";
  const std::string example = example_path("mixed_swa_bf16.h5").string();
  std::string out;
  ASSERT_EQ(run_command(cli() + " run --backend cuda --explain --batch " + example, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("hybridtb run --explain: " + example + " on backend 'cuda'"));
  EXPECT_THAT(out, HasSubstr("\nattention plan: "));
  EXPECT_THAT(out, HasSubstr("\nlayer: decoder, dtype bfloat16"));
  EXPECT_THAT(out, HasSubstr("\n  request 0: query_len "));
  EXPECT_THAT(out, HasSubstr(", tensor-core decode, keys ["));
  EXPECT_THAT(out, HasSubstr(", tensor-core prefill, "));
  EXPECT_THAT(out, HasSubstr("\n  tensor-core prefill: "));
  // Its 3 decodes and 2 prefills run in one grid of the mixed kernel.
  EXPECT_THAT(out, HasSubstr("\n  mixed (the tensor-core prefill and decode CTAs above in one grid, interleaved): grid "
                             "14 CTAs (8 prefill, 6 decode)\n"));
  EXPECT_THAT(out, HasSubstr("; mixed grid: 14 CTAs (8 prefill, 6 decode)"));
  EXPECT_THAT(out, HasSubstr("\nworkspace: upload "));
  EXPECT_THAT(out, HasSubstr("\nvLLM's metadata: max_query_len "));
  EXPECT_THAT(out, HasSubstr("\nsummary: decode fast path: "));
  // A backend without a plan says so.
  ASSERT_EQ(run_command(cli() + " run --backend reference --explain --batch " + example, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("backend 'reference' has no plan to explain"));
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

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command` with stdout and stderr to files of their own (run_command merges them).
int run_split(const std::string& command, const fs::path& out, const fs::path& err) {
  return run_command("(" + command + " >" + out.string() + " 2>" + err.string() + ")");
}

// The progress lines in `text`, in order: done, total and the stage ("attention", "ssm branch").
struct ProgressLine {
  int64_t done = 0;
  int64_t total = 0;
  std::string stage;
};
std::vector<ProgressLine> progress_lines(const std::string& text) {
  std::vector<ProgressLine> lines;
  const std::regex line(R"(\] (\d+)/(\d+) .*  ([a-z ]+) \(query tokens\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
    lines.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), (*it)[3]});
  }
  return lines;
}

// --progress on multi-request batches: per stage (the attention, then the SSM branch of a hybrid
// layer), counts of query tokens that never go down and end at the batch's token count, on stderr
// only; nothing without --progress when stderr is not a terminal, nothing with --quiet.
TEST(Cli, RunProgressCountsUpToTheTotalOnStderrOnly) {
  const fs::path dir = testing::scratch_dir();
  for (const auto& [example, stages] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"mixed_swa_bf16.h5", {"attention"}}, {"hybrid_mamba1_bf16.h5", {"attention", "ssm branch"}}}) {
    SCOPED_TRACE(example);
    const fs::path input = example_path(example);
    const BatchFile batch = read_batch_file(input.string());
    ASSERT_GT(batch.batch.num_reqs(), 1);
    const std::string run =
        cli() + " run --batch " + input.string() + " --out " + (dir / "out.h5").string() + " --force";
    ASSERT_EQ(run_split(run + " --progress", dir / "stdout", dir / "stderr"), 0);
    const auto lines = progress_lines(read_text(dir / "stderr"));
    ASSERT_FALSE(lines.empty()) << read_text(dir / "stderr");
    std::vector<std::string> seen;
    for (size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i].total, batch.batch.num_actual_tokens) << "line " << i;
      if (seen.empty() || seen.back() != lines[i].stage) {
        if (!seen.empty()) {
          EXPECT_EQ(lines[i - 1].done, lines[i - 1].total) << "stage " << seen.back() << " ended";
        }
        seen.push_back(lines[i].stage);
      } else {
        EXPECT_GE(lines[i].done, lines[i - 1].done) << "line " << i;
      }
    }
    EXPECT_EQ(seen, stages);
    EXPECT_EQ(lines.back().done, batch.batch.num_actual_tokens);
    EXPECT_TRUE(progress_lines(read_text(dir / "stdout")).empty()) << "progress belongs on stderr";

    ASSERT_EQ(run_split(run, "/dev/null", dir / "stderr2"), 0);
    EXPECT_EQ(read_text(dir / "stderr2"), "") << "stderr is not a terminal and --progress was not given";
    ASSERT_EQ(run_split(run + " --progress --quiet", "/dev/null", dir / "stderr3"), 0);
    EXPECT_EQ(read_text(dir / "stderr3"), "") << "--quiet silences the progress";
  }
}

// --progress also covers the file on either side of the step: reading the batch first, writing
// OUT last, each in MiB from 0 to done == total.
TEST(Cli, RunProgressShowsReadingTheBatchAndWritingTheOutput) {
  const fs::path dir = testing::scratch_dir();
  const fs::path input = example_path("mixed_swa_bf16.h5");
  const fs::path out = dir / "out.h5";
  ASSERT_EQ(run_split(cli() + " run --progress --batch " + input.string() + " --out " + out.string(), dir / "stdout",
                      dir / "stderr"),
            0);
  const std::string err = read_text(dir / "stderr");
  const std::regex line(R"(\] (\d+)/(\d+) .*  (reading|writing) (\S+) \(MiB\))");
  std::vector<std::smatch> lines;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it) {
    lines.push_back(*it);
  }
  ASSERT_GE(lines.size(), 4u) << err;
  EXPECT_EQ(lines.front()[3], "reading");
  EXPECT_EQ(lines.front()[4], input.string());
  EXPECT_EQ(lines.front()[1], "0");
  EXPECT_EQ(lines.back()[3], "writing");
  EXPECT_EQ(lines.back()[4], out.string());
  EXPECT_EQ(lines.back()[1], lines.back()[2]);
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i][3] != lines[i - 1][3]) {
      EXPECT_EQ(lines[i - 1][1], lines[i - 1][2]) << "the read ended before the write began";
    }
  }
}

TEST(Cli, RecordProgressCountsQueryTokensOnStderr) {
  const fs::path dir = testing::scratch_dir();
  const fs::path input = example_path("mixed_swa_bf16.h5");
  const BatchFile batch = read_batch_file(input.string());
  ASSERT_EQ(run_split(cli() + " record --progress --out-dir " + dir.string() + " " + input.string(), dir / "stdout",
                      dir / "stderr"),
            0);
  const std::string err = read_text(dir / "stderr");
  EXPECT_THAT(err, HasSubstr(std::to_string(batch.batch.num_actual_tokens) + "/" +
                             std::to_string(batch.batch.num_actual_tokens) + " query tokens"));
  EXPECT_THAT(err, HasSubstr("] 1/1"));  // the file count ends at the number of files
}

// The maximum resident set of one run of `argv` (exit status 0 required; -1 otherwise), in bytes:
// wait4 reports the child's own peak, unlike RUSAGE_CHILDREN's maximum over every child so far.
int64_t max_rss_of(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
}

// The number after `label` in --dry-run's output ("input file:   1234 bytes").
int64_t printed_bytes(const std::string& text, const std::string& label) {
  const std::regex pattern(label + R"(\s*(\d+) bytes)");
  std::smatch match;
  if (!std::regex_search(text, match, pattern)) return -1;
  return std::stoll(match[1]);
}

// --dry-run's sizes bound what a real run reads, writes and holds, and it writes nothing.
TEST(Cli, RunDryRunBoundsTheRealSizesAndWritesNothing) {
  const fs::path dir = testing::scratch_dir();
  const fs::path input = dir / "in.h5";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --quiet --preset llama3-8b --mix d8@2k+c1x64@1k --out " + input.string(), &out),
            0)
      << out;
  const fs::path result = dir / "out.h5";
  ASSERT_EQ(run_command(cli() + " run --dry-run --batch " + input.string() + " --out " + result.string(), &out), 0)
      << out;
  EXPECT_FALSE(fs::exists(result));
  const int64_t input_bytes = printed_bytes(out, "input file:");
  const int64_t output_bytes = printed_bytes(out, "output file:");
  const int64_t peak_bytes = printed_bytes(out, "peak memory:");
  ASSERT_GT(input_bytes, 0) << out;
  // The input's tensors are nearly the whole file (HDF5 adds its headers).
  const auto input_size = static_cast<int64_t>(fs::file_size(input));
  EXPECT_LE(input_bytes, input_size);
  EXPECT_GE(input_bytes, input_size * 9 / 10);

  // The program's own footprint (its code, a CUDA build's device images, the libraries) is what a
  // dry run of the same file holds; the estimate bounds what the run adds to it.
  const int64_t baseline_rss =
      max_rss_of({cli(), "run", "--dry-run", "--batch", input.string(), "--out", result.string()});
  const int64_t peak_rss = max_rss_of({cli(), "run", "--quiet", "--batch", input.string(), "--out", result.string()});
  ASSERT_GT(baseline_rss, 0);
  ASSERT_GT(peak_rss, 0);
  const auto output_size = static_cast<int64_t>(fs::file_size(result));
  EXPECT_GE(output_bytes, output_size * 9 / 10) << "estimate vs the file written";
  EXPECT_LE(output_bytes, output_size * 13 / 10);
  if (!kSanitized) {  // AddressSanitizer's shadow memory and quarantine are not the program's own
    EXPECT_GE(peak_bytes, peak_rss - baseline_rss) << "the peak estimate bounds the run's resident data";
    EXPECT_LE(peak_bytes, 3 * (peak_rss - baseline_rss)) << "and not wildly";
  }
}

// Under a memory limit, a step that cannot fit is refused before any allocation, naming the size
// and what needs it (exit 2, nothing written); gen --dry-run of the same mix prints its size.
TEST(Cli, TooLittleMemoryIsAClearErrorNotBadAlloc) {
  const fs::path dir = testing::scratch_dir();
  const fs::path file = dir / "big.h5";
  std::string out;
  const std::string limit = "HYBRIDTB_MEMORY_AVAILABLE=" + std::to_string(int64_t{6} << 30) + " ";
  EXPECT_EQ(run_command(limit + cli() + " gen --preset llama3-8b --mix d64@64k --out " + file.string(), &out), 2)
      << out;
  EXPECT_THAT(out, HasSubstr("host memory for generating llama3-8b d64@64k"));
  EXPECT_THAT(out, HasSubstr("6.0 GiB is available (HYBRIDTB_MEMORY_AVAILABLE)"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("bad_alloc")));
  EXPECT_FALSE(fs::exists(file));

  ASSERT_EQ(run_command(limit + cli() + " gen --dry-run --preset llama3-8b --mix d64@64k --out " + file.string(), &out),
            0)
      << out;
  EXPECT_FALSE(fs::exists(file));
  // 64 requests × 4097 blocks (65537 tokens, 16 a block) × K and V × 16 tokens × 8 heads × 128 × 2 bytes:
  // 16 GiB of KV cache alone.
  const std::regex size(R"(file (\d+) bytes)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(out, match, size)) << out;
  EXPECT_GE(std::stoll(match[1]), int64_t{64} * 4097 * 2 * 16 * 8 * 128 * 2);

  const fs::path small = dir / "small.h5";
  ASSERT_EQ(run_command(cli() + " gen --quiet --preset llama3-8b --mix d4@1k --out " + small.string(), &out), 0) << out;
  const fs::path result = dir / "out.h5";
  EXPECT_EQ(run_command("HYBRIDTB_MEMORY_AVAILABLE=1000000 " + cli() + " run --batch " + small.string() + " --out " +
                            result.string(),
                        &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("of host memory for reading " + small.string()));
  EXPECT_FALSE(fs::exists(result));
  // record refuses the file the same way, and records nothing.
  fs::create_directories(dir / "recorded");
  EXPECT_EQ(run_command("HYBRIDTB_MEMORY_AVAILABLE=1000000 " + cli() + " record --out-dir " +
                            (dir / "recorded").string() + " " + small.string(),
                        &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("of host memory for reading " + small.string()));
  EXPECT_TRUE(fs::is_empty(dir / "recorded"));
}

// --outputs-only writes /outputs alone, with the batch file it belongs to named relative to it:
// `info` reads the pair (also after both move together), the outputs are bit for bit those of a
// full run, the file is much smaller, and a changed batch file is refused.
TEST(Cli, OutputsOnlyFileIsReadWithItsBatchFile) {
  const fs::path dir = testing::scratch_dir();
  fs::create_directories(dir / "a");
  const fs::path input = dir / "a" / "in.h5";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --quiet --preset hymba-small --mix d8@1k+p1x64 --out " + input.string(), &out), 0)
      << out;
  const fs::path full = dir / "full.h5";
  const fs::path only = dir / "a" / "outputs.h5";
  ASSERT_EQ(run_command(cli() + " run --quiet --batch " + input.string() + " --out " + full.string(), &out), 0) << out;
  ASSERT_EQ(run_command(cli() + " run --quiet --outputs-only --batch " + input.string() + " --out " + only.string(),
                        &out),
            0)
      << out;
  EXPECT_LT(fs::file_size(only) * 10, fs::file_size(full) * 6) << "the inputs are not copied";
  EXPECT_FALSE(is_outputs_file(full.string()));
  ASSERT_TRUE(is_outputs_file(only.string()));

  std::string batch_path;
  const BatchFile pair = read_outputs_file(only.string(), &batch_path);
  EXPECT_EQ(fs::canonical(batch_path), fs::canonical(input));
  const BatchFile whole = read_batch_file(full.string());
  ASSERT_TRUE(pair.outputs.has_value() && whole.outputs.has_value());
  EXPECT_EQ(first_bit_difference(*pair.outputs, *whole.outputs), "");
  EXPECT_EQ(pair.outputs->backend, "reference");

  ASSERT_EQ(run_command(cli() + " info " + only.string(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("outputs file of " + input.string()));
  EXPECT_THAT(out, HasSubstr("/outputs: from backend 'reference'"));
  // An outputs file alone is not a batch file.
  EXPECT_THROW(read_batch_file(only.string()), Error);

  // The pair moves together: the reference is relative.
  fs::rename(dir / "a", dir / "b");
  ASSERT_EQ(run_command(cli() + " info " + (dir / "b" / "outputs.h5").string(), &out), 0) << out;

  // A batch file that changed since is refused, naming the attribute.
  std::ofstream(dir / "b" / "in.h5", std::ios::app) << "x";
  EXPECT_EQ(run_command(cli() + " info " + (dir / "b" / "outputs.h5").string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("outputs_of_bytes"));
  EXPECT_THAT(out, HasSubstr("the batch file changed"));
}

// A file that declares far more than it holds (a KV cache of 16 GiB never written) is broken, not
// large: run names the dataset as the reader does, --dry-run refuses it, and neither blames memory,
// even with far too little of it.
TEST(Cli, AFileDeclaringMoreThanItHoldsIsBrokenNotTooLarge) {
  const std::string python = testing::python_with_h5py();
  if (python.empty()) GTEST_SKIP() << "no python3 with h5py (install python3-h5py)";
  const fs::path dir = testing::scratch_dir();
  const fs::path file = dir / "declares.h5";
  fs::copy_file(example_path("hybrid_prefix_sum_padded_fp16.h5"), file);  // float16, kv_cache_dtype auto
  std::string out;
  ASSERT_EQ(run_command(python + " -c \"import h5py, sys; f = h5py.File(sys.argv[1], 'a'); c = f['inputs/kv_cache']; "
                                 "shape = (1 << 22,) + c.shape[1:]; del f['inputs/kv_cache']; "
                                 "f['inputs'].create_dataset('kv_cache', shape=shape, dtype='<f2')"
                                 ".attrs['dtype_name'] = 'float16'\" " +
                            file.string(),
                        &out),
            0)
      << out;
  ASSERT_LT(fs::file_size(file), 1u << 20);
  const std::string little_memory = "HYBRIDTB_MEMORY_AVAILABLE=1000000 ";
  EXPECT_EQ(run_command(little_memory + cli() + " run --dry-run --batch " + file.string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("more than the file can hold"));
  EXPECT_EQ(run_command(little_memory + cli() + " run --batch " + file.string() + " --out " +
                            (dir / "out.h5").string(),
                        &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("/inputs/kv_cache: the file stores 0 of its"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("host memory")));
  EXPECT_FALSE(fs::exists(dir / "out.h5"));
}

}  // namespace
}  // namespace hybridtb
