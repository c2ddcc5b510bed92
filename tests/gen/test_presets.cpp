// `hybridtb gen` in process (harness/include/hybridtb/presets.h): every preset builds a valid batch
// and replays on the reference with finite outputs; overrides, every dtype, KV-cache dtype and SSM
// mode; seeds; CUDA-graph padding, prefix hits, block aliasing and speculative decodes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "batch_checks.h"
#include "hybridtb/backend.h"
#include "hybridtb/error.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/presets.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

StepOutputs replay(const BatchFile& file) {
  auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

// Every element of rows [0, num_actual_tokens) is finite.
void expect_finite_rows(const Tensor& t, int64_t rows, const std::string& what) {
  ASSERT_FALSE(t.empty()) << what;
  const int64_t per_row = t.numel() / t.size(0);
  int64_t bad = 0;
  for (int64_t i = 0; i < rows * per_row; ++i) bad += std::isfinite(load_as_double(t.data(), t.dtype(), i)) ? 0 : 1;
  EXPECT_EQ(bad, 0) << what << ": non-finite elements";
}

void expect_replays(const BatchFile& file) {
  const StepOutputs out = replay(file);
  expect_finite_rows(out.output, file.batch.num_actual_tokens, "output");
  if (file.config.is_linear_layer()) {  // the core's output alone
    EXPECT_TRUE(out.attn_output.empty());
    return;
  }
  expect_finite_rows(out.attn_output, file.batch.num_actual_tokens, "attn_output");
  if (file.config.has_ssm_branch()) expect_finite_rows(out.ssm_output, file.batch.num_actual_tokens, "ssm_output");
}

// A cheap hybrid layer on the hymba-small preset (the mode and its sizes shrunk).
Layer small_hybrid(const std::string& mode, std::vector<std::string> extra = {}) {
  std::vector<std::string> settings{"num_heads=4", "num_kv_heads=1", "head_size=32", "sliding_window=32",
                                    "ssm_mode=" + mode};
  if (mode == "mamba1") settings.insert(settings.end(), {"ssm.intermediate_size=64", "ssm.dt_rank=4", "ssm.state_size=8"});
  settings.insert(settings.end(), extra.begin(), extra.end());
  return make_layer("hymba-small", settings);
}

TEST(Presets, EveryPresetBuildsAValidBatchThatReplaysOnTheReference) {
  ASSERT_GE(presets().size(), 7u);
  const Mix mix = parse_mix("p1x24+d2@300+c1x20@40");
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(preset.name);
    const Layer layer = make_layer(preset.name);
    const BatchFile file = generate_batch(layer, mix, {.seed = 3});
    EXPECT_EQ(file.batch.num_reqs(), 4);
    EXPECT_EQ(file.batch.query_len(0), 1);  // decodes first
    EXPECT_EQ(file.batch.query_len(2), 20);
    EXPECT_EQ(file.batch.query_len(3), 24);
    EXPECT_EQ(file.provenance.at("mix"), "d2@300+c1x20@40+p1x24");
    if (layer.attention.has_ssm_branch() || layer.attention.is_linear_layer()) {
      EXPECT_TRUE(file.batch.ssm_block_table.has_value());
      EXPECT_FALSE(file.inputs.weights.empty());
    }
    expect_replays(file);
  }
}

