// gdn on the GPU, the prefills (gdn_kernels.h: launch_gdn_prefill): the chunked WY form of the gated
// delta rule, after the preparation (gdn_kernels.cu) has normalised q and k and computed the gates.
//
// Prefills (fla's chunk_gated_delta_rule with chunk C = 64, V-major). Chunks never straddle a
// request and end after every block-boundary token (mamba_cache_mode all), so each boundary state
// is a chunk's exit state. Chunks are not aligned to absolute positions: any block size and any
// continuation position work, at the cost of chunks shorter than 64 around boundaries. With
// G_i the in-chunk inclusive cumsum of g and Γ_ij = e^(G_i − G_j) (j ≤ i, so ≤ 1):
//   (1) chunk_intra_kernel, per chunk × value head, parallel over all chunks of the wave:
//         A_ij = β_i·Γ_ij·(k̂_i·k̂_j) for j < i (strictly lower),  P_ij = (q̂_i·k̂_j)·Γ_ij for j ≤ i,
//         [W | U] = T·[diag(β·e^G)·K | diag(β)·V],  T = (I + A)^-1  in float32 (fla's solve_tril):
//         the diagonal 16×16 blocks' inverses T_bb by substitution (a column per thread), the blocks
//         below them in three rounds on the tensor cores (3xTF32); then T times the right-hand
//         sides in the products' operands (3xTF32, or T and the right-hand sides rounded to the
//         16-bit dtype, fla's recompute_w_u), each warp owning 32 columns of W or U through the four
//         16-token row blocks (only warp-level synchronisation);
//         G by a warp scan; W (per value head) and k̂ (per key head, by its first value head) leave in
//         the state pass's mma fragment order (w_frag, k_frag: one tile per chunk and head, 32 KiB of
//         float32 fragments, or with 16-bit operands 16 KiB of fragment pairs already rounded to the
//         operand dtype and packed as the m16n8k16 reads them); P (float32 rows, or with 16-bit
//         operands, like q̂, rounded in the output pass's fragment order: attn_frag, q_frag);
//   (2) chunk_state_kernel, per prefill × value head × tile of 8, 16 or 32 rows of M (the fewest
//       rows whose grid fits on the SMs at once — one block per SM, two at 8 or 16 rows with 16-bit
//       operands — else 32), sequential over the request's chunks —
//       only the chain that must be sequential. The products run transposed, M's rows on the mma's
//       n = 8 side: warp w keeps Mᵀ's columns 16·w … of the tile in registers for the whole request, in
//       the mma accumulator layout of the state update; per chunk it passes them through a small
//       shared tile to get the operand layout of V_new = U − W·Mᵀ. The W and k̂ tiles arrive whole
//       by bulk copies (one instruction of one thread per tile, on an mbarrier per slot) through a
//       ring of three slots, each tile a chunk or more ahead; U, G by a cp.async ring. Each A
//       fragment is one 16-byte shared load, split into TF32 hi + lo in registers (16-bit: one
//       16-byte load is a packed pair of k-steps, the m16n8k16's whole A operand; the B tiles, M's
//       copy and V_new·decay, are kept rounded and packed so a B fragment pair is one 8-byte load).
//       Per chunk, two barriers: M's copy through the warps' shared tiles, V_new = U − W·Mᵀ in
//       16-token × 8-row tiles, each over all of M's columns by one warp (at 8 rows by two, over
//       half the columns each, their sums added after a third barrier), then
//         h_c = M (the entry state, stored: float32, or rounded to the 16-bit operand dtype),
//         V_new = U − W·Mᵀ (float32 over U; with 16-bit operands rounded, to its own scratch),
//         M ← e^(G_n)·M + V_newᵀ·diag(e^(G_n − G_j))·K   (V_new·decay split into TF32 once);
//       the exit state of a chunk ending at a boundary row goes to its slot, the last to write_slot;
//       with 16-bit operands on a compute capability 9.0 device the state pass is
//       gdn_state_wgmma.cu's instead (GdnParams::state_wgmma: the same math on warpgroup MMAs, one
//       m64nR chain per product; the intra kernel then leaves W and k̂ in wgmma's 128-byte swizzle
//       layout, gdn_sw128_byte);
//   (3) chunk_output_kernel, per chunk × value head, parallel:
//         O = diag(e^G)·Q·h_cᵀ + P·V_new,
//       each warp owning 16 value channels of all 64 tokens, so h_c's rows and V_new's columns go
//       straight from global memory into its B fragments (read once per block, a k slice ahead
//       of their use); q̂ and P, which every warp reads, through shared memory: split into TF32 hi +
//       lo once, or with 16-bit operands copied as the intra kernel rounded and laid them out.
// Every thread of (2) owns the same elements of M when loading, updating and storing them, so a
// slot read and written by one request (read_slot == write_slot) is safe. The h_c scratch holds
// Hv·dv·dk float32 per chunk (64 KiB per value head at 128/128: 512 MiB at 64k tokens × 8 heads;
// 16-bit rows of dk rounded up to 16, in gdn_entry_state_row's order);
// w_frag and k_frag 32 KiB per chunk and value head / key head (at 64k tokens, 8 value and 4 key
// heads: 256 + 128 MiB, written once by (1), read by (2); the token-major W they replace was 256 MiB).
// With 16-bit operands all three hold 16-bit elements (gdn_scratch_element_bytes): h_c 32 KiB,
// w_frag and k_frag 16 KiB per chunk and head, half the bytes written and read; and V_new goes to its
// own 16-bit scratch (GdnParams::v_new, channel-major: four tokens are one 8-byte load of the output
// pass), 16 KiB per chunk and value head instead of 32 over U. Each is stored rounded to nearest even
// by Mma<T>::pack or float_to_element (the same rounding) from the float32 value its reader rounded
// the same way before (the state pass's W and k̂ fragments, the output pass's h_c and V_new B
// fragments), so the products see the same bits.
// Every product runs on the tensor cores with operands of one of two kinds (GdnParams::
// product_operands, a template parameter of the three kernels: one body each; the products go
// through common/warp_mma_3xtf32.cuh's 3xTF32 products and its fragment-level 16-bit product, and
// ldmatrix-fed m16n8k16 products where a 16-bit tile is staged):
//  - float32 (the default): 3xTF32 (mma.cuh: each float32 operand split into TF32 hi + lo, three
//    m16n8k8 products with float32 accumulation): float32-level accuracy, the float32 SSM row of the
//    tolerance table holds;
//  - the model dtype (float16 / bfloat16), as vLLM's / fla's Triton kernels multiply bfloat16 q, k,
//    w, u, v_new and states: each operand rounded once to it (where every warp reads it, once per
//    block into a shared 16-bit tile or by the kernel that writes it), one m16n8k16 product per 16
//    of k with float32 accumulation — k̂·k̂ᵀ, q̂·k̂ᵀ and T·[diag(β·e^G)·K | diag(β)·V] in (1) (q̂, k̂,
//    T, the right-hand sides), W·Mᵀ and the state update in (2) (W, the entry state M, k̂,
//    V_new·decay), q̂·h_cᵀ and P·V_new in (3) (q̂, h_c, P, V_new); checked against the 16-bit-operand
//    SSM row of the tolerance table (its GDN terms). The inverse T itself is computed in float32
//    (3xTF32) with either kind: see there.
// With float32 operands the shared tiles are staged in float32; with 16-bit ones the tiles that are
// only product operands are staged rounded (the intra pass's q̂ and k̂ for its products, the state
// pass's W and k̂ slots and B tiles, the output pass's q̂ and P items), the others in float32 (the
// right-hand sides, T and the results W, U, rounded as they are read); the diagonal blocks'
// inverses, decays and gates stay float32 on the CUDA cores, the state M float32 in registers, U,
// V_new and every accumulation float32.
// Fixed summation orders, no atomics: bitwise reproducible.
// The state pass is the sequential part and the wall of the prefill: its blocks are few (one per
// value head and tile of M's rows), so each chunk's work per thread is kept small — one bulk copy
// per W or k̂ tile instead of per-thread copies with their index arithmetic, one 16-byte shared load
// per fragment — and the tiles arrive a chunk or more ahead of their use.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "common/kernel_attributes.h"
#include "common/mma.cuh"
#include "common/warp_mma_3xtf32.cuh"
#include "common/tma.cuh"
#include "ssm/gdn_kernels.h"
#include "ssm/gdn_state_wgmma.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {
namespace {

using mma::frag_col;
using mma::frag_row;
using mma::Mma;
using mma::warp_mma;
using mma::warp_mma_3xtf32;

// --- (3) prefills: the chunked WY form --------------------------------------------------------------

constexpr int kC = kGdnChunk;
constexpr int kPrefillThreads = 256;  // 8 warps in the intra and output kernels
constexpr int kStateRows = 8;         // rows of M (value channels) per group of the state pass (an mma n)
// Row strides (floats) of the shared tiles, for conflict-free fragment loads: element (g, t) of a
// tile read row-major with a stride ≡ 4 (mod 32) sits in bank 4g + t; element (t, g) of a tile read
// transposed with a stride ≡ 8 (mod 32) in bank 8t + g (g < 8, t < 4: 32 distinct banks). Every
// stride is a multiple of 4 floats: 16-byte cp.async rows.
constexpr int kRowMajor128 = kGdnMaxHeadDim + 4;  // 132: [·][dk] read row-major
constexpr int kRowMajor64 = kC + 4;               // 68
constexpr int kColMajor128 = kGdnMaxHeadDim + 8;  // 136: [·][dk or dv] read transposed

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// A 16-byte item of the W and k̂ tiles (gdn_kernels.h: w_frag, k_frag) for product operands T: four
// float32 elements (one TF32 A fragment), or eight 16-bit ones (a fragment pair of two k-steps rounded
// and packed, pack_16bit_ksteps); items per tile of kGdnFragTileElements.
template <typename T>
using FragItem = std::conditional_t<std::is_same_v<T, float>, float4, uint4>;
template <typename T>
constexpr int kFragTileItems = kGdnFragTileElements * (std::is_same_v<T, float> ? 4 : 2) / 16;

// Eight consecutive float32 values (16-byte aligned in shared memory) rounded to the 16-bit T and
// packed in order: one 16-byte chunk of a tile in gdn_sw128_byte's layout.
template <typename T>
__device__ __forceinline__ uint4 pack_8(const float* x) {
  const float4 lo = *reinterpret_cast<const float4*>(x), hi = *reinterpret_cast<const float4*>(x + 4);
  return make_uint4(Mma<T>::pack(lo.x, lo.y), Mma<T>::pack(lo.z, lo.w), Mma<T>::pack(hi.x, hi.y),
                    Mma<T>::pack(hi.z, hi.w));
}

// The prefill kernels' launch configuration for product operands T (float: 3xTF32; __half,
// __nv_bfloat16: the model dtype, GdnParams::product_operands); the state pass's is
// state_blocks_per_sm.
struct GdnPrefillConfig {
  int intra_blocks_per_sm;   // chunk_intra_kernel's __launch_bounds__ (shared memory: two [C][136]
                             // tiles, A, with 16-bit operands P's staged items)
  int output_blocks_per_sm;  // chunk_output_kernel's: float32 operands, two (the split q̂ and P tiles,
                             // 128 registers); 16-bit, three (24 KiB of fragment items, 80 registers
                             // without spills), more blocks to hide the global loads of h_c and V_new
};
template <typename T>
__host__ __device__ constexpr GdnPrefillConfig gdn_prefill_config() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "product operands: float (3xTF32), __half or __nv_bfloat16");
  GdnPrefillConfig c{};
  c.intra_blocks_per_sm = 2;
  c.output_blocks_per_sm = std::is_same_v<T, float> ? 2 : 3;
  return c;
}

