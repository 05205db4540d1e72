// Fast row kernels for the common casts: float32 tensors tiled along their last axis with an
// exponent scale (MXFP*, MXINT8, BFP, MX6/MX9) or a float scale (NVFP4), rounded to nearest
// even, away or toward zero. Included by kernels.cc once per instruction set (inside its own
// namespace and `#pragma GCC target`), so nothing here may have external linkage or use a
// template from a header: every helper is defined in this file.
//
// Bit-exactness with the float64 reference (elements.quantize_values): scaling by 2^-s, rounding
// to the element grid and scaling back by 2^s is the same as rounding |x| itself to a multiple
// of 2^k, k = s for ints and k = max(floor_log2|x| - mbits, emin - mbits + s) for floats. That
// rounding is done on the float32 bits: dropping d low bits with an integer add (the carry may
// run into the exponent field, which is the correct next binade), or, when the step is above
// |x|'s leading bit, a comparison with half the step. The clamp to maxfloat * 2^s is an integer
// compare of non-negative float bits. The tile parameters (fast_tile) refuse the tiles where
// any of these steps would not be exact, and the caller then takes the general per-element path.

// No include guard: kernels.cc includes this file once per target.

// Rounds the magnitude bits b (0 <= b < 0x7F800000: finite) to a multiple of 2^k.
// rm: 0 nearest even, 1 away (floor(t + 0.5)), 2 toward zero on ties (ceil(t - 0.5)).
__attribute__((always_inline)) static inline uint32_t fk_round(uint32_t b, int k, int rm) {
  int e = static_cast<int>(b >> 23);
  int u = e ? e - 150 : -149;  // exponent of b's last bit
  int d = k - u;               // bits to drop
  int dd = d < 1 ? 1 : d > 23 ? 23 : d;
  uint32_t half = 1u << (dd - 1);
  uint32_t mask = (1u << dd) - 1u;
  // The last kept bit: a mantissa bit, or for d = 23 the implicit bit of a normal b.
  uint32_t lsb = ((b | (e ? 0x800000u : 0u)) >> dd) & 1u;
  uint32_t add = rm == 1 ? half : rm == 2 ? half - 1u : half - 1u + lsb;
  uint32_t rb = (b + add) & ~mask;
  // d >= 24: b lies below the step 2^k (k >= -125 here); the result is 0 or 2^k.
  int kk = k > 128 ? 128 : k < -125 ? -125 : k;
  uint32_t pk = static_cast<uint32_t>(kk + 127) << 23;
  uint32_t hk = pk - (1u << 23);
  uint32_t rc = ((b > hk) | ((b == hk) & (rm == 1))) ? pk : 0u;
  return d <= 0 ? b : d <= 23 ? rb : rc;
}

// floor(log2(a)) of the magnitude bits b of a finite float32, -126 for subnormals (fast_tile
// only lets floats here when every subnormal lies below the tile's smallest step, so the
// subnormal's own exponent does not matter). Integer only: a float conversion would be a
// trapping operation that the vectorizer cannot if-convert.
__attribute__((always_inline)) static inline int fk_floor_log2(uint32_t b) {
  int e = static_cast<int>(b >> 23);
  return (e ? e : 1) - 127;
}

// One element: x bits in, y bits out. FL: float elements (k = max(floor_log2|x| - mbits, kb)),
// else ints (k = kb). kb, top_pos and top_neg already include a subtile shift.
template <bool FL, int RM>
__attribute__((always_inline)) static inline uint32_t fk_elem_t(uint32_t xb, int mbits, int kb,
                                                                uint32_t top_pos,
                                                                uint32_t top_neg, bool negzero) {
  uint32_t b = xb & 0x7FFFFFFFu;
  uint32_t sign = xb & 0x80000000u;
  int k = kb;
  if (FL) {
    int fl = fk_floor_log2(b) - mbits;
    k = fl > kb ? fl : kb;
  }
  uint32_t r = b >= 0x7F800000u ? b : fk_round(b, k, RM);
  uint32_t top = sign ? top_neg : top_pos;
  uint32_t mag = r < top ? r : top;
  uint32_t out = mag | sign;
  out = (!negzero & (mag == 0)) ? 0u : out;
  return b > 0x7F800000u ? 0x7FC00000u : out;  // NaN: the reference's canonical NaN
}

static inline uint32_t fk_elem(uint32_t xb, const FastTile& t, const FastFormat& ff, int shift) {
  int kb = (ff.is_float ? t.kmin : t.kint) - shift;
  uint32_t tp = t.top_pos - (static_cast<uint32_t>(shift) << 23);
  uint32_t tn = t.top_neg - (static_cast<uint32_t>(shift) << 23);
  if (ff.is_float) {
    switch (ff.rm) {
      case 1: return fk_elem_t<true, 1>(xb, ff.mbits, kb, tp, tn, ff.negzero);
      case 2: return fk_elem_t<true, 2>(xb, ff.mbits, kb, tp, tn, ff.negzero);
      default: return fk_elem_t<true, 0>(xb, ff.mbits, kb, tp, tn, ff.negzero);
    }
  }
  switch (ff.rm) {
    case 1: return fk_elem_t<false, 1>(xb, ff.mbits, kb, tp, tn, ff.negzero);
    case 2: return fk_elem_t<false, 2>(xb, ff.mbits, kb, tp, tn, ff.negzero);
    default: return fk_elem_t<false, 0>(xb, ff.mbits, kb, tp, tn, ff.negzero);
  }
}

// Round to nearest even by float32 arithmetic, the cheap form of fk_elem_t<FL, 0> (same
// bits): an int grid 2^k, and the subnormal range of a float element, round by adding and
// subtracting 2^(k + 23), whose float32 spacing is 2^k (exact: |x| < 2^(k + 23) for every
// finite x of the tile); the normal range of a float element keeps mbits mantissa bits with
// an integer add. Only when the FPU keeps subnormals (fk_fpu_exact). Magnitudes stay below
// 2^31, so signed compares (which every SIMD level has) are used.
template <bool FL, bool SHIFT>
__attribute__((always_inline)) static inline uint32_t fk_rne_elem(uint32_t xb, uint32_t sh,
                                                                  const FastTile& t, int d,
                                                                  bool negzero) {
  int32_t b = static_cast<int32_t>(xb & 0x7FFFFFFFu);
  uint32_t sign = xb & 0x80000000u;
  uint32_t magic = t.magic - (SHIFT ? sh << 23 : 0u);
  float fb, fm;
  __builtin_memcpy(&fb, &b, 4);
  __builtin_memcpy(&fm, &magic, 4);
  float fr = (fb + fm) - fm;
  int32_t r;
  __builtin_memcpy(&r, &fr, 4);
  if (FL) {
    int32_t half_m1 = (1 << (d - 1)) - 1;
    // Unsigned: a NaN's payload (b up to 0x7FFFFFFF) wraps instead of overflowing (its result
    // is replaced by the canonical NaN anyway).
    int32_t rn = static_cast<int32_t>((static_cast<uint32_t>(b) + half_m1 + ((b >> d) & 1)) &
                                      ~((1u << d) - 1));
    r = b >= static_cast<int32_t>(t.norm_thr) ? rn : r;
  }
  int32_t top = static_cast<int32_t>((sign ? t.top_neg : t.top_pos) - (SHIFT ? sh << 23 : 0u));
  int32_t mag = r < top ? r : top;
  uint32_t out = static_cast<uint32_t>(mag) | sign;
  out = (!negzero & (mag == 0)) ? 0u : out;
  return b > 0x7F800000 ? 0x7FC00000u : out;  // NaN: the reference's canonical NaN
}

template <bool FL, bool SHIFT, int TC>
static inline void fk_rne_loop_t(const uint32_t* in, uint32_t* out, const uint32_t* shift, int n,
                                 const FastTile& t, int mbits, bool negzero) {
  if (TC > 0) n = TC;
  const int d = 23 - mbits;
  for (int j = 0; j < n; ++j)
    out[j] = fk_rne_elem<FL, SHIFT>(in[j], SHIFT ? shift[j] : 0u, t, d, negzero);
}

template <int TC>
static inline void fk_rne_loop(const uint32_t* in, uint32_t* out, const uint32_t* shift, int n,
                               const FastTile& t, const FastFormat& ff) {
  if (ff.is_float) {
    if (shift) fk_rne_loop_t<true, true, TC>(in, out, shift, n, t, ff.mbits, ff.negzero);
    else fk_rne_loop_t<true, false, TC>(in, out, shift, n, t, ff.mbits, ff.negzero);
  } else {
    if (shift) fk_rne_loop_t<false, true, TC>(in, out, shift, n, t, 0, ff.negzero);
    else fk_rne_loop_t<false, false, TC>(in, out, shift, n, t, 0, ff.negzero);
  }
}

// Whether float32 adds see subnormals as they are (no denormals-are-zero / flush-to-zero).
static inline bool fk_fpu_exact() {
#if defined(__x86_64__) || defined(__i386__)
  return (__builtin_ia32_stmxcsr() & 0x8040u) == 0;
#else
  return false;
#endif
}

