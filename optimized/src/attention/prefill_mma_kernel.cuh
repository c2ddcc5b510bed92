// The tensor-core prefill path: FlashAttention-2 style paged attention on mma.sync.m16n8k16
// (float16 / bfloat16 inputs, float32 accumulation) for every non-decode row of a decoder layer
// (fresh prefills, chunked prefills with context, speculative rows, mixed-batch prefill rows) and
// encoder_only layers, head sizes 64 / 128 / 256, KV cache dtype `auto` (the cache element is the
// model dtype) or a 1-byte cache (fp8 e4m3 / e5m2 or int8, per-tensor or per-token-head scales).
//
// One CTA = one GenericItem with at most 64·MT (token, head) rows of one kv head (GQA
// packing: row r → token token_begin + r / num_heads, head head_begin + r % num_heads), 4 warps of
// 16·MT rows each (MT = 2 at D 128, else 1). Q is staged once in shared memory; K/V tiles of BN keys
// (32 at D 128 and 256, 64 at D 64) stream through a kPrefillStages-deep cp.async ring (each key row addressed through the
// block table; XOR-swizzled 16-byte chunks, ldmatrix / ldmatrix.trans conflict-free). Per tile:
// S = Q·Kᵀ (mma), logits in base 2 (scale·log2e folded into one multiply on the plain path; soft cap
// and ALiBi through attention_logit on the featured path), online softmax in registers (row max
// and rescale per quad, exp2), P rounded to the model dtype (the P·V operand, as vLLM's Triton
// kernel does), O += P·V (mma, V through ldmatrix.trans). P is scaled by 2^15 (exact, cancels in
// o = Σp·v / Σp) so that float16's subnormal range costs nothing measurable (CacheScales::kPShift).
//
// Masks: only tiles that are not fully visible to every row of the CTA evaluate key_visible()
// (attention_common.cuh, = spec::key_visible) per element; masked scores are *selected* to
// −inf. Keys that no row of the CTA can see (key_needed false: outside the window, at/after
// seq_len, outside the mm ranges) are never read: cp.async zero-fills them without touching global
// memory (null-block safety). Padding rows (beyond the item's rows) read zeros and are never
// stored. No atomics, fixed reduction order: bitwise reproducible. Checked against the reference by
// tests/cuda/cuda_prefill_test.cpp. The per-element code (item rows, Q and K/V row addressing,
// full-tile test, masks, logits, softmax step, epilogue) is prefill_common.cuh, shared with the
// wgmma variant (prefill_wgmma_kernel.cuh).
//
// 1-byte caches (Cache = PerTensorBytes / PerTokenHeadBytes) keep the tensor cores: the ring holds the raw K/V bytes (half the
// bytes of a 16-bit tile, and their per-token-head scales), and once per tile the CTA casts the
// tile exactly into one K and one V tile of the model dtype in the same swizzled layout (cast_16),
// so the MMA loop is the 16-bit one; the scales act in float32 (byte_cache.cuh: per tensor on the
// logit scale and the output, per token-head on each key's dot products and probability). Costs one
// more CTA barrier per tile; the K/V bytes read halve. Per-token-head scales are staged in the order
// the threads read them (the 2·BN/8 keys 8n + 2t + {0, 1} of quad lane t contiguous), so each thread
// takes its keys' k scales and v scales with a few 16-byte loads once per tile, outside the m-tile
// loops.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "attention/attention_caps.h"
#include "attention/attention_common.cuh"
#include "attention/byte_cache.cuh"
#include "attention/prefill_common.cuh"
#include "common/mma.cuh"

