// Fast codebook casts (cb<ib><mb>..., exponent scale): float32 tensors tiled along their last
// axis, tiles of up to kCbMaxT elements, optional subtiles along that axis (one mapping per
// unit: subtile, or tile when there are none).
//
// Included once by kernels.cc (inside its anonymous namespace, after process_tile); this file
// includes itself once more per instruction set (cb_base, cb_avx2, cb_avx512) with
// ONNXQ_CB_KERNEL defined, like fast_impl.h, so the kernel below is compiled per target and
// picked at run time.
//
// The kernel works on groups of W tiles side by side: a tile is one SIMD lane, element p of
// every tile of the group is one vector (a transpose on load and store). Everything per tile
// (absmax, scale, mapping choice) and per element is then a vertical operation.
//
// Bit-exactness with reference._codebook_select:
// - Nearest entry. a = |x| * 2^-s is exact in float32 whenever a >= 2^-126 (x has 24 bits and
//   2^-s is a power of two); below, the float32 product is only rounded, monotonically. The
//   reference picks hi over lo = hi - 1 when d_hi < d_lo or (d_hi == d_lo and tie_hi), in
//   float64. Near the midpoint m = (lo + hi) / 2 both differences are exact in float64 (setup
//   checks that the table's bits and a's 24 bits span at most 53 bits), so the float64 test is
//   the exact test a > m (or a >= m when ties go up); away from m, rounding cannot turn one
//   difference into the other. So the index is the number of thresholds th_k <= a with th_k = m
//   (ties up) or the next float32 above m (ties down). Setup checks that every m is a float32
//   >= 2^-125, so a below 2^-126 (inexact) is below every threshold, as is the exact a.
// - Error. d = v - q = sign * (a64 - t) with a64 = |x| * 2^-s in float64 (always exact) and t the
//   table entry (round to nearest is symmetric, and q = +0 for t = 0 gives d = v = -a64 for
//   negative v); d * d in float64, added up left to right in float64 as l2_metric does.
// - Mapping: the least error, ties to the lower mapping (strict <), as the reference.
// - Value: float32(t * 2^s) is the float32 product t32 * 2^s (one rounding of the same exact
//   value: t and 2^s are float32), with x's sign when t != 0 or the compute type has -0.
// Tiles with Inf or NaN are redone by process_tile (the general path).

#ifndef ONNXQ_CB_KERNEL

constexpr int kCbMaxT = 256;   // elements per tile
constexpr int kCbMaxMaps = 16;
constexpr int kCbMaxHalf = 32;  // magnitudes per mapping (index_bits <= 6)

struct CbFast {
  const Ctx* c = nullptr;
  int T = 0, U = 0, units = 0, maps = 0, half = 0, nth = 0, ib = 0;
  bool negzero = false, floor_mode = false, subtiles = false;
  bool stream = false;  // values written with streaming stores (large outputs)
  int emax = 0, frac = 0, low = 0, high = 0, bias = 0;
  // Tiles with a larger scale exponent could decode a top entry past the data type's largest
  // finite value: they are redone by process_tile, which bounds the clamp (finite_bound).
  int safe_sexp = 0;
  int64_t R = 0, C = 0, nC = 0, tiles = 0, sub_cols = 0;
  float th[kCbMaxMaps * kCbMaxHalf] = {};   // a >= th[m * nth + k]: entry k + 1 over k
  float tab[kCbMaxMaps * kCbMaxHalf] = {};  // magnitudes
};

// A group of tiles' working arrays, [position][lane] (allocated once per worker).
struct CbBuf {
  std::vector<char> mem;
  char* at = nullptr;  // 128-byte aligned
  char* x = nullptr;
  char* a32 = nullptr;
  char* t = nullptr;
  char* y = nullptr;
  char* rows = nullptr;
  char* a64 = nullptr;
  char* sq = nullptr;
  char* idx = nullptr;
  char* codes = nullptr;
  // Carves the buffers for tiles of T elements, W lanes, `maps` mappings and `units` units.
  void setup(int T, int W, int maps, int units) {
    size_t f = static_cast<size_t>(T) * W * 4, d = 2 * f;
    size_t sizes[] = {f, f, f * maps, f, f, d, d + static_cast<size_t>(units) * W * 16,
                      f * maps, f};
    size_t total = 128;
    for (size_t z : sizes) total += (z + 127) / 128 * 128;
    mem.assign(total, 0);
    char* p = mem.data();
    p += (128 - reinterpret_cast<uintptr_t>(p) % 128) % 128;
    char** outs[] = {&x, &a32, &t, &y, &rows, &a64, &sq, &idx, &codes};
    for (int i = 0; i < 9; ++i) {
      *outs[i] = p;
      p += (sizes[i] + 127) / 128 * 128;
    }
  }
};

