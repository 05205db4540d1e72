// GatherMX on the CPU (docs/ops.md): Y = Gather(decode(table), Indices, axis=0), decoding only
// the rows the indices name.
//
// The table's rows fall into groups of G consecutive rows that hold whole tiles: G = 1 unless
// the tiles run along dim 0 (then G is the tile's extent there). The kernel copies the packed
// codes, scale codes, zero points and meta bits of the groups the indices touch into a compact
// table of those groups, in their table order, and runs dequantize() on it once: a compact table
// tiles exactly as those rows of the table do, so every element gets the bits DequantizeMX gives
// it. The packed table is never decoded whole, and no decoded copy of it is kept.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ort_kernel.h"

namespace onnxq {
namespace ort {
namespace {

struct GatherSlots {
  int idx, q, scale, zero, ts, meta, mask, table;
};
constexpr GatherSlots kGS = {
    contract::input_index(kGather, "Indices"), contract::input_index(kGather, "Q"),
    contract::input_index(kGather, "Scale"),   contract::input_index(kGather, "Zero"),
    contract::input_index(kGather, "TenScale"), contract::input_index(kGather, "Meta"),
    contract::input_index(kGather, "Mask"),    contract::input_index(kGather, "Table")};
constexpr int kGatherY = contract::output_index(kGather, "Y");
static_assert(kGS.idx >= 0 && kGS.q >= 0 && kGS.scale >= 0 && kGS.zero >= 0 && kGS.ts >= 0 &&
                  kGS.meta >= 0 && kGS.mask >= 0 && kGS.table >= 0 && kGatherY >= 0,
              "schemas.py OPS lacks an input or output GatherMX reads or writes");

// Y holds at most 2^40 elements, like DequantizeMX's X.
constexpr int64_t kMaxCount = int64_t(1) << 40;

using InputFn = std::function<In(int slot, const char* name)>;

// The table as groups of rows: group j holds rows [j*G, min(V, (j+1)*G)), whole tiles.
struct Table {
  std::vector<int64_t> shape;
  int axis = 0;
  Geometry g;                // the whole table's
  int64_t V = 0, row = 0;    // rows, elements per row
  int64_t G = 1, ng = 0;     // rows per group, groups
  int64_t last_rows = 0;     // rows of the last group
  bool shared = false;       // one scale (and meta unit) for the whole table, or none
  int64_t scales_full = 0, scales_last = 0;  // scale grid entries of a full / the last group
  int64_t units_full = 0, units_last = 0;    // meta units of a full / the last group
};

// The groups of `shape` tiled as `f` and `axis` say; "" or why they do not split by rows.
std::string table_layout(const Format& f, const std::vector<int64_t>& shape, int axis,
                         Table* t) {
  t->shape = shape;
  t->axis = axis;
  std::string e = make_geometry(f, shape, axis, &t->g);
  if (!e.empty()) return e;
  const Geometry& g = t->g;
  const int nd = static_cast<int>(shape.size());
  t->V = shape[0];
  t->row = t->V ? g.size / t->V : 0;
  t->shared = g.kind == 0;
  int64_t G = 1;
  if (g.kind != 0 && axis == 0) {
    G = g.Tc;  // the tiles run along dim 0
  } else if (g.kind == 2 && (axis == nd - 1 ? nd - 2 : nd - 1) == 0) {
    G = g.Tr;  // 2-D tiles whose rows are dim 0
  }
  t->G = std::max<int64_t>(1, std::min(G, t->V));
  t->ng = (t->V + t->G - 1) / t->G;
  t->last_rows = t->V - (t->ng - 1) * t->G;
  if (t->shared) return "";
  std::vector<int64_t> sub = shape;
  Geometry full, last;
  sub[0] = t->G;
  if (!(e = make_geometry(f, sub, axis, &full)).empty()) return e;
  sub[0] = t->last_rows;
  if (!(e = make_geometry(f, sub, axis, &last)).empty()) return e;
  t->scales_full = full.scale_count();
  t->scales_last = last.scale_count();
  t->units_full = full.meta_count();
  t->units_last = last.meta_count();
  // The groups' tiles are the table's, in order (they are contiguous in every grid).
  if ((t->ng - 1) * t->scales_full + t->scales_last != g.scale_count() ||
      (t->ng - 1) * t->units_full + t->units_last != g.meta_count())
    return "the tiles of shape " + shape_str(shape) + " do not split into row groups";
  return "";
}

// The node's Format: the dtype's, or the one the Table input gives a generic codebook.
const Format& gather_format(const Kernel& k, const InputFn& get, Format* table_fmt) {
  In table = get(kGS.table, "Table");
  if (!table) {
    if (!k.fmt_ready)
      throw OpError("dtype '" + k.parsed.code + "' is a generic codebook: the Table input " +
                    "(2^meta_bits x 2^index_bits floats) is required");
    return k.fmt;
  }
  if (!k.parsed.generic_codebook && !k.fmt.codebook())
    throw OpError("input Table " + shape_str(table.shape) + " is given but dtype '" +
                  k.parsed.code + "' is not a codebook; leave the input out");
  int maps = 1 << k.parsed.fmt.cb_meta_bits, width = 1 << k.parsed.fmt.cb_index_bits;
  if (table.type != kTF32)
    throw OpError("input Table must be float, got " + type_name(table.type));
  if (table.shape != std::vector<int64_t>{maps, width})
    throw OpError("input Table has shape " + shape_str(table.shape) + "; dtype '" +
                  k.parsed.code + "' needs " + shape_str({maps, width}) +
                  " (2^meta_bits x 2^index_bits)");
  const float* tv = static_cast<const float*>(table.data);
  std::vector<double> values(tv, tv + table.count);
  std::string e = to_format(k.parsed, &values, table_fmt);
  if (!e.empty()) throw OpError("dtype '" + k.parsed.code + "' with the Table input: " + e);
  return *table_fmt;
}

void refuse_sparse(const Kernel& k, const Format& f) {
  if (f.sparse_m)
    throw OpError("dtype '" + k.parsed.code + "' has N:M sparsity (Q leaves the pruned codes " +
                  "out): GatherMX does not decode it; gather the output of DequantizeMX instead");
}

// The table's layout from the node's attributes; an OpError when GatherMX cannot decode it.
Table node_table(const Kernel& k, const Format& f) {
  refuse_sparse(k, f);
  int axis = normal_axis(k.axis, k.shape.size(), k.shape, "the attribute shape");
  Table t;
  std::string e = table_layout(f, k.shape, axis, &t);
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(k.shape) + ")");
  return t;
}

// Tile grid shape: the table's shape with the tiled dims replaced by their tile counts.
std::vector<int64_t> grid_of(const Table& t) {
  const Geometry& g = t.g;
  if (g.kind == 0) return {1};
  std::vector<int64_t> out = t.shape;
  int nd = static_cast<int>(out.size());
  out[t.axis] = g.nC;
  if (g.kind == 2) out[t.axis == nd - 1 ? nd - 2 : nd - 1] = g.nR;
  return out;
}

// The packed table's inputs, checked against docs/ops.md as DequantizeMX checks them.
struct Packed {
  const uint8_t* q = nullptr;
  int64_t q_bytes = 0;
  const uint8_t* scale = nullptr;
  const uint8_t* zero = nullptr;
  const void* tenscale = nullptr;
  const uint8_t* meta = nullptr;  // packed meta bits, or null
  int64_t meta_bytes = 0;
  bool meta_zero = false;  // meta units without bits: every mapping index is 0
  int scale_w = 1, zero_w = 1;
};

Packed check_inputs(const Kernel& k, const Format& f, const Table& t, const InputFn& get) {
  const std::string what = "dtype '" + k.parsed.code + "', shape " + shape_str(t.shape) +
                           " and axis " + std::to_string(k.axis);
  const std::string fix = "; pass the tensor that QuantizeMX (or onnxq.cast(..., mode='compress')) "
                          "made for this dtype, shape and axis";
  auto need = [&](int slot, const char* name) -> In {
    In in = get(slot, name);
    if (!in) throw OpError(std::string("input ") + name + " is required for " + what + fix);
    return in;
  };
  auto check_field = [&](const In& in, const char* name, int type,
                         const std::vector<int64_t>& want, const std::string& layout) {
    if (in.type != type || in.shape != want)
      throw OpError(std::string("input ") + name + " is " + type_name(in.type) + " of shape " +
                    shape_str(in.shape) + "; " + what + " need " + type_name(type) +
                    " of shape " + shape_str(want) + " (" + layout + ")" + fix);
  };
  auto absent = [&](int slot, const char* name, const char* lacks) {
    In in = get(slot, name);
    if (in && in.count != 0)
      throw OpError(std::string("input ") + name + " " + shape_str(in.shape) + " is given but " +
                    "dtype '" + k.parsed.code + "' has " + lacks + "; leave the input out (an " +
                    "empty name) or pass a zero-size tensor");
  };
  absent(kGS.mask, "Mask", "no N:M sparsity");
  Packed p;
  const int bits = f.code_bits();
  In q = need(kGS.q, "Q");
  p.q_bytes = packed_nbytes(t.g.size, bits);
  check_field(q, "Q", kU8, {p.q_bytes},
              std::to_string(t.g.size) + " codes of " + std::to_string(bits) + " bits, packed");
  p.q = static_cast<const uint8_t*>(q.data);
  const std::vector<int64_t> grid = grid_of(t);
  const char* grid_layout = "the tile grid: the shape with the tiled dims replaced by tile counts";
  if (f.scaled) {
    In sc = need(kGS.scale, "Scale");
    check_field(sc, "Scale", code_type(f.scale.bits), grid, grid_layout);
    p.scale = static_cast<const uint8_t*>(sc.data);
    p.scale_w = code_width(f.scale.bits);
  } else {
    absent(kGS.scale, "Scale", "no scale");
  }
  if (f.scaled && f.has_zero) {
    In z = need(kGS.zero, "Zero");
    check_field(z, "Zero", code_type(f.zero.bits), grid, grid_layout);
    p.zero = static_cast<const uint8_t*>(z.data);
    p.zero_w = code_width(f.zero.bits);
  } else {
    absent(kGS.zero, "Zero", "no zero point");
  }
  if (f.scaled && f.has_ts) {
    In ts = need(kGS.ts, "TenScale");
    check_field(ts, "TenScale", code_type(f.ts.bits), {1}, "one tensor scale");
    p.tenscale = ts.data;
  } else {
    absent(kGS.ts, "TenScale", "no tensor scale");
  }
  const int mbits = f.meta_bits();
  if (f.scaled && f.has_meta() && mbits) {
    int64_t units = t.g.meta_count();
    In m = need(kGS.meta, "Meta");
    p.meta_bytes = packed_nbytes(units, mbits);
    check_field(m, "Meta", kU8, {p.meta_bytes},
                std::to_string(units) + " units of " + std::to_string(mbits) + " bits, packed");
    p.meta = static_cast<const uint8_t*>(m.data);
  } else {
    absent(kGS.meta, "Meta", "no meta bits");
    p.meta_zero = f.scaled && f.has_meta();
  }
  return p;
}

// The indices, each checked against the table's rows and made non-negative.
std::vector<int64_t> read_indices(const In& idx, const Table& t) {
  if (idx.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 &&
      idx.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32)
    throw OpError("input Indices must be int64 or int32, got " + type_name(idx.type) +
                  " of shape " + shape_str(idx.shape) + "; cast the indices to int64");
  std::vector<int64_t> rows(static_cast<size_t>(idx.count));
  const bool wide = idx.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  for (int64_t i = 0; i < idx.count; ++i) {
    int64_t v = wide ? static_cast<const int64_t*>(idx.data)[i]
                     : static_cast<const int32_t*>(idx.data)[i];
    if (v < -t.V || v >= t.V)
      throw OpError("index " + std::to_string(v) + " (at flat position " + std::to_string(i) +
                    " of Indices) is out of range for a table of " + std::to_string(t.V) +
                    " rows (shape " + shape_str(t.shape) + "); indices must lie in [" +
                    std::to_string(-t.V) + ", " + std::to_string(t.V - 1) + "]");
    rows[static_cast<size_t>(i)] = v < 0 ? v + t.V : v;
  }
  return rows;
}

// Copies `nbits` bits from bit `from` of `src` (`src_bytes` long) to bit `to` of `dst`, whose
// bits there are zero (LSB-first streams, as packing.py writes them).
void copy_bits(const uint8_t* src, int64_t src_bytes, int64_t from, uint8_t* dst, int64_t to,
               int64_t nbits) {
  if (nbits <= 0) return;
  if ((from & 7) == 0 && (to & 7) == 0) {
    int64_t whole = nbits >> 3;
    std::memcpy(dst + (to >> 3), src + (from >> 3), static_cast<size_t>(whole));
    from += whole * 8;
    to += whole * 8;
    nbits -= whole * 8;
  }
  while (nbits > 0) {
    const int64_t byte = from >> 3;
    const int shift = static_cast<int>(from & 7), at = static_cast<int>(to & 7);
    const int take = static_cast<int>(std::min<int64_t>(nbits, 8 - at));
    uint32_t w = src[byte];
    if (byte + 1 < src_bytes) w |= static_cast<uint32_t>(src[byte + 1]) << 8;
    const uint32_t v = (w >> shift) & ((1u << take) - 1u);
    dst[to >> 3] = static_cast<uint8_t>(dst[to >> 3] | (v << at));
    from += take;
    to += take;
    nbits -= take;
  }
}

// The packed fields of the groups `groups` (the last one may be the table's short last group),
// one after the other: a table of its own whose rows are those groups' rows.
struct Compact {
  std::vector<int64_t> shape;
  std::vector<uint8_t> q, scale, zero, meta;
};

Compact compact_groups(const Format& f, const Table& t, const Packed& p,
                       const std::vector<int64_t>& groups, const ParallelFor& pf) {
  const int64_t n = static_cast<int64_t>(groups.size());
  const bool short_last = t.last_rows < t.G && groups.back() == t.ng - 1;
  Compact c;
  c.shape = t.shape;
  c.shape[0] = (short_last ? (n - 1) * t.G + t.last_rows : n * t.G);
  const int bits = f.code_bits(), mbits = f.meta_bits();
  const int64_t full_bits = t.G * t.row * bits, unit_bits = t.units_full * mbits;
  c.q.assign(static_cast<size_t>(packed_nbytes(c.shape[0] * t.row, bits)), 0);
  const int64_t ns = t.shared ? 0 : (short_last ? n - 1 : n) * t.scales_full +
                                        (short_last ? t.scales_last : 0);
  const int64_t nu = t.shared ? 0 : (short_last ? n - 1 : n) * t.units_full +
                                        (short_last ? t.units_last : 0);
  if (p.scale && !t.shared) c.scale.assign(static_cast<size_t>(ns * p.scale_w), 0);
  if (p.zero && !t.shared) c.zero.assign(static_cast<size_t>(ns * p.zero_w), 0);
  if (p.meta && !t.shared) c.meta.assign(static_cast<size_t>(packed_nbytes(nu, mbits)), 0);
  auto one = [&](int64_t j) {
    const int64_t gid = groups[static_cast<size_t>(j)];
    const bool last = gid == t.ng - 1;
    const int64_t rows = last ? t.last_rows : t.G;
    copy_bits(p.q, p.q_bytes, gid * full_bits, c.q.data(), j * full_bits, rows * t.row * bits);
    if (t.shared) return;
    const int64_t scales = last ? t.scales_last : t.scales_full;
    if (p.scale)
      std::memcpy(c.scale.data() + j * t.scales_full * p.scale_w,
                  p.scale + gid * t.scales_full * p.scale_w,
                  static_cast<size_t>(scales * p.scale_w));
    if (p.zero)
      std::memcpy(c.zero.data() + j * t.scales_full * p.zero_w,
                  p.zero + gid * t.scales_full * p.zero_w, static_cast<size_t>(scales * p.zero_w));
    if (p.meta)
      copy_bits(p.meta, p.meta_bytes, gid * unit_bits, c.meta.data(), j * unit_bits,
                (last ? t.units_last : t.units_full) * mbits);
  };
  // Groups that start on a byte of both streams can be copied side by side; otherwise two
  // groups may share a byte, and one thread writes them all.
  if (full_bits % 8 == 0 && unit_bits % 8 == 0) {
    pf(n, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) one(j);
    });
  } else {
    for (int64_t j = 0; j < n; ++j) one(j);
  }
  return c;
}

