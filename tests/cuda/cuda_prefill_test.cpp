// The tensor-core prefill path of the "cuda" backend (optimized/src/attention/prefill_mma_kernel.cuh)
// against the reference: every head size (64/128/256) × float16/bfloat16, causal with and without a
// sliding window, chunked prefill with context (keys of the chunk itself written by the KV write
// first), GQA 1/4/5/8, mixed batches with decodes, NaN in freed blocks (windowed requests whose early
// blocks point at the null block, compact paging), shuffled and aliased block tables, padding, and
// one case per optional feature (soft cap, both ALiBi forms, sinks, mm_prefix, encoder_only, fp8
// output). Outputs within the tolerance table (the 16-bit rows include the P-rounding and mma terms),
// KV cache bytes exact, padding rows untouched, bitwise reproducible run to run; every 1-byte KV
// cache (fp8 e4m3/e5m2 per tensor, int8/fp8 per token-head) × head size × dtype, cast per tile on
// the tensor-core path. Each case also asks the planner which path its rows take
// (AttentionRunner::summary) so that a case meant for the tensor-core path cannot silently pass on
// the generic one, and the cases meant to fall back (head size 80, float32, a float32 model with an
// fp8 cache) say so. WgmmaMatchesReference runs every case again with the Hopper wgmma variant
// requested (prefill_variant 3, prefill_wgmma_kernel.cuh; skipped unless the build has sm_90a code
// and the device is compute capability 9.0): the cases it takes on it (head size 128 with a 16-bit or
// 1-byte cache, the ByteKvWgmma* cases; head sizes 64 and 256 with a 16-bit cache), the others on the
// default variant with the plan saying why; on it, K/V tiles of whole pages go by TMA and the others
// by cp.async in one ring wherever the block size allows TMA (a multiple of 8 dividing the tile's
// keys: 128, or 64 at head size 256), and the plan says whether it does (the Tma* cases mix both
// kinds of tile in one prefill). Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda  (cases named Small* are the compute-sanitizer subset)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "attention/attention_caps.h"
#include "attention/attention_plan.h"
#include "common/device_memory.h"
#include "cuda_cases.h"
#include "cuda_compare.h"
#include "cuda_plan.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

enum class Path { kTensorCore, kGeneric };  // where the non-decode rows must run
using PrefillCase = CheckedCase<Path>;

// Decodes first (vLLM's order; the Mamba builder requires it).
const std::vector<RequestSpec> kPrefills = {{0, 200}, {0, 64}, {0, 17}, {0, 1000}};
const std::vector<RequestSpec> kChunks = {{300, 77}, {2000, 300}, {513, 64}, {16, 129}, {1, 2}};
const std::vector<RequestSpec> kMixed = {{300, 1}, {4096, 1}, {17, 1}, {0, 1}, {40, 23}, {0, 150}, {129, 64}, {700, 5}};
const std::vector<RequestSpec> kSmall = {{45, 1}, {0, 37}, {20, 9}};
const std::vector<RequestSpec> kWindowed = {{1000, 1}, {0, 400}, {1500, 130}, {70, 90}};

