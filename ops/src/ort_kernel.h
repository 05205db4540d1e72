// The custom ops' kernels: one Kernel per node, made from its attributes when the session is
// created, and each op's compute on the CPU (ort_kernel_cpu.cc) and on the CUDA execution
// provider (ort_kernel_cuda.cc). The ops' inputs and outputs come from the contract generated
// from onnxq/graph/schemas.py (onnxq_op_contract.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda_launch.h"
#include "kernels.h"
#include "matmul_mx.h"
#include "onnxq_op_contract.h"  // generated from onnxq/graph/schemas.py
#include "onnxruntime_c_api.h"
#include "ort_io.h"
#include "parse.h"

namespace onnxq {
namespace ort {

// The ops in the order of the contract (onnxq/graph/schemas.py OPS, onnxq_op_contract.h).
enum OpKind { kQuantize, kDequantize, kLookup, kQuantDequant, kMatMul, kGather };
static_assert(contract::kOpCount == 6 && contract::op_index("QuantizeMX") == kQuantize &&
                  contract::op_index("DequantizeMX") == kDequantize &&
                  contract::op_index("CodebookLookup") == kLookup &&
                  contract::op_index("QuantizeDequantizeMX") == kQuantDequant &&
                  contract::op_index("MatMulMX") == kMatMul &&
                  contract::op_index("GatherMX") == kGather,
              "schemas.py OPS and the custom ops disagree on the ops");
inline const char* op_name(OpKind kind) { return contract::kOps[kind].name; }

// Input and output positions, from the contract.
constexpr int kInX = contract::input_index(kQuantize, "X");
struct QuantizeOutputs {
  int q, scale, zero, ts, meta, mask;
};
constexpr QuantizeOutputs kQOut{
    contract::output_index(kQuantize, "Q"),        contract::output_index(kQuantize, "Scale"),
    contract::output_index(kQuantize, "Zero"),     contract::output_index(kQuantize, "TenScale"),
    contract::output_index(kQuantize, "Meta"),     contract::output_index(kQuantize, "Mask")};
constexpr int kOutY = contract::output_index(kDequantize, "Y");
constexpr int kInShape = contract::input_index(kDequantize, "Shape");
constexpr int kInTable = contract::input_index(kLookup, "Table");
static_assert(kInX >= 0 && kQOut.q >= 0 && kQOut.scale >= 0 && kQOut.zero >= 0 &&
                  kQOut.ts >= 0 && kQOut.meta >= 0 && kQOut.mask >= 0 && kOutY >= 0 &&
                  kInShape >= 0 && kInTable >= 0 && contract::output_index(kLookup, "Y") == kOutY &&
                  contract::input_index(kQuantDequant, "X") == kInX &&
                  contract::output_index(kQuantDequant, "Y") == kOutY,
              "schemas.py OPS lacks an input or output the custom ops write");

constexpr int kInGatherIndices = contract::input_index(kGather, "Indices");
constexpr int kInGatherTable = contract::input_index(kGather, "Table");
static_assert(kInGatherIndices >= 0 && kInGatherTable >= 0,
              "schemas.py OPS lacks GatherMX's inputs");

// Inputs read in host memory also on the CUDA execution provider (GetInputMemoryType):
// DequantizeMX's Shape, CodebookLookup's and GatherMX's Table, and GatherMX's Indices (checked
// on the host, as on the CPU: onnxruntime copies them there).
inline bool reads_on_host(OpKind kind, size_t index) {
  return (kind == kDequantize && index == static_cast<size_t>(kInShape)) ||
         (kind == kLookup && index == static_cast<size_t>(kInTable)) ||
         (kind == kGather && (index == static_cast<size_t>(kInGatherIndices) ||
                              index == static_cast<size_t>(kInGatherTable)));
}

struct MmxLarge;  // ort_kernel_mmx_large.h

struct Kernel {
  OpKind kind;
  std::string op;
  ParsedType parsed;
  Format fmt;             // ready unless the dtype is a generic codebook (Table input)
  bool fmt_ready = false;
  int64_t axis = -1;
  Modes modes;
  std::vector<int64_t> shape;  // Dequantize / Lookup: X's shape (the attribute; may be empty
                               // for Dequantize, whose Shape input then gives it at run time)
  int out_type = kTF32;         // ONNX element type of Y
  bool on_cuda = false;  // registered for the CUDA execution provider
  const cuda::AotFormat* gpu = nullptr;  // CUDA QuantizeMX / DequantizeMX: the embedded format
  // CUDA: why the device kernels cannot run this node ("" when they can); it then runs the
  // CPU kernel on host copies (ort_kernel_cuda.cc), with one warning in the session's log.
  std::string host_reason;
  std::string node;  // CUDA: the node's name, for the host fallback's warning
  // Dequantize / Lookup on the CPU: Y decoded once at session creation when every input is a
  // constant initializer (in the output type); empty: decode on every Run.
  std::vector<uint8_t> const_y;
  // MatMulMX: the value of every scale code (float scales of at most 16 bits; matmul_mx.h).
  MmxScales scale_values;
  MmxPrepacked prepacked;  // MatMulMX: B's constant blocks rearranged (matmul_mx.h)
  std::shared_ptr<MmxLarge> large;  // MatMulMX: the large-M path (ort_kernel_mmx_large.h)
  bool trans_b = false;    // MatMulMX: the packed tensor is W = B^T, `shape` W's [N, K]
};

// Reads and checks the node's attributes (every op).
void init_kernel(Kernel* k, const OrtKernelInfo* info);
// X's shape for a DequantizeMX / CodebookLookup node: DequantizeMX's Shape input when it is
// given (int64, 1-D, every dim >= 0, the non-zero dims' product at most 2^40; equal to the
// attribute when both are given), else the attribute. An OpError on any other Shape.
std::vector<int64_t> node_shape(const Kernel& k, const In& shape_input);
// Tile grid shape (layout.Tiling.tile_grid): X's shape with the tiled dims replaced by counts.
std::vector<int64_t> grid_shape(const Geometry& g, const std::vector<int64_t>& shape, int axis,
                                int64_t rows, int64_t cols);
// CodebookLookup's Format: the dtype's, or (a Table input given) the dtype's widths with the
// Table's mappings, made in *table_fmt; an OpError for a bad Table, or none for a generic
// codebook.
const Format& lookup_format(const Kernel& k, const In& table, Format* table_fmt);
// The axis in [0, ndim); an OpError naming `x` and its shape otherwise.
int normal_axis(int64_t axis, size_t ndim, const std::vector<int64_t>& shape, const char* x);
// DequantizeMX and CodebookLookup on the CPU: decodes Y into Kernel::const_y when every input
// is constant (ONNXQ_CONST_DECODE: 0 never, 1 always, else when copying Y beats decoding it);
// leaves it empty on any error (the Runs then decode and report it).
void init_const_decode(Kernel* k, const OrtKernelInfo* info) noexcept;
void compute_quantize(const Kernel& k, OrtKernelContext* ctx);
// DequantizeMX and CodebookLookup.
void compute_dequantize(const Kernel& k, OrtKernelContext* ctx);
// QuantizeDequantizeMX: QuantizeMX's cast writing only the decoded values (the virtual cast).
void compute_quant_dequant(const Kernel& k, OrtKernelContext* ctx);

// MatMulMX (ort_kernel_mmx.cc): the checks of its attributes beyond init_kernel's, and its
// compute on the CPU.
void init_matmul_mx(Kernel* k, const OrtKernelInfo* info);
void compute_matmul_mx(const Kernel& k, OrtKernelContext* ctx);
// GatherMX (ort_kernel_gather.cc): refuses at session creation what it cannot decode; Y from
// the gathered rows' packed codes only. compute_gather_cuda: the same on the CUDA execution
// provider, the packed table in device memory (cuda::gather_packed).
void init_gather(const Kernel& k);
void compute_gather(const Kernel& k, OrtKernelContext* ctx);
void compute_gather_cuda(const Kernel& k, OrtKernelContext* ctx, void* stream);

// QuantizeMX / DequantizeMX / CodebookLookup / QuantizeDequantizeMX / GatherMX on the CUDA
// execution provider: the embedded kernels on the session's compute stream; a node they
// cannot run (its format, modes, axis or GatherMX table) runs the CPU kernel on host copies of
// its tensors, with a warning in the session's log (ONNXQ_CUDA_HOST_FALLBACK=0: refused when
// the session is created instead).
void init_cuda_kernel(Kernel* k, const OrtKernelInfo* info);
void compute_cuda(const Kernel& k, OrtKernelContext* ctx);

}  // namespace ort
}  // namespace onnxq
