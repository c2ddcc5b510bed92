// The golden batches of datasets/vllm/: /expected computed by vLLM's own Triton kernels
// (datasets/vllm/make.sh, experiments/peers/vllm_golden.py), an outside ground truth for our
// reference.
//
// - ManifestAndFilesAgree: every entry names an existing file with the listed sha256, no .h5 is
//   unlisted, the file's /expected names the entry's vLLM release as its backend and the root
//   attributes record the release, torch, triton, GPU and date; the set covers at least one release
//   besides the newest.
// - NullBlockHoldsZeros: block 0 of every input KV cache (and scale cache) is zero bytes, as vLLM's
//   allocator leaves it (torch.zeros, never written): no batch NaN-poisons a block vLLM keeps finite.
// - AgreeingFilesReplayOnTheReference: `hybridtb replay --backend reference` passes on every file
//   without a `known_difference`, with the tolerance table's row for the kernel's dtype, and the KV
//   cache (and scale caches) compared byte for byte: tolerance 0, both sides in the cache's storage
//   dtype.
// - KnownDifferencesAreExactlyTheListedOnes: on each file with a `known_difference` (a place where
//   vLLM's kernels and our reference disagree, explained in the manifest and the README), replay
//   fails in exactly the listed quantities and passes in every other one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hybridtb/batch_file.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using testing::run_command;

fs::path golden_dir() { return testing::source_dir() / "datasets" / "vllm"; }

nlohmann::json manifest() {
  std::ifstream in(golden_dir() / "manifest.json");
  EXPECT_TRUE(in.good()) << "cannot open datasets/vllm/manifest.json";
  return nlohmann::json::parse(in);
}

std::string sha256_of(const fs::path& path) {
  std::string out;
  if (run_command("sha256sum '" + path.string() + "'", &out) != 0) return "sha256sum failed: " + out;
  return out.substr(0, out.find(' '));
}

TEST(VllmGolden, ManifestAndFilesAgree) {
  const nlohmann::json m = manifest();
  ASSERT_TRUE(m.contains("datasets") && m["datasets"].is_array());
  ASSERT_GE(m["datasets"].size(), 12u);
  std::set<std::string> files, versions;
  for (const auto& e : m["datasets"]) {
    const std::string name = e.at("name"), file = e.at("file"), version = e.at("vllm");
    SCOPED_TRACE(name);
    EXPECT_TRUE(files.insert(file).second) << "duplicate file";
    versions.insert(version);
    EXPECT_FALSE(e.at("covers").empty());
    const fs::path path = golden_dir() / file;
    ASSERT_TRUE(fs::exists(path)) << "listed but missing: " << path;
    EXPECT_EQ(sha256_of(path), e.at("sha256").get<std::string>()) << "sha256 differs: rerun datasets/vllm/make.sh";
    const BatchFile f = read_batch_file(path.string());
    ASSERT_TRUE(f.expected.has_value());
    EXPECT_EQ(f.expected->backend, "vllm " + version + " triton_unified_attention");
    EXPECT_EQ(f.provenance.at("vllm_version"), version);
    EXPECT_EQ(f.provenance.at("generator_command"), e.at("generator_command").get<std::string>());
    for (const char* key : {"torch", "triton", "gpu", "date", "golden_command", "vllm_kernel_files"}) {
      EXPECT_TRUE(f.provenance.count(key)) << "root attribute " << key << " missing";
    }
  }
  EXPECT_GE(versions.size(), 2u) << "the newest release and at least one older one";
  for (const auto& entry : fs::directory_iterator(golden_dir())) {
    if (entry.path().extension() == ".h5") {
      EXPECT_TRUE(files.count(entry.path().filename().string())) << "not in the manifest: " << entry.path();
    }
  }
}

TEST(VllmGolden, NullBlockHoldsZeros) {
  const nlohmann::json m = manifest();  // held: a range-for over manifest()["datasets"] would outlive it
  for (const auto& e : m["datasets"]) {
    SCOPED_TRACE(e.at("name").get<std::string>());
    const BatchFile f = read_batch_file((golden_dir() / e.at("file").get<std::string>()).string());
    for (const Tensor* t : {&f.inputs.kv_cache, &f.inputs.k_scale_cache, &f.inputs.v_scale_cache}) {
      if (t->empty()) continue;
      const auto* bytes = static_cast<const unsigned char*>(t->data());
      const int64_t block_bytes = t->numel() / t->size(0) * element_size(t->dtype());
      int64_t nonzero = 0;
      for (int64_t i = 0; i < block_bytes; ++i) nonzero += bytes[i] != 0;
      EXPECT_EQ(nonzero, 0);
    }
  }
}

