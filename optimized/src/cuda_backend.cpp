// The "cuda" backend: hybridtb::Backend on one NVIDIA GPU. The plan (build_metadata) is the shared
// builders' host-side plain data (hybridtb/spec/metadata_builders.h), as in vLLM; the run phase is the KV-cache write kernel,
// the attention kernels (decode fast path + generic path, attention/attention_plan.h), the SSM
// branch and the linear-attention layers (ssm/ssm_gpu_mode.h: the GPU driver and one GPU mode per
// mode descriptor), all on one stream, with device memory from a caching allocator — both shared by
// the backends of one model's layer kinds (create_sibling; PerLayerBackend).
// Checked against the reference by tests/cuda; `hybridtb run --backend cuda` runs a batch file.
//
// CUDA graphs, two ways, both on DecodeShapePlan (the device plan of one padded decode shape:
// fixed-shape attention work lists, KV-write slots, the fixed SSM decode step; re-planned with
// stream-ordered copies outside the graph, like vLLM's persistent metadata buffers, while every
// pointer a kernel node holds stays valid and unchanged):
//  - capture_decode_step: one layer's step captured on its own (CudaStepGraph owns its plan);
//  - the lifecycle hooks of backend.h (init_graph_state / init_capture_metadata /
//    init_replay_metadata, pymllm's): the backend keeps one plan per captured shape; while one is
//    current ("graph mode") every run call binds its own layer's tensors to it and launches with no
//    upload, so a runner can capture the calls of all layers of a step into one graph.
// Graphs always use the fused hybrid add (the separate add pass would need num_actual_tokens on the
// host).
//
// Output dtype: config.dtype. With an fp8 output scale (decoder layers) the kernels store
// e4m3(clamp(o / output_scale, ±448)) — the value an fp8 store would hold, which every model dtype
// represents exactly — in config.dtype; the reference stores the unrounded clamp.
#include "hybridtb/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_launch.h"
#include "attention/attention_plan.h"
#include "common/cuda_check.h"
#include "common/device_memory.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/kv_cache.h"
#include "hybridtb/spec/metadata_builders.h"
#include "kv_cache_write/kv_cache_write.h"
#ifdef HYBRIDTB_HAVE_NCCL
#include "nccl_group.h"
#endif
#include "ssm/ssm_gpu_mode.h"
#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda {

