// Element types of hybridtb tensors, their storage names and exact host conversions.
//
// Conversions *to* float/double are exact for every type. Conversions *from* float round to
// nearest-even; the fp8 encoders saturate to the largest finite value (the `satfinite` behaviour
// of the CUDA/Triton casts) and keep NaN. These are the rounding points the GPU kernels use, so the
// reference can reproduce stored values bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hybridtb {

enum class DType : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3,  // float8_e4m3fn: no infinities, max 448 (CUDA's __nv_fp8_e4m3)
  kFloat8E5M2,  // float8_e5m2: IEEE-like, max 57344
  kInt8,
  kInt32,
  kInt64,
  kBool,        // stored as one byte 0/1
};

// The `dtype_name` strings of the hybrid-batch schema ("float32", "bfloat16", "float8_e4m3fn", …).
std::string_view to_string(DType dtype);
// Parses a dtype_name. Accepts the schema names plus common aliases ("fp8_e4m3" → kFloat8E4M3).
// Throws Error naming `what` (the field being parsed) on an unknown name.
DType dtype_from_string(std::string_view name, std::string_view what = "dtype");

int64_t element_size(DType dtype);
bool is_floating(DType dtype);  // float64/32/16, bfloat16, fp8
bool is_fp8(DType dtype);

// Largest finite value of an fp8 format (448 for e4m3fn, 57344 for e5m2).
double fp8_max(DType dtype);

// --- exact decoding ------------------------------------------------------------------------------
float half_to_float(uint16_t bits);
float bfloat16_to_float(uint16_t bits);
float fp8_e4m3_to_float(uint8_t bits);
float fp8_e5m2_to_float(uint8_t bits);

// --- rounding encoders (round to nearest, ties to even) -------------------------------------------
uint16_t float_to_half(float value);
uint16_t float_to_bfloat16(float value);
uint8_t float_to_fp8_e4m3(float value);  // saturating (satfinite), NaN → NaN
uint8_t float_to_fp8_e5m2(float value);  // saturating (satfinite), NaN → NaN

// Reads element `index` (in elements from `data`) of a buffer of `dtype` as double, exactly.
double load_as_double(const void* data, DType dtype, int64_t index);
// Stores `value` into element `index` of a buffer of `dtype`, rounding as the encoders above
// (floating types go through float first, as a GPU store from an fp32 register does; integers are
// rounded to nearest and must be in range).
void store_from_double(void* data, DType dtype, int64_t index, double value);

}  // namespace hybridtb
