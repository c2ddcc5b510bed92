// Tensor-parallel hybrid layers on the cuda backend: the rank files of a step (cut by
// hybridtb/spec/tensor_parallel.h) run together, one thread and one cuda backend per rank, the mamba1
// branch's two all-reduces (x_proj's product, the contribution after out_proj) through the ranks'
// group — here a HostThreadGroup, which the GPU mode reaches through host memory —, and the ranks'
// results joined equal the unsharded step on the reference within the tolerance table: decodes
// (the fixed-shape decode step), prefills, mixed steps with padding, prefix caching, tp 2 and 4,
// kv heads replicated. Sharded steps are bitwise reproducible; a rank's mamba1 branch is refused
// alone and refused for CUDA-graph capture with a group that sums through host memory; one rank per
// GPU, a rank that fails aborts the others' NCCL collectives (the run returns with its error).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "cuda_cases.h"
#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/step.h"
#include "hybridtb/tensor_parallel_run.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;

struct TpCase {
  CudaCase batch;
  std::vector<int64_t> tp_sizes;
};
void PrintTo(const TpCase& c, std::ostream* out) { PrintTo(c.batch, out); }
struct TpCaseName {
  std::string operator()(const ::testing::TestParamInfo<TpCase>& info) const { return info.param.batch.name; }
};

CudaCase mamba1_case(std::string name, std::vector<RequestSpec> requests) {
  CudaCase c;
  c.name = std::move(name);
  c.ssm_mode = "mamba1";
  c.ssm_params = kMamba1Big;
  c.requests = std::move(requests);
  c.ssm_block_table = true;
  return c;
}

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> cases;
  cases.push_back({mamba1_case("Mamba1Decodes", {{40, 1}, {7, 1}, {90, 1}, {3, 1}}), {2, 4}});
  cases.push_back({mamba1_case("Mamba1Prefills", {{0, 37}, {0, 12}}), {2, 4}});
  {
    CudaCase c = mamba1_case("Mamba1MixedPaddedFloat32", {{20, 1}, {33, 1}, {18, 9}, {0, 21}});
    c.dtype = DType::kFloat32;
    c.padding_tokens = 3;
    c.padding_requests = 1;
    cases.push_back({c, {2, 4}});
  }
  {
    CudaCase c = mamba1_case("Mamba1PrefixCachingAllKvReplicated", {{31, 1}, {10, 40}});
    c.cache = MambaCacheMode::kAll;
    c.num_kv_heads = 1;  // replicated on every rank
    cases.push_back({c, {2, 4}});
  }
  {
    CudaCase c;
    c.name = "AttentionOnlyKvReplicated";
    c.num_kv_heads = 2;
    c.requests = {{64, 1}, {0, 30}, {17, 8}};
    cases.push_back({c, {4, 8}});
  }
  return cases;
}

std::vector<BatchFile> shard_all(const BatchFile& file, int64_t tp) {
  std::vector<BatchFile> ranks;
  for (int64_t r = 0; r < tp; ++r) ranks.push_back(spec::shard_batch_file(file, spec::tp_shard(file.config, tp, r)));
  return ranks;
}

StepOutputs run_sharded_on_cuda(const BatchFile& file, int64_t tp, RankRunOptions options = {}) {
  options.backend = "cuda";
  return spec::join_step_outputs(file.config, run_rank_steps(shard_all(file, tp), options));
}

CompareOptions without_metadata() {
  CompareOptions options;
  options.compare_metadata = false;  // each rank's metadata is its own (its kv heads)
  return options;
}

class CudaTensorParallel : public CudaParamFixture<TpCase> {};

TEST_P(CudaTensorParallel, JoinedRanksMatchTheUnshardedReference) {
  const BatchFile file = make_step(GetParam().batch);
  auto reference = create_backend("reference", BackendSettings{file.config, file.builder});
  const StepOutputs expected = run_step(*reference, file);
  for (int64_t tp : GetParam().tp_sizes) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp);
    const StepOutputs joined = run_sharded_on_cuda(file, tp);
    const ComparisonReport report = compare_step(file, joined, expected, without_metadata());
    EXPECT_TRUE(report.passed()) << format_report_table({report});
    EXPECT_TRUE(outputs_padding_untouched(joined, file));
    // Reproducible: the group sums in rank order, so a rerun gives the same bits.
    EXPECT_EQ(first_bit_difference(joined, run_sharded_on_cuda(file, tp)), "");
  }
}

