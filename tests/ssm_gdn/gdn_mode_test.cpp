// The gdn SSM mode and its core on their own (Mode::advance and gdn_core, one request): against the
// independent K-major naive loop (naive_gdn.cpp) on random weights, inputs and states at several
// shapes; decode steps == prefill; split prefill == one shot; the V-major state convention (a
// transposed pool changes the outputs, a [Hv, dk, dv] pool is rejected); specs and errors.
// Run: ctest --test-dir <build> -L gdn
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <limits>
#include <string>
#include <vector>

#include "gdn_support.h"
#include "naive_ops.h"
#include "ssm_mode_conformance.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

// {H, Hk, Hv, dk, dv, K}: Hv = Hk and Hv = 2Hk (and 3Hk), dk = dv, dk > dv and dk < dv, K = 2, 3, 4.
const std::vector<GdnDims> kDims = {
    {8, 1, 1, 3, 3, 2},  {12, 2, 2, 4, 4, 4}, {16, 2, 4, 5, 3, 4},
    {10, 1, 2, 3, 6, 2}, {24, 3, 6, 4, 7, 3}, {18, 1, 3, 6, 2, 4},
};
// L below, equal to and above K − 1.
const std::vector<int64_t> kLengths = {1, 2, 3, 5, 17, 40};

// --- specs ---------------------------------------------------------------------------------------------

TEST(GdnSpecs, NamesShapesAndParameters) {
  const ssm::Mode& mode = gdn_mode();
  EXPECT_EQ(mode.name(), "gdn");
  EXPECT_EQ(mode.parameters(),
            (std::vector<std::string>{"num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"}));
  // H = 20, Hk = 2, Hv = 6, dk = 5, dv = 3, K = 4: conv_dim = 2·2·5 + 6·3 = 38, Hv·dv = 18.
  const GdnDims d{20, 2, 6, 5, 3, 4};
  const std::vector<ssm::TensorSpec> states = mode.state_specs(gdn_shape(d));
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].name, "conv_state");
  EXPECT_EQ(states[0].shape, (Shape{38, 3}));
  EXPECT_EQ(states[1].name, "recurrent_state");
  EXPECT_EQ(states[1].shape, (Shape{6, 3, 5})) << "V-major: [num_v_heads, head_v_dim, head_k_dim]";

  const std::vector<ExpectedWeight> expected = {
      {"in_proj_qkvz", {56, 20}, false}, {"in_proj_ba", {12, 20}, false}, {"conv1d_weight", {38, 4}, false},
      {"conv1d_bias", {38}, true},       {"A_log", {6}, false},           {"dt_bias", {6}, false},
      {"norm_weight", {3}, false},       {"out_proj", {20, 18}, false},
  };
  expect_weight_specs(mode.weight_specs(gdn_shape(d)), expected);
  for (const ssm::TensorSpec& spec : states) EXPECT_EQ(spec.dtype, DType::kFloat32) << spec.name;
}

TEST(GdnSpecs, RandomInitGivesDecaysStrictlyInsideZeroOne) {
  // With a = 0: α = exp(−exp(A_log)·softplus(dt_bias)) must be neither 0 nor 1 in float64, or a
  // random model would forget everything or never forget.
  const GdnDims d{16, 2, 8, 4, 4, 4};
  const auto tensors = random_weights(d, 7);
  const Tensor& a_log = tensors.at("A_log");
  const Tensor& dt_bias = tensors.at("dt_bias");
  for (int64_t i = 0; i < d.Hv; ++i) {
    const double g = -std::exp(load_as_double(a_log.data(), a_log.dtype(), i)) *
                     naive_softplus(load_as_double(dt_bias.data(), dt_bias.dtype(), i));
    EXPECT_GT(std::exp(g), 0.1) << "value head " << i;
    EXPECT_LT(std::exp(g), 1.0 - 1e-4) << "value head " << i;
  }
}

TEST(GdnSpecs, RejectsBadParameters) {
  // Hv not a multiple of Hk.
  expect_error_naming([] { gdn_mode().state_specs(gdn_shape({8, 2, 3, 4, 4, 4})); }, "/config/ssm num_v_heads");
  expect_error_naming([] { gdn_mode().weight_specs(gdn_shape({8, 4, 2, 4, 4, 4})); }, "/config/ssm num_v_heads");
  // A kernel of one would leave an empty conv state.
  expect_error_naming([] { gdn_mode().state_specs(gdn_shape({8, 1, 1, 4, 4, 1})); }, "/config/ssm conv_kernel");
  for (const char* name : {"num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"}) {
    ssm::ModeShape shape = gdn_shape({8, 1, 1, 4, 4, 4});
    shape.params.erase(name);
    expect_error_naming([&] { gdn_mode().weight_specs(shape); }, std::string("/config/ssm ") + name);
  }
}

