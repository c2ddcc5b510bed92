// `hybridtb gen --tp N` and `hybridtb tp` end to end: the rank files gen writes beside a step, read
// back and run together (one thread per rank, the mamba1 branch's all-reduces between them), joined,
// equal the unsharded step — attention bit for bit, the mamba1 branch within the float64 bound of
// the tolerance table — at tp 2, 4 and 8, with kv heads replicated wherever tp > num_kv_heads; a
// mamba1 rank file alone is refused; a preset that does not split writes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/dtype.h"
#include "hybridtb/spec/tensor_parallel.h"
#include "hybridtb/step.h"
#include "hybridtb/tensor_parallel_run.h"
#include "hybridtb/tolerance.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::run_command;

std::string cli() { return HYBRIDTB_CLI; }

// The mamba-2.8b preset (40 query heads, one kv head: replicated at every tp) with its branch shrunk
// as the parity sweep shrinks it, and llama3-8b (32/8 heads: replicated at tp 16 only).
const char* kMamba = "--preset mamba-2.8b --set ssm.intermediate_size=128 --set ssm.dt_rank=8";
const char* kLlama = "--preset llama3-8b --set dtype=float32";
const char* kMix = "--mix d3@40+c1x16@24+p1x20";

std::string rank_path(const fs::path& step, int64_t tp, int64_t r) {
  return (step.parent_path() / (step.stem().string() + ".tp" + std::to_string(tp) + "-rank" + std::to_string(r) + ".h5"))
      .string();
}

int64_t count_outside(const Tensor& got, const Tensor& want, const Tolerance& tol) {
  int64_t outside = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = load_as_double(got.data(), got.dtype(), i), b = load_as_double(want.data(), want.dtype(), i);
    if (std::isnan(b) ? !std::isnan(a) : !tol.allows(a, b)) ++outside;
  }
  return outside;
}

void expect_ranks_join_to_the_step(const char* preset_args, const std::vector<int64_t>& tps) {
  const fs::path dir = testing::scratch_dir();
  for (int64_t tp : tps) {
    SCOPED_TRACE(::testing::Message() << preset_args << " tp " << tp);
    const fs::path step = dir / ("step_tp" + std::to_string(tp) + ".h5");
    std::string out;
    ASSERT_EQ(run_command(cli() + " gen " + preset_args + " " + kMix + " --seed 3 --tp " + std::to_string(tp) +
                              " --out " + step.string(),
                          &out),
              0)
        << out;
    const BatchFile file = read_batch_file(step.string());
    EXPECT_THAT(file.provenance.at("generator_command"), HasSubstr("--tp " + std::to_string(tp)));
    std::vector<BatchFile> ranks;
    for (int64_t r = 0; r < tp; ++r) {
      ranks.push_back(read_batch_file(rank_path(step, tp, r)));
      EXPECT_EQ(ranks.back().schema_version, "1.4");
      EXPECT_EQ(ranks.back().config.tp_rank, r);
      EXPECT_EQ(ranks.back().config.num_heads, file.config.num_heads / tp);
    }
    EXPECT_FALSE(fs::exists(rank_path(step, tp, tp)));
    const StepOutputs joined = spec::join_step_outputs(file.config, run_rank_steps(ranks));
    auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
    const StepOutputs whole = run_step(*backend, file);
    EXPECT_TRUE(bitwise_equal(joined.attn_output, whole.attn_output));
    EXPECT_TRUE(bitwise_equal(joined.kv_cache, whole.kv_cache));
    if (!file.config.has_ssm_branch()) {
      EXPECT_TRUE(bitwise_equal(joined.output, whole.output));
      continue;
    }
    const auto& p = file.config.ssm_params;
    const int64_t inner = std::max({file.config.num_heads * file.config.head_size, p.at("intermediate_size"),
                                    p.at("dt_rank") + 2 * p.at("state_size")});
    const Tolerance tol = tolerance_for(ToleranceCase::kMamba1Float64, file.batch.num_tokens(), inner);
    EXPECT_EQ(count_outside(joined.ssm_output, whole.ssm_output, tol), 0);
    EXPECT_EQ(count_outside(joined.output, whole.output, tol), 0);
    for (const auto& [name, pool] : whole.ssm_state) {
      EXPECT_EQ(count_outside(convert_host(joined.ssm_state.at(name), DType::kFloat64),
                              convert_host(pool, DType::kFloat64), tol), 0)
          << name;
    }
  }
}

TEST(GenTp, Mamba1RankFilesRunTogetherToTheUnshardedStep) { expect_ranks_join_to_the_step(kMamba, {2, 4, 8}); }