// `hybridtb replay --backend reference --report` on the manifest entries `want` selects; returns the
// exit status, the printed text and the report.
int replay(const nlohmann::json& m, bool known, std::string* out, nlohmann::json* report, size_t* count) {
  const fs::path path = testing::scratch_dir() / (known ? "vllm-golden-known.json" : "vllm-golden-agree.json");
  std::string command = std::string(HYBRIDTB_CLI) + " replay --backend reference --quiet --no-rationale --report '" +
                        path.string() + "'";
  *count = 0;
  for (const auto& e : m["datasets"]) {
    if (e.contains("known_difference") != known) continue;
    command += " '" + (golden_dir() / e.at("file").get<std::string>()).string() + "'";
    ++*count;
  }
  const int rc = run_command(command, out);
  std::ifstream in(path);
  if (in.good()) *report = nlohmann::json::parse(in);
  return rc;
}

TEST(VllmGolden, AgreeingFilesReplayOnTheReference) {
  const nlohmann::json m = manifest();
  std::string out;
  nlohmann::json j;
  size_t count = 0;
  EXPECT_EQ(replay(m, false, &out, &j, &count), 0) << out;
  ASSERT_GE(count, 12u);
  const std::string want = std::to_string(count) + " passed, 0 failed";
  EXPECT_NE(out.find(want), std::string::npos) << "expected '" << want << "' in:\n" << out;
  ASSERT_TRUE(j.contains("cases"));
  ASSERT_EQ(j["cases"].size(), count);
  for (const auto& file : j["cases"]) {
    SCOPED_TRACE(file.value("file", "?"));
    bool saw_cache = false;
    for (const auto& q : file.at("quantities")) {
      const std::string name = q.at("name");
      if (name == "attn_output") {
        EXPECT_GT(q.at("tolerance").at("atol").get<double>(), 0.0);  // a kernel's row, not float64 against float64
        EXPECT_NE(q.at("expected_dtype"), "float64");
      }
      if (name != "kv_cache" && name != "k_scale_cache" && name != "v_scale_cache") continue;
      saw_cache |= name == "kv_cache";
      EXPECT_EQ(q.at("tolerance").at("atol").get<double>(), 0.0);
      EXPECT_EQ(q.at("tolerance").at("rtol").get<double>(), 0.0);
      EXPECT_EQ(q.at("candidate_dtype"), q.at("expected_dtype")) << "bytes are compared only within one dtype";
      EXPECT_EQ(q.at("bits_differ").get<int64_t>(), 0);
      EXPECT_EQ(q.at("outside").get<int64_t>(), 0);
    }
    EXPECT_TRUE(saw_cache);
  }
}

TEST(VllmGolden, KnownDifferencesAreExactlyTheListedOnes) {
  const nlohmann::json m = manifest();
  std::map<std::string, std::set<std::string>> listed;
  for (const auto& e : m["datasets"]) {
    if (!e.contains("known_difference")) continue;
    EXPECT_FALSE(e["known_difference"].at("why").get<std::string>().empty());
    for (const auto& q : e["known_difference"].at("quantities")) listed[e.at("file")].insert(q.get<std::string>());
  }
  if (listed.empty()) GTEST_SKIP() << "no known differences listed";
  std::string out;
  nlohmann::json j;
  size_t count = 0;
  EXPECT_EQ(replay(m, true, &out, &j, &count), 1) << out;
  ASSERT_TRUE(j.contains("cases"));
  ASSERT_EQ(j["cases"].size(), count);
  for (const auto& file : j["cases"]) {
    const std::string name = fs::path(file.at("file").get<std::string>()).filename().string();
    SCOPED_TRACE(name);
    std::set<std::string> failed;
    for (const auto& q : file.at("quantities")) {
      if (!q.at("passed").get<bool>()) failed.insert(q.at("name").get<std::string>());
    }
    EXPECT_EQ(failed, listed[name]);
    EXPECT_TRUE(file.at("metadata").at("passed").get<bool>());
  }
}

}  // namespace
}  // namespace hybridtb