// Shared rows [0, kC) × columns [0, width) (row stride `ss`, width a multiple of 4) ← global rows
// [0, n) × columns [0, cols) (rows `gs` floats apart), zeros elsewhere, by cp.async: 16 bytes per
// copy where `vec` (cols and gs multiples of 4, src 16-byte aligned), else 4, by the block's
// kThreads threads. The caller commits.
template <int kThreads = kPrefillThreads>
__device__ void copy_tile_async(float* dst, int ss, const float* src, int64_t gs, int n, int cols, int width,
                                bool vec) {
  const int tid = static_cast<int>(threadIdx.x);
  if (vec && width == kGdnMaxHeadDim) {  // the common case: shifts and masks, not divisions
    constexpr int kQuads = kGdnMaxHeadDim / 4;
#pragma unroll
    for (int e = tid; e < kC * kQuads; e += kThreads) {
      const int i = e / kQuads, c = 4 * (e % kQuads);
      const bool ok = i < n && c < cols;
      mma::cp_async_16(mma::shared_address(dst + i * ss + c), ok ? src + i * gs + c : src, ok);
    }
  } else if (vec) {
    const int quads = width / 4;
    for (int e = tid; e < kC * quads; e += kThreads) {
      const int i = e / quads, c = 4 * (e % quads);
      const bool ok = i < n && c < cols;
      mma::cp_async_16(mma::shared_address(dst + i * ss + c), ok ? src + i * gs + c : src, ok);
    }
  } else {
    for (int e = tid; e < kC * width; e += kThreads) {
      const int i = e / width, c = e % width;
      const bool ok = i < n && c < cols;
      mma::cp_async_4(mma::shared_address(dst + i * ss + c), ok ? src + i * gs + c : src, ok);
    }
  }
}

// c1 += X1·Yᵀ and c2 += X2·Yᵀ as warp_mma_3xtf32 (X1, X2, Y row-major, rows kS floats apart), each
// Y fragment split once for both products; only the first `tiles` (warp-uniform) column tiles.
template <int kTiles, int kS>
__device__ __forceinline__ void warp_mma_3xtf32_pair(float (&c1)[kTiles][4], float (&c2)[kTiles][4], const float* x1,
                                                     const float* x2, const float* y, int ksteps, int tiles) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int at = (lane / 4) * kS + lane % 4;
  float small1[kTiles][4] = {}, small2[kTiles][4] = {};
#pragma unroll 2
  for (int s = 0; s < ksteps; ++s) {
    const int k = at + 8 * s;
    uint32_t a1_hi[4], a1_lo[4], a2_hi[4], a2_lo[4];
    mma::split_tf32(make_float4(x1[k], x1[8 * kS + k], x1[k + 4], x1[8 * kS + k + 4]), a1_hi, a1_lo);
    mma::split_tf32(make_float4(x2[k], x2[8 * kS + k], x2[k + 4], x2[8 * kS + k + 4]), a2_hi, a2_lo);
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      if (j >= tiles) continue;
      uint32_t b_hi0, b_lo0, b_hi1, b_lo1;
      mma::split_tf32(y[8 * j * kS + k], b_hi0, b_lo0);
      mma::split_tf32(y[8 * j * kS + k + 4], b_hi1, b_lo1);
      mma::mma_tf32(small1[j], a1_lo, b_hi0, b_hi1);
      mma::mma_tf32(small1[j], a1_hi, b_lo0, b_lo1);
      mma::mma_tf32(c1[j], a1_hi, b_hi0, b_hi1);
      mma::mma_tf32(small2[j], a2_lo, b_hi0, b_hi1);
      mma::mma_tf32(small2[j], a2_hi, b_lo0, b_lo1);
      mma::mma_tf32(c2[j], a2_hi, b_hi0, b_hi1);
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      c1[j][e] += small1[j][e];
      c2[j][e] += small2[j][e];
    }
  }
}

// The output pass's A operands with 16-bit operands T (GdnParams::q_frag, attn_frag), written by the
// intra kernel: item (mt, s, lane) of a tile X is the lane's m16n8k16 A fragment of rows 16·mt … and
// the 16-wide k slice s, rounded to T and packed, item (mt·slices + s)·32 + lane (g = lane / 4,
// t = lane % 4). The slice's k is permuted (A and B alike, so each sum is the same) to match how the
// B operand is stored: q̂ (kOutSteps slices of dk) pairs with h_c in gdn_entry_state_row's order, so
// its k slots 2t, 2t + 1, 2t + 8, 2t + 9 take columns t, t + 4, t + 8, t + 12 (pack_16bit_ksteps); P
// (kTokenSlices slices of the chunk's tokens) pairs with V_new's token runs, so they take columns
// 4·t … 4·t + 3: words X[g][4t, 4t + 1], X[g + 8][4t, 4t + 1], X[g][4t + 2, 4t + 3], X[g + 8][4t + 2,
// 4t + 3]. Only P's items with s ≤ mt are written and read (P is zero above the diagonal).
constexpr int kOutSteps = kGdnMaxHeadDim / 16;  // 16-column k slices of q̂·h_cᵀ
constexpr int kTokenSlices = kC / 16;           // 16-token k slices of P·V_new
constexpr int kQFragItems = (kC / 16) * kOutSteps * 32;
constexpr int kPFragItems = (kC / 16) * kTokenSlices * 32;
static_assert(kQFragItems * 16 == kGdnFragTileElements * 2 && kPFragItems * 16 == kC * kC * 2,
              "GdnParams::q_frag, attn_frag: one 16-bit element per element of q̂ and P");
__host__ __device__ constexpr int out_frag_item(int mt, int s, int slices, int lane) {
  return (mt * slices + s) * 32 + lane;
}
// The word of P's layout holding X[r][c] and X[r][c + 1] (c even).
__host__ __device__ constexpr int p_frag_word(int r, int c) {
  return 4 * out_frag_item(r / 16, c / 16, kTokenSlices, 4 * (r % 8) + c % 16 / 4) + 2 * (c % 4 / 2) + r % 16 / 8;
}

// The tiles of k̂·k̂ᵀ and q̂·k̂ᵀ a warp of chunk_intra_kernel takes: the 20 tiles of 16 rows × 8 columns
// that reach the diagonal (row block b has 2·(b + 1)), at most three per warp, `tiles` of them from
// (m0, n0) along the row block.
struct LowerTiles {
  int m0, n0, tiles;
};
__device__ __forceinline__ LowerTiles lower_tiles_of(int warp) {
  switch (warp) {
    case 0: return {0, 0, 2};
    case 1: return {16, 0, 2};
    case 2: return {16, 16, 2};
    case 3: return {32, 0, 3};
    case 4: return {32, 24, 3};
    case 5: return {48, 0, 3};
    case 6: return {48, 24, 3};
    default: return {48, 48, 2};
  }
}
constexpr int kLowerTilesPerWarp = 3;

// With 16-bit operands T, k̂·k̂ᵀ and q̂·k̂ᵀ of the warp's lower tiles (lower_tiles_of) from q̂ and k̂
// staged rounded to T, row-major at row stride kStagedStride16 (272 bytes: an odd number of 16-byte
// units, so ldmatrix's eight rows fall in distinct bank groups), zeros past dk to dk16: per 16 of k one
// ldmatrix.x4 of each A tile (rows m0 …), one x4 per pair of k̂'s column tiles (x2 for a last odd
// one) and one m16n8k16 per product and tile.
constexpr int kStagedStride16 = kColMajor128;  // 136 elements
static_assert(kLowerTilesPerWarp == 3, "lower_tiles_16bit takes two or three tiles per warp");
template <typename T>
__device__ __forceinline__ void lower_tiles_16bit(float (&kk)[kLowerTilesPerWarp][4],
                                                  float (&qk)[kLowerTilesPerWarp][4], const T* q_staged,
                                                  const T* k_staged, const LowerTiles& lt, int steps16) {
  constexpr int ss = kStagedStride16;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int r8 = lane % 8, quarter = lane / 8;
  // A: matrices (m 0–7, k 0–7), (m 8–15, k 0–7), (m 0–7, k 8–15), (m 8–15, k 8–15); B per pair of
  // column tiles (j, j + 1): (n j, k 0–7), (n j, k 8–15), (n j + 1, k 0–7), (n j + 1, k 8–15).
  const int a_at = (lt.m0 + r8 + 8 * (quarter % 2)) * ss + 8 * (quarter / 2);
  const int b_at = (lt.n0 + r8 + 8 * (quarter / 2)) * ss + 8 * (quarter % 2);
  const uint32_t kk_a = mma::shared_address(k_staged + a_at), qk_a = mma::shared_address(q_staged + a_at);
  const uint32_t b = mma::shared_address(k_staged + b_at);
  constexpr uint32_t kStep = 2 * 16, kTilePair = 2 * 16 * ss;  // bytes per 16 of k, per 16 rows of n
#pragma unroll 2
  for (int s = 0; s < steps16; ++s) {
    uint32_t a_k[4], a_q[4];
    mma::ldmatrix_x4(a_k, kk_a + s * kStep);
    mma::ldmatrix_x4(a_q, qk_a + s * kStep);
    uint32_t y[4];  // tiles 0 and 1 (every warp has two or three)
    mma::ldmatrix_x4(y, b + s * kStep);
    Mma<T>::run(kk[0], a_k, y[0], y[1]);
    Mma<T>::run(qk[0], a_q, y[0], y[1]);
    Mma<T>::run(kk[1], a_k, y[2], y[3]);
    Mma<T>::run(qk[1], a_q, y[2], y[3]);
    if (lt.tiles > 2) {
      uint32_t y2[2];
      mma::ldmatrix_x2(y2, b + s * kStep + kTilePair);
      Mma<T>::run(kk[2], a_k, y2[0], y2[1]);
      Mma<T>::run(qk[2], a_q, y2[0], y2[1]);
    }
  }
}

// Shared memory of chunk_intra_kernel (floats): two [C][136] tiles (q̂ and k̂ at row stride 132, then
// v and k̂ at 136: the right-hand sides, overwritten by U and W), −A with its diagonal blocks replaced
// by their inverses [C][68], G, β, β·e^G [C]; with 16-bit operands P in the output pass's fragment
// order (kPFragItems 16-byte items), staged for 16-byte stores.
template <typename T>
size_t intra_smem_bytes() {
  return sizeof(float) * (2 * kC * kColMajor128 + kC * kRowMajor64 + 3 * kC) +
         (std::is_same_v<T, float> ? 0 : 16 * size_t{kPFragItems});
}

