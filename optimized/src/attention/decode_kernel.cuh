// The SIMT decode path: one query row per request (query_len 1, decoder), head size D in
// {64, 128, 256}, for the decode rows the tensor-core decode kernel does not take — fp8/int8
// caches (with per-tensor or per-token-head scales) and rows whose mm_prefix ranges add keys. A
// decode row is a matrix-vector product, bound by reading K and V once, so the kernel is shaped
// for bandwidth: keys streamed from the paged cache with 16-byte loads (8 bytes for 1-byte caches).
//
// Work and layout: one CTA = one DecodeItem (a request's key split) × one kv head × one pass of HPP
// query heads, so every query head of the kv head is served from one read of each K/V byte (GQA).
// Inside a CTA, groups of D/8 lanes own a key each (8 elements per lane) and keep independent
// online-softmax states, merged at the end in a fixed order (warp butterfly, then warps 0..3 in
// order) — deterministic, no atomics. K/V go through a per-thread cp.async ring in shared memory
// (kDecodeStages − 1 steps in flight while one is computed); the HPP partial dots of a key are
// reduce-scattered over its lanes, so each lane subset owns one head's softmax and broadcasts α and
// the weights for P·V. Float32 throughout (no rounding of P before P·V).
//
// Long contexts are split across CTAs (Flash-Decoding, vLLM's 3D path) so that even one long row
// fills the GPU; decode_combine_kernel (decode_combine_kernel.cuh) reduces the splits in split
// order. Unsplit rows are stored by store_output (with the optional fused hybrid add); sentinel
// items (request < 0) return at once. Checked against the reference by tests/cuda (cases named
// *Decode* and *Split*).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_common.cuh"
#include "common/pdl.cuh"

namespace hybridtb::cuda {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeUnroll = 4;  // keys per group per step
constexpr int kDecodeStages = 3;  // cp.async ring depth: kDecodeStages − 1 steps in flight during compute

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

// cp.async of one Raw vector into shared memory; !ok zero-fills without reading global memory.
template <typename Raw>
__device__ __forceinline__ void cp_async_raw(Raw* dst, const void* src, bool ok) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if constexpr (sizeof(Raw) == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 16 : 0) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(src), "r"(ok ? 8 : 0) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

// Occupancy: at most 128 registers (4 CTAs = 16 warps per SM) up to 4 heads per pass: hiding the
// load latency needs the warps, and a larger register budget leaves too few of them resident.
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

  // Shared memory: a kDecodeStages-deep cp.async ring of the K/V vectors (each thread reads back
  // only its own slots), reused after the key loop for the cross-warp merge.
  constexpr int kStageElems = 2 * kDecodeUnroll * kDecodeThreads;  // Raw vectors per stage
  constexpr int kRingBytes = kDecodeStages * kStageElems * static_cast<int>(sizeof(Raw));
  constexpr int kMergeBytes = kDecodeWarps * HPP * (D + 2) * static_cast<int>(sizeof(float));
  __shared__ __align__(16) unsigned char smem[kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes];
  Raw* const ring = reinterpret_cast<Raw*>(smem);
  auto& sm_acc = *reinterpret_cast<float(*)[kDecodeWarps][HPP][D]>(smem);
  auto& sm_m = *reinterpret_cast<float(*)[kDecodeWarps][HPP]>(smem + kDecodeWarps * HPP * D * sizeof(float));
  auto& sm_l = *reinterpret_cast<float(*)[kDecodeWarps][HPP]>(smem + kDecodeWarps * HPP * (D + 1) * sizeof(float));

  pdl_allow_dependents();  // the combine kernel may launch once every CTA is resident (it waits for us)
  const DecodeItem item = p.decode_items[blockIdx.x];
  if (item.request < 0) return;  // sentinel item (uniform per CTA: before any barrier or copy)
  const int kv_head = static_cast<int>(blockIdx.y);
  const int head0 = kv_head * p.queries_per_kv + static_cast<int>(blockIdx.z) * HPP;
  const int nh = min(HPP, p.queries_per_kv - static_cast<int>(blockIdx.z) * HPP);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int sub = lane % kTpk;                   // lane within the group
  const int request = item.request;
  const int seq_len = p.seq_lens[request];
  const DecodeRowPosition row_position = decode_row_position(p, request, item.token, seq_len);
  const int pos = row_position.pos;  // lambdas below capture it (no structured binding in C++17)
  const int context_len = row_position.context_len;

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

