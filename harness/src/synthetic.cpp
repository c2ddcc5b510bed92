// Seeded synthetic batches with vLLM-like paging (see synthetic.h for the conventions).
#include "hybridtb/synthetic.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- the fast, counter-based generator (SyntheticOptions::fast_fill) -----------------------------

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output function: a bijective mix of 64 bits.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of one tensor's stream: tensors of one batch never share values.
enum class Stream : uint64_t { kQuery = 1, kKey = 2, kValue = 3, kKvCache = 4, kFirstLinearInput = 5 };
uint64_t stream_key(uint64_t seed, Stream stream) { return mix64(mix64(seed + kGolden) ^ static_cast<uint64_t>(stream)); }

// Value number `index` of a stream: approximately standard-normal (an Irwin–Hall sum of four
// 16-bit uniforms, mean 0, variance 1, |x| ≤ 3.47), never exactly 0.
double counter_normal(uint64_t key, uint64_t index) {
  const uint64_t bits = mix64(key + (index + 1) * kGolden);
  int64_t sum = 0;
  for (int shift = 0; shift < 64; shift += 16) sum += static_cast<int64_t>((bits >> shift) & 0xFFFF);
  if (sum == 2 * 65535) ++sum;  // (sum + 2) / 65536 − 2 would be exactly 0
  constexpr double kSqrt3 = 1.7320508075688772;
  return (static_cast<double>(sum + 2) / 65536.0 - 2.0) * kSqrt3;
}

// Runs fn(begin, end) over [0, n) on a few threads, in contiguous ranges. Callers write disjoint
// elements and derive every value from its index, so the result does not depend on the split.
template <typename Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t hardware = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t threads = std::clamp<int64_t>(n / 64, 1, std::min<int64_t>(hardware, 16));
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(fn, n * t / threads, n * (t + 1) / threads);
  for (std::thread& thread : pool) thread.join();
}

// --- tensors ---------------------------------------------------------------------------------------

// Standard-normal values rounded to `dtype` (fast: from the counter stream `stream`).
Tensor random_tensor(std::mt19937_64& rng, DType dtype, const Shape& shape, const SyntheticOptions& options,
                     Stream stream) {
  Tensor t = Tensor::host(dtype, shape);
  if (options.fast_fill) {
    const uint64_t key = stream_key(options.seed, stream);
    parallel_for(t.numel(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) store_from_double(t.data(), dtype, i, counter_normal(key, static_cast<uint64_t>(i)));
    });
    return t;
  }
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.data(), dtype, i, normal(rng));
  return t;
}

// Stores one cache row (block, k/v, slot, kv head) of D values `x`, in the cache's storage domain:
// per-tensor fp8 divides by the tensor scale, per-token-head modes derive the row's scale from its
// absmax and store it, and the null block 0 gets the poison value (NaN, or −128 for int8) instead.
class KvRowWriter {
 public:
  KvRowWriter(const AttentionConfig& config, const SyntheticOptions& options, BatchInputs& in)
      : storage_(kv_storage_dtype(config.kv_cache_dtype, config.dtype)),
        per_token_head_(is_per_token_head(config.kv_cache_dtype)),
        quantized_(is_quantized(config.kv_cache_dtype)),
        qmax_(config.kv_cache_dtype == KvCacheDtype::kInt8PerTokenHead ? 127.0 : 448.0),
        k_scale_(options.k_scale),
        v_scale_(options.v_scale),
        BS_(config.block_size),
        H_(config.num_kv_heads),
        D_(config.head_size),
        in_(in) {}

  int64_t row_offset(int64_t block, int64_t kv, int64_t slot, int64_t h) const {
    return (((block * 2 + kv) * BS_ + slot) * H_ + h) * D_;
  }

