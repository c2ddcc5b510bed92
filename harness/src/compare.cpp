// The comparison component (compare.h): metrics, locations, padding and untouched-slot checks,
// the human table and the JSON report. Tested by tests/compare (`ctest -L compare`).
#include "hybridtb/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "hybridtb/error.h"
#include "hybridtb/revision.h"
#include "hybridtb/linear_layer.h"

#ifndef HYBRIDTB_BUILD_TYPE
#define HYBRIDTB_BUILD_TYPE "unknown"
#endif

namespace hybridtb {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Locator = std::function<Location(int64_t flat_index)>;

// Unravels a row-major index over `shape` with one name per dimension.
Location unravel(int64_t index, const Shape& shape, const std::vector<std::string>& names) {
  Location location;
  location.flat_index = index;
  std::vector<int64_t> coords(shape.size());
  int64_t rest = index;
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = shape[d] > 0 ? rest % shape[d] : 0;
    rest = shape[d] > 0 ? rest / shape[d] : 0;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    const std::string name = d < names.size() ? names[d] : detail::concat("i", d);
    location.coords.emplace_back(name, coords[d]);
  }
  return location;
}

// [T, Hq, D] → (req, tok within the request, head, dim), plus the row; a linear layer's [T, width]
// → (req, tok, col), plus the row.
Locator token_major_locator(const BatchDescription& batch, const Shape& shape) {
  return [&batch, shape](int64_t index) {
    const bool rows_of_columns = shape.size() == 2;
    const Location raw = unravel(index, shape, rows_of_columns ? std::vector<std::string>{"row", "col"}
                                                               : std::vector<std::string>{"row", "head", "dim"});
    const int64_t row = raw.coords[0].second;
    int64_t request = -1;
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      if (row >= batch.query_start_loc[r] && row < batch.query_start_loc[r + 1]) {
        request = r;
        break;
      }
    }
    Location location;
    location.flat_index = index;
    location.coords = {{"req", request}, {"tok", request >= 0 ? row - batch.query_start_loc[request] : row}};
    for (size_t d = 1; d < raw.coords.size(); ++d) location.coords.push_back(raw.coords[d]);
    location.coords.emplace_back("row", row);
    return location;
  };
}

Locator shape_locator(const Shape& shape, std::vector<std::string> names) {
  return [shape, names = std::move(names)](int64_t index) { return unravel(index, shape, names); };
}

struct FloatInputs {
  std::string name;
  Quantity quantity;
  TensorView candidate;
  TensorView expected;
  Tolerance tolerance;
  Locator locate;
  int64_t compared_elements = -1;  // the first this many elements are compared; the rest is padding
  bool check_expected_padding = true;
};

// Worst-element score: an error's size relative to what the tolerance allows (∞ for NaN/Inf
// mismatches); with a zero tolerance, the absolute error.
double violation(double error, double expected, const Tolerance& tolerance) {
  const double allowed = tolerance.atol + tolerance.rtol * std::fabs(expected);
  return allowed > 0 ? error / allowed : error;
}

