// cuda_driver.cpp -- the CUDA Driver API through dlopen (see cuda_driver.h). The few types and
// constants used are declared here from the driver's documented ABI, so building needs no CUDA
// headers either.
#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "jit/ir.h"

namespace dynamo::gpu {

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using Ptr = void *;
constexpr int kComputeMajor = 75, kComputeMinor = 76;     // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
constexpr int kInfoLog = 3, kInfoLogSize = 4, kErrorLog = 5, kErrorLogSize = 6;  // CUjit_option

// Entry points, by the names the driver exports (versioned where the API macro renames them).
struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(Ptr *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
  CUresult (*cuCtxSetCurrent)(Ptr);
  CUresult (*cuCtxGetCurrent)(Ptr *);
  CUresult (*cuStreamCreate)(Ptr *, unsigned);
  CUresult (*cuStreamDestroy_v2)(Ptr);
  CUresult (*cuStreamSynchronize)(Ptr);
  CUresult (*cuModuleLoadDataEx)(Ptr *, const void *, unsigned, int *, void **);
  CUresult (*cuModuleUnload)(Ptr);
  CUresult (*cuModuleGetFunction)(Ptr *, Ptr, const char *);
  CUresult (*cuLaunchKernel)(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Ptr, void **,
                             void **);
  CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree_v2)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t);
  CUresult (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr, CUdeviceptr, size_t, Ptr);
  CUresult (*cuMemsetD8_v2)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuMemsetD32_v2)(CUdeviceptr, unsigned, size_t);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuGetErrorString)(CUresult, const char **);
  CUresult (*cuEventCreate)(Ptr *, unsigned);
  CUresult (*cuEventRecord)(Ptr, Ptr);
  CUresult (*cuEventSynchronize)(Ptr);
  CUresult (*cuEventElapsedTime)(float *, Ptr, Ptr);
  CUresult (*cuEventDestroy_v2)(Ptr);
};

struct Loaded {
  Api api{};
  std::string error;  // empty when usable
};

