// The mamba1 SSM mode on its own (Mode::advance, one request): against the independent naive token
// loop (naive_mamba1.cpp) on random weights, inputs and states; a hand-computed two-token case;
// prefill scan == decode steps; split prefill == one shot; vLLM's softplus threshold; specs and
// errors. Run: ctest --test-dir <build> -L mamba1
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "mamba1_support.h"
#include "naive_ops.h"
#include "ssm_mode_conformance.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

// Awkward sizes on purpose: 1s, primes, L below / equal to / above K−1, K = 2 … 5.
const std::vector<Mamba1Sizes> kSizes = {
    {1, 1, 1, 2, 1}, {8, 4, 2, 2, 1}, {3, 7, 1, 3, 2}, {16, 12, 5, 4, 3}, {64, 32, 16, 4, 4}, {24, 40, 8, 5, 2},
};
const std::vector<int64_t> kLengths = {1, 2, 3, 5, 17, 64};

// --- specs -----------------------------------------------------------------------------------------

TEST(Mamba1Specs, NamesShapesAndParameters) {
  const ssm::Mode& mode = mamba1_mode();
  EXPECT_EQ(mode.name(), "mamba1");
  EXPECT_EQ(mode.parameters(), (std::vector<std::string>{"intermediate_size", "state_size", "conv_kernel", "dt_rank"}));
  const Mamba1Sizes s{10, 6, 5, 4, 2};
  const std::vector<ssm::TensorSpec> states = mode.state_specs(mamba1_shape(s));
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].name, "conv_state");
  EXPECT_EQ(states[0].shape, (Shape{6, 3}));
  EXPECT_EQ(states[1].name, "ssm_state");
  EXPECT_EQ(states[1].shape, (Shape{6, 5}));

  const std::vector<ExpectedWeight> expected = {
      {"in_proj", {12, 10}, false},  {"in_proj_bias", {12}, true}, {"conv1d_weight", {6, 4}, false},
      {"conv1d_bias", {6}, true},    {"x_proj", {12, 6}, false},    {"dt_proj", {6, 2}, false},
      {"dt_proj_bias", {6}, false},  {"A_log", {6, 5}, false},     {"D", {6}, false},
      {"out_proj", {10, 6}, false},  {"out_proj_bias", {10}, true},
  };
  expect_weight_specs(mode.weight_specs(mamba1_shape(s)), expected);
  for (const ssm::TensorSpec& spec : states) EXPECT_EQ(spec.dtype, DType::kFloat32) << spec.name;
}

TEST(Mamba1Specs, RandomInitKeepsDeltaAndDecayInMambaRanges) {
  // dt_proj_bias = softplus⁻¹ of [1e-3, 0.1): Δ from the bias alone in that range; A in (−16, −1].
  const Mamba1Sizes s{16, 32, 8, 4, 2};
  const auto tensors = random_weights(s, 7);
  const Tensor& bias = tensors.at("dt_proj_bias");
  const Tensor& a_log = tensors.at("A_log");
  for (int64_t i = 0; i < bias.numel(); ++i) {
    const double delta = naive_softplus(load_as_double(bias.data(), bias.dtype(), i));
    EXPECT_GE(delta, 0.99e-3);
    EXPECT_LE(delta, 0.1);
  }
  for (int64_t i = 0; i < a_log.numel(); ++i) {
    const double A = -std::exp(load_as_double(a_log.data(), a_log.dtype(), i));
    EXPECT_LE(A, -1.0);
    EXPECT_GE(A, -16.0);
  }
}

TEST(Mamba1Specs, RejectsAKernelOfOneAndMissingParameters) {
  EXPECT_THROW(mamba1_mode().state_specs(mamba1_shape({4, 4, 2, 1, 1})), Error);
  ssm::ModeShape shape = mamba1_shape({4, 4, 2, 3, 1});
  shape.params.erase("dt_rank");
  expect_error_naming([&] { mamba1_mode().weight_specs(shape); }, "dt_rank");
}

// --- against the naive loop --------------------------------------------------------------------------

