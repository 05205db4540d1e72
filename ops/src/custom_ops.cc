// The onnxruntime custom ops QuantizeMX, DequantizeMX and CodebookLookup (domain `onnxq`,
// version 1; contract in docs/ops.md) on the shared kernels of kernels.h.
//
// Written against the onnxruntime C API with the status-returning entry points
// (OrtCustomOp::CreateKernelV2 / KernelComputeV2, API 16+): every callback catches everything,
// and every error is an OrtStatus whose message starts with "[OpName]".
//
// Types. onnxruntime infers a custom op's output types from its input types only; it cannot
// know that Scale's type depends on the `dtype` attribute or Y's on `output_type`. So those
// outputs are declared "any type", each op is registered once per combination of fixed input
// types (the ops' schema merges them), and onnxruntime then takes the output types the model
// declares (graph outputs or value_info; onnxq.runtime.session adds them with ONNX shape
// inference). The kernels check every declared type. A last, all-types registration of each op
// lets a wrongly typed input reach the kernel, which names it in its error.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_launch.h"
#include "kernels.h"
#include "onnxq_ops.h"
#include "onnxruntime_c_api.h"
#include "parse.h"

namespace onnxq {
namespace {

// CreateKernelV2 / KernelComputeV2 need API 16; KernelContext_ParallelFor needs 17.
constexpr uint32_t kMinApi = 16;
const OrtApi* g_api = nullptr;
uint32_t g_version = 0;

using TypeList = std::vector<ONNXTensorElementDataType>;
constexpr ONNXTensorElementDataType kAny = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
constexpr ONNXTensorElementDataType kU8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
constexpr ONNXTensorElementDataType kU16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
constexpr ONNXTensorElementDataType kU32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32;
constexpr ONNXTensorElementDataType kTF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kTF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kTBF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

// An error with its message ready for an OrtStatus (thrown inside a kernel, caught at the ABI).
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string type_name(int t) {
  switch (t) {
    case kTF32: return "float";
    case kTF16: return "float16";
    case kTBF16: return "bfloat16";
    case kU8: return "uint8";
    case kU16: return "uint16";
    case kU32: return "uint32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
    default: return "element type " + std::to_string(t);
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Turns a failed onnxruntime call into an OpError (the status is released).
void check(OrtStatus* st, const std::string& what) {
  if (!st) return;
  std::string msg = g_api->GetErrorMessage(st);
  g_api->ReleaseStatus(st);
  throw OpError(what + ": " + msg);
}

int code_type(int bits) { return bits <= 8 ? kU8 : bits <= 16 ? kU16 : kU32; }
int float_kind(int onnx_type) { return onnx_type == kTF16 ? onnxq::kF16 : onnx_type == kTBF16 ? onnxq::kBF16 : onnxq::kF32; }

// -- attributes ---------------------------------------------------------------------------

bool attr_string(const OrtKernelInfo* info, const char* name, std::string* out) {
  size_t size = 0;
  OrtStatus* st = g_api->KernelInfoGetAttribute_string(info, name, nullptr, &size);
  if (st) {
    g_api->ReleaseStatus(st);
    return false;
  }
  std::string buf(size, '\0');
  check(g_api->KernelInfoGetAttribute_string(info, name, &buf[0], &size),
        std::string("reading attribute '") + name + "'");
  buf.resize(size && buf[size - 1] == '\0' ? size - 1 : size);
  *out = std::move(buf);  // not c_str(): an embedded NUL must reach the parser, not cut the text
  return true;
}

bool attr_int(const OrtKernelInfo* info, const char* name, int64_t* out) {
  OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, name, out);
  if (!st) return true;
  g_api->ReleaseStatus(st);
  std::string s;
  float f;
  if (attr_string(info, name, &s)) throw OpError("attribute '" + std::string(name) + "' must be an int, got the string '" + s + "'");
  st = g_api->KernelInfoGetAttribute_float(info, name, &f);
  if (!st) throw OpError("attribute '" + std::string(name) + "' must be an int, got the float " + std::to_string(f));
  g_api->ReleaseStatus(st);
  return false;
}

bool attr_ints(const OrtKernelInfo* info, const char* name, std::vector<int64_t>* out) {
  size_t size = 0;
  OrtStatus* st = g_api->KernelInfoGetAttributeArray_int64(info, name, nullptr, &size);
  if (st) {
    g_api->ReleaseStatus(st);
    return false;
  }
  out->assign(size, 0);
  if (size)
    check(g_api->KernelInfoGetAttributeArray_int64(info, name, out->data(), &size),
          std::string("reading attribute '") + name + "'");
  return true;
}

int choice(const std::string& name, const std::string& value,
           const std::vector<std::string>& options) {
  for (size_t i = 0; i < options.size(); ++i)
    if (value == options[i]) return static_cast<int>(i);
  std::string valid;
  for (const auto& o : options) valid += (valid.empty() ? "'" : ", '") + o + "'";
  throw OpError("unknown " + name + " " + quote_code(value) + ": expected one of " + valid);
}

// -- tensors ------------------------------------------------------------------------------

struct In {
  const OrtValue* v = nullptr;
  int type = 0;
  std::vector<int64_t> shape;
  int64_t count = 0;
  const void* data = nullptr;
  explicit operator bool() const { return v != nullptr; }
};

In input(OrtKernelContext* ctx, size_t index, const char* name) {
  In in;
  size_t n = 0;
  check(g_api->KernelContext_GetInputCount(ctx, &n), "counting inputs");
  if (index >= n) return in;
  check(g_api->KernelContext_GetInput(ctx, index, &in.v), std::string("reading input ") + name);
  if (!in.v) return in;
  int is_tensor = 0;
  check(g_api->IsTensor(in.v, &is_tensor), std::string("reading input ") + name);
  if (!is_tensor) throw OpError(std::string("input ") + name + " must be a tensor");
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(g_api->GetTensorTypeAndShape(in.v, &info), std::string("reading input ") + name);
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> hold(
      info, [](OrtTensorTypeAndShapeInfo* p) { g_api->ReleaseTensorTypeAndShapeInfo(p); });
  ONNXTensorElementDataType t;
  size_t ndim = 0;
  check(g_api->GetTensorElementType(info, &t), "reading a type");
  check(g_api->GetDimensionsCount(info, &ndim), "reading a shape");
  in.type = t;
  in.shape.assign(ndim, 0);
  if (ndim) check(g_api->GetDimensions(info, in.shape.data(), ndim), "reading a shape");
  in.count = 1;
  for (int64_t d : in.shape) in.count *= d;
  void* data = nullptr;
  check(g_api->GetTensorMutableData(const_cast<OrtValue*>(in.v), &data),
        std::string("reading input ") + name);
  in.data = data;
  return in;
}

// Allocates output `index` with `shape` and checks its declared element type; nullptr when
// the node does not have that output.
void* output(OrtKernelContext* ctx, size_t index, const char* name,
             const std::vector<int64_t>& shape, int want_type, const std::string& why) {
  size_t n = 0;
  check(g_api->KernelContext_GetOutputCount(ctx, &n), "counting outputs");
  if (index >= n) return nullptr;
  OrtValue* v = nullptr;
  check(g_api->KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &v),
        std::string("allocating output ") + name + " of shape " + shape_str(shape));
  if (!v) return nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(g_api->GetTensorTypeAndShape(v, &info), std::string("reading output ") + name);
  ONNXTensorElementDataType t;
  OrtStatus* st = g_api->GetTensorElementType(info, &t);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  check(st, "reading a type");
  if (want_type && t != want_type)
    throw OpError("output " + std::string(name) + " is declared " + type_name(t) + " but " + why +
                  " makes it " + type_name(want_type));
  void* data = nullptr;
  check(g_api->GetTensorMutableData(v, &data), std::string("writing output ") + name);
  return data;
}

// -- threads ------------------------------------------------------------------------------

struct Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, tasks;
  std::atomic<bool> failed{false};
  std::string what;
  std::mutex mu;
};

void run_task(void* user, size_t i) {
  Job* job = static_cast<Job*>(user);
  try {
    int64_t b = job->n * static_cast<int64_t>(i) / job->tasks;
    int64_t e = job->n * static_cast<int64_t>(i + 1) / job->tasks;
    if (b < e) (*job->fn)(b, e);
  } catch (const std::exception& ex) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->failed = true;
    job->what = ex.what();
  } catch (...) {
    job->failed = true;
  }
}

