// The SSM driver of the reference backend: runs config.ssm_mode over one varlen batch. It does
// everything batch-shaped so that a mode only advances one request over consecutive tokens
// (ssm_mode.h): it views query[:num_actual_tokens] as [T, H] hidden states, validates the step's
// tensors against the mode's specs, and hands the per-request work — splitting the tokens into
// decodes and prefill chunks with the Mamba metadata, picking each request's state slots
// (mamba_cache_mode none/align/all), loading and storing the pools, skipping padding, writing the
// block-boundary states of prefix caching — to the step runner (step_runner.h), which the
// linear-attention layers share; then checks the mode's output shape. Plain loops in float64; the
// rules are those of the vLLM semantics notes §3–§4, restated in reference/ssm/README.md. Checked by
// tests/ssm (every registered mode goes through the same suite).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "step_runner.h"

namespace hybridtb::reference::ssm {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

Shape pool_shape(int64_t num_slots, const Shape& slot_shape) {
  Shape shape{num_slots};
  shape.insert(shape.end(), slot_shape.begin(), slot_shape.end());
  return shape;
}

}  // namespace

// --- public ----------------------------------------------------------------------------------------

int64_t ModeShape::param(const std::string& name) const {
  const auto it = params.find(name);
  HYBRIDTB_CHECK(it != params.end(), "missing /config/ssm ", name, " (a parameter of the layer's ssm_mode)");
  HYBRIDTB_CHECK(it->second > 0, "/config/ssm ", name, " must be > 0, got ", it->second);
  return it->second;
}

ModeShape mode_shape(const AttentionConfig& config) {
  ModeShape shape;
  shape.hidden_size = config.num_heads * config.head_size;
  shape.params = config.ssm_params;
  shape.num_heads = config.num_heads;
  shape.head_size = config.head_size;
  shape.conv_state_layout = engine_rules(config).conv_state_layout;
  shape.gdn_norm_eps = gated_norm_eps(config, "gdn");
  shape.mamba2_norm_eps = gated_norm_eps(config, "mamba2");
  shape.mamba2_rms_norm = config.mamba_rms_norm;
  return shape;
}

TensorSpec conv_state_spec(const ModeShape& shape, int64_t channels, int64_t past, std::string meaning) {
  TensorSpec spec;
  spec.name = "conv_state";
  spec.dtype = DType::kFloat32;
  if (shape.conv_state_layout == ConvStateLayout::kSD) {
    spec.shape = {past, channels};
    spec.transposed = true;
    spec.meaning = std::move(meaning) + "; stored [K-1, channels] (the engine's SD layout)";
  } else {
    spec.shape = {channels, past};
    spec.meaning = std::move(meaning) + "; stored [channels, K-1] (DS)";
  }
  return spec;
}

void check_step_tensors(const ModeShape& shape, const std::vector<std::string>& parameters,
                        const std::vector<TensorSpec>& weight_specs, const std::vector<TensorSpec>& state_specs,
                        const std::map<std::string, TensorView>& ssm_state,
                        const std::map<std::string, TensorView>& weights, const std::string& by) {
  for (const std::string& name : parameters) shape.param(name);
  for (const auto& [name, value] : shape.params) {
    bool known = false;
    for (const std::string& p : parameters) known = known || p == name;
    HYBRIDTB_CHECK(known, "/config/ssm ", name, " = ", value, " is not a parameter of ", by,
                   " (its parameters: ", join(parameters), ")");
  }

  std::vector<std::string> weight_names;
  for (const TensorSpec& spec : weight_specs) {
    weight_names.push_back(spec.name);
    const auto it = weights.find(spec.name);
    if (it == weights.end() || it->second.empty()) {
      HYBRIDTB_CHECK(spec.optional, "missing weight /weights/", spec.name, " (required by ", by, ": ",
                     shape_to_string(spec.shape), ", ", spec.meaning, ")");
      continue;
    }
    const TensorView& view = it->second;
    HYBRIDTB_CHECK(is_floating(view.dtype()), "/weights/", spec.name, ": dtype ", to_string(view.dtype()),
                   " is not a floating type");
    HYBRIDTB_CHECK(view.shape() == spec.shape, "/weights/", spec.name, ": shape ", shape_to_string(view.shape()),
                   " does not match ", shape_to_string(spec.shape), " (", by, ": ", spec.meaning, ")");
  }
  for (const auto& [name, view] : weights) {
    bool known = false;
    for (const std::string& w : weight_names) known = known || w == name;
    HYBRIDTB_CHECK(known, "/weights/", name, " is not a weight of ", by, " (its weights: ", join(weight_names), ")");
  }

  std::vector<std::string> pool_names;
  std::optional<std::pair<std::string, int64_t>> first_pool;  // (name, num_slots)
  for (const TensorSpec& spec : state_specs) {
    pool_names.push_back(spec.name);
    const auto it = ssm_state.find(spec.name);
    if (it == ssm_state.end() || it->second.empty()) {
      HYBRIDTB_CHECK(spec.optional, "missing state pool /inputs/ssm/", spec.name, " (required by ", by,
                     ": [num_slots, ", shape_to_string(spec.shape).substr(1), ", ", spec.meaning, ")");
      continue;
    }
    const TensorView& view = it->second;
    HYBRIDTB_CHECK(is_floating(view.dtype()), "/inputs/ssm/", spec.name, ": dtype ", to_string(view.dtype()),
                   " is not a floating type");
    const int64_t num_slots = view.rank() >= 1 ? view.size(0) : -1;
    HYBRIDTB_CHECK(
        view.rank() == static_cast<int>(spec.shape.size()) + 1 && view.shape() == pool_shape(num_slots, spec.shape),
        "/inputs/ssm/", spec.name, ": shape ", shape_to_string(view.shape()), " does not match [num_slots, ",
        shape_to_string(spec.shape).substr(1), " (", by, ": ", spec.meaning, ")");
    HYBRIDTB_CHECK(num_slots >= 1, "/inputs/ssm/", spec.name, " has no slots");
    if (!first_pool) {
      first_pool.emplace(spec.name, num_slots);
    } else {
      HYBRIDTB_CHECK(num_slots == first_pool->second, "/inputs/ssm/", spec.name, " has ", num_slots,
                     " slots but /inputs/ssm/", first_pool->first, " has ", first_pool->second,
                     " (all state pools of a layer are indexed by the same slots)");
    }
  }
  for (const auto& [name, view] : ssm_state) {
    bool known = false;
    for (const std::string& p : pool_names) known = known || p == name;
    HYBRIDTB_CHECK(known, "/inputs/ssm/", name, " is not a state pool of ", by, " (its pools: ", join(pool_names), ")");
  }
}