#define ONNXQ_CB_KERNEL 1
namespace cb_base {
constexpr int W = 4;
#include "codebook_fast.h"  // NOLINT(build/include)
}  // namespace cb_base
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace cb_avx2 {
constexpr int W = 8;
#include "codebook_fast.h"  // NOLINT(build/include)
}  // namespace cb_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512")
namespace cb_avx512 {
constexpr int W = 16;
#include "codebook_fast.h"  // NOLINT(build/include)
}  // namespace cb_avx512
#pragma GCC pop_options
#define ONNXQ_CB_X86 1
#endif
#undef ONNXQ_CB_KERNEL

using CbGroups = void (*)(const CbFast&, int64_t, int64_t, CbBuf&, Scratch&);

// The kernel for this CPU (simd_level).
inline CbGroups cb_pick() {
#ifdef ONNXQ_CB_X86
  switch (simd_level(false)) {
    case 2: return cb_avx512::cb_groups;
    case 1: return cb_avx2::cb_groups;
    default: break;
  }
#endif
  return cb_base::cb_groups;
}

// Sets up the codebook fast path; false when it does not apply (the general path runs).
inline bool cb_setup(const Ctx& c, CbFast* F) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  // float32 products with subnormal powers of two and the float32 error filter need an FPU
  // that keeps subnormals (no flush-to-zero / denormals-are-zero).
  if (fpu_flushes()) return false;
  if (c.path != kExpBook || !f.codebook() || f.sparse_m || c.stochastic) return false;
  if (c.m.round_mode > kZero) return false;
  if (g.kind != 1 || g.Post != 1 || io.x_type != kF32) return false;
  if (io.values && io.values_type != kF32) return false;
  if (io.mask) return false;
  // Packed codes are written in place: every tile starts on a byte of the stream.
  if (io.packed && !io.codes && ((g.C * f.cb_ib) % 8 || (g.Tc * f.cb_ib) % 8)) return false;
  if (io.codes && c.code_w != 1) return false;
  if (g.Tc < 1 || g.Tc > kCbMaxT) return false;
  int U = g.Sc ? static_cast<int>(g.Sc) : static_cast<int>(g.Tc);
  if (g.Tc % U) return false;
  int half = 1 << (f.cb_ib - 1), maps = 1 << f.cb_mb;
  if (half > kCbMaxHalf || maps > kCbMaxMaps || half < 2) return false;
  const Num& e = f.elem;
  const Num& s = f.scale;
  F->frac = int_frac_bits(e);
  F->low = -s.bias;
  F->high = (1 << s.ebits) - 2 - s.bias;
  // 2^-sexp and 2^sexp must be float32 (normal or subnormal).
  if (F->low - F->frac < -127 || F->high - F->frac > 127) return false;
  F->c = &c;
  F->T = static_cast<int>(g.Tc);
  F->U = U;
  F->units = F->T / U;
  F->subtiles = g.Sc != 0;
  F->maps = maps;
  F->half = half;
  F->nth = half - 1;
  F->ib = f.cb_ib;
  F->negzero = e.has_negzero;
  F->floor_mode = c.m.scale_mode == kSFloor;
  F->emax = e.emax;
  F->bias = s.bias;
  F->R = g.R;
  F->C = g.C;
  F->nC = g.nC;
  F->tiles = g.R * g.nC;
  F->sub_cols = g.sub_cols();
  int top = -100000, bottom = 100000;
  for (int m = 0; m < maps; ++m) {
    const double* tab = f.mags.data() + static_cast<size_t>(m) * half;
    const uint8_t* ev = f.even.data() + static_cast<size_t>(m) * half;
    if (tab[0] != 0.0) return false;
    for (int k = 0; k < half; ++k) {
      double t = tab[k];
      if (!(t >= 0.0) || !std::isfinite(t) || static_cast<double>(static_cast<float>(t)) != t)
        return false;
      if (k && !(t > tab[k - 1])) return false;
      F->tab[m * half + k] = static_cast<float>(t);
      if (t > 0) {
        int ex = 0;
        std::frexp(t, &ex);
        top = std::max(top, ex);  // t < 2^ex
        double sc = std::ldexp(t, 60 - ex);  // integer when t's bits lie above 2^(ex - 60)
        if (sc != std::floor(sc)) return false;
        int lb = ex - 60;
        while (std::fmod(sc, 2.0) == 0.0) { sc /= 2.0; ++lb; }
        bottom = std::min(bottom, lb);
      }
    }
    for (int k = 0; k + 1 < half; ++k) {
      double mid = (tab[k] + tab[k + 1]) / 2;
      float mf = static_cast<float>(mid);
      if (static_cast<double>(mf) != mid || !(mid >= std::ldexp(1.0, -125))) return false;
      bool tie_hi = c.m.round_mode == kEven ? ev[k + 1] != 0 : c.m.round_mode == kAway;
      F->th[m * F->nth + k] = tie_hi ? mf : std::nextafter(mf, INFINITY);
    }
  }
  double tabmax = 0.0;
  for (int m = 0; m < maps; ++m) tabmax = std::max(tabmax, f.mags[static_cast<size_t>(m) * half + half - 1]);
  const double limit = max_finite(finite_type(io));
  F->safe_sexp = F->high - F->frac;
  while (F->safe_sexp >= F->low - F->frac && std::ldexp(tabmax, F->safe_sexp) > limit)
    --F->safe_sexp;
  // Near a midpoint, a < 2^top and a's last bit is at least 2^(bottom - 25): a - t within 53
  // bits when top - bottom <= 28.
  if (top - bottom > 28) return false;
  F->stream = io.values && stream_output(g.R * g.C * 4);
  return true;
}