namespace hybridtb::cuda {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = 32 * kPrefillWarps;
constexpr int kPrefillStages = 3;    // cp.async ring: kPrefillStages − 1 K/V tiles in flight

// Tile configurations ("variants", prefill_config): attention_caps.h.
// Shared memory of one ring stage of a 1-byte cache: the K and V bytes, then their per-token-head
// scales (float32, one per key each; the k scales, then the v scales, each in prefill_scale_slot order).
__host__ __device__ constexpr int64_t prefill_byte_stage_bytes(int d, int variant) {
  return static_cast<int64_t>(2) * prefill_config(d, variant).bn * (d + 4);
}
// Q tile, then the ring: 16-bit caches kPrefillStages × (K tile, V tile); 1-byte caches
// kPrefillStages byte stages, then the dequantised K and V tiles.
__host__ __device__ constexpr int64_t prefill_smem_bytes(int d, int variant, bool byte_cache) {
  const int64_t q_tile = static_cast<int64_t>(2) * d * prefill_rows(d, variant);
  const int64_t kv_tile = static_cast<int64_t>(2) * d * prefill_config(d, variant).bn;
  if (!byte_cache) return q_tile + 2 * kPrefillStages * kv_tile;
  return q_tile + kPrefillStages * prefill_byte_stage_bytes(d, variant) + 2 * kv_tile;
}

// T: model dtype; D: head size; Plain: no soft cap and no ALiBi (logit = scale·dot, folded with
// log2e into one multiply); V: tile variant (prefill_config); Cache: the stored K/V element, T
// (kv_cache_dtype auto, encoder_only), PerTensorBytes or PerTokenHeadBytes (a 1-byte cache, cast
// per tile; byte_cache.cuh). Sinks,
// mm_prefix, fp8 output and encoder_only are handled by both logit variants.
// The body of one CTA over p.prefill_items[item_index] (kPrefillThreads threads, prefill_smem_bytes
// of dynamic shared memory): run by prefill_mma_kernel below and by the mixed kernel
// (mixed_kernel.cuh), so both compute the same bits.
template <typename T, int D, bool Plain, int V, typename Cache>
__device__ __forceinline__ void prefill_mma_body(const AttentionParams& p, int item_index) {
  using namespace mma;
  constexpr bool kByteCache = kIsByteCache<Cache>;
  static_assert(kByteCache || std::is_same_v<Cache, T>, "the cache element is T or one byte");
  using Scales = CacheScales<T, Cache>;
  constexpr int MT = prefill_config(D, V).mt;   // m-tiles (16 rows) per warp
  constexpr int BN = prefill_config(D, V).bn;   // keys per tile
  constexpr int kRows = prefill_rows(D, V);     // rows per CTA
  constexpr int kChunks = D / 8;                // 16-byte chunks per row
  constexpr int kNt = BN / 8;                   // S n-tiles (8 keys) per m-tile
  constexpr int kDt = D / 8;                    // O n-tiles (8 dims)
  constexpr int kTileBytes = BN * D * 2;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kByteChunks = D / 16;            // 16-byte chunks per row of a 1-byte cache
  constexpr int kByteStage = static_cast<int>(prefill_byte_stage_bytes(D, V));
  static_assert(D % 16 == 0 && BN % 16 == 0, "mma tiles");
  static_assert((BN * kChunks) % kPrefillThreads == 0 && (BN * kByteChunks) % kPrefillThreads == 0, "loader");
  static_assert(2 * BN <= kPrefillThreads, "one thread per per-token-head scale");

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // 16-bit caches: the ring of K tiles [stages][BN][D], then of V tiles.
  const uint32_t s_k = s_q + kRows * D * 2;
  const uint32_t s_v = s_k + kPrefillStages * kTileBytes;
  // 1-byte caches: the ring of byte stages [stages] × (K [BN][D], V [BN][D], k scales [BN],
  // v scales [BN]), then the dequantised K and V tiles [BN][D] of the tile being computed.
  const uint32_t s_bytes = s_k;
  const uint32_t s_k_deq = s_bytes + kPrefillStages * kByteStage;
  const uint32_t s_v_deq = s_k_deq + kTileBytes;

  const GenericItem item = p.prefill_items[item_index];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const PrefillItem work(p, item);
  const auto swizzle_d = [](int row, int chunk) { return swizzle<D>(row, chunk); };

  // --- Q tile (zeros for padding rows) --------------------------------------------------------
  load_prefill_q<T, D, kRows, kPrefillThreads>(p, work, s_q, tid, swizzle_d);

  // --- K/V tile loader: keys [kt, kt + BN) into ring stage `stage` ------------------------------
  const PrefillKvLoader<T, D, BN, kPrefillThreads, kTileBytes> kv_loader(p);
  auto load_tile = [&](int kt, int stage) {
    kv_loader.load(p, work, tid, kt, s_k, s_v, stage, swizzle_d);
  };
  // 1-byte caches: the raw K/V rows (row-major, 16-byte chunks) and, per token-head, their scales.
  const auto* cache_bytes = static_cast<const uint8_t*>(p.kv_cache);
  const Scales scales(p);
  auto load_byte_tile = [&](int kt, int stage) {
    const uint32_t base = s_bytes + static_cast<uint32_t>(stage * kByteStage);
    // Thread tid copies chunk tid % kByteChunks of rows tid / kByteChunks + kByteRowsPerPass·i; a
    // tile whose keys are all read walks its rows from one division (PrefillKvLoader's fast path).
    constexpr int kByteRowsPerPass = kPrefillThreads / kByteChunks;
    static_assert(kPrefillThreads % kByteChunks == 0 && BN % kByteRowsPerPass == 0, "whole rows per pass");
    const int c = tid % kByteChunks;
    const int j0 = tid / kByteChunks;
    const bool all_read = work.keys_all_read(kt, BN);
    PagedRowWalk walk(p, work, kt + j0);
#pragma unroll
    for (int i = 0; i < BN / kByteRowsPerPass; ++i) {
      const int j = j0 + i * kByteRowsPerPass;
      const bool ok = all_read || work.key_read(p, kt, j);
      const int64_t koff =
          all_read ? walk.offset(p) : ok ? cache_row_offset(p, work.request, kt + j, 0, work.kv_head) : 0;
      const uint32_t so = static_cast<uint32_t>(j * D + c * 16);
      cp_async_16(base + so, cache_bytes + koff + c * 16, ok);
      cp_async_16(base + BN * D + so, cache_bytes + koff + p.cache_stride_half + c * 16, ok);
      if (all_read) walk.advance(kByteRowsPerPass);
    }
    if (Scales::kPerToken && tid < 2 * BN) {
      const int j = tid % BN;
      const int half = tid / BN;  // 0: k scale, 1: v scale
      const int k = kt + j;
      const bool ok = work.key_read(p, kt, j);
      const float* cache = half == 0 ? p.k_scale_cache : p.v_scale_cache;
      cp_async_4(base + 2 * BN * D + static_cast<uint32_t>(4 * (half * BN + prefill_scale_slot(j, BN))),
                 cache + (ok ? scale_index(p, work.request, k, work.kv_head) : 0), ok);
    }
  };
  // The byte stage `stage` → the K and V tiles of T (keys never loaded are zeros); the stored kind
  // is picked once per tile (with_byte_kind), so the loop is straight-line casts.
  auto cast_tile = [&](int stage) {
    const int base = static_cast<int>(s_bytes - s_q) + stage * kByteStage;
    with_byte_kind<Cache>(p.kv_kind, [&](auto kind) {
      // Not unrolled: the accumulators hold most registers here, so one chunk is in flight at a time.
#pragma unroll 1
      for (int i = 0; i < 2 * BN * kByteChunks / kPrefillThreads; ++i) {
        const int idx = tid + i * kPrefillThreads;
        const int half = idx / (BN * kByteChunks);  // 0: K, 1: V
        const int j = (idx / kByteChunks) % BN;
        const int c = idx % kByteChunks;
        const uint4 raw = *reinterpret_cast<const uint4*>(smem + base + half * BN * D + j * D + c * 16);
        uint4 out[2];
        cast_16<T, decltype(kind)::value>(raw, out);
        const int tile = static_cast<int>((half == 0 ? s_k_deq : s_v_deq) - s_q);
        *reinterpret_cast<uint4*>(smem + tile + swizzle<D>(j, 2 * c)) = out[0];
        *reinterpret_cast<uint4*>(smem + tile + swizzle<D>(j, 2 * c + 1)) = out[1];
      }
    });
  };
  auto load_stage = [&](int kt, int stage) {
    if constexpr (kByteCache) {
      load_byte_tile(kt, stage);
    } else {
      load_tile(kt, stage);
    }
  };

  // --- this thread's rows: g and g + 8 of each of the warp's m-tiles --------------------------------
  const int g = lane / 4;
  const int t4 = lane % 4;
  PrefillRow rows[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) work.row((warp * MT + m) * 16 + g, i, rows[m][i]);
  }
  const float scale_log2 = p.scale * kLog2e * scales.k;

