// The cast kernels: onnxq/cast/reference.py, tile by tile, in C++.
//
// Each tile is gathered into a small float32 buffer in layout.py's to_tiles order (padding is
// zero), its statistics and scale are computed exactly as the reference computes them, and
// every element is rounded with the reference's arithmetic (float64 for exponent scales,
// float32 for float scales and zero points). Tiles are independent, so they run in parallel;
// a tensor-wide scale is a parallel reduction followed by an elementwise pass.
#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <thread>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace onnxq {

namespace {

constexpr uint32_t kQuietNaN = 0x7FC00000u;

// Vector arguments of the per-ISA kernels are internal (always inlined): no ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"

// Whether this thread's FPU flushes subnormals (x86 MXCSR flush-to-zero or
// denormals-are-zero); kernels that rely on float32 subnormal arithmetic then step aside.
inline bool fpu_flushes() {
#if defined(__x86_64__) || defined(__i386__)
  return (__builtin_ia32_stmxcsr() & 0x8040u) != 0;
#else
  return true;
#endif
}

// The widest instruction set this CPU has: 2 (AVX-512 F/BW/VL/DQ, and BMI2 where `bmi2`), 1
// (AVX2), 0 (baseline x86-64 or another architecture). ONNXQ_SIMD=base|avx2|avx512 caps it (for
// tests and comparisons); ONNXQ_SIMD=none is checked by each fast path's setup.
inline int simd_level(bool bmi2) {
  const char* cap = std::getenv("ONNXQ_SIMD");
  const std::string want = cap ? cap : "";
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                (!bmi2 || __builtin_cpu_supports("bmi2"));
  bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512 && (want.empty() || want == "avx512")) return 2;
  if (avx2 && (want.empty() || want == "avx512" || want == "avx2")) return 1;
#else
  (void)bmi2;
#endif
  return 0;
}

// Whether an output of `bytes` is written with streaming stores: ONNXQ_DQ_STREAM=0/1 forces it,
// else outputs over 8 MiB (far larger than the caches, so the read for ownership is wasted).
inline bool stream_output(int64_t bytes) {
  const char* env = std::getenv("ONNXQ_DQ_STREAM");
  return env ? env[0] == '1' : bytes > (int64_t(8) << 20);
}

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
  float sc = 0.0f, eff = 0.0f, zero = 0.0f, zp = 0.0f;
  uint64_t scale_code = 0, zero_code = 0;
  // The element clamp's bound where the scale would overflow the data type (reference
  // finite_bound / _product_bound): unshifted, in a shifted subtile, and the zero-point range.
  double lim = INFINITY, lim_shift = INFINITY, q_lo = 0.0, q_hi = 0.0;
};

// reference._product_bound: the largest grid magnitude b (<= top) with float32(b * scale)
// finite in the data type (`limit`: elements.PRODUCT_LIMIT).
inline double product_bound(float scale, const Num& n, double top, double limit) {
  double sc = scale;
  if (!(sc > 0)) return top;
  double t = limit / sc;
  double b = finite_bound(t < 2.0 * top + 2.0 ? t : 2.0 * top + 2.0, n, top);
  if (b * sc >= limit) b = finite_bound(std::nextafter(b, 0.0), n, top);
  return b;
}

// reference._cast_scale for one value.
inline float cast_scale(float v, const Num& spec) {
  return static_cast<float>(quantize_value(static_cast<double>(v), spec, kEven, 0, false, false));
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

TileParams tile_params(const Ctx& c, const Stats& st) {
  const Format& f = c.f;
  TileParams p;
  if (c.m.nan_policy == 1) {
    p.nan_tile = st.nonfinite;
  } else if (!f.elem.is_float || f.codebook() || f.has_zero) {
    p.nan_tile = st.hasnan;  // no NaN code: a NaN poisons its tile through the scale
  }
  switch (c.path) {
    case kExp:
    case kExpShift:
    case kExpBook: {
      p.sexp = scale_exponent(st.amax, f.elem, f.scale, c.m.scale_mode);
      p.inv = pow2(-p.sexp);
      p.pw = pow2(p.sexp);
      p.scale_code = p.nan_tile ? (1ull << f.scale.ebits) - 1
                                : static_cast<uint64_t>(p.sexp + int_frac_bits(f.elem) + f.scale.bias);
      // The element magnitude that decodes to the type's largest finite value (exact).
      double reach = std::ldexp(max_finite(finite_type(c.io)), -p.sexp);
      double top = f.elem.maxfloat + (c.m.full_int_range && f.elem.kind == kInt ? 1.0 : 0.0);
      p.lim = finite_bound(reach, f.elem, top);
      p.lim_shift = finite_bound(2.0 * reach, f.elem, top);
      break;
    }
    case kFloatScale: {
      float raw = st.amax / static_cast<float>(f.elem.maxfloat);
      if (f.has_ts) raw = c.ts > 0 ? raw / c.ts : 0.0f;
      p.sc = cast_scale(raw, f.scale);
      p.eff = f.has_ts ? p.sc * c.ts : p.sc;
      p.scale_code = encode_value(p.nan_tile ? NAN : static_cast<double>(p.sc), f.scale);
      double top = f.elem.maxfloat + (c.m.full_int_range && f.elem.kind == kInt ? 1.0 : 0.0);
      p.lim = product_bound(p.eff, f.elem, top, product_limit(finite_type(c.io)));
      break;
    }
    case kZeroFloat: {
      float qmax = static_cast<float>(f.elem.maxfloat);
      float lo = std::isfinite(st.lo) ? st.lo : 0.0f;
      float hi = std::isfinite(st.hi) ? st.hi : 0.0f;
      p.zero = static_cast<float>(quantize_value(lo, f.zero, kEven, 0, false, false));
      float r = (hi - p.zero) / qmax;
      float raw = r < 0.0f ? 0.0f : r;  // np.maximum(r, 0): ties and NaN keep r's value
      if (r == 0.0f) raw = 0.0f;
      p.sc = cast_scale(raw, f.scale);
      p.scale_code = encode_value(p.nan_tile ? NAN : static_cast<double>(p.sc), f.scale);
      p.zero_code = encode_value(static_cast<double>(p.zero), f.zero);
      // reference._zero_float_top: the largest q whose decoded value stays finite.
      const float over = overflow_f32(finite_type(c.io));
      const double s64 = p.sc, z64 = p.zero, qm = qmax;
      double q = qm;
      if (s64 > 0) {
        double t = std::floor((static_cast<double>(over) - z64) / s64) + 1.0;
        q = t < 0.0 ? 0.0 : t > qm ? qm : t;  // np.clip (NaN stays NaN)
      }
      for (int k = 0; k < 3; ++k) {
        float y = static_cast<float>(q) * p.sc + p.zero;
        if (std::fabs(y) >= over && q > 0) q -= 1.0;
      }
      p.q_hi = q;
      break;
    }
    case kZeroInt: {
      float qmax = static_cast<float>(f.elem.maxfloat);
      float lo = std::isfinite(st.lo) ? st.lo : 0.0f;
      float hi = std::isfinite(st.hi) ? st.hi : 0.0f;
      lo = lo < 0.0f ? lo : 0.0f;  // np.minimum(lo, 0): ties take 0
      hi = hi > 0.0f ? hi : 0.0f;
      float raw = (hi - lo) / qmax;
      p.sc = cast_scale(raw, f.scale);
      float zp = p.sc > 0 ? -lo / p.sc : 0.0f;
      zp = std::nearbyint(zp);
      zp = zp < 0.0f ? 0.0f : zp > qmax ? qmax : zp;
      p.zp = zp;
      // q - zp decodes to (q - zp) * sc: keep |q - zp| where that stays finite.
      double reach = product_bound(p.sc, f.elem, qmax, product_limit(finite_type(c.io)));
      double zpd = zp;
      p.q_lo = zpd - reach > 0.0 ? zpd - reach : 0.0;
      p.q_hi = zpd + reach < qmax ? zpd + reach : static_cast<double>(qmax);
      p.scale_code = encode_value(p.nan_tile ? NAN : static_cast<double>(p.sc), f.scale);
      p.zero_code = encode_value(static_cast<double>(p.zp), f.zero);
      break;
    }
  }
  return p;
}

inline double nan_to_num(double q) { return std::isnan(q) ? 0.0 : q; }

// One element of every path but codebooks. `factor` is the MX shift (2.0 when shifted).
inline void quant_elem(const Ctx& c, const TileParams& p, float x, uint32_t r, bool shifted,
                       float* y, uint64_t* code) {
  const Format& f = c.f;
  const Num& n = f.elem;
  int rm = c.m.round_mode;
  switch (c.path) {
    case kExp:
    case kExpShift: {
      double v = static_cast<double>(x) * p.inv;
      if (shifted) v = v * 2.0;
      double q = quantize_value(v, n, rm, r, false, c.m.full_int_range,
                                shifted ? p.lim_shift : p.lim);
      double out = q * p.pw;
      if (shifted) out = out * 0.5;
      *y = static_cast<float>(out);
      if (c.io.codes) *code = encode_value(n.is_float ? q : nan_to_num(q), n);
      break;
    }
    case kFloatScale: {
      // A zero scale zeroes everything, but NaN stays NaN (reference._float_scaled).
      float v = p.eff > 0 ? x / p.eff : (x != x ? x : 0.0f);
      double q =
          quantize_value(static_cast<double>(v), n, rm, r, false, c.m.full_int_range, p.lim);
      *y = static_cast<float>(q) * p.eff;
      if (c.io.codes) *code = encode_value(n.is_float ? q : nan_to_num(q), n);
      break;
    }
    case kZeroFloat: {
      double qmax = n.maxfloat;
      float shifted_x = x - p.zero;
      float v = p.sc > 0 ? shifted_x / p.sc : 0.0f;
      double v64 = v;
      double q = std::copysign(round_magnitude(std::fabs(v64), rm, r), v64);
      q = q < 0.0 ? 0.0 : q > qmax ? qmax : q;
      q = q > p.q_hi ? p.q_hi : q;  // reference: np.where(q > q_hi, q_hi, q)
      *y = static_cast<float>(q) * p.sc + p.zero;
      *code = static_cast<uint64_t>(static_cast<int64_t>(nan_to_num(q)));
      break;
    }
    case kZeroInt: {
      double qmax = n.maxfloat;
      float v = p.sc > 0 ? x / p.sc : 0.0f;
      double v64 = v;
      double q = std::copysign(round_magnitude(std::fabs(v64), rm, r), v64) +
                 static_cast<double>(p.zp);
      q = q < 0.0 ? 0.0 : q > qmax ? qmax : q;
      q = q < p.q_lo ? p.q_lo : q > p.q_hi ? p.q_hi : q;
      *y = static_cast<float>(q - static_cast<double>(p.zp)) * p.sc;
      *code = static_cast<uint64_t>(static_cast<int64_t>(nan_to_num(q)));
      break;
    }
    default: break;
  }
  if (p.nan_tile) {
    *y = c.nan_f;
    *code = 0;
  }
}

struct Scratch {
  std::vector<float> x;
  std::vector<int64_t> idx;
  std::vector<uint8_t> keep;
  std::vector<double> v, q;
  std::vector<int> mag;
};

// N:M pruning inside a gathered tile (reference._prune): keep the N largest |x| of each group of
// M along the sparse dimension (NaN counts as +inf, ties keep the lower index, padding -1).
void prune_tile(const Ctx& c, Scratch& s, int64_t Tr, int64_t Tc) {
  const Format& f = c.f;
  int M = f.sparse_m, N = f.sparse_n;
  bool along_rows = c.g.kind == 2 && f.sparse_dim == 0;
  int64_t lines = along_rows ? Tc : Tr, len = along_rows ? Tr : Tc;
  float key[16];
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t g0 = 0; g0 < len; g0 += M) {
      int cnt = static_cast<int>(std::min<int64_t>(M, len - g0));
      int64_t pos[16];
      for (int k = 0; k < M; ++k) {
        if (k >= cnt) { key[k] = -1.0f; pos[k] = -1; continue; }
        int64_t e = along_rows ? (g0 + k) * Tc + line : line * Tc + g0 + k;
        pos[k] = e;
        float xv = s.x[e];
        key[k] = s.idx[e] < 0 ? -1.0f : std::isnan(xv) ? INFINITY : std::fabs(xv);
      }
      for (int k = 0; k < cnt; ++k) {
        int rank = 0;
        for (int j = 0; j < M; ++j) {
          if (key[j] > key[k] || (key[j] == key[k] && j < k)) rank++;
        }
        bool kept = rank < N;
        s.keep[pos[k]] = kept ? 1 : 0;
        if (!kept) s.x[pos[k]] = 0.0f;
      }
    }
  }
}

