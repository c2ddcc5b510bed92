// TensorView / Tensor: shape and stride bookkeeping plus the few host helpers every tool needs.
#include "hybridtb/tensor.h"

#include <cstring>
#include <numeric>
#include <sstream>

#include "hybridtb/error.h"

namespace hybridtb {

std::string_view to_string(Device device) { return device == Device::kHost ? "host" : "cuda"; }

std::string shape_to_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

namespace {
Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i) + 1] * shape[static_cast<size_t>(i) + 1];
  }
  return strides;
}
}  // namespace

TensorView::TensorView(void* data, DType dtype, const Shape& shape, Device device)
    : TensorView(data, dtype, shape, contiguous_strides(shape), device) {}

TensorView::TensorView(void* data, DType dtype, const Shape& shape, const Shape& strides, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  HYBRIDTB_CHECK(shape.size() <= kMaxRank, "TensorView: rank ", shape.size(), " exceeds ", kMaxRank);
  HYBRIDTB_CHECK(strides.size() == shape.size(), "TensorView: ", strides.size(), " strides for rank ", shape.size());
  for (int i = 0; i < rank_; ++i) {
    HYBRIDTB_CHECK(shape[static_cast<size_t>(i)] >= 0, "TensorView: negative extent in shape ", shape_to_string(shape));
    shape_[static_cast<size_t>(i)] = shape[static_cast<size_t>(i)];
    strides_[static_cast<size_t>(i)] = strides[static_cast<size_t>(i)];
  }
}

int64_t TensorView::size(int dim) const {
  HYBRIDTB_CHECK(dim >= 0 && dim < rank_, "TensorView::size: dim ", dim, " out of range for rank ", rank_);
  return shape_[static_cast<size_t>(dim)];
}

int64_t TensorView::stride(int dim) const {
  HYBRIDTB_CHECK(dim >= 0 && dim < rank_, "TensorView::stride: dim ", dim, " out of range for rank ", rank_);
  return strides_[static_cast<size_t>(dim)];
}

Shape TensorView::shape() const { return Shape(shape_.begin(), shape_.begin() + rank_); }
Shape TensorView::strides() const { return Shape(strides_.begin(), strides_.begin() + rank_); }

int64_t TensorView::numel() const {
  if (data_ == nullptr) return 0;  // an empty (absent) view has no elements, whatever its rank
  return std::accumulate(shape_.begin(), shape_.begin() + rank_, int64_t{1}, std::multiplies<>());
}

bool TensorView::is_contiguous() const { return strides() == contiguous_strides(shape()); }

TensorView TensorView::slice_rows(int64_t begin, int64_t end) const {
  HYBRIDTB_CHECK(rank_ >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "TensorView::slice_rows: [", begin,
                 ", ", end, ") out of range for ", describe());
  Shape new_shape = shape();
  new_shape[0] = end - begin;
  auto* base = static_cast<unsigned char*>(data_) + begin * strides_[0] * element_size(dtype_);
  return TensorView(base, dtype_, new_shape, strides(), device_);
}

int64_t TensorView::offset(std::initializer_list<int64_t> index) const {
  HYBRIDTB_CHECK(static_cast<int>(index.size()) == rank_, "TensorView::offset: ", index.size(),
                 " indices for rank ", rank_);
  int64_t result = 0;
  int dim = 0;
  for (int64_t i : index) {
    HYBRIDTB_CHECK(0 <= i && i < shape_[static_cast<size_t>(dim)], "TensorView::offset: index ", i,
                   " out of range in dim ", dim, " of ", describe());
    result += i * strides_[static_cast<size_t>(dim)];
    ++dim;
  }
  return result;
}

std::string TensorView::describe() const {
  return detail::concat(to_string(dtype_), shape_to_string(shape()), " on ", to_string(device_));
}

Tensor Tensor::host(DType dtype, const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    HYBRIDTB_CHECK(extent >= 0, "Tensor::host: negative extent in shape ", shape_to_string(shape));
    count *= extent;
  }
  const auto bytes = static_cast<size_t>(count * element_size(dtype));
  // One extra byte keeps the pointer non-null for empty tensors, so "empty()" means "absent".
  std::shared_ptr<void> storage(new unsigned char[bytes + 1](), std::default_delete<unsigned char[]>());
  return Tensor(storage, TensorView(storage.get(), dtype, shape));
}

namespace {
// Visits every element offset of a host view in row-major order.
template <typename F>
void for_each_offset(const TensorView& view, F&& f) {
  const int rank = view.rank();
  if (view.numel() == 0) return;
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  const Shape shape = view.shape();
  const Shape strides = view.strides();
  for (int64_t linear = 0; linear < view.numel(); ++linear) {
    int64_t off = 0;
    for (int d = 0; d < rank; ++d) off += index[static_cast<size_t>(d)] * strides[static_cast<size_t>(d)];
    f(linear, off);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      index[static_cast<size_t>(d)] = 0;
    }
  }
}

void require_host(const TensorView& view, const char* what) {
  HYBRIDTB_CHECK(view.device() == Device::kHost, what, ": needs a host tensor, got ", view.describe());
}
}  // namespace

Tensor clone_host(const TensorView& source) {
  if (source.empty()) return {};
  require_host(source, "clone_host");
  Tensor copy = Tensor::host(source.dtype(), source.shape());
  const int64_t size = element_size(source.dtype());
  if (source.is_contiguous()) {
    if (source.nbytes() > 0) std::memcpy(copy.data(), source.data(), static_cast<size_t>(source.nbytes()));
    return copy;
  }
  const auto* src = static_cast<const unsigned char*>(source.data());
  auto* dst = static_cast<unsigned char*>(copy.data());
  for_each_offset(source, [&](int64_t linear, int64_t off) {
    std::memcpy(dst + linear * size, src + off * size, static_cast<size_t>(size));
  });
  return copy;
}

Tensor convert_host(const TensorView& source, DType dtype) {
  require_host(source, "convert_host");
  Tensor result = Tensor::host(dtype, source.shape());
  for_each_offset(source, [&](int64_t linear, int64_t off) {
    store_from_double(result.data(), dtype, linear, load_as_double(source.data(), source.dtype(), off));
  });
  return result;
}

void fill_host(const TensorView& view, double value) {
  require_host(view, "fill_host");
  for_each_offset(view, [&](int64_t, int64_t off) { store_from_double(view.data(), view.dtype(), off, value); });
}

bool bitwise_equal(const TensorView& a, const TensorView& b) {
  require_host(a, "bitwise_equal");
  require_host(b, "bitwise_equal");
  if (a.empty() || b.empty()) return a.empty() && b.empty();
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = clone_host(a);
  const Tensor cb = clone_host(b);
  return ca.nbytes() == 0 || std::memcmp(ca.data(), cb.data(), static_cast<size_t>(ca.nbytes())) == 0;
}

}  // namespace hybridtb
