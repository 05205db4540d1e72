// The plain C ABI of onnxq_ops.h: argument checks, then the shared kernels. No exception
// crosses it: every entry point catches and returns a status with a message.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "c_error.h"
#include "kernels.h"
#include "onnxq_ops.h"
#include "parse.h"

namespace {

std::string shape_str(int32_t ndim, const int64_t* shape) {
  std::string s = "(";
  for (int32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (ndim == 1 ? ",)" : ")");
}

bool valid_float_type(int32_t t) { return t >= 0 && t <= 2; }

}  // namespace

extern "C" {

int32_t onnxq_abi_version(void) { return ONNXQ_ABI_VERSION; }

int32_t onnxq_number_info(const onnxq_number* n, double* out, char* err, size_t errlen) {
  try {
    if (!n || !out) return onnxq::write_error(err, errlen, "[onnxq_number_info] null argument");
    onnxq::Num num;
    num.kind = n->kind;
    num.ebits = n->ebits;
    num.mbits = n->mbits;
    num.bias = n->bias;
    num.infnan = n->infnan;
    std::string e = num.derive();
    if (!e.empty()) return onnxq::write_error(err, errlen, "[onnxq_number_info] " + e);
    out[0] = num.bits;
    out[1] = num.maxfloat;
    out[2] = num.emax;
    out[3] = num.emin;
    out[4] = num.midmax;
    out[5] = num.f32_max;
    return 0;
  } catch (const std::exception& ex) {
    return onnxq::write_error(err, errlen, std::string("[onnxq_number_info] ") + ex.what());
  } catch (...) {
    return onnxq::write_error(err, errlen, "[onnxq_number_info] unknown error");
  }
}

int32_t onnxq_parse_dtype(const char* text, size_t len, onnxq_format* out, char* err,
                          size_t errlen) {
  try {
    if ((!text && len) || !out)
      return onnxq::write_error(err, errlen, "[onnxq_parse_dtype] null argument");
    onnxq::ParsedType parsed;
    std::string e = onnxq::parse_dtype(std::string(text ? text : "", len), &parsed);
    if (!e.empty()) return onnxq::write_error(err, errlen, e);
    *out = parsed.fmt;
    out->cb_mags = nullptr;
    out->cb_even = nullptr;
    out->cb_table = nullptr;
    return 0;
  } catch (const std::exception& ex) {
    return onnxq::write_error(err, errlen, std::string("[onnxq_parse_dtype] ") + ex.what());
  } catch (...) {
    return onnxq::write_error(err, errlen, "[onnxq_parse_dtype] unknown error");
  }
}

int32_t onnxq_quantize(const onnxq_format* f, const onnxq_modes* m, const void* x, int32_t x_type,
                       int32_t ndim, const int64_t* shape, int32_t axis, void* values,
                       int32_t values_type, void* codes, void* scale, void* zero, void* tenscale,
                       uint8_t* meta, uint8_t* mask, int32_t nthreads, char* err, size_t errlen) {
  const char* op = "[onnxq_quantize] ";
  try {
    if (!f || !m || !x || !shape || ndim < 1)
      return onnxq::write_error(err, errlen, std::string(op) + "null argument or 0-D input");
    if (!valid_float_type(x_type) || (values && !valid_float_type(values_type)))
      return onnxq::write_error(err, errlen, std::string(op) + "float types are 0 (float32), 1, 2");
    onnxq::Format fmt;
    std::string e = onnxq::make_format(*f, &fmt);
    if (!e.empty()) return onnxq::write_error(err, errlen, op + e);
    onnxq::Modes modes;
    modes.round_mode = m->round_mode;
    modes.scale_mode = m->scale_mode;
    modes.nan_policy = m->nan_policy;
    modes.full_int_range = m->full_int_range != 0;
    modes.seed = m->seed;
    if (modes.round_mode < 0 || modes.round_mode > 3 || modes.scale_mode < 0 ||
        modes.scale_mode > 7 || modes.nan_policy < 0 || modes.nan_policy > 1)
      return onnxq::write_error(err, errlen, std::string(op) + "bad round/scale mode or nan policy");
    std::vector<int64_t> dims(shape, shape + ndim);
    onnxq::QuantizeIO io;
    io.x = x;
    io.x_type = x_type;
    io.values = values;
    io.values_type = values_type;
    io.codes = codes;
    io.scale = scale;
    io.zero = zero;
    io.tenscale = tenscale;
    io.meta = meta;
    io.mask = mask;
    e = onnxq::quantize(fmt, modes, dims, axis, io, onnxq::default_parallel_for(nthreads));
    if (!e.empty()) return onnxq::write_error(err, errlen, op + e + " (input shape " + shape_str(ndim, shape) + ")");
    return 0;
  } catch (const std::exception& ex) {
    return onnxq::write_error(err, errlen, std::string(op) + ex.what());
  } catch (...) {
    return onnxq::write_error(err, errlen, std::string(op) + "unknown error");
  }
}

int32_t onnxq_dequantize(const onnxq_format* f, int32_t ndim, const int64_t* shape, int32_t axis,
                         const void* codes, const void* scale, const void* zero,
                         const void* tenscale, const uint8_t* meta, const uint8_t* mask,
                         void* values, int32_t values_type, int32_t nthreads, char* err,
                         size_t errlen) {
  const char* op = "[onnxq_dequantize] ";
  try {
    if (!f || !codes || !values || !shape || ndim < 1)
      return onnxq::write_error(err, errlen, std::string(op) + "null argument or 0-D shape");
    if (!valid_float_type(values_type))
      return onnxq::write_error(err, errlen, std::string(op) + "float types are 0 (float32), 1, 2");
    onnxq::Format fmt;
    std::string e = onnxq::make_format(*f, &fmt);
    if (!e.empty()) return onnxq::write_error(err, errlen, op + e);
    std::vector<int64_t> dims(shape, shape + ndim);
    onnxq::DequantizeIO io;
    io.codes = codes;
    io.scale = scale;
    io.zero = zero;
    io.tenscale = tenscale;
    io.meta = meta;
    io.mask = mask;
    io.values = values;
    io.values_type = values_type;
    e = onnxq::dequantize(fmt, dims, axis, io, onnxq::default_parallel_for(nthreads));
    if (!e.empty()) return onnxq::write_error(err, errlen, op + e + " (shape " + shape_str(ndim, shape) + ")");
    return 0;
  } catch (const std::exception& ex) {
    return onnxq::write_error(err, errlen, std::string(op) + ex.what());
  } catch (...) {
    return onnxq::write_error(err, errlen, std::string(op) + "unknown error");
  }
}

int32_t onnxq_pack_bits(const void* codes, int32_t width, int64_t count, int32_t bits,
                        const uint8_t* mask, uint8_t* out, int64_t* packed_count, char* err,
                        size_t errlen) {
  if (!codes || !out || bits < 1 || bits > 64 || count < 0 ||
      (width != 1 && width != 2 && width != 4 && width != 8))
    return onnxq::write_error(err, errlen, "[onnxq_pack_bits] bad arguments");
  onnxq::ParallelFor pf = onnxq::default_parallel_for(0);
  int64_t k = onnxq::pack_bits(codes, width, count, bits, mask, out, &pf);
  if (packed_count) *packed_count = k;
  return 0;
}

int32_t onnxq_unpack_bits(const uint8_t* stream, int64_t stream_bytes, int32_t bits,
                          int64_t count, const uint8_t* mask, void* codes, int32_t width,
                          char* err, size_t errlen) {
  if (!stream || !codes || bits < 1 || bits > 64 || count < 0 ||
      (width != 1 && width != 2 && width != 4 && width != 8))
    return onnxq::write_error(err, errlen, "[onnxq_unpack_bits] bad arguments");
  int64_t kept = count;
  if (mask) {
    kept = 0;
    for (int64_t i = 0; i < count; ++i) kept += mask[i] ? 1 : 0;
  }
  int64_t need = onnxq::packed_nbytes(kept, bits);
  if (stream_bytes < need)
    return onnxq::write_error(err, errlen, "[onnxq_unpack_bits] packed stream has " +
                                 std::to_string(stream_bytes) + " bytes; " +
                                 std::to_string(kept) + " codes of " + std::to_string(bits) +
                                 " bits need " + std::to_string(need));
  onnxq::ParallelFor pf = onnxq::default_parallel_for(0);
  onnxq::unpack_bits(stream, bits, count, mask, codes, width, &pf);
  return 0;
}

}  // extern "C"
