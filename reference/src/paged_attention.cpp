// Reference paged attention: vLLM's unified_attention (decoder layers, keys from the paged cache)
// and context_attention_fwd (encoder_only layers) evaluated in float64 from the exact stored
// values. Boring on purpose: per request and tile of query rows, gather the keys some row can see,
// S = Q·Kᵀ, mask through key_visible(), a one-shot softmax with the true row maximum, O = P·V.
// Checked against an independent naive formula by tests/attention (ctest -L attention).
#include "hybridtb/reference/paged_attention.h"

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/kv_cache.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb::reference {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Everything the mask of one request depends on (the rule: hybridtb/spec/visibility.h).
struct RequestMask {
  AttnType attn_type = AttnType::kDecoder;
  int64_t sliding_window = 0;          // W; 0 = no window
  int64_t seq_len = 0;                 // keys [0, seq_len) exist; nothing at or past it is visible
  const int32_t* mm_prefix = nullptr;  // (optional) [num_mm_ranges][2] inclusive (start, end) pairs
  int64_t num_mm_ranges = 0;           // a pair is a range only if start < end; (0, 0) pads
};

bool key_visible(const RequestMask& mask, int64_t p, int64_t k) {
  return spec::key_visible<int64_t>(mask.attn_type == AttnType::kEncoderOnly, mask.sliding_window, mask.seq_len,
                                    mask.mm_prefix, mask.num_mm_ranges, p, k);
}

// Query rows per work item. Keys are gathered once per tile, so larger tiles gather less often but
// may pull in keys only a few rows can see (with a sliding window); 64 balances the two.
constexpr int64_t kRowTile = 64;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The layer-wide constants of one call, in double.
struct Layer {
  AttnType attn_type = AttnType::kDecoder;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  int64_t num_kv_heads = 0;
  int64_t queries_per_kv = 0;
  int64_t head_size = 0;
  int64_t block_size = 0;
  double scale = 0.0;
  double soft_cap = 0.0;             // 0 = off
  std::vector<double> alibi_slopes;  // empty = no ALiBi
  bool alibi_sqrt = false;
  std::vector<double> sinks;         // empty = no sinks
  double k_scale = 1.0;              // per-tensor fp8 dequantisation
  double v_scale = 1.0;
  std::optional<double> output_scale;
};

// One request's share of the batch.
struct Request {
  int64_t index = 0;
  int64_t query_start = 0;  // first token row
  int64_t query_len = 0;
  int64_t context_len = 0;  // query row i sits at absolute position context_len + i
  RequestMask mask;
};

struct WorkItem {
  int64_t request = 0;  // index into the request list
  int64_t row_begin = 0;
  int64_t row_end = 0;  // query rows [row_begin, row_end) of the request
};

Layer make_layer(const AttentionConfig& config, const StepTensors& tensors) {
  Layer layer;
  layer.attn_type = config.attn_type;
  layer.kv_cache_dtype = config.kv_cache_dtype;
  layer.num_kv_heads = config.num_kv_heads;
  layer.queries_per_kv = config.num_queries_per_kv();
  layer.head_size = config.head_size;
  layer.block_size = config.block_size;
  layer.scale = config.scale;
  layer.k_scale = tensors.k_scale;
  layer.v_scale = tensors.v_scale;
  // vLLM's encoder path (TritonAttentionImpl._forward_encoder_attention) calls
  // context_attention_fwd with q, k, v, the scale and the window only: soft cap, ALiBi, sinks and
  // the fp8 output scale of the layer are silently dropped. Reproduced literally.
  if (config.attn_type == AttnType::kDecoder) {
    if (tensors.output_scale) layer.output_scale = *tensors.output_scale;
    layer.soft_cap = config.logits_soft_cap;
    if (config.alibi_slopes) layer.alibi_slopes.assign(config.alibi_slopes->begin(), config.alibi_slopes->end());
    layer.alibi_sqrt = config.use_alibi_sqrt;
    if (config.sinks) layer.sinks.assign(config.sinks->begin(), config.sinks->end());
  }
  return layer;
}

void check_shape(const TensorView& view, const char* name, const Shape& expected) {
  HYBRIDTB_CHECK(!view.empty(), name, " is missing");
  HYBRIDTB_CHECK(view.device() == Device::kHost, name, " must be a host tensor, got ", view.describe());
  HYBRIDTB_CHECK(view.shape() == expected, name, " must have shape ", shape_to_string(expected), ", got ",
                 view.describe());
}

void check_inputs(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors,
                  const TensorView& output) {
  const int64_t t = batch.num_tokens();
  const int64_t hq = config.num_heads;
  const int64_t hkv = config.num_kv_heads;
  const int64_t d = config.head_size;
  HYBRIDTB_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "num_heads (", hq, ") must be a positive multiple of num_kv_heads (",
                 hkv, ")");
  HYBRIDTB_CHECK(d > 0, "head_size must be positive, got ", d);
  HYBRIDTB_CHECK(config.sliding_window >= 0, "sliding_window must be ≥ 0, got ", config.sliding_window);
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", t, "]");
  HYBRIDTB_CHECK(batch.query_start_loc.rank() == 1 && batch.query_start_loc.numel() >= 1,
                 "query_start_loc must be a 1-d array of R + 1 entries");
  HYBRIDTB_CHECK(batch.seq_lens.numel() == batch.num_reqs(), "seq_lens has ", batch.seq_lens.numel(),
                 " entries for ", batch.num_reqs(), " requests");
  check_shape(tensors.query, "query", {t, hq, d});
  check_shape(output, "output", {t, hq, d});
  HYBRIDTB_CHECK(is_floating(output.dtype()), "output must have a floating dtype, got ", output.describe());
  if (config.alibi_slopes) {
    HYBRIDTB_CHECK(static_cast<int64_t>(config.alibi_slopes->size()) == hq, "alibi_slopes must have num_heads (",
                   hq, ") entries");
  }
  if (config.sinks) {
    HYBRIDTB_CHECK(static_cast<int64_t>(config.sinks->size()) == hq, "sinks must have num_heads (", hq, ") entries");
  }
  if (batch.mm_prefix_range) {
    const IntArray& mm = *batch.mm_prefix_range;
    HYBRIDTB_CHECK(mm.rank() == 3 && mm.size(0) == batch.num_reqs() && mm.size(2) == 2,
                   "mm_prefix_range must have shape [num_reqs, M, 2], got ", mm.describe());
  }

  if (config.attn_type == AttnType::kEncoderOnly) {
    if (is_quantized(config.kv_cache_dtype)) {
      throw NotSupported(detail::concat("kv_cache_dtype ", to_string(config.kv_cache_dtype),
                                        " not supported for encoder_only (vLLM raises NotImplementedError)"));
    }
    check_shape(tensors.key, "key", {t, hkv, d});
    check_shape(tensors.value, "value", {t, hkv, d});
    return;
  }
  spec::bind_kv_cache(config, tensors, Device::kHost);
  HYBRIDTB_CHECK(batch.block_table.rank() == 2 && batch.block_table.size(0) >= batch.num_reqs(),
                 "block_table must have one row per request, got ", batch.block_table.describe());
}

