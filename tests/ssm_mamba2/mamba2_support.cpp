// Helpers for the mamba2 tests (see mamba2_support.h).
#include "mamba2_support.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "hybridtb/dtype.h"

// The mode's factory (reference/ssm/mamba2.cpp; private to the library, registered by modes.cpp).
// The mode-level tests use it directly so they test the file itself; the registry and the driver
// run it in tests/ssm (the generic suite).
namespace hybridtb::reference::ssm {
std::unique_ptr<Mode> make_mamba2_mode();
}  // namespace hybridtb::reference::ssm

namespace hybridtb::testing {

namespace ssm = reference::ssm;

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

const ssm::Mode& mamba2_mode() {
  static const std::unique_ptr<ssm::Mode> mode = ssm::make_mamba2_mode();
  return *mode;
}

std::map<std::string, int64_t> mamba2_params(const Mamba2Dims& d) {
  return {{"num_ssm_heads", d.Hs}, {"head_dim", d.P}, {"state_size", d.N}, {"n_groups", d.G}, {"conv_kernel", d.K}};
}

ssm::ModeShape mamba2_shape(const Mamba2Dims& d) {
  ssm::ModeShape shape;
  shape.hidden_size = d.H;
  shape.params = mamba2_params(d);
  return shape;
}

ssm::Mamba2Sizes core_sizes(const Mamba2Dims& d) {
  ssm::Mamba2Sizes s;
  s.heads = d.Hs;
  s.head_dim = d.P;
  s.state = d.N;
  s.groups = d.G;
  s.kernel = d.K;
  return s;
}

std::string describe(const Mamba2Dims& d) {
  return "H=" + std::to_string(d.H) + " Hs=" + std::to_string(d.Hs) + " P=" + std::to_string(d.P) +
         " N=" + std::to_string(d.N) + " G=" + std::to_string(d.G) + " K=" + std::to_string(d.K);
}

std::map<std::string, Tensor> random_weights(const Mamba2Dims& dims, uint64_t seed) {
  return ssm::make_random_weights(mamba2_mode(), mamba2_shape(dims), seed);
}

NaiveMamba2State random_state(const Mamba2Dims& d, uint64_t seed) {
  return {normal_values(d.conv_dim() * (d.K - 1), seed), normal_values(d.d_ssm() * d.N, seed + 1)};
}

NaiveMamba2State zero_state(const Mamba2Dims& d) {
  return {std::vector<double>(at(d.conv_dim() * (d.K - 1)), 0.0), std::vector<double>(at(d.d_ssm() * d.N), 0.0)};
}

Tensor tensor_of(const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::host(DType::kFloat64, shape);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.data(), t.dtype(), static_cast<int64_t>(i), values[i]);
  return t;
}

ssm::State to_mode_state(const NaiveMamba2State& state) {
  return {{"conv_state", to_eigen(state.conv)}, {"ssm_state", to_eigen(state.ssm)}};
}

NaiveMamba2State from_mode_state(const ssm::State& state) {
  return {from_eigen(state.at("conv_state")), from_eigen(state.at("ssm_state"))};
}

std::vector<double> run_mode(const ssm::Weights& weights, NaiveMamba2State& state, const std::vector<double>& hidden,
                             int64_t H, int64_t begin, int64_t end, bool decode) {
  ssm::State mode_state = to_mode_state(state);
  const std::vector<double> y = advance_rows(mamba2_mode(), weights, mode_state, hidden, H, begin, end, decode);
  state = from_mode_state(mode_state);
  return y;
}

void expect_state_close(const NaiveMamba2State& actual, const NaiveMamba2State& expected, const Tolerance& tolerance,
                        const std::string& what) {
  expect_close(actual.conv, expected.conv, tolerance, what + " conv_state");
  expect_close(actual.ssm, expected.ssm, tolerance, what + " ssm_state");
}

Tolerance mamba2_tolerance(const Mamba2Dims& d, int64_t num_tokens) {
  return tolerance_for(ToleranceCase::kSsmModeFloat64, num_tokens,
                       std::max({d.H, d.proj(), d.conv_dim(), d.d_ssm(), d.Hs, d.P, d.N, d.K}));
}

}  // namespace hybridtb::testing