// Block = chunk blockIdx.x / Hv × value head blockIdx.x % Hv (the value heads of a chunk are
// consecutive blocks: their q̂, k̂ shared through L2); two blocks per SM (the shared memory).
// T: the operands of k̂·k̂ᵀ and q̂·k̂ᵀ (float: 3xTF32 from the float32 tiles; 16-bit: q̂ and k̂ rounded
// once into q̂'s space, lower_tiles_16bit), and of the fragments it writes for the other passes.
template <typename T>
__global__ void __launch_bounds__(kPrefillThreads, gdn_prefill_config<T>().intra_blocks_per_sm)
    chunk_intra_kernel(GdnParams p) {
  static_assert(kC == 64 && kPrefillThreads == 256, "the warp roles below are written for 64 tokens and 8 warps");
  const int ci = static_cast<int>(blockIdx.x) / p.Hv;
  const int h = static_cast<int>(blockIdx.x) % p.Hv;
  const GdnChunk chunk = p.chunks[ci];
  const int n = chunk.end - chunk.begin;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int dk16 = round_up(dk, 16);
  constexpr int ks = kRowMajor128, xs = kColMajor128, as = kRowMajor64;
  extern __shared__ __align__(16) float intra_smem[];
  float* const Q = intra_smem;   // q̂, then v (U's right-hand side), then U
  float* const K = Q + kC * xs;  // k̂, then W's right-hand side, then W
  float* const A = K + kC * xs;  // −A, its diagonal blocks then replaced by T_bb
  float* const G = A + kC * as;
  float* const B = G + kC;
  float* const BE = B + kC;
  uint32_t* const P_staged = reinterpret_cast<uint32_t*>(BE + kC);  // 16-bit operands: P's items
  constexpr bool kTf32 = std::is_same_v<T, float>;

  // q̂, k̂ of the chunk, zero past its n rows and past dk (to dk rounded up to 16: the mma tiles).
  const float* rows = p.qkv + int64_t{chunk.begin} * gdn_conv_dim(p);
  const bool qkv_vec = dk % 4 == 0 && gdn_conv_dim(p) % 4 == 0 && aligned16(p.qkv);
  copy_tile_async(Q, ks, rows + int64_t{hk} * dk, gdn_conv_dim(p), n, dk, dk16, qkv_vec);
  copy_tile_async(K, ks, rows + int64_t{p.Hk + hk} * dk, gdn_conv_dim(p), n, dk, dk16, qkv_vec);
  mma::cp_async_commit();
  // G, the in-chunk inclusive cumsum of g, by warp 0 (lane l: tokens 2l and 2l + 1, a scan of the
  // lanes' pair sums over the warp); β by warp 1; both 0 past n.
  if (warp == 0) {
    const int i = 2 * lane;
    const float* g_rows = p.g + int64_t{chunk.begin} * Hv + h;
    const float g0 = i < n ? g_rows[int64_t{i} * Hv] : 0.0f;
    const float g1 = i + 1 < n ? g_rows[int64_t{i + 1} * Hv] : 0.0f;
    float incl = g0 + g1;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const float below = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += below;
    }
    const float before = __shfl_up_sync(0xffffffffu, incl, 1);
    const float G0 = lane == 0 ? g0 : before + g0;
    G[i] = i < n ? G0 : 0.0f;
    G[i + 1] = i + 1 < n ? G0 + g1 : 0.0f;
  } else if (warp == 1) {
    for (int i = lane; i < kC; i += 32) B[i] = i < n ? p.beta[int64_t{chunk.begin + i} * Hv + h] : 0.0f;
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  if (tid < kC) BE[tid] = B[tid] * expf(G[tid]);
  for (int i = tid; i < n; i += kPrefillThreads) p.gcum[int64_t{chunk.begin + i} * Hv + h] = G[i];
  // k̂ of the chunk in the fragment order of the state pass's second product, by the first value head
  // of each key head, 16 bytes per store. float32: quad 32·(8·s + w) + lane holds lane's A fragment
  // of token step s over columns 16·w …; 16-bit: 16-byte item 32·(8·s2 + w) + lane holds the
  // fragments of token steps 2·s2 and 2·s2 + 1 rounded to T and packed as the product reads them
  // (pack_16bit_ksteps: the bits the state pass's rounding of the float32 fragments gave).
  if (h % (Hv / p.Hk) == 0) {
    FragItem<T>* out =
        reinterpret_cast<FragItem<T>*>(static_cast<float*>(p.k_frag) + (int64_t{ci} * p.Hk + hk) * (4 * kFragTileItems<T>));
    if constexpr (std::is_same_v<T, float>) {
      for (int q = tid; q < kFragTileItems<T>; q += kPrefillThreads) {
        const int quad_lane = q % 32, col_group = q / 32 % 8, s = q / 256;
        if (16 * col_group >= dk16) continue;  // columns the state pass does not read
        const float* kg = K + (8 * s + quad_lane % 4) * ks + 16 * col_group + quad_lane / 4;
        out[q] = make_float4(kg[0], kg[8], kg[4 * ks], kg[4 * ks + 8]);
      }
    } else {
      if (p.state_wgmma != 0) {
        // The wgmma state pass's layout (gdn_sw128_byte): 16-byte chunks of 8 columns, rounded;
        // zeros from dk16 on (the pass reads whole 64-column slabs of this tile).
        uint8_t* const tile = reinterpret_cast<uint8_t*>(out);
        for (int q = tid; q < kC * kGdnMaxHeadDim / 8; q += kPrefillThreads) {
          const int i = q / (kGdnMaxHeadDim / 8), c = 8 * (q % (kGdnMaxHeadDim / 8));
          *reinterpret_cast<uint4*>(tile + gdn_sw128_byte(i, c)) = c < dk16 ? pack_8<T>(K + i * ks + c) : uint4{};
        }
      } else {
        for (int q = tid; q < kFragTileItems<T>; q += kPrefillThreads) {
          const int item_lane = q % 32, col_group = q / 32 % 8, s2 = q / 256;
          if (16 * col_group >= dk16) continue;  // columns the state pass does not read
          const float* kg = K + (16 * s2 + item_lane % 4) * ks + 16 * col_group + item_lane / 4;
          const float* kg1 = kg + 8 * ks;  // token step 2·s2 + 1
          out[q] = mma::pack_16bit_ksteps<T>(make_float4(kg[0], kg[8], kg[4 * ks], kg[4 * ks + 8]),
                                             make_float4(kg1[0], kg1[8], kg1[4 * ks], kg1[4 * ks + 8]));
        }
      }
      // q̂ in the output pass's fragment order (GdnParams::q_frag), its slices of dk16: k-steps (t,
      // t + 4) and (t + 8, t + 12) of the slice, as the state pass stores h_c (pack_16bit_ksteps).
      uint4* const q_out = static_cast<uint4*>(p.q_frag) + (int64_t{ci} * p.Hk + hk) * kQFragItems;
      for (int q = tid; q < kQFragItems; q += kPrefillThreads) {
        const int item_lane = q % 32, s = q / 32 % kOutSteps, mt = q / (32 * kOutSteps);
        if (16 * s >= dk16) continue;  // slices the output pass does not read
        const float* const qg = Q + (16 * mt + item_lane / 4) * ks + 16 * s + item_lane % 4;
        const float* const qg8 = qg + 8 * ks;  // row g + 8
        q_out[q] = mma::pack_16bit_ksteps<T>(make_float4(qg[0], qg8[0], qg[4], qg8[4]),
                                             make_float4(qg[8], qg8[8], qg[12], qg8[12]));
      }
    }
  }

  // With 16-bit operands q̂ and k̂ rounded to T once, for every warp's products, into q̂'s space (q̂
  // then k̂, [C][136] of T each: the space of one float32 tile, which q̂ no longer needs; k̂'s float32
  // tile stays for W's right-hand side): thread → columns 4·lane … of rows warp + 8·r, read into
  // registers before a barrier, written after it.
  T* const Q_staged = reinterpret_cast<T*>(Q);
  T* const K_staged = Q_staged + kC * kStagedStride16;
  if constexpr (!kTf32) {
    constexpr int kQuadRows = kC / (kPrefillThreads / 32);
    uint2 q_packed[kQuadRows], k_packed[kQuadRows];
    const bool converts = 4 * lane < dk16;
    if (converts) {
#pragma unroll
      for (int r = 0; r < kQuadRows; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(Q + (warp + 8 * r) * ks + 4 * lane);
        const float4 y = *reinterpret_cast<const float4*>(K + (warp + 8 * r) * ks + 4 * lane);
        q_packed[r] = make_uint2(Mma<T>::pack(x.x, x.y), Mma<T>::pack(x.z, x.w));
        k_packed[r] = make_uint2(Mma<T>::pack(y.x, y.y), Mma<T>::pack(y.z, y.w));
      }
    }
    __syncthreads();  // q̂'s float32 tile read by every thread
    if (converts) {
#pragma unroll
      for (int r = 0; r < kQuadRows; ++r) {
        *reinterpret_cast<uint2*>(Q_staged + (warp + 8 * r) * kStagedStride16 + 4 * lane) = q_packed[r];
        *reinterpret_cast<uint2*>(K_staged + (warp + 8 * r) * kStagedStride16 + 4 * lane) = k_packed[r];
      }
    }
    __syncthreads();  // the staged tiles complete
  }

  // −A (strictly lower) and P (lower with the diagonal) from k̂·k̂ᵀ and q̂·k̂ᵀ on the tensor cores, one
  // pass over both, over the tiles that reach the diagonal (lower_tiles_of). −A's blocks above the
  // diagonal 16×16 blocks are never read (the solve reads the blocks below them and its diagonal
  // blocks), nor are P's with 16-bit operands; with float32 ones P's rows of the chunk hold zeros there
  // (the output pass copies whole rows). With 16-bit operands k runs to dk rounded up to 16: the tiles
  // are zeros there.
  {
    const LowerTiles lt = lower_tiles_of(warp);
    float kk[kLowerTilesPerWarp][4] = {}, qk[kLowerTilesPerWarp][4] = {};
    if constexpr (kTf32) {
      warp_mma_3xtf32_pair<kLowerTilesPerWarp, ks>(kk, qk, K + lt.m0 * ks, Q + lt.m0 * ks, K + lt.n0 * ks,
                                                   round_up(dk, 8) / 8, lt.tiles);
    } else {
      lower_tiles_16bit<T>(kk, qk, Q_staged, K_staged, lt, dk16 / 16);
    }
#pragma unroll
    for (int jt = 0; jt < kLowerTilesPerWarp; ++jt) {
      if (jt >= lt.tiles) continue;
      float attn[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = lt.m0 + frag_row(e), j = lt.n0 + 8 * jt + frag_col(e);
        float neg_a = 0.0f;
        attn[e] = 0.0f;
        if (i < n && j <= i) {
          const float decay = expf(G[i] - G[j]);
          if (j < i) neg_a = -(B[i] * decay * kk[jt][e]);
          attn[e] = qk[jt][e] * decay;
        }
        A[i * as + j] = neg_a;
        if constexpr (kTf32) {
          if (i < n) p.attn[(int64_t{chunk.begin + i} * Hv + h) * kC + j] = attn[e];
        }
      }
      if constexpr (!kTf32) {  // the lane's two pairs (rows g, g + 8; columns 2·t, 2·t + 1), rounded
        const int j = lt.n0 + 8 * jt + frag_col(0);
        P_staged[p_frag_word(lt.m0 + frag_row(0), j)] = Mma<T>::pack(attn[0], attn[1]);
        P_staged[p_frag_word(lt.m0 + frag_row(2), j)] = Mma<T>::pack(attn[2], attn[3]);
      }
    }
    if constexpr (kTf32) {  // P's zeros right of the diagonal blocks, 4 columns per store
      for (int q = tid; q < kC * kC / 4; q += kPrefillThreads) {
        const int i = q / (kC / 4), j = 4 * (q % (kC / 4));
        if (i < n && j >= round_up(i + 1, 16)) {
          *reinterpret_cast<float4*>(p.attn + (int64_t{chunk.begin + i} * Hv + h) * kC + j) = float4{};
        }
      }
    }
  }
  __syncthreads();  // q̂, k̂ at stride 132 and −A are read or written by every warp
  if constexpr (!kTf32) {  // P's items on and below the diagonal to GdnParams::attn_frag
    const uint4* const staged = reinterpret_cast<const uint4*>(P_staged);
    uint4* const out = static_cast<uint4*>(p.attn_frag) + (int64_t{ci} * Hv + h) * kPFragItems;
    for (int q = tid; q < kPFragItems; q += kPrefillThreads) {
      const int s = q / 32 % kTokenSlices, mt = q / (32 * kTokenSlices);
      if (s <= mt) out[q] = staged[q];
    }
  }

  // v into q̂'s space at row stride 136 (zero past n and dv), in flight during the next steps.
  const bool v_vec = qkv_vec && dv % 4 == 0;
  copy_tile_async(Q, xs, rows + 2 * int64_t{p.Hk} * dk + int64_t{h} * dv, gdn_conv_dim(p), n, dv, round_up(dv, 8),
                  v_vec);
  mma::cp_async_commit();
  // k̂ from row stride 132 to 136 in place, times β·e^G (W's right-hand side diag(β·e^G)·K), through
  // registers (every read before the barrier, every write after it): thread → columns 4·lane … of
  // rows warp + 8·r.
  constexpr int kQuadRows = kC / (kPrefillThreads / 32);
  float4 k_quads[kQuadRows];
  const bool moves = 4 * lane < dk16;
  if (moves) {
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r) {
      const float4 x = *reinterpret_cast<const float4*>(K + (warp + 8 * r) * ks + 4 * lane);
      const float s = BE[warp + 8 * r];
      k_quads[r] = make_float4(x.x * s, x.y * s, x.z * s, x.w * s);
    }
  }
  // The inverses T_bb = (I + A_bb)^-1 of the four 16×16 diagonal blocks (unit lower triangular):
  // thread 16·b + c (< 64) solves column c of block b by forward substitution, T_ic = δ_ic + Σ_{j<i}
  // (−A)_ij·T_jc in two interleaved partial sums (exact zeros above the diagonal, exact 1 on it).
  const int tb = tid / 16 % 4, tc = tid % 16;
  float* const diag = A + 16 * tb * (as + 1);
  float t_col[16];
  if (tid < kC) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float s0 = i == tc ? 1.0f : 0.0f, s1 = 0.0f;
