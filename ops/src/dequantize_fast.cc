// The fast dequantize paths: exponent- and float-scaled codes of at most 8 bits (table lookups,
// vector kernels in fast_dequant.inc) and codebook lookups along the last axis.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "dequantize_fast.h"
#include "fast_rows.h"
#include "quant_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace onnxq::kern {

// Vector arguments of the per-ISA kernels are internal (always inlined): no ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"

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
#include "fast_dequant.inc"  // NOLINT(build/include)
}  // namespace dq_base

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
#undef DQK_ISA
#define DQK_ISA 1
namespace dq_avx2 {
#include "fast_dequant.inc"  // NOLINT(build/include)
}  // namespace dq_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2")
// GCC 12's _mm512_cvtepu8_epi32 reads _mm512_undefined_epi32() (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#undef DQK_ISA
#define DQK_ISA 2
namespace dq_avx512 {
#include "fast_dequant.inc"  // NOLINT(build/include)
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

}  // namespace

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
  const int level = fast_rows_level();  // the same instruction set as the row kernels
  FkCbRows rows_fn = fast_cb_rows_for(level);
#ifdef ONNXQ_DQ_X86
  if (level == 2) rows_fn = dq_avx512::dqk_cb_rows;
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

}  // namespace onnxq::kern
