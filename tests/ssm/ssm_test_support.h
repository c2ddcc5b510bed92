// Helpers for the SSM tests (tests/ssm): a small decoder layer for any registered mode, steps
// built from per-request hidden states and state slots (make_synthetic_batch for the rest, our
// own /batch/ssm_block_table), running the driver on them with shared state pools, conversions
// between tensors and a mode's Eigen forms, and comparisons that name the worst element; also used
// by the per-mode suites (tests/ssm_mamba1, ssm_mamba2, ssm_gdn). Run: ctest --test-dir <build> -L ssm
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/tensor.h"
#include "hybridtb/tolerance.h"

namespace hybridtb::testing {

using reference::ssm::Matrix;
using Pools = std::map<std::string, Tensor>;

// Every parameter of a mode gets this value in the generic suite (mamba1: I = N = K = R = 4), so a
// new mode with parameters needs no test edit.
inline constexpr int64_t kGenericParameterValue = 4;

const reference::ssm::Mode& mode_named(const std::string& name);

// A test-only mode descriptor with the name it is given: the given parameters and tensor specs,
// none by default.
class TestModeSpec final : public spec::ssm::ModeSpec {
 public:
  using Specs = std::function<std::vector<spec::ssm::TensorSpec>(const spec::ssm::ModeShape&)>;
  explicit TestModeSpec(std::string name, std::vector<std::string> parameters = {}, Specs state = {},
                        Specs weights = {})
      : name_(std::move(name)),
        parameters_(std::move(parameters)),
        state_(std::move(state)),
        weights_(std::move(weights)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "a test-only mode"; }
  std::vector<std::string> parameters() const override { return parameters_; }
  std::vector<spec::ssm::TensorSpec> state_specs(const spec::ssm::ModeShape& shape) const override {
    return state_ ? state_(shape) : std::vector<spec::ssm::TensorSpec>{};
  }
  std::vector<spec::ssm::TensorSpec> weight_specs(const spec::ssm::ModeShape& shape) const override {
    return weights_ ? weights_(shape) : std::vector<spec::ssm::TensorSpec>{};
  }