std::vector<Request> make_requests(const AttentionConfig& config, const BatchDescription& batch) {
  std::vector<Request> requests;
  for (int64_t r = 0; r < batch.num_reqs(); ++r) {
    Request request;
    request.index = r;
    request.query_start = batch.query_start_loc[r];
    request.query_len = batch.query_len(r);
    const int64_t seq_len = batch.seq_len(r);
    HYBRIDTB_CHECK(request.query_len >= 0 && request.query_start >= 0 &&
                       request.query_start + request.query_len <= batch.num_actual_tokens,
                   "request ", r, ": query rows [", request.query_start, ", ", request.query_start + request.query_len,
                   ") must lie within num_actual_tokens (", batch.num_actual_tokens, ")");
    HYBRIDTB_CHECK(seq_len >= request.query_len, "request ", r, ": seq_len (", seq_len, ") < query_len (",
                   request.query_len, ")");
    if (config.attn_type == AttnType::kEncoderOnly) {
      HYBRIDTB_CHECK(seq_len == request.query_len, "request ", r, ": encoder_only needs seq_len (", seq_len,
                     ") == query_len (", request.query_len, ")");
    } else {
      HYBRIDTB_CHECK((seq_len + config.block_size - 1) / config.block_size <= batch.block_table.size(1), "request ", r,
                     ": seq_len ", seq_len, " needs more blocks than block_table has columns (",
                     batch.block_table.size(1), ")");
    }
    if (request.query_len == 0) continue;  // a padding request: nothing to compute, nothing to write
    request.context_len = seq_len - request.query_len;
    request.mask.attn_type = config.attn_type;
    request.mask.sliding_window = config.sliding_window;
    request.mask.seq_len = seq_len;
    if (batch.mm_prefix_range) {
      const IntArray& mm = *batch.mm_prefix_range;
      request.mask.num_mm_ranges = mm.size(1);
      request.mask.mm_prefix = mm.values.data() + r * mm.size(1) * 2;
    }
    requests.push_back(request);
  }
  return requests;
}

