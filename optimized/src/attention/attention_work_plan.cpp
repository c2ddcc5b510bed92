// The attention plan (attention_work_plan.h): pure host code. The visibility hulls computed here
// follow hybridtb/spec/visibility.h: a decoder row at position p sees [p − W + 1, p] ∩
// [0, seq_len) plus the mm_prefix ranges that contain p; an encoder row sees |p − k| < W within the
// request.
#include "attention/attention_work_plan.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>

#include "attention/attention_caps.h"
#include "common/element_kind.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb::cuda {

namespace {

int32_t to_i32(int64_t v) { return static_cast<int32_t>(v); }

// Reorders `items` stably by weight(item), largest first, as std::stable_sort would, but sorting
// 4-byte indices (its scratch small enough for the heap to keep between steps; a step's work list
// runs to hundreds of KiB, whose scratch the allocator maps and unmaps on every call) and then
// moving each item once, cycle by cycle. A list already in that order is left as it is.
template <typename Item, typename Weight>
void order_by_weight_descending(std::vector<Item>& items, Weight weight) {
  const auto heavier = [&](const Item& a, const Item& b) { return weight(a) > weight(b); };
  if (std::is_sorted(items.begin(), items.end(), heavier)) return;
  std::vector<int64_t> weights(items.size());
  std::vector<uint32_t> order(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    weights[i] = weight(items[i]);
    order[i] = static_cast<uint32_t>(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return weights[a] > weights[b]; });
  // items[i] ← items[order[i]], one cycle of the permutation at a time; a placed slot gets order[j] = j.
  for (size_t start = 0; start < items.size(); ++start) {
    if (order[start] == start) continue;
    Item first = items[start];
    size_t j = start;
    while (order[j] != start) {
      const size_t from = order[j];
      items[j] = items[from];
      order[j] = static_cast<uint32_t>(j);
      j = from;
    }
    items[j] = first;
    order[j] = static_cast<uint32_t>(j);
  }
}

struct KeyRange {
  int32_t key_begin, key_end, causal_begin, causal_end;
};

// Keys that rows at positions [pos_lo, pos_hi] of request r may see.
KeyRange key_range(const AttentionConfig& config, const BatchDescription& batch, int64_t r, int64_t pos_lo,
                   int64_t pos_hi) {
  const int64_t seq_len = batch.seq_len(r);
  const int64_t w = config.sliding_window;
  const bool encoder = config.attn_type == AttnType::kEncoderOnly;
  const int64_t causal_begin = spec::window_first_key(w, pos_lo);
  const int64_t causal_end = std::min(seq_len, spec::window_key_end(encoder, w, seq_len, pos_hi));
  int64_t begin = causal_begin;
  int64_t end = causal_end;
  if (config.attn_type == AttnType::kDecoder && batch.mm_prefix_range) {
    const IntArray& mm = *batch.mm_prefix_range;
    const int64_t m = mm.size(1);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t start = mm.values[static_cast<size_t>((r * m + i) * 2)];
      const int64_t stop = mm.values[static_cast<size_t>((r * m + i) * 2 + 1)];
      if (start < stop && start <= pos_hi && stop >= pos_lo) {
        begin = std::min(begin, std::max<int64_t>(0, start));
        end = std::max(end, std::min(stop + 1, seq_len));
      }
    }
  }
  if (end <= begin) begin = end = causal_begin;
  return {to_i32(begin), to_i32(end), to_i32(causal_begin), to_i32(causal_end)};
}

std::string decode_mma_reason(const AttentionConfig& c, const AttentionPathOverrides& overrides, bool decode_ok) {
  if (!decode_ok) return "no decode path";
  if (overrides.simt_decode) return "tensor-core decode disabled";
  const ElementKind kv = element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  if (!decode_mma_supported(element_kind(c.dtype), kv, c.head_size)) {
    return detail::concat("kv_cache_dtype ", to_string(c.kv_cache_dtype), " / dtype ", to_string(c.dtype),
                          " (needs a float16/bfloat16 model with an auto or 1-byte cache)");
  }
  return "";
}

// The work of one planning pass before the decode rows are split: consecutive query rows of one
// request that share the decode CTAs (a short query's tokens packed into the tensor-core decode's
// columns; one row otherwise), with the union of their keys.
struct DecodeRow {
  int64_t request;
  int64_t token;   // the global query row of the first
  int64_t tokens;  // query rows token … token + tokens − 1
  KeyRange range;
  size_t route;    // index into AttentionPlan::requests
};
struct RoutedRows {
  std::vector<DecodeRow> simt;
  std::vector<DecodeRow> mma;
  static int64_t count(const std::vector<DecodeRow>& rows) {
    int64_t n = 0;
    for (const DecodeRow& row : rows) n += row.tokens;
    return n;
  }
};

// Query rows of one request that one tensor-core decode CTA of `columns` MMA columns packs: every
// row brings the kv head's qpk query heads.
int64_t decode_mma_tokens_per_cta(int64_t columns, int64_t qpk) { return qpk <= columns ? columns / qpk : 1; }

// The tensor-core decode's MMA columns per CTA: the query heads of a kv head (8, or 16 where more
// than 8 share one at D ≤ 128: decode_mma_heads_per_pass), or 16 where the step has a short query
// whose tokens 16 columns pack more of than 8 (Llama-3's 4 heads per kv head: a speculative step's
// 4 query rows read the request's keys once instead of twice; every CTA of the step then computes
// 16 columns, and a step with prefill items runs them apart, the mixed grid taking 8).
int decode_mma_columns(const AttentionPlanInput& in) {
  const AttentionConfig& c = *in.config;
  const int64_t qpk = c.num_queries_per_kv();
  const int columns = decode_mma_heads_per_pass(qpk, c.head_size);
  if (columns != 8 || c.head_size > 128 || in.overrides.short_queries_as_prefill) return columns;
  int64_t widest = 1;  // the longest short query
  for (int64_t r = 0; r < in.batch->num_reqs(); ++r) {
    const int64_t q = in.batch->query_len(r);
    if (q <= kDecodeRowsMaxQueryLen) widest = std::max(widest, q);
  }
  const auto packed = [&](int64_t cols) { return std::min(widest, decode_mma_tokens_per_cta(cols, qpk)); };
  return packed(16) > packed(8) ? 16 : 8;
}

// Items of `q_len` rows of request r cut into tiles of `tokens` × `heads` (token, head) rows.
void append_row_items(const AttentionConfig& c, const BatchDescription& batch, int64_t r, int64_t tokens,
                      int64_t heads, std::vector<GenericItem>& items) {
  const int64_t q_len = batch.query_len(r);
  const int64_t context_len = batch.seq_len(r) - q_len;
  const int64_t qpk = c.num_queries_per_kv();
  for (int64_t tb = 0; tb < q_len; tb += tokens) {
    const int64_t nt = std::min(tokens, q_len - tb);
    const KeyRange range = key_range(c, batch, r, context_len + tb, context_len + tb + nt - 1);
    for (int64_t kvh = 0; kvh < c.num_kv_heads; ++kvh) {
      for (int64_t hb = 0; hb < qpk; hb += heads) {
        const int64_t nh = std::min(heads, qpk - hb);
        items.push_back({to_i32(r), to_i32(tb), to_i32(nt), to_i32(kvh * qpk + hb), to_i32(nh), range.key_begin,
                         range.key_end, range.causal_begin, range.causal_end});
      }
    }
  }
}

