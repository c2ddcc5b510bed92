// The naive float64 building blocks (see naive_ops.h).
#include "naive_ops.h"

#include <cmath>
#include <stdexcept>

#include "hybridtb/dtype.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

double naive_softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }

double naive_sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

double naive_silu(double v) { return v * naive_sigmoid(v); }

std::vector<double> values_of(const TensorView& view) {
  std::vector<double> out(at(view.numel()));
  const Shape shape = view.shape();
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t flat = 0; flat < out.size(); ++flat) {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset += index[d] * view.stride(static_cast<int>(d));
    out[flat] = load_as_double(view.data(), view.dtype(), offset);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

std::vector<double> naive_weight(const std::map<std::string, TensorView>& weights, const std::string& name,
                                 int64_t size, bool optional, const std::string& who) {
  const auto it = weights.find(name);
  if (it == weights.end()) {
    if (optional) return std::vector<double>(at(size), 0.0);
    throw std::runtime_error(who + ": missing weight " + name);
  }
  std::vector<double> values = values_of(it->second);
  if (values.size() != at(size)) throw std::runtime_error(who + ": wrong size of " + name);
  return values;
}

std::vector<double> naive_linear(const std::vector<double>& W, const double* x, int64_t rows, int64_t cols,
                                 const std::vector<double>* bias) {
  std::vector<double> y(at(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double sum = bias != nullptr ? (*bias)[at(r)] : 0.0;
    for (int64_t k = 0; k < cols; ++k) sum += W[at(r * cols + k)] * x[k];
    y[at(r)] = sum;
  }
  return y;
}

void naive_causal_conv_silu(const std::vector<double>& weight, const std::vector<double>& bias, int64_t K,
                            std::vector<double>& state, const double* x, double* out, int64_t C) {
  std::vector<double> taps(at(K));
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K - 1; ++j) taps[at(j)] = state[at(c * (K - 1) + j)];
    taps[at(K - 1)] = x[c];
    double pre = bias[at(c)];
    for (int64_t j = 0; j < K; ++j) pre += weight[at(c * K + j)] * taps[at(j)];
    out[c] = naive_silu(pre);
    for (int64_t j = 0; j < K - 1; ++j) state[at(c * (K - 1) + j)] = taps[at(j + 1)];
  }
}

void naive_gated_rms_norm(const double* y, const double* z, const double* w, int64_t n, double eps,
                          bool norm_before_gate, double* out) {
  std::vector<double> v(at(n));
  for (int64_t i = 0; i < n; ++i) v[at(i)] = norm_before_gate ? y[i] : y[i] * z[i] * naive_sigmoid(z[i]);
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += v[at(i)] * v[at(i)];
  const double rms = std::sqrt(sum_sq / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = norm_before_gate ? v[at(i)] / rms * w[i] * naive_silu(z[i]) : v[at(i)] / rms * w[i];
  }
}

}  // namespace hybridtb::testing
