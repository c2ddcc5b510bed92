// SSM modes of the CUDA backend: the small interface a GPU mode implements, the registry that
// finds GPU modes by name, and the driver that runs one over a batch — each GPU mode implements the
// descriptor of the same name (hybridtb/spec/ssm_mode.h), as the reference's float64 modes do.
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
// A decode-only step (no prefills, no speculative decoding) runs as a fixed-shape step
// (FixedDecodeStep, below): one wave holding every request of the batch, padding and skipped ones
// as empty entries, per-row flags that mark CUDA-graph padding rows, grids from the padded sizes
// only, and every buffer allocated once — so its launches can be captured into a CUDA graph and
// replayed after re-planning a new batch of the same shape. ssm_forward runs eager decode steps
// through it too, so an eager step and a replayed one run the same launches.
//
// The same driver runs a per-layer model's linear-attention layers (config.layer_kind gdn or mamba2,
// linear_attention_forward below): the plan is the same, the GpuStep carries the layer's own inputs
// (linear_inputs) instead of the hidden rows, and the mode's linear_forward runs its core alone.
//
// Adding a GPU mode is its file(s) in optimized/src/ssm/ plus one line in gpu_modes.cpp. A mode of
// the descriptor registry without a GPU mode is reported NotSupported by the cuda backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/device_memory.h"
#include "common/kernel_attributes.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tensor_parallel_group.h"
#include "ssm/ssm_params.h"

namespace hybridtb::cuda::ssm {

// Throws Error naming the cuBLAS call `what` unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what);

// The device resources of the SSM branch, owned by the backend: its stream, scratch memory from
// the backend's caching allocator (no cudaMalloc once the size classes are warm), a cuBLAS handle
// (created on first use, bound to the stream with its own workspace), and the device's compute
// capability, queried once at construction (the current device then: the backend's), which decides
// the code a launch may take (ComputeCapability::is_hopper: sm_90a code) with no query per launch.
class SsmContext {
 public:
  SsmContext(DeviceMemory& memory, cudaStream_t stream);
  ~SsmContext();
  SsmContext(const SsmContext&) = delete;
  SsmContext& operator=(const SsmContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  DeviceMemory& memory() { return memory_; }
  // The tensor-parallel group of a rank's backend (BackendSettings::tp_group), or null.
  TensorParallelGroup* tp_group() const { return tp_group_; }
  void set_tp_group(TensorParallelGroup* group) { tp_group_ = group; }
  const ComputeCapability& compute_capability() const { return compute_capability_; }
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
  ComputeCapability compute_capability_;
  TensorParallelGroup* tp_group_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<void> cublas_workspace_;
  std::vector<std::shared_ptr<void>> step_blocks_;
};

// The scratch of a fixed decode step: the k-th request of a launch gets the k-th block, allocated
// by the first launch and kept until destruction, so every later launch (and a CUDA graph captured
// from one) uses the same addresses. A later request for more bytes than the first one got throws
// Error (a fixed step's scratch sizes depend only on its shape).
class ScratchBlocks {
 public:
  explicit ScratchBlocks(DeviceMemory& memory) : memory_(memory) {}
  void rewind() { next_ = 0; }  // at the start of each launch
  void* get(size_t bytes);