// 2^floor(log2 a) as float32 bits for the magnitude bits A of a finite a (0 for a = 0).
__attribute__((always_inline)) static inline uint32_t fk_binade(uint32_t A) {
  if (A >= 0x800000u) return A & 0x7F800000u;
  return A ? 1u << (31 - __builtin_clz(A)) : 0u;
}

// The exponent-scaled tile's parameters from its statistics, integer only (scale_exponent and
// fast_tile's checks). False: the tile needs the general path.
__attribute__((always_inline)) static inline bool fk_exp_params(const FastFormat& ff, uint32_t A, bool nan, bool nonfinite,
                                 FastTile* t) {
  t->nan_tile = ff.policy == 1 ? nonfinite : (ff.nan_on_nan && nan);
  t->thr = fk_binade(A);
  t->zero_tile = A == 0 && !nonfinite;
  if (t->nan_tile || t->zero_tile) {
    t->kint = ff.low - ff.frac;  // the scale code of amax = 0 (unused for NaN tiles)
    return true;
  }
  if (A < 0x800000u) return false;  // zero or subnormal amax with Inf/NaN around: general path
  int e = static_cast<int>(A >> 23) - 127;
  int bump = ff.is_float && (A & 0x7FFFFFu) >= ff.bump_ge ? 1 : 0;
  int st = e + bump - ff.emax + ff.frac;
  st = st < ff.low ? ff.low : st > ff.high ? ff.high : st;
  int s = st - ff.frac;
  int room = ff.sub ? 1 : 0;
  t->kint = s;
  t->kmin = ff.emin - ff.mbits + s;
  if (s > 128 || t->kmin > 128) return false;
  if (ff.is_float && t->kmin < -126 - ff.mbits) return false;
  if (!fast_top(ff.top_field, ff.top_mant, s, room, &t->top_pos)) return false;
  t->top_neg = t->top_pos;
  if (ff.full_int_range && !ff.is_float && !fast_top(ff.neg_field, 0, s, room, &t->top_neg))
    return false;
  // Top values past the data type's largest finite value: the general path bounds them.
  if (t->top_pos > ff.finite_top || t->top_neg > ff.finite_top) return false;
  t->magic = t->norm_thr = 0;
  if (ff.rm == 0 && !fk_rne_grid(ff, t->kmin, room, &t->magic, &t->norm_thr)) return false;
  return true;
}

// The element loop of one tile: out[j] from in[j] with shift[j] (0, or 1 in a shifted subtile).
template <bool FL, int RM, int TC>
static inline void fk_loop_t(const uint32_t* in, uint32_t* out, const uint32_t* shift, int n,
                             const FastTile& t, const FastFormat& ff) {
  if (TC > 0) n = TC;
  const int mbits = ff.mbits;
  const int kb = FL ? t.kmin : t.kint;
  const uint32_t tp = t.top_pos, tn = t.top_neg;
  const bool nz = ff.negzero;
  if (shift) {
    for (int j = 0; j < n; ++j) {
      uint32_t sh = shift[j];
      out[j] = fk_elem_t<FL, RM>(in[j], mbits, kb - static_cast<int>(sh), tp - (sh << 23),
                                 tn - (sh << 23), nz);
    }
  } else {
    for (int j = 0; j < n; ++j) out[j] = fk_elem_t<FL, RM>(in[j], mbits, kb, tp, tn, nz);
  }
}

template <int TC>
static inline void fk_loop(const uint32_t* in, uint32_t* out, const uint32_t* shift, int n,
                           const FastTile& t, const FastFormat& ff) {
  if (ff.is_float) {
    switch (ff.rm) {
      case 1: fk_loop_t<true, 1, TC>(in, out, shift, n, t, ff); return;
      case 2: fk_loop_t<true, 2, TC>(in, out, shift, n, t, ff); return;
      default: fk_loop_t<true, 0, TC>(in, out, shift, n, t, ff); return;
    }
  }
  switch (ff.rm) {
    case 1: fk_loop_t<false, 1, TC>(in, out, shift, n, t, ff); return;
    case 2: fk_loop_t<false, 2, TC>(in, out, shift, n, t, ff); return;
    default: fk_loop_t<false, 0, TC>(in, out, shift, n, t, ff); return;
  }
}

// Statistics of one tile: largest finite magnitude (bits), any NaN, any Inf/NaN. Signed
// arithmetic: GCC vectorizes signed max reductions but not this unsigned one.
static inline void fk_stats(const uint32_t* xb, int n, uint32_t* amax, bool* nan, bool* nonfinite) {
  int32_t m = 0, all = 0;
  for (int j = 0; j < n; ++j) {
    int32_t b = static_cast<int32_t>(xb[j] & 0x7FFFFFFFu);
    int32_t fin = b < 0x7F800000 ? b : 0;
    m = fin > m ? fin : m;
    all = b > all ? b : all;
  }
  *amax = static_cast<uint32_t>(m);
  *nan = all > 0x7F800000;
  *nonfinite = all >= 0x7F800000;
}

// -- codes (elements.encode_values on the rounded float32 bits) --------------------------------
// y: the rounded value's bits as fk_elem_t returns them (sign, magnitude on the grid of 2^k, the
// canonical NaN); s: the element grid's exponent scale (the tile's minus its subtile shift), so
// the element value is |y| * 2^-s. Float elements: a normal element value 2^E (1 + m) has field
// E + bias and the top mbits of y's mantissa; a subnormal one is y's significand shifted to
// units of 2^(emin - mbits + s). fast_tile keeps emin + s >= -126, so an element normal is a
// float32 normal.
__attribute__((always_inline)) static inline uint32_t fk_code_float(uint32_t y, int s, int mbits,
                                                                    int emin, int bias, int bits,
                                                                    uint32_t nan_code) {
  uint32_t r = y & 0x7FFFFFFFu;
  uint32_t sign = y >> 31;
  int er = static_cast<int>(r >> 23);
  int ee = er ? er : 1;
  int E = ee - 127 - s;
  uint32_t mfull = (r & 0x7FFFFFu) | (er ? 0x800000u : 0u);
  uint32_t normal = (static_cast<uint32_t>(E + bias) << mbits) |
                    ((r >> (23 - mbits)) & ((1u << mbits) - 1u));
  int sh = 23 - mbits + emin - E;
  sh = sh < 0 ? 0 : sh > 31 ? 31 : sh;
  uint32_t sub = mfull >> sh;
  uint32_t mag = (er != 0) & (E >= emin) ? normal : sub;  // a float32 subnormal: element subnormal
  mag = r == 0 ? 0u : mag;
  uint32_t code = mag | (sign << (bits - 1));
  return r > 0x7F800000u ? nan_code : code;
}

// Int elements: |y| / 2^k, negated in two's complement, masked to `bits` (a NaN reads 0).
__attribute__((always_inline)) static inline uint32_t fk_code_int(uint32_t y, int k, int bits) {
  uint32_t r = y & 0x7FFFFFFFu;
  uint32_t sign = y >> 31;
  int er = static_cast<int>(r >> 23);
  int ee = er ? er : 1;
  uint32_t mfull = (r & 0x7FFFFFu) | (er ? 0x800000u : 0u);
  int sh = k + 150 - ee;
  sh = sh < 0 ? 0 : sh > 31 ? 31 : sh;
  uint32_t u = mfull >> sh;
  uint32_t v = sign ? 0u - u : u;
  v &= (1u << bits) - 1u;
  return r > 0x7F800000u ? 0u : v;
}

// Codes of n rounded values yb with grid exponent s - shift[j] (shift may be null).
template <bool FL>
static inline void fk_codes_t(const uint32_t* yb, const uint32_t* shift, int n, int s,
                              const FastFormat& ff, uint8_t* out) {
  const int mbits = ff.mbits, emin = ff.emin, bias = ff.ebias, bits = ff.code_bits;
  const uint32_t nc = ff.nan_code;
  if (shift) {
    for (int j = 0; j < n; ++j) {
      int sj = s - static_cast<int>(shift[j]);
      out[j] = static_cast<uint8_t>(FL ? fk_code_float(yb[j], sj, mbits, emin, bias, bits, nc)
                                       : fk_code_int(yb[j], sj, bits));
    }
  } else {
    for (int j = 0; j < n; ++j)
      out[j] = static_cast<uint8_t>(FL ? fk_code_float(yb[j], s, mbits, emin, bias, bits, nc)
                                       : fk_code_int(yb[j], s, bits));
  }
}

static inline void fk_codes(const uint32_t* yb, const uint32_t* shift, int n, int s,
                            const FastFormat& ff, uint8_t* out) {
  if (ff.is_float) {
    fk_codes_t<true>(yb, shift, n, s, ff, out);
  } else {
    fk_codes_t<false>(yb, shift, n, s, ff, out);
  }
}

