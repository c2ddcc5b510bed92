// The state pass of the GDN prefill (gdn_prefill.cu's chunk_state_kernel: its math, buffers and
// numerics) with 16-bit product operands on Hopper's warpgroup MMAs. Compiled for sm_90a only
// (optimized/CMakeLists.txt); gdn_prefill.cu launches it where GdnParams::state_wgmma is set (compute
// capability 9.0 devices, unless BackendSettings::ssm_prefill_wgmma asks for mma.sync).
//
// Block = tile of kRows = 8, 16 or 32 rows v0 … of the state M (value channels) × value head ×
// prefill, one warpgroup, sequential over the request's chunks. The rows sit on the MMAs' narrow N
// side, so one m64nRk16 chain covers a whole chunk: per chunk c,
//   (a) M, rounded to T, into shared memory as [kRows][dk] (the K-major B operand of (b));
//   (b) V_new = U − W·Mᵀ: the 64 tokens × kRows rows in one m64nR accumulator over dk / 16 k steps,
//       A = the chunk's W tile as the intra kernel left it (K-major, 128-byte swizzle);
//       V_new rounded to v_new for the output pass; V_new·diag(e^(G_n − G_i)) rounded into shared
//       memory as [kRows][64 tokens] (the K-major B operand of (f)); h_c ← M for the output pass
//       (gdn_entry_state_row's packed order) from (a)'s copy by 16-byte loads and byte permutes,
//       while (b)'s MMAs run;
//   (f) Mᵀ ← e^(G_n)·Mᵀ + K̂ᵀ·(V_new·decay): Mᵀ [dk][kRows] in float32 accumulators, one m64nR per 64
//       of dk (A = the chunk's k̂ tile [64 tokens][dk], MN-major: the transposed descriptor), over
//       the 4 token k steps; the exit state of a chunk ending at a boundary row to its slot, the last
//       one to write_slot.
// The W and k̂ tiles arrive whole, 16 KiB each, by one bulk copy each into a ring of three stages
// (a chunk's pair per stage, two chunks ahead), on one mbarrier per stage; U, G, the chunk's last G
// and its boundary slot are loaded into registers a chunk ahead (the chunk list two ahead). The
// tiles of (a) and (b) are written by stmatrix.trans (the accumulators' 8 × 8 blocks transposed, 16
// bytes a row), and every shared-memory offset and operand descriptor is formed once. Two block
// barriers per chunk: after (a), and after (b)'s stores of V_new·decay. The sums are float32 in the
// MMAs' accumulators, the values rounded to T are the mma.sync kernel's (M, V_new, V_new·decay
// rounded to nearest even; W and k̂ as the intra kernel rounded them), so the 16-bit-operand row of
// the tolerance table bounds both kernels; only the order of the additions inside an MMA
// instruction differs (fixed: bitwise reproducible run to run). Each thread loads, updates and
// stores the same elements of M, so a slot read and written by one request (read_slot ==
// write_slot) is safe.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "ssm/gdn_kernels.h"
#include "ssm/gdn_state_wgmma.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kC = kGdnChunk;
constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 3;     // the W and k̂ tiles of three chunks
constexpr int kTileBytes = kGdnFragTileElements * 2;  // one W or k̂ tile: 16 KiB
constexpr int kSlabBytes = kC * 128;                  // its 64-column slabs
static_assert(kGdnMaxHeadDim == 128 && kTileBytes == 2 * kSlabBytes, "two 64-column slabs per tile");

// Shared memory (bytes from a 1024-byte aligned base; every operand tile starts on a swizzle atom):
// the stages (W then k̂), M's copy [kRows][128] (two slabs of kRows rows), V_new·decay [kRows][64]
// (one slab), the stages' mbarriers.
template <int kRows>
struct StateWgmmaSmem {
  static_assert(kRows == 8 || kRows == 16 || kRows == 32, "n8, n16 or n32 products");
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kHeld = kStages * kStageBytes;
  static constexpr int kHeldSlab = kRows * 128;
  static constexpr int kDecayed = kHeld + 2 * kHeldSlab;
  static constexpr int kBarriers = kDecayed + kRows * 128;
  static constexpr size_t kBytes = size_t{kBarriers} + 8 * kStages + 1024;  // + the base's alignment
  static_assert(kHeldSlab % 1024 == 0, "swizzle atoms of 8 rows");
};
// Two blocks per SM: their chains interleave on the SM's issue slots (shared memory ≤ 110 KiB each).
constexpr int kBlocksPerSm = 2;

