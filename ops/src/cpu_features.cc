// CPU feature detection and the environment switches of the fast paths.
#include "cpu_features.h"

#include <cstdlib>
#include <string>

namespace onnxq::kern {

int simd_level(bool bmi2) {
  const char* cap = std::getenv("ONNXQ_SIMD");
  const std::string want = cap ? cap : "";
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                (!bmi2 || __builtin_cpu_supports("bmi2"));
  bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512 && (want.empty() || want == "avx512")) return 2;
  if (avx2 && (want.empty() || want == "avx512" || want == "avx2")) return 1;
#else
  (void)bmi2;
#endif
  return 0;
}

bool stream_output(int64_t bytes) {
  const char* env = std::getenv("ONNXQ_DQ_STREAM");
  return env ? env[0] == '1' : bytes > (int64_t(8) << 20);
}

}  // namespace onnxq::kern