// The cast (after cb_setup): chunks of tiles in parallel.
inline void cb_run(const CbFast& F, const ParallelFor& pf) {
  const CbGroups groups = cb_pick();
  constexpr int64_t kPer = 256;  // tiles per chunk (a multiple of every W)
  int64_t chunks = (F.tiles + kPer - 1) / kPer;
  pf(chunks, [&](int64_t c0, int64_t c1) {
    CbBuf buf;
    Scratch scr;
    groups(F, c0 * kPer, std::min(F.tiles, c1 * kPer), buf, scr);
  });
}

#else  // ONNXQ_CB_KERNEL: the kernel, once per instruction set (W lanes)

// GCC vector types of W lanes: floats, int32, and float64 / int64 (two registers' worth).
typedef float cb_vf __attribute__((vector_size(W * 4)));
typedef int32_t cb_vi __attribute__((vector_size(W * 4)));
typedef uint32_t cb_vu __attribute__((vector_size(W * 4)));
typedef double cb_vd __attribute__((vector_size(W * 8)));
typedef int64_t cb_vl __attribute__((vector_size(W * 8)));

template <class V>
static inline V cb_load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
static inline void cb_store(void* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// Whether any lane of v is nonzero.
static inline bool cb_any(const cb_vi& v) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (W == 16) {
    __m512i m;
    std::memcpy(&m, &v, 64);
    return _mm512_test_epi32_mask(m, m) != 0;
  } else if constexpr (W == 8) {
    __m256i m;
    std::memcpy(&m, &v, 32);
    return !_mm256_testz_si256(m, m);
  }
#endif
  {
    uint64_t w[sizeof v / 8];
    std::memcpy(w, &v, sizeof v);
    uint64_t o = 0;
    for (uint64_t x : w) o |= x;
    return o != 0;
  }
}

// n floats from src to dst with streaming stores (they skip the read for ownership of every
// output line) on the whole vectors of dst's aligned middle, ordinary copies at its ends.
// Fenced by cb_groups before its chunk is reported done.
static inline void cb_stream_copy(float* dst, const float* src, int64_t n) {
  constexpr uintptr_t kAlign = W * 4;
  int64_t head = static_cast<int64_t>(((kAlign - reinterpret_cast<uintptr_t>(dst) % kAlign) %
                                       kAlign) / 4);
  head = std::min(head, n);
  std::memcpy(dst, src, sizeof(float) * head);
  int64_t i = head;
#if defined(__x86_64__) && defined(__GNUC__)
  for (; i + W <= n; i += W) {
    if constexpr (W == 16) {
      _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
    } else if constexpr (W == 8) {
      _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    } else {
      _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    }
  }
#endif
  std::memcpy(dst + i, src + i, sizeof(float) * (n - i));
}

// The lo / hi interleave masks of a W x W transpose (log2 W rounds of perfect shuffles).
static inline cb_vi cb_mask(bool hi) {
  cb_vi m;
  for (int i = 0; i < W / 2; ++i) {
    m[2 * i] = i + (hi ? W / 2 : 0);
    m[2 * i + 1] = W + i + (hi ? W / 2 : 0);
  }
  return m;
}

