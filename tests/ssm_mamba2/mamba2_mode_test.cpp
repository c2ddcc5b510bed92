// The mamba2 SSM mode on its own (Mode::advance and the core, one request): against the independent
// naive token loop (naive_mamba2.cpp) on random weights, inputs and states at several shapes (one
// group, one group per head, groups in between; P ≠ N; K = 2 … 4); prefill == decode steps;
// metamorphic relations with known answers (a huge decay rate forgets the past, zero input only
// decays the state, identical heads of one group equal one head, a group feeds only its own heads);
// specs, validation and errors. Run: ctest --test-dir <build> -L mamba2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridtb/config.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "mamba2_support.h"
#include "naive_ops.h"
#include "ssm_mode_conformance.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

size_t at(int64_t i) { return static_cast<size_t>(i); }

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// {H, Hs, P, N, G, K}: one group, one group per head, 3 and 2 heads per group; P ≠ N mostly;
// L below / equal to / above K − 1.
const std::vector<Mamba2Dims> kDims = {
    {2, 1, 2, 1, 1, 2},   {8, 4, 3, 5, 1, 2},   {16, 4, 2, 6, 4, 4},
    {24, 6, 4, 3, 2, 3},  {20, 6, 5, 2, 3, 4},  {64, 8, 8, 16, 2, 4},
};
const std::vector<int64_t> kLengths = {1, 2, 3, 5, 17, 40};

// --- specs -----------------------------------------------------------------------------------------

TEST(Mamba2Specs, NamesShapesAndParameters) {
  const ssm::Mode& mode = mamba2_mode();
  EXPECT_EQ(mode.name(), "mamba2");
  EXPECT_EQ(mode.parameters(),
            (std::vector<std::string>{"num_ssm_heads", "head_dim", "state_size", "n_groups", "conv_kernel"}));
  // d_ssm = 18, conv_dim = 18 + 2·2·5 = 38, in_proj rows = 2·18 + 2·2·5 + 6 = 62.
  const Mamba2Dims d{10, 6, 3, 5, 2, 4};
  const std::vector<ssm::TensorSpec> states = mode.state_specs(mamba2_shape(d));
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].name, "conv_state");
  EXPECT_EQ(states[0].shape, (Shape{38, 3}));
  EXPECT_EQ(states[1].name, "ssm_state");
  EXPECT_EQ(states[1].shape, (Shape{6, 3, 5}));

  const std::vector<ExpectedWeight> expected = {
      {"in_proj", {62, 10}, false},  {"in_proj_bias", {62}, true}, {"conv1d_weight", {38, 4}, false},
      {"conv1d_bias", {38}, true},   {"dt_bias", {6}, false},      {"A_log", {6}, false},
      {"D", {6}, false},             {"norm_weight", {18}, false}, {"out_proj", {10, 18}, false},
      {"out_proj_bias", {10}, true},
  };
  expect_weight_specs(mode.weight_specs(mamba2_shape(d)), expected);
  for (const ssm::TensorSpec& spec : states) EXPECT_EQ(spec.dtype, DType::kFloat32) << spec.name;
}

TEST(Mamba2Specs, RandomInitKeepsDeltaAndDecayInMambaRanges) {
  // dt_bias = softplus⁻¹ of [1e-3, 0.1) (mamba_ssm's dt_min, dt_max); A in [−16, −1] (A_init_range).
  const Mamba2Dims d{16, 32, 2, 4, 4, 4};
  const auto tensors = random_weights(d, 7);
  for (const double bias : values_of(tensors.at("dt_bias"))) {
    const double delta = naive_softplus(bias);
    EXPECT_GE(delta, 0.99e-3);
    EXPECT_LE(delta, 0.1);
  }
  for (const double a_log : values_of(tensors.at("A_log"))) {
    EXPECT_LE(-std::exp(a_log), -1.0);
    EXPECT_GE(-std::exp(a_log), -16.0);
  }
}

