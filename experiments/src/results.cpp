// Statistics and comparison of benchmark results (see results.h).
#include "results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "hybridtb/error.h"

namespace hybridtb::bench {

namespace {

// Quantile by linear interpolation between order statistics (numpy "linear", R type 7).
double quantile(const std::vector<double>& sorted, double p) {
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

void check_results(const nlohmann::json& doc, const char* which) {
  HYBRIDTB_CHECK(doc.is_object() && doc.value("schema", "") == "hybridtb-bench-results" && doc.contains("cases") &&
                     doc["cases"].is_array(),
                 which, ": not a hybridtb-bench-results document (schema and cases expected)");
}

// Repetition times of an ok case (times_s), or its median alone for an older/summary file.
std::vector<double> case_times(const nlohmann::json& c) {
  if (c.contains("times_s") && c["times_s"].is_array() && !c["times_s"].empty()) {
    return c["times_s"].get<std::vector<double>>();
  }
  if (c.contains("median_s") && c["median_s"].is_number()) return {c["median_s"].get<double>()};
  return {};
}

std::string env_summary(const nlohmann::json& doc) {
  const nlohmann::json env = doc.value("environment", nlohmann::json::object());
  std::string device = "cpu";
  if (env.contains("gpu") && env["gpu"].is_object()) device = env["gpu"].value("name", "gpu");
  return env.value("commit", "?") + " on " + device + " (" + env.value("date_utc", "?") + ")";
}

// Two-sided p-value of the exact Mann-Whitney test when the two samples do not overlap at all
// (the most extreme ranking): 2 / C(n + m, n).
double complete_separation_p(int n, int m) {
  double c = 1;  // C(n + m, n), built up exactly enough for the small counts used here
  for (int i = 1; i <= n; ++i) c = c * static_cast<double>(m + i) / static_cast<double>(i);
  return std::min(1.0, 2.0 / c);
}

// Why a slower/faster move of the medians is within the runs' noise, or "" when the repetitions
// separate the runs (the rule in results.h).
std::string within_noise_reason(const std::vector<double>& base, const std::vector<double>& current, bool slower) {
  const int n = static_cast<int>(base.size()), m = static_cast<int>(current.size());
  char buf[256];
  if (n < 2 || m < 2) {
    std::snprintf(buf, sizeof buf, "within noise: %d + %d repetitions (one sample has no spread to judge by)", n, m);
    return buf;
  }
  const auto [bmin, bmax] = std::minmax_element(base.begin(), base.end());
  const auto [nmin, nmax] = std::minmax_element(current.begin(), current.end());
  // The gap between the samples, positive when they do not overlap, in the direction of the move.
  const double gap = slower ? *nmin - *bmax : *bmin - *nmax;
  if (gap <= 0) {
    std::snprintf(buf, sizeof buf, "within noise: the %d + %d repetitions overlap", n, m);
    return buf;
  }
  if (complete_separation_p(n, m) <= 0.05) return "";
  const double spread = (*bmax - *bmin) + (*nmax - *nmin);
  if (gap > spread) return "";
  const double ref = compute_stats(base).median;
  std::snprintf(buf, sizeof buf,
                "within noise: %d + %d repetitions cannot separate a %.1f%% gap from the runs' %.1f%% spread "
                "(need >= 4 + 4 repetitions, or a gap wider than the spread)",
                n, m, 100.0 * gap / ref, 100.0 * spread / ref);
  return buf;
}

}  // namespace

SampleStats compute_stats(std::vector<double> samples) {
  SampleStats s;
  s.count = static_cast<int>(samples.size());
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.min = samples.front();
  s.max = samples.back();
  s.median = quantile(samples, 0.5);
  s.q1 = quantile(samples, 0.25);
  s.q3 = quantile(samples, 0.75);
  double sum = 0;
  for (double x : samples) sum += x;
  s.mean = sum / static_cast<double>(samples.size());
  double sq = 0;
  for (double x : samples) sq += (x - s.mean) * (x - s.mean);
  s.stddev = samples.size() > 1 ? std::sqrt(sq / static_cast<double>(samples.size() - 1)) : 0.0;
  return s;
}

const char* to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::kFaster: return "faster";
    case Verdict::kSlower: return "slower";
    case Verdict::kSame: return "same";
    case Verdict::kOnlyInBase: return "only-in-base";
    case Verdict::kOnlyInNew: return "only-in-new";
    case Verdict::kNotComparable: return "not-comparable";
    case Verdict::kSlowerWithinNoise: return "slower~noise";
    case Verdict::kFasterWithinNoise: return "faster~noise";
  }
  return "?";
}

