// MatMulMX: Y = A x decode(B) (+ Bias), float32, the accumulation order of docs/ops.md
// ("MatMulMX"): each Y[m, n] starts at -0.0 and adds A[m, k] * B[k, n] for k = 0, 1, ..., K - 1
// in order, one float32 rounding per multiply and one per add (no FMA), then adds Bias[n];
// every NaN leaves as the canonical quiet NaN.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace onnxq {

struct MatMulIO {
  const float* a = nullptr;  // [M, K], rows contiguous
  int64_t M = 0;
  const float* bias = nullptr;  // [N] or null
  float* y = nullptr;           // [M, N]
  DequantizeIO b;               // B's packed inputs (b.values unused)
};

// The float32 value of every scale code of `f` (2^scale.bits entries) when its scale is a float
// of at most 16 bits (values empty otherwise), and whether those are IEEE half's (converted by
// the CPU instead of a table lookup). Made once per node: decoding 65536 codes per Run would
// cost more than a small GEMM.
struct MmxScales {
  std::vector<float> values;
  bool ieee_half = false;
};
MmxScales mmx_scale_values(const Format& f);

// Y = A x decode(B) (+ bias) for B of shape bshape = [K, N] tiled along `axis`, in the order
// above. Formats the fused decode covers (docs/ops.md) decode panels of B inside the GEMM; any
// other format decodes B whole with dequantize() first (the same bits). "" or an error.
std::string matmul_mx(const Format& f, const std::vector<int64_t>& bshape, int axis,
                      const MatMulIO& io, const MmxScales& scales,
                      const ParallelFor& pf);

// Whether the fused decode covers this format and layout (the rest decodes B whole first).
bool matmul_mx_fused(const Format& f, const std::vector<int64_t>& bshape, int axis);

}  // namespace onnxq
