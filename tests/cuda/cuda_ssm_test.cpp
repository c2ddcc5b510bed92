// The SSM branch of the "cuda" backend against the reference, for every mode (zero,
// prefix_sum_flat, prefix_sum, ema, mamba1) and every mamba_cache_mode (none, all, align) on mixed
// batches (decodes with context, a decode without context, continued chunks, fresh prefills, a
// long prefill crossing many scan chunks, CUDA-graph padding): the contribution, the fused output
// and every state pool within the tolerance table (compare_step, as `hybridtb parity`), padding
// rows never written, slots no request names untouched (byte for byte), a mode without a GPU
// implementation refused with NotSupported, chunked prefill == one-shot prefill on the GPU, and
// bitwise run-to-run reproducibility; for mamba1 also decode-only steps (the scan's single decode
// launch), long single requests of a length no chunk size divides, 16-bit pools on the vector
// state path and odd sizes (partial channel tiles and state quads) on the scalar one. Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda   (cases named Small* are the compute-sanitizer subset)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

struct SsmCase {
  std::string name;
  std::string mode;
  MambaCacheMode cache = MambaCacheMode::kNone;
  DType dtype = DType::kBFloat16;
  std::vector<RequestSpec> requests;
  int64_t padding_tokens = 0;
  int64_t padding_requests = 0;
  bool decode_graph = false;  // FULL_DECODE_ONLY capture sizes (decode-only padded steps)
  bool big_mamba = false;     // I 64, N 16, K 4, R 8 (else every parameter 4)
  bool odd_mamba = false;     // I 20, N 6, K 3, R 5: partial channel tiles, partial state quads, unaligned B/C
  DType pool_dtype = DType::kFloat32;
  uint64_t seed = 1;
};

void PrintTo(const SsmCase& c, std::ostream* out) { *out << c.name; }

// Decodes first (the Mamba builder requires it): with context, without context (fresh, one
// token); then a continued chunk, fresh prefills, and a long one (many scan chunks, block
// boundaries in every chunk).
const std::vector<RequestSpec> kMixed = {{40, 1}, {7, 1}, {0, 1}, {50, 30}, {0, 21}, {17, 300}};
const std::vector<RequestSpec> kSmall = {{20, 1}, {0, 1}, {5, 19}, {0, 9}};
const std::vector<RequestSpec> kDecodes = {{20, 1}, {3, 1}, {60, 1}, {31, 1}};
const std::vector<RequestSpec> kLong = {{0, 1}, {100, 700}};
// One long request alone: many scan chunks, a length that is no multiple of any chunk size.
const std::vector<RequestSpec> kLongSingle = {{37, 1001}};
// Decodes only (no prefill launch), more than one block of channels per request when I = 64.
const std::vector<RequestSpec> kManyDecodes = {{20, 1}, {3, 1}, {60, 1}, {31, 1}, {1, 1}, {90, 1}, {0, 1}};

AttentionConfig make_config(const SsmCase& c) {
  AttentionConfig config;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_size = 32;
  config.block_size = 16;
  config.scale = 1.0 / std::sqrt(32.0);
  config.dtype = c.dtype;
  config.ssm_mode = c.mode;
  config.mamba_cache_mode = c.cache;
  config.mamba_block_size = c.cache == MambaCacheMode::kNone ? 0 : 16;
  const reference::ssm::Mode& mode = reference::ssm::ModeRegistry::instance().find(c.mode);
  for (const std::string& p : mode.parameters()) config.ssm_params[p] = 4;
  if (c.big_mamba) {
    config.ssm_params = {{"intermediate_size", 64}, {"state_size", 16}, {"conv_kernel", 4}, {"dt_rank", 8}};
  }
  if (c.odd_mamba) {
    config.ssm_params = {{"intermediate_size", 20}, {"state_size", 6}, {"conv_kernel", 3}, {"dt_rank", 5}};
  }
  return config;
}

