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

// Evicts the L2 before a timed step (the attention benchmark's ReadFlusher: a 256 MiB read of
// zeros, whose clean lines leave no write-back to compete with the step, as a memset's dirty ones
// would), then synchronizes the device, so each timed step starts from a cold L2 as a real serving
// step (other layers ran before).
class L2Flusher {
 public:
  L2Flusher();
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush();

 private:
  struct Impl;  // the ReadFlusher (gpu_timing.cu)
  std::unique_ptr<Impl> impl_;
};

// CUDA-event timing of one step run through the Backend interface.
//
// With the backend's stream (`native_stream`, Backend::native_stream) the timer works as nvbench
// does: start() enqueues a gate kernel that holds the stream, the caller enqueues the step, and
// stop_seconds() releases the gate and returns the events' interval — the step's GPU time alone,
// its kernels back to back, free of host jitter. last_latency_seconds() adds the host time the
// enqueue took (planning, uploads, launches): the latency of the step issued alone, which is what
// a CUDA graph shortens. A step that waits for the GPU while being enqueued would hold the gate
// until its 2 s timeout; last_gate_timed_out() reports it (the time is then not the GPU's alone).
// Without a stream, start() synchronizes the device and records on a helper stream, and
// stop_seconds() synchronizes again: host enqueue + GPU time + one wake-up, for both figures.
class StepTimer {
 public:
  explicit StepTimer(void* native_stream = nullptr);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;
  void start();
  double stop_seconds();  // waits for the stop event
  double last_latency_seconds() const;
  bool last_gate_timed_out() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The SM clock right now, in MHz: a one-thread kernel spins ~1 ms and divides the clock64() cycles
// by the %globaltimer nanoseconds (nvbench's method; no NVML needed). Returns 0 if unavailable.
double measure_sm_clock_mhz();

}  // namespace hybridtb::bench::gpu
