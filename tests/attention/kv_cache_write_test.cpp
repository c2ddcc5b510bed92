// The reference KV-cache write, bit for bit: every cache byte (and scale) is predicted per element
// from the step's key/value rows and compared with the whole cache, so slot −1, CUDA-graph padding
// rows and untouched blocks are checked too. Run: ctest -L attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_steps.h"
#include "hybridtb/reference/paged_attention.h"

namespace hybridtb::testing {
namespace {

// A mixed step with 4 padding rows whose slots point at real (spare) cache slots, and one real
// token with slot −1: neither may be written.
BatchFile write_step(KvCacheDtype kv, DType dtype, uint64_t seed, float k_scale = 0.5f, float v_scale = 0.25f) {
  AttentionConfig config = attention_config(8, 2, 80, 16, dtype);
  config.kv_cache_dtype = kv;
  BatchFile step = synthetic_step(config, {{0, 21, {}}, {40, 1, {}}, {17, 6, {}}},
                                  {.seed = seed, .spare_blocks = 3, .padding_tokens = 4, .k_scale = k_scale, .v_scale = v_scale});
  const int64_t n = step.batch.num_actual_tokens;
  const int64_t last_block = step.inputs.kv_cache.size(0) - 1;
  for (int64_t t = n; t < n + 4; ++t) step.batch.slot_mapping[static_cast<size_t>(t)] = last_block * 16 + (t - n);
  step.batch.slot_mapping[5] = kPadSlotId;
  return step;
}

double key_or_value(const BatchFile& step, int half, int64_t t, int64_t h, int64_t c) {
  return element(half == 0 ? step.inputs.key : step.inputs.value, t, h, c);
}

// For every token the write must store, calls fn(t, block, offset).
template <typename Fn>
void for_each_written_token(const BatchFile& step, Fn fn) {
  for (int64_t t = 0; t < step.batch.num_actual_tokens; ++t) {
    const int64_t slot = step.batch.slot_mapping[static_cast<size_t>(t)];
    if (slot >= 0) fn(t, slot / step.config.block_size, slot % step.config.block_size);
  }
}

uint8_t* byte_at(const Tensor& tensor, int64_t offset) {
  return static_cast<uint8_t*>(tensor.data()) + offset * element_size(tensor.dtype());
}

::testing::AssertionResult caches_identical(const BatchInputs& got, const BatchInputs& want) {
  if (!bitwise_equal(got.kv_cache, want.kv_cache)) return ::testing::AssertionFailure() << "kv_cache differs";
  if (!got.k_scale_cache.empty() && !bitwise_equal(got.k_scale_cache, want.k_scale_cache)) {
    return ::testing::AssertionFailure() << "k_scale_cache differs";
  }
  if (!got.v_scale_cache.empty() && !bitwise_equal(got.v_scale_cache, want.v_scale_cache)) {
    return ::testing::AssertionFailure() << "v_scale_cache differs";
  }
  return ::testing::AssertionSuccess();
}

BatchInputs written(const BatchFile& step) {
  BatchInputs after = clone_inputs(step.inputs);
  reference::write_kv_cache(step.config, step.batch, after.views());
  return after;
}

TEST(KvCacheWrite, AutoCopiesTheBits) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    const BatchFile step = write_step(KvCacheDtype::kAuto, dtype, 1);
    BatchInputs want = clone_inputs(step.inputs);
    const int64_t size = element_size(dtype);
    for_each_written_token(step, [&](int64_t t, int64_t block, int64_t offset) {
      for (int half = 0; half < 2; ++half) {
        const Tensor& source = half == 0 ? step.inputs.key : step.inputs.value;
        for (int64_t h = 0; h < step.config.num_kv_heads; ++h) {
          for (int64_t c = 0; c < step.config.head_size; ++c) {
            std::memcpy(byte_at(want.kv_cache, want.kv_cache.view().offset({block, half, offset, h, c})),
                        byte_at(source, source.view().offset({t, h, c})), static_cast<size_t>(size));
          }
        }
      }
    });
    EXPECT_TRUE(caches_identical(written(step), want)) << to_string(dtype);
  }
}

// The finite fp8 value nearest to y, ties to an even code, saturating at the format's maximum:
// a brute-force model of the kernel's satfinite round-to-nearest-even cast.
double nearest_fp8(DType format, float y) {
  const double max = fp8_max(format);
  if (std::fabs(y) >= max) return std::copysign(max, y);
  double best = 0.0, best_distance = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<uint8_t>(code);
    const double v = format == DType::kFloat8E4M3 ? fp8_e4m3_to_float(bits) : fp8_e5m2_to_float(bits);
    if (!std::isfinite(v)) continue;
    const double distance = std::fabs(v - static_cast<double>(y));
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0 && (best_code & 1) == 1)) {
      best = v;
      best_distance = distance;
      best_code = code;
    }
  }
  return best;
}