void check_request(const AttentionConfig& c, const BatchDescription& batch, int64_t r) {
  const int64_t q_len = batch.query_len(r);
  const int64_t start = batch.query_start_loc[r];
  HYBRIDTB_CHECK(q_len >= 0 && start >= 0 && start + q_len <= batch.num_actual_tokens, "request ", r,
                 ": query rows [", start, ", ", start + q_len, ") must lie within num_actual_tokens (",
                 batch.num_actual_tokens, ")");
  HYBRIDTB_CHECK(batch.seq_len(r) >= q_len, "request ", r, ": seq_len (", batch.seq_len(r), ") < query_len (", q_len,
                 ")");
  HYBRIDTB_CHECK(c.attn_type != AttnType::kEncoderOnly || batch.seq_len(r) == q_len, "request ", r,
                 ": encoder_only needs seq_len (", batch.seq_len(r), ") == query_len (", q_len, ")");
}

// Routes every request (attention_work_plan.h) and fills the prefill and generic work lists; the
// decode rows come back unsplit.
RoutedRows route_requests(const AttentionPlanInput& in, AttentionPlan& plan) {
  const AttentionConfig& c = *in.config;
  const BatchDescription& batch = *in.batch;
  const LayerRoutes& routes = in.routes;
  const int64_t qpk = c.num_queries_per_kv();
  const int64_t generic_tokens = qpk >= 32 ? 1 : 32 / qpk;
  const int64_t generic_heads = std::min<int64_t>(qpk, 32);
  const int64_t prefill_heads = std::min<int64_t>(qpk, plan.prefill_rows_per_item);
  const int64_t prefill_tokens = std::max<int64_t>(1, plan.prefill_rows_per_item / prefill_heads);
  RoutedRows rows;
  for (int64_t r = 0; r < batch.num_reqs(); ++r) {
    check_request(c, batch, r);
    const int64_t q_len = batch.query_len(r);
    RequestRoute route;
    route.request = r;
    route.query_len = q_len;
    if (q_len == 0) {  // a padding request
      plan.requests.push_back(route);
      continue;
    }
    const bool short_query = q_len <= kDecodeRowsMaxQueryLen && !in.overrides.short_queries_as_prefill;
    if (routes.decode_ok && (q_len == 1 || short_query)) {
      // One decode row per query token, all on one kernel: the tensor-core decode unless an mm_prefix
      // range widens some row's keys past its causal interval; there a short query's rows share CTAs
      // (decode_mma_tokens_per_cta), on the SIMT decode each row has its own.
      const int64_t context_len = batch.seq_len(r) - q_len;
      const auto row_keys = [&](int64_t i) { return key_range(c, batch, r, context_len + i, context_len + i); };
      bool mm_free = true;
      for (int64_t i = 0; i < q_len; ++i) {
        const KeyRange range = row_keys(i);
        mm_free = mm_free && range.key_begin == range.causal_begin && range.key_end == range.causal_end;
        route.key_begin = i == 0 ? range.key_begin : std::min<int64_t>(route.key_begin, range.key_begin);
        route.key_end = i == 0 ? range.key_end : std::max<int64_t>(route.key_end, range.key_end);
      }
      const bool on_mma = routes.decode_mma_why.empty() && mm_free;
      if (routes.decode_mma_why.empty() && !mm_free) {
        plan.summary.decode_fallback = "mm_prefix ranges widen the visible keys";
      }
      route.path = on_mma ? RowPath::kDecodeMma : RowPath::kDecodeSimt;
      std::vector<DecodeRow>& list = on_mma ? rows.mma : rows.simt;
      const int64_t pack = on_mma ? decode_mma_tokens_per_cta(plan.mma_columns, qpk) : 1;
      for (int64_t i = 0; i < q_len; i += pack) {
        const int64_t n = std::min(pack, q_len - i);
        const KeyRange keys = key_range(c, batch, r, context_len + i, context_len + i + n - 1);
        list.push_back({r, batch.query_start_loc[r] + i, n, keys, plan.requests.size()});
      }
      plan.requests.push_back(route);
      continue;
    }
    const bool prefill = routes.prefill_why.empty();
    std::vector<GenericItem>& items = prefill ? plan.prefill : plan.generic;
    const size_t before = items.size();
    append_row_items(c, batch, r, prefill ? prefill_tokens : generic_tokens, prefill ? prefill_heads : generic_heads,
                     items);
    route.path = prefill ? RowPath::kPrefillMma : RowPath::kGeneric;
    route.splits = static_cast<int64_t>(items.size() - before);
    (prefill ? plan.summary.prefill_rows : plan.summary.generic_rows) += q_len;
    plan.requests.push_back(route);
  }
  return rows;
}

// Cuts each decode row's keys into splits for a kernel whose grid has `passes` head passes per kv
// head (DecodeSplitPolicy: the chunk is the power of two that gives about ctas_per_sm CTAs per SM,
// within [min_keys, max_keys]); a row of n keys takes ceil(n / chunk) splits of equal length
// (rounded up to 64 keys, the last one shorter), so no split is a short remainder. Numbers the
// partial slots from next_slot on (a packed row's query rows one after the other, each its splits'
// slots) and adds a combine item for every split query row. Returns the chunk (0 without rows).
int64_t split_decode_rows(const AttentionPlanInput& in, const std::vector<DecodeRow>& rows, int64_t passes,
                          const DecodeSplitPolicy& policy, std::vector<DecodeItem>& items, int32_t& next_slot,
                          AttentionPlan& plan) {
  if (rows.empty()) return 0;
  HYBRIDTB_CHECK(policy.ctas_per_sm >= 1 && policy.min_keys >= 64 && policy.min_keys <= policy.max_keys &&
                     std::has_single_bit(static_cast<uint64_t>(policy.min_keys)) &&
                     std::has_single_bit(static_cast<uint64_t>(policy.max_keys)),
                 "decode split policy: ctas_per_sm ", policy.ctas_per_sm, " must be at least 1 and min_keys ",
                 policy.min_keys, " ≤ max_keys ", policy.max_keys, " powers of two from 64");
  int64_t total_keys = 0;
  for (const DecodeRow& row : rows) total_keys += row.range.key_end - row.range.key_begin;
  const int64_t target_ctas = std::max<int64_t>(1, policy.ctas_per_sm * in.num_sms);
  const int64_t wanted = (total_keys * in.config->num_kv_heads * passes + target_ctas - 1) / target_ctas;
  int64_t chunk = 64;
  while (chunk < wanted) chunk *= 2;
  chunk = std::clamp<int64_t>(chunk, policy.min_keys, policy.max_keys);
  for (const DecodeRow& row : rows) {
    const int64_t n = row.range.key_end - row.range.key_begin;
    const int64_t splits = std::max<int64_t>(1, (n + chunk - 1) / chunk);
    const int64_t length = ((n + splits - 1) / splits + 63) / 64 * 64;  // ≤ chunk; (splits − 1)·length < n
    const int32_t token = to_i32(row.token);
    for (int64_t s = 0; s < splits; ++s) {
      const int64_t kb = row.range.key_begin + s * length;
      const int64_t ke = std::min<int64_t>(row.range.key_end, kb + length);
      items.push_back({to_i32(row.request), token, to_i32(kb), to_i32(ke), row.range.causal_begin,
                       row.range.causal_end, to_i32(splits), splits > 1 ? next_slot + to_i32(s) : 0,
                       to_i32(row.tokens)});
    }
    plan.requests[row.route].splits += splits;  // summed over a short query's rows
    if (splits > 1) {
      for (int64_t j = 0; j < row.tokens; ++j) {
        plan.combine.push_back({to_i32(row.token + j), next_slot, to_i32(splits), 0});
        next_slot += to_i32(splits);
      }
      plan.summary.split_rows += row.tokens;
    }
  }
  return chunk;
}

