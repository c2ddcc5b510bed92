// The naive Gated DeltaNet layer (see naive_gdn.h).
#include "naive_gdn.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "naive_ops.h"

namespace hybridtb::testing {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// v / sqrt(Σv² + 1e-6) over n values (fla l2norm_fwd).
void l2_normalise(double* v, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += v[i] * v[i];
  const double norm = std::sqrt(sum + 1e-6);
  for (int64_t i = 0; i < n; ++i) v[i] /= norm;
}

}  // namespace

GdnTokens naive_gdn_tokens(const NaiveGdn& m, std::vector<double>& conv_state, const std::vector<double>& mixed_qkv,
                           const std::vector<double>& a, const std::vector<double>& b, int64_t L) {
  const GdnDims& d = m.dims;
  const int64_t C = d.C(), K = d.K, group = d.Hv / d.Hk;
  GdnTokens out;
  out.L = L;
  out.q.resize(at(L * d.Hv * d.dk));
  out.k.resize(at(L * d.Hv * d.dk));
  out.v.resize(at(L * d.Hv * d.dv));
  out.g.resize(at(L * d.Hv));
  out.beta.resize(at(L * d.Hv));
  for (int64_t t = 0; t < L; ++t) {
    // Causal conv over the K most recent inputs: the bias and this token's tap, then the K−1 saved
    // ones; SiLU; shift the state.
    std::vector<double> act(at(C));
    for (int64_t c = 0; c < C; ++c) {
      double pre = m.conv_bias[at(c)] + m.conv_weight[at(c * K + K - 1)] * mixed_qkv[at(t * C + c)];
      for (int64_t j = 0; j < K - 1; ++j) pre += m.conv_weight[at(c * K + j)] * conv_state[at(c * (K - 1) + j)];
      act[at(c)] = naive_silu(pre);
      for (int64_t j = 0; j + 1 < K - 1; ++j) conv_state[at(c * (K - 1) + j)] = conv_state[at(c * (K - 1) + j + 1)];
      conv_state[at(c * (K - 1) + K - 2)] = mixed_qkv[at(t * C + c)];
    }
    // Channels: q of key head h at h·dk, k at Hk·dk + h·dk, v of value head i at 2·Hk·dk + i·dv.
    for (int64_t h = 0; h < d.Hk; ++h) {
      l2_normalise(&act[at(h * d.dk)], d.dk);
      l2_normalise(&act[at(d.Hk * d.dk + h * d.dk)], d.dk);
    }
    for (int64_t i = 0; i < d.Hv; ++i) {
      const int64_t key_head = i / group;
      for (int64_t r = 0; r < d.dk; ++r) {
        out.q[at((t * d.Hv + i) * d.dk + r)] = act[at(key_head * d.dk + r)] / std::sqrt(static_cast<double>(d.dk));
        out.k[at((t * d.Hv + i) * d.dk + r)] = act[at(d.Hk * d.dk + key_head * d.dk + r)];
      }
      for (int64_t c = 0; c < d.dv; ++c) out.v[at((t * d.Hv + i) * d.dv + c)] = act[at(2 * d.Hk * d.dk + i * d.dv + c)];
      out.g[at(t * d.Hv + i)] = -std::exp(m.A_log[at(i)]) * naive_softplus(a[at(t * d.Hv + i)] + m.dt_bias[at(i)]);
      out.beta[at(t * d.Hv + i)] = naive_sigmoid(b[at(t * d.Hv + i)]);
    }
  }
  return out;
}