#pragma unroll
      for (int j = 0; j < i; ++j) {
        if (j % 2 == 0) {
          s0 = fmaf(diag[i * as + j], t_col[j], s0);
        } else {
          s1 = fmaf(diag[i * as + j], t_col[j], s1);
        }
      }
      t_col[i] = s0 + s1;
    }
  }
  __syncthreads();  // k̂ and the diagonal blocks read
  if (moves) {
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r) {
      *reinterpret_cast<float4*>(K + (warp + 8 * r) * xs + 4 * lane) = k_quads[r];
    }
  }
  if (tid < kC) {
#pragma unroll
    for (int i = 0; i < 16; ++i) diag[i * as + tc] = t_col[i];
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // v, diag(β·e^G)·K at stride 136 and the T_bb in place

  // v times β in place (U's right-hand side diag(β)·V), ordered before the products below by the
  // barriers of the inverse's rounds.
  {
    const int quads = round_up(dv, 8) / 4;
    for (int e = tid; e < kC * (kGdnMaxHeadDim / 4); e += kPrefillThreads) {
      const int i = e / (kGdnMaxHeadDim / 4), c = 4 * (e % (kGdnMaxHeadDim / 4));
      if (c >= 4 * quads) continue;
      float4* const x = reinterpret_cast<float4*>(Q + i * xs + c);
      const float s = B[i];
      const float4 y = *x;
      *x = make_float4(y.x * s, y.y * s, y.z * s, y.w * s);
    }
  }
  // The rest of T = (I + A)^-1, its 16×16 blocks below the diagonal, from the T_bb and −A's blocks in
  // three rounds (fla's merge of 16×16 inverses into 64×64): T_ij = T_ii·Σ_{j≤k<i} (−A)_ik·T_kj, round
  // r computing the blocks with i − j = r (T_10, T_21, T_32; then T_20, T_31; then T_30) from those of
  // earlier rounds. T_ij (i > j) is kept in −A's unused block (j, i) above the diagonal, row-major as
  // T_ij itself (t_block). Warp 2·x + half computes the 8 columns `half` of the round's block x (j = x):
  // Y = Σ_k (−A)_ik·T_kj into its place, then T_ii·Y over it, both 3xTF32: the inverse is float32
  // whatever the product operands (fla's solve_tril is float32 too). Rows past n come out zeros
  // (−A's rows there are zeros), columns past n the identity's (the right-hand sides' rows there are
  // zeros, so they add nothing).
  const auto t_block = [&](int i, int j) {  // block (i, j ≤ i) of T
    return i == j ? A + 16 * i * (as + 1) : A + 16 * j * as + 16 * i;
  };
#pragma unroll 1
  for (int round = 1; round < kC / 16; ++round) {
    const int x = warp / 2, half = warp % 2, g = lane / 4, t = lane % 4;
    if (x < kC / 16 - round) {
      const int j = x, i = x + round;
      float* const dst = t_block(i, j) + 8 * half;
      const auto store_tile = [&](const float(&c)[1][4]) {
        *reinterpret_cast<float2*>(dst + g * as + 2 * t) = make_float2(c[0][0], c[0][1]);
        *reinterpret_cast<float2*>(dst + (g + 8) * as + 2 * t) = make_float2(c[0][2], c[0][3]);
      };
      float y[1][4] = {};
      for (int k = j; k < i; ++k) {
        warp_mma_3xtf32<1, as, 1, 1, as>(y, A + 16 * i * as + 16 * k, t_block(k, j) + 8 * half, 2);
      }
      store_tile(y);
      __syncwarp();
      float t_ij[1][4] = {};
      warp_mma_3xtf32<1, as, 1, 1, as>(t_ij, t_block(i, i), dst, 2);
      __syncwarp();  // Y read by every lane
      store_tile(t_ij);
    }
    __syncthreads();  // the round's blocks (and in the first, v·β) complete
  }

  // [W | U] = T·[diag(β·e^G)·K | diag(β)·V] on the tensor cores. Warp w takes 32 columns, of W (the
  // k̂ tile) for w < 4, of U (the v tile) for w ≥ 4, and owns them through every row block b, from the
  // last to the first: X_b = Σ_{k≤b} T_bk·R_k over its columns, written over R_b (which no earlier
  // block reads) after the warp's reads of it, so only the warp synchronises. Rows past n (and W's
  // columns from dk to dk16) have zero right-hand sides and zero rows of T, so they come out exact
  // zeros. Then block b leaves: W in the fragment order of the state pass's first product (quad
  // 32·(16·b + cb) + lane holds lane's A fragment of tokens 16·b … and columns 8·cb …; with
  // state_wgmma in gdn_sw128_byte's layout), 16 bytes per store; U row-major for the chunk's rows.
  // The products take the kernels' operands T (warp_mma): 3xTF32, or T and the right-hand sides
  // rounded to the 16-bit dtype as they are read, one m16n8k16 per block pair — as fla multiplies its
  // inverse, rounded to the model dtype, by the rounded β·v and β·e^G·k (recompute_w_u). W and U are
  // then rounded once more, as operands of the state and output passes (as fla's w and u).
  {
    const bool w_part = warp < 4;
    float* const X = w_part ? K : Q;
    const int c0 = 32 * (warp % 4);
    const int tiles = min(4, max(0, ((w_part ? dk16 : dv) - c0 + 7) / 8));
    const int g = lane / 4, t = lane % 4;
    FragItem<T>* const w_out = reinterpret_cast<FragItem<T>*>(static_cast<float*>(p.w_frag) +
                                                              (int64_t{ci} * Hv + h) * (4 * kFragTileItems<T>));
    float* const u_out = p.u + (int64_t{chunk.begin} * Hv + h) * dv;
    const int64_t u_stride = int64_t{Hv} * dv;
    const bool u_vec = dv % 4 == 0 && aligned16(p.u);
    // The 16×32 block at rows r0 … of the warp's columns ← c (mma accumulator layout).
    const auto store_block = [&](int r0, const float(&c)[4][4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= tiles) continue;
        float* const at = X + (r0 + g) * xs + c0 + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(at) = make_float2(c[j][0], c[j][1]);
        *reinterpret_cast<float2*>(at + 8 * xs) = make_float2(c[j][2], c[j][3]);
      }
    };
    if (tiles > 0) {
#pragma unroll
      for (int b = kC / 16 - 1; b >= 0; --b) {
        const int r0 = 16 * b;
        float x[4][4] = {};
#pragma unroll
        for (int k = 0; k <= b; ++k) warp_mma<T, 4, as, 1, 1, xs>(x, t_block(b, k), X + 16 * k * xs + c0, 2, tiles);
        __syncwarp();  // R_b read by every lane
        store_block(r0, x);
        __syncwarp();
        if (w_part) {
          if constexpr (std::is_same_v<T, float>) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (j >= tiles) continue;
              const float* const xg = X + (r0 + g) * xs + c0 + 8 * j + t;
              w_out[32 * (16 * b + c0 / 8 + j) + lane] = make_float4(xg[0], xg[8 * xs], xg[4], xg[8 * xs + 4]);
            }
          } else if (p.state_wgmma != 0) {
            // The wgmma state pass's layout (gdn_sw128_byte): the block's 16 rows × the warp's
            // `tiles` chunks of 8 columns, two per lane.
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              const int q = lane + 32 * k, i = r0 + q / 4, c = c0 + 8 * (q % 4);
              if (q % 4 < tiles) {
                *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(w_out) + gdn_sw128_byte(i, c)) =
                    pack_8<T>(X + i * xs + c);
              }
            }
          } else {
            // The fragments of column blocks 2·cg and 2·cg + 1 (cg = c0 / 16 + jj: tiles is even, c0
            // and dk16 multiples of 16) as one packed pair, item 32·(8·b + cg) + lane.
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              if (2 * jj >= tiles) continue;
              const float* const xg = X + (r0 + g) * xs + c0 + 16 * jj + t;
              w_out[32 * (8 * b + c0 / 16 + jj) + lane] = mma::pack_16bit_ksteps<T>(
                  make_float4(xg[0], xg[8 * xs], xg[4], xg[8 * xs + 4]),
                  make_float4(xg[8], xg[8 * xs + 8], xg[12], xg[8 * xs + 12]));
            }
          }
        } else if (u_vec) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int i = r0 + 4 * q + lane / 8, c = c0 + 4 * (lane % 8);
            if (i < n && c < dv) {
              *reinterpret_cast<float4*>(u_out + i * u_stride + c) = *reinterpret_cast<const float4*>(X + i * xs + c);
            }
          }
        } else {
#pragma unroll
          for (int q = 0; q < 16; ++q) {
            const int i = r0 + q, c = c0 + lane;
            if (i < n && c < dv) u_out[i * u_stride + c] = X[i * xs + c];
          }
        }
      }
    }
  }
}

// The state pass. A block takes kGroups groups of 8 rows of M (value channels), kGroups 1, 2 or 4:
// the launcher takes the fewest rows per block whose grid, (dv/rows)·Hv blocks per prefill, fits on
// the SMs at once (state_blocks_per_sm), else 32 (the fewest waves of the long sequential chains).
// 8 heads of 128 take 128 blocks of 8 rows (one wave on 132 SMs); Qwen3-Next's 32 heads of 128 take
// 128 blocks of 32 rows with float32 operands (one wave, where 16-row blocks would need two), 256 of
// 16 rows, two per SM, with 16-bit ones. W and k̂ arrive in the fragment order of the
// products (the intra kernel's w_frag, k_frag), one bulk copy per tile (32 KiB float32, 16 KiB with
// 16-bit operands: the tiles hold the rounded, packed fragments), through a ring of three tile slots
// in the order W(c), K(c), W(c + 1), K(c + 1), …, each slot's copy completing on its own mbarrier
// (the 16-bit tiles keep the same depth in half the shared memory). Shared memory: the three slots;
// the small per-chunk tiles in three (U [C][rows + 4], G [C] and the boundary slot by cp.async, the
// chunk's decays e^(G_n − G_i) and e^(G_n) computed once); V_new·diag(e^(G_n − G_j)) split into TF32
// hi and lo, [2][rows][68] (split once, read by every warp; 16-bit: rounded and packed, [rows][80] of
// T); each warp's M tile [rows][20] (the transpose between its accumulator and operand layouts, read
// by every warp as the B operand of W·Mᵀ; 16-bit: again rounded and packed, [rows][16] of T, which
// (b) reads); at 8 rows the products of the upper column half, [4][32 lanes][4]; the three mbarriers.
constexpr int kStateWarps = 8;  // warp w holds columns 16·w … 16·w + 15 of the block's rows of M
constexpr int kStateThreads = 32 * kStateWarps;
constexpr int kTileSlots = 3;
constexpr int kTokenStride = kC + 4;  // V_new·decay [rows][68], read as (v g, token t): bank 4g + t
constexpr int kHeldStride = 20;       // a warp's M tile [rows][20]: written (v 2t, c g), read (v g, c t)
static_assert(16 * kStateWarps == kGdnMaxHeadDim, "the warps cover M's columns");
// Floats of a tile slot (a W or k̂ tile of operands T): 8192 (32 KiB) or 4096.
template <typename T>
constexpr int slot_floats() {
  return kFragTileItems<T> * 4;
}
// Row stride (floats) of the state pass's U tile [C][rows]: 4 past the rows, so that (b)'s reads of
// tokens g = lane / 4 fall in different banks; a multiple of 4 (16-byte copies).
template <int kGroups>
constexpr int u_stride() {
  return kStateRows * kGroups + 4;
}
template <int kGroups>
constexpr int small_floats() {  // U [C][u_stride], G [C], the boundary slot, padding, the decays [C + 4]
  return kC * u_stride<kGroups>() + kC + 4 + kC + 4;
}
// 16-bit operands: the B tiles of the state pass's two products, kept rounded to T and packed in the
// order the m16n8k16 pairs read them (mma_16bit_ksteps: k-steps (t, t + 4) and (t + 8, t + 12) of a
// 16-wide k slice), so each B fragment pair is one 8-byte shared load with no conversion. Element k of
// a slice sits at packed_k(k): lane t's four k values are consecutive.
__host__ __device__ constexpr int packed_k(int k) { return 4 * (k % 4) + k / 4; }
constexpr int kPackedTokenStride = kC + 16;  // V_new·decay [rows][80] of T: 160-byte rows, 4 rows of
                                             // a quarter warp's 8-byte reads in distinct banks