// The mamba1 mode for the conformance checks of ssm_mode_conformance.h.
struct Mamba1Mode {
  using Dims = Mamba1Sizes;
  using State = NaiveMamba1State;
  using Naive = NaiveMamba1;
  static const std::vector<Dims>& dims() { return kSizes; }
  static const std::vector<int64_t>& lengths() { return kLengths; }
  static Naive naive(const Dims& d, const std::map<std::string, Tensor>& weights) {
    return naive_mamba1_model(d, views(weights));
  }
  static std::vector<double> run_naive(const Naive& naive, State& state, const std::vector<double>& hidden,
                                       int64_t tokens) {
    return naive_mamba1(naive, state, hidden, tokens);
  }
  static std::vector<double> hidden(const Dims& d, int64_t tokens, uint64_t seed) {
    return random_hidden(d, tokens, seed);
  }
  static std::vector<double> run(const ssm::Weights& weights, State& state, const std::vector<double>& hidden,
                                 const Dims& d, int64_t begin, int64_t end, bool decode) {
    return run_mode(weights, state, hidden, d.H, begin, end, decode);
  }
  static Tolerance tolerance(const Dims& d, int64_t tokens) { return mamba1_tolerance(d, tokens); }
};

TEST(Mamba1Naive, PrefillMatchesTokenLoopOnRandomModels) {
  check_prefill_matches_naive<Mamba1Mode>(100);
}

TEST(Mamba1Naive, DecodeStepMatchesTokenLoop) {
  check_decode_steps_match_naive<Mamba1Mode>(200);
}

TEST(Mamba1Naive, OptionalBiasesAbsentMeanZero) {
  const Mamba1Sizes s{12, 8, 4, 3, 2};
  auto tensors = random_weights(s, 300);
  for (const char* name : {"in_proj_bias", "conv1d_bias", "out_proj_bias"}) tensors.erase(name);
  const NaiveMamba1 naive = naive_mamba1_model(s, views(tensors));  // zeros for the absent biases
  const NaiveMamba1State initial = random_state(s, 301);
  const std::vector<double> hidden = random_hidden(s, 9, 302);
  NaiveMamba1State expected_state = initial;
  const std::vector<double> expected = naive_mamba1(naive, expected_state, hidden, 9);
  NaiveMamba1State state = initial;
  const std::vector<double> actual = run_mode(to_weights(tensors), state, hidden, s.H, 0, 9, false);
  expect_close(actual, expected, mamba1_tolerance(s, 9), "contribution without biases");
  expect_state_close(state, expected_state, mamba1_tolerance(s, 9), "without biases");

  // And explicit zero biases give the same values bit for bit.
  auto zeroed = tensors;
  for (const auto& [name, n] : std::vector<std::pair<std::string, int64_t>>{
           {"in_proj_bias", 2 * s.I}, {"conv1d_bias", s.I}, {"out_proj_bias", s.H}}) {
    zeroed.emplace(name, Tensor::host(DType::kFloat32, {n}));
  }
  NaiveMamba1State zeroed_state = initial;
  EXPECT_EQ(run_mode(to_weights(zeroed), zeroed_state, hidden, s.H, 0, 9, false), actual);
  EXPECT_EQ(zeroed_state.ssm, state.ssm);
  EXPECT_EQ(zeroed_state.conv, state.conv);
}

// --- by hand ------------------------------------------------------------------------------------------

// H = I = N = R = 1, K = 2, two tokens, every value written out:
//   in_proj = [2; 1] (x = 2·hidden, z = hidden), conv1d_weight = [0.5, 1] (0.5 on the previous
//   input, 1 on the current), conv1d_bias = 0.25, x_proj = [0; 1; 3] (dt_in = 0, B = c, C = 3c),
//   dt_proj = 0 and dt_proj_bias = log(e − 1) (Δ = softplus(log(e − 1)) = 1), A_log = log 2
//   (A = −2), D = 0.5, out_proj = 2, out_proj_bias = −1; saved conv input 1, saved h = 0.25.
struct HandCase {
  std::map<std::string, Tensor> tensors;
  NaiveMamba1State initial;
  std::vector<double> hidden{1.0, 0.5};
  std::vector<double> expected_out;
  NaiveMamba1State expected_state;
};