// Fixed-shape mode: the work lists padded to the capacities with items the kernels skip; the
// partial slots get the whole capacity, so the buffers (and the captured pointers) never change.
void pad_to_capacity(const FixedShapeCapacity& f, AttentionPlan& plan, int32_t& next_slot) {
  HYBRIDTB_CHECK(static_cast<int64_t>(plan.decode.size()) <= f.decode_capacity &&
                     static_cast<int64_t>(plan.decode_mma.size()) <= f.decode_mma_capacity,
                 "CUDA graph: the step needs ", plan.decode.size(), " SIMT and ", plan.decode_mma.size(),
                 " tensor-core decode items, the graph holds ", f.decode_capacity, " and ", f.decode_mma_capacity,
                 " (internal error: the capacity bound of fix_shape() does not hold)");
  const DecodeItem unused_item{-1, 0, 0, 0, 0, 0, 0, 0, 0};
  plan.decode.resize(static_cast<size_t>(f.decode_capacity), unused_item);
  plan.decode_mma.resize(static_cast<size_t>(f.decode_mma_capacity), unused_item);
  plan.combine.resize(static_cast<size_t>(f.num_reqs), CombineItem{-1, 0, 0, 0});
  next_slot = to_i32(f.decode_capacity + f.decode_mma_capacity);
}

// Why the tensor-core prefill and decode items of a step that has both do not share one grid of
// the mixed kernel ("" if they do).
std::string mixed_reason(const AttentionPlanInput& in, const AttentionPlan& plan) {
  const AttentionConfig& c = *in.config;
  if (in.overrides.separate_mixed) return "separate launches forced";
  const ElementKind q_kind = element_kind(c.dtype);
  const ElementKind kv_kind = element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  if (mixed_supported(q_kind, kv_kind, c.head_size, plan.mma_columns, plan.prefill_variant)) return "";
  return detail::concat("kv_cache_dtype ", to_string(c.kv_cache_dtype), ", head size ", c.head_size, ", ",
                        plan.mma_columns, " columns per decode CTA, prefill variant ", plan.prefill_variant,
                        " (the mixed kernel takes a 16-bit cache of the model dtype, D 64/128, 8 columns per decode "
                        "CTA, the default variant)");
}

// A step's tensor-core prefill work and its tensor-core decode reads: the prefill items' FLOPs (tokens
// × heads × key span × 4·D: Q·Kᵀ and P·V, the causal triangle of each item counted whole) and the
// bytes of K and V the decode CTAs read (keys × kv heads × 2·D × the cache element's bytes).
struct PrefillDecodeBalance {
  double prefill_flops = 0.0;
  double decode_bytes = 0.0;
  double flops_per_byte() const { return decode_bytes > 0.0 ? prefill_flops / decode_bytes : 0.0; }
};
PrefillDecodeBalance prefill_decode_balance(const AttentionPlan& plan, const AttentionConfig& c) {
  PrefillDecodeBalance b;
  const double d = static_cast<double>(c.head_size);
  for (const GenericItem& g : plan.prefill) {
    b.prefill_flops += 4.0 * d * g.num_tokens * g.num_heads * (g.key_end - g.key_begin);
  }
  const ElementKind kv_kind = element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  const double key_bytes = 2.0 * d * (is_byte_element(kv_kind) ? 1.0 : 2.0) * static_cast<double>(c.num_kv_heads);
  for (const DecodeItem& item : plan.decode_mma) {
    if (item.request >= 0) b.decode_bytes += key_bytes * (item.key_end - item.key_begin);
  }
  return b;
}

// The mixed kernel's CTA order. Each kind longest first: the prefill items in their order (sorted
// by key span), the tensor-core decode grid's CTAs (items × kv heads × head passes, in the decode
// kernel's block order: item fastest) stably sorted by key span. The two are merged so that both
// kinds advance through their own work at the same pace: the next CTA is of the kind that has
// started the smaller fraction of its total work, a CTA's work being the keys it reads (at least
// 1; ties go to prefill). Why this rule:
//   - the block scheduler hands out CTAs in index order as slots free, so every stretch of the
//     order is what the SMs run together; with both kinds in each stretch in the ratio of their
//     work, each SM's slots hold compute-bound prefill CTAs beside bandwidth-bound decode CTAs for
//     the whole grid, instead of one kind's waves after the other's;
//   - both kinds reach their last CTAs together, so neither tail runs alone at the end, and the
//     shortest CTAs of both kinds fill the last wave;
//   - the first CTA of each kind starts at once, so one long item (a short chunk at a long
//     context) is never left for the end. Several long prefill items are paced across the decode
//     CTAs, as the rule compares no times across kinds: each then follows part of the decode work,
//     where separate launches put all of it before every prefill item.
// The fractions are compared as cross products in double (exact below 2^53, deterministic
// above): the order is a pure function of the plan.
void plan_mixed_order(AttentionPlan& plan, int64_t kv_heads, int64_t passes) {
  struct Cta {
    MixedItem item;
    int64_t work;
  };
  std::vector<Cta> prefill;
  prefill.reserve(plan.prefill.size());
  for (size_t i = 0; i < plan.prefill.size(); ++i) {
    const GenericItem& g = plan.prefill[i];
    prefill.push_back({{MixedKind::kPrefill, to_i32(static_cast<int64_t>(i)), 0, 0},
                       std::max<int64_t>(1, g.key_end - g.key_begin)});
  }
  std::vector<Cta> decode;
  decode.reserve(plan.decode_mma.size() * static_cast<size_t>(kv_heads * passes));
  for (int64_t z = 0; z < passes; ++z) {
    for (int64_t y = 0; y < kv_heads; ++y) {
      for (size_t i = 0; i < plan.decode_mma.size(); ++i) {
        const DecodeItem& d = plan.decode_mma[i];
        decode.push_back({{MixedKind::kDecode, to_i32(static_cast<int64_t>(i)), to_i32(y), to_i32(z)},
                          std::max<int64_t>(1, d.key_end - d.key_begin)});
      }
    }
  }
  order_by_weight_descending(decode, [](const Cta& cta) { return cta.work; });
  const auto total = [](const std::vector<Cta>& ctas) {
    int64_t sum = 0;
    for (const Cta& c : ctas) sum += c.work;
    return static_cast<double>(sum);
  };
  const double prefill_total = total(prefill);
  const double decode_total = total(decode);
  plan.mixed.clear();
  plan.mixed.reserve(prefill.size() + decode.size());
  size_t p = 0;
  size_t d = 0;
  double prefill_started = 0;  // work of the CTAs placed so far, per kind
  double decode_started = 0;
  while (p < prefill.size() || d < decode.size()) {
    // prefill_started / prefill_total ≤ decode_started / decode_total → a prefill CTA next.
    const bool take_prefill =
        d == decode.size() || (p < prefill.size() && prefill_started * decode_total <= decode_started * prefill_total);
    if (take_prefill) {
      plan.mixed.push_back(prefill[p].item);
      prefill_started += static_cast<double>(prefill[p++].work);
    } else {
      plan.mixed.push_back(decode[d].item);
      decode_started += static_cast<double>(decode[d++].work);
    }
  }
  plan.summary.mixed_prefill_ctas = static_cast<int64_t>(prefill.size());
  plan.summary.mixed_decode_ctas = static_cast<int64_t>(decode.size());
}

