// Round trips of hybrid-batch files through write_batch_file/read_batch_file: every tensor dtype
// bit for bit (signed zeros, subnormals, infinities, NaN payloads), every config and builder field,
// optional items, provenance, /outputs and /expected with their metadata, the SSM branch of 1.1
// (/config/ssm, /inputs/ssm, /weights, ssm_output, the pools after the step), plus the on-disk
// layout the schema promises (datasets/SCHEMA.md). Run: ctest -L io.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "hybridtb/batch_file.h"
#include "hybridtb/synthetic.h"
#include "io_fixtures.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;

BatchFile round_trip(const BatchFile& file, const std::string& name = "batch.h5") {
  const std::filesystem::path path = scratch_dir() / name;
  write_batch_file(path.string(), file);
  return read_batch_file(path.string());
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(BatchFileRoundTrip, EveryFieldOfABfloat16File) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 10);
  file.expected = sample_outputs(file, DType::kBFloat16, "triton", 20);
  const BatchFile back = round_trip(file);
  expect_same_batch_file(file, back);
}

TEST(BatchFileRoundTrip, Bfloat16SpecialValuesKeepTheirBits) {
  const BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  const BatchFile back = round_trip(file);
  const std::vector<uint16_t> specials = bfloat16_specials();
  ASSERT_EQ(back.inputs.query.dtype(), DType::kBFloat16);
  const auto* bits = back.inputs.query.data_as<uint16_t>();
  for (size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(bits[i], specials[i]) << "element " << i;
}

TEST(BatchFileRoundTrip, Float16AndFloat32Inputs) {
  for (const DType dtype : {DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    BatchFile file = small_batch_file(full_config(dtype, KvCacheDtype::kAuto));
    file.outputs = sample_outputs(file, dtype, "cuda", 30);
    expect_same_batch_file(file, round_trip(file));
  }
}

// fp8 and int8 caches: all 256 byte values come back unchanged, and the per-token-head scale caches too.
TEST(BatchFileRoundTrip, QuantizedKvCaches) {
  for (const KvCacheDtype kv : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2, KvCacheDtype::kInt8PerTokenHead,
                                KvCacheDtype::kFp8PerTokenHead}) {
    SCOPED_TRACE(std::string(to_string(kv)));
    BatchFile file = small_batch_file(full_config(DType::kBFloat16, kv));
    file.outputs = sample_outputs(file, DType::kFloat32, "reference", 40);
    const BatchFile back = round_trip(file);
    expect_same_batch_file(file, back);
    ASSERT_EQ(back.inputs.kv_cache.dtype(), kv_storage_dtype(kv, DType::kBFloat16));
    const auto* bytes = back.inputs.kv_cache.data_as<uint8_t>();
    for (int i = 0; i < 256; ++i) ASSERT_EQ(bytes[i], i);
  }
}

// Outputs keep the producer's dtype, whatever it is (float64 for the reference).
TEST(BatchFileRoundTrip, OutputTensorsOfEveryDtype) {
  const BatchFile base = small_batch_file(full_config(DType::kFloat32, KvCacheDtype::kAuto));
  for (const DType dtype : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                            DType::kFloat8E5M2, DType::kInt8, DType::kInt32, DType::kInt64, DType::kBool}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    BatchFile file = base;
    file.outputs = sample_outputs(file, dtype, "any", 50);
    const BatchFile back = round_trip(file);
    ASSERT_TRUE(back.outputs.has_value());
    EXPECT_EQ(back.outputs->output.dtype(), dtype);
    expect_same_tensor(file.outputs->output, back.outputs->output, "/outputs/output");
    expect_same_tensor(file.outputs->attn_output, back.outputs->attn_output, "/outputs/attn_output");
  }
}

TEST(BatchFileRoundTrip, Float64SpecialValuesKeepTheirBits) {
  BatchFile file = small_batch_file(full_config(DType::kFloat32, KvCacheDtype::kAuto));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 60);
  const BatchFile back = round_trip(file);
  const std::vector<uint64_t> specials = float64_specials();
  const auto* bits = back.outputs->output.data_as<uint64_t>();
  for (size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(bits[i], specials[i]) << "element " << i;
}

