// float16 / bfloat16 <-> float32 arrays (half_convert.h): a scalar loop on number.h's
// conversions, and AVX2 + F16C lanes for the bulk where the CPU has them.
#include "half_convert.h"

#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu_features.h"
#include "number.h"

namespace onnxq::kern {
namespace {

constexpr uint32_t kQuiet = 0x7FC00000u;  // store_y's NaN

// Elements [i0, n) one at a time. Always inlined: in the AVX2 functions' tails the loop is
// then VEX code too (a call into SSE-encoded code costs a state transition, hundreds of
// cycles on some CPUs, per call, and channel runs are short).
__attribute__((always_inline)) inline void widen_scalar(const uint16_t* src, float* dst,
                                                        int64_t i0, int64_t n, bool bf16) {
  for (int64_t i = i0; i < n; ++i) dst[i] = bf16 ? bf16_to_float(src[i]) : half_to_float(src[i]);
}

__attribute__((always_inline)) inline void narrow_scalar(const float* src, uint16_t* dst,
                                                         int64_t i0, int64_t n, bool bf16) {
  for (int64_t i = i0; i < n; ++i) {
    float v = src[i];
    if (v != v) std::memcpy(&v, &kQuiet, sizeof v);
    dst[i] = bf16 ? float_to_bf16(v) : float_to_half(v);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

// Eight float16 to float32: F16C, except that F16C quiets a signalling NaN, where
// half_to_float keeps the payload as it is; those lanes are rebuilt from the bits.
inline __m256 widen8_half(__m128i h) {
  __m256 f = _mm256_cvtph_ps(h);
  __m256i w = _mm256_cvtepu16_epi32(h);
  __m256i exp = _mm256_and_si256(w, _mm256_set1_epi32(0x7C00));
  __m256i man = _mm256_and_si256(w, _mm256_set1_epi32(0x03FF));
  __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(man, _mm256_setzero_si256()),
                                    _mm256_cmpeq_epi32(exp, _mm256_set1_epi32(0x7C00)));
  __m256i bits = _mm256_or_si256(
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                      _mm256_set1_epi32(0x7F800000)),
      _mm256_slli_epi32(man, 13));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
}

// Eight float32 to bfloat16 (float_to_bf16, with NaN already the quiet NaN: 0x7FC0).
inline __m128i narrow8_bf16(__m256i x) {
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  __m256i packed = _mm256_packus_epi32(r, r);  // per 128-bit lane: lanes 0-3, 0-3, 4-7, 4-7
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// NaN lanes of x replaced by the quiet NaN (x compared with itself).
inline __m256 quiet_nans(__m256 x) {
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kQuiet))),
                          nan);
}

void widen_avx2(const uint16_t* src, float* dst, int64_t n, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256 f = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    : widen8_half(h);
    _mm256_storeu_ps(dst + i, f);
  }
  widen_scalar(src, dst, i, n, bf16);
}

void narrow_avx2(const float* src, uint16_t* dst, int64_t n, bool bf16) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = quiet_nans(_mm256_loadu_ps(src + i));
    // F16C rounds to nearest even (immediate, not MXCSR) and overflows to infinity, as
    // float_to_half does; a float32 subnormal becomes a signed zero in float16 either way.
    __m128i h = bf16 ? narrow8_bf16(_mm256_castps_si256(v))
                     : _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  narrow_scalar(src, dst, i, n, bf16);
}

#pragma GCC pop_options

#endif

}  // namespace

bool half_vectors() {
#if defined(__x86_64__) && defined(__GNUC__)
  return simd_level(false) >= 1 && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

void widen_to_f32(const uint16_t* src, float* dst, int64_t n, bool bf16, bool vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (vectors) return widen_avx2(src, dst, n, bf16);
#else
  (void)vectors;
#endif
  widen_scalar(src, dst, 0, n, bf16);
}

void narrow_from_f32(const float* src, uint16_t* dst, int64_t n, bool bf16, bool vectors) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (vectors) return narrow_avx2(src, dst, n, bf16);
#else
  (void)vectors;
#endif
  narrow_scalar(src, dst, 0, n, bf16);
}

}  // namespace onnxq::kern
