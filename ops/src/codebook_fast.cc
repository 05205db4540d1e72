// The codebook fast path's setup and run; its kernel (codebook_kernel.inc) is compiled once per
// instruction set here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "codebook_fast.h"
#include "cpu_features.h"
#include "packing.h"

namespace onnxq::kern {

// Vector arguments of the per-ISA kernels are internal (always inlined): no ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

namespace cb_base {
constexpr int W = 4;
#include "codebook_kernel.inc"  // NOLINT(build/include)
}  // namespace cb_base
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace cb_avx2 {
constexpr int W = 8;
#include "codebook_kernel.inc"  // NOLINT(build/include)
}  // namespace cb_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,prefer-vector-width=512")
namespace cb_avx512 {
constexpr int W = 16;
#include "codebook_kernel.inc"  // NOLINT(build/include)
}  // namespace cb_avx512
#pragma GCC pop_options
#define ONNXQ_CB_X86 1
#endif

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

}  // namespace

// Sets up the codebook fast path; false when it does not apply (the general path runs).
bool cb_setup(const Ctx& c, CbFast* F) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (simd && std::string(simd) == "none") return false;
  // float32 products with subnormal powers of two and the float32 error filter need an FPU
  // that keeps subnormals (no flush-to-zero / denormals-are-zero).
  if (fpu_flushes()) return false;
  if (c.path != kExpBook || !f.codebook() || f.sparse_m || c.stochastic) return false;
  if (c.m.round_mode > kZero || c.m.scale_mode == kSSearch) return false;
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
void cb_run(const CbFast& F, const ParallelFor& pf) {
  const CbGroups groups = cb_pick();
  constexpr int64_t kPer = 256;  // tiles per chunk (a multiple of every W)
  int64_t chunks = (F.tiles + kPer - 1) / kPer;
  pf(chunks, [&](int64_t c0, int64_t c1) {
    CbBuf buf;
    Scratch scr;
    groups(F, c0 * kPer, std::min(F.tiles, c1 * kPer), buf, scr);
  });
}

}  // namespace onnxq::kern