TEST(BatchFileRoundTrip, EveryEnumValueOfTheConfig) {
  for (const CudaGraphMode mode : {CudaGraphMode::kNone, CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
                                   CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    for (const MambaCacheMode mamba : {MambaCacheMode::kNone, MambaCacheMode::kAll, MambaCacheMode::kAlign}) {
      BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto), false);
      file.builder.cudagraph_mode = mode;
      file.config.mamba_cache_mode = mamba;
      file.config.use_alibi_sqrt = mamba == MambaCacheMode::kAll;
      const BatchFile back = round_trip(file);
      EXPECT_EQ(back.builder.cudagraph_mode, mode);
      EXPECT_EQ(back.config.mamba_cache_mode, mamba);
      EXPECT_EQ(back.config.use_alibi_sqrt, file.config.use_alibi_sqrt);
    }
  }
}

TEST(BatchFileRoundTrip, DefaultBuilderAndAbsentOptionals) {
  AttentionConfig config = full_config(DType::kBFloat16, KvCacheDtype::kAuto);
  config.alibi_slopes.reset();
  config.sinks.reset();
  BatchFile file = small_batch_file(config, false);
  file.builder = BuilderConfig{};
  const BatchFile back = round_trip(file);
  expect_same_batch_file(file, back);
  EXPECT_FALSE(back.config.alibi_slopes.has_value());
  EXPECT_FALSE(back.config.sinks.has_value());
  EXPECT_FALSE(back.batch.mm_prefix_range.has_value());
  EXPECT_FALSE(back.batch.ssm_block_table.has_value());
  EXPECT_FALSE(back.batch.num_accepted_tokens.has_value());
  EXPECT_FALSE(back.inputs.output_scale.has_value());
  EXPECT_FALSE(back.outputs.has_value());
  EXPECT_FALSE(back.expected.has_value());
  EXPECT_TRUE(back.builder.cudagraph_capture_sizes.empty());
  EXPECT_EQ(back.builder.max_num_seqs, 256);
}

TEST(BatchFileRoundTrip, OptionalBatchItemsAndProvenance) {
  const BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto), true);
  const BatchFile back = round_trip(file);
  ASSERT_TRUE(back.batch.mm_prefix_range.has_value());
  EXPECT_EQ(back.batch.mm_prefix_range->shape, (std::vector<int64_t>{4, 2, 2}));
  ASSERT_TRUE(back.inputs.output_scale.has_value());
  EXPECT_EQ(*back.inputs.output_scale, 0.0625f);
  EXPECT_EQ(back.provenance.at("notes"), "ünïcödé ✓");
  EXPECT_EQ(back.provenance.size(), 3u);
}

// Metadata with optional fields left out (no prefill: no causal_conv1d, no *_p arrays).
TEST(BatchFileRoundTrip, SparseMetadata) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 70);
  HybridMetadata& m = file.outputs->metadata;
  m = HybridMetadata{};
  m.attention.use_3d_path = 1;
  m.mamba.emplace().num_decodes = 3;
  m.mamba->state_indices_tensor_d = IntArray({3, 1}, {4, 5, -1});
  m.mamba->num_accepted_tokens = IntArray::vector({});  // shape [0], distinct from the shapeless seq_lens
  const BatchFile back = round_trip(file);
  ASSERT_TRUE(back.outputs.has_value());
  EXPECT_TRUE(back.outputs->metadata == m) << metadata_differences(back.outputs->metadata, m).front();
  EXPECT_FALSE(back.outputs->metadata.mamba->causal_conv1d.has_value());
  EXPECT_FALSE(back.outputs->metadata.mamba->query_start_loc_p.has_value());
  EXPECT_TRUE(back.outputs->metadata.mamba->seq_lens.shape.empty());
  EXPECT_EQ(back.outputs->metadata.mamba->num_accepted_tokens->shape, std::vector<int64_t>{0});
}

TEST(BatchFileRoundTrip, EncoderOnlyWithoutKvCache) {
  AttentionConfig config = full_config(DType::kFloat16, KvCacheDtype::kAuto, AttnType::kEncoderOnly);
  config.ssm_mode = "none";  // encoder-only layers have no SSM branch
  BatchFile file = small_batch_file(config);
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 80);
  const BatchFile back = round_trip(file);
  expect_same_batch_file(file, back);
  EXPECT_TRUE(back.inputs.kv_cache.empty());
  EXPECT_EQ(back.batch.block_table.shape, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(back.config.attn_type, AttnType::kEncoderOnly);
}

