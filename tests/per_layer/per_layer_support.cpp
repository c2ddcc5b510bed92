// Helpers for the per-layer tests (per_layer_support.h).
#include "per_layer_support.h"

#include <algorithm>
#include <cmath>

#include "gdn_core.h"
#include "hybridtb/backend.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/reference/linear_layer.h"
#include "hybridtb/step.h"
#include "mamba2_core.h"

namespace hybridtb::testing {

AttentionConfig attention_layer(MambaCacheMode cache_mode, int64_t mamba_block_size) {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(32.0);
  c.dtype = DType::kFloat32;
  c.mamba_cache_mode = cache_mode;
  c.mamba_block_size = mamba_block_size;
  return c;
}

AttentionConfig linear_layer(LayerKind kind, MambaCacheMode cache_mode, int64_t mamba_block_size) {
  AttentionConfig c = attention_layer(cache_mode, mamba_block_size);
  c.layer_kind = kind;
  c.ssm_mode = std::string(to_string(kind));
  if (kind == LayerKind::kGdn) {
    c.ssm_params = {{"num_k_heads", 2}, {"num_v_heads", 4}, {"head_k_dim", 16}, {"head_v_dim", 8}, {"conv_kernel", 4}};
  } else {
    c.ssm_params = {{"num_ssm_heads", 4}, {"head_dim", 8}, {"state_size", 8}, {"n_groups", 2}, {"conv_kernel", 4}};
  }
  return c;
}

std::string kind_name(LayerKind kind) { return std::string(to_string(kind)); }

BatchFile layer_file(const AttentionConfig& config, const std::vector<RequestSpec>& requests, SyntheticOptions options,
                     uint64_t tensor_seed) {
  return layer_file(config, BuilderConfig{}, requests, options, 0, tensor_seed);
}

BatchFile layer_file(const AttentionConfig& config, const BuilderConfig& builder, const std::vector<RequestSpec>& requests,
                     SyntheticOptions options, int64_t num_slots, uint64_t tensor_seed) {
  options.ssm_block_table = true;
  BatchFile file = make_synthetic_batch(config, builder, requests, options);
  if (config.is_linear_layer() || config.has_ssm_branch()) {
    const int64_t slots = num_slots > 0 ? num_slots : ssm_slots_needed(file.batch);
    auto tensors = reference::ssm::make_random_ssm_tensors(config, slots, tensor_seed);
    file.inputs.ssm_state = std::move(tensors.ssm_state);
    file.inputs.weights = std::move(tensors.weights);
  }
  return file;
}

BatchFile request_step(const AttentionConfig& config, int64_t context_len, const std::map<std::string, Matrix>& rows,
                       int32_t slot, const NamedTensors& pools, const NamedTensors& weights) {
  const int64_t query_len = rows.begin()->second.rows();
  BatchFile file = make_synthetic_batch(config, {}, {{.context_len = context_len, .query_len = query_len}},
                                        {.seed = 5, .ssm_block_table = true});
  for (const auto& [name, values] : rows) {
    Tensor& input = file.inputs.linear_inputs.at(name);
    for (int64_t i = 0; i < values.size(); ++i) {
      store_from_double(input.data(), input.dtype(), i, values(i / values.cols(), i % values.cols()));
    }
  }
  file.batch.ssm_block_table = IntArray::matrix(1, file.batch.ssm_block_table->size(1), slot);
  file.inputs.ssm_state = clone_all(pools);
  file.inputs.weights = clone_all(weights);
  return file;
}

Matrix rows_of(const Tensor& tokens, int64_t begin, int64_t end) {
  const int64_t width = tokens.numel() / tokens.size(0);
  Matrix rows(end - begin, width);
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t j = 0; j < width; ++j) rows(t - begin, j) = load_as_double(tokens.data(), tokens.dtype(), t * width + j);
  }
  return rows;
}

std::map<std::string, Matrix> input_rows(const BatchFile& file, int64_t begin, int64_t end) {
  std::map<std::string, Matrix> rows;
  for (const auto& [name, input] : file.inputs.linear_inputs) rows[name] = rows_of(input, begin, end);
  return rows;
}

Matrix run_core(const AttentionConfig& config, const reference::ssm::Weights& weights, reference::ssm::State& state,
                const std::map<std::string, Matrix>& rows, bool decode) {
  const auto param = [&](const char* name) { return config.ssm_params.at(name); };
  if (config.layer_kind == LayerKind::kGdn) {
    const reference::ssm::GdnSizes sizes{.num_k_heads = param("num_k_heads"),
                                         .num_v_heads = param("num_v_heads"),
                                         .head_k_dim = param("head_k_dim"),
                                         .head_v_dim = param("head_v_dim"),
                                         .conv_kernel = param("conv_kernel")};
    return reference::ssm::gdn_core(sizes, weights, state, rows.at("mixed_qkv"), rows.at("a"), rows.at("b"), decode);
  }
  reference::ssm::Mamba2Sizes sizes;
  sizes.heads = param("num_ssm_heads");
  sizes.head_dim = param("head_dim");
  sizes.state = param("state_size");
  sizes.groups = param("n_groups");
  sizes.kernel = param("conv_kernel");
  return reference::ssm::mamba2_core(sizes, reference::ssm::mamba2_core_weights(weights, sizes), rows.at("xBC"),
                                     rows.at("dt"), state.at("conv_state"), state.at("ssm_state"), decode);
}

reference::ssm::State load_slot(const NamedTensors& pools, int64_t slot) {
  reference::ssm::State state;
  for (const auto& [name, pool] : pools) {
    const int64_t size = pool.numel() / pool.size(0);
    Eigen::VectorXd values(size);
    for (int64_t i = 0; i < size; ++i) values[i] = load_as_double(pool.data(), pool.dtype(), slot * size + i);
    state[name] = values;
  }
  return state;
}

void store_slot(NamedTensors& pools, int64_t slot, const reference::ssm::State& state) {
  for (auto& [name, pool] : pools) {
    const Eigen::VectorXd& values = state.at(name);
    for (int64_t i = 0; i < values.size(); ++i) {
      store_from_double(pool.data(), pool.dtype(), slot * values.size() + i, values[i]);
    }
  }
}

NamedTensors clone_all(const NamedTensors& tensors) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) out[name] = clone_host(tensor);
  return out;
}

StepOutputs run_on_reference(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

Tolerance linear_tolerance(const AttentionConfig& config, int64_t tokens) {
  int64_t m = 1;
  for (const LinearInput& input : linear_layer_spec(config).inputs) m = std::max(m, input.width);
  const reference::ssm::LinearLayerTensorSpecs specs = reference::ssm::linear_layer_tensor_specs(config);
  for (const auto& list : {specs.state, specs.weights}) {
    for (const reference::ssm::TensorSpec& spec : list) {
      for (int64_t dim : spec.shape) m = std::max(m, dim);
    }
  }
  return tolerance_for(ToleranceCase::kSsmModeFloat64, tokens, m);
}

}  // namespace hybridtb::testing
