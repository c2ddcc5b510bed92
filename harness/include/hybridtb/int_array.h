// IntArray — a small owning row-major int32 array with a shape. The batch description and the
// builders' metadata are made of these: plain data that can be compared field by field, printed
// and stored in HDF5 without knowing which backend produced it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace hybridtb {

struct IntArray {
  std::vector<int64_t> shape;   // empty shape = a 0-d scalar is not used; 1-d [n] and 2-d [r, c] are
  std::vector<int32_t> values;  // row-major, size == product(shape)

  IntArray() = default;
  IntArray(std::vector<int64_t> shape_, std::vector<int32_t> values_);
  static IntArray vector(std::vector<int32_t> values);                   // shape [n]
  static IntArray filled(std::vector<int64_t> shape, int32_t value);     // any rank
  static IntArray matrix(int64_t rows, int64_t cols, int32_t value = 0);  // shape [rows, cols]

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t size(int dim) const { return shape.at(dim); }
  int64_t numel() const { return static_cast<int64_t>(values.size()); }

  // 1-d and 2-d element access, bounds-checked (throws Error with the index and shape).
  int32_t& operator[](int64_t i);
  int32_t operator[](int64_t i) const;
  int32_t& at(int64_t row, int64_t col);
  int32_t at(int64_t row, int64_t col) const;

  // Rows [begin, end) of dimension 0, copied.
  IntArray rows(int64_t begin, int64_t end) const;
  // Column `col` of a 2-d array as a 1-d array.
  IntArray column(int64_t col) const;
  // The first `cols` columns of a 2-d array.
  IntArray leading_columns(int64_t cols) const;

  bool operator==(const IntArray& other) const { return shape == other.shape && values == other.values; }
  bool operator!=(const IntArray& other) const { return !(*this == other); }

  // "int32[3] {0, 5, 9}" (long arrays are elided in the middle).
  std::string describe(int64_t max_values = 16) const;
};

}  // namespace hybridtb
