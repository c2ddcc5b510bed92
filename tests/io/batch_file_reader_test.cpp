// What read_batch_file accepts and refuses. Liberal cases are the ways h5py users differ from our
// canonical writer (string padding, integer widths, float attributes, 1-element scalars, uint16
// bf16 bits); malformed cases must fail with an Error naming the item. Also: write_batch_file
// leaves nothing behind when it fails. Files are made by writing a valid batch and editing it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

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

}  // namespace
}  // namespace hybridtb::testing