namespace {

// NOTE: what the kernels implement; checked once at construction (attention_plan.cpp routes rows).
void check_supported(const AttentionConfig& config) {
  if (config.dtype != DType::kFloat32 && config.dtype != DType::kFloat16 && config.dtype != DType::kBFloat16) {
    throw NotSupported(detail::concat("cuda backend: dtype ", to_string(config.dtype),
                                      " (float32, float16 and bfloat16 are implemented)"));
  }
  if (config.head_size > generic_max_head_size()) {
    throw NotSupported(detail::concat("cuda backend: head_size ", config.head_size, " > ",
                                      generic_max_head_size(), " (the generic kernel's shared-memory limit)"));
  }
  // A rank's attention is an ordinary layer of the rank's heads; its SSM branch is sharded for mamba1
  // (all-reduces through the backend's group) and trivially for zero.
  if (config.is_tensor_parallel_rank() && config.has_ssm_branch() && config.ssm_mode != "mamba1" &&
      config.ssm_mode != "zero") {
    throw NotSupported(detail::concat("cuda backend: the SSM branch '", config.ssm_mode, "' of a tensor-parallel rank (",
                                      "tp_rank ", config.tp_rank, " of tp_size ", config.tp_size,
                                      ") has no sharded form (mamba1, zero)"));
  }
}

// An fp8 query (schema 1.3, /inputs/q_scale): not implemented by the kernels, which read the query
// in the model dtype; refused as NotSupported, so parity reports the case as not supported.
void check_query_supported(const StepTensors& tensors) {
  if (tensors.q_scale || (!tensors.query.empty() && is_fp8(tensors.query.dtype()))) {
    throw NotSupported(detail::concat("cuda backend: an fp8 query (/inputs/query ",
                                      tensors.query.empty() ? std::string("?") : std::string(to_string(tensors.query.dtype())),
                                      " with /inputs/q_scale) is not implemented; the kernels read the query in the "
                                      "model dtype"));
  }
}

// The KV-cache write of one call (reshape_and_cache_flash) for its tensors (t token rows): checks
// them and returns the launch parameters without the slots (slot_mapping, num_tokens: upload_kv_slots).
KvWriteParams bind_kv_write(const AttentionConfig& c, int64_t t, const StepTensors& tensors) {
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  const Shape shape{t, hkv, d};
  for (const TensorView* v : {&tensors.key, &tensors.value}) {
    HYBRIDTB_CHECK(v->device() == Device::kCuda && v->shape() == shape && v->dtype() == c.dtype && v->stride(2) == 1,
                   "key and value must be CUDA ", to_string(c.dtype), " ", shape_to_string(shape),
                   " contiguous in the last dimension, got ", v->describe());
  }
  const spec::KvCacheBinding bound = spec::bind_kv_cache(c, tensors, Device::kCuda);
  const TensorView& cache = bound.cache;
  KvWriteParams p{};
  if (bound.format.scaling == spec::KvCacheScaling::kPerTokenHead) {
    p.k_scale_cache = static_cast<float*>(bound.k_scale_cache.data());
    p.v_scale_cache = static_cast<float*>(bound.v_scale_cache.data());
  }
  p.key = tensors.key.data();
  p.value = tensors.value.data();
  p.key_stride_token = tensors.key.stride(0);
  p.key_stride_head = tensors.key.stride(1);
  p.value_stride_token = tensors.value.stride(0);
  p.value_stride_head = tensors.value.stride(1);
  p.kv_cache = cache.data();
  p.cache_stride_block = cache.stride(0);
  p.cache_stride_half = cache.stride(1);
  p.cache_stride_slot = cache.stride(2);
  p.cache_stride_head = cache.stride(3);
  p.num_kv_heads = static_cast<int32_t>(hkv);
  p.head_size = static_cast<int32_t>(d);
  p.block_size = static_cast<int32_t>(c.block_size);
  p.mode = bound.format.scaling == spec::KvCacheScaling::kPerTokenHead ? KvWriteMode::kPerTokenHead
           : bound.format.scaling == spec::KvCacheScaling::kPerTensor  ? KvWriteMode::kFp8PerTensor
                                                                       : KvWriteMode::kCopy;
  p.source = element_kind(c.dtype);
  p.storage = element_kind(bound.format.storage);
  p.k_scale = tensors.k_scale;
  p.v_scale = tensors.v_scale;
  return p;
}

// The slots of token rows [0, rows) — rows ≥ num_actual_tokens as −1 (CUDA-graph padding: the
// kernel skips them) — each checked below cache_slots, uploaded (stream-ordered) into `slots`.
// Returns the device slots (nullptr for rows 0) and sets `largest` to the largest slot (−1: none).
const int64_t* upload_kv_slots(const BatchDescription& batch, int64_t rows, int64_t cache_slots, Workspace& slots,
                               std::vector<int64_t>& staging, cudaStream_t stream, int64_t& largest) {
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= batch.num_tokens(), "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", batch.num_tokens(), "]");
  staging.assign(static_cast<size_t>(rows), kPadSlotId);
  largest = -1;
  for (int64_t i = 0; i < std::min(rows, batch.num_actual_tokens); ++i) {
    const int64_t slot = batch.slot_mapping[static_cast<size_t>(i)];
    HYBRIDTB_CHECK(slot < cache_slots, "slot_mapping[", i, "] = ", slot, " is past the cache's ", cache_slots,
                   " slots");
    staging[static_cast<size_t>(i)] = slot;
    largest = std::max(largest, slot);
  }
  if (rows == 0) return nullptr;
  auto* device_slots = static_cast<int64_t*>(slots.device(static_cast<size_t>(rows) * sizeof(int64_t)));
  // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so `staging` may be reused.
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(device_slots, staging.data(), static_cast<size_t>(rows) * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, stream));
  return device_slots;
}

int64_t cache_slots_of(const AttentionConfig& c, const StepTensors& tensors) {
  return tensors.kv_cache.rank() == 5 ? tensors.kv_cache.size(0) * c.block_size : 0;
}

