// hybridtb shrink: the reductions and the greedy search (shrink.h).
#include "hybridtb/shrink.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "hybridtb/backend.h"
#include "hybridtb/batch.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"

namespace hybridtb::shrink {

namespace {

int64_t product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

// Entries `index` (in that order) of dimension `dim` of a contiguous host tensor.
Tensor gather(const Tensor& t, int dim, const std::vector<int64_t>& index) {
  if (t.empty()) return t;
  HYBRIDTB_CHECK(t.view().is_contiguous() && t.view().device() == Device::kHost,
                 "shrink: expected a contiguous host tensor, got ", t.view().describe());
  Shape shape = t.shape();
  const auto d = static_cast<size_t>(dim);
  const int64_t outer = product(shape, 0, d);
  const int64_t old_n = shape[d];
  const int64_t inner = product(shape, d + 1, shape.size()) * static_cast<int64_t>(element_size(t.dtype()));
  shape[d] = static_cast<int64_t>(index.size());
  Tensor out = Tensor::host(t.dtype(), shape);
  const auto* src = static_cast<const char*>(t.data());
  auto* dst = static_cast<char*>(out.data());
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t j = 0; j < index.size(); ++j) {
      std::memcpy(dst + (o * shape[d] + static_cast<int64_t>(j)) * inner, src + (o * old_n + index[j]) * inner,
                  static_cast<size_t>(inner));
    }
  }
  return out;
}

std::vector<int64_t> iota(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

IntArray gather_rows(const IntArray& a, const std::vector<int64_t>& rows) {
  const int64_t row_size = a.shape.at(0) == 0 ? 0 : a.numel() / a.shape[0];
  std::vector<int64_t> shape = a.shape;
  shape[0] = static_cast<int64_t>(rows.size());
  std::vector<int32_t> values;
  for (int64_t r : rows) {
    values.insert(values.end(), a.values.begin() + r * row_size, a.values.begin() + (r + 1) * row_size);
  }
  return IntArray(shape, std::move(values));
}

// The reductions start from a copy without results: /outputs and /expected describe the original.
BatchFile without_results(const BatchFile& file) {
  BatchFile out = file;
  out.outputs.reset();
  out.expected.reset();
  return out;
}

// Keeps token rows `rows` of every per-token tensor and of slot_mapping.
void keep_token_rows(BatchFile& f, const std::vector<int64_t>& rows) {
  f.inputs.query = gather(f.inputs.query, 0, rows);
  f.inputs.key = gather(f.inputs.key, 0, rows);
  f.inputs.value = gather(f.inputs.value, 0, rows);
  for (auto& [name, tensor] : f.inputs.linear_inputs) tensor = gather(tensor, 0, rows);
  std::vector<int64_t> slots;
  for (int64_t row : rows) slots.push_back(f.batch.slot_mapping[static_cast<size_t>(row)]);
  f.batch.slot_mapping = std::move(slots);
}

bool is_padding_request(const BatchDescription& b, int64_t r) { return b.query_len(r) == 0 && b.seq_len(r) == 0; }

bool has_state_pools(const BatchFile& f) { return !f.inputs.ssm_state.empty(); }

// The SSM state blocks follow positions in the prefix-caching modes (one state per mamba block).
bool states_follow_positions(const BatchFile& f) {
  return has_state_pools(f) && f.config.mamba_cache_mode != MambaCacheMode::kNone;
}

// Trims the block tables to the widest request (at least one column).
void trim_block_tables(BatchFile& f) {
  const BatchDescription& b = f.batch;
  int64_t width = 1;
  for (int64_t r = 0; r < b.num_reqs(); ++r) width = std::max(width, blocks_of_request(f, r));
  if (states_follow_positions(f)) return;  // the state table may index further
  auto trim = [width](IntArray& table) {
    if (table.rank() != 2 || table.size(1) <= width) return;
    table = IntArray(std::vector<int64_t>{table.size(0), width}, [&] {
      std::vector<int32_t> v;
      for (int64_t r = 0; r < table.size(0); ++r) {
        for (int64_t c = 0; c < width; ++c) v.push_back(table.at(r, c));
      }
      return v;
    }());
  };
  trim(f.batch.block_table);
}

}  // namespace

