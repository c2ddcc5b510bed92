// PTX wrappers for the tensor-core attention kernels (sm_80+; built for sm_90): mma.sync
// m16n8k16 with float32 accumulation for float16 / bfloat16 inputs, m16n8k8 for TF32 inputs with
// the float32 → hi + lo TF32 split (3xTF32: the GDN and Mamba-2 prefills, warp_mma_3xtf32.cuh), ldmatrix (plain and
// transposed), movmatrix (8×8 transpose of a fragment), 16- and 4-byte cp.async with zero-fill, and exp2
// (the mamba1 scan uses the copies and exp2 too).
// Fragment layouts (PTX ISA "Matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16×16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16×8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C (16×8):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace hybridtb::cuda::mma {

template <typename T>
struct Mma;
template <>
struct Mma<__half> {
  // c += a·b
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two floats rounded (RNE) to a packed pair, low half = x.
  __device__ __forceinline__ static uint32_t pack(float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
};
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
};

// float32 → TF32, round to nearest with ties away (as cvt.rna.tf32.f32), the 32-bit pattern an mma
// reads (low 13 bits 0). Integer ops on the bits: cvt runs on the slow conversion pipe, and the
// 3xTF32 products split every operand they load.
__device__ __forceinline__ uint32_t to_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
// x = hi + lo with hi, lo TF32 (x − hi is exact in float32; lo keeps its top 11 bits): 3xTF32,
// a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b, loses only lo_a·lo_b (≤ 2^-22·|a·b|) and lo's rounding.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
// An A fragment loaded as one float4 (a0 … a3, the fragment order) split into TF32 hi + lo.
__device__ __forceinline__ void split_tf32(const float4& a, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  split_tf32(a.x, hi[0], lo[0]);
  split_tf32(a.y, hi[1], lo[1]);
  split_tf32(a.z, hi[2], lo[2]);
  split_tf32(a.w, hi[3], lo[3]);
}
// c += a·b, mma.sync m16n8k8 with TF32 inputs and float32 accumulation. Fragments (g = lane / 4,
// t = lane % 4): a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4); b0 = (k t, n g),
// b1 = (k t+4, n g); c as for m16n8k16.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// Two 8×8 b16 matrices: lanes 0–15 give the addresses (row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// The fragment of the transpose of an 8×8 b16 matrix: in, lane holds (row g, cols 2t..2t+1);
// out, lane holds (row g, cols 2t..2t+1) of the transpose, i.e. (rows 2t..2t+1, col g) of the input.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// threadIdx.x read afresh (asm volatile: never hoisted or kept across the code between reads), for
// per-thread offsets cheaper to recompute than to hold in a tight register budget.
__device__ __forceinline__ int tid_now() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// The shared-memory address of a pointer into shared memory (the cp.async / ldmatrix operand).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared (L2 only); ok == false zero-fills without reading global memory.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
// 4 bytes global → shared (through L1: the only path for 4-byte copies); ok == false zero-fills.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 2^x (ex2.approx.ftz: relative error ≤ 2^-22; 2^-inf = +0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][D] tile of 16-bit elements, XOR
// swizzled over 8 chunks: 8 rows at one logical chunk hit 8 distinct 16-byte bank groups
// (ldmatrix and cp.async conflict-free; needs D ≥ 64).
template <int D>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}

}  // namespace hybridtb::cuda::mma
