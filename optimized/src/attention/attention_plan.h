// The attention planner/runner: checks one call's inputs, splits the batch into decode-path and
// tensor-core prefill and generic-path work (plain host integers, like vLLM's metadata), uploads it in one copy and
// launches the kernels. Host-only. prepare() and launch() are separate so that benchmarks can time
// the kernels alone (launch() may be repeated; it reads only what prepare() uploaded).
//
// Fixed-shape mode (CUDA graphs, fix_shape()): for decode-only batches of one padded shape, every
// launch reads the same device buffers and has the same grid, so launch() can be captured into a
// graph once and replayed after each prepare() of a new batch. The work lists are the eager plan's,
// bit for bit, padded to capacities that bound any batch of that shape with sentinel items the
// kernels skip (DecodeItem.request −1, CombineItem.token −1) — so a replayed step computes exactly
// what the eager step computes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_params.h"
#include "common/device_memory.h"
#include "common/element_kind.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"

namespace hybridtb::cuda {

struct AttentionPlanSummary {
  int64_t decode_rows = 0;     // rows on the decode fast path
  int64_t decode_ctas = 0;     // their CTAs along the key axis (× kv heads × head passes in the grid)
  int64_t split_rows = 0;      // decode rows split across CTAs (finished by the combine kernel)
  int64_t decode_mma_rows = 0;  // of decode_rows: on the tensor-core decode kernel (the rest: SIMT)
  int64_t decode_mma_ctas = 0;  // of decode_ctas: the tensor-core kernel's
  std::string decode_fallback;  // why decode rows took the SIMT decode kernel ("" if none did)
  int64_t prefill_rows = 0;    // query rows (tokens) on the tensor-core prefill path
  int64_t prefill_items = 0;   // CTAs of the prefill kernel
  std::string prefill_fallback;  // why non-decode rows took the generic path ("" if none did)
  int64_t generic_items = 0;   // CTAs of the generic kernel
  int64_t generic_rows = 0;    // query rows on the generic path
  std::string describe() const;
};

// The fused hybrid add (AttentionParams::ssm_addend / hybrid_output), [T, Hq, D] in the model
// dtype with the output's strides: both empty (attention only); the hybrid output alone (a layer
// without an SSM branch: the kernels store the attention output there too); or both.
struct FusedAdd {
  TensorView addend;
  TensorView output;
};

class AttentionRunner {
 public:
  AttentionRunner(const AttentionConfig& config, DeviceMemory& memory, int num_sms);

  void prepare(const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
               cudaStream_t stream, const FusedAdd& fused = {});
  void launch(cudaStream_t stream) const;

  // Plan-once, bind-per-layer (fixed-shape mode only; the cuda backend's CUDA-graph lifecycle, where
  // every attention layer of a step reads one plan): prepare_plan() is prepare()'s metadata half —
  // the batch's checks, work lists, query_start_loc, seq_lens and block table, uploaded into this
  // runner's buffers — and launch_on() enqueues the kernels over one layer's tensors reading that
  // plan. launch_on checks the tensors as prepare() does and against the plan (the cache's alignment
  // and its blocks) before enqueueing anything, and uploads nothing, so it can be captured. The
  // layers' launches share the plan's buffers (partials included): they must run in stream order.
  void prepare_plan(const BatchDescription& batch, cudaStream_t stream);
  void launch_on(const StepTensors& tensors, const TensorView& output, const FusedAdd& fused,
                 cudaStream_t stream) const;
  const AttentionPlanSummary& summary() const { return summary_; }

  // Enters fixed-shape mode for batches shaped like `batch` (call once, before the first prepare):
  // num_reqs() requests of at most one query token each (decodes and padding requests), a block
  // table at most as wide as this one, mm_prefix ranges present iff here. Throws NotSupported if the
  // layer or the batch cannot run on the decode kernels (encoder layers, prefill rows, float32
  // caches, other head sizes). Afterwards prepare() refuses (Error) a batch of another shape and
  // tensors other than the first prepare()'s, and launch() launches the capacities.
  void fix_shape(const BatchDescription& batch);
  bool fixed_shape() const { return fixed_.has_value(); }
  // Tunables (benchmarks may override): decode keys per split are chosen so that the decode grid
  // has about `decode_ctas_per_sm` CTAs per SM, within [min, max] keys.
  int64_t decode_ctas_per_sm = 16;
  int64_t decode_min_split_keys = 256;
  int64_t decode_max_split_keys = 8192;
  // The tensor-core decode kernel's split policy (its CTAs stream faster: fewer per SM resident).
  int64_t decode_mma_ctas_per_sm = 8;
  int64_t decode_mma_min_split_keys = 256;
  bool disable_decode_mma = false;  // tests/benchmarks: decode rows on the SIMT decode kernel
  bool force_generic = false;  // tests: run every row on the generic kernel
  bool disable_prefill = false;  // benchmarks/tests: keep non-decode rows on the generic kernel
  int prefill_variant = -1;      // benchmarks: tile variant of the prefill kernel (-1: the default for D)

 private:
  void check_batch(const BatchDescription& batch) const;
  int64_t referenced_blocks(const BatchDescription& batch, int64_t cache_blocks) const;
  AttentionParams config_params() const;
  AttentionParams bind(int64_t t, const StepTensors& tensors, const TensorView& output, const FusedAdd& fused,
                       bool& decode_ok, std::string& prefill_why) const;
  void plan(const BatchDescription& batch, bool decode_ok, const std::string& prefill_why, AttentionParams& p,
            cudaStream_t stream);
  void launch_with(const AttentionParams& params, cudaStream_t stream) const;

  AttentionConfig config_;
  DeviceMemory& memory_;
  int num_sms_;
  Workspace meta_;
  Workspace partials_;
  std::shared_ptr<void> alibi_;
  std::shared_ptr<void> sinks_;
  std::vector<unsigned char> staging_;
  PinnedStaging pinned_;
  AttentionParams params_{};
  int64_t num_generic_ = 0;
  int64_t num_prefill_ = 0;
  int prefill_variant_used_ = 0;
  int64_t num_decode_ = 0;
  int64_t num_decode_mma_ = 0;
  const DecodeItem* decode_mma_items_ = nullptr;
  int64_t num_combine_ = 0;
  int heads_per_pass_ = 1;
  int block_shift_ = -1;
  AttentionPlanSummary summary_;
  bool planned_alone_ = false;  // prepare_plan() ran: launch_on() may bind tensors to params_'s plan
  int64_t plan_blocks_ = 0;     // blocks the plan's block table spans (largest id + 1)
  int64_t plan_tokens_ = 0;     // token rows of the planned batch
  struct FixedShape {
    int64_t num_reqs = 0;
    int64_t block_columns = 0;
    bool mm_prefix = false;
    int64_t mm_ranges = 0;
    int64_t decode_capacity = 0;      // SIMT decode items
    int64_t decode_mma_capacity = 0;  // tensor-core decode items
    size_t meta_bytes = 0;            // the upload, laid out for the capacities
    std::optional<AttentionParams> first;  // the first prepare()'s parameters (the captured ones)
  };
  std::optional<FixedShape> fixed_;
  void check_fixed_params();
};

}  // namespace hybridtb::cuda
