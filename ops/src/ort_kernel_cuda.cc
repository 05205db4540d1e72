// The custom ops on the CUDA execution provider (ort_kernel.h, cuda_launch.h, docs/gpu.md).
#include <cstdint>
#include <string>
#include <vector>

#include "ort_kernel.h"

namespace onnxq {
namespace ort {

// -- the CUDA execution provider (cuda_launch.h, docs/gpu.md) ------------------------------
// The same ops on the session's compute stream with the Triton kernels compiled ahead of time:
// formats the library embeds, tiles along the last axis, the default modes. Anything else is
// refused when the session creates the kernel, naming what to do instead.

namespace {

// CodebookLookup: the format's structure (tiles, scale, widths) decides; a generic codebook's
// values come with the Table input at each Run, so zeros stand in for them here.
void init_cuda_lookup(const Kernel& k) {
  Format probe;
  const Format* f = &k.fmt;
  if (!k.fmt_ready) {
    const int bits = k.parsed.fmt.cb_meta_bits + k.parsed.fmt.cb_index_bits;
    std::vector<double> zeros(size_t(1) << bits, 0.0);
    std::string e = to_format(k.parsed, &zeros, &probe);
    if (!e.empty()) throw OpError("dtype '" + k.parsed.code + "': " + e);
    f = &probe;
  }
  std::string e = cuda::lookup_supported(*f);
  if (!e.empty()) throw OpError("dtype '" + k.parsed.code + "': " + e);
  if (k.axis != -1 && k.axis != static_cast<int64_t>(k.shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k.axis) + "); run this node on the CPU execution provider");
}

}  // namespace

void init_cuda_kernel(Kernel* k) {
  if (k->kind == kLookup) {
    init_cuda_lookup(*k);
    return;
  }
  k->gpu = cuda::find_format(k->parsed.code);
  const char* where = "; run this node on the CPU execution provider (or quantize it to a format "
                      "that has CUDA kernels)";
  if (!k->gpu)
    throw OpError("dtype '" + k->parsed.code + "' has no CUDA kernel in this library (" +
                  cuda::describe() + ")" + where);
  if (k->kind == kQuantize && (k->modes.round_mode != 0 || k->modes.scale_mode != 0 ||
                               k->modes.nan_policy != 0 || k->modes.full_int_range))
    throw OpError("the CUDA kernels are compiled for the default modes (round even, scale floor, "
                  "nan element, symmetric ints)" + std::string(where));
  // (Without the attribute, X's rank is known at Run only: compute_cuda_dequantize checks it.)
  if (k->kind == kDequantize && k->axis != -1 && !k->shape.empty() &&
      k->axis != static_cast<int64_t>(k->shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k->axis) + ")" + where);
}

namespace {

void* gpu_stream(OrtKernelContext* ctx) {
  void* stream = nullptr;
  check(g_api->KernelContext_GetGPUComputeStream(ctx, &stream), "getting the compute stream");
  return stream;
}

std::vector<int64_t> gpu_grid(const cuda::AotFormat& F, std::vector<int64_t> shape) {
  int64_t C = shape.back();
  shape.back() = (C + F.tile - 1) / F.tile;
  return shape;
}

int64_t gpu_meta_count(const cuda::AotFormat& F, const std::vector<int64_t>& shape) {
  if (!F.sub) return 0;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  return rows * ((shape.back() + F.sub - 1) / F.sub);
}

}  // namespace

void compute_cuda_quantize(const Kernel& k, OrtKernelContext* ctx) {
  In x = input(ctx, kInX, "X");
  if (!x) throw OpError("input X is missing");
  if (x.type != kTF32 && x.type != kTF16 && x.type != kTBF16)
    throw OpError("input X must be float, float16 or bfloat16, got " + type_name(x.type));
  if (x.shape.empty()) throw OpError("input X is a 0-D scalar; reshape it to (1,)");
  if (x.count == 0) throw OpError("cannot cast an empty tensor of shape " + shape_str(x.shape));
  int axis = normal_axis(k.axis, x.shape.size(), x.shape, "X");
  if (axis != static_cast<int>(x.shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k.axis) + " of X " + shape_str(x.shape) + ")");
  const cuda::AotFormat& F = *k.gpu;
  const std::string why = "dtype '" + k.parsed.code + "'";
  void* q = output(ctx, kQOut.q, "Q", {packed_nbytes(x.count, F.code_bits)}, kU8, why);
  if (!q) throw OpError("output Q is missing");
  void* scale = output(ctx, kQOut.scale, "Scale", gpu_grid(F, x.shape), kU8, why);
  if (!scale) throw OpError("output Scale is missing");
  output(ctx, kQOut.zero, "Zero", {0}, 0, why);
  void* ts = output(ctx, kQOut.ts, "TenScale", {F.tenscale_bits ? 1 : 0},
                    F.tenscale_bits ? kU32 : 0, why);
  int64_t nmeta = gpu_meta_count(F, x.shape);
  void* meta =
      output(ctx, kQOut.meta, "Meta", {nmeta ? packed_nbytes(nmeta, 1) : 0}, kU8, why);
  output(ctx, kQOut.mask, "Mask", {0}, kU8, why);
  std::string e = cuda::quantize_packed(
      k.parsed.code, x.data, float_kind(x.type), static_cast<int>(x.shape.size()),
      x.shape.data(), axis, q, scale, F.tenscale_bits ? ts : nullptr, nmeta ? meta : nullptr,
      gpu_stream(ctx));
  if (!e.empty()) throw OpError(e);
}

void compute_cuda_dequantize(const Kernel& k, OrtKernelContext* ctx) {
  const cuda::AotFormat& F = *k.gpu;
  // X's shape: the Shape input (in host memory, GetInputMemoryType) or the attribute.
  const std::vector<int64_t> shape = node_shape(k, input(ctx, kInShape, "Shape"));
  int axis = normal_axis(k.axis, shape.size(), shape, "X's shape");
  if (axis != static_cast<int>(shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k.axis) + " of X " + shape_str(shape) + ")");
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  auto need = [&](size_t index, const char* name, int type, const std::vector<int64_t>& want) {
    In in = input(ctx, index, name);
    if (!in) throw OpError(std::string("input ") + name + " is required by dtype '" +
                           k.parsed.code + "'");
    if (in.type != type || in.shape != want)
      throw OpError(std::string("input ") + name + " must be " + type_name(type) + " of shape " +
                    shape_str(want) + " for shape " + shape_str(shape) + ", got " +
                    type_name(in.type) + " " + shape_str(in.shape));
    return in;
  };
  In q = need(0, "Q", kU8, {packed_nbytes(count, F.code_bits)});
  In scale = need(1, "Scale", kU8, gpu_grid(F, shape));
  const void* ts = F.tenscale_bits ? need(3, "TenScale", kU32, {1}).data : nullptr;
  int64_t nmeta = gpu_meta_count(F, shape);
  const void* meta = nmeta ? need(4, "Meta", kU8, {packed_nbytes(nmeta, 1)}).data : nullptr;
  void* y =
      output(ctx, kOutY, "Y", shape, k.out_type, "output_type " + std::to_string(k.out_type));
  if (!y) throw OpError("output Y is missing");
  if (count == 0) return;  // an empty Y
  std::string e = cuda::dequantize_packed(
      k.parsed.code, static_cast<int>(shape.size()), shape.data(), -1, q.data, scale.data, ts,
      meta, y, float_kind(k.out_type), gpu_stream(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

void compute_cuda_lookup(const Kernel& k, OrtKernelContext* ctx) {
  const std::vector<int64_t>& shape = k.shape;  // the attribute (required for this op)
  int axis = normal_axis(k.axis, shape.size(), shape, "X's shape");
  if (axis != static_cast<int>(shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k.axis) + " of X " + shape_str(shape) + ")");
  Format with_table;  // the Table input read and checked as on the CPU
  const Format& f = lookup_format(k, input(ctx, kInTable, "Table"), &with_table);
  Geometry g;
  std::string e = make_geometry(f, shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
  auto need = [&](int index, const char* name, const std::vector<int64_t>& want) {
    In in = input(ctx, index, name);
    if (!in) throw OpError(std::string("input ") + name + " is required by dtype '" +
                           k.parsed.code + "'");
    if (in.type != kU8 || in.shape != want)
      throw OpError(std::string("input ") + name + " must be uint8 of shape " + shape_str(want) +
                    " for shape " + shape_str(shape) + ", got " + type_name(in.type) + " " +
                    shape_str(in.shape));
    return in;
  };
  using contract::input_index;
  In q = need(input_index(kLookup, "Q"), "Q", {packed_nbytes(g.size, f.cb_ib)});
  In scale = need(input_index(kLookup, "Scale"), "Scale", grid_shape(g, shape, axis, g.nR, g.nC));
  const void* meta = nullptr;
  if (f.cb_mb)
    meta = need(input_index(kLookup, "Meta"), "Meta", {packed_nbytes(g.meta_count(), f.cb_mb)})
               .data;
  void* y =
      output(ctx, kOutY, "Y", shape, k.out_type, "output_type " + std::to_string(k.out_type));
  if (!y) throw OpError("output Y is missing");
  if (g.size == 0) return;  // an empty Y
  e = cuda::lookup_packed(f, static_cast<int>(shape.size()), shape.data(), -1, q.data,
                          scale.data, meta, y, float_kind(k.out_type), gpu_stream(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

}  // namespace ort
}  // namespace onnxq