// A step with no requests and no tokens (zero-sized datasets everywhere but the cache).
TEST(BatchFileRoundTrip, EmptyBatch) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto), false);
  BatchDescription& b = file.batch;
  b.query_start_loc = IntArray::vector({0});
  b.seq_lens = IntArray::vector({});
  b.block_table = IntArray::matrix(0, 3);
  b.slot_mapping.clear();
  b.num_actual_tokens = 0;
  file.inputs.query = Tensor::host(DType::kBFloat16, {0, 4, 32});
  file.inputs.key = Tensor::host(DType::kBFloat16, {0, 2, 32});
  file.inputs.value = Tensor::host(DType::kBFloat16, {0, 2, 32});
  const BatchFile back = round_trip(file);
  expect_same_batch_file(file, back);
  EXPECT_EQ(back.batch.num_reqs(), 0);
  EXPECT_EQ(back.inputs.query.shape(), (Shape{0, 4, 32}));
}

TEST(BatchFileRoundTrip, SyntheticBatches) {
  const std::vector<RequestSpec> requests{{40, 1, {}}, {0, 17, {}}, {33, 5, {{2, 9}}}};
  for (const KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFp8E4M3, KvCacheDtype::kInt8PerTokenHead}) {
    SCOPED_TRACE(std::string(to_string(kv)));
    AttentionConfig config = full_config(DType::kBFloat16, kv);
    config.sliding_window = 16;
    SyntheticOptions options;
    options.seed = 7;
    options.padding_tokens = 3;
    options.padding_requests = 1;
    const BatchFile file = make_synthetic_batch(config, full_builder(), requests, options);
    expect_same_batch_file(file, round_trip(file));
  }
}

// A progress sink's view of one transfer: (stage, done, total) per call.
struct RecordingSink final : ProgressSink {
  std::vector<std::tuple<std::string, int64_t, int64_t>> calls;
  void report(const std::string& stage, int64_t done, int64_t total, double) override {
    calls.emplace_back(stage, done, total);
  }
};

// One stage named `stage`, MiB counts from 0 that never go down to done == total, and at least
// `min_intermediate` distinct counts in between (a sliced transfer reports along the way).
void expect_one_transfer(const RecordingSink& sink, const std::string& stage, int64_t min_total_mib,
                         size_t min_intermediate) {
  ASSERT_FALSE(sink.calls.empty());
  std::set<int64_t> intermediate;
  int64_t previous = -1;
  const int64_t total = std::get<2>(sink.calls.front());
  EXPECT_GE(total, min_total_mib);
  for (const auto& [name, done, call_total] : sink.calls) {
    EXPECT_EQ(name, stage);
    EXPECT_EQ(call_total, total);
    EXPECT_GE(done, previous);
    previous = done;
    if (done > 0 && done < total) intermediate.insert(done);
  }
  EXPECT_EQ(std::get<1>(sink.calls.front()), 0);
  EXPECT_EQ(std::get<1>(sink.calls.back()), total);
  EXPECT_GE(intermediate.size(), min_intermediate);
}

// With a progress sink, tensors above 64 MiB move in slices of rows; the file is byte for byte
// the one written in one piece, and the slices read back are the tensors written.
TEST(BatchFileRoundTrip, SlicedTransfersWithProgressGiveTheSameBytes) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  const Shape shape = file.inputs.kv_cache.shape();  // [NB, 2, BS, Hkv, D]
  const int64_t block_bytes = shape[1] * shape[2] * shape[3] * shape[4] * 2;
  Shape big_shape = shape;
  big_shape[0] = std::max<int64_t>(shape[0], (int64_t{150} << 20) / block_bytes);
  Tensor big = Tensor::host(DType::kBFloat16, big_shape);
  auto* bits = big.data_as<uint16_t>();
  for (int64_t i = 0; i < big.numel(); ++i) bits[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u) % 0x0400);
  file.inputs.kv_cache = std::move(big);

  const std::filesystem::path dir = scratch_dir();
  write_batch_file((dir / "whole.h5").string(), file);
  RecordingSink writing;
  const std::string sliced = (dir / "sliced.h5").string();
  write_batch_file(sliced, file, FileProgress{&writing});
  EXPECT_EQ(file_bytes(dir / "whole.h5"), file_bytes(sliced));
  expect_one_transfer(writing, "writing " + sliced, 150, 2);

  RecordingSink reading;
  expect_same_batch_file(file, read_batch_file(sliced, FileProgress{&reading}));
  expect_one_transfer(reading, "reading " + sliced, 150, 2);
}

