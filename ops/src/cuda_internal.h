// What the CUDA launchers share (cuda_launch.cc defines it; cuda_lookup.cc uses it): errors,
// devices and their primary contexts, the kernel table, launches, stream-ordered scratch and
// the device bit packing. Not part of the library's interface (cuda_launch.h is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include "cuda_driver.h"
#include "cuda_launch.h"

namespace onnxq {
namespace cuda {
namespace detail {

extern const char* const kNoKernels;

// Thrown inside the launchers; `guarded` turns it into the message the API returns.
struct Error {
  std::string msg;
};

void check(CUresult r, const std::string& what);  // throws Error naming `what` on failure
void need_driver();                                // throws Error saying why there is none

// Every launch and cache access holds it (recursive: the packed calls nest the plain ones).
extern std::recursive_mutex g_mutex;

struct Device;
Device& device(int ordinal);  // its primary context retained on first use; g_mutex held

struct CtxScope {  // the device's primary context current on this thread for the call
  explicit CtxScope(CUcontext ctx);
  ~CtxScope();
  CtxScope(const CtxScope&) = delete;
  CtxScope& operator=(const CtxScope&) = delete;
};
CUcontext context_of(const Device& dv);

// The device ordinal of a device pointer; a host pointer is refused by name.
int device_of(const void* p, const char* what);
// Refuses a (non-null) pointer on another device than `dev`.
void same_device(const void* p, const char* what, int dev);

const AotKernel& aot_kernel(int k);

// A tensor's shape checked for the kernels (rank >= 1, dims >= 0, under 2^31 elements, the axis
// in range): the axis made non-negative, the element count and the elements after the axis.
struct Extent {
  int axis = 0;
  int64_t numel = 1, inner = 1;
};
Extent extent(int ndim, const int64_t* shape, int axis);

// What the launcher passes for each parameter role (cuda_launch.h Role).
constexpr int kPtrRoles = 16;  // kRoleX .. kRoleRows
struct Bind {
  const void* ptr[kPtrRoles] = {};  // by pointer role
  int64_t n_units = 0, n_chunks = 0, C = 0, TC = 0, inner = 1, nC = 0, sub_cols = 1;
  int64_t count = 0, nbytes = 0;
  int64_t n_tiles = 0, code_nbytes = 0, meta_nbytes = 0, numel = 0;  // fast path, tensor amax
  int64_t nsub = 1, sub = 0, s_bias = 0, s_nan = 0, s_mask = 0, ib = 0, nmap = 1;  // codebooks
  int64_t rmode = 0, nan_nf = 0, full_int = 0, bump_t = 0;  // general quantize: mode numbers
  int64_t row_bits = 0;                                      // GatherMX's row copy
};
// Queues kernel k on `stream` (g_mutex held, the device's context current).
void launch(Device& dv, int k, const Bind& b, CUstream stream);

// Stream-ordered scratch memory, freed on the stream when the call ends.
struct Scratch {
  CUdeviceptr p = 0;
  CUstream stream = nullptr;
  Scratch(size_t bytes, CUstream s);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// Device bit packing (cuda_launch.h pack_bits / unpack_bits), throwing Error.
std::string pack_impl(bool pack, const void* in, int64_t count, int bits, void* out,
                      void* stream);

// fn()'s result, or the message of what it threw: no exception leaves the launchers.
template <typename Fn>
std::string guarded(Fn fn) {
  try {
    return fn();
  } catch (const Error& e) {
    return e.msg.empty() ? std::string("unknown error") : e.msg;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace onnxq
