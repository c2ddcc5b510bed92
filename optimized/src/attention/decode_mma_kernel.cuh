// The tensor-core decode path: decode query rows (query_len 1, decoder; and a short query's rows,
// kDecodeRowsMaxQueryLen), head size D in {64, 128, 256}, float16 / bfloat16 caches (kv_cache_dtype
// auto) or 1-byte caches (fp8 e4m3/e5m2, int8; per-tensor or per-token-head scales), GQA packed
// into the N side of mma.sync m16n8k16 (float32 accumulation).
//
// Orientation: the query heads of one kv head are few (1–16), the keys many, so the kernel computes
// the transposed products — Sᵀ = K·Qᵀ (M = 16 keys, N = 8·NT columns, K = D) and
// Oᵀ += Vᵀ·Pᵀ (M = 16 dims, N = columns, K = 16 keys). A column is one query head of one query row:
// an item of a short query packs num_tokens consecutive rows of its request (column j·qpk + h: row
// j, head h), each masked at its own position, so the keys are read once for all of them. K and Vᵀ
// are the A operands (ldmatrix / ldmatrix.trans from the cp.async ring), Qᵀ is a B fragment kept in
// registers for the whole CTA, Pᵀ goes from the Sᵀ accumulator to a B fragment with movmatrix.trans
// (no shared memory). Unused columns (qpk · rows < 8·NT) are zero queries, computed and never stored.
//
// One CTA = one DecodeItem (a request's key split) × one kv head × one pass of 8·NT query heads.
// Each of its W warps streams its own 16-key tiles (tile t of the CTA goes to warp t mod W) through
// its own S-stage cp.async ring (16-byte chunks, XOR swizzle; the block-table entry of a tile's 16
// keys is loaded one tile ahead, one lane per key, and broadcast by shuffle), so no CTA barrier
// sits in the key loop; all S stages are in flight while a warp waits. Per tile: Sᵀ (D/16 mma per
// 8 heads), logits in base 2 (scale·log2e in one multiply on the plain path; soft cap / ALiBi via
// attention_logit otherwise), online softmax per column (max over the tile by 3 shuffles,
// exp2), P rounded to the model dtype (the P·V operand, as vLLM's Triton kernel and FlashAttention
// do; P is scaled by 2^15 — exact, it cancels in Σp·v / Σp — so that float16 keeps small weights
// normal: CacheScales::kPShift), Oᵀ += Vᵀ·Pᵀ. The warps' states are merged in shared memory in warp
// order; then sinks (row_finalize), fp8 output and the store (store_output_vec, with the optional
// fused hybrid add) — or, for split rows, the partial state (natural-log max, denominator,
// numerators) for decode_combine_kernel. Sentinel items (request < 0) return at once.
//
// Masks: only tiles not entirely inside the range every row sees evaluate key_visible()
// (attention_common.cuh) per element, at the column's row position; masked scores are *selected*
// to −inf. The planner (attention_work_plan.cpp) sends here only rows whose mm_prefix ranges add no
// key, so a row sees its causal/window interval, and keys outside the item's range or outside the
// union of its rows' intervals (the window, at/after seq_len) are never read: cp.async zero-fills
// them (null-block safety). No atomics, fixed orders: bitwise reproducible. Checked by
// tests/cuda/cuda_decode_mma_test.cpp and, for packed short queries, cuda_prefill_test's CudaShortQueries.
//
// 1-byte caches (Cache = PerTensorBytes / PerTokenHeadBytes): a warp's ring holds the raw K/V bytes
// of its tiles (and their per-token-head scales, one lane per key and half), in 16-byte chunks
// swizzled for 16-byte shared loads (byte_chunk_offset), and the cast to the model dtype happens in
// registers on the way to the MMA fragments (byte_cache.cuh): no tile of T in shared memory, no
// extra pass over it. Both products run on float16 operands wherever that is exact and bounded
// (DecodeOperands: a float16 model, or a bfloat16 model's per-tensor caches), so the cast is the
// float16 one (word_to_half_pairs: the hardware's e4m3 pair conversion, a byte permute for e5m2, a
// permute and a subtraction for int8 — a third to a half of the cast to bfloat16's instructions);
// a bfloat16 model's query heads are then rescaled into float16's range first, each by a power of
// two its logits' multiplier undoes (the wgmma prefill's rule and bound: prefill_wgmma_kernel.cuh,
// WgmmaOperands). A bfloat16 model's per-token-head caches cast to bfloat16 (ByteCast::word). The
// casts pair a word's bytes 0/1 and 2/3 (float16) or 0/2 and 1/3 (ByteCast), so both MMAs read a
// permuted view, consistently on both sides:
//   Sᵀ = K·Qᵀ: lane (g, t) loads 16 bytes of key rows g and g + 8 at dims 64·j + 16·t + [0, 16);
//     word w of them is k-step 4·j + w, its two pairs the A registers of k columns 2t.. and
//     2t+8..; Qᵀ's B fragment holds the same dims (q_dim_of: a permutation of the head dimension,
//     which leaves every dot product's terms unchanged — only their order inside the MMA).
//   Oᵀ += Vᵀ·Pᵀ: lane (g, t) loads D/8 dims (v_dim_of: 16 of each 128 from 16·g, 8 from 8·g at D 64)
//     of keys 2t, 2t + 1, 2t + 8, 2t + 9; a byte permute puts the two keys of each dim in one pair
//     (the keys stay in order, so Pᵀ is unchanged) and each word gives two m-tiles; the accumulator
//     rows g and g + 8 of m-tile md are dims v_dim_of(md, g) and + 1, which the merge stores where
//     they belong.
// The stored kind (fp8 e4m3 / e5m2, int8) is picked once per CTA (with_byte_kind), so the key loop's
// casts are straight-line code. The scales act in float32 (byte_cache.cuh: per tensor on the logit
// scale and the numerators, per token-head on each key's logits and probabilities). The bytes read
// halve, and without the cast tiles a CTA needs half the shared memory, so more CTAs fit on an SM
// (DecodeMmaConfig).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "attention/attention_common.cuh"
#include "attention/attention_launch.h"
#include "attention/byte_cache.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/pdl.cuh"

