// openblas.cpp -- see openblas.h.
#include "runtime/openblas.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <mutex>

namespace dynamo::runtime {
namespace {

using GetThreads = int (*)();
using SetThreads = void (*)(int);

struct OpenBlas {
  GetThreads get = nullptr;
  SetThreads set = nullptr;
  CblasSgemm sgemm = nullptr;
};

// The OpenBLAS already mapped into the process (as libblas.so.3 through Debian's alternatives,
// or as libopenblas*.so): RTLD_NOLOAD hands back a loaded library and never loads a second one.
int find_openblas(struct dl_phdr_info *info, size_t, void *data) {
  const char *path = info->dlpi_name;
  if (!path || !*path) return 0;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (strncmp(base, "libopenblas", 11) != 0 && strncmp(base, "libblas", 7) != 0) return 0;
  void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  auto *ob = static_cast<OpenBlas *>(data);
  ob->get = reinterpret_cast<GetThreads>(dlsym(h, "openblas_get_num_threads"));
  ob->set = reinterpret_cast<SetThreads>(dlsym(h, "openblas_set_num_threads"));
  ob->sgemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  dlclose(h);  // drops the reference NOLOAD took; the library stays mapped (LibTorch needs it)
  if (ob->get && ob->set) return 1;
  *ob = OpenBlas{};
  return 0;
}

const OpenBlas &openblas() {
  static const OpenBlas ob = [] {
    OpenBlas o;
    dl_iterate_phdr(find_openblas, &o);
    return o;
  }();
  return ob;
}

std::mutex mu;
int depth = 0;  // holds now
int saved = 0;  // OpenBLAS's count before the first of them

}  // namespace

bool blas_hold(bool enter) {
  const OpenBlas &ob = openblas();
  std::lock_guard<std::mutex> lock(mu);
  if (enter) {
    if (depth++ == 0 && ob.get) {
      saved = ob.get();
      if (saved > 1) ob.set(1);
    }
    return true;
  }
  if (depth == 0) return false;
  if (--depth == 0 && ob.get && saved > 1) ob.set(saved);
  return true;
}

CblasSgemm openblas_sgemm() { return openblas().sgemm; }

int blas_threads() {
  const OpenBlas &ob = openblas();
  if (!ob.get) return 0;
  std::lock_guard<std::mutex> lock(mu);
  return depth ? saved : ob.get();
}

}  // namespace dynamo::runtime