QuantityReport compare_float(const FloatInputs& in) {
  QuantityReport report;
  report.name = in.name;
  report.quantity = in.quantity;
  report.tolerance = in.tolerance;
  report.candidate_dtype = in.candidate.empty() ? "-" : std::string(to_string(in.candidate.dtype()));
  report.expected_dtype = in.expected.empty() ? "-" : std::string(to_string(in.expected.dtype()));
  if (in.candidate.empty() != in.expected.empty()) {
    report.missing = in.candidate.empty() ? "absent in candidate" : "absent in expected";
    return report;
  }
  if (in.candidate.shape() != in.expected.shape()) {
    report.shape_mismatch = detail::concat("candidate ", shape_to_string(in.candidate.shape()), " vs expected ",
                                           shape_to_string(in.expected.shape()));
    return report;
  }
  const TensorView a = in.candidate, b = in.expected;
  HYBRIDTB_CHECK(a.is_contiguous() && b.is_contiguous(), "compare: ", in.name, " must be contiguous");
  const int64_t total = a.numel();
  const int64_t compared = in.compared_elements < 0 ? total : std::min(in.compared_elements, total);
  report.compared = compared;

  double sum_sq_err = 0, sum_sq_b = 0, sum_sq_a = 0, sum_ab = 0;
  double worst_score = -1;
  int64_t worst_index = -1;
  bool any_finite_pair = false;
  for (int64_t i = 0; i < compared; ++i) {
    const double x = load_as_double(a.data(), a.dtype(), i);
    const double y = load_as_double(b.data(), b.dtype(), i);
    double score = 0;
    const bool nan_x = std::isnan(x), nan_y = std::isnan(y);
    if (nan_x || nan_y) {
      if (nan_x != nan_y) {
        ++report.nan_mismatch;
        ++report.outside;
        score = std::numeric_limits<double>::infinity();
      }
    } else if (std::isinf(x) || std::isinf(y)) {
      if (x != y) {
        ++report.inf_mismatch;
        ++report.outside;
        score = std::numeric_limits<double>::infinity();
      }
    } else {
      any_finite_pair = true;
      const double error = std::fabs(x - y);
      report.max_abs = std::max(report.max_abs, error);
      if (y != 0) report.max_rel = std::max(report.max_rel, error / std::fabs(y));
      sum_sq_err += error * error;
      sum_sq_a += x * x;
      sum_sq_b += y * y;
      sum_ab += x * y;
      if (!in.tolerance.allows(x, y)) ++report.outside;
      score = violation(error, y, in.tolerance);
    }
    if (score > worst_score) {
      worst_score = score;
      worst_index = i;
    }
  }
  // A bit-exact quantity (tolerance 0, e.g. the KV cache) stored in one dtype on both sides is
  // compared byte for byte: equal values with different bits (−0 and +0, NaN payloads) fail too.
  if (in.tolerance.atol == 0.0 && in.tolerance.rtol == 0.0 && a.dtype() == b.dtype()) {
    const auto size = static_cast<size_t>(element_size(a.dtype()));
    const auto* pa = static_cast<const unsigned char*>(a.data());
    const auto* pb = static_cast<const unsigned char*>(b.data());
    for (int64_t i = 0; i < compared; ++i) {
      const size_t at = static_cast<size_t>(i) * size;
      if (std::memcmp(pa + at, pb + at, size) == 0) continue;
      const double x = load_as_double(a.data(), a.dtype(), i);
      const double y = load_as_double(b.data(), b.dtype(), i);
      if (!in.tolerance.allows(x, y)) continue;  // already counted as a value mismatch
      ++report.bits_differ;
      ++report.outside;
      if (worst_score <= 0) {
        worst_score = 1;
        worst_index = i;
      }
    }
  }
  if (!any_finite_pair) {
    report.max_abs = report.max_rel = report.nmse = report.cosine = kNaN;
  } else {
    report.nmse = sum_sq_b > 0 ? sum_sq_err / sum_sq_b : (sum_sq_err == 0 ? 0.0 : kNaN);
    report.cosine = (sum_sq_a > 0 && sum_sq_b > 0) ? sum_ab / std::sqrt(sum_sq_a * sum_sq_b)
                    : (sum_sq_a == 0 && sum_sq_b == 0 ? 1.0 : 0.0);
  }
  if (worst_index >= 0 && worst_score > 0) {
    report.worst = in.locate(worst_index);
    report.worst_candidate = load_as_double(a.data(), a.dtype(), worst_index);
    report.worst_expected = load_as_double(b.data(), b.dtype(), worst_index);
  }

  // Padding rows must still hold the NaN poison.
  int64_t written_candidate = 0, written_expected = 0;
  for (int64_t i = compared; i < total; ++i) {
    if (!std::isnan(load_as_double(a.data(), a.dtype(), i))) ++written_candidate;
    if (in.check_expected_padding && !std::isnan(load_as_double(b.data(), b.dtype(), i))) ++written_expected;
  }
  report.padding_written = written_candidate + written_expected;
  if (report.padding_written > 0) {
    report.padding_side = written_candidate > 0 && written_expected > 0 ? "both"
                          : written_candidate > 0                      ? "candidate"
                                                                       : "expected";
  }
  return report;
}

void finish(QuantityReport& report) {
  report.passed = report.missing.empty() && report.shape_mismatch.empty() && report.outside == 0 &&
                  report.padding_written == 0 && report.untouched_written == 0;
}

