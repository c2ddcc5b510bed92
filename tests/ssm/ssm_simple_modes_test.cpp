// The simple SSM modes (zero, prefix_sum_flat, prefix_sum, ema) against naive per-token loops
// written here, independently of reference/ssm, on mixed batches run through the driver; and the
// mode registry. The relations every mode must satisfy are in ssm_generic_mode_test.
// Run: ctest --test-dir <build> -L ssm
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
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

// Two decodes with context, a one-token request without context (a decode that starts from
// zeros), a continued and a fresh prefill; distinct slots of 8.
std::vector<StepRequest> mixed_requests(int64_t H) {
  return {{random_hidden(1, H, 301), 7, {3}},
          {random_hidden(1, H, 302), 30, {5}},
          {random_hidden(1, H, 303), 0, {1}},
          {random_hidden(9, H, 304), 12, {6}},
          {random_hidden(17, H, 305), 0, {2}}};
}

// The naive per-request recurrence over one state vector of H values per slot: h starts from the
// slot (if the request has context) or zeros, then for each token `update(h, x)` and its row is h.
struct NaiveRun {
  Matrix rows;                                    // [num_actual_tokens, H]
  std::map<int64_t, std::vector<double>> states;  // slot → state after the step (float64)
};
NaiveRun naive_per_request(const std::vector<StepRequest>& requests, const Tensor& pool,
                           const std::function<void(std::vector<double>& h, const std::vector<double>& x)>& update) {
  NaiveRun run;
  int64_t total = 0;
  for (const StepRequest& request : requests) total += request.hidden.rows();
  const int64_t H = requests.front().hidden.cols();
  run.rows = Matrix::Zero(total, H);
  int64_t row = 0;
  for (const StepRequest& request : requests) {
    const int64_t slot = request.slots[0];
    std::vector<double> h(static_cast<size_t>(H), 0.0);
    if (request.context_len > 0) {
      for (int64_t j = 0; j < H; ++j)
        h[static_cast<size_t>(j)] = load_as_double(pool.data(), pool.dtype(), slot * H + j);
    }
    for (int64_t i = 0; i < request.hidden.rows(); ++i, ++row) {
      std::vector<double> x(static_cast<size_t>(H));
      for (int64_t j = 0; j < H; ++j) x[static_cast<size_t>(j)] = request.hidden(i, j);
      update(h, x);
      for (int64_t j = 0; j < H; ++j) run.rows(row, j) = h[static_cast<size_t>(j)];
    }
    run.states[slot] = h;
  }
  return run;
}

// Checks a per-request mode with one `state` pool of H values per slot against naive_per_request.
void expect_matches_naive(const std::string& mode_name, const std::map<std::string, Tensor>& weights_override,
                          const std::function<void(std::vector<double>& h, const std::vector<double>& x,
                                                   const std::map<std::string, Tensor>& weights)>& update) {
  const AttentionConfig c = ssm_config(mode_name);
  const int64_t H = hidden_size(c);
  ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 8, 31);
  for (const auto& [name, weight] : weights_override) random.weights[name] = weight;
  const std::vector<StepRequest> requests = mixed_requests(H);
  Pools pools = clone_pools(random.ssm_state);
  const Tensor out = run_step(c, make_step(c, requests, {.padding_requests = 1, .padding_tokens = 2}), pools,
                              random.weights, {.padding_requests = 1, .padding_tokens = 2});
  const NaiveRun naive =
      naive_per_request(requests, random.ssm_state.at("state"),
                        [&](std::vector<double>& h, const std::vector<double>& x) { update(h, x, random.weights); });
  expect_close(token_rows(out, 0, naive.rows.rows()), naive.rows, mode_tolerance(mode_named(mode_name), c, 17),
               mode_name + " rows against the naive loop");
  // The stored state is the mode's float64 state rounded once to the pool's float32: within half an
  // ulp (u_float32·|h|) of the naive state, up to the float64 tolerance.
  const Tensor& pool = pools.at("state");
  const Tolerance rows = mode_tolerance(mode_named(mode_name), c, 17);
  const Tolerance stored{rows.atol, rows.rtol + unit_roundoff(DType::kFloat32),
                         rows.rationale + ", plus one rounding to float32"};
  for (const auto& [slot, h] : naive.states) {
    Eigen::VectorXd actual(H);
    Eigen::VectorXd expected(H);
    for (int64_t j = 0; j < H; ++j) {
      actual[j] = load_as_double(pool.data(), pool.dtype(), slot * H + j);
      expected[j] = h[static_cast<size_t>(j)];
    }
    expect_close(actual, expected, stored, mode_name + " state stored in slot " + std::to_string(slot));
  }
}

// --- the registry ------------------------------------------------------------------------------------

