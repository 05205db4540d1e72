/* A stand-in for libcuda.so.1 that runs on the CPU, for tests (tests/cast/triton/fake_cuda.py).
 *
 * The library's CUDA path (ops/src/cuda_launch.cc, cuda_lookup.cc) loads the driver named by
 * ONNXQ_LIBCUDA. This one reports one sm_90 device whose memory is host memory: what
 * cuMemAlloc / cuMemAllocAsync return and what the test registers (fake_register) counts as
 * device memory, anything else is host memory (refused as the real driver's pointer query
 * refuses it). Copies and memsets happen at once; cuLaunchKernel hands the launch (the image,
 * its size, the entry name, the grid, the parameter slots) to the test's callback, which runs
 * the kernel in Triton's interpreter before the call returns. So the launcher's every decision
 * (kernel, parameters, grid, scratch, order of launches) is exercised without a GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { kMaxBlocks = 4096 };
static struct {
  CUdeviceptr base;
  size_t size;
  int owned; /* allocated here (freed by cuMemFree*Async) */
} g_blocks[kMaxBlocks];

/* fake_any_memory(1): every pointer counts as device memory for pointer queries and copies
 * (a real model's initializers live in onnxruntime's own buffers); launches still see only
 * the blocks (fake_cuda.Emulator bounds each kernel argument by its block). */
static int g_any_memory;
void fake_any_memory(int on) { g_any_memory = on; }

/* Bytes copied device -> host and host -> device, and stream synchronisations (fake_counts). */
static uint64_t g_counts[3];

typedef int (*launch_fn)(const void* image, uint64_t image_size, const char* name,
                         unsigned grid, void** params);
static launch_fn g_launch;

typedef struct {
  const void* image;
  char name[256];
} fake_function;

static int add_block(CUdeviceptr base, size_t size, int owned) {
  for (int i = 0; i < kMaxBlocks; ++i) {
    if (g_blocks[i].base == 0) {
      g_blocks[i].base = base;
      g_blocks[i].size = size;
      g_blocks[i].owned = owned;
      return 0;
    }
  }
  return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}

static int find_block(CUdeviceptr p) {
  for (int i = 0; i < kMaxBlocks; ++i)
    if (g_blocks[i].base && p >= g_blocks[i].base && p < g_blocks[i].base + g_blocks[i].size)
      return i;
  return -1;
}

/* -- the test's side -------------------------------------------------------------------------- */
void fake_set_launch(launch_fn fn) { g_launch = fn; }
int fake_register(CUdeviceptr base, uint64_t size) { return add_block(base, size, 0); }
/* The device block holding p: its base and size, or 0. */
int fake_find(CUdeviceptr p, CUdeviceptr* base, uint64_t* size) {
  int i = find_block(p);
  if (i < 0) return 0;
  *base = g_blocks[i].base;
  *size = g_blocks[i].size;
  return 1;
}

void fake_counts(uint64_t out[3]) { memcpy(out, g_counts, sizeof g_counts); }

/* The size of an ELF image (a cubin): its section or program headers, whichever come last,
 * end it. */
static uint64_t elf_size(const unsigned char* p) {
  if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return 0;
  uint64_t phoff, shoff;
  uint16_t phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3A, 2);
  memcpy(&shnum, p + 0x3C, 2);
  uint64_t ph = phoff + (uint64_t)phentsize * phnum, sh = shoff + (uint64_t)shentsize * shnum;
  return ph > sh ? ph : sh;
}

/* -- the driver API the library resolves ------------------------------------------------------ */
CUresult cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
CUresult cuDriverGetVersion(int* v) { *v = 12040; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(int* dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : 101; }
CUresult cuDeviceGetAttribute(int* v, int attr, int dev) {
  *v = attr == 75 ? 9 : 0; /* compute capability 9.0 */
  return dev == 0 ? 0 : 101;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  *ctx = (void*)&g_blocks;
  return dev == 0 ? 0 : 101;
}
CUresult cuCtxPushCurrent_v2(void* ctx) { return ctx ? 0 : 201; }
CUresult cuCtxPopCurrent_v2(void** ctx) {
  if (ctx) *ctx = (void*)&g_blocks;
  return 0;
}
CUresult cuPointerGetAttribute(void* out, int attr, CUdeviceptr p) {
  if (find_block(p) < 0 && !g_any_memory) return 1; /* CUDA_ERROR_INVALID_VALUE: not device memory */
  if (attr == 2) *(unsigned*)out = 2; /* CU_MEMORYTYPE_DEVICE */
  else if (attr == 9) *(int*)out = 0;  /* device ordinal */
  else return 1;
  return 0;
}
CUresult cuModuleLoadData(void** mod, const void* image) {
  *mod = (void*)image;
  return 0;
}
CUresult cuModuleGetFunction(void** fn, void* mod, const char* name) {
  fake_function* f = (fake_function*)calloc(1, sizeof *f);
  if (!f) return 2;
  f->image = mod;
  strncpy(f->name, name, sizeof f->name - 1);
  *fn = f;
  return 0;
}
CUresult cuFuncSetAttribute(void* fn, int attr, int value) { return 0; }
CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  const fake_function* f = (const fake_function*)fn;
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || extra || !g_launch) return 1;
  return g_launch(f->image, elf_size((const unsigned char*)f->image), f->name, gx, params);
}
static CUresult alloc(CUdeviceptr* p, size_t bytes) {
  /* 256-byte aligned, as cuMemAlloc's (onnxruntime's vector kernels expect at least 64) */
  size_t size = ((bytes ? bytes : 1) + 255) / 256 * 256;
  void* m = aligned_alloc(256, size);
  if (!m) return 2;
  memset(m, 0, size);
  *p = (CUdeviceptr)(uintptr_t)m;
  return add_block(*p, bytes ? bytes : 1, 1);
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) { return alloc(p, bytes); }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, void* stream) { return alloc(p, bytes); }
CUresult cuMemFreeAsync(CUdeviceptr p, void* stream) {
  int i = find_block(p);
  if (i < 0 || g_blocks[i].base != p || !g_blocks[i].owned) return 1;
  g_blocks[i].base = 0;
  free((void*)(uintptr_t)p);
  return 0;
}
static int in_blocks(CUdeviceptr p, size_t n) {
  return g_any_memory || (find_block(p) >= 0 && find_block(p + n - 1) >= 0);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  if (n == 0) return 0;
  if (!in_blocks(dst, n)) return 1;
  memcpy((void*)(uintptr_t)dst, src, n);
  return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
  CUresult r = cuMemcpyHtoD_v2(dst, src, n);
  if (r == 0) g_counts[1] += n;
  return r;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
  if (n == 0) return 0;
  if (!in_blocks(src, n)) return 1;
  memcpy(dst, (const void*)(uintptr_t)src, n);
  g_counts[0] += n;
  return 0;
}
CUresult cuStreamSynchronize(void* stream) {
  ++g_counts[2];
  return 0;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void* stream) {
  if (find_block(dst) < 0 || (n && find_block(dst + 4 * n - 1) < 0)) return 1;
  for (size_t i = 0; i < n; ++i) memcpy((char*)(uintptr_t)dst + 4 * i, &value, 4);
  return 0;
}
CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = "CUDA_ERROR_FAKE";
  return 0;
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = "an error of the fake driver";
  return 0;
}
