// The composite backend of a per-layer model (PerLayerBackend, hybridtb/per_layer.h) and the
// reference's linear-attention layers (hybridtb/reference/linear_layer.h): routing (an attention
// layer gives exactly the reference attention's results, a gdn / mamba2 layer exactly its core's,
// computed here by calling the core directly), one metadata build per step, the CUDA-graph hooks
// delegated to both backends, padding that writes nothing (also when padding requests keep stale
// slot ids, pymllm's bug), a mixed batch == each request alone, and chunked prefill + decodes ==
// one-shot prefill. Run: ctest --test-dir <build> -L per_layer
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/reference/reference_backend.h"
#include "hybridtb/step.h"
#include "per_layer_support.h"
#include "ssm_test_support.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;
using testing::Matrix;
using testing::NamedTensors;

// Decodes, a chunk continuing a request, a fresh prefill; then a padding request and two
// CUDA-graph padding rows.
const std::vector<RequestSpec> kMixedRequests = {{.context_len = 40, .query_len = 1},
                                                 {.context_len = 7, .query_len = 1},
                                                 {.context_len = 50, .query_len = 30},
                                                 {.context_len = 0, .query_len = 21}};
const SyntheticOptions kMixedOptions = {.seed = 3, .padding_tokens = 2, .padding_requests = 1};

std::unique_ptr<PerLayerBackend> composite(LayerKind kind, const BuilderConfig& builder = {}) {
  return create_per_layer_backend("reference", {BackendSettings{testing::attention_layer(), builder},
                                                BackendSettings{testing::linear_layer(kind), builder}});
}

// A backend that forwards to a reference backend and records what it was asked to do.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend(const AttentionConfig& config, std::string label, std::vector<std::string>& log)
      : inner_(reference::make_reference_backend({config, {}})), label_(std::move(label)), log_(log) {}

  int builds = 0;

  std::string name() const override { return "recording"; }
  Device device() const override { return inner_->device(); }
  DType output_dtype() const override { return inner_->output_dtype(); }
  Tensor allocate(DType dtype, const Shape& shape) override { return inner_->allocate(dtype, shape); }
  void copy(const TensorView& dst, const TensorView& src) override { inner_->copy(dst, src); }
  void synchronize() override {}
  HybridMetadata build_metadata(const BatchDescription& batch) override {
    ++builds;
    log_.push_back(label_ + ".build_metadata");
    return inner_->build_metadata(batch);
  }
  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override {
    log_.push_back(label_ + ".write_kv_cache");
    inner_->write_kv_cache(batch, tensors);
  }
  void attention_forward(const HybridMetadata& m, const BatchDescription& b, const StepTensors& t,
                         const TensorView& o) override {
    log_.push_back(label_ + ".attention_forward");
    inner_->attention_forward(m, b, t, o);
  }
  void ssm_forward(const HybridMetadata& m, const BatchDescription& b, const StepTensors& t,
                   const TensorView& c) override {
    log_.push_back(label_ + ".ssm_forward");
    inner_->ssm_forward(m, b, t, c);
  }
  void hybrid_forward(const HybridMetadata& m, const BatchDescription& b, const StepTensors& t,
                      const HybridOutputs& o) override {
    log_.push_back(label_ + ".hybrid_forward");
    inner_->hybrid_forward(m, b, t, o);
  }
  void linear_attention_forward(const HybridMetadata& m, const BatchDescription& b, const StepTensors& t,
                                const TensorView& o) override {
    log_.push_back(label_ + ".linear_attention_forward");
    inner_->linear_attention_forward(m, b, t, o);
  }
  void init_graph_state(int64_t reqs, int64_t tokens) override {
    log_.push_back(label_ + ".init_graph_state");
    inner_->init_graph_state(reqs, tokens);
  }
  void init_capture_metadata(const HybridMetadata& m, const BatchDescription& b) override {
    log_.push_back(label_ + ".init_capture_metadata");
    inner_->init_capture_metadata(m, b);
  }
  void init_replay_metadata(const HybridMetadata& m, const BatchDescription& b) override {
    log_.push_back(label_ + ".init_replay_metadata");
    inner_->init_replay_metadata(m, b);
  }

 private:
  std::unique_ptr<Backend> inner_;
  std::string label_;
  std::vector<std::string>& log_;
};

// A composite of two recording backends over the reference; `log` receives every call.
struct RecordingComposite {
  std::vector<std::string> log;
  RecordingBackend* attention = nullptr;
  RecordingBackend* linear = nullptr;
  std::unique_ptr<PerLayerBackend> backend;

