// Vector kernels of the fast dequantize path (kernels.cc, section "fast dequantize"): unpacking a
// byte-aligned run of packed codes, and decoding whole tiles of a row into float32 bits.
// Included by kernels.cc once per instruction set (inside its own namespace and
// `#pragma GCC target`), so nothing here may have external linkage or use a template from a
// header: every helper is defined in this file. DqTab is defined by kernels.cc.
//
// Exactness (why float32 arithmetic gives the general path's float64 results; the proof is in
// kernels.cc next to DqTab): every element value tq[c] is a float32, every factor f0/f1 the
// float32 2^(s - shift) of a normal float32 power of two (or NaN), and one IEEE float32
// multiply rounds the exact product once to nearest even, as float64 q * 2^s (exact) rounded to
// float32 does.

// No include guard: kernels.cc includes this file once per target.

// 8 * groups codes of BITS bits each from the byte-aligned stream p, which holds `avail` bytes
// from p on (at least BITS * groups). A group's BITS bytes are read as one 8-byte word where the
// stream has 8 bytes left (a narrower copy into a word would stall its store forwarding).
template <int BITS>
static void dqk_unpack(const uint8_t* p, int64_t groups, int64_t avail, uint8_t* out) {
  constexpr uint64_t mask = (uint64_t(1) << BITS) - 1;
  if (BITS == 8) {
    std::memcpy(out, p, static_cast<size_t>(8 * groups));
    return;
  }
  if (BITS == 4) {
    for (int64_t i = 0; i < 4 * groups; ++i) {
      uint8_t b = p[i];
      out[2 * i] = b & 0xF;
      out[2 * i + 1] = b >> 4;
    }
    return;
  }
  int64_t wide = avail >= 8 ? std::min<int64_t>(groups, (avail - 8) / BITS + 1) : 0;
  int64_t g = 0;
#if DQK_ISA == 2
  // The word in all 8 lanes, shifted by 0, BITS, ..., 7 BITS, masked, narrowed to bytes.
  const __m512i shifts = _mm512_set_epi64(7 * BITS, 6 * BITS, 5 * BITS, 4 * BITS, 3 * BITS,
                                          2 * BITS, BITS, 0);
  const __m512i m = _mm512_set1_epi64(static_cast<long long>(mask));
  for (; g < wide; ++g) {
    long long w;
    std::memcpy(&w, p + BITS * g, 8);
    __m512i v = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(w), shifts), m);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 8 * g), _mm512_cvtepi64_epi8(v));
  }
#endif
  for (; g < groups; ++g) {
    uint64_t w = 0;
    if (g < wide) {
      std::memcpy(&w, p + BITS * g, 8);
    } else {
      for (int k = 0; k < BITS; ++k) w |= static_cast<uint64_t>(p[BITS * g + k]) << (8 * k);
    }
    for (int k = 0; k < 8; ++k) out[8 * g + k] = static_cast<uint8_t>((w >> (k * BITS)) & mask);
  }
}

static void dqk_unpack_bits(int bits, const uint8_t* p, int64_t groups, int64_t avail,
                            uint8_t* out) {
  switch (bits) {
    case 1: dqk_unpack<1>(p, groups, avail, out); break;
    case 2: dqk_unpack<2>(p, groups, avail, out); break;
    case 3: dqk_unpack<3>(p, groups, avail, out); break;
    case 4: dqk_unpack<4>(p, groups, avail, out); break;
    case 5: dqk_unpack<5>(p, groups, avail, out); break;
    case 6: dqk_unpack<6>(p, groups, avail, out); break;
    case 7: dqk_unpack<7>(p, groups, avail, out); break;
    default: dqk_unpack<8>(p, groups, avail, out); break;
  }
}