// Offsets (floats) of chunk_state_kernel's shared regions, in this order: the tile slots, the small
// tiles, V_new·decay hi and lo, the warps' M tiles, the mbarriers.
template <typename T, int kGroups>
struct StateSmem {
  static constexpr int kRows = kStateRows * kGroups;
  static constexpr int kSmall = kTileSlots * slot_floats<T>();
  static constexpr int kDecayed = kSmall + 3 * small_floats<kGroups>();
  static constexpr int kHeld = kDecayed + 2 * kRows * kTokenStride;
  static constexpr int kHeldPacked = kHeld + kStateWarps * kRows * kHeldStride;  // [warps][rows][16] of T
  static constexpr int kSplitSums =
      kHeldPacked + (std::is_same_v<T, float> ? 0 : kStateWarps * kRows * 16 / 2);  // 8 rows: (b)'s halves
  static constexpr int kBarriers = kSplitSums + (kGroups == 1 ? (kC / 16) * 32 * 4 : 0);
  static_assert(kSplitSums % 4 == 0, "the split sums are float4s");
  static constexpr size_t kBytes = sizeof(float) * size_t{kBarriers} + sizeof(uint64_t) * kTileSlots;
  static_assert(kBarriers % 2 == 0, "the mbarriers are 8-byte aligned");
};
constexpr size_t kMaxBlockSmemBytes = 227 * 1024;  // sm_90's opt-in limit of shared memory per block
constexpr size_t kSmemPerSm = 228 * 1024;          // sm_90's shared memory per SM
constexpr size_t kSmemReservedPerBlock = 1024;     // what the runtime keeps of it per resident block
static_assert(StateSmem<float, 4>::kBytes <= kMaxBlockSmemBytes, "the 32-row state pass fits in shared memory");
// chunk_state_kernel's blocks per SM (its __launch_bounds__, and what the launcher counts as resident):
// two with 16-bit operands at 8 or 16 rows, where two blocks' shared memory fits on an SM (70 / 83 KiB
// each) and the registers are capped at 128, else one. Each block's chunk loop is a chain of short
// dependent steps run by 8 warps (issue slots a third busy at one block per SM), so a second block's
// chain takes the slots the first leaves idle.
template <typename T, int kGroups>
constexpr int state_blocks_per_sm() {
  constexpr bool kTwo = !std::is_same_v<T, float> && kGroups <= 2 &&
                        2 * (StateSmem<T, kGroups>::kBytes + kSmemReservedPerBlock) <= kSmemPerSm;
  return kTwo ? 2 : 1;
}

