// The CUDA driver library through dlopen (cuda_driver.h).
#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace onnxq {
namespace cuda {
namespace {

template <typename F>
bool resolve(void* h, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  return *fn != nullptr;
}

Driver load_driver() {
  Driver d;
  const char* env = std::getenv("ONNXQ_LIBCUDA");  // tests: another (or a missing) driver
  const char* path = env && *env ? env : "libcuda.so.1";
  d.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!d.handle) {
    const char* e = dlerror();
    d.error = std::string("the CUDA driver library ") + path +
              " cannot be loaded (no NVIDIA driver on this machine?): " + (e ? e : "unknown");
    return d;
  }
  bool ok = resolve(d.handle, "cuInit", &d.cuInit) &&
            resolve(d.handle, "cuDriverGetVersion", &d.cuDriverGetVersion) &&
            resolve(d.handle, "cuDeviceGetCount", &d.cuDeviceGetCount) &&
            resolve(d.handle, "cuDeviceGet", &d.cuDeviceGet) &&
            resolve(d.handle, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute) &&
            resolve(d.handle, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) &&
            resolve(d.handle, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent) &&
            resolve(d.handle, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent) &&
            resolve(d.handle, "cuPointerGetAttribute", &d.cuPointerGetAttribute) &&
            resolve(d.handle, "cuModuleLoadData", &d.cuModuleLoadData) &&
            resolve(d.handle, "cuModuleGetFunction", &d.cuModuleGetFunction) &&
            resolve(d.handle, "cuFuncSetAttribute", &d.cuFuncSetAttribute) &&
            resolve(d.handle, "cuLaunchKernel", &d.cuLaunchKernel) &&
            resolve(d.handle, "cuMemAlloc_v2", &d.cuMemAlloc) &&
            resolve(d.handle, "cuMemcpyHtoD_v2", &d.cuMemcpyHtoD) &&
            resolve(d.handle, "cuGetErrorName", &d.cuGetErrorName) &&
            resolve(d.handle, "cuGetErrorString", &d.cuGetErrorString);
  if (!ok) {
    d.error = std::string("the CUDA driver ") + path + " lacks a function onnxq needs";
    return d;
  }
  resolve(d.handle, "cuMemAllocAsync", &d.cuMemAllocAsync);  // CUDA 11.2+; NVFP4 needs them
  resolve(d.handle, "cuMemFreeAsync", &d.cuMemFreeAsync);
  resolve(d.handle, "cuMemsetD32Async", &d.cuMemsetD32Async);
  resolve(d.handle, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync);  // codebook tables
  // the custom ops' host fallback (cuda_copy.cc)
  resolve(d.handle, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync);
  resolve(d.handle, "cuStreamSynchronize", &d.cuStreamSynchronize);
  CUresult r = d.cuInit(0);
  if (r != 0) {
    d.error = "cuInit failed: " + err_text(d, r);
    return d;
  }
  d.cuDriverGetVersion(&d.version);
  r = d.cuDeviceGetCount(&d.device_count);
  if (r != 0) {
    d.error = "cuDeviceGetCount failed: " + err_text(d, r);
  } else if (d.device_count == 0) {
    d.error = "the CUDA driver sees no device";
  }
  return d;
}

}  // namespace

std::string err_text(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  std::string s = name ? name : "CUDA error " + std::to_string(r);
  if (text) s += std::string(": ") + text;
  return s;
}

const Driver& driver() {
  static const Driver d = load_driver();  // thread-safe one-time initialisation
  return d;
}

}  // namespace cuda
}  // namespace onnxq
