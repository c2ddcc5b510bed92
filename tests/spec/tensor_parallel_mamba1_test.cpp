// Tensor parallelism of a hybrid layer with a mamba1 branch (hybridtb/spec/tensor_parallel.h), by
// vLLM's MambaMixer: every rank's weights and pools are the unsharded ones at its channels (in_proj's
// x and z rows, conv1d, dt_proj, A_log and D by channel; x_proj and out_proj by input column; the
// out_proj bias on rank 0 alone); the all-reduce points are x_proj's product (per request) and the
// contribution after out_proj (once per step), each rank contributing its partial sum; and the
// metamorphic relation: the ranks run together (hybridtb/tensor_parallel_run.h), joined, equal the
// unsharded step within the float64 bound of the tolerance table (the sums are split, so they round
// differently) for decodes, prefills, chunks continued from a state, padding and prefix caching,
// at tp 2, 4 and 8 (kv heads replicated at 8).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "attention_steps.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "hybridtb/tensor_parallel_group.h"
#include "hybridtb/tensor_parallel_run.h"
#include "hybridtb/tolerance.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;
using spec::TpShard;

// I = 48 channels (divisible by 2, 4, 8), N = 6, K = 4, R = 3.
constexpr int64_t kIntermediate = 48, kState = 6, kKernel = 4, kDtRank = 3;

AttentionConfig mamba1_layer(int64_t num_heads, int64_t num_kv_heads, MambaCacheMode cache_mode = MambaCacheMode::kNone,
                             const std::string& engine_version = "") {
  AttentionConfig config = attention_config(num_heads, num_kv_heads, 32, 16);
  config.dtype = DType::kFloat32;
  config.ssm_mode = "mamba1";
  config.ssm_params = {{"intermediate_size", kIntermediate},
                       {"state_size", kState},
                       {"conv_kernel", kKernel},
                       {"dt_rank", kDtRank}};
  config.mamba_cache_mode = cache_mode;
  config.mamba_block_size = cache_mode == MambaCacheMode::kNone ? 0 : 16;
  config.engine_version = engine_version;
  return config;
}

// A step of `config` with its own SSM block table, random mamba1 weights and float64 pools (the
// reference stores the states it computed exactly, so pools compare at the float64 bound).
BatchFile mamba1_step(const AttentionConfig& config, const std::vector<RequestSpec>& requests,
                      SyntheticOptions options) {
  options.ssm_block_table = true;
  BatchFile file = make_synthetic_batch(config, BuilderConfig{}, requests, options);
  const int64_t num_slots = ssm_slots_needed(file.batch) + 2;
  const spec::ssm::RandomSsmTensors random = spec::ssm::make_random_ssm_tensors(config, num_slots, options.seed + 5);
  file.inputs.weights = random.weights;
  for (const auto& [name, pool] : random.ssm_state) file.inputs.ssm_state[name] = convert_host(pool, DType::kFloat64);
  return file;
}

StepOutputs run_alone(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

std::vector<BatchFile> shard_all(const BatchFile& file, int64_t tp) {
  std::vector<BatchFile> ranks;
  for (int64_t r = 0; r < tp; ++r) ranks.push_back(spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r)));
  return ranks;
}

double element_at(const TensorView& t, std::initializer_list<int64_t> index) {
  return load_as_double(t.data(), t.dtype(), t.offset(index));
}

// --- the cut --------------------------------------------------------------------------------------