// Gathers tile t into s.x (to_tiles order, zero padding) with input indices in s.idx (-1 for
// padding), and prunes it when the format is N:M sparse.
void gather_tile(const Ctx& c, int64_t t, Scratch& s) {
  const Geometry& g = c.g;
  int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
  int64_t Tr = g.Tr, Tc = g.Tc, n = Tr * Tc;
  s.x.resize(static_cast<size_t>(n));
  s.idx.resize(static_cast<size_t>(n));
  if (c.f.sparse_m) s.keep.assign(static_cast<size_t>(n), 1);
  for (int64_t i = 0; i < Tr; ++i) {
    int64_t r = rt * Tr + i;
    int64_t c0 = ct * Tc;
    float* xr = s.x.data() + i * Tc;
    int64_t* ir = s.idx.data() + i * Tc;
    if (r >= g.R) {
      std::fill(xr, xr + Tc, 0.0f);
      std::fill(ir, ir + Tc, int64_t(-1));
      continue;
    }
    int64_t valid = std::min<int64_t>(Tc, g.C - c0);
    if (g.kind == 0) {  // one tile: the tensor in moved order (axis last), as to_tiles
      for (int64_t j = 0; j < valid; ++j) {
        int64_t k = c0 + j;
        int64_t o = g.orig(k / g.A, k % g.A);
        ir[j] = o;
        xr[j] = load_x(c.io.x, c.io.x_type, o);
      }
      for (int64_t j = valid; j < Tc; ++j) { xr[j] = 0.0f; ir[j] = -1; }
      continue;
    }
    int64_t base = g.orig(b * g.R + r, c0);
    if (g.Post == 1 && c.io.x_type == kF32) {
      const float* src = static_cast<const float*>(c.io.x) + base;
      for (int64_t j = 0; j < valid; ++j) { xr[j] = src[j]; ir[j] = base + j; }
    } else {
      for (int64_t j = 0; j < valid; ++j) {
        int64_t o = base + j * g.Post;
        ir[j] = o;
        xr[j] = load_x(c.io.x, c.io.x_type, o);
      }
    }
    for (int64_t j = valid; j < Tc; ++j) { xr[j] = 0.0f; ir[j] = -1; }
  }
  if (c.f.sparse_m) prune_tile(c, s, Tr, Tc);
}

// The sum of reference.l2_metric: left to right in float64 (its order decides near-ties
// between mappings).
inline double unit_sum(const double* sq, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += sq[i];
  return acc;
}

void process_tile(const Ctx& c, int64_t t, Scratch& s) {
  const Geometry& g = c.g;
  const Format& f = c.f;
  const QuantizeIO& io = c.io;
  int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
  int64_t Tr = g.Tr, Tc = g.Tc, n = Tr * Tc;
  gather_tile(c, t, s);
  if (f.sparse_m) {
    if (io.mask) {
      for (int64_t k = 0; k < n; ++k) if (s.idx[k] >= 0) io.mask[s.idx[k]] = s.keep[k];
    }
  }
  Stats st;
  bool want_range = c.path == kZeroFloat || c.path == kZeroInt;
  for (int64_t k = 0; k < n; ++k) accumulate(st, s.x[k], want_range);
  TileParams p = tile_params(c, st);
  int64_t gi = g.kind == 0 ? 0 : g.grid(b, rt, ct, g.nR, g.nC);
  if (io.scale) store_code(io.scale, c.scale_w, gi, p.scale_code);
  if (io.zero && f.has_zero) store_code(io.zero, c.zero_w, gi, p.zero_code);

  auto emit = [&](int64_t k, float y, uint64_t code) {
    int64_t o = s.idx[k];
    if (o < 0) return;
    if (f.sparse_m && !s.keep[k]) y = 0.0f;  // pruned positions read as zero
    if (io.values) store_y(io.values, io.values_type, o, y);
    if (io.codes) store_code(io.codes, c.code_w, o - c.codes_base, code);
  };
  auto rand_at = [&](int64_t k) -> uint32_t {
    return c.stochastic && s.idx[k] >= 0 ? stochastic_bits(c.key, static_cast<uint64_t>(s.idx[k]))
                                         : 0u;
  };

  if (c.path == kExp || c.path == kFloatScale || c.path == kZeroFloat || c.path == kZeroInt) {
    for (int64_t k = 0; k < n; ++k) {
      if (s.idx[k] < 0) continue;
      float y = 0.0f;
      uint64_t code = 0;
      quant_elem(c, p, s.x[k], rand_at(k), false, &y, &code);
      emit(k, y, code);
    }
    return;
  }
  // Units: subtiles (to_subtiles order) or the whole tile.
  int64_t Sr = g.Sc ? g.Sr : Tr, Sc = g.Sc ? g.Sc : Tc;
  int64_t ur = Tr / Sr, uc = Tc / Sc, usize = Sr * Sc;
  int64_t sub_rows = g.sub_rows(), sub_cols = g.sub_cols();
  double thr = pow2(floor_log2(static_cast<double>(st.amax)));
  std::vector<int64_t> ue(usize);
  for (int64_t ui = 0; ui < ur; ++ui) {
    for (int64_t uj = 0; uj < uc; ++uj) {
      for (int64_t a = 0; a < Sr; ++a)
        for (int64_t bb = 0; bb < Sc; ++bb) ue[a * Sc + bb] = (ui * Sr + a) * Tc + uj * Sc + bb;
      uint8_t meta = 0;
      if (c.path == kExpShift) {
        bool below = true;
        for (int64_t k : ue) {
          float xv = s.x[k];
          double ax = std::isfinite(xv) ? std::fabs(xv) : 0.0;
          if (!(ax < thr)) { below = false; break; }
        }
        meta = below ? 1 : 0;
        for (int64_t k : ue) {
          if (s.idx[k] < 0) continue;
          float y = 0.0f;
          uint64_t code = 0;
          quant_elem(c, p, s.x[k], rand_at(k), below, &y, &code);
          emit(k, y, code);
        }
      } else {  // codebook: nearest entry per mapping, mapping with the least L2 error
        const Num& comp = f.elem;
        int half = 1 << (f.cb_ib - 1), maps = 1 << f.cb_mb;
        s.v.resize(usize);
        for (int64_t u = 0; u < usize; ++u) s.v[u] = static_cast<double>(s.x[ue[u]]) * p.inv;
        double best = 0.0;
        int best_map = 0;
        // Each mapping keeps to its entries <= the tile's bound (reference._codebook_select).
        double bound = finite_bound(std::ldexp(max_finite(finite_type(c.io)), -p.sexp), comp,
                                    comp.maxfloat);
        auto nearest = [&](int map, double vv, int* idx_out) -> double {
          const double* tab = f.mags.data() + static_cast<size_t>(map) * half;
          const uint8_t* ev = f.even.data() + static_cast<size_t>(map) * half;
          double cap = *(std::upper_bound(tab, tab + half, bound) - 1);
          double a = std::fabs(vv);
          a = a > cap ? cap : a;  // np.minimum: NaN stays NaN
          int lo_i = static_cast<int>(std::lower_bound(tab, tab + half, a) - tab);
          if (std::isnan(a)) lo_i = half;
          int hi = lo_i < 1 ? 1 : lo_i > half - 1 ? half - 1 : lo_i;
          int lo = hi - 1;
          double d_lo = a - tab[lo], d_hi = tab[hi] - a;
          bool tie_hi = c.m.round_mode == kEven ? ev[hi] != 0 : c.m.round_mode == kAway;
          bool pick_hi = (d_hi < d_lo) || (d_hi == d_lo && tie_hi);
          int idx = pick_hi ? hi : lo;
          *idx_out = idx;
          double q = std::copysign(tab[idx], vv);
          if (!comp.has_negzero) q += 0.0;
          return q;
        };
        s.q.resize(usize);
        for (int map = 0; map < maps; ++map) {
          for (int64_t u = 0; u < usize; ++u) {
            int idx;
            double q = nearest(map, s.v[u], &idx);
            double d = s.v[u] - q;
            s.q[u] = d * d;
          }
          double err = unit_sum(s.q.data(), usize);
          if (map == 0 || err < best) { best = err; best_map = map; }
        }
        meta = static_cast<uint8_t>(best_map);
        for (int64_t u = 0; u < usize; ++u) {
          int64_t k = ue[u];
          if (s.idx[k] < 0) continue;
          int idx;
          double q = nearest(best_map, s.v[u], &idx);
          bool negative = std::signbit(q) && (q != 0 || comp.has_negzero);
          uint64_t code = (static_cast<uint64_t>(negative) << (f.cb_ib - 1)) |
                          static_cast<uint64_t>(idx);
          float y = static_cast<float>(q * p.pw);
          if (p.nan_tile) { y = c.nan_f; code = 0; }
          emit(k, y, code);
        }
      }
      if (io.meta) {
        if (g.Sc) {
          int64_t gr = rt * ur + ui, gc = ct * uc + uj;
          if (gr < sub_rows && gc < sub_cols)
            io.meta[g.grid(b, gr, gc, sub_rows, sub_cols) - c.meta_base] = meta;
        } else {
          io.meta[gi - c.meta_base] = meta;
        }
      }
    }
  }
}

// Elementwise pass for one scale over the whole tensor (memory order: order-independent).
void tensor_elements(const Ctx& c, const TileParams& p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float x = load_x(c.io.x, c.io.x_type, i);
    uint32_t r = c.stochastic ? stochastic_bits(c.key, static_cast<uint64_t>(i)) : 0u;
    float y = 0.0f;
    uint64_t code = 0;
    quant_elem(c, p, x, r, false, &y, &code);
    if (c.io.values) store_y(c.io.values, c.io.values_type, i, y);
    if (c.io.codes) store_code(c.io.codes, c.code_w, i, code);
  }
}

constexpr int64_t kChunk = 1 << 15;

// -- fast row kernels (fast_impl.h) ----------------------------------------------------------
// The per-format constants of the fast path and the parameters of one tile.
struct FastTile {
  bool nan_tile = false, zero_tile = false;
  int kint = 0, kmin = 0;
  uint32_t top_pos = 0, top_neg = 0, thr = 0;
  // fk_rne: float32 bits of 2^(kmin + 23) (adding and subtracting it rounds to a multiple of
  // 2^kmin) and of 2^(kmin + mbits), where float elements become normal
  uint32_t magic = 0, norm_thr = 0;
  float eff = 0.0f, sc = 0.0f;
};

struct FastFormat {
  const Ctx* c = nullptr;
  bool is_float = false, negzero = false, float_scale = false, nan_on_nan = false;
  bool full_int_range = false, floor_mode = false;
  int mbits = 0, emin = 0, rm = 0, sub = 0, tc = 0, policy = 0;
  int top_field = 0;            // biased float32 exponent of the element maxfloat
  uint32_t top_mant = 0;        // its float32 mantissa bits
  int neg_field = 0;            // biased float32 exponent of maxfloat + 1 (full int range)
  // float scales: the scale number's grid and the elements' fixed grid (s = 0)
  int scale_kmin = 0, scale_is_float = 0;
  uint32_t scale_top = 0;
  int scale_rm = 0, scale_mbits = 0;
  bool scale_negzero = false;
  float maxfloat_f = 0.0f, ts = 0.0f;
  bool has_ts = false;
  // codes: the element's exponent bias, code width and NaN code; the scale's code of the tile
  // exponent s (s + scale_code_add) or its float number (scale_*), and its NaN code
  int ebias = 0, code_bits = 8;
  uint32_t nan_code = 0;
  int scale_code_add = 0, scale_emin = 0, scale_bias = 0, scale_bits = 8;
  uint32_t scale_nan_code = 0;
  // exponent scales, integer-only (fk_exp_params): s = clamp(floor_log2 amax + bump - emax +
  // frac, low, high) - frac, bump = mantissa bits of amax >= bump_ge (the scale mode)
  int emax = 0, frac = 0, low = 0, high = 0;
  uint32_t bump_ge = 0;
  // round to nearest even with float32 adds (fk_rne): off when the FPU flushes subnormals
  bool rne_add = false;
  // float scales: the element grid's tile (the same for every tile, s = 0) and the scale
  // number's grid as a tile (stile_rne: fk_rne applies to it)
  FastTile ftile, stile;
  bool stile_rne = false;
  // codes read off the rounding (fk_vrne_code): the largest code magnitudes
  bool code_direct = false;
  int32_t cmax_pos = 0, cmax_neg = 0;
  // The data type's largest finite value (float32 bits) and elements.PRODUCT_LIMIT: tiles whose
  // top values would pass them take the general path (its clamp bound, finite_bound).
  uint32_t finite_top = 0x7F7FFFFFu;
  double prod_limit = 0.0;
};


