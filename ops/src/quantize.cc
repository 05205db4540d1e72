// quantize(): the cast's entry point. Half-precision data through float32 buffers, packed
// outputs, then the path for this cast: unscaled, one tensor-wide scale, the codebook kernels,
// the fast row kernels or the general path tile by tile (quantize_tile.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "codebook_fast.h"
#include "fast_channels.h"
#include "fast_rows.h"
#include "half_convert.h"
#include "packing.h"
#include "quant_internal.h"

namespace onnxq {

namespace kern {
namespace {

struct SlowCtx {
  const Ctx* c;
  Scratch s;
  uint8_t* packed = nullptr;  // the fast path writes packed codes: the tile's go there
  uint8_t* meta_bits = nullptr;  // and 1-bit meta: the tile's go there
};

void slow_tile(void* p, int64_t r, int64_t c0) {
  auto* sc = static_cast<SlowCtx*>(p);
  const Geometry& g = sc->c->g;
  int64_t t = r * g.nC + c0 / g.Tc;
  if (!sc->packed && !sc->meta_bits) {
    process_tile(*sc->c, t, sc->s);
    return;
  }
  // The tile's codes and meta into buffers of their own, then packed into the streams.
  int bits = sc->c->f.code_bits();
  int64_t n = std::min<int64_t>(g.Tc, g.C - c0);
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  int64_t units = sc->meta_bits ? (n + g.Sc - 1) / g.Sc : 0;
  std::vector<uint8_t> mbuf(static_cast<size_t>(units));
  QuantizeIO io = sc->c->io;
  if (sc->packed) {
    io.codes = buf.data();
    io.packed = nullptr;
  }
  if (sc->meta_bits) {
    io.meta = mbuf.data();
    io.meta_packed = nullptr;
  }
  Ctx c = *sc->c;
  Ctx local{c.f, c.m, c.g, io, c.path, c.key, c.stochastic, c.code_w, c.scale_w, c.zero_w,
            c.ts, c.nan_f, sc->packed ? r * g.C + c0 : c.codes_base,
            sc->meta_bits ? r * g.sub_cols() + c0 / g.Sc : c.meta_base};
  process_tile(local, t, sc->s);
  if (sc->packed) pack_range(buf.data(), 1, 0, n, bits, sc->packed + ((r * g.C + c0) * bits) / 8);
  if (sc->meta_bits) {
    uint8_t* dst = sc->meta_bits + (r * g.sub_cols() + c0 / g.Sc) / 8;
    for (int64_t u = 0; u < units; u += 8) {
      uint8_t byte = 0;
      for (int64_t k = u; k < std::min<int64_t>(units, u + 8); ++k)
        byte |= static_cast<uint8_t>((mbuf[static_cast<size_t>(k)] & 1) << (k - u));
      dst[u / 8] = byte;
    }
  }
}

Path pick_path(const Format& f, const Geometry& g) {
  if (f.scale.kind == kExponent) return f.codebook() ? kExpBook : g.Sc ? kExpShift : kExp;
  if (f.has_zero) return f.zero.kind == kFloat ? kZeroFloat : kZeroInt;
  return kFloatScale;
}

// Whether the fast row kernels write this cast's packed codes straight into io.packed: every
// tile starts on a byte of the stream.
bool fast_packs(const Format& f, const Modes& m, const Geometry& g, const QuantizeIO& io) {
  if (!f.scaled || g.kind != 1 || io.mask || f.sparse_m) return false;
  int bits = f.code_bits();
  if ((g.C * bits) % 8 || (g.Tc * bits) % 8) return false;
  Ctx c{f, m, g, io, pick_path(f, g), 0, m.round_mode == kStochastic, 1, 1, 1, 0.0f, 0.0f};
  FastFormat ff;
  if (fast_setup(c, &ff)) return true;
  CbFast cbf;  // codebooks: codebook_kernel.inc packs in place too
  return cb_setup(c, &cbf);
}

// Whether the fast row kernels run this cast (so they can write 1-bit meta in place).
bool fast_meta_bits(const Format& f, const Modes& m, const Geometry& g, const QuantizeIO& io) {
  if (!f.scaled || g.kind != 1 || io.mask || f.sparse_m) return false;
  Ctx c{f, m, g, io, pick_path(f, g), 0, m.round_mode == kStochastic, 1, 1, 1, 0.0f, 0.0f};
  FastFormat ff;
  return fast_setup(c, &ff) && ff.sub > 0;
}

std::string quantize_impl(const Format& f, const Modes& m, const Geometry& g,
                          const QuantizeIO& io, const ParallelFor& pf);

// A values-only cast whose tiles are independent of each other: no codes, scales or masks
// written, no tensor scale (NVFP4's comes from the whole tensor), no stochastic rounding (its
// random stream follows the element index).
bool independent_values_only(const Format& f, const Modes& m, const QuantizeIO& io) {
  return io.values && !io.codes && !io.packed && !io.scale && !io.zero && !io.tenscale &&
         !io.meta && !io.meta_packed && !io.mask && !f.has_ts && m.round_mode != kStochastic;
}

// float16 / bfloat16 data (in, out or both) of an independent values-only cast with 1-D
// tiles, through the float32 kernels in work items of whole tiles of about 2^14 elements:
// each item converted into a float32 buffer that stays in the cache, cast there, converted
// back. No tensor-sized buffer: fresh ones cost a page fault per 4 KiB on every run, more
// than the cast. An item is whole rows (tiles along the last axis) or, for tiles along a
// non-last axis of length A (NCHW channels), whole groups of tile channels at a run of inner
// positions of one outer index: all positions (one contiguous block) when a group holds at
// most 2^14 elements, else runs long enough for the prefetchers. Each item is the same cast
// of its own tiles: the whole tensor's bits.
std::string cast_half_items(const Format& f, const Modes& m, const Geometry& g,
                            const QuantizeIO& io, const ParallelFor& pf) {
  constexpr int64_t kItem = int64_t(1) << 14;
  const int64_t A = g.A, P = g.Post, outer = g.size / (A * P);
  const bool rows = P == 1;
  const int64_t tile = std::min(g.Tc, A), groups = (A + tile - 1) / tile;
  // Rows: `width` rows per item. Channels: `width` positions, `per_item` groups per item.
  const int64_t width = rows ? std::max<int64_t>(1, kItem / A)
                        : tile * P <= kItem ? P
                                            : std::min(P, std::max<int64_t>(8, kItem / tile));
  const int64_t per_item = !rows && width == P ? std::max<int64_t>(1, kItem / (tile * P)) : 1;
  const int64_t pos_items = (P + width - 1) / width;
  const int64_t per_outer = (groups + per_item - 1) / per_item * pos_items;
  const int64_t items = rows ? (g.size / A + width - 1) / width : outer * per_outer;
  const size_t buffer = static_cast<size_t>(rows ? A * width : per_item * tile * width);
  const bool in_half = io.x_type != kF32, out_half = io.values_type != kF32;
  const bool in_bf = io.x_type == kBF16, out_bf = io.values_type == kBF16;
  const bool vectors = half_vectors();
  const ParallelFor serial = [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n > 0) fn(0, n);
  };
  std::mutex mu;
  std::string failed;
  pf(items, [&](int64_t i0, int64_t i1) {
    std::vector<float> xin(buffer), yout(buffer);
    for (int64_t i = i0; i < i1; ++i) {
      // Item i as runs: `runs` runs of `len` elements, run k at flat offset base + k * stride,
      // gathered to xin[k * len, (k + 1) * len).
      int64_t base, stride = 0, len, runs = 1;
      std::vector<int64_t> shape;
      if (rows) {
        const int64_t r0 = i * width, r1 = std::min(g.size / A, r0 + width);
        base = r0 * A, len = (r1 - r0) * A;
        shape = {r1 - r0, A};
      } else {
        const int64_t o = i / per_outer, gi = i % per_outer / pos_items;
        const int64_t p0 = i % per_outer % pos_items * width;
        const int64_t c0 = gi * per_item * tile, c1 = std::min(A, c0 + per_item * tile);
        const int64_t n = std::min(width, P - p0);
        base = (o * A + c0) * P + p0;
        shape = {1, c1 - c0, n};
        if (n == P) {
          len = (c1 - c0) * P;  // whole channel rows: one contiguous block
        } else {
          stride = P, len = n, runs = c1 - c0;
        }
      }
      for (int64_t k = 0; k < runs; ++k) {
        const int64_t at = base + k * stride;
        float* d = xin.data() + k * len;
        if (in_half) {
          widen_to_f32(static_cast<const uint16_t*>(io.x) + at, d, len, in_bf, vectors);
        } else {
          std::memcpy(d, static_cast<const float*>(io.x) + at, sizeof(float) * len);
        }
      }
      QuantizeIO item;
      item.x = xin.data();
      item.x_type = kF32;
      item.finite_type = finite_type(io);  // the caller's type, not the buffer's
      item.values = yout.data();
      item.values_type = kF32;
      std::string e = quantize(f, m, shape, 1, item, serial);
      if (!e.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        if (failed.empty()) failed = e;
        return;
      }
      for (int64_t k = 0; k < runs; ++k) {
        const int64_t at = base + k * stride;
        const float* y = yout.data() + k * len;
        if (out_half) {
          narrow_from_f32(y, static_cast<uint16_t*>(io.values) + at, len, out_bf, vectors);
        } else {
          std::memcpy(static_cast<float*>(io.values) + at, y, sizeof(float) * len);
        }
      }
    }
  });
  return failed;
}

}  // namespace
}  // namespace kern