// Slots named by the Mamba metadata (every entry ≥ 0 of the state-index arrays).
std::set<int64_t> touched_slots(const HybridMetadata& metadata) {
  std::set<int64_t> slots;
  if (!metadata.mamba) return slots;
  for (const int32_t s : metadata.mamba->state_indices_tensor_d.values) {
    if (s >= 0) slots.insert(s);
  }
  if (metadata.mamba->state_indices_tensor_p) {
    for (const int32_t s : metadata.mamba->state_indices_tensor_p->values) {
      if (s >= 0) slots.insert(s);
    }
  }
  return slots;
}

bool same_value(double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; }

int64_t max_dim(const Shape& shape, size_t first) {
  int64_t m = 1;
  for (size_t d = first; d < shape.size(); ++d) m = std::max(m, shape[d]);
  return m;
}

std::string format_double(double value, int precision = 2) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::ostringstream out;
  out << std::scientific << std::setprecision(precision) << value;
  return out.str();
}

}  // namespace

std::string Location::to_string() const {
  std::string text = "(";
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i].first == "row") continue;  // shown for token-major outputs in the details only
    if (text.size() > 1) text += ", ";
    text += detail::concat(coords[i].first, "=", coords[i].second);
  }
  return text + ")";
}

int64_t Location::at(const std::string& name) const {
  for (const auto& [key, value] : coords) {
    if (key == name) return value;
  }
  return -1;
}

bool ComparisonReport::passed() const {
  if (!compared() || !metadata_differences.empty()) return false;
  return std::all_of(quantities.begin(), quantities.end(), [](const QuantityReport& q) { return q.passed; });
}

ParityKey parity_key(const BatchFile& file, Quantity quantity, DType candidate_dtype) {
  ParityKey key;
  key.quantity = quantity;
  key.model_dtype = file.config.dtype;
  key.kv_cache_dtype = file.config.kv_cache_dtype;
  key.candidate_dtype = candidate_dtype;
  key.fp8_output = file.inputs.output_scale.has_value();
  const BatchDescription& batch = file.batch;
  if (quantity == Quantity::kSsmOutput || quantity == Quantity::kSsmState) {
    // n = tokens one request's recurrence runs this step; m = the longest sum inside a token's
    // update (the largest dimension of H and of the mode's pools and weights); N = tokens a state
    // summarises.
    key.reduction_length = std::max<int64_t>(1, batch.max_query_len());
    // The parallel branch reads hidden rows of H = Hq·D; a linear layer reads its own inputs.
    int64_t m = file.config.is_linear_layer() ? 1 : file.config.num_heads * file.config.head_size;
    for (const auto& [name, input] : file.inputs.linear_inputs) m = std::max(m, max_dim(input.shape(), 1));
    for (const auto& [name, pool] : file.inputs.ssm_state) m = std::max(m, max_dim(pool.shape(), 1));
    for (const auto& [name, weight] : file.inputs.weights) m = std::max(m, max_dim(weight.shape(), 0));
    key.inner_length = m;
    key.history_length = batch.max_seq_len();
    key.ssm_mode = file.config.ssm_mode;
  } else {
    key.reduction_length = batch.max_seq_len() + 1;  // + 1: a sink term in the denominator
    key.inner_length = file.config.head_size;
    key.history_length = 0;
  }
  return key;
}

