// 1-byte KV caches on the tensor-core paths. The kernels stage the stored fp8 (e4m3 / e5m2) or int8
// bytes of a tile and cast them, exactly, to the model dtype T (ByteCast; every value fits T
// exactly): the prefill kernel once per tile into a shared tile of T (cast_16), the decode kernel in
// registers on the way to its MMA fragments (ByteCast::word). The scales never round a K or V
// element; they act in float32 as vLLM 0.33's Triton kernel applies them (CacheScales):
//   per tensor     the logit's dot product × k_scale, the output × v_scale;
//   per token-head each key's dot products × its k scale, and its probability × its v scale before
//                  P is rounded to T for P·V (tolerance.h, e_P), while Σp takes the unscaled p.
// P is kept scaled by 2^shift (exact, it cancels in Σp·v / Σp): 15 keeps float16's small weights
// normal; with the per-token-head v scales inside P, float16 takes 6, so that P·v_scale stays finite
// (a v scale is absmax / 127 or absmax / 448 of float16 values: at most 65504 / 127 ≈ 516, and
// 2^6 · 516 < 65504).
// The wgmma prefill kernel runs a 1-byte cache with plain logits on float16 products whatever the
// model dtype (prefill_wgmma_kernel.cuh, WgmmaOperands), and so does the tensor-core decode but for
// a bfloat16 model's per-token-head caches (decode_mma_kernel.cuh, DecodeOperands): their cast is
// the float16 one (word_to_half_pairs), their P shift float16's (CacheScales<__half, …>), and a
// bfloat16 model's query rows are rescaled into float16's range (float16_range_shift).
// Used by the tensor-core prefill (prefill_mma_kernel.cuh, prefill_wgmma_kernel.cuh) and decode
// (decode_mma_kernel.cuh) kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/attention_params.h"
#include "common/mma.cuh"
#include "kv_cache_write/kv_cache_write_params.h"

namespace hybridtb::cuda {

// The Cache parameter of the tensor-core kernels for a 1-byte cache: the scale mode is a compile-time
// property (a 16-bit cache is T itself).
template <bool PerTokenHead>
struct ByteCache {};
using PerTensorBytes = ByteCache<false>;    // fp8 e4m3 / e5m2 with k_scale / v_scale
using PerTokenHeadBytes = ByteCache<true>;  // int8 / fp8 e4m3 with a scale per (token, kv head)
template <typename Cache>
inline constexpr bool kIsByteCache = false;
template <bool PerTokenHead>
inline constexpr bool kIsByteCache<ByteCache<PerTokenHead>> = true;
template <typename Cache>
inline constexpr bool kIsPerTokenHeadCache = false;
template <bool PerTokenHead>
inline constexpr bool kIsPerTokenHeadCache<ByteCache<PerTokenHead>> = PerTokenHead;

// The stored element of a 1-byte cache as a compile-time kind: the kernels pick it once per CTA
// (with_byte_kind), so that every cast in their loops is straight-line code with immediate
// constants.
enum class ByteKind { kFp8E4M3, kFp8E5M2, kInt8 };

// (a & Mask) | (b & ~Mask) as one LOP3, written in PTX: left to itself the compiler re-derives the
// masks of b and spends two.
template <uint32_t Mask>
__device__ __forceinline__ uint32_t select_bits(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "n"(Mask));
  return r;
}

// The exact cast of stored bytes of kind Kind to T.
//   fp8: with the byte's e/m bits moved to T's exponent/mantissa position (a shift, then a mask)
//        and its sign bit kept at bit 15 of each half, the pattern is the value divided by
//        2^(bias(T) − bias(fp8)) (float16: s.0eeee.mmm0000000 for e4m3, the byte itself for e5m2;
//        bfloat16: s.0000eeee.mmm0000 / s.000eeeee.mm00000); one multiply by that power of two
//        rebiases it — exact, subnormals included (an fp8 subnormal becomes a subnormal of T times a
//        power of two, which the multiply normalises: float16 and bfloat16 arithmetic keep
//        subnormals). No conversion-pipe instruction; the right shifts are high multiplies, which
//        run beside the masks on another pipe.
//   int8: float32 with the byte biased into the mantissa of 2^23 (0x4B0000uu = 2^23 + x + 128),
//        minus 2^23 + 128, then T's bits (bfloat16: the float's top half, exact for |x| ≤ 128);
//        float16: 0x64uu = 1024 + x + 128 in float16, minus 1152.
template <typename T, ByteKind Kind>
struct ByteCast {
  static constexpr bool kHalf = std::is_same_v<T, __half>;
  static constexpr bool kE5m2 = Kind == ByteKind::kFp8E5M2;
  // fp8 (but e5m2 → float16, the byte itself): the right shift that moves the e/m bits of a byte at
  // bits 15..8 into T's fields, their mask (which also covers bits 7 and 23 of the word), and
  // 2^(bias(T) − bias(fp8)).
  static constexpr int kShift = kHalf ? 1 : (kE5m2 ? 3 : 4);
  static constexpr uint32_t kMask = kHalf ? 0x3F803F80u : (kE5m2 ? 0x0FE00FE0u : 0x07F007F0u);
  static constexpr uint32_t kRebias = kHalf ? 0x5C005C00u : (kE5m2 ? 0x77807780u : 0x7B807B80u);  // 2^8; 2^112, 2^120

