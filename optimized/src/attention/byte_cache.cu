// cast_byte_elements: the tensor-core kernels' per-tile cast of a 1-byte cache (byte_cache.cuh
// cast_16), run over a plain buffer so that tests can check it on every stored byte value.
#include "attention/attention_launch.h"
#include "attention/byte_cache.cuh"
#include "common/cuda_check.h"
#include "hybridtb/error.h"

namespace hybridtb::cuda {

namespace {

template <typename T>
__global__ void cast_bytes_kernel(const uint4* bytes, uint4* out, int64_t chunks, ElementKind kind) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= chunks) return;
  uint4 pair[2];
  cast_16<T>(bytes[i], kind, pair);
  out[2 * i] = pair[0];
  out[2 * i + 1] = pair[1];
}

}  // namespace

void cast_byte_elements(const void* bytes, void* out, int64_t count, ElementKind kind, ElementKind model,
                        cudaStream_t stream) {
  HYBRIDTB_CHECK(count % 16 == 0, "cast_byte_elements: count must be a multiple of 16, got ", count);
  HYBRIDTB_CHECK(is_byte_element(kind), "cast_byte_elements: the stored kind must be fp8 or int8");
  const int64_t chunks = count / 16;
  if (chunks == 0) return;
  const auto blocks = static_cast<unsigned>((chunks + 127) / 128);
  const auto* in = static_cast<const uint4*>(bytes);
  auto* dst = static_cast<uint4*>(out);
  if (model == ElementKind::kFloat16) {
    cast_bytes_kernel<__half><<<blocks, 128, 0, stream>>>(in, dst, chunks, kind);
  } else if (model == ElementKind::kBFloat16) {
    cast_bytes_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(in, dst, chunks, kind);
  } else {
    throw Error("cast_byte_elements: the model dtype must be float16 or bfloat16");
  }
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace hybridtb::cuda