using namespace kern;  // NOLINT(build/namespaces)

std::string quantize(const Format& f, const Modes& m, const std::vector<int64_t>& shape, int axis,
                     const QuantizeIO& io, const ParallelFor& pf) {
  Geometry g;
  std::string e = make_geometry(f, shape, axis, &g);
  if (!e.empty()) return e;
  if (g.size == 0) return "cannot cast an empty tensor";
  const bool half_in = io.x_type != kF32, half_out = io.values && io.values_type != kF32;
  if ((half_in || half_out) && g.kind == 1 && independent_values_only(f, m, io))
    return cast_half_items(f, m, g, io, pf);
  if ((half_in || half_out) && g.kind == 1) {
    // float16 / bfloat16 data through the float32 fast paths (rows and NCHW channels): the input
    // converted exactly first (as load_x reads it), the float32 values rounded afterwards (as
    // store_y writes them): the general path's bits, for a tensor-sized buffer or two. Values
    // may overwrite x: x is read whole first.
    constexpr int64_t kChunk = int64_t(1) << 16;
    const int64_t chunks = (g.size + kChunk - 1) / kChunk;
    // Uninitialized (every element is written first), in huge pages where the kernel has them:
    // a fresh tensor-sized buffer otherwise costs a page fault per 4 KiB.
    struct Free {
      void operator()(float* p) const { std::free(p); }
    };
    auto big = [&]() {
      const size_t bytes = static_cast<size_t>(g.size) * sizeof(float);
      void* p = nullptr;
      if (posix_memalign(&p, size_t(1) << 21, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (bytes >= (size_t(1) << 21)) madvise(p, bytes, MADV_HUGEPAGE);
#endif
      return std::unique_ptr<float, Free>(static_cast<float*>(p));
    };
    std::unique_ptr<float, Free> xf, yf;
    QuantizeIO io2 = io;
    io2.finite_type = finite_type(io);  // the caller's type, not the float32 buffers'
    if (half_in) {
      xf = big();
      float* d = xf.get();
      const uint16_t* src = static_cast<const uint16_t*>(io.x);
      const bool bf = io.x_type == kBF16, vectors = half_vectors();
      pf(chunks, [&](int64_t c0, int64_t c1) {
        const int64_t i0 = c0 * kChunk, i1 = std::min(g.size, c1 * kChunk);
        widen_to_f32(src + i0, d + i0, i1 - i0, bf, vectors);
      });
      io2.x = d;
      io2.x_type = kF32;
    }
    if (half_out) {
      yf = big();
      io2.values = yf.get();
      io2.values_type = kF32;
    }
    e = quantize(f, m, shape, axis, io2, pf);
    if (!e.empty() || !half_out) return e;
    const float* y = yf.get();
    uint16_t* dst = static_cast<uint16_t*>(io.values);
    const bool bf = io.values_type == kBF16, vectors = half_vectors();
    pf(chunks, [&](int64_t c0, int64_t c1) {
      const int64_t i0 = c0 * kChunk, i1 = std::min(g.size, c1 * kChunk);
      narrow_from_f32(y + i0, dst + i0, i1 - i0, bf, vectors);  // as store_y
    });
    return "";
  }
  if (io.meta_packed && !io.meta) {
    // 1-bit meta straight into the stream where the fast row kernels write every tile's bits
    // from a byte on; otherwise one byte per unit, packed afterwards.
    bool direct = f.meta_bits() == 1 && g.kind == 1 && g.Sc > 0 && g.Sr == 1 &&
                  (g.Tc / g.Sc) % 8 == 0 && g.sub_cols() % 8 == 0 && fast_meta_bits(f, m, g, io);
    if (!direct) {
      int64_t nmeta = f.has_meta() ? g.meta_count() : 0;
      std::unique_ptr<uint8_t[]> buf(new uint8_t[static_cast<size_t>(std::max<int64_t>(nmeta, 1))]());
      QuantizeIO io2 = io;
      io2.meta = buf.get();
      io2.meta_packed = nullptr;
      e = quantize(f, m, shape, axis, io2, pf);
      if (!e.empty()) return e;
      if (nmeta) pack_bits(buf.get(), 1, nmeta, f.meta_bits(), nullptr, io.meta_packed, &pf);
      return "";
    }
  }
  if (io.packed && !io.codes) {
    if (io.mask) return "packed codes need no mask";
    if (!fast_packs(f, m, g, io)) {  // codes one per element, then packed
      int code_w = code_width(f.code_bits());
      std::unique_ptr<uint8_t[]> buf(new uint8_t[static_cast<size_t>(g.size * code_w)]);
      QuantizeIO io2 = io;
      io2.codes = buf.get();
      io2.packed = nullptr;
      e = quantize_impl(f, m, g, io2, pf);
      if (!e.empty()) return e;
      pack_bits(buf.get(), code_w, g.size, f.code_bits(), nullptr, io.packed, &pf);
      return "";
    }
  }
  return quantize_impl(f, m, g, io, pf);
}

namespace kern {
namespace {

// An unscaled cast: elementwise, keeps Inf where the format has it.
void cast_unscaled(const Format& f, const Modes& m, const Geometry& g, const QuantizeIO& io,
                   const ParallelFor& pf, uint32_t key, bool stochastic, int code_w) {
  const double limit = finite_bound(max_finite(finite_type(io)), f.elem, f.elem.maxfloat);
  pf((g.size + kChunk - 1) / kChunk, [&](int64_t c0, int64_t c1) {
    int64_t end = std::min(g.size, c1 * kChunk);
    for (int64_t i = c0 * kChunk; i < end; ++i) {
      float x = load_x(io.x, io.x_type, i);
      uint32_t r = stochastic ? stochastic_bits(key, static_cast<uint64_t>(i)) : 0u;
      double q =
          quantize_value(static_cast<double>(x), f.elem, m.round_mode, r, true, false, limit);
      if (io.values) store_y(io.values, io.values_type, i, static_cast<float>(q));
      if (io.codes) store_code(io.codes, code_w, i, encode_value(q, f.elem));
    }
  });
}

// NVFP4's tensor scale (c.ts, and io.tenscale's code) from the largest tile absmax (after
// pruning).
void tensor_scale(Ctx& c, const ParallelFor& pf) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  int64_t tiles = g.tiles();
  std::vector<float> amaxes(static_cast<size_t>(tiles), 0.0f);
  if (!f.sparse_m && io.x_type == kF32) {
    // No pruning: the largest tile absmax is the largest finite magnitude of the tensor.
    int64_t chunks = (g.size + kChunk - 1) / kChunk;
    std::vector<uint32_t> parts(static_cast<size_t>(chunks), 0u);
    const uint32_t* xb = static_cast<const uint32_t*>(io.x);
    pf(chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        int32_t m = 0;  // signed: GCC vectorizes this max reduction, not the unsigned one
        int64_t end = std::min(g.size, (ch + 1) * kChunk);
        for (int64_t i = ch * kChunk; i < end; ++i) {
          int32_t b = static_cast<int32_t>(xb[i] & 0x7FFFFFFFu);
          int32_t fin = b < 0x7F800000 ? b : 0;
          m = fin > m ? fin : m;
        }
        parts[static_cast<size_t>(ch)] = static_cast<uint32_t>(m);
      }
    });
    uint32_t m = 0;
    for (uint32_t v : parts) m = v > m ? v : m;
    amaxes.assign(1, from_fbits(m));
    tiles = 0;
  }
  pf(tiles, [&](int64_t t0, int64_t t1) {
    Scratch s;
    for (int64_t t = t0; t < t1; ++t) {
      gather_tile(c, t, s);
      Stats st;
      for (float xv : s.x) accumulate(st, xv, false);
      amaxes[static_cast<size_t>(t)] = st.amax;
    }
  });
  float top = 0.0f;
  for (float a : amaxes) top = a > top ? a : top;
  float denom = static_cast<float>(f.elem.maxfloat) * static_cast<float>(f.scale.maxfloat);
  c.ts = cast_scale(top / denom, f.ts);
  if (io.tenscale)
    store_code(io.tenscale, code_width(f.ts.bits), 0, encode_value(c.ts, f.ts));
}

// One scale for the whole tensor: a parallel reduction, then the elementwise pass.
void cast_one_scale(const Ctx& c, const ParallelFor& pf) {
  const Format& f = c.f;
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  const Path path = c.path;
  int64_t chunks = (g.size + kChunk - 1) / kChunk;
  std::vector<Stats> parts(static_cast<size_t>(chunks));
  bool want_range = path == kZeroFloat || path == kZeroInt;
  pf(chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      Stats st;
      int64_t end = std::min(g.size, (ch + 1) * kChunk);
      for (int64_t i = ch * kChunk; i < end; ++i) accumulate(st, load_x(io.x, io.x_type, i),
                                                              want_range);
      parts[static_cast<size_t>(ch)] = st;
    }
  });
  Stats st = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) merge(st, parts[i]);
  TileParams p = tile_params(c, st);
  if (io.scale) store_code(io.scale, c.scale_w, 0, p.scale_code);
  if (io.zero && f.has_zero) store_code(io.zero, c.zero_w, 0, p.zero_code);
  pf(chunks, [&](int64_t c0, int64_t c1) {
    tensor_elements(c, p, c0 * kChunk, std::min(g.size, c1 * kChunk));
  });
}

