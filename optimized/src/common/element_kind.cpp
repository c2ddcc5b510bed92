// element_kind (element_kind.h).
#include "common/element_kind.h"

#include "hybridtb/error.h"

namespace hybridtb::cuda {

ElementKind element_kind(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ElementKind::kFloat32;
    case DType::kFloat16:
      return ElementKind::kFloat16;
    case DType::kBFloat16:
      return ElementKind::kBFloat16;
    case DType::kFloat8E4M3:
      return ElementKind::kFp8E4M3;
    case DType::kFloat8E5M2:
      return ElementKind::kFp8E5M2;
    case DType::kInt8:
      return ElementKind::kInt8;
    default:
      throw NotSupported(detail::concat("cuda backend: no kernel element type for ", to_string(dtype)));
  }
}

}  // namespace hybridtb::cuda
