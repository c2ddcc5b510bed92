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
// block table, written in the 128-byte swizzle layout the descriptors read. Per tile t and warpgroup:
//   S [64 × 128] = Q·K_tᵀ: 8 wgmma k-steps, A = Q and B = K both K-major from shared memory;
//   O [64 × 128] += P_{t−1}·V_{t−1}: 8 wgmma k-steps issued right behind S, A = the previous tile's
//     P from registers (S n-tiles 2k, 2k + 1 form the A fragment of k-step k), B = its V tile
//     [key][d] read MN-major (transposed descriptor);
//   once S has landed (wait_group 1): logits, masks and the online softmax of tile t on the
//     accumulator registers while the P·V still runs (the mma.sync C layout, so the per-element
//     code is the mma.sync kernel's, shared in prefill_common.cuh: item rows, Q and K/V row
//     addressing, full-tile test, masks, logits, softmax step, epilogue);
//   once the P·V has landed (wait_group 0): O rescaled to tile t's running max.
// The last tile's P·V follows the loop. The ring holds three tiles: K of t and V of t − 1 are read
// while t + 1 loads. The two warpgroups run independently between the per-tile barriers, so one's
// softmax also overlaps the other's MMAs. Keys nobody in the CTA sees are never read (cp.async
// zero-fill); padding rows read zeros and are never stored; no atomics, fixed reduction order:
// bitwise reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_caps.h"
#include "attention/attention_common.cuh"
#include "attention/byte_cache.cuh"
#include "attention/prefill_common.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"

namespace hybridtb::cuda {

constexpr int kWgmmaWarpgroups = 2;
constexpr int kWgmmaThreads = 128 * kWgmmaWarpgroups;
constexpr int kWgmmaStages = 3;  // cp.async ring: tile t + 1 loads while K of t and V of t − 1 are read
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
  constexpr int kNt = BN / 8;     // S n-tiles (8 keys)
  constexpr int kDt = D / 8;      // O n-tiles (8 dims)
  constexpr int kTileBytes = BN * D * 2;
  constexpr float kLog2e = 1.4426950408889634f;
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
  const PrefillItem work(p, item);

  // --- Q tile (zeros for padding rows) --------------------------------------------------------
  load_prefill_q<T, D, kRows, kWgmmaThreads>(p, work, s_q, tid,
                                             [](int r, int c) { return wgmma::sw128_offset<kRows>(r, c); });

  // --- K/V tile loader: keys [kt, kt + BN) into ring stage `stage` ------------------------------
  const PrefillKvLoader<T, D, BN, kWgmmaThreads, kTileBytes> kv_loader(p);
  auto load_tile = [&](int kt, int stage) {
    kv_loader.load(p, work, tid, kt, s_k, s_v, stage,
                   [](int j, int c) { return wgmma::sw128_offset<BN>(j, c); });
  };

  // --- this thread's rows: g and g + 8 of its warp's 16 ---------------------------------------------
  const int g = lane / 4;
  const int t4 = lane % 4;
  PrefillRow rows[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) work.row(warp * 16 + g, i, rows[i]);
  // The multiplier of each key's dot products (prefill_logits; the cache is of the model dtype, so
  // no key has a scale of its own) and each key's v scale (prefill_softmax: 1).
  float key_mul[kNt][2];
  float key_v[kNt][2];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    key_mul[n][0] = key_mul[n][1] = Plain ? p.scale * kLog2e : 1.0f;
    key_v[n][0] = key_v[n][1] = 1.0f;
  }

  float o[kDt][4];
  float row_m[2] = {kNegInf, kNegInf};  // running max of the base-2 logits
  float row_l[2] = {0.0f, 0.0f};        // this thread's part of Σ 2^{t − (m − shift)}