std::vector<PrefillCase> cases() {
  std::vector<PrefillCase> all;
  // Every case draws its batch from seed 5.
  auto add = [&](CudaCase c, Path path = Path::kTensorCore) {
    c.seed = 5;
    all.push_back({std::move(c), path});
  };
  // The compute-sanitizer subset.
  add({.name = "SmallPrefillBf16", .requests = kSmall});
  add({.name = "SmallPrefillFp16WindowHead64", .head_size = 64, .dtype = DType::kFloat16, .requests = kSmall,
       .window = 8});
  add({.name = "SmallPrefillFp8KvBf16", .requests = kSmall, .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f,
       .v_scale = 0.25f});
  add({.name = "SmallPrefillInt8PerTokenHeadFp16Head256", .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kSmall, .kv = KvCacheDtype::kInt8PerTokenHead});
  // Head size × dtype, fresh prefills and chunks with context.
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const int64_t d : {64, 128, 256}) {
      const std::string tag = std::string(dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Head" + std::to_string(d);
      add({.name = "Prefill" + tag, .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype,
           .requests = kPrefills});
      add({.name = "Chunked" + tag, .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype,
           .requests = kChunks});
      add({.name = "Window" + tag, .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype,
           .requests = kWindowed, .window = 100});
    }
  }
  // GQA ratios (1, 4, 5, 8, 12) and more kv heads.
  add({.name = "Gqa1Mha", .num_heads = 4, .num_kv_heads = 4, .requests = kChunks});
  add({.name = "Gqa4Llama", .num_heads = 32, .num_kv_heads = 8, .requests = {{0, 300}, {100, 50}}});
  add({.name = "Gqa5Fp16", .num_heads = 10, .num_kv_heads = 2, .dtype = DType::kFloat16, .requests = kChunks});
  add({.name = "Gqa8Head64", .num_heads = 16, .num_kv_heads = 2, .head_size = 64, .requests = kChunks});
  add({.name = "Gqa12Window", .num_heads = 24, .num_kv_heads = 2, .head_size = 64, .requests = kWindowed,
       .window = 33});
  // Mixed batches with decodes (decodes on the decode path, the rest on the tensor cores), windows
  // of 1 and 4096, block sizes 32/48/80, NaN in freed blocks (compact paging), aliased/shared blocks.
  add({.name = "MixedBf16", .requests = kMixed});
  add({.name = "MixedFp16Head256Gqa8", .num_heads = 8, .num_kv_heads = 1, .head_size = 256, .block_size = 32,
       .dtype = DType::kFloat16, .requests = kMixed});
  add({.name = "MixedWindow1", .requests = kMixed, .window = 1});
  add({.name = "MixedBlock48Window64", .block_size = 48, .requests = kMixed, .window = 64});
  // The K/V loaders step block and slot from one division per tile: blocks of a size that is no
  // power of two, crossing tile boundaries.
  add({.name = "ChunksBlock80", .block_size = 80, .requests = kChunks});
  add({.name = "ChunksBlock80Head64", .head_size = 64, .block_size = 80, .requests = kChunks});
  // The wgmma kernel's K/V tiles: by TMA where a tile starts on a page and reads every key (block
  // sizes 16–128), by cp.async elsewhere — tiles at the diagonal, the first tile of a window whose
  // items start mid-page (window 1000 with 32 tokens per item: keys from 32·i − 999; the tiles start
  // at the page before, the keys ahead of the window zero-filled, and the later tiles are whole
  // pages), block sizes that do not divide 128 (48: cp.async only), tiles before the window that an
  // mm_prefix range reaches back to (cp.async tiles, then TMA tiles in one item) — both kinds through
  // one ring; fresh 1000+-token prompts, chunks with context (after 1009 keys under window 500: every
  // item's first key 14 past a page of 16; under window 473 9 past it, so that starting at the page
  // takes an item's 504 keys from four tiles to five), more kv heads (the map's head coordinate),
  // shuffled pages.
  add({.name = "TmaPagesBlock16Prompt1500", .requests = {{0, 1500}, {0, 1030}}});
  add({.name = "TmaPagesBlock32Fp16", .block_size = 32, .dtype = DType::kFloat16, .requests = {{0, 1200}, {700, 900}}});
  add({.name = "TmaPagesBlock64Kv8", .num_heads = 16, .num_kv_heads = 8, .block_size = 64,
       .requests = {{0, 1100}, {300, 600}}});
  add({.name = "TmaPagesBlock128Mha", .num_heads = 4, .num_kv_heads = 4, .block_size = 128,
       .requests = {{0, 1000}, {2000, 260}}});
  add({.name = "TmaWindowMidPageBlock32", .block_size = 32, .requests = {{0, 2000}}, .window = 1000});
  add({.name = "TmaWindowOnPageBlock32", .block_size = 32, .requests = {{0, 2000}}, .window = 1025});
  add({.name = "TmaCpAsyncOnlyBlock48", .block_size = 48, .requests = {{0, 1500}}});
  add({.name = "TmaMmPrefixWindow300", .requests = {{0, 700, {{0, 650}}}}, .window = 300});
  add({.name = "TmaWindowChunkFromPage", .requests = {{1009, 700}}, .window = 500});
  add({.name = "TmaWindowChunkAddsTile", .requests = {{1009, 700}}, .window = 473});
  // The same at head sizes 64 (tiles of 128 keys, one 64-dim box per page) and 256 (tiles of 64 keys,
  // four boxes per page; block size 128 does not divide a tile: cp.async only): TMA pages, windows
  // starting mid-page, soft cap, more kv heads.
  add({.name = "TmaPagesHead64Block16", .head_size = 64, .requests = {{0, 1500}, {0, 1030}}});
  add({.name = "TmaPagesHead64Block64Kv8Fp16", .num_heads = 16, .num_kv_heads = 8, .head_size = 64,
       .block_size = 64, .dtype = DType::kFloat16, .requests = {{0, 1100}, {300, 600}}});
  add({.name = "TmaWindowMidPageHead64Block32", .head_size = 64, .block_size = 32, .requests = {{0, 2000}},
       .window = 1000});
  add({.name = "TmaSoftCapHead64Block32", .head_size = 64, .block_size = 32, .requests = {{0, 1200}, {700, 900}},
       .soft_cap = 5.0});
  add({.name = "TmaPagesHead256Block32", .head_size = 256, .block_size = 32, .requests = {{0, 1500}, {0, 1030}}});
  add({.name = "TmaPagesHead256Block64Kv8Fp16", .num_heads = 16, .num_kv_heads = 8, .head_size = 256,
       .block_size = 64, .dtype = DType::kFloat16, .requests = {{0, 1100}, {300, 600}}});
  add({.name = "TmaWindowMidPageHead256Block16", .head_size = 256, .requests = {{0, 2000}}, .window = 1000});
  add({.name = "TmaSoftCapHead256Block32Fp16", .head_size = 256, .block_size = 32, .dtype = DType::kFloat16,
       .requests = {{0, 1200}, {513, 700}}, .soft_cap = 2.0});
  add({.name = "TmaCpAsyncOnlyHead256Block128", .head_size = 256, .block_size = 128, .requests = {{0, 1500}}});
  add({.name = "FreedBlocksNaNCompact", .requests = {{3000, 1}, {2500, 200}, {900, 64}}, .window = 256,
       .compact = true});
  add({.name = "LongChunkWindow4096", .num_heads = 8, .num_kv_heads = 2, .requests = {{6000, 512}, {0, 700}},
       .window = 4096, .compact = true});
  add({.name = "AliasedBlocks", .requests = {{800, 1}, {600, 40}, {1000, 33}, {512, 100}}, .alias_blocks = true});
  add({.name = "SharedPrefix", .requests = {{512, 1}, {512, 70}, {640, 30}}, .shared_prefix_tokens = 512});
  add({.name = "Padded", .dtype = DType::kFloat16, .requests = {{100, 1}, {0, 40}, {20, 7}}, .padding_tokens = 5,
       .padding_requests = 2});
  // Speculative-style short queries (query_len 2..5 with context).
  add({.name = "ShortQueries", .requests = {{1000, 2}, {33, 3}, {4000, 5}, {7, 4}}});
  // Optional features on the tensor-core path.
  add({.name = "SoftCap", .requests = kMixed, .soft_cap = 2.0});
  add({.name = "AlibiLinearSinksFp16", .dtype = DType::kFloat16, .requests = kMixed, .alibi = Alibi::kLinear,
       .sinks = true});
  add({.name = "AlibiSqrtWindow", .requests = kWindowed, .window = 100, .alibi = Alibi::kSqrt});
  add({.name = "SinksWindow", .num_heads = 16, .num_kv_heads = 4, .requests = kWindowed, .window = 64, .sinks = true});
  add({.name = "MmPrefix", .requests = {{50, 1, {{10, 50}}}, {0, 90, {{5, 20}, {40, 70}}}, {60, 30, {{2, 75}}},
                                        {0, 200, {{100, 180}}}},
       .window = 8});
  add({.name = "EncoderOnly", .requests = {{0, 1}, {0, 100}, {0, 37}, {0, 300}}, .encoder = true});
  add({.name = "EncoderOnlyWindowFp16Head64", .num_heads = 4, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = {{0, 170}, {0, 5}}, .window = 16, .encoder = true});
  add({.name = "Fp8Output", .requests = kMixed, .output_scale = 0.5f});
  add({.name = "Fp8OutputSoftCapFp16", .dtype = DType::kFloat16, .requests = kChunks, .soft_cap = 5.0,
       .output_scale = 0.25f});
  // 1-byte KV caches on the tensor-core path: every cache dtype × head size × model dtype, chunks
  // with context (per-tensor scales 0.5 / 0.25), windows with freed blocks, mixed batches.
  for (const auto& [kv, kv_label] : kByteKvDtypes) {
    const std::string kv_name = kv_label;
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const int64_t d : {64, 128, 256}) {
        const std::string tag = kv_name + (dtype == DType::kFloat16 ? "Fp16" : "Bf16") + "Head" + std::to_string(d);
        add({.name = "ByteKvChunked" + tag, .head_size = d, .block_size = d == 256 ? 32 : 16, .dtype = dtype,
             .requests = kChunks, .kv = kv, .k_scale = 0.5f, .v_scale = 0.25f});
      }
    }
    add({.name = "ByteKvWindowNaNCompact" + kv_name, .requests = {{3000, 1}, {2500, 200}, {900, 64}}, .kv = kv,
         .window = 256, .compact = true});
    add({.name = "ByteKvMixedSinksGqa8" + kv_name, .num_heads = 16, .num_kv_heads = 2, .requests = kMixed, .kv = kv,
         .sinks = true});
  }
  add({.name = "ByteKvSoftCapAlibiFp16", .dtype = DType::kFloat16, .requests = kMixed, .kv = KvCacheDtype::kFp8E4M3,
       .soft_cap = 5.0, .alibi = Alibi::kLinear, .k_scale = 2.0f, .v_scale = 0.5f});
  add({.name = "ByteKvFp8Output", .requests = kMixed, .kv = KvCacheDtype::kFp8PerTokenHead, .output_scale = 0.5f});
  // 1-byte caches at head size 128 on the wgmma variant (its producer casts them): block sizes 16 and
  // 32, fresh 1000+-token prompts and chunks with context (whole and partial tiles, every unit of the
  // raw ring), a window starting mid-page, soft cap with per-tensor scales.
  for (const auto& [kv, kv_label] : kByteKvDtypes) {
    const std::string kv_name = kv_label;
    add({.name = "ByteKvWgmmaBlock16" + kv_name, .requests = {{0, 1500}, {700, 900}}, .kv = kv, .k_scale = 0.5f,
         .v_scale = 0.25f});
    add({.name = "ByteKvWgmmaWindowBlock32" + kv_name, .block_size = 32, .dtype = DType::kFloat16,
         .requests = {{0, 2000}, {300, 260}}, .kv = kv, .window = 1000});
    add({.name = "ByteKvWgmmaSoftCapBlock32" + kv_name, .block_size = 32, .requests = {{0, 1200}, {513, 700}},
         .kv = kv, .soft_cap = 5.0, .k_scale = 2.0f, .v_scale = 0.5f});
  }
  // Not on the tensor-core path: routed to the generic kernel (and said so by the planner).
  add({.name = "FallbackFp8KvFp32", .num_heads = 4, .num_kv_heads = 4, .dtype = DType::kFloat32, .requests = kChunks,
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f},
      Path::kGeneric);
  add({.name = "FallbackHead80", .num_heads = 10, .num_kv_heads = 2, .head_size = 80, .requests = kChunks},
      Path::kGeneric);
  add({.name = "FallbackFp32", .num_heads = 4, .num_kv_heads = 4, .dtype = DType::kFloat32, .requests = kSmall},
      Path::kGeneric);
  return all;
}