// The upload's layout: each array at a 16-byte boundary after the previous one.
struct Cursor {
  size_t bytes = 0;
  size_t place(size_t count, size_t element) {
    const size_t offset = (bytes + 15) / 16 * 16;
    bytes = offset + count * element;
    return offset;
  }
};

void lay_out_staging(const AttentionPlanInput& in, AttentionPlan& plan) {
  const BatchDescription& batch = *in.batch;
  const int64_t r_count = batch.num_reqs();
  plan.block_table_stride = batch.block_table.rank() == 2 ? batch.block_table.size(1) : 0;
  if (in.fixed != nullptr && batch.block_table.size(1) < in.fixed->block_columns) {
    plan.block_table_stride = in.fixed->block_columns;  // the captured stride
  }
  if (batch.mm_prefix_range && in.config->attn_type != AttnType::kEncoderOnly) {
    const IntArray& mm = *batch.mm_prefix_range;
    HYBRIDTB_CHECK(mm.rank() == 3 && mm.size(0) == r_count && mm.size(2) == 2,
                   "mm_prefix_range must have shape [num_reqs, M, 2], got ", mm.describe());
    plan.num_mm_ranges = to_i32(mm.size(1));
  }
  StagingLayout& s = plan.staging;
  Cursor cursor;
  s.query_start_loc = cursor.place(batch.query_start_loc.values.size(), sizeof(int32_t));
  s.seq_lens = cursor.place(batch.seq_lens.values.size(), sizeof(int32_t));
  s.block_table = cursor.place(static_cast<size_t>(r_count * plan.block_table_stride), sizeof(int32_t));
  if (batch.mm_prefix_range && in.config->attn_type != AttnType::kEncoderOnly) {
    s.mm_prefix = cursor.place(batch.mm_prefix_range->values.size(), sizeof(int32_t));
  }
  s.generic_items = cursor.place(plan.generic.size(), sizeof(GenericItem));
  s.prefill_items = cursor.place(plan.prefill.size(), sizeof(GenericItem));
  s.decode_items = cursor.place(plan.decode.size(), sizeof(DecodeItem));
  s.decode_mma_items = cursor.place(plan.decode_mma.size(), sizeof(DecodeItem));
  s.combine_items = cursor.place(plan.combine.size(), sizeof(CombineItem));
  s.mixed_items = cursor.place(plan.mixed.size(), sizeof(MixedItem));
  s.bytes = cursor.bytes;
}

void check_engine_metadata(const TritonAttentionMetadata& m, const BatchDescription& batch) {
  const auto same = [](const char* field, int64_t metadata, int64_t from_batch) {
    HYBRIDTB_CHECK(metadata == from_batch, "attention metadata: ", field, " is ", metadata, ", the batch has ",
                   from_batch, " (metadata of another step?)");
  };
  same("num_actual_tokens", m.num_actual_tokens, batch.num_actual_tokens);
  same("max_query_len", m.max_query_len, batch.max_query_len());
  same("max_seq_len", m.max_seq_len, batch.max_seq_len());
}

// The prefill variant asked for, else the default: on Hopper the wgmma kernel where it takes the
// layer and `hopper_default` allows it, else prefill_default_variant.
void choose_prefill_variant(const AttentionPlanInput& in, bool hopper_default, AttentionPlan& plan) {
  const int variant = in.overrides.prefill_variant;
  const int64_t d = in.config->head_size;
  HYBRIDTB_CHECK(variant >= -1 && variant < prefill_num_variants(), "prefill_variant ", variant,
                 " is not one of -1 (default) … ", prefill_num_variants() - 1);
  plan.prefill_variant = variant >= 0 ? variant : prefill_default_variant(d);
  const AttentionConfig& c = *in.config;
  const ElementKind kv_kind = c.attn_type == AttnType::kEncoderOnly
                                  ? element_kind(c.dtype)
                                  : element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  if (variant < 0 && hopper_default && in.hopper_wgmma && prefill_wgmma_built() && in.routes.prefill_why.empty() &&
      prefill_wgmma_unsupported(d, kv_kind).empty()) {
    plan.prefill_variant = kPrefillWgmma;
  }
  if (variant == kPrefillWgmma) {
    HYBRIDTB_CHECK(prefill_wgmma_built(), "prefill_variant 3 (wgmma) is not available: this build has no sm_90a code "
                   "(configure with 90 in CMAKE_CUDA_ARCHITECTURES)");
    // A layer the wgmma kernel does not take runs the default variant, and the summary says why.
    const std::string why = prefill_wgmma_unsupported(d, kv_kind);
    if (!why.empty()) {
      plan.prefill_variant = prefill_default_variant(d);
      plan.summary.prefill_variant_fallback = detail::concat("prefill_variant 3 (wgmma) not taken: ", why,
                                                             "; variant ", plan.prefill_variant, " instead");
    }
  }
  HYBRIDTB_CHECK(!in.routes.prefill_why.empty() || prefill_variant_supported(d, plan.prefill_variant, kv_kind),
                 "prefill_variant ", plan.prefill_variant, " is not instantiated for head size ", d,
                 " with kv_cache_dtype ", to_string(c.kv_cache_dtype));
  plan.prefill_rows_per_item = prefill_rows_per_item(d, plan.prefill_variant);
}

void finish_summary(const AttentionPlanInput& in, const RoutedRows& rows, AttentionPlan& plan) {
  AttentionPlanSummary& s = plan.summary;
  const size_t simt_items = static_cast<size_t>(std::count_if(plan.decode.begin(), plan.decode.end(),
                                                              [](const DecodeItem& i) { return i.request >= 0; }));
  const size_t mma_items = static_cast<size_t>(std::count_if(plan.decode_mma.begin(), plan.decode_mma.end(),
                                                             [](const DecodeItem& i) { return i.request >= 0; }));
  s.decode_rows = RoutedRows::count(rows.simt) + RoutedRows::count(rows.mma);
  s.decode_ctas = static_cast<int64_t>(simt_items + mma_items);
  s.decode_mma_rows = RoutedRows::count(rows.mma);
  s.decode_mma_ctas = static_cast<int64_t>(mma_items);
  if (!rows.simt.empty() && s.decode_fallback.empty()) s.decode_fallback = in.routes.decode_mma_why;
  const AttentionConfig& c = *in.config;
  const bool byte_cache = is_byte_element(element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype)));
  const bool model_half = c.dtype == DType::kFloat16;
  if (!rows.mma.empty() && decode_float16_products(byte_cache, is_per_token_head(c.kv_cache_dtype), model_half)) {
    s.decode_operands = model_half ? "float16" : "float16 (query heads rescaled by powers of two)";
  }
  s.generic_items = static_cast<int64_t>(plan.generic.size());
  s.prefill_items = static_cast<int64_t>(plan.prefill.size());
  if (s.generic_rows > 0) s.prefill_fallback = in.routes.prefill_why;
}

}  // namespace