void validate_ssm_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                          const std::map<std::string, TensorView>& weights) {
  const Mode& mode = ModeRegistry::instance().find(config.ssm_mode);
  const ModeShape shape = mode_shape(config);
  check_step_tensors(shape, mode.parameters(), mode.weight_specs(shape), mode.state_specs(shape), ssm_state, weights,
                     "ssm_mode " + mode.name());
}

void ssm_forward(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                 const StepTensors& tensors, const TensorView& contribution) {
  const Mode& mode = ModeRegistry::instance().find(config.ssm_mode);
  validate_ssm_tensors(config, tensors.ssm_state, tensors.weights);
  const ModeShape shape = mode_shape(config);
  const TensorView& query = tensors.query;
  HYBRIDTB_CHECK(query.device() == Device::kHost && contribution.device() == Device::kHost,
                 "the reference SSM driver needs host tensors, got query ", query.describe(), " and contribution ",
                 contribution.describe());
  HYBRIDTB_CHECK(query.rank() == 3 && query.size(1) == config.num_heads && query.size(2) == config.head_size,
                 "/inputs/query must be [T, num_heads, head_size], got ", query.describe());
  HYBRIDTB_CHECK(contribution.shape() == query.shape() && is_floating(contribution.dtype()),
                 "the SSM contribution buffer ", contribution.describe(),
                 " must be a float tensor of the query's shape ", shape_to_string(query.shape()));
  const int64_t num_tokens = batch.num_actual_tokens;
  HYBRIDTB_CHECK(0 <= num_tokens && num_tokens <= query.size(0), "/batch/num_actual_tokens = ", num_tokens,
                 " does not fit the query's ", query.size(0), " rows");

  const Matrix hidden = load_token_rows(query, num_tokens);  // [num_actual_tokens, H]
  Matrix out = Matrix::Zero(num_tokens, shape.hidden_size);

  if (!mode.forward_whole_step(metadata, hidden, out)) {
    const Weights weights = load_weights(mode.weight_specs(shape), tensors.weights);
    const std::vector<Pool> pools = collect_pools(mode.state_specs(shape), tensors.ssm_state);
    // One piece: mode.advance over its hidden rows, with the seed's shape check on what it returns.
    const AdvanceRows advance = [&](State& state, int64_t begin, int64_t end, bool decode) {
      const Matrix x = hidden.middleRows(begin, end - begin);
      Matrix y = Matrix::Zero(x.rows(), x.cols());
      mode.advance(shape, weights, state, x, y, decode);
      HYBRIDTB_CHECK(y.rows() == x.rows() && y.cols() == x.cols(), "ssm_mode ", mode.name(),
                     " returned a contribution of shape [", y.rows(), ", ", y.cols(), "] for [", x.rows(), ", ",
                     x.cols(), "] hidden states");
      out.middleRows(begin, end - begin) = y;
    };
    run_requests(config, metadata, batch, pools, num_tokens, "ssm_mode " + mode.name(), advance);
  }

  HYBRIDTB_CHECK(out.rows() == num_tokens && out.cols() == shape.hidden_size, "ssm_mode ", mode.name(),
                 " returned a contribution of shape [", out.rows(), ", ", out.cols(), "] for [", num_tokens, ", ",
                 shape.hidden_size, "] hidden states");
  store_token_rows(contribution, out);
}

}  // namespace hybridtb::reference::ssm
