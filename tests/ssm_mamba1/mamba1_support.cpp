// Helpers for the mamba1 tests (see mamba1_support.h).
#include "mamba1_support.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

#include "hybridtb/dtype.h"

// The mode's factory (reference/ssm/mamba1.cpp; private to the library, registered by modes.cpp).
// The mode-level tests use it directly so they test the file itself; registration and the driver
// are tested through the registry (mamba1_driver_test.cpp).
namespace hybridtb::reference::ssm {
std::unique_ptr<Mode> make_mamba1_mode();
}  // namespace hybridtb::reference::ssm

namespace hybridtb::testing {

namespace ssm = reference::ssm;

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

std::string describe(const Mamba1Sizes& s) {
  return "H=" + std::to_string(s.H) + " I=" + std::to_string(s.I) + " N=" + std::to_string(s.N) +
         " K=" + std::to_string(s.K) + " R=" + std::to_string(s.R);
}

const ssm::Mode& mamba1_mode() {
  static const std::unique_ptr<ssm::Mode> mode = ssm::make_mamba1_mode();
  return *mode;
}

std::map<std::string, int64_t> mamba1_params(const Mamba1Sizes& s) {
  return {{"intermediate_size", s.I}, {"state_size", s.N}, {"conv_kernel", s.K}, {"dt_rank", s.R}};
}

ssm::ModeShape mamba1_shape(const Mamba1Sizes& s) {
  ssm::ModeShape shape;
  shape.hidden_size = s.H;
  shape.params = mamba1_params(s);
  return shape;
}

std::map<std::string, Tensor> random_weights(const Mamba1Sizes& sizes, uint64_t seed) {
  return ssm::make_random_weights(mamba1_mode(), mamba1_shape(sizes), seed);
}

NaiveMamba1State random_state(const Mamba1Sizes& s, uint64_t seed) {
  NaiveMamba1State state;
  state.conv = normal_values(s.I * (s.K - 1), seed);
  state.ssm = normal_values(s.I * s.N, seed + 1);
  return state;
}

NaiveMamba1State zero_state(const Mamba1Sizes& s) {
  NaiveMamba1State state;
  state.conv.assign(at(s.I * (s.K - 1)), 0.0);
  state.ssm.assign(at(s.I * s.N), 0.0);
  return state;
}

std::vector<double> random_hidden(const Mamba1Sizes& s, int64_t num_tokens, uint64_t seed) {
  return normal_values(num_tokens * s.H, seed);
}

ssm::State to_mode_state(const NaiveMamba1State& state) {
  return {{"conv_state", to_eigen(state.conv)}, {"ssm_state", to_eigen(state.ssm)}};
}

NaiveMamba1State from_mode_state(const ssm::State& state) {
  return {from_eigen(state.at("conv_state")), from_eigen(state.at("ssm_state"))};
}

std::vector<double> run_mode(const ssm::Weights& weights, NaiveMamba1State& state, const std::vector<double>& hidden,
                             int64_t H, int64_t begin, int64_t end, bool decode) {
  ssm::State mode_state = to_mode_state(state);
  const std::vector<double> y = advance_rows(mamba1_mode(), weights, mode_state, hidden, H, begin, end, decode);
  state = from_mode_state(mode_state);
  return y;
}

void expect_state_close(const NaiveMamba1State& actual, const NaiveMamba1State& expected, const Tolerance& tolerance,
                        const std::string& what) {
  expect_close(actual.conv, expected.conv, tolerance, what + " conv_state");
  expect_close(actual.ssm, expected.ssm, tolerance, what + " ssm_state");
}

Tolerance mamba1_tolerance(const Mamba1Sizes& s, int64_t num_tokens) {
  return tolerance_for(ToleranceCase::kMamba1Float64, num_tokens, std::max({s.H, s.I, s.R + 2 * s.N}));
}

}  // namespace hybridtb::testing
