// The attention plan as a value (attention_work_plan.h), computed on the host with no GPU: which
// kernel each request's rows take, the decode splits, the CUDA-graph padding, the workspace and
// upload layout, and the printed plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
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
                       const FixedShapeCapacity* fixed = nullptr, bool hopper_wgmma = false) {
  AttentionPlanInput in;
  in.config = &c;
  in.batch = &b;
  in.num_sms = kSms;
  in.hopper_wgmma = hopper_wgmma;
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

// The block ids the kernels read without bounds checks: every id of a request's blocks up to its
// seq_len lies in the cache, the error names the first that does not; columns past a request's
// blocks are not read, so not checked. Returns one past the largest id read.
TEST(AttentionPlan, ReferencedBlocksChecksEveryIdReadAndNamesTheFirstBadOne) {
  const AttentionConfig c = llama();
  BatchDescription b = batch_of({{40, 1}, {100, 1}}, c.block_size);  // blocks 0–2 and 3–9, 7 columns
  EXPECT_EQ(referenced_blocks(c, b, 10), 10);
  b.block_table.at(0, 5) = 1 << 30;  // past request 0's 3 blocks: never read
  EXPECT_EQ(referenced_blocks(c, b, 10), 10);
  const auto message = [&](int64_t cache_blocks) {
    try {
      referenced_blocks(c, b, cache_blocks);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(9), "request 1: block_table entry 9 is outside the cache's 9 blocks");
  b.block_table.at(1, 2) = -1;
  b.block_table.at(1, 4) = -7;
  EXPECT_EQ(message(10), "request 1: block_table entry -1 is outside the cache's 10 blocks");
}

// Staging writes the upload in place (the runner's pinned buffer, holding the last step's bytes):
// every byte is written, whatever the buffer held; rows of a captured width wider than the batch's
// hold the batch's row, then zeros; the block ids are checked on the way as referenced_blocks checks
// them, with its span and its message.
TEST(AttentionPlan, StagingWritesEveryByteAndChecksTheBlockIdsItCopies) {
  const AttentionConfig c = llama();
  const FixedShapeCapacity fixed =
      fixed_shape_capacity(c, {}, batch_of({{4000, 1}, {100, 1}, {0, 0}}, c.block_size), kSms);
  BatchDescription b = batch_of({{1000, 1}, {100, 1}, {0, 0}}, c.block_size);  // blocks 0–62, 63–69
  const AttentionPlan plan = plan_for(c, b, {}, &fixed);
  const int64_t cols = b.block_table.size(1);
  ASSERT_GT(plan.block_table_stride, cols);
  const size_t size = plan.staging.bytes;
  std::vector<unsigned char> zeroed(size, 0), dirty(size, 0xab);
  EXPECT_EQ(stage_plan(plan, c, b, 70, zeroed), referenced_blocks(c, b, 70));
  EXPECT_EQ(stage_plan(plan, c, b, 70, dirty), 70);
  EXPECT_EQ(dirty, zeroed);
  EXPECT_EQ(stage_plan(plan, c, b), zeroed);
  for (int64_t r = 0; r < b.num_reqs(); ++r) {
    std::vector<int32_t> row(static_cast<size_t>(plan.block_table_stride));
    std::memcpy(row.data(), zeroed.data() + plan.staging.block_table + r * plan.block_table_stride * 4,
                row.size() * sizeof(int32_t));
    for (int64_t k = 0; k < plan.block_table_stride; ++k) {
      EXPECT_EQ(row[static_cast<size_t>(k)], k < cols ? b.block_table.at(r, k) : 0) << "row " << r << " column " << k;
    }
  }
  const auto message = [&](int64_t cache_blocks) {
    try {
      stage_plan(plan, c, b, cache_blocks, dirty);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(69), "request 1: block_table entry 69 is outside the cache's 69 blocks");
  b.block_table.at(0, 40) = -3;
  EXPECT_EQ(message(70), "request 0: block_table entry -3 is outside the cache's 70 blocks");
  std::vector<unsigned char> short_buffer(size - 1);
  EXPECT_THROW(stage_plan(plan, c, b, 70, short_buffer), Error);
  // An encoder-only layer has no cache: its block table is copied, not checked.
  AttentionConfig encoder = c;
  encoder.attn_type = AttnType::kEncoderOnly;
  EXPECT_EQ(stage_plan(plan, encoder, b, 0, dirty), 0);
}

// The keys each decode row of `request` reads, by its token: the union of its items' ranges and the
// causal interval they carry, with the row's split count.
struct RowKeys {
  int32_t key_begin = std::numeric_limits<int32_t>::max();
  int32_t key_end = 0;
  int32_t causal_begin = 0;
  int32_t causal_end = 0;
  int64_t items = 0;
};
std::map<int32_t, RowKeys> decode_rows_by_token(const std::vector<DecodeItem>& items, int32_t request) {
  std::map<int32_t, RowKeys> rows;
  for (const DecodeItem& item : items) {
    if (item.request != request) continue;
    RowKeys& row = rows[item.token];
    row.key_begin = std::min(row.key_begin, item.key_begin);
    row.key_end = std::max(row.key_end, item.key_end);
    row.causal_begin = item.causal_begin;
    row.causal_end = item.causal_end;
    ++row.items;
  }
  return rows;
}

// A speculative step's short query (query_len ≤ kDecodeRowsMaxQueryLen) runs one tensor-core decode
// row per token, its rows packed into the decode CTAs' columns (Llama-3: 4 query heads per kv head,
// so 16 columns hold 4 rows), each CTA reading the union of its rows' keys (with a window: from the
// first row's window start to the last row's position), split as any decode row; every split row
// gets its own partial slots and combine item; the request's route spans the keys and counts the
// CTAs along the key axis.
TEST(AttentionPlan, ShortQueriesPackTheirRowsIntoDecodeCtas) {
  for (const int64_t window : {int64_t{0}, int64_t{1000}}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const AttentionConfig c = llama(window);
    const BatchDescription b = batch_of({{2000, 1}, {20000, 4}, {0, 100}}, c.block_size);
    const AttentionPlan plan = plan_for(c, b);
    EXPECT_EQ(plan.mma_columns, 16);
    EXPECT_EQ(plan.requests[1].path, RowPath::kDecodeMma);
    EXPECT_EQ(plan.requests[2].path, RowPath::kPrefillMma);
    EXPECT_EQ(plan.summary.decode_rows, 5);
    EXPECT_EQ(plan.summary.decode_mma_rows, 5);
    EXPECT_EQ(plan.summary.prefill_rows, 100);
    const int32_t first = window > 0 ? 20000 - static_cast<int32_t>(window) + 1 : 0;
    int64_t items = 0;
    std::vector<int32_t> slots;
    for (const DecodeItem& item : plan.decode_mma) {
      if (item.request != 1) continue;
      ++items;
      EXPECT_EQ(item.token, 1);
      EXPECT_EQ(item.num_tokens, 4);
      EXPECT_EQ(item.causal_begin, first);
      EXPECT_EQ(item.causal_end, 20004);
      EXPECT_GE(item.key_begin, first);
      EXPECT_LE(item.key_end, 20004);
      for (int32_t j = 0; item.num_splits > 1 && j < item.num_tokens; ++j) {
        slots.push_back(item.partial_slot + j * item.num_splits);
      }
    }
    EXPECT_EQ(plan.requests[1].key_begin, first);
    EXPECT_EQ(plan.requests[1].key_end, 20004);
    EXPECT_EQ(plan.requests[1].splits, items);
    std::vector<int32_t> combined;
    for (const CombineItem& item : plan.combine) {
      if (item.token < 1 || item.token > 4) continue;
      EXPECT_EQ(item.num_splits, items);
      for (int32_t k = 0; k < item.num_splits; ++k) combined.push_back(item.first_slot + k);
    }
    std::sort(slots.begin(), slots.end());
    std::sort(combined.begin(), combined.end());
    EXPECT_EQ(slots, combined);  // every split row's partial slots are the ones its combine reads
    EXPECT_EQ(std::adjacent_find(slots.begin(), slots.end()), slots.end());  // and no two rows share one
    EXPECT_EQ(combined.size(), window > 0 ? 0u : 4u * static_cast<size_t>(items));  // 20k keys split, 1000 do not
  }
}

// Rows pack as far as the columns allow: 8 columns hold 2 rows of 4 heads (a step whose short
// queries have 2 rows keeps 8), 16 hold 4 (the rest of a longer query takes another CTA), 8 heads
// per kv head 2 rows in 16, and 16 heads per kv head none (their 16 columns are one row's).
TEST(AttentionPlan, ShortQueryRowsPerDecodeCta) {
  struct Case {
    int64_t kv_heads;
    std::vector<Req> reqs;
    int columns;
    std::vector<int32_t> rows_per_item;  // of request 0's items, in token order
  };
  const std::vector<Case> cases = {{8, {{1000, 2}, {900, 1}}, 8, {2}},
                                   {8, {{1000, 6}}, 16, {4, 2}},
                                   {4, {{1000, 5}}, 16, {2, 2, 1}},
                                   {2, {{1000, 3}}, 16, {1, 1, 1}}};
  for (const Case& k : cases) {
    AttentionConfig c = llama();
    c.num_kv_heads = k.kv_heads;
    SCOPED_TRACE(std::to_string(c.num_queries_per_kv()) + " heads per kv head");
    const AttentionPlan plan = plan_for(c, batch_of(k.reqs, c.block_size));
    EXPECT_EQ(plan.mma_columns, k.columns);
    std::vector<int32_t> rows;
    int32_t next_token = 0;
    for (const DecodeItem& item : plan.decode_mma) {
      if (item.request != 0) continue;
      EXPECT_EQ(item.token, next_token);  // consecutive rows, each in one item (no split at 1000 keys)
      next_token += item.num_tokens;
      rows.push_back(item.num_tokens);
      EXPECT_EQ(item.causal_end, 1000 + next_token);  // the last row's position + 1
    }
    EXPECT_EQ(rows, k.rows_per_item);
  }
  // A step of plain decodes and one with short queries taken as prefill items keep the heads' columns.
  EXPECT_EQ(plan_for(llama(), batch_of({{1000, 1}}, 16)).mma_columns, 8);
  AttentionPathOverrides as_prefill;
  as_prefill.short_queries_as_prefill = true;
  EXPECT_EQ(plan_for(llama(), batch_of({{1000, 4}}, 16), as_prefill).mma_columns, 8);
}

// Past kDecodeRowsMaxQueryLen tokens, or where asked (the comparison switch), a short query runs as
// prefill items; a step captured in a CUDA graph still refuses it.
TEST(AttentionPlan, ShortQueriesAsPrefillItemsWhenLongerOrAsked) {
  const AttentionConfig c = llama();
  const BatchDescription b =
      batch_of({{300, kDecodeRowsMaxQueryLen}, {300, kDecodeRowsMaxQueryLen + 1}}, c.block_size);
  const AttentionPlan plan = plan_for(c, b);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeMma);
  EXPECT_EQ(plan.requests[1].path, RowPath::kPrefillMma);
  AttentionPathOverrides as_prefill;
  as_prefill.short_queries_as_prefill = true;
  const AttentionPlan asked = plan_for(c, b, as_prefill);
  EXPECT_EQ(asked.requests[0].path, RowPath::kPrefillMma);
  EXPECT_EQ(asked.summary.decode_rows, 0);
  EXPECT_EQ(asked.summary.prefill_rows, 2 * kDecodeRowsMaxQueryLen + 1);
  EXPECT_THROW(fixed_shape_capacity(c, {}, batch_of({{300, 2}}, c.block_size), kSms), NotSupported);
}

// An mm_prefix range that a short query's rows lie in widens their keys past the causal interval
// (bidirectional within the range): the request's rows take the SIMT decode kernel, which reads
// those keys, and the summary says why.
TEST(AttentionPlan, ShortQueryInAnMmPrefixRangeTakesTheSimtDecode) {
  const AttentionConfig c = llama();
  BatchDescription b = batch_of({{300, 1}, {40, 4}}, c.block_size);  // query positions 40–43
  b.mm_prefix_range = IntArray({2, 1, 2}, {-1, -1, 38, 42});
  const AttentionPlan plan = plan_for(c, b);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeMma);
  EXPECT_EQ(plan.requests[1].path, RowPath::kDecodeSimt);
  EXPECT_NE(plan.summary.decode_fallback.find("mm_prefix"), std::string::npos) << plan.summary.describe();
  const std::map<int32_t, RowKeys> rows = decode_rows_by_token(plan.decode, 1);
  ASSERT_EQ(rows.size(), 4u);
  for (int32_t i = 0; i < 4; ++i) {
    const RowKeys& row = rows.at(1 + i);
    EXPECT_EQ(row.causal_end, 41 + i) << "token " << 1 + i;
    EXPECT_EQ(row.key_end, i < 3 ? 43 : 44) << "token " << 1 + i;  // positions 40–42 see keys to 42
  }
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

// On a compute capability 9.0 device (hopper_wgmma) the wgmma variant is the default of the layers it
// takes, for prefills of at least kWgmmaPrefillMinFlops: a fresh 4096-token prompt is
// 4·128 · (32 tokens · 4 heads) · 8 kv heads · Σ_{j<128} 32·(j + 1) = 1.39e11 FLOP by the plan's count
// (items of 32 tokens × the 4 query heads of one kv head, each key span counted whole), a 2048-token
// one 3.49e10 (both on wgmma), a 1024-token one 8.7e9 and stays on mma.sync. In a step whose
// tensor-core prefill and decode items share the mixed grid (whose prefill body is the mma.sync
// kernel's; the next test says when they do) the mma.sync default runs; an explicit variant wins;
// heads 64 and 256 take the same defaults, cut for the kernel that runs; layers the wgmma kernel does
// not take keep the head size's mma.sync default without a fallback note (nothing was asked for).
TEST(AttentionPlan, HopperDefaultsToTheWgmmaPrefillWhereItApplies) {
  if (!prefill_wgmma_built()) GTEST_SKIP() << "this build has no sm_90a code (the wgmma prefill variant)";
  const auto hopper_plan = [](const AttentionConfig& c, const BatchDescription& b, const AttentionPathOverrides& o) {
    return plan_for(c, b, o, nullptr, /*hopper_wgmma=*/true);
  };
  const AttentionConfig c = llama();
  const BatchDescription prefill_only = batch_of({{0, 4096}}, c.block_size);
  const BatchDescription prompt_2k = batch_of({{0, 2048}}, c.block_size);
  const BatchDescription short_prefill = batch_of({{0, 1024}}, c.block_size);
  const BatchDescription mixed = batch_of({{4095, 1}, {0, 4096}}, c.block_size);

  AttentionPlan plan = hopper_plan(c, prefill_only, {});
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_EQ(plan.prefill_rows_per_item, 128);
  EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
  EXPECT_EQ(plan_for(c, prefill_only).prefill_variant, kPrefillTwoMTiles);  // another GPU
  EXPECT_EQ(hopper_plan(c, prompt_2k, {}).prefill_variant, kPrefillWgmma);
  EXPECT_EQ(hopper_plan(c, short_prefill, {}).prefill_variant, kPrefillTwoMTiles);

  // Prefill and tensor-core decodes in one step, the prefill not outweighing the decode (4096
  // tokens beside one decode of 4096 keys would: 1.39e11 FLOP over 16.8e6 bytes): one decode per
  // 8 prefill tokens keeps it under kMixedGridMaxFlopsPerByte. One mixed grid on the mma.sync
  // default, with the same items as the wgmma variant takes apart.
  std::vector<Req> balanced(512, Req{4095, 1});
  balanced.push_back({0, 4096});
  const BatchDescription balanced_step = batch_of(balanced, c.block_size);
  plan = hopper_plan(c, balanced_step, {});
  EXPECT_FALSE(plan.mixed.empty());
  EXPECT_TRUE(plan.summary.mixed_fallback.empty()) << plan.summary.mixed_fallback;
  EXPECT_EQ(plan.prefill_variant, kPrefillTwoMTiles);
  const size_t mixed_items = plan.prefill.size();
  AttentionPathOverrides separate;
  separate.separate_mixed = true;
  plan = hopper_plan(c, balanced_step, separate);
  EXPECT_TRUE(plan.mixed.empty());
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_EQ(plan.prefill.size(), mixed_items);
  // The prefill outweighing its one decode: apart, on wgmma.
  plan = hopper_plan(c, mixed, {});
  EXPECT_TRUE(plan.mixed.empty());
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);

  // An explicit variant wins.
  AttentionPathOverrides two_m_tiles;
  two_m_tiles.prefill_variant = kPrefillTwoMTiles;
  EXPECT_EQ(hopper_plan(c, prefill_only, two_m_tiles).prefill_variant, kPrefillTwoMTiles);
  AttentionPathOverrides wgmma;
  wgmma.prefill_variant = kPrefillWgmma;
  EXPECT_EQ(hopper_plan(c, short_prefill, wgmma).prefill_variant, kPrefillWgmma);

  // 1-byte caches too (the producer casts them).
  for (const KvCacheDtype kv : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2, KvCacheDtype::kInt8PerTokenHead,
                                KvCacheDtype::kFp8PerTokenHead}) {
    AttentionConfig bytes = llama();
    bytes.kv_cache_dtype = kv;
    plan = hopper_plan(bytes, prefill_only, {});
    EXPECT_EQ(plan.prefill_variant, kPrefillWgmma) << to_string(kv);
    EXPECT_EQ(plan.summary.prefill_variant, kPrefillWgmma) << to_string(kv);
    EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
    EXPECT_EQ(hopper_plan(bytes, short_prefill, {}).prefill_variant, kPrefillTwoMTiles) << to_string(kv);
  }
  // Head sizes 64 and 256 with a 16-bit cache: wgmma (128 rows per item) for the 4096-token prompt
  // (6.9e10 / 2.8e11 FLOP). Where the default yields to mma.sync — the 1024-token prompt (4.4e9 /
  // 1.7e10 FLOP) and the balanced mixed step — the items are those of the mma.sync default, 64 rows
  // (the same rows as that variant asked for).
  for (const int64_t d : {64, 256}) {
    AttentionConfig other = llama();
    other.head_size = d;
    plan = hopper_plan(other, prefill_only, {});
    EXPECT_EQ(plan.prefill_variant, kPrefillWgmma) << d;
    EXPECT_EQ(plan.prefill_rows_per_item, 128) << d;
    EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
    AttentionPathOverrides one_m_tile;
    one_m_tile.prefill_variant = kPrefillOneMTile;
    for (const BatchDescription* step : {&short_prefill, &balanced_step}) {
      if (step == &balanced_step && d == 256) continue;  // no mixed grid at D 256: below
      plan = hopper_plan(other, *step, {});
      const AttentionPlan asked = hopper_plan(other, *step, one_m_tile);
      EXPECT_EQ(plan.prefill_variant, kPrefillOneMTile) << d;
      EXPECT_EQ(plan.prefill_rows_per_item, 64) << d;
      EXPECT_EQ(plan.prefill.size(), asked.prefill.size()) << d;
      EXPECT_EQ(plan.mixed.size(), asked.mixed.size()) << d;
    }
    EXPECT_EQ(hopper_plan(other, balanced_step, {}).mixed.empty(), d == 256) << d;
  }
  // D 256's balanced step: the mixed grid does not take D 256 (the summary says so), so the wgmma
  // prefill and the decodes run apart.
  AttentionConfig d256 = llama();
  d256.head_size = 256;
  plan = hopper_plan(d256, balanced_step, {});
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_NE(plan.summary.mixed_fallback.find("head size 256"), std::string::npos) << plan.summary.mixed_fallback;
  // A layer the wgmma kernel does not take (D 64 with a 1-byte cache): its default, silently.
  AttentionConfig d64_bytes = llama();
  d64_bytes.head_size = 64;
  d64_bytes.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  plan = hopper_plan(d64_bytes, prefill_only, {});
  EXPECT_EQ(plan.prefill_variant, kPrefillOneMTile);
  EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
}