namespace hybridtb::cuda {

constexpr int kDecodeMmaKeys = 16;          // keys per warp tile (M of Sᵀ, K of Oᵀ)

// Launch configuration by head size, cache kind and head columns / 8 (nt). 16-bit caches: 64/96/96 KB
// of shared memory per CTA (3/2/2 CTAs per SM), i.e. about 128–190 KB of K/V in flight per SM.
// 1-byte caches: a stage is half the bytes, and registers are budgeted for 4 CTAs per SM (D 128:
// 16 warps of 3 stages, 200 KB of shared memory per SM; 3 CTAs with 16 head columns, whose
// accumulators need more), so that more warps hide each tile's chain of loads, casts and MMAs.
struct DecodeMmaConfig {
  int warps;     // warps per CTA, each streaming its own 16-key tiles
  int stages;    // cp.async ring stages per warp
  int min_ctas;  // CTAs per SM that __launch_bounds__ budgets registers for (0: none, the compiler's choice)
};
__host__ __device__ constexpr DecodeMmaConfig decode_mma_config(int d, bool byte_cache, int nt) {
  if (byte_cache) return {d <= 128 ? 4 : 2, d <= 64 ? 4 : 3, d == 128 && nt == 2 ? 3 : 4};
  return {d <= 128 ? 4 : 2, d <= 64 ? 4 : 3, 0};
}
__host__ __device__ constexpr int decode_mma_merge_stride(int d) { return d + 4; }  // floats per column
// One ring stage: 16-bit caches the K and V tiles; 1-byte caches the K and V bytes of a tile, then the
// k and v scales of its keys.
__host__ __device__ constexpr int decode_mma_stage_bytes(int d, bool byte_cache) {
  return byte_cache ? 2 * kDecodeMmaKeys * (d + 4) : 2 * kDecodeMmaKeys * d * 2;
}
// The warps' rings, overlapped by the merge of the warps' states at the end.
__host__ __device__ constexpr int decode_mma_smem_bytes(int d, bool byte_cache) {
  const DecodeMmaConfig c = decode_mma_config(d, byte_cache, 1);  // warps and stages do not depend on nt
  const int ring = c.warps * c.stages * decode_mma_stage_bytes(d, byte_cache);
  const int merge = c.warps * 16 * (decode_mma_merge_stride(d) + 2) * 4;
  return ring > merge ? ring : merge;
}

// 1-byte caches: the offset of 16-byte chunk `chunk` of row `row` in a [16][D] byte tile. The XOR
// makes the kernel's 16-byte loads conflict-free (each group of 8 lanes reads 8 distinct bank groups):
// the K loads (rows g, g + 1 at chunks 4j + t) and the V loads (rows 2t or 2t + 1 at chunk g) at
// D ≥ 128; at D 64 (two rows per 128 bytes) the K loads, and the V loads 2-way.
template <int D>
__device__ __forceinline__ int byte_chunk_offset(int row, int chunk) {
  const int x = D >= 128 ? ((row & 6) ^ ((row & 1) << 2)) : (row & 2);
  return row * D + ((chunk ^ x) << 4);
}
// The head dim of element e (0, 1) of Qᵀ's B register h (0: k rows 2t..2t+1, 1: 2t+8..2t+9) at
// k-step kk for quad lane t: byte 2·h + e (the float16 cast's pairs) or h + 2·e (ByteCast's) of
// word kk % 4 of the K chunk 4·(kk / 4) + t.
template <bool kHalfPairs>
__device__ __forceinline__ int q_dim_of(int kk, int t, int h, int e) {
  return 64 * (kk / 4) + 16 * t + 4 * (kk % 4) + (kHalfPairs ? 2 * h + e : h + 2 * e);
}

// The operand type of the decode's two products (MmaT): T, except with a 1-byte cache where
// decode_float16_products (attention_caps.h) holds: float16, every stored value exact in it and its
// cast the cheapest; a bfloat16 model's query heads then rescaled into float16's range (kRescaledQ).
// P rounds to float16 (finer than bfloat16) in float16's range (CacheScales<MmaT, Cache>).
template <typename T, typename Cache>
struct DecodeOperands {
  static constexpr bool kHalfProducts =
      decode_float16_products(kIsByteCache<Cache>, kIsPerTokenHeadCache<Cache>, std::is_same_v<T, __half>);
  static constexpr bool kRescaledQ = kHalfProducts && !std::is_same_v<T, __half>;
  using MmaT = std::conditional_t<kHalfProducts, __half, T>;
};
// The head dim of accumulator row g (+1 for row g + 8) of Oᵀ m-tile md.
template <int D>
__device__ __forceinline__ int v_dim_of(int md, int g) {
  return D == 64 ? 8 * g + 2 * md : 128 * (md / 8) + 16 * g + 2 * (md % 8);
}

// T: model dtype; D: head size; NT: head columns / 8 (1 or 2); Plain: no soft cap and no ALiBi;
// Cache: the stored element, T (kv_cache_dtype auto), PerTensorBytes or PerTokenHeadBytes (a 1-byte
// cache, cast in registers; byte_cache.cuh).
// The body of one CTA: p.decode_items[item_index] for kv head `kv_head` and query heads
// [head_pass·8·NT, …) of its group (32·warps threads, decode_mma_smem_bytes of dynamic shared
// memory). Run by decode_mma_kernel below (the item, kv head and pass from blockIdx.x/y/z) and by
// the mixed kernel (mixed_kernel.cuh, from its CTA list), so both compute the same bits.
template <typename T, int D, int NT, bool Plain, typename Cache>
__device__ __forceinline__ void decode_mma_body(const AttentionParams& p, int block_shift, int item_index,
                                                int kv_head, int head_pass) {
  using namespace mma;
  constexpr bool kByteCache = kIsByteCache<Cache>;
  static_assert(kByteCache || std::is_same_v<Cache, T>, "the cache element is T or one byte");
  using Operands = DecodeOperands<T, Cache>;
  using MmaT = typename Operands::MmaT;
  using Scales = CacheScales<MmaT, Cache>;
  constexpr int W = decode_mma_config(D, kByteCache, NT).warps;
  constexpr int S = decode_mma_config(D, kByteCache, NT).stages;
  constexpr int BK = kDecodeMmaKeys;
  constexpr int kCols = 8 * NT;
  constexpr int kChunks = D / 8;                 // 16-byte chunks per key row
  constexpr int kTileBytes = BK * D * 2;         // one K (or V) tile
  constexpr int kStageBytes = 2 * kTileBytes;    // K tile, then V tile
  constexpr int kMd = D / 16;                    // k-steps of Sᵀ = m-tiles of Oᵀ
  constexpr int kLoads = BK * kChunks / 32;      // 16-byte copies per lane per tile (each of K, V)
  constexpr int kRowStep = 32 / kChunks;         // rows between a lane's copies
  constexpr int kMs = decode_mma_merge_stride(D);
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;
  constexpr int kByteChunks = D / 16;            // 16-byte chunks per key row of a 1-byte cache
  constexpr int kByteStage = decode_mma_stage_bytes(D, true);
  constexpr int kByteLoads = BK * kByteChunks / 32;
  constexpr int kByteRowStep = 32 / kByteChunks;
  static_assert(D % 64 == 0 && kChunks <= 32, "head size 64, 128 or 256");
  static_assert(NT == 1 || NT == 2, "8 or 16 head columns");

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  const DecodeItem item = p.decode_items[item_index];
  if (item.request < 0) return;  // sentinel item (uniform per CTA: before any barrier or copy)
  // Columns: query row j of the item, query head h of the pass → column j·heads + h (the planner
  // packs a short query's rows only where heads · num_tokens ≤ kCols, in one pass).
  const int head0 = kv_head * p.queries_per_kv + head_pass * kCols;
  const int heads = min(kCols, p.queries_per_kv - head_pass * kCols);
  const int nh = heads * item.num_tokens;  // columns in use
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int request = item.request;
  const int seq_len = p.seq_lens[request];
  const DecodeRowPosition row_position = decode_row_position(p, request, item.token, seq_len);
  const int pos = row_position.pos;  // the first row's; lambdas below capture it (no structured binding in C++17)
  const int context_len = row_position.context_len;
  const uint32_t s_ring = s_base + static_cast<uint32_t>(warp * S * (kByteCache ? kByteStage : kStageBytes));

  // --- Qᵀ as B fragments: column n = head head0 + n (zeros past nh), k = dims ---------------------
  // kRescaledQ: column g's power of two 2^s (float16_range_shift) applied, and q_mul[nt] = 2^-s.
  uint32_t qf[NT][kMd][2];
  [[maybe_unused]] float q_mul[NT];
  {
    const auto* q = static_cast<const uint16_t*>(p.query);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = nt * 8 + g;
      const bool ok = col < nh;
      const int64_t row = static_cast<int64_t>(item.token + (ok ? col / heads : 0)) * p.q_stride_token +
                          static_cast<int64_t>(head0 + (ok ? col % heads : 0)) * p.q_stride_head;
#pragma unroll
      for (int kk = 0; kk < kMd; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // 1-byte caches: the head dims of the K fragments' permuted view (q_dim_of).
          const int64_t e0 =
              row + (kByteCache ? q_dim_of<Operands::kHalfProducts>(kk, t4, h, 0) : kk * 16 + 2 * t4 + 8 * h);
          const int64_t e1 =
              row + (kByteCache ? q_dim_of<Operands::kHalfProducts>(kk, t4, h, 1) : kk * 16 + 2 * t4 + 8 * h + 1);
          const uint32_t lo = ok ? q[e0] : 0u;
          const uint32_t hi = ok ? q[e1] : 0u;
          qf[nt][kk][h] = lo | (hi << 16);
        }
      }
      if constexpr (Operands::kRescaledQ) {
        // max|q| of column g over its four quad lanes, as bfloat16 bits (magnitudes order as values).
        uint32_t pair_max = 0;
#pragma unroll
        for (int kk = 0; kk < kMd; ++kk) {
          pair_max = __vmaxu2(pair_max, qf[nt][kk][0] & 0x7FFF7FFFu);
          pair_max = __vmaxu2(pair_max, qf[nt][kk][1] & 0x7FFF7FFFu);
        }
        uint32_t max_bits = max(pair_max & 0xFFFFu, pair_max >> 16);
        max_bits = max(max_bits, __shfl_xor_sync(0xffffffffu, max_bits, 1));
        max_bits = max(max_bits, __shfl_xor_sync(0xffffffffu, max_bits, 2));
        const int shift = float16_range_shift(max_bits);
        q_mul[nt] = __uint_as_float(static_cast<uint32_t>(127 - shift) << 23);
#pragma unroll
        for (int kk = 0; kk < kMd; ++kk) {
#pragma unroll
          for (int h = 0; h < 2; ++h) qf[nt][kk][h] = bfloat16_pair_to_half(qf[nt][kk][h], shift);
        }
      }
    }
  }
  // Heads and positions of this thread's accumulator columns (padding columns use head0 and the
  // first row's: valid for the ALiBi slope and the masks).
  int col_head[NT][2];
  int col_pos[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = nt * 8 + 2 * t4 + j;
      col_head[nt][j] = head0 + (col < nh ? col % heads : 0);
      col_pos[nt][j] = pos + (col < nh ? col / heads : 0);
    }
  }

  // --- tiles: CTA tile t covers keys tile0 + 16·t + [0, 16); warp w takes t = w, w + W, ... ------
  const int tile0 = item.key_begin & ~(BK - 1);
  const int num_tiles = item.key_end > tile0 ? (item.key_end - tile0 + BK - 1) / BK : 0;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + W - 1) / W : 0;
  auto tile_key = [&](int i) { return tile0 + (i * W + warp) * BK; };
  // Every key of [lo, hi) is visible to every row: in the item's keys, at or before the first row's
  // position and inside the last row's window.
  const int pos_last = pos + item.num_tokens - 1;
  const int window_first = p.sliding_window > 0 ? pos_last - p.sliding_window + 1 : 0;
  const int lo = max(max(item.key_begin, item.causal_begin), window_first);
  const int hi = min(min(item.key_end, item.causal_end), pos + 1);

  // The row of key tile_key(i) + (lane & 15): its block-table entry and slot, block −1 if that key
  // is not read. The entry is loaded here and first used by row_offset, a tile's work later (the
  // refill's row is found before the wait for the tile it follows and addressed after that tile's
  // products), so its latency hides behind them.
  struct KeyRow {
    int32_t block;
    int slot;
  };
  const int64_t table_row = static_cast<int64_t>(request) * p.block_table_stride;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * p.cache_stride_head;
  auto key_row = [&](int i) -> KeyRow {
    if (i >= my_tiles) return {-1, 0};
    const int k = tile_key(i) + (lane & (BK - 1));
    // key_needed without its mm_prefix ranges, which add no key to the rows this kernel takes.
    if (k < item.key_begin || k >= item.key_end || k < item.causal_begin || k >= item.causal_end) {
      return {-1, 0};
    }
    const int blk = block_shift >= 0 ? (k >> block_shift) : k / p.block_size;
    return {__ldg(p.block_table + table_row + blk), k - blk * p.block_size};
  };
  // Element offset of the K row of `row`, or −1 if its key is not read; with `scale_at` its index in
  // the per-token-head scale caches.
  auto row_offset = [&](KeyRow row, int64_t& scale_at) -> int64_t {
    scale_at = 0;
    if (row.block < 0) return -1;
    const int64_t block = row.block;
    scale_at = (block * p.block_size + row.slot) * p.num_kv_heads + kv_head;
    return block * p.cache_stride_block + static_cast<int64_t>(row.slot) * p.cache_stride_slot + head_offset;
  };
  const T* cache = static_cast<const T*>(p.kv_cache);
  const auto* cache_bytes = static_cast<const uint8_t*>(p.kv_cache);
  const Scales scales(p);
  // Tile i into stage i % S (always commits a group, possibly empty, so the counts stay uniform).
  auto issue = [&](int i, int64_t off, int64_t scale_at) {
    if (kByteCache && i < my_tiles) {
      const int lo_word = static_cast<int>(static_cast<uint64_t>(off) & 0xffffffffu);
      const int hi_word = static_cast<int>(static_cast<uint64_t>(off) >> 32);
      const uint32_t st = s_ring + static_cast<uint32_t>((i % S) * kByteStage);
#pragma unroll
      for (int c = 0; c < kByteLoads; ++c) {
        const int r = lane / kByteChunks + c * kByteRowStep;
        const int ch = lane % kByteChunks;
        const uint32_t rl = static_cast<uint32_t>(__shfl_sync(0xffffffffu, lo_word, r));
        const uint32_t rh = static_cast<uint32_t>(__shfl_sync(0xffffffffu, hi_word, r));
        const auto ro = static_cast<int64_t>((static_cast<uint64_t>(rh) << 32) | rl);
        const bool ok = ro >= 0;
        const uint8_t* src = cache_bytes + (ok ? ro : 0) + ch * 16;
        const auto so = static_cast<uint32_t>(byte_chunk_offset<D>(r, ch));
        cp_async_16(st + so, src, ok);
        cp_async_16(st + BK * D + so, src + (ok ? p.cache_stride_half : 0), ok);
      }
      if (Scales::kPerToken) {  // lanes 0–15: k scales of keys 0–15; lanes 16–31: their v scales
        const bool ok = off >= 0;
        const float* cache = lane < BK ? p.k_scale_cache : p.v_scale_cache;
        cp_async_4(st + 2 * BK * D + 4 * lane, cache + (ok ? scale_at : 0), ok);
      }
    } else if (!kByteCache && i < my_tiles) {
      const int lo_word = static_cast<int>(static_cast<uint64_t>(off) & 0xffffffffu);
      const int hi_word = static_cast<int>(static_cast<uint64_t>(off) >> 32);
      const uint32_t sk = s_ring + static_cast<uint32_t>((i % S) * kStageBytes);
#pragma unroll
      for (int c = 0; c < kLoads; ++c) {
        const int r = lane / kChunks + c * kRowStep;
        const int ch = lane % kChunks;
        const uint32_t rl = static_cast<uint32_t>(__shfl_sync(0xffffffffu, lo_word, r));
        const uint32_t rh = static_cast<uint32_t>(__shfl_sync(0xffffffffu, hi_word, r));
        const auto ro = static_cast<int64_t>((static_cast<uint64_t>(rh) << 32) | rl);
        const bool ok = ro >= 0;
        const T* src = cache + (ok ? ro : 0) + ch * 8;
        const uint32_t so = swizzle<D>(r, ch);
        cp_async_16(sk + so, src, ok);
        cp_async_16(sk + kTileBytes + so, src + (ok ? p.cache_stride_half : 0), ok);
      }
    }
    cp_async_commit();
  };

  float o[kMd][NT][4];
