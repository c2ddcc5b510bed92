// The Hopper variant of the tensor-core prefill path (tile variant kPrefillWgmma, attention_caps.h):
// the algorithm of prefill_mma_kernel.cuh (FlashAttention-2 style paged attention, online softmax
// in base 2, P rounded to the model dtype ×2^15, every logit feature) with both products on
// warpgroup MMAs (wgmma.mma_async m64n128k16, common/wgmma.cuh) instead of mma.sync. Head size 128,
// float16 / bfloat16 with a cache of the model dtype (kv cache dtype auto, or encoder_only); sm_90a
// only (the including translation unit is compiled for compute_90a; elsewhere the kernel body is
// empty and the launcher refuses the variant).
//
// One CTA = one GenericItem of at most 128 (token, head) rows of one kv head (the GQA packing of
// prefill_mma_kernel.cuh), two warpgroups of 64 rows each (256 threads). Q is staged once; K/V tiles
// of 128 keys stream through a kWgmmaStages-deep cp.async ring, each key row addressed through the
// block table, written in the 128-byte swizzle layout the descriptors read. Per tile and warpgroup:
//   S [64 × 128] = Q·Kᵀ: 8 wgmma k-steps, A = Q and B = K both K-major from shared memory;
//   logits, masks and the online softmax on the accumulator registers (the mma.sync C layout, so
//     the per-element code is that of the mma.sync kernel: attention_logit, key_visible, quad
//     shuffles for the row max and sum);
//   O [64 × 128] += P·V: 8 wgmma k-steps, A = P from registers (S n-tiles 2k, 2k + 1 form the A
//     fragment of k-step k), B = the V tile [key][d] read MN-major (transposed descriptor).
// Each warpgroup waits for its own MMAs (wait_group 0) before touching the accumulators; the two
// warpgroups run independently between the per-tile barriers, so one's softmax overlaps the
// other's MMAs. Keys nobody in the CTA sees are never read (cp.async zero-fill); padding rows read
// zeros and are never stored; no atomics, fixed reduction order: bitwise reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_caps.h"
#include "attention/attention_common.cuh"
#include "attention/byte_cache.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"