  explicit RecordingComposite(LayerKind kind) {
    const AttentionConfig a = testing::attention_layer(), l = testing::linear_layer(kind);
    auto attention_backend = std::make_unique<RecordingBackend>(a, "attention", log);
    auto linear_backend = std::make_unique<RecordingBackend>(l, "linear", log);
    attention = attention_backend.get();
    linear = linear_backend.get();
    backend = std::make_unique<PerLayerBackend>(std::move(attention_backend), std::move(linear_backend),
                                                PerLayerSettings{{a, {}}, {l, {}}});
  }
};

void expect_bitwise(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_TRUE(bitwise_equal(actual, expected)) << what << " differs";
}

void expect_same_pools(const NamedTensors& actual, const NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, pool] : expected) expect_bitwise(actual.at(name), pool, "pool " + name);
}

// Rows [num_actual_tokens, T) of a token-major output still hold the NaN poison.
void expect_padding_rows_unwritten(const Tensor& output, int64_t num_actual_tokens) {
  const int64_t width = output.numel() / output.size(0);
  for (int64_t i = num_actual_tokens * width; i < output.numel(); ++i) {
    ASSERT_TRUE(std::isnan(load_as_double(output.data(), output.dtype(), i))) << "padding element " << i << " written";
  }
}

class PerLayerKinds : public ::testing::TestWithParam<LayerKind> {};
std::string kind_test_name(const ::testing::TestParamInfo<LayerKind>& param_info) {
  return testing::kind_name(param_info.param);
}

// --- routing ------------------------------------------------------------------------------------------

TEST_P(PerLayerKinds, AttentionLayersGiveExactlyTheReferenceAttentionResults) {
  const BatchFile file = testing::layer_file(testing::attention_layer(), kMixedRequests, kMixedOptions);
  auto backend = composite(GetParam());
  const StepOutputs routed = run_step(*backend, file);
  const StepOutputs alone = testing::run_on_reference(file);
  expect_bitwise(routed.output, alone.output, "output");
  expect_bitwise(routed.attn_output, alone.attn_output, "attn_output");
  expect_bitwise(routed.kv_cache, alone.kv_cache, "kv_cache");
  EXPECT_EQ(routed.metadata, alone.metadata);  // the two layer configs share their builder inputs
  EXPECT_EQ(routed.backend, "reference");
}

TEST_P(PerLayerKinds, LinearLayersGiveExactlyTheCoresResults) {
  const AttentionConfig config = testing::linear_layer(GetParam());
  const BatchFile file = testing::layer_file(config, kMixedRequests, kMixedOptions);
  auto backend = composite(GetParam());
  const StepOutputs out = run_step(*backend, file);

  // The expected results, request by request, from the core itself: a decode is one single-step
  // call, a chunk or prefill one call over its rows; the state comes from the request's slot (the
  // first column of its SSM table row, mode none) when it has context, zeros otherwise.
  NamedTensors pools = testing::clone_all(file.inputs.ssm_state);
  const reference::ssm::Weights weights = testing::to_weights(file.inputs.weights);
  const int64_t width = out.output.size(1);
  const BatchDescription& b = file.batch;
  for (int64_t r = 0; r < static_cast<int64_t>(kMixedRequests.size()); ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    const int64_t slot = b.ssm_block_table->at(r, 0);
    reference::ssm::State state = testing::load_slot(pools, slot);
    if (b.context_len(r) == 0) {
      for (auto& [name, values] : state) values.setZero();
    }
    const int64_t begin = b.query_start_loc[r], end = b.query_start_loc[r + 1];
    const Matrix expected = testing::run_core(config, weights, state, testing::input_rows(file, begin, end),
                                              /*decode=*/b.query_len(r) == 1);
    testing::store_slot(pools, slot, state);
    ASSERT_EQ(expected.cols(), width);
    testing::expect_close(testing::rows_of(out.output, begin, end), expected, testing::exact_tolerance(), "output rows");
  }
  expect_same_pools(out.ssm_state, pools);
  expect_padding_rows_unwritten(out.output, b.num_actual_tokens);
  EXPECT_TRUE(out.attn_output.empty());
  EXPECT_TRUE(out.kv_cache.empty());
}