TEST(Mamba2Specs, RejectsGroupsThatDoNotDivideTheHeadsAKernelOfOneAndMissingParameters) {
  const ssm::Mode& mode = mamba2_mode();
  expect_error_naming([&] { mode.state_specs(mamba2_shape({8, 4, 2, 2, 3, 4})); }, "/config/ssm n_groups");
  expect_error_naming([&] { mode.weight_specs(mamba2_shape({8, 6, 2, 2, 4, 4})); }, "/config/ssm n_groups");
  expect_error_naming([&] { mode.state_specs(mamba2_shape({8, 4, 2, 2, 2, 1})); }, "/config/ssm conv_kernel");
  ssm::ModeShape shape = mamba2_shape({8, 4, 2, 2, 2, 4});
  shape.params.erase("head_dim");
  expect_error_naming([&] { mode.weight_specs(shape); }, "/config/ssm head_dim");
  // The core checks the same when called on its own.
  expect_error_naming([] { ssm::check_mamba2_sizes(core_sizes({8, 4, 2, 2, 3, 4})); }, "/config/ssm n_groups");
}

// --- against the naive loop --------------------------------------------------------------------------

// The mamba2 mode for the conformance checks of ssm_mode_conformance.h.
struct Mamba2Mode {
  using Dims = Mamba2Dims;
  using State = NaiveMamba2State;
  using Naive = NaiveMamba2;
  static const std::vector<Dims>& dims() { return kDims; }
  static const std::vector<int64_t>& lengths() { return kLengths; }
  static Naive naive(const Dims& d, const std::map<std::string, Tensor>& weights) {
    return naive_mamba2_model(d, views(weights));
  }
  static std::vector<double> run_naive(const Naive& naive, State& state, const std::vector<double>& hidden,
                                       int64_t tokens) {
    return naive_mamba2(naive, state, hidden, tokens);
  }
  static std::vector<double> hidden(const Dims& d, int64_t tokens, uint64_t seed) {
    return normal_values(tokens * d.H, seed);
  }
  static std::vector<double> run(const ssm::Weights& weights, State& state, const std::vector<double>& hidden,
                                 const Dims& d, int64_t begin, int64_t end, bool decode) {
    return run_mode(weights, state, hidden, d.H, begin, end, decode);
  }
  static Tolerance tolerance(const Dims& d, int64_t tokens) { return mamba2_tolerance(d, tokens); }
};

TEST(Mamba2Naive, PrefillMatchesTokenLoopOnRandomModels) {
  check_prefill_matches_naive<Mamba2Mode>(100);
}

TEST(Mamba2Naive, DecodeStepMatchesTokenLoop) {
  check_decode_steps_match_naive<Mamba2Mode>(200);
}

TEST(Mamba2Naive, OptionalBiasesAbsentMeanZero) {
  const Mamba2Dims d{12, 4, 3, 5, 2, 3};
  auto tensors = random_weights(d, 300);
  for (const char* name : {"in_proj_bias", "conv1d_bias", "out_proj_bias"}) tensors.erase(name);
  const NaiveMamba2 naive = naive_mamba2_model(d, views(tensors));  // zeros for the absent biases
  const NaiveMamba2State initial = random_state(d, 301);
  const std::vector<double> hidden = normal_values(9 * d.H, 302);
  NaiveMamba2State expected_state = initial;
  const std::vector<double> expected = naive_mamba2(naive, expected_state, hidden, 9);
  NaiveMamba2State state = initial;
  const std::vector<double> actual = run_mode(to_weights(tensors), state, hidden, d.H, 0, 9, false);
  expect_close(actual, expected, mamba2_tolerance(d, 9), "contribution without biases");
  expect_state_close(state, expected_state, mamba2_tolerance(d, 9), "without biases");

  // And explicit zero biases give the same values bit for bit.
  auto zeroed = tensors;
  zeroed.emplace("in_proj_bias", Tensor::host(DType::kFloat32, {d.proj()}));
  zeroed.emplace("conv1d_bias", Tensor::host(DType::kFloat32, {d.conv_dim()}));
  zeroed.emplace("out_proj_bias", Tensor::host(DType::kFloat32, {d.H}));
  NaiveMamba2State zeroed_state = initial;
  EXPECT_EQ(run_mode(to_weights(zeroed), zeroed_state, hidden, d.H, 0, 9, false), actual);
  EXPECT_EQ(zeroed_state.ssm, state.ssm);
  EXPECT_EQ(zeroed_state.conv, state.conv);
}

