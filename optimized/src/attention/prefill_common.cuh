// The per-element code of the tensor-core prefill kernels (prefill_mma_kernel.cuh on mma.sync,
// prefill_wgmma_kernel.cuh on wgmma), one copy for both: the item's rows and positions, Q and K/V
// row addressing (block table or encoder K/V) for the shared-memory loaders, the full-tile test
// and the per-element masks, the logits, one tile's online-softmax step and the epilogue of a row.
//
// Every function works on the register layout both kernels share: the mma.sync m16n8 C fragment
// (a wgmma m64nN accumulator is that fragment tiled along N, common/wgmma.cuh). Per m-tile of 16
// rows, thread (g = lane / 4, t4 = lane % 4) holds rows g and g + 8 (i = 0, 1) and, of S n-tile n
// (8 keys), keys 8n + 2·t4 + {0, 1}: element e of s[n] is row e / 2, key 8n + 2·t4 + e % 2. A quad
// of lanes shares a row, so row reductions are two xor shuffles, always in the same order.
#pragma once

#include <cstdint>

#include "attention/attention_common.cuh"
#include "common/mma.cuh"

namespace hybridtb::cuda {

// Where key j of a tile (j = 8n + 2t + e: S n-tile n, quad lane t, element e) puts its per-token-head
// scale among the tile's BN in shared memory: lane t's 2·BN/8 scales contiguous, in (n, e) order, so
// that each thread takes its keys' scales with a few 16-byte loads.
__host__ __device__ constexpr int prefill_scale_slot(int j, int bn) {
  return ((j % 8) / 2) * (bn / 4) + 2 * (j / 8) + j % 2;
}

// One query row of an item: (token, head) row r of the GQA packing, token token_begin +
// r / num_heads, head head_begin + r % num_heads. Padding rows (r ≥ num_rows) are not valid: their
// position is −1 (no key visible) and their head the item's first (a harmless ALiBi slope).
struct PrefillRow {
  bool valid;
  int pos;
  int head;
};

// One prefill item (an entry of p.prefill_items) with what the kernels derive from it once.
struct PrefillItem {
  GenericItem item;
  int request;
  int seq_len;
  int query_start;  // the request's first token in the batch
  int context_len;  // keys before the request's first query token
  int kv_head;
  int num_rows;  // (token, head) rows: num_tokens · num_heads
  int pos_lo;    // positions of the item's first and last token
  int pos_hi;

  __device__ __forceinline__ PrefillItem(const AttentionParams& p, const GenericItem& work) : item(work) {
    request = item.request;
    seq_len = p.seq_lens[request];
    query_start = p.query_start_loc[request];
    const int query_len = p.query_start_loc[request + 1] - query_start;
    context_len = seq_len - query_len;
    kv_head = item.head_begin / p.queries_per_kv;
    num_rows = item.num_tokens * item.num_heads;
    pos_lo = context_len + item.token_begin;
    pos_hi = pos_lo + item.num_tokens - 1;
  }

  // Row r = base + 8·i (the rows g and g + 8 of an m-tile whose row g is base), into out.
  __device__ __forceinline__ void row(int base, int i, PrefillRow& out) const {
    const int r = base + 8 * i;
    out.valid = r < num_rows;
    out.pos = out.valid ? pos_lo + r / item.num_heads : -1;
    out.head = out.valid ? item.head_begin + r % item.num_heads : item.head_begin;
  }

  // Whether key k = kt + j is read at all: inside the item's key range and visible to some row of
  // it (key_needed). Keys not read are zero-filled without touching global memory.
  __device__ __forceinline__ bool key_read(const AttentionParams& p, int kt, int j) const {
    const int k = kt + j;
    return k < item.key_end &&
           key_needed(p, request, seq_len, pos_lo, pos_hi, item.causal_begin, item.causal_end, k);
  }

  // Whether every key of [kt, kt + n) is read (key_read): inside the item's key range and the causal
  // range every row sees. Most tiles of a long prefill are; their loads skip the per-key test.
  __device__ __forceinline__ bool keys_all_read(int kt, int n) const {
    return kt >= 0 && kt >= item.causal_begin && kt + n <= item.causal_end && kt + n <= item.key_end &&
           kt + n <= seq_len;
  }