TEST(PerLayerBackend, CallsOfTheOtherKindAreRefusedByName) {
  auto attention_only = reference::make_reference_backend({testing::attention_layer(), {}});
  const BatchFile linear = testing::layer_file(testing::linear_layer(LayerKind::kGdn), kMixedRequests, kMixedOptions);
  const Tensor output = Tensor::host(DType::kFloat64, {linear.batch.num_tokens(), 32});
  const HybridMetadata metadata = attention_only->build_metadata(linear.batch);
  EXPECT_THAT(testing::error_of([&] {
                attention_only->linear_attention_forward(metadata, linear.batch, linear.inputs.views(), output);
              }),
              HasSubstr("linear_attention_forward called for a full_attention layer"));
  auto gdn_only = reference::make_reference_backend({testing::linear_layer(LayerKind::kGdn), {}});
  EXPECT_THAT(testing::error_of([&] { gdn_only->write_kv_cache(linear.batch, linear.inputs.views()); }),
              HasSubstr("write_kv_cache called for a layer_kind gdn layer"));
  // The interface's default for a backend without linear layers: NotSupported, never a fallback.
  class AttentionOnly final : public Backend {
   public:
    std::string name() const override { return "attention-only"; }
    Device device() const override { return Device::kHost; }
    DType output_dtype() const override { return DType::kFloat64; }
    Tensor allocate(DType dtype, const Shape& shape) override { return Tensor::host(dtype, shape); }
    void copy(const TensorView&, const TensorView&) override {}
    void synchronize() override {}
    HybridMetadata build_metadata(const BatchDescription&) override { return {}; }
    void write_kv_cache(const BatchDescription&, const StepTensors&) override {}
    void attention_forward(const HybridMetadata&, const BatchDescription&, const StepTensors&,
                           const TensorView&) override {}
    void ssm_forward(const HybridMetadata&, const BatchDescription&, const StepTensors&, const TensorView&) override {}
    void hybrid_forward(const HybridMetadata&, const BatchDescription&, const StepTensors&,
                        const HybridOutputs&) override {}
  } plain;
  EXPECT_THROW(plain.linear_attention_forward(metadata, linear.batch, linear.inputs.views(), output), NotSupported);
  EXPECT_THROW(plain.init_graph_state(4, 4), NotSupported);
}

TEST(PerLayerBackend, ConstructionChecksTheTwoConfigurations) {
  const AttentionConfig a = testing::attention_layer(), l = testing::linear_layer(LayerKind::kGdn);
  EXPECT_THAT(testing::error_of([&] { create_per_layer_backend("reference", {{l, {}}, {l, {}}}); }),
              HasSubstr("the attention layers' config has layer_kind gdn"));
  EXPECT_THAT(testing::error_of([&] { create_per_layer_backend("reference", {{a, {}}, {a, {}}}); }),
              HasSubstr("the linear layers' config has layer_kind full_attention"));
  BuilderConfig graphs;
  graphs.cudagraph_mode = CudaGraphMode::kFull;
  EXPECT_THAT(testing::error_of([&] { create_per_layer_backend("reference", {{a, {}}, {l, graphs}}); }),
              HasSubstr("different builder settings"));
}

// --- one metadata build per step, graph hooks to both ----------------------------------------------------

TEST_P(PerLayerKinds, BuildsTheMetadataOncePerStepForEveryLayer) {
  RecordingComposite c(GetParam());
  const BatchFile attention = testing::layer_file(testing::attention_layer(), kMixedRequests, kMixedOptions);
  const BatchFile linear = testing::layer_file(testing::linear_layer(GetParam()), kMixedRequests, kMixedOptions, 12);
  const BatchFile linear2 = testing::layer_file(testing::linear_layer(GetParam()), kMixedRequests, kMixedOptions, 13);
  const std::vector<StepOutputs> out = run_per_layer_step(*c.backend, {&linear, &linear2, &attention, &linear});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(c.attention->builds, 1);
  EXPECT_EQ(c.linear->builds, 1);
  EXPECT_THAT(c.log, ::testing::ElementsAre("attention.build_metadata", "linear.build_metadata",
                                            "linear.linear_attention_forward", "linear.linear_attention_forward",
                                            "attention.write_kv_cache", "attention.hybrid_forward",
                                            "linear.linear_attention_forward"));
  // The shared metadata: the attention half from the attention layers, the Mamba half from the linear ones.
  const HybridMetadata attention_own = reference::make_reference_backend({testing::attention_layer(), {}})
                                           ->build_metadata(attention.batch);
  const HybridMetadata linear_own = reference::make_reference_backend({testing::linear_layer(GetParam()), {}})
                                        ->build_metadata(attention.batch);
  for (const StepOutputs& layer : out) {
    EXPECT_EQ(layer.metadata.attention.use_3d_path, attention_own.attention.use_3d_path);
    EXPECT_TRUE(metadata_differences(layer.metadata, HybridMetadata{attention_own.attention, linear_own.mamba}).empty());
  }
}

