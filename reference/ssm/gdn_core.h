// The core of ssm_mode `gdn` (Gated DeltaNet as Qwen3-Next serves it): everything between the
// layer's projections, i.e. what pymllm's forward_gdn and SGLang's GDN backend compute from the
// per-token `mixed_qkv`, `a` and `b`. Defined in gdn.cpp,
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
#include "hybridtb/spec/ssm_mode_sizes.h"

namespace hybridtb::reference::ssm {

using spec::ssm::gdn_core_weight_specs;
using spec::ssm::gdn_sizes;
using spec::ssm::gdn_state_specs;
using spec::ssm::GdnSizes;

// Advances one request over L consecutive tokens: `mixed_qkv` [L, conv_dim], `a` and `b` [L, Hv].
// `weights` holds the core's weights by name (extra names are ignored), `state` one slot of
// conv_state and recurrent_state (flattened row-major, zeros for a fresh request), updated in
// place. Returns o [L, Hv·dv] (value head major). `decode` (L = 1) takes the single-step update.
Matrix gdn_core(const GdnSizes& sizes, const Weights& weights, State& state, const Matrix& mixed_qkv, const Matrix& a,
                const Matrix& b, bool decode);

}  // namespace hybridtb::reference::ssm