// Rows of float32 tiles along the last axis through the fast row kernels (after fast_setup).
void cast_fast_rows(const Ctx& c, const FastFormat& ff, const ParallelFor& pf) {
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  const FastRows rows_fn = fast_rows_for(fast_rows_level());
  const float* xf = static_cast<const float*>(io.x);
  FastOut out;
  out.y = static_cast<float*>(io.values);
  out.codes = static_cast<uint8_t*>(io.codes);
  out.packed = io.codes ? nullptr : io.packed;
  if (io.codes || io.packed) {
    out.scale = static_cast<uint8_t*>(io.scale);
    out.meta = ff.sub ? io.meta : nullptr;
    out.meta_bits = ff.sub ? io.meta_packed : nullptr;
  }
  out.nC = g.nC;
  out.sub_cols = g.sub_cols();
  int64_t rows = g.R, cols = g.C;
  // Items of about 2^12 elements, so that a few hundred thousand split evenly over the
  // threads (session_parallel_for hands each thread a contiguous run of items); packed
  // streams keep 2^14.
  const int shift = out.packed || out.meta_bits ? 14 : 12;
  int64_t per = std::max<int64_t>(1, (int64_t(1) << shift) / std::max<int64_t>(cols, 1));
  pf((rows + per - 1) / per, [&](int64_t b0, int64_t b1) {
    SlowCtx sc{&c, Scratch(), out.packed, out.meta_bits};
    rows_fn(ff, xf, out, b0 * per, std::min(rows, b1 * per), cols, slow_tile, &sc);
  });
}