// n codes of `bits` each into the LSB-first stream at byte `out` (byte aligned; a last partial
// byte is written whole, its high bits zero, as pack_bits does).
static inline void fk_pack(const uint8_t* c, int n, int bits, uint8_t* out) {
  if (bits == 8) {
    __builtin_memcpy(out, c, static_cast<size_t>(n));
    return;
  }
  if (bits == 4) {
    int k = 0;
    for (; k + 1 < n; k += 2)
      out[k >> 1] = static_cast<uint8_t>((c[k] & 0xFu) | ((c[k + 1] & 0xFu) << 4));
    if (k < n) out[k >> 1] = static_cast<uint8_t>(c[k] & 0xFu);
    return;
  }
  uint32_t m = (1u << bits) - 1u;
  uint64_t acc = 0;
  int nacc = 0;
  for (int j = 0; j < n; ++j) {
    acc |= static_cast<uint64_t>(c[j] & m) << nacc;
    nacc += bits;
    while (nacc >= 8) {
      *out++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      nacc -= 8;
    }
  }
  if (nacc > 0) *out = static_cast<uint8_t>(acc);
}

// Where one tile's results go: element r * C + c0 on, tile r * nC + c0 / Tc.
struct FkDst {
  float* y;          // values, or null
  uint8_t* codes;    // codes (one byte each), or null
  uint8_t* packed;   // the packed stream (codes null), or null
  int64_t o;         // the tile's first element
  uint8_t* scale;    // this tile's scale code, or null
  uint8_t* meta;     // this tile's first subtile's shift bit (one byte each), or null
  uint8_t* meta_bits = nullptr;  // or the byte of the 1-bit stream where its bits start
};

// n shift bits (one byte each, 0/1) into the 1-bit stream at dst (dst's first bit is the
// first; a last partial byte is written whole).
static inline void fk_meta_to_bits(const uint8_t* bytes, int n, uint8_t* dst) {
  for (int u = 0; u < n; u += 8) {
    uint32_t b = 0;
    for (int k = u; k < n && k < u + 8; ++k) b |= static_cast<uint32_t>(bytes[k] & 1) << (k - u);
    dst[u / 8] = static_cast<uint8_t>(b);
  }
}

static inline void fk_put_codes(const FastFormat& ff, const FkDst& d, const uint8_t* cb, int n) {
  if (d.codes) __builtin_memcpy(d.codes + d.o, cb, static_cast<size_t>(n));
  if (d.packed) fk_pack(cb, n, ff.code_bits, d.packed + (d.o * ff.code_bits) / 8);
}

// MX6/MX9: below[j] = 1 when every finite magnitude of j's subtile of S elements lies below
// thr = 2^floor(log2 amax) (that subtile takes one more bit). Padding past n is zero: below the
// threshold unless the tile is all zero. Subtiles of 2 in one pass GCC vectorizes.
template <int TC>
static inline void fk_below(const uint32_t* xb, int n, int S, uint32_t thr, uint32_t* below,
                            uint8_t* meta) {
  const int32_t th = static_cast<int32_t>(thr);
  if (TC > 0 && S == 2) {
    for (int p = 0; p < TC / 2; ++p) {
      int32_t b0 = static_cast<int32_t>(xb[2 * p] & 0x7FFFFFFFu);
      int32_t b1 = static_cast<int32_t>(xb[2 * p + 1] & 0x7FFFFFFFu);
      b0 = b0 < 0x7F800000 ? b0 : 0;
      b1 = b1 < 0x7F800000 ? b1 : 0;
      int32_t m = b0 > b1 ? b0 : b1;
      uint32_t all = m < th ? 1u : 0u;
      below[2 * p] = all;
      below[2 * p + 1] = all;
    }
    if (meta)
      for (int p = 0; p < TC / 2; ++p) meta[p] = static_cast<uint8_t>(below[2 * p]);
    return;
  }
  for (int j = 0; j < n; ++j) {
    int32_t b = static_cast<int32_t>(xb[j] & 0x7FFFFFFFu);
    int32_t fin = b < 0x7F800000 ? b : 0;
    below[j] = fin < th ? 1u : 0u;
  }
  for (int j = n; j < ((n + S - 1) / S) * S; ++j) below[j] = thr > 0 ? 1u : 0u;
  for (int j0 = 0; j0 < n; j0 += S) {
    uint32_t all = 1;
    for (int j = j0; j < j0 + S; ++j) all &= below[j];
    for (int j = j0; j < j0 + S && j < n; ++j) below[j] = all;
    if (meta) meta[j0 / S] = static_cast<uint8_t>(all);
  }
}

// Exponent-scaled tile of n (== TC when TC > 0) elements; returns false (nothing written) when
// the tile needs the general path. rne: fk_rne applies (round to nearest even, exact FPU).
template <int TC, bool CODES>
static inline bool fk_exp_tile(const FastFormat& ff, const float* x, const FkDst& d, int n,
                               bool rne) {
  if (TC > 0) n = TC;
  uint32_t xb[TC > 0 ? TC : 1024];
  __builtin_memcpy(xb, x, static_cast<size_t>(n) * 4);
  uint32_t amax;
  bool nan, nonfinite;
  fk_stats(xb, n, &amax, &nan, &nonfinite);
  FastTile t;
  if (!fk_exp_params(ff, amax, nan, nonfinite, &t)) return false;
  uint32_t yb[TC > 0 ? TC : 1024];
  uint8_t cb[TC > 0 ? TC : 1024];
  uint32_t below[TC > 0 ? TC : 1024];
  uint8_t mloc[TC > 0 ? TC : 1024];
  uint8_t* meta = CODES ? (d.meta ? d.meta : d.meta_bits ? mloc : nullptr) : nullptr;
  if (t.zero_tile) {
    // Every element is +-0: the result keeps the sign where the format has -0.
    uint32_t keep = ff.negzero ? 0x80000000u : 0u;
    for (int j = 0; j < n; ++j) yb[j] = xb[j] & keep;
    if (CODES) {
      int sb = ff.code_bits - 1;
      for (int j = 0; j < n; ++j) cb[j] = static_cast<uint8_t>((yb[j] >> 31) << sb);
      if (meta) __builtin_memset(meta, 0, static_cast<size_t>((n + ff.sub - 1) / ff.sub));
    }
  } else if (t.nan_tile) {
    if (ff.sub && meta) fk_below<TC>(xb, n, ff.sub, t.thr, below, meta);
    for (int j = 0; j < n; ++j) yb[j] = 0x7FC00000u;
    if (CODES) __builtin_memset(cb, 0, static_cast<size_t>(n));
  } else {
    const uint32_t* shift = nullptr;
    if (ff.sub) {
      fk_below<TC>(xb, n, ff.sub, t.thr, below, meta);
      shift = below;
    }
    if (rne) fk_rne_loop<TC>(xb, yb, shift, n, t, ff);
    else fk_loop<TC>(xb, yb, shift, n, t, ff);
    if (CODES) fk_codes(yb, shift, n, t.kint, ff, cb);
  }
  if (d.y) __builtin_memcpy(d.y + d.o, yb, static_cast<size_t>(n) * 4);
  if (CODES) {
    if (d.meta_bits && ff.sub) fk_meta_to_bits(mloc, (n + ff.sub - 1) / ff.sub, d.meta_bits);
    fk_put_codes(ff, d, cb, n);
    if (d.scale) *d.scale = static_cast<uint8_t>(t.nan_tile ? ff.scale_nan_code
                                                            : t.kint + ff.scale_code_add);
  }
  return true;
}

// -- explicit vectors (GCC vector extensions) for round to nearest even ----------------------
// Small tiles (8, 16) leave the auto-vectorizer too few iterations; these kernels do one tile
// as TC / L vectors of L lanes (L = 8, or 16 where kFkLanes says the target has 512-bit
// registers), each lowered to the target's registers (two SSE registers per 8 lanes on the
// baseline). Same arithmetic as fk_stats / fk_exp_params / fk_rne_elem / fk_code_*.
template <int L>
struct FkLanes;
template <>
struct FkLanes<8> {
  typedef int32_t vi __attribute__((vector_size(32)));
  typedef float vf __attribute__((vector_size(32)));
};
template <>
struct FkLanes<16> {
  typedef int32_t vi __attribute__((vector_size(64)));
  typedef float vf __attribute__((vector_size(64)));
};
#define FK_ALWAYS __attribute__((always_inline)) static inline

// Compile-time lane indices 0..L-1 (for __builtin_shufflevector index lists).
template <int... J>
struct FkSeq {};
template <int N, int... J>
struct FkSeqGen : FkSeqGen<N - 1, N - 1, J...> {};
template <int... J>
struct FkSeqGen<0, J...> {
  using type = FkSeq<J...>;
};
template <int N>
using FkSeqOf = typename FkSeqGen<N>::type;

