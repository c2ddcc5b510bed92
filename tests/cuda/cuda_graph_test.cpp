// CUDA-graph capture and replay of decode steps on the "cuda" backend (Backend::capture_decode_step).
// Per case, one graph is captured for a padded decode batch A and replayed for A and for batches B
// and C of the same padded size (different requests, contexts, slots, number of padding requests),
// after copying each step's inputs into the captured tensors — as a serving engine does. Asserted:
//   - capturing runs nothing (outputs, KV cache and state pools unchanged after capture);
//   - every replay equals the eager step of the same batch on a fresh backend BIT FOR BIT: output,
//     attn_output, ssm_output, KV cache (and scale caches), every state pool;
//   - padding rows stay NaN in every output;
//   - the replayed step matches the reference (compare_step: the tolerance table, untouched slots);
//   - refusals with the field named and nothing run: another padded size, a wider block table, a
//     batch with prefill rows, a backend without graphs.
// Skips with the reason on a machine without a CUDA device.
// Run: ctest --test-dir <build> -L cuda   (cases named Small* are the compute-sanitizer subset)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_cases.h"
#include "cuda_compare.h"
#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/step.h"
#include "hybridtb/synthetic.h"

namespace hybridtb::testing {
namespace {

// The eager backend each replay is compared with: BackendSettings::fuse_hybrid_add (graphs always fuse).
struct Eager {
  bool fuse = true;
};
using GraphCase = CheckedCase<Eager>;

// Three decode batches padded to 8 requests and 8 token rows. A has the widest block table (the
// graph is captured on it) and a context long enough for split-KV; B has more padding; C none.
// A decode without context ({0, 1}) reads no state.
struct PaddedBatch {
  std::vector<RequestSpec> requests;
  int64_t padding = 0;  // padding requests = padding token rows
};
const PaddedBatch kA = {{{300, 1}, {17, 1}, {9000, 1}, {45, 1}, {0, 1}, {2000, 1}}, 2};
const PaddedBatch kB = {{{1200, 1}, {3, 1}, {600, 1}}, 5};
const PaddedBatch kC = {{{64, 1}, {5000, 1}, {1, 1}, {77, 1}, {128, 1}, {0, 1}, {900, 1}, {31, 1}}, 0};

// Batch `b` on case `c`'s layer, drawn from `seed`, for a builder with FULL_DECODE_ONLY capture sizes
// 1, 2, 4, 8 (decode_graph), the SSM branch on its own slot table.
BatchFile make_batch(const CudaCase& c, const PaddedBatch& b, uint64_t seed, int64_t spare_blocks,
                     int64_t num_slots) {
  CudaCase batch = c;
  batch.requests = b.requests;
  batch.padding_tokens = b.padding;
  batch.padding_requests = b.padding;
  batch.decode_graph = true;
  batch.spare_blocks = spare_blocks;
  batch.ssm_block_table = true;
  batch.seed = seed;
  // The same pools and weights for every batch (one seed): the graph's tensors are fixed.
  batch.tensor_seed = c.seed + 100;
  return make_step(batch, num_slots);
}

// A, B and C with KV caches of one shape (spare blocks make up the difference) and state pools of
// one size (two spare slots no request names), so that one set of device tensors serves all three.
std::vector<BatchFile> make_batches(const CudaCase& c) {
  const std::vector<const PaddedBatch*> specs = {&kA, &kB, &kC};
  std::vector<BatchFile> first;
  int64_t blocks = 0, slots = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    first.push_back(make_batch(c, *specs[i], c.seed + i, 3, 1));
    blocks = std::max(blocks, first.back().inputs.kv_cache.size(0));
    slots = std::max(slots, ssm_slots_needed(first.back().batch) + 2);
  }
  std::vector<BatchFile> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(make_batch(c, *specs[i], c.seed + i, 3 + blocks - first[i].inputs.kv_cache.size(0), slots));
  }
  return out;
}
::testing::AssertionResult same_bits(const StepOutputs& replayed, const StepOutputs& eager) {
  const std::string difference = first_bit_difference(replayed, eager);
  if (difference.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << difference << " of the replayed step differs from the eager step's";
}

std::vector<GraphCase> cases() {
  std::vector<GraphCase> all;
  auto add = [&](CudaCase c, Eager eager = {}) { all.push_back({std::move(c), eager}); };
  add({.name = "SmallNoSsmBf16"});
  add({.name = "SmallMamba1Bf16", .ssm_mode = "mamba1"});
  add({.name = "SmallPrefixSumFp8Cache", .ssm_mode = "prefix_sum", .cache = MambaCacheMode::kAll,
       .kv = KvCacheDtype::kFp8E4M3, .k_scale = 0.5f, .v_scale = 0.25f});
  add({.name = "Mamba1BigGqa4Fp16", .ssm_mode = "mamba1", .ssm_params = kMamba1Big, .num_heads = 16, .num_kv_heads = 4,
       .head_size = 64, .dtype = DType::kFloat16, .seed = 3});
  add({.name = "Mamba1AlignUnfusedEager", .ssm_mode = "mamba1", .cache = MambaCacheMode::kAlign, .seed = 5},
      {.fuse = false});
  add({.name = "EmaAllWindowSinks", .ssm_mode = "ema", .cache = MambaCacheMode::kAll, .window = 1024, .sinks = true,
       .seed = 7});
  add({.name = "ZeroHead256SoftCap", .ssm_mode = "zero", .num_heads = 8, .num_kv_heads = 1, .head_size = 256,
       .soft_cap = 30.0, .seed = 9});
  add({.name = "PrefixSumFlatFp8Output", .ssm_mode = "prefix_sum_flat", .output_scale = 0.5f, .seed = 11});
  add({.name = "NoSsmInt8PerTokenHeadFp16", .dtype = DType::kFloat16, .kv = KvCacheDtype::kInt8PerTokenHead,
       .k_scale = 0.5f, .v_scale = 0.25f, .seed = 13});
  // engine_version: a release's rules (its SD conv pools are transposed around the mode, inside the
  // captured launches); empty: the unversioned rules.
  add({.name = "Mamba1SdConvV012", .ssm_mode = "mamba1", .ssm_params = kMamba1Big, .engine_version = "vllm 0.12.0",
       .seed = 15});
  add({.name = "Mamba2SdConvV012", .ssm_mode = "mamba2", .engine_version = "vllm 0.12.0", .seed = 17});
  add({.name = "GdnSdConvV012Fp16", .ssm_mode = "gdn", .dtype = DType::kFloat16, .engine_version = "vllm 0.12.0",
       .seed = 19});
  return all;
}

class CudaGraphTest : public CudaParamFixture<GraphCase> {};

TEST_P(CudaGraphTest, ReplayEqualsEager) {
  const GraphCase& c = GetParam();
  const std::vector<BatchFile> batches = make_batches(c.batch);
  const BatchFile& a = batches.front();
  auto graph_backend = create_backend("cuda", {a.config, a.builder});
  LayerBuffers tensors(*graph_backend, a);
  const StepTensors views = tensors.views();
  const std::unique_ptr<StepGraph> graph = graph_backend->capture_decode_step(
      graph_backend->build_metadata(a.batch), a.batch, views, tensors.outputs());
  graph_backend->synchronize();
  SCOPED_TRACE(graph->describe());
  {
    // Capturing ran nothing.
    const StepOutputs after_capture = tensors.download_all(*graph_backend, {});
    EXPECT_TRUE(bitwise_equal(after_capture.kv_cache, a.inputs.kv_cache)) << "capture wrote the KV cache";
    for (const auto& [name, pool] : a.inputs.ssm_state) {
      EXPECT_TRUE(bitwise_equal(after_capture.ssm_state.at(name), pool)) << "capture wrote state pool " << name;
    }
    const int64_t numel = after_capture.output.numel();
    int64_t written = 0;
    for (int64_t i = 0; i < numel; ++i) {
      written += std::isnan(load_as_double(after_capture.output.data(), after_capture.output.dtype(), i)) ? 0 : 1;
    }
    EXPECT_EQ(written, 0) << "capture wrote the output";
  }
  auto reference = create_backend("reference", {a.config, a.builder});
  // A, B, C, then A again (a replay after others reads only the newly uploaded metadata).
  for (size_t k : {0, 1, 2, 0}) {
    const BatchFile& step = batches[k];
    SCOPED_TRACE("batch " + std::string(1, static_cast<char>('A' + k)));
    ASSERT_EQ(tensors.device.kv_cache.shape(), step.inputs.kv_cache.shape())
        << "the batches must share the KV cache shape";
    load_step(*graph_backend, tensors, step);
    const HybridMetadata metadata = graph_backend->build_metadata(step.batch);
    graph->replay(metadata, step.batch);
    graph_backend->synchronize();
    const StepOutputs replayed = tensors.download_all(*graph_backend, metadata);

    auto eager_backend = create_backend("cuda", {step.config, step.builder, c.expect.fuse});
    const StepOutputs eager = run_step(*eager_backend, step);
    EXPECT_TRUE(same_bits(replayed, eager));
    EXPECT_TRUE(outputs_padding_untouched(replayed, step));
    const StepOutputs expected = run_step(*reference, step);
    const ComparisonReport report = compare_step(step, replayed, expected, {});
    EXPECT_TRUE(report.passed()) << format_report_table({report});
    for (const QuantityReport& q : report.quantities) {
      EXPECT_EQ(q.padding_written, 0) << q.name << ": padding rows written";
      EXPECT_EQ(q.untouched_written, 0) << q.name << ": a slot no request names was written";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGraphTest, ::testing::ValuesIn(cases()), CaseName());

class CudaGraphRefusalTest : public CudaFixture<> {};

// The message of the Error/NotSupported `f` throws ("" if it throws nothing).
template <typename Exception, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.what();
  }
  return "";
}

TEST_F(CudaGraphRefusalTest, RefusesOtherShapesAndRunsNothing) {
  const CudaCase c{.name = "refusals", .ssm_mode = "prefix_sum"};
  const std::vector<BatchFile> batches = make_batches(c);
  const BatchFile& a = batches.front();
  auto backend = create_backend("cuda", {a.config, a.builder});
  LayerBuffers tensors(*backend, a);
  const StepTensors views = tensors.views();
  const auto graph = backend->capture_decode_step(backend->build_metadata(a.batch), a.batch, views, tensors.outputs());

  // Another padded size (4 requests, 4 rows).
  const BatchFile small = make_batch(c, {{{10, 1}, {20, 1}}, 2}, 21, 3, 64);
  std::string why = message_of<Error>([&] { graph->replay(backend->build_metadata(small.batch), small.batch); });
  EXPECT_NE(why.find("token rows"), std::string::npos) << why;
  // A block table wider than the captured one (a longer context than A's longest).
  const BatchFile wide = make_batch(c, {{{20000, 1}}, 7}, 22, 3 + a.inputs.kv_cache.size(0), 64);
  why = message_of<Error>([&] { graph->replay(backend->build_metadata(wide.batch), wide.batch); });
  EXPECT_NE(why.find("block_table"), std::string::npos) << why;
  backend->synchronize();
  const StepOutputs after = tensors.download_all(*backend, {});
  EXPECT_TRUE(bitwise_equal(after.kv_cache, a.inputs.kv_cache)) << "a refused replay wrote the KV cache";
  int64_t written = 0;
  for (int64_t i = 0; i < after.output.numel(); ++i) {
    written += std::isnan(load_as_double(after.output.data(), after.output.dtype(), i)) ? 0 : 1;
  }
  EXPECT_EQ(written, 0) << "a refused replay wrote the output";

  // A step with a prefill chunk cannot be captured.
  const BatchFile mixed = make_batch(c, {{{10, 1}, {5, 7}}, 0}, 23, 3, 64);
  auto backend2 = create_backend("cuda", {mixed.config, mixed.builder});
  LayerBuffers tensors2(*backend2, mixed);
  const StepTensors views2 = tensors2.views();
  why = message_of<NotSupported>([&] {
    backend2->capture_decode_step(backend2->build_metadata(mixed.batch), mixed.batch, views2, tensors2.outputs());
  });
  EXPECT_NE(why.find("prefill"), std::string::npos) << why;

  // The reference has no graphs.
  auto reference = create_backend("reference", {a.config, a.builder});
  const BatchInputs host = a.inputs;
  why = message_of<NotSupported>(
      [&] { reference->capture_decode_step(reference->build_metadata(a.batch), a.batch, host.views(), {}); });
  EXPECT_NE(why.find("does not capture CUDA graphs"), std::string::npos) << why;
}

}  // namespace
}  // namespace hybridtb::testing
