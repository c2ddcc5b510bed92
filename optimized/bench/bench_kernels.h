// Device helpers of the attention benchmark (bench_kernels.cu): random fills and the bandwidth
// ceiling measured in the same run. Host-only header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hybridtb::cuda::bench {

// Fills `count` bfloat16 / float16 (is_half) elements with N(0, 1)-like values from a hash of
// (seed, index): never zeros, reproducible.
void fill_normal_16bit(void* data, int64_t count, bool is_half, uint64_t seed, cudaStream_t stream);

// Median over `reps` of a read-only streaming kernel over `bytes` (16-byte loads): bytes/s.
double measure_read_bandwidth(int64_t bytes, int reps, cudaStream_t stream);
// Median over `reps` of cudaMemcpyAsync device-to-device of `bytes`, counting read + write: bytes/s.
double measure_copy_bandwidth(int64_t bytes, int reps, cudaStream_t stream);
// Median over 10 runs (after 2 warm-ups) of a cuBLAS bf16 GEMM 8192³ with float32 accumulation: TFLOP/s.
// The tensor-core ceiling of hybridtb_bench_attention and hybridtb_bench.
double measure_bf16_gemm_tflops(cudaStream_t stream);

}  // namespace hybridtb::cuda::bench
