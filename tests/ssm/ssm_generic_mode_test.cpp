// The suite every registered SSM mode goes through: one instance per name in
// ModeRegistry::names(), none left out, so a new mode joins by being registered. Each test runs
// the driver (ssm_forward) on synthetic steps built with make_synthetic_batch, seeded random
// tensors (make_random_ssm_tensors) and the reference Mamba builder:
//   - specs and random tensors are consistent and seeded;
//   - chunked prefill at any split, then decode steps == one-shot prefill (rows and final state);
//   - a mixed batch == each request run alone with its own copy of the pools (bit for bit);
//   - padding (padding requests, CUDA-graph padding rows and decode batches, PAD_SLOT_ID state
//     indices) writes nothing: pools byte-equal outside the touched slots, NaN rows stay NaN;
//   - mamba_cache_mode all: block-boundary and final states == the states of the prefix run alone,
//     and a prefix-cache hit reads its initial state from block_idx_last_computed_token;
//   - mamba_cache_mode align == none on the slot of the block holding the last token;
//   - bad input (missing or misshapen tensors, typos, slots out of range) fails with the item named
//     and changes no state; speculative decoding is NotSupported.
// Modes that run whole steps (forward_whole_step: zero, prefix_sum_flat) skip the per-request
// relations, with the reason printed; their own rules are checked in ssm_simple_modes_test.
// Run: ctest --test-dir <build> -L ssm
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/reference/ssm_mode.h"
#include "ssm_test_support.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;
using ::testing::HasSubstr;

constexpr const char* kWholeStepReason =
    " runs whole steps (forward_whole_step): per-request relations do not apply to it; its own rule is "
    "checked by ssm_simple_modes_test";

class SsmModeSuite : public ::testing::TestWithParam<std::string> {
 protected:
  const ssm::Mode& mode() const { return mode_named(GetParam()); }
  AttentionConfig config(MambaCacheMode cache_mode = MambaCacheMode::kNone, int64_t mamba_block_size = 0) const {
    return ssm_config(GetParam(), cache_mode, mamba_block_size);
  }
  int64_t H() const { return hidden_size(config()); }
  bool has_pools() const { return !mode().state_specs(ssm::mode_shape(config())).empty(); }
};

std::map<std::string, TensorView> views(const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, TensorView> out;
  for (const auto& [name, tensor] : tensors) out[name] = tensor;
  return out;
}

// --- specs and random tensors --------------------------------------------------------------------

