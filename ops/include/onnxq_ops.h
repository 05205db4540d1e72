/* onnxq native kernels: the plain C ABI that onnxq/cast/native.py calls with ctypes.
 *
 * Formats arrive as numbers derived in Python from a DataType (onnxq_format), never as strings.
 * Every function returns 0 on success, or a non-zero status with a NUL-terminated message in
 * `err` (at most `errlen` bytes). No C++ exception crosses this ABI.
 *
 * Layouts are those of onnxq/cast/api.py: codes in the input's shape, scales / zero points in
 * tile-grid layout, meta in subtile-grid (or tile-grid) layout, mask as one byte per element.
 * Code arrays use the smallest unsigned width that holds the format's bits (1, 2, 4 or 8 bytes).
 */
#ifndef ONNXQ_OPS_H_
#define ONNXQ_OPS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ONNXQ_ABI_VERSION 2

#if defined(__GNUC__)
#define ONNXQ_API __attribute__((visibility("default")))
#else
#define ONNXQ_API
#endif

/* kind: 0 float, 1 int, 2 uint, 3 exponent. infnan: 0 none, 1 ieee, 2 fn, 3 fnuz, 4 inuz. */
typedef struct onnxq_number {
  int32_t kind;
  int32_t ebits;
  int32_t mbits;
  int32_t bias;
  int32_t infnan;
} onnxq_number;

typedef struct onnxq_format {
  onnxq_number elem;      /* the element; for codebooks the compute type */
  int32_t scaled;         /* 0: an unscaled cast */
  onnxq_number scale;
  int32_t has_zero;
  onnxq_number zero;
  int32_t has_tenscale;
  onnxq_number tenscale;
  int32_t ntiles;         /* 0 (one scale for the tensor), 1 or 2 */
  int32_t tile[2];        /* tile sizes, 0 = the whole axis (channel) */
  int32_t sub[2];         /* subtile (rows, cols) as ScaleSpec.subtile; 0 = none */
  int32_t sparse_n;
  int32_t sparse_m;       /* 0 = no N:M sparsity */
  int32_t sparse_dim;     /* tile index of the sparse dimension */
  int32_t cb_index_bits;  /* 0 = not a codebook */
  int32_t cb_meta_bits;
  const double* cb_mags;  /* [2^meta_bits][2^(index_bits-1)] magnitudes, 0 first, ascending */
  const uint8_t* cb_even; /* same shape: 1 where the magnitude's compute code is even */
  const double* cb_table; /* [2^meta_bits][2^index_bits] values by index code */
} onnxq_format;

/* round_mode: 0 even, 1 away, 2 zero, 3 stochastic.
 * scale_mode: 0 floor, 1 ceil, 2 midmax, 3 option3, 4 topbinade, 5 rceil, 6 even.
 * nan_policy: 0 element, 1 block. */
typedef struct onnxq_modes {
  int32_t round_mode;
  int32_t scale_mode;
  int32_t nan_policy;
  int32_t full_int_range;
  uint64_t seed;
} onnxq_modes;

/* Float buffer types: 0 float32, 1 float16, 2 bfloat16. */
ONNXQ_API int32_t onnxq_abi_version(void);

/* Derived properties of a number spec (for tests that compare them with Python):
 * out[0] bits, out[1] maxfloat, out[2] emax, out[3] emin, out[4] midmax, out[5] the largest
 * value that float32 holds (where float scales and zero points saturate). */
ONNXQ_API int32_t onnxq_number_info(const onnxq_number* n, double* out, char* err, size_t errlen);

/* Parse a data type code or built-in preset name (`len` bytes of `text`; a NUL inside is a
 * character, and refused) as the onnxruntime ops read their `dtype` attribute. On success
 * fills *out; its codebook pointers are NULL (the tables stay inside the library). */
ONNXQ_API int32_t onnxq_parse_dtype(const char* text, size_t len, onnxq_format* out, char* err,
                                    size_t errlen);

/* Quantize x (float type x_type, shape[ndim]) along axis. Any output may be NULL:
 * values (type values_type, x's shape), codes, scale, zero, tenscale, meta (uint8), mask
 * (uint8, x's shape; only for N:M sparsity). nthreads <= 0 uses every core. */