namespace hybridtb::cuda {

constexpr int kWgmmaWarpgroups = 2;
constexpr int kWgmmaThreads = 128 * kWgmmaWarpgroups;
constexpr int kWgmmaStages = 2;  // cp.async ring: one K/V tile in flight while the other is used
constexpr int kWgmmaHead = 128;  // the only head size

// Q tile [128 rows][128], then the ring of kWgmmaStages × (K tile, V tile) [128 keys][128], each in
// the 128-byte swizzle layout; + 1024 bytes to align the dynamic shared memory to a swizzle atom.
constexpr int64_t prefill_wgmma_smem_bytes() {
  const int64_t tile = static_cast<int64_t>(2) * kWgmmaHead * 128;
  return tile + 2 * kWgmmaStages * tile + 1024;
}

// T: model dtype (also the cache element); Plain: no soft cap and no ALiBi (prefill_mma_body).
template <typename T, bool Plain>
__global__ void __launch_bounds__(kWgmmaThreads, 1) prefill_wgmma_kernel(const __grid_constant__ AttentionParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mma;
  constexpr int D = kWgmmaHead;
  constexpr int BN = prefill_config(D, kPrefillWgmma).bn;
  constexpr int kRows = prefill_rows(D, kPrefillWgmma);
  static_assert(BN == 128 && kRows == 64 * kWgmmaWarpgroups, "m64n128k16 tiles: S 64 × BN, O 64 × D");
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kNt = BN / 8;     // S n-tiles (8 keys)
  constexpr int kDt = D / 8;      // O n-tiles (8 dims)
  constexpr int kTileBytes = BN * D * 2;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  using Scales = CacheScales<T, T>;
  using Mmas = wgmma::Wgmma<T>;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t s_q = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t s_k = s_q + kRows * D * 2;
  const uint32_t s_v = s_k + kWgmmaStages * kTileBytes;

  const GenericItem item = p.prefill_items[blockIdx.x];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;           // rows 16·warp … + 15
  const int wg = tid / 128;            // rows 64·wg … + 63
  const int request = item.request;
  const int seq_len = p.seq_lens[request];
  const int query_start = p.query_start_loc[request];
  const int query_len = p.query_start_loc[request + 1] - query_start;
  const int context_len = seq_len - query_len;
  const int kv_head = item.head_begin / p.queries_per_kv;
  const int num_rows = item.num_tokens * item.num_heads;
  const int pos_lo = context_len + item.token_begin;
  const int pos_hi = pos_lo + item.num_tokens - 1;

  // --- Q tile (zeros for padding rows) --------------------------------------------------------
  {
    const T* q = static_cast<const T*>(p.query);
    for (int i = tid; i < kRows * kChunks; i += kWgmmaThreads) {
      const int r = i / kChunks;
      const int c = i % kChunks;
      const bool ok = r < num_rows;
      const int64_t token = query_start + item.token_begin + (ok ? r / item.num_heads : 0);
      const int64_t head = item.head_begin + (ok ? r % item.num_heads : 0);
      cp_async_16(s_q + wgmma::sw128_offset<kRows>(r, c), q + token * p.q_stride_token + head * p.q_stride_head + c * 8,
                  ok);
    }
    cp_async_commit();
  }

  // --- K/V tile loader: keys [kt, kt + BN) into ring stage `stage` ------------------------------
  const T* kbase = static_cast<const T*>(p.encoder ? p.key : p.kv_cache);
  const T* vbase = static_cast<const T*>(p.encoder ? p.value : p.kv_cache);
  auto load_tile = [&](int kt, int stage) {
#pragma unroll
    for (int i = 0; i < BN * kChunks / kWgmmaThreads; ++i) {
      const int idx = tid + i * kWgmmaThreads;
      const int j = idx / kChunks;
      const int c = idx % kChunks;
      const int k = kt + j;
      const bool ok = k < item.key_end &&
                      key_needed(p, request, seq_len, pos_lo, pos_hi, item.causal_begin, item.causal_end, k);
      int64_t koff = 0;
      int64_t voff = 0;
      if (ok) {
        if (p.encoder) {
          koff = (query_start + static_cast<int64_t>(k)) * p.k_stride_token + kv_head * p.k_stride_head;
          voff = (query_start + static_cast<int64_t>(k)) * p.v_stride_token + kv_head * p.v_stride_head;
        } else {
          koff = cache_row_offset(p, request, k, 0, kv_head);
          voff = koff + p.cache_stride_half;
        }
      }
      const uint32_t so = static_cast<uint32_t>(stage * kTileBytes) + wgmma::sw128_offset<BN>(j, c);
      cp_async_16(s_k + so, kbase + koff + c * 8, ok);
      cp_async_16(s_v + so, vbase + voff + c * 8, ok);
    }
  };

  // --- this thread's rows: g and g + 8 of its warp's 16 ---------------------------------------------
  const int g = lane / 4;
  const int t4 = lane % 4;
  int row_pos[2];
  int row_head[2];
  bool row_valid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + 8 * i;
    row_valid[i] = r < num_rows;
    row_pos[i] = row_valid[i] ? pos_lo + r / item.num_heads : -1;
    row_head[i] = row_valid[i] ? item.head_begin + r % item.num_heads : item.head_begin;
  }
  const float scale_log2 = p.scale * kLog2e;

