// bench_common.h -- shared pieces of the benchmarks: timing, the triad roofline, torch tensors as
// DLPack arguments, and compiling trace text.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dynamo.h"

namespace bench {

using Clock = std::chrono::steady_clock;

inline double median_ms(const std::function<void()> &fn, int reps) {
  for (int i = 0; i < 2; ++i) fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- What eager LibTorch runs with in this process (the baseline of every speedup) ----------

// The shared object that defines `sym` as the dynamic linker binds it for this process (the
// global scope: what LibTorch's own calls resolve to), "" if nothing defines it.
inline std::string defining_library(const char *sym) {
  void *addr = dlsym(RTLD_DEFAULT, sym);
  Dl_info info{};
  if (!addr || !dladdr(addr, &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

inline std::string real_path(const std::string &path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

inline bool contains_nocase(std::string s, const char *word) {
  for (char &ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s.find(word) != std::string::npos;
}

// Where LibTorch's BLAS calls go: after one at::mm (which binds the BLAS), the library that
// defines sgemm_, named: "OpenBLAS (...)", "reference BLAS (netlib) (...)", or its path.
inline std::string blas_name() {
  at::Tensor a = at::ones({8, 8});
  (void)at::mm(a, a);
  std::string path = defining_library("sgemm_");
  if (path.empty()) return "none found (no sgemm_ in the process: LibTorch's built-in GEMM)";
  std::string real = real_path(path);
  std::string where = real == path ? path : path + " -> " + real;
  if (contains_nocase(path, "openblas") || contains_nocase(real, "openblas")) return "OpenBLAS (" + where + ")";
  const char *netlib = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";  // Debian's reference BLAS
  if (path == netlib || real == netlib) return "reference BLAS (netlib) (" + where + ")";
  return where;
}

// glibc malloc's environment settings, if any ("" when none is set).
inline std::string glibc_malloc_env() {
  std::string s;
  for (const char *k : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_",
                        "MALLOC_ARENA_MAX", "GLIBC_TUNABLES"}) {
    const char *v = getenv(k);
    if (v) s += std::string(s.empty() ? "" : ", ") + k + "=" + v;
  }
  return s;
}

// The allocator behind malloc: jemalloc when `mallctl` resolves (LD_PRELOAD of libjemalloc),
// else glibc malloc.
inline bool allocator_is_jemalloc() { return dlsym(RTLD_DEFAULT, "mallctl") != nullptr; }

inline std::string allocator_name() {
  if (allocator_is_jemalloc()) return "jemalloc (" + defining_library("mallctl") + ")";
  std::string env = glibc_malloc_env();
  return env.empty() ? "glibc malloc (default settings)" : "glibc malloc, " + env;
}

// The "eager:" line every benchmark prints at the top, in the form of perf/baseline.py's.
inline std::string describe_eager() {
  return std::string("LibTorch ") + TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " threads, BLAS " +
         blas_name() + ", " + allocator_name();
}

// ---- Allocator settings for the large-tensor rows ----------------------------------------
//
// With glibc's default settings a block above the mmap threshold (dynamic: it rises to the
// size of the last freed mmapped block, at most 32 MB on 64-bit) is mmapped and unmapped on
// free, and the heap's top is trimmed back to the OS above the trim threshold (twice the mmap
// threshold): large eager temporaries are then page-faulted in anew on every call, an OS cost
// that can swamp a kernel comparison. The benchmarks report eager both ways: first every row
// with the defaults (as users run it), then, once, tuned -- tuning cannot be undone exactly,
// so it comes second, for the rest of the process.
//
// "Tuned" is MALLOC_MMAP_MAX_=0 and a large MALLOC_TRIM_THRESHOLD_, set with mallopt: every
// block comes from the heap and freed memory is kept for the next call. Return values are
// checked: mallopt reports a rejected setting only by returning 0 (older glibc releases reject
// an M_MMAP_THRESHOLD above 32 MB that way; Debian 12's glibc 2.36 accepts it).
struct AllocTuning {
  bool applied = false;  // both mallopt calls accepted
  std::string what;      // for the printout
};

constexpr int kTunedTrimThreshold = 1 << 30;  // 1 GB: freed heap memory is kept

inline AllocTuning tune_allocator() {
  AllocTuning t;
  if (allocator_is_jemalloc()) {
    t.what = "not applied (malloc is jemalloc)";
    return t;
  }
  int a = mallopt(M_MMAP_MAX, 0);
  int b = mallopt(M_TRIM_THRESHOLD, kTunedTrimThreshold);
  t.applied = a == 1 && b == 1;
  t.what = std::string("mallopt(M_MMAP_MAX, 0) ") + (a == 1 ? "ok" : "REJECTED") + ", mallopt(M_TRIM_THRESHOLD, " +
           std::to_string(kTunedTrimThreshold) + ") " + (b == 1 ? "ok" : "REJECTED");
  if (!t.applied) t.what += " -- the tuned column is NOT tuned";
  return t;
}

// Headers of the two eager columns, and the one-line legend printed above each table.
inline std::string eager_default_label() {
  return allocator_is_jemalloc() ? "eager (jemalloc)" : "eager (glibc default)";
}
inline std::string eager_tuned_label() {
  return allocator_is_jemalloc() ? "eager (jemalloc #2)" : "eager (glibc tuned)";
}
inline void print_eager_legend(const AllocTuning &t) {
  if (allocator_is_jemalloc())
    printf("legend: both eager columns run with jemalloc (glibc's tuning does not apply: the second column is a "
           "re-measurement); speedups are against the faster eager\n");
  else
    printf("legend: eager (glibc default) = glibc's default settings: blocks over the mmap threshold (<= 32 MB) "
           "are mmapped and the heap trimmed, so large temporaries can be page-faulted in on every call; "
           "eager (glibc tuned) = MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=%d (%s): freed memory kept, no page "
           "faults per call; speedups are against the faster eager\n",
           kTunedTrimThreshold, t.what.c_str());
}

// Process set-up shared by every benchmark: LibTorch's pool gets every core (eager and JIT
// both use it) unless OMP_NUM_THREADS says otherwise. The allocator keeps its defaults.
inline int setup() {
  const char *env = getenv("OMP_NUM_THREADS");
  if (!env || !*env) at::set_num_threads((int)std::thread::hardware_concurrency());
  return at::get_num_threads();
}

// STREAM triad a = b + s*c, the memory-bandwidth roofline: 12 bytes per element.
inline double triad_gbs(int64_t n, bool parallel) {
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  float *pa = a.data();
  const float *pb = b.data(), *pc = c.data();
  auto body = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  };
  double ms = median_ms(
      [&] {
        if (parallel) at::parallel_for(0, n, 1 << 16, body);
        else body(0, n);
      },
      9);
  return 12.0 * n / (ms * 1e6);
}

struct DL {
  DLTensor dl{};
  std::vector<int64_t> shape, strides;
  explicit DL(const at::Tensor &t) {
    shape.assign(t.sizes().begin(), t.sizes().end());
    strides.assign(t.strides().begin(), t.strides().end());
    dl.data = t.data_ptr();
    dl.device.device_type = kDLCPU;
    dl.ndim = (int32_t)t.dim();
    dl.shape = shape.data();
    dl.strides = strides.data();
    dl.dtype.code = kDLFloat;
    dl.dtype.bits = (uint8_t)(t.element_size() * 8);
    dl.dtype.lanes = 1;
  }
};

// A compiled trace with its argument arrays, run on fixed inputs and preallocated outputs.
struct Compiled {
  dynamo_frame *frame = nullptr;
  dynamo_entry *entry = nullptr;
  std::vector<DL> in, out;
  std::vector<dynamo_arg> args;
  std::vector<DLTensor> outs;
  std::vector<at::Tensor> out_tensors;

  Compiled(dynamo_engine *engine, const std::string &text, const std::vector<at::Tensor> &inputs) {
    dynamo_trace *t = nullptr;
    if (dynamo_trace_parse(text.c_str(), text.size(), &t) != DYNAMO_OK || dynamo_frame_create(engine, "bench", &frame) != DYNAMO_OK ||
        dynamo_compile_frame(frame, t, &entry) != DYNAMO_OK) {
      fprintf(stderr, "compile failed: %s\n%s", dynamo_last_error(), text.c_str());
      exit(1);
    }
    dynamo_trace_destroy(t);
    for (const at::Tensor &x : inputs) in.emplace_back(x);
    for (DL &d : in) {
      dynamo_arg a{};
      a.kind = DYNAMO_ARG_TENSOR;
      a.u.tensor = &d.dl;
      args.push_back(a);
    }
    for (size_t k = 0; k < dynamo_entry_num_outputs(entry); ++k) {
      dynamo_tensor_info info;
      dynamo_entry_output_info(entry, k, &info);
      std::vector<int64_t> sz(info.sizes, info.sizes + info.ndim);
      out_tensors.push_back(at::empty(sz, info.dtype == DYNAMO_FLOAT64 ? at::kDouble : at::kFloat));
    }
    for (const at::Tensor &o : out_tensors) out.emplace_back(o);
    for (DL &d : out) outs.push_back(d.dl);
  }
  ~Compiled() { dynamo_frame_destroy(frame); }
  void run() {
    if (dynamo_entry_run(entry, args.data(), args.size(), outs.data(), outs.size()) != DYNAMO_OK) {
      fprintf(stderr, "run failed: %s\n", dynamo_last_error());
      exit(1);
    }
  }
  // Outputs allocated by the engine per call and released after it, as the Python binding
  // gets them (dynamo_entry_run_alloc: recycled buffers, no fresh page faults).
  void run_alloc() {
    DLManagedTensor *mt[16] = {};
    if (dynamo_entry_run_alloc(entry, args.data(), args.size(), mt, outs.size()) != DYNAMO_OK) {
      fprintf(stderr, "run failed: %s\n", dynamo_last_error());
      exit(1);
    }
    for (size_t k = 0; k < outs.size(); ++k)
      if (mt[k]) mt[k]->deleter(mt[k]);
  }
};

}  // namespace bench
