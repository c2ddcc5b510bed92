// The "cuda" backend: hybridtb::Backend on one NVIDIA GPU. The plan (build_metadata) is the
// reference builders' host-side plain data, as in vLLM; the run phase is the KV-cache write kernel,
// the attention kernels (decode fast path + generic path, attention/attention_plan.h) and the SSM
// branch (ssm/ssm_gpu_mode.h: the GPU driver and one GPU mode per reference mode), all on one
// stream owned by the backend, with device memory from its caching allocator.
// Checked against the reference by tests/cuda; `hybridtb run --backend cuda` runs a batch file.
//
// Output dtype: config.dtype. With an fp8 output scale (decoder layers) the kernels store
// e4m3(clamp(o / output_scale, ±448)) — the value an fp8 store would hold, which every model dtype
// represents exactly — in config.dtype; the reference stores the unrounded clamp.
#include "hybridtb/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

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
    const AttentionConfig& c = settings_.attention;
    // vLLM's do_kv_cache_update returns at once for encoder attention: there is no cache.
    if (c.attn_type == AttnType::kEncoderOnly) return;
    const int64_t t = batch.num_tokens();
    const int64_t hkv = c.num_kv_heads;
    const int64_t d = c.head_size;
    HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                   batch.num_actual_tokens, ") must lie in [0, ", t, "]");
    const Shape rows{t, hkv, d};
    for (const TensorView* v : {&tensors.key, &tensors.value}) {
      HYBRIDTB_CHECK(v->device() == Device::kCuda && v->shape() == rows && v->dtype() == c.dtype &&
                         v->stride(2) == 1,
                     "key and value must be CUDA ", to_string(c.dtype), " ", shape_to_string(rows),
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
                       "k_scale_cache and v_scale_cache must be CUDA float32 ", shape_to_string(scale_shape),
                       ", got ", s->describe());
      }
      p.k_scale_cache = static_cast<float*>(tensors.k_scale_cache.data());
      p.v_scale_cache = static_cast<float*>(tensors.v_scale_cache.data());
    }
    const int64_t n = batch.num_actual_tokens;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = batch.slot_mapping[static_cast<size_t>(i)];
      HYBRIDTB_CHECK(slot < cache.size(0) * c.block_size, "slot_mapping[", i, "] = ", slot, " is past the cache's ",
                     cache.size(0), " blocks of ", c.block_size);
    }
    if (n == 0) return;
    auto* slots = static_cast<int64_t*>(slots_->device(static_cast<size_t>(n) * sizeof(int64_t)));
    HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(slots, batch.slot_mapping.data(), static_cast<size_t>(n) * sizeof(int64_t),
                                        cudaMemcpyHostToDevice, stream_));
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
    p.slot_mapping = slots;
    p.num_tokens = n;
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
    launch_kv_cache_write(p, stream_);
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
  // refused before anything is written), then attention, then output = attention + contribution
  // for rows [0, num_actual_tokens) in one separate add pass (launch_add_rows; phase 2 fuses the
  // add into the attention epilogue). Padding rows are never written.
  void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                      const HybridOutputs& outputs) override {
    const bool has_ssm = settings_.attention.has_ssm_branch();
    if (has_ssm) {
      HYBRIDTB_CHECK(outputs.ssm_output.shape() == tensors.query.shape(), "the SSM contribution buffer ",
                     outputs.ssm_output.describe(), " must have the query's shape ", tensors.query.describe());
      ssm_forward(metadata, batch, tensors, outputs.ssm_output);
    }
    attention_forward(metadata, batch, tensors, outputs.attn_output);
    const TensorView& src = outputs.attn_output;
    const TensorView& dst = outputs.output;
    HYBRIDTB_CHECK(dst.device() == Device::kCuda && dst.dtype() == src.dtype() && dst.shape() == src.shape() &&
                       dst.is_contiguous() && src.is_contiguous(),
                   "hybrid_forward: output must match attn_output (contiguous CUDA tensors), got ", dst.describe(),
                   " and ", src.describe());
    const int64_t rows = batch.num_actual_tokens;
    if (has_ssm) {
      const TensorView& ssm_out = outputs.ssm_output;
      HYBRIDTB_CHECK(ssm_out.device() == Device::kCuda && ssm_out.dtype() == src.dtype() && ssm_out.is_contiguous(),
                     "hybrid_forward: ssm_output must be a contiguous CUDA tensor like attn_output, got ",
                     ssm_out.describe());
      const int64_t width = settings_.attention.num_heads * settings_.attention.head_size;
      const ElementKind kind = ssm::gpu_element_kind(src.dtype(), "the output");
      ssm::launch_add_rows(ssm::RowsRef{dst.data(), kind, width}, ssm::RowsRef{src.data(), kind, width},
                           ssm::RowsRef{ssm_out.data(), kind, width}, width, rows, stream_);
      return;
    }
    // Without an SSM branch the layer's output is the attention output.
    const int64_t bytes = src.slice_rows(0, rows).nbytes();
    if (bytes > 0) {
      HYBRIDTB_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    }
  }

 private:
  BackendSettings settings_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceMemory> memory_;
  std::unique_ptr<Workspace> slots_;
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
