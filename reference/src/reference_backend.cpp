// ReferenceBackend: wires the reference builders and the reference attention into the Backend
// interface. Host memory only; writes float64 outputs (ground truth is never rounded).
#include "hybridtb/reference/reference_backend.h"

#include <cstring>

#include "hybridtb/error.h"
#include "hybridtb/reference/metadata_builders.h"
#include "hybridtb/reference/paged_attention.h"

namespace hybridtb::reference {

namespace {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(const BackendSettings& settings) : settings_(settings) {
    validate(settings_.attention);
    validate(settings_.builder);
  }

  std::string name() const override { return "reference"; }
  Device device() const override { return Device::kHost; }
  DType output_dtype() const override { return DType::kFloat64; }

  Tensor allocate(DType dtype, const Shape& shape) override { return Tensor::host(dtype, shape); }

  void copy(const TensorView& dst, const TensorView& src) override {
    HYBRIDTB_CHECK(dst.device() == Device::kHost && src.device() == Device::kHost,
                   "reference backend: copies are host to host, got ", src.describe(), " → ", dst.describe());
    HYBRIDTB_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() &&
                       src.is_contiguous(),
                   "reference backend: copy needs equal contiguous views, got ", src.describe(), " → ",
                   dst.describe());
    if (src.nbytes() > 0) std::memmove(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
  }

  void synchronize() override {}

  HybridMetadata build_metadata(const BatchDescription& batch) override {
    return build_hybrid_metadata(settings_.attention, settings_.builder, batch);
  }

  void write_kv_cache(const BatchDescription& batch, const StepTensors& tensors) override {
    reference::write_kv_cache(settings_.attention, batch, tensors);
  }

  void attention_forward(const HybridMetadata& /*metadata: the reference computes the same output on
                                                  the 2D and 3D paths, so it needs no plan*/,
                         const BatchDescription& batch, const StepTensors& tensors,
                         const TensorView& output) override {
    paged_attention(settings_.attention, batch, tensors, output);
  }

 private:
  BackendSettings settings_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const BackendSettings& settings) {
  return std::make_unique<ReferenceBackend>(settings);
}

}  // namespace hybridtb::reference
