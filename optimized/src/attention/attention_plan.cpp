// The attention planner/runner (see attention_plan.h). The visibility hulls computed here follow
// hybridtb/spec/visibility.h: a decoder row at position p sees [p − W + 1, p] ∩ [0, seq_len)
// plus the mm_prefix ranges that contain p; an encoder row sees |p − k| < W within the request.
#include "attention/attention_plan.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <sstream>

#include "attention/attention_launch.h"
#include "common/cuda_check.h"
#include "common/debug_slowdown.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/kv_cache.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb::cuda {

namespace {

int32_t to_i32(int64_t v) { return static_cast<int32_t>(v); }

void check_view(const TensorView& view, const char* name, const Shape& expected, DType dtype) {
  HYBRIDTB_CHECK(!view.empty(), name, " is missing");
  HYBRIDTB_CHECK(view.device() == Device::kCuda, name, " must be a CUDA tensor, got ", view.describe());
  HYBRIDTB_CHECK(view.shape() == expected, name, " must have shape ", shape_to_string(expected), ", got ",
                 view.describe());
  HYBRIDTB_CHECK(view.dtype() == dtype, name, " must be ", to_string(dtype), ", got ", view.describe());
  HYBRIDTB_CHECK(view.stride(view.rank() - 1) == 1, name, " must be contiguous in its last dimension, got strides ",
                 shape_to_string(view.strides()));
}

// Appends `count` trivially copyable values to the staging bytes at a 16-byte boundary; returns
// the byte offset.
template <typename T>
size_t append(std::vector<unsigned char>& bytes, const T* values, size_t count) {
  const size_t offset = (bytes.size() + 15) / 16 * 16;
  bytes.resize(offset + count * sizeof(T));
  if (count > 0) std::memcpy(bytes.data() + offset, values, count * sizeof(T));
  return offset;
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

}  // namespace

std::string AttentionPlanSummary::describe() const {
  std::ostringstream out;
  out << "decode fast path: " << decode_rows << " rows (" << split_rows << " split, " << decode_ctas
      << " key CTAs; tensor-core: " << decode_mma_rows << " rows in " << decode_mma_ctas << " key CTAs, SIMT: "
      << decode_rows - decode_mma_rows << " rows" << (decode_fallback.empty() ? "" : " [" + decode_fallback + "]")
      << "); tensor-core prefill path: " << prefill_rows << " rows in " << prefill_items
      << " CTAs; generic path: " << generic_rows << " rows in " << generic_items << " CTAs";
  if (!prefill_fallback.empty()) out << " (not on the tensor-core path: " << prefill_fallback << ")";
  return out.str();
}

AttentionRunner::AttentionRunner(const AttentionConfig& config, DeviceMemory& memory, int num_sms)
    : config_(config), memory_(memory), num_sms_(num_sms), meta_(memory), partials_(memory) {
  const int64_t hq = config.num_heads;
  if (config.alibi_slopes) {
    alibi_ = memory_.allocate(static_cast<size_t>(hq) * sizeof(float));
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(alibi_.get(), config.alibi_slopes->data(), static_cast<size_t>(hq) * sizeof(float),
                                   cudaMemcpyHostToDevice));
  }
  if (config.sinks) {
    sinks_ = memory_.allocate(static_cast<size_t>(hq) * sizeof(float));
    HYBRIDTB_CUDA_CHECK(
        cudaMemcpy(sinks_.get(), config.sinks->data(), static_cast<size_t>(hq) * sizeof(float), cudaMemcpyHostToDevice));
  }
  heads_per_pass_ = decode_heads_per_pass(config.num_queries_per_kv());
  if (std::has_single_bit(static_cast<uint64_t>(config.block_size))) {
    block_shift_ = std::countr_zero(static_cast<uint64_t>(config.block_size));
  }
}

