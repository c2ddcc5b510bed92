// The decode fast path: one query row per request (query_len 1, decoder), head size D in
// {64, 128, 256}, keys streamed from the paged cache with 16-byte loads (8 bytes for 1-byte
// caches). One CTA = one (request, key split, kv head, pass of HPP query heads): every query head of
// the kv head is served from one read of each K/V byte (GQA). Inside a CTA, groups of D/8 lanes
// own a key each (8 elements per lane) and keep independent online-softmax states, merged at the
// end in a fixed order (warp butterfly, then warps 0..3 in order) — deterministic, no atomics.
// Long contexts are split across CTAs (Flash-Decoding / vLLM's 3D path); decode_combine_kernel
// (decode_combine_kernel.cuh) reduces the splits in split order. Float32 throughout (no rounding of P before P·V).
// Checked against the reference by tests/cuda (cases named *Decode* and *Split*).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_common.cuh"

namespace hybridtb::cuda {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeUnroll = 4;  // keys per group per step (loads in flight)

namespace decode_detail {

template <typename KvT>
struct Vec;  // 8 elements of the cache
template <>
struct Vec<__half> {
  using Raw = uint4;
};
template <>
struct Vec<__nv_bfloat16> {
  using Raw = uint4;
};
template <>
struct Vec<uint8_t> {
  using Raw = uint2;
};

__device__ __forceinline__ void to_float(const uint4& raw, float (&out)[8], __nv_bfloat16*, ElementKind) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void to_float(const uint4& raw, float (&out)[8], __half*, ElementKind) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    memcpy(&h, &w[i], 4);
    const float2 f = __half22float2(h);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void to_float(const uint2& raw, float (&out)[8], uint8_t*, ElementKind kind) {
  const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = byte_to_float(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4))), kind);
}

template <typename Raw>
__device__ __forceinline__ Raw load_raw(const void* base, int64_t element_offset, int element_bytes) {
  return __ldg(reinterpret_cast<const Raw*>(static_cast<const unsigned char*>(base) + element_offset * element_bytes));
}

__device__ __forceinline__ int key_block(const AttentionParams& p, int k, int shift) {
  return shift >= 0 ? (k >> shift) : k / p.block_size;
}

}  // namespace decode_detail

// Merge of two online-softmax states (symmetric: both partners of a butterfly get equal bits).
__device__ __forceinline__ void merge_state(float& m, float& l, float* acc, int n, float m2, float l2,
                                            const float* acc2) {
  const float mx = fmaxf(m, m2);
  const float f1 = mx == kNegInf ? 0.0f : exp_diff(m, mx);
  const float f2 = mx == kNegInf ? 0.0f : exp_diff(m2, mx);
  l = l * f1 + l2 * f2;
  for (int i = 0; i < n; ++i) acc[i] = acc[i] * f1 + acc2[i] * f2;
  m = mx;
}