// The kernels' ParallelFor on the session's intra-op thread pool (API 17+), else our own pool.
ParallelFor session_parallel_for(OrtKernelContext* ctx) {
  if (g_version < 17) return default_parallel_for(0);
  return [ctx](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    int64_t workers = std::max<int64_t>(1, std::thread::hardware_concurrency());
    Job job;
    job.fn = &fn;
    job.n = n;
    job.tasks = std::min<int64_t>(n, workers * 4);
    if (job.tasks == 1) {
      fn(0, n);
      return;
    }
    OrtStatus* st = g_api->KernelContext_ParallelFor(ctx, run_task, static_cast<size_t>(job.tasks),
                                                     0, &job);
    if (st) {  // no pool: run here
      g_api->ReleaseStatus(st);
      fn(0, n);
      return;
    }
    if (job.failed) throw OpError("a worker thread failed: " + job.what);
  };
}

// -- kernels ------------------------------------------------------------------------------

enum OpKind { kQuantize, kDequantize, kLookup };
const char* const kOpNames[] = {"QuantizeMX", "DequantizeMX", "CodebookLookup"};

struct Kernel {
  OpKind kind;
  std::string op;
  ParsedType parsed;
  Format fmt;             // ready unless the dtype is a generic codebook (Table input)
  bool fmt_ready = false;
  int64_t axis = -1;
  Modes modes;
  std::vector<int64_t> shape;  // Dequantize / Lookup: X's shape
  int out_type = kTF32;         // ONNX element type of Y
  const cuda::AotFormat* gpu = nullptr;  // CUDA EP registrations: the embedded kernels' format
};