int64_t blocks_of_request(const BatchFile& file, int64_t request) {
  const int64_t bs = std::max<int64_t>(file.config.block_size, 1);
  return (file.batch.seq_len(request) + bs - 1) / bs;
}

std::string describe(const BatchFile& file) {
  const BatchDescription& b = file.batch;
  int64_t widest = 0;
  for (int64_t r = 0; r < b.num_reqs(); ++r) widest = std::max(widest, blocks_of_request(file, r));
  std::ostringstream s;
  s << "R=" << b.num_reqs() << " T=" << b.num_tokens() << " (actual " << b.num_actual_tokens << ")"
    << " blocks/request<=" << widest;
  if (!file.config.is_linear_layer()) {
    s << " heads=" << file.config.num_heads << "/" << file.config.num_kv_heads;
  }
  if (!file.inputs.kv_cache.empty()) s << " cache blocks=" << file.inputs.kv_cache.size(0);
  return s.str();
}

std::optional<BatchFile> keep_requests(const BatchFile& file, const std::vector<int64_t>& kept) {
  const BatchDescription& b = file.batch;
  if (kept.empty() || static_cast<int64_t>(kept.size()) >= b.num_reqs()) return std::nullopt;
  BatchFile f = without_results(file);
  std::vector<int64_t> rows;
  std::vector<int32_t> qsl{0};
  for (int64_t r : kept) {
    for (int64_t t = b.query_start_loc[r]; t < b.query_start_loc[r + 1]; ++t) rows.push_back(t);
    qsl.push_back(static_cast<int32_t>(rows.size()));
  }
  const int64_t actual = static_cast<int64_t>(rows.size());
  for (int64_t t = b.num_actual_tokens; t < b.num_tokens(); ++t) rows.push_back(t);  // padding rows stay
  keep_token_rows(f, rows);
  f.batch.num_actual_tokens = actual;
  f.batch.query_start_loc = IntArray::vector(qsl);
  f.batch.seq_lens = gather_rows(b.seq_lens, kept);
  f.batch.block_table = gather_rows(b.block_table, kept);
  if (b.mm_prefix_range) f.batch.mm_prefix_range = gather_rows(*b.mm_prefix_range, kept);
  if (b.ssm_block_table) f.batch.ssm_block_table = gather_rows(*b.ssm_block_table, kept);
  if (b.num_accepted_tokens) f.batch.num_accepted_tokens = gather_rows(*b.num_accepted_tokens, kept);
  trim_block_tables(f);
  return f;
}

std::optional<BatchFile> truncate_query(const BatchFile& file, int64_t r, int64_t query_len) {
  const BatchDescription& b = file.batch;
  const int64_t q = b.query_len(r);
  if (query_len < 1 || query_len >= q) return std::nullopt;
  BatchFile f = without_results(file);
  const int64_t cut = q - query_len;
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    if (t < b.query_start_loc[r] + query_len || t >= b.query_start_loc[r + 1]) rows.push_back(t);
  }
  keep_token_rows(f, rows);
  f.batch.num_actual_tokens -= cut;
  for (int64_t i = r + 1; i < f.batch.query_start_loc.numel(); ++i) f.batch.query_start_loc[i] -= static_cast<int32_t>(cut);
  f.batch.seq_lens[r] -= static_cast<int32_t>(cut);
  trim_block_tables(f);
  return f;
}

