// The "cuda" backend against the reference on synthetic batches covering every feature (mixes of
// decodes, chunks and prefills; windows; GQA 1/4/5/8/12/40; soft cap; both ALiBi forms; sinks;
// fp8 and per-token-head caches; fp8 output; mm_prefix; encoder_only; float32/16, bfloat16; head
// sizes 64/128/256/80; long contexts on the split decode path) and on the shipped example batches:
// outputs within the tolerance table, KV cache bytes exact, padding rows untouched, metadata equal,
// outputs bitwise reproducible. Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda  (cases named Small* are the compute-sanitizer subset)
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cuda_cases.h"
#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

// Decodes first: the Mamba builder (part of build_metadata) requires vLLM's decode-first order.
const std::vector<RequestSpec> kMix = {{300, 1}, {17, 1}, {1000, 1}, {0, 1}, {40, 23}, {0, 70}, {129, 64}};
const std::vector<RequestSpec> kDecodes = {{1327, 1}, {36, 1}, {2010, 1}, {0, 1}, {511, 1}};
const std::vector<RequestSpec> kSmall = {{45, 1}, {3, 1}, {20, 9}, {0, 17}};
const std::vector<RequestSpec> kLong = {{20000, 1}, {9000, 1}, {4100, 1}, {700, 1}};
const std::vector<RequestSpec> kWindowed = {{1000, 1}, {700, 1}, {64, 1}, {300, 50}, {0, 130}};

std::vector<CudaCase> cases() {
  std::vector<CudaCase> all;
  auto add = [&](CudaCase c) { all.push_back(std::move(c)); };
  // Small ones: the compute-sanitizer subset (one of each kind).
  add({.name = "SmallMixBf16", .requests = kSmall});
  add({.name = "SmallMixFp32Generic80", .num_heads = 5, .num_kv_heads = 1, .head_size = 80, .dtype = DType::kFloat32,
       .requests = kSmall});
  add({.name = "SmallFp8E4m3Window", .requests = kSmall, .kv = KvCacheDtype::kFp8E4M3, .window = 8, .k_scale = 0.5f,
       .v_scale = 0.25f});
  add({.name = "SmallInt8PerTokenHeadSinks", .dtype = DType::kFloat16, .requests = kSmall,
       .kv = KvCacheDtype::kInt8PerTokenHead, .sinks = true});
  add({.name = "SmallEncoderOnly", .head_size = 64, .dtype = DType::kFloat16, .requests = {{0, 9}, {0, 33}},
       .window = 5, .encoder = true});
  add({.name = "SmallMmPrefix", .requests = {{30, 1, {{10, 30}}}, {0, 40, {{5, 20}}}, {30, 10, {{2, 35}}}},
       .window = 4});
  add({.name = "SmallLongSplit", .num_heads = 4, .num_kv_heads = 1, .head_size = 64, .requests = {{6000, 1}, {3, 1}}});
  add({.name = "SmallPadded", .dtype = DType::kFloat16, .requests = {{100, 1}, {7, 1}}, .padding_tokens = 3,
       .padding_requests = 2});
  // Dtypes, head sizes, GQA ratios.
  add({.name = "MixBf16", .requests = kMix});
  add({.name = "DecodesBf16", .requests = kDecodes});
  add({.name = "MixFp16Head64Gqa4", .num_heads = 16, .num_kv_heads = 4, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kMix});
  add({.name = "MixFp32Head128Mha", .num_heads = 4, .num_kv_heads = 4, .dtype = DType::kFloat32, .requests = kMix});
  add({.name = "MixBf16Head256Gqa8", .num_heads = 8, .num_kv_heads = 1, .head_size = 256, .block_size = 32,
       .requests = kMix});
  add({.name = "MixBf16Head80Gqa5", .num_heads = 10, .num_kv_heads = 2, .head_size = 80, .requests = kMix});
  add({.name = "MixFp16Gqa5Head128", .num_heads = 5, .num_kv_heads = 1, .dtype = DType::kFloat16, .requests = kMix});
  add({.name = "MixBf16Gqa12", .num_heads = 24, .num_kv_heads = 2, .head_size = 64, .requests = kMix});
  add({.name = "MixBf16Gqa40", .num_heads = 40, .num_kv_heads = 1, .head_size = 64, .requests = kSmall});
  add({.name = "MixBf16Block48", .block_size = 48, .requests = kMix});
  add({.name = "MixHead96", .num_heads = 4, .num_kv_heads = 2, .head_size = 96, .dtype = DType::kFloat16,
       .requests = kDecodes});
  // Masks and logit features.
  add({.name = "WindowBf16", .requests = kWindowed, .window = 64});
  add({.name = "Window1Fp16", .dtype = DType::kFloat16, .requests = kWindowed, .window = 1});
  add({.name = "SoftCapBf16", .requests = kMix, .soft_cap = 2.0});
  add({.name = "AlibiLinearSinks", .dtype = DType::kFloat16, .requests = kMix, .alibi = Alibi::kLinear, .sinks = true});
  add({.name = "AlibiSqrtWindow", .requests = kWindowed, .window = 100, .alibi = Alibi::kSqrt});
  add({.name = "SinksFp32", .num_heads = 8, .num_kv_heads = 8, .head_size = 64, .dtype = DType::kFloat32,
       .requests = kMix, .sinks = true});
  add({.name = "MmPrefixMix", .requests = {{50, 1, {{10, 50}}}, {2, 1}, {0, 90, {{5, 20}, {40, 70}}},
                                           {60, 30, {{2, 75}}}},
       .window = 8});
  add({.name = "EncoderOnlyBf16", .num_heads = 8, .num_kv_heads = 2, .requests = {{0, 1}, {0, 100}, {0, 37}}, .encoder = true});
  add({.name = "EncoderOnlyWindowFp32", .num_heads = 4, .num_kv_heads = 4, .head_size = 64, .dtype = DType::kFloat32,
       .requests = {{0, 70}, {0, 5}}, .window = 16, .encoder = true});
  // Quantised caches and fp8 output.
  add({.name = "Fp8E4m3Mix", .requests = kMix, .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f});
  add({.name = "Fp8E5m2DecodesFp16", .dtype = DType::kFloat16, .requests = kDecodes, .kv = KvCacheDtype::kFp8E5M2,
       .k_scale = 0.75f, .v_scale = 0.5f});
  add({.name = "Int8PerTokenHeadMix", .requests = kMix, .kv = KvCacheDtype::kInt8PerTokenHead});
  add({.name = "Fp8PerTokenHeadDecodes", .num_heads = 16, .num_kv_heads = 2, .head_size = 256, .block_size = 32,
       .requests = kDecodes, .kv = KvCacheDtype::kFp8PerTokenHead});
  add({.name = "Fp8OutputBf16", .requests = kMix, .output_scale = 0.5f});
  add({.name = "Fp8OutputFp16Fp8Kv", .dtype = DType::kFloat16, .requests = kDecodes, .kv = KvCacheDtype::kFp8E5M2,
       .output_scale = 0.25f, .k_scale = 0.5f, .v_scale = 0.5f});
  // Long contexts: the split decode path and its combine.
  add({.name = "LongSplitBf16", .requests = kLong});
  add({.name = "LongSplitWindowSinks", .num_heads = 16, .num_kv_heads = 4, .requests = kLong, .window = 4096,
       .sinks = true});
  add({.name = "LongSplitFp8Mha", .num_heads = 4, .num_kv_heads = 4, .head_size = 64, .requests = kLong,
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.5f});
  add({.name = "LongSplitGqa8Head256Fp16", .num_heads = 8, .num_kv_heads = 1, .head_size = 256,
       .dtype = DType::kFloat16, .requests = kLong, .alibi = Alibi::kLinear, .sinks = true});
  add({.name = "LongSplitInt8Fp8Output", .requests = kLong, .kv = KvCacheDtype::kInt8PerTokenHead,
       .output_scale = 0.5f});
  add({.name = "LongPrefillChunk", .num_heads = 4, .num_kv_heads = 1, .head_size = 64, .requests = {{3000, 300}}});
  return all;
}