TEST_P(SsmModeSuite, SpecsAndRandomTensorsAreConsistent) {
  const AttentionConfig c = config();
  const ssm::ModeShape shape = ssm::mode_shape(c);
  EXPECT_EQ(mode().name(), GetParam());
  EXPECT_FALSE(mode().description().empty());
  for (const auto& specs : {mode().weight_specs(shape), mode().state_specs(shape)}) {
    std::set<std::string> names;
    for (const ssm::TensorSpec& spec : specs) {
      EXPECT_TRUE(names.insert(spec.name).second) << "duplicate tensor name " << spec.name;
      EXPECT_TRUE(is_floating(spec.dtype)) << spec.name;
      EXPECT_FALSE(spec.meaning.empty()) << spec.name << " needs a one-line meaning";
      for (int64_t dim : spec.shape) EXPECT_GT(dim, 0) << spec.name << " " << shape_to_string(spec.shape);
    }
  }

  const ssm::RandomSsmTensors a = ssm::make_random_ssm_tensors(c, 5, 7);
  const ssm::RandomSsmTensors b = ssm::make_random_ssm_tensors(c, 5, 7);
  const ssm::RandomSsmTensors other = ssm::make_random_ssm_tensors(c, 5, 8);
  EXPECT_NO_THROW(ssm::validate_ssm_tensors(c, views(a.ssm_state), views(a.weights)));
  EXPECT_EQ(a.weights.size(), mode().weight_specs(shape).size()) << "optional weights are generated too";
  bool any_differs = false;
  for (const auto& [group, specs, tensors, twins, others] :
       {std::tuple{"weight", mode().weight_specs(shape), &a.weights, &b.weights, &other.weights},
        std::tuple{"pool", mode().state_specs(shape), &a.ssm_state, &b.ssm_state, &other.ssm_state}}) {
    for (const ssm::TensorSpec& spec : specs) {
      const Tensor& t = tensors->at(spec.name);
      Shape expected = spec.shape;
      if (std::string(group) == "pool") expected.insert(expected.begin(), 5);
      EXPECT_EQ(t.shape(), expected) << group << " " << spec.name;
      EXPECT_EQ(t.dtype(), spec.dtype) << group << " " << spec.name;
      EXPECT_TRUE(bitwise_equal(t, twins->at(spec.name))) << group << " " << spec.name << " is not seeded";
      any_differs = any_differs || !bitwise_equal(t, others->at(spec.name));
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double v = load_as_double(t.data(), t.dtype(), i);
        ASSERT_TRUE(std::isfinite(v)) << group << " " << spec.name << "[" << i << "]";
        if (spec.init_low < spec.init_high) {
          // Rounding to the dtype may land on the upper bound.
          ASSERT_TRUE(spec.init_low <= v && v <= spec.init_high)
              << group << " " << spec.name << "[" << i << "] = " << v;
        }
      }
    }
  }
  if (!a.weights.empty() || !a.ssm_state.empty()) {
    EXPECT_TRUE(any_differs) << "another seed gives the same tensors";
  }
}

// --- chunked prefill + decodes == one-shot -------------------------------------------------------

TEST_P(SsmModeSuite, ChunkedPrefillThenDecodesEqualsOneShotPrefill) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  const AttentionConfig c = config();
  constexpr int64_t kTokens = 40;   // all of them
  constexpr int64_t kPrefill = 37;  // then 3 decode steps
  constexpr int32_t kSlot = 2;
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 4, 11);
  // Float64 pools: the states stored between steps are then exact, and the only differences left
  // are float64 rounding orders (what kSsmModeFloat64 bounds).
  const Pools initial = convert_pools(random.ssm_state, DType::kFloat64);
  const Matrix hidden = random_hidden(kTokens, H(), 21);
  const Tolerance tolerance = mode_tolerance(mode(), c, kTokens);

  Pools one_shot = clone_pools(initial);
  const Tensor out = run_step(c, make_step(c, {{hidden, 0, {kSlot}}}), one_shot, random.weights);
  const Matrix expected = token_rows(out, 0, kTokens);

  // Chunk ends: fixed awkward ones (a one-token first chunk is a decode without context), then seeded random ones.
  std::vector<std::vector<int64_t>> patterns{{1, kPrefill}, {2, 3, kPrefill}, {16, kPrefill}, {36, kPrefill}};
  std::mt19937_64 rng(5);
  for (int p = 0; p < 4; ++p) {
    std::set<int64_t> ends{kPrefill};
    const int64_t cuts = 1 + static_cast<int64_t>(rng() % 3);
    while (std::ssize(ends) < cuts + 1) ends.insert(1 + static_cast<int64_t>(rng() % (kPrefill - 1)));
    patterns.emplace_back(ends.begin(), ends.end());
  }
  for (const std::vector<int64_t>& ends : patterns) {
    std::string name = "chunks ending at";
    for (int64_t end : ends) name.append(" ").append(std::to_string(end));
    name += ", then 3 decodes";
    SCOPED_TRACE(name);
    Pools pools = clone_pools(initial);
    Matrix got(kTokens, H());
    int64_t begin = 0;
    std::vector<int64_t> steps = ends;
    for (int64_t t = kPrefill + 1; t <= kTokens; ++t) steps.push_back(t);
    for (int64_t end : steps) {
      const BatchFile step =
          make_step(c, {{hidden.middleRows(begin, end - begin), begin, {kSlot}}}, {.seed = static_cast<uint64_t>(end)});
      got.middleRows(begin, end - begin) = token_rows(run_step(c, step, pools, random.weights), 0, end - begin);
      begin = end;
    }
    expect_close(got, expected, tolerance, GetParam() + " contribution rows, " + name);
    for (const auto& [pool_name, pool] : pools) {
      expect_close(slot_values(pool, kSlot), slot_values(one_shot.at(pool_name), kSlot), tolerance,
                   GetParam() + " final state " + pool_name + ", " + name);
    }
    for (int64_t slot = 0; slot < num_slots(pools); ++slot) {
      if (slot != kSlot) {
        EXPECT_TRUE(same_slot_bytes(pools, initial, slot)) << "slot " << slot << " was written";
      }
    }
  }
}