// --- capabilities (must agree with attention_inst_decode.cuh / attention_inst_prefill.cuh /
// decode_mma_kernel.cuh) -----------------------------------------------------------------------
bool decode_supported(ElementKind kv_kind, int64_t head_size) {
  const bool kind_ok = kv_kind != ElementKind::kFloat32;
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

int decode_heads_per_pass(int64_t queries_per_kv) {
  if (queries_per_kv <= 1) return 1;
  if (queries_per_kv <= 4) return 4;
  return 8;
}

bool decode_mma_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size) {
  const bool model_ok = q_kind == ElementKind::kFloat16 || q_kind == ElementKind::kBFloat16;
  const bool kind_ok = model_ok && (kv_kind == q_kind || is_byte_element(kv_kind));
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

int decode_mma_heads_per_pass(int64_t queries_per_kv, int64_t head_size) {
  return queries_per_kv <= 8 || head_size > 128 ? 8 : 16;
}

bool prefill_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size) {
  const bool model_ok = q_kind == ElementKind::kFloat16 || q_kind == ElementKind::kBFloat16;
  const bool kind_ok = model_ok && (kv_kind == q_kind || is_byte_element(kv_kind));
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

bool mixed_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size, int decode_columns,
                     int prefill_variant) {
  const bool model_ok = q_kind == ElementKind::kFloat16 || q_kind == ElementKind::kBFloat16;
  return model_ok && kv_kind == q_kind && (head_size == 64 || head_size == 128) && decode_columns == 8 &&
         prefill_variant == prefill_default_variant(head_size);
}

int prefill_num_variants() { return kPrefillVariants; }
bool prefill_variant_supported(int64_t head_size, int variant, ElementKind kv_kind) {
  if (variant == kPrefillWgmma) return prefill_wgmma_built() && prefill_wgmma_unsupported(head_size, kv_kind).empty();
  if (is_byte_element(kv_kind)) return variant == prefill_default_variant(head_size);
  return variant == kPrefillOneMTile || (head_size == 128 && variant >= 0 && variant < kPrefillVariants);
}
bool prefill_wgmma_built() {
#if defined(HYBRIDTB_PREFILL_WGMMA)
  return true;
#else
  return false;
#endif
}
std::string prefill_wgmma_unsupported(int64_t head_size, ElementKind kv_kind) {
  // Every cache the tensor-core prefill takes at head size 128: 16-bit of the model dtype, or 1-byte
  // (fp8 e4m3 / e5m2 per tensor, int8 / fp8 per token-head), cast by the kernel's producer warpgroup;
  // at head sizes 64 and 256 the 16-bit caches only (the producer's casting pass is laid out for
  // 128-byte key rows, and at D 256 Q, two 16-bit stages and the raw ring exceed 227 KiB).
  if (head_size != 64 && head_size != 128 && head_size != 256) {
    return detail::concat("head size ", head_size, " (it takes 64, 128 and 256)");
  }
  if (head_size != 128 && is_byte_element(kv_kind)) {
    return detail::concat("head size ", head_size, " with a 1-byte cache (it takes 1-byte caches at head size 128)");
  }
  return "";
}
int64_t prefill_rows_per_item(int64_t head_size, int variant) {
  return prefill_rows(static_cast<int>(head_size), variant);
}

// --- routing -----------------------------------------------------------------------------------
LayerRoutes route_layer(const AttentionConfig& c, const AttentionPathOverrides& overrides,
                        const TensorLayoutFacts& facts) {
  const bool encoder = c.attn_type == AttnType::kEncoderOnly;
  const ElementKind q_kind = element_kind(c.dtype);
  const ElementKind kv_kind = element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  LayerRoutes routes;
  routes.decode_ok =
      !encoder && !overrides.force_generic && decode_supported(kv_kind, c.head_size) && facts.cache_vectorisable;
  if (overrides.force_generic || overrides.generic_prefill) {
    routes.prefill_why = "forced generic";
  } else if (!prefill_supported(q_kind, encoder ? q_kind : kv_kind, c.head_size)) {
    routes.prefill_why =
        detail::concat("dtype ", to_string(c.dtype), ", kv_cache_dtype ", to_string(c.kv_cache_dtype), ", head size ",
                       c.head_size, " (needs float16/bfloat16 with an auto or 1-byte cache, D 64/128/256)");
  } else if (!facts.rows_aligned) {
    routes.prefill_why = "query/output/cache rows not 16-byte aligned";
  }
  routes.decode_mma_why = decode_mma_reason(c, overrides, routes.decode_ok);
  return routes;
}

LayerRoutes route_graph_step(const AttentionConfig& c, const AttentionPathOverrides& overrides) {
  LayerRoutes routes;
  routes.decode_ok = true;
  routes.prefill_why = "a CUDA-graph decode step";
  routes.decode_mma_why = decode_mma_reason(c, overrides, true);
  return routes;
}

FixedShapeCapacity fixed_shape_capacity(const AttentionConfig& c, const AttentionPathOverrides& overrides,
                                        const BatchDescription& batch, int num_sms) {
  if (c.attn_type == AttnType::kEncoderOnly) {
    throw NotSupported("CUDA-graph capture of encoder_only layers (decode steps only)");
  }
  const ElementKind kv_kind = element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype));
  if (overrides.force_generic || !decode_supported(kv_kind, c.head_size)) {
    throw NotSupported(detail::concat("CUDA-graph capture needs the decode kernels, which do not take kv_cache_dtype ",
                                      to_string(c.kv_cache_dtype), " with dtype ", to_string(c.dtype), " and head size ",
                                      c.head_size, " (they take 16-bit and 1-byte caches, D 64/128/256)"));
  }
  const int64_t r_count = batch.num_reqs();
  for (int64_t r = 0; r < r_count; ++r) {
    if (batch.query_len(r) > 1) {
      throw NotSupported(detail::concat("CUDA-graph capture of a step with prefill or speculative rows (request ", r,
                                        " has ", batch.query_len(r), " query tokens; decode steps only)"));
    }
  }
  HYBRIDTB_CHECK(batch.block_table.rank() == 2 && batch.block_table.size(0) >= r_count,
                 "block_table must have one row per request, got ", batch.block_table.describe());
  FixedShapeCapacity f;
  f.num_reqs = r_count;
  f.block_columns = batch.block_table.size(1);
  f.mm_prefix = batch.mm_prefix_range.has_value();
  f.mm_ranges = f.mm_prefix && batch.mm_prefix_range->rank() == 3 ? batch.mm_prefix_range->size(1) : 0;
  // Items of one decode kernel for any batch of this shape (split_decode_rows): with chunk ≥
  // total_keys·hkv·passes / target (or the maximum chunk), Σ ceil(n_i / chunk) ≤ rows +
  // target / (hkv·passes) + max_keys / policy.max_keys.
  const int64_t qpk = c.num_queries_per_kv();
  const int64_t max_keys = r_count * f.block_columns * c.block_size;
  const auto capacity = [&](int64_t heads_per_pass, const DecodeSplitPolicy& policy) {
    const int64_t passes = (qpk + heads_per_pass - 1) / heads_per_pass;
    const int64_t per_head_pass = c.num_kv_heads * passes;
    const int64_t target = std::max<int64_t>(1, policy.ctas_per_sm * num_sms);
    return r_count + (target + per_head_pass - 1) / per_head_pass + (max_keys + policy.max_keys - 1) / policy.max_keys +
           1;
  };
  const bool mma = decode_mma_reason(c, overrides, true).empty();
  if (mma) {
    f.decode_mma_capacity = capacity(decode_mma_heads_per_pass(qpk, c.head_size),
                                     overrides.mma_decode_split.value_or(kMmaDecodeSplit));
  }
  // mm_prefix rows whose ranges widen the visible keys take the SIMT kernel.
  if (!mma || f.mm_prefix) f.decode_capacity = capacity(decode_heads_per_pass(qpk), kSimtDecodeSplit);
  return f;
}