// The outputs of the fast row kernels (tensors tiled along their last axis, Post == 1).
struct FastOut {
  float* y = nullptr;          // values (float32), or null
  uint8_t* codes = nullptr;    // codes, one byte per element, or null
  uint8_t* packed = nullptr;   // or the packing.py stream (every tile starts on a byte)
  uint8_t* scale = nullptr;    // scale codes, one byte per tile (row * nC + tile), or null
  uint8_t* meta = nullptr;     // MX shift bits, one byte per subtile (row * sub_cols + s)
  uint8_t* meta_bits = nullptr;  // or one bit each (every tile's bits start on a byte)
  int64_t nC = 0, sub_cols = 0;
};

// The arguments of fast_impl.h's codebook lookup (fk_cb_dequant_rows).
struct FkCbDq {
  const float* table = nullptr;   // maps x 2^ib entries
  const uint8_t* packed = nullptr;  // codes, ib bits each, every tile on a byte
  const uint8_t* codes = nullptr;   // or one byte each
  const uint8_t* meta = nullptr;    // one byte per unit
  const uint8_t* meta_packed = nullptr;  // or mb bits per unit
  const uint8_t* scale = nullptr;
  const uint32_t* factor = nullptr;  // float32 bits of 2^s per scale code; 0: general path
  float* y = nullptr;
  int ib = 0, mb = 0, U = 0;
  int64_t C = 0, Tc = 0, nC = 0, units_per_row = 0;
  int64_t nbytes = 0;  // bytes of the code stream (codes or packed)
  bool nan = true;     // a NaN table entry or NaN scale code present (else no NaN can occur)
  bool nt = false;     // streaming stores (a large output)
};

// The float32 bits of 2^field-127 * (1 + mant) scaled by 2^s, when that is a normal float32
// with room for one more halving (subtile shifts); false otherwise.
inline bool fast_top(int field, uint32_t mant, int s, int room, uint32_t* out) {
  int e = field + s;
  if (e - room < 1 || e > 254) return false;
  *out = (static_cast<uint32_t>(e) << 23) | mant;
  return true;
}

// The scale's number grid as a FastFormat/FastTile pair (cast_scale on float32 bits).
inline uint32_t fast_scale_cast(const FastFormat& ff, uint32_t raw_bits);

// fk_rne's constants for the element grid 2^k (k = kmin, `room` more halvings for subtile
// shifts): 2^(k + 23) and, for floats, 2^(k + mbits) must be normal float32 numbers.
inline bool rne_grid(bool is_float, int mbits, int k, int room, uint32_t* magic, uint32_t* norm) {
  int fm = k + 23 + 127, fn = k + mbits + 127;
  if (fm - room < 1 || fm > 254) return false;
  if (is_float && (fn < 1 || fn > 254)) return false;
  *magic = static_cast<uint32_t>(fm) << 23;
  *norm = is_float ? static_cast<uint32_t>(fn) << 23 : 0u;
  return true;
}
inline bool fk_rne_grid(const FastFormat& ff, int k, int room, uint32_t* magic, uint32_t* norm) {
  return rne_grid(ff.is_float, ff.mbits, k, room, magic, norm);
}

// A float-scaled tile's parameters (the element grid's tile of fast_setup, the scale cast);
// exponent scales take fk_exp_params in fast_impl.h.
bool fast_tile(const FastFormat& ff, uint32_t amax_bits, bool nan, bool nonfinite, FastTile* t) {
  bool nan_tile = ff.policy == 1 ? nonfinite : (ff.nan_on_nan && nan);
  *t = ff.ftile;
  t->nan_tile = nan_tile;
  float raw = from_fbits(amax_bits) / ff.maxfloat_f;
  if (ff.has_ts) raw = ff.ts > 0 ? raw / ff.ts : 0.0f;
  float sc = from_fbits(fast_scale_cast(ff, fbits(raw)));
  t->sc = sc;
  t->eff = ff.has_ts ? sc * ff.ts : sc;
  // Top values that could decode past the data type's range: the general path bounds them
  // (fast_impl.h's fk_float_fits).
  double top = static_cast<double>(ff.maxfloat_f) + (ff.full_int_range ? 1.0 : 0.0);
  return nan_tile || top * static_cast<double>(t->eff) < ff.prod_limit;
}

namespace fast_base {
constexpr int kFkLanes = 8;  // vector lanes of fast_impl.h's explicit vectors
constexpr bool kFkBmi2 = false;  // BMI2's parallel bit extract (pext) available
#include "fast_impl.h"  // NOLINT(build/include)
}  // namespace fast_base

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace fast_avx2 {
constexpr int kFkLanes = 8;
constexpr bool kFkBmi2 = false;
#include "fast_impl.h"  // NOLINT(build/include)
}  // namespace fast_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2")
namespace fast_avx512 {
constexpr int kFkLanes = 16;
constexpr bool kFkBmi2 = true;  // every AVX-512 CPU has BMI2 (pick_fast_rows checks)
#include "fast_impl.h"  // NOLINT(build/include)
}  // namespace fast_avx512
#pragma GCC pop_options
#define ONNXQ_FAST_X86 1
#endif

inline uint32_t fast_scale_cast(const FastFormat& ff, uint32_t raw_bits) {
  FastTile t;
  t.kint = 0;
  t.kmin = ff.scale_kmin;
  t.top_pos = t.top_neg = ff.scale_top;
  FastFormat sf;
  sf.is_float = ff.scale_is_float != 0;
  sf.mbits = ff.scale_mbits;
  sf.rm = 0;
  sf.negzero = ff.scale_negzero;
  return fast_base::fk_elem(raw_bits, t, sf, 0);
}

using FastRows = void (*)(const FastFormat&, const float*, const FastOut&, int64_t, int64_t,
                          int64_t, void (*)(void*, int64_t, int64_t), void*);

// The row kernels for this CPU (simd_level; their AVX-512 build also uses BMI2).
FastRows pick_fast_rows() {
#ifdef ONNXQ_FAST_X86
  switch (simd_level(true)) {
    case 2: return fast_avx512::fk_rows;
    case 1: return fast_avx2::fk_rows;
    default: break;
  }
#endif
  return fast_base::fk_rows;
}

// Sets up the fast path for this cast; false when it does not apply (the general path runs).
bool fast_setup(const Ctx& c, FastFormat* ff) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const Num& n = f.elem;
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  if (g.kind != 1 || g.Post != 1 || c.io.x_type != kF32) return false;
  bool codes = c.io.codes || c.io.packed;
  if (c.io.values ? c.io.values_type != kF32 : !codes) return false;
  if (codes && (f.code_bits() > 8 || c.io.mask || (c.io.zero && f.has_zero))) return false;
  if (codes && f.scaled && f.scale.bits > 8) return false;
  if (f.sparse_m || f.codebook() || c.stochastic || c.m.round_mode > kZero) return false;
  if (c.path != kExp && c.path != kExpShift && c.path != kFloatScale) return false;
  if (n.kind != kFloat && n.kind != kInt) return false;
  if (g.Tc > 1024 || g.Tc < 1) return false;
  if (c.path == kExpShift && (g.Sc < 1 || g.Tc % g.Sc)) return false;
  ff->c = &c;
  ff->is_float = n.is_float;
  ff->negzero = n.has_negzero;
  ff->float_scale = c.path == kFloatScale;
  ff->nan_on_nan = !n.is_float || f.codebook() || f.has_zero;
  ff->full_int_range = c.m.full_int_range && n.is_int;
  ff->mbits = n.kind == kFloat ? n.mbits : 0;
  ff->emin = n.kind == kFloat ? n.emin : 0;
  if (n.kind == kFloat && (n.mbits > 23 || n.emin < -1000)) return false;
  ff->rm = c.m.round_mode;
  ff->rne_add = ff->mbits < 23;
  ff->sub = c.path == kExpShift ? static_cast<int>(g.Sc) : 0;
  ff->tc = static_cast<int>(g.Tc);
  ff->policy = c.m.nan_policy;
  ff->finite_top = fbits(static_cast<float>(max_finite(finite_type(c.io))));
  ff->prod_limit = product_limit(finite_type(c.io));
  // maxfloat (and maxfloat + 1 for the full int range) as float32 fields.
  float mf = static_cast<float>(n.maxfloat);
  if (static_cast<double>(mf) != n.maxfloat || !(mf > 0) || !std::isfinite(mf)) return false;
  uint32_t mb = fbits(mf);
  if ((mb >> 23) == 0) return false;
  ff->top_field = static_cast<int>(mb >> 23);
  ff->top_mant = mb & 0x7FFFFFu;
  if (ff->full_int_range) {
    double lim = n.maxfloat + 1.0;
    int ex = 0;
    double m = std::frexp(lim, &ex);
    if (m != 0.5) return false;  // 2^(N-1)
    ff->neg_field = ex - 1 + 127;
  }
  if (ff->float_scale) {
    const Num& s = f.scale;
    if (s.kind != kFloat || s.mbits > 23 || s.emin < -1000) return false;
    float sm = static_cast<float>(s.maxfloat);
    if (static_cast<double>(sm) != s.maxfloat || !std::isfinite(sm) || (fbits(sm) >> 23) == 0)
      return false;
    ff->scale_top = fbits(sm);
    ff->scale_kmin = s.emin - s.mbits;
    if (ff->scale_kmin < -126 - s.mbits) return false;
    ff->scale_is_float = 1;
    ff->scale_mbits = s.mbits;
    ff->scale_negzero = s.has_negzero;
    ff->maxfloat_f = mf;
    ff->has_ts = f.has_ts;
    ff->ts = c.ts;
    FastTile& t = ff->ftile;
    t.kmin = ff->emin - ff->mbits;
    if (ff->is_float && t.kmin < -126 - ff->mbits) return false;
    if (ff->rm == 0 && !fk_rne_grid(*ff, t.kmin, 0, &t.magic, &t.norm_thr)) return false;
    if (!fast_top(ff->top_field, ff->top_mant, 0, 0, &t.top_pos)) return false;
    t.top_neg = t.top_pos;
    if (ff->full_int_range && !ff->is_float && !fast_top(ff->neg_field, 0, 0, 0, &t.top_neg))
      return false;
    FastTile& st = ff->stile;
    st.kmin = ff->scale_kmin;
    st.top_pos = st.top_neg = ff->scale_top;
    ff->stile_rne = s.mbits < 23 && rne_grid(true, s.mbits, st.kmin, 0, &st.magic, &st.norm_thr);
  }
  if (!ff->float_scale) {
    const Num& sc = f.scale;
    ff->emax = n.emax;
    ff->frac = int_frac_bits(n);
    ff->low = -sc.bias;
    ff->high = (1 << sc.ebits) - 2 - sc.bias;
    // The scale mode as a threshold on amax's mantissa bits: the smallest mantissa whose
    // exponent scale_exponent bumps (monotone within a binade, the same in every binade; the
    // probe binade 2^emax is far from the clamps).
    float base = std::ldexp(1.0f, n.emax);
    int s0 = scale_exponent(base, n, sc, c.m.scale_mode);
    if (std::abs(s0 + ff->frac) > 64 || !std::isfinite(base)) return false;
    uint32_t lo = 0, hi = 0x800000u;  // answer in [lo, hi]; hi = never
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      bool bumps = scale_exponent(from_fbits(fbits(base) | mid), n, sc, c.m.scale_mode) > s0;
      if (bumps) hi = mid; else lo = mid + 1;
    }
    ff->bump_ge = lo;
  }
  ff->code_bits = n.bits;
  ff->ebias = n.bias;
  if (n.kind == kInt) {  // int codes: +-(2^(N-1) - 1), -2^(N-1) with the full range
    ff->cmax_pos = (1 << (n.bits - 1)) - 1;
    ff->cmax_neg = ff->full_int_range ? ff->cmax_pos + 1 : ff->cmax_pos;
    ff->code_direct = n.bits <= 8 && static_cast<double>(ff->cmax_pos) ==
                                         n.maxfloat * std::ldexp(1.0, int_frac_bits(n));
  } else if (n.kind == kFloat && n.mbits < 23) {  // the code of maxfloat
    int d = 23 - n.mbits;
    ff->cmax_pos = ff->cmax_neg =
        ((ff->top_field - 127 + n.bias) << n.mbits) | static_cast<int32_t>(ff->top_mant >> d);
    ff->code_direct = n.bits <= 8 && (ff->top_mant & ((1u << d) - 1)) == 0;
  }
  ff->nan_code = static_cast<uint32_t>(n.nan_code);
  if (codes) {
    // The bit formulas of fk_code_float: normals from 2^emin, codes of one byte.
    if (n.kind == kFloat && (n.smallest_normal != std::ldexp(1.0, n.emin) || n.bits > 8))
      return false;
    const Num& s = f.scale;
    ff->scale_bits = s.bits;
    ff->scale_bias = s.bias;
    ff->scale_emin = s.emin;
    if (ff->float_scale) {
      if (s.smallest_normal != std::ldexp(1.0, s.emin)) return false;
      ff->scale_nan_code = static_cast<uint32_t>(encode_value(NAN, s));
    } else {
      ff->scale_nan_code = static_cast<uint32_t>((1ull << s.ebits) - 1);
      ff->scale_code_add = int_frac_bits(n) + s.bias;
    }
  }
  return true;
}

