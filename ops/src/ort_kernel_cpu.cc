// The custom ops on the CPU (ort_kernel.h): the node's attributes, then QuantizeMX,
// DequantizeMX and CodebookLookup on the shared kernels of kernels.h, every input checked
// against docs/ops.md.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ort_kernel.h"

namespace onnxq {
namespace ort {

namespace {

// Element counts of a DequantizeMX / CodebookLookup shape are at most this (2^40 elements,
// far past any memory; make_geometry's 2^48 bound stays out of reach).
constexpr int64_t kMaxCount = int64_t(1) << 40;
// The Shape input's most dims (numpy's limit; far more than a model's tensors have).
constexpr int64_t kMaxRank = 64;

// Whether the node names DequantizeMX's Shape input.
bool has_shape_input(const OrtKernelInfo* info) {
  size_t n = 0;
  check(g_api->KernelInfo_GetInputCount(info, &n), "counting inputs");
  if (static_cast<size_t>(kInShape) >= n) return false;
  size_t size = 0;
  check(g_api->KernelInfo_GetInputName(info, kInShape, nullptr, &size), "reading an input name");
  return size > 1;  // an empty name (size 1: its terminator) leaves the input out
}

}  // namespace

void init_kernel(Kernel* k, const OrtKernelInfo* info) {
  std::string dtype;
  // onnxq.runtime.session renames it "onnxq_dtype" (load_decode.rename_dtype: onnxruntime
  // requires an integer of any `dtype` on a float16 node it moves to float32).
  if (!attr_string(info, "dtype", &dtype) && !attr_string(info, "onnxq_dtype", &dtype))
    throw OpError("attribute 'dtype' (a preset such as 'mxfp4' or a data type code) is required");
  std::string e = parse_dtype(dtype, &k->parsed);
  if (!e.empty()) throw OpError("dtype " + quote_code(dtype) + ": " + e);
  if (!k->parsed.generic_codebook) {
    e = to_format(k->parsed, nullptr, &k->fmt);
    if (!e.empty()) throw OpError("dtype " + quote_code(dtype) + ": " + e);
    k->fmt_ready = true;
  }
  attr_int(info, "axis", &k->axis);
  if (k->kind == kQuantDequant && (k->parsed.generic_codebook || k->fmt.codebook()))
    throw OpError("dtype '" + k->parsed.code + "' is a codebook, which this op does not cast; " +
                  "use the QuantizeMX -> CodebookLookup pair");
  if (k->kind == kQuantize || k->kind == kQuantDequant) {
    std::string s;
    if (k->parsed.generic_codebook)
      throw OpError("dtype '" + k->parsed.code + "' is a generic codebook with no mappings; " +
                    "QuantizeMX encodes presets and implicit codebooks (cb<I><M><desc>_...)");
    if (attr_string(info, "round_mode", &s))
      k->modes.round_mode = choice("round_mode", s, {"even", "away", "zero", "stochastic"});
    if (attr_string(info, "scale_mode", &s) && s == "search")
      throw OpError("scale_mode 'search' chooses stored weight scales once, in the quantizer "
                    "(onnxq.cast); a QuantizeMX node quantizes at run time by a rule: use "
                    "'floor' (the default) or another rule");
    if (attr_string(info, "scale_mode", &s))
      k->modes.scale_mode = choice(
          "scale_mode", s, {"floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even"});
    if (attr_string(info, "nan_policy", &s))
      k->modes.nan_policy = choice("nan_policy", s, {"element", "block"});
    if (attr_string(info, "int_range", &s))
      k->modes.full_int_range = choice("int_range", s, {"symmetric", "full"}) == 1;
    int64_t seed = 0;
    if (attr_int(info, "seed", &seed)) k->modes.seed = static_cast<uint64_t>(seed);
    if (k->fmt.codebook() && k->modes.round_mode == kStochastic)
      throw OpError("codebooks round to the nearest table entry; round_mode 'stochastic' is " +
                    std::string("not supported"));
    return;
  }
  if (k->kind == kLookup && !k->fmt.codebook() && !k->parsed.generic_codebook)
    throw OpError("dtype '" + k->parsed.code + "' is not a codebook; use DequantizeMX");
  // DequantizeMX may leave the attribute out: its Shape input then gives X's shape (checked
  // at each Run, node_shape).
  if (attr_ints(info, "shape", &k->shape)) {
    if (k->shape.empty()) throw OpError("attribute 'shape' is empty; X has at least one dim");
    // count <= 2^40 / d before each product: no int64 overflow, whatever the dims.
    int64_t count = 1;
    for (int64_t d : k->shape) {
      if (d < 1 || count > kMaxCount / d)
        throw OpError("attribute 'shape' " + shape_str(k->shape) +
                      " must hold positive dims of a tensor of at most 2^40 elements; set it " +
                      "to X's shape" +
                      (k->kind == kDequantize ? " (or leave it out and feed the Shape input)"
                                              : ""));
      count *= d;
    }
  } else if (k->kind == kLookup) {
    throw OpError("attribute 'shape' (the ints of X's shape) is required");
  } else if (!has_shape_input(info)) {
    throw OpError("X's shape is unknown: give the attribute 'shape' (X's dims) or the Shape "
                  "input (int64, X's shape at run time, e.g. from Shape(X))");
  }
  int64_t t = kTF32;
  if (attr_int(info, "output_type", &t) && t != kTF32 && t != kTF16 && t != kTBF16)
    throw OpError("attribute 'output_type' " + std::to_string(t) +
                  " must be 1 (float), 10 (float16) or 16 (bfloat16)");
  k->out_type = static_cast<int>(t);
}

std::vector<int64_t> node_shape(const Kernel& k, const In& in) {
  if (!in) {
    if (k.shape.empty())
      throw OpError("input Shape is missing and the node has no attribute 'shape'; feed X's "
                    "shape (int64, e.g. Shape(X)) or set the attribute");
    return k.shape;
  }
  const std::string got = type_name(in.type) + " of shape " + shape_str(in.shape);
  if (in.type != kI64 || in.shape.size() != 1)
    throw OpError("input Shape must be a 1-D int64 tensor (X's shape), got " + got);
  if (in.count < 1 || in.count > kMaxRank)
    throw OpError("input Shape has " + std::to_string(in.count) + " dims; X needs 1 to " +
                  std::to_string(kMaxRank) + "; feed X's shape");
  const int64_t* v = static_cast<const int64_t*>(in.data);
  std::vector<int64_t> shape(v, v + in.count);
  // The product of the non-zero dims, bounded before each step: no int64 overflow, and a zero
  // dim cannot hide a huge one (the grid shapes are made of them).
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && count > kMaxCount / d))
      throw OpError("input Shape " + shape_str(shape) + " must hold dims >= 0 whose non-zero " +
                    "ones multiply to at most 2^40; feed X's shape");
    if (d > 0) count *= d;
  }
  if (!k.shape.empty() && shape != k.shape)
    throw OpError("attribute 'shape' " + shape_str(k.shape) + " and input Shape " +
                  shape_str(shape) + " disagree; drop the attribute (the Shape input is X's " +
                  "shape at run time) or make them equal");
  return shape;
}

