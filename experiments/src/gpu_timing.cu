// gpu_timing.h on CUDA: compiled only when the build has CUDA (experiments/CMakeLists.txt).
// Reuses the ceiling kernels and the event loop of the attention benchmark
// (optimized/bench/bench_kernels.cu, event_timer.h) so both benchmarks measure the same ceilings.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "bench/bench_kernels.h"
#include "bench/event_timer.h"
#include "common/cuda_check.h"
#include "gpu_timing.h"

namespace hybridtb::bench::gpu {

namespace {

// nvbench's blocking kernel: holds the stream until the host sets *release (host-mapped memory),
// so the step's work is all enqueued before any of it runs. Gives up after timeout_ns (a step that
// waits on the GPU inside its enqueue would otherwise deadlock) and says so in *timed_out.
__global__ void gate_kernel(const volatile int* release, unsigned long long timeout_ns, volatile int* timed_out) {
  unsigned long long t0 = 0;
  unsigned long long t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*release == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > timeout_ns) {
      *timed_out = 1;
      return;
    }
  }
}

constexpr unsigned long long kGateTimeoutNs = 2'000'000'000ull;  // 2 s

}  // namespace

bool available(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (reason != nullptr) {
      *reason = std::string("no CUDA device: ") +
                (status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount returned 0");
    }
    return false;
  }
  return true;
}

DeviceInfo device_info() {
  int device = 0;
  HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  HYBRIDTB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.sms = prop.multiProcessorCount;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  int l2 = 0;
  HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  info.l2_bytes = l2;
  const cuda::bench::DeviceFacts facts = cuda::bench::device_facts();  // the kernel benchmarks' query
  info.max_sm_clock_mhz = facts.max_sm_clock_mhz;
  info.max_mem_clock_mhz = facts.max_mem_clock_mhz;
  info.driver_version = facts.cuda_driver_version;
  info.runtime_version = facts.cuda_runtime_version;
  return info;
}

Ceilings measure_ceilings() {
  cudaStream_t stream = nullptr;
  HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Ceilings c;
  // Sizes as the attention benchmark uses (far beyond L2), capped to a quarter of the memory.
  size_t free_bytes = 0, total_bytes = 0;
  HYBRIDTB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t read_bytes = std::min<int64_t>(int64_t{4} << 30, static_cast<int64_t>(free_bytes / 4));
  const int64_t copy_bytes = std::min<int64_t>(int64_t{2} << 30, static_cast<int64_t>(free_bytes / 8));
  c.read_GBps = cuda::bench::measure_read_bandwidth(read_bytes, 10, stream) / 1e9;
  c.copy_GBps = cuda::bench::measure_copy_bandwidth(copy_bytes, 10, stream) / 1e9;
  c.gemm_TFLOPs = cuda::bench::measure_bf16_gemm_tflops(stream);
  HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream));
  HYBRIDTB_CUDA_CHECK(cudaStreamDestroy(stream));
  return c;
}

struct L2Flusher::Impl {
  cuda::bench::ReadFlusher flusher;
};

L2Flusher::L2Flusher() : impl_(std::make_unique<Impl>()) {}

L2Flusher::~L2Flusher() = default;

void L2Flusher::flush() {
  // Persisting-L2 lines would survive the flush (nvbench PR #459); nothing here sets any, but a
  // backend might, so reset them too (harmless when none).
  cudaCtxResetPersistingL2Cache();
  impl_->flusher.flush(nullptr);
  HYBRIDTB_CUDA_CHECK(cudaDeviceSynchronize());
}

struct StepTimer::Impl {
  cudaStream_t stream = nullptr;  // the backend's stream if known, else a helper stream
  bool native = false;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  int* gate = nullptr;       // host-mapped: [0] release, [1] timed out
  int* gate_device = nullptr;
  std::chrono::steady_clock::time_point host_start;
  double latency_s = 0;
  bool gate_timed_out = false;
};

StepTimer::StepTimer(void* native_stream) : impl_(std::make_unique<Impl>()) {
  impl_->native = native_stream != nullptr;
  if (impl_->native) {
    impl_->stream = static_cast<cudaStream_t>(native_stream);
    HYBRIDTB_CUDA_CHECK(cudaHostAlloc(&impl_->gate, 2 * sizeof(int), cudaHostAllocMapped));
    HYBRIDTB_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->gate_device), impl_->gate, 0));
  } else {
    HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  }
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&impl_->start));
  HYBRIDTB_CUDA_CHECK(cudaEventCreate(&impl_->stop));
}

StepTimer::~StepTimer() {
  cudaEventDestroy(impl_->start);
  cudaEventDestroy(impl_->stop);
  if (impl_->native) {
    cudaFreeHost(impl_->gate);
  } else {
    cudaStreamDestroy(impl_->stream);
  }
}

void StepTimer::start() {
  Impl& t = *impl_;
  if (!t.native) HYBRIDTB_CUDA_CHECK(cudaDeviceSynchronize());
  if (t.native) {
    // The GPU is idle (the caller's restore and flush synchronize): hold the stream at the gate.
    t.gate[0] = 0;
    t.gate[1] = 0;
    gate_kernel<<<1, 1, 0, t.stream>>>(t.gate_device, kGateTimeoutNs, t.gate_device + 1);
    HYBRIDTB_CUDA_CHECK(cudaGetLastError());
  }
  HYBRIDTB_CUDA_CHECK(cudaEventRecord(t.start, t.stream));
  t.host_start = std::chrono::steady_clock::now();
}

double StepTimer::stop_seconds() {
  Impl& t = *impl_;
  if (!t.native) HYBRIDTB_CUDA_CHECK(cudaDeviceSynchronize());
  HYBRIDTB_CUDA_CHECK(cudaEventRecord(t.stop, t.stream));
  if (t.native) {
    const auto enqueued = std::chrono::steady_clock::now();
    reinterpret_cast<volatile int*>(t.gate)[0] = 1;  // release: the step runs back to back
    HYBRIDTB_CUDA_CHECK(cudaEventSynchronize(t.stop));
    float ms = 0.0f;
    HYBRIDTB_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
    t.gate_timed_out = reinterpret_cast<volatile int*>(t.gate)[1] != 0;
    // Issued alone, the step would have taken its host enqueue plus its GPU time.
    t.latency_s = std::chrono::duration<double>(enqueued - t.host_start).count() + static_cast<double>(ms) * 1e-3;
    return static_cast<double>(ms) * 1e-3;
  }
  HYBRIDTB_CUDA_CHECK(cudaEventSynchronize(t.stop));
  float ms = 0.0f;
  HYBRIDTB_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
  t.latency_s = static_cast<double>(ms) * 1e-3;
  return t.latency_s;
}

double StepTimer::last_latency_seconds() const { return impl_->latency_s; }
bool StepTimer::last_gate_timed_out() const { return impl_->gate_timed_out; }

double measure_sm_clock_mhz() { return ::hybridtb::cuda::bench::measure_sm_clock_mhz(); }

}  // namespace hybridtb::bench::gpu