void pack_range(const void* codes, int width, int64_t i0, int64_t i1, int bits, uint8_t* out);

struct SlowCtx {
  const Ctx* c;
  Scratch s;
  uint8_t* packed = nullptr;  // the fast path writes packed codes: the tile's go there
  uint8_t* meta_bits = nullptr;  // and 1-bit meta: the tile's go there
};

void slow_tile(void* p, int64_t r, int64_t c0) {
  auto* sc = static_cast<SlowCtx*>(p);
  const Geometry& g = sc->c->g;
  int64_t t = r * g.nC + c0 / g.Tc;
  if (!sc->packed && !sc->meta_bits) {
    process_tile(*sc->c, t, sc->s);
    return;
  }
  // The tile's codes and meta into buffers of their own, then packed into the streams.
  int bits = sc->c->f.code_bits();
  int64_t n = std::min<int64_t>(g.Tc, g.C - c0);
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  int64_t units = sc->meta_bits ? (n + g.Sc - 1) / g.Sc : 0;
  std::vector<uint8_t> mbuf(static_cast<size_t>(units));
  QuantizeIO io = sc->c->io;
  if (sc->packed) {
    io.codes = buf.data();
    io.packed = nullptr;
  }
  if (sc->meta_bits) {
    io.meta = mbuf.data();
    io.meta_packed = nullptr;
  }
  Ctx c = *sc->c;
  Ctx local{c.f, c.m, c.g, io, c.path, c.key, c.stochastic, c.code_w, c.scale_w, c.zero_w,
            c.ts, c.nan_f, sc->packed ? r * g.C + c0 : c.codes_base,
            sc->meta_bits ? r * g.sub_cols() + c0 / g.Sc : c.meta_base};
  process_tile(local, t, sc->s);
  if (sc->packed) pack_range(buf.data(), 1, 0, n, bits, sc->packed + ((r * g.C + c0) * bits) / 8);
  if (sc->meta_bits) {
    uint8_t* dst = sc->meta_bits + (r * g.sub_cols() + c0 / g.Sc) / 8;
    for (int64_t u = 0; u < units; u += 8) {
      uint8_t byte = 0;
      for (int64_t k = u; k < std::min<int64_t>(units, u + 8); ++k)
        byte |= static_cast<uint8_t>((mbuf[static_cast<size_t>(k)] & 1) << (k - u));
      dst[u / 8] = byte;
    }
  }
}

#include "codebook_fast.h"  // NOLINT(build/include): codebooks along the last axis

}  // namespace

int64_t Geometry::grid(int64_t b, int64_t r, int64_t c, int64_t rows, int64_t cols) const {
  int64_t m, postp;
  if (kind == 1) {
    m = r;
    postp = Post;
  } else {
    m = b * rows + r;
    postp = Post == 1 ? 1 : Post / R * rows;
  }
  return (m / postp) * cols * postp + c * postp + m % postp;
}

std::string make_format(const onnxq_format& in, Format* out) {
  Format f;
  auto num = [](const onnxq_number& src, Num* dst, const char* what) -> std::string {
    dst->kind = src.kind;
    dst->ebits = src.ebits;
    dst->mbits = src.mbits;
    dst->bias = src.bias;
    dst->infnan = src.infnan;
    std::string e = dst->derive();
    return e.empty() ? e : std::string(what) + ": " + e;
  };
  std::string e = num(in.elem, &f.elem, "element");
  if (!e.empty()) return e;
  f.scaled = in.scaled != 0;
  if (f.scaled) {
    if (!(e = num(in.scale, &f.scale, "scale")).empty()) return e;
    if (f.scale.kind != kFloat && f.scale.kind != kExponent)
      return "the scale must be a float or exponent type";
    if (f.scale.kind == kExponent && f.scale.ebits > 10)
      return "exponent scales of more than 10 bits are not supported";
    f.has_zero = in.has_zero != 0;
    if (f.has_zero && !(e = num(in.zero, &f.zero, "zero point")).empty()) return e;
    f.has_ts = in.has_tenscale != 0;
    if (f.has_ts && !(e = num(in.tenscale, &f.ts, "tensor scale")).empty()) return e;
    if (in.ntiles < 0 || in.ntiles > 2) return "at most two tile dimensions";
    f.ntiles = in.ntiles;
    for (int i = 0; i < 2; ++i) {
      f.tile[i] = in.tile[i];
      f.sub[i] = in.sub[i];
      if (f.tile[i] < 0 || f.sub[i] < 0) return "negative tile size";
    }
    f.sparse_n = in.sparse_n;
    f.sparse_m = in.sparse_m;
    f.sparse_dim = in.sparse_dim;
    if (f.sparse_m && (f.sparse_m > 16 || f.sparse_n < 1 || f.sparse_n >= f.sparse_m))
      return "N:M sparsity needs 1 <= N < M <= 16";
    if (f.has_zero && f.elem.kind != kUint) return "a zero point is only for uint data";
    if (!f.has_zero && f.elem.kind == kUint) return "uint data needs a zero point";
    if (f.has_zero && f.scale.kind == kExponent) return "zero points need a float scale";
  } else if (f.elem.kind != kFloat) {
    return "only float formats can be unscaled";
  }
  if (in.cb_index_bits) {
    f.cb_ib = in.cb_index_bits;
    f.cb_mb = in.cb_meta_bits;
    if (f.cb_ib < 2 || f.cb_ib > 8 || f.cb_mb < 0 || f.cb_mb > 4)
      return "codebook index_bits 2..8 and meta_bits 0..4";
    if (!f.scaled || f.scale.kind != kExponent) return "codebooks need an exponent scale";
    if (f.elem.kind != kFloat) return "a codebook's compute type must be a float format";
    size_t maps = size_t(1) << f.cb_mb, half = size_t(1) << (f.cb_ib - 1);
    if (!in.cb_table) return "a codebook needs its table";
    f.table.assign(in.cb_table, in.cb_table + maps * 2 * half);
    if (in.cb_mags) {
      f.mags.assign(in.cb_mags, in.cb_mags + maps * half);
    } else {
      f.mags.resize(maps * half);
      for (size_t m = 0; m < maps; ++m)
        for (size_t i = 0; i < half; ++i) f.mags[m * half + i] = f.table[m * 2 * half + i];
    }
    if (in.cb_even) {
      f.even.assign(in.cb_even, in.cb_even + maps * half);
    } else {
      f.even.resize(maps * half);
      for (size_t i = 0; i < f.mags.size(); ++i) {
        uint64_t code = encode_value(f.mags[i], f.elem);
        f.even[i] = (code % 2 == 0) ? 1 : 0;
      }
    }
  } else if (f.scaled && f.sub[1] && !(f.elem.kind == kInt && f.scale.kind == kExponent)) {
    return "a subtile needs int elements with an exponent scale (mx6) or a codebook";
  }
  *out = std::move(f);
  return "";
}

std::string make_geometry(const Format& f, const std::vector<int64_t>& shape, int axis,
                          Geometry* out) {
  Geometry g;
  int ndim = static_cast<int>(shape.size());
  if (ndim < 1) return "a tensor of at least 1 dim is needed";
  if (axis < -ndim || axis >= ndim) {
    return "axis " + std::to_string(axis) + " is out of range for a " + std::to_string(ndim) +
           "-D tensor";
  }
  if (axis < 0) axis += ndim;
  // At most 2^48 elements (more than any memory holds): sizes in bits and bytes stay in int64.
  constexpr int64_t kMaxSize = int64_t(1) << 48;
  g.size = 1;
  for (int64_t d : shape) {
    if (d < 0) return "negative dimension";
    if (d > 0 && g.size > kMaxSize / d) return "more than 2^48 elements";
    g.size *= d;
  }
  g.A = shape[axis];
  g.Post = 1;
  for (int i = axis + 1; i < ndim; ++i) g.Post *= shape[i];
  if (!f.scaled || f.ntiles == 0) {
    g.kind = 0;
    g.C = g.size;
    g.Tc = g.size;
  } else if (f.ntiles == 1) {
    g.kind = 1;
    g.C = g.A;
    g.R = g.C ? g.size / g.C : 0;
    g.Tc = f.tile[0] ? f.tile[0] : g.C;
    g.Sc = f.sub[1];
    g.Sr = g.Sc ? 1 : 0;
    g.nR = g.R;
  } else {
    if (ndim < 2) return "2-D tiles need a tensor of at least 2 dims";
    g.kind = 2;
    g.C = g.A;
    g.R = axis == ndim - 1 ? shape[ndim - 2] : shape[ndim - 1];
    g.B = (g.R * g.C) != 0 ? g.size / (g.R * g.C) : 0;
    g.Tr = f.tile[0] ? f.tile[0] : g.R;
    g.Tc = f.tile[1] ? f.tile[1] : g.C;
    g.Sr = f.sub[0];
    g.Sc = f.sub[1];
    if (g.Sc && (g.Tr % g.Sr || g.Tc % g.Sc)) return "subtiles must divide the tile";
    g.nR = g.Tr ? (g.R + g.Tr - 1) / g.Tr : 0;
  }
  if (g.Tc <= 0) g.Tc = 1;
  if (g.Tr <= 0) g.Tr = 1;
  g.nC = (g.C + g.Tc - 1) / g.Tc;
  if (g.kind == 1 && g.Sc && g.Tc % g.Sc) return "subtiles must divide the tile";
  *out = g;
  return "";
}

namespace {

Path pick_path(const Format& f, const Geometry& g) {
  if (f.scale.kind == kExponent) return f.codebook() ? kExpBook : g.Sc ? kExpShift : kExp;
  if (f.has_zero) return f.zero.kind == kFloat ? kZeroFloat : kZeroInt;
  return kFloatScale;
}

// Whether the fast row kernels write this cast's packed codes straight into io.packed: every
// tile starts on a byte of the stream.
bool fast_packs(const Format& f, const Modes& m, const Geometry& g, const QuantizeIO& io) {
  if (!f.scaled || g.kind != 1 || io.mask || f.sparse_m) return false;
  int bits = f.code_bits();
  if ((g.C * bits) % 8 || (g.Tc * bits) % 8) return false;
  Ctx c{f, m, g, io, pick_path(f, g), 0, m.round_mode == kStochastic, 1, 1, 1, 0.0f, 0.0f};
  FastFormat ff;
  if (fast_setup(c, &ff)) return true;
  CbFast cbf;  // codebooks: codebook_fast.h packs in place too
  return cb_setup(c, &cbf);
}

// Whether the fast row kernels run this cast (so they can write 1-bit meta in place).
bool fast_meta_bits(const Format& f, const Modes& m, const Geometry& g, const QuantizeIO& io) {
  if (!f.scaled || g.kind != 1 || io.mask || f.sparse_m) return false;
  Ctx c{f, m, g, io, pick_path(f, g), 0, m.round_mode == kStochastic, 1, 1, 1, 0.0f, 0.0f};
  FastFormat ff;
  return fast_setup(c, &ff) && ff.sub > 0;
}

std::string quantize_impl(const Format& f, const Modes& m, const Geometry& g,
                          const QuantizeIO& io, const ParallelFor& pf);

}  // namespace

