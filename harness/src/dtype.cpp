// Element types: names, sizes and exact conversions. fp16/bf16 rounding uses Eigen's
// round-to-nearest-even implementations; fp8 uses a table of every finite code (obviously right:
// the nearest representable value, ties to the even code, saturating at the largest finite value).
#include "hybridtb/dtype.h"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "hybridtb/error.h"

namespace hybridtb {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int64_t size;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kFloat64, "float64", 8},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat8E4M3, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kBool, "bool", 1},
}};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  throw Error("unknown DType value");
}

// Decodes an fp8 code with `mantissa_bits` and exponent bias `bias`. e4m3fn has no infinities and
// one NaN pattern per sign (S.1111.111); e5m2 follows IEEE (exponent all ones = inf/NaN).
float decode_fp8(uint8_t bits, int mantissa_bits, int bias, bool ieee_specials) {
  const int exponent_bits = 7 - mantissa_bits;
  const bool negative = (bits & 0x80) != 0;
  const int exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  const int max_exponent = (1 << exponent_bits) - 1;
  float magnitude = 0.0f;
  if (ieee_specials && exponent == max_exponent) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!ieee_specials && exponent == max_exponent && mantissa == (1 << mantissa_bits) - 1) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>((1 << mantissa_bits) + mantissa), exponent - bias - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// The non-negative finite values of an fp8 format, in code order (which is increasing order).
struct Fp8Table {
  std::array<float, 128> values{};
  int count = 0;  // finite non-negative codes: 0 .. count-1
};

Fp8Table make_table(float (*decode)(uint8_t)) {
  Fp8Table table;
  for (int code = 0; code < 128; ++code) {
    const float v = decode(static_cast<uint8_t>(code));
    if (!std::isfinite(v)) break;
    table.values[static_cast<size_t>(code)] = v;
    table.count = code + 1;
  }
  return table;
}

uint8_t encode_fp8(float value, const Fp8Table& table) {
  if (std::isnan(value)) return 0x7F;  // NaN: all ones below the sign (both formats decode it as NaN)
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  const int last = table.count - 1;
  if (magnitude >= table.values[static_cast<size_t>(last)]) return static_cast<uint8_t>(sign | last);  // satfinite
  // First code whose value exceeds the magnitude; the answer is it or its predecessor.
  const auto* begin = table.values.data();
  const int upper = static_cast<int>(std::upper_bound(begin, begin + table.count, magnitude) - begin);
  const int lower = upper - 1;
  const float below = magnitude - table.values[static_cast<size_t>(lower)];
  const float above = table.values[static_cast<size_t>(upper)] - magnitude;
  int code = below < above ? lower : upper;
  if (below == above) code = (lower % 2 == 0) ? lower : upper;  // ties to the even code
  return static_cast<uint8_t>(sign | code);
}

const Fp8Table& e4m3_table() {
  static const Fp8Table table = make_table(fp8_e4m3_to_float);
  return table;
}
const Fp8Table& e5m2_table() {
  static const Fp8Table table = make_table(fp8_e5m2_to_float);
  return table;
}

}  // namespace

std::string_view to_string(DType dtype) { return info(dtype).name; }

DType dtype_from_string(std::string_view name, std::string_view what) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  if (name == "fp8_e4m3" || name == "float8_e4m3") return DType::kFloat8E4M3;
  if (name == "fp8_e5m2") return DType::kFloat8E5M2;
  if (name == "half" || name == "fp16") return DType::kFloat16;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "float" || name == "fp32") return DType::kFloat32;
  if (name == "double") return DType::kFloat64;
  throw Error(detail::concat(what, ": unknown dtype name '", name,
                             "' (expected float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, "
                             "int32, int64 or bool)"));
}

int64_t element_size(DType dtype) { return info(dtype).size; }

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return true;
    default:
      return false;
  }
}

bool is_fp8(DType dtype) { return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2; }

