// What read_batch_file accepts and refuses. Liberal cases are the ways h5py users differ from our
// canonical writer (string padding, integer widths, float attributes, 1-element scalars, uint16
// bf16 bits), and files of every 1.x version (1.0 without the SSM items of 1.1); malformed cases
// must fail with an Error naming the item. Also: write_batch_file refuses bad input and leaves
// nothing behind when it fails. Files are made by writing a valid batch and editing it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

#include "hybridtb/batch_file.h"
#include "io_fixtures.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A valid bf16 decoder batch (with /outputs) written to the test's scratch directory, which each
// call empties first: use one WrittenBatch at a time.
struct WrittenBatch {
  std::filesystem::path dir;
  std::filesystem::path path;
  BatchFile file;
};

WrittenBatch written_batch(KvCacheDtype kv = KvCacheDtype::kAuto) {
  WrittenBatch w;
  w.dir = scratch_dir();
  w.path = w.dir / "batch.h5";
  w.file = small_batch_file(full_config(DType::kBFloat16, kv));
  w.file.outputs = sample_outputs(w.file, DType::kFloat64, "reference", 7);
  write_batch_file(w.path.string(), w.file);
  return w;
}

// The same with a mamba1-shaped SSM section (tests/io/io_fixtures.h): bf16 pools and weights,
// float64 results under /outputs, bf16 results under /expected.
WrittenBatch written_ssm_batch() {
  WrittenBatch w;
  w.dir = scratch_dir();
  w.path = w.dir / "batch.h5";
  w.file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(w.file, DType::kBFloat16, 11);
  w.file.outputs = sample_outputs(w.file, DType::kFloat64, "reference", 7);
  add_ssm_outputs(*w.file.outputs, w.file, DType::kFloat64, 21);
  w.file.expected = sample_outputs(w.file, DType::kBFloat16, "cuda", 31);
  add_ssm_outputs(*w.file.expected, w.file, DType::kBFloat16, 41);
  write_batch_file(w.path.string(), w.file);
  return w;
}

// Replaces the dataset at `path` with `tensor` (raw bits, its storage type) and its dtype_name.
void replace_tensor(const h5::Group& root, const std::string& path, const Tensor& tensor) {
  const h5::Type type = h5::storage_type(tensor.dtype());
  replace_dataset(root, path, type.id(), tensor.shape(), tensor.data());
  const size_t slash = path.rfind('/');
  group_at(root, path.substr(0, slash))
      .open_dataset(path.substr(slash + 1))
      .write_string_attribute("dtype_name", std::string(to_string(tensor.dtype())));
}

std::string read_error(const std::filesystem::path& path) {
  return error_of([&] { read_batch_file(path.string()); });
}

// --- liberal reading ---------------------------------------------------------------------------

TEST(BatchFileReaderLiberal, FixedLengthStringAttributes) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    write_fixed_string_attribute(root, "schema", "hybrid-batch", false);
    write_fixed_string_attribute(root, "schema_version", "1.0", true);
    const h5::Group config = group_at(root, "/config");
    write_fixed_string_attribute(config, "dtype", "bfloat16", false);
    write_fixed_string_attribute(config, "kv_cache_dtype", "auto", true);
    write_fixed_string_attribute(group_at(root, "/inputs").open_dataset("query"), "dtype_name", "bfloat16", false);
    write_fixed_string_attribute(root, "producer", "numpy bytes", false);
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.config.dtype, DType::kBFloat16);
  EXPECT_EQ(back.provenance.at("producer"), "numpy bytes");
  expect_same_tensor(w.file.inputs.query, back.inputs.query, "/inputs/query");
}

TEST(BatchFileReaderLiberal, IntegerAttributesOfAnyWidthAndBoolEnums) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const h5::Group config = group_at(root, "/config");
    const int32_t heads = 4;
    write_typed_attribute(config, "num_heads", H5T_STD_I32LE, &heads);
    const uint16_t kv_heads = 2;
    write_typed_attribute(config, "num_kv_heads", H5T_STD_U16LE, &kv_heads);
    const int64_t head_size_be = 32;
    const h5::Type big_endian = h5::Type::copy_of(H5T_STD_I64BE);
    int64_t swapped = static_cast<int64_t>(__builtin_bswap64(static_cast<uint64_t>(head_size_be)));
    write_typed_attribute(config, "head_size", big_endian.id(), &swapped);
    const double block_size = 16.0;  // numpy arithmetic can turn counts into floats
    write_typed_attribute(config, "block_size", H5T_IEEE_F64LE, &block_size);
    // h5py stores numpy bools as an int8 enum {FALSE, TRUE}.
    const hid_t bool_type = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t value = 0;
    H5Tenum_insert(bool_type, "FALSE", &value);
    value = 1;
    H5Tenum_insert(bool_type, "TRUE", &value);
    write_typed_attribute(config, "use_alibi_sqrt", bool_type, &value);
    H5Tclose(bool_type);
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.config.num_heads, 4);
  EXPECT_EQ(back.config.num_kv_heads, 2);
  EXPECT_EQ(back.config.head_size, 32);
  EXPECT_EQ(back.config.block_size, 16);
  EXPECT_TRUE(back.config.use_alibi_sqrt);
}

