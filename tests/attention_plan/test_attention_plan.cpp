// The attention plan as a value (attention_work_plan.h), computed on the host with no GPU: which
// kernel each request's rows take, the decode splits, the CUDA-graph padding, the workspace and
// upload layout, and the printed plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attention/attention_caps.h"
#include "attention/attention_work_plan.h"
#include "hybridtb/error.h"

namespace hybridtb::cuda {
namespace {

constexpr int kSms = 132;

AttentionConfig llama(int64_t window = 0) {
  AttentionConfig c;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = 128;
  c.block_size = 16;
  c.scale = 0.088;
  c.sliding_window = window;
  c.dtype = DType::kBFloat16;
  return c;
}

struct Req {
  int64_t context;
  int64_t query;
};

// One request per entry; blocks numbered consecutively; `padding_rows` token rows after the last.
BatchDescription batch_of(const std::vector<Req>& reqs, int64_t block_size, int64_t padding_rows = 0) {
  BatchDescription b;
  std::vector<int32_t> qsl{0};
  std::vector<int32_t> seq;
  int64_t max_blocks = 1;
  for (const Req& r : reqs) max_blocks = std::max(max_blocks, (r.context + r.query + block_size - 1) / block_size);
  std::vector<int32_t> table(reqs.size() * static_cast<size_t>(max_blocks), 0);
  int32_t next_block = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const int64_t len = reqs[i].context + reqs[i].query;
    qsl.push_back(qsl.back() + static_cast<int32_t>(reqs[i].query));
    seq.push_back(static_cast<int32_t>(len));
    for (int64_t k = 0; k < (len + block_size - 1) / block_size; ++k) {
      table[i * static_cast<size_t>(max_blocks) + static_cast<size_t>(k)] = next_block++;
    }
    for (int64_t t = 0; t < reqs[i].query; ++t) b.slot_mapping.push_back(reqs[i].context + t);
  }
  b.query_start_loc = IntArray::vector(qsl);
  b.seq_lens = IntArray::vector(seq);
  b.block_table = IntArray({static_cast<int64_t>(reqs.size()), max_blocks}, table);
  b.num_actual_tokens = qsl.back();
  for (int64_t t = 0; t < padding_rows; ++t) b.slot_mapping.push_back(-1);
  return b;
}

AttentionPlan plan_for(const AttentionConfig& c, const BatchDescription& b, const AttentionPathOverrides& o = {},
                       const FixedShapeCapacity* fixed = nullptr) {
  AttentionPlanInput in;
  in.config = &c;
  in.batch = &b;
  in.num_sms = kSms;
  in.overrides = o;
  in.routes = fixed ? route_graph_step(c, o) : route_layer(c, o, TensorLayoutFacts{});
  in.fixed = fixed;
  return plan_attention(in);
}

TEST(AttentionPlan, DecodeRowsTakeTheTensorCoreDecodeKernelWithTheirSplit) {
  const AttentionConfig c = llama();
  const AttentionPlan plan = plan_for(c, batch_of({{32767, 1}}, c.block_size));
  ASSERT_EQ(plan.requests.size(), 1u);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeMma);
  EXPECT_EQ(plan.requests[0].key_begin, 0);
  EXPECT_EQ(plan.requests[0].key_end, 32768);
  // About 4 CTAs per SM over 32768 keys × 8 kv heads × 1 head pass: 32768·8 / 528 → 497 keys, the
  // power of two 512, raised to the minimum of 1024 keys per split.
  EXPECT_EQ(plan.decode_mma_chunk, 1024);
  EXPECT_EQ(plan.requests[0].splits, 32);
  EXPECT_EQ(plan.decode_mma.size(), 32u);
  EXPECT_TRUE(plan.decode.empty());
  ASSERT_EQ(plan.combine.size(), 1u);
  EXPECT_EQ(plan.combine[0].num_splits, 32);
  EXPECT_EQ(plan.decode_mma_grid_ctas, 32 * 8);  // items × kv heads × one pass of 8 heads (GQA 4)
  EXPECT_EQ(plan.combine_grid_ctas, 32);
  for (size_t s = 0; s < plan.decode_mma.size(); ++s) {
    const DecodeItem& item = plan.decode_mma[s];
    EXPECT_EQ(item.key_begin, static_cast<int32_t>(s) * 1024);
    EXPECT_EQ(item.key_end, static_cast<int32_t>(s + 1) * 1024);
    EXPECT_EQ(item.partial_slot, static_cast<int32_t>(s));
  }
  EXPECT_EQ(plan.summary.decode_mma_rows, 1);
  EXPECT_EQ(plan.summary.split_rows, 1);
}

