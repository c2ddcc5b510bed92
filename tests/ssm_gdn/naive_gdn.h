// A naive Gated DeltaNet layer, written independently of reference/ssm/gdn.cpp so the two check
// each other: std::vector storage, explicit index loops, one token at a time, float64, no Eigen. It
// keeps the recurrent state K-major, S [Hv][dk][dv] as fla and HF do (S = Mᵀ of the mode's V-major
// pool), and follows the gated delta rule of fla's fused_recurrent kernel directly: decay first,
// u = β(v − S̃ᵀk̂), S = S̃ + k̂uᵀ, o = Sᵀq̂. Activations, dense layers and the gated RMS norm are
// those of tests/support/naive_ops.h. Test-only; used by tests/ssm_gdn (ctest -L gdn).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/tensor.h"

namespace hybridtb::testing {

// H = hidden, Hk/Hv key/value heads, dk/dv head dims, K conv taps; C = 2·Hk·dk + Hv·dv conv channels.
struct GdnDims {
  int64_t H = 0;
  int64_t Hk = 0;
  int64_t Hv = 0;
  int64_t dk = 0;
  int64_t dv = 0;
  int64_t K = 0;
  int64_t C() const { return 2 * Hk * dk + Hv * dv; }
};

// Weights, row-major; an absent conv bias is zeros.
struct NaiveGdn {
  GdnDims dims;
  std::vector<double> in_proj_qkvz;  // [C + Hv·dv][H]: q_all, k_all, v_all, z_all rows
  std::vector<double> in_proj_ba;    // [2Hv][H]: b rows, then a rows
  std::vector<double> conv_weight;   // [C][K]: tap K−1 multiplies the current token
  std::vector<double> conv_bias;     // [C]
  std::vector<double> A_log;         // [Hv]
  std::vector<double> dt_bias;       // [Hv]
  std::vector<double> norm_weight;   // [dv]
  std::vector<double> out_proj;      // [H][Hv·dv]
};

// One request's state, K-major.
struct NaiveGdnState {
  std::vector<double> conv;  // [C][K−1], oldest input first
  std::vector<double> S;     // [Hv][dk][dv]
};

// What the delta rule consumes, per token and VALUE head (the key head i / (Hv/Hk) already
// picked): q̂ (scaled by dk^-1/2), k̂, v, the log-decay g and β.
struct GdnTokens {
  int64_t L = 0;
  std::vector<double> q;     // [L][Hv][dk]
  std::vector<double> k;     // [L][Hv][dk]
  std::vector<double> v;     // [L][Hv][dv]
  std::vector<double> g;     // [L][Hv]
  std::vector<double> beta;  // [L][Hv]
};

// The front end for L tokens: conv (advancing state.conv) + SiLU, split, L2 normalisation, gates.
// mixed_qkv is [L][C], a and b [L][Hv].
GdnTokens naive_gdn_tokens(const NaiveGdn& model, std::vector<double>& conv_state, const std::vector<double>& mixed_qkv,
                           const std::vector<double>& a, const std::vector<double>& b, int64_t L);

// The K-major delta rule over the tokens, advancing S [Hv][dk][dv]; returns o [L][Hv][dv].
std::vector<double> naive_delta_rule(const GdnDims& dims, const GdnTokens& tokens, std::vector<double>& S);

// The whole layer for L tokens: hidden [L][H] → contributions [L][H]; leaves `state` after the last.
std::vector<double> naive_gdn(const NaiveGdn& model, NaiveGdnState& state, const std::vector<double>& hidden,
                              int64_t L);

// The model from named host tensors of any floating dtype (the /weights names of the file format).
NaiveGdn naive_gdn_model(const GdnDims& dims, const std::map<std::string, TensorView>& weights);

}  // namespace hybridtb::testing
