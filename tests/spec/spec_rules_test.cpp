// The shared rules of harness/spec that no parity run can check (both backends use them): the
// visibility rule against vLLM's masks (a window of W keeps keys p − W + 1 … p, mm_prefix ranges
// override causality and the window, encoder_only is a symmetric window without ranges), its
// interval helpers against the rule itself, the kv_cache_dtype decoder and the KV-cache binding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridtb/error.h"
#include "hybridtb/spec/kv_cache.h"
#include "hybridtb/spec/visibility.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;

bool visible(bool encoder, int64_t window, int64_t seq_len, int64_t p, int64_t k,
             const std::vector<int32_t>& mm = {}) {
  return spec::key_visible<int64_t>(encoder, window, seq_len, mm.empty() ? nullptr : mm.data(),
                                    static_cast<int64_t>(mm.size() / 2), p, k);
}

TEST(SpecVisibility, DecoderWindowKeepsExactlyWKeysEndingAtTheQuery) {
  // vLLM window_size = (W − 1, 0): a query at p = 10 with W = 4 sees 7, 8, 9, 10.
  for (int64_t k = 0; k < 16; ++k) EXPECT_EQ(visible(false, 4, 16, 10, k), k >= 7 && k <= 10) << k;
  // No window: causal, every key up to the query.
  for (int64_t k = 0; k < 16; ++k) EXPECT_EQ(visible(false, 0, 16, 10, k), k <= 10) << k;
  // Nothing at or past seq_len, and no negative key, is ever visible.
  EXPECT_FALSE(visible(false, 0, 8, 10, 8));
  EXPECT_FALSE(visible(false, 0, 8, 10, -1));
}

TEST(SpecVisibility, MmPrefixRangesOverrideCausalityAndTheWindowOnlyInsideTheRange) {
  const std::vector<int32_t> ranges = {2, 6, 0, 0};  // one range [2, 6] (inclusive) and a (0, 0) pad
  // p = 3 lies in [2, 6]: keys 4..6 become visible (bidirectional), 0 and 1 stay outside the window.
  for (int64_t k = 0; k < 10; ++k) {
    const bool in_window = k <= 3 && 3 - k < 2;
    const bool in_range = k >= 2 && k <= 6;
    EXPECT_EQ(visible(false, 2, 10, 3, k, ranges), in_window || in_range) << k;
  }
  // p = 8 lies outside the range: the plain window rule.
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(visible(false, 2, 10, 8, k, ranges), k == 7 || k == 8) << k;
  // A range with start == end is padding, not a one-key range.
  EXPECT_FALSE(visible(false, 1, 10, 4, 5, {4, 4}));
}

TEST(SpecVisibility, EncoderOnlyIsASymmetricWindowWithoutRanges) {
  // vLLM window_size = (W − 1, W − 1): |p − k| < W.
  for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(visible(true, 3, 12, 5, k), k >= 3 && k <= 7) << k;
  for (int64_t k = 0; k < 12; ++k) EXPECT_TRUE(visible(true, 0, 12, 5, k)) << k;
  EXPECT_FALSE(visible(true, 0, 12, 5, 12));
  // mm_prefix ranges do not apply to encoder_only layers.
  EXPECT_FALSE(visible(true, 1, 12, 5, 7, {0, 11}));
}

// The interval helpers the planners and the perf model use describe exactly the keys the rule
// makes visible when no mm_prefix range applies.
TEST(SpecVisibility, WindowIntervalIsTheSetOfVisibleKeys) {
  for (const bool encoder : {false, true}) {
    for (int64_t window = 0; window <= 6; ++window) {
      for (int64_t seq_len = 1; seq_len <= 12; ++seq_len) {
        for (int64_t p = 0; p < seq_len; ++p) {
          const int64_t first = spec::window_first_key(window, p);
          const int64_t end = std::min(seq_len, spec::window_key_end(encoder, window, seq_len, p));
          for (int64_t k = -1; k <= seq_len; ++k) {
            EXPECT_EQ(visible(encoder, window, seq_len, p, k), k >= first && k < end)
                << "encoder " << encoder << " W " << window << " seq_len " << seq_len << " p " << p << " k " << k;
          }
        }
      }
    }
  }
}

