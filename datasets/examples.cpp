// Definitions of the shipped example batches (see examples.h).
#include "examples.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "hybridtb/spec/ssm_mode.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::examples {

namespace {

// Gemma-3-like local layer, scaled down: GQA 8/2, head 128, window 64, soft cap, bf16. A vLLM-style
// mixed step: three decodes, a chunk continuing a long prompt, and a fresh prefill.
BatchFile mixed_swa_bf16() {
  AttentionConfig c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_size = 128;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(128.0);
  c.sliding_window = 64;
  c.logits_soft_cap = 50.0;
  c.dtype = DType::kBFloat16;
  BuilderConfig b;
  b.cudagraph_mode = CudaGraphMode::kFullAndPiecewise;
  b.cudagraph_capture_sizes = {1, 2, 4, 8, 16, 32};
  return make_synthetic_batch(c, b, {{200, 1}, {37, 1}, {90, 1}, {130, 48}, {0, 40}}, {.seed = 20261122});
}

// gpt-oss-like: 16/2 heads of 64, window 128, attention sinks, fp8 e4m3 KV cache with per-tensor
// scales, fp16 activations.
BatchFile fp8_kv_sinks_fp16() {
  AttentionConfig c;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_size = 64;
  c.block_size = 32;
  c.scale = 0.125;
  c.sliding_window = 128;
  c.dtype = DType::kFloat16;
  c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  c.sinks = std::vector<float>{0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f, 0.25f, 3.0f,
                               -2.0f, 1.0f, 0.75f, -0.25f, 0.1f, 2.5f, -1.5f, 0.6f};
  return make_synthetic_batch(c, {}, {{300, 1}, {5, 1}, {150, 20}},
                              {.seed = 7, .k_scale = 0.05f, .v_scale = 0.04f});
}

// A decode-only step padded for a full CUDA graph (capture size 8): five real decodes, three
// padding requests and three padding token rows; ALiBi (linear form), no window, float32.
BatchFile decode_cudagraph_padded_fp32() {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.head_size = 64;
  c.block_size = 16;
  c.scale = 0.125;
  c.dtype = DType::kFloat32;
  c.alibi_slopes = std::vector<float>{0.5f, 0.25f, 0.125f, 0.0625f};
  c.mamba_block_size = 4096;
  BuilderConfig b;
  b.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  b.cudagraph_capture_sizes = {1, 2, 4, 8};
  return make_synthetic_batch(c, b, {{12, 1}, {40, 1}, {3, 1}, {64, 1}, {17, 1}},
                              {.seed = 3, .padding_tokens = 3, .padding_requests = 3});
}

// A multimodal prompt chunk: int8 per-token-head KV cache with its scale caches, a bidirectional
// mm_prefix range over an image span, sqrt-form ALiBi, bf16.
BatchFile int8_kv_mm_prefix_bf16() {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_size = 64;
  c.block_size = 16;
  c.scale = 0.125;
  c.dtype = DType::kBFloat16;
  c.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  c.alibi_slopes = std::vector<float>{0.25f, 0.125f, 0.0625f, 0.03125f};
  c.use_alibi_sqrt = true;
  return make_synthetic_batch(c, {}, {{30, 1}, {10, 50, {{12, 40}}}}, {.seed = 11});
}

// An encoder-only layer (bidirectional, no KV cache) with a symmetric window of 16, fp16.
BatchFile encoder_only_fp16() {
  AttentionConfig c;
  c.num_heads = 6;
  c.num_kv_heads = 3;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(32.0);
  c.sliding_window = 16;
  c.dtype = DType::kFloat16;
  c.attn_type = AttnType::kEncoderOnly;
  return make_synthetic_batch(c, {}, {{0, 40}, {0, 9}}, {.seed = 5});
}

// fp8 e5m2 KV cache with per-tensor scales and fp8 output (output_scale), bf16 activations.
BatchFile fp8_e5m2_kv_fp8_output_bf16() {
  AttentionConfig c;
  c.num_heads = 8;
  c.num_kv_heads = 8;
  c.head_size = 128;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(128.0);
  c.dtype = DType::kBFloat16;
  c.kv_cache_dtype = KvCacheDtype::kFp8E5M2;
  return make_synthetic_batch(c, {}, {{70, 1}, {0, 24}},
                              {.seed = 13, .k_scale = 0.5f, .v_scale = 0.25f, .output_scale = 0.02f});
}

// Adds random weights and state pools for the file's SSM mode, one slot per id its SSM table uses.
BatchFile with_ssm_tensors(BatchFile file, uint64_t seed) {
  auto tensors = spec::ssm::make_random_ssm_tensors(file.config, ssm_slots_needed(file.batch), seed);
  file.inputs.ssm_state = std::move(tensors.ssm_state);
  file.inputs.weights = std::move(tensors.weights);
  return file;
}

AttentionConfig small_hybrid_layer(const std::string& ssm_mode) {
  AttentionConfig c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 32;
  c.block_size = 16;
  c.scale = 1.0 / std::sqrt(32.0);
  c.sliding_window = 32;
  c.dtype = DType::kBFloat16;
  c.ssm_mode = ssm_mode;
  return c;
}

// The hybrid layer of the seed with the full Mamba-1 history branch: decodes, a continued chunk
// (starts from its saved state) and a fresh prefill, with prefix caching (mamba_cache_mode all:
// states written at every 16-token boundary).
BatchFile hybrid_mamba1_bf16() {
  AttentionConfig c = small_hybrid_layer("mamba1");
  c.ssm_params = {{"intermediate_size", 64}, {"state_size", 8}, {"conv_kernel", 4}, {"dt_rank", 8}};
  c.mamba_cache_mode = MambaCacheMode::kAll;
  c.mamba_block_size = 16;
  BatchFile f = make_synthetic_batch(c, {}, {{40, 1}, {7, 1}, {50, 30}, {0, 21}}, {.seed = 17, .ssm_block_table = true});
  return with_ssm_tensors(std::move(f), 18);
}

// The per-request running-sum branch (prefix_sum) on a decode-only step padded for a CUDA graph:
// padding requests have slot −1 and must leave the pools untouched.
BatchFile hybrid_prefix_sum_padded_fp16() {
  AttentionConfig c = small_hybrid_layer("prefix_sum");
  c.dtype = DType::kFloat16;
  BuilderConfig b;
  b.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  b.cudagraph_capture_sizes = {1, 2, 4, 8};
  BatchFile f = make_synthetic_batch(c, b, {{20, 1}, {3, 1}, {60, 1}},
                                     {.seed = 19, .padding_tokens = 1, .padding_requests = 1, .ssm_block_table = true});
  return with_ssm_tensors(std::move(f), 20);
}

// The seed prototype's flattened cumsum (prefix_sum_flat), for replaying its captured batches.
BatchFile hybrid_prefix_sum_flat_bf16() {
  AttentionConfig c = small_hybrid_layer("prefix_sum_flat");
  return make_synthetic_batch(c, {}, {{10, 1}, {30, 1}, {0, 12}}, {.seed = 21});
}

// The guide's example mode (ema, reference/ssm/ema.cpp) with prefix caching in align mode, fp32.
BatchFile hybrid_ema_align_fp32() {
  AttentionConfig c = small_hybrid_layer("ema");
  c.dtype = DType::kFloat32;
  c.mamba_cache_mode = MambaCacheMode::kAlign;
  c.mamba_block_size = 16;
  BatchFile f = make_synthetic_batch(c, {}, {{33, 1}, {16, 9}, {0, 18}}, {.seed = 23, .ssm_block_table = true});
  return with_ssm_tensors(std::move(f), 24);
}

// The seed's default adapter ("disabled"): a zero contribution, so output == attention output.
BatchFile hybrid_zero_bf16() {
  return make_synthetic_batch(small_hybrid_layer("zero"), {}, {{12, 1}, {0, 9}}, {.seed = 25});
}

// A linear-attention layer of a per-layer model (layer_kind: the mode's core is the whole mixer).
// Its attention attributes are those of the model's attention layers (small_hybrid_layer's), which
// the step's metadata is built from; it holds no query, key, value or KV cache.
AttentionConfig small_linear_layer(LayerKind kind, std::map<std::string, int64_t> params) {
  AttentionConfig c = small_hybrid_layer(std::string(to_string(kind)));
  c.layer_kind = kind;
  c.ssm_params = std::move(params);
  return c;
}

// A Qwen3-Next-style Gated DeltaNet layer, scaled down (2 key heads, 4 value heads, dk 16 ≠ dv 8 so
// that a transposed recurrent state cannot go unnoticed): decodes, a continued chunk, a fresh
// prefill, then a padding request and two CUDA-graph padding rows that must stay unwritten.
BatchFile linear_gdn_bf16() {
  const AttentionConfig c = small_linear_layer(
      LayerKind::kGdn, {{"num_k_heads", 2}, {"num_v_heads", 4}, {"head_k_dim", 16}, {"head_v_dim", 8}, {"conv_kernel", 4}});
  BatchFile f = make_synthetic_batch(c, {}, {{40, 1}, {7, 1}, {50, 30}, {0, 21}},
                                     {.seed = 27, .padding_tokens = 2, .padding_requests = 1, .ssm_block_table = true});
  return with_ssm_tensors(std::move(f), 28);
}

// A Mamba-2 layer of a per-layer design (4 SSM heads of 8, state 8, 2 groups), float32, with
// prefix caching (mamba_cache_mode all: states written at every 16-token boundary).
BatchFile linear_mamba2_all_fp32() {
  AttentionConfig c = small_linear_layer(
      LayerKind::kMamba2, {{"num_ssm_heads", 4}, {"head_dim", 8}, {"state_size", 8}, {"n_groups", 2}, {"conv_kernel", 4}});
  c.dtype = DType::kFloat32;
  c.mamba_cache_mode = MambaCacheMode::kAll;
  c.mamba_block_size = 16;
  BatchFile f = make_synthetic_batch(c, {}, {{40, 1}, {20, 30}, {0, 18}}, {.seed = 29, .ssm_block_table = true});
  return with_ssm_tensors(std::move(f), 30);
}

}  // namespace