TEST(BatchFileReaderLiberal, Float32AndIntegerFloatAttributes) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const h5::Group config = group_at(root, "/config");
    const float scale = 0.125f;
    write_typed_attribute(config, "scale", H5T_IEEE_F32LE, &scale);
    const int64_t cap = 0;
    write_typed_attribute(config, "logits_soft_cap", H5T_STD_I64LE, &cap);
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.config.scale, 0.125);
  EXPECT_EQ(back.config.logits_soft_cap, 0.0);
}

TEST(BatchFileReaderLiberal, ScalarsAsOneElementDatasetsAttributesOrAbsent) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const double k_scale = 0.5;  // 1-element float64 dataset, as h5py writes np.array([0.5])
    replace_dataset(root, "/inputs/k_scale", H5T_IEEE_F64LE, {1}, &k_scale);
    const h5::Group inputs = group_at(root, "/inputs");
    inputs.remove_child("v_scale");
    inputs.write_float_attribute("v_scale", 0.25);  // an attribute instead of a dataset
    inputs.remove_child("output_scale");
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.inputs.k_scale, 0.5f);
  EXPECT_EQ(back.inputs.v_scale, 0.25f);
  EXPECT_FALSE(back.inputs.output_scale.has_value());

  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs").remove_child("k_scale");
    group_at(root, "/inputs").remove_attribute("v_scale");
  });
  const BatchFile defaults = read_batch_file(w.path.string());
  EXPECT_EQ(defaults.inputs.k_scale, 1.0f);
  EXPECT_EQ(defaults.inputs.v_scale, 1.0f);
}

TEST(BatchFileReaderLiberal, IntegerBatchDatasetsOfAnyWidth) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [&](const h5::Group& root) {
    std::vector<int64_t> qsl(w.file.batch.query_start_loc.values.begin(), w.file.batch.query_start_loc.values.end());
    replace_dataset(root, "/batch/query_start_loc", H5T_STD_I64LE, {5}, qsl.data());
    std::vector<int16_t> seq_lens(w.file.batch.seq_lens.values.begin(), w.file.batch.seq_lens.values.end());
    replace_dataset(root, "/batch/seq_lens", H5T_STD_I16LE, {4}, seq_lens.data());
    std::vector<uint32_t> table(w.file.batch.block_table.values.begin(), w.file.batch.block_table.values.end());
    replace_dataset(root, "/batch/block_table", H5T_STD_U32LE, {4, 3}, table.data());
    std::vector<int32_t> slots(w.file.batch.slot_mapping.begin(), w.file.batch.slot_mapping.end());
    replace_dataset(root, "/batch/slot_mapping", H5T_STD_I32LE, {kSmallTokens}, slots.data());
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.batch.query_start_loc, w.file.batch.query_start_loc);
  EXPECT_EQ(back.batch.seq_lens, w.file.batch.seq_lens);
  EXPECT_EQ(back.batch.block_table, w.file.batch.block_table);
  EXPECT_EQ(back.batch.slot_mapping, w.file.batch.slot_mapping);
}

// Without dtype_name the HDF5 type decides (custom 2-byte floats by their mantissa width); with
// it, uint16 bit patterns are accepted as bfloat16 (the h5py-only workaround).
TEST(BatchFileReaderLiberal, TensorTypesWithAndWithoutDtypeName) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [&](const h5::Group& root) {
    group_at(root, "/inputs").open_dataset("query").remove_attribute("dtype_name");
    replace_dataset(root, "/inputs/key", H5T_STD_U16LE, w.file.inputs.key.shape(), w.file.inputs.key.data());
    group_at(root, "/inputs").open_dataset("key").write_string_attribute("dtype_name", "bfloat16");
  });
  const BatchFile back = read_batch_file(w.path.string());
  expect_same_tensor(w.file.inputs.query, back.inputs.query, "/inputs/query");
  expect_same_tensor(w.file.inputs.key, back.inputs.key, "/inputs/key");
}

TEST(BatchFileReaderLiberal, FutureMinorVersionWithUnknownItems) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    root.write_string_attribute("schema_version", "1.7");
    const int32_t extra = 5;
    replace_dataset(root, "/batch/some_future_array", H5T_STD_I32LE, {1}, &extra);
    group_at(root, "/config").write_int_attribute("some_future_setting", 3);
    root.write_int_attribute("seed", 42);
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.schema_version, "1.7");
  EXPECT_EQ(back.provenance.at("seed"), "42");
}

// Files of schema version 1.0, none of the SSM items. They read as before, with empty
// SSM maps, and keep their recorded version.
TEST(BatchFileReaderLiberal, Version10FilesWithoutSsmItems) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { root.write_string_attribute("schema_version", "1.0"); });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.schema_version, "1.0");
  EXPECT_TRUE(back.config.ssm_params.empty());
  EXPECT_TRUE(back.inputs.ssm_state.empty());
  EXPECT_TRUE(back.inputs.weights.empty());
  ASSERT_TRUE(back.outputs.has_value());
  EXPECT_TRUE(back.outputs->ssm_output.empty());
  EXPECT_TRUE(back.outputs->ssm_state.empty());
  expect_same_tensor(w.file.inputs.query, back.inputs.query, "/inputs/query");
  // Rewriting records the version this build writes.
  write_batch_file((w.dir / "rewritten.h5").string(), back);
  EXPECT_EQ(read_batch_file((w.dir / "rewritten.h5").string()).schema_version, kWrittenSchemaVersion);
}

