// `hybridtb record`, `replay` and `parity` end to end: exit 0 with "N passed, 0 failed", exit 1
// with the location of a tampered /expected element (also next to a bad file, whose error entry
// the report keeps), exit 2 when nothing could be judged, and a --report that nlohmann parses. Run: ctest -L compare.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hybridtb/batch_file.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }
fs::path example(const std::string& name) { return testing::source_dir() / "datasets" / "examples" / name; }

fs::path recorded_copy(const fs::path& dir, const std::string& name) {
  const fs::path copy = dir / name;
  fs::copy_file(example(name), copy);
  std::string out;
  EXPECT_EQ(run_command(cli() + " record --quiet " + copy.string(), &out), 0) << out;
  return copy;
}

TEST(CompareCli, HelpMentionsTheExitCodes) {
  for (const std::string sub : {"record", "parity", "replay"}) {
    std::string out;
    EXPECT_EQ(run_command(cli() + " " + sub + " --help", &out), 0) << sub;
    EXPECT_THAT(out, HasSubstr("Usage")) << sub;
  }
}

TEST(CompareCli, RecordThenReplayOnTheReferencePasses) {
  const fs::path dir = testing::scratch_dir();
  const fs::path a = recorded_copy(dir, "mixed_swa_bf16.h5");
  const fs::path b = recorded_copy(dir, "hybrid_mamba1_bf16.h5");
  const BatchFile file = read_batch_file(a.string());
  ASSERT_TRUE(file.expected.has_value());
  EXPECT_EQ(file.expected->backend, "reference");
  const fs::path report = dir / "report.json";
  std::string out;
  ASSERT_EQ(run_command(cli() + " replay --quiet --backend reference " + a.string() + " " + b.string() + " --report " +
                            report.string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("\n2 passed, 0 failed\n"));
  EXPECT_THAT(out, HasSubstr("attn_output"));
  EXPECT_THAT(out, HasSubstr("ssm_output"));
  std::ifstream in(report);
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["summary"]["passed"], 2);
  EXPECT_EQ(json["environment"]["command"], "replay");
  EXPECT_FALSE(json["environment"]["build_type"].get<std::string>().empty());
  ASSERT_EQ(json["cases"].size(), 2u);
  EXPECT_TRUE(json["cases"][0]["quantities"][0].contains("max_abs"));
  EXPECT_TRUE(json["cases"][0]["quantities"][0].contains("nmse"));
  EXPECT_TRUE(json["cases"][0]["quantities"][0]["tolerance"].contains("rationale"));
}

TEST(CompareCli, RecordToOutDirLeavesTheInputAlone) {
  const fs::path dir = testing::scratch_dir();
  std::string out;
  ASSERT_EQ(run_command(cli() + " record --quiet --out-dir " + (dir / "rec").string() + " " +
                            example("encoder_only_fp16.h5").string(),
                        &out),
            0)
      << out;
  EXPECT_TRUE(read_batch_file((dir / "rec" / "encoder_only_fp16.h5").string()).expected.has_value());
}

TEST(CompareCli, ParityOfTheReferenceAgainstItselfPasses) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " parity --quiet --backend reference " + example("int8_kv_mm_prefix_bf16.h5").string() +
                            " " + example("decode_cudagraph_padded_fp32.h5").string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("\n2 passed, 0 failed\n"));
}

// --ssm-prefill-operands takes float32 or model (BackendSettings::ssm_prefill_operands); the
// reference ignores it (float64 everywhere, the float64 rows), anything else is a usage error.
TEST(CompareCli, SsmPrefillOperandsIsASettingOfTheBackends) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " parity --quiet --backend reference --ssm-prefill-operands model " +
                            example("linear_mamba2_all_fp32.h5").string() + " " +
                            example("hybrid_mamba1_bf16.h5").string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("\n2 passed, 0 failed\n"));
  EXPECT_EQ(run_command(cli() + " parity --quiet --backend reference --ssm-prefill-operands bfloat16 " +
                            example("linear_mamba2_all_fp32.h5").string(),
                        &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("--ssm-prefill-operands"));
}