template <int L>
FK_ALWAYS typename FkLanes<L>::vi fk_vload(const float* x) {
  typename FkLanes<L>::vi v;
  __builtin_memcpy(&v, x, 4 * L);
  return v;
}
template <class V>
FK_ALWAYS V fk_vmax(V a, V b) {
  return a > b ? a : b;
}
template <int L>
FK_ALWAYS int32_t fk_hmax(typename FkLanes<L>::vi v) {
  if constexpr (L == 16) {
    v = fk_vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5,
                                           6, 7));
    v = fk_vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9,
                                           10, 11));
    v = fk_vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15,
                                           12, 13));
    v = fk_vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12,
                                           15, 14));
  } else {
    v = fk_vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
    v = fk_vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
    v = fk_vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  }
  return v[0];
}
// Each lane's pair partner (lanes 2p and 2p + 1 swapped).
template <int L>
FK_ALWAYS typename FkLanes<L>::vi fk_pairswap(typename FkLanes<L>::vi v) {
  if constexpr (L == 16)
    return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  else
    return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
}

// fk_code_float / fk_code_int on L lanes (s: the grid exponent per lane).
template <int L>
FK_ALWAYS typename FkLanes<L>::vi fk_vcode(typename FkLanes<L>::vi y, typename FkLanes<L>::vi s,
                                           const FastFormat& ff) {
  typedef typename FkLanes<L>::vi V;
  const V r = y & 0x7FFFFFFF;
  const V neg = y < 0;
  const V er = r >> 23;
  const V ee = er != 0 ? er : 1;
  const V mfull = (r & 0x7FFFFF) | (er != 0 ? 0x800000 : 0);
  if (ff.is_float) {
    const int mbits = ff.mbits;
    const V E = ee - 127 - s;
    V normal = ((E + ff.ebias) << mbits) | ((r >> (23 - mbits)) & ((1 << mbits) - 1));
    V sh = 23 - mbits + ff.emin - E;
    sh = sh < 0 ? 0 : sh > 31 ? 31 : sh;
    V sub = mfull >> sh;
    V mag = (er != 0) & (E >= ff.emin) ? normal : sub;
    mag = r == 0 ? 0 : mag;
    V code = mag | (neg & (1 << (ff.code_bits - 1)));
    return r > 0x7F800000 ? static_cast<int32_t>(ff.nan_code) : code;
  }
  V sh = s + 150 - ee;
  sh = sh < 0 ? 0 : sh > 31 ? 31 : sh;
  V u = mfull >> sh;
  V v = neg ? -u : u;
  v &= (1 << ff.code_bits) - 1;
  return r > 0x7F800000 ? 0 : v;
}

// Stores the `bits` low bytes of w (a switch, so each copy has a constant size: a variable
// one is a call to memcpy).
FK_ALWAYS void fk_store_low(uint8_t* p, uint64_t w, int bits) {
  switch (bits) {
    case 1: __builtin_memcpy(p, &w, 1); break;
    case 2: __builtin_memcpy(p, &w, 2); break;
    case 3: __builtin_memcpy(p, &w, 3); break;
    case 4: __builtin_memcpy(p, &w, 4); break;
    case 5: __builtin_memcpy(p, &w, 5); break;
    case 6: __builtin_memcpy(p, &w, 6); break;
    case 7: __builtin_memcpy(p, &w, 7); break;
    default: __builtin_memcpy(p, &w, 8); break;
  }
}