// A reader does not look at the version to decide what to read: SSM items labelled 1.0 (a capture
// script that forgot to bump it) are read too.
TEST(BatchFileReaderLiberal, SsmItemsUnderAnyMinorVersion) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) { root.write_string_attribute("schema_version", "1.0"); });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.inputs.ssm_state.size(), 2u);
  EXPECT_EQ(back.config.ssm_params.size(), 4u);
}

TEST(BatchFileReaderLiberal, SsmParamsOfAnyIntegerWidth) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const h5::Group params = group_at(root, "/config/ssm");
    const int32_t state_size = 4;
    write_typed_attribute(params, "state_size", H5T_STD_I32LE, &state_size);
    const uint8_t conv_kernel = 4;
    write_typed_attribute(params, "conv_kernel", H5T_STD_U8LE, &conv_kernel);
    const int16_t dt_rank_be = static_cast<int16_t>(__builtin_bswap16(2));
    const h5::Type big_endian = h5::Type::copy_of(H5T_STD_I16BE);
    write_typed_attribute(params, "dt_rank", big_endian.id(), &dt_rank_be);
    const double intermediate_size = 8.0;  // numpy arithmetic can turn counts into floats
    write_typed_attribute(params, "intermediate_size", H5T_IEEE_F64LE, &intermediate_size);
  });
  const BatchFile back = read_batch_file(w.path.string());
  EXPECT_EQ(back.config.ssm_params, w.file.config.ssm_params);
}

// Pools and weights in the forms h5py users produce: bf16 as uint16 bits with dtype_name, floats
// without dtype_name (the HDF5 type decides), chunked and compressed storage.
TEST(BatchFileReaderLiberal, SsmTensorsInH5pyForms) {
  const WrittenBatch w = written_ssm_batch();
  const Tensor& conv_state = w.file.inputs.ssm_state.at("conv_state");
  const Tensor d_weight = patterned_tensor(DType::kFloat32, {8}, 5);
  edit_file(w.path, [&](const h5::Group& root) {
    replace_dataset(root, "/inputs/ssm/conv_state", H5T_STD_U16LE, conv_state.shape(), conv_state.data());
    group_at(root, "/inputs/ssm").open_dataset("conv_state").write_string_attribute("dtype_name", "bfloat16");
    replace_dataset(root, "/weights/D", H5T_IEEE_F32LE, {8}, d_weight.data());  // no dtype_name
    group_at(root, "/inputs/ssm").open_dataset("ssm_state").remove_attribute("dtype_name");  // bf16 by its layout
  });
  const BatchFile back = read_batch_file(w.path.string());
  expect_same_tensor(conv_state, back.inputs.ssm_state.at("conv_state"), "/inputs/ssm/conv_state");
  expect_same_tensor(w.file.inputs.ssm_state.at("ssm_state"), back.inputs.ssm_state.at("ssm_state"),
                     "/inputs/ssm/ssm_state");
  expect_same_tensor(d_weight, back.inputs.weights.at("D"), "/weights/D");
}

// --- malformed files ---------------------------------------------------------------------------

TEST(BatchFileReaderErrors, MissingDataset) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/inputs").remove_child("query"); });
  EXPECT_THAT(read_error(w.path),
              AllOf(HasSubstr("missing dataset /inputs/query"), HasSubstr("bfloat16 [T, num_heads, head_size]")));
  EXPECT_THAT(directory_listing(w.dir), ElementsAre("batch.h5"));
}

TEST(BatchFileReaderErrors, MissingGroupAndAttribute) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/config").remove_attribute("sliding_window"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("missing attribute /config/sliding_window"));
  const WrittenBatch other = written_batch();
  edit_file(other.path, [](const h5::Group& root) { root.remove_child("batch"); });
  EXPECT_THAT(read_error(other.path), HasSubstr("missing group /batch"));
}

TEST(BatchFileReaderErrors, WrongShape) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [&](const h5::Group& root) {
    const Tensor key = patterned_tensor(DType::kBFloat16, {kSmallTokens, 4, 32}, 3);
    const h5::Type type = h5::bfloat16_type();
    replace_dataset(root, "/inputs/key", type.id(), key.shape(), key.data());
    group_at(root, "/inputs").open_dataset("key").write_string_attribute("dtype_name", "bfloat16");
  });
  EXPECT_THAT(read_error(w.path),
              HasSubstr("/inputs/key: shape [7, 4, 32] does not match [T=7, num_kv_heads=2, head_size=32]"));
}

TEST(BatchFileReaderErrors, TokenCountsDisagree) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const std::vector<int64_t> slots{20, 21, 22, 37, 80, 81};  // T = 6 but the tensors have 7 rows
    replace_dataset(root, "/batch/slot_mapping", H5T_STD_I64LE, {6}, slots.data());
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/query: shape [7, 4, 32] does not match [T=6, num_heads=4"));
}

