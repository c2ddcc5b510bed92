// Running one recorded step on any backend: upload the inputs into the backend's memory, build
// the metadata, write the KV cache, run the attention, download every output. The same function
// serves `hybridtb run`, the tests and the parity tools, so all of them exercise one code path.
#pragma once

#include <limits>
#include <string>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/progress.h"

namespace hybridtb {

// Value the output buffers are filled with before a run. Rows a backend must not write (CUDA-graph
// padding) still hold it afterwards, which is how the tests and the parity report check that
// padding rows were never touched.
inline constexpr double kOutputPoison = std::numeric_limits<double>::quiet_NaN();

// A host copy of a tensor in the backend's memory (an empty tensor stays empty).
Tensor download(Backend& backend, const Tensor& device);

// An output buffer in the backend's memory, of its output dtype, filled with kOutputPoison.
Tensor poisoned_output(Backend& backend, const Shape& shape);

// Copies of every input tensor of `host` in the backend's memory (empty tensors stay empty;
// the scalar scales are copied as they are). run_step and the benchmark suite upload through it.
BatchInputs upload_inputs(Backend& backend, const BatchInputs& host);

// How run_step runs a step. `progress`, if set, receives the backend's progress reports
// (StepTensors::progress); it must outlive the call.
struct StepOptions {
  ProgressSink* progress = nullptr;
};

// One layer's step in a backend's memory: its inputs (upload_inputs of the file's) and its output
// buffers, poisoned, by the layer's kind — output, attn_output and (with an SSM branch) ssm_output
// [T, Hq, D] for a full-attention layer, output [T, output_width] alone for a linear layer. The
// buffers stay put, so a CUDA graph runner can capture run() and replay it on new inputs.
struct LayerBuffers {
  LayerBuffers(Backend& backend, const BatchFile& file);

  const AttentionConfig& config() const { return config_; }
  StepTensors views() const { return device.views(); }
  Backend::HybridOutputs outputs() const { return {output, attn_output, ssm_output}; }
  // The layer's calls of one step, enqueued without waiting: write_kv_cache + hybrid_forward, or
  // linear_attention_forward.
  void run(Backend& backend, const HybridMetadata& metadata, const BatchDescription& batch,
           const StepOptions& options = {}) const;
  // Host copies of the outputs, the KV and scale caches and the pools (the caller synchronizes
  // first), carrying `metadata`.
  StepOutputs download_all(Backend& backend, const HybridMetadata& metadata) const;

  BatchInputs device;
  Tensor output, attn_output, ssm_output;

 private:
  AttentionConfig config_;
};

// The first of the outputs, the KV and scale caches and the state pools in which `a` and `b` differ
// bit for bit ("output", …, "state pool <name>"), or "" if none does (an empty tensor equals only an
// empty one). Graph replay == eager step, fused == separate add, and the like.
std::string first_bit_difference(const StepOutputs& a, const StepOutputs& b);

// Runs `file`'s step on `backend`: build_metadata, then run_layer_step. The file is not modified
// (the KV cache and the state pools are copied first). Throws Error / NotSupported if the backend
// cannot run this configuration.
StepOutputs run_step(Backend& backend, const BatchFile& file, const StepOptions& options = {});

// Runs one layer of a step whose metadata is already built (a per-layer model builds it once for
// all its layers; per_layer.h), by the layer's kind: write_kv_cache + hybrid_forward for a
// full-attention layer (outputs output, attn_output, ssm_output when it has a branch, the KV and
// scale caches), linear_attention_forward for a linear layer (outputs output [T, output_width]
// alone). Both give the state pools after the step and carry `metadata`. Output buffers start
// poisoned (kOutputPoison).
StepOutputs run_layer_step(Backend& backend, const BatchFile& file, const HybridMetadata& metadata,
                           const StepOptions& options = {});

}  // namespace hybridtb