// --- against the naive K-major loop ----------------------------------------------------------------------

// The gdn mode for the conformance checks of ssm_mode_conformance.h.
struct GdnMode {
  using Dims = GdnDims;
  using State = NaiveGdnState;
  using Naive = NaiveGdn;
  static const std::vector<Dims>& dims() { return kDims; }
  static const std::vector<int64_t>& lengths() { return kLengths; }
  static Naive naive(const Dims& d, const std::map<std::string, Tensor>& weights) {
    return naive_gdn_model(d, views(weights));
  }
  static std::vector<double> run_naive(const Naive& naive, State& state, const std::vector<double>& hidden,
                                       int64_t tokens) {
    return naive_gdn(naive, state, hidden, tokens);
  }
  static std::vector<double> hidden(const Dims& d, int64_t tokens, uint64_t seed) {
    return normal_values(tokens * d.H, seed);
  }
  static std::vector<double> run(const ssm::Weights& weights, State& state, const std::vector<double>& hidden,
                                 const Dims& d, int64_t begin, int64_t end, bool decode) {
    return run_mode(weights, state, hidden, d, begin, end, decode);
  }
  static Tolerance tolerance(const Dims& d, int64_t tokens) { return gdn_tolerance(d, tokens); }
};

TEST(GdnNaive, PrefillMatchesTokenLoopOnRandomModels) {
  check_prefill_matches_naive<GdnMode>(100);
}

TEST(GdnNaive, DecodeStepMatchesTokenLoop) {
  check_decode_steps_match_naive<GdnMode>(200);
}

TEST(GdnNaive, CoreMatchesTheNaiveFrontEndAndDeltaRule) {
  // gdn_core on raw mixed_qkv, a, b (what a per-layer hybrid feeds it), prefill and decode.
  uint64_t seed = 250;
  for (const GdnDims& d : kDims) {
    SCOPED_TRACE(describe(d));
    const auto tensors = random_weights(d, seed++);
    const ssm::Weights weights = to_weights(tensors);
    const NaiveGdn naive = naive_gdn_model(d, views(tensors));
    const int64_t L = 13;
    const std::vector<double> mixed = normal_values(L * d.C(), seed++);
    const std::vector<double> a = normal_values(L * d.Hv, seed++);
    const std::vector<double> b = normal_values(L * d.Hv, seed++);
    const NaiveGdnState initial = random_state(d, seed++);

    NaiveGdnState expected_state = initial;
    const GdnTokens tokens = naive_gdn_tokens(naive, expected_state.conv, mixed, a, b, L);
    const std::vector<double> expected = naive_delta_rule(d, tokens, expected_state.S);
    const Tolerance tol = gdn_tolerance(d, L);

    NaiveGdnState state = initial;
    expect_close(run_core(weights, state, d, mixed, a, b, L, false), expected, tol, "core o, prefill");
    expect_state_close(state, expected_state, tol, "core, prefill");

    NaiveGdnState step_state = initial;
    std::vector<double> steps;
    for (int64_t t = 0; t < L; ++t) {
      const auto rows = [&](const std::vector<double>& v, int64_t width) {
        return std::vector<double>(v.begin() + t * width, v.begin() + (t + 1) * width);
      };
      const std::vector<double> o =
          run_core(weights, step_state, d, rows(mixed, d.C()), rows(a, d.Hv), rows(b, d.Hv), 1, true);
      steps.insert(steps.end(), o.begin(), o.end());
    }
    expect_close(steps, expected, tol, "core o, decode steps");
    expect_state_close(step_state, expected_state, tol, "core, decode steps");
  }
}

