// Device helpers of the benchmarks (bench_kernels.cu; hybridtb_bench_attention, _ssm, _linear and
// experiments/'s GPU timing): random fills, the ceilings measured in the same run, the L2 flush by a
// read, the SM clock. Host-only header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hybridtb::cuda::bench {

// Fills `count` bfloat16 / float16 (is_half) elements with N(0, 1)-like values from a hash of
// (seed, index): never zeros, reproducible.
void fill_normal_16bit(void* data, int64_t count, bool is_half, uint64_t seed, cudaStream_t stream);

// Fills `count` 1-byte cache elements with the same N(0, 1)-like values rounded to fp8 (saturating,
// never NaN), or with int8 values of 32 times them (clamped to ±127).
enum class ByteElement { kFp8E4M3 = 0, kFp8E5M2 = 1, kInt8 = 2 };
void fill_bytes(void* data, int64_t count, ByteElement kind, uint64_t seed, cudaStream_t stream);

// Median over `reps` of a read-only streaming kernel over `bytes` (16-byte loads): bytes/s.
double measure_read_bandwidth(int64_t bytes, int reps, cudaStream_t stream);
// Enqueues that streaming read over the first `bytes` of `data` (a multiple of 16) on `stream`: one
// launch reading a case's own bytes, which pays the launch, ramp and tail that any one-launch read of
// that size pays (the read ceiling above, over 4 GiB, spreads them thin).
void enqueue_read(const void* data, int64_t bytes, cudaStream_t stream);
// Median over `reps` of cudaMemcpyAsync device-to-device of `bytes`, counting read + write: bytes/s.
double measure_copy_bandwidth(int64_t bytes, int reps, cudaStream_t stream);
// The copy ceiling the SSM benches report: the best of `rounds` rounds of measure_copy_bandwidth (a
// round now and then comes in several % low, which would flatter every "% of bound"), and each
// round's figure for the JSON.
struct CopyCeiling {
  double best_Bps = 0.0;
  std::vector<double> rounds_Bps;
  std::string rounds_json() const;  // rounds_Bps as a JSON array
};
CopyCeiling best_copy_bandwidth(int64_t bytes, int reps, int rounds, cudaStream_t stream);
// Evicts the L2 by reading a zero-filled buffer (`bytes`, default 256 MiB: far more than any L2) in
// 16-byte words: the lines it leaves are clean, so no write-back competes with the timed kernel that
// follows, as it would after a memset flush. flush() enqueues the read on `stream`.
class ReadFlusher {
 public:
  explicit ReadFlusher(int64_t bytes = int64_t{256} << 20);
  ~ReadFlusher();
  ReadFlusher(const ReadFlusher&) = delete;
  ReadFlusher& operator=(const ReadFlusher&) = delete;
  void flush(cudaStream_t stream) const;

 private:
  void* buffer_ = nullptr;
  int64_t bytes_ = 0;
};

// What a recorded result carries about the current device besides cudaDeviceProp: the maximum clocks it
// reports (cudaDeviceGetAttribute; CUDA 13 removed cudaDeviceProp::clockRate) and the driver and
// runtime versions. The clocks are the maximum ones: a throttled run shows as a lower achieved
// bandwidth against the same-run ceiling, and as a lower measure_sm_clock_mhz().
struct DeviceFacts {
  int max_sm_clock_mhz = 0;
  int max_mem_clock_mhz = 0;
  int cuda_driver_version = 0;
  int cuda_runtime_version = 0;
};
DeviceFacts device_facts();

// The SM clock right now, in MHz: a one-thread kernel spins ~1 ms of clock64() cycles, divided by the
// %globaltimer nanoseconds they took (nvbench's method; no NVML). 0 if the device cannot say.
double measure_sm_clock_mhz();

// Median over 10 runs (after 2 warm-ups) of a cuBLAS bf16 GEMM 8192³ with float32 accumulation: TFLOP/s.
// The tensor-core ceiling of hybridtb_bench_attention and hybridtb_bench.
double measure_bf16_gemm_tflops(cudaStream_t stream);

}  // namespace hybridtb::cuda::bench
