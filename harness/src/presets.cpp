// Model presets, key=value settings and whole generated batches for `hybridtb gen` (presets.h).
// The preset table is mirrored in datasets/GENERATING.md; tests/gen/test_presets.cpp replays a
// small mix of every preset on the reference.
#include "hybridtb/presets.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "hybridtb/spec/linear_layer_specs.h"
#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/synthetic.h"

namespace hybridtb {

namespace {

// vLLM's default CUDA-graph capture sizes (up to 256): 1, 2, 4, then every multiple of 8.
std::vector<int64_t> default_capture_sizes() {
  std::vector<int64_t> sizes{1, 2, 4};
  for (int64_t s = 8; s <= 256; s += 8) sizes.push_back(s);
  return sizes;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(trim(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

// An integer, optionally with a 'k' suffix (×1024): "4096", "4k".
int64_t parse_int(const std::string& text) {
  std::string digits = text;
  int64_t factor = 1;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
    digits.pop_back();
    factor = 1024;
  }
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  HYBRIDTB_CHECK(ec == std::errc() && end == digits.data() + digits.size() && !digits.empty(),
                 "expected an integer (optionally with a k suffix), got '", text, "'");
  return value * factor;
}

double parse_double(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HYBRIDTB_CHECK(used == text.size() && !text.empty(), "expected a number, got '", text, "'");
  return value;
}

bool parse_bool(const std::string& text) {
  if (text == "true" || text == "1" || text == "on" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "off" || text == "no") return false;
  throw Error(detail::concat("expected true|false (or on|off, 1|0), got '", text, "'"));
}

std::vector<float> parse_float_list(const std::string& text) {
  std::vector<float> values;
  for (const std::string& part : split(text, ',')) values.push_back(static_cast<float>(parse_double(part)));
  return values;
}

// A list value: off | on | v0,v1,... (the list must have one entry per query head when finished).
std::string parse_switch_or_list(const std::string& text) {
  if (text == "off" || text == "on") return text;
  parse_float_list(text);  // checked now, applied when the layer is finished
  return text;
}

struct Key {
  std::string name;
  std::string values;
  std::string meaning;
  std::function<void(LayerSettings&, const std::string&)> apply;
};

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      {"num_heads", "int", "query heads Hq", [](LayerSettings& l, const std::string& v) { l.attention.num_heads = parse_int(v); }},
      {"num_kv_heads", "int", "key/value heads Hkv (Hq % Hkv == 0)",
       [](LayerSettings& l, const std::string& v) { l.attention.num_kv_heads = parse_int(v); }},
      {"head_size", "int", "head size D (>= 32)", [](LayerSettings& l, const std::string& v) { l.attention.head_size = parse_int(v); }},
      {"block_size", "int", "tokens per KV-cache block (multiple of 16)",
       [](LayerSettings& l, const std::string& v) { l.attention.block_size = parse_int(v); }},
      {"scale", "auto | float | 1/sqrt(x)", "softmax scale (auto: 1/sqrt(head_size))",
       [](LayerSettings& l, const std::string& v) {
         if (v == "auto") {
           l.attention.scale = 0.0;
         } else if (v.starts_with("1/sqrt(") && v.ends_with(")")) {
           l.attention.scale = 1.0 / std::sqrt(parse_double(v.substr(7, v.size() - 8)));
         } else {
           l.attention.scale = parse_double(v);
         }
         HYBRIDTB_CHECK(l.attention.scale >= 0 && std::isfinite(l.attention.scale), "the scale must be finite and > 0");
       }},
      {"sliding_window", "int", "0 = none; w: a query at p sees keys p-w+1..p",
       [](LayerSettings& l, const std::string& v) { l.attention.sliding_window = parse_int(v); }},
      {"logits_soft_cap", "float", "0 = off", [](LayerSettings& l, const std::string& v) { l.attention.logits_soft_cap = parse_double(v); }},
      {"alibi_slopes", "off | on | v0,v1,...", "ALiBi (on: the standard slopes for num_heads)",
       [](LayerSettings& l, const std::string& v) { l.alibi_slopes = parse_switch_or_list(v); }},
      {"use_alibi_sqrt", "bool", "sqrt-form ALiBi", [](LayerSettings& l, const std::string& v) { l.attention.use_alibi_sqrt = parse_bool(v); }},
      {"sinks", "off | on | v0,v1,...", "attention-sink logits per query head (on: a fixed spread)",
       [](LayerSettings& l, const std::string& v) { l.sinks = parse_switch_or_list(v); }},
      {"dtype", "float32 | float16 | bfloat16", "query/key/value dtype",
       [](LayerSettings& l, const std::string& v) { l.attention.dtype = dtype_from_string(v, "/config dtype"); }},
      {"kv_cache_dtype", "auto | fp8 | fp8_e4m3 | fp8_e5m2 | int8_per_token_head | fp8_per_token_head", "KV-cache storage",
       [](LayerSettings& l, const std::string& v) { l.attention.kv_cache_dtype = kv_cache_dtype_from_string(v); }},
      {"attn_type", "decoder | encoder_only", "attention type",
       [](LayerSettings& l, const std::string& v) { l.attention.attn_type = attn_type_from_string(v); }},
      {"ssm_mode", "none | a registered mode",
       "the SSM history branch (reference/ssm/README.md); a different mode drops the ssm.* set before it",
       [](LayerSettings& l, const std::string& v) {
         if (v != "none") spec::ssm::ModeSpecRegistry::instance().find(v);  // throws listing the modes
         if (v != l.attention.ssm_mode) l.attention.ssm_params.clear();  // another mode: its own parameters
         l.attention.ssm_mode = v;
       }},
      {"layer_kind", "full_attention | gdn | mamba2",
       "what the layer is: full attention (+ the ssm_mode branch) or a linear-attention layer, whose ssm_mode becomes "
       "the kind's (a different mode drops the ssm.* set before it)",
       [](LayerSettings& l, const std::string& v) {
         l.attention.layer_kind = layer_kind_from_string(v);
         if (!l.attention.is_linear_layer()) return;
         const std::string mode(to_string(l.attention.layer_kind));
         if (mode != l.attention.ssm_mode) l.attention.ssm_params.clear();
         l.attention.ssm_mode = mode;
       }},
      {"ssm.<param>", "int", "an integer parameter of the SSM mode (e.g. ssm.state_size)", nullptr},
      {"engine_version", "none | <release> | vllm <release>",
       "the engine whose rules the batch follows (also --engine-version; gen's default: the newest)",
       [](LayerSettings& l, const std::string& v) {
         l.attention.engine_version = canonical_engine_version(v, "engine_version");
       }},
      {"norm_eps", "auto | float", "the gated norm's eps of gdn / mamba2 (the model config's rms_norm_eps; auto: unset)",
       [](LayerSettings& l, const std::string& v) {
         if (v == "auto") {
           l.attention.norm_eps.reset();
         } else {
           l.attention.norm_eps = parse_double(v);
         }
       }},
      {"mamba_rms_norm", "bool", "mamba2's gated norm (Falcon-H1's mamba_rms_norm; false: the gate y*silu(z) alone)",
       [](LayerSettings& l, const std::string& v) { l.attention.mamba_rms_norm = parse_bool(v); }},
      {"mamba_cache_mode", "none | all | align", "SSM prefix caching (all/align: mamba_block_size defaults to 512)",
       [](LayerSettings& l, const std::string& v) { l.attention.mamba_cache_mode = mamba_cache_mode_from_string(v); }},
      {"mamba_block_size", "int", "tokens per SSM state block (0: auto)",
       [](LayerSettings& l, const std::string& v) { l.attention.mamba_block_size = parse_int(v); }},
      {"num_speculative_tokens", "int", "drafts per speculative decode (s-terms raise it to K-1)",
       [](LayerSettings& l, const std::string& v) { l.attention.num_speculative_tokens = parse_int(v); }},
      {"cudagraph_mode", "none | piecewise | full | full_decode_only | full_and_piecewise", "vLLM's CUDAGraphMode",
       [](LayerSettings& l, const std::string& v) { l.builder.cudagraph_mode = cudagraph_mode_from_string(v); }},
      {"cudagraph_capture_sizes", "n0,n1,...", "captured batch sizes, in vLLM's list order",
       [](LayerSettings& l, const std::string& v) {
         l.builder.cudagraph_capture_sizes.clear();
         for (const std::string& part : split(v, ',')) l.builder.cudagraph_capture_sizes.push_back(parse_int(part));
       }},
      {"max_num_seqs", "int", "scheduler max_num_seqs", [](LayerSettings& l, const std::string& v) { l.builder.max_num_seqs = parse_int(v); }},
  };
  return table;
}

std::string known_keys() {
  std::string out;
  for (const Key& k : keys()) out += (out.empty() ? "" : ", ") + k.name;
  return out;
}

// ALiBi slopes as in the ALiBi paper / vLLM's _get_alibi_slopes.
std::vector<float> standard_alibi_slopes(int64_t n) {
  const auto closest = static_cast<int64_t>(std::pow(2.0, std::floor(std::log2(static_cast<double>(n)))));
  auto geometric = [](int64_t count, double base) {
    std::vector<float> s;
    for (int64_t i = 1; i <= count; ++i) s.push_back(static_cast<float>(std::pow(base, static_cast<double>(i))));
    return s;
  };
  std::vector<float> slopes = geometric(closest, std::pow(2.0, -8.0 / static_cast<double>(closest)));
  if (closest != n) {
    const std::vector<float> extra = geometric(2 * closest, std::pow(2.0, -4.0 / static_cast<double>(closest)));
    for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < n; i += 2) slopes.push_back(extra[static_cast<size_t>(i)]);
  }
  return slopes;
}

std::optional<std::vector<float>> per_head_values(const std::string& setting, int64_t num_heads, const char* field,
                                                  const std::function<std::vector<float>(int64_t)>& on) {
  if (setting == "off") return std::nullopt;
  std::vector<float> values = setting == "on" ? on(num_heads) : parse_float_list(setting);
  HYBRIDTB_CHECK(static_cast<int64_t>(values.size()) == num_heads, "--set ", field, ": ", values.size(),
                 " values for num_heads = ", num_heads);
  return values;
}

uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + salt * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

LayerSettings::LayerSettings() {
  attention.block_size = 16;
  attention.scale = 0.0;  // auto
  attention.dtype = DType::kBFloat16;
}

void apply_setting(LayerSettings& layer, std::string_view key_value) {
  const size_t eq = key_value.find('=');
  HYBRIDTB_CHECK(eq != std::string_view::npos, "--set '", key_value, "': expected key=value");
  const std::string key = trim(key_value.substr(0, eq));
  const std::string value = trim(key_value.substr(eq + 1));
  try {
    HYBRIDTB_CHECK(!value.empty(), "empty value");
    if (key.starts_with("ssm.")) {
      const std::string param = key.substr(4);
      HYBRIDTB_CHECK(!param.empty(), "expected ssm.<param>");
      const int64_t v = parse_int(value);
      HYBRIDTB_CHECK(v > 0, "SSM parameters must be > 0");
      layer.attention.ssm_params[param] = v;
      return;
    }
    for (const Key& k : keys()) {
      if (k.name == key && k.apply) {
        k.apply(layer, value);
        return;
      }
    }
  } catch (const Error& e) {
    throw Error(detail::concat("--set ", key, "=", value, ": ", e.what()));
  }
  throw Error(detail::concat("--set ", key, "=", value, ": unknown key '", key, "' (keys: ", known_keys(), ")"));
}

Layer finish(const LayerSettings& settings) {
  Layer layer{settings.attention, settings.builder};
  AttentionConfig& c = layer.attention;
  if (c.scale == 0.0 && c.head_size > 0) c.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
  c.alibi_slopes = per_head_values(settings.alibi_slopes, c.num_heads, "alibi_slopes", standard_alibi_slopes);
  c.sinks = per_head_values(settings.sinks, c.num_heads, "sinks", [](int64_t n) {
    std::vector<float> s;  // a fixed, varied spread in [-2, 3): the golden-ratio sequence
    for (int64_t h = 0; h < n; ++h) {
      const double frac = std::fmod(static_cast<double>(h + 1) * 0.6180339887498949, 1.0);
      s.push_back(static_cast<float>(-2.0 + 5.0 * frac));
    }
    return s;
  });
  // Under an engine whose gated norm takes eps from the model config, a gdn / mamba2 branch records
  // it (the model family's rms_norm_eps unless --set norm_eps gave one).
  if (engine_rules(c).norm_eps_from_config && !c.norm_eps && c.has_ssm_branch() &&
      (c.ssm_mode == "gdn" || c.ssm_mode == "mamba2")) {
    c.norm_eps = gated_norm_eps(c, c.ssm_mode);
  }
  if (c.has_ssm_branch() || c.is_linear_layer()) {  // the mode's conventional parameters where none were given
    const auto& mode = spec::ssm::ModeSpecRegistry::instance().find(c.ssm_mode);
    for (const auto& [name, value] : mode.default_parameters(spec::ssm::mode_shape(c))) {
      c.ssm_params.try_emplace(name, value);
    }
  }
  if (c.mamba_cache_mode != MambaCacheMode::kNone && c.mamba_block_size == 0) {
    c.mamba_block_size = 512 % c.block_size == 0 ? 512 : c.block_size;
  }
  validate(c);
  validate(layer.builder);
  return layer;
}

std::string settings_help() {
  std::ostringstream out;
  for (const Key& k : keys()) out << "  " << k.name << " = " << k.values << "\n      " << k.meaning << "\n";
  return out.str();
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      {"llama3-8b", "Llama-3-8B: GQA 32/8, head 128, full causal attention",
       {"num_heads=32", "num_kv_heads=8", "head_size=128"}},
      {"mistral-7b", "Mistral-7B-v0.1: GQA 32/8, head 128, sliding window 4096 on every layer",
       {"num_heads=32", "num_kv_heads=8", "head_size=128", "sliding_window=4096"}},
      {"gemma3-local-128", "a Gemma-3-27B local layer: 32/16, head 128, window 1024, scale 1/sqrt(168)",
       {"num_heads=32", "num_kv_heads=16", "head_size=128", "sliding_window=1024", "scale=1/sqrt(168)"}},
      {"gemma3-local-256", "a Gemma-3-12B local layer: 16/8, head 256, window 1024, scale 1/sqrt(256)",
       {"num_heads=16", "num_kv_heads=8", "head_size=256", "sliding_window=1024"}},
      {"gpt-oss", "a gpt-oss sliding layer: 64/8, head 64, window 128, learned sinks (a fixed spread here)",
       {"num_heads=64", "num_kv_heads=8", "head_size=64", "sliding_window=128", "sinks=on"}},
      {"hymba-small",
       "Hymba-1.5B's geometry: 25/5 heads of 64 (hidden 1600), window 1024, mamba1 branch "
       "(intermediate 3200, state 16, conv 4, dt_rank 100)",
       {"num_heads=25", "num_kv_heads=5", "head_size=64", "sliding_window=1024", "ssm_mode=mamba1",
        "ssm.intermediate_size=3200", "ssm.state_size=16", "ssm.conv_kernel=4", "ssm.dt_rank=100"}},
      {"mamba-2.8b",
       "a Mamba-2.8B-sized SSM branch (d_model 2560: intermediate 5120, state 16, conv 4, dt_rank 160) behind a "
       "minimal attention part (40 query heads of 64 = 2560, one KV head, window 16)",
       {"num_heads=40", "num_kv_heads=1", "head_size=64", "sliding_window=16", "ssm_mode=mamba1",
        "ssm.intermediate_size=5120", "ssm.state_size=16", "ssm.conv_kernel=4", "ssm.dt_rank=160"}},
      // Per-layer hybrids (linear-attention layers). A linear layer's attention attributes are its
      // model's attention layers' (the step's metadata is one build for all layers), so a model's
      // presets share them and the same mix and seed give its layers one batch.
      {"qwen3-next-attention",
       "a Qwen3-Next-80B-A3B full-attention layer (every 4th layer): GQA 16/2, head 256, no window",
       {"num_heads=16", "num_kv_heads=2", "head_size=256"}},
      {"qwen3-next-gdn",
       "a Qwen3-Next-80B-A3B Gated DeltaNet layer (3 of every 4): 16 key heads, 32 value heads, dk = dv = 128, "
       "conv 4 (conv_dim 8192, state 2 MiB fp32 per request); attention attributes those of qwen3-next-attention",
       {"num_heads=16", "num_kv_heads=2", "head_size=256", "layer_kind=gdn", "ssm.num_k_heads=16",
        "ssm.num_v_heads=32", "ssm.head_k_dim=128", "ssm.head_v_dim=128", "ssm.conv_kernel=4"}},
      {"falcon-h1-7b-mamba2",
       "Falcon-H1-7B's Mamba-2 mixer as a linear layer: 24 SSM heads of 128, state 256, 1 group, conv 4 "
       "(d_ssm 3072, conv_dim 3584); attention attributes those of its attention (12/2, head 128). Falcon-H1 runs "
       "both in parallel in every layer; here the mixer is a layer of its own",
       {"num_heads=12", "num_kv_heads=2", "head_size=128", "layer_kind=mamba2", "ssm.num_ssm_heads=24",
        "ssm.head_dim=128", "ssm.state_size=256", "ssm.n_groups=1", "ssm.conv_kernel=4"}},
  };
  return table;
}

