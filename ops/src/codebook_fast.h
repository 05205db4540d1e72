// Fast codebook casts (cb<ib><mb>..., exponent scale): float32 tensors tiled along their last
// axis, tiles of up to kCbMaxT elements, optional subtiles along that axis (one mapping per
// unit: subtile, or tile when there are none).
//
// This header declares the setup and the run (codebook_fast.cc); the kernel itself is
// codebook_kernel.inc, compiled once per instruction set (cb_base, cb_avx2, cb_avx512) by
// codebook_fast.cc and picked at run time.
//
// The kernel works on groups of W tiles side by side: a tile is one SIMD lane, element p of
// every tile of the group is one vector (a transpose on load and store). Everything per tile
// (absmax, scale, mapping choice) and per element is then a vertical operation.
//
// Bit-exactness with reference._codebook_select:
// - Nearest entry. a = |x| * 2^-s is exact in float32 whenever a >= 2^-126 (x has 24 bits and
//   2^-s is a power of two); below, the float32 product is only rounded, monotonically. The
//   reference picks hi over lo = hi - 1 when d_hi < d_lo or (d_hi == d_lo and tie_hi), in
//   float64. Near the midpoint m = (lo + hi) / 2 both differences are exact in float64 (setup
//   checks that the table's bits and a's 24 bits span at most 53 bits), so the float64 test is
//   the exact test a > m (or a >= m when ties go up); away from m, rounding cannot turn one
//   difference into the other. So the index is the number of thresholds th_k <= a with th_k = m
//   (ties up) or the next float32 above m (ties down). Setup checks that every m is a float32
//   >= 2^-125, so a below 2^-126 (inexact) is below every threshold, as is the exact a.
// - Error. d = v - q = sign * (a64 - t) with a64 = |x| * 2^-s in float64 (always exact) and t the
//   table entry (round to nearest is symmetric, and q = +0 for t = 0 gives d = v = -a64 for
//   negative v); d * d in float64, added up left to right in float64 as l2_metric does.
// - Mapping: the least error, ties to the lower mapping (strict <), as the reference.
// - Value: float32(t * 2^s) is the float32 product t32 * 2^s (one rounding of the same exact
//   value: t and 2^s are float32), with x's sign when t != 0 or the compute type has -0.
// Tiles with Inf or NaN are redone by process_tile (the general path).

#pragma once

#include <cstdint>
#include <vector>

#include "quant_internal.h"

namespace onnxq::kern {

constexpr int kCbMaxT = 256;   // elements per tile
constexpr int kCbMaxMaps = 16;
constexpr int kCbMaxHalf = 32;  // magnitudes per mapping (index_bits <= 6)

struct CbFast {
  const Ctx* c = nullptr;
  int T = 0, U = 0, units = 0, maps = 0, half = 0, nth = 0, ib = 0;
  bool negzero = false, floor_mode = false, subtiles = false;
  bool stream = false;  // values written with streaming stores (large outputs)
  int emax = 0, frac = 0, low = 0, high = 0, bias = 0;
  // Tiles with a larger scale exponent could decode a top entry past the data type's largest
  // finite value: they are redone by process_tile, which bounds the clamp (finite_bound).
  int safe_sexp = 0;
  int64_t R = 0, C = 0, nC = 0, tiles = 0, sub_cols = 0;
  float th[kCbMaxMaps * kCbMaxHalf] = {};   // a >= th[m * nth + k]: entry k + 1 over k
  float tab[kCbMaxMaps * kCbMaxHalf] = {};  // magnitudes
};

// A group of tiles' working arrays, [position][lane] (allocated once per worker).
struct CbBuf {
  std::vector<char> mem;
  char* at = nullptr;  // 128-byte aligned
  char* x = nullptr;
  char* a32 = nullptr;
  char* t = nullptr;
  char* y = nullptr;
  char* rows = nullptr;
  char* a64 = nullptr;
  char* sq = nullptr;
  char* idx = nullptr;
  char* codes = nullptr;
  // Carves the buffers for tiles of T elements, W lanes, `maps` mappings and `units` units.
  void setup(int T, int W, int maps, int units) {
    size_t f = static_cast<size_t>(T) * W * 4, d = 2 * f;
    size_t sizes[] = {f, f, f * maps, f, f, d, d + static_cast<size_t>(units) * W * 16,
                      f * maps, f};
    size_t total = 128;
    for (size_t z : sizes) total += (z + 127) / 128 * 128;
    mem.assign(total, 0);
    char* p = mem.data();
    p += (128 - reinterpret_cast<uintptr_t>(p) % 128) % 128;
    char** outs[] = {&x, &a32, &t, &y, &rows, &a64, &sq, &idx, &codes};
    for (int i = 0; i < 9; ++i) {
      *outs[i] = p;
      p += (sizes[i] + 127) / 128 * 128;
    }
  }
};

// Sets up the codebook fast path; false when it does not apply (the general path runs).
bool cb_setup(const Ctx& c, CbFast* F);
// The cast (after cb_setup): chunks of tiles in parallel.
void cb_run(const CbFast& F, const ParallelFor& pf);

}  // namespace onnxq::kern