TEST(SsmModeRegistry, ListsEveryBuiltInModeOnce) {
  const std::vector<std::string> names = ssm::ModeRegistry::instance().names();
  const std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size());
  for (const char* name : {"zero", "prefix_sum_flat", "prefix_sum", "ema"}) {
    EXPECT_TRUE(unique.count(name)) << name;
    EXPECT_EQ(ssm::ModeRegistry::instance().find(name).name(), name);
  }
  EXPECT_FALSE(ssm::ModeRegistry::instance().contains("none")) << "\"none\" is the layer without an SSM branch";
}

TEST(SsmModeRegistry, UnknownNameListsTheKnownModes) {
  const std::string message = error_of([] { ssm::ModeRegistry::instance().find("prefix-sum"); });
  EXPECT_THAT(message, HasSubstr("unknown /config ssm_mode 'prefix-sum'"));
  for (const std::string& name : ssm::ModeRegistry::instance().names()) EXPECT_THAT(message, HasSubstr(name));
}

TEST(SsmModeRegistry, RejectsDuplicateNamesAndNone) {
  add_test_mode_spec("a");
  ssm::ModeRegistry registry;  // a private one: the global registry stays as built
  registry.add(std::make_unique<TestMode>("a"));
  EXPECT_THAT(error_of([&] { registry.add(std::make_unique<TestMode>("a")); }), HasSubstr("registered twice"));
  EXPECT_THAT(error_of([&] { registry.add(std::make_unique<TestMode>("none")); }), HasSubstr("invalid ssm_mode name"));
  EXPECT_EQ(registry.names(), std::vector<std::string>{"a"});
}

TEST(SsmModeRegistry, EveryModeHasADescriptorAndTheMathNeedsOne) {
  const auto& specs = spec::ssm::ModeSpecRegistry::instance();
  for (const std::string& name : ssm::ModeRegistry::instance().names()) {
    EXPECT_TRUE(specs.contains(name)) << name;
    EXPECT_EQ(&mode_named(name).spec(), &specs.find(name)) << name;
  }
  ssm::ModeRegistry registry;
  EXPECT_THAT(error_of([&] { registry.add(std::make_unique<TestMode>("test_without_descriptor")); }),
              HasSubstr("has no descriptor"));
  EXPECT_THAT(error_of([] { spec::ssm::ModeSpecRegistry::instance().find("prefix-sum"); }),
              HasSubstr("unknown /config ssm_mode 'prefix-sum'"));
}

// --- zero ----------------------------------------------------------------------------------------

TEST(SsmZeroMode, ContributesZerosAndTakesNoTensors) {
  const AttentionConfig c = ssm_config("zero");
  const ssm::ModeShape shape = ssm::mode_shape(c);
  EXPECT_TRUE(mode_named("zero").state_specs(shape).empty());
  EXPECT_TRUE(mode_named("zero").weight_specs(shape).empty());
  Pools none;
  const BatchFile step = make_step(c, mixed_requests(hidden_size(c)));
  const Tensor out = run_step(c, step, none, {});
  expect_close(token_rows(out, 0, step.batch.num_actual_tokens),
               Matrix::Zero(step.batch.num_actual_tokens, hidden_size(c)), exact_tolerance(), "zero mode rows");

  AttentionConfig speculative = c;  // whole steps: works with speculative decoding too
  speculative.num_speculative_tokens = 2;
  const BatchFile prefill = make_step(speculative, {{random_hidden(4, hidden_size(c), 306), 0, {1, 2, 3}}});
  EXPECT_NO_THROW(run_step(speculative, prefill, none, {}));
}

// --- prefix_sum_flat (the seed prototype's rule) -------------------------------------------------

// The prototype's decode branch, literally: out = zeros; out[:n] = cumsum(hidden[:n], dim=0) with
// n = num_decode_tokens, over the flattened token axis.
Matrix seed_prefix_sum(const BatchFile& step, int64_t num_decode_tokens, int64_t H) {
  const int64_t T = step.batch.num_actual_tokens;
  Matrix out = Matrix::Zero(T, H);
  const Tensor& query = step.inputs.query;
  for (int64_t j = 0; j < H; ++j) {
    double running = 0.0;
    for (int64_t t = 0; t < num_decode_tokens; ++t) {
      running += load_as_double(query.data(), query.dtype(), t * H + j);
      out(t, j) = running;
    }
  }
  return out;
}

