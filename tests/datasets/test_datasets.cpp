// The shipped, recorded datasets (datasets/recorded/) and the capture writer (datasets/capture/).
//
// - ManifestAndFilesAgree: every manifest entry names an existing file whose sha256 matches, no
//   .h5 file is unlisted, names are unique, labels are quick/full, each entry lists what it covers,
//   and the generator_command (and post_command, if any) in the manifest is the one the file stores.
// - AllFilesReplayOnTheReference: `hybridtb replay --backend reference <every file>` exits 0 and
//   prints "N passed, 0 failed".
// - QuickFileRegeneratesBitIdentically: the first `quick` entry's command, run in a scratch dir,
//   gives a file whose content (config, batch, every input tensor, pools, weights, provenance) is
//   bitwise equal to the committed one. The whole-file sha256 is NOT compared: HDF5 object headers
//   carry modification times, so two runs of the same command differ in a few header bytes.
// - CaptureRoundTrip: datasets/capture/ writes synthetic tensors (tests/datasets/capture_synthetic.py)
//   without /expected; `hybridtb info` validates it; `hybridtb record` stores the reference's
//   results; the module then writes a second capture whose /expected comes from those recorded
//   arrays (through the module's output writer, as a serving process would after the call), and
//   `hybridtb replay --backend reference` passes on it. The python script also checks the
//   environment gating (layers, file and byte budgets, every Nth step) and the atomic write.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "hybridtb/batch_file.h"
#include "batch_checks.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }
fs::path recorded_dir() { return testing::source_dir() / "datasets" / "recorded"; }

nlohmann::json manifest() {
  std::ifstream in(recorded_dir() / "manifest.json");
  EXPECT_TRUE(in.good()) << "cannot open datasets/recorded/manifest.json";
  return nlohmann::json::parse(in);
}

std::string sha256_of(const fs::path& path) {
  std::string out;
  if (run_command("sha256sum '" + path.string() + "'", &out) != 0) return "sha256sum failed: " + out;
  return out.substr(0, out.find(' '));
}

TEST(RecordedDatasets, ManifestAndFilesAgree) {
  const nlohmann::json m = manifest();
  ASSERT_TRUE(m.contains("datasets") && m["datasets"].is_array());
  ASSERT_FALSE(m["datasets"].empty());
  std::set<std::string> names, files;
  for (const auto& e : m["datasets"]) {
    const std::string name = e.at("name"), file = e.at("file");
    SCOPED_TRACE(name);
    EXPECT_TRUE(names.insert(name).second) << "duplicate name";
    EXPECT_TRUE(files.insert(file).second) << "duplicate file";
    const std::string label = e.at("label");
    EXPECT_TRUE(label == "quick" || label == "full") << label;
    EXPECT_FALSE(e.at("covers").empty());
    const std::string command = e.at("generator_command");
    EXPECT_EQ(command.rfind("hybridtb gen ", 0), 0u) << command;
    const fs::path path = recorded_dir() / file;
    ASSERT_TRUE(fs::exists(path)) << "listed but missing: " << path;
    EXPECT_EQ(sha256_of(path), e.at("sha256").get<std::string>()) << "sha256 differs: rerun datasets/recorded/make.sh";
    const BatchFile f = read_batch_file(path.string());
    EXPECT_EQ(f.provenance.count("generator_command") ? f.provenance.at("generator_command") : "", command);
    EXPECT_TRUE(f.expected.has_value()) << "no /expected recorded";
    // Features the mix grammar cannot express are added by a script of datasets/recorded/, whose
    // command the file stores too (`post_command`).
    const std::string post = e.value("post_command", "");
    EXPECT_EQ(f.provenance.count("post_command") ? f.provenance.at("post_command") : "", post);
    if (post.rfind("add_mm_prefix.py", 0) == 0) {
      EXPECT_TRUE(f.batch.mm_prefix_range.has_value());
    }
  }
  for (const auto& entry : fs::directory_iterator(recorded_dir())) {
    if (entry.path().extension() == ".h5") {
      EXPECT_TRUE(files.count(entry.path().filename().string())) << "not in the manifest: " << entry.path();
    }
  }
}