// On Hopper, a step whose prefill outweighs its decodes runs the wgmma prefill and the decode apart
// (kMixedGridMaxFlopsPerByte). A 2048-token chunk at context 4096 beside 64 decodes at 4k keys: the
// prefill is 4·128 · (32·4) · 8 kv heads · Σ_{j<64}(4096 + 32·(j + 1)) = 1.72e11 FLOP over
// 64·4096 keys · 8 kv heads · 2·128·2 bytes = 1.07e9 decode bytes: 160 per byte. A fresh 2048-token
// prompt beside the same decodes (32 per byte, and a prefill below kWgmmaPrefillMinFlops) keeps the
// one grid. Elsewhere, or with the variant chosen explicitly, the one grid stands whatever the balance.
TEST(AttentionPlan, HopperRunsAPrefillThatOutweighsTheDecodesApart) {
  if (!prefill_wgmma_built()) GTEST_SKIP() << "this build has no sm_90a code (the wgmma prefill variant)";
  const AttentionConfig c = llama();
  std::vector<Req> decodes(64, Req{4095, 1});
  std::vector<Req> chunk_reqs = decodes;
  chunk_reqs.push_back({4096, 2048});
  std::vector<Req> fresh_reqs = decodes;
  fresh_reqs.push_back({0, 2048});
  const BatchDescription chunk = batch_of(chunk_reqs, c.block_size);
  const BatchDescription fresh = batch_of(fresh_reqs, c.block_size);

  AttentionPlan plan = plan_for(c, chunk, {}, nullptr, /*hopper_wgmma=*/true);
  EXPECT_TRUE(plan.mixed.empty());
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_NE(plan.summary.mixed_fallback.find("the prefill outweighs the decode (160 prefill FLOP per decode byte"),
            std::string::npos)
      << plan.summary.mixed_fallback;
  EXPECT_EQ(plan.summary.decode_mma_rows, 64);

  plan = plan_for(c, fresh, {}, nullptr, /*hopper_wgmma=*/true);
  EXPECT_FALSE(plan.mixed.empty());
  EXPECT_TRUE(plan.summary.mixed_fallback.empty()) << plan.summary.mixed_fallback;
  EXPECT_EQ(plan.prefill_variant, kPrefillTwoMTiles);

  // Another GPU, or the mma.sync variant asked for: one grid for the chunk too.
  EXPECT_FALSE(plan_for(c, chunk).mixed.empty());
  AttentionPathOverrides two_m_tiles;
  two_m_tiles.prefill_variant = kPrefillTwoMTiles;
  plan = plan_for(c, chunk, two_m_tiles, nullptr, /*hopper_wgmma=*/true);
  EXPECT_FALSE(plan.mixed.empty());
  EXPECT_EQ(plan.prefill_variant, kPrefillTwoMTiles);
}