// The per-layer presets: Qwen3-Next's GDN layer (notes §1.4.1, §3.6) and Falcon-H1-7B's Mamba-2
// mixer (notes §3.5, §3.8) as linear layers whose attention attributes are their models'.
TEST(Presets, LinearLayerPresetsHaveTheModelsShapes) {
  const Layer gdn = make_layer("qwen3-next-gdn");
  EXPECT_EQ(gdn.attention.layer_kind, LayerKind::kGdn);
  EXPECT_EQ(gdn.attention.ssm_mode, "gdn");
  EXPECT_EQ(gdn.attention.ssm_params, (std::map<std::string, int64_t>{{"num_k_heads", 16},
                                                                      {"num_v_heads", 32},
                                                                      {"head_k_dim", 128},
                                                                      {"head_v_dim", 128},
                                                                      {"conv_kernel", 4}}));
  const Layer attention = make_layer("qwen3-next-attention");
  EXPECT_EQ(attention.attention.layer_kind, LayerKind::kFullAttention);
  // One model: the GDN layer's attention attributes are the attention layer's (one metadata build).
  AttentionConfig same = gdn.attention;
  same.layer_kind = LayerKind::kFullAttention;
  same.ssm_mode = "none";
  same.ssm_params.clear();
  EXPECT_EQ(same, attention.attention);

  const Layer mamba2 = make_layer("falcon-h1-7b-mamba2");
  EXPECT_EQ(mamba2.attention.layer_kind, LayerKind::kMamba2);
  EXPECT_EQ(mamba2.attention.ssm_params, (std::map<std::string, int64_t>{{"num_ssm_heads", 24},
                                                                         {"head_dim", 128},
                                                                         {"state_size", 256},
                                                                         {"n_groups", 1},
                                                                         {"conv_kernel", 4}}));
  EXPECT_EQ(mamba2.attention.num_heads, 12);
  EXPECT_EQ(mamba2.attention.num_kv_heads, 2);

  // The files: the linear inputs at the models' widths, the core's weights only, no attention tensors.
  const BatchFile file = generate_batch(gdn, parse_mix("d2@30+p1x5"), {.seed = 2});
  EXPECT_EQ(file.inputs.linear_inputs.at("mixed_qkv").shape(), (Shape{7, 2 * 16 * 128 + 32 * 128}));
  EXPECT_EQ(file.inputs.linear_inputs.at("a").shape(), (Shape{7, 32}));
  EXPECT_TRUE(file.inputs.query.empty());
  EXPECT_TRUE(file.inputs.kv_cache.empty());
  EXPECT_EQ(file.inputs.ssm_state.at("recurrent_state").shape(), (Shape{ssm_slots_needed(file.batch), 32, 128, 128}));
  std::set<std::string> weights;
  for (const auto& [name, weight] : file.inputs.weights) weights.insert(name);
  EXPECT_EQ(weights, (std::set<std::string>{"A_log", "conv1d_bias", "conv1d_weight", "dt_bias"}));
  // With the same mix and seed (and SSM slots for the attention layer too) the two presets give the
  // two layers of one step, which run_per_layer_step runs with one metadata build.
  const BatchFile attention_file = generate_batch(attention, parse_mix("d2@30+p1x5"), {.seed = 2, .ssm_slots = true});
  EXPECT_EQ(attention_file.batch.block_table, file.batch.block_table);
  EXPECT_EQ(attention_file.batch.slot_mapping, file.batch.slot_mapping);
  EXPECT_EQ(attention_file.batch.ssm_block_table, file.batch.ssm_block_table);
  auto model = create_per_layer_backend("reference", {{attention.attention, attention.builder}, {gdn.attention, gdn.builder}});
  const std::vector<StepOutputs> step = run_per_layer_step(*model, {&file, &attention_file});
  expect_finite_rows(step[0].output, file.batch.num_actual_tokens, "gdn output");
  expect_finite_rows(step[1].output, file.batch.num_actual_tokens, "attention output");
  // layer_kind switches ssm_mode with it, and a kind whose mode disagrees is refused by name.
  EXPECT_EQ(make_layer("llama3-8b", {"layer_kind=mamba2"}).attention.ssm_mode, "mamba2");
  try {
    make_layer("qwen3-next-gdn", {"ssm_mode=mamba2"});
    ADD_FAILURE() << "ssm_mode mamba2 on a gdn layer was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not match layer_kind gdn"));
  }
}

TEST(Presets, ShapesAreTheDocumentedOnes) {
  const Layer llama = make_layer("llama3-8b");
  EXPECT_EQ(llama.attention.num_heads, 32);
  EXPECT_EQ(llama.attention.num_kv_heads, 8);
  EXPECT_EQ(llama.attention.head_size, 128);
  EXPECT_EQ(llama.attention.sliding_window, 0);
  EXPECT_EQ(llama.attention.block_size, 16);
  EXPECT_EQ(llama.attention.dtype, DType::kBFloat16);
  EXPECT_DOUBLE_EQ(llama.attention.scale, 1.0 / std::sqrt(128.0));
  EXPECT_EQ(make_layer("mistral-7b").attention.sliding_window, 4096);
  EXPECT_DOUBLE_EQ(make_layer("gemma3-local-128").attention.scale, 1.0 / std::sqrt(168.0));
  EXPECT_EQ(make_layer("gemma3-local-256").attention.head_size, 256);
  const Layer oss = make_layer("gpt-oss");
  EXPECT_EQ(oss.attention.sliding_window, 128);
  ASSERT_TRUE(oss.attention.sinks.has_value());
  EXPECT_EQ(oss.attention.sinks->size(), 64u);
  const Layer mamba = make_layer("mamba-2.8b");
  EXPECT_EQ(mamba.attention.num_heads * mamba.attention.head_size, 2560);
  EXPECT_EQ(mamba.attention.ssm_params.at("intermediate_size"), 5120);
  EXPECT_EQ(mamba.attention.ssm_params.at("state_size"), 16);
  EXPECT_EQ(mamba.attention.ssm_params.at("conv_kernel"), 4);
  EXPECT_EQ(mamba.attention.ssm_params.at("dt_rank"), 160);
  EXPECT_EQ(make_layer("hymba-small").attention.ssm_mode, "mamba1");
  EXPECT_THAT(expand_preset_list("all"), ::testing::SizeIs(presets().size()));
  EXPECT_EQ(expand_preset_list("gpt-oss,llama3-8b"), (std::vector<std::string>{"gpt-oss", "llama3-8b"}));
}

