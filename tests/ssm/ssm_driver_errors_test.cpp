// The SSM driver's checks that no well-behaved mode can provoke, provoked with deliberately broken
// test-only modes registered here (in this binary only): a contribution of the wrong shape (the
// seed's shape check), a state left with the wrong size, pools with different slot counts,
// parameters; plus a contribution buffer or metadata that do not fit the step. Every failure must
// leave the contribution buffer and the pools untouched where the driver can promise it.
// Run: ctest --test-dir <build> -L ssm
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/reference/ssm_mode.h"
#include "ssm_test_support.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;
using ::testing::HasSubstr;

// Returns one column too many: the seed's HybridAttentionImpl shape check must fire.
class BrokenShapeMode final : public TestMode {
 public:
  BrokenShapeMode() : TestMode("test_broken_shape") {}
  void advance(const ssm::Weights& /*weights*/, ssm::State& /*state*/, const Matrix& x, Matrix& y,
               bool /*decode*/) const override {
    y.setZero(x.rows(), x.cols() + 1);
  }
};

// A whole-step mode that shrinks the step's contribution.
class BrokenWholeStepMode final : public TestMode {
 public:
  BrokenWholeStepMode() : TestMode("test_broken_whole_step") {}
  bool forward_whole_step(const MambaAttentionMetadata& /*metadata*/, const Matrix& hidden,
                          Matrix& contribution) const override {
    contribution.setZero(hidden.rows(), hidden.cols() - 1);
    return true;
  }
};

// Declares a pool `s` of 4 values (its descriptor, register_test_modes) but leaves 5 in the state.
class BadStateMode final : public TestMode {
 public:
  BadStateMode() : TestMode("test_bad_state") {}
  void advance(const ssm::Weights& /*weights*/, ssm::State& state, const Matrix& x, Matrix& y,
               bool /*decode*/) const override {
    state.at("s").setZero(5);
    y.setZero(x.rows(), x.cols());
  }
};

// Two pools (their slot counts must agree) and a parameter-sized weight (its descriptor,
// register_test_modes).
class TwoPoolsMode final : public TestMode {
 public:
  TwoPoolsMode() : TestMode("test_two_pools") {}
};

void register_test_modes() {
  static std::once_flag once;
  std::call_once(once, [] {
    add_test_mode_spec("test_broken_shape");
    add_test_mode_spec("test_broken_whole_step");
    add_test_mode_spec("test_bad_state", {}, [](const ssm::ModeShape& /*shape*/) {
      return std::vector<ssm::TensorSpec>{{.name = "s", .shape = {4}, .meaning = "four values"}};
    });
    add_test_mode_spec(
        "test_two_pools", {"width"},
        [](const ssm::ModeShape& /*shape*/) {
          return std::vector<ssm::TensorSpec>{{.name = "a", .shape = {2}, .meaning = "pool a"},
                                              {.name = "b", .shape = {3}, .meaning = "pool b"}};
        },
        [](const ssm::ModeShape& shape) {
          return std::vector<ssm::TensorSpec>{
              {.name = "w", .shape = {shape.param("width"), shape.hidden_size}, .meaning = "a weight of width rows"}};
        });
    auto& registry = ssm::ModeRegistry::instance();
    registry.add(std::make_unique<BrokenShapeMode>());
    registry.add(std::make_unique<BrokenWholeStepMode>());
    registry.add(std::make_unique<BadStateMode>());
    registry.add(std::make_unique<TwoPoolsMode>());
  });
}

class SsmDriverErrors : public ::testing::Test {
 protected:
  void SetUp() override { register_test_modes(); }

