// SSM modes of the CUDA backend: the small interface a GPU mode implements, the registry that
// finds GPU modes by name, and the driver that runs one over a batch — mirroring the reference's
// (reference/include/hybridtb/reference/ssm_mode.h).
//
// A GPU mode only does the math of its requests, on the device: the driver (ssm_driver.cpp) does
// everything batch-shaped exactly as the reference driver does (which slot each request reads and
// writes per mamba_cache_mode, zeros without an initial state, padding slots −1 skipped — never
// read or written —, block-boundary writes of mode all, zero contributions for skipped rows) and
// hands the mode a GpuStep: the hidden rows, the contribution rows, the pools and weights (any of
// float32/float16/bfloat16), the per-token boundary slots, and the requests in waves (requests of
// one wave touch disjoint slots, so they run in parallel; waves run in order — the reference's
// sequential order whenever two requests share a slot).
//
// Adding a GPU mode is its file(s) in optimized/src/ssm/ plus one line in gpu_modes.cpp. A mode of
// the reference registry without a GPU mode is reported NotSupported by the cuda backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/device_memory.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/tensor.h"
#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

// Throws Error naming the cuBLAS call `what` unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what);

// The device resources of the SSM branch, owned by the backend: its stream, scratch memory from
// the backend's caching allocator (no cudaMalloc once the size classes are warm), a cuBLAS handle
// (created on first use, bound to the stream with its own workspace).
class SsmContext {
 public:
  SsmContext(DeviceMemory& memory, cudaStream_t stream) : memory_(memory), stream_(stream) {}
  ~SsmContext();
  SsmContext(const SsmContext&) = delete;
  SsmContext& operator=(const SsmContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas();
  // Scratch device memory valid until end_step() (then returned to the cache; the stream orders
  // its reuse after the kernels that used it).
  void* scratch(size_t bytes);
  template <typename T>
  T* scratch_of(int64_t count) {
    return static_cast<T*>(scratch(static_cast<size_t>(count) * sizeof(T)));
  }
  // Copies `values` to fresh scratch memory (stream-ordered) and returns the device pointer.
  template <typename T>
  T* upload(const std::vector<T>& values) {
    if (values.empty()) return nullptr;
    T* device = scratch_of<T>(static_cast<int64_t>(values.size()));
    upload_bytes(device, values.data(), values.size() * sizeof(T));
    return device;
  }
  void end_step() { step_blocks_.clear(); }

 private:
  void upload_bytes(void* device, const void* host, size_t bytes);
  DeviceMemory& memory_;
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<void> cublas_workspace_;
  std::vector<std::shared_ptr<void>> step_blocks_;
};

// A weight as the mode sees it: device data, element kind, shape (contiguous).
struct GpuWeight {
  WeightRef ref;
  Shape shape;
};

// The requests of one wave: on the device (WaveRef) and on the host (for mode-side planning).
struct GpuWave {
  WaveRef device;
  std::vector<GpuRequest> host;
};

struct GpuStep {
  const AttentionConfig* config = nullptr;
  SsmContext* context = nullptr;
  int64_t num_tokens = 0;       // T = num_actual_tokens
  int64_t hidden_size = 0;      // H = num_heads · head_size
  int64_t num_decode_tokens = 0;
  RowsRef hidden;               // query[:T] viewed as [T, H]
  RowsRef contribution;         // [T, H] in the backend's output dtype
  std::map<std::string, PoolRef> pools;       // by the mode's pool names
  std::map<std::string, GpuWeight> weights;   // present weights by name (absent optional ones missing)
  const int32_t* active = nullptr;         // device [T]: 1 if the token's request runs this step
  const int32_t* boundary_slot = nullptr;  // device [T]: −1, or the slot the state after row t goes to
  std::vector<GpuBoundary> boundaries;     // host: every block-boundary write (mode all), by request
  std::vector<GpuWave> waves;

  const GpuWeight* weight(const std::string& name) const {
    const auto it = weights.find(name);
    return it == weights.end() ? nullptr : &it->second;
  }
};

class GpuMode {
 public:
  virtual ~GpuMode() = default;
  virtual std::string name() const = 0;  // the reference mode it implements
  // Checks what this implementation supports (sizes, dtypes) before anything runs; throws
  // NotSupported naming the limit. Default: everything.
  virtual void check_supported(const GpuStep& /*step*/) const {}
  // Whole-step modes (zero, prefix_sum_flat) return true: they write every row [0, T) of the
  // contribution themselves and the driver plans no requests.
  virtual bool whole_step() const { return false; }
  // Runs the step: per-request modes write the contribution rows of the wave requests' tokens and
  // the states (final and step.boundary_slot); the driver zero-fills the other rows.
  virtual void forward(const GpuStep& step) const = 0;
};

class GpuModeRegistry {
 public:
  static GpuModeRegistry& instance();  // filled with the built-in GPU modes on first use
  void add(std::unique_ptr<GpuMode> mode);
  const GpuMode* find(const std::string& name) const;  // nullptr if none
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<GpuMode>> modes_;
};

// Defined in gpu_modes.cpp: one line per mode.
void register_builtin_gpu_modes(GpuModeRegistry& registry);

// ElementKind of a model/pool/weight dtype; throws NotSupported naming `what` for other dtypes.
ElementKind gpu_element_kind(DType dtype, const std::string& what);

// Runs config.ssm_mode over the batch on the GPU (device tensors): writes rows [0, num_actual_tokens)
// of `contribution` ([T, Hq, D] contiguous) and updates tensors.ssm_state in place. Throws
// NotSupported (with the mode's name) for a mode without a GPU implementation; Error (naming the
// field) for a bad batch, before any kernel runs.
void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, SsmContext& context);

}  // namespace hybridtb::cuda::ssm

// One-line registration (gpu_modes.cpp): declares make_<name>_gpu_mode() and adds what it makes.
#define HYBRIDTB_GPU_SSM_MODE(registry, name)                                                \
  do {                                                                                       \
    extern std::unique_ptr<::hybridtb::cuda::ssm::GpuMode> make_##name##_gpu_mode();         \
    (registry).add(make_##name##_gpu_mode());                                                \
  } while (0)