TEST(AttentionPlan, ManyShortDecodesAreNotSplit) {
  const AttentionConfig c = llama();
  const AttentionPlan plan = plan_for(c, batch_of(std::vector<Req>(256, {4095, 1}), c.block_size));
  // 256 × 4096 keys × 8 kv heads / 528 CTAs → 15888, the power of two 16384, lowered to the maximum
  // of 4096 keys per split: every row is one CTA, with no partials.
  EXPECT_EQ(plan.decode_mma_chunk, 4096);
  EXPECT_EQ(plan.decode_mma.size(), 256u);
  EXPECT_TRUE(plan.combine.empty());
  EXPECT_EQ(plan.partial_slots, 0);
  EXPECT_EQ(plan.partial_acc_bytes + plan.partial_ml_bytes, 0u);
}

TEST(AttentionPlan, DecodeRowsSplitEvenly) {
  const AttentionConfig c = llama();
  // 64 rows of 4100 keys: 64·4100·8 / 528 → 3976 keys, the power of two 4096; each row takes two
  // splits of 2112 and 1988 keys (64-key multiples), not 4096 and a remainder of 4.
  const AttentionPlan plan = plan_for(c, batch_of(std::vector<Req>(64, {4099, 1}), c.block_size));
  EXPECT_EQ(plan.decode_mma_chunk, 4096);
  ASSERT_EQ(plan.decode_mma.size(), 128u);
  for (const DecodeItem& item : plan.decode_mma) {
    EXPECT_EQ(item.key_end - item.key_begin, item.key_begin == 0 ? 2112 : 1988);
  }
  EXPECT_EQ(plan.combine.size(), 64u);
}

TEST(AttentionPlan, DecodeSplitPolicyIsChecked) {
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{32767, 1}}, c.block_size);
  for (const DecodeSplitPolicy policy : {DecodeSplitPolicy{0, 1024, 4096}, DecodeSplitPolicy{4, 1000, 4096},
                                         DecodeSplitPolicy{4, 32, 4096}, DecodeSplitPolicy{4, 4096, 1024}}) {
    AttentionPathOverrides o;
    o.mma_decode_split = policy;
    EXPECT_THROW(plan_for(c, b, o), Error) << policy.ctas_per_sm << "," << policy.min_keys << "," << policy.max_keys;
  }
  AttentionPathOverrides o;
  o.mma_decode_split = DecodeSplitPolicy{8, 256, 8192};
  EXPECT_EQ(plan_for(c, b, o).decode_mma_chunk, 256);  // 32768·8 / 1056 → 249 → 256
}

TEST(AttentionPlan, OneByteCachesTakeTheTensorCoreKernels) {
  for (const KvCacheDtype kv : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2, KvCacheDtype::kInt8PerTokenHead,
                                KvCacheDtype::kFp8PerTokenHead}) {
    SCOPED_TRACE(to_string(kv));
    AttentionConfig c = llama();
    c.kv_cache_dtype = kv;
    const AttentionPlan plan = plan_for(c, batch_of({{4095, 1}, {0, 300}}, c.block_size));
    EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeMma);
    EXPECT_EQ(plan.requests[1].path, RowPath::kPrefillMma);
    EXPECT_TRUE(plan.decode.empty());
    EXPECT_FALSE(plan.decode_mma.empty());
    EXPECT_TRUE(plan.generic.empty());
    // A 1-byte cache has only the head size's default tile variant.
    EXPECT_EQ(plan.prefill_variant, 1);
  }
}

