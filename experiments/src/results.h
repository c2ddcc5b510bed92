// Results files (schema "hybridtb-bench-results", written by hybridtb_bench) and their noise-aware
// comparison (hybridtb_bench_compare). The verdict rule is documented in experiments/README.md
// ("Comparing two runs") and checked by tests/bench/test_compare.cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridtb::bench {

// Order statistics of repetition times (quartiles by linear interpolation, as numpy's default).
struct SampleStats {
  int count = 0;
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0, mean = 0, stddev = 0;
  // Interquartile range relative to the median (0 for fewer than two samples).
  double rel_iqr() const { return median > 0 ? (q3 - q1) / median : 0.0; }
};
SampleStats compute_stats(std::vector<double> samples);

// kSlowerWithinNoise / kFasterWithinNoise: the medians moved past the threshold, but the
// repetitions cannot tell that move from the runs' own noise (the separation rule below).
enum class Verdict {
  kFaster,
  kSlower,
  kSame,
  kOnlyInBase,
  kOnlyInNew,
  kNotComparable,
  kSlowerWithinNoise,
  kFasterWithinNoise
};
const char* to_string(Verdict verdict);

struct CompareOptions {
  double min_effect = 0.05;  // a change smaller than this (relative) is never reported
  double noise_k = 1.0;      // how many combined relative IQRs a change must exceed
  // An absolute change below this is never reported: the cuda timings bracket host enqueue and a
  // device-wide sync, whose jitter between two runs is several microseconds (H100, quick suite run
  // twice on one build: up to 8.6 us on 80-100 us steps, within 2 us elsewhere).
  double min_abs_us = 10.0;
};

struct CaseComparison {
  std::string name;  // "<backend>/<path>/<case>"
  Verdict verdict = Verdict::kSame;
  double base_median_s = 0, new_median_s = 0;
  double ratio = 0;      // new / base time (> 1: slower)
  double threshold = 0;  // the relative change needed for a verdict other than "same"
  std::string note;      // why not comparable (skipped, error), why within noise, or empty
  int base_repetitions = 0, new_repetitions = 0;
};

// Compares two results documents case by case (matched by backend/path/case name). A case is
// slower when new/base > 1 + t and faster when base/new > 1 + t, with
//   t = max(min_effect, noise_k · (rel_iqr(base) + rel_iqr(new)), min_abs_us / base median),
// and otherwise the same. A slower or faster verdict stands only when the repetitions separate the
// two runs; otherwise it becomes kSlowerWithinNoise / kFasterWithinNoise. Separated means:
//   1. both runs have at least two repetitions (one sample has no spread to judge by), and
//   2. the samples do not overlap (every repetition of one run is slower than every repetition
//      of the other), and
//   3. either the repetitions are enough for a rank test to call complete separation significant
//      (two-sided Mann-Whitney p = 2 / C(n + m, n) <= 0.05: 4 + 4, 3 + 5, 5 + 5 ... repetitions;
//      3 + 3 gives p = 0.1), or the gap between the two samples is larger than both runs' ranges
//      (max - min) added together: the change dwarfs the spread seen within either run.
// Throws Error if a document is not a results file.
std::vector<CaseComparison> compare_results(const nlohmann::json& base, const nlohmann::json& current,
                                            const CompareOptions& options = {});

// 0: nothing slower beyond noise; 1: at least one case kSlower (kSlowerWithinNoise does not
// count); (2 is the tools' bad-input status).
int compare_exit_code(const std::vector<CaseComparison>& comparisons);

// A table, one row per case, plus a summary line, and a warning naming the repetitions when some
// differences are within noise.
std::string format_comparison(const std::vector<CaseComparison>& comparisons, const nlohmann::json& base,
                              const nlohmann::json& current);

// The key a case is matched by: "<backend>/<path>/<name>".
std::string result_key(const nlohmann::json& result_case);

}  // namespace hybridtb::bench
