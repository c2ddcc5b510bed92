// SSM mode `mamba1`: the Mamba-1 mixer as vLLM's MambaMixer.forward_cuda computes it, for one
// request, in float64. Prefill is a scan over
// the chunk (causal_conv1d_fn + selective_scan_fn); a decode token uses the single-step form
// (causal_conv1d_update + selective_state_update). Checked against an independent token-by-token
// loop, a hand-computed case and the driver by tests/ssm_mamba1 (ctest -L mamba1).
//
// Per token, with I = intermediate_size, N = state_size, K = conv_kernel, R = dt_rank:
//   [x; z] = in_proj·hidden (+ in_proj_bias)                                x, z: [I]
//   c      = silu(Σ_j conv1d_weight[:, j] ⊙ window[j] + conv1d_bias)         window = [K−1 saved inputs | x]
//   [dt_in; B; C] = x_proj·c                                                [R], [N], [N]
//   Δ      = softplus(dt_proj·dt_in + dt_proj_bias)                         threshold 20, as vLLM
//   h      = exp(Δ ⊗ A) ⊙ h + (Δ ⊙ c) ⊗ B,  A = −exp(A_log)                 h: [I, N]
//   y      = (h·C + D ⊙ c) ⊙ silu(z);  contribution = out_proj·y (+ out_proj_bias)
//
// Knowingly differs from vLLM: the conv state's layout. Our pool is [num_slots, I, K−1], channel
// major, oldest input first (the hybrid-batch file layout). vLLM allocates conv_cache as
// [num_blocks, K−1, I] (the "SD" layout) and the mixer views it transposed as [num_blocks, I, K−1]
// with unit stride along I; the logical values are the same, so a captured vLLM cache must be
// transposed (per slot) when written to a batch file. Everything is float64 here; vLLM rounds to
// the model dtype between the projections and runs the scan in float32 (the tolerances absorb it).
#include <Eigen/Core>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/spec/ssm_mode_sizes.h"
#include "layer_parts.h"

namespace hybridtb::reference::ssm {
namespace {

constexpr const char* kMode = "mamba1";  // names this mode in error messages

using Vector = Eigen::VectorXd;
using RowVector = Eigen::RowVectorXd;

using Sizes = spec::ssm::Mamba1Sizes;

// The weights of one layer with their logical shapes, checked. The matrices are references into
// the Weights map (no copies of the large projections per request); vectors and A are small.
struct Layer {
  const Matrix& in_proj;   // [2I, H]: x rows first, then z rows
  Vector in_bias;          // [2I] (zeros when absent)
  const Matrix& conv_w;    // [I, K]: column K−1 multiplies the current token
  Vector conv_bias;        // [I] (zeros when absent)
  const Matrix& x_proj;    // [R + 2N, I]: dt_in rows, then B rows, then C rows
  const Matrix& dt_proj;   // [I, R]
  Vector dt_bias;          // [I]
  Matrix A;                // [I, N] = −exp(A_log)
  Vector D;                // [I]
  const Matrix& out_proj;  // [H, I]
  Vector out_bias;         // [H] (zeros when absent)