void AttentionRunner::fix_shape(const BatchDescription& batch) {
  HYBRIDTB_CHECK(!fixed_, "AttentionRunner::fix_shape: the shape is already fixed");
  const AttentionConfig& c = config_;
  if (c.attn_type == AttnType::kEncoderOnly) {
    throw NotSupported("CUDA-graph capture of encoder_only layers (decode steps only)");
  }
  const DType storage = kv_storage_dtype(c.kv_cache_dtype, c.dtype);
  if (force_generic || !decode_supported(element_kind(storage), c.head_size)) {
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
  FixedShape f;
  f.num_reqs = r_count;
  f.block_columns = batch.block_table.size(1);
  f.mm_prefix = batch.mm_prefix_range.has_value();
  f.mm_ranges = f.mm_prefix && batch.mm_prefix_range->rank() == 3 ? batch.mm_prefix_range->size(1) : 0;
  // Items of one decode kernel for any batch of this shape (the split rule in prepare()): with
  // chunk ≥ total_keys·hkv·passes / target (or the maximum chunk), Σ ceil(n_i / chunk) ≤ rows +
  // target / (hkv·passes) + max_keys / decode_max_split_keys.
  const int64_t qpk = c.num_queries_per_kv();
  const int64_t max_keys = r_count * f.block_columns * c.block_size;
  const auto capacity = [&](int64_t heads_per_pass, int64_t ctas_per_sm) {
    const int64_t passes = (qpk + heads_per_pass - 1) / heads_per_pass;
    const int64_t per_head_pass = c.num_kv_heads * passes;
    const int64_t target = std::max<int64_t>(1, ctas_per_sm * num_sms_);
    return r_count + (target + per_head_pass - 1) / per_head_pass +
           (max_keys + decode_max_split_keys - 1) / decode_max_split_keys + 1;
  };
  const ElementKind q_kind = element_kind(c.dtype);
  const bool mma = !disable_decode_mma && decode_mma_supported(q_kind, element_kind(storage), c.head_size);
  if (mma) f.decode_mma_capacity = capacity(decode_mma_heads_per_pass(qpk, c.head_size), decode_mma_ctas_per_sm);
  // mm_prefix rows whose ranges widen the visible keys take the SIMT kernel.
  if (!mma || f.mm_prefix) f.decode_capacity = capacity(heads_per_pass_, decode_ctas_per_sm);
  fixed_ = std::move(f);
}

// The checks of a batch that need no tensor.
void AttentionRunner::check_batch(const BatchDescription& batch) const {
  const AttentionConfig& c = config_;
  const int64_t t = batch.num_tokens();
  const int64_t r_count = batch.num_reqs();
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", t, "]");
  HYBRIDTB_CHECK(batch.seq_lens.numel() == r_count, "seq_lens has ", batch.seq_lens.numel(), " entries for ", r_count,
                 " requests");
  if (fixed_) {
    const FixedShape& f = *fixed_;
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

// The block table's rows for every block the requests' seq_lens need: ids in [0, cache_blocks).
// Returns how many blocks the batch spans (the largest id + 1; 0 for none).
int64_t AttentionRunner::referenced_blocks(const BatchDescription& batch, int64_t cache_blocks) const {
  const int64_t r_count = batch.num_reqs();
  HYBRIDTB_CHECK(batch.block_table.rank() == 2 && batch.block_table.size(0) >= r_count,
                 "block_table must have one row per request, got ", batch.block_table.describe());
  int64_t spanned = 0;
  // Block ids are consulted on the device without bounds checks: check them here.
  for (int64_t r = 0; r < r_count; ++r) {
    const int64_t blocks = (batch.seq_len(r) + config_.block_size - 1) / config_.block_size;
    HYBRIDTB_CHECK(blocks <= batch.block_table.size(1), "request ", r, ": seq_len ", batch.seq_len(r),
                   " needs more blocks than block_table has columns (", batch.block_table.size(1), ")");
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t id = batch.block_table.at(r, b);
      HYBRIDTB_CHECK(id >= 0 && id < cache_blocks, "request ", r, ": block_table entry ", id,
                     " is outside the cache's ", cache_blocks, " blocks");
      spanned = std::max(spanned, id + 1);
    }
  }
  return spanned;
}

// The kernel parameters the configuration alone decides.
AttentionParams AttentionRunner::config_params() const {
  const AttentionConfig& c = config_;
  const bool encoder = c.attn_type == AttnType::kEncoderOnly;
  AttentionParams p{};
  p.num_heads = to_i32(c.num_heads);
  p.num_kv_heads = to_i32(c.num_kv_heads);
  p.queries_per_kv = to_i32(c.num_queries_per_kv());
  p.head_size = to_i32(c.head_size);
  p.block_size = to_i32(c.block_size);
  p.sliding_window = to_i32(c.sliding_window);
  p.scale = static_cast<float>(c.scale);
  p.encoder = encoder ? 1 : 0;
  p.q_kind = element_kind(c.dtype);
  const spec::KvCacheFormat kv_format = spec::kv_cache_format(c.kv_cache_dtype, c.dtype);
  p.kv_kind = element_kind(kv_format.storage);
  p.kv_scale_mode = kv_format.scaling == spec::KvCacheScaling::kPerTokenHead ? KvScaleMode::kPerTokenHead
                    : kv_format.scaling == spec::KvCacheScaling::kPerTensor  ? KvScaleMode::kPerTensor
                                                                             : KvScaleMode::kNone;
  // vLLM's encoder path drops soft cap, ALiBi, sinks and the fp8 output scale (reference make_layer).
  if (!encoder) {
    p.soft_cap = static_cast<float>(c.logits_soft_cap);
    p.alibi_slopes = static_cast<const float*>(alibi_.get());
    p.alibi_sqrt = c.use_alibi_sqrt ? 1 : 0;
    p.sinks = static_cast<const float*>(sinks_.get());
  }
  return p;
}

// One call's tensors (t token rows) checked and bound over config_params(); also says whether the
// decode kernels can read the cache and, if the tensor-core prefill cannot run, why.
AttentionParams AttentionRunner::bind(int64_t t, const StepTensors& tensors, const TensorView& output,
                                      const FusedAdd& fused, bool& decode_ok, std::string& prefill_why) const {
  const AttentionConfig& c = config_;
  const bool encoder = c.attn_type == AttnType::kEncoderOnly;
  const int64_t hq = c.num_heads;
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  check_view(tensors.query, "query", {t, hq, d}, c.dtype);
  check_view(output, "output", {t, hq, d}, c.dtype);
  HYBRIDTB_CHECK(fused.addend.empty() || !fused.output.empty(),
                 "the fused hybrid add needs the hybrid output beside the SSM contribution");
  for (const TensorView* v : {&fused.addend, &fused.output}) {
    if (v->empty()) continue;
    check_view(*v, "the fused add's SSM contribution/hybrid output", {t, hq, d}, c.dtype);
    HYBRIDTB_CHECK(v->strides() == output.strides(), "the fused add's tensors must have the output's strides ",
                   shape_to_string(output.strides()), ", got ", v->describe());
  }
  AttentionParams p = config_params();
  p.query = tensors.query.data();
  p.q_stride_token = tensors.query.stride(0);
  p.q_stride_head = tensors.query.stride(1);
  p.output = output.data();
  p.o_stride_token = output.stride(0);
  p.o_stride_head = output.stride(1);
  p.ssm_addend = fused.addend.empty() ? nullptr : fused.addend.data();
  p.hybrid_output = fused.output.empty() ? nullptr : fused.output.data();
  bool cache_vectorisable = false;
  if (encoder) {
    check_view(tensors.key, "key", {t, hkv, d}, c.dtype);
    check_view(tensors.value, "value", {t, hkv, d}, c.dtype);
    p.key = tensors.key.data();
    p.value = tensors.value.data();
    p.k_stride_token = tensors.key.stride(0);
    p.k_stride_head = tensors.key.stride(1);
    p.v_stride_token = tensors.value.stride(0);
    p.v_stride_head = tensors.value.stride(1);
  } else {
    const spec::KvCacheBinding bound = spec::bind_kv_cache(c, tensors, Device::kCuda);
    const TensorView& cache = bound.cache;
    p.kv_cache = cache.data();
    p.cache_stride_block = cache.stride(0);
    p.cache_stride_half = cache.stride(1);
    p.cache_stride_slot = cache.stride(2);
    p.cache_stride_head = cache.stride(3);
    // The decode kernel reads 8 elements per lane in one 16-byte (8-byte) load.
    const int64_t align = 8;
    cache_vectorisable = p.cache_stride_block % align == 0 && p.cache_stride_half % align == 0 &&
                         p.cache_stride_slot % align == 0 && p.cache_stride_head % align == 0 &&
                         reinterpret_cast<uintptr_t>(cache.data()) % 16 == 0;
    if (bound.format.scaling == spec::KvCacheScaling::kPerTokenHead) {
      p.k_scale_cache = static_cast<const float*>(bound.k_scale_cache.data());
      p.v_scale_cache = static_cast<const float*>(bound.v_scale_cache.data());
    }
  }
  p.k_scale = tensors.k_scale;
  p.v_scale = tensors.v_scale;
  if (!encoder && tensors.output_scale) {
    p.fp8_output = 1;
    p.output_scale = *tensors.output_scale;
  }

  decode_ok = !encoder && !force_generic && decode_supported(p.kv_kind, d) && cache_vectorisable;
  // Tensor-core prefill: 16-bit model dtype = cache element, D 64/128/256, 16-byte aligned rows
  // (cp.async) and 4-byte aligned output pairs.
  prefill_why.clear();
  const auto aligned = [](const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  const ElementKind kv_elem = encoder ? p.q_kind : p.kv_kind;
  // The epilogue stores element pairs to the output and the fused add's tensors (same strides).
  bool rows_aligned = p.q_stride_token % 8 == 0 && p.q_stride_head % 8 == 0 && aligned(p.query, 16) &&
                      p.o_stride_token % 2 == 0 && p.o_stride_head % 2 == 0 && aligned(p.output, 4) &&
                      aligned(p.ssm_addend, 4) && aligned(p.hybrid_output, 4);
  if (encoder) {
    rows_aligned = rows_aligned && p.k_stride_token % 8 == 0 && p.k_stride_head % 8 == 0 &&
                   p.v_stride_token % 8 == 0 && p.v_stride_head % 8 == 0 && aligned(p.key, 16) &&
                   aligned(p.value, 16);
  } else {
    rows_aligned = rows_aligned && cache_vectorisable;
  }
  if (force_generic || disable_prefill) {
    prefill_why = "forced generic";
  } else if (!prefill_supported(p.q_kind, kv_elem, d)) {
    prefill_why = detail::concat("dtype ", to_string(c.dtype), ", kv_cache_dtype ", to_string(c.kv_cache_dtype),
                                 ", head size ", d, " (needs float16/bfloat16 with a 16-bit auto cache, D 64/128/256)");
  } else if (!rows_aligned) {
    prefill_why = "query/output/cache rows not 16-byte aligned";
  }
  return p;
}

void AttentionRunner::prepare(const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
                              cudaStream_t stream, const FusedAdd& fused) {
  check_batch(batch);
  bool decode_ok = false;
  std::string prefill_why;
  AttentionParams p = bind(batch.num_tokens(), tensors, output, fused, decode_ok, prefill_why);
  if (config_.attn_type != AttnType::kEncoderOnly) referenced_blocks(batch, tensors.kv_cache.size(0));
  HYBRIDTB_CHECK(!fixed_ || decode_ok, "CUDA graph: the KV cache ", tensors.kv_cache.describe(),
                 " is not 16-byte aligned, which the decode kernels need");
  plan(batch, decode_ok, prefill_why, p, stream);
  params_ = p;
  if (fixed_) check_fixed_params();
}

void AttentionRunner::prepare_plan(const BatchDescription& batch, cudaStream_t stream) {
  HYBRIDTB_CHECK(fixed_, "AttentionRunner::prepare_plan needs fixed-shape mode (fix_shape)");
  check_batch(batch);
  // fix_shape checked that the decode kernels take this configuration; launch_on checks the cache's
  // alignment they need. A fixed-shape batch has no prefill rows.
  const int64_t spanned = referenced_blocks(batch, std::numeric_limits<int64_t>::max());
  AttentionParams p = config_params();
  plan(batch, /*decode_ok=*/true, "a CUDA-graph decode step", p, stream);
  params_ = p;
  plan_blocks_ = spanned;
  plan_tokens_ = batch.num_tokens();
  planned_alone_ = true;
}

void AttentionRunner::launch_on(const StepTensors& tensors, const TensorView& output, const FusedAdd& fused,
                                cudaStream_t stream) const {
  HYBRIDTB_CHECK(planned_alone_, "AttentionRunner::launch_on called before prepare_plan");
  bool decode_ok = false;
  std::string prefill_why;
  AttentionParams p = bind(plan_tokens_, tensors, output, fused, decode_ok, prefill_why);
  HYBRIDTB_CHECK(decode_ok, "CUDA graph: the KV cache ", tensors.kv_cache.describe(),
                 " is not 16-byte aligned, which the decode kernels need");
  HYBRIDTB_CHECK(plan_blocks_ <= tensors.kv_cache.size(0), "the planned block_table reaches block ", plan_blocks_ - 1,
                 ", outside this kv_cache's ", tensors.kv_cache.size(0), " blocks");
  // The plan's half of the parameters: its buffers, the block table's stride, the partials.
  p.block_table_stride = params_.block_table_stride;
  p.num_mm_ranges = params_.num_mm_ranges;
  p.partial_acc = params_.partial_acc;
  p.partial_ml = params_.partial_ml;
  p.query_start_loc = params_.query_start_loc;
  p.seq_lens = params_.seq_lens;
  p.block_table = params_.block_table;
  p.mm_prefix = params_.mm_prefix;
  p.generic_items = params_.generic_items;
  p.prefill_items = params_.prefill_items;
  p.decode_items = params_.decode_items;
  p.combine_items = params_.combine_items;
  launch_with(p, stream);
}

// The work lists of `batch` (decode_ok: the decode kernels can read the cache; prefill_why: why the
// tensor-core prefill cannot run, "" if it can) uploaded in one copy; their device pointers, the
// block table's stride and the partials are written into `p`.
void AttentionRunner::plan(const BatchDescription& batch, bool decode_ok, const std::string& prefill_why,
                           AttentionParams& p, cudaStream_t stream) {
  const AttentionConfig& c = config_;
  const bool encoder = c.attn_type == AttnType::kEncoderOnly;
  const int64_t r_count = batch.num_reqs();
  const int64_t hq = c.num_heads;
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  const int64_t qpk = c.num_queries_per_kv();
  const bool prefill_ok = prefill_why.empty();
  std::vector<GenericItem> generic;
  std::vector<GenericItem> prefill;
  std::vector<DecodeItem> decode;
  std::vector<CombineItem> combine;
  std::vector<DecodeItem> decode_mma;
  struct DecodeRow {
    int64_t request;
    KeyRange range;
  };
  std::vector<DecodeRow> decode_rows;      // SIMT decode kernel
  std::vector<DecodeRow> decode_mma_rows;  // tensor-core decode kernel
  // Tensor-core decode: 16-bit model dtype = cache element (auto), D 64/128/256, 16-byte cache rows;
  // per row additionally: its mm_prefix ranges add no key (visibility = the causal/window interval).
  std::string decode_mma_why;
  if (!decode_ok) {
    decode_mma_why = "no decode path";
  } else if (disable_decode_mma) {
    decode_mma_why = "tensor-core decode disabled";
  } else if (!decode_mma_supported(p.q_kind, p.kv_kind, d)) {
    decode_mma_why = detail::concat("kv_cache_dtype ", to_string(c.kv_cache_dtype), " / dtype ", to_string(c.dtype),
                                    " (needs a float16/bfloat16 auto cache; 1-byte caches take the SIMT decode kernel)");
  }
  summary_ = AttentionPlanSummary{};
  const int64_t tokens_per_item = qpk >= 32 ? 1 : 32 / qpk;
  const int64_t heads_per_item = std::min<int64_t>(qpk, 32);
  HYBRIDTB_CHECK(prefill_variant >= -1 && prefill_variant < prefill_num_variants(), "prefill_variant ",
                 prefill_variant, " is not one of -1 (default) … ", prefill_num_variants() - 1);
  prefill_variant_used_ = prefill_variant >= 0 ? prefill_variant : prefill_default_variant(d);
  HYBRIDTB_CHECK(!prefill_ok || prefill_variant_supported(d, prefill_variant_used_), "prefill_variant ",
                 prefill_variant_used_, " is not instantiated for head size ", d);
  const int64_t prefill_rows = prefill_rows_per_item(d, prefill_variant_used_);
  const int64_t prefill_heads = std::min<int64_t>(qpk, prefill_rows);
  const int64_t prefill_tokens = std::max<int64_t>(1, prefill_rows / prefill_heads);
  for (int64_t r = 0; r < r_count; ++r) {
    const int64_t q_len = batch.query_len(r);
    const int64_t start = batch.query_start_loc[r];
    HYBRIDTB_CHECK(q_len >= 0 && start >= 0 && start + q_len <= batch.num_actual_tokens, "request ", r,
                   ": query rows [", start, ", ", start + q_len, ") must lie within num_actual_tokens (",
                   batch.num_actual_tokens, ")");
    HYBRIDTB_CHECK(batch.seq_len(r) >= q_len, "request ", r, ": seq_len (", batch.seq_len(r), ") < query_len (", q_len,
                   ")");
    HYBRIDTB_CHECK(!encoder || batch.seq_len(r) == q_len, "request ", r, ": encoder_only needs seq_len (",
                   batch.seq_len(r), ") == query_len (", q_len, ")");
    if (q_len == 0) continue;  // a padding request
    const int64_t context_len = batch.seq_len(r) - q_len;
    if (decode_ok && q_len == 1) {
      const KeyRange range = key_range(c, batch, r, context_len, context_len);
      const bool mm_free = range.key_begin == range.causal_begin && range.key_end == range.causal_end;
      if (decode_mma_why.empty() && mm_free) {
        decode_mma_rows.push_back({r, range});
      } else {
        if (decode_mma_why.empty()) summary_.decode_fallback = "mm_prefix ranges widen the visible keys";
        decode_rows.push_back({r, range});
      }
      continue;
    }
    if (prefill_ok) {
      for (int64_t tb = 0; tb < q_len; tb += prefill_tokens) {
        const int64_t nt = std::min(prefill_tokens, q_len - tb);
        const KeyRange range = key_range(c, batch, r, context_len + tb, context_len + tb + nt - 1);
        for (int64_t kvh = 0; kvh < hkv; ++kvh) {
          for (int64_t hb = 0; hb < qpk; hb += prefill_heads) {
            const int64_t nh = std::min(prefill_heads, qpk - hb);
            prefill.push_back({to_i32(r), to_i32(tb), to_i32(nt), to_i32(kvh * qpk + hb), to_i32(nh),
                               range.key_begin, range.key_end, range.causal_begin, range.causal_end});
          }
        }
      }
      summary_.prefill_rows += q_len;
      continue;
    }
    for (int64_t tb = 0; tb < q_len; tb += tokens_per_item) {
      const int64_t nt = std::min(tokens_per_item, q_len - tb);
      const KeyRange range = key_range(c, batch, r, context_len + tb, context_len + tb + nt - 1);
      for (int64_t kvh = 0; kvh < hkv; ++kvh) {
        for (int64_t hb = 0; hb < qpk; hb += heads_per_item) {
          const int64_t nh = std::min(heads_per_item, qpk - hb);
          generic.push_back({to_i32(r), to_i32(tb), to_i32(nt), to_i32(kvh * qpk + hb), to_i32(nh), range.key_begin,
                             range.key_end, range.causal_begin, range.causal_end});
        }
      }
    }
    summary_.generic_rows += q_len;
  }
  // Decode splits, per kernel: the chunk (keys per CTA) is chosen so that the kernel's grid
  // (items × kv heads × head passes) has about ctas_per_sm CTAs per SM — several waves of the
  // resident CTAs even for one long row (1×32k: 128 splits of 256 keys) — within [min, max] keys.
  // Partial slots are numbered across both kernels; decode_combine_kernel finishes every split row.
  int32_t next_slot = 0;
  const auto split_rows = [&](const std::vector<DecodeRow>& rows, int64_t passes, int64_t ctas_per_sm,
                              int64_t min_keys, std::vector<DecodeItem>& items) {
    if (rows.empty()) return;
    int64_t total_keys = 0;
    for (const DecodeRow& row : rows) total_keys += row.range.key_end - row.range.key_begin;
    const int64_t target_ctas = std::max<int64_t>(1, ctas_per_sm * num_sms_);
    int64_t chunk = (total_keys * hkv * passes + target_ctas - 1) / target_ctas;
    chunk = std::clamp<int64_t>((chunk + 63) / 64 * 64, min_keys, decode_max_split_keys);
    for (const DecodeRow& row : rows) {
      const int64_t n = row.range.key_end - row.range.key_begin;
      const int64_t splits = std::max<int64_t>(1, (n + chunk - 1) / chunk);
      const int32_t token = batch.query_start_loc[row.request];
      for (int64_t s = 0; s < splits; ++s) {
        const int64_t kb = row.range.key_begin + s * chunk;
        const int64_t ke = std::min<int64_t>(row.range.key_end, kb + chunk);
        items.push_back({to_i32(row.request), token, to_i32(kb), to_i32(ke), row.range.causal_begin,
                         row.range.causal_end, to_i32(splits), splits > 1 ? next_slot + to_i32(s) : 0});
      }
      if (splits > 1) {
        combine.push_back({token, next_slot, to_i32(splits), 0});
        next_slot += to_i32(splits);
        ++summary_.split_rows;
      }
    }
  };
  split_rows(decode_rows, (qpk + heads_per_pass_ - 1) / heads_per_pass_, decode_ctas_per_sm, decode_min_split_keys,
             decode);
  const int64_t mma_heads = decode_mma_heads_per_pass(qpk, d);
  split_rows(decode_mma_rows, (qpk + mma_heads - 1) / mma_heads, decode_mma_ctas_per_sm, decode_mma_min_split_keys,
             decode_mma);
  summary_.decode_rows = static_cast<int64_t>(decode_rows.size() + decode_mma_rows.size());
  summary_.decode_ctas = static_cast<int64_t>(decode.size() + decode_mma.size());
  summary_.decode_mma_rows = static_cast<int64_t>(decode_mma_rows.size());
  summary_.decode_mma_ctas = static_cast<int64_t>(decode_mma.size());
  if (!decode_rows.empty() && summary_.decode_fallback.empty()) summary_.decode_fallback = decode_mma_why;
  if (fixed_) {
    // Pad the work lists to the capacities with items the kernels skip; the partial slots get the
    // whole capacity, so the buffers (and so the captured pointers) never change.
    const FixedShape& f = *fixed_;
    HYBRIDTB_CHECK(static_cast<int64_t>(decode.size()) <= f.decode_capacity &&
                       static_cast<int64_t>(decode_mma.size()) <= f.decode_mma_capacity,
                   "CUDA graph: the step needs ", decode.size(), " SIMT and ", decode_mma.size(),
                   " tensor-core decode items, the graph holds ", f.decode_capacity, " and ", f.decode_mma_capacity,
                   " (internal error: the capacity bound of fix_shape() does not hold)");
    const DecodeItem unused_item{-1, 0, 0, 0, 0, 0, 0, 0};
    decode.resize(static_cast<size_t>(f.decode_capacity), unused_item);
    decode_mma.resize(static_cast<size_t>(f.decode_mma_capacity), unused_item);
    combine.resize(static_cast<size_t>(f.num_reqs), CombineItem{-1, 0, 0, 0});
    next_slot = to_i32(f.decode_capacity + f.decode_mma_capacity);
  }
  if (next_slot > 0) {
    const auto slots = static_cast<size_t>(next_slot) * static_cast<size_t>(hq);
    auto* base = static_cast<unsigned char*>(partials_.device(slots * static_cast<size_t>(d + 2) * sizeof(float)));
    p.partial_acc = reinterpret_cast<float*>(base);
    p.partial_ml = reinterpret_cast<float*>(base + slots * static_cast<size_t>(d) * sizeof(float));
  }
  summary_.generic_items = static_cast<int64_t>(generic.size());
  summary_.prefill_items = static_cast<int64_t>(prefill.size());
  if (summary_.generic_rows > 0) summary_.prefill_fallback = prefill_why;
  // Longest key spans first (causal tails, long contexts), so the short CTAs fill the last wave.
  // Stable: the order is a pure function of the batch; each CTA writes its own rows, so the order
  // never changes a result bit.
  std::stable_sort(prefill.begin(), prefill.end(), [](const GenericItem& a, const GenericItem& b) {
    return a.key_end - a.key_begin > b.key_end - b.key_begin;
  });

  // --- one upload --------------------------------------------------------------------------------
  staging_.clear();
  const size_t o_qsl = append(staging_, batch.query_start_loc.values.data(), batch.query_start_loc.values.size());
  const size_t o_seq = append(staging_, batch.seq_lens.values.data(), batch.seq_lens.values.size());
  p.block_table_stride = batch.block_table.rank() == 2 ? batch.block_table.size(1) : 0;
  size_t o_bt = 0;
  if (fixed_ && batch.block_table.size(1) < fixed_->block_columns) {
    // The captured stride: each row copied into a row of the captured width (the rest unused).
    const int64_t cols = batch.block_table.size(1);
    std::vector<int32_t> wide(static_cast<size_t>(r_count * fixed_->block_columns), 0);
    for (int64_t r = 0; r < r_count; ++r) {
      for (int64_t b = 0; b < cols; ++b) wide[static_cast<size_t>(r * fixed_->block_columns + b)] = batch.block_table.at(r, b);
    }
    o_bt = append(staging_, wide.data(), wide.size());
    p.block_table_stride = fixed_->block_columns;
  } else {
    o_bt = append(staging_, batch.block_table.values.data(), static_cast<size_t>(r_count * p.block_table_stride));
  }
  size_t o_mm = 0;
  if (batch.mm_prefix_range && !encoder) {
    const IntArray& mm = *batch.mm_prefix_range;
    HYBRIDTB_CHECK(mm.rank() == 3 && mm.size(0) == r_count && mm.size(2) == 2,
                   "mm_prefix_range must have shape [num_reqs, M, 2], got ", mm.describe());
    o_mm = append(staging_, mm.values.data(), mm.values.size());
    p.num_mm_ranges = to_i32(mm.size(1));
  }
  const size_t o_gen = append(staging_, generic.data(), generic.size());
  const size_t o_pre = append(staging_, prefill.data(), prefill.size());
  const size_t o_dec = append(staging_, decode.data(), decode.size());
  const size_t o_dec_mma = append(staging_, decode_mma.data(), decode_mma.size());
  const size_t o_com = append(staging_, combine.data(), combine.size());
  auto* dev = static_cast<unsigned char*>(meta_.device(staging_.size() + 16));
  // Through pinned memory: the block table of a large batch is megabytes, which from pageable memory
  // would make the host wait for the stream.
  pinned_.upload(dev, staging_.data(), staging_.size(), stream);
  p.query_start_loc = reinterpret_cast<const int32_t*>(dev + o_qsl);
  p.seq_lens = reinterpret_cast<const int32_t*>(dev + o_seq);
  p.block_table = reinterpret_cast<const int32_t*>(dev + o_bt);
  p.mm_prefix = p.num_mm_ranges > 0 ? reinterpret_cast<const int32_t*>(dev + o_mm) : nullptr;
  p.generic_items = reinterpret_cast<const GenericItem*>(dev + o_gen);
  p.prefill_items = reinterpret_cast<const GenericItem*>(dev + o_pre);
  p.decode_items = reinterpret_cast<const DecodeItem*>(dev + o_dec);
  decode_mma_items_ = reinterpret_cast<const DecodeItem*>(dev + o_dec_mma);
  p.combine_items = reinterpret_cast<const CombineItem*>(dev + o_com);
  num_generic_ = static_cast<int64_t>(generic.size());
  num_prefill_ = static_cast<int64_t>(prefill.size());
  num_decode_ = static_cast<int64_t>(decode.size());
  num_decode_mma_ = static_cast<int64_t>(decode_mma.size());
  num_combine_ = static_cast<int64_t>(combine.size());
}

// A captured graph baked the first prepare()'s pointers and scalars into its kernel nodes: later
// steps must reuse them (the same tensors and buffers, as vLLM's static graph inputs).
void AttentionRunner::check_fixed_params() {
  FixedShape& f = *fixed_;
  if (!f.first) {
    f.first = params_;
    return;
  }
  const AttentionParams& a = *f.first;
  const AttentionParams& b = params_;
  const auto same = [](const char* what, auto x, auto y) {
    HYBRIDTB_CHECK(x == y, "CUDA graph: ", what, " differs from the captured step's (replay needs the tensors and "
                   "buffers it was captured with; copy new inputs into them)");
  };
  same("query", a.query, b.query);
  same("output", a.output, b.output);
  same("the SSM contribution", a.ssm_addend, b.ssm_addend);
  same("the hybrid output", a.hybrid_output, b.hybrid_output);
  same("kv_cache", a.kv_cache, b.kv_cache);
  same("k_scale_cache", a.k_scale_cache, b.k_scale_cache);
  same("v_scale_cache", a.v_scale_cache, b.v_scale_cache);
  same("query strides", a.q_stride_token, b.q_stride_token);
  same("kv_cache strides", a.cache_stride_block, b.cache_stride_block);
  same("k_scale", a.k_scale, b.k_scale);
  same("v_scale", a.v_scale, b.v_scale);
  same("output_scale", a.output_scale, b.output_scale);
  same("the fp8 output flag", a.fp8_output, b.fp8_output);
  same("the mm_prefix range count", a.num_mm_ranges, b.num_mm_ranges);
  same("the metadata buffer", static_cast<const void*>(a.query_start_loc), static_cast<const void*>(b.query_start_loc));
  same("the partials buffer", a.partial_acc, b.partial_acc);
}

void AttentionRunner::launch(cudaStream_t stream) const { launch_with(params_, stream); }

void AttentionRunner::launch_with(const AttentionParams& params, cudaStream_t stream) const {
  launch_decode_attention(params, params.kv_kind, num_decode_, heads_per_pass_, block_shift_, stream);
  if (num_decode_mma_ > 0) {
    AttentionParams mma_params = params;
    mma_params.decode_items = decode_mma_items_;
    launch_decode_mma(mma_params, num_decode_mma_, block_shift_, stream);
  }
  launch_decode_combine(params, num_combine_, stream);
  launch_prefill_attention(params, num_prefill_, prefill_variant_used_, stream);
  launch_generic_attention(params, params.encoder ? params.q_kind : params.kv_kind, num_generic_, stream);
  debug_slowdown(stream);  // a no-op unless configured with -DHYBRIDTB_DEBUG_SLOWDOWN_US=N
}

// --- capability (NOTE: must agree with attention_inst_decode.cuh / attention_inst_prefill.cuh) ------------------------------------
bool decode_supported(ElementKind kv_kind, int64_t head_size) {
  const bool kind_ok = kv_kind != ElementKind::kFloat32;
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

bool prefill_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size) {
  const bool kind_ok = (q_kind == ElementKind::kFloat16 || q_kind == ElementKind::kBFloat16) && kv_kind == q_kind;
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

void launch_prefill_attention(const AttentionParams& params, int64_t num_items, int variant, cudaStream_t stream) {
  if (num_items == 0) return;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_prefill_f16(params, num_items, variant, stream);
    case ElementKind::kBFloat16:
      return launch_prefill_bf16(params, num_items, variant, stream);
    default:
      throw Error("prefill attention: the tensor-core path takes float16/bfloat16 only");
  }
}

bool decode_mma_supported(ElementKind q_kind, ElementKind kv_kind, int64_t head_size) {
  const bool kind_ok = (q_kind == ElementKind::kFloat16 || q_kind == ElementKind::kBFloat16) && kv_kind == q_kind;
  return kind_ok && (head_size == 64 || head_size == 128 || head_size == 256);
}

int decode_mma_heads_per_pass(int64_t queries_per_kv, int64_t head_size) {
  return queries_per_kv <= 8 || head_size > 128 ? 8 : 16;
}

void launch_decode_mma(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  if (num_items == 0) return;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_decode_mma_f16(params, num_items, block_shift, stream);
    case ElementKind::kBFloat16:
      return launch_decode_mma_bf16(params, num_items, block_shift, stream);
    default:
      throw Error("decode attention: the tensor-core path takes float16/bfloat16 only");
  }
}

int decode_heads_per_pass(int64_t queries_per_kv) {
  if (queries_per_kv <= 1) return 1;
  if (queries_per_kv <= 4) return 4;
  return 8;
}

void launch_decode_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                             int heads_per_pass, int block_shift, cudaStream_t stream) {
  if (num_items == 0) return;
  switch (kv_kind) {
    case ElementKind::kFloat16:
      return launch_decode_f16(params, num_items, heads_per_pass, block_shift, stream);
    case ElementKind::kBFloat16:
      return launch_decode_bf16(params, num_items, heads_per_pass, block_shift, stream);
    case ElementKind::kFp8E4M3:
    case ElementKind::kFp8E5M2:
    case ElementKind::kInt8:
      return launch_decode_u8(params, num_items, heads_per_pass, block_shift, stream);
    default:
      throw Error("decode attention: float32 caches take the generic kernel");
  }
}

}  // namespace hybridtb::cuda
