// Tensors: a non-owning strided view (TensorView) and an owning host or device buffer (Tensor).
//
// Views carry the element type, the shape, the strides (in elements) and the device the memory
// lives on. They are cheap to copy and never allocate, so they can cross the backend interface
// and, for the CUDA backend, be turned into kernel parameters. Shapes are row-major by default,
// as in PyTorch and vLLM.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hybridtb/dtype.h"

namespace hybridtb {

enum class Device : uint8_t { kHost, kCuda };
std::string_view to_string(Device device);

using Shape = std::vector<int64_t>;
std::string shape_to_string(const Shape& shape);  // "[3, 8, 128]"

class TensorView {
 public:
  static constexpr int kMaxRank = 6;

  TensorView() = default;
  // A contiguous row-major view of `shape`.
  TensorView(void* data, DType dtype, const Shape& shape, Device device = Device::kHost);
  // A view with explicit strides (in elements).
  TensorView(void* data, DType dtype, const Shape& shape, const Shape& strides, Device device);

  bool empty() const { return data_ == nullptr; }
  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  int64_t size(int dim) const;
  int64_t stride(int dim) const;
  Shape shape() const;
  Shape strides() const;
  int64_t numel() const;  // 0 for an empty view
  int64_t nbytes() const { return numel() * element_size(dtype_); }
  bool is_contiguous() const;

  // Rows [begin, end) of dimension 0.
  TensorView slice_rows(int64_t begin, int64_t end) const;
  // Offset (in elements) of a multi-index; the index must be in range.
  int64_t offset(std::initializer_list<int64_t> index) const;

  // "bfloat16[12, 8, 128] on host".
  std::string describe() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::kHost;
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<int64_t, kMaxRank> strides_{};
};

// An owning tensor: a shared buffer plus a view of it. Copying a Tensor shares the buffer (like a
// torch.Tensor); use clone_host() for a deep copy.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<void> storage, TensorView view) : storage_(std::move(storage)), view_(view) {}

  // A zero-filled, contiguous host tensor.
  static Tensor host(DType dtype, const Shape& shape);

  bool empty() const { return view_.empty(); }
  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: a Tensor is usable wherever a view is
  void* data() const { return view_.data(); }
  DType dtype() const { return view_.dtype(); }
  Shape shape() const { return view_.shape(); }
  int64_t size(int dim) const { return view_.size(dim); }
  int64_t numel() const { return view_.numel(); }
  int64_t nbytes() const { return view_.nbytes(); }

  template <typename T>
  T* data_as() const { return static_cast<T*>(view_.data()); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// Deep copy of a host view into a new contiguous host tensor of the same dtype.
Tensor clone_host(const TensorView& source);
// Converts a host view elementwise into a new contiguous host tensor of `dtype` (exact when
// widening; rounds as store_from_double when narrowing).
Tensor convert_host(const TensorView& source, DType dtype);
// Fills every element of a host view with `value` (rounded to the view's dtype).
void fill_host(const TensorView& view, double value);
// True if two host views have the same dtype, shape and bytes (NaN payloads compared as bits).
bool bitwise_equal(const TensorView& a, const TensorView& b);

}  // namespace hybridtb
