// Pieces the model-layer SSM modes (mamba1, mamba2, gdn) share, private to reference/ssm: the
// activations as vLLM's kernels compute them, checked access to a mode's weights and state slots
// (errors name the item and the mode), and the depthwise causal conv1d + SiLU front end with its
// conv state ([channels, K−1] per slot, channel major, oldest input first — the hybrid-batch
// layout), in float64.
#pragma once

#include <Eigen/Core>

#include <cmath>
#include <cstdint>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {

// vLLM's kernels and torch's F.softplus switch to the identity above 20; log1p keeps small outputs exact.
inline double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }
inline double silu(double v) { return v / (1.0 + std::exp(-v)); }
inline double inv_sqrt(int64_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); }

// Weight `name` of ssm_mode `mode`, checked to be [rows, cols]; Error naming /weights/<name> otherwise.
const Matrix& require_weight(const Weights& weights, const char* mode, const char* name, int64_t rows, int64_t cols);
// A 1-d weight of length n (a [1, n] row of the Weights map) as a column vector; zeros if it is
// optional and absent.
Eigen::VectorXd vector_weight(const Weights& weights, const char* mode, const char* name, int64_t n, bool optional);
// One slot of state pool `name`, checked for its size; Error naming /inputs/ssm/<name> otherwise.
Eigen::VectorXd& state_slot(State& state, const char* mode, const char* name, int64_t size);

// causal_conv1d_fn + SiLU over L tokens: out[t, c] = silu(bias_c + Σ_j w[c, j]·window[t + j, c])
// with window = [K−1 saved inputs | inputs] (w[:, K−1] meets token t itself); the conv state
// becomes the last K−1 rows of the window (older saved inputs shift in when L < K−1).
// inputs [L, C], w [C, K], bias [C], conv_state C·(K−1) values.
Matrix causal_conv_silu(const Matrix& w, const Eigen::VectorXd& bias, const Matrix& inputs, Eigen::VectorXd& conv_state);
// causal_conv1d_update + SiLU for one token (inputs [1, C]): the dot reads the saved inputs before
// the state shifts left by one and takes the token.
Matrix causal_conv_silu_step(const Matrix& w, const Eigen::VectorXd& bias, const Matrix& inputs,
                             Eigen::VectorXd& conv_state);

}  // namespace hybridtb::reference::ssm
