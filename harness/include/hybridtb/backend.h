// The one interface every hybridtb backend implements: the CPU reference (ground truth) and,
// when built with CUDA, the GPU backend. Host-only; compiles without nvcc.
//
// A backend is created for one layer configuration (like vLLM's AttentionImpl). A step runs in
// two phases that are kept apart on purpose:
//   1. build_metadata()   — the plan: plain integers (metadata.h), comparable across backends;
//   2. the run, on tensors in the backend's memory: write_kv_cache() + hybrid_forward() (attention
//      and the parallel SSM branch) for a full-attention layer, linear_attention_forward() for a
//      linear-attention layer (config.layer_kind gdn or mamba2).
// A per-layer hybrid model (Qwen3-Next: GDN and attention layers) runs through one composite
// Backend, PerLayerBackend (per_layer.h), which builds the metadata once per step for all layers
// and routes each call to the backend of the layer's kind, as pymllm's HybridAttnBackend does.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tensor_parallel_group.h"

namespace hybridtb {

struct BackendSettings;

// A decode step captured into a CUDA graph by Backend::capture_decode_step: the step's launches
// recorded once against fixed device buffers. replay() re-plans a new batch of the same padded
// shape into those buffers (the metadata updated in place, as vLLM updates its persistent
// buffers) and launches the graph. It computes exactly what the eager step computes for the same
// batch, bit for bit, and writes nothing for padding rows and padding requests.
// Must not outlive the backend that captured it.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs write_kv_cache + hybrid_forward of `batch` on the tensors and outputs given at capture
  // (put the new step's query/key/value rows into them first). `batch` must have the captured
  // number of requests (CUDA-graph padding), at most one query token per request, a block table
  // at most as wide as the captured one; otherwise Error (or NotSupported) naming the field, with
  // nothing run. Asynchronous like the eager calls (Backend::synchronize waits).
  virtual void replay(const HybridMetadata& metadata, const BatchDescription& batch) = 0;
  // What was captured: kernels, capacities, the fused add.
  virtual std::string describe() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // Element type of the outputs this backend writes: float64 for the reference (ground truth is
  // never rounded), the model dtype (or fp8 with output_scale) for a GPU backend.
  virtual DType output_dtype() const = 0;

  // A backend of this kind for another layer configuration of the same model, sharing this one's
  // device resources (a GPU backend: its stream, memory allocator and cuBLAS handle), so that the
  // layers of one step run in order on one stream and one CUDA graph can capture them all
  // (create_per_layer_backend uses it). Default: the registered backend name(), created afresh.
  virtual std::unique_ptr<Backend> create_sibling(const BackendSettings& settings);

  // --- memory on this backend's device -------------------------------------------------------
  virtual Tensor allocate(DType dtype, const Shape& shape) = 0;
  // Copies between equal-shaped contiguous views; either side may be host or this device.
  virtual void copy(const TensorView& dst, const TensorView& src) = 0;
  virtual void synchronize() = 0;

  // --- plan ------------------------------------------------------------------------------------
  virtual HybridMetadata build_metadata(const BatchDescription& batch) = 0;

