// The naive Mamba-1 token loop (see naive_mamba1.h).
#include "naive_mamba1.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "naive_ops.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

std::vector<double> naive_mamba1(const NaiveMamba1& m, NaiveMamba1State& state, const std::vector<double>& hidden,
                                 int64_t num_tokens) {
  const int64_t H = m.sizes.H, I = m.sizes.I, N = m.sizes.N, K = m.sizes.K, R = m.sizes.R;
  std::vector<double> out(at(num_tokens * H), 0.0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const double* h_in = &hidden[at(t * H)];

    // in_proj: x = rows [0, I), z = rows [I, 2I).
    const std::vector<double> xz = naive_linear(m.in_proj, h_in, 2 * I, H, &m.in_proj_bias);
    const double* x = xz.data();
    const double* z = xz.data() + I;

    // Causal conv over the K most recent inputs (K−1 saved + this one), SiLU, shift the state.
    std::vector<double> u(at(I));
    naive_causal_conv_silu(m.conv_weight, m.conv_bias, K, state.conv, x, u.data(), I);

    // x_proj → dt_in (rows [0, R)), B (rows [R, R+N)), C (rows [R+N, R+2N)).
    const std::vector<double> dBC = naive_linear(m.x_proj, u.data(), R + 2 * N, I);
    const double* B = dBC.data() + R;
    const double* C = dBC.data() + R + N;

    // Per channel: Δ, the state update, the readout with the D skip, the z gate.
    const std::vector<double> dt = naive_linear(m.dt_proj, dBC.data(), I, R);
    std::vector<double> gated(at(I));
    for (int64_t i = 0; i < I; ++i) {
      const double delta = naive_softplus(dt[at(i)] + m.dt_proj_bias[at(i)]);
      double y = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double A = -std::exp(m.A_log[at(i * N + n)]);
        double& h = state.ssm[at(i * N + n)];
        h = std::exp(delta * A) * h + delta * B[n] * u[at(i)];
        y += C[n] * h;
      }
      y += m.D[at(i)] * u[at(i)];
      gated[at(i)] = y * naive_silu(z[i]);
    }

    // out_proj.
    const std::vector<double> y = naive_linear(m.out_proj, gated.data(), H, I, &m.out_proj_bias);
    std::copy(y.begin(), y.end(), out.begin() + static_cast<std::ptrdiff_t>(t * H));
  }
  return out;
}

NaiveMamba1 naive_mamba1_model(const Mamba1Sizes& s, const std::map<std::string, TensorView>& weights) {
  const auto weight = [&](const std::string& name, int64_t size, bool optional) {
    return naive_weight(weights, name, size, optional, "naive_mamba1_model");
  };
  NaiveMamba1 m;
  m.sizes = s;
  m.in_proj = weight("in_proj", 2 * s.I * s.H, false);
  m.in_proj_bias = weight("in_proj_bias", 2 * s.I, true);
  m.conv_weight = weight("conv1d_weight", s.I * s.K, false);
  m.conv_bias = weight("conv1d_bias", s.I, true);
  m.x_proj = weight("x_proj", (s.R + 2 * s.N) * s.I, false);
  m.dt_proj = weight("dt_proj", s.I * s.R, false);
  m.dt_proj_bias = weight("dt_proj_bias", s.I, false);
  m.A_log = weight("A_log", s.I * s.N, false);
  m.D = weight("D", s.I, false);
  m.out_proj = weight("out_proj", s.H * s.I, false);
  m.out_proj_bias = weight("out_proj_bias", s.H, true);
  return m;
}

NaiveMamba1State naive_mamba1_state(const std::map<std::string, TensorView>& pools, int64_t slot) {
  NaiveMamba1State state;
  state.conv = values_of(pools.at("conv_state").slice_rows(slot, slot + 1));
  state.ssm = values_of(pools.at("ssm_state").slice_rows(slot, slot + 1));
  return state;
}

}  // namespace hybridtb::testing
