// gpu_timing.h in a build without CUDA: available() says so, and every GPU case is skipped with
// that reason before any other function here is reached (they throw if called anyway).
#include "gpu_timing.h"

#include "hybridtb/error.h"

namespace hybridtb::bench::gpu {

namespace {
[[noreturn]] void no_cuda() { throw Error("hybridtb_bench was built without CUDA"); }
}  // namespace

bool available(std::string* reason) {
  if (reason != nullptr) *reason = "this build has no CUDA (configure with -DHYBRIDTB_CUDA=ON on a machine with nvcc)";
  return false;
}
DeviceInfo device_info() { no_cuda(); }
Ceilings measure_ceilings() { no_cuda(); }
struct L2Flusher::Impl {};
L2Flusher::L2Flusher() { no_cuda(); }
L2Flusher::~L2Flusher() = default;
void L2Flusher::flush() { no_cuda(); }
struct StepTimer::Impl {};
StepTimer::StepTimer(void* /*native_stream*/) { no_cuda(); }
StepTimer::~StepTimer() = default;
void StepTimer::start() { no_cuda(); }
double StepTimer::stop_seconds() { no_cuda(); }
double StepTimer::last_latency_seconds() const { no_cuda(); }
bool StepTimer::last_gate_timed_out() const { no_cuda(); }
double measure_sm_clock_mhz() { return 0.0; }

}  // namespace hybridtb::bench::gpu
