/* fake_cuda.c -- a stand-in for libcuda.so.1 on machines without NVIDIA's driver, to test how
 * dynamo loads the driver (versioned names, missing entry points, no device, one device). It
 * runs nothing. FAKE_CUDA_DEVICES: number of devices (default 1). Built twice: with
 * -DFAKE_CUDA_OLD it lacks cuMemAlloc_v2, like a driver older than the API dynamo uses. */
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
CUresult cuCtxSetCurrent(void *c) { (void)c; return 0; }
CUresult cuStreamCreate(void **s, unsigned f) { (void)f; *s = (void *)0x2; return 0; }
CUresult cuStreamDestroy_v2(void *s) { (void)s; return 0; }
CUresult cuStreamSynchronize(void *s) { (void)s; return 0; }
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *o, void **v) {
  (void)m; (void)img; (void)n; (void)o; (void)v;
  return 218; /* CUDA_ERROR_INVALID_PTX: this stand-in compiles nothing */
}
CUresult cuModuleUnload(void *m) { (void)m; return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { (void)f; (void)m; (void)name; return 500; }
CUresult cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g, unsigned h,
                        void *s, void **p, void **x) {
  (void)f; (void)a; (void)b; (void)c; (void)d; (void)e; (void)g; (void)h; (void)s; (void)p; (void)x;
  return 500;
}
#ifndef FAKE_CUDA_OLD
CUresult cuMemAlloc_v2(unsigned long long *p, size_t n) { (void)n; *p = 0; return 2; }
#endif
CUresult cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
CUresult cuMemcpyHtoD_v2(unsigned long long d, const void *s, size_t n) { (void)d; (void)s; (void)n; return 0; }
CUresult cuMemcpyDtoH_v2(void *d, unsigned long long s, size_t n) { (void)d; (void)s; (void)n; return 0; }
CUresult cuMemcpyDtoDAsync_v2(unsigned long long d, unsigned long long s, size_t n, void *st) {
  (void)d; (void)s; (void)n; (void)st; return 0;
}
CUresult cuMemsetD8_v2(unsigned long long d, unsigned char v, size_t n) { (void)d; (void)v; (void)n; return 0; }
CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = (void *)0x3; return 0; }
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 0; return 0; }
CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == 218 ? "a PTX JIT compilation failed" : "fake driver error";
  return 0;
}