std::string quantize(const Format& f, const Modes& m, const std::vector<int64_t>& shape, int axis,
                     const QuantizeIO& io, const ParallelFor& pf) {
  Geometry g;
  std::string e = make_geometry(f, shape, axis, &g);
  if (!e.empty()) return e;
  if (g.size == 0) return "cannot cast an empty tensor";
  const bool half_in = io.x_type != kF32, half_out = io.values && io.values_type != kF32;
  if ((half_in || half_out) && g.kind == 1 && g.Post == 1) {
    // float16 / bfloat16 data along the last axis through the float32 fast paths: the input
    // converted exactly first (as load_x reads it), the float32 values rounded afterwards (as
    // store_y writes them): the general path's bits, for a tensor-sized buffer or two. Values
    // may overwrite x: x is read whole first.
    constexpr int64_t kChunk = int64_t(1) << 16;
    const int64_t chunks = (g.size + kChunk - 1) / kChunk;
    // Uninitialized (every element is written first), in huge pages where the kernel has them:
    // a fresh tensor-sized buffer otherwise costs a page fault per 4 KiB.
    struct Free {
      void operator()(float* p) const { std::free(p); }
    };
    auto big = [&]() {
      const size_t bytes = static_cast<size_t>(g.size) * sizeof(float);
      void* p = nullptr;
      if (posix_memalign(&p, size_t(1) << 21, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (bytes >= (size_t(1) << 21)) madvise(p, bytes, MADV_HUGEPAGE);
#endif
      return std::unique_ptr<float, Free>(static_cast<float*>(p));
    };
    std::unique_ptr<float, Free> xf, yf;
    QuantizeIO io2 = io;
    io2.finite_type = finite_type(io);  // the caller's type, not the float32 buffers'
    if (half_in) {
      xf = big();
      float* d = xf.get();
      const uint16_t* src = static_cast<const uint16_t*>(io.x);
      const bool bf = io.x_type == kBF16;
      pf(chunks, [&](int64_t c0, int64_t c1) {
        const int64_t i0 = c0 * kChunk, i1 = std::min(g.size, c1 * kChunk);
        if (bf) {
          for (int64_t i = i0; i < i1; ++i) d[i] = bf16_to_float(src[i]);
        } else {
          for (int64_t i = i0; i < i1; ++i) d[i] = half_to_float(src[i]);
        }
      });
      io2.x = d;
      io2.x_type = kF32;
    }
    if (half_out) {
      yf = big();
      io2.values = yf.get();
      io2.values_type = kF32;
    }
    e = quantize(f, m, shape, axis, io2, pf);
    if (!e.empty() || !half_out) return e;
    const float* y = yf.get();
    uint16_t* dst = static_cast<uint16_t*>(io.values);
    const bool bf = io.values_type == kBF16;
    pf(chunks, [&](int64_t c0, int64_t c1) {
      const int64_t i0 = c0 * kChunk, i1 = std::min(g.size, c1 * kChunk);
      for (int64_t i = i0; i < i1; ++i) {
        float v = y[i] != y[i] ? from_fbits_nan() : y[i];  // as store_y
        dst[i] = bf ? float_to_bf16(v) : float_to_half(v);
      }
    });
    return "";
  }
  if (io.meta_packed && !io.meta) {
    // 1-bit meta straight into the stream where the fast row kernels write every tile's bits
    // from a byte on; otherwise one byte per unit, packed afterwards.
    bool direct = f.meta_bits() == 1 && g.kind == 1 && g.Sc > 0 && g.Sr == 1 &&
                  (g.Tc / g.Sc) % 8 == 0 && g.sub_cols() % 8 == 0 && fast_meta_bits(f, m, g, io);
    if (!direct) {
      int64_t nmeta = f.has_meta() ? g.meta_count() : 0;
      std::unique_ptr<uint8_t[]> buf(new uint8_t[static_cast<size_t>(std::max<int64_t>(nmeta, 1))]());
      QuantizeIO io2 = io;
      io2.meta = buf.get();
      io2.meta_packed = nullptr;
      e = quantize(f, m, shape, axis, io2, pf);
      if (!e.empty()) return e;
      if (nmeta) pack_bits(buf.get(), 1, nmeta, f.meta_bits(), nullptr, io.meta_packed, &pf);
      return "";
    }
  }
  if (io.packed && !io.codes) {
    if (io.mask) return "packed codes need no mask";
    if (!fast_packs(f, m, g, io)) {  // codes one per element, then packed
      int code_w = code_width(f.code_bits());
      std::unique_ptr<uint8_t[]> buf(new uint8_t[static_cast<size_t>(g.size * code_w)]);
      QuantizeIO io2 = io;
      io2.codes = buf.get();
      io2.packed = nullptr;
      e = quantize_impl(f, m, g, io2, pf);
      if (!e.empty()) return e;
      pack_bits(buf.get(), code_w, g.size, f.code_bits(), nullptr, io.packed, &pf);
      return "";
    }
  }
  return quantize_impl(f, m, g, io, pf);
}

namespace {

std::string quantize_impl(const Format& f, const Modes& m, const Geometry& g,
                          const QuantizeIO& io, const ParallelFor& pf) {
  if (f.codebook() && m.round_mode == kStochastic)
    return "codebooks round to the nearest table entry; stochastic is not supported";
  uint32_t key = seed_key(m.seed);
  bool stochastic = m.round_mode == kStochastic;
  int code_w = code_width(f.code_bits());
  float nan_f = from_fbits(kQuietNaN);
  if (!f.scaled) {  // an unscaled cast: elementwise, keeps Inf where the format has it
    const double limit = finite_bound(max_finite(finite_type(io)), f.elem, f.elem.maxfloat);
    pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
      int64_t end = std::min(g.size, c1 * kChunk);
      for (int64_t i = c0 * kChunk; i < end; ++i) {
        float x = load_x(io.x, io.x_type, i);
        uint32_t r = stochastic ? stochastic_bits(key, static_cast<uint64_t>(i)) : 0u;
        double q =
            quantize_value(static_cast<double>(x), f.elem, m.round_mode, r, true, false, limit);
        if (io.values) store_y(io.values, io.values_type, i, static_cast<float>(q));
        if (io.codes) store_code(io.codes, code_w, i, encode_value(q, f.elem));
      }
    });
    return "";
  }
  Path path = pick_path(f, g);
  Ctx c{f, m, g, io, path, key, stochastic, code_w, code_width(f.scale.bits),
        f.has_zero ? code_width(f.zero.bits) : 1, 0.0f, nan_f};
  if (f.has_ts) {  // NVFP4: tensor scale from the largest tile absmax (after pruning)
    int64_t tiles = g.tiles();
    std::vector<float> amaxes(static_cast<size_t>(tiles), 0.0f);
    if (!f.sparse_m && io.x_type == kF32) {
      // No pruning: the largest tile absmax is the largest finite magnitude of the tensor.
      int64_t chunks = (g.size + kChunk - 1) / kChunk;
      std::vector<uint32_t> parts(static_cast<size_t>(chunks), 0u);
      const uint32_t* xb = static_cast<const uint32_t*>(io.x);
      pf(chunks, [&](int64_t c0, int64_t c1) {
        for (int64_t ch = c0; ch < c1; ++ch) {
          int32_t m = 0;  // signed: GCC vectorizes this max reduction, not the unsigned one
          int64_t end = std::min(g.size, (ch + 1) * kChunk);
          for (int64_t i = ch * kChunk; i < end; ++i) {
            int32_t b = static_cast<int32_t>(xb[i] & 0x7FFFFFFFu);
            int32_t fin = b < 0x7F800000 ? b : 0;
            m = fin > m ? fin : m;
          }
          parts[static_cast<size_t>(ch)] = static_cast<uint32_t>(m);
        }
      });
      uint32_t m = 0;
      for (uint32_t v : parts) m = v > m ? v : m;
      amaxes.assign(1, from_fbits(m));
      tiles = 0;
    }
    pf(tiles, [&](int64_t t0, int64_t t1) {
      Scratch s;
      for (int64_t t = t0; t < t1; ++t) {
        gather_tile(c, t, s);
        Stats st;
        for (float xv : s.x) accumulate(st, xv, false);
        amaxes[static_cast<size_t>(t)] = st.amax;
      }
    });
    float top = 0.0f;
    for (float a : amaxes) top = a > top ? a : top;
    float denom = static_cast<float>(f.elem.maxfloat) * static_cast<float>(f.scale.maxfloat);
    c.ts = cast_scale(top / denom, f.ts);
    if (io.tenscale)
      store_code(io.tenscale, code_width(f.ts.bits), 0, encode_value(c.ts, f.ts));
  }
  if (g.kind == 0 && path != kExpBook) {  // one scale: parallel reduction, then elementwise
    int64_t chunks = (g.size + kChunk - 1) / kChunk;
    std::vector<Stats> parts(static_cast<size_t>(chunks));
    bool want_range = path == kZeroFloat || path == kZeroInt;
    pf(chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        Stats st;
        int64_t end = std::min(g.size, (ch + 1) * kChunk);
        for (int64_t i = ch * kChunk; i < end; ++i) accumulate(st, load_x(io.x, io.x_type, i),
                                                                want_range);
        parts[static_cast<size_t>(ch)] = st;
      }
    });
    Stats st = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) merge(st, parts[i]);
    TileParams p = tile_params(c, st);
    if (io.scale) store_code(io.scale, c.scale_w, 0, p.scale_code);
    if (io.zero && f.has_zero) store_code(io.zero, c.zero_w, 0, p.zero_code);
    pf(chunks, [&](int64_t c0, int64_t c1) {
      tensor_elements(c, p, c0 * kChunk, std::min(g.size, c1 * kChunk));
    });
    return "";
  }
  CbFast cbf;
  if (cb_setup(c, &cbf)) {  // codebooks along the last axis (codebook_fast.h)
    cb_run(cbf, pf);
    return "";
  }
  FastFormat ff;
  if (fast_setup(c, &ff)) {  // rows of float32 tiles along the last axis
    const FastRows rows_fn = pick_fast_rows();
    const float* xf = static_cast<const float*>(io.x);
    FastOut out;
    out.y = static_cast<float*>(io.values);
    out.codes = static_cast<uint8_t*>(io.codes);
    out.packed = io.codes ? nullptr : io.packed;
    if (io.codes || io.packed) {
      out.scale = static_cast<uint8_t*>(io.scale);
      out.meta = ff.sub ? io.meta : nullptr;
      out.meta_bits = ff.sub ? io.meta_packed : nullptr;
    }
    out.nC = g.nC;
    out.sub_cols = g.sub_cols();
    int64_t rows = g.R, cols = g.C;
    int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(cols, 1));
    pf((rows + per - 1) / per, [&](int64_t b0, int64_t b1) {
      SlowCtx sc{&c, Scratch(), out.packed, out.meta_bits};
      rows_fn(ff, xf, out, b0 * per, std::min(rows, b1 * per), cols, slow_tile, &sc);
    });
    return "";
  }
  pf(g.tiles(), [&](int64_t t0, int64_t t1) {
    Scratch s;
    for (int64_t t = t0; t < t1; ++t) process_tile(c, t, s);
  });
  return "";
}

}  // namespace

