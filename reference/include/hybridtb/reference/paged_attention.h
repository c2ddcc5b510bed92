// Reference paged attention and KV-cache write (the semantics of vLLM's Triton backend:
// triton_unified_attention and reshape_and_cache_flash). Host tensors only; float64 arithmetic; deterministic.
#pragma once

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/tensor.h"

namespace hybridtb::reference {

// reshape_and_cache_flash (+ the per-token-head variant): writes key/value rows
// [0, num_actual_tokens) into tensors.kv_cache at slot_mapping, skipping slot −1 (rows at or past
// num_actual_tokens are skipped whatever their slot). Bit-exact with the kernels: auto copies the
// bits; fp8 per-tensor stores fp8(float32(x) / scale); per-token-head modes store
// clamp(x · (1/scale)) with scale = max(max|x| / QMAX, 1e−6) per (token, kv head), int8 truncated
// toward zero, and write the scale into k/v_scale_cache. encoder_only layers write nothing.
void write_kv_cache(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors);

// unified_attention over the varlen batch (decoder: keys read from the paged cache, which must
// already hold this step's keys; encoder_only: context_attention_fwd, bidirectional over each
// request's own key/value rows, no cache). Float64 from the exact (dequantised) stored values;
// visibility is hybridtb/spec/visibility.h's key_visible(). Writes rows [0, num_actual_tokens)
// of `output` ([T, Hq, D], any float dtype, rounded by store_from_double) and nothing else. With
// tensors.output_scale (decoder only) the stored values are clamp(o / output_scale, ±448), i.e.
// in the fp8 quantised domain. Throws NotSupported for encoder_only with a quantized KV cache.
void paged_attention(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors,
                     const TensorView& output);

}  // namespace hybridtb::reference