std::string result_key(const nlohmann::json& c) {
  return c.value("backend", "?") + "/" + c.value("path", "?") + "/" + c.value("name", "?");
}

std::vector<CaseComparison> compare_results(const nlohmann::json& base, const nlohmann::json& current,
                                            const CompareOptions& options) {
  check_results(base, "base");
  check_results(current, "new");
  std::map<std::string, const nlohmann::json*> in_new;
  for (const auto& c : current["cases"]) in_new[result_key(c)] = &c;
  std::vector<CaseComparison> out;
  std::map<std::string, bool> matched;
  for (const auto& b : base["cases"]) {
    CaseComparison cmp;
    cmp.name = result_key(b);
    const auto it = in_new.find(cmp.name);
    if (it == in_new.end()) {
      cmp.verdict = Verdict::kOnlyInBase;
      out.push_back(cmp);
      continue;
    }
    matched[cmp.name] = true;
    const nlohmann::json& n = *it->second;
    const std::string bs = b.value("status", "?"), ns = n.value("status", "?");
    const std::vector<double> bt = case_times(b), nt = case_times(n);
    if (bs != "ok" || ns != "ok" || bt.empty() || nt.empty()) {
      cmp.verdict = Verdict::kNotComparable;
      cmp.note = "base " + bs + ", new " + ns;
      const std::string reason = ns != "ok" ? n.value("reason", "") : b.value("reason", "");
      if (!reason.empty()) cmp.note += ": " + reason;
      out.push_back(cmp);
      continue;
    }
    const SampleStats sb = compute_stats(bt), sn = compute_stats(nt);
    cmp.base_repetitions = sb.count;
    cmp.new_repetitions = sn.count;
    cmp.base_median_s = sb.median;
    cmp.new_median_s = sn.median;
    cmp.ratio = sn.median / sb.median;
    const double abs_floor = sb.median > 0 ? options.min_abs_us * 1e-6 / sb.median : 0.0;
    cmp.threshold = std::max({options.min_effect, options.noise_k * (sb.rel_iqr() + sn.rel_iqr()), abs_floor});
    if (cmp.ratio > 1.0 + cmp.threshold) {
      cmp.verdict = Verdict::kSlower;
    } else if (1.0 / cmp.ratio > 1.0 + cmp.threshold) {
      cmp.verdict = Verdict::kFaster;
    } else {
      cmp.verdict = Verdict::kSame;
    }
    if (cmp.verdict == Verdict::kSlower || cmp.verdict == Verdict::kFaster) {
      const bool slower = cmp.verdict == Verdict::kSlower;
      cmp.note = within_noise_reason(bt, nt, slower);
      if (!cmp.note.empty()) cmp.verdict = slower ? Verdict::kSlowerWithinNoise : Verdict::kFasterWithinNoise;
    }
    if (b.value("throttled", false) || n.value("throttled", false)) {
      cmp.note += std::string(cmp.note.empty() ? "" : "; ") + "throttled samples";
    }
    out.push_back(cmp);
  }
  for (const auto& n : current["cases"]) {
    if (!matched.count(result_key(n))) out.push_back({result_key(n), Verdict::kOnlyInNew, 0, 0, 0, 0, ""});
  }
  return out;
}

int compare_exit_code(const std::vector<CaseComparison>& comparisons) {
  for (const auto& c : comparisons) {
    if (c.verdict == Verdict::kSlower) return 1;
  }
  return 0;
}

