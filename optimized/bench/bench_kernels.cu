// Device helpers of the benchmarks (see bench_kernels.h).
#include "bench/bench_kernels.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench/event_timer.h"
#include "common/cuda_check.h"

namespace hybridtb::cuda::bench {

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Element i of the fills of `seed`: a sum of four uniforms from a hash of (seed, i), centred and
// scaled: mean 0, variance 1, never exactly 0 in practice.
__device__ __forceinline__ float normal_like(uint64_t seed, int64_t i) {
  const uint64_t h = mix(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i));
  float s = 0.0f;
  for (int k = 0; k < 4; ++k) s += static_cast<float>((h >> (16 * k)) & 0xffff) / 65536.0f;
  return (s - 2.0f) * 1.7320508f + 1e-3f;
}

__global__ void fill_kernel(void* data, int64_t count, bool is_half, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = normal_like(seed, i);
    if (is_half) {
      static_cast<__half*>(data)[i] = __float2half_rn(x);
    } else {
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(x);
    }
  }
}

// 1-byte cache elements: fp8 e4m3 / e5m2 (kind 0 / 1) of the same N(0, 1)-like values, saturated
// (never NaN), or int8 (kind 2) of 32 times them, rounded and clamped to ±127.
__global__ void fill_bytes_kernel(uint8_t* data, int64_t count, int kind, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = normal_like(seed, i);
    if (kind == 2) {
      data[i] = static_cast<uint8_t>(static_cast<int8_t>(fmaxf(-127.0f, fminf(127.0f, rintf(32.0f * x)))));
    } else {
      data[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind == 1 ? __NV_E5M2 : __NV_E4M3);
    }
  }
}

__global__ void read_kernel(const uint4* data, int64_t count, unsigned* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

// ReadFlusher's read: plain loads (cached, so they displace what L2 held).
__global__ void read_flush_kernel(const uint4* p, int64_t count, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // never true for the zero-filled buffer; keeps the loads
}

// One thread spins `cycles` SM cycles and reports them with the %globaltimer nanoseconds they took.
__global__ void clock_kernel(long long cycles, unsigned long long* out) {
  unsigned long long t0 = 0;
  unsigned long long t1 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  long long c1 = c0;
  while (c1 - c0 < cycles) c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  out[0] = static_cast<unsigned long long>(c1 - c0);
  out[1] = t1 - t0;
}


}  // namespace

ReadFlusher::ReadFlusher(int64_t bytes) : bytes_(bytes) {
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&buffer_, static_cast<size_t>(bytes_)));
  HYBRIDTB_CUDA_CHECK(cudaMemset(buffer_, 0, static_cast<size_t>(bytes_)));
}

ReadFlusher::~ReadFlusher() { cudaFree(buffer_); }  // NOLINT: best effort in a destructor

void ReadFlusher::flush(cudaStream_t stream) const {
  read_flush_kernel<<<1056, 256, 0, stream>>>(static_cast<const uint4*>(buffer_),
                                              bytes_ / static_cast<int64_t>(sizeof(uint4)),
                                              static_cast<uint32_t*>(buffer_));
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

DeviceFacts device_facts() {
  int device = 0, sm_khz = 0, mem_khz = 0;
  DeviceFacts facts;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device));
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device));
  HYBRIDTB_CUDA_CHECK(cudaDriverGetVersion(&facts.cuda_driver_version));
  HYBRIDTB_CUDA_CHECK(cudaRuntimeGetVersion(&facts.cuda_runtime_version));
  facts.max_sm_clock_mhz = sm_khz / 1000;
  facts.max_mem_clock_mhz = mem_khz / 1000;
  return facts;
}