ONNXQ_API int32_t onnxq_quantize(const onnxq_format* f, const onnxq_modes* m, const void* x, int32_t x_type,
                       int32_t ndim, const int64_t* shape, int32_t axis, void* values,
                       int32_t values_type, void* codes, void* scale, void* zero, void* tenscale,
                       uint8_t* meta, uint8_t* mask, int32_t nthreads, char* err, size_t errlen);

/* Decode unpacked codes (x's shape; pruned positions hold any code and read as 0 when mask is
 * given) to float values of type values_type. */
ONNXQ_API int32_t onnxq_dequantize(const onnxq_format* f, int32_t ndim, const int64_t* shape, int32_t axis,
                         const void* codes, const void* scale, const void* zero,
                         const void* tenscale, const uint8_t* meta, const uint8_t* mask,
                         void* values, int32_t values_type, int32_t nthreads, char* err,
                         size_t errlen);

/* Bit packing of packing.py: codes (width bytes each) -> LSB-first stream of `bits` per code.
 * If mask is given, only codes whose mask byte is non-zero are packed. Returns the number of
 * codes packed in *packed_count. out holds ceil(packed codes * bits / 8) bytes; no more are
 * written. */
ONNXQ_API int32_t onnxq_pack_bits(const void* codes, int32_t width, int64_t count, int32_t bits,
                        const uint8_t* mask, uint8_t* out, int64_t* packed_count, char* err,
                        size_t errlen);

/* Inverse of onnxq_pack_bits: `count` positions; with a mask, kept positions take the next
 * code of the stream and the others 0. stream_bytes guards against a truncated stream. */
ONNXQ_API int32_t onnxq_unpack_bits(const uint8_t* stream, int64_t stream_bytes, int32_t bits,
                          int64_t count, const uint8_t* mask, void* codes, int32_t width,
                          char* err, size_t errlen);

/* -- The CUDA path (docs/gpu.md) ------------------------------------------------------------
 * The Triton kernels of onnxq/cast/triton.py, compiled ahead of time when the library was built
 * (onnxq/cast/aot.py: cubin for sm_80 and sm_90, PTX for newer GPUs) and launched through the
 * CUDA driver, which is loaded with dlopen at the first call: the library loads and its CPU
 * functions work on machines without CUDA. Formats are named by preset or data type code
 * (the embedded ones: onnxq_cuda_info); tiles run along any axis (the fast kernels take the
 * last); every mode but stochastic rounding and scale search (the fast kernels take the
 * defaults, the general ones the rest).
 * Every pointer is CUDA device memory on one device (host memory is refused); work is queued on
 * `stream` (a CUstream; NULL is the legacy default stream) and not waited for, so a kernel fault
 * shows at the caller's next synchronisation. Layouts are those of onnxq_quantize with one byte
 * per code, scale and meta bit; tenscale is the float32 code (uint32 [1]). */

/* 1 when the CUDA path can run here, else 0 with the reason in err (no driver, no device, a
 * library built without GPU kernels). */
ONNXQ_API int32_t onnxq_cuda_available(char* err, size_t errlen);

/* Number of embedded kernels (0: built without them); a description (or why none) in out. */
ONNXQ_API int32_t onnxq_cuda_info(char* out, size_t outlen);

/* Where onnxruntime's CUDA execution provider runs a node of op_type (QuantizeMX,
 * DequantizeMX, QuantizeDequantizeMX, CodebookLookup, MatMulMX, GatherMX) with the `dtype`
 * attribute and modes (NULL: the defaults), decided as at session creation, with no driver or
 * GPU: 0 on the embedded kernels; 1 on the CPU (the host fallback, or an op with no CUDA
 * kernel), err says why; 2 an unknown op type, a dtype that does not parse or a
 * CodebookLookup of a format that is no codebook, err says why. GatherMX's placement depends
 * on its table too: it needs onnxq_cuda_node_support_shape (2 here). */
ONNXQ_API int32_t onnxq_cuda_node_support(const char* op_type, const char* dtype,
                                          const onnxq_modes* modes, char* err, size_t errlen);

/* As onnxq_cuda_node_support, with the node's `shape` (ndim dims) and `axis` attributes, which
 * GatherMX's placement depends on (the other ops ignore them; ndim -1: not given). 2 also for
 * a GatherMX shape and axis the op refuses. */
