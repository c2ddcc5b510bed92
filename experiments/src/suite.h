// Benchmark suites (experiments/suites/*.json): named cases = model preset × mix × SSM mode ×
// window × dtype × KV dtype (× extra settings) × backend × path. A case name encodes every axis
// with the exact strings `hybridtb gen` takes, so the batch of a slow case is regenerated and
// checked with one command (gen_command / parity_command). Format: experiments/README.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridtb::bench {

struct SuiteCase {
  std::string name;    // "<preset>/<mix>/ssm_mode=…/sliding_window=…/dtype=…/kv_cache_dtype=…[/<k=v>…]"
  std::string group;   // the suite group it came from (decode, prefill, mixed, …)
  std::string preset;
  std::string mix;     // canonical form (to_string(parse_mix(...)))
  std::vector<std::string> settings;  // every --set key=value, in the order gen applies them
  uint64_t seed = 0;
  std::vector<std::string> backends;  // backends to time it on
  std::vector<std::string> paths;     // "fused", "two_kernel" (only with an SSM branch), "graph" (CUDA graph)
  int repetitions = 5;
  double min_time_s = 0.05;

  // `hybridtb gen … --out <out>`: regenerates this case's batch bit for bit.
  std::string gen_command(const std::string& out) const;
  // `hybridtb parity --backend <backend> --against reference <file>`.
  static std::string parity_command(const std::string& file, const std::string& backend);
};

struct Suite {
  std::string name;
  std::string description;
  std::string path;
  // The reference is skipped (with the reason) on cases above this many GFLOP: it runs at a few
  // GFLOP/s on one core, and a suite must take seconds per reference case, not minutes.
  double reference_max_gflop = 10.0;
  // Repetitions of a reference case (at most the case's own): its steps take seconds.
  int reference_repetitions = 3;
  std::vector<SuiteCase> cases;
};

// Parses and checks a suite: every mix parses, every preset + settings make a valid layer.
// Throws Error naming the group and the problem.
Suite parse_suite(const nlohmann::json& json, const std::string& path = "");
Suite load_suite(const std::string& path);

// The name of a case from its parts (also what parse_suite uses).
std::string case_name(const std::string& preset, const std::string& mix, const std::vector<std::string>& settings);

}  // namespace hybridtb::bench
