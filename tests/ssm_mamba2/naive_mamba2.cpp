// The naive Mamba-2 token loop (see naive_mamba2.h).
#include "naive_mamba2.h"

#include <cmath>
#include <stdexcept>

#include "hybridtb/dtype.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

double naive_sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// All values of a host view, row-major.
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

std::vector<double> weight(const std::map<std::string, TensorView>& weights, const std::string& name, int64_t size,
                           bool optional) {
  const auto it = weights.find(name);
  if (it == weights.end()) {
    if (optional) return std::vector<double>(at(size), 0.0);
    throw std::runtime_error("naive_mamba2_model: missing weight " + name);
  }
  std::vector<double> values = values_of(it->second);
  if (values.size() != at(size)) throw std::runtime_error("naive_mamba2_model: wrong size of " + name);
  return values;
}

}  // namespace

double naive_mamba2_softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }

std::vector<double> naive_mamba2_conv(const NaiveMamba2& m, std::vector<double>& conv_state,
                                      const std::vector<double>& xBC, int64_t num_tokens) {
  const int64_t C = m.dims.conv_dim(), K = m.dims.K;
  std::vector<double> out(at(num_tokens * C));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      // The K most recent inputs of channel c: K−1 saved, then this token's.
      std::vector<double> taps(at(K));
      for (int64_t j = 0; j < K - 1; ++j) taps[at(j)] = conv_state[at(c * (K - 1) + j)];
      taps[at(K - 1)] = xBC[at(t * C + c)];
      double pre = m.conv_bias[at(c)];
      for (int64_t j = 0; j < K; ++j) pre += m.conv_weight[at(c * K + j)] * taps[at(j)];
      out[at(t * C + c)] = pre * naive_sigmoid(pre);
      for (int64_t j = 0; j < K - 1; ++j) conv_state[at(c * (K - 1) + j)] = taps[at(j + 1)];
    }
  }
  return out;
}

std::vector<double> naive_mamba2(const NaiveMamba2& m, NaiveMamba2State& state, const std::vector<double>& hidden,
                                 int64_t num_tokens) {
  const Mamba2Dims& d = m.dims;
  const int64_t H = d.H, Hs = d.Hs, P = d.P, N = d.N, G = d.G;
  const int64_t d_ssm = d.d_ssm(), conv_dim = d.conv_dim(), proj = d.proj();
  const int64_t heads_per_group = Hs / G;
  const int64_t group_size = d_ssm / G;
  std::vector<double> out(at(num_tokens * H), 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    // in_proj: [z (d_ssm) | xBC (conv_dim) | dt (Hs)].
    std::vector<double> projected(at(proj));
    for (int64_t row = 0; row < proj; ++row) {
      double sum = m.in_proj_bias[at(row)];
      for (int64_t k = 0; k < H; ++k) sum += m.in_proj[at(row * H + k)] * hidden[at(t * H + k)];
      projected[at(row)] = sum;
    }
    const std::vector<double> xBC(projected.begin() + d_ssm, projected.begin() + d_ssm + conv_dim);
    const std::vector<double> c = naive_mamba2_conv(m, state.conv, xBC, 1);  // [x | B | C]

    // Per head: Δ, the scalar decay, S = a·S + Δ·x ⊗ B, y = S·C + D·x.
    std::vector<double> y(at(d_ssm));
    for (int64_t h = 0; h < Hs; ++h) {
      const int64_t g = h / heads_per_group;
      const double delta = naive_mamba2_softplus(projected[at(d_ssm + conv_dim + h)] + m.dt_bias[at(h)]);
      const double a = std::exp(-delta * std::exp(m.A_log[at(h)]));
      for (int64_t p = 0; p < P; ++p) {
        const double x = c[at(h * P + p)];
        double sum = 0.0;
        for (int64_t n = 0; n < N; ++n) {
          const double B = c[at(d_ssm + g * N + n)];
          const double Cn = c[at(d_ssm + G * N + g * N + n)];
          double& S = state.ssm[at((h * P + p) * N + n)];
          S = a * S + delta * B * x;
          sum += Cn * S;
        }
        y[at(h * P + p)] = sum + m.D[at(h)] * x;
      }
    }

    // Gate with silu(z), then RMS-normalise each group of d_ssm / G channels, scale by the weight.
    std::vector<double> v(at(d_ssm));
    for (int64_t i = 0; i < d_ssm; ++i) {
      const double z = projected[at(i)];
      v[at(i)] = y[at(i)] * z * naive_sigmoid(z);
    }
    for (int64_t g = 0; g < G; ++g) {
      double sum_sq = 0.0;
      for (int64_t i = g * group_size; i < (g + 1) * group_size; ++i) sum_sq += v[at(i)] * v[at(i)];
      const double rms = std::sqrt(sum_sq / static_cast<double>(group_size) + 1e-5);
      for (int64_t i = g * group_size; i < (g + 1) * group_size; ++i) v[at(i)] = v[at(i)] / rms * m.norm_weight[at(i)];
    }

    // out_proj.
    for (int64_t k = 0; k < H; ++k) {
      double sum = m.out_proj_bias[at(k)];
      for (int64_t i = 0; i < d_ssm; ++i) sum += m.out_proj[at(k * d_ssm + i)] * v[at(i)];
      out[at(t * H + k)] = sum;
    }
  }
  return out;
}

NaiveMamba2 naive_mamba2_model(const Mamba2Dims& d, const std::map<std::string, TensorView>& weights) {
  NaiveMamba2 m;
  m.dims = d;
  m.in_proj = weight(weights, "in_proj", d.proj() * d.H, false);
  m.in_proj_bias = weight(weights, "in_proj_bias", d.proj(), true);
  m.conv_weight = weight(weights, "conv1d_weight", d.conv_dim() * d.K, false);
  m.conv_bias = weight(weights, "conv1d_bias", d.conv_dim(), true);
  m.dt_bias = weight(weights, "dt_bias", d.Hs, false);
  m.A_log = weight(weights, "A_log", d.Hs, false);
  m.D = weight(weights, "D", d.Hs, false);
  m.norm_weight = weight(weights, "norm_weight", d.d_ssm(), false);
  m.out_proj = weight(weights, "out_proj", d.H * d.d_ssm(), false);
  m.out_proj_bias = weight(weights, "out_proj_bias", d.H, true);
  return m;
}

}  // namespace hybridtb::testing
