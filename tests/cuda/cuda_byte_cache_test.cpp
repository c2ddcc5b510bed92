// The per-tile cast of a 1-byte KV cache on the tensor-core kernels (optimized/src/attention/
// byte_cache.cuh cast_16, run through cuda::cast_byte_elements): every stored byte value of fp8 e4m3,
// fp8 e5m2 and int8 becomes exactly the value the reference decodes (hybridtb/dtype.h), sign of zero
// included, in float16 and in bfloat16 — subnormal fp8 values too. The NaN and infinity encodings
// of fp8 are left out: the KV write saturates and never stores them. Skips with the reason on a
// machine without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_launch.h"
#include "cuda_compare.h"
#include "hybridtb/dtype.h"
#include "hybridtb/error.h"

namespace hybridtb::testing {
namespace {

class CudaByteCacheCast : public CudaFixture<> {};

cuda::ElementKind kind_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3:
      return cuda::ElementKind::kFp8E4M3;
    case DType::kFloat8E5M2:
      return cuda::ElementKind::kFp8E5M2;
    case DType::kInt8:
      return cuda::ElementKind::kInt8;
    case DType::kFloat16:
      return cuda::ElementKind::kFloat16;
    default:
      return cuda::ElementKind::kBFloat16;
  }
}

TEST_F(CudaByteCacheCast, EveryStoredValueIsExact) {
  std::vector<uint8_t> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = static_cast<uint8_t>(b);
  void* d_bytes = nullptr;
  void* d_out = nullptr;
  check_cuda(cudaMalloc(&d_bytes, bytes.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&d_out, 2 * bytes.size()), "cudaMalloc");
  check_cuda(cudaMemcpy(d_bytes, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  for (const DType stored : {DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kInt8}) {
    for (const DType model : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(to_string(stored)) + " → " + std::string(to_string(model)));
      cuda::cast_byte_elements(d_bytes, d_out, 256, kind_of(stored), kind_of(model), nullptr);
      std::vector<uint16_t> out(256);
      check_cuda(cudaMemcpy(out.data(), d_out, 2 * out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      int compared = 0;
      int subnormal = 0;
      for (int b = 0; b < 256; ++b) {
        const double expected = load_as_double(bytes.data(), stored, b);
        if (!std::isfinite(expected)) continue;
        const double actual = load_as_double(out.data(), model, b);
        EXPECT_EQ(actual, expected) << "byte 0x" << std::hex << b;
        EXPECT_EQ(std::signbit(actual), std::signbit(expected)) << "byte 0x" << std::hex << b;
        ++compared;
        const int exponent = stored == DType::kFloat8E4M3 ? (b >> 3) & 0xf : (b >> 2) & 0x1f;
        if (stored != DType::kInt8 && expected != 0 && exponent == 0) {
          ++subnormal;
        }
      }
      EXPECT_GE(compared, 248);
      if (stored != DType::kInt8) {
        EXPECT_GT(subnormal, 0) << "the subnormal encodings were compared";
      }
    }
  }
  check_cuda(cudaFree(d_bytes), "cudaFree");
  check_cuda(cudaFree(d_out), "cudaFree");
}

// Checked before anything reaches the device: runs without a GPU too.
TEST(ByteCacheCast, RejectsCountsThatAreNotWholeChunks) {
  EXPECT_THROW(cuda::cast_byte_elements(nullptr, nullptr, 17, cuda::ElementKind::kFp8E4M3,
                                        cuda::ElementKind::kBFloat16, nullptr),
               Error);
}

}  // namespace
}  // namespace hybridtb::testing