void expect_weights_are_the_ranks_channels(const BatchFile& file, int64_t tp) {
  const std::map<std::string, Tensor>& w = file.inputs.weights;
  const int64_t I = kIntermediate, per_rank = I / tp;
  for (int64_t r = 0; r < tp; ++r) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp << " rank " << r);
    const BatchFile rank = spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r));
    const std::map<std::string, Tensor>& rw = rank.inputs.weights;
    const int64_t b = r * per_rank;
    EXPECT_EQ(rank.config.ssm_params.at("intermediate_size"), per_rank);
    EXPECT_EQ(rank.config.tp_size, tp);
    EXPECT_EQ(rank.config.tp_rank, r);
    const int64_t H = w.at("in_proj").size(1);
    ASSERT_EQ(rw.at("in_proj").shape(), (Shape{2 * per_rank, H}));
    for (int64_t i = 0; i < per_rank; ++i) {
      for (int64_t h = 0; h < H; h += 7) {
        ASSERT_EQ(element_at(rw.at("in_proj"), {i, h}), element_at(w.at("in_proj"), {b + i, h}));
        ASSERT_EQ(element_at(rw.at("in_proj"), {per_rank + i, h}), element_at(w.at("in_proj"), {I + b + i, h}));
      }
      ASSERT_EQ(element_at(rw.at("in_proj_bias"), {per_rank + i}), element_at(w.at("in_proj_bias"), {I + b + i}));
      ASSERT_EQ(element_at(rw.at("conv1d_weight"), {i, kKernel - 1}), element_at(w.at("conv1d_weight"), {b + i, kKernel - 1}));
      ASSERT_EQ(element_at(rw.at("conv1d_bias"), {i}), element_at(w.at("conv1d_bias"), {b + i}));
      ASSERT_EQ(element_at(rw.at("dt_proj"), {i, kDtRank - 1}), element_at(w.at("dt_proj"), {b + i, kDtRank - 1}));
      ASSERT_EQ(element_at(rw.at("dt_proj_bias"), {i}), element_at(w.at("dt_proj_bias"), {b + i}));
      ASSERT_EQ(element_at(rw.at("A_log"), {i, kState - 1}), element_at(w.at("A_log"), {b + i, kState - 1}));
      ASSERT_EQ(element_at(rw.at("D"), {i}), element_at(w.at("D"), {b + i}));
      for (int64_t row = 0; row < kDtRank + 2 * kState; ++row) {
        ASSERT_EQ(element_at(rw.at("x_proj"), {row, i}), element_at(w.at("x_proj"), {row, b + i}));
      }
      for (int64_t h = 0; h < H; h += 5) {
        ASSERT_EQ(element_at(rw.at("out_proj"), {h, i}), element_at(w.at("out_proj"), {h, b + i}));
      }
    }
    // RowParallelLinear adds its bias once, on rank 0, before the all-reduce.
    EXPECT_EQ(rw.count("out_proj_bias"), r == 0 ? 1u : 0u);
    if (r == 0) {
      EXPECT_TRUE(bitwise_equal(rw.at("out_proj_bias"), w.at("out_proj_bias")));
    }
    // Every rank's branch reads the whole hidden rows: the unsharded query, viewed flat.
    const Tensor& hidden = rank.inputs.ssm_hidden;
    ASSERT_EQ(hidden.shape(), (Shape{file.inputs.query.size(0), H}));
    EXPECT_EQ(std::memcmp(hidden.data(), file.inputs.query.data(), static_cast<size_t>(hidden.nbytes())), 0);
    EXPECT_NO_THROW(validate(rank.config, rank.batch, rank.inputs));
  }
}

TEST(TensorParallelMamba1Cut, WeightsAreTheRanksChannelsByVllmsParallelLinears) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {0, 6}}, {.seed = 2});
  for (int64_t tp : {2, 4}) expect_weights_are_the_ranks_channels(file, tp);
}