const Preset& find_preset(std::string_view name) {
  std::string names;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw Error(detail::concat("unknown preset '", name, "' (presets: ", names, ", or all)"));
}

std::vector<std::string> expand_preset_list(std::string_view list) {
  std::vector<std::string> names;
  if (trim(list) == "all") {
    for (const Preset& p : presets()) names.push_back(p.name);
    return names;
  }
  for (const std::string& name : split(list, ',')) names.push_back(find_preset(name).name);
  return names;
}

Layer make_layer(std::string_view preset, const std::vector<std::string>& overrides) {
  LayerSettings settings;
  for (const std::string& s : find_preset(preset).settings) apply_setting(settings, s);
  for (const std::string& s : overrides) apply_setting(settings, s);
  return finish(settings);
}

BatchFile generate_batch(const Layer& layer, const Mix& mix, const GenOptions& options) {
  AttentionConfig config = layer.attention;
  BuilderConfig builder = layer.builder;
  const std::string mix_name = to_string(mix);
  HYBRIDTB_CHECK(!mix.terms.empty(), "the mix is empty");
  HYBRIDTB_CHECK(options.prefix_hit_tokens >= 0, "--prefix-hits must be >= 0, got ", options.prefix_hit_tokens);

  // Speculative decodes: K tokens = 1 + num_speculative_tokens.
  // The layer keeps recurrent state: a parallel SSM branch, or a linear layer's mixer.
  const bool has_state = config.has_ssm_branch() || config.is_linear_layer();
  const int64_t k = mix.max_speculative_query_len();
  if (k > 0) {
    config.num_speculative_tokens = std::max(config.num_speculative_tokens, k - 1);
    HYBRIDTB_CHECK(!(has_state && config.mamba_cache_mode == MambaCacheMode::kAll), "mix '", mix_name,
                   "' has speculative decodes, which mamba_cache_mode all does not support (vLLM: speculative decoding "
                   "is not supported with Mamba prefix caching)");
  }

  SyntheticOptions synthetic{.seed = options.seed, .shuffle_blocks = options.shuffle_blocks};
  synthetic.compact = true;
  synthetic.fast_fill = true;
  synthetic.progress = options.progress;
  synthetic.shared_prefix_tokens = options.prefix_hit_tokens;
  synthetic.alias_blocks = options.alias_blocks;
  // auto: when the layer keeps state; on: also for a plain attention layer, so that it carries the
  // SSM block table of its model's step (a per-layer model's layers share one /batch).
  synthetic.ssm_block_table = options.ssm_slots.value_or(has_state);

  if (options.pad_to > 0) {
    const int64_t n = options.pad_to;
    HYBRIDTB_CHECK(mix.decode_only(), "--pad-to ", n, " pads a decode-only step (dN@C terms only); mix '", mix_name,
                   "' is not one");
    HYBRIDTB_CHECK(n >= mix.num_requests(), "--pad-to ", n, " is smaller than the mix's ", mix.num_requests(),
                   " requests");
    HYBRIDTB_CHECK(n <= builder.max_num_seqs, "--pad-to ", n, " exceeds max_num_seqs ", builder.max_num_seqs);
    if (builder.cudagraph_mode == CudaGraphMode::kNone) builder.cudagraph_mode = CudaGraphMode::kFullAndPiecewise;
    HYBRIDTB_CHECK(has_full_cudagraphs(builder.cudagraph_mode), "--pad-to ", n,
                   " models a full CUDA graph, but cudagraph_mode is ", to_string(builder.cudagraph_mode));
    if (builder.cudagraph_capture_sizes.empty()) {
      builder.cudagraph_capture_sizes = default_capture_sizes();
      if (std::find(builder.cudagraph_capture_sizes.begin(), builder.cudagraph_capture_sizes.end(), n) ==
          builder.cudagraph_capture_sizes.end()) {
        builder.cudagraph_capture_sizes.push_back(n);
        std::sort(builder.cudagraph_capture_sizes.begin(), builder.cudagraph_capture_sizes.end());
      }
    }
    HYBRIDTB_CHECK(std::find(builder.cudagraph_capture_sizes.begin(), builder.cudagraph_capture_sizes.end(), n) !=
                       builder.cudagraph_capture_sizes.end(),
                   "--pad-to ", n, " is not one of the cudagraph_capture_sizes");
    synthetic.padding_requests = n - mix.num_requests();
    synthetic.padding_tokens = n - mix.num_tokens();
  }

  std::vector<RequestSpec> requests = mix_requests(mix);
  // vLLM 0.33's reorder puts every request without context in the prefill region, whatever its
  // query length (a dN@0 term is a prefill there): stable, after the decodes and chunks.
  if (!engine_rules(config).short_extends_are_decodes()) {
    std::stable_partition(requests.begin(), requests.end(), [](const RequestSpec& r) { return r.context_len > 0; });
  }
  std::mt19937_64 accepted_rng(mix_seed(options.seed, 1));
  for (RequestSpec& r : requests) {
    if (r.num_accepted_tokens > 0) {
      std::uniform_int_distribution<int32_t> accepted(1, static_cast<int32_t>(r.query_len));
      r.num_accepted_tokens = accepted(accepted_rng);
    }
  }

  BatchFile file = make_synthetic_batch(config, builder, requests, synthetic);
  if (has_state) {
    auto tensors = spec::ssm::make_random_ssm_tensors(config, std::max<int64_t>(1, ssm_slots_needed(file.batch)),
                                                           mix_seed(options.seed, 2));
    file.inputs.ssm_state = std::move(tensors.ssm_state);
    file.inputs.weights = std::move(tensors.weights);
    const StepTensors views = file.inputs.views();
    if (config.is_linear_layer()) {
      spec::ssm::validate_linear_tensors(config, views.ssm_state, views.weights);
    } else {
      spec::ssm::validate_ssm_tensors(config, views.ssm_state, views.weights);
    }
  }
  file.provenance["producer"] = "hybridtb gen";
  file.provenance["mix"] = mix_name;
  file.provenance["seed"] = std::to_string(options.seed);
  for (const auto& [key, value] : options.provenance) file.provenance[key] = value;
  return file;
}


}  // namespace hybridtb