// --- mixed batch == each request alone -----------------------------------------------------------

// Decodes first (one of them without context), then a continued and a fresh prefill; distinct slots.
std::vector<StepRequest> mixed_requests(int64_t H) {
  return {{random_hidden(1, H, 101), 7, {3}},
          {random_hidden(1, H, 102), 30, {5}},
          {random_hidden(1, H, 103), 0, {1}},
          {random_hidden(9, H, 104), 12, {6}},
          {random_hidden(17, H, 105), 0, {2}}};
}

TEST_P(SsmModeSuite, MixedBatchEqualsEachRequestAlone) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  const AttentionConfig c = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 8, 12);
  const std::vector<StepRequest> requests = mixed_requests(H());
  Pools mixed = clone_pools(random.ssm_state);
  const BatchFile step = make_step(c, requests);
  const Tensor out = run_step(c, step, mixed, random.weights);

  std::set<int64_t> owned;
  for (size_t k = 0; k < requests.size(); ++k) {
    const StepRequest& request = requests[k];
    SCOPED_TRACE("request " + std::to_string(k));
    Pools alone = clone_pools(random.ssm_state);
    const Tensor alone_out = run_step(c, make_step(c, {request}), alone, random.weights);
    const int64_t begin = step.batch.query_start_loc[static_cast<int64_t>(k)];
    expect_close(token_rows(out, begin, begin + request.hidden.rows()), token_rows(alone_out, 0, request.hidden.rows()),
                 exact_tolerance(), GetParam() + " rows of request " + std::to_string(k));
    const int64_t slot = request.slots[0];
    owned.insert(slot);
    EXPECT_TRUE(same_slot_bytes(mixed, alone, slot)) << "slot " << slot << " of request " << k;
  }
  for (int64_t slot = 0; slot < num_slots(mixed); ++slot) {
    if (!owned.count(slot)) {
      EXPECT_TRUE(same_slot_bytes(mixed, random.ssm_state, slot)) << "slot " << slot;
    }
  }
}

TEST_P(SsmModeSuite, RequestWithoutContextIgnoresWhatItsSlotHolds) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  if (!has_pools()) GTEST_SKIP() << GetParam() << " keeps no state";
  const AttentionConfig c = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 4, 13);
  const ssm::RandomSsmTensors garbage = ssm::make_random_ssm_tensors(c, 4, 14);
  // A one-token request without context is split as a decode; a longer one is a prefill.
  for (const int64_t tokens : {1, 6}) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens");
    const BatchFile step = make_step(c, {{random_hidden(tokens, H(), 15), 0, {1}}});
    Pools a = clone_pools(random.ssm_state);
    Pools b = clone_pools(garbage.ssm_state);
    const Tensor out_a = run_step(c, step, a, random.weights);
    const Tensor out_b = run_step(c, step, b, random.weights);
    expect_close(token_rows(out_a, 0, tokens), token_rows(out_b, 0, tokens), exact_tolerance(),
                 GetParam() + " rows from two different stale slots");
    EXPECT_TRUE(same_slot_bytes(a, b, 1)) << "the state written must not depend on the stale slot";
  }
}

