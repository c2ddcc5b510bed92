// `hybridtb gen`: model presets (realistic layer shapes), the key=value settings that override
// any field of the layer and builder config, and the generation of one whole batch file from a
// preset, a mix (mix.h) and the generator options. Documented in datasets/GENERATING.md; checked
// by tests/gen.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/config.h"
#include "hybridtb/mix.h"
#include "hybridtb/progress.h"

namespace hybridtb {

// A layer being configured: the config plus the fields derived when it is finished (so that
// overriding num_heads or head_size keeps the sinks, ALiBi slopes and scale consistent).
struct LayerSettings {
  AttentionConfig attention;  // attention.scale == 0 means "auto": 1/sqrt(head_size)
  BuilderConfig builder;
  std::string sinks = "off";         // off | on (a fixed spread in [-2, 3), one per head) | v0,v1,...
  std::string alibi_slopes = "off";  // off | on (the standard slopes for num_heads) | v0,v1,...

  LayerSettings();  // the defaults every preset starts from (block_size 16, bfloat16, ...)
};

// Applies one "key=value" (or "ssm.<param>=value"). Throws Error naming the setting, e.g.
//   --set dtype=float13: /config dtype: unknown ... ; --set windw=4: unknown key 'windw' (keys: ...)
void apply_setting(LayerSettings& layer, std::string_view key_value);

// The finished layer: derived fields filled in, then validate()d.
struct Layer {
  AttentionConfig attention;
  BuilderConfig builder;
};
Layer finish(const LayerSettings& layer);

// The keys apply_setting knows, one "key  values  meaning" line each (for --help and the docs).
std::string settings_help();

struct Preset {
  std::string name;
  std::string description;            // the model and what is assumed
  std::vector<std::string> settings;  // key=value, applied in order on top of LayerSettings()
};
const std::vector<Preset>& presets();
// Throws Error listing the preset names if `name` is unknown.
const Preset& find_preset(std::string_view name);
// "all" → every preset; otherwise a comma-separated list of names (each checked, order kept).
std::vector<std::string> expand_preset_list(std::string_view list);
// The preset's settings, then `overrides` (each "key=value"), finished.
Layer make_layer(std::string_view preset, const std::vector<std::string>& overrides = {});

struct GenOptions {
  uint64_t seed = 0;
  int64_t pad_to = 0;             // > 0: CUDA-graph padding of a decode-only mix up to this many requests/tokens
  int64_t prefix_hit_tokens = 0;  // > 0: requests with at least this context share their prefix blocks
  bool alias_blocks = false;      // random aliasing of the blocks a request only reads
  bool shuffle_blocks = true;     // false: consecutive block ids in request order
  // A dedicated /batch/ssm_block_table; default: when the layer keeps state (an SSM branch or a
  // linear-attention layer). true also gives a plain attention layer the table of its model's step.
  std::optional<bool> ssm_slots;
  std::map<std::string, std::string> provenance;  // extra root attributes (preset, mix, command line)
  ProgressSink* progress = nullptr;  // how far the generation got (SyntheticOptions::progress)
};

// One batch of `mix` on `layer`: requests in vLLM's order, compact shuffled paging with the null
// block, fast seeded data, num_accepted_tokens drawn in [1, K] for speculative decodes (which set
// num_speculative_tokens to K − 1), padding for --pad-to (which turns on full CUDA graphs with a
// capture size of N), and the SSM mode's weights and pools (num_slots = ssm_slots_needed).
// Validated before it is returned. Throws Error on options that cannot apply (--pad-to on a mix
// that is not decode-only, speculative decodes with mamba_cache_mode all, ...).
BatchFile generate_batch(const Layer& layer, const Mix& mix, const GenOptions& options);


}  // namespace hybridtb
