// Which keys a query row may attend to: the one visibility rule of hybridtb (vLLM's
// compute_kv_seq_mask for decoder layers, context_attention_fwd's bidirectional window for
// encoder_only ones). The reference attention decides visibility only through key_visible();
// the CUDA backend cites it. See ../shared/notes/vllm-semantics.md §1.3 and §1.6.
#pragma once

#include <cstdint>

#include "hybridtb/config.h"

namespace hybridtb::reference {

// Everything the mask of one request depends on. Positions are absolute (0 = the request's first
// token); a query row i of the step sits at p = context_len + i.
struct RequestMask {
  AttnType attn_type = AttnType::kDecoder;
  int64_t sliding_window = 0;          // W; 0 = no window
  int64_t seq_len = 0;                 // keys [0, seq_len) exist; nothing at or past it is visible
  const int32_t* mm_prefix = nullptr;  // (optional) [num_mm_ranges][2] inclusive (start, end) pairs
  int64_t num_mm_ranges = 0;           // a pair is a range only if start < end; (0, 0) pads
};

// Decoder: visible(p, k) = (k ≤ p AND (W == 0 OR p − k < W)) OR mm_prefix(p, k); a window of W
// keeps exactly W keys, the query's own position included (vLLM window_size = (W − 1, 0)). The
// mm_prefix ranges are ORed last, so they override both causality and the window.
// Encoder_only: visible(p, k) = W == 0 OR |p − k| < W over the request's own tokens, no
// causality and no mm_prefix ranges (vLLM window_size = (W − 1, W − 1) into context_attention_fwd,
// which takes no ranges).
// In both, k must lie in [0, seq_len): the block table is never consulted past seq_len.
inline bool key_visible(const RequestMask& mask, int64_t p, int64_t k) {
  if (k < 0 || k >= mask.seq_len) return false;
  const int64_t w = mask.sliding_window;
  if (mask.attn_type == AttnType::kEncoderOnly) {
    const int64_t distance = p >= k ? p - k : k - p;
    return w == 0 || distance < w;
  }
  if (k <= p && (w == 0 || p - k < w)) return true;
  for (int64_t r = 0; r < mask.num_mm_ranges; ++r) {
    const int64_t start = mask.mm_prefix[2 * r];
    const int64_t end = mask.mm_prefix[2 * r + 1];
    if (start < end && start <= p && p <= end && start <= k && k <= end) return true;
  }
  return false;
}

}  // namespace hybridtb::reference