  // --- run -------------------------------------------------------------------------------------
  // reshape_and_cache_flash: writes this step's key/value rows into the paged cache at their slots
  // (slot −1 skipped), quantising for fp8 and per-token-head cache dtypes.
  virtual void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) = 0;
  // Unified paged attention over the whole varlen batch; writes rows [0, num_actual_tokens) of
  // `output` ([T, Hq, D] in output_dtype()) and nothing else.
  virtual void attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                 const StepTensors& tensors, const TensorView& output) = 0;

  // The SSM history branch of config.ssm_mode: its contribution for the hidden states
  // query[:num_actual_tokens] viewed as [T, Hq·D], written to rows [0, num_actual_tokens) of
  // `contribution` ([T, Hq, D] in output_dtype()); updates tensors.ssm_state in place. Requests
  // whose state slot is < 0 contribute zeros and touch no state. Throws NotSupported for a mode
  // this backend does not implement (never a silent fallback).
  virtual void ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                           const TensorView& contribution) = 0;

  // HybridAttentionImpl.forward: attention, then (if the layer has an SSM branch) its contribution
  // added into the output. Each view is [T, Hq, D] in output_dtype(); `attn_output` and
  // `ssm_output` receive the two parts alone (ssm_output may be empty for ssm_mode "none").
  // Only rows [0, num_actual_tokens) of any of them are written.
  struct HybridOutputs {
    TensorView output;
    TensorView attn_output;
    TensorView ssm_output;
  };
  virtual void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                              const HybridOutputs& outputs) = 0;

  // A linear-attention layer (config.layer_kind gdn or mamba2; pymllm's forward_gdn): the mode's
  // core over the layer's inputs tensors.linear_inputs (linear_layer.h), with the state pools
  // tensors.ssm_state (updated in place) and the core's weights tensors.weights. Writes rows
  // [0, num_actual_tokens) of `output` ([T, linear_layer_spec(config).output_width] in
  // output_dtype()) and nothing else. Requests whose state slot is < 0 (padding, PAD_SLOT_ID) read
  // and write no state and contribute zero rows. The slots, cache modes and block boundaries are
  // the Mamba metadata's, as for ssm_forward. Default: NotSupported (a backend without linear
  // layers; never a silent fallback).
  virtual void linear_attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                        const StepTensors& tensors, const TensorView& output);

  // --- CUDA graphs (serving engines replay decode steps from graphs) -------------------------------
  // The stream the run phase enqueues on (a cudaStream_t for "cuda"), or nullptr for a host
  // backend. Lets callers time a step with events on it, or order their own work after it.
  virtual void* native_stream() { return nullptr; }
  // Captures one decode step — write_kv_cache + hybrid_forward of `batch` (its padded shape) on
  // these tensors and outputs — into a StepGraph. Captures only: nothing runs until replay().
  // Throws NotSupported for a backend without graphs or a step a graph cannot hold (prefill or
  // speculative rows, encoder layers, kernels without a fixed-shape form).
  virtual std::unique_ptr<StepGraph> capture_decode_step(const HybridMetadata& metadata,
                                                         const BatchDescription& batch, const StepTensors& tensors,
                                                         const HybridOutputs& outputs);

  // The CUDA-graph lifecycle of a whole model's decode step (pymllm's AttentionBackend hooks
  // init_cuda_graph_state, init_forward_metadata_capture_cuda_graph and ..._replay_cuda_graph),
  // for a graph runner that captures the calls of EVERY layer of one step into one graph, where
  // capture_decode_step captures one layer's step on its own. A composite backend forwards each
  // hook to each of its backends (PerLayerBackend). Default: NotSupported.
  //
  // The contract, which a GPU backend implements with persistent buffers at fixed addresses:
  //  - init_graph_state(max_num_reqs, max_num_tokens): the capacities of the graph state: padded
  //    batches of up to these many requests and token rows.
  //  - init_capture_metadata(metadata, batch): plans `batch` (a padded decode batch: query_len ≤ 1,
  //    trailing padding requests and rows) into the metadata buffers of its padded shape (state-slot
  //    ids, query_start_loc, the KV-write slots, the attention plan; allocated on the first capture
  //    of that shape and kept for the backend's life). From then on the run calls (write_kv_cache,
  //    attention_forward, ssm_forward, hybrid_forward, linear_attention_forward) read only these
  //    buffers and bind their own layer's tensors to them, with no upload and no host
  //    synchronisation, so the runner can capture them (the first call of each kind may allocate
  //    its scratch: capture in cudaStreamCaptureModeRelaxed, or run the step once first, as vLLM's
  //    warm-up does). The next eager build_metadata ends that (as pymllm's init_forward_metadata
  //    replaces the graph's metadata).
  //  - init_replay_metadata(metadata, batch): re-plans a new batch of a CAPTURED padded shape into
  //    the same buffers, in place (stream-ordered copies, outside the graph), before the runner
  //    replays that shape's graph. Padding requests and rows are rewritten as PAD_SLOT_ID on every
  //    replay, never left holding a slot id from an earlier, larger batch (pymllm keeps stale
  //    req_pool_indices there, and its padded decode rows then write live state; notes §2.6).
  // Errors name the field: a batch larger than the state, a prefill or speculative row, a replay
  // whose padded shape no capture had, or a replay before any capture.
  virtual void init_graph_state(int64_t max_num_reqs, int64_t max_num_tokens);
  virtual void init_capture_metadata(const HybridMetadata& metadata, const BatchDescription& batch);
  virtual void init_replay_metadata(const HybridMetadata& metadata, const BatchDescription& batch);
};

