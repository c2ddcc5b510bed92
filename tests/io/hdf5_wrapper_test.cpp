// Tests of the HDF5 RAII layer (harness/src/io/hdf5.h): the custom 2-byte float types, type
// inspection, silenced error stacks turned into Errors that name our path, liberal attribute
// reading and raw I/O without conversion.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "hybridtb/error.h"
#include "io/hdf5.h"
#include "io_fixtures.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Fields {
  size_t spos, epos, esize, mpos, msize, ebias, size, precision;
};

Fields fields_of(hid_t type) {
  Fields f{};
  H5Tget_fields(type, &f.spos, &f.epos, &f.esize, &f.mpos, &f.msize);
  f.ebias = H5Tget_ebias(type);
  f.size = H5Tget_size(type);
  f.precision = H5Tget_precision(type);
  return f;
}

TEST(Hdf5Types, Bfloat16Layout) {
  const h5::Type type = h5::bfloat16_type();
  const Fields f = fields_of(type.id());
  EXPECT_EQ(f.spos, 15u);
  EXPECT_EQ(f.epos, 7u);
  EXPECT_EQ(f.esize, 8u);
  EXPECT_EQ(f.mpos, 0u);
  EXPECT_EQ(f.msize, 7u);
  EXPECT_EQ(f.ebias, 127u);
  EXPECT_EQ(f.size, 2u);
  EXPECT_EQ(f.precision, 16u);
  EXPECT_EQ(H5Tget_order(type.id()), H5T_ORDER_LE);
  EXPECT_EQ(h5::inspect_type(type.id()).float_dtype, DType::kBFloat16);
}

TEST(Hdf5Types, Float16Layout) {
  const h5::Type type = h5::float16_type();
  const Fields f = fields_of(type.id());
  EXPECT_EQ(f.epos, 10u);
  EXPECT_EQ(f.esize, 5u);
  EXPECT_EQ(f.msize, 10u);
  EXPECT_EQ(f.ebias, 15u);
  EXPECT_EQ(f.size, 2u);
  EXPECT_EQ(h5::inspect_type(type.id()).float_dtype, DType::kFloat16);
}

// HDF5's own conversion of the custom type to float32 must agree with our exact decoder: it is how
// h5py and h5dump see the data.
TEST(Hdf5Types, Bfloat16ConvertsToFloat32LikeOurDecoder) {
  const h5::Type type = h5::bfloat16_type();
  std::vector<uint16_t> bits;
  for (const uint16_t b : bfloat16_specials()) {
    if (!std::isnan(bfloat16_to_float(b))) bits.push_back(b);
  }
  std::vector<unsigned char> buffer(bits.size() * 4);  // H5Tconvert works in place
  std::memcpy(buffer.data(), bits.data(), bits.size() * 2);
  ASSERT_GE(H5Tconvert(type.id(), H5T_NATIVE_FLOAT, bits.size(), buffer.data(), nullptr, H5P_DEFAULT), 0);
  std::vector<float> converted(bits.size());
  std::memcpy(converted.data(), buffer.data(), buffer.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const float expected = bfloat16_to_float(bits[i]);
    EXPECT_EQ(std::memcmp(&converted[i], &expected, 4), 0) << "bits 0x" << std::hex << bits[i];
  }
}

TEST(Hdf5Types, InspectAndDescribe) {
  EXPECT_EQ(h5::inspect_type(H5T_IEEE_F64LE).float_dtype, DType::kFloat64);
  EXPECT_EQ(h5::inspect_type(H5T_IEEE_F32LE).float_dtype, DType::kFloat32);
  EXPECT_TRUE(h5::inspect_type(H5T_IEEE_F32BE).big_endian);
  EXPECT_EQ(h5::describe_type(H5T_STD_U8LE), "uint8");
  EXPECT_EQ(h5::describe_type(H5T_STD_I64BE), "int64 big-endian");
  // A 2-byte float that is neither half nor bfloat16 is recognised as nothing.
  const h5::Type odd = h5::Type::copy_of(H5T_IEEE_F32LE);
  H5Tset_fields(odd.id(), 15, 9, 6, 0, 9);
  H5Tset_precision(odd.id(), 16);
  H5Tset_size(odd.id(), 2);
  EXPECT_FALSE(h5::inspect_type(odd.id()).float_dtype.has_value());
  EXPECT_EQ(h5::describe_type(odd.id()), "float(size 2, mantissa 9 bits)");
}

TEST(Hdf5Errors, FailuresNameOurPathAndAreNotPrinted) {
  const std::filesystem::path path = scratch_dir() / "file.h5";
  ::testing::internal::CaptureStderr();
  {
    const h5::ErrorSilencer silence;
    h5::File file = h5::File::create(path.string());
    const h5::Group root = file.root();
    const h5::Group inputs = root.create_group("inputs");
    EXPECT_THAT(error_of([&] { inputs.open_dataset("query"); }),
                AllOf(HasSubstr("cannot open dataset /inputs/query"), HasSubstr("HDF5:")));
    EXPECT_THAT(error_of([&] { inputs.read_string_attribute("nothing"); }), HasSubstr("attribute /inputs/nothing"));
    EXPECT_THAT(error_of([&] { root.create_group("inputs"); }), HasSubstr("cannot create group /inputs"));
    EXPECT_EQ(h5::error_message(), "");  // each failure consumed its stack
    file.close();
  }
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), IsEmpty());
}