  Layer(const Weights& weights, const Sizes& s)
      : in_proj(require_weight(weights, kMode, "in_proj", 2 * s.intermediate, s.hidden)),
        in_bias(vector_weight(weights, kMode, "in_proj_bias", 2 * s.intermediate, true)),
        conv_w(require_weight(weights, kMode, "conv1d_weight", s.intermediate, s.kernel)),
        conv_bias(vector_weight(weights, kMode, "conv1d_bias", s.intermediate, true)),
        x_proj(require_weight(weights, kMode, "x_proj", s.dt_rank + 2 * s.state, s.intermediate)),
        dt_proj(require_weight(weights, kMode, "dt_proj", s.intermediate, s.dt_rank)),
        dt_bias(vector_weight(weights, kMode, "dt_proj_bias", s.intermediate, false)),
        A(-require_weight(weights, kMode, "A_log", s.intermediate, s.state).array().exp().matrix()),
        D(vector_weight(weights, kMode, "D", s.intermediate, false)),
        out_proj(require_weight(weights, kMode, "out_proj", s.hidden, s.intermediate)),
        out_bias(vector_weight(weights, kMode, "out_proj_bias", s.hidden, true)) {}
};

// Everything after the convolution, for the tokens of `c` ([L, I], conv outputs after SiLU):
// Δ [L, I], B [L, N] and C [L, N] from x_proj and dt_proj. On a tensor-parallel rank x_proj holds
// the rank's input columns (RowParallelLinear): its product is the rank's partial sum, all-reduced
// over the group before dt_proj, B and C take it.
struct ScanInputs {
  Matrix delta;
  Matrix B;
  Matrix C;
};

ScanInputs scan_inputs(const Layer& layer, const Sizes& s, const Matrix& c, TensorParallelGroup* group) {
  Matrix dbc = c * layer.x_proj.transpose();  // [L, R + 2N]
  if (group != nullptr) group->all_reduce_sum(TensorView(dbc.data(), DType::kFloat64, {dbc.rows(), dbc.cols()}));
  ScanInputs in;
  in.delta = dbc.leftCols(s.dt_rank) * layer.dt_proj.transpose();  // [L, I], bias added inside softplus
  for (Eigen::Index t = 0; t < in.delta.rows(); ++t) {
    for (Eigen::Index i = 0; i < in.delta.cols(); ++i) in.delta(t, i) = softplus(in.delta(t, i) + layer.dt_bias(i));
  }
  in.B = dbc.middleCols(s.dt_rank, s.state);
  in.C = dbc.rightCols(s.state);
  return in;
}

// y_t ⊙ silu(z_t) through out_proj: [L, I] → [L, H].
void gate_and_project_out(const Layer& layer, const Matrix& y_ssm, const Matrix& z, Matrix& out) {
  Matrix gated = y_ssm;
  for (Eigen::Index t = 0; t < gated.rows(); ++t) {
    for (Eigen::Index i = 0; i < gated.cols(); ++i) gated(t, i) *= silu(z(t, i));
  }
  out = gated * layer.out_proj.transpose();
  out.rowwise() += layer.out_bias.transpose();
}

class Mamba1Mode final : public Mode {
 public:
  std::string name() const override { return "mamba1"; }

  void advance(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool decode) const override {
    forward(weights, state, x, y, decode, nullptr);
  }

  // The rank's channels (hybridtb/spec/tensor_parallel.h): x_proj's product all-reduced inside,
  // out_proj's partial sum (with out_proj_bias on rank 0 alone) returned for the driver's all-reduce.
  void advance_rank(const ModeShape& /*shape*/, TensorParallelGroup& group, const Weights& weights, State& state,
                    const Matrix& x, Matrix& y, bool decode) const override {
    forward(weights, state, x, y, decode, &group);
  }

 private:
  void forward(const Weights& weights, State& state, const Matrix& x, Matrix& y, bool decode,
               TensorParallelGroup* group) const {
    const Sizes s = sizes_from(weights);
    HYBRIDTB_CHECK(x.cols() == s.hidden, "mamba1: hidden rows have ", x.cols(), " values, in_proj expects ", s.hidden);
    const Layer layer(weights, s);
    Vector& conv_state = state_slot(state, kMode, "conv_state", s.intermediate * (s.kernel - 1));
    Vector& ssm_state = state_slot(state, kMode, "ssm_state", s.intermediate * s.state);

    Matrix xz = x * layer.in_proj.transpose();  // [L, 2I]
    xz.rowwise() += layer.in_bias.transpose();
    const Matrix u = xz.leftCols(s.intermediate);
    const Matrix z = xz.rightCols(s.intermediate);

    Matrix y_ssm;
    if (decode) {
      HYBRIDTB_CHECK(x.rows() == 1, "mamba1: a decode call has one token, got ", x.rows());
      y_ssm = decode_step(layer, s, conv_state, ssm_state, u, group);
    } else {
      y_ssm = prefill_scan(layer, s, conv_state, ssm_state, u, group);
    }
    gate_and_project_out(layer, y_ssm, z, y);
  }