 private:
  DeviceMemory& memory_;
  std::vector<std::shared_ptr<void>> blocks_;
  std::vector<size_t> sizes_;
  size_t next_ = 0;
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

// How the chunked prefills run: BackendSettings' ssm_prefill_operands, ssm_prefill_wgmma and
// ssm_prefill_fused_state_pass, as the backend passes them down.
struct SsmPrefillChoice {
  SsmPrefillOperands operands = SsmPrefillOperands::kFloat32;  // the products' operands
  // false: mamba2's 16-bit chunk states and chunk scan and gdn's 16-bit state pass on mma.sync
  // where the device would take wgmma (Mamba2Params::chunk_wgmma, GdnParams::state_wgmma).
  bool wgmma = true;
  // false: mamba2's chunk states and state passing as two kernels where one would run them
  // (Mamba2Params::fuse_state_passing).
  bool fused_state_pass = true;
};

// What a GPU mode's forward gets. Two forms:
//  - eager (ssm_forward, fixed == false): num_tokens = num_actual_tokens; `active` flags rows
//    kRowActive / kRowSkipped; the waves list only requests that run, on the device and the host;
//  - fixed (FixedDecodeStep, fixed == true): num_tokens = T, the padded row count; `active` also
//    flags padding rows kRowPadding (never to be written); exactly one wave whose device table
//    holds all R requests of the batch (empty entries: begin == end, slots −1; max_tokens 1) and
//    whose host list is empty; no boundaries; num_decode_tokens 0. Everything per step lives in
//    the device buffers, so forward must launch the same kernels with the same grids whatever the
//    batch, must not upload (context->upload) and must take scratch from scratch() only.
struct GpuStep {
  const AttentionConfig* config = nullptr;
  SsmContext* context = nullptr;
  bool fixed = false;           // a fixed decode step (above)
  int64_t num_tokens = 0;       // T: num_actual_tokens (eager) or the padded row count (fixed)
  int64_t hidden_size = 0;      // H = num_heads · head_size (a tensor-parallel rank: tp_size · that)
  int64_t num_decode_tokens = 0;  // eager only
  RowsRef hidden;               // query[:T] viewed as [T, H] (the SSM branch; empty for a linear layer);
                                // a tensor-parallel rank's: ssm_hidden, every head's row
  RowsRef contribution;         // [T, output_width] in the backend's output dtype: the branch's
                                // contribution, or a linear layer's output
  int64_t output_width = 0;     // the SSM branch: num_heads · head_size (= H but on a tensor-parallel
                                // rank, which writes its heads' columns); linear_layer_spec(config).output_width
  // A linear layer's inputs by name (linear_layer.h: gdn mixed_qkv, a, b; mamba2 xBC, dt), [T, width].
  std::map<std::string, RowsRef> linear_inputs;
  std::map<std::string, PoolRef> pools;       // by the mode's pool names
  // Pools stored transposed (the conv state in the engine's SD layout, [slots, K−1, channels]): the
  // kernels work on [slots, channels, K−1]. Their PoolRef points at a scratch copy that run_mode
  // (ssm_driver.cpp) transposes in before the mode and back after it, so every mode's kernels see
  // the one layout they implement; both transposes are plain copies (same bits).
  struct TransposedPool {
    std::string name;
    void* stored = nullptr;  // the pool as the batch holds it, [slots, rows, cols]
    int element_bytes = 4;
    int64_t slots = 0, rows = 0, cols = 0;
  };
  std::vector<TransposedPool> transposed_pools;
  std::map<std::string, GpuWeight> weights;   // present weights by name (absent optional ones missing)
  // device [T] row flags (ssm_params.h): kRowActive for rows of requests that run (whole-step
  // modes: decode rows), kRowSkipped for rows of skipped requests, kRowPadding (fixed only) for
  // CUDA-graph padding rows.
  const int32_t* active = nullptr;
  const int32_t* boundary_slot = nullptr;  // device [T]: −1, or the slot the state after row t goes to (eager)
  std::vector<GpuBoundary> boundaries;     // host: every block-boundary write (mode all), by request
  std::vector<GpuWave> waves;
  ScratchBlocks* fixed_scratch = nullptr;  // fixed: where scratch() comes from
  // How the chunked prefills run (mamba2's SSD prefill and gdn's chunked WY prefill read it, the
  // other modes ignore it). A fixed decode step has no prefill.
  SsmPrefillChoice prefill;