// The tensor-core decode's operands with a 1-byte cache (decode_float16_products): float16 for a
// per-tensor cache (soft cap or not) and for a float16 model's per-token-head cache, the query heads
// of a bfloat16 model rescaled; a bfloat16 model's per-token-head cache keeps bfloat16, and so does
// a 16-bit cache. The summary names the float16 route.
TEST(AttentionPlan, DecodeFloat16ProductsNamed) {
  const BatchDescription b = batch_of({{4095, 1}, {2000, 1}}, llama().block_size);
  AttentionConfig fp8 = llama();
  fp8.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  AttentionPlan plan = plan_for(fp8, b);
  ASSERT_EQ(plan.summary.decode_mma_rows, 2) << plan.summary.describe();
  EXPECT_EQ(plan.summary.decode_operands, "float16 (query heads rescaled by powers of two)");
  EXPECT_NE(plan.summary.describe().find("products on float16 (query heads"), std::string::npos)
      << plan.summary.describe();
  AttentionConfig capped = fp8;
  capped.logits_soft_cap = 30.0;
  EXPECT_EQ(plan_for(capped, b).summary.decode_operands, "float16 (query heads rescaled by powers of two)");
  AttentionConfig half = fp8;
  half.dtype = DType::kFloat16;
  EXPECT_EQ(plan_for(half, b).summary.decode_operands, "float16");
  AttentionConfig int8_pth = llama();
  int8_pth.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  EXPECT_EQ(plan_for(int8_pth, b).summary.decode_operands, "");
  int8_pth.dtype = DType::kFloat16;
  EXPECT_EQ(plan_for(int8_pth, b).summary.decode_operands, "float16");
  plan = plan_for(llama(), b);
  EXPECT_EQ(plan.summary.decode_operands, "");
  EXPECT_EQ(plan.summary.describe().find("products on"), std::string::npos) << plan.summary.describe();
}

