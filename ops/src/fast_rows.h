// The fast row kernels' interface (fast_rows.cc): float32 tensors tiled along their last axis
// with an exponent or float scale, rounded to nearest even, away or toward zero.
#pragma once

#include <cstdint>

#include "quant_internal.h"

namespace onnxq::kern {

// The per-format constants of the fast path and the parameters of one tile.
struct FastTile {
  bool nan_tile = false, zero_tile = false;
  int kint = 0, kmin = 0;
  uint32_t top_pos = 0, top_neg = 0, thr = 0;
  // fk_rne: float32 bits of 2^(kmin + 23) (adding and subtracting it rounds to a multiple of
  // 2^kmin) and of 2^(kmin + mbits), where float elements become normal
  uint32_t magic = 0, norm_thr = 0;
  float eff = 0.0f, sc = 0.0f;
};

struct FastFormat {
  const Ctx* c = nullptr;
  bool is_float = false, negzero = false, float_scale = false, nan_on_nan = false;
  bool full_int_range = false, floor_mode = false;
  int mbits = 0, emin = 0, rm = 0, sub = 0, tc = 0, policy = 0;
  int top_field = 0;            // biased float32 exponent of the element maxfloat
  uint32_t top_mant = 0;        // its float32 mantissa bits
  int neg_field = 0;            // biased float32 exponent of maxfloat + 1 (full int range)
  // float scales: the scale number's grid and the elements' fixed grid (s = 0)
  int scale_kmin = 0, scale_is_float = 0;
  uint32_t scale_top = 0;
  int scale_rm = 0, scale_mbits = 0;
  bool scale_negzero = false;
  float maxfloat_f = 0.0f, ts = 0.0f;
  bool has_ts = false;
  // codes: the element's exponent bias, code width and NaN code; the scale's code of the tile
  // exponent s (s + scale_code_add) or its float number (scale_*), and its NaN code
  int ebias = 0, code_bits = 8;
  uint32_t nan_code = 0;
  int scale_code_add = 0, scale_emin = 0, scale_bias = 0, scale_bits = 8;
  uint32_t scale_nan_code = 0;
  // exponent scales, integer-only (fk_exp_params): s = clamp(floor_log2 amax + bump - emax +
  // frac, low, high) - frac, bump = mantissa bits of amax >= bump_ge (the scale mode)
  int emax = 0, frac = 0, low = 0, high = 0;
  uint32_t bump_ge = 0;
  // round to nearest even with float32 adds (fk_rne): off when the FPU flushes subnormals
  bool rne_add = false;
  // float scales: the element grid's tile (the same for every tile, s = 0) and the scale
  // number's grid as a tile (stile_rne: fk_rne applies to it)
  FastTile ftile, stile;
  bool stile_rne = false;
  // codes read off the rounding (fk_vrne_code): the largest code magnitudes
  bool code_direct = false;
  int32_t cmax_pos = 0, cmax_neg = 0;
  // The data type's largest finite value (float32 bits) and elements.PRODUCT_LIMIT: tiles whose
  // top values would pass them take the general path (its clamp bound, finite_bound).
  uint32_t finite_top = 0x7F7FFFFFu;
  double prod_limit = 0.0;
};


// The outputs of the fast row kernels (tensors tiled along their last axis, Post == 1).
struct FastOut {
  float* y = nullptr;          // values (float32), or null
  uint8_t* codes = nullptr;    // codes, one byte per element, or null
  uint8_t* packed = nullptr;   // or the packing.py stream (every tile starts on a byte)
  uint8_t* scale = nullptr;    // scale codes, one byte per tile (row * nC + tile), or null
  uint8_t* meta = nullptr;     // MX shift bits, one byte per subtile (row * sub_cols + s)
  uint8_t* meta_bits = nullptr;  // or one bit each (every tile's bits start on a byte)
  int64_t nC = 0, sub_cols = 0;
};

// The arguments of fast_rows_driver.inc's codebook lookup (fk_cb_dequant_rows).
struct FkCbDq {
  const float* table = nullptr;   // maps x 2^ib entries
  const uint8_t* packed = nullptr;  // codes, ib bits each, every tile on a byte
  const uint8_t* codes = nullptr;   // or one byte each
  const uint8_t* meta = nullptr;    // one byte per unit
  const uint8_t* meta_packed = nullptr;  // or mb bits per unit
  const uint8_t* scale = nullptr;
  const uint32_t* factor = nullptr;  // float32 bits of 2^s per scale code; 0: general path
  float* y = nullptr;
  int ib = 0, mb = 0, U = 0;
  int64_t C = 0, Tc = 0, nC = 0, units_per_row = 0;
  int64_t nbytes = 0;  // bytes of the code stream (codes or packed)
  bool nan = true;     // a NaN table entry or NaN scale code present (else no NaN can occur)
  bool nt = false;     // streaming stores (a large output)
};

// The row kernels: rows [r0, r1) of `cols` columns; slow(ctx, row, first column) casts a tile
// the fast path refuses.
using FastRows = void (*)(const FastFormat&, const float*, const FastOut&, int64_t, int64_t,
                          int64_t, void (*)(void*, int64_t, int64_t), void*);
using FkCbRows = void (*)(const FkCbDq&, int64_t, int64_t);

// Sets up the fast path for this cast; false when it does not apply (the general path runs).
// channels: for tiles along a non-last axis too (the channel kernels, fast_channels.h).
bool fast_setup(const Ctx& c, FastFormat* ff, bool channels = false);
// The instruction set of the row kernels for this CPU (simd_level(true); 0 off x86).
int fast_rows_level();
// The row kernels of an instruction set (fast_rows_level).
FastRows fast_rows_for(int level);
// fast_rows_driver.inc's codebook lookup rows (fk_cb_dequant_rows) of an instruction set.
FkCbRows fast_cb_rows_for(int level);

}  // namespace onnxq::kern