ONNXQ_API int32_t onnxq_cuda_node_support_shape(const char* op_type, const char* dtype,
                                                const onnxq_modes* modes, int32_t ndim,
                                                const int64_t* shape, int32_t axis, char* err,
                                                size_t errlen);

/* Quantize x (float type x_type) of shape[ndim], tiles along `axis` (-ndim .. ndim - 1).
 * values (x_type, x's shape) and codes may each be NULL, not both; with codes, scale is required
 * and meta too for MX9/MX6-style formats, tenscale is optional. modes may be NULL (defaults);
 * stochastic rounding and scale search are refused (the seed is not read). */
ONNXQ_API int32_t onnxq_cuda_quantize(const char* dtype, const onnxq_modes* modes, const void* x,
                                      int32_t x_type, int32_t ndim, const int64_t* shape,
                                      int32_t axis, void* values, void* codes, void* scale,
                                      void* tenscale, uint8_t* meta, void* stream, char* err,
                                      size_t errlen);

/* Decode codes (+ scale, tenscale, meta as onnxq_cuda_quantize writes them) to values of float
 * type values_type. */
ONNXQ_API int32_t onnxq_cuda_dequantize(const char* dtype, int32_t ndim, const int64_t* shape,
                                        int32_t axis, const void* codes, const void* scale,
                                        const void* tenscale, const uint8_t* meta, void* values,
                                        int32_t values_type, void* stream, char* err,
                                        size_t errlen);

/* As onnxq_cuda_quantize / _dequantize with the custom ops' layouts (docs/ops.md): q holds the
 * codes bit-packed LSB first (ceil(n * bits / 8) bytes), meta_packed the MX shift bits packed one
 * bit each (NULL: not wanted when quantizing). Codes under 8 bits go through device scratch. */
ONNXQ_API int32_t onnxq_cuda_quantize_packed(const char* dtype, const onnxq_modes* modes,
                                             const void* x, int32_t x_type, int32_t ndim,
                                             const int64_t* shape, int32_t axis, void* q,
                                             void* scale, void* tenscale, uint8_t* meta_packed,
                                             void* stream, char* err, size_t errlen);
ONNXQ_API int32_t onnxq_cuda_dequantize_packed(const char* dtype, int32_t ndim,
                                               const int64_t* shape, int32_t axis,
                                               const uint8_t* q, const void* scale,
                                               const void* tenscale, const uint8_t* meta_packed,
                                               void* values, int32_t values_type, void* stream,
                                               char* err, size_t errlen);

/* CodebookLookup (docs/ops.md) on the device: the packed indices q, scale (one byte per tile:
 * exponent scales of up to 8 bits) and meta_packed (the mapping indices packed; NULL when the
 * data type has no meta bits) decoded to values of float type values_type, tiles along the last
 * axis. table: host memory, 2^meta_bits x 2^index_bits float64 values by code (a generic
 * codebook's mappings; NULL: the data type's own, for implicit codebooks); it is checked as
 * CodebookLookup's Table input is and copied to the device on the stream. */
ONNXQ_API int32_t onnxq_cuda_lookup_packed(const char* dtype, const double* table, int32_t ndim,
                                           const int64_t* shape, int32_t axis, const uint8_t* q,
                                           const void* scale, const uint8_t* meta_packed,
                                           void* values, int32_t values_type, void* stream,
                                           char* err, size_t errlen);

/* GatherMX (docs/ops.md) on the device: rows `rows` (nrows of them, host memory, each in
 * [0, shape[0])) of the packed table of `shape` (tiles along `axis`, not 0) decoded into
 * values (nrows x shape[1:], float type values_type), in their order. The table's inputs are
 * onnxq_cuda_dequantize_packed's (an embedded preset) or onnxq_cuda_lookup_packed's (a
 * codebook; table as there, NULL for other data types); tenscale and meta_packed NULL where
 * the data type has none. The rows of each packed stream are copied into stream-ordered
 * scratch, then decoded. */
ONNXQ_API int32_t onnxq_cuda_gather_packed(const char* dtype, const double* table, int32_t ndim,
                                           const int64_t* shape, int32_t axis,
                                           const int64_t* rows, int64_t nrows, const uint8_t* q,
                                           const void* scale, const void* tenscale,
                                           const uint8_t* meta_packed, void* values,
                                           int32_t values_type, void* stream, char* err,
                                           size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ONNXQ_OPS_H_ */