void init_kernel(Kernel* k, const OrtKernelInfo* info) {
  std::string dtype;
  if (!attr_string(info, "dtype", &dtype))
    throw OpError("attribute 'dtype' (a preset such as 'mxfp4' or a data type code) is required");
  std::string e = parse_dtype(dtype, &k->parsed);
  if (!e.empty()) throw OpError("dtype " + quote_code(dtype) + ": " + e);
  if (!k->parsed.generic_codebook) {
    e = to_format(k->parsed, nullptr, &k->fmt);
    if (!e.empty()) throw OpError("dtype " + quote_code(dtype) + ": " + e);
    k->fmt_ready = true;
  }
  attr_int(info, "axis", &k->axis);
  if (k->kind == kQuantize) {
    std::string s;
    if (k->parsed.generic_codebook)
      throw OpError("dtype '" + dtype + "' is a generic codebook with no mappings; QuantizeMX " +
                    "encodes presets and implicit codebooks (cb<I><M><desc>_...)");
    if (attr_string(info, "round_mode", &s))
      k->modes.round_mode = choice("round_mode", s, {"even", "away", "zero", "stochastic"});
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
    throw OpError("dtype '" + dtype + "' is not a codebook; use DequantizeMX");
  if (!attr_ints(info, "shape", &k->shape))
    throw OpError("attribute 'shape' (the ints of X's shape) is required");
  if (k->shape.empty()) throw OpError("attribute 'shape' is empty; X has at least one dim");
  // count <= 2^40 / d before each product: no int64 overflow, whatever the dims.
  constexpr int64_t kMaxCount = int64_t(1) << 40;
  int64_t count = 1;
  for (int64_t d : k->shape) {
    if (d < 1 || count > kMaxCount / d)
      throw OpError("attribute 'shape' " + shape_str(k->shape) +
                    " must hold positive dims of a tensor of at most 2^40 elements; set it to " +
                    "X's shape");
    count *= d;
  }
  int64_t t = kTF32;
  if (attr_int(info, "output_type", &t) && t != kTF32 && t != kTF16 && t != kTBF16)
    throw OpError("attribute 'output_type' " + std::to_string(t) +
                  " must be 1 (float), 10 (float16) or 16 (bfloat16)");
  k->out_type = static_cast<int>(t);
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

template <typename T>
std::vector<T> buffer(int64_t n) {
  return std::vector<T>(static_cast<size_t>(n > 0 ? n : 0));
}

void compute_quantize(const Kernel& k, OrtKernelContext* ctx) {
  In x = input(ctx, 0, "X");
  if (!x) throw OpError("input X is missing");
  if (x.type != kTF32 && x.type != kTF16 && x.type != kTBF16)
    throw OpError("input X must be float, float16 or bfloat16, got " + type_name(x.type) +
                  " of shape " + shape_str(x.shape));
  if (x.shape.empty()) throw OpError("input X is a 0-D scalar; reshape it to (1,)");
  if (x.count == 0) throw OpError("cannot cast an empty tensor of shape " + shape_str(x.shape));
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
  QuantizeIO io;
  io.x = x.data;
  io.x_type = float_kind(x.type);
  // Without a mask every output's size is known: the kernels write Q (packed), Scale, Zero and
  // TenScale in place.
  bool direct = !f.sparse_m;
  void* q = nullptr;
  if (direct) {
    q = output(ctx, 0, "Q", {packed_nbytes(x.count, bits)}, kU8, why);
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
    io.scale = field_out(1, "Scale", grid, f.scale.bits, &scale, nscale);
    if (f.has_zero) io.zero = field_out(2, "Zero", grid, f.zero.bits, &zero, nscale);
    if (f.has_ts) io.tenscale = field_out(3, "TenScale", {1}, f.ts.bits, &ts, 1);
    // Meta (packed) is written in place when the node names it; otherwise it is not made.
    if (nmeta && f.meta_bits()) {
      void* m = output(ctx, 4, "Meta", {packed_nbytes(nmeta, f.meta_bits())}, kU8, why);
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
    q = output(ctx, 0, "Q", {packed_nbytes(kept, bits)}, kU8, why);
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
  field(1, "Scale", f.scaled, grid, f.scale.bits, scale);
  field(2, "Zero", f.has_zero, grid, f.has_zero ? f.zero.bits : 8, zero);
  field(3, "TenScale", f.has_ts, {1}, f.has_ts ? f.ts.bits : 8, ts);
  if (!(f.scaled && nmeta && f.meta_bits()))
    output(ctx, 4, "Meta", {0}, kU8, why);  // a zero-size tensor when the node names it
  void* mk = output(ctx, 5, "Mask", {io.mask ? packed_nbytes(x.count, 1) : 0}, kU8, why);
  if (mk && io.mask) pack_bits(mask.data(), 1, x.count, 1, nullptr, static_cast<uint8_t*>(mk));
}

// Input positions of DequantizeMX / CodebookLookup (-1: the op has no such input).
struct Slots {
  int q, scale, zero, ts, meta, mask, table;
};
constexpr Slots kDequantSlots{0, 1, 2, 3, 4, 5, -1};
constexpr Slots kLookupSlots{0, 2, -1, -1, 1, -1, 3};

void compute_dequantize(const Kernel& k, OrtKernelContext* ctx) {
  const Slots& s = k.kind == kLookup ? kLookupSlots : kDequantSlots;
  const std::vector<int64_t>& shape = k.shape;
  int axis = normal_axis(k.axis, shape.size(), shape, "the attribute shape");
  Format table_fmt;
  const Format* fp = &k.fmt;
  In table = s.table >= 0 ? input(ctx, s.table, "Table") : In{};
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
    std::string e = to_format(k.parsed, &values, &table_fmt);
    if (!e.empty()) throw OpError("dtype '" + k.parsed.code + "' with the Table input: " + e);
    fp = &table_fmt;
  } else if (!k.fmt_ready) {
    throw OpError("dtype '" + k.parsed.code + "' is a generic codebook: the Table input " +
                  "(2^meta_bits x 2^index_bits floats) is required");
  }
  const Format& f = *fp;
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
    In in = slot >= 0 ? input(ctx, slot, name) : In{};
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
    In in = slot >= 0 ? input(ctx, slot, name) : In{};
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
  void* y = output(ctx, 0, "Y", shape, k.out_type,
                   "output_type " + std::to_string(k.out_type));
  if (!y) throw OpError("output Y is missing");
  io.values = y;
  io.values_type = float_kind(k.out_type);
  e = dequantize(f, shape, axis, io, session_parallel_for(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

// -- the CUDA execution provider (cuda_launch.h, docs/gpu.md) ------------------------------
// The same ops on the session's compute stream with the Triton kernels compiled ahead of time:
// formats the library embeds, tiles along the last axis, the default modes. Anything else is
// refused when the session creates the kernel, naming what to do instead.

void init_cuda_kernel(Kernel* k) {
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
  if (k->kind == kDequantize && k->axis != -1 &&
      k->axis != static_cast<int64_t>(k->shape.size()) - 1)
    throw OpError("the CUDA kernels tile along the last axis only (axis " +
                  std::to_string(k->axis) + ")" + where);
}

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

void compute_cuda_quantize(const Kernel& k, OrtKernelContext* ctx) {
  In x = input(ctx, 0, "X");
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
  void* q = output(ctx, 0, "Q", {packed_nbytes(x.count, F.code_bits)}, kU8, why);
  if (!q) throw OpError("output Q is missing");
  void* scale = output(ctx, 1, "Scale", gpu_grid(F, x.shape), kU8, why);
  if (!scale) throw OpError("output Scale is missing");
  output(ctx, 2, "Zero", {0}, 0, why);
  void* ts = output(ctx, 3, "TenScale", {F.tenscale_bits ? 1 : 0}, F.tenscale_bits ? kU32 : 0,
                    why);
  int64_t nmeta = gpu_meta_count(F, x.shape);
  void* meta = output(ctx, 4, "Meta", {nmeta ? packed_nbytes(nmeta, 1) : 0}, kU8, why);
  output(ctx, 5, "Mask", {0}, kU8, why);
  std::string e = cuda::quantize_packed(
      k.parsed.code, x.data, float_kind(x.type), static_cast<int>(x.shape.size()),
      x.shape.data(), axis, q, scale, F.tenscale_bits ? ts : nullptr, nmeta ? meta : nullptr,
      gpu_stream(ctx));
  if (!e.empty()) throw OpError(e);
}

void compute_cuda_dequantize(const Kernel& k, OrtKernelContext* ctx) {
  const cuda::AotFormat& F = *k.gpu;
  const std::vector<int64_t>& shape = k.shape;
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
  void* y = output(ctx, 0, "Y", shape, k.out_type, "output_type " + std::to_string(k.out_type));
  if (!y) throw OpError("output Y is missing");
  std::string e = cuda::dequantize_packed(
      k.parsed.code, static_cast<int>(shape.size()), shape.data(), -1, q.data, scale.data, ts,
      meta, y, float_kind(k.out_type), gpu_stream(ctx));
  if (!e.empty()) throw OpError(e + " (shape " + shape_str(shape) + ")");
}

// -- the OrtCustomOp table ----------------------------------------------------------------

struct OpDef : OrtCustomOp {
  OpKind kind;
  bool cuda = false;  // registered for the CUDA execution provider
  TypeList inputs, outputs;
  std::vector<OrtCustomOpInputOutputCharacteristic> in_char, out_char;
};

const OpDef& def(const OrtCustomOp* op) { return *static_cast<const OpDef*>(op); }

OrtStatus* error_status(const std::string& op, const std::string& msg) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, ("[" + op + "] " + msg).c_str());
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*,
                                      const OrtKernelInfo* info, void** kernel) noexcept {
  const char* name = kOpNames[def(op).kind];
  try {
    auto k = std::make_unique<Kernel>();
    k->kind = def(op).kind;
    k->op = name;
    init_kernel(k.get(), info);
    if (def(op).cuda) init_cuda_kernel(k.get());
    *kernel = k.release();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return error_status(name, "out of memory");
  } catch (const std::exception& ex) {
    return error_status(name, ex.what());
  } catch (...) {
    return error_status(name, "unknown error");
  }
}

OrtStatus* ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) noexcept {
  const Kernel& k = *static_cast<const Kernel*>(kernel);
  try {
    if (k.gpu) {
      if (k.kind == kQuantize) {
        compute_cuda_quantize(k, ctx);
      } else {
        compute_cuda_dequantize(k, ctx);
      }
    } else if (k.kind == kQuantize) {
      compute_quantize(k, ctx);
    } else {
      compute_dequantize(k, ctx);
    }
    return nullptr;
  } catch (const std::bad_alloc&) {
    return error_status(k.op, "out of memory");
  } catch (const std::exception& ex) {
    return error_status(k.op, ex.what());
  } catch (...) {
    return error_status(k.op, "unknown error");
  }
}

void ORT_API_CALL destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

OpDef make_def(OpKind kind, TypeList inputs, TypeList outputs, size_t required_inputs,
               bool cuda = false) {
  OpDef d;
  std::memset(static_cast<OrtCustomOp*>(&d), 0, sizeof(OrtCustomOp));
  d.version = g_version;
  d.kind = kind;
  d.cuda = cuda;
  d.inputs = std::move(inputs);
  d.outputs = std::move(outputs);
  for (size_t i = 0; i < d.inputs.size(); ++i)
    d.in_char.push_back(i < required_inputs ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL);
  // Outputs of "any" type must be optional for onnxruntime (CreateSchema); Q stays required.
  for (size_t i = 0; i < d.outputs.size(); ++i)
    d.out_char.push_back(kind == kQuantize && i == 0 ? INPUT_OUTPUT_REQUIRED
                                                     : INPUT_OUTPUT_OPTIONAL);
  d.GetName = [](const OrtCustomOp* op) noexcept { return kOpNames[def(op).kind]; };
  d.GetExecutionProviderType = [](const OrtCustomOp* op) noexcept -> const char* {
    return def(op).cuda ? "CUDAExecutionProvider" : "CPUExecutionProvider";
  };
  d.GetInputType = [](const OrtCustomOp* op, size_t i) noexcept { return def(op).inputs[i]; };
  d.GetInputTypeCount = [](const OrtCustomOp* op) noexcept { return def(op).inputs.size(); };
  d.GetOutputType = [](const OrtCustomOp* op, size_t i) noexcept { return def(op).outputs[i]; };
  d.GetOutputTypeCount = [](const OrtCustomOp* op) noexcept { return def(op).outputs.size(); };
  d.GetInputCharacteristic = [](const OrtCustomOp* op, size_t i) noexcept {
    return def(op).in_char[i];
  };
  d.GetOutputCharacteristic = [](const OrtCustomOp* op, size_t i) noexcept {
    return def(op).out_char[i];
  };
  d.GetInputMemoryType = [](const OrtCustomOp*, size_t) noexcept { return OrtMemTypeDefault; };
  d.GetVariadicInputMinArity = [](const OrtCustomOp*) noexcept { return 1; };
  d.GetVariadicInputHomogeneity = [](const OrtCustomOp*) noexcept { return 1; };
  d.GetVariadicOutputMinArity = [](const OrtCustomOp*) noexcept { return 1; };
  d.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) noexcept { return 1; };
  d.CreateKernelV2 = create_kernel;
  d.KernelComputeV2 = compute;
  d.KernelDestroy = destroy_kernel;
  d.GetStartVersion = [](const OrtCustomOp*) noexcept { return 1; };
  return d;
}

// Every registration: fixed-type variants first (onnxruntime's type inference takes the first
// variant that matches the node's inputs), then one that accepts any input type.
std::vector<OpDef>& op_defs() {
  static std::vector<OpDef> defs;
  if (!defs.empty()) return defs;
  const TypeList codes = {kU8, kU16, kU32};
  for (auto x : {kTF32, kTF16, kTBF16, kAny})
    defs.push_back(make_def(kQuantize, {x}, {kU8, kAny, kAny, kAny, kU8, kU8}, 1));
  for (auto sc : codes)
    for (auto z : codes)
      for (auto t : codes)
        defs.push_back(make_def(kDequantize, {kU8, sc, z, t, kU8, kU8}, {kAny}, 1));
  defs.push_back(make_def(kDequantize, TypeList(6, kAny), {kAny}, 1));
  for (auto sc : codes) defs.push_back(make_def(kLookup, {kU8, kU8, sc, kTF32}, {kAny}, 1));
  defs.push_back(make_def(kLookup, TypeList(4, kAny), {kAny}, 1));
  // The same QuantizeMX / DequantizeMX for the CUDA execution provider, when the library embeds
  // GPU kernels (ONNXQ_CUDA_OPS=0 leaves them out: every node then runs on the CPU).
  const char* env = std::getenv("ONNXQ_CUDA_OPS");
  if (cuda::kernel_count() > 0 && !(env && std::string(env) == "0")) {
    for (auto x : {kTF32, kTF16, kTBF16, kAny})
      defs.push_back(make_def(kQuantize, {x}, {kU8, kAny, kAny, kAny, kU8, kU8}, 1, true));
    for (auto sc : codes)
      for (auto z : codes)
        for (auto t : codes)
          defs.push_back(make_def(kDequantize, {kU8, sc, z, t, kU8, kU8}, {kAny}, 1, true));
    defs.push_back(make_def(kDequantize, TypeList(6, kAny), {kAny}, 1, true));
  }
  return defs;
}

std::mutex g_mu;
// onnxruntime keeps using a domain for the life of every session made from the options, and
// tells nobody when that ends: the domains live as long as the library.
std::vector<OrtCustomOpDomain*>* g_domains = new std::vector<OrtCustomOpDomain*>();

}  // namespace
}  // namespace onnxq