// Reads `n` elements of `view` starting at element offset `offset`, `stride` apart, exactly. The
// common storage types decode in a typed loop (the gather of long contexts is the hot path);
// everything goes through dtype.h's exact decoders.
template <typename Bits, typename Decode>
void load_typed(const TensorView& view, int64_t offset, int64_t stride, int64_t n, double* out, Decode decode) {
  const auto* bytes = static_cast<const unsigned char*>(view.data());
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + (offset + i * stride) * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    out[i] = static_cast<double>(decode(bits));
  }
}

void load_row(const TensorView& view, int64_t offset, int64_t stride, int64_t n, double* out) {
  switch (view.dtype()) {
    case DType::kBFloat16:
      return load_typed<uint16_t>(view, offset, stride, n, out, bfloat16_to_float);
    case DType::kFloat16:
      return load_typed<uint16_t>(view, offset, stride, n, out, half_to_float);
    case DType::kFloat32:
      return load_typed<float>(view, offset, stride, n, out, [](float x) { return x; });
    case DType::kFloat8E4M3:
      return load_typed<uint8_t>(view, offset, stride, n, out, fp8_e4m3_to_float);
    case DType::kInt8:
      return load_typed<int8_t>(view, offset, stride, n, out, [](int8_t x) { return x; });
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = load_as_double(view.data(), view.dtype(), offset + i * stride);
  }
}

// Where the keys and values of one work item come from, dequantised exactly in double (no
// re-rounding to the model dtype: the kernel's bf16/fp16 rounding of dequantised K/V and of P is
// a precision detail of the kernel that the parity tolerances absorb).
class KvReader {
 public:
  KvReader(const Layer& layer, const BatchDescription& batch, const StepTensors& tensors)
      : layer_(layer), batch_(batch), tensors_(tensors) {}

  // Row `position` of the request's keys (half 0) or values (half 1) for one kv head → out[D].
  void read(int half, const Request& request, int64_t kv_head, int64_t position, double* out) const {
    const int64_t d = layer_.head_size;
    if (layer_.attn_type == AttnType::kEncoderOnly) {
      // No cache: the request's own key/value rows of this step.
      const TensorView& source = half == 0 ? tensors_.key : tensors_.value;
      load_row(source, source.offset({request.query_start + position, kv_head, 0}), source.stride(2), d, out);
      return;
    }
    const TensorView& cache = tensors_.kv_cache;
    const int64_t block = batch_.block_table.at(request.index, position / layer_.block_size);
    const int64_t slot = position % layer_.block_size;
    HYBRIDTB_CHECK(block >= 0 && block < cache.size(0), "request ", request.index, ": block_table entry ", block,
                   " for key position ", position, " is outside the cache's ", cache.size(0), " blocks");
    load_row(cache, cache.offset({block, half, slot, kv_head, 0}), cache.stride(4), d, out);

    double scale = 1.0;
    switch (layer_.kv_cache_dtype) {
      case KvCacheDtype::kAuto:
        return;
      case KvCacheDtype::kFp8E4M3:
      case KvCacheDtype::kFp8E5M2:
        scale = half == 0 ? layer_.k_scale : layer_.v_scale;
        break;
      case KvCacheDtype::kInt8PerTokenHead:
      case KvCacheDtype::kFp8PerTokenHead: {
        const TensorView& scales = half == 0 ? tensors_.k_scale_cache : tensors_.v_scale_cache;
        scale = load_as_double(scales.data(), scales.dtype(), scales.offset({block, slot, kv_head}));
        break;
      }
    }
    for (int64_t i = 0; i < d; ++i) out[i] *= scale;
  }