class CudaPrefillTest : public CudaParamFixture<PrefillCase> {};

// One case on the cuda backend with the tensor-core prefill kernel's tile variant `variant` (−1:
// the default) against the reference.
void check_case(const PrefillCase& param, int variant) {
  const CudaCase& c = param.batch;
  const BatchFile step = make_step(c);
  // Which path the non-decode rows take.
  int64_t non_decode_rows = 0;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const int64_t q = step.batch.query_len(r);
    if (q > 1 || (q == 1 && c.encoder)) non_decode_rows += q;
  }
  // Short queries (kDecodeRowsMaxQueryLen) stay on the prefill kernel here: this test is the prefill
  // kernel's (CudaShortQueries runs them on both routes).
  cuda::AttentionPathOverrides overrides;
  overrides.prefill_variant = variant;
  overrides.short_queries_as_prefill = true;
  const cuda::AttentionPlanSummary plan = plan_of(step, overrides);
  std::cout << "[ PLAN ] " << c.name << ": " << plan.describe() << "\n";
  if (variant == cuda::kPrefillWgmma) {
    // The wgmma variant takes head size 128 with a 16-bit or a 1-byte cache, head sizes 64 and 256
    // with a 16-bit cache; any other layer runs the default variant, and the plan says so.
    const bool byte_cache = c.kv != KvCacheDtype::kAuto;
    const bool taken = c.head_size == 128 || ((c.head_size == 64 || c.head_size == 256) && !byte_cache);
    EXPECT_EQ(plan.prefill_variant_fallback.empty(), taken) << plan.describe();
    if (taken && param.expect == Path::kTensorCore && plan.prefill_items > 0) {
      EXPECT_EQ(plan.prefill_variant, cuda::kPrefillWgmma) << plan.describe();
    }
    // On it, the K/V tiles of whole pages go by TMA wherever the cache has that form: a decoder
    // cache (the backend's own: contiguous, aligned) whose block size is a multiple of 8 dividing
    // the tile's keys. The runner says whether they do, and why not.
    if (taken && plan.prefill_items > 0) {
      // A 1-byte cache's tiles always take cp.async (the producer casts them).
      const int64_t tile_keys = cuda::prefill_wgmma_config(static_cast<int>(c.head_size)).bn;
      const bool whole_pages =
          !c.encoder && c.kv == KvCacheDtype::kAuto && c.block_size % 8 == 0 && tile_keys % c.block_size == 0;
      EXPECT_EQ(plan.prefill_kv_tma, whole_pages) << plan.describe();
      EXPECT_EQ(plan.prefill_kv_tma_fallback.empty(), whole_pages) << plan.describe();
    }
  }
  if (param.expect == Path::kTensorCore) {
    EXPECT_EQ(plan.prefill_rows, non_decode_rows) << plan.describe();
    EXPECT_EQ(plan.generic_rows, 0) << plan.describe();
  } else {
    EXPECT_EQ(plan.prefill_rows, 0) << plan.describe();
    EXPECT_GT(plan.generic_rows, 0) << plan.describe();
    EXPECT_FALSE(plan.prefill_fallback.empty()) << "a fallback must say why: " << plan.describe();
  }

  BackendSettings settings{step.config, step.builder};
  settings.prefill_variant = variant;
  settings.short_queries_as_decode_rows = false;
  auto reference = create_backend("reference", settings);
  auto cuda = create_backend("cuda", settings);
  const StepOutputs expected = run_step(*reference, step);
  const StepOutputs actual = run_step(*cuda, step);
  EXPECT_TRUE(cuda_matches_reference(step, actual, expected));
  // Bitwise reproducible from run to run (no atomics, fixed reduction order).
  const StepOutputs again = run_step(*cuda, step);
  EXPECT_TRUE(bitwise_equal(actual.attn_output, again.attn_output)) << "attn_output differs between two runs";
  EXPECT_TRUE(bitwise_equal(actual.output, again.output)) << "output differs between two runs";
}