// The float32 bits of tq[c] * factor, every NaN canonical (store_y).
__attribute__((always_inline)) static inline uint32_t dqk_one(const DqTab& T, uint32_t c,
                                                              uint32_t fb) {
  float f;
  std::memcpy(&f, &fb, 4);
  float v = T.tq[c] * f;
  uint32_t b;
  std::memcpy(&b, &v, 4);
  // A signed compare of the non-negative magnitude (vectorizes without unsigned compares).
  return static_cast<int32_t>(b & 0x7FFFFFFFu) > 0x7F800000 ? 0x7FC00000u : b;
}

// ntiles whole tiles of TC elements: codes (one byte each), their scale codes, and for SC > 0
// one shift byte (0/1) per subtile of SC elements. Writes y; returns true when some tile's scale
// code is not exact in float32 (T.ok[code] == 0): the caller redoes those tiles.
template <int TC, int SC>
static bool dqk_tiles(const DqTab& T, const uint8_t* codes, const uint8_t* scales,
                      const uint8_t* sh, int64_t ntiles, uint32_t* y) {
  uint32_t bad = 0;
  for (int64_t t = 0; t < ntiles; ++t) {
    uint32_t sc = scales[t];
    bad |= T.ok[sc] ^ 1u;
    uint32_t f0 = T.f0[sc];
    const uint8_t* c = codes + t * TC;
    uint32_t* yo = y + t * TC;
    if (SC > 0) {
      uint32_t f1 = T.f1[sc];
      const uint8_t* s = sh + t * (TC / (SC > 0 ? SC : 1));
      for (int j = 0; j < TC; ++j) yo[j] = dqk_one(T, c[j], s[j / (SC > 0 ? SC : 1)] ? f1 : f0);
    } else {
      for (int j = 0; j < TC; ++j) yo[j] = dqk_one(T, c[j], f0);
    }
  }
  return bad != 0;
}

// The same for any tile and subtile size (sc: 0 without shift bits).
static bool dqk_tiles_any(const DqTab& T, int64_t tc, int64_t sc_len, const uint8_t* codes,
                          const uint8_t* scales, const uint8_t* sh, int64_t ntiles, uint32_t* y) {
  uint32_t bad = 0;
  for (int64_t t = 0; t < ntiles; ++t) {
    uint32_t sc = scales[t];
    bad |= T.ok[sc] ^ 1u;
    uint32_t f0 = T.f0[sc], f1 = T.f1[sc];
    const uint8_t* c = codes + t * tc;
    uint32_t* yo = y + t * tc;
    if (sc_len > 0) {
      const uint8_t* s = sh + t * (tc / sc_len);
      for (int64_t s0 = 0; s0 < tc; s0 += sc_len) {
        uint32_t f = s[s0 / sc_len] ? f1 : f0;
        for (int64_t j = s0; j < s0 + sc_len; ++j) yo[j] = dqk_one(T, c[j], f);
      }
    } else {
      for (int64_t j = 0; j < tc; ++j) yo[j] = dqk_one(T, c[j], f0);
    }
  }
  return bad != 0;
}

#if DQK_ISA == 2
// AVX-512: the element table in registers, 32 entries a permutex2var, a blend tree on the
// higher code bits (NCH 32-entry chunks: 2^bits / 32, at least 1).
// NCH 0: 8-bit two's complement ints, whose values are the codes as int8 (no table). (A gather
// from the table in memory instead of the blend tree measured no faster for 8-bit codes.)
template <int NCH>
__attribute__((always_inline)) static inline __m512 dqk_lookup(const __m512* tab, __m512i idx) {
  if (NCH == 0) return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(idx, 24), 24));
  __m512 r0 = _mm512_permutex2var_ps(tab[0], idx, tab[1]);
  if (NCH == 1) return r0;
  __m512 r1 = _mm512_permutex2var_ps(tab[2], idx, tab[3]);
  __mmask16 b5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
  __m512 lo = _mm512_mask_blend_ps(b5, r0, r1);
  if (NCH == 2) return lo;
  __m512 r2 = _mm512_permutex2var_ps(tab[4], idx, tab[5]);
  __m512 r3 = _mm512_permutex2var_ps(tab[6], idx, tab[7]);
  __m512 hi = _mm512_mask_blend_ps(b5, r2, r3);
  __mmask16 b6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
  __m512 q0 = _mm512_mask_blend_ps(b6, lo, hi);
  if (NCH == 4) return q0;
  __m512 r4 = _mm512_permutex2var_ps(tab[8], idx, tab[9]);
  __m512 r5 = _mm512_permutex2var_ps(tab[10], idx, tab[11]);
  __m512 r6 = _mm512_permutex2var_ps(tab[12], idx, tab[13]);
  __m512 r7 = _mm512_permutex2var_ps(tab[14], idx, tab[15]);
  __m512 lo2 = _mm512_mask_blend_ps(b5, r4, r5);
  __m512 hi2 = _mm512_mask_blend_ps(b5, r6, r7);
  __m512 q1 = _mm512_mask_blend_ps(b6, lo2, hi2);
  __mmask16 b7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
  return _mm512_mask_blend_ps(b7, q0, q1);
}