  const GpuWeight* weight(const std::string& name) const {
    const auto it = weights.find(name);
    return it == weights.end() ? nullptr : &it->second;
  }
  // The weight as the kernels take it, or an absent WeightRef (data == nullptr) for an optional
  // weight the batch does not have.
  WeightRef weight_ref(const std::string& name) const {
    const GpuWeight* w = weight(name);
    return w != nullptr ? w->ref : WeightRef{};
  }
  // Scratch device memory for this step's launches: the context's per-step scratch (eager), or
  // the fixed step's blocks, the same on every launch (fixed).
  void* scratch(size_t bytes) const {
    return fixed_scratch != nullptr ? fixed_scratch->get(bytes) : context->scratch(bytes);
  }
  template <typename T>
  T* scratch_of(int64_t count) const {
    return static_cast<T*>(scratch(static_cast<size_t>(count) * sizeof(T)));
  }
};

class GpuMode {
 public:
  virtual ~GpuMode() = default;
  virtual std::string name() const = 0;  // the mode descriptor it implements
  // Checks what this implementation supports (sizes, dtypes) before anything runs; throws
  // NotSupported naming the limit. Default: everything.
  virtual void check_supported(const GpuStep& /*step*/) const {}
  // Whole-step modes (zero, prefix_sum_flat) return true: they write every row [0, T) of the
  // contribution themselves and the driver plans no requests.
  virtual bool whole_step() const { return false; }
  // True if forward() calls cuBLAS (FixedDecodeStep::prepare creates the handle up front, so that
  // nothing is created while a launch is captured).
  virtual bool uses_cublas() const { return false; }
  // Runs the step (either form, see GpuStep): per-request modes write the contribution rows of the
  // wave requests' tokens and the states (final and step.boundary_slot); the driver zero-fills the
  // rows flagged kRowSkipped. Whole-step modes write every row not flagged kRowPadding.
  virtual void forward(const GpuStep& step) const = 0;
  // A linear-attention layer of this mode (step.config->layer_kind names it): the mode's core alone
  // over step.linear_inputs (no projections, no norm), written to step.contribution for the rows
  // flagged kRowActive, with the states as forward() writes them. Default: NotSupported.
  virtual void linear_forward(const GpuStep& step) const;
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
// field) for a bad batch, before any kernel runs. A step for which is_fixed_decode_step is true
// runs through a temporary FixedDecodeStep (prepare + launch: the launches a replayed CUDA graph
// runs, so the same bits), unless two of its requests share a state slot or the query has fewer
// rows than the batch's padded token count (then the wave driver runs it, as every other step).
// prefill: how the chunked prefills run (BackendSettings' ssm_prefill_* fields; GpuStep::prefill).
void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution, SsmContext& context,
                 const SsmPrefillChoice& prefill = {});

// A linear-attention layer (config.layer_kind gdn or mamba2; Backend::linear_attention_forward) on
// the GPU: the mode's core over tensors.linear_inputs ([T, width] each, any float dtype), its state
// pools tensors.ssm_state and core weights tensors.weights (spec linear_layer_tensor_specs),
// writing rows [0, num_actual_tokens) of `output` ([T, linear_layer_spec(config).output_width]
// contiguous); requests with a padding slot get zero rows and touch no state. The same planning,
// checks, errors and fixed decode steps as ssm_forward.
void linear_attention_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                              const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
                              SsmContext& context, const SsmPrefillChoice& prefill = {});

// True if this step runs as a fixed-shape decode step: config.ssm_mode has a GPU mode, the
// metadata has no prefills, and no speculative decoding (num_speculative_tokens == 0). Every request
// then has at most one token; trailing padding requests have none.
bool is_fixed_decode_step(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                          const BatchDescription& batch);

struct PlannedStep;  // ssm_driver.cpp: a checked step and its per-request plan

// A decode-only SSM step of fixed shape (T = batch.num_tokens() rows including CUDA-graph padding,
// R = batch.num_reqs() request entries including padding requests) for config's SSM branch or, for
// a linear-attention layer config, the layer's core: every buffer its launches read is allocated
// once, so a launch can be captured into a CUDA graph and replayed after each later plan of a new
// batch of the same shape.
//
// Device plan (one buffer, one stream-ordered upload per plan): int32 [T] row flags (kRowActive
// for the token of a request that runs, kRowSkipped for the token of a request skipped for a
// padding slot, kRowPadding for rows t >= num_actual_tokens; whole-step modes: kRowActive for
// t < num_decode_tokens), then R GpuRequest entries, entry r for request r: {row, row + 1,
// read slot or −1, write slot} if it runs, else empty {0, 0, −1, −1}. The mode runs this as one
// wave of R entries with max_tokens 1; every kernel skips empty entries and honours the flags.
// The plan depends on the batch and the metadata only, so one plan serves every layer of a step
// (prepare_plan + launch_on, the cuda backend's CUDA-graph lifecycle); prepare + launch bind one
// set of tensors for the step's life (a captured single-layer step).
//
// Lifetime: the object owns the plan buffer and the scratch (from the context's allocator; shared by
// the launches of every layer, which run in stream order) and must outlive every CUDA graph captured
// from a launch; the tensors of a captured launch must stay allocated as long. The SsmContext (its
// stream, cuBLAS handle and workspace) must outlive it; every step of one context shares that handle
// and workspace, so their launches (and graphs) must run in order on the context's stream. Not
// copyable or movable.
class FixedDecodeStep {
 public:
  // Keeps a copy of `config`. Throws NotSupported (as ssm_forward) if config.ssm_mode has no GPU mode.
  FixedDecodeStep(const AttentionConfig& config, SsmContext& context);
  FixedDecodeStep(const FixedDecodeStep&) = delete;
  FixedDecodeStep& operator=(const FixedDecodeStep&) = delete;

