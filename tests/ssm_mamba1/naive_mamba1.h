// A naive Mamba-1 mixer, written independently of reference/ssm/mamba1.cpp so the two check each
// other: std::vector storage, explicit index loops, one token at a time, float64, no Eigen and no
// chunk scan; activations, dense layers and the causal conv are those of tests/support/naive_ops.h.
// It follows the vLLM semantics notes §4 (Appendix B) directly. Test-only; used by tests/ssm_mamba1
// (ctest -L mamba1).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/tensor.h"

namespace hybridtb::testing {

// Mamba-1 sizes: H = hidden (num_heads·head_size), I = intermediate_size, N = state_size,
// K = conv_kernel, R = dt_rank.
struct Mamba1Sizes {
  int64_t H = 0;
  int64_t I = 0;
  int64_t N = 0;
  int64_t K = 0;
  int64_t R = 0;
};

// Weights, row-major; absent optional biases are zeros.
struct NaiveMamba1 {
  Mamba1Sizes sizes;
  std::vector<double> in_proj;       // [2I][H]: x rows, then z rows
  std::vector<double> in_proj_bias;  // [2I]
  std::vector<double> conv_weight;   // [I][K]: tap K−1 multiplies the current token
  std::vector<double> conv_bias;     // [I]
  std::vector<double> x_proj;        // [R+2N][I]: dt rows, B rows, C rows
  std::vector<double> dt_proj;       // [I][R]
  std::vector<double> dt_proj_bias;  // [I]
  std::vector<double> A_log;         // [I][N]
  std::vector<double> D;             // [I]
  std::vector<double> out_proj;      // [H][I]
  std::vector<double> out_proj_bias; // [H]
};

// One request's state.
struct NaiveMamba1State {
  std::vector<double> conv;  // [I][K−1], oldest input first
  std::vector<double> ssm;   // [I][N]
};

// Runs `num_tokens` tokens one by one: hidden is [num_tokens][H]; returns the contributions
// [num_tokens][H] and leaves `state` after the last token.
std::vector<double> naive_mamba1(const NaiveMamba1& model, NaiveMamba1State& state, const std::vector<double>& hidden,
                                 int64_t num_tokens);

// The model from named host tensors of any floating dtype (the /weights names of the file format).
NaiveMamba1 naive_mamba1_model(const Mamba1Sizes& sizes, const std::map<std::string, TensorView>& weights);

// Slot `slot` of the pools conv_state [S, I, K−1] and ssm_state [S, I, N].
NaiveMamba1State naive_mamba1_state(const std::map<std::string, TensorView>& pools, int64_t slot);

}  // namespace hybridtb::testing