HandCase hand_case() {
  HandCase c;
  const auto put = [&](const std::string& name, const Shape& shape, const std::vector<double>& values) {
    Tensor t = Tensor::host(DType::kFloat64, shape);
    for (size_t i = 0; i < values.size(); ++i) store_from_double(t.data(), t.dtype(), static_cast<int64_t>(i), values[i]);
    c.tensors.emplace(name, t);
  };
  put("in_proj", {2, 1}, {2.0, 1.0});
  put("conv1d_weight", {1, 2}, {0.5, 1.0});
  put("conv1d_bias", {1}, {0.25});
  put("x_proj", {3, 1}, {0.0, 1.0, 3.0});
  put("dt_proj", {1, 1}, {0.0});
  put("dt_proj_bias", {1}, {std::log(std::exp(1.0) - 1.0)});
  put("A_log", {1, 1}, {std::log(2.0)});
  put("D", {1}, {0.5});
  put("out_proj", {1, 1}, {2.0});
  put("out_proj_bias", {1}, {-1.0});
  c.initial.conv = {1.0};
  c.initial.ssm = {0.25};

  // Token 1: hidden 1 → x = 2, z = 1; conv 0.5·1 + 1·2 + 0.25 = 2.75; c1 = silu(2.75);
  // h1 = e^{−2}·0.25 + 1·c1·c1; y1 = 3c1·h1 + 0.5·c1; out1 = 2·y1·silu(1) − 1.
  const double c1 = naive_silu(2.75);
  const double h1 = std::exp(-2.0) * 0.25 + c1 * c1;
  const double out1 = 2.0 * (3.0 * c1 * h1 + 0.5 * c1) * naive_silu(1.0) - 1.0;
  // Token 2: hidden 0.5 → x = 1, z = 0.5; conv 0.5·2 + 1·1 + 0.25 = 2.25; c2 = silu(2.25);
  // h2 = e^{−2}·h1 + c2·c2; y2 = 3c2·h2 + 0.5·c2; out2 = 2·y2·silu(0.5) − 1; saved input now 1.
  const double c2 = naive_silu(2.25);
  const double h2 = std::exp(-2.0) * h1 + c2 * c2;
  const double out2 = 2.0 * (3.0 * c2 * h2 + 0.5 * c2) * naive_silu(0.5) - 1.0;
  c.expected_out = {out1, out2};
  c.expected_state.conv = {1.0};
  c.expected_state.ssm = {h2};
  return c;
}

TEST(Mamba1HandComputed, TwoTokensPrefillAndDecode) {
  const HandCase c = hand_case();
  const Mamba1Sizes s{1, 1, 1, 2, 1};
  const Tolerance tol = mamba1_tolerance(s, 2);
  const ssm::Weights weights = to_weights(c.tensors);

  NaiveMamba1State prefill_state = c.initial;
  expect_close(run_mode(weights, prefill_state, c.hidden, 1, 0, 2, false), c.expected_out, tol, "prefill");
  expect_state_close(prefill_state, c.expected_state, tol, "prefill");

  NaiveMamba1State decode_state = c.initial;
  std::vector<double> out = run_mode(weights, decode_state, c.hidden, 1, 0, 1, true);
  const std::vector<double> second = run_mode(weights, decode_state, c.hidden, 1, 1, 2, true);
  out.insert(out.end(), second.begin(), second.end());
  expect_close(out, c.expected_out, tol, "decode");
  expect_state_close(decode_state, c.expected_state, tol, "decode");

  // The naive loop agrees with the hand values too (it is the other side of every random test).
  NaiveMamba1State naive_state = c.initial;
  expect_close(naive_mamba1(naive_mamba1_model(s, views(c.tensors)), naive_state, c.hidden, 2), c.expected_out, tol,
               "naive");
}

