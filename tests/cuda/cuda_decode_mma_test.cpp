// The tensor-core decode path (optimized/src/attention/decode_mma_kernel.cuh) against the
// reference: head sizes 64/128/256 × float16/bfloat16 × GQA ratios 1/2/4/6/8 (and 12, 16, 40: 16
// head columns, several passes), windows (blocks that slid out point at the NaN null block), slots
// past seq_len poisoned with NaN, split and unsplit rows, soft cap, both ALiBi forms, sinks, fp8
// output, decode rows mixed with prefill rows, padding; outputs within the tolerance table (its
// e_P = u(model)·max|v| term covers P rounded to the model dtype), bitwise equal run to run. Each
// case asks the planner (AttentionRunner::summary) which decode path its rows take, so a case meant
// for the tensor-core kernel cannot silently run on the SIMT one; 1-byte caches (fp8 e4m3/e5m2 per
// tensor, int8/fp8 per token-head) take the tensor-core kernel, cast in registers (8 and 16 head
// columns; float16 products where DecodeOperands takes them, a bfloat16 model's query heads of any
// magnitude); mm_prefix rows and a float32 model with a 1-byte cache must fall back to the SIMT
// decode kernel with the reason named.
// Skips with the reason on a machine without a CUDA device. Cases named Small* are the compute-sanitizer subset.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_plan.h"
#include "common/device_memory.h"
#include "cuda_cases.h"
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

enum class Path { kMma, kSimt };  // where the case's decode rows must run

struct DecodeExpect {
  Path path = Path::kMma;
  bool split = false;    // some decode row must be split across CTAs
  bool unsplit = false;  // no decode row may be split
};
using DecodeCase = CheckedCase<DecodeExpect>;

// Decodes first (vLLM's order, required by the Mamba builder). {0, 1}: a row with one key.
const std::vector<RequestSpec> kDecodes = {{1327, 1}, {36, 1}, {2010, 1}, {0, 1}, {511, 1}, {15, 1}, {16, 1}};
const std::vector<RequestSpec> kShort = {{100, 1}, {7, 1}, {200, 1}, {31, 1}};  // < 256 keys: never split
const std::vector<RequestSpec> kLong = {{20000, 1}, {9000, 1}, {4100, 1}, {700, 1}};
const std::vector<RequestSpec> kMix = {{300, 1}, {17, 1}, {1000, 1}, {0, 1}, {40, 23}, {0, 70}, {129, 64}};
const std::vector<RequestSpec> kWindowed = {{1000, 1}, {700, 1}, {64, 1}, {5000, 1}, {300, 50}};

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

