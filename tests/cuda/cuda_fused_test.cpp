// The fused hybrid add of the "cuda" backend (BackendSettings::fuse_hybrid_add: the attention
// kernels' epilogues store output = attention + SSM contribution, attention/attention_common.cuh
// store_output_vec) against the separate add pass (fuse_hybrid_add false) and the reference, on
// every epilogue: the tensor-core decode kernel (unsplit rows and split rows finished by the
// combine kernel), the SIMT decode kernel (float32 models with fp8 caches, unsplit and split), the tensor-core
// prefill kernel, the generic kernel (float32; head size 80), fp8 output, CUDA-graph padding rows,
// and a layer without an SSM branch (the kernels store the attention output twice). Per case:
//   - the planner sends rows to every epilogue the case is meant for (AttentionRunner::summary);
//   - fused == unfused BIT FOR BIT: output, attn_output, ssm_output, KV cache, every state pool;
//   - output == dtype(float(attn_output) + float(ssm_output)) bit for bit, recomputed on the host
//     (the separate pass's rounding rule); without an SSM branch output == attn_output;
//   - padding rows (≥ num_actual_tokens) of every output still hold the NaN poison;
//   - the fused step matches the reference: compare_step (the tolerance table, with the fused
//     output's attention + SSM row; untouched state slots), and cuda_matches_reference without an
//     SSM branch (it knowingly holds `output` to the attention row alone).
// Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda   (cases named Small* are the compute-sanitizer subset)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_plan.h"
#include "common/device_memory.h"
#include "cuda_cases.h"
#include "cuda_compare.h"
#include "cuda_plan.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

using cuda::AttentionPlanSummary;

// The epilogues a case must reach (each: at least one row there, asked from the planner).
struct Epilogues {
  bool decode_mma = false;   // tensor-core decode kernel
  bool decode_simt = false;  // SIMT decode kernel
  bool unsplit = false;      // decode rows the decode kernel finishes itself
  bool split = false;        // split decode rows, finished by the combine kernel
  bool prefill = false;      // tensor-core prefill kernel
  bool generic = false;      // generic SIMT kernel
  // The prefill rows pinned to the Hopper wgmma kernel (prefill_variant 3, its own epilogue); the
  // case skips unless the build has sm_90a code and the device is compute capability 9.0.
  bool prefill_wgmma = false;
};

using FusedCase = CheckedCase<Epilogues>;

// Decodes first (vLLM's order, required by the Mamba builder). A context of 6000 or more is split
// across CTAs by the planner (splits of 256–8192 keys on the SIMT kernel, 1024–4096 on the
// tensor-core kernel); contexts below 256 never are. {0, 1}: a decode with one key.
const std::vector<RequestSpec> kLong = {{20000, 1}, {9000, 1}, {4100, 1}, {700, 1}};
const std::vector<RequestSpec> kMix = {{300, 1}, {17, 1}, {1000, 1}, {0, 1}, {40, 23}, {0, 70}, {129, 64}};
const std::vector<RequestSpec> kSmall = {{45, 1}, {3, 1}, {20, 9}, {0, 17}};