// rows[i] (i < W) -> columns: r[j] holds element j of every row.
static inline void cb_transpose(cb_vf* r) {
  const cb_vi lo = cb_mask(false), hi = cb_mask(true);
  for (int round = 1; round < W; round *= 2) {
    cb_vf n[W];
    for (int i = 0; i < W / 2; ++i) {
      n[2 * i] = __builtin_shuffle(r[i], r[i + W / 2], lo);
      n[2 * i + 1] = __builtin_shuffle(r[i], r[i + W / 2], hi);
    }
    for (int i = 0; i < W; ++i) r[i] = n[i];
  }
}

// A cast's per-mapping constants as vectors, built once per chunk rather than per group: the
// entries (lane k: entry k, padded with 0) and, for step j of the binary search (step = half >>
// (j + 1)), the thresholds shifted so that lane i holds threshold i + step - 1 (padded with
// +inf): the probe is then the index itself, no add.
constexpr int kCbMaxSteps = 5;  // log2(kCbMaxHalf)
struct CbVec {
  cb_vf tbv[kCbMaxMaps];
  cb_vf thv[kCbMaxMaps][kCbMaxSteps];
  explicit CbVec(const CbFast& F) {
    for (int m = 0; m < F.maps; ++m) {
      for (int k = 0; k < W; ++k) tbv[m][k] = k < F.half ? F.tab[m * F.half + k] : 0.0f;
      int j = 0;
      for (int step = F.half / 2; step >= 1 && j < kCbMaxSteps; step /= 2, ++j) {
        for (int k = 0; k < W; ++k) {
          int at = k + step - 1;
          thv[m][j][k] = at < F.nth ? F.th[m * F.nth + at] : INFINITY;
        }
      }
    }
  }
};

// acc + d * d: fused on AVX-512 (every AVX-512 CPU has FMA), two roundings elsewhere. Both
// keep the float32 filter's error bound (see cb_group), so the choice never changes a result.
static inline cb_vf cb_sq_add(const cb_vf& acc, const cb_vf& d) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (W == 16) {
    __m512 a, x;
    std::memcpy(&a, &acc, 64);
    std::memcpy(&x, &d, 64);
    __m512 r = _mm512_fmadd_ps(x, x, a);
    cb_vf out;
    std::memcpy(&out, &r, 64);
    return out;
  }
#endif
  return acc + d * d;
}