ComparisonReport compare_step(const BatchFile& file, const StepOutputs& candidate, const StepOutputs& expected,
                              const CompareOptions& options) {
  const AttentionConfig& config = file.config;
  const BatchDescription& batch = file.batch;
  ComparisonReport report;
  report.candidate_backend = candidate.backend;
  report.expected_backend = expected.backend;
  report.config_summary = detail::concat(
      to_string(config.dtype), " kv=", to_string(config.kv_cache_dtype), " Hq=", config.num_heads,
      " Hkv=", config.num_kv_heads, " D=", config.head_size, " BS=", config.block_size, " window=",
      config.sliding_window, " softcap=", config.logits_soft_cap, config.sinks ? " sinks" : "",
      config.alibi_slopes ? " alibi" : "", " ", to_string(config.attn_type), " ssm=", config.ssm_mode,
      file.inputs.output_scale ? " fp8-output" : "", config.is_linear_layer() ? " layer=" : "",
      config.is_linear_layer() ? to_string(config.layer_kind) : "");
  report.batch_summary = detail::concat("R=", batch.num_reqs(), " T=", batch.num_tokens(), " actual=",
                                        batch.num_actual_tokens, " max_query=", batch.max_query_len(),
                                        " max_seq=", batch.max_seq_len());

  const bool linear = config.is_linear_layer();
  const int64_t row = linear ? linear_layer_spec(config).output_width : config.num_heads * config.head_size;
  const int64_t actual_elements = batch.num_actual_tokens * row;
  const bool has_ssm = config.has_ssm_branch();

  auto key_for = [&](Quantity q, const TensorView& t) {
    ParityKey key = parity_key(file, q, t.empty() ? DType::kFloat64 : t.dtype());
    // The candidate's arithmetic: a backend whose outputs are float64 computes in float64 (the
    // reference); its pools are still stored in their own dtype.
    const Tensor& probe = linear ? candidate.output : candidate.attn_output;
    key.compute_dtype = probe.empty() || probe.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    key.ssm_operand_dtype = options.ssm_operand_dtype;
    return key;
  };
  auto token_major = [&](const std::string& name, Quantity q, const TensorView& a, const TensorView& b,
                         const Tolerance& tolerance) {
    FloatInputs in{name, q, a, b, tolerance, token_major_locator(batch, a.empty() ? b.shape() : a.shape()),
                   actual_elements, options.check_expected_padding};
    QuantityReport r = compare_float(in);
    finish(r);
    report.quantities.push_back(std::move(r));
  };

  if (linear) {
    // A linear layer's only output is its core's: the SSM chain cut before the gated norm and
    // out_proj, so the SSM contribution's row bounds it.
    token_major("output", Quantity::kSsmOutput, candidate.output, expected.output,
                parity_tolerance(key_for(Quantity::kSsmOutput, candidate.output)));
  } else {
    // Attention, SSM contribution, fused output.
    // The table's attention rows bound a kernel (float32 arithmetic, stored in its dtype) against the
    // float64 reference, whichever side each is on: the reference replayed against a kernel's
    // recorded /expected (datasets/vllm: vLLM's own Triton kernel) takes that kernel's row; two
    // kernels against each other take the sum of their two rows (each is within its row of float64).
    auto attention_tolerance_for = [&](Quantity q, const Tensor& cand, const Tensor& exp) {
      const Tolerance own = parity_tolerance(key_for(q, cand));
      if (exp.empty() || exp.dtype() == DType::kFloat64) return own;
      ParityKey kernel = parity_key(file, q, exp.dtype());
      kernel.compute_dtype = DType::kFloat32;
      const Tolerance e = parity_tolerance(kernel);
      if (cand.empty() || cand.dtype() == DType::kFloat64) {
        return Tolerance{e.atol, e.rtol, detail::concat("expected from a kernel: ", e.rationale)};
      }
      return Tolerance{own.atol + e.atol, own.rtol + e.rtol,
                       detail::concat("kernel vs kernel: (", own.rationale, ") + (", e.rationale, ")")};
    };
    const Tolerance attention_tolerance =
        attention_tolerance_for(Quantity::kAttnOutput, candidate.attn_output, expected.attn_output);
    token_major("attn_output", Quantity::kAttnOutput, candidate.attn_output, expected.attn_output, attention_tolerance);
    if (has_ssm || !candidate.ssm_output.empty() || !expected.ssm_output.empty()) {
      token_major("ssm_output", Quantity::kSsmOutput, candidate.ssm_output, expected.ssm_output,
                  parity_tolerance(key_for(Quantity::kSsmOutput, candidate.ssm_output)));
    }
    const Tolerance output_tolerance =
        has_ssm ? fused_parity_tolerance(key_for(Quantity::kOutput, candidate.output),
                                         key_for(Quantity::kSsmOutput, candidate.output))
                : attention_tolerance_for(Quantity::kOutput, candidate.output, expected.output);
    token_major("output", Quantity::kOutput, candidate.output, expected.output, output_tolerance);

    // KV cache and scale caches: bit-exact.
    if (!candidate.kv_cache.empty() || !expected.kv_cache.empty()) {
      const TensorView a = candidate.kv_cache, b = expected.kv_cache;
      QuantityReport r = compare_float({"kv_cache", Quantity::kKvCache, a, b,
                                        parity_tolerance(key_for(Quantity::kKvCache, a)),
                                        shape_locator(a.empty() ? b.shape() : a.shape(), {"block", "kv", "slot", "head", "dim"}),
                                        -1, true});
      finish(r);
      report.quantities.push_back(std::move(r));
    }
    const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> scale_caches[] = {
        {"k_scale_cache", {&candidate.k_scale_cache, &expected.k_scale_cache}},
        {"v_scale_cache", {&candidate.v_scale_cache, &expected.v_scale_cache}}};
    for (const auto& [name, tensors] : scale_caches) {
      const TensorView a = *tensors.first, b = *tensors.second;
      if (a.empty() && b.empty()) continue;
      QuantityReport r = compare_float({name, Quantity::kScaleCache, a, b,
                                        parity_tolerance(key_for(Quantity::kScaleCache, a)),
                                        shape_locator(a.empty() ? b.shape() : a.shape(), {"block", "slot", "head"}), -1,
                                        true});
      finish(r);
      report.quantities.push_back(std::move(r));
    }
  }

  // State pools: every slot with tolerance; slots the metadata does not name must keep the input.
  const std::set<int64_t> touched = touched_slots(expected.has_metadata ? expected.metadata : candidate.metadata);
  std::set<std::string> pool_names;
  for (const auto& [name, pool] : candidate.ssm_state) pool_names.insert(name);
  for (const auto& [name, pool] : expected.ssm_state) pool_names.insert(name);
  for (const std::string& name : pool_names) {
    const auto ca = candidate.ssm_state.find(name);
    const auto ex = expected.ssm_state.find(name);
    const TensorView a = ca != candidate.ssm_state.end() ? TensorView(ca->second) : TensorView();
    const TensorView b = ex != expected.ssm_state.end() ? TensorView(ex->second) : TensorView();
    const Shape shape = a.empty() ? b.shape() : a.shape();
    std::vector<std::string> names{"slot"};
    for (size_t d = 1; d < shape.size(); ++d) names.push_back(detail::concat("i", d));
    QuantityReport r = compare_float({"ssm/" + name, Quantity::kSsmState, a, b,
                                      parity_tolerance(key_for(Quantity::kSsmState, a)), shape_locator(shape, names),
                                      -1, true});
    const auto input = file.inputs.ssm_state.find(name);
    if (!a.empty() && input != file.inputs.ssm_state.end() && input->second.shape() == a.shape() && a.rank() >= 1) {
      const TensorView before = input->second;
      const int64_t slot_size = a.numel() / std::max<int64_t>(1, a.size(0));
      for (int64_t slot = 0; slot < a.size(0); ++slot) {
        if (touched.count(slot) != 0) continue;
        for (int64_t j = slot * slot_size; j < (slot + 1) * slot_size; ++j) {
          if (!same_value(load_as_double(a.data(), a.dtype(), j), load_as_double(before.data(), before.dtype(), j))) {
            ++r.untouched_written;
            if (!r.first_untouched_slot) r.first_untouched_slot = slot;
          }
        }
      }
    }
    finish(r);
    report.quantities.push_back(std::move(r));
  }

  report.metadata_shared = !options.compare_metadata;
  report.metadata_compared = options.compare_metadata && expected.has_metadata;
  if (report.metadata_compared) report.metadata_differences = metadata_differences(candidate.metadata, expected.metadata);
  return report;
}

