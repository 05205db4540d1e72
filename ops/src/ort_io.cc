// onnxruntime kernel I/O for the custom ops (ort_io.h).
#include "ort_io.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parse.h"

namespace onnxq {
namespace ort {

const OrtApi* g_api = nullptr;
uint32_t g_version = 0;

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

void check(OrtStatus* st, const std::string& what) {
  if (!st) return;
  std::string msg = g_api->GetErrorMessage(st);
  g_api->ReleaseStatus(st);
  throw OpError(what + ": " + msg);
}

int code_type(int bits) { return bits <= 8 ? kU8 : bits <= 16 ? kU16 : kU32; }
int float_kind(int onnx_type) {
  return onnx_type == kTF16 ? onnxq::kF16 : onnx_type == kTBF16 ? onnxq::kBF16 : onnxq::kF32;
}

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

namespace {

thread_local IoRedirect* t_redirect = nullptr;

// The In of value `v` (an empty In when v is null).
In describe(const OrtValue* v, const char* name) {
  In in;
  in.v = v;
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

}  // namespace

In input(OrtKernelContext* ctx, size_t index, const char* name) {
  size_t n = 0;
  check(g_api->KernelContext_GetInputCount(ctx, &n), "counting inputs");
  if (index >= n) return In{};
  const OrtValue* v = nullptr;
  check(g_api->KernelContext_GetInput(ctx, index, &v), std::string("reading input ") + name);
  In in = describe(v, name);
  if (t_redirect && in && in.count > 0) in.data = t_redirect->input(index, in);
  return in;
}

int64_t element_bytes(int onnx_type) {
  switch (onnx_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
      return 8;
    default:
      return 0;
  }
}

IoRedirectScope::IoRedirectScope(IoRedirect* redirect) : saved_(t_redirect) {
  t_redirect = redirect;
}
IoRedirectScope::~IoRedirectScope() { t_redirect = saved_; }

bool constant_inputs(const OrtKernelInfo* info, std::vector<In>* out) {
  size_t n = 0;
  check(g_api->KernelInfo_GetInputCount(info, &n), "counting inputs");
  out->assign(n, In{});
  for (size_t i = 0; i < n; ++i) {
    size_t size = 0;
    check(g_api->KernelInfo_GetInputName(info, i, nullptr, &size), "reading an input name");
    if (size <= 1) continue;  // an empty name: the node leaves this optional input out
    int is_constant = 0;
    const OrtValue* v = nullptr;
    check(g_api->KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v),
          "reading a constant input");
    if (!is_constant || !v) return false;
    (*out)[i] = describe(v, "(constant)");
  }
  return true;
}

In constant_input(const OrtKernelInfo* info, size_t index) {
  size_t n = 0;
  check(g_api->KernelInfo_GetInputCount(info, &n), "counting inputs");
  if (index >= n) return In{};
  size_t size = 0;
  check(g_api->KernelInfo_GetInputName(info, index, nullptr, &size), "reading an input name");
  if (size <= 1) return In{};
  int is_constant = 0;
  const OrtValue* v = nullptr;
  check(g_api->KernelInfoGetConstantInput_tensor(info, index, &is_constant, &v),
        "reading a constant input");
  return is_constant && v ? describe(v, "(constant)") : In{};
}

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
  if (t_redirect && data) {
    int64_t bytes = element_bytes(t);
    for (int64_t d : shape) bytes *= d;
    if (bytes > 0) return t_redirect->output(index, data, bytes);
  }
  // onnxruntime gives a zero-size tensor no buffer: a placeholder tells "present" from
  // "missing" (nothing is written through it: the tensor has no bytes).
  alignas(8) static uint8_t no_bytes[8];
  return data ? data : no_bytes;
}

// -- threads ------------------------------------------------------------------------------

namespace {

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

}  // namespace

ParallelFor session_parallel_for(OrtKernelContext* ctx) {
  if (g_version < 17) return default_parallel_for(0);
  return [ctx](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    // Read once: hardware_concurrency() opens /sys/devices/system/cpu/online on every call,
    // a few microseconds, the whole cost of an op on a small tensor.
    static const int64_t workers = std::max<int64_t>(1, std::thread::hardware_concurrency());
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

}  // namespace ort
}  // namespace onnxq
