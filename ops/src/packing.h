// packing.py's LSB-first bit streams, internal pieces (the API is in kernels.h).
#pragma once

#include <cstdint>

namespace onnxq::kern {

// Codes [i0, i1) (i0 a multiple of 8: the stream is byte aligned there) into the stream.
void pack_range(const void* codes, int width, int64_t i0, int64_t i1, int bits, uint8_t* out);

}  // namespace onnxq::kern
