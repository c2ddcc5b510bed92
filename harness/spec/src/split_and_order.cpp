// Decode/prefill classification and request reordering, transcribed from vLLM's
// vllm/v1/attention/backends/utils.py: split_decodes_and_prefills (the newer version with
// require_uniform and treat_short_extends_as_decodes, default True as in vLLM) and the stable region sort of
// reorder_batch_to_split_decodes_and_prefills. Rules: the vLLM semantics notes, §3.2.
// Checked by tests/builders/split_and_order_test.cpp.
#include "hybridtb/spec/metadata_builders.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hybridtb/error.h"

namespace hybridtb::spec {
namespace {

bool is_padding_request(const BatchDescription& batch, int64_t r) {
  return batch.query_len(r) == 0 && batch.seq_len(r) == 0;
}

// A request that has computed no token yet but is scheduled some: still prefilling, whatever its
// query length (the batch file's stand-in for vLLM's is_prefilling; see metadata_builders.h).
bool is_fresh_request(const BatchDescription& batch, int64_t r) {
  return batch.query_len(r) > 0 && batch.context_len(r) == 0;
}

// Index of the first request of the trailing run of padding requests (R if there is none).
// Only trailing (query_len 0, seq_len 0) requests are padding (batch.h); the CUDA-graph runner
// appends them after the real requests, whatever those are.
int64_t first_trailing_padding_request(const BatchDescription& batch) {
  int64_t first = batch.num_reqs();
  while (first > 0 && is_padding_request(batch, first - 1)) --first;
  return first;
}

void check_query_start_loc(const BatchDescription& batch) {
  HYBRIDTB_CHECK(batch.query_start_loc.rank() == 1 && batch.query_start_loc.numel() >= 1,
                 "/batch/query_start_loc must be 1-d with at least one entry, got ",
                 batch.query_start_loc.describe());
}

// Moves the leading-dimension rows of `array` so that new row i is old row order[i]. Works for any
// rank (mm_prefix_range is 3-d).
IntArray permute_rows(const IntArray& array, const std::vector<int64_t>& order, const char* field) {
  const auto num_rows = static_cast<int64_t>(order.size());
  HYBRIDTB_CHECK(array.rank() >= 1 && array.size(0) == num_rows, field, " must have ", num_rows,
                 " rows (one per request), got ", array.describe());
  const int64_t row_width = num_rows == 0 ? 0 : array.numel() / num_rows;
  IntArray permuted = array;
  for (int64_t i = 0; i < num_rows; ++i) {
    std::copy_n(array.values.begin() + order[i] * row_width, row_width,
                permuted.values.begin() + i * row_width);
  }
  return permuted;
}

// Returns a contiguous host copy of `tensor` whose token rows (dimension 0) follow `token_order`.
// Rows past token_order.size() (CUDA-graph padding rows) keep their positions.
Tensor permute_token_rows(const Tensor& tensor, const std::vector<int64_t>& token_order, int64_t num_tokens,
                          const char* field) {
  if (tensor.empty()) return tensor;
  HYBRIDTB_CHECK(tensor.view().device() == Device::kHost, field, " must be a host tensor to be reordered");
  HYBRIDTB_CHECK(tensor.view().rank() >= 1 && tensor.size(0) == num_tokens, field, " must have ", num_tokens,
                 " token rows (the length of slot_mapping), got ", tensor.view().describe());
  const Tensor source = clone_host(tensor.view());  // contiguous, whatever the strides of `tensor`
  Tensor permuted = clone_host(source.view());
  const int64_t row_bytes = num_tokens == 0 ? 0 : source.nbytes() / num_tokens;
  const auto* from = source.data_as<const unsigned char>();
  auto* to = permuted.data_as<unsigned char>();
  for (size_t i = 0; i < token_order.size(); ++i) {
    std::memcpy(to + static_cast<int64_t>(i) * row_bytes, from + token_order[i] * row_bytes,
                static_cast<size_t>(row_bytes));
  }
  return permuted;
}

}  // namespace

DecodePrefillSplit split_decodes_and_prefills(const BatchDescription& batch, int64_t decode_threshold,
                                              bool require_uniform, bool treat_short_extends_as_decodes) {
  check_query_start_loc(batch);
  const int64_t num_reqs = batch.num_reqs();
  const int64_t num_tokens = batch.num_actual_tokens;
  const DecodePrefillSplit all_decodes{num_reqs, 0, num_tokens, 0};
  if (num_reqs == 0) return all_decodes;  // vLLM never builds an empty batch; all counts are 0

  // With require_uniform and a threshold > 1 a batch of short but unequal queries is not uniform,
  // so the early exit only applies to single-token decodes.
  if (batch.max_query_len() <= decode_threshold && (!require_uniform || decode_threshold <= 1) &&
      treat_short_extends_as_decodes) {
    return all_decodes;
  }
  if (batch.query_len(0) > decode_threshold) return DecodePrefillSplit{0, num_reqs, 0, num_tokens};

  // The count is positional: everything from the first prefill on is a prefill, which is why the
  // batch must be reordered decode-first beforehand.
  const int64_t first_len = batch.query_len(0);
  std::vector<bool> is_prefill(static_cast<size_t>(num_reqs));
  if (require_uniform) {
    // A padded uniform batch (full CUDA graphs): zero-length padding requests count as decodes so
    // that num_decodes matches the captured size.
    bool uniform = true;
    for (int64_t r = 0; r < num_reqs; ++r) {
      uniform = uniform && (batch.query_len(r) == first_len || batch.query_len(r) == 0);
    }
    if (uniform && treat_short_extends_as_decodes) return all_decodes;
    for (int64_t r = 0; r < num_reqs; ++r) is_prefill[r] = batch.query_len(r) != first_len;
  } else {
    for (int64_t r = 0; r < num_reqs; ++r) is_prefill[r] = batch.query_len(r) > decode_threshold;
  }
  // is_prefill |= is_prefilling (vLLM 0.33, treat_short_extends_as_decodes = False).
  if (!treat_short_extends_as_decodes) {
    for (int64_t r = 0; r < num_reqs; ++r) is_prefill[r] = is_prefill[r] || is_fresh_request(batch, r);
  }

  const auto first_prefill = std::find(is_prefill.begin(), is_prefill.end(), true);
  if (first_prefill == is_prefill.end()) return all_decodes;
  const auto num_decodes = static_cast<int64_t>(first_prefill - is_prefill.begin());
  const int64_t num_decode_tokens = batch.query_start_loc[num_decodes];
  return DecodePrefillSplit{num_decodes, num_reqs - num_decodes, num_decode_tokens,
                            num_tokens - num_decode_tokens};
}

void check_decodes_first(const BatchDescription& batch, int64_t decode_threshold,
                         bool treat_short_extends_as_decodes) {
  check_query_start_loc(batch);
  // Trailing padding requests may follow prefills: the CUDA-graph runner appends them after
  // whatever the real requests are, and decode_first_order keeps them there.
  const int64_t end = first_trailing_padding_request(batch);
  int64_t first_prefill = -1;
  for (int64_t r = 0; r < end; ++r) {
    const bool is_decode = batch.query_len(r) <= decode_threshold &&
                           (treat_short_extends_as_decodes || !is_fresh_request(batch, r));
    if (!is_decode && first_prefill < 0) first_prefill = r;
    HYBRIDTB_CHECK(!(is_decode && first_prefill >= 0), "/batch/query_start_loc: request ", r,
                   " (query_len ", batch.query_len(r), " <= decode threshold ", decode_threshold,
                   treat_short_extends_as_decodes ? "" : " with context", ", a decode) comes after request ", first_prefill, " (query_len ", batch.query_len(first_prefill),
                   ", a prefill); the builders count decodes positionally and need all decodes first. Reorder "
                   "the batch with spec::decode_first_order + spec::reorder_requests.");
  }
}

std::vector<int64_t> decode_first_order(const BatchDescription& batch, int64_t decode_threshold,
                                        bool treat_short_extends_as_decodes) {
  check_query_start_loc(batch);
  const int64_t num_reqs = batch.num_reqs();
  const int64_t end = first_trailing_padding_request(batch);
  // Regions in vLLM's order: decode (query_len <= threshold), extend (a longer query with
  // context, i.e. a later chunk of a chunked prefill), prefill (no context yet).
  enum Region { kDecode = 0, kExtend = 1, kPrefill = 2 };
  auto region = [&](int64_t r) {
    if (!treat_short_extends_as_decodes && is_fresh_request(batch, r)) return kPrefill;
    if (batch.query_len(r) <= decode_threshold) return kDecode;
    return batch.context_len(r) > 0 ? kExtend : kPrefill;
  };
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(num_reqs));
  for (const Region wanted : {kDecode, kExtend, kPrefill}) {
    for (int64_t r = 0; r < end; ++r) {
      if (region(r) == wanted) order.push_back(r);
    }
  }
  for (int64_t r = end; r < num_reqs; ++r) order.push_back(r);
  return order;
}

