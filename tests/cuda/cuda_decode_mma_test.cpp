// The tensor-core decode path (optimized/src/attention/decode_mma_kernel.cuh) against the
// reference: head sizes 64/128/256 × float16/bfloat16 × GQA ratios 1/2/4/6/8 (and 12, 16, 40: 16
// head columns, several passes), windows (blocks that slid out point at the NaN null block), slots
// past seq_len poisoned with NaN, split and unsplit rows, soft cap, both ALiBi forms, sinks, fp8
// output, decode rows mixed with prefill rows, padding; outputs within the tolerance table (its
// e_P = u(model)·max|v| term covers P rounded to the model dtype), bitwise equal run to run. Each
// case asks the planner (AttentionRunner::summary) which decode path its rows take, so a case meant
// for the tensor-core kernel cannot silently run on the SIMT one; 1-byte caches (fp8 e4m3/e5m2 per
// tensor, int8/fp8 per token-head) take the tensor-core kernel, dequantised per tile; mm_prefix rows
// and a float32 model with a 1-byte cache must fall back to the SIMT decode kernel with the reason
// named. Skips with the reason on a
// machine without a CUDA device. Cases named Small* are the compute-sanitizer subset.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <ostream>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_plan.h"
#include "common/device_memory.h"
#include "cuda_compare.h"
#include "cuda_plan.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

using cuda::AttentionPlanSummary;

enum class Alibi { kNone, kLinear, kSqrt };
enum class Path { kMma, kSimt };  // where the case's decode rows must run

struct Case {
  std::string name;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 2;
  int64_t head_size = 128;
  int64_t block_size = 16;
  DType dtype = DType::kBFloat16;
  std::vector<RequestSpec> requests;
  KvCacheDtype kv = KvCacheDtype::kAuto;
  int64_t window = 0;
  double soft_cap = 0.0;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;
  std::optional<float> output_scale;
  int64_t padding_tokens = 0;
  int64_t padding_requests = 0;
  Path path = Path::kMma;
  bool expect_split = false;    // some decode row must be split across CTAs
  bool expect_unsplit = false;  // no decode row may be split
  uint64_t seed = 7;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

// Decodes first (vLLM's order, required by the Mamba builder). {0, 1}: a row with one key.
const std::vector<RequestSpec> kDecodes = {{1327, 1}, {36, 1}, {2010, 1}, {0, 1}, {511, 1}, {15, 1}, {16, 1}};
const std::vector<RequestSpec> kShort = {{100, 1}, {7, 1}, {200, 1}, {31, 1}};  // < 256 keys: never split
const std::vector<RequestSpec> kLong = {{20000, 1}, {9000, 1}, {4100, 1}, {700, 1}};
const std::vector<RequestSpec> kMix = {{300, 1}, {17, 1}, {1000, 1}, {0, 1}, {40, 23}, {0, 70}, {129, 64}};
const std::vector<RequestSpec> kWindowed = {{1000, 1}, {700, 1}, {64, 1}, {5000, 1}, {300, 50}};

AttentionConfig make_config(const Case& c) {
  AttentionConfig config;
  config.num_heads = c.num_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_size = c.head_size;
  config.block_size = c.block_size;
  config.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
  config.dtype = c.dtype;
  config.kv_cache_dtype = c.kv;
  config.sliding_window = c.window;
  config.logits_soft_cap = c.soft_cap;
  if (c.alibi != Alibi::kNone) {
    std::vector<float> slopes;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      slopes.push_back(std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / static_cast<float>(c.num_heads)));
    }
    config.alibi_slopes = slopes;
    config.use_alibi_sqrt = c.alibi == Alibi::kSqrt;
  }
  if (c.sinks) {
    std::vector<float> sinks;
    for (int64_t h = 0; h < c.num_heads; ++h) sinks.push_back(-1.0f + 0.75f * static_cast<float>(h % 7));
    config.sinks = sinks;
  }
  return config;
}

// The slots of each request's last block at/after seq_len hold NaN (as if freed and reused):
// they must never be read. (Blocks that slid out of the window already point at the NaN null
// block.) Float caches only.
void poison_past_seq_len(BatchFile& step) {
  Tensor& cache = step.inputs.kv_cache;  // [NB, 2, BS, Hkv, D]
  const DType dtype = cache.dtype();
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16 && dtype != DType::kFloat32) return;
  const int64_t bs = cache.size(2);
  const int64_t row = cache.size(3) * cache.size(4);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const int64_t seq = step.batch.seq_len(r);
    if (seq == 0) continue;
    const int64_t end = (seq + bs - 1) / bs * bs;
    for (int64_t k = seq; k < end; ++k) {
      const int64_t block = step.batch.block_table.at(r, k / bs);
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t base = ((block * 2 + half) * bs + k % bs) * row;
        for (int64_t i = 0; i < row; ++i) store_from_double(cache.data(), dtype, base + i, nan);
      }
    }
  }
}