  // Whether every key of tile `tile` of BN keys (keys kt = key_begin + tile·BN …) is visible to
  // every row of the item, so that the tile needs no mask (mm ranges only add visibility, so the
  // causal/window test decides).
  template <int BN>
  __device__ __forceinline__ bool tile_full(const AttentionParams& p, int tile) const {
    const int kt = item.key_begin + tile * BN;
    const int w = p.sliding_window;
    bool full = kt + BN <= item.key_end && kt + BN <= seq_len;
    if (p.encoder) {
      full = full && (w == 0 || (kt >= pos_hi - w + 1 && kt + BN - 1 <= pos_lo + w - 1));
    } else {
      full = full && kt + BN - 1 <= pos_lo && (w == 0 || kt >= pos_hi - w + 1);
    }
    return full;
  }
};

// Stages the item's Q rows [kRows][D] (T elements) in shared memory as one cp.async group: 16-byte
// chunk c of row r at s_q + swz(r, c) (the kernel's swizzle); padding rows are zero-filled.
template <typename T, int D, int kRows, int kThreads, typename Swizzle>
__device__ __forceinline__ void load_prefill_q(const AttentionParams& p, const PrefillItem& it, uint32_t s_q, int tid,
                                               Swizzle swz) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const T* q = static_cast<const T*>(p.query);
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const bool ok = r < it.num_rows;
    const int64_t token = it.query_start + it.item.token_begin + (ok ? r / it.item.num_heads : 0);
    const int64_t head = it.item.head_begin + (ok ? r % it.item.num_heads : 0);
    mma::cp_async_16(s_q + swz(r, c), q + token * p.q_stride_token + head * p.q_stride_head + c * 8, ok);
  }
  mma::cp_async_commit();
}

// Cache rows k0, k0 + step, … of one request and kv head (K half; + cache_stride_half for V),
// addressed without a division per row: the block and slot of k0 from one division by the block
// size, each next row's stepped from the last.
struct PagedRowWalk {
  const int32_t* table;  // the request's block table row
  int64_t head_offset;   // the kv head's offset within a slot
  int block_size;
  int block;  // logical block and slot of the current row
  int slot;

  __device__ __forceinline__ PagedRowWalk(const AttentionParams& p, const PrefillItem& it, int k0)
      : table(p.block_table + static_cast<int64_t>(it.request) * p.block_table_stride),
        head_offset(static_cast<int64_t>(it.kv_head) * p.cache_stride_head),
        block_size(p.block_size),
        block(k0 / p.block_size),
        slot(k0 - block * p.block_size) {}

  // Element (or byte) offset of the current row in the cache: cache_row_offset(…, k, 0, kv_head).
  __device__ __forceinline__ int64_t offset(const AttentionParams& p) const {
    return table[block] * p.cache_stride_block + slot * p.cache_stride_slot + head_offset;
  }
  __device__ __forceinline__ void advance(int step) {
    slot += step;
    while (slot >= block_size) {
      slot -= block_size;
      ++block;
    }
  }
  // A step the caller takes many times, split once into whole blocks and slots: each advance is
  // then two additions and one carry, not a loop over the blocks it crosses.
  struct Step {
    int blocks;
    int slots;
  };
  __device__ __forceinline__ static Step step_of(int step, int block_size) {
    return {step / block_size, step % block_size};
  }
  __device__ __forceinline__ void advance(Step step) {
    block += step.blocks;
    slot += step.slots;
    if (slot >= block_size) {
      slot -= block_size;
      ++block;
    }
  }
};

// The K/V tile loader of a cache of the model dtype T (or the encoder's K/V): load() issues the
// cp.async copies of the K and V rows of keys [kt, kt + BN) into ring stage `stage` (kStageBytes
// apart), chunk c of key j at s_k / s_v + stage·kStageBytes + swz(j, c). Cache rows are addressed
// through the block table; keys not read are zero-filled. kThreads threads take part: thread tid
// copies chunk tid % kChunks of rows tid / kChunks + kRowsPerPass·i.
//
// A tile whose keys are all read (keys_all_read: most tiles of a long prefill) takes the fast path:
// no per-key visibility test, and one division by the block size per thread and tile, the block
// and slot of the following rows stepped from it. Other tiles test every key (key_read).
template <typename T, int D, int BN, int kThreads, int kStageBytes>
struct PrefillKvLoader {
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kPasses = BN / kRowsPerPass;
  static_assert(kThreads % kChunks == 0 && BN % kRowsPerPass == 0, "loader: whole rows per pass");
  const T* kbase;
  const T* vbase;

  __device__ __forceinline__ explicit PrefillKvLoader(const AttentionParams& p)
      : kbase(static_cast<const T*>(p.encoder ? p.key : p.kv_cache)),
        vbase(static_cast<const T*>(p.encoder ? p.value : p.kv_cache)) {}

