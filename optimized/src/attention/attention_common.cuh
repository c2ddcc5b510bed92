// Device helpers shared by the attention kernels: visibility (the rule of
// hybridtb/spec/visibility.h, spec::key_visible()), logits (scale, soft cap,
// ALiBi in vLLM's order), cache addressing and the epilogue (sinks, fp8 output, the output store
// with the optional fused hybrid add: store_output).
//
// Every kernel takes these from here so that the semantics live in one place: a kernel decides
// only how it tiles and streams the work; which keys a row sees, how a logit is formed and how a
// finished row is stored are the same bits on every path. The paged cache is [NB, 2, BS, Hkv, D]
// (block, key/value half, slot, kv head, dim) with strides from AttentionParams; key k of a
// request lives in block block_table[k / BS] at slot k % BS.
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/attention_params.h"
#include "common/elements.cuh"
#include "hybridtb/spec/visibility.h"

namespace hybridtb::cuda {

constexpr float kNegInf = -INFINITY;

// spec::key_visible for row position `pos` of `request`: decoder (k ≤ p AND (W == 0 OR p − k < W))
// OR mm_prefix(p, k); encoder_only W == 0 OR |p − k| < W; k must lie in [0, seq_len).
__device__ __forceinline__ bool key_visible(const AttentionParams& p, int request, int seq_len, int pos, int k) {
  const int32_t* mm = p.mm_prefix + static_cast<int64_t>(request) * p.num_mm_ranges * 2;
  return spec::key_visible<int>(p.encoder != 0, p.sliding_window, seq_len, mm, p.num_mm_ranges, pos, k);
}

// Whether some row with position in [pos_lo, pos_hi] sees key k (decoder): k in the union of the
// rows' causal/window intervals [causal_begin, causal_end), or in an mm range that one of the rows
// lies in. Keys for which this is false are never read (null-block safety).
__device__ __forceinline__ bool key_needed(const AttentionParams& p, int request, int seq_len, int pos_lo, int pos_hi,
                                           int causal_begin, int causal_end, int k) {
  if (k < 0 || k >= seq_len) return false;
  if (k >= causal_begin && k < causal_end) return true;
  if (p.encoder) return false;
  const int32_t* mm = p.mm_prefix + static_cast<int64_t>(request) * p.num_mm_ranges * 2;
  for (int r = 0; r < p.num_mm_ranges; ++r) {
    const int start = mm[2 * r];
    const int end = mm[2 * r + 1];
    if (start < end && start <= pos_hi && end >= pos_lo && start <= k && k <= end) return true;
  }
  return false;
}

// A decode row's position and ALiBi offset. A request's query rows are its last query_len tokens: a
// decode has one; a short query (a speculative step's, up to kDecodeRowsMaxQueryLen rows,
// attention_work_plan.h) runs one decode item per row. ALiBi's offset is the keys before the
// request's first query row, as for a prefill row (prefill_common.cuh's context_len).
struct DecodeRowPosition {
  int pos;
  int context_len;
};
__device__ __forceinline__ DecodeRowPosition decode_row_position(const AttentionParams& p, int request, int token,
                                                                 int seq_len) {
  const int query_begin = p.query_start_loc[request];
  const int query_end = p.query_start_loc[request + 1];
  return {seq_len - (query_end - token), seq_len - (query_end - query_begin)};
}

// scale · dot, then the soft cap, then ALiBi (vLLM's order, reference logit()). Encoder_only
// layers get none of soft cap / ALiBi (the host clears them).
__device__ __forceinline__ float attention_logit(const AttentionParams& p, float dot, int head, int pos, int k,
                                                 int context_len) {
  float s = p.scale * dot;
  if (p.soft_cap > 0.0f) s = p.soft_cap * tanhf(s / p.soft_cap);
  if (p.alibi_slopes != nullptr) {
    const float slope = p.alibi_slopes[head];
    if (p.alibi_sqrt) {
      const int rel = k - pos;
      s += slope * (rel <= 0 ? -sqrtf(static_cast<float>(-rel)) : 0.0f);
    } else {
      s += slope * static_cast<float>(k - context_len);
    }
  }
  return s;
}

// Element offset of key/value row k (half 0/1) of kv head `kv_head` of `request` in the cache.
__device__ __forceinline__ int64_t cache_row_offset(const AttentionParams& p, int request, int k, int half,
                                                    int kv_head) {
  const int64_t block = p.block_table[static_cast<int64_t>(request) * p.block_table_stride + k / p.block_size];
  const int64_t slot = k % p.block_size;
  return block * p.cache_stride_block + half * p.cache_stride_half + slot * p.cache_stride_slot +
         static_cast<int64_t>(kv_head) * p.cache_stride_head;
}

// Per-token-head scale of key/value row k (index into k/v_scale_cache).
__device__ __forceinline__ int64_t scale_index(const AttentionParams& p, int request, int k, int kv_head) {
  const int64_t block = p.block_table[static_cast<int64_t>(request) * p.block_table_stride + k / p.block_size];
  return (block * p.block_size + k % p.block_size) * p.num_kv_heads + kv_head;
}

// exp with a −inf guard: exp(a − b) for finite b, 0 when a is −inf.
__device__ __forceinline__ float exp_diff(float a, float b) { return a == kNegInf ? 0.0f : __expf(a - b); }

// The stored value of one output element from the row's softmax state (m = running max over the
// visible keys, l = Σ e^{s−m}, acc = Σ e^{s−m}·v): a sink σ adds e^{σ} to the denominator only; a
// row without visible keys outputs 0 (reference: has_keys false); fp8 output stores
// e4m3(clamp(o / output_scale, ±448)), exactly representable in the model dtype.
struct RowScale {
  float acc_factor;  // multiply acc by this
  float zero;        // 1: row has no keys → 0
};
__device__ __forceinline__ RowScale row_finalize(const AttentionParams& p, int head, float m, float l) {
  if (m == kNegInf && l == 0.0f) return {0.0f, 1.0f};
  float denom = l;
  float factor = 1.0f;
  if (p.sinks != nullptr) {
    const float sink = p.sinks[head];
    const float mx = fmaxf(m, sink);
    factor = __expf(m - mx);
    denom = l * factor + __expf(sink - mx);
  }
  return {factor / denom, 0.0f};
}

__device__ __forceinline__ float output_value(const AttentionParams& p, float o) {
  if (!p.fp8_output) return o;
  float y = __fdiv_rn(o, p.output_scale);
  y = y < -448.0f ? -448.0f : (448.0f < y ? 448.0f : y);
  return round_to_e4m3(y);
}

// T(float(stored) + float(addend)) element by element: the fused hybrid add of N consecutive
// outputs (store_output_vec). __fadd_rn: the sum is never contracted into an FMA with o's product.
template <typename T, int N>
__device__ __forceinline__ ElementVec<T, N> hybrid_sum(const ElementVec<T, N>& stored, const T* addend_at) {
  const ElementVec<T, N> addend = *reinterpret_cast<const ElementVec<T, N>*>(addend_at);
  float sum[N];
#pragma unroll
  for (int i = 0; i < N; ++i) sum[i] = __fadd_rn(element_to_float(stored.e[i]), element_to_float(addend.e[i]));
  return pack_elements<T, N>(sum);
}

// The store of every finished output element, N consecutive ones at a time (one N·sizeof(T)-byte
// access; `index` a multiple of N, the same in output, ssm_addend and hybrid_output): o = the
// normalised attention output (row_finalize applied); output gets output_value(o) rounded to T.
// With the fused hybrid add (attention_params.h) hybrid_output gets
//   T(float(stored) + float(ssm_addend))   (ssm_addend set)
// — the bits of the separate add pass (ssm/ssm_kernels.cu add_rows_kernel), which reads the stored
// output back — or the stored bits themselves (ssm_addend null: a layer without an SSM branch).
template <typename T, int N>
__device__ __forceinline__ void store_output_vec(const AttentionParams& p, int64_t index, const float (&o)[N]) {
  using Vec = ElementVec<T, N>;
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = output_value(p, o[i]);
  const Vec stored = pack_elements<T, N>(v);
  *reinterpret_cast<Vec*>(static_cast<T*>(p.output) + index) = stored;
  if (p.hybrid_output != nullptr) {
    const Vec hybrid =
        p.ssm_addend == nullptr ? stored : hybrid_sum<T, N>(stored, static_cast<const T*>(p.ssm_addend) + index);
    *reinterpret_cast<Vec*>(static_cast<T*>(p.hybrid_output) + index) = hybrid;
  }
}

// One element in the model dtype p.q_kind (float32, float16, bfloat16).
__device__ __forceinline__ void store_output(const AttentionParams& p, int64_t index, float o) {
  const float one[1] = {o};
  switch (p.q_kind) {
    case ElementKind::kFloat32:
      return store_output_vec<float, 1>(p, index, one);
    case ElementKind::kFloat16:
      return store_output_vec<__half, 1>(p, index, one);
    default:
      return store_output_vec<__nv_bfloat16, 1>(p, index, one);
  }
}

}  // namespace hybridtb::cuda