// The cuda backend's own placement: one rank per GPU, the all-reduces over NCCL on each rank's stream.
// Runs the tp sizes this machine has GPUs for (and this build NCCL); skips, with the reason, if none.
TEST_P(CudaTensorParallel, OneRankPerGpuOverNcclMatchesTheReference) {
  const BatchFile file = make_step(GetParam().batch);
  auto reference = create_backend("reference", BackendSettings{file.config, file.builder});
  const StepOutputs expected = run_step(*reference, file);
  register_builtin_backends();
  std::string not_placed;
  int ran = 0;
  for (int64_t tp : GetParam().tp_sizes) {
    SCOPED_TRACE(::testing::Message() << "tp " << tp);
    RankRunOptions options;
    try {
      const BackendRegistry::RankPlacement placed = BackendRegistry::instance().place_ranks("cuda", tp);
      options.group_of_rank = [groups = placed.groups](int64_t r) { return groups[static_cast<size_t>(r)]; };
      options.on_rank_thread = placed.on_rank_thread;
    } catch (const NotSupported& e) {
      not_placed = e.what();
      continue;
    }
    const StepOutputs joined = run_sharded_on_cuda(file, tp, options);
    const ComparisonReport report = compare_step(file, joined, expected, without_metadata());
    EXPECT_TRUE(report.passed()) << format_report_table({report});
    EXPECT_TRUE(outputs_padding_untouched(joined, file));
    EXPECT_EQ(first_bit_difference(joined, run_sharded_on_cuda(file, tp, options)), "");
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << not_placed;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaTensorParallel, ::testing::ValuesIn(tp_cases()), TpCaseName());

class CudaTensorParallelRefusals : public CudaFixture<> {};

TEST_F(CudaTensorParallelRefusals, AMamba1RankAloneOrInAGraphWithAHostGroupIsRefused) {
  CudaCase c = mamba1_case("SmallRefusals", {{9, 1}, {4, 1}});
  c.decode_graph = true;
  const BatchFile file = make_step(c);
  const std::vector<BatchFile> ranks = shard_all(file, 2);
  auto alone = create_backend("cuda", BackendSettings{ranks[1].config, ranks[1].builder});
  EXPECT_THAT([&] { (void)run_step(*alone, ranks[1]); },
              ::testing::ThrowsMessage<Error>(HasSubstr("needs the other ranks' partial sums")));
  HostThreadGroup group(2);
  BackendSettings settings{ranks[1].config, ranks[1].builder};
  settings.tp_group = group.rank(1);
  auto backend = create_backend("cuda", settings);
  const LayerBuffers layer(*backend, ranks[1]);
  const HybridMetadata metadata = backend->build_metadata(ranks[1].batch);
  EXPECT_THAT([&] { (void)backend->capture_decode_step(metadata, ranks[1].batch, layer.views(), layer.outputs()); },
              ::testing::ThrowsMessage<NotSupported>(HasSubstr("which a CUDA graph cannot capture")));
}

// Runs `run` on its own thread; if it has not returned after `limit`, the test process exits with a
// failure rather than wait for it forever (a hung collective cannot be interrupted from here).
void returns_within(std::chrono::seconds limit, const std::function<void()>& run) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread([&run, done = std::move(done)]() mutable {
    try {
      run();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  }).detach();
  if (finished.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: the tensor-parallel run did not return within %llds: a rank is hung\n",
                 static_cast<long long>(limit.count()));
    std::_Exit(1);
  }
  finished.get();
}

class CudaTensorParallelFailure : public CudaFixture<> {};

// One rank per GPU over NCCL: a rank whose file is broken fails before its first all-reduce while
// the other waits in it (in ncclAllReduce, or on the device behind it). The failure aborts every
// rank's communicator, the run returns, and the error is the failed rank's whichever rank it is.
TEST_F(CudaTensorParallelFailure, OneRankPerGpuARankThatFailsReleasesTheOthers) {
  register_builtin_backends();
  const BatchFile file = make_step(mamba1_case("SmallFailure", {{9, 1}, {4, 1}, {0, 12}}));
  for (int64_t failing : {1, 0}) {
    SCOPED_TRACE(::testing::Message() << "failing rank " << failing);
    RankRunOptions options;
    options.backend = "cuda";
    try {
      const BackendRegistry::RankPlacement placed = BackendRegistry::instance().place_ranks("cuda", 2);
      options.group_of_rank = [groups = placed.groups](int64_t r) { return groups[static_cast<size_t>(r)]; };
      options.on_rank_thread = placed.on_rank_thread;
    } catch (const NotSupported& e) {
      GTEST_SKIP() << e.what();
    }
    std::vector<BatchFile> ranks = shard_all(file, 2);
    ranks[static_cast<size_t>(failing)].inputs.ssm_hidden = Tensor();
    const std::string expected = "rank " + std::to_string(failing) + " of 2: missing /inputs/ssm_hidden";
    returns_within(std::chrono::seconds(120), [&] {
      EXPECT_THAT([&] { (void)run_rank_steps(ranks, options); },
                  ::testing::ThrowsMessage<Error>(HasSubstr(expected)));
    });
  }
}

}  // namespace
}  // namespace hybridtb::testing