// --- metamorphic: the mode against itself ------------------------------------------------------------

TEST(Mamba2Metamorphic, PrefillEqualsDecodeSteps) {
  check_prefill_equals_decode_steps<Mamba2Mode>(400);
}

TEST(Mamba2Metamorphic, SplitPrefillEqualsOneShotAtEverySplitPoint) {
  check_split_prefill_equals_one_shot<Mamba2Mode>(500);
}

TEST(Mamba2Metamorphic, HugeDecayRateForgetsThePastSsmState) {
  // A_log = 50: A = −5e21, a = exp(Δ·A) = 0 for any Δ the model produces, so the state before a
  // token never reaches its output: two requests that differ only in their saved SSM state give
  // the same contributions and end in the same state, bit for bit (the conv state still matters).
  const Mamba2Dims d{16, 4, 3, 5, 2, 4};
  auto tensors = random_weights(d, 500);
  tensors["A_log"] = tensor_of({d.Hs}, std::vector<double>(at(d.Hs), 50.0));
  const ssm::Weights weights = to_weights(tensors);
  const std::vector<double> hidden = normal_values(6 * d.H, 501);
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    NaiveMamba2State first = random_state(d, 502);
    NaiveMamba2State second = first;
    second.ssm = normal_values(d.d_ssm() * d.N, 503);
    const int64_t L = decode ? 1 : 6;
    EXPECT_EQ(run_mode(weights, first, hidden, d.H, 0, L, decode),
              run_mode(weights, second, hidden, d.H, 0, L, decode));
    EXPECT_EQ(first.ssm, second.ssm);
  }
}

// The core with an identity conv (tap K−1 = 1, others and bias 0): its x, B and C are silu of the
// xBC rows given, so the tests below know every input of the recurrence exactly.
struct CoreCase {
  Mamba2Dims dims;
  ssm::Mamba2Sizes sizes;
  ssm::Mamba2CoreWeights weights;
  std::vector<double> xBC;  // [L][conv_dim]
  std::vector<double> dt;   // [L][Hs]
  int64_t L = 0;
};

CoreCase identity_conv_case(const Mamba2Dims& d, int64_t L, uint64_t seed) {
  CoreCase c{d, core_sizes(d), ssm::mamba2_core_weights(to_weights(random_weights(d, seed)), core_sizes(d)),
             normal_values(L * d.conv_dim(), seed + 1), normal_values(L * d.Hs, seed + 2), L};
  c.weights.conv_weight.setZero();
  c.weights.conv_weight.col(d.K - 1).setOnes();
  c.weights.conv_bias.setZero();
  return c;
}

std::vector<double> run_core(const CoreCase& c, NaiveMamba2State& state, bool decode) {
  Eigen::VectorXd conv = to_eigen(state.conv);
  Eigen::VectorXd h = to_eigen(state.ssm);
  const ssm::Matrix y = ssm::mamba2_core(c.sizes, c.weights, to_matrix(c.xBC, c.L, c.dims.conv_dim()),
                                         to_matrix(c.dt, c.L, c.dims.Hs), conv, h, decode);
  state = {from_eigen(conv), from_eigen(h)};
  return to_vector(y);
}

TEST(Mamba2Metamorphic, HugeDecayRateLeavesOnlyTheTokensOwnUpdate) {
  // a = 0: S_t = Δ_t·x_t ⊗ B_t, so y_t = Δ_t·(B_t·C_t)·x_t + D·x_t per head, whatever S was.
  for (const Mamba2Dims& d : {Mamba2Dims{4, 4, 3, 5, 2, 3}, Mamba2Dims{4, 6, 2, 4, 6, 2}}) {
    for (const bool decode : {false, true}) {
      SCOPED_TRACE(describe(d) + (decode ? " decode" : " prefill"));
      CoreCase c = identity_conv_case(d, decode ? 1 : 7, 600);
      c.weights.A.setConstant(-std::exp(50.0));
      NaiveMamba2State state = random_state(d, 601);
      const std::vector<double> y = run_core(c, state, decode);
      std::vector<double> expected(at(c.L * d.d_ssm()));
      const int64_t C = d.conv_dim();
      for (int64_t t = 0; t < c.L; ++t) {
        for (int64_t h = 0; h < d.Hs; ++h) {
          const int64_t g = h / (d.Hs / d.G);
          const double delta = naive_softplus(c.dt[at(t * d.Hs + h)] + c.weights.dt_bias(h));
          double bc = 0.0;
          for (int64_t n = 0; n < d.N; ++n) {
            bc += silu(c.xBC[at(t * C + d.d_ssm() + g * d.N + n)]) *
                  silu(c.xBC[at(t * C + d.d_ssm() + d.G * d.N + g * d.N + n)]);
          }
          for (int64_t p = 0; p < d.P; ++p) {
            const double x = silu(c.xBC[at(t * C + h * d.P + p)]);
            expected[at(t * d.d_ssm() + h * d.P + p)] = delta * bc * x + c.weights.D(h) * x;
          }
        }
      }
      expect_close(y, expected, mamba2_tolerance(d, c.L), "y with a = 0");
    }
  }
}

