// The float64 building blocks of the naive SSM oracles (tests/ssm_mamba1, ssm_mamba2, ssm_gdn) and
// of the expectations their tests derive by hand: activations, reading weights, a dense layer, the
// depthwise causal conv and the gated RMS norm — plain loops over std::vector, no Eigen, nothing
// from reference/ or optimized/, so that what they check stays independent of the code under test.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/tensor.h"

namespace hybridtb::testing {

// softplus with the kernels' threshold (vLLM's Mamba kernels, SGLang's fused_gdn_gating):
// (v <= 20) ? log1p(exp(v)) : v.
double naive_softplus(double v);
// 1 / (1 + exp(−v)).
double naive_sigmoid(double v);
// v · sigmoid(v).
double naive_silu(double v);

// Every value of a host view of any dtype, row-major.
std::vector<double> values_of(const TensorView& view);

// Weight `name` (`size` values, row-major) of named host tensors; an absent optional weight is zeros.
// Throws std::runtime_error "<who>: missing weight <name>" or "<who>: wrong size of <name>".
std::vector<double> naive_weight(const std::map<std::string, TensorView>& weights, const std::string& name,
                                 int64_t size, bool optional, const std::string& who);

// A dense layer on one vector: y[r] = bias[r] + Σ_k W[r][k]·x[k] for W [rows][cols] row-major,
// summed from k = 0 on (bias nullptr: from 0).
std::vector<double> naive_linear(const std::vector<double>& W, const double* x, int64_t rows, int64_t cols,
                                 const std::vector<double>* bias = nullptr);

// One token through a depthwise causal conv of K taps and SiLU, channel by channel, C channels:
// out[c] = silu(bias[c] + Σ_j weight[c][j]·tap_j) with taps the K−1 inputs saved in state[c]
// (oldest first) and then x[c], which is shifted into the state. weight [C][K] (tap K−1 multiplies
// the current token), bias [C], state [C][K−1].
void naive_causal_conv_silu(const std::vector<double>& weight, const std::vector<double>& bias, int64_t K,
                            std::vector<double>& state, const double* x, double* out, int64_t C);

// RMSNormGated over n channels (mamba_ssm, fla), rms(v) = sqrt(mean(v²) + eps):
//   norm_before_gate (Gated DeltaNet): out = y / rms(y) · w · silu(z);
//   otherwise (Mamba-2):               v = y·z·sigmoid(z), out = v / rms(v) · w.
void naive_gated_rms_norm(const double* y, const double* z, const double* w, int64_t n, double eps,
                          bool norm_before_gate, double* out);

}  // namespace hybridtb::testing
