// Tiles along a non-last axis (an NCHW activation tiled along its channels): the interface of
// the channel kernels (fast_channels.inc, compiled with the row kernels in fast_rows.cc) and
// their driver (fast_channels.cc).
#pragma once

#include <cstdint>

#include "fast_rows.h"
#include "quant_internal.h"

namespace onnxq::kern {

// The outputs of the channel kernels: x viewed as [outer, C, P], tiles of ff.tc channels.
struct FkChanOut {
  float* y = nullptr;        // values (float32, x's layout), or null
  uint8_t* codes = nullptr;  // codes, one byte per element (x's layout), or null
  uint8_t* scale = nullptr;  // scale codes, one byte per tile ([outer, nC, P]), or null
  int64_t C = 0, P = 1, nC = 0;
};

// The channel kernels: every tile of outer index o at inner positions [p0, p1); slow(ctx,
// moved row o * P + p, first channel) casts a tile the fast path refuses.
using FastChans = void (*)(const FastFormat&, const float*, const FkChanOut&, int64_t, int64_t,
                           int64_t, void (*)(void*, int64_t, int64_t), void*);

// The channel kernels of an instruction set (fast_rows_level).
FastChans fast_chans_for(int level);

// Casts a float32 tensor tiled along a non-last axis through the channel kernels, in parallel;
// false (nothing written) when they do not apply and the general path must run.
bool cast_fast_channels(const Ctx& c, const ParallelFor& pf);

}  // namespace onnxq::kern