void reorder_requests(const std::vector<int64_t>& order, BatchDescription& batch, BatchInputs& inputs) {
  check_query_start_loc(batch);
  const int64_t num_reqs = batch.num_reqs();
  HYBRIDTB_CHECK(static_cast<int64_t>(order.size()) == num_reqs, "reorder_requests: the order has ",
                 order.size(), " entries, the batch has ", num_reqs, " requests");
  std::vector<bool> seen(static_cast<size_t>(num_reqs), false);
  for (const int64_t r : order) {
    HYBRIDTB_CHECK(r >= 0 && r < num_reqs && !seen[r], "reorder_requests: the order is not a permutation of 0..",
                   num_reqs - 1, " (bad or repeated entry ", r, ")");
    seen[r] = true;
  }
  const int64_t num_tokens = batch.num_tokens();
  const int64_t request_tokens = batch.query_start_loc[num_reqs];
  HYBRIDTB_CHECK(request_tokens <= num_tokens, "/batch/query_start_loc ends at ", request_tokens,
                 ", past the ", num_tokens, " entries of /batch/slot_mapping");

  // New token order: each request's rows in the new request order; rows past the last request
  // (CUDA-graph padding) are not listed and stay where they are.
  std::vector<int64_t> token_order;
  token_order.reserve(static_cast<size_t>(request_tokens));
  IntArray query_start_loc = IntArray::vector(std::vector<int32_t>(static_cast<size_t>(num_reqs + 1), 0));
  for (int64_t i = 0; i < num_reqs; ++i) {
    const int64_t r = order[i];
    for (int64_t t = batch.query_start_loc[r]; t < batch.query_start_loc[r + 1]; ++t) token_order.push_back(t);
    query_start_loc[i + 1] = static_cast<int32_t>(query_start_loc[i] + batch.query_len(r));
  }

  std::vector<int64_t> slot_mapping = batch.slot_mapping;
  for (size_t i = 0; i < token_order.size(); ++i) slot_mapping[i] = batch.slot_mapping[token_order[i]];

  // Everything is permuted into new values first, so a bad shape leaves batch and inputs untouched.
  Tensor query = permute_token_rows(inputs.query, token_order, num_tokens, "/inputs/query");
  Tensor key = permute_token_rows(inputs.key, token_order, num_tokens, "/inputs/key");
  Tensor value = permute_token_rows(inputs.value, token_order, num_tokens, "/inputs/value");
  BatchDescription reordered = batch;
  reordered.seq_lens = permute_rows(batch.seq_lens, order, "/batch/seq_lens");
  reordered.block_table = permute_rows(batch.block_table, order, "/batch/block_table");
  if (batch.ssm_block_table) {
    reordered.ssm_block_table = permute_rows(*batch.ssm_block_table, order, "/batch/ssm_block_table");
  }
  if (batch.num_accepted_tokens) {
    reordered.num_accepted_tokens = permute_rows(*batch.num_accepted_tokens, order, "/batch/num_accepted_tokens");
  }
  if (batch.mm_prefix_range) {
    reordered.mm_prefix_range = permute_rows(*batch.mm_prefix_range, order, "/batch/mm_prefix_range");
  }
  reordered.query_start_loc = std::move(query_start_loc);
  reordered.slot_mapping = std::move(slot_mapping);

  batch = std::move(reordered);
  inputs.query = std::move(query);
  inputs.key = std::move(key);
  inputs.value = std::move(value);
}

}  // namespace hybridtb::spec
