// Helpers for the mamba2 tests: the mode (its factory, not the registry, so the file itself is
// tested), seeded random weights and states drawn as the mode's TensorSpecs say, conversions between
// the test's std::vector form and the mode's Eigen form, and elementwise comparisons that report the
// worst element. Used by tests/ssm_mamba2.
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
#include "mamba2_core.h"
#include "naive_mamba2.h"
#include "naive_ops.h"

namespace hybridtb::testing {

const reference::ssm::Mode& mamba2_mode();
// /config/ssm parameters of `dims` (AttentionConfig::ssm_params).
std::map<std::string, int64_t> mamba2_params(const Mamba2Dims& dims);
reference::ssm::ModeShape mamba2_shape(const Mamba2Dims& dims);
// The core's sizes (mamba2_core.h) for `dims`.
reference::ssm::Mamba2Sizes core_sizes(const Mamba2Dims& dims);
std::string describe(const Mamba2Dims& dims);

// Every weight of the mode (optional ones included), float32, drawn as its TensorSpec says.
std::map<std::string, Tensor> random_weights(const Mamba2Dims& dims, uint64_t seed);
// One random request state (standard normal, as the state specs say), or zeros.
NaiveMamba2State random_state(const Mamba2Dims& dims, uint64_t seed);
NaiveMamba2State zero_state(const Mamba2Dims& dims);

// A float64 host tensor of `shape` holding `values` row-major (values_of, naive_ops.h, reads one).
Tensor tensor_of(const Shape& shape, const std::vector<double>& values);
reference::ssm::State to_mode_state(const NaiveMamba2State& state);
NaiveMamba2State from_mode_state(const reference::ssm::State& state);

// Runs the mode over tokens [begin, end) of `hidden` ([tokens][H]); returns their contributions.
std::vector<double> run_mode(const reference::ssm::Weights& weights, NaiveMamba2State& state,
                             const std::vector<double>& hidden, int64_t H, int64_t begin, int64_t end, bool decode);

// EXPECT the conv and SSM states within `tolerance` (expect_close of ssm_test_support.h for values).
void expect_state_close(const NaiveMamba2State& actual, const NaiveMamba2State& expected, const Tolerance& tolerance,
                        const std::string& what);

// The tolerance of two float64 evaluations of `num_tokens` tokens at `dims`: the table's SSM-mode
// row (kSsmModeFloat64) with m = the largest dimension of H and the mode's tensors.
Tolerance mamba2_tolerance(const Mamba2Dims& dims, int64_t num_tokens);

}  // namespace hybridtb::testing