// 16 (or, with 8-byte codes, 8) elements: codes c, factors f; NaN canonical.
template <int NCH, bool HALF>
__attribute__((always_inline)) static inline __m512i dqk_vec16(const __m512* tab, const uint8_t* c,
                                                              __m512 f) {
  __m128i cb = HALF ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))
                    : _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  __m512 v = _mm512_mul_ps(dqk_lookup<NCH>(tab, _mm512_cvtepu8_epi32(cb)), f);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, _mm512_castps_si512(v), _mm512_set1_epi32(0x7FC00000));
}

// Writes consecutive vectors of 16 (the last may hold 8) output elements from y on. NT:
// streaming stores, which skip the read for ownership of every output line (the output is far
// larger than the caches); they need 64-byte aligned addresses, so when y is k elements past a
// 64-byte boundary (numpy's own arrays are 16 bytes past one) each store takes the last k
// elements of the previous vector and the first 16 - k of this one (one two-source permute),
// and the first and last, partial lines are masked ordinary stores. Fenced by finish().
template <bool NT>
struct DqkOut {
  uint32_t* y;
  int64_t pos = 0;  // elements written (or in flight)
  int k = 0;
  __m512i idx, prev;
  explicit DqkOut(uint32_t* out) : y(out) {
    if (NT) {
      k = static_cast<int>((reinterpret_cast<uintptr_t>(out) % 64) / 4);
      idx = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                             _mm512_set1_epi32(16 - k));
      prev = _mm512_setzero_si512();
    }
  }
  __attribute__((always_inline)) inline void push(__m512i v, int cnt) {
    if (!NT) {
      if (cnt == 16) {
        _mm512_storeu_si512(y + pos, v);
      } else {
        _mm512_mask_storeu_epi32(y + pos, static_cast<__mmask16>((1u << cnt) - 1), v);
      }
      pos += cnt;
      return;
    }
    // The aligned line holding elements [pos - k, pos - k + 16); valid lanes: elements in
    // [0, pos + cnt).
    __m512i w = k ? _mm512_permutex2var_epi32(prev, idx, v) : v;
    uint32_t lo = pos == 0 ? static_cast<uint32_t>(k) : 0u;
    uint32_t hi = static_cast<uint32_t>(k + cnt < 16 ? k + cnt : 16);
    uint32_t* line = y + pos - k;
    if (lo == 0 && hi == 16) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(line), w);
    } else {
      _mm512_mask_storeu_epi32(line, static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1)), w);
    }
    prev = v;
    pos += 16;
    if (cnt < 16) {  // the last vector: elements [pos - 16 + cnt - ...) left in prev
      int left = k + cnt - 16;
      if (left > 0)
        _mm512_mask_storeu_epi32(y + pos - k, static_cast<__mmask16>((1u << left) - 1),
                                 _mm512_permutex2var_epi32(prev, idx, prev));
      pos = -1;  // finished
    }
  }
  __attribute__((always_inline)) inline void finish() {
    if (!NT) return;
    if (k && pos > 0)  // the last k elements, still in prev
      _mm512_mask_storeu_epi32(y + pos - k, static_cast<__mmask16>((1u << k) - 1),
                               _mm512_permutex2var_epi32(prev, idx, prev));
    _mm_sfence();
  }
};