int normal_axis(int64_t axis, size_t ndim, const std::vector<int64_t>& shape, const char* x) {
  int64_t n = static_cast<int64_t>(ndim);
  if (axis < -n || axis >= n)
    throw OpError("axis " + std::to_string(axis) + " is out of range for " + x + " of shape " +
                  shape_str(shape));
  return static_cast<int>(axis < 0 ? axis + n : axis);
}

// Tile grid shape (layout.Tiling.tile_grid): X's shape with the tiled dims replaced by counts.
std::vector<int64_t> grid_shape(const Geometry& g, const std::vector<int64_t>& shape, int axis,
                                int64_t rows, int64_t cols) {
  if (g.kind == 0) return {1};
  std::vector<int64_t> out = shape;
  int ndim = static_cast<int>(shape.size());
  out[axis] = cols;
  if (g.kind == 2) out[axis == ndim - 1 ? ndim - 2 : ndim - 1] = rows;
  return out;
}

namespace {

template <typename T>
std::vector<T> buffer(int64_t n) {
  return std::vector<T>(static_cast<size_t>(n > 0 ? n : 0));
}

// Input positions of DequantizeMX / CodebookLookup (-1: the op has no such input).
struct Slots {
  int q, scale, zero, ts, meta, mask, table;
};
constexpr Slots slots_of(OpKind op) {
  using contract::input_index;
  return {input_index(op, "Q"),        input_index(op, "Scale"), input_index(op, "Zero"),
          input_index(op, "TenScale"), input_index(op, "Meta"),  input_index(op, "Mask"),
          input_index(op, "Table")};
}
constexpr Slots kDequantSlots = slots_of(kDequantize);
constexpr Slots kLookupSlots = slots_of(kLookup);
static_assert(kDequantSlots.q >= 0 && kLookupSlots.q >= 0 && kLookupSlots.table >= 0,
              "schemas.py OPS lacks an input the custom ops read");

// QuantizeMX of an X with a zero dim: every output the data type has, in the shapes an X of
// that shape gives (Q of 0 bytes; a grid with a zero dim, or one tensor-wide code) and code 0
// wherever there is a field (no element reads it).
void quantize_empty(OrtKernelContext* ctx, const Format& f, const std::vector<int64_t>& grid,
                    int64_t nscale, int64_t nmeta, const std::string& why) {
  if (!output(ctx, kQOut.q, "Q", {0}, kU8, why)) throw OpError("output Q is missing");
  auto zeros = [&](size_t index, const char* name, bool has, const std::vector<int64_t>& shape,
                   int type, int64_t bytes) {
    void* out = output(ctx, index, name, has ? shape : std::vector<int64_t>{0},
                       has ? type : 0, why);
    if (out && has && bytes > 0) std::memset(out, 0, static_cast<size_t>(bytes));
  };
  auto width = [](const Num& n) { return static_cast<int64_t>(code_width(n.bits)); };
  zeros(kQOut.scale, "Scale", f.scaled, grid, code_type(f.scale.bits), nscale * width(f.scale));
  const bool z = f.scaled && f.has_zero, t = f.scaled && f.has_ts;
  zeros(kQOut.zero, "Zero", z, grid, z ? code_type(f.zero.bits) : 0,
        z ? nscale * width(f.zero) : 0);
  zeros(kQOut.ts, "TenScale", t, {1}, t ? code_type(f.ts.bits) : 0, t ? width(f.ts) : 0);
  const bool m = f.scaled && nmeta && f.meta_bits();
  const int64_t meta_bytes = m ? packed_nbytes(nmeta, f.meta_bits()) : 0;
  zeros(kQOut.meta, "Meta", true, {meta_bytes}, kU8, meta_bytes);
  output(ctx, kQOut.mask, "Mask", {0}, kU8, why);
}

}  // namespace