  float o[MT][kDt][4];
  float row_m[MT][2];  // running max of the base-2 logits
  float row_l[MT][2];  // this thread's part of Σ 2^{t − (m − shift)}
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int n = 0; n < kDt; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
    row_m[m][0] = row_m[m][1] = kNegInf;
    row_l[m][0] = row_l[m][1] = 0.0f;
  }

  const int num_tiles = (item.key_end - item.key_begin + BN - 1) / BN;
#pragma unroll
  for (int st = 0; st < kPrefillStages - 1; ++st) {
    if (st < num_tiles) load_stage(item.key_begin + st * BN, st);
    cp_async_commit();
  }

  for (int it = 0; it < num_tiles; ++it) {
    cp_async_wait<kPrefillStages - 2>();
    __syncthreads();  // tile `it` visible to all; every warp is done with tile it − 1's stage
    {
      const int next = it + kPrefillStages - 1;
      if (next < num_tiles) load_stage(item.key_begin + next * BN, next % kPrefillStages);
      cp_async_commit();
    }
    const int stage = it % kPrefillStages;
    const int kt = item.key_begin + it * BN;
    uint32_t sk = s_k + static_cast<uint32_t>(stage * kTileBytes);
    uint32_t sv = s_v + static_cast<uint32_t>(stage * kTileBytes);
    if constexpr (kByteCache) {
      // Every warp finished tile it − 1 (the barrier above), so the cast tiles are free.
      cast_tile(stage);
      __syncthreads();
      sk = s_k_deq;
      sv = s_v_deq;
    }

    // --- S = Q·Kᵀ (each K fragment serves the warp's MT m-tiles) --------------------------------
    float s[MT][kNt][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        ldmatrix_x4(a[m], s_q + swizzle<D>((warp * MT + m) * 16 + (lane % 16), 2 * kk + lane / 16));
      }
#pragma unroll
      for (int nb = 0; nb < BN / 16; ++nb) {
        uint32_t b[4];
        ldmatrix_x4(b, sk + swizzle<D>(nb * 16 + (lane % 8) + (lane / 16) * 8, 2 * kk + (lane / 8) % 2));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          Mma<T>::run(s[m][2 * nb], a[m], b[0], b[1]);
          Mma<T>::run(s[m][2 * nb + 1], a[m], b[2], b[3]);
        }
      }
    }

    // --- logits (base 2) and masks (only where some key of the tile is hidden from some row) ------
    const bool full = work.tile_full<BN>(p, it);
    // Per-token-head caches: the k (half 0) or v (half 1) scales of this thread's keys
    // 8n + 2·t4 + {0, 1} of the tile, n = 0 … kNt − 1 (prefill_scale_slot: 16-byte loads).
    const int scale_base = static_cast<int>(s_bytes - s_q) + stage * kByteStage + 2 * BN * D;
    auto key_scales = [&](int half, float (&out)[kNt][2]) {
      if constexpr (Scales::kPerToken) {
        const auto* staged = reinterpret_cast<const float4*>(smem + scale_base + 4 * (half * BN + t4 * 2 * kNt));
#pragma unroll
        for (int n = 0; n < kNt; n += 2) {
          const float4 x = staged[n / 2];
          out[n][0] = x.x;
          out[n][1] = x.y;
          out[n + 1][0] = x.z;
          out[n + 1][1] = x.w;
        }
      } else {
#pragma unroll
        for (int n = 0; n < kNt; ++n) out[n][0] = out[n][1] = 1.0f;
      }
    };
    {
      // The multiplier of each key's dot products: scale·log2e·k (plain) or k (featured).
      float key_mul[kNt][2];
      key_scales(0, key_mul);
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) key_mul[n][e] *= Plain ? scale_log2 : scales.k;
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) prefill_logits<Plain>(p, work, s[m], key_mul, rows[m], kt, t4);
    }
    if (!full) {
#pragma unroll
      for (int m = 0; m < MT; ++m) prefill_mask(p, work, s[m], rows[m], kt, t4);
    }

    // --- online softmax (rows g, g + 8 of each m-tile; a quad of lanes shares a row) ----------------
    uint32_t pa[MT][BN / 16][4];  // P as the A operand of P·V, rounded to T
    float key_v[kNt][2];          // per-token-head v scales (1 otherwise)
    key_scales(1, key_v);
