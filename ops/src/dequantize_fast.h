// The fast dequantize paths (dequantize_fast.cc).
#pragma once

#include "kernels.h"

namespace onnxq::kern {

// Codebook lookups of float32 tensors tiled along their last axis; false: the general path runs.
bool fast_cb_dequantize(const Format& f, const Geometry& g, const DequantizeIO& io,
                        const ParallelFor& pf);
// Exponent- and float-scaled codes of at most 8 bits; false: nothing done.
bool fast_dequantize(const Format& f, const Geometry& g, const DequantizeIO& io,
                     const ParallelFor& pf);

}  // namespace onnxq::kern
