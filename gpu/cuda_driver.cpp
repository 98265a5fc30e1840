// cuda_driver.cpp -- the CUDA driver, opened with dlopen at first use so the library loads and
// all CPU features work on machines without a GPU. (The NVPTX backend is issue 6.)
#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace dynamo::gpu {

// Returns true if libcuda.so.1 can be opened; otherwise *why says what happened.
bool cuda_driver_available(std::string *why) {
  static std::once_flag once;
  static void *handle = nullptr;
  static std::string err;
  std::call_once(once, [] {
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char *e = dlerror();
      err = std::string("no device: cannot open libcuda.so.1 (") + (e ? e : "unknown error") + ")";
    }
  });
  if (!handle && why) *why = err;
  return handle != nullptr;
}

}  // namespace dynamo::gpu