TEST_P(PerLayerKinds, DelegatesTheGraphLifecycleToBothBackendsAttentionFirst) {
  RecordingComposite c(GetParam());
  const BatchFile decodes = testing::layer_file(testing::linear_layer(GetParam()), {{10, 1}, {20, 1}}, {.seed = 4});
  const HybridMetadata metadata = c.backend->build_metadata(decodes.batch);
  c.log.clear();
  c.backend->init_graph_state(2, 2);
  c.backend->init_capture_metadata(metadata, decodes.batch);
  c.backend->init_replay_metadata(metadata, decodes.batch);
  EXPECT_THAT(c.log, ::testing::ElementsAre("attention.init_graph_state", "linear.init_graph_state",
                                            "attention.init_capture_metadata", "linear.init_capture_metadata",
                                            "attention.init_replay_metadata", "linear.init_replay_metadata"));
}

TEST(PerLayerBackend, TheReferenceGraphHooksRefuseWhatAGraphCannotHold) {
  auto backend = composite(LayerKind::kGdn);
  const BatchFile mixed = testing::layer_file(testing::linear_layer(LayerKind::kGdn), kMixedRequests, kMixedOptions);
  const BatchFile decodes = testing::layer_file(testing::linear_layer(LayerKind::kGdn), {{10, 1}, {20, 1}}, {.seed = 4});
  const BatchFile three = testing::layer_file(testing::linear_layer(LayerKind::kGdn), {{10, 1}, {20, 1}, {5, 1}}, {.seed = 4});
  const HybridMetadata m = backend->build_metadata(decodes.batch);
  EXPECT_THAT(testing::error_of([&] { backend->init_capture_metadata(m, decodes.batch); }),
              HasSubstr("before init_graph_state"));
  backend->init_graph_state(2, 2);
  EXPECT_THAT(testing::error_of([&] { backend->init_replay_metadata(m, decodes.batch); }),
              HasSubstr("before any capture"));
  EXPECT_THAT(testing::error_of([&] { backend->init_capture_metadata(m, three.batch); }),
              HasSubstr("more than init_graph_state's 2 and 2"));
  backend->init_graph_state(8, 64);
  EXPECT_THAT(testing::error_of([&] { backend->init_capture_metadata(m, mixed.batch); }),
              HasSubstr("request 2 has query_len 30"));
  backend->init_capture_metadata(m, decodes.batch);
  EXPECT_THAT(testing::error_of([&] { backend->init_replay_metadata(m, three.batch); }),
              HasSubstr("the graph was captured for 2 and 2"));
}

// --- padding --------------------------------------------------------------------------------------------

// pymllm's padded decode rows keep the slot ids of an earlier, larger batch and write live state
// (notes §2.6). Here: a graph captured for 4 decodes, then replayed with 2 real decodes and 2
// padding requests whose SSM table rows still hold the slots of the two requests that left (3 and
// 4, alive elsewhere); their slots must not change, and the padding rows stay unwritten.
TEST_P(PerLayerKinds, PaddingRequestsWithStaleSlotIdsWriteNothing) {
  const AttentionConfig config = testing::linear_layer(GetParam());
  BuilderConfig graphs;
  graphs.cudagraph_mode = CudaGraphMode::kFullDecodeOnly;
  graphs.cudagraph_capture_sizes = {4};
  auto backend = composite(GetParam(), graphs);
  const std::vector<RequestSpec> four = {{12, 1}, {30, 1}, {7, 1}, {19, 1}};
  BatchFile large = testing::layer_file(config, four, {.seed = 6});
  large.builder = graphs;
  ASSERT_EQ(*large.batch.ssm_block_table, IntArray({4, 1}, {1, 2, 3, 4}));

  backend->init_graph_state(4, 4);
  const HybridMetadata captured = backend->build_metadata(large.batch);
  backend->init_capture_metadata(captured, large.batch);
  const StepOutputs first = run_layer_step(*backend, large, captured);

  BatchFile small = testing::layer_file(config, {{13, 1}, {31, 1}}, {.seed = 7, .padding_tokens = 2, .padding_requests = 2});
  small.builder = graphs;
  small.inputs.weights = testing::clone_all(large.inputs.weights);
  small.inputs.ssm_state = testing::clone_all(first.ssm_state);  // the pools as the first step left them
  small.batch.ssm_block_table = IntArray({4, 1}, {1, 2, 3, 4});    // stale ids in the padding rows
  const HybridMetadata replayed = backend->build_metadata(small.batch);
  backend->init_replay_metadata(replayed, small.batch);
  EXPECT_EQ(replayed.mamba->state_indices_tensor_d, IntArray({4, 1}, {1, 2, kPadSlotId, kPadSlotId}));
  const StepOutputs second = run_layer_step(*backend, small, replayed);

  for (const int64_t live : {3, 4}) {
    EXPECT_TRUE(testing::same_slot_bytes(second.ssm_state, first.ssm_state, live)) << "slot " << live << " was written";
  }
  for (const int64_t used : {1, 2}) {
    EXPECT_FALSE(testing::same_slot_bytes(second.ssm_state, first.ssm_state, used)) << "slot " << used << " unchanged";
  }
  EXPECT_TRUE(testing::same_slot_bytes(second.ssm_state, first.ssm_state, 0));  // the null slot
  expect_padding_rows_unwritten(second.output, 2);
}

