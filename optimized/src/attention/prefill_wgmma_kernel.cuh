// The Hopper variant of the tensor-core prefill path (tile variant kPrefillWgmma, attention_caps.h):
// the algorithm of prefill_mma_kernel.cuh (FlashAttention-2 style paged attention, online softmax
// in base 2, P rounded to the model dtype ×2^15, every logit feature) with both products on
// warpgroup MMAs (wgmma.mma_async m64n128k16, common/wgmma.cuh) instead of mma.sync, and
// FlashAttention-3's warp specialisation. Float16 / bfloat16 with a cache of the model dtype (kv cache
// dtype auto, or encoder_only) at head sizes 64, 128 and 256 (WgmmaConfig: keys per tile, ring
// depth and register split per head size), or a 1-byte cache (below) at head size 128; sm_90a only
// (the including translation unit is compiled for compute_90a; elsewhere the kernel body is empty
// and the launcher refuses the variant). The description below is head size 128's (BN = 128 keys
// per tile, three stages); D 64 and 256 differ in the numbers only.
//
// One CTA = one GenericItem of at most 128 (token, head) rows of one kv head (the GQA packing of
// prefill_mma_kernel.cuh), three warpgroups (384 threads; four with a 1-byte cache and plain
// logits, whose two producer warpgroups share the casts: WgmmaRegisters):
//   warpgroup 0, the producer (setmaxnreg down to kProducerRegisters): stages Q once, then streams
//     the K/V tiles of 128 keys through a kStages-deep ring in shared memory, written in the
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
//     the P·V does (the per-element code is the mma.sync kernel's, shared in prefill_common.cuh,
//     except that on the plain path with a per-tensor or no k scale the logits' one multiplier is
//     folded into the softmax's exponent: one FFMA per score, P within its last bit of the other's);
//     once the P·V has landed (wait_group 0) O is rescaled, P packed, and tile t − 1's stage
//     handed back. The last tile's P·V follows the loop.
// 1-byte caches (Cache = PerTensorBytes / PerTokenHeadBytes: fp8 e4m3 / e5m2 per tensor, int8 / fp8
// per token-head; WgmmaLayout): the producer alone casts, so the consumers' loop is the 16-bit one.
// With plain logits both products run on float16 operands whatever the model dtype, but for a
// bfloat16 model's per-token-head caches (WgmmaOperands): every stored value is exact in float16,
// the producer's cast shrinks to the hardware's pair conversion (e4m3), a byte permute (e5m2) or a
// permute and a subtraction (int8), P rounds to float16, and a bfloat16 model's Q rows are first
// rescaled into float16's range by the consumers (stage_q_as_half), each row's power of two undone
// in its logits' multiplier.
// With plain logits the producer is two warpgroups, each thread copying and casting half as many
// chunks: one warpgroup's casts, at a quarter of an instruction per cycle per warp, set the pace.
// It streams the tile's raw K and V tiles (each 128 keys × 128 bytes, plus the keys' per-token-head
// scales) by cp.async through the block table into a ring of kWgmmaRawSlots raw slots, K and V of a
// tile in turn, up to two slots ahead of its casts; then each thread casts exactly the chunks it
// copied itself (cast_16, byte_cache.cuh: exact; so no barrier among the producer's threads) into
// the 16-bit stage in the 128-byte swizzle layout, copies its key's scale beside the stage
// (prefill_scale_slot order), makes its writes visible to the async proxy and arrives on the half's
// barrier: `full` for K, `v_full` for V. The 16-bit ring is two stages deep (shared memory), so its
// K and V tiles travel apart both ways: the consumers wait for K of tile t before S_t and for V of
// tile t − 1 before P_{t−1}·V_{t−1} (issued together), and hand them back on the stage's `k_empty`
// once S_t has landed and its logits have read the k scales, on `empty` once its P·V has landed. So
// the producer casts K of tile t + 2 while the consumers still run P_t·V_t, and V of tile t + 1
// (whose stage frees only when P_{t−1}·V_{t−1} lands, mid-iteration t) a whole iteration before its
// P·V is issued; with one barrier for the pair, each iteration would wait for that cast. The
// copies' block-table reads are made one unit ahead of their copies (UnitSources). The scales act
// in float32 as in prefill_mma_kernel.cuh (CacheScales): per tensor k on the logit scale and v on
// the output; per token-head each key's k scale on its dot products (key_mul) and its v scale on
// its probability before P is rounded (key_v).
// No CTA-wide barrier after the start: the consumers never wait for each other, and neither spends
// issue slots on address arithmetic or copies. Keys nobody in the CTA sees are never read
// (cp.async zero-fill); padding rows read zeros and are never stored; no atomics, fixed reduction
// order: bitwise reproducible.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "attention/attention_caps.h"
#include "attention/attention_common.cuh"
#include "attention/byte_cache.cuh"
#include "attention/prefill_common.cuh"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