  template <typename Swizzle>
  __device__ __forceinline__ void load(const AttentionParams& p, const PrefillItem& it, int tid, int kt, uint32_t s_k,
                                       uint32_t s_v, int stage, Swizzle swz) const {
    const int c = tid % kChunks;
    const int j0 = tid / kChunks;
    const uint32_t s_stage = static_cast<uint32_t>(stage * kStageBytes);
    if (!p.encoder && it.keys_all_read(kt, BN)) {
      PagedRowWalk walk(p, it, kt + j0);
      // The tile's block-table entries, one per lane, in one load per thread: each row then takes
      // its page from a lane. Loaded row by row instead, every entry's load would wait for the
      // copies before it (a cp.async is an asm with a memory clobber). kt and the block size are
      // the warp's alike, so the choice is uniform; blocks under BN / 31 keys take the row loads.
      const int first_block = kt / p.block_size;
      const int tile_blocks = (kt + BN - 1) / p.block_size - first_block + 1;
      if (tile_blocks <= 32) {
        const int lane = tid % 32;
        const int32_t lane_page = lane < tile_blocks ? walk.table[first_block + lane] : 0;
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          const int j = j0 + i * kRowsPerPass;
          const int32_t page = __shfl_sync(0xffffffffu, lane_page, walk.block - first_block);
          const int64_t koff = page * p.cache_stride_block + walk.slot * p.cache_stride_slot + walk.head_offset + c * 8;
          mma::cp_async_16(s_k + s_stage + swz(j, c), kbase + koff, true);
          mma::cp_async_16(s_v + s_stage + swz(j, c), vbase + koff + p.cache_stride_half, true);
          walk.advance(kRowsPerPass);
        }
        return;
      }
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int j = j0 + i * kRowsPerPass;
        const int64_t koff = walk.offset(p) + c * 8;
        mma::cp_async_16(s_k + s_stage + swz(j, c), kbase + koff, true);
        mma::cp_async_16(s_v + s_stage + swz(j, c), vbase + koff + p.cache_stride_half, true);
        walk.advance(kRowsPerPass);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int j = j0 + i * kRowsPerPass;
      const int k = kt + j;
      const bool ok = it.key_read(p, kt, j);
      int64_t koff = 0;
      int64_t voff = 0;
      if (ok) {
        if (p.encoder) {
          koff = (it.query_start + static_cast<int64_t>(k)) * p.k_stride_token + it.kv_head * p.k_stride_head;
          voff = (it.query_start + static_cast<int64_t>(k)) * p.v_stride_token + it.kv_head * p.v_stride_head;
        } else {
          koff = cache_row_offset(p, it.request, k, 0, it.kv_head);
          voff = koff + p.cache_stride_half;
        }
      }
      mma::cp_async_16(s_k + s_stage + swz(j, c), kbase + koff + c * 8, ok);
      mma::cp_async_16(s_v + s_stage + swz(j, c), vbase + voff + c * 8, ok);
    }
  }
};

// Scores → base-2 logits for S n-tile n (keys kt + 8n + 2·t4 + {0, 1}; rows g, g + 8) of one m-tile
// of a tile starting at key kt. key_mul is each key's multiplier of its dot products:
// scale·log2e·(k scale) on the plain path (no soft cap, no ALiBi: one multiply), the k scale on the
// featured path (attention_logit, then ·log2e).
template <bool Plain>
__device__ __forceinline__ void prefill_logit_tile(const AttentionParams& p, const PrefillItem& it, float (&s)[4],
                                                   const float (&key_mul)[2], const PrefillRow (&rows)[2], int kt,
                                                   int n, int t4) {
  constexpr float kLog2e = 1.4426950408889634f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (Plain) {
      s[e] *= key_mul[e % 2];
    } else {
      const int k = kt + 8 * n + 2 * t4 + (e % 2);
      s[e] = attention_logit(p, s[e] * key_mul[e % 2], rows[e / 2].head, rows[e / 2].pos, k, it.context_len) *
             kLog2e;
    }
  }
}

// prefill_logit_tile over every n-tile of one m-tile.
template <bool Plain, int kNt>
__device__ __forceinline__ void prefill_logits(const AttentionParams& p, const PrefillItem& it, float (&s)[kNt][4],
                                               const float (&key_mul)[kNt][2], const PrefillRow (&rows)[2], int kt,
                                               int t4) {
#pragma unroll
  for (int n = 0; n < kNt; ++n) prefill_logit_tile<Plain>(p, it, s[n], key_mul[n], rows, kt, n, t4);
}