// The pools split by channel in either conv-state layout: DS [slots, I, K−1] and the engine's SD
// [slots, K−1, I] (vLLM 0.33); the ssm state [slots, I, N].
TEST(TensorParallelMamba1Cut, PoolsAreTheRanksChannelsInBothConvLayouts) {
  for (const std::string engine : {"", "vllm 0.33.0"}) {
    SCOPED_TRACE("engine_version '" + engine + "'");
    const BatchFile file = mamba1_step(mamba1_layer(8, 2, MambaCacheMode::kNone, engine), {{5, 1}, {0, 6}}, {.seed = 4});
    const bool sd = !engine.empty();
    const Tensor& conv = file.inputs.ssm_state.at("conv_state");
    const Tensor& h = file.inputs.ssm_state.at("ssm_state");
    ASSERT_EQ(conv.size(sd ? 2 : 1), kIntermediate);
    const int64_t tp = 4, per_rank = kIntermediate / tp;
    for (int64_t r = 0; r < tp; ++r) {
      const BatchFile rank = spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r));
      const Tensor& rconv = rank.inputs.ssm_state.at("conv_state");
      const Tensor& rh = rank.inputs.ssm_state.at("ssm_state");
      ASSERT_EQ(rconv.size(sd ? 2 : 1), per_rank);
      ASSERT_EQ(rh.shape(), (Shape{h.size(0), per_rank, kState}));
      for (int64_t s = 0; s < conv.size(0); ++s) {
        for (int64_t i = 0; i < per_rank; ++i) {
          const int64_t c = r * per_rank + i;
          for (int64_t k = 0; k < kKernel - 1; ++k) {
            ASSERT_EQ(element_at(rconv, sd ? std::initializer_list<int64_t>{s, k, i} : std::initializer_list<int64_t>{s, i, k}),
                      element_at(conv, sd ? std::initializer_list<int64_t>{s, k, c} : std::initializer_list<int64_t>{s, c, k}));
          }
          for (int64_t n = 0; n < kState; ++n) ASSERT_EQ(element_at(rh, {s, i, n}), element_at(h, {s, c, n}));
        }
      }
    }
  }
}