const std::vector<Example>& all() {
  static const std::vector<Example> examples = {
      {"mixed_swa_bf16.h5", "mixed decode + chunked/fresh prefill, GQA 8/2, window 64, soft cap, bf16",
       mixed_swa_bf16},
      {"fp8_kv_sinks_fp16.h5", "fp8 e4m3 KV cache with per-tensor scales, sinks, window 128, fp16",
       fp8_kv_sinks_fp16},
      {"decode_cudagraph_padded_fp32.h5", "decode-only step padded to a CUDA-graph size 8, ALiBi, fp32",
       decode_cudagraph_padded_fp32},
      {"int8_kv_mm_prefix_bf16.h5", "int8 per-token-head KV cache, mm_prefix range, sqrt ALiBi, bf16",
       int8_kv_mm_prefix_bf16},
      {"encoder_only_fp16.h5", "encoder-only (bidirectional, no cache), window 16, fp16", encoder_only_fp16},
      {"fp8_e5m2_kv_fp8_output_bf16.h5", "fp8 e5m2 KV cache, fp8 output with output_scale, bf16",
       fp8_e5m2_kv_fp8_output_bf16},
      {"hybrid_mamba1_bf16.h5", "hybrid layer with the Mamba-1 branch, prefix caching (mode all), bf16",
       hybrid_mamba1_bf16},
      {"hybrid_prefix_sum_padded_fp16.h5", "prefix_sum branch on a CUDA-graph padded decode step, fp16",
       hybrid_prefix_sum_padded_fp16},
      {"hybrid_prefix_sum_flat_bf16.h5", "the seed prototype's flattened cumsum (prefix_sum_flat), bf16",
       hybrid_prefix_sum_flat_bf16},
      {"hybrid_ema_align_fp32.h5", "the guide's ema mode with prefix caching (mode align), fp32", hybrid_ema_align_fp32},
      {"hybrid_zero_bf16.h5", "the seed's default zero contribution, bf16", hybrid_zero_bf16},
      {"linear_gdn_bf16.h5", "a Gated DeltaNet linear-attention layer (layer_kind gdn), mixed step with padding, bf16",
       linear_gdn_bf16},
      {"linear_mamba2_all_fp32.h5",
       "a Mamba-2 linear-attention layer (layer_kind mamba2), prefix caching (mode all), fp32", linear_mamba2_all_fp32},
  };
  return examples;
}

}  // namespace hybridtb::examples
