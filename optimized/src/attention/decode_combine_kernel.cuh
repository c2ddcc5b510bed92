// The second pass of split decode rows (decode_kernel.cuh, decode_mma_kernel.cuh): the partial
// softmax states of a row's splits reduced in fixed orders (deterministic), then sinks,
// normalisation, fp8 output and the store (store_output: with the optional fused hybrid add).
//
// Layout: split s of a row wrote, in partial slot first_slot + s, its running max and denominator
// (partial_ml, [slots, Hq, 2], natural-log max) and its unnormalised numerators (partial_acc,
// [slots, Hq, D]); the planner numbers the slots of both decode kernels in one sequence. A row is
// finished by one CTA per query head, so a long row's many splits are read in parallel over its
// heads. Sentinel items (token < 0) return at once.
//
// Launched as a programmatic dependent of the decode kernel before it (pdl.cuh): the decode CTAs
// allow it at their start, so its CTAs are resident and its launch latency is spent while the last
// decode CTAs stream their keys; before waiting for the decode kernel's completion it reads only its
// item (plan data the host uploaded before both kernels).
#pragma once

#include "attention/attention_common.cuh"
#include "common/pdl.cuh"

namespace hybridtb::cuda {

// Finishes split decode rows: one CTA per (row, query head). The split weights
// e^{m_s − max} are computed once per chunk of kCombineChunk splits into shared memory (every
// thread a strided subset), the denominator is reduced over the threads by a fixed tree. The
// numerators are summed with 16-byte loads: thread (split group sg, dim quad dq) adds the splits
// s ≡ sg (mod groups) of dims 4·dq … 4·dq + 3 in split order (several loads in flight, which a long
// row needs, rather than one L2 latency per split), then the groups' sums are added in group order.
// Its first kCombineAhead numerators are loaded together with the splits' maxima, before the
// weights exist: a row of up to kCombineAhead · groups splits (32 at head 128: a 32k row in splits
// of 1024 keys) then costs one round trip to L2 after the wait instead of three (maxima, then
// numerators in two batches). Deterministic: fixed orders, no atomics, the same sums in the same
// order either way. Head size: a multiple of 4, at most 4·kCombineThreads (launch_decode_combine
// checks it).
constexpr int kCombineThreads = 128;
constexpr int kCombineChunk = 512;
constexpr int kCombineAhead = 8;  // numerators per thread loaded beside the maxima (32 registers)
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const __grid_constant__ AttentionParams p) {
  __shared__ __align__(16) float sm_w[kCombineChunk];  // split weights; then the split groups' numerator sums
  __shared__ float sm_red[kCombineThreads];
  const CombineItem item = p.combine_items[blockIdx.x];  // plan data: no kernel in flight writes it
  if (item.token < 0) return;  // sentinel item (uniform per CTA: before any barrier)
  const int head = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int d = p.head_size;
  const float* ml = p.partial_ml + (static_cast<int64_t>(item.first_slot) * p.num_heads + head) * 2;
  const int64_t ml_stride = static_cast<int64_t>(p.num_heads) * 2;
  const int quads = d / 4;
  const int groups = kCombineThreads / quads;
  const int dq = tid % quads;
  const int sg = tid / quads;  // ≥ groups: an idle thread in the numerator sums
  const float* pacc = p.partial_acc + (static_cast<int64_t>(item.first_slot) * p.num_heads + head) * d + 4 * dq;
  const int64_t acc_stride = static_cast<int64_t>(p.num_heads) * d;
  pdl_wait_for_predecessor();  // the partials of the decode kernel before it
  // This thread's first numerators (splits sg + groups·i of the first chunk), in flight with the maxima.
  const int ahead_end = min(item.num_splits, kCombineChunk);
  float4 ahead[kCombineAhead];
#pragma unroll
  for (int i = 0; i < kCombineAhead; ++i) {
    const int s = sg + groups * i;
    ahead[i] = sg < groups && s < ahead_end ? *reinterpret_cast<const float4*>(pacc + s * acc_stride)
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  // Max over the splits (exact: order-free).
  float mx = kNegInf;
  for (int s = tid; s < item.num_splits; s += kCombineThreads) mx = fmaxf(mx, ml[s * ml_stride]);
  sm_red[tid] = mx;
  __syncthreads();
  for (int o = kCombineThreads / 2; o > 0; o /= 2) {
    if (tid < o) sm_red[tid] = fmaxf(sm_red[tid], sm_red[tid + o]);
    __syncthreads();
  }
  mx = sm_red[0];
  __syncthreads();
  float l_part = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int base = 0; base < item.num_splits; base += kCombineChunk) {
    const int n = min(kCombineChunk, item.num_splits - base);
    for (int s = tid; s < n; s += kCombineThreads) {
      const float* e = ml + (base + s) * ml_stride;
      const float w = mx == kNegInf ? 0.0f : exp_diff(e[0], mx);
      sm_w[s] = w;
      l_part += e[1] * w;
    }
    __syncthreads();
    if (sg < groups) {
      int s = sg;
      if (base == 0) {  // the numerators loaded ahead: splits sg + groups·i below n
#pragma unroll
        for (int i = 0; i < kCombineAhead; ++i) {
          if (s < n) {
            const float w = sm_w[s];
            acc.x += ahead[i].x * w;
            acc.y += ahead[i].y * w;
            acc.z += ahead[i].z * w;
            acc.w += ahead[i].w * w;
            s += groups;
          }
        }
      }
      const float* a = pacc + static_cast<int64_t>(base) * acc_stride;
#pragma unroll 4
      for (; s < n; s += groups) {
        const float4 v = *reinterpret_cast<const float4*>(a + s * acc_stride);
        const float w = sm_w[s];
        acc.x += v.x * w;
        acc.y += v.y * w;
        acc.z += v.z * w;
        acc.w += v.w * w;
      }
    }
    __syncthreads();
  }
  if (sg < groups) *reinterpret_cast<float4*>(sm_w + sg * d + 4 * dq) = acc;  // groups·d ≤ kCombineChunk
  sm_red[tid] = l_part;
  __syncthreads();
  for (int o = kCombineThreads / 2; o > 0; o /= 2) {
    if (tid < o) sm_red[tid] += sm_red[tid + o];
    __syncthreads();
  }
  const RowScale f = row_finalize(p, head, mx, sm_red[0]);
  for (int c = tid; c < d; c += kCombineThreads) {
    float sum = 0.0f;
    for (int g = 0; g < groups; ++g) sum += sm_w[g * d + c];
    const float o = f.zero != 0.0f ? 0.0f : sum * f.acc_factor;
    store_output(p, static_cast<int64_t>(item.token) * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c,
                 o);
  }
}

}  // namespace hybridtb::cuda
