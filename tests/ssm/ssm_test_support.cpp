// Helpers for the SSM tests (see ssm_test_support.h).
#include "ssm_test_support.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <utility>

#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {

namespace ssm = reference::ssm;

const ssm::Mode& mode_named(const std::string& name) { return ssm::ModeRegistry::instance().find(name); }

void add_test_mode_spec(const std::string& name, std::vector<std::string> parameters, TestModeSpec::Specs state,
                        TestModeSpec::Specs weights) {
  auto& registry = spec::ssm::ModeSpecRegistry::instance();
  if (registry.contains(name)) return;
  registry.add(std::make_unique<TestModeSpec>(name, std::move(parameters), std::move(state), std::move(weights)));
}

bool runs_whole_steps(const ssm::Mode& mode) {
  // A step without tokens: a per-request mode declines it, a whole-step mode takes it.
  Matrix hidden(0, 128);
  Matrix contribution(0, 128);
  return mode.forward_whole_step(MambaAttentionMetadata{}, hidden, contribution);
}

AttentionConfig ssm_config(const std::string& mode, MambaCacheMode cache_mode, int64_t mamba_block_size) {
  AttentionConfig config;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_size = 32;
  config.block_size = 16;
  config.scale = 1.0 / std::sqrt(32.0);
  config.dtype = DType::kFloat32;
  config.ssm_mode = mode;
  config.mamba_cache_mode = cache_mode;
  config.mamba_block_size = mamba_block_size;
  if (ssm::ModeRegistry::instance().contains(mode)) {
    for (const std::string& name : mode_named(mode).parameters()) config.ssm_params[name] = kGenericParameterValue;
  }
  return config;
}

Matrix random_hidden(int64_t tokens, int64_t H, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Matrix hidden(tokens, H);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < H; ++j) hidden(t, j) = static_cast<double>(static_cast<float>(normal(rng)));
  }
  return hidden;
}

std::vector<double> normal_values(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = dist(rng);
  return values;
}

Matrix stack(const Matrix& a, const Matrix& b) {
  Matrix out(a.rows() + b.rows(), std::max(a.cols(), b.cols()));
  out.topRows(a.rows()) = a;
  out.bottomRows(b.rows()) = b;
  return out;
}

BatchFile make_step(const AttentionConfig& config, const std::vector<StepRequest>& requests,
                    const StepOptions& options) {
  std::vector<RequestSpec> specs;
  for (const StepRequest& request : requests) {
    specs.push_back(RequestSpec{.context_len = request.context_len, .query_len = request.hidden.rows()});
  }
  SyntheticOptions synthetic;
  synthetic.seed = options.seed;
  synthetic.padding_requests = options.padding_requests;
  synthetic.padding_tokens = options.padding_tokens;
  BatchFile file = make_synthetic_batch(config, options.builder, specs, synthetic);

  const int64_t H = hidden_size(config);
  Tensor& query = file.inputs.query;
  int64_t width = 1;
  for (const StepRequest& request : requests) width = std::max<int64_t>(width, std::ssize(request.slots));
  IntArray table = IntArray::matrix(file.batch.num_reqs(), width, 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    const StepRequest& request = requests[r];
    const int64_t begin = file.batch.query_start_loc[static_cast<int64_t>(r)];
    for (int64_t i = 0; i < request.hidden.rows(); ++i) {
      for (int64_t j = 0; j < H; ++j)
        store_from_double(query.data(), query.dtype(), (begin + i) * H + j, request.hidden(i, j));
    }
    for (size_t c = 0; c < request.slots.size(); ++c)
      table.at(static_cast<int64_t>(r), static_cast<int64_t>(c)) = request.slots[c];
  }
  file.batch.ssm_block_table = std::move(table);
  return file;
}