std::vector<double> naive_delta_rule(const GdnDims& d, const GdnTokens& tk, std::vector<double>& S) {
  std::vector<double> o(at(tk.L * d.Hv * d.dv), 0.0);
  for (int64_t t = 0; t < tk.L; ++t) {
    for (int64_t i = 0; i < d.Hv; ++i) {
      double* s = &S[at(i * d.dk * d.dv)];  // s[r·dv + c] = S[r][c]
      const double* q = &tk.q[at((t * d.Hv + i) * d.dk)];
      const double* k = &tk.k[at((t * d.Hv + i) * d.dk)];
      const double* v = &tk.v[at((t * d.Hv + i) * d.dv)];
      const double alpha = std::exp(tk.g[at(t * d.Hv + i)]);
      const double beta = tk.beta[at(t * d.Hv + i)];
      for (int64_t e = 0; e < d.dk * d.dv; ++e) s[e] *= alpha;  // decay first
      std::vector<double> u(at(d.dv));
      for (int64_t c = 0; c < d.dv; ++c) {
        double recalled = 0.0;  // (S̃ᵀ k̂)[c]
        for (int64_t r = 0; r < d.dk; ++r) recalled += s[r * d.dv + c] * k[r];
        u[at(c)] = beta * (v[c] - recalled);
      }
      for (int64_t r = 0; r < d.dk; ++r) {
        for (int64_t c = 0; c < d.dv; ++c) s[r * d.dv + c] += k[r] * u[at(c)];
      }
      for (int64_t c = 0; c < d.dv; ++c) {
        double read = 0.0;  // (Sᵀ q̂)[c]
        for (int64_t r = 0; r < d.dk; ++r) read += s[r * d.dv + c] * q[r];
        o[at((t * d.Hv + i) * d.dv + c)] = read;
      }
    }
  }
  return o;
}

std::vector<double> naive_gdn(const NaiveGdn& m, NaiveGdnState& state, const std::vector<double>& hidden, int64_t L) {
  const GdnDims& d = m.dims;
  const int64_t C = d.C(), V = d.Hv * d.dv;
  std::vector<double> out(at(L * d.H), 0.0);
  for (int64_t t = 0; t < L; ++t) {
    const double* x = &hidden[at(t * d.H)];
    // in_proj_qkvz: mixed_qkv = rows [0, C), z = rows [C, C + Hv·dv); in_proj_ba: b rows, then a rows.
    const std::vector<double> qkvz = naive_linear(m.in_proj_qkvz, x, C + V, d.H);
    const std::vector<double> ba = naive_linear(m.in_proj_ba, x, 2 * d.Hv, d.H);
    const std::vector<double> mixed(qkvz.begin(), qkvz.begin() + C);
    const std::vector<double> b(ba.begin(), ba.begin() + d.Hv);
    const std::vector<double> a(ba.begin() + d.Hv, ba.end());
    const double* z = qkvz.data() + C;
    const GdnTokens tokens = naive_gdn_tokens(m, state.conv, mixed, a, b, 1);
    const std::vector<double> o = naive_delta_rule(d, tokens, state.S);

    // RMSNormGated per value head (norm_before_gate): o / sqrt(mean(o²) + 1e-6) · w · silu(z).
    std::vector<double> y(at(V));
    for (int64_t i = 0; i < d.Hv; ++i) {
      naive_gated_rms_norm(&o[at(i * d.dv)], &z[i * d.dv], m.norm_weight.data(), d.dv, 1e-6, true, &y[at(i * d.dv)]);
    }
    const std::vector<double> projected = naive_linear(m.out_proj, y.data(), d.H, V);
    std::copy(projected.begin(), projected.end(), out.begin() + static_cast<std::ptrdiff_t>(t * d.H));
  }
  return out;
}

NaiveGdn naive_gdn_model(const GdnDims& d, const std::map<std::string, TensorView>& weights) {
  const auto weight = [&](const std::string& name, int64_t size, bool optional) {
    return naive_weight(weights, name, size, optional, "naive_gdn_model");
  };
  NaiveGdn m;
  m.dims = d;
  m.in_proj_qkvz = weight("in_proj_qkvz", (d.C() + d.Hv * d.dv) * d.H, false);
  m.in_proj_ba = weight("in_proj_ba", 2 * d.Hv * d.H, false);
  m.conv_weight = weight("conv1d_weight", d.C() * d.K, false);
  m.conv_bias = weight("conv1d_bias", d.C(), true);
  m.A_log = weight("A_log", d.Hv, false);
  m.dt_bias = weight("dt_bias", d.Hv, false);
  m.norm_weight = weight("norm_weight", d.dv, false);
  m.out_proj = weight("out_proj", d.H * d.Hv * d.dv, false);
  return m;
}

}  // namespace hybridtb::testing