  // Reduce-scatter ownership: level j (lane bit kTpk >> (j + 1)) selects the upper half of the
  // remaining heads. own_head = the head whose full dot this lane holds; owner_lane[h] = the lane
  // of this group that holds head h.
  static_assert(HPP <= kTpk, "one head per lane subset");
  int own_head = 0;
  int owner_lane[HPP];
  {
    int o = kTpk / 2;
    for (int n = HPP / 2; n >= 1; n /= 2, o /= 2) own_head += (lane & o) != 0 ? n : 0;
#pragma unroll
    for (int h = 0; h < HPP; ++h) {
      int sl = 0;
      int oo = kTpk / 2;
      for (int n = HPP / 2; n >= 1; n /= 2, oo /= 2) sl += (h & n) != 0 ? oo : 0;
      owner_lane[h] = (lane & ~(kTpk - 1)) | sl;
    }
  }
  const int own_head_global = head0 + own_head < p.num_heads ? head0 + own_head : 0;
  float m_own = kNegInf;
  float l_own = 0.0f;
  const int64_t table_row = static_cast<int64_t>(request) * p.block_table_stride;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * p.cache_stride_head + sub * kEpl;
  const int group_offset = (lane / kTpk) * kDecodeUnroll;
  constexpr int kStepKeys = kGroups * kDecodeUnroll;
  // Whether key k is read (visible to the row; keys outside the window / past seq_len are never
  // read: null-block safety; with mm_prefix ranges the hull may contain keys this row cannot see).
  auto key_valid = [&](int k) {
    return k < item.key_end &&
           ((k >= item.causal_begin && k < item.causal_end) || key_visible(p, request, seq_len, pos, k));
  };
  // The pipeline: step i covers keys warp_base(i) + [0, kDecodeUnroll) per group. The block-table
  // entries of step i + kDecodeStages are loaded (into registers) one step before the cp.async of
  // that step is issued, which is kDecodeStages − 1 steps before its use.
  const int first_base = item.key_begin + warp * kGpw * kDecodeUnroll + group_offset;
  int32_t tb_next[kDecodeUnroll];
  auto load_table = [&](int base, int32_t(&tb)[kDecodeUnroll]) {
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const int k = base + u;
      tb[u] = key_valid(k) ? __ldg(p.block_table + table_row + decode_detail::key_block(p, k, block_shift)) : -1;
    }
  };
  auto issue = [&](int base, int stage, const int32_t(&tb)[kDecodeUnroll]) {
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const int k = base + u;
      const bool ok = tb[u] >= 0;
      const int64_t slot = k - decode_detail::key_block(p, k, block_shift) * p.block_size;
      const int64_t row = ok ? static_cast<int64_t>(tb[u]) * p.cache_stride_block + slot * p.cache_stride_slot + head_offset : 0;
      Raw* dst = ring + (stage * 2 * kDecodeUnroll + u) * kDecodeThreads + tid;
      decode_detail::cp_async_raw(dst, static_cast<const unsigned char*>(p.kv_cache) + row * kBytes, ok);
      decode_detail::cp_async_raw(dst + kDecodeUnroll * kDecodeThreads,
                                  static_cast<const unsigned char*>(p.kv_cache) + (row + p.cache_stride_half) * kBytes, ok);
    }
    decode_detail::cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st < kDecodeStages - 1; ++st) {
    int32_t tb[kDecodeUnroll];
    load_table(first_base + st * kStepKeys, tb);
    issue(first_base + st * kStepKeys, st, tb);
  }
  load_table(first_base + (kDecodeStages - 1) * kStepKeys, tb_next);

  // The loop bound is uniform per warp (every lane runs the same trips: the shuffles below need the
  // whole warp); the warp's groups take consecutive runs of kDecodeUnroll keys.
  int stage = 0;
  for (int warp_base = item.key_begin + warp * kGpw * kDecodeUnroll; warp_base < item.key_end;
       warp_base += kStepKeys) {
    const int base = warp_base + group_offset;
    decode_detail::cp_async_wait<kDecodeStages - 2>();
    Raw kraw[kDecodeUnroll];
    Raw vraw[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const Raw* src = ring + (stage * 2 * kDecodeUnroll + u) * kDecodeThreads + tid;
      kraw[u] = src[0];
      vraw[u] = src[kDecodeUnroll * kDecodeThreads];
    }
    // Refill the stage consumed in the previous step with step + kDecodeStages − 1.
    {
      const int fill_stage = stage == 0 ? kDecodeStages - 1 : stage - 1;
      const int fill_base = base + (kDecodeStages - 1) * kStepKeys;
      issue(fill_base, fill_stage, tb_next);
      load_table(fill_base + kStepKeys, tb_next);
    }
    stage = stage + 1 == kDecodeStages ? 0 : stage + 1;
    float kscale[kDecodeUnroll];
    float vscale[kDecodeUnroll];
    bool valid[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      const int k = base + u;
      valid[u] = key_valid(k);
      kscale[u] = 1.0f;
      vscale[u] = 1.0f;
      if constexpr (kBytes == 1) {  // 16-bit caches carry no scales
        if (valid[u] && p.kv_scale_mode == KvScaleMode::kPerTensor) {
          kscale[u] = p.k_scale;
          vscale[u] = p.v_scale;
        } else if (valid[u] && p.kv_scale_mode == KvScaleMode::kPerTokenHead) {
          const int64_t block = p.block_table[table_row + decode_detail::key_block(p, k, block_shift)];
          const int64_t slot = k - decode_detail::key_block(p, k, block_shift) * p.block_size;
          const int64_t si = (block * p.block_size + slot) * p.num_kv_heads + kv_head;
          kscale[u] = __ldg(p.k_scale_cache + si);
          vscale[u] = __ldg(p.v_scale_cache + si);
        }
      }
    }
    // Scores: the HPP partial dots of a key are reduce-scattered over the group (log2 HPP halving
    // levels, then a butterfly), so each lane ends with the full dot of one head (own_head) —
    // fewer shuffles than one butterfly per head, and the softmax of a head runs once per lane
    // subset instead of on every lane. The owners broadcast α and the weights for P·V.
    float s_own[kDecodeUnroll];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) {
      float kf[kEpl];
      decode_detail::to_float(kraw[u], kf, static_cast<KvT*>(nullptr), p.kv_kind);
      float v[HPP];
#pragma unroll
      for (int h = 0; h < HPP; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) dot = fmaf(q[h][e], kf[e], dot);
        v[h] = dot;
      }
      int o = kTpk / 2;