TEST(GdnNaive, OptionalConvBiasAbsentMeansZero) {
  const GdnDims d{12, 2, 4, 3, 5, 3};
  auto tensors = random_weights(d, 300);
  tensors.erase("conv1d_bias");
  const NaiveGdn naive = naive_gdn_model(d, views(tensors));  // zeros for the absent bias
  const NaiveGdnState initial = random_state(d, 301);
  const std::vector<double> hidden = normal_values(9 * d.H, 302);
  NaiveGdnState expected_state = initial;
  const std::vector<double> expected = naive_gdn(naive, expected_state, hidden, 9);
  NaiveGdnState state = initial;
  const std::vector<double> actual = run_mode(to_weights(tensors), state, hidden, d, 0, 9, false);
  expect_close(actual, expected, gdn_tolerance(d, 9), "contribution without conv bias");
  expect_state_close(state, expected_state, gdn_tolerance(d, 9), "without conv bias");

  // An explicit zero bias gives the same values bit for bit.
  tensors.emplace("conv1d_bias", Tensor::host(DType::kFloat32, {d.C()}));
  NaiveGdnState zeroed_state = initial;
  EXPECT_EQ(run_mode(to_weights(tensors), zeroed_state, hidden, d, 0, 9, false), actual);
  EXPECT_EQ(zeroed_state.S, state.S);
  EXPECT_EQ(zeroed_state.conv, state.conv);
}

// --- metamorphic: how the tokens are split does not matter ---------------------------------------------

TEST(GdnMetamorphic, PrefillEqualsDecodeSteps) {
  check_prefill_equals_decode_steps<GdnMode>(400);
}

TEST(GdnMetamorphic, SplitPrefillEqualsOneShotAtEverySplitPoint) {
  check_split_prefill_equals_one_shot<GdnMode>(500);
}

// --- the state layout --------------------------------------------------------------------------------------

TEST(GdnLayout, PoolIsVMajorAndATransposedPoolChangesTheOutputs) {
  // dk = dv, so a K-major pool has the same shape as the V-major one and validation cannot tell
  // them apart: only the values can. The mode must equal the naive K-major layer exactly when the
  // pool holds M = Sᵀ, and a pool holding S itself (the last two axes swapped) must give outputs
  // far outside the tolerance on a state that is not symmetric.
  const GdnDims d{16, 2, 4, 4, 4, 4};
  const auto tensors = random_weights(d, 600);
  const ssm::Weights weights = to_weights(tensors);
  const NaiveGdn naive = naive_gdn_model(d, views(tensors));
  const NaiveGdnState initial = random_state(d, 601);  // S: K-major
  ASSERT_NE(transpose_heads(initial.S, d.Hv, d.dk, d.dv), initial.S) << "the test needs a non-symmetric state";
  const std::vector<double> hidden = normal_values(6 * d.H, 602);
  const Tolerance tol = gdn_tolerance(d, 6);

  NaiveGdnState expected_state = initial;
  const std::vector<double> expected = naive_gdn(naive, expected_state, hidden, 6);

  // Correct: the mode's pool gets M = Sᵀ (run_mode converts at the boundary).
  NaiveGdnState state = initial;
  expect_close(run_mode(weights, state, hidden, d, 0, 6, false), expected, tol, "V-major pool");

  // Transposed: a K-major pool written as is, i.e. the mode reads S where it expects M.
  NaiveGdnState swapped = initial;
  swapped.S = transpose_heads(initial.S, d.Hv, d.dk, d.dv);
  for (const bool decode : {false, true}) {
    NaiveGdnState s = swapped;
    const std::vector<double> wrong = run_mode(weights, s, hidden, d, 0, decode ? 1 : 6, decode);
    const std::vector<double> right(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(wrong.size()));
    EXPECT_GT(max_abs_difference(wrong, right), 1e6 * tol.atol)
        << "a transposed pool went unnoticed (" << (decode ? "decode" : "prefill") << ")";
  }

  // A symmetric state is its own transpose: there the layouts agree bit for bit, which is why the
  // check above needs a non-symmetric one.
  NaiveGdnState symmetric = initial;
  const auto element = [&](int64_t h, int64_t r, int64_t c) { return static_cast<size_t>((h * d.dk + r) * d.dv + c); };
  for (int64_t h = 0; h < d.Hv; ++h) {
    for (int64_t r = 0; r < d.dk; ++r) {
      for (int64_t c = 0; c < r; ++c) symmetric.S[element(h, c, r)] = symmetric.S[element(h, r, c)];
    }
  }
  NaiveGdnState symmetric_swapped = symmetric;
  symmetric_swapped.S = transpose_heads(symmetric.S, d.Hv, d.dk, d.dv);
  EXPECT_EQ(run_mode(weights, symmetric, hidden, d, 0, 6, false),
            run_mode(weights, symmetric_swapped, hidden, d, 0, 6, false));
}

