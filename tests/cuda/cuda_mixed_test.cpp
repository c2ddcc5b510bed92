// The mixed kernel (optimized/src/attention/mixed_kernel.cuh: a step's tensor-core prefill items
// and tensor-core decode CTAs in one grid) against separate launches of the prefill and decode
// kernels (BackendSettings::mixed_grid false) and the reference, on steps with decode and prefill
// rows: bfloat16/float16 × head sizes 64/128, GQA up to 8, plain and featured logits (soft cap,
// both ALiBi forms), sinks, windows, fp8 output, split decode rows (the combine after the mixed
// grid), a chunk with context, padding, an mm_prefix decode row on the SIMT decode kernel beside
// the mixed grid, and the fused SSM add; and the layers the mixed kernel does not take (head size
// 256, a 1-byte cache, 16 query heads per kv head: 16 decode columns), which must launch separately
// and say why.
// Per case:
//   - the planner runs the case mixed or not, as the case expects (AttentionRunner::summary);
//   - mixed == separate BIT FOR BIT: output, attn_output, ssm_output, KV cache, every state pool;
//   - the mixed step is bitwise equal run to run and matches the reference (cuda_matches_reference;
//     with an SSM branch compare_step, as tests/cuda/cuda_fused_test does).
// CudaMixedCases checks the cases' paths with the host planner, with or without a GPU; the GPU
// tests skip with the reason on a machine without a CUDA device. Cases named Small* are the
// compute-sanitizer subset.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "attention/attention_caps.h"
#include "attention/attention_plan.h"
#include "attention/attention_work_plan.h"
#include "cuda_cases.h"
#include "cuda_compare.h"
#include "cuda_plan.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

using cuda::AttentionPlanSummary;

struct MixedExpect {
  bool mixed = true;         // one mixed grid; false: separate launches with fallback in the reason
  const char* fallback = "";
  bool split = false;        // some decode row is split (the combine runs after the mixed grid)
  bool simt = false;         // some decode row takes the SIMT decode kernel
};
using MixedCase = CheckedCase<MixedExpect>;

// Decodes first (vLLM's order), then prefill rows: fresh, with context, one token past a block edge.
const std::vector<RequestSpec> kMix = {{300, 1}, {17, 1}, {1000, 1}, {0, 1}, {40, 23}, {0, 70}, {129, 64}};
const std::vector<RequestSpec> kMixLong = {{20000, 1}, {9000, 1}, {300, 1}, {0, 1}, {40, 23}, {129, 64}, {0, 200}};
const std::vector<RequestSpec> kChunk = {{4095, 1}, {4095, 1}, {700, 1}, {33, 1}, {3000, 300}};

