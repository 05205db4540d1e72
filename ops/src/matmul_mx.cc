// MatMulMX (matmul_mx.h): the plan of one product (which decode, its tables), the choice between
// the fused decode and a whole decode of B, the instruction set, and the split into tasks.
#include "matmul_mx.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "quant_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace onnxq {

using namespace kern;  // NOLINT(build/namespaces)

namespace {

// Vector arguments of the per-ISA kernels are internal (always inlined or static): no ABI.
#pragma GCC diagnostic ignored "-Wpsabi"

// How an element decodes (the general path's arithmetic, dequantize.cc, in float32):
// kMmxScale q * f (exponent scales: f = 2^s, a normal float32, so the one float32 rounding is
// the general path's rounding of its exact float64 product; float scales: f = scale x tensor
// scale, float32 as there), kMmxShift q * (shifted ? 2^(s-1) : 2^s) (MX9/MX6 shift bits),
// kMmxZeroInt (q - zero) * scale, kMmxZeroFloat q * scale + zero.
enum MmxMode : int { kMmxScale, kMmxShift, kMmxZeroInt, kMmxZeroFloat };
constexpr int64_t kMmxBlock = 64;  // columns of a block of the vector path (and the prepack)

struct MmxPlan {
  const float* a = nullptr;
  int64_t M = 0, K = 0, N = 0, kb = 128;
  const float* bias = nullptr;
  float* y = nullptr;
  const float* bfull = nullptr;  // B decoded whole (formats the fused decode does not cover)
  const uint8_t* q = nullptr;    // the packed codes
  int64_t qbytes = 0;
  int bits = 8, mode = kMmxScale;
  int64_t Tc = 1, Sc = 1;
  const uint8_t* scale8 = nullptr;
  const uint16_t* scale16 = nullptr;
  bool half = false;   // scale16 holds IEEE halves and fac0 is their value (a conversion)
  bool zcode = false;  // zval[c] == c for every code
  const uint8_t* zero8 = nullptr;
  const uint8_t* meta = nullptr;  // shift bits, packed: bit (k / Sc) * N + n
  const float* fac0 = nullptr;    // factor per scale code
  const float* fac1 = nullptr;    // shifted factor per scale code (kMmxShift)
  const float* zval = nullptr;    // zero point per zero code
  float tq[256] = {};             // element value per code
  // The vector path's view: row k of column block b at vq + b * vq_block + k * vq_row; the
  // scale (zero) code of tile row t, block b, column j at b * vs_block + t * vs_row + j.
  const uint8_t* vq = nullptr;
  int64_t vq_row = 0, vq_block = 0, vs_row = 0, vs_block = 0;
  const void* vs = nullptr;
  const uint8_t* vz = nullptr;
  bool split = false;     // 4-bit rows as mmx_prepack writes them (column j and j + 32 a byte)
  bool prefetch = false;  // B's own layout: prefetch the codes ahead
  bool vec = true;        // the view above is valid (a transposed B: only when prepacked)
  // trans_b: q, scale, zero and meta are W = B^T's ([N, K]): element (k, n) at n * K + k, the
  // scale (zero) code of tile t of column n at n * nK + t, the shift bit of (k, n) at
  // n * msub + k / Sc.
  bool trans = false;
  int64_t nK = 1, msub = 0;
  // E8M0 scales without shift bits whose codes are all normal powers of two or the NaN code
  // (plan_decode checked them): fac0[c] is the float with exponent field c + e8_off, or NaN for
  // code 255, computed in the vector path instead of gathered from the table.
  bool e8 = false;
  int e8_off = 0;
};

#define MMX_ISA 0
namespace mmx_base {
#include "matmul_mx_kernel.inc"  // NOLINT(build/include)
}  // namespace mmx_base

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")
#undef MMX_ISA
#define MMX_ISA 1
namespace mmx_avx2 {
#include "matmul_mx_kernel.inc"  // NOLINT(build/include)
}  // namespace mmx_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2")
#undef MMX_ISA
#define MMX_ISA 2
namespace mmx_avx512 {
#include "matmul_mx_kernel.inc"  // NOLINT(build/include)
}  // namespace mmx_avx512
#pragma GCC pop_options
#define ONNXQ_MMX_X86 1
#endif
#undef MMX_ISA

struct MmxIsa {
  int nb;
  void (*task)(const MmxPlan&, int64_t, int64_t, int64_t, int64_t);
};

// The kernels for this CPU; ONNXQ_SIMD caps the level (none: the baseline kernel, with B
// decoded whole by dequantize(), which then takes its general path).
MmxIsa pick_isa() {
#ifdef ONNXQ_MMX_X86
  const char* simd = std::getenv("ONNXQ_SIMD");
  if (!(simd && std::string(simd) == "none")) {
    switch (simd_level(false)) {
      case 2: return {mmx_avx512::kNB, mmx_avx512::mmx_task};
      case 1: return {mmx_avx2::kNB, mmx_avx2::mmx_task};
      default: break;
    }
  }
#endif
  return {mmx_base::kNB, mmx_base::mmx_task};
}

bool simd_none() {
  const char* simd = std::getenv("ONNXQ_SIMD");
  return simd && std::string(simd) == "none";
}

// The tables of the fused decode (element values, factors per scale code, zero points).
struct MmxTables {
  float tq[256];
  std::vector<float> fac0, fac1, zval;
};

// Fills the tables and the plan's decode fields; false: the fused decode does not cover this
// format or these codes (a scale code whose power of two is no normal float32, an element
// value that is no float32).
// The element values per code as float32; false when one is not exact in float32.
bool element_table(const Num& n, float* tq) {
  bool exact = true;
  for (uint32_t c = 0; c < 256; ++c) {
    double v = c < (1u << n.bits) ? n.decode(c) : 0.0;
    tq[c] = static_cast<float>(v);
    exact = exact && (std::isnan(v) || static_cast<double>(tq[c]) == v);
  }
  return exact;
}

bool plan_decode(const Format& f, const Geometry& g, const DequantizeIO& io,
                 const MmxScales& scales, bool scales_checked, MmxTables* t, MmxPlan* p) {
  const std::vector<float>& scale_values = scales.values;
  const Num& n = f.elem;
  if (scales.elem_ready) {  // made once per node
    if (!scales.elem_exact) return false;
    std::memcpy(t->tq, scales.elem, sizeof t->tq);
  } else if (!element_table(n, t->tq)) {
    return false;
  }
  std::memcpy(p->tq, t->tq, sizeof t->tq);
  const int64_t nscale = g.scale_count();
  if (f.scale.kind == kExponent) {
    if (f.has_zero || f.has_ts || f.scale.bits > 8) return false;
    const bool shift = g.Sc > 0;
    const uint32_t nan_code = (1u << f.scale.ebits) - 1;
    t->fac0.assign(256, 0.0f);
    t->fac1.assign(256, 0.0f);
    std::vector<uint8_t> ok(256, 0);
    for (uint32_t c = 0; c < 256; ++c) {
      int s = static_cast<int>(c) - f.scale.bias - int_frac_bits(n);
      int lo = shift ? s - 1 : s;
      if (c == nan_code) {
        t->fac0[c] = t->fac1[c] = from_fbits(kQuietNaN);
        ok[c] = 1;
      } else if (lo >= -126 && s <= 127) {
        t->fac0[c] = from_fbits(static_cast<uint32_t>(s + 127) << 23);
        t->fac1[c] = from_fbits(static_cast<uint32_t>(lo + 127) << 23);
        ok[c] = 1;
      }
    }
    const uint8_t* sc = static_cast<const uint8_t*>(io.scale);
    if (!scales_checked) {  // (a constant Scale was checked once, by mmx_prepack)
      for (int64_t i = 0; i < nscale; ++i)
        if (!ok[sc[i]]) return false;
    }
    p->scale8 = sc;
    p->mode = shift ? kMmxShift : kMmxScale;
    p->e8 = !shift && f.scale.bits == 8 && nan_code == 255;
    p->e8_off = 127 - f.scale.bias - int_frac_bits(n);
    if (shift) {
      if (g.Sr != 1 || f.meta_bits() != 1 || !io.meta_packed) return false;
      p->meta = io.meta_packed;
      p->Sc = g.Sc;
      p->fac1 = t->fac1.data();
    }
    p->fac0 = t->fac0.data();
    return true;
  }
  if (f.scale.kind != kFloat || g.Sc > 0) return false;
  const size_t ncodes = size_t(1) << f.scale.bits;
  if (f.scale.bits > 16 || scale_values.size() != ncodes) return false;
  if (f.has_zero) {
    if (f.zero.bits > 8 || !io.zero) return false;
    t->zval.assign(256, 0.0f);
    for (uint32_t c = 0; c < (1u << f.zero.bits); ++c)
      t->zval[c] = static_cast<float>(f.zero.decode(c));
    p->zero8 = static_cast<const uint8_t*>(io.zero);
    p->zval = t->zval.data();
    p->zcode = true;  // every zero point is its code (uint8 zero points): converted, no lookup
    for (uint32_t c = 0; c < 256; ++c) p->zcode = p->zcode && t->zval[c] == static_cast<float>(c);
    p->mode = f.zero.kind == kFloat ? kMmxZeroFloat : kMmxZeroInt;
    t->fac0 = scale_values;  // the general path: (q - zero) * scale, no tensor scale
  } else {
    float ts = 1.0f;
    if (f.has_ts)
      ts = static_cast<float>(f.ts.decode(load_code(io.tenscale, code_width(f.ts.bits), 0)));
    if (f.has_ts && ncodes > 256) return false;
    t->fac0.resize(ncodes);
    for (size_t c = 0; c < ncodes; ++c)
      t->fac0[c] = f.has_ts ? scale_values[c] * ts : scale_values[c];
    p->mode = kMmxScale;
  }
  p->fac0 = t->fac0.data();
  if (f.scale.bits <= 8) {
    if (t->fac0.size() < 256) t->fac0.resize(256, 0.0f);  // codes are masked by their width
    p->fac0 = t->fac0.data();
    p->scale8 = static_cast<const uint8_t*>(io.scale);
  } else {
    p->scale16 = static_cast<const uint16_t*>(io.scale);
    p->half = scales.ieee_half;
  }
  return true;
}

}  // namespace