TEST(AttentionPlan, OneByteCachesOfAFloat32ModelTakeTheSimtKernels) {
  AttentionConfig c = llama();
  c.dtype = DType::kFloat32;
  c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  const AttentionPlan plan = plan_for(c, batch_of({{4095, 1}, {0, 300}}, c.block_size));
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeSimt);
  EXPECT_TRUE(plan.decode_mma.empty());
  EXPECT_NE(plan.summary.decode_fallback.find("float16/bfloat16"), std::string::npos) << plan.summary.decode_fallback;
  EXPECT_EQ(plan.requests[1].path, RowPath::kGeneric);
  EXPECT_NE(plan.summary.prefill_fallback.find("float16/bfloat16"), std::string::npos)
      << plan.summary.prefill_fallback;
}

TEST(AttentionPlan, OneByteCachesRefuseOtherPrefillVariants) {
  AttentionConfig c = llama();
  c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  AttentionPathOverrides v0;
  v0.prefill_variant = 0;
  EXPECT_THROW(plan_for(c, batch_of({{0, 300}}, c.block_size), v0), Error);
}

TEST(AttentionPlan, PrefillRowsTakeTheTensorCorePrefillKernel) {
  const AttentionConfig c = llama();
  const AttentionPlan plan = plan_for(c, batch_of({{0, 300}}, c.block_size));
  EXPECT_EQ(plan.requests[0].path, RowPath::kPrefillMma);
  EXPECT_EQ(plan.prefill_variant, 1);  // D 128's default: 128 (token, head) rows per CTA
  EXPECT_EQ(plan.prefill_rows_per_item, 128);
  // 4 query heads per kv head → 32 tokens per item: ceil(300 / 32) = 10 token tiles × 8 kv heads.
  EXPECT_EQ(plan.prefill.size(), 80u);
  EXPECT_EQ(plan.requests[0].splits, 80);
  EXPECT_TRUE(plan.generic.empty());
  EXPECT_EQ(plan.summary.prefill_rows, 300);
  // Longest key spans first.
  EXPECT_TRUE(std::is_sorted(plan.prefill.begin(), plan.prefill.end(), [](const GenericItem& a, const GenericItem& b) {
    return a.key_end - a.key_begin > b.key_end - b.key_begin;
  }));
}

TEST(AttentionPlan, OverridesForceTheGenericAndSimtPaths) {
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{4095, 1}, {0, 64}}, c.block_size);
  AttentionPathOverrides generic_prefill;
  generic_prefill.generic_prefill = true;
  AttentionPlan plan = plan_for(c, b, generic_prefill);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeMma);
  EXPECT_EQ(plan.requests[1].path, RowPath::kGeneric);
  EXPECT_EQ(plan.summary.prefill_fallback, "forced generic");
  AttentionPathOverrides simt;
  simt.simt_decode = true;
  plan = plan_for(c, b, simt);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeSimt);
  EXPECT_EQ(plan.requests[1].path, RowPath::kPrefillMma);
  AttentionPathOverrides all_generic;
  all_generic.force_generic = true;
  plan = plan_for(c, b, all_generic);
  EXPECT_EQ(plan.requests[0].path, RowPath::kGeneric);
  EXPECT_EQ(plan.requests[1].path, RowPath::kGeneric);
  AttentionPathOverrides variant;
  variant.prefill_variant = 2;
  plan = plan_for(c, b, variant);
  EXPECT_EQ(plan.prefill_variant, 2);
  EXPECT_EQ(plan.prefill_rows_per_item, 64);
  variant.prefill_variant = 7;
  EXPECT_THROW(plan_for(c, b, variant), Error);
}