#pragma unroll
  for (int md = 0; md < kMd; ++md) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[md][nt][0] = o[md][nt][1] = o[md][nt][2] = o[md][nt][3] = 0.0f;
  }
  float col_m[NT][2];  // running max of the base-2 logits (uniform over the g lanes)
  float col_l[NT][2];  // this thread's part of Σ 2^{t − (m − shift)}
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    col_m[nt][0] = col_m[nt][1] = kNegInf;
    col_l[nt][0] = col_l[nt][1] = 0.0f;
  }
  const float scale_log2 = p.scale * kLog2e * scales.k;
  // Each accumulator column's multiplier of its dot products: the per-tensor k scale, and with
  // rescaled query heads the column's 2^-s (held by the lanes of g = the column: a shuffle).
  float col_k[NT][2];     // featured logits: before attention_logit
  float col_log2[NT][2];  // plain logits: the logit scale in base 2 as well
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mul = 1.0f;
      if constexpr (Operands::kRescaledQ) mul = __shfl_sync(0xffffffffu, q_mul[nt], 4 * (2 * t4 + j));
      col_k[nt][j] = scales.k * mul;
      col_log2[nt][j] = scale_log2 * mul;
    }
  }

#pragma unroll
  for (int i = 0; i < S; ++i) {
    int64_t scale_at;
    const int64_t off = row_offset(key_row(i), scale_at);
    issue(i, off, scale_at);
  }

  // The key loop; 1-byte caches: for the stored kind picked once per CTA (with_byte_kind), so the
  // casts inside are straight-line code with immediate constants.
  auto key_loop = [&](auto kind) {
    constexpr ByteKind Kind = decltype(kind)::value;
    using Cast = ByteCast<MmaT, Kind>;  // 1-byte caches cast to bfloat16
    for (int i = 0; i < my_tiles; ++i) {
      const KeyRow next_row = key_row(i + S);  // block table of the refill, before the wait
      cp_async_wait<S - 1>();
      __syncwarp();  // every lane's copies of tile i are visible to the warp
      // 16-bit caches: the stage's K and V tiles; 1-byte caches: its K bytes, V bytes and scales.
      [[maybe_unused]] const uint32_t sk = s_ring + static_cast<uint32_t>((i % S) * kStageBytes);
      [[maybe_unused]] const unsigned char* staged = smem + (s_ring - s_base) + (i % S) * kByteStage;
      const int kt = tile_key(i);

      // --- Sᵀ = K·Qᵀ ----------------------------------------------------------------------------
      float s[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      if constexpr (kByteCache) {
        // Lane (g, t): 16 bytes of key rows g and g + 8 per 64 dims; word w = k-step 4·j + w.
#pragma unroll
        for (int j = 0; j < D / 64; ++j) {
          const uint4 r0 = *reinterpret_cast<const uint4*>(staged + byte_chunk_offset<D>(g, 4 * j + t4));
          const uint4 r1 = *reinterpret_cast<const uint4*>(staged + byte_chunk_offset<D>(g + 8, 4 * j + t4));
          const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w};
          const uint32_t w1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            uint32_t a[4];
            // row g: k columns 2t.. and 2t+8.. (float16: bytes 0, 1 and 2, 3; ByteCast: 0, 2 and 1, 3)
            if constexpr (Operands::kHalfProducts) {
              word_to_half_pairs<Kind>(w0[w], a[0], a[2]);
              word_to_half_pairs<Kind>(w1[w], a[1], a[3]);  // row g + 8
            } else {
              Cast::word(w0[w], a[0], a[2]);
              Cast::word(w1[w], a[1], a[3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) Mma<MmaT>::run(s[nt], a, qf[nt][4 * j + w][0], qf[nt][4 * j + w][1]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kMd; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, sk + swizzle<D>(lane % 16, 2 * kk + lane / 16));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) Mma<MmaT>::run(s[nt], a, qf[nt][kk][0], qf[nt][kk][1]);
        }
      }

      // --- logits (base 2) and masks: element e is key kt + g + 8·(e / 2), column 2·t4 + e % 2 -----
      const bool full = kt >= lo && kt + BK <= hi;
      // Per-token-head caches: the k and v scales of this thread's keys g and g + 8 (the stage's).
      float key_k[2] = {1.0f, 1.0f};
      float key_v[2] = {1.0f, 1.0f};
      if constexpr (Scales::kPerToken) {
        const auto* key_scales = reinterpret_cast<const float*>(staged + 2 * BK * D);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          key_k[r] = key_scales[g + 8 * r];
          key_v[r] = key_scales[BK + g + 8 * r];
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (Plain) {
            s[nt][e] *= col_log2[nt][e % 2] * key_k[e / 2];
          } else {
            s[nt][e] = attention_logit(p, s[nt][e] * (col_k[nt][e % 2] * key_k[e / 2]), col_head[nt][e % 2],
                                       col_pos[nt][e % 2], kt + g + 8 * (e / 2), context_len) *
                       kLog2e;
          }
        }
      }
      if (!full) {  // (uniform over the warp)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = kt + g + 8 * (e / 2);
            // Select, never multiply: a masked score is −inf whatever the key held.
            if (!(k >= item.key_begin && k < item.key_end && key_visible(p, request, seq_len, col_pos[nt][e % 2], k))) {
              s[nt][e] = kNegInf;
            }
          }
        }
      }

      // --- online softmax per column; Pᵀ fragments ----------------------------------------------------
      uint32_t pb[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float m_ref[2];
        float alpha[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float mx = fmaxf(s[nt][j], s[nt][j + 2]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
          const float m_new = fmaxf(col_m[nt][j], mx);
          m_ref[j] = m_new == kNegInf ? 0.0f : m_new - Scales::kPShift;
          alpha[j] = col_m[nt][j] == kNegInf ? 0.0f : exp2_approx(col_m[nt][j] - m_new);
          col_m[nt][j] = m_new;
        }
        float pr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[e] = exp2_approx(s[nt][e] - m_ref[e % 2]);
#pragma unroll
        for (int j = 0; j < 2; ++j) col_l[nt][j] = col_l[nt][j] * alpha[j] + (pr[j] + pr[j + 2]);
        // (key g, columns 2t4..2t4+1) → transposed: (keys 2t4..2t4+1, column g) = B fragment of Pᵀ;
        // with per-token-head v scales, p·v_scale of its key (Σp above stays unscaled).
        pb[nt][0] = movmatrix_trans(Mma<MmaT>::pack(pr[0] * key_v[0], pr[1] * key_v[0]));
        pb[nt][1] = movmatrix_trans(Mma<MmaT>::pack(pr[2] * key_v[1], pr[3] * key_v[1]));
#pragma unroll
        for (int md = 0; md < kMd; ++md) {
          o[md][nt][0] *= alpha[0];
          o[md][nt][1] *= alpha[1];
          o[md][nt][2] *= alpha[0];
          o[md][nt][3] *= alpha[1];
        }
      }

      // --- Oᵀ += Vᵀ·Pᵀ ------------------------------------------------------------------------------
      if constexpr (kByteCache) {
        // Lane (g, t): the D/8 dims of v_dim_of (one 8- or 16-byte piece per 128 dims) of keys 2t,
        // 2t + 1, 2t + 8, 2t + 9; word w of them gives m-tiles 2w (its dims 0, 1) and 2w + 1 (dims 2, 3).
        const unsigned char* vt = staged + BK * D;
        constexpr int kVWords = D / 32;
        uint32_t vw[4][kVWords];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int key = 2 * t4 + (r & 1) + 8 * (r >> 1);
          if constexpr (D == 64) {
            const uint2 x = *reinterpret_cast<const uint2*>(vt + byte_chunk_offset<D>(key, g >> 1) + 8 * (g & 1));
            vw[r][0] = x.x;
            vw[r][1] = x.y;
          } else {
#pragma unroll
            for (int c = 0; c < D / 128; ++c) {
              const uint4 x = *reinterpret_cast<const uint4*>(vt + byte_chunk_offset<D>(key, g + 8 * c));
              vw[r][4 * c] = x.x;
              vw[r][4 * c + 1] = x.y;
              vw[r][4 * c + 2] = x.z;
              vw[r][4 * c + 3] = x.w;
            }
          }
        }
#pragma unroll
        for (int w = 0; w < kVWords; ++w) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // Bytes 2h, 2h + 1 of keys (2t, 2t + 1) → one word whose cast pairs the keys of each dim:
            // (2t, dim 2h), (2t + 1, dim 2h), then dim 2h + 1 for float16's pairs (0/1, 2/3);
            // (2t, 2h), (2t, 2h + 1), (2t + 1, 2h), (2t + 1, 2h + 1) for ByteCast's (0/2, 1/3).
            uint32_t a[4];
            if constexpr (Operands::kHalfProducts) {
              const uint32_t sel = h == 0 ? 0x5140u : 0x7362u;
              word_to_half_pairs<Kind>(__byte_perm(vw[0][w], vw[1][w], sel), a[0], a[1]);  // dims 2h, 2h + 1
              word_to_half_pairs<Kind>(__byte_perm(vw[2][w], vw[3][w], sel), a[2], a[3]);  // keys 2t+8..
            } else {
              const uint32_t sel = h == 0 ? 0x5410u : 0x7632u;
              Cast::word(__byte_perm(vw[0][w], vw[1][w], sel), a[0], a[1]);
              Cast::word(__byte_perm(vw[2][w], vw[3][w], sel), a[2], a[3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) Mma<MmaT>::run(o[2 * w + h][nt], a, pb[nt][0], pb[nt][1]);
          }
        }
      } else {
        const uint32_t sv = sk + kTileBytes;
#pragma unroll
        for (int md = 0; md < kMd; ++md) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, sv + swizzle<D>((lane / 16) * 8 + lane % 8, 2 * md + (lane / 8) % 2));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) Mma<MmaT>::run(o[md][nt], a, pb[nt][0], pb[nt][1]);
        }
      }
      __syncwarp();  // every lane is done reading stage i % S before it is refilled
      int64_t next_scale_at;
      const int64_t next_off = row_offset(next_row, next_scale_at);
      issue(i + S, next_off, next_scale_at);
    }
  };
  if constexpr (kByteCache) {
    with_byte_kind<Cache>(p.kv_kind, key_loop);
  } else {
    key_loop(std::integral_constant<ByteKind, ByteKind::kFp8E4M3>{});  // (no cast for a 16-bit cache)
  }
  cp_async_wait<0>();  // only empty groups can be pending; none may be in flight at the merge
  if (kByteCache && !Scales::kPerToken) {  // the per-tensor v scale, on the numerators (split or not)
#pragma unroll
    for (int md = 0; md < kMd; ++md) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[md][nt][e] *= scales.v;
      }
    }
  }

  // --- per-warp state → shared memory; merge the warps in order --------------------------------------
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float l = col_l[nt][j];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      col_l[nt][j] = l;
    }
  }
  __syncthreads();  // every warp is done with its ring (the merge area overlaps it)
  auto* sm_acc = reinterpret_cast<float*>(smem);                 // [W][16][kMs]
  float* sm_m = sm_acc + W * 16 * kMs;                            // [W][16]
  float* sm_l = sm_m + W * 16;                                    // [W][16]