TEST(BatchFileReaderErrors, WrongDtype) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const Tensor query = patterned_tensor(DType::kFloat32, {kSmallTokens, 4, 32}, 1);
    replace_dataset(root, "/inputs/query", H5T_IEEE_F32LE, query.shape(), query.data());
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/query: dtype float32 does not match /config dtype bfloat16"));
}

TEST(BatchFileReaderErrors, WrongKvCacheStorage) {
  const WrittenBatch w = written_batch(KvCacheDtype::kFp8E4M3);
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs").open_dataset("kv_cache").write_string_attribute("dtype_name", "float8_e5m2");
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("/inputs/kv_cache: dtype float8_e5m2 does not match"),
                                        HasSubstr("float8_e4m3fn"), HasSubstr("fp8_e4m3")));
}

TEST(BatchFileReaderErrors, DtypeNameDisagreesWithStorage) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const Tensor query = patterned_tensor(DType::kFloat32, {kSmallTokens, 4, 32}, 1);
    replace_dataset(root, "/inputs/query", H5T_IEEE_F32LE, query.shape(), query.data());
    group_at(root, "/inputs").open_dataset("query").write_string_attribute("dtype_name", "bfloat16");
  });
  EXPECT_THAT(read_error(w.path),
              HasSubstr("/inputs/query: dtype_name bfloat16 does not match its HDF5 storage float32"));
}

TEST(BatchFileReaderErrors, AmbiguousUint8WithoutDtypeName) {
  const WrittenBatch w = written_batch(KvCacheDtype::kFp8E4M3);
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs").open_dataset("kv_cache").remove_attribute("dtype_name");
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("/inputs/kv_cache: uint8 storage is ambiguous"),
                                        HasSubstr("dtype_name")));
}

TEST(BatchFileReaderErrors, BigEndianData) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const std::vector<int32_t> qsl{0, 3, 4, 6, 6};
    const h5::Type be = h5::Type::copy_of(H5T_STD_I32BE);
    replace_dataset(root, "/batch/query_start_loc", be.id(), {5}, qsl.data());
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("/batch/query_start_loc"), HasSubstr("big-endian")));
}

TEST(BatchFileReaderErrors, ValueOutOfInt32Range) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const std::vector<int64_t> qsl{0, 3, 4, 6, int64_t{1} << 33};
    replace_dataset(root, "/batch/query_start_loc", H5T_STD_I64LE, {5}, qsl.data());
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/batch/query_start_loc: value 8589934592 at index 4 does not fit int32"));
}

// Sizes and counts of the layer are int32 in vLLM; a file's int64 attribute beyond that is refused
// before any arithmetic sees it (the rest of the corpus: tests/broken, `ctest -L broken`).
TEST(BatchFileReaderErrors, ConfigSizesAndSsmParamsBeyondInt32) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/config").write_int_attribute("num_heads", int64_t{1} << 40); });
  EXPECT_THAT(read_error(w.path), HasSubstr("attribute /config/num_heads: value 1099511627776 does not fit int32"));

  const WrittenBatch s = written_ssm_batch();
  edit_file(s.path, [](const h5::Group& root) {
    group_at(root, "/config/ssm").write_int_attribute("state_size", std::numeric_limits<int64_t>::max());
  });
  EXPECT_THAT(read_error(s.path),
              HasSubstr("attribute /config/ssm/state_size: value 9223372036854775807 does not fit int32"));
}

// A dataset whose elements were never written reads as HDF5 fill values; the reader refuses it
// rather than allocate what the file declares (a few bytes of header could declare terabytes).
TEST(BatchFileReaderErrors, DatasetNeverWritten) {
  const WrittenBatch w = written_batch();
  const Shape shape = w.file.inputs.query.shape();
  edit_file(w.path, [&](const h5::Group& root) {
    const h5::Group inputs = group_at(root, "/inputs");
    inputs.remove_child("query");
    const h5::Type bf16 = h5::bfloat16_type();
    inputs.create_dataset("query", bf16.id(), shape).write_string_attribute("dtype_name", "bfloat16");
  });
  const int64_t bytes = 2 * shape[0] * shape[1] * shape[2];
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/query: the file stores 0 of its " + std::to_string(bytes) +
                                            " bytes (a dataset never written, or unallocated chunks)"));
}

TEST(BatchFileReaderErrors, SchemaVersionTwo) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { root.write_string_attribute("schema_version", "2.0"); });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("schema_version 2.0 is not supported"), HasSubstr("1.x")));
  edit_file(w.path, [](const h5::Group& root) { root.write_string_attribute("schema_version", "one"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("schema_version 'one'"));
}

TEST(BatchFileReaderErrors, WrongOrMissingSchemaName) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { root.write_string_attribute("schema", "hybrid-attn-batch"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("root attribute schema is 'hybrid-attn-batch', expected 'hybrid-batch'"));
  edit_file(w.path, [](const h5::Group& root) { root.remove_attribute("schema"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("missing attribute /schema"));
}

TEST(BatchFileReaderErrors, UnknownEnumString) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/config").write_string_attribute("kv_cache_dtype", "fp4");
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("kv_cache_dtype"), HasSubstr("fp4")));
}