// The case's batch, slots past seq_len poisoned.
BatchFile make_decode_step(const CudaCase& c) {
  BatchFile step = make_step(c);
  poison_past_seq_len(step);
  return step;
}

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> all;
  // Every case draws its batch from seed 7 (the grid of head sizes, dtypes and GQA ratios: from
  // d + qpk); sink logits are −1 + 0.75·(h mod 7).
  auto add = [&](CudaCase c, DecodeExpect expect = {}, uint64_t seed = 7) {
    c.sink_step = 0.75f;
    c.sink_period = 7;
    c.seed = seed;
    all.push_back({std::move(c), expect});
  };
  // The compute-sanitizer subset: unsplit, split, featured logits, 16 columns.
  add({.name = "SmallUnsplitBf16Gqa4", .num_heads = 8, .num_kv_heads = 2, .requests = kShort}, {.unsplit = true});
  add({.name = "SmallSplitFp16Head64Gqa6", .num_heads = 6, .num_kv_heads = 1, .head_size = 64,
       .dtype = DType::kFloat16, .requests = {{3000, 1}, {3, 1}}, .window = 1500}, {.split = true});
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
             .dtype = dtype, .requests = kDecodes}, {}, static_cast<uint64_t>(d + qpk));
      }
    }
  }
  // 16 columns (qpk 12, 16) and several passes (qpk 16 at D 256: 2 × 8; qpk 40: 16 + 16 + 8).
  add({.name = "Gqa16Head128Bf16", .num_heads = 32, .num_kv_heads = 2, .requests = kDecodes});
  add({.name = "Gqa16Head256Fp16", .num_heads = 16, .num_kv_heads = 1, .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kDecodes});
  add({.name = "Gqa40Head64Bf16", .num_heads = 40, .num_kv_heads = 1, .head_size = 64, .requests = kDecodes});
  add({.name = "Gqa12Head64Fp16Long", .num_heads = 24, .num_kv_heads = 2, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kLong}, {.split = true});
  // Windows (freed blocks → NaN null block) and long rows (split).
  add({.name = "Window64Bf16", .requests = kWindowed, .window = 64});
  add({.name = "Window1Fp16", .dtype = DType::kFloat16, .requests = kWindowed, .window = 1});
  add({.name = "Window4096LongBf16Gqa4", .num_heads = 16, .num_kv_heads = 4, .requests = kLong, .window = 4096},
      {.split = true});
  add({.name = "Window777Head256Fp16", .num_heads = 8, .num_kv_heads = 2, .head_size = 256, .block_size = 64,
       .dtype = DType::kFloat16, .requests = kLong, .window = 777});
  add({.name = "LongSplitBf16Gqa4", .num_heads = 32, .num_kv_heads = 8, .requests = kLong}, {.split = true});
  add({.name = "LongSplitFp16Mha", .num_heads = 4, .num_kv_heads = 4, .head_size = 64, .dtype = DType::kFloat16,
       .requests = kLong}, {.split = true});
  add({.name = "UnsplitFp16Head256Gqa8", .num_heads = 16, .num_kv_heads = 2, .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kShort}, {.unsplit = true});
  add({.name = "Block48Bf16", .block_size = 48, .requests = kDecodes});
  // Logit features and the epilogue.
  add({.name = "SoftCapBf16", .requests = kDecodes, .soft_cap = 2.0});
  add({.name = "AlibiLinearSinksFp16", .dtype = DType::kFloat16, .requests = kLong, .alibi = Alibi::kLinear,
       .sinks = true}, {.split = true});
  add({.name = "AlibiSqrtWindowBf16", .requests = kWindowed, .window = 100, .alibi = Alibi::kSqrt});
  add({.name = "SinksWindowLongBf16Gqa4", .num_heads = 16, .num_kv_heads = 4, .requests = kLong, .window = 4096,
       .sinks = true});
  add({.name = "Fp8OutputBf16", .requests = kDecodes, .output_scale = 0.5f});
  add({.name = "Fp8OutputSplitFp16", .dtype = DType::kFloat16, .requests = kLong, .output_scale = 0.25f},
      {.split = true});
  // Decode rows mixed with prefill rows; padding.
  add({.name = "MixBf16", .requests = kMix});
  add({.name = "MixFp16Head64Gqa4Window", .num_heads = 16, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kMix, .window = 50});
  add({.name = "PaddedFp16", .dtype = DType::kFloat16, .requests = {{100, 1}, {7, 1}}, .padding_tokens = 3,
       .padding_requests = 2});
  // Fallbacks to the SIMT decode kernel, said so by the planner.
  add({.name = "FallbackMmPrefix", .requests = {{50, 1, {{10, 50}}}, {2, 1}, {0, 30, {{5, 20}}}}, .window = 8},
      {.path = Path::kSimt});
  add({.name = "FallbackFp8CacheFp32", .dtype = DType::kFloat32, .requests = kDecodes, .kv = KvCacheDtype::kFp8E4M3,
       .k_scale = 0.5f, .v_scale = 0.25f},
      {.path = Path::kSimt});
  // 1-byte caches on the tensor-core kernel: every cache dtype × head size × model dtype (per-tensor
  // scales 0.5 / 0.25), long split rows with a window, soft cap and sinks.
  for (const auto& [kv, kv_label] : kByteKvDtypes) {
    const std::string kv_name = kv_label;
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const int64_t d : {64, 128, 256}) {
        add({.name = "ByteCache" + kv_name + (dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Head" + std::to_string(d),
             .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype, .requests = kDecodes, .kv = kv,
             .k_scale = 0.5f, .v_scale = 0.25f});
      }
    }
    add({.name = "ByteCacheLongSplitWindow" + kv_name, .num_heads = 16, .num_kv_heads = 4, .requests = kLong,
         .kv = kv, .window = 4096},
        {.split = true});
  }
  add({.name = "SmallByteCacheFp8Bf16", .requests = kDecodes, .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f,
       .v_scale = 0.25f});
  // 16 head columns on 1-byte caches (their own register budget), several passes.
  add({.name = "ByteCacheGqa16Fp8E4m3Bf16", .num_heads = 32, .num_kv_heads = 2, .requests = kDecodes,
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f});
  add({.name = "ByteCacheGqa24Int8PthFp16Head64Long", .num_heads = 48, .num_kv_heads = 2, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kLong, .kv = KvCacheDtype::kInt8PerTokenHead},
      {.split = true});
  add({.name = "SmallByteCacheInt8PthFp16", .dtype = DType::kFloat16, .requests = kDecodes,
       .kv = KvCacheDtype::kInt8PerTokenHead});
  add({.name = "ByteCacheSoftCapSinksFp16", .dtype = DType::kFloat16, .requests = kDecodes,
       .kv = KvCacheDtype::kFp8E5M2, .soft_cap = 2.0, .sinks = true});
  // A bfloat16 model's per-tensor cache with featured logits: float16 products, the query heads
  // rescaled, the column's multiplier before the soft cap and ALiBi (DecodeOperands).
  add({.name = "ByteCacheSoftCapAlibiFp8Bf16", .requests = kLong, .kv = KvCacheDtype::kFp8E4M3, .window = 4096,
       .soft_cap = 5.0, .alibi = Alibi::kLinear, .sinks = true, .k_scale = 0.5f, .v_scale = 0.25f},
      {.split = true});
  return all;
}

