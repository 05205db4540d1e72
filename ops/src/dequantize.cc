// dequantize(): codes, scales and meta back to values (the fast paths first, then the general
// path tile by tile with the reference's arithmetic).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dequantize_fast.h"
#include "quant_internal.h"

namespace onnxq {

using namespace kern;  // NOLINT(build/namespaces)

namespace {

// The general path's view of one dequantize: unpacked codes and meta, code widths, the tensor
// scale and the element decode table.
struct DqCtx {
  DqCtx(const Format& f_, const Geometry& g_, const DequantizeIO& io_) : f(f_), g(g_), io(io_) {}
  const Format& f;
  const Geometry& g;
  const DequantizeIO& io;
  int code_w = 1, scale_w = 1, zero_w = 1;
  float ts = 0.0f, nan_f = 0.0f;
  std::vector<double> table;  // decode_codes' table for codes of <= 16 bits
  double decode(uint64_t code) const {
    if (!table.empty()) return table[code & (table.size() - 1)];
    return f.elem.decode(code);
  }
};

// Codes and meta unpacked into the buffers where io holds them packed (the general path reads
// them one per element / unit); "" or an error.
std::string unpack_inputs(const Format& f, const Geometry& g, const ParallelFor& pf, int code_w,
                          DequantizeIO* io, std::vector<uint8_t>* codes_buf,
                          std::vector<uint8_t>* meta_buf) {
  if (!io->codes) {
    if (!io->packed) return "dequantizing needs the codes";
    codes_buf->resize(static_cast<size_t>(g.size * code_w));
    unpack_bits(io->packed, f.code_bits(), g.size, io->mask, codes_buf->data(), code_w, &pf);
    io->codes = codes_buf->data();
  }
  if (!io->meta && io->meta_packed && f.scaled && f.has_meta()) {
    int64_t nmeta = g.meta_count();
    meta_buf->resize(static_cast<size_t>(nmeta));
    unpack_bits(io->meta_packed, f.meta_bits(), nmeta, nullptr, meta_buf->data(), 1, &pf);
    io->meta = meta_buf->data();
  }
  return "";
}

// An unscaled data type: elementwise.
void dequantize_unscaled(const DqCtx& d, const ParallelFor& pf) {
  const Geometry& g = d.g;
  const DequantizeIO& io = d.io;
  pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
    int64_t end = std::min(g.size, c1 * kChunk);
    for (int64_t i = c0 * kChunk; i < end; ++i) {
      float y = static_cast<float>(d.decode(load_code(io.codes, d.code_w, i)));
      if (io.mask && !io.mask[i]) y = 0.0f;
      store_y(io.values, io.values_type, i, y);
    }
  });
}

// A tile's scale as the general path applies it: the exponent (exponent scales) or the float
// scale, its product with the tensor scale and the zero point; NaN tiles decode to NaN.
struct DqTileScale {
  bool exp_scale = false, nan_tile = false;
  int sexp = 0;
  float sc = 0.0f, eff = 0.0f;
  double zp = 0.0;  // int zero points: exact (the difference q - zp is rounded once)
};

DqTileScale dq_tile_scale(const DqCtx& d, int64_t gi) {
  const Format& f = d.f;
  DqTileScale s;
  uint64_t sc_code = load_code(d.io.scale, d.scale_w, gi);
  s.exp_scale = f.scale.kind == kExponent;
  if (s.exp_scale) {
    s.sexp = static_cast<int>(sc_code) - f.scale.bias - int_frac_bits(f.elem);
    s.nan_tile = sc_code == (1ull << f.scale.ebits) - 1;
    if (s.nan_tile) s.sexp = 0;
  } else {
    s.sc = static_cast<float>(f.scale.decode(sc_code));
    s.nan_tile = std::isnan(s.sc);
    s.eff = f.has_ts ? s.sc * d.ts : s.sc;
    if (f.has_zero) s.zp = f.zero.decode(load_code(d.io.zero, d.zero_w, gi));
  }
  return s;
}

