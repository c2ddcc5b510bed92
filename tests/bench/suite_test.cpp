// Suite files: axis expansion, case names that are gen arguments, and the shipped suites parse.
#include <gtest/gtest.h>

#include <set>

#include "hybridtb/error.h"
#include "hybridtb/shell.h"
#include "src/suite.h"
#include "test_paths.h"

namespace hybridtb::bench {
namespace {

nlohmann::json suite_with(const nlohmann::json& group) {
  return {{"schema", "hybridtb-bench-suite"}, {"version", 1}, {"name", "t"}, {"groups", {group}}};
}

TEST(Suite, ExpandsAxesAndNamesEveryOne) {
  const Suite s = parse_suite(suite_with(
      {{"name", "g"}, {"preset", "llama3-8b"}, {"mix", {"d8@1024", "p2x2048+d4@4k"}}, {"sliding_window", {0, 128}},
       {"kv_cache_dtype", "fp8"}, {"backends", {"reference"}}}));
  ASSERT_EQ(s.cases.size(), 4u);
  // Canonical mix, canonical kv dtype name, the preset's own dtype and SSM mode written out.
  EXPECT_EQ(s.cases[0].name, "llama3-8b/d8@1k/ssm_mode=none/sliding_window=0/dtype=bfloat16/kv_cache_dtype=fp8_e4m3");
  EXPECT_EQ(s.cases[1].name, "llama3-8b/d8@1k/ssm_mode=none/sliding_window=128/dtype=bfloat16/kv_cache_dtype=fp8_e4m3");
  EXPECT_EQ(s.cases[2].mix, "d4@4k+p2x2k");
  EXPECT_EQ(s.cases[0].paths, std::vector<std::string>{"fused"});
  EXPECT_EQ(s.cases[1].gen_command("x.h5"),
            "hybridtb gen --preset llama3-8b --mix d8@1k --seed 0 --engine-version none --set ssm_mode=none "
            "--set sliding_window=128 "
            "--set dtype=bfloat16 --set kv_cache_dtype=fp8_e4m3 --out x.h5");
}

// The repro lines are pasted into a shell: a word survives unchanged only if no shell would split or
// expand it; anything else is single-quoted, a quote inside closed, escaped and reopened.
TEST(ShellWord, QuotesExactlyWhatAShellWouldSplitOrExpand) {
  EXPECT_EQ(shell_word("d64@4k+c1x512@4k"), "d64@4k+c1x512@4k");
  EXPECT_EQ(shell_word("ssm.num_k_heads=2"), "ssm.num_k_heads=2");
  EXPECT_EQ(shell_word("out/case-1,2:3%.h5"), "out/case-1,2:3%.h5");
  EXPECT_EQ(shell_word(""), "''");  // an empty argument must stay an argument
  EXPECT_EQ(shell_word("a b"), "'a b'");
  EXPECT_EQ(shell_word("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_word("x*"), "'x*'");
  EXPECT_EQ(shell_word("it's"), "'it'\\''s'");
  const Suite s = parse_suite(suite_with({{"name", "g"}, {"preset", "llama3-8b"}, {"mix", {"d8@1024"}},
                                          {"backends", {"reference"}}}));
  ASSERT_EQ(s.cases.size(), 1u);
  EXPECT_EQ(s.cases[0].gen_command("my case.h5").substr(s.cases[0].gen_command("my case.h5").size() - 18),
            "--out 'my case.h5'");
}

TEST(Suite, HybridLayersGetBothPathsAndPresetDefaults) {
  const Suite s = parse_suite(suite_with({{"preset", "hymba-small"}, {"mix", "d2@64"}, {"ssm_mode", {"mamba1", "ema"}}}));
  ASSERT_EQ(s.cases.size(), 2u);
  EXPECT_EQ(s.cases[0].name, "hymba-small/d2@64/ssm_mode=mamba1/sliding_window=1024/dtype=bfloat16/kv_cache_dtype=auto");
  EXPECT_EQ(s.cases[1].paths, (std::vector<std::string>{"fused", "two_kernel"}));
}

TEST(Suite, GraphPathIsAcceptedForAnyLayer) {
  const Suite s = parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", "d8@1k"}, {"paths", {"fused", "graph"}}}));
  ASSERT_EQ(s.cases.size(), 1u);
  EXPECT_EQ(s.cases[0].paths, (std::vector<std::string>{"fused", "graph"}));
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", "d8@1k"}, {"paths", {"graphs"}}})), Error);
}

TEST(Suite, RejectsBadInput) {
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", "d8@"}})), Error);
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama9"}, {"mix", "d8@1k"}})), Error);
  // An axis must be set through its field (so the name stays canonical).
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", "d8@1k"}, {"set", {"sliding_window=4"}}})),
               Error);
  // two_kernel needs an SSM branch.
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", "d8@1k"}, {"paths", {"two_kernel"}}})), Error);
  EXPECT_THROW(parse_suite({{"schema", "other"}, {"version", 1}, {"groups", nlohmann::json::array()}}), Error);
  // A case listed twice.
  EXPECT_THROW(parse_suite(suite_with({{"preset", "llama3-8b"}, {"mix", {"d8@1k", "d8@1024"}}})), Error);
}

TEST(Suite, ShippedSuitesParseAndCoverTheIssue) {
  const std::string dir = (testing::source_dir() / "experiments" / "suites").string() + "/";
  const Suite standard = load_suite(dir + "standard.json");
  const Suite quick = load_suite(dir + "quick.json");
  load_suite(dir + "smoke.json");
  // The CUDA-graph suite: decode steps only (its graph path times nothing else).
  for (const SuiteCase& c : load_suite(dir + "graph.json").cases) EXPECT_EQ(c.mix.find('p'), std::string::npos) << c.name;
  auto has = [&](const Suite& s, const std::string& preset, const std::string& mix, const std::string& setting) {
    for (const SuiteCase& c : s.cases) {
      if (c.preset == preset && c.mix == mix &&
          std::find(c.settings.begin(), c.settings.end(), setting) != c.settings.end())
        return true;
    }
    return false;
  };
  for (const char* batch : {"1", "8", "64", "256"}) {
    for (const char* ctx : {"1k", "8k", "32k"}) {
      EXPECT_TRUE(has(standard, "llama3-8b", std::string("d") + batch + "@" + ctx, "sliding_window=0"))
          << batch << "x" << ctx;
    }
  }
  for (const char* mix : {"p1x4k", "p4x2k", "p1x16k", "d64@4k+c1x2k@4k", "d256@4k+c1x512@4k"}) {
    EXPECT_TRUE(has(standard, "llama3-8b", mix, "sliding_window=0")) << mix;
  }
  for (const char* w : {"sliding_window=128", "sliding_window=1024", "sliding_window=4096"}) {
    EXPECT_TRUE(has(standard, "llama3-8b", "d64@32k", w)) << w;
  }
  for (const char* mode : {"ssm_mode=zero", "ssm_mode=prefix_sum_flat", "ssm_mode=prefix_sum", "ssm_mode=ema",
                           "ssm_mode=mamba1"}) {
    bool found = false;
    for (const SuiteCase& c : standard.cases) {
      found = found || std::find(c.settings.begin(), c.settings.end(), mode) != c.settings.end();
    }
    EXPECT_TRUE(found) << mode;
  }
  bool spec = false;
  for (const SuiteCase& c : standard.cases) spec = spec || c.mix.find('s') == 0;
  EXPECT_TRUE(spec) << "speculative decodes";
  // GDN and Mamba-2 layers, decode and prefill; GDN prefill at FlashInfer's 64k × 8 heads.
  for (const char* preset : {"qwen3-next-gdn", "falcon-h1-7b-mamba2"}) {
    for (const char* mix : {"d64@4k", "d256@4k", "p1x8k"}) {
      bool found = false;
      for (const SuiteCase& c : standard.cases) found = found || (c.preset == preset && c.mix == mix);
      EXPECT_TRUE(found) << preset << " " << mix;
    }
  }
  EXPECT_TRUE(has(standard, "qwen3-next-gdn", "p1x64k", "ssm.num_v_heads=8"));
  // The quick suite is a subset of the standard one, case names included.
  for (const SuiteCase& q : quick.cases) {
    bool found = false;
    for (const SuiteCase& c : standard.cases) found = found || c.name == q.name;
    EXPECT_TRUE(found) << q.name;
  }
}

// The console's short names: settings that mean "off" disappear, the rest are abbreviated, every
// setting that tells two cases of the standard suite apart survives, and the width is respected.
TEST(Suite, ShortBenchNames) {
  EXPECT_EQ(short_bench_name("reference/fused/llama3-8b/d64@32k/ssm_mode=none/sliding_window=0/dtype=bfloat16/"
                             "kv_cache_dtype=auto",
                             80),
            "ref fused llama3-8b d64@32k");
  EXPECT_EQ(short_bench_name("cuda/two_kernel/hymba-small/d8@1k+p1x128/ssm_mode=mamba1/sliding_window=128/"
                             "dtype=float16/kv_cache_dtype=fp8_e4m3/num_heads=8",
                             100),
            "cuda two_kernel hymba-small d8@1k+p1x128 ssm=mamba1 w=128 fp16 kv=e4m3 num_heads=8");
  // Too wide: the group's extra settings go first, counted.
  EXPECT_EQ(short_bench_name("cuda/two_kernel/hymba-small/d8@1k+p1x128/ssm_mode=mamba1/sliding_window=128/"
                             "dtype=float16/kv_cache_dtype=int8_per_token_head/num_heads=8/head_size=32",
                             82),
            "cuda two_kernel hymba-small d8@1k+p1x128 ssm=mamba1 w=128 fp16 kv=int8-tok +2 set");
  // Still too wide: the middle goes, the ends stay.
  const std::string narrow = short_bench_name(
      "cuda/two_kernel/hymba-small/d8@1k+p1x128/ssm_mode=mamba1/sliding_window=128/dtype=float16/"
      "kv_cache_dtype=fp8_e4m3",
      40);
  EXPECT_EQ(narrow.size(), 40u);
  EXPECT_EQ(narrow.rfind("cuda two_kernel hymba-", 0), 0u) << narrow;
  EXPECT_NE(narrow.find(".."), std::string::npos) << narrow;
  EXPECT_EQ(narrow.substr(narrow.size() - 7), "kv=e4m3") << narrow;

  // Every benchmark of the standard and smoke suites keeps a distinct short name at the console's
  // width (64 characters).
  for (const char* file : {"standard.json", "smoke.json"}) {
    const Suite suite = load_suite((testing::source_dir() / "experiments" / "suites" / file).string());
    std::set<std::string> seen;
    for (const SuiteCase& c : suite.cases) {
      for (const std::string& backend : c.backends) {
        for (const std::string& path : c.paths) {
          const std::string s = short_bench_name(backend + "/" + path + "/" + c.name, 64);
          EXPECT_LE(s.size(), 64u) << s;
          EXPECT_TRUE(seen.insert(s).second) << file << ": two benchmarks shorten to " << s;
        }
      }
    }
    EXPECT_GT(seen.size(), 10u) << file;
  }
}

}  // namespace
}  // namespace hybridtb::bench