// The operands of the SSM branch's chunked-prefill products (BackendSettings::ssm_prefill_operands).
enum class SsmPrefillOperands : uint8_t {
  kFloat32,  // float32 operands, float32-accurate products (the cuda backend: 3xTF32 on the tensor cores)
  kModel,    // operands rounded to the model dtype (float16 / bfloat16), one 16-bit product, float32 sums
};
// "float32" / "model".
std::string_view to_string(SsmPrefillOperands operands);
// Parses "float32" / "model"; throws Error naming the setting and the accepted values otherwise.
SsmPrefillOperands parse_ssm_prefill_operands(std::string_view text);

struct BackendSettings {
  AttentionConfig attention;
  BuilderConfig builder;
  // cuda: hybrid_forward adds the SSM contribution in the attention kernels' epilogues (no extra
  // pass over the output); false: a separate add pass after attention (the benchmark's
  // "two_kernel" path). Both give the same bits. The reference ignores it.
  bool fuse_hybrid_add = true;
  // The layer's tensor-parallel group when `attention` is a rank's shard (tp_size > 1) whose SSM
  // branch meets the other ranks (tensor_parallel_group.h); null otherwise.
  std::shared_ptr<TensorParallelGroup> tp_group;
  // cuda: a step's tensor-core prefill and decode rows run in one grid of the mixed kernel where it
  // applies; false: in separate launches (AttentionPathOverrides::separate_mixed, for comparing the
  // two). Both give the same bits. The reference ignores it.
  bool mixed_grid = true;
  // cuda: requests of a few query tokens (a speculative step's) run one decode row per token on the
  // decode kernels; false: as prefill items (AttentionPathOverrides::short_queries_as_prefill, for
  // comparing the two). The reference ignores it.
  bool short_queries_as_decode_rows = true;
  // cuda: the tile variant of the tensor-core prefill kernel (AttentionPathOverrides::prefill_variant:
  // −1 the default — the Hopper wgmma kernel on a compute capability 9.0 GPU where it applies,
  // else the head size's mma.sync variant —, 3 the wgmma kernel, …; for comparing them). The
  // reference ignores it.
  int prefill_variant = -1;
  // cuda: the operands of the chunked prefill products of Mamba-2 (the SSD: C·Bᵀ, chunk states,
  // chunk scan) and Gated DeltaNet (the WY form: k̂·k̂ᵀ and q̂·k̂ᵀ, the state pass's W·Mᵀ and state
  // update, the output pass's q̂·h_cᵀ and P·V_new, W, U = T·right-hand sides; its inverse T is float32).
  // kFloat32 (the default): float32 operands in 3xTF32, float32-accurate (the float32 SSM row of the
  // tolerance table). kModel: operands rounded to the model dtype and multiplied once in 16 bits with
  // float32 accumulation, as vLLM's Triton SSD and fla kernels (about a third of the tensor-core
  // work); its results are within the table's 16-bit-operand SSM row (ParityKey::ssm_operand_dtype),
  // not the float32 one. A float32 model keeps float32 operands either way. Other SSM modes, decode
  // updates and the reference ignore it.
  SsmPrefillOperands ssm_prefill_operands = SsmPrefillOperands::kFloat32;
  // cuda: Mamba-2's chunk states and chunk scan and Gated DeltaNet's state pass with 16-bit operands
  // (ssm_prefill_operands model, a 16-bit model) on Hopper's warpgroup MMAs where it applies (a
  // compute capability 9.0 GPU, a build with sm_90a code); false: on mma.sync, the bodies every
  // other GPU runs, everywhere (for testing and comparing the two; both are within the
  // 16-bit-operand SSM row). Other modes, float32 operands and the reference ignore it.
  bool ssm_prefill_wgmma = true;
  // cuda: Mamba-2's chunk states and state passing as one kernel where the 16-bit wgmma chunk scan
  // runs (each block keeps its states' float32 sums in registers along the chunks); false: the two
  // kernels apart, for comparing them (the same bits either way). Other modes and the reference
  // ignore it.
  bool ssm_prefill_fused_state_pass = true;
};