// The Hopper wgmma variant (3): taken at head size 128 with a 16-bit or 1-byte cache and at head sizes
// 64 and 256 with a 16-bit cache in builds with sm_90a code; other layers run the default variant and
// the summary says why; refused (naming the field) in builds without it.
TEST(AttentionPlan, WgmmaPrefillVariantRoutesOrRefuses) {
  AttentionPathOverrides wgmma;
  wgmma.prefill_variant = kPrefillWgmma;
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{4095, 1}, {100, 300}}, c.block_size);
  if (!prefill_wgmma_built()) {
    try {
      plan_for(c, b, wgmma);
      ADD_FAILURE() << "prefill_variant 3 accepted by a build without sm_90a code";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("prefill_variant 3"), std::string::npos) << e.what();
    }
    return;
  }
  AttentionPlan plan = plan_for(c, b, wgmma);
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_EQ(plan.prefill_rows_per_item, 128);
  EXPECT_EQ(plan.requests[1].path, RowPath::kPrefillMma);
  EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
  EXPECT_TRUE(plan.mixed.empty());  // the mixed kernel runs the default variant only
  EXPECT_NE(plan.summary.mixed_fallback.find("prefill variant 3"), std::string::npos) << plan.summary.mixed_fallback;
  // A 1-byte cache: taken (the mixed kernel takes no 1-byte cache, so no mixed grid either way).
  AttentionConfig fp8 = llama();
  fp8.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  plan = plan_for(fp8, b, wgmma);
  EXPECT_EQ(plan.prefill_variant, kPrefillWgmma);
  EXPECT_EQ(plan.summary.prefill_variant, kPrefillWgmma);
  EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
  // Its products on float16 operands (a bfloat16 model's Q rescaled), and the summary says so; not
  // with a soft cap, nor with a 16-bit cache.
  EXPECT_EQ(plan.summary.prefill_operands, "float16 (Q rows rescaled by powers of two)");
  EXPECT_NE(plan.summary.describe().find("wgmma products on float16"), std::string::npos) << plan.summary.describe();
  EXPECT_NE(plan.summary.describe().find(" CTAs (wgmma); "), std::string::npos) << plan.summary.describe();
  AttentionConfig fp8_half = fp8;
  fp8_half.dtype = DType::kFloat16;
  EXPECT_EQ(plan_for(fp8_half, b, wgmma).summary.prefill_operands, "float16");
  AttentionConfig fp8_capped = fp8;
  fp8_capped.logits_soft_cap = 30.0;
  EXPECT_EQ(plan_for(fp8_capped, b, wgmma).summary.prefill_operands, "");
  EXPECT_EQ(plan_for(c, b, wgmma).summary.prefill_operands, "");
  // Per-token-head: float16 for a float16 model; a bfloat16 model's keeps bfloat16 (its v scales).
  AttentionConfig pth = llama();
  pth.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  EXPECT_EQ(plan_for(pth, b, wgmma).summary.prefill_operands, "");
  pth.dtype = DType::kFloat16;
  EXPECT_EQ(plan_for(pth, b, wgmma).summary.prefill_operands, "float16");
  // Head sizes 64 and 256 with a 16-bit cache: taken, 128 rows per item.
  for (const int64_t d : {64, 256}) {
    AttentionConfig other = llama();
    other.head_size = d;
    plan = plan_for(other, b, wgmma);
    EXPECT_EQ(plan.prefill_variant, kPrefillWgmma) << d;
    EXPECT_EQ(plan.prefill_rows_per_item, 128) << d;
    EXPECT_TRUE(plan.summary.prefill_variant_fallback.empty()) << plan.summary.prefill_variant_fallback;
  }
  // Another head size with a 1-byte cache: the default variant, with the reason.
  AttentionConfig d64 = llama();
  d64.head_size = 64;
  d64.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  plan = plan_for(d64, b, wgmma);
  EXPECT_EQ(plan.prefill_variant, 0);
  EXPECT_NE(plan.summary.describe().find("prefill_variant 3 (wgmma) not taken"), std::string::npos)
      << plan.summary.describe();
  EXPECT_NE(plan.summary.prefill_variant_fallback.find("head size 64 with a 1-byte cache"), std::string::npos)
      << plan.summary.prefill_variant_fallback;
  EXPECT_TRUE(prefill_variant_supported(128, kPrefillWgmma, ElementKind::kBFloat16));
  EXPECT_TRUE(prefill_variant_supported(128, kPrefillWgmma, ElementKind::kFp8E4M3));
  EXPECT_TRUE(prefill_variant_supported(128, kPrefillWgmma, ElementKind::kInt8));
  EXPECT_FALSE(prefill_variant_supported(64, kPrefillWgmma, ElementKind::kFp8E4M3));
  EXPECT_TRUE(prefill_variant_supported(64, kPrefillWgmma, ElementKind::kBFloat16));
  EXPECT_TRUE(prefill_variant_supported(256, kPrefillWgmma, ElementKind::kFloat16));
  EXPECT_FALSE(prefill_variant_supported(256, kPrefillWgmma, ElementKind::kInt8));
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
  EXPECT_GE(s.mixed_items, end_of(s.combine_items, plan.combine.size(), sizeof(CombineItem)));
  ASSERT_FALSE(plan.mixed.empty());  // decode and prefill rows: one mixed grid
  EXPECT_EQ(s.bytes, end_of(s.mixed_items, plan.mixed.size(), sizeof(MixedItem)));
  for (size_t offset : {s.seq_lens, s.block_table, s.generic_items, s.prefill_items, s.decode_items,
                        s.decode_mma_items, s.combine_items, s.mixed_items}) {
    EXPECT_EQ(offset % 16, 0u);
  }
  const std::vector<unsigned char> bytes = stage_plan(plan, c, b);
  ASSERT_EQ(bytes.size(), s.bytes);
  std::vector<DecodeItem> staged(plan.decode_mma.size());
  std::memcpy(staged.data(), bytes.data() + s.decode_mma_items, staged.size() * sizeof(DecodeItem));
  for (size_t i = 0; i < staged.size(); ++i) EXPECT_EQ(staged[i].key_begin, plan.decode_mma[i].key_begin);
  std::vector<MixedItem> staged_mixed(plan.mixed.size());
  std::memcpy(staged_mixed.data(), bytes.data() + s.mixed_items, staged_mixed.size() * sizeof(MixedItem));
  for (size_t i = 0; i < staged_mixed.size(); ++i) {
    EXPECT_EQ(staged_mixed[i].kind, plan.mixed[i].kind);
    EXPECT_EQ(staged_mixed[i].index, plan.mixed[i].index);
    EXPECT_EQ(staged_mixed[i].kv_head, plan.mixed[i].kv_head);
    EXPECT_EQ(staged_mixed[i].head_pass, plan.mixed[i].head_pass);
  }
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
  const AttentionPlan plan = plan_for(c, b);
  const std::string text = describe_plan(plan, c);
  // The one-line summary names the prefill kernel too.
  EXPECT_NE(plan.summary.describe().find("tensor-core prefill path: 64 rows in 16 CTAs (mma.sync, two m-tiles); "),
            std::string::npos)
      << plan.summary.describe();
  for (const char* line : {
           "attention plan: 3 requests, 65 query rows, 132 SMs\n",
           "layer: decoder, dtype bfloat16, kv_cache_dtype auto, heads 32/8, head size 128, block 16, window 0\n",
           "  request 0: query_len 1, tensor-core decode, keys [0, 32768), 32 splits\n",
           "  request 1: query_len 64, tensor-core prefill, 16 CTAs\n",
           "  request 2: query_len 0, padding (no work, nothing written)\n",
           "  tensor-core decode: 1 rows, 32 items of up to 1024 keys, 8 columns per CTA, grid 256 CTAs\n",
           "  combine: 1 split rows, grid 32 CTAs\n",
           "  tensor-core prefill: 64 rows, variant 1 (mma.sync, two m-tiles, 128 rows per CTA), grid 16 CTAs\n",
           "  mixed (the tensor-core prefill and decode CTAs above in one grid, interleaved): grid 272 CTAs (16 "
           "prefill, 256 decode), the combine after it\n",
           "  generic: 0 rows, grid 0 CTAs\n",
           "workspace: upload ",
           "split partials 32 slots = 532480 bytes (32 heads x (128 + 2) floats per slot)\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
}


// --- the mixed grid --------------------------------------------------------------------------------

// The work of a mixed CTA as the planner weighs it: the keys it reads (at least 1).
int64_t mixed_work(const AttentionPlan& plan, const MixedItem& m) {
  const auto span = [](int32_t begin, int32_t end) { return std::max<int64_t>(1, end - begin); };
  if (m.kind == MixedKind::kPrefill) {
    const GenericItem& g = plan.prefill[static_cast<size_t>(m.index)];
    return span(g.key_begin, g.key_end);
  }
  const DecodeItem& d = plan.decode_mma[static_cast<size_t>(m.index)];
  return span(d.key_begin, d.key_end);
}

// Every prefill item once, every CTA of the tensor-core decode grid (item × kv head × pass) once.
void expect_mixed_covers_both_grids(const AttentionPlan& plan, int64_t kv_heads, int64_t passes) {
  const size_t decode_ctas = plan.decode_mma.size() * static_cast<size_t>(kv_heads * passes);
  ASSERT_EQ(plan.mixed.size(), plan.prefill.size() + decode_ctas);
  std::vector<int> prefill_seen(plan.prefill.size(), 0);
  std::vector<int> decode_seen(decode_ctas, 0);
  for (const MixedItem& m : plan.mixed) {
    if (m.kind == MixedKind::kPrefill) {
      ASSERT_GE(m.index, 0);
      ASSERT_LT(static_cast<size_t>(m.index), plan.prefill.size());
      ++prefill_seen[static_cast<size_t>(m.index)];
    } else {
      ASSERT_EQ(m.kind, MixedKind::kDecode);
      ASSERT_GE(m.index, 0);
      ASSERT_LT(static_cast<size_t>(m.index), plan.decode_mma.size());
      ASSERT_GE(m.kv_head, 0);
      ASSERT_LT(m.kv_head, kv_heads);
      ASSERT_GE(m.head_pass, 0);
      ASSERT_LT(m.head_pass, passes);
      const size_t cta = (static_cast<size_t>(m.head_pass) * static_cast<size_t>(kv_heads) +
                          static_cast<size_t>(m.kv_head)) * plan.decode_mma.size() + static_cast<size_t>(m.index);
      ++decode_seen[cta];
    }
  }
  EXPECT_TRUE(std::all_of(prefill_seen.begin(), prefill_seen.end(), [](int n) { return n == 1; }));
  EXPECT_TRUE(std::all_of(decode_seen.begin(), decode_seen.end(), [](int n) { return n == 1; }));
  EXPECT_EQ(plan.summary.mixed_prefill_ctas, static_cast<int64_t>(plan.prefill.size()));
  EXPECT_EQ(plan.summary.mixed_decode_ctas, static_cast<int64_t>(decode_ctas));
}

// The interleaving rule (plan_mixed_order): each kind longest first; the next CTA is of the kind
// that has started the smaller fraction of its own work, ties to prefill.
void expect_mixed_order_rule(const AttentionPlan& plan) {
  double total[2] = {0, 0};
  for (const MixedItem& m : plan.mixed) total[static_cast<int>(m.kind)] += static_cast<double>(mixed_work(plan, m));
  double started[2] = {0, 0};
  size_t left[2] = {static_cast<size_t>(plan.summary.mixed_prefill_ctas),
                    static_cast<size_t>(plan.summary.mixed_decode_ctas)};
  int32_t last_prefill = -1;
  int64_t last_decode_work = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < plan.mixed.size(); ++i) {
    const MixedItem& m = plan.mixed[i];
    const int kind = static_cast<int>(m.kind);
    if (left[0] > 0 && left[1] > 0) {
      const bool prefill_due = started[0] * total[1] <= started[1] * total[0];
      EXPECT_EQ(m.kind, prefill_due ? MixedKind::kPrefill : MixedKind::kDecode) << "CTA " << i;
    }
    const int64_t work = mixed_work(plan, m);
    if (m.kind == MixedKind::kPrefill) {
      EXPECT_GT(m.index, last_prefill) << "prefill items keep their longest-first order";
      last_prefill = m.index;
    } else {
      EXPECT_LE(work, last_decode_work) << "decode CTAs longest first";
      last_decode_work = work;
    }
    started[kind] += static_cast<double>(work);
    --left[kind];
  }
}

