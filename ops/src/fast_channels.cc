// The driver of the channel kernels (fast_channels.h): which casts they take, the split of the
// tensor over the session's threads, and the general path for the tiles they refuse.
#include "fast_channels.h"

#include <algorithm>
#include <cstdint>

namespace onnxq::kern {

namespace {

struct ChanSlow {
  const Ctx* c;
  Scratch s;
};

// A tile the channel kernels refuse: the general path (process_tile) writes its outputs.
void chan_slow_tile(void* p, int64_t r, int64_t c0) {
  auto* sc = static_cast<ChanSlow*>(p);
  const Geometry& g = sc->c->g;
  process_tile(*sc->c, r * g.nC + c0 / g.Tc, sc->s);
}

}  // namespace

bool cast_fast_channels(const Ctx& c, const ParallelFor& pf) {
  const Geometry& g = c.g;
  const QuantizeIO& io = c.io;
  if (g.kind != 1 || g.Post <= 1 || g.size == 0) return false;
  // Codes one byte each, the scale with them; no packed stream, meta or mask (quantize() turns
  // a packed stream into codes first; MX shift bits stay on the general path).
  if (io.packed || io.meta || io.meta_packed || io.mask || (io.scale && !io.codes)) return false;
  if (io.codes && (c.path == kExpShift || c.codes_base != 0)) return false;
  FastFormat ff;
  if (!fast_setup(c, &ff, true)) return false;
  const FastChans fn = fast_chans_for(fast_rows_level());
  FkChanOut out;
  out.y = static_cast<float*>(io.values);
  out.codes = static_cast<uint8_t*>(io.codes);
  out.scale = io.codes ? static_cast<uint8_t*>(io.scale) : nullptr;
  out.C = g.C;
  out.P = g.Post;
  out.nC = g.nC;
  const int64_t outer = g.size / (g.C * g.Post);
  // Work items of about 2^12 elements, so that a few hundred thousand split evenly over the
  // threads: a run of inner positions (a multiple of 64) of one outer index, all its
  // channels; the last run of an outer index takes the remainder, so
  // that every run holds at least min(P, 64) positions (the kernels' last vector overlaps
  // the one before it instead of taking a padded copy).
  int64_t run = std::max<int64_t>(64, ((int64_t(1) << 12) / std::max<int64_t>(g.C, 1)) & ~63);
  run = std::min(run, g.Post);
  const int64_t per_outer = g.Post / run;
  const float* x = static_cast<const float*>(io.x);
  pf(outer * per_outer, [&](int64_t w0, int64_t w1) {
    ChanSlow sc{&c, Scratch()};
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t o = w / per_outer, i = w % per_outer, p0 = i * run;
      const int64_t p1 = i == per_outer - 1 ? g.Post : p0 + run;
      fn(ff, x, out, o, p0, p1, chan_slow_tile, &sc);
    }
  });
  return true;
}

}  // namespace onnxq::kern