// Object timestamps are off, so writing what was read gives the same bytes.
TEST(BatchFileRoundTrip, RewriteIsByteIdentical) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kFp8PerTokenHead));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 90);
  file.expected = sample_outputs(file, DType::kFloat32, "cuda", 91);
  const std::filesystem::path dir = scratch_dir();
  write_batch_file((dir / "first.h5").string(), file);
  write_batch_file((dir / "second.h5").string(), read_batch_file((dir / "first.h5").string()));
  EXPECT_EQ(file_bytes(dir / "first.h5"), file_bytes(dir / "second.h5"));
  EXPECT_THAT(directory_listing(dir), ::testing::ElementsAre("first.h5", "second.h5"));  // no temp files left
}

TEST(BatchFileRoundTrip, OverwritesAnExistingFile) {
  const std::filesystem::path path = scratch_dir() / "batch.h5";
  BatchFile first = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  write_batch_file(path.string(), first);
  BatchFile second = small_batch_file(full_config(DType::kFloat32, KvCacheDtype::kAuto));
  write_batch_file(path.string(), second);
  EXPECT_EQ(read_batch_file(path.string()).config.dtype, DType::kFloat32);
}

// Every HDF5 identifier is closed again, after successful and failed reads and writes alike.
TEST(BatchFileRoundTrip, NoHdf5HandlesLeak) {
  const std::filesystem::path dir = scratch_dir();
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 1);
  write_batch_file((dir / "good.h5").string(), file);
  read_batch_file((dir / "good.h5").string());
  list_file_entries((dir / "good.h5").string());
  std::filesystem::copy_file(dir / "good.h5", dir / "bad.h5");
  edit_file(dir / "bad.h5", [](const h5::Group& root) { group_at(root, "/inputs").remove_child("key"); });
  EXPECT_THAT(error_of([&] { read_batch_file((dir / "bad.h5").string()); }), HasSubstr("/inputs/key"));
  file.outputs->output = Tensor();
  EXPECT_THAT(error_of([&] { write_batch_file((dir / "failed.h5").string(), file); }), HasSubstr("/outputs/output"));
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

// --- the SSM branch (schema 1.1) ---------------------------------------------------------------

// A file without 1.3 items is written as 1.2 (byte for byte what a 1.2 build wrote); one with an
// engine version as the newest version, the header constant.
TEST(BatchFileRoundTripSsm, SchemaVersionWrittenIsTheOldestThatDescribesTheFile) {
  const BatchFile back = round_trip(small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto)));
  EXPECT_EQ(back.schema_version, kWrittenSchemaVersion);
  EXPECT_EQ(back.config.engine_version, "");
  BatchFile versioned = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  versioned.config.engine_version = "vllm 0.33.0";  // full_config uses mamba_cache_mode align
  const BatchFile back_versioned = round_trip(versioned);
  EXPECT_EQ(back_versioned.schema_version, "1.3");
  EXPECT_EQ(back_versioned.config.engine_version, "vllm 0.33.0");
  // A tensor-parallel rank file (attention only: no ssm_hidden) is the one 1.4 item.
  BatchFile rank = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  rank.config.ssm_mode = "none";
  rank.config.ssm_params.clear();
  rank.config.tp_size = 4;
  rank.config.tp_rank = 3;
  const BatchFile back_rank = round_trip(rank);
  EXPECT_EQ(back_rank.schema_version, "1.4");
  EXPECT_EQ(std::to_string(kSchemaMajor) + "." + std::to_string(kSchemaMinor), "1.4");
  EXPECT_EQ(back_rank.config.tp_size, 4);
  EXPECT_EQ(back_rank.config.tp_rank, 3);
}

