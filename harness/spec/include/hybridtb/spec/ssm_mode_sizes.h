// The sizes of the model-layer SSM modes (mamba1, mamba2, gdn) read from /config/ssm, checked, and
// the tensor specs the gdn core shares with a per-layer GDN layer. Part of the modes' descriptors
// (ssm_mode.h); the reference's float64 math and the generators read the same sizes.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridtb/spec/ssm_mode.h"

namespace hybridtb::spec::ssm {

// The hyper-parameters of ssm_mode mamba1.
struct Mamba1Sizes {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int64_t state = 0;         // N
  int64_t kernel = 0;        // K ≥ 2
  int64_t dt_rank = 0;       // R
};
// The sizes from /config/ssm intermediate_size, state_size, conv_kernel and dt_rank; throws Error
// naming the parameter if one is missing or not positive, or conv_kernel < 2.
Mamba1Sizes mamba1_sizes(const ModeShape& shape);

// The sizes of a Mamba-2 layer's SSM part (the /config/ssm parameters of ssm_mode mamba2).
struct Mamba2Sizes {
  int64_t heads = 0;     // Hs (num_ssm_heads): one scalar decay per head
  int64_t head_dim = 0;  // P
  int64_t state = 0;     // N (state_size)
  int64_t groups = 0;    // G (n_groups): head h reads B and C of group h / (Hs / G)
  int64_t kernel = 0;    // K (conv_kernel) ≥ 2

  int64_t d_ssm() const { return heads * head_dim; }
  int64_t conv_dim() const { return d_ssm() + 2 * groups * state; }  // x | B | C channels
  int64_t group_of(int64_t head) const { return head / (heads / groups); }
};

// Throws Error naming the /config/ssm parameter unless every size is positive, n_groups divides
// num_ssm_heads and conv_kernel ≥ 2.
void check_mamba2_sizes(const Mamba2Sizes& sizes);

// The sizes from /config/ssm num_ssm_heads, head_dim, state_size, n_groups and conv_kernel, checked
// by check_mamba2_sizes (the mode and a per-layer mamba2 layer read them alike).
Mamba2Sizes mamba2_sizes(const ModeShape& shape);

// The sizes of ssm_mode gdn's core (the /config/ssm parameters of ssm_mode gdn).
struct GdnSizes {
  int64_t num_k_heads = 0;  // Hk
  int64_t num_v_heads = 0;  // Hv, a multiple of Hk
  int64_t head_k_dim = 0;   // dk
  int64_t head_v_dim = 0;   // dv
  int64_t conv_kernel = 0;  // K ≥ 2
  int64_t conv_dim() const { return 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim; }
};

// The sizes from /config/ssm num_k_heads, num_v_heads, head_k_dim, head_v_dim and conv_kernel;
// throws Error naming the parameter if one is missing, not positive, or inconsistent
// (num_v_heads not a multiple of num_k_heads, conv_kernel < 2).
GdnSizes gdn_sizes(const ModeShape& shape);

// One slot of each of the core's state pools:
//   conv_state      [conv_dim, K−1]  the last K−1 mixed_qkv rows per channel, oldest first (stored
//                                    [K−1, conv_dim] under the SD layout: conv_state_spec)
//   recurrent_state [Hv, dv, dk]     M per value head, V-major as vLLM, SGLang, FlashInfer and
//                                    pymllm store it (the transpose of fla's / HF's S [Hv, dk, dv])
std::vector<TensorSpec> gdn_state_specs(const GdnSizes& sizes, const ModeShape& shape);

// The core's weights: conv1d_weight [conv_dim, K] (column K−1 multiplies the current token),
// conv1d_bias [conv_dim] (optional; Qwen3-Next has none), A_log [Hv], dt_bias [Hv].
std::vector<TensorSpec> gdn_core_weight_specs(const GdnSizes& sizes);

}  // namespace hybridtb::spec::ssm