class CudaBackendTest : public CudaParamFixture<CudaCase> {};

TEST_P(CudaBackendTest, MatchesReference) {
  const BatchFile step = make_step(GetParam());
  const BackendSettings settings{step.config, step.builder};
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  EXPECT_TRUE(cuda_matches_reference(step, actual, expected));
  // Bitwise reproducible from run to run (fixed reduction orders, no atomics).
  const StepOutputs again = run_step(*cuda, step);
  EXPECT_TRUE(bitwise_equal(actual.attn_output, again.attn_output)) << "attn_output differs between two runs";
  EXPECT_TRUE(bitwise_equal(actual.kv_cache, again.kv_cache)) << "kv_cache differs between two runs";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaBackendTest, ::testing::ValuesIn(cases()), CaseName());

// The shipped example batches, through the same step runner as `hybridtb run --backend cuda`.
TEST(CudaExamples, MatchReference) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  int ran = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() / "datasets" / "examples")) {
    if (entry.path().extension() != ".h5") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const BatchFile step = read_batch_file(entry.path().string());
    const BackendSettings settings{step.config, step.builder};
    auto cuda = create_backend("cuda", settings);
    auto reference = create_backend("reference", settings);
    StepOutputs actual;
    try {
      actual = run_step(*cuda, step);
    } catch (const NotSupported& e) {
      std::cout << "[ NOT SUPPORTED ] " << entry.path().filename().string() << ": " << e.what() << "\n";
      continue;
    }
    const StepOutputs expected = run_step(*reference, step);
    if (step.config.is_linear_layer()) {
      // A linear-attention layer (layer_kind gdn, mamba2): its output and pools, by the table.
      const ComparisonReport report = compare_step(step, actual, expected);
      EXPECT_TRUE(report.passed()) << format_report_table({report});
    } else {
      EXPECT_TRUE(cuda_matches_reference(step, actual, expected));
    }
    ++ran;
  }
  EXPECT_GT(ran, 0) << "no example batch ran";
}

// Unsupported configurations are refused with NotSupported, never run on a pretend path.
// A layer without an SSM branch (ssm_mode "none"): calling the branch is a caller error on both
// backends (Error, not NotSupported: nothing is missing from the cuda backend here).
TEST(CudaBackend, SsmForwardWithoutAnSsmBranchIsAnErrorLikeTheReference) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  const BatchFile step = make_step({.name = "ssm", .requests = kSmall});
  ASSERT_FALSE(step.config.has_ssm_branch());
  for (const std::string name : {"reference", "cuda"}) {
    auto backend = create_backend(name, {step.config, step.builder});
    try {
      backend->ssm_forward({}, step.batch, {}, {});
      ADD_FAILURE() << name << ": ssm_forward without an SSM branch did not throw";
    } catch (const NotSupported& e) {
      ADD_FAILURE() << name << ": expected a plain Error, got NotSupported: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ssm"), std::string::npos) << name << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace hybridtb::testing
