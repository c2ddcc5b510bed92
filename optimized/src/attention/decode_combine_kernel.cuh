// The second pass of split decode rows (decode_kernel.cuh): the partial softmax states of a row's
// splits reduced in split order (deterministic), then sinks, normalisation and fp8 output.
#pragma once

#include "attention/attention_common.cuh"

namespace hybridtb::cuda {

// Finishes split decode rows: one CTA per (row, query head), the splits reduced in split order.
__global__ void __launch_bounds__(128) decode_combine_kernel(const __grid_constant__ AttentionParams p) {
  const CombineItem item = p.combine_items[blockIdx.x];
  const int head = static_cast<int>(blockIdx.y);
  const int d = p.head_size;
  float mx = kNegInf;
  for (int s = 0; s < item.num_splits; ++s) {
    mx = fmaxf(mx, p.partial_ml[(static_cast<int64_t>(item.first_slot + s) * p.num_heads + head) * 2]);
  }
  float l = 0.0f;
  for (int s = 0; s < item.num_splits; ++s) {
    const int64_t slot = static_cast<int64_t>(item.first_slot + s) * p.num_heads + head;
    l += p.partial_ml[slot * 2 + 1] * (mx == kNegInf ? 0.0f : exp_diff(p.partial_ml[slot * 2], mx));
  }
  const RowScale f = row_finalize(p, head, mx, l);
  for (int c = static_cast<int>(threadIdx.x); c < d; c += static_cast<int>(blockDim.x)) {
    float a = 0.0f;
    for (int s = 0; s < item.num_splits; ++s) {
      const int64_t slot = static_cast<int64_t>(item.first_slot + s) * p.num_heads + head;
      const float w = mx == kNegInf ? 0.0f : exp_diff(p.partial_ml[slot * 2], mx);
      a += p.partial_acc[slot * d + c] * w;
    }
    const float o = f.zero != 0.0f ? 0.0f : a * f.acc_factor;
    store_element(p.output, static_cast<int64_t>(item.token) * p.o_stride_token + static_cast<int64_t>(head) * p.o_stride_head + c,
                  p.q_kind, output_value(p, o));
  }
}

}  // namespace hybridtb::cuda
