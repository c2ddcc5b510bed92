// Per-layer hybrid models (Qwen3-Next: three GDN layers, then one full-attention layer; a per-layer
// Mamba-2 design): the composite backend that serves all their layers, and the step driver.
//
// PerLayerBackend is pymllm's HybridAttnBackend as one
// more Backend, not a parallel hierarchy: it holds one backend created for the model's
// full-attention layer configuration and one for its linear-attention layer configuration
// (layer_kind gdn or mamba2) and
//   - builds the step's metadata once, both halves: the attention half from the attention backend,
//     the Mamba half (state slots, decode/prefill split, cache-mode blocks) from the linear one;
//     every layer of the step then shares it (pymllm's init_forward_metadata on both children);
//   - routes each call to the backend of its kind: write_kv_cache, attention_forward, ssm_forward,
//     hybrid_forward and capture_decode_step to the attention backend, linear_attention_forward to
//     the linear one (pymllm routes by the method called, forward_extend/decode vs forward_gdn);
//   - forwards each CUDA-graph lifecycle hook (init_graph_state, init_capture_metadata,
//     init_replay_metadata) to both backends, attention first (pymllm: to both sub-backends).
// All routing lives in per_layer.cpp. Checked by tests/per_layer (ctest -L per_layer).
//
// On the GPU: create_per_layer_backend("cuda", ...) gives the composite two cuda backends that share
// one device (Backend::create_sibling: one stream, one allocator, one cuBLAS handle), so the layers
// of a step run in order on one stream. The linear one runs linear_attention_forward through the GPU
// driver of its mode's core (optimized/src/ssm/ssm_gpu_mode.h), planned by the shared plan
// (hybridtb/spec/ssm_plan.h) as the SSM branch is; both implement the graph hooks with one device
// plan per captured padded shape, to which every layer call binds its own tensors — so a graph runner
// captures the calls of a whole step on native_stream() into one graph and replays it after
// init_replay_metadata (tests/cuda/cuda_per_layer_test.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"

namespace hybridtb {

// The two layer configurations of a per-layer model, each with the engine settings (shared).
struct PerLayerSettings {
  BackendSettings attention;  // the full-attention layers (layer_kind full_attention)
  BackendSettings linear;     // the linear-attention layers (layer_kind gdn or mamba2)
};

class PerLayerBackend final : public Backend {
 public:
  // `attention` and `linear` must have been created for settings.attention and settings.linear, on
  // one device with one output dtype. Throws Error naming what does not fit: a linear config that is
  // not a linear layer, an attention config that is, builder settings that differ (the step's
  // metadata is one build), or backends on different devices.
  PerLayerBackend(std::unique_ptr<Backend> attention, std::unique_ptr<Backend> linear, PerLayerSettings settings);

  const PerLayerSettings& settings() const { return settings_; }
  // The configuration of the layers of `kind`'s backend (the attention one for full_attention).
  const AttentionConfig& layer_config(LayerKind kind) const;

  std::string name() const override;
  Device device() const override { return attention_->device(); }
  DType output_dtype() const override { return attention_->output_dtype(); }

  // Memory is the attention backend's; both backends live on one device, so either can read it.
  Tensor allocate(DType dtype, const Shape& shape) override { return attention_->allocate(dtype, shape); }
  void copy(const TensorView& dst, const TensorView& src) override { attention_->copy(dst, src); }
  void synchronize() override;

  HybridMetadata build_metadata(const BatchDescription& batch) override;

  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override;
  void attention_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                         const TensorView& output) override;
  void ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                   const TensorView& contribution) override;
  void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                      const HybridOutputs& outputs) override;
  void linear_attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                const StepTensors& tensors, const TensorView& output) override;

  void* native_stream() override { return attention_->native_stream(); }
  std::unique_ptr<StepGraph> capture_decode_step(const HybridMetadata& metadata, const BatchDescription& batch,
                                                 const StepTensors& tensors, const HybridOutputs& outputs) override;
  void init_graph_state(int64_t max_num_reqs, int64_t max_num_tokens) override;
  void init_capture_metadata(const HybridMetadata& metadata, const BatchDescription& batch) override;
  void init_replay_metadata(const HybridMetadata& metadata, const BatchDescription& batch) override;

 private:
  std::unique_ptr<Backend> attention_;
  std::unique_ptr<Backend> linear_;
  PerLayerSettings settings_;
};

// A PerLayerBackend whose two backends are the registered backend `name` (e.g. "reference"),
// created for each configuration (defined with the registry, harness/src/builtin_backends.cpp).
std::unique_ptr<PerLayerBackend> create_per_layer_backend(const std::string& name, const PerLayerSettings& settings);

// One step of a per-layer model. Each file is one layer of the SAME step: equal /batch and builder
// settings (Error naming the first layer and field that differ), each layer's /config equal to the
// backend's configuration of its kind. The metadata is built once (backend.build_metadata) and
// every layer runs on it in order (run_layer_step); each result carries that metadata. The files
// are not modified.
std::vector<StepOutputs> run_per_layer_step(PerLayerBackend& backend, const std::vector<const BatchFile*>& layers);

}  // namespace hybridtb
