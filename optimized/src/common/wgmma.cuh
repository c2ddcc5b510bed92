// PTX wrappers for Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only: compile the including
// translation unit for -gencode arch=compute_90a,code=sm_90a): shared-memory matrix descriptors of
// the 128-byte swizzle layout, the fence / commit / wait of the asynchronous MMAs, and
// m64n128k16 and m64n64k16 (A from shared memory or from registers) and m64n{8,16,32}k16 of a
// narrow B, with float32 accumulation for float16 / bfloat16 inputs; stmatrix's transposed stores.
//
// Shared layout (the canonical 128-byte swizzle, what a descriptor with layout type 1 reads): a
// [rows][cols] tile of 16-bit elements is stored as cols / 64 column slabs, each [rows][128 B];
// 16-byte chunk c (0…7) of row r sits at r·128 + ((c ^ (r % 8))·16) within its slab. Eight rows form
// one 1024-byte swizzle atom; atoms (and so slabs) must start at 1024-byte boundaries, since the
// hardware applies the XOR to the address bits. sw128_offset below.
//
// Register layouts (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts"): warp w of the
// warpgroup owns rows 16w … 16w + 15 of the 64; within them the accumulator of m64nN is the
// mma.sync m16n8 C fragment tiled along N (d[n][0..3] = (g, 8n + 2t..+1), (g + 8, 8n + 2t..+1),
// g = lane / 4, t = lane % 4), and the register A operand of k16 is the mma.sync m16n8k16 A
// fragment (common/mma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace hybridtb::cuda::wgmma {

// Byte offset of 16-byte chunk `chunk` (8 elements) of row `row` in a [rows][cols] tile of 16-bit
// elements in the 128-byte swizzle layout (slabs of 64 columns).
template <int Rows>
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * Rows * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) << 4));
}

// Matrix descriptor (PTX "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (all >> 4), base offset 0 (atoms 1024-byte aligned), layout type 1 = 128-byte swizzle.
//   K-major operand (rows of K contiguous): start = the first row's 16-element k step (slab base +
//     32·step), leading offset unused (1), stride offset 1024 (the next 8 rows).
//   MN-major operand (B [K][N] with N contiguous): start = the first k row, leading offset = the
//     slab stride (the next 64 columns of N), stride offset 1024 (the next 8 k rows).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// `desc` with its start address `bytes` further on (a multiple of 16). The start address field is
// bits 0–13 (a shared-memory address's bits 4–17), and an operand's address plus its offsets stays
// below 256 KiB, so the sum never carries out of the field: the low word alone changes. One
// integer add per k step, where building each step's descriptor anew masks, shifts and merges.
__device__ __forceinline__ uint64_t sw128_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// Four 8×8 b16 matrices to shared memory, each stored transposed (stmatrix, sm_90): lane l gives the
// address of row l % 8 of matrix l / 8 in memory, and r[i] holds the lane's (row g, cols 2t..2t+1) of
// matrix i, which land in memory rows 2t and 2t + 1 at column g: an accumulator fragment stored
// column-major, 16 bytes a row.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// Two such matrices: lanes 0–15 give the addresses.
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, const uint32_t (&r)[2]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1,%2};\n" ::"r"(addr), "r"(r[0]), "r"(r[1])
               : "memory");
}

// Orders this warpgroup's register accesses before the wgmma.mma_async that follow (accumulators
// written by ordinary instructions, register A operands).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMA's
// issue and its wait (the registers are in flight in between).
__device__ __forceinline__ void pin(float (&d)[16][4]) {
#pragma unroll
  for (int n = 0; n < 16; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
}
// The same for register A operands (P fragments of P·V): a write of them may not move above the
// wait that ends the MMAs reading them.
template <int K>
__device__ __forceinline__ void pin(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[k][e])::"memory");
  }
}
// Makes this thread's generic-proxy writes of shared memory (cp.async copies, stores) visible to
// the async proxy that wgmma reads its shared operands through; then a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The 64 float32 accumulators of one m64n128 tile (d[n][e] of the mma.sync C layout tiled along N)
// as in-out asm operands %0 … %63, and their list in the instruction.
#define HYBRIDTB_WGMMA_D_OPERANDS(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
  "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
  "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
  "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
  "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
  "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
  "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
  "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
  "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define HYBRIDTB_WGMMA_D_LIST                                          \
  "{"                                                                  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"             \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"   \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"   \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"    \
  "}"

// wgmma.mma_async m64n128k16 with float32 accumulation for 16-bit inputs of PTX type TYPE ("f16",
// "bf16"): one body for both element types, whose instructions differ in that name only.
#define HYBRIDTB_WGMMA_M64N128K16(TYPE)                                                                   \
  /* d (+)= A·Bᵀ, A [64][16] and B [128][16] K-major in shared memory (descriptors); d is               \
     overwritten when accumulate is false. */                                                          \
  __device__ __forceinline__ static void ss(float (&d)[16][4], uint64_t a, uint64_t b, bool accumulate) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " HYBRIDTB_WGMMA_D_LIST        \
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                       \
                 : HYBRIDTB_WGMMA_D_OPERANDS(d)                                                         \
                 : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));                                  \
  }                                                                                                     \
  /* d += A·B, A [64][16] in registers (the mma.sync A fragment per warp), B [16][128] MN-major in      \
     shared memory (transposed descriptor: rows of B contiguous). */                                     \
  __device__ __forceinline__ static void rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {       \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " HYBRIDTB_WGMMA_D_LIST    \
                 ", {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"                                                \
                 : HYBRIDTB_WGMMA_D_OPERANDS(d)                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                 \
  }

template <typename T>
struct Wgmma;
template <>
struct Wgmma<__half> {
  HYBRIDTB_WGMMA_M64N128K16("f16")
};
template <>
struct Wgmma<__nv_bfloat16> {
  HYBRIDTB_WGMMA_M64N128K16("bf16")
};