// Each bit of m8 twice: bit i of m8 -> bits 2i and 2i + 1.
__attribute__((always_inline)) static inline __mmask16 dqk_twice(uint32_t m8) {
  uint32_t x = m8 & 0xFFu;
  x = (x | (x << 4)) & 0x0F0Fu;
  x = (x | (x << 2)) & 0x3333u;
  x = (x | (x << 1)) & 0x5555u;
  return static_cast<__mmask16>(x | (x << 1));
}

// Tiles of TC (a multiple of 16, or 8 without shift bits) elements; SC 0 or 2. NT: streaming
// stores (DqkOut).
template <int NCH, int TC, int SC, bool NT>
static bool dqk_tiles512(const DqTab& T, const uint8_t* codes, const uint8_t* scales,
                         const uint8_t* sh, int64_t ntiles, uint32_t* y) {
  __m512 tab[16];
  for (int i = 0; i < 2 * NCH && i < 16; ++i) tab[i] = _mm512_loadu_ps(T.tq + 16 * i);
  uint32_t bad = 0;
  DqkOut<NT> out(y);
  if (TC == 8) {
    int64_t t = 0;
    for (; t + 2 <= ntiles; t += 2) {
      uint32_t a = scales[t], b = scales[t + 1];
      bad |= (T.ok[a] & T.ok[b]) ^ 1u;
      __m512 f = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
          0xFF00, _mm512_set1_epi32(static_cast<int>(T.f0[a])),
          _mm512_set1_epi32(static_cast<int>(T.f0[b]))));
      out.push(dqk_vec16<NCH, false>(tab, codes + 8 * t, f), 16);
    }
    if (t < ntiles) {
      uint32_t a = scales[t];
      bad |= T.ok[a] ^ 1u;
      __m512 f = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(T.f0[a])));
      out.push(dqk_vec16<NCH, true>(tab, codes + 8 * t, f), 8);
    }
    out.finish();
    return bad != 0;
  }
  for (int64_t t = 0; t < ntiles; ++t) {
    uint32_t sc = scales[t];
    bad |= T.ok[sc] ^ 1u;
    __m512 f0 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(T.f0[sc])));
    __m512 f1 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(T.f1[sc])));
    for (int v = 0; v < TC / 16; ++v) {
      __m512 f = f0;
      if (SC == 2) {
        __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sh + t * (TC / 2) + 8 * v));
        f = _mm512_mask_blend_ps(dqk_twice(_mm_test_epi8_mask(s8, s8)), f0, f1);
      }
      out.push(dqk_vec16<NCH, false>(tab, codes + t * TC + 16 * v, f), 16);
    }
  }
  out.finish();
  return bad != 0;
}

template <int NCH, bool NT>
static bool dqk_run512(const DqTab& T, int64_t tc, int64_t sc_len, const uint8_t* codes,
                       const uint8_t* scales, const uint8_t* sh, int64_t ntiles, uint32_t* y) {
  if (sc_len == 2 && tc == 16)
    return dqk_tiles512<NCH, 16, 2, NT>(T, codes, scales, sh, ntiles, y);
  if (sc_len == 0) {
    switch (tc) {
      case 8: return dqk_tiles512<NCH, 8, 0, NT>(T, codes, scales, sh, ntiles, y);
      case 16: return dqk_tiles512<NCH, 16, 0, NT>(T, codes, scales, sh, ntiles, y);
      case 32: return dqk_tiles512<NCH, 32, 0, NT>(T, codes, scales, sh, ntiles, y);
      case 64: return dqk_tiles512<NCH, 64, 0, NT>(T, codes, scales, sh, ntiles, y);
      default: break;
    }
  }
  return dqk_tiles_any(T, tc, sc_len, codes, scales, sh, ntiles, y);
}