TEST(Mamba2Metamorphic, ZeroInputOnlyDecaysTheState) {
  // Δ·x ⊗ B = 0 (x = 0, or B = 0): S_t = (Π_{r ≤ t} a_r)·S_0 and y_t = S_t·C_t + D·x_t.
  const Mamba2Dims d{4, 6, 3, 4, 3, 4};
  const int64_t C = d.conv_dim();
  for (const bool zero_x : {true, false}) {
    for (const bool decode : {false, true}) {
      SCOPED_TRACE(std::string(zero_x ? "x = 0" : "B = 0") + (decode ? " decode" : " prefill"));
      CoreCase c = identity_conv_case(d, decode ? 1 : 9, 700);
      const int64_t begin = zero_x ? 0 : d.d_ssm(), end = zero_x ? d.d_ssm() : d.d_ssm() + d.G * d.N;
      for (int64_t t = 0; t < c.L; ++t) {
        for (int64_t ch = begin; ch < end; ++ch) c.xBC[at(t * C + ch)] = 0.0;  // silu(0) = 0
      }
      const NaiveMamba2State initial = random_state(d, 701);
      NaiveMamba2State state = initial;
      const std::vector<double> y = run_core(c, state, decode);

      std::vector<double> expected_y(at(c.L * d.d_ssm()));
      std::vector<double> decay(at(d.Hs), 1.0);  // Π a_r so far, per head
      for (int64_t t = 0; t < c.L; ++t) {
        for (int64_t h = 0; h < d.Hs; ++h) {
          const int64_t g = h / (d.Hs / d.G);
          decay[at(h)] *= std::exp(naive_softplus(c.dt[at(t * d.Hs + h)] + c.weights.dt_bias(h)) *
                                   c.weights.A(h));
          for (int64_t p = 0; p < d.P; ++p) {
            double sc = 0.0;
            for (int64_t n = 0; n < d.N; ++n) {
              const double Cn = silu(c.xBC[at(t * C + d.d_ssm() + d.G * d.N + g * d.N + n)]);
              sc += initial.ssm[at((h * d.P + p) * d.N + n)] * Cn;
            }
            const double x = silu(c.xBC[at(t * C + h * d.P + p)]);
            expected_y[at(t * d.d_ssm() + h * d.P + p)] = decay[at(h)] * sc + c.weights.D(h) * x;
          }
        }
      }
      std::vector<double> expected_state(initial.ssm.size());
      for (int64_t i = 0; i < d.d_ssm() * d.N; ++i) {
        expected_state[at(i)] = decay[at(i / (d.P * d.N))] * initial.ssm[at(i)];
      }
      const Tolerance tol = mamba2_tolerance(d, c.L);
      expect_close(y, expected_y, tol, "y");
      expect_close(state.ssm, expected_state, tol, "ssm_state = Π a · S_0");
    }
  }
}

