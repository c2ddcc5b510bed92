// run_step / run_layer_step: one step of a batch file on any backend, through the Backend interface
// only.
#include "hybridtb/step.h"

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
  for (const auto& [name, pool] : in.ssm_state) device.ssm_state[name] = upload(backend, pool);
  for (const auto& [name, weight] : in.weights) device.weights[name] = upload(backend, weight);
  for (const auto& [name, input] : in.linear_inputs) device.linear_inputs[name] = upload(backend, input);
  return device;
}

StepOutputs run_step(Backend& backend, const BatchFile& file) {
  return run_layer_step(backend, file, backend.build_metadata(file.batch));
}

StepOutputs run_layer_step(Backend& backend, const BatchFile& file, const HybridMetadata& metadata) {
  const AttentionConfig& config = file.config;
  StepOutputs out;
  out.backend = backend.name();
  out.metadata = metadata;

  BatchInputs device = upload_inputs(backend, file.inputs);
  const StepTensors tensors = device.views();

  if (config.is_linear_layer()) {
    Tensor output = poisoned_output(backend, {file.batch.num_tokens(), linear_layer_spec(config).output_width});
    backend.linear_attention_forward(metadata, file.batch, tensors, output);
    backend.synchronize();
    out.output = download(backend, output);
  } else {
    const Shape output_shape{file.batch.num_tokens(), config.num_heads, config.head_size};
    Tensor output = poisoned_output(backend, output_shape);
    Tensor attn_output = poisoned_output(backend, output_shape);
    Tensor ssm_output = config.has_ssm_branch() ? poisoned_output(backend, output_shape) : Tensor();

    backend.write_kv_cache(file.batch, tensors);
    backend.hybrid_forward(metadata, file.batch, tensors, {output, attn_output, ssm_output});
    backend.synchronize();

    out.output = download(backend, output);
    out.attn_output = download(backend, attn_output);
    out.ssm_output = download(backend, ssm_output);
    out.kv_cache = download(backend, device.kv_cache);
    out.k_scale_cache = download(backend, device.k_scale_cache);
    out.v_scale_cache = download(backend, device.v_scale_cache);
  }
  for (const auto& [name, pool] : device.ssm_state) out.ssm_state[name] = download(backend, pool);
  return out;
}

}  // namespace hybridtb
