// The C ABI entry points onnxq_cuda_* (onnxq_ops.h) over the CUDA path of cuda_launch.h: null
// and mode checks, then the launcher's message as a status. No exception crosses the ABI.
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "c_error.h"
#include "cuda_launch.h"
#include "kernels.h"
#include "onnxq_ops.h"
#include "parse.h"

namespace {
int32_t status(char* err, size_t errlen, const char* op, const std::string& msg) {
  if (msg.empty()) {
    if (err && errlen) err[0] = '\0';
    return 0;
  }
  onnxq::write_error(err, errlen, std::string(op) + msg);
  return 1;
}

// The C ABI's modes (null: the defaults).
onnxq::Modes to_modes(const onnxq_modes* m) {
  onnxq::Modes modes;
  if (m) {
    modes.round_mode = m->round_mode;
    modes.scale_mode = m->scale_mode;
    modes.nan_policy = m->nan_policy;
    modes.full_int_range = m->full_int_range != 0;
    modes.seed = m->seed;
  }
  return modes;
}

// ... checked: `why` says what the CUDA kernels cannot do.
onnxq::Modes modes_of(const onnxq_modes* m, std::string* why) {
  const onnxq::Modes modes = to_modes(m);
  *why = onnxq::cuda::modes_supported(modes);
  if (!why->empty()) *why += "; use the Triton or CPU engines for it";
  return modes;
}
}  // namespace

extern "C" {

int32_t onnxq_cuda_available(char* err, size_t errlen) {
  std::string why;
  bool ok = false;
  try {
    ok = onnxq::cuda::available(&why);
  } catch (...) {
    why = "unknown error";
  }
  status(err, errlen, "[onnxq_cuda_available] ", ok ? "" : why);
  return ok ? 1 : 0;
}

int32_t onnxq_cuda_info(char* out, size_t outlen) {
  std::string text;
  try {
    text = onnxq::cuda::describe();
  } catch (...) {
    text = "unknown error";
  }
  if (out && outlen) {
    size_t n = text.size() < outlen - 1 ? text.size() : outlen - 1;
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return onnxq::cuda::kernel_count();
}

int32_t onnxq_cuda_node_support(const char* op_type, const char* dtype,
                                const onnxq_modes* modes, char* err, size_t errlen) {
  return onnxq_cuda_node_support_shape(op_type, dtype, modes, -1, nullptr, 0, err, errlen);
}

int32_t onnxq_cuda_node_support_shape(const char* op_type, const char* dtype,
                                      const onnxq_modes* modes, int32_t ndim,
                                      const int64_t* shape, int32_t axis, char* err,
                                      size_t errlen) {
  const char* op = "[onnxq_cuda_node_support] ";
  if (!op_type || !dtype) return status(err, errlen, op, "op_type and dtype are required");
  const std::string type = op_type;
  if (type == "MatMulMX") {
    status(err, errlen, op, type + " has no CUDA kernel: onnxruntime runs it on the CPU provider");
    return 1;
  }
  const bool gather = type == "GatherMX", lookup = type == "CodebookLookup";
  const bool quantizes = type == "QuantizeMX" || type == "QuantizeDequantizeMX";
  if (!gather && !lookup && !quantizes && type != "DequantizeMX") {
    status(err, errlen, op, "unknown op type " + onnxq::quote_code(type));
    return 2;
  }
  if (gather && (ndim < 1 || ndim > 64 || !shape)) {
    status(err, errlen, op,
           "GatherMX needs its table's shape (the node's shape attribute) and axis; "
           "onnxq_cuda_node_support_shape takes them");
    return 2;
  }
  try {
    onnxq::ParsedType parsed;
    std::string bad = onnxq::parse_dtype(dtype, &parsed);
    if (!bad.empty()) {
      status(err, errlen, op, bad);
      return 2;
    }
    std::string invalid;
    const std::string why =
        gather ? onnxq::cuda::gather_reason(parsed, std::vector<int64_t>(shape, shape + ndim),
                                            axis, &invalid)
               : onnxq::cuda::node_reason(parsed, lookup, quantizes, to_modes(modes), &invalid);
    if (!status(err, errlen, op, why)) return 0;  // on the kernels
    return invalid.empty() ? 1 : 2;
  } catch (const std::exception& e) {
    status(err, errlen, op, e.what());
  } catch (...) {
    status(err, errlen, op, "unknown error");
  }
  return 2;
}

int32_t onnxq_cuda_quantize(const char* dtype, const onnxq_modes* modes, const void* x,
                            int32_t x_type, int32_t ndim, const int64_t* shape, int32_t axis,
                            void* values, void* codes, void* scale, void* tenscale, uint8_t* meta,
                            void* stream, char* err, size_t errlen) {
  const char* op = "[onnxq_cuda_quantize] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  std::string why;
  const onnxq::Modes m = modes_of(modes, &why);
  if (!why.empty()) return status(err, errlen, op, why);
  return status(err, errlen, op,
                onnxq::cuda::quantize(dtype, x, x_type, ndim, shape, axis, values, codes, scale,
                                      tenscale, meta, stream, &m));
}

int32_t onnxq_cuda_dequantize(const char* dtype, int32_t ndim, const int64_t* shape, int32_t axis,
                              const void* codes, const void* scale, const void* tenscale,
                              const uint8_t* meta, void* values, int32_t values_type,
                              void* stream, char* err, size_t errlen) {
  const char* op = "[onnxq_cuda_dequantize] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  return status(err, errlen, op,
                onnxq::cuda::dequantize(dtype, ndim, shape, axis, codes, scale, tenscale, meta,
                                        values, values_type, stream));
}

int32_t onnxq_cuda_quantize_packed(const char* dtype, const onnxq_modes* modes, const void* x,
                                   int32_t x_type, int32_t ndim, const int64_t* shape,
                                   int32_t axis, void* q, void* scale, void* tenscale,
                                   uint8_t* meta_packed, void* stream, char* err, size_t errlen) {
  const char* op = "[onnxq_cuda_quantize_packed] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  std::string why;
  const onnxq::Modes m = modes_of(modes, &why);
  if (!why.empty()) return status(err, errlen, op, why);
  return status(err, errlen, op,
                onnxq::cuda::quantize_packed(dtype, x, x_type, ndim, shape, axis, q, scale,
                                             tenscale, meta_packed, stream, &m));
}

int32_t onnxq_cuda_dequantize_packed(const char* dtype, int32_t ndim, const int64_t* shape,
                                     int32_t axis, const uint8_t* q, const void* scale,
                                     const void* tenscale, const uint8_t* meta_packed,
                                     void* values, int32_t values_type, void* stream, char* err,
                                     size_t errlen) {
  const char* op = "[onnxq_cuda_dequantize_packed] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  return status(err, errlen, op,
                onnxq::cuda::dequantize_packed(dtype, ndim, shape, axis, q, scale, tenscale,
                                               meta_packed, values, values_type, stream));
}

