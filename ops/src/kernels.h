// The cast kernels shared by the C ABI and the onnxruntime custom ops.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "number.h"
#include "onnxq_ops.h"

namespace onnxq {

enum FloatType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// A data type as the kernels need it (onnxq_format with validated, derived number specs).
struct Format {
  Num elem, scale, zero, ts;
  bool scaled = false, has_zero = false, has_ts = false;
  int ntiles = 0, tile[2] = {0, 0}, sub[2] = {0, 0};
  int sparse_n = 0, sparse_m = 0, sparse_dim = -1;
  int cb_ib = 0, cb_mb = 0;
  std::vector<double> mags, table;
  std::vector<uint8_t> even;

  bool codebook() const { return cb_ib > 0; }
  int code_bits() const { return codebook() ? cb_ib : elem.bits; }
  int meta_bits() const { return codebook() ? cb_mb : 1; }
  bool has_meta() const { return codebook() || sub[1] > 0; }
};

// Validates and derives; returns an error message (empty when valid).
std::string make_format(const onnxq_format& in, Format* out);

struct Modes {
  int round_mode = kEven, scale_mode = kSFloor, nan_policy = 0;
  bool full_int_range = false;
  uint64_t seed = 0;
};

// Runs fn(begin, end) over [0, n) in chunks, possibly in parallel.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>&)>;
ParallelFor default_parallel_for(int nthreads);

// Tile geometry of layout.py's Tiling, plus the grid layouts.
struct Geometry {
  int kind = 0;  // 0 tensor, 1 one-d tiles, 2 two-d tiles
  int64_t size = 0, A = 1, Post = 1;
  int64_t B = 1, R = 1, C = 1, Tr = 1, Tc = 1, Sr = 0, Sc = 0, nR = 1, nC = 1;
  int64_t tiles() const { return B * nR * nC; }
  int64_t sub_rows() const { return Sc ? (R + Sr - 1) / Sr : 0; }
  int64_t sub_cols() const { return Sc ? (C + Sc - 1) / Sc : 0; }
  // Flat input index of moved row m (over the non-axis dims), axis position c.
  int64_t orig(int64_t m, int64_t c) const { return (m / Post) * A * Post + c * Post + m % Post; }
  // Grid index of (moved row m', last-dim position c) when row dim R is replaced by `rows`
  // and the axis by `cols`.
  int64_t grid(int64_t b, int64_t r, int64_t c, int64_t rows, int64_t cols) const;
  int64_t scale_count() const { return kind == 0 ? 1 : B * nR * nC; }
  int64_t meta_count() const {
    return Sc ? B * sub_rows() * sub_cols() : scale_count();
  }
};

// Builds the geometry (layout.Tiling.build); returns an error message or "".
std::string make_geometry(const Format& f, const std::vector<int64_t>& shape, int axis,
                          Geometry* g);

struct QuantizeIO {
  const void* x = nullptr;
  int x_type = kF32;
  // The float type whose range bounds the element clamp (finite input never decodes past its
  // largest finite value); -1: x_type.
  int finite_type = -1;
  void* values = nullptr;
  int values_type = kF32;
  void* codes = nullptr;     // code_width(code_bits) bytes per element, or:
  uint8_t* packed = nullptr; // the codes as packing.py's stream (codes and mask null)
  void* scale = nullptr;     // code_width(scale.bits) per tile
  void* zero = nullptr;
  void* tenscale = nullptr;
  uint8_t* meta = nullptr;   // one byte per unit, or:
  uint8_t* meta_packed = nullptr;  // 1-bit meta (MX shift bits) as packing.py's stream
  uint8_t* mask = nullptr;   // one byte per element
};

std::string quantize(const Format& f, const Modes& m, const std::vector<int64_t>& shape, int axis,
                     const QuantizeIO& io, const ParallelFor& pf);

inline int finite_type(const QuantizeIO& io) {
  return io.finite_type >= 0 ? io.finite_type : io.x_type;
}
// elements.MAX_FINITE: the largest finite value of the float type.
inline double max_finite(int type) {
  return type == kF16 ? 65504.0 : type == kBF16 ? 0x1.FEp127 : 0x1.FFFFFEp127;
}
// elements.OVERFLOW: magnitudes from this on round to Inf in the type.
inline double overflow(int type) {
  return type == kF16 ? 65520.0 : type == kBF16 ? 0x1.FFp127 : 0x1.FFFFFFp127;
}
// elements.PRODUCT_LIMIT: float32(q * scale) rounded to the type is finite iff q * scale < it.
inline double product_limit(int type) {
  return type == kF16 ? 65520.0 - 0x1p-9 : type == kBF16 ? 0x1.FEFFFFp127 : 0x1.FFFFFFp127;
}

struct DequantizeIO {
  const void* codes = nullptr;     // code_width(code_bits) bytes per element, or:
  const uint8_t* packed = nullptr;  // the codes as packing.py's LSB-first stream (codes null)
  const uint8_t* meta_packed = nullptr;  // meta packed with meta_bits each (meta null)
  const void* scale = nullptr;
  const void* zero = nullptr;
  const void* tenscale = nullptr;
  const uint8_t* meta = nullptr;
  const uint8_t* mask = nullptr;
  void* values = nullptr;
  int values_type = kF32;
};

std::string dequantize(const Format& f, const std::vector<int64_t>& shape, int axis,
                       const DequantizeIO& io, const ParallelFor& pf);

// packing.py: LSB-first bit streams. Returns the number of codes packed.
// pf: split into byte-aligned chunks run in parallel (when there is no mask).
int64_t pack_bits(const void* codes, int width, int64_t count, int bits, const uint8_t* mask,
                  uint8_t* out, const ParallelFor* pf = nullptr);
void unpack_bits(const uint8_t* stream, int bits, int64_t count, const uint8_t* mask,
                 void* codes, int width, const ParallelFor* pf = nullptr);
inline int64_t packed_nbytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

inline uint64_t load_code(const void* p, int width, int64_t i) {
  switch (width) {
    case 1: return static_cast<const uint8_t*>(p)[i];
    case 2: return static_cast<const uint16_t*>(p)[i];
    case 4: return static_cast<const uint32_t*>(p)[i];
    default: return static_cast<const uint64_t*>(p)[i];
  }
}
inline void store_code(void* p, int width, int64_t i, uint64_t v) {
  switch (width) {
    case 1: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case 2: static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); break;
    case 4: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); break;
    default: static_cast<uint64_t*>(p)[i] = v; break;
  }
}

}  // namespace onnxq