  // The pair of T with bit pattern `bits`, times 2^(bias(T) − bias(fp8)).
  __device__ __forceinline__ static uint32_t rebias(uint32_t bits) {
    using Pair = std::conditional_t<kHalf, __half2, __nv_bfloat162>;
    Pair x;
    Pair f;
    const uint32_t r = kRebias;
    memcpy(&x, &bits, 4);
    memcpy(&f, &r, 4);
    const Pair y = __hmul2(x, f);
    uint32_t out;
    memcpy(&out, &y, 4);
    return out;
  }

  // int8: elements b0, b1 of u (the word XOR 0x80808080) as a pair of T.
  template <int b0, int b1>
  __device__ __forceinline__ static uint32_t int8_pair(uint32_t u) {
    if constexpr (kHalf) {
      const uint32_t raw = __byte_perm(u, 0x64646464u, 0x4040u | b0 | (b1 << 8));
      __half2 x;
      memcpy(&x, &raw, 4);
      const __half2 r = __hsub2(x, __half2half2(__ushort_as_half(0x6480)));  // 1152
      uint32_t out;
      memcpy(&out, &r, 4);
      return out;
    } else {
      const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | b0)) - 8388736.0f;
      const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | b1)) - 8388736.0f;
      return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
    }
  }

  // Four stored bytes (a 32-bit word, element i in byte i) → lo = (element 0, element 2),
  // hi = (element 1, element 3), each a pair of T (low half first). Pairing elements 0/2 and 1/3 keeps
  // the fp8 cast free of byte permutes; the decode kernel permutes the head dimension to match.
  __device__ __forceinline__ static void word(uint32_t w, uint32_t& lo, uint32_t& hi) {
    if constexpr (Kind == ByteKind::kInt8) {
      const uint32_t u = w ^ 0x80808080u;
      lo = int8_pair<0, 2>(u);
      hi = int8_pair<1, 3>(u);
    } else if constexpr (kHalf && kE5m2) {
      lo = (w << 8) & 0xFF00FF00u;  // the byte is float16's top byte
      hi = w & 0xFF00FF00u;
    } else {
      // Elements 0, 2 sit at bits 7..0 / 23..16 (shifted left by 8 − shift), 1, 3 at 15..8 / 31..24.
      // The sign bits: one mask of the word (bits 7, 15, 23, 31), shifted by 8 for lo; inside each
      // half the bits that are not signs fall in kMask, so one select per pair merges fields and sign.
      const uint32_t signs = w & 0x80808080u;
      const uint32_t em_lo = w << (8 - kShift);
      const uint32_t em_hi = __umulhi(w, 1u << (32 - kShift));
      uint32_t signs_lo;  // signs << 8, kept a shift of `signs` (PTX) rather than a fresh mask of w
      asm("shl.b32 %0, %1, 8;" : "=r"(signs_lo) : "r"(signs));
      lo = rebias(select_bits<kMask>(em_lo, signs_lo));
      hi = rebias(select_bits<kMask>(em_hi, signs));
    }
  }

  // Four stored bytes → (element 0, element 1), (element 2, element 3): the natural order.
  __device__ __forceinline__ static void word_in_order(uint32_t w, uint32_t& first, uint32_t& second) {
    uint32_t lo;
    uint32_t hi;
    word(w, lo, hi);
    first = __byte_perm(lo, hi, 0x5410);
    second = __byte_perm(lo, hi, 0x7632);
  }
};

// Calls f(std::integral_constant<ByteKind, K>{}) with the kind of the stored element `kind` that a
// cache of scale mode Cache holds: per tensor fp8 e4m3 or e5m2, per token-head int8 or fp8 e4m3
// (the launchers refuse anything else on the host: byte_kind_supported).
template <typename Cache, typename F>
__device__ __forceinline__ void with_byte_kind(ElementKind kind, F&& f) {
  if constexpr (kIsPerTokenHeadCache<Cache>) {
    if (kind == ElementKind::kInt8) {
      f(std::integral_constant<ByteKind, ByteKind::kInt8>{});
    } else {
      f(std::integral_constant<ByteKind, ByteKind::kFp8E4M3>{});
    }
  } else {
    if (kind == ElementKind::kFp8E5M2) {
      f(std::integral_constant<ByteKind, ByteKind::kFp8E5M2>{});
    } else {
      f(std::integral_constant<ByteKind, ByteKind::kFp8E4M3>{});
    }
  }
}
template <typename Cache>
inline bool byte_kind_supported(ElementKind kind) {
  if constexpr (kIsPerTokenHeadCache<Cache>) return kind == ElementKind::kInt8 || kind == ElementKind::kFp8E4M3;
  return kind == ElementKind::kFp8E4M3 || kind == ElementKind::kFp8E5M2;
}