std::vector<FusedCase> cases() {
  std::vector<FusedCase> all;
  // Every case gives the SSM branch its own slot table.
  auto add = [&](CudaCase c, Epilogues expect) {
    c.ssm_block_table = true;
    all.push_back({std::move(c), expect});
  };
  // The compute-sanitizer subset: every epilogue once.
  add({.name = "SmallDecodeMmaSplitBf16", .ssm_mode = "prefix_sum", .cache = MambaCacheMode::kAll,
       .requests = {{100, 1}, {7, 1}, {6000, 1}, {0, 1}}}, {.decode_mma = true, .unsplit = true, .split = true});
  add({.name = "SmallDecodeSimtFp8Mamba1", .ssm_mode = "mamba1", .dtype = DType::kFloat32,
       .requests = {{45, 1}, {6000, 1}, {3, 1}},
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f, .seed = 3},
      {.decode_simt = true, .unsplit = true, .split = true});
  add({.name = "SmallPrefillBf16", .ssm_mode = "prefix_sum", .requests = {{20, 1}, {5, 19}, {0, 70}, {129, 64}},
       .seed = 5}, {.decode_mma = true, .unsplit = true, .prefill = true});
  add({.name = "SmallGenericFp32Mamba1", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAll, .num_heads = 4,
       .num_kv_heads = 4, .dtype = DType::kFloat32, .requests = kSmall, .seed = 7}, {.generic = true});
  add({.name = "SmallGenericHead80", .ssm_mode = "prefix_sum", .num_heads = 10, .num_kv_heads = 2, .head_size = 80,
       .requests = kSmall, .seed = 9}, {.generic = true});
  add({.name = "SmallFp8OutputBf16", .ssm_mode = "prefix_sum", .requests = {{6000, 1}, {17, 1}, {40, 23}},
       .output_scale = 0.5f, .seed = 11}, {.decode_mma = true, .unsplit = true, .split = true, .prefill = true});
  add({.name = "SmallPaddedMixFp16Mamba1", .ssm_mode = "mamba1", .dtype = DType::kFloat16,
       .requests = {{100, 1}, {7, 1}, {5, 30}}, .padding_tokens = 3, .padding_requests = 2, .seed = 13},
      {.decode_mma = true, .unsplit = true, .prefill = true});
  add({.name = "SmallDecodeGraphPaddedFp16", .ssm_mode = "prefix_sum", .dtype = DType::kFloat16,
       .requests = {{20, 1}, {3, 1}, {6000, 1}, {31, 1}}, .padding_tokens = 4, .padding_requests = 4,
       .decode_graph = true, .seed = 15}, {.decode_mma = true, .unsplit = true, .split = true});
  add({.name = "SmallNoSsmBf16", .ssm_mode = "none", .requests = {{100, 1}, {6000, 1}, {5, 30}}, .padding_tokens = 2,
       .padding_requests = 1, .seed = 17}, {.decode_mma = true, .unsplit = true, .split = true, .prefill = true});
  // The wgmma prefill's epilogue (Hopper): the fused add with and without an SSM branch, fp8
  // output with sinks, padding rows, chunks after context.
  add({.name = "SmallPrefillWgmmaBf16", .ssm_mode = "prefix_sum", .requests = {{20, 1}, {0, 150}, {129, 64}},
       .padding_tokens = 3, .seed = 41}, {.decode_mma = true, .prefill = true, .prefill_wgmma = true});
  add({.name = "PrefillWgmmaFp8OutputSinksFp16", .ssm_mode = "mamba1", .num_heads = 16, .num_kv_heads = 2,
       .dtype = DType::kFloat16, .requests = {{0, 300}, {200, 77}}, .sinks = true, .output_scale = 0.5f, .seed = 43},
      {.prefill = true, .prefill_wgmma = true});
  add({.name = "PrefillWgmmaNoSsmBf16", .ssm_mode = "none", .requests = {{0, 200}, {64, 33}}, .padding_tokens = 2,
       .seed = 45}, {.prefill = true, .prefill_wgmma = true});
  // Long contexts (many splits), other head sizes, GQA 16 (16 head columns), fp8 output elsewhere.
  add({.name = "LongSplitMamba1Bf16", .ssm_mode = "mamba1", .requests = kLong, .seed = 19},
      {.decode_mma = true, .split = true});
  add({.name = "LongSplitSimtFp8E5m2Fp32", .ssm_mode = "prefix_sum", .dtype = DType::kFloat32, .requests = kLong,
       .kv = KvCacheDtype::kFp8E5M2, .k_scale = 0.5f, .v_scale = 0.25f, .seed = 21},
      {.decode_simt = true, .split = true});
  add({.name = "MixHead64Gqa4Fp16Mamba1", .ssm_mode = "mamba1", .num_heads = 16, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kMix, .seed = 23}, {.decode_mma = true, .unsplit = true, .prefill = true});
  add({.name = "MixHead256Bf16", .ssm_mode = "prefix_sum", .num_heads = 8, .num_kv_heads = 1, .head_size = 256,
       .block_size = 32, .requests = kMix, .seed = 25}, {.decode_mma = true, .unsplit = true, .prefill = true});
  add({.name = "DecodeGqa16Head128Bf16", .ssm_mode = "prefix_sum", .num_heads = 32, .num_kv_heads = 2,
       .requests = {{1327, 1}, {36, 1}, {20000, 1}, {0, 1}}, .seed = 27},
      {.decode_mma = true, .unsplit = true, .split = true});
  add({.name = "MixFp32Fp8OutputMamba1", .ssm_mode = "mamba1", .num_heads = 4, .num_kv_heads = 2,
       .dtype = DType::kFloat32, .requests = kMix, .output_scale = 0.25f, .seed = 29}, {.generic = true});
  add({.name = "Fp8OutputFp8CacheFp16", .ssm_mode = "prefix_sum", .dtype = DType::kFloat16,
       .requests = {{20000, 1}, {100, 1}, {40, 23}}, .kv = KvCacheDtype::kFp8E4M3, .output_scale = 0.25f,
       .k_scale = 0.5f, .v_scale = 0.25f, .seed = 31},
      {.decode_mma = true, .unsplit = true, .split = true, .prefill = true});
  add({.name = "Int8PerTokenHeadMixBf16", .ssm_mode = "prefix_sum", .requests = kMix,
       .kv = KvCacheDtype::kInt8PerTokenHead, .k_scale = 0.5f, .v_scale = 0.25f, .seed = 33},
      {.decode_mma = true, .unsplit = true, .prefill = true});
  return all;
}