// --- metamorphic relations ------------------------------------------------------------------------------

TEST_P(PerLayerKinds, MixedBatchEqualsEachRequestAlone) {
  const AttentionConfig config = testing::linear_layer(GetParam());
  const BatchFile mixed = testing::layer_file(config, kMixedRequests, kMixedOptions);
  const StepOutputs together = testing::run_on_reference(mixed);
  const BatchDescription& b = mixed.batch;
  for (int64_t r = 0; r < static_cast<int64_t>(kMixedRequests.size()); ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    const int64_t begin = b.query_start_loc[r], end = b.query_start_loc[r + 1];
    const int32_t slot = b.ssm_block_table->at(r, 0);
    const BatchFile alone_file = testing::request_step(config, b.context_len(r), testing::input_rows(mixed, begin, end),
                                                       slot, mixed.inputs.ssm_state, mixed.inputs.weights);
    const StepOutputs alone = testing::run_on_reference(alone_file);
    testing::expect_close(testing::rows_of(together.output, begin, end), testing::rows_of(alone.output, 0, end - begin),
                          testing::exact_tolerance(), "output rows");
    EXPECT_TRUE(testing::same_slot_bytes(together.ssm_state, alone.ssm_state, slot)) << "slot " << slot;
  }
}

TEST_P(PerLayerKinds, ChunkedPrefillThenDecodesEqualsOneShotPrefill) {
  const AttentionConfig config = testing::linear_layer(GetParam());
  constexpr int64_t kLength = 41;
  BatchFile one_shot = testing::layer_file(config, {{.context_len = 0, .query_len = kLength}}, {.seed = 8});
  // float64 pools: the states between the steps are then not rounded, and the two ways agree to
  // float64 accuracy (a float32 pool would round them to float32 at every step).
  one_shot.inputs.ssm_state = testing::convert_pools(one_shot.inputs.ssm_state, DType::kFloat64);
  const StepOutputs whole = testing::run_on_reference(one_shot);
  const int32_t slot = one_shot.batch.ssm_block_table->at(0, 0);

  // A prefill of 17 (longer than a conv window), a chunk of 2 (shorter than one), then decodes.
  std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 17}, {17, 19}};
  for (int64_t t = 19; t < kLength; ++t) pieces.emplace_back(t, t + 1);
  NamedTensors pools = testing::clone_all(one_shot.inputs.ssm_state);
  Matrix outputs(kLength, whole.output.size(1));
  for (const auto& [begin, end] : pieces) {
    const BatchFile step = testing::request_step(config, begin, testing::input_rows(one_shot, begin, end), slot, pools,
                                                 one_shot.inputs.weights);
    const StepOutputs out = testing::run_on_reference(step);
    outputs.middleRows(begin, end - begin) = testing::rows_of(out.output, 0, end - begin);
    pools = testing::clone_all(out.ssm_state);
  }
  const Tolerance tolerance = testing::linear_tolerance(config, kLength);
  testing::expect_close(outputs, testing::rows_of(whole.output, 0, kLength), tolerance, "outputs");
  for (const auto& [name, pool] : pools) {
    testing::expect_close(testing::slot_values(pool, slot), testing::slot_values(whole.ssm_state.at(name), slot),
                          tolerance, "final " + name);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, PerLayerKinds, ::testing::Values(LayerKind::kGdn, LayerKind::kMamba2),
                         kind_test_name);

}  // namespace
}  // namespace hybridtb
