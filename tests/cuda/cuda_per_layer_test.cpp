// Per-layer hybrid models on the GPU (hybridtb/per_layer.h):
//   - linear-attention layers (layer_kind gdn, mamba2) on the "cuda" backend against the reference
//     (compare_step: the tolerance table for the output and every state pool, untouched slots,
//     padding rows), for mixed prefill/decode batches and CUDA-graph-padded decode batches in every
//     mamba_cache_mode, bit for bit from run to run, and a mixed batch bit for bit each request alone;
//   - one step of a per-layer model — three linear layers and one full-attention layer, Qwen3-Next's
//     pattern — captured into ONE CUDA graph through the lifecycle hooks (init_graph_state,
//     init_capture_metadata, init_replay_metadata), as pymllm's graph runner does, and replayed for
//     new batches of the captured padded shape: capturing runs nothing; every replay equals the
//     eager step of the same batch bit for bit (every layer's output, the KV cache, every pool);
//     padding rows stay unwritten and padding requests whose SSM table rows hold stale slot ids of
//     live requests write nothing (pymllm's bug, notes §2.6); the replayed step matches the
//     reference.
// Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda   (cases named Small* are the compute-sanitizer subset)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"
#include "per_layer_support.h"
#include "ssm_test_support.h"

namespace hybridtb::testing {
namespace {

// The per-layer tests' model (per_layer_support.h) at the decode kernels' head size, so that a graph
// can hold its attention layer: bf16, 4 query heads of 128 over 2 KV heads, blocks of 16.
AttentionConfig at_gpu_head_size(AttentionConfig c) {
  c.head_size = 128;
  c.scale = 1.0 / std::sqrt(128.0);
  c.dtype = DType::kBFloat16;
  return c;
}

int64_t mamba_block_size_for(MambaCacheMode cache) { return cache == MambaCacheMode::kNone ? 0 : 16; }

AttentionConfig attention_config(MambaCacheMode cache) {
  return at_gpu_head_size(attention_layer(cache, mamba_block_size_for(cache)));
}

// Its linear layer of `kind` (the attention attributes are the model's, as in a per-layer file):
//   gdn     2 key heads, 4 value heads, dk = dv = 32 (square: a transposed state would go unseen
//           by shape alone), or 128 (Qwen3-Next's) when `big`; conv 4
//   mamba2  4 heads of 16, state 16 (64 when `big`), 2 groups, conv 4
AttentionConfig linear_config(LayerKind kind, MambaCacheMode cache, DType dtype, bool big = false) {
  AttentionConfig c = at_gpu_head_size(linear_layer(kind, cache, mamba_block_size_for(cache)));
  c.dtype = dtype;
  if (kind == LayerKind::kGdn) {
    c.ssm_params["head_k_dim"] = c.ssm_params["head_v_dim"] = big ? 128 : 32;
  } else {
    c.ssm_params["head_dim"] = 16;
    c.ssm_params["state_size"] = big ? 64 : 16;
  }
  return c;
}

BuilderConfig graph_builder() {
  BuilderConfig builder;
  builder.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  builder.cudagraph_capture_sizes = {1, 2, 4, 8};
  return builder;
}

StepOutputs run_on(const std::string& backend_name, const BatchFile& file) {
  auto backend = create_backend(backend_name, BackendSettings{file.config, file.builder});
  return run_step(*backend, file);
}

// --- linear layers against the reference ------------------------------------------------------------

struct LinearCase {
  std::string name;
  LayerKind kind = LayerKind::kGdn;
  MambaCacheMode cache = MambaCacheMode::kNone;
  DType dtype = DType::kBFloat16;
  std::vector<RequestSpec> requests;
  int64_t padding = 0;  // padding requests and token rows (CUDA-graph padding)
  bool graph = false;   // the builder pads decode-only batches (the fixed decode step runs them)
  bool big = false;
  uint64_t seed = 1;
};
void PrintTo(const LinearCase& c, std::ostream* out) { *out << c.name; }

// Decodes (one without context), chunked prefills continuing from saved states, a fresh prefill
// crossing several 64-token chunks and block boundaries.
const std::vector<RequestSpec> kMixed = {{40, 1}, {0, 1}, {19, 1}, {35, 30}, {0, 150}, {64, 17}};
const std::vector<RequestSpec> kSmallMixed = {{20, 1}, {0, 1}, {16, 9}, {0, 18}};
const std::vector<RequestSpec> kDecodes = {{300, 1}, {17, 1}, {0, 1}, {45, 1}, {64, 1}};

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> all;
  const std::vector<std::pair<MambaCacheMode, std::string>> caches = {
      {MambaCacheMode::kNone, "None"}, {MambaCacheMode::kAll, "All"}, {MambaCacheMode::kAlign, "Align"}};
  for (const LayerKind kind : {LayerKind::kGdn, LayerKind::kMamba2}) {
    const std::string k = kind == LayerKind::kGdn ? "Gdn" : "Mamba2";
    all.push_back({.name = "Small" + k + "MixedAll", .kind = kind, .cache = MambaCacheMode::kAll,
                   .requests = kSmallMixed, .padding = 2, .seed = 3});
    all.push_back({.name = "Small" + k + "GraphDecodesAll", .kind = kind, .cache = MambaCacheMode::kAll,
                   .requests = kDecodes, .padding = 3, .graph = true, .seed = 5});
    for (const auto& [cache, cache_name] : caches) {
      all.push_back({.name = k + "Mixed" + cache_name + "Bf16", .kind = kind, .cache = cache, .requests = kMixed,
                     .padding = 2, .seed = 7});
      all.push_back({.name = k + "GraphDecodes" + cache_name, .kind = kind, .cache = cache, .requests = kDecodes,
                     .padding = 3, .graph = true, .seed = 9});
    }
    all.push_back({.name = k + "MixedAlignFp32", .kind = kind, .cache = MambaCacheMode::kAlign,
                   .dtype = DType::kFloat32, .requests = kMixed, .seed = 11});
    all.push_back({.name = k + "BigMixedAllFp16", .kind = kind, .cache = MambaCacheMode::kAll,
                   .dtype = DType::kFloat16, .requests = kMixed, .padding = 1, .big = true, .seed = 13});
  }
  return all;
}

class CudaLinearLayer : public CudaParamFixture<LinearCase> {};

TEST_P(CudaLinearLayer, MatchesTheReferenceAndRepeatsBitForBit) {
  const LinearCase& c = GetParam();
  const AttentionConfig config = linear_config(c.kind, c.cache, c.dtype, c.big);
  SyntheticOptions options{.seed = c.seed, .padding_tokens = c.padding, .padding_requests = c.padding};
  const BatchFile file = layer_file(config, c.graph ? graph_builder() : BuilderConfig{}, c.requests, options,
                                    0, c.seed + 100);
  const StepOutputs cuda = run_on("cuda", file);
  const StepOutputs reference = run_on("reference", file);
  if (c.graph) {
    ASSERT_EQ(cuda.metadata.mamba->cudagraph_padded, 1) << "the builder did not pad the decode batch";
  }
  const ComparisonReport report = compare_step(file, cuda, reference);
  EXPECT_TRUE(report.passed()) << format_report_table({report});
  // The output is the core's own: not all zeros (the rows were computed, not skipped).
  double largest = 0.0;
  for (int64_t i = 0; i < file.batch.num_actual_tokens * cuda.output.size(1); ++i) {
    largest = std::max(largest, std::abs(load_as_double(cuda.output.data(), cuda.output.dtype(), i)));
  }
  EXPECT_GT(largest, 0.0);

  const StepOutputs again = run_on("cuda", file);
  EXPECT_TRUE(bitwise_equal(again.output, cuda.output)) << "a second run differs";
  for (const auto& [name, pool] : cuda.ssm_state) EXPECT_TRUE(bitwise_equal(again.ssm_state.at(name), pool)) << name;
}

std::string linear_case_name(const ::testing::TestParamInfo<LinearCase>& param) { return param.param.name; }
INSTANTIATE_TEST_SUITE_P(Cases, CudaLinearLayer, ::testing::ValuesIn(linear_cases()), linear_case_name);

// Linear layers with a prefill, run with BackendSettings::ssm_prefill_operands model: the layer's
// output is the core's read-out itself (Mamba-2's SSD y, GDN's delta-rule o: no norm or out_proj
// after it), within the tolerance table's 16-bit-operand SSM row (the model dtype's; a float32 model
// keeps the float32 row and the default setting's bits), and bitwise reproducible.
std::vector<LinearCase> prefill_cases_of(LayerKind kind) {
  std::vector<LinearCase> selected;
  for (const LinearCase& c : linear_cases()) {
    if (c.kind == kind && !c.graph) selected.push_back(c);
  }
  return selected;
}

void expect_model_operands_within_the_16bit_row(const LinearCase& c) {
  const AttentionConfig config = linear_config(c.kind, c.cache, c.dtype, c.big);
  SyntheticOptions options{.seed = c.seed, .padding_tokens = c.padding, .padding_requests = c.padding};
  const BatchFile file = layer_file(config, BuilderConfig{}, c.requests, options, 0, c.seed + 100);
  BackendSettings settings{file.config, file.builder};
  settings.ssm_prefill_operands = SsmPrefillOperands::kModel;
  auto backend = create_backend("cuda", settings);
  const StepOutputs cuda = run_step(*backend, file);
  const StepOutputs reference = run_on("reference", file);
  const bool model16 = c.dtype == DType::kFloat16 || c.dtype == DType::kBFloat16;
  CompareOptions compare;
  compare.ssm_operand_dtype = model16 ? c.dtype : DType::kFloat32;
  const ComparisonReport report = compare_step(file, cuda, reference, compare);
  EXPECT_TRUE(report.passed()) << format_report_table({report});
  const StepOutputs again = run_step(*backend, file);
  EXPECT_TRUE(bitwise_equal(again.output, cuda.output)) << "a second run differs";
  for (const auto& [name, pool] : cuda.ssm_state) EXPECT_TRUE(bitwise_equal(again.ssm_state.at(name), pool)) << name;
  if (!model16) {
    EXPECT_TRUE(bitwise_equal(run_on("cuda", file).output, cuda.output))
        << "a float32 model's ssm_prefill_operands model differs from float32";
  }
}

class CudaLinearMamba2ModelOperands : public CudaParamFixture<LinearCase> {};

TEST_P(CudaLinearMamba2ModelOperands, MatchesTheReferenceWithinThe16BitRow) {
  expect_model_operands_within_the_16bit_row(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLinearMamba2ModelOperands,
                         ::testing::ValuesIn(prefill_cases_of(LayerKind::kMamba2)), linear_case_name);

class CudaLinearGdnModelOperands : public CudaParamFixture<LinearCase> {};

TEST_P(CudaLinearGdnModelOperands, MatchesTheReferenceWithinThe16BitRow) {
  expect_model_operands_within_the_16bit_row(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLinearGdnModelOperands, ::testing::ValuesIn(prefill_cases_of(LayerKind::kGdn)),
                         linear_case_name);

// Mixed batch == each request alone, bit for bit: a request's output rows and state depend on nothing
// else in the batch — whichever path runs it (in the mixed batch the eager wave driver; alone, a
// decode takes the fixed decode step: the same sums in the same order).
class CudaLinearKinds : public CudaParamFixture<LayerKind> {};

TEST_P(CudaLinearKinds, MixedBatchEqualsEachRequestAloneBitForBit) {
  const AttentionConfig config = linear_config(GetParam(), MambaCacheMode::kNone, DType::kBFloat16);
  const BatchFile mixed =
      layer_file(config, BuilderConfig{}, kMixed, {.seed = 21, .padding_tokens = 2, .padding_requests = 1}, 0, 77);
  const StepOutputs together = run_on("cuda", mixed);
  const BatchDescription& b = mixed.batch;
  for (int64_t r = 0; r < static_cast<int64_t>(kMixed.size()); ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    const int64_t begin = b.query_start_loc[r], end = b.query_start_loc[r + 1];
    const int32_t slot = b.ssm_block_table->at(r, 0);
    const BatchFile alone_file = request_step(config, b.context_len(r), input_rows(mixed, begin, end), slot,
                                              mixed.inputs.ssm_state, mixed.inputs.weights);
    const StepOutputs alone = run_on("cuda", alone_file);
    expect_close(rows_of(together.output, begin, end), rows_of(alone.output, 0, end - begin), exact_tolerance(),
                 "output rows");
    EXPECT_TRUE(same_slot_bytes(together.ssm_state, alone.ssm_state, slot)) << "slot " << slot;
  }
}

std::string kind_name_of(const ::testing::TestParamInfo<LayerKind>& param) { return kind_name(param.param); }
INSTANTIATE_TEST_SUITE_P(Kinds, CudaLinearKinds, ::testing::Values(LayerKind::kGdn, LayerKind::kMamba2), kind_name_of);

// --- one CUDA graph of a whole per-layer step ---------------------------------------------------------

// Padded decode batches of one shape (8 requests, 8 rows): A (the capture) has the widest block
// table; B has more padding, C none.
struct PaddedBatch {
  std::vector<RequestSpec> requests;
  int64_t padding = 0;
};
const PaddedBatch kA = {{{300, 1}, {17, 1}, {2000, 1}, {45, 1}, {0, 1}, {128, 1}}, 2};
const PaddedBatch kB = {{{1200, 1}, {3, 1}, {600, 1}}, 5};
const PaddedBatch kC = {{{64, 1}, {500, 1}, {1, 1}, {77, 1}, {128, 1}, {0, 1}, {900, 1}, {31, 1}}, 0};
constexpr int64_t kPaddedSize = 8;
constexpr int kLinearLayers = 3;

// The layer files of one model step: kLinearLayers linear layers (own pools and weights), then the
// attention layer. Every step of the test has KV caches of one shape and pools of one size.
struct ModelStep {
  std::vector<BatchFile> layers;
  std::vector<const BatchFile*> pointers() const {
    std::vector<const BatchFile*> out;
    for (const BatchFile& layer : layers) out.push_back(&layer);
    return out;
  }
};

class PerLayerModel {
 public:
  PerLayerModel(LayerKind kind, MambaCacheMode cache)
      : attention_(attention_config(cache)), linear_(linear_config(kind, cache, DType::kBFloat16)) {}

  PerLayerSettings settings() const { return {{attention_, graph_builder()}, {linear_, graph_builder()}}; }

  // A, B and C; the padding requests of B keep (stale) SSM table rows naming slots only A's
  // requests use — a padded graph replay must not touch them.
  std::vector<ModelStep> steps() const {
    const std::vector<const PaddedBatch*> specs = {&kA, &kB, &kC};
    int64_t blocks = 0, slots = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const BatchFile probe = layer_file(attention_, graph_builder(), specs[i]->requests, options(*specs[i], i, 3), 0, 0);
      blocks = std::max(blocks, probe.inputs.kv_cache.size(0));
      slots = std::max(slots, ssm_slots_needed(probe.batch) + 2);
    }
    std::vector<ModelStep> out;
    for (size_t i = 0; i < specs.size(); ++i) {
      const BatchFile probe = layer_file(attention_, graph_builder(), specs[i]->requests, options(*specs[i], i, 3), 0, 0);
      const SyntheticOptions o = options(*specs[i], i, 3 + blocks - probe.inputs.kv_cache.size(0));
      ModelStep step;
      for (int l = 0; l < kLinearLayers; ++l) {
        step.layers.push_back(layer_file(linear_, graph_builder(), specs[i]->requests, o, slots, 31 + l));
      }
      step.layers.push_back(layer_file(attention_, graph_builder(), specs[i]->requests, o, 0, 0));
      out.push_back(std::move(step));
    }
    // B's padding requests: stale rows naming A's slots that B's requests do not use.
    const IntArray& a_table = *out[0].layers[0].batch.ssm_block_table;
    const int64_t b_real = static_cast<int64_t>(kB.requests.size());
    for (BatchFile& layer : out[1].layers) {
      IntArray& table = *layer.batch.ssm_block_table;
      for (int64_t r = b_real; r < table.size(0); ++r) {
        for (int64_t col = 0; col < table.size(1); ++col) {
          // A's requests 3..5 (rows of A's table that B's requests never use).
          table.at(r, col) = col < a_table.size(1) ? a_table.at(3 + (r - b_real) % 3, col) : 0;
        }
      }
    }
    return out;
  }

 private:
  static SyntheticOptions options(const PaddedBatch& b, size_t index, int64_t spare_blocks) {
    return {.seed = 40 + index, .spare_blocks = spare_blocks, .padding_tokens = b.padding,
            .padding_requests = b.padding};
  }

  AttentionConfig attention_;
  AttentionConfig linear_;
};

::testing::AssertionResult same_bits(const StepOutputs& replayed, const StepOutputs& eager) {
  const std::string difference = first_bit_difference(replayed, eager);
  if (difference.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << difference << " differs";
}

class CudaPerLayerGraph : public CudaParamFixture<std::pair<LayerKind, MambaCacheMode>> {};

TEST_P(CudaPerLayerGraph, OneGraphOfTheWholeStepReplaysLikeTheEagerStep) {
  const auto [kind, cache] = GetParam();
  const PerLayerModel model(kind, cache);
  const std::vector<ModelStep> steps = model.steps();
  const ModelStep& a = steps[0];
  auto backend = create_per_layer_backend("cuda", model.settings());
  std::vector<LayerBuffers> layers;
  for (const BatchFile& file : a.layers) layers.emplace_back(*backend, file);

  // Capture A's step: plan it into the graph state, then record every layer's calls on one stream.
  backend->init_graph_state(kPaddedSize, kPaddedSize);
  const HybridMetadata captured = backend->build_metadata(a.layers[0].batch);
  ASSERT_EQ(captured.mamba->cudagraph_padded, 1) << "the builder did not pad A for a CUDA graph";
  backend->init_capture_metadata(captured, a.layers[0].batch);
  for (size_t l = 0; l < layers.size(); ++l) load_step(*backend, layers[l], a.layers[l]);
  std::vector<StepOutputs> before;
  for (const LayerBuffers& layer : layers) before.push_back(layer.download_all(*backend, captured));
  const auto stream = static_cast<cudaStream_t>(backend->native_stream());
  CapturedGraph g;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  std::string capture_error;
  try {
    for (const LayerBuffers& layer : layers) layer.run(*backend, captured, a.layers[0].batch);
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &g.graph);
  ASSERT_TRUE(capture_error.empty()) << "a layer call during the capture threw: " << capture_error;
  ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  check_cuda(cudaGraphInstantiate(&g.exec, g.graph, 0), "cudaGraphInstantiate");
  size_t nodes = 0;
  check_cuda(cudaGraphGetNodes(g.graph, nullptr, &nodes), "cudaGraphGetNodes");
  EXPECT_GT(nodes, static_cast<size_t>(layers.size())) << "every layer's kernels are in the graph";
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_TRUE(same_bits(layers[l].download_all(*backend, captured), before[l])) << "capturing ran layer " << l;
  }

  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::string(1, static_cast<char>('A' + s)));
    const ModelStep& step = steps[s];
    const BatchDescription& batch = step.layers[0].batch;
    for (size_t l = 0; l < layers.size(); ++l) load_step(*backend, layers[l], step.layers[l]);
    const HybridMetadata metadata = backend->build_metadata(batch);
    backend->init_replay_metadata(metadata, batch);
    check_cuda(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");
    backend->synchronize();

    auto eager_backend = create_per_layer_backend("cuda", model.settings());
    const std::vector<StepOutputs> eager = run_per_layer_step(*eager_backend, step.pointers());
    auto reference_backend = create_per_layer_backend("reference", model.settings());
    const std::vector<StepOutputs> reference = run_per_layer_step(*reference_backend, step.pointers());
    for (size_t l = 0; l < layers.size(); ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const StepOutputs replayed = layers[l].download_all(*backend, metadata);
      EXPECT_TRUE(same_bits(replayed, eager[l])) << "the replayed step differs from the eager step";
      const ComparisonReport report = compare_step(step.layers[l], replayed, reference[l]);
      EXPECT_TRUE(report.passed()) << format_report_table({report});
    }
  }
  // The stale rows of B really named live slots: the builder rewrote them as PAD_SLOT_ID.
  const HybridMetadata b_metadata = backend->build_metadata(steps[1].layers[0].batch);
  for (int64_t r = static_cast<int64_t>(kB.requests.size()); r < kPaddedSize; ++r) {
    EXPECT_NE((*steps[1].layers[0].batch.ssm_block_table).at(r, 0), kPadSlotId);
    EXPECT_EQ(b_metadata.mamba->state_indices_tensor_d.at(r, 0), kPadSlotId) << "request " << r;
  }
}

std::string model_name(const ::testing::TestParamInfo<std::pair<LayerKind, MambaCacheMode>>& param) {
  return "Small" + std::string(param.param.first == LayerKind::kGdn ? "Gdn" : "Mamba2") + "Cache" +
         std::string(to_string(param.param.second));
}
INSTANTIATE_TEST_SUITE_P(Models, CudaPerLayerGraph,
                         ::testing::Values(std::pair{LayerKind::kGdn, MambaCacheMode::kNone},
                                           std::pair{LayerKind::kGdn, MambaCacheMode::kAll},
                                           std::pair{LayerKind::kMamba2, MambaCacheMode::kAlign}),
                         model_name);

// The hooks refuse what a graph cannot hold, naming it, and run calls in graph mode refuse another
// shape; a linear layer's backend refuses attention calls.
TEST(CudaPerLayerGraphRefusals, HooksAndCallsNameWhatDoesNotFit) {
  HYBRIDTB_SKIP_WITHOUT_CUDA();
  const PerLayerModel model(LayerKind::kGdn, MambaCacheMode::kNone);
  const std::vector<ModelStep> steps = model.steps();
  auto backend = create_per_layer_backend("cuda", model.settings());
  const BatchDescription& a = steps[0].layers[0].batch;
  const HybridMetadata metadata = backend->build_metadata(a);
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([&] { backend->init_capture_metadata(metadata, a); }).find("before init_graph_state"),
            std::string::npos);
  backend->init_graph_state(2, 2);
  EXPECT_NE(message([&] { backend->init_capture_metadata(metadata, a); }).find("more than init_graph_state's 2 and 2"),
            std::string::npos);
  backend->init_graph_state(kPaddedSize, kPaddedSize);
  EXPECT_NE(message([&] { backend->init_replay_metadata(metadata, a); }).find("before any capture"), std::string::npos);
  const BatchFile mixed = layer_file(linear_config(LayerKind::kGdn, MambaCacheMode::kNone, DType::kBFloat16),
                                     graph_builder(), {{20, 1}, {16, 3}}, {.seed = 3}, 0, 1);
  EXPECT_NE(message([&] { backend->init_capture_metadata(backend->build_metadata(mixed.batch), mixed.batch); })
                .find("query_len 3"),
            std::string::npos);
  backend->init_capture_metadata(metadata, a);
  const BatchFile four = layer_file(linear_config(LayerKind::kGdn, MambaCacheMode::kNone, DType::kBFloat16),
                                    graph_builder(), {{5, 1}, {9, 1}, {3, 1}},
                                    {.seed = 4, .padding_tokens = 1, .padding_requests = 1}, 0, 1);
  ASSERT_EQ(four.batch.num_reqs(), 4);  // padded to the capture size 4, which no graph has
  EXPECT_NE(message([&] { backend->init_replay_metadata(backend->build_metadata(four.batch), four.batch); })
                .find("pad it to a captured shape"),
            std::string::npos);
  // Graph mode: a call with another batch shape is refused.
  backend->init_replay_metadata(metadata, a);
  const LayerBuffers gdn(*backend, steps[0].layers[0]);
  const StepTensors views = gdn.views();
  EXPECT_NE(message([&] { backend->linear_attention_forward(metadata, four.batch, views, gdn.output); })
                .find("CUDA-graph mode"),
            std::string::npos);
  // A linear layer's backend has no attention.
  auto linear_only = create_backend("cuda", {model.settings().linear});
  EXPECT_NE(message([&] { linear_only->write_kv_cache(a, views); }).find("which has no attention"), std::string::npos);
}

}  // namespace
}  // namespace hybridtb::testing
