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

// Statistics of one tile: largest finite magnitude (bits), any NaN, any Inf/NaN.
static inline void fk_stats(const uint32_t* xb, int n, uint32_t* amax, bool* nan, bool* nonfinite) {
  uint32_t m = 0, anynan = 0, anynf = 0;
  for (int j = 0; j < n; ++j) {
    uint32_t b = xb[j] & 0x7FFFFFFFu;
    uint32_t fin = b < 0x7F800000u ? b : 0u;
    m = fin > m ? fin : m;
    anynan |= b > 0x7F800000u ? 1u : 0u;
    anynf |= b >= 0x7F800000u ? 1u : 0u;
  }
  *amax = m;
  *nan = anynan != 0;
  *nonfinite = anynf != 0;
}

// Exponent-scaled tile of n (== TC when TC > 0) elements; returns false (nothing written) when
// the tile needs the general path.
template <int TC>
static inline bool fk_exp_tile(const FastFormat& ff, const float* x, float* y, int n) {
  if (TC > 0) n = TC;
  uint32_t xb[TC > 0 ? TC : 1024];
  __builtin_memcpy(xb, x, static_cast<size_t>(n) * 4);
  uint32_t amax;
  bool nan, nonfinite;
  fk_stats(xb, n, &amax, &nan, &nonfinite);
  FastTile t;
  if (!fast_tile(ff, amax, nan, nonfinite, &t)) return false;
  uint32_t yb[TC > 0 ? TC : 1024];
  if (t.nan_tile) {
    for (int j = 0; j < n; ++j) yb[j] = 0x7FC00000u;
  } else if (ff.sub) {
    // MX6/MX9: a subtile whose magnitudes all lie below 2^floor(log2 amax) takes one more bit.
    uint32_t below[TC > 0 ? TC : 1024];
    for (int j = 0; j < n; ++j) {
      uint32_t b = xb[j] & 0x7FFFFFFFu;
      uint32_t fin = b < 0x7F800000u ? b : 0u;
      below[j] = fin < t.thr ? 1u : 0u;
    }
    int S = ff.sub;
    // Padding of a tail tile is zero: below the threshold unless the tile is all zero.
    for (int j = n; j < ((n + S - 1) / S) * S; ++j) below[j] = t.thr > 0 ? 1u : 0u;
    for (int j0 = 0; j0 < n; j0 += S) {
      uint32_t all = 1;
      for (int j = j0; j < j0 + S; ++j) all &= below[j];
      for (int j = j0; j < j0 + S && j < n; ++j) below[j] = all;
    }
    fk_loop<TC>(xb, yb, below, n, t, ff);
  } else {
    fk_loop<TC>(xb, yb, nullptr, n, t, ff);
  }
  __builtin_memcpy(y, yb, static_cast<size_t>(n) * 4);
  return true;
}

// Float-scaled tile (NVFP4 and friends): v = x / eff in float32, rounded on the element grid,
// times eff in float32 - the reference's operations, in its order.
template <int TC>
static inline bool fk_float_tile(const FastFormat& ff, const float* x, float* y, int n) {
  if (TC > 0) n = TC;
  uint32_t xb[TC > 0 ? TC : 1024];
  __builtin_memcpy(xb, x, static_cast<size_t>(n) * 4);
  uint32_t amax;
  bool nan, nonfinite;
  fk_stats(xb, n, &amax, &nan, &nonfinite);
  FastTile t;
  if (!fast_tile(ff, amax, nan, nonfinite, &t)) return false;
  if (t.nan_tile) {
    for (int j = 0; j < n; ++j) {
      uint32_t q = 0x7FC00000u;
      __builtin_memcpy(y + j, &q, 4);
    }
    return true;
  }
  float eff = t.eff;
  bool pos = eff > 0.0f;
  float v[TC > 0 ? TC : 1024];
  for (int j = 0; j < n; ++j) v[j] = pos ? x[j] / eff : x[j] != x[j] ? x[j] : 0.0f;
  uint32_t vb[TC > 0 ? TC : 1024];
  __builtin_memcpy(vb, v, static_cast<size_t>(n) * 4);
  fk_loop<TC>(vb, vb, nullptr, n, t, ff);
  __builtin_memcpy(v, vb, static_cast<size_t>(n) * 4);
  for (int j = 0; j < n; ++j) {
    float yy = v[j] * eff;
    y[j] = yy != yy ? __builtin_nanf("") : yy;
  }
  return true;
}

template <int TC>
static inline bool fk_tile(const FastFormat& ff, const float* x, float* y, int n) {
  return ff.float_scale ? fk_float_tile<TC>(ff, x, y, n) : fk_exp_tile<TC>(ff, x, y, n);
}

// Rows [r0, r1) of a (rows, C) float32 tensor, tiles of ff.tc along each row. Tiles the fast
// path refuses are handed to `slow(row, c0)`.
template <int TC>
static void fk_rows_t(const FastFormat& ff, const float* x, float* y, int64_t r0, int64_t r1,
                      int64_t C, void (*slow)(void*, int64_t, int64_t), void* slow_ctx) {
  int tc = TC > 0 ? TC : ff.tc;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    int64_t c0 = 0;
    for (; c0 + tc <= C; c0 += tc) {
      if (!fk_tile<TC>(ff, xr + c0, yr + c0, tc)) slow(slow_ctx, r, c0);
    }
    if (c0 < C) {
      int n = static_cast<int>(C - c0);
      // The tail tile: zero padding does not change the statistics, so it is a shorter tile.
      if (!fk_tile<0>(ff, xr + c0, yr + c0, n)) slow(slow_ctx, r, c0);
    }
  }
}

static void fk_rows(const FastFormat& ff, const float* x, float* y, int64_t r0, int64_t r1,
                    int64_t C, void (*slow)(void*, int64_t, int64_t), void* slow_ctx) {
  switch (ff.tc) {
    case 8: fk_rows_t<8>(ff, x, y, r0, r1, C, slow, slow_ctx); break;
    case 16: fk_rows_t<16>(ff, x, y, r0, r1, C, slow, slow_ctx); break;
    case 32: fk_rows_t<32>(ff, x, y, r0, r1, C, slow, slow_ctx); break;
    default: fk_rows_t<0>(ff, x, y, r0, r1, C, slow, slow_ctx); break;
  }
}