 private:
  std::string name_;
  std::vector<std::string> parameters_;
  Specs state_;
  Specs weights_;
};
// Adds a TestModeSpec to the global descriptor registry unless a descriptor of that name is there.
void add_test_mode_spec(const std::string& name, std::vector<std::string> parameters = {},
                        TestModeSpec::Specs state = {}, TestModeSpec::Specs weights = {});

// A test-only per-request mode with the name it is given: a zero contribution. Its descriptor
// (add_test_mode_spec) says which tensors it has: none by default. Tests derive from it to break
// one thing at a time, or register it by name.
class TestMode : public reference::ssm::Mode {
 public:
  explicit TestMode(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void advance(const reference::ssm::Weights& /*weights*/, reference::ssm::State& /*state*/, const Matrix& x,
               Matrix& y, bool /*decode*/) const override {
    y.setZero(x.rows(), x.cols());
  }

 private:
  std::string name_;
};
// True for modes whose rule is not per request (forward_whole_step takes the step): the
// per-request relations (chunked == one-shot, mixed == alone, slots) do not apply to them.
bool runs_whole_steps(const reference::ssm::Mode& mode);

// A decoder layer with 4 query heads × 32 (H = 128), 2 KV heads, KV blocks of 16, float32, the
// given SSM mode (every parameter = kGenericParameterValue) and Mamba cache mode.
AttentionConfig ssm_config(const std::string& mode, MambaCacheMode cache_mode = MambaCacheMode::kNone,
                           int64_t mamba_block_size = 0);
inline int64_t hidden_size(const AttentionConfig& config) { return config.num_heads * config.head_size; }

// [tokens, H] standard-normal hidden states, exactly representable in float32 (the query dtype).
Matrix random_hidden(int64_t tokens, int64_t H, uint64_t seed);
// `count` standard-normal float64 values (random weights, states and inputs of the per-mode suites).
std::vector<double> normal_values(int64_t count, uint64_t seed);
// Rows of a, then rows of b.
Matrix stack(const Matrix& a, const Matrix& b);

// One request of a step: its tokens' hidden states, its context length, and its row of the SSM
// block table (mode none/align: the slot(s); mode all: one slot per mamba block).
struct StepRequest {
  Matrix hidden;  // [query_len, H]
  int64_t context_len = 0;
  std::vector<int32_t> slots;
};

struct StepOptions {
  BuilderConfig builder;
  int64_t padding_requests = 0;
  int64_t padding_tokens = 0;
  uint64_t seed = 1;
};

// A valid batch of these requests (in this order; decodes must come first), whose query rows are
// the requests' hidden states and whose /batch/ssm_block_table is their slot rows (0 for padding
// requests, which the builder pads with PAD_SLOT_ID).
BatchFile make_step(const AttentionConfig& config, const std::vector<StepRequest>& requests,
                    const StepOptions& options = {});

// Runs ssm_forward on the step with `pools` (updated in place) and `weights`; returns the
// contribution [T, Hq, D] in `dtype`, every element NaN before the call.
Tensor run_step(const AttentionConfig& config, const BatchFile& step, Pools& pools,
                const std::map<std::string, Tensor>& weights, const StepOptions& options = {},
                DType dtype = DType::kFloat64);

// Rows [begin, end) of a [T, Hq, D] contribution as a [rows, Hq·D] matrix.
Matrix token_rows(const Tensor& contribution, int64_t begin, int64_t end);

Pools clone_pools(const Pools& pools);
Pools convert_pools(const Pools& pools, DType dtype);
// One slot of a pool, flattened, as doubles.
Eigen::VectorXd slot_values(const Tensor& pool, int64_t slot);
// True if slot `slot` of every pool has the same bytes in a and b.
bool same_slot_bytes(const Pools& a, const Pools& b, int64_t slot);
int64_t num_slots(const Pools& pools);

// The generic SSM tolerance (kSsmModeFloat64) for `tokens` steps of `mode`: m is the largest of H
// and every dimension of the mode's tensors.
Tolerance mode_tolerance(const reference::ssm::Mode& mode, const AttentionConfig& config, int64_t tokens);
// Exact equality, for computations that must not depend on the batch around a request.
Tolerance exact_tolerance();

// EXPECT every element within tolerance; on failure names `what`, the worst element, and counts.
void expect_close(const Matrix& actual, const Matrix& expected, const Tolerance& tolerance, const std::string& what);
void expect_close(const Eigen::VectorXd& actual, const Eigen::VectorXd& expected, const Tolerance& tolerance,
                  const std::string& what);

// EXPECT over flat row-major values (a mode's contributions or a state slot), as above.
void expect_close(const std::vector<double>& actual, const std::vector<double>& expected, const Tolerance& tolerance,
                  const std::string& what);

// A mode's weight specs as a test lists them: name, shape and optionality in order; every one
// float32 with a one-line meaning.
struct ExpectedWeight {
  const char* name;
  Shape shape;
  bool optional;
};
void expect_weight_specs(const std::vector<reference::ssm::TensorSpec>& weights,
                         const std::vector<ExpectedWeight>& expected);

// Views of named tensors (a step's weights or pools).
std::map<std::string, TensorView> views(const std::map<std::string, Tensor>& tensors);
// Named tensors in a mode's Weights form (exact doubles): k-d tensors [size(0), rest], 1-d [1, n].
reference::ssm::Weights to_weights(const std::map<std::string, Tensor>& tensors);
// Row-major values ↔ a [rows, cols] matrix, and values ↔ a vector (a mode's state).
Matrix to_matrix(const std::vector<double>& values, int64_t rows, int64_t cols);
std::vector<double> to_vector(const Matrix& matrix);
Eigen::VectorXd to_eigen(const std::vector<double>& values);
std::vector<double> from_eigen(const Eigen::VectorXd& values);

// The Error message `run` throws, or "" if it returns.
std::string error_of(const std::function<void()>& run);
// EXPECT `run` to throw an Error whose message names `needle`.
void expect_error_naming(const std::function<void()>& run, const std::string& needle);

// `mode` advanced from `state` over tokens [begin, end) of `hidden` ([tokens][H] row-major): their
// contributions, row-major.
std::vector<double> advance_rows(const reference::ssm::Mode& mode, const reference::ssm::Weights& weights,
                                 reference::ssm::State& state, const std::vector<double>& hidden, int64_t H,
                                 int64_t begin, int64_t end, bool decode);

}  // namespace hybridtb::testing
