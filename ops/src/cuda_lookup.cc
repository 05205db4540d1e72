// CodebookLookup on the device (cuda_launch.h lookup_packed, docs/gpu.md). The embedded images
// of `_cb_dequant_kernel` (onnxq/cast/triton_codebook_kernels.py) serve every codebook data
// type: each is compiled for a block of NSUB x SUB elements a tile, and the launcher passes the
// format's numbers (scale bias and codes, index bits, mappings) and the geometry at run time,
// uploads the float64 table on the stream and unpacks the packed indices and meta first.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_internal.h"
#include "cuda_launch.h"
#include "kernels.h"
#include "parse.h"

namespace onnxq {
namespace cuda {
using namespace detail;  // NOLINT(build/namespaces)
namespace {

constexpr int64_t kMaxTile = 1024;  // onnxq/cast/aot_spec.py CB_MAX_TILE

const char* const kUseCpu = "; run this node on the CPU (CPUExecutionProvider or onnxq.upcast)";

// The block kernel for tiles of `tc` elements (subtiles of `sub`, 0: none) with output
// `values_type`: of the blocks that hold the tile, the one of fewest lanes (aot_spec.cb_block
// chooses the same); -1 when none does. *chunks: a long tile's chunks (1 otherwise). `inner`:
// elements follow the tiled axis (the LAST=False compile of the same block).
int find_block(int64_t tc, int64_t sub, int values_type, int64_t* chunks, bool inner = false) {
  const int last_op = tc > kMaxTile ? kOpCbLong : sub ? kOpCbSub : kOpCbPlain;
  const int op = !inner             ? last_op
                 : last_op == kOpCbLong ? kOpCbLongInner
                 : last_op == kOpCbSub  ? kOpCbSubInner
                                        : kOpCbPlainInner;
  if (last_op == kOpCbLong && sub) return -1;
  const int64_t nsub = sub ? tc / sub : 1;
  int best = -1;
  int64_t best_lanes = 0;
  for (int k = 0; k < kernel_count(); ++k) {
    const AotKernel& K = aot_kernel(k);
    if (K.op != op || K.io_type != values_type || K.nsub_block < 1 || K.sub_block < 1) continue;
    const int64_t lanes = int64_t(K.nsub_block) * K.sub_block;
    const bool holds =
        last_op == kOpCbLong || (K.nsub_block >= nsub && K.sub_block >= (sub ? sub : tc));
    if (holds && (best < 0 || lanes < best_lanes)) {
      best = k;
      best_lanes = lanes;
    }
  }
  *chunks = last_op == kOpCbLong && best >= 0 ? (tc + best_lanes - 1) / best_lanes : 1;
  return best;
}

// What the format allows, whatever the shape; throws Error naming what is not supported.
void check_format(const Format& f) {
  if (kernel_count() == 0) throw Error{kNoKernels};
  if (!f.codebook()) throw Error{"the data type is not a codebook (DequantizeMX decodes it)"};
  if (!f.scaled || f.scale.kind != kExponent)
    throw Error{"codebooks need an exponent scale"};
  if (f.ntiles != 1)
    throw Error{std::string("the CUDA kernels decode codebooks with tiles along one axis only, "
                            "not ") +
                (f.ntiles == 0 ? "a scale over the whole tensor" : "2-D tiles") + kUseCpu};
  if (f.sparse_m) throw Error{std::string("N:M sparsity has no CUDA kernel") + kUseCpu};
  if (f.has_zero || f.has_ts)
    throw Error{std::string("zero points and tensor scales have no CUDA kernel") + kUseCpu};
  if (f.scale.bits > 8)
    throw Error{"scale codes of " + std::to_string(f.scale.bits) +
                " bits have no CUDA kernel (exponent scales of up to 8 bits, e8m0 and narrower)" +
                kUseCpu};
  const size_t entries = size_t(1) << (f.cb_mb + f.cb_ib);
  if (f.cb_ib < 2 || f.cb_ib > 8 || f.cb_mb < 0 || f.cb_mb > 4 || f.table.size() != entries)
    throw Error{"a codebook of " + std::to_string(f.cb_ib) + " index and " +
                std::to_string(f.cb_mb) + " meta bits needs a table of " +
                std::to_string(entries) + " values"};
  int64_t chunks = 0;
  const int64_t tile = f.tile[0], sub = f.sub[1];
  if (tile > 0 && find_block(tile, sub, 0, &chunks) < 0)
    throw Error{"no CUDA kernel decodes tiles of " + std::to_string(tile) + " elements" +
                (sub ? " with subtiles of " + std::to_string(sub) : std::string()) +
                " (the library's blocks hold tiles of up to 1024 elements, subtiles of up to "
                "32 in tiles of up to 1024, longer tiles without subtiles)" +
                kUseCpu};
}

struct Plan {
  int kernel = -1;
  Bind b;
  int64_t numel = 0, nmeta = 0;
};

// The kernel and its arguments for `shape` (aot_spec.cb_geometry computes the same).
Plan plan(const Format& f, int ndim, const int64_t* shape, int axis, int values_type) {
  check_format(f);
  if (values_type < 0 || values_type > 2)
    throw Error{"float types are 0 (float32), 1 (float16), 2 (bfloat16)"};
  const Extent ext = extent(ndim, shape, axis);
  Plan p;
  p.numel = ext.numel;
  if (p.numel == 0) return p;
  // rows: the tile instances' other coordinates, (elements before) x (elements after the axis)
  const int64_t C = shape[ext.axis], rows = p.numel / C, sub = f.sub[1], inner = ext.inner;
  int64_t tc = f.tile[0] ? f.tile[0] : C;
  if (tc > kMaxTile && C < tc) {  // one long tile, mostly padding: as long as the axis
    const int64_t step = sub ? sub : 1;
    tc = (C + step - 1) / step * step;
  }
  if (sub && tc % sub != 0)
    throw Error{"subtiles of " + std::to_string(sub) + " must divide the tile (the axis of " +
                std::to_string(C) + ")"};
  Bind& b = p.b;
  p.kernel = find_block(tc, sub, values_type, &b.n_chunks, inner > 1);
  if (p.kernel < 0)
    throw Error{"no CUDA kernel decodes tiles of " + std::to_string(tc) + " elements" +
                (sub ? " with subtiles of " + std::to_string(sub) : std::string()) + kUseCpu};
  b.C = C;
  b.TC = tc;
  b.inner = inner;
  b.nC = (C + tc - 1) / tc;
  b.n_units = rows * b.nC;
  b.nsub = sub ? tc / sub : 1;
  b.sub = sub ? sub : tc;
  b.sub_cols = sub ? (C + sub - 1) / sub : 1;
  b.s_bias = f.scale.bias;
  b.s_nan = (int64_t(1) << f.scale.ebits) - 1;
  b.s_mask = (int64_t(1) << f.scale.bits) - 1;
  b.ib = f.cb_ib;
  b.nmap = int64_t(1) << f.cb_mb;
  p.nmeta = sub ? rows * b.sub_cols : b.n_units;
  return p;
}

std::string lookup_impl(const Format& f, int ndim, const int64_t* shape, int axis, const void* q,
                        const void* scale, const void* meta_packed, void* values,
                        int values_type, void* stream) {
  Plan p = plan(f, ndim, shape, axis, values_type);
  if (p.numel == 0) return "";
  if (!q || !scale || !values) throw Error{"Q, Scale and Y are required"};
  if (f.cb_mb && !meta_packed) throw Error{"the Meta input is required (the format has meta bits)"};
  need_driver();
  const Driver& d = driver();
  if (!d.cuMemcpyHtoDAsync) throw Error{"this CUDA driver has no cuMemcpyHtoDAsync"};
  const int dev = device_of(q, "Q");
  same_device(scale, "Scale", dev);
  same_device(f.cb_mb ? meta_packed : nullptr, "Meta", dev);
  same_device(values, "Y", dev);
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  Device& dv = device(dev);
  CtxScope scope(context_of(dv));
  CUstream s = static_cast<CUstream>(stream);
  const size_t table_bytes = f.table.size() * sizeof(double);
  const int64_t ncodes = f.cb_ib < 8 ? p.numel : 0, nmeta = f.cb_mb ? p.nmeta : 0;
  Scratch scratch(table_bytes + static_cast<size_t>(ncodes + nmeta) + 16, s);
  // The table is copied from pageable memory: the call returns once the driver holds it.
  check(d.cuMemcpyHtoDAsync(scratch.p, f.table.data(), table_bytes, s), "cuMemcpyHtoDAsync");
  const CUdeviceptr codes = scratch.p + table_bytes, meta = codes + ncodes;
  Bind& b = p.b;
  b.ptr[kRoleTable] = reinterpret_cast<const void*>(scratch.p);
  b.ptr[kRoleCodes] = q;
  if (ncodes) {
    pack_impl(false, q, ncodes, f.cb_ib, reinterpret_cast<void*>(codes), stream);
    b.ptr[kRoleCodes] = reinterpret_cast<const void*>(codes);
  }
  // Without meta bits every mapping index is 0: the kernel masks what it reads with
  // nmap - 1 = 0, from a buffer that holds at least one byte per unit (the codes).
  b.ptr[kRoleMeta] = b.ptr[kRoleCodes];
  if (nmeta) {
    pack_impl(false, meta_packed, nmeta, f.cb_mb, reinterpret_cast<void*>(meta), stream);
    b.ptr[kRoleMeta] = reinterpret_cast<const void*>(meta);
  }
  b.ptr[kRoleScale] = scale;
  b.ptr[kRoleY] = values;
  launch(dv, p.kernel, b, s);
  return "";
}

}  // namespace

std::string lookup_supported(const Format& f) {
  return guarded([&] {
    check_format(f);
    return std::string();
  });
}

std::string node_reason(const ParsedType& p, bool lookup, bool quantizes, const Modes& m,
                        std::string* invalid) {
  invalid->clear();
  if (kernel_count() == 0) return describe();
  const std::string dtype = "dtype " + quote_code(p.code);
  if (!lookup) {
    if (!find_format(p.code))
      return dtype + " has no CUDA kernel in this library (" + describe() + ")";
    return quantizes ? modes_supported(m) : "";
  }
  if (p.fmt.cb_index_bits == 0) *invalid = "the data type is not a codebook";
  if (!invalid->empty()) return dtype + ": " + *invalid + " (DequantizeMX decodes it)";
  Format f;
  std::vector<double> zeros;
  if (p.generic_codebook)
    zeros.assign(size_t(1) << (p.fmt.cb_meta_bits + p.fmt.cb_index_bits), 0.0);
  *invalid = to_format(p, p.generic_codebook ? &zeros : nullptr, &f);
  if (!invalid->empty()) return dtype + ": " + *invalid;
  const std::string e = lookup_supported(f);
  return e.empty() ? "" : dtype + ": " + e.substr(0, e.find(kUseCpu));
}

std::string lookup_packed(const Format& f, int ndim, const int64_t* shape, int axis,
                          const void* q, const void* scale, const void* meta_packed,
                          void* values, int values_type, void* stream) {
  return guarded([&] {
    return lookup_impl(f, ndim, shape, axis, q, scale, meta_packed, values, values_type, stream);
  });
}

}  // namespace cuda
}  // namespace onnxq
