// bench_common.h -- shared pieces of the benchmarks: timing, the triad roofline, torch tensors as
// DLPack arguments, and compiling trace text.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
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

// glibc keeps freed large blocks instead of returning them to the OS, so eager temporaries
// are not page-faulted in anew on every call (that OS cost, ~0.4 s per 64 MB on this VM,
// would otherwise swamp a kernel comparison).
inline void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

// Process set-up shared by every benchmark: LibTorch's pool gets every core (eager and JIT
// both use it) unless OMP_NUM_THREADS says otherwise.
inline int setup(bool keep_memory = true) {
  const char *env = getenv("OMP_NUM_THREADS");
  if (!env || !*env) at::set_num_threads((int)std::thread::hardware_concurrency());
  if (keep_memory) keep_freed_memory();
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
