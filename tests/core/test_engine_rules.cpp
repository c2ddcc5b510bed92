// The engine rule table (hybridtb/engine_rules.h) against the capture contracts of each release:
// datasets/capture/contracts/vllm-<release>.json holds an `engine_rules` object read off that
// release's source by the capture module's extractor, independently of this table. Every fact is
// compared (pad_slot_id, null_block_id, padded_request_state_index, state_index_skip_rule,
// mamba_cache_modes, treat_short_extends_as_decodes, conv_state_layout, norm_eps_from_config). A
// release whose contract is not in the source tree is skipped with the reason. Also: version names,
// the unversioned rules and the errors for unknown versions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "test_paths.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

std::filesystem::path contract_path(const std::string& version) {
  return testing::source_dir() / "datasets" / "capture" / "contracts" / ("vllm-" + version.substr(5) + ".json");
}

nlohmann::json optional_int(const std::optional<int32_t>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

class EngineRulesContract : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineRulesContract, TableAgreesWithTheReleasesContractFactByFact) {
  const std::string version = GetParam();
  const std::filesystem::path path = contract_path(version);
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no contract fixture " << path << " in this source tree";
  std::ifstream in(path);
  const nlohmann::json contract = nlohmann::json::parse(in);
  ASSERT_TRUE(contract.contains("engine_rules")) << path;
  const nlohmann::json& facts = contract.at("engine_rules");
  const EngineRules& rules = engine_rules(version);
  EXPECT_EQ(rules.version, version);

  EXPECT_EQ(facts.at("pad_slot_id"), rules.pad_slot_id) << facts.value("pad_slot_id_source", "");
  EXPECT_EQ(facts.at("null_block_id"), optional_int(rules.null_block_id)) << facts.value("null_block_id_source", "");
  EXPECT_EQ(facts.at("padded_request_state_index"), optional_int(rules.padded_request_state_index))
      << facts.value("padded_request_state_index_source", "");
  EXPECT_EQ(facts.at("state_index_skip_rule"), std::string(to_string(rules.state_index_skip)))
      << facts.value("state_index_skip_rule_source", "");
  nlohmann::json modes = nullptr;
  if (rules.mamba_cache_modes) {
    modes = nlohmann::json::array();
    for (MambaCacheMode mode : *rules.mamba_cache_modes) modes.push_back(std::string(to_string(mode)));
  }
  EXPECT_EQ(facts.at("mamba_cache_modes"), modes) << facts.value("mamba_cache_modes_source", "");
  EXPECT_EQ(facts.at("treat_short_extends_as_decodes"), rules.treat_short_extends_as_decodes)
      << facts.value("treat_short_extends_as_decodes_source", "");
  EXPECT_EQ(facts.at("conv_state_layout"), std::string(to_string(rules.conv_state_layout)))
      << facts.value("conv_state_layout_source", "");
  EXPECT_EQ(facts.at("norm_eps_from_config"), rules.norm_eps_from_config)
      << facts.value("norm_eps_from_config_source", "");
}

INSTANTIATE_TEST_SUITE_P(EverySupportedVersion, EngineRulesContract, ::testing::ValuesIn(supported_engine_versions()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param.substr(5);
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return "vllm_" + name;
                         });

// The rules every release's padding index and skip rule must keep consistent: what hybridtb gives a
// padding request is an index the same rules skip, and a live slot (>= 1) is never skipped.
TEST(EngineRules, EveryRuleSetSkipsItsOwnPaddingIndexAndNoLiveSlot) {
  std::vector<std::string> versions = supported_engine_versions();
  versions.emplace_back("");
  for (const std::string& version : versions) {
    SCOPED_TRACE(version);
    const EngineRules& rules = engine_rules(version);
    EXPECT_TRUE(rules.skips_state_index(rules.padding_state_index()));
    EXPECT_TRUE(rules.skips_state_index(rules.pad_slot_id));
    for (int64_t live : {1, 2, 1000}) EXPECT_FALSE(rules.skips_state_index(live));
    EXPECT_TRUE(rules.has_mamba_cache_mode(MambaCacheMode::kNone));
    if (rules.mamba_cache_modes) {  // a release with the setting accepts exactly its modes
      EXPECT_EQ(*rules.mamba_cache_modes, rules.accepted_mamba_cache_modes);
    }
  }
}

