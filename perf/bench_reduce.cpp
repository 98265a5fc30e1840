// bench_reduce.cpp -- the reduction/normalization suite side by side with LibTorch eager in one
// run: softmax, layer norm, a GELU-bias-residual-layernorm block, full sum/mean/var and the
// pointwise chains; speedup, GB/s against the triad roofline, the geometric mean, and time vs.
// size for one kernel (fixed per-call overhead + linear part). Eager is timed with glibc malloc's
// default settings and tuned to keep freed memory (bench_common.h); speedups are against the
// faster of the two. Prints; asserts nothing.
#include <cmath>
#include <memory>

#include "bench_common.h"

using namespace bench;

namespace {

struct Case {
  const char *name;
  std::string trace;                 // inputs %0.. in the order of `inputs`
  std::vector<at::Tensor> inputs;
  std::function<at::Tensor()> eager;
  double bytes;                      // minimal DRAM traffic: inputs read once, outputs written once
};

std::string ty(const at::Tensor &t) {
  std::string s = "f32[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

std::string trace(const std::vector<at::Tensor> &in, const std::string &body, const std::string &ret = "%r") {
  std::string s = "trace @bench {\n";
  for (size_t k = 0; k < in.size(); ++k) s += "  %" + std::to_string(k) + " = input " + ty(in[k]) + "\n";
  return s + body + "  return " + ret + "\n}\n";
}

}  // namespace

int main(int argc, char **argv) {
  // Optional argument: run only the cases whose name contains it (and skip the scaling table).
  const char *only = argc > 1 ? argv[1] : nullptr;
  int threads = setup();
  at::manual_seed(0);
  printf("dynamo reduction suite: float32, %d thread(s) for eager and JIT (OMP_NUM_THREADS to change)\n", threads);
  printf("eager: %s\n", describe_eager().c_str());
  const int64_t N24 = 1 << 24;
  double tri1 = triad_gbs(N24, false), triN = triad_gbs(N24, true);
  double roof = threads > 1 ? std::max(tri1, triN) : tri1;
  printf("triad roofline: %.1f GB/s on 1 thread, %.1f GB/s on %d threads\n\n", tri1, triN, threads);

  dynamo_engine *engine = nullptr;
  if (dynamo_engine_create(nullptr, &engine) != DYNAMO_OK) return 1;

  at::Tensor sm = at::randn({4096, 4096});
  at::Tensor lx = at::randn({8192, 1024}), lw = at::randn({1024}), lb = at::randn({1024});
  at::Tensor bx = at::randn({8192, 1024}), bias = at::randn({1024}), res = at::randn({8192, 1024});
  at::Tensor big = at::randn({N24}), y = at::randn({N24});
  const double f = 4.0;
  std::vector<Case> cases = {
      {"softmax rows 4096x4096", trace({sm}, "  %r = extern aten::_softmax(%0, 1, false) : f32[4096,4096]\n"), {sm},
       [&] { return at::softmax(sm, 1); }, 2 * f * sm.numel()},
      {"layer_norm 8192x1024 affine",
       trace({lx, lw, lb}, "  %r = extern aten::layer_norm(%0, [1024], %1, %2, 1e-05, false) : f32[8192,1024]\n"),
       {lx, lw, lb}, [&] { return at::layer_norm(lx, {1024}, lw, lb, 1e-5); }, 2 * f * lx.numel()},
      {"gelu(x+b)+res -> layer_norm",
       trace({bx, bias, res, lw, lb},
             "  %a = add(%0, %1)\n  %g = gelu(%a)\n  %h = add(%g, %2)\n"
             "  %r = extern aten::layer_norm(%h, [1024], %3, %4, 1e-05, false) : f32[8192,1024]\n"),
       {bx, bias, res, lw, lb},
       [&] { return at::layer_norm(at::gelu(bx + bias) + res, {1024}, lw, lb, 1e-5); }, 3 * f * bx.numel()},
      {"sum 2^24", trace({big}, "  %r = sum(%0, [], false)\n"), {big}, [&] { return big.sum(); }, f * N24},
      {"mean 2^24", trace({big}, "  %r = mean(%0, [], false)\n"), {big}, [&] { return big.mean(); }, f * N24},
      {"var 2^24", trace({big}, "  %r = var(%0, [], 1, false)\n"), {big}, [&] { return big.var(); }, f * N24},
      {"sum rows 4096x4096 (dim -1)", trace({sm}, "  %r = sum(%0, [1], false)\n"), {sm}, [&] { return sm.sum(1); },
       f * sm.numel()},
      {"3-op chain 2^24", trace({big, y}, "  %a = add(%0, %1)\n  %b = mul(%a, 0.5)\n  %r = relu(%b)\n"), {big, y},
       [&] { return at::relu((big + y) * 0.5); }, 3 * f * N24},
      {"6-op chain 2^24",
       trace({big, y}, "  %a = mul(%0, %1)\n  %b = add(%a, 1.0)\n  %c = tanh(%b)\n  %d = mul(%c, 0.5)\n"
                       "  %e = add(%d, 0.5)\n  %r = mul(%e, %0)\n"),
       {big, y}, [&] { return (at::tanh(big * y + 1.0) * 0.5 + 0.5) * big; }, 3 * f * N24},
      {"10-op chain 2^24",
       trace({big, y}, "  %a = add(%0, %1)\n  %b = mul(%a, %a)\n  %c = mul(%b, %a)\n  %d = mul(%c, 0.044715)\n"
                       "  %e = add(%a, %d)\n  %f = mul(%e, 0.7978845608)\n  %g = tanh(%f)\n  %h = add(%g, 1.0)\n"
                       "  %i = mul(%h, %a)\n  %r = mul(%i, 0.5)\n"),
       {big, y},
       [&] {
         at::Tensor a = big + y;
         return (at::tanh((a + a * a * a * 0.044715) * 0.7978845608) + 1.0) * a * 0.5;
       },
       3 * f * N24},
  };

  // Phase 1, with the allocator's default settings: eager as users run it (fresh temporaries,
  // page-faulted in when large) and the JIT end to end, with engine-allocated outputs (recycled
  // buffers) released after each call, as the Python binding returns them.
  if (only)
    cases.erase(std::remove_if(cases.begin(), cases.end(),
                               [&](const Case &c) { return std::string(c.name).find(only) == std::string::npos; }),
                cases.end());
  std::vector<std::unique_ptr<Compiled>> ks;
  std::vector<double> eager_dflt, e2e_jit;
  for (Case &c : cases) {
    ks.push_back(std::make_unique<Compiled>(engine, c.trace, c.inputs));
    Compiled &k = *ks.back();
    at::Tensor want = c.eager();
    k.run();
    if (!at::allclose(k.out_tensors[0], want, 1e-3, 1e-4)) {
      fprintf(stderr, "%s: JIT result differs from eager!\n", c.name);
      return 1;
    }
    eager_dflt.push_back(median_ms([&] { at::Tensor r = c.eager(); }, 5));
    e2e_jit.push_back(median_ms([&] { k.run_alloc(); }, 5));
  }
  // Phase 2, after tuning glibc to keep freed blocks (no page faults for eager temporaries; it
  // cannot be undone exactly, so it comes second): eager again, and the JIT's kernels writing
  // into preallocated outputs. Every speedup is against the faster of the two eager times. GB/s
  // counts inputs read once and outputs written once.
  AllocTuning tuning = tune_allocator();
  printf("allocator tuning for phase 2: %s\n", tuning.what.c_str());
  print_eager_legend(tuning);
  printf("\n%-30s | %21s %19s | %9s %8s | %9s %8s %8s %7s\n", "", "eager ms", "", "end to end", "", "kernels",
         "", "", "");
  printf("%-30s | %21s %19s | %9s %8s | %9s %8s %8s %7s\n", "kernel", eager_default_label().c_str(),
         eager_tuned_label().c_str(), "jit ms", "vs best", "jit ms", "vs best", "jit GB/s", "% triad");
  double log_k = 0, log_e = 0;
  int n = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case &c = cases[i];
    Compiled &k = *ks[i];
    double et = median_ms([&] { at::Tensor r = c.eager(); }, 11);
    double j = median_ms([&] { k.run(); }, 11);
    double e = std::min(eager_dflt[i], et);
    double gbs = c.bytes / (j * 1e6);
    printf("%-30s | %21.2f %19.2f | %9.2f %7.1fx | %9.2f %7.1fx %8.1f %6.0f%%\n", c.name, eager_dflt[i], et, e2e_jit[i],
           e / e2e_jit[i], j, e / j, gbs, 100 * gbs / roof);
    log_k += std::log(e / j);
    log_e += std::log(e / e2e_jit[i]);
    ++n;
  }
  printf("geometric-mean speedup over the faster eager: %.2fx end to end, %.2fx kernels (%d cases)\n\n",
         std::exp(log_e / n), std::exp(log_k / n), n);