// --- batch checks --------------------------------------------------------------------------------
void check_attention_batch(const AttentionConfig& c, const BatchDescription& batch, const FixedShapeCapacity* fixed) {
  const int64_t t = batch.num_tokens();
  const int64_t r_count = batch.num_reqs();
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", t, "]");
  HYBRIDTB_CHECK(batch.seq_lens.numel() == r_count, "seq_lens has ", batch.seq_lens.numel(), " entries for ", r_count,
                 " requests");
  if (fixed != nullptr) {
    const FixedShapeCapacity& f = *fixed;
    HYBRIDTB_CHECK(batch.num_reqs() == f.num_reqs, "CUDA graph: the batch has ", batch.num_reqs(),
                   " requests, the graph was captured for ", f.num_reqs, " (pad it to that size)");
    HYBRIDTB_CHECK(batch.block_table.rank() == 2 && batch.block_table.size(1) <= f.block_columns,
                   "CUDA graph: block_table ", batch.block_table.describe(), " is wider than the captured ",
                   f.block_columns, " columns");
    HYBRIDTB_CHECK(batch.mm_prefix_range.has_value() == f.mm_prefix, "CUDA graph: mm_prefix_range is ",
                   batch.mm_prefix_range ? "present" : "absent", " but was ", f.mm_prefix ? "present" : "absent",
                   " at capture");
    HYBRIDTB_CHECK(!f.mm_prefix || (batch.mm_prefix_range->rank() == 3 && batch.mm_prefix_range->size(1) == f.mm_ranges),
                   "CUDA graph: mm_prefix_range ", batch.mm_prefix_range ? batch.mm_prefix_range->describe() : "",
                   " must have the captured ", f.mm_ranges, " ranges per request");
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      HYBRIDTB_CHECK(batch.query_len(r) <= 1, "CUDA graph: request ", r, " has ", batch.query_len(r),
                     " query tokens (a captured decode step takes at most one per request)");
    }
  }
  if (c.attn_type == AttnType::kEncoderOnly && is_quantized(c.kv_cache_dtype)) {
    throw NotSupported(detail::concat("kv_cache_dtype ", to_string(c.kv_cache_dtype),
                                      " not supported for encoder_only (vLLM raises NotImplementedError)"));
  }
}

namespace {

// How many blocks request r reads (its seq_len over the block size), checked against the table's
// columns.
int64_t blocks_read(const AttentionConfig& c, const BatchDescription& batch, int64_t r, int64_t cols) {
  const int64_t blocks = (batch.seq_len(r) + c.block_size - 1) / c.block_size;
  HYBRIDTB_CHECK(blocks <= cols, "request ", r, ": seq_len ", batch.seq_len(r),
                 " needs more blocks than block_table has columns (", cols, ")");
  return blocks;
}

// Block ids are consulted on the device without bounds checks: request r's `blocks` ids must lie in
// [0, cache_blocks). Checked as one row (its least and greatest id: a step of 64 requests at 32k keys
// has 131 072 entries, checked every step; the offending entry is looked up only to name it).
// Returns one past the greatest id (0 for no blocks). Also built for AVX2 where the CPU has it (its
// 32-bit min and max are single instructions; SSE2 emulates each with four).
[[gnu::target_clones("avx2", "default")]]
int64_t check_block_row(const int32_t* row, int64_t blocks, int64_t cache_blocks, int64_t r) {
  if (blocks <= 0) return 0;
  int32_t least = row[0], greatest = row[0];
  for (int64_t b = 1; b < blocks; ++b) {  // branch-free: the compiler vectorises it
    least = std::min(least, row[b]);
    greatest = std::max(greatest, row[b]);
  }
  if (least < 0 || greatest >= cache_blocks) {
    const int32_t* const bad =
        std::find_if(row, row + blocks, [&](int32_t id) { return id < 0 || id >= cache_blocks; });
    HYBRIDTB_CHECK(false, "request ", r, ": block_table entry ", *bad, " is outside the cache's ", cache_blocks,
                   " blocks");
  }
  return int64_t{greatest} + 1;
}

void check_block_table_rows(const BatchDescription& batch) {
  HYBRIDTB_CHECK(batch.block_table.rank() == 2 && batch.block_table.size(0) >= batch.num_reqs(),
                 "block_table must have one row per request, got ", batch.block_table.describe());
}

}  // namespace

int64_t referenced_blocks(const AttentionConfig& c, const BatchDescription& batch, int64_t cache_blocks) {
  check_block_table_rows(batch);
  const int64_t cols = batch.block_table.size(1);
  int64_t spanned = 0;
  for (int64_t r = 0; r < batch.num_reqs(); ++r) {
    const int32_t* const row = batch.block_table.values.data() + r * cols;
    spanned = std::max(spanned, check_block_row(row, blocks_read(c, batch, r, cols), cache_blocks, r));
  }
  return spanned;
}