TEST(Mamba1HandComputed, FreshRequestSeesZeroPrior) {
  // No initial state: the conv sees a zero previous input and h starts at 0.
  const HandCase c = hand_case();
  const double c1 = naive_silu(1.0 * 2.0 + 0.25);  // 0.5·0 + 1·2 + 0.25
  const double h1 = c1 * c1;
  const double out1 = 2.0 * (3.0 * c1 * h1 + 0.5 * c1) * naive_silu(1.0) - 1.0;
  NaiveMamba1State state = zero_state({1, 1, 1, 2, 1});
  const Tolerance tol = mamba1_tolerance({1, 1, 1, 2, 1}, 1);
  expect_close(run_mode(to_weights(c.tensors), state, c.hidden, 1, 0, 1, false), {out1}, tol, "fresh prefill");
  expect_close(state.ssm, {h1}, tol, "fresh ssm_state");
  EXPECT_EQ(state.conv, std::vector<double>{2.0});
}

// --- metamorphic -----------------------------------------------------------------------------------------

TEST(Mamba1Metamorphic, PrefillScanEqualsDecodeSteps) {
  check_prefill_equals_decode_steps<Mamba1Mode>(400);
}

TEST(Mamba1Metamorphic, SplitPrefillEqualsOneShotAtEverySplitPoint) {
  check_split_prefill_equals_one_shot<Mamba1Mode>(500);
}

TEST(Mamba1Metamorphic, PrefillThenDecodesEqualsOneShot) {
  const Mamba1Sizes s{16, 12, 5, 4, 3};
  const ssm::Weights weights = to_weights(random_weights(s, 600));
  const int64_t L = 14;
  const std::vector<double> hidden = random_hidden(s, L, 601);
  for (const int64_t prefill_len : {1, 2, 3, 9}) {
    SCOPED_TRACE("prefill " + std::to_string(prefill_len));
    NaiveMamba1State one_shot_state = zero_state(s);
    const std::vector<double> one_shot = run_mode(weights, one_shot_state, hidden, s.H, 0, L, false);
    NaiveMamba1State state = zero_state(s);
    std::vector<double> out = run_mode(weights, state, hidden, s.H, 0, prefill_len, false);
    for (int64_t t = prefill_len; t < L; ++t) {
      const std::vector<double> y = run_mode(weights, state, hidden, s.H, t, t + 1, true);
      out.insert(out.end(), y.begin(), y.end());
    }
    expect_close(out, one_shot, mamba1_tolerance(s, L), "prefill + decodes");
    expect_state_close(state, one_shot_state, mamba1_tolerance(s, L), "prefill + decodes");
  }
}

TEST(Mamba1Metamorphic, ShortChunkShiftsSavedInputsExactly) {
  // L < K − 1: the new conv state is the old one shifted left by L (copied, bit-exact), then the
  // chunk's inputs (vLLM causal_conv1d_fn: new_state[i] = old[i + L] for i + L < K − 1).
  const Mamba1Sizes s{8, 6, 2, 5, 2};
  const ssm::Weights weights = to_weights(random_weights(s, 700));
  const NaiveMamba1State initial = random_state(s, 701);
  const std::vector<double> hidden = random_hidden(s, 2, 702);
  for (const bool decode : {false, true}) {
    NaiveMamba1State state = initial;
    const int64_t L = decode ? 1 : 2;
    run_mode(weights, state, hidden, s.H, 0, L, decode);
    for (int64_t i = 0; i < s.I; ++i) {
      for (int64_t j = 0; j + L < s.K - 1; ++j) {
        EXPECT_EQ(state.conv[static_cast<size_t>(i * (s.K - 1) + j)],
                  initial.conv[static_cast<size_t>(i * (s.K - 1) + j + L)])
            << "channel " << i << " tap " << j << (decode ? " (decode)" : " (prefill)");
      }
    }
  }
}

// --- vLLM-specific behaviour ---------------------------------------------------------------------------