// The mask of one m-tile of a tile that is not full: a score whose key the row does not see
// (key_visible = spec::key_visible), beyond the item's keys, or of a padding row becomes −inf.
// Without mm_prefix ranges (the common case, uniform over the launch) the keys a row sees are one
// interval, [window_first_key, min(window_key_end, seq_len)) (spec/visibility.h; the spec tests
// check that it is exactly the rule's set), so each score costs two compares; the general rule,
// with its per-key walk over the ranges, stays for batches that have them. kIntervalMask = false
// keeps only the general rule: the wgmma kernel's featured variant (soft cap / ALiBi) has no
// registers left for the four bounds beside its logits' state.
template <bool kIntervalMask = true, int kNt>
__device__ __forceinline__ void prefill_mask(const AttentionParams& p, const PrefillItem& it, float (&s)[kNt][4],
                                             const PrefillRow (&rows)[2], int kt, int t4) {
  if (kIntervalMask && p.num_mm_ranges == 0) {
    int first[2];
    int end[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int pos = rows[i].pos;
      first[i] = spec::window_first_key(p.sliding_window, pos);
      end[i] = min(min(spec::window_key_end(p.encoder != 0, p.sliding_window, it.seq_len, pos), it.seq_len),
                   it.item.key_end);
      if (!rows[i].valid) end[i] = first[i];  // empty: a padding row sees nothing
    }
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const int k = kt + 8 * n + 2 * t4 + (e % 2);
        if (k < first[i] || k >= end[i]) s[n][e] = kNegInf;  // select, never multiply
      }
    }
    return;
  }
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int k = kt + 8 * n + 2 * t4 + (e % 2);
      // Select, never multiply: a masked score is −inf whatever the key held.
      if (!(rows[i].valid && k < it.item.key_end && key_visible(p, it.request, it.seq_len, rows[i].pos, k))) {
        s[n][e] = kNegInf;
      }
    }
  }
}

// One tile's online-softmax step for one m-tile (rows g, g + 8), in place and without O: the row
// max over the tile, alpha = 2^{m_old − m_new} (0 while no key was visible), s ← P =
// 2^{s − (m − shift)} in float32 (P ≤ 2^shift, shift = Scales::kPShift; the reference point is 0
// while no key is visible), and l ← alpha·l + ΣP. O must still be multiplied by alpha
// (prefill_rescale) and P rounded to the A operand of P·V (prefill_pack_p) before this tile's P·V
// is added; the wgmma kernel does both once the previous tile's P·V has landed.
// row_m: the running max of the base-2 logits; row_l: this thread's part of Σ 2^{t − (m − shift)}.
// logit_mul: s holds the base-2 logits (1), or raw dot products whose logits are s·logit_mul (one
// positive multiplier for the whole tile: the plain path with a per-tensor or no k scale). Then the
// max is taken on s — fl(max s · c) = max fl(s · c), rounding being monotone, so row_m is the same —
// and each P = 2^{fma(s, c, −(m − shift))}: one FFMA per score instead of a multiply and a subtract
// (the fused product rounds once, so P may differ from the two-step form in its last bit).
// row_logit_mul: the same with one multiplier per row (g, g + 8), each positive.
template <typename Scales, int kNt>
__device__ __forceinline__ void prefill_softmax_p(float (&s)[kNt][4], float (&row_m)[2], float (&row_l)[2],
                                                  float (&alpha)[2], const float (&row_logit_mul)[2]) {
  using mma::exp2_approx;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float logit_mul = row_logit_mul[i];
    float mx = kNegInf;
#pragma unroll
    for (int n = 0; n < kNt; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(row_m[i], mx * logit_mul);
    const float m_ref = m_new == kNegInf ? 0.0f : m_new - Scales::kPShift;
    alpha[i] = row_m[i] == kNegInf ? 0.0f : exp2_approx(row_m[i] - m_new);
    row_m[i] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      s[n][2 * i] = exp2_approx(fmaf(s[n][2 * i], logit_mul, -m_ref));
      s[n][2 * i + 1] = exp2_approx(fmaf(s[n][2 * i + 1], logit_mul, -m_ref));
      sum += s[n][2 * i] + s[n][2 * i + 1];
    }
    row_l[i] = row_l[i] * alpha[i] + sum;
  }
}
template <typename Scales, int kNt>
__device__ __forceinline__ void prefill_softmax_p(float (&s)[kNt][4], float (&row_m)[2], float (&row_l)[2],
                                                  float (&alpha)[2], float logit_mul = 1.0f) {
  const float row_logit_mul[2] = {logit_mul, logit_mul};
  prefill_softmax_p<Scales>(s, row_m, row_l, alpha, row_logit_mul);
}

