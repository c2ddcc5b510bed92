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

namespace hybridtb::reference::ssm {

// What a linear layer holds besides its inputs: the mode's state pools (one slot each) and the
// core's weights, with the mode's specs (shapes, meanings, random initialisation):
//   gdn     pools conv_state [conv_dim, K-1], recurrent_state [Hv, dv, dk] (V-major);
//           weights conv1d_weight [conv_dim, K], conv1d_bias [conv_dim] (optional), A_log [Hv], dt_bias [Hv]
//   mamba2  pools conv_state [conv_dim, K-1], ssm_state [Hs, P, N];
//           weights conv1d_weight [conv_dim, K], conv1d_bias [conv_dim] (optional), dt_bias, A_log, D [Hs]
// The projections and the gated norm around the core belong to the model, not to the layer's
// mixer, so they are not here. Throws Error naming /config/ssm <param> for a bad parameter.
struct LinearLayerTensorSpecs {
  std::vector<TensorSpec> state;
  std::vector<TensorSpec> weights;
};
LinearLayerTensorSpecs linear_layer_tensor_specs(const AttentionConfig& config);

// Checks the step's pools and weights against linear_layer_tensor_specs and /config/ssm against
// the mode's parameters; Error naming the item and "layer_kind <kind>", e.g.
// "missing weight /weights/A_log (required by layer_kind gdn: [4], ...)".
void validate_linear_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                             const std::map<std::string, TensorView>& weights);

// Runs config's linear layer over the batch (host tensors): reads tensors.linear_inputs rows
// [0, num_actual_tokens), writes rows [0, num_actual_tokens) of `output` ([T, output_width], any
// float dtype, rounded once) and updates tensors.ssm_state in place. Requests whose slot is < 0 and
// requests without tokens are skipped (zero rows, no state read or written); rows at or past
// num_actual_tokens are never written. A decode token takes the core's single-step form.
void linear_attention_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata,
                              const BatchDescription& batch, const StepTensors& tensors, const TensorView& output);

}  // namespace hybridtb::reference::ssm