BatchFile make_step(const Case& c) {
  SyntheticOptions options;
  options.seed = c.seed;
  options.output_scale = c.output_scale;
  options.padding_tokens = c.padding_tokens;
  options.padding_requests = c.padding_requests;
  if (c.kv != KvCacheDtype::kAuto) {
    options.k_scale = 0.5f;
    options.v_scale = 0.25f;
  }
  BatchFile step = make_synthetic_batch(make_config(c), BuilderConfig{}, c.requests, options);
  poison_past_seq_len(step);
  return step;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  auto add = [&](Case c) { all.push_back(std::move(c)); };
  // The compute-sanitizer subset: unsplit, split, featured logits, 16 columns.
  add({.name = "SmallUnsplitBf16Gqa4", .num_heads = 8, .num_kv_heads = 2, .requests = kShort, .expect_unsplit = true});
  add({.name = "SmallSplitFp16Head64Gqa6", .num_heads = 6, .num_kv_heads = 1, .head_size = 64,
       .dtype = DType::kFloat16, .requests = {{3000, 1}, {3, 1}}, .window = 700, .expect_split = true});
  add({.name = "SmallFeaturesHead256", .num_heads = 4, .num_kv_heads = 2, .head_size = 256, .block_size = 32,
       .requests = {{600, 1}, {40, 1}}, .soft_cap = 5.0, .alibi = Alibi::kLinear, .sinks = true});
  add({.name = "SmallGqa12Head128", .num_heads = 12, .num_kv_heads = 1, .dtype = DType::kFloat16,
       .requests = {{300, 1}, {9, 1}}});
  // Head size × dtype × GQA ratio (1, 2, 4, 6, 8).
  for (const int64_t d : {64, 128, 256}) {
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const int64_t qpk : {1, 2, 4, 6, 8}) {
        const int64_t hkv = qpk == 1 ? 4 : 2;
        add({.name = "Head" + std::to_string(d) + (dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Gqa" +
                     std::to_string(qpk),
             .num_heads = hkv * qpk, .num_kv_heads = hkv, .head_size = d, .block_size = d == 256 ? 32 : 16,
             .dtype = dtype, .requests = kDecodes, .seed = static_cast<uint64_t>(d + qpk)});
      }
    }
  }
  // 16 columns (qpk 12, 16) and several passes (qpk 16 at D 256: 2 × 8; qpk 40: 16 + 16 + 8).
  add({.name = "Gqa16Head128Bf16", .num_heads = 32, .num_kv_heads = 2, .requests = kDecodes});
  add({.name = "Gqa16Head256Fp16", .num_heads = 16, .num_kv_heads = 1, .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kDecodes});
  add({.name = "Gqa40Head64Bf16", .num_heads = 40, .num_kv_heads = 1, .head_size = 64, .requests = kDecodes});
  add({.name = "Gqa12Head64Fp16Long", .num_heads = 24, .num_kv_heads = 2, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kLong, .expect_split = true});
  // Windows (freed blocks → NaN null block) and long rows (split).
  add({.name = "Window64Bf16", .requests = kWindowed, .window = 64});
  add({.name = "Window1Fp16", .dtype = DType::kFloat16, .requests = kWindowed, .window = 1});
  add({.name = "Window4096LongBf16Gqa4", .num_heads = 16, .num_kv_heads = 4, .requests = kLong, .window = 4096,
       .expect_split = true});
  add({.name = "Window777Head256Fp16", .num_heads = 8, .num_kv_heads = 2, .head_size = 256, .block_size = 64,
       .dtype = DType::kFloat16, .requests = kLong, .window = 777});
  add({.name = "LongSplitBf16Gqa4", .num_heads = 32, .num_kv_heads = 8, .requests = kLong, .expect_split = true});
  add({.name = "LongSplitFp16Mha", .num_heads = 4, .num_kv_heads = 4, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kLong, .expect_split = true});
  add({.name = "UnsplitFp16Head256Gqa8", .num_heads = 16, .num_kv_heads = 2, .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kShort, .expect_unsplit = true});
  add({.name = "Block48Bf16", .block_size = 48, .requests = kDecodes});
  // Logit features and the epilogue.
  add({.name = "SoftCapBf16", .requests = kDecodes, .soft_cap = 2.0});
  add({.name = "AlibiLinearSinksFp16", .dtype = DType::kFloat16, .requests = kLong, .alibi = Alibi::kLinear,
       .sinks = true, .expect_split = true});
  add({.name = "AlibiSqrtWindowBf16", .requests = kWindowed, .window = 100, .alibi = Alibi::kSqrt});
  add({.name = "SinksWindowLongBf16Gqa4", .num_heads = 16, .num_kv_heads = 4, .requests = kLong, .window = 4096,
       .sinks = true});
  add({.name = "Fp8OutputBf16", .requests = kDecodes, .output_scale = 0.5f});
  add({.name = "Fp8OutputSplitFp16", .dtype = DType::kFloat16, .requests = kLong, .output_scale = 0.25f,
       .expect_split = true});
  // Decode rows mixed with prefill rows; padding.
  add({.name = "MixBf16", .requests = kMix});
  add({.name = "MixFp16Head64Gqa4Window", .num_heads = 16, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kMix, .window = 50});
  add({.name = "PaddedFp16", .dtype = DType::kFloat16, .requests = {{100, 1}, {7, 1}}, .padding_tokens = 3,
       .padding_requests = 2});
  // Fallbacks to the SIMT decode kernel, said so by the planner.
  add({.name = "FallbackMmPrefix", .requests = {{50, 1, {{10, 50}}}, {2, 1}, {0, 30, {{5, 20}}}}, .window = 8,
       .path = Path::kSimt});
  add({.name = "FallbackFp8CacheFp32", .num_heads = 8, .num_kv_heads = 2, .dtype = DType::kFloat32,
       .requests = kDecodes, .kv = KvCacheDtype::kFp8E4M3, .path = Path::kSimt});
  // 1-byte caches on the tensor-core kernel: every cache dtype × head size × model dtype, windows,
  // long split rows, soft cap.
  const std::pair<KvCacheDtype, std::string> byte_caches[] = {{KvCacheDtype::kFp8E4M3, "Fp8E4m3"},
                                                              {KvCacheDtype::kFp8E5M2, "Fp8E5m2"},
                                                              {KvCacheDtype::kInt8PerTokenHead, "Int8Pth"},
                                                              {KvCacheDtype::kFp8PerTokenHead, "Fp8Pth"}};
  for (const auto& [kv, kv_name] : byte_caches) {
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const int64_t d : {64, 128, 256}) {
        add({.name = "ByteCache" + kv_name + (dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Head" + std::to_string(d),
             .num_heads = 8, .num_kv_heads = 2, .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype,
             .requests = kDecodes, .kv = kv});
      }
    }
    add({.name = "ByteCacheLongSplitWindow" + kv_name, .num_heads = 16, .num_kv_heads = 4, .requests = kLong,
         .kv = kv, .window = 4096, .expect_split = true});
  }
  add({.name = "SmallByteCacheFp8Bf16", .requests = kDecodes, .kv = KvCacheDtype::kFp8E4M3});
  add({.name = "ByteCacheSoftCapSinksFp16", .dtype = DType::kFloat16, .requests = kDecodes,
       .kv = KvCacheDtype::kFp8E5M2, .soft_cap = 2.0, .sinks = true});
  return all;
}

