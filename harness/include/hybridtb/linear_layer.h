// The per-step inputs and output of a linear-attention layer (/config layer_kind gdn or mamba2) of
// a per-layer hybrid model, by name and width. A linear layer has no query, key, value or KV cache:
// its mixer is an SSM mode's core (reference/ssm/gdn_core.h, mamba2_core.h) run on token-major
// rows the layer's projections produced, as pymllm's forward_gdn(layer, batch, mixed_qkv, a, b)
// receives them. The file reader checks /inputs against this, the reference backend feeds the rows
// to the core, and the step runner sizes the output from it (datasets/SCHEMA.md §6.4).
//
// Only the inputs and the output are defined here: the layer's state pools and weights are the
// core's (reference::ssm::linear_layer_tensor_specs), checked when the step runs, as a parallel
// SSM branch's are.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/config.h"

namespace hybridtb {

// One input: /inputs/<name>, [T, width] in the layer's dtype (/config dtype), token-major like
// /inputs/query (rows at or past num_actual_tokens are CUDA-graph padding and never read).
struct LinearInput {
  std::string name;
  int64_t width = 0;
  std::string width_formula;  // "num_v_heads": the width in the /config/ssm parameters' names
  std::string meaning;        // one line for error messages and docs
};

struct LinearLayerSpec {
  std::vector<LinearInput> inputs;
  int64_t output_width = 0;    // /outputs/output is [T, output_width]
  std::string output_meaning;  // e.g. "o: the delta rule's read-out, value head major (Hv*dv)"
};

// The spec of config's linear layer from its /config/ssm parameters:
//   gdn     mixed_qkv [T, 2·Hk·dk + Hv·dv] (q | k | v, before the conv), a [T, Hv], b [T, Hv];
//           output o [T, Hv·dv]   (parameters num_k_heads, num_v_heads, head_k_dim, head_v_dim)
//   mamba2  xBC [T, Hs·P + 2·G·N] (x | B | C, before the conv), dt [T, Hs];
//           output y [T, Hs·P]    (parameters num_ssm_heads, head_dim, state_size, n_groups)
// Throws Error if config is not a linear layer, or naming "/config/ssm <name>" if a parameter the
// widths need is missing or not positive.
LinearLayerSpec linear_layer_spec(const AttentionConfig& config);

// The input names of every linear kind but `kind` (all of them for full_attention): a file holding
// one of them under /inputs belongs to another kind, which the reader reports instead of ignoring.
std::vector<std::pair<std::string, LayerKind>> foreign_linear_inputs(LayerKind kind);

}  // namespace hybridtb