TEST_P(CudaPrefillTest, MatchesReference) { check_case(GetParam(), -1); }

// Every case again with the Hopper wgmma variant requested (prefill_wgmma_kernel.cuh): the same
// tolerance rows; the layers it does not take run the default variant (checked above).
TEST_P(CudaPrefillTest, WgmmaMatchesReference) {
  if (const std::string why = wgmma_prefill_unavailable(); !why.empty()) GTEST_SKIP() << why;
  check_case(GetParam(), cuda::kPrefillWgmma);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaPrefillTest, ::testing::ValuesIn(cases()), CaseName());

// A bfloat16 model's query rows far outside float16's range, on the wgmma variant with a 1-byte cache
// (every kind) and plain logits: per tensor its products run on float16 operands (Q rescaled per row
// by a power of two: stage_q_as_half), per token-head on bfloat16 (WgmmaOperands). In every CTA, query head 0 of each token is ×2^17 (its elements up to
// about 2^19, far above float16's 65504; its base-2 logits up to about 2^22, the range float16's P
// allows: WgmmaOperands), head 1 ×2^-40 (below float16's normal range), heads 2 and 3 as drawn.
class CudaPrefillQueryRange : public CudaFixture<> {};

TEST_F(CudaPrefillQueryRange, WgmmaByteKvBfloatRowsOfAnyMagnitude) {
  if (const std::string why = wgmma_prefill_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& [kv, kv_label] : kByteKvDtypes) {
    CudaCase c{.name = "QueryRange", .requests = {{0, 700}, {300, 260}}, .kv = kv, .k_scale = 0.5f, .v_scale = 0.25f};
    c.seed = 5;
    BatchFile step = make_step(c);
    ASSERT_EQ(step.config.num_heads, 8);  // two kv heads of four query heads: heads 0, 1 and 4, 5 are in every CTA
    scale_query_heads_beyond_float16(step);
    cuda::AttentionPathOverrides overrides;
    overrides.prefill_variant = cuda::kPrefillWgmma;
    const cuda::AttentionPlanSummary plan = plan_of(step, overrides);
    ASSERT_EQ(plan.prefill_variant, cuda::kPrefillWgmma) << plan.describe();
    BackendSettings settings{step.config, step.builder};
    settings.prefill_variant = cuda::kPrefillWgmma;
    EXPECT_TRUE(cuda_run_matches_reference(step, settings)) << kv_label;
  }
}