TEST(Presets, OverridesChangeFieldsAndKeepDerivedFieldsConsistent) {
  const Layer l = make_layer("llama3-8b", {"sliding_window=0", "dtype=float16", "kv_cache_dtype=fp8_e4m3",
                                           "ssm_mode=prefix_sum", "block_size=32", "cudagraph_mode=full",
                                           "cudagraph_capture_sizes=1,2,4", "max_num_seqs=64", "logits_soft_cap=30",
                                           "sliding_window=2k"});
  EXPECT_EQ(l.attention.sliding_window, 2048);
  EXPECT_EQ(l.attention.dtype, DType::kFloat16);
  EXPECT_EQ(l.attention.kv_cache_dtype, KvCacheDtype::kFp8E4M3);
  EXPECT_EQ(l.attention.ssm_mode, "prefix_sum");
  EXPECT_EQ(l.attention.block_size, 32);
  EXPECT_EQ(l.builder.cudagraph_mode, CudaGraphMode::kFull);
  EXPECT_EQ(l.builder.cudagraph_capture_sizes, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(l.builder.max_num_seqs, 64);
  EXPECT_DOUBLE_EQ(l.attention.logits_soft_cap, 30.0);
  // scale follows head_size unless set; sinks and ALiBi follow num_heads
  EXPECT_DOUBLE_EQ(make_layer("llama3-8b", {"head_size=64"}).attention.scale, 0.125);
  EXPECT_DOUBLE_EQ(make_layer("llama3-8b", {"scale=0.5"}).attention.scale, 0.5);
  EXPECT_EQ(make_layer("gpt-oss", {"num_heads=16"}).attention.sinks->size(), 16u);
  EXPECT_FALSE(make_layer("gpt-oss", {"sinks=off"}).attention.sinks.has_value());
  const Layer alibi = make_layer("llama3-8b", {"alibi_slopes=on"});
  ASSERT_TRUE(alibi.attention.alibi_slopes.has_value());
  EXPECT_FLOAT_EQ(alibi.attention.alibi_slopes->front(), std::pow(2.0f, -0.25f));  // 2^(-8/32)
  EXPECT_EQ(make_layer("hymba-small", {"ssm.state_size=8"}).attention.ssm_params.at("state_size"), 8);
  // mamba1 on a preset without a branch gets Mamba's conventional sizes
  const Layer m = make_layer("gpt-oss", {"ssm_mode=mamba1"});
  EXPECT_EQ(m.attention.ssm_params.at("intermediate_size"), 2 * 64 * 64);
  EXPECT_EQ(m.attention.ssm_params.at("dt_rank"), 256);
  EXPECT_EQ(make_layer("hymba-small", {"mamba_cache_mode=all"}).attention.mamba_block_size, 512);
}

TEST(Presets, BadKeysAndValuesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"windw=3", "unknown key 'windw'"},
      {"dtype=float13", "--set dtype=float13"},
      {"dtype=int8", "/config dtype must be"},
      {"num_heads=abc", "expected an integer"},
      {"sinks=1,2", "2 values for num_heads = 64"},
      {"novalue", "expected key=value"},
      {"ssm_mode=mamba7", "mamba7"},
      {"ssm.state_size=0", "must be > 0"},
      {"use_alibi_sqrt=maybe", "expected true|false"},
      {"kv_cache_dtype=fp4", "kv_cache_dtype"},
      {"num_kv_heads=7", "multiple of num_kv_heads"},
      {"sliding_window=", "empty value"},
  };
  for (const auto& [setting, message] : cases) {
    SCOPED_TRACE(setting);
    try {
      make_layer("gpt-oss", {setting});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
  }
  EXPECT_THROW(make_layer("llama-3"), Error);
  EXPECT_THROW(expand_preset_list("llama3-8b,nope"), Error);
}