double fp8_max(DType dtype) {
  HYBRIDTB_CHECK(is_fp8(dtype), "fp8_max: ", to_string(dtype), " is not an fp8 type");
  return dtype == DType::kFloat8E4M3 ? 448.0 : 57344.0;
}

float half_to_float(uint16_t bits) { return static_cast<float>(std::bit_cast<Eigen::half>(bits)); }
float bfloat16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
float fp8_e4m3_to_float(uint8_t bits) { return decode_fp8(bits, 3, 7, /*ieee_specials=*/false); }
float fp8_e5m2_to_float(uint8_t bits) { return decode_fp8(bits, 2, 15, /*ieee_specials=*/true); }

uint16_t float_to_half(float value) { return std::bit_cast<uint16_t>(Eigen::half(value)); }
uint16_t float_to_bfloat16(float value) { return std::bit_cast<uint16_t>(Eigen::bfloat16(value)); }
uint8_t float_to_fp8_e4m3(float value) { return encode_fp8(value, e4m3_table()); }
uint8_t float_to_fp8_e5m2(float value) { return encode_fp8(value, e5m2_table()); }

double load_as_double(const void* data, DType dtype, int64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(data) + index * element_size(dtype);
  switch (dtype) {
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, bytes, sizeof v);
      return v;
    }
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, bytes, sizeof v);
      return v;
    }
    case DType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, bytes, sizeof v);
      return half_to_float(v);
    }
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, bytes, sizeof v);
      return bfloat16_to_float(v);
    }
    case DType::kFloat8E4M3:
      return fp8_e4m3_to_float(*bytes);
    case DType::kFloat8E5M2:
      return fp8_e5m2_to_float(*bytes);
    case DType::kInt8:
      return static_cast<int8_t>(*bytes);
    case DType::kBool:
      return *bytes != 0 ? 1.0 : 0.0;
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, bytes, sizeof v);
      return v;
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, bytes, sizeof v);
      return static_cast<double>(v);
    }
  }
  throw Error("load_as_double: unknown dtype");
}

namespace {
template <typename Int>
Int checked_integer(double value, DType dtype) {
  const double rounded = std::nearbyint(value);
  HYBRIDTB_CHECK(std::isfinite(rounded) && rounded >= static_cast<double>(std::numeric_limits<Int>::min()) &&
                     rounded <= static_cast<double>(std::numeric_limits<Int>::max()),
                 "store_from_double: value ", value, " out of range for ", to_string(dtype));
  return static_cast<Int>(rounded);
}
}  // namespace

void store_from_double(void* data, DType dtype, int64_t index, double value) {
  auto* bytes = static_cast<unsigned char*>(data) + index * element_size(dtype);
  const auto as_float = static_cast<float>(value);
  switch (dtype) {
    case DType::kFloat64:
      std::memcpy(bytes, &value, sizeof value);
      return;
    case DType::kFloat32:
      std::memcpy(bytes, &as_float, sizeof as_float);
      return;
    case DType::kFloat16: {
      const uint16_t v = float_to_half(as_float);
      std::memcpy(bytes, &v, sizeof v);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t v = float_to_bfloat16(as_float);
      std::memcpy(bytes, &v, sizeof v);
      return;
    }
    case DType::kFloat8E4M3:
      *bytes = float_to_fp8_e4m3(as_float);
      return;
    case DType::kFloat8E5M2:
      *bytes = float_to_fp8_e5m2(as_float);
      return;
    case DType::kInt8:
      *bytes = static_cast<unsigned char>(checked_integer<int8_t>(value, dtype));
      return;
    case DType::kBool:
      *bytes = value != 0.0 ? 1 : 0;
      return;
    case DType::kInt32: {
      const auto v = checked_integer<int32_t>(value, dtype);
      std::memcpy(bytes, &v, sizeof v);
      return;
    }
    case DType::kInt64: {
      const auto v = checked_integer<int64_t>(value, dtype);
      std::memcpy(bytes, &v, sizeof v);
      return;
    }
  }
  throw Error("store_from_double: unknown dtype");
}

}  // namespace hybridtb