#pragma unroll
  for (int md = 0; md < kMd; ++md) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t4 + e % 2;
        const int dim = kByteCache ? v_dim_of<D>(md, g) + e / 2 : md * 16 + g + 8 * (e / 2);
        sm_acc[(warp * 16 + col) * kMs + dim] = o[md][nt][e];
      }
    }
  }
  if (g == 0) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = nt * 8 + 2 * t4 + j;
        sm_m[warp * 16 + col] = col_m[nt][j];
        sm_l[warp * 16 + col] = col_l[nt][j];
      }
    }
  }
  __syncthreads();
  // (heads again, from the pass: cheaper than a register held across the key loop)
  const int merge_heads = min(kCols, p.queries_per_kv - head_pass * kCols);
  for (int idx = tid; idx < merge_heads * item.num_tokens * D; idx += 32 * W) {
    const int col = idx / D;
    const int c = idx % D;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sm_m[w * 16 + col]);
    float l = 0.0f;
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float mw = sm_m[w * 16 + col];
      const float f = mw == kNegInf ? 0.0f : exp2_approx(mw - mx);
      l += sm_l[w * 16 + col] * f;
      acc += sm_acc[(w * 16 + col) * kMs + c] * f;
    }
    // l and acc are relative to 2^{mx − shift}: natural-log reference point for row_finalize.
    const float m_nat = mx == kNegInf ? kNegInf : (mx - Scales::kPShift) * kLn2;
    const int row = col / merge_heads;  // of the item's query rows
    const int head = head0 + col % merge_heads;
    if (item.num_splits == 1) {
      const RowScale f = row_finalize(p, head, m_nat, l);
      const float out = f.zero != 0.0f ? 0.0f : acc * f.acc_factor;
      store_output_vec<T, 1>(p,
                             static_cast<int64_t>(item.token + row) * p.o_stride_token +
                                 static_cast<int64_t>(head) * p.o_stride_head + c,
                             {out});
    } else {
      const int64_t slot = static_cast<int64_t>(item.partial_slot + row * item.num_splits) * p.num_heads + head;
      p.partial_acc[slot * D + c] = acc;
      if (c == 0) {
        p.partial_ml[slot * 2] = m_nat;
        p.partial_ml[slot * 2 + 1] = l;
      }
    }
  }
}

