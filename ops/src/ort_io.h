// The onnxruntime side of the custom ops: the C API table, errors as OpError, attributes, input
// and output tensors with their checks, and the session's thread pool as the kernels' ParallelFor.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"
#include "onnxruntime_c_api.h"

namespace onnxq {
namespace ort {

// The API that RegisterCustomOps took from onnxruntime, and its version.
extern const OrtApi* g_api;
extern uint32_t g_version;

using TypeList = std::vector<ONNXTensorElementDataType>;
constexpr ONNXTensorElementDataType kAny = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
constexpr ONNXTensorElementDataType kU8 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
constexpr ONNXTensorElementDataType kU16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16;
constexpr ONNXTensorElementDataType kU32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32;
constexpr ONNXTensorElementDataType kI64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
constexpr ONNXTensorElementDataType kTF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kTF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kTBF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

// An error with its message ready for an OrtStatus (thrown inside a kernel, caught at the ABI).
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string type_name(int t);
std::string shape_str(const std::vector<int64_t>& s);
// Turns a failed onnxruntime call into an OpError (the status is released).
void check(OrtStatus* st, const std::string& what);
// The unsigned code type of `bits`-bit fields, and the kernels' float type of an ONNX one.
int code_type(int bits);
int float_kind(int onnx_type);

// Attributes: false when the node does not have it; an OpError when it has the wrong type.
bool attr_string(const OrtKernelInfo* info, const char* name, std::string* out);
bool attr_int(const OrtKernelInfo* info, const char* name, int64_t* out);
bool attr_ints(const OrtKernelInfo* info, const char* name, std::vector<int64_t>* out);
// The index of `value` in `options`; an OpError naming the valid ones otherwise.
int choice(const std::string& name, const std::string& value,
           const std::vector<std::string>& options);

struct In {
  const OrtValue* v = nullptr;
  int type = 0;
  std::vector<int64_t> shape;
  int64_t count = 0;
  const void* data = nullptr;
  explicit operator bool() const { return v != nullptr; }
};

// Input `index` (an empty In when the node does not have it).
In input(OrtKernelContext* ctx, size_t index, const char* name);
// The node's inputs when every input it names is a constant initializer (an empty In for an
// input it leaves out); false when one is not constant. Only in the kernel's constructor.
bool constant_inputs(const OrtKernelInfo* info, std::vector<In>* out);
// Input `index` when it is a constant initializer (an empty In otherwise). Only in the kernel's
// constructor.
In constant_input(const OrtKernelInfo* info, size_t index);
// Allocates output `index` with `shape` and checks its declared element type; nullptr when
// the node does not have that output (a zero-size output gets a non-null placeholder).
void* output(OrtKernelContext* ctx, size_t index, const char* name,
             const std::vector<int64_t>& shape, int want_type, const std::string& why);

// Bytes per element of an ONNX tensor type whose elements are plain numbers (0 for others).
int64_t element_bytes(int onnx_type);

// While an IoRedirect is installed on a thread (IoRedirectScope), input() and output() there
// hand the kernel what it returns instead of onnxruntime's buffers: the CUDA provider's host
// fallback (ort_kernel_cuda.cc) runs the CPU kernels unchanged on host copies this way.
// Neither is called for tensors without bytes.
struct IoRedirect {
  virtual ~IoRedirect() = default;
  // The data to read for input `index` (`in` as onnxruntime gives it).
  virtual const void* input(size_t index, const In& in) = 0;
  // The buffer to write for output `index`, whose `bytes` onnxruntime allocated at `data`.
  virtual void* output(size_t index, void* data, int64_t bytes) = 0;
};
class IoRedirectScope {
 public:
  explicit IoRedirectScope(IoRedirect* redirect);
  ~IoRedirectScope();
  IoRedirectScope(const IoRedirectScope&) = delete;
  IoRedirectScope& operator=(const IoRedirectScope&) = delete;

 private:
  IoRedirect* saved_;
};

// The kernels' ParallelFor on the session's intra-op thread pool (API 17+), else our own pool.
ParallelFor session_parallel_for(OrtKernelContext* ctx);

}  // namespace ort
}  // namespace onnxq