MmxScales mmx_scale_values(const Format& f) {
  MmxScales out;
  if (f.elem.bits <= 8) {
    out.elem_exact = element_table(f.elem, out.elem);
    out.elem_ready = true;
  }
  if (!f.scaled || f.scale.kind != kFloat || f.scale.bits > 16) return out;
  out.values.resize(size_t(1) << f.scale.bits);
  bool half = f.scale.bits == 16;
  for (size_t c = 0; c < out.values.size(); ++c) {
    out.values[c] = static_cast<float>(f.scale.decode(c));
    if (half) {
      float h = half_to_float(static_cast<uint16_t>(c));
      half = fbits(h) == fbits(out.values[c]) || (std::isnan(h) && std::isnan(out.values[c]));
    }
  }
  out.ieee_half = half;
  return out;
}

namespace {

// Block bl of B's own layout ([K, N] tiled along K) into the prepacked one.
void prepack_block(const Format& f, int64_t K, int64_t N, int64_t nK, int64_t bl,
                   const DequantizeIO& b, int64_t sw, MmxPrepacked* out) {
  const int64_t rb = kMmxBlock * f.elem.bits / 8;
  for (int64_t k = 0; k < K; ++k) {
    const uint8_t* src = b.packed + (k * N + bl * kMmxBlock) * f.elem.bits / 8;
    uint8_t* dst = &out->q[(bl * K + k) * rb];
    if (f.elem.bits == 8) {
      std::memcpy(dst, src, static_cast<size_t>(rb));
      continue;
    }
    // 4-bit: byte j holds column j (low nibble) and column j + 32 (high nibble), so that
    // the kernel's table permute reads each byte as the index of column j and, shifted right
    // by 4, of column j + 32 (mmx_row512): no interleaving.
    auto code = [&](int64_t c) { return (src[c / 2] >> (4 * (c % 2))) & 0xF; };
    for (int64_t j = 0; j < 32; ++j) dst[j] = static_cast<uint8_t>(code(j) | code(j + 32) << 4);
  }
  const uint8_t* sc = static_cast<const uint8_t*>(b.scale);
  const uint8_t* z = static_cast<const uint8_t*>(b.zero);
  for (int64_t t = 0; t < nK; ++t) {
    std::memcpy(&out->scale[(bl * nK + t) * kMmxBlock * sw], sc + (t * N + bl * kMmxBlock) * sw,
                static_cast<size_t>(kMmxBlock * sw));
    if (z)
      std::memcpy(&out->zero[(bl * nK + t) * kMmxBlock], z + t * N + bl * kMmxBlock,
                  static_cast<size_t>(kMmxBlock));
  }
}

// Block bl from W = B^T ([N, K] tiled along K, trans_b): column n of B is W's row n, the scale
// (zero) code of its tile t at W's grid position (n, t). The same layout as prepack_block.
void prepack_block_t(const Format& f, int64_t K, int64_t nK, int64_t bl, const DequantizeIO& b,
                     int64_t sw, MmxPrepacked* out) {
  const int64_t rb = kMmxBlock * f.elem.bits / 8, n0 = bl * kMmxBlock;
  uint8_t* dst = &out->q[bl * K * rb];
  if (f.elem.bits == 8) {
    for (int64_t j = 0; j < kMmxBlock; ++j) {
      const uint8_t* row = b.packed + (n0 + j) * K;
      for (int64_t k = 0; k < K; ++k) dst[k * rb + j] = row[k];
    }
  } else {  // 4-bit: byte j of row k holds columns j and j + 32 (see prepack_block)
    auto code = [&](int64_t n, int64_t k) {
      const int64_t e = n * K + k;
      return (b.packed[e / 2] >> (4 * (e % 2))) & 0xF;
    };
    for (int64_t j = 0; j < 32; ++j)
      for (int64_t k = 0; k < K; ++k)
        dst[k * rb + j] = static_cast<uint8_t>(code(n0 + j, k) | code(n0 + j + 32, k) << 4);
  }
  const uint8_t* sc = static_cast<const uint8_t*>(b.scale);
  const uint8_t* z = static_cast<const uint8_t*>(b.zero);
  for (int64_t t = 0; t < nK; ++t) {
    uint8_t* ds = &out->scale[(bl * nK + t) * kMmxBlock * sw];
    for (int64_t j = 0; j < kMmxBlock; ++j) {
      std::memcpy(ds + j * sw, sc + ((n0 + j) * nK + t) * sw, static_cast<size_t>(sw));
      if (z) out->zero[(bl * nK + t) * kMmxBlock + j] = z[(n0 + j) * nK + t];
    }
  }
}

}  // namespace