// Prefill items are ordered longest key span first; equal spans keep the order they were cut in
// (request, then token block, then head), so the order is a pure function of the batch.
TEST(AttentionPlan, PrefillItemsLongestSpanFirstTiesInCutOrder) {
  for (const int64_t window : {int64_t{0}, int64_t{300}}) {
    const AttentionConfig c = llama(window);
    // Several prompts and chunks: spans repeat within and across requests (windows saturate).
    const AttentionPlan plan =
        plan_for(c, batch_of({{0, 1000}, {4000, 333}, {0, 64}, {96, 1000}, {0, 1000}}, c.block_size));
    ASSERT_GT(plan.prefill.size(), 100u);
    for (size_t i = 1; i < plan.prefill.size(); ++i) {
      const GenericItem& a = plan.prefill[i - 1];
      const GenericItem& b = plan.prefill[i];
      const int64_t span_a = a.key_end - a.key_begin;
      const int64_t span_b = b.key_end - b.key_begin;
      ASSERT_GE(span_a, span_b) << "window " << window << ", items " << i - 1 << " and " << i;
      if (span_a == span_b) {
        EXPECT_LT(std::tie(a.request, a.token_begin, a.head_begin), std::tie(b.request, b.token_begin, b.head_begin))
            << "window " << window << ", items " << i - 1 << " and " << i;
      }
    }
  }
}