// --- human output ----------------------------------------------------------------------------------

namespace {

std::string verdict_of(const QuantityReport& q) {
  if (!q.missing.empty()) return "FAIL (" + q.missing + ")";
  if (!q.shape_mismatch.empty()) return "FAIL (shape)";
  if (q.passed) return "pass";
  std::string why;
  if (q.outside > 0) why = q.bits_differ == q.outside ? "bits differ" : "outside tol";
  if (q.padding_written > 0) why += std::string(why.empty() ? "" : ", ") + "padding rows written";
  if (q.untouched_written > 0) why += std::string(why.empty() ? "" : ", ") + "untouched slots written";
  return "FAIL (" + why + ")";
}

std::string tolerance_text(const Tolerance& t) {
  if (t.atol == 0 && t.rtol == 0) return "exact";
  return "a=" + format_double(t.atol, 1) + " r=" + format_double(t.rtol, 1);
}

}  // namespace

std::string format_report_table(const std::vector<ComparisonReport>& reports, bool with_rationale) {
  const std::vector<std::string> header = {"file",  "quantity", "dtype", "max_abs", "max_rel",   "nmse",
                                           "cos",   "%out",     "nan/inf", "worst@", "tolerance", "verdict"};
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> details;
  std::vector<std::string> rationales;
  for (const ComparisonReport& report : reports) {
    const std::string file = std::filesystem::path(report.file).filename().string();
    if (!report.error.empty()) {
      rows.push_back({file, "(all)", "-", "-", "-", "-", "-", "-", "-", "-", "-", "ERROR"});
      details.push_back(file + ": error: " + report.error);
      continue;
    }
    if (!report.not_supported.empty()) {
      rows.push_back({file, "(all)", "-", "-", "-", "-", "-", "-", "-", "-", "-", "NOT SUPPORTED"});
      details.push_back(file + ": not supported by '" + report.candidate_backend + "': " + report.not_supported);
      continue;
    }
    for (const QuantityReport& q : report.quantities) {
      std::ostringstream pct;
      pct << std::fixed << std::setprecision(2) << 100.0 * q.fraction_outside();
      rows.push_back({file, q.name, q.candidate_dtype + "/" + q.expected_dtype, format_double(q.max_abs),
                      format_double(q.max_rel), format_double(q.nmse), format_double(q.cosine, 6), pct.str(),
                      detail::concat(q.nan_mismatch, "/", q.inf_mismatch), q.worst ? q.worst->to_string() : "-",
                      tolerance_text(q.tolerance), verdict_of(q)});
      if (std::find(rationales.begin(), rationales.end(), q.tolerance.rationale) == rationales.end()) {
        rationales.push_back(q.tolerance.rationale);
      }
      if (!q.passed) {
        std::string line = file + " " + q.name + ":";
        if (!q.missing.empty()) line += " " + q.missing + ";";
        if (!q.shape_mismatch.empty()) line += " shape " + q.shape_mismatch + ";";
        if (q.outside > 0 && q.worst) {
          line += detail::concat(" ", q.outside, " of ", q.compared, " elements outside tolerance; worst at ",
                                 q.worst->to_string());
          if (q.worst->at("row") >= 0) line += detail::concat(" (token row ", q.worst->at("row"), ")");
          line += detail::concat(": candidate ", format_double(q.worst_candidate, 6), " expected ",
                                 format_double(q.worst_expected, 6), ";");
        }
        if (q.padding_written > 0) {
          line += detail::concat(" padding rows written: ", q.padding_written, " elements past num_actual_tokens (",
                                 q.padding_side, ");");
        }
        if (q.untouched_written > 0) {
          line += detail::concat(" untouched slots written: ", q.untouched_written, " elements, first slot ",
                                 q.first_untouched_slot.value_or(-1), ";");
        }
        details.push_back(line);
      }
    }
    rows.push_back({file, "metadata", "int", "-", "-", "-", "-", "-", "-", "-", report.metadata_shared ? "-" : "exact",
                    report.metadata_shared                 ? "shared (not compared)"
                    : !report.metadata_compared            ? "not recorded"
                    : report.metadata_differences.empty() ? "pass"
                                                          : "FAIL (fields differ)"});
    for (const std::string& difference : report.metadata_differences) {
      details.push_back(file + " metadata: " + difference);
    }
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::ostringstream out;
  auto print_row = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < r.size(); ++c) {
      out << std::left << std::setw(static_cast<int>(width[c])) << r[c] << (c + 1 < r.size() ? "  " : "");
    }
    out << "\n";
  };
  print_row(header);
  for (const auto& r : rows) print_row(r);
  if (!details.empty()) {
    out << "\ndetails:\n";
    for (const std::string& d : details) out << "  " << d << "\n";
  }
  if (with_rationale && !rationales.empty()) {
    out << "\ntolerances (|a − b| ≤ atol + rtol·|b|):\n";
    for (const std::string& r : rationales) out << "  " << r << "\n";
  }
  return out.str();
}