TEST(RecordedDatasets, AllFilesReplayOnTheReference) {
  const nlohmann::json m = manifest();
  std::string command = cli() + " replay --backend reference --quiet --no-rationale";
  for (const auto& e : m["datasets"]) command += " '" + (recorded_dir() / e.at("file").get<std::string>()).string() + "'";
  std::string out;
  EXPECT_EQ(run_command(command, &out), 0) << out;
  const std::string want = std::to_string(m["datasets"].size()) + " passed, 0 failed";
  EXPECT_NE(out.find(want), std::string::npos) << "expected '" << want << "' in:\n" << out;
}

TEST(RecordedDatasets, QuickFileRegeneratesBitIdentically) {
  const nlohmann::json m = manifest();
  const auto it = std::find_if(m["datasets"].begin(), m["datasets"].end(),
                               [](const nlohmann::json& e) { return e.at("label") == "quick"; });
  ASSERT_NE(it, m["datasets"].end()) << "no quick entry";
  const std::string file = it->at("file"), command = it->at("generator_command");
  SCOPED_TRACE(command);
  const fs::path dir = testing::scratch_dir();
  // The manifest's commands are plain word lists without shell syntax, run in the dataset's directory.
  std::string out;
  ASSERT_EQ(run_command("cd '" + dir.string() + "' && '" + cli() + "'" + command.substr(std::string("hybridtb").size()), &out), 0)
      << out;
  const BatchFile committed = read_batch_file((recorded_dir() / file).string());
  const BatchFile regenerated = read_batch_file((dir / file).string());
  EXPECT_EQ(committed.provenance, regenerated.provenance);  // seed, mix, preset, generator_command
  testing::expect_same_batch_inputs(committed, regenerated);
}

TEST(Capture, SyntheticCaptureValidatesRecordsAndReplays) {
  const std::string py = testing::python_with_h5py();
  if (py.empty()) GTEST_SKIP() << "no python3 with h5py + numpy found at configure time";
  const fs::path dir = testing::scratch_dir();
  const std::string script = (testing::source_dir() / "tests" / "datasets" / "capture_synthetic.py").string();
  const std::string q = "'";
  std::string out;
  // 1. Capture the inputs (no /expected): the module's env-gated hook around a fake forward.
  ASSERT_EQ(run_command(py + " " + script + " capture --dir " + q + (dir / "raw").string() + q, &out), 0) << out;
  const std::string raw = (dir / "raw" / "capture_layers.0.attn_step0.h5").string();
  ASSERT_TRUE(fs::exists(raw)) << out;
  // 2. hybridtb validates it.
  ASSERT_EQ(run_command(cli() + " info " + q + raw + q, &out), 0) << out;
  // 3. The reference's results, recorded next to it.
  ASSERT_EQ(run_command(cli() + " record --quiet --out-dir " + q + (dir / "rec").string() + q + " " + q + raw + q, &out), 0)
      << out;
  // 4. The module writes a capture whose /expected are the recorded arrays (as a serving process
  //    writes what forward produced), and hybridtb replays it on the reference.
  const std::string final_dir = (dir / "final").string();
  ASSERT_EQ(run_command(py + " " + script + " roundtrip --dir " + q + final_dir + q + " --expected-from " + q +
                            (dir / "rec" / fs::path(raw).filename()).string() + q,
                        &out),
            0)
      << out;
  const std::string final_file = (fs::path(final_dir) / "capture_layers.0.attn_step0.h5").string();
  ASSERT_EQ(run_command(cli() + " info " + q + final_file + q, &out), 0) << out;
  ASSERT_EQ(run_command(cli() + " replay --backend reference --quiet --no-rationale " + q + final_file + q, &out), 0) << out;
  EXPECT_NE(out.find("1 passed, 0 failed"), std::string::npos) << out;
  // 5. The gating and budget checks of the module (asserts inside the script).
  ASSERT_EQ(run_command(py + " " + script + " gating --dir " + q + (dir / "gating").string() + q, &out), 0) << out;
}

}  // namespace
}  // namespace hybridtb