// Params, pools, weights, ssm_output and the pools after the step, in every float dtype, bit for
// bit (signed zeros, subnormals, infinities, NaN payloads), under /outputs and /expected alike.
TEST(BatchFileRoundTripSsm, EveryFloatDtype) {
  for (const DType dtype : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
    add_ssm_inputs(file, dtype, 200);
    file.outputs = sample_outputs(file, dtype, "reference", 210);
    add_ssm_outputs(*file.outputs, file, dtype, 220);
    file.expected = sample_outputs(file, dtype, "cuda", 230);
    add_ssm_outputs(*file.expected, file, dtype, 240);
    const BatchFile back = round_trip(file);
    expect_same_batch_file(file, back);
    EXPECT_EQ(back.config.ssm_mode, "mamba1");
    EXPECT_EQ(back.config.ssm_params, (std::map<std::string, int64_t>{
                                          {"conv_kernel", 4}, {"dt_rank", 2}, {"intermediate_size", 8}, {"state_size", 4}}));
    ASSERT_EQ(back.inputs.ssm_state.size(), 2u);
    EXPECT_EQ(back.inputs.ssm_state.at("conv_state").shape(), (Shape{kSsmSlots, 8, 3}));
    EXPECT_EQ(back.inputs.ssm_state.at("ssm_state").dtype(), dtype);
    EXPECT_EQ(back.inputs.weights.size(), 12u);
    EXPECT_EQ(back.inputs.weights.at("extra_rank3").shape(), (Shape{2, 3, 5}));
    EXPECT_EQ(back.inputs.weights.at("D").shape(), Shape{8});
    ASSERT_TRUE(back.expected.has_value());
    EXPECT_EQ(back.expected->ssm_output.dtype(), dtype);
    EXPECT_EQ(back.expected->ssm_state.at("ssm_state").shape(), (Shape{kSsmSlots, 8, 4}));
  }
}

TEST(BatchFileRoundTripSsm, Bfloat16PoolsAndWeightsKeepTheirBits) {
  BatchFile file = small_batch_file(full_config(DType::kFloat32, KvCacheDtype::kAuto));
  add_ssm_inputs(file, DType::kBFloat16, 250);
  file.outputs = sample_outputs(file, DType::kFloat32, "cuda", 260);
  add_ssm_outputs(*file.outputs, file, DType::kBFloat16, 270);
  const BatchFile back = round_trip(file);
  const std::vector<uint16_t> specials = bfloat16_specials();
  for (const Tensor* tensor : {&back.inputs.ssm_state.at("conv_state"), &back.inputs.weights.at("in_proj_bias"),
                               &back.outputs->ssm_output, &back.outputs->ssm_state.at("ssm_state")}) {
    ASSERT_EQ(tensor->dtype(), DType::kBFloat16);
    ASSERT_GE(tensor->numel(), static_cast<int64_t>(specials.size()));
    const auto* bits = tensor->data_as<uint16_t>();
    for (size_t i = 0; i < specials.size(); ++i) EXPECT_EQ(bits[i], specials[i]) << "element " << i;
  }
}

// Each pool and weight keeps its own dtype; results may differ from the inputs' dtype (the
// reference writes float64), and ssm_output may be any float type, fp8 included (fp8 output).
TEST(BatchFileRoundTripSsm, MixedDtypes) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kFp8E4M3));
  add_ssm_inputs(file, DType::kFloat32, 300);
  file.inputs.ssm_state["conv_state"] = patterned_tensor(DType::kBFloat16, {kSsmSlots, 8, 3}, 301);
  file.inputs.weights["in_proj"] = patterned_tensor(DType::kFloat16, {16, 128}, 302);
  file.inputs.weights["A_log"] = patterned_tensor(DType::kFloat64, {8, 4}, 303);
  file.outputs = sample_outputs(file, DType::kFloat8E4M3, "cuda", 310);
  add_ssm_outputs(*file.outputs, file, DType::kFloat64, 320);
  file.outputs->ssm_output = patterned_tensor(DType::kFloat8E4M3, {kSmallTokens, 4, 32}, 321);
  const BatchFile back = round_trip(file);
  expect_same_batch_file(file, back);
  EXPECT_EQ(back.inputs.ssm_state.at("conv_state").dtype(), DType::kBFloat16);
  EXPECT_EQ(back.inputs.ssm_state.at("ssm_state").dtype(), DType::kFloat32);
  EXPECT_EQ(back.inputs.weights.at("in_proj").dtype(), DType::kFloat16);
  EXPECT_EQ(back.inputs.weights.at("A_log").dtype(), DType::kFloat64);
  EXPECT_EQ(back.outputs->ssm_output.dtype(), DType::kFloat8E4M3);
  EXPECT_EQ(back.outputs->ssm_state.at("conv_state").dtype(), DType::kFloat64);
}