TEST(Presets, EveryDtypeAndKvCacheDtypeReplays) {
  const Mix mix = parse_mix("d2@70+c1x9@33+p1x17");
  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    for (const char* kv : {"auto", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"}) {
      SCOPED_TRACE(std::string(dtype) + " " + kv);
      const Layer layer = make_layer("gpt-oss", {"num_heads=8", "num_kv_heads=2", std::string("dtype=") + dtype,
                                                 std::string("kv_cache_dtype=") + kv});
      const BatchFile file = generate_batch(layer, mix, {.seed = 9});
      EXPECT_EQ(file.inputs.query.dtype(), layer.attention.dtype);
      EXPECT_EQ(file.inputs.kv_cache.dtype(), kv_storage_dtype(layer.attention.kv_cache_dtype, layer.attention.dtype));
      expect_replays(file);
    }
  }
}

TEST(Presets, EverySsmModeGetsItsWeightsAndPools) {
  const Mix mix = parse_mix("d2@40+c1x9@20+p1x20");
  for (const std::string& mode : reference::ssm::ModeRegistry::instance().names()) {
    for (const char* cache_mode : {"none", "all", "align"}) {
      SCOPED_TRACE(mode + " " + cache_mode);
      const Layer layer = small_hybrid(mode, {std::string("mamba_cache_mode=") + cache_mode, "mamba_block_size=16"});
      const BatchFile file = generate_batch(layer, mix, {.seed = 4});
      const reference::ssm::Mode& m = reference::ssm::ModeRegistry::instance().find(mode);
      const auto shape = reference::ssm::mode_shape(layer.attention);
      EXPECT_EQ(file.inputs.weights.size(), m.weight_specs(shape).size());
      EXPECT_EQ(file.inputs.ssm_state.size(), m.state_specs(shape).size());
      for (const auto& [name, pool] : file.inputs.ssm_state) EXPECT_EQ(pool.size(0), ssm_slots_needed(file.batch)) << name;
      expect_replays(file);
    }
  }
}

TEST(Presets, SameSeedSameBytesOtherSeedOtherBytes) {
  const Layer layer = small_hybrid("mamba1");
  const Mix mix = parse_mix("d3@100+p1x30");
  const BatchFile a = generate_batch(layer, mix, {.seed = 11});
  const BatchFile b = generate_batch(layer, mix, {.seed = 11});
  const BatchFile c = generate_batch(layer, mix, {.seed = 12});
  testing::expect_same_batch_inputs(a, b);
  EXPECT_FALSE(bitwise_equal(a.inputs.query, c.inputs.query));
  EXPECT_FALSE(bitwise_equal(a.inputs.kv_cache, c.inputs.kv_cache));
  EXPECT_FALSE(bitwise_equal(a.inputs.weights.at("in_proj"), c.inputs.weights.at("in_proj")));
  EXPECT_EQ(a.provenance.at("seed"), "11");
}

TEST(Presets, PadToAddsPaddingRequestsWithPadSlots) {
  const Layer layer = small_hybrid("prefix_sum");
  const BatchFile file = generate_batch(layer, parse_mix("d5@100"), {.seed = 1, .pad_to = 8});
  EXPECT_EQ(file.batch.num_reqs(), 8);
  EXPECT_EQ(file.batch.num_actual_tokens, 5);
  EXPECT_EQ(file.batch.num_tokens(), 8);
  EXPECT_TRUE(has_full_cudagraphs(file.builder.cudagraph_mode));
  EXPECT_THAT(file.builder.cudagraph_capture_sizes, ::testing::Contains(8));
  for (int64_t t = 5; t < 8; ++t) EXPECT_EQ(file.batch.slot_mapping[static_cast<size_t>(t)], kPadSlotId);
  for (int64_t r = 5; r < 8; ++r) EXPECT_EQ(file.batch.seq_len(r), 0);
  const StepOutputs out = replay(file);
  ASSERT_TRUE(out.metadata.mamba.has_value());
  const IntArray& d = out.metadata.mamba->state_indices_tensor_d;
  ASSERT_EQ(d.size(0), 8);
  for (int64_t r = 0; r < 5; ++r) EXPECT_GT(d.at(r, 0), 0);
  for (int64_t r = 5; r < 8; ++r) EXPECT_EQ(d.at(r, 0), kPadSlotId);
  expect_finite_rows(out.output, 5, "output");
  // padded rows stay poisoned (unwritten)
  for (int64_t i = 5 * layer.attention.num_heads * layer.attention.head_size; i < out.output.numel(); ++i) {
    ASSERT_TRUE(std::isnan(load_as_double(out.output.data(), out.output.dtype(), i)));
  }
  EXPECT_THROW(generate_batch(layer, parse_mix("d2@10+p1x4"), {.pad_to = 8}), Error);
  EXPECT_THROW(generate_batch(layer, parse_mix("d9@10"), {.pad_to = 8}), Error);
  EXPECT_THROW(generate_batch(small_hybrid("prefix_sum", {"cudagraph_mode=piecewise"}), parse_mix("d2@10"), {.pad_to = 8}),
               Error);
}