// Tiles [t0, min(t0 + W, t1)) through the buffers; the group's outputs written. TT (tile
// elements), UU (unit elements), NTH (thresholds per mapping) and MAPS are compile-time
// constants for the common formats, 0 for "read F".
template <bool VALUES, bool CODES, int TT, int UU, int NTH, int MAPS>
static void cb_group(const CbFast& F, const CbVec& V, int64_t t0, int64_t t1, CbBuf& B,
                     Scratch& scr) {
  const Ctx& c = *F.c;
  const QuantizeIO& io = c.io;
  const int T = TT ? TT : F.T, U = UU ? UU : F.U, nth = NTH ? NTH : F.nth;
  const int maps = MAPS ? MAPS : F.maps, half = nth + 1, units = T / U;
  const float* xin = static_cast<const float*>(io.x);
  cb_vf* __restrict X = reinterpret_cast<cb_vf*>(B.x);
  cb_vf* __restrict TM = reinterpret_cast<cb_vf*>(B.t);  // [map][p]
  cb_vi* __restrict IM = reinterpret_cast<cb_vi*>(B.idx);
  cb_vf* __restrict Y = reinterpret_cast<cb_vf*>(B.y);
  float* rows = reinterpret_cast<float*>(B.rows);  // W rows of T: padded tiles
  const float* src[W];
  int valid[W];
  int64_t row[W], col[W];
  int64_t r = t0 / F.nC, ct = t0 - r * F.nC;
  // The common case: W whole tiles of one row.
  const bool full = t0 + W <= t1 && (ct + W) * T <= F.C;
  if (full) {
    const float* s = xin + r * F.C + ct * T;
    for (int l = 0; l < W; ++l) {
      row[l] = r;
      col[l] = ct + l;
      valid[l] = T;
      src[l] = s + static_cast<size_t>(l) * T;
    }
  }
  for (int l = 0; l < W && !full; ++l, ++ct) {
    if (ct == F.nC) { ct = 0; ++r; }
    row[l] = r;
    col[l] = ct;
    valid[l] = 0;
    src[l] = rows + static_cast<size_t>(l) * T;
    if (t0 + l >= t1) {
      std::memset(rows + static_cast<size_t>(l) * T, 0, sizeof(float) * T);
      continue;
    }
    const float* s = xin + r * F.C + ct * T;
    int n = static_cast<int>(std::min<int64_t>(T, F.C - ct * T));
    valid[l] = n;
    if (n == T) {
      src[l] = s;
    } else {
      float* d = rows + static_cast<size_t>(l) * T;
      std::memcpy(d, s, sizeof(float) * n);
      std::memset(d + n, 0, sizeof(float) * (T - n));
    }
  }
  // Load, transposed: X[p] = element p of every tile.
  if (T % W == 0) {
    for (int p0 = 0; p0 < T; p0 += W) {
      cb_vf* blk = X + p0;
      for (int l = 0; l < W; ++l) blk[l] = cb_load<cb_vf>(src[l] + p0);
      cb_transpose(blk);
    }
  } else {
    for (int p = 0; p < T; ++p)
      for (int l = 0; l < W; ++l) X[p][l] = src[l][p];
  }
  // Absmax over finite values, and whether the tile holds Inf or NaN (the plain absmax of the
  // bits first: Inf and NaN are above every finite value, and rare).
  cb_vi amax = {};
  for (int p = 0; p < T; ++p) {
    cb_vi b = reinterpret_cast<cb_vi>(X[p]) & 0x7FFFFFFF;
    amax = b > amax ? b : amax;
  }
  cb_vi nonfin = amax >= 0x7F800000;
  if (cb_any(nonfin)) {
    amax = cb_vi{};
    for (int p = 0; p < T; ++p) {
      cb_vi b = reinterpret_cast<cb_vi>(X[p]) & 0x7FFFFFFF;
      cb_vi fin = b >= 0x7F800000 ? 0 : b;
      amax = fin > amax ? fin : amax;
    }
  }
  // The scale exponent s per tile, in int32 lanes: floor(log2(amax)) from amax's bits (a
  // subnormal amax scaled by 2^23 first, exactly: the FPU keeps subnormals, cb_setup).
  cb_vi sexp;
  if (F.floor_mode) {
    const cb_vi sub = amax < 0x00800000;
    const cb_vf af = reinterpret_cast<cb_vf>(amax);
    const cb_vf norm = sub ? af * 0x1p23f : af;
    const cb_vi maxexp = (reinterpret_cast<cb_vi>(norm) >> 23) - 127 - (sub & 23);
    cb_vi st = maxexp - F.emax + F.frac;
    st = st < F.low ? F.low : st;
    st = st > F.high ? F.high : st;
    sexp = (amax > 0 ? st : F.low) - F.frac;
  } else {
    for (int l = 0; l < W; ++l) {
      uint32_t ab = static_cast<uint32_t>(amax[l]);
      float af;
      std::memcpy(&af, &ab, 4);
      sexp[l] = scale_exponent(af, c.f.elem, c.f.scale, c.m.scale_mode);
    }
  }
  // 2^-s and 2^s as float32 bits: biased exponent q, or a subnormal 2^(q - 127) when q <= 0
  // (cb_setup keeps both within float32).
  auto pow2 = [](const cb_vi& q) __attribute__((always_inline)) {
    cb_vi sh = q + 22;
    sh = sh > 31 ? 31 : sh;
    return reinterpret_cast<cb_vf>(q >= 1 ? q << 23 : (cb_vi{} + 1) << sh);
  };
  nonfin |= sexp > F.safe_sexp;  // could overflow: redone by process_tile
  const cb_vf inv32 = pow2(127 - sexp);
  const cb_vf pw32 = pow2(127 + sexp);
  // Per element and mapping: the nearest entry (kept for the output) and its squared error,
  // added to the unit's sum left to right; then the best mapping per unit.
  constexpr int kMaps = MAPS ? MAPS : kCbMaxMaps;
  cb_vi bms[kCbMaxT];
  // Where a mapping's entries fit the lanes (CbVec), the nearest entry is a binary search of
  // log2(half) steps, each one lane permute and one compare, instead of nth compares.
  const bool bsearch = half <= W;
  const cb_vf* tbv = V.tbv;
  // Nearest entries (kept for the output) and squared errors summed in float32 first. Each
  // float32 term is within 3 * 2^-24 of the exact square (a - t exact or rounded once, squared
  // and rounded once; fused into the sum, the square is not rounded at all) and a sequential
  // sum of U <= 256 terms within (U - 1) * 2^-24 of exact, so a float32 sum is within 2^-16 of
  // the exact error, as is the reference's float64 sum. Where
  // two mappings' float32 errors differ by more than 2^-15 of their sum (plus 2^-120 for
  // squares lost to underflow), the exact, the float64 and the float32 orders agree; a unit
  // with any closer (or non-finite) pair is scored again in float64 as the reference scores it.
  auto score32 = [&](int p, cb_vf (&acc)[kMaps]) __attribute__((always_inline)) {
    cb_vf ax = reinterpret_cast<cb_vf>(reinterpret_cast<cb_vi>(X[p]) & 0x7FFFFFFF);
    cb_vf a = ax * inv32;
    for (int m = 0; m < maps; ++m) {
      const float* th = F.th + m * nth;
      const float* tb = F.tab + m * half;
      cb_vf tv = {};
      cb_vi iv = {};
      if (bsearch) {
        // The entry is the count of thresholds <= a: step by half / 2, half / 4, ..., 1,
        // probing threshold iv + step - 1 (the first one a constant).
        iv = a >= th[half / 2 - 1] ? half / 2 : iv;
        int j = 1;
        for (int step = half / 4; step >= 1; step /= 2, ++j)
          iv = a >= __builtin_shuffle(V.thv[m][j], iv) ? iv + step : iv;
        tv = __builtin_shuffle(tbv[m], iv);
      } else {
        for (int k = 0; k < nth; ++k) {
          cb_vi up = a >= th[k];
          tv = up ? tb[k + 1] : tv;
          if (CODES) iv -= up;
        }
      }
      TM[m * T + p] = tv;
      if (CODES) IM[m * T + p] = iv;
      acc[m] = cb_sq_add(acc[m], a - tv);
    }
  };
  // The reference's own arithmetic: d = a64 - t in float64, squares added left to right.
  auto score64 = [&](int p, cb_vd (&acc)[kMaps]) __attribute__((always_inline)) {
    cb_vf ax = reinterpret_cast<cb_vf>(reinterpret_cast<cb_vi>(X[p]) & 0x7FFFFFFF);
    cb_vd a64 = __builtin_convertvector(ax, cb_vd) * __builtin_convertvector(inv32, cb_vd);
    for (int m = 0; m < maps; ++m) {
      cb_vd d = a64 - __builtin_convertvector(TM[m * T + p], cb_vd);
      acc[m] += d * d;
    }
  };
  for (int u = 0; u < units; ++u) {
    const int base = u * U;
    cb_vf acc[kMaps];
    for (int m = 0; m < maps; ++m) acc[m] = cb_vf{};
    for (int p = 0; p < U; ++p) score32(base + p, acc);
    cb_vf best = acc[0];
    cb_vi bm = {}, close = {};
    for (int m = 1; m < maps; ++m) {
      cb_vf err = acc[m];
      cb_vf gap = err - best;
      gap = gap < 0 ? -gap : gap;
      close |= ~(gap > (err + best) * 0x1p-15f + 0x1p-120f) | ~(err < 0x1p100f) |
               ~(best < 0x1p100f);  // NaN compares false: close
      cb_vi better = err < best;
      best = better ? err : best;
      bm = better ? m : bm;
    }
    if (!cb_any(close)) {
      bms[u] = bm;
      continue;
    }
    cb_vd acc64[kMaps];
    for (int m = 0; m < maps; ++m) acc64[m] = cb_vd{};
    for (int p = 0; p < U; ++p) score64(base + p, acc64);
    cb_vd best64 = acc64[0];
    cb_vl bm64 = {};
    for (int m = 1; m < maps; ++m) {
      cb_vd err = acc64[m];
      cb_vl better = err < best64;
      best64 = better ? err : best64;
      bm64 = better ? m : bm64;
    }
    bms[u] = __builtin_convertvector(bm64, cb_vi);
  }
  // Values and codes of the chosen mapping.
  cb_vi* __restrict CD = reinterpret_cast<cb_vi*>(B.codes);
  const cb_vi negzero = F.negzero ? cb_vi{} - 1 : cb_vi{};
  for (int u = 0; u < units; ++u) {
    const cb_vi bm = bms[u];
    for (int p = u * U; p < (u + 1) * U; ++p) {
      cb_vf tv = TM[p];
      cb_vi iv = CODES ? IM[p] : cb_vi{};
      for (int m = 1; m < maps; ++m) {
        cb_vi pick = bm == m;
        tv = pick ? TM[m * T + p] : tv;
        if (CODES) iv = pick ? IM[m * T + p] : iv;
      }
      cb_vu xb = reinterpret_cast<cb_vu>(X[p]);
      cb_vu neg = (xb >> 31) & reinterpret_cast<cb_vu>((tv != 0.0f) | negzero);
      if (VALUES) Y[p] = reinterpret_cast<cb_vf>(reinterpret_cast<cb_vu>(tv * pw32) | (neg << 31));
      if (CODES) CD[p] = reinterpret_cast<cb_vi>(neg << (F.ib - 1)) | iv;
    }
  }
  // Outputs. A full group (W whole tiles) writes its codes, scales and meta with vector
  // transposes; lanes of a partial group, and Inf/NaN tiles (redone by process_tile), lane by
  // lane. Values of a full group in one row are one contiguous run: streamed when F.stream.
  const bool any_nonfin = cb_any(nonfin);
  const bool stream = VALUES && F.stream && full && !any_nonfin;
  float* orow[W];
  for (int l = 0; l < W; ++l) {
    orow[l] = valid[l] == T && VALUES && !stream
                  ? static_cast<float*>(io.values) + row[l] * F.C + col[l] * T
                  : rows + static_cast<size_t>(l) * T;
  }
  if (VALUES) {
    if (T % W == 0) {
      for (int p0 = 0; p0 < T; p0 += W) {
        cb_vf blk[W];
        for (int l = 0; l < W; ++l) blk[l] = Y[p0 + l];
        cb_transpose(blk);
        for (int l = 0; l < W; ++l) cb_store(orow[l] + p0, blk[l]);
      }
    } else {
      for (int p = 0; p < T; ++p)
        for (int l = 0; l < W; ++l) orow[l][p] = Y[p][l];
    }
    if (stream)
      cb_stream_copy(static_cast<float*>(io.values) + row[0] * F.C + col[0] * T, rows,
                     static_cast<int64_t>(W) * T);
  }
  // Codes of whole tiles: each tile's codes (or packed nibble pairs) are a column of CD,
  // transposed W codes at a time and narrowed to bytes.
  typedef uint8_t cb_vb __attribute__((vector_size(W)));
  const bool vec_codes = CODES && (io.codes || F.ib == 4) && T % (io.codes ? W : 2 * W) == 0;
  if (vec_codes) {
    const int per = io.codes ? T : T / 2;  // bytes per tile
    for (int q0 = 0; q0 < per; q0 += W) {
      cb_vf blk[W];
      for (int j = 0; j < W; ++j) {
        const int p = io.codes ? q0 + j : 2 * (q0 + j);
        cb_vi v = io.codes ? CD[p] : (CD[p] & 15) | ((CD[p + 1] & 15) << 4);
        blk[j] = reinterpret_cast<cb_vf>(v);
      }
      cb_transpose(blk);
      for (int l = 0; l < W; ++l) {
        if (valid[l] != T) continue;
        int64_t o = row[l] * F.C + col[l] * T;
        uint8_t* dst = io.codes ? static_cast<uint8_t*>(io.codes) + o : io.packed + o / 2;
        cb_vb b = __builtin_convertvector(reinterpret_cast<cb_vi>(blk[l]), cb_vb);
        std::memcpy(dst + q0, &b, W);
      }
    }
  }
  uint8_t* scale8 = c.scale_w == 1 ? static_cast<uint8_t*>(io.scale) : nullptr;
  const bool vec_tile = t0 + W <= t1;  // W consecutive tiles t0.. (codes may be partial)
  if (vec_tile && scale8) {
    cb_vb sc = __builtin_convertvector(sexp + (F.frac + F.bias), cb_vb);
    std::memcpy(scale8 + t0, &sc, W);
  }
  const bool vec_meta = vec_tile && io.meta && !F.subtiles;
  if (vec_meta) {
    cb_vb mb = __builtin_convertvector(bms[0], cb_vb);
    std::memcpy(io.meta + t0, &mb, W);
  }
  // Nothing left lane by lane in a full group with all of that written.
  const bool lanes_done = full && !any_nonfin && (!CODES || vec_codes) &&
                          (!io.scale || scale8) && (!io.meta || vec_meta);
  for (int l = 0; l < W && !lanes_done; ++l) {
    int n = valid[l];
    if (n == 0) continue;
    int64_t t = t0 + l;
    int64_t o = row[l] * F.C + col[l] * T;
    if (VALUES && n < T) std::memcpy(static_cast<float*>(io.values) + o, orow[l], sizeof(float) * n);
    if (CODES && vec_codes && n == T) {
      // written above
    } else if (CODES && io.codes) {
      uint8_t* dst = static_cast<uint8_t*>(io.codes) + o;
      for (int p = 0; p < n; ++p) dst[p] = static_cast<uint8_t>(CD[p][l]);
    } else if (CODES && F.ib == 4) {  // packed in place: nibble pairs, the tile from a byte on
      uint8_t* dst = io.packed + o / 2;
      int p = 0;
      for (; p + 1 < n; p += 2)
        dst[p / 2] = static_cast<uint8_t>((CD[p][l] & 15) | ((CD[p + 1][l] & 15) << 4));
      if (p < n) dst[p / 2] = static_cast<uint8_t>(CD[p][l] & 15);
    } else if (CODES) {  // packed in place, ib bits each, the tile from a byte on
      const int ib = F.ib;
      uint8_t* dst = io.packed + (o * ib) / 8;
      uint32_t acc = 0;
      int nacc = 0;
      for (int p = 0; p < n; ++p) {
        acc |= (static_cast<uint32_t>(CD[p][l]) & ((1u << ib) - 1u)) << nacc;
        nacc += ib;
        while (nacc >= 8) {
          *dst++ = static_cast<uint8_t>(acc);
          acc >>= 8;
          nacc -= 8;
        }
      }
      if (nacc > 0) *dst = static_cast<uint8_t>(acc);
    }
    if (!(vec_tile && scale8)) {
      uint64_t sc = static_cast<uint64_t>(sexp[l] + F.frac + F.bias);
      if (scale8) scale8[t] = static_cast<uint8_t>(sc);
      else if (io.scale) store_code(io.scale, c.scale_w, t, sc);
    }
    if (io.meta && !vec_meta) {
      if (F.subtiles) {
        for (int u = 0; u < units; ++u) {
          int64_t gc = col[l] * units + u;
          if (gc < F.sub_cols)
            io.meta[row[l] * F.sub_cols + gc] = static_cast<uint8_t>(bms[u][l]);
        }
      } else {
        io.meta[t] = static_cast<uint8_t>(bms[0][l]);
      }
    }
    if (any_nonfin && nonfin[l]) {
      if (CODES && !io.codes) {  // the general path's codes into a buffer, then packed
        uint8_t buf[kCbMaxT];
        QuantizeIO io2 = io;
        io2.codes = buf;
        io2.packed = nullptr;
        Ctx local{c.f, c.m, c.g, io2, c.path, c.key, c.stochastic, c.code_w, c.scale_w,
                  c.zero_w, c.ts, c.nan_f, o, c.meta_base};
        process_tile(local, t, scr);
        pack_range(buf, 1, 0, n, F.ib, io.packed + (o * F.ib) / 8);
      } else {
        process_tile(c, t, scr);
      }
    }
  }
}

