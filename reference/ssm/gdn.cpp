// SSM mode `gdn`: the Gated DeltaNet layer of Qwen3-Next (vLLM's Qwen3NextGatedDeltaNet, pymllm's
// GatedDeltaNet) for one request, in float64. The core —
// conv + SiLU, split, L2 normalisation, gates and the delta rule — is gdn_core (gdn_core.h), which a
// per-layer hybrid design also calls on its own; the mode adds the projections around it:
//   [mixed_qkv; z] = in_proj_qkvz·hidden,  [b; a] = in_proj_ba·hidden
//   o   = gdn_core(mixed_qkv, a, b)                                          [Hv, dv]
//   y_i = o_i / sqrt(mean(o_i²) + 1e-6) ⊙ norm_weight ⊙ silu(z_i)            per value head i
//   contribution = out_proj·y
// Prefill runs the delta rule token by token on the V-major state; a decode token takes the
// single-step form of the decode kernels (per row of M: decay, predict, correct, read). Checked
// against an independent K-major token loop, the chunked WY form and metamorphic relations by
// tests/ssm_gdn (ctest -L gdn), and by the generic suite tests/ssm.
//
// Knowingly differs from vLLM: in_proj_qkvz and in_proj_ba are stored in the de-interleaved order
// that fix_query_key_value_ordering produces ([q_all | k_all | v_all | z_all] and [b | a]), not
// HF's per-key-head-group interleaving, so a Qwen3-Next checkpoint's rows must be permuted when
// written to a batch file. Everything is float64; vLLM runs the projections and conv in the model
// dtype and the recurrence in float32. The L2 norm puts its 1e-6 inside the square root, as fla's
// l2norm_fwd does (pymllm's PyTorch paths use ‖q‖ + 1e-6; notes §1.4.3).
#include <Eigen/Core>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gdn_core.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "layer_parts.h"

namespace hybridtb::reference::ssm {
namespace {

constexpr const char* kMode = "gdn";  // names this mode in error messages

using Vector = Eigen::VectorXd;

// fla's l2norm_fwd uses 1e-6; so does Qwen3-Next's RMSNormGated (rms_norm_eps), the default of the
// layer's norm eps (ModeShape::gdn_norm_eps) and the constant of files without an engine version.
constexpr double kL2NormEps = 1e-6;
constexpr double kRmsNormEps = 1e-6;

// b = −∞ gives exactly 0 (exp(∞) = ∞), b = +∞ exactly 1.
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// --- the core ----------------------------------------------------------------------------------------

struct CoreWeights {
  const Matrix& conv_w;  // [conv_dim, K]: column K−1 multiplies the current token
  Vector conv_bias;      // [conv_dim] (zeros when absent)
  Vector A;              // [Hv] = −exp(A_log)
  Vector dt_bias;        // [Hv]

  CoreWeights(const Weights& weights, const GdnSizes& s)
      : conv_w(require_weight(weights, kMode, "conv1d_weight", s.conv_dim(), s.conv_kernel)),
        conv_bias(vector_weight(weights, kMode, "conv1d_bias", s.conv_dim(), true)),
        A(-vector_weight(weights, kMode, "A_log", s.num_v_heads, false).array().exp().matrix()),
        dt_bias(vector_weight(weights, kMode, "dt_bias", s.num_v_heads, false)) {}
};

// What the delta rule consumes per token, from the conv output and the raw gates.
struct DeltaInputs {
  Matrix q;      // [L, Hk·dk]: L2-normalised per key head, times dk^-1/2
  Matrix k;      // [L, Hk·dk]: L2-normalised per key head
  Matrix v;      // [L, Hv·dv]
  Matrix alpha;  // [L, Hv]: exp(g) ∈ [0, 1]
  Matrix beta;   // [L, Hv]: sigmoid(b) ∈ [0, 1]
};

DeltaInputs delta_inputs(const CoreWeights& w, const GdnSizes& s, const Matrix& qkv, const Matrix& a,
                         const Matrix& b) {
  const int64_t L = qkv.rows(), Hk = s.num_k_heads, dk = s.head_k_dim, Hv = s.num_v_heads;
  const int64_t key_width = Hk * dk;
  DeltaInputs in{qkv.leftCols(key_width), qkv.middleCols(key_width, key_width), qkv.rightCols(Hv * s.head_v_dim),
                 Matrix(L, Hv), Matrix(L, Hv)};
  const double scale = inv_sqrt(dk);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t h = 0; h < Hk; ++h) {
      auto q = in.q.row(t).segment(h * dk, dk);
      auto k = in.k.row(t).segment(h * dk, dk);
      q *= scale / std::sqrt(q.squaredNorm() + kL2NormEps);
      k /= std::sqrt(k.squaredNorm() + kL2NormEps);
    }
    for (int64_t h = 0; h < Hv; ++h) {
      in.alpha(t, h) = std::exp(w.A(h) * softplus(a(t, h) + w.dt_bias(h)));
      in.beta(t, h) = sigmoid(b(t, h));
    }
  }
  return in;
}

