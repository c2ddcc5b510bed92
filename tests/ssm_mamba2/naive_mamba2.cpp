// The naive Mamba-2 token loop (see naive_mamba2.h).
#include "naive_mamba2.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "naive_ops.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

std::vector<double> naive_mamba2_conv(const NaiveMamba2& m, std::vector<double>& conv_state,
                                      const std::vector<double>& xBC, int64_t num_tokens) {
  const int64_t C = m.dims.conv_dim();
  std::vector<double> out(at(num_tokens * C));
  for (int64_t t = 0; t < num_tokens; ++t) {
    naive_causal_conv_silu(m.conv_weight, m.conv_bias, m.dims.K, conv_state, &xBC[at(t * C)], &out[at(t * C)], C);
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
    const std::vector<double> projected = naive_linear(m.in_proj, &hidden[at(t * H)], proj, H, &m.in_proj_bias);
    const std::vector<double> xBC(projected.begin() + d_ssm, projected.begin() + d_ssm + conv_dim);
    const std::vector<double> c = naive_mamba2_conv(m, state.conv, xBC, 1);  // [x | B | C]

    // Per head: Δ, the scalar decay, S = a·S + Δ·x ⊗ B, y = S·C + D·x.
    std::vector<double> y(at(d_ssm));
    for (int64_t h = 0; h < Hs; ++h) {
      const int64_t g = h / heads_per_group;
      const double delta = naive_softplus(projected[at(d_ssm + conv_dim + h)] + m.dt_bias[at(h)]);
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
    for (int64_t g = 0; g < G; ++g) {
      const int64_t begin = g * group_size;
      naive_gated_rms_norm(&y[at(begin)], &projected[at(begin)], &m.norm_weight[at(begin)], group_size, 1e-5, false,
                           &v[at(begin)]);
    }

    // out_proj.
    const std::vector<double> o = naive_linear(m.out_proj, v.data(), H, d_ssm, &m.out_proj_bias);
    std::copy(o.begin(), o.end(), out.begin() + static_cast<std::ptrdiff_t>(t * H));
  }
  return out;
}

NaiveMamba2 naive_mamba2_model(const Mamba2Dims& d, const std::map<std::string, TensorView>& weights) {
  const auto weight = [&](const std::string& name, int64_t size, bool optional) {
    return naive_weight(weights, name, size, optional, "naive_mamba2_model");
  };
  NaiveMamba2 m;
  m.dims = d;
  m.in_proj = weight("in_proj", d.proj() * d.H, false);
  m.in_proj_bias = weight("in_proj_bias", d.proj(), true);
  m.conv_weight = weight("conv1d_weight", d.conv_dim() * d.K, false);
  m.conv_bias = weight("conv1d_bias", d.conv_dim(), true);
  m.dt_bias = weight("dt_bias", d.Hs, false);
  m.A_log = weight("A_log", d.Hs, false);
  m.D = weight("D", d.Hs, false);
  m.norm_weight = weight("norm_weight", d.d_ssm(), false);
  m.out_proj = weight("out_proj", d.H * d.d_ssm(), false);
  m.out_proj_bias = weight("out_proj_bias", d.H, true);
  return m;
}

}  // namespace hybridtb::testing