  // I, N, K, R, H as the weights' shapes give them (in_proj [2I, H], A_log [I, N],
  // conv1d_weight [I, K], dt_proj [I, R]); Layer checks every other shape against them, and
  // the driver has checked them against /config/ssm.
  static Sizes sizes_from(const Weights& weights) {
    const auto dims = [&](const char* name) -> const Matrix& {
      const auto it = weights.find(name);
      HYBRIDTB_CHECK(it != weights.end(), "missing weight /weights/", name, " (required by ssm_mode mamba1)");
      return it->second;
    };
    ModeShape shape;
    shape.hidden_size = dims("in_proj").cols();
    shape.params = {{"intermediate_size", dims("A_log").rows()},
                    {"state_size", dims("A_log").cols()},
                    {"conv_kernel", dims("conv1d_weight").cols()},
                    {"dt_rank", dims("dt_proj").cols()}};
    return spec::ssm::mamba1_sizes(shape);
  }

  // causal_conv1d_fn + selective_scan_fn over a chunk of L tokens. `u` is [L, I] (x after
  // in_proj); returns the pre-gate y [L, I] and leaves both states after the last token.
  static Matrix prefill_scan(const Layer& layer, const Sizes& s, Vector& conv_state, Vector& ssm_state,
                             const Matrix& u, TensorParallelGroup* group) {
    const int64_t I = s.intermediate, N = s.state;
    const int64_t L = u.rows();

    const Matrix c = causal_conv_silu(layer.conv_w, layer.conv_bias, u, conv_state);  // [L, I]

    // The selective scan, sequential over the chunk (vLLM runs it as a parallel prefix scan).
    const ScanInputs in = scan_inputs(layer, s, c, group);
    Eigen::Map<Matrix> h(ssm_state.data(), I, N);
    Matrix y(L, I);
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t i = 0; i < I; ++i) {
        const double delta = in.delta(t, i);
        double acc = layer.D(i) * c(t, i);
        for (int64_t n = 0; n < N; ++n) {
          h(i, n) = std::exp(delta * layer.A(i, n)) * h(i, n) + delta * c(t, i) * in.B(t, n);
          acc += h(i, n) * in.C(t, n);
        }
        y(t, i) = acc;
      }
    }
    return y;
  }

  // causal_conv1d_update + selective_state_update for one decode token; `u` is [1, I].
  static Matrix decode_step(const Layer& layer, const Sizes& s, Vector& conv_state, Vector& ssm_state,
                            const Matrix& u, TensorParallelGroup* group) {
    const int64_t I = s.intermediate, N = s.state;

    const Matrix c = causal_conv_silu_step(layer.conv_w, layer.conv_bias, u, conv_state);  // [1, I]

    // state = state·dA + dB·x;  out = state·C + D·x.
    const ScanInputs in = scan_inputs(layer, s, c, group);
    const RowVector dt = in.delta.row(0);
    Eigen::Map<Matrix> h(ssm_state.data(), I, N);
    const Matrix dA = (dt.transpose().asDiagonal() * layer.A).array().exp().matrix();  // [I, N]
    const Matrix dB = dt.transpose() * in.B.row(0);                                    // [I, N]
    h = h.cwiseProduct(dA) + dB.cwiseProduct(c.row(0).transpose().replicate(1, N));
    Matrix y(1, I);
    y.row(0) = (h * in.C.row(0).transpose() + layer.D.cwiseProduct(c.row(0).transpose())).transpose();
    return y;
  }
};

}  // namespace

// Registered by modes.cpp (HYBRIDTB_SSM_MODE(registry, mamba1), which declares this factory).
std::unique_ptr<Mode> make_mamba1_mode() { return std::make_unique<Mamba1Mode>(); }

}  // namespace hybridtb::reference::ssm
