// Private to reference/ssm (and its tests): the core of the Mamba-2 (SSD) layer of ssm_mode mamba2,
// callable on its own. The core is everything between in_proj and the gated norm — causal conv1d +
// SiLU over xBC, the split into x, B and C, Δ = softplus(dt + dt_bias), the scalar-decay recurrence
// and the D skip — so a caller that stores a layer's per-token xBC and dt rows (vLLM's
// MambaMixer2 hands exactly these to its SSM kernels) can run the reference on them without
// in_proj, the norm or out_proj. Defined in mamba2.cpp; the mode (in_proj → core → gated norm with
// z → out_proj) is built on it. Math: the Mamba-2 paper's SSD recurrence, as mamba_ssm computes it.
#pragma once

#include <Eigen/Core>

#include <cstdint>

#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/spec/ssm_mode_sizes.h"

namespace hybridtb::reference::ssm {

using spec::ssm::check_mamba2_sizes;
using spec::ssm::mamba2_sizes;
using spec::ssm::Mamba2Sizes;

// The core's weights in float64 (/weights names of ssm_mode mamba2).
struct Mamba2CoreWeights {
  Matrix conv_weight;         // conv1d_weight [conv_dim, K]: column K−1 multiplies the current token
  Eigen::VectorXd conv_bias;  // conv1d_bias [conv_dim] (zeros when absent)
  Eigen::VectorXd dt_bias;    // dt_bias [Hs], added before the softplus
  Eigen::VectorXd A;          // [Hs] = −exp(A_log)
  Eigen::VectorXd D;          // D [Hs], the skip y += D·x
};

// The core's weights taken from a mode's weight map, checked against `sizes`; throws Error naming
// a missing or misshapen /weights/<name>.
Mamba2CoreWeights mamba2_core_weights(const Weights& weights, const Mamba2Sizes& sizes);

// Advances one request over L consecutive tokens and returns y [L, d_ssm] (head-major: column
// h·P + p), the SSM output with the D skip, before the gated norm.
//   xBC [L, conv_dim]: the tokens' conv inputs (in_proj's x | B | C columns, before the conv);
//   dt  [L, Hs]:       in_proj's dt columns (before dt_bias and the softplus);
//   conv_state [conv_dim·(K−1)]: [conv_dim, K−1] row-major, the last K−1 conv inputs, oldest first;
//   ssm_state  [Hs·P·N]:         [Hs, P, N] row-major (vLLM's layout);
// both updated in place. `decode` (L must be 1) takes vLLM's single-step form
// (causal_conv1d_update + selective_state_update); otherwise a token-by-token float64 recurrence.
Matrix mamba2_core(const Mamba2Sizes& sizes, const Mamba2CoreWeights& weights, const Matrix& xBC, const Matrix& dt,
                   Eigen::VectorXd& conv_state, Eigen::VectorXd& ssm_state, bool decode);

}  // namespace hybridtb::reference::ssm