TEST(BatchFileReaderErrors, StringWhereANumberBelongs) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/config").write_string_attribute("num_heads", "4"); });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("/config/num_heads"), HasSubstr("expected an integer")));
}

TEST(BatchFileReaderErrors, GroupWhereADatasetBelongs) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs").remove_child("value");
    group_at(root, "/inputs").create_group("value");
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/value is a group, expected a dataset"));
}

TEST(BatchFileReaderErrors, ScalarWithSeveralElements) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const std::vector<float> scales{1.0f, 2.0f};
    replace_dataset(root, "/inputs/k_scale", H5T_IEEE_F32LE, {2}, scales.data());
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/k_scale: expected a scalar"));
}

TEST(BatchFileReaderErrors, DecoderWithoutBlockTableOrKvCache) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/inputs").remove_child("kv_cache"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("missing dataset /inputs/kv_cache"));
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/batch").remove_child("block_table"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("missing dataset /batch/block_table"));
}

TEST(BatchFileReaderErrors, PerTokenHeadScaleCaches) {
  const WrittenBatch w = written_batch(KvCacheDtype::kInt8PerTokenHead);
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/inputs").remove_child("v_scale_cache"); });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("missing dataset /inputs/v_scale_cache"),
                                        HasSubstr("int8_per_token_head")));

  const WrittenBatch plain = written_batch(KvCacheDtype::kAuto);
  edit_file(plain.path, [](const h5::Group& root) {
    const Tensor scales = patterned_tensor(DType::kFloat32, {kSmallBlocks, 16, 2}, 1);
    replace_dataset(root, "/inputs/k_scale_cache", H5T_IEEE_F32LE, scales.shape(), scales.data());
  });
  EXPECT_THAT(read_error(plain.path), HasSubstr("/inputs/k_scale_cache: present, but kv_cache_dtype auto"));
}

// Consistency between the batch arrays is the core validator's job; its message reaches the caller.
TEST(BatchFileReaderErrors, InconsistentBatchIsRejectedByValidate) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) {
    const std::vector<int64_t> slots{20, 21, 22, 38, 80, 81, -1};
    replace_dataset(root, "/batch/slot_mapping", H5T_STD_I64LE, {kSmallTokens}, slots.data());
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("batch.h5"), HasSubstr("/batch/slot_mapping[3]")));
}

TEST(BatchFileReaderErrors, MalformedOutputs) {
  const WrittenBatch w = written_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/outputs").remove_child("attn_output"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("missing dataset /outputs/attn_output"));

  const WrittenBatch unknown = written_batch();
  edit_file(unknown.path, [](const h5::Group& root) {
    group_at(root, "/outputs/metadata/attention").write_int_attribute("not_a_field", 1);
  });
  EXPECT_THAT(read_error(unknown.path), AllOf(HasSubstr("/outputs/metadata"), HasSubstr("not_a_field")));

  const WrittenBatch missing = written_batch();
  edit_file(missing.path, [](const h5::Group& root) {
    group_at(root, "/outputs/metadata/mamba").remove_attribute("num_decodes");
  });
  EXPECT_THAT(read_error(missing.path), AllOf(HasSubstr("/outputs/metadata"), HasSubstr("mamba/num_decodes")));
}

TEST(BatchFileReaderErrors, SsmPoolWithAnIntegerOrFp8Dtype) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/inputs/ssm/conv_state", patterned_tensor(DType::kInt32, {kSsmSlots, 8, 3}, 1));
  });
  EXPECT_THAT(read_error(w.path),
              AllOf(HasSubstr("batch.h5: /inputs/ssm/conv_state: dtype int32 is not allowed"),
                    HasSubstr("state pools must be float64, float32, float16 or bfloat16")));

  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/inputs/ssm/conv_state", patterned_tensor(DType::kFloat8E4M3, {kSsmSlots, 8, 3}, 1));
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/ssm/conv_state: dtype float8_e4m3fn is not allowed"));

  // uint8 without dtype_name is ambiguous before it is anything else.
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs/ssm").open_dataset("conv_state").remove_attribute("dtype_name");
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/ssm/conv_state: uint8 storage is ambiguous"));
}

TEST(BatchFileReaderErrors, SsmPoolsWithDifferentNumSlots) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/inputs/ssm/ssm_state", patterned_tensor(DType::kBFloat16, {kSsmSlots - 1, 8, 4}, 1));
  });
  EXPECT_THAT(read_error(w.path),
              HasSubstr("/inputs/ssm/ssm_state: shape [11, 8, 4] has num_slots 11 (dimension 0), but "
                        "/inputs/ssm/conv_state [12, 8, 3] has 12; every state pool must hold the same slots"));
}