// Every SSM item is optional on its own: params without tensors, pools without weights, results
// without the pools after the step, pools of zero slots, and none at all.
TEST(BatchFileRoundTripSsm, EachItemIsOptional) {
  const BatchFile base = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  {
    SCOPED_TRACE("params only");
    BatchFile file = base;
    file.config.ssm_params = {{"width", 3}, {"negative_is_fine_here", -7}, {"big", int64_t{1} << 30}};
    expect_same_batch_file(file, round_trip(file));
  }
  {
    SCOPED_TRACE("pools only, with zero slots");
    BatchFile file = base;
    file.config.ssm_mode = "prefix_sum";
    file.inputs.ssm_state["state"] = Tensor::host(DType::kFloat32, {0, 4, 32});
    file.outputs = sample_outputs(file, DType::kFloat64, "reference", 330);
    file.outputs->ssm_state["state"] = Tensor::host(DType::kFloat64, {0, 4, 32});
    const BatchFile back = round_trip(file);
    expect_same_batch_file(file, back);
    EXPECT_EQ(back.inputs.ssm_state.at("state").shape(), (Shape{0, 4, 32}));
    EXPECT_TRUE(back.inputs.weights.empty());
    EXPECT_TRUE(back.config.ssm_params.empty());
  }
  {
    SCOPED_TRACE("weights only");
    BatchFile file = base;
    file.config.ssm_mode = "ema";
    file.inputs.weights["a"] = patterned_tensor(DType::kFloat32, {128}, 331);
    expect_same_batch_file(file, round_trip(file));
  }
  {
    SCOPED_TRACE("ssm_output without pools, pools after the step without ssm_output");
    BatchFile file = base;
    add_ssm_inputs(file, DType::kFloat32, 332);
    file.outputs = sample_outputs(file, DType::kFloat64, "reference", 333);
    file.outputs->ssm_output = patterned_tensor(DType::kFloat64, {kSmallTokens, 4, 32}, 334);
    file.expected = sample_outputs(file, DType::kFloat32, "cuda", 335);
    add_ssm_outputs(*file.expected, file, DType::kFloat32, 336);
    file.expected->ssm_output = Tensor();
    const BatchFile back = round_trip(file);
    expect_same_batch_file(file, back);
    EXPECT_TRUE(back.outputs->ssm_state.empty());
    EXPECT_TRUE(back.expected->ssm_output.empty());
  }
  {
    SCOPED_TRACE("pools after the step without pools before (nothing to compare them with)");
    BatchFile file = base;
    file.outputs = sample_outputs(file, DType::kFloat64, "reference", 337);
    file.outputs->ssm_state["state"] = patterned_tensor(DType::kFloat64, {3, 128}, 338);
    expect_same_batch_file(file, round_trip(file));
  }
  {
    SCOPED_TRACE("none");
    const BatchFile back = round_trip(base);
    EXPECT_TRUE(back.config.ssm_params.empty());
    EXPECT_TRUE(back.inputs.ssm_state.empty());
    EXPECT_TRUE(back.inputs.weights.empty());
  }
}

TEST(BatchFileRoundTripSsm, RewriteIsByteIdentical) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(file, DType::kBFloat16, 340);
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 341);
  add_ssm_outputs(*file.outputs, file, DType::kFloat64, 342);
  file.expected = sample_outputs(file, DType::kBFloat16, "cuda", 343);
  add_ssm_outputs(*file.expected, file, DType::kBFloat16, 344);
  const std::filesystem::path dir = scratch_dir();
  write_batch_file((dir / "first.h5").string(), file);
  write_batch_file((dir / "second.h5").string(), read_batch_file((dir / "first.h5").string()));
  EXPECT_EQ(file_bytes(dir / "first.h5"), file_bytes(dir / "second.h5"));
}

// --- the layout on disk ------------------------------------------------------------------------

std::string attribute_type_of(const h5::Object& object, const std::string& name) {
  const hid_t attribute = H5Aopen(object.id(), name.c_str(), H5P_DEFAULT);
  const hid_t type = H5Aget_type(attribute);
  std::string described = h5::describe_type(type);
  if (H5Tget_class(type) == H5T_STRING) described += H5Tget_cset(type) == H5T_CSET_UTF8 ? " utf8" : " ascii";
  H5Tclose(type);
  H5Aclose(attribute);
  return described;
}