// --- padding -------------------------------------------------------------------------------------

// Runs `requests` with and without the padding of `padded` (builder settings included): rows of
// real tokens and every pool slot must be identical, padding rows keep their NaN, and only the
// requests' own slots may change.
void expect_padding_changes_nothing(const std::string& mode_name, const AttentionConfig& c,
                                    const std::vector<StepRequest>& requests, const StepOptions& padded) {
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 8, 16);
  Pools plain_pools = clone_pools(random.ssm_state);
  const BatchFile plain = make_step(c, requests, {.builder = padded.builder});
  const Tensor plain_out = run_step(c, plain, plain_pools, random.weights, {.builder = padded.builder});
  Pools pools = clone_pools(random.ssm_state);
  const BatchFile step = make_step(c, requests, padded);
  const Tensor out = run_step(c, step, pools, random.weights, padded);

  const int64_t actual = step.batch.num_actual_tokens;
  ASSERT_EQ(actual, plain.batch.num_actual_tokens);
  ASSERT_GT(step.batch.num_tokens(), actual) << "the step must have padding rows";
  expect_close(token_rows(out, 0, actual), token_rows(plain_out, 0, actual), exact_tolerance(),
               mode_name + " rows of real tokens");
  Tensor sentinel = Tensor::host(out.dtype(), out.shape());
  fill_host(sentinel, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(
      bitwise_equal(out.view().slice_rows(actual, out.size(0)), sentinel.view().slice_rows(actual, out.size(0))))
      << "rows at or past num_actual_tokens were written";
  std::set<int64_t> owned;
  for (const StepRequest& request : requests) owned.insert(request.slots.begin(), request.slots.end());
  for (int64_t slot = 0; slot < num_slots(pools); ++slot) {
    EXPECT_TRUE(same_slot_bytes(pools, plain_pools, slot)) << "slot " << slot << " differs from the unpadded run";
    if (!owned.count(slot)) {
      EXPECT_TRUE(same_slot_bytes(pools, random.ssm_state, slot)) << "slot " << slot << " was written";
    }
  }
}

TEST_P(SsmModeSuite, PaddingRequestsAndRowsWriteNothing) {
  const std::vector<StepRequest> requests{
      {random_hidden(1, H(), 201), 9, {3}}, {random_hidden(6, H(), 202), 5, {5}}, {random_hidden(4, H(), 203), 0, {1}}};
  expect_padding_changes_nothing(GetParam(), config(), requests, {.padding_requests = 2, .padding_tokens = 3});
}

TEST_P(SsmModeSuite, CudaGraphPaddedDecodeBatchWritesNothing) {
  const std::vector<StepRequest> requests{{random_hidden(1, H(), 211), 4, {3}},
                                          {random_hidden(1, H(), 212), 17, {5}},
                                          {random_hidden(1, H(), 213), 2, {6}}};
  StepOptions padded{.padding_requests = 1, .padding_tokens = 1};
  padded.builder.cudagraph_mode = CudaGraphMode::kFull;
  padded.builder.cudagraph_capture_sizes = {4, 8};
  const AttentionConfig c = config();
  const BatchFile step = make_step(c, requests, padded);
  ASSERT_EQ(spec::build_mamba_metadata(c, padded.builder, step.batch).cudagraph_padded, 1)
      << "the batch must take the decode-only full-CUDA-graph path";
  expect_padding_changes_nothing(GetParam(), c, requests, padded);
}

