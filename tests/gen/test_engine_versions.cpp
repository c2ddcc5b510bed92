// One mix under several engine versions (hybridtb/engine_rules.h): `hybridtb gen` with
// engine_version, the Mamba builder's rule-dependent fields and the SSM step on the reference.
// Metamorphic: the same mix and seed under two rule sets give the same inputs, the same attention
// and SSM results on every live request and the same states after the step (the conv pool up to
// its SD / DS transposition); only the fields a rule names differ (the split of a request without
// context, the padding requests' state index, the conv pool's layout). Also: a live request whose
// state index is the null block is skipped exactly under the rules that skip index 0.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "hybridtb/presets.h"
#include "hybridtb/spec/metadata_builders.h"
#include "hybridtb/step.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

StepOutputs replay(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

// A cheap hybrid layer (hymba-small shrunk) with the SSM branch `mode` under `version`.
Layer small_layer(const std::string& mode, const std::string& version, std::vector<std::string> extra = {}) {
  std::vector<std::string> settings{"engine_version=" + version, "num_heads=4", "num_kv_heads=1", "head_size=32",
                                    "sliding_window=32", "ssm_mode=" + mode};
  if (mode == "mamba1") settings.insert(settings.end(), {"ssm.intermediate_size=64", "ssm.dt_rank=4", "ssm.state_size=8"});
  if (mode == "mamba2") settings.insert(settings.end(), {"ssm.state_size=16", "ssm.head_dim=32"});
  settings.insert(settings.end(), extra.begin(), extra.end());
  return make_layer("hymba-small", settings);
}

double at(const Tensor& t, int64_t i) { return load_as_double(t.data(), t.dtype(), i); }

// Equal element for element within `rel` (0: bit for bit) over the first `count` elements.
void expect_close(const Tensor& a, const Tensor& b, int64_t count, double rel, const std::string& what) {
  ASSERT_EQ(a.empty(), b.empty()) << what;
  if (a.empty()) return;
  ASSERT_LE(count, a.numel()) << what;
  ASSERT_LE(count, b.numel()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = at(a, i), y = at(b, i);
    if (!(std::abs(x - y) <= rel * (1.0 + std::abs(x)))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << count << " elements differ";
}

// The conv pool [S, C, K-1] (DS) and [S, K-1, C] (SD) hold the same values transposed per slot.
void expect_same_conv_pool(const Tensor& ds, const Tensor& sd, const std::string& what) {
  ASSERT_EQ(ds.shape().size(), 3u) << what;
  ASSERT_EQ(sd.shape(), Shape({ds.size(0), ds.size(2), ds.size(1)})) << what;
  const int64_t S = ds.size(0), C = ds.size(1), P = ds.size(2);
  int64_t bad = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t p = 0; p < P; ++p) bad += at(ds, (s * C + c) * P + p) == at(sd, (s * P + p) * C + c) ? 0 : 1;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

void expect_same_pools(const std::map<std::string, Tensor>& ds, const std::map<std::string, Tensor>& sd,
                       const std::string& what) {
  ASSERT_EQ(ds.size(), sd.size()) << what;
  for (const auto& [name, pool] : ds) {
    if (name == "conv_state" && pool.shape() != sd.at(name).shape()) {
      expect_same_conv_pool(pool, sd.at(name), what + " " + name);
    } else {
      expect_close(pool, sd.at(name), pool.numel(), 0.0, what + " " + name);
    }
  }
}

class SameMixTwoVersions : public ::testing::TestWithParam<std::string> {};

// d2@64 (decodes), d1@0 (a one-token request without context), p1x16 (a fresh prefill): unversioned
// and 0.12.0 count d1@0 as a decode, 0.33.0 as a prefill. The requests keep one order under all
// three (0.33's reorder puts d1@0 first among the requests without context), so rows line up.
TEST_P(SameMixTwoVersions, SameResultsOnLiveRequestsAndOnlyRuledFieldsDiffer) {
  const std::string mode = GetParam();
  const Mix mix = parse_mix("d2@64+d1@0+p1x16");
  const BatchFile base = generate_batch(small_layer(mode, "none"), mix, {.seed = 11});
  const StepOutputs base_out = replay(base);
  for (const std::string version : {"0.12.0", "0.33.0"}) {
    SCOPED_TRACE(version);
    const BatchFile other = generate_batch(small_layer(mode, version), mix, {.seed = 11});
    EXPECT_EQ(other.config.engine_version, "vllm " + version);
    // Inputs: identical batch and tensors; the pools hold the same logical values.
    EXPECT_EQ(other.batch.query_start_loc.values, base.batch.query_start_loc.values);
    EXPECT_EQ(other.batch.seq_lens.values, base.batch.seq_lens.values);
    expect_close(other.inputs.query, base.inputs.query, base.inputs.query.numel(), 0.0, "query");
    expect_same_pools(base.inputs.ssm_state, other.inputs.ssm_state, "pools before");
    const StepOutputs out = replay(other);
    const int64_t live = base.batch.num_actual_tokens * base.config.num_heads * base.config.head_size;
    expect_close(out.attn_output, base_out.attn_output, live, 0.0, "attn_output");
    // d1@0 runs through the prefill path under 0.33 (the same math from a zero state, another
    // float64 summation order), hence a relative tolerance far below any dtype's.
    expect_close(out.ssm_output, base_out.ssm_output, live, 1e-12, "ssm_output");
    expect_close(out.output, base_out.output, live, 1e-12, "output");
    // Pools after the step: the same states (the d1@0 slot too), up to the conv layout.
    ASSERT_EQ(out.ssm_state.size(), base_out.ssm_state.size());
    for (const auto& [name, pool] : base_out.ssm_state) {
      const Tensor& mine = out.ssm_state.at(name);
      if (name == "conv_state") {
        ASSERT_EQ(mine.shape(), Shape({pool.size(0), pool.size(2), pool.size(1)}));  // SD under a release
        Tensor back = Tensor::host(pool.dtype(), pool.shape());
        const int64_t S = pool.size(0), C = pool.size(1), P = pool.size(2);
        for (int64_t s = 0; s < S; ++s) {
          for (int64_t c = 0; c < C; ++c) {
            for (int64_t p = 0; p < P; ++p) {
              store_from_double(back.data(), back.dtype(), (s * C + c) * P + p, at(mine, (s * P + p) * C + c));
            }
          }
        }
        expect_close(back, pool, pool.numel(), 1e-6, "conv_state after");
      } else {
        expect_close(mine, pool, pool.numel(), 1e-6, name + " after");
      }
    }
    // The split: the one rule-dependent difference in this batch's Mamba metadata.
    ASSERT_TRUE(out.metadata.mamba && base_out.metadata.mamba);
    EXPECT_EQ(base_out.metadata.mamba->num_decodes, 3);
    EXPECT_EQ(base_out.metadata.mamba->num_prefills, 1);
    const bool v033 = std::string(version) == "0.33.0";
    EXPECT_EQ(out.metadata.mamba->num_decodes, v033 ? 2 : 3);
    EXPECT_EQ(out.metadata.mamba->num_prefills, v033 ? 2 : 1);
    if (v033) {
      EXPECT_EQ(out.metadata.mamba->has_initial_states_p->values, (std::vector<int32_t>{0, 0}));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SameMixTwoVersions, ::testing::Values("mamba1", "mamba2", "gdn"));

// CUDA-graph padding: the padding request's state index is PAD_SLOT_ID (unversioned, 0.12.0) or
// NULL_BLOCK_ID (0.33.0); each rule set skips its own, so results and states agree.
TEST(EngineVersions, PaddingRequestsGetTheVersionsStateIndexAndAreSkipped) {
  const Mix mix = parse_mix("d3@64");
  const BatchFile base = generate_batch(small_layer("mamba1", "none"), mix, {.seed = 4, .pad_to = 4});
  const StepOutputs base_out = replay(base);
  ASSERT_TRUE(base_out.metadata.mamba);
  EXPECT_EQ(base_out.metadata.mamba->cudagraph_padded, 1);
  EXPECT_EQ(base_out.metadata.mamba->state_indices_tensor_d.at(3, 0), -1);
  for (const auto& [version, pad] : {std::pair<std::string, int>{"0.12.0", -1}, {"0.33.0", 0}, {"0.11.0", -1}}) {
    SCOPED_TRACE(version);
    const BatchFile other = generate_batch(small_layer("mamba1", version), mix, {.seed = 4, .pad_to = 4});
    const StepOutputs out = replay(other);
    EXPECT_EQ(out.metadata.mamba->state_indices_tensor_d.at(3, 0), pad);
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_EQ(out.metadata.mamba->state_indices_tensor_d.at(r, 0),
                base_out.metadata.mamba->state_indices_tensor_d.at(r, 0));
    }
    const int64_t live = base.batch.num_actual_tokens * base.config.num_heads * base.config.head_size;
    expect_close(out.output, base_out.output, live, 0.0, "output");
    expect_same_pools(base_out.ssm_state, out.ssm_state, "pools after");
  }
}

// A live decode whose state index is 0: 0.33's kernels mask `!= null_block_id`, so it is skipped
// (zero contribution, no state touched); the unversioned rules and 0.12.0 run it from slot 0.
TEST(EngineVersions, StateIndexZeroIsSkippedOnlyWhereTheRulesSkipIt) {
  const Mix mix = parse_mix("d2@64");
  for (const auto& [version, skipped] : {std::pair<std::string, bool>{"none", false}, {"0.12.0", false}, {"0.33.0", true}}) {
    SCOPED_TRACE(version);
    BatchFile file = generate_batch(small_layer("mamba1", version), mix, {.seed = 9});
    ASSERT_TRUE(file.batch.ssm_block_table.has_value());
    file.batch.ssm_block_table->at(0, 0) = 0;  // request 0's running state in slot 0
    const StepOutputs out = replay(file);
    const int64_t row = file.config.num_heads * file.config.head_size;
    double norm = 0.0;
    for (int64_t i = 0; i < row; ++i) norm += std::abs(at(out.ssm_output, i));
    if (skipped) {
      EXPECT_EQ(norm, 0.0) << "request 0 contributes nothing";
      for (const auto& [name, pool] : out.ssm_state) {
        const Tensor& before = file.inputs.ssm_state.at(name);
        const int64_t per_slot = pool.numel() / pool.size(0);
        expect_close(pool, before, per_slot, 0.0, name + " slot 0 untouched");
      }
    } else {
      EXPECT_GT(norm, 0.0) << "request 0 runs from slot 0";
    }
  }
}

TEST(EngineVersions, AModeTheReleaseLacksIsRefusedNamingItsModes) {
  try {
    small_layer("mamba1", "0.33.0", {"mamba_cache_mode=all", "mamba_block_size=32"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("mamba_cache_mode 'all'"));
    EXPECT_THAT(e.what(), HasSubstr("vllm 0.33.0"));
    EXPECT_THAT(e.what(), HasSubstr("align | none"));
  }
  EXPECT_THROW(small_layer("mamba1", "0.11.0", {"mamba_cache_mode=align", "mamba_block_size=32"}), Error);
  EXPECT_NO_THROW(small_layer("mamba1", "0.12.0", {"mamba_cache_mode=all", "mamba_block_size=32"}));
  EXPECT_NO_THROW(small_layer("mamba1", "0.33.0", {"mamba_cache_mode=align", "mamba_block_size=32"}));
}

// The builder's split and order with treat_short_extends_as_decodes false: a request without
// context is a prefill whatever its query length; one with context and one token stays a decode.
TEST(EngineVersions, ShortRequestsWithoutContextArePrefillsUnder033) {
  const BatchFile file = generate_batch(small_layer("mamba1", "0.33.0"), parse_mix("d1@40+d1@0+p1x8"), {.seed = 1});
  ASSERT_EQ(file.batch.num_reqs(), 3);
  EXPECT_EQ(file.batch.context_len(1), 0);
  const auto split = spec::split_decodes_and_prefills(file.batch, 1, false, /*treat_short_extends_as_decodes=*/false);
  EXPECT_EQ(split.num_decodes, 1);
  EXPECT_EQ(split.num_prefills, 2);
  const auto legacy = spec::split_decodes_and_prefills(file.batch, 1);
  EXPECT_EQ(legacy.num_decodes, 2);
  // The fresh one-token request must follow the decodes under 0.33's order, not precede them.
  const std::vector<int64_t> order = spec::decode_first_order(file.batch, 1, false);
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2}));
  BatchFile legacy_order = generate_batch(small_layer("mamba1", "none"), parse_mix("d1@0+d1@40+p1x8"), {.seed = 1});
  EXPECT_EQ(spec::decode_first_order(legacy_order.batch, 1, false), (std::vector<int64_t>{1, 0, 2}));
  EXPECT_THROW(spec::check_decodes_first(legacy_order.batch, 1, false), Error);
  EXPECT_NO_THROW(spec::check_decodes_first(legacy_order.batch, 1, true));
}

// Under a release whose norm eps comes from the model config, gen records it; a different eps
// changes the gdn / mamba2 branch's output (and nothing else).
TEST(EngineVersions, NormEpsIsAConfigFieldThatTheGatedNormUses) {
  const Mix mix = parse_mix("d2@64+p1x8");
  for (const std::string mode : {"gdn", "mamba2"}) {
    SCOPED_TRACE(mode);
    const BatchFile file = generate_batch(small_layer(mode, "0.33.0"), mix, {.seed = 2});
    ASSERT_TRUE(file.config.norm_eps.has_value());
    EXPECT_EQ(*file.config.norm_eps, mode == "gdn" ? 1e-6 : 1e-5);
    const BatchFile big = generate_batch(small_layer(mode, "0.33.0", {"norm_eps=0.5"}), mix, {.seed = 2});
    const StepOutputs a = replay(file), b = replay(big);
    const int64_t live = file.batch.num_actual_tokens * file.config.num_heads * file.config.head_size;
    expect_close(a.attn_output, b.attn_output, live, 0.0, "attn_output");
    double diff = 0.0;
    for (int64_t i = 0; i < live; ++i) diff += std::abs(at(a.ssm_output, i) - at(b.ssm_output, i));
    EXPECT_GT(diff, 0.0) << "eps 0.5 must change the normalised output";
  }
  EXPECT_THROW(small_layer("gdn", "none", {"norm_eps=1e-5"}), Error);  // unversioned: fixed eps
}

// Falcon-H1's mamba_rms_norm = False: Mixer2RMSNormGated returns y·silu(z) without normalising.
// Metamorphic: with the norm on, eps E = 1e12 and norm_weight sqrt(E) = 1e6 everywhere, the norm
// scales v by 1e6 / sqrt(mean(v²) + 1e12) = 1 − O(1e-12), so both contributions agree to ~1e-12.
TEST(EngineVersions, Mamba2WithoutRmsNormIsTheGateAlone) {
  const Mix mix = parse_mix("d2@64+p1x8");
  const BatchFile gate = generate_batch(small_layer("mamba2", "0.33.0", {"mamba_rms_norm=false"}), mix, {.seed = 8});
  EXPECT_FALSE(gate.config.mamba_rms_norm);
  EXPECT_EQ(gate.inputs.weights.count("norm_weight"), 0u);  // vLLM registers no weight
  BatchFile normed = generate_batch(small_layer("mamba2", "0.33.0", {"norm_eps=1e12"}), mix, {.seed = 8});
  Tensor& w = normed.inputs.weights.at("norm_weight");
  for (int64_t i = 0; i < w.numel(); ++i) store_from_double(w.data(), w.dtype(), i, 1e6);
  const StepOutputs a = replay(gate), b = replay(normed);
  const int64_t live = gate.batch.num_actual_tokens * gate.config.num_heads * gate.config.head_size;
  expect_close(a.ssm_output, b.ssm_output, live, 1e-9, "ssm_output");
  expect_same_pools(a.ssm_state, b.ssm_state, "pools after");
  EXPECT_THROW(small_layer("mamba1", "0.33.0", {"mamba_rms_norm=false"}), Error);
}

}  // namespace
}  // namespace hybridtb
