// MatMulMX for many rows (ort_kernel_mmx_large.h): B decoded whole, onnxruntime's MatMul on it.
//
// Why the bits equal the unfused graph's: in DequantizeMX -> MatMul -> Add, MatMul's B is a node
// output, so onnxruntime runs its MatMul kernel (MLAS) on a B it has not prepacked; here the
// same kernel, made by CreateOp, runs on the same decoded B (DequantizeMX's bits: dequantize()
// is the DequantizeMX kernel's decode), also not prepacked (InvokeOp never prepacks), and the
// bias is then added with one float32 add per element, as the Add node does. A is passed as
// [M, K]: MatMul with a 2-D B flattens A's leading dims to one GEMM either way.
#include "ort_kernel_mmx_large.h"

#include <cstdlib>
#include <string>

#include "ort_kernel.h"

namespace onnxq {
namespace ort {

namespace {

int64_t threshold_from_env() {
  const char* env = std::getenv("ONNXQ_MMX_LARGE_M");
  if (!env || !*env) return kMmxLargeDefault;
  char* end = nullptr;
  long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0) return kMmxLargeDefault;  // not a count: the default
  return static_cast<int64_t>(v);
}

// Whether every packed input of B the node names (Q ... Mask) is a constant initializer.
bool packed_inputs_constant(const OrtKernelInfo* info) {
  const int first = contract::input_index(kMatMul, "Q");
  const int last = contract::input_index(kMatMul, "Mask");
  size_t n = 0;
  if (OrtStatus* st = g_api->KernelInfo_GetInputCount(info, &n)) {
    g_api->ReleaseStatus(st);
    return false;
  }
  for (int i = first; i <= last && static_cast<size_t>(i) < n; ++i) {
    size_t size = 0;
    OrtStatus* st = g_api->KernelInfo_GetInputName(info, i, nullptr, &size);
    if (st) {
      g_api->ReleaseStatus(st);
      return false;
    }
    if (size <= 1) continue;  // left out
    int is_constant = 0;
    const OrtValue* v = nullptr;
    st = g_api->KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v);
    if (st) {
      g_api->ReleaseStatus(st);
      return false;
    }
    if (!is_constant || !v) return false;
  }
  return true;
}

// B decoded as DequantizeMX decodes it, into out ([K, N] row-major). False on an error (the
// fused path then reports it).
bool decode_b(const Kernel& k, int axis, const DequantizeIO& in, const ParallelFor& pf,
              std::vector<float>* out) {
  // With trans_b, Q holds W = B^T [N, K]: decoded as [N, K], then transposed (the unfused
  // graph's DequantizeMX -> Transpose -> MatMul).
  const int64_t K = k.shape[k.trans_b ? 1 : 0], N = k.shape[k.trans_b ? 0 : 1];
  std::vector<float> w;
  std::vector<float>& into = k.trans_b ? w : *out;
  into.assign(static_cast<size_t>(K * N), 0.0f);
  DequantizeIO d = in;
  d.values = into.data();
  d.values_type = kF32;
  if (!dequantize(k.fmt, k.shape, axis, d, pf).empty()) return false;
  if (!k.trans_b) return true;
  out->assign(static_cast<size_t>(K * N), 0.0f);
  float* b = out->data();
  pf(K, [&](int64_t k0, int64_t k1) {
    for (int64_t kk = k0; kk < k1; ++kk)
      for (int64_t n = 0; n < N; ++n) b[kk * N + n] = w[static_cast<size_t>(n * K + kk)];
  });
  return true;
}

// Wraps float data of `shape` as an OrtValue (not owned); null on an error.
OrtValue* wrap(const MmxLarge& L, const float* data, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  OrtValue* v = nullptr;
  OrtStatus* st = g_api->CreateTensorWithDataAsOrtValue(
      L.mem, const_cast<float*>(data), static_cast<size_t>(count) * sizeof(float), shape.data(),
      shape.size(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &v);
  if (st) {
    g_api->ReleaseStatus(st);
    return nullptr;
  }
  return v;
}

// Y = MatMul(A, b) by onnxruntime's kernel; false when onnxruntime refuses or fails.
bool invoke_matmul(const MmxLarge& L, OrtKernelContext* ctx, const MatMulIO& io, int64_t K,
                   int64_t N, const float* b) {
  OrtValue* av = wrap(L, io.a, {io.M, K});
  OrtValue* bv = wrap(L, b, {K, N});
  OrtValue* yv = wrap(L, io.y, {io.M, N});
  bool ok = av && bv && yv;
  if (ok) {
    const OrtValue* ins[2] = {av, bv};
    OrtValue* outs[1] = {yv};
    OrtStatus* st = g_api->InvokeOp(ctx, L.matmul, ins, 2, outs, 1);
    if (st) {
      g_api->ReleaseStatus(st);
      ok = false;
    }
  }
  for (OrtValue* v : {av, bv, yv})
    if (v) g_api->ReleaseValue(v);
  return ok;
}

}  // namespace

MmxLarge::~MmxLarge() {
  if (matmul) g_api->ReleaseOp(matmul);
  if (mem) g_api->ReleaseMemoryInfo(mem);
}

void init_mmx_large(Kernel* k, const OrtKernelInfo* info) noexcept {
  try {
    auto L = std::make_shared<MmxLarge>();
    L->threshold = threshold_from_env();
    if (L->threshold == 0 || k->shape.size() != 2) return;
    // CreateOp / InvokeOp (API 12+) are in every table this library accepts (16+); a runtime
    // without them (a minimal build) answers with an error: no large-M path then.
    if (!g_api->CreateOp || !g_api->InvokeOp || !g_api->ReleaseOp) return;
    OrtStatus* st = g_api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &L->mem);
    if (st) {
      g_api->ReleaseStatus(st);
      return;
    }
    const char* names[1] = {"T"};
    const ONNXTensorElementDataType types[1] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
    st = g_api->CreateOp(info, "MatMul", "", 13, names, types, 1, nullptr, 0, 2, 1, &L->matmul);
    if (st) {
      g_api->ReleaseStatus(st);
      L->matmul = nullptr;
      return;
    }
    L->constant = packed_inputs_constant(info);
    k->large = std::move(L);
  } catch (...) {
    k->large.reset();  // no memory: the fused path runs every M
  }
}