TEST(Mamba2Metamorphic, EachGroupFeedsOnlyItsOwnHeads) {
  // Head h reads group h / (Hs / G) — with Hs = 4, G = 2: heads 0, 1 read group 0 and heads 2, 3
  // group 1 (not h % G). Changing group 1's B and C inputs leaves heads 0 and 1 bit for bit.
  const Mamba2Dims d{4, 4, 3, 5, 2, 3};
  const int64_t C = d.conv_dim();
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    const ssm::Mamba2CoreWeights weights = ssm::mamba2_core_weights(to_weights(random_weights(d, 800)), core_sizes(d));
    const int64_t L = decode ? 1 : 6;
    CoreCase base{d, core_sizes(d), weights, normal_values(L * C, 801), normal_values(L * d.Hs, 802), L};
    CoreCase changed = base;
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t n = 0; n < d.N; ++n) {
        changed.xBC[at(t * C + d.d_ssm() + d.N + n)] += 1.0;              // B of group 1
        changed.xBC[at(t * C + d.d_ssm() + d.G * d.N + d.N + n)] -= 0.5;  // C of group 1
      }
    }
    const NaiveMamba2State initial = random_state(d, 803);
    NaiveMamba2State base_state = initial, changed_state = initial;
    const std::vector<double> y0 = run_core(base, base_state, decode);
    const std::vector<double> y1 = run_core(changed, changed_state, decode);
    const int64_t group_width = 2 * d.P;  // two heads per group
    for (int64_t t = 0; t < L; ++t) {
      bool group1_differs = false;
      for (int64_t i = 0; i < d.d_ssm(); ++i) {
        const size_t k = at(t * d.d_ssm() + i);
        if (i < group_width) {
          EXPECT_EQ(y1[k], y0[k]) << "token " << t << " channel " << i << " of group 0 changed";
        } else {
          group1_differs = group1_differs || y1[k] != y0[k];
        }
      }
      EXPECT_TRUE(group1_differs) << "token " << t << ": group 1's heads ignored their B and C";
    }
    const size_t half = base_state.ssm.size() / 2;
    EXPECT_TRUE(std::equal(base_state.ssm.begin(), base_state.ssm.begin() + static_cast<std::ptrdiff_t>(half),
                           changed_state.ssm.begin()));
  }
}