namespace hybridtb::cuda {

constexpr int kWgmmaConsumers = 2;   // consumer warpgroups of 64 rows
constexpr int kWgmmaByteHead = 128;  // the head size of the 1-byte caches' instances

// The launch configuration of one head size D (16-bit caches; the 1-byte caches' ring: WgmmaLayout):
//   kBn: keys per K/V tile (prefill_wgmma_config(D).bn): S is 64 × kBn per consumer warpgroup;
//   kStages: the K/V ring's depth, as deep as the 227 KiB of an SM allow beside Q (128 rows × D);
//   kProducerRegisters / kConsumerRegisters: setmaxnreg. 384 threads start at 65536 / 384 → 168
//     registers each; the producer gives part of its share to the consumers (producer · 128 +
//     consumer · 256 ≤ 65536), each side without spills (-Xptxas -v);
//   kKvApart: a stage's K and V tiles land and are handed back on barriers of their own (`full` /
//     `v_full`, `k_empty` / `empty`), so that K of tile t + 2 loads once S_t has landed and V of
//     tile t + 1 once P_{t−1}·V_{t−1} has, a whole iteration before each is read; with K and V
//     together, a two-stage ring loads tile t + 1 only once P_{t−1}·V_{t−1} has landed, right
//     before the consumers wait for it.
template <int D>
struct WgmmaConfig;
// D 128: three stages of 64 KiB (K and V tiles of 128 keys) beside Q's 32 KiB; the loader's unrolled
// rows need 56 registers, the consumer's S (64), O (64) and P (32) 224: 56 · 128 + 224 · 256 = 64512.
// kTmaIssueWarps: the producer warps that issue a TMA tile's boxes, each its share of the pages (one
// thread issuing a tile's 16 boxes at pages of 16 held the step back by about 10%).
template <>
struct WgmmaConfig<128> {
  static constexpr int kHead = 128;
  static constexpr int kBn = 128;
  static constexpr int kStages = 3;
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;
  static constexpr bool kKvApart = false;
  static constexpr int kTmaIssueWarps = 4;
};
// D 64: tiles of 128 keys are 32 KiB a stage, so six stages (192 KiB) beside Q's 16 KiB hide more of
// the cache's latency (FlashAttention-3 runs D 64 with more stages too); O is 32 registers, S and P
// as at D 128: D 128's split. One warp issues a tile's boxes (four measured 4% slower here).
template <>
struct WgmmaConfig<64> {
  static constexpr int kHead = 64;
  static constexpr int kBn = 128;
  static constexpr int kStages = 6;
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;
  static constexpr bool kKvApart = false;
  static constexpr int kTmaIssueWarps = 1;
};
// D 256: O is 64 × 256 per consumer warpgroup, 128 float registers a thread, so S is 64 × 64 (32
// registers, P 16): tiles of 64 keys, 64 KiB a stage (K and V), two stages beside Q's 64 KiB (a
// third would pass 227 KiB), so K and V travel apart (kKvApart). D 128's split holds S, O (128) and
// P (16) without spills; 48 producer registers (for 232 a consumer) spill its loader's rows of 32
// chunks. Four warps issue a tile's boxes, as at D 128.
template <>
struct WgmmaConfig<256> {
  static constexpr int kHead = 256;
  static constexpr int kBn = 64;
  static constexpr int kStages = 2;
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;
  static constexpr bool kKvApart = true;
  static constexpr int kTmaIssueWarps = 4;
};

// The warpgroups and register split of one instantiation: Config's (one producer warpgroup), except
// for a 1-byte cache with plain logits. Its producer casts every K/V element, and one warpgroup of
// casts sets the kernel's pace (about a quarter of an instruction per cycle per warp, dependency
// stalls), so two producer warpgroups share the casts at 40 registers each, beside consumers that,
// without the featured logits' state, fit 216 without spills (the featured ones spill there).
template <typename Config, bool Plain, typename Cache>
struct WgmmaRegisters {
  static constexpr bool kTwoProducers = kIsByteCache<Cache> && Plain;
  static constexpr int kProducerWarpgroups = kTwoProducers ? 2 : 1;
  static constexpr int kProducerThreads = 128 * kProducerWarpgroups;
  static constexpr int kThreads = kProducerThreads + 128 * kWgmmaConsumers;
  static constexpr int kProducer = kTwoProducers ? 40 : Config::kProducerRegisters;
  static constexpr int kConsumer = kTwoProducers ? 216 : Config::kConsumerRegisters;
  static_assert(kProducer * kProducerThreads + kConsumer * 128 * kWgmmaConsumers <= 65536, "one SM's registers");
};

// The operand type of the two products (MmaT): T, except for a 1-byte cache with plain logits,
// whose products run on float16 operands whatever the model dtype (wgmma_float16_products, but for
// a bfloat16 model's per-token-head caches, whose v scales inside P float16 could not bound; they
// keep bfloat16 products and the cast to bfloat16). Then the producer's cast is the
// hardware's e4m3 pair conversion, a byte permute for e5m2 or a permute and a subtraction for int8
// (word_to_half_pairs: a quarter to a half of the instructions of the cast to bfloat16, whose
// producer warpgroups set the kernel's pace), every stored value is exact in float16, and P rounds
// to float16 (2^-11, finer than bfloat16's 2^-8) in float16's range (CacheScales<MmaT, Cache>: P ∈
// [0, 2^15], or [0, 2^6] with the per-token-head v scales inside it: tolerance.h, e_P). A bfloat16 model's Q rows are rescaled into float16's
// range first (kRescaledQ: stage_q_as_half), each by a power of two that its logits' multiplier
// undoes in float32. The one bound this adds is a float16 model's: the largest P of a row is
// 2^(15 + δ), δ the rounding error of the row's largest base-2 logit in float32 (the softmax's
// fused exponent, prefill_softmax_p), so logits below 2^22 in magnitude keep P under float16's
// 65504 (2^15.25); beyond that P overflows and the row's output is NaN, never a finite wrong value.
template <typename T, bool Plain, typename Cache>
struct WgmmaOperands {
  static constexpr bool kHalfProducts =
      wgmma_float16_products(kIsByteCache<Cache>, kIsPerTokenHeadCache<Cache>, std::is_same_v<T, __half>, Plain);
  static constexpr bool kRescaledQ = kHalfProducts && !std::is_same_v<T, __half>;
  using MmaT = std::conditional_t<kHalfProducts, __half, T>;
};

// The K and V tiles in shared memory (wgmma_kv_tile_offset, attention_caps.h, where
// test_attention_plan checks the properties below): keys in groups of 8, each group its D / 64
// slabs of 64 dims one after another, each slab one 1024-byte atom of the 128-byte swizzle (8 rows
// of 128 bytes, 16-byte chunk c of row r at r·128 + ((c ^ r % 8) << 4): sw128_offset's atom).
// Chunk c (dims 8c …) of key j is at
//   (j / 8)·16·D + (c / 8)·1024 + (j % 8)·128 + (((c % 8) ^ (j % 8)) << 4).
// So the rows of one page (block_size keys, a multiple of 8) are block_size·D·2 contiguous bytes,
// one TMA box (below). wgmma reads K (K-major B of S) with its 8-key groups kKvGroupBytes apart
// (the descriptor's stride offset) and a k-step's 32 bytes inside a slab; V (MN-major B of P·V)
// with its slabs 1024 bytes apart along the dims (leading offset) and its 8-key groups
// kKvGroupBytes apart along the keys (stride offset). At D 64 it is the plain [key][128 bytes]
// swizzle layout.
template <int D>
constexpr uint32_t kKvGroupBytes = 16 * D;  // 8 keys × D dims × 2 bytes

// K/V tiles by TMA: the map (PrefillKvMap, encoded on the host by encode_prefill_kv_map) views the
// paged cache as the 5-D tensor, innermost dimension first,
//   (dim % 64, slot % 8, slab: kv head·D / 64 + dim / 64, slot / 8, block and half joined)
// with strides (in bytes) cache_stride_slot·2, 128, 8·cache_stride_slot·2 and the smaller of the
// block and half strides; the slab dimension runs over a page's heads because they lie one after
// another (cache_stride_head = D), and the outermost coordinate of page b, half h is
// b·kv_tma_block_step + h·kv_tma_half_step. A box is 64 × 8 × D / 64 × block_size / 8 × 1 with
// CU_TENSOR_MAP_SWIZZLE_128B: one page of one head and half, coordinates {0, 0, kv head·D / 64, 0,
// joined}. A tile is whole pages (block_size a multiple of kSwizzleAtomRows dividing the tile's BN
// keys: wgmma_kv_tma_block), so two boxes a page (K, V), whatever the head size. At D 64, where a
// key group is one slab, the map is the cache's own view (head dim, kv head, slot, half, block),
// box 64 × 1 × block_size × 1 × 1 at {0, kv head, 0, half, page}: the same rows, and the view above
// was 1.16x slower there (encode_prefill_kv_map).
//
// Why a box lands where the descriptors read: the TMA unit writes the box's 128-byte rows one
// after another in its dimensions' order (slot % 8 innermost, then the slabs, then slot / 8), row n
// at dst + 128·n, and SWIZZLE_128B moves 16-byte chunk c of each row to chunk c ^ (bits 7–9 of its
// shared-memory address) — byte-address bits 4–6 XOR bits 7–9, the same function a descriptor of
// layout type 1 (128-byte swizzle) reads through, since both act on the address. Page g's box goes
// to the tile's base + g·block_size·D·2, the offset of its first key; stages are 1024-byte aligned,
// so bits 7–9 of a row's address are its slot % 8 = j % 8 for tile row j, and chunk c of slab s of
// key j lands at wgmma_kv_tile_offset<D>(j, c + 8·s).
constexpr int kKvBoxDims = 64;        // dims per slab: one 128-byte swizzle row, SWIZZLE_128B's limit
constexpr int kSwizzleAtomRows = 8;   // rows of 128 bytes per 1024-byte swizzle atom
__host__ __device__ constexpr bool wgmma_kv_tma_block(int block_size, int head_size) {
  return block_size > 0 && block_size % kSwizzleAtomRows == 0 &&
         prefill_wgmma_config(head_size).bn % block_size == 0;
}

// 1-byte caches: the 16-bit ring's depth and the raw staging ring's slots (one raw K or V tile each).
// Q (32 KiB) + 2 × 64 KiB + 3 × 16.5 KiB + the scales fit the 227 KiB of an SM; a third 16-bit stage
// does not.
constexpr int kWgmmaByteStages = 2;
constexpr int kWgmmaRawSlots = 3;

// The shared memory of one instantiation (Config: WgmmaConfig<D>; Cache: T, PerTensorBytes or
// PerTokenHeadBytes), offsets from the 1024-byte aligned base: the Q tile [128 rows][D], then the
// ring of kStages × (K tile, V tile) [BN keys][D] of T, each in the 128-byte swizzle layout; for a
// 1-byte cache then the raw slots (the raw tile [128 keys][128 bytes], its keys' scales [128] in
// float32), per stage the tile's k and v scales [2][128] (prefill_scale_slot order) and Q's row
// multipliers [128] (stage_q_as_half); then the mbarriers (q full, per stage full and empty, and with
// K and V apart k_empty and v_full); + 1024
// bytes to align the dynamic shared memory to a swizzle atom. 16-bit caches: 209 KiB (D 64), 225 KiB (D 128),
// 193 KiB (D 256).
template <typename Config, typename Cache>
struct WgmmaLayout {
  static constexpr bool kBytes = kIsByteCache<Cache>;
  static constexpr int kHead = Config::kHead;
  static constexpr int kBn = Config::kBn;
  static_assert(kBn == prefill_wgmma_config(kHead).bn, "the planner's tiles (attention_caps.h)");
  static_assert(!kBytes || kHead == kWgmmaByteHead, "1-byte caches: head size 128 only");
  static constexpr int kStages = kBytes ? kWgmmaByteStages : Config::kStages;
  static constexpr bool kKvApart = kBytes || Config::kKvApart;  // a 1-byte cache's K and V are cast apart
  static constexpr int kRawSlots = kBytes ? kWgmmaRawSlots : 0;
  static constexpr int kTileBytes = 2 * kHead * kBn;  // a K or V tile of T
  static constexpr int kQBytes = 2 * kHead * 128;     // the Q tile: 128 rows
  static constexpr int kRawBytes = kHead * kBn;       // a raw K or V tile
  static constexpr int kRawSlotBytes = kRawBytes + 4 * kBn;
  static constexpr int kScaleBytes = kBytes ? 2 * 4 * kBn : 0;  // per stage
  static constexpr int kQScaleBytes = kBytes ? 4 * 128 : 0;      // Q's row multipliers (stage_q_as_half)
  static constexpr int kBarriers = 1 + (kKvApart ? 4 : 2) * kStages;
  static constexpr int kK = kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kRaw = kV + kStages * kTileBytes;
  static constexpr int kScales = kRaw + kRawSlots * kRawSlotBytes;
  static constexpr int kQScales = kScales + kStages * kScaleBytes;
  static constexpr int kBars = kQScales + kQScaleBytes;
  static constexpr int64_t kSmemBytes = static_cast<int64_t>(kBars) + 8 * kBarriers + 1024;
};
template <typename Config, typename Cache>
constexpr int64_t prefill_wgmma_smem_bytes() {
  return WgmmaLayout<Config, Cache>::kSmemBytes;
}
static_assert(prefill_wgmma_smem_bytes<WgmmaConfig<kWgmmaByteHead>, PerTokenHeadBytes>() <= 227 * 1024,
              "1-byte cache layout: one SM's shared memory");
static_assert(prefill_wgmma_smem_bytes<WgmmaConfig<64>, __half>() <= 227 * 1024 &&
                  prefill_wgmma_smem_bytes<WgmmaConfig<128>, __half>() <= 227 * 1024 &&
                  prefill_wgmma_smem_bytes<WgmmaConfig<256>, __half>() <= 227 * 1024,
              "16-bit cache layouts: one SM's shared memory");

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
template <int kRegisters>
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
}  // namespace wgmma_ws