TEST(SpecKvCache, KvCacheDtypeDecodesToStorageAndScaling) {
  using spec::KvCacheScaling;
  const spec::KvCacheFormat autos = spec::kv_cache_format(KvCacheDtype::kAuto, DType::kBFloat16);
  EXPECT_EQ(autos.storage, DType::kBFloat16);
  EXPECT_EQ(autos.scaling, KvCacheScaling::kNone);
  const spec::KvCacheFormat e4m3 = spec::kv_cache_format(KvCacheDtype::kFp8E4M3, DType::kFloat16);
  EXPECT_EQ(e4m3.storage, kv_storage_dtype(KvCacheDtype::kFp8E4M3, DType::kFloat16));
  EXPECT_EQ(e4m3.scaling, KvCacheScaling::kPerTensor);
  EXPECT_EQ(spec::kv_cache_format(KvCacheDtype::kFp8E5M2, DType::kFloat16).scaling, KvCacheScaling::kPerTensor);
  EXPECT_EQ(spec::kv_cache_format(KvCacheDtype::kInt8PerTokenHead, DType::kFloat16).scaling,
            KvCacheScaling::kPerTokenHead);
  EXPECT_EQ(spec::kv_cache_format(KvCacheDtype::kFp8PerTokenHead, DType::kFloat16).scaling,
            KvCacheScaling::kPerTokenHead);
}

std::string error_of(const AttentionConfig& config, const StepTensors& tensors, Device device) {
  try {
    spec::bind_kv_cache(config, tensors, device);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpecKvCache, BindingChecksShapeDtypeDeviceAndScales) {
  AttentionConfig config;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_size = 8;
  config.block_size = 16;
  config.dtype = DType::kFloat16;
  const Tensor cache = Tensor::host(DType::kFloat16, {3, 2, 16, 2, 8});
  StepTensors tensors;
  tensors.kv_cache = cache;
  const spec::KvCacheBinding bound = spec::bind_kv_cache(config, tensors, Device::kHost);
  EXPECT_EQ(bound.num_blocks, 3);
  EXPECT_EQ(bound.num_slots, 48);
  EXPECT_EQ(bound.format.scaling, spec::KvCacheScaling::kNone);
  EXPECT_TRUE(bound.k_scale_cache.empty());

  EXPECT_THAT(error_of(config, tensors, Device::kCuda), HasSubstr("kv_cache must be a cuda tensor"));
  const Tensor wrong_dtype = Tensor::host(DType::kBFloat16, {3, 2, 16, 2, 8});
  tensors.kv_cache = wrong_dtype;
  EXPECT_THAT(error_of(config, tensors, Device::kHost), HasSubstr("kv_cache dtype must be float16"));
  const Tensor wrong_shape = Tensor::host(DType::kFloat16, {3, 2, 8, 2, 8});
  tensors.kv_cache = wrong_shape;
  EXPECT_THAT(error_of(config, tensors, Device::kHost), HasSubstr("kv_cache must be [3, 2, 16, 2, 8]"));
  tensors.kv_cache = TensorView();
  EXPECT_THAT(error_of(config, tensors, Device::kHost), HasSubstr("kv_cache must be [NB, 2, BS, Hkv, D]"));

  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  const Tensor int8_cache = Tensor::host(kv_storage_dtype(config.kv_cache_dtype, config.dtype), {3, 2, 16, 2, 8});
  tensors.kv_cache = int8_cache;
  EXPECT_THAT(error_of(config, tensors, Device::kHost), HasSubstr("k_scale_cache and v_scale_cache must be"));
  const Tensor k_scales = Tensor::host(DType::kFloat32, {3, 16, 2});
  const Tensor v_scales = Tensor::host(DType::kFloat32, {3, 16, 2});
  tensors.k_scale_cache = k_scales;
  tensors.v_scale_cache = v_scales;
  const spec::KvCacheBinding scaled = spec::bind_kv_cache(config, tensors, Device::kHost);
  EXPECT_EQ(scaled.format.scaling, spec::KvCacheScaling::kPerTokenHead);
  EXPECT_EQ(scaled.k_scale_cache.data(), k_scales.data());
  EXPECT_EQ(scaled.v_scale_cache.data(), v_scales.data());
}

}  // namespace
}  // namespace hybridtb::testing
