// `hybridtb gen` end to end through the executable: help, a preset × mix grid in one command, the
// recorded command regenerating a file bit for bit, replay of a generated file, and exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "batch_checks.h"
#include "hybridtb/batch_file.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }

TEST(GenCli, HelpDocumentsTheGrammarThePresetsAndTheKeys) {
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --help", &out), 0);
  for (const char* text : {"Usage", "--mix", "--preset", "--set", "--pad-to", "--prefix-hits", "--alias-blocks",
                           "--ssm-slots", "dN@C", "pNxL", "cNxL@C", "sNxK@C", "llama3-8b", "mamba-2.8b",
                           "sliding_window", "ssm.<param>"}) {
    EXPECT_THAT(out, HasSubstr(text));
  }
  ASSERT_EQ(run_command(cli() + " gen --list-presets", &out), 0);
  EXPECT_THAT(out, HasSubstr("gemma3-local-256"));
}

TEST(GenCli, GridOfPresetsTimesMixesInOneCommand) {
  const fs::path scratch = testing::scratch_dir();
  const fs::path dir = scratch / "grid";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --preset llama3-8b,gpt-oss --mix p1x32+d2@100 --mix s2x3@1k --seed 42 --out-dir " +
                            dir.string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("seed 42"));
  for (const char* name : {"llama3-8b__d2@100+p1x32.h5", "llama3-8b__s2x3@1k.h5", "gpt-oss__d2@100+p1x32.h5",
                           "gpt-oss__s2x3@1k.h5"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(dir / name));
    EXPECT_THAT(out, HasSubstr((dir / name).string()));
    const BatchFile f = read_batch_file((dir / name).string());
    EXPECT_EQ(f.provenance.at("seed"), "42");
    EXPECT_EQ(f.provenance.at("producer"), "hybridtb gen");
    EXPECT_THAT(f.provenance.at("generator_command"), HasSubstr("--seed 42"));
  }
  const fs::path replayed = scratch / "replayed.h5";
  EXPECT_EQ(run_command(cli() + " run --backend reference --quiet --batch " + (dir / "gpt-oss__d2@100+p1x32.h5").string() +
                        " --out " + replayed.string(), &out),
            0)
      << out;
}

TEST(GenCli, TheRecordedCommandRegeneratesTheFileBitForBit) {
  const fs::path dir = testing::scratch_dir();
  const fs::path first = dir / "first.h5";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --preset hymba-small --mix d3@200+c1x16@64 --seed 7 --set num_heads=5 --set "
                                "num_kv_heads=1 --set ssm.intermediate_size=64 --set ssm.dt_rank=4 --prefix-hits 64 "
                                "--mamba-cache-mode all --set mamba_block_size=32 --engine-version 0.12.0 --out " + first.string(),
                        &out),
            0)
      << out;
  const BatchFile a = read_batch_file(first.string());
  std::string command = a.provenance.at("generator_command");
  ASSERT_EQ(command.rfind("hybridtb gen ", 0), 0u) << command;
  const size_t out_at = command.rfind(" --out ");
  ASSERT_NE(out_at, std::string::npos);
  const fs::path second = dir / "second.h5";
  command = cli() + command.substr(std::string("hybridtb").size(), out_at - 8) + " --out " + second.string();
  ASSERT_EQ(run_command(command, &out), 0) << command << "\n" << out;
  const BatchFile b = read_batch_file(second.string());
  testing::expect_same_batch_inputs(a, b);
  EXPECT_EQ(b.provenance.at("generator_command").substr(0, out_at), a.provenance.at("generator_command").substr(0, out_at));
}

TEST(GenCli, PadToWritesPaddingRequests) {
  const fs::path path = testing::scratch_dir() / "padded.h5";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d5@300 --pad-to 8 --out " + path.string(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("padded to 8"));
  const BatchFile f = read_batch_file(path.string());
  EXPECT_EQ(f.batch.num_reqs(), 8);
  EXPECT_EQ(f.batch.slot_mapping.back(), -1);
}

TEST(GenCli, ErrorsAndExitCodes) {
  const fs::path dir = testing::scratch_dir();
  std::string out;
  EXPECT_EQ(run_command(cli() + " gen --mix d1@1 --out " + (dir / "a.h5").string(), &out), 2);  // no preset
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d1@1", &out), 2);                     // no output
  EXPECT_EQ(run_command(cli() + " gen --preset all --mix d1@1 --out " + (dir / "a.h5").string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("--out-dir"));
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d1@1+p2y --out " + (dir / "a.h5").string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("term 2 'p2y' at character 8"));
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d1@1 --set windw=3 --out " + (dir / "a.h5").string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("unknown key 'windw'"));
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix p1x4 --pad-to 8 --out " + (dir / "a.h5").string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("decode-only"));
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d1@1 --seed -1 --out " + (dir / "a.h5").string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("--seed"));
  // Writing into a directory that does not exist is a failed write, not bad settings.
  EXPECT_EQ(run_command(cli() + " gen --preset gpt-oss --mix d1@1 --out " + (dir / "no" / "a.h5").string(), &out), 1);
  EXPECT_FALSE(fs::exists(dir / "a.h5"));
}

}  // namespace
}  // namespace hybridtb