std::string quantize_impl(const Format& f, const Modes& m, const Geometry& g,
                          const QuantizeIO& io, const ParallelFor& pf) {
  if (f.codebook() && m.round_mode == kStochastic)
    return "codebooks round to the nearest table entry; stochastic is not supported";
  uint32_t key = seed_key(m.seed);
  bool stochastic = m.round_mode == kStochastic;
  int code_w = code_width(f.code_bits());
  float nan_f = from_fbits(kQuietNaN);
  if (!f.scaled) {
    cast_unscaled(f, m, g, io, pf, key, stochastic, code_w);
    return "";
  }
  Path path = pick_path(f, g);
  Ctx c{f, m, g, io, path, key, stochastic, code_w, code_width(f.scale.bits),
        f.has_zero ? code_width(f.zero.bits) : 1, 0.0f, nan_f};
  if (f.has_ts) tensor_scale(c, pf);
  // Scale mode search: every tile (a tensor scale's one tile too) through the general path,
  // whose error sum has one defined order (scale_search.py).
  const bool search = m.scale_mode == kSSearch && path != kZeroFloat && path != kZeroInt;
  if (g.kind == 0 && path != kExpBook && !search) {
    cast_one_scale(c, pf);
    return "";
  }
  CbFast cbf;
  if (cb_setup(c, &cbf)) {  // codebooks along the last axis (codebook_fast.h)
    cb_run(cbf, pf);
    return "";
  }
  FastFormat ff;
  if (fast_setup(c, &ff)) {
    cast_fast_rows(c, ff, pf);
    return "";
  }
  if (cast_fast_channels(c, pf)) return "";  // tiles along a non-last axis (NCHW channels)
  pf(g.tiles(), [&](int64_t t0, int64_t t1) {
    Scratch s;
    for (int64_t t = t0; t < t1; ++t) process_tile(c, t, s);
  });
  return "";
}

}  // namespace
}  // namespace kern

}  // namespace onnxq