// The delta rule over a chunk, token by token on the V-major state: per value head,
// M ← α·M, u = β·(v − M k̂), M ← M + u k̂ᵀ, o = M q̂.
Matrix delta_rule_chunk(const GdnSizes& s, const DeltaInputs& in, Vector& recurrent_state) {
  const int64_t Hv = s.num_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t group = Hv / s.num_k_heads;
  Matrix o(in.v.rows(), Hv * dv);
  for (int64_t t = 0; t < in.v.rows(); ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      Eigen::Map<Matrix> M(recurrent_state.data() + h * dv * dk, dv, dk);
      const Vector q = in.q.row(t).segment((h / group) * dk, dk).transpose();
      const Vector k = in.k.row(t).segment((h / group) * dk, dk).transpose();
      M *= in.alpha(t, h);
      const Vector u = in.beta(t, h) * (in.v.row(t).segment(h * dv, dv).transpose() - M * k);
      M.noalias() += u * k.transpose();
      o.row(t).segment(h * dv, dv) = (M * q).transpose();
    }
  }
  return o;
}

// The single-step form of the decode kernels (SGLang's fused_sigmoid_gating_delta_rule_update,
// FlashInfer's gated_delta_rule_decode_pretranspose): each row i of the V-major M is one value
// channel, contiguous in k, updated on its own — decay, predict v_i, correct, read o_i.
Matrix delta_rule_step(const GdnSizes& s, const DeltaInputs& in, Vector& recurrent_state) {
  const int64_t Hv = s.num_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t group = Hv / s.num_k_heads;
  Matrix o(1, Hv * dv);
  for (int64_t h = 0; h < Hv; ++h) {
    const double* q = in.q.data() + (h / group) * dk;
    const double* k = in.k.data() + (h / group) * dk;
    const double alpha = in.alpha(0, h), beta = in.beta(0, h);
    for (int64_t i = 0; i < dv; ++i) {
      double* row = recurrent_state.data() + (h * dv + i) * dk;
      double predicted = 0.0;
      for (int64_t j = 0; j < dk; ++j) {
        row[j] *= alpha;
        predicted += row[j] * k[j];
      }
      const double correction = beta * (in.v(0, h * dv + i) - predicted);
      double read = 0.0;
      for (int64_t j = 0; j < dk; ++j) {
        row[j] += correction * k[j];
        read += row[j] * q[j];
      }
      o(0, h * dv + i) = read;
    }
  }
  return o;
}

// --- the mode ----------------------------------------------------------------------------------------

// The projections around the core, with their logical shapes, checked; references into the
// Weights map (no copies of the large projections per request).
struct Projections {
  const Matrix& in_proj_qkvz;  // [2·Hk·dk + 2·Hv·dv, H]: q_all, k_all, v_all, z_all rows
  const Matrix& in_proj_ba;    // [2·Hv, H]: b rows, then a rows
  Vector norm_weight;          // [dv]
  const Matrix& out_proj;      // [H, Hv·dv]

  Projections(const Weights& weights, const GdnSizes& s, int64_t hidden)
      : in_proj_qkvz(require_weight(weights, kMode, "in_proj_qkvz", s.conv_dim() + s.num_v_heads * s.head_v_dim, hidden)),
        in_proj_ba(require_weight(weights, kMode, "in_proj_ba", 2 * s.num_v_heads, hidden)),
        norm_weight(vector_weight(weights, kMode, "norm_weight", s.head_v_dim, false)),
        out_proj(require_weight(weights, kMode, "out_proj", hidden, s.num_v_heads * s.head_v_dim)) {}
};

class GdnMode final : public Mode {
 public:
  std::string name() const override { return "gdn"; }

  void advance(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool decode) const override {
    advance_with_eps(kRmsNormEps, weights, state, x, y, decode);
  }
  void advance(const ModeShape& shape, const Weights& weights, State& state, const Matrix& x, Matrix& y,
               bool decode) const override {
    advance_with_eps(shape.gdn_norm_eps, weights, state, x, y, decode);
  }

