// Launchers of the SSM kernels (ssm_kernels.cu: shared and simple modes; mamba1_kernels.cu and
// mamba1_decode.cu: mamba1's scan and decode update, whose conv is causal_conv.h). C++17, no CUDA
// headers beyond the runtime's stream type; every launcher checks its launch
// (HYBRIDTB_CUDA_CHECK_LAUNCH) and throws hybridtb::Error on failure.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

// --- shared by every mode (the driver and the hybrid forward) ------------------------------------

// Which rows launch_zero_rows zeroes, by their flag (ssm_params.h): kSkipped: rows flagged
// kRowSkipped (requests that do not run); kAllButPadding: rows flagged kRowSkipped or kRowActive.
// Rows flagged kRowPadding are never written.
enum class ZeroRows : int32_t { kSkipped = 0, kAllButPadding = 1 };

// Rows t in [begin, num_tokens) selected by `which` through their flag get a zero contribution;
// flags == nullptr: rows [begin, num_tokens) all get zeros.
void launch_zero_rows(const RowsRef& rows, int64_t width, int64_t begin, int64_t num_tokens, const int32_t* flags,
                      ZeroRows which, cudaStream_t stream);

// output[t] = attn[t] + ssm[t] for rows [0, num_tokens), each of `width` elements, rounded once to
// output's dtype (the hybrid forward's separate add pass, BackendSettings::fuse_hybrid_add = false;
// by default the attention epilogue does the add).
void launch_add_rows(const RowsRef& output, const RowsRef& attn, const RowsRef& ssm, int64_t width,
                     int64_t num_tokens, cudaStream_t stream);

// dst[s, c, r] = src[s, r, c] for `slots` contiguous [rows, cols] slots of `element_bytes`-byte
// elements (2 or 4): a plain copy, bit for bit (the SD ↔ DS conv-state layouts).
void launch_transpose_slots(const void* src, void* dst, int element_bytes, int64_t slots, int64_t rows, int64_t cols,
                            cudaStream_t stream);

// Converts `count` contiguous elements of `kind` to float32 (exact).
void launch_to_float(const void* src, ElementKind kind, float* dst, int64_t count, cudaStream_t stream);
// Converts rows [0, rows) × `width` of a row-strided tensor to float32 rows `dst_stride` apart
// (0: dense, [rows, width]).
void launch_rows_to_float(const RowsRef& src, int64_t width, int64_t rows, float* dst, cudaStream_t stream,
                          int64_t dst_stride = 0);

// --- affine column scans: prefix_sum, ema, prefix_sum_flat -----------------------------------------
// Per request and column c: h_t = g_c·h_{t−1} + b_t, contribution_t = h_t, with
//   kSum: g = 1, b = x (prefix_sum; prefix_sum_flat with one pseudo-request and no state);
//   kEma: g = a_c, b = (1 − a_c)·x.
// Parallel over tokens within a request: token lanes scan their sub-chunks from zero, the block
// composes the lanes' (Π g, local h) in order to get each lane's carry-in (starting from the
// request's saved state), and the lanes rescan from their carry, writing contributions, the
// block-boundary states and the final state.
enum class AffineKind : int32_t { kSum = 0, kEma = 1 };

struct AffineScanParams {
  AffineKind kind = AffineKind::kSum;
  RowsRef hidden;        // [T, H]
  RowsRef contribution;  // [T, H]
  int64_t width = 0;     // H
  WaveRef wave;          // requests == nullptr: one pseudo-request [single_begin, single_end), no state
  int32_t single_begin = 0;
  int32_t single_end = 0;
  PoolRef pool;                   // data == nullptr: no state (prefix_sum_flat)
  const int32_t* boundary_slot = nullptr;  // [T] −1 or the slot receiving the state after row t (optional)
  WeightRef decay;                // kEma: a [H]
  // (optional) [T] row flags: only rows flagged kRowActive get their contribution stored (the
  // fixed-shape prefix_sum_flat scans all T rows; padding rows are trailing, so they never feed an
  // earlier row's value).
  const int32_t* row_flags = nullptr;
};
void launch_affine_scan(const AffineScanParams& p, cudaStream_t stream);

// --- mamba1 (mamba1_kernels.cu, mamba1_decode.cu) --------------------------------------------------

struct Mamba1Params {
  int32_t I = 0, N = 0, R = 0;
  int64_t num_tokens = 0;
  // The wave's requests. The scan's decode launch skips empty entries (begin == end): a fixed decode step lists padding and skipped requests so.
  WaveRef wave;
  // The wave's decodes are requests [0, decode_end), its prefills [prefill_begin, num_requests) (the
  // driver lists decodes first); the scan launches one kernel for each non-empty range, and each
  // kernel skips a request of the other kind should the ranges overlap.
  int32_t decode_end = 0;
  int32_t prefill_begin = 0;
  const int32_t* boundary_slot = nullptr;  // [T]
  // Activations (float32, dense).
  const float* xz = nullptr;      // [T, 2I] in_proj output without bias (the scan reads z)
  const float* c = nullptr;       // [T, I] conv output after SiLU (causal_conv.h)
  const float* dbc = nullptr;     // [T, R + 2N] x_proj output
  const float* dt = nullptr;      // [T, I] dt_proj output without bias
  float* y = nullptr;             // [T, I] gated scan output
  // Weights.
  WeightRef in_bias, dt_bias, A_log, D;  // in_bias [2I]: the scan adds its z half
  // Pools.
  PoolRef ssm_state;
};
inline constexpr int kMamba1MaxState = 64;     // state_size ≤ 64 (Mamba-1: 16)

// Selective scan of the wave: one launch for the decodes (the single-step update, bandwidth-bound),
// one for the prefills (each block walks a request over a tile of channels, one exp per
// token·channel·state: the sequential scan for N = 16, the tile scan otherwise); gating fused;
// block-boundary and final states written. One launch configuration per state-size class.
void launch_mamba1_scan(const Mamba1Params& p, cudaStream_t stream);
// Columns [first_column, first_column + width) of a float32 [T, row_stride] matrix (a tensor-parallel
// rank's heads of the summed contribution; all of it otherwise: first_column 0, row_stride width).
struct FloatColumns {
  const float* data = nullptr;
  int64_t row_stride = 0;
  int64_t first_column = 0;
};
// contribution[t][c] = out[t][first_column + c] + out_bias[first_column + c], c < width, for rows
// t < num_tokens flagged kRowActive; other rows are not written. `contribution` may be `out` itself
// (float32, row stride row_stride, first_column 0): each element is read, then written, by one thread.
void launch_bias_rows(const RowsRef& contribution, const FloatColumns& out, WeightRef bias, int64_t width,
                      int64_t num_tokens, const int32_t* flags, cudaStream_t stream);

}  // namespace hybridtb::cuda::ssm
