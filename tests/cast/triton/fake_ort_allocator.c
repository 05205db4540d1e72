/* Test helper (tests/cast/triton/run_emulated_model.py): an onnxruntime "custom op library" that
 * registers no op but an allocator for the environment, whose memory the fake driver
 * (fake_libcuda.c, loaded through ONNXQ_LIBCUDA) counts as device memory. A session with
 * session.use_env_allocators=1 then allocates every CPU tensor there, so the CUDA provider's
 * kernels, registered for the CPU provider under ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1, run on a
 * real model's intermediate tensors with the fake driver's bounds. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "onnxruntime_c_api.h"

typedef int (*alloc_fn)(unsigned long long*, size_t);
typedef int (*free_fn)(unsigned long long, void*);
static alloc_fn g_alloc;
static free_fn g_free;
static OrtMemoryInfo* g_info;
static OrtAllocator g_allocator;

static void* ORT_API_CALL device_alloc(OrtAllocator* self, size_t n) {
  unsigned long long p = 0;
  return g_alloc(&p, n) == 0 ? (void*)(uintptr_t)p : NULL;
}
static void ORT_API_CALL device_free(OrtAllocator* self, void* p) {
  if (p) g_free((unsigned long long)(uintptr_t)p, NULL);
}
static const OrtMemoryInfo* ORT_API_CALL device_info(const OrtAllocator* self) { return g_info; }

OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(16);
  if (g_info) return NULL; /* registered once, for every later session */
  const char* path = getenv("ONNXQ_LIBCUDA");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  if (h) {
    g_alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    g_free = (free_fn)dlsym(h, "cuMemFreeAsync");
  }
  if (!g_alloc || !g_free) return api->CreateStatus(ORT_FAIL, "ONNXQ_LIBCUDA names no fake driver");
  OrtEnv* env = NULL; /* the process's one environment (onnxruntime keeps a single instance) */
  OrtStatus* st = api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "onnxq-fake", &env);
  if (!st) st = api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &g_info);
  if (st) return st;
  g_allocator.version = 16;
  g_allocator.Alloc = device_alloc;
  g_allocator.Free = device_free;
  g_allocator.Info = device_info;
  return api->RegisterAllocator(env, &g_allocator);
}
