// hybridtb_bench_compare BASE.json NEW.json [--min-effect 0.05] [--noise-k 1] [--json OUT.json]
// Per-case time ratios (new / base median) of two hybridtb_bench results files with a noise-aware
// verdict: faster / slower / same, or slower~noise / faster~noise when the repetitions cannot tell
// the move from the runs' own spread (rule in results.h and experiments/README.md).
// Exit status: 0 = no case slower beyond noise, 1 = at least one case slower, 2 = usage error or
// unreadable input.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

#include "hybridtb/error.h"
#include "src/results.h"

int main(int argc, char** argv) {
  using namespace hybridtb::bench;
  CLI::App app{"Compare two hybridtb_bench results files: per-case ratios with a noise-aware verdict.\n"
               "A case is slower/faster when the median moved past the threshold AND the repetitions separate the "
               "runs (no overlap, and >= 4 + 4 repetitions or a gap wider than both runs' spread); a move they "
               "cannot separate is reported as slower~noise / faster~noise with a warning.\n"
               "Exit status: 0 no case slower beyond noise, 1 at least one case slower, 2 usage error or bad input."};
  std::string base_path, new_path, json_out;
  CompareOptions options;
  app.add_option("base", base_path, "Results JSON of the baseline run")->required();
  app.add_option("new", new_path, "Results JSON of the run to judge")->required();
  app.add_option("--min-effect", options.min_effect, "Smallest relative change ever reported (default 0.05 = 5%)")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--noise-k", options.noise_k,
                 "A change must exceed noise_k x (relative IQR of base + relative IQR of new) (default 1)")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--min-abs-us", options.min_abs_us,
                 "Smallest absolute change in microseconds ever reported (default 10: the jitter of host-synchronised "
                 "GPU timings between runs)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--json", json_out, "Also write the comparison as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    auto load = [](const std::string& path) {
      std::ifstream in(path);
      if (!in) throw hybridtb::Error("cannot open " + path);
      try {
        return nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        throw hybridtb::Error(path + ": not valid JSON: " + e.what());
      }
    };
    const nlohmann::json base = load(base_path);
    const nlohmann::json current = load(new_path);
    const auto comparisons = compare_results(base, current, options);
    std::cout << format_comparison(comparisons, base, current);
    if (!json_out.empty()) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& c : comparisons) {
        j.push_back({{"case", c.name}, {"verdict", to_string(c.verdict)}, {"base_median_s", c.base_median_s},
                     {"new_median_s", c.new_median_s}, {"ratio", c.ratio}, {"threshold", c.threshold},
                     {"base_repetitions", c.base_repetitions}, {"new_repetitions", c.new_repetitions},
                     {"note", c.note}});
      }
      std::ofstream(json_out) << nlohmann::json{{"base", base_path}, {"new", new_path}, {"cases", j}}.dump(2) << "\n";
    }
    return compare_exit_code(comparisons);
  } catch (const std::exception& e) {
    std::cerr << "hybridtb_bench_compare: error: " << e.what() << "\n";
    return 2;
  }
}