namespace {

// -- fast dequantize -------------------------------------------------------------------------
// Exponent-scaled (E8M0 & co., MX9/MX6/MX4 shift bits) and float-scaled (NVFP4) data types with
// float or int elements of at most 8 bits, 1-D tiles along any axis, 1-byte scale codes, no
// zero point, mask or codebook. Per element: one lookup in a 2^bits-entry table of the element
// values and one multiply by the tile's factor from a 256-entry table of the scale codes, read
// straight from the packed stream. The arithmetic is the general path's: for exponent scales the
// float64 product q * 2^s (times 0.5 in a shifted subtile), rounded once to float32; for float
// scales the float32 product q * eff.
struct FastDq {
  const uint8_t* src = nullptr;  // codes: one byte each, or the packed stream
  int bits = 8;
  uint32_t cmask = 0xFF;
  uint64_t nbytes = 0;  // of the packed stream
  const uint8_t* scale = nullptr;
  const uint8_t* meta = nullptr;       // one byte per subtile, or
  const uint8_t* meta_bits = nullptr;  // one bit per subtile (packed)
  int64_t A = 1, Post = 1, nC = 1, Tc = 1, Sc = 0, sub_cols = 0;
  double tq_d[256];
  float tq_f[256];
  double fac_d[256];
  float fac_f[256];
  void* y = nullptr;
};

// READER: 0 one byte per code, 1 packed nibbles, 2 packed codes of any width <= 8.
template <int READER>
__attribute__((always_inline)) inline uint32_t dq_code(const FastDq& d, int64_t o) {
  if (READER == 0) return d.src[o] & d.cmask;
  if (READER == 1) return (d.src[o >> 1] >> ((o & 1) << 2)) & 0xFu;
  uint64_t bp = static_cast<uint64_t>(o) * static_cast<uint64_t>(d.bits);
  uint64_t byte = bp >> 3;
  unsigned off = static_cast<unsigned>(bp & 7);
  uint32_t v = d.src[byte];
  uint32_t hi = byte + 1 < d.nbytes ? d.src[byte + 1] : 0u;  // the stream's last byte
  v |= hi << 8;
  return (v >> off) & d.cmask;
}

__attribute__((always_inline)) inline uint32_t dq_meta(const FastDq& d, int64_t i) {
  if (d.meta) return d.meta[i] & 1u;
  return (d.meta_bits[i >> 3] >> (i & 7)) & 1u;
}

// The output bits of y (store_y: every NaN canonical).
template <int OT>
__attribute__((always_inline)) inline uint32_t dq_bits(float y) {
  uint32_t b = fbits(y);
  b = (b & 0x7FFFFFFFu) > 0x7F800000u ? kQuietNaN : b;
  if (OT == kF32) return b;
  if (OT == kF16) return float_to_half(from_fbits(b));
  return float_to_bf16(from_fbits(b));
}

template <int OT>
__attribute__((always_inline)) inline void dq_put(const FastDq& d, int64_t o, uint32_t b) {
  if (OT == kF32) {
    static_cast<uint32_t*>(d.y)[o] = b;
  } else {
    static_cast<uint16_t*>(d.y)[o] = static_cast<uint16_t>(b);
  }
}

template <int OT>
__attribute__((always_inline)) inline void dq_store(const FastDq& d, int64_t o, float y) {
  dq_put<OT>(d, o, dq_bits<OT>(y));
}

constexpr double kShiftMul[2] = {1.0, 0.5};  // (q * 2^s) * 0.5 in a shifted subtile; * 1.0 exact

template <bool EXP>
__attribute__((always_inline)) inline float dq_value(const FastDq& d, uint32_t code, uint32_t sc,
                                                     uint32_t shifted) {
  if (EXP) return static_cast<float>(d.tq_d[code] * d.fac_d[sc] * kShiftMul[shifted]);
  return d.tq_f[code] * d.fac_f[sc];
}

// Tiles [t0, t1) of a tensor tiled along its last axis (Post == 1): tile t is row t / nC.
template <int READER, bool EXP, bool SHIFT, int OT>
void dq_tiles_last(const FastDq& d, int64_t t0, int64_t t1) {
  const int64_t C = d.A, nC = d.nC, Tc = d.Tc, Sc = d.Sc;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t r = t / nC, c0 = (t % nC) * Tc;
    int64_t valid = std::min<int64_t>(Tc, C - c0);
    int64_t o0 = r * C + c0;
    uint32_t sc = d.scale[t];
    if (SHIFT) {
      int64_t mi = r * d.sub_cols + c0 / Sc;
      for (int64_t s0 = 0; s0 < valid; s0 += Sc, ++mi) {
        uint32_t sh = dq_meta(d, mi);
        int64_t s1 = std::min<int64_t>(valid, s0 + Sc);
        for (int64_t j = s0; j < s1; ++j)
          dq_store<OT>(d, o0 + j, dq_value<EXP>(d, dq_code<READER>(d, o0 + j), sc, sh));
      }
    } else if ((int64_t(2) << d.bits) <= valid) {
      // Small codes in a long tile: the tile's 2^bits output values, then lookups.
      uint32_t tab[256];
      int nc = 1 << d.bits;
      for (int c = 0; c < nc; ++c) tab[c] = dq_bits<OT>(dq_value<EXP>(d, c, sc, 0));
      for (int64_t j = 0; j < valid; ++j) dq_put<OT>(d, o0 + j, tab[dq_code<READER>(d, o0 + j)]);
    } else if (EXP) {
      double f = d.fac_d[sc];
      for (int64_t j = 0; j < valid; ++j)
        dq_store<OT>(d, o0 + j, static_cast<float>(d.tq_d[dq_code<READER>(d, o0 + j)] * f));
    } else {
      float f = d.fac_f[sc];
      for (int64_t j = 0; j < valid; ++j)
        dq_store<OT>(d, o0 + j, d.tq_f[dq_code<READER>(d, o0 + j)] * f);
    }
  }
}

// Lines [l0, l1) of a tensor tiled along an inner axis (Post > 1): line (outer, a) holds the
// Post contiguous elements at axis position a; their scales (and shift bits) are contiguous too.
template <int READER, bool EXP, bool SHIFT, int OT>
void dq_lines(const FastDq& d, int64_t l0, int64_t l1) {
  const int64_t A = d.A, Post = d.Post;
  for (int64_t l = l0; l < l1; ++l) {
    int64_t outer = l / A, a = l % A;
    int64_t o0 = l * Post;
    const uint8_t* scs = d.scale + (outer * d.nC + a / d.Tc) * Post;
    int64_t mb = SHIFT ? (outer * d.sub_cols + a / d.Sc) * Post : 0;
    for (int64_t p = 0; p < Post; ++p) {
      uint32_t sh = SHIFT ? dq_meta(d, mb + p) : 0u;
      dq_store<OT>(d, o0 + p, dq_value<EXP>(d, dq_code<READER>(d, o0 + p), scs[p], sh));
    }
  }
}

using DqFn = void (*)(const FastDq&, int64_t, int64_t);

// -- vector kernels for float32 outputs of tensors tiled along their last axis --
// The general path rounds the exact float64 product q * 2^s (q a decoded element, 2^s the
// exponent scale, times 2^-1 in a shifted subtile) once to float32. When q and 2^t (t = s or
// s - 1) are both float32 values, the exact product is representable in float64 (q has at most
// 24 significant bits and |q| < 2^128; t lies in [-126, 127]), so one IEEE float32 multiply
// q * 2^t, which rounds the same exact product once to nearest even (overflow to inf, subnormal
// results rounded alike), gives the same bits. So the table DqTab holds each element value as a
// float32 (fast_dequantize checks that every one is exact) and, per scale code, f0 = 2^s and
// f1 = 2^(s - 1) as normal float32s; a code whose powers are not normal float32s (ok = 0, scale
// exponents below -126 or above 127) sends its tiles to the float64 code (dq_tiles_last). A NaN
// scale code gives NaN factors (every output NaN, made canonical like store_y). Float scales
// (NVFP4) are already float32 arithmetic: f0 = f1 = the effective scale, ok = 1. Normal factors
// keep the result right under denormals-are-zero too.
struct DqTab {
  float tq[256];
  uint32_t f0[256], f1[256];
  uint8_t ok[256];
  bool int8 = false;  // tq[c] == (int8_t)c for every c
};

#define DQK_ISA 0
namespace dq_base {
#include "fast_dequant.h"  // NOLINT(build/include)
}  // namespace dq_base

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
#undef DQK_ISA
#define DQK_ISA 1
namespace dq_avx2 {
#include "fast_dequant.h"  // NOLINT(build/include)
}  // namespace dq_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2")
// GCC 12's _mm512_cvtepu8_epi32 reads _mm512_undefined_epi32() (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#undef DQK_ISA
#define DQK_ISA 2
namespace dq_avx512 {
#include "fast_dequant.h"  // NOLINT(build/include)
}  // namespace dq_avx512
#pragma GCC pop_options
#undef DQK_ISA
#define ONNXQ_DQ_X86 1
#endif

struct DqKernels {
  void (*unpack)(int, const uint8_t*, int64_t, int64_t, uint8_t*);
  bool (*run)(const DqTab&, int, bool, int64_t, int64_t, const uint8_t*, const uint8_t*,
              const uint8_t*, int64_t, uint32_t*);
};

// The dequantize kernels for this CPU (simd_level).
DqKernels pick_dq_kernels() {
#ifdef ONNXQ_DQ_X86
  switch (simd_level(false)) {
    case 2: return {dq_avx512::dqk_unpack_bits, dq_avx512::dqk_run};
    case 1: return {dq_avx2::dqk_unpack_bits, dq_avx2::dqk_run};
    default: break;
  }
#endif
  return {dq_base::dqk_unpack_bits, dq_base::dqk_run};
}

template <int READER, bool EXP, bool SHIFT>
DqFn dq_pick3(bool last, int ot) {
  switch (ot) {
    case kF16: return last ? dq_tiles_last<READER, EXP, SHIFT, kF16> : dq_lines<READER, EXP, SHIFT, kF16>;
    case kBF16: return last ? dq_tiles_last<READER, EXP, SHIFT, kBF16> : dq_lines<READER, EXP, SHIFT, kBF16>;
    default: return last ? dq_tiles_last<READER, EXP, SHIFT, kF32> : dq_lines<READER, EXP, SHIFT, kF32>;
  }
}

template <int READER>
DqFn dq_pick2(bool exp, bool shift, bool last, int ot) {
  if (!exp) return dq_pick3<READER, false, false>(last, ot);
  return shift ? dq_pick3<READER, true, true>(last, ot) : dq_pick3<READER, true, false>(last, ot);
}

// Rows of a float32 output tiled along its last axis (Post == 1) with the vector kernels: each
// unit is a segment of L columns (whole tiles, byte-aligned codes and shift bits when the row
// starts on a byte) of one row. Codes and shift bits are unpacked into small buffers, whole
// tiles decoded by the kernels; the row's last, partial tile and the tiles whose scale is not
// exact in float32 go through `slow` (dq_tiles_last, the float64 arithmetic).
void dq_rows_vec(const FastDq& d, const DqTab& T, const DqKernels& K, DqFn slow, int64_t rows,
                 int64_t L, bool bytes, const ParallelFor& pf) {
  const int64_t C = d.A, Tc = d.Tc, Sc = d.Sc, bits = d.bits;
  const int64_t nseg = (C + L - 1) / L;
  const bool nt = stream_output(rows * C * 4);
  pf(rows * nseg, [&](int64_t u0, int64_t u1) {
    std::vector<uint8_t> codes(static_cast<size_t>(L)), sh(static_cast<size_t>(Sc ? L / Sc : 0));
    for (int64_t u = u0; u < u1; ++u) {
      int64_t r = u / nseg, c0 = (u % nseg) * L;
      int64_t n = std::min(L, C - c0), full = n / Tc, ncodes = full * Tc;
      int64_t o0 = r * C + c0, t0 = r * d.nC + c0 / Tc;
      if (full > 0) {
        int64_t done = 0;
        const uint8_t* cp = codes.data();
        if (bytes && bits == 8) {
          cp = d.src + o0;  // the codes themselves
          done = ncodes;
        } else if (bytes) {
          const uint8_t* src = d.src + o0;
          uint8_t* dst = codes.data();
          const uint8_t cmask = static_cast<uint8_t>(d.cmask);
          for (int64_t j = 0; j < ncodes; ++j) dst[j] = src[j] & cmask;
          done = ncodes;
        } else if ((o0 * bits) % 8 == 0) {
          done = ncodes / 8 * 8;
          int64_t at = o0 * bits / 8;
          K.unpack(static_cast<int>(bits), d.src + at, done / 8,
                   static_cast<int64_t>(d.nbytes) - at, codes.data());
        }
        for (int64_t j = done; j < ncodes; ++j) codes[j] = dq_code<2>(d, o0 + j);
        if (Sc) {
          int64_t ns = ncodes / Sc, mb = r * d.sub_cols + c0 / Sc, sdone = 0;
          if (d.meta) {
            for (int64_t i = 0; i < ns; ++i) sh[i] = d.meta[mb + i] & 1u;
            sdone = ns;
          } else if (mb % 8 == 0) {
            sdone = ns / 8 * 8;
            K.unpack(1, d.meta_bits + mb / 8, sdone / 8, sdone / 8, sh.data());
          }
          for (int64_t i = sdone; i < ns; ++i) sh[i] = static_cast<uint8_t>(dq_meta(d, mb + i));
        }
        uint32_t* y = static_cast<uint32_t*>(d.y) + o0;
        if (K.run(T, static_cast<int>(bits), nt, Tc, Sc, cp, d.scale + t0, sh.data(), full, y)) {
          for (int64_t k = 0; k < full; ++k)
            if (!T.ok[d.scale[t0 + k]]) slow(d, t0 + k, t0 + k + 1);
        }
      }
      if (n > ncodes) slow(d, t0 + full, t0 + full + 1);  // the row's partial last tile
    }
  });
}

// True when the fast path ran (the output is written); false: nothing done.
struct FkTables {
  std::vector<float> table;
  uint32_t factor[256] = {};
};

