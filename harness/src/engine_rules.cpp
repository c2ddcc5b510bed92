// The engine rule table (engine_rules.h). Each versioned entry is read off that release's source
// (vllm/v1/attention/backends/utils.py and mamba_attn.py / mamba2_attn.py / gdn_attn.py, the
// Mamba ops' skip masks, vllm/config/cache.py, mamba_utils.py, the Qwen3-Next and Falcon-H1 models)
// and checked against its capture contract by tests/core/test_engine_rules.cpp.
#include "hybridtb/engine_rules.h"

#include <array>
#include <cmath>

#include "hybridtb/error.h"

namespace hybridtb {
namespace {

using enum MambaCacheMode;

// hybridtb's rules before engine versions (files without /config engine_version): the seed's
// builder (PAD_SLOT_ID −1 for padding requests, negative indices skipped, modes none | all | align,
// a one-token request without context counted as a decode), hybridtb's [conv_dim, K−1] conv state
// and fixed norm constants. No single release has exactly this set: mamba_cache_mode with both
// 'all' and 'align' is newer than 0.12.0 (enable_prefix_caching, i.e. 'all' only) and older than
// 0.33.0 ('align' | 'none'). Both tables are function-local statics: built on first use, whatever
// the order of static initialisation.
const EngineRules& unversioned() {
  static const EngineRules rules{
    .version = "",
    .pad_slot_id = -1,
    .null_block_id = 0,
    .padded_request_state_index = -1,
    .state_index_skip = StateIndexSkip::kNegative,
    .mamba_cache_modes = std::vector<MambaCacheMode>{kNone, kAll, kAlign},
    .accepted_mamba_cache_modes = {kNone, kAll, kAlign},
    .treat_short_extends_as_decodes = true,
    .conv_state_layout = ConvStateLayout::kDS,
    .norm_eps_from_config = false,
  };
  return rules;
}

// vLLM 0.10.1.1: PAD_SLOT_ID and `!= pad_slot_id` masks, the null block 0 (BlockPool's first block;
// no NULL_BLOCK_ID constant yet), no padding of state
// indices in the Mamba-1 builder (its Mamba-2 builder pads with PAD_SLOT_ID, which
// padding_state_index() gives), no Mamba prefix caching, no treat_short_extends_as_decodes, the V1
// conv state allocated (K−1, dim) (the mixers view it transposed), norm eps from the model config.
// vLLM 0.11.0: as 0.10.1.1, and its builder pads state_indices_tensor[num_decodes:] = PAD_SLOT_ID
// (0.11 forces enable_prefix_caching off for hybrid models).
// vLLM 0.12.0: as 0.11.0 plus prefix caching through enable_prefix_caching (the block_idx_* fields:
// hybridtb's mode 'all').
// vLLM 0.33.0: NULL_BLOCK_ID 0 fills the padding rows and the ops mask `!= null_block_id`;
// mamba_cache_mode 'align' | 'none'; the Mamba and GDN builders split with
// treat_short_extends_as_decodes = False; get_conv_state_layout() defaults to "SD".
const std::array<EngineRules, 4>& versioned() {
  static const std::array<EngineRules, 4> rules{{
    {.version = "vllm 0.10.1.1",
     .pad_slot_id = -1,
     .null_block_id = 0,
     .padded_request_state_index = std::nullopt,
     .state_index_skip = StateIndexSkip::kNegative,
     .mamba_cache_modes = std::nullopt,
     .accepted_mamba_cache_modes = {kNone},
     .treat_short_extends_as_decodes = true,
     .conv_state_layout = ConvStateLayout::kSD,
     .norm_eps_from_config = true},
    {.version = "vllm 0.11.0",
     .pad_slot_id = -1,
     .null_block_id = 0,
     .padded_request_state_index = -1,
     .state_index_skip = StateIndexSkip::kNegative,
     .mamba_cache_modes = std::nullopt,
     .accepted_mamba_cache_modes = {kNone},
     .treat_short_extends_as_decodes = true,
     .conv_state_layout = ConvStateLayout::kSD,
     .norm_eps_from_config = true},
    {.version = "vllm 0.12.0",
     .pad_slot_id = -1,
     .null_block_id = 0,
     .padded_request_state_index = -1,
     .state_index_skip = StateIndexSkip::kNegative,
     .mamba_cache_modes = std::nullopt,
     .accepted_mamba_cache_modes = {kNone, kAll},
     .treat_short_extends_as_decodes = true,
     .conv_state_layout = ConvStateLayout::kSD,
     .norm_eps_from_config = true},
    {.version = "vllm 0.33.0",
     .pad_slot_id = -1,
     .null_block_id = 0,
     .padded_request_state_index = 0,
     .state_index_skip = StateIndexSkip::kNonPositive,
     .mamba_cache_modes = std::vector<MambaCacheMode>{kAlign, kNone},
     .accepted_mamba_cache_modes = {kAlign, kNone},
     .treat_short_extends_as_decodes = false,
     .conv_state_layout = ConvStateLayout::kSD,
     .norm_eps_from_config = true},
  }};
  return rules;
}

std::string supported_text() {
  std::string text;
  for (const EngineRules& rules : versioned()) text += (text.empty() ? "" : " | ") + std::string(rules.version);
  return text;
}

}  // namespace

std::string_view to_string(StateIndexSkip skip) {
  return skip == StateIndexSkip::kNegative ? "negative" : "nonpositive";
}

std::string_view to_string(ConvStateLayout layout) { return layout == ConvStateLayout::kDS ? "DS" : "SD"; }

bool EngineRules::has_mamba_cache_mode(MambaCacheMode mode) const {
  for (MambaCacheMode m : accepted_mamba_cache_modes) {
    if (m == mode) return true;
  }
  return false;
}

std::string EngineRules::mamba_cache_modes_text() const {
  std::string text;
  for (MambaCacheMode m : accepted_mamba_cache_modes) text += (text.empty() ? "" : " | ") + std::string(to_string(m));
  return text;
}

const EngineRules& engine_rules(std::string_view engine_version) {
  if (engine_version.empty()) return unversioned();
  for (const EngineRules& rules : versioned()) {
    if (rules.version == engine_version) return rules;
  }
  throw Error(detail::concat("/config engine_version: unknown value '", engine_version, "' (supported: ",
                             supported_text(), "; absent = the unversioned rules of hybrid-batch 1.2)"));
}

const EngineRules& engine_rules(const AttentionConfig& config) { return engine_rules(config.engine_version); }

std::vector<std::string> supported_engine_versions() {
  std::vector<std::string> versions;
  for (const EngineRules& rules : versioned()) versions.emplace_back(rules.version);
  return versions;
}

std::string newest_engine_version() { return std::string(versioned().back().version); }

std::string canonical_engine_version(std::string_view text, std::string_view field) {
  if (text == "none") return "";
  for (const EngineRules& rules : versioned()) {
    if (text == rules.version || "vllm " + std::string(text) == rules.version) return std::string(rules.version);
  }
  throw Error(detail::concat(field, ": unknown engine version '", text, "' (supported: ", supported_text(),
                             ", a bare release such as 0.12.0, or none for the unversioned rules)"));
}

double gated_norm_eps(const AttentionConfig& config, std::string_view mode) {
  if (config.norm_eps) return *config.norm_eps;
  // Qwen3-Next's Qwen3NextConfig.rms_norm_eps default; Falcon-H1's (and mamba_ssm's Mamba2) 1e-5.
  return mode == "gdn" ? 1e-6 : 1e-5;
}

}  // namespace hybridtb