TEST(GenTp, AttentionRankFilesJoinBitForBitIncludingReplicatedKvHeads) {
  expect_ranks_join_to_the_step(kLlama, {2, 8, 16});
}

TEST(GenTp, AMamba1RankAloneIsRefusedAndTheTpCommandPasses) {
  const fs::path dir = testing::scratch_dir();
  const fs::path step = dir / "alone.h5";
  std::string out;
  ASSERT_EQ(run_command(cli() + " gen " + kMamba + " " + kMix + " --tp 2 --quiet --out " + step.string(), &out), 0) << out;
  EXPECT_NE(run_command(cli() + " run --backend reference --quiet --batch " + rank_path(step, 2, 1) + " --out " +
                            (dir / "alone_out.h5").string(),
                        &out),
            0);
  EXPECT_THAT(out, HasSubstr("needs the other ranks' partial sums"));
  EXPECT_FALSE(fs::exists(dir / "alone_out.h5"));
  ASSERT_EQ(run_command(cli() + " tp " + step.string() + " --tp 4 --backend reference --quiet --no-rationale", &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("1 passed, 0 failed"));
  // gen's own rank files, read back and run together against the step they were cut from.
  ASSERT_EQ(run_command(cli() + " tp " + step.string() + " --tp 2 --rank-files --backend reference --quiet --no-rationale",
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("1 passed, 0 failed"));
  EXPECT_EQ(run_command(cli() + " tp " + step.string() + " --tp 4 --rank-files --backend reference --quiet", &out), 2);
  EXPECT_THAT(out, HasSubstr("--rank-files: no rank file " + rank_path(step, 4, 0)));
  // The reference has no placement of its own: its ranks meet through host memory, and asking for
  // devices is bad input that names why.
  EXPECT_THAT(out, HasSubstr("4 ranks on reference: one place, meeting through host memory"));
  EXPECT_EQ(run_command(cli() + " tp " + step.string() + " --tp 2 --placement devices --backend reference --quiet", &out),
            2);
  EXPECT_THAT(out, HasSubstr("--placement devices: backend 'reference' places no ranks of its own"));
  EXPECT_EQ(run_command(cli() + " tp " + step.string() + " --tp 2 --placement gpus --backend reference --quiet", &out), 2);
  // --time: the step timed sharded and unsharded, printed and in the report.
  const fs::path report = dir / "tp_report.json";
  ASSERT_EQ(run_command(cli() + " tp " + step.string() + " --tp 2 --time 3 --backend reference --quiet --report " +
                            report.string(),
                        &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("step time over 3 runs (median ms): tp 1 "));
  std::string json;
  ASSERT_EQ(run_command("cat " + report.string(), &json), 0);
  EXPECT_THAT(json, HasSubstr("\"tensor_parallel_timing\""));
  EXPECT_THAT(json, HasSubstr("\"sharded_ms\""));
  EXPECT_EQ(run_command(cli() + " tp " + step.string() + " --tp 2 --time 0 --backend reference --quiet", &out), 2);
  EXPECT_EQ(run_command(cli() + " tp " + step.string() + " --tp 3 --backend reference --quiet", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("num_heads 40 is not divisible by tp_size 3"));
}

TEST(GenTp, APresetThatDoesNotSplitWritesNothing) {
  const fs::path dir = testing::scratch_dir();
  const fs::path step = dir / "nosplit.h5";
  std::string out;
  EXPECT_EQ(run_command(cli() + " gen " + kLlama + " " + kMix + " --tp 3 --out " + step.string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("--tp 3: preset llama3-8b: tensor parallel: num_heads 32 is not divisible by tp_size 3"));
  EXPECT_EQ(run_command(cli() + " gen " + kMamba + " " + kMix + " --set ssm.intermediate_size=100 --tp 8 --out " +
                            step.string(),
                        &out),
            2);
  EXPECT_THAT(out, HasSubstr("intermediate_size 100 is not divisible by tp_size 8"));
  EXPECT_EQ(run_command(cli() + " gen --preset qwen3-next-gdn " + kMix + " --tp 2 --out " + step.string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("linear-attention layer"));
  EXPECT_EQ(run_command(cli() + " gen " + kLlama + " " + kMix + " --tp 0 --out " + step.string(), &out), 2);
  EXPECT_THAT(out, HasSubstr("--tp must be at least 1"));
  EXPECT_FALSE(fs::exists(step));
  EXPECT_FALSE(fs::exists(rank_path(step, 3, 0)));
}

}  // namespace
}  // namespace hybridtb