TEST(CompareCli, TamperedExpectedFailsWithTheLocation) {
  if (testing::python_with_h5py().empty()) GTEST_SKIP() << "no python3 with h5py found at configure time";
  const fs::path dir = testing::scratch_dir();
  const fs::path file = recorded_copy(dir, "mixed_swa_bf16.h5");
  const BatchFile batch = read_batch_file(file.string());
  // Request 1, its first token, head 1, dim 2.
  const int64_t row = batch.batch.query_start_loc[1];
  const std::string script = "import h5py\n"
                             "with h5py.File('" + file.string() + "', 'r+') as f:\n"
                             "    d = f['/expected/attn_output']\n"
                             "    d[" + std::to_string(row) + ", 1, 2] = d[" + std::to_string(row) + ", 1, 2] + 1.0\n";
  const fs::path py = dir / "tamper.py";
  std::ofstream(py) << script;
  std::string out;
  ASSERT_EQ(run_command(testing::python_with_h5py() + " " + py.string(), &out), 0) << out;
  ASSERT_EQ(run_command(cli() + " replay --quiet --backend reference " + file.string(), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("(req=1, tok=0, head=1, dim=2)"));
  EXPECT_THAT(out, HasSubstr("\n0 passed, 1 failed\n"));
}

// A mismatch next to a bad file: the report is written with both (the FAIL and the error entry),
// and the exit status is the mismatch's; files not compared are not counted as failed.
TEST(CompareCli, AFailNextToABadFileIsKeptInTheReport) {
  const fs::path dir = testing::scratch_dir();
  const fs::path good = recorded_copy(dir, "encoder_only_fp16.h5");
  const fs::path tampered = recorded_copy(dir, "mixed_swa_bf16.h5");
  BatchFile batch = read_batch_file(tampered.string());
  batch.expected->attn_output.data_as<double>()[5] += 1.0;
  write_batch_file(tampered.string(), batch);
  std::ofstream(dir / "garbage.h5") << "not an hdf5 file";
  const fs::path report = dir / "mixed-report.json";
  std::string out;
  EXPECT_EQ(run_command(cli() + " replay --quiet --backend reference " + good.string() + " " + (dir / "garbage.h5").string() +
                            " " + tampered.string() + " --report " + report.string(),
                        &out),
            1)
      << out;
  EXPECT_THAT(out, HasSubstr("\n1 passed, 1 failed\n"));
  EXPECT_THAT(out, HasSubstr("1 bad input"));
  std::ifstream in(report);
  ASSERT_TRUE(in.good()) << "the report must be written";
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["summary"]["passed"], 1);
  EXPECT_EQ(json["summary"]["failed"], 1);
  EXPECT_EQ(json["summary"]["errors"], 1);
  ASSERT_EQ(json["cases"].size(), 3u);
  EXPECT_THAT(json["cases"][1]["error"].get<std::string>(), HasSubstr("garbage.h5"));
  EXPECT_FALSE(json["cases"][2]["passed"].get<bool>());

  // Passing files next to a bad one: the verdict covers some files only (exit 1), report written.
  EXPECT_EQ(run_command(cli() + " replay --quiet --backend reference " + good.string() + " " +
                            (dir / "garbage.h5").string() + " --report " + report.string(),
                        &out),
            1)
      << out;
  std::ifstream again(report);
  EXPECT_EQ(nlohmann::json::parse(again)["summary"]["errors"], 1);
}

TEST(CompareCli, BadInputExitsTwo) {
  const fs::path dir = testing::scratch_dir();
  std::string out;
  EXPECT_EQ(run_command(cli() + " replay --backend reference " + (dir / "missing.h5").string(), &out), 2) << out;
  std::ofstream(dir / "garbage.h5") << "not an hdf5 file";
  EXPECT_EQ(run_command(cli() + " parity --backend reference " + (dir / "garbage.h5").string(), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("garbage.h5"));
  // A file without /expected cannot be replayed.
  EXPECT_EQ(run_command(cli() + " replay --backend reference " + example("mixed_swa_bf16.h5").string(), &out), 2)
      << out;
  EXPECT_THAT(out, HasSubstr("/expected"));
  EXPECT_EQ(run_command(cli() + " parity --backend no_such_backend " + example("mixed_swa_bf16.h5").string(), &out), 2)
      << out;
  EXPECT_EQ(run_command(cli() + " record " + (dir / "missing.h5").string(), &out), 2) << out;
}

}  // namespace
}  // namespace hybridtb
