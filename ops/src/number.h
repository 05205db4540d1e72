// Number formats and element rounding: the C++ twin of onnxq/formats/number.py and
// onnxq/cast/elements.py. Every function mirrors its numpy counterpart operation by operation
// (float64 where the reference computes in float64, float32 where it computes in float32), so
// the results are identical bit for bit. Build without -ffast-math and with -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace onnxq {

enum Kind : int { kFloat = 0, kInt = 1, kUint = 2, kExponent = 3 };
enum InfNaN : int { kNone = 0, kIeee = 1, kFn = 2, kFnuz = 3, kInuz = 4 };
enum RoundMode : int { kEven = 0, kAway = 1, kZero = 2, kStochastic = 3 };
enum ScaleMode : int {
  kSFloor = 0, kSCeil = 1, kSMidmax = 2, kSOption3 = 3, kSTopbinade = 4, kSRceil = 5, kSEven = 6,
  kSSearch = 7  // per-tile candidates by squared error (onnxq/cast/scale_search.py)
};

inline uint64_t dbits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
inline double from_dbits(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
inline uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float from_fbits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// elements.floor_log2: exponent field of a float64 minus 1023 (0 -> -1023, inf/nan -> 1024).
inline int floor_log2(double a) { return static_cast<int>((dbits(a) >> 52) & 0x7FF) - 1023; }
// elements.pow2: 2^k for k in [-1023, 1023] from the exponent bits (k = -1023 gives 0.0).
inline double pow2(int k) { return from_dbits(static_cast<uint64_t>(k + 1023) << 52); }

// Wellons' lowbias32 hash and the counter-based stochastic bits of elements.stochastic_bits.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; return x ^ (x >> 16);
}
inline uint32_t seed_key(uint64_t seed) {
  return mix32(static_cast<uint32_t>(seed & 0xFFFFFFFFu) ^ 0x9E3779B9u);
}
inline uint32_t stochastic_bits(uint32_t key, uint64_t index) {
  uint32_t lo = static_cast<uint32_t>(index & 0xFFFFFFFFu);
  uint32_t hi = static_cast<uint32_t>(index >> 32);
  return mix32(lo ^ mix32(hi ^ key)) >> 8;
}

// The limits of the format language (onnxq/formats/limits.py and docs/formats.md, "Limits").
constexpr size_t kMaxCodeLength = 128;   // characters after stripping ASCII whitespace
constexpr size_t kMaxDigits = 5;         // per number field
constexpr int kMaxFloatExponentBits = 11;
constexpr int kMaxMantissaBits = 52;
constexpr int kMaxExponentTypeBits = 10;
constexpr int kMaxElementBits = 32;      // element codes; a codebook's compute type
constexpr int kMaxScaleBits = 32;        // scales, zero points, tensor scales
constexpr int kMaxTile = 65536;
constexpr int kMaxSparseM = 16;
constexpr int kMaxValueExponent = 1023;  // every finite value is a float64
constexpr int kMinValueExponent = -1074;
// Under an exponent scale, the element grid's steps where a float32 tile reaches and the
// scale's smallest grid step, 2^-(bias + an int element's fraction bits), are normal float64
// numbers: the kernels scale and round with exact powers of two.
constexpr int kMinScaleStepExponent = -1022;
// How far below a float element's emax a float32 tile under an exponent scale puts values
// (2^-149 under the largest scale its amax can take, plus one search step): limits.py.
constexpr int kFloat32TileReach = 278;

// A number spec with the derived values the kernels use (NumberSpec's properties).
struct Num {
  int kind = kFloat, ebits = 0, mbits = 0, bias = 0, infnan = kNone;
  int bits = 0, emax = 0, emin = 0;
  double maxfloat = 0, midmax = 0, smallest_normal = 1;
  double f32_max = 0;  // NumberSpec.float32_max: where float scales and zero points saturate
  bool has_inf = false, has_negzero = false, is_float = false, is_int = false;
  uint64_t nan_code = 0;
  int code_bytes = 1;

  // Fills the derived fields; returns an error message (empty when valid).
  std::string derive();
  double decode(uint64_t code) const;  // NumberSpec.decode (NaN/inf included)
  std::string name() const;            // the canonical code, for messages
};

// The smallest unsigned width (bytes) holding `bits` (packing.code_dtype).
inline int code_width(int bits) { return bits <= 8 ? 1 : bits <= 16 ? 2 : bits <= 32 ? 4 : 8; }

// elements.round_magnitude on a non-negative float64.
inline double round_magnitude(double t, int mode, uint32_t rand) {
  switch (mode) {
    case kEven: return std::nearbyint(t);
    case kAway: return std::floor(t + 0.5);
    case kZero: return std::ceil(t - 0.5);
    default: {
      double low = std::floor(t);
      double threshold = std::floor((t - low) * 16777216.0);
      return low + (static_cast<double>(rand) < threshold ? 1.0 : 0.0);
    }
  }
}

// elements.finite_bound: the largest grid value of n that is <= t (> 0), at most top.
inline double finite_bound(double t, const Num& n, double top) {
  if (!(t < top)) return top;
  if (n.kind != kFloat) return std::floor(t);
  int fl = floor_log2(t);
  int e = (fl > n.emin ? fl : n.emin) - n.mbits;
  return std::floor(t * pow2(-e)) * pow2(e);
}

