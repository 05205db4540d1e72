// The CUDA path (cuda_launch.h, docs/gpu.md) on the driver API of cuda_driver.h: the embedded
// Triton kernels (ONNXQ_WITH_AOT: aot_index.inc + kernels.bin written by onnxq/cast/aot.py),
// loaded per device, and the launchers of cuda_launch.h. The C ABI entry points onnxq_cuda_*
// are in cuda_capi.cc.
#include "cuda_launch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "cuda_internal.h"
#include "kernels.h"
#include "onnxq_ops.h"
#include "parse.h"

#if defined(ONNXQ_WITH_AOT)
// The images, embedded as they are (no hex dump through the compiler). ONNXQ_AOT_BLOB is the
// quoted path of kernels.bin.
__asm__(
    ".section .rodata.onnxq_aot,\"a\",@progbits\n"
    ".balign 64\n"
    ".globl onnxq_aot_blob\n"
    ".hidden onnxq_aot_blob\n"
    "onnxq_aot_blob:\n"
    ".incbin \"" ONNXQ_AOT_BLOB "\"\n"
    ".previous\n");
extern "C" const unsigned char onnxq_aot_blob[];
#endif

namespace onnxq {
namespace cuda {
using namespace detail;  // NOLINT(build/namespaces): this file defines them
namespace {

#if defined(ONNXQ_WITH_AOT)
#include "aot_index.inc"
static_assert(ONNXQ_AOT_NARCH == kAotArchs, "aot.py ARCHS and cuda_launch.h disagree");
static_assert(ONNXQ_AOT_FORMAT_VERSION == 4, "aot_index.inc of another format version");
constexpr int64_t kAmaxPrograms = ONNXQ_AOT_AMAX_PROGRAMS;
constexpr int kFormatCount = sizeof(kAotFormats) / sizeof(kAotFormats[0]);
constexpr int kKernelCount = sizeof(kAotKernels) / sizeof(kAotKernels[0]);
const unsigned char* blob() { return onnxq_aot_blob; }
#else
constexpr int64_t kAmaxPrograms = 1;
constexpr int kFormatCount = 0;
constexpr int kKernelCount = 0;
const AotFormat* const kAotFormats = nullptr;
const AotKernel* const kAotKernels = nullptr;
const AotParam* const kAotParams = nullptr;
const AotSpan* const kAotConsts = nullptr;
const unsigned char* blob() { return nullptr; }
#endif

}  // namespace

// -- shared with the other launchers (cuda_internal.h) ------------------------------------------
namespace detail {

const char* const kNoKernels =
    "this onnxq library was built without GPU kernels (triton and torch were not importable "
    "when it was built; install them and rebuild with `python -m pip install -e .`)";

std::recursive_mutex g_mutex;

// -- per-device state: primary contexts, loaded functions, constant tables ----------------------
struct Device {
  CUcontext ctx = nullptr;
  int cc = 0;  // compute capability * 10 + minor
  std::map<uint32_t, CUmodule> modules;  // by image (its PTX offset in the blob)
  std::map<int, CUfunction> functions;
  std::map<int, CUdeviceptr> consts;
};
std::map<int, Device> g_devices;

CUcontext context_of(const Device& dv) { return dv.ctx; }

const AotKernel& aot_kernel(int k) { return kAotKernels[k]; }

void check(CUresult r, const std::string& what) {
  if (r != 0) throw Error{what + " failed: " + err_text(driver(), r)};
}

Device& device(int ordinal) {  // g_mutex held
  Device& dv = g_devices[ordinal];
  if (!dv.ctx) {
    const Driver& d = driver();
    CUdevice handle = 0;
    check(d.cuDeviceGet(&handle, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
    CUcontext ctx = nullptr;
    check(d.cuDevicePrimaryCtxRetain(&ctx, handle),
          "cuDevicePrimaryCtxRetain(" + std::to_string(ordinal) + ")");
    int major = 0, minor = 0;
    check(d.cuDeviceGetAttribute(&major, kAttrMajor, handle), "cuDeviceGetAttribute");
    check(d.cuDeviceGetAttribute(&minor, kAttrMinor, handle), "cuDeviceGetAttribute");
    dv.ctx = ctx;
    dv.cc = major * 10 + minor;
  }
  return dv;
}

CtxScope::CtxScope(CUcontext ctx) { check(driver().cuCtxPushCurrent(ctx), "cuCtxPushCurrent"); }
CtxScope::~CtxScope() {
  CUcontext old = nullptr;
  driver().cuCtxPopCurrent(&old);
}

// The device ordinal of a device pointer; a host pointer is refused by name.
int device_of(const void* p, const char* what) {
  const Driver& d = driver();
  unsigned type = 0;
  CUresult r = d.cuPointerGetAttribute(&type, kPtrMemoryType, reinterpret_cast<CUdeviceptr>(p));
  if (r != 0 || (type != kMemDevice && type != kMemUnified))
    throw Error{std::string(what) + " is not CUDA device memory (a CPU tensor?)"};
  int ordinal = -1;
  check(d.cuPointerGetAttribute(&ordinal, kPtrDeviceOrdinal, reinterpret_cast<CUdeviceptr>(p)),
        std::string("cuPointerGetAttribute(") + what + ")");
  return ordinal;
}

void same_device(const void* p, const char* what, int dev) {
  if (!p) return;
  int o = device_of(p, what);
  if (o != dev)
    throw Error{std::string(what) + " is on CUDA device " + std::to_string(o) +
                ", the input on device " + std::to_string(dev)};
}

[[maybe_unused]] std::string arch_list() {
  std::string s;
  for (int a = 0; a < kAotArchs && kKernelCount; ++a)
    s += (a ? ", sm_" : "sm_") + std::to_string(kAotKernels[0].cubin[a].arch);
  return s;
}

// The kernel's function on this device: the cubin of its architecture, else the PTX (JIT).
CUfunction function(Device& dv, int k) {  // g_mutex held, context current
  auto it = dv.functions.find(k);
  if (it != dv.functions.end()) return it->second;
  const Driver& d = driver();
  const AotKernel& K = kAotKernels[k];
  const int ptx_arch = static_cast<int>(K.ptx.arch);
  if (dv.cc < ptx_arch)
    throw Error{"unsupported GPU architecture sm_" + std::to_string(dv.cc) +
                ": the embedded kernels need sm_" + std::to_string(ptx_arch) + " or newer"};
  CUmodule mod = nullptr;
  auto known = dv.modules.find(K.ptx.off);  // table entries share images
  if (known != dv.modules.end()) mod = known->second;
  std::string tried;
  // A cubin runs on its own major version from its minor on (sm_90a: on sm_90 only).
  for (int a = kAotArchs - 1; a >= 0 && !mod; --a) {
    const AotImage& im = K.cubin[a];
    bool fits = im.arch == 90 ? dv.cc == 90 : (dv.cc / 10 == im.arch / 10 && dv.cc >= im.arch);
    if (!fits || !im.len) continue;
    CUresult r = d.cuModuleLoadData(&mod, blob() + im.off);
    if (r != 0) {
      tried += "cubin sm_" + std::to_string(im.arch) + ": " + err_text(d, r) + "; ";
      mod = nullptr;
    }
  }
  if (!mod) {
    CUresult r = d.cuModuleLoadData(&mod, blob() + K.ptx.off);
    if (r != 0)
      throw Error{"no kernel image loads on this sm_" + std::to_string(dv.cc) + " GPU (" + tried +
                  "PTX sm_" + std::to_string(ptx_arch) + ": " + err_text(d, r) +
                  "; a driver older than the Triton that compiled them?)"};
  }
  dv.modules[K.ptx.off] = mod;
  CUfunction f = nullptr;
  check(d.cuModuleGetFunction(&f, mod, K.name), std::string("cuModuleGetFunction(") + K.name + ")");
  if (K.shared > 48 * 1024)
    check(d.cuFuncSetAttribute(f, kFuncMaxDynShared, K.shared), "cuFuncSetAttribute");
  dv.functions[k] = f;
  return f;
}

CUdeviceptr const_table(Device& dv, int index) {  // g_mutex held, context current
  auto it = dv.consts.find(index);
  if (it != dv.consts.end()) return it->second;
  const Driver& d = driver();
  const AotSpan& s = kAotConsts[index];
  CUdeviceptr p = 0;
  check(d.cuMemAlloc(&p, s.len ? s.len : 4), "cuMemAlloc");
  if (s.len) check(d.cuMemcpyHtoD(p, blob() + s.off, s.len), "cuMemcpyHtoD");
  dv.consts[index] = p;
  return p;
}

void launch(Device& dv, int k, const Bind& b, CUstream stream) {
  const AotKernel& K = kAotKernels[k];
  CUfunction f = function(dv, k);
  std::vector<unsigned long long> slots(K.nparams);
  std::vector<void*> args(K.nparams);
  for (int i = 0; i < K.nparams; ++i) {
    const AotParam& p = kAotParams[K.first_param + i];
    unsigned long long v = 0;
    int32_t s32 = 0;
    bool scalar = true;
    switch (p.role) {
      case kRoleNUnits: s32 = static_cast<int32_t>(b.n_units); break;
      case kRoleNChunks: s32 = static_cast<int32_t>(b.n_chunks); break;
      case kRoleC: s32 = static_cast<int32_t>(b.C); break;
      case kRoleTC: s32 = static_cast<int32_t>(b.TC); break;
      case kRoleInner: s32 = static_cast<int32_t>(b.inner); break;
      case kRoleNC: s32 = static_cast<int32_t>(b.nC); break;
      case kRoleSubCols: s32 = static_cast<int32_t>(b.sub_cols); break;
      case kRoleValue: s32 = static_cast<int32_t>(p.extra); break;
      case kRoleCount: s32 = static_cast<int32_t>(b.count); break;
      case kRoleNBytes: s32 = static_cast<int32_t>(b.nbytes); break;
      case kRoleNTiles: s32 = static_cast<int32_t>(b.n_tiles); break;
      case kRoleCodeNBytes: s32 = static_cast<int32_t>(b.code_nbytes); break;
      case kRoleMetaNBytes: s32 = static_cast<int32_t>(b.meta_nbytes); break;
      case kRoleNumel: s32 = static_cast<int32_t>(b.numel); break;
      case kRoleNSub: s32 = static_cast<int32_t>(b.nsub); break;
      case kRoleSub: s32 = static_cast<int32_t>(b.sub); break;
      case kRoleSBias: s32 = static_cast<int32_t>(b.s_bias); break;
      case kRoleSNan: s32 = static_cast<int32_t>(b.s_nan); break;
      case kRoleSMask: s32 = static_cast<int32_t>(b.s_mask); break;
      case kRoleIB: s32 = static_cast<int32_t>(b.ib); break;
      case kRoleNMap: s32 = static_cast<int32_t>(b.nmap); break;
      case kRoleRMode: s32 = static_cast<int32_t>(b.rmode); break;
      case kRoleNanNf: s32 = static_cast<int32_t>(b.nan_nf); break;
      case kRoleFullInt: s32 = static_cast<int32_t>(b.full_int); break;
      case kRoleBumpT: s32 = static_cast<int32_t>(b.bump_t); break;
      case kRoleRowBits: s32 = static_cast<int32_t>(b.row_bits); break;
      default: scalar = false;
    }
    if (scalar && K.div16 && p.role == kRoleNumel && s32 % 16 != 0)
      throw Error{"kernel " + std::string(K.name) + ": numel must be a multiple of 16"};
    if (scalar) {
      std::memcpy(&v, &s32, sizeof s32);  // a 4-byte parameter: the launch reads 4 bytes
    } else if (p.role == kRoleConst) {
      v = const_table(dv, static_cast<int>(p.extra));
    } else if (p.role == kRoleNull || p.role == kRoleScratch) {
      v = 0;
    } else if (p.role >= 0 && p.role < kPtrRoles) {
      v = reinterpret_cast<unsigned long long>(b.ptr[p.role]);
    } else {
      throw Error{"kernel " + std::string(K.name) + ": unknown parameter role " +
                  std::to_string(p.role) + " (library and generator disagree)"};
    }
    if (!scalar && K.div16 && v % 16 != 0)
      throw Error{"kernel " + std::string(K.name) + ": a pointer not 16-byte aligned"};
    slots[i] = v;
    args[i] = &slots[i];
  }
  int64_t units = b.n_units, per = K.bt;
  if (K.op == kOpPack || K.op == kOpUnpack) {
    units = K.op == kOpPack ? b.nbytes : b.count;
    per = K.chunk;
  } else if (K.op == kOpGatherRows) {
    units = (b.count * b.row_bits + 7) / 8;  // bytes of the rows copied
    per = K.chunk;
  } else if (K.op == kOpFastValues || K.op == kOpFastCodes || K.op == kOpFastPacked) {
    units = b.n_tiles;  // BT whole tiles a program
  } else if (K.op == kOpFastValuesInner || K.op == kOpFastCodesInner) {
    // a program a row of tiles (the tiled axis's tile and what precedes it) and BT inner
    // positions: triton_fast.FastPlan.programs
    units = b.inner > 0 ? b.n_tiles / b.inner * ((b.inner + K.bt - 1) / K.bt) : 0;
    per = 1;
  } else if (K.op == kOpAmax) {
    units = b.numel;  // BLOCK * ROUNDS elements a program (it strides over the grid)
    per = K.chunk;
  } else if (K.op == kOpCbLong || K.op == kOpCbLongInner) {
    units = b.n_units * b.n_chunks;  // a chunk of a tile a program
    per = 1;
  }
  int64_t grid = per > 0 ? (units + per - 1) / per : 0;
  if (grid <= 0) return;
  check(driver().cuLaunchKernel(f, static_cast<unsigned>(grid), 1, 1, 32u * K.num_warps, 1, 1,
                                K.shared, stream, args.data(), nullptr),
        std::string("cuLaunchKernel(") + K.name + ")");
}

int find_kernel(int fmt, int op, int io_type) {
  for (int k = 0; k < kKernelCount; ++k) {
    const AotKernel& K = kAotKernels[k];
    if (K.fmt == fmt && K.op == op && K.io_type == io_type) return k;
  }
  return -1;
}

bool same_number(const onnxq_number& a, const onnxq_number& b) {
  return a.kind == b.kind && a.ebits == b.ebits && a.mbits == b.mbits && a.bias == b.bias &&
         a.infnan == b.infnan;
}

// The parsed data types are the same format (embedded formats have no codebook).
bool same_format(const onnxq_format& a, const onnxq_format& b) {
  if (a.cb_index_bits || b.cb_index_bits) return false;
  return same_number(a.elem, b.elem) && a.scaled == b.scaled && same_number(a.scale, b.scale) &&
         a.has_zero == b.has_zero && (!a.has_zero || same_number(a.zero, b.zero)) &&
         a.has_tenscale == b.has_tenscale &&
         (!a.has_tenscale || same_number(a.tenscale, b.tenscale)) && a.ntiles == b.ntiles &&
         a.tile[0] == b.tile[0] && a.tile[1] == b.tile[1] && a.sub[0] == b.sub[0] &&
         a.sub[1] == b.sub[1] && a.sparse_n == b.sparse_n && a.sparse_m == b.sparse_m &&
         a.sparse_dim == b.sparse_dim;
}

// By preset name, by canonical code, by any preset name of an embedded code (mxfp8, MXINT4),
// or by any other spelling of its code (E4M3FN_E8M0_T32, e4m3_e8m0_t32, float8_e4m3fn_...,
// int8_e8m0_t16s0): a custom op's dtype attribute may hold any text the CPU op parses.
int format_index(const std::string& dtype) {
  const std::string alias = preset_code(dtype);
  const std::string& want = alias.empty() ? dtype : alias;
  for (int i = 0; i < kFormatCount; ++i)
    if (want == kAotFormats[i].preset || want == kAotFormats[i].code) return i;
  ParsedType given;
  if (!parse_dtype(dtype, &given).empty()) return -1;
  static const std::vector<ParsedType> embedded = [] {
    std::vector<ParsedType> v(kFormatCount);
    for (int i = 0; i < kFormatCount; ++i)
      if (!parse_dtype(kAotFormats[i].code, &v[i]).empty()) v[i].fmt.cb_index_bits = -1;
    return v;
  }();
  for (int i = 0; i < kFormatCount; ++i)
    if (same_format(given.fmt, embedded[i].fmt)) return i;
  return -1;
}

std::string format_list() {
  std::string s;
  for (int i = 0; i < kFormatCount; ++i) s += (i ? ", " : "") + std::string(kAotFormats[i].preset);
  return s;
}

const char* const kTypes[3] = {"float32", "float16", "bfloat16"};

struct Geometry {
  int64_t numel = 1;
  Bind b;
};

Extent extent(int ndim, const int64_t* shape, int axis) {
  if (ndim < 1 || !shape) throw Error{"the tensor needs a shape of rank 1 or more"};
  if (axis < -ndim || axis >= ndim)
    throw Error{"axis " + std::to_string(axis) + " is out of range for a rank-" +
                std::to_string(ndim) + " tensor"};
  Extent e;
  e.axis = axis < 0 ? axis + ndim : axis;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0) throw Error{"negative dimension in the shape"};
    e.numel *= shape[i];
    if (e.numel >= (int64_t(1) << 31))
      throw Error{"tensors of 2^31 elements or more are not supported by the CUDA kernels"};
    if (i > e.axis) e.inner *= shape[i];
  }
  return e;
}

Geometry geometry(const AotFormat& F, int ndim, const int64_t* shape, int axis) {
  const Extent ext = extent(ndim, shape, axis);
  Geometry g;
  g.numel = ext.numel;
  const int64_t inner = ext.inner;
  // Units are tiles: (elements before the axis) x (tiles along it) x (elements after it).
  int64_t C = shape[ext.axis];
  g.b.C = C;
  g.b.TC = F.tile;
  g.b.nC = C ? (C + F.tile - 1) / F.tile : 0;
  g.b.n_units = C ? (g.numel / C) * g.b.nC : 0;
  g.b.n_chunks = 1;
  g.b.inner = inner;
  g.b.sub_cols = F.sub ? (C + F.sub - 1) / F.sub : 1;
  return g;
}

// The general kernel of `op` for the geometry: the LAST=False compile where elements follow
// the tiled axis (its operation number is the inner variant's).
int general_op(int op, const Geometry& g) {
  if (g.b.inner == 1) return op;
  switch (op) {
    case kOpQuantValues:
      return kOpQuantValuesInner;
    case kOpQuantCodes:
      return kOpQuantCodesInner;
    case kOpQuantBoth:
      return kOpQuantBothInner;
    default:
      return kOpDequantInner;
  }
}

const AotFormat& format_for(const std::string& dtype) {
  if (kKernelCount == 0) throw Error{kNoKernels};
  int fi = format_index(dtype);
  if (fi < 0)
    throw Error{"no CUDA kernel for data type " + quote_code(dtype) +
                " (the library has kernels for " + format_list() +
                "; other formats run on the Triton or CPU engines)"};
  return kAotFormats[fi];
}

void need_driver() {
  const Driver& d = driver();
  if (!d.error.empty()) throw Error{d.error};
}

Scratch::Scratch(size_t bytes, CUstream s) : stream(s) {
  const Driver& d = driver();
  if (!d.cuMemAllocAsync || !d.cuMemFreeAsync)
    throw Error{"this CUDA driver has no cuMemAllocAsync (CUDA 11.2+), which NVFP4 and "
                "packed codes need"};
  check(d.cuMemAllocAsync(&p, bytes, s), "cuMemAllocAsync");
}
Scratch::~Scratch() {
  if (p) driver().cuMemFreeAsync(p, stream);
}

// The fast path (onnxq/cast/triton_fast.py: whole tiles, one pass) takes a quantization when
// the tiled axis is a multiple of the tile and the library has its kernels for the input type
// (along another axis than the last: values and unpacked codes); the general kernels
// (onnxq/cast/triton.py) take the rest. ONNXQ_CUDA_FAST=0 sends every
// quantization to the general kernels (tests and comparisons; read at each call).
bool fast_enabled() {
  const char* e = std::getenv("ONNXQ_CUDA_FAST");
  return !(e && std::strcmp(e, "0") == 0);
}

// NVFP4's tensor amax on the fast path: of the compiled ROUNDS (blocks per program) variants,
// the largest not above the host's choice (about kAmaxPrograms programs, one atomic each).
int amax_kernel(int x_type, int64_t numel) {
  int best = -1, smallest = -1;
  for (int k = 0; k < kKernelCount; ++k) {
    const AotKernel& K = kAotKernels[k];
    if (K.op != kOpAmax || K.io_type != x_type || K.bt < 1 || K.chunk < K.bt) continue;
    int64_t block = K.chunk / K.bt;
    int64_t blocks = (numel + block - 1) / block;
    int64_t need = (blocks + kAmaxPrograms - 1) / kAmaxPrograms, rounds = 1;
    while (rounds < need) rounds <<= 1;
    if (smallest < 0 || K.bt < kAotKernels[smallest].bt) smallest = k;
    if (K.bt <= rounds && (best < 0 || K.bt > kAotKernels[best].bt)) best = k;
  }
  return best >= 0 ? best : smallest;
}

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Whether modes `m` cast format F as its default modes do: the general kernel's parameters
// for them are the defaults' (a scale mode of an integer element, say), so the fast kernel,
// compiled for the defaults, gives their bits. Throws Error for modes without kernels.
bool as_default_modes(const AotFormat& F, const Modes& m) {
  const std::string unsupported = modes_supported(m);
  if (!unsupported.empty()) throw Error{unsupported};
  return F.rmode[m.round_mode] == F.rmode[0] && F.bump_t[m.scale_mode] == F.bump_t[0] &&
         F.nan_nf[m.nan_policy] == F.nan_nf[0] && F.full_int[m.full_int_range] == F.full_int[0];
}

// The fast kernels for this quantization (*kv values, *kc codes, -1 where not wanted), or
// false when the general kernels must take it. They are compiled for 16-byte aligned buffers
// (`ptrs`: the caller's), as the JIT compiles them for aligned tensors, and the default modes.
bool fast_kernels(const AotFormat& F, int fi, const Geometry& g, int x_type, const Modes& m,
                  bool values, bool codes, bool packed, std::initializer_list<const void*> ptrs,
                  int* kv, int* kc) {
  *kv = *kc = -1;
  if (!fast_enabled() || !as_default_modes(F, m) || F.tile < 1 || g.b.C % F.tile != 0 ||
      !aligned16(ptrs))
    return false;
  if (F.tenscale_bits && (g.numel % 16 != 0 || amax_kernel(x_type, g.numel) < 0)) return false;
  if (g.b.inner != 1) {  // tiles along a non-last axis: values, unpacked codes (one each)
    if (packed) return false;  // the general path packs the codes kernel's output
    if (values) *kv = find_kernel(fi, kOpFastValuesInner, x_type);
    if (codes) *kc = find_kernel(fi, kOpFastCodesInner, x_type);
    return (!values || *kv >= 0) && (!codes || *kc >= 0);
  }
  if (packed) {  // 8-bit codes without shift bits: the packed layouts are the unpacked ones
    const bool same = F.code_bits == 8 && !F.sub;
    *kc = find_kernel(fi, same ? kOpFastCodes : kOpFastPacked, x_type);
    return *kc >= 0;
  }
  if (values) *kv = find_kernel(fi, kOpFastValues, x_type);
  if (codes) *kc = find_kernel(fi, kOpFastCodes, x_type);
  return (!values || *kv >= 0) && (!codes || *kc >= 0);
}

// packed (the custom ops' layouts, fast path only): codes is Q, meta the packed shift bits.
std::string quantize_impl(const std::string& dtype, const void* x, int x_type, int ndim,
                          const int64_t* shape, int axis, void* values, void* codes, void* scale,
                          void* tenscale, void* meta, void* stream, const Modes& m,
                          bool packed = false) {
  const AotFormat& F = format_for(dtype);
  as_default_modes(F, m);  // refuses modes without kernels before anything else
  if (x_type < 0 || x_type > 2) throw Error{"float types are 0 (float32), 1 (float16), 2 (bfloat16)"};
  if (!x) throw Error{"x is null"};
  if (!values && !codes) throw Error{"nothing to compute: values and codes are both null"};
  if (codes && F.scaled && !scale) throw Error{"codes need the scale output"};
  if (codes && F.sub && !meta) throw Error{F.preset + std::string(" codes need the meta output")};
  Geometry g = geometry(F, ndim, shape, axis);
  if (g.numel == 0) return "";
  need_driver();
  int dev = device_of(x, "x");
  same_device(values, "values", dev);
  same_device(codes, "codes", dev);
  same_device(scale, "scale", dev);
  same_device(tenscale, "tenscale", dev);
  same_device(meta, "meta", dev);
  int fi = static_cast<int>(&F - kAotFormats);
  int fv = -1, fc = -1;
  const bool fast = fast_kernels(F, fi, g, x_type, m, values, codes, packed,
                                 {x, values, codes, scale, tenscale, meta}, &fv, &fc);
  if (packed && !fast) throw Error{"packed quantize without its fast kernel (internal error)"};
  int kv = values && !fast ? find_kernel(fi, general_op(kOpQuantValues, g), x_type) : -1;
  int kc = codes && !fast ? find_kernel(fi, general_op(kOpQuantCodes, g), x_type) : -1;
  if (!fast && ((values && kv < 0) || (codes && kc < 0)))
    throw Error{std::string("no CUDA kernel for ") + F.preset + " with " + kTypes[x_type] +
                " input" + (g.b.inner > 1 ? " tiled along a non-last axis" : "")};
  CUstream s = static_cast<CUstream>(stream);
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(dv.ctx);
  Bind b = g.b;
  b.ptr[kRoleX] = x;
  b.ptr[kRoleY] = values;
  b.ptr[kRoleCodes] = codes;
  b.ptr[kRoleScale] = scale;
  b.ptr[kRoleMeta] = meta;
  b.rmode = F.rmode[m.round_mode];  // as_default_modes checked the indices
  b.bump_t = F.bump_t[m.scale_mode];
  b.nan_nf = F.nan_nf[m.nan_policy];
  b.full_int = F.full_int[m.full_int_range];
  std::unique_ptr<Scratch> scratch;
  if (fast) {
    const int64_t n_tiles = g.numel / F.tile;
    const int64_t nmeta = F.sub ? n_tiles * (F.tile / F.sub) : 0;
    b.n_tiles = n_tiles;
    b.code_nbytes = packed ? (g.numel * F.code_bits + 7) / 8 : g.numel;
    b.meta_nbytes = packed ? (nmeta + 7) / 8 : nmeta;
    b.numel = g.numel;
    if (F.tenscale_bits) {
      // Tensor amax: one pass, an atomic max per program into a zeroed int32 (float32 bits)
      const Driver& d = driver();
      if (!d.cuMemsetD32Async) throw Error{"this CUDA driver has no cuMemsetD32Async"};
      scratch.reset(new Scratch(32, s));  // the amax, the tensor-scale code if not wanted
      check(d.cuMemsetD32Async(scratch->p, 0, 1, s), "cuMemsetD32Async");
      b.ptr[kRoleTop] = reinterpret_cast<void*>(scratch->p);
      b.ptr[kRoleTsCode] = tenscale ? tenscale : reinterpret_cast<void*>(scratch->p + 16);
      launch(dv, amax_kernel(x_type, g.numel), b, s);
    }
    if (fv >= 0) launch(dv, fv, b, s);  // values and codes: two one-pass launches
    if (fc >= 0) launch(dv, fc, b, s);
    return "";
  }
  if (F.tenscale_bits) {
    // Tensor amax: chunks of the stats kernel's tile, then the chunk maxima again (their bits
    // read as float32: finite, non-negative) until one is left.
    int k_in = find_kernel(-1, kOpStats, x_type), k_f32 = find_kernel(-1, kOpStats, 0);
    if (k_in < 0 || k_f32 < 0) throw Error{"the library lacks the tensor-amax kernels"};
    std::vector<int64_t> counts;  // elements read by each pass
    int64_t n = g.numel;
    const int64_t chunk = kAotKernels[k_in].chunk;
    if (chunk < 1 || kAotKernels[k_f32].chunk != chunk) throw Error{"bad tensor-amax kernels"};
    size_t bytes = 16;  // the tensor-scale code when the caller does not want it
    for (;;) {
      counts.push_back(n);
      int64_t c = (n + chunk - 1) / chunk;
      bytes += static_cast<size_t>(c) * 8;  // amax (4) + flags (1), 8-aligned
      if (c == 1) break;
      n = c;
    }
    scratch.reset(new Scratch(bytes, s));
    CUdeviceptr base = scratch->p, cursor = base + 16;
    const void* in = x;
    for (size_t pass = 0; pass < counts.size(); ++pass) {
      int64_t m = counts[pass], c = (m + chunk - 1) / chunk;
      Bind sb;
      sb.ptr[kRoleX] = in;
      sb.ptr[kRoleAmaxOut] = reinterpret_cast<void*>(cursor);
      sb.ptr[kRoleFlagOut] = reinterpret_cast<void*>(cursor + 4 * c);
      sb.n_units = c;
      sb.n_chunks = c;
      sb.C = m;
      sb.TC = m;
      sb.inner = 1;
      sb.nC = 1;
      launch(dv, pass == 0 ? k_in : k_f32, sb, s);
      in = reinterpret_cast<const void*>(cursor);
      cursor += static_cast<CUdeviceptr>(c) * 8;
    }
    b.ptr[kRoleTop] = in;
    b.ptr[kRoleTsCode] = tenscale ? tenscale : reinterpret_cast<void*>(base);
  }
  int kb = values && codes ? find_kernel(fi, general_op(kOpQuantBoth, g), x_type) : -1;
  if (kb >= 0) {
    launch(dv, kb, b, s);  // one pass writes both
  } else {
    if (kv >= 0) launch(dv, kv, b, s);
    if (kc >= 0) launch(dv, kc, b, s);
  }
  return "";
}

std::string dequantize_impl(const std::string& dtype, int ndim, const int64_t* shape, int axis,
                            const void* codes, const void* scale, const void* tenscale,
                            const void* meta, void* values, int values_type, void* stream) {
  const AotFormat& F = format_for(dtype);
  if (values_type < 0 || values_type > 2)
    throw Error{"float types are 0 (float32), 1 (float16), 2 (bfloat16)"};
  if (!codes || !values) throw Error{"codes and values are required"};
  if (F.scaled && !scale) throw Error{"the scale input is required"};
  if (F.sub && !meta) throw Error{F.preset + std::string(" needs the meta (shift bits) input")};
  if (F.tenscale_bits && !tenscale) throw Error{F.preset + std::string(" needs the tensor scale")};
  Geometry g = geometry(F, ndim, shape, axis);
  if (g.numel == 0) return "";
  need_driver();
  int dev = device_of(codes, "codes");
  same_device(values, "values", dev);
  same_device(scale, "scale", dev);
  same_device(tenscale, "tenscale", dev);
  same_device(meta, "meta", dev);
  int fi = static_cast<int>(&F - kAotFormats);
  int k = find_kernel(fi, general_op(kOpDequant, g), values_type);
  if (k < 0)
    throw Error{std::string("no CUDA kernel for ") + F.preset + " with " + kTypes[values_type] +
                " output" + (g.b.inner > 1 ? " tiled along a non-last axis" : "")};
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(dv.ctx);
  Bind b = g.b;
  b.ptr[kRoleCodes] = codes;
  b.ptr[kRoleY] = values;
  b.ptr[kRoleScale] = scale;
  b.ptr[kRoleMeta] = meta;
  b.ptr[kRoleTs] = tenscale;  // a float32 tensor scale: its code is its bits
  launch(dv, k, b, static_cast<CUstream>(stream));
  return "";
}

std::string pack_impl(bool pack, const void* in, int64_t count, int bits, void* out,
                      void* stream) {
  if (kKernelCount == 0) throw Error{kNoKernels};
  if (count < 0 || count >= (int64_t(1) << 31)) throw Error{"pack: count out of range"};
  if (count == 0) return "";
  if (!in || !out) throw Error{"pack: null buffer"};
  int k = find_kernel(-1, pack ? kOpPack : kOpUnpack, bits);
  if (k < 0) throw Error{"no CUDA kernel packs " + std::to_string(bits) + "-bit codes"};
  need_driver();
  int dev = device_of(in, pack ? "codes" : "packed");
  same_device(out, pack ? "packed" : "codes", dev);
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(dv.ctx);
  Bind b;
  b.ptr[kRoleSrc] = in;
  b.ptr[kRoleDst] = out;
  b.count = count;
  b.nbytes = (count * bits + 7) / 8;
  launch(dv, k, b, static_cast<CUstream>(stream));
  return "";
}

// The onnxruntime layouts: Q bit-packed (LSB first), Meta packed one bit per subtile. The fast
// kernel writes them directly; on the general kernels, codes under 8 bits and the shift bits go
// through stream-ordered scratch and the pack kernels.
std::string quantize_packed_impl(const std::string& dtype, const void* x, int x_type, int ndim,
                                 const int64_t* shape, int axis, void* q, void* scale,
                                 void* tenscale, void* meta_packed, void* stream,
                                 const Modes& m) {
  const AotFormat& F = format_for(dtype);
  as_default_modes(F, m);  // refuses modes without kernels before anything else
  if (!q || !scale) throw Error{"Q and Scale are required"};
  Geometry g = geometry(F, ndim, shape, axis);
  if (g.numel == 0) return "";
  need_driver();
  int dev = device_of(x ? x : q, "x");
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(dv.ctx);
  CUstream s = static_cast<CUstream>(stream);
  int64_t ncodes = F.code_bits < 8 ? g.numel : 0;
  int64_t nmeta = F.sub ? g.numel / g.b.C * g.b.sub_cols : 0;
  std::unique_ptr<Scratch> scratch;
  int fv = -1, fc = -1;
  if (fast_kernels(F, static_cast<int>(&F - kAotFormats), g, x_type, m, false, true, true,
                   {x, q, scale, tenscale, meta_packed}, &fv, &fc)) {
    void* meta = meta_packed;
    if (nmeta && !meta) {  // the kernel writes the shift bits anyway
      scratch.reset(new Scratch(static_cast<size_t>((nmeta + 7) / 8 + 16), s));
      meta = reinterpret_cast<void*>(scratch->p);
    }
    return quantize_impl(dtype, x, x_type, ndim, shape, axis, nullptr, q, scale, tenscale, meta,
                         stream, m, true);
  }
  if (ncodes + nmeta) scratch.reset(new Scratch(static_cast<size_t>(ncodes + nmeta + 16), s));
  CUdeviceptr base = scratch ? scratch->p : 0;
  void* codes = ncodes ? reinterpret_cast<void*>(base) : q;
  void* meta = nmeta ? reinterpret_cast<void*>(base + ncodes) : nullptr;
  quantize_impl(dtype, x, x_type, ndim, shape, axis, nullptr, codes, scale, tenscale, meta,
                stream, m);
  if (ncodes) pack_impl(true, codes, ncodes, F.code_bits, q, stream);
  if (nmeta && meta_packed) pack_impl(true, meta, nmeta, 1, meta_packed, stream);
  return "";
}

std::string dequantize_packed_impl(const std::string& dtype, int ndim, const int64_t* shape,
                                   int axis, const void* q, const void* scale,
                                   const void* tenscale, const void* meta_packed, void* values,
                                   int values_type, void* stream) {
  const AotFormat& F = format_for(dtype);
  if (!q || !values) throw Error{"Q and Y are required"};
  if (F.sub && !meta_packed) throw Error{F.preset + std::string(" needs the Meta input")};
  Geometry g = geometry(F, ndim, shape, axis);
  if (g.numel == 0) return "";
  need_driver();
  int dev = device_of(q, "Q");
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(dv.ctx);
  CUstream s = static_cast<CUstream>(stream);
  int64_t ncodes = F.code_bits < 8 ? g.numel : 0;
  int64_t nmeta = F.sub ? g.numel / g.b.C * g.b.sub_cols : 0;
  std::unique_ptr<Scratch> scratch;
  if (ncodes + nmeta) scratch.reset(new Scratch(static_cast<size_t>(ncodes + nmeta + 16), s));
  CUdeviceptr base = scratch ? scratch->p : 0;
  const void* codes = q;
  const void* meta = nullptr;
  if (ncodes) {
    pack_impl(false, q, ncodes, F.code_bits, reinterpret_cast<void*>(base), stream);
    codes = reinterpret_cast<const void*>(base);
  }
  if (nmeta) {
    pack_impl(false, meta_packed, nmeta, 1, reinterpret_cast<void*>(base + ncodes), stream);
    meta = reinterpret_cast<const void*>(base + ncodes);
  }
  return dequantize_impl(dtype, ndim, shape, axis, codes, scale, tenscale, meta, values,
                         values_type, stream);
}

}  // namespace detail

int kernel_count() { return kKernelCount; }

std::string describe() {
  if (kKernelCount == 0) return kNoKernels;
#if defined(ONNXQ_WITH_AOT)
  return std::to_string(kKernelCount) + " kernels (Triton " ONNXQ_AOT_TRITON_VERSION ", cubin " +
         arch_list() + ", PTX sm_" + std::to_string(kAotKernels[0].ptx.arch) + ") for " +
         format_list();
#else
  return kNoKernels;
#endif
}

const AotFormat* find_format(const std::string& dtype) {
  int i = format_index(dtype);
  return i < 0 ? nullptr : &kAotFormats[i];
}

bool available(std::string* why) {
  std::string w;
  if (kKernelCount == 0) {
    w = kNoKernels;
  } else {
    const Driver& d = driver();
    w = d.error;
  }
  if (why) *why = w;
  return w.empty();
}

std::string modes_supported(const Modes& m) {
  if (m.round_mode == kStochastic)
    return "stochastic rounding has no CUDA kernel (its random bits are a compile-time switch)";
  if (m.scale_mode == kSSearch)
    return "scale mode 'search' has no CUDA kernel (it runs a cast per candidate scale)";
  if (m.round_mode < 0 || m.round_mode > kZero || m.scale_mode < 0 || m.scale_mode > kSEven ||
      m.nan_policy < 0 || m.nan_policy > 1)
    return "unknown modes: round " + std::to_string(m.round_mode) + ", scale " +
           std::to_string(m.scale_mode) + ", nan " + std::to_string(m.nan_policy);
  return "";
}

std::string quantize(const std::string& dtype, const void* x, int x_type, int ndim,
                     const int64_t* shape, int axis, void* values, void* codes, void* scale,
                     void* tenscale, void* meta, void* stream, const Modes* modes) {
  return guarded([&] {
    return quantize_impl(dtype, x, x_type, ndim, shape, axis, values, codes, scale, tenscale,
                         meta, stream, modes ? *modes : Modes{});
  });
}

std::string dequantize(const std::string& dtype, int ndim, const int64_t* shape, int axis,
                       const void* codes, const void* scale, const void* tenscale,
                       const void* meta, void* values, int values_type, void* stream) {
  return guarded([&] {
    return dequantize_impl(dtype, ndim, shape, axis, codes, scale, tenscale, meta, values,
                           values_type, stream);
  });
}

std::string quantize_packed(const std::string& dtype, const void* x, int x_type, int ndim,
                            const int64_t* shape, int axis, void* q, void* scale, void* tenscale,
                            void* meta_packed, void* stream, const Modes* modes) {
  return guarded([&] {
    return quantize_packed_impl(dtype, x, x_type, ndim, shape, axis, q, scale, tenscale,
                                meta_packed, stream, modes ? *modes : Modes{});
  });
}

std::string dequantize_packed(const std::string& dtype, int ndim, const int64_t* shape, int axis,
                              const void* q, const void* scale, const void* tenscale,
                              const void* meta_packed, void* values, int values_type,
                              void* stream) {
  return guarded([&] {
    return dequantize_packed_impl(dtype, ndim, shape, axis, q, scale, tenscale, meta_packed,
                                  values, values_type, stream);
  });
}

std::string pack_bits(const void* codes, int64_t count, int bits, void* packed, void* stream) {
  return guarded([&] { return pack_impl(true, codes, count, bits, packed, stream); });
}

std::string unpack_bits(const void* packed, int64_t count, int bits, void* codes, void* stream) {
  return guarded([&] { return pack_impl(false, packed, count, bits, codes, stream); });
}

}  // namespace cuda
}  // namespace onnxq