std::string format_comparison(const std::vector<CaseComparison>& comparisons, const nlohmann::json& base,
                              const nlohmann::json& current) {
  std::ostringstream os;
  os << "base: " << env_summary(base) << "\nnew:  " << env_summary(current) << "\n";
  const auto gpu = [](const nlohmann::json& d) {
    const auto env = d.value("environment", nlohmann::json::object());
    return env.contains("gpu") && env["gpu"].is_object() ? env["gpu"].value("name", "") : std::string("cpu");
  };
  if (gpu(base) != gpu(current)) os << "warning: different devices (" << gpu(base) << " vs " << gpu(current) << ")\n";
  // Repetitions measure the spread within a run; a machine busier during one run than the other
  // moves every CPU time of that run, which no spread shows. Say so when a run was overloaded.
  for (const auto& [label, doc] : {std::pair<const char*, const nlohmann::json*>{"base", &base}, {"new", &current}}) {
    const auto env = doc->value("environment", nlohmann::json::object());
    const double threads = env.value("cpu_threads", 0.0);
    const double load = std::max(env.value("load_average_start", -1.0), env.value("load_average_end", -1.0));
    if (threads > 0 && load > threads) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "warning: the %s run had a load average of %.1f on %.0f CPU threads: its CPU times include "
                    "waiting for other work, which the repetitions' spread does not show\n",
                    label, load, threads);
      os << buf;
    }
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-14s %12s %12s %8s %8s  %s\n", "verdict", "base_us", "new_us", "ratio", "±thr",
                "case");
  os << line;
  std::map<Verdict, int> counts;
  std::map<std::pair<int, int>, int> noisy_repetitions;  // (base, new) repetitions of the cases within noise
  for (const auto& c : comparisons) {
    ++counts[c.verdict];
    if (c.verdict == Verdict::kSlowerWithinNoise || c.verdict == Verdict::kFasterWithinNoise) {
      ++noisy_repetitions[{c.base_repetitions, c.new_repetitions}];
    }
    if (c.verdict == Verdict::kOnlyInBase || c.verdict == Verdict::kOnlyInNew || c.verdict == Verdict::kNotComparable) {
      std::snprintf(line, sizeof line, "%-14s %12s %12s %8s %8s  %s%s%s\n", to_string(c.verdict), "-", "-", "-", "-",
                    c.name.c_str(), c.note.empty() ? "" : "  # ", c.note.c_str());
    } else {
      std::snprintf(line, sizeof line, "%-14s %12.2f %12.2f %8.3f %7.1f%%  %s%s%s\n", to_string(c.verdict),
                    c.base_median_s * 1e6, c.new_median_s * 1e6, c.ratio, c.threshold * 100.0, c.name.c_str(),
                    c.note.empty() ? "" : "  # ", c.note.c_str());
    }
    os << line;
  }
  os << "summary: " << counts[Verdict::kFaster] << " faster, " << counts[Verdict::kSlower] << " slower, "
     << counts[Verdict::kSame] << " same, " << counts[Verdict::kSlowerWithinNoise] << " slower within noise, "
     << counts[Verdict::kFasterWithinNoise] << " faster within noise, " << counts[Verdict::kNotComparable]
     << " not comparable, " << counts[Verdict::kOnlyInBase] << " only in base, " << counts[Verdict::kOnlyInNew]
     << " only in new\n";
  const int noisy = counts[Verdict::kSlowerWithinNoise] + counts[Verdict::kFasterWithinNoise];
  if (noisy > 0) {
    os << "warning: " << noisy << (noisy == 1 ? " difference is" : " differences are")
       << " within noise: the repetitions (";
    bool first = true;
    for (const auto& [reps, count] : noisy_repetitions) {
      os << (first ? "" : ", ") << reps.first << " + " << reps.second << " in " << count
         << (count == 1 ? " case" : " cases");
      first = false;
    }
    os << ") cannot separate them from the runs' own spread, so they are not counted as slower or faster and do "
          "not fail the comparison; rerun both with more repetitions (--repetitions 5) to decide "
          "(rule: experiments/README.md, \"Comparing two runs\")\n";
  }
  return os.str();
}

}  // namespace hybridtb::bench