// elements.quantize_values for one float64 value; `limit` (elements.finite_bound) lowers the
// clamp of both signs where the scale would take the top values past the data type's range.
inline double quantize_value(double v, const Num& n, int mode, uint32_t rand, bool keep_inf,
                             bool full_int_range, double limit = INFINITY) {
  double a = std::fabs(v);
  double q;
  if (n.kind == kFloat) {
    int low = n.emin > n.mbits - 1022 ? n.emin : n.mbits - 1022;
    int fl = floor_log2(a);
    int hi = 1022 + n.mbits;
    int e = (fl < low ? low : fl > hi ? hi : fl) - n.mbits;
    q = round_magnitude(a * pow2(-e), mode, rand) * pow2(e);
  } else {
    q = round_magnitude(a, mode, rand);
  }
  double top = n.maxfloat;
  if (full_int_range && n.kind == kInt && v < 0) top = top + 1.0;
  top = top < limit ? top : limit;
  double clamped = q > top ? top : q;  // np.minimum: NaN stays NaN
  if (keep_inf && n.has_inf && std::isinf(a)) clamped = INFINITY;
  double out = std::copysign(clamped, v);
  if (!n.has_negzero) out += 0.0;
  return out;
}

// elements.encode_values for one value already on the grid of n.
inline uint64_t encode_value(double q, const Num& n) {
  switch (n.kind) {
    case kInt: {
      uint64_t mask = n.bits >= 64 ? ~0ull : ((1ull << n.bits) - 1);
      return static_cast<uint64_t>(static_cast<int64_t>(q)) & mask;
    }
    case kUint: return static_cast<uint64_t>(q);
    case kExponent: {
      if (std::isnan(q)) return (1ull << n.ebits) - 1;
      return static_cast<uint64_t>(floor_log2(q > 0 ? q : 1.0) + n.bias);
    }
    default: break;
  }
  if (n.bits == 32 && n.ebits == 8 && n.infnan == kIeee) {
    return fbits(static_cast<float>(q));
  }
  if (std::isnan(q)) return n.nan_code;
  bool neg = std::signbit(q);
  double a = std::fabs(q);
  if (std::isinf(a)) {
    if (n.has_inf) {
      uint64_t top = n.infnan == kIeee ? (((1ull << n.ebits) - 1) << n.mbits)
                                       : ((1ull << (n.bits - 1)) - 1);
      return top | (static_cast<uint64_t>(neg) << (n.bits - 1));
    }
    a = 0.0;  // numpy: safe = 0 (only reachable for formats with inf)
  }
  int fl = floor_log2(a);
  int e = fl > n.emin ? fl : n.emin;
  bool normal = a >= n.smallest_normal;
  int64_t scaled = static_cast<int64_t>(std::ldexp(a, n.mbits - e));
  int64_t mant = normal ? scaled - (int64_t(1) << n.mbits) : scaled;
  int64_t field = normal ? e + n.bias : 0;
  uint64_t code = static_cast<uint64_t>((field << n.mbits) | mant);
  bool sign = neg && (n.has_negzero || a != 0);
  return code | (static_cast<uint64_t>(sign) << (n.bits - 1));
}

// Float conversions with numpy / ml_dtypes semantics (round to nearest even).
inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FFu;
  if (exp == 0x1F) return from_fbits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return from_fbits(sign);
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    return sign ? -v : v;
  }
  return from_fbits(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t float_to_half(float f) {
  uint32_t x = fbits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t fexp = x & 0x7F800000u, fsig = x & 0x007FFFFFu;
  if (fexp == 0x7F800000u) {
    if (fsig) {
      uint16_t ret = static_cast<uint16_t>(0x7C00u + (fsig >> 13));
      if (ret == 0x7C00u) ret++;
      return sign + ret;
    }
    return sign | 0x7C00u;
  }
  if (fexp >= 0x47800000u) return sign | 0x7C00u;  // overflow to inf
  if (fexp <= 0x38000000u) {                         // half subnormal or zero
    if (fexp < 0x33000000u) return sign;             // below half the smallest subnormal
    uint32_t e = fexp >> 23;
    uint32_t sig = 0x00800000u + fsig;
    uint32_t shift = 113 - e;  // 14 .. 24 -> value = sig >> (shift + 13 - 13)
    // Round to nearest even at bit (shift + 13 - 13 + ...): half mant = sig >> (126 - e + ...)
    uint32_t total = shift + 13;
    uint32_t h = sig >> total;
    uint32_t rem = sig & ((1u << total) - 1), halfway = 1u << (total - 1);
    h += rem + (h & 1u) > halfway;  // above half, or half with h odd: no data-dependent branch
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((fexp - 0x38000000u) >> 13) | (fsig >> 13);
  uint32_t rem = fsig & 0x1FFFu;
  h += rem + (h & 1u) > 0x1000u;  // to nearest even; may carry into inf: correct
  return sign | static_cast<uint16_t>(h);
}

inline float bf16_to_float(uint16_t b) { return from_fbits(static_cast<uint32_t>(b) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t x = fbits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u) & 0xFFC0u;
  uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

}  // namespace onnxq