// Short queries (a speculative step's: 2 to kDecodeRowsMaxQueryLen query tokens) beside decodes and
// a prefill, on both routes: one decode row per token (the default) and prefill items. Each row sees
// its own causal keys (the window, ALiBi's offset from the request's first query row, mm_prefix
// ranges that widen them onto the SIMT decode); both routes match the reference, padding rows are
// untouched, and each is bitwise reproducible.
struct OnSimtDecode {
  bool simt = false;  // an mm_prefix range sends the short queries to the SIMT decode kernel
};
using ShortQueryCase = CheckedCase<OnSimtDecode>;

std::vector<ShortQueryCase> short_query_cases() {
  // Decodes first (vLLM's order), then the short queries, then a chunk.
  const std::vector<RequestSpec> kSpeculative = {{300, 1}, {4000, 1}, {1200, 4}, {17, 2}, {5000, 8}, {33, 3},
                                                 {64, 5}, {800, 100}};
  std::vector<ShortQueryCase> all;
  auto add = [&](CudaCase c, bool simt = false) {
    c.seed = 9;
    all.push_back({std::move(c), {simt}});
  };
  add({.name = "SmallShortQueriesBf16", .requests = kSpeculative});
  add({.name = "ShortQueriesFp16Head64Window", .num_heads = 16, .num_kv_heads = 4, .head_size = 64,
       .dtype = DType::kFloat16, .requests = kSpeculative, .window = 1000});
  add({.name = "ShortQueriesHead256AlibiSinks", .num_heads = 8, .num_kv_heads = 2, .head_size = 256,
       .requests = kSpeculative, .alibi = Alibi::kLinear, .sinks = true});
  add({.name = "ShortQueriesSoftCapWindow3", .requests = kSpeculative, .window = 3, .soft_cap = 5.0});
  add({.name = "ShortQueriesAlibiSqrt", .requests = kSpeculative, .alibi = Alibi::kSqrt});
  add({.name = "ShortQueriesFp8KvGqa8", .num_heads = 16, .num_kv_heads = 2, .requests = kSpeculative,
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f});
  add({.name = "ShortQueriesInt8PerTokenHeadPadded", .requests = {{700, 1}, {90, 6}, {0, 40}},
       .kv = KvCacheDtype::kInt8PerTokenHead, .padding_tokens = 3, .padding_requests = 1});
  add({.name = "ShortQueriesMmPrefix", .requests = {{300, 1}, {40, 4, {{38, 42}}}, {0, 50}}}, true);
  // Rows per decode CTA: 3 heads per kv head (5 rows in 16 columns), one (8 rows in 8), and 2-row
  // queries beside a prefill (8 columns: the mixed kernel runs the packed rows).
  add({.name = "ShortQueriesThreeHeadsPerKvHead", .num_heads = 6, .num_kv_heads = 2, .head_size = 64,
       .requests = kSpeculative, .alibi = Alibi::kSqrt});
  add({.name = "ShortQueriesOneHeadPerKvHeadWindow", .num_heads = 4, .num_kv_heads = 4, .requests = kSpeculative,
       .window = 6});
  add({.name = "ShortQueriesOfTwoBesideAPrefill", .requests = {{300, 1}, {1200, 2}, {17, 2}, {5000, 2}, {0, 64}}});
  return all;
}