// Codebook lookups of float32 tensors tiled along their last axis (fk_cb_dequant_rows): units
// of a multiple of 8 elements starting on bytes of the code stream, one-byte exponent scales
// whose 2^s are float32 numbers (subnormal ones only where the FPU keeps subnormals), float32
// table values, float32 output. False: the general path runs.
bool fast_cb_dequantize(const Format& f, const Geometry& g, const DequantizeIO& io,
                        const ParallelFor& pf) {
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  if (!f.codebook() || !f.scaled || f.sparse_m || io.mask || f.has_zero) return false;
  if (f.scale.kind != kExponent || f.scale.bits > 8) return false;
  if (g.kind != 1 || g.Post != 1 || g.size == 0 || io.values_type != kF32) return false;
  if (!io.scale || (!io.meta && !io.meta_packed) || (!io.codes && !io.packed)) return false;
  if (f.cb_ib > 8 || f.cb_mb > 4 || (io.codes && code_width(f.cb_ib) != 1)) return false;
  int64_t U = g.Sc ? g.Sc : g.Tc;
  if (g.Sc && (g.Sr != 1 || g.Tc % g.Sc)) return false;
  if (U % 8 || g.C % U || (U * f.cb_ib) % 8) return false;
  FkTables t;
  size_t w = size_t(1) << f.cb_ib;
  if (f.table.size() < (size_t(1) << f.cb_mb) * w) return false;
  t.table.resize(f.table.size());
  for (size_t i = 0; i < f.table.size(); ++i) {
    t.table[i] = static_cast<float>(f.table[i]);
    if (static_cast<double>(t.table[i]) != f.table[i] && !std::isnan(f.table[i])) return false;
  }
  // 2^s per scale code as float32 bits; codes present whose power is no float32 (or is a
  // subnormal under denormals-are-zero) send the whole cast to the general path.
  // A flushing FPU (flush-to-zero / denormals-are-zero) would lose subnormal factors and
  // results: the general path's float64 products then.
  if (fpu_flushes()) return false;
  uint32_t nan_code = (1u << f.scale.ebits) - 1;
  for (uint32_t c = 0; c < 256; ++c) {
    int s = static_cast<int>(c) - f.scale.bias - int_frac_bits(f.elem);
    uint32_t fb = 0;
    if (c == nan_code) fb = kQuietNaN;
    else if (s >= -126 && s <= 127) fb = static_cast<uint32_t>(s + 127) << 23;
    else if (s >= -149 && s < -126) fb = 1u << (s + 149);
    t.factor[c] = fb;
  }
  const uint8_t* scale = static_cast<const uint8_t*>(io.scale);
  int64_t nscale = g.B * g.nR * g.nC;
  bool seen[256] = {};
  for (int64_t i = 0; i < nscale; ++i) seen[scale[i]] = true;
  for (int c = 0; c < 256; ++c)
    if (seen[c] && t.factor[c] == 0) return false;
  // A product is NaN only from a NaN entry or a NaN factor: table entries are never 0 * inf
  // partners of a factor (factors are finite, nonzero).
  bool nan = nan_code < 256 && seen[nan_code];
  for (size_t i = 0; i < (size_t(1) << f.cb_mb) * w; ++i) nan = nan || std::isnan(t.table[i]);
  FkCbDq p;
  p.nan = nan;
  p.nbytes = io.codes ? g.size : (g.size * f.cb_ib + 7) / 8;
  p.nt = stream_output(g.size * 4);
  p.table = t.table.data();
  p.codes = io.codes ? static_cast<const uint8_t*>(io.codes) : nullptr;
  p.packed = io.codes ? nullptr : io.packed;
  p.meta = io.meta;
  p.meta_packed = io.meta ? nullptr : io.meta_packed;
  p.scale = scale;
  p.factor = t.factor;
  p.y = static_cast<float*>(io.values);
  p.ib = f.cb_ib;
  p.mb = f.cb_mb;
  p.U = static_cast<int>(U);
  p.C = g.C;
  p.Tc = g.Tc;
  p.nC = g.nC;
  p.units_per_row = g.C / U;
  if (p.mb == 0 && !p.meta) return false;
  void (*rows_fn)(const FkCbDq&, int64_t, int64_t) = fast_base::fk_cb_dequant_rows;
#ifdef ONNXQ_FAST_X86
  const FastRows isa = pick_fast_rows();  // the same instruction set as the row kernels
  if (isa == fast_avx512::fk_rows) rows_fn = dq_avx512::dqk_cb_rows;
  else if (isa == fast_avx2::fk_rows) rows_fn = fast_avx2::fk_cb_dequant_rows;
#endif
  int64_t rows = g.B * g.R;
  int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(g.C, 1));
  pf((rows + per - 1) / per, [&](int64_t b0, int64_t b1) {
    rows_fn(p, b0 * per, std::min(rows, b1 * per));
  });
  return true;
}

bool fast_dequantize(const Format& f, const Geometry& g, const DequantizeIO& io,
                     const ParallelFor& pf) {
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  const Num& n = f.elem;
  if (!f.scaled || f.codebook() || f.sparse_m || f.has_zero || io.mask) return false;
  if (g.kind != 1 || g.size == 0) return false;
  if (n.kind != kFloat && n.kind != kInt) return false;
  if (n.bits > 8 || f.scale.bits > 8) return false;
  bool exp = f.scale.kind == kExponent;
  if (!exp && f.scale.kind != kFloat) return false;
  bool shift = g.Sc > 0;
  if (shift && (!exp || g.Sr != 1)) return false;
  if (!io.scale || (f.has_ts && !io.tenscale)) return false;
  if (shift && !io.meta && !io.meta_packed) return false;
  if (!io.codes && !io.packed) return false;
  auto d = std::make_unique<FastDq>();
  d->bits = n.bits;
  d->cmask = (1u << n.bits) - 1u;
  int reader = 0;
  if (io.codes) {
    d->src = static_cast<const uint8_t*>(io.codes);  // code_width(<= 8 bits) == 1
  } else {
    d->src = io.packed;
    d->nbytes = static_cast<uint64_t>(packed_nbytes(g.size, n.bits));
    reader = n.bits == 8 ? 0 : n.bits == 4 ? 1 : 2;
  }
  d->scale = static_cast<const uint8_t*>(io.scale);
  d->meta = io.meta;
  d->meta_bits = io.meta ? nullptr : io.meta_packed;
  if (shift && !d->meta && f.meta_bits() != 1) return false;
  d->A = g.A;
  d->Post = g.Post;
  d->nC = g.nC;
  d->Tc = g.Tc;
  d->Sc = g.Sc;
  d->sub_cols = g.sub_cols();
  for (uint32_t c = 0; c < 256; ++c) {
    double v = c <= d->cmask ? n.decode(c) : 0.0;
    d->tq_d[c] = v;
    d->tq_f[c] = static_cast<float>(v);
  }
  float ts = 0.0f;
  if (f.has_ts)
    ts = static_cast<float>(f.ts.decode(load_code(io.tenscale, code_width(f.ts.bits), 0)));
  uint64_t scale_nan = (1ull << f.scale.ebits) - 1;
  for (uint32_t c = 0; c < 256; ++c) {
    if (exp) {
      // The general path: 2^s with s = code - bias - int_frac_bits, NaN for the all-ones code.
      int sexp = static_cast<int>(c) - f.scale.bias - int_frac_bits(n);
      bool in_range = sexp >= -1023 && sexp <= 1023;
      d->fac_d[c] = c == scale_nan ? static_cast<double>(NAN) : in_range ? pow2(sexp) : 0.0;
      if (c < scale_nan && !in_range) return false;
      d->fac_f[c] = 0.0f;
    } else {
      float sc = c < (1u << f.scale.bits) ? static_cast<float>(f.scale.decode(c)) : 0.0f;
      float eff = f.has_ts ? sc * ts : sc;
      d->fac_f[c] = std::isnan(sc) ? from_fbits(kQuietNaN) : eff;
      d->fac_d[c] = 0.0;
    }
  }
  d->y = io.values;
  bool last = g.Post == 1;
  DqFn fn = reader == 0   ? dq_pick2<0>(exp, shift, last, io.values_type)
            : reader == 1 ? dq_pick2<1>(exp, shift, last, io.values_type)
                          : dq_pick2<2>(exp, shift, last, io.values_type);
  const FastDq& dr = *d;
  if (last && io.values_type == kF32 && (!shift || g.Tc % g.Sc == 0)) {
    // The vector kernels, when every element value is a float32.
    auto T = std::make_unique<DqTab>();
    bool exact = true;
    T->int8 = n.bits == 8;
    for (uint32_t c = 0; c < 256; ++c) {
      double v = d->tq_d[c];
      T->int8 = T->int8 && v == static_cast<double>(static_cast<int8_t>(c));
      exact = exact && (std::isnan(v) || static_cast<double>(static_cast<float>(v)) == v);
      T->tq[c] = static_cast<float>(v);
    }
    for (uint32_t c = 0; c < 256; ++c) {
      if (!exp) {
        T->f0[c] = T->f1[c] = fbits(d->fac_f[c]);
        T->ok[c] = 1;
        continue;
      }
      int sexp = static_cast<int>(c) - f.scale.bias - int_frac_bits(n);
      int lo = shift ? sexp - 1 : sexp;
      bool is_nan = c == scale_nan;
      bool ok = is_nan || (lo >= -126 && sexp <= 127);
      T->ok[c] = ok ? 1 : 0;
      T->f0[c] = is_nan ? kQuietNaN : ok ? static_cast<uint32_t>(sexp + 127) << 23 : 0u;
      T->f1[c] = is_nan ? kQuietNaN : ok ? static_cast<uint32_t>(lo + 127) << 23 : 0u;
    }
    if (exact) {
      // Segments of whole tiles that start on a byte of the codes and shift bits: the lcm of
      // the tile and 8 subtiles. A tile so long that the lcm would be huge takes segments of
      // one tile (a start off a byte is unpacked code by code).
      const int64_t align = 8 * std::max<int64_t>(g.Sc, 1);
      int64_t unit = g.Tc / std::gcd(g.Tc, align);
      unit = unit <= (int64_t(1) << 20) / align ? unit * align : g.Tc;
      int64_t L = unit * std::max<int64_t>(1, 4096 / unit);
      dq_rows_vec(dr, *T, pick_dq_kernels(), fn, g.size / g.A, L, reader == 0, pf);
      return true;
    }
  }
  if (last) {
    // Tiles, in chunks of about 16K elements.
    int64_t tiles = g.R * g.nC;
    int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(g.Tc, 1));
    pf((tiles + per - 1) / per, [&](int64_t b0, int64_t b1) {
      fn(dr, b0 * per, std::min(tiles, b1 * per));
    });
  } else {
    int64_t lines = g.size / g.Post;
    int64_t per = std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(g.Post, 1));
    pf((lines + per - 1) / per, [&](int64_t b0, int64_t b1) {
      fn(dr, b0 * per, std::min(lines, b1 * per));
    });
  }
  return true;
}

}  // namespace

