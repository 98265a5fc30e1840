// math_accuracy.cpp -- exhaustive accuracy of the JIT's float32 math: every float32 input (all
// 2^32 bit patterns) through a compiled one-op trace, compared with double-precision libm.
// Prints the largest error in ulps (of the correctly rounded float result), where it occurs,
// and how many results are off by more than 1 ulp; fails when a function exceeds its bound
// (exp 1, erf and tanh 1.5, sigmoid 2.5 ulp: it composes exp, an add and a divide). Run by
// `make check-math` (about two minutes per function here).
//   usage: math_accuracy [exp|erf|tanh|sigmoid ...]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>

#include "dynamo.h"

namespace {

double bound_ulps(const std::string &fn) {
  if (fn == "exp") return 1.0;
  if (fn == "sigmoid") return 2.5;
  return 1.5;
}

double reference(const std::string &fn, double x) {
  if (fn == "exp") return std::exp(x);
  if (fn == "erf") return std::erf(x);
  if (fn == "tanh") return std::tanh(x);
  if (fn == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  fprintf(stderr, "unknown function %s\n", fn.c_str());
  exit(2);
}

// |got - ref| in units of the last place of ref rounded to float (denormal spacing below).
double ulp_error(float got, double ref) {
  float rf = (float)ref;
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  if (std::isinf(rf) || std::isinf(got)) {
    if (got == rf) return 0;
    // ref rounds to inf but got is FLT_MAX-ish (or the reverse): measure against 2^128.
    double r = std::isinf(rf) ? std::copysign(std::ldexp(1.0, 128), ref) : ref;
    double g = std::isinf(got) ? std::copysign(std::ldexp(1.0, 128), (double)got) : got;
    return std::fabs(g - r) / std::ldexp(1.0, 104);
  }
  int e;
  std::frexp(std::fabs(ref) > 0 ? std::fabs(ref) : 1e-45, &e);
  double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs((double)got - ref) / ulp;
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::string> fns;
  for (int i = 1; i < argc; ++i) fns.push_back(argv[i]);
  if (fns.empty()) fns = {"exp", "sigmoid", "erf", "tanh"};
  dynamo_engine *engine = nullptr;
  if (dynamo_engine_create(nullptr, &engine) != DYNAMO_OK) {
    fprintf(stderr, "%s\n", dynamo_last_error());
    return 1;
  }
  const int64_t chunk = int64_t(1) << 24;
  std::vector<uint32_t> in(chunk);
  std::vector<float> out(chunk);
  int worst_rc = 0;
  for (const std::string &fn : fns) {
    std::string text = "trace @" + fn + " {\n  %0 = input f32[" + std::to_string(chunk) + "]\n  %1 = " + fn +
                       "(%0) : f32[" + std::to_string(chunk) + "]\n  return %1\n}\n";
    dynamo_trace *t = nullptr;
    dynamo_frame *f = nullptr;
    dynamo_entry *e = nullptr;
    if (dynamo_trace_parse(text.c_str(), text.size(), &t) != DYNAMO_OK || dynamo_frame_create(engine, fn.c_str(), &f) ||
        dynamo_compile_frame(f, t, &e) != DYNAMO_OK) {
      fprintf(stderr, "%s: %s\n", fn.c_str(), dynamo_last_error());
      return 1;
    }
    int64_t shape[1] = {chunk};
    DLTensor din{}, dout{};
    din.data = in.data();
    din.device = {kDLCPU, 0};
    din.ndim = 1;
    din.dtype = {kDLFloat, 32, 1};
    din.shape = shape;
    dout = din;
    dout.data = out.data();
    dynamo_arg a{};
    a.kind = DYNAMO_ARG_TENSOR;
    a.u.tensor = &din;
    double worst = 0;
    uint32_t worst_at = 0;
    uint64_t over1 = 0;
    for (uint64_t base = 0; base < (uint64_t(1) << 32); base += chunk) {
      for (int64_t i = 0; i < chunk; ++i) in[i] = (uint32_t)(base + i);
      if (dynamo_entry_run(e, &a, 1, &dout, 1) != DYNAMO_OK) {
        fprintf(stderr, "%s: %s\n", fn.c_str(), dynamo_last_error());
        return 1;
      }
#pragma omp parallel
      {
        double w = 0;
        uint32_t wat = 0;
        uint64_t o1 = 0;
#pragma omp for
        for (int64_t i = 0; i < chunk; ++i) {
          float x;
          memcpy(&x, &in[i], 4);
          double err = ulp_error(out[i], reference(fn, (double)x));
          if (err > 1) ++o1;
          if (err > w) w = err, wat = in[i];
        }
#pragma omp critical
        {
          over1 += o1;
          if (w > worst) worst = w, worst_at = wat;
        }
      }
    }
    float wx;
    memcpy(&wx, &worst_at, 4);
    bool ok = worst <= bound_ulps(fn);
    printf("%-8s max error %.3f ulp at x = %a (%.9g); %llu of 2^32 inputs above 1 ulp; bound %.1f: %s\n", fn.c_str(),
           worst, wx, wx, (unsigned long long)over1, bound_ulps(fn), ok ? "ok" : "EXCEEDED");
    fflush(stdout);
    if (!ok) worst_rc = 1;
    dynamo_frame_destroy(f);
    dynamo_trace_destroy(t);
  }
  dynamo_engine_destroy(engine);
  return worst_rc;
}