class CudaShortQueries : public CudaParamFixture<ShortQueryCase> {};

TEST_P(CudaShortQueries, BothRoutesMatchTheReference) {
  const ShortQueryCase& param = GetParam();
  const BatchFile step = make_step(param.batch);
  int64_t short_rows = 0;
  for (int64_t r = 0; r < step.batch.num_reqs(); ++r) {
    const int64_t q = step.batch.query_len(r);
    if (q > 1 && q <= cuda::kDecodeRowsMaxQueryLen) short_rows += q;
  }
  ASSERT_GT(short_rows, 0);
  cuda::AttentionPathOverrides as_prefill;
  as_prefill.short_queries_as_prefill = true;
  const cuda::AttentionPlanSummary decode_plan = plan_of(step);
  const cuda::AttentionPlanSummary prefill_plan = plan_of(step, as_prefill);
  std::cout << "[ PLAN ] " << param.batch.name << ": " << decode_plan.describe() << "\n";
  EXPECT_EQ(decode_plan.decode_rows - prefill_plan.decode_rows, short_rows) << decode_plan.describe();
  EXPECT_EQ(prefill_plan.prefill_rows - decode_plan.prefill_rows, short_rows) << prefill_plan.describe();
  EXPECT_EQ(param.expect.simt, decode_plan.decode_mma_rows < decode_plan.decode_rows) << decode_plan.describe();

  for (const bool as_decode_rows : {true, false}) {
    SCOPED_TRACE(as_decode_rows ? "decode rows" : "prefill items");
    BackendSettings settings{step.config, step.builder};
    settings.short_queries_as_decode_rows = as_decode_rows;
    EXPECT_TRUE(cuda_run_matches_reference_reproducibly(step, settings));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaShortQueries, ::testing::ValuesIn(short_query_cases()), CaseName());

}  // namespace
}  // namespace hybridtb::testing