// Rows [row_begin, row_begin + kThreads / 16 · kPasses) of a bfloat16 Q tile [kRows][128] (the
// 128-byte swizzle layout at smem) in float16 for the float16 products (WgmmaOperands::kRescaledQ),
// in place, by kThreads threads: each row times 2^s (s = float16_range_shift of the row's max|q|:
// exact but for elements below 2^-28 of the row's largest, byte_cache.cuh), then rounded to
// float16; row_mul[r] = 2^-s, which the row's logit multiplier takes on. A row of zeros (padding)
// stays zeros. Thread tid takes chunk tid % 16 of rows row_begin + tid / 16 + (kThreads / 16)·i, so
// the half-warp of a row reduces its max by shuffles. The caller makes the writes visible to the
// async proxy and to the other threads.
template <int kRows, int kThreads, int kPasses>
__device__ __forceinline__ void stage_q_as_half(unsigned char* smem, float* row_mul, int tid, int row_begin) {
  constexpr int kChunks = 128 / 8;  // 16-byte chunks per row
  static_assert(kThreads % kChunks == 0, "whole rows per pass");
  const int c = tid % kChunks;
#pragma unroll 2
  for (int i = 0; i < kPasses; ++i) {
    const int r = row_begin + tid / kChunks + (kThreads / kChunks) * i;
    auto* chunk = reinterpret_cast<uint4*>(smem + wgmma::sw128_offset<kRows>(r, c));
    const uint4 x = *chunk;
    uint32_t w[4] = {x.x, x.y, x.z, x.w};
    // max|q| as bfloat16 bits: the magnitudes' bit patterns order as their values (NaN above inf).
    uint32_t pair_max = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) pair_max = __vmaxu2(pair_max, w[k] & 0x7FFF7FFFu);
    uint32_t max_bits = max(pair_max & 0xFFFFu, pair_max >> 16);
#pragma unroll
    for (int lanes = 1; lanes < kChunks; lanes *= 2) max_bits = max(max_bits, __shfl_xor_sync(0xffffffffu, max_bits, lanes));
    const int shift = float16_range_shift(max_bits);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = bfloat16_pair_to_half(w[k], shift);
    *chunk = make_uint4(w[0], w[1], w[2], w[3]);
    if (c == 0) row_mul[r] = __uint_as_float(static_cast<uint32_t>(127 - shift) << 23);
  }
}