Tensor run_step(const AttentionConfig& config, const BatchFile& step, Pools& pools,
                const std::map<std::string, Tensor>& weights, const StepOptions& options, DType dtype) {
  const MambaAttentionMetadata metadata = spec::build_mamba_metadata(config, options.builder, step.batch);
  StepTensors tensors = step.inputs.views();
  tensors.ssm_state.clear();
  tensors.weights.clear();
  for (const auto& [name, pool] : pools) tensors.ssm_state[name] = pool;
  for (const auto& [name, weight] : weights) tensors.weights[name] = weight;
  Tensor contribution = Tensor::host(dtype, step.inputs.query.shape());
  fill_host(contribution, std::numeric_limits<double>::quiet_NaN());
  ssm::ssm_forward(config, metadata, step.batch, tensors, contribution);
  return contribution;
}

Matrix token_rows(const Tensor& contribution, int64_t begin, int64_t end) {
  const int64_t width = contribution.size(1) * contribution.size(2);
  Matrix rows(end - begin, width);
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t j = 0; j < width; ++j) {
      rows(t - begin, j) = load_as_double(contribution.data(), contribution.dtype(), t * width + j);
    }
  }
  return rows;
}

Pools clone_pools(const Pools& pools) {
  Pools out;
  for (const auto& [name, pool] : pools) out[name] = clone_host(pool);
  return out;
}

Pools convert_pools(const Pools& pools, DType dtype) {
  Pools out;
  for (const auto& [name, pool] : pools) out[name] = convert_host(pool, dtype);
  return out;
}

Eigen::VectorXd slot_values(const Tensor& pool, int64_t slot) {
  const int64_t size = pool.numel() / pool.size(0);
  Eigen::VectorXd values(size);
  for (int64_t i = 0; i < size; ++i) values[i] = load_as_double(pool.data(), pool.dtype(), slot * size + i);
  return values;
}

bool same_slot_bytes(const Pools& a, const Pools& b, int64_t slot) {
  for (const auto& [name, pool] : a) {
    if (!bitwise_equal(pool.view().slice_rows(slot, slot + 1), b.at(name).view().slice_rows(slot, slot + 1))) {
      return false;
    }
  }
  return true;
}

int64_t num_slots(const Pools& pools) { return pools.empty() ? 0 : pools.begin()->second.size(0); }

Tolerance mode_tolerance(const ssm::Mode& mode, const AttentionConfig& config, int64_t tokens) {
  const ssm::ModeShape shape = ssm::mode_shape(config);
  int64_t m = shape.hidden_size;
  for (const auto& specs : {mode.weight_specs(shape), mode.state_specs(shape)}) {
    for (const ssm::TensorSpec& spec : specs) {
      for (int64_t dim : spec.shape) m = std::max(m, dim);
    }
  }
  return tolerance_for(ToleranceCase::kSsmModeFloat64, tokens, m);
}

Tolerance exact_tolerance() {
  return Tolerance{0.0, 0.0, "exact: a request's computation does not depend on the batch around it"};
}

namespace {

template <typename A, typename B>
void expect_close_impl(const A& actual, const B& expected, int64_t rows, int64_t cols, const Tolerance& tolerance,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what << ": sizes differ";
  int64_t failures = 0;
  int64_t worst_row = -1;
  int64_t worst_col = -1;
  double worst_excess = -1.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double a = actual(r, c);
      const double e = expected(r, c);
      if (tolerance.allows(a, e)) continue;
      ++failures;
      const double excess = std::isfinite(a - e) ? std::fabs(a - e) - (tolerance.atol + tolerance.rtol * std::fabs(e))
                                                 : std::numeric_limits<double>::infinity();
      if (excess > worst_excess) {
        worst_excess = excess;
        worst_row = r;
        worst_col = c;
      }
    }
  }
  if (failures == 0) return;
  std::ostringstream report;
  report.precision(17);
  report << what << ": " << failures << " of " << rows * cols << " elements outside the tolerance ("
         << tolerance.rationale << ": atol " << tolerance.atol << ", rtol " << tolerance.rtol << "); worst at ["
         << worst_row << ", " << worst_col << "]: actual " << actual(worst_row, worst_col) << ", expected "
         << expected(worst_row, worst_col);
  ADD_FAILURE() << report.str();
}

}  // namespace

