// Host <-> device copies on a stream (cuda_launch.h): what the custom ops' host fallback needs to
// run the CPU kernels on a CUDA execution provider's tensors (ort_kernel_cuda.cc).
#include <cstdint>
#include <mutex>
#include <string>

#include "cuda_internal.h"

namespace onnxq {
namespace cuda {

using namespace detail;

namespace {

// fn(driver) with the primary context of the device that owns `device_ptr` current.
template <typename Fn>
std::string on_device_of(const void* device_ptr, const char* what, Fn fn) {
  return guarded([&] {
    need_driver();
    const Driver& d = driver();
    if (!d.cuMemcpyDtoHAsync || !d.cuMemcpyHtoDAsync || !d.cuStreamSynchronize)
      throw Error{"this CUDA driver lacks cuMemcpyDtoHAsync, cuMemcpyHtoDAsync or "
                  "cuStreamSynchronize"};
    const int dev = device_of(device_ptr, what);
    CUcontext ctx = nullptr;
    {
      std::lock_guard<std::recursive_mutex> lock(g_mutex);  // the device table only
      ctx = context_of(device(dev));
    }
    CtxScope scope(ctx);  // the waits below hold no lock: other threads launch meanwhile
    fn(d);
    return std::string();
  });
}

CUdeviceptr address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

std::string copy_to_host(void* host, const void* device, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  CUstream s = static_cast<CUstream>(stream);
  return on_device_of(device, "the input", [&](const Driver& d) {
    check(d.cuMemcpyDtoHAsync(host, address(device), bytes, s), "cuMemcpyDtoHAsync");
    check(d.cuStreamSynchronize(s), "cuStreamSynchronize");
  });
}

std::string copy_to_device(void* device, const void* host, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  CUstream s = static_cast<CUstream>(stream);
  return on_device_of(device, "the output", [&](const Driver& d) {
    check(d.cuMemcpyHtoDAsync(address(device), host, bytes, s), "cuMemcpyHtoDAsync");
  });
}

std::string synchronize(const void* on, void* stream) {
  CUstream s = static_cast<CUstream>(stream);
  return on_device_of(on, "the output", [&](const Driver& d) {
    check(d.cuStreamSynchronize(s), "cuStreamSynchronize");
  });
}

}  // namespace cuda
}  // namespace onnxq