TEST_P(SsmModeSuite, PadSlotRequestIsSkipped) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  const AttentionConfig c = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 6, 17);
  // A decode and a prefill whose state index is PAD_SLOT_ID, between two live requests.
  const std::vector<StepRequest> requests{{random_hidden(1, H(), 221), 9, {3}},
                                          {random_hidden(1, H(), 222), 4, {kPadSlotId}},
                                          {random_hidden(5, H(), 223), 0, {kPadSlotId}},
                                          {random_hidden(4, H(), 224), 2, {1}}};
  Pools pools = clone_pools(random.ssm_state);
  const BatchFile step = make_step(c, requests);
  const Tensor out = run_step(c, step, pools, random.weights);
  for (const int64_t skipped : {1, 2}) {
    const int64_t begin = step.batch.query_start_loc[skipped];
    const int64_t end = step.batch.query_start_loc[skipped + 1];
    expect_close(token_rows(out, begin, end), Matrix::Zero(end - begin, H()), exact_tolerance(),
                 GetParam() + " rows of the PAD_SLOT_ID request " + std::to_string(skipped));
  }
  for (const int64_t live : {0, 3}) {
    Pools alone = clone_pools(random.ssm_state);
    const StepRequest& request = requests[static_cast<size_t>(live)];
    const Tensor alone_out = run_step(c, make_step(c, {request}), alone, random.weights);
    const int64_t begin = step.batch.query_start_loc[live];
    expect_close(token_rows(out, begin, begin + request.hidden.rows()), token_rows(alone_out, 0, request.hidden.rows()),
                 exact_tolerance(), GetParam() + " rows of live request " + std::to_string(live));
  }
  for (int64_t slot = 0; slot < num_slots(pools); ++slot) {
    if (slot != 3 && slot != 1) {
      EXPECT_TRUE(same_slot_bytes(pools, random.ssm_state, slot)) << "slot " << slot;
    }
  }
}

// --- prefix caching (mamba_cache_mode all) and align ----------------------------------------------