TEST(SsmPrefixSumFlatMode, ReproducesTheSeedsFlattenedCumsumAcrossRequests) {
  const AttentionConfig c = ssm_config("prefix_sum_flat");
  const int64_t H = hidden_size(c);
  const ssm::ModeShape shape = ssm::mode_shape(c);
  EXPECT_TRUE(mode_named("prefix_sum_flat").state_specs(shape).empty()) << "the seed's rule keeps no state";
  EXPECT_TRUE(mode_named("prefix_sum_flat").weight_specs(shape).empty());
  Pools none;

  // Mixed: three decodes (one per request) then two prefills. n = num_decode_tokens = 3.
  const BatchFile mixed = make_step(c, mixed_requests(H), {.padding_tokens = 2});
  ASSERT_EQ(spec::build_mamba_metadata(c, {}, mixed.batch).num_decode_tokens, 3);
  const Tensor out = run_step(c, mixed, none, {});
  const Matrix got = token_rows(out, 0, mixed.batch.num_actual_tokens);
  expect_close(got, seed_prefix_sum(mixed, 3, H), mode_tolerance(mode_named("prefix_sum_flat"), c, 3),
               "prefix_sum_flat, mixed batch");
  // Crossing request boundaries: the third request's row sums all three requests' tokens.
  const Matrix x = token_rows(mixed.inputs.query, 0, 3);
  expect_close(Matrix(got.row(2)), Matrix(x.row(0) + x.row(1) + x.row(2)),
               mode_tolerance(mode_named("prefix_sum_flat"), c, 3),
               "prefix_sum_flat row 2 = tokens of requests 0, 1 and 2");
  // Prefill tokens get zero.
  expect_close(Matrix(got.bottomRows(got.rows() - 3)), Matrix::Zero(got.rows() - 3, H), exact_tolerance(),
               "prefix_sum_flat prefill rows");

  // No state: the same step again gives the same rows (nothing carried over).
  const Tensor again = run_step(c, mixed, none, {});
  EXPECT_TRUE(bitwise_equal(out, again));

  // Decode-only: every token is in the cumsum. Prefill-only: nothing is.
  const BatchFile decodes = make_step(c, {{random_hidden(1, H, 311), 3, {1}},
                                          {random_hidden(1, H, 312), 9, {2}},
                                          {random_hidden(1, H, 313), 1, {3}},
                                          {random_hidden(1, H, 314), 20, {4}}});
  expect_close(token_rows(run_step(c, decodes, none, {}), 0, 4), seed_prefix_sum(decodes, 4, H),
               mode_tolerance(mode_named("prefix_sum_flat"), c, 4), "prefix_sum_flat, decode-only batch");
  const BatchFile prefills = make_step(c, {{random_hidden(5, H, 315), 0, {1}}, {random_hidden(3, H, 316), 4, {2}}});
  expect_close(token_rows(run_step(c, prefills, none, {}), 0, 8), Matrix::Zero(8, H), exact_tolerance(),
               "prefix_sum_flat, prefill-only batch");
}

// --- prefix_sum -------------------------------------------------------------------------------------

TEST(SsmPrefixSumMode, StatePoolIsTheQueryHeadLayout) {
  const AttentionConfig c = ssm_config("prefix_sum");
  const std::vector<ssm::TensorSpec> pools = mode_named("prefix_sum").state_specs(ssm::mode_shape(c));
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].name, "state");
  EXPECT_EQ(pools[0].shape, (Shape{c.num_heads, c.head_size}));
  EXPECT_EQ(pools[0].dtype, DType::kFloat32);
  EXPECT_TRUE(mode_named("prefix_sum").weight_specs(ssm::mode_shape(c)).empty());
}

TEST(SsmPrefixSumMode, MatchesANaivePerRequestRunningSum) {
  expect_matches_naive(
      "prefix_sum", {},
      [](std::vector<double>& h, const std::vector<double>& x, const std::map<std::string, Tensor>& /*weights*/) {
        for (size_t j = 0; j < h.size(); ++j) h[j] += x[j];
      });
}

// --- ema (the guide's example mode) --------------------------------------------------------------

TEST(SsmEmaMode, MatchesANaiveExponentialMovingAverage) {
  expect_matches_naive(
      "ema", {},
      [](std::vector<double>& h, const std::vector<double>& x, const std::map<std::string, Tensor>& weights) {
        const Tensor& a = weights.at("a");
        for (size_t j = 0; j < h.size(); ++j) {
          const double aj = load_as_double(a.data(), a.dtype(), static_cast<int64_t>(j));
          h[j] = aj * h[j] + (1.0 - aj) * x[j];
        }
      });
}

TEST(SsmEmaMode, DecayIsDrawnInItsDocumentedRange) {
  const AttentionConfig c = ssm_config("ema");
  const Tensor a = ssm::make_random_ssm_tensors(c, 2, 32).weights.at("a");
  ASSERT_EQ(a.shape(), (Shape{hidden_size(c)}));
  for (int64_t j = 0; j < a.numel(); ++j) {
    const double v = load_as_double(a.data(), a.dtype(), j);
    EXPECT_TRUE(0.5 <= v && v <= 0.99) << "a[" << j << "] = " << v;
  }
}

}  // namespace
}  // namespace hybridtb::testing
