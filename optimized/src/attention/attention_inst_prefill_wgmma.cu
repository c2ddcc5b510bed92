// Instantiations of the wgmma prefill kernel (prefill_wgmma_kernel.cuh): float16 and bfloat16 with a
// cache of the model dtype, head size 128, plain/featured logits; the launcher of every head size
// and cache kind (head sizes 64 and 256: attention_inst_prefill_wgmma_d64.cu / _d256.cu; the 1-byte
// caches' instances: attention_inst_prefill_wgmma_fp8.cu / _pth.cu); and the host encoder of its K/V
// tensor map. Compiled for sm_90a only (optimized/CMakeLists.txt); the launcher
// checks that the device is compute capability 9.0.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attention/attention_inst_prefill_wgmma.cuh"

namespace hybridtb::cuda {
namespace {

// The map's outermost dimension joins the cache's blocks and K/V halves, in units of the smaller of
// their strides: {block step, half step} = {2, 1} where a block holds both halves ([block][half]:
// vLLM's layout), {1, num_blocks} where each half holds every block ([half][block]); nullopt
// otherwise.
struct HalfBlockSteps {
  int32_t block_step;
  int32_t half_step;
  int64_t unit;  // elements
};
std::optional<HalfBlockSteps> half_block_steps(const AttentionParams& p, int64_t num_blocks) {
  const int64_t sb = p.cache_stride_block, sh = p.cache_stride_half;
  if (sb == 2 * sh) return HalfBlockSteps{2, 1, sh};
  if (sh == num_blocks * sb && num_blocks <= INT32_MAX) return HalfBlockSteps{1, static_cast<int32_t>(num_blocks), sb};
  return std::nullopt;
}

// Why the cache `p` names has no exact TMA form for the kernel's K/V tiles ("" if it has): the map
// must describe every byte a cp.async tile would read, in whole boxes of the swizzle layout.
std::string kv_map_unsupported(const AttentionParams& p, int64_t num_blocks) {
  if (p.encoder) return "encoder_only (keys and values from the key/value tensors)";
  if ((p.head_size != 64 && p.head_size != 128 && p.head_size != 256) || p.kv_kind != p.q_kind ||
      (p.kv_kind != ElementKind::kFloat16 && p.kv_kind != ElementKind::kBFloat16)) {
    return "not a 16-bit cache of the model dtype at head size 64, 128 or 256";
  }
  if (!wgmma_kv_tma_block(p.block_size, p.head_size)) {
    return detail::concat("block size ", p.block_size, " is not a multiple of ", kSwizzleAtomRows, " dividing ",
                          prefill_wgmma_config(p.head_size).bn, " (whole swizzle atoms per page, whole pages per tile)");
  }
  constexpr int64_t kStrideLimit = int64_t{1} << 40;  // cuTensorMapEncodeTiled: strides below 2^40 bytes
  constexpr int64_t kAlign = 16;                      // base and strides in multiples of 16 bytes
  constexpr int64_t kElementBytes = 2;
  for (const int64_t stride : {p.cache_stride_head, p.cache_stride_slot, p.cache_stride_half, p.cache_stride_block}) {
    if (stride <= 0 || (stride * kElementBytes) % kAlign != 0 || stride * kElementBytes >= kStrideLimit) {
      return detail::concat("cache stride ", stride, " (elements) is not a positive multiple of 16 bytes below 2^40");
    }
  }
  if (reinterpret_cast<uintptr_t>(p.kv_cache) % kAlign != 0) return "the cache's base is not 16-byte aligned";
  if (num_blocks <= 0) return "the cache has no block";
  if (p.num_kv_heads <= 0) return "no kv head";
  if (p.head_size == kKvBoxDims) return "";  // the cache's own view (KvView below): no further constraint
  if (p.cache_stride_head != p.head_size) {
    return detail::concat("cache stride of a kv head ", p.cache_stride_head, " is not the head size ", p.head_size,
                          " (a page's heads one after another: a box takes one head's 64-dim slabs together)");
  }
  if (!half_block_steps(p, num_blocks)) {
    return detail::concat("cache strides of a block ", p.cache_stride_block, " and a K/V half ", p.cache_stride_half,
                          " do not join into one dimension (block = 2 halves, or each half all blocks)");
  }
  return "";
}

// A 5-D view of the paged cache for cuTensorMapEncodeTiled, innermost dimension first (strides in
// bytes of the four outer ones), and the box the kernel copies: prefill_wgmma_kernel.cuh, "K/V
// tiles by TMA".
struct KvView {
  static constexpr int kRank = 5;
  cuuint64_t dims[kRank];
  cuuint64_t strides[kRank - 1];
  cuuint32_t box[kRank];
  int32_t block_step = 0;  // PrefillKvMap::block_step / half_step (page_box_view only)
  int32_t half_step = 0;
};
constexpr uint64_t kCacheElementBytes = 2;

// D 128 and 256: (64 dims of a slab, slot % 8, slab of the page's heads, slot / 8, block and half
// joined); one box = one page of one head and half.
KvView page_box_view(const AttentionParams& p, int64_t num_blocks) {
  const HalfBlockSteps steps = *half_block_steps(p, num_blocks);
  const auto slabs = static_cast<cuuint64_t>(p.head_size / kKvBoxDims);
  const auto slot = static_cast<cuuint64_t>(p.cache_stride_slot) * kCacheElementBytes;
  const auto groups = static_cast<cuuint64_t>(p.block_size / kSwizzleAtomRows);
  const auto joined = static_cast<cuuint64_t>((num_blocks - 1) * steps.block_step + steps.half_step + 1);
  KvView v{{kKvBoxDims, kSwizzleAtomRows, static_cast<cuuint64_t>(p.num_kv_heads) * slabs, groups, joined},
           {slot, kKvBoxDims * kCacheElementBytes, kSwizzleAtomRows * slot,
            static_cast<cuuint64_t>(steps.unit) * kCacheElementBytes},
           {kKvBoxDims, kSwizzleAtomRows, static_cast<cuuint32_t>(slabs), static_cast<cuuint32_t>(groups), 1}};
  v.block_step = steps.block_step;
  v.half_step = steps.half_step;
  return v;
}

// D 64, where a page of one head is one slab whatever the view: the cache's own dimensions (head
// dim, kv head, slot, half, block), box 64 × 1 × block_size × 1 × 1. The page box view reads the same
// bytes into the same rows and took 1.16x the kernel's time at D 64 (as did a view of this order
// with block and half joined), so the TMA unit is given the cache's own strides here.
KvView cache_order_view(const AttentionParams& p, int64_t num_blocks) {
  const auto bytes = [](int64_t elements) { return static_cast<cuuint64_t>(elements) * kCacheElementBytes; };
  return KvView{{kKvBoxDims, static_cast<cuuint64_t>(p.num_kv_heads), static_cast<cuuint64_t>(p.block_size), 2,
                 static_cast<cuuint64_t>(num_blocks)},
                {bytes(p.cache_stride_head), bytes(p.cache_stride_slot), bytes(p.cache_stride_half),
                 bytes(p.cache_stride_block)},
                {kKvBoxDims, 1, static_cast<cuuint32_t>(p.block_size), 1, 1}};
}

}  // namespace

PrefillKvMap encode_prefill_kv_map(const AttentionParams& params, int64_t num_blocks) {
  PrefillKvMap m;
  m.layout = PrefillKvLayout::of(params, num_blocks);
  m.why = kv_map_unsupported(params, num_blocks);
  if (!m.why.empty()) return m;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tma::tiled_map_encoder();
  if (encode == nullptr) {
    m.why = "the driver has no cuTensorMapEncodeTiled";
    return m;
  }
  const KvView view = params.head_size == kKvBoxDims ? cache_order_view(params, num_blocks)
                                                    : page_box_view(params, num_blocks);
  constexpr int kRank = KvView::kRank;
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type =
      params.kv_kind == ElementKind::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  // L2 promotion to 256 bytes: a key row of one head (D 128) in one fetch.
  const CUresult status = encode(&m.map, type, kRank, const_cast<void*>(params.kv_cache), view.dims, view.strides,
                                 view.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    m.why = detail::concat("cuTensorMapEncodeTiled refused the cache's layout (CUresult ", static_cast<int>(status),
                           ")");
    return m;
  }
  m.block_step = view.block_step;
  m.half_step = view.half_step;
  m.ok = true;
  return m;
}

void launch_prefill_wgmma(const AttentionParams& params, int64_t num_items, const PrefillKvMap* kv_map,
                          cudaStream_t stream) {
  const ComputeCapability cc = current_compute_capability();
  if (!cc.is_hopper()) {
    throw Error(detail::concat("prefill attention: prefill_variant 3 (wgmma) needs a compute capability 9.0 device "
                               "(sm_90a code); the current device is ",
                               cc.major, ".", cc.minor, ": use prefill_variant -1"));
  }
  const bool byte_cache = !params.encoder && is_byte_element(params.kv_kind);
  const bool head_ok = byte_cache ? params.head_size == kWgmmaByteHead
                                   : params.head_size == 64 || params.head_size == 128 || params.head_size == 256;
  if (!head_ok || (!params.encoder && !byte_cache && params.kv_kind != params.q_kind)) {
    throw Error(detail::concat("prefill attention: prefill_variant 3 (wgmma) takes head size 64, 128 or 256 with a "
                               "cache of the model dtype, or head size 128 with a 1-byte cache, not head size ",
                               params.head_size, " with cache element kind ", static_cast<int>(params.kv_kind)));
  }
  // The kernel reads the map only where kv_tma is set, so a zero map stands in for a missing one.
  AttentionParams p = params;
  const bool tma = kv_map != nullptr && kv_map->usable_for(params);
  p.kv_tma = tma ? 1 : 0;
  p.kv_tma_block_step = tma ? kv_map->block_step : 0;
  p.kv_tma_half_step = tma ? kv_map->half_step : 0;
  const CUtensorMap map = tma ? kv_map->map : CUtensorMap{};
  if (byte_cache) {
    if (params.kv_scale_mode == KvScaleMode::kPerTokenHead) return launch_prefill_wgmma_pth(p, num_items, stream);
    return launch_prefill_wgmma_fp8(p, num_items, stream);
  }
  if (params.head_size == 64) return launch_prefill_wgmma_d64(p, map, num_items, stream);
  if (params.head_size == 256) return launch_prefill_wgmma_d256(p, map, num_items, stream);
  return launch_wgmma_16bit<WgmmaConfig<128>>(p, map, num_items, stream);
}

}  // namespace hybridtb::cuda