// One CTA per decode item (x) × kv head (y) × head pass (z).
template <typename T, int D, int NT, bool Plain, typename Cache>
__global__ void __launch_bounds__(32 * decode_mma_config(D, kIsByteCache<Cache>, NT).warps,
                                  decode_mma_config(D, kIsByteCache<Cache>, NT).min_ctas)
    decode_mma_kernel(const __grid_constant__ AttentionParams p, int block_shift) {
  pdl_allow_dependents();  // the combine kernel may launch once every CTA is resident (it waits for us)
  decode_mma_body<T, D, NT, Plain, Cache>(p, block_shift, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                                          static_cast<int>(blockIdx.z));
}

// --- launches (attention_inst_decode_mma_<kind>.cu) ----------------------------------------------

template <typename T, int D, int NT, bool Plain, typename Cache>
void launch_decode_mma_instance(const AttentionParams& params, int64_t num_items, int block_shift,
                                cudaStream_t stream) {
  constexpr int kSmem = decode_mma_smem_bytes(D, kIsByteCache<Cache>);
  constexpr int kThreads = 32 * decode_mma_config(D, kIsByteCache<Cache>, NT).warps;
  allow_dynamic_smem(decode_mma_kernel<T, D, NT, Plain, Cache>, kSmem);
  const int passes = (params.queries_per_kv + 8 * NT - 1) / (8 * NT);
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>(passes));
  decode_mma_kernel<T, D, NT, Plain, Cache><<<grid, kThreads, kSmem, stream>>>(params, block_shift);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename T, int D, int NT, typename Cache>