  if (only) {
    dynamo_engine_destroy(engine);
    return 0;
  }
  // Time vs. size for one kernel (the 3-op chain): t = overhead + bytes / bandwidth.
  printf("scaling, 3-op chain (2 in, 1 out), eager with the phase-2 allocator settings:\n%12s %12s %12s %10s\n",
         "elements", "eager us", "jit us", "jit GB/s");
  std::vector<double> xs, ts;
  for (int p = 10; p <= 26; p += 2) {
    int64_t m = (int64_t)1 << p;
    at::Tensor a = at::randn({m}), b = at::randn({m});
    Compiled k(engine, trace({a, b}, "  %c = add(%0, %1)\n  %d = mul(%c, 0.5)\n  %r = relu(%d)\n"), {a, b});
    int reps = p <= 16 ? 201 : p <= 22 ? 21 : 5;
    double e = median_ms([&] { at::Tensor r = at::relu((a + b) * 0.5); }, reps) * 1e3;
    double j = median_ms([&] { k.run(); }, reps) * 1e3;
    printf("%12lld %12.1f %12.1f %10.1f\n", (long long)m, e, j, 12.0 * m / (j * 1e3));
    xs.push_back((double)m);
    ts.push_back(j);
  }
  // t(n) = overhead + n * per_element: the overhead is the small-size floor, the slope comes
  // from the two largest sizes (DRAM-bound).
  size_t m = xs.size();
  double slope = (ts[m - 1] - ts[m - 2]) / (xs[m - 1] - xs[m - 2]);
  printf("t(n) ~ %.2f us + n x %.3f ns  (fixed per-call overhead; %.1f GB/s streaming)\n", ts[0], slope * 1e3,
         12.0 / (slope * 1e3));
  dynamo_engine_destroy(engine);
  return 0;
}