void compute_quantize(const Kernel& k, OrtKernelContext* ctx) {
  In x = input(ctx, kInX, "X");
  if (!x) throw OpError("input X is missing");
  if (x.type != kTF32 && x.type != kTF16 && x.type != kTBF16)
    throw OpError("input X must be float, float16 or bfloat16, got " + type_name(x.type) +
                  " of shape " + shape_str(x.shape));
  if (x.shape.empty()) throw OpError("input X is a 0-D scalar; reshape it to (1,)");
  const Format& f = k.fmt;
  int axis = normal_axis(k.axis, x.shape.size(), x.shape, "X");
  Geometry g;
  std::string e = make_geometry(f, x.shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (X of shape " + shape_str(x.shape) + ")");
  int bits = f.code_bits(), code_w = code_width(bits);
  std::vector<uint8_t> codes, scale, zero, ts, mask;
  int64_t nscale = g.scale_count(), nmeta = f.has_meta() ? g.meta_count() : 0;
  const std::string why = "dtype '" + k.parsed.code + "'";
  std::vector<int64_t> grid = grid_shape(g, x.shape, axis, g.nR, g.nC);
  if (x.count == 0) {
    quantize_empty(ctx, f, grid, nscale, nmeta, why);
    return;
  }
  QuantizeIO io;
  io.x = x.data;
  io.x_type = float_kind(x.type);
  // Without a mask every output's size is known: the kernels write Q (packed), Scale, Zero and
  // TenScale in place.
  bool direct = !f.sparse_m;
  void* q = nullptr;
  if (direct) {
    q = output(ctx, kQOut.q, "Q", {packed_nbytes(x.count, bits)}, kU8, why);
    if (!q) throw OpError("output Q is missing");
    io.packed = static_cast<uint8_t*>(q);
  } else {
    codes = buffer<uint8_t>(x.count * code_w);
    io.codes = codes.data();
  }
  auto field_out = [&](size_t index, const char* name, const std::vector<int64_t>& shape,
                       int fbits, std::vector<uint8_t>* buf, int64_t count) -> void* {
    if (direct) {
      void* out = output(ctx, index, name, shape, code_type(fbits), why);
      if (out) return out;
    }
    *buf = buffer<uint8_t>(count * code_width(fbits));
    return buf->data();
  };
  if (f.scaled) {
    io.scale = field_out(kQOut.scale, "Scale", grid, f.scale.bits, &scale, nscale);
    if (f.has_zero) io.zero = field_out(kQOut.zero, "Zero", grid, f.zero.bits, &zero, nscale);
    if (f.has_ts) io.tenscale = field_out(kQOut.ts, "TenScale", {1}, f.ts.bits, &ts, 1);
    // Meta (packed) is written in place when the node names it; otherwise it is not made.
    if (nmeta && f.meta_bits()) {
      void* m = output(ctx, kQOut.meta, "Meta", {packed_nbytes(nmeta, f.meta_bits())}, kU8, why);
      io.meta_packed = static_cast<uint8_t*>(m);
    }
    if (f.sparse_m) {
      mask = buffer<uint8_t>(x.count);
      io.mask = mask.data();
    }
  }
  ParallelFor pf = session_parallel_for(ctx);
  e = quantize(f, k.modes, x.shape, axis, io, pf);
  if (!e.empty()) throw OpError(e + " (X of shape " + shape_str(x.shape) + ")");

  if (!direct) {
    int64_t kept = x.count;
    if (io.mask) kept = std::count_if(mask.begin(), mask.end(), [](uint8_t m) { return m != 0; });
    q = output(ctx, kQOut.q, "Q", {packed_nbytes(kept, bits)}, kU8, why);
    if (!q) throw OpError("output Q is missing");
    pack_bits(codes.data(), code_w, x.count, bits, io.mask, static_cast<uint8_t*>(q), &pf);
  }
  auto field = [&](size_t index, const char* name, bool has, const std::vector<int64_t>& shape,
                   int fbits, const std::vector<uint8_t>& data) {
    if (!has) {
      output(ctx, index, name, {0}, 0, why);  // a zero-size tensor when the node names it
      return;
    }
    if (direct && data.empty()) return;  // written in place
    void* out = output(ctx, index, name, shape, code_type(fbits), why);
    if (out && !data.empty()) std::memcpy(out, data.data(), data.size());
  };
  field(kQOut.scale, "Scale", f.scaled, grid, f.scale.bits, scale);
  field(kQOut.zero, "Zero", f.has_zero, grid, f.has_zero ? f.zero.bits : 8, zero);
  field(kQOut.ts, "TenScale", f.has_ts, {1}, f.has_ts ? f.ts.bits : 8, ts);
  if (!(f.scaled && nmeta && f.meta_bits()))
    output(ctx, kQOut.meta, "Meta", {0}, kU8, why);  // zero-size when the node names it
  void* mk = output(ctx, kQOut.mask, "Mask", {io.mask ? packed_nbytes(x.count, 1) : 0}, kU8, why);
  if (mk && io.mask) pack_bits(mask.data(), 1, x.count, 1, nullptr, static_cast<uint8_t*>(mk));
}

void compute_quant_dequant(const Kernel& k, OrtKernelContext* ctx) {
  In x = input(ctx, kInX, "X");
  if (!x) throw OpError("input X is missing");
  if (x.type != kTF32 && x.type != kTF16 && x.type != kTBF16)
    throw OpError("input X must be float, float16 or bfloat16, got " + type_name(x.type) +
                  " of shape " + shape_str(x.shape));
  if (x.shape.empty()) throw OpError("input X is a 0-D scalar; reshape it to (1,)");
  int axis = normal_axis(k.axis, x.shape.size(), x.shape, "X");
  Geometry g;
  std::string e = make_geometry(k.fmt, x.shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (X of shape " + shape_str(x.shape) + ")");
  void* y = output(ctx, kOutY, "Y", x.shape, x.type, "input X of type " + type_name(x.type));
  if (!y) throw OpError("output Y is missing");
  if (x.count == 0) return;  // an empty Y
  // The virtual cast: X read once, Y written once, no codes, scales or mask written (the
  // fast row kernels decode each tile as they encode it; the values are DequantizeMX's of
  // QuantizeMX's codes, bit for bit).
  QuantizeIO io;
  io.x = x.data;
  io.x_type = float_kind(x.type);
  io.values = y;
  io.values_type = io.x_type;
  e = quantize(k.fmt, k.modes, x.shape, axis, io, session_parallel_for(ctx));
  if (!e.empty()) throw OpError(e + " (X of shape " + shape_str(x.shape) + ")");
}

namespace {

// Input `slot` of the node, by its contract name (the Run's or the constant initializers').
using InputFn = std::function<In(int slot, const char* name)>;

}  // namespace

const Format& lookup_format(const Kernel& k, const In& table, Format* table_fmt) {
  const Format* fp = &k.fmt;
  if (table) {
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
    fp = table_fmt;
  } else if (!k.fmt_ready) {
    throw OpError("dtype '" + k.parsed.code + "' is a generic codebook: the Table input " +
                  "(2^meta_bits x 2^index_bits floats) is required");
  }
  return *fp;
}

namespace {

// The node's Format: the dtype's, or the one the Table input gives a generic codebook.
const Format& node_format(const Kernel& k, const Slots& s, const InputFn& get,
                          Format* table_fmt) {
  return lookup_format(k, s.table >= 0 ? get(s.table, "Table") : In{}, table_fmt);
}

// Checks every input against docs/ops.md and decodes Y into the buffer y_out() gives.
void decode(const Kernel& k, const InputFn& get, const std::vector<int64_t>& shape,
            const std::function<void*()>& y_out, const ParallelFor& pf) {
  const Slots& s = k.kind == kLookup ? kLookupSlots : kDequantSlots;
  int axis = normal_axis(k.axis, shape.size(), shape, "X's shape");
  Format table_fmt;
  const Format& f = node_format(k, s, get, &table_fmt);
  Geometry g;
  std::string e = make_geometry(f, shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
  // Every input as docs/ops.md states it: its type and exact shape; an input the data type
  // does not have is left out or zero-size.
  const std::string what = "dtype '" + k.parsed.code + "', shape " + shape_str(shape) +
                           " and axis " + std::to_string(k.axis);
  const std::string fix = "; pass the tensor that QuantizeMX (or onnxq.cast(..., mode='compress')) "
                          "made for this dtype, shape and axis";
  auto need = [&](int slot, const char* name, bool required) -> In {
    In in = slot >= 0 ? get(slot, name) : In{};
    if (required && !in) throw OpError(std::string("input ") + name + " is required for " + what + fix);
    return in;
  };
  auto check_field = [&](const In& in, const char* name, int type,
                         const std::vector<int64_t>& want, const char* layout) {
    if (in.type != type || in.shape != want)
      throw OpError(std::string("input ") + name + " is " + type_name(in.type) + " of shape " +
                    shape_str(in.shape) + "; " + what + " need " + type_name(type) +
                    " of shape " + shape_str(want) + " (" + layout + ")" + fix);
  };
  auto absent = [&](int slot, const char* name, const char* lacks) {
    In in = slot >= 0 ? get(slot, name) : In{};
    if (in && in.count != 0)
      throw OpError(std::string("input ") + name + " " + shape_str(in.shape) + " is given but " +
                    "dtype '" + k.parsed.code + "' has " + lacks + "; leave the input out (an " +
                    "empty name) or pass a zero-size tensor");
  };
  const std::vector<int64_t> grid = grid_shape(g, shape, axis, g.nR, g.nC);
  std::vector<uint8_t> mask;
  int64_t kept = g.size;
  if (f.sparse_m) {
    In mk = need(s.mask, "Mask", true);
    check_field(mk, "Mask", kU8, {packed_nbytes(g.size, 1)}, "one bit per element, packed");
    mask = buffer<uint8_t>(g.size);
    unpack_bits(static_cast<const uint8_t*>(mk.data), 1, g.size, nullptr, mask.data(), 1);
    kept = std::count_if(mask.begin(), mask.end(), [](uint8_t m) { return m != 0; });
  } else {
    absent(s.mask, "Mask", "no N:M sparsity");
  }
  int bits = f.code_bits();
  In q = need(s.q, "Q", true);
  const std::string q_layout = std::to_string(kept) + " codes of " + std::to_string(bits) +
                               " bits, packed";
  check_field(q, "Q", kU8, {packed_nbytes(kept, bits)}, q_layout.c_str());
  DequantizeIO io;
  io.packed = static_cast<const uint8_t*>(q.data);  // unpacked by dequantize where it needs to
  io.mask = f.sparse_m ? mask.data() : nullptr;
  std::vector<uint8_t> meta;
  const char* grid_layout = "the tile grid: the shape with the tiled dims replaced by tile counts";
  if (f.scaled) {
    In sc = need(s.scale, "Scale", true);
    check_field(sc, "Scale", code_type(f.scale.bits), grid, grid_layout);
    io.scale = sc.data;
  } else {
    absent(s.scale, "Scale", "no scale");
  }
  if (f.scaled && f.has_zero) {
    In z = need(s.zero, "Zero", true);
    check_field(z, "Zero", code_type(f.zero.bits), grid, grid_layout);
    io.zero = z.data;
  } else {
    absent(s.zero, "Zero", "no zero point");
  }
  if (f.scaled && f.has_ts) {
    In t = need(s.ts, "TenScale", true);
    check_field(t, "TenScale", code_type(f.ts.bits), {1}, "one tensor scale");
    io.tenscale = t.data;
  } else {
    absent(s.ts, "TenScale", "no tensor scale");
  }
  const int mbits = f.meta_bits();
  if (f.scaled && f.has_meta() && mbits) {
    int64_t nmeta = g.meta_count();
    In m = need(s.meta, "Meta", true);
    const std::string m_layout = std::to_string(nmeta) + " units of " + std::to_string(mbits) +
                                 " bits, packed";
    check_field(m, "Meta", kU8, {packed_nbytes(nmeta, mbits)}, m_layout.c_str());
    io.meta_packed = static_cast<const uint8_t*>(m.data);
  } else {
    absent(s.meta, "Meta", "no meta bits");
    if (f.scaled && f.has_meta()) {
      meta = buffer<uint8_t>(g.meta_count());  // no meta bits: every mapping index is 0
      io.meta = meta.data();
    }
  }
  io.values = y_out();
  io.values_type = float_kind(k.out_type);
  if (g.size == 0) return;  // an empty Y: its inputs checked, nothing to decode
  e = dequantize(f, shape, axis, io, pf);
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

constexpr int64_t kCopyChunk = int64_t(1) << 16;

// Copies `size` bytes in 64 KiB chunks over `pf`.
void parallel_copy(uint8_t* to, const uint8_t* from, int64_t size, const ParallelFor& pf) {
  pf((size + kCopyChunk - 1) / kCopyChunk, [&](int64_t b, int64_t e) {
    std::memcpy(to + b * kCopyChunk, from + b * kCopyChunk,
                std::min(e * kCopyChunk, size) - b * kCopyChunk);
  });
}

// Whether copying `y` is faster than decoding it (which took `decode_s` over `pf`): times a
// copy of up to 16 MiB of it over `pf`, once, and scales that to its size.
bool copy_beats_decode(const std::vector<uint8_t>& y, double decode_s, const ParallelFor& pf) {
  const size_t sample = std::min<size_t>(y.size(), size_t(16) << 20);
  std::vector<uint8_t> to(sample, 1);  // touched: no page faults in the timing
  auto t0 = std::chrono::steady_clock::now();
  parallel_copy(to.data(), y.data(), static_cast<int64_t>(sample), pf);
  std::chrono::duration<double> copy = std::chrono::steady_clock::now() - t0;
  if (to[sample / 2] != y[sample / 2]) return false;  // keeps the copy from being elided
  return decode_s > 1.5 * copy.count() * static_cast<double>(y.size()) / sample;
}

}  // namespace

void init_const_decode(Kernel* k, const OrtKernelInfo* info) noexcept {
  try {
    // 0: never; 1: always; otherwise when a copy of Y beats decoding it (cheap formats decode
    // at memory speed, faster than a copy of their floats).
    const char* env = std::getenv("ONNXQ_CONST_DECODE");
    const std::string mode = env ? env : "";
    if (mode == "0") return;
    std::vector<In> ins;
    if (!constant_inputs(info, &ins)) return;
    InputFn get = [&ins](int slot, const char*) {
      return slot < static_cast<int>(ins.size()) ? ins[slot] : In{};
    };
    // A constant Shape input counts as the shape (node_shape bounds it by 2^40 elements).
    const std::vector<int64_t> shape =
        node_shape(*k, k->kind == kDequantize ? get(kInShape, "Shape") : In{});
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    if (count == 0) return;  // nothing to keep (and no sample to time a copy with)
    std::vector<uint8_t> y(static_cast<size_t>(count) * (k->out_type == kTF32 ? 4 : 2));
    ParallelFor pf = default_parallel_for(0);
    auto t0 = std::chrono::steady_clock::now();
    decode(*k, get, shape, [&y]() -> void* { return y.data(); }, pf);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    if (mode == "1" || copy_beats_decode(y, took.count(), pf)) k->const_y = std::move(y);
  } catch (...) {
    k->const_y.clear();  // the Runs decode, and report what went wrong
  }
}

void compute_dequantize(const Kernel& k, OrtKernelContext* ctx) {
  const std::vector<int64_t> shape =
      node_shape(k, k.kind == kDequantize ? input(ctx, kInShape, "Shape") : In{});
  auto y_out = [&]() -> void* {
    void* y = output(ctx, kOutY, "Y", shape, k.out_type,
                     "output_type " + std::to_string(k.out_type));
    if (!y) throw OpError("output Y is missing");
    return y;
  };
  ParallelFor pf = session_parallel_for(ctx);
  if (k.const_y.empty()) {
    decode(k, [ctx](int slot, const char* name) { return input(ctx, slot, name); }, shape, y_out,
           pf);
    return;
  }
  // Decoded at session creation (with this shape: a Shape input that was constant then is the
  // same now): copy it over the session's threads.
  parallel_copy(static_cast<uint8_t*>(y_out()), k.const_y.data(),
                static_cast<int64_t>(k.const_y.size()), pf);
}

}  // namespace ort
}  // namespace onnxq
