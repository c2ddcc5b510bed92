// The comparison component (hybridtb/compare.h): the reference against itself on every shipped
// example is exact, and each injected fault — a perturbed element, a NaN, a written padding row, a
// flipped KV-cache byte, a changed metadata field, a changed or stray pool slot — fails and is
// located. Run: ctest -L compare.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> example_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(testing::source_dir() / "datasets" / "examples")) {
    if (entry.path().extension() == ".h5") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

StepOutputs run_reference(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

// A deep copy of a step's outputs (Tensor copies share buffers).
StepOutputs deep_copy(const StepOutputs& s) {
  StepOutputs c = s;
  auto clone = [](const Tensor& t) { return t.empty() ? Tensor() : clone_host(t); };
  c.output = clone(s.output);
  c.attn_output = clone(s.attn_output);
  c.kv_cache = clone(s.kv_cache);
  c.k_scale_cache = clone(s.k_scale_cache);
  c.v_scale_cache = clone(s.v_scale_cache);
  c.ssm_output = clone(s.ssm_output);
  for (auto& [name, pool] : c.ssm_state) pool = clone(s.ssm_state.at(name));
  return c;
}

const QuantityReport& quantity(const ComparisonReport& report, const std::string& name) {
  for (const QuantityReport& q : report.quantities) {
    if (q.name == name) return q;
  }
  throw std::runtime_error("no quantity " + name);
}

// One loaded example and its reference outputs, shared by the fault-injection tests.
struct Case {
  BatchFile file;
  StepOutputs expected;
};
Case load(const std::string& name) {
  Case c;
  c.file = read_batch_file((testing::source_dir() / "datasets" / "examples" / name).string());
  c.expected = run_reference(c.file);
  return c;
}

TEST(Compare, ReferenceAgainstItselfIsExactOnEveryExample) {
  const auto files = example_files();
  ASSERT_FALSE(files.empty());
  for (const fs::path& path : files) {
    SCOPED_TRACE(path.filename().string());
    const BatchFile file = read_batch_file(path.string());
    const StepOutputs a = run_reference(file);
    const StepOutputs b = run_reference(file);
    ComparisonReport report = compare_step(file, a, b);
    report.file = path.string();
    EXPECT_TRUE(report.passed()) << format_report_table({report});
    EXPECT_TRUE(report.metadata_differences.empty());
    for (const QuantityReport& q : report.quantities) {
      SCOPED_TRACE(q.name);
      EXPECT_TRUE(q.passed);
      EXPECT_EQ(q.outside, 0);
      EXPECT_EQ(q.nan_mismatch, 0);
      EXPECT_EQ(q.padding_written, 0);
      EXPECT_EQ(q.untouched_written, 0);
      if (q.compared > 0 && !std::isnan(q.max_abs)) {
        EXPECT_EQ(q.max_abs, 0.0);
        EXPECT_EQ(q.nmse, 0.0);
      }
      EXPECT_FALSE(q.tolerance.rationale.empty());
    }
    EXPECT_EQ(format_summary_line({report}), "1 passed, 0 failed");
  }
}

TEST(Compare, PerturbedAttentionElementIsLocated) {
  Case c = load("mixed_swa_bf16.h5");
  const BatchDescription& batch = c.file.batch;
  ASSERT_GE(batch.num_reqs(), 2);
  const int64_t request = 1, token = batch.query_len(1) - 1, head = c.file.config.num_heads - 1, dim = 3;
  const int64_t row = batch.query_start_loc[request] + token;
  StepOutputs candidate = deep_copy(c.expected);
  const TensorView attn = candidate.attn_output;
  const int64_t index = attn.offset({row, head, dim});
  store_from_double(attn.data(), attn.dtype(), index, load_as_double(attn.data(), attn.dtype(), index) + 0.5);
  const ComparisonReport report = compare_step(c.file, candidate, c.expected);
  EXPECT_FALSE(report.passed());
  const QuantityReport q = quantity(report, "attn_output");
  EXPECT_FALSE(q.passed);
  EXPECT_EQ(q.outside, 1);
  ASSERT_TRUE(q.worst.has_value());
  EXPECT_EQ(q.worst->at("req"), request);
  EXPECT_EQ(q.worst->at("tok"), token);
  EXPECT_EQ(q.worst->at("head"), head);
  EXPECT_EQ(q.worst->at("dim"), dim);
  EXPECT_NEAR(q.max_abs, 0.5, 1e-12);
  EXPECT_TRUE(quantity(report, "output").passed);  // only attn_output was touched
  const std::string table = format_report_table({report});
  EXPECT_NE(table.find(detail::concat("(req=1, tok=", token, ", head=", head, ", dim=3)")), std::string::npos) << table;
  EXPECT_EQ(format_summary_line({report}), "0 passed, 1 failed");
}

TEST(Compare, InjectedNaNIsCountedAsAMismatch) {
  Case c = load("fp8_kv_sinks_fp16.h5");
  StepOutputs candidate = deep_copy(c.expected);
  const TensorView out = candidate.output;
  store_from_double(out.data(), out.dtype(), 5, std::numeric_limits<double>::quiet_NaN());
  store_from_double(out.data(), out.dtype(), 9, std::numeric_limits<double>::infinity());
  const ComparisonReport report = compare_step(c.file, candidate, c.expected);
  const QuantityReport q = quantity(report, "output");
  EXPECT_FALSE(q.passed);
  EXPECT_EQ(q.nan_mismatch, 1);
  EXPECT_EQ(q.inf_mismatch, 1);
  EXPECT_EQ(q.outside, 2);
  ASSERT_TRUE(q.worst.has_value());
  EXPECT_EQ(q.worst->flat_index, 5);  // the first of the two infinitely bad elements
}

TEST(Compare, WrittenPaddingRowIsReported) {
  Case c = load("decode_cudagraph_padded_fp32.h5");
  ASSERT_LT(c.file.batch.num_actual_tokens, c.file.batch.num_tokens());
  StepOutputs candidate = deep_copy(c.expected);
  const TensorView out = candidate.attn_output;
  store_from_double(out.data(), out.dtype(), out.offset({c.file.batch.num_actual_tokens, 0, 0}), 0.0);
  const ComparisonReport report = compare_step(c.file, candidate, c.expected);
  const QuantityReport q = quantity(report, "attn_output");
  EXPECT_FALSE(q.passed);
  EXPECT_EQ(q.outside, 0);
  EXPECT_EQ(q.padding_written, 1);
  EXPECT_EQ(q.padding_side, "candidate");
  EXPECT_NE(format_report_table({report}).find("padding rows written"), std::string::npos);
}

TEST(Compare, FlippedKvCacheByteIsLocated) {
  Case c = load("fp8_kv_sinks_fp16.h5");
  StepOutputs candidate = deep_copy(c.expected);
  const TensorView kv = candidate.kv_cache;
  ASSERT_EQ(element_size(kv.dtype()), 1);
  // Block 1, V half, slot 2, head 0, dim 7 (a byte of the cache after the write).
  const int64_t index = kv.offset({1, 1, 2, 0, 7});
  auto* bytes = static_cast<uint8_t*>(kv.data());
  const double before = load_as_double(kv.data(), kv.dtype(), index);
  bytes[index] ^= 0x01;
  if (std::isnan(before) || std::isnan(load_as_double(kv.data(), kv.dtype(), index))) bytes[index] ^= 0x03;
  const ComparisonReport report = compare_step(c.file, candidate, c.expected);
  const QuantityReport q = quantity(report, "kv_cache");
  EXPECT_FALSE(q.passed);
  EXPECT_EQ(q.tolerance.atol, 0.0);
  EXPECT_EQ(q.outside, 1);
  ASSERT_TRUE(q.worst.has_value());
  EXPECT_EQ(q.worst->to_string(), "(block=1, kv=1, slot=2, head=0, dim=7)");
}

// The KV cache is bit-exact: two encodings of one value (+0 and −0 here) differ in their bytes and
// fail, though a value comparison would call them equal.
TEST(Compare, KvCacheComparesBytesNotValues) {
  Case c = load("mixed_swa_bf16.h5");
  StepOutputs candidate = deep_copy(c.expected);
  StepOutputs expected = deep_copy(c.expected);
  const TensorView a = candidate.kv_cache, b = expected.kv_cache;
  ASSERT_EQ(a.dtype(), DType::kBFloat16);
  const int64_t index = a.offset({1, 0, 3, 0, 5});
  store_from_double(a.data(), a.dtype(), index, 0.0);
  store_from_double(b.data(), b.dtype(), index, -0.0);
  ASSERT_EQ(load_as_double(a.data(), a.dtype(), index), load_as_double(b.data(), b.dtype(), index));
  const ComparisonReport report = compare_step(c.file, candidate, expected);
  const QuantityReport q = quantity(report, "kv_cache");
  EXPECT_FALSE(q.passed);
  EXPECT_EQ(q.bits_differ, 1);
  EXPECT_EQ(q.outside, 1);
  EXPECT_EQ(q.max_abs, 0.0);
  ASSERT_TRUE(q.worst.has_value());
  EXPECT_EQ(q.worst->to_string(), "(block=1, kv=0, slot=3, head=0, dim=5)");
  EXPECT_NE(format_report_table({report}).find("bits differ"), std::string::npos);
}

// A float64 candidate (the reference) replayed against an /expected recorded by a GPU kernel in its
// model dtype takes the table's row for that kernel (float32 arithmetic, bfloat16 store): the same
// row a bfloat16 candidate gets against the float64 reference.
TEST(Compare, ExpectedFromAKernelTakesTheKernelsRow) {
  Case c = load("mixed_swa_bf16.h5");
  ASSERT_EQ(c.file.config.dtype, DType::kBFloat16);
  auto to_bf16 = [](const Tensor& t) {
    Tensor r = Tensor::host(DType::kBFloat16, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
      store_from_double(r.data(), r.dtype(), i, load_as_double(t.data(), t.dtype(), i));
    }
    return r;
  };
  StepOutputs kernel = deep_copy(c.expected);
  kernel.attn_output = to_bf16(c.expected.attn_output);
  kernel.output = to_bf16(c.expected.output);
  const ComparisonReport replay = compare_step(c.file, c.expected, kernel);  // reference vs the kernel
  const ComparisonReport parity = compare_step(c.file, kernel, c.expected);  // the kernel vs the reference
  EXPECT_TRUE(replay.passed()) << format_report_table({replay});
  const QuantityReport r = quantity(replay, "attn_output");
  const QuantityReport p = quantity(parity, "attn_output");
  EXPECT_EQ(r.tolerance.atol, p.tolerance.atol);
  EXPECT_EQ(r.tolerance.rtol, p.tolerance.rtol);
  EXPECT_GT(r.tolerance.atol, 1e-6);  // not the float64-against-float64 row
  EXPECT_NE(r.tolerance.rationale.find("expected from a kernel"), std::string::npos) << r.tolerance.rationale;
  // Two kernels against each other: the sum of their rows.
  const ComparisonReport both = compare_step(c.file, kernel, kernel);
  EXPECT_EQ(quantity(both, "attn_output").tolerance.atol, 2 * p.tolerance.atol);
}

TEST(Compare, ChangedMetadataFieldIsNamed) {
  Case c = load("mixed_swa_bf16.h5");
  StepOutputs candidate = deep_copy(c.expected);
  candidate.metadata.attention.max_seq_len += 1;
  const ComparisonReport report = compare_step(c.file, candidate, c.expected);
  EXPECT_FALSE(report.passed());
  ASSERT_EQ(report.metadata_differences.size(), 1u);
  EXPECT_NE(report.metadata_differences[0].find("attention/max_seq_len"), std::string::npos);
  EXPECT_NE(format_report_table({report}).find("attention/max_seq_len"), std::string::npos);
}

// Parity's setting: the metadata comes from the shared builders on both sides, so it is labelled
// shared and not compared (a difference there could only come from the comparison's inputs).
TEST(Compare, SharedMetadataIsLabelledAndNotCompared) {
  Case c = load("mixed_swa_bf16.h5");
  StepOutputs candidate = deep_copy(c.expected);
  candidate.metadata.attention.max_seq_len += 1;
  const ComparisonReport report =
      compare_step(c.file, candidate, c.expected, CompareOptions{.compare_metadata = false});
  EXPECT_TRUE(report.passed());
  EXPECT_TRUE(report.metadata_shared);
  EXPECT_FALSE(report.metadata_compared);
  EXPECT_TRUE(report.metadata_differences.empty());
  const std::string table = format_report_table({report});
  EXPECT_NE(table.find("shared (not compared)"), std::string::npos) << table;
  EXPECT_EQ(table.find("attention/max_seq_len"), std::string::npos) << table;
}

TEST(Compare, ChangedPoolSlotIsLocatedAndStrayWritesAreCaught) {
  Case c = load("hybrid_prefix_sum_padded_fp16.h5");
  ASSERT_FALSE(c.expected.ssm_state.empty());
  const auto& [name, pool] = *c.expected.ssm_state.begin();
  ASSERT_TRUE(c.expected.metadata.mamba.has_value());
  const int64_t touched = c.expected.metadata.mamba->state_indices_tensor_d.values.at(0);
  ASSERT_GE(touched, 0);
  {
    StepOutputs candidate = deep_copy(c.expected);
    const TensorView p = candidate.ssm_state.at(name);
    const int64_t slot_size = p.numel() / p.size(0);
    const int64_t index = touched * slot_size + 1;
    store_from_double(p.data(), p.dtype(), index, load_as_double(p.data(), p.dtype(), index) + 4.0);
    const ComparisonReport report = compare_step(c.file, candidate, c.expected);
    const QuantityReport q = quantity(report, "ssm/" + name);
    EXPECT_FALSE(q.passed);
    ASSERT_TRUE(q.worst.has_value());
    EXPECT_EQ(q.worst->at("slot"), touched);
    EXPECT_EQ(q.worst->flat_index, index);
    EXPECT_EQ(q.untouched_written, 0);
  }
  {
    // A slot the metadata does not name: the expected side is changed too (so the values agree);
    // the candidate still must not have written it.
    std::set<int64_t> named(c.expected.metadata.mamba->state_indices_tensor_d.values.begin(),
                            c.expected.metadata.mamba->state_indices_tensor_d.values.end());
    if (c.expected.metadata.mamba->state_indices_tensor_p) {
      for (const int32_t s : c.expected.metadata.mamba->state_indices_tensor_p->values) named.insert(s);
    }
    int64_t stray = 0;
    while (named.count(stray) != 0) ++stray;
    ASSERT_LT(stray, pool.size(0));
    StepOutputs candidate = deep_copy(c.expected);
    StepOutputs expected = deep_copy(c.expected);
    for (StepOutputs* s : {&candidate, &expected}) {
      const TensorView p = s->ssm_state.at(name);
      store_from_double(p.data(), p.dtype(), stray * (p.numel() / p.size(0)), 123.0);
    }
    const ComparisonReport report = compare_step(c.file, candidate, expected);
    const QuantityReport q = quantity(report, "ssm/" + name);
    EXPECT_FALSE(q.passed);
    EXPECT_EQ(q.outside, 0);
    EXPECT_EQ(q.untouched_written, 1);
    EXPECT_EQ(q.first_untouched_slot, stray);
    EXPECT_NE(format_report_table({report}).find("untouched slots written"), std::string::npos);
  }
}

TEST(Compare, JsonHasNoNaNLiteralsAndCarriesTheMetrics) {
  Case c = load("decode_cudagraph_padded_fp32.h5");
  StepOutputs candidate = deep_copy(c.expected);
  const TensorView out = candidate.output;
  store_from_double(out.data(), out.dtype(), 0, std::numeric_limits<double>::quiet_NaN());
  ComparisonReport report = compare_step(c.file, candidate, c.expected);
  report.file = "x.h5";
  const std::string text = report_to_json({report}, current_environment("parity")).dump();
  EXPECT_EQ(text.find("NaN"), std::string::npos);
  const auto json = nlohmann::json::parse(text);
  EXPECT_EQ(json["summary"]["failed"], 1);
  EXPECT_FALSE(json["environment"]["git_commit"].get<std::string>().empty());
  const auto& q = json["cases"][0]["quantities"];
  bool found = false;
  for (const auto& item : q) {
    if (item["name"] == "output") {
      found = true;
      EXPECT_EQ(item["nan_mismatch"], 1);
      EXPECT_TRUE(item["tolerance"]["rationale"].is_string());
      EXPECT_EQ(item["worst"]["row"], 0);
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace hybridtb