// A plan computed into a recycled one (the runner passes its previous plan, to reuse its storage)
// is the plan computed afresh, whatever the recycled plan held.
TEST(AttentionPlan, PlanningIntoARecycledPlanGivesTheFreshPlan) {
  const AttentionConfig c = llama(512);
  std::vector<Req> mixed(64, {4095, 1});
  mixed.push_back({4096, 2048});
  const std::vector<std::vector<Req>> steps = {mixed, {{0, 8192}}, std::vector<Req>(8, {32767, 1}), {{10, 3}}, mixed};
  AttentionPlan recycled;
  for (size_t i = 0; i < steps.size(); ++i) {
    const BatchDescription b = batch_of(steps[i], c.block_size);
    AttentionPlanInput in;
    in.config = &c;
    in.batch = &b;
    in.num_sms = kSms;
    in.hopper_wgmma = true;
    in.routes = route_layer(c, {}, TensorLayoutFacts{});
    const AttentionPlan fresh = plan_attention(in);
    recycled = plan_attention(in, std::move(recycled));
    EXPECT_EQ(stage_plan(recycled, c, b), stage_plan(fresh, c, b)) << "step " << i;
    EXPECT_EQ(describe_plan(recycled, c), describe_plan(fresh, c)) << "step " << i;
    EXPECT_EQ(recycled.partial_slots, fresh.partial_slots) << "step " << i;
    EXPECT_EQ(recycled.requests.size(), fresh.requests.size()) << "step " << i;
  }
}