void launch_decode_mma_plain(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  const bool plain = params.soft_cap <= 0.0f && params.alibi_slopes == nullptr;
  if (plain) return launch_decode_mma_instance<T, D, NT, true, Cache>(params, num_items, block_shift, stream);
  return launch_decode_mma_instance<T, D, NT, false, Cache>(params, num_items, block_shift, stream);
}

// NT (columns / 8) of the instances: 8 columns per CTA, or 16 (queries_per_kv > 8, or packed short
// queries; D ≤ 128), as the plan chose (AttentionPlan::mma_columns → params.decode_mma_columns).
constexpr int kDecodeMma8Columns = 1;
constexpr int kDecodeMma16Columns = 2;

template <typename T, int D, typename Cache>
void launch_decode_mma_d(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  if (params.decode_mma_columns == 8) {
    return launch_decode_mma_plain<T, D, kDecodeMma8Columns, Cache>(params, num_items, block_shift, stream);
  }
  if constexpr (D <= 128) {
    return launch_decode_mma_plain<T, D, kDecodeMma16Columns, Cache>(params, num_items, block_shift, stream);
  }
  throw Error(detail::concat("decode mma: no 16-column instance for head size ", D));
}

// Cache: T (kv_cache_dtype auto), PerTensorBytes or PerTokenHeadBytes (a 1-byte cache).
template <typename T, typename Cache>
void launch_decode_mma_typed(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  if constexpr (kIsByteCache<Cache>) {
    if (!byte_kind_supported<Cache>(params.kv_kind)) {
      throw Error(detail::concat("decode mma: stored element kind ", static_cast<int>(params.kv_kind),
                                 " is not one of this scale mode's"));
    }
  }
  switch (params.head_size) {
    case 64:
      return launch_decode_mma_d<T, 64, Cache>(params, num_items, block_shift, stream);
    case 128:
      return launch_decode_mma_d<T, 128, Cache>(params, num_items, block_shift, stream);
    case 256:
      return launch_decode_mma_d<T, 256, Cache>(params, num_items, block_shift, stream);
    default:
      throw Error(detail::concat("decode mma: no instance for head size ", params.head_size));
  }
}

}  // namespace hybridtb::cuda