TEST(TensorParallelMamba1Cut, BadInputNamesTheFieldAndTheConstraint) {
  AttentionConfig config = mamba1_layer(8, 2);
  config.ssm_params["intermediate_size"] = 36;
  const BatchFile file = mamba1_step(config, {{3, 1}}, {.seed = 1});
  EXPECT_THAT([&] { (void)spec::shard_batch_file(file, spec::tp_shard(file.config, 8, 0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("/config/ssm intermediate_size 36 is not divisible by tp_size 8")));
  // A rank file is not cut again.
  const BatchFile rank = spec::shard_batch_file(file, spec::tp_shard(file.config, 2, 1));
  EXPECT_THAT([&] { (void)spec::shard_batch_file(rank, spec::tp_shard(rank.config, 2, 0)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the layer is already rank 1 of 2")));
  // Modes without a sharded form are named.
  AttentionConfig prefix = attention_config(8, 2, 32, 16);
  prefix.ssm_mode = "prefix_sum";
  EXPECT_THAT([&] { (void)spec::shard_config(prefix, spec::tp_shard(prefix, 2, 0)); },
              ::testing::ThrowsMessage<NotSupported>(HasSubstr("the SSM branch 'prefix_sum' is not sharded")));
  // The rank's SSM input must be there, of the whole hidden width, and only on such a rank.
  BatchFile no_hidden = rank;
  no_hidden.inputs.ssm_hidden = Tensor();
  EXPECT_THAT([&] { validate(no_hidden.config, no_hidden.batch, no_hidden.inputs); },
              ::testing::ThrowsMessage<Error>(HasSubstr("missing /inputs/ssm_hidden")));
  BatchFile unsharded_with_hidden = file;
  unsharded_with_hidden.inputs.ssm_hidden = rank.inputs.ssm_hidden;
  EXPECT_THAT([&] { validate(unsharded_with_hidden.config, unsharded_with_hidden.batch, unsharded_with_hidden.inputs); },
              ::testing::ThrowsMessage<Error>(HasSubstr("/inputs/ssm_hidden is present, but the file is not a tensor-parallel rank")));
  AttentionConfig bad_rank = rank.config;
  bad_rank.tp_rank = 2;
  EXPECT_THAT([&] { validate(bad_rank); }, ::testing::ThrowsMessage<Error>(HasSubstr("/config tp_rank must be in [0, tp_size = 2), got 2")));
}

// A rank file written and read back is the same rank file (schema 1.4: tp_size, tp_rank and
// /inputs/ssm_hidden), and the unsharded file stays at the older minor it needs.
TEST(TensorParallelMamba1Cut, RankFilesRoundTripAsSchema14) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {0, 6}}, {.seed = 9});
  const BatchFile rank = spec::shard_batch_file(file, spec::tp_shard(file.config, 2, 1));
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("hybridtb_tp_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_batch_file((dir / "rank1.h5").string(), rank);
  write_batch_file((dir / "whole.h5").string(), file);
  const BatchFile back = read_batch_file((dir / "rank1.h5").string());
  const BatchFile whole = read_batch_file((dir / "whole.h5").string());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(back.schema_version, "1.4");
  EXPECT_EQ(whole.schema_version, "1.2");
  EXPECT_EQ(back.config, rank.config);
  EXPECT_TRUE(bitwise_equal(back.inputs.ssm_hidden, rank.inputs.ssm_hidden));
  EXPECT_EQ(whole.config.tp_size, 1);
  EXPECT_TRUE(whole.inputs.ssm_hidden.empty());
}

// --- the all-reduce points ------------------------------------------------------------------------

// A rank's group that records what the rank contributes at each all-reduce (its partial sum) and
// the shape, then lets the host group sum.
class RecordingGroup final : public TensorParallelGroup {
 public:
  explicit RecordingGroup(std::shared_ptr<TensorParallelGroup> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  int64_t rank() const override { return inner_->rank(); }
  void all_reduce_sum(const TensorView& values) override {
    partials.push_back(clone_host(values));
    inner_->all_reduce_sum(values);
  }
  std::vector<Tensor> partials;

 private:
  std::shared_ptr<TensorParallelGroup> inner_;
};

// x_proj's product is all-reduced once per request piece ([L, R + 2N]) and the contribution once per
// step ([num_actual_tokens, H]); the ranks' partial contributions sum to the unsharded contribution.
TEST(TensorParallelMamba1AllReduce, RanksContributePartialSumsAtVllmsTwoPoints) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {7, 1}, {0, 6}}, {.seed = 6, .padding_tokens = 2});
  const int64_t tp = 2;
  const std::vector<BatchFile> ranks = shard_all(file, tp);
  HostThreadGroup host(tp);
  std::vector<std::shared_ptr<RecordingGroup>> recorders;
  for (int64_t r = 0; r < tp; ++r) recorders.push_back(std::make_shared<RecordingGroup>(host.rank(r)));
  RankRunOptions options;
  options.group_of_rank = [&](int64_t r) { return recorders[static_cast<size_t>(r)]; };
  (void)run_rank_steps(ranks, options);

  const int64_t actual = file.batch.num_actual_tokens, H = file.config.num_heads * file.config.head_size;
  for (int64_t r = 0; r < tp; ++r) {
    const std::vector<Tensor>& p = recorders[static_cast<size_t>(r)]->partials;
    ASSERT_EQ(p.size(), 4u) << "three requests' x_proj and one out_proj all-reduce on rank " << r;
    EXPECT_EQ(p[0].shape(), (Shape{1, kDtRank + 2 * kState}));
    EXPECT_EQ(p[1].shape(), (Shape{1, kDtRank + 2 * kState}));
    EXPECT_EQ(p[2].shape(), (Shape{6, kDtRank + 2 * kState}));
    EXPECT_EQ(p[3].shape(), (Shape{actual, H}));
  }
  // The partial contributions add up to the unsharded one (with its out_proj bias once).
  const StepOutputs whole = run_alone(file);
  const Tolerance tol = tolerance_for(ToleranceCase::kMamba1Float64, actual, std::max<int64_t>(H, kIntermediate));
  double largest = 0;
  for (int64_t t = 0; t < actual; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      const double sum = element_at(recorders[0]->partials[3], {t, c}) + element_at(recorders[1]->partials[3], {t, c});
      const double want = element_at(whole.ssm_output, {t, c / file.config.head_size, c % file.config.head_size});
      ASSERT_TRUE(tol.allows(sum, want)) << "token " << t << " column " << c << ": " << sum << " vs " << want;
      largest = std::max(largest, std::abs(want));
    }
  }
  EXPECT_GT(largest, 0.1) << "the contribution must not be trivially zero";
  // Neither rank's partial is the whole: both ranks carry part of the sum.
  EXPECT_FALSE(bitwise_equal(recorders[0]->partials[3], recorders[1]->partials[3]));
}