// Four stored bytes → (element 0, element 1), (element 2, element 3) as float16 pairs, in order,
// exactly, by the fastest route: e5m2 is float16's top byte (one byte permute a pair); e4m3 takes
// the hardware's pair conversion (__nv_cvt_fp8x2_to_halfraw2: cvt.rn.f16x2.e4m3x2 from sm_89 on);
// int8 is ByteCast's biased pair (a permute and a subtraction), taken in element order.
template <ByteKind Kind>
__device__ __forceinline__ void word_to_half_pairs(uint32_t w, uint32_t& first, uint32_t& second) {
  if constexpr (Kind == ByteKind::kInt8) {
    const uint32_t u = w ^ 0x80808080u;
    first = ByteCast<__half, Kind>::template int8_pair<0, 1>(u);
    second = ByteCast<__half, Kind>::template int8_pair<2, 3>(u);
  } else if constexpr (Kind == ByteKind::kFp8E5M2) {
    first = __byte_perm(w, 0u, 0x1404);   // bytes (0, b0, 0, b1)
    second = __byte_perm(w, 0u, 0x3424);  // bytes (0, b2, 0, b3)
  } else {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    first = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
    second = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
  }
}

// Rescaling a bfloat16 query row (or head) into float16's range for the float16 products: the power
// of two s = clamp(14 − e, −113, 14), 2^e ≤ max|q| < 2^(e+1), given max|q|'s bfloat16 bits
// (the magnitudes' bit patterns order as their values). The row's largest element lands in
// [2^14, 2^15) (below float16's 65504, whatever bfloat16 held: 2^-113 is as far down as bfloat16's
// largest values need); every element from 2^-14 of it down to 2^-28 is exact in float16
// (bfloat16's 8 significant bits within float16's 11), smaller ones round to float16's subnormals,
// within 2^-25 of the scaled row, i.e. 2^-39 of its largest element (tolerance.h, e_KV). A row of
// zeros stays zeros.
__device__ __forceinline__ int float16_range_shift(uint32_t max_bits) {
  const int e = static_cast<int>(max_bits >> 7) - 127;  // bfloat16's exponent field
  return min(max(14 - e, -113), 14);
}
// A pair of bfloat16 (bits) times 2^shift, rounded to float16 (exact but below float16's normal
// range: float16_range_shift).
__device__ __forceinline__ uint32_t bfloat16_pair_to_half(uint32_t pair, int shift) {
  const float up = __uint_as_float(static_cast<uint32_t>(127 + shift) << 23);
  __nv_bfloat162 b;
  memcpy(&b, &pair, 4);
  const float2 v = __bfloat1622float2(b);
  const __half2 h = __floats2half2_rn(v.x * up, v.y * up);
  uint32_t out;
  memcpy(&out, &h, 4);
  return out;
}

// 16 stored bytes → two 16-byte chunks of 8 elements of T (the low 8 bytes, then the high 8), each
// the stored value exactly.
template <typename T, ByteKind Kind>
__device__ __forceinline__ void cast_16(const uint4& raw, uint4 (&out)[2]) {
  uint32_t packed[8];
  if constexpr (std::is_same_v<T, __half>) {
    word_to_half_pairs<Kind>(raw.x, packed[0], packed[1]);
    word_to_half_pairs<Kind>(raw.y, packed[2], packed[3]);
    word_to_half_pairs<Kind>(raw.z, packed[4], packed[5]);
    word_to_half_pairs<Kind>(raw.w, packed[6], packed[7]);
  } else {
    ByteCast<T, Kind>::word_in_order(raw.x, packed[0], packed[1]);
    ByteCast<T, Kind>::word_in_order(raw.y, packed[2], packed[3]);
    ByteCast<T, Kind>::word_in_order(raw.z, packed[4], packed[5]);
    ByteCast<T, Kind>::word_in_order(raw.w, packed[6], packed[7]);
  }
  out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

// How a kernel applies the scales of the cache it reads (Cache: T, PerTensorBytes or
// PerTokenHeadBytes): per tensor, k × every dot product and v × the output; per token-head
// (kPerToken), each key's staged scales; kPShift: P ∈ [0, 2^kPShift].
template <typename T, typename Cache>
struct CacheScales {
  static constexpr bool kPerToken = kIsPerTokenHeadCache<Cache>;
  static constexpr float kPShift = std::is_same_v<T, __half> && kPerToken ? 6.0f : 15.0f;
  float k = 1.0f;
  float v = 1.0f;
  __device__ __forceinline__ explicit CacheScales(const AttentionParams& p) {
    if constexpr (kIsByteCache<Cache> && !kPerToken) {
      k = p.k_scale;
      v = p.v_scale;
    }
  }
};

}  // namespace hybridtb::cuda
