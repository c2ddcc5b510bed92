// TensorView bookkeeping and IntArray access.
#include <gtest/gtest.h>

#include <cmath>

#include "hybridtb/error.h"
#include "hybridtb/int_array.h"
#include "hybridtb/tensor.h"

namespace hybridtb {
namespace {

TEST(TensorView, ContiguousStridesOffsetsAndSlices) {
  Tensor t = Tensor::host(DType::kFloat32, {4, 3, 2});
  EXPECT_EQ(t.view().strides(), (Shape{6, 2, 1}));
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.view().offset({2, 1, 1}), 2 * 6 + 1 * 2 + 1);
  EXPECT_THROW(t.view().offset({4, 0, 0}), Error);
  const TensorView rows = t.view().slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(static_cast<float*>(rows.data()), t.data_as<float>() + 6);
  EXPECT_EQ(t.view().describe(), "float32[4, 3, 2] on host");
}

TEST(TensorView, CloneOfAStridedViewIsContiguousAndEqual) {
  Tensor t = Tensor::host(DType::kFloat64, {3, 4});
  for (int64_t i = 0; i < 12; ++i) t.data_as<double>()[i] = static_cast<double>(i);
  // The transpose as a strided view: shape [4, 3], strides [1, 4].
  const TensorView transposed(t.data(), DType::kFloat64, {4, 3}, {1, 4}, Device::kHost);
  EXPECT_FALSE(transposed.is_contiguous());
  const Tensor c = clone_host(transposed);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t col = 0; col < 3; ++col) EXPECT_EQ(c.data_as<double>()[r * 3 + col], static_cast<double>(col * 4 + r));
  }
}

TEST(TensorView, ConvertFillAndBitwiseEqual) {
  Tensor t = Tensor::host(DType::kFloat32, {5});
  fill_host(t, 1.0 / 3.0);
  const Tensor b = convert_host(t, DType::kBFloat16);
  EXPECT_EQ(load_as_double(b.data(), DType::kBFloat16, 0), static_cast<double>(bfloat16_to_float(float_to_bfloat16(1.0f / 3.0f))));
  Tensor nan = Tensor::host(DType::kFloat64, {2});
  fill_host(nan, std::nan(""));
  EXPECT_TRUE(bitwise_equal(nan, clone_host(nan)));  // NaN compared as bits
  EXPECT_FALSE(bitwise_equal(t, b));                  // dtype differs
}

TEST(IntArray, AccessRowsColumnsAndBounds) {
  IntArray m({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(m.at(1, 2), 6);
  EXPECT_EQ(m.column(1), IntArray::vector({2, 5}));
  EXPECT_EQ(m.leading_columns(2), IntArray({2, 2}, {1, 2, 4, 5}));
  EXPECT_EQ(m.rows(1, 2), IntArray({1, 3}, {4, 5, 6}));
  EXPECT_THROW(m.at(2, 0), Error);
  EXPECT_THROW(m[0], Error);  // 2-d array indexed as 1-d
  EXPECT_THROW(IntArray({2, 2}, {1, 2, 3}), Error);
  EXPECT_EQ(IntArray::vector({7, 8}).describe(), "int32[2] {7, 8}");
}

}  // namespace
}  // namespace hybridtb