TEST_P(SsmModeSuite, PrefixCachingWritesBlockStatesAndReadsTheLastComputedBlock) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  if (!has_pools()) GTEST_SKIP() << GetParam() << " keeps no state to cache";
  constexpr int64_t kBlock = 16;
  const AttentionConfig all = config(MambaCacheMode::kAll, kBlock);
  const AttentionConfig none = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(all, 12, 18);
  const Pools initial = convert_pools(random.ssm_state, DType::kFloat64);
  const Matrix hidden = random_hidden(51, H(), 231);
  const std::vector<int32_t> row{1, 2, 3, 4};  // state blocks of positions [0, 16), [16, 32), …

  // The states after the first k tokens, each prefix run alone (mode none, fresh slot 11).
  const auto prefix_state = [&](int64_t k) {
    Pools pools = clone_pools(initial);
    run_step(none, make_step(none, {{hidden.topRows(k), 0, {11}}}), pools, random.weights);
    std::map<std::string, Eigen::VectorXd> state;
    for (const auto& [name, pool] : pools) state[name] = slot_values(pool, 11);
    return state;
  };
  const auto expect_slot_holds = [&](const Pools& pools, int32_t slot, int64_t k, const std::string& when) {
    for (const auto& [name, values] : prefix_state(k)) {
      expect_close(slot_values(pools.at(name), slot), values, mode_tolerance(mode(), all, k),
                   GetParam() + " " + when + ": slot " + std::to_string(slot) + " (" + name +
                       ") must hold the state after " + std::to_string(k) + " tokens");
    }
  };

  Pools pools = clone_pools(initial);
  Matrix got(51, H());
  // Step 1: positions [0, 21): block boundary after position 15, final state in block 1.
  got.topRows(21) =
      token_rows(run_step(all, make_step(all, {{hidden.topRows(21), 0, row}}), pools, random.weights), 0, 21);
  expect_slot_holds(pools, 1, 16, "after step 1");
  expect_slot_holds(pools, 2, 21, "after step 1");
  // Step 2: positions [21, 50): starts from block 1; boundaries after 31 and 47; final state in block 3.
  got.middleRows(21, 29) =
      token_rows(run_step(all, make_step(all, {{hidden.middleRows(21, 29), 21, row}}), pools, random.weights), 0, 29);
  expect_slot_holds(pools, 1, 16, "after step 2");
  expect_slot_holds(pools, 2, 32, "after step 2");
  expect_slot_holds(pools, 3, 48, "after step 2");
  expect_slot_holds(pools, 4, 50, "after step 2");
  const Pools after_step_2 = clone_pools(pools);
  // Step 3: a decode at position 50, reading and writing block 3.
  got.bottomRows(1) =
      token_rows(run_step(all, make_step(all, {{hidden.bottomRows(1), 50, row}}), pools, random.weights), 0, 1);
  expect_slot_holds(pools, 4, 51, "after the decode");

  Pools one_shot = clone_pools(initial);
  const Tensor expected = run_step(none, make_step(none, {{hidden, 0, {11}}}), one_shot, random.weights);
  expect_close(got, token_rows(expected, 0, 51), mode_tolerance(mode(), all, 51), GetParam() + " rows in mode all");

  // A prefix-cache hit: a new request shares the first 32 tokens (state blocks 0 and 1: slots 1, 2),
  // owns blocks 2 and 3 (slots 9, 10), and computes positions [32, 45) from the state cached in
  // slot 2 (block_idx_last_computed_token = 1); its final state goes to block 2 (slot 9).
  Pools hit_pools = clone_pools(after_step_2);
  const Matrix tail = random_hidden(13, H(), 232);
  const Tensor hit = run_step(all, make_step(all, {{tail, 32, {1, 2, 9, 10}}}), hit_pools, random.weights);
  Pools reference_pools = clone_pools(initial);
  const Tensor reference =
      run_step(none, make_step(none, {{stack(hidden.topRows(32), tail), 0, {11}}}), reference_pools, random.weights);
  expect_close(token_rows(hit, 0, 13), token_rows(reference, 32, 45), mode_tolerance(mode(), all, 45),
               GetParam() + " rows of the prefix-cache hit");
  for (const auto& [name, pool] : hit_pools) {
    expect_close(slot_values(pool, 9), slot_values(reference_pools.at(name), 11), mode_tolerance(mode(), all, 45),
                 GetParam() + " final state of the prefix-cache hit in block 2 (slot 9), " + name);
  }
  for (int64_t slot = 0; slot < num_slots(hit_pools); ++slot) {
    if (slot != 9) {
      EXPECT_TRUE(same_slot_bytes(hit_pools, after_step_2, slot)) << "the hit wrote slot " << slot;
    }
  }
}

TEST_P(SsmModeSuite, AlignModeUsesTheBlockOfTheLastToken) {
  if (runs_whole_steps(mode())) GTEST_SKIP() << GetParam() << kWholeStepReason;
  constexpr int64_t kBlock = 16;
  const AttentionConfig align = config(MambaCacheMode::kAlign, kBlock);
  const AttentionConfig none = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(align, 8, 19);
  // A decode at position 20 and a fresh 20-token prefill: both last tokens sit in block 1.
  const std::vector<StepRequest> aligned{{random_hidden(1, H(), 241), 20, {4, 6}},
                                         {random_hidden(20, H(), 242), 0, {2, 5}}};
  const std::vector<StepRequest> plain{{aligned[0].hidden, 20, {6}}, {aligned[1].hidden, 0, {5}}};
  Pools a = clone_pools(random.ssm_state);
  Pools b = clone_pools(random.ssm_state);
  const Tensor out_a = run_step(align, make_step(align, aligned), a, random.weights);
  const Tensor out_b = run_step(none, make_step(none, plain), b, random.weights);
  expect_close(token_rows(out_a, 0, 21), token_rows(out_b, 0, 21), exact_tolerance(),
               GetParam() + " rows in mode align");
  for (int64_t slot = 0; slot < num_slots(a); ++slot) EXPECT_TRUE(same_slot_bytes(a, b, slot)) << "slot " << slot;
}

// --- dtypes ----------------------------------------------------------------------------------------

