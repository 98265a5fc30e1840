/* fake_cuda.c -- a stand-in for libcuda.so.1 on machines without NVIDIA's driver, to test how
 * dynamo loads the driver (versioned names, missing entry points, no device, one device) and
 * drives it (module load, launch shapes, memory). It runs no kernels but the side-exit check
 * (see cuLaunchKernel). FAKE_CUDA_DEVICES: number
 * of devices (default 1). Built twice: with -DFAKE_CUDA_OLD it lacks cuMemAlloc_v2, like a
 * driver older than the API dynamo uses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
static int devices(void) {
  const char *e = getenv("FAKE_CUDA_DEVICES");
  return e ? atoi(e) : 1;
}
CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = devices(); return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return i < devices() ? 0 : 101; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { (void)d; *v = attr == 75 ? 9 : 0; return 0; }
CUresult cuDeviceGetName(char *buf, int len, int d) { (void)d; strncpy(buf, "Fake GPU", (size_t)len); return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
/* The current context is per thread, as in the driver; calls that need one fail without it
 * (CUDA_ERROR_INVALID_CONTEXT), so a Device used from a new thread must make it current. */
static __thread void *g_current;
#define NEED_CONTEXT() do { if (!g_current) return 201; } while (0)
CUresult cuCtxSetCurrent(void *c) { g_current = c; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = g_current; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = (void *)0x2; return 0; }
CUresult cuStreamDestroy_v2(void *s) { (void)s; return 0; }
static int g_stream_syncs;
int fake_cuda_stream_syncs(void) { return g_stream_syncs; }  /* waits for the stream, for tests */
CUresult cuStreamSynchronize(void *s) { (void)s; ++g_stream_syncs; return 0; }
/* Modules "load" when the image is PTX with an .entry (FAKE_CUDA_BAD_PTX=1: refused, with a
 * JIT log); functions are their names; launches run nothing (but the exit check) and are appended to a log that
 * tests read with fake_cuda_log(). Device memory is host memory, so copies are memcpy. */
static char g_log[1 << 16];
const char *fake_cuda_log(void) { return g_log; }
void fake_cuda_clear_log(void) { g_log[0] = 0; }
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *o, void **v) {
  if (getenv("FAKE_CUDA_BAD_PTX") || !strstr((const char *)img, ".entry")) {
    for (unsigned k = 0; k < n; ++k)
      if (o[k] == 5) strncpy((char *)v[k], "ptxas fatal   : fake JIT failure for the test", 64);
    return 218; /* CUDA_ERROR_INVALID_PTX */
  }
  *m = (void *)0x4;
  return 0;
}
CUresult cuModuleUnload(void *m) { (void)m; return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  (void)m;
  *f = strdup(name);
  return 0;
}
/* One kernel is run: the side-exit check (gpu/lower_ptx.cpp emit_exit_check), whose whole body
 * is "if (*cond != expected && *status == 0) *status = code", so that the device's exit path
 * (status word, live values copied out) can be tested here; every other kernel does nothing. */
static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}
CUresult cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned h,
                        void *s, void **p, void **x) {
  NEED_CONTEXT();
  (void)b; (void)c; (void)e; (void)g; (void)h; (void)s; (void)x;
  size_t at = strlen(g_log);
  if (ends_with((const char *)f, "_exit_check")) {
    const uint8_t *cond = (const uint8_t *)(uintptr_t)*(unsigned long long *)p[0];
    int32_t expected = *(int32_t *)p[1], code = *(int32_t *)p[2];
    int32_t *status = (int32_t *)(uintptr_t)*(unsigned long long *)p[3];
    if ((*cond != 0) != expected && *status == 0) *status = code;
    snprintf(g_log + at, sizeof g_log - at, "%s grid=%u block=%u code=%d\n", (const char *)f, a, d, code);
    return 0;
  }
  snprintf(g_log + at, sizeof g_log - at, "%s grid=%u block=%u n=%lld\n", (const char *)f, a, d, *(long long *)p[1]);
  return 0;
}
/* Counts of the calls a run's cost is made of, for tests (fake_cuda_counts). */
static int g_allocs, g_frees, g_memsets, g_reads, g_ctx_syncs;
void fake_cuda_counts(int *allocs, int *frees, int *memsets, int *reads, int *ctx_syncs) {
  *allocs = g_allocs, *frees = g_frees, *memsets = g_memsets, *reads = g_reads, *ctx_syncs = g_ctx_syncs;
}
CUresult cuCtxSynchronize(void) { NEED_CONTEXT(); ++g_ctx_syncs; return 0; }
#ifndef FAKE_CUDA_OLD
CUresult cuMemAlloc_v2(unsigned long long *p, size_t n) {
  NEED_CONTEXT();
  ++g_allocs;
  void *m = malloc(n ? n : 1);
  *p = (unsigned long long)(uintptr_t)m;
  return m ? 0 : 2;
}
#endif
CUresult cuMemFree_v2(unsigned long long p) { ++g_frees; free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(unsigned long long d, const void *s, size_t n) { NEED_CONTEXT(); memcpy((void *)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, unsigned long long s, size_t n) { ++g_reads; memcpy(d, (void *)(uintptr_t)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n, void *st) {
  (void)st;
  memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
  return 0;
}
CUresult cuMemsetD8_v2(unsigned long long d, unsigned char v, size_t n) { ++g_memsets; memset((void *)(uintptr_t)d, v, n); return 0; }
CUresult cuMemsetD32_v2(unsigned long long d, unsigned v, size_t n) {
  ++g_memsets;
  for (size_t k = 0; k < n; ++k) memcpy((char *)(uintptr_t)d + 4 * k, &v, 4);
  return 0;
}
CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = (void *)0x3; return 0; }
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 0; return 0; }
CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == 218 ? "a PTX JIT compilation failed" : "fake driver error";
  return 0;
}
