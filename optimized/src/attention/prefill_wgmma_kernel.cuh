// The Hopper variant of the tensor-core prefill path (tile variant kPrefillWgmma, attention_caps.h):
// the algorithm of prefill_mma_kernel.cuh (FlashAttention-2 style paged attention, online softmax
// in base 2, P rounded to the model dtype ×2^15, every logit feature) with both products on
// warpgroup MMAs (wgmma.mma_async m64n128k16, common/wgmma.cuh) instead of mma.sync, and
// FlashAttention-3's warp specialisation. Head size 128, float16 / bfloat16 with a cache of the
// model dtype (kv cache dtype auto, or encoder_only); sm_90a only (the including translation unit
// is compiled for compute_90a; elsewhere the kernel body is empty and the launcher refuses the
// variant).
//
// One CTA = one GenericItem of at most 128 (token, head) rows of one kv head (the GQA packing of
// prefill_mma_kernel.cuh), three warpgroups (384 threads):
//   warpgroup 0, the producer (setmaxnreg down to kProducerRegisters): stages Q once, then streams
//     the K/V tiles of 128 keys through a kWgmmaStages-deep ring in shared memory, written in the
//     128-byte swizzle layout the descriptors read, and refills a stage once both consumers have
//     arrived on its `empty` mbarrier. A tile of whole pages whose keys are all read goes by TMA
//     (AttentionParams::kv_tma; the map: PrefillKvMap, attention_launch.h): one elected thread
//     issues a box copy per page, 64-dim half and K/V, the bytes complete the stage's `full`
//     mbarrier, and the producer moves on to the next stage at once (up to the ring's depth ahead).
//     Any other tile (windows starting mid-page, partial tiles, small or odd block sizes, no map)
//     takes cp.async, each key row addressed through the block table (PrefillKvLoader); the
//     producer then waits for the tile's copies, makes them visible to the async proxy and arrives
//     on `full`, one tile behind its issue. Both kinds of tile share the ring and its barriers;
//   warpgroups 1 and 2, the consumers (setmaxnreg up to kConsumerRegisters), 64 rows each. Per
//     tile t: S [64 × 128] = Q·K_tᵀ (8 wgmma k-steps, A = Q and B = K both K-major from shared
//     memory) and O [64 × 128] += P_{t−1}·V_{t−1} (8 k-steps, A = the previous tile's P from
//     registers, B = its V tile read MN-major through a transposed descriptor) issued together;
//     once S has landed (wait_group 1) the logits, masks and online softmax of tile t run while
//     the P·V does (the per-element code is the mma.sync kernel's, shared in prefill_common.cuh);
//     once the P·V has landed (wait_group 0) O is rescaled, P packed, and tile t − 1's stage
//     handed back. The last tile's P·V follows the loop.
// No CTA-wide barrier after the start: the consumers never wait for each other, and neither spends
// issue slots on address arithmetic or copies. Keys nobody in the CTA sees are never read
// (cp.async zero-fill); padding rows read zeros and are never stored; no atomics, fixed reduction
// order: bitwise reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_caps.h"
#include "attention/attention_common.cuh"
#include "attention/byte_cache.cuh"
#include "attention/prefill_common.cuh"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

