// The general cast path, tile by tile (onnxq/cast/reference.py in C++).
//
// Each tile is gathered into a small float32 buffer in layout.py's to_tiles order (padding is
// zero), its statistics and scale are computed exactly as the reference computes them, and
// every element is rounded with the reference's arithmetic (float64 for exponent scales,
// float32 for float scales and zero points).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "quant_internal.h"

namespace onnxq::kern {

TileParams tile_params(const Ctx& c, const Stats& st, int step) {
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
      const bool search = c.m.scale_mode == kSSearch;
      p.sexp = scale_exponent(st.amax, f.elem, f.scale, search ? kSFloor : c.m.scale_mode);
      if (step != 0 && st.amax > 0) {  // a candidate of the search: the stored code moves
        int frac = int_frac_bits(f.elem);
        int stored = p.sexp + frac + step;
        int low = -f.scale.bias, high = (1 << f.scale.ebits) - 2 - f.scale.bias;
        p.sexp = (stored < low ? low : stored > high ? high : stored) - frac;
      }
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
      p.sc = float_step(cast_scale(raw, f.scale), f.scale, step);
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
      p.zero = cast_scale(lo, f.zero);
      float r = (hi - p.zero) / qmax;
      float raw = r < 0.0f ? 0.0f : r;  // np.maximum(r, 0): ties and NaN keep r's value
      if (r == 0.0f) raw = 0.0f;
      p.sc = cast_scale(raw, f.scale);
      p.scale_code = encode_value(p.nan_tile ? NAN : static_cast<double>(p.sc), f.scale);
      p.zero_code = encode_value(static_cast<double>(p.zero), f.zero);
      // reference._zero_float_top: the largest q whose decoded value stays finite.
      const double over = overflow(finite_type(c.io));
      const double s64 = p.sc, z64 = p.zero, qm = f.elem.maxfloat;  // exact 2^N - 1
      double q = qm;
      if (s64 > 0) {
        double t = std::floor((over - z64) / s64) + 1.0;
        q = t < 0.0 ? 0.0 : t > qm ? qm : t;  // np.clip (NaN stays NaN)
      }
      for (int k = 0; k < 3; ++k) {
        float qf = static_cast<float>(q);
        float y = qf * p.sc + p.zero;
        if (std::fabs(y) >= over && q > 0) q = int_below(qf > 1.0f ? qf : 1.0f);
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
      // clipped at the exact 2^N - 1 (float qmax is 2^N from 25 bits on)
      const double top = f.elem.maxfloat;
      double zpd = std::nearbyint(static_cast<double>(zp));
      zpd = zpd < 0.0 ? 0.0 : zpd > top ? top : zpd;
      p.zp = zpd;
      // q - zp decodes to (q - zp) * sc: keep |q - zp| where that stays finite.
      double reach = product_bound(p.sc, f.elem, top, product_limit(finite_type(c.io)));
      p.q_lo = zpd - reach > 0.0 ? zpd - reach : 0.0;
      p.q_hi = zpd + reach < top ? zpd + reach : top;
      p.scale_code = encode_value(p.nan_tile ? NAN : static_cast<double>(p.sc), f.scale);
      p.zero_code = encode_value(static_cast<double>(p.zp), f.zero);
      break;
    }
  }
  return p;
}

namespace {

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
                 p.zp;
      q = q < 0.0 ? 0.0 : q > qmax ? qmax : q;
      q = q < p.q_lo ? p.q_lo : q > p.q_hi ? p.q_hi : q;
      *y = static_cast<float>(q - p.zp) * p.sc;
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

}  // namespace

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

namespace {

// The sum of reference.l2_metric: left to right in float64 (its order decides near-ties
// between mappings).
inline double unit_sum(const double* sq, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += sq[i];
  return acc;
}

// One element's outputs: nothing for padding, zero for a pruned position.
ONNXQ_ALWAYS_INLINE void emit_elem(const Ctx& c, Scratch& s, int64_t k, float y,
                                   uint64_t code) {
  const QuantizeIO& io = c.io;
  int64_t o = s.idx[k];
  if (o < 0) return;
  if (c.f.sparse_m && !s.keep[k]) y = 0.0f;  // pruned positions read as zero
  if (s.trial) {
    s.y[static_cast<size_t>(k)] = y;
    return;
  }
  if (io.values) store_y(io.values, io.values_type, o, y);
  if (io.codes) store_code(io.codes, c.code_w, o - c.codes_base, code);
}

// The stochastic rounding bits of tile position k (0 for round to nearest and padding).
ONNXQ_ALWAYS_INLINE uint32_t rand_at(const Ctx& c, const Scratch& s, int64_t k) {
  return c.stochastic && s.idx[k] >= 0 ? stochastic_bits(c.key, static_cast<uint64_t>(s.idx[k]))
                                       : 0u;
}

// An MX shift unit (tile positions ue): its meta is 1 when every |x| lies below thr, and its
// elements then round on a grid halved.
uint8_t shift_unit(const Ctx& c, const TileParams& p, Scratch& s, const std::vector<int64_t>& ue,
                   double thr) {
  bool below = true;
  for (int64_t k : ue) {
    float xv = s.x[k];
    double ax = std::isfinite(xv) ? std::fabs(xv) : 0.0;
    if (!(ax < thr)) { below = false; break; }
  }
  for (int64_t k : ue) {
    if (s.idx[k] < 0) continue;
    float y = 0.0f;
    uint64_t code = 0;
    quant_elem(c, p, s.x[k], rand_at(c, s, k), below, &y, &code);
    emit_elem(c, s, k, y, code);
  }
  return below ? 1 : 0;
}

// A codebook unit (tile positions ue): the nearest entry per mapping, the mapping with the
// least L2 error; returns the mapping (the unit's meta).
uint8_t codebook_unit(const Ctx& c, const TileParams& p, Scratch& s,
                      const std::vector<int64_t>& ue) {
  const Format& f = c.f;
  const int64_t usize = static_cast<int64_t>(ue.size());
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
    emit_elem(c, s, k, y, code);
  }
  return static_cast<uint8_t>(best_map);
}

}  // namespace