extern "C" ONNXQ_API OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                               const OrtApiBase* api_base) {
  using namespace onnxq;
  if (!api_base) return nullptr;
  try {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_api) {
      // The headers' version when the runtime has it, else the highest it offers. Start at
      // the runtime's own API version (its minor version number): GetApi of a newer version
      // prints an error on stderr, which would break one-line error output of a host.
      uint32_t start = ORT_API_VERSION;
      const char* version = api_base->GetVersionString();
      unsigned major = 0, minor = 0;
      if (version && std::sscanf(version, "%u.%u", &major, &minor) == 2 && major == 1 &&
          minor >= kMinApi && minor < start) {
        start = minor;
      }
      for (uint32_t v = start; v >= kMinApi; --v) {
        if (const OrtApi* api = api_base->GetApi(v)) {
          g_api = api;
          g_version = v;
          break;
        }
      }
      if (!g_api) {
        const OrtApi* old = api_base->GetApi(1);
        if (!old) return nullptr;
        return old->CreateStatus(
            ORT_FAIL, ("[onnxq] onnxruntime " + std::string(api_base->GetVersionString()) +
                       " is too old for the onnxq custom ops (API 16, onnxruntime 1.16, needed)")
                          .c_str());
      }
    }
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* st = g_api->CreateCustomOpDomain("onnxq", &domain)) return st;
    g_domains->push_back(domain);
    for (const OpDef& d : op_defs()) {
      if (OrtStatus* st = g_api->CustomOpDomain_Add(domain, &d)) return st;
    }
    return g_api->AddCustomOpDomain(options, domain);
  } catch (const std::exception& ex) {
    return g_api ? g_api->CreateStatus(ORT_FAIL, (std::string("[onnxq] ") + ex.what()).c_str())
                 : nullptr;
  } catch (...) {
    return g_api ? g_api->CreateStatus(ORT_FAIL, "[onnxq] unknown error") : nullptr;
  }
}
