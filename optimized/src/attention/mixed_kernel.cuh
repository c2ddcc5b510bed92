// The mixed kernel: the tensor-core prefill items and tensor-core decode CTAs of one step in one
// grid, so that compute-bound prefill CTAs and bandwidth-bound decode CTAs share the SMs instead of
// running one kernel after the other. CTA b runs p.mixed_items[b]: a prefill item through
// prefill_mma_body (prefill_mma_kernel.cuh) or one CTA of the decode grid — decode item, kv head,
// head pass — through decode_mma_body (decode_mma_kernel.cuh). The bodies are the separate
// kernels' own, so every row gets the same bits either way; the planner's CTA order
// (plan_mixed_order in attention_work_plan.cpp) interleaves the kinds.
//
// Instantiated where the two bodies agree on the block (attention_caps.h mixed_supported): 16-bit
// caches of the model dtype, head sizes 64 / 128 (both bodies run 4 warps), 8 query heads per
// decode CTA (NT 1), the head size's default prefill variant; Plain is the step's (one logit
// variant for both bodies). Dynamic shared memory is the larger of the two bodies' (D 128: the
// decode ring's 96 KiB over the prefill's 80 KiB; D 64: 64 over 56 KiB). Split decode rows are
// finished by decode_combine_kernel, a programmatic dependent launch of this kernel as of the
// decode kernel.
#pragma once

#include "attention/attention_caps.h"
#include "attention/decode_mma_kernel.cuh"
#include "attention/prefill_mma_kernel.cuh"
#include "common/pdl.cuh"

namespace hybridtb::cuda {

constexpr int kMixedDecodeNt = 1;  // 8 query heads per decode CTA
__host__ __device__ constexpr int mixed_prefill_variant(int d) { return prefill_default_variant(d); }
__host__ __device__ constexpr int mixed_smem_bytes(int d) {
  const auto prefill = static_cast<int>(prefill_smem_bytes(d, mixed_prefill_variant(d), false));
  const int decode = decode_mma_smem_bytes(d, false);
  return prefill > decode ? prefill : decode;
}
__host__ __device__ constexpr int mixed_min_blocks(int d) {
  const int prefill = prefill_config(d, mixed_prefill_variant(d)).min_blocks;
  const int decode = decode_mma_config(d, false, kMixedDecodeNt).min_ctas;
  return prefill > decode ? prefill : decode;
}

// T: model dtype (and cache element); D: head size 64 or 128; Plain: no soft cap and no ALiBi.
template <typename T, int D, bool Plain>
__global__ void __launch_bounds__(kPrefillThreads, mixed_min_blocks(D))
    mixed_kernel(const __grid_constant__ AttentionParams p, int block_shift) {
  static_assert(D == 64 || D == 128, "head sizes whose prefill and decode blocks agree");
  static_assert(32 * decode_mma_config(D, false, kMixedDecodeNt).warps == kPrefillThreads,
                "both bodies run the same number of threads");
  pdl_allow_dependents();  // the combine kernel may launch once every CTA is resident (it waits for us)
  const MixedItem cta = p.mixed_items[blockIdx.x];
  if (cta.kind == MixedKind::kPrefill) {  // (uniform per CTA)
    prefill_mma_body<T, D, Plain, mixed_prefill_variant(D), T>(p, cta.index);
  } else {
    decode_mma_body<T, D, kMixedDecodeNt, Plain, T>(p, block_shift, cta.index, cta.kv_head, cta.head_pass);
  }
}

}  // namespace hybridtb::cuda