// What a thread reads of chunk ci besides the tiles, loaded a chunk ahead: U of its (b) accumulator
// elements (tokens 16·warp + g + 8·half, rows 8·j + 2·t, + 1), G of its two tokens, the chunk's last
// G and the slot its exit state goes to (−1: none).
template <int kRows>
struct ChunkInputs {
  float2 u[2][kRows / 8];
  float g[2];
  float g_last;
  int32_t boundary;
};

template <typename T, int kRows>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) chunk_state_wgmma_kernel(GdnParams p, int tiles) {
  using Mmas = wgmma::WgmmaNarrow<T>;
  using Smem = StateWgmmaSmem<kRows>;
  constexpr int kN8 = kRows / 8;  // 8-column tiles of the narrow accumulators
  extern __shared__ __align__(1024) uint8_t state_raw[];
  uint8_t* const smem = state_raw + ((1024u - (mma::shared_address(state_raw) & 1023u)) & 1023u);
  const uint32_t smem_addr = mma::shared_address(smem);
  uint8_t* const held = smem + Smem::kHeld;
  uint64_t* const stage_ready = reinterpret_cast<uint64_t*>(smem + Smem::kBarriers);

  const GdnPrefill prefill = p.prefills[blockIdx.y];
  const GpuRequest r = p.wave.requests[prefill.request];
  const int h = static_cast<int>(blockIdx.x) / tiles;
  const int v0 = (static_cast<int>(blockIdx.x) % tiles) * kRows;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int rows = min(kRows, dv - v0);
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int k_steps = (dk + 15) / 16;  // (b)'s k steps over M's columns
  const int halves = dk > 64 ? 2 : 1;  // (f)'s 64-column halves of Mᵀ
  const int first = prefill.first_chunk, end_chunk = first + prefill.num_chunks;

  // Element e of accumulator tile j: (b) token i = 16·warp + g + 8·(e / 2), row v = 8·j + 2·t + e % 2;
  // (f) of half hf, column c = 64·hf + 16·warp + g + 8·(e / 2) of M, the same row v.
  const auto row_of = [&](int j, int e) { return 8 * j + 2 * t + e % 2; };
  const auto token_of = [&](int e) { return 16 * warp + g + 8 * (e / 2); };
  const auto col_of = [&](int hf, int e) { return 64 * hf + 16 * warp + g + 8 * (e / 2); };

  const auto issue_stage = [&](int ci, int s) {  // one thread
    uint8_t* const stage = smem + s * Smem::kStageBytes;
    tma::fence_proxy_async();
    tma::mbarrier_arrive_expect_tx(stage_ready + s, 2 * kTileBytes);
    tma::load_bulk(stage, static_cast<const uint8_t*>(p.w_frag) + (int64_t{ci} * Hv + h) * kTileBytes, kTileBytes,
                   stage_ready + s);
    tma::load_bulk(stage + kTileBytes, static_cast<const uint8_t*>(p.k_frag) + (int64_t{ci} * p.Hk + hk) * kTileBytes,
                   kTileBytes, stage_ready + s);
  };
  const bool u_pairs = dv % 2 == 0 && (reinterpret_cast<uintptr_t>(p.u) & 7) == 0;
  const auto load_inputs = [&](const GdnChunk& c) {  // c.end == 0: past the request's chunks
    ChunkInputs<kRows> in{};
    in.boundary = -1;
    if (c.end == 0) return in;
    const int n = c.end - c.begin;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = token_of(2 * half);
      if (i >= n) continue;
      in.g[half] = p.gcum[int64_t{c.begin + i} * Hv + h];
      const float* const u_row = p.u + (int64_t{c.begin + i} * Hv + h) * dv + v0;
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
        const int v = row_of(j, 0);
        if (u_pairs && v + 1 < rows) {
          in.u[half][j] = *reinterpret_cast<const float2*>(u_row + v);
        } else {
          in.u[half][j].x = v < rows ? u_row[v] : 0.0f;
          in.u[half][j].y = v + 1 < rows ? u_row[v + 1] : 0.0f;
        }
      }
    }
    in.g_last = p.gcum[int64_t{c.end - 1} * Hv + h];
    if (p.boundary_slot != nullptr) in.boundary = p.boundary_slot[c.end - 1];
    return in;
  };

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) tma::mbarrier_init(stage_ready + s, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    for (int k = 0; k < 2 && first + k < end_chunk; ++k) issue_stage(first + k, k);
  }

  // Mᵀ in the (f) accumulator layout: f(element, its index within a pool slot) for each element this
  // thread holds inside the tile (columns < dk, rows < rows); the others stay zeros.
  const PoolRef& pool = p.recurrent_state;
  const int64_t tile_offset = (int64_t{h} * dv + v0) * dk;  // within a slot: rows v0 … of head h
  float m[2][kN8][4] = {};
  const auto for_each_held = [&](auto&& f) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int v = row_of(j, e), c = col_of(hf, e);
          if (c < dk && v < rows) f(m[hf][j][e], tile_offset + int64_t{v} * dk + c);
        }
      }
    }
  };
  if (r.read_slot >= 0) {  // else zeros
    for_each_held(
        [&](float& x, int64_t at) { x = load_element(pool.data, r.read_slot * pool.slot_size + at, pool.kind); });
  }
  const auto store_state = [&](int32_t slot) {
    for_each_held([&](float& x, int64_t at) { store_element(pool.data, slot * pool.slot_size + at, pool.kind, x); });
  };

  const int h_row = gdn_entry_state_row(dk, p.product_operands);  // dk rounded up to 16
  const bool h_vectors = aligned16(p.h);
  // Both tiles this thread writes, M's copy (per 64-column half) and V_new·decay, hold an
  // accumulator's 8 × 8 blocks transposed: block (j, q) = rows 8j … of the tile × the warp's 16-byte
  // chunk 2·warp + q of its columns (M's columns 16·warp + 8q … of the half; tokens 16·warp + 8q …),
  // stored by stmatrix.trans from the pair (rows 2t, 2t + 1; column g). Lane l gives the address of
  // row l % 8 of block l / 8 of an x4 (j = its pair of row tiles, q = l / 8 % 2) in the 128-byte
  // swizzle layout: row r at r·128, 16-byte chunk c at (c ^ r % 8) << 4.
  const uint32_t block_row_at = [&] {
    const int blk = (lane / 8) % (kN8 == 1 ? 2 : 4), r8 = lane % 8;
    return static_cast<uint32_t>((blk / 2) * 1024 + r8 * 128 + (((2 * warp + blk % 2) ^ r8) << 4));
  }();
  const auto store_blocks = [&](uint32_t tile_addr, const uint32_t (&pairs)[kN8][2]) {
    if constexpr (kN8 == 1) {
      wgmma::stmatrix_x2_trans(tile_addr + block_row_at, {pairs[0][0], pairs[0][1]});
    } else {
#pragma unroll
      for (int x4 = 0; x4 < kN8 / 2; ++x4) {
        wgmma::stmatrix_x4_trans(tile_addr + block_row_at + x4 * 2048,
                                 {pairs[2 * x4][0], pairs[2 * x4][1], pairs[2 * x4 + 1][0], pairs[2 * x4 + 1][1]});
      }
    }
  };
  // The operands' descriptors, formed once: W's and k̂'s at stage 0, advanced per chunk and k step.
  const uint64_t w_desc0 = wgmma::sw128_desc(smem_addr, 16, 1024);
  const uint64_t k_desc0 = wgmma::sw128_desc(smem_addr + kTileBytes, kSlabBytes, 1024);
  const uint64_t held_desc = wgmma::sw128_desc(smem_addr + Smem::kHeld, 16, 1024);
  const uint64_t decayed_desc = wgmma::sw128_desc(smem_addr + Smem::kDecayed, 16, 1024);
  // The chunk list is read two chunks ahead, the inputs loaded one chunk ahead: neither load waits on
  // the other within a chunk.
  const auto chunk_at = [&](int ci) { return ci < end_chunk ? p.chunks[ci] : GdnChunk{}; };
  GdnChunk chunk = chunk_at(first), next_chunk = chunk_at(first + 1);
  ChunkInputs<kRows> in = load_inputs(chunk);
  for (int ci = first; ci < end_chunk; ++ci) {
    const int j_chunk = ci - first, s = j_chunk % kStages;
    const ChunkInputs<kRows> next_in = load_inputs(next_chunk);  // in flight over this chunk
    const GdnChunk after_next = chunk_at(ci + 2);
    const uint32_t stage_offset = static_cast<uint32_t>(s * Smem::kStageBytes);
    const uint64_t w_desc = wgmma::sw128_desc_advance(w_desc0, stage_offset);
    const uint64_t k_desc = wgmma::sw128_desc_advance(k_desc0, stage_offset);

    // (a) M rounded into held [kRows][128] (columns past dk and rows past `rows` are zeros in m).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (hf >= halves) break;
      uint32_t pairs[kN8][2];
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) pairs[j][q] = mma::Mma<T>::pack(m[hf][j][2 * q], m[hf][j][2 * q + 1]);
      }
      store_blocks(smem_addr + static_cast<uint32_t>(Smem::kHeld + hf * Smem::kHeldSlab), pairs);
    }
    wgmma::fence_proxy_async();
    __syncthreads();  // M's copy complete; every thread is past chunk ci − 1 (its stage and V_new·decay read)
    if (tid == 0 && ci + 2 < end_chunk) issue_stage(ci + 2, (j_chunk + 2) % kStages);
    tma::mbarrier_wait(stage_ready + s, static_cast<uint32_t>(j_chunk / kStages) & 1u);

    // (b) W·Mᵀ.
    float wm[kN8][4];