std::vector<MixedCase> cases() {
  std::vector<MixedCase> all;
  auto add = [&](CudaCase c, MixedExpect expect = {}) { all.push_back({std::move(c), expect}); };
  // The compute-sanitizer subset: both head sizes, featured logits, split rows with the combine.
  add({.name = "SmallMixBf16", .requests = kMix, .seed = 31});
  add({.name = "SmallMixFp16Head64Gqa4", .num_heads = 16, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kMix, .seed = 32});
  add({.name = "SmallMixSplitSoftCapBf16", .requests = kMixLong, .soft_cap = 5.0, .seed = 33}, {.split = true});
  // GQA ratios up to 8 (8 heads per decode CTA), both dtypes, both head sizes.
  for (const int64_t d : {64, 128}) {
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const int64_t qpk : {1, 3, 8}) {
        add({.name = "Head" + std::to_string(d) + (dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Gqa" +
                     std::to_string(qpk),
             .num_heads = 2 * qpk, .num_kv_heads = 2, .head_size = d, .dtype = dtype, .requests = kMix,
             .seed = static_cast<uint64_t>(d + qpk)});
      }
    }
  }
  // Chunks with context, split rows, logit features and the epilogue.
  add({.name = "ChunkAtContextBf16Gqa4", .num_heads = 32, .num_kv_heads = 8, .requests = kChunk, .seed = 41});
  add({.name = "LongSplitFp16Head64", .num_heads = 8, .num_kv_heads = 2, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kMixLong, .seed = 42}, {.split = true});
  add({.name = "AlibiLinearSinksFp16", .dtype = DType::kFloat16, .requests = kMixLong, .alibi = Alibi::kLinear,
       .sinks = true, .seed = 43}, {.split = true});
  add({.name = "AlibiSqrtWindowBf16", .requests = kMix, .window = 100, .alibi = Alibi::kSqrt, .seed = 44});
  add({.name = "SinksWindowHead64Bf16", .num_heads = 16, .num_kv_heads = 4, .head_size = 64, .requests = kMixLong,
       .window = 4096, .sinks = true, .seed = 45});
  add({.name = "Fp8OutputSplitBf16", .requests = kMixLong, .output_scale = 0.5f, .seed = 46}, {.split = true});
  add({.name = "PaddedFp16", .dtype = DType::kFloat16, .requests = {{100, 1}, {7, 1}, {5, 30}}, .padding_tokens = 3,
       .padding_requests = 2, .seed = 47});
  add({.name = "MmPrefixSimtBesideMixedBf16", .requests = {{50, 1, {{10, 50}}}, {2, 1}, {300, 1}, {0, 30, {{5, 20}}}},
       .window = 8, .seed = 48}, {.simt = true});
  add({.name = "SmallFusedSsmAddBf16", .ssm_mode = "prefix_sum", .cache = MambaCacheMode::kAll,
       .requests = {{100, 1}, {7, 1}, {6000, 1}, {40, 23}, {0, 70}}, .ssm_block_table = true, .seed = 49},
      {.split = true});
  // Layers the mixed kernel does not take: separate launches, the reason named.
  add({.name = "SeparateHead256Bf16", .num_heads = 8, .num_kv_heads = 2, .head_size = 256, .block_size = 32,
       .requests = kMix, .seed = 51}, {.mixed = false, .fallback = "head size 256"});
  add({.name = "SeparateFp8CacheBf16", .requests = kMix, .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f,
       .v_scale = 0.25f, .seed = 52}, {.mixed = false, .fallback = "kv_cache_dtype fp8_e4m3"});
  add({.name = "SeparateGqa16Bf16", .num_heads = 32, .num_kv_heads = 2, .requests = kMix, .seed = 53},
      {.mixed = false, .fallback = "16 columns per decode CTA"});
  return all;
}

// Every output tensor and state pool of the two runs holds the same bits.
::testing::AssertionResult same_bits(const StepOutputs& mixed, const StepOutputs& separate) {
  const std::pair<const char*, const Tensor StepOutputs::*> tensors[] = {
      {"output", &StepOutputs::output},           {"attn_output", &StepOutputs::attn_output},
      {"ssm_output", &StepOutputs::ssm_output},   {"kv_cache", &StepOutputs::kv_cache},
      {"k_scale_cache", &StepOutputs::k_scale_cache}, {"v_scale_cache", &StepOutputs::v_scale_cache}};
  for (const auto& [name, member] : tensors) {
    const Tensor& a = mixed.*member;
    const Tensor& b = separate.*member;
    if (a.empty() != b.empty()) return ::testing::AssertionFailure() << name << ": present in one run only";
    if (!a.empty() && !bitwise_equal(a, b)) {
      return ::testing::AssertionFailure() << name << ": the mixed grid differs from separate launches";
    }
  }
  if (mixed.ssm_state.size() != separate.ssm_state.size()) return ::testing::AssertionFailure() << "state pools";
  for (const auto& [name, pool] : separate.ssm_state) {
    if (!bitwise_equal(pool, mixed.ssm_state.at(name))) {
      return ::testing::AssertionFailure() << "state pool " << name << ": the mixed grid differs from separate launches";
    }
  }
  return ::testing::AssertionSuccess();
}

