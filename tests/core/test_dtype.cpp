// Element-type conversions, checked exhaustively over every code of the 8- and 16-bit formats
// and against independent formulations (brute-force nearest search; the compiler's _Float16).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "hybridtb/dtype.h"
#include "hybridtb/error.h"

namespace hybridtb {
namespace {

// Nearest code by brute force over all 256 codes; ties go to the code with an even mantissa LSB.
// Saturating: values beyond the largest finite magnitude map to it.
uint8_t brute_force_fp8(float value, float (*decode)(uint8_t)) {
  if (std::isnan(value)) return 0x7F;
  int best = -1;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    const float candidate = decode(static_cast<uint8_t>(code));
    if (!std::isfinite(candidate)) continue;
    if (std::signbit(candidate) != std::signbit(value)) continue;
    const double distance = std::fabs(static_cast<double>(candidate) - static_cast<double>(value));
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8, KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
  EXPECT_EQ(fp8_e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0x7C)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7D)));
  EXPECT_EQ(fp8_max(DType::kFloat8E4M3), 448.0);
  EXPECT_EQ(fp8_max(DType::kFloat8E5M2), 57344.0);
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<uint8_t>(code);
    const float a = fp8_e4m3_to_float(bits);
    if (std::isfinite(a)) {
      EXPECT_EQ(float_to_fp8_e4m3(a), bits) << "e4m3 code " << code;
    }
    const float b = fp8_e5m2_to_float(bits);
    if (std::isfinite(b)) {
      EXPECT_EQ(float_to_fp8_e5m2(b), bits) << "e5m2 code " << code;
    }
  }
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);  // midway 1.0 (0x38) / 1.125 (0x39) → even
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3A);  // midway 1.125 (0x39) / 1.25 (0x3A) → even
  EXPECT_EQ(float_to_fp8_e4m3(1000.0f), 0x7E);  // satfinite
  EXPECT_EQ(float_to_fp8_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_fp8_e5m2(1e9f), 0x7B);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(std::nanf("")))));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(std::nanf("")))));
}

TEST(Fp8, MatchesBruteForceNearestOnRandomAndBoundaryValues) {
  std::mt19937 rng(7);
  std::vector<float> values;
  std::uniform_real_distribution<float> exponent(-14.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) {
    const float magnitude = std::exp2(exponent(rng));
    values.push_back((i % 2) ? magnitude : -magnitude);
  }
  // Exact midpoints between neighbouring codes exercise the tie rule.
  for (int code = 0; code < 126; ++code) {
    values.push_back(0.5f * (fp8_e4m3_to_float(static_cast<uint8_t>(code)) +
                             fp8_e4m3_to_float(static_cast<uint8_t>(code + 1))));
  }
  for (int code = 0; code < 123; ++code) {
    values.push_back(0.5f * (fp8_e5m2_to_float(static_cast<uint8_t>(code)) +
                             fp8_e5m2_to_float(static_cast<uint8_t>(code + 1))));
  }
  for (float v : values) {
    EXPECT_EQ(float_to_fp8_e4m3(v), brute_force_fp8(v, fp8_e4m3_to_float)) << "e4m3 of " << v;
    EXPECT_EQ(float_to_fp8_e5m2(v), brute_force_fp8(v, fp8_e5m2_to_float)) << "e5m2 of " << v;
  }
}

TEST(BFloat16, EveryCodeRoundTripsAndDecodesAsTopBitsOfFloat) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto bits = static_cast<uint16_t>(code);
    const float f = bfloat16_to_float(bits);
    EXPECT_EQ(std::bit_cast<uint32_t>(f), code << 16);
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bfloat16(f), bits);
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = any_bits(rng);
    const float f = std::bit_cast<float>(bits);
    if (!std::isfinite(f)) continue;
    // Independent: the two bf16 neighbours of f by truncation, picked by exact double distance.
    const uint16_t down = static_cast<uint16_t>(bits >> 16);
    const auto up = static_cast<uint16_t>(down + 1);
    const double d_down = std::fabs(static_cast<double>(f) - bfloat16_to_float(down));
    const double d_up = std::isfinite(bfloat16_to_float(up))
                            ? std::fabs(static_cast<double>(f) - bfloat16_to_float(up))
                            : std::numeric_limits<double>::infinity();
    uint16_t expected = d_down < d_up ? down : up;
    if (d_down == d_up) expected = (down & 1) == 0 ? down : up;
    if (!std::isfinite(bfloat16_to_float(up)) && d_up == std::numeric_limits<double>::infinity()) {
      // f lies between the largest finite bf16 and infinity: RNE overflows only past the midpoint.
      const double midpoint = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
      expected = std::fabs(static_cast<double>(f)) >= midpoint ? up : down;
    }
    EXPECT_EQ(float_to_bfloat16(f), expected) << "bits 0x" << std::hex << bits;
  }
}

#ifdef __FLT16_MAX__
TEST(Float16, MatchesCompilerFloat16) {
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto bits = static_cast<uint16_t>(code);
    const _Float16 h = std::bit_cast<_Float16>(bits);
    const float expected = static_cast<float>(h);
    const float got = half_to_float(bits);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      EXPECT_EQ(got, expected) << "code " << code;
      EXPECT_EQ(float_to_half(got), bits) << "code " << code;
    }
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(any_bits(rng));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_half(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << f;
  }
}
#endif

TEST(DType, NamesRoundTripAndAliases) {
  for (DType d : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                  DType::kFloat8E5M2, DType::kInt8, DType::kInt32, DType::kInt64, DType::kBool}) {
    EXPECT_EQ(dtype_from_string(to_string(d)), d);
  }
  EXPECT_EQ(to_string(DType::kFloat8E4M3), "float8_e4m3fn");
  EXPECT_EQ(dtype_from_string("fp8_e4m3"), DType::kFloat8E4M3);
  EXPECT_THROW(dtype_from_string("float7", "/inputs/query dtype_name"), Error);
  try {
    dtype_from_string("float7", "/inputs/query dtype_name");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/inputs/query dtype_name"), std::string::npos);
  }
}

TEST(DType, LoadStoreAreExactOrRoundAsDocumented) {
  std::vector<unsigned char> buffer(64);
  store_from_double(buffer.data(), DType::kFloat64, 0, 0.1);
  EXPECT_EQ(load_as_double(buffer.data(), DType::kFloat64, 0), 0.1);
  store_from_double(buffer.data(), DType::kBFloat16, 3, 1.0 + 1.0 / 256);  // tie → even (1.0)
  EXPECT_EQ(load_as_double(buffer.data(), DType::kBFloat16, 3), 1.0);
  store_from_double(buffer.data(), DType::kInt8, 5, -7.0);
  EXPECT_EQ(load_as_double(buffer.data(), DType::kInt8, 5), -7.0);
  EXPECT_THROW(store_from_double(buffer.data(), DType::kInt8, 5, 300.0), Error);
  store_from_double(buffer.data(), DType::kInt64, 1, -123456789012.0);
  EXPECT_EQ(load_as_double(buffer.data(), DType::kInt64, 1), -123456789012.0);
}

}  // namespace
}  // namespace hybridtb
