// Plain data shared by the GPU SSM driver (host, C++20) and the SSM kernels (.cu, C++17): the
// per-request plan the driver uploads, and views of the step's token rows and state pools.
// Host-only POD, no CUDA types; sizes and strides in elements.
#pragma once

#include <cstdint>

#include "kv_cache_write/kv_cache_write_params.h"  // ElementKind

namespace hybridtb::cuda::ssm {

// The flag of each token row of a step (GpuStep::active: int32 [T] on the device).
inline constexpr int32_t kRowPadding = -1;  // CUDA-graph padding (t >= num_actual_tokens): never written
inline constexpr int32_t kRowSkipped = 0;   // a row of a request that does not run (padding slot): zeros
inline constexpr int32_t kRowActive = 1;    // a row the mode writes (a running request's token; whole-step
                                            // modes: a decode row, t < num_decode_tokens)

// One request the driver runs this step. Its tokens are rows [begin, end) of the step. The eager
// driver lists only requests that run; a fixed decode step (FixedDecodeStep) lists every request
// of the batch, padding and skipped ones as empty entries (begin == end, slots −1) that every
// kernel skips.
struct GpuRequest {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t read_slot = -1;   // slot holding the initial state; −1: start from zeros
  int32_t write_slot = -1;  // slot receiving the state after the last token
  int32_t decode = 0;       // 1: a single decode token (the single-step update)
  int32_t first_boundary = 0;  // mode all: its block-boundary writes are
  int32_t num_boundaries = 0;  //   boundaries[first_boundary, first_boundary + num_boundaries)
  int32_t unused = 0;
};

// mamba_cache_mode all: the state after token row `token` (inclusive) is written to `slot`.
struct GpuBoundary {
  int32_t token = 0;
  int32_t slot = 0;
};

// Token rows of a [T, H] activation (the query viewed flat, or a contribution).
struct RowsRef {
  void* data = nullptr;
  ElementKind kind = ElementKind::kFloat32;
  int64_t row_stride = 0;  // elements between consecutive tokens
};

// A state pool [num_slots, slot_size...] (contiguous): slot s starts at s·slot_size.
struct PoolRef {
  void* data = nullptr;
  ElementKind kind = ElementKind::kFloat32;
  int64_t slot_size = 0;
};

// A weight (contiguous, any float kind), or absent (data == nullptr: optional weight missing).
struct WeightRef {
  const void* data = nullptr;
  ElementKind kind = ElementKind::kFloat32;
};

// The requests of one wave, on the device (see ssm_driver.cpp: requests of one wave touch
// disjoint state slots, so they run in parallel; waves run in order).
struct WaveRef {
  const GpuRequest* requests = nullptr;  // [num_requests]
  int32_t num_requests = 0;
  int32_t max_tokens = 0;  // longest request of the wave (a fixed decode step: 1, whatever the batch)
};

}  // namespace hybridtb::cuda::ssm