// The same expectations of the host planner (attention_work_plan.h) with an H100's SM count: the
// cases are what they claim on a machine without a GPU too.
TEST(CudaMixedCases, HostPlanTakesThePathEachCaseExpects) {
  for (const MixedCase& mc : cases()) {
    SCOPED_TRACE(mc.batch.name);
    const BatchFile step = make_step(mc.batch);
    cuda::AttentionPlanInput in;
    in.config = &step.config;
    in.batch = &step.batch;
    in.num_sms = 132;
    in.routes = cuda::route_layer(step.config, {}, cuda::TensorLayoutFacts{});
    const cuda::AttentionPlan plan = cuda::plan_attention(in);
    const AttentionPlanSummary& s = plan.summary;
    EXPECT_GT(s.decode_rows, 0) << s.describe();
    EXPECT_GT(s.prefill_rows, 0) << s.describe();
    EXPECT_EQ(s.mixed(), mc.expect.mixed) << s.describe();
    EXPECT_NE(s.mixed_fallback.find(mc.expect.fallback), std::string::npos) << s.describe();
    if (mc.expect.split) {
      EXPECT_GT(s.split_rows, 0) << s.describe();
    }
    EXPECT_EQ(mc.expect.simt, s.decode_mma_rows < s.decode_rows) << s.describe();
  }
}

class CudaMixedTest : public CudaParamFixture<MixedCase> {};

TEST_P(CudaMixedTest, OneGridEqualsSeparateLaunchesAndReference) {
  const CudaCase& c = GetParam().batch;
  const MixedExpect& expect = GetParam().expect;
  const BatchFile step = make_step(c);
  const AttentionPlanSummary plan = plan_of(step);
  std::cout << "[ PLAN ] " << c.name << ": " << plan.describe() << "\n";
  ASSERT_GT(plan.decode_rows, 0) << plan.describe();
  ASSERT_GT(plan.prefill_rows, 0) << plan.describe();
  if (expect.mixed) {
    EXPECT_GT(plan.mixed_prefill_ctas, 0) << plan.describe();
    EXPECT_GT(plan.mixed_decode_ctas, 0) << plan.describe();
    EXPECT_EQ(plan.mixed_prefill_ctas, plan.prefill_items) << plan.describe();
  } else {
    EXPECT_FALSE(plan.mixed()) << plan.describe();
    EXPECT_NE(plan.mixed_fallback.find(expect.fallback), std::string::npos) << plan.describe();
  }
  if (expect.split) {
    EXPECT_GT(plan.split_rows, 0) << plan.describe();
  }
  if (expect.simt) {
    EXPECT_LT(plan.decode_mma_rows, plan.decode_rows) << plan.describe();
  }

  // Both on the head size's mma.sync variant: the mixed grid runs that body, and on a Hopper GPU
  // separate launches would otherwise take the wgmma variant (another summation order).
  BackendSettings one_grid{step.config, step.builder};
  one_grid.prefill_variant = cuda::prefill_default_variant(step.config.head_size);
  BackendSettings separate_launches = one_grid;
  separate_launches.mixed_grid = false;
  auto mixed_backend = create_backend("cuda", one_grid);
  auto separate_backend = create_backend("cuda", separate_launches);
  auto reference = create_backend("reference", {step.config, step.builder});
  const StepOutputs mixed = run_step(*mixed_backend, step);
  const StepOutputs separate = run_step(*separate_backend, step);
  const StepOutputs expected = run_step(*reference, step);

  EXPECT_TRUE(same_bits(mixed, separate));
  const StepOutputs again = run_step(*mixed_backend, step);
  EXPECT_TRUE(bitwise_equal(mixed.attn_output, again.attn_output)) << "attn_output differs between two runs";
  EXPECT_TRUE(outputs_padding_untouched(mixed, step));
  // With an SSM branch the output's tolerance row is attention + SSM, which compare_step applies
  // (cuda_matches_reference holds `output` to the attention row; see cuda_fused_test).
  if (step.config.has_ssm_branch()) {
    const ComparisonReport report = compare_step(step, mixed, expected, {});
    EXPECT_TRUE(report.passed()) << format_report_table({report});
  } else {
    EXPECT_TRUE(cuda_matches_reference(step, mixed, expected));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaMixedTest, ::testing::ValuesIn(cases()), CaseName());

}  // namespace
}  // namespace hybridtb::testing
