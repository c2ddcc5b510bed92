// The "cuda" backend: hybridtb::Backend on one NVIDIA GPU. The plan (build_metadata) is the
// reference builders' host-side plain data, as in vLLM; the run phase is the KV-cache write kernel,
// the attention kernels (decode fast path + generic path, attention/attention_plan.h) and the SSM
// branch (ssm/ssm_gpu_mode.h: the GPU driver and one GPU mode per reference mode), all on one
// stream owned by the backend, with device memory from its caching allocator.
// Checked against the reference by tests/cuda; `hybridtb run --backend cuda` runs a batch file.
//
// CUDA graphs (capture_decode_step): a CudaStepGraph owns its own attention runner in fixed-shape
// mode, its own slot buffer and a fixed-shape SSM decode step, so every pointer its kernel nodes
// hold stays valid and unchanged; replay() re-plans into those buffers with stream-ordered copies
// (outside the graph, like vLLM's persistent metadata buffers) and launches the graph. Graphs always
// use the fused hybrid add (the separate add pass would need num_actual_tokens on the host).
//
// Output dtype: config.dtype. With an fp8 output scale (decoder layers) the kernels store
// e4m3(clamp(o / output_scale, ±448)) — the value an fp8 store would hold, which every model dtype
// represents exactly — in config.dtype; the reference stores the unrounded clamp.
#include "hybridtb/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_launch.h"
#include "attention/attention_plan.h"
#include "common/cuda_check.h"
#include "common/device_memory.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/metadata_builders.h"
#include "kv_cache_write/kv_cache_write.h"
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
}

// The KV-cache write of one step (reshape_and_cache_flash): checks the tensors, uploads the slots of
// token rows [0, rows) — rows ≥ num_actual_tokens as −1 (CUDA-graph padding: the kernel skips them)
// — into `slots` and returns the launch parameters (num_tokens 0: nothing to write).
KvWriteParams plan_kv_write(const AttentionConfig& c, const BatchDescription& batch, const StepTensors& tensors,
                            int64_t rows, Workspace& slots, std::vector<int64_t>& staging, cudaStream_t stream) {
  const int64_t t = batch.num_tokens();
  const int64_t hkv = c.num_kv_heads;
  const int64_t d = c.head_size;
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", t, "]");
  const Shape shape{t, hkv, d};
  for (const TensorView* v : {&tensors.key, &tensors.value}) {
    HYBRIDTB_CHECK(v->device() == Device::kCuda && v->shape() == shape && v->dtype() == c.dtype && v->stride(2) == 1,
                   "key and value must be CUDA ", to_string(c.dtype), " ", shape_to_string(shape),
                   " contiguous in the last dimension, got ", v->describe());
  }
  const TensorView& cache = tensors.kv_cache;
  const DType storage = kv_storage_dtype(c.kv_cache_dtype, c.dtype);
  HYBRIDTB_CHECK(cache.rank() == 5 && cache.device() == Device::kCuda && cache.dtype() == storage &&
                     cache.shape() == Shape({cache.size(0), 2, c.block_size, hkv, d}) && cache.stride(4) == 1,
                 "kv_cache must be a CUDA ", to_string(storage), " [NB, 2, ", c.block_size, ", ", hkv, ", ", d,
                 "] tensor, got ", cache.describe());
  KvWriteParams p{};
  if (is_per_token_head(c.kv_cache_dtype)) {
    const Shape scale_shape{cache.size(0), c.block_size, hkv};
    for (const TensorView* s : {&tensors.k_scale_cache, &tensors.v_scale_cache}) {
      HYBRIDTB_CHECK(s->device() == Device::kCuda && s->shape() == scale_shape && s->dtype() == DType::kFloat32 &&
                         s->is_contiguous(),
                     "k_scale_cache and v_scale_cache must be CUDA float32 ", shape_to_string(scale_shape), ", got ",
                     s->describe());
    }
    p.k_scale_cache = static_cast<float*>(tensors.k_scale_cache.data());
    p.v_scale_cache = static_cast<float*>(tensors.v_scale_cache.data());
  }
  staging.assign(static_cast<size_t>(rows), kPadSlotId);
  for (int64_t i = 0; i < std::min(rows, batch.num_actual_tokens); ++i) {
    const int64_t slot = batch.slot_mapping[static_cast<size_t>(i)];
    HYBRIDTB_CHECK(slot < cache.size(0) * c.block_size, "slot_mapping[", i, "] = ", slot, " is past the cache's ",
                   cache.size(0), " blocks of ", c.block_size);
    staging[static_cast<size_t>(i)] = slot;
  }
  if (rows == 0) return p;
  auto* device_slots = static_cast<int64_t*>(slots.device(static_cast<size_t>(rows) * sizeof(int64_t)));
  // Pageable source: cudaMemcpyAsync returns once the bytes are staged, so `staging` may be reused.
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(device_slots, staging.data(), static_cast<size_t>(rows) * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, stream));
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
  p.slot_mapping = device_slots;
  p.num_tokens = rows;
  p.num_kv_heads = static_cast<int32_t>(hkv);
  p.head_size = static_cast<int32_t>(d);
  p.block_size = static_cast<int32_t>(c.block_size);
  p.mode = is_per_token_head(c.kv_cache_dtype) ? KvWriteMode::kPerTokenHead
           : is_quantized(c.kv_cache_dtype)    ? KvWriteMode::kFp8PerTensor
                                               : KvWriteMode::kCopy;
  p.source = element_kind(c.dtype);
  p.storage = element_kind(storage);
  p.k_scale = tensors.k_scale;
  p.v_scale = tensors.v_scale;
  return p;
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