std::optional<BatchFile> drop_context_blocks(const BatchFile& file, int64_t r, int64_t blocks) {
  const BatchDescription& b = file.batch;
  const int64_t bs = file.config.block_size;
  if (blocks < 1 || file.config.attn_type != AttnType::kDecoder || b.mm_prefix_range || states_follow_positions(file) ||
      b.context_len(r) < blocks * bs) {
    return std::nullopt;
  }
  BatchFile f = without_results(file);
  IntArray& table = f.batch.block_table;
  const int64_t width = table.size(1);
  for (int64_t c = 0; c < width; ++c) table.at(r, c) = c + blocks < width ? table.at(r, c + blocks) : 0;
  f.batch.seq_lens[r] -= static_cast<int32_t>(blocks * bs);
  trim_block_tables(f);
  return f;
}

std::optional<BatchFile> keep_kv_heads(const BatchFile& file, int64_t first, int64_t count) {
  const AttentionConfig& c = file.config;
  if (c.is_linear_layer() || c.has_ssm_branch() || first < 0 || count < 1 || first + count > c.num_kv_heads ||
      count == c.num_kv_heads) {
    return std::nullopt;
  }
  BatchFile f = without_results(file);
  const int64_t group = c.num_queries_per_kv();
  const std::vector<int64_t> kv = iota(first, first + count);
  const std::vector<int64_t> q = iota(first * group, (first + count) * group);
  f.config.num_kv_heads = count;
  f.config.num_heads = count * group;
  f.inputs.query = gather(f.inputs.query, 1, q);
  f.inputs.key = gather(f.inputs.key, 1, kv);
  f.inputs.value = gather(f.inputs.value, 1, kv);
  if (!f.inputs.kv_cache.empty()) f.inputs.kv_cache = gather(f.inputs.kv_cache, 3, kv);
  f.inputs.k_scale_cache = gather(f.inputs.k_scale_cache, 2, kv);
  f.inputs.v_scale_cache = gather(f.inputs.v_scale_cache, 2, kv);
  auto per_query_head = [&q](const std::vector<float>& all) {
    std::vector<float> kept;
    for (int64_t h : q) kept.push_back(all[static_cast<size_t>(h)]);
    return kept;
  };
  if (c.sinks) f.config.sinks = per_query_head(*c.sinks);
  if (c.alibi_slopes) f.config.alibi_slopes = per_query_head(*c.alibi_slopes);
  return f;
}

const std::vector<std::string>& feature_names() {
  static const std::vector<std::string> names = {"padding", "ssm",   "mm_prefix",      "soft_cap",
                                                 "sinks",   "alibi", "sliding_window", "fp8_output"};
  return names;
}

std::optional<BatchFile> remove_feature(const BatchFile& file, const std::string& feature) {
  const AttentionConfig& c = file.config;
  const BatchDescription& b = file.batch;
  BatchFile f = without_results(file);
  if (feature == "soft_cap") {
    if (c.logits_soft_cap == 0.0) return std::nullopt;
    f.config.logits_soft_cap = 0.0;
  } else if (feature == "sinks") {
    if (!c.sinks) return std::nullopt;
    f.config.sinks.reset();
  } else if (feature == "alibi") {
    if (!c.alibi_slopes) return std::nullopt;
    f.config.alibi_slopes.reset();
    f.config.use_alibi_sqrt = false;
  } else if (feature == "sliding_window") {
    if (c.sliding_window == 0) return std::nullopt;
    f.config.sliding_window = 0;
  } else if (feature == "mm_prefix") {
    if (!b.mm_prefix_range) return std::nullopt;
    f.batch.mm_prefix_range.reset();
  } else if (feature == "ssm") {
    if (!c.has_ssm_branch()) return std::nullopt;
    f.config.ssm_mode = "none";
    f.config.ssm_params.clear();
    f.config.mamba_cache_mode = MambaCacheMode::kNone;
    f.config.mamba_block_size = 0;
    f.inputs.ssm_state.clear();
    f.inputs.weights.clear();
    f.batch.ssm_block_table.reset();
  } else if (feature == "fp8_output") {
    if (!f.inputs.output_scale) return std::nullopt;
    f.inputs.output_scale.reset();
  } else if (feature == "padding") {
    int64_t requests = b.num_reqs();
    while (requests > 0 && is_padding_request(b, requests - 1)) --requests;
    if (b.num_tokens() == b.num_actual_tokens && requests == b.num_reqs()) return std::nullopt;
    if (requests == 0) return std::nullopt;
    keep_token_rows(f, iota(0, b.num_actual_tokens));
    const std::vector<int64_t> kept = iota(0, requests);
    f.batch.query_start_loc = b.query_start_loc.rows(0, requests + 1);
    f.batch.seq_lens = gather_rows(b.seq_lens, kept);
    f.batch.block_table = gather_rows(b.block_table, kept);
    if (b.mm_prefix_range) f.batch.mm_prefix_range = gather_rows(*b.mm_prefix_range, kept);
    if (b.ssm_block_table) f.batch.ssm_block_table = gather_rows(*b.ssm_block_table, kept);
    if (b.num_accepted_tokens) f.batch.num_accepted_tokens = gather_rows(*b.num_accepted_tokens, kept);
  } else {
    throw Error(detail::concat("shrink: unknown feature '", feature, "'"));
  }
  return f;
}