 private:
  const Layer& layer_;
  const BatchDescription& batch_;
  const StepTensors& tensors_;
};

// scale · (q·k), then the soft cap, then the ALiBi bias — vLLM's order (§1.4).
double logit(const Layer& layer, int64_t head, double dot, int64_t p, int64_t k, int64_t context_len) {
  double s = layer.scale * dot;
  // True tanh. vLLM writes c·(e^x − e^−x)/(e^x + e^−x), which overflows to inf/inf = NaN for
  // |s/c| ≳ 88.7 where tanh saturates; that overflow is a kernel defect, not reproduced.
  if (layer.soft_cap > 0.0) s = layer.soft_cap * std::tanh(s / layer.soft_cap);
  if (!layer.alibi_slopes.empty()) {
    const double slope = layer.alibi_slopes[head];
    if (layer.alibi_sqrt) {
      const int64_t rel = k - p;
      s += slope * (rel <= 0 ? -std::sqrt(static_cast<double>(-rel)) : 0.0);
    } else {
      // vLLM's linear form is relative to the chunk start, not to the query (k − p): the
      // difference is a per-row constant that softmax cancels, except against a sink's logit.
      s += slope * static_cast<double>(k - context_len);
    }
  }
  return s;
}

// The value finally stored for one output element.
double output_value(const Layer& layer, double o) {
  if (!layer.output_scale) return o;
  // fp8 output: the kernel stores clamp(o · (1/output_scale), FP8_MIN, FP8_MAX) (e4m3fn range);
  // `output` then holds quantised-domain values. Computed in double; the output view's dtype
  // does the final rounding.
  const double limit = fp8_max(DType::kFloat8E4M3);
  return std::clamp(o / *layer.output_scale, -limit, limit);
}

// Computes output rows [row_begin, row_end) of one request, all query heads.
void run_item(const Layer& layer, const KvReader& kv, const Request& request, const WorkItem& item,
              const StepTensors& tensors, const TensorView& output) {
  const int64_t rows = item.row_end - item.row_begin;
  const int64_t d = layer.head_size;

  const int64_t first_position = request.context_len + item.row_begin;  // of row 0 of the tile

  // The keys visible to at least one row of the tile; keys no row can see are never read, so NaN
  // in freed or null blocks cannot leak. Then each row's own visibility over them.
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < request.mask.seq_len; ++k) {
    for (int64_t i = 0; i < rows; ++i) {
      if (key_visible(request.mask, first_position + i, k)) {
        keys.push_back(k);
        break;
      }
    }
  }
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<uint8_t> visible(static_cast<size_t>(rows * n));  // [rows][n]
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n; ++j) visible[i * n + j] = key_visible(request.mask, first_position + i, keys[j]) ? 1 : 0;
  }

  Matrix k_tile(n, d), v_tile(n, d), q_tile(rows, d), s(rows, n), o(rows, d);
  std::vector<double> denominator(static_cast<size_t>(rows));
  std::vector<uint8_t> has_keys(static_cast<size_t>(rows));
  for (int64_t kv_head = 0; kv_head < layer.num_kv_heads; ++kv_head) {
    for (int64_t j = 0; j < n; ++j) {
      kv.read(0, request, kv_head, keys[j], k_tile.row(j).data());
      kv.read(1, request, kv_head, keys[j], v_tile.row(j).data());
    }
    for (int64_t head = kv_head * layer.queries_per_kv; head < (kv_head + 1) * layer.queries_per_kv; ++head) {
      for (int64_t i = 0; i < rows; ++i) {
        const TensorView& q = tensors.query;
        load_row(q, q.offset({request.query_start + item.row_begin + i, head, 0}), q.stride(2), d, q_tile.row(i).data());
      }
      s.noalias() = q_tile * k_tile.transpose();

      // Softmax over each row's visible keys with the true row maximum; a sink σ adds e^σ to the
      // denominator and nothing to the numerator: o = Σ e^{s_k} v_k / (e^σ + Σ e^{s_k}).
      const bool use_sink = !layer.sinks.empty();
      const double sink = use_sink ? layer.sinks[head] : 0.0;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t p = first_position + i;
        double row_max = kNegInf;
        bool any = false;
        for (int64_t j = 0; j < n; ++j) {
          if (!visible[i * n + j]) continue;
          s(i, j) = logit(layer, head, s(i, j), p, keys[j], request.context_len);
          // A NaN logit sticks (nothing compares greater than NaN): the row becomes NaN.
          if (std::isnan(s(i, j)) || s(i, j) > row_max) row_max = s(i, j);
          any = true;
        }
        has_keys[i] = any ? 1 : 0;
        if (use_sink && sink > row_max) row_max = sink;
        double sum = use_sink ? std::exp(sink - row_max) : 0.0;
        for (int64_t j = 0; j < n; ++j) {
          // Masked scores become exact zeros by a select, never by arithmetic on them.
          s(i, j) = visible[i * n + j] ? std::exp(s(i, j) - row_max) : 0.0;
          sum += s(i, j);
        }
        denominator[i] = sum;
      }
      o.noalias() = s * v_tile;

      for (int64_t i = 0; i < rows; ++i) {
        const int64_t token = request.query_start + item.row_begin + i;
        const int64_t base = output.offset({token, head, 0});
        for (int64_t c = 0; c < d; ++c) {
          // A row without visible keys outputs 0 (the kernel's 0/1); it cannot happen for a valid
          // row, whose own position is always visible.
          const double value = has_keys[i] ? o(i, c) / denominator[i] : 0.0;
          store_from_double(output.data(), output.dtype(), base + c * output.stride(2), output_value(layer, value));
        }
      }
    }
  }
}

