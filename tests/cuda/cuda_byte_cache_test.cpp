// The casts of a 1-byte KV cache on the tensor-core kernels (optimized/src/attention/byte_cache.cuh:
// cast_16, the prefill kernel's per-tile cast, through cuda::cast_byte_elements; ByteCast::word, the
// decode kernel's cast into fragment pairs, through cuda::cast_byte_words): every stored byte value
// of fp8 e4m3, fp8 e5m2 and int8 — in each byte position of a word — becomes exactly the value the
// reference decodes (hybridtb/dtype.h), sign of zero included, in float16 and in bfloat16 —
// subnormal fp8 values too. The NaN and infinity encodings of fp8 are left out: the KV write
// saturates and never stores them. Skips with the reason on a machine without a CUDA device.
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

// Every byte value in each of the 4 positions of a word: 4 rotations of 0..255.
std::vector<uint8_t> every_byte_in_every_position() {
  std::vector<uint8_t> bytes(1024);
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 256; ++i) bytes[static_cast<size_t>(256 * r + i)] = static_cast<uint8_t>((i + r) & 0xff);
  }
  return bytes;
}

// Runs `cast` (a cast_byte_* function) over every byte value in every position, for each stored kind
// and model dtype, and checks output element i against stored element source(i).
template <typename Cast, typename Source>
void check_every_value(Cast cast, Source source) {
  const std::vector<uint8_t> bytes = every_byte_in_every_position();
  const auto n = static_cast<int64_t>(bytes.size());
  void* d_bytes = nullptr;
  void* d_out = nullptr;
  check_cuda(cudaMalloc(&d_bytes, bytes.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&d_out, 2 * bytes.size()), "cudaMalloc");
  check_cuda(cudaMemcpy(d_bytes, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  for (const DType stored : {DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kInt8}) {
    for (const DType model : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(to_string(stored)) + " → " + std::string(to_string(model)));
      cast(d_bytes, d_out, n, kind_of(stored), kind_of(model));
      std::vector<uint16_t> out(bytes.size());
      check_cuda(cudaMemcpy(out.data(), d_out, 2 * out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      int compared = 0;
      int subnormal = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t from = source(i);
        const int b = bytes[static_cast<size_t>(from)];
        const double expected = load_as_double(bytes.data(), stored, from);
        if (!std::isfinite(expected)) continue;
        const double actual = load_as_double(out.data(), model, i);
        EXPECT_EQ(actual, expected) << "byte 0x" << std::hex << b << " at " << std::dec << from;
        EXPECT_EQ(std::signbit(actual), std::signbit(expected)) << "byte 0x" << std::hex << b;
        ++compared;
        const int exponent = stored == DType::kFloat8E4M3 ? (b >> 3) & 0xf : (b >> 2) & 0x1f;
        if (stored != DType::kInt8 && expected != 0 && exponent == 0) {
          ++subnormal;
        }
      }
      EXPECT_GE(compared, 4 * 248);
      if (stored != DType::kInt8) {
        EXPECT_GT(subnormal, 0) << "the subnormal encodings were compared";
      }
    }
  }
  check_cuda(cudaFree(d_bytes), "cudaFree");
  check_cuda(cudaFree(d_out), "cudaFree");
}

TEST_F(CudaByteCacheCast, EveryStoredValueIsExact) {
  check_every_value(
      [](const void* in, void* out, int64_t n, cuda::ElementKind kind, cuda::ElementKind model) {
        cuda::cast_byte_elements(in, out, n, kind, model, nullptr);
      },
      [](int64_t i) { return i; });
}

// The decode kernel's word cast: output (lo, hi) = elements (0, 2), (1, 3) of each word.
TEST_F(CudaByteCacheCast, WordPairsAreExact) {
  check_every_value(
      [](const void* in, void* out, int64_t n, cuda::ElementKind kind, cuda::ElementKind model) {
        cuda::cast_byte_words(in, out, n, kind, model, nullptr);
      },
      [](int64_t i) {
        constexpr int64_t kFrom[4] = {0, 2, 1, 3};
        return i / 4 * 4 + kFrom[i % 4];
      });
}

// Checked before anything reaches the device: runs without a GPU too.
TEST(ByteCacheCast, RejectsCountsThatAreNotWholeChunks) {
  EXPECT_THROW(cuda::cast_byte_elements(nullptr, nullptr, 17, cuda::ElementKind::kFp8E4M3,
                                        cuda::ElementKind::kBFloat16, nullptr),
               Error);
  EXPECT_THROW(cuda::cast_byte_words(nullptr, nullptr, 6, cuda::ElementKind::kInt8, cuda::ElementKind::kFloat16,
                                     nullptr),
               Error);
}

}  // namespace
}  // namespace hybridtb::testing
