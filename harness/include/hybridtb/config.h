// The layer configuration (vLLM's attention-impl constructor arguments plus the hybrid SSM
// settings) and the engine settings the metadata builders read (CUDA-graph mode and sizes).
// Stored in the `/config` group of a hybrid-batch file; see datasets/SCHEMA.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hybridtb/dtype.h"

namespace hybridtb {

// How the paged KV cache stores keys and values (vLLM's `kv_cache_dtype` strings).
enum class KvCacheDtype : uint8_t {
  kAuto,              // same dtype as query/key/value
  kFp8E4M3,           // per-tensor scales k_scale / v_scale
  kFp8E5M2,           // per-tensor scales k_scale / v_scale
  kInt8PerTokenHead,  // one float32 scale per (block, slot, kv head) in k/v_scale_cache
  kFp8PerTokenHead,   // as above, e4m3fn storage
};
std::string_view to_string(KvCacheDtype kv);
KvCacheDtype kv_cache_dtype_from_string(std::string_view name);  // also accepts vLLM's "fp8"
bool is_per_token_head(KvCacheDtype kv);
bool is_quantized(KvCacheDtype kv);
// Storage element type of the cache for a model dtype.
DType kv_storage_dtype(KvCacheDtype kv, DType model_dtype);

enum class AttnType : uint8_t { kDecoder, kEncoderOnly };
std::string_view to_string(AttnType type);
AttnType attn_type_from_string(std::string_view name);

// vLLM's `mamba_cache_mode` (vllm/config/cache.py).
enum class MambaCacheMode : uint8_t { kNone, kAll, kAlign };
std::string_view to_string(MambaCacheMode mode);
MambaCacheMode mamba_cache_mode_from_string(std::string_view name);

// vLLM's CUDAGraphMode, as far as the builders look at it.
enum class CudaGraphMode : uint8_t { kNone, kPiecewise, kFull, kFullDecodeOnly, kFullAndPiecewise };
std::string_view to_string(CudaGraphMode mode);
CudaGraphMode cudagraph_mode_from_string(std::string_view name);
bool has_full_cudagraphs(CudaGraphMode mode);  // FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE

// What a layer of a per-layer hybrid model is (SGLang's and pymllm's `layer_types`; Qwen3-Next: three
// GDN layers, then one full-attention layer). Stored as /config layer_kind (schema 1.2; absent means
// full_attention, so every older file keeps its meaning).
//   kFullAttention  this testbed's hybrid layer: paged attention plus the optional parallel SSM branch
//                   (ssm_mode; "none" for a plain attention layer)
//   kGdn, kMamba2   a linear-attention layer: its mixer is the core of SSM mode gdn / mamba2 on the
//                   layer's per-token inputs (hybridtb/linear_layer.h); ssm_mode must name that mode
enum class LayerKind : uint8_t { kFullAttention, kGdn, kMamba2 };
std::string_view to_string(LayerKind kind);
LayerKind layer_kind_from_string(std::string_view name);  // Error naming /config layer_kind and the kinds

// Sentinel for padded tokens in slot_mapping and padded rows of SSM state indices
// (vllm/v1/attention/backends/utils.py: PAD_SLOT_ID).
inline constexpr int32_t kPadSlotId = -1;

struct AttentionConfig {
  int64_t num_heads = 0;     // query heads (Hq)
  int64_t num_kv_heads = 0;  // key/value heads (Hkv); Hq % Hkv == 0, query head h uses h / (Hq/Hkv)
  int64_t head_size = 0;     // D ≥ 32
  int64_t block_size = 0;    // tokens per KV-cache block, a multiple of 16
  double scale = 0.0;        // softmax scale, applied to the q·k dot product
  int64_t sliding_window = 0;    // 0 = none; w > 0: a query at position p sees keys p-w+1 … p
  double logits_soft_cap = 0.0;  // 0 = off; otherwise s ← c·tanh(s/c) after scaling
  bool use_alibi_sqrt = false;   // ALiBi bias −slope·sqrt(p−k) instead of slope·(k − context_len)
  DType dtype = DType::kBFloat16;  // query, key, value (and output unless fp8 output is requested)
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  AttnType attn_type = AttnType::kDecoder;
  LayerKind layer_kind = LayerKind::kFullAttention;
  // full_attention: the parallel SSM history branch, "none" = plain attention layer. A linear layer
  // (gdn, mamba2): the mode whose core is the layer's mixer, equal to the kind's name.
  std::string ssm_mode = "none";
  // Integer hyper-parameters of the SSM mode (/config/ssm attributes), e.g. mamba1's
  // intermediate_size, state_size, conv_kernel, dt_rank. Each mode documents its own.
  std::map<std::string, int64_t> ssm_params;
  MambaCacheMode mamba_cache_mode = MambaCacheMode::kNone;
  int64_t mamba_block_size = 0;   // tokens per SSM state block (vLLM: max_model_len when mode none)
  int64_t num_speculative_tokens = 0;
  std::optional<std::vector<float>> alibi_slopes;  // [num_heads] (optional)
  std::optional<std::vector<float>> sinks;         // [num_heads] attention-sink logits (optional)
  // The serving engine whose rules the batch follows, "vllm <release>" (/config engine_version,
  // schema 1.3); empty = the unversioned rules every older file was written under (engine_rules.h).
  std::string engine_version;
  // The gated norm's eps of the gdn / mamba2 SSM modes (/config norm_eps, schema 1.3): the model
  // config's rms_norm_eps. Unset: the model family's default (gated_norm_eps in engine_rules.h).
  // Only versions whose rules take eps from the config accept it.
  std::optional<double> norm_eps;
  // Falcon-H1's mamba_rms_norm (/config mamba_rms_norm, schema 1.3, default true): false makes the
  // mamba2 mode's Mixer2RMSNormGated a plain gate y·silu(z), without normalisation or weight.
  bool mamba_rms_norm = true;
  // Tensor parallelism (/config tp_size and tp_rank, schema 1.4; absent: 1 and 0). A rank file of a
  // tp_size > 1 layer holds rank tp_rank's shard by vLLM's rules (hybridtb/spec/tensor_parallel.h):
  // num_heads, num_kv_heads, alibi_slopes, sinks, the SSM parameters, weights and pools are the
  // rank's; its SSM branch reads the full hidden states (/inputs/ssm_hidden).
  int64_t tp_size = 1;
  int64_t tp_rank = 0;

