// Which keys a query row may attend to: the one visibility rule of hybridtb (vLLM's
// compute_kv_seq_mask for decoder layers, context_attention_fwd's bidirectional window for
// encoder_only ones). Plain integers only, so host C++ (the reference attention, the CUDA
// planner, the perf model, the synthetic generator) and device code (the CUDA kernels) evaluate
// the same functions.
//
// Decoder: visible(p, k) = (k ≤ p AND (W == 0 OR p − k < W)) OR mm_prefix(p, k); a window of W
// keeps exactly W keys, the query's own position included (vLLM window_size = (W − 1, 0)). The
// mm_prefix ranges are ORed last, so they override both causality and the window.
// Encoder_only: visible(p, k) = W == 0 OR |p − k| < W over the request's own tokens, no
// causality and no mm_prefix ranges (vLLM window_size = (W − 1, W − 1) into context_attention_fwd,
// which takes no ranges).
// In both, k must lie in [0, seq_len): the block table is never consulted past seq_len.
// Positions are absolute (0 = the request's first token); query row i of a step sits at
// p = context_len + i. W = 0 means no window.
#pragma once

#include <cstdint>

#include "hybridtb/spec/host_device.h"

namespace hybridtb::spec {

// The first key of the causal/window interval of a row at position p (decoder and encoder_only).
template <typename Int>
HYBRIDTB_HOST_DEVICE Int window_first_key(Int window, Int p) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : Int(0);
}

// One past the last key of the causal/window interval of a row at position p, before clipping to
// seq_len: p + 1 for a decoder row; p + W for an encoder_only row with a window, seq_len without.
template <typename Int>
HYBRIDTB_HOST_DEVICE Int window_key_end(bool encoder_only, Int window, Int seq_len, Int p) {
  if (!encoder_only) return p + 1;
  return window > 0 ? p + window : seq_len;
}

// Whether key k lies in the mm_prefix range pair (start, end) (inclusive; start < end) together
// with the row at position p; (0, 0) pairs pad.
template <typename Int>
HYBRIDTB_HOST_DEVICE bool in_mm_prefix_range(Int start, Int end, Int p, Int k) {
  return start < end && start <= p && p <= end && start <= k && k <= end;
}

// The rule itself. `mm_prefix` holds `num_mm_ranges` (start, end) pairs of the request (decoder only;
// may be null when num_mm_ranges is 0).
template <typename Int>
HYBRIDTB_HOST_DEVICE bool key_visible(bool encoder_only, Int window, Int seq_len, const int32_t* mm_prefix,
                                      Int num_mm_ranges, Int p, Int k) {
  if (k < 0 || k >= seq_len) return false;
  if (encoder_only) {
    const Int distance = p >= k ? p - k : k - p;
    return window == 0 || distance < window;
  }
  if (k <= p && (window == 0 || p - k < window)) return true;
  for (Int r = 0; r < num_mm_ranges; ++r) {
    if (in_mm_prefix_range<Int>(mm_prefix[2 * r], mm_prefix[2 * r + 1], p, k)) return true;
  }
  return false;
}

}  // namespace hybridtb::spec
