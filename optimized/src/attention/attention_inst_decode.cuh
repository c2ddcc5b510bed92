// Dispatch of the decode kernel over (head size, heads per pass) for one cache element type;
// included by the attention_inst_decode_<kind>.cu files (one per element type).
#pragma once

#include "attention/attention_launch.h"
#include "attention/decode_kernel.cuh"
#include "common/cuda_check.h"

namespace hybridtb::cuda {

template <typename KvT, int D, int HPP>
void launch_decode_instance(const AttentionParams& params, int64_t num_items, int block_shift, cudaStream_t stream) {
  const int passes = (params.queries_per_kv + HPP - 1) / HPP;
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>(passes));
  decode_attention_kernel<KvT, D, HPP><<<grid, kDecodeThreads, 0, stream>>>(params, block_shift);
  HYBRIDTB_CUDA_CHECK_LAUNCH();
}

template <typename KvT, int D>
void launch_decode_d(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                     cudaStream_t stream) {
  switch (heads_per_pass) {
    case 1:
      return launch_decode_instance<KvT, D, 1>(params, num_items, block_shift, stream);
    case 4:
      return launch_decode_instance<KvT, D, 4>(params, num_items, block_shift, stream);
    case 8:
      return launch_decode_instance<KvT, D, 8>(params, num_items, block_shift, stream);
    default:
      throw Error(detail::concat("decode attention: no instance for ", heads_per_pass, " heads per pass"));
  }
}

template <typename KvT>
void launch_decode_typed(const AttentionParams& params, int64_t num_items, int heads_per_pass, int block_shift,
                         cudaStream_t stream) {
  switch (params.head_size) {
    case 64:
      return launch_decode_d<KvT, 64>(params, num_items, heads_per_pass, block_shift, stream);
    case 128:
      return launch_decode_d<KvT, 128>(params, num_items, heads_per_pass, block_shift, stream);
    case 256:
      return launch_decode_d<KvT, 256>(params, num_items, heads_per_pass, block_shift, stream);
    default:
      throw Error(detail::concat("decode attention: no instance for head size ", params.head_size));
  }
}

}  // namespace hybridtb::cuda