// Block = tile blockIdx.x % tiles (rows v0 = 8·kGroups·tile … of M) of value head blockIdx.x / tiles of
// prefill blockIdx.y. With so few rows per block the products run transposed, the value rows on the
// mma's n = 8 side: warp w (if 16·w < dk) keeps Mᵀ's columns c0 = 16·w … of group q's 8 rows in
// registers for the whole request, as the 16×8 accumulator fragment m[q] of the second product
// (element e: column c0 + g + 8·(e/2), row 8q + 2t + e%2, g = lane / 4, t = lane % 4). Per chunk c,
// two barriers (three at 8 rows):
//   (a) the fragments go through the warp's M tile in shared memory (the B operand of the first
//       product needs row g, columns t and t + 4; 16-bit: rounded, in packed_k order); the first 65
//       threads compute the chunk's decays;
//   barrier; W(c + 1) is issued into K(c − 1)'s slot, U, G of chunk c + 2 into the small ring;
//   h_c ← M from the warp's tile (16-byte stores; 16-bit: the packed tile's 8-byte quads as they
//   are, gdn_entry_state_row), after its first products are issued;
//   (b) V_new = U − W·Mᵀ in tiles of 16 tokens × 8 rows (tile x: tokens 16·(x % 4) …, group x / 4),
//       warp w taking tiles w, w + 8, …, each over all of M's columns: W's fragments as A (float32:
//       one 16-byte load per k-step of 8, split into TF32 hi + lo; 16-bit: one per 16 columns, the
//       packed pair), the warps' M tiles as B (at 8 rows, 4 tiles: warps w and w + 4 on tile w,
//       each over half of the columns; barrier; warp w adds w + 4's sums from shared memory);
//       V_new stored for the output pass (over U; 16-bit: rounded, to v_new) and, times
//       e^(G_n − G_i) and split into TF32 hi + lo (16-bit: rounded), to shared memory;
//   barrier (after waiting for U, G of chunk c + 1); K(c + 1) is issued into W(c)'s slot;
//   (f) Mᵀ ← e^(G_n)·Mᵀ + K[:, cols]ᵀ·diag(e^(G_n − G_j))·V_new (per group six accumulators: the hi·hi,
//       lo·hi and hi·lo products of even and odd k-steps, chains of four), the boundary state from
//       registers; no barrier after it: the next chunk's first one orders these reads of the M tiles,
//       V_new·decay, K(c)'s slot and the small slot before anything overwrites them.
// Each tile is issued about a chunk before its use. W's and k̂'s rows past the chunk's n
// tokens are zeros, so every product runs over all 64 tokens (no branches in the unrolled loops)
// and those tokens contribute exact zeros. Each thread loads, updates and stores the same elements
// of M, so read_slot == write_slot is safe.
// T: the operands of W·Mᵀ and of the state update (float: 3xTF32 as above; 16-bit: M's copy and
// V_new·decay rounded once as they are written to shared memory, in packed_k order, W and k̂ arriving
// rounded and packed from the intra kernel, the fragments of two consecutive k-steps feeding one
// m16n8k16). M itself stays float32 in the registers either way; h_c is stored in T.
template <typename T, int kGroups>
__global__ void __launch_bounds__(kStateThreads, state_blocks_per_sm<T, kGroups>())
    chunk_state_kernel(GdnParams p, int tiles) {
  constexpr bool kTf32 = std::is_same_v<T, float>;
  using H = std::conditional_t<kTf32, float, T>;  // h_c's elements (gdn_scratch_element_bytes)
  constexpr int kRows = kStateRows * kGroups;
  constexpr int kVTiles = kC / 16 * kGroups;  // (b)'s 16-token × 8-row tiles of V_new
  // (b)'s warps per tile: at 8 rows (4 tiles) two, each over half of M's column blocks.
  constexpr int kSplits = kVTiles < kStateWarps ? kStateWarps / kVTiles : 1;
  static_assert(kSplits == 1 || (kSplits == 2 && kVTiles * kSplits == kStateWarps));
  constexpr int kSplitBlocks = kStateWarps / kSplits;  // column blocks per warp and tile
  const GdnPrefill prefill = p.prefills[blockIdx.y];
  const GpuRequest r = p.wave.requests[prefill.request];
  const int h = static_cast<int>(blockIdx.x) / tiles;
  const int v0 = (static_cast<int>(blockIdx.x) % tiles) * kRows;
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int rows = min(kRows, dv - v0);
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int col_groups = round_up(dk, 16) / 16;  // groups of 16 columns of M
  const bool owns = warp < col_groups;
  const int c0 = 16 * warp;
  constexpr int ts = kTokenStride, hs = kHeldStride, us = u_stride<kGroups>();
  constexpr int kSmallFloats = small_floats<kGroups>();
  constexpr int kSlotFloats = slot_floats<T>();
  using Smem = StateSmem<T, kGroups>;
  extern __shared__ __align__(16) float state_smem[];
  float* const tile_slots = state_smem;
  float* const small_buf = state_smem + Smem::kSmall;
  uint32_t* const vd_hi = reinterpret_cast<uint32_t*>(state_smem + Smem::kDecayed);
  uint32_t* const vd_lo = vd_hi + kRows * ts;
  float* const held_tiles = state_smem + Smem::kHeld;
  float* const held = held_tiles + warp * kRows * hs;
  // 16-bit operands: the same M tiles and V_new·decay rounded to T and packed (packed_k).
  T* const held_packed_tiles = reinterpret_cast<T*>(state_smem + Smem::kHeldPacked);
  T* const vd_packed = reinterpret_cast<T*>(vd_hi);
  uint64_t* const slot_ready = reinterpret_cast<uint64_t*>(state_smem + Smem::kBarriers);

  const int first = prefill.first_chunk, end_chunk = first + prefill.num_chunks;
  const auto chunk_at = [&](int ci) { return ci < end_chunk ? p.chunks[ci] : GdnChunk{}; };
  const bool u_vec = dv % 4 == 0 && aligned16(p.u);  // then rows is a multiple of 4: whole quads
  // W(ci) or K(ci) into slot s (one thread).
  const auto issue_tile = [&](const float* tile, int s) {
    tma::mbarrier_arrive_expect_tx(slot_ready + s, sizeof(float) * kSlotFloats);
    tma::load_bulk(tile_slots + s * kSlotFloats, tile, sizeof(float) * kSlotFloats, slot_ready + s);
  };
  const auto w_tile = [&](int ci) { return static_cast<const float*>(p.w_frag) + (int64_t{ci} * Hv + h) * kSlotFloats; };
  const auto k_tile = [&](int ci) {
    return static_cast<const float*>(p.k_frag) + (int64_t{ci} * p.Hk + hk) * kSlotFloats;
  };
  // U's rows of the block per token, G and the boundary slot.
  const auto load_small = [&](const GdnChunk& c, int slot) {
    float* s = small_buf + slot * kSmallFloats;
    const int n = c.end - c.begin;
    const float* u_rows = p.u + (int64_t{c.begin} * Hv + h) * dv + v0;
    // U: with whole quads one 16-byte copy per thread, two at 32 rows (a fixed count, unrolled: a
    // strided loop here cost more than the copies); else a float per copy.
    if (u_vec) {
      constexpr int kQuadsPerToken = kRows / 4;
      constexpr int kRounds = (kC * kQuadsPerToken + kStateThreads - 1) / kStateThreads;
#pragma unroll
      for (int round = 0; round < kRounds; ++round) {
        const int e = tid + round * kStateThreads;
        const int i = e / kQuadsPerToken, v = 4 * (e % kQuadsPerToken);
        const bool ok = i < n && v < rows;
        if (i < kC) {
          mma::cp_async_16(mma::shared_address(s + i * us + v), ok ? u_rows + int64_t{i} * Hv * dv + v : p.u, ok);
        }
      }
    } else {
      for (int e = tid; e < kC * kRows; e += kStateThreads) {
        const int i = e / kRows, v = e % kRows;
        const bool ok = i < n && v < rows;
        mma::cp_async_4(mma::shared_address(s + i * us + v), ok ? u_rows + int64_t{i} * Hv * dv + v : p.u, ok);
      }
    }
    static_assert(kC <= kStateThreads);
    if (tid < kC) {
      const bool ok = tid < n;
      const float* g_src = ok ? p.gcum + int64_t{c.begin + tid} * Hv + h : p.gcum;
      mma::cp_async_4(mma::shared_address(s + kC * us + tid), g_src, ok);
    }
    if (tid == 0) {
      int* slot_of = reinterpret_cast<int*>(s + kC * us + kC);
      if (p.boundary_slot != nullptr) {
        mma::cp_async_4(mma::shared_address(slot_of), p.boundary_slot + c.end - 1, true);
      } else {
        *slot_of = -1;
      }
    }
  };

  if (tid == 0) {
    for (int s = 0; s < kTileSlots; ++s) tma::mbarrier_init(slot_ready + s, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();
  // Chunk ci's tiles, then (issued during ci − 1 and ci) W and K of ci + 1 through the slots and U, G
  // of ci + 2 through the small ring; the chunk list itself is read a chunk before its loads are issued.
  GdnChunk chunk = chunk_at(first), next = chunk_at(first + 1), after_next = chunk_at(first + 2);
  if (tid == 0 && first < end_chunk) {
    issue_tile(w_tile(first), 0);
    issue_tile(k_tile(first), 1);
  }
  if (first < end_chunk) load_small(chunk, 0);
  if (first + 1 < end_chunk) load_small(next, 1);
  mma::cp_async_commit();

  // M's tile enters from read_slot (or zeros).
  const PoolRef& pool = p.recurrent_state;
  const int64_t tile_offset = (int64_t{h} * dv + v0) * dk;  // within a slot: rows v0 … of head h
  const auto row_of = [&](int q, int e) { return 8 * q + 2 * t + e % 2; };
  const auto col_of = [&](int e) { return c0 + g + 8 * (e / 2); };
  float m[kGroups][4];
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = row_of(q, e), c = col_of(e);
      const bool saved = owns && c < dk && v < rows && r.read_slot >= 0;
      m[q][e] = saved ? load_element(pool.data, r.read_slot * pool.slot_size + tile_offset + v * dk + c, pool.kind)
                      : 0.0f;
    }
  }
  mma::cp_async_wait<0>();
  __syncthreads();

  // Bit s: the parity of slot s's next phase. Every thread waits for every tile, in issue order.
  uint32_t phases = 0;
  const auto wait_tile = [&](int s) {
    tma::mbarrier_wait(slot_ready + s, (phases >> s) & 1u);
    phases ^= 1u << s;
  };
  // float32 h_c rows in whole quads of columns where dk allows: 16 bytes per store (16-bit rows are
  // always 8 bytes per store: rows of dk16 elements, gdn_entry_state_row).
  const bool h_quads = dk % 4 == 0 && aligned16(p.h);
  const int h_row_elements = gdn_entry_state_row(dk, p.product_operands);
  int w_slot = 0;  // W(ci)'s slot; K(ci) is in the next one, W(ci + 1) in the one after
  for (int ci = first; ci < end_chunk; ++ci) {
    const int j = ci - first;
    const int n = chunk.end - chunk.begin;
    const int k_slot = (w_slot + 1) % kTileSlots;
    const FragItem<T>* const W = reinterpret_cast<const FragItem<T>*>(tile_slots + w_slot * kSlotFloats);
    const FragItem<T>* const K = reinterpret_cast<const FragItem<T>*>(tile_slots + k_slot * kSlotFloats);
    const float* U = small_buf + (j % 3) * kSmallFloats;
    const float* G = U + kC * us;
    float* const decay_of = small_buf + (j % 3) * kSmallFloats + kC * us + kC + 4;  // e^(G_n − G_i), e^(G_n)
    const GdnChunk ahead = chunk_at(ci + 3);

    wait_tile(w_slot);
    if (owns) {
      // (a) Mᵀ's fragments into the warp's tile (row-major [v][c]; 16-bit: rounded, packed_k order).
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (kTf32) {
            held[row_of(q, e) * hs + g + 8 * (e / 2)] = m[q][e];
          } else {
            held_packed_tiles[(warp * kRows + row_of(q, e)) * 16 + packed_k(g + 8 * (e / 2))] =
                float_to_element<T>(m[q][e]);
          }
        }
      }
    }
    if (tid < kC) {  // once per chunk, for (b) and (f)
      decay_of[tid] = expf(G[n - 1] - G[tid]);
    } else if (tid == kC) {
      decay_of[kC] = expf(G[n - 1]);
    }
    __syncthreads();  // every warp's M tile written; every warp is past chunk ci − 1

    // The slot after W(ci)'s and K(ci)'s held K(ci − 1), which every warp has read.
    if (tid == 0 && ci + 1 < end_chunk) issue_tile(w_tile(ci + 1), (w_slot + 2) % kTileSlots);
    if (ci + 2 < end_chunk) load_small(after_next, (j + 2) % 3);
    mma::cp_async_commit();

    // h_c ← M for the output pass, from the warp's tile after the barrier (the tile is next written by
    // this warp in the next chunk's (a)), so the stores overlap (b)'s products instead of delaying the
    // barrier: lane → row 8q + lane / 4, four columns at 4·(lane % 4) of the warp's 16. float32, the
    // columns 4·(lane % 4) …; 16-bit, the tile's packed elements as they are (columns lane % 4 + 4·k,
    // k < 4: gdn_entry_state_row), no conversion.
    const auto store_entry_state = [&] {
      if (!owns) return;
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
        const int v = 8 * q + lane / 4, c_in = 4 * (lane % 4), c = c0 + c_in;
        H* const h_row = static_cast<H*>(p.h) + ((int64_t{ci} * Hv + h) * dv + v0 + v) * h_row_elements + c;
        if (v >= rows) continue;
        if constexpr (kTf32) {
          if (c >= dk) continue;  // the tile's columns past dk (16-bit rows hold them: zeros)
          const float4 x = *reinterpret_cast<const float4*>(held + v * hs + c_in);
          if (h_quads) {
            *reinterpret_cast<float4*>(h_row) = x;
          } else {
            const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              if (c + k < dk) h_row[k] = xs[k];
            }
          }
        } else {
          *reinterpret_cast<uint2*>(h_row) =
              *reinterpret_cast<const uint2*>(held_packed_tiles + (warp * kRows + v) * 16 + c_in);
        }
      }
    };
    // (b) V_new = U − W·Mᵀ, tile x: element e of the accumulator is token i = 16·(x % 4) + g +
    // 8·(e / 2), row v = 8·(x / 4) + 2t + e % 2. products: wm ← W·Mᵀ over M's column blocks cb in
    // [part, part + 1)·kSplitBlocks (block cb is warp cb's M tile).
    const auto products = [&](int x, int part, float (&wm)[4]) {
      const int mt = x % 4, q = x / 4;
      // Independent chains, summed in a fixed order below: 16-bit, by the parity of the column block
      // (two chains of 4 MMAs instead of one of 8); float32, by the k-step within the block with the
      // hi·hi, lo·hi and hi·lo products apart (six chains of 8 instead of one of 48).
      float big[2][4] = {}, lo_hi[2][4] = {}, hi_lo[2][4] = {};
#pragma unroll
      for (int k = 0; k < kSplitBlocks; ++k) {  // M's columns 16·cb …
        const int cb = part * kSplitBlocks + k;
        if (cb >= col_groups) break;
        if constexpr (!kTf32) {
          const uint4 a = W[32 * (8 * mt + cb) + lane];  // the packed fragment pair: one 16-byte load
          const uint2 b = *reinterpret_cast<const uint2*>(held_packed_tiles + (cb * kRows + 8 * q + g) * 16 + 4 * t);
          mma::mma_16bit_ksteps<T>(big[k % 2], a, b);
        } else {
          const float* const b_row = held_tiles + (cb * kRows + 8 * q + g) * hs + t;
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            uint32_t a_hi[4], a_lo[4], b_hi[2], b_lo[2];
            mma::split_tf32(W[32 * (16 * mt + 2 * cb + s) + lane], a_hi, a_lo);
            mma::split_tf32(b_row[8 * s], b_hi[0], b_lo[0]);
            mma::split_tf32(b_row[8 * s + 4], b_hi[1], b_lo[1]);
            mma::mma_tf32(lo_hi[s], a_lo, b_hi[0], b_hi[1]);
            mma::mma_tf32(hi_lo[s], a_hi, b_lo[0], b_lo[1]);
            mma::mma_tf32(big[s], a_hi, b_hi[0], b_hi[1]);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        wm[e] = (big[0][e] + big[1][e]) + ((lo_hi[0][e] + hi_lo[0][e]) + (lo_hi[1][e] + hi_lo[1][e]));
      }
    };
    // Tile x's U and e^(G_n − G_i) in this lane's accumulator layout, read before its products.
    struct TileInputs {
      float2 u[2];
      float decay[2];
    };
    const auto tile_inputs = [&](int x) {
      const int mt = x % 4, q = x / 4;
      TileInputs in;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * mt + g + 8 * half, v = 8 * q + 2 * t;
        in.u[half] = *reinterpret_cast<const float2*>(U + i * us + v);
        in.decay[half] = decay_of[i];
      }
      return in;
    };
    // V_new (wm = W·Mᵀ) of tile x over U, and V_new·diag(e^(G_n − G_i)) to shared memory.
    const auto store_v_new = [&](int x, const float (&wm)[4], const TileInputs& in) {
      const int mt = x % 4, q = x / 4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * mt + g + 8 * half, v = 8 * q + 2 * t;
        const float decay = in.decay[half];
        const float2 u = in.u[half];
        const float v_new[2] = {u.x - wm[2 * half], u.y - wm[2 * half + 1]};
        if constexpr (kTf32) {  // over U
          float* const u_out = p.u + (int64_t{chunk.begin + i} * Hv + h) * dv + v0 + v;
          if (i < n) {
            if (u_vec) {  // rows a multiple of 4, u_out 8-byte aligned
              if (v < rows) *reinterpret_cast<float2*>(u_out) = make_float2(v_new[0], v_new[1]);
            } else {
              if (v < rows) u_out[0] = v_new[0];
              if (v + 1 < rows) u_out[1] = v_new[1];
            }
          }
        } else {  // rounded, to v_new [chunk][head][channel][token]; tokens past n are exact zeros
          T* const v_out = static_cast<T*>(p.v_new) + ((int64_t{ci} * Hv + h) * dv + v0 + v) * kC + i;
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            if (v + k < rows) v_out[k * kC] = float_to_element<T>(v_new[k]);
          }
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if constexpr (kTf32) {
            mma::split_tf32(v_new[k] * decay, vd_hi[(v + k) * ts + i], vd_lo[(v + k) * ts + i]);
          } else {  // token i of 16-wide slice i / 16 at its packed place
            vd_packed[(v + k) * kPackedTokenStride + 16 * mt + packed_k(i % 16)] = float_to_element<T>(v_new[k] * decay);
          }
        }
      }
    };
    if constexpr (kSplits == 2) {  // warps w and w + 4 on tile w, the upper half's sums through shared
      const int x = warp % kVTiles, part = warp / kVTiles;
      const TileInputs in = tile_inputs(x);
      float wm[4];
      products(x, part, wm);
      store_entry_state();
      float4* const half_sums = reinterpret_cast<float4*>(state_smem + Smem::kSplitSums) + 32 * x + lane;
      if (part == 1) *half_sums = make_float4(wm[0], wm[1], wm[2], wm[3]);
      __syncthreads();  // the upper halves' sums
      if (part == 0) {
        const float4 upper = *half_sums;
        wm[0] += upper.x, wm[1] += upper.y, wm[2] += upper.z, wm[3] += upper.w;
        store_v_new(x, wm, in);
      }
    } else {
#pragma unroll
      for (int x0 = 0; x0 < kVTiles; x0 += kStateWarps) {
        const int x = x0 + warp;
        if (x >= kVTiles) break;
        const TileInputs in = tile_inputs(x);
        float wm[4];
        products(x, 0, wm);
        if (x0 == 0) store_entry_state();
        store_v_new(x, wm, in);
      }
    }
    mma::cp_async_wait<1>();          // U and G of ci + 1 (issued a chunk ago) have landed
    __syncthreads();                  // V_new·decay complete, W(ci)'s slot read: free
    if (tid == 0 && ci + 1 < end_chunk) issue_tile(k_tile(ci + 1), w_slot);

    // (f) Mᵀ ← e^(G_n)·Mᵀ + K[:, cols]ᵀ·diag(e^(G_n − G_j))·V_new: K transposed as A (m = columns g,
    // g + 8; k = tokens t, t + 4; hi and lo two 16-byte loads), V_new·decay as B (k = tokens t, t + 4;
    // n = row 8q + g); then the boundary state.
    const float exit_decay = decay_of[kC];
    const int32_t boundary = *reinterpret_cast<const int32_t*>(G + kC);
    wait_tile(k_slot);
    if (owns) {
      float odd[kGroups][4] = {}, lo_hi[kGroups][2][4] = {}, hi_lo[kGroups][2][4] = {};
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) m[q][e] *= exit_decay;
      }
      if constexpr (!kTf32) {
        // 16-bit: token k-steps 2s2 and 2s2 + 1 feed one m16n8k16; even and odd s2 into m and odd.
#pragma unroll
        for (int s2 = 0; s2 < kC / 16; ++s2) {
          const uint4 a = K[32 * (kStateWarps * s2 + warp) + lane];  // the packed fragment pair
#pragma unroll
          for (int q = 0; q < kGroups; ++q) {
            const uint2 b = *reinterpret_cast<const uint2*>(vd_packed + (8 * q + g) * kPackedTokenStride + 16 * s2 + 4 * t);
            float(&acc)[4] = s2 % 2 == 0 ? m[q] : odd[q];
            mma::mma_16bit_ksteps<T>(acc, a, b);
          }
        }
      } else {
#pragma unroll
        for (int s = 0; s < kC / 8; ++s) {
          const int quad = 32 * (kStateWarps * s + warp) + lane;
          const float4 a = K[quad];
          uint32_t a_hi[4], a_lo[4];
          mma::split_tf32(a, a_hi, a_lo);
#pragma unroll
          for (int q = 0; q < kGroups; ++q) {
            const int at = (8 * q + g) * ts + 8 * s + t;
            float(&big)[4] = s % 2 == 0 ? m[q] : odd[q];
            mma::mma_tf32(lo_hi[q][s % 2], a_lo, vd_hi[at], vd_hi[at + 4]);
            mma::mma_tf32(hi_lo[q][s % 2], a_hi, vd_lo[at], vd_lo[at + 4]);
            mma::mma_tf32(big, a_hi, vd_hi[at], vd_hi[at + 4]);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kGroups; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          m[q][e] += odd[q][e] + ((lo_hi[q][0][e] + hi_lo[q][0][e]) + (lo_hi[q][1][e] + hi_lo[q][1][e]));
        }
      }
      if (boundary >= 0) {  // the same for the whole block
#pragma unroll
        for (int q = 0; q < kGroups; ++q) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int v = row_of(q, e), c = col_of(e);
            if (c < dk && v < rows) {
              store_element(pool.data, boundary * pool.slot_size + tile_offset + v * dk + c, pool.kind, m[q][e]);
            }
          }
        }
      }
    }
    // No barrier here: the next chunk's first barrier keeps its writes of the M tiles, V_new·decay,
    // K(ci)'s slot and this chunk's small slot behind every warp's reads of them here.
    w_slot = (w_slot + 2) % kTileSlots;
    chunk = next;
    next = after_next;
    after_next = ahead;
  }
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = row_of(q, e), c = col_of(e);
      if (owns && c < dk && v < rows) {
        store_element(pool.data, r.write_slot * pool.slot_size + tile_offset + v * dk + c, pool.kind, m[q][e]);
      }
    }
  }
}

