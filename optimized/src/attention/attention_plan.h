// The attention runner: checks one call's tensors, plans the batch (plan_attention,
// attention_work_plan.h: the routing, work lists, splits and upload layout as a plain value),
// uploads the plan in one copy and launches the kernels it names. prepare() and launch() are
// separate so that benchmarks can time the kernels alone (launch() may be repeated; it reads only
// what prepare() uploaded).
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

#include "attention/attention_launch.h"
#include "attention/attention_params.h"
#include "attention/attention_work_plan.h"
#include "common/device_memory.h"
#include "common/element_kind.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch.h"
#include "hybridtb/config.h"

namespace hybridtb::cuda {

// The fused hybrid add (AttentionParams::ssm_addend / hybrid_output), [T, Hq, D] in the model
// dtype with the output's strides: both empty (attention only); the hybrid output alone (a layer
// without an SSM branch: the kernels store the attention output there too); or both.
struct FusedAdd {
  TensorView addend;
  TensorView output;
};

class AttentionRunner {
 public:
  // `overrides`: debugging and comparison switches (attention_work_plan.h); production passes {}.
  AttentionRunner(const AttentionConfig& config, DeviceMemory& memory, int num_sms,
                  const AttentionPathOverrides& overrides = {});

  // Checks the call, plans it (plan_attention), uploads the plan in one copy.
  void prepare(const BatchDescription& batch, const StepTensors& tensors, const TensorView& output,
               cudaStream_t stream, const FusedAdd& fused = {});
  // Launches the kernels of the last plan, with the grids it sized.
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
  const AttentionPlan& plan() const { return plan_; }
  const AttentionPlanSummary& summary() const { return plan_.summary; }

  // Enters fixed-shape mode for batches shaped like `batch` (call once, before the first prepare):
  // num_reqs() requests of at most one query token each (decodes and padding requests), a block
  // table at most as wide as this one, mm_prefix ranges present iff here. Throws NotSupported if the
  // layer or the batch cannot run on the decode kernels (encoder layers, prefill rows, float32
  // caches, other head sizes). Afterwards prepare() refuses (Error) a batch of another shape and
  // tensors other than the first prepare()'s, and launch() launches the capacities.
  void fix_shape(const BatchDescription& batch);
  bool fixed_shape() const { return fixed_.has_value(); }

 private:
  AttentionParams config_params() const;
  AttentionParams bind(int64_t t, const StepTensors& tensors, const TensorView& output, const FusedAdd& fused,
                       TensorLayoutFacts& facts) const;
  void bind_cache(const StepTensors& tensors, AttentionParams& p, TensorLayoutFacts& facts) const;
  int64_t upload(const BatchDescription& batch, int64_t cache_blocks, AttentionParams& p, cudaStream_t stream);
  void bind_kv_map(const AttentionParams& p, int64_t num_blocks);
  void launch_with(const AttentionParams& params, cudaStream_t stream) const;
  void check_fixed_params();

  AttentionConfig config_;
  DeviceMemory& memory_;
  int num_sms_;
  bool hopper_wgmma_;  // the current device runs the wgmma prefill variant (AttentionPlanInput)
  AttentionPathOverrides overrides_;
  Workspace meta_;
  Workspace partials_;
  std::shared_ptr<void> alibi_;
  std::shared_ptr<void> sinks_;
  PinnedStaging pinned_;  // the plan's bytes, staged in place for the one upload
  AttentionPlan plan_;
  AttentionParams params_{};
  const DecodeItem* decode_mma_items_ = nullptr;
  const MixedItem* mixed_items_ = nullptr;
  int block_shift_ = -1;
  bool planned_alone_ = false;  // prepare_plan() ran: launch_on() may bind tensors to params_'s plan
  int64_t plan_blocks_ = 0;     // blocks the plan's block table spans (largest id + 1)
  int64_t plan_tokens_ = 0;     // token rows of the planned batch
  std::optional<FixedShapeCapacity> fixed_;
  std::optional<AttentionParams> first_params_;  // fixed shape: the first prepare()'s (the captured ones)
  std::optional<PrefillKvMap> kv_map_;  // the wgmma prefill's K/V tensor map of the last cache it ran on
};

// The plan of `batch` as the cuda backend would run it eagerly, as text (describe_plan), with the SM
// count of this machine's GPU or, without one, an H100's; no device memory, no kernel
// (BackendRegistry::explain, `hybridtb run --explain`; attention_explain.cpp).
std::string explain_attention_step(const BackendSettings& settings, const BatchDescription& batch,
                                   const HybridMetadata& metadata);

}  // namespace hybridtb::cuda