  void write(int64_t block, int64_t kv, int64_t slot, int64_t h, const std::vector<double>& x) const {
    const int64_t base = row_offset(block, kv, slot, h);
    double scale = kv == 0 ? k_scale_ : v_scale_;  // per-tensor fp8: stored = x / scale
    if (per_token_head_) {
      double absmax = 0.0;
      for (double v : x) absmax = std::max(absmax, std::fabs(v));
      scale = std::max(absmax / qmax_, 1e-6);
      const Tensor& scales = kv == 0 ? in_.k_scale_cache : in_.v_scale_cache;
      const float stored_scale = block == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(scale);
      scales.data_as<float>()[(block * BS_ + slot) * H_ + h] = stored_scale;
    } else if (!quantized_) {
      scale = 1.0;
    }
    for (int64_t d = 0; d < D_; ++d) {
      double value = x[static_cast<size_t>(d)] / scale;
      if (storage_ == DType::kInt8) value = std::clamp(std::nearbyint(value), -127.0, 127.0);
      if (block == 0) {
        // The null block: NaN where the type has one, the most negative int8 otherwise.
        value = storage_ == DType::kInt8 ? -128.0 : std::numeric_limits<double>::quiet_NaN();
      }
      store_from_double(in_.kv_cache.data(), storage_, base + d, value);
    }
  }

 private:
  DType storage_;
  bool per_token_head_, quantized_;
  double qmax_, k_scale_, v_scale_;
  int64_t BS_, H_, D_;
  BatchInputs& in_;
};

// Fills the KV cache: random values in the cache's storage domain everywhere, and a poison value
// in the null block 0 so that any read of it shows up in the output.
void fill_kv_cache(std::mt19937_64& rng, const AttentionConfig& config, const SyntheticOptions& options,
                   BatchInputs& in, int64_t num_blocks) {
  const DType storage = kv_storage_dtype(config.kv_cache_dtype, config.dtype);
  const int64_t BS = config.block_size, H = config.num_kv_heads, D = config.head_size;
  in.kv_cache = Tensor::host(storage, {num_blocks, 2, BS, H, D});
  if (is_per_token_head(config.kv_cache_dtype)) {
    in.k_scale_cache = Tensor::host(DType::kFloat32, {num_blocks, BS, H});
    in.v_scale_cache = Tensor::host(DType::kFloat32, {num_blocks, BS, H});
  }
  const KvRowWriter writer(config, options, in);
  if (options.fast_fill) {
    const uint64_t key = stream_key(options.seed, Stream::kKvCache);
    const std::string stage = "generating the KV cache";
    std::atomic<int64_t> blocks_done{0};
    if (options.progress != nullptr) options.progress->report(stage, 0, num_blocks, 0.0);
    parallel_for(num_blocks, [&](int64_t begin, int64_t end) {
      std::vector<double> x(static_cast<size_t>(D));
      for (int64_t block = begin; block < end; ++block) {
        for (int64_t kv = 0; kv < 2; ++kv) {
          for (int64_t slot = 0; slot < BS; ++slot) {
            for (int64_t h = 0; h < H; ++h) {
              const auto base = static_cast<uint64_t>(writer.row_offset(block, kv, slot, h));
              for (int64_t d = 0; d < D; ++d) x[static_cast<size_t>(d)] = counter_normal(key, base + static_cast<uint64_t>(d));
              writer.write(block, kv, slot, h, x);
            }
          }
        }
        // The sink hears from the thread of the first range only (one caller at a time), the count
        // of all threads; the final count comes after the join.
        const int64_t done = blocks_done.fetch_add(1, std::memory_order_relaxed) + 1;
        if (options.progress != nullptr && begin == 0 && done < num_blocks) {
          options.progress->report(stage, done, num_blocks, static_cast<double>(done) / static_cast<double>(num_blocks));
        }
      }
    });
    if (options.progress != nullptr) options.progress->report(stage, num_blocks, num_blocks, 1.0);
    return;
  }
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(static_cast<size_t>(D));
  for (int64_t block = 0; block < num_blocks; ++block) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t slot = 0; slot < BS; ++slot) {
        for (int64_t h = 0; h < H; ++h) {
          for (auto& v : x) v = normal(rng);
          writer.write(block, kv, slot, h, x);
        }
      }
    }
  }
}