// The output pass. Block = chunk × value head (every value channel): q̂ and P are read once per
// block, and the value heads of one key head are consecutive blocks (their q̂ shared through L2).
// Warp w owns value channels c0 = 16·w … c0 + 15 (two 8-column tiles) for all 64 tokens (four
// 16-row tiles), so each row of the entry state h_c and each column of V_new is read by one warp
// only: straight from global memory into the B fragments, a 16-wide k slice ahead of their use,
// with no shared tile. q̂ and P, the A operands every warp reads, go through shared memory: with
// float32 operands copied as float32 and split into TF32 hi + lo once; with 16-bit operands copied
// as the intra kernel left them, rounded and in fragment order (q_frag, attn_frag), one 16-byte
// shared load per fragment and no conversion.
// Within each 16-wide slice of a product's k the mma's k index is permuted (A and B alike, so the
// sum is the same): a lane's k-step pair takes its four consecutive k columns 4·t … 4·t + 3, columns
// 4·t, 4·t + 1 as (t, t + 4) of the first k-step and 4·t + 2, 4·t + 3 of the second. A float32 A
// fragment pair is then one 16-byte shared load per row (hi and lo), an h_c fragment pair one
// 16-byte global load (16-bit operands: 8 bytes of h_c stored already rounded, the B registers as
// loaded). Row strides of the split tiles ≡ 16 (mod 32) floats: 16-byte loads of rows g, g + 1 (a
// quarter warp) in distinct banks.
constexpr int kQSplitStride = kGdnMaxHeadDim + 16;  // 144: q̂ hi, lo [C][144]
constexpr int kPSplitStride = kC + 16;              // 80: P hi, lo [C][80]
constexpr int kOutAhead = 1;                        // h_c slices loaded ahead of their use
static_assert(16 * (kPrefillThreads / 32) == kGdnMaxHeadDim, "the output pass's warps cover the value channels");

// Shared memory of chunk_output_kernel (32-bit words): float32 operands, q̂ and P as TF32 hi and lo;
// 16-bit operands, their fragment items; then G [C].
template <typename T>
size_t output_smem_bytes() {
  const size_t operands = std::is_same_v<T, float> ? sizeof(float) * (2 * kC * kQSplitStride + 2 * kC * kPSplitStride)
                                                   : 16 * size_t{kQFragItems + kPFragItems};
  return operands + sizeof(float) * kC;
}

// The block splits the shared tile [C][width] (row stride ss, width a multiple of 4, float32 in hi)
// into TF32 hi (in place) and lo (at the same place in lo). Each quad is one thread's.
__device__ void split_tile_tf32(uint32_t* hi, uint32_t* lo, int ss, int width) {
  const int quads = width / 4;
  for (int e = static_cast<int>(threadIdx.x); e < kC * quads; e += kPrefillThreads) {
    const int at = e / quads * ss + 4 * (e % quads);
    uint32_t h[4], l[4];
    mma::split_tf32(*reinterpret_cast<const float4*>(hi + at), h, l);
    *reinterpret_cast<uint4*>(hi + at) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(lo + at) = make_uint4(l[0], l[1], l[2], l[3]);
  }
}

// acc[mt][nt] += X[16·mt …][16-column slice]·Y[slice][8·nt …] for the m tiles mt ≥ mt_first, with
// the permuted k of a slice, in 3xTF32 (lo·hi, hi·lo, hi·hi, each k-step in that order): x_hi, x_lo
// X pre-split at the lane's (row g, column 4·t) of the slice (rows kS words apart); y[nt] the lane's
// Y(columns 4·t … 4·t + 3 of the slice, column g of tile nt) in float32, split here.
template <int kS>
__device__ __forceinline__ void mma_slice_tf32(float (&acc)[4][2][4], const uint32_t* x_hi, const uint32_t* x_lo,
                                               const float4 (&y)[2], int mt_first) {
  uint32_t y_hi[2][4], y_lo[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) mma::split_tf32(y[nt], y_hi[nt], y_lo[nt]);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    if (mt < mt_first) continue;
    const uint4 h0 = *reinterpret_cast<const uint4*>(x_hi + 16 * mt * kS);
    const uint4 h1 = *reinterpret_cast<const uint4*>(x_hi + (16 * mt + 8) * kS);
    const uint4 l0 = *reinterpret_cast<const uint4*>(x_lo + 16 * mt * kS);
    const uint4 l1 = *reinterpret_cast<const uint4*>(x_lo + (16 * mt + 8) * kS);
    const uint32_t a_hi[2][4] = {{h0.x, h1.x, h0.y, h1.y}, {h0.z, h1.z, h0.w, h1.w}};
    const uint32_t a_lo[2][4] = {{l0.x, l1.x, l0.y, l1.y}, {l0.z, l1.z, l0.w, l1.w}};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        mma::mma_tf32(acc[mt][nt], a_lo[s], y_hi[nt][2 * s], y_hi[nt][2 * s + 1]);
        mma::mma_tf32(acc[mt][nt], a_hi[s], y_lo[nt][2 * s], y_lo[nt][2 * s + 1]);
        mma::mma_tf32(acc[mt][nt], a_hi[s], y_hi[nt][2 * s], y_hi[nt][2 * s + 1]);
      }
    }
  }
}

// The same with 16-bit operands T, one m16n8k16 per tile: a the lane's fragment item of m tile 0 of
// the slice (out_frag_item; m tile mt's kMTileItems items further), y[nt] the lane's four k values
// of tile nt's column already rounded to T, in memory order (k slots 2t, 2t + 1 and 2t + 8, 2t + 9).
template <typename T, int kMTileItems>
__device__ __forceinline__ void mma_slice_16bit(float (&acc)[4][2][4], const uint4* a, const uint2 (&y)[2],
                                                int mt_first) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    if (mt < mt_first) continue;
    const uint4 item = a[mt * kMTileItems];
    const uint32_t frag[4] = {item.x, item.y, item.z, item.w};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) Mma<T>::run(acc[mt][nt], frag, y[nt].x, y[nt].y);
  }
}