void mmx_prepack(const Format& f, const std::vector<int64_t>& bshape, int axis,
                 const DequantizeIO& b, int64_t q_bytes, int64_t scale_bytes,
                 int64_t zero_bytes, MmxPrepacked* out, bool trans_b) {
  *out = MmxPrepacked();
  if (!matmul_mx_fused(f, bshape, axis, trans_b) || (f.elem.bits != 4 && f.elem.bits != 8))
    return;
  if (f.sub[1] > 0 || !b.packed || !b.scale || (f.has_zero && !b.zero)) return;
  Geometry g;
  if (!make_geometry(f, bshape, axis, &g).empty() || g.kind != 1) return;
  const int64_t K = bshape[trans_b ? 1 : 0], N = bshape[trans_b ? 0 : 1], nK = g.nC;
  const int64_t blocks = N / kMmxBlock, rb = kMmxBlock * f.elem.bits / 8;
  const int64_t sw = code_width(f.scale.bits);
  // (B's own rows must start on a byte to be copied; W's codes are read one by one.)
  if (blocks == 0 || (!trans_b && (N * f.elem.bits) % 8) || sw > 2) return;
  if (q_bytes != packed_nbytes(K * N, f.elem.bits) || scale_bytes != nK * N * sw) return;
  if (f.has_zero && (code_width(f.zero.bits) != 1 || zero_bytes != nK * N)) return;
  out->q.resize(static_cast<size_t>(blocks * K * rb));
  out->scale.resize(static_cast<size_t>(blocks * nK * kMmxBlock * sw));
  if (f.has_zero) out->zero.resize(static_cast<size_t>(blocks * nK * kMmxBlock));
  for (int64_t bl = 0; bl < blocks; ++bl) {
    if (trans_b) {
      prepack_block_t(f, K, nK, bl, b, sw, out);
    } else {
      prepack_block(f, K, N, nK, bl, b, sw, out);
    }
  }
  out->ready = true;
  // Exponent scales: whether every code's power of two is a normal float32 (else matmul_mx
  // decodes B whole), found once here instead of on every Run.
  if (f.scale.kind == kExponent) {
    MmxTables t;
    MmxPlan p;
    out->scales_ok = plan_decode(f, g, b, MmxScales(), false, &t, &p);
  }
}