TEST_P(SsmModeSuite, ContributionIsRoundedOnceToItsDtype) {
  const AttentionConfig c = config();
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 8, 20);
  const BatchFile step = make_step(c, mixed_requests(H()));
  Pools p64 = clone_pools(random.ssm_state);
  const Tensor out64 = run_step(c, step, p64, random.weights);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    Pools pools = clone_pools(random.ssm_state);
    const Tensor out = run_step(c, step, pools, random.weights, {}, dtype);
    EXPECT_TRUE(bitwise_equal(out, convert_host(out64, dtype))) << "not the float64 result rounded once";
    for (int64_t slot = 0; slot < num_slots(pools); ++slot) EXPECT_TRUE(same_slot_bytes(pools, p64, slot));
  }
}

// --- bad input ----------------------------------------------------------------------------------

TEST_P(SsmModeSuite, BadInputIsRejectedWithTheItemNamedAndNoStateChanged) {
  const AttentionConfig c = config();
  const ssm::ModeShape shape = ssm::mode_shape(c);
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 6, 21);
  const std::vector<StepRequest> requests{{random_hidden(1, H(), 251), 3, {1}}, {random_hidden(5, H(), 252), 0, {2}}};
  const BatchFile good_step = make_step(c, requests);
  // Runs one variation; the pools must come out unchanged when it fails.
  const auto attempt = [&](const AttentionConfig& cfg, const Pools& pools, const std::map<std::string, Tensor>& weights,
                           const BatchFile& step) {
    Pools copy = clone_pools(pools);
    const std::string message = error_of([&] { run_step(cfg, step, copy, weights); });
    if (!message.empty()) {
      for (const auto& [name, pool] : copy) EXPECT_TRUE(bitwise_equal(pool, pools.at(name))) << message;
    }
    return message;
  };
  ASSERT_EQ(attempt(c, random.ssm_state, random.weights, good_step), "");

  AttentionConfig unknown = c;
  unknown.ssm_mode = "no_such_mode";
  const std::string unknown_message = attempt(unknown, random.ssm_state, random.weights, good_step);
  EXPECT_THAT(unknown_message, HasSubstr("no_such_mode"));
  for (const std::string& name : ssm::ModeRegistry::instance().names()) EXPECT_THAT(unknown_message, HasSubstr(name));

  for (const ssm::TensorSpec& spec : mode().weight_specs(shape)) {
    auto weights = random.weights;
    weights.erase(spec.name);
    const std::string missing = attempt(c, random.ssm_state, weights, good_step);
    if (spec.optional) {
      EXPECT_EQ(missing, "") << "optional weight " << spec.name;
    } else {
      EXPECT_THAT(missing, HasSubstr("missing weight /weights/" + spec.name));
    }
    Shape wrong = spec.shape;
    wrong.back() += 1;
    weights[spec.name] = Tensor::host(spec.dtype, wrong);
    EXPECT_THAT(attempt(c, random.ssm_state, weights, good_step), HasSubstr("/weights/" + spec.name + ": shape"));
  }
  auto typo_weights = random.weights;
  typo_weights["typo_weight"] = Tensor::host(DType::kFloat32, {3});
  EXPECT_THAT(attempt(c, random.ssm_state, typo_weights, good_step), HasSubstr("/weights/typo_weight is not a weight"));

  const std::vector<ssm::TensorSpec> pool_specs = mode().state_specs(shape);
  for (const ssm::TensorSpec& spec : pool_specs) {
    Pools pools = random.ssm_state;
    pools.erase(spec.name);
    EXPECT_THAT(attempt(c, pools, random.weights, good_step), HasSubstr("missing state pool /inputs/ssm/" + spec.name));
    Shape wrong = random.ssm_state.at(spec.name).shape();
    wrong.back() += 1;
    pools[spec.name] = Tensor::host(spec.dtype, wrong);
    EXPECT_THAT(attempt(c, pools, random.weights, good_step), HasSubstr("/inputs/ssm/" + spec.name + ": shape"));
    pools[spec.name] = Tensor::host(DType::kInt32, random.ssm_state.at(spec.name).shape());
    EXPECT_THAT(attempt(c, pools, random.weights, good_step), HasSubstr("/inputs/ssm/" + spec.name + ": dtype int32"));
  }
  if (pool_specs.size() >= 2) {
    Pools pools = random.ssm_state;
    const std::string& second = pool_specs[1].name;
    Shape fewer = pools.at(second).shape();
    fewer[0] -= 1;
    pools[second] = Tensor::host(pool_specs[1].dtype, fewer);
    EXPECT_THAT(attempt(c, pools, random.weights, good_step), HasSubstr("/inputs/ssm/" + second + " has 5 slots"));
  }
  Pools typo_pools = clone_pools(random.ssm_state);
  typo_pools["typo_pool"] = Tensor::host(DType::kFloat32, {6, 2});
  EXPECT_THAT(attempt(c, typo_pools, random.weights, good_step),
              HasSubstr("/inputs/ssm/typo_pool is not a state pool"));

  for (const std::string& name : mode().parameters()) {
    AttentionConfig missing = c;
    missing.ssm_params.erase(name);
    EXPECT_THAT(attempt(missing, random.ssm_state, random.weights, good_step), HasSubstr("/config/ssm " + name));
    AttentionConfig zero = c;
    zero.ssm_params[name] = 0;
    EXPECT_THAT(attempt(zero, random.ssm_state, random.weights, good_step), HasSubstr("/config/ssm " + name));
  }
  AttentionConfig typo_param = c;
  typo_param.ssm_params["typo_param"] = 3;
  EXPECT_THAT(attempt(typo_param, random.ssm_state, random.weights, good_step),
              HasSubstr("/config/ssm typo_param = 3 is not a parameter"));

  if (!pool_specs.empty()) {
    // A valid decode comes first: the bad prefill slot must still leave every pool untouched.
    const BatchFile bad_prefill = make_step(c, {requests[0], {requests[1].hidden, 0, {6}}});
    EXPECT_THAT(attempt(c, random.ssm_state, random.weights, bad_prefill),
                HasSubstr("mamba/state_indices_tensor_p[0] = 6 is outside the SSM state pools' 6 slots"));
    const BatchFile bad_decode = make_step(c, {{requests[0].hidden, 3, {9}}, requests[1]});
    EXPECT_THAT(attempt(c, random.ssm_state, random.weights, bad_decode),
                HasSubstr("mamba/state_indices_tensor_d[0][0] = 9 is outside the SSM state pools' 6 slots"));
  }
}

