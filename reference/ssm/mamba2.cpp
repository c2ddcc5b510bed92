// SSM mode `mamba2`: the Mamba-2 (SSD) mixer as vLLM's MambaMixer2 and mamba_ssm's Mamba2 compute it,
// for one request, in float64. Prefill is a token-by-token
// recurrence over the chunk; a decode token uses the single-step form (causal_conv1d_update +
// selective_state_update). Checked against an independent naive loop and the chunked SSD algorithm
// by tests/ssm_mamba2 (ctest -L mamba2).
//
// Per token, with Hs heads of P channels, N = state_size, G = n_groups, K = conv_kernel,
// d_ssm = Hs·P, conv_dim = d_ssm + 2·G·N, g(h) = h / (Hs / G):
//   [z; xBC; dt] = in_proj·hidden (+ in_proj_bias)                  [d_ssm], [conv_dim], [Hs]
//   [x; B; C]    = silu(causal_conv1d(xBC) + conv1d_bias)             x [Hs, P], B and C [G, N]
//   Δ_h = softplus(dt_h + dt_bias_h)   (threshold 20, no dt_limit clamp: vLLM's default (0, inf))
//   S_h = exp(Δ_h·A_h)·S_h + Δ_h·outer(x_h, B_g(h)),  A = −exp(A_log)   S: [Hs, P, N]
//   y_h = S_h·C_g(h) + D_h·x_h
//   v   = y ⊙ silu(z);  v ← v / sqrt(mean_group(v²) + eps) ⊙ norm_weight   (groups of d_ssm / G)
//   contribution = out_proj·v (+ out_proj_bias)
// The norm is mamba_ssm's RMSNormGated with norm_before_gate = False (vLLM's Mixer2RMSNormGated);
// eps is the layer's norm eps (/config norm_eps: the model config's rms_norm_eps; 1e-5 by default
// and in files without an engine version). With /config mamba_rms_norm = 0 (Falcon-H1's
// use_rms_norm = False) vLLM returns v = y ⊙ silu(z) unnormalised and has no norm_weight; so do we.
// Everything between in_proj and the norm is the core (mamba2_core.h), callable on its own.
//
// Knowingly differs from vLLM: the conv state's layout in files without an engine version, as in
// mamba1 ([conv_dim, K−1] per slot, oldest input first; a versioned file stores vLLM's [K−1,
// conv_dim], conv_state_spec); precision (all float64; vLLM rounds to the model dtype between stages
// and runs the SSD kernels in float32).
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "layer_parts.h"
#include "mamba2_core.h"

namespace hybridtb::reference::ssm {
namespace {

constexpr const char* kMode = "mamba2";  // names this mode in error messages

using Vector = Eigen::VectorXd;

// The norm's eps is the layer's (ModeShape::mamba2_norm_eps: /config norm_eps, else 1e-5, the
// rms_norm_eps default of Mamba-2 and Falcon-H1 configs and the constant files without an engine
// version keep).


// The recurrence over L tokens of conv outputs `c` [L, conv_dim], sequential in float64 (the SSD
// kernels compute the same sums chunk by chunk; tests/ssm_mamba2 checks the two agree).
Matrix scan_prefill(const Mamba2Sizes& s, const Mamba2CoreWeights& w, const Matrix& c, const Matrix& dt,
                    Vector& ssm_state) {
  const int64_t P = s.head_dim, N = s.state, L = c.rows();
  const int64_t b_offset = s.d_ssm(), c_offset = s.d_ssm() + s.groups * N;
  Matrix y(L, s.d_ssm());
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const double delta = softplus(dt(t, h) + w.dt_bias(h));
      const double decay = std::exp(delta * w.A(h));
      const int64_t g = s.group_of(h);
      for (int64_t p = 0; p < P; ++p) {
        const double x = c(t, h * P + p);
        double* S = ssm_state.data() + (h * P + p) * N;
        double acc = w.D(h) * x;
        for (int64_t n = 0; n < N; ++n) {
          S[n] = decay * S[n] + delta * x * c(t, b_offset + g * N + n);
          acc += S[n] * c(t, c_offset + g * N + n);
        }
        y(t, h * P + p) = acc;
      }
    }
  }
  return y;
}

