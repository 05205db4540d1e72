// MatMulMX: Y = A x decode(B) (+ Bias), float32, the accumulation order of docs/ops.md
// ("MatMulMX"): each Y[m, n] starts at -0.0 and adds A[m, k] * B[k, n] for k = 0, 1, ..., K - 1
// in order, one float32 rounding per multiply and one per add (no FMA), then adds Bias[n];
// every NaN leaves as the canonical quiet NaN. With trans_b the packed tensor is W = B^T, of
// shape [N, K] (a Linear layer's weight, a tied embedding table), tiled along its axis: the
// same order on B[k, n] = W[n, k].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace onnxq {

// B's codes, scale and zero codes of the whole 64-column blocks, rearranged once (constant
// weights, at session creation) so that the vector path reads each block's rows in order: row k
// of block b at q + (b * K + k) * 8 * bits, the 64 scale (zero) codes of tile row t of block b at
// ((b * nK + t) * 64) codes. Empty: the path reads B's own layout. A transposed B (trans_b: W
// [N, K] tiled along K) gets the same layout, so one vector kernel serves both: the transpose
// is paid once here, not per Run.
struct MmxPrepacked {
  std::vector<uint8_t> q, scale, zero;
  bool ready = false;
  bool scales_ok = false;  // exponent scales: every code's 2^s is a normal float32
};
// Rearranges B when the vector path would read it (4- and 8-bit codes, 1-D tiles along K);
// the inputs are B's (sizes checked here; a mismatch leaves `out` empty). bshape and axis are
// the packed tensor's: B's [K, N], or W's [N, K] with trans_b.
void mmx_prepack(const Format& f, const std::vector<int64_t>& bshape, int axis,
                 const DequantizeIO& b, int64_t q_bytes, int64_t scale_bytes,
                 int64_t zero_bytes, MmxPrepacked* out, bool trans_b = false);

struct MatMulIO {
  const float* a = nullptr;  // [M, K], rows contiguous
  int64_t M = 0;
  const float* bias = nullptr;  // [N] or null
  float* y = nullptr;           // [M, N]
  DequantizeIO b;               // B's packed inputs (b.values unused)
  const MmxPrepacked* pre = nullptr;  // B's blocks rearranged (or null)
  bool trans_b = false;               // b holds W = B^T, [N, K] (MatMulMX's attribute trans_b)
};

// The element value of every code (elem, when every one is a float32), and the float32 value
// of every scale code of `f` (2^scale.bits entries) when its scale is a float
// of at most 16 bits (values empty otherwise), and whether those are IEEE half's (converted by
// the CPU instead of a table lookup). Made once per node: decoding 65536 codes per Run would
// cost more than a small GEMM.
struct MmxScales {
  std::vector<float> values;
  bool ieee_half = false;
  float elem[256] = {};  // the element value per code (codes of at most 8 bits)
  bool elem_ready = false, elem_exact = false;
};
MmxScales mmx_scale_values(const Format& f);

// Y = A x decode(B) (+ bias) for B of shape bshape = [K, N] tiled along `axis` (io.trans_b:
// W = B^T of shape bshape = [N, K] tiled along `axis`), in the order above. Formats the fused decode covers (docs/ops.md) decode panels of B inside the GEMM; any
// other format decodes B whole with dequantize() first (the same bits). "" or an error.
std::string matmul_mx(const Format& f, const std::vector<int64_t>& bshape, int axis,
                      const MatMulIO& io, const MmxScales& scales,
                      const ParallelFor& pf);

// Whether the fused decode covers this format and layout (the rest decodes B whole first):
// 1-D tiles along K, axis 0 of B's [K, N] or (trans_b) axis 1 of W's [N, K].
bool matmul_mx_fused(const Format& f, const std::vector<int64_t>& bshape, int axis,
                     bool trans_b = false);

}  // namespace onnxq