// Decodes the table's rows `rows` into y (row i at element i * row), `out_type` an ONNX type.
void gather_rows(const Format& f, const Table& t, const Packed& p,
                 const std::vector<int64_t>& rows, int out_type, void* y, const ParallelFor& pf) {
  // G == 1: the compact table is Y itself (rows in index order, repeats included). Otherwise
  // each group the indices touch is decoded once, in table order, and the rows copied out.
  std::vector<int64_t> groups = rows;
  if (t.G > 1) {
    for (int64_t& r : groups) r /= t.G;
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  }
  Compact c = compact_groups(f, t, p, groups, pf);
  const int64_t count = c.shape[0] * t.row;
  const size_t esize = out_type == kTF32 ? 4 : 2;
  std::vector<uint8_t> decoded;
  DequantizeIO io;
  io.packed = c.q.data();
  io.scale = t.shared ? static_cast<const void*>(p.scale) : c.scale.data();
  io.zero = t.shared ? static_cast<const void*>(p.zero) : c.zero.data();
  io.tenscale = p.tenscale;
  io.meta_packed = t.shared ? p.meta : c.meta.data();
  std::vector<uint8_t> zero_meta;
  if (p.meta_zero) {
    Geometry cg;
    std::string e = make_geometry(f, c.shape, t.axis, &cg);
    if (!e.empty()) throw OpError(e);
    zero_meta.assign(static_cast<size_t>(cg.meta_count()), 0);
    io.meta = zero_meta.data();
    io.meta_packed = nullptr;
  }
  if (t.G == 1) {
    io.values = y;
  } else {
    decoded.resize(static_cast<size_t>(count) * esize);
    io.values = decoded.data();
  }
  io.values_type = float_kind(out_type);
  std::string e = dequantize(f, c.shape, t.axis, io, pf);
  if (!e.empty()) throw OpError(e + " (the gathered rows of shape " + shape_str(c.shape) + ")");
  if (t.G == 1) return;
  const size_t row_bytes = static_cast<size_t>(t.row) * esize;
  pf(static_cast<int64_t>(rows.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = rows[static_cast<size_t>(i)], gid = r / t.G;
      const int64_t j = std::lower_bound(groups.begin(), groups.end(), gid) - groups.begin();
      const int64_t at = j * t.G + (r - gid * t.G);  // the row's position in the compact table
      std::memcpy(static_cast<uint8_t*>(y) + i * row_bytes, decoded.data() + at * row_bytes,
                  row_bytes);
    }
  });
}

}  // namespace