TEST(BatchFileLayout, CanonicalTypesAndPaths) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kInt8PerTokenHead));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 100);
  file.expected = sample_outputs(file, DType::kFloat32, "cuda", 101);
  const std::filesystem::path path = scratch_dir() / "batch.h5";
  write_batch_file(path.string(), file);

  const h5::ErrorSilencer silence;
  const h5::File h5file = h5::File::open_read_only(path.string());
  const h5::Group root = h5file.root();
  EXPECT_EQ(root.read_string_attribute("schema"), "hybrid-batch");
  EXPECT_EQ(root.read_string_attribute("schema_version"), kWrittenSchemaVersion);
  EXPECT_EQ(root.read_string_attribute("backend"), "reference");
  EXPECT_EQ(attribute_type_of(root, "schema"), "string utf8");
  const h5::Group config = group_at(root, "/config");
  EXPECT_EQ(attribute_type_of(config, "num_heads"), "int64");
  EXPECT_EQ(attribute_type_of(config, "use_alibi_sqrt"), "int64");
  EXPECT_EQ(attribute_type_of(config, "scale"), "float64");
  EXPECT_EQ(attribute_type_of(config, "logits_soft_cap"), "float64");
  EXPECT_EQ(attribute_type_of(config, "dtype"), "string utf8");
  EXPECT_EQ(config.read_string_attribute("kv_cache_dtype"), "int8_per_token_head");
  EXPECT_EQ(config.read_string_attribute("cudagraph_mode"), "full_and_piecewise");
  EXPECT_EQ(attribute_type_of(group_at(root, "/batch"), "num_actual_tokens"), "int64");
  EXPECT_EQ(group_at(root, "/expected").read_string_attribute("backend"), "cuda");

  // bf16 is the 2-byte custom float, scalars are 0-d float32, metadata scalars are int64 attributes.
  EXPECT_EQ(h5::describe_type(group_at(root, "/inputs").open_dataset("query").file_type().id()), "bfloat16");
  EXPECT_EQ(group_at(root, "/inputs").open_dataset("k_scale").shape(), Shape{});
  EXPECT_EQ(attribute_type_of(group_at(root, "/outputs/metadata/attention"), "use_3d_path"), "int64");
  EXPECT_EQ(group_at(root, "/outputs/metadata/attention").read_int_attribute("use_3d_path"), 1);
  EXPECT_EQ(group_at(root, "/outputs/metadata/mamba/causal_conv1d").read_int_attribute("tot"), 2);

  // Every dataset carries a dtype_name that matches its storage.
  const std::map<std::string, std::string> expected_types{
      {"float64", "float64"}, {"float32", "float32"}, {"bfloat16", "bfloat16"}, {"int8", "int8"},
      {"int32", "int32"},     {"int64", "int64"}};
  int datasets = 0;
  for (const FileEntry& entry : list_file_entries(path.string())) {
    if (entry.kind != "dataset") continue;
    ++datasets;
    SCOPED_TRACE(entry.path);
    const size_t slash = entry.path.rfind('/');
    const h5::Dataset dataset = group_at(root, entry.path.substr(0, slash)).open_dataset(entry.path.substr(slash + 1));
    ASSERT_TRUE(dataset.has_attribute("dtype_name"));
    const std::string name = dataset.read_string_attribute("dtype_name");
    EXPECT_EQ(name, entry.dtype_name);
    ASSERT_EQ(expected_types.count(name), 1u) << name;
    EXPECT_EQ(h5::describe_type(dataset.file_type().id()), expected_types.at(name));
  }
  EXPECT_GT(datasets, 30);
}

