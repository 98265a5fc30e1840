// bench_pointwise.cpp -- side by side in one run: LibTorch eager vs. the JIT on fused pointwise
// chains, with achieved GB/s against a triad bandwidth measured in the same process, and the
// compile latency of a 10-op trace (parse -> native). Eager is timed twice, with glibc malloc's
// default settings and tuned to keep freed memory (bench_common.h); speedups are against the
// faster of the two. Prints a table; asserts nothing.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "dynamo.h"

namespace {

using Clock = std::chrono::steady_clock;
using bench::median_ms;
using bench::triad_gbs;

void fill_dl(DLTensor &d, const at::Tensor &t, std::vector<int64_t> &shape) {
  shape.assign(t.sizes().begin(), t.sizes().end());
  d = DLTensor{};
  d.data = t.data_ptr();
  d.device.device_type = kDLCPU;
  d.ndim = (int32_t)t.dim();
  d.shape = shape.data();
  d.dtype.code = kDLFloat;
  d.dtype.bits = 32;
  d.dtype.lanes = 1;
}

struct Chain {
  const char *name;
  std::string body;  // trace lines over %0 (x) and %1 (y); result %r
  std::function<at::Tensor(const at::Tensor &, const at::Tensor &)> eager;
};

std::vector<Chain> chains() {
  return {
      {"3-op  add,mul,relu", "  %a = add(%0, %1)\n  %b = mul(%a, 0.5)\n  %r = relu(%b)\n",
       [](const at::Tensor &x, const at::Tensor &y) { return at::relu((x + y) * 0.5); }},
      {"6-op  mul,add,tanh,mul,add,mul",
       "  %a = mul(%0, %1)\n  %b = add(%a, 1.0)\n  %c = tanh(%b)\n  %d = mul(%c, 0.5)\n  %e = add(%d, 0.5)\n"
       "  %r = mul(%e, %0)\n",
       [](const at::Tensor &x, const at::Tensor &y) { return (at::tanh(x * y + 1.0) * 0.5 + 0.5) * x; }},
      {"10-op gelu(tanh) of x+y, expanded",
       "  %a = add(%0, %1)\n  %b = mul(%a, %a)\n  %c = mul(%b, %a)\n  %d = mul(%c, 0.044715)\n"
       "  %e = add(%a, %d)\n  %f = mul(%e, 0.7978845608)\n  %g = tanh(%f)\n  %h = add(%g, 1.0)\n"
       "  %i = mul(%h, %a)\n  %r = mul(%i, 0.5)\n",
       [](const at::Tensor &x, const at::Tensor &y) {
         at::Tensor a = x + y;
         return (at::tanh((a + a * a * a * 0.044715) * 0.7978845608) + 1.0) * a * 0.5;
       }},
  };
}

std::string trace_for(const Chain &c, int64_t n) {
  std::string ty = "f32[" + std::to_string(n) + "]";
  return "trace @bench {\n  %0 = input " + ty + "\n  %1 = input " + ty + "\n" + c.body + "  return %r\n}\n";
}

bool check(dynamo_status s, const char *what) {
  if (s == DYNAMO_OK) return true;
  fprintf(stderr, "%s: %s: %s\n", what, dynamo_status_name(s), dynamo_last_error());
  return false;
}

}  // namespace

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : (int64_t)1 << 24;
  // Eager and the JIT both use LibTorch's thread pool; give it every core unless told otherwise.
  int threads = bench::setup();
  printf("dynamo pointwise benchmark: float32, %d thread(s) for eager and JIT (OMP_NUM_THREADS to change), "
         "median of 15 runs\n", threads);
  printf("eager: %s\n", bench::describe_eager().c_str());
  double tri1 = triad_gbs(n, false), triN = triad_gbs(n, true);
  double roof = std::max(tri1, triN);
  printf("triad roofline on %lld elements: %.1f GB/s on 1 thread, %.1f GB/s on %d threads (%% triad: of the "
         "larger)\n", (long long)n, tri1, triN, threads);

  dynamo_engine *engine = nullptr;
  if (!check(dynamo_engine_create(nullptr, &engine), "engine")) return 1;
  // 2^24 floats (64 MB) exceed glibc's largest dynamic mmap threshold (32 MB): with default
  // settings every eager temporary is mmapped, page-faulted in and unmapped on each call; 2^22
  // (16 MB) is served from the heap once the threshold has risen, but the heap's top can be
  // trimmed back to the OS; 2^20 (4 MB) stays in cache; 64 elements measure per-call overhead.
  const std::vector<int64_t> sizes = {n, (int64_t)1 << 22, (int64_t)1 << 20, (int64_t)64};
  const std::vector<Chain> cs = chains();
  auto reps_for = [](int64_t size) { return size <= 4096 ? 2001 : 15; };
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;  // the same inputs in both passes
  for (int64_t size : sizes) inputs.emplace_back(at::randn({size}), at::randn({size}));

  // Pass 1: every row's eager time with the allocator's default settings, as users run it.
  std::vector<double> eager_default;  // [size][chain]
  for (size_t si = 0; si < sizes.size(); ++si) {
    const at::Tensor &x = inputs[si].first, &y = inputs[si].second;
    for (const Chain &c : cs)
      eager_default.push_back(median_ms([&] { at::Tensor r = c.eager(x, y); }, reps_for(sizes[si])));
  }
  // Pass 2, after tuning glibc (which cannot be undone exactly): tuned eager and the JIT.
  bench::AllocTuning tuning = bench::tune_allocator();
  printf("allocator tuning for pass 2: %s\n", tuning.what.c_str());
  bench::print_eager_legend(tuning);
  printf("\n%-34s %9s %21s %19s %9s %13s %9s %8s\n", "chain (2 in, 1 out)", "n",
         bench::eager_default_label().c_str(), bench::eager_tuned_label().c_str(), "jit", "vs best eager",
         "jit GB/s", "% triad");
  for (size_t si = 0; si < sizes.size(); ++si) {
    int64_t size = sizes[si];
    const at::Tensor &x = inputs[si].first, &y = inputs[si].second;
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Chain &c = cs[ci];
      std::string text = trace_for(c, size);
      dynamo_trace *t = nullptr;
      dynamo_frame *f = nullptr;
      dynamo_entry *e = nullptr;
      if (!check(dynamo_trace_parse(text.c_str(), text.size(), &t), "parse")) return 1;
      dynamo_frame_create(engine, "bench", &f);
      if (!check(dynamo_compile_frame(f, t, &e), "compile")) return 1;
      at::Tensor out = at::empty({size});
      DLTensor dx, dy, dout;
      std::vector<int64_t> sx, sy, so;
      fill_dl(dx, x, sx);
      fill_dl(dy, y, sy);
      fill_dl(dout, out, so);
      dynamo_arg args[2] = {};
      args[0].kind = args[1].kind = DYNAMO_ARG_TENSOR;
      args[0].u.tensor = &dx;
      args[1].u.tensor = &dy;
      at::Tensor want = c.eager(x, y);
      if (!check(dynamo_frame_run(f, args, 2, &dout, 1), "run")) return 1;
      if (!at::allclose(out, want, 1e-4, 1e-5)) {
        fprintf(stderr, "%s: JIT result differs from eager!\n", c.name);
        return 1;
      }
      int reps = reps_for(size);
      double eager_dflt = eager_default[si * cs.size() + ci];
      double eager_tuned = median_ms([&] { at::Tensor r = c.eager(x, y); }, reps);
      double eager = std::min(eager_dflt, eager_tuned);  // every speedup is against the faster eager
      double jit = median_ms([&] { dynamo_frame_run(f, args, 2, &dout, 1); }, reps);
      // With a fresh output per call: allocated by the caller (at::empty, from the tuned heap,
      // as eager's own outputs are), or by the engine from its recycled buffers
      // (dynamo_entry_run_alloc, as the Python binding does).
      double jit_fresh = median_ms(
          [&] {
            at::Tensor o = at::empty({size});
            DLTensor d2 = dout;
            d2.data = o.data_ptr();
            dynamo_frame_run(f, args, 2, &d2, 1);
          },
          reps);
      dynamo_entry *entry = nullptr;
      dynamo_check_guards(f, args, 2, &entry, nullptr, 0);
      double jit_pooled = median_ms(
          [&] {
            DLManagedTensor *mt = nullptr;
            dynamo_entry_run_alloc(entry, args, 2, &mt, 1);
            mt->deleter(mt);
          },
          reps);
      double gbs = 12.0 * size / (jit * 1e6);
      if (size <= 4096) {  // per-call overhead regime: report microseconds
        printf("%-34s %9lld %19.2fus %17.2fus %7.2fus %12.1fx   (per-call overhead: guards + slots + call)\n", c.name,
               (long long)size, eager_dflt * 1e3, eager_tuned * 1e3, jit * 1e3, eager / jit);
        dynamo_frame_destroy(f);
        dynamo_trace_destroy(t);
        continue;
      }
      printf("%-34s %9lld %21.3f %19.3f %9.3f %12.1fx %9.1f %7.0f%%\n", c.name, (long long)size, eager_dflt,
             eager_tuned, jit, eager / jit, gbs, 100.0 * gbs / roof);
      printf("%-34s %9s %21s %19s %9.3f %12.1fx   (jit, output from at::empty each call)\n", "", "", "", "",
             jit_fresh, eager / jit_fresh);
      printf("%-34s %9s %21s %19s %9.3f %12.1fx   (jit, output allocated by the engine each call)\n", "", "", "", "",
             jit_pooled, eager / jit_pooled);
      dynamo_frame_destroy(f);
      dynamo_trace_destroy(t);
    }
  }

  // Compile latency: parse -> verify -> plan -> LLVM IR -> O2 -> machine code, 10-op chain.
  std::string text = trace_for(chains()[2], 1 << 20);
  std::vector<double> lat;
  for (int i = 0; i < 11; ++i) {
    auto a = Clock::now();
    dynamo_trace *t = nullptr;
    dynamo_frame *f = nullptr;
    dynamo_trace_parse(text.c_str(), text.size(), &t);
    dynamo_frame_create(engine, "latency", &f);
    dynamo_compile_frame(f, t, nullptr);
    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    dynamo_frame_destroy(f);
    dynamo_trace_destroy(t);
  }
  std::sort(lat.begin(), lat.end());
  printf("\ncompile latency, 10-op pointwise trace (parse -> native): median %.1f ms, min %.1f ms, max %.1f ms\n",
         lat[lat.size() / 2], lat.front(), lat.back());
  dynamo_engine_destroy(engine);
  return 0;
}