// The rows the decode kernels run: one per query token of a request of 1 to kDecodeRowsMaxQueryLen.
int64_t decode_rows_of(const BatchFile& step) {
  int64_t n = 0;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const int64_t q = step.batch.query_len(r);
    n += q <= cuda::kDecodeRowsMaxQueryLen ? q : 0;
  }
  return n;
}

class CudaDecodeMmaTest : public CudaParamFixture<DecodeCase> {};

TEST_P(CudaDecodeMmaTest, MatchesReference) {
  const CudaCase& c = GetParam().batch;
  const DecodeExpect& expect = GetParam().expect;
  const BatchFile step = make_decode_step(c);
  const AttentionPlanSummary plan = plan_of(step);
  std::cout << "[ PLAN ] " << c.name << ": " << plan.describe() << "\n";
  const int64_t decodes = decode_rows_of(step);
  ASSERT_GT(decodes, 0);
  EXPECT_EQ(plan.decode_rows, decodes) << plan.describe();
  if (expect.path == Path::kMma) {
    EXPECT_EQ(plan.decode_mma_rows, decodes) << plan.describe();
  } else {
    EXPECT_LT(plan.decode_mma_rows, decodes) << plan.describe();
    EXPECT_FALSE(plan.decode_fallback.empty()) << "a fallback must say why: " << plan.describe();
  }
  if (expect.split) {
    EXPECT_GT(plan.split_rows, 0) << plan.describe();
  }
  if (expect.unsplit) {
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

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeMmaTest, ::testing::ValuesIn(cases()), CaseName());

// A bfloat16 model's query heads far outside float16's range on the tensor-core decode with a 1-byte
// cache (every kind): per tensor its products run on float16 operands, each head first rescaled by a
// power of two (DecodeOperands, float16_range_shift); per token-head on bfloat16. Query head 0 of
// each kv head's group ×2^17 and head 1 ×2^-40 (scale_query_heads_beyond_float16); split and
// unsplit rows.
class CudaDecodeQueryRange : public CudaFixture<> {};

TEST_F(CudaDecodeQueryRange, ByteKvBfloatHeadsOfAnyMagnitude) {
  for (const auto& [kv, kv_label] : kByteKvDtypes) {
    CudaCase c{.name = "QueryRange", .requests = {{9000, 1}, {700, 1}, {37, 1}}, .kv = kv, .k_scale = 0.5f,
               .v_scale = 0.25f};
    c.seed = 5;
    BatchFile step = make_decode_step(c);
    ASSERT_EQ(step.config.num_heads, 8);  // two kv heads of four query heads
    scale_query_heads_beyond_float16(step);
    const AttentionPlanSummary plan = plan_of(step);
    ASSERT_EQ(plan.decode_mma_rows, 3) << plan.describe();
    EXPECT_GT(plan.split_rows, 0) << plan.describe();
    EXPECT_TRUE(cuda_run_matches_reference(step, BackendSettings{step.config, step.builder})) << kv_label;
  }
}

}  // namespace
}  // namespace hybridtb::testing