// time_rank_steps: one time per run, each positive; the group's rules as run_rank_steps.
TEST(TensorParallelMamba1AllReduce, TimedRanksGiveOneTimePerRun) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {0, 4}}, {.seed = 10});
  const std::vector<double> seconds = time_rank_steps(shard_all(file, 2), 4);
  ASSERT_EQ(seconds.size(), 4u);
  for (double s : seconds) EXPECT_GT(s, 0.0);
  EXPECT_EQ(time_rank_steps({file}, 1).size(), 1u);  // the unsharded step is a group of one
  EXPECT_THAT([&] { (void)time_rank_steps(shard_all(file, 2), 0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("repetitions must be at least 1, got 0")));
}

TEST(TensorParallelMamba1AllReduce, ARankAloneOrInTheWrongGroupIsRefused) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}}, {.seed = 8});
  const std::vector<BatchFile> ranks = shard_all(file, 2);
  EXPECT_THAT([&] { (void)run_alone(ranks[1]); },
              ::testing::ThrowsMessage<Error>(HasSubstr("of a tensor-parallel rank file (tp_rank 1 of tp_size 2) needs "
                                                        "the other ranks' partial sums")));
  // The group's size and rank must be the file's.
  HostThreadGroup wrong(1);
  BackendSettings settings{ranks[1].config, ranks[1].builder};
  settings.tp_group = wrong.rank(0);
  auto backend = create_backend("reference", settings);
  EXPECT_THAT([&] { (void)run_step(*backend, ranks[1]); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the tensor-parallel group is rank 0 of 1, but /config says "
                                                        "tp_rank 1 of tp_size 2")));
  // The whole group, in rank order.
  EXPECT_THAT([&] { (void)run_rank_steps({ranks[1], ranks[0]}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank file 0 of 2 has /config tp_rank 1")));
  EXPECT_THAT([&] { (void)run_rank_steps({ranks[0]}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank file 0 of 1 has /config tp_rank 0 of tp_size 2")));
  // A rank that fails mid-step: the others leave the all-reduce it never reaches (no hang), and its
  // own error is the one reported.
  std::vector<BatchFile> broken = ranks;
  broken[1].inputs.ssm_hidden = Tensor();
  EXPECT_THAT([&] { (void)run_rank_steps(broken); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 1 of 2: missing /inputs/ssm_hidden")));
}

// --- a rank that fails -----------------------------------------------------------------------------

// A rank's group whose all-reduce never completes on its own, like an NCCL collective whose peer
// never arrives: it waits for abort() and then throws, TensorParallelAborted or (`fails_after_abort`)
// a plain Error, as an NCCL or CUDA call interrupted by the abort does. The wait gives up after a
// generous time with an error saying so, so that a run that never aborts fails instead of hanging.
class WaitsForAbortGroup final : public TensorParallelGroup {
 public:
  static constexpr std::chrono::seconds kPatience{30};

  WaitsForAbortGroup(int64_t size, int64_t rank, bool fails_after_abort = false)
      : size_(size), rank_(rank), fails_after_abort_(fails_after_abort) {}
  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  void all_reduce_sum(const TensorView& /*values*/) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++collectives_;
    in_collective_.notify_all();
    if (!aborted_.wait_for(lock, kPatience, [&] { return aborts_ > 0; })) {
      throw Error("waits-for-abort group: no abort() came: the run would hang");
    }
    ++released_;
    if (fails_after_abort_) throw Error(detail::concat("waits-for-abort group of rank ", rank_, ": interrupted"));
    throw TensorParallelAborted("waits-for-abort group: aborted");
  }
  void abort() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++aborts_;
    aborted_.notify_all();
  }
  // Until this rank is inside its first all-reduce (for another thread), or kPatience.
  bool wait_until_in_collective() {
    std::unique_lock<std::mutex> lock(mutex_);
    return in_collective_.wait_for(lock, kPatience, [&] { return collectives_ > 0; });
  }
  // Until the first abort() (for another thread), or kPatience.
  bool wait_for_abort() {
    std::unique_lock<std::mutex> lock(mutex_);
    return aborted_.wait_for(lock, kPatience, [&] { return aborts_ > 0; });
  }

  int aborts() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return aborts_;
  }
  int collectives() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return collectives_;
  }
  int released() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return released_;
  }

 private:
  const int64_t size_, rank_;
  const bool fails_after_abort_;
  std::mutex mutex_;
  std::condition_variable aborted_;
  std::condition_variable in_collective_;
  int aborts_ = 0, collectives_ = 0, released_ = 0;
};

// A rank's group whose first all-reduce fails once `peer`'s rank waits in its own: a failure that
// comes first in time while another rank is certainly inside a collective.
class FailsOncePeerWaits final : public TensorParallelGroup {
 public:
  FailsOncePeerWaits(int64_t size, int64_t rank, std::shared_ptr<WaitsForAbortGroup> peer)
      : size_(size), rank_(rank), peer_(std::move(peer)) {}
  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  void all_reduce_sum(const TensorView& /*values*/) override {
    if (!peer_->wait_until_in_collective()) throw Error("fails-once-peer-waits group: the peer never waited");
    throw Error(detail::concat("the all-reduce of rank ", rank_, " failed"));
  }
  void abort() override { ++aborts_; }
  int aborts() const { return aborts_.load(); }

 private:
  const int64_t size_, rank_;
  std::shared_ptr<WaitsForAbortGroup> peer_;
  std::atomic<int> aborts_{0};
};

std::vector<std::shared_ptr<WaitsForAbortGroup>> waits_for_abort_groups(int64_t tp, bool fails_after_abort = false) {
  std::vector<std::shared_ptr<WaitsForAbortGroup>> groups;
  for (int64_t r = 0; r < tp; ++r) groups.push_back(std::make_shared<WaitsForAbortGroup>(tp, r, fails_after_abort));
  return groups;
}

RankRunOptions options_with(const std::vector<std::shared_ptr<WaitsForAbortGroup>>& groups) {
  RankRunOptions options;
  options.group_of_rank = [groups](int64_t r) -> std::shared_ptr<TensorParallelGroup> {
    return groups[static_cast<size_t>(r)];
  };
  return options;
}

// One rank fails before its first all-reduce; the others that reached theirs wait for a peer that
// never comes. Every rank's group sees abort() once (the failed rank's too), the waiting ranks are
// released by it (not by their patience running out), and the run returns with the failed rank's
// error. A rank whose thread reaches its step only after the failure does not start it
// (RankFailures), so which of the others wait depends on the threads' timing.
TEST(TensorParallelRankFailure, ARankThatFailsAbortsEveryRanksGroup) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {0, 3}}, {.seed = 21});
  const int64_t tp = 4;
  std::vector<BatchFile> ranks = shard_all(file, tp);
  ranks[2].inputs.ssm_hidden = Tensor();
  const auto groups = waits_for_abort_groups(tp);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT([&] { (void)run_rank_steps(ranks, options_with(groups)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 2 of 4: missing /inputs/ssm_hidden")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, WaitsForAbortGroup::kPatience);
  for (int64_t r = 0; r < tp; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    WaitsForAbortGroup& g = *groups[static_cast<size_t>(r)];
    EXPECT_EQ(g.aborts(), 1);
    EXPECT_EQ(g.released(), g.collectives());
    EXPECT_LE(g.collectives(), r == 2 ? 0 : 1);
  }
}

// The ranks released by the abort fail too, with errors of their own kind (not TensorParallelAborted:
// an interrupted NCCL or CUDA call), and rank 0 is among them; the error reported is still the one
// that came first in time, rank 1's (its all-reduce fails while rank 0 waits in its own).
TEST(TensorParallelRankFailure, TheFirstFailureInTimeIsReportedNotTheLowestRank) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}, {0, 3}}, {.seed = 22});
  std::vector<BatchFile> ranks = shard_all(file, 2);
  const auto waiting = std::make_shared<WaitsForAbortGroup>(2, 0, /*fails_after_abort=*/true);
  const auto failing = std::make_shared<FailsOncePeerWaits>(2, 1, waiting);
  RankRunOptions options;
  options.group_of_rank = [&](int64_t r) -> std::shared_ptr<TensorParallelGroup> {
    if (r == 0) return waiting;
    return failing;
  };
  EXPECT_THAT([&] { (void)run_rank_steps(ranks, options); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 1 of 2: the all-reduce of rank 1 failed")));
  EXPECT_EQ(waiting->released(), 1) << "rank 0 failed after the abort";
  EXPECT_EQ(waiting->aborts(), 1);
  EXPECT_EQ(failing->aborts(), 1);
  // time_rank_steps with a rank that fails before its step (its ranks also meet at host barriers).
  ranks[1].inputs.ssm_hidden = Tensor();
  const auto timed_groups = waits_for_abort_groups(2, /*fails_after_abort=*/true);
  EXPECT_THAT([&] { (void)time_rank_steps(ranks, 2, options_with(timed_groups)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 1 of 2: missing /inputs/ssm_hidden")));
  EXPECT_EQ(timed_groups[0]->aborts(), 1);
  EXPECT_EQ(timed_groups[1]->aborts(), 1);
}

// A rank whose thread gets its group only after another rank failed: its group is aborted too, and
// the rank does not start its step (no collective on it); the run reports the failed rank.
TEST(TensorParallelRankFailure, ARankThatGetsItsGroupAfterTheAbortDoesNotStart) {
  const BatchFile file = mamba1_step(mamba1_layer(8, 2), {{5, 1}}, {.seed = 23});
  std::vector<BatchFile> ranks = shard_all(file, 2);
  ranks[0].inputs.ssm_hidden = Tensor();
  const auto groups = waits_for_abort_groups(2);
  RankRunOptions options;
  options.group_of_rank = [&](int64_t r) -> std::shared_ptr<TensorParallelGroup> {
    if (r == 1 && !groups[0]->wait_for_abort()) throw Error("rank 0 was never aborted");
    return groups[static_cast<size_t>(r)];
  };
  EXPECT_THAT([&] { (void)run_rank_steps(ranks, options); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rank 0 of 2: missing /inputs/ssm_hidden")));
  EXPECT_EQ(groups[0]->aborts(), 1);
  EXPECT_EQ(groups[1]->aborts(), 1);
  EXPECT_EQ(groups[1]->collectives(), 0);
}

// A HostThreadGroup rank handle's abort() aborts the group: a rank waiting in an all-reduce leaves
// it with TensorParallelAborted, and later all-reduces throw at once.
TEST(TensorParallelRankFailure, AHostGroupHandlesAbortReleasesTheOtherRanks) {
  HostThreadGroup host(2);
  const std::shared_ptr<TensorParallelGroup> rank0 = host.rank(0), rank1 = host.rank(1);
  double value = 1;
  std::thread waiting([&] {
    EXPECT_THROW(rank0->all_reduce_sum(TensorView(&value, DType::kFloat64, {1})), TensorParallelAborted);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // most likely inside the wait by now
  rank1->abort();
  waiting.join();
  EXPECT_THROW(rank1->all_reduce_sum(TensorView(&value, DType::kFloat64, {1})), TensorParallelAborted);
}

// --- the metamorphic relation ---------------------------------------------------------------------

struct Mamba1TpCase {
  const char* name;
  AttentionConfig config;
  std::vector<RequestSpec> requests;
  SyntheticOptions options;
  std::vector<int64_t> tp_sizes;
};

std::vector<Mamba1TpCase> metamorphic_cases() {
  return {
      {"decodes", mamba1_layer(8, 2), {{9, 1}, {3, 1}, {17, 1}, {1, 1}}, {.seed = 11}, {2, 4, 8}},
      {"prefills", mamba1_layer(8, 2), {{0, 9}, {0, 4}}, {.seed = 12}, {2, 4}},
      {"mixed_padded", mamba1_layer(8, 2), {{5, 1}, {9, 1}, {6, 5}, {0, 7}}, {.seed = 13, .padding_tokens = 3, .padding_requests = 1}, {2, 8}},
      {"prefix_caching_all", mamba1_layer(8, 8, MambaCacheMode::kAll), {{31, 1}, {10, 30}}, {.seed = 14}, {2, 4}},
      {"sd_conv_layout", mamba1_layer(8, 2, MambaCacheMode::kNone, "vllm 0.33.0"), {{4, 1}, {2, 5}}, {.seed = 15}, {4}},
  };
}

void expect_within(const Tensor& got, const Tensor& want, const Tolerance& tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int64_t outside = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = load_as_double(got.data(), got.dtype(), i), b = load_as_double(want.data(), want.dtype(), i);
    if (std::isnan(b) ? !std::isnan(a) : !tol.allows(a, b)) ++outside;
  }
  EXPECT_EQ(outside, 0) << what << ": elements outside atol " << tol.atol << " rtol " << tol.rtol;
}

TEST(TensorParallelMamba1Metamorphic, JoinedRanksEqualTheUnshardedStepWithinTheFloat64Bound) {
  for (const Mamba1TpCase& c : metamorphic_cases()) {
    const BatchFile file = mamba1_step(c.config, c.requests, c.options);
    const StepOutputs whole = run_alone(file);
    const int64_t H = c.config.num_heads * c.config.head_size;
    const Tolerance tol = tolerance_for(ToleranceCase::kMamba1Float64, file.batch.num_tokens(),
                                        std::max({H, kIntermediate, kDtRank + 2 * kState}));
    for (int64_t tp : c.tp_sizes) {
      SCOPED_TRACE(::testing::Message() << c.name << " tp " << tp);
      const std::vector<StepOutputs> outs = run_rank_steps(shard_all(file, tp));
      const StepOutputs joined = spec::join_step_outputs(c.config, outs);
      // Attention does not communicate: bit for bit. The branch's sums are split: within the bound.
      EXPECT_TRUE(bitwise_equal(joined.attn_output, whole.attn_output));
      EXPECT_TRUE(bitwise_equal(joined.kv_cache, whole.kv_cache));
      expect_within(joined.ssm_output, whole.ssm_output, tol, "ssm_output");
      expect_within(joined.output, whole.output, tol, "output");
      ASSERT_EQ(joined.ssm_state.size(), whole.ssm_state.size());
      for (const auto& [name, pool] : whole.ssm_state) expect_within(joined.ssm_state.at(name), pool, tol, name);
    }
  }
}

}  // namespace
}  // namespace hybridtb::testing