TEST(AttentionPlan, MixedStepRunsPrefillAndDecodeInOneGrid) {
  const AttentionConfig c = llama();
  std::vector<Req> reqs(64, {4095, 1});
  reqs.push_back({0, 2048});
  const AttentionPlan plan = plan_for(c, batch_of(reqs, c.block_size));
  // 2048 tokens × 4 heads in items of 32 tokens × 4 heads per kv head: 64 × 8 = 512 prefill CTAs;
  // 64 unsplit rows of 4096 keys × 8 kv heads × 1 pass: 512 decode CTAs.
  ASSERT_EQ(plan.prefill.size(), 512u);
  ASSERT_EQ(plan.decode_mma.size(), 64u);
  EXPECT_TRUE(plan.combine.empty());
  expect_mixed_covers_both_grids(plan, 8, 1);
  expect_mixed_order_rule(plan);
  EXPECT_TRUE(plan.summary.mixed());
  EXPECT_TRUE(plan.summary.mixed_fallback.empty());
  // Both kinds start at once and stay mixed: every stretch of 66 CTAs (a quarter of a wave of
  // 2 CTAs on each of 132 SMs) holds both kinds, and both run until the end.
  EXPECT_EQ(plan.mixed[0].kind, MixedKind::kPrefill);
  EXPECT_EQ(plan.mixed[1].kind, MixedKind::kDecode);
  for (size_t start = 0; start + 66 <= plan.mixed.size(); ++start) {
    const auto prefill = std::count_if(plan.mixed.begin() + static_cast<std::ptrdiff_t>(start),
                                       plan.mixed.begin() + static_cast<std::ptrdiff_t>(start + 66),
                                       [](const MixedItem& m) { return m.kind == MixedKind::kPrefill; });
    ASSERT_GT(prefill, 0) << "CTAs " << start << " + 66";
    ASSERT_LT(prefill, 66) << "CTAs " << start << " + 66";
  }
  // The longest prefill items (the causal tail: 2048 keys) open the grid, the shortest close it.
  EXPECT_EQ(plan.prefill[static_cast<size_t>(plan.mixed[0].index)].key_end, 2048);
  const auto last_prefill = std::find_if(plan.mixed.rbegin(), plan.mixed.rend(),
                                         [](const MixedItem& m) { return m.kind == MixedKind::kPrefill; });
  EXPECT_EQ(plan.prefill[static_cast<size_t>(last_prefill->index)].key_end, 32);
  const std::string text = plan.summary.describe();
  EXPECT_NE(text.find("; mixed grid: 1024 CTAs (512 prefill, 512 decode)"), std::string::npos) << text;
}

TEST(AttentionPlan, MixedGridOrderHoldsForSplitRowsAndChunks) {
  const AttentionConfig c = llama();
  // A 2048-token chunk at context 4096 beside 64 decodes, one of them split, and a short prefill.
  std::vector<Req> reqs(63, {4095, 1});
  reqs.push_back({40000, 1});
  reqs.push_back({4096, 2048});
  reqs.push_back({0, 100});
  const AttentionPlan plan = plan_for(c, batch_of(reqs, c.block_size));
  ASSERT_FALSE(plan.combine.empty());
  expect_mixed_covers_both_grids(plan, 8, 1);
  expect_mixed_order_rule(plan);
  // The split row's partial slots and combine items are the separate plan's.
  AttentionPathOverrides separate;
  separate.separate_mixed = true;
  const AttentionPlan apart = plan_for(c, batch_of(reqs, c.block_size), separate);
  EXPECT_TRUE(apart.mixed.empty());
  EXPECT_EQ(apart.summary.mixed_fallback, "separate launches forced");
  ASSERT_EQ(apart.decode_mma.size(), plan.decode_mma.size());
  for (size_t i = 0; i < plan.decode_mma.size(); ++i) {
    EXPECT_EQ(std::memcmp(&apart.decode_mma[i], &plan.decode_mma[i], sizeof(DecodeItem)), 0) << "item " << i;
  }
  ASSERT_EQ(apart.prefill.size(), plan.prefill.size());
  for (size_t i = 0; i < plan.prefill.size(); ++i) {
    EXPECT_EQ(std::memcmp(&apart.prefill[i], &plan.prefill[i], sizeof(GenericItem)), 0) << "item " << i;
  }
  ASSERT_EQ(apart.combine.size(), plan.combine.size());
  EXPECT_EQ(apart.partial_slots, plan.partial_slots);
  const std::string text = apart.summary.describe();
  EXPECT_NE(text.find("; prefill and decode launched separately: separate launches forced"), std::string::npos)
      << text;
}

TEST(AttentionPlan, FewLongPrefillItemsArePacedWithTheDecodes) {
  AttentionConfig c = llama();
  c.num_heads = 8;
  c.num_kv_heads = 8;  // one head per kv head: a 32-token query is one item per kv head
  std::vector<Req> reqs(200, {1023, 1});
  reqs.push_back({30000, 32});
  const AttentionPlan plan = plan_for(c, batch_of(reqs, c.block_size));
  ASSERT_EQ(plan.prefill.size(), 8u);
  ASSERT_EQ(plan.decode_mma.size(), 200u);
  expect_mixed_covers_both_grids(plan, 8, 1);
  expect_mixed_order_rule(plan);
  // Each prefill item is an eighth of its kind's work, each decode CTA 1/1600 of its own: the first
  // prefill item opens the grid and one more starts after every 200 decode CTAs.
  std::vector<size_t> at;
  for (size_t i = 0; i < plan.mixed.size(); ++i) {
    if (plan.mixed[i].kind == MixedKind::kPrefill) at.push_back(i);
  }
  const std::vector<size_t> expected = {0, 201, 402, 603, 804, 1005, 1206, 1407};
  EXPECT_EQ(at, expected);
}

