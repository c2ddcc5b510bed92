// A naive Mamba-2 (SSD) mixer, written independently of reference/ssm/mamba2.cpp so the two check each
// other: std::vector storage, explicit index loops, one token at a time, float64, no Eigen. It follows
// mamba_ssm's Mamba2 module directly (with vLLM's defaults:
// no dt_limit clamp, gated RMSNorm with norm_before_gate = False, eps 1e-5); activations, dense
// layers, the causal conv and the gated RMS norm are those of tests/support/naive_ops.h. Test-only;
// used by tests/ssm_mamba2 (ctest -L mamba2).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/tensor.h"

namespace hybridtb::testing {

// H = hidden (num_heads·head_size), Hs = num_ssm_heads, P = head_dim, N = state_size,
// G = n_groups, K = conv_kernel.
struct Mamba2Dims {
  int64_t H = 0;
  int64_t Hs = 0;
  int64_t P = 0;
  int64_t N = 0;
  int64_t G = 0;
  int64_t K = 0;

  int64_t d_ssm() const { return Hs * P; }
  int64_t conv_dim() const { return Hs * P + 2 * G * N; }
  int64_t proj() const { return 2 * Hs * P + 2 * G * N + Hs; }  // in_proj rows: z, x, B, C, dt
};

// Weights, row-major; absent optional biases are zeros.
struct NaiveMamba2 {
  Mamba2Dims dims;
  std::vector<double> in_proj;        // [proj][H]
  std::vector<double> in_proj_bias;   // [proj]
  std::vector<double> conv_weight;    // [conv_dim][K]: tap K−1 multiplies the current token
  std::vector<double> conv_bias;      // [conv_dim]
  std::vector<double> dt_bias;        // [Hs]
  std::vector<double> A_log;          // [Hs]
  std::vector<double> D;              // [Hs]
  std::vector<double> norm_weight;    // [d_ssm]
  std::vector<double> out_proj;       // [H][d_ssm]
  std::vector<double> out_proj_bias;  // [H]
};

// One request's state.
struct NaiveMamba2State {
  std::vector<double> conv;  // [conv_dim][K−1], oldest input first
  std::vector<double> ssm;   // [Hs][P][N]
};

// Runs `num_tokens` tokens one by one: hidden is [num_tokens][H]; returns the contributions
// [num_tokens][H] and leaves `state` after the last token.
std::vector<double> naive_mamba2(const NaiveMamba2& model, NaiveMamba2State& state, const std::vector<double>& hidden,
                                 int64_t num_tokens);

// The conv front end alone: xBC is [num_tokens][conv_dim] conv inputs; returns silu(conv + bias)
// [num_tokens][conv_dim] and shifts the tokens into `conv_state`.
std::vector<double> naive_mamba2_conv(const NaiveMamba2& model, std::vector<double>& conv_state,
                                      const std::vector<double>& xBC, int64_t num_tokens);

// The model from named host tensors of any floating dtype (the /weights names of the file format).
NaiveMamba2 naive_mamba2_model(const Mamba2Dims& dims, const std::map<std::string, TensorView>& weights);

}  // namespace hybridtb::testing