namespace {

// Every element (and unit meta) of gathered tile t with params p: into the outputs, or into
// s.y when s.trial.
void tile_elements(const Ctx& c, const TileParams& p, const Stats& st, int64_t t, Scratch& s) {
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
  int64_t Tr = g.Tr, Tc = g.Tc, n = Tr * Tc;
  if (c.path == kExp || c.path == kFloatScale || c.path == kZeroFloat || c.path == kZeroInt) {
    for (int64_t k = 0; k < n; ++k) {
      if (s.idx[k] < 0) continue;
      float y = 0.0f;
      uint64_t code = 0;
      quant_elem(c, p, s.x[k], rand_at(c, s, k), false, &y, &code);
      emit_elem(c, s, k, y, code);
    }
    return;
  }
  // Units: subtiles (to_subtiles order) or the whole tile.
  int64_t Sr = g.Sc ? g.Sr : Tr, Sc = g.Sc ? g.Sc : Tc;
  int64_t ur = Tr / Sr, uc = Tc / Sc, usize = Sr * Sc;
  int64_t sub_rows = g.sub_rows(), sub_cols = g.sub_cols();
  int64_t gi = g.kind == 0 ? 0 : g.grid(b, rt, ct, g.nR, g.nC);
  double thr = pow2(floor_log2(static_cast<double>(st.amax)));
  std::vector<int64_t> ue(usize);
  for (int64_t ui = 0; ui < ur; ++ui) {
    for (int64_t uj = 0; uj < uc; ++uj) {
      for (int64_t a = 0; a < Sr; ++a)
        for (int64_t bb = 0; bb < Sc; ++bb) ue[a * Sc + bb] = (ui * Sr + a) * Tc + uj * Sc + bb;
      uint8_t meta = c.path == kExpShift ? shift_unit(c, p, s, ue, thr) : codebook_unit(c, p, s, ue);
      if (io.meta && !s.trial) {
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

// Scale mode search (scale_search.py): the tile cast with each candidate of STEPS into s.y,
// its squared error over finite inputs added in float64 in tile order; the least error wins,
// ties keep the earlier candidate. Returns the winner's params.
TileParams search_params(const Ctx& c, const Stats& st, int64_t t, Scratch& s) {
  static const int kSteps[] = {0, 1, -1};
  const int64_t n = c.g.Tr * c.g.Tc;
  s.y.assign(static_cast<size_t>(n), 0.0f);
  s.trial = true;
  TileParams best;
  double best_err = 0.0;
  for (int i = 0; i < 3; ++i) {
    TileParams p = tile_params(c, st, kSteps[i]);
    TileParams run = p;
    run.nan_tile = false;  // the error of a NaN tile's finite values, as the reference sees it
    tile_elements(c, run, st, t, s);
    double err = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      float xv = s.x[static_cast<size_t>(k)];
      if (s.idx[static_cast<size_t>(k)] < 0 || !std::isfinite(xv)) continue;
      double d = static_cast<double>(s.y[static_cast<size_t>(k)]) - static_cast<double>(xv);
      err += d * d;
    }
    if (i == 0 || err < best_err) {
      best_err = err;
      best = p;
    }
  }
  s.trial = false;
  return best;
}

}  // namespace

void process_tile(const Ctx& c, int64_t t, Scratch& s) {
  const Geometry& g = c.g;
  const Format& f = c.f;
  const QuantizeIO& io = c.io;
  int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
  int64_t n = g.Tr * g.Tc;
  gather_tile(c, t, s);
  if (f.sparse_m) {
    if (io.mask) {
      for (int64_t k = 0; k < n; ++k) if (s.idx[k] >= 0) io.mask[s.idx[k]] = s.keep[k];
    }
  }
  Stats st;
  bool want_range = c.path == kZeroFloat || c.path == kZeroInt;
  for (int64_t k = 0; k < n; ++k) accumulate(st, s.x[k], want_range);
  TileParams p = c.m.scale_mode == kSSearch && !want_range ? search_params(c, st, t, s)
                                                            : tile_params(c, st);
  int64_t gi = g.kind == 0 ? 0 : g.grid(b, rt, ct, g.nR, g.nC);
  if (io.scale) store_code(io.scale, c.scale_w, gi, p.scale_code);
  if (io.zero && f.has_zero) store_code(io.zero, c.zero_w, gi, p.zero_code);
  tile_elements(c, p, st, t, s);
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

}  // namespace onnxq::kern