 private:
  // eps: the RMSNormGated's (the layer's norm_eps; the L2 norm's 1e-6 is fla's constant, not a
  // config value).
  void advance_with_eps(double eps, const Weights& weights, State& state, const Matrix& x, Matrix& y,
                        bool decode) const {
    const GdnSizes s = sizes_from(weights, state);
    const int64_t hidden = weights.at("in_proj_qkvz").cols();
    HYBRIDTB_CHECK(x.cols() == hidden, "gdn: hidden rows have ", x.cols(), " values, in_proj_qkvz expects ", hidden);
    const Projections p(weights, s, hidden);
    const int64_t Hv = s.num_v_heads, dv = s.head_v_dim;

    const Matrix qkvz = x * p.in_proj_qkvz.transpose();  // [L, conv_dim + Hv·dv]
    const Matrix ba = x * p.in_proj_ba.transpose();      // [L, 2·Hv]
    const Matrix o =
        gdn_core(s, weights, state, qkvz.leftCols(s.conv_dim()), ba.rightCols(Hv), ba.leftCols(Hv), decode);

    Matrix gated(o.rows(), Hv * dv);
    for (Eigen::Index t = 0; t < o.rows(); ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        const auto o_h = o.row(t).segment(h * dv, dv);
        const double inv_rms = 1.0 / std::sqrt(o_h.squaredNorm() / static_cast<double>(dv) + eps);
        for (int64_t i = 0; i < dv; ++i) {
          gated(t, h * dv + i) = o_h(i) * inv_rms * p.norm_weight(i) * silu(qkvz(t, s.conv_dim() + h * dv + i));
        }
      }
    }
    y = gated * p.out_proj.transpose();
  }

  // The sizes as the tensors give them: Hv from A_log, dv from norm_weight, conv_dim and K from
  // conv1d_weight, dk from the recurrent_state slot (Hv·dv·dk values), Hk from conv_dim; the driver
  // has checked every shape against /config/ssm, and gdn_sizes rechecks the relations.
  static GdnSizes sizes_from(const Weights& weights, const State& state) {
    const auto dims = [&](const char* name) -> const Matrix& {
      const auto it = weights.find(name);
      HYBRIDTB_CHECK(it != weights.end(), "missing weight /weights/", name, " (required by ssm_mode gdn)");
      return it->second;
    };
    const auto recurrent = state.find("recurrent_state");
    HYBRIDTB_CHECK(recurrent != state.end(),
                   "missing state pool /inputs/ssm/recurrent_state (required by ssm_mode gdn)");
    const int64_t Hv = dims("A_log").cols(), dv = dims("norm_weight").cols();
    const int64_t conv_dim = dims("conv1d_weight").rows();
    const int64_t dk = recurrent->second.size() / (Hv * dv);
    HYBRIDTB_CHECK(dk > 0 && (conv_dim - Hv * dv) % (2 * dk) == 0, "gdn: conv1d_weight's ", conv_dim,
                   " channels do not fit num_v_heads ", Hv, ", head_v_dim ", dv, " and head_k_dim ", dk,
                   " (from the recurrent_state slot)");
    ModeShape shape;
    shape.hidden_size = dims("in_proj_qkvz").cols();
    shape.params = {{"num_k_heads", (conv_dim - Hv * dv) / (2 * dk)},
                    {"num_v_heads", Hv},
                    {"head_k_dim", dk},
                    {"head_v_dim", dv},
                    {"conv_kernel", dims("conv1d_weight").cols()}};
    return gdn_sizes(shape);
  }
};

}  // namespace

Matrix gdn_core(const GdnSizes& s, const Weights& weights, State& state, const Matrix& mixed_qkv, const Matrix& a,
                const Matrix& b, bool decode) {
  const int64_t L = mixed_qkv.rows();
  HYBRIDTB_CHECK(mixed_qkv.cols() == s.conv_dim(), "gdn: mixed_qkv rows have ", mixed_qkv.cols(),
                 " values, conv_dim is ", s.conv_dim());
  HYBRIDTB_CHECK(a.rows() == L && a.cols() == s.num_v_heads && b.rows() == L && b.cols() == s.num_v_heads,
                 "gdn: a and b must be [", L, ", ", s.num_v_heads, "], got [", a.rows(), ", ", a.cols(), "] and [",
                 b.rows(), ", ", b.cols(), "]");
  HYBRIDTB_CHECK(!decode || L == 1, "gdn: a decode call has one token, got ", L);
  const CoreWeights w(weights, s);
  Vector& conv_state = state_slot(state, kMode, "conv_state", s.conv_dim() * (s.conv_kernel - 1));
  Vector& recurrent_state =
      state_slot(state, kMode, "recurrent_state", s.num_v_heads * s.head_v_dim * s.head_k_dim);
  if (decode) {
    const DeltaInputs in = delta_inputs(w, s, causal_conv_silu_step(w.conv_w, w.conv_bias, mixed_qkv, conv_state), a, b);
    return delta_rule_step(s, in, recurrent_state);
  }
  const DeltaInputs in = delta_inputs(w, s, causal_conv_silu(w.conv_w, w.conv_bias, mixed_qkv, conv_state), a, b);
  return delta_rule_chunk(s, in, recurrent_state);
}

// Registered by modes.cpp (HYBRIDTB_SSM_MODE(registry, gdn), which declares this factory).
std::unique_ptr<Mode> make_gdn_mode() { return std::make_unique<GdnMode>(); }

}  // namespace hybridtb::reference::ssm