#pragma unroll
      for (int n = HPP / 2; n >= 1; n /= 2, o /= 2) {
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n; ++i) {
          const float send = upper ? v[i] : v[i + n];
          const float keep = upper ? v[i + n] : v[i];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
      }
#pragma unroll
      for (; o > 0; o /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
      s_own[u] = valid[u] ? attention_logit(p, v[0] * kscale[u], own_head_global, pos, base + u, context_len) : kNegInf;
    }
    // Online softmax of the own head.
    float pr_own[kDecodeUnroll];
    float alpha_own;
    {
      float mx = s_own[0];
#pragma unroll
      for (int u = 1; u < kDecodeUnroll; ++u) mx = fmaxf(mx, s_own[u]);
      const float m_new = fmaxf(m_own, mx);
      alpha_own = m_new == kNegInf ? 1.0f : exp_diff(m_own, m_new);
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) {
        const float su = s_own[u];
        pr_own[u] = su == kNegInf ? 0.0f : (m_new == kNegInf ? su : __expf(su - m_new));
        sum += pr_own[u];
      }
      l_own = l_own * alpha_own + sum;
      m_own = m_new;
    }
    // P·V for every head with the owners' α and weights.
    float vf[kDecodeUnroll][kEpl];
#pragma unroll
    for (int u = 0; u < kDecodeUnroll; ++u) decode_detail::to_float(vraw[u], vf[u], static_cast<KvT*>(nullptr), p.kv_kind);
#pragma unroll
    for (int h = 0; h < HPP; ++h) {
      const float alpha = HPP == 1 ? alpha_own : __shfl_sync(0xffffffffu, alpha_own, owner_lane[h]);
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[h][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kDecodeUnroll; ++u) {
        const float pr = HPP == 1 ? pr_own[u] : __shfl_sync(0xffffffffu, pr_own[u], owner_lane[h]);
        const float pv = pr * vscale[u];
#pragma unroll
        // A plain FMA: this row's invisible keys were never loaded (zeros), so a zero weight never
        // meets NaN here; a visible NaN value makes the row NaN, as in the reference.
        for (int e = 0; e < kEpl; ++e) acc[h][e] = fmaf(pv, vf[u][e], acc[h][e]);
      }
    }
  }
  // Every lane gets the softmax state of every head from its owner.
#pragma unroll
  for (int h = 0; h < HPP; ++h) {
    m[h] = HPP == 1 ? m_own : __shfl_sync(0xffffffffu, m_own, owner_lane[h]);
    l[h] = HPP == 1 ? l_own : __shfl_sync(0xffffffffu, l_own, owner_lane[h]);
  }
  // Drain the ring (only zero-fill groups can be pending) before it is reused for the merge.
  decode_detail::cp_async_wait<0>();
  __syncthreads();
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
      store_output(p, static_cast<int64_t>(item.token) * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c,
                   o);
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
