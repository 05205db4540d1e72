// CPU feature detection and the environment switches of the fast paths (ONNXQ_SIMD,
// ONNXQ_DQ_STREAM).
#pragma once

#include <cstdint>

namespace onnxq::kern {

// Whether this thread's FPU flushes subnormals (x86 MXCSR flush-to-zero or
// denormals-are-zero); kernels that rely on float32 subnormal arithmetic then step aside.
inline bool fpu_flushes() {
#if defined(__x86_64__) || defined(__i386__)
  return (__builtin_ia32_stmxcsr() & 0x8040u) != 0;
#else
  return true;
#endif
}

// The widest instruction set this CPU has: 2 (AVX-512 F/BW/VL/DQ, and BMI2 where `bmi2`), 1
// (AVX2), 0 (baseline x86-64 or another architecture). ONNXQ_SIMD=base|avx2|avx512 caps it (for
// tests and comparisons); ONNXQ_SIMD=none is checked by each fast path's setup.
int simd_level(bool bmi2);

// Whether an output of `bytes` is written with streaming stores: ONNXQ_DQ_STREAM=0/1 forces it,
// else outputs over 8 MiB (far larger than the caches, so the read for ownership is wasted).
bool stream_output(int64_t bytes);

}  // namespace onnxq::kern
