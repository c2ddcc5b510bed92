// The serving engine's rules around the layer math, by engine version: which state index a padding
// request gets, which state indices the SSM kernels skip, which mamba_cache_mode values exist, how a
// request without context is split, how the conv state is laid out and where the gated norm's eps
// comes from. A batch names its engine with /config engine_version ("vllm 0.33.0", schema 1.3); a
// file without it keeps the rules hybridtb has always applied (the unversioned rule set below), so
// every older file replays unchanged.
//
// One table serves every consumer: the metadata builders (harness/spec/src/mamba_metadata_builder.cpp,
// split_and_order.cpp), the per-request SSM plan both backends share (harness/spec/src/ssm_plan.cpp),
// the SSM modes' state specs (conv layout) and `hybridtb gen`. tests/core/test_engine_rules.cpp
// checks every versioned entry fact by fact against the capture contract of that release
// (datasets/capture/contracts/vllm-<release>.json, engine_rules).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridtb/config.h"

namespace hybridtb {

// Which state indices the SSM kernels treat as "no state: skip the row" (never read or written).
enum class StateIndexSkip : uint8_t {
  kNegative,     // index < 0: PAD_SLOT_ID (−1) marks padding (vLLM ≤ 0.12: `!= pad_slot_id` masks)
  kNonPositive,  // index <= 0: NULL_BLOCK_ID (0) marks padding (vLLM 0.33: `!= null_block_id` masks)
};
std::string_view to_string(StateIndexSkip skip);  // "negative" | "nonpositive"

// How a conv-state slot is stored.
enum class ConvStateLayout : uint8_t {
  kDS,  // [conv_dim, K−1]: per channel, the last K−1 inputs oldest first (hybridtb's own layout)
  kSD,  // [K−1, conv_dim]: per past token, every channel (vLLM's allocation; dim innermost)
};
std::string_view to_string(ConvStateLayout layout);  // "DS" | "SD"

struct EngineRules {
  // "vllm <release>" as stored in /config engine_version; empty for the unversioned rule set.
  std::string_view version;
  // slot_mapping's padding sentinel and the conv1d program lists' fill (PAD_SLOT_ID).
  int32_t pad_slot_id = -1;
  // The null block of the block tables (NULL_BLOCK_ID in 0.33; BlockPool's first block, id 0, in
  // every V1 release); nullopt would mean a release without one.
  std::optional<int32_t> null_block_id;
  // The state index the release's Mamba builder writes into the rows of padding requests under a
  // full CUDA graph (`state_indices_tensor[num_decodes:] = ...`); nullopt where it pads no state
  // index. hybridtb gives every row of a padding request padding_state_index() (mamba builder).
  std::optional<int32_t> padded_request_state_index;
  StateIndexSkip state_index_skip = StateIndexSkip::kNegative;
  // The release's MambaCacheMode values, in its Literal's order; nullopt where it has no
  // mamba_cache_mode (prefix caching, if any, follows enable_prefix_caching).
  std::optional<std::vector<MambaCacheMode>> mamba_cache_modes;
  // The /config mamba_cache_mode values a batch of this release may carry: its modes, or where it
  // has none, 'none' plus 'all' where enable_prefix_caching drives the block_idx_* prefix caching
  // hybridtb calls 'all' (0.12.0).
  std::vector<MambaCacheMode> accepted_mamba_cache_modes;
  // split_decodes_and_prefills' treat_short_extends_as_decodes as the Mamba builder uses it (true
  // where the release has no such parameter: every short query is a decode there).
  bool treat_short_extends_as_decodes = true;
  ConvStateLayout conv_state_layout = ConvStateLayout::kDS;
  // true: the gated norm's eps is the model config's rms_norm_eps (/config norm_eps, defaulting to
  // the model family's config default); false: the mode's fixed constant (gdn 1e-6, mamba2 1e-5).
  bool norm_eps_from_config = false;

  // True when the SSM kernels skip a row with this state index.
  bool skips_state_index(int64_t index) const {
    return state_index_skip == StateIndexSkip::kNegative ? index < 0 : index <= 0;
  }
  // What hybridtb writes into every state-index row of a padding request: the release's
  // padded_request_state_index, else PAD_SLOT_ID. Always skipped under the same rules.
  int32_t padding_state_index() const { return padded_request_state_index.value_or(pad_slot_id); }
  // True when a short query (query_len <= the decode threshold) of a request without context is a
  // decode; false when such a request (still prefilling: it has computed no token) is a prefill.
  bool short_extends_are_decodes() const { return treat_short_extends_as_decodes; }
  bool has_mamba_cache_mode(MambaCacheMode mode) const;
  std::string mamba_cache_modes_text() const;  // the accepted modes, "none | all | align"
};

// The rules of an engine version: "" = the unversioned rules; otherwise one of
// supported_engine_versions(). Anything else is an Error naming /config engine_version and the
// supported list.
const EngineRules& engine_rules(std::string_view engine_version);
// The rules a layer config runs under (config.engine_version).
const EngineRules& engine_rules(const AttentionConfig& config);
// Every supported "vllm <release>", oldest first.
std::vector<std::string> supported_engine_versions();
// The newest supported version (what `hybridtb gen` writes unless told otherwise).
std::string newest_engine_version();
// Accepts "vllm 0.12.0" or a bare "0.12.0" (the gen option's shorthand) and returns the stored form;
// "none" returns "" (the unversioned rules). Error naming `field` and the supported list otherwise.
std::string canonical_engine_version(std::string_view text, std::string_view field);

// The gated norm's eps for the SSM mode / layer kind `mode` ("gdn" or "mamba2") under `config`:
// config.norm_eps when set, else the model family's config default (Qwen3-Next rms_norm_eps 1e-6,
// Falcon-H1 / Mamba-2 rms_norm_eps 1e-5), which are also the constants unversioned files use.
double gated_norm_eps(const AttentionConfig& config, std::string_view mode);

}  // namespace hybridtb