TEST(Mamba2Metamorphic, IdenticalHeadsOfOneGroupEqualOneHead) {
  // G = 1 and every head a copy of one head (its in_proj rows, conv channels, dt_bias, A_log, D,
  // norm weights and initial state): all heads see the same B and C, so they compute the same y,
  // the norm over Hs identical copies equals the norm over one, and out_proj adds the heads' column
  // blocks. So the Hs-head model equals the one-head model whose out_proj is the sum of the blocks.
  const int64_t H = 12, Hs = 4, P = 3, N = 5, K = 3;
  const Mamba2Dims one{H, 1, P, N, 1, K}, many{H, Hs, P, N, 1, K};
  auto tensors = random_weights(one, 900);
  const NaiveMamba2State one_initial = random_state(one, 901);

  // Row r of the many-head in_proj (z | x | B | C | dt) copies this row of the one-head one.
  const auto source_row = [&](int64_t r) -> int64_t {
    if (r < 2 * Hs * P) return (r / (Hs * P)) * P + r % P;  // z or x, any head: that channel of the one head
    if (r < 2 * Hs * P + 2 * N) return 2 * P + (r - 2 * Hs * P);
    return 2 * P + 2 * N;  // dt
  };
  const auto source_channel = [&](int64_t c) -> int64_t { return c < Hs * P ? c % P : P + (c - Hs * P); };
  const auto copy_rows = [](const std::vector<double>& from, int64_t width, int64_t rows,
                            const std::function<int64_t(int64_t)>& source) {
    std::vector<double> to(at(rows * width));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < width; ++k) to[at(r * width + k)] = from[at(source(r) * width + k)];
    }
    return to;
  };
  const auto tile = [&](const std::vector<double>& from) {
    std::vector<double> to;
    for (int64_t h = 0; h < Hs; ++h) to.insert(to.end(), from.begin(), from.end());
    return to;
  };

  std::map<std::string, Tensor> heads;
  heads["in_proj"] =
      tensor_of({many.proj(), H}, copy_rows(values_of(tensors.at("in_proj")), H, many.proj(), source_row));
  heads["in_proj_bias"] =
      tensor_of({many.proj()}, copy_rows(values_of(tensors.at("in_proj_bias")), 1, many.proj(), source_row));
  heads["conv1d_weight"] = tensor_of(
      {many.conv_dim(), K}, copy_rows(values_of(tensors.at("conv1d_weight")), K, many.conv_dim(), source_channel));
  heads["conv1d_bias"] =
      tensor_of({many.conv_dim()}, copy_rows(values_of(tensors.at("conv1d_bias")), 1, many.conv_dim(), source_channel));
  for (const char* name : {"dt_bias", "A_log", "D", "norm_weight"}) {
    const std::vector<double> values = tile(values_of(tensors.at(name)));
    heads[name] = tensor_of({static_cast<int64_t>(values.size())}, values);
  }
  heads["out_proj_bias"] = tensors.at("out_proj_bias");
  const std::vector<double> blocks = normal_values(H * Hs * P, 902);  // [H][Hs·P]
  heads["out_proj"] = tensor_of({H, Hs * P}, blocks);
  std::vector<double> summed(at(H * P), 0.0);
  for (int64_t k = 0; k < H; ++k) {
    for (int64_t i = 0; i < Hs * P; ++i) summed[at(k * P + i % P)] += blocks[at(k * Hs * P + i)];
  }
  tensors["out_proj"] = tensor_of({H, P}, summed);

  NaiveMamba2State many_initial;
  many_initial.conv = copy_rows(one_initial.conv, K - 1, many.conv_dim(), source_channel);
  many_initial.ssm = tile(one_initial.ssm);

  const int64_t L = 11;
  const std::vector<double> hidden = normal_values(L * H, 903);
  const Tolerance tol = mamba2_tolerance(many, L);
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode steps" : "prefill");
    NaiveMamba2State one_state = one_initial, many_state = many_initial;
    std::vector<double> y_one, y_many;
    for (int64_t t = 0; t < L; t += decode ? 1 : L) {
      const int64_t end = decode ? t + 1 : L;
      const std::vector<double> a = run_mode(to_weights(tensors), one_state, hidden, H, t, end, decode);
      const std::vector<double> b = run_mode(to_weights(heads), many_state, hidden, H, t, end, decode);
      y_one.insert(y_one.end(), a.begin(), a.end());
      y_many.insert(y_many.end(), b.begin(), b.end());
    }
    expect_close(y_many, y_one, tol, "Hs identical heads vs one head");
    expect_close(many_state.ssm, tile(one_state.ssm), tol, "every head's ssm_state vs the one head's");
    expect_close(many_state.conv, copy_rows(one_state.conv, K - 1, many.conv_dim(), source_channel), tol,
                 "conv_state");
  }
}

// --- vLLM-specific behaviour ---------------------------------------------------------------------------

// Δ the core uses for one head whose dt comes from the bias alone: with A = 0 (no decay), S = 0
// before the token and x = B = silu(1), the new state is S = Δ·x·B, so Δ = S / silu(1)².
double delta_for_bias(double bias, bool decode) {
  CoreCase c = identity_conv_case({4, 1, 1, 1, 1, 2}, 1, 1100);
  c.xBC = {1.0, 1.0, 1.0};  // x, B, C
  c.dt = {0.0};
  c.weights.dt_bias(0) = bias;
  c.weights.A(0) = 0.0;
  NaiveMamba2State state = zero_state(c.dims);
  run_core(c, state, decode);
  return state.ssm[0] / (silu(1.0) * silu(1.0));
}

TEST(Mamba2Vllm, SoftplusSwitchesToIdentityAboveTwentyWithoutAClamp) {
  // Kernels: δ <= 20 ? log1p(exp(δ)) : δ. At exactly 20 the softplus branch adds log1p(e^−20) ≈
  // 2.06e-9, far above float64 rounding; just above 20 the value passes through unchanged; and no
  // dt_limit clamp applies (vLLM's default (0, inf)), so Δ = 25 stays 25.
  for (const bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode" : "prefill");
    const double at20 = delta_for_bias(20.0, decode);
    EXPECT_NEAR(at20, 20.0 + std::log1p(std::exp(-20.0)), 1e-12);
    EXPECT_GT(at20 - 20.0, 1e-9);
    const double above = 20.0 + std::ldexp(1.0, -40);
    EXPECT_LT(std::fabs(delta_for_bias(above, decode) - above), 1e-11);  // no +2e-9
    EXPECT_NEAR(delta_for_bias(25.0, decode), 25.0, 1e-12);
    // Far below: log1p keeps tiny Δ accurate (log(1 + e^v) would round to 0 at v = −40).
    EXPECT_NEAR(delta_for_bias(-40.0, decode) / std::exp(-40.0), 1.0, 1e-12);
  }
}