std::optional<BatchFile> compact_blocks(const BatchFile& file) {
  const BatchDescription& b = file.batch;
  const int64_t bs = file.config.block_size;
  const bool has_cache = !file.inputs.kv_cache.empty();
  const bool shared_state_table = has_state_pools(file) && !b.ssm_block_table;
  if (!has_cache && !has_state_pools(file)) return std::nullopt;

  // Renumbering of the ids in `table` (and 0, the null block), in increasing order.
  auto renumbering = [](const IntArray& table) {
    std::set<int32_t> ids{0};
    for (int32_t id : table.values) {
      if (id >= 0) ids.insert(id);
    }
    std::map<int32_t, int32_t> to_new;
    for (int32_t id : ids) to_new.emplace(id, static_cast<int32_t>(to_new.size()));
    return to_new;
  };
  auto apply = [](IntArray table, const std::map<int32_t, int32_t>& to_new) {
    for (int32_t& id : table.values) {
      if (id >= 0) id = to_new.at(id);
    }
    return table;
  };
  auto old_ids_below = [](const std::map<int32_t, int32_t>& to_new, int64_t limit) {
    std::vector<int64_t> old;
    for (const auto& [id, fresh] : to_new) {
      if (id < limit) old.push_back(id);
    }
    return old;
  };
  auto gather_pools = [&](BatchFile& f, const std::map<int32_t, int32_t>& to_new) -> bool {
    for (auto& [name, pool] : f.inputs.ssm_state) {
      const std::vector<int64_t> old = old_ids_below(to_new, pool.size(0));
      // A monotone renumbering keeps the ids below the pool's size a prefix: rows 0..k-1.
      for (size_t i = 0; i < old.size(); ++i) {
        if (to_new.at(static_cast<int32_t>(old[i])) != static_cast<int32_t>(i)) return false;
      }
      pool = gather(pool, 0, old);
    }
    return true;
  };

  BatchFile f = without_results(file);
  const auto to_new = renumbering(b.block_table);
  if (has_cache) {
    const int64_t num_blocks = file.inputs.kv_cache.size(0);
    if (to_new.rbegin()->first >= num_blocks) return std::nullopt;
    std::vector<int64_t> slots;
    for (int64_t slot : b.slot_mapping) {
      if (slot < 0) {
        slots.push_back(slot);
        continue;
      }
      const auto it = to_new.find(static_cast<int32_t>(slot / bs));
      if (it == to_new.end()) return std::nullopt;  // a slot outside the table: leave the file as it is
      slots.push_back(static_cast<int64_t>(it->second) * bs + slot % bs);
    }
    const std::vector<int64_t> old = old_ids_below(to_new, num_blocks);
    f.inputs.kv_cache = gather(f.inputs.kv_cache, 0, old);
    f.inputs.k_scale_cache = gather(f.inputs.k_scale_cache, 0, old);
    f.inputs.v_scale_cache = gather(f.inputs.v_scale_cache, 0, old);
    f.batch.block_table = apply(b.block_table, to_new);
    f.batch.slot_mapping = std::move(slots);
    if (shared_state_table && !gather_pools(f, to_new)) return std::nullopt;
  } else if (shared_state_table) {
    return std::nullopt;  // a linear layer's slots are the attention layers' too: keep them
  }
  if (b.ssm_block_table) {
    const auto state_to_new = renumbering(*b.ssm_block_table);
    f.batch.ssm_block_table = apply(*b.ssm_block_table, state_to_new);
    if (!gather_pools(f, state_to_new)) return std::nullopt;
  }
  return f;
}