// Vectors of any lane type and count, and the even / odd lanes of one (N lanes -> N / 2).
template <class T, int N>
struct FkVec {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <class V, int... J>
FK_ALWAYS auto fk_evens(V v, FkSeq<J...>) {
  return __builtin_shufflevector(v, v, (2 * J)...);
}
template <class V, int... J>
FK_ALWAYS auto fk_odds(V v, FkSeq<J...>) {
  return __builtin_shufflevector(v, v, (2 * J + 1)...);
}

// L codes of `bits` (<= 8) each: one per byte into codes, and/or L * bits / 8 bytes of the
// LSB-first stream into packed. Packing joins neighbour lanes in a tree (pairs, fours,
// eights): every 8 codes end on a byte, one little-endian word each.
template <int L>
FK_ALWAYS void fk_vput(typename FkLanes<L>::vi c, int bits, uint8_t* codes, uint8_t* packed) {
  typedef typename FkVec<uint8_t, L>::type VB;
  typedef typename FkVec<uint32_t, L>::type VU;
  if (codes || (packed && bits == 8)) {
    VB bytes = __builtin_convertvector(c, VB);
    if (codes) __builtin_memcpy(codes, &bytes, L);
    if (packed && bits == 8) __builtin_memcpy(packed, &bytes, L);
  }
  if (!packed || bits == 8) return;
  const VU u = (VU)c & ((1u << bits) - 1u);
  if (bits == 4) {
    auto e = fk_evens(u, FkSeqOf<L / 2>{});
    auto o = fk_odds(u, FkSeqOf<L / 2>{});
    typedef typename FkVec<uint8_t, L / 2>::type VH;
    VH bytes = __builtin_convertvector(e | (o << 4), VH);
    __builtin_memcpy(packed, &bytes, L / 2);
    return;
  }
  if constexpr (kFkBmi2) {
    // Eight codes as eight bytes, their low `bits` bits gathered by one parallel bit extract.
    typedef typename FkVec<uint8_t, L>::type VB8;
    VB8 bytes = __builtin_convertvector(u, VB8);
    uint64_t words[L / 8];
    __builtin_memcpy(words, &bytes, L);
    const uint64_t sel = 0x0101010101010101ull * ((1u << bits) - 1u);
    for (int h = 0; h < L / 8; ++h)
      fk_store_low(packed + bits * h, __builtin_ia32_pext_di(words[h], sel), bits);
    return;
  }
  // Pairs and fours fit 32-bit lanes (4 * bits <= 32); eights take 64.
  auto p = fk_evens(u, FkSeqOf<L / 2>{}) | (fk_odds(u, FkSeqOf<L / 2>{}) << bits);
  auto q = fk_evens(p, FkSeqOf<L / 4>{}) | (fk_odds(p, FkSeqOf<L / 4>{}) << (2 * bits));
  if constexpr (L == 8) {
    fk_store_low(packed, q[0] | (static_cast<uint64_t>(q[1]) << (4 * bits)), bits);
  } else {
    typedef typename FkVec<uint64_t, L / 8>::type W8;
    W8 w = __builtin_convertvector(fk_evens(q, FkSeqOf<L / 8>{}), W8) |
           (__builtin_convertvector(fk_odds(q, FkSeqOf<L / 8>{}), W8) << (4 * bits));
    for (int h = 0; h < L / 8; ++h) fk_store_low(packed + bits * h, w[h], bits);
  }
}

// a + b in every lane, wrapping like the hardware instead of signed overflow (a NaN's payload).
template <typename V>
FK_ALWAYS V fk_wrap_add(V a, V b) {
  typedef uint32_t U __attribute__((vector_size(sizeof(V))));
  return (V)((U)a + (U)b);
}

// One vector of fk_rne_elem: sh23 = the subtile shift << 23 per lane (or zero).
template <bool FL, int L>
FK_ALWAYS typename FkLanes<L>::vi fk_vrne(typename FkLanes<L>::vi xb, typename FkLanes<L>::vi sh23,
                                          const FastTile& t, int d, bool negzero) {
  typedef typename FkLanes<L>::vi V;
  typedef typename FkLanes<L>::vf F;
  const V b = xb & 0x7FFFFFFF;
  const V neg = xb < 0;
  const V magic = static_cast<int32_t>(t.magic) - sh23;
  F fr = ((F)b + (F)magic) - (F)magic;
  V r = (V)fr;
  if (FL) {
    const int32_t half_m1 = (1 << (d - 1)) - 1, keep = ~((1 << d) - 1);
    V rn = fk_wrap_add(b, half_m1 + ((b >> d) & 1)) & keep;  // NaN payloads wrap
    r = b >= static_cast<int32_t>(t.norm_thr) ? rn : r;
  }
  V top = neg ? static_cast<int32_t>(t.top_neg) : static_cast<int32_t>(t.top_pos);
  top -= sh23;
  V mag = r < top ? r : top;
  V out = mag | (xb & static_cast<int32_t>(0x80000000u));
  if (!negzero) out = mag == 0 ? 0 : out;
  return b > 0x7F800000 ? static_cast<int32_t>(0x7FC00000) : out;
}

// MX6/MX9 shift bits, one byte per pair of lanes (each pair's lanes hold the same 0/1).
template <int L, int NV>
FK_ALWAYS void fk_put_meta(const typename FkLanes<L>::vi* sh, uint8_t* meta) {
  typedef typename FkVec<uint8_t, L / 2>::type VH;
  for (int v = 0; v < NV; ++v) {
    VH bytes = __builtin_convertvector(fk_evens(sh[v], FkSeqOf<L / 2>{}), VH);
    __builtin_memcpy(meta + (L / 2) * v, &bytes, L / 2);
  }
}
// The same as bits: NV * L / 2 shift bits (a whole number of bytes) from meta_bits on.
template <int L, int NV>
FK_ALWAYS void fk_put_meta_bits(const typename FkLanes<L>::vi* sh, uint8_t* meta_bits) {
  static_assert(NV * L / 2 <= 64 && (NV * L / 2) % 8 == 0, "whole bytes of one word");
  uint64_t bits = 0;
  if constexpr (kFkBmi2 && L == 16) {  // one byte per pair, the low bits gathered at once
    typedef typename FkVec<uint8_t, 8>::type VB8;
    for (int v = 0; v < NV; ++v) {
      VB8 b = __builtin_convertvector(fk_evens(sh[v], FkSeqOf<8>{}), VB8);
      uint64_t w;
      __builtin_memcpy(&w, &b, 8);
      bits |= __builtin_ia32_pext_di(w, 0x0101010101010101ull) << (8 * v);
    }
  } else {
    for (int v = 0; v < NV; ++v)
      for (int p = 0; p < L / 2; ++p)
        bits |= static_cast<uint64_t>(sh[v][2 * p] & 1) << ((L / 2) * v + p);
  }
  __builtin_memcpy(meta_bits, &bits, NV * L / 16);
}

// fk_vrne and the element codes of the same lanes in one pass (fk_vcode's results): the
// code magnitude is read off the rounding itself. For a grid 2^k, |x| + 2^(k + 23) holds
// |x| / 2^k rounded in its low mantissa bits (the int code, or a float element's subnormal
// code); a float element's normal code is the rounded bits shifted down by d = 23 - mbits,
// less the float32 exponent offset of the tile, (127 + s - bias) << mbits (s = kint). Codes
// clamp at the code of maxfloat (cmax_pos / cmax_neg) as values clamp at top.
template <bool FL, int L>
FK_ALWAYS void fk_vrne_code(typename FkLanes<L>::vi xb, typename FkLanes<L>::vi sh23,
                            const FastTile& t, const FastFormat& ff, int d,
                            typename FkLanes<L>::vi* y, typename FkLanes<L>::vi* code) {
  typedef typename FkLanes<L>::vi V;
  typedef typename FkLanes<L>::vf F;
  const V b = xb & 0x7FFFFFFF;
  const V neg = xb < 0;
  const V magic = static_cast<int32_t>(t.magic) - sh23;
  const F sum = (F)b + (F)magic;
  V r = (V)(sum - (F)magic);
  V cm = (V)sum - magic;
  if (FL) {
    const int32_t half_m1 = (1 << (d - 1)) - 1, keep = ~((1 << d) - 1);
    const V rn = fk_wrap_add(b, half_m1 + ((b >> d) & 1)) & keep;  // NaN payloads wrap
    const V is_norm = b >= static_cast<int32_t>(t.norm_thr);
    r = is_norm ? rn : r;
    const int32_t base = (127 + t.kint - ff.ebias) << ff.mbits;
    cm = is_norm ? (rn >> d) - base : cm;
  }
  V top = neg ? static_cast<int32_t>(t.top_neg) : static_cast<int32_t>(t.top_pos);
  top -= sh23;
  const V mag = r < top ? r : top;
  V out = mag | (xb & static_cast<int32_t>(0x80000000u));
  if (!ff.negzero) out = mag == 0 ? 0 : out;
  const V isnan = b > 0x7F800000;
  *y = isnan ? static_cast<int32_t>(0x7FC00000) : out;
  const V cmax = neg ? ff.cmax_neg : ff.cmax_pos;
  const V cmag = cm < cmax ? cm : cmax;
  const V ysign = out < 0;
  if (FL) {
    V c = cmag | (ysign & (1 << (ff.code_bits - 1)));
    *code = isnan ? static_cast<int32_t>(ff.nan_code) : c;
  } else {
    V c = (ysign ? -cmag : cmag) & ((1 << ff.code_bits) - 1);
    *code = isnan ? 0 : c;
  }
}

// A tile's statistics (fk_stats on vectors): the largest finite magnitude and the largest
// magnitude of all (> 0x7F800000: a NaN, >= : a NaN or an Inf), as float32 bits.
template <int TC, int L>
FK_ALWAYS void fk_vstats(const float* x, int32_t* amax, int32_t* all) {
  typedef typename FkLanes<L>::vi V;
  V mf = {}, ma = {};
  for (int v = 0; v < TC / L; ++v) {
    V b = fk_vload<L>(x + L * v) & 0x7FFFFFFF;
    mf = fk_vmax(mf, b < 0x7F800000 ? b : 0);
    ma = fk_vmax(ma, b);
  }
  *amax = fk_hmax<L>(mf);
  *all = fk_hmax<L>(ma);
}

// Writes one exponent-scaled tile of TC (a multiple of L) elements whose parameters t are
// known (fk_exp_params): values, codes, shift bits and the scale code.
template <int TC, bool CODES, int L>
FK_ALWAYS void fk_vexp_emit(const FastFormat& ff, const float* x, const FkDst& d,
                            const FastTile& t) {
  typedef typename FkLanes<L>::vi V;
  constexpr int NV = TC / L;
  V xv[NV];
  for (int v = 0; v < NV; ++v) xv[v] = fk_vload<L>(x + L * v);
  V sh[NV];
  const int32_t thr = static_cast<int32_t>(t.thr);
  for (int v = 0; v < NV; ++v) {
    sh[v] = V{};
    if (ff.sub == 2) {  // MX6/MX9: a pair below 2^floor(log2 amax) takes one more bit
      V b = xv[v] & 0x7FFFFFFF;
      b = b < 0x7F800000 ? b : 0;
      V m = fk_vmax(b, fk_pairswap<L>(b));
      sh[v] = (m < thr) & 1;
    }
  }
  V yv[NV];
  if (t.zero_tile) {
    const int32_t keep = ff.negzero ? static_cast<int32_t>(0x80000000u) : 0;
    for (int v = 0; v < NV; ++v) {
      yv[v] = xv[v] & keep;
      sh[v] = V{};
    }
  } else if (t.nan_tile) {
    for (int v = 0; v < NV; ++v) yv[v] = V{} + static_cast<int32_t>(0x7FC00000);
  } else if (CODES && ff.code_direct) {
    const int bits = ff.code_bits;
    uint8_t* packed = d.packed ? d.packed + (d.o * bits) / 8 : nullptr;
    uint8_t* codes = d.codes ? d.codes + d.o : nullptr;
    const int dd = 23 - ff.mbits;
    for (int v = 0; v < NV; ++v) {
      V c;
      if (ff.is_float)
        fk_vrne_code<true, L>(xv[v], sh[v] << 23, t, ff, dd, &yv[v], &c);
      else
        fk_vrne_code<false, L>(xv[v], sh[v] << 23, t, ff, 0, &yv[v], &c);
      if (d.y) __builtin_memcpy(d.y + d.o + L * v, &yv[v], 4 * L);
      fk_vput<L>(c, bits, codes ? codes + L * v : nullptr,
                 packed ? packed + (bits * L / 8) * v : nullptr);
    }
    if (d.meta && ff.sub == 2) fk_put_meta<L, NV>(sh, d.meta);
    if constexpr ((NV * L / 2) % 8 == 0 && NV * L / 2 <= 64)
      if (d.meta_bits && ff.sub == 2) fk_put_meta_bits<L, NV>(sh, d.meta_bits);
    if (d.scale) *d.scale = static_cast<uint8_t>(t.kint + ff.scale_code_add);
    return;
  } else {
    const int dd = 23 - ff.mbits;
    for (int v = 0; v < NV; ++v)
      yv[v] = ff.is_float ? fk_vrne<true, L>(xv[v], sh[v] << 23, t, dd, ff.negzero)
                          : fk_vrne<false, L>(xv[v], sh[v] << 23, t, 0, ff.negzero);
  }
  // Vector by vector: one wide copy of the whole array would read back across several
  // narrower stores (a store-forwarding stall).
  if (d.y)
    for (int v = 0; v < NV; ++v) __builtin_memcpy(d.y + d.o + L * v, &yv[v], 4 * L);
  if (CODES) {
    const int bits = ff.code_bits;
    uint8_t* packed = d.packed ? d.packed + (d.o * bits) / 8 : nullptr;
    uint8_t* codes = d.codes ? d.codes + d.o : nullptr;
    for (int v = 0; v < NV; ++v) {
      V c;
      if (t.zero_tile) {
        c = ((yv[v] >> 31) & 1) << (bits - 1);
      } else if (t.nan_tile) {
        c = V{};
      } else {
        c = fk_vcode<L>(yv[v], t.kint - sh[v], ff);
      }
      fk_vput<L>(c, bits, codes ? codes + L * v : nullptr,
                 packed ? packed + (bits * L / 8) * v : nullptr);
    }
    if (d.meta && ff.sub == 2) fk_put_meta<L, NV>(sh, d.meta);
    if constexpr ((NV * L / 2) % 8 == 0 && NV * L / 2 <= 64)
      if (d.meta_bits && ff.sub == 2) fk_put_meta_bits<L, NV>(sh, d.meta_bits);
    if (d.scale) *d.scale = static_cast<uint8_t>(t.nan_tile ? ff.scale_nan_code
                                                            : t.kint + ff.scale_code_add);
  }
}

// Exponent-scaled tile of TC (a multiple of L) elements by fk_vrne; false: general path.
template <int TC, bool CODES, int L>
FK_ALWAYS bool fk_vexp_tile(const FastFormat& ff, const float* x, const FkDst& d) {
  int32_t amax, all;
  fk_vstats<TC, L>(x, &amax, &all);
  FastTile t;
  if (!fk_exp_params(ff, static_cast<uint32_t>(amax), all > 0x7F800000, all >= 0x7F800000,
                     &t))
    return false;
  fk_vexp_emit<TC, CODES, L>(ff, x, d, t);
  return true;
}

// -- L tiles at once: statistics transposed into one vector, parameters in vector arithmetic --
// Lane j of the shuffle that halves blocks of W partial maxima (fk_treduce): the low (HI
// false) or high halves of each block of a (output lanes < L/2) then of b.
constexpr int fk_half_src(int L, int W, bool hi, int j) {
  int half = W / 2, jj = j % (L / 2);
  return (j >= L / 2 ? L : 0) + (jj / half) * W + jj % half + (hi ? half : 0);
}
template <int L, int W, bool HI, class V, int... J>
FK_ALWAYS V fk_half_pick(V a, V b, FkSeq<J...>) {
  return __builtin_shufflevector(a, b, fk_half_src(L, W, HI, J)...);
}
// m[0..n): n vectors, each lane a partial maximum; blocks of W lanes belong to one tile, tiles in
// order. Afterwards m[0] lane i is the maximum of tile i (n * L / W tiles = L).
template <int L, int W, class V>
FK_ALWAYS void fk_treduce(V* m, int n) {
  for (int k = 0; k < n / 2; ++k)
    m[k] = fk_vmax(fk_half_pick<L, W, false>(m[2 * k], m[2 * k + 1], FkSeqOf<L>{}),
                   fk_half_pick<L, W, true>(m[2 * k], m[2 * k + 1], FkSeqOf<L>{}));
  if constexpr (W > 2) fk_treduce<L, W / 2>(m, n / 2);
}

// fk_vstats of L consecutive tiles at once: lane i of M and A holds tile i's.
template <int TC, int L>
FK_ALWAYS void fk_vgroup_stats(const float* x, typename FkLanes<L>::vi* M,
                               typename FkLanes<L>::vi* A) {
  typedef typename FkLanes<L>::vi V;
  V mf[L], ma[L];
  for (int i = 0; i < L; ++i) {
    mf[i] = V{};
    ma[i] = V{};
    for (int v = 0; v < TC / L; ++v) {
      V b = fk_vload<L>(x + TC * i + L * v) & 0x7FFFFFFF;
      mf[i] = fk_vmax(mf[i], b < 0x7F800000 ? b : 0);
      ma[i] = fk_vmax(ma[i], b);
    }
  }
  // The next groups' lines, ahead of the hardware prefetcher (row ends included: it may
  // touch past them, prefetches do not fault).
  for (int k = 0; k < TC * L; k += 16) __builtin_prefetch(x + 2 * TC * L + k);
  fk_treduce<L, L>(mf, L);
  fk_treduce<L, L>(ma, L);
  *M = mf[0];
  *A = ma[0];
}

// L consecutive tiles of TC elements from x (tile i at x + i * TC, destinations from d with
// d.o, d.scale and d.meta those of tile 0). Returns a bit mask of the tiles left undone (their
// parameters need fk_exp_params' special cases or the general path).
template <int TC, bool CODES, int L>
FK_ALWAYS uint32_t fk_vexp_group(const FastFormat& ff, const float* x, const FkDst& d) {
  typedef typename FkLanes<L>::vi V;
  V M, A;
  fk_vgroup_stats<TC, L>(x, &M, &A);
  // fk_exp_params for normal amax and no NaN/Inf in the tile; every other tile is left undone.
  V ok = (M >= 0x800000) & (A < 0x7F800000);
  const V e = (M >> 23) - 127;
  V bump = ff.is_float ? ((M & 0x7FFFFF) >= static_cast<int32_t>(ff.bump_ge)) & 1 : V{};
  V st = e + bump - ff.emax + ff.frac;
  st = st < ff.low ? ff.low : st;
  st = st > ff.high ? ff.high : st;
  const V sx = st - ff.frac;
  const V kmin = sx + (ff.emin - ff.mbits);
  const int room = ff.sub ? 1 : 0;
  ok &= (sx <= 128) & (kmin <= 128);
  if (ff.is_float) ok &= kmin >= -126 - ff.mbits;
  const V ftop = sx + ff.top_field;
  ok &= (ftop - room >= 1) & (ftop <= 254);
  V top_pos = (ftop << 23) | static_cast<int32_t>(ff.top_mant), top_neg = top_pos;
  if (ff.full_int_range && !ff.is_float) {
    const V fneg = sx + ff.neg_field;
    ok &= (fneg - room >= 1) & (fneg <= 254);
    top_neg = fneg << 23;
  }
  // Top values past the data type's largest finite value: left to the general path.
  ok &= (top_pos <= static_cast<int32_t>(ff.finite_top)) &
        (top_neg <= static_cast<int32_t>(ff.finite_top));
  const V fm = kmin + 150, fn = kmin + (ff.mbits + 127);
  ok &= (fm - room >= 1) & (fm <= 254);
  if (ff.is_float) ok &= (fn >= 1) & (fn <= 254);
  int32_t okl[L], sl[L], tpl[L], tnl[L], mgl[L], nml[L], thl[L];
  __builtin_memcpy(okl, &ok, 4 * L);
  __builtin_memcpy(sl, &sx, 4 * L);
  __builtin_memcpy(tpl, &top_pos, 4 * L);
  __builtin_memcpy(tnl, &top_neg, 4 * L);
  V mg = fm << 23, nm = fn << 23, th = M & 0x7F800000;
  __builtin_memcpy(mgl, &mg, 4 * L);
  __builtin_memcpy(nml, &nm, 4 * L);
  __builtin_memcpy(thl, &th, 4 * L);
  uint32_t undone = 0;
  for (int i = 0; i < L; ++i) {
    if (!okl[i]) {
      undone |= 1u << i;
      continue;
    }
    FastTile t;
    t.kint = sl[i];
    t.kmin = sl[i] + ff.emin - ff.mbits;
    t.top_pos = static_cast<uint32_t>(tpl[i]);
    t.top_neg = static_cast<uint32_t>(tnl[i]);
    t.magic = static_cast<uint32_t>(mgl[i]);
    t.norm_thr = ff.is_float ? static_cast<uint32_t>(nml[i]) : 0u;
    t.thr = static_cast<uint32_t>(thl[i]);
    FkDst di = d;
    di.o = d.o + TC * i;
    if (CODES) {
      if (d.scale) di.scale = d.scale + i;
      if (d.meta) di.meta = d.meta + (TC / 2) * i;
      if (d.meta_bits) di.meta_bits = d.meta_bits + (TC / 16) * i;
    }
    fk_vexp_emit<TC, CODES, L>(ff, x + TC * i, di, t);
  }
  return undone;
}

// Writes one float-scaled tile of TC (a multiple of L) elements whose tile t (ff.ftile with
// nan_tile, sc and eff) is known.
template <int TC, bool CODES, int L>
FK_ALWAYS void fk_vfloat_emit(const FastFormat& ff, const float* x, const FkDst& d,
                              const FastTile& t) {
  typedef typename FkLanes<L>::vi V;
  typedef typename FkLanes<L>::vf F;
  constexpr int NV = TC / L;
  if (CODES && d.scale) {
    *d.scale = static_cast<uint8_t>(
        t.nan_tile ? ff.scale_nan_code
                   : fk_code_float(fbits(t.sc), 0, ff.scale_mbits, ff.scale_emin,
                                   ff.scale_bias, ff.scale_bits, ff.scale_nan_code));
  }
  V rv[NV], cv[NV];
  const float eff = t.eff;
  const int dd = 23 - ff.mbits;
  for (int v = 0; v < NV; ++v) {
    V xi = fk_vload<L>(x + L * v);
    F xf = (F)xi;
    // eff > 0: x / eff; else x where NaN, 0 elsewhere (the reference's where(scale > 0, ...))
    F q = eff > 0.0f ? xf / eff : (F)(xf != xf ? xi : V{});
    if (CODES && ff.code_direct && !t.nan_tile) {
      V c;
      if (ff.is_float)
        fk_vrne_code<true, L>((V)q, V{}, t, ff, dd, &rv[v], &c);
      else
        fk_vrne_code<false, L>((V)q, V{}, t, ff, 0, &rv[v], &c);
      cv[v] = c;
      continue;
    }
    rv[v] = ff.is_float ? fk_vrne<true, L>((V)q, V{}, t, dd, ff.negzero)
                        : fk_vrne<false, L>((V)q, V{}, t, 0, ff.negzero);
    if (t.nan_tile) rv[v] = V{} + static_cast<int32_t>(0x7FC00000);
    if (CODES) cv[v] = t.nan_tile ? V{} : fk_vcode<L>(rv[v], V{}, ff);
  }
  if (d.y) {
    for (int v = 0; v < NV; ++v) {
      F y = (F)rv[v] * eff;
      V yi = y != y ? V{} + static_cast<int32_t>(0x7FC00000) : (V)y;
      __builtin_memcpy(d.y + d.o + L * v, &yi, 4 * L);
    }
  }
  if (CODES) {
    const int bits = ff.code_bits;
    uint8_t* packed = d.packed ? d.packed + (d.o * bits) / 8 : nullptr;
    uint8_t* codes = d.codes ? d.codes + d.o : nullptr;
    for (int v = 0; v < NV; ++v)
      fk_vput<L>(cv[v], bits, codes ? codes + L * v : nullptr,
                 packed ? packed + (bits * L / 8) * v : nullptr);
  }
}

// Whether no element of a float-scaled tile can decode past the data type's range (else the
// general path bounds the clamp; fast_tile's check).
static inline bool fk_float_fits(const FastFormat& ff, const FastTile& t) {
  double top = static_cast<double>(ff.maxfloat_f) + (ff.full_int_range ? 1.0 : 0.0);
  return t.nan_tile || top * static_cast<double>(t.eff) < ff.prod_limit;
}

// Float-scaled tile of TC (a multiple of L) elements by fk_vrne (fk_float_tile's arithmetic).
template <int TC, bool CODES, int L>
FK_ALWAYS bool fk_vfloat_tile(const FastFormat& ff, const float* x, const FkDst& d) {
  int32_t amax, all;
  fk_vstats<TC, L>(x, &amax, &all);
  // fast_tile's float-scale branch, inline: the scale cast by fk_rne_elem when it applies.
  FastTile t = ff.ftile;
  t.nan_tile = ff.policy == 1 ? all >= 0x7F800000 : (ff.nan_on_nan && all > 0x7F800000);
  float raw = from_fbits(static_cast<uint32_t>(amax)) / ff.maxfloat_f;
  if (ff.has_ts) raw = ff.ts > 0 ? raw / ff.ts : 0.0f;
  uint32_t scb = ff.stile_rne ? fk_rne_elem<true, false>(fbits(raw), 0u, ff.stile,
                                                         23 - ff.scale_mbits, ff.scale_negzero)
                              : fast_scale_cast(ff, fbits(raw));
  t.sc = from_fbits(scb);
  t.eff = ff.has_ts ? t.sc * ff.ts : t.sc;
  if (!fk_float_fits(ff, t)) return false;
  fk_vfloat_emit<TC, CODES, L>(ff, x, d, t);
  return true;
}

// L consecutive float-scaled tiles (fk_vexp_group's layout): the scale of every tile in vector
// arithmetic (needs ff.stile_rne); returns the mask of tiles left undone (fk_float_fits).
template <int TC, bool CODES, int L>
FK_ALWAYS uint32_t fk_vfloat_group(const FastFormat& ff, const float* x, const FkDst& d) {
  typedef typename FkLanes<L>::vi V;
  typedef typename FkLanes<L>::vf F;
  V M, A;
  fk_vgroup_stats<TC, L>(x, &M, &A);
  const V nan_tile = ff.policy == 1 ? A >= 0x7F800000 : (ff.nan_on_nan ? A > 0x7F800000 : V{});
  F raw = (F)M / ff.maxfloat_f;
  if (ff.has_ts) raw = ff.ts > 0 ? raw / ff.ts : F{};
  const F sc = (F)fk_vrne<true, L>((V)raw, V{}, ff.stile, 23 - ff.scale_mbits,
                                   ff.scale_negzero);
  const F eff = ff.has_ts ? sc * ff.ts : sc;
  float scl[L], effl[L];
  int32_t nanl[L];
  __builtin_memcpy(scl, &sc, 4 * L);
  __builtin_memcpy(effl, &eff, 4 * L);
  __builtin_memcpy(nanl, &nan_tile, 4 * L);
  uint32_t undone = 0;
  for (int i = 0; i < L; ++i) {
    FastTile t = ff.ftile;
    t.nan_tile = nanl[i] != 0;
    t.sc = scl[i];
    t.eff = effl[i];
    if (!fk_float_fits(ff, t)) {
      undone |= 1u << i;
      continue;
    }
    FkDst di = d;
    di.o = d.o + TC * i;
    if (CODES && d.scale) di.scale = d.scale + i;
    fk_vfloat_emit<TC, CODES, L>(ff, x + TC * i, di, t);
  }
  return undone;
}

// Float-scaled tile (NVFP4 and friends): v = x / eff in float32, rounded on the element grid,
// times eff in float32 - the reference's operations, in its order.
template <int TC, bool CODES>
static inline bool fk_float_tile(const FastFormat& ff, const float* x, const FkDst& d, int n,
                                 bool rne) {
  if (TC > 0) n = TC;
  uint32_t xb[TC > 0 ? TC : 1024];
  __builtin_memcpy(xb, x, static_cast<size_t>(n) * 4);
  uint32_t amax;
  bool nan, nonfinite;
  fk_stats(xb, n, &amax, &nan, &nonfinite);
  FastTile t;
  if (!fast_tile(ff, amax, nan, nonfinite, &t)) return false;
  if (CODES && d.scale) {
    *d.scale = static_cast<uint8_t>(
        t.nan_tile ? ff.scale_nan_code
                   : fk_code_float(fbits(t.sc), 0, ff.scale_mbits, ff.scale_emin,
                                   ff.scale_bias, ff.scale_bits, ff.scale_nan_code));
  }
  if (t.nan_tile) {
    if (d.y) {
      for (int j = 0; j < n; ++j) {
        uint32_t q = 0x7FC00000u;
        __builtin_memcpy(d.y + d.o + j, &q, 4);
      }
    }
    if (CODES) {
      uint8_t cb[TC > 0 ? TC : 1024];
      __builtin_memset(cb, 0, static_cast<size_t>(n));
      fk_put_codes(ff, d, cb, n);
    }
    return true;
  }
  float eff = t.eff;
  bool pos = eff > 0.0f;
  float v[TC > 0 ? TC : 1024];
  for (int j = 0; j < n; ++j) v[j] = pos ? x[j] / eff : x[j] != x[j] ? x[j] : 0.0f;
  uint32_t vb[TC > 0 ? TC : 1024];
  __builtin_memcpy(vb, v, static_cast<size_t>(n) * 4);
  if (rne) fk_rne_loop<TC>(vb, vb, nullptr, n, t, ff);
  else fk_loop<TC>(vb, vb, nullptr, n, t, ff);
  if (CODES) {
    uint8_t cb[TC > 0 ? TC : 1024];
    fk_codes(vb, nullptr, n, 0, ff, cb);
    fk_put_codes(ff, d, cb, n);
  }
  if (d.y) {
    __builtin_memcpy(v, vb, static_cast<size_t>(n) * 4);
    float* y = d.y + d.o;
    for (int j = 0; j < n; ++j) {
      float yy = v[j] * eff;
      y[j] = yy != yy ? __builtin_nanf("") : yy;
    }
  }
  return true;
}

template <int TC, bool CODES>
__attribute__((always_inline)) static inline bool fk_tile(const FastFormat& ff, const float* x, const FkDst& d, int n, bool rne) {
  // Vector tiles: 16 lanes where the target has them and the tile is a multiple of 16.
  constexpr int L = kFkLanes == 16 && TC % 16 == 0 ? 16 : 8;
  if (TC > 0 && TC % 8 == 0 && TC <= 64 && rne && !ff.float_scale && (ff.sub == 0 || ff.sub == 2))
    return fk_vexp_tile<(TC > 0 ? TC : 8), CODES, L>(ff, x, d);
  if (TC > 0 && TC % 8 == 0 && TC <= 64 && rne && ff.float_scale)
    return fk_vfloat_tile<(TC > 0 ? TC : 8), CODES, L>(ff, x, d);
  return ff.float_scale ? fk_float_tile<TC, CODES>(ff, x, d, n, rne)
                        : fk_exp_tile<TC, CODES>(ff, x, d, n, rne);
}

// Rows [r0, r1) of a (rows, C) float32 tensor, tiles of ff.tc along each row. Tiles the fast
// path refuses are handed to `slow(row, c0)`.
template <int TC, bool CODES>
static void fk_rows_t(const FastFormat& ff, const float* x, const FastOut& out, int64_t r0,
                      int64_t r1, int64_t C, void (*slow)(void*, int64_t, int64_t),
                      void* slow_ctx) {
  int tc = TC > 0 ? TC : ff.tc;
  const int64_t nC = out.nC, sub_cols = out.sub_cols;
  const int S = ff.sub;
  const bool rne = ff.rm == 0 && ff.rne_add && fk_fpu_exact();
  // Groups of tiles (fk_vexp_group): exponent scales, tiles of 8..64 that fill whole vectors.
  constexpr int kGroupLanes = kFkLanes == 16 && TC % 16 == 0 ? 16 : 8;
  constexpr int kGroup = TC > 0 && TC % 8 == 0 && TC <= 64 ? kGroupLanes : 0;
  const bool group = rne && (ff.float_scale ? ff.stile_rne : ff.sub == 0 || ff.sub == 2);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    int64_t c0 = 0;
    FkDst d{out.y, out.codes, out.packed, r * C, nullptr, nullptr};
    for (; c0 + tc <= C; c0 += tc) {
      d.o = r * C + c0;
      if (CODES) {
        d.scale = out.scale ? out.scale + r * nC + c0 / tc : nullptr;
        d.meta = out.meta && S ? out.meta + r * sub_cols + c0 / S : nullptr;
        d.meta_bits = out.meta_bits && S ? out.meta_bits + (r * sub_cols + c0 / S) / 8 : nullptr;
      }
      if (kGroup && group && c0 + kGroup * tc <= C) {  // kGroup tiles at once
        uint32_t undone =
            ff.float_scale ? fk_vfloat_group<(TC > 0 ? TC : 8), CODES, kGroupLanes>(ff, xr + c0, d)
                           : fk_vexp_group<(TC > 0 ? TC : 8), CODES, kGroupLanes>(ff, xr + c0, d);
        for (int i = 0; undone; ++i, undone >>= 1) {
          if (!(undone & 1)) continue;
          int64_t ci = c0 + static_cast<int64_t>(i) * tc;
          FkDst di = d;
          di.o = r * C + ci;
          if (CODES) {
            di.scale = out.scale ? out.scale + r * nC + ci / tc : nullptr;
            di.meta = out.meta && S ? out.meta + r * sub_cols + ci / S : nullptr;
            di.meta_bits =
                out.meta_bits && S ? out.meta_bits + (r * sub_cols + ci / S) / 8 : nullptr;
          }
          if (!fk_tile<TC, CODES>(ff, xr + ci, di, tc, rne)) slow(slow_ctx, r, ci);
        }
        c0 += (kGroup - 1) * tc;
        continue;
      }
      if (!fk_tile<TC, CODES>(ff, xr + c0, d, tc, rne)) slow(slow_ctx, r, c0);
    }
    if (c0 < C) {
      int n = static_cast<int>(C - c0);
      d.o = r * C + c0;
      if (CODES) {
        d.scale = out.scale ? out.scale + r * nC + c0 / tc : nullptr;
        d.meta = out.meta && S ? out.meta + r * sub_cols + c0 / S : nullptr;
        d.meta_bits = out.meta_bits && S ? out.meta_bits + (r * sub_cols + c0 / S) / 8 : nullptr;
      }
      // The tail tile: zero padding does not change the statistics, so it is a shorter tile.
      if (!fk_tile<0, CODES>(ff, xr + c0, d, n, rne)) slow(slow_ctx, r, c0);
    }
  }
}

