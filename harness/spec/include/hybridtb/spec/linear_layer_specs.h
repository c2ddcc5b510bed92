// The descriptor of a linear-attention layer (/config layer_kind gdn or mamba2; a per-layer hybrid
// model's GDN or Mamba-2 layers): which of its mode's tensors the layer's mixer reads, and the
// check of a step's tensors against them. Read by both backends and the tools; the math is the
// reference's (hybridtb/reference/linear_layer.h) and the CUDA backend's.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hybridtb/config.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/tensor.h"

namespace hybridtb::spec::ssm {

// The mode's weights that the core of a linear layer of `kind` reads (gdn: conv1d_weight,
// conv1d_bias, A_log, dt_bias; mamba2: conv1d_weight, conv1d_bias, dt_bias, A_log, D). Error for
// full_attention.
std::vector<std::string> linear_core_weight_names(LayerKind kind);

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

}  // namespace hybridtb::spec::ssm