bool mmx_large_run(const Kernel& k, OrtKernelContext* ctx, int axis, const MatMulIO& io,
                   const ParallelFor& pf) {
  MmxLarge* L = k.large.get();
  if (!L || !L->matmul || L->threshold <= 0 || io.M < L->threshold) return false;
  if (L->broken.load(std::memory_order_relaxed)) return false;
  const int64_t K = k.shape[k.trans_b ? 1 : 0], N = k.shape[k.trans_b ? 0 : 1];
  std::vector<float> temp;  // B of this Run (weights given at run time)
  const float* b = nullptr;
  if (L->constant) {
    if (!L->ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(L->mu);
      if (!L->ready.load(std::memory_order_relaxed) && !L->failed) {
        // Decoded from this Run's inputs: the same constants every Run, checked by the caller.
        L->failed = !decode_b(k, axis, io.b, pf, &L->b);
        if (L->failed) std::vector<float>().swap(L->b);
        L->ready.store(!L->failed, std::memory_order_release);
      }
      if (L->failed) return false;
    }
    b = L->b.data();
  } else {
    if (!decode_b(k, axis, io.b, pf, &temp)) return false;
    b = temp.data();
  }
  if (!invoke_matmul(*L, ctx, io, K, N, b)) {
    L->broken.store(true, std::memory_order_relaxed);  // do not try again on every Run
    return false;
  }
  if (io.bias) {
    // The unfused graph's Add: Y[m, n] + Bias[n], one float32 rounding (NaNs as the CPU's add
    // leaves them, Y's first).
    float* y = io.y;
    const float* bias = io.bias;
    pf(io.M, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        float* row = y + m * N;
        for (int64_t n = 0; n < N; ++n) row[n] = row[n] + bias[n];
      }
    });
  }
  return true;
}

}  // namespace ort
}  // namespace onnxq