TEST(BatchFileReaderErrors, SsmTensorsOfRankZero) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/inputs/ssm/conv_state", patterned_tensor(DType::kFloat32, {}, 1));
  });
  EXPECT_THAT(read_error(w.path), AllOf(HasSubstr("/inputs/ssm/conv_state: shape [] (a scalar) is not allowed"),
                                        HasSubstr("[num_slots, ...]")));
  const WrittenBatch weights = written_ssm_batch();
  edit_file(weights.path, [](const h5::Group& root) {
    replace_tensor(root, "/weights/D", patterned_tensor(DType::kFloat32, {}, 1));
  });
  EXPECT_THAT(read_error(weights.path),
              HasSubstr("/weights/D: shape [] (a scalar) is not allowed (weights must have rank >= 1)"));
}

TEST(BatchFileReaderErrors, WeightWithAnIntegerDtype) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/weights/A_log", patterned_tensor(DType::kInt64, {8, 4}, 1));
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/weights/A_log: dtype int64 is not allowed (weights must be float64"));
}

// The pools after the step are the pools before it: same names, same shapes (dtypes may differ).
TEST(BatchFileReaderErrors, PoolsAfterTheStepDifferFromInputs) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/outputs/ssm/ssm_state", patterned_tensor(DType::kFloat64, {kSsmSlots, 8, 5}, 1));
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/outputs/ssm/ssm_state: shape [12, 8, 5] does not match "
                                            "/inputs/ssm/ssm_state [12, 8, 4] (the same pool before the step)"));

  const WrittenBatch expected = written_ssm_batch();
  edit_file(expected.path, [](const h5::Group& root) {
    // Consistent among themselves (12 → 13 slots in both), but not with /inputs/ssm.
    replace_tensor(root, "/expected/ssm/ssm_state", patterned_tensor(DType::kBFloat16, {kSsmSlots + 1, 8, 4}, 1));
    replace_tensor(root, "/expected/ssm/conv_state", patterned_tensor(DType::kBFloat16, {kSsmSlots + 1, 8, 3}, 2));
  });
  EXPECT_THAT(read_error(expected.path), HasSubstr("/expected/ssm/conv_state: shape [13, 8, 3] does not match "
                                                   "/inputs/ssm/conv_state [12, 8, 3]"));

  const WrittenBatch missing = written_ssm_batch();
  edit_file(missing.path, [](const h5::Group& root) { group_at(root, "/outputs/ssm").remove_child("conv_state"); });
  EXPECT_THAT(read_error(missing.path),
              AllOf(HasSubstr("missing dataset /outputs/ssm/conv_state (required: [12, 8, 3], the pool "
                              "/inputs/ssm/conv_state after the step"),
                    HasSubstr("every pool is stored when /outputs/ssm exists")));

  const WrittenBatch extra = written_ssm_batch();
  edit_file(extra.path, [](const h5::Group& root) {
    replace_tensor(root, "/expected/ssm/bogus", patterned_tensor(DType::kBFloat16, {kSsmSlots, 2}, 1));
  });
  EXPECT_THAT(read_error(extra.path), HasSubstr("/expected/ssm/bogus: no state pool of that name in /inputs/ssm "
                                                "(conv_state, ssm_state)"));
}

TEST(BatchFileReaderErrors, SsmOutputOfTheWrongShapeOrDtype) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/outputs/ssm_output", patterned_tensor(DType::kFloat64, {kSmallTokens, 4, 16}, 1));
  });
  EXPECT_THAT(read_error(w.path),
              HasSubstr("/outputs/ssm_output: shape [7, 4, 16] does not match [T=7, num_heads=4, head_size=32]"));
  edit_file(w.path, [](const h5::Group& root) {
    replace_tensor(root, "/outputs/ssm_output", patterned_tensor(DType::kInt32, {kSmallTokens, 4, 32}, 1));
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/outputs/ssm_output: dtype int32 is not a float type"));
}

TEST(BatchFileReaderErrors, SsmParamThatIsNotAnInteger) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/config/ssm").write_string_attribute("state_size", "4"); });
  EXPECT_THAT(read_error(w.path), HasSubstr("attribute /config/ssm/state_size: expected an integer, found string"));
  edit_file(w.path, [](const h5::Group& root) { group_at(root, "/config/ssm").write_float_attribute("state_size", 2.5); });
  EXPECT_THAT(read_error(w.path), HasSubstr("attribute /config/ssm/state_size: expected an integer, found 2.5"));
}

TEST(BatchFileReaderErrors, SsmItemsOfTheWrongKind) {
  const WrittenBatch w = written_ssm_batch();
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs/ssm").create_group("nested");
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/ssm/nested is a group, expected a dataset"));
  edit_file(w.path, [](const h5::Group& root) {
    group_at(root, "/inputs").remove_child("ssm");
    const float value = 1.0f;
    replace_dataset(root, "/inputs/ssm", H5T_IEEE_F32LE, {1}, &value);
  });
  EXPECT_THAT(read_error(w.path), HasSubstr("/inputs/ssm is not a group"));
  const WrittenBatch weights = written_ssm_batch();
  edit_file(weights.path, [](const h5::Group& root) {
    root.remove_child("weights");
    const float value = 1.0f;
    replace_dataset(root, "/weights", H5T_IEEE_F32LE, {1}, &value);
  });
  EXPECT_THAT(read_error(weights.path), HasSubstr("/weights is not a group"));
}