// Files without engine_version keep the rules of hybrid-batch 1.2, which no release has exactly.
TEST(EngineRules, TheUnversionedRulesAreHybridtbsOld) {
  const EngineRules& rules = engine_rules("");
  EXPECT_EQ(rules.padding_state_index(), -1);
  EXPECT_TRUE(rules.skips_state_index(-1));
  EXPECT_FALSE(rules.skips_state_index(0));  // slot 0 is a live slot here
  EXPECT_TRUE(rules.short_extends_are_decodes());
  EXPECT_EQ(rules.conv_state_layout, ConvStateLayout::kDS);
  EXPECT_FALSE(rules.norm_eps_from_config);
  for (MambaCacheMode mode : {MambaCacheMode::kNone, MambaCacheMode::kAll, MambaCacheMode::kAlign}) {
    EXPECT_TRUE(rules.has_mamba_cache_mode(mode));
  }
}

TEST(EngineRules, VersionsAreNamedAndTheNewestIsLast) {
  const std::vector<std::string> versions = supported_engine_versions();
  ASSERT_EQ(versions.size(), 4u);
  EXPECT_EQ(versions.front(), "vllm 0.10.1.1");
  EXPECT_EQ(newest_engine_version(), "vllm 0.33.0");
  EXPECT_EQ(canonical_engine_version("0.12.0", "--engine-version"), "vllm 0.12.0");
  EXPECT_EQ(canonical_engine_version("vllm 0.11.0", "--engine-version"), "vllm 0.11.0");
  EXPECT_EQ(canonical_engine_version("none", "--engine-version"), "");
}

TEST(EngineRules, AnUnknownVersionNamesTheFieldAndTheSupportedList) {
  try {
    engine_rules("vllm 0.9.2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/config engine_version"));
    EXPECT_THAT(e.what(), HasSubstr("'vllm 0.9.2'"));
    EXPECT_THAT(e.what(), HasSubstr("vllm 0.10.1.1 | vllm 0.11.0 | vllm 0.12.0 | vllm 0.33.0"));
  }
  try {
    canonical_engine_version("0.34", "--engine-version");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--engine-version"));
    EXPECT_THAT(e.what(), HasSubstr("0.33.0"));
  }
}

TEST(EngineRules, ConfigValidationAppliesTheVersionsModesAndEps) {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 0.1;
  c.mamba_cache_mode = MambaCacheMode::kAll;
  c.mamba_block_size = 32;
  EXPECT_NO_THROW(validate(c));  // unversioned: none | all | align
  c.engine_version = "vllm 0.12.0";
  EXPECT_NO_THROW(validate(c));
  c.engine_version = "vllm 0.33.0";
  try {
    validate(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/config mamba_cache_mode 'all'"));
    EXPECT_THAT(e.what(), HasSubstr("align | none"));
  }
  c.mamba_cache_mode = MambaCacheMode::kAlign;
  c.norm_eps = 1e-5;
  EXPECT_NO_THROW(validate(c));
  c.norm_eps = -1.0;
  EXPECT_THROW(validate(c), Error);
  c.norm_eps = 1e-5;
  c.engine_version = "";
  try {
    validate(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/config norm_eps"));
  }
  c.norm_eps.reset();
  c.engine_version = "vllm 0.99";
  EXPECT_THROW(validate(c), Error);
}

TEST(EngineRules, GatedNormEpsDefaultsToTheModelFamilysConfig) {
  AttentionConfig c;
  EXPECT_EQ(gated_norm_eps(c, "gdn"), 1e-6);     // Qwen3-Next rms_norm_eps
  EXPECT_EQ(gated_norm_eps(c, "mamba2"), 1e-5);  // Falcon-H1 / Mamba-2 rms_norm_eps
  c.norm_eps = 3e-6;
  EXPECT_EQ(gated_norm_eps(c, "gdn"), 3e-6);
  EXPECT_EQ(gated_norm_eps(c, "mamba2"), 3e-6);
}

TEST(EngineRules, Fp8KvCacheDtypeIsVllmsAliasOfE4M3) {
  EXPECT_EQ(kv_cache_dtype_from_string("fp8"), KvCacheDtype::kFp8E4M3);
  EXPECT_EQ(to_string(kv_cache_dtype_from_string("fp8")), "fp8_e4m3");  // written back canonical
  EXPECT_EQ(kv_storage_dtype(kv_cache_dtype_from_string("fp8"), DType::kBFloat16), DType::kFloat8E4M3);
}

}  // namespace
}  // namespace hybridtb