  // Validates and plans the step with exactly the rules and errors of ssm_forward (or
  // linear_attention_forward; the per-request plan: hybridtb/spec/ssm_plan.h), then
  // uploads the plan (stream-ordered, the context's stream) into device buffers allocated on the
  // first call. No kernel runs. `output` is the SSM contribution ([T, Hq, D]) or a linear layer's
  // output ([T, output_width]). Later calls must have the same T, R and the same tensors (query or
  // linear inputs, output, pool and weight data pointers) — otherwise Error naming what changed.
  // Requests sharing a state slot (the driver would need two waves) → NotSupported naming the
  // slot; a step that is_fixed_decode_step rejects → NotSupported saying why. Creates the cuBLAS
  // handle (if the mode uses one) so that nothing is created during a capture. A call that throws
  // uploads nothing: the previous plan stays.
  void prepare(const MambaAttentionMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
               const TensorView& output);
  // Enqueues the step's kernels and cuBLAS calls on the tensors of the first prepare(). Throws
  // Error before prepare().
  void launch();

  // The plan alone: every check of prepare() that needs no tensor, then the upload. Same T and R
  // on later calls (Error otherwise); a call that throws uploads nothing.
  void prepare_plan(const MambaAttentionMetadata& metadata, const BatchDescription& batch);
  // Enqueues the step over `tensors` and `output` (any tensors of this config: one layer's),
  // reading the last plan: the tensors are checked as ssm_forward checks them, and against the
  // plan (at least T rows; every planned slot inside the pools) before anything is enqueued. Reads
  // only the plan buffer and scratch it allocates on its first call and keeps for the object's
  // life; makes no host→device copy, so it can be captured into a CUDA graph (in
  // cudaStreamCaptureModeRelaxed, which allows the first call's scratch allocations).
  void launch_on(const StepTensors& tensors, const TensorView& output);

  int64_t num_tokens() const { return num_tokens_; }  // T (after the first prepare)
  int64_t num_reqs() const { return num_reqs_; }      // R (after the first prepare)

 private:
  // The eager driver (ssm_driver.cpp: ssm_forward and linear_attention_forward) hands a step it has
  // already checked and planned straight to these.
  friend void run_ssm_step(const AttentionConfig&, const MambaAttentionMetadata&, const BatchDescription&,
                           const StepTensors&, const TensorView&, SsmContext&, const SsmPrefillChoice&);
  void upload_plan(const PlannedStep& planned, const MambaAttentionMetadata& metadata, const BatchDescription& batch);
  // Launches the mode on `bound`; then the zero pass over the rows flagged kRowSkipped. A step that
  // may be captured into a graph always has the pass (a replay may bring skipped rows); the eager
  // driver runs its step once (may_be_captured false) and has the pass only if the uploaded plan
  // skips a row.
  void launch_planned(PlannedStep& bound, bool may_be_captured = true);

  AttentionConfig config_;
  SsmContext& context_;
  ScratchBlocks scratch_;
  bool prepared_ = false;
  int64_t num_tokens_ = 0;  // T
  int64_t num_reqs_ = 0;    // R
  int64_t max_slot_ = -1;   // the largest state slot the last plan reads or writes (−1: none)
  bool any_skipped_rows_ = false;  // the last plan has a row t < num_actual_tokens that no request runs
  const GpuMode* gpu_mode_ = nullptr;
  // A tensor the launches read or write, as the first prepare saw it (later ones must match).
  struct TensorKey {
    std::string name;  // "/inputs/query", "the SSM contribution", "/inputs/ssm/<pool>", "/weights/<name>"
    const void* data = nullptr;
    ElementKind kind = ElementKind::kFloat32;
    int64_t extent = 0;  // row stride (rows), slot size (pools), elements (weights)
    bool operator==(const TensorKey&) const = default;
  };
  std::vector<TensorKey> tensors_;  // of the first prepare()
  std::optional<StepTensors> bound_tensors_;
  TensorView bound_output_;
  std::shared_ptr<void> plan_;   // device [T flags | R GpuRequest]
  std::vector<int32_t> packed_;  // its host image
};

}  // namespace hybridtb::cuda::ssm

// One-line registration (gpu_modes.cpp): declares make_<name>_gpu_mode() and adds what it makes.
#define HYBRIDTB_GPU_SSM_MODE(registry, name)                                                \
  do {                                                                                       \
    extern std::unique_ptr<::hybridtb::cuda::ssm::GpuMode> make_##name##_gpu_mode();         \
    (registry).add(make_##name##_gpu_mode());                                                \
  } while (0)