TEST(BatchFileReaderErrors, TruncatedFile) {
  const WrittenBatch w = written_batch();
  const auto size = std::filesystem::file_size(w.path);
  std::filesystem::resize_file(w.path, size / 2);
  ::testing::internal::CaptureStderr();
  const std::string message = read_error(w.path);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "HDF5 printed its error stack";
  EXPECT_THAT(message, AllOf(HasSubstr("cannot open '" + w.path.string() + "' as an HDF5 file"),
                             HasSubstr("truncated or not HDF5?")));
  EXPECT_THAT(error_of([&] { list_file_entries(w.path.string()); }), HasSubstr("truncated or not HDF5?"));
}

TEST(BatchFileReaderErrors, NotAnHdf5File) {
  const std::filesystem::path path = scratch_dir() / "notes.h5";
  std::ofstream(path) << "query,key,value\n1,2,3\n";
  EXPECT_THAT(read_error(path), AllOf(HasSubstr("cannot open '" + path.string() + "'"), HasSubstr("not HDF5")));
}

TEST(BatchFileReaderErrors, NonexistentPathAndDirectory) {
  const std::filesystem::path dir = scratch_dir();
  EXPECT_THAT(read_error(dir / "absent.h5"), HasSubstr("no such file"));
  EXPECT_THAT(read_error(dir), HasSubstr("is a directory"));
  EXPECT_THAT(error_of([&] { list_file_entries((dir / "absent.h5").string()); }), HasSubstr("no such file"));
}

// --- atomic writes -----------------------------------------------------------------------------

TEST(BatchFileWriter, UnwritableLocationLeavesNothing) {
  const std::filesystem::path dir = scratch_dir();
  const BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  const std::filesystem::path target = dir / "no_such_dir" / "batch.h5";
  EXPECT_THAT(error_of([&] { write_batch_file(target.string(), file); }),
              AllOf(HasSubstr("cannot write '" + target.string() + "'"), HasSubstr("cannot create")));
  EXPECT_TRUE(directory_listing(dir).empty());

  // The target is a directory: the rename fails after the whole file was written.
  std::filesystem::create_directory(dir / "occupied.h5");
  EXPECT_THAT(error_of([&] { write_batch_file((dir / "occupied.h5").string(), file); }), HasSubstr("occupied.h5"));
  EXPECT_THAT(directory_listing(dir), ElementsAre("occupied.h5"));
  EXPECT_TRUE(std::filesystem::is_empty(dir / "occupied.h5"));
}

TEST(BatchFileWriter, ReadOnlyDirectoryLeavesNothing) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: directory permissions do not apply";
  const std::filesystem::path dir = scratch_dir() / "read_only";
  std::filesystem::create_directory(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  EXPECT_THAT(error_of([&] { write_batch_file((dir / "batch.h5").string(), file); }), HasSubstr("cannot write"));
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  EXPECT_TRUE(directory_listing(dir).empty());
}

// /outputs is checked while it is written, after /config, /batch and /inputs are on disk.
TEST(BatchFileWriter, FailureMidWriteLeavesNoFileAndKeepsTheOldOne) {
  const std::filesystem::path dir = scratch_dir();
  const std::filesystem::path target = dir / "batch.h5";
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 1);
  file.outputs->attn_output = patterned_tensor(DType::kFloat64, {kSmallTokens, 4, 16}, 2);
  EXPECT_THAT(error_of([&] { write_batch_file(target.string(), file); }),
              HasSubstr("/outputs/attn_output: shape [7, 4, 16] does not match [T=7, num_heads=4, head_size=32]"));
  EXPECT_TRUE(directory_listing(dir).empty());

  BatchFile good = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  write_batch_file(target.string(), good);
  file.outputs->attn_output = Tensor();
  EXPECT_THAT(error_of([&] { write_batch_file(target.string(), file); }), HasSubstr("/outputs/attn_output"));
  EXPECT_THAT(directory_listing(dir), ElementsAre("batch.h5"));
  expect_same_batch_file(good, read_batch_file(target.string()));
}

TEST(BatchFileWriter, InvalidBatchIsRefusedBeforeWriting) {
  const std::filesystem::path dir = scratch_dir();
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.inputs.query = patterned_tensor(DType::kFloat32, {kSmallTokens, 4, 32}, 1);
  EXPECT_THAT(error_of([&] { write_batch_file((dir / "batch.h5").string(), file); }), HasSubstr("/inputs/query"));
  file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  file.provenance["schema_version"] = "9.9";
  EXPECT_THAT(error_of([&] { write_batch_file((dir / "batch.h5").string(), file); }), HasSubstr("reserved"));
  EXPECT_TRUE(directory_listing(dir).empty());
}