// Checks the three outputs of hybrid_forward: contiguous CUDA tensors of the query's shape in the
// output dtype (ssm_output only for a layer with an SSM branch).
void check_hybrid_outputs(const AttentionConfig& config, const StepTensors& tensors,
                          const Backend::HybridOutputs& outputs) {
  std::vector<std::pair<const char*, const TensorView*>> views = {{"output", &outputs.output},
                                                                  {"attn_output", &outputs.attn_output}};
  if (config.has_ssm_branch()) views.emplace_back("ssm_output", &outputs.ssm_output);
  for (const auto& [name, view] : views) {
    HYBRIDTB_CHECK(view->device() == Device::kCuda && view->dtype() == config.dtype &&
                       view->shape() == tensors.query.shape() && view->is_contiguous(),
                   "hybrid_forward: ", name, " must be a contiguous CUDA ", to_string(config.dtype), " tensor of the query's shape ",
                   tensors.query.describe(), ", got ", view->describe());
  }
}

// The device resources of one model's backends, shared by the backends of all its layer kinds
// (Backend::create_sibling): one stream (the layers of a step run in order on it, and one graph
// captures them all), one caching allocator, one cuBLAS handle and SSM scratch.
struct CudaDevice {
  CudaDevice() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      throw DeviceUnavailable(detail::concat("cuda backend: no CUDA device: ",
                                 status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount returned 0"));
    }
    int device = 0;
    HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
    HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    memory = std::make_unique<DeviceMemory>();
    ssm = std::make_unique<ssm::SsmContext>(*memory, stream);
  }
  ~CudaDevice() {
    cudaStreamSynchronize(stream);  // NOLINT: best effort in a destructor
    ssm.reset();                    // its cuBLAS handle is bound to the stream
    cudaStreamDestroy(stream);      // NOLINT
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  cudaStream_t stream = nullptr;
  int num_sms = 0;
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<ssm::SsmContext> ssm;  // after memory: destroyed before it
};

// The device plan of one padded decode shape (R requests, T token rows; query_len ≤ 1): what every
// run call of one layer configuration reads while this shape is planned — the attention work lists
// and block table (a fixed-shape AttentionRunner), the KV-write slots, and the fixed SSM decode step
// of the SSM branch or of a linear layer's core. prepare() plans a batch of the shape with
// stream-ordered uploads; the run functions bind one layer's tensors to the plan and enqueue its
// kernels with no upload and no allocation after their first call, so a graph can capture them.
// Every layer's launches share the plan's buffers and scratch: they run in stream order.
class DecodeShapePlan {
 public:
  DecodeShapePlan(const AttentionConfig& config, CudaDevice& device, const BatchDescription& batch)
      : config_(config),
        device_(device),
        slots_(*device.memory),
        num_reqs_(batch.num_reqs()),
        num_tokens_(batch.num_tokens()) {
    if (!config_.is_linear_layer()) {
      attention_ = std::make_unique<AttentionRunner>(config_, *device.memory, device.num_sms);
      attention_->fix_shape(batch);  // NotSupported for steps and layers the decode kernels cannot run
    }
    if (config_.is_linear_layer() || config_.has_ssm_branch()) {
      ssm_ = std::make_unique<ssm::FixedDecodeStep>(config_, *device.ssm);
    }
  }

  int64_t num_reqs() const { return num_reqs_; }
  int64_t num_tokens() const { return num_tokens_; }

