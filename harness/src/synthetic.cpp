// Seeded synthetic batches with vLLM-like paging (see synthetic.h for the conventions).
#include "hybridtb/synthetic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "hybridtb/error.h"

namespace hybridtb {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Standard-normal values rounded to `dtype`.
Tensor random_tensor(std::mt19937_64& rng, DType dtype, const Shape& shape) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor t = Tensor::host(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.data(), dtype, i, normal(rng));
  return t;
}

// Fills the KV cache: random values in the cache's storage domain everywhere, and a poison value
// in the null block 0 so that any read of it shows up in the output.
void fill_kv_cache(std::mt19937_64& rng, const AttentionConfig& config, const SyntheticOptions& options,
                   BatchInputs& in, int64_t num_blocks) {
  const DType storage = kv_storage_dtype(config.kv_cache_dtype, config.dtype);
  const int64_t BS = config.block_size, H = config.num_kv_heads, D = config.head_size;
  in.kv_cache = Tensor::host(storage, {num_blocks, 2, BS, H, D});
  std::normal_distribution<double> normal(0.0, 1.0);
  const bool per_token_head = is_per_token_head(config.kv_cache_dtype);
  if (per_token_head) {
    in.k_scale_cache = Tensor::host(DType::kFloat32, {num_blocks, BS, H});
    in.v_scale_cache = Tensor::host(DType::kFloat32, {num_blocks, BS, H});
  }
  const double qmax = config.kv_cache_dtype == KvCacheDtype::kInt8PerTokenHead ? 127.0 : 448.0;
  std::vector<double> x(static_cast<size_t>(D));
  for (int64_t block = 0; block < num_blocks; ++block) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      const double tensor_scale = kv == 0 ? options.k_scale : options.v_scale;
      for (int64_t slot = 0; slot < BS; ++slot) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = (((block * 2 + kv) * BS + slot) * H + h) * D;
          for (auto& v : x) v = normal(rng);
          double scale = tensor_scale;  // per-tensor fp8: stored = x / scale
          if (per_token_head) {
            double absmax = 0.0;
            for (double v : x) absmax = std::max(absmax, std::fabs(v));
            scale = std::max(absmax / qmax, 1e-6);
            Tensor& scales = kv == 0 ? in.k_scale_cache : in.v_scale_cache;
            const float stored_scale = block == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(scale);
            scales.data_as<float>()[(block * BS + slot) * H + h] = stored_scale;
          } else if (!is_quantized(config.kv_cache_dtype)) {
            scale = 1.0;
          }
          for (int64_t d = 0; d < D; ++d) {
            double value = x[static_cast<size_t>(d)] / scale;
            if (storage == DType::kInt8) value = std::clamp(std::nearbyint(value), -127.0, 127.0);
            if (block == 0) {
              // The null block: NaN where the type has one, the most negative int8 otherwise.
              value = storage == DType::kInt8 ? -128.0 : std::numeric_limits<double>::quiet_NaN();
            }
            store_from_double(in.kv_cache.data(), storage, base + d, value);
          }
        }
      }
    }
  }
}

}  // namespace

BatchFile make_synthetic_batch(const AttentionConfig& config, const BuilderConfig& builder,
                               const std::vector<RequestSpec>& requests, const SyntheticOptions& options) {
  validate(config);
  validate(builder);
  HYBRIDTB_CHECK(options.padding_tokens >= 0 && options.padding_requests >= 0,
                 "make_synthetic_batch: padding counts must be >= 0");
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
    int64_t max_blocks = 1;
    int64_t total_blocks = 0;
    for (int64_t r = 0; r < num_real; ++r) {
      const int64_t n = ceil_div(seq_lens[static_cast<size_t>(r)], BS);
      max_blocks = std::max(max_blocks, n);
      total_blocks += n;
    }
    num_blocks = 1 + total_blocks + options.spare_blocks;
    std::vector<int32_t> free_blocks(static_cast<size_t>(num_blocks - 1));
    std::iota(free_blocks.begin(), free_blocks.end(), 1);
    if (options.shuffle_blocks) std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    b.block_table = IntArray::matrix(R, max_blocks, 0);
    size_t next = 0;
    for (int64_t r = 0; r < num_real; ++r) {
      const RequestSpec& spec = requests[static_cast<size_t>(r)];
      const int64_t n = ceil_div(seq_lens[static_cast<size_t>(r)], BS);
      for (int64_t i = 0; i < n; ++i) {
        b.block_table.at(r, i) = free_blocks[next++];
        // A block whose last position k satisfies p − k ≥ window for the request's first query
        // position p = context_len is out of every query's window: vLLM frees it to the null block.
        const int64_t last_position = (i + 1) * BS - 1;
        const bool out_of_window = config.sliding_window > 0 &&
                                   last_position <= spec.context_len - config.sliding_window;
        if (options.null_out_of_window && out_of_window && spec.mm_prefix_ranges.empty()) b.block_table.at(r, i) = 0;
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
    auto slots_of = [&](int64_t seq_len) {
      return per_block ? std::max<int64_t>(1, ceil_div(seq_len, config.mamba_block_size))
                       : 1 + config.num_speculative_tokens;
    };
    int64_t width = 1;
    for (int64_t r = 0; r < num_real; ++r) width = std::max(width, slots_of(seq_lens[static_cast<size_t>(r)]));
    if (per_block) width += config.num_speculative_tokens;
    IntArray table = IntArray::matrix(R, width, 0);
    int32_t next_slot = 1;  // slot 0 stays unused, like vLLM's null block
    for (int64_t r = 0; r < num_real; ++r) {
      for (int64_t i = 0; i < width; ++i) table.at(r, i) = next_slot++;
    }
    b.ssm_block_table = std::move(table);
  }

  // Tensors.
  BatchInputs& in = file.inputs;
  in.query = random_tensor(rng, config.dtype, {T, config.num_heads, config.head_size});
  in.key = random_tensor(rng, config.dtype, {T, config.num_kv_heads, config.head_size});
  in.value = random_tensor(rng, config.dtype, {T, config.num_kv_heads, config.head_size});
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