// Occupancy: at most 128 registers (4 CTAs = 16 warps per SM) up to 4 heads per pass; latency
// hiding needs the warps (ncu on an H200: 164 registers → 12 warps → 23% of read bandwidth).
template <typename KvT, int D, int HPP>
__global__ void __launch_bounds__(kDecodeThreads, HPP <= 4 ? 4 : 2) decode_attention_kernel(const __grid_constant__ AttentionParams p,
                                                                          int block_shift) {
  constexpr int kEpl = 8;            // elements per lane per key
  constexpr int kTpk = D / kEpl;     // lanes per key (a group)
  static_assert(kTpk <= 32 && 32 % kTpk == 0, "a key must fit a warp");
  constexpr int kGpw = 32 / kTpk;    // groups per warp
  constexpr int kGroups = kDecodeWarps * kGpw;
  using Raw = typename decode_detail::Vec<KvT>::Raw;
  constexpr int kBytes = sizeof(KvT);

  __shared__ float sm_acc[kDecodeWarps][HPP][D];
  __shared__ float sm_m[kDecodeWarps][HPP];
  __shared__ float sm_l[kDecodeWarps][HPP];

  const DecodeItem item = p.decode_items[blockIdx.x];
  const int kv_head = static_cast<int>(blockIdx.y);
  const int head0 = kv_head * p.queries_per_kv + static_cast<int>(blockIdx.z) * HPP;
  const int nh = min(HPP, p.queries_per_kv - static_cast<int>(blockIdx.z) * HPP);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int sub = lane % kTpk;                   // lane within the group
  const int request = item.request;
  const int seq_len = p.seq_lens[request];
  const int pos = seq_len - 1;                   // the query row's position
  const int context_len = seq_len - 1;

  float q[HPP][kEpl];
#pragma unroll
  for (int h = 0; h < HPP; ++h) {
#pragma unroll
    for (int e = 0; e < kEpl; ++e) {
      q[h][e] = h < nh ? load_element(p.query,
                                      static_cast<int64_t>(item.token) * p.q_stride_token +
                                          static_cast<int64_t>(head0 + h) * p.q_stride_head + sub * kEpl + e,
                                      p.q_kind)
                       : 0.0f;
    }
  }
  float m[HPP];
  float l[HPP];
  float acc[HPP][kEpl];
#pragma unroll
  for (int h = 0; h < HPP; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kEpl; ++e) acc[h][e] = 0.0f;
  }

  const int64_t table_row = static_cast<int64_t>(request) * p.block_table_stride;
  // The loop bound is uniform per warp (every lane runs the same trips: the shuffles below need the
  // whole warp); the warp's groups take consecutive runs of kDecodeUnroll keys.
  for (int warp_base = item.key_begin + warp * kGpw * kDecodeUnroll; warp_base < item.key_end;
       warp_base += kGroups * kDecodeUnroll) {
    const int base = warp_base + (lane / kTpk) * kDecodeUnroll;
    Raw kraw[kDecodeUnroll];
    Raw vraw[kDecodeUnroll];
    float kscale[kDecodeUnroll];
    float vscale[kDecodeUnroll];
    bool valid[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const int k = base + u;
      // Keys outside the window / past seq_len are never read (null-block safety); with mm_prefix
      // ranges the hull may contain keys this row cannot see.
      valid[u] = k < item.key_end &&
                 ((k >= item.causal_begin && k < item.causal_end) || key_visible(p, request, seq_len, pos, k));
      kscale[u] = 1.0f;
      vscale[u] = 1.0f;
      if (valid[u]) {
        const int64_t block = p.block_table[table_row + decode_detail::key_block(p, k, block_shift)];
        const int64_t slot = k - decode_detail::key_block(p, k, block_shift) * p.block_size;
        const int64_t row = block * p.cache_stride_block + slot * p.cache_stride_slot +
                            static_cast<int64_t>(kv_head) * p.cache_stride_head + sub * kEpl;
        kraw[u] = decode_detail::load_raw<Raw>(p.kv_cache, row, kBytes);
        vraw[u] = decode_detail::load_raw<Raw>(p.kv_cache, row + p.cache_stride_half, kBytes);
        if (p.kv_scale_mode == KvScaleMode::kPerTensor) {
          kscale[u] = p.k_scale;
          vscale[u] = p.v_scale;
        } else if (p.kv_scale_mode == KvScaleMode::kPerTokenHead) {
          const int64_t si = (block * p.block_size + slot) * p.num_kv_heads + kv_head;
          kscale[u] = __ldg(p.k_scale_cache + si);
          vscale[u] = __ldg(p.v_scale_cache + si);
        }
      } else {
        kraw[u] = Raw{};
        vraw[u] = Raw{};
      }
    }
    // Scores of the U keys for every head.
    float s[kDecodeUnroll][HPP];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      float kf[kEpl];
      decode_detail::to_float(kraw[u], kf, static_cast<KvT*>(nullptr), p.kv_kind);
#pragma unroll
      for (int h = 0; h < HPP; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) dot = fmaf(q[h][e], kf[e], dot);
#pragma unroll
        for (int o = kTpk / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u][h] = valid[u] ? attention_logit(p, dot * kscale[u], head0 + h < p.num_heads ? head0 + h : 0, pos, base + u,
                                             context_len)
                           : kNegInf;
      }
    }
    // Online softmax update, then P·V.
    float vf[kDecodeUnroll][kEpl];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) decode_detail::to_float(vraw[u], vf[u], static_cast<KvT*>(nullptr), p.kv_kind);
#pragma unroll
    for (int h = 0; h < HPP; ++h) {
      float mx = s[0][h];
#pragma unroll
      for (int u = 1; u < kDecodeUnroll; ++u) mx = fmaxf(mx, s[u][h]);
      const float m_new = fmaxf(m[h], mx);
      const float alpha = m_new == kNegInf ? 1.0f : exp_diff(m[h], m_new);
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[h][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) {
        const float su = s[u][h];
        const float pr = su == kNegInf ? 0.0f : (m_new == kNegInf ? su : __expf(su - m_new));
        sum += pr;
        const float pv = pr * vscale[u];
#pragma unroll
        // A plain FMA: this row's invisible keys were never loaded (zeros), so a zero weight never
        // meets NaN here; a visible NaN value makes the row NaN, as in the reference.
        for (int e = 0; e < kEpl; ++e) acc[h][e] = fmaf(pv, vf[u][e], acc[h][e]);
      }
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
    }
  }

  // Merge the groups of a warp (butterfly over lanes kTpk apart), then the warps in order.
#pragma unroll
  for (int o = kTpk; o < 32; o *= 2) {
#pragma unroll
    for (int h = 0; h < HPP; ++h) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[h], o);
      float acc2[kEpl];
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc2[e] = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
      merge_state(m[h], l[h], acc[h], kEpl, m2, l2, acc2);
    }
  }
  if (lane < kTpk) {
#pragma unroll
    for (int h = 0; h < HPP; ++h) {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) sm_acc[warp][h][lane * kEpl + e] = acc[h][e];
      if (lane == 0) {
        sm_m[warp][h] = m[h];
        sm_l[warp][h] = l[h];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < nh * D; i += kDecodeThreads) {
    const int h = i / D;
    const int c = i % D;
    float mm = sm_m[0][h];
    float ll = sm_l[0][h];
    float aa = sm_acc[0][h][c];
#pragma unroll
    for (int w = 1; w < kDecodeWarps; ++w) merge_state(mm, ll, &aa, 1, sm_m[w][h], sm_l[w][h], &sm_acc[w][h][c]);
    const int head = head0 + h;
    if (item.num_splits == 1) {
      const RowScale f = row_finalize(p, head, mm, ll);
      const float o = f.zero != 0.0f ? 0.0f : aa * f.acc_factor;
      store_element(p.output, static_cast<int64_t>(item.token) * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c,
                    p.q_kind, output_value(p, o));
    } else {
      const int64_t slot = static_cast<int64_t>(item.partial_slot) * p.num_heads + head;
      p.partial_acc[slot * D + c] = aa;
      if (c == 0) {
        p.partial_ml[slot * 2] = mm;
        p.partial_ml[slot * 2 + 1] = ll;
      }
    }
  }
}

}  // namespace hybridtb::cuda