template <int NCH>
static bool dqk_run512_nt(bool nt, const DqTab& T, int64_t tc, int64_t sc_len,
                          const uint8_t* codes, const uint8_t* scales, const uint8_t* sh,
                          int64_t ntiles, uint32_t* y) {
  if (nt && reinterpret_cast<uintptr_t>(y) % 4 == 0)
    return dqk_run512<NCH, true>(T, tc, sc_len, codes, scales, sh, ntiles, y);
  return dqk_run512<NCH, false>(T, tc, sc_len, codes, scales, sh, ntiles, y);
}

// -- codebook lookups (kernels.cc fast_cb_dequantize; FkCbDq) --
// y = table[meta][code] * 2^s. Exactness as fk_cb_dequant_row (fast_impl.h): every table entry
// is a float32 and 2^s a float32 (normal, or subnormal while the FPU keeps subnormals), so one
// float32 multiply rounds the exact product once, as the general path's float64 product
// rounded to float32 does. The lookup only moves table entries (permutes, blends, a gather).
// The mapping is folded into the index: entry meta * 2^ib + code of the table as one array, so
// one permute (2 x 16 entries for cb41) serves every unit, with no per-unit table pick.

// Turns 2 * ib bytes of codes (broadcast into all four 128-bit lanes) into 16 codes, one per
// 32-bit lane, still to be masked: lane i takes the (one or two) bytes holding bits
// [i * ib, i * ib + ib), shifted right by (i * ib) % 8. One-byte codes are ib = 8.
struct DqkCbUnpack {
  __m512i shuf, shift;
};
static DqkCbUnpack dqk_cb_unpack_consts(int ib) {
  alignas(64) uint8_t sb[64];
  alignas(64) int32_t sh[16];
  for (int i = 0; i < 16; ++i) {
    int bit = i * ib, k = bit / 8;
    sh[i] = bit % 8;
    sb[4 * i] = static_cast<uint8_t>(k);
    sb[4 * i + 1] = bit % 8 + ib > 8 ? static_cast<uint8_t>(k + 1) : 0x80;  // 0x80: a zero
    sb[4 * i + 2] = sb[4 * i + 3] = 0x80;
  }
  return {_mm512_load_si512(sb), _mm512_load_si512(sh)};
}

// The 16 (cnt 16) or 8 (cnt 8) raw codes at q; `left` bytes of the stream from q on. A full
// 16-byte load where 16 bytes remain, else a masked one (no read past the stream).
__attribute__((always_inline)) static inline __m512i dqk_cb_raw(const DqkCbUnpack& k,
                                                               const uint8_t* q, int64_t left,
                                                               int nb) {
  __m128i b = left >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q))
                         : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << nb) - 1), q);
  return _mm512_srlv_epi32(_mm512_shuffle_epi8(_mm512_broadcast_i32x4(b), k.shuf), k.shift);
}

// NCH: the combined table's 32-entry chunks (dqk_lookup), 16: more than 256 entries (gather).
// NANS: a NaN can occur (a NaN table entry or NaN scale code present): made canonical.
template <int NCH, bool NANS>
__attribute__((always_inline)) static inline __m512i dqk_cb_vec(const __m512* tab,
                                                               const float* table, __m512i idx,
                                                               __m512 f) {
  __m512 q;
  if constexpr (NCH == 16)
    q = _mm512_i32gather_ps(idx, table, 4);
  else
    q = dqk_lookup<NCH>(tab, idx);
  __m512 v = _mm512_mul_ps(q, f);
  if (!NANS) return _mm512_castps_si512(v);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, _mm512_castps_si512(v), _mm512_set1_epi32(0x7FC00000));
}

// The mapping (meta) of unit mi, masked to mb bits.
__attribute__((always_inline)) static inline uint32_t dqk_cb_meta(const FkCbDq& p, int64_t mi,
                                                                 uint32_t mmask) {
  if (p.meta) return p.meta[mi] & mmask;
  int64_t bit = mi * p.mb;  // mb bits at bit mi * mb of the stream, perhaps across two bytes
  int sh = static_cast<int>(bit % 8);
  uint32_t word = p.meta_packed[bit / 8];
  if (sh + p.mb > 8) word |= static_cast<uint32_t>(p.meta_packed[bit / 8 + 1]) << 8;
  return (word >> sh) & mmask;
}

