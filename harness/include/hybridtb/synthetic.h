// Seeded synthetic batches: a list of requests (context length, query length) turned into a
// complete, valid hybrid-batch with realistic paging. Used by the tests, by the shipped example
// batches, and as the core of `hybridtb gen`.
//
// A linear-attention layer (config.layer_kind gdn or mamba2) gets its inputs (linear_layer.h)
// instead of query, key, value and a KV cache; its paging is the same, the attention layers' of the
// model, so the same requests, seed, block_size, window and Mamba cache settings give every layer
// of a per-layer model the same batch.
//
// Paging follows vLLM: block 0 is the null block and is never given to a request; each request
// gets ceil(seq_len / block_size) physical blocks, shuffled across the pool by default; blocks that
// slid out of the sliding window for every query of the request are pointed at the null block,
// which is filled with NaN (integer caches: with the most negative value). Tensor data is
// standard-normal, never zeros. The KV cache holds random values at every allocated slot,
// including the slots this step will overwrite.
//
// `hybridtb gen` turns on the options below the line in SyntheticOptions (compact paging, a fast
// counter-based fill, prefix sharing, aliasing); with them off, the output is bit-identical to
// what this generator always produced (the shipped examples depend on it).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/progress.h"

namespace hybridtb {

struct RequestSpec {
  int64_t context_len = 0;  // tokens already in the cache (num_computed_tokens)
  int64_t query_len = 1;    // tokens scheduled this step (1 = a decode)
  // (optional) inclusive absolute bidirectional ranges for mm_prefix_range
  std::vector<std::pair<int32_t, int32_t>> mm_prefix_ranges;
  // (optional) speculative decoding: tokens accepted in the previous step, in [1, 1 + drafts];
  // 0 = not given. If any request gives it, the batch gets /batch/num_accepted_tokens, with 1 for
  // the other requests (and padding requests).
  int32_t num_accepted_tokens = 0;
};

struct SyntheticOptions {
  uint64_t seed = 0;
  bool shuffle_blocks = true;      // false: request blocks are consecutive ids in request order
  int64_t spare_blocks = 3;        // unused blocks in the pool besides the null block
  bool null_out_of_window = true;  // point blocks outside every query's window at block 0 (NaN)
  int64_t padding_tokens = 0;      // CUDA-graph padding rows appended to the token axis (slot −1)
  int64_t padding_requests = 0;    // trailing requests with query_len 0 and seq_len 0
  float k_scale = 1.0f;            // per-tensor fp8 scales
  float v_scale = 1.0f;
  std::optional<float> output_scale;  // fp8 output: stored output = clamp(o / output_scale)
  // Give the SSM branch its own /batch/ssm_block_table: distinct state slots per request, one per
  // mamba_block_size tokens in mamba_cache_mode all/align (1 + num_speculative_tokens in mode
  // none). Slot 0 is never used (vLLM's null block); padding requests get rows of 0. Without it
  // the SSM branch indexes the attention block table, as the seed's builder does — where a
  // sliding window has pointed early blocks at the null block, requests then share slot 0.
  bool ssm_block_table = false;

  // --- used by `hybridtb gen` (all off: the library's default batches, bit for bit) ---------------
  // Compact paging as vLLM does it: a block that slid out of the window gets no physical block
  // (it was freed; the table points at block 0), and an SSM table row holds only the slots its
  // request uses (ceil(seq_len / mamba_block_size) + num_speculative_tokens, the rest 0).
  bool compact = false;
  // Tensor data from a counter-based generator (splitmix64 of seed, tensor and element index;
  // approximately standard-normal: an Irwin–Hall sum of four uniforms, |x| ≤ 3.47, never 0),
  // filled on several threads. Deterministic and independent of the thread count, and an order
  // of magnitude faster than std::normal_distribution for large caches.
  bool fast_fill = false;
  // Where the fill of the KV cache reports how many blocks are done (stage "generating the KV
  // cache"); the fast fill reports from one of its threads. Not part of what is generated.
  ProgressSink* progress = nullptr;
  // Prefix-cache hits: requests whose context_len >= shared_prefix_tokens use the SAME physical
  // blocks for their first shared_prefix_tokens / block_size blocks (full blocks only, never
  // written this step), so the block tables alias. In mamba_cache_mode all the SSM table rows
  // share their first shared_prefix_tokens / mamba_block_size slots the same way.
  int64_t shared_prefix_tokens = 0;
  // Random aliasing (vLLM's unified-attention test draws block tables with repeats): every block
  // entry a request only reads this step is drawn with replacement from a pool of a quarter as
  // many physical blocks, so ids repeat within and across rows. Blocks written this step (the
  // block of the first query position onwards) stay distinct, so the KV write is well defined.
  bool alias_blocks = false;
};

// The number of SSM state slots a batch addresses (1 + the largest id in the table the SSM
// branch uses), i.e. the smallest num_slots its state pools may have.
int64_t ssm_slots_needed(const BatchDescription& batch);

BatchFile make_synthetic_batch(const AttentionConfig& config, const BuilderConfig& builder,
                               const std::vector<RequestSpec>& requests, const SyntheticOptions& options);

}  // namespace hybridtb
