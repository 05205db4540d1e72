// Data types and tile geometry as the kernels need them (make_format, to_format, make_geometry).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "parse.h"

namespace onnxq {

int64_t Geometry::grid(int64_t b, int64_t r, int64_t c, int64_t rows, int64_t cols) const {
  int64_t m, postp;
  if (kind == 1) {
    m = r;
    postp = Post;
  } else {
    m = b * rows + r;
    postp = Post == 1 ? 1 : Post / R * rows;
  }
  return (m / postp) * cols * postp + c * postp + m % postp;
}

std::string make_format(const onnxq_format& in, Format* out) {
  Format f;
  auto num = [](const onnxq_number& src, Num* dst, const char* what) -> std::string {
    dst->kind = src.kind;
    dst->ebits = src.ebits;
    dst->mbits = src.mbits;
    dst->bias = src.bias;
    dst->infnan = src.infnan;
    std::string e = dst->derive();
    return e.empty() ? e : std::string(what) + ": " + e;
  };
  std::string e = num(in.elem, &f.elem, "element");
  if (!e.empty()) return e;
  f.scaled = in.scaled != 0;
  if (f.scaled) {
    if (!(e = num(in.scale, &f.scale, "scale")).empty()) return e;
    if (f.scale.kind != kFloat && f.scale.kind != kExponent)
      return "the scale must be a float or exponent type";
    if (f.scale.kind == kExponent && f.scale.ebits > 10)
      return "exponent scales of more than 10 bits are not supported";
    f.has_zero = in.has_zero != 0;
    if (f.has_zero && !(e = num(in.zero, &f.zero, "zero point")).empty()) return e;
    f.has_ts = in.has_tenscale != 0;
    if (f.has_ts && !(e = num(in.tenscale, &f.ts, "tensor scale")).empty()) return e;
    if (in.ntiles < 0 || in.ntiles > 2) return "at most two tile dimensions";
    f.ntiles = in.ntiles;
    for (int i = 0; i < 2; ++i) {
      f.tile[i] = in.tile[i];
      f.sub[i] = in.sub[i];
      if (f.tile[i] < 0 || f.sub[i] < 0) return "negative tile size";
    }
    f.sparse_n = in.sparse_n;
    f.sparse_m = in.sparse_m;
    f.sparse_dim = in.sparse_dim;
    if (f.sparse_m && (f.sparse_m > 16 || f.sparse_n < 1 || f.sparse_n >= f.sparse_m))
      return "N:M sparsity needs 1 <= N < M <= 16";
    if (f.has_zero && f.elem.kind != kUint) return "a zero point is only for uint data";
    if (!f.has_zero && f.elem.kind == kUint) return "uint data needs a zero point";
    if (f.has_zero && f.scale.kind == kExponent) return "zero points need a float scale";
  } else if (f.elem.kind != kFloat) {
    return "only float formats can be unscaled";
  }
  if (in.cb_index_bits) {
    f.cb_ib = in.cb_index_bits;
    f.cb_mb = in.cb_meta_bits;
    if (f.cb_ib < 2 || f.cb_ib > 8 || f.cb_mb < 0 || f.cb_mb > 4)
      return "codebook index_bits 2..8 and meta_bits 0..4";
    if (!f.scaled || f.scale.kind != kExponent) return "codebooks need an exponent scale";
    if (f.elem.kind != kFloat) return "a codebook's compute type must be a float format";
    size_t maps = size_t(1) << f.cb_mb, half = size_t(1) << (f.cb_ib - 1);
    if (!in.cb_table) return "a codebook needs its table";
    f.table.assign(in.cb_table, in.cb_table + maps * 2 * half);
    if (in.cb_mags) {
      f.mags.assign(in.cb_mags, in.cb_mags + maps * half);
    } else {
      f.mags.resize(maps * half);
      for (size_t m = 0; m < maps; ++m)
        for (size_t i = 0; i < half; ++i) f.mags[m * half + i] = f.table[m * 2 * half + i];
    }
    if (in.cb_even) {
      f.even.assign(in.cb_even, in.cb_even + maps * half);
    } else {
      f.even.resize(maps * half);
      for (size_t i = 0; i < f.mags.size(); ++i) {
        uint64_t code = encode_value(f.mags[i], f.elem);
        f.even[i] = (code % 2 == 0) ? 1 : 0;
      }
    }
  } else if (f.scaled && f.sub[1] && !(f.elem.kind == kInt && f.scale.kind == kExponent)) {
    return "a subtile needs int elements with an exponent scale (mx6) or a codebook";
  }
  *out = std::move(f);
  return "";
}

std::string make_geometry(const Format& f, const std::vector<int64_t>& shape, int axis,
                          Geometry* out) {
  Geometry g;
  int ndim = static_cast<int>(shape.size());
  if (ndim < 1) return "a tensor of at least 1 dim is needed";
  if (axis < -ndim || axis >= ndim) {
    return "axis " + std::to_string(axis) + " is out of range for a " + std::to_string(ndim) +
           "-D tensor";
  }
  if (axis < 0) axis += ndim;
  // At most 2^48 elements (more than any memory holds): sizes in bits and bytes stay in int64.
  constexpr int64_t kMaxSize = int64_t(1) << 48;
  g.size = 1;
  for (int64_t d : shape) {
    if (d < 0) return "negative dimension";
    if (d > 0 && g.size > kMaxSize / d) return "more than 2^48 elements";
    g.size *= d;
  }
  g.A = shape[axis];
  g.Post = 1;
  for (int i = axis + 1; i < ndim; ++i) g.Post *= shape[i];
  if (!f.scaled || f.ntiles == 0) {
    g.kind = 0;
    g.C = g.size;
    g.Tc = g.size;
  } else if (f.ntiles == 1) {
    g.kind = 1;
    g.C = g.A;
    g.R = g.C ? g.size / g.C : 0;
    g.Tc = f.tile[0] ? f.tile[0] : g.C;
    g.Sc = f.sub[1];
    g.Sr = g.Sc ? 1 : 0;
    g.nR = g.R;
  } else {
    if (ndim < 2) return "2-D tiles need a tensor of at least 2 dims";
    g.kind = 2;
    g.C = g.A;
    g.R = axis == ndim - 1 ? shape[ndim - 2] : shape[ndim - 1];
    g.B = (g.R * g.C) != 0 ? g.size / (g.R * g.C) : 0;
    g.Tr = f.tile[0] ? f.tile[0] : g.R;
    g.Tc = f.tile[1] ? f.tile[1] : g.C;
    g.Sr = f.sub[0];
    g.Sc = f.sub[1];
    if (g.Sc && (g.Tr % g.Sr || g.Tc % g.Sc)) return "subtiles must divide the tile";
    g.nR = g.Tr ? (g.R + g.Tr - 1) / g.Tr : 0;
  }
  if (g.Tc <= 0) g.Tc = 1;
  if (g.Tr <= 0) g.Tr = 1;
  g.nC = (g.C + g.Tc - 1) / g.Tc;
  if (g.kind == 1 && g.Sc && g.Tc % g.Sc) return "subtiles must divide the tile";
  *out = g;
  return "";
}

// parse.h: the ParsedType's format for the kernels, a table replacing a codebook's own.
std::string to_format(const ParsedType& p, const std::vector<double>* table, Format* out) {
  onnxq_format f = p.fmt;
  if (f.cb_index_bits) {
    if (table) {
      f.cb_table = table->data();
    } else if (p.generic_codebook) {
      return "the generic codebook " + quote_code(p.code) +
             " has no mappings of its own; give them as the Table input of CodebookLookup";
    } else {
      f.cb_table = p.table.data();
      f.cb_mags = p.mags.data();
      f.cb_even = p.even.data();
    }
  }
  return make_format(f, out);
}

}  // namespace onnxq
