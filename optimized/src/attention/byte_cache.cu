// cast_byte_elements / cast_byte_words: the tensor-core kernels' casts of a 1-byte cache
// (byte_cache.cuh: cast_16, the prefill kernel's per-tile cast in element order, and ByteCast::word,
// the decode kernel's cast into fragment pairs), run over a plain buffer so that tests can check
// them on every stored byte value.
#include "attention/attention_launch.h"
#include "attention/byte_cache.cuh"
#include "common/cuda_check.h"
#include "hybridtb/error.h"

namespace hybridtb::cuda {

namespace {

// Every kind, whatever the scale mode that stores it.
template <typename F>
__device__ __forceinline__ void with_any_kind(ElementKind kind, F&& f) {
  if (kind == ElementKind::kInt8) {
    f(std::integral_constant<ByteKind, ByteKind::kInt8>{});
  } else if (kind == ElementKind::kFp8E5M2) {
    f(std::integral_constant<ByteKind, ByteKind::kFp8E5M2>{});
  } else {
    f(std::integral_constant<ByteKind, ByteKind::kFp8E4M3>{});
  }
}

template <typename T>
__global__ void cast_bytes_kernel(const uint4* bytes, uint4* out, int64_t chunks, ElementKind kind) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= chunks) return;
  with_any_kind(kind, [&](auto k) {
    uint4 pair[2];
    cast_16<T, decltype(k)::value>(bytes[i], pair);
    out[2 * i] = pair[0];
    out[2 * i + 1] = pair[1];
  });
}

template <typename T>
__global__ void cast_words_kernel(const uint32_t* words, uint2* out, int64_t count, ElementKind kind) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  with_any_kind(kind, [&](auto k) {
    uint2 pairs;
    ByteCast<T, decltype(k)::value>::word(words[i], pairs.x, pairs.y);
    out[i] = pairs;
  });
}

void check_cast_arguments(const char* what, int64_t count, int64_t multiple, ElementKind kind, ElementKind model) {
  HYBRIDTB_CHECK(count % multiple == 0, what, ": count must be a multiple of ", multiple, ", got ", count);
  HYBRIDTB_CHECK(is_byte_element(kind), what, ": the stored kind must be fp8 or int8");
  HYBRIDTB_CHECK(model == ElementKind::kFloat16 || model == ElementKind::kBFloat16, what,
                 ": the model dtype must be float16 or bfloat16");
}

}  // namespace

void cast_byte_elements(const void* bytes, void* out, int64_t count, ElementKind kind, ElementKind model,
                        cudaStream_t stream) {
  check_cast_arguments("cast_byte_elements", count, 16, kind, model);
  const int64_t chunks = count / 16;
  if (chunks == 0) return;
  const auto blocks = static_cast<unsigned>((chunks + 127) / 128);
  const auto* in = static_cast<const uint4*>(bytes);
  auto* dst = static_cast<uint4*>(out);
  if (model == ElementKind::kFloat16) {
    cast_bytes_kernel<__half><<<blocks, 128, 0, stream>>>(in, dst, chunks, kind);
  } else {
    cast_bytes_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(in, dst, chunks, kind);
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

void cast_byte_words(const void* bytes, void* out, int64_t count, ElementKind kind, ElementKind model,
                     cudaStream_t stream) {
  check_cast_arguments("cast_byte_words", count, 4, kind, model);
  const int64_t words = count / 4;
  if (words == 0) return;
  const auto blocks = static_cast<unsigned>((words + 127) / 128);
  const auto* in = static_cast<const uint32_t*>(bytes);
  auto* dst = static_cast<uint2*>(out);
  if (model == ElementKind::kFloat16) {
    cast_words_kernel<__half><<<blocks, 128, 0, stream>>>(in, dst, words, kind);
  } else {
    cast_words_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(in, dst, words, kind);
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda
