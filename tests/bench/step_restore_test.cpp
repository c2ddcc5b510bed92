// What the benchmark must put back between timed steps (hybridtb_bench restores only the state
// pools): a step's KV-cache writes are a function of its inputs alone, so a second step on the same
// buffers writes the same bits into the cache (and its per-token-head scales) and reads the same
// attention; the state pools are read and written in place, so a second step moves them on. On
// every backend of the build: the reference always, cuda where a device is usable (skipped with the
// reason elsewhere).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/presets.h"
#include "hybridtb/step.h"

namespace hybridtb {
namespace {

struct TwoSteps {
  StepOutputs once, twice;
};

// The KV cache and its scales before the step.
StepOutputs cache_before(const BatchFile& file) {
  StepOutputs c;
  c.kv_cache = file.inputs.kv_cache;
  c.k_scale_cache = file.inputs.k_scale_cache;
  c.v_scale_cache = file.inputs.v_scale_cache;
  return c;
}

TwoSteps run_twice(const std::string& backend_name, const BatchFile& file) {
  auto backend = create_backend(backend_name, BackendSettings{file.config, file.builder});
  const HybridMetadata metadata = backend->build_metadata(file.batch);
  const LayerBuffers buffers(*backend, file);
  TwoSteps steps;
  buffers.run(*backend, metadata, file.batch);
  backend->synchronize();
  steps.once = buffers.download_all(*backend, metadata);
  buffers.run(*backend, metadata, file.batch);
  backend->synchronize();
  steps.twice = buffers.download_all(*backend, metadata);
  return steps;
}

// The KV cache and its scales of `s` alone.
StepOutputs cache_of(const StepOutputs& s) {
  StepOutputs c;
  c.kv_cache = s.kv_cache;
  c.k_scale_cache = s.k_scale_cache;
  c.v_scale_cache = s.v_scale_cache;
  return c;
}

const std::vector<std::string> kSmallAttention = {"num_heads=4", "num_kv_heads=2", "head_size=64"};

BatchFile batch(const std::string& preset, std::vector<std::string> overrides, const std::string& mix) {
  overrides.insert(overrides.end(), kSmallAttention.begin(), kSmallAttention.end());
  return generate_batch(make_layer(preset, overrides), parse_mix(mix), {.seed = 3});
}

class StepRestore : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    register_builtin_backends();
    const BackendRegistry& registry = BackendRegistry::instance();
    if (!registry.contains(GetParam())) GTEST_SKIP() << "backend '" << GetParam() << "' is not in this build";
    if (const std::string why = registry.unavailable_reason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(StepRestore, TheCacheWritesOfAStepAreIdempotent) {
  const std::string mix = "d3@40+c1x8@24+p1x12";  // decodes, a chunk at context and a first prefill
  for (const char* kv : {"auto", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head"}) {
    for (const char* window : {"0", "16"}) {
      SCOPED_TRACE(std::string("kv_cache_dtype=") + kv + " sliding_window=" + window);
      const BatchFile file =
          batch("llama3-8b", {std::string("kv_cache_dtype=") + kv, std::string("sliding_window=") + window}, mix);
      const TwoSteps s = run_twice(GetParam(), file);
      ASSERT_NE(first_bit_difference(cache_of(s.once), cache_before(file)), "");  // the step writes rows
      EXPECT_EQ(first_bit_difference(cache_of(s.twice), cache_of(s.once)), "");
      EXPECT_EQ(first_bit_difference(s.twice, s.once), "");  // no pools: the whole step repeats
    }
  }
}

TEST_P(StepRestore, TheStatePoolsMoveOnAndMustBeRestored) {
  const BatchFile file = batch("hymba-small",
                               {"ssm_mode=mamba1", "ssm.intermediate_size=64", "ssm.dt_rank=4", "ssm.state_size=8"},
                               "d3@40+p1x12");
  const TwoSteps s = run_twice(GetParam(), file);
  EXPECT_EQ(first_bit_difference(cache_of(s.twice), cache_of(s.once)), "");
  ASSERT_FALSE(s.once.ssm_state.empty());
  EXPECT_NE(first_bit_difference(s.twice, s.once), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, StepRestore, ::testing::Values("reference", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& backend) { return backend.param; });

}  // namespace
}  // namespace hybridtb