  int64_t num_queries_per_kv() const { return num_heads / num_kv_heads; }
  bool is_linear_layer() const { return layer_kind != LayerKind::kFullAttention; }
  // The parallel branch belongs to full-attention layers; a linear layer's ssm_mode is its mixer.
  bool has_ssm_branch() const { return !is_linear_layer() && ssm_mode != "none"; }
  bool is_tensor_parallel_rank() const { return tp_size > 1; }
  // The width of the hidden states the SSM branch reads: the unsharded query row, tp_size · Hq · D.
  int64_t ssm_hidden_size() const { return tp_size * num_heads * head_size; }

  bool operator==(const AttentionConfig&) const = default;
};

// Engine-side settings that change what the metadata builders produce.
struct BuilderConfig {
  CudaGraphMode cudagraph_mode = CudaGraphMode::kNone;
  std::vector<int64_t> cudagraph_capture_sizes;  // in vLLM's list order (ties resolve to the first)
  int64_t max_num_seqs = 256;                    // scheduler_config.max_num_seqs

  bool operator==(const BuilderConfig&) const = default;

  // Largest decode batch a full CUDA graph is captured for (BaseMambaAttentionMetadataBuilder:
  // min(max_num_seqs, max_cudagraph_capture_size)).
  int64_t decode_cudagraph_max_bs() const;
};

// Throws Error naming the field if a config value is out of its documented range.
void validate(const AttentionConfig& config);
void validate(const BuilderConfig& config);

}  // namespace hybridtb
