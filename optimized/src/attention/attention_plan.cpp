// The attention runner (attention_plan.h): tensors bound and checked, the plan (attention_work_plan.h)
// uploaded, the kernels launched.
#include "attention/attention_plan.h"

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/attention_launch.h"
#include "common/cuda_check.h"
#include "common/debug_slowdown.h"
#include "common/kernel_attributes.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/kv_cache.h"

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

}  // namespace

AttentionRunner::AttentionRunner(const AttentionConfig& config, DeviceMemory& memory, int num_sms,
                                 const AttentionPathOverrides& overrides)
    : config_(config),
      memory_(memory),
      num_sms_(num_sms),
      hopper_wgmma_(prefill_wgmma_built() && current_compute_capability().is_hopper()),
      overrides_(overrides),
      meta_(memory),
      partials_(memory) {
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
  if (std::has_single_bit(static_cast<uint64_t>(config.block_size))) {
    block_shift_ = std::countr_zero(static_cast<uint64_t>(config.block_size));
  }
}

void AttentionRunner::fix_shape(const BatchDescription& batch) {
  HYBRIDTB_CHECK(!fixed_, "AttentionRunner::fix_shape: the shape is already fixed");
  fixed_ = fixed_shape_capacity(config_, overrides_, batch, num_sms_);
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

// One call's tensors (t token rows) checked and bound over config_params(); `facts` says what their
// layout allows (the decode kernels' vector loads, the tensor-core prefill's aligned rows).
AttentionParams AttentionRunner::bind(int64_t t, const StepTensors& tensors, const TensorView& output,
                                      const FusedAdd& fused, TensorLayoutFacts& facts) const {
  const AttentionConfig& c = config_;
  const int64_t hq = c.num_heads;
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
  p.k_scale = tensors.k_scale;
  p.v_scale = tensors.v_scale;
  if (c.attn_type != AttnType::kEncoderOnly && tensors.output_scale) {
    p.fp8_output = 1;
    p.output_scale = *tensors.output_scale;
  }
  bind_cache(tensors, p, facts);
  // Tensor-core prefill: 16-byte aligned rows (cp.async) and 4-byte aligned output pairs (the
  // epilogue stores element pairs to the output and the fused add's tensors, same strides).
  const auto aligned = [](const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  bool rows_aligned = p.q_stride_token % 8 == 0 && p.q_stride_head % 8 == 0 && aligned(p.query, 16) &&
                      p.o_stride_token % 2 == 0 && p.o_stride_head % 2 == 0 && aligned(p.output, 4) &&
                      aligned(p.ssm_addend, 4) && aligned(p.hybrid_output, 4);
  if (c.attn_type == AttnType::kEncoderOnly) {
    rows_aligned = rows_aligned && p.k_stride_token % 8 == 0 && p.k_stride_head % 8 == 0 &&
                   p.v_stride_token % 8 == 0 && p.v_stride_head % 8 == 0 && aligned(p.key, 16) &&
                   aligned(p.value, 16);
  } else {
    rows_aligned = rows_aligned && facts.cache_vectorisable;
  }
  facts.rows_aligned = rows_aligned;
  return p;
}

// The keys and values: key/value rows (encoder_only) or the paged cache with its scales.
void AttentionRunner::bind_cache(const StepTensors& tensors, AttentionParams& p, TensorLayoutFacts& facts) const {
  const AttentionConfig& c = config_;
  const int64_t t = tensors.query.size(0);
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  facts.cache_vectorisable = false;
  if (c.attn_type == AttnType::kEncoderOnly) {
    check_view(tensors.key, "key", {t, hkv, d}, c.dtype);
    check_view(tensors.value, "value", {t, hkv, d}, c.dtype);
    p.key = tensors.key.data();
    p.value = tensors.value.data();
    p.k_stride_token = tensors.key.stride(0);
    p.k_stride_head = tensors.key.stride(1);
    p.v_stride_token = tensors.value.stride(0);
    p.v_stride_head = tensors.value.stride(1);
    return;
  }
  const spec::KvCacheBinding bound = spec::bind_kv_cache(c, tensors, Device::kCuda);
  const TensorView& cache = bound.cache;
  p.kv_cache = cache.data();
  p.cache_stride_block = cache.stride(0);
  p.cache_stride_half = cache.stride(1);
  p.cache_stride_slot = cache.stride(2);
  p.cache_stride_head = cache.stride(3);
  // Cache rows in 16-byte chunks: the tensor-core kernels' cp.async copies (16-bit and 1-byte
  // caches alike) and the SIMT decode kernel's vector loads.
  const int64_t align = is_byte_element(p.kv_kind) ? 16 : 8;
  facts.cache_vectorisable = p.cache_stride_block % align == 0 && p.cache_stride_half % align == 0 &&
                             p.cache_stride_slot % align == 0 && p.cache_stride_head % align == 0 &&
                             reinterpret_cast<uintptr_t>(cache.data()) % 16 == 0;
  if (bound.format.scaling == spec::KvCacheScaling::kPerTokenHead) {
    p.k_scale_cache = static_cast<const float*>(bound.k_scale_cache.data());
    p.v_scale_cache = static_cast<const float*>(bound.v_scale_cache.data());
  }
}

void AttentionRunner::prepare(const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
                              cudaStream_t stream, const FusedAdd& fused) {
  const FixedShapeCapacity* fixed = fixed_ ? &*fixed_ : nullptr;
  check_attention_batch(config_, batch, fixed);
  TensorLayoutFacts facts;
  AttentionParams p = bind(batch.num_tokens(), tensors, output, fused, facts);
  const int64_t cache_blocks = config_.attn_type == AttnType::kEncoderOnly ? 0 : tensors.kv_cache.size(0);
  AttentionPlanInput input;
  input.config = &config_;
  input.batch = &batch;
  input.num_sms = num_sms_;
  input.hopper_wgmma = hopper_wgmma_;
  input.overrides = overrides_;
  input.routes = route_layer(config_, overrides_, facts);
  input.fixed = fixed;
  HYBRIDTB_CHECK(!fixed_ || input.routes.decode_ok, "CUDA graph: the KV cache ", tensors.kv_cache.describe(),
                 " is not 16-byte aligned, which the decode kernels need");
  plan_ = plan_attention(input, std::move(plan_));  // its storage reused
  if (plan_.prefill_variant == kPrefillWgmma && plan_.mixed.empty() && !plan_.prefill.empty()) {
    bind_kv_map(p, cache_blocks);
  }
  upload(batch, cache_blocks, p, stream);  // checks the block ids the kernels read against the cache
  params_ = p;
  if (fixed_) check_fixed_params();
}

// The wgmma prefill's tensor map of the bound cache (encode_prefill_kv_map): encoded where the
// cache's layout differs from the last one's, so once per layer and cache while they stay; the
// summary says whether the kernel's K/V tiles of whole pages go by TMA, or why not.
void AttentionRunner::bind_kv_map([[maybe_unused]] const AttentionParams& p, [[maybe_unused]] int64_t num_blocks) {
#if defined(HYBRIDTB_PREFILL_WGMMA)
  if (!kv_map_ || !kv_map_->layout.same(PrefillKvLayout::of(p, num_blocks))) {
    kv_map_ = encode_prefill_kv_map(p, num_blocks);
  }
  plan_.summary.prefill_kv_tma = kv_map_->ok;
  plan_.summary.prefill_kv_tma_fallback = kv_map_->why;
#endif
}

void AttentionRunner::prepare_plan(const BatchDescription& batch, cudaStream_t stream) {
  HYBRIDTB_CHECK(fixed_, "AttentionRunner::prepare_plan needs fixed-shape mode (fix_shape)");
  check_attention_batch(config_, batch, &*fixed_);
  // fix_shape checked that the decode kernels take this configuration; launch_on checks the cache's
  // alignment they need. A fixed-shape batch has no prefill rows.
  AttentionPlanInput input;
  input.config = &config_;
  input.batch = &batch;
  input.num_sms = num_sms_;
  input.hopper_wgmma = hopper_wgmma_;
  input.overrides = overrides_;
  input.routes = route_graph_step(config_, overrides_);
  input.fixed = &*fixed_;
  plan_ = plan_attention(input, std::move(plan_));  // its storage reused
  AttentionParams p = config_params();
  // launch_on checks the span against the cache it is given.
  plan_blocks_ = upload(batch, std::numeric_limits<int64_t>::max(), p, stream);
  params_ = p;
  plan_tokens_ = batch.num_tokens();
  planned_alone_ = true;
}

void AttentionRunner::launch_on(const StepTensors& tensors, const TensorView& output, const FusedAdd& fused,
                                cudaStream_t stream) const {
  HYBRIDTB_CHECK(planned_alone_, "AttentionRunner::launch_on called before prepare_plan");
  TensorLayoutFacts facts;
  AttentionParams p = bind(plan_tokens_, tensors, output, fused, facts);
  HYBRIDTB_CHECK(route_layer(config_, overrides_, facts).decode_ok, "CUDA graph: the KV cache ",
                 tensors.kv_cache.describe(), " is not 16-byte aligned, which the decode kernels need");
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

// The plan's staging bytes in one copy (staged in place in pinned memory: the block table of a large
// batch is megabytes, which from pageable memory would make the host wait for the stream) and the
// split partials; their device pointers, the block table's stride and the mm range count into `p`.
// The block ids are checked against cache_blocks while they are staged; returns the blocks spanned.
int64_t AttentionRunner::upload(const BatchDescription& batch, int64_t cache_blocks, AttentionParams& p,
                                cudaStream_t stream) {
  const AttentionPlan& plan = plan_;
  if (plan.partial_slots > 0) {
    auto* base = static_cast<unsigned char*>(partials_.device(plan.partial_acc_bytes + plan.partial_ml_bytes));
    p.partial_acc = reinterpret_cast<float*>(base);
    p.partial_ml = reinterpret_cast<float*>(base + plan.partial_acc_bytes);
  }
  const size_t bytes = plan.staging.bytes;
  const int64_t spanned = stage_plan(plan, config_, batch, cache_blocks, {pinned_.acquire(bytes), bytes});
  auto* dev = static_cast<unsigned char*>(meta_.device(bytes + 16));
  pinned_.upload(dev, bytes, stream);
  const StagingLayout& s = plan.staging;
  p.block_table_stride = plan.block_table_stride;
  p.num_mm_ranges = plan.num_mm_ranges;
  p.query_start_loc = reinterpret_cast<const int32_t*>(dev + s.query_start_loc);
  p.seq_lens = reinterpret_cast<const int32_t*>(dev + s.seq_lens);
  p.block_table = reinterpret_cast<const int32_t*>(dev + s.block_table);
  p.mm_prefix = p.num_mm_ranges > 0 ? reinterpret_cast<const int32_t*>(dev + s.mm_prefix) : nullptr;
  p.generic_items = reinterpret_cast<const GenericItem*>(dev + s.generic_items);
  p.prefill_items = reinterpret_cast<const GenericItem*>(dev + s.prefill_items);
  p.decode_items = reinterpret_cast<const DecodeItem*>(dev + s.decode_items);
  decode_mma_items_ = reinterpret_cast<const DecodeItem*>(dev + s.decode_mma_items);
  mixed_items_ = reinterpret_cast<const MixedItem*>(dev + s.mixed_items);
  p.combine_items = reinterpret_cast<const CombineItem*>(dev + s.combine_items);
  return spanned;
}

// A captured graph baked the first prepare()'s pointers and scalars into its kernel nodes: later
// steps must reuse them (the same tensors and buffers, as vLLM's static graph inputs).
void AttentionRunner::check_fixed_params() {
  if (!first_params_) {
    first_params_ = params_;
    return;
  }
  const AttentionParams& a = *first_params_;
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

// In order: the SIMT decode kernel; the tensor-core decode kernel, or the mixed kernel that runs it
// with the tensor-core prefill items in one grid; the combine (a programmatic dependent of the
// kernel before it); the tensor-core prefill kernel unless the mixed kernel ran its items; the
// generic kernel.
void AttentionRunner::launch_with(const AttentionParams& params, cudaStream_t stream) const {
  const AttentionPlan& plan = plan_;
  launch_decode_attention(params, params.kv_kind, static_cast<int64_t>(plan.decode.size()), plan.heads_per_pass,
                          block_shift_, stream);
  const bool mixed = !plan.mixed.empty();
  if (!plan.decode_mma.empty()) {
    AttentionParams mma_params = params;
    mma_params.decode_items = decode_mma_items_;
    mma_params.decode_mma_columns = plan.mma_columns;
    if (mixed) {
      mma_params.mixed_items = mixed_items_;
      launch_mixed(mma_params, static_cast<int64_t>(plan.mixed.size()), block_shift_, stream);
    } else {
      launch_decode_mma(mma_params, static_cast<int64_t>(plan.decode_mma.size()), block_shift_, stream);
    }
  }
  launch_decode_combine(params, static_cast<int64_t>(plan.combine.size()), stream);
  if (!mixed) {
    launch_prefill_attention(params, static_cast<int64_t>(plan.prefill.size()), plan.prefill_variant,
                             kv_map_ ? &*kv_map_ : nullptr, stream);
  }
  launch_generic_attention(params, params.encoder ? params.q_kind : params.kv_kind,
                           static_cast<int64_t>(plan.generic.size()), stream);
  debug_slowdown(stream);  // a no-op unless configured with -DHYBRIDTB_DEBUG_SLOWDOWN_US=N
}

void launch_prefill_attention(const AttentionParams& params, int64_t num_items, int variant,
                              [[maybe_unused]] const PrefillKvMap* kv_map, cudaStream_t stream) {
  if (num_items == 0) return;
  if (variant == kPrefillWgmma) {
#if defined(HYBRIDTB_PREFILL_WGMMA)
    return launch_prefill_wgmma(params, num_items, kv_map, stream);
#else
    throw Error("prefill attention: prefill_variant 3 (wgmma) is not in this build (no sm_90a code)");
#endif
  }
  const bool byte_cache = !params.encoder && is_byte_element(params.kv_kind);
  const bool per_token = params.kv_scale_mode == KvScaleMode::kPerTokenHead;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      if (!byte_cache) return launch_prefill_f16(params, num_items, variant, stream);
      return per_token ? launch_prefill_f16_pth(params, num_items, variant, stream)
                       : launch_prefill_f16_fp8(params, num_items, variant, stream);
    case ElementKind::kBFloat16:
      if (!byte_cache) return launch_prefill_bf16(params, num_items, variant, stream);
      return per_token ? launch_prefill_bf16_pth(params, num_items, variant, stream)
                       : launch_prefill_bf16_fp8(params, num_items, variant, stream);
    default:
      throw Error("prefill attention: the tensor-core path takes float16/bfloat16 only");
  }
}

void launch_mixed(const AttentionParams& params, int64_t num_ctas, int block_shift, cudaStream_t stream) {
  if (num_ctas == 0) return;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      return launch_mixed_f16(params, num_ctas, block_shift, stream);
    case ElementKind::kBFloat16:
      return launch_mixed_bf16(params, num_ctas, block_shift, stream);
    default:
      throw Error("mixed attention: the mixed kernel takes float16/bfloat16 only");
  }
}

void launch_decode_mma(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  if (num_items == 0) return;
  const bool byte_cache = is_byte_element(params.kv_kind);
  const bool per_token = params.kv_scale_mode == KvScaleMode::kPerTokenHead;
  switch (params.q_kind) {
    case ElementKind::kFloat16:
      if (!byte_cache) return launch_decode_mma_f16(params, num_items, block_shift, stream);
      return per_token ? launch_decode_mma_f16_pth(params, num_items, block_shift, stream)
                       : launch_decode_mma_f16_fp8(params, num_items, block_shift, stream);
    case ElementKind::kBFloat16:
      if (!byte_cache) return launch_decode_mma_bf16(params, num_items, block_shift, stream);
      return per_token ? launch_decode_mma_bf16_pth(params, num_items, block_shift, stream)
                       : launch_decode_mma_bf16_fp8(params, num_items, block_shift, stream);
    default:
      throw Error("decode attention: the tensor-core path takes float16/bfloat16 only");
  }
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