  // Plans `batch` (this shape) into the buffers; every check comes before that part's upload. Until
  // a prepare succeeds the run functions refuse to launch.
  void prepare(const HybridMetadata& metadata, const BatchDescription& batch) {
    ready_ = false;
    HYBRIDTB_CHECK(batch.num_tokens() == num_tokens_, "CUDA graph: the batch has ", batch.num_tokens(),
                   " token rows, the graph was captured for ", num_tokens_, " (pad it to that size)");
    HYBRIDTB_CHECK(batch.num_reqs() == num_reqs_, "CUDA graph: the batch has ", batch.num_reqs(),
                   " requests, the graph was captured for ", num_reqs_, " (pad it to that size)");
    if (ssm_) {
      HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", config_.ssm_mode, " needs the Mamba metadata");
      if (!ssm::is_fixed_decode_step(config_, *metadata.mamba, batch)) {
        throw NotSupported(detail::concat("CUDA-graph capture: ", owner(), " of this step has no fixed-shape form ",
                                          "(prefills or speculative decodes)"));
      }
    }
    const cudaStream_t stream = device_.stream;
    if (attention_) attention_->prepare_plan(batch, stream);
    if (ssm_) ssm_->prepare_plan(*metadata.mamba, batch);
    if (attention_) {
      kv_slots_ = upload_kv_slots(batch, num_tokens_, std::numeric_limits<int64_t>::max(), slots_, slot_staging_,
                                  stream, largest_kv_slot_);
    }
    ready_ = true;
  }

  void write_kv_cache(const StepTensors& tensors) {
    require_ready("write_kv_cache");
    KvWriteParams p = bind_kv_write(config_, num_tokens_, tensors);
    const int64_t cache_slots = cache_slots_of(config_, tensors);
    HYBRIDTB_CHECK(largest_kv_slot_ < cache_slots, "the planned slot_mapping reaches slot ", largest_kv_slot_,
                   ", past this kv_cache's ", cache_slots, " slots");
    p.slot_mapping = kv_slots_;
    p.num_tokens = num_tokens_;
    if (num_tokens_ > 0) launch_kv_cache_write(p, device_.stream);
  }

  void attention_forward(const StepTensors& tensors, const TensorView& output, const FusedAdd& fused = {}) {
    require_ready("attention_forward");
    attention_->launch_on(tensors, output, fused, device_.stream);
  }

  // The SSM branch's contribution, or a linear layer's output.
  void ssm_forward(const StepTensors& tensors, const TensorView& output) {
    require_ready(config_.is_linear_layer() ? "linear_attention_forward" : "ssm_forward");
    HYBRIDTB_CHECK(ssm_ != nullptr, "ssm_forward called for a layer without an SSM branch (ssm_mode none)");
    ssm_->launch_on(tensors, output);
  }

  // The SSM branch, then attention with the hybrid add fused into its epilogue.
  void hybrid_forward(const StepTensors& tensors, const Backend::HybridOutputs& outputs) {
    check_hybrid_outputs(config_, tensors, outputs);
    if (ssm_) ssm_forward(tensors, outputs.ssm_output);
    attention_forward(tensors, outputs.attn_output, FusedAdd{ssm_ ? outputs.ssm_output : TensorView(), outputs.output});
  }

 private:
  std::string owner() const {
    return config_.is_linear_layer() ? "layer_kind " + std::string(to_string(config_.layer_kind))
                                     : "the SSM branch (ssm_mode " + config_.ssm_mode + ")";
  }
  void require_ready(const char* call) const {
    HYBRIDTB_CHECK(ready_, call, ": the CUDA-graph plan of this shape was not prepared (its last init_capture_metadata "
                   "or init_replay_metadata failed)");
  }

  const AttentionConfig& config_;
  CudaDevice& device_;
  std::unique_ptr<AttentionRunner> attention_;  // full-attention layers
  std::unique_ptr<ssm::FixedDecodeStep> ssm_;   // the SSM branch, or a linear layer's core
  Workspace slots_;                             // the KV write's slots [T]
  std::vector<int64_t> slot_staging_;
  const int64_t* kv_slots_ = nullptr;
  int64_t largest_kv_slot_ = -1;
  int64_t num_reqs_ = 0;
  int64_t num_tokens_ = 0;
  bool ready_ = false;
};

// One layer's decode step captured on its own (Backend::capture_decode_step): a private plan of the
// batch's shape, the step's launches (KV write, SSM branch, attention with the fused add) recorded
// once on the tensors given; replay() re-plans into the same buffers and launches the graph.
class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(const AttentionConfig& config, CudaDevice& device, const HybridMetadata& metadata,
                const BatchDescription& batch, const StepTensors& tensors, const Backend::HybridOutputs& outputs)
      : config_(config), device_(device), plan_(config_, device, batch), tensors_(tensors), outputs_(outputs) {
    check_hybrid_outputs(config_, tensors, outputs);
    plan_.prepare(metadata, batch);
    capture();
  }