  float o[kDt][4];
  float row_m[2] = {kNegInf, kNegInf};  // running max of the base-2 logits
  float row_l[2] = {0.0f, 0.0f};        // this thread's part of Σ 2^{t − (m − shift)}
#pragma unroll
  for (int n = 0; n < kDt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  const int num_tiles = (item.key_end - item.key_begin + BN - 1) / BN;
#pragma unroll
  for (int st = 0; st < kWgmmaStages - 1; ++st) {
    if (st < num_tiles) load_tile(item.key_begin + st * BN, st);
    cp_async_commit();
  }

  // Q of this warpgroup: rows 64·wg …; k-step kk = columns 16·kk … (slab kk / 4, 32 bytes per step).
  const uint32_t q_rows = s_q + static_cast<uint32_t>(wg * 64 * 128);
  for (int it = 0; it < num_tiles; ++it) {
    cp_async_wait<kWgmmaStages - 2>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile `it` visible to all; both warpgroups are done with tile it − 1's stage
    {
      const int next = it + kWgmmaStages - 1;
      if (next < num_tiles) load_tile(item.key_begin + next * BN, next % kWgmmaStages);
      cp_async_commit();
    }
    const int stage = it % kWgmmaStages;
    const int kt = item.key_begin + it * BN;
    const uint32_t sk = s_k + static_cast<uint32_t>(stage * kTileBytes);
    const uint32_t sv = s_v + static_cast<uint32_t>(stage * kTileBytes);

    // --- S = Q·Kᵀ ------------------------------------------------------------------------------------
    float s[kNt][4];
#pragma unroll
    for (int n = 0; n < kNt; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;  // overwritten (k-step 0)
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t slab_q = static_cast<uint32_t>((kk / 4) * kRows * 128 + (kk % 4) * 32);
      const uint32_t slab_k = static_cast<uint32_t>((kk / 4) * BN * 128 + (kk % 4) * 32);
      Mmas::ss(s, wgmma::sw128_desc(q_rows + slab_q, 16, 1024), wgmma::sw128_desc(sk + slab_k, 16, 1024), kk > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(s);

    // --- logits (base 2) and masks (as prefill_mma_body) -----------------------------------------
    const int w = p.sliding_window;
    bool full = kt + BN <= item.key_end && kt + BN <= seq_len;
    if (p.encoder) {
      full = full && (w == 0 || (kt >= pos_hi - w + 1 && kt + BN - 1 <= pos_lo + w - 1));
    } else {
      full = full && kt + BN - 1 <= pos_lo && (w == 0 || kt >= pos_hi - w + 1);
    }
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (Plain) {
          s[n][e] *= scale_log2;
        } else {
          const int k = kt + 8 * n + 2 * t4 + (e % 2);
          s[n][e] = attention_logit(p, s[n][e], row_head[e / 2], row_pos[e / 2], k, context_len) * kLog2e;
        }
      }
    }
    if (!full) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2;
          const int k = kt + 8 * n + 2 * t4 + (e % 2);
          // Select, never multiply: a masked score is −inf whatever the key held.
          if (!(row_valid[i] && k < item.key_end && key_visible(p, request, seq_len, row_pos[i], k))) {
            s[n][e] = kNegInf;
          }
        }
      }
    }

    // --- online softmax (rows g, g + 8; a quad of lanes shares a row) --------------------------------
    uint32_t pa[BN / 16][4];  // P as the register A operand of P·V, rounded to T
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = kNegInf;
#pragma unroll
      for (int n = 0; n < kNt; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_m[i], mx);
      // Reference point of this tile's P: m − shift (P ≤ 2^shift); 0 while no key is visible.
      const float m_ref = m_new == kNegInf ? 0.0f : m_new - Scales::kPShift;
      const float alpha = row_m[i] == kNegInf ? 0.0f : exp2_approx(row_m[i] - m_new);
      row_m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        const float p0 = exp2_approx(s[n][2 * i] - m_ref);
        const float p1 = exp2_approx(s[n][2 * i + 1] - m_ref);
        sum += p0 + p1;
        // S n-tile n → A fragment of k-step n / 2: regs 0/1 (rows g / g+8) for even n, 2/3 for odd.
        pa[n / 2][(n % 2) * 2 + i] = Mma<T>::pack(p0, p1);
      }
      row_l[i] = row_l[i] * alpha + sum;
#pragma unroll
      for (int n = 0; n < kDt; ++n) {
        o[n][2 * i] *= alpha;
        o[n][2 * i + 1] *= alpha;
      }
    }

    // --- O += P·V (V [key][d]: B MN-major; k-step kk = keys 16·kk …, 2048 bytes per step) -------------
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      Mmas::rs(o, pa[kk], wgmma::sw128_desc(sv + static_cast<uint32_t>(kk * 16 * 128), BN * 128, 1024));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(o);
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits

  // --- epilogue (as prefill_mma_body): quad-reduce l (fixed order), sinks, fp8 output, store valid
  // rows (element pairs, with the optional fused hybrid add: store_output_vec) --------------------
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = row_l[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid[i]) continue;
    const float m_nat = row_m[i] == kNegInf ? kNegInf : (row_m[i] - Scales::kPShift) * kLn2;
    const RowScale f = row_finalize(p, row_head[i], m_nat, l);
    const int r = warp * 16 + g + 8 * i;
    const int64_t token = query_start + item.token_begin + r / item.num_heads;
    const int64_t row = token * p.o_stride_token + static_cast<int64_t>(row_head[i]) * p.o_stride_head;
#pragma unroll
    for (int n = 0; n < kDt; ++n) {
      const float pair[2] = {f.zero != 0.0f ? 0.0f : o[n][2 * i] * f.acc_factor,
                             f.zero != 0.0f ? 0.0f : o[n][2 * i + 1] * f.acc_factor};
      store_output_vec<T, 2>(p, row + 8 * n + 2 * t4, pair);
    }
  }
#else
  (void)p;  // no wgmma below sm_90a: never launched (launch_prefill_wgmma checks the device)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace hybridtb::cuda
