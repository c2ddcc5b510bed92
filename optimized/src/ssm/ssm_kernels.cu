// Kernels shared by the GPU SSM modes (zero rows, the hybrid add pass, conversions) and the affine
// column scan of prefix_sum, ema and prefix_sum_flat (ssm_kernels.h). float32 arithmetic, fixed
// orders, no atomics: bitwise reproducible.
//
// The row kernels walk [T, width] token rows of any float kind (RowsRef: a row stride in elements),
// rows over blockIdx.y and columns over threads, so that a warp reads contiguous elements of a row.
// The affine scan is per column and request: a block holds 32 columns of one request (threadIdx.x,
// coalesced) × up to 32 token lanes (threadIdx.y), so that a long request is scanned in parallel over
// its tokens — each lane scans its run from zero, the lanes' (Π g, h) pairs are composed in order
// through shared memory (padded rows: no bank conflicts), and each lane rescans from its carry-in —
// instead of one thread walking all of the request's tokens.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/cuda_check.h"
#include "common/elements.cuh"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

constexpr int kThreads = 256;

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }

int blocks_for(int64_t n, int per_block = kThreads) {
  return static_cast<int>(std::max<int64_t>(1, (n + per_block - 1) / per_block));
}

__global__ void zero_rows_kernel(RowsRef rows, int64_t width, int64_t begin, int64_t num_tokens, const int32_t* flags,
                                 ZeroRows which) {
  for (int64_t t = begin + blockIdx.y; t < num_tokens; t += gridDim.y) {
    if (flags != nullptr) {
      const int32_t flag = flags[t];
      if (flag == kRowPadding || (flag == kRowActive && which == ZeroRows::kSkipped)) continue;
    }
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < width; c += int64_t{gridDim.x} * blockDim.x) {
      store_element(rows.data, t * rows.row_stride + c, rows.kind, 0.0f);
    }
  }
}

__global__ void add_rows_kernel(RowsRef out, RowsRef a, RowsRef b, int64_t width, int64_t num_tokens) {
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < width; c += int64_t{gridDim.x} * blockDim.x) {
      const float sum =
          load_element(a.data, t * a.row_stride + c, a.kind) + load_element(b.data, t * b.row_stride + c, b.kind);
      store_element(out.data, t * out.row_stride + c, out.kind, sum);
    }
  }
}

template <typename T>
__global__ void transpose_slots_kernel(const T* src, T* dst, int64_t slots, int64_t rows, int64_t cols) {
  const int64_t per_slot = rows * cols;
  const int64_t total = slots * per_slot;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = i / per_slot;
    const int64_t rc = i - s * per_slot;
    const int64_t r = rc / cols;
    const int64_t c = rc - r * cols;
    dst[s * per_slot + c * rows + r] = src[i];
  }
}

__global__ void to_float_kernel(const void* src, ElementKind kind, float* dst, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = load_element(src, i, kind);
  }
}

__global__ void rows_to_float_kernel(RowsRef src, int64_t width, int64_t rows, float* dst, int64_t dst_stride) {
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < width; c += int64_t{gridDim.x} * blockDim.x) {
      dst[t * dst_stride + c] = load_element(src.data, t * src.row_stride + c, src.kind);
    }
  }
}