// Backends by name ("reference", later "cuda"). Registration is explicit (see
// register_builtin_backends) rather than through static initialisers, which a static library
// link would silently drop.
class BackendRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Backend>(const BackendSettings&)>;

  static BackendRegistry& instance();

  // "" when the backend's device is present, else why not ("no CUDA device: ..."). Cheap to call.
  using Availability = std::function<std::string()>;

  // Throws Error if `name` is already registered. Without `availability` the backend is always
  // available (a host backend).
  void add(const std::string& name, const std::string& description, Factory factory,
           Availability availability = {});
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;
  std::string description(const std::string& name) const;
  // "" if `name` can run here, else the reason (its device is absent). Throws Error if unknown.
  std::string unavailable_reason(const std::string& name) const;
  // Throws Error listing the registered names if `name` is unknown.
  std::unique_ptr<Backend> create(const std::string& name, const BackendSettings& settings) const;

  // How a backend would run a step — which kernel each row takes, the work split, the workspace —
  // as text, computed by its host-side planner alone: no device is needed and nothing is computed
  // (`hybridtb run --explain`). `metadata` is the step's builder metadata. Optional: a backend
  // without a plan registers none, and explain() then says so.
  using Explainer =
      std::function<std::string(const BackendSettings&, const BatchDescription&, const HybridMetadata&)>;
  // Throws Error if `name` is unknown or already has an explainer.
  void set_explainer(const std::string& name, Explainer explainer);
  bool has_explainer(const std::string& name) const;
  // The backend's plan as text, or one line saying that it has no plan to explain. Throws Error if
  // `name` is unknown, Error/NotSupported from the planner for a step it refuses.
  std::string explain(const std::string& name, const BackendSettings& settings, const BatchDescription& batch,
                      const HybridMetadata& metadata) const;

  // Where the ranks of one tensor-parallel group of `size` ranks run on a backend and how they meet:
  // one group handle per rank (rank order), and what rank r's thread does before it creates its
  // backend (a GPU backend selects the rank's device). Optional: without a placer, a backend's ranks
  // run in one place and meet through a HostThreadGroup (tensor_parallel_run.h).
  struct RankPlacement {
    std::vector<std::shared_ptr<TensorParallelGroup>> groups;
    std::function<void(int64_t rank)> on_rank_thread;
    std::string description;  // where the ranks run, e.g. "NCCL, one rank per GPU: GPUs 0-3"
  };
  using RankPlacer = std::function<RankPlacement(int64_t size)>;
  // Throws Error if `name` is unknown or already has a placer.
  void set_rank_placer(const std::string& name, RankPlacer placer);
  // The backend's placement of `size` ranks; NotSupported naming why not (no placer, or the
  // placer's reason: fewer devices than ranks, no NCCL in this build).
  RankPlacement place_ranks(const std::string& name, int64_t size) const;

 private:
  struct Entry {
    std::string name;
    std::string description;
    Factory factory;
    Availability availability;
    Explainer explainer;
    RankPlacer placer;
  };
  const Entry& entry(const std::string& name) const;
  std::vector<Entry> entries_;
};

// Registers every backend compiled into this build (defined in harness/src/builtin_backends.cpp,
// which is the only place that knows the concrete backends). Idempotent.
void register_builtin_backends();

// register_builtin_backends() followed by BackendRegistry::instance().create(name, settings).
std::unique_ptr<Backend> create_backend(const std::string& name, const BackendSettings& settings);

}  // namespace hybridtb
