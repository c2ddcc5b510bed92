// The shared pieces of the model-layer SSM modes (layer_parts.h).
#include "layer_parts.h"

#include <utility>

#include "hybridtb/error.h"

namespace hybridtb::reference::ssm {

const Matrix& require_weight(const Weights& weights, const char* mode, const char* name, int64_t rows, int64_t cols) {
  const auto it = weights.find(name);
  HYBRIDTB_CHECK(it != weights.end(), "missing weight /weights/", name, " (required by ssm_mode ", mode, ")");
  HYBRIDTB_CHECK(it->second.rows() == rows && it->second.cols() == cols, "/weights/", name, " is [",
                 it->second.rows(), ", ", it->second.cols(), "], ssm_mode ", mode, " needs [", rows, ", ", cols, "]");
  return it->second;
}

Eigen::VectorXd vector_weight(const Weights& weights, const char* mode, const char* name, int64_t n, bool optional) {
  if (optional && weights.find(name) == weights.end()) return Eigen::VectorXd::Zero(n);
  return require_weight(weights, mode, name, 1, n).row(0).transpose();
}

Eigen::VectorXd& state_slot(State& state, const char* mode, const char* name, int64_t size) {
  const auto it = state.find(name);
  HYBRIDTB_CHECK(it != state.end(), "missing state pool /inputs/ssm/", name, " (required by ssm_mode ", mode, ")");
  HYBRIDTB_CHECK(it->second.size() == size, "state /inputs/ssm/", name, " slot has ", it->second.size(),
                 " values, ssm_mode ", mode, " needs ", size);
  return it->second;
}

Matrix causal_conv_silu(const Matrix& w, const Eigen::VectorXd& bias, const Matrix& inputs, Eigen::VectorXd& conv_state) {
  const int64_t C = inputs.cols(), K = w.cols(), L = inputs.rows();
  Matrix window(K - 1 + L, C);
  for (int64_t j = 0; j < K - 1; ++j) {
    for (int64_t c = 0; c < C; ++c) window(j, c) = conv_state(c * (K - 1) + j);
  }
  window.bottomRows(L) = inputs;
  Matrix out(L, C);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = bias(c);
      for (int64_t j = 0; j < K; ++j) acc += w(c, j) * window(t + j, c);
      out(t, c) = silu(acc);
    }
  }
  for (int64_t j = 0; j < K - 1; ++j) {
    for (int64_t c = 0; c < C; ++c) conv_state(c * (K - 1) + j) = window(L + j, c);
  }
  return out;
}

Matrix causal_conv_silu_step(const Matrix& w, const Eigen::VectorXd& bias, const Matrix& inputs,
                             Eigen::VectorXd& conv_state) {
  const int64_t C = inputs.cols(), K = w.cols();
  Matrix out(1, C);
  for (int64_t c = 0; c < C; ++c) {
    double* saved = conv_state.data() + c * (K - 1);
    double acc = bias(c);
    for (int64_t j = 0; j < K - 1; ++j) acc += w(c, j) * saved[j];
    acc += w(c, K - 1) * inputs(0, c);
    out(0, c) = silu(acc);
    for (int64_t j = 0; j + 1 < K - 1; ++j) saved[j] = saved[j + 1];
    saved[K - 2] = inputs(0, c);
  }
  return out;
}

}  // namespace hybridtb::reference::ssm
