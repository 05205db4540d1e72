// The fast row kernels (fast_rows_*.inc, compiled once per instruction set) and their setup.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu_features.h"
#include "fast_channels.h"
#include "fast_rows.h"

namespace onnxq::kern {

// Vector arguments of the per-ISA kernels are internal (always inlined): no ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

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
// exponent scales take fk_exp_params in fast_rows_scalar.inc.
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
  // (fast_rows_vector.inc's fk_float_fits).
  double top = static_cast<double>(ff.maxfloat_f) + (ff.full_int_range ? 1.0 : 0.0);
  return nan_tile || top * static_cast<double>(t->eff) < ff.prod_limit;
}

namespace fast_base {
constexpr int kFkLanes = 8;  // vector lanes of fast_rows_vector.inc
constexpr bool kFkBmi2 = false;  // BMI2's parallel bit extract (pext) available
#include "fast_rows_scalar.inc"  // NOLINT(build/include)
#include "fast_rows_vector.inc"  // NOLINT(build/include)
#include "fast_rows_driver.inc"  // NOLINT(build/include)
#include "fast_channels.inc"  // NOLINT(build/include)
}  // namespace fast_base

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace fast_avx2 {
constexpr int kFkLanes = 8;
constexpr bool kFkBmi2 = false;
#include "fast_rows_scalar.inc"  // NOLINT(build/include)
#include "fast_rows_vector.inc"  // NOLINT(build/include)
#include "fast_rows_driver.inc"  // NOLINT(build/include)
#include "fast_channels.inc"  // NOLINT(build/include)
}  // namespace fast_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi2")
namespace fast_avx512 {
constexpr int kFkLanes = 16;
constexpr bool kFkBmi2 = true;  // every AVX-512 CPU has BMI2 (fast_rows_level checks)
#include "fast_rows_scalar.inc"  // NOLINT(build/include)
#include "fast_rows_vector.inc"  // NOLINT(build/include)
#include "fast_rows_driver.inc"  // NOLINT(build/include)
#include "fast_channels.inc"  // NOLINT(build/include)
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

}  // namespace

int fast_rows_level() {
#ifdef ONNXQ_FAST_X86
  return simd_level(true);
#else
  return 0;
#endif
}

FastRows fast_rows_for(int level) {
#ifdef ONNXQ_FAST_X86
  switch (level) {
    case 2: return fast_avx512::fk_rows;
    case 1: return fast_avx2::fk_rows;
    default: break;
  }
#endif
  return fast_base::fk_rows;
}

FastChans fast_chans_for(int level) {
#ifdef ONNXQ_FAST_X86
  switch (level) {
    case 2: return fast_avx512::fk_chan_rows;
    case 1: return fast_avx2::fk_chan_rows;
    default: break;
  }
#endif
  return fast_base::fk_chan_rows;
}

FkCbRows fast_cb_rows_for(int level) {
#ifdef ONNXQ_FAST_X86
  switch (level) {
    case 2: return fast_avx512::fk_cb_dequant_rows;
    case 1: return fast_avx2::fk_cb_dequant_rows;
    default: break;
  }
#endif
  return fast_base::fk_cb_dequant_rows;
}

namespace {

// Whether the fast path can take this cast at all: the tensor, its outputs and its format.
bool fast_applies(const Ctx& c, bool channels) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const Num& n = f.elem;
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  if (g.kind != 1 || (g.Post != 1 && !channels) || c.io.x_type != kF32) return false;
  bool codes = c.io.codes || c.io.packed;
  if (c.io.values ? c.io.values_type != kF32 : !codes) return false;
  if (codes && (f.code_bits() > 8 || c.io.mask || (c.io.zero && f.has_zero))) return false;
  if (codes && f.scaled && f.scale.bits > 8) return false;
  if (f.sparse_m || f.codebook() || c.stochastic || c.m.round_mode > kZero) return false;
  if (c.m.scale_mode == kSSearch) return false;  // the search runs tile by tile
  if (c.path != kExp && c.path != kExpShift && c.path != kFloatScale) return false;
  if (n.kind != kFloat && n.kind != kInt) return false;
  if (n.kind == kInt && n.bits > 24) return false;  // q * 2^k must round once, not via float(q)
  if (g.Tc > 1024 || g.Tc < 1) return false;
  if (c.path == kExpShift && (g.Sc < 1 || g.Tc % g.Sc)) return false;
  return true;
}

// Float scales (NVFP4): the element grid's tile (the same for every tile) and the scale
// number's grid as a tile. mf: the element's maxfloat as a float32.
bool fast_setup_float_scale(const Ctx& c, FastFormat* ff, float mf) {
  const Format& f = c.f;
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
  return true;
}

// Exponent scales: the clamp of the scale exponent and the scale mode as a threshold.
bool fast_setup_exp_scale(const Ctx& c, FastFormat* ff) {
  const Format& f = c.f;
  const Num& n = f.elem;
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
  return true;
}

// The code constants: codes read off the rounding, the NaN codes, the scale's codes.
bool fast_setup_codes(const Ctx& c, FastFormat* ff, bool codes) {
  const Format& f = c.f;
  const Num& n = f.elem;
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

}  // namespace

// Sets up the fast path for this cast; false when it does not apply (the general path runs).
bool fast_setup(const Ctx& c, FastFormat* ff, bool channels) {
  if (!fast_applies(c, channels)) return false;
  const Format& f = c.f;
  const Geometry& g = c.g;
  const Num& n = f.elem;
  bool codes = c.io.codes || c.io.packed;
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
  if (ff->float_scale && !fast_setup_float_scale(c, ff, mf)) return false;
  if (!ff->float_scale && !fast_setup_exp_scale(c, ff)) return false;
  return fast_setup_codes(c, ff, codes);
}

}  // namespace onnxq::kern
