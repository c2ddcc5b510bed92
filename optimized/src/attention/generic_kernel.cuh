// The generic paged-attention kernel: every case the reference supports (decoder prefills, chunks
// and decodes, encoder_only, any head size up to kGenericMaxHeadSize, every cache dtype and
// feature). It is the path of whatever the specialised kernels do not take — float32 models,
// fp8/int8 caches outside decode, head sizes other than 64/128/256, unaligned views — so it trades
// speed for coverage: SIMT float32 throughout (dequantised K/V, scores and P stay float32; no
// rounding to the model dtype before P·V).
//
// Work and layout: one CTA = one GenericItem, up to kGenericRows (token, head) rows of one request
// and one kv head (row r → token token_begin + r / num_heads, head head_begin + r % num_heads:
// the query heads of a kv head share each K/V tile, as in GQA). The CTA loops over kGenericKeys-key
// tiles of the item's key hull (the union of its rows' visible keys, from the planner), staging the
// dequantised K and V tiles and the scores in dynamic shared memory (generic_smem_bytes: it grows
// with D, hence the head-size cap), with an online softmax per row. Keys no row of the item can see
// are never read (null-block safety).
//
// The epilogue stores through store_output (sinks, fp8 output, the optional fused hybrid add).
// Fixed reduction orders, no atomics: bitwise reproducible. Checked against the reference by
// tests/cuda.
#pragma once

#include "attention/attention_common.cuh"

namespace hybridtb::cuda {

constexpr int kGenericRows = 32;     // BM: (token, head) rows per CTA
constexpr int kGenericKeys = 32;     // BN: keys per tile
constexpr int kGenericThreads = 128;
constexpr int kGenericMaxHeadSize = 384;

// Dynamic shared memory of the generic kernel, in floats / ints (see the layout in the kernel).
__host__ __device__ constexpr int64_t generic_smem_bytes(int d) {
  return static_cast<int64_t>(4) * (kGenericRows * (d + 1) + kGenericKeys * (d + 1) + kGenericKeys * d +
                                    kGenericRows * d + kGenericRows * (kGenericKeys + 1) + 3 * kGenericRows +
                                    2 * kGenericKeys) +
         8 * 2 * kGenericKeys + 4 * (2 * kGenericRows + kGenericKeys);
}

template <ElementKind KV>
__global__ void __launch_bounds__(kGenericThreads) generic_attention_kernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int d = p.head_size;
  const GenericItem item = p.generic_items[blockIdx.x];
  // --- shared layout ---------------------------------------------------------------------------
  float* qs = reinterpret_cast<float*>(smem_raw);     // [BM][d + 1] queries (float)
  float* ks = qs + kGenericRows * (d + 1);             // [BN][d + 1] dequantised keys
  float* vs = ks + kGenericKeys * (d + 1);             // [BN][d] dequantised values
  float* os = vs + kGenericKeys * d;                   // [BM][d] unnormalised output
  float* ps = os + kGenericRows * d;                   // [BM][BN + 1] scores, then probabilities
  float* row_m = ps + kGenericRows * (kGenericKeys + 1);  // [BM]
  float* row_l = row_m + kGenericRows;                    // [BM]
  float* row_alpha = row_l + kGenericRows;                // [BM]
  float* key_kscale = row_alpha + kGenericRows;           // [BN]
  float* key_vscale = key_kscale + kGenericKeys;          // [BN]
  auto* key_koff = reinterpret_cast<int64_t*>(key_vscale + kGenericKeys);  // [BN] element offsets
  int64_t* key_voff = key_koff + kGenericKeys;                              // [BN]
  auto* row_pos = reinterpret_cast<int*>(key_voff + kGenericKeys);         // [BM] position, −1 = no row
  int* row_head = row_pos + kGenericRows;                                   // [BM]
  int* key_ok = row_head + kGenericRows;                                    // [BN]

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int request = item.request;
  const int seq_len = p.seq_lens[request];
  const int query_start = p.query_start_loc[request];
  const int query_len = p.query_start_loc[request + 1] - query_start;
  const int context_len = seq_len - query_len;
  const int kv_head = item.head_begin / p.queries_per_kv;
  const int num_rows = item.num_tokens * item.num_heads;
  const int pos_lo = context_len + item.token_begin;
  const int pos_hi = context_len + item.token_begin + item.num_tokens - 1;

  // --- rows: positions, queries, state -----------------------------------------------------------
  if (tid < kGenericRows) {
    const bool valid = tid < num_rows;
    row_pos[tid] = valid ? context_len + item.token_begin + tid / item.num_heads : -1;
    row_head[tid] = valid ? item.head_begin + tid % item.num_heads : 0;
    row_m[tid] = kNegInf;
    row_l[tid] = 0.0f;
  }
  for (int i = tid; i < kGenericRows * d; i += kGenericThreads) {
    const int r = i / d;
    const int c = i % d;
    float q = 0.0f;
    if (r < num_rows) {
      const int64_t token = query_start + item.token_begin + r / item.num_heads;
      const int64_t head = item.head_begin + r % item.num_heads;
      q = load_element(p.query, token * p.q_stride_token + head * p.q_stride_head + c, p.q_kind);
    }
    qs[r * (d + 1) + c] = q;
    os[i] = 0.0f;
  }

