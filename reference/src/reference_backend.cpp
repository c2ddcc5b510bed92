// ReferenceBackend: wires the shared builders (hybridtb/spec), the reference attention, the SSM
// branch and the linear-attention layers into the Backend interface. Host memory only; writes
// float64 outputs (ground truth is never rounded).
#include "hybridtb/reference/reference_backend.h"

#include <cstring>
#include <optional>
#include <utility>

#include "hybridtb/error.h"
#include "hybridtb/reference/linear_layer.h"
#include "hybridtb/reference/paged_attention.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/spec/metadata_builders.h"

namespace hybridtb::reference {

namespace {

// An fp8 query (schema 1.3) as the real query: stored · q_scale in float64, exactly (an fp8 value
// and a float32 scale have at most 24 significant bits together, far inside float64). vLLM 0.33's
// kernel folds q_descale into the score scale (scale · q_scale · k_scale), the same product. The
// SSM branch, which views the query rows as hidden states, sees the real query too. `storage` keeps
// the float64 copy alive; without q_scale the tensors are returned unchanged.
StepTensors with_real_query(const StepTensors& tensors, Tensor& storage) {
  if (!tensors.q_scale) return tensors;
  const TensorView& q = tensors.query;
  HYBRIDTB_CHECK(q.device() == Device::kHost && q.rank() == 3 && is_fp8(q.dtype()),
                 "/inputs/q_scale is set, but the query is not a host fp8 tensor [T, Hq, D]: ", q.describe());
  storage = Tensor::host(DType::kFloat64, q.shape());
  const double scale = static_cast<double>(*tensors.q_scale);
  auto* out = storage.data_as<double>();
  int64_t i = 0;
  for (int64_t t = 0; t < q.size(0); ++t) {
    for (int64_t h = 0; h < q.size(1); ++h) {
      for (int64_t d = 0; d < q.size(2); ++d) out[i++] = load_as_double(q.data(), q.dtype(), q.offset({t, h, d})) * scale;
    }
  }
  StepTensors real = tensors;
  real.query = storage.view();
  real.q_scale.reset();
  return real;
}

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(const BackendSettings& settings) : settings_(settings) {
    validate(settings_.attention);
    validate(settings_.builder);
  }

  std::string name() const override { return "reference"; }
  Device device() const override { return Device::kHost; }
  DType output_dtype() const override { return DType::kFloat64; }

  Tensor allocate(DType dtype, const Shape& shape) override { return Tensor::host(dtype, shape); }

  void copy(const TensorView& dst, const TensorView& src) override {
    HYBRIDTB_CHECK(dst.device() == Device::kHost && src.device() == Device::kHost,
                   "reference backend: copies are host to host, got ", src.describe(), " → ", dst.describe());
    HYBRIDTB_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() &&
                       src.is_contiguous(),
                   "reference backend: copy needs equal contiguous views, got ", src.describe(), " → ",
                   dst.describe());
    if (src.nbytes() > 0) std::memmove(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
  }

  void synchronize() override {}

  HybridMetadata build_metadata(const BatchDescription& batch) override {
    return spec::build_hybrid_metadata(settings_.attention, settings_.builder, batch);
  }

  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override {
    require_attention_layer("write_kv_cache");
    reference::write_kv_cache(settings_.attention, batch, tensors);
  }

  void attention_forward(const HybridMetadata& /*metadata: the reference computes the same output on
                                                  the 2D and 3D paths, so it needs no plan*/,
                         const BatchDescription& batch, const StepTensors& tensors,
                         const TensorView& output) override {
    require_attention_layer("attention_forward");
    Tensor real_query;
    paged_attention(settings_.attention, batch, with_real_query(tensors, real_query), output);
  }

  void ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                   const TensorView& contribution) override {
    const AttentionConfig& config = settings_.attention;
    HYBRIDTB_CHECK(config.has_ssm_branch(), "ssm_forward called for a layer without an SSM branch (ssm_mode none)");
    HYBRIDTB_CHECK(metadata.mamba.has_value(), "ssm_mode ", config.ssm_mode,
                   " needs the Mamba metadata, which encoder-only layers do not have");
    Tensor real_query;
    ssm::ssm_forward(config, *metadata.mamba, batch, with_real_query(tensors, real_query), contribution,
                     settings_.tp_group.get());
  }