// Runs the work items on a few threads. Items write disjoint output rows and each item's
// arithmetic does not depend on the thread that runs it, so results are bitwise deterministic.
template <typename Fn>
void run_parallel(int64_t count, const Fn& fn) {
  const int64_t threads =
      std::min<int64_t>(count, std::clamp<int64_t>(static_cast<int64_t>(std::thread::hardware_concurrency()), 1, 16));
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (int64_t i = next++; i < count; i = next++) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = count;  // stop handing out work
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

void paged_attention(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors,
                     const TensorView& output) {
  check_inputs(config, batch, tensors, output);
  const Layer layer = make_layer(config, tensors);
  const std::vector<Request> requests = make_requests(config, batch);
  const KvReader kv(layer, batch, tensors);

  std::vector<WorkItem> items;
  for (int64_t r = 0; r < static_cast<int64_t>(requests.size()); ++r) {
    for (int64_t row = 0; row < requests[r].query_len; row += kRowTile) {
      items.push_back({r, row, std::min(row + kRowTile, requests[r].query_len)});
    }
  }
  // Progress (tensors.progress): query tokens done, and an ETA weight per item of rows × the keys
  // a causal row of it may see (a late tile of a long prefill costs more than an early one).
  std::vector<double> cost(items.size());
  double total_cost = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Request& request = requests[items[i].request];
    const int64_t keys =
        std::clamp<int64_t>(request.context_len + items[i].row_end, 1, std::max<int64_t>(1, request.mask.seq_len));
    cost[i] = static_cast<double>(items[i].row_end - items[i].row_begin) * static_cast<double>(keys);
    total_cost += cost[i];
  }
  int64_t total_rows = 0;
  for (const Request& request : requests) total_rows += request.query_len;
  std::mutex progress_mutex;
  int64_t done_rows = 0;
  double done_cost = 0;
  if (tensors.progress != nullptr) tensors.progress->report("attention", 0, total_rows, 0.0);
  run_parallel(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const WorkItem& item = items[i];
    run_item(layer, kv, requests[item.request], item, tensors, output);
    if (tensors.progress != nullptr) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      done_rows += item.row_end - item.row_begin;
      done_cost += cost[i];
      tensors.progress->report("attention", done_rows, total_rows, total_cost > 0 ? done_cost / total_cost : 1.0);
    }
  });
}

}  // namespace hybridtb::reference