// Rows [r0, r1), whose outputs are one contiguous run of (r1 - r0) * C elements: one DqkOut.
// Units of a multiple of 16 elements take their factor and mapping once (broadcast); other
// units (a multiple of 8) go by 8-element halves, two to a vector, each with its own.
template <int NCH, bool NANS, bool NT>
static void dqk_cb_rows512(const FkCbDq& p, int64_t r0, int64_t r1) {
  const DqkCbUnpack k = dqk_cb_unpack_consts(p.codes ? 8 : p.ib);
  const uint8_t* src = p.codes ? p.codes : p.packed;
  const int sb = p.codes ? 8 : p.ib;  // stored bits per code
  const int64_t maps = int64_t(1) << p.mb, n = maps << p.ib;
  __m512 tab[16];
  if (NCH != 16) {
    alignas(64) float t[256] = {};
    for (int64_t i = 0; i < n; ++i) t[i] = p.table[i];
    for (int i = 0; i < 2 * NCH && i < 16; ++i) tab[i] = _mm512_load_ps(t + 16 * i);
  }
  const __m512i cmask = _mm512_set1_epi32((1 << p.ib) - 1);
  const uint32_t mmask = static_cast<uint32_t>(maps - 1);
  const int64_t units = p.units_per_row, upt = p.Tc / p.U;  // units per tile (Tc % U == 0)
  DqkOut<NT> out(reinterpret_cast<uint32_t*>(p.y + r0 * p.C));
  // (a & b) | c: the code's ib bits, the mapping above them.
  auto idx = [&](int64_t o, int cnt, __m512i mv) {
    int64_t at = o * sb / 8;
    __m512i raw = dqk_cb_raw(k, src + at, p.nbytes - at, cnt * sb / 8);
    return _mm512_ternarylogic_epi32(raw, cmask, mv, 0xEA);
  };
  if (p.U % 16 == 0) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t tile = r * p.nC, uu = 0;
      for (int64_t u = 0; u < units; ++u) {
        const int64_t gu = r * units + u;
        __m512 f = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(p.factor[p.scale[tile]])));
        __m512i mv = _mm512_set1_epi32(static_cast<int>(dqk_cb_meta(p, gu, mmask) << p.ib));
        for (int64_t j = 0; j < p.U; j += 16)
          out.push(dqk_cb_vec<NCH, NANS>(tab, p.table, idx(gu * p.U + j, 16, mv), f), 16);
        if (++uu == upt) {
          uu = 0;
          ++tile;
        }
      }
    }
  } else {
    // A cursor over the 8-element halves: unit (r, u), its tile, halves left in it.
    const int64_t hpu = p.U / 8;
    int64_t r = r0, u = 0, uu = 0, tile = r0 * p.nC, hleft = 0;
    uint32_t fb = 0, mvb = 0;
    auto half = [&](uint32_t* f, uint32_t* m) {
      if (hleft == 0) {
        if (u == units) {
          ++r;
          u = uu = 0;
          tile = r * p.nC;
        }
        fb = p.factor[p.scale[tile]];
        mvb = dqk_cb_meta(p, r * units + u, mmask) << p.ib;
        hleft = hpu;
        ++u;
        if (++uu == upt) {
          uu = 0;
          ++tile;
        }
      }
      --hleft;
      *f = fb;
      *m = mvb;
    };
    const int64_t halves = (r1 - r0) * p.C / 8, o0 = r0 * p.C;
    int64_t h = 0;
    for (; h + 2 <= halves; h += 2) {
      uint32_t fa, ma, fc, mc;
      half(&fa, &ma);
      half(&fc, &mc);
      __m512 f = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
          0xFF00, _mm512_set1_epi32(static_cast<int>(fa)), _mm512_set1_epi32(static_cast<int>(fc))));
      __m512i mv = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(static_cast<int>(ma)),
                                           _mm512_set1_epi32(static_cast<int>(mc)));
      out.push(dqk_cb_vec<NCH, NANS>(tab, p.table, idx(o0 + 8 * h, 16, mv), f), 16);
    }
    if (h < halves) {
      uint32_t fa, ma;
      half(&fa, &ma);
      __m512 f = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(fa)));
      __m512i mv = _mm512_set1_epi32(static_cast<int>(ma));
      out.push(dqk_cb_vec<NCH, NANS>(tab, p.table, idx(o0 + 8 * h, 8, mv), f), 8);
    }
  }
  out.finish();
}