// One block per (request, 32 columns); threadIdx.x = column, threadIdx.y = token lane (≤ 32).
__global__ void __launch_bounds__(1024) affine_scan_kernel(AffineScanParams p) {
  __shared__ float lane_gain[32][33];
  __shared__ float lane_local[32][33];
  __shared__ float initial[32];
  const int tx = threadIdx.x;
  const int lane = threadIdx.y;
  const int lanes = blockDim.y;
  const int64_t col = blockIdx.x * int64_t{32} + tx;
  const bool in_range = col < p.width;
  int32_t begin = p.single_begin, end = p.single_end, read_slot = -1, write_slot = -1;
  if (p.wave.requests != nullptr) {
    const GpuRequest r = p.wave.requests[blockIdx.y];
    begin = r.begin;
    end = r.end;
    read_slot = r.read_slot;
    write_slot = r.write_slot;
  }
  const int32_t length = end - begin;
  const int32_t per_lane = (length + lanes - 1) / lanes;
  const int32_t t0 = min(end, begin + lane * per_lane);
  const int32_t t1 = min(end, t0 + per_lane);
  const float g = (p.kind == AffineKind::kEma && in_range) ? load_element(p.decay.data, col, p.decay.kind) : 1.0f;
  const float one_minus_g = 1.0f - g;

  // Pass 1: each lane's sub-chunk from a zero state: (Π g, local h).
  float gain = 1.0f, local = 0.0f;
  if (in_range) {
    for (int32_t t = t0; t < t1; ++t) {
      const float x = load_element(p.hidden.data, t * p.hidden.row_stride + col, p.hidden.kind);
      local = p.kind == AffineKind::kEma ? g * local + one_minus_g * x : local + x;
      gain *= g;
    }
  }
  lane_gain[lane][tx] = gain;
  lane_local[lane][tx] = local;
  // Every read of the pool happens before the barrier; every write after it (read and write slots
  // may coincide, and in mode all a block-boundary slot may be the slot read).
  if (lane == 0) {
    initial[tx] = (in_range && p.pool.data != nullptr && read_slot >= 0)
                      ? load_element(p.pool.data, read_slot * p.pool.slot_size + col, p.pool.kind)
                      : 0.0f;
  }
  __syncthreads();
  if (!in_range) return;
  // This lane's carry-in: the lanes before it composed in order.
  float h = initial[tx];
  for (int k = 0; k < lane; ++k) h = lane_gain[k][tx] * h + lane_local[k][tx];
  // Pass 2: rescan from the carry, writing contributions and states.
  for (int32_t t = t0; t < t1; ++t) {
    const float x = load_element(p.hidden.data, t * p.hidden.row_stride + col, p.hidden.kind);
    h = p.kind == AffineKind::kEma ? g * h + one_minus_g * x : h + x;
    if (p.row_flags == nullptr || p.row_flags[t] == kRowActive) {
      store_element(p.contribution.data, t * p.contribution.row_stride + col, p.contribution.kind, h);
    }
    if (p.pool.data != nullptr) {
      const int32_t boundary = p.boundary_slot != nullptr ? p.boundary_slot[t] : -1;
      if (boundary >= 0) store_element(p.pool.data, boundary * p.pool.slot_size + col, p.pool.kind, h);
      if (t == end - 1 && write_slot >= 0) store_element(p.pool.data, write_slot * p.pool.slot_size + col, p.pool.kind, h);
    }
  }
}

}  // namespace

void launch_zero_rows(const RowsRef& rows, int64_t width, int64_t begin, int64_t num_tokens, const int32_t* flags,
                      ZeroRows which, cudaStream_t stream) {
  if (num_tokens <= begin || width == 0) return;
  const dim3 grid(blocks_for(std::min<int64_t>(width, 4 * kThreads)), row_blocks(num_tokens - begin));
  zero_rows_kernel<<<grid, kThreads, 0, stream>>>(rows, width, begin, num_tokens, flags, which);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_add_rows(const RowsRef& output, const RowsRef& attn, const RowsRef& ssm, int64_t width,
                     int64_t num_tokens, cudaStream_t stream) {
  if (num_tokens <= 0 || width == 0) return;
  const dim3 grid(blocks_for(std::min<int64_t>(width, 4 * kThreads)), row_blocks(num_tokens));
  add_rows_kernel<<<grid, kThreads, 0, stream>>>(output, attn, ssm, width, num_tokens);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_transpose_slots(const void* src, void* dst, int element_bytes, int64_t slots, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  const int64_t total = slots * rows * cols;
  if (total <= 0) return;
  const int blocks = std::min(blocks_for(total), 4096);
  if (element_bytes == 4) {
    transpose_slots_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst),
                                                           slots, rows, cols);
  } else {
    transpose_slots_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst),
                                                           slots, rows, cols);
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_to_float(const void* src, ElementKind kind, float* dst, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  to_float_kernel<<<std::min(blocks_for(count), 4096), kThreads, 0, stream>>>(src, kind, dst, count);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_rows_to_float(const RowsRef& src, int64_t width, int64_t rows, float* dst, cudaStream_t stream,
                          int64_t dst_stride) {
  if (rows <= 0 || width == 0) return;
  const dim3 grid(blocks_for(std::min<int64_t>(width, 4 * kThreads)), row_blocks(rows));
  rows_to_float_kernel<<<grid, kThreads, 0, stream>>>(src, width, rows, dst, dst_stride > 0 ? dst_stride : width);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void launch_affine_scan(const AffineScanParams& p, cudaStream_t stream) {
  const int32_t requests = p.wave.requests != nullptr ? p.wave.num_requests : 1;
  const int32_t longest = p.wave.requests != nullptr ? p.wave.max_tokens : p.single_end - p.single_begin;
  if (requests <= 0 || longest <= 0 || p.width == 0) return;
  int lanes = 1;
  while (lanes < 32 && lanes < longest) lanes *= 2;
  const dim3 grid(static_cast<unsigned>((p.width + 31) / 32), static_cast<unsigned>(requests));
  affine_scan_kernel<<<grid, dim3(32, lanes), 0, stream>>>(p);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda::ssm