TEST(AttentionPlan, FloatCachesTakeTheGenericKernel) {
  AttentionConfig c = llama();
  c.dtype = DType::kFloat32;
  const AttentionPlan plan = plan_for(c, batch_of({{100, 1}, {0, 40}}, c.block_size));
  EXPECT_EQ(plan.requests[0].path, RowPath::kGeneric);
  EXPECT_EQ(plan.requests[1].path, RowPath::kGeneric);
  // Generic tiles: 32 (token, head) rows = 8 tokens × 4 heads; 1 + 5 token tiles × 8 kv heads.
  EXPECT_EQ(plan.generic.size(), 48u);
  EXPECT_NE(plan.summary.prefill_fallback.find("float32"), std::string::npos) << plan.summary.prefill_fallback;
}

TEST(AttentionPlan, ASlidingWindowLimitsTheKeys) {
  const AttentionConfig c = llama(/*window=*/1024);
  const AttentionPlan plan = plan_for(c, batch_of({{8191, 1}, {0, 4096}}, c.block_size));
  EXPECT_EQ(plan.requests[0].key_begin, 8192 - 1024);
  EXPECT_EQ(plan.requests[0].key_end, 8192);
  for (const DecodeItem& item : plan.decode_mma) {
    EXPECT_GE(item.key_begin, 8192 - 1024);
    EXPECT_LE(item.key_end, 8192);
  }
  for (const GenericItem& item : plan.prefill) {
    const int32_t last_pos = item.token_begin + item.num_tokens - 1;
    EXPECT_EQ(item.key_begin, std::max(0, item.token_begin - 1023));
    EXPECT_EQ(item.key_end, last_pos + 1);
    EXPECT_LE(item.key_end - item.key_begin, 1024 + item.num_tokens - 1);
  }
}

TEST(AttentionPlan, CudaGraphPaddingRowsWriteNothing) {
  const AttentionConfig c = llama();
  // Three decodes and two padding requests (query_len 0), four padding token rows.
  BatchDescription b = batch_of({{4000, 1}, {100, 1}, {20000, 1}, {0, 0}, {0, 0}}, c.block_size, 4);
  const FixedShapeCapacity fixed = fixed_shape_capacity(c, {}, b, kSms);
  EXPECT_GT(fixed.decode_mma_capacity, 0);
  EXPECT_EQ(fixed.decode_capacity, 0);
  const AttentionPlan plan = plan_for(c, b, {}, &fixed);
  EXPECT_TRUE(plan.fixed_shape);
  EXPECT_EQ(plan.requests[3].path, RowPath::kPadding);
  EXPECT_EQ(plan.requests[4].path, RowPath::kPadding);
  EXPECT_EQ(static_cast<int64_t>(plan.decode_mma.size()), fixed.decode_mma_capacity);
  EXPECT_EQ(static_cast<int64_t>(plan.combine.size()), fixed.num_reqs);
  EXPECT_EQ(plan.partial_slots, fixed.decode_capacity + fixed.decode_mma_capacity);
  // No item touches a padding request or a padding row: the real items cover requests 0..2 and
  // token rows 0..2; the rest are sentinels the kernels skip.
  int64_t real = 0;
  for (const DecodeItem& item : plan.decode_mma) {
    if (item.request < 0) continue;
    ++real;
    EXPECT_LT(item.request, 3);
    EXPECT_LT(item.token, 3);
  }
  EXPECT_EQ(real, plan.summary.decode_mma_ctas);
  for (const CombineItem& item : plan.combine) EXPECT_LT(item.token, 3);
  EXPECT_TRUE(plan.prefill.empty());
  EXPECT_TRUE(plan.generic.empty());
  // A prefill row cannot be captured.
  EXPECT_THROW(fixed_shape_capacity(c, {}, batch_of({{0, 4}}, c.block_size), kSms), NotSupported);
}

