// The general cast path's shared pieces (internal to the kernels): tile statistics, tile
// parameters, the cast context, per-tile scratch, and the element loads and stores.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"

// A hot function split into named phases keeps one function's code: each phase always inlined.
#define ONNXQ_ALWAYS_INLINE __attribute__((always_inline)) inline

namespace onnxq::kern {

constexpr uint32_t kQuietNaN = 0x7FC00000u;
constexpr int64_t kChunk = 1 << 15;  // elements per parallel chunk of elementwise passes

inline float from_fbits_nan() {
  float f;
  std::memcpy(&f, &kQuietNaN, sizeof f);
  return f;
}

inline float load_x(const void* p, int type, int64_t i) {
  switch (type) {
    case kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline void store_y(void* p, int type, int64_t i, float y) {
  // Every NaN leaves as the canonical quiet NaN (reference._canonical_nan): a NaN code has no
  // payload, so upcast and virtual casts agree bit for bit.
  if (y != y) y = from_fbits_nan();
  switch (type) {
    case kF16: static_cast<uint16_t*>(p)[i] = float_to_half(y); break;
    case kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(y); break;
    default: static_cast<float*>(p)[i] = y; break;
  }
}

enum Path : int { kExp, kExpShift, kExpBook, kFloatScale, kZeroFloat, kZeroInt };

struct Stats {
  float amax = 0.0f;
  bool nonfinite = false, hasnan = false;
  float lo = INFINITY, hi = -INFINITY;  // over finite values (zero-point formats)
};

// One element of the statistics pass (reference: where(finite, |x|, 0).max(), isnan.any()...).
inline void accumulate(Stats& s, float x, bool want_range) {
  if (std::isfinite(x)) {
    float a = std::fabs(x);
    s.amax = a > s.amax ? a : s.amax;
    if (want_range) {
      s.lo = s.lo < x ? s.lo : x;  // numpy minimum: ties take the later value
      s.hi = s.hi > x ? s.hi : x;
    }
  } else {
    s.nonfinite = true;
    if (std::isnan(x)) s.hasnan = true;
  }
}

inline void merge(Stats& s, const Stats& o) {
  s.amax = o.amax > s.amax ? o.amax : s.amax;
  s.nonfinite |= o.nonfinite;
  s.hasnan |= o.hasnan;
  s.lo = s.lo < o.lo ? s.lo : o.lo;
  s.hi = s.hi > o.hi ? s.hi : o.hi;
}

struct TileParams {
  bool nan_tile = false;
  int sexp = 0;
  double inv = 1.0, pw = 1.0;  // 2^-sexp, 2^sexp
  float sc = 0.0f, eff = 0.0f, zero = 0.0f;
  double zp = 0.0;  // an int zero point: exact up to 2^32 - 1, which float cannot hold
  uint64_t scale_code = 0, zero_code = 0;
  // The element clamp's bound where the scale would overflow the data type (reference
  // finite_bound / _product_bound): unshifted, in a shifted subtile, and the zero-point range.
  double lim = INFINITY, lim_shift = INFINITY, q_lo = 0.0, q_hi = 0.0;
};

// reference._int_below: the largest integer whose float32 value is below f (a float32
// integer >= 1): f - 1 up to 2^24, else the midpoint of f and the float32 p below it, less
// one when p's mantissa is odd (the tie rounds to p only when p is even).
inline double int_below(double f) {
  if (f <= 16777216.0) return f - 1.0;
  float p = std::nextafter(static_cast<float>(f), 0.0f);
  uint32_t pbits;
  std::memcpy(&pbits, &p, sizeof pbits);
  double m = (static_cast<double>(p) + f) / 2.0;
  return (pbits & 1u) == 0 ? m : m - 1.0;
}

// reference._product_bound: the largest grid magnitude b (<= top) with float32(b) * scale
// finite in the data type (`limit`: elements.PRODUCT_LIMIT); ints over 24 bits whose
// float32(b) rounds up past the limit step to the float32 number below.
inline double product_bound(float scale, const Num& n, double top, double limit) {
  double sc = scale;
  if (!(sc > 0)) return top;
  double t = limit / sc;
  double b = finite_bound(t < 2.0 * top + 2.0 ? t : 2.0 * top + 2.0, n, top);
  if (b * sc >= limit) b = finite_bound(std::nextafter(b, 0.0), n, top);
  if (n.kind != kFloat) {
    double f = static_cast<float>(b);
    if (f * sc >= limit) b = int_below(f);
  }
  return b;
}

// reference._cast_scale for one value: saturating at the largest value float32 holds.
inline float cast_scale(float v, const Num& spec) {
  return static_cast<float>(
      quantize_value(static_cast<double>(v), spec, kEven, 0, false, false, spec.f32_max));
}

struct Ctx {
  const Format& f;
  const Modes& m;
  const Geometry& g;
  const QuantizeIO& io;
  Path path;
  uint32_t key;
  bool stochastic;
  int code_w, scale_w, zero_w;
  float ts = 0.0f;  // tensor scale (NVFP4)
  float nan_f;
  int64_t codes_base = 0;  // io.codes holds the codes from this element on
  int64_t meta_base = 0;   // and io.meta the meta from this unit on
};

// reference._int_frac_bits: an int element of N bits is fixed point with N - 2 fraction bits.
inline int int_frac_bits(const Num& e) { return e.is_int ? e.bits - 2 : 0; }

// reference._scale_exponent + clamp (docs/architecture.md, decisions 2-3).
inline int scale_exponent(float amax, const Num& e, const Num& s, int mode) {
  double a = amax;
  int maxexp = floor_log2(a > 0 ? a : 1.0);
  if (e.is_float) {
    bool bump = false;
    switch (mode) {
      case kSFloor: break;
      case kSCeil: bump = a > std::ldexp(1.0, maxexp); break;
      case kSMidmax: bump = a > std::ldexp(e.midmax, maxexp - e.emax); break;
      case kSTopbinade:
      case kSRceil: bump = a > std::ldexp(e.maxfloat, maxexp - e.emax); break;
      case kSOption3:
        bump = std::nearbyint(std::ldexp(a, e.mbits - maxexp)) >= std::ldexp(1.0, e.mbits + 1);
        break;
      default:
        bump = std::floor(std::ldexp(a, e.mbits - maxexp) + 0.5) >= std::ldexp(1.0, e.mbits + 1);
        break;
    }
    maxexp += bump ? 1 : 0;
  }
  // The stored exponent treats ints as fixed point with one integer bit (OCP MXINT8); the
  // value returned is the exponent of the element grid step, `int_frac_bits` lower.
  int frac = int_frac_bits(e);
  int stored = maxexp - e.emax + frac;
  int low = -s.bias, high = (1 << s.ebits) - 2 - s.bias;
  if (!(a > 0)) return low - frac;
  return (stored < low ? low : stored > high ? high : stored) - frac;
}


// The tile's scale, zero point and element clamp bounds from its statistics. `step`: a
// candidate of scale mode search (scale_search.py STEPS), relative to the floor exponent or
// in codes of a float scale.
TileParams tile_params(const Ctx& c, const Stats& st, int step = 0);

// scale_search.float_step: the float scale `step` (+1 or -1) codes from sc in spec's grid.
inline float float_step(float sc, const Num& spec, int step) {
  if (step == 0) return sc;
  double s = sc;
  int fl = floor_log2(s > 0 ? s : 1.0);
  int e = fl > spec.emin ? fl : spec.emin;
  double ulp = pow2(e - spec.mbits);
  double out;
  // the grid's neighbour or float32's, the farther: where the grid is finer than float32's,
  // the next float32 number (on the grid) is the next value a scale can be
  if (step > 0) {
    double grid = s > 0 ? s + ulp : pow2(spec.emin - spec.mbits);
    double near = std::nextafter(sc, INFINITY);
    out = grid > near ? grid : near;
    out = out < spec.f32_max ? out : spec.f32_max;
  } else {
    bool at_pow2 = s == pow2(e) && e > spec.emin;  // the step below a power of two is half
    double grid = s > 0 ? s - (at_pow2 ? ulp * 0.5 : ulp) : 0.0;
    double near = std::nextafter(sc, 0.0f);
    out = grid < near ? grid : near;
  }
  return static_cast<float>(out);
}

struct Scratch {
  std::vector<float> x;
  std::vector<int64_t> idx;
  std::vector<uint8_t> keep;
  std::vector<double> v, q;
  std::vector<int> mag;
  // Scale mode search: a trial run writes each position's decoded value into y instead of
  // the outputs (and no meta).
  bool trial = false;
  std::vector<float> y;
};

// Gathers tile t into s.x (to_tiles order, zero padding) with input indices in s.idx (-1 for
// padding), and prunes it when the format is N:M sparse.
void gather_tile(const Ctx& c, int64_t t, Scratch& s);
// Casts tile t (statistics, scale, every element, meta) into c.io.
void process_tile(const Ctx& c, int64_t t, Scratch& s);
// Elementwise pass for one scale over elements [begin, end) of the whole tensor.
void tensor_elements(const Ctx& c, const TileParams& p, int64_t begin, int64_t end);

}  // namespace onnxq::kern