std::string dequantize(const Format& f, const std::vector<int64_t>& shape, int axis,
                       const DequantizeIO& io_in, const ParallelFor& pf) {
  Geometry g;
  std::string e = make_geometry(f, shape, axis, &g);
  if (!e.empty()) return e;
  int code_w = code_width(f.code_bits());
  if (fast_cb_dequantize(f, g, io_in, pf)) return "";
  if (fast_dequantize(f, g, io_in, pf)) return "";
  // The general path reads unpacked codes and meta.
  DequantizeIO io = io_in;
  std::vector<uint8_t> codes_buf, meta_buf;
  if (!io.codes) {
    if (!io.packed) return "dequantizing needs the codes";
    codes_buf.resize(static_cast<size_t>(g.size * code_w));
    unpack_bits(io.packed, f.code_bits(), g.size, io.mask, codes_buf.data(), code_w, &pf);
    io.codes = codes_buf.data();
  }
  if (!io.meta && io.meta_packed && f.scaled && f.has_meta()) {
    int64_t nmeta = g.meta_count();
    meta_buf.resize(static_cast<size_t>(nmeta));
    unpack_bits(io.meta_packed, f.meta_bits(), nmeta, nullptr, meta_buf.data(), 1, &pf);
    io.meta = meta_buf.data();
  }
  const Num& n = f.elem;
  // Decode table for narrow codes (decode_codes uses one for <= 16 bits).
  std::vector<double> table;
  if (!f.codebook() && n.bits <= 16) {
    table.resize(size_t(1) << n.bits);
    for (size_t cd = 0; cd < table.size(); ++cd) table[cd] = n.decode(cd);
  }
  auto decode = [&](uint64_t code) -> double {
    if (!table.empty()) return table[code & (table.size() - 1)];
    return n.decode(code);
  };
  float nan_f = from_fbits(kQuietNaN);
  if (!f.scaled) {
    pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
      int64_t end = std::min(g.size, c1 * kChunk);
      for (int64_t i = c0 * kChunk; i < end; ++i) {
        float y = static_cast<float>(decode(load_code(io.codes, code_w, i)));
        if (io.mask && !io.mask[i]) y = 0.0f;
        store_y(io.values, io.values_type, i, y);
      }
    });
    return "";
  }
  if (!io.scale) return "dequantizing needs the scale tensor";
  if (f.has_zero && !io.zero) return "dequantizing needs the zero point tensor";
  if (f.has_ts && !io.tenscale) return "dequantizing needs the tensor scale";
  if (f.has_meta() && !io.meta) return "dequantizing needs the meta tensor";
  int scale_w = code_width(f.scale.bits);
  int zero_w = f.has_zero ? code_width(f.zero.bits) : 1;
  float ts = 0.0f;
  if (f.has_ts)
    ts = static_cast<float>(f.ts.decode(load_code(io.tenscale, code_width(f.ts.bits), 0)));
  int64_t Tr = g.Tr, Tc = g.Tc;
  int64_t sub_rows = g.sub_rows(), sub_cols = g.sub_cols();
  auto tile_fn = [&](int64_t t) {
    int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
    int64_t gi = g.kind == 0 ? 0 : g.grid(b, rt, ct, g.nR, g.nC);
    uint64_t sc_code = load_code(io.scale, scale_w, gi);
    bool exp_scale = f.scale.kind == kExponent;
    int sexp = 0;
    bool nan_tile = false;
    float sc = 0.0f, eff = 0.0f, zp = 0.0f;
    if (exp_scale) {
      sexp = static_cast<int>(sc_code) - f.scale.bias - int_frac_bits(f.elem);
      nan_tile = sc_code == (1ull << f.scale.ebits) - 1;
      if (nan_tile) sexp = 0;
    } else {
      sc = static_cast<float>(f.scale.decode(sc_code));
      nan_tile = std::isnan(sc);
      eff = f.has_ts ? sc * ts : sc;
      if (f.has_zero) zp = static_cast<float>(f.zero.decode(load_code(io.zero, zero_w, gi)));
    }
    double pw = pow2(sexp);
    int64_t Sr = g.Sc ? g.Sr : 1, Sc = g.Sc ? g.Sc : 1;
    for (int64_t i = 0; i < Tr; ++i) {
      int64_t r = rt * Tr + i;
      if (r >= g.R) break;
      int64_t c0 = ct * Tc;
      int64_t valid = std::min<int64_t>(Tc, g.C - c0);
      int64_t mrow = b * g.R + r;
      int64_t base = g.kind == 0 ? 0 : g.orig(mrow, c0);
      int64_t step = g.kind == 0 ? 1 : g.Post;
      for (int64_t j = 0; j < valid; ++j) {
        int64_t o = base + j * step;
        uint64_t code = load_code(io.codes, code_w, o);
        float y;
        if (exp_scale) {
          int meta = 0;
          if (f.has_meta()) {
            int64_t mi;
            if (g.Sc) {
              mi = g.grid(b, (rt * Tr + i) / Sr, (c0 + j) / Sc, sub_rows, sub_cols);
            } else {
              mi = gi;
            }
            meta = io.meta[mi];
          }
          double q;
          if (f.codebook()) {
            size_t w = size_t(1) << f.cb_ib;
            q = f.table[static_cast<size_t>(meta) * w + (code & (w - 1))];
          } else {
            q = decode(code);
          }
          double yy = q * pw;
          if (g.Sc && !f.codebook()) yy = yy * pow2(-meta);
          y = nan_tile ? nan_f : static_cast<float>(yy);
        } else {
          float q = static_cast<float>(decode(code));
          if (f.has_zero) {
            y = f.zero.kind == kFloat ? q * sc + zp : (q - zp) * sc;
          } else {
            y = q * eff;
          }
          if (nan_tile) y = nan_f;
        }
        if (io.mask && !io.mask[o]) y = 0.0f;
        store_y(io.values, io.values_type, o, y);
      }
    }
  };
  if (g.kind == 0) {
    // One tile covering the tensor in memory order: split by chunks of elements.
    Geometry flat = g;
    pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
      (void)flat;
      int64_t begin = c0 * kChunk, end = std::min(g.size, c1 * kChunk);
      uint64_t sc_code = load_code(io.scale, scale_w, 0);
      bool exp_scale = f.scale.kind == kExponent;
      for (int64_t o = begin; o < end; ++o) {
        uint64_t code = load_code(io.codes, code_w, o);
        float y;
        if (exp_scale) {
          bool nan_tile = sc_code == (1ull << f.scale.ebits) - 1;
          int sexp = nan_tile ? 0 : static_cast<int>(sc_code) - f.scale.bias - int_frac_bits(f.elem);
          double q;
          if (f.codebook()) {
            size_t w = size_t(1) << f.cb_ib;
            q = f.table[static_cast<size_t>(io.meta[0]) * w + (code & (w - 1))];
          } else {
            q = decode(code);
          }
          y = nan_tile ? nan_f : static_cast<float>(q * pow2(sexp));
        } else {
          float sc = static_cast<float>(f.scale.decode(sc_code));
          float q = static_cast<float>(decode(code));
          if (f.has_zero) {
            float zp = static_cast<float>(f.zero.decode(load_code(io.zero, zero_w, 0)));
            y = f.zero.kind == kFloat ? q * sc + zp : (q - zp) * sc;
          } else {
            y = q * sc;
          }
          if (std::isnan(sc)) y = nan_f;
        }
        if (io.mask && !io.mask[o]) y = 0.0f;
        store_y(io.values, io.values_type, o, y);
      }
    });
    return "";
  }
  pf(g.tiles(), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) tile_fn(t);
  });
  return "";
}

namespace {

// Codes [i0, i1) (i0 a multiple of 8: the stream is byte aligned there) into the stream.
void pack_range(const void* codes, int width, int64_t i0, int64_t i1, int bits, uint8_t* out) {
  uint8_t* o = out + (i0 * bits) / 8;
  if (width == 1 && bits == 8) {
    std::memcpy(o, static_cast<const uint8_t*>(codes) + i0, static_cast<size_t>(i1 - i0));
    return;
  }
  if (width == 1 && bits == 4) {
    const uint8_t* c = static_cast<const uint8_t*>(codes) + i0;
    int64_t n = i1 - i0, k = 0;
    for (; k + 1 < n; k += 2) o[k >> 1] = static_cast<uint8_t>((c[k] & 0xF) | ((c[k + 1] & 0xF) << 4));
    if (k < n) o[k >> 1] = static_cast<uint8_t>(c[k] & 0xF);
    return;
  }
  if (width == 1 && (bits == 1 || bits == 2)) {
    const uint8_t* c = static_cast<const uint8_t*>(codes) + i0;
    int per = 8 / bits;
    uint32_t cm = (1u << bits) - 1u;
    int64_t n = i1 - i0, k = 0;
    for (; k + per <= n; k += per) {
      uint32_t v = 0;
      for (int j = 0; j < per; ++j) v |= (c[k + j] & cm) << (j * bits);
      o[k / per] = static_cast<uint8_t>(v);
    }
    if (k < n) {
      uint32_t v = 0;
      for (int j = 0; k + j < n; ++j) v |= (c[k + j] & cm) << (j * bits);
      o[k / per] = static_cast<uint8_t>(v);
    }
    return;
  }
  uint64_t m = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  uint64_t acc = 0;  // pending bits, LSB first
  int nacc = 0;
  for (int64_t i = i0; i < i1; ++i) {
    uint64_t v = load_code(codes, width, i) & m;
    int take = bits;
    while (take > 0) {
      int room = 64 - nacc;
      int t = take < room ? take : room;
      uint64_t part = t >= 64 ? v : v & ((1ull << t) - 1);
      acc |= nacc < 64 ? part << nacc : 0;
      nacc += t;
      v = t >= 64 ? 0 : v >> t;
      take -= t;
      while (nacc >= 8) {
        *o++ = static_cast<uint8_t>(acc);
        acc >>= 8;
        nacc -= 8;
      }
    }
  }
  if (nacc > 0) *o = static_cast<uint8_t>(acc);
}

// Codes [i0, i1) (i0 a multiple of 8) from the stream.
void unpack_range(const uint8_t* stream, int bits, int64_t i0, int64_t i1, void* codes,
                  int width) {
  const uint8_t* s = stream + (i0 * bits) / 8;
  if (width == 1 && bits == 8) {
    std::memcpy(static_cast<uint8_t*>(codes) + i0, s, static_cast<size_t>(i1 - i0));
    return;
  }
  if (width == 1 && (bits == 4 || bits == 1 || bits == 2)) {
    uint8_t* c = static_cast<uint8_t*>(codes) + i0;
    int per = 8 / bits;
    uint8_t m = static_cast<uint8_t>((1u << bits) - 1);
    for (int64_t k = 0; k < i1 - i0; ++k)
      c[k] = static_cast<uint8_t>((s[k / per] >> ((k % per) * bits)) & m);
    return;
  }
  uint64_t acc = 0;
  int nacc = 0;
  for (int64_t i = i0; i < i1; ++i) {
    uint64_t v = 0;
    int done = 0;
    while (done < bits) {
      if (nacc == 0) {
        acc = *s++;
        nacc = 8;
      }
      int t = bits - done < nacc ? bits - done : nacc;
      v |= (acc & ((1ull << t) - 1)) << done;
      acc >>= t;
      nacc -= t;
      done += t;
    }
    store_code(codes, width, i, v);
  }
}

constexpr int64_t kPackChunk = int64_t(1) << 16;  // codes per parallel chunk (a multiple of 8)

}  // namespace

int64_t pack_bits(const void* codes, int width, int64_t count, int bits, const uint8_t* mask,
                  uint8_t* out, const ParallelFor* pf) {
  if (mask) {
    // The stream holds the kept codes only (out is sized for them): clear just those bytes.
    int64_t kept = 0;
    for (int64_t i = 0; i < count; ++i) kept += mask[i] ? 1 : 0;
    std::memset(out, 0, static_cast<size_t>(packed_nbytes(kept, bits)));
    int64_t k = 0;
    uint64_t bitpos = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (!mask[i]) continue;
      uint64_t v = load_code(codes, width, i);
      for (int done = 0; done < bits;) {
        uint64_t byte = bitpos >> 3;
        int off = static_cast<int>(bitpos & 7);
        int take = std::min(8 - off, bits - done);
        out[byte] |= static_cast<uint8_t>(((v >> done) & ((1u << take) - 1)) << off);
        done += take;
        bitpos += static_cast<uint64_t>(take);
      }
      k++;
    }
    return k;
  }
  int64_t chunks = (count + kPackChunk - 1) / kPackChunk;
  auto body = [&](int64_t c0, int64_t c1) {
    pack_range(codes, width, c0 * kPackChunk, std::min(count, c1 * kPackChunk), bits, out);
  };
  if (pf && chunks > 1) {
    (*pf)(chunks, body);
  } else {
    body(0, chunks);
  }
  return count;
}

void unpack_bits(const uint8_t* stream, int bits, int64_t count, const uint8_t* mask,
                 void* codes, int width, const ParallelFor* pf) {
  if (mask) {
    uint64_t bitpos = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (!mask[i]) {
        store_code(codes, width, i, 0);
        continue;
      }
      uint64_t v = 0;
      for (int done = 0; done < bits;) {
        uint64_t byte = bitpos >> 3;
        int off = static_cast<int>(bitpos & 7);
        int take = std::min(8 - off, bits - done);
        v |= static_cast<uint64_t>((stream[byte] >> off) & ((1u << take) - 1)) << done;
        done += take;
        bitpos += static_cast<uint64_t>(take);
      }
      store_code(codes, width, i, v);
    }
    return;
  }
  int64_t chunks = (count + kPackChunk - 1) / kPackChunk;
  auto body = [&](int64_t c0, int64_t c1) {
    unpack_range(stream, bits, c0 * kPackChunk, std::min(count, c1 * kPackChunk), codes, width);
  };
  if (pf && chunks > 1) {
    (*pf)(chunks, body);
  } else {
    body(0, chunks);
  }
}

// -- a small thread pool for the C ABI -------------------------------------------------------
namespace {

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()); }
  // Runs task(i) for i in [0, n) on the workers and the caller; returns when all are done.
  void run(int64_t n, const std::function<void(int64_t)>& task) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one job at a time
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    auto body = [&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        task(i);
        done.fetch_add(1);
      }
    };
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = body;
      gen_++;
    }
    cv_.notify_all();
    body();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return active_ == 0 && done.load() == n; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || (gen_ != seen && job_); });
        if (stop_) return;
        seen = gen_;
        job = job_;
        active_++;
      }
      job();
      {
        std::lock_guard<std::mutex> lk(mu_);
        active_--;
      }
      done_cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void()> job_;
  uint64_t gen_ = 0;
  int active_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(std::max(0, static_cast<int>(std::thread::hardware_concurrency()) - 1));
  return p;
}

}  // namespace

ParallelFor default_parallel_for(int nthreads) {
  return [nthreads](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    int workers = nthreads > 0 ? nthreads : pool().size() + 1;
    if (workers <= 1 || n == 1) {
      fn(0, n);
      return;
    }
    int64_t tasks = std::min<int64_t>(n, static_cast<int64_t>(workers) * 8);
    pool().run(tasks, [&](int64_t i) {
      int64_t b = n * i / tasks, e = n * (i + 1) / tasks;
      if (b < e) fn(b, e);
    });
  };
}

}  // namespace onnxq