struct PerTensorCase {
  KvCacheDtype kv;
  DType dtype;
  float k_scale, v_scale;
};

TEST(KvCacheWrite, Fp8PerTensorDividesByTheScaleAndRoundsToNearestEven) {
  for (const PerTensorCase& tc : {PerTensorCase{KvCacheDtype::kFp8E4M3, DType::kBFloat16, 0.5f, 0.25f},
                                 PerTensorCase{KvCacheDtype::kFp8E5M2, DType::kBFloat16, 0.5f, 0.25f},
                                 PerTensorCase{KvCacheDtype::kFp8E4M3, DType::kFloat32, 0.37f, 1.3f},
                                 PerTensorCase{KvCacheDtype::kFp8E5M2, DType::kFloat32, 0.37f, 1.3f}}) {
    const KvCacheDtype kv = tc.kv;
    BatchFile step = write_step(kv, tc.dtype, 2, tc.k_scale, tc.v_scale);
    const DType format = kv_storage_dtype(kv, tc.dtype);
    // Values that saturate (1000 / 0.5 > 448; 1e5 / 0.5 > 57344), tiny ones and exact ones.
    set_row(step.inputs.key, 0, 0, {1000.0, -1000.0, 1e5, -1e5, 1e-4, -3e-3, 2.0 * tc.k_scale / 0.5, 0.0});
    set_row(step.inputs.value, 0, 1, {1000.0, -1e5, 0.25, -0.0});
    // float32 keys where x / 0.37 and x · (1 / 0.37) round to different e4m3 codes (0x03 and 0x07
    // by division, one more by the reciprocal): the kernel divides.
    set_row(step.inputs.key, 0, 1, {0x1.4b851ep-9, 0x1.633332p-8});
    BatchInputs want = clone_inputs(step.inputs);
    for_each_written_token(step, [&](int64_t t, int64_t block, int64_t offset) {
      for (int half = 0; half < 2; ++half) {
        const float scale = half == 0 ? step.inputs.k_scale : step.inputs.v_scale;
        for (int64_t h = 0; h < step.config.num_kv_heads; ++h) {
          for (int64_t c = 0; c < step.config.head_size; ++c) {
            const float y = static_cast<float>(key_or_value(step, half, t, h, c)) / scale;
            const uint8_t code = format == DType::kFloat8E4M3 ? float_to_fp8_e4m3(y) : float_to_fp8_e5m2(y);
            const double decoded = format == DType::kFloat8E4M3 ? fp8_e4m3_to_float(code) : fp8_e5m2_to_float(code);
            ASSERT_EQ(decoded, nearest_fp8(format, y)) << "y = " << y;
            *byte_at(want.kv_cache, want.kv_cache.view().offset({block, half, offset, h, c})) = code;
          }
        }
      }
    });
    const BatchInputs got = written(step);
    EXPECT_TRUE(caches_identical(got, want)) << to_string(kv);

    // Saturation, spelled out: token 0 (slot of position 0 of request 0), kv head 0.
    const int64_t slot = step.batch.slot_mapping[0];
    const int64_t key_row = got.kv_cache.view().offset({slot / 16, 0, slot % 16, 0, 0});
    const uint8_t max_code = format == DType::kFloat8E4M3 ? 0x7E : 0x7B;
    const uint8_t* codes = byte_at(got.kv_cache, key_row);
    if (format == DType::kFloat8E4M3) {  // 2000 is finite in e5m2
      EXPECT_EQ(codes[0], max_code);
      EXPECT_EQ(codes[1], max_code | 0x80);
    }
    EXPECT_EQ(codes[2], max_code);
    EXPECT_EQ(codes[3], max_code | 0x80);
    EXPECT_EQ(load_as_double(got.kv_cache.data(), format, key_row + 6), 4.0);  // 2·scale/0.5 / scale
    if (tc.dtype == DType::kFloat32 && format == DType::kFloat8E4M3) {
      const uint8_t* divided = byte_at(got.kv_cache, got.kv_cache.view().offset({slot / 16, 0, slot % 16, 1, 0}));
      EXPECT_EQ(divided[0], 0x03);
      EXPECT_EQ(divided[1], 0x07);
    }
  }
}