// causal_conv1d_update + selective_state_update for one token: the conv reads the saved columns
// before the state shifts left by one and takes the token; then, per head, with Δ broadcast,
// state = state·dA + x ⊗ dB (dA = exp(Δ·A), dB = Δ·B), out = state·C + D·x.
Matrix decode_step(const Mamba2Sizes& s, const Mamba2CoreWeights& w, const Matrix& xBC, const Matrix& dt,
                   Vector& conv_state, Vector& ssm_state) {
  const int64_t P = s.head_dim, N = s.state;
  const Vector c = causal_conv_silu_step(w.conv_weight, w.conv_bias, xBC, conv_state).row(0).transpose();

  Matrix y(1, s.d_ssm());
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t g = s.group_of(h);
    const double delta = softplus(dt(0, h) + w.dt_bias(h));
    const double dA = std::exp(delta * w.A(h));
    const Eigen::RowVectorXd dB = delta * c.segment(s.d_ssm() + g * N, N).transpose();  // [N]
    const Vector Cg = c.segment(s.d_ssm() + s.groups * N + g * N, N);
    const Vector x = c.segment(h * P, P);
    Eigen::Map<Matrix> S(ssm_state.data() + h * P * N, P, N);
    S = S * dA + x * dB;
    y.row(0).segment(h * P, P) = (S * Cg + w.D(h) * x).transpose();
  }
  return y;
}

// v = y ⊙ silu(z), then RMS-normalised per group of d_ssm / G channels and scaled by norm_weight.
// Without rms_norm (Falcon-H1's mamba_rms_norm = False: Mixer2RMSNormGated returns x·silu(gate)
// before any normalisation) v is the gate alone and norm_weight is not read.
Matrix gated_rms_norm(const Mamba2Sizes& s, const Matrix& y, const Matrix& z, const Vector& norm_weight, double eps,
                      bool rms_norm) {
  const int64_t group_size = s.d_ssm() / s.groups;
  Matrix v(y.rows(), y.cols());
  for (Eigen::Index t = 0; t < y.rows(); ++t) {
    for (Eigen::Index i = 0; i < y.cols(); ++i) v(t, i) = y(t, i) * silu(z(t, i));
    if (!rms_norm) continue;
    for (int64_t g = 0; g < s.groups; ++g) {
      auto group = v.row(t).segment(g * group_size, group_size);
      const double inv_rms = 1.0 / std::sqrt(group.squaredNorm() / static_cast<double>(group_size) + eps);
      group = (group * inv_rms).cwiseProduct(norm_weight.segment(g * group_size, group_size).transpose());
    }
  }
  return v;
}

class Mamba2Mode final : public Mode {
 public:
  std::string name() const override { return "mamba2"; }

  void advance(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool decode) const override {
    advance_with_norm(1e-5, true, weights, state, x, y, decode);
  }
  void advance(const ModeShape& shape, const Weights& weights, State& state, const Matrix& x, Matrix& y,
               bool decode) const override {
    advance_with_norm(shape.mamba2_norm_eps, shape.mamba2_rms_norm, weights, state, x, y, decode);
  }

 private:
  void advance_with_norm(double eps, bool rms_norm, const Weights& weights, State& state, const Matrix& x, Matrix& y,
                         bool decode) const {
    const Mamba2Sizes s = sizes_from(weights, state);
    const int64_t d_ssm = s.d_ssm(), conv_dim = s.conv_dim(), proj = 2 * d_ssm + 2 * s.groups * s.state + s.heads;
    const Matrix& in_proj = require_weight(weights, kMode, "in_proj", proj, x.cols());
    const Vector in_bias = vector_weight(weights, kMode, "in_proj_bias", proj, true);
    const Vector norm_weight =
        rms_norm ? vector_weight(weights, kMode, "norm_weight", d_ssm, false) : Vector::Ones(d_ssm);
    const Matrix& out_proj = require_weight(weights, kMode, "out_proj", x.cols(), d_ssm);
    const Vector out_bias = vector_weight(weights, kMode, "out_proj_bias", x.cols(), true);
    Vector& conv_state = state_slot(state, kMode, "conv_state", conv_dim * (s.kernel - 1));
    Vector& ssm_state = state_slot(state, kMode, "ssm_state", d_ssm * s.state);

    Matrix projected = x * in_proj.transpose();  // [L, z | xBC | dt]
    projected.rowwise() += in_bias.transpose();
    const Matrix z = projected.leftCols(d_ssm);
    const Matrix y_ssm = mamba2_core(s, mamba2_core_weights(weights, s), projected.middleCols(d_ssm, conv_dim),
                                     projected.rightCols(s.heads), conv_state, ssm_state, decode);
    y = gated_rms_norm(s, y_ssm, z, norm_weight, eps, rms_norm) * out_proj.transpose();
    y.rowwise() += out_bias.transpose();
  }

