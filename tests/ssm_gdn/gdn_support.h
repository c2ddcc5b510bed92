// Helpers for the gdn tests: the mode and its core, seeded random weights drawn as the mode's
// TensorSpecs say, random inputs and states, conversions between the naive K-major form
// (naive_gdn.h) and the mode's V-major Eigen form, and elementwise comparisons that report the
// worst element. Used by tests/ssm_gdn.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gdn_core.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tolerance.h"
#include "ssm_test_support.h"
#include "naive_gdn.h"

namespace hybridtb::testing {

const reference::ssm::Mode& gdn_mode();
std::map<std::string, int64_t> gdn_params(const GdnDims& dims);  // /config/ssm
reference::ssm::ModeShape gdn_shape(const GdnDims& dims);
reference::ssm::GdnSizes gdn_core_sizes(const GdnDims& dims);
std::string describe(const GdnDims& dims);

// Every weight of the mode (the optional conv bias included), float32, drawn as its spec says.
std::map<std::string, Tensor> random_weights(const GdnDims& dims, uint64_t seed);
// A random request state (standard normal, as the state specs say), or zeros.
NaiveGdnState random_state(const GdnDims& dims, uint64_t seed);
NaiveGdnState zero_state(const GdnDims& dims);

// [heads][rows][cols] → [heads][cols][rows]: S (K-major) ↔ M (V-major).
std::vector<double> transpose_heads(const std::vector<double>& values, int64_t heads, int64_t rows, int64_t cols);

// The mode's state holds M = Sᵀ per value head: the conversion at the boundary.
reference::ssm::State to_mode_state(const NaiveGdnState& state, const GdnDims& dims);
NaiveGdnState from_mode_state(const reference::ssm::State& state, const GdnDims& dims);

// The mode over tokens [begin, end) of hidden [L][H]; returns their contributions row-major.
std::vector<double> run_mode(const reference::ssm::Weights& weights, NaiveGdnState& state,
                             const std::vector<double>& hidden, const GdnDims& dims, int64_t begin, int64_t end,
                             bool decode);
// The core (gdn_core) over L tokens of mixed_qkv [L][C], a and b [L][Hv]; returns o [L][Hv][dv].
std::vector<double> run_core(const reference::ssm::Weights& weights, NaiveGdnState& state, const GdnDims& dims,
                             const std::vector<double>& mixed_qkv, const std::vector<double>& a,
                             const std::vector<double>& b, int64_t L, bool decode);

// The WY form's in-chunk quantities for value head h over tokens [start, start + n) of tk: the
// cumsum G_i = Σ_{r≤i} g_r and T = (I + A)⁻¹ (unit lower triangular, row-major [n][n]) by forward
// substitution, A_ij = β_i·e^{G_i − G_j}·(k_i·k_j) for j < i, with key i at keys + i·key_stride
// (dk values: the tokens' k̂, or a rounded copy).
struct ChunkWy {
  std::vector<double> G, T;
};
ChunkWy chunk_wy(const GdnTokens& tk, int64_t Hv, int64_t dk, int64_t h, int64_t start, int64_t n, const double* keys,
                 int64_t key_stride);

// EXPECT the conv and SSM states within `tolerance` (expect_close of ssm_test_support.h for values).
void expect_state_close(const NaiveGdnState& actual, const NaiveGdnState& expected, const Tolerance& tolerance,
                        const std::string& what);
double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b);

// kSsmModeFloat64 for n tokens at `dims` (m = the largest dimension of the layer's tensors, or
// `longest_sum` where a form sums more terms, e.g. a chunk of the WY form).
Tolerance gdn_tolerance(const GdnDims& dims, int64_t num_tokens, int64_t longest_sum = 0);

}  // namespace hybridtb::testing