Verdict judge_parity(const BatchFile& file, const std::string& candidate, const std::string& against) {
  Verdict v;
  StepOutputs expected;
  try {
    validate(file.config);
    validate(file.builder);
    validate(file.config, file.batch, file.inputs);
    auto reference = create_backend(against, BackendSettings{file.config, file.builder});
    expected = run_step(*reference, file);
  } catch (const Error& e) {  // NotSupported is an Error too
    v.valid = false;
    v.detail = detail::concat("invalid: ", e.what());
    return v;
  }
  StepOutputs got;
  try {
    auto backend = create_backend(candidate, BackendSettings{file.config, file.builder});
    got = run_step(*backend, file);
  } catch (const NotSupported& e) {
    v.detail = detail::concat("not supported by ", candidate, ": ", e.what());
    return v;
  } catch (const Error& e) {
    v.fails = true;
    v.backend_error = true;
    v.detail = detail::concat(candidate, " error: ", e.what());
    return v;
  }
  const ComparisonReport report = compare_step(file, got, expected);
  for (const QuantityReport& q : report.quantities) {
    if (!q.passed) v.quantities.push_back(q.name);
  }
  if (!report.metadata_differences.empty()) v.quantities.push_back("metadata");
  v.fails = !v.quantities.empty();
  std::ostringstream s;
  if (v.fails) {
    s << "mismatch in";
    for (const std::string& q : v.quantities) s << " " << q;
  } else {
    s << "passes";
  }
  v.detail = s.str();
  return v;
}

bool fails_the_same_way(const Verdict& original, const Verdict& now) {
  if (!now.valid || !now.fails) return false;
  if (original.backend_error) return now.backend_error;
  if (now.backend_error) return false;
  return std::any_of(now.quantities.begin(), now.quantities.end(), [&](const std::string& q) {
    return std::find(original.quantities.begin(), original.quantities.end(), q) != original.quantities.end();
  });
}

namespace {

class Search {
 public:
  Search(const BatchFile& file, const Judge& judge, const Options& options)
      : judge_(judge), options_(options), start_(std::chrono::steady_clock::now()) {
    result_.minimal = without_results(file);
    result_.original = judge_(result_.minimal);
    ++result_.tried;
    HYBRIDTB_CHECK(result_.original.valid, "shrink: the batch does not run on both backends: ", result_.original.detail);
    HYBRIDTB_CHECK(result_.original.fails, "shrink: the batch does not fail (", result_.original.detail,
                   "): there is nothing to minimise");
    result_.final_verdict = result_.original;
  }

