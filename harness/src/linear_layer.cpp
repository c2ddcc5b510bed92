// The inputs and output of a linear-attention layer, by kind (linear_layer.h). The widths are the
// cores' (reference/ssm/gdn_core.h, mamba2_core.h):
// tests/per_layer checks the two agree.
#include "hybridtb/linear_layer.h"

#include "hybridtb/error.h"

namespace hybridtb {

namespace {

// A /config/ssm parameter the widths need: present and positive (the core checks the relations
// between them, e.g. num_v_heads a multiple of num_k_heads, when the step runs).
int64_t param(const AttentionConfig& config, const char* name) {
  const auto it = config.ssm_params.find(name);
  HYBRIDTB_CHECK(it != config.ssm_params.end(), "missing /config/ssm ", name, " (a parameter of layer_kind ",
                 to_string(config.layer_kind), ", needed for the shapes of its inputs)");
  HYBRIDTB_CHECK(it->second > 0, "/config/ssm ", name, " must be > 0, got ", it->second);
  return it->second;
}

LinearLayerSpec gdn_spec(const AttentionConfig& c) {
  const int64_t Hk = param(c, "num_k_heads"), Hv = param(c, "num_v_heads");
  const int64_t dk = param(c, "head_k_dim"), dv = param(c, "head_v_dim");
  return {.inputs = {{"mixed_qkv", 2 * Hk * dk + Hv * dv, "2*num_k_heads*head_k_dim + num_v_heads*head_v_dim",
                      "the conv input [q_all | k_all | v_all] per token, before the conv"},
                     {"a", Hv, "num_v_heads", "the decay's input per value head: g = -exp(A_log)*softplus(a + dt_bias)"},
                     {"b", Hv, "num_v_heads", "beta's input per value head: beta = sigmoid(b)"}},
          .output_width = Hv * dv,
          .output_meaning = "o, the delta rule's read-out before the gated norm, value head major: num_v_heads*head_v_dim"};
}

LinearLayerSpec mamba2_spec(const AttentionConfig& c) {
  const int64_t Hs = param(c, "num_ssm_heads"), P = param(c, "head_dim");
  const int64_t N = param(c, "state_size"), G = param(c, "n_groups");
  return {.inputs = {{"xBC", Hs * P + 2 * G * N, "num_ssm_heads*head_dim + 2*n_groups*state_size",
                      "the conv input [x | B | C] per token, before the conv"},
                     {"dt", Hs, "num_ssm_heads", "dt per head, before dt_bias and the softplus"}},
          .output_width = Hs * P,
          .output_meaning = "y, the SSM output with the D skip before the gated norm, head major: num_ssm_heads*head_dim"};
}

}  // namespace

LinearLayerSpec linear_layer_spec(const AttentionConfig& config) {
  switch (config.layer_kind) {
    case LayerKind::kGdn: return gdn_spec(config);
    case LayerKind::kMamba2: return mamba2_spec(config);
    case LayerKind::kFullAttention: break;
  }
  throw Error("linear_layer_spec: layer_kind full_attention has no linear-attention inputs");
}

std::vector<std::pair<std::string, LayerKind>> foreign_linear_inputs(LayerKind kind) {
  const std::vector<std::pair<std::string, LayerKind>> all = {
      {"mixed_qkv", LayerKind::kGdn}, {"a", LayerKind::kGdn}, {"b", LayerKind::kGdn},
      {"xBC", LayerKind::kMamba2},    {"dt", LayerKind::kMamba2}};
  std::vector<std::pair<std::string, LayerKind>> foreign;
  for (const auto& entry : all) {
    if (entry.second != kind) foreign.push_back(entry);
  }
  return foreign;
}

}  // namespace hybridtb