  // The sizes as the tensors give them: Hs from A_log [Hs], d_ssm from out_proj [H, d_ssm],
  // conv_dim and K from conv1d_weight [conv_dim, K], N from the ssm_state slot (Hs·P·N values),
  // G from conv_dim = d_ssm + 2·G·N. The driver has checked them against /config/ssm; the checks
  // here name what is inconsistent when the mode is called directly.
  static Mamba2Sizes sizes_from(const Weights& weights, const State& state) {
    const auto dims = [&](const char* name) -> const Matrix& {
      const auto it = weights.find(name);
      HYBRIDTB_CHECK(it != weights.end(), "missing weight /weights/", name, " (required by ssm_mode mamba2)");
      return it->second;
    };
    const auto pool = state.find("ssm_state");
    HYBRIDTB_CHECK(pool != state.end(), "missing state pool /inputs/ssm/ssm_state (required by ssm_mode mamba2)");
    Mamba2Sizes s;
    s.heads = dims("A_log").cols();
    const int64_t d_ssm = dims("out_proj").cols();  // out_proj [H, d_ssm] (norm_weight is optional)
    const int64_t conv_dim = dims("conv1d_weight").rows();
    s.kernel = dims("conv1d_weight").cols();
    HYBRIDTB_CHECK(d_ssm % s.heads == 0, "mamba2: /weights/out_proj has ", d_ssm,
                   " values, not a multiple of num_ssm_heads = ", s.heads, " (from /weights/A_log)");
    s.head_dim = d_ssm / s.heads;
    HYBRIDTB_CHECK(pool->second.size() % d_ssm == 0 && pool->second.size() > 0, "state /inputs/ssm/ssm_state slot has ",
                   pool->second.size(), " values, not a positive multiple of d_ssm = ", d_ssm);
    s.state = pool->second.size() / d_ssm;
    HYBRIDTB_CHECK(conv_dim > d_ssm && (conv_dim - d_ssm) % (2 * s.state) == 0, "mamba2: /weights/conv1d_weight has ",
                   conv_dim, " channels, not d_ssm + 2·n_groups·state_size with d_ssm = ", d_ssm,
                   " and state_size = ", s.state);
    s.groups = (conv_dim - d_ssm) / (2 * s.state);
    check_mamba2_sizes(s);
    return s;
  }
};

}  // namespace

Mamba2CoreWeights mamba2_core_weights(const Weights& weights, const Mamba2Sizes& s) {
  Mamba2CoreWeights w;
  w.conv_weight = require_weight(weights, kMode, "conv1d_weight", s.conv_dim(), s.kernel);
  w.conv_bias = vector_weight(weights, kMode, "conv1d_bias", s.conv_dim(), true);
  w.dt_bias = vector_weight(weights, kMode, "dt_bias", s.heads, false);
  w.A = -vector_weight(weights, kMode, "A_log", s.heads, false).array().exp().matrix();
  w.D = vector_weight(weights, kMode, "D", s.heads, false);
  return w;
}

Matrix mamba2_core(const Mamba2Sizes& s, const Mamba2CoreWeights& w, const Matrix& xBC, const Matrix& dt,
                   Eigen::VectorXd& conv_state, Eigen::VectorXd& ssm_state, bool decode) {
  check_mamba2_sizes(s);
  HYBRIDTB_CHECK(xBC.cols() == s.conv_dim() && dt.cols() == s.heads && xBC.rows() == dt.rows(),
                 "mamba2 core: xBC is [", xBC.rows(), ", ", xBC.cols(), "] and dt [", dt.rows(), ", ", dt.cols(),
                 "], need [L, ", s.conv_dim(), "] and [L, ", s.heads, "]");
  HYBRIDTB_CHECK(conv_state.size() == s.conv_dim() * (s.kernel - 1) && ssm_state.size() == s.d_ssm() * s.state,
                 "mamba2 core: conv_state has ", conv_state.size(), " values and ssm_state ", ssm_state.size(),
                 ", need ", s.conv_dim() * (s.kernel - 1), " and ", s.d_ssm() * s.state);
  if (decode) {
    HYBRIDTB_CHECK(xBC.rows() == 1, "mamba2: a decode call has one token, got ", xBC.rows());
    return decode_step(s, w, xBC, dt, conv_state, ssm_state);
  }
  const Matrix c = causal_conv_silu(w.conv_weight, w.conv_bias, xBC, conv_state);
  return scan_prefill(s, w, c, dt, ssm_state);
}

// Registered by modes.cpp (HYBRIDTB_SSM_MODE(registry, mamba2), which declares this factory).
std::unique_ptr<Mode> make_mamba2_mode() { return std::make_unique<Mamba2Mode>(); }

}  // namespace hybridtb::reference::ssm
