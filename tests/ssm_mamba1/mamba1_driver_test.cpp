// mamba1 through the registry and the SSM driver (reference::ssm::ssm_forward) on whole synthetic
// batches: decodes, a fresh prefill and a continued chunk side by side, padding requests and
// CUDA-graph padding rows, and prefix caching (mamba_cache_mode all: the initial state read from
// the block of the last computed token, the states at block boundaries and the final state
// written to their blocks). Every request is checked against the independent naive token loop,
// with the expected slots derived here from vLLM's rules (its Mamba prefix-caching modes and state
// indices), not from the driver's plan; every other slot must keep its bytes.
// Run: ctest --test-dir <build> -L mamba1
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "hybridtb/dtype.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/synthetic.h"
#include "mamba1_support.h"

namespace hybridtb::testing {
namespace {

namespace ssm = reference::ssm;

size_t at(int64_t i) { return static_cast<size_t>(i); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// H = 2·32 = 64, I = 24, N = 6, K = 4, R = 3.
const Mamba1Sizes kSizes{64, 24, 6, 4, 3};

AttentionConfig mamba1_config(MambaCacheMode cache_mode, int64_t mamba_block_size) {
  AttentionConfig config;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_size = 32;
  config.block_size = 16;
  config.scale = 1.0 / std::sqrt(32.0);
  config.dtype = DType::kFloat32;
  config.ssm_mode = "mamba1";
  config.ssm_params = mamba1_params(kSizes);
  config.mamba_cache_mode = cache_mode;
  config.mamba_block_size = mamba_block_size;
  return config;
}

// A synthetic batch with its own SSM block table (distinct slots, slot 0 unused), random mamba1
// weights and float64 state pools (so the driver stores the states it computed exactly), the
// driver run on it, and the pools before the run.
struct DriverRun {
  AttentionConfig config;
  BatchFile file;
  MambaAttentionMetadata metadata;
  std::map<std::string, Tensor> weights;
  std::map<std::string, Tensor> pools_before;
  std::map<std::string, Tensor> pools;  // after
  Tensor contribution;                  // [T, Hq, D] float64, NaN before the run
};

DriverRun run_driver(const AttentionConfig& config, const BuilderConfig& builder, const std::vector<RequestSpec>& requests,
                     SyntheticOptions options) {
  DriverRun run;
  run.config = config;
  options.ssm_block_table = true;
  run.file = make_synthetic_batch(config, builder, requests, options);
  run.metadata = spec::build_mamba_metadata(config, builder, run.file.batch);
  const int64_t num_slots = ssm_slots_needed(run.file.batch) + 2;  // two spare slots nobody uses
  const ssm::RandomSsmTensors random = ssm::make_random_ssm_tensors(config, num_slots, options.seed + 17);
  run.weights = random.weights;
  for (const auto& [name, pool] : random.ssm_state) {
    run.pools_before.emplace(name, convert_host(pool, DType::kFloat64));
    run.pools.emplace(name, convert_host(pool, DType::kFloat64));
  }
  StepTensors tensors = run.file.inputs.views();
  tensors.ssm_state = views(run.pools);
  tensors.weights = views(run.weights);
  run.contribution = Tensor::host(DType::kFloat64, tensors.query.shape());
  fill_host(run.contribution, std::numeric_limits<double>::quiet_NaN());
  ssm::ssm_forward(config, run.metadata, run.file.batch, tensors, run.contribution);
  return run;
}

// Query rows [begin, end) flattened ([tokens][Hq·D]), as the driver views them.
std::vector<double> hidden_rows(const BatchFile& file, int64_t begin, int64_t end) {
  const Tensor& query = file.inputs.query;
  const int64_t H = query.size(1) * query.size(2);
  std::vector<double> out(at((end - begin) * H));
  for (int64_t i = 0; i < (end - begin) * H; ++i) {
    out[at(i)] = load_as_double(query.data(), query.dtype(), begin * H + i);
  }
  return out;
}

std::vector<double> contribution_rows(const Tensor& contribution, int64_t begin, int64_t end) {
  const int64_t H = contribution.size(1) * contribution.size(2);
  std::vector<double> out(at((end - begin) * H));
  for (int64_t i = 0; i < (end - begin) * H; ++i) out[at(i)] = contribution.data_as<double>()[begin * H + i];
  return out;
}

bool slot_unchanged(const DriverRun& run, int64_t slot) {
  for (const auto& [name, pool] : run.pools) {
    if (!bitwise_equal(pool.view().slice_rows(slot, slot + 1), run.pools_before.at(name).view().slice_rows(slot, slot + 1))) {
      return false;
    }
  }
  return true;
}

// The expected result of one request, by vLLM's rules, from the naive loop. `read_slot` < 0: no
// initial state (zeros). Writes: (slot, state after the request's token `local index`).
struct Expectation {
  int64_t request = 0;
  int64_t read_slot = -1;
  std::vector<std::pair<int64_t, int64_t>> writes;  // (slot, local token index whose state it holds)
};

// Checks every real request's contribution rows and written slots, that padding rows are still
// NaN, and that every slot nobody writes keeps its bytes.
void check_run(const DriverRun& run, const std::vector<Expectation>& expectations) {
  const BatchDescription& batch = run.file.batch;
  const NaiveMamba1 model = naive_mamba1_model(kSizes, views(run.weights));
  std::set<int64_t> written;
  for (const Expectation& e : expectations) {
    SCOPED_TRACE("request " + std::to_string(e.request));
    const int64_t begin = batch.query_start_loc[e.request];
    const int64_t end = batch.query_start_loc[e.request + 1];
    NaiveMamba1State state = e.read_slot >= 0 ? naive_mamba1_state(views(run.pools_before), e.read_slot)
                                              : zero_state(kSizes);
    const std::vector<double> hidden = hidden_rows(run.file, begin, end);
    std::vector<double> expected;
    std::map<int64_t, NaiveMamba1State> state_after;  // local token index → state after it
    for (int64_t t = 0; t < end - begin; ++t) {
      const std::vector<double> token(hidden.begin() + static_cast<std::ptrdiff_t>(t * kSizes.H),
                                      hidden.begin() + static_cast<std::ptrdiff_t>((t + 1) * kSizes.H));
      const std::vector<double> y = naive_mamba1(model, state, token, 1);
      expected.insert(expected.end(), y.begin(), y.end());
      state_after[t] = state;
    }
    const Tolerance tol = mamba1_tolerance(kSizes, end - begin);
    expect_close(contribution_rows(run.contribution, begin, end), expected, tol, "contribution");
    for (const auto& [slot, t] : e.writes) {
      written.insert(slot);
      expect_state_close(naive_mamba1_state(views(run.pools), slot), state_after.at(t), tol,
                         "slot " + std::to_string(slot) + " (state after local token " + std::to_string(t) + ")");
    }
  }
  for (int64_t row = batch.num_actual_tokens; row < run.contribution.size(0); ++row) {
    for (double v : contribution_rows(run.contribution, row, row + 1)) {
      EXPECT_TRUE(std::isnan(v)) << "padding row " << row << " was written";
    }
  }
  for (int64_t slot = 0; slot < run.pools.begin()->second.size(0); ++slot) {
    if (written.count(slot) == 0) {
      EXPECT_TRUE(slot_unchanged(run, slot)) << "slot " << slot << " was written";
    }
  }
}

TEST(Mamba1Registry, IsRegisteredWithItsParameters) {
  ASSERT_TRUE(ssm::ModeRegistry::instance().contains("mamba1"))
      << "reference/ssm/modes.cpp must register mamba1 (HYBRIDTB_SSM_MODE(registry, mamba1))";
  EXPECT_EQ(ssm::ModeRegistry::instance().find("mamba1").parameters(), mamba1_mode().parameters());
}

TEST(Mamba1Driver, DecodesFreshPrefillContinuedChunkAndPadding) {
  // Mode none: request r's state lives in ssm_block_table[r][0], read (if it has context) and
  // written in place. Two padding requests and three padding rows must write nothing.
  const AttentionConfig config = mamba1_config(MambaCacheMode::kNone, 0);
  SyntheticOptions options;
  options.seed = 11;
  options.padding_requests = 2;
  options.padding_tokens = 3;
  const std::vector<RequestSpec> requests = {{5, 1}, {9, 1}, {6, 5}, {0, 7}, {2, 2}};
  const DriverRun run = run_driver(config, BuilderConfig{}, requests, options);
  ASSERT_EQ(run.metadata.num_decodes, 2);
  ASSERT_EQ(run.metadata.num_prefills, 3 + 2);  // padding requests are counted among prefills here
  const IntArray& table = run.file.batch.state_block_table();
  std::vector<Expectation> expectations;
  for (int64_t r = 0; r < static_cast<int64_t>(requests.size()); ++r) {
    const int64_t slot = table.at(r, 0);
    const int64_t last = requests[at(r)].query_len - 1;
    expectations.push_back({r, requests[at(r)].context_len > 0 ? slot : -1, {{slot, last}}});
  }
  check_run(run, expectations);
}

TEST(Mamba1Driver, PrefixCachingAllWritesBlockBoundaryStates) {
  // Mode all, mamba blocks of 16 tokens; entry k of a request's row holds the state after
  // position 16k + 15. A request reads block cdiv(context, 16) − 1 (if it has context), writes
  // the state after every position p with (p + 1) % 16 == 0 to block (p + 1)/16 − 1, and its final
  // state to block cdiv(seq_len, 16) − 1.
  const int64_t B = 16;
  const AttentionConfig config = mamba1_config(MambaCacheMode::kAll, B);
  SyntheticOptions options;
  options.seed = 23;
  options.padding_requests = 1;
  // Decodes at a boundary position (31) and just past one (32); a chunk crossing three
  // boundaries from the middle of a block; a fresh prefill crossing one; a chunk ending exactly
  // on a boundary.
  const std::vector<RequestSpec> requests = {{31, 1}, {32, 1}, {10, 40}, {0, 20}, {16, 16}};
  const DriverRun run = run_driver(config, BuilderConfig{}, requests, options);
  const IntArray& table = run.file.batch.state_block_table();
  std::vector<Expectation> expectations;
  for (int64_t r = 0; r < static_cast<int64_t>(requests.size()); ++r) {
    const int64_t context = requests[at(r)].context_len, len = requests[at(r)].query_len;
    Expectation e{r, context > 0 ? table.at(r, ceil_div(context, B) - 1) : -1, {}};
    for (int64_t p = context; p < context + len; ++p) {
      if ((p + 1) % B == 0) e.writes.emplace_back(table.at(r, (p + 1) / B - 1), p - context);
    }
    e.writes.emplace_back(table.at(r, ceil_div(context + len, B) - 1), len - 1);
    expectations.push_back(e);
  }
  check_run(run, expectations);
}

TEST(Mamba1Driver, CudaGraphPaddedDecodeBatchTouchesNoSlotForPadding) {
  // Decode-only batch under FULL_DECODE_ONLY graphs: three decodes padded to a captured size of 4;
  // the padded entry's state index is PAD_SLOT_ID, so it reads and writes nothing.
  const AttentionConfig config = mamba1_config(MambaCacheMode::kNone, 0);
  BuilderConfig builder;
  builder.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  builder.cudagraph_capture_sizes = {1, 2, 4, 8};
  SyntheticOptions options;
  options.seed = 31;
  options.padding_requests = 1;
  options.padding_tokens = 1;
  const std::vector<RequestSpec> requests = {{3, 1}, {40, 1}, {17, 1}};
  const DriverRun run = run_driver(config, builder, requests, options);
  ASSERT_EQ(run.metadata.cudagraph_padded, 1);
  const IntArray& table = run.file.batch.state_block_table();
  std::vector<Expectation> expectations;
  for (int64_t r = 0; r < 3; ++r) expectations.push_back({r, table.at(r, 0), {{table.at(r, 0), 0}}});
  check_run(run, expectations);
}

TEST(Mamba1Driver, ChunkedPrefillAcrossStepsEqualsOneShot) {
  // One request of 37 tokens run as one step, and as chunks 13 + 20 + 1 decode + 3 over four steps
  // sharing the pools: same contributions and final state (mode none, slot in place).
  const AttentionConfig config = mamba1_config(MambaCacheMode::kNone, 0);
  const int64_t total = 37;
  SyntheticOptions options;
  options.seed = 41;
  const DriverRun one_shot = run_driver(config, BuilderConfig{}, {{0, total}}, options);
  const std::vector<double> hidden = hidden_rows(one_shot.file, 0, total);
  const int64_t slot = one_shot.file.batch.state_block_table().at(0, 0);

  // Later steps carry the one-shot's query rows and the previous step's pools.
  std::map<std::string, Tensor> pools;
  for (const auto& [name, pool] : one_shot.pools_before) pools.emplace(name, clone_host(pool));
  std::vector<double> chunked;
  int64_t done = 0;
  for (const int64_t len : {13, 20, 1, 3}) {
    SyntheticOptions step_options;
    step_options.seed = 41 + static_cast<uint64_t>(done);
    step_options.ssm_block_table = true;
    BatchFile file = make_synthetic_batch(config, BuilderConfig{}, {{done, len}}, step_options);
    file.batch.ssm_block_table = one_shot.file.batch.state_block_table();
    for (int64_t i = 0; i < len * kSizes.H; ++i) {
      store_from_double(file.inputs.query.data(), file.inputs.query.dtype(), i, hidden[at(done * kSizes.H + i)]);
    }
    const MambaAttentionMetadata metadata = spec::build_mamba_metadata(config, BuilderConfig{}, file.batch);
    StepTensors tensors = file.inputs.views();
    tensors.ssm_state = views(pools);
    tensors.weights = views(one_shot.weights);
    Tensor contribution = Tensor::host(DType::kFloat64, tensors.query.shape());
    ssm::ssm_forward(config, metadata, file.batch, tensors, contribution);
    const std::vector<double> rows = contribution_rows(contribution, 0, len);
    chunked.insert(chunked.end(), rows.begin(), rows.end());
    done += len;
  }
  const Tolerance tol = mamba1_tolerance(kSizes, total);
  expect_close(chunked, contribution_rows(one_shot.contribution, 0, total), tol, "chunked contribution");
  expect_state_close(naive_mamba1_state(views(pools), slot), naive_mamba1_state(views(one_shot.pools), slot), tol,
                     "chunked final");
}

}  // namespace
}  // namespace hybridtb::testing
