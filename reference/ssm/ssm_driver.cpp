// The SSM driver of the reference backend: runs config.ssm_mode over one varlen batch. It does
// everything batch-shaped so that a mode only advances one request over consecutive tokens
// (ssm_mode.h): it views query[:num_actual_tokens] as [T, H] hidden states, splits the tokens into
// decodes and prefill chunks with the Mamba metadata, picks each request's state slots
// (mamba_cache_mode none/align/all), loads and stores the state pools, skips padding, writes the
// block-boundary states of prefix caching, and checks the mode's output shape. Plain loops in
// float64; the rules are those of the vLLM semantics notes §3–§4, restated in reference/ssm/README.md.
// Checked by tests/ssm (every registered mode goes through the same suite).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/reference/ssm_plan.h"

namespace hybridtb::reference::ssm {
namespace {

// --- tensor access ---------------------------------------------------------------------------------

// Offsets (in elements from view.data()) of every element of `view`, in row-major order.
std::vector<int64_t> row_major_offsets(const TensorView& view) {
  const int rank = view.rank();
  int64_t numel = 1;
  for (int d = 0; d < rank; ++d) numel *= view.size(d);
  std::vector<int64_t> offsets;
  offsets.reserve(static_cast<size_t>(numel));
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  for (int64_t i = 0; i < numel; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[static_cast<size_t>(d)] * view.stride(d);
    offsets.push_back(offset);
    for (int d = rank - 1; d >= 0; --d) {  // odometer increment, last dimension fastest
      if (++index[static_cast<size_t>(d)] < view.size(d)) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
  return offsets;
}

int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// All elements of `view` as doubles, exactly, in row-major order.
Eigen::VectorXd load_flat(const TensorView& view) {
  const std::vector<int64_t> offsets = row_major_offsets(view);
  Eigen::VectorXd values(static_cast<Eigen::Index>(offsets.size()));
  for (size_t i = 0; i < offsets.size(); ++i) {
    values[static_cast<Eigen::Index>(i)] = load_as_double(view.data(), view.dtype(), offsets[i]);
  }
  return values;
}

// Stores `values` (row-major) into `view`, rounding to its dtype as a GPU store does.
void store_flat(const TensorView& view, const Eigen::VectorXd& values) {
  const std::vector<int64_t> offsets = row_major_offsets(view);
  for (size_t i = 0; i < offsets.size(); ++i) {
    store_from_double(view.data(), view.dtype(), offsets[i], values[static_cast<Eigen::Index>(i)]);
  }
}

// A weight as a float64 matrix: 1-d [n] → [1, n]; k-d → [size(0), product of the rest].
Matrix load_weight(const TensorView& weight) {
  const Eigen::VectorXd flat = load_flat(weight);
  const int64_t rows = weight.rank() >= 2 ? weight.size(0) : 1;
  const int64_t cols = rows == 0 ? 0 : static_cast<int64_t>(flat.size()) / rows;
  Matrix out(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) out(i / cols, i % cols) = flat[i];
  return out;
}

// Rows [0, rows) of a [T, Hq, D] token tensor as a [rows, Hq·D] matrix (row t = token t, head-major).
Matrix load_token_rows(const TensorView& tokens, int64_t rows) {
  const Shape shape = tokens.shape();
  const int64_t width = product(Shape(shape.begin() + 1, shape.end()));  // Hq·D
  const Eigen::VectorXd flat = load_flat(tokens.slice_rows(0, rows));
  Matrix out(rows, width);
  for (int64_t i = 0; i < rows * width; ++i) out(i / width, i % width) = flat[i];
  return out;
}

void store_token_rows(const TensorView& tokens, const Matrix& rows) {
  Eigen::VectorXd flat(rows.size());
  for (int64_t i = 0; i < rows.size(); ++i) flat[i] = rows(i / rows.cols(), i % rows.cols());
  store_flat(tokens.slice_rows(0, rows.rows()), flat);
}

Shape pool_shape(int64_t num_slots, const Shape& slot_shape) {
  Shape shape{num_slots};
  shape.insert(shape.end(), slot_shape.begin(), slot_shape.end());
  return shape;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

// --- running one request -------------------------------------------------------------------------

struct Pool {
  std::string name;
  TensorView view;  // [num_slots, slot shape...]
  Eigen::Index slot_size = 0;
};

State load_state(const std::vector<Pool>& pools, const std::optional<Slot>& read) {
  State state;
  for (const Pool& pool : pools) {
    state[pool.name] =
        read ? load_flat(pool.view.slice_rows(read->index, read->index + 1)) : Eigen::VectorXd::Zero(pool.slot_size);
  }
  return state;
}

void store_state(const std::vector<Pool>& pools, const State& state, const Mode& mode, const Slot& slot) {
  for (const Pool& pool : pools) {
    const Eigen::VectorXd& values = state.at(pool.name);
    HYBRIDTB_CHECK(values.size() == pool.slot_size, "ssm_mode ", mode.name(), " left state '", pool.name, "' with ",
                   values.size(), " values; its slot holds ", pool.slot_size);
    store_flat(pool.view.slice_rows(slot.index, slot.index + 1), values);
  }
}

// mode.advance over rows [begin, end) of `hidden`, with the seed's shape check on what it returns.
void advance(const Mode& mode, const Weights& weights, State& state, const Matrix& hidden, int64_t begin, int64_t end,
             bool decode, Matrix& contribution) {
  const Matrix x = hidden.middleRows(begin, end - begin);
  Matrix y = Matrix::Zero(x.rows(), x.cols());
  mode.advance(weights, state, x, y, decode);
  HYBRIDTB_CHECK(y.rows() == x.rows() && y.cols() == x.cols(), "ssm_mode ", mode.name(),
                 " returned a contribution of shape [", y.rows(), ", ", y.cols(), "] for [", x.rows(), ", ", x.cols(),
                 "] hidden states");
  contribution.middleRows(begin, end - begin) = y;
}

void run_request(const Mode& mode, const Weights& weights, const std::vector<Pool>& pools, const RequestPlan& plan,
                 const Matrix& hidden, Matrix& contribution) {
  State state = load_state(pools, plan.read);
  if (plan.decode) {
    for (int64_t t = plan.begin; t < plan.end; ++t) advance(mode, weights, state, hidden, t, t + 1, true, contribution);
  } else {
    // Pieces end after each block-boundary token (mode all), then at the chunk's end.
    int64_t begin = plan.begin;
    for (const auto& [position, slot] : plan.boundary_writes) {
      const int64_t end = plan.begin + (position - plan.first_position) + 1;
      advance(mode, weights, state, hidden, begin, end, false, contribution);
      store_state(pools, state, mode, slot);
      begin = end;
    }
    if (begin < plan.end) advance(mode, weights, state, hidden, begin, plan.end, false, contribution);
  }
  store_state(pools, state, mode, plan.final_write);
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
  return shape;
}

void validate_ssm_tensors(const AttentionConfig& config, const std::map<std::string, TensorView>& ssm_state,
                          const std::map<std::string, TensorView>& weights) {
  const Mode& mode = ModeRegistry::instance().find(config.ssm_mode);
  const ModeShape shape = mode_shape(config);
  const std::string by = "ssm_mode " + mode.name();

  const std::vector<std::string> parameters = mode.parameters();
  for (const std::string& name : parameters) shape.param(name);
  for (const auto& [name, value] : config.ssm_params) {
    bool known = false;
    for (const std::string& p : parameters) known = known || p == name;
    HYBRIDTB_CHECK(known, "/config/ssm ", name, " = ", value, " is not a parameter of ", by,
                   " (its parameters: ", join(parameters), ")");
  }

  const std::vector<TensorSpec> weight_specs = mode.weight_specs(shape);
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

  const std::vector<TensorSpec> state_specs = mode.state_specs(shape);
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
    if (config.num_speculative_tokens > 0) {
      throw NotSupported(detail::concat("ssm_mode ", mode.name(), " with /config/num_speculative_tokens ",
                                        config.num_speculative_tokens,
                                        ": speculative decoding with an SSM branch is not modelled yet (a decode "
                                        "would advance several tokens and write per-token states)"));
    }
    HYBRIDTB_CHECK(
        metadata.num_reqs == batch.num_reqs() && metadata.num_decodes + metadata.num_prefills == batch.num_reqs(),
        "the Mamba metadata (", metadata.num_decodes, " decodes + ", metadata.num_prefills, " prefills, num_reqs ",
        metadata.num_reqs, ") does not describe the batch's ", batch.num_reqs(), " requests");
    Weights weights;
    for (const TensorSpec& spec : mode.weight_specs(shape)) {
      const auto it = tensors.weights.find(spec.name);
      if (it != tensors.weights.end() && !it->second.empty()) weights[spec.name] = load_weight(it->second);
    }
    std::vector<Pool> pools;
    for (const TensorSpec& spec : mode.state_specs(shape)) {
      const auto it = tensors.ssm_state.find(spec.name);
      if (it == tensors.ssm_state.end() || it->second.empty()) continue;  // an absent optional pool
      HYBRIDTB_CHECK(it->second.device() == Device::kHost,
                     "the reference SSM driver needs host state pools, got /inputs/ssm/", spec.name, " ",
                     it->second.describe());
      pools.push_back(Pool{spec.name, it->second, static_cast<Eigen::Index>(product(spec.shape))});
    }
    const int64_t num_slots = pools.empty() ? 0 : pools.front().view.size(0);

    // Plan and check every request before touching any state, so a bad batch changes nothing.
    std::vector<RequestPlan> plans;
    for (int64_t r = 0; r < metadata.num_decodes; ++r) {
      if (batch.query_len(r) > 0) plans.push_back(plan_decode(config, metadata, batch, r));
    }
    for (int64_t i = 0; i < metadata.num_prefills; ++i) plans.push_back(plan_prefill(config, metadata, batch, i));
    std::vector<const RequestPlan*> runs;
    for (const RequestPlan& plan : plans) {
      HYBRIDTB_CHECK(0 <= plan.begin && plan.begin <= plan.end && plan.end <= num_tokens, "request ", plan.request,
                     " has token rows [", plan.begin, ", ", plan.end, ") outside the step's ", num_tokens, " tokens");
      bool padding = false;
      for (const Slot* slot : slots_of(plan)) {
        // A stateless mode has no pools to index: only the padding sentinel means anything.
        HYBRIDTB_CHECK(pools.empty() || slot->index < num_slots, slot->field, " = ", slot->index,
                       " is outside the SSM state pools' ", num_slots, " slots");
        padding = padding || slot->index < 0;
      }
      // PAD_SLOT_ID (padding requests, CUDA-graph padding): no state read or write, zero contribution.
      // A request without tokens this step has nothing to advance and leaves its state alone.
      if (!padding && plan.end > plan.begin) runs.push_back(&plan);
    }
    for (const RequestPlan* plan : runs) run_request(mode, weights, pools, *plan, hidden, out);
  }

  HYBRIDTB_CHECK(out.rows() == num_tokens && out.cols() == shape.hidden_size, "ssm_mode ", mode.name(),
                 " returned a contribution of shape [", out.rows(), ", ", out.cols(), "] for [", num_tokens, ", ",
                 shape.hidden_size, "] hidden states");
  store_token_rows(contribution, out);
}

}  // namespace hybridtb::reference::ssm