// --- the plan --------------------------------------------------------------------------------------
namespace {

// An empty plan holding `storage`'s vectors, cleared, with their capacity: a step planned into it
// allocates only where it outgrows the previous one.
AttentionPlan recycle(AttentionPlan storage) {
  AttentionPlan plan;
  const auto take = [](auto& to, auto& from) {
    from.clear();
    to = std::move(from);
  };
  take(plan.requests, storage.requests);
  take(plan.generic, storage.generic);
  take(plan.prefill, storage.prefill);
  take(plan.decode, storage.decode);
  take(plan.decode_mma, storage.decode_mma);
  take(plan.combine, storage.combine);
  take(plan.mixed, storage.mixed);
  return plan;
}

// The plan with the Hopper default allowed or not (plan_attention), in `storage`'s vectors.
AttentionPlan plan_once(const AttentionPlanInput& in, bool hopper_default, AttentionPlan storage) {
  const AttentionConfig& c = *in.config;
  const int64_t qpk = c.num_queries_per_kv();
  AttentionPlan plan = recycle(std::move(storage));
  plan.num_sms = in.num_sms;
  plan.fixed_shape = in.fixed != nullptr;
  if (in.engine != nullptr) {
    check_engine_metadata(*in.engine, *in.batch);
    plan.engine = *in.engine;
  }
  plan.heads_per_pass = decode_heads_per_pass(qpk);
  plan.mma_columns = decode_mma_columns(in);
  choose_prefill_variant(in, hopper_default, plan);
  const RoutedRows rows = route_requests(in, plan);
  // Partial slots are numbered across both decode kernels; the combine kernel finishes every split row.
  int32_t next_slot = 0;
  const int64_t passes = (qpk + plan.heads_per_pass - 1) / plan.heads_per_pass;
  const int64_t mma_passes = (qpk + plan.mma_columns - 1) / plan.mma_columns;
  plan.decode_chunk = split_decode_rows(in, rows.simt, passes, kSimtDecodeSplit, plan.decode, next_slot, plan);
  plan.decode_mma_chunk =
      split_decode_rows(in, rows.mma, mma_passes, in.overrides.mma_decode_split.value_or(kMmaDecodeSplit),
                        plan.decode_mma, next_slot, plan);
  if (in.fixed != nullptr) pad_to_capacity(*in.fixed, plan, next_slot);
  plan.partial_slots = next_slot;
  const auto partial_values = static_cast<size_t>(next_slot) * static_cast<size_t>(c.num_heads);
  plan.partial_acc_bytes = partial_values * static_cast<size_t>(c.head_size) * sizeof(float);
  plan.partial_ml_bytes = partial_values * 2 * sizeof(float);
  finish_summary(in, rows, plan);
  // Longest key spans first (causal tails, long contexts), so the short CTAs fill the last wave.
  // Stable: the order is a pure function of the batch; each CTA writes its own rows, so the order
  // never changes a result bit.
  order_by_weight_descending(plan.prefill, [](const GenericItem& g) { return int64_t{g.key_end} - g.key_begin; });
  plan.decode_grid_ctas = static_cast<int64_t>(plan.decode.size()) * c.num_kv_heads * passes;
  plan.decode_mma_grid_ctas = static_cast<int64_t>(plan.decode_mma.size()) * c.num_kv_heads * mma_passes;
  plan.combine_grid_ctas = static_cast<int64_t>(plan.combine.size()) * c.num_heads;
  const PrefillDecodeBalance balance = prefill_decode_balance(plan, c);
  // A small prefill runs faster on the mma.sync kernel (kWgmmaPrefillMinFlops).
  if (in.overrides.prefill_variant < 0 && plan.prefill_variant == kPrefillWgmma &&
      balance.prefill_flops < kWgmmaPrefillMinFlops) {
    plan.prefill_variant = prefill_default_variant(c.head_size);
  }
  // Both tensor-core kinds in one step (never in fixed-shape mode, whose steps have no prefill rows):
  // one grid of the mixed kernel where it applies.
  if (!plan.prefill.empty() && !plan.decode_mma.empty()) {
    // The mixed kernel runs the mma.sync prefill body: the Hopper default yields to one grid unless
    // the prefill outweighs the decodes (kMixedGridMaxFlopsPerByte).
    const int chosen = plan.prefill_variant;
    const bool yields = in.overrides.prefill_variant < 0 && chosen == kPrefillWgmma;
    if (yields && balance.flops_per_byte() > kMixedGridMaxFlopsPerByte) {
      plan.summary.mixed_fallback =
          detail::concat("the prefill outweighs the decode (", static_cast<int64_t>(balance.flops_per_byte()),
                         " prefill FLOP per decode byte > ", static_cast<int64_t>(kMixedGridMaxFlopsPerByte),
                         "): the wgmma prefill and the decode launched separately");
    } else {
      if (yields) plan.prefill_variant = prefill_default_variant(c.head_size);
      plan.summary.mixed_fallback = mixed_reason(in, plan);
      if (plan.summary.mixed_fallback.empty()) {
        plan_mixed_order(plan, c.num_kv_heads, mma_passes);
      } else {
        plan.prefill_variant = chosen;
      }
    }
  }
  plan.summary.prefill_variant = plan.prefill_variant;
  const bool plain_logits = !(c.logits_soft_cap > 0.0) && !c.alibi_slopes.has_value();
  const bool byte_cache = is_byte_element(element_kind(kv_storage_dtype(c.kv_cache_dtype, c.dtype)));
  if (plan.prefill_variant == kPrefillWgmma && !plan.prefill.empty() &&
      wgmma_float16_products(byte_cache, is_per_token_head(c.kv_cache_dtype), c.dtype == DType::kFloat16,
                             plain_logits)) {
    plan.summary.prefill_operands =
        c.dtype == DType::kFloat16 ? "float16" : "float16 (Q rows rescaled by powers of two)";
  }
  lay_out_staging(in, plan);
  return plan;
}

}  // namespace

// The Hopper default yields to the mma.sync kernel for a small prefill and for one that joins a
// mixed grid, which is decided on the items cut for the wgmma kernel. At D 128 both kernels take
// 128 rows per item and the items stand; at D 64 and 256 the mma.sync default takes 64, so where the
// first plan yielded, the step is planned again without the Hopper default (the second plan does
// not revisit the decision, which the first made on the wgmma kernel's items).
AttentionPlan plan_attention(const AttentionPlanInput& in, AttentionPlan recycled) {
  AttentionPlan plan = plan_once(in, /*hopper_default=*/true, std::move(recycled));
  if (plan.prefill_rows_per_item != prefill_rows_per_item(in.config->head_size, plan.prefill_variant)) {
    plan = plan_once(in, /*hopper_default=*/false, std::move(plan));
  }
  return plan;
}

namespace {

// Writes the staging bytes in order: each array at its offset, the gap before it zeroed, so every
// byte of the buffer is written once (it may be the pinned upload buffer, holding the last step's).
class StagingWriter {
 public:
  explicit StagingWriter(std::span<unsigned char> bytes) : bytes_(bytes) {}

  // The next `count` bytes at `offset` (≥ the end of the last write), the gap before them zeroed.
  unsigned char* at(size_t offset, size_t count) {
    HYBRIDTB_CHECK(offset >= end_ && offset + count <= bytes_.size(), "staging: bytes [", offset, ", ",
                   offset + count, ") do not follow ", end_, " within the buffer's ", bytes_.size());
    std::memset(bytes_.data() + end_, 0, offset - end_);
    end_ = offset + count;
    return bytes_.data() + offset;
  }

  template <typename T>
  void put(size_t offset, const T* values, size_t count) {
    unsigned char* out = at(offset, count * sizeof(T));
    if (count > 0) std::memcpy(out, values, count * sizeof(T));
  }

  void finish() { at(bytes_.size(), 0); }

 private:
  std::span<unsigned char> bytes_;
  size_t end_ = 0;
};

}  // namespace

std::vector<unsigned char> stage_plan(const AttentionPlan& plan, const AttentionConfig& config,
                                      const BatchDescription& batch) {
  std::vector<unsigned char> bytes(plan.staging.bytes);
  stage_plan(plan, config, batch, std::numeric_limits<int64_t>::max(), bytes);
  return bytes;
}

int64_t stage_plan(const AttentionPlan& plan, const AttentionConfig& config, const BatchDescription& batch,
                   int64_t cache_blocks, std::span<unsigned char> bytes) {
  const StagingLayout& s = plan.staging;
  HYBRIDTB_CHECK(bytes.size() == s.bytes, "staging: a buffer of ", bytes.size(), " bytes for a plan of ", s.bytes);
  StagingWriter out(bytes);
  out.put(s.query_start_loc, batch.query_start_loc.values.data(), batch.query_start_loc.values.size());
  out.put(s.seq_lens, batch.seq_lens.values.data(), batch.seq_lens.values.size());
  // The block table a row at a time, each row's ids checked while it is in cache (the table of a
  // large decode step is megabytes, staged every step: one pass over it); rows of a captured width
  // wider than the batch's get zero columns after its own (never read).
  const int64_t r_count = batch.num_reqs();
  const bool decoder = config.attn_type != AttnType::kEncoderOnly;
  const int64_t cols = batch.block_table.rank() == 2 ? batch.block_table.size(1) : 0;
  const int64_t stride = plan.block_table_stride;
  if (decoder) check_block_table_rows(batch);
  int64_t spanned = 0;
  for (int64_t r = 0; r < r_count; ++r) {
    const int32_t* const row = batch.block_table.values.data() + r * cols;
    out.put(s.block_table + static_cast<size_t>(r * stride) * sizeof(int32_t), row, static_cast<size_t>(cols));
    if (!decoder) continue;
    spanned = std::max(spanned, check_block_row(row, blocks_read(config, batch, r, cols), cache_blocks, r));
  }
  if (plan.num_mm_ranges > 0) {
    out.put(s.mm_prefix, batch.mm_prefix_range->values.data(), batch.mm_prefix_range->values.size());
  }
  out.put(s.generic_items, plan.generic.data(), plan.generic.size());
  out.put(s.prefill_items, plan.prefill.data(), plan.prefill.size());
  out.put(s.decode_items, plan.decode.data(), plan.decode.size());
  out.put(s.decode_mma_items, plan.decode_mma.data(), plan.decode_mma.size());
  out.put(s.combine_items, plan.combine.data(), plan.combine.size());
  out.put(s.mixed_items, plan.mixed.data(), plan.mixed.size());
  out.finish();
  return spanned;
}

