// MatMulMX on the CPU (docs/ops.md "MatMulMX"): Y = A x decode(B) (+ Bias), B packed as
// DequantizeMX's inputs. Every input is checked as DequantizeMX checks its own (type and exact
// shape, inputs the data type lacks left out or zero-size), plus A's and Bias's shapes against
// B's [K, N]; then matmul_mx.cc computes Y in the documented float32 order, or, from a threshold
// of rows of A on, ort_kernel_mmx_large.cc with onnxruntime's MatMul on B decoded.
#include <cstdint>
#include <string>
#include <vector>

#include "matmul_mx.h"
#include "ort_kernel.h"
#include "ort_kernel_mmx_large.h"

namespace onnxq {
namespace ort {

namespace {

struct MmxSlots {
  int a, q, scale, zero, ts, meta, mask, bias;
};
constexpr MmxSlots kMmx{contract::input_index(kMatMul, "A"),
                        contract::input_index(kMatMul, "Q"),
                        contract::input_index(kMatMul, "Scale"),
                        contract::input_index(kMatMul, "Zero"),
                        contract::input_index(kMatMul, "TenScale"),
                        contract::input_index(kMatMul, "Meta"),
                        contract::input_index(kMatMul, "Mask"),
                        contract::input_index(kMatMul, "Bias")};
static_assert(kMmx.a >= 0 && kMmx.q >= 0 && kMmx.scale >= 0 && kMmx.zero >= 0 && kMmx.ts >= 0 &&
                  kMmx.meta >= 0 && kMmx.mask >= 0 && kMmx.bias >= 0 &&
                  contract::output_index(kMatMul, "Y") == 0,
              "schemas.py OPS lacks an input or output MatMulMX reads");

// B's packed inputs checked against dtype, shape and axis (as DequantizeMX's decode does); fills
// io. `mask` and `meta` keep the unpacked N:M mask and the zero mapping indexes alive.
void check_packed(const Kernel& k, OrtKernelContext* ctx, const Geometry& g, int axis,
                  DequantizeIO* io, std::vector<uint8_t>* mask, std::vector<uint8_t>* meta) {
  const Format& f = k.fmt;
  const std::vector<int64_t>& shape = k.shape;
  // The messages are made only on an error (every Run checks the inputs).
  auto what = [&]() {
    return "dtype '" + k.parsed.code + "', shape " + shape_str(shape) + " and axis " +
           std::to_string(k.axis);
  };
  const char* fix = "; pass the tensors that QuantizeMX (or onnxq.cast(..., mode='compress')) "
                    "made for this dtype, shape and axis";
  auto get = [&](int slot, const char* name) { return input(ctx, slot, name); };
  auto need = [&](int slot, const char* name) {
    In in = get(slot, name);
    if (!in) throw OpError(std::string("input ") + name + " is required for " + what() + fix);
    return in;
  };
  auto check_field = [&](const In& in, const char* name, int type,
                         const std::vector<int64_t>& want, auto layout) {
    if (in.type != type || in.shape != want)
      throw OpError(std::string("input ") + name + " is " + type_name(in.type) + " of shape " +
                    shape_str(in.shape) + "; " + what() + " need " + type_name(type) +
                    " of shape " + shape_str(want) + " (" + layout() + ")" + fix);
  };
  auto absent = [&](int slot, const char* name, const char* lacks) {
    In in = get(slot, name);
    if (in && in.count != 0)
      throw OpError(std::string("input ") + name + " " + shape_str(in.shape) + " is given but " +
                    "dtype '" + k.parsed.code + "' has " + lacks + "; leave the input out (an " +
                    "empty name) or pass a zero-size tensor");
  };
  std::vector<int64_t> grid = {1};
  if (g.kind != 0) {
    grid = shape;
    grid[axis] = g.nC;
    if (g.kind == 2) grid[axis == 1 ? 0 : 1] = g.nR;
  }
  auto grid_layout = [] {
    return std::string("the tile grid: B's shape with the tiled dims replaced by tile counts");
  };
  int64_t kept = g.size;
  if (f.sparse_m) {
    In mk = need(kMmx.mask, "Mask");
    check_field(mk, "Mask", kU8, {packed_nbytes(g.size, 1)},
                [] { return std::string("one bit per element, packed"); });
    mask->assign(static_cast<size_t>(g.size), 0);
    unpack_bits(static_cast<const uint8_t*>(mk.data), 1, g.size, nullptr, mask->data(), 1);
    kept = 0;
    for (uint8_t m : *mask) kept += m != 0;
    io->mask = mask->data();
  } else {
    absent(kMmx.mask, "Mask", "no N:M sparsity");
  }
  const int bits = f.code_bits();
  In q = need(kMmx.q, "Q");
  check_field(q, "Q", kU8, {packed_nbytes(kept, bits)}, [&] {
    return std::to_string(kept) + " codes of " + std::to_string(bits) + " bits, packed";
  });
  io->packed = static_cast<const uint8_t*>(q.data);
  if (f.scaled) {
    In sc = need(kMmx.scale, "Scale");
    check_field(sc, "Scale", code_type(f.scale.bits), grid, grid_layout);
    io->scale = sc.data;
  } else {
    absent(kMmx.scale, "Scale", "no scale");
  }
  if (f.scaled && f.has_zero) {
    In z = need(kMmx.zero, "Zero");
    check_field(z, "Zero", code_type(f.zero.bits), grid, grid_layout);
    io->zero = z.data;
  } else {
    absent(kMmx.zero, "Zero", "no zero point");
  }
  if (f.scaled && f.has_ts) {
    In t = need(kMmx.ts, "TenScale");
    check_field(t, "TenScale", code_type(f.ts.bits), {1},
                [] { return std::string("one tensor scale"); });
    io->tenscale = t.data;
  } else {
    absent(kMmx.ts, "TenScale", "no tensor scale");
  }
  if (f.scaled && f.has_meta() && f.meta_bits()) {
    const int64_t nmeta = g.meta_count();
    In m = need(kMmx.meta, "Meta");
    check_field(m, "Meta", kU8, {packed_nbytes(nmeta, f.meta_bits())}, [&] {
      return std::to_string(nmeta) + " units of " + std::to_string(f.meta_bits()) +
             " bits, packed";
    });
    io->meta_packed = static_cast<const uint8_t*>(m.data);
  } else {
    absent(kMmx.meta, "Meta", "no meta bits");
    if (f.scaled && f.has_meta()) {
      meta->assign(static_cast<size_t>(g.meta_count()), 0);  // no meta bits: every index is 0
      io->meta = meta->data();
    }
  }
}

}  // namespace

void init_matmul_mx(Kernel* k, const OrtKernelInfo* info) {
  if (!k->fmt_ready)
    throw OpError("dtype '" + k->parsed.code + "' is a generic codebook: MatMulMX has no Table " +
                  "input; decode it with CodebookLookup and MatMul");
  int64_t trans_b = 0;
  if (attr_int(info, "trans_b", &trans_b) && trans_b != 0 && trans_b != 1)
    throw OpError("attribute 'trans_b' " + std::to_string(trans_b) + " must be 0 (Q holds B " +
                  "[K, N]) or 1 (Q holds W = B^T [N, K])");
  k->trans_b = trans_b == 1;
  if (k->shape.size() != 2)
    throw OpError("attribute 'shape' " + shape_str(k->shape) + " must be " +
                  (k->trans_b ? "W's [N, K]" : "B's [K, N]") + " (2 dims)");
  if (k->out_type != kTF32)
    throw OpError("attribute 'output_type' " + std::to_string(k->out_type) + ": only 1 " +
                  "(float) is supported; decode float16/bfloat16 weights with DequantizeMX " +
                  "and MatMul");
  const int axis = normal_axis(k->axis, 2, k->shape, "B");
  k->scale_values = mmx_scale_values(k->fmt);
  init_mmx_large(k, info);  // many rows: onnxruntime's MatMul on B decoded (its own header)
  // Constant weights: B's blocks rearranged for the vector path. Every Run still checks the
  // inputs it is given (the same constants) and reports what is wrong with them.
  try {
    In q = constant_input(info, kMmx.q), sc = constant_input(info, kMmx.scale);
    In z = constant_input(info, kMmx.zero);
    if (!q || !sc || q.type != kU8 || (k->fmt.has_zero && !z)) return;
    DequantizeIO b;
    b.packed = static_cast<const uint8_t*>(q.data);
    b.scale = sc.data;
    b.zero = z ? z.data : nullptr;
    mmx_prepack(k->fmt, k->shape, axis, b, q.count, sc.count * (sc.type == kU16 ? 2 : sc.type == kU8 ? 1 : 4),
                z ? z.count * (z.type == kU8 ? 1 : 2) : 0, &k->prepacked, k->trans_b);
  } catch (...) {
    k->prepacked = MmxPrepacked();  // the Runs read B as it is
  }
}

void compute_matmul_mx(const Kernel& k, OrtKernelContext* ctx) {
  const int64_t K = k.shape[k.trans_b ? 1 : 0], N = k.shape[k.trans_b ? 0 : 1];
  In a = input(ctx, kMmx.a, "A");
  if (!a) throw OpError("input A is missing");
  if (a.type != kTF32 || a.shape.empty() || a.shape.back() != K)
    throw OpError("input A is " + type_name(a.type) + " of shape " + shape_str(a.shape) +
                  "; it must be float of shape [..., K] with K = " + std::to_string(K) +
                  (k.trans_b ? " (W's shape " : " (B's shape ") + shape_str(k.shape) + ")");
  In bias = input(ctx, kMmx.bias, "Bias");
  if (bias && (bias.type != kTF32 || bias.shape != std::vector<int64_t>{N}))
    throw OpError("input Bias is " + type_name(bias.type) + " of shape " + shape_str(bias.shape) +
                  "; it must be float of shape (" + std::to_string(N) + ",) (B's N) or left out");
  const int axis = normal_axis(k.axis, 2, k.shape, "B");
  Geometry g;
  std::string e = make_geometry(k.fmt, k.shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (B of shape " + shape_str(k.shape) + ")");
  MatMulIO io;
  std::vector<uint8_t> mask, meta;
  check_packed(k, ctx, g, axis, &io.b, &mask, &meta);
  std::vector<int64_t> yshape(a.shape.begin(), a.shape.end() - 1);
  yshape.push_back(N);
  void* y = output(ctx, 0, "Y", yshape, kTF32, "MatMulMX");
  if (a.count == 0) return;  // an empty Y (its data pointer may be null)
  if (!y) throw OpError("output Y is missing");
  io.a = static_cast<const float*>(a.data);
  io.M = a.count / K;
  io.bias = bias ? static_cast<const float*>(bias.data) : nullptr;
  io.pre = &k.prepacked;
  io.trans_b = k.trans_b;
  io.y = static_cast<float*>(y);
  const ParallelFor pf = session_parallel_for(ctx);
  // M >= the threshold: onnxruntime's MatMul on the decoded B (the unfused graph's bits); it
  // falls back here (the documented order) when onnxruntime cannot run it.
  if (mmx_large_run(k, ctx, axis, io, pf)) return;
  e = matmul_mx(k.fmt, k.shape, axis, io, k.scale_values, pf);
  if (!e.empty()) throw OpError(e + " (B of shape " + shape_str(k.shape) + ")");
}

}  // namespace ort
}  // namespace onnxq