  // HybridAttentionImpl.forward (seed 000), in its order: attention first, then the SSM
  // contribution of query[:num_actual_tokens], shape-checked, added into output[:num_actual_tokens].
  // KNOWINGLY DIFFERS from the seed: an SSM failure is an error here (a testbed must fail loudly);
  // the seed logged it and returned the attention output alone.
  void hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch, const StepTensors& tensors,
                      const HybridOutputs& outputs) override {
    require_attention_layer("hybrid_forward");
    attention_forward(metadata, batch, tensors, outputs.attn_output);
    const int64_t rows = batch.num_actual_tokens;
    const int64_t row_size = settings_.attention.num_heads * settings_.attention.head_size;
    copy(outputs.output.slice_rows(0, rows), outputs.attn_output.slice_rows(0, rows));
    if (!settings_.attention.has_ssm_branch()) return;
    HYBRIDTB_CHECK(outputs.ssm_output.shape() == tensors.query.shape(), "the SSM contribution buffer ",
                   outputs.ssm_output.describe(), " must have the query's shape ", tensors.query.describe());
    // The branch reports its start and its end (a stage of its own after the attention's tokens).
    if (tensors.progress != nullptr) tensors.progress->report("ssm branch", 0, rows, 0.0);
    ssm_forward(metadata, batch, tensors, outputs.ssm_output);
    if (tensors.progress != nullptr) tensors.progress->report("ssm branch", rows, rows, 1.0);
    for (int64_t i = 0; i < rows * row_size; ++i) {
      const double sum = load_as_double(outputs.output.data(), outputs.output.dtype(), i) +
                         load_as_double(outputs.ssm_output.data(), outputs.ssm_output.dtype(), i);
      store_from_double(outputs.output.data(), outputs.output.dtype(), i, sum);
    }
  }

  // pymllm's forward_gdn: the mode's core on the layer's own inputs (reference/ssm/linear_layer.cpp).
  void linear_attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                const StepTensors& tensors, const TensorView& output) override {
    const AttentionConfig& config = settings_.attention;
    HYBRIDTB_CHECK(config.is_linear_layer(), "linear_attention_forward called for a full_attention layer (ssm_mode ",
                   config.ssm_mode, "): run it with hybrid_forward");
    HYBRIDTB_CHECK(metadata.mamba.has_value(), "layer_kind ", to_string(config.layer_kind),
                   " needs the Mamba metadata (its state slots)");
    const int64_t rows = batch.num_actual_tokens;
    if (tensors.progress != nullptr) tensors.progress->report("linear layer", 0, rows, 0.0);
    ssm::linear_attention_forward(config, *metadata.mamba, batch, tensors, output);
    if (tensors.progress != nullptr) tensors.progress->report("linear layer", rows, rows, 1.0);
  }

  // The CUDA-graph lifecycle (backend.h). The reference has no graphs: its run calls stay eager.
  // The hooks check what a graph would need — a padded decode batch within the state's capacity,
  // replayed with the captured padded shape — so a graph runner written against the interface runs
  // here too and fails where a GPU backend would, with the same message.
  void init_graph_state(int64_t max_num_reqs, int64_t max_num_tokens) override {
    HYBRIDTB_CHECK(max_num_reqs > 0 && max_num_tokens > 0, "init_graph_state: max_num_reqs (", max_num_reqs,
                   ") and max_num_tokens (", max_num_tokens, ") must be > 0");
    graph_ = GraphState{max_num_reqs, max_num_tokens, std::nullopt};
  }

  void init_capture_metadata(const HybridMetadata& /*metadata*/, const BatchDescription& batch) override {
    HYBRIDTB_CHECK(graph_.has_value(), "init_capture_metadata before init_graph_state");
    check_graph_batch(batch, "capture");
    graph_->captured = std::pair{batch.num_reqs(), batch.num_tokens()};
  }

  void init_replay_metadata(const HybridMetadata& /*metadata*/, const BatchDescription& batch) override {
    HYBRIDTB_CHECK(graph_.has_value() && graph_->captured.has_value(), "init_replay_metadata before any capture");
    check_graph_batch(batch, "replay");
    const auto [reqs, tokens] = *graph_->captured;
    HYBRIDTB_CHECK(batch.num_reqs() == reqs && batch.num_tokens() == tokens, "CUDA-graph replay: the batch has ",
                   batch.num_reqs(), " requests and ", batch.num_tokens(), " token rows, the graph was captured for ",
                   reqs, " and ", tokens, " (pad it to that shape)");
  }

 private:
  // What init_graph_state allocated (capacities) and what was captured (padded requests, rows).
  struct GraphState {
    int64_t max_num_reqs = 0;
    int64_t max_num_tokens = 0;
    std::optional<std::pair<int64_t, int64_t>> captured;
  };

  // A linear-attention layer has no query, key, value or KV cache: its calls are refused by name.
  void require_attention_layer(const char* call) const {
    HYBRIDTB_CHECK(!settings_.attention.is_linear_layer(), call, " called for a layer_kind ",
                   to_string(settings_.attention.layer_kind),
                   " layer, which has no attention: run it with linear_attention_forward");
  }

  void check_graph_batch(const BatchDescription& batch, const char* what) const {
    HYBRIDTB_CHECK(batch.num_reqs() <= graph_->max_num_reqs && batch.num_tokens() <= graph_->max_num_tokens,
                   "CUDA-graph ", what, ": the batch has ", batch.num_reqs(), " requests and ", batch.num_tokens(),
                   " token rows, more than init_graph_state's ", graph_->max_num_reqs, " and ", graph_->max_num_tokens);
    for (int64_t r = 0; r < batch.num_reqs(); ++r) {
      HYBRIDTB_CHECK(batch.query_len(r) <= 1, "CUDA-graph ", what, ": request ", r, " has query_len ",
                     batch.query_len(r), "; a graph holds a decode step (one token per request, padding requests 0)");
    }
  }

  BackendSettings settings_;
  std::optional<GraphState> graph_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const BackendSettings& settings) {
  return std::make_unique<ReferenceBackend>(settings);
}

}  // namespace hybridtb::reference