namespace hybridtb::cuda {

constexpr int kWgmmaConsumers = 2;                     // consumer warpgroups of 64 rows
constexpr int kWgmmaThreads = 128 * (1 + kWgmmaConsumers);  // + the producer warpgroup
constexpr int kWgmmaStages = 3;  // K/V ring; at least 3 (the producer hands tile t − 1 over after issuing t)
constexpr int kWgmmaHead = 128;  // the only head size
// setmaxnreg: 384 threads start at 65536 / 384 → 168 registers each; the producer gives part of
// its share to the consumers (56 · 128 + 224 · 256 = 64512 ≤ 65536). Without spills on either side
// (-Xptxas -v): the loader's unrolled rows need 56, the consumer's S, O and P 224.
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 224;

// K/V tiles by TMA: the map (PrefillKvMap, encoded on the host by encode_prefill_kv_map) views the
// paged cache as the 5-D tensor, innermost dimension first,
//   (head dim < 128, kv head < num_kv_heads, slot < block_size, half: 0 K / 1 V, block < num_blocks)
// with the cache's strides (in bytes: cache_stride_head, _slot, _half, _block · 2), and copies boxes
// of kKvBoxDims dims × 1 head × block_size slots × 1 × 1 with CU_TENSOR_MAP_SWIZZLE_128B. The
// coordinates of cp.async.bulk.tensor.5d go in the same order (innermost first): {d0, kv head, 0,
// half, page}. A box is one page's rows of one kv head and one 64-column slab: block_size rows of
// 128 bytes. A page is whole 1024-byte swizzle atoms (block_size a multiple of kSwizzleAtomRows)
// and a tile whole pages (block_size divides the tile's BN = 128 keys): wgmma_kv_tma_block.
//
// Why a box lands where the descriptors read (wgmma::sw128_offset): the TMA unit writes the box's
// rows one after another, row r at dst + 128·r, and SWIZZLE_128B moves 16-byte chunk c of each row
// to chunk c ^ (bits 7–9 of its shared-memory address) — byte-address bits 4–6 XOR bits 7–9, the
// same function a descriptor of layout type 1 (128-byte swizzle) reads through, since both act on
// the address. The box of page g (tile rows j0 = g·block_size …) goes to its slab's base + 128·j0;
// slab bases, stages and the ring are 1024-byte aligned and 128·j0 is a multiple of 1024 (j0 a
// multiple of 8), so bits 7–9 of row r's address are (j0 + r) % 8 = j % 8 for tile row j = j0 + r:
// chunk c of key j lands at slab + 128·j + ((c ^ j % 8) << 4) = sw128_offset<BN>(j, c + 8·slab).
constexpr int kKvBoxDims = 64;        // head dims per box: one 128-byte swizzle row, SWIZZLE_128B's limit
constexpr int kSwizzleAtomRows = 8;   // rows of 128 bytes per 1024-byte swizzle atom
__host__ __device__ constexpr bool wgmma_kv_tma_block(int block_size) {
  return block_size > 0 && block_size % kSwizzleAtomRows == 0 && prefill_wgmma_config().bn % block_size == 0;
}

// Q tile [128 rows][128], then the ring of kWgmmaStages × (K tile, V tile) [128 keys][128], each in
// the 128-byte swizzle layout, then the mbarriers (q full, then per stage full and empty); + 1024
// bytes to align the dynamic shared memory to a swizzle atom.
constexpr int64_t prefill_wgmma_smem_bytes() {
  const int64_t tile = static_cast<int64_t>(2) * kWgmmaHead * 128;
  return tile + 2 * kWgmmaStages * tile + 8 * (1 + 2 * kWgmmaStages) + 1024;
}

namespace wgmma_ws {
// Ping-pong of the two consumer warpgroups (FlashAttention-3): each issues its MMAs only after the
// other has issued its own (named barrier 1 + w, both warpgroups' 256 threads), so that one's
// softmax runs while the other's MMAs occupy the tensor cores. The barrier id is a register, so
// ptxas reserves all 16 named barriers (one CTA per SM in any case).
__device__ __forceinline__ void wait_for_turn(int consumer) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
}
__device__ __forceinline__ void pass_turn(int consumer) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (1 - consumer)) : "memory");
}
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
}
__device__ __forceinline__ void consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
}
}  // namespace wgmma_ws