template <bool CODES>
static void fk_rows_c(const FastFormat& ff, const float* x, const FastOut& out, int64_t r0,
                      int64_t r1, int64_t C, void (*slow)(void*, int64_t, int64_t),
                      void* slow_ctx) {
  switch (ff.tc) {
    case 8: fk_rows_t<8, CODES>(ff, x, out, r0, r1, C, slow, slow_ctx); break;
    case 16: fk_rows_t<16, CODES>(ff, x, out, r0, r1, C, slow, slow_ctx); break;
    case 32: fk_rows_t<32, CODES>(ff, x, out, r0, r1, C, slow, slow_ctx); break;
    default: fk_rows_t<0, CODES>(ff, x, out, r0, r1, C, slow, slow_ctx); break;
  }
}

static void fk_rows(const FastFormat& ff, const float* x, const FastOut& out, int64_t r0,
                    int64_t r1, int64_t C, void (*slow)(void*, int64_t, int64_t), void* slow_ctx) {
  if (out.codes || out.packed || out.scale || out.meta) {
    fk_rows_c<true>(ff, x, out, r0, r1, C, slow, slow_ctx);
  } else {
    fk_rows_c<false>(ff, x, out, r0, r1, C, slow, slow_ctx);
  }
}

// -- codebook lookup (DequantizeMX / CodebookLookup of codebook data types) ------------------
// Rows [r0, r1) of a (rows, C) tensor tiled along its last axis with exponent scales of one
// byte: y = table[meta][code] * 2^s per element. Tables are float32 values and 2^s a normal
// float32, so one float32 multiply rounds the exact product as the general path's float64
// product rounded to float32 does. Units (one meta each) of U elements, U a multiple of L.
// FkCbDq is defined in kernels.cc.