// The producer warpgroups' K/V tiles for a 1-byte cache (the header's "1-byte caches"; kThreads
// producer threads, one or two warpgroups): raw K and V tiles ("units": unit 2t K of tile t, 2t + 1
// its V) by cp.async into raw slot u % kRawSlots, one cp.async group per unit, kRawSlots units
// ahead; each cast into its 16-bit stage once the stage's previous tile handed that half back.
// Thread tid copies and casts the same chunks: pass i of a unit, row j = (kThreads / 4)·(i / 2) +
// 8·warp + lane / 4 and 16-byte chunk c = lane % 4 + 4·(i % 2) (elements 16c …), kept in the slot at
// 16·(kThreads·i + tid) (conflict-free either way), cast into the 16-bit chunks 2c and 2c + 1 of row
// j (sw128_offset; a quarter warp's rows j, j ^ 1 fill distinct banks). The per-token-head scale of
// key tid (tid < BN) rides in its unit's slot. Q's cp.async group (committed before) completes
// q_full. T: the products' operand type (WgmmaOperands::MmaT), the type the casts write.
template <typename T, typename Cache, int kThreads>
__device__ __forceinline__ void prefill_wgmma_byte_producer(const AttentionParams& p, const PrefillItem& work,
                                                            int num_tiles, unsigned char* smem, uint64_t* q_full,
                                                            uint64_t* full, uint64_t* v_full, uint64_t* empty,
                                                            uint64_t* k_empty, int tid) {
  using Layout = WgmmaLayout<WgmmaConfig<kWgmmaByteHead>, Cache>;
  constexpr int D = kWgmmaByteHead;
  constexpr int BN = Layout::kBn;
  constexpr int kStages = Layout::kStages;
  constexpr int kSlots = Layout::kRawSlots;
  constexpr int kPasses = BN * D / 16 / kThreads;  // 16-byte chunks per thread and unit
  constexpr int kPassRows = kThreads / 4;          // rows of a pass: 8 per warp
  constexpr bool kPerToken = kIsPerTokenHeadCache<Cache>;
  // Raw chunks loaded ahead of their casts (cast below), as many as fit 40 registers without
  // spills: four beside the per-tensor cast to bfloat16, two beside the per-tensor float16 cast or
  // a per-token-head cast to bfloat16, one beside the per-token-head float16 cast.
  constexpr int kLoadGroup = std::is_same_v<T, __half> ? (kPerToken ? 1 : 2) : (kPerToken ? 2 : 4);
  static_assert(kPasses % 2 == 0 && BN == kPassRows * (kPasses / 2) && D == 16 * 8,
                "pass i: rows kPassRows·(i / 2) …, chunks");
  static_assert(BN <= kThreads, "one per-token-head scale per producer thread (tid < BN) and unit");
  static_assert(kSlots >= 2, "the next unit's copies in flight while one is cast");
  static_assert(kPasses % kLoadGroup == 0, "whole load groups");
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int j0 = 8 * warp + lane / 4;
  const auto* cache = static_cast<const uint8_t*>(p.kv_cache);
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto slot_of = [](int u) { return static_cast<uint32_t>(Layout::kRaw + (u % kSlots) * Layout::kRawSlotBytes); };

  // Where unit u's copies read: this thread's cache rows (the K half's offsets; kNotRead for a key
  // no row of the CTA sees, and for every row past the last tile) and its per-token-head scale's
  // index. They take a block-table read each, so they are found apart from the copies, one unit
  // ahead of its issue: behind a cp.async (asm volatile, "memory") each read would wait for the
  // copy before it, a round trip per row, and every round trip holds up the casts.
  constexpr int kUnitRows = kPasses / 2;
  constexpr int64_t kNotRead = -1;
  struct UnitSources {
    int64_t row[kUnitRows];
    int64_t scale;
  };
  const PagedRowWalk::Step row_step = PagedRowWalk::step_of(kPassRows, p.block_size);
  auto sources_of = [&](int u) {
    UnitSources src;
    const int kt = work.item.key_begin + (u / 2) * BN;
    const bool all_read = u < 2 * num_tiles && work.keys_all_read(kt, BN);
    PagedRowWalk walk(p, work, kt + j0);
#pragma unroll
    for (int r = 0; r < kUnitRows; ++r) {
      const int j = j0 + kPassRows * r;
      if (all_read) {
        src.row[r] = walk.offset(p);
        walk.advance(row_step);
      } else {
        const bool read = u < 2 * num_tiles && work.key_read(p, kt, j);
        src.row[r] = read ? cache_row_offset(p, work.request, kt + j, 0, work.kv_head) : kNotRead;
      }
    }
    src.scale = kPerToken && tid < BN && u < 2 * num_tiles && work.key_read(p, kt, tid)
                    ? scale_index(p, work.request, kt + tid, work.kv_head)
                    : kNotRead;
    return src;
  };
  // Unit u's copies from `src` (none past the last tile), committed as one group.
  auto issue = [&](int u, const UnitSources& src) {
    if (u < 2 * num_tiles) {
      const int half = u % 2;  // 0: K, 1: V
      const uint32_t slot = s_base + slot_of(u);
      const int64_t half_offset = half == 0 ? 0 : p.cache_stride_half;
#pragma unroll
      for (int r = 0; r < kUnitRows; ++r) {
        const bool ok = src.row[r] != kNotRead;
        const uint8_t* row = cache + (ok ? src.row[r] + half_offset : 0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mma::cp_async_16(slot + static_cast<uint32_t>(16 * (kThreads * (2 * r + h) + tid)),
                           row + 16 * (lane % 4 + 4 * h), ok);
        }
      }
      if constexpr (kPerToken) {
        if (tid < BN) {
          const bool ok = src.scale != kNotRead;
          const float* scales = half == 0 ? p.k_scale_cache : p.v_scale_cache;
          mma::cp_async_4(slot + static_cast<uint32_t>(Layout::kRawBytes + 4 * tid), scales + (ok ? src.scale : 0),
                          ok);
        }
      }
    }
    mma::cp_async_commit();
  };
  // Pass i's two 16-bit chunks, wgmma_kv_tile_offset<D>(j, 2c) and (j, 2c + 1): row j =
  // kPassRows·(i / 2) + j0 has j0's place in its key group, and 2c = 2·(lane % 4) + 8·(i % 2) puts
  // pass i in slab i % 2, so each is this thread's offset in pass 0 plus
  // wgmma_kv_tile_offset<D>(kPassRows·(i / 2), 8·(i % 2)).
  const uint32_t chunk_lo = wgmma_kv_tile_offset<D>(j0, 2 * (lane % 4));
  const uint32_t chunk_hi = wgmma_kv_tile_offset<D>(j0, 2 * (lane % 4) + 1);
  // Unit u (landed) → half u % 2 of 16-bit stage `stage`, and its scales beside the stage.
  auto cast = [&](int u, int stage) {
    const int half = u % 2;
    const unsigned char* raw = smem + slot_of(u) + 16 * tid;
    unsigned char* tile = smem + (half == 0 ? Layout::kK : Layout::kV) + stage * Layout::kTileBytes;
    // The passes' bytes are read kLoadGroup at a time, each group before its casts store: the
    // compiler keeps a load of the slot below a store to the tile (shared memory it cannot tell
    // apart), so a load per pass would wait out the shared-memory latency once a pass.
    with_byte_kind<Cache>(p.kv_kind, [&](auto kind) {
#pragma unroll
      for (int g = 0; g < kPasses; g += kLoadGroup) {
        uint4 bytes[kLoadGroup];
#pragma unroll
        for (int k = 0; k < kLoadGroup; ++k) {
          bytes[k] = *reinterpret_cast<const uint4*>(raw + 16 * kThreads * (g + k));
        }
#pragma unroll
        for (int k = 0; k < kLoadGroup; ++k) {
          const int i = g + k;
          const uint32_t pass = wgmma_kv_tile_offset<D>(kPassRows * (i / 2), 8 * (i % 2));
          uint4 out[2];
          cast_16<T, decltype(kind)::value>(bytes[k], out);
          *reinterpret_cast<uint4*>(tile + pass + chunk_lo) = out[0];
          *reinterpret_cast<uint4*>(tile + pass + chunk_hi) = out[1];
        }
      }
    });
    if constexpr (kPerToken) {
      if (tid < BN) {
        auto* scales = reinterpret_cast<float*>(smem + Layout::kScales + stage * Layout::kScaleBytes);
        scales[half * BN + prefill_scale_slot(tid, BN)] =
            *reinterpret_cast<const float*>(smem + slot_of(u) + Layout::kRawBytes + 4 * tid);
      }
    }
  };

#pragma unroll 1
  for (int u = 0; u < kSlots; ++u) issue(u, sources_of(u));
  mma::cp_async_wait<kSlots>();  // Q's group
  wgmma::fence_proxy_async();
  tma::mbarrier_arrive(q_full);
  for (int t = 0; t < num_tiles; ++t) {
    const int stage = t % kStages;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const int u = 2 * t + half;
      // The stage's previous tile (t − kStages) handed this half back in the (t / kStages)-th phase
      // of k_empty / empty; the consumers do so only after waiting for halves this thread has
      // completed (K of t − kStages; for V, K of t − kStages + 1 and V of t − kStages, and per
      // token-head V of t − kStages + 1), so the wait cannot hold up its own arrivals.
      if (t >= kStages) {
        tma::mbarrier_wait((half == 0 ? k_empty : empty) + stage, static_cast<uint32_t>((t / kStages - 1) & 1));
      }
      mma::cp_async_wait<kSlots - 1>();  // unit u's group: this thread's chunks of it landed
      const UnitSources next = sources_of(u + kSlots);  // its block-table reads in flight during the cast
      cast(u, stage);
      issue(u + kSlots, next);  // into the slot just cast: its reads were consumed by the casts' stores
      // This thread's part of the half, written by the generic proxy, visible to the consumers' wgmma.
      wgmma::fence_proxy_async();
      tma::mbarrier_arrive((half == 0 ? full : v_full) + stage);
    }
  }
  mma::cp_async_wait<0>();  // no copy in flight at exit (the groups past the last unit are empty)
}