void init_gather(const Kernel& k) {
  if (k.fmt_ready) node_table(k, k.fmt);  // a generic codebook waits for its Table input
}

namespace {

// What both providers read and check before decoding: the table, its packed inputs, the rows
// the indices name (host memory on either provider) and Y.
struct Gather {
  Format table_fmt;  // a generic codebook's, with the Table input's values
  const Format* f = nullptr;
  Table t;
  Packed p;
  std::vector<int64_t> rows;
  void* y = nullptr;
};

void prepare(const Kernel& k, OrtKernelContext* ctx, Gather* g) {
  InputFn get = [ctx](int slot, const char* name) { return input(ctx, slot, name); };
  g->f = &gather_format(k, get, &g->table_fmt);
  g->t = node_table(k, *g->f);
  g->p = check_inputs(k, *g->f, g->t, get);
  In idx = get(kGS.idx, "Indices");
  if (!idx) throw OpError("input Indices is missing");
  g->rows = read_indices(idx, g->t);
  std::vector<int64_t> yshape = idx.shape;
  yshape.insert(yshape.end(), g->t.shape.begin() + 1, g->t.shape.end());
  const int64_t n = static_cast<int64_t>(g->rows.size());
  if (n > 0 && g->t.row > kMaxCount / n)
    throw OpError("Y of shape " + shape_str(yshape) + " would hold more than 2^40 elements; " +
                  "gather fewer rows at a time");
  g->y = output(ctx, kGatherY, "Y", yshape, k.out_type,
                "output_type " + std::to_string(k.out_type));
  if (n > 0 && !g->y) throw OpError("output Y is missing");
}

}  // namespace

void compute_gather(const Kernel& k, OrtKernelContext* ctx) {
  Gather g;
  prepare(k, ctx, &g);
  if (g.rows.empty()) return;  // an empty Y (its data pointer may be null)
  gather_rows(*g.f, g.t, g.p, g.rows, k.out_type, g.y, session_parallel_for(ctx));
}

void compute_gather_cuda(const Kernel& k, OrtKernelContext* ctx, void* stream) {
  Gather g;
  prepare(k, ctx, &g);
  if (g.rows.empty() || g.t.row == 0) return;  // an empty Y
  const Packed& p = g.p;
  std::string e = cuda::gather_packed(
      *g.f, k.parsed.code, g.t.shape, g.t.axis, g.rows.data(),
      static_cast<int64_t>(g.rows.size()), p.q, p.scale, p.tenscale, p.meta, g.y,
      float_kind(k.out_type), stream);
  if (!e.empty()) throw OpError(e + " (table of shape " + shape_str(g.t.shape) + ")");
}

}  // namespace ort
}  // namespace onnxq