// Block = chunk blockIdx.x / Hv × value head blockIdx.x % Hv, 8 warps: O = diag(e^G)·Q·Mᵀ + P·V_new
// with M the chunk's entry state (h) and V_new from the state pass; warp w takes channels 16·w …
// (if below dv) of every token. P's zeros above the diagonal let the second product skip, for m
// tile mt, the k slices past it. Two blocks per SM. T: the products' operands (float: 3xTF32 from
// the split tiles; 16-bit: q̂ and P as the intra kernel rounded them, h_c and V_new as the state pass
// did).
template <typename T>
__global__ void __launch_bounds__(kPrefillThreads, gdn_prefill_config<T>().output_blocks_per_sm)
    chunk_output_kernel(GdnParams p) {
  const int dk = p.dk, dv = p.dv, Hv = p.Hv;
  const int ci = static_cast<int>(blockIdx.x) / Hv;
  const int h = static_cast<int>(blockIdx.x) % Hv;
  const GdnChunk chunk = p.chunks[ci];
  const int n = chunk.end - chunk.begin;
  const int hk = h / (Hv / p.Hk);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int dk16 = round_up(dk, 16);
  const int steps = dk16 / 16;
  constexpr bool kTf32 = std::is_same_v<T, float>;
  constexpr int qs = kQSplitStride, ps = kPSplitStride;
  extern __shared__ __align__(16) uint32_t output_smem[];
  // float32 operands: q̂ (float32, then its TF32 hi), its lo, P (likewise), its lo.
  uint32_t* const Q_hi = output_smem;
  uint32_t* const Q_lo = Q_hi + kC * qs;
  uint32_t* const P_hi = Q_lo + kC * qs;
  uint32_t* const P_lo = P_hi + kC * ps;
  // 16-bit operands: q̂'s and P's fragment items.
  uint4* const Q_items = reinterpret_cast<uint4*>(output_smem);
  uint4* const P_items = Q_items + kQFragItems;
  float* const G = kTf32 ? reinterpret_cast<float*>(P_lo + kC * ps) : reinterpret_cast<float*>(P_items + kPFragItems);

  if constexpr (kTf32) {
    const bool qkv_vec = dk % 4 == 0 && gdn_conv_dim(p) % 4 == 0 && aligned16(p.qkv);
    copy_tile_async(reinterpret_cast<float*>(Q_hi), qs,
                    p.qkv + int64_t{chunk.begin} * gdn_conv_dim(p) + int64_t{hk} * dk, gdn_conv_dim(p), n, dk, dk16,
                    qkv_vec);
    copy_tile_async(reinterpret_cast<float*>(P_hi), ps, p.attn + int64_t{chunk.begin} * Hv * kC + int64_t{h} * kC,
                    int64_t{Hv} * kC, n, kC, kC, aligned16(p.attn));
  } else {  // the items the products read: q̂'s slices of dk16, P's on and below the diagonal
    const uint4* const q_src = static_cast<const uint4*>(p.q_frag) + (int64_t{ci} * p.Hk + hk) * kQFragItems;
    for (int q = tid; q < kQFragItems; q += kPrefillThreads) {
      if (q / 32 % kOutSteps < steps) mma::cp_async_16(mma::shared_address(Q_items + q), q_src + q, true);
    }
    const uint4* const p_src = static_cast<const uint4*>(p.attn_frag) + (int64_t{ci} * Hv + h) * kPFragItems;
    for (int q = tid; q < kPFragItems; q += kPrefillThreads) {
      if (q / 32 % kTokenSlices <= q / (32 * kTokenSlices)) {
        mma::cp_async_16(mma::shared_address(P_items + q), p_src + q, true);
      }
    }
  }
  mma::cp_async_commit();
  for (int i = tid; i < kC; i += kPrefillThreads) G[i] = i < n ? p.gcum[int64_t{chunk.begin + i} * Hv + h] : 0.0f;

  // The warp's B fragments, zeros past dk, dv and n: h_c's rows c0 + 8·nt + g (columns 4·t … of
  // slice s), V_new's column c0 + 8·nt + g (tokens 16·s + 4·t …).
  const int c0 = 16 * warp;
  const bool active = c0 < dv;
  // h_c: float32 (columns 4·t … 4·t + 3 of the slice, zeros past dk), or with 16-bit operands as the
  // state pass stored it, rounded to T and in gdn_entry_state_row's order: the lane's 8 bytes at
  // 16·s + 4·t are columns t, t + 4, t + 8, t + 12 of the slice, straight into B registers.
  using H = std::conditional_t<kTf32, float, uint16_t>;  // h_c's elements (16-bit: their bits)
  using HQuad = std::conditional_t<kTf32, float4, uint2>;
  const int h_row_elements = gdn_entry_state_row(dk, p.product_operands);
  const H* const h_rows = static_cast<const H*>(p.h) + (int64_t{ci} * Hv + h) * dv * h_row_elements;
  const bool h_vec = dk % 4 == 0 && aligned16(p.h);
  const auto load_h = [&](int s, HQuad(&y)[2]) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int v = c0 + 8 * nt + g, k = 16 * s + 4 * t;
      y[nt] = HQuad{};
      if constexpr (kTf32) {
        if (v < dv && k < dk) {
          const float* const src = h_rows + v * dk + k;
          if (h_vec) {
            y[nt] = *reinterpret_cast<const float4*>(src);
          } else {
            y[nt] = make_float4(src[0], k + 1 < dk ? src[1] : 0.0f, k + 2 < dk ? src[2] : 0.0f,
                                k + 3 < dk ? src[3] : 0.0f);
          }
        }
      } else if (v < dv) {
        y[nt] = *reinterpret_cast<const uint2*>(h_rows + v * h_row_elements + k);
      }
    }
  };
  // V_new: float32 over U (token rows), or with 16-bit operands the state pass's rounded copy, each
  // channel's tokens in order (zeros past n), four tokens as one uint2 straight into B registers.
  using VQuad = HQuad;
  const float* const v_rows = p.u + (int64_t{chunk.begin} * Hv + h) * dv;
  const int v_stride = Hv * dv;  // the chunk's 64 rows: 32-bit offsets
  const uint2* const v_channels = static_cast<const uint2*>(p.v_new) + (int64_t{ci} * Hv + h) * dv * (kC / 4);
  const auto load_v = [&](int s, VQuad(&y)[2]) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int v = c0 + 8 * nt + g, j = 16 * s + 4 * t;
      if constexpr (kTf32) {
        float x[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) x[r] = v < dv && j + r < n ? v_rows[(j + r) * v_stride + v] : 0.0f;
        y[nt] = make_float4(x[0], x[1], x[2], x[3]);
      } else {
        y[nt] = v < dv ? v_channels[v * (kC / 4) + j / 4] : uint2{};
      }
    }
  };
  // One 16-wide k slice s of either product for the m tiles mt ≥ mt_first: A from the shared tiles
  // (q̂ or P), B the lane's y.
  const int lane_at_q = g * qs + 4 * t, lane_at_p = g * ps + 4 * t;
  float acc[4][2][4] = {};
  const auto q_slice = [&](int s, const HQuad(&y)[2]) {
    if constexpr (kTf32) {
      mma_slice_tf32<qs>(acc, Q_hi + lane_at_q + 16 * s, Q_lo + lane_at_q + 16 * s, y, 0);
    } else {
      mma_slice_16bit<T, 32 * kOutSteps>(acc, Q_items + out_frag_item(0, s, kOutSteps, lane), y, 0);
    }
  };
  const auto p_slice = [&](int s, const VQuad(&y)[2]) {
    if constexpr (kTf32) {
      mma_slice_tf32<ps>(acc, P_hi + lane_at_p + 16 * s, P_lo + lane_at_p + 16 * s, y, s);
    } else {
      mma_slice_16bit<T, 32 * kTokenSlices>(acc, P_items + out_frag_item(0, s, kTokenSlices, lane), y, s);
    }
  };
  HQuad h_ring[kOutAhead + 1][2];
  VQuad v_ring[2][2];
  if (active) {
#pragma unroll
    for (int s = 0; s < kOutAhead; ++s) {
      if (s < steps) load_h(s, h_ring[s]);
    }
  }
  mma::cp_async_wait<0>();
  __syncthreads();
  if constexpr (kTf32) {
    split_tile_tf32(Q_hi, Q_lo, qs, dk16);
    split_tile_tf32(P_hi, P_lo, ps, kC);
    __syncthreads();
  }
  if (!active) return;

#pragma unroll
  for (int s = 0; s < kOutSteps; ++s) {
    if (s >= steps) break;
    if (s + kOutAhead < steps) load_h(s + kOutAhead, h_ring[(s + kOutAhead) % (kOutAhead + 1)]);
    q_slice(s, h_ring[s % (kOutAhead + 1)]);
  }
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float decay = expf(G[16 * mt + g + 8 * half]);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        acc[mt][nt][2 * half] *= decay;
        acc[mt][nt][2 * half + 1] *= decay;
      }
    }
  }
  // Token slice s of P·V_new feeds the m tiles mt ≥ s (P is zero above the diagonal).
  load_v(0, v_ring[0]);
#pragma unroll
  for (int s = 0; s < kTokenSlices; ++s) {
    if (s + 1 < kTokenSlices) load_v(s + 1, v_ring[(s + 1) % 2]);
    p_slice(s, v_ring[s % 2]);
  }
  // o in its element type T (fp32, fp16 or bf16, as store_element): the lane's adjacent channels v,
  // v + 1 of row i in one access where every such pair starts at an even element of an aligned o
  // (then v < dv, v even, dv even: both in range), else one by one.
  const auto store_o = [&](auto* o) {
    using O = std::remove_pointer_t<decltype(o)>;
    const bool o_pairs =
        dv % 2 == 0 && p.o.row_stride % 2 == 0 && reinterpret_cast<uintptr_t>(o) % (2 * sizeof(O)) == 0;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 16 * mt + g + 8 * half;
        if (i >= n) continue;
        O* const row = o + int64_t{chunk.begin + i} * p.o.row_stride + int64_t{h} * dv;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int v = c0 + 8 * nt + 2 * t;
          const float x[2] = {acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]};
          if (o_pairs) {
            if (v < dv) *reinterpret_cast<ElementVec<O, 2>*>(row + v) = pack_elements<O, 2>(x);
          } else {
            if (v < dv) row[v] = float_to_element<O>(x[0]);
            if (v + 1 < dv) row[v + 1] = float_to_element<O>(x[1]);
          }
        }
      }
    }
  };
  switch (p.o.kind) {
    case ElementKind::kFloat32:
      store_o(static_cast<float*>(p.o.data));
      break;
    case ElementKind::kFloat16:
      store_o(static_cast<__half*>(p.o.data));
      break;
    default:
      store_o(static_cast<__nv_bfloat16*>(p.o.data));
      break;
  }
}

// Launches the state pass with blocks of 8·kGroups rows of M and product operands T.
template <typename T, int kGroups>
void launch_state_groups(const GdnParams& p, cudaStream_t stream) {
  const size_t smem = StateSmem<T, kGroups>::kBytes;
  allow_dynamic_smem(chunk_state_kernel<T, kGroups>, smem);
  const int tiles = (p.dv + kStateRows * kGroups - 1) / (kStateRows * kGroups);
  chunk_state_kernel<T, kGroups><<<dim3(static_cast<unsigned>(tiles * p.Hv), static_cast<unsigned>(p.num_prefills)),
                                   kStateThreads, smem, stream>>>(p, tiles);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

// The state pass: on wgmma where p.state_wgmma is set (16-bit operands; decided by the caller once
// per device: no query here), else chunk_state_kernel in blocks of 8, 16 or 32 rows of M: the fewest
// rows whose grid fits on the SMs at once (one wave: the most SMs on the sequential chains), else 32
// rows (the fewest waves of chains; each block's W and k̂ tiles serve the most rows).
template <typename T>
void launch_state_pass(const GdnParams& p, cudaStream_t stream) {
#if defined(HYBRIDTB_GDN_WGMMA)
  if constexpr (!std::is_same_v<T, float>) {
    if (p.state_wgmma != 0) {
      launch_gdn_state_wgmma(p, stream);
      return;
    }
  }
#endif
  int device = 0, sms = 0;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto fits_in_one_wave = [&](int groups, int blocks_per_sm) {
    const int rows = kStateRows * groups;
    return int64_t{(p.dv + rows - 1) / rows} * p.Hv * p.num_prefills <= int64_t{sms} * blocks_per_sm;
  };
  if (fits_in_one_wave(1, state_blocks_per_sm<T, 1>())) {
    launch_state_groups<T, 1>(p, stream);
  } else if (fits_in_one_wave(2, state_blocks_per_sm<T, 2>())) {
    launch_state_groups<T, 2>(p, stream);
  } else {
    launch_state_groups<T, 4>(p, stream);
  }
}

// The three prefill kernels with product operands T.
template <typename T>
void launch_prefill_kernels(const GdnParams& p, cudaStream_t stream) {
  const size_t intra_smem = intra_smem_bytes<T>();
  allow_dynamic_smem(chunk_intra_kernel<T>, intra_smem);
  chunk_intra_kernel<T>
      <<<static_cast<unsigned>(int64_t{p.num_chunks} * p.Hv), kPrefillThreads, intra_smem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
  launch_state_pass<T>(p, stream);
  const size_t output_smem = output_smem_bytes<T>();
  allow_dynamic_smem(chunk_output_kernel<T>, output_smem);
  chunk_output_kernel<T>
      <<<static_cast<unsigned>(int64_t{p.num_chunks} * p.Hv), kPrefillThreads, output_smem, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool gdn_wgmma_built() {
#if defined(HYBRIDTB_GDN_WGMMA)
  return true;
#else
  return false;
#endif
}

void launch_gdn_prefill(const GdnParams& p, cudaStream_t stream) {
  if (p.num_prefills == 0 || p.num_chunks == 0) return;
  if (p.state_wgmma != 0 && (!gdn_wgmma_built() || p.product_operands == ElementKind::kFloat32)) {
    throw Error(p.product_operands == ElementKind::kFloat32
                    ? "gdn prefill: state_wgmma set with float32 operands (the wgmma state pass takes 16-bit ones)"
                    : "gdn prefill: state_wgmma set, but this build has no sm_90a code (gdn_wgmma_built)");
  }
  switch (p.product_operands) {
    case ElementKind::kFloat32:
      launch_prefill_kernels<float>(p, stream);
      break;
    case ElementKind::kFloat16:
      launch_prefill_kernels<__half>(p, stream);
      break;
    case ElementKind::kBFloat16:
      launch_prefill_kernels<__nv_bfloat16>(p, stream);
      break;
    default:
      throw Error(detail::concat("gdn prefill: product operands of kind ", static_cast<int>(p.product_operands),
                                 " (float32, float16 or bfloat16 only)"));
  }
}

}  // namespace hybridtb::cuda::ssm
