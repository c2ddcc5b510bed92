// Helpers for the gdn tests (see gdn_support.h).
#include "gdn_support.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "hybridtb/dtype.h"

// The mode's factory (reference/ssm/gdn.cpp; private to the library, registered by modes.cpp). The
// tests use it directly so they test the file itself; registration is covered by tests/ssm.
namespace hybridtb::reference::ssm {
std::unique_ptr<Mode> make_gdn_mode();
}  // namespace hybridtb::reference::ssm

namespace hybridtb::testing {

namespace ssm = reference::ssm;

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

const ssm::Mode& gdn_mode() {
  static const std::unique_ptr<ssm::Mode> mode = ssm::make_gdn_mode();
  return *mode;
}

std::map<std::string, int64_t> gdn_params(const GdnDims& d) {
  return {{"num_k_heads", d.Hk}, {"num_v_heads", d.Hv}, {"head_k_dim", d.dk}, {"head_v_dim", d.dv},
          {"conv_kernel", d.K}};
}

ssm::ModeShape gdn_shape(const GdnDims& d) {
  ssm::ModeShape shape;
  shape.hidden_size = d.H;
  shape.params = gdn_params(d);
  return shape;
}

ssm::GdnSizes gdn_core_sizes(const GdnDims& d) { return ssm::gdn_sizes(gdn_shape(d)); }

std::string describe(const GdnDims& d) {
  return "H=" + std::to_string(d.H) + " Hk=" + std::to_string(d.Hk) + " Hv=" + std::to_string(d.Hv) +
         " dk=" + std::to_string(d.dk) + " dv=" + std::to_string(d.dv) + " K=" + std::to_string(d.K);
}

std::map<std::string, Tensor> random_weights(const GdnDims& dims, uint64_t seed) {
  return ssm::make_random_weights(gdn_mode(), gdn_shape(dims), seed);
}

NaiveGdnState random_state(const GdnDims& d, uint64_t seed) {
  return {normal_values(d.C() * (d.K - 1), seed), normal_values(d.Hv * d.dk * d.dv, seed + 1)};
}

NaiveGdnState zero_state(const GdnDims& d) {
  return {std::vector<double>(at(d.C() * (d.K - 1)), 0.0), std::vector<double>(at(d.Hv * d.dk * d.dv), 0.0)};
}

std::vector<double> transpose_heads(const std::vector<double>& values, int64_t heads, int64_t rows, int64_t cols) {
  std::vector<double> out(values.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[at((h * cols + c) * rows + r)] = values[at((h * rows + r) * cols + c)];
    }
  }
  return out;
}

ssm::State to_mode_state(const NaiveGdnState& state, const GdnDims& d) {
  ssm::State out;
  out["conv_state"] = to_eigen(state.conv);
  out["recurrent_state"] = to_eigen(transpose_heads(state.S, d.Hv, d.dk, d.dv));
  return out;
}

NaiveGdnState from_mode_state(const ssm::State& state, const GdnDims& d) {
  NaiveGdnState out;
  out.conv = from_eigen(state.at("conv_state"));
  out.S = transpose_heads(from_eigen(state.at("recurrent_state")), d.Hv, d.dv, d.dk);
  return out;
}

std::vector<double> run_mode(const ssm::Weights& weights, NaiveGdnState& state, const std::vector<double>& hidden,
                             const GdnDims& d, int64_t begin, int64_t end, bool decode) {
  ssm::State mode_state = to_mode_state(state, d);
  const std::vector<double> y = advance_rows(gdn_mode(), weights, mode_state, hidden, d.H, begin, end, decode);
  state = from_mode_state(mode_state, d);
  return y;
}

std::vector<double> run_core(const ssm::Weights& weights, NaiveGdnState& state, const GdnDims& d,
                             const std::vector<double>& mixed_qkv, const std::vector<double>& a,
                             const std::vector<double>& b, int64_t L, bool decode) {
  ssm::State mode_state = to_mode_state(state, d);
  const ssm::Matrix o = ssm::gdn_core(gdn_core_sizes(d), weights, mode_state, to_matrix(mixed_qkv, L, d.C()),
                                      to_matrix(a, L, d.Hv), to_matrix(b, L, d.Hv), decode);
  state = from_mode_state(mode_state, d);
  return to_vector(o);
}

void expect_state_close(const NaiveGdnState& actual, const NaiveGdnState& expected, const Tolerance& tolerance,
                        const std::string& what) {
  expect_close(actual.conv, expected.conv, tolerance, what + " conv_state");
  expect_close(actual.S, expected.S, tolerance, what + " recurrent state (K-major)");
}

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

Tolerance gdn_tolerance(const GdnDims& d, int64_t num_tokens, int64_t longest_sum) {
  const int64_t m = std::max({d.H, d.C() + d.Hv * d.dv, d.Hv * d.dv, d.dk, d.dv, longest_sum});
  return tolerance_for(ToleranceCase::kSsmModeFloat64, num_tokens, m);
}

ChunkWy chunk_wy(const GdnTokens& tk, int64_t Hv, int64_t dk, int64_t h, int64_t start, int64_t n, const double* keys,
                 int64_t key_stride) {
  const auto at = [](int64_t i) { return static_cast<size_t>(i); };
  ChunkWy wy{std::vector<double>(at(n)), std::vector<double>(at(n * n), 0.0)};
  for (int64_t i = 0; i < n; ++i) wy.G[at(i)] = (i > 0 ? wy.G[at(i - 1)] : 0.0) + tk.g[at((start + i) * Hv + h)];
  for (int64_t i = 0; i < n; ++i) {
    wy.T[at(i * n + i)] = 1.0;
    for (int64_t j = 0; j < i; ++j) {
      double kk = 0.0;
      for (int64_t c = 0; c < dk; ++c) kk += keys[i * key_stride + c] * keys[j * key_stride + c];
      const double A_ij = tk.beta[at((start + i) * Hv + h)] * std::exp(wy.G[at(i)] - wy.G[at(j)]) * kk;
      for (int64_t c = 0; c <= j; ++c) wy.T[at(i * n + c)] -= A_ij * wy.T[at(j * n + c)];
    }
  }
  return wy;
}

}  // namespace hybridtb::testing