// Pools as `dtype` (the generators write float32; readers accept any float dtype).
std::map<std::string, Tensor> convert(const std::map<std::string, Tensor>& pools, DType dtype) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, pool] : pools) out.emplace(name, convert_host(pool, dtype));
  return out;
}

BatchFile make_ssm_step(const SsmCase& c) {
  const AttentionConfig config = make_config(c);
  BuilderConfig builder;
  if (c.decode_graph) {
    builder.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
    builder.cudagraph_capture_sizes = {1, 2, 4, 8};
  }
  SyntheticOptions options;
  options.seed = c.seed;
  options.padding_tokens = c.padding_tokens;
  options.padding_requests = c.padding_requests;
  options.ssm_block_table = true;
  BatchFile file = make_synthetic_batch(config, builder, c.requests, options);
  // Two spare slots no request names: they must come back untouched.
  auto tensors = reference::ssm::make_random_ssm_tensors(config, ssm_slots_needed(file.batch) + 2, c.seed + 100);
  file.inputs.ssm_state = convert(tensors.ssm_state, c.pool_dtype);
  file.inputs.weights = std::move(tensors.weights);
  return file;
}

std::vector<SsmCase> cases() {
  std::vector<SsmCase> all;
  const std::vector<std::pair<MambaCacheMode, const char*>> caches = {
      {MambaCacheMode::kNone, "None"}, {MambaCacheMode::kAll, "All"}, {MambaCacheMode::kAlign, "Align"}};
  const std::vector<std::pair<std::string, const char*>> modes = {{"zero", "Zero"},
                                                                   {"prefix_sum_flat", "PrefixSumFlat"},
                                                                   {"prefix_sum", "PrefixSum"},
                                                                   {"ema", "Ema"},
                                                                   {"mamba1", "Mamba1"}};
  for (const auto& [mode, mode_name] : modes) {
    // Small ones: the compute-sanitizer subset.
    all.push_back({.name = std::string("Small") + mode_name, .mode = mode, .cache = MambaCacheMode::kAll,
                   .requests = kSmall, .padding_tokens = 2, .padding_requests = 1});
    for (const auto& [cache, cache_name] : caches) {
      all.push_back({.name = std::string(mode_name) + "Mixed" + cache_name + "Bf16", .mode = mode, .cache = cache,
                     .requests = kMixed, .padding_tokens = 3, .padding_requests = 1, .seed = 3});
      all.push_back({.name = std::string(mode_name) + "Mixed" + cache_name + "Fp32", .mode = mode, .cache = cache,
                     .dtype = DType::kFloat32, .requests = kMixed, .seed = 5});
    }
    all.push_back({.name = std::string(mode_name) + "DecodesPaddedFp16", .mode = mode, .dtype = DType::kFloat16,
                   .requests = kDecodes, .padding_tokens = 4, .padding_requests = 4, .decode_graph = true, .seed = 7});
    all.push_back({.name = std::string(mode_name) + "LongAllBf16Pools", .mode = mode, .cache = MambaCacheMode::kAll,
                   .requests = kLong, .pool_dtype = DType::kBFloat16, .seed = 9});
  }
  all.push_back({.name = "SmallMamba1Big", .mode = "mamba1", .cache = MambaCacheMode::kAll, .requests = kSmall,
                 .big_mamba = true, .seed = 11});
  for (const auto& [cache, cache_name] : caches) {
    all.push_back({.name = std::string("Mamba1BigMixed") + cache_name, .mode = "mamba1", .cache = cache,
                   .requests = kMixed, .padding_tokens = 2, .padding_requests = 1, .big_mamba = true, .seed = 13});
  }
  // The scan's vector paths (N = 16: 16-byte float32 / 8-byte 16-bit state accesses) and its scalar
  // edge paths (odd sizes), decode-only steps, long single requests.
  all.push_back({.name = "SmallMamba1BigDecodesOnly", .mode = "mamba1", .cache = MambaCacheMode::kAll,
                 .requests = kManyDecodes, .big_mamba = true, .seed = 17});
  all.push_back({.name = "SmallMamba1BigBf16Pools", .mode = "mamba1", .cache = MambaCacheMode::kAll,
                 .requests = kSmall, .padding_tokens = 2, .padding_requests = 1, .big_mamba = true,
                 .pool_dtype = DType::kBFloat16, .seed = 19});
  all.push_back({.name = "SmallMamba1Odd", .mode = "mamba1", .cache = MambaCacheMode::kAll, .requests = kSmall,
                 .padding_tokens = 2, .padding_requests = 1, .odd_mamba = true, .seed = 23});
  all.push_back({.name = "Mamba1OddMixedAlign", .mode = "mamba1", .cache = MambaCacheMode::kAlign,
                 .dtype = DType::kFloat32, .requests = kMixed, .odd_mamba = true, .seed = 25});
  all.push_back({.name = "Mamba1BigDecodesOnlyGraph", .mode = "mamba1", .dtype = DType::kFloat16,
                 .requests = kManyDecodes, .padding_tokens = 1, .padding_requests = 1, .decode_graph = true,
                 .big_mamba = true, .seed = 27});
  all.push_back({.name = "Mamba1BigLongSingleAll", .mode = "mamba1", .cache = MambaCacheMode::kAll,
                 .dtype = DType::kFloat32, .requests = kLongSingle, .big_mamba = true, .seed = 29});
  all.push_back({.name = "Mamba1BigLongSingleNoneBf16", .mode = "mamba1", .requests = kLongSingle,
                 .big_mamba = true, .seed = 31});
  all.push_back({.name = "Mamba1BigLongFp16Pools", .mode = "mamba1", .cache = MambaCacheMode::kAll,
                 .dtype = DType::kFloat16, .requests = kLong, .big_mamba = true, .pool_dtype = DType::kFloat16,
                 .seed = 15});
  return all;
}

