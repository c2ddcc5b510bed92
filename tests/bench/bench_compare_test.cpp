// The compare verdicts of hybridtb_bench_compare (results.h): identical runs are the same, a 2×
// slower case is slower, a change inside the runs' spread is the same, small changes never count.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "hybridtb/error.h"
#include "src/results.h"

namespace hybridtb::bench {
namespace {

nlohmann::json one_case(const std::string& name, const std::vector<double>& times, const std::string& status = "ok") {
  nlohmann::json c = {{"name", name}, {"backend", "cuda"}, {"path", "fused"}, {"status", status}};
  if (status == "ok") {
    c["times_s"] = times;
    c["median_s"] = compute_stats(times).median;
  } else {
    c["reason"] = "no CUDA device";
  }
  return c;
}

nlohmann::json results(const std::vector<nlohmann::json>& cases) {
  return {{"schema", "hybridtb-bench-results"}, {"version", 1}, {"environment", {{"commit", "abc"}}}, {"cases", cases}};
}

const std::vector<double> kSteady = {100e-6, 101e-6, 99e-6, 100.5e-6, 99.5e-6};

TEST(BenchStats, QuartilesInterpolate) {
  const SampleStats s = compute_stats({4, 1, 3, 2, 5});
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.q1, 2);
  EXPECT_DOUBLE_EQ(s.q3, 4);
  EXPECT_DOUBLE_EQ(s.rel_iqr(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(compute_stats({1, 2}).median, 1.5);
  EXPECT_DOUBLE_EQ(compute_stats({7}).rel_iqr(), 0.0);
}

TEST(BenchCompare, IdenticalFilesAreAllSame) {
  const auto doc = results({one_case("a", kSteady), one_case("b", {1e-3, 1.2e-3, 0.9e-3})});
  const auto cmp = compare_results(doc, doc);
  ASSERT_EQ(cmp.size(), 2u);
  for (const auto& c : cmp) {
    EXPECT_EQ(c.verdict, Verdict::kSame) << c.name;
    EXPECT_DOUBLE_EQ(c.ratio, 1.0);
  }
  EXPECT_EQ(compare_exit_code(cmp), 0);
}

TEST(BenchCompare, TwiceSlowerCaseIsSlowerOthersSame) {
  std::vector<double> doubled;
  for (double t : kSteady) doubled.push_back(2 * t);
  const auto base = results({one_case("a", kSteady), one_case("b", kSteady)});
  const auto slow = results({one_case("a", kSteady), one_case("b", doubled)});
  const auto cmp = compare_results(base, slow);
  ASSERT_EQ(cmp.size(), 2u);
  EXPECT_EQ(cmp[0].verdict, Verdict::kSame);
  EXPECT_EQ(cmp[1].verdict, Verdict::kSlower);
  EXPECT_NEAR(cmp[1].ratio, 2.0, 1e-12);
  EXPECT_EQ(compare_exit_code(cmp), 1);
  // And the other way round it is faster, which is not a failure.
  const auto back = compare_results(slow, base);
  EXPECT_EQ(back[1].verdict, Verdict::kFaster);
  EXPECT_EQ(compare_exit_code(back), 0);
}

TEST(BenchCompare, ChangeWithinTheSpreadIsSame) {
  // Both runs spread by ±10% (relative IQR ≈ 0.1 each): a 12% shift of the median is noise.
  const std::vector<double> a = {0.90, 0.95, 1.00, 1.05, 1.10};
  const std::vector<double> b = {1.01, 1.06, 1.12, 1.17, 1.23};
  const auto cmp = compare_results(results({one_case("x", a)}), results({one_case("x", b)}));
  EXPECT_EQ(cmp[0].verdict, Verdict::kSame);
  EXPECT_GT(cmp[0].threshold, 0.12);
  // The same 12% shift between two steady runs is a real slowdown.
  const auto steady = compare_results(results({one_case("x", {1.0, 1.0, 1.0})}),
                                      results({one_case("x", {1.12, 1.12, 1.12})}));
  EXPECT_EQ(steady[0].verdict, Verdict::kSlower);
}

TEST(BenchCompare, MinimumEffectSize) {
  // 3% slower with no noise at all: below the default 5% minimum effect.
  const auto cmp = compare_results(results({one_case("x", {1.0, 1.0})}), results({one_case("x", {1.03, 1.03})}));
  EXPECT_EQ(cmp[0].verdict, Verdict::kSame);
  CompareOptions strict;
  strict.min_effect = 0.01;
  EXPECT_EQ(compare_results(results({one_case("x", {1.0, 1.0})}), results({one_case("x", {1.03, 1.03})}), strict)[0]
                .verdict,
            Verdict::kSlower);
}

// The quick suite run twice on one H100 build: an 80.9 us step measured 88.9 us the second time
// (host-synchronised timing jitter). Below the absolute floor (10 us) that is "same"; the same step
// on a build slowed by 200 us per launch (284 us) is "slower".
TEST(BenchCompare, AbsoluteFloorForShortSteps) {
  const auto base = results({one_case("x", {80.86e-6, 80.86e-6})});
  EXPECT_EQ(compare_results(base, results({one_case("x", {88.92e-6, 88.92e-6})}))[0].verdict, Verdict::kSame);
  EXPECT_EQ(compare_results(base, results({one_case("x", {284.0e-6, 284.0e-6})}))[0].verdict, Verdict::kSlower);
  CompareOptions no_floor;
  no_floor.min_abs_us = 0.0;
  EXPECT_EQ(compare_results(base, results({one_case("x", {88.92e-6, 88.92e-6})}), no_floor)[0].verdict,
            Verdict::kSlower);
}

TEST(BenchCompare, MissingAndSkippedCases) {
  const auto base = results({one_case("a", kSteady), one_case("b", kSteady), one_case("c", {}, "skipped")});
  const auto current = results({one_case("a", kSteady), one_case("c", kSteady), one_case("d", kSteady)});
  const auto cmp = compare_results(base, current);
  ASSERT_EQ(cmp.size(), 4u);
  EXPECT_EQ(cmp[0].verdict, Verdict::kSame);
  EXPECT_EQ(cmp[1].verdict, Verdict::kOnlyInBase);
  EXPECT_EQ(cmp[2].verdict, Verdict::kNotComparable);
  EXPECT_NE(cmp[2].note.find("no CUDA device"), std::string::npos);
  EXPECT_EQ(cmp[3].verdict, Verdict::kOnlyInNew);
  EXPECT_EQ(compare_exit_code(cmp), 0);
  const std::string table = format_comparison(cmp, base, current);
  EXPECT_NE(table.find("1 same, 0 slower within noise, 0 faster within noise, 1 not comparable, 1 only in base, "
                       "1 only in new"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("warning"), std::string::npos) << table;
}

// Three repetitions per run, as the reference gets on a CPU. The medians move 8.7% (past the
// 6.5% threshold) and the samples do not even overlap, but 3 + 3 repetitions cannot make that
// significant (rank test p = 0.1) and the 2-point gap is far inside the runs' 14-point spread.
TEST(BenchCompare, ThreeRepetitionsCannotSeparateASmallShift) {
  const auto base = results({one_case("x", {1.00, 1.04, 1.08})});
  const auto current = results({one_case("x", {1.10, 1.13, 1.16})});
  const auto cmp = compare_results(base, current);
  ASSERT_EQ(cmp.size(), 1u);
  EXPECT_GT(cmp[0].ratio, 1 + cmp[0].threshold);  // the threshold alone would say slower
  EXPECT_EQ(cmp[0].verdict, Verdict::kSlowerWithinNoise);
  EXPECT_NE(cmp[0].note.find("3 + 3 repetitions"), std::string::npos) << cmp[0].note;
  EXPECT_EQ(compare_exit_code(cmp), 0);
  const std::string table = format_comparison(cmp, base, current);
  EXPECT_NE(table.find("0 slower, 0 same, 1 slower within noise"), std::string::npos) << table;
  EXPECT_NE(table.find("warning: 1 difference is within noise"), std::string::npos) << table;
  EXPECT_NE(table.find("3 + 3 in 1 case"), std::string::npos) << table;
  // The other way round: faster within noise.
  EXPECT_EQ(compare_results(current, base)[0].verdict, Verdict::kFasterWithinNoise);
  // Overlapping samples are within noise whatever the repetitions.
  const auto overlap = compare_results(results({one_case("x", {1.0, 1.0, 1.0, 1.0, 1.3})}),
                                       results({one_case("x", {1.2, 1.2, 1.2, 1.2, 1.2})}));
  EXPECT_EQ(overlap[0].verdict, Verdict::kSlowerWithinNoise);
  EXPECT_NE(overlap[0].note.find("overlap"), std::string::npos) << overlap[0].note;
  // With 4 + 4 non-overlapping repetitions the same shift is significant (p = 2/70).
  const auto four = compare_results(results({one_case("x", {1.00, 1.03, 1.05, 1.08})}),
                                    results({one_case("x", {1.10, 1.12, 1.14, 1.16})}));
  EXPECT_EQ(four[0].verdict, Verdict::kSlower);
  // One repetition has no spread: never a verdict.
  EXPECT_EQ(compare_results(results({one_case("x", {1.0})}), results({one_case("x", {2.0})}))[0].verdict,
            Verdict::kSlowerWithinNoise);
}

// A real 2x slowdown is slower even with 3 repetitions: the gap dwarfs the spread.
TEST(BenchCompare, ThreeRepetitionsSeparateATwofoldSlowdown) {
  const auto base = results({one_case("x", {1.00, 1.04, 1.08}), one_case("y", {2.0, 2.1, 2.2})});
  const auto slow = results({one_case("x", {2.00, 2.08, 2.16}), one_case("y", {2.05, 2.1, 2.15})});
  const auto cmp = compare_results(base, slow);
  EXPECT_EQ(cmp[0].verdict, Verdict::kSlower);
  EXPECT_TRUE(cmp[0].note.empty()) << cmp[0].note;
  EXPECT_EQ(cmp[1].verdict, Verdict::kSame);
  EXPECT_EQ(compare_exit_code(cmp), 1);
}

// Two runs drawn from one distribution, 3 repetitions each with 5% normal noise (as the reference
// on a busy 2-core machine), 2000 cases: the threshold alone calls about 11% of them slower or
// faster; the separation rule keeps them within noise except for a small residue (a rule on 3
// samples cannot be certain), and the same runs with every case of the new one doubled are still
// slower almost always.
TEST(BenchCompare, SameDistributionIsWithinNoiseTwofoldIsSlower) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<double> noise(1.0, 0.05);
  std::vector<nlohmann::json> a, b, doubled;
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    const double scale = 1e-3 * (1 + i % 7);
    std::vector<double> ta, tb, td;
    for (int r = 0; r < 3; ++r) ta.push_back(scale * noise(rng));
    for (int r = 0; r < 3; ++r) tb.push_back(scale * noise(rng));
    for (double t : ta) td.push_back(2 * t);
    const std::string name = "case" + std::to_string(i);
    a.push_back(one_case(name, ta));
    b.push_back(one_case(name, tb));
    doubled.push_back(one_case(name, td));
  }
  const auto cmp = compare_results(results(a), results(b));
  int decided = 0, noisy = 0;
  for (const auto& c : cmp) {
    decided += c.verdict == Verdict::kSlower || c.verdict == Verdict::kFaster;
    noisy += c.verdict == Verdict::kSlowerWithinNoise || c.verdict == Verdict::kFasterWithinNoise;
  }
  std::printf("same distribution: %d of %d decided, %d within noise\n", decided, n, noisy);
  EXPECT_GT(noisy, n * 5 / 100);     // what the threshold alone would have called a change
  EXPECT_LT(decided, n * 1 / 100);   // what the rule still calls one
  int slower = 0;
  for (const auto& c : compare_results(results(a), results(doubled))) slower += c.verdict == Verdict::kSlower;
  std::printf("twofold: %d of %d slower\n", slower, n);
  EXPECT_GT(slower, n * 99 / 100);
}

// A run on an overloaded machine (load average above its CPU threads) is named in a warning; a
// quiet one, or a file without the load (older results), is not.
TEST(BenchCompare, WarnsAboutALoadedMachine) {
  auto quiet = results({one_case("x", kSteady)});
  auto busy = quiet;
  quiet["environment"]["cpu_threads"] = 2;
  quiet["environment"]["load_average_start"] = 0.5;
  quiet["environment"]["load_average_end"] = 1.0;
  busy["environment"]["cpu_threads"] = 2;
  busy["environment"]["load_average_start"] = 1.5;
  busy["environment"]["load_average_end"] = 4.8;
  const std::string table = format_comparison(compare_results(quiet, busy), quiet, busy);
  EXPECT_NE(table.find("warning: the new run had a load average of 4.8 on 2 CPU threads"), std::string::npos) << table;
  EXPECT_EQ(table.find("the base run"), std::string::npos) << table;
  const auto plain = results({one_case("x", kSteady)});
  EXPECT_EQ(format_comparison(compare_results(plain, quiet), plain, quiet).find("load average"), std::string::npos);
}

TEST(BenchCompare, RejectsOtherDocuments) {
  EXPECT_THROW(compare_results(nlohmann::json::object(), results({})), Error);
}

}  // namespace
}  // namespace hybridtb::bench