template <int L>
FK_ALWAYS typename FkLanes<L>::vi fk_cb_codes(const FkCbDq& p, int64_t o) {
  typedef typename FkLanes<L>::vi V;
  V c;
  if (p.codes) {
    typedef typename FkVec<uint8_t, L>::type VB;
    VB b;
    __builtin_memcpy(&b, p.codes + o, L);
    return __builtin_convertvector(b, V);
  }
  const uint8_t* q = p.packed + (o * p.ib) / 8;
  if (p.ib == 8) {
    typedef typename FkVec<uint8_t, L>::type VB;
    VB b;
    __builtin_memcpy(&b, q, L);
    return __builtin_convertvector(b, V);
  }
  if (p.ib == 4) {
    typedef typename FkVec<uint8_t, L / 2>::type VH;
    typedef typename FkVec<int32_t, L / 2>::type VI;
    VH b;
    __builtin_memcpy(&b, q, L / 2);
    VI w = __builtin_convertvector(b, VI);
    VI lo = w & 15, hi = w >> 4;
    if constexpr (L == 16)
      return __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7,
                                     15);
    else
      return __builtin_shufflevector(lo, hi, 0, 4, 1, 5, 2, 6, 3, 7);
  }
  const uint64_t m = (1u << p.ib) - 1u;
  for (int h = 0; h < L / 8; ++h) {
    uint64_t w = 0;
    for (int k = 0; k < p.ib; ++k) w |= static_cast<uint64_t>(q[p.ib * h + k]) << (8 * k);
    for (int i = 0; i < 8; ++i) c[8 * h + i] = static_cast<int32_t>((w >> (p.ib * i)) & m);
  }
  return c;
}