TEST(KvCacheWrite, PerTokenHeadQuantisesEachTokenHeadWithItsOwnScale) {
  for (KvCacheDtype kv : {KvCacheDtype::kInt8PerTokenHead, KvCacheDtype::kFp8PerTokenHead}) {
    BatchFile step = write_step(kv, DType::kBFloat16, 3);
    const bool is_int8 = kv == KvCacheDtype::kInt8PerTokenHead;
    const int64_t d = step.config.head_size;
    set_row(step.inputs.key, 0, 0, std::vector<double>(static_cast<size_t>(d), 0.0));  // all zero: scale 1e-6
    std::vector<double> small(static_cast<size_t>(d), 0.0);
    small[0] = 1.0, small[1] = -2.0, small[2] = 0.5, small[3] = 3.0;  // absmax 3: scale 3 / QMAX
    set_row(step.inputs.key, 1, 1, small);
    BatchInputs want = clone_inputs(step.inputs);
    const float qmax = is_int8 ? 127.0f : 448.0f;
    for_each_written_token(step, [&](int64_t t, int64_t block, int64_t offset) {
      for (int half = 0; half < 2; ++half) {
        const Tensor& scales = half == 0 ? want.k_scale_cache : want.v_scale_cache;
        for (int64_t h = 0; h < step.config.num_kv_heads; ++h) {
          std::vector<float> x(static_cast<size_t>(d));
          float absmax = 0.0f;
          for (int64_t c = 0; c < d; ++c) {
            x[static_cast<size_t>(c)] = static_cast<float>(key_or_value(step, half, t, h, c));
            absmax = std::fabs(x[static_cast<size_t>(c)]) > absmax ? std::fabs(x[static_cast<size_t>(c)]) : absmax;
          }
          float scale = absmax / qmax;
          if (scale < 1e-6f) scale = 1e-6f;
          const float inverse = 1.0f / scale;
          static_cast<float*>(scales.data())[scales.view().offset({block, offset, h})] = scale;
          for (int64_t c = 0; c < d; ++c) {
            float y = x[static_cast<size_t>(c)] * inverse;
            y = y > qmax ? qmax : y;
            y = y < (is_int8 ? -128.0f : -qmax) ? (is_int8 ? -128.0f : -qmax) : y;
            uint8_t* out = byte_at(want.kv_cache, want.kv_cache.view().offset({block, half, offset, h, c}));
            if (is_int8) {
              const auto q = static_cast<int8_t>(std::trunc(y));
              std::memcpy(out, &q, 1);
              // Truncation loses less than one quantisation step.
              EXPECT_LT(std::fabs(static_cast<double>(q) * scale - x[static_cast<size_t>(c)]), 1.0001 * scale);
            } else {
              *out = float_to_fp8_e4m3(y);
            }
          }
        }
      }
    });
    const BatchInputs got = written(step);
    EXPECT_TRUE(caches_identical(got, want)) << to_string(kv);

    const int64_t slot0 = step.batch.slot_mapping[0];
    EXPECT_EQ(static_cast<const float*>(got.k_scale_cache.data())[got.k_scale_cache.view().offset({slot0 / 16, slot0 % 16, 0})],
              1e-6f);
    const int64_t slot1 = step.batch.slot_mapping[1];
    EXPECT_EQ(static_cast<const float*>(got.k_scale_cache.data())[got.k_scale_cache.view().offset({slot1 / 16, slot1 % 16, 1})],
              3.0f / qmax);
  }
}

TEST(KvCacheWrite, Int8TruncatesTowardZero) {
  AttentionConfig config = attention_config(1, 1, 32, 16, DType::kFloat32);
  config.kv_cache_dtype = KvCacheDtype::kInt8PerTokenHead;
  BatchFile step = manual_step(config, 0, 1);
  step.inputs.k_scale_cache = Tensor::host(DType::kFloat32, {step.inputs.kv_cache.size(0), 16, 1});
  step.inputs.v_scale_cache = Tensor::host(DType::kFloat32, {step.inputs.kv_cache.size(0), 16, 1});
  set_row(step.inputs.key, 0, 0, {127.0, 126.9, -126.9, 0.75, -0.75, 63.5, -63.5});  // scale exactly 1
  const BatchInputs got = written(step);
  const int64_t row = got.kv_cache.view().offset({1, 0, 0, 0, 0});
  const std::vector<double> want{127, 126, -126, 0, 0, 63, -63};
  for (size_t c = 0; c < want.size(); ++c) {
    EXPECT_EQ(load_as_double(got.kv_cache.data(), DType::kInt8, row + static_cast<int64_t>(c)), want[c]) << c;
  }
  EXPECT_EQ(static_cast<const float*>(got.k_scale_cache.data())[16], 1.0f);
}

TEST(KvCacheWrite, EncoderOnlyWritesNothing) {
  AttentionConfig config = attention_config(4, 4, 64, 16, DType::kBFloat16);
  BatchFile step = synthetic_step(config, {{0, 9, {}}}, {.seed = 4});
  step.config.attn_type = AttnType::kEncoderOnly;  // a decoder-shaped step, so there is a cache to watch
  EXPECT_TRUE(caches_identical(written(step), step.inputs));
}

}  // namespace
}  // namespace hybridtb::testing