// What the run phase needs from the backend (the graph uses it too).
struct DeviceContext {
  const BackendSettings& settings;
  DeviceMemory& memory;
  cudaStream_t stream;
  int num_sms;
  ssm::SsmContext& ssm;
};

class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(const DeviceContext& context, const HybridMetadata& metadata, const BatchDescription& batch,
                const StepTensors& tensors, const Backend::HybridOutputs& outputs)
      : context_(context),
        attention_(context.settings.attention, context.memory, context.num_sms),
        slots_(context.memory),
        tensors_(tensors),
        outputs_(outputs),
        num_tokens_(batch.num_tokens()) {
    const AttentionConfig& c = context.settings.attention;
    check_hybrid_outputs(c, tensors, outputs);
    attention_.fix_shape(batch);
    if (c.has_ssm_branch()) {
      HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", c.ssm_mode, " needs the Mamba metadata");
      if (!ssm::is_fixed_decode_step(c, *metadata.mamba, batch)) {
        throw NotSupported(detail::concat("CUDA-graph capture: the SSM branch (ssm_mode ", c.ssm_mode,
                                          ") of this step has no fixed-shape form (prefills or speculative decodes)"));
      }
      ssm_ = std::make_unique<ssm::FixedDecodeStep>(c, context.ssm);
    }
    prepare(metadata, batch);
    capture();
  }

  ~CudaStepGraph() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);  // NOLINT: best effort in a destructor
    if (graph_ != nullptr) cudaGraphDestroy(graph_);    // NOLINT
  }
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;

  void replay(const HybridMetadata& metadata, const BatchDescription& batch) override {
    prepare(metadata, batch);
    HYBRIDTB_CUDA_CHECK(cudaGraphLaunch(exec_, context_.stream));
  }

  std::string describe() const override {
    size_t nodes = 0;
    cudaGraphGetNodes(graph_, nullptr, &nodes);  // NOLINT: a description only
    const AttentionConfig& c = context_.settings.attention;
    return detail::concat("decode step of ", num_tokens_, " rows: ", nodes, " graph nodes (KV write, ",
                          c.has_ssm_branch() ? "ssm_mode " + c.ssm_mode + ", " : std::string(),
                          "attention with the hybrid add fused)");
  }

 private:
  // Re-plans `batch` into the captured buffers; every check happens before any kernel could run.
  void prepare(const HybridMetadata& metadata, const BatchDescription& batch) {
    const AttentionConfig& c = context_.settings.attention;
    HYBRIDTB_CHECK(batch.num_tokens() == num_tokens_, "CUDA graph: the batch has ", batch.num_tokens(),
                   " token rows, the graph was captured for ", num_tokens_, " (pad it to that size)");
    if (ssm_) {
      HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", c.ssm_mode, " needs the Mamba metadata");
      ssm_->prepare(*metadata.mamba, batch, tensors_, outputs_.ssm_output);
    }
    const FusedAdd fused{ssm_ ? outputs_.ssm_output : TensorView(), outputs_.output};
    attention_.prepare(batch, tensors_, outputs_.attn_output, context_.stream, fused);
    kv_ = plan_kv_write(c, batch, tensors_, num_tokens_, slots_, slot_staging_, context_.stream);
  }

  void capture() {
    const cudaStream_t stream = context_.stream;
    // Relaxed: the first launch of the SSM step may allocate its scratch (never a copy).
    HYBRIDTB_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    try {
      if (kv_.num_tokens > 0) launch_kv_cache_write(kv_, stream);
      if (ssm_) ssm_->launch();
      attention_.launch(stream);
    } catch (...) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream, &partial);  // NOLINT: leaves the stream usable; the error is rethrown
      if (partial != nullptr) cudaGraphDestroy(partial);
      throw;
    }
    HYBRIDTB_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    HYBRIDTB_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }

  DeviceContext context_;
  AttentionRunner attention_;
  Workspace slots_;
  std::vector<int64_t> slot_staging_;
  std::unique_ptr<ssm::FixedDecodeStep> ssm_;
  StepTensors tensors_;
  Backend::HybridOutputs outputs_;
  int64_t num_tokens_ = 0;
  KvWriteParams kv_{};
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendSettings& settings) : settings_(settings) {
    validate(settings_.attention);
    validate(settings_.builder);
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      throw Error(detail::concat("cuda backend: no CUDA device: ",
                                 status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount returned 0"));
    }
    check_supported(settings_.attention);
    int device = 0;
    HYBRIDTB_CUDA_CHECK(cudaGetDevice(&device));
    int num_sms = 0;
    HYBRIDTB_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    HYBRIDTB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    memory_ = std::make_unique<DeviceMemory>();
    slots_ = std::make_unique<Workspace>(*memory_);
    num_sms_ = num_sms;
    runner_ = std::make_unique<AttentionRunner>(settings_.attention, *memory_, num_sms);
    ssm_ = std::make_unique<ssm::SsmContext>(*memory_, stream_);
  }

  ~CudaBackend() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);  // NOLINT: best effort in a destructor
      ssm_.reset();                    // its cuBLAS handle is bound to the stream
      cudaStreamDestroy(stream_);
    }
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType output_dtype() const override { return settings_.attention.dtype; }

  Tensor allocate(DType dtype, const Shape& shape) override {
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    std::shared_ptr<void> block = memory_->allocate(static_cast<size_t>(numel * element_size(dtype)));
    const TensorView view(block.get(), dtype, shape, Device::kCuda);
    return Tensor(std::move(block), view);
  }

  void copy(const TensorView& dst, const TensorView& src) override {
    HYBRIDTB_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() &&
                       src.is_contiguous(),
                   "cuda backend: copy needs equal contiguous views, got ", src.describe(), " → ", dst.describe());
    if (src.nbytes() == 0) return;
    HYBRIDTB_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(src.nbytes()), cudaMemcpyDefault, stream_));
    HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void synchronize() override { HYBRIDTB_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  HybridMetadata build_metadata(const BatchDescription& batch) override {
    return reference::build_hybrid_metadata(settings_.attention, settings_.builder, batch);
  }

  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override {
    // vLLM's do_kv_cache_update returns at once for encoder attention: there is no cache.
    if (settings_.attention.attn_type == AttnType::kEncoderOnly) return;
    const KvWriteParams p =
        plan_kv_write(settings_.attention, batch, tensors, batch.num_actual_tokens, *slots_, slot_staging_, stream_);
    if (p.num_tokens > 0) launch_kv_cache_write(p, stream_);
  }

  void attention_forward(const HybridMetadata& /*metadata: the kernels plan from the batch itself*/,
                         const BatchDescription& batch, const StepTensors& tensors,
                         const TensorView& output) override {
    runner_->prepare(batch, tensors, output, stream_);
    runner_->launch(stream_);
  }

  void ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                   const TensorView& contribution) override {
    const AttentionConfig& config = settings_.attention;
    HYBRIDTB_CHECK(config.has_ssm_branch(), "ssm_forward called for a layer without an SSM branch (ssm_mode none)");
    HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", config.ssm_mode,
                   " needs the Mamba metadata, which encoder-only layers do not have");
    ssm::ssm_forward(config, *metadata.mamba, batch, tensors, contribution, *ssm_);
  }

  // HybridAttentionImpl.forward: the SSM branch first (so an unsupported or invalid SSM step is
  // refused before anything is written), then attention, whose kernels also store
  // output = attention + contribution (fuse_hybrid_add; otherwise a separate add pass computes the
  // same bits). Without an SSM branch the kernels store the attention output twice. Rows
  // ≥ num_actual_tokens (padding) are never written.
  void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                      const HybridOutputs& outputs) override {
    const AttentionConfig& config = settings_.attention;
    check_hybrid_outputs(config, tensors, outputs);
    const bool has_ssm = config.has_ssm_branch();
    if (has_ssm) ssm_forward(metadata, batch, tensors, outputs.ssm_output);
    if (settings_.fuse_hybrid_add) {
      runner_->prepare(batch, tensors, outputs.attn_output, stream_,
                       FusedAdd{has_ssm ? outputs.ssm_output : TensorView(), outputs.output});
      runner_->launch(stream_);
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
                           ssm::RowsRef{outputs.ssm_output.data(), kind, width}, width, rows, stream_);
      return;
    }
    const int64_t bytes = src.slice_rows(0, rows).nbytes();
    if (bytes > 0) {
      HYBRIDTB_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    }
  }

  void* native_stream() override { return stream_; }

  std::unique_ptr<StepGraph> capture_decode_step(const HybridMetadata& metadata, const BatchDescription& batch,
                                                 const StepTensors& tensors, const HybridOutputs& outputs) override {
    const DeviceContext context{settings_, *memory_, stream_, num_sms_, *ssm_};
    return std::make_unique<CudaStepGraph>(context, metadata, batch, tensors, outputs);
  }

 private:
  BackendSettings settings_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceMemory> memory_;
  std::unique_ptr<Workspace> slots_;
  std::vector<int64_t> slot_staging_;
  int num_sms_ = 0;
  std::unique_ptr<AttentionRunner> runner_;
  std::unique_ptr<ssm::SsmContext> ssm_;  // after memory_: destroyed before it
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendSettings& settings) {
  return std::make_unique<CudaBackend>(settings);
}

void register_cuda_backend(BackendRegistry& registry) {
  registry.add("cuda",
               "NVIDIA GPU (sm_90): KV-cache write + paged attention (decode split-KV fast path, generic SIMT path) + "
               "SSM branch (every mode)",
               [](const BackendSettings& settings) { return make_cuda_backend(settings); });
}

}  // namespace hybridtb::cuda