// --- text ----------------------------------------------------------------------------------------

std::string AttentionPlanSummary::describe() const {
  std::ostringstream out;
  out << "decode fast path: " << decode_rows << " rows (" << split_rows << " split, " << decode_ctas
      << " key CTAs; tensor-core: " << decode_mma_rows << " rows in " << decode_mma_ctas << " key CTAs, SIMT: "
      << decode_rows - decode_mma_rows << " rows" << (decode_fallback.empty() ? "" : " [" + decode_fallback + "]")
      << (decode_operands.empty() ? "" : "; products on " + decode_operands)
      << "); tensor-core prefill path: " << prefill_rows << " rows in " << prefill_items << " CTAs"
      << (prefill_rows > 0 ? detail::concat(" (", prefill_variant_name(prefill_variant), ")") : std::string())
      << "; generic path: " << generic_rows << " rows in " << generic_items << " CTAs";
  if (!prefill_fallback.empty()) out << " (not on the tensor-core path: " << prefill_fallback << ")";
  if (!prefill_variant_fallback.empty()) out << " [" << prefill_variant_fallback << "]";
  if (prefill_kv_tma) {
    out << "; wgmma K/V pages by TMA";
  } else if (!prefill_kv_tma_fallback.empty()) {
    out << "; wgmma K/V by cp.async: " << prefill_kv_tma_fallback;
  }
  if (!prefill_operands.empty()) out << "; wgmma products on " << prefill_operands;
  if (mixed()) {
    out << "; mixed grid: " << mixed_prefill_ctas + mixed_decode_ctas << " CTAs (" << mixed_prefill_ctas
        << " prefill, " << mixed_decode_ctas << " decode)";
  } else if (!mixed_fallback.empty()) {
    out << "; prefill and decode launched separately: " << mixed_fallback;
  }
  return out.str();
}

const char* to_string(RowPath path) {
  switch (path) {
    case RowPath::kPadding:
      return "padding";
    case RowPath::kDecodeMma:
      return "tensor-core decode";
    case RowPath::kDecodeSimt:
      return "SIMT decode";
    case RowPath::kPrefillMma:
      return "tensor-core prefill";
    case RowPath::kGeneric:
      return "generic";
  }
  return "?";
}

namespace {

void describe_request(std::ostream& out, const RequestRoute& route) {
  out << "  request " << route.request << ": query_len " << route.query_len << ", " << to_string(route.path);
  switch (route.path) {
    case RowPath::kPadding:
      out << " (no work, nothing written)";
      break;
    case RowPath::kDecodeMma:
    case RowPath::kDecodeSimt:
      out << ", keys [" << route.key_begin << ", " << route.key_end << "), " << route.splits
          << (route.splits == 1 ? " split" : " splits");
      break;
    case RowPath::kPrefillMma:
    case RowPath::kGeneric:
      out << ", " << route.splits << " CTAs";
      break;
  }
  out << "\n";
}

void describe_kernels(std::ostream& out, const AttentionPlan& plan, const AttentionConfig& c) {
  const AttentionPlanSummary& s = plan.summary;
  out << "kernels:\n";
  out << "  tensor-core decode: " << s.decode_mma_rows << " rows, " << plan.decode_mma.size() << " items"
      << (plan.decode_mma_chunk > 0 ? detail::concat(" of up to ", plan.decode_mma_chunk, " keys") : "") << ", "
      << plan.mma_columns << " columns per CTA, grid " << plan.decode_mma_grid_ctas << " CTAs\n";
  out << "  SIMT decode: " << s.decode_rows - s.decode_mma_rows << " rows, " << plan.decode.size() << " items"
      << (plan.decode_chunk > 0 ? detail::concat(" of up to ", plan.decode_chunk, " keys") : "") << ", "
      << plan.heads_per_pass << " heads per CTA, grid " << plan.decode_grid_ctas << " CTAs"
      << (s.decode_fallback.empty() ? "" : " [" + s.decode_fallback + "]") << "\n";
  out << "  combine: " << s.split_rows << " split rows, grid " << plan.combine_grid_ctas << " CTAs\n";
  out << "  tensor-core prefill: " << s.prefill_rows << " rows, variant " << plan.prefill_variant << " ("
      << prefill_variant_name(plan.prefill_variant) << ", " << plan.prefill_rows_per_item << " rows per CTA), grid "
      << plan.prefill.size() << " CTAs"
      << (s.prefill_variant_fallback.empty() ? "" : " [" + s.prefill_variant_fallback + "]") << "\n";
  if (s.mixed()) {
    out << "  mixed (the tensor-core prefill and decode CTAs above in one grid, interleaved): grid "
        << plan.mixed.size() << " CTAs (" << s.mixed_prefill_ctas << " prefill, " << s.mixed_decode_ctas
        << " decode)" << (s.split_rows > 0 ? ", the combine after it" : "") << "\n";
  } else if (!s.mixed_fallback.empty()) {
    out << "  mixed: none, prefill and decode launched separately [" << s.mixed_fallback << "]\n";
  }
  out << "  generic: " << s.generic_rows << " rows, grid " << plan.generic.size() << " CTAs"
      << (s.prefill_fallback.empty() ? "" : " [not on the tensor-core path: " + s.prefill_fallback + "]") << "\n";
  out << "workspace: upload " << plan.staging.bytes << " bytes (block table stride " << plan.block_table_stride
      << ", " << plan.num_mm_ranges << " mm ranges), split partials " << plan.partial_slots << " slots = "
      << plan.partial_acc_bytes + plan.partial_ml_bytes << " bytes (" << c.num_heads << " heads x (" << c.head_size
      << " + 2) floats per slot)\n";
}

void describe_engine(std::ostream& out, const TritonAttentionMetadata& m) {
  out << "vLLM's metadata: max_query_len " << m.max_query_len << ", max_seq_len " << m.max_seq_len << ", "
      << (m.use_3d_path != 0 ? detail::concat("3D kernel (split softmax over ", m.num_par_softmax_segments, " segments)")
                             : std::string("2D kernel"))
      << ", seq_threshold_3d " << m.seq_threshold_3d << "\n";
}

}  // namespace

std::string describe_plan(const AttentionPlan& plan, const AttentionConfig& c) {
  std::ostringstream out;
  int64_t rows = 0;
  for (const RequestRoute& route : plan.requests) rows += route.query_len;
  out << "attention plan: " << plan.requests.size() << " requests, " << rows << " query rows, " << plan.num_sms
      << " SMs" << (plan.fixed_shape ? ", fixed shape (CUDA graph)" : "") << "\n";
  out << "layer: " << to_string(c.attn_type) << ", dtype " << to_string(c.dtype) << ", kv_cache_dtype "
      << to_string(c.kv_cache_dtype) << ", heads " << c.num_heads << "/" << c.num_kv_heads << ", head size "
      << c.head_size << ", block " << c.block_size << ", window " << c.sliding_window << "\n";
  out << "requests:\n";
  for (const RequestRoute& route : plan.requests) describe_request(out, route);
  describe_kernels(out, plan, c);
  if (plan.engine) describe_engine(out, *plan.engine);
  out << "summary: " << plan.summary.describe() << "\n";
  return out.str();
}

}  // namespace hybridtb::cuda
