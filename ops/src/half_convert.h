// float16 / bfloat16 arrays to and from float32, with number.h's bits (numpy and ml_dtypes:
// exact widening, round-to-nearest-even narrowing, NaN written as the quiet NaN first), in
// AVX2 + F16C where the CPU has them. The casts of half data run through the float32 kernels
// between the two.
#pragma once

#include <cstdint>

namespace onnxq::kern {

// Whether the conversions may use AVX2 + F16C: the CPU has them and ONNXQ_SIMD allows AVX2.
// It reads the environment: ask once per cast, not per row.
bool half_vectors();

// dst[i] = src[i] as float32 (exact: half_to_float / bf16_to_float).
void widen_to_f32(const uint16_t* src, float* dst, int64_t n, bool bf16, bool vectors);

// dst[i] = src[i] rounded to float16 or bfloat16 (float_to_half / float_to_bf16), every NaN
// first replaced by the positive quiet NaN (store_y's rule).
void narrow_from_f32(const float* src, uint16_t* dst, int64_t n, bool bf16, bool vectors);

}  // namespace onnxq::kern