const Loaded &driver() {
  static Loaded d;
  static std::once_flag once;
  std::call_once(once, [] {
    const char *env = getenv("DYNAMO_LIBCUDA");
    std::string path = env && *env ? env : "libcuda.so.1";
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      d.error = "no device: cannot open " + path + " (" + (e ? e : "unknown error") + ")";
      return;
    }
    auto need = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && d.error.empty()) d.error = "no device: " + path + " lacks " + name + " (driver too old?)";
    };
    Api &a = d.api;
    need(a.cuInit, "cuInit");
    need(a.cuDeviceGetCount, "cuDeviceGetCount");
    need(a.cuDeviceGet, "cuDeviceGet");
    need(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    need(a.cuDeviceGetName, "cuDeviceGetName");
    need(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    need(a.cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2");
    need(a.cuCtxSetCurrent, "cuCtxSetCurrent");
    need(a.cuCtxGetCurrent, "cuCtxGetCurrent");
    need(a.cuStreamCreate, "cuStreamCreate");
    need(a.cuStreamDestroy_v2, "cuStreamDestroy_v2");
    need(a.cuStreamSynchronize, "cuStreamSynchronize");
    need(a.cuModuleLoadDataEx, "cuModuleLoadDataEx");
    need(a.cuModuleUnload, "cuModuleUnload");
    need(a.cuModuleGetFunction, "cuModuleGetFunction");
    need(a.cuLaunchKernel, "cuLaunchKernel");
    need(a.cuMemAlloc_v2, "cuMemAlloc_v2");
    need(a.cuMemFree_v2, "cuMemFree_v2");
    need(a.cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2");
    need(a.cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2");
    need(a.cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync_v2");
    need(a.cuMemsetD8_v2, "cuMemsetD8_v2");
    need(a.cuMemsetD32_v2, "cuMemsetD32_v2");
    need(a.cuCtxSynchronize, "cuCtxSynchronize");
    need(a.cuGetErrorString, "cuGetErrorString");
    need(a.cuEventCreate, "cuEventCreate");
    need(a.cuEventRecord, "cuEventRecord");
    need(a.cuEventSynchronize, "cuEventSynchronize");
    need(a.cuEventElapsedTime, "cuEventElapsedTime");
    need(a.cuEventDestroy_v2, "cuEventDestroy_v2");
    if (!d.error.empty()) return;
    CUresult r = a.cuInit(0);
    int n = 0;
    if (r == 0) r = a.cuDeviceGetCount(&n);
    if (r != 0 || n == 0) {
      const char *s = nullptr;
      if (r != 0) a.cuGetErrorString(r, &s);
      d.error = "no device: cuInit/cuDeviceGetCount: " + std::string(r ? (s ? s : "error " + std::to_string(r)) : "0 devices");
    }
  });
  return d;
}

const Api &api() {
  const Loaded &d = driver();
  if (!d.error.empty()) jit::fail(jit::ErrorCode::Unsupported, d.error);
  return d.api;
}

void check(CUresult r, const char *call) {
  if (r == 0) return;
  const char *s = nullptr;
  api().cuGetErrorString(r, &s);
  jit::fail(jit::ErrorCode::Runtime, std::string(call) + " failed: " + (s ? s : "error " + std::to_string(r)));
}

// The driver keeps the current context per thread, and other code on the thread (torch, other
// devices) may change it: every Device call makes its own context current first.
void make_current(Ptr ctx) {
  Ptr cur = nullptr;
  if (api().cuCtxGetCurrent(&cur) == 0 && cur == ctx) return;
  check(api().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

}  // namespace

bool cuda_driver_available(std::string *why) {
  const Loaded &d = driver();
  if (!d.error.empty() && why) *why = d.error;
  return d.error.empty();
}

struct Device::Module {
  std::shared_ptr<Device> keep;  // the context outlives the module
  Ptr handle = nullptr;
  ~Module() {
    if (handle) api().cuModuleUnload(handle);
  }
};

std::shared_ptr<Device> Device::open(int index) {
  const Api &a = api();
  int n = 0;
  check(a.cuDeviceGetCount(&n), "cuDeviceGetCount");
  if (index < 0 || index >= n)
    jit::fail(jit::ErrorCode::Unsupported, "no device: CUDA device " + std::to_string(index) + " does not exist (" +
                                               std::to_string(n) + " present)");
  std::shared_ptr<Device> d(new Device());
  d->index_ = index;
  check(a.cuDeviceGet(&d->device_, index), "cuDeviceGet");
  int major = 0, minor = 0;
  check(a.cuDeviceGetAttribute(&major, kComputeMajor, d->device_), "cuDeviceGetAttribute");
  check(a.cuDeviceGetAttribute(&minor, kComputeMinor, d->device_), "cuDeviceGetAttribute");
  d->arch_ = "sm_" + std::to_string(major) + std::to_string(minor);
  check(a.cuDevicePrimaryCtxRetain(&d->context_, d->device_), "cuDevicePrimaryCtxRetain");
  make_current(d->context_);
  check(a.cuStreamCreate(&d->stream_, 0), "cuStreamCreate");
  return d;
}

Device::~Device() {
  const Loaded &d = driver();
  if (!d.error.empty()) return;
  if (context_) d.api.cuCtxSetCurrent(context_);  // the stream is destroyed in its own context
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (context_ && pool_bytes_) trim_pool();
  }
  if (stream_) d.api.cuStreamDestroy_v2(stream_);
  if (context_) d.api.cuDevicePrimaryCtxRelease_v2(device_);
}

std::string Device::name() const {
  char buf[256] = "";
  check(api().cuDeviceGetName(buf, sizeof buf, device_), "cuDeviceGetName");
  return buf;
}

std::shared_ptr<Device::Module> Device::load(const std::string &ptx) {
  const Api &a = api();
  make_current(context_);
  char info[4096] = "", err[4096] = "";
  int opts[4] = {kInfoLog, kInfoLogSize, kErrorLog, kErrorLogSize};
  void *vals[4] = {info, reinterpret_cast<void *>(sizeof info), err, reinterpret_cast<void *>(sizeof err)};
  auto m = std::make_shared<Module>();
  CUresult r = a.cuModuleLoadDataEx(&m->handle, ptx.c_str(), 4, opts, vals);
  if (r != 0) {
    m->handle = nullptr;
    const char *s = nullptr;
    a.cuGetErrorString(r, &s);
    jit::fail(jit::ErrorCode::Compile, std::string("cuModuleLoadDataEx failed: ") + (s ? s : std::to_string(r)) +
                                           (err[0] ? std::string("\n") + err : std::string()));
  }
  return m;
}

void *Device::function(Module &m, const std::string &kernel) {
  make_current(context_);
  Ptr fn = nullptr;
  check(api().cuModuleGetFunction(&fn, m.handle, kernel.c_str()), ("cuModuleGetFunction(" + kernel + ")").c_str());
  return fn;
}

void Device::launch(void *fn, unsigned grid, unsigned block, std::vector<void *> params) {
  make_current(context_);
  check(api().cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream_, params.data(), nullptr), "cuLaunchKernel");
}

void Device::launch(Module &m, const std::string &kernel, unsigned grid, unsigned block, std::vector<void *> params) {
  launch(function(m, kernel), grid, block, std::move(params));
}

double Device::time_ms(const std::function<void()> &enqueue) {
  const Api &a = api();
  make_current(context_);
  Ptr start = nullptr, stop = nullptr;
  check(a.cuEventCreate(&start, 0), "cuEventCreate");
  check(a.cuEventCreate(&stop, 0), "cuEventCreate");
  float ms = 0;
  try {
    check(a.cuEventRecord(start, stream_), "cuEventRecord");
    enqueue();
    check(a.cuEventRecord(stop, stream_), "cuEventRecord");
    check(a.cuEventSynchronize(stop), "cuEventSynchronize");
    check(a.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
  } catch (...) {
    a.cuEventDestroy_v2(start);
    a.cuEventDestroy_v2(stop);
    throw;
  }
  a.cuEventDestroy_v2(start);
  a.cuEventDestroy_v2(stop);
  return ms;
}

void Device::activate() { make_current(context_); }

void Device::synchronize() {
  make_current(context_);
  check(api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

uint64_t Device::alloc(size_t bytes) {
  make_current(context_);
  CUdeviceptr p = 0;
  check(api().cuMemAlloc_v2(&p, bytes ? bytes : 1), "cuMemAlloc_v2");
  return p;
}

void Device::free(uint64_t dptr) {
  make_current(context_);
  if (dptr) check(api().cuMemFree_v2(dptr), "cuMemFree_v2");
}

void Device::copy_to_device(uint64_t dst, const void *src, size_t bytes) {
  make_current(context_);
  if (bytes) check(api().cuMemcpyHtoD_v2(dst, src, bytes), "cuMemcpyHtoD_v2");
}

void Device::copy_to_host(void *dst, uint64_t src, size_t bytes) {
  make_current(context_);
  if (bytes) check(api().cuMemcpyDtoH_v2(dst, src, bytes), "cuMemcpyDtoH_v2");
}

void Device::copy_on_device(uint64_t dst, uint64_t src, size_t bytes) {
  make_current(context_);
  if (bytes) check(api().cuMemcpyDtoDAsync_v2(dst, src, bytes, stream_), "cuMemcpyDtoDAsync_v2");  // ordered with launches
}

void Device::zero(uint64_t dst, size_t bytes) {
  make_current(context_);
  if (bytes) check(api().cuMemsetD8_v2(dst, 0, bytes), "cuMemsetD8_v2");
}

void Device::fill32(uint64_t dst, uint32_t bits, size_t count) {
  make_current(context_);
  if (count) check(api().cuMemsetD32_v2(dst, bits, count), "cuMemsetD32_v2");
}

// -- the output pool ----------------------------------------------------------------------------

size_t Device::pool_size_class(size_t bytes) {
  if (bytes <= 512) return 512;
  if (bytes <= (size_t(1) << 20)) {  // powers of two up to 1 MiB
    size_t c = 1024;
    while (c < bytes) c <<= 1;
    return c;
  }
  const size_t step = size_t(2) << 20;  // then whole 2 MiB pages
  return (bytes + step - 1) / step * step;
}

size_t Device::pool_limit() {
  static const size_t limit = [] {
    const char *e = getenv("DYNAMO_GPU_POOL_MB");
    return (e && *e ? (size_t)strtoull(e, nullptr, 10) : size_t(1024)) << 20;
  }();
  return limit;
}

uint64_t Device::acquire(size_t bytes) {
  const size_t c = pool_size_class(bytes);
  std::lock_guard<std::mutex> lock(pool_mu_);
  auto take = [&](std::map<size_t, std::vector<uint64_t>> &from) -> uint64_t {
    auto it = from.find(c);
    if (it == from.end() || it->second.empty()) return 0;
    uint64_t p = it->second.back();
    it->second.pop_back();
    pool_bytes_ -= c;
    return p;
  };
  if (uint64_t p = take(ready_)) return p;  // (a block waiting since its release is not taken:
  make_current(context_);                    // work on another stream may still read it)
  CUdeviceptr p = 0;
  CUresult r = api().cuMemAlloc_v2(&p, c);
  if (r != 0 && pool_bytes_ > 0) {  // out of memory with blocks cached: give them back, try again
    trim_pool();
    make_current(context_);
    r = api().cuMemAlloc_v2(&p, c);
  }
  check(r, "cuMemAlloc_v2");
  return p;
}

void Device::release(uint64_t dptr, size_t bytes) {
  if (!dptr) return;
  const size_t c = pool_size_class(bytes);
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_bytes_ + c > pool_limit()) {
    make_current(context_);
    check(api().cuMemFree_v2(dptr), "cuMemFree_v2");  // (the driver waits for work using it)
    return;
  }
  pending_[c].push_back(dptr);
  pool_bytes_ += c;
}

void Device::synchronize_run() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  make_current(context_);
  bool waiting = false;
  for (auto &[c, v] : pending_) waiting = waiting || !v.empty();
  if (!waiting) {
    check(api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
    return;
  }
  // Every stream of the context is idle after this: the blocks handed back before it are free.
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");
  for (auto &[c, v] : pending_) {
    auto &r = ready_[c];
    r.insert(r.end(), v.begin(), v.end());
    v.clear();
  }
}

void Device::trim_pool() noexcept {  // pool_mu_ held
  try {
    make_current(context_);
    api().cuCtxSynchronize();
    for (auto *m : {&ready_, &pending_})
      for (auto &[c, v] : *m) {
        for (uint64_t p : v) api().cuMemFree_v2(p);
        v.clear();
      }
  } catch (...) {  // (the driver failed while giving memory back: nothing more to do)
  }
  pool_bytes_ = 0;
}

size_t Device::pool_cached_bytes() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  return pool_bytes_;
}

}  // namespace dynamo::gpu