// Tile t of a tiled tensor, element by element.
void dequantize_tile(const DqCtx& d, int64_t t) {
  const Format& f = d.f;
  const Geometry& g = d.g;
  const DequantizeIO& io = d.io;
  int64_t Tr = g.Tr, Tc = g.Tc;
  int64_t sub_rows = g.sub_rows(), sub_cols = g.sub_cols();
  int64_t b = t / (g.nR * g.nC), rt = (t / g.nC) % g.nR, ct = t % g.nC;
  int64_t gi = g.kind == 0 ? 0 : g.grid(b, rt, ct, g.nR, g.nC);
  const DqTileScale s = dq_tile_scale(d, gi);
  double pw = pow2(s.sexp);
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
      uint64_t code = load_code(io.codes, d.code_w, o);
      float y;
      if (s.exp_scale) {
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
          q = d.decode(code);
        }
        double yy = q * pw;
        if (g.Sc && !f.codebook()) yy = yy * pow2(-meta);
        y = s.nan_tile ? d.nan_f : static_cast<float>(yy);
      } else {
        double q64 = d.decode(code);
        float q = static_cast<float>(q64);
        if (f.has_zero) {
          y = f.zero.kind == kFloat ? q * s.sc + static_cast<float>(s.zp)
                                    : static_cast<float>(q64 - s.zp) * s.sc;
        } else {
          y = q * s.eff;
        }
        if (s.nan_tile) y = d.nan_f;
      }
      if (io.mask && !io.mask[o]) y = 0.0f;
      store_y(io.values, io.values_type, o, y);
    }
  }
}

// One tile covering the tensor in memory order: split by chunks of elements.
void dequantize_one_scale(const DqCtx& d, const ParallelFor& pf) {
  const Format& f = d.f;
  const Geometry& g = d.g;
  const DequantizeIO& io = d.io;
  pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
    int64_t begin = c0 * kChunk, end = std::min(g.size, c1 * kChunk);
    uint64_t sc_code = load_code(io.scale, d.scale_w, 0);
    bool exp_scale = f.scale.kind == kExponent;
    for (int64_t o = begin; o < end; ++o) {
      uint64_t code = load_code(io.codes, d.code_w, o);
      float y;
      if (exp_scale) {
        bool nan_tile = sc_code == (1ull << f.scale.ebits) - 1;
        int sexp = nan_tile ? 0 : static_cast<int>(sc_code) - f.scale.bias - int_frac_bits(f.elem);
        double q;
        if (f.codebook()) {
          size_t w = size_t(1) << f.cb_ib;
          q = f.table[static_cast<size_t>(io.meta[0]) * w + (code & (w - 1))];
        } else {
          q = d.decode(code);
        }
        y = nan_tile ? d.nan_f : static_cast<float>(q * pow2(sexp));
      } else {
        float sc = static_cast<float>(f.scale.decode(sc_code));
        double q64 = d.decode(code);
        float q = static_cast<float>(q64);
        if (f.has_zero) {
          double zp = f.zero.decode(load_code(io.zero, d.zero_w, 0));
          y = f.zero.kind == kFloat ? q * sc + static_cast<float>(zp)
                                    : static_cast<float>(q64 - zp) * sc;
        } else {
          y = q * sc;
        }
        if (std::isnan(sc)) y = d.nan_f;
      }
      if (io.mask && !io.mask[o]) y = 0.0f;
      store_y(io.values, io.values_type, o, y);
    }
  });
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
  e = unpack_inputs(f, g, pf, code_w, &io, &codes_buf, &meta_buf);
  if (!e.empty()) return e;
  DqCtx d(f, g, io);
  d.code_w = code_w;
  const Num& n = f.elem;
  if (!f.codebook() && n.bits <= 16) {
    d.table.resize(size_t(1) << n.bits);
    for (size_t cd = 0; cd < d.table.size(); ++cd) d.table[cd] = n.decode(cd);
  }
  d.nan_f = from_fbits(kQuietNaN);
  if (!f.scaled) {
    dequantize_unscaled(d, pf);
    return "";
  }
  if (!io.scale) return "dequantizing needs the scale tensor";
  if (f.has_zero && !io.zero) return "dequantizing needs the zero point tensor";
  if (f.has_ts && !io.tenscale) return "dequantizing needs the tensor scale";
  if (f.has_meta() && !io.meta) return "dequantizing needs the meta tensor";
  d.scale_w = code_width(f.scale.bits);
  d.zero_w = f.has_zero ? code_width(f.zero.bits) : 1;
  if (f.has_ts)
    d.ts = static_cast<float>(f.ts.decode(load_code(io.tenscale, code_width(f.ts.bits), 0)));
  if (g.kind == 0) {
    dequantize_one_scale(d, pf);
    return "";
  }
  pf(g.tiles(), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) dequantize_tile(d, t);
  });
  return "";
}

}  // namespace onnxq
