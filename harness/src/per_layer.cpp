// PerLayerBackend (the composite backend of a per-layer hybrid model) and run_per_layer_step
// (per_layer.h). The one place that routes a layer's calls by its kind.
#include "hybridtb/per_layer.h"

#include <utility>

#include "hybridtb/error.h"
#include "hybridtb/step.h"

namespace hybridtb {

namespace {

// The fields of two batch descriptions that differ, named as in the schema ("" if none).
std::string first_batch_difference(const BatchDescription& a, const BatchDescription& b) {
  if (a.query_start_loc != b.query_start_loc) return "/batch/query_start_loc";
  if (a.seq_lens != b.seq_lens) return "/batch/seq_lens";
  if (a.block_table != b.block_table) return "/batch/block_table";
  if (a.slot_mapping != b.slot_mapping) return "/batch/slot_mapping";
  if (a.num_actual_tokens != b.num_actual_tokens) return "/batch num_actual_tokens";
  if (a.mm_prefix_range != b.mm_prefix_range) return "/batch/mm_prefix_range";
  if (a.ssm_block_table != b.ssm_block_table) return "/batch/ssm_block_table";
  if (a.num_accepted_tokens != b.num_accepted_tokens) return "/batch/num_accepted_tokens";
  return "";
}

}  // namespace

PerLayerBackend::PerLayerBackend(std::unique_ptr<Backend> attention, std::unique_ptr<Backend> linear,
                                 PerLayerSettings settings)
    : attention_(std::move(attention)), linear_(std::move(linear)), settings_(std::move(settings)) {
  HYBRIDTB_CHECK(attention_ != nullptr && linear_ != nullptr, "PerLayerBackend needs both backends");
  const AttentionConfig& a = settings_.attention.attention;
  const AttentionConfig& l = settings_.linear.attention;
  HYBRIDTB_CHECK(!a.is_linear_layer(), "PerLayerBackend: the attention layers' config has layer_kind ",
                 to_string(a.layer_kind), "; it must be full_attention");
  HYBRIDTB_CHECK(l.is_linear_layer(), "PerLayerBackend: the linear layers' config has layer_kind ",
                 to_string(l.layer_kind), "; it must be gdn or mamba2");
  HYBRIDTB_CHECK(settings_.attention.builder == settings_.linear.builder,
                 "PerLayerBackend: the two layer configurations have different builder settings (cudagraph_mode, "
                 "capture sizes, max_num_seqs); one step's metadata is built once for all layers");
  HYBRIDTB_CHECK(attention_->device() == linear_->device() && attention_->output_dtype() == linear_->output_dtype(),
                 "PerLayerBackend: backends '", attention_->name(), "' and '", linear_->name(),
                 "' differ in device or output dtype; the layers of one model share both");
}

const AttentionConfig& PerLayerBackend::layer_config(LayerKind kind) const {
  return kind == LayerKind::kFullAttention ? settings_.attention.attention : settings_.linear.attention;
}

std::string PerLayerBackend::name() const {
  return attention_->name() == linear_->name() ? attention_->name()
                                               : attention_->name() + "+" + linear_->name();
}

void PerLayerBackend::synchronize() {
  attention_->synchronize();
  linear_->synchronize();
}

HybridMetadata PerLayerBackend::build_metadata(const BatchDescription& batch) {
  HybridMetadata metadata;
  metadata.attention = attention_->build_metadata(batch).attention;
  metadata.mamba = linear_->build_metadata(batch).mamba;
  return metadata;
}

// --- routing ---------------------------------------------------------------------------------------

void PerLayerBackend::write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) {
  attention_->write_kv_cache(batch, tensors);
}

void PerLayerBackend::attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                        const StepTensors& tensors, const TensorView& output) {
  attention_->attention_forward(metadata, batch, tensors, output);
}

void PerLayerBackend::ssm_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                  const StepTensors& tensors, const TensorView& contribution) {
  attention_->ssm_forward(metadata, batch, tensors, contribution);  // the parallel branch of an attention layer
}

void PerLayerBackend::hybrid_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                     const StepTensors& tensors, const HybridOutputs& outputs) {
  attention_->hybrid_forward(metadata, batch, tensors, outputs);
}

void PerLayerBackend::linear_attention_forward(const HybridMetadata& metadata, const BatchDescription& batch,
                                               const StepTensors& tensors, const TensorView& output) {
  linear_->linear_attention_forward(metadata, batch, tensors, output);
}

std::unique_ptr<StepGraph> PerLayerBackend::capture_decode_step(const HybridMetadata& metadata,
                                                                const BatchDescription& batch,
                                                                const StepTensors& tensors,
                                                                const HybridOutputs& outputs) {
  return attention_->capture_decode_step(metadata, batch, tensors, outputs);  // one attention layer's step
}

// --- CUDA-graph lifecycle: both backends, attention first ------------------------------------------

void PerLayerBackend::init_graph_state(int64_t max_num_reqs, int64_t max_num_tokens) {
  attention_->init_graph_state(max_num_reqs, max_num_tokens);
  linear_->init_graph_state(max_num_reqs, max_num_tokens);
}

void PerLayerBackend::init_capture_metadata(const HybridMetadata& metadata, const BatchDescription& batch) {
  attention_->init_capture_metadata(metadata, batch);
  linear_->init_capture_metadata(metadata, batch);
}

void PerLayerBackend::init_replay_metadata(const HybridMetadata& metadata, const BatchDescription& batch) {
  attention_->init_replay_metadata(metadata, batch);
  linear_->init_replay_metadata(metadata, batch);
}

// --- the step driver ---------------------------------------------------------------------------------

std::vector<StepOutputs> run_per_layer_step(PerLayerBackend& backend, const std::vector<const BatchFile*>& layers) {
  HYBRIDTB_CHECK(!layers.empty(), "run_per_layer_step: no layers");
  const BatchFile& first = *layers.front();
  for (size_t i = 0; i < layers.size(); ++i) {
    const BatchFile& layer = *layers[i];
    const std::string difference = first_batch_difference(first.batch, layer.batch);
    HYBRIDTB_CHECK(difference.empty(), "run_per_layer_step: layer ", i, " has another ", difference,
                   " than layer 0; the layers of one step share the batch");
    HYBRIDTB_CHECK(layer.builder == backend.settings().attention.builder, "run_per_layer_step: layer ", i,
                   " has other builder settings than the backend's (cudagraph_mode, capture sizes, max_num_seqs)");
    HYBRIDTB_CHECK(layer.config == backend.layer_config(layer.config.layer_kind), "run_per_layer_step: layer ", i,
                   " (layer_kind ", to_string(layer.config.layer_kind), ", ssm_mode ", layer.config.ssm_mode,
                   ") has another /config than the backend's ", to_string(layer.config.layer_kind),
                   " layers; create the backend for the model's layer configurations");
  }
  const HybridMetadata metadata = backend.build_metadata(first.batch);  // once per step, for every layer
  std::vector<StepOutputs> outputs;
  outputs.reserve(layers.size());
  for (const BatchFile* layer : layers) outputs.push_back(run_layer_step(backend, *layer, metadata));
  return outputs;
}

}  // namespace hybridtb
