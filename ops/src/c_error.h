// The C ABI's error convention: a message copied into the caller's buffer, status 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace onnxq {

// Copies msg (cut to errlen - 1 bytes, NUL-terminated) into err when there is one; returns 1.
inline int32_t write_error(char* err, size_t errlen, const std::string& msg) {
  if (err && errlen) {
    size_t n = msg.size() < errlen - 1 ? msg.size() : errlen - 1;
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
  }
  return 1;
}

}  // namespace onnxq
