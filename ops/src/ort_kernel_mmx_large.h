// MatMulMX's large-M path (docs/ops.md "MatMulMX", "Many rows"): for M >= a threshold the
// kernel decodes B (once, when its packed inputs are constant initializers) and runs
// onnxruntime's own MatMul on it through the C API (CreateOp / InvokeOp), then adds Bias as
// the unfused graph's Add does. Y then has the bits of DequantizeMX -> MatMul -> Add run by the
// same onnxruntime with MatMul and Add as two nodes, instead of the no-FMA order of
// matmul_mx.h, which runs at about half of MLAS's speed once A has more than a few rows.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "matmul_mx.h"
#include "onnxruntime_c_api.h"

namespace onnxq {
namespace ort {

struct Kernel;

// The default threshold: from this many rows of A on, MLAS's MatMul on the decoded B beats
// the fused decode (benchmarks/matmul_mx.py on SmolLM2's shapes, one thread: about even at 32
// to 48 rows, 1.44x against 1.70x float at 64, 1.30x against 1.90x at 128; docs/ops.md).
constexpr int64_t kMmxLargeDefault = 64;

struct MmxLarge {
  int64_t threshold = 0;    // M >= threshold takes this path; 0: never (ONNXQ_MMX_LARGE_M=0)
  OrtOp* matmul = nullptr;  // onnxruntime's MatMul (opset 13, float), made with the kernel
  OrtMemoryInfo* mem = nullptr;
  bool constant = false;  // every packed input of B is a constant initializer: decode it once
  // The decoded B of constant weights, made at the first large-M Run (not at session creation:
  // a model that only ever runs one row, an LM's decode step, never pays its memory).
  std::mutex mu;
  std::atomic<bool> ready{false};  // b holds B (written under mu before ready is set)
  bool failed = false;             // decoding failed once: the Runs take the fused path
  std::atomic<bool> broken{false};  // InvokeOp failed once: the Runs take the fused path
  std::vector<float> b;
  MmxLarge() = default;
  MmxLarge(const MmxLarge&) = delete;
  MmxLarge& operator=(const MmxLarge&) = delete;
  ~MmxLarge();
};

// Sets k->large (left null when the MatMul cannot be made: the fused path then runs every M).
// Reads ONNXQ_MMX_LARGE_M. Never throws.
void init_mmx_large(Kernel* k, const OrtKernelInfo* info) noexcept;

// Y = MatMul(A, decode(B)) (+ Bias) with onnxruntime's MatMul when io.M reaches the threshold.
// io: the checked inputs (compute_matmul_mx). True: Y is written; false: not taken (M below the
// threshold, or the MatMul or the decode failed), the caller computes Y in the documented order.
bool mmx_large_run(const Kernel& k, OrtKernelContext* ctx, int axis, const MatMulIO& io,
                   const ParallelFor& pf);

}  // namespace ort
}  // namespace onnxq