bool matmul_mx_fused(const Format& f, const std::vector<int64_t>& bshape, int axis,
                     bool trans_b) {
  if (bshape.size() != 2 || axis != (trans_b ? 1 : 0)) return false;
  if (!f.scaled || f.codebook() || f.sparse_m || f.ntiles != 1) return false;
  if (f.elem.kind != kFloat && f.elem.kind != kInt && f.elem.kind != kUint) return false;
  if (f.elem.bits > 8) return false;
  if (f.scale.kind == kExponent) return !f.has_zero && !f.has_ts && f.scale.bits <= 8;
  if (f.scale.kind != kFloat || f.sub[1] > 0 || f.scale.bits > 16) return false;
  if (f.has_zero) return f.zero.bits <= 8;
  return !f.has_ts || f.scale.bits <= 8;
}

std::string matmul_mx(const Format& f, const std::vector<int64_t>& bshape, int axis,
                      const MatMulIO& io, const MmxScales& scales, const ParallelFor& pf) {
  const bool tb = io.trans_b;
  if (bshape.size() != 2) return tb ? "W must have 2 dims [N, K]" : "B must have 2 dims [K, N]";
  MmxPlan p;
  p.a = io.a;
  p.M = io.M;
  p.K = bshape[tb ? 1 : 0];
  p.N = bshape[tb ? 0 : 1];
  p.trans = tb;
  p.bias = io.bias;
  p.y = io.y;
  if (p.M <= 0) return "";
  Geometry g;
  std::string e = make_geometry(f, bshape, axis, &g);
  if (!e.empty()) return e;
  MmxTables t;
  std::vector<float> whole;
  bool fused = !simd_none() && matmul_mx_fused(f, bshape, axis, tb) && io.b.packed &&
               !io.b.mask && g.kind == 1 &&
               plan_decode(f, g, io.b, scales, io.pre && io.pre->scales_ok, &t, &p);
  if (fused) {
    p.q = io.b.packed;
    p.bits = f.elem.bits;
    p.qbytes = packed_nbytes(g.size, f.elem.bits);
    p.Tc = g.Tc;
    p.nK = g.nC;
    p.msub = g.Sc > 0 ? (p.K + g.Sc - 1) / g.Sc : 0;
  } else {
    whole.resize(static_cast<size_t>(p.K * p.N));
    DequantizeIO d = io.b;
    d.values = whole.data();
    d.values_type = kF32;
    e = dequantize(f, bshape, axis, d, pf);
    if (!e.empty()) return e;
    p.bfull = whole.data();
  }
  if (fused) {
    const int64_t rb = kMmxBlock * p.bits / 8;
    const bool pre = io.pre && io.pre->ready;
    p.vq = pre ? io.pre->q.data() : p.q;
    p.vq_row = pre ? rb : p.N * p.bits / 8;
    p.vq_block = pre ? p.K * rb : rb;
    p.vs_row = pre ? kMmxBlock : p.N;
    p.vs_block = pre ? ((p.K + p.Tc - 1) / p.Tc) * kMmxBlock : kMmxBlock;
    p.vs = pre ? static_cast<const void*>(io.pre->scale.data())
               : p.scale16 ? static_cast<const void*>(p.scale16) : static_cast<const void*>(p.scale8);
    p.vz = pre && p.zero8 ? io.pre->zero.data() : p.zero8;
    p.split = pre && p.bits == 4;
    p.prefetch = !pre;
    p.vec = pre || !tb;  // W's own layout has no view by columns of B
  }
  const MmxIsa isa = pick_isa();
  p.kb = std::min<int64_t>(p.K, 128);
  const int64_t nblocks = (p.N + isa.nb - 1) / isa.nb;
  const int64_t mrows = 64, mchunks = (p.M + mrows - 1) / mrows;
  // Items: (row chunk, column block); a task's run of items is one or two column ranges.
  pf(nblocks * mchunks, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1;) {
      const int64_t mc = t / nblocks, b0 = t % nblocks;
      const int64_t b1 = std::min(nblocks, b0 + (t1 - t));
      isa.task(p, b0, b1, mc * mrows, std::min(p.M, (mc + 1) * mrows));
      t += b1 - b0;
    }
  });
  return "";
}

}  // namespace onnxq
