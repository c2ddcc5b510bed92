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

// A benchmark name ("<backend>/<path>/<case name>") shortened for a console column of `width`
// characters: segments separated by spaces, "reference" → "ref", the settings that mean "off"
// or are the generator's default dropped (ssm_mode=none, sliding_window=0, kv_cache_dtype=auto,
// dtype=bfloat16), the others abbreviated (ssm_mode=X → ssm=X, sliding_window=N → w=N, float16 → fp16,
// float32 → fp32, kv_cache_dtype=X → kv=X with fp8_e4m3 → e4m3, fp8_e5m2 → e5m2,
// fp8_per_token_head → fp8-tok, int8_per_token_head → int8-tok), other `--set` settings kept as they are. When wider
// than `width`, those other settings are dropped from the last and counted ("+2 set"), and if it
// is still too wide, the middle is replaced by "..". The full name is in --list and the JSON.
std::string short_bench_name(const std::string& bench_name, size_t width);

}  // namespace hybridtb::bench