std::string format_summary_line(const std::vector<ComparisonReport>& reports) {
  const auto passed = std::count_if(reports.begin(), reports.end(), [](const ComparisonReport& r) { return r.passed(); });
  return detail::concat(passed, " passed, ", static_cast<int64_t>(reports.size()) - passed, " failed");
}

// --- JSON ------------------------------------------------------------------------------------------

namespace {

nlohmann::ordered_json number(double value) {
  if (std::isnan(value)) return nullptr;
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

}  // namespace

ReportEnvironment current_environment(const std::string& command) {
  ReportEnvironment env;
  env.command = command;
  env.git_commit = source_revision().label();
  env.build_type = HYBRIDTB_BUILD_TYPE;
  env.cpu_model = cpu_model();
  return env;
}

nlohmann::ordered_json report_to_json(const std::vector<ComparisonReport>& reports, const ReportEnvironment& env) {
  nlohmann::ordered_json root;
  root["schema"] = "hybridtb-comparison-report";
  root["version"] = 1;
  root["environment"] = {{"command", env.command},
                         {"git_commit", env.git_commit},
                         {"build_type", env.build_type},
                         {"cpu_model", env.cpu_model}};
  if (!env.gpu_name.empty()) root["environment"]["gpu_name"] = env.gpu_name;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  for (const ComparisonReport& report : reports) {
    nlohmann::ordered_json c;
    c["file"] = report.file;
    c["candidate_backend"] = report.candidate_backend;
    c["expected_backend"] = report.expected_backend;
    c["config"] = report.config_summary;
    c["batch"] = report.batch_summary;
    c["passed"] = report.passed();
    if (!report.not_supported.empty()) c["not_supported"] = report.not_supported;
    if (!report.error.empty()) c["error"] = report.error;
    nlohmann::ordered_json quantities = nlohmann::ordered_json::array();
    for (const QuantityReport& q : report.quantities) {
      nlohmann::ordered_json j;
      j["name"] = q.name;
      j["quantity"] = std::string(to_string(q.quantity));
      j["candidate_dtype"] = q.candidate_dtype;
      j["expected_dtype"] = q.expected_dtype;
      if (!q.missing.empty()) j["missing"] = q.missing;
      if (!q.shape_mismatch.empty()) j["shape_mismatch"] = q.shape_mismatch;
      j["compared"] = q.compared;
      j["max_abs"] = number(q.max_abs);
      j["max_rel"] = number(q.max_rel);
      j["nmse"] = number(q.nmse);
      j["cosine"] = number(q.cosine);
      j["outside"] = q.outside;
      j["fraction_outside"] = number(q.fraction_outside());
      j["nan_mismatch"] = q.nan_mismatch;
      j["bits_differ"] = q.bits_differ;
      j["inf_mismatch"] = q.inf_mismatch;
      j["padding_written"] = q.padding_written;
      j["untouched_written"] = q.untouched_written;
      if (q.first_untouched_slot) j["first_untouched_slot"] = *q.first_untouched_slot;
      if (q.worst) {
        nlohmann::ordered_json w;
        for (const auto& [name, value] : q.worst->coords) w[name] = value;
        w["flat_index"] = q.worst->flat_index;
        w["candidate"] = number(q.worst_candidate);
        w["expected"] = number(q.worst_expected);
        j["worst"] = w;
      } else {
        j["worst"] = nullptr;
      }
      j["tolerance"] = {{"atol", number(q.tolerance.atol)},
                        {"rtol", number(q.tolerance.rtol)},
                        {"rationale", q.tolerance.rationale}};
      j["passed"] = q.passed;
      quantities.push_back(std::move(j));
    }
    c["quantities"] = std::move(quantities);
    c["metadata"] = {{"passed", report.metadata_differences.empty()},
                     {"compared", report.metadata_compared},
                     {"shared", report.metadata_shared},
                     {"differences", report.metadata_differences}};
    cases.push_back(std::move(c));
  }
  root["cases"] = std::move(cases);
  // failed counts mismatches only: files not supported or in error were not compared.
  int64_t passed = 0, failed = 0, not_supported = 0, errors = 0;
  for (const ComparisonReport& r : reports) {
    if (!r.error.empty()) {
      ++errors;
    } else if (!r.not_supported.empty()) {
      ++not_supported;
    } else {
      ++(r.passed() ? passed : failed);
    }
  }
  root["summary"] = {{"passed", passed}, {"failed", failed}, {"not_supported", not_supported}, {"errors", errors}};
  return root;
}

}  // namespace hybridtb