TEST(GdnLayout, ValidationRejectsAKMajorPoolWhenDkDiffersFromDv) {
  AttentionConfig config;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_size = 8;
  config.block_size = 16;
  config.scale = 1.0 / std::sqrt(8.0);
  config.dtype = DType::kFloat32;
  config.ssm_mode = "gdn";
  const GdnDims d{16, 1, 2, 3, 5, 4};
  config.ssm_params = gdn_params(d);
  ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(config, 3, 9);
  EXPECT_NO_THROW(ssm::validate_ssm_tensors(config, views(random.ssm_state), views(random.weights)));
  EXPECT_EQ(random.ssm_state.at("recurrent_state").shape(), (Shape{3, d.Hv, d.dv, d.dk}));

  random.ssm_state.insert_or_assign("recurrent_state", Tensor::host(DType::kFloat32, {3, d.Hv, d.dk, d.dv}));
  expect_error_naming([&] { ssm::validate_ssm_tensors(config, views(random.ssm_state), views(random.weights)); },
                      "/inputs/ssm/recurrent_state");
}

// --- kernel conventions ------------------------------------------------------------------------------------

// The log-decay g one token applies when a + dt_bias = `pre` and A_log = 0: with b = −∞ nothing is
// written, so M_1 = exp(g)·M_0 and g = log(M_1 / M_0).
double log_decay_for(double pre, bool decode) {
  const GdnDims d{4, 1, 1, 2, 2, 2};
  ssm::Weights weights = to_weights(random_weights(d, 800));
  weights.at("A_log").setZero();
  weights.at("dt_bias").setZero();
  NaiveGdnState state = random_state(d, 801);
  const double before = state.S[0];
  run_core(weights, state, d, normal_values(d.C(), 802), {pre}, {-std::numeric_limits<double>::infinity()}, 1, decode);
  return std::log(state.S[0] / before);
}

TEST(GdnKernels, SoftplusSwitchesToIdentityAboveTwenty) {
  // SGLang's fused_gdn_gating and fla: softplus(x) = x for x > 20, log1p(exp(x)) otherwise. At
  // exactly 20 the log1p branch adds e^-20 ≈ 2.06e-9, far above the float64 tolerance of g ≈ −20.
  const Tolerance tol = gdn_tolerance({4, 1, 1, 2, 2, 2}, 1);
  const double above = 20.0 + std::ldexp(1.0, -40);
  ASSERT_FALSE(tol.allows(-above, -(above + std::log1p(std::exp(-above))))) << "the branches must be distinguishable";
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    expect_close(std::vector<double>{log_decay_for(20.0, decode), log_decay_for(above, decode), log_decay_for(-3.0, decode)},
                 std::vector<double>{-(20.0 + std::log1p(std::exp(-20.0))), -above, -std::log1p(std::exp(-3.0))}, tol,
                 "g at a + dt_bias = 20, 20 + 2^-40, -3");
  }
}

// --- errors ----------------------------------------------------------------------------------------------

TEST(GdnErrors, AdvanceChecksItsInputs) {
  const GdnDims d{8, 1, 2, 3, 4, 3};
  const auto tensors = random_weights(d, 700);
  const ssm::Weights weights = to_weights(tensors);
  const NaiveGdnState state = random_state(d, 701);
  const std::vector<double> hidden = normal_values(2 * d.H, 702);

  expect_error_naming([&] {
    NaiveGdnState s = state;
    run_mode(weights, s, hidden, d, 0, 2, true);
  }, "a decode call has one token");

  ssm::Weights missing = weights;
  missing.erase("dt_bias");
  expect_error_naming([&] {
    NaiveGdnState s = state;
    run_mode(missing, s, hidden, d, 0, 1, false);
  }, "/weights/dt_bias");

  ssm::Weights misshapen = weights;
  misshapen.at("out_proj") = ssm::Matrix::Zero(d.H, d.Hv * d.dv + 1);
  expect_error_naming([&] {
    NaiveGdnState s = state;
    run_mode(misshapen, s, hidden, d, 0, 1, false);
  }, "/weights/out_proj");

  ssm::State no_conv = to_mode_state(state, d);
  no_conv.erase("conv_state");
  ssm::Matrix y(1, d.H);
  expect_error_naming([&] { gdn_mode().advance(weights, no_conv, to_matrix(hidden, 1, d.H), y, false); },
                      "/inputs/ssm/conv_state");
}

}  // namespace
}  // namespace hybridtb::testing