void expect_close(const Matrix& actual, const Matrix& expected, const Tolerance& tolerance, const std::string& what) {
  ASSERT_EQ(actual.rows(), expected.rows()) << what;
  ASSERT_EQ(actual.cols(), expected.cols()) << what;
  expect_close_impl(actual, expected, actual.rows(), actual.cols(), tolerance, what);
}

void expect_close(const Eigen::VectorXd& actual, const Eigen::VectorXd& expected, const Tolerance& tolerance,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  expect_close_impl(actual, expected, actual.size(), 1, tolerance, what);
}

void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, const Tolerance& tolerance,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  const auto n = static_cast<Eigen::Index>(actual.size());
  expect_close_impl(Eigen::Map<const Eigen::VectorXd>(actual.data(), n),
                    Eigen::Map<const Eigen::VectorXd>(expected.data(), n), n, 1, tolerance, what);
}

void expect_weight_specs(const std::vector<reference::ssm::TensorSpec>& weights,
                         const std::vector<ExpectedWeight>& expected) {
  ASSERT_EQ(weights.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(weights[i].name, expected[i].name);
    EXPECT_EQ(weights[i].shape, expected[i].shape) << expected[i].name;
    EXPECT_EQ(weights[i].optional, expected[i].optional) << expected[i].name;
    EXPECT_EQ(weights[i].dtype, DType::kFloat32) << expected[i].name;
    EXPECT_FALSE(weights[i].meaning.empty()) << expected[i].name;
  }
}

std::map<std::string, TensorView> views(const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, TensorView> out;
  for (const auto& [name, tensor] : tensors) out.emplace(name, tensor.view());
  return out;
}

reference::ssm::Weights to_weights(const std::map<std::string, Tensor>& tensors) {
  reference::ssm::Weights weights;
  for (const auto& [name, tensor] : tensors) {
    const int64_t rows = tensor.view().rank() == 1 ? 1 : tensor.size(0);
    const int64_t cols = tensor.numel() / rows;
    Matrix m(rows, cols);
    for (int64_t i = 0; i < tensor.numel(); ++i) m(i / cols, i % cols) = load_as_double(tensor.data(), tensor.dtype(), i);
    weights.emplace(name, m);
  }
  return weights;
}

Matrix to_matrix(const std::vector<double>& values, int64_t rows, int64_t cols) {
  return Eigen::Map<const Matrix>(values.data(), rows, cols);
}

std::vector<double> to_vector(const Matrix& matrix) { return {matrix.data(), matrix.data() + matrix.size()}; }

Eigen::VectorXd to_eigen(const std::vector<double>& values) {
  return Eigen::Map<const Eigen::VectorXd>(values.data(), static_cast<Eigen::Index>(values.size()));
}

std::vector<double> from_eigen(const Eigen::VectorXd& values) { return {values.data(), values.data() + values.size()}; }

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

void expect_error_naming(const std::function<void()>& run, const std::string& needle) {
  const std::string message = error_of(run);
  EXPECT_NE(message.find(needle), std::string::npos) << "expected an Error naming " << needle << ", got "
                                                     << (message.empty() ? "none" : message);
}

std::vector<double> advance_rows(const reference::ssm::Mode& mode, const reference::ssm::Weights& weights,
                                 reference::ssm::State& state, const std::vector<double>& hidden, int64_t H,
                                 int64_t begin, int64_t end, bool decode) {
  const std::vector<double> rows(hidden.begin() + static_cast<std::ptrdiff_t>(begin * H),
                                 hidden.begin() + static_cast<std::ptrdiff_t>(end * H));
  Matrix y(end - begin, H);
  mode.advance(weights, state, to_matrix(rows, end - begin, H), y, decode);
  return to_vector(y);
}

}  // namespace hybridtb::testing
