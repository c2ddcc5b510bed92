// Reference KV-cache write: vLLM's reshape_and_cache_flash and its per-token-head quantising
// variant (triton_reshape_and_cache_flash with per-token-head scales). The bytes written are bit-exact: the
// quantisers do the kernels' float32 arithmetic literally and round through dtype.h's casts.
// Checked against independent per-element expectations by tests/attention (ctest -L attention).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/reference/paged_attention.h"
#include "hybridtb/spec/kv_cache.h"

namespace hybridtb::reference {
namespace {

// Element `index` (an offset in elements) of `view` as a byte pointer.
uint8_t* element_ptr(const TensorView& view, int64_t index) {
  return static_cast<uint8_t*>(view.data()) + index * element_size(view.dtype());
}

// One (token, kv head) row: `source` row [D] into cache row [D] with the same dtype, bit for bit.
void copy_row(const TensorView& source, int64_t src, const TensorView& cache, int64_t dst, int64_t d) {
  const int64_t size = element_size(source.dtype());
  for (int64_t i = 0; i < d; ++i) {
    std::memcpy(element_ptr(cache, dst + i * cache.stride(4)), element_ptr(source, src + i * source.stride(2)),
                static_cast<size_t>(size));
  }
}

uint8_t encode_fp8(DType storage, float x) {
  return storage == DType::kFloat8E4M3 ? float_to_fp8_e4m3(x) : float_to_fp8_e5m2(x);
}

// fp8 per-tensor (FP8_KV_CACHE): stored = fp8(x / scale) with an IEEE float32 division and the
// store's round-to-nearest-even saturating cast.
void quantise_row_per_tensor(const std::vector<float>& x, float scale, const TensorView& cache, int64_t dst) {
  for (size_t i = 0; i < x.size(); ++i) {
    *element_ptr(cache, dst + static_cast<int64_t>(i) * cache.stride(4)) = encode_fp8(cache.dtype(), x[i] / scale);
  }
}

// Per-token-head (triton_reshape_and_cache_flash_per_token_head_quant), all in float32:
// scale = max(max_d |x_d| / QMAX, 1e−6); stored = clamp(x_d · (1/scale), QMIN, QMAX), cast to int8
// by truncation toward zero (Triton's fptosi) or to fp8 e4m3fn by the saturating RNE cast.
// Returns the scale, which goes into the scale cache.
float quantise_row_per_token_head(const std::vector<float>& x, const TensorView& cache, int64_t dst) {
  const bool is_int8 = cache.dtype() == DType::kInt8;
  const float qmax = is_int8 ? 127.0f : static_cast<float>(fp8_max(DType::kFloat8E4M3));
  const float qmin = is_int8 ? -128.0f : -qmax;
  float absmax = 0.0f;
  for (float v : x) absmax = std::max(absmax, std::fabs(v));
  const float scale = std::max(absmax / qmax, 1e-6f);
  const float inverse = 1.0f / scale;
  for (size_t i = 0; i < x.size(); ++i) {
    const float y = std::clamp(x[i] * inverse, qmin, qmax);
    uint8_t* out = element_ptr(cache, dst + static_cast<int64_t>(i) * cache.stride(4));
    if (is_int8) {
      // cvt.rzi of NaN gives 0 on NVIDIA GPUs; NaN inputs are not expected, but a C++ cast of NaN
      // would be undefined.
      const auto q = static_cast<int8_t>(std::isnan(y) ? 0.0f : y);
      std::memcpy(out, &q, 1);
    } else {
      *out = float_to_fp8_e4m3(y);
    }
  }
  return scale;
}

void check_inputs(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors) {
  const int64_t t = batch.num_tokens();
  const int64_t hkv = config.num_kv_heads;
  const int64_t d = config.head_size;
  HYBRIDTB_CHECK(batch.num_actual_tokens >= 0 && batch.num_actual_tokens <= t, "num_actual_tokens (",
                 batch.num_actual_tokens, ") must lie in [0, ", t, "]");
  const Shape rows{t, hkv, d};
  HYBRIDTB_CHECK(tensors.key.shape() == rows && tensors.value.shape() == rows, "key and value must be ",
                 shape_to_string(rows), ", got ", tensors.key.describe(), " and ", tensors.value.describe());
  HYBRIDTB_CHECK(tensors.key.dtype() == config.dtype && tensors.value.dtype() == config.dtype,
                 "key and value must be ", to_string(config.dtype), ", got ", tensors.key.describe(), " and ",
                 tensors.value.describe());
  HYBRIDTB_CHECK(tensors.key.device() == Device::kHost && tensors.value.device() == Device::kHost,
                 "write_kv_cache needs host tensors");
  spec::bind_kv_cache(config, tensors, Device::kHost);
}

}  // namespace

void write_kv_cache(const AttentionConfig& config, const BatchDescription& batch, const StepTensors& tensors) {
  // vLLM's do_kv_cache_update returns at once for encoder attention: there is no cache.
  if (config.attn_type == AttnType::kEncoderOnly) return;
  check_inputs(config, batch, tensors);

  const TensorView& cache = tensors.kv_cache;
  const int64_t block_size = config.block_size;
  const int64_t d = config.head_size;
  std::vector<float> x(static_cast<size_t>(d));
  // Rows at or past num_actual_tokens are CUDA-graph padding: skipped whatever their slot says.
  for (int64_t t = 0; t < batch.num_actual_tokens; ++t) {
    const int64_t slot = batch.slot_mapping[static_cast<size_t>(t)];
    if (slot < 0) continue;  // PAD_SLOT_ID
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    HYBRIDTB_CHECK(block < cache.size(0), "slot_mapping[", t, "] = ", slot, " is past the cache's ", cache.size(0),
                   " blocks of ", block_size);
    for (int64_t h = 0; h < config.num_kv_heads; ++h) {
      for (int half = 0; half < 2; ++half) {
        const TensorView& source = half == 0 ? tensors.key : tensors.value;
        const int64_t src = source.offset({t, h, 0});
        const int64_t dst = cache.offset({block, half, offset, h, 0});
        if (config.kv_cache_dtype == KvCacheDtype::kAuto) {
          copy_row(source, src, cache, dst, d);
          continue;
        }
        // Model dtypes (float32/16, bfloat16) widen to float exactly: the kernels' fp32 registers.
        for (int64_t i = 0; i < d; ++i) {
          x[static_cast<size_t>(i)] =
              static_cast<float>(load_as_double(source.data(), source.dtype(), src + i * source.stride(2)));
        }
        if (is_per_token_head(config.kv_cache_dtype)) {
          const float scale = quantise_row_per_token_head(x, cache, dst);
          const TensorView& scales = half == 0 ? tensors.k_scale_cache : tensors.v_scale_cache;
          static_cast<float*>(scales.data())[scales.offset({block, offset, h})] = scale;
        } else {
          quantise_row_per_tensor(x, half == 0 ? tensors.k_scale : tensors.v_scale, cache, dst);
        }
      }
    }
  }
}

}  // namespace hybridtb::reference