// The item with its tiles starting on a page where whole pages go by TMA (kv_tma): its first key
// rounded down to a multiple of the block size. The keys before it are visible to no row of the item
// (key_begin is the hull of what its rows see), so the first tile masks them and its loader
// zero-fills them without reading memory; every later tile that reads all its keys is then whole
// pages. Without it the items of a window a whole number of pages wide start one key past a page
// (position − window + 1, the positions a multiple of the item's tokens), and not one of their tiles
// would go by TMA. Without TMA (a 1-byte cache's tiles) the rounding could only add a tile; an item
// without keys stays as it is (no tile).
__device__ __forceinline__ GenericItem tiles_from_page_start(GenericItem item, const AttentionParams& p) {
  if (p.kv_tma && item.key_end > item.key_begin) item.key_begin -= item.key_begin % p.block_size;
  return item;
}

// The S and P·V products of one consumer warpgroup for BN keys per tile and head size D, on the
// wgmma shapes of common/wgmma.cuh: S [64 × BN] by m64nBNk16 (BN 128 or 64); O [64 × D] by m64n128k16
// (D 128), m64n64k16 (D 64) or two m64n128k16 on the halves of O and of each V row (D 256: dims
// 0–127 in V's slabs 0–1, 128–255 in slabs 2–3), each O element accumulated over the keys in the
// same k-step order whatever the split.
template <typename T, int BN, int D>
struct WgmmaProducts {
  static_assert(BN == 128 || BN == 64, "S: m64n128k16 or m64n64k16");
  static_assert(D == 64 || D == 128 || D == 256, "O: m64n64k16, m64n128k16 or two of them");
  // acc (+)= A·Bᵀ, A and B K-major in shared memory; acc overwritten when accumulate is false.
  __device__ __forceinline__ static void s(float (&acc)[BN / 8][4], uint64_t a, uint64_t b, bool accumulate) {
    if constexpr (BN == 128) {
      wgmma::Wgmma<T>::ss(acc, a, b, accumulate);
    } else {
      wgmma::WgmmaN64<T>::ss(acc, a, b, accumulate);
    }
  }
  // The descriptor of B for pv at v_rows, the k-step's 16 keys of a V tile (MN-major in
  // wgmma_kv_tile_offset's layout: slabs 1024 bytes apart along the dims, key groups kKvGroupBytes<D>).
  static constexpr uint32_t kVSlabBytes = 1024;
  __device__ __forceinline__ static uint64_t v_desc(uint32_t v_rows) {
    return wgmma::sw128_desc(v_rows, kVSlabBytes, kKvGroupBytes<D>);
  }
  // acc += A·B, A in registers, B by v_desc.
  __device__ __forceinline__ static void pv(float (&acc)[D / 8][4], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (D == 128) {
      wgmma::Wgmma<T>::rs(acc, a, b);
    } else if constexpr (D == 64) {
      wgmma::WgmmaN64<T>::rs(acc, a, b);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        auto& half = *reinterpret_cast<float(*)[16][4]>(&acc[16 * h][0]);
        wgmma::Wgmma<T>::rs(half, a, wgmma::sw128_desc_advance(b, static_cast<uint32_t>(2 * h) * kVSlabBytes));
      }
    }
  }
};