// P (prefill_softmax_p) times each key's v scale (key_v: per-token-head caches; 1 otherwise; ΣP
// stays unscaled) rounded to T as the A operand of P·V: S n-tile n is k-step n / 2, regs 0/1
// (rows g / g + 8) for even n, 2/3 for odd.
template <typename T, int kNt>
__device__ __forceinline__ void prefill_pack_p(const float (&s)[kNt][4], const float (&key_v)[kNt][2],
                                               uint32_t (&pa)[kNt / 2][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      pa[n / 2][(n % 2) * 2 + i] = mma::Mma<T>::pack(s[n][2 * i] * key_v[n][0], s[n][2 * i + 1] * key_v[n][1]);
    }
  }
}

// O's rows g (alpha[0]) and g + 8 (alpha[1]) moved to the new running max.
template <int kDt>
__device__ __forceinline__ void prefill_rescale(float (&o)[kDt][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < kDt; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// The whole online-softmax step of one m-tile: prefill_softmax_p (s becomes P), P packed into the
// A operand, O rescaled.
template <typename T, typename Scales, int kNt, int kDt>
__device__ __forceinline__ void prefill_softmax(float (&s)[kNt][4], const float (&key_v)[kNt][2], float (&row_m)[2],
                                                float (&row_l)[2], float (&o)[kDt][4], uint32_t (&pa)[kNt / 2][4]) {
  float alpha[2];
  prefill_softmax_p<Scales>(s, row_m, row_l, alpha);
  prefill_pack_p<T>(s, key_v, pa);
  prefill_rescale(o, alpha);
}

// The end of row i (g or g + 8) of one m-tile whose first row is r0: the quad's sum of l (fixed
// order; every lane takes part), then for a valid row the normalisation (sinks, output scale:
// row_finalize, times v_scale, the per-tensor v scale or 1) and the store of this thread's kDt
// element pairs (with the optional fused hybrid add: store_output_vec). A row without keys stores
// 0 (= output_value(0): output_scale > 0).
template <typename T, typename Scales, int kDt>
__device__ __forceinline__ void prefill_store_row(const AttentionParams& p, const PrefillItem& it,
                                                  const PrefillRow& row, int r, int i, float m, float l,
                                                  float v_scale, const float (&o)[kDt][4], int t4) {
  constexpr float kLn2 = 0.6931471805599453f;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (!row.valid) return;
  // l = Σ 2^{t − m_ref}: natural-log reference point m_ref·ln 2 for row_finalize.
  const float m_nat = m == kNegInf ? kNegInf : (m - Scales::kPShift) * kLn2;
  RowScale f = row_finalize(p, row.head, m_nat, l);
  f.acc_factor *= v_scale;
  const int64_t token = it.query_start + it.item.token_begin + r / it.item.num_heads;
  const int64_t out_row = token * p.o_stride_token + static_cast<int64_t>(row.head) * p.o_stride_head;
  if (p.fp8_output) {
#pragma unroll
    for (int n = 0; n < kDt; ++n) {
      const float pair[2] = {f.zero != 0.0f ? 0.0f : o[n][2 * i] * f.acc_factor,
                             f.zero != 0.0f ? 0.0f : o[n][2 * i + 1] * f.acc_factor};
      store_output_vec<T, 2>(p, out_row + 8 * n + 2 * t4, pair);
    }
    return;
  }
  // Model-dtype output (output_value is the identity): the same stores as store_output_vec with its
  // fp8 test taken once per row, so that the epilogue each CTA runs once stays short.
  using Pair = ElementVec<T, 2>;
  T* const hybrid = static_cast<T*>(p.hybrid_output);
  const T* const addend = static_cast<const T*>(p.ssm_addend);
#pragma unroll
  for (int n = 0; n < kDt; ++n) {
    const int64_t index = out_row + 8 * n + 2 * t4;
    const float pair[2] = {f.zero != 0.0f ? 0.0f : o[n][2 * i] * f.acc_factor,
                           f.zero != 0.0f ? 0.0f : o[n][2 * i + 1] * f.acc_factor};
    const Pair stored = pack_elements<T, 2>(pair);
    *reinterpret_cast<Pair*>(static_cast<T*>(p.output) + index) = stored;
    if (hybrid != nullptr) {
      *reinterpret_cast<Pair*>(hybrid + index) = addend == nullptr ? stored : hybrid_sum<T, 2>(stored, addend + index);
    }
  }
}

}  // namespace hybridtb::cuda