  // Runs the driver on a decode (1 token) and a prefill (5 tokens) with random tensors of `mode`;
  // returns the error message ("" if none) and checks that the contribution buffer is untouched.
  std::string run(const AttentionConfig& config, const std::function<void(ssm::RandomSsmTensors&)>& edit = {},
                  std::optional<MambaAttentionMetadata> metadata = std::nullopt) {
    const int64_t H = hidden_size(config);
    const BatchFile step = make_step(config, {{random_hidden(1, H, 401), 3, {1}}, {random_hidden(5, H, 402), 0, {2}}});
    ssm::RandomSsmTensors tensors = ssm::make_random_ssm_tensors(config, 4, 41);
    if (edit) edit(tensors);
    StepTensors views = step.inputs.views();
    for (const auto& [name, pool] : tensors.ssm_state) views.ssm_state[name] = pool;
    for (const auto& [name, weight] : tensors.weights) views.weights[name] = weight;
    Tensor contribution = Tensor::host(DType::kFloat64, step.inputs.query.shape());
    fill_host(contribution, std::numeric_limits<double>::quiet_NaN());
    const Tensor untouched = clone_host(contribution);
    const MambaAttentionMetadata md = metadata ? *metadata : spec::build_mamba_metadata(config, {}, step.batch);
    const std::string message = error_of([&] { ssm::ssm_forward(config, md, step.batch, views, contribution); });
    if (!message.empty()) {
      EXPECT_TRUE(bitwise_equal(contribution, untouched)) << "a failed step wrote its contribution";
    }
    return message;
  }
};

TEST_F(SsmDriverErrors, ContributionOfTheWrongShapeIsReported) {
  EXPECT_EQ(run(ssm_config("test_broken_shape")),
            "ssm_mode test_broken_shape returned a contribution of shape [1, 129] for [1, 128] hidden states");
  EXPECT_EQ(run(ssm_config("test_broken_whole_step")),
            "ssm_mode test_broken_whole_step returned a contribution of shape [6, 127] for [6, 128] hidden states");
}

TEST_F(SsmDriverErrors, StateLeftWithTheWrongSizeIsReported) {
  EXPECT_EQ(run(ssm_config("test_bad_state")),
            "ssm_mode test_bad_state left state 's' with 5 values; its slot holds 4");
}

TEST_F(SsmDriverErrors, PoolsMustShareTheirSlotCount) {
  EXPECT_EQ(run(ssm_config("test_two_pools")), "");
  EXPECT_THAT(run(ssm_config("test_two_pools"),
                  [](ssm::RandomSsmTensors& t) {
                    t.ssm_state["b"] = Tensor::host(DType::kFloat32, {3, 3});
                  }),
              HasSubstr("/inputs/ssm/b has 3 slots but /inputs/ssm/a has 4"));
}

TEST_F(SsmDriverErrors, ParametersAreNamedInMessages) {
  AttentionConfig missing = ssm_config("test_two_pools");
  missing.ssm_params.clear();
  EXPECT_THAT(error_of([&] { ssm::make_random_ssm_tensors(missing, 4, 1); }), HasSubstr("missing /config/ssm width"));
  const AttentionConfig good = ssm_config("test_two_pools");
  EXPECT_THAT(
      run(good, [](ssm::RandomSsmTensors& t) { t.weights.erase("w"); }),
      HasSubstr("missing weight /weights/w (required by ssm_mode test_two_pools: [4, 128], a weight of width rows)"));
  AttentionConfig zero = good;
  zero.ssm_params["width"] = 0;
  const ssm::ModeShape shape = ssm::mode_shape(zero);
  EXPECT_EQ(error_of([&] { shape.param("width"); }), "/config/ssm width must be > 0, got 0");
}

TEST_F(SsmDriverErrors, ContributionBufferMustHaveTheQueryShape) {
  const AttentionConfig config = ssm_config("prefix_sum");
  const BatchFile step = make_step(config, {{random_hidden(2, 128, 403), 0, {1}}});
  Pools pools = ssm::make_random_ssm_tensors(config, 4, 42).ssm_state;
  StepTensors views = step.inputs.views();
  for (const auto& [name, pool] : pools) views.ssm_state[name] = pool;
  const Tensor wrong = Tensor::host(DType::kFloat64, {2, 128});
  const MambaAttentionMetadata md = spec::build_mamba_metadata(config, {}, step.batch);
  EXPECT_THAT(error_of([&] { ssm::ssm_forward(config, md, step.batch, views, wrong); }),
              HasSubstr("must be a float tensor of the query's shape [2, 4, 32]"));
}

TEST_F(SsmDriverErrors, MetadataOfAnotherBatchIsRejected) {
  const AttentionConfig config = ssm_config("prefix_sum");
  const BatchFile other = make_step(config, {{random_hidden(3, 128, 404), 0, {1}}});
  EXPECT_THAT(run(config, {}, spec::build_mamba_metadata(config, {}, other.batch)),
              HasSubstr("does not describe the batch's 2 requests"));
}

}  // namespace
}  // namespace hybridtb::testing