// Δ for one channel whose dt comes from the bias alone: with h = 0 before the token and B = c
// (x_proj = [0; 1; 0]), the new state is h = Δ·c·c, so Δ = h / c².
double delta_for_bias(double bias, bool decode) {
  HandCase c = hand_case();
  store_from_double(c.tensors.at("dt_proj_bias").data(), DType::kFloat64, 0, bias);
  store_from_double(c.tensors.at("x_proj").data(), DType::kFloat64, 2, 0.0);
  NaiveMamba1State state = zero_state({1, 1, 1, 2, 1});
  run_mode(to_weights(c.tensors), state, c.hidden, 1, 0, 1, decode);
  const double conv = naive_silu(2.25);  // silu(0.5·0 + 1·2 + 0.25)
  return state.ssm[0] / (conv * conv);
}

TEST(Mamba1Vllm, SoftplusSwitchesToIdentityAboveTwenty) {
  // vLLM: δ <= 20 ? log1p(exp(δ)) : δ. At exactly 20 the softplus branch adds log1p(e^−20) ≈
  // 2.06e-9, far above float64 rounding; just above 20 the value passes through unchanged.
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    const double at20 = delta_for_bias(20.0, decode);
    EXPECT_NEAR(at20, 20.0 + std::log1p(std::exp(-20.0)), 1e-12);
    EXPECT_GT(at20 - 20.0, 1e-9);
    const double above = 20.0 + std::ldexp(1.0, -40);
    EXPECT_NEAR(delta_for_bias(above, decode), above, 1e-12);
    EXPECT_LT(std::fabs(delta_for_bias(above, decode) - above), 1e-11);  // no +2e-9
    EXPECT_NEAR(delta_for_bias(25.0, decode), 25.0, 1e-12);
    // Far below: log1p keeps tiny Δ accurate (log(1 + e^v) would round to 0 at v = −40).
    EXPECT_NEAR(delta_for_bias(-40.0, decode) / std::exp(-40.0), 1.0, 1e-12);
  }
}

TEST(Mamba1Vllm, VanishingDeltaKeepsTheState) {
  // softplus(−745) underflows to the smallest subnormal: exp(Δ·A) = 1 and Δ·c·B vanishes.
  HandCase c = hand_case();
  store_from_double(c.tensors.at("dt_proj_bias").data(), DType::kFloat64, 0, -745.0);
  NaiveMamba1State state = c.initial;
  run_mode(to_weights(c.tensors), state, c.hidden, 1, 0, 1, false);
  EXPECT_EQ(state.ssm[0], 0.25);
}

// --- errors ----------------------------------------------------------------------------------------------

TEST(Mamba1Errors, MissingOrMisshapenWeightsAndStatesAreNamed) {
  const Mamba1Sizes s{8, 4, 2, 3, 1};
  const auto tensors = random_weights(s, 800);
  const std::vector<double> hidden = random_hidden(s, 2, 801);
  const auto run = [&](const ssm::Weights& weights, NaiveMamba1State state, int64_t L, bool decode) {
    run_mode(weights, state, hidden, s.H, 0, L, decode);
  };
  for (const char* name : {"x_proj", "D", "dt_proj_bias", "out_proj"}) {
    ssm::Weights weights = to_weights(tensors);
    weights.erase(name);
    expect_error_naming([&] { run(weights, random_state(s, 1), 2, false); }, name);
  }
  ssm::Weights wrong = to_weights(tensors);
  wrong["x_proj"] = ssm::Matrix::Zero(2 * s.N, s.I);  // dt rows missing
  expect_error_naming([&] { run(wrong, random_state(s, 1), 2, false); }, "x_proj");

  NaiveMamba1State short_state = random_state(s, 1);
  short_state.ssm.pop_back();
  expect_error_naming([&] { run(to_weights(tensors), short_state, 2, false); }, "ssm_state");

  expect_error_naming([&] { run(to_weights(tensors), random_state(s, 1), 2, true); }, "decode");
}

}  // namespace
}  // namespace hybridtb::testing