#pragma unroll
    for (int m = 0; m < MT; ++m) prefill_softmax<T, Scales>(s[m], key_v, row_m[m], row_l[m], o[m], pa[m]);

    // --- O += P·V (each V fragment serves the warp's MT m-tiles) --------------------------------------
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sv + swizzle<D>(kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, 2 * nd + lane / 16));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          Mma<T>::run(o[m][2 * nd], pa[m][kk], b[0], b[1]);
          Mma<T>::run(o[m][2 * nd + 1], pa[m][kk], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits

  // --- epilogue: quad-reduce l (fixed order), sinks, fp8 output, store valid rows (element pairs,
  // with the optional fused hybrid add: store_output_vec) -------------------------------------------
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // scales.v: the per-tensor v scale (1 otherwise).
      prefill_store_row<T, Scales>(p, work, rows[m][i], (warp * MT + m) * 16 + g + 8 * i, i, row_m[m][i], row_l[m][i],
                                   scales.v, o[m], t4);
    }
  }
}

// One CTA per prefill item.
template <typename T, int D, bool Plain, int V, typename Cache>
__global__ void __launch_bounds__(kPrefillThreads, prefill_config(D, V).min_blocks)
    prefill_mma_kernel(const __grid_constant__ AttentionParams p) {
  prefill_mma_body<T, D, Plain, V, Cache>(p, static_cast<int>(blockIdx.x));
}

}  // namespace hybridtb::cuda
