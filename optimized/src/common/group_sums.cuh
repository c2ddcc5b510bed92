// Sums over the lanes of a lane group by warp shuffles, for the SSM decode updates: a group of
// kLanes consecutive lanes (a power of two ≤ 32, groups aligned within the warp) holds one state row
// split over its lanes, each lane a partial sum per row, and the row's dot product is the sum over
// the group. Every lane of the warp must take part in each call. Fixed orders: bitwise
// reproducible; floating-point addition being commutative, every lane that ends with a sum holds
// the same bits.
#pragma once

#include <cuda_runtime.h>

namespace hybridtb::cuda {

// The sum of x over the group, in every lane of it (an xor tree).
template <int kLanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// group_sum of each of x[0 … kCount), in place: kCount trees, interleaved level by level so that
// their shuffles overlap instead of queueing tree after tree (kCount·log2 kLanes shuffles).
template <int kLanes, int kCount>
__device__ __forceinline__ void group_sums(float (&x)[kCount]) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int s = 0; s < kCount; ++s) x[s] += __shfl_xor_sync(0xffffffffu, x[s], offset);
  }
}

// The lane of a group that holds sum r after group_sums_scattered<kLanes, kCount>: lanes
// r·kLanes/kCount … (r + 1)·kLanes/kCount − 1 of the group all do.
template <int kLanes, int kCount>
__device__ __forceinline__ int scattered_sum_index(int lane_in_group) {
  if constexpr (kCount <= kLanes) {
    return lane_in_group / (kLanes / kCount);
  } else {
    return 0;  // not scattered (see below)
  }
}

// The group sums of x[0 … kCount) (kCount a power of two), scattered over the group: returns, in
// lane l of the group, the sum of x[scattered_sum_index(l)]. Each halving level sends half of the
// lane's remaining values to its partner and adds the half it receives (the lower lanes keep the
// lower indices), so the kCount sums cost kCount − 1 shuffles, then log2(kLanes / kCount) for the
// last tree, instead of kCount·log2 kLanes. With kCount > kLanes it falls back to group_sums and
// returns x[0]'s sum; callers then read x[·] (see group_sums_all).
template <int kLanes, int kCount>
__device__ __forceinline__ float group_sums_scattered(float (&x)[kCount]) {
  if constexpr (kCount > kLanes) {
    group_sums<kLanes, kCount>(x);
    return x[0];
  } else {
    const int lane = static_cast<int>(threadIdx.x) % kLanes;
#pragma unroll
    for (int n = kCount, offset = kLanes / 2; n > 1; n /= 2, offset /= 2) {
      const bool upper = (lane & offset) != 0;
#pragma unroll
      for (int j = 0; j < n / 2; ++j) {
        const float send = upper ? x[j] : x[j + n / 2];
        const float keep = upper ? x[j + n / 2] : x[j];
        x[j] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
      }
    }
    return group_sum<kLanes / kCount>(x[0]);
  }
}

// The group sums of x[0 … kCount) in every lane, in place: group_sums_scattered, then each sum
// fetched from a lane that holds it (kCount − 1 + log2(kLanes / kCount) + kCount shuffles instead
// of kCount·log2 kLanes). The same bits as the scattered sums.
template <int kLanes, int kCount>
__device__ __forceinline__ void group_sums_all(float (&x)[kCount]) {
  if constexpr (kCount > kLanes) {
    group_sums<kLanes, kCount>(x);
  } else {
    const float mine = group_sums_scattered<kLanes, kCount>(x);
    const int group_base = static_cast<int>(threadIdx.x) % 32 / kLanes * kLanes;
#pragma unroll
    for (int r = 0; r < kCount; ++r) x[r] = __shfl_sync(0xffffffffu, mine, group_base + r * (kLanes / kCount));
  }
}

}  // namespace hybridtb::cuda
