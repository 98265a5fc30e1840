// cuda_driver.h -- the CUDA Driver API, opened with dlopen at first use (gpu/cuda_driver.cpp):
// nothing links against CUDA, so the library loads and every CPU feature works on machines
// without a driver. Versioned entry points (cuMemAlloc_v2, ...) are resolved by their real
// names. DYNAMO_LIBCUDA overrides the library path (tests use a stand-in driver).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
  uint64_t alloc(size_t bytes);
  void free(uint64_t dptr);
  void copy_to_device(uint64_t dst, const void *src, size_t bytes);
  void copy_to_host(void *dst, uint64_t src, size_t bytes);
  void copy_on_device(uint64_t dst, uint64_t src, size_t bytes);  // on the stream (synchronize() waits)
  void zero(uint64_t dst, size_t bytes);

 private:
  Device() = default;
  int index_ = 0;
  int device_ = 0;
  void *context_ = nullptr;
  void *stream_ = nullptr;
  std::string arch_;
};

}  // namespace dynamo::gpu