int64_t decode_rows_of(const BatchFile& step) {
  int64_t n = 0;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) n += step.batch.query_len(r) == 1 ? 1 : 0;
  return n;
}

class CudaDecodeMmaTest : public CudaParamFixture<Case> {};

TEST_P(CudaDecodeMmaTest, MatchesReference) {
  const Case& c = GetParam();
  const BatchFile step = make_step(c);
  const AttentionPlanSummary plan = plan_of(step);
  std::cout << "[ PLAN ] " << c.name << ": " << plan.describe() << "\n";
  const int64_t decodes = decode_rows_of(step);
  ASSERT_GT(decodes, 0);
  EXPECT_EQ(plan.decode_rows, decodes) << plan.describe();
  if (c.path == Path::kMma) {
    EXPECT_EQ(plan.decode_mma_rows, decodes) << plan.describe();
  } else {
    EXPECT_LT(plan.decode_mma_rows, decodes) << plan.describe();
    EXPECT_FALSE(plan.decode_fallback.empty()) << "a fallback must say why: " << plan.describe();
  }
  if (c.expect_split) {
    EXPECT_GT(plan.split_rows, 0) << plan.describe();
  }
  if (c.expect_unsplit) {
    EXPECT_EQ(plan.split_rows, 0) << plan.describe();
  }

  const BackendSettings settings{step.config, step.builder};
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  EXPECT_TRUE(cuda_matches_reference(step, actual, expected));
  const StepOutputs again = run_step(*cuda, step);
  EXPECT_TRUE(bitwise_equal(actual.attn_output, again.attn_output)) << "attn_output differs between two runs";
}

std::string case_name(const ::testing::TestParamInfo<Case>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeMmaTest, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace hybridtb::testing