// T: model dtype; Plain: no soft cap and no ALiBi (prefill_mma_body); Cache: the stored K/V element,
// T (kv_cache_dtype auto, encoder_only), PerTensorBytes or PerTokenHeadBytes (a 1-byte cache);
// Config: WgmmaConfig of the head size (WgmmaConfig<128> for a 1-byte cache).
// kv_map: the cache's tensor map where p.kv_tma (launch_prefill_wgmma), unread otherwise.
template <typename Config, typename T, bool Plain, typename Cache>
__global__ void __launch_bounds__((WgmmaRegisters<Config, Plain, Cache>::kThreads), 1)
    prefill_wgmma_kernel(const __grid_constant__ AttentionParams p, const __grid_constant__ CUtensorMap kv_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace mma;
  constexpr int D = Config::kHead;
  constexpr int BN = prefill_config(D, kPrefillWgmma).bn;
  constexpr int kRows = prefill_rows(D, kPrefillWgmma);
  static_assert(BN == Config::kBn && kRows == 64 * kWgmmaConsumers, "m64 tiles: S 64 × BN, O 64 × D");
  constexpr bool kByteCache = kIsByteCache<Cache>;
  constexpr bool kPerToken = kIsPerTokenHeadCache<Cache>;
  static_assert(kByteCache || std::is_same_v<Cache, T>, "the cache element is T or one byte");
  using Layout = WgmmaLayout<Config, Cache>;
  constexpr int kStages = Layout::kStages;
  // 16-bit caches: the producer waits for tile t − kStages's stage, which the consumers hand back
  // once tile t − kStages + 1 has landed; it hands a cp.async tile over one tile after issuing it,
  // so with two stages it does so before that wait (below). 1-byte caches: it hands tile t over
  // before casting t + 1.
  static_assert(kStages >= 2, "a tile in flight while the consumers read the one before");
  static_assert(D % kKvBoxDims == 0 && BN / kSwizzleAtomRows <= 32,
                "TMA tiles: whole 64-dim slabs, at most one page per lane of a warp");
  constexpr int kNt = BN / 8;     // S n-tiles (8 keys)
  constexpr int kDt = D / 8;      // O n-tiles (8 dims)
  constexpr int kTileBytes = BN * D * 2;
  static_assert((kRows * D * 2) % 1024 == 0 && kTileBytes % 1024 == 0 && (BN * 128) % 1024 == 0,
                "Q, stages and slabs start on 1024-byte swizzle atoms (the TMA boxes' placement)");
  constexpr float kLog2e = 1.4426950408889634f;
  using Operands = WgmmaOperands<T, Plain, Cache>;
  using MmaT = typename Operands::MmaT;
  using Scales = CacheScales<MmaT, Cache>;  // P's shift: the type P rounds to
  using Mmas = WgmmaProducts<MmaT, BN, D>;
  using Registers = WgmmaRegisters<Config, Plain, Cache>;
  constexpr int kProducerThreads = Registers::kProducerThreads;
  static_assert(kByteCache || kProducerThreads == 128, "a 16-bit cache's producer is one warpgroup");

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem_aligned = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem_aligned));
  static_assert(Layout::kQBytes == kRows * D * 2 && Layout::kTileBytes == kTileBytes, "WgmmaLayout's tiles");
  const uint32_t s_k = s_q + Layout::kK;
  const uint32_t s_v = s_q + Layout::kV;
  auto* bars = reinterpret_cast<uint64_t*>(smem_aligned + Layout::kBars);
  uint64_t* q_full = bars;                 // Q staged (every producer thread arrives)
  uint64_t* full = bars + 1;               // [stage]: the tile in it landed (producer arrivals + its TMA bytes)
  uint64_t* empty = bars + 1 + kStages;    // [stage]: both consumers are done with it (K and V apart: with its V) (256)
  uint64_t* k_empty = bars + 1 + 2 * kStages;  // K and V apart, [stage]: both consumers are done with its K
  uint64_t* v_full = bars + 1 + 3 * kStages;   // K and V apart, [stage]: its V tile landed (`full`: its K)
  constexpr bool kKvApart = Layout::kKvApart;

  const GenericItem item = tiles_from_page_start(p.prefill_items[blockIdx.x], p);
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;  // producers first (Registers::kProducerWarpgroups), then the 2 consumers
  const PrefillItem work(p, item);
  const int num_tiles = (item.key_end - item.key_begin + BN - 1) / BN;
  auto stage_of = [](int tile) { return static_cast<uint32_t>((tile % kStages) * kTileBytes); };

  if (tid == 0) {
    tma::mbarrier_init(q_full, kProducerThreads);
    for (int st = 0; st < kStages; ++st) {
      tma::mbarrier_init(full + st, kProducerThreads);
      tma::mbarrier_init(empty + st, 128 * kWgmmaConsumers);
      if constexpr (kKvApart) {
        tma::mbarrier_init(k_empty + st, 128 * kWgmmaConsumers);
        tma::mbarrier_init(v_full + st, kProducerThreads);
      }
    }
    tma::fence_barrier_init();  // `full` also counts the TMA unit's bytes
  }
  __syncthreads();

  if (wg < Registers::kProducerWarpgroups) {
    // --- producer: Q, then the K/V tiles. Every producer thread arrives once on each phase of a
    // stage's `full` barrier: on a TMA tile at once (the elected thread with the tile's bytes, which
    // then complete the phase), on a cp.async tile once its own copies have landed and been fenced
    // for the async proxy. So the two kinds of tile share the ring and its barriers. -------------------
    wgmma_ws::producer_registers<Registers::kProducer>();
    if constexpr (kByteCache) {
      load_prefill_q<T, D, kRows, kProducerThreads>(p, work, s_q, tid,
                                                    [](int r, int c) { return wgmma::sw128_offset<kRows>(r, c); });
      prefill_wgmma_byte_producer<MmaT, Cache, kProducerThreads>(p, work, num_tiles, smem_aligned, q_full, full, v_full,
                                                                 empty, k_empty, tid);
    } else {
      if (p.kv_tma && tid == 0) tma::prefetch_map(&kv_map);
      load_prefill_q<T, D, kRows, 128>(p, work, s_q, tid,
                                       [](int r, int c) { return wgmma::sw128_offset<kRows>(r, c); });
      const PrefillKvLoader<T, D, BN, 128, kTileBytes> kv_loader(p);
      // The barrier (index into bars) whose arrival waits for this thread's latest cp.async group: Q's,
      // then a cp.async tile's; kNoneDue once it has arrived. Every thread takes the same branches (they
      // depend on the tile only), so it is the warpgroup's alike.
      constexpr int kNoneDue = -1;
      int due = static_cast<int>(q_full - bars);
      // This thread's arrival for the due group, once its copies have landed and been fenced: on its
      // barrier, and for a cp.async tile with K and V apart on the stage's `v_full` too (its one
      // group copies both halves).
      auto arrive_due = [&] {
        tma::mbarrier_arrive(bars + due);
        if constexpr (kKvApart) {
          if (due != static_cast<int>(q_full - bars)) tma::mbarrier_arrive(v_full + (due - static_cast<int>(full - bars)));
        }
      };
      for (int t = 0; t < num_tiles; ++t) {
        const int stage = t % kStages;
        // The stage's previous tile (t − kStages) was handed back in its (t / stages)-th phase. The
        // consumers hand it back after waiting for tile t − kStages + 1, whose arrivals this thread
        // has made (only the latest tile's can be pending, and with two stages that is t − 1 itself:
        // completed first), so this wait cannot hold up its own arrival. With K and V apart this is
        // the wait for the stage's K slot; its V slot's follows (v_slot_wait).
        if constexpr (kStages < 3) {
          if (t >= kStages && due != kNoneDue) {
            cp_async_wait<0>();
            wgmma::fence_proxy_async();
            arrive_due();
            due = kNoneDue;
          }
        }
        if (t >= kStages) {
          tma::mbarrier_wait((kKvApart ? k_empty : empty) + stage, static_cast<uint32_t>((t / kStages - 1) & 1));
        }
        auto v_slot_wait = [&] {
          if (kKvApart && t >= kStages) tma::mbarrier_wait(empty + stage, static_cast<uint32_t>((t / kStages - 1) & 1));
        };
        const int kt = item.key_begin + t * BN;
        // TMA only where it copies exactly what cp.async would: whole pages (kv_tma: the map exists, so
        // the block size is wgmma_kv_tma_block's; the tile starts on a page) and every key read (no
        // zero-filled row; every page of the tile is in the request's block table).
        if (p.kv_tma && kt % p.block_size == 0 && work.keys_all_read(kt, BN)) {
          // The tile's block-table entries, lane g page g, in each issuing warp (Config::kTmaIssueWarps;
          // read once, for K's and V's boxes alike). For each call warp 0's elected lane announces the
          // bytes of halves [first, last] (0: K, 1: V) on `bar`, every other thread arrives, and the
          // elected lanes issue one box per page and half: with one issuing warp its lane every page
          // after the arrivals, with more each warp's lane pages warp, warp + kIssueWarps, … before its
          // arrival (a box may land before the announcement: the phase waits for that arrival). One
          // warp keeps its own code: written as the general form, ptxas schedules head size 64's kernel
          // otherwise and it took 1.16× the time (A/B on an H200).
          constexpr int kIssueWarps = Config::kTmaIssueWarps;
          static_assert(kIssueWarps >= 1 && kIssueWarps <= 4, "issuing warps of the producer warpgroup");
          const int pages = BN / p.block_size;
          const int warp = tid / 32;
          const int lane = tid % 32;
          const bool issuer = warp < kIssueWarps;
          const int32_t lane_page =
              kIssueWarps == 1
                  ? (tid < pages
                         ? p.block_table[static_cast<int64_t>(work.request) * p.block_table_stride +
                                         kt / p.block_size + tid]
                         : 0)
                  : (issuer && lane < pages
                         ? p.block_table[static_cast<int64_t>(work.request) * p.block_table_stride +
                                         kt / p.block_size + lane]
                         : 0);
          auto load_halves = [&](uint64_t* bar, int first, int last) {
            // Page g: tile rows g·block_size …, one box per half.
            auto issue_page = [&](int g, int32_t page, uint32_t page_bytes, int slab) {
              const uint32_t dst = stage_of(t) + static_cast<uint32_t>(g) * page_bytes;
              if constexpr (D == kKvBoxDims) {  // the cache's own view: {0, kv head, 0, half, page}
                if (first == 0) tma::load_tile_5d(s_k + dst, &kv_map, 0, work.kv_head, 0, 0, page, bar);
                if (last == 1) tma::load_tile_5d(s_v + dst, &kv_map, 0, work.kv_head, 0, 1, page, bar);
              } else {
                const int joined = page * p.kv_tma_block_step;
                if (first == 0) tma::load_tile_5d(s_k + dst, &kv_map, 0, 0, slab, 0, joined, bar);
                if (last == 1) tma::load_tile_5d(s_v + dst, &kv_map, 0, 0, slab, 0, joined + p.kv_tma_half_step, bar);
              }
            };
            if constexpr (kIssueWarps == 1) {
              if (tid < 32) {
                const bool elected = tma::elect_one();
                if (elected) {
                  tma::mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>((last - first + 1) * kTileBytes));
                } else {
                  tma::mbarrier_arrive(bar);
                }
                const uint32_t page_bytes = static_cast<uint32_t>(p.block_size * D * 2);
                const int slab = work.kv_head * (D / kKvBoxDims);  // the head's first slab
#pragma unroll 1
                for (int g = 0; g < pages; ++g) {
                  const int32_t page = __shfl_sync(0xffffffffu, lane_page, g);
                  if (elected) issue_page(g, page, page_bytes, slab);
                }
              } else {
                tma::mbarrier_arrive(bar);
              }
            } else {
              const bool elected = tma::elect_one();
              if (elected && warp == 0) {
                tma::mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>((last - first + 1) * kTileBytes));
              }
              if (issuer) {
                const uint32_t page_bytes = static_cast<uint32_t>(p.block_size * D * 2);
                const int slab = work.kv_head * (D / kKvBoxDims);  // the head's first slab
#pragma unroll 1
                for (int g = warp; g < pages; g += kIssueWarps) {
                  const int32_t page = __shfl_sync(0xffffffffu, lane_page, g);
                  if (elected) issue_page(g, page, page_bytes, slab);
                }
              }
              if (!(elected && warp == 0)) tma::mbarrier_arrive(bar);
            }
          };
          load_halves(full + stage, 0, kKvApart ? 0 : 1);
          // The consumers need the due cp.async group's tile before this one (and the next `empty`
          // wait may depend on it): complete it now, with this tile's copies in flight.
          if (due != kNoneDue) {
            cp_async_wait<0>();
            wgmma::fence_proxy_async();
            arrive_due();
            due = kNoneDue;
          }
          if constexpr (kKvApart) {  // V's boxes on `v_full` once its slot is free
            v_slot_wait();
            load_halves(v_full + stage, 1, 1);
          }
        } else {
          v_slot_wait();  // a cp.async tile copies both halves
          // The thread index hidden from the compiler per tile: the rows' swizzled offsets, all of them
          // derived from it, are then computed per tile instead of held across the loop, which would
          // not fit kProducerRegisters beside the TMA branch (a few integer operations per row).
          int loader_tid = tid;
          asm volatile("" : "+r"(loader_tid));
          kv_loader.load(p, work, loader_tid, kt, s_k, s_v, stage,
                         [](int j, int c) { return wgmma_kv_tile_offset<D>(j, c); });
          cp_async_commit();
          if (due != kNoneDue) {
            cp_async_wait<1>();  // the group before this one: Q or the previous cp.async tile
            wgmma::fence_proxy_async();
            arrive_due();
          }
          due = static_cast<int>(full - bars) + stage;
        }
      }
      if (due != kNoneDue) {
        cp_async_wait<0>();
        wgmma::fence_proxy_async();
        arrive_due();
      }
    }
    return;
  }

  // --- consumers ------------------------------------------------------------------------------------
  wgmma_ws::consumer_registers<Registers::kConsumer>();
  const int ctid = tid - kProducerThreads;  // thread of the consumers' 256
  const int lane = ctid % 32;
  const int warp = ctid / 32;  // rows 16·warp … + 15
  // Rows 64·cwg … + 63. Broadcast from lane 0, the compiler knows the value warp-uniform and keeps
  // what derives from it (Q's descriptors) in uniform registers beside the MMAs' other operands.
  const int cwg = __shfl_sync(0xffffffffu, ctid / 128, 0);
  // This thread's rows: g and g + 8 of its warp's 16.
  const int g = lane / 4;
  const int t4 = lane % 4;
  PrefillRow rows[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) work.row(warp * 16 + g, i, rows[i]);
  // The multiplier of each key's dot products (prefill_logits) and each key's v scale
  // (prefill_pack_p): with a cache of the model dtype scale·log2e (plain) or 1, and 1; per tensor
  // scale·log2e·k_scale or k_scale, and 1 (prefill_mma_kernel.cuh's, to the bit); per token-head
  // each tile's staged scales times those, applied to the tile in place (scale_keys, scale_key_tile),
  // so that prefill_logits / prefill_pack_p then multiply by ones: (s·m)·1 is the bits of s·m, and no
  // array of 32 multipliers is live beside S, O and P.
  const Scales scales(p);
  float key_mul[kNt][2];
  float key_v[kNt][2];
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    if constexpr (kPerToken) {
      key_mul[n][0] = key_mul[n][1] = 1.0f;  // scale_keys
    } else if constexpr (kByteCache) {
      key_mul[n][0] = key_mul[n][1] = Plain ? p.scale * kLog2e * scales.k : scales.k;
    } else {
      key_mul[n][0] = key_mul[n][1] = Plain ? p.scale * kLog2e : 1.0f;
    }
    key_v[n][0] = key_v[n][1] = 1.0f;
  }
  // Per-token-head caches: acc's scores (or probabilities) of this thread's keys 8n + 2·t4 + {0, 1} of
  // tile `it` times their k (half 0) or v (half 1) scale times `base` (prefill_scale_slot: 16-byte
  // loads).
  [[maybe_unused]] auto scale_keys = [&](float (&acc)[kNt][4], int it, int half, float base) {
    const auto* staged = reinterpret_cast<const float4*>(smem_aligned + Layout::kScales +
                                                         (it % kStages) * Layout::kScaleBytes +
                                                         4 * (half * BN + t4 * 2 * kNt));
#pragma unroll
    for (int n = 0; n < kNt; n += 2) {
      const float4 x = staged[n / 2];
      const float m[4] = {x.x * base, x.y * base, x.z * base, x.w * base};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[n][e] *= m[e % 2];
        acc[n + 1][e] *= m[2 + e % 2];
      }
    }
  };
  // The featured path (soft cap / ALiBi) applies its k scales instead one n-tile at a time, each pair
  // read from shared memory right before that n-tile's logits (8-byte loads, the same values and
  // products): loaded ahead, 32 scales are live beside S, O, P and the featured logits' state and
  // spill at kConsumerRegisters. The lane's offset among them (t4 = %laneid % 4) is read anew at
  // each load by an asm the compilers neither merge nor hoist: kept in a register across the 16
  // n-tiles' logits, that one register still spills.
  [[maybe_unused]] auto scale_key_tile = [&](float (&acc)[kNt][4], int it, float base, int n) {
    uint32_t lane_id;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_id));
    const auto* staged = reinterpret_cast<const float2*>(smem_aligned + Layout::kScales +
                                                         (it % kStages) * Layout::kScaleBytes +
                                                         4 * static_cast<int>(lane_id % 4) * 2 * kNt);
    const float2 x = staged[n];
    const float m[2] = {x.x * base, x.y * base};
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] *= m[e % 2];
  };
  [[maybe_unused]] const float scale_log2 = p.scale * kLog2e * scales.k;
  // Rescaled Q rows (stage_q_as_half): their 2^-s, read per tile rather than held in registers.
  [[maybe_unused]] const auto* q_row_mul = reinterpret_cast<const float*>(smem_aligned + Layout::kQScales);

  float o[kDt][4];
  float row_m[2] = {kNegInf, kNegInf};  // running max of the base-2 logits
  float row_l[2] = {0.0f, 0.0f};        // this thread's part of Σ 2^{t − (m − shift)}
