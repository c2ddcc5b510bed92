// Helpers for the mamba1 tests: the mode from the registry, seeded random weights and states drawn
// as the mode's TensorSpecs say, conversions between the test's std::vector form and the mode's
// Eigen form, and elementwise comparisons that report the worst element. Used by tests/ssm_mamba1.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tolerance.h"
#include "ssm_test_support.h"
#include "naive_mamba1.h"

namespace hybridtb::testing {

const reference::ssm::Mode& mamba1_mode();
// "H=… I=… N=… K=… R=…", for test traces.
std::string describe(const Mamba1Sizes& sizes);
reference::ssm::ModeShape mamba1_shape(const Mamba1Sizes& sizes);
// /config/ssm parameters of `sizes` (AttentionConfig::ssm_params).
std::map<std::string, int64_t> mamba1_params(const Mamba1Sizes& sizes);

// Every weight of the mode (optional ones included), float32, drawn as its TensorSpec says.
std::map<std::string, Tensor> random_weights(const Mamba1Sizes& sizes, uint64_t seed);
// One random request state (standard normal, as the state specs say), or zeros.
NaiveMamba1State random_state(const Mamba1Sizes& sizes, uint64_t seed);
NaiveMamba1State zero_state(const Mamba1Sizes& sizes);
// [num_tokens][H] standard normal hidden states.
std::vector<double> random_hidden(const Mamba1Sizes& sizes, int64_t num_tokens, uint64_t seed);

reference::ssm::State to_mode_state(const NaiveMamba1State& state);
NaiveMamba1State from_mode_state(const reference::ssm::State& state);

// Runs the mode over tokens [begin, end) of `hidden`; returns their contributions row-major.
std::vector<double> run_mode(const reference::ssm::Weights& weights, NaiveMamba1State& state,
                             const std::vector<double>& hidden, int64_t H, int64_t begin, int64_t end, bool decode);

// EXPECT the conv and SSM states within `tolerance` (expect_close of ssm_test_support.h for values).
void expect_state_close(const NaiveMamba1State& actual, const NaiveMamba1State& expected, const Tolerance& tolerance,
                        const std::string& what);

// The mamba1 tolerance for a run of `num_tokens` tokens at `sizes`.
Tolerance mamba1_tolerance(const Mamba1Sizes& sizes, int64_t num_tokens);

}  // namespace hybridtb::testing
