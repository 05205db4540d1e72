// Derived properties of number specs (NumberSpec's properties, computed the same way).
#include "number.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace onnxq {

std::string Num::name() const {
  switch (kind) {
    case kInt: return "int" + std::to_string(mbits + 1);
    case kUint: return "uint" + std::to_string(mbits);
    case kExponent: return "e" + std::to_string(ebits) + "m0b" + std::to_string(bias);
    default: break;
  }
  static const char* suffix[] = {"", "ieee", "fn", "fnuz", "inuz"};
  return "e" + std::to_string(ebits) + "m" + std::to_string(mbits) + "b" + std::to_string(bias) +
         suffix[infnan >= 0 && infnan <= 4 ? infnan : 0];
}

double Num::decode(uint64_t code) const {
  switch (kind) {
    case kInt: {
      int64_t c = static_cast<int64_t>(code);
      return static_cast<double>((code >> (bits - 1)) & 1 ? c - (int64_t(1) << bits) : c);
    }
    case kUint: return static_cast<double>(code);
    case kExponent:
      if (code == (1ull << ebits) - 1) return NAN;
      return std::ldexp(1.0, static_cast<int>(code) - bias);
    default: break;
  }
  uint64_t sign_bit = 1ull << (bits - 1);
  bool negative = (code & sign_bit) != 0;
  uint64_t magnitude = code & (sign_bit - 1);
  uint64_t field = magnitude >> mbits;
  uint64_t mant = magnitude & ((1ull << mbits) - 1);
  uint64_t top_field = (1ull << ebits) - 1, top_mant = (1ull << mbits) - 1;
  if (infnan == kIeee && field == top_field) {
    return mant ? NAN : (negative ? -INFINITY : INFINITY);
  }
  if (infnan == kFn && field == top_field && mant == top_mant) return NAN;
  if ((infnan == kFnuz || infnan == kInuz) && code == sign_bit) return NAN;
  if (infnan == kInuz && magnitude == sign_bit - 1) return negative ? -INFINITY : INFINITY;
  double value;
  if (field == 0) {
    value = std::ldexp(static_cast<double>(mant), 1 - bias - mbits);
  } else {
    value = std::ldexp(static_cast<double>((1ull << mbits) + mant),
                       static_cast<int>(field) - bias - mbits);
  }
  return negative ? -value : value;
}

std::string Num::derive() {
  is_float = kind == kFloat;
  is_int = kind == kInt;
  switch (kind) {
    case kFloat:
      if (ebits < 1 || mbits < 0 || infnan < kIeee || infnan > kInuz) return "invalid float format";
      bits = 1 + ebits + mbits;
      break;
    case kInt:
      bits = mbits + 1;
      if (bits < 2 || bits > 32) return "int width must be 2..32";
      break;
    case kUint:
      bits = mbits;
      if (bits < 1 || bits > 32) return "uint width must be 1..32";
      break;
    case kExponent:
      bits = ebits;
      if (ebits < 1 || ebits > kMaxExponentTypeBits)
        return "exponent (scale) types have at most 10 bits (e5m0 .. e10m0), got " +
               std::to_string(ebits);
      break;
    default: return "unknown number kind " + std::to_string(kind);
  }
  if (kind == kFloat && ebits > kMaxFloatExponentBits)
    return "floats have 1 to 11 exponent bits, got " + std::to_string(ebits);
  if (kind == kFloat && mbits > kMaxMantissaBits)
    return "floats have at most 52 mantissa bits, got " + std::to_string(mbits);
  if (bits > 64) return "at most 64 bits are supported";
  code_bytes = code_width(bits);
  has_inf = infnan == kIeee || infnan == kInuz;
  has_negzero = infnan == kIeee || infnan == kFn;
  uint64_t max_code = 0;
  switch (kind) {
    case kInt: max_code = (1ull << (bits - 1)) - 1; break;
    case kUint: max_code = bits >= 64 ? ~0ull : (1ull << bits) - 1; break;
    case kExponent: max_code = (1ull << ebits) - 2; break;
    default: {
      // Closed form (never a search): ieee stops below the Inf/NaN binade; fnuz's all-ones
      // magnitude is finite; fn's is NaN and inuz's is Inf.
      uint64_t sign_bit = 1ull << (bits - 1);
      max_code = infnan == kIeee ? (((1ull << ebits) - 1) << mbits) - 1
                 : infnan == kFnuz ? sign_bit - 1
                                   : sign_bit - 2;
    }
  }
  // Every finite value must be a float64 (limits.py): the top binade's exponent and the
  // smallest step, from the fields alone.
  if (kind == kFloat || kind == kExponent) {
    int64_t field = static_cast<int64_t>(kind == kExponent ? max_code : max_code >> mbits);
    if (kind == kFloat) field = std::max<int64_t>(field, 1);  // subnormals scale as field 1
    int64_t top = field - bias;
    int64_t step = kind == kExponent ? -static_cast<int64_t>(bias) : 1 - int64_t(bias) - mbits;
    if (top > kMaxValueExponent)
      return "the largest value reaches 2^" + std::to_string(top) +
             ", beyond float64's 2^1023; use a larger bias";
    if (step < kMinValueExponent)
      return "the smallest step 2^" + std::to_string(step) +
             " is below float64's 2^-1074; use a smaller bias";
  }
  maxfloat = decode(max_code);
  int ex = 0;
  std::frexp(maxfloat, &ex);
  emax = ex - 1;
  emin = kind == kFloat ? 1 - bias : kind == kExponent ? -bias : 0;
  double half_ulp = kind == kFloat ? std::ldexp(1.0, emax - mbits - 1) : 0.5;
  midmax = maxfloat + half_ulp;
  smallest_normal = std::ldexp(1.0, emin);
  f32_max = maxfloat;
  if (kind == kFloat) {  // the largest value float32 holds (24 bits, steps >= 2^-149)
    const double f32_top = 0x1.FFFFFEp127;
    if (f32_max > f32_top) {
      int e = std::max(127, emin) - mbits;
      f32_max = std::floor(std::ldexp(f32_top, -e)) * std::ldexp(1.0, e);
    }
    int fe = 0;
    std::frexp(f32_max, &fe);
    int e = std::max(fe - 1 - 23, -149);
    f32_max = std::floor(std::ldexp(f32_max, -e)) * std::ldexp(1.0, e);
  }
  if (kind == kFloat) {
    uint64_t sign = 1ull << (bits - 1);
    switch (infnan) {
      case kIeee:
        nan_code = (((1ull << ebits) - 1) << mbits) | (1ull << (mbits > 0 ? mbits - 1 : 0));
        break;
      case kFn: nan_code = sign - 1; break;
      default: nan_code = sign; break;
    }
  } else if (kind == kExponent) {
    nan_code = (1ull << ebits) - 1;
  }
  return "";
}

}  // namespace onnxq
