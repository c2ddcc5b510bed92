// A naive attention formula, written independently of reference/src/paged_attention.cpp so the
// two can check each other: plain loops over one request's contiguous K/V copy, its own mask code,
// and softmax in the textbook log-sum-exp form. Test-only; used by tests/attention.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"

namespace hybridtb::testing {

struct NaiveLayer {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  double scale = 0.0;
  int64_t window = 0;              // 0 = none
  double soft_cap = 0.0;           // 0 = off
  std::vector<double> alibi;       // [num_heads] or empty
  bool alibi_sqrt = false;
  std::vector<double> sinks;       // [num_heads] or empty
  bool bidirectional = false;      // encoder_only
  std::optional<double> output_scale;
};

struct NaiveRequest {
  int64_t context_len = 0;
  int64_t query_len = 0;
  std::vector<double> q;  // [query_len][num_heads][head_size]
  std::vector<double> k;  // [seq_len][num_kv_heads][head_size], dequantised
  std::vector<double> v;  // [seq_len][num_kv_heads][head_size], dequantised
  std::vector<std::pair<int64_t, int64_t>> mm_ranges;  // inclusive, absolute
};

// [query_len][num_heads][head_size].
std::vector<double> naive_attention(const NaiveLayer& layer, const NaiveRequest& request);

// The naive view of a layer: encoder_only layers drop soft cap, ALiBi, sinks and the fp8 output
// scale (vLLM's encoder path never passes them on).
NaiveLayer naive_layer(const AttentionConfig& config, const StepTensors& tensors);
// Request r of a step, K/V read from the cache as it is now (call after the KV write) through the
// block table, or from the step's key/value rows for encoder_only.
NaiveRequest naive_request(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors,
                           int64_t r);

}  // namespace hybridtb::testing