std::string report_text(const ComparisonReport& report) { return format_report_table({report}); }

class CudaSsmTest : public ::testing::TestWithParam<SsmCase> {
 protected:
  void SetUp() override {
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

// Parity (contribution, fused output, every pool, attention, metadata, padding, untouched slots)
// and bitwise reproducibility.
TEST_P(CudaSsmTest, MatchesReference) {
  const BatchFile step = make_ssm_step(GetParam());
  const BackendSettings settings{step.config, step.builder};
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  const ComparisonReport report = compare_step(step, actual, expected, {});
  EXPECT_TRUE(report.passed()) << report_text(report);
  for (const QuantityReport& q : report.quantities) {
    EXPECT_EQ(q.padding_written, 0) << q.name << ": padding rows written";
    EXPECT_EQ(q.untouched_written, 0) << q.name << ": a slot no request names was written";
  }
  // Every pool the reference leaves unchanged (slots of padding requests, spare slots) keeps its bytes.
  for (const auto& [name, before] : step.inputs.ssm_state) {
    const Tensor& after = actual.ssm_state.at(name);
    const Tensor& ref_after = expected.ssm_state.at(name);
    const int64_t slots = before.size(0);
    const int64_t slot_bytes = before.nbytes() / slots;
    for (int64_t s = 0; s < slots; ++s) {
      const auto* b = static_cast<const char*>(before.data()) + s * slot_bytes;
      const auto* r = static_cast<const char*>(ref_after.data()) + s * slot_bytes;
      const auto* a = static_cast<const char*>(after.data()) + s * slot_bytes;
      if (std::memcmp(b, r, static_cast<size_t>(slot_bytes)) == 0) {
        EXPECT_EQ(std::memcmp(b, a, static_cast<size_t>(slot_bytes)), 0)
            << "pool " << name << " slot " << s << " (untouched by the reference) was written";
      }
    }
  }
  // Bitwise reproducible from run to run (fixed orders, no atomics, cuBLAS on one stream + workspace).
  const StepOutputs again = run_step(*cuda, step);
  EXPECT_TRUE(bitwise_equal(actual.ssm_output, again.ssm_output)) << "ssm_output differs between two runs";
  EXPECT_TRUE(bitwise_equal(actual.output, again.output)) << "output differs between two runs";
  for (const auto& [name, pool] : actual.ssm_state) {
    EXPECT_TRUE(bitwise_equal(pool, again.ssm_state.at(name))) << "pool " << name << " differs between two runs";
  }
}

std::string case_name(const ::testing::TestParamInfo<SsmCase>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(Cases, CudaSsmTest, ::testing::ValuesIn(cases()), case_name);

// --- chunked prefill == one-shot prefill, on the GPU ---------------------------------------------

// Rows [begin, end) of a [T, Hq, D] tensor.
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out = Tensor::host(t.dtype(), {end - begin, t.size(1), t.size(2)});
  const int64_t row = t.nbytes() / t.size(0);
  std::memcpy(out.data(), static_cast<const char*>(t.data()) + begin * row, static_cast<size_t>((end - begin) * row));
  return out;
}

// One request of L tokens as one fresh prefill, and as a fresh chunk of `split` tokens followed by
// a continued chunk of the rest (same query rows, same slot, the second step starting from the
// pools the first left). The contributions and the final state agree within twice the float32
// row of the tolerance table (each run is within that row of the exact value).
void expect_chunked_equals_one_shot(const std::string& mode, int64_t length, int64_t split, MambaCacheMode cache) {
  SsmCase c{.name = "chunked", .mode = mode, .cache = cache, .dtype = DType::kFloat32, .big_mamba = mode == "mamba1"};
  const AttentionConfig config = make_config(c);
  SyntheticOptions options;
  options.seed = 21;
  options.ssm_block_table = true;
  BatchFile whole = make_synthetic_batch(config, {}, {{0, length}}, options);
  BatchFile first = make_synthetic_batch(config, {}, {{0, split}}, options);
  BatchFile second = make_synthetic_batch(config, {}, {{split, length - split}}, options);
  // Same hidden rows; the same SSM slot table (one row: the whole request's slots).
  first.inputs.query = rows_of(whole.inputs.query, 0, split);
  second.inputs.query = rows_of(whole.inputs.query, split, length);
  first.batch.ssm_block_table = whole.batch.ssm_block_table;
  second.batch.ssm_block_table = whole.batch.ssm_block_table;
  auto tensors = reference::ssm::make_random_ssm_tensors(config, ssm_slots_needed(whole.batch), 22);
  whole.inputs.ssm_state = tensors.ssm_state;
  whole.inputs.weights = tensors.weights;
  first.inputs.ssm_state = tensors.ssm_state;
  first.inputs.weights = tensors.weights;
  auto cuda = create_backend("cuda", {config, {}});
  const StepOutputs one_shot = run_step(*cuda, whole);
  const StepOutputs a = run_step(*cuda, first);
  second.inputs.ssm_state = a.ssm_state;
  second.inputs.weights = tensors.weights;
  const StepOutputs b = run_step(*cuda, second);

  const auto twice = [](Tolerance t) {
    return Tolerance{2 * t.atol, 2 * t.rtol, "2 × (" + t.rationale + "): two float32 runs, each within the row"};
  };
  const Tolerance out_tol = twice(parity_tolerance(parity_key(whole, Quantity::kSsmOutput, DType::kFloat32)));
  const int64_t width = config.num_heads * config.head_size;
  for (int64_t t = 0; t < length; ++t) {
    const Tensor& part = t < split ? a.ssm_output : b.ssm_output;
    const int64_t row = t < split ? t : t - split;
    for (int64_t e = 0; e < width; ++e) {
      const double x = load_as_double(part.data(), part.dtype(), row * width + e);
      const double y = load_as_double(one_shot.ssm_output.data(), one_shot.ssm_output.dtype(), t * width + e);
      ASSERT_TRUE(out_tol.allows(x, y)) << mode << ": token " << t << " element " << e << ": chunked " << x
                                        << " vs one-shot " << y << " (" << out_tol.rationale << ")";
    }
  }
  for (const auto& [name, pool] : one_shot.ssm_state) {
    const Tolerance tol = twice(parity_tolerance(parity_key(whole, Quantity::kSsmState, pool.dtype())));
    const Tensor& chunked = b.ssm_state.at(name);
    for (int64_t i = 0; i < pool.numel(); ++i) {
      const double x = load_as_double(chunked.data(), chunked.dtype(), i);
      const double y = load_as_double(pool.data(), pool.dtype(), i);
      ASSERT_TRUE(tol.allows(x, y)) << mode << ": pool " << name << " element " << i << ": chunked " << x
                                    << " vs one-shot " << y;
    }
  }
}

TEST(CudaSsm, ChunkedPrefillEqualsOneShot) {
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  for (const std::string mode : {"prefix_sum", "ema", "mamba1"}) {
    for (const MambaCacheMode cache : {MambaCacheMode::kNone, MambaCacheMode::kAll}) {
      SCOPED_TRACE(mode + " cache " + std::string(to_string(cache)));
      expect_chunked_equals_one_shot(mode, 400, 1, cache);
      expect_chunked_equals_one_shot(mode, 400, 37, cache);
      expect_chunked_equals_one_shot(mode, 400, 256, cache);
    }
  }
}

// A reference mode without a GPU implementation is refused by name, never run on the CPU.
TEST(CudaSsm, ModeWithoutGpuImplementationIsNotSupported) {
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  class CpuOnlyMode final : public reference::ssm::Mode {
   public:
    std::string name() const override { return "cpu_only_test_mode"; }
    std::string description() const override { return "test-only mode without a GPU implementation"; }
    std::vector<reference::ssm::TensorSpec> state_specs(const reference::ssm::ModeShape&) const override { return {}; }
    std::vector<reference::ssm::TensorSpec> weight_specs(const reference::ssm::ModeShape&) const override { return {}; }
    void advance(const reference::ssm::Weights&, reference::ssm::State&, const reference::ssm::Matrix& x,
                 reference::ssm::Matrix& y, bool) const override {
      y.setZero(x.rows(), x.cols());
    }
  };
  auto& registry = reference::ssm::ModeRegistry::instance();
  if (!registry.contains("cpu_only_test_mode")) registry.add(std::make_unique<CpuOnlyMode>());
  SsmCase c{.name = "cpu_only", .mode = "cpu_only_test_mode", .requests = kSmall};
  const BatchFile step = make_ssm_step(c);
  auto cuda = create_backend("cuda", {step.config, step.builder});
  try {
    run_step(*cuda, step);
    ADD_FAILURE() << "ssm_mode cpu_only_test_mode ran on the cuda backend";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_only_test_mode"), std::string::npos) << e.what();
  }
}

// The shipped SSM example batches, through the same step runner and comparison as `hybridtb parity`.
TEST(CudaSsmExamples, MatchReference) {
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  int ran = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "datasets" / "examples")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".h5" || name.rfind("hybrid_", 0) != 0) continue;
    SCOPED_TRACE(name);
    const BatchFile step = read_batch_file(entry.path().string());
    const BackendSettings settings{step.config, step.builder};
    auto cuda = create_backend("cuda", settings);
    auto reference = create_backend("reference", settings);
    const StepOutputs actual = run_step(*cuda, step);
    const StepOutputs expected = run_step(*reference, step);
    const ComparisonReport report = compare_step(step, actual, expected, {});
    EXPECT_TRUE(report.passed()) << report_text(report);
    ++ran;
  }
  EXPECT_EQ(ran, 5) << "expected the five hybrid_*.h5 examples";
}

}  // namespace
}  // namespace hybridtb::testing