TEST(Presets, PrefixHitsShareBlocksAndSsmStates) {
  const Layer layer = small_hybrid("mamba1", {"sliding_window=0", "mamba_cache_mode=all", "mamba_block_size=32"});
  const BatchFile file = generate_batch(layer, parse_mix("d1@200+c2x16@130+p1x20"), {.seed = 2, .prefix_hit_tokens = 128});
  const IntArray& t = file.batch.block_table;
  for (int64_t i = 0; i < 8; ++i) {  // 128 tokens = 8 blocks of 16, the same physical ids in rows 0..2
    EXPECT_NE(t.at(0, i), 0);
    EXPECT_EQ(t.at(0, i), t.at(1, i));
    EXPECT_EQ(t.at(0, i), t.at(2, i));
  }
  EXPECT_NE(t.at(1, 8), t.at(2, 8));  // past the prefix: own blocks
  const IntArray& s = *file.batch.ssm_block_table;
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(s.at(0, i), s.at(1, i));  // 128 / 32 state blocks shared
  EXPECT_NE(s.at(0, 4), s.at(1, 4));
  const StepOutputs out = replay(file);
  ASSERT_TRUE(out.metadata.mamba->has_initial_states_p.has_value());
  EXPECT_EQ(out.metadata.mamba->has_initial_states_p->values, (std::vector<int32_t>{1, 1, 0}));
  expect_finite_rows(out.output, file.batch.num_actual_tokens, "output");
}

TEST(Presets, AliasBlocksRepeatReadOnlyBlocksAndKeepWrittenBlocksDistinct) {
  const Layer layer = make_layer("llama3-8b", {"num_heads=4", "num_kv_heads=2", "head_size=32"});
  const BatchFile file = generate_batch(layer, parse_mix("d4@512"), {.seed = 6, .alias_blocks = true});
  const IntArray& t = file.batch.block_table;
  std::multiset<int32_t> read_only;
  std::set<int32_t> written;
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t i = 0; i < 32; ++i) read_only.insert(t.at(r, i));
    written.insert(t.at(r, 32));
  }
  EXPECT_EQ(written.size(), 4u);
  std::set<int32_t> distinct(read_only.begin(), read_only.end());
  EXPECT_LE(distinct.size(), 32u);  // 128 entries from a pool of 32
  for (int32_t w : written) EXPECT_EQ(read_only.count(w), 0u);
  expect_replays(file);
}

TEST(Presets, SpeculativeDecodesSetDraftsAndAcceptedTokens) {
  const Layer layer = make_layer("gpt-oss", {"num_heads=8", "num_kv_heads=2"});
  const BatchFile file = generate_batch(layer, parse_mix("s3x4@100+d2@50+p1x8"), {.seed = 5});
  EXPECT_EQ(file.config.num_speculative_tokens, 3);
  ASSERT_TRUE(file.batch.num_accepted_tokens.has_value());
  const IntArray& a = *file.batch.num_accepted_tokens;
  EXPECT_EQ(a[3], 1);  // decodes in the order written: the speculative ones, then the plain ones
  EXPECT_EQ(a[4], 1);
  EXPECT_EQ(file.batch.query_len(3), 1);
  EXPECT_EQ(file.batch.query_len(5), 8);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_GE(a[r], 1);
    EXPECT_LE(a[r], 4);
    EXPECT_EQ(file.batch.query_len(r), 4);
  }
  expect_replays(file);
  EXPECT_THROW(generate_batch(small_hybrid("mamba1", {"mamba_cache_mode=all"}), parse_mix("s1x2@10"), {}), Error);
}

TEST(Presets, CompactPagingGivesFreedBlocksNoPhysicalBlock) {
  const Layer layer = make_layer("mistral-7b", {"num_heads=4", "num_kv_heads=1", "head_size=32"});
  const BatchFile file = generate_batch(layer, parse_mix("d2@8k"), {.seed = 8});
  int64_t live = 0, nulled = 0;
  for (int32_t id : file.batch.block_table.values) (id == 0 ? nulled : live) += 1;
  EXPECT_GT(nulled, 0);
  EXPECT_EQ(file.inputs.kv_cache.size(0), 1 + live + 3);  // null block + live blocks + 3 spare
  expect_replays(file);
}

}  // namespace
}  // namespace hybridtb