TEST(AttentionPlan, MixedGridOnlyWhereBothBodiesAgree) {
  const std::vector<Req> reqs = {{3000, 1}, {500, 1}, {0, 300}, {64, 40}};
  struct Expect {
    const char* what;
    AttentionConfig config;
    AttentionPathOverrides overrides;
    bool mixed;
    const char* reason;  // in mixed_fallback
  };
  std::vector<Expect> cases;
  cases.push_back({"bf16 D 128", llama(), {}, true, ""});
  {
    AttentionConfig c = llama();
    c.dtype = DType::kFloat16;
    c.head_size = 64;
    cases.push_back({"fp16 D 64", c, {}, true, ""});
  }
  {
    AttentionConfig c = llama(100);
    c.logits_soft_cap = 5.0;
    c.sinks = std::vector<float>(32, 0.5f);
    cases.push_back({"window, soft cap and sinks", c, {}, true, ""});
  }
  {
    AttentionConfig c = llama();
    c.head_size = 256;
    cases.push_back({"D 256 (the decode body runs 2 warps)", c, {}, false, "head size 256"});
  }
  {
    AttentionConfig c = llama();
    c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
    cases.push_back({"1-byte cache", c, {}, false, "kv_cache_dtype fp8_e4m3"});
  }
  {
    AttentionConfig c = llama();
    c.num_kv_heads = 2;  // 16 query heads per kv head: 16 columns per decode CTA
    cases.push_back({"16 columns per decode CTA", c, {}, false, "16 columns per decode CTA"});
  }
  {
    AttentionPathOverrides v0;
    v0.prefill_variant = 0;
    cases.push_back({"another prefill variant", llama(), v0, false, "prefill variant 0"});
  }
  {
    AttentionPathOverrides separate;
    separate.separate_mixed = true;
    cases.push_back({"separate launches forced", llama(), separate, false, "separate launches forced"});
  }
  {
    AttentionPathOverrides simt;
    simt.simt_decode = true;
    cases.push_back({"SIMT decode rows only", llama(), simt, false, ""});
  }
  {
    AttentionPathOverrides generic;
    generic.generic_prefill = true;
    cases.push_back({"generic prefill rows only", llama(), generic, false, ""});
  }
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.what);
    const AttentionPlan plan = plan_for(e.config, batch_of(reqs, e.config.block_size), e.overrides);
    EXPECT_EQ(!plan.mixed.empty(), e.mixed);
    EXPECT_EQ(plan.summary.mixed(), e.mixed);
    EXPECT_NE(plan.summary.mixed_fallback.find(e.reason), std::string::npos) << plan.summary.mixed_fallback;
    if (e.mixed) {
      expect_mixed_covers_both_grids(plan, e.config.num_kv_heads, 1);
      expect_mixed_order_rule(plan);
    } else {
      EXPECT_EQ(plan.summary.mixed_prefill_ctas + plan.summary.mixed_decode_ctas, 0);
    }
  }
  // One kind alone is no mixed step, and says nothing about it.
  for (const std::vector<Req>& alone : {std::vector<Req>{{3000, 1}, {500, 1}}, std::vector<Req>{{0, 300}}}) {
    const AttentionPlan plan = plan_for(llama(), batch_of(alone, 16));
    EXPECT_TRUE(plan.mixed.empty());
    EXPECT_TRUE(plan.summary.mixed_fallback.empty()) << plan.summary.mixed_fallback;
    EXPECT_EQ(plan.summary.describe().find("mixed"), std::string::npos) << plan.summary.describe();
  }
}

TEST(AttentionPlan, MixedGridTakesOnlyTheTensorCoreDecodeRows) {
  // An mm_prefix decode row takes the SIMT decode kernel, launched on its own before the mixed grid.
  const AttentionConfig c = llama(8);  // the window makes the range add keys
  BatchDescription b = batch_of({{50, 1}, {3000, 1}, {0, 200}}, c.block_size);
  b.mm_prefix_range = IntArray({3, 1, 2}, {10, 50, -1, -1, -1, -1});
  const AttentionPlan plan = plan_for(c, b);
  EXPECT_EQ(plan.requests[0].path, RowPath::kDecodeSimt);
  EXPECT_EQ(plan.requests[1].path, RowPath::kDecodeMma);
  EXPECT_EQ(plan.decode.size(), 1u);
  expect_mixed_covers_both_grids(plan, 8, 1);
}

TEST(AttentionPlan, CudaGraphStepsAreNeverMixed) {
  // A captured step is decode-only: no prefill items, so no mixed grid; its lists and capacities
  // are what they were.
  const AttentionConfig c = llama();
  const BatchDescription b = batch_of({{3000, 1}, {500, 1}, {0, 0}}, c.block_size);
  const FixedShapeCapacity f = fixed_shape_capacity(c, {}, b, kSms);
  const AttentionPlan plan = plan_for(c, b, {}, &f);
  EXPECT_TRUE(plan.mixed.empty());
  EXPECT_TRUE(plan.summary.mixed_fallback.empty());
  EXPECT_EQ(static_cast<int64_t>(plan.decode_mma.size()), f.decode_mma_capacity);
  EXPECT_EQ(plan.staging.bytes, plan.staging.mixed_items);  // an empty last array
}

// The wgmma prefill's K/V tile layout (wgmma_kv_tile_offset), against what its readers and writers
// need: every 16-byte chunk of the tile once; a page's keys in one contiguous run (one TMA box); the
// box's rows, written in the map's dimension order (slot % 8, slab, slot / 8) and swizzled by their
// address, land where the layout puts each chunk; the descriptors' strides (8-key groups 16·D
// bytes apart, slabs 1024).
template <int D>
void check_kv_tile_layout() {
  SCOPED_TRACE("head size " + std::to_string(D));
  constexpr int kBn = prefill_wgmma_config(D).bn;
  constexpr int kChunks = D / 8;
  constexpr int kSlabs = D / 64;
  std::vector<int> seen(static_cast<size_t>(kBn * kChunks), 0);
  for (int j = 0; j < kBn; ++j) {
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t at = wgmma_kv_tile_offset<D>(j, c);
      ASSERT_EQ(at % 16, 0u);
      ASSERT_LT(at / 16, seen.size());
      ++seen[at / 16];
      if (j + 8 < kBn) {
        EXPECT_EQ(wgmma_kv_tile_offset<D>(j + 8, c) - at, 16u * D);
      }
      if (c + 8 < kChunks) {
        EXPECT_EQ(wgmma_kv_tile_offset<D>(j, c + 8) - at, 1024u);
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(seen.size())) << "a bijection";
  for (const int block_size : {8, 16, 32, 64, 128}) {
    if (kBn % block_size != 0) continue;
    const uint32_t page_bytes = static_cast<uint32_t>(block_size * D * 2);
    for (int g = 0; g < kBn / block_size; ++g) {
      for (int slot = 0; slot < block_size; ++slot) {
        for (int slab = 0; slab < kSlabs; ++slab) {
          // Row n of page g's box, written at base + 128·n; its 16-byte chunks XOR n % 8 (the
          // address bits 7–9 of a 1024-byte aligned base + 128·n).
          const int n = (slot / 8) * 8 * kSlabs + slab * 8 + slot % 8;
          for (int c = 0; c < 8; ++c) {
            const uint32_t written = g * page_bytes + 128u * n + (static_cast<uint32_t>(c ^ (n % 8)) << 4);
            ASSERT_EQ(written, wgmma_kv_tile_offset<D>(g * block_size + slot, 8 * slab + c))
                << "page " << g << " of " << block_size << ", slot " << slot << ", slab " << slab << ", chunk " << c;
          }
        }
      }
    }
  }
}

TEST(WgmmaKvTileLayout, EveryChunkOncePagesContiguousBoxesLandWhereDescriptorsRead) {
  check_kv_tile_layout<64>();
  check_kv_tile_layout<128>();
  check_kv_tile_layout<256>();
}

}  // namespace
}  // namespace hybridtb::cuda
