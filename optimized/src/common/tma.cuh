// Tensor-memory-accelerator (TMA) copies on sm_90: a contiguous block (bulk copy), a 2-D tile of a
// row-major float32 tensor or a box of a tensor of up to 5 dimensions copied from global to shared
// memory by one instruction of one thread, its completion counted in bytes on a shared-memory
// mbarrier that every consumer waits on. Used where many threads would otherwise spend issue slots
// and shared-memory wavefronts on per-thread cp.async copies (the mamba1 scan's token chunks, the GDN
// prefill's W and K tiles, the wgmma prefill's K/V pages). The host side encodes a CUtensorMap
// through the runtime's driver entry point (no link against libcuda); the map travels as a
// __grid_constant__ kernel parameter.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/mma.cuh"

namespace hybridtb::cuda::tma {

// --- device -------------------------------------------------------------------------------------

// True in exactly one lane of a fully active warp (elect.sync): a TMA issued under it by a whole warp
// keeps its operands in uniform registers, where one thread selected by its index makes the compiler
// wrap every copy in a loop over the active lanes.
__device__ __forceinline__ bool elect_one() {
  uint32_t elected = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(elected));
  return elected != 0;
}
// One mbarrier, expecting `arrivals` arrivals per phase (1: the thread that issues the copies).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mma::shared_address(bar)), "r"(arrivals)
               : "memory");
}
// Makes initialised mbarriers visible to the async proxy (the TMA unit); then a block barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Orders this thread's view of shared memory (after a block barrier: everyone's earlier generic
// reads and writes) before async-proxy writes it issues next (a stage refilled by TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// The issuing thread's arrival, announcing `bytes` to come from the copies of this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mma::shared_address(bar)),
               "r"(bytes)
               : "memory");
}
// One plain arrival (release: this thread's, and after a __syncwarp its warp's, earlier shared-memory
// reads are ordered before the phase completes), e.g. a consumer warp handing a stage back.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mma::shared_address(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed (all its bytes landed).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(mma::shared_address(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst` in one
// bulk copy, completing on `bar` (whose phase expects them: mbarrier_arrive_expect_tx).
__device__ __forceinline__ void load_bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   mma::shared_address(dst)),
               "l"(src), "r"(bytes), "r"(mma::shared_address(bar))
               : "memory");
}
// The box of `map` whose first element is (column x, row y) → dst (row-major box, 128-byte aligned),
// completing on `bar`. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void load_tile_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          mma::shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(mma::shared_address(bar)), "r"(x), "r"(y)
      : "memory");
}

// The box of `map` whose first element has coordinates c0 … c4 (innermost dimension first, the
// order of the map's dimensions) → shared-memory address `dst` (the .shared window, as
// mma::shared_address gives it; 128-byte aligned, and aligned to the swizzle's repeat where the map
// swizzles), completing on `bar`. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void load_tile_5d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                             int c4, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(mma::shared_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
// Fetches `map` (a __grid_constant__ kernel parameter) into the TMA unit's descriptor cache ahead of
// its first copy.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// --- host ---------------------------------------------------------------------------------------

// cuTensorMapEncodeTiled through the runtime's driver entry point, looked up once; nullptr where the
// driver has no tensor-map support.
inline PFN_cuTensorMapEncodeTiled_v12000 tiled_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050  // the versioned query (the unversioned one is deprecated from 12.5 on)
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t status = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A map of the row-major float32 tensor [rows, cols] at `base` (rows `row_stride` floats apart),
// copied in boxes of box_rows × box_cols. False (and the map unusable) where the TMA's rules are not
// met: base 16-byte aligned, row stride a multiple of 16 bytes, box_cols·4 a multiple of 16, boxes of
// at most 256 rows and columns — or where the driver has no tensor-map support. `swizzle` permutes the
// 16-byte pieces of each box row in shared memory by the row's address bits (CUTLASS's Swizzle<b,4,3>:
// 32B: byte-address bit 4 ^= bit 7; 64B: bits 4-5 ^= bits 7-8), so that a column read across rows
// spreads over the banks; the box row must then fit the swizzle's span.
inline bool encode_tile_map(CUtensorMap* map, const float* base, int64_t rows, int64_t cols, int64_t row_stride,
                            int box_rows, int box_cols,
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tiled_map_encoder();
  if (encode == nullptr || rows <= 0 || cols <= 0 || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      (row_stride * 4) % 16 != 0 || (box_cols * 4) % 16 != 0 || box_rows > 256 || box_cols > 256) {
    return false;
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride) * 4};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace hybridtb::cuda::tma
