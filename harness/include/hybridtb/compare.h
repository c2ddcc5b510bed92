// The one comparison component of hybridtb: a candidate step's results (StepOutputs) against the
// expected ones, quantity by quantity, as a report rather than a boolean (max abs/rel error, NMSE,
// cosine, fraction outside tolerance, NaN/Inf mismatches, the worst element located in the batch's
// own coordinates). `hybridtb parity` and `hybridtb replay` print it; tests call it directly
// (tests/compare, `ctest -L compare`). Tolerances come from parity_tolerance() (tolerance.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hybridtb/batch_file.h"
#include "hybridtb/tolerance.h"

namespace hybridtb {

// An element located in the coordinates of its tensor, e.g. {("req", 1), ("tok", 3), ("head", 2),
// ("dim", 5)} for a token-major output (tok = token within its request), {("block", 7), ("kv", 1),
// ("slot", 4), ("head", 0), ("dim", 9)} for the KV cache, {("slot", 3), ("i1", 0), ...} for a pool.
struct Location {
  std::vector<std::pair<std::string, int64_t>> coords;
  int64_t flat_index = -1;  // element index in the row-major tensor
  std::string to_string() const;  // "(req=1, tok=3, head=2, dim=5)"
  // The value of coordinate `name`, or −1 if absent.
  int64_t at(const std::string& name) const;
};

// One float quantity compared. Metrics are over the compared elements only (rows <
// num_actual_tokens for token-major outputs; every element otherwise), NaN/Inf pairs excluded
// from max_abs, max_rel, NMSE and cosine. A metric that is undefined (no finite pair, zero norm)
// is NaN and is written as null in JSON.
struct QuantityReport {
  std::string name;      // "attn_output", "ssm_output", "output", "kv_cache", "k_scale_cache", "ssm/<pool>"
  Quantity quantity = Quantity::kOutput;
  std::string candidate_dtype, expected_dtype;
  std::string missing;   // non-empty: present on one side only (e.g. "absent in candidate") → fail
  std::string shape_mismatch;  // non-empty: shapes differ → fail
  int64_t compared = 0;        // elements compared
  double max_abs = 0.0;        // max |a − b|
  double max_rel = 0.0;        // max |a − b| / |b| over b ≠ 0
  double nmse = 0.0;           // Σ(a − b)² / Σb² (NaN if Σb² = 0 and Σ(a − b)² = 0 is reported as 0)
  double cosine = 1.0;         // Σab / sqrt(Σa²·Σb²)
  int64_t outside = 0;         // elements failing the tolerance (NaN/Inf mismatches included)
  int64_t nan_mismatch = 0;    // NaN on exactly one side
  int64_t inf_mismatch = 0;    // ±Inf on one side and not the same ±Inf on the other
  int64_t bits_differ = 0;     // bit-exact quantities of one dtype: elements equal in value whose bytes
                               // differ (−0 vs +0, NaN payloads); counted in `outside` too
  int64_t padding_written = 0;    // padding-row elements (rows ≥ num_actual_tokens) not NaN-poisoned
  std::string padding_side;       // "candidate", "expected" or "both" when padding_written > 0
  int64_t untouched_written = 0;  // pools: elements of slots the metadata does not name that differ from the input
  std::optional<int64_t> first_untouched_slot;
  std::optional<Location> worst;  // the element with the largest error relative to its tolerance
  double worst_candidate = 0.0, worst_expected = 0.0;
  Tolerance tolerance;
  bool passed = false;

  double fraction_outside() const { return compared > 0 ? static_cast<double>(outside) / static_cast<double>(compared) : 0.0; }
};

// The comparison of one file's step.
struct ComparisonReport {
  std::string file;                 // path as given
  std::string candidate_backend;    // e.g. "cuda"
  std::string expected_backend;     // e.g. "reference" (or the /expected group's attribute)
  std::string config_summary;       // "bfloat16 kv=auto Hq=8 Hkv=2 D=64 BS=16 window=0 ssm=none"
  std::string batch_summary;        // "R=3 T=20 (actual 17) max_q=9 max_seq=40"
  std::vector<QuantityReport> quantities;
  std::vector<std::string> metadata_differences;  // metadata_differences(candidate, expected); integers exact
  bool metadata_compared = true;    // false: the expected side recorded no metadata (an engine capture),
                                    // or metadata_shared
  bool metadata_shared = false;     // true: not compared, both sides built it with the shared builders
  std::string not_supported;        // non-empty: the candidate backend threw NotSupported (nothing compared)
  std::string error;                // non-empty: the file could not be read, validated or run (nothing compared)
  bool passed() const;
  bool compared() const { return not_supported.empty() && error.empty(); }
};

struct CompareOptions {
  // Check that padding rows of the EXPECTED outputs hold the NaN poison too. On for parity (both
  // sides ran here through run_step); off for replay, because a captured /expected need not
  // poison padding rows (SCHEMA §5.5: they carry no meaning). The candidate's padding rows are
  // always checked.
  bool check_expected_padding = true;
  // Compare the builders' metadata of the two sides. Off for parity: every backend builds it with
  // the one shared implementation (hybridtb/spec/metadata_builders.h, checked against vLLM's
  // semantics by tests/builders), so two backends run here agree by construction and the row says
  // "shared". On for replay, against the metadata a file recorded.
  bool compare_metadata = true;
  // The dtype the candidate's SSM prefill product operands were rounded to (ParityKey::
  // ssm_operand_dtype): float32, or the model dtype for a cuda backend run with
  // BackendSettings::ssm_prefill_operands model (the SSM quantities then take the table's
  // 16-bit-operand row).
  DType ssm_operand_dtype = DType::kFloat32;
};

// The reduction lengths the tolerance rows need, from the batch (tolerance.h, ParityKey).
ParityKey parity_key(const BatchFile& file, Quantity quantity, DType candidate_dtype);

// Compares `candidate` against `expected` for `file` (whose inputs are the state before the step).
ComparisonReport compare_step(const BatchFile& file, const StepOutputs& candidate, const StepOutputs& expected,
                              const CompareOptions& options = {});

// The human table: one row per file × quantity (plus one metadata row per file: its verdict, or
// "shared (not compared)" / "not recorded" when it was not compared), aligned columns
// quantity, dtype, max_abs, max_rel, nmse, cos, %out, nan/inf, worst@, tolerance, verdict; failing
// rows are followed by their details (padding rows, untouched slots, metadata fields, the worst
// element's values). `with_rationale` appends each distinct tolerance derivation.
std::string format_report_table(const std::vector<ComparisonReport>& reports, bool with_rationale = true);
// "N passed, M failed" (files), exactly.
std::string format_summary_line(const std::vector<ComparisonReport>& reports);

// Machine output. Never NaN literals: undefined metrics are null, infinities are strings.
struct ReportEnvironment {
  std::string command;      // "parity" | "replay"
  std::string git_commit;   // source_revision().label() at run time ("abc1234" or "abc1234-dirty")
  std::string build_type;
  std::string cpu_model;    // /proc/cpuinfo "model name"
  std::string gpu_name;     // (optional) when a backend reports one
};
ReportEnvironment current_environment(const std::string& command);
nlohmann::ordered_json report_to_json(const std::vector<ComparisonReport>& reports, const ReportEnvironment& env);

}  // namespace hybridtb