// One row (the caller checked that every scale code present has a factor). NANS: a NaN can
// occur (p.nan): the NaN results made canonical.
template <int L, bool NANS>
static void fk_cb_dequant_row(const FkCbDq& p, int64_t r) {
  typedef typename FkLanes<L>::vi V;
  typedef typename FkLanes<L>::vf F;
  const int w = 1 << p.ib;
  const int64_t units = p.units_per_row;
  // Each mapping's entries as one vector (lane k: entry k) where they fit the lanes.
  const bool lanes = w <= L;
  const int maps = 1 << p.mb;
  F tabs[16];  // at most 16 mappings (meta_bits <= 4, fast_cb_dequantize)
  if (lanes) {
    for (int m = 0; m < maps; ++m) {
      tabs[m] = F{};
      for (int k = 0; k < w; ++k) tabs[m][k] = p.table[m * w + k];
    }
  }
  for (int64_t u = 0; u < units; ++u) {
    int64_t c0 = u * p.U;
    int64_t tile = r * p.nC + c0 / p.Tc;
    uint32_t fb = p.factor[p.scale[tile]];
    int64_t mi = r * units + u;
    int m;
    if (p.meta) {
      m = p.meta[mi];
    } else {  // mb bits at bit mi * mb of the stream, perhaps across two bytes
      int64_t bit = mi * p.mb;
      int sh = static_cast<int>(bit % 8);
      uint32_t word = p.meta_packed[bit / 8];
      if (sh + p.mb > 8) word |= static_cast<uint32_t>(p.meta_packed[bit / 8 + 1]) << 8;
      m = static_cast<int>((word >> sh) & ((1u << p.mb) - 1u));
    }
    const float* tb = p.table + static_cast<size_t>(m) * w;
    float f;
    __builtin_memcpy(&f, &fb, 4);
    const F tv = lanes ? tabs[m] : F{};
    for (int64_t j = 0; j < p.U; j += L) {
      int64_t o = r * p.C + c0 + j;
      V c = fk_cb_codes<L>(p, o);
      F q;
      if (lanes) {
        q = __builtin_shuffle(tv, c);
      } else {
        for (int i = 0; i < L; ++i) q[i] = tb[c[i]];
      }
      F y = q * f;
      V yi = (V)y;
      if (NANS) yi = y != y ? V{} + static_cast<int32_t>(0x7FC00000) : yi;
      __builtin_memcpy(p.y + o, &yi, 4 * L);
    }
  }
}

[[maybe_unused]] static void fk_cb_dequant_rows(const FkCbDq& p, int64_t r0, int64_t r1) {
  constexpr int W = kFkLanes == 16 ? 16 : 8;
  for (int64_t r = r0; r < r1; ++r) {
    if (kFkLanes == 16 && p.U % 16 == 0)
      p.nan ? fk_cb_dequant_row<W, true>(p, r) : fk_cb_dequant_row<W, false>(p, r);
    else
      p.nan ? fk_cb_dequant_row<8, true>(p, r) : fk_cb_dequant_row<8, false>(p, r);
  }
}