// --- validation and errors ----------------------------------------------------------------------------

AttentionConfig mamba2_config(const Mamba2Dims& d) {
  AttentionConfig config;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_size = d.H / 2;
  config.block_size = 16;
  config.scale = 1.0;
  config.dtype = DType::kFloat32;
  config.ssm_mode = "mamba2";
  config.ssm_params = mamba2_params(d);
  return config;
}

TEST(Mamba2Errors, ValidationNamesTheField) {
  const Mamba2Dims d{16, 4, 3, 5, 2, 4};  // P ≠ N, so a transposed state has another shape
  const AttentionConfig config = mamba2_config(d);
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(config, 3, 11);
  EXPECT_NO_THROW(ssm::validate_ssm_tensors(config, views(random.ssm_state), views(random.weights)));

  const auto validate_with_pool = [&](const std::string& name, const Shape& shape) {
    auto pools = random.ssm_state;
    pools[name] = Tensor::host(DType::kFloat32, shape);
    ssm::validate_ssm_tensors(config, views(pools), views(random.weights));
  };
  // ssm_state as [S, Hs, N, P] (mamba_ssm's h layout transposed) and conv_state as vLLM's in-memory
  // [S, K−1, conv_dim]: same sizes, wrong layouts.
  expect_error_naming([&] { validate_with_pool("ssm_state", {3, d.Hs, d.N, d.P}); }, "/inputs/ssm/ssm_state");
  expect_error_naming([&] { validate_with_pool("conv_state", {3, d.K - 1, d.conv_dim()}); }, "/inputs/ssm/conv_state");

  AttentionConfig bad_groups = config;
  bad_groups.ssm_params["n_groups"] = 3;
  expect_error_naming([&] { ssm::validate_ssm_tensors(bad_groups, views(random.ssm_state), views(random.weights)); },
                      "/config/ssm n_groups");

  auto weights = random.weights;
  weights["in_proj"] = Tensor::host(DType::kFloat32, {d.proj() - d.Hs, d.H});  // no dt rows
  expect_error_naming([&] { ssm::validate_ssm_tensors(config, views(random.ssm_state), views(weights)); },
                      "/weights/in_proj");
}

TEST(Mamba2Errors, MissingOrMisshapenWeightsAndStatesAreNamed) {
  const Mamba2Dims d{8, 4, 2, 3, 2, 3};
  const auto tensors = random_weights(d, 1000);
  const std::vector<double> hidden = normal_values(2 * d.H, 1001);
  const auto run = [&](const ssm::Weights& weights, NaiveMamba2State state, int64_t L, bool decode) {
    run_mode(weights, state, hidden, d.H, 0, L, decode);
  };
  for (const char* name : {"in_proj", "conv1d_weight", "dt_bias", "A_log", "D", "norm_weight", "out_proj"}) {
    ssm::Weights weights = to_weights(tensors);
    weights.erase(name);
    expect_error_naming([&] { run(weights, random_state(d, 1), 2, false); }, name);
  }
  ssm::Weights wrong = to_weights(tensors);
  wrong["out_proj"] = ssm::Matrix::Zero(d.H, d.d_ssm() + 1);
  expect_error_naming([&] { run(wrong, random_state(d, 1), 2, false); }, "out_proj");

  NaiveMamba2State short_state = random_state(d, 1);
  short_state.ssm.pop_back();
  expect_error_naming([&] { run(to_weights(tensors), short_state, 2, false); }, "ssm_state");
  NaiveMamba2State short_conv = random_state(d, 1);
  short_conv.conv.pop_back();
  expect_error_naming([&] { run(to_weights(tensors), short_conv, 2, false); }, "conv_state");

  expect_error_naming([&] { run(to_weights(tensors), random_state(d, 1), 2, true); }, "decode");
}

}  // namespace
}  // namespace hybridtb::testing