// T: model dtype (also the cache element); Plain: no soft cap and no ALiBi (prefill_mma_body).
// kv_map: the cache's tensor map where p.kv_tma (launch_prefill_wgmma), unread otherwise.
template <typename T, bool Plain>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    prefill_wgmma_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ CUtensorMap kv_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mma;
  constexpr int D = kWgmmaHead;
  constexpr int BN = prefill_config(D, kPrefillWgmma).bn;
  constexpr int kRows = prefill_rows(D, kPrefillWgmma);
  static_assert(BN == 128 && kRows == 64 * kWgmmaConsumers, "m64n128k16 tiles: S 64 × BN, O 64 × D");
  static_assert(kWgmmaStages >= 3, "the producer waits for tile t − 3's stage before handing t − 1 over");
  static_assert(D % kKvBoxDims == 0 && BN / kSwizzleAtomRows <= 32,
                "TMA tiles: a box per 64-column slab, at most one page per lane of a warp");
  constexpr int kNt = BN / 8;     // S n-tiles (8 keys)
  constexpr int kDt = D / 8;      // O n-tiles (8 dims)
  constexpr int kTileBytes = BN * D * 2;
  static_assert((kRows * D * 2) % 1024 == 0 && kTileBytes % 1024 == 0 && (BN * 128) % 1024 == 0,
                "Q, stages and slabs start on 1024-byte swizzle atoms (the TMA boxes' placement)");
  constexpr float kLog2e = 1.4426950408889634f;
  using Scales = CacheScales<T, T>;
  using Mmas = wgmma::Wgmma<T>;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_aligned = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem_aligned));
  const uint32_t s_k = s_q + kRows * D * 2;
  const uint32_t s_v = s_k + kWgmmaStages * kTileBytes;
  auto* bars = reinterpret_cast<uint64_t*>(smem_aligned + kRows * D * 2 + 2 * kWgmmaStages * kTileBytes);
  uint64_t* q_full = bars;                      // Q staged (the producer's 128 threads arrive)
  uint64_t* full = bars + 1;                    // [stage]: the tile in it landed (128 arrivals + its TMA bytes)
  uint64_t* empty = bars + 1 + kWgmmaStages;    // [stage]: both consumers are done with it (256)

  const GenericItem item = p.prefill_items[blockIdx.x];
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;  // 0: producer; 1, 2: consumers
  const PrefillItem work(p, item);
  const int num_tiles = (item.key_end - item.key_begin + BN - 1) / BN;
  auto stage_of = [](int tile) { return static_cast<uint32_t>((tile % kWgmmaStages) * kTileBytes); };

  if (tid == 0) {
    tma::mbarrier_init(q_full, 128);
    for (int st = 0; st < kWgmmaStages; ++st) {
      tma::mbarrier_init(full + st, 128);
      tma::mbarrier_init(empty + st, 128 * kWgmmaConsumers);
    }
    tma::fence_barrier_init();  // `full` also counts the TMA unit's bytes
  }
  __syncthreads();

  if (wg == 0) {
    // --- producer: Q, then the K/V tiles. Every producer thread arrives once on each phase of a
    // stage's `full` barrier: on a TMA tile at once (the elected thread with the tile's bytes, which
    // then complete the phase), on a cp.async tile once its own copies have landed and been fenced
    // for the async proxy. So the two kinds of tile share the ring and its barriers. -------------------
    wgmma_ws::producer_registers();
    if (p.kv_tma && tid == 0) tma::prefetch_map(&kv_map);
    load_prefill_q<T, D, kRows, 128>(p, work, s_q, tid,
                                     [](int r, int c) { return wgmma::sw128_offset<kRows>(r, c); });
    const PrefillKvLoader<T, D, BN, 128, kTileBytes> kv_loader(p);
    // The barrier (index into bars) whose arrival waits for this thread's latest cp.async group: Q's,
    // then a cp.async tile's; kNoneDue once it has arrived. Every thread takes the same branches (they
    // depend on the tile only), so it is the warpgroup's alike.
    constexpr int kNoneDue = -1;
    int due = static_cast<int>(q_full - bars);
    for (int t = 0; t < num_tiles; ++t) {
      const int stage = t % kWgmmaStages;
      // The stage's previous tile (t − kWgmmaStages) was handed back in its (t / stages)-th phase. The
      // consumers hand it back after waiting for tile t − kWgmmaStages + 1, whose arrivals this thread
      // has made (only the latest tile's can be pending), so this wait cannot hold up its own arrival.
      if (t >= kWgmmaStages) tma::mbarrier_wait(empty + stage, static_cast<uint32_t>((t / kWgmmaStages - 1) & 1));
      const int kt = item.key_begin + t * BN;
      // TMA only where it copies exactly what cp.async would: whole pages (kv_tma: the map exists, so
      // the block size is wgmma_kv_tma_block's; the tile starts on a page) and every key read (no
      // zero-filled row; every page of the tile is in the request's block table).
      if (p.kv_tma && kt % p.block_size == 0 && work.keys_all_read(kt, BN)) {
        uint64_t* bar = full + stage;
        if (tid < 32) {
          // Warp 0: the tile's block-table entries, one per lane, then the elected lane announces
          // the tile's bytes and issues per page, slab and K/V one box into the stage.
          const int pages = BN / p.block_size;
          const int first_block = kt / p.block_size;
          const int32_t lane_page =
              tid < pages ? p.block_table[static_cast<int64_t>(work.request) * p.block_table_stride + first_block + tid]
                          : 0;
          const bool elected = tma::elect_one();
          if (elected) {
            tma::mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
          } else {
            tma::mbarrier_arrive(bar);
          }
          const uint32_t page_bytes = static_cast<uint32_t>(p.block_size * 128);
#pragma unroll 1
          for (int g = 0; g < pages; ++g) {
            const int32_t page = __shfl_sync(0xffffffffu, lane_page, g);
            if (elected) {
              // Page g: tile rows g·block_size …, in each 64-column slab (sw128_offset's layout).
              const uint32_t rows = stage_of(t) + static_cast<uint32_t>(g) * page_bytes;
#pragma unroll
              for (int slab = 0; slab < D / kKvBoxDims; ++slab) {
                const uint32_t dst = rows + static_cast<uint32_t>(slab * BN * 128);
                tma::load_tile_5d(s_k + dst, &kv_map, slab * kKvBoxDims, work.kv_head, 0, 0, page, bar);
                tma::load_tile_5d(s_v + dst, &kv_map, slab * kKvBoxDims, work.kv_head, 0, 1, page, bar);
              }
            }
          }
        } else {
          tma::mbarrier_arrive(bar);
        }
        // The consumers need the due cp.async group's tile before this one (and the next `empty`
        // wait may depend on it): complete it now, with this tile's copies in flight.
        if (due != kNoneDue) {
          cp_async_wait<0>();
          wgmma::fence_proxy_async();
          tma::mbarrier_arrive(bars + due);
          due = kNoneDue;
        }
      } else {
        // The thread index hidden from the compiler per tile: the rows' swizzled offsets, all of them
        // derived from it, are then computed per tile instead of held across the loop, which would
        // not fit kProducerRegisters beside the TMA branch (a few integer operations per row).
        int loader_tid = tid;
        asm volatile("" : "+r"(loader_tid));
        kv_loader.load(p, work, loader_tid, kt, s_k, s_v, stage,
                       [](int j, int c) { return wgmma::sw128_offset<BN>(j, c); });
        cp_async_commit();
        if (due != kNoneDue) {
          cp_async_wait<1>();  // the group before this one: Q or the previous cp.async tile
          wgmma::fence_proxy_async();
          tma::mbarrier_arrive(bars + due);
        }
        due = static_cast<int>(full - bars) + stage;
      }
    }
    if (due != kNoneDue) {
      cp_async_wait<0>();
      wgmma::fence_proxy_async();
      tma::mbarrier_arrive(bars + due);
    }
    return;
  }

  // --- consumers ------------------------------------------------------------------------------------
  wgmma_ws::consumer_registers();
  const int ctid = tid - 128;  // thread of the consumers' 256
  const int lane = ctid % 32;
  const int warp = ctid / 32;  // rows 16·warp … + 15
  const int cwg = ctid / 128;  // rows 64·cwg … + 63
  // This thread's rows: g and g + 8 of its warp's 16.
  const int g = lane / 4;
  const int t4 = lane % 4;
  PrefillRow rows[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) work.row(warp * 16 + g, i, rows[i]);
  // The multiplier of each key's dot products (prefill_logits; the cache is of the model dtype, so
  // no key has a scale of its own) and each key's v scale (prefill_pack_p: 1).
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
  // Tile `it` landed (its `full` phase) and is visible to the async proxy.
  auto wait_tile = [&](int it) {
    tma::mbarrier_wait(full + it % kWgmmaStages, static_cast<uint32_t>((it / kWgmmaStages) & 1));
  };
  // S = Q·K_itᵀ issued and committed, not awaited. Q of this warpgroup: rows 64·cwg …; k-step kk =
  // columns 16·kk … (slab kk / 4, 32 bytes per step).
  const uint32_t q_rows = s_q + static_cast<uint32_t>(cwg * 64 * 128);
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
    const bool full_tile = work.tile_full<BN>(p, it);
    prefill_logits<Plain>(p, work, acc, key_mul, rows, kt, t4);
    if (!full_tile) prefill_mask(p, work, acc, rows, kt, t4);
    prefill_softmax_p<Scales>(acc, row_m, row_l, alpha);
  };

  tma::mbarrier_wait(q_full, 0);
  // The turns: consumer 0 issues first. There are num_tiles + 1 issue points (tile 0's S, then S
  // and the previous P·V per tile, then the last P·V); consumer 1 passes its last turn to nobody,
  // so that every wait_for_turn has exactly one pass_turn.
  if (cwg == 1 && num_tiles > 0) wgmma_ws::pass_turn(cwg);
  auto end_turn = [&](int point) {
    if (cwg == 0 || point < num_tiles) wgmma_ws::pass_turn(cwg);
  };
  // P of the latest tile whose softmax is done: the A operand of its P·V.
  uint32_t pa[BN / 16][4];
  if (num_tiles > 0) {  // tile 0: nothing to overlap yet; O is 0, so no rescale
    wait_tile(0);
    float s[kNt][4];
    wgmma_ws::wait_for_turn(cwg);
    issue_s(s, 0);
    end_turn(0);
    wgmma::wait<0>();
    wgmma::pin(s);
    float alpha[2];
    softmax_tile(s, 0, alpha);
    prefill_pack_p<T>(s, key_v, pa);
  }
  for (int it = 1; it < num_tiles; ++it) {
    wait_tile(it);
    float s[kNt][4];
    wgmma_ws::wait_for_turn(cwg);
    issue_s(s, it);
    add_pv(o, pa, s_v + stage_of(it - 1));  // behind S, under the same fence
    end_turn(it);
    wgmma::wait<1>();                       // S has landed; the P·V may still run
    wgmma::pin(s);
    float alpha[2];
    softmax_tile(s, it, alpha);
    wgmma::wait<0>();  // the P·V has landed: O, the A operand and tile it − 1's stage are free
    wgmma::pin(o);
    wgmma::pin(pa);
    tma::mbarrier_arrive(empty + (it - 1) % kWgmmaStages);
    prefill_rescale(o, alpha);
    prefill_pack_p<T>(s, key_v, pa);
  }
  if (num_tiles > 0) {  // the last tile's P·V
    wgmma::fence();
    wgmma_ws::wait_for_turn(cwg);
    add_pv(o, pa, s_v + stage_of(num_tiles - 1));
    end_turn(num_tiles);
    wgmma::wait<0>();
    wgmma::pin(o);
  }

  // --- epilogue: quad-reduce l (fixed order), sinks, fp8 output, store valid rows -------------------
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    prefill_store_row<T, Scales>(p, work, rows[i], warp * 16 + g + 8 * i, i, row_m[i], row_l[i], 1.0f, o, t4);
  }
#else
  (void)p;  // no wgmma below sm_90a: never launched (launch_prefill_wgmma checks the device)
  (void)kv_map;
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace hybridtb::cuda
