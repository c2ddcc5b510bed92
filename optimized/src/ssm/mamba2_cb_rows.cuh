// The mamba2 chunk scans' staging of a t tile's C·Bᵀ rows (Mamba2Params::chunk_cb), by cp.async in
// flight over the scan's first product: one copy for mamba2_kernels.cu's mma.sync chunk scan and
// mamba2_scan_wgmma.cu's warpgroup-MMA one, which read the rows the same way.
#pragma once

#include <cstdint>

#include "common/mma.cuh"
#include "ssm/mamba2_kernels.h"
#include "ssm/pool_quads.cuh"

namespace hybridtb::cuda::ssm {

// Rows t0 … t0 + kRows − 1 of chunk c's C·Bᵀ for group g (Mamba2Params::chunk_cb: [kQ][kQ] float32
// per chunk and group, meaningful at s ≤ t) → shared float rows dst + (t − t0)·stride, by the
// cp.async of a block of kThreads threads (this one: tid), committed as one group. Only rows
// t < length and of them the quads holding columns s ≤ t are copied (the causal part, all the
// scan reads); the rest of dst is not written. 16-byte copies where the chunk's rows are 16-byte
// aligned (kQ is a multiple of 4: all rows are where the first is), else 4-byte copies.
template <int kRows, int kThreads>
__device__ __forceinline__ void copy_cb_rows_async(float* dst, int stride, const Mamba2Params& p, int c, int g, int t0,
                                                   int length, int tid) {
  constexpr int kQ = kMamba2ChunkTokens;
  const float* cb = p.chunk_cb + (int64_t{c} * p.groups + g) * kQ * kQ;
  constexpr int kQuadsPerRow = kQ / 4;
  static_assert(kQ % 4 == 0, "whole quads per row");
  const bool quads = aligned16(cb);
  for (int e = tid; e < kRows * kQuadsPerRow; e += kThreads) {
    const int i = e / kQuadsPerRow, s = 4 * (e % kQuadsPerRow);
    const int t = t0 + i;
    if (t >= length || s > t) continue;
    const float* from = cb + t * kQ + s;
    const uint32_t to = mma::shared_address(dst + i * stride + s);
    if (quads) {
      mma::cp_async_16(to, from, true);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) mma::cp_async_4(to + 4u * k, from + k, true);
    }
  }
  mma::cp_async_commit();
}

}  // namespace hybridtb::cuda::ssm
