// Linear-attention layers on the reference (/config layer_kind gdn or mamba2; a per-layer hybrid
// model's GDN or Mamba-2 layers): the layer's mixer is its mode's core (reference/ssm/gdn_core.h,
// mamba2_core.h) run on the layer's per-token inputs (hybridtb/linear_layer.h), in float64, with the
// slots, cache modes and block boundaries of the Mamba metadata planned by the same step runner as
// the parallel SSM branch (reference/ssm/step_runner.h, ssm_plan.h). Checked by tests/per_layer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/spec/linear_layer_specs.h"

namespace hybridtb::reference::ssm {

// The layer's tensor specs and their check are its descriptor (hybridtb/spec/linear_layer_specs.h).
using spec::ssm::linear_layer_tensor_specs;
using spec::ssm::LinearLayerTensorSpecs;
using spec::ssm::validate_linear_tensors;

// Runs config's linear layer over the batch (host tensors): reads tensors.linear_inputs rows
// [0, num_actual_tokens), writes rows [0, num_actual_tokens) of `output` ([T, output_width], any
// float dtype, rounded once) and updates tensors.ssm_state in place. Requests whose slot is < 0 and
// requests without tokens are skipped (zero rows, no state read or written); rows at or past
// num_actual_tokens are never written. A decode token takes the core's single-step form.
void linear_attention_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                              const BatchDescription& batch, const StepTensors& tensors, const TensorView& output);

}  // namespace hybridtb::reference::ssm