TEST(AttentionPlan, WorkspaceSizesFollowTheWorkLists) {
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{32767, 1}, {9000, 1}, {0, 200}, {500, 30}}, c.block_size);
  const AttentionPlan plan = plan_for(c, b);
  int64_t slots = 0;
  for (const CombineItem& item : plan.combine) slots += item.num_splits;
  EXPECT_EQ(plan.partial_slots, slots);
  EXPECT_EQ(plan.partial_acc_bytes, static_cast<size_t>(slots * c.num_heads * c.head_size) * sizeof(float));
  EXPECT_EQ(plan.partial_ml_bytes, static_cast<size_t>(slots * c.num_heads * 2) * sizeof(float));
  const StagingLayout& s = plan.staging;
  const auto end_of = [](size_t offset, size_t count, size_t size) { return offset + count * size; };
  EXPECT_EQ(s.query_start_loc, 0u);
  EXPECT_GE(s.seq_lens, end_of(s.query_start_loc, 5, 4));
  EXPECT_GE(s.block_table, end_of(s.seq_lens, 4, 4));
  EXPECT_GE(s.generic_items, end_of(s.block_table, static_cast<size_t>(4 * plan.block_table_stride), 4));
  EXPECT_GE(s.decode_mma_items, end_of(s.decode_items, plan.decode.size(), sizeof(DecodeItem)));
  EXPECT_EQ(s.bytes, end_of(s.combine_items, plan.combine.size(), sizeof(CombineItem)));
  for (size_t offset : {s.seq_lens, s.block_table, s.generic_items, s.prefill_items, s.decode_items,
                        s.decode_mma_items, s.combine_items}) {
    EXPECT_EQ(offset % 16, 0u);
  }
  const std::vector<unsigned char> bytes = stage_plan(plan, b);
  ASSERT_EQ(bytes.size(), s.bytes);
  std::vector<DecodeItem> staged(plan.decode_mma.size());
  std::memcpy(staged.data(), bytes.data() + s.decode_mma_items, staged.size() * sizeof(DecodeItem));
  for (size_t i = 0; i < staged.size(); ++i) EXPECT_EQ(staged[i].key_begin, plan.decode_mma[i].key_begin);
  EXPECT_EQ(plan.summary.decode_ctas, static_cast<int64_t>(plan.decode.size() + plan.decode_mma.size()));
}

TEST(AttentionPlan, EngineMetadataIsCheckedAndReported) {
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{4095, 1}, {10, 1}}, c.block_size);
  TritonAttentionMetadata m;
  m.num_actual_tokens = 2;
  m.max_query_len = 1;
  m.max_seq_len = 4096;
  m.seq_threshold_3d = 16;
  m.num_par_softmax_segments = 16;
  m.use_3d_path = 1;
  AttentionPlanInput in;
  in.config = &c;
  in.batch = &b;
  in.num_sms = kSms;
  in.routes = route_layer(c, {}, TensorLayoutFacts{});
  in.engine = &m;
  const std::string text = describe_plan(plan_attention(in), c);
  EXPECT_NE(text.find("vLLM's metadata: max_query_len 1, max_seq_len 4096, 3D kernel (split softmax over 16 "
                      "segments)"),
            std::string::npos)
      << text;
  m.max_seq_len = 4000;
  EXPECT_THROW(plan_attention(in), Error);
}

TEST(AttentionPlan, PrintedPlanNamesEveryRequestAndKernel) {
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{32767, 1}, {0, 64}, {0, 0}}, c.block_size, 2);
  const std::string text = describe_plan(plan_for(c, b), c);
  for (const char* line : {
           "attention plan: 3 requests, 65 query rows, 132 SMs\n",
           "layer: decoder, dtype bfloat16, kv_cache_dtype auto, heads 32/8, head size 128, block 16, window 0\n",
           "  request 0: query_len 1, tensor-core decode, keys [0, 32768), 32 splits\n",
           "  request 1: query_len 64, tensor-core prefill, 16 CTAs\n",
           "  request 2: query_len 0, padding (no work, nothing written)\n",
           "  tensor-core decode: 1 rows, 32 items of up to 1024 keys, 8 heads per CTA, grid 256 CTAs\n",
           "  combine: 1 split rows, grid 32 CTAs\n",
           "  tensor-core prefill: 64 rows, variant 1 (128 rows per CTA), grid 16 CTAs\n",
           "  generic: 0 rows, grid 0 CTAs\n",
           "workspace: upload ",
           "split partials 32 slots = 532480 bytes (32 heads x (128 + 2) floats per slot)\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
}

}  // namespace
}  // namespace hybridtb::cuda
