// IntArray: bounds-checked int32 arrays for batch descriptions and builder metadata.
#include "hybridtb/int_array.h"

#include <numeric>
#include <sstream>

#include "hybridtb/error.h"

namespace hybridtb {

namespace {
int64_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}
std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}
}  // namespace

IntArray::IntArray(std::vector<int64_t> shape_, std::vector<int32_t> values_)
    : shape(std::move(shape_)), values(std::move(values_)) {
  HYBRIDTB_CHECK(product(shape) == static_cast<int64_t>(values.size()), "IntArray: shape ", shape_string(shape),
                 " does not hold ", values.size(), " values");
}

IntArray IntArray::vector(std::vector<int32_t> values) {
  const auto n = static_cast<int64_t>(values.size());
  return IntArray({n}, std::move(values));
}

IntArray IntArray::filled(std::vector<int64_t> shape, int32_t value) {
  const int64_t n = product(shape);
  return IntArray(std::move(shape), std::vector<int32_t>(static_cast<size_t>(n), value));
}

IntArray IntArray::matrix(int64_t rows, int64_t cols, int32_t value) { return filled({rows, cols}, value); }

int32_t& IntArray::operator[](int64_t i) {
  HYBRIDTB_CHECK(rank() == 1 && 0 <= i && i < numel(), "IntArray: index ", i, " out of range for shape ",
                 shape_string(shape));
  return values[static_cast<size_t>(i)];
}

int32_t IntArray::operator[](int64_t i) const { return const_cast<IntArray&>(*this)[i]; }

int32_t& IntArray::at(int64_t row, int64_t col) {
  HYBRIDTB_CHECK(rank() == 2 && 0 <= row && row < shape[0] && 0 <= col && col < shape[1], "IntArray: index [", row,
                 ", ", col, "] out of range for shape ", shape_string(shape));
  return values[static_cast<size_t>(row * shape[1] + col)];
}

int32_t IntArray::at(int64_t row, int64_t col) const { return const_cast<IntArray&>(*this).at(row, col); }

IntArray IntArray::rows(int64_t begin, int64_t end) const {
  HYBRIDTB_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "IntArray::rows: [", begin, ", ",
                 end, ") out of range for shape ", shape_string(shape));
  const int64_t row_size = shape[0] == 0 ? 0 : numel() / shape[0];
  std::vector<int64_t> new_shape = shape;
  new_shape[0] = end - begin;
  return IntArray(new_shape, std::vector<int32_t>(values.begin() + begin * row_size, values.begin() + end * row_size));
}

IntArray IntArray::column(int64_t col) const {
  HYBRIDTB_CHECK(rank() == 2 && 0 <= col && col < shape[1], "IntArray::column: column ", col,
                 " out of range for shape ", shape_string(shape));
  std::vector<int32_t> out;
  for (int64_t r = 0; r < shape[0]; ++r) out.push_back(at(r, col));
  return IntArray::vector(std::move(out));
}

IntArray IntArray::leading_columns(int64_t cols) const {
  HYBRIDTB_CHECK(rank() == 2 && 0 <= cols && cols <= shape[1], "IntArray::leading_columns: ", cols,
                 " columns out of range for shape ", shape_string(shape));
  IntArray out = matrix(shape[0], cols);
  for (int64_t r = 0; r < shape[0]; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.at(r, c) = at(r, c);
  }
  return out;
}

std::string IntArray::describe(int64_t max_values) const {
  std::ostringstream out;
  out << "int32" << shape_string(shape) << " {";
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) {
    if (n > max_values && i == max_values / 2) {
      out << ", …";
      i = n - max_values / 2;
    }
    out << (i ? ", " : "") << values[static_cast<size_t>(i)];
  }
  out << "}";
  return out.str();
}

}  // namespace hybridtb
