// run_step / run_layer_step: one step of a batch file on any backend, through the Backend interface
// only.
#include "hybridtb/step.h"

#include <string>
#include <tuple>

#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"

namespace hybridtb {

namespace {

// A copy of `host` in the backend's memory (an empty tensor stays empty).
Tensor upload(Backend& backend, const Tensor& host) {
  if (host.empty()) return {};
  Tensor device = backend.allocate(host.dtype(), host.shape());
  backend.copy(device, host);
  return device;
}

}  // namespace

Tensor download(Backend& backend, const Tensor& device) {
  if (device.empty()) return {};
  Tensor host = Tensor::host(device.dtype(), device.shape());
  backend.copy(host, device);
  return host;
}

Tensor poisoned_output(Backend& backend, const Shape& shape) {
  Tensor host = Tensor::host(backend.output_dtype(), shape);
  fill_host(host, kOutputPoison);
  return upload(backend, host);
}

BatchInputs upload_inputs(Backend& backend, const BatchInputs& in) {
  BatchInputs device;
  device.query = upload(backend, in.query);
  device.key = upload(backend, in.key);
  device.value = upload(backend, in.value);
  device.kv_cache = upload(backend, in.kv_cache);
  device.k_scale_cache = upload(backend, in.k_scale_cache);
  device.v_scale_cache = upload(backend, in.v_scale_cache);
  device.k_scale = in.k_scale;
  device.v_scale = in.v_scale;
  device.output_scale = in.output_scale;
  device.q_scale = in.q_scale;
  for (const auto& [name, pool] : in.ssm_state) device.ssm_state[name] = upload(backend, pool);
  for (const auto& [name, weight] : in.weights) device.weights[name] = upload(backend, weight);
  device.ssm_hidden = upload(backend, in.ssm_hidden);
  for (const auto& [name, input] : in.linear_inputs) device.linear_inputs[name] = upload(backend, input);
  return device;
}

std::string first_bit_difference(const StepOutputs& a, const StepOutputs& b) {
  for (const auto& [name, x, y] : {std::tuple{"output", &a.output, &b.output},
                                   std::tuple{"attn_output", &a.attn_output, &b.attn_output},
                                   std::tuple{"ssm_output", &a.ssm_output, &b.ssm_output},
                                   std::tuple{"kv_cache", &a.kv_cache, &b.kv_cache},
                                   std::tuple{"k_scale_cache", &a.k_scale_cache, &b.k_scale_cache},
                                   std::tuple{"v_scale_cache", &a.v_scale_cache, &b.v_scale_cache}}) {
    if (x->empty() != y->empty() || (!x->empty() && !bitwise_equal(*x, *y))) return name;
  }
  for (const auto& [name, pool] : b.ssm_state) {
    const auto it = a.ssm_state.find(name);
    if (it == a.ssm_state.end() || !bitwise_equal(it->second, pool)) return "state pool " + name;
  }
  for (const auto& [name, pool] : a.ssm_state) {
    if (b.ssm_state.count(name) == 0) return "state pool " + name;
  }
  return "";
}

StepOutputs run_step(Backend& backend, const BatchFile& file, const StepOptions& options) {
  return run_layer_step(backend, file, backend.build_metadata(file.batch), options);
}

LayerBuffers::LayerBuffers(Backend& backend, const BatchFile& file)
    : device(upload_inputs(backend, file.inputs)), config_(file.config) {
  const int64_t t = file.batch.num_tokens();
  if (config_.is_linear_layer()) {
    output = poisoned_output(backend, {t, linear_layer_spec(config_).output_width});
    return;
  }
  const Shape shape{t, config_.num_heads, config_.head_size};
  output = poisoned_output(backend, shape);
  attn_output = poisoned_output(backend, shape);
  if (config_.has_ssm_branch()) ssm_output = poisoned_output(backend, shape);
}

void LayerBuffers::run(Backend& backend, const HybridMetadata& metadata, const BatchDescription& batch,
                       const StepOptions& options) const {
  StepTensors tensors = views();
  tensors.progress = options.progress;
  if (config_.is_linear_layer()) {
    backend.linear_attention_forward(metadata, batch, tensors, output);
    return;
  }
  backend.write_kv_cache(batch, tensors);
  backend.hybrid_forward(metadata, batch, tensors, outputs());
}

StepOutputs LayerBuffers::download_all(Backend& backend, const HybridMetadata& metadata) const {
  StepOutputs out;
  out.backend = backend.name();
  out.metadata = metadata;
  out.output = download(backend, output);
  out.attn_output = download(backend, attn_output);
  out.ssm_output = download(backend, ssm_output);
  out.kv_cache = download(backend, device.kv_cache);
  out.k_scale_cache = download(backend, device.k_scale_cache);
  out.v_scale_cache = download(backend, device.v_scale_cache);
  for (const auto& [name, pool] : device.ssm_state) out.ssm_state[name] = download(backend, pool);
  return out;
}

StepOutputs run_layer_step(Backend& backend, const BatchFile& file, const HybridMetadata& metadata,
                           const StepOptions& options) {
  const LayerBuffers buffers(backend, file);
  buffers.run(backend, metadata, file.batch, options);
  backend.synchronize();
  return buffers.download_all(backend, metadata);
}

}  // namespace hybridtb
