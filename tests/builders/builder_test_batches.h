// Small hand-made batch descriptions for the metadata-builder tests: requests given as
// (context_len, query_len), block tables whose entries name their (request, column), and token
// rows tagged with their request so that reordering can be followed.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/tensor.h"

namespace hybridtb::testing {

struct Req {
  int64_t context_len = 0;
  int64_t query_len = 1;
};
inline constexpr Req kPaddingRequest{0, 0};

// Block-table entry of request r, column c: distinct and readable (request 2, column 3 → 3003).
inline int32_t block_id(int64_t r, int64_t c) { return static_cast<int32_t>(1000 * (r + 1) + c); }
// SSM block-table entry: distinct from every block_id.
inline int32_t ssm_block_id(int64_t r, int64_t c) { return static_cast<int32_t>(-(1000 * (r + 1) + c) - 5); }
// slot_mapping of real token t (padding tokens get −1).
inline int64_t slot_of_token(int64_t t) { return 500000 + t; }

inline BatchDescription make_batch(const std::vector<Req>& requests, int64_t max_blocks = 8, int64_t padding_tokens = 0) {
  BatchDescription batch;
  std::vector<int32_t> query_start_loc{0};
  std::vector<int32_t> seq_lens;
  for (const Req& req : requests) {
    query_start_loc.push_back(static_cast<int32_t>(query_start_loc.back() + req.query_len));
    seq_lens.push_back(static_cast<int32_t>(req.context_len + req.query_len));
  }
  const auto num_reqs = static_cast<int64_t>(requests.size());
  batch.query_start_loc = IntArray::vector(query_start_loc);
  batch.seq_lens = IntArray::vector(seq_lens);
  batch.block_table = IntArray::matrix(num_reqs, max_blocks);
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t c = 0; c < max_blocks; ++c) batch.block_table.at(r, c) = block_id(r, c);
  }
  batch.num_actual_tokens = query_start_loc.back();
  for (int64_t t = 0; t < batch.num_actual_tokens + padding_tokens; ++t) {
    batch.slot_mapping.push_back(t < batch.num_actual_tokens ? slot_of_token(t) : -1);
  }
  return batch;
}

inline IntArray make_ssm_block_table(int64_t num_reqs, int64_t max_blocks) {
  IntArray table = IntArray::matrix(num_reqs, max_blocks);
  for (int64_t r = 0; r < num_reqs; ++r) {
    for (int64_t c = 0; c < max_blocks; ++c) table.at(r, c) = ssm_block_id(r, c);
  }
  return table;
}

inline AttentionConfig mamba_config(MambaCacheMode mode, int64_t mamba_block_size, int64_t num_spec = 0) {
  AttentionConfig config;
  config.num_heads = 8;
  config.num_kv_heads = 2;
  config.head_size = 64;
  config.block_size = 16;
  config.scale = 0.125;
  config.ssm_mode = "mamba1";
  config.mamba_cache_mode = mode;
  config.mamba_block_size = mamba_block_size;
  config.num_speculative_tokens = num_spec;
  return config;
}

inline BuilderConfig builder_config(CudaGraphMode mode, std::vector<int64_t> capture_sizes = {1, 2, 4, 8, 16},
                                    int64_t max_num_seqs = 256) {
  BuilderConfig builder;
  builder.cudagraph_mode = mode;
  builder.cudagraph_capture_sizes = std::move(capture_sizes);
  builder.max_num_seqs = max_num_seqs;
  return builder;
}

inline int64_t uniform(std::mt19937& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace hybridtb::testing
