// TritonAttentionMetadataBuilder (vllm/v1/attention/backends/triton_attn.py) on the host: the
// per-step scalars plus the 2D/3D (split-softmax) decision that unified_attention takes from them.
// Rules: the vLLM semantics notes, §1.9. Checked by tests/builders/triton_metadata_test.cpp.
#include "hybridtb/spec/metadata_builders.h"

#include <cstdlib>

#include "hybridtb/error.h"

namespace hybridtb::spec {
namespace {

// vLLM's MIN_LAUNCH_GRID_SIZE_2D: below this many (sequence, kv head) programs the 2D grid leaves
// the GPU idle, so decode batches of fewer sequences split each softmax over segments.
constexpr int64_t kMinLaunchGridSize2d = 128;
constexpr int64_t kNumParSoftmaxSegments = 16;

int64_t next_power_of_two(int64_t n) {
  int64_t power = 1;
  while (power < n) power *= 2;
  return power;
}

// TritonAttentionMetadataBuilder.__init__: the 3D threshold, snapped to a captured batch size under
// full CUDA graphs so the segment buffers allocated for it match a graph.
int64_t seq_threshold_3d(const AttentionConfig& config, const BuilderConfig& builder) {
  int64_t threshold = kMinLaunchGridSize2d / config.num_kv_heads;
  // vLLM takes min() over the capture sizes unconditionally (an empty list raises there); with no
  // sizes there is nothing to snap to, so the unsnapped value stays.
  if (has_full_cudagraphs(builder.cudagraph_mode) && !builder.cudagraph_capture_sizes.empty()) {
    // min(sizes, key=|x - threshold|): the first size in list order wins a tie.
    int64_t nearest = builder.cudagraph_capture_sizes.front();
    for (const int64_t size : builder.cudagraph_capture_sizes) {
      if (std::llabs(size - threshold) < std::llabs(nearest - threshold)) nearest = size;
    }
    threshold = nearest;
  }
  return threshold;
}

}  // namespace

TritonAttentionMetadata build_triton_metadata(const AttentionConfig& config, const BuilderConfig& builder,
                                              const BatchDescription& batch) {
  HYBRIDTB_CHECK(config.num_kv_heads > 0, "/config/num_kv_heads must be positive, got ", config.num_kv_heads);
  HYBRIDTB_CHECK(config.head_size > 0, "/config/head_size must be positive, got ", config.head_size);
  HYBRIDTB_CHECK(batch.query_start_loc.rank() == 1 && batch.query_start_loc.numel() >= 1,
                 "/batch/query_start_loc must be 1-d with at least one entry, got ",
                 batch.query_start_loc.describe());

  TritonAttentionMetadata metadata;
  metadata.num_actual_tokens = batch.num_actual_tokens;
  metadata.max_query_len = batch.max_query_len();
  metadata.max_seq_len = batch.max_seq_len();
  metadata.seq_threshold_3d = seq_threshold_3d(config, builder);
  metadata.num_par_softmax_segments = kNumParSoftmaxSegments;
  metadata.head_size_padded = next_power_of_two(config.head_size);
  // unified_attention's condition (VLLM_BATCH_INVARIANT, which forces 2D, is not modelled). Taken
  // literally, an empty batch (0 sequences, max query length 0) selects the 3D path; nothing runs.
  const bool use_3d = metadata.max_query_len <= 1 && batch.num_reqs() <= metadata.seq_threshold_3d;
  metadata.use_3d_path = use_3d ? 1 : 0;
  return metadata;
}

}  // namespace hybridtb::spec