TEST(Hdf5Errors, SilencerRestoresThePreviousHandler) {
  H5E_auto2_t before = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &before, &data);
  {
    const h5::ErrorSilencer outer;
    {
      const h5::ErrorSilencer inner;
    }
    H5E_auto2_t during = nullptr;
    H5Eget_auto2(H5E_DEFAULT, &during, &data);
    EXPECT_EQ(during, nullptr);
  }
  H5E_auto2_t after = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &after, &data);
  EXPECT_EQ(after, before);
}

TEST(Hdf5Attributes, LiberalReadsAndStrictWrites) {
  const std::filesystem::path path = scratch_dir() / "file.h5";
  const h5::ErrorSilencer silence;
  h5::File file = h5::File::create(path.string());
  {
    const h5::Group root = file.root();
    root.write_string_attribute("utf8", "grüße");
    write_fixed_string_attribute(root, "nul_padded", "abc", false);
    write_fixed_string_attribute(root, "space_padded", "abc", true);
    const uint64_t big = 1ull << 63;
    write_typed_attribute(root, "too_big", H5T_STD_U64LE, &big);
    const int8_t small = -5;
    write_typed_attribute(root, "small", H5T_STD_I8LE, &small);
    const double fraction = 2.5;
    write_typed_attribute(root, "fraction", H5T_IEEE_F64LE, &fraction);
    root.write_int_attribute("count", -7);
    root.write_float_attribute("value", 0.1);

    EXPECT_EQ(root.read_string_attribute("utf8"), "grüße");
    EXPECT_EQ(root.read_string_attribute("nul_padded"), "abc");
    EXPECT_EQ(root.read_string_attribute("space_padded"), "abc");
    EXPECT_EQ(root.read_int_attribute("small"), -5);
    EXPECT_EQ(root.read_int_attribute("count"), -7);
    EXPECT_EQ(root.read_float_attribute("count"), -7.0);
    EXPECT_EQ(root.read_float_attribute("value"), 0.1);
    EXPECT_THAT(error_of([&] { root.read_int_attribute("too_big"); }), HasSubstr("does not fit int64"));
    EXPECT_THAT(error_of([&] { root.read_int_attribute("fraction"); }), HasSubstr("expected an integer"));
    EXPECT_THAT(error_of([&] { root.read_string_attribute("count"); }), HasSubstr("expected a string, found int64"));
    EXPECT_EQ(root.attribute_kind("utf8"), h5::AttributeKind::kString);
    EXPECT_EQ(root.attribute_kind("fraction"), h5::AttributeKind::kFloat);
    EXPECT_EQ(root.attribute_kind("too_big"), h5::AttributeKind::kInteger);
    EXPECT_EQ(root.attribute_names(), (std::vector<std::string>{"count", "fraction", "nul_padded", "small",
                                                                "space_padded", "too_big", "utf8", "value"}));
  }
  file.close();
}

TEST(Hdf5Datasets, RawIoRefusesConversionAndHandlesEmptyShapes) {
  const std::filesystem::path path = scratch_dir() / "file.h5";
  const h5::ErrorSilencer silence;
  h5::File file = h5::File::create(path.string());
  {
    const h5::Group root = file.root();
    const h5::Type bf16 = h5::bfloat16_type();
    const h5::Dataset data = root.create_dataset("data", bf16.id(), {2, 3});
    const std::vector<uint16_t> bits{0x3F80, 0x8001, 0x7FC1, 0xFF80, 0x0000, 0x7F7F};
    data.write_raw(bf16.id(), bits.data());
    std::vector<uint16_t> back(6);
    data.read_raw(data.file_type().id(), back.data());
    EXPECT_EQ(back, bits);
    std::vector<float> floats(6);
    EXPECT_THAT(error_of([&] { data.read_raw(H5T_NATIVE_FLOAT, floats.data()); }), HasSubstr("differs from the file type"));

    const h5::Dataset empty = root.create_dataset("empty", H5T_STD_I32LE, {4, 0});
    EXPECT_EQ(empty.shape(), (Shape{4, 0}));
    const h5::Dataset scalar = root.create_dataset("scalar", H5T_IEEE_F32LE, {});
    EXPECT_EQ(scalar.shape(), Shape{});
    EXPECT_EQ(root.child_kind("data"), h5::ObjectKind::kDataset);
    EXPECT_EQ(root.child_kind("nothing"), h5::ObjectKind::kMissing);
    EXPECT_EQ(root.child_names(), (std::vector<std::string>{"data", "empty", "scalar"}));
  }
  file.close();
}

}  // namespace
}  // namespace hybridtb::testing