  for (int tile = item.key_begin; tile < item.key_end; tile += kGenericKeys) {
    __syncthreads();  // previous tile's readers of ks/vs/ps are done
    // --- which keys of the tile are read, and where they live ---------------------------------
    if (tid < kGenericKeys) {
      const int k = tile + tid;
      const bool ok = k < item.key_end &&
                      key_needed(p, request, seq_len, pos_lo, pos_hi, item.causal_begin, item.causal_end, k);
      key_ok[tid] = ok ? 1 : 0;
      float kscale = 1.0f;
      float vscale = 1.0f;
      int64_t koff = 0;
      int64_t voff = 0;
      if (ok) {
        if (p.encoder) {
          koff = (query_start + static_cast<int64_t>(k)) * p.k_stride_token + kv_head * p.k_stride_head;
          voff = (query_start + static_cast<int64_t>(k)) * p.v_stride_token + kv_head * p.v_stride_head;
        } else {
          koff = cache_row_offset(p, request, k, 0, kv_head);
          voff = cache_row_offset(p, request, k, 1, kv_head);
          if (p.kv_scale_mode == KvScaleMode::kPerTensor) {
            kscale = p.k_scale;
            vscale = p.v_scale;
          } else if (p.kv_scale_mode == KvScaleMode::kPerTokenHead) {
            const int64_t si = scale_index(p, request, k, kv_head);
            kscale = p.k_scale_cache[si];
            vscale = p.v_scale_cache[si];
          }
        }
      }
      key_kscale[tid] = kscale;
      key_vscale[tid] = vscale;
      key_koff[tid] = koff;
      key_voff[tid] = voff;
    }
    __syncthreads();
    // --- K and V tiles (dequantised to float; keys nobody sees are zeros, never read) ------------
    const void* kbase = p.encoder ? p.key : p.kv_cache;
    const void* vbase = p.encoder ? p.value : p.kv_cache;
    const ElementKind kind = p.encoder ? p.q_kind : KV;
    for (int i = tid; i < kGenericKeys * d; i += kGenericThreads) {
      const int j = i / d;
      const int c = i % d;
      float kx = 0.0f;
      float vx = 0.0f;
      if (key_ok[j]) {
        kx = load_element(kbase, key_koff[j] + c, kind) * key_kscale[j];
        vx = load_element(vbase, key_voff[j] + c, kind) * key_vscale[j];
      }
      ks[j * (d + 1) + c] = kx;
      vs[j * d + c] = vx;
    }
    __syncthreads();
    // --- scores: lane = row, warp = 8 keys ---------------------------------------------------------
    {
      const int r = lane;
      const int pos = row_pos[r];
      float dot[kGenericKeys / 4];
#pragma unroll
      for (int jj = 0; jj < kGenericKeys / 4; ++jj) dot[jj] = 0.0f;
      for (int c = 0; c < d; ++c) {
        const float q = qs[r * (d + 1) + c];
#pragma unroll
        for (int jj = 0; jj < kGenericKeys / 4; ++jj) dot[jj] = fmaf(q, ks[(warp * 8 + jj) * (d + 1) + c], dot[jj]);
      }
#pragma unroll
      for (int jj = 0; jj < kGenericKeys / 4; ++jj) {
        const int j = warp * 8 + jj;
        const int k = tile + j;
        float s = kNegInf;
        // Select, never multiply: a masked score is −inf whatever the key held.
        if (pos >= 0 && key_ok[j] && key_visible(p, request, seq_len, pos, k)) {
          s = attention_logit(p, dot[jj], row_head[r], pos, k, context_len);
        }
        ps[r * (kGenericKeys + 1) + j] = s;
      }
    }
    __syncthreads();
    // --- online softmax: warp = 8 rows, lane = key -------------------------------------------------
    for (int rr = 0; rr < kGenericRows / 4; ++rr) {
      const int r = warp * (kGenericRows / 4) + rr;
      const float s = ps[r * (kGenericKeys + 1) + lane];
      float mx = s;
      for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = row_m[r];
      const float m_new = fmaxf(m_old, mx);
      // NaN scores stick (reference: the row becomes NaN); −inf scores give exact zeros.
      const float prob = s == kNegInf ? 0.0f : (m_new == kNegInf ? s : __expf(s - m_new));
      float sum = prob;
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      ps[r * (kGenericKeys + 1) + lane] = prob;
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_new == kNegInf ? 1.0f : exp_diff(m_old, m_new);
        row_alpha[r] = alpha;
        row_l[r] = row_l[r] * alpha + sum;
        row_m[r] = m_new;
      }
    }
    __syncthreads();
    // --- O = O·alpha + P·V (a zero probability contributes nothing, whatever V holds) --------------
    for (int i = tid; i < kGenericRows * d; i += kGenericThreads) {
      const int r = i / d;
      const int c = i % d;
      float o = os[i] * row_alpha[r];
      const float* prow = ps + r * (kGenericKeys + 1);
#pragma unroll 8
      for (int j = 0; j < kGenericKeys; ++j) {
        const float pr = prow[j];
        o += pr != 0.0f ? pr * vs[j * d + c] : 0.0f;
      }
      os[i] = o;
    }
  }
  __syncthreads();
  // --- epilogue ----------------------------------------------------------------------------------
  for (int i = tid; i < num_rows * d; i += kGenericThreads) {
    const int r = i / d;
    const int c = i % d;
    const int head = row_head[r];
    const RowScale f = row_finalize(p, head, row_m[r], row_l[r]);
    const float o = f.zero != 0.0f ? 0.0f : os[i] * f.acc_factor;
    const int64_t token = query_start + item.token_begin + r / item.num_heads;
    store_output(p, token * p.o_stride_token + head * p.o_stride_head + c, o);
  }
}

}  // namespace hybridtb::cuda
