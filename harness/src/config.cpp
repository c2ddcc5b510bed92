// Config enums ↔ their schema strings, and range checks of the layer and builder settings.
#include "hybridtb/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"

namespace hybridtb {

namespace {
template <typename Enum, size_t N>
std::string_view name_of(const std::array<std::pair<Enum, std::string_view>, N>& table, Enum value) {
  for (const auto& [e, name] : table) {
    if (e == value) return name;
  }
  throw Error("unknown enum value");
}

template <typename Enum, size_t N>
Enum parse(const std::array<std::pair<Enum, std::string_view>, N>& table, std::string_view name,
           std::string_view field) {
  std::string expected;
  for (const auto& [e, n] : table) {
    if (n == name) return e;
    expected += (expected.empty() ? "" : " | ") + std::string(n);
  }
  throw Error(detail::concat(field, ": unknown value '", name, "' (expected ", expected, ")"));
}

constexpr std::array<std::pair<KvCacheDtype, std::string_view>, 5> kKvCacheDtypes = {{
    {KvCacheDtype::kAuto, "auto"},
    {KvCacheDtype::kFp8E4M3, "fp8_e4m3"},
    {KvCacheDtype::kFp8E5M2, "fp8_e5m2"},
    {KvCacheDtype::kInt8PerTokenHead, "int8_per_token_head"},
    {KvCacheDtype::kFp8PerTokenHead, "fp8_per_token_head"},
}};
constexpr std::array<std::pair<AttnType, std::string_view>, 2> kAttnTypes = {{
    {AttnType::kDecoder, "decoder"},
    {AttnType::kEncoderOnly, "encoder_only"},
}};
constexpr std::array<std::pair<LayerKind, std::string_view>, 3> kLayerKinds = {{
    {LayerKind::kFullAttention, "full_attention"},
    {LayerKind::kGdn, "gdn"},
    {LayerKind::kMamba2, "mamba2"},
}};
constexpr std::array<std::pair<MambaCacheMode, std::string_view>, 3> kMambaCacheModes = {{
    {MambaCacheMode::kNone, "none"},
    {MambaCacheMode::kAll, "all"},
    {MambaCacheMode::kAlign, "align"},
}};
constexpr std::array<std::pair<CudaGraphMode, std::string_view>, 5> kCudaGraphModes = {{
    {CudaGraphMode::kNone, "none"},
    {CudaGraphMode::kPiecewise, "piecewise"},
    {CudaGraphMode::kFull, "full"},
    {CudaGraphMode::kFullDecodeOnly, "full_decode_only"},
    {CudaGraphMode::kFullAndPiecewise, "full_and_piecewise"},
}};
}  // namespace

std::string_view to_string(KvCacheDtype kv) { return name_of(kKvCacheDtypes, kv); }
KvCacheDtype kv_cache_dtype_from_string(std::string_view name) {
  // vLLM's "fp8" means the platform's fp8 type, e4m3fn on CUDA.
  if (name == "fp8") return KvCacheDtype::kFp8E4M3;
  return parse(kKvCacheDtypes, name, "/config kv_cache_dtype");
}
bool is_per_token_head(KvCacheDtype kv) {
  return kv == KvCacheDtype::kInt8PerTokenHead || kv == KvCacheDtype::kFp8PerTokenHead;
}
bool is_quantized(KvCacheDtype kv) { return kv != KvCacheDtype::kAuto; }

DType kv_storage_dtype(KvCacheDtype kv, DType model_dtype) {
  switch (kv) {
    case KvCacheDtype::kAuto:
      return model_dtype;
    case KvCacheDtype::kFp8E4M3:
    case KvCacheDtype::kFp8PerTokenHead:
      return DType::kFloat8E4M3;
    case KvCacheDtype::kFp8E5M2:
      return DType::kFloat8E5M2;
    case KvCacheDtype::kInt8PerTokenHead:
      return DType::kInt8;
  }
  throw Error("unknown KvCacheDtype");
}

std::string_view to_string(AttnType type) { return name_of(kAttnTypes, type); }
AttnType attn_type_from_string(std::string_view name) { return parse(kAttnTypes, name, "/config attn_type"); }

std::string_view to_string(LayerKind kind) { return name_of(kLayerKinds, kind); }
LayerKind layer_kind_from_string(std::string_view name) { return parse(kLayerKinds, name, "/config layer_kind"); }

std::string_view to_string(MambaCacheMode mode) { return name_of(kMambaCacheModes, mode); }
MambaCacheMode mamba_cache_mode_from_string(std::string_view name) {
  return parse(kMambaCacheModes, name, "/config mamba_cache_mode");
}

std::string_view to_string(CudaGraphMode mode) { return name_of(kCudaGraphModes, mode); }
CudaGraphMode cudagraph_mode_from_string(std::string_view name) {
  return parse(kCudaGraphModes, name, "/config cudagraph_mode");
}
bool has_full_cudagraphs(CudaGraphMode mode) {
  return mode == CudaGraphMode::kFull || mode == CudaGraphMode::kFullDecodeOnly ||
         mode == CudaGraphMode::kFullAndPiecewise;
}

int64_t BuilderConfig::decode_cudagraph_max_bs() const {
  if (cudagraph_capture_sizes.empty()) return max_num_seqs;
  return std::min(max_num_seqs, *std::max_element(cudagraph_capture_sizes.begin(), cudagraph_capture_sizes.end()));
}

void validate(const AttentionConfig& c) {
  HYBRIDTB_CHECK(c.num_heads > 0, "/config num_heads must be > 0, got ", c.num_heads);
  HYBRIDTB_CHECK(c.num_kv_heads > 0, "/config num_kv_heads must be > 0, got ", c.num_kv_heads);
  HYBRIDTB_CHECK(c.num_heads % c.num_kv_heads == 0, "/config num_heads (", c.num_heads,
                 ") must be a multiple of num_kv_heads (", c.num_kv_heads, ")");
  HYBRIDTB_CHECK(c.head_size >= 32, "/config head_size must be >= 32 (vLLM Triton backend), got ", c.head_size);
  HYBRIDTB_CHECK(c.block_size > 0 && c.block_size % 16 == 0, "/config block_size must be a positive multiple of 16, got ",
                 c.block_size);
  HYBRIDTB_CHECK(std::isfinite(c.scale) && c.scale > 0, "/config scale must be finite and > 0, got ", c.scale);
  HYBRIDTB_CHECK(c.sliding_window >= 0, "/config sliding_window must be >= 0 (0 = none), got ", c.sliding_window);
  HYBRIDTB_CHECK(std::isfinite(c.logits_soft_cap) && c.logits_soft_cap >= 0,
                 "/config logits_soft_cap must be >= 0 (0 = off), got ", c.logits_soft_cap);
  HYBRIDTB_CHECK(c.dtype == DType::kFloat32 || c.dtype == DType::kFloat16 || c.dtype == DType::kBFloat16,
                 "/config dtype must be float32, float16 or bfloat16, got ", to_string(c.dtype));
  HYBRIDTB_CHECK(!c.ssm_mode.empty(), "/config ssm_mode must not be empty (use \"none\")");
  HYBRIDTB_CHECK(c.mamba_block_size >= 0, "/config mamba_block_size must be >= 0, got ", c.mamba_block_size);
  HYBRIDTB_CHECK(c.mamba_cache_mode == MambaCacheMode::kNone || c.mamba_block_size > 0,
                 "/config mamba_block_size must be > 0 with mamba_cache_mode ", to_string(c.mamba_cache_mode),
                 " (state blocks are mamba_block_size tokens long)");
  HYBRIDTB_CHECK(c.num_speculative_tokens >= 0, "/config num_speculative_tokens must be >= 0, got ",
                 c.num_speculative_tokens);
  if (c.alibi_slopes) {
    HYBRIDTB_CHECK(static_cast<int64_t>(c.alibi_slopes->size()) == c.num_heads, "/config/alibi_slopes has ",
                   c.alibi_slopes->size(), " entries, expected num_heads = ", c.num_heads);
    for (float s : *c.alibi_slopes) HYBRIDTB_CHECK(std::isfinite(s), "/config/alibi_slopes must be finite");
  }
  if (c.sinks) {
    HYBRIDTB_CHECK(static_cast<int64_t>(c.sinks->size()) == c.num_heads, "/config/sinks has ", c.sinks->size(),
                   " entries, expected num_heads = ", c.num_heads);
    for (float s : *c.sinks) HYBRIDTB_CHECK(std::isfinite(s), "/config/sinks must be finite");
  }
  if (c.is_linear_layer()) {
    // The kind names the mixer; ssm_mode says whose parameters (/config/ssm), pools and weights the
    // layer holds. They must agree, or a file would run one mixer on another's tensors.
    HYBRIDTB_CHECK(c.ssm_mode == to_string(c.layer_kind), "/config ssm_mode '", c.ssm_mode, "' does not match layer_kind ",
                   to_string(c.layer_kind), ": a ", to_string(c.layer_kind), " layer needs ssm_mode '",
                   to_string(c.layer_kind), "' (its parameters, state pools and weights are that mode's)");
    HYBRIDTB_CHECK(c.attn_type == AttnType::kDecoder, "/config layer_kind ", to_string(c.layer_kind),
                   " needs attn_type decoder (a linear-attention layer keeps recurrent state per request), got ",
                   to_string(c.attn_type));
  }
  // The engine's rules: a known version (engine_rules throws naming the field and the list), a
  // mamba_cache_mode the release has, eps from the config only where the release takes it so.
  const EngineRules& rules = engine_rules(c.engine_version);
  HYBRIDTB_CHECK(rules.has_mamba_cache_mode(c.mamba_cache_mode), "/config mamba_cache_mode '",
                 to_string(c.mamba_cache_mode), "' does not exist in engine_version ",
                 c.engine_version.empty() ? std::string("(none: the unversioned rules)") : c.engine_version,
                 " (its modes: ", rules.mamba_cache_modes_text(), ")");
  if (c.norm_eps) {
    HYBRIDTB_CHECK(std::isfinite(*c.norm_eps) && *c.norm_eps > 0, "/config norm_eps must be finite and > 0, got ",
                   *c.norm_eps);
    HYBRIDTB_CHECK(rules.norm_eps_from_config, "/config norm_eps needs an engine_version whose gated norm takes eps "
                   "from the model config; without engine_version the modes use their fixed eps (gdn 1e-6, mamba2 "
                   "1e-5)");
  }
  HYBRIDTB_CHECK(c.mamba_rms_norm || c.ssm_mode == "mamba2", "/config mamba_rms_norm = 0 applies to ssm_mode mamba2 "
                 "(Falcon-H1's Mixer2RMSNormGated), not to ssm_mode '", c.ssm_mode, "'");
  HYBRIDTB_CHECK(c.tp_size >= 1, "/config tp_size must be >= 1, got ", c.tp_size);
  HYBRIDTB_CHECK(c.tp_rank >= 0 && c.tp_rank < c.tp_size, "/config tp_rank must be in [0, tp_size = ", c.tp_size,
                 "), got ", c.tp_rank);
  HYBRIDTB_CHECK(!c.is_tensor_parallel_rank() || !c.is_linear_layer(), "/config tp_size ", c.tp_size,
                 ": linear-attention layers (layer_kind ", to_string(c.layer_kind), ") have no tensor-parallel rank files");
  if (c.attn_type == AttnType::kEncoderOnly) {
    HYBRIDTB_CHECK(!c.has_ssm_branch(), "/config ssm_mode '", c.ssm_mode,
                   "' is not supported with attn_type encoder_only (the seed's HybridAttentionImpl raises "
                   "NotImplementedError for encoder attention)");
    HYBRIDTB_CHECK(!is_quantized(c.kv_cache_dtype), "/config kv_cache_dtype ", to_string(c.kv_cache_dtype),
                   " is not supported with attn_type encoder_only (vLLM raises NotImplementedError)");
  }
}

void validate(const BuilderConfig& b) {
  HYBRIDTB_CHECK(b.max_num_seqs > 0, "/config max_num_seqs must be > 0, got ", b.max_num_seqs);
  for (int64_t size : b.cudagraph_capture_sizes) {
    HYBRIDTB_CHECK(size > 0, "/config/cudagraph_capture_sizes entries must be > 0, got ", size);
  }
}

}  // namespace hybridtb