// What a block-table entry points at (see SyntheticOptions): its own fresh block, the null block,
// a block shared by every request with the prefix, or a block drawn from the aliasing pool.
enum class Entry : uint8_t { kOwn, kNull, kShared, kAliased };

}  // namespace

BatchFile make_synthetic_batch(const AttentionConfig& config, const BuilderConfig& builder,
                               const std::vector<RequestSpec>& requests, const SyntheticOptions& options) {
  validate(config);
  validate(builder);
  HYBRIDTB_CHECK(options.padding_tokens >= 0 && options.padding_requests >= 0,
                 "make_synthetic_batch: padding counts must be >= 0");
  HYBRIDTB_CHECK(options.shared_prefix_tokens >= 0, "make_synthetic_batch: shared_prefix_tokens must be >= 0, got ",
                 options.shared_prefix_tokens);
  std::mt19937_64 rng(options.seed);
  const bool decoder = config.attn_type == AttnType::kDecoder;
  const int64_t BS = config.block_size;
  const auto num_real = static_cast<int64_t>(requests.size());
  const int64_t R = num_real + options.padding_requests;

  BatchFile file;
  file.config = config;
  file.builder = builder;
  file.provenance["producer"] = "hybridtb make_synthetic_batch";
  file.provenance["seed"] = std::to_string(options.seed);
  BatchDescription& b = file.batch;

  // Requests and tokens.
  std::vector<int32_t> query_start_loc{0};
  std::vector<int32_t> seq_lens;
  for (const RequestSpec& r : requests) {
    HYBRIDTB_CHECK(r.query_len >= 1 && r.context_len >= 0, "make_synthetic_batch: a request needs query_len >= 1 ",
                   "and context_len >= 0, got ", r.query_len, " and ", r.context_len);
    HYBRIDTB_CHECK(decoder || r.context_len == 0, "make_synthetic_batch: encoder_only requests have no context");
    HYBRIDTB_CHECK(r.num_accepted_tokens >= 0, "make_synthetic_batch: num_accepted_tokens must be >= 0, got ",
                   r.num_accepted_tokens);
    query_start_loc.push_back(static_cast<int32_t>(query_start_loc.back() + r.query_len));
    seq_lens.push_back(static_cast<int32_t>(r.context_len + r.query_len));
  }
  for (int64_t p = 0; p < options.padding_requests; ++p) {
    query_start_loc.push_back(query_start_loc.back());
    seq_lens.push_back(0);
  }
  b.query_start_loc = IntArray::vector(query_start_loc);
  b.seq_lens = IntArray::vector(seq_lens);
  b.num_actual_tokens = query_start_loc.back();
  const int64_t T = b.num_actual_tokens + options.padding_tokens;

  // Paging: block 0 is the null block; requests get shuffled (or consecutive) physical blocks.
  int64_t num_blocks = 0;
  if (decoder) {
    const int64_t shared_blocks = options.shared_prefix_tokens / BS;
    std::vector<std::vector<Entry>> entries(static_cast<size_t>(num_real));
    std::vector<bool> shared_used(static_cast<size_t>(shared_blocks), false);
    int64_t max_blocks = 1;
    int64_t own_blocks = 0;
    int64_t aliased_entries = 0;
    for (int64_t r = 0; r < num_real; ++r) {
      const RequestSpec& spec = requests[static_cast<size_t>(r)];
      const int64_t n = ceil_div(seq_lens[static_cast<size_t>(r)], BS);
      max_blocks = std::max(max_blocks, n);
      auto& row = entries[static_cast<size_t>(r)];
      row.assign(static_cast<size_t>(n), Entry::kOwn);
      for (int64_t i = 0; i < n; ++i) {
        // A block whose last position lies before the first key the request's first query
        // (position context_len) sees is out of every query's window: vLLM frees it to the null block.
        const int64_t last_position = (i + 1) * BS - 1;
        const bool out_of_window =
            config.sliding_window > 0 &&
            last_position < ::hybridtb::spec::window_first_key(config.sliding_window, spec.context_len);
        const bool read_only = last_position < spec.context_len;  // no position of it is written now
        Entry& e = row[static_cast<size_t>(i)];
        if (options.null_out_of_window && out_of_window && spec.mm_prefix_ranges.empty()) {
          e = Entry::kNull;
          if (!options.compact) ++own_blocks;  // loose paging: the freed block is still drawn
        } else if (i < shared_blocks && spec.context_len >= options.shared_prefix_tokens) {
          e = Entry::kShared;
          shared_used[static_cast<size_t>(i)] = true;
        } else if (options.alias_blocks && read_only) {
          e = Entry::kAliased;
          ++aliased_entries;
        } else {
          ++own_blocks;
        }
      }
    }
    const auto num_shared = static_cast<int64_t>(std::count(shared_used.begin(), shared_used.end(), true));
    const int64_t alias_pool = aliased_entries == 0 ? 0 : std::max<int64_t>(1, aliased_entries / 4);
    num_blocks = 1 + own_blocks + num_shared + alias_pool + options.spare_blocks;
    std::vector<int32_t> free_blocks(static_cast<size_t>(num_blocks - 1));
    std::iota(free_blocks.begin(), free_blocks.end(), 1);
    if (options.shuffle_blocks) std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    size_t next = static_cast<size_t>(alias_pool);  // free_blocks[0, alias_pool) is the aliasing pool
    std::uniform_int_distribution<size_t> pick(0, static_cast<size_t>(std::max<int64_t>(alias_pool, 1) - 1));
    std::vector<int32_t> shared_ids(static_cast<size_t>(shared_blocks), 0);
    b.block_table = IntArray::matrix(R, max_blocks, 0);
    for (int64_t r = 0; r < num_real; ++r) {
      const auto& row = entries[static_cast<size_t>(r)];
      for (size_t i = 0; i < row.size(); ++i) {
        int32_t& id = b.block_table.at(r, static_cast<int64_t>(i));
        switch (row[i]) {
          case Entry::kOwn:
            id = free_blocks[next++];
            break;
          case Entry::kNull:
            if (!options.compact) ++next;
            id = 0;
            break;
          case Entry::kShared:
            if (shared_ids[i] == 0) shared_ids[i] = free_blocks[next++];
            id = shared_ids[i];
            break;
          case Entry::kAliased:
            id = free_blocks[pick(rng)];
            break;
        }
      }
    }
  } else {
    b.block_table = IntArray::matrix(R, 0);
  }

  b.slot_mapping.assign(static_cast<size_t>(T), kPadSlotId);
  if (decoder) {
    for (int64_t r = 0; r < num_real; ++r) {
      const RequestSpec& spec = requests[static_cast<size_t>(r)];
      for (int64_t i = 0; i < spec.query_len; ++i) {
        const int64_t pos = spec.context_len + i;
        b.slot_mapping[static_cast<size_t>(query_start_loc[static_cast<size_t>(r)] + i)] =
            int64_t{b.block_table.at(r, pos / BS)} * BS + pos % BS;
      }
    }
  }

  size_t max_ranges = 0;
  for (const RequestSpec& r : requests) max_ranges = std::max(max_ranges, r.mm_prefix_ranges.size());
  if (max_ranges > 0) {
    IntArray ranges = IntArray::filled({R, static_cast<int64_t>(max_ranges), 2}, 0);
    for (int64_t r = 0; r < num_real; ++r) {
      const auto& list = requests[static_cast<size_t>(r)].mm_prefix_ranges;
      for (size_t m = 0; m < list.size(); ++m) {
        const size_t base = (static_cast<size_t>(r) * max_ranges + m) * 2;
        ranges.values[base] = list[m].first;
        ranges.values[base + 1] = list[m].second;
      }
    }
    b.mm_prefix_range = std::move(ranges);
  }

  if (options.ssm_block_table) {
    const bool per_block = config.mamba_cache_mode != MambaCacheMode::kNone;
    HYBRIDTB_CHECK(!per_block || config.mamba_block_size > 0,
                   "make_synthetic_batch: ssm_block_table needs mamba_block_size > 0 in mamba_cache_mode ",
                   to_string(config.mamba_cache_mode));
    // Slots a request uses: one per state block (+ the speculative columns) or 1 + drafts.
    auto slots_of = [&](int64_t seq_len) {
      return per_block ? std::max<int64_t>(1, ceil_div(seq_len, config.mamba_block_size)) + config.num_speculative_tokens
                       : 1 + config.num_speculative_tokens;
    };
    int64_t width = 1;
    for (int64_t r = 0; r < num_real; ++r) width = std::max(width, slots_of(seq_lens[static_cast<size_t>(r)]));
    // Prefix-cache hits share the states cached at the prefix's block boundaries (mode all).
    const int64_t shared_slots = config.mamba_cache_mode == MambaCacheMode::kAll && options.shared_prefix_tokens > 0
                                     ? options.shared_prefix_tokens / config.mamba_block_size
                                     : 0;
    std::vector<int32_t> shared_ids(static_cast<size_t>(shared_slots), 0);
    IntArray table = IntArray::matrix(R, width, 0);
    int32_t next_slot = 1;  // slot 0 stays unused, like vLLM's null block
    for (int64_t r = 0; r < num_real; ++r) {
      const RequestSpec& spec = requests[static_cast<size_t>(r)];
      const int64_t used = options.compact ? slots_of(seq_lens[static_cast<size_t>(r)]) : width;
      const bool shares = spec.context_len >= options.shared_prefix_tokens;
      for (int64_t i = 0; i < used; ++i) {
        if (shares && i < shared_slots) {
          int32_t& id = shared_ids[static_cast<size_t>(i)];
          if (id == 0) id = next_slot++;
          table.at(r, i) = id;
        } else {
          table.at(r, i) = next_slot++;
        }
      }
    }
    b.ssm_block_table = std::move(table);
  }

  if (std::any_of(requests.begin(), requests.end(), [](const RequestSpec& r) { return r.num_accepted_tokens > 0; })) {
    IntArray accepted = IntArray::filled({R}, 1);
    for (int64_t r = 0; r < num_real; ++r) {
      const int32_t n = requests[static_cast<size_t>(r)].num_accepted_tokens;
      if (n > 0) accepted[r] = n;
    }
    b.num_accepted_tokens = std::move(accepted);
  }

  // Tensors.
  BatchInputs& in = file.inputs;
  if (config.is_linear_layer()) {
    // A linear-attention layer reads its own inputs and holds no KV cache (the model's attention
    // layers do, through the same block table); one stream per input, in the spec's order.
    HYBRIDTB_CHECK(!options.output_scale, "make_synthetic_batch: a linear-attention layer has no fp8 output");
    const std::vector<LinearInput> inputs = linear_layer_spec(config).inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto stream = static_cast<Stream>(static_cast<uint64_t>(Stream::kFirstLinearInput) + i);
      in.linear_inputs[inputs[i].name] = random_tensor(rng, config.dtype, {T, inputs[i].width}, options, stream);
    }
    validate(config, b, in);
    return file;
  }
  in.query = random_tensor(rng, config.dtype, {T, config.num_heads, config.head_size}, options, Stream::kQuery);
  in.key = random_tensor(rng, config.dtype, {T, config.num_kv_heads, config.head_size}, options, Stream::kKey);
  in.value = random_tensor(rng, config.dtype, {T, config.num_kv_heads, config.head_size}, options, Stream::kValue);
  in.k_scale = options.k_scale;
  in.v_scale = options.v_scale;
  in.output_scale = options.output_scale;
  if (decoder) fill_kv_cache(rng, config, options, in, num_blocks);

  validate(config, b, in);  // a generator bug must not produce an invalid file
  return file;
}

int64_t ssm_slots_needed(const BatchDescription& batch) {
  int64_t largest = -1;
  for (int32_t slot : batch.state_block_table().values) largest = std::max<int64_t>(largest, slot);
  return largest + 1;
}

}  // namespace hybridtb
