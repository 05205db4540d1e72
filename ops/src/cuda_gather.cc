// GatherMX on the device (cuda_launch.h gather_packed, docs/gpu.md). The rows the indices name
// are copied out of each packed stream of the table (codes, scale codes, shift or meta bits)
// into a compact table, in index order, by the embedded byte-copy kernel
// (onnxq/cast/triton_gather.py), which DequantizeMX's or CodebookLookup's kernels then decode
// straight into Y: a table of those rows tiles as they do in the whole table (tiles along a
// dim after the first), so every element gets DequantizeMX's bits. Rows are bit strings (a row
// of 33 4-bit codes is 132 bits), copied bit-exactly; tables tiled along their rows take the CPU.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_internal.h"
#include "cuda_launch.h"
#include "kernels.h"
#include "number.h"
#include "parse.h"

namespace onnxq {
namespace cuda {
using namespace detail;  // NOLINT(build/namespaces)
namespace {

int gather_kernel() {  // the table is fixed at build time: looked up once
  static const int found = [] {
    for (int k = 0; k < kernel_count(); ++k)
      if (aot_kernel(k).op == kOpGatherRows) return k;
    return -1;
  }();
  return found;
}

// Queues dst row i = src row rows[i] (row_bits bits each, packed one after the other) for n
// rows.
void copy_rows(Device& dv, int kernel, const void* src, CUdeviceptr dst, CUdeviceptr rows,
               int64_t n, int64_t row_bits, CUstream s) {
  if (!row_bits) return;
  Bind b;
  b.ptr[kRoleSrc] = src;
  b.ptr[kRoleDst] = reinterpret_cast<const void*>(dst);
  b.ptr[kRoleRows] = reinterpret_cast<const void*>(rows);
  b.count = n;
  b.row_bits = row_bits;
  launch(dv, kernel, b, s);
}

// Bytes of n rows of `bits` bits, rounded up to 16 (each buffer of the scratch aligned).
size_t aligned(int64_t n, int64_t bits) {
  return static_cast<size_t>(((n * bits + 7) / 8 + 15) / 16 * 16);
}

std::string dims(const std::vector<int64_t>& shape) {  // [2, 3]
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::string gather_layout(const Format& f, const std::string& code,
                          const std::vector<int64_t>& shape, int axis, GatherRow* row) {
  if (kernel_count() == 0) return describe();
  if (gather_kernel() < 0)
    return "this library's GPU kernels predate GatherMX's row copy (rebuild the library)";
  const std::string dtype = "dtype " + quote_code(code);
  const AotFormat* preset = f.codebook() ? nullptr : find_format(code);
  if (f.codebook()) {
    const std::string e = lookup_supported(f);
    if (!e.empty()) return dtype + ": " + e.substr(0, e.find("; run this node on the CPU"));
  } else if (!preset) {
    return dtype + " has no CUDA kernel in this library (" + describe() + ")";
  }
  const int nd = static_cast<int>(shape.size());
  if (nd < 2 || axis == 0 || axis == -nd)
    return "its tiles run along the table's rows (axis 0 of " + dims(shape) +
           "): the GPU gathers rows of whole tiles only";
  std::vector<int64_t> one = shape;  // a table of one row: what each row holds
  one[0] = 1;
  Geometry g;
  const std::string e = make_geometry(f, one, axis < 0 ? axis + nd : axis, &g);
  if (!e.empty()) return e;
  GatherRow r;
  r.preset = preset;
  r.elems = g.size;
  r.q_bits = g.size * f.code_bits();
  r.scale_bits = f.scaled ? g.scale_count() * code_width(f.scale.bits) * 8 : 0;
  r.meta_bits = f.scaled && f.has_meta() ? g.meta_count() * f.meta_bits() : 0;
  if (row) *row = r;
  return "";
}

std::string gather_packed(const Format& f, const std::string& code,
                          const std::vector<int64_t>& shape, int axis, const int64_t* rows,
                          int64_t n, const void* q, const void* scale, const void* tenscale,
                          const void* meta_packed, void* values, int values_type,
                          void* stream) {
  return guarded([&] {
    GatherRow r;
    std::string e = gather_layout(f, code, shape, axis, &r);
    if (!e.empty()) throw Error{e};
    if (n <= 0 || r.elems == 0) return std::string();  // an empty Y
    const int64_t V = shape[0], lim = int64_t(1) << 31;
    if (V >= lim || n >= lim / r.elems || r.q_bits >= lim || r.scale_bits >= lim)
      throw Error{"tables of 2^31 rows and gathers of 2^31 elements or more are not "
                  "supported by the CUDA kernels"};
    std::vector<int32_t> rows32(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (rows[i] < 0 || rows[i] >= V)
        throw Error{"row " + std::to_string(rows[i]) + " is out of range for a table of " +
                    std::to_string(V) + " rows"};
      rows32[static_cast<size_t>(i)] = static_cast<int32_t>(rows[i]);
    }
    const bool meta = r.meta_bits > 0;
    const AotFormat* F = r.preset;  // null for a codebook
    if (!q || !values || (r.scale_bits && !scale) || (meta && !meta_packed) ||
        (F && F->tenscale_bits && !tenscale))
      throw Error{"Q, Scale, Y (and Meta, TenScale where the format has them) are required"};
    if (values_type < 0 || values_type > 2)
      throw Error{"float types are 0 (float32), 1 (float16), 2 (bfloat16)"};
    need_driver();
    const Driver& d = driver();
    if (!d.cuMemcpyHtoDAsync) throw Error{"this CUDA driver has no cuMemcpyHtoDAsync"};
    const int dev = device_of(q, "Q");
    same_device(scale, "Scale", dev);
    same_device(meta ? meta_packed : nullptr, "Meta", dev);
    same_device(values, "Y", dev);
    std::lock_guard<std::recursive_mutex> lock(g_mutex);
    Device& dv = device(dev);
    CtxScope scope(context_of(dv));
    CUstream s = static_cast<CUstream>(stream);
    const size_t idx = aligned(n, 32), qb = aligned(n, r.q_bits), sb = aligned(n, r.scale_bits),
                 mb = aligned(n, r.meta_bits);
    Scratch scratch(idx + qb + sb + mb, s);  // freed on the stream after the decode
    // The rows are copied from pageable memory: the call returns once the driver holds them.
    check(d.cuMemcpyHtoDAsync(scratch.p, rows32.data(), static_cast<size_t>(n) * 4, s),
          "cuMemcpyHtoDAsync");
    const CUdeviceptr cq = scratch.p + idx, cs = cq + qb, cm = cs + sb;
    const int k = gather_kernel();
    copy_rows(dv, k, q, cq, scratch.p, n, r.q_bits, s);
    copy_rows(dv, k, scale, cs, scratch.p, n, r.scale_bits, s);
    if (meta) copy_rows(dv, k, meta_packed, cm, scratch.p, n, r.meta_bits, s);
    std::vector<int64_t> compact = shape;
    compact[0] = n;
    const int nd = static_cast<int>(compact.size());
    const void* pq = reinterpret_cast<const void*>(cq);
    const void* ps = r.scale_bits ? reinterpret_cast<const void*>(cs) : scale;
    const void* pm = meta ? reinterpret_cast<const void*>(cm) : nullptr;
    e = f.codebook() ? lookup_packed(f, nd, compact.data(), axis, pq, ps, pm, values,
                                     values_type, stream)
                     : dequantize_packed(F->code, nd, compact.data(), axis, pq, ps, tenscale, pm,
                                         values, values_type, stream);
    if (!e.empty()) throw Error{e};
    return std::string();
  });
}

std::string gather_reason(const ParsedType& p, const std::vector<int64_t>& shape, int64_t axis,
                          std::string* invalid) {
  const bool codebook = p.fmt.cb_index_bits != 0;
  std::string why = node_reason(p, codebook, false, Modes{}, invalid);
  if (!invalid->empty()) return why;
  Format f;
  std::vector<double> zeros;  // a generic codebook's values come with each Run
  if (p.generic_codebook)
    zeros.assign(size_t(1) << (p.fmt.cb_meta_bits + p.fmt.cb_index_bits), 0.0);
  *invalid = to_format(p, p.generic_codebook ? &zeros : nullptr, &f);
  const int nd = static_cast<int>(shape.size());
  int64_t count = 1;  // as GatherMX checks its shape attribute: no overflow, whatever the dims
  for (int64_t d : shape) {
    if (invalid->empty() && (d < 1 || count > (int64_t(1) << 40) / d))
      *invalid = "the shape " + dims(shape) + " must hold positive dims of a table of at most "
                 "2^40 elements";
    count *= invalid->empty() ? d : 1;
  }
  if (invalid->empty() && (nd < 1 || axis < -nd || axis >= nd))
    *invalid = "axis " + std::to_string(axis) + " is out of range for the table's shape " +
               dims(shape);
  Geometry g;
  const int a = static_cast<int>(axis < 0 ? axis + nd : axis);
  if (invalid->empty()) *invalid = make_geometry(f, shape, a, &g);
  if (invalid->empty() && f.sparse_m)
    *invalid = "N:M sparsity: GatherMX does not decode it (Q leaves the pruned codes out)";
  if (!invalid->empty()) return "dtype " + quote_code(p.code) + ": " + *invalid;
  if (!why.empty()) return why;
  return gather_layout(f, p.code, shape, a, nullptr);
}

}  // namespace cuda
}  // namespace onnxq
