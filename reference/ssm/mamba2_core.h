// Private to reference/ssm (and its tests): the core of the Mamba-2 (SSD) layer of ssm_mode mamba2,
// callable on its own. The core is everything between in_proj and the gated norm — causal conv1d +
// SiLU over xBC, the split into x, B and C, Δ = softplus(dt + dt_bias), the scalar-decay recurrence
// and the D skip — so a caller that stores a layer's per-token xBC and dt rows (vLLM's
// MambaMixer2 hands exactly these to its SSM kernels) can run the reference on them without
// in_proj, the norm or out_proj. Defined in mamba2.cpp; the mode (in_proj → core → gated norm with
// z → out_proj) is built on it. Math: ../shared/notes/ssm-modes.md §1.1 and §1.3.
#pragma once

#include <Eigen/Core>

#include <cstdint>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {

// The sizes of a Mamba-2 layer's SSM part (the /config/ssm parameters of ssm_mode mamba2).
struct Mamba2Sizes {
  int64_t heads = 0;     // Hs (num_ssm_heads): one scalar decay per head
  int64_t head_dim = 0;  // P
  int64_t state = 0;     // N (state_size)
  int64_t groups = 0;    // G (n_groups): head h reads B and C of group h / (Hs / G)
  int64_t kernel = 0;    // K (conv_kernel) ≥ 2

  int64_t d_ssm() const { return heads * head_dim; }
  int64_t conv_dim() const { return d_ssm() + 2 * groups * state; }  // x | B | C channels
  int64_t group_of(int64_t head) const { return head / (heads / groups); }
};

// Throws Error naming the /config/ssm parameter unless every size is positive, n_groups divides
// num_ssm_heads and conv_kernel ≥ 2.
void check_mamba2_sizes(const Mamba2Sizes& sizes);

// The sizes from /config/ssm num_ssm_heads, head_dim, state_size, n_groups and conv_kernel, checked
// by check_mamba2_sizes (the mode and a per-layer mamba2 layer read them alike).
Mamba2Sizes mamba2_sizes(const ModeShape& shape);

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