template <bool VALUES, bool CODES>
static void cb_groups_t(const CbFast& F, int64_t t0, int64_t t1, CbBuf& B, Scratch& scr) {
  // The common formats (4-bit index, two mappings, 32-element tiles) with constants.
  bool common = F.T == 32 && F.U == 32 && F.nth == 7 && F.maps == 2;
  const CbVec V(F);
  for (int64_t t = t0; t < t1; t += W) {
    if (common) cb_group<VALUES, CODES, 32, 32, 7, 2>(F, V, t, t1, B, scr);
    else cb_group<VALUES, CODES, 0, 0, 0, 0>(F, V, t, t1, B, scr);
  }
#if defined(__x86_64__) && defined(__GNUC__)
  if (VALUES && F.stream) _mm_sfence();  // streamed values visible before the chunk is done
#endif
}

// Tiles [t0, t1), W at a time.
static void cb_groups(const CbFast& F, int64_t t0, int64_t t1, CbBuf& B, Scratch& scr) {
  B.setup(F.T, W, F.maps, F.units);
  bool values = F.c->io.values != nullptr;
  bool codes = F.c->io.codes != nullptr || F.c->io.packed != nullptr;
  if (values && codes) cb_groups_t<true, true>(F, t0, t1, B, scr);
  else if (values) cb_groups_t<true, false>(F, t0, t1, B, scr);
  else cb_groups_t<false, true>(F, t0, t1, B, scr);
}

#endif  // ONNXQ_CB_KERNEL