  ~CudaStepGraph() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);  // NOLINT: best effort in a destructor
    if (graph_ != nullptr) cudaGraphDestroy(graph_);    // NOLINT
  }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void replay(const HybridMetadata& metadata, const BatchDescription& batch) override {
    plan_.prepare(metadata, batch);
    HYBRIDTB_CUDA_CHECK(cudaGraphLaunch(exec_, device_.stream));
  }

  std::string describe() const override {
    size_t nodes = 0;
    cudaGraphGetNodes(graph_, nullptr, &nodes);  // NOLINT: a description only
    return detail::concat("decode step of ", plan_.num_tokens(), " rows: ", nodes, " graph nodes (KV write, ",
                          config_.has_ssm_branch() ? "ssm_mode " + config_.ssm_mode + ", " : std::string(),
                          "attention with the hybrid add fused)");
  }

 private:
  void capture() {
    const cudaStream_t stream = device_.stream;
    // Relaxed: the first launch of the SSM step may allocate its scratch (never a copy).
    HYBRIDTB_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    try {
      plan_.write_kv_cache(tensors_);
      plan_.hybrid_forward(tensors_, outputs_);
    } catch (...) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream, &partial);  // NOLINT: leaves the stream usable; the error is rethrown
      if (partial != nullptr) cudaGraphDestroy(partial);
      throw;
    }
    HYBRIDTB_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    HYBRIDTB_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }

  AttentionConfig config_;  // before plan_, which keeps a reference to it
  CudaDevice& device_;
  DecodeShapePlan plan_;
  StepTensors tensors_;
  Backend::HybridOutputs outputs_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const BackendSettings& settings, std::shared_ptr<CudaDevice> device)
      : settings_(settings), device_(std::move(device)) {
    validate(settings_.attention);
    validate(settings_.builder);
    if (!device_) device_ = std::make_shared<CudaDevice>();
    check_supported(settings_.attention);
    if (settings_.tp_group) device_->ssm->set_tp_group(settings_.tp_group.get());
    // A linear-attention layer has no attention: no runner, no KV-write slots.
    if (!settings_.attention.is_linear_layer()) {
      slots_ = std::make_unique<Workspace>(*device_->memory);
      AttentionPathOverrides overrides;
      overrides.separate_mixed = !settings_.mixed_grid;
      overrides.short_queries_as_prefill = !settings_.short_queries_as_decode_rows;
      overrides.prefill_variant = settings_.prefill_variant;
      runner_ = std::make_unique<AttentionRunner>(settings_.attention, *device_->memory, device_->num_sms, overrides);
    }
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(device_->stream);  // NOLINT: best effort in a destructor
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType output_dtype() const override { return settings_.attention.dtype; }

  // Another layer configuration's backend on this one's stream, memory and cuBLAS handle.
  std::unique_ptr<Backend> create_sibling(const BackendSettings& settings) override {
    return std::make_unique<CudaBackend>(settings, device_);
  }

  Tensor allocate(DType dtype, const Shape& shape) override {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    std::shared_ptr<void> block = device_->memory->allocate(static_cast<size_t>(numel * element_size(dtype)));
    const TensorView view(block.get(), dtype, shape, Device::kCuda);
    return Tensor(std::move(block), view);
  }

  void copy(const TensorView& dst, const TensorView& src) override {
    HYBRIDTB_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() &&
                       src.is_contiguous(),
                   "cuda backend: copy needs equal contiguous views, got ", src.describe(), " → ", dst.describe());
    if (src.nbytes() == 0) return;
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(src.nbytes()), cudaMemcpyDefault,
                                        device_->stream));
    HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(device_->stream));
  }

  void synchronize() override { HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(device_->stream)); }

  // Also ends graph mode: the run calls go back to planning each call eagerly.
  HybridMetadata build_metadata(const BatchDescription& batch) override {
    graph_plan_ = nullptr;
    return spec::build_hybrid_metadata(settings_.attention, settings_.builder, batch);
  }

  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override {
    require_attention_layer("write_kv_cache");
    // vLLM's do_kv_cache_update returns at once for encoder attention: there is no cache.
    if (settings_.attention.attn_type == AttnType::kEncoderOnly) return;
    if (DecodeShapePlan* plan = graph_plan(batch)) return plan->write_kv_cache(tensors);
    KvWriteParams p = bind_kv_write(settings_.attention, batch.num_tokens(), tensors);
    int64_t largest = -1;
    p.slot_mapping = upload_kv_slots(batch, batch.num_actual_tokens, cache_slots_of(settings_.attention, tensors),
                                     *slots_, slot_staging_, device_->stream, largest);
    p.num_tokens = batch.num_actual_tokens;
    if (p.num_tokens > 0) launch_kv_cache_write(p, device_->stream);
  }

  void attention_forward(const HybridMetadata& /*metadata: the kernels plan from the batch itself*/,
                         const BatchDescription& batch, const StepTensors& tensors,
                         const TensorView& output) override {
    require_attention_layer("attention_forward");
    check_query_supported(tensors);
    if (DecodeShapePlan* plan = graph_plan(batch)) return plan->attention_forward(tensors, output);
    runner_->prepare(batch, tensors, output, device_->stream);
    runner_->launch(device_->stream);
  }

  void ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                   const TensorView& contribution) override {
    const AttentionConfig& config = settings_.attention;
    require_attention_layer("ssm_forward");
    check_query_supported(tensors);
    HYBRIDTB_CHECK(config.has_ssm_branch(), "ssm_forward called for a layer without an SSM branch (ssm_mode none)");
    if (DecodeShapePlan* plan = graph_plan(batch)) return plan->ssm_forward(tensors, contribution);
    HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", config.ssm_mode,
                   " needs the Mamba metadata, which encoder-only layers do not have");
    ssm::ssm_forward(config, *metadata.mamba, batch, tensors, contribution, *device_->ssm, prefill_choice());
  }

  // HybridAttentionImpl.forward: the SSM branch first (so an unsupported or invalid SSM step is
  // refused before anything is written), then attention, whose kernels also store
  // output = attention + contribution (fuse_hybrid_add; otherwise a separate add pass computes the
  // same bits). Without an SSM branch the kernels store the attention output twice. Rows
  // ≥ num_actual_tokens (padding) are never written. Graph mode always fuses the add.
  void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                      const HybridOutputs& outputs) override {
    const AttentionConfig& config = settings_.attention;
    require_attention_layer("hybrid_forward");
    check_query_supported(tensors);
    if (DecodeShapePlan* plan = graph_plan(batch)) return plan->hybrid_forward(tensors, outputs);
    check_hybrid_outputs(config, tensors, outputs);
    const bool has_ssm = config.has_ssm_branch();
    if (has_ssm) ssm_forward(metadata, batch, tensors, outputs.ssm_output);
    const cudaStream_t stream = device_->stream;
    if (settings_.fuse_hybrid_add) {
      runner_->prepare(batch, tensors, outputs.attn_output, stream,
                       FusedAdd{has_ssm ? outputs.ssm_output : TensorView(), outputs.output});
      runner_->launch(stream);
      return;
    }
    attention_forward(metadata, batch, tensors, outputs.attn_output);
    const TensorView& src = outputs.attn_output;
    const TensorView& dst = outputs.output;
    const int64_t rows = batch.num_actual_tokens;
    if (has_ssm) {
      const int64_t width = config.num_heads * config.head_size;
      const ElementKind kind = ssm::gpu_element_kind(src.dtype(), "the output");
      ssm::launch_add_rows(ssm::RowsRef{dst.data(), kind, width}, ssm::RowsRef{src.data(), kind, width},
                           ssm::RowsRef{outputs.ssm_output.data(), kind, width}, width, rows, stream);
      return;
    }
    const int64_t bytes = src.slice_rows(0, rows).nbytes();
    if (bytes > 0) {
      HYBRIDTB_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
  }

  // pymllm's forward_gdn: the mode's core on the layer's own inputs (ssm_gpu_mode.h).
  void linear_attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                const StepTensors& tensors, const TensorView& output) override {
    const AttentionConfig& config = settings_.attention;
    HYBRIDTB_CHECK(config.is_linear_layer(), "linear_attention_forward called for a full_attention layer (ssm_mode ",
                   config.ssm_mode, "): run it with hybrid_forward");
    if (DecodeShapePlan* plan = graph_plan(batch)) return plan->ssm_forward(tensors, output);
    HYBRIDTB_CHECK(metadata.mamba.has_value(), "layer_kind ", to_string(config.layer_kind),
                   " needs the Mamba metadata (its state slots)");
    ssm::linear_attention_forward(config, *metadata.mamba, batch, tensors, output, *device_->ssm, prefill_choice());
  }

  void* native_stream() override { return device_->stream; }

  // A rank's mamba1 branch all-reduces inside the step: a graph can hold that only when the group
  // sums on the stream (NCCL); a group that sums host tensors waits on the host.
  void require_capturable_group(const char* call) const {
    const AttentionConfig& c = settings_.attention;
    if (!c.is_tensor_parallel_rank() || c.ssm_mode != "mamba1") return;
    if (settings_.tp_group && settings_.tp_group->sums_device_tensors()) return;
    throw NotSupported(detail::concat(call, ": the mamba1 branch of a tensor-parallel rank (tp_rank ", c.tp_rank,
                                      " of tp_size ", c.tp_size, ") all-reduces through host memory with this ",
                                      "group, which a CUDA graph cannot capture"));
  }

  std::unique_ptr<StepGraph> capture_decode_step(const HybridMetadata& metadata, const BatchDescription& batch,
                                                 const StepTensors& tensors, const HybridOutputs& outputs) override {
    require_attention_layer("capture_decode_step");
    require_capturable_group("capture_decode_step");
    return std::make_unique<CudaStepGraph>(settings_.attention, *device_, metadata, batch, tensors, outputs);
  }

  // --- the CUDA-graph lifecycle (backend.h) ------------------------------------------------------
  // Capacities from init_graph_state; one DecodeShapePlan per captured padded shape (created by
  // init_capture_metadata, kept for the graphs that read it); graph mode = a current plan, which
  // the run calls bind to instead of planning, until the next build_metadata.
  void init_graph_state(int64_t max_num_reqs, int64_t max_num_tokens) override {
    HYBRIDTB_CHECK(max_num_reqs > 0 && max_num_tokens > 0, "init_graph_state: max_num_reqs (", max_num_reqs,
                   ") and max_num_tokens (", max_num_tokens, ") must be > 0");
    HYBRIDTB_CHECK(shape_plans_.empty(), "init_graph_state: graphs were already captured with this backend's ",
                   "state (their buffers must outlive them); create another backend for other capacities");
    graph_capacity_ = std::pair{max_num_reqs, max_num_tokens};
  }

  void init_capture_metadata(const HybridMetadata& metadata, const BatchDescription& batch) override {
    HYBRIDTB_CHECK(graph_capacity_.has_value(), "init_capture_metadata before init_graph_state");
    require_capturable_group("init_capture_metadata");
    check_graph_batch(batch, "capture");
    DecodeShapePlan* plan = find_shape_plan(batch);
    if (plan == nullptr) {
      shape_plans_.push_back(std::make_unique<DecodeShapePlan>(settings_.attention, *device_, batch));
      plan = shape_plans_.back().get();
    }
    plan->prepare(metadata, batch);
    graph_plan_ = plan;
  }

  void init_replay_metadata(const HybridMetadata& metadata, const BatchDescription& batch) override {
    HYBRIDTB_CHECK(graph_capacity_.has_value() && !shape_plans_.empty(), "init_replay_metadata before any capture");
    check_graph_batch(batch, "replay");
    DecodeShapePlan* plan = find_shape_plan(batch);
    if (plan == nullptr) {
      std::string captured;
      for (const auto& p : shape_plans_) {
        captured += detail::concat(captured.empty() ? "" : ", ", p->num_reqs(), " and ", p->num_tokens());
      }
      throw Error(detail::concat("CUDA-graph replay: the batch has ", batch.num_reqs(), " requests and ",
                                 batch.num_tokens(), " token rows; graphs were captured for ", captured,
                                 " (pad it to a captured shape)"));
    }
    plan->prepare(metadata, batch);
    graph_plan_ = plan;
  }

 private:
  // How the SSM and linear layers' chunked prefills run, from the settings.
  ssm::SsmPrefillChoice prefill_choice() const {
    return {.operands = settings_.ssm_prefill_operands,
            .wgmma = settings_.ssm_prefill_wgmma,
            .fused_state_pass = settings_.ssm_prefill_fused_state_pass};
  }

  // Graph mode: the current shape plan, after checking that `batch` has its shape; nullptr eagerly.
  DecodeShapePlan* graph_plan(const BatchDescription& batch) const {
    if (graph_plan_ == nullptr) return nullptr;
    HYBRIDTB_CHECK(batch.num_reqs() == graph_plan_->num_reqs() && batch.num_tokens() == graph_plan_->num_tokens(),
                   "CUDA-graph mode: the call's batch has ", batch.num_reqs(), " requests and ", batch.num_tokens(),
                   " token rows, the planned one ", graph_plan_->num_reqs(), " and ", graph_plan_->num_tokens(),
                   " (pass the batch given to init_capture_metadata / init_replay_metadata)");
    return graph_plan_;
  }

  DecodeShapePlan* find_shape_plan(const BatchDescription& batch) const {
    for (const auto& plan : shape_plans_) {
      if (plan->num_reqs() == batch.num_reqs() && plan->num_tokens() == batch.num_tokens()) return plan.get();
    }
    return nullptr;
  }

  void check_graph_batch(const BatchDescription& batch, const char* what) const {
    const auto [max_reqs, max_tokens] = *graph_capacity_;
    HYBRIDTB_CHECK(batch.num_reqs() <= max_reqs && batch.num_tokens() <= max_tokens, "CUDA-graph ", what,
                   ": the batch has ", batch.num_reqs(), " requests and ", batch.num_tokens(),
                   " token rows, more than init_graph_state's ", max_reqs, " and ", max_tokens);
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      HYBRIDTB_CHECK(batch.query_len(r) <= 1, "CUDA-graph ", what, ": request ", r, " has query_len ",
                     batch.query_len(r), "; a graph holds a decode step (one token per request, padding requests 0)");
    }
  }

  // A linear-attention layer has no query, key, value or KV cache: its calls are refused by name.
  void require_attention_layer(const char* call) const {
    HYBRIDTB_CHECK(!settings_.attention.is_linear_layer(), call, " called for a layer_kind ",
                   to_string(settings_.attention.layer_kind),
                   " layer, which has no attention: run it with linear_attention_forward");
  }

  BackendSettings settings_;
  std::shared_ptr<CudaDevice> device_;
  std::unique_ptr<Workspace> slots_;
  std::vector<int64_t> slot_staging_;
  std::unique_ptr<AttentionRunner> runner_;
  std::optional<std::pair<int64_t, int64_t>> graph_capacity_;  // init_graph_state's (requests, token rows)
  std::vector<std::unique_ptr<DecodeShapePlan>> shape_plans_;
  DecodeShapePlan* graph_plan_ = nullptr;  // graph mode: the plan the run calls read
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendSettings& settings) {
  return std::make_unique<CudaBackend>(settings, nullptr);
}

void register_cuda_backend(BackendRegistry& registry) {
  registry.add("cuda",
               "NVIDIA GPU (sm_90): KV-cache write + paged attention (decode split-KV fast path, generic SIMT path) + "
               "SSM branch (every mode)",
               [](const BackendSettings& settings) { return make_cuda_backend(settings); },
               [] {
                 int count = 0;
                 const cudaError_t status = cudaGetDeviceCount(&count);
                 if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
                 return count == 0 ? std::string("no CUDA device: cudaGetDeviceCount returned 0") : std::string();
               });
  registry.set_explainer("cuda", explain_attention_step);
#ifdef HYBRIDTB_HAVE_NCCL
  registry.set_rank_placer("cuda", place_ranks_on_gpus);
#endif
}

}  // namespace hybridtb::cuda