double measure_sm_clock_mhz() {
  int device = 0, sm_khz = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0.0;
  if (cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device) != cudaSuccess) return 0.0;
  unsigned long long* out = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&out, 2 * sizeof(unsigned long long)));
  // ~1 ms at the maximum clock: long enough that the timer's granularity (≤ 1 µs) is < 0.1%.
  const long long cycles = static_cast<long long>(sm_khz);  // kHz × 1 ms
  clock_kernel<<<1, 1>>>(cycles, out);
  unsigned long long host[2] = {0, 0};
  const cudaError_t launch = cudaGetLastError();
  if (launch == cudaSuccess) {
    HYBRIDTB_CUDA_CHECK(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
  }
  cudaFree(out);
  HYBRIDTB_CUDA_CHECK(launch);
  return host[1] > 0 ? static_cast<double>(host[0]) / static_cast<double>(host[1]) * 1e3 : 0.0;
}

void fill_normal_16bit(void* data, int64_t count, bool is_half, uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<1024, 256, 0, stream>>>(data, count, is_half, seed);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void fill_bytes(void* data, int64_t count, ByteElement kind, uint64_t seed, cudaStream_t stream) {
  fill_bytes_kernel<<<1024, 256, 0, stream>>>(static_cast<uint8_t*>(data), count, static_cast<int>(kind), seed);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

__device__ unsigned g_read_sink;  // enqueue_read's: a read of live data must not write into it

void enqueue_read(const void* data, int64_t bytes, cudaStream_t stream) {
  HYBRIDTB_CHECK(bytes % 16 == 0, "enqueue_read: ", bytes, " bytes is not a multiple of 16");
  int sms = 0;
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* sink = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&sink), g_read_sink));
  read_kernel<<<sms * 8, 512, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

double measure_read_bandwidth(int64_t bytes, int reps, cudaStream_t stream) {
  void* buffer = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&buffer, static_cast<size_t>(bytes)));
  fill_normal_16bit(buffer, bytes / 2, false, 7, stream);
  const double ms = median_ms(reps, stream, [&] { enqueue_read(buffer, bytes / 16 * 16, stream); }, /*warmup=*/1);
  HYBRIDTB_CUDA_CHECK(cudaFree(buffer));
  return static_cast<double>(bytes) / (ms * 1e-3);
}

double measure_copy_bandwidth(int64_t bytes, int reps, cudaStream_t stream) {
  void* a = nullptr;
  void* b = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(bytes)));
  HYBRIDTB_CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(bytes)));
  fill_normal_16bit(a, bytes / 2, false, 9, stream);
  const double ms = median_ms(reps, stream, [&] {
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
  }, /*warmup=*/1);
  HYBRIDTB_CUDA_CHECK(cudaFree(a));
  HYBRIDTB_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

CopyCeiling best_copy_bandwidth(int64_t bytes, int reps, int rounds, cudaStream_t stream) {
  CopyCeiling ceiling;
  for (int round = 0; round < rounds; ++round) {
    ceiling.rounds_Bps.push_back(measure_copy_bandwidth(bytes, reps, stream));
    ceiling.best_Bps = std::max(ceiling.best_Bps, ceiling.rounds_Bps.back());
  }
  return ceiling;
}

std::string CopyCeiling::rounds_json() const {
  std::string json = "[";
  for (const double bw : rounds_Bps) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", bw);
    json += (json.size() > 1 ? ", " : "") + std::string(text);
  }
  return json + "]";
}

namespace {

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { HYBRIDTB_CUDA_CHECK(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

double measure_bf16_gemm_tflops(cudaStream_t stream) {
  const int n = 8192;
  const size_t bytes = static_cast<size_t>(n) * n * 2;
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill_normal_16bit(a.ptr, static_cast<int64_t>(n) * n, false, 1, stream);
  fill_normal_16bit(b.ptr, static_cast<int64_t>(n) * n, false, 2, stream);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw hybridtb::Error("cublasCreate failed");
  cublasSetStream(handle, stream);
  const float alpha = 1.0f;
  const float beta = 0.0f;
  auto run = [&] {
    const cublasStatus_t status =
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.ptr, CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n,
                     &beta, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS) throw hybridtb::Error("cublasGemmEx failed");
  };
  double ms = 0;
  try {
    ms = median_ms(10, stream, run, /*warmup=*/2);
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  cublasDestroy(handle);
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) / 1e12;
}

}  // namespace hybridtb::cuda::bench