#pragma unroll
    for (int j = 0; j < kN8; ++j) wm[j][0] = wm[j][1] = wm[j][2] = wm[j][3] = 0.0f;
    wgmma::pin(wm);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kGdnMaxHeadDim / 16; ++kk) {
      if (kk >= k_steps) break;
      const uint32_t step = static_cast<uint32_t>((kk / 4) * kSlabBytes + 32 * (kk % 4));
      const uint32_t b_step = static_cast<uint32_t>((kk / 4) * Smem::kHeldSlab + 32 * (kk % 4));
      Mmas::template ss<kRows, false>(wm, wgmma::sw128_desc_advance(w_desc, step),
                                      wgmma::sw128_desc_advance(held_desc, b_step));
    }
    wgmma::commit();
    // h_c ← M for the output pass while the MMAs run, from M's rounded copy in held, in
    // gdn_entry_state_row's packed order: the 8-byte item at position 4·q of a 16-column group holds
    // columns q, q + 4, q + 8, q + 12 (q < 4). A thread per (row, 16-column group): its two 16-byte
    // chunks a (columns 0 … 7 as pairs) and b (8 … 15) regrouped by byte permutes, 32 bytes stored.
#pragma unroll
    for (int item = tid; item < kRows * 8; item += kThreads) {
      const int v = item / 8, group = item % 8, r8 = v % 8;
      if (v >= rows || 16 * group >= h_row) continue;
      const uint8_t* const row = held + (group / 4) * Smem::kHeldSlab + (v / 8) * 1024 + r8 * 128;
      const uint4 a = *reinterpret_cast<const uint4*>(row + (((2 * (group % 4)) ^ r8) << 4));
      const uint4 b = *reinterpret_cast<const uint4*>(row + (((2 * (group % 4) + 1) ^ r8) << 4));
      const uint4 items01 = make_uint4(__byte_perm(a.x, a.z, 0x5410), __byte_perm(b.x, b.z, 0x5410),
                                       __byte_perm(a.x, a.z, 0x7632), __byte_perm(b.x, b.z, 0x7632));
      const uint4 items23 = make_uint4(__byte_perm(a.y, a.w, 0x5410), __byte_perm(b.y, b.w, 0x5410),
                                       __byte_perm(a.y, a.w, 0x7632), __byte_perm(b.y, b.w, 0x7632));
      uint16_t* const h_out =
          static_cast<uint16_t*>(p.h) + ((int64_t{ci} * Hv + h) * dv + v0 + v) * h_row + 16 * group;
      if (h_vectors) {
        reinterpret_cast<uint4*>(h_out)[0] = items01;
        reinterpret_cast<uint4*>(h_out)[1] = items23;
      } else {
        reinterpret_cast<uint2*>(h_out)[0] = make_uint2(items01.x, items01.y);
        reinterpret_cast<uint2*>(h_out)[1] = make_uint2(items01.z, items01.w);
        reinterpret_cast<uint2*>(h_out)[2] = make_uint2(items23.x, items23.y);
        reinterpret_cast<uint2*>(h_out)[3] = make_uint2(items23.z, items23.w);
      }
    }
    wgmma::wait<0>();
    wgmma::pin(wm);

    // V_new = U − W·Mᵀ to v_new (rounded; [chunk][head][row][token], zeros past the chunk's n
    // tokens, where U and W are zeros) and V_new·e^(G_n − G_i) rounded into decayed [kRows][64].
    const int n = chunk.end - chunk.begin;
    // The thread's first element of v_new (row 2t, token 16·warp + g); the others at fixed offsets.
    T* const v_new_out = static_cast<T*>(p.v_new) + ((int64_t{ci} * Hv + h) * dv + v0 + 2 * t) * kC + token_of(0);
    uint32_t decayed_pairs[kN8][2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = token_of(2 * half);
      const float decay = i < n ? expf(in.g_last - in.g[half]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
        const float v_new[2] = {in.u[half][j].x - wm[j][2 * half], in.u[half][j].y - wm[j][2 * half + 1]};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (row_of(j, k) < rows) v_new_out[(8 * j + k) * kC + 8 * half] = float_to_element<T>(v_new[k]);
        }
        decayed_pairs[j][half] = mma::Mma<T>::pack(v_new[0] * decay, v_new[1] * decay);
      }
    }
    store_blocks(smem_addr + static_cast<uint32_t>(Smem::kDecayed), decayed_pairs);
    wgmma::fence_proxy_async();
    __syncthreads();  // V_new·decay complete

    // (f) Mᵀ ← e^(G_n)·Mᵀ + K̂ᵀ·(V_new·decay).
    const float exit_decay = expf(in.g_last);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) m[hf][j][e] *= exit_decay;
      }
    }
    wgmma::pin(m[0]);
    wgmma::pin(m[1]);
    wgmma::fence();
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (hf >= halves) break;
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk) {
        Mmas::template ss<kRows, true>(
            m[hf], wgmma::sw128_desc_advance(k_desc, static_cast<uint32_t>(hf * kSlabBytes + kk * 16 * 128)),
            wgmma::sw128_desc_advance(decayed_desc, static_cast<uint32_t>(32 * kk)));
      }
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(m[0]);
    wgmma::pin(m[1]);
    if (in.boundary >= 0) store_state(in.boundary);  // the same for the whole block
    in = next_in;
    chunk = next_chunk;
    next_chunk = after_next;
  }
  store_state(r.write_slot);
}