// Every epilogue `expect` names got rows.
::testing::AssertionResult reaches(const AttentionPlanSummary& plan, const Epilogues& expect) {
  const int64_t simt = plan.decode_rows - plan.decode_mma_rows;
  const int64_t unsplit = plan.decode_rows - plan.split_rows;
  for (const auto& [wanted, rows, what] :
       {std::tuple{expect.decode_mma, plan.decode_mma_rows, "tensor-core decode"},
        std::tuple{expect.decode_simt, simt, "SIMT decode"},
        std::tuple{expect.unsplit, unsplit, "unsplit decode"},
        std::tuple{expect.split, plan.split_rows, "split decode (combine)"},
        std::tuple{expect.prefill, plan.prefill_rows, "tensor-core prefill"},
        std::tuple{expect.generic, plan.generic_rows, "generic"}}) {
    if (wanted && rows <= 0) {
      return ::testing::AssertionFailure() << "no rows on the " << what << " epilogue: " << plan.describe();
    }
  }
  if (expect.prefill_wgmma && plan.prefill_variant != cuda::kPrefillWgmma) {
    return ::testing::AssertionFailure() << "the prefill rows are not on the wgmma kernel: " << plan.describe();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bits(const StepOutputs& fused, const StepOutputs& unfused) {
  const std::vector<std::tuple<const char*, const Tensor*, const Tensor*>> pairs = {
      {"output", &fused.output, &unfused.output},
      {"attn_output", &fused.attn_output, &unfused.attn_output},
      {"ssm_output", &fused.ssm_output, &unfused.ssm_output},
      {"kv_cache", &fused.kv_cache, &unfused.kv_cache},
      {"k_scale_cache", &fused.k_scale_cache, &unfused.k_scale_cache},
      {"v_scale_cache", &fused.v_scale_cache, &unfused.v_scale_cache}};
  for (const auto& [name, a, b] : pairs) {
    if (!bitwise_equal(*a, *b)) {
      int64_t first = -1;
      if (!a->empty() && !b->empty() && a->nbytes() == b->nbytes()) {
        const int64_t size = element_size(a->dtype());
        for (int64_t i = 0; i < a->numel() && first < 0; ++i) {
          if (std::memcmp(static_cast<const char*>(a->data()) + i * size,
                          static_cast<const char*>(b->data()) + i * size, static_cast<size_t>(size)) != 0) {
            first = i;
          }
        }
      }
      return ::testing::AssertionFailure() << name << ": fused differs from the separate add pass (first element "
                                           << first << ")";
    }
  }
  if (fused.ssm_state.size() != unfused.ssm_state.size()) {
    return ::testing::AssertionFailure() << "different state pools";
  }
  for (const auto& [name, pool] : unfused.ssm_state) {
    if (!bitwise_equal(pool, fused.ssm_state.at(name))) {
      return ::testing::AssertionFailure() << "state pool " << name << ": fused differs from the separate add pass";
    }
  }
  return ::testing::AssertionSuccess();
}

// Rows [0, num_actual_tokens) of `out.output` hold dtype(float(attn) + float(ssm)) — the separate
// pass's rule (float32 sum of the stored values, one rounding to the dtype), recomputed on the host
// — or, without an SSM branch, attn_output's bits.
::testing::AssertionResult output_is_rounded_sum(const StepOutputs& out, const BatchFile& step) {
  const Tensor& o = out.output;
  const int64_t size = element_size(o.dtype());
  const int64_t n = step.batch.num_actual_tokens * step.config.num_heads * step.config.head_size;
  Tensor expected = Tensor::host(o.dtype(), o.shape());
  for (int64_t i = 0; i < n; ++i) {
    double value = load_as_double(out.attn_output.data(), out.attn_output.dtype(), i);
    if (!out.ssm_output.empty()) {
      const auto a = static_cast<float>(value);
      const auto s = static_cast<float>(load_as_double(out.ssm_output.data(), out.ssm_output.dtype(), i));
      const float sum = a + s;  // exact float32 operands: one IEEE float32 addition (RNE)
      value = sum;               // exact in double: the store below rounds once, as float → dtype
    }
    store_from_double(expected.data(), expected.dtype(), i, value);
  }
  for (int64_t i = 0; i < n; ++i) {
    const double e = load_as_double(expected.data(), expected.dtype(), i);
    const double a = load_as_double(o.data(), o.dtype(), i);
    if (std::isnan(e) && std::isnan(a)) continue;
    if (std::memcmp(static_cast<const char*>(expected.data()) + i * size, static_cast<const char*>(o.data()) + i * size,
                    static_cast<size_t>(size)) != 0) {
      return ::testing::AssertionFailure() << "output element " << i << " (token " << i / (o.size(1) * o.size(2))
                                           << ") is " << a << ", the rounded sum of attn_output and ssm_output is "
                                           << e;
    }
  }
  return ::testing::AssertionSuccess();
}

std::string report_text(const ComparisonReport& report) { return format_report_table({report}); }

class CudaFusedTest : public CudaParamFixture<FusedCase> {};

TEST_P(CudaFusedTest, FusedEqualsSeparatePassAndReference) {
  const CudaCase& c = GetParam().batch;
  const BatchFile step = make_step(c);
  ASSERT_EQ(step.config.has_ssm_branch(), c.ssm_mode != "none");
  if (c.padding_tokens > 0) {
    ASSERT_LT(step.batch.num_actual_tokens, step.batch.num_tokens());
  }
  cuda::AttentionPathOverrides overrides;
  if (GetParam().expect.prefill_wgmma) {
    if (const std::string why = wgmma_prefill_unavailable(); !why.empty()) GTEST_SKIP() << why;
    overrides.prefill_variant = cuda::kPrefillWgmma;
  }
  const AttentionPlanSummary plan = plan_of(step, overrides);
  std::cout << "[ PLAN ] " << c.name << ": " << plan.describe() << "\n";
  EXPECT_TRUE(reaches(plan, GetParam().expect));

  BackendSettings fused_settings{step.config, step.builder, true};
  BackendSettings unfused_settings{step.config, step.builder, false};
  fused_settings.prefill_variant = unfused_settings.prefill_variant = overrides.prefill_variant;
  auto fused_backend = create_backend("cuda", fused_settings);
  auto unfused_backend = create_backend("cuda", unfused_settings);
  auto reference = create_backend("reference", {step.config, step.builder});
  const StepOutputs fused = run_step(*fused_backend, step);
  const StepOutputs unfused = run_step(*unfused_backend, step);
  const StepOutputs expected = run_step(*reference, step);

  EXPECT_TRUE(same_bits(fused, unfused));
  EXPECT_TRUE(output_is_rounded_sum(fused, step));
  EXPECT_TRUE(outputs_padding_untouched(fused, step));
  // cuda_matches_reference holds `output` to the attention row of the tolerance table, which is
  // the output's row only without an SSM branch; with one, the table's row is attention + SSM
  // (fused_parity_tolerance), which compare_step applies (with every check of
  // cuda_matches_reference: attn_output, KV cache bytes, padding, metadata).
  if (!step.config.has_ssm_branch()) {
    EXPECT_TRUE(cuda_matches_reference(step, fused, expected));
  }
  const ComparisonReport report = compare_step(step, fused, expected, {});
  EXPECT_TRUE(report.passed()) << report_text(report);
  for (const QuantityReport& q : report.quantities) {
    EXPECT_EQ(q.padding_written, 0) << q.name << ": padding rows written";
    EXPECT_EQ(q.untouched_written, 0) << q.name << ": a slot no request names was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaFusedTest, ::testing::ValuesIn(cases()), CaseName());

}  // namespace
}  // namespace hybridtb::testing