#pragma unroll
  for (int n = 0; n < kDt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  // O += P·V for one tile (V: B MN-major; k-step kk = keys 16·kk …, two key groups per step),
  // issued and committed, not awaited. The caller's wgmma::fence() must precede it.
  auto add_pv = [](float (&acc)[kDt][4], const uint32_t (&pv)[BN / 16][4], uint32_t sv) {
    const uint64_t v_desc = Mmas::v_desc(sv);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      Mmas::pv(acc, pv[kk], wgmma::sw128_desc_advance(v_desc, static_cast<uint32_t>(kk * 2) * kKvGroupBytes<D>));
    }
    wgmma::commit();
  };
  // Tile `it` landed (its `full` phase) and is visible to the async proxy; with K and V apart its K
  // tile alone, and wait_v its V tile (`v_full`).
  auto wait_tile = [&](int it) {
    tma::mbarrier_wait(full + it % kStages, static_cast<uint32_t>((it / kStages) & 1));
  };
  auto wait_v = [&](int it) {
    if constexpr (kKvApart) tma::mbarrier_wait(v_full + it % kStages, static_cast<uint32_t>((it / kStages) & 1));
  };
  // S = Q·K_itᵀ issued and committed, not awaited. Q of this warpgroup: rows 64·cwg …; k-step kk =
  // columns 16·kk … (slab kk / 4, 32 bytes per step).
  // The descriptors are formed once (Q's per warpgroup, K's per tile) and advanced per k-step.
  const uint64_t q_desc = wgmma::sw128_desc(s_q + static_cast<uint32_t>(cwg * 64 * 128), 16, 1024);
  auto issue_s = [&](float (&acc)[kNt][4], int it) {
#pragma unroll
    for (int n = 0; n < kNt; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;  // overwritten (k-step 0)
    wgmma::pin(acc);  // defined before the fence, not between it and the MMAs
    wgmma::fence();
    const uint64_t k_desc = wgmma::sw128_desc(s_k + stage_of(it), 16, kKvGroupBytes<D>);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t slab_q = static_cast<uint32_t>((kk / 4) * kRows * 128 + (kk % 4) * 32);
      const uint32_t slab_k = static_cast<uint32_t>((kk / 4) * 1024 + (kk % 4) * 32);  // slab kk / 4 of key 0
      Mmas::s(acc, wgmma::sw128_desc_advance(q_desc, slab_q), wgmma::sw128_desc_advance(k_desc, slab_k), kk > 0);
    }
    wgmma::commit();
  };
  // Logits (base 2), masks (only where some key of the tile is hidden from some row) and the online
  // softmax of tile `it` (rows g, g + 8; a quad of lanes shares a row): acc becomes P in float32.
  // With K and V apart its K tile (and a 1-byte cache's k scales) is then handed back (k_empty).
  auto softmax_tile = [&](float (&acc)[kNt][4], int it, float (&alpha)[2]) {
    const int kt = item.key_begin + it * BN;
    const bool full_tile = work.tile_full<BN>(p, it);
    if constexpr (kPerToken && !Plain) {  // key_mul: ones
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        scale_key_tile(acc, it, scales.k, n);
        prefill_logit_tile<Plain>(p, work, acc[n], key_mul[n], rows, kt, n, t4);
      }
    } else if constexpr (kPerToken || !Plain) {
      if constexpr (kPerToken) scale_keys(acc, it, 0, scale_log2);  // key_mul: ones
      prefill_logits<Plain>(p, work, acc, key_mul, rows, kt, t4);
    }  // else the plain logits' one multiplier goes into the softmax (below)
    if constexpr (kKvApart) tma::mbarrier_arrive(k_empty + it % kStages);
    if (!full_tile) prefill_mask<Plain>(p, work, acc, rows, kt, t4);
    if constexpr (Operands::kRescaledQ) {
      // Each row's dot products are 2^s times its logits' (stage_q_as_half): the row's multiplier is
      // key_mul's times 2^-s, exact — a power of two, the product normal for any realistic scale
      // (scale·log2e·k_scale within [2^-112, 2^14]).
      // (This thread's row, warp·16 + g, from a fresh thread index: one register fewer across the loop.)
      const int t = mma::tid_now() - kProducerThreads;
      const int row = (t / 32) * 16 + (t % 32) / 4;
      const float row_logit_mul[2] = {key_mul[0][0] * q_row_mul[row], key_mul[0][0] * q_row_mul[row + 8]};
      prefill_softmax_p<Scales>(acc, row_m, row_l, alpha, row_logit_mul);
    } else if constexpr (Plain && !kPerToken) {
      // The plain logits are the dot products times one multiplier (key_mul's): folded into the
      // softmax's exponent (prefill_softmax_p's logit_mul), the mask's −inf staying −inf.
      prefill_softmax_p<Scales>(acc, row_m, row_l, alpha, key_mul[0][0]);
    } else {
      prefill_softmax_p<Scales>(acc, row_m, row_l, alpha);
    }
  };
  // P of tile `it` times its keys' v scales, rounded to T: the A operand of its P·V.
  auto pack_tile = [&](float (&acc)[kNt][4], int it, uint32_t (&out)[BN / 16][4]) {
    if constexpr (kPerToken) {
      wait_v(it);  // its v scales ride with its V tile
      scale_keys(acc, it, 1, 1.0f);  // ΣP already taken; key_v: ones
    }
    prefill_pack_p<MmaT>(acc, key_v, out);
  };

  tma::mbarrier_wait(q_full, 0);
  if constexpr (Operands::kRescaledQ) {
    // Each consumer warpgroup rescales its own 64 rows (the producer has no registers for it, and the
    // consumers wait for the first K tile in any case), then meets its warpgroup at a named barrier
    // (3 + cwg; 1 and 2 are the turns).
    auto* row_mul = reinterpret_cast<float*>(smem_aligned + Layout::kQScales);
    stage_q_as_half<kRows, 128, 64 / 8>(smem_aligned, row_mul, ctid % 128, 64 * cwg);
    wgmma::fence_proxy_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cwg) : "memory");
  }
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
    pack_tile(s, 0, pa);
  }
  for (int it = 1; it < num_tiles; ++it) {
    wait_tile(it);
    wait_v(it - 1);
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
    tma::mbarrier_arrive(empty + (it - 1) % kStages);
    prefill_rescale(o, alpha);
    pack_tile(s, it, pa);
  }
  if (num_tiles > 0) {  // the last tile's P·V
    wait_v(num_tiles - 1);
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
    // scales.v: the per-tensor v scale (1 otherwise).
    prefill_store_row<T, Scales>(p, work, rows[i], warp * 16 + g + 8 * i, i, row_m[i], row_l[i], scales.v, o, t4);
  }
#else
  (void)p;  // no wgmma below sm_90a: never launched (launch_prefill_wgmma checks the device)
  (void)kv_map;
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace hybridtb::cuda
