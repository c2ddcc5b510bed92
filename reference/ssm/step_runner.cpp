// The batch-shaped half of an SSM step (step_runner.h): tensor access in float64, state slots,
// and the per-request loop over the Mamba metadata's plan. Plain loops; the rules are those of the
// vLLM semantics notes §3–§4, restated in reference/ssm/README.md ("What the driver does for you").
#include "step_runner.h"

#include <optional>

#include "hybridtb/error.h"
#include "hybridtb/spec/ssm_plan.h"

namespace hybridtb::reference::ssm {
namespace {

using spec::ssm::check_plannable_step;
using spec::ssm::plan_decode;
using spec::ssm::plan_prefill;
using spec::ssm::RequestPlan;
using spec::ssm::skips_request;
using spec::ssm::Slot;
using spec::ssm::slots_of;

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

// The slot stored [rows, cols] row-major as the mode's [cols, rows] row-major, and back.
Eigen::VectorXd transpose_flat(const Eigen::VectorXd& values, int64_t rows, int64_t cols) {
  Eigen::VectorXd out(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = values[r * cols + c];
  }
  return out;
}

State load_state(const std::vector<Pool>& pools, const std::optional<Slot>& read) {
  State state;
  for (const Pool& pool : pools) {
    if (!read) {
      state[pool.name] = Eigen::VectorXd::Zero(pool.slot_size);
      continue;
    }
    const Eigen::VectorXd stored = load_flat(pool.view.slice_rows(read->index, read->index + 1));
    state[pool.name] = pool.transposed ? transpose_flat(stored, pool.rows, pool.cols) : stored;
  }
  return state;
}

void store_state(const std::vector<Pool>& pools, const State& state, const std::string& who, const Slot& slot) {
  for (const Pool& pool : pools) {
    const Eigen::VectorXd& values = state.at(pool.name);
    HYBRIDTB_CHECK(values.size() == pool.slot_size, who, " left state '", pool.name, "' with ", values.size(),
                   " values; its slot holds ", pool.slot_size);
    // The mode's [cols, rows] back to the stored [rows, cols].
    store_flat(pool.view.slice_rows(slot.index, slot.index + 1),
               pool.transposed ? transpose_flat(values, pool.cols, pool.rows) : values);
  }
}

void run_request(const std::vector<Pool>& pools, const RequestPlan& plan, const std::string& who,
                 const AdvanceRows& advance) {
  State state = load_state(pools, plan.read);
  if (plan.decode) {
    for (int64_t t = plan.begin; t < plan.end; ++t) advance(state, t, t + 1, true);
  } else {
    // Pieces end after each block-boundary token (mode all), then at the chunk's end.
    int64_t begin = plan.begin;
    for (const auto& [position, slot] : plan.boundary_writes) {
      const int64_t end = plan.begin + (position - plan.first_position) + 1;
      advance(state, begin, end, false);
      store_state(pools, state, who, slot);
      begin = end;
    }
    if (begin < plan.end) advance(state, begin, plan.end, false);
  }
  store_state(pools, state, who, plan.final_write);
}

}  // namespace

std::vector<Pool> collect_pools(const std::vector<TensorSpec>& specs, const std::map<std::string, TensorView>& ssm_state) {
  std::vector<Pool> pools;
  for (const TensorSpec& spec : specs) {
    const auto it = ssm_state.find(spec.name);
    if (it == ssm_state.end() || it->second.empty()) continue;  // an absent optional pool
    HYBRIDTB_CHECK(it->second.device() == Device::kHost,
                   "the reference SSM driver needs host state pools, got /inputs/ssm/", spec.name, " ",
                   it->second.describe());
    Pool pool{spec.name, it->second, static_cast<Eigen::Index>(product(spec.shape))};
    if (spec.transposed) {
      HYBRIDTB_CHECK(spec.shape.size() == 2, "state pool ", spec.name, " is marked transposed but its slot is not 2-d");
      pool.transposed = true;
      pool.rows = spec.shape[0];
      pool.cols = spec.shape[1];
    }
    pools.push_back(std::move(pool));
  }
  return pools;
}

Weights load_weights(const std::vector<TensorSpec>& specs, const std::map<std::string, TensorView>& weights) {
  Weights loaded;
  for (const TensorSpec& spec : specs) {
    const auto it = weights.find(spec.name);
    if (it != weights.end() && !it->second.empty()) loaded[spec.name] = load_weight(it->second);
  }
  return loaded;
}

Matrix load_token_rows(const TensorView& tokens, int64_t rows) {
  const Shape shape = tokens.shape();
  const int64_t width = product(Shape(shape.begin() + 1, shape.end()));
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

void run_requests(const AttentionConfig& config, const MambaAttentionMetadata& metadata, const BatchDescription& batch,
                  const std::vector<Pool>& pools, int64_t num_tokens, const std::string& who,
                  const AdvanceRows& advance) {
  check_plannable_step(config, metadata, batch, who);
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
    for (const Slot* slot : slots_of(plan)) {
      // A stateless mode has no pools to index: only the padding sentinel means anything.
      HYBRIDTB_CHECK(pools.empty() || slot->index < num_slots, slot->field, " = ", slot->index,
                     " is outside the SSM state pools' ", num_slots, " slots");
    }
    // A padding index under the engine's rules (PAD_SLOT_ID, or NULL_BLOCK_ID from vLLM 0.33 on):
    // no state read or write, zero contribution. A request without tokens this step has nothing to
    // advance and leaves its state alone.
    if (!skips_request(config, plan) && plan.end > plan.begin) runs.push_back(&plan);
  }
  for (const RequestPlan* plan : runs) run_request(pools, *plan, who, advance);
}

}  // namespace hybridtb::reference::ssm
