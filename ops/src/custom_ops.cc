// The onnxruntime custom ops QuantizeMX, DequantizeMX, CodebookLookup, QuantizeDequantizeMX,
// MatMulMX and GatherMX (domain `onnxq`, version 1; contract in docs/ops.md): their
// registration (the OrtCustomOp table and RegisterCustomOps). Their inputs, outputs and
// attributes come from onnxq/graph/schemas.py through the generated onnxq_op_contract.h;
// ort_io.cc is onnxruntime's side of a kernel (attributes, tensors, threads),
// ort_kernel_cpu.cc, ort_kernel_mmx.cc, ort_kernel_gather.cc and ort_kernel_cuda.cc compute
// the ops.
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_launch.h"
#include "onnxq_op_contract.h"  // generated from onnxq/graph/schemas.py
#include "onnxq_ops.h"
#include "onnxruntime_c_api.h"
#include "ort_io.h"
#include "ort_kernel.h"

namespace onnxq {
namespace ort {
namespace {

// CreateKernelV2 / KernelComputeV2 need API 16; KernelContext_ParallelFor needs 17.
constexpr uint32_t kMinApi = 16;

// -- the OrtCustomOp table ----------------------------------------------------------------

struct OpDef : OrtCustomOp {
  OpKind kind;
  bool cuda = false;  // the CUDA kernels (ort_kernel_cuda.cc)
  const char* provider = "CPUExecutionProvider";  // the execution provider they run on
  TypeList inputs, outputs;
  std::vector<OrtCustomOpInputOutputCharacteristic> in_char, out_char;
};

const OpDef& def(const OrtCustomOp* op) { return *static_cast<const OpDef*>(op); }

// ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1 is for tests only: the CUDA kernels are registered for the
// CPU execution provider in place of the CPU ones, so that a CPU-only onnxruntime runs them
// on a stand-in driver (tests/cast/triton/run_emulated_ort.py, docs/gpu.md).
bool cuda_kernels_on_cpu_provider() {
  const char* env = std::getenv("ONNXQ_CUDA_OPS_ON_CPU_PROVIDER");
  return env && std::string(env) == "1";
}

OrtStatus* error_status(const std::string& op, const std::string& msg) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, ("[" + op + "] " + msg).c_str());
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*,
                                      const OrtKernelInfo* info, void** kernel) noexcept {
  const char* name = op_name(def(op).kind);
  try {
    auto k = std::make_unique<Kernel>();
    k->kind = def(op).kind;
    k->op = name;
    init_kernel(k.get(), info);
    k->on_cuda = def(op).cuda;
    if (k->on_cuda) init_cuda_kernel(k.get(), info);
    if (k->kind == kMatMul) init_matmul_mx(k.get(), info);
    if (k->kind == kGather) init_gather(*k);  // the table stays packed: no constant decode
    if (!k->on_cuda && (k->kind == kDequantize || k->kind == kLookup))
      init_const_decode(k.get(), info);
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
    if (k.on_cuda) {
      compute_cuda(k, ctx);
    } else if (k.kind == kQuantize) {
      compute_quantize(k, ctx);
    } else if (k.kind == kQuantDequant) {
      compute_quant_dequant(k, ctx);
    } else if (k.kind == kMatMul) {
      compute_matmul_mx(k, ctx);
    } else if (k.kind == kGather) {
      compute_gather(k, ctx);
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

OpDef make_def(OpKind kind, TypeList inputs, TypeList outputs, bool cuda = false) {
  const contract::OpContract& c = contract::kOps[kind];
  if (inputs.size() != c.n_inputs || outputs.size() != c.n_outputs)
    throw std::logic_error(std::string(c.name) + ": the registration's inputs or outputs " +
                           "disagree with onnxq/graph/schemas.py");
  OpDef d;
  std::memset(static_cast<OrtCustomOp*>(&d), 0, sizeof(OrtCustomOp));
  d.version = g_version;
  d.kind = kind;
  d.cuda = cuda;
  if (cuda && !cuda_kernels_on_cpu_provider()) d.provider = "CUDAExecutionProvider";
  d.inputs = std::move(inputs);
  d.outputs = std::move(outputs);
  // onnxruntime checks the first input, which every op's schema requires; the kernel checks
  // the others, so that its message names the dtype that needs them (CodebookLookup's Meta).
  for (size_t i = 0; i < d.inputs.size(); ++i)
    d.in_char.push_back(i == 0 && !c.inputs[i].optional ? INPUT_OUTPUT_REQUIRED
                                                        : INPUT_OUTPUT_OPTIONAL);
  // Outputs of "any" type must be optional for onnxruntime (CreateSchema), and every variant
  // of an op must agree: QuantizeDequantizeMX's Y (fixed in all but its any-type variant) is
  // optional too; the others are as the schema says (QuantizeMX's Q is required). The kernels
  // require their outputs themselves.
  for (size_t i = 0; i < d.outputs.size(); ++i)
    d.out_char.push_back(!c.outputs[i].optional && d.outputs[i] != kAny && kind != kQuantDequant
                             ? INPUT_OUTPUT_REQUIRED
                             : INPUT_OUTPUT_OPTIONAL);
  d.GetName = [](const OrtCustomOp* op) noexcept { return op_name(def(op).kind); };
  d.GetExecutionProviderType = [](const OrtCustomOp* op) noexcept { return def(op).provider; };
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
  // DequantizeMX's Shape input, the Table inputs and GatherMX's Indices are read on the host,
  // also on the CUDA execution provider (a table goes to the device with the launch).
  d.GetInputMemoryType = [](const OrtCustomOp* op, size_t i) noexcept {
    const OpDef& o = def(op);
    return o.cuda && reads_on_host(o.kind, i) ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
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

TypeList any_inputs(OpKind kind) { return TypeList(contract::kOps[kind].n_inputs, kAny); }

// Every registration: fixed-type variants first (onnxruntime's type inference takes the first
// variant that matches the node's inputs), then one that accepts any input type.
std::vector<OpDef>& op_defs() {
  static std::vector<OpDef> defs;
  if (!defs.empty()) return defs;
  const TypeList codes = {kU8, kU16, kU32};
  const char* env = std::getenv("ONNXQ_CUDA_OPS");
  const bool cuda = cuda::kernel_count() > 0 && !(env && std::string(env) == "0");
  // QuantizeMX / DequantizeMX / CodebookLookup / QuantizeDequantizeMX / GatherMX: on the CPU,
  // and (when the library embeds GPU kernels; ONNXQ_CUDA_OPS=0 leaves them out) on the CUDA
  // execution provider. MatMulMX (below) runs on the CPU only.
  for (bool on_cuda : {false, true}) {
    if (on_cuda ? !cuda : cuda && cuda_kernels_on_cpu_provider()) continue;
    for (auto x : {kTF32, kTF16, kTBF16, kAny})
      defs.push_back(make_def(kQuantize, {x}, {kU8, kAny, kAny, kAny, kU8, kU8}, on_cuda));
    for (auto sc : codes)
      for (auto z : codes)
        for (auto t : codes)
          defs.push_back(
              make_def(kDequantize, {kU8, sc, z, t, kU8, kU8, kI64}, {kAny}, on_cuda));
    defs.push_back(make_def(kDequantize, any_inputs(kDequantize), {kAny}, on_cuda));
    for (auto sc : codes)
      defs.push_back(make_def(kLookup, {kU8, kU8, sc, kTF32}, {kAny}, on_cuda));
    defs.push_back(make_def(kLookup, any_inputs(kLookup), {kAny}, on_cuda));
    // Y is X's type: onnxruntime infers it from these (no declared output type needed).
    for (auto x : {kTF32, kTF16, kTBF16})
      defs.push_back(make_def(kQuantDequant, {x}, {x}, on_cuda));
    defs.push_back(make_def(kQuantDequant, {kAny}, {kAny}, on_cuda));
    // GatherMX: Indices int64 or int32, then DequantizeMX's inputs and Table. Every input is
    // typed in a variant (an "any" input would share its type with Y's).
    for (auto ix : {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32})
      for (auto sc : codes)
        for (auto z : codes)
          for (auto t : codes)
            defs.push_back(
                make_def(kGather, {ix, kU8, sc, z, t, kU8, kU8, kTF32}, {kAny}, on_cuda));
    defs.push_back(make_def(kGather, any_inputs(kGather), {kAny}, on_cuda));
  }
  // MatMulMX: float32 A, Bias and Y (its kernel refuses other output types).
  for (auto sc : codes)
    for (auto z : codes)
      for (auto t : codes)
        defs.push_back(make_def(kMatMul, {kTF32, kU8, sc, z, t, kU8, kU8, kTF32}, {kTF32}));
  defs.push_back(make_def(kMatMul, any_inputs(kMatMul), {kTF32}));
  return defs;
}

std::mutex g_mu;
// onnxruntime keeps using a domain for the life of every session made from the options, and
// tells nobody when that ends: the domains live as long as the library.
std::vector<OrtCustomOpDomain*>* g_domains = new std::vector<OrtCustomOpDomain*>();

}  // namespace
}  // namespace ort
}  // namespace onnxq

extern "C" ONNXQ_API OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                               const OrtApiBase* api_base) {
  using namespace onnxq::ort;
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
