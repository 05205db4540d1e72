// The CUDA path: the Triton kernels of onnxq/cast/triton.py, compiled ahead of time by
// onnxq/cast/aot.py and embedded in the library, launched through the CUDA driver API, which is
// loaded with dlopen at first use (the library needs no CUDA to build or to load). docs/gpu.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace onnxq {
struct Format;      // kernels.h
struct Modes;       // kernels.h
struct ParsedType;  // parse.h
namespace cuda {

// Parameter roles of the generated kernel table (onnxq/cast/aot.py ROLE_IDS).
enum Role : int {
  kRoleX = 0,
  kRoleY = 1,
  kRoleCodes = 2,
  kRoleScale = 3,
  kRoleMeta = 4,
  kRoleNull = 5,
  kRoleTop = 6,
  kRoleTsCode = 7,
  kRoleTs = 8,
  kRoleConst = 9,
  kRoleAmaxOut = 10,
  kRoleFlagOut = 11,
  kRoleSrc = 12,
  kRoleDst = 13,
  kRoleTable = 14,  // a codebook's float64 table (uploaded for the call)
  kRoleRows = 15,   // GatherMX: the table rows to copy (int32, uploaded for the call)
  kRoleNUnits = 20,
  kRoleNChunks = 21,
  kRoleC = 22,
  kRoleTC = 23,
  kRoleInner = 24,
  kRoleNC = 25,
  kRoleSubCols = 26,
  kRoleValue = 27,
  kRoleCount = 28,
  kRoleNBytes = 29,
  kRoleScratch = 30,
  kRoleNTiles = 31,
  kRoleCodeNBytes = 32,
  kRoleMetaNBytes = 33,
  kRoleNumel = 34,
  // codebook decoding: the format's numbers (n_inst is kRoleNUnits)
  kRoleNSub = 35,
  kRoleSub = 36,
  kRoleSBias = 37,
  kRoleSNan = 38,
  kRoleSMask = 39,
  kRoleIB = 40,
  kRoleNMap = 41,
  // the general quantize kernel's mode parameters (AotFormat's tables, by the call's modes)
  kRoleRMode = 42,
  kRoleNanNf = 43,
  kRoleFullInt = 44,
  kRoleBumpT = 45,
  kRoleRowBits = 46,  // GatherMX: bits of a row of the packed stream (kRoleCount: rows)
};

enum Op : int {
  kOpQuantValues = 0,
  kOpQuantCodes = 1,
  kOpDequant = 2,
  kOpStats = 3,
  kOpPack = 4,
  kOpUnpack = 5,
  kOpQuantBoth = 6,
  // onnxq/cast/triton_fast.py: quantize when the last axis is a multiple of the tile
  kOpFastValues = 7,
  kOpFastCodes = 8,
  kOpFastPacked = 9,  // codes and shift bits in the custom ops' packed layouts
  kOpAmax = 10,       // NVFP4's tensor amax for the fast path (bt: blocks per program)
  // codebook decoding (onnxq/cast/triton_codebook_kernels.py `_cb_dequant_kernel`), one image
  // per block of NSUB x SUB elements a tile, for every codebook data type it holds:
  kOpCbPlain = 11,  // tiles without subtiles
  kOpCbSub = 12,    // tiles with subtiles
  kOpCbLong = 13,   // tiles over 1024 elements, without subtiles: a chunk of a tile a program
  // the general kernels for tiles along an axis with elements after it (LAST=False)
  kOpQuantValuesInner = 14,
  kOpQuantCodesInner = 15,
  kOpQuantBothInner = 16,
  kOpDequantInner = 17,
  // the codebook blocks for tiles along an axis with elements after it (LAST=False)
  kOpCbPlainInner = 18,
  kOpCbSubInner = 19,
  kOpCbLongInner = 20,
  // the fast values and codes kernels for whole tiles along an axis with elements after it
  // (INNER: a program takes bt tiles side by side along those elements)
  kOpFastValuesInner = 21,
  kOpFastCodesInner = 22,
  // GatherMX: rows of a packed stream copied out (onnxq/cast/triton_gather.py), every format
  kOpGatherRows = 23
};

struct AotFormat {
  const char* preset;
  const char* code;
  int tile, sub, scaled, code_bits, scale_bits, tenscale_bits;
  // The general quantize kernel's mode parameters by mode number (onnxq_ops.h onnxq_modes):
  // rmode by round mode (even, away, zero), bump_t by scale mode (floor .. even), nan_nf by
  // NaN policy, full_int by full_int_range (aot_spec.MODES; recorded from the host code).
  int rmode[3], bump_t[7], nan_nf[2], full_int[2];
};
struct AotParam {
  int role;
  int64_t extra;  // const index (kRoleConst) or the value (kRoleValue)
};
struct AotSpan {
  uint32_t off, len;
};
struct AotImage {
  int arch;
  uint32_t off, len;
};
constexpr int kAotArchs = 2;  // sm_80, sm_90 (aot.py ARCHS)
struct AotKernel {
  int fmt, op, io_type;  // format index (-1: any), Op, input (or output) float type
  const char* name;      // the entry point in the image
  int num_warps, shared, bt;  // bt: tile instances (units, fast: tiles) per program
  int chunk;                  // stats, amax and pack kernels: elements per program
  int div16;  // compiled with Triton's divisibility hints: every pointer parameter 16-byte
              // aligned and the numel scalar a multiple of 16 (the launcher checks both)
  int nsub_block, sub_block;  // codebook decoding: the block (0 for other kernels)
  int first_param, nparams;
  AotImage cubin[kAotArchs];
  AotImage ptx;
};

// Number of embedded kernels (0 when the library was built without them).
int kernel_count();
// One line: kernels, formats, architectures and Triton version, or why there are none.
std::string describe();
// The embedded format for a preset name or its canonical code, or nullptr.
const AotFormat* find_format(const std::string& dtype);

// Whether the driver loads, has a device and the library has kernels; else *why says what not.
bool available(std::string* why);

// Why the kernels cannot quantize with these modes ("" when they can): every rounding but
// stochastic, every scale mode but search, both NaN policies, full int range.
std::string modes_supported(const Modes& m);

// Quantize (tiles along `axis`; modes: null for the defaults, else see modes_supported) on
// `stream` (a CUstream; null: the legacy default stream): the fast kernel
// (onnxq/cast/triton_fast.py) when the tiles run along the last axis, it is a multiple of the
// tile and the modes cast as the defaults do, else the general kernels, which take the modes
// at run time (ONNXQ_CUDA_FAST=0: always the general ones). x, values: float type x_type
// (0 float32, 1 float16, 2 bfloat16);
// codes: one byte per element; scale: one byte per tile; tenscale: uint32 [1]; meta: one
// byte per subtile. values or codes may be null (not both); with codes, scale (and meta for
// MX formats) are required. "" on success, else the message.
std::string quantize(const std::string& dtype, const void* x, int x_type, int ndim,
                     const int64_t* shape, int axis, void* values, void* codes, void* scale,
                     void* tenscale, void* meta, void* stream, const Modes* modes = nullptr);

// Dequantize unpacked codes (as quantize writes them) to values of type values_type.
std::string dequantize(const std::string& dtype, int ndim, const int64_t* shape, int axis,
                       const void* codes, const void* scale, const void* tenscale,
                       const void* meta, void* values, int values_type, void* stream);

// The onnxruntime layouts (docs/ops.md): Q bit-packed, Meta packed one bit per subtile (may be
// null when not wanted); scratch for the unpacked codes is stream-ordered (cuMemAllocAsync).
std::string quantize_packed(const std::string& dtype, const void* x, int x_type, int ndim,
                            const int64_t* shape, int axis, void* q, void* scale, void* tenscale,
                            void* meta_packed, void* stream, const Modes* modes = nullptr);
std::string dequantize_packed(const std::string& dtype, int ndim, const int64_t* shape, int axis,
                              const void* q, const void* scale, const void* tenscale,
                              const void* meta_packed, void* values, int values_type,
                              void* stream);

// CodebookLookup (docs/ops.md) of codebook format `f` (its table included: a generic
// codebook's comes from the caller) on the device: Q the packed indices, scale one byte per tile
// (exponent scales of up to 8 bits), meta_packed the mapping indices packed (null when the
// format has no meta bits); tiles along `axis`. The table is uploaded on the stream.
std::string lookup_packed(const Format& f, int ndim, const int64_t* shape, int axis,
                          const void* q, const void* scale, const void* meta_packed,
                          void* values, int values_type, void* stream);
// Whether `lookup_packed` has kernels for format f with tiles along any axis (whatever
// the shape, up to the tile's length: t0 is checked at each call); "" when it has.
std::string lookup_supported(const Format& f);

// Why onnxruntime's CUDA provider runs a node of data type `p` on the host fallback ("" when
// the embedded kernels run it; no driver or GPU needed): CodebookLookup (`lookup`) by the
// format's structure (a generic codebook's values come with each Run, so zeros stand in for
// them), the other ops by the embedded formats and, for the quantizing ones (`quantizes`),
// the modes. *invalid: why the data type cannot be a codebook format at all ("" else).
std::string node_reason(const ParsedType& p, bool lookup, bool quantizes, const Modes& m,
                        std::string* invalid);

// GatherMX (docs/ops.md) on the device: rows `rows` (n of them, host memory, each in [0,
// shape[0])) of the packed table of `shape`, tiles along `axis`, decoded into `values` (n x the
// row's shape, type values_type) in their order. f: the table's format, an embedded preset's
// (`code` its dtype) or a codebook's (its table included); q, scale, tenscale, meta_packed:
// the table's packed inputs on the device, as GatherMX takes them. The rows of each stream are
// copied into stream-ordered scratch, then decoded by dequantize_packed / lookup_packed.
std::string gather_packed(const Format& f, const std::string& code,
                          const std::vector<int64_t>& shape, int axis, const int64_t* rows,
                          int64_t n, const void* q, const void* scale, const void* tenscale,
                          const void* meta_packed, void* values, int values_type, void* stream);
// A row of GatherMX's table in each packed stream: elements, bits of codes, scale codes, meta;
// and the embedded format that decodes it (null for a codebook).
struct GatherRow {
  const AotFormat* preset = nullptr;
  int64_t elems = 0, q_bits = 0, scale_bits = 0, meta_bits = 0;
};
// Why gather_packed cannot run a table of `shape` (tiles along `axis`, in [0, ndim)) of format
// f ("" when it can; *row then says what a row holds): a format without kernels, or tiles
// that run along the rows (axis 0).
std::string gather_layout(const Format& f, const std::string& code,
                          const std::vector<int64_t>& shape, int axis, GatherRow* row);
// Why onnxruntime's CUDA provider runs a GatherMX node of data type `p` (attributes `shape`
// and `axis`) on the host fallback ("" when on the kernels); *invalid: why the CPU op would
// refuse the node ("" else). No driver or GPU needed.
std::string gather_reason(const ParsedType& p, const std::vector<int64_t>& shape, int64_t axis,
                          std::string* invalid);

// Copies between device and host memory on `stream`, for the custom ops' host fallback
// (ort_kernel_cuda.cc, cuda_copy.cc): copy_to_host returns once the bytes are on the host (the
// stream's earlier work included); copy_to_device queues the copy, and synchronize (the device
// of the pointer `on`) waits for the stream, after which the host buffer may go.
std::string copy_to_host(void* host, const void* device, size_t bytes, void* stream);
std::string copy_to_device(void* device, const void* host, size_t bytes, void* stream);
std::string synchronize(const void* on, void* stream);

// Bit packing on the device (LSB first, packing.py's stream): `count` one-byte codes of `bits`
// (1..8) bits -> ceil(count * bits / 8) bytes, and back.
std::string pack_bits(const void* codes, int64_t count, int bits, void* packed, void* stream);
std::string unpack_bits(const void* packed, int64_t count, int bits, void* codes, void* stream);

}  // namespace cuda
}  // namespace onnxq
