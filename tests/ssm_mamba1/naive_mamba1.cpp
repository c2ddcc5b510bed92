// The naive Mamba-1 token loop (see naive_mamba1.h).
#include "naive_mamba1.h"

#include <cmath>
#include <stdexcept>

#include "hybridtb/dtype.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// vLLM's kernel form: (v <= 20) ? log1p(exp(v)) : v.
double naive_softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }

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

std::vector<double> weight(const std::map<std::string, TensorView>& weights, const std::string& name, size_t size,
                           bool optional) {
  const auto it = weights.find(name);
  if (it == weights.end()) {
    if (optional) return std::vector<double>(size, 0.0);
    throw std::runtime_error("naive_mamba1_model: missing weight " + name);
  }
  std::vector<double> values = values_of(it->second);
  if (values.size() != size) throw std::runtime_error("naive_mamba1_model: wrong size of " + name);
  return values;
}

}  // namespace

std::vector<double> naive_mamba1(const NaiveMamba1& m, NaiveMamba1State& state, const std::vector<double>& hidden,
                                 int64_t num_tokens) {
  const int64_t H = m.sizes.H, I = m.sizes.I, N = m.sizes.N, K = m.sizes.K, R = m.sizes.R;
  std::vector<double> out(at(num_tokens * H), 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const double* h_in = &hidden[at(t * H)];

    // in_proj: x = rows [0, I), z = rows [I, 2I).
    std::vector<double> x(at(I)), z(at(I));
    for (int64_t row = 0; row < 2 * I; ++row) {
      double sum = m.in_proj_bias[at(row)];
      for (int64_t k = 0; k < H; ++k) sum += m.in_proj[at(row * H + k)] * h_in[k];
      if (row < I) {
        x[at(row)] = sum;
      } else {
        z[at(row - I)] = sum;
      }
    }

    // Causal conv over the K most recent inputs (K−1 saved + this one), SiLU, shift the state.
    std::vector<double> u(at(I));
    for (int64_t i = 0; i < I; ++i) {
      std::vector<double> taps(at(K));
      for (int64_t j = 0; j < K - 1; ++j) taps[at(j)] = state.conv[at(i * (K - 1) + j)];
      taps[at(K - 1)] = x[at(i)];
      double pre = m.conv_bias[at(i)];
      for (int64_t j = 0; j < K; ++j) pre += m.conv_weight[at(i * K + j)] * taps[at(j)];
      u[at(i)] = pre * naive_sigmoid(pre);
      for (int64_t j = 0; j < K - 1; ++j) state.conv[at(i * (K - 1) + j)] = taps[at(j + 1)];
    }

    // x_proj → dt_in, B, C.
    std::vector<double> dt_in(at(R)), B(at(N)), C(at(N));
    for (int64_t row = 0; row < R + 2 * N; ++row) {
      double sum = 0.0;
      for (int64_t i = 0; i < I; ++i) sum += m.x_proj[at(row * I + i)] * u[at(i)];
      if (row < R) {
        dt_in[at(row)] = sum;
      } else if (row < R + N) {
        B[at(row - R)] = sum;
      } else {
        C[at(row - R - N)] = sum;
      }
    }

    // Per channel: Δ, the state update, the readout with the D skip, the z gate.
    std::vector<double> gated(at(I));
    for (int64_t i = 0; i < I; ++i) {
      double dt = 0.0;
      for (int64_t r = 0; r < R; ++r) dt += m.dt_proj[at(i * R + r)] * dt_in[at(r)];
      const double delta = naive_softplus(dt + m.dt_proj_bias[at(i)]);
      double y = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double A = -std::exp(m.A_log[at(i * N + n)]);
        double& h = state.ssm[at(i * N + n)];
        h = std::exp(delta * A) * h + delta * B[at(n)] * u[at(i)];
        y += C[at(n)] * h;
      }
      y += m.D[at(i)] * u[at(i)];
      gated[at(i)] = y * (z[at(i)] * naive_sigmoid(z[at(i)]));
    }

    // out_proj.
    for (int64_t k = 0; k < H; ++k) {
      double sum = m.out_proj_bias[at(k)];
      for (int64_t i = 0; i < I; ++i) sum += m.out_proj[at(k * I + i)] * gated[at(i)];
      out[at(t * H + k)] = sum;
    }
  }
  return out;
}

NaiveMamba1 naive_mamba1_model(const Mamba1Sizes& s, const std::map<std::string, TensorView>& weights) {
  NaiveMamba1 m;
  m.sizes = s;
  m.in_proj = weight(weights, "in_proj", at(2 * s.I * s.H), false);
  m.in_proj_bias = weight(weights, "in_proj_bias", at(2 * s.I), true);
  m.conv_weight = weight(weights, "conv1d_weight", at(s.I * s.K), false);
  m.conv_bias = weight(weights, "conv1d_bias", at(s.I), true);
  m.x_proj = weight(weights, "x_proj", at((s.R + 2 * s.N) * s.I), false);
  m.dt_proj = weight(weights, "dt_proj", at(s.I * s.R), false);
  m.dt_proj_bias = weight(weights, "dt_proj_bias", at(s.I), false);
  m.A_log = weight(weights, "A_log", at(s.I * s.N), false);
  m.D = weight(weights, "D", at(s.I), false);
  m.out_proj = weight(weights, "out_proj", at(s.H * s.I), false);
  m.out_proj_bias = weight(weights, "out_proj_bias", at(s.H), true);
  return m;
}

NaiveMamba1State naive_mamba1_state(const std::map<std::string, TensorView>& pools, int64_t slot) {
  NaiveMamba1State state;
  state.conv = values_of(pools.at("conv_state").slice_rows(slot, slot + 1));
  state.ssm = values_of(pools.at("ssm_state").slice_rows(slot, slot + 1));
  return state;
}

}  // namespace hybridtb::testing