int32_t onnxq_cuda_lookup_packed(const char* dtype, const double* table, int32_t ndim,
                                 const int64_t* shape, int32_t axis, const uint8_t* q,
                                 const void* scale, const uint8_t* meta_packed, void* values,
                                 int32_t values_type, void* stream, char* err, size_t errlen) {
  const char* op = "[onnxq_cuda_lookup_packed] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  try {
    onnxq::ParsedType parsed;
    std::string e = onnxq::parse_dtype(dtype, &parsed);
    if (!e.empty()) return status(err, errlen, op, "dtype " + onnxq::quote_code(dtype) + ": " + e);
    if (!parsed.fmt.cb_index_bits)
      return status(err, errlen, op, "dtype " + onnxq::quote_code(dtype) + " is not a codebook");
    std::vector<double> values_of_table;
    if (table) {
      const size_t n = size_t(1) << (parsed.fmt.cb_meta_bits + parsed.fmt.cb_index_bits);
      values_of_table.assign(table, table + n);
    }
    onnxq::Format f;
    e = onnxq::to_format(parsed, table ? &values_of_table : nullptr, &f);
    if (!e.empty()) return status(err, errlen, op, "dtype " + onnxq::quote_code(dtype) + ": " + e);
    return status(err, errlen, op,
                  onnxq::cuda::lookup_packed(f, ndim, shape, axis, q, scale, meta_packed, values,
                                             values_type, stream));
  } catch (const std::exception& ex) {
    return status(err, errlen, op, ex.what());
  } catch (...) {
    return status(err, errlen, op, "unknown error");
  }
}

int32_t onnxq_cuda_gather_packed(const char* dtype, const double* table, int32_t ndim,
                                 const int64_t* shape, int32_t axis, const int64_t* rows,
                                 int64_t nrows, const uint8_t* q, const void* scale,
                                 const void* tenscale, const uint8_t* meta_packed, void* values,
                                 int32_t values_type, void* stream, char* err, size_t errlen) {
  const char* op = "[onnxq_cuda_gather_packed] ";
  if (!dtype) return status(err, errlen, op, "dtype is null");
  if (ndim < 1 || ndim > 64 || !shape) return status(err, errlen, op, "the table needs a shape");
  if (nrows < 0 || (nrows && !rows)) return status(err, errlen, op, "rows is null or negative");
  try {
    onnxq::ParsedType parsed;
    std::string e = onnxq::parse_dtype(dtype, &parsed);
    if (!e.empty()) return status(err, errlen, op, "dtype " + onnxq::quote_code(dtype) + ": " + e);
    std::vector<double> values_of_table;
    if (table && parsed.fmt.cb_index_bits) {
      const size_t n = size_t(1) << (parsed.fmt.cb_meta_bits + parsed.fmt.cb_index_bits);
      values_of_table.assign(table, table + n);
    }
    const std::vector<int64_t> dims(shape, shape + ndim);
    std::string invalid;
    const std::string why = onnxq::cuda::gather_reason(parsed, dims, axis, &invalid);
    if (!why.empty()) return status(err, errlen, op, why);  // checks the shape and axis
    onnxq::Format f;
    e = onnxq::to_format(parsed, values_of_table.empty() ? nullptr : &values_of_table, &f);
    if (!e.empty()) return status(err, errlen, op, "dtype " + onnxq::quote_code(dtype) + ": " + e);
    return status(err, errlen, op,
                  onnxq::cuda::gather_packed(f, parsed.code, dims, axis < 0 ? axis + ndim : axis,
                                             rows, nrows, q, scale, tenscale, meta_packed,
                                             values, values_type, stream));
  } catch (const std::exception& ex) {
    return status(err, errlen, op, ex.what());
  } catch (...) {
    return status(err, errlen, op, "unknown error");
  }
}

}  // extern "C"