TEST(BatchFileLayout, SsmItems) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(file, DType::kBFloat16, 400);
  file.inputs.weights["D"] = patterned_tensor(DType::kFloat32, {8}, 401);
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 402);
  add_ssm_outputs(*file.outputs, file, DType::kFloat64, 403);
  file.expected = sample_outputs(file, DType::kFloat16, "cuda", 404);
  add_ssm_outputs(*file.expected, file, DType::kFloat16, 405);
  const std::filesystem::path path = scratch_dir() / "batch.h5";
  write_batch_file(path.string(), file);

  std::map<std::string, FileEntry> by_path;
  for (const FileEntry& entry : list_file_entries(path.string())) by_path[entry.path] = entry;
  EXPECT_EQ(by_path.at("/config/ssm").kind, "group");
  EXPECT_EQ(by_path.at("/inputs/ssm").kind, "group");
  EXPECT_EQ(by_path.at("/weights").kind, "group");
  EXPECT_EQ(by_path.at("/inputs/ssm/conv_state").dtype_name, "bfloat16");
  EXPECT_EQ(by_path.at("/inputs/ssm/conv_state").shape, (Shape{kSsmSlots, 8, 3}));
  EXPECT_EQ(by_path.at("/weights/in_proj").shape, (Shape{16, 128}));
  EXPECT_EQ(by_path.at("/weights/D").dtype_name, "float32");
  EXPECT_EQ(by_path.at("/outputs/ssm_output").dtype_name, "float64");
  EXPECT_EQ(by_path.at("/outputs/ssm_output").shape, (Shape{kSmallTokens, 4, 32}));
  EXPECT_EQ(by_path.at("/outputs/ssm/ssm_state").shape, (Shape{kSsmSlots, 8, 4}));
  EXPECT_EQ(by_path.at("/expected/ssm/ssm_state").dtype_name, "float16");
  EXPECT_EQ(by_path.at("/expected/ssm_output").dtype_name, "float16");

  const h5::ErrorSilencer silence;
  const h5::File h5file = h5::File::open_read_only(path.string());
  const h5::Group root = h5file.root();
  EXPECT_EQ(root.read_string_attribute("schema_version"), kWrittenSchemaVersion);
  const h5::Group params = group_at(root, "/config/ssm");
  EXPECT_EQ(params.attribute_names(),
            (std::vector<std::string>{"conv_kernel", "dt_rank", "intermediate_size", "state_size"}));
  EXPECT_EQ(attribute_type_of(params, "state_size"), "int64");
  EXPECT_EQ(params.read_int_attribute("intermediate_size"), 8);
  EXPECT_EQ(h5::describe_type(group_at(root, "/inputs/ssm").open_dataset("ssm_state").file_type().id()), "bfloat16");
  EXPECT_EQ(h5::describe_type(group_at(root, "/expected/ssm").open_dataset("conv_state").file_type().id()), "float16");
  EXPECT_TRUE(group_at(root, "/inputs/ssm").attribute_names().empty());

  // Absent maps and tensors write nothing at all (a 1.1 file without SSM items is a 1.0 layout).
  const BatchFile plain = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  write_batch_file(path.string(), plain);
  std::vector<std::string> paths;
  for (const FileEntry& entry : list_file_entries(path.string())) paths.push_back(entry.path);
  for (const char* absent : {"/config/ssm", "/inputs/ssm", "/weights", "/outputs"}) {
    EXPECT_THAT(paths, ::testing::Not(::testing::Contains(std::string(absent))));
  }
}

TEST(BatchFileLayout, ListFileEntries) {
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kFp8E5M2));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 110);
  const std::filesystem::path path = scratch_dir() / "batch.h5";
  write_batch_file(path.string(), file);
  const std::vector<FileEntry> entries = list_file_entries(path.string());
  std::map<std::string, FileEntry> by_path;
  for (const FileEntry& entry : entries) by_path[entry.path] = entry;
  EXPECT_EQ(by_path.at("/").kind, "group");
  EXPECT_EQ(by_path.at("/outputs/metadata/mamba/causal_conv1d").kind, "group");
  EXPECT_EQ(by_path.at("/inputs/query").kind, "dataset");
  EXPECT_EQ(by_path.at("/inputs/query").dtype_name, "bfloat16");
  EXPECT_EQ(by_path.at("/inputs/query").shape, (Shape{kSmallTokens, 4, 32}));
  EXPECT_EQ(by_path.at("/inputs/kv_cache").dtype_name, "float8_e5m2");
  EXPECT_EQ(by_path.at("/outputs/output").dtype_name, "float64");
  EXPECT_EQ(by_path.at("/batch/slot_mapping").dtype_name, "int64");
  EXPECT_EQ(by_path.at("/outputs/metadata/mamba/causal_conv1d/batch_ptr").shape, Shape{2048});

  // It also lists files the reader refuses, describing the HDF5 type when dtype_name is absent.
  edit_file(path, [](const h5::Group& root) {
    root.write_string_attribute("schema", "something-else");
    group_at(root, "/inputs").open_dataset("query").remove_attribute("dtype_name");
  });
  std::map<std::string, FileEntry> edited;
  for (const FileEntry& entry : list_file_entries(path.string())) edited[entry.path] = entry;
  EXPECT_EQ(edited.at("/inputs/query").dtype_name, "bfloat16");
  EXPECT_EQ(edited.size(), by_path.size());
}

}  // namespace
}  // namespace hybridtb::testing
