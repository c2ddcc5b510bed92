// Instantiations of the generic attention kernel (one per cache element kind) and the
// decode-combine kernel.
#include "attention/attention_launch.h"
#include "attention/decode_combine_kernel.cuh"
#include "attention/generic_kernel.cuh"
#include "common/cuda_check.h"
#include "common/kernel_attributes.h"

namespace hybridtb::cuda {

namespace {

template <ElementKind KV>
void launch_generic_kind(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  const auto smem = static_cast<size_t>(generic_smem_bytes(params.head_size));
  allow_dynamic_smem(generic_attention_kernel<KV>, smem);
  generic_attention_kernel<KV><<<static_cast<unsigned>(num_items), kGenericThreads, smem, stream>>>(params);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t generic_max_head_size() { return kGenericMaxHeadSize; }

void launch_generic_attention(const AttentionParams& params, ElementKind kv_kind, int64_t num_items,
                              cudaStream_t stream) {
  if (num_items == 0) return;
  switch (kv_kind) {
    case ElementKind::kFloat32:
      return launch_generic_kind<ElementKind::kFloat32>(params, num_items, stream);
    case ElementKind::kFloat16:
      return launch_generic_kind<ElementKind::kFloat16>(params, num_items, stream);
    case ElementKind::kBFloat16:
      return launch_generic_kind<ElementKind::kBFloat16>(params, num_items, stream);
    case ElementKind::kFp8E4M3:
      return launch_generic_kind<ElementKind::kFp8E4M3>(params, num_items, stream);
    case ElementKind::kFp8E5M2:
      return launch_generic_kind<ElementKind::kFp8E5M2>(params, num_items, stream);
    case ElementKind::kInt8:
      return launch_generic_kind<ElementKind::kInt8>(params, num_items, stream);
  }
  throw Error("launch_generic_attention: unknown cache element kind");
}

void launch_decode_combine(const AttentionParams& params, int64_t num_items, cudaStream_t stream) {
  if (num_items == 0) return;
  HYBRIDTB_CHECK(params.head_size % 4 == 0 && params.head_size <= 4 * kCombineThreads,
                 "decode combine: head size ", params.head_size, " is not a multiple of 4 up to ",
                 4 * kCombineThreads);
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(params.num_heads));
  launch_pdl(decode_combine_kernel, grid, dim3(kCombineThreads), 0, stream, params);
}

}  // namespace hybridtb::cuda