template <typename T, int kRows>
void launch_rows(const GdnParams& p, cudaStream_t stream) {
  using Smem = StateWgmmaSmem<kRows>;
  allow_dynamic_smem(chunk_state_wgmma_kernel<T, kRows>, Smem::kBytes);
  const int tiles = (p.dv + kRows - 1) / kRows;
  chunk_state_wgmma_kernel<T, kRows>
      <<<dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(p.num_prefills)), kThreads, Smem::kBytes,
         stream>>>(p, tiles);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// The fewest rows per block whose grid fits on the SMs at once (one wave: the most SMs on the
// sequential chains), else 32 (the fewest waves of chains; each block's tiles serve the most rows).
template <typename T>
void launch_typed(const GdnParams& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto fits_in_one_wave = [&](int rows) {
    return int64_t{(p.dv + rows - 1) / rows} * p.Hv * p.num_prefills <= int64_t{sms} * kBlocksPerSm;
  };
  if (fits_in_one_wave(8)) {
    launch_rows<T, 8>(p, stream);
  } else if (fits_in_one_wave(16)) {
    launch_rows<T, 16>(p, stream);
  } else {
    launch_rows<T, 32>(p, stream);
  }
}

}  // namespace

void launch_gdn_state_wgmma(const GdnParams& p, cudaStream_t stream) {
  if (p.product_operands == ElementKind::kFloat16) {
    launch_typed<__half>(p, stream);
  } else {
    launch_typed<__nv_bfloat16>(p, stream);
  }
}

}  // namespace hybridtb::cuda::ssm
