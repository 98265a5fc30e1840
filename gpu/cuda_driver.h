// cuda_driver.h -- the CUDA Driver API, opened with dlopen at first use (gpu/cuda_driver.cpp):
// nothing links against CUDA, so the library loads and every CPU feature works on machines
// without a driver. Versioned entry points (cuMemAlloc_v2, ...) are resolved by their real
// names. DYNAMO_LIBCUDA overrides the library path (tests use a stand-in driver).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dynamo::gpu {

// True if libcuda.so.1 can be opened and initialized with a device; otherwise *why (if not
// null) says what happened ("no device: ...").
bool cuda_driver_available(std::string *why);

// One device's primary context. Errors are thrown as jit::Error (NoDevice -> Unsupported with
// a "no device" message; driver calls that fail name the call and the driver's error string).
class Device {
 public:
  static std::shared_ptr<Device> open(int index);  // throws when unavailable
  ~Device();
  int index() const { return index_; }
  const std::string &arch() const { return arch_; }  // "sm_90"
  std::string name() const;

  // A loaded module (PTX JIT-compiled by the driver; its error log goes into the message).
  struct Module;
  std::shared_ptr<Module> load(const std::string &ptx);
  // Launches `kernel` of `m` with its .entry parameters packed as pointers to their values.
  void launch(Module &m, const std::string &kernel, unsigned grid, unsigned block, std::vector<void *> params);
  void *function(Module &m, const std::string &kernel);  // a kernel's handle, to launch repeatedly
  void launch(void *function, unsigned grid, unsigned block, std::vector<void *> params);
  // Milliseconds of device time taken by the work enqueue() puts on the stream (CUDA events).
  double time_ms(const std::function<void()> &enqueue);
  void synchronize();
  void activate();                            // makes this device's context current on the thread
  void *stream_handle() const { return stream_; }  // the CUstream its work goes on (library calls too)
  uint64_t alloc(size_t bytes);
  void free(uint64_t dptr);
  void copy_to_device(uint64_t dst, const void *src, size_t bytes);
  void copy_to_host(void *dst, uint64_t src, size_t bytes);
  void copy_on_device(uint64_t dst, uint64_t src, size_t bytes);  // on the stream (synchronize() waits)
  void zero(uint64_t dst, size_t bytes);
  void fill32(uint64_t dst, uint32_t bits, size_t count);  // count 4-byte words set to bits

  // The output pool (engine-allocated outputs, as the CPU engine's buffer pool): acquire gives
  // a block of at least `bytes` (a size class: 512 B, powers of two to 1 MiB, then 2 MiB
  // pages), from the pool or cuMemAlloc; release hands it back. A block handed back is not
  // reused until every stream of the context has been idle since (work on the caller's stream
  // may still read it): synchronize_run, the wait at the end of a run, is then one
  // cuCtxSynchronize instead of the stream's. Steady state, a caller that drops each call's
  // outputs before the next call: no allocation, two blocks per output. At most
  // DYNAMO_GPU_POOL_MB (default 1024) MiB are kept; past that a block is freed, and an
  // allocation that fails gives the pool's blocks back and tries again.
  uint64_t acquire(size_t bytes);
  void release(uint64_t dptr, size_t bytes);
  void synchronize_run();
  size_t pool_cached_bytes();
  static size_t pool_size_class(size_t bytes);

 private:
  Device() = default;
  int index_ = 0;
  int device_ = 0;
  void *context_ = nullptr;
  void *stream_ = nullptr;
  std::string arch_;
  std::mutex pool_mu_;
  std::map<size_t, std::vector<uint64_t>> ready_, pending_;  // by size class
  size_t pool_bytes_ = 0;
  static size_t pool_limit();
  void trim_pool() noexcept;
};

}  // namespace dynamo::gpu