#undef HYBRIDTB_WGMMA_M64N128K16
#undef HYBRIDTB_WGMMA_D_LIST
#undef HYBRIDTB_WGMMA_D_OPERANDS

// The same for m64n64k16 (32 float32 accumulators, d[n][e] for n < 8), both operands from shared
// memory: A K-major ([64][16], rows of K contiguous) and B K-major ([64][16]: ss) or MN-major
// ([16][64], rows of N contiguous: ss_mn, the transposed descriptor); or both MN-major (A [16][64],
// rows of M contiguous, B [16][64]: mn_mn, both descriptors transposed). d is overwritten when
// accumulate is false. rs: d += A·B with A in registers (the mma.sync A fragment per warp) and B
// [16][64] MN-major, as m64n128k16's rs.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
  }
}
#define HYBRIDTB_WGMMA_N64_OPERANDS(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
  "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define HYBRIDTB_WGMMA_N64_LIST                                        \
  "{"                                                                  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"             \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"    \
  "}"
#define HYBRIDTB_WGMMA_M64N64K16(TYPE, NAME, TRANS_A, TRANS_B)                                             \
  __device__ __forceinline__ static void NAME(float (&d)[8][4], uint64_t a, uint64_t b, bool accumulate) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " HYBRIDTB_WGMMA_N64_LIST      \
                 ", %32, %33, p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"                                        \
                 : HYBRIDTB_WGMMA_N64_OPERANDS(d)                                                       \
                 : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));                                  \
  }

#define HYBRIDTB_WGMMA_M64N64K16_RS(TYPE)                                                                  \
  __device__ __forceinline__ static void rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {       \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " HYBRIDTB_WGMMA_N64_LIST      \
                 ", {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"                                                \
                 : HYBRIDTB_WGMMA_N64_OPERANDS(d)                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                 \
  }

template <typename T>
struct WgmmaN64;
template <>
struct WgmmaN64<__half> {
  HYBRIDTB_WGMMA_M64N64K16("f16", ss, "0", "0")
  HYBRIDTB_WGMMA_M64N64K16("f16", ss_mn, "0", "1")
  HYBRIDTB_WGMMA_M64N64K16("f16", mn_mn, "1", "1")
  HYBRIDTB_WGMMA_M64N64K16_RS("f16")
};
template <>
struct WgmmaN64<__nv_bfloat16> {
  HYBRIDTB_WGMMA_M64N64K16("bf16", ss, "0", "0")
  HYBRIDTB_WGMMA_M64N64K16("bf16", ss_mn, "0", "1")
  HYBRIDTB_WGMMA_M64N64K16("bf16", mn_mn, "1", "1")
  HYBRIDTB_WGMMA_M64N64K16_RS("bf16")
};

// The products m64nNk16 of a narrow B, N = 8, 16 or 32 (N / 2 float32 accumulators per thread,
// d[n][e] for n < N / 8 in the layout above), both operands from shared memory: A K-major ([64][16], rows
// of K contiguous) or, with kTransA, MN-major ([16][64], rows of M contiguous: the transposed
// descriptor); B K-major ([N][16]). d += A·B (zero d for a fresh product). GDN's state pass runs its
// tile of N state rows on them (ssm/gdn_state_wgmma.cu).
#define HYBRIDTB_WGMMA_NARROW(TYPE, SHAPE, D_LIST, A, B, TRANS_A, ...)                                    \
  asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " D_LIST ", " A ", " B        \
               ", 1, 1, 1, " TRANS_A ", 0;\n"                                                           \
               : __VA_ARGS__                                                                          \
               : "l"(a), "l"(b), "n"(kTransA ? 1 : 0))
#define HYBRIDTB_WGMMA_NARROW_TYPE(TYPE)                                                                    \
  template <int N, bool kTransA>                                                                         \
  __device__ __forceinline__ static void ss(float (&d)[N / 8][4], uint64_t a, uint64_t b) {               \
    static_assert(N == 8 || N == 16 || N == 32, "n8, n16 or n32");                                      \
    if constexpr (N == 8) {                                                                              \
      HYBRIDTB_WGMMA_NARROW(TYPE, "m64n8k16", "{%0,%1,%2,%3}", "%4", "%5", "%6", "+f"(d[0][0]),             \
                            "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]));                                \
    } else if constexpr (N == 16) {                                                                      \
      HYBRIDTB_WGMMA_NARROW(TYPE, "m64n16k16", "{%0,%1,%2,%3,%4,%5,%6,%7}", "%8", "%9", "%10",              \
                            "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]),     \
                            "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]));                                \
    } else {                                                                                             \
      HYBRIDTB_WGMMA_NARROW(TYPE, "m64n32k16", "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}",   \
                            "%16", "%17", "%18", "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]),              \
                            "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),     \
                            "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]),     \
                            "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]));                                \
    }                                                                                                    \
  }

template <typename T>
struct WgmmaNarrow;
template <>
struct WgmmaNarrow<__half> {
  HYBRIDTB_WGMMA_NARROW_TYPE("f16")
};
template <>
struct WgmmaNarrow<__nv_bfloat16> {
  HYBRIDTB_WGMMA_NARROW_TYPE("bf16")
};

#undef HYBRIDTB_WGMMA_NARROW_TYPE
#undef HYBRIDTB_WGMMA_NARROW

#undef HYBRIDTB_WGMMA_M64N64K16_RS
#undef HYBRIDTB_WGMMA_M64N64K16
#undef HYBRIDTB_WGMMA_N64_LIST
#undef HYBRIDTB_WGMMA_N64_OPERANDS



}  // namespace hybridtb::cuda::wgmma
