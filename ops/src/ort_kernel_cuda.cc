// The custom ops on the CUDA execution provider (ort_kernel.h, cuda_launch.h, docs/gpu.md).
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "ort_kernel.h"

namespace onnxq {
namespace ort {

// -- the CUDA execution provider (cuda_launch.h, docs/gpu.md) ------------------------------
// The same ops on the session's compute stream with the Triton kernels compiled ahead of time:
// formats the library embeds, tiles along any axis, every mode but stochastic rounding and
// scale search. A node they cannot run takes the CPU kernel on host copies of its tensors
// (below), with one warning.

namespace {

// Why the device kernels cannot run the node ("" when they can; tiles along any axis): the
// reason onnxq_cuda_node_support gives too.
std::string init_reason(Kernel* k) {
  std::string invalid;
  std::string why =
      k->kind == kGather
          ? cuda::gather_reason(k->parsed, k->shape, k->axis, &invalid)
          : cuda::node_reason(k->parsed, k->kind == kLookup,
                              k->kind == kQuantize || k->kind == kQuantDequant, k->modes,
                              &invalid);
  if (!invalid.empty()) throw OpError(why);
  if (k->kind != kLookup && k->kind != kGather) k->gpu = cuda::find_format(k->parsed.code);
  return why;
}

// The node's name for a log line: control characters as '?', at most 200 characters (a
// model's strings are not trusted).
std::string node_name(const OrtKernelInfo* info) {
  size_t size = 0;
  if (OrtStatus* st = g_api->KernelInfo_GetNodeName(info, nullptr, &size)) {
    g_api->ReleaseStatus(st);
    return "";
  }
  std::string name(size, '\0');
  if (OrtStatus* st = g_api->KernelInfo_GetNodeName(info, name.data(), &size)) {
    g_api->ReleaseStatus(st);
    return "";
  }
  name.resize(size ? size - 1 : 0);
  if (name.size() > 200) name = name.substr(0, 200) + "...";
  for (char& c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return name;
}

// The host fallback's warning in the session's log (once per node: at kernel creation).
void warn_host_fallback(const Kernel& k, const OrtLogger* logger, const std::string& why) {
  if (!logger) return;
  const std::string node = k.node.empty() ? "an unnamed node" : "node '" + k.node + "'";
  const std::string msg =
      "[" + k.op + "] " + node + " runs on the CPU with host copies of its tensors, " +
      "slower than the GPU kernels (a copy each way and a stream synchronisation a run): " +
      why + ". ONNXQ_CUDA_HOST_FALLBACK=0 refuses such nodes instead.";
  OrtStatus* st = g_api->Logger_LogMessage(logger, ORT_LOGGING_LEVEL_WARNING, msg.c_str(),
                                           __FILE__, __LINE__, __func__);
  if (st) g_api->ReleaseStatus(st);
}

bool host_fallback_allowed() {
  const char* env = std::getenv("ONNXQ_CUDA_HOST_FALLBACK");
  return !(env && std::string(env) == "0");
}

}  // namespace

void init_cuda_kernel(Kernel* k, const OrtKernelInfo* info) {
  k->node = node_name(info);
  std::string why = init_reason(k);
  if (why.empty()) return;
  if (!host_fallback_allowed())
    throw OpError(why + "; ONNXQ_CUDA_HOST_FALLBACK=0 refuses to run it on the CPU (unset it, "
                  "or quantize the node to a format and modes with CUDA kernels)");
  k->host_reason = why;
  const OrtLogger* logger = nullptr;
  if (OrtStatus* st = g_api->KernelInfo_GetLogger(info, &logger)) g_api->ReleaseStatus(st);
  warn_host_fallback(*k, logger, why);
}

namespace {

void* gpu_stream(OrtKernelContext* ctx) {
  void* stream = nullptr;
  check(g_api->KernelContext_GetGPUComputeStream(ctx, &stream), "getting the compute stream");
  return stream;
}

// The Scale grid's shape and the shift-bit count of X's `shape`, as the CPU op has them
// (make_geometry: the same tiles).
struct Fields {
  std::vector<int64_t> grid;
  int64_t nmeta = 0;
};
Fields fields_of(const Kernel& k, const std::vector<int64_t>& shape, int axis) {
  Geometry g;
  std::string e = make_geometry(k.fmt, shape, axis, &g);
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
  return {grid_shape(g, shape, axis, g.nR, g.nC), k.fmt.has_meta() ? g.meta_count() : 0};
}

void compute_cuda_quantize(const Kernel& k, OrtKernelContext* ctx, const In& x, int axis) {
  const cuda::AotFormat& F = *k.gpu;
  const std::string why = "dtype '" + k.parsed.code + "'";
  void* q = output(ctx, kQOut.q, "Q", {packed_nbytes(x.count, F.code_bits)}, kU8, why);
  if (!q) throw OpError("output Q is missing");
  const Fields fields = fields_of(k, x.shape, axis);
  void* scale = output(ctx, kQOut.scale, "Scale", fields.grid, kU8, why);
  if (!scale) throw OpError("output Scale is missing");
  output(ctx, kQOut.zero, "Zero", {0}, 0, why);
  void* ts = output(ctx, kQOut.ts, "TenScale", {F.tenscale_bits ? 1 : 0},
                    F.tenscale_bits ? kU32 : 0, why);
  const int64_t nmeta = fields.nmeta;
  void* meta =
      output(ctx, kQOut.meta, "Meta", {nmeta ? packed_nbytes(nmeta, 1) : 0}, kU8, why);
  output(ctx, kQOut.mask, "Mask", {0}, kU8, why);
  // the embedded format's canonical code: the launcher matches it as text (no parse a run)
  std::string e = cuda::quantize_packed(
      F.code, x.data, float_kind(x.type), static_cast<int>(x.shape.size()),
      x.shape.data(), axis, q, scale, F.tenscale_bits ? ts : nullptr, nmeta ? meta : nullptr,
      gpu_stream(ctx), &k.modes);
  if (!e.empty()) throw OpError(e);
}

// QuantizeDequantizeMX: the virtual cast, values only (the kernels' values output).
void compute_cuda_quant_dequant(const Kernel& k, OrtKernelContext* ctx, const In& x, int axis) {
  void* y = output(ctx, kOutY, "Y", x.shape, x.type, "input X of type " + type_name(x.type));
  if (!y) throw OpError("output Y is missing");
  std::string e = cuda::quantize(k.gpu->code, x.data, float_kind(x.type),
                                 static_cast<int>(x.shape.size()), x.shape.data(), axis, y,
                                 nullptr, nullptr, nullptr, nullptr, gpu_stream(ctx),
                                 &k.modes);
  if (!e.empty()) throw OpError(e + " (X of shape " + shape_str(x.shape) + ")");
}

void compute_cuda_dequantize(const Kernel& k, OrtKernelContext* ctx,
                             const std::vector<int64_t>& shape, int axis) {
  const cuda::AotFormat& F = *k.gpu;
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
  const Fields fields = fields_of(k, shape, axis);
  In scale = need(1, "Scale", kU8, fields.grid);
  const void* ts = F.tenscale_bits ? need(3, "TenScale", kU32, {1}).data : nullptr;
  const int64_t nmeta = fields.nmeta;
  const void* meta = nmeta ? need(4, "Meta", kU8, {packed_nbytes(nmeta, 1)}).data : nullptr;
  void* y =
      output(ctx, kOutY, "Y", shape, k.out_type, "output_type " + std::to_string(k.out_type));
  if (!y) throw OpError("output Y is missing");
  if (count == 0) return;  // an empty Y
  std::string e = cuda::dequantize_packed(
      F.code, static_cast<int>(shape.size()), shape.data(), axis, q.data, scale.data, ts,
      meta, y, float_kind(k.out_type), gpu_stream(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

void compute_cuda_lookup(const Kernel& k, OrtKernelContext* ctx) {
  const std::vector<int64_t>& shape = k.shape;  // the attribute (required for this op)
  const int axis = normal_axis(k.axis, shape.size(), shape, "X's shape");
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
  e = cuda::lookup_packed(f, static_cast<int>(shape.size()), shape.data(), axis, q.data,
                          scale.data, meta, y, float_kind(k.out_type), gpu_stream(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

// -- the host fallback ------------------------------------------------------------------------
// The CPU kernel runs unchanged (IoRedirect, ort_io.h): each input in device memory is copied
// to the host on the compute stream (which waits for the kernels that wrote it), each output
// is written to a host buffer, and at the end the outputs are copied to the device and the
// stream synchronised, so the host buffers can go.

class HostCopies final : public IoRedirect {
 public:
  HostCopies(OpKind kind, void* stream) : kind_(kind), stream_(stream) {}
  ~HostCopies() override {
    if (queued_) cuda::synchronize(queued_, stream_);  // an exception left copies queued
  }

  const void* input(size_t index, const In& in) override {
    if (reads_on_host(kind_, index)) return in.data;  // Shape, Table, Indices: on the host
    const int64_t bytes = in.count * element_bytes(in.type);
    if (bytes <= 0)
      throw OpError("input " + std::to_string(index) + " of type " + type_name(in.type) +
                    " cannot be copied to the host");
    inputs_.emplace_back(static_cast<size_t>(bytes));
    std::string e = cuda::copy_to_host(inputs_.back().data(), in.data, inputs_.back().size(),
                                       stream_);
    if (!e.empty()) throw OpError("copying an input to the host: " + e);
    return inputs_.back().data();
  }

  void* output(size_t, void* data, int64_t bytes) override {
    outputs_.push_back({data, std::vector<uint8_t>(static_cast<size_t>(bytes))});
    return outputs_.back().host.data();
  }

  // Queues every output's copy to the device and waits for them.
  void finish() {
    for (const Out& o : outputs_) {
      std::string e = cuda::copy_to_device(o.device, o.host.data(), o.host.size(), stream_);
      if (!e.empty()) throw OpError("copying an output to the device: " + e);
      queued_ = o.device;
    }
    if (!queued_) return;
    std::string e = cuda::synchronize(queued_, stream_);
    queued_ = nullptr;
    if (!e.empty()) throw OpError("waiting for the copies to the device: " + e);
  }

 private:
  struct Out {
    void* device;
    std::vector<uint8_t> host;
  };
  OpKind kind_;
  void* stream_;
  std::deque<std::vector<uint8_t>> inputs_;  // a deque: earlier buffers never move
  std::deque<Out> outputs_;
  const void* queued_ = nullptr;  // a device pointer of the copies queued, until they finish
};

void compute_on_host(const Kernel& k, OrtKernelContext* ctx) {
  HostCopies copies(k.kind, gpu_stream(ctx));
  {
    IoRedirectScope redirect(&copies);
    if (k.kind == kQuantize) {
      compute_quantize(k, ctx);
    } else if (k.kind == kQuantDequant) {
      compute_quant_dequant(k, ctx);
    } else if (k.kind == kGather) {
      compute_gather(k, ctx);
    } else {
      compute_dequantize(k, ctx);  // DequantizeMX and CodebookLookup
    }
  }
  copies.finish();
}

}  // namespace

void compute_cuda(const Kernel& k, OrtKernelContext* ctx) {
  if (!k.host_reason.empty()) return compute_on_host(k, ctx);
  if (k.kind == kLookup) return compute_cuda_lookup(k, ctx);
  if (k.kind == kGather) return compute_gather_cuda(k, ctx, gpu_stream(ctx));
  if (k.kind == kDequantize) {
    // X's shape: the Shape input (in host memory, GetInputMemoryType) or the attribute.
    const std::vector<int64_t> shape = node_shape(k, input(ctx, kInShape, "Shape"));
    const int axis = normal_axis(k.axis, shape.size(), shape, "X's shape");
    return compute_cuda_dequantize(k, ctx, shape, axis);
  }
  In x = input(ctx, kInX, "X");  // QuantizeMX, QuantizeDequantizeMX
  if (!x) throw OpError("input X is missing");
  if (x.type != kTF32 && x.type != kTF16 && x.type != kTBF16)
    throw OpError("input X must be float, float16 or bfloat16, got " + type_name(x.type));
  if (x.shape.empty()) throw OpError("input X is a 0-D scalar; reshape it to (1,)");
  if (x.count == 0) return compute_on_host(k, ctx);  // empty outputs: nothing to launch
  const int axis = normal_axis(k.axis, x.shape.size(), x.shape, "X");
  if (k.kind == kQuantize) return compute_cuda_quantize(k, ctx, x, axis);
  compute_cuda_quant_dequant(k, ctx, x, axis);
}

}  // namespace ort
}  // namespace onnxq