#pragma unroll
  for (int n = 0; n < kDt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  // O += P·V for one tile (V [key][d]: B MN-major; k-step kk = keys 16·kk …, 2048 bytes per step),
  // issued and committed, not awaited. The caller's wgmma::fence() must precede it.
  auto add_pv = [](float (&acc)[kDt][4], const uint32_t (&pv)[BN / 16][4], uint32_t sv) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      Mmas::rs(acc, pv[kk], wgmma::sw128_desc(sv + static_cast<uint32_t>(kk * 16 * 128), BN * 128, 1024));
    }
    wgmma::commit();
  };

  const int num_tiles = (item.key_end - item.key_begin + BN - 1) / BN;
  if (num_tiles > 0) load_tile(item.key_begin, 0);
  cp_async_commit();
  auto stage_of = [](int tile) { return static_cast<uint32_t>((tile % kWgmmaStages) * kTileBytes); };

  // Tile `it` landed and visible to all; every warpgroup's P·V of tile it − 2 (issued in iteration
  // it − 1 and awaited there) is done, so its stage may take tile it + 1, which starts loading.
  auto arrive_at_tile = [&](int it) {
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    if (it + 1 < num_tiles) load_tile(item.key_begin + (it + 1) * BN, (it + 1) % kWgmmaStages);
    cp_async_commit();
  };
  // S = Q·K_itᵀ issued and committed, not awaited. Q of this warpgroup: rows 64·wg …; k-step kk =
  // columns 16·kk … (slab kk / 4, 32 bytes per step).
  const uint32_t q_rows = s_q + static_cast<uint32_t>(wg * 64 * 128);
  auto issue_s = [&](float (&acc)[kNt][4], int it) {
#pragma unroll
    for (int n = 0; n < kNt; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;  // overwritten (k-step 0)
    wgmma::pin(acc);  // defined before the fence, not between it and the MMAs
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t slab_q = static_cast<uint32_t>((kk / 4) * kRows * 128 + (kk % 4) * 32);
      const uint32_t slab_k = static_cast<uint32_t>((kk / 4) * BN * 128 + (kk % 4) * 32);
      Mmas::ss(acc, wgmma::sw128_desc(q_rows + slab_q, 16, 1024),
               wgmma::sw128_desc(s_k + stage_of(it) + slab_k, 16, 1024), kk > 0);
    }
    wgmma::commit();
  };
  // Logits (base 2), masks (only where some key of the tile is hidden from some row) and the online
  // softmax of tile `it` (rows g, g + 8; a quad of lanes shares a row): acc becomes P in float32.
  auto softmax_tile = [&](float (&acc)[kNt][4], int it, float (&alpha)[2]) {
    const int kt = item.key_begin + it * BN;
    const bool full = work.tile_full<BN>(p, it);
    prefill_logits<Plain>(p, work, acc, key_mul, rows, kt, t4);
    if (!full) prefill_mask(p, work, acc, rows, kt, t4);
    prefill_softmax_p<Scales>(acc, row_m, row_l, alpha);
  };

  // P of the latest tile whose softmax is done: the A operand of its P·V.
  uint32_t pa[BN / 16][4];
  if (num_tiles > 0) {  // tile 0: nothing to overlap yet; O is 0, so no rescale
    arrive_at_tile(0);
    float s[kNt][4];
    issue_s(s, 0);
    wgmma::wait<0>();
    wgmma::pin(s);
    float alpha[2];
    softmax_tile(s, 0, alpha);
    prefill_pack_p<T>(s, key_v, pa);
  }
  for (int it = 1; it < num_tiles; ++it) {
    arrive_at_tile(it);
    float s[kNt][4];
    issue_s(s, it);
    add_pv(o, pa, s_v + stage_of(it - 1));  // behind S, under the same fence
    wgmma::wait<1>();                       // S has landed; the P·V may still run
    wgmma::pin(s);
    float alpha[2];
    softmax_tile(s, it, alpha);
    wgmma::wait<0>();  // the P·V has landed: O and the A operand are free
    wgmma::pin(o);
    wgmma::pin(pa);
    prefill_rescale(o, alpha);
    prefill_pack_p<T>(s, key_v, pa);
  }
  if (num_tiles > 0) {  // the last tile's P·V
    wgmma::fence();
    add_pv(o, pa, s_v + stage_of(num_tiles - 1));
    wgmma::wait<0>();
    wgmma::pin(o);
  }
  cp_async_wait<0>();  // no copy may be in flight when the CTA exits

  // --- epilogue: quad-reduce l (fixed order), sinks, fp8 output, store valid rows -------------------
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    prefill_store_row<T, Scales>(p, work, rows[i], warp * 16 + g + 8 * i, i, row_m[i], row_l[i], 1.0f, o, t4);
  }
#else
  (void)p;  // no wgmma below sm_90a: never launched (launch_prefill_wgmma checks the device)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace hybridtb::cuda