template <int NCH>
static void dqk_cb_rows_nch(const FkCbDq& p, int64_t r0, int64_t r1) {
  const bool nt = p.nt && reinterpret_cast<uintptr_t>(p.y) % 4 == 0;
  if (p.nan) {
    if (nt) dqk_cb_rows512<NCH, true, true>(p, r0, r1);
    else dqk_cb_rows512<NCH, true, false>(p, r0, r1);
  } else {
    if (nt) dqk_cb_rows512<NCH, false, true>(p, r0, r1);
    else dqk_cb_rows512<NCH, false, false>(p, r0, r1);
  }
}

// Rows [r0, r1) of a codebook lookup (fast_cb_dequantize has checked the shapes and factors).
static void dqk_cb_rows(const FkCbDq& p, int64_t r0, int64_t r1) {
  if (r0 >= r1) return;
  const int64_t n = int64_t(1) << (p.mb + p.ib);  // entries of the combined table
  if (n <= 32) dqk_cb_rows_nch<1>(p, r0, r1);
  else if (n <= 64) dqk_cb_rows_nch<2>(p, r0, r1);
  else if (n <= 128) dqk_cb_rows_nch<4>(p, r0, r1);
  else if (n <= 256) dqk_cb_rows_nch<8>(p, r0, r1);
  else dqk_cb_rows_nch<16>(p, r0, r1);
}
#endif

// Decodes ntiles whole tiles (see dqk_tiles); bits: the element code width; nt: the output is
// large (streaming stores where the instruction set has them and y is aligned).
static bool dqk_run(const DqTab& T, int bits, bool nt, int64_t tc, int64_t sc_len, const uint8_t* codes,
                    const uint8_t* scales, const uint8_t* sh, int64_t ntiles, uint32_t* y) {
#if DQK_ISA == 2
  switch (T.int8 ? 0 : bits <= 5 ? 1 : bits == 6 ? 2 : bits == 7 ? 4 : 8) {
    case 0: return dqk_run512_nt<0>(nt, T, tc, sc_len, codes, scales, sh, ntiles, y);
    case 1: return dqk_run512_nt<1>(nt, T, tc, sc_len, codes, scales, sh, ntiles, y);
    case 2: return dqk_run512_nt<2>(nt, T, tc, sc_len, codes, scales, sh, ntiles, y);
    case 4: return dqk_run512_nt<4>(nt, T, tc, sc_len, codes, scales, sh, ntiles, y);
    default: return dqk_run512_nt<8>(nt, T, tc, sc_len, codes, scales, sh, ntiles, y);
  }
#else
  (void)bits;
  (void)nt;
  if (sc_len == 0) {
    switch (tc) {
      case 8: return dqk_tiles<8, 0>(T, codes, scales, sh, ntiles, y);
      case 16: return dqk_tiles<16, 0>(T, codes, scales, sh, ntiles, y);
      case 32: return dqk_tiles<32, 0>(T, codes, scales, sh, ntiles, y);
      default: break;
    }
  } else if (sc_len == 2 && tc == 16) {
    return dqk_tiles<16, 2>(T, codes, scales, sh, ntiles, y);
  }
  return dqk_tiles_any(T, tc, sc_len, codes, scales, sh, ntiles, y);
#endif
}
