// The core of ssm_mode `gdn` (Gated DeltaNet as Qwen3-Next serves it): everything between the
// layer's projections, i.e. what pymllm's forward_gdn and SGLang's GDN backend compute from the
// per-token `mixed_qkv`, `a` and `b` (../shared/notes/ssm-modes.md §1.4, §2.1). Defined in gdn.cpp,
// whose mode wraps it with in_proj_qkvz/in_proj_ba, the gated RMSNorm and out_proj; a per-layer
// hybrid design calls it directly on the mixed_qkv, a, b of a batch file. Checked by tests/ssm_gdn.
//
// Per token, with Hk key heads of dk, Hv value heads of dv (Hv a multiple of Hk) and K conv taps:
//   qkv = silu(causal_conv1d(mixed_qkv))        conv_dim = 2·Hk·dk + Hv·dv channels, [q | k | v]
//   q, k: [Hk, dk], v: [Hv, dv]; value head i reads key head i / (Hv/Hk)
//   q̂ = q / sqrt(Σq² + 1e-6) · dk^-1/2,  k̂ = k / sqrt(Σk² + 1e-6)
//   α = exp(−exp(A_log)·softplus(a + dt_bias)),  β = sigmoid(b)              per value head
//   M ← α·M;  u = β·(v − M k̂);  M ← M + u k̂ᵀ;  o = M q̂                 M: [dv, dk] per value head
#pragma once

#include <cstdint>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"

namespace hybridtb::reference::ssm {

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

// Advances one request over L consecutive tokens: `mixed_qkv` [L, conv_dim], `a` and `b` [L, Hv].
// `weights` holds the core's weights by name (extra names are ignored), `state` one slot of
// conv_state and recurrent_state (flattened row-major, zeros for a fresh request), updated in
// place. Returns o [L, Hv·dv] (value head major). `decode` (L = 1) takes the single-step update.
Matrix gdn_core(const GdnSizes& sizes, const Weights& weights, State& state, const Matrix& mixed_qkv, const Matrix& a,
                const Matrix& b, bool decode);

}  // namespace hybridtb::reference::ssm