// The writer checks the SSM inputs before it creates anything: no file, not even a temporary.
TEST(BatchFileWriter, BadSsmInputsAreRefusedBeforeWriting) {
  const std::filesystem::path dir = scratch_dir();
  const std::string target = (dir / "batch.h5").string();
  BatchFile base = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(base, DType::kFloat32, 1);
  const auto refused = [&](const std::function<void(BatchFile&)>& change) {
    BatchFile file = base;
    change(file);
    return error_of([&] { write_batch_file(target, file); });
  };
  EXPECT_THAT(refused([](BatchFile& f) {
                f.inputs.ssm_state["conv_state"] = patterned_tensor(DType::kInt32, {kSsmSlots, 8, 3}, 2);
              }),
              AllOf(HasSubstr("cannot write '" + target + "'"),
                    HasSubstr("/inputs/ssm/conv_state: dtype int32 is not allowed")));
  EXPECT_THAT(refused([](BatchFile& f) {
                f.inputs.ssm_state["ssm_state"] = patterned_tensor(DType::kFloat32, {kSsmSlots + 3, 8, 4}, 2);
              }),
              HasSubstr("/inputs/ssm/ssm_state: shape [15, 8, 4] has num_slots 15 (dimension 0), but "
                        "/inputs/ssm/conv_state [12, 8, 3] has 12"));
  EXPECT_THAT(refused([](BatchFile& f) { f.inputs.weights["D"] = Tensor(); }),
              HasSubstr("/weights/D: the tensor is empty (absent)"));
  EXPECT_THAT(refused([](BatchFile& f) { f.inputs.weights["D"] = patterned_tensor(DType::kFloat32, {}, 2); }),
              HasSubstr("/weights/D: shape [] (a scalar) is not allowed"));
  EXPECT_THAT(refused([](BatchFile& f) { f.inputs.weights["x/y"] = patterned_tensor(DType::kFloat32, {2}, 2); }),
              HasSubstr("/weights: weight name 'x/y' is not a valid item name"));
  EXPECT_THAT(refused([](BatchFile& f) { f.inputs.ssm_state[""] = patterned_tensor(DType::kFloat32, {kSsmSlots}, 2); }),
              HasSubstr("/inputs/ssm: state pool name '' is not a valid item name"));
  EXPECT_THAT(refused([](BatchFile& f) { f.config.ssm_params["a/b"] = 1; }),
              HasSubstr("/config/ssm: parameter name 'a/b' is not a valid item name"));
  EXPECT_TRUE(directory_listing(dir).empty());
}

// SSM results are checked while /outputs or /expected is written: the temporary is removed and an
// existing file at the target is kept.
TEST(BatchFileWriter, BadSsmResultsLeaveNoFileAndKeepTheOldOne) {
  const std::filesystem::path dir = scratch_dir();
  const std::filesystem::path target = dir / "batch.h5";
  BatchFile base = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(base, DType::kFloat32, 1);
  base.outputs = sample_outputs(base, DType::kFloat64, "reference", 2);
  add_ssm_outputs(*base.outputs, base, DType::kFloat64, 3);
  base.expected = sample_outputs(base, DType::kFloat32, "cuda", 4);
  add_ssm_outputs(*base.expected, base, DType::kFloat32, 5);
  const auto refused = [&](const std::function<void(BatchFile&)>& change) {
    BatchFile file = base;
    change(file);
    return error_of([&] { write_batch_file(target.string(), file); });
  };
  const auto check_all = [&] {
    EXPECT_THAT(refused([](BatchFile& f) {
                  f.outputs->ssm_state["ssm_state"] = patterned_tensor(DType::kFloat64, {kSsmSlots, 8, 5}, 6);
                }),
                HasSubstr("/outputs/ssm/ssm_state: shape [12, 8, 5] does not match /inputs/ssm/ssm_state [12, 8, 4]"));
    EXPECT_THAT(refused([](BatchFile& f) { f.expected->ssm_state.erase("conv_state"); }),
                HasSubstr("missing dataset /expected/ssm/conv_state"));
    EXPECT_THAT(refused([](BatchFile& f) {
                  f.expected->ssm_state["extra"] = patterned_tensor(DType::kFloat32, {kSsmSlots, 2}, 6);
                }),
                HasSubstr("/expected/ssm/extra: no state pool of that name in /inputs/ssm"));
    EXPECT_THAT(refused([](BatchFile& f) {
                  f.outputs->ssm_state["conv_state"] = patterned_tensor(DType::kInt8, {kSsmSlots, 8, 3}, 6);
                }),
                HasSubstr("/outputs/ssm/conv_state: dtype int8 is not allowed"));
    EXPECT_THAT(refused([](BatchFile& f) {
                  f.expected->ssm_output = patterned_tensor(DType::kFloat32, {kSmallTokens + 1, 4, 32}, 6);
                }),
                HasSubstr("/expected/ssm_output: shape [8, 4, 32] does not match [T=7, num_heads=4, head_size=32]"));
    EXPECT_THAT(refused([](BatchFile& f) {
                  f.outputs->ssm_output = patterned_tensor(DType::kInt32, {kSmallTokens, 4, 32}, 6);
                }),
                HasSubstr("/outputs/ssm_output: dtype int32 is not a float type"));
  };
  check_all();
  EXPECT_TRUE(directory_listing(dir).empty());

  write_batch_file(target.string(), base);
  check_all();
  EXPECT_THAT(directory_listing(dir), ElementsAre("batch.h5"));
  expect_same_batch_file(base, read_batch_file(target.string()));
}

}  // namespace
}  // namespace hybridtb::testing