  Result run() {
    bool progress = true;
    while (progress && !out_of_time()) {
      progress = false;
      progress |= remove_features();
      progress |= drop_requests();
      progress |= shorten_queries();
      progress |= shorten_contexts();
      progress |= drop_heads();
    }
    if (!out_of_time()) try_keep("renumber the referenced blocks", compact_blocks(result_.minimal));
    result_.timed_out = out_of_time();
    result_.seconds = elapsed();
    return std::move(result_);
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  bool out_of_time() const { return elapsed() > options_.time_limit_s; }

  // Judges `candidate`; keeps it as the new minimum if it still fails the same way.
  bool try_keep(const std::string& reduction, std::optional<BatchFile> candidate) {
    if (!candidate || out_of_time()) return false;
    const Verdict verdict = judge_(*candidate);
    ++result_.tried;
    if (!fails_the_same_way(result_.original, verdict)) return false;
    result_.minimal = std::move(*candidate);
    result_.final_verdict = verdict;
    Step step{reduction, describe(result_.minimal)};
    if (options_.on_step) options_.on_step(step.reduction + " -> " + step.batch + " (" + verdict.detail + ")");
    result_.kept.push_back(std::move(step));
    return true;
  }

  bool remove_features() {
    bool any = false;
    for (const std::string& feature : feature_names()) {
      any |= try_keep("remove " + feature, remove_feature(result_.minimal, feature));
    }
    return any;
  }

  // Delta debugging over the requests: remove chunks of n/2, n/4, …, 1 requests.
  bool drop_requests() {
    bool any = false;
    for (int64_t chunk = result_.minimal.batch.num_reqs() / 2; chunk >= 1; chunk /= 2) {
      for (int64_t begin = 0; begin < result_.minimal.batch.num_reqs() && !out_of_time();) {
        const int64_t n = result_.minimal.batch.num_reqs();
        const int64_t end = std::min(n, begin + chunk);
        std::vector<int64_t> kept = iota(0, begin);
        for (int64_t r = end; r < n; ++r) kept.push_back(r);
        if (try_keep(detail::concat("drop requests ", begin, "..", end - 1, " of ", n),
                     keep_requests(result_.minimal, kept))) {
          any = true;  // the same begin now names the next requests
        } else {
          begin = end;
        }
      }
    }
    return any;
  }

  bool shorten_queries() {
    bool any = false;
    for (int64_t r = 0; r < result_.minimal.batch.num_reqs(); ++r) {
      for (int64_t q = result_.minimal.batch.query_len(r); q > 1 && !out_of_time();) {
        // 1 token first, then halves of what is left.
        const bool to_one = try_keep(detail::concat("truncate query of request ", r, " to 1"),
                                     truncate_query(result_.minimal, r, 1));
        if (to_one) {
          any = true;
          break;
        }
        const int64_t half = (q + 1) / 2;
        if (half >= q || !try_keep(detail::concat("truncate query of request ", r, " to ", half),
                                   truncate_query(result_.minimal, r, half))) {
          break;
        }
        any = true;
        q = result_.minimal.batch.query_len(r);
      }
    }
    return any;
  }

  bool shorten_contexts() {
    bool any = false;
    const int64_t bs = std::max<int64_t>(result_.minimal.config.block_size, 1);
    for (int64_t r = 0; r < result_.minimal.batch.num_reqs(); ++r) {
      for (int64_t blocks = result_.minimal.batch.context_len(r) / bs; blocks >= 1 && !out_of_time(); blocks /= 2) {
        while (try_keep(detail::concat("drop ", blocks, " context blocks of request ", r),
                        drop_context_blocks(result_.minimal, r, blocks))) {
          any = true;
        }
      }
    }
    return any;
  }

  // The smallest aligned group of KV heads (1, 2, 4, …) that still fails.
  bool drop_heads() {
    for (int64_t count = 1; count < result_.minimal.config.num_kv_heads && !out_of_time(); count *= 2) {
      for (int64_t first = 0; first + count <= result_.minimal.config.num_kv_heads; first += count) {
        if (try_keep(detail::concat("keep KV heads ", first, "..", first + count - 1),
                     keep_kv_heads(result_.minimal, first, count))) {
          return true;
        }
      }
    }
    return false;
  }

  const Judge& judge_;
  const Options& options_;
  std::chrono::steady_clock::time_point start_;
  Result result_;
};

}  // namespace

Result shrink_batch(const BatchFile& file, const Judge& judge, const Options& options) {
  return Search(file, judge, options).run();
}

}  // namespace hybridtb::shrink
