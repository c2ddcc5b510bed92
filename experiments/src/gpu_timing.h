// The CUDA side of hybridtb_bench, behind a host-only header (no CUDA types): device facts, the
// ceilings measured once per run, L2 flushing, CUDA-event step timing and the SM clock check.
// gpu_timing.cu implements it when the build has CUDA; gpu_timing_unavailable.cpp otherwise
// (available() is false with the reason, so GPU cases are skipped visibly).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace hybridtb::bench::gpu {

// True if this build has CUDA and a device is usable; otherwise false and *reason says why.
bool available(std::string* reason);

struct DeviceInfo {
  std::string name;          // "NVIDIA H200"
  int sms = 0;
  int64_t memory_bytes = 0;
  int64_t l2_bytes = 0;
  int max_sm_clock_mhz = 0;  // cudaDevAttrClockRate: the maximum (boost) SM clock
  int max_mem_clock_mhz = 0;
  int driver_version = 0;
  int runtime_version = 0;
};
DeviceInfo device_info();

struct Ceilings {
  double read_GBps = 0;   // streaming read kernel (optimized/bench/bench_kernels.cu)
  double copy_GBps = 0;   // cudaMemcpy device to device, read + write counted
  double gemm_TFLOPs = 0; // cuBLAS bf16 GEMM 8192³, fp32 accumulation
};
// Measures the three ceilings (about a second). Call before the cases allocate their memory.
Ceilings measure_ceilings();

// Evicts the L2 by writing a buffer of twice its size (cudaMemsetAsync), then synchronizes the
// device, so each timed step starts from a cold L2 as a real serving step (other layers ran before).
class L2Flusher {
 public:
  L2Flusher();
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush();

 private:
  void* buffer_ = nullptr;
  int64_t bytes_ = 0;
};

// CUDA-event timing of one step run through the Backend interface.
//
// The interface does not expose the backend's stream (the cuda backend runs on its own non-blocking
// stream), so by default start() synchronizes the device and records the start event on an idle
// GPU, and stop() synchronizes the device again before recording the stop event: the time is the
// step's GPU time plus the host-side enqueue of its launches and one synchronization (a few µs;
// it matters for steps of tens of µs, see experiments/README.md). With `native_stream` (a
// cudaStream_t, for a backend that exposes its stream one day) the events bracket the work on that
// stream only, with no device synchronization: pure GPU time.
class StepTimer {
 public:
  explicit StepTimer(void* native_stream = nullptr);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;
  void start();
  double stop_seconds();  // waits for the stop event

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The SM clock right now, in MHz: a one-thread kernel spins ~1 ms and divides the clock64() cycles
// by the %globaltimer nanoseconds (nvbench's method; no NVML needed). Returns 0 if unavailable.
double measure_sm_clock_mhz();

}  // namespace hybridtb::bench::gpu