TEST_P(SsmModeSuite, SpeculativeDecodingIsNotSupportedForPerRequestModes) {
  AttentionConfig c = config();
  c.num_speculative_tokens = 1;
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(c, 6, 22);
  // A prefill-only step (decodes would need num_accepted_tokens); two columns: 1 + num_speculative_tokens.
  const BatchFile step = make_step(c, {{random_hidden(5, H(), 261), 0, {1, 2}}});
  Pools pools = clone_pools(random.ssm_state);
  if (runs_whole_steps(mode())) {
    EXPECT_NO_THROW(run_step(c, step, pools, random.weights)) << "a whole-step mode does not look at decodes";
  } else {
    EXPECT_THROW(run_step(c, step, pools, random.weights), NotSupported);
    for (const auto& [name, pool] : pools) EXPECT_TRUE(bitwise_equal(pool, random.ssm_state.at(name)));
  }
}

// Test names are the mode names, with anything but letters, digits and '_' replaced by '_'.
std::string test_name(const ::testing::TestParamInfo<std::string>& param_info) {
  std::string name = param_info.param;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryRegisteredMode, SsmModeSuite, ::testing::ValuesIn(ssm::ModeRegistry::instance().names()),
                         test_name);

}  // namespace
}  // namespace hybridtb::testing
