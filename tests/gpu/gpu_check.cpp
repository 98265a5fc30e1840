// gpu_check.cpp -- the GPU suite and benchmark, run on a machine with an NVIDIA GPU.
//
// Every case of cases.h goes through the same pipeline as dynamo_trace_to_ptx (verify,
// decompose, simplify, plan), is lowered to PTX for the arch of the device found, loaded and
// launched through the CUDA driver (gpu/program.cpp), and its outputs are compared with the
// CPU engine's results for the same trace and inputs, every element (<refdir>/<case>.ref, written by
// gpu_refs on the build machine). Bench cases are then timed and their GB/s printed next to a
// device-to-device copy measured in the same run.
//
// Built as one static executable (make gpu-bundle) so that it runs on a machine that has the
// NVIDIA driver but neither LLVM nor LibTorch. Usage: gpu_check REFDIR [--no-bench] [CASE...]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cases.h"
#include "gpu/program.h"
#include "jit/fuse.h"
#include "jit/rt_abi.h"

using namespace dynamo;
using namespace gpu_cases;

namespace {

std::string dt_name(jit::DType d) {
  switch (d) {
    case jit::DType::F32: return "f32";
    case jit::DType::F64: return "f64";
    case jit::DType::F16: return "f16";
    case jit::DType::BF16: return "bf16";
    case jit::DType::I32: return "i32";
    case jit::DType::I64: return "i64";
    case jit::DType::Bool: return "bool";
  }
  return "?";
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Buffers {
  gpu::Device *dev;
  std::vector<uint64_t> ptrs;
  ~Buffers() {
    for (uint64_t p : ptrs) dev->free(p);
  }
};

struct Result {
  bool ok = false;
  bool rows = false;  // has a block-per-row kernel
  double ms = 0, bytes = 0;
  double call_ms = 0;  // a user's call: outputs from the pool, run (status only if it can fail), wait
};

std::string launch_shape(const gpu::Program &prog) {
  std::string s;
  for (const gpu::Program::Launch &l : prog.order) {
    if (!s.empty()) s += ", ";
    if (l.kind == gpu::Program::Launch::Exit) {
      s += "side exit " + std::to_string(prog.exits[(size_t)l.index].id);
      continue;
    }
    if (l.kind == gpu::Program::Launch::Gemm) {
      const gpu::Gemm &g = prog.gemms[(size_t)l.index];
      s += "cuBLASLt " + (g.batch > 1 ? std::to_string(g.batch) + " x " : std::string()) + std::to_string(g.m) + "x" +
           std::to_string(g.n) + "x" + std::to_string(g.k) + (g.has_bias ? " + bias" : "") +
           (g.act == gpu::Gemm::Relu ? " + relu" : g.act == gpu::Gemm::GeluTanh ? " + gelu" : "");
      continue;
    }
    const gpu::GpuKernel &k = prog.kernels[(size_t)l.index];
    s += k.block_threads ? std::to_string(k.items) + " rows x block " + std::to_string(k.block_threads)
                         : std::to_string(k.items) + " items";
  }
  return s;
}

Result run_case(const std::shared_ptr<gpu::Device> &dev, const Case &c, const std::string &refdir, bool bench) {
  Result res;
  jit::Trace t = jit::parse_trace(c.trace);
  jit::verify_trace(t);
  jit::decompose_externs(t);
  jit::simplify_trace(t);
  jit::Plan p = gpu::plan_for_gpu(t);
  double t0 = now_ms();
  gpu::Program prog = gpu::compile_program(t, p, std::string("dynamo_") + c.name, dev->arch());
  double t1 = now_ms();
  gpu::Loaded loaded(dev, prog);
  double t2 = now_ms();
  for (const gpu::GpuKernel &k : prog.kernels) res.rows |= k.block_threads > 0;

  Buffers bufs{dev.get(), {}};
  std::vector<uint64_t> slots((size_t)p.num_slots, 0);
  std::vector<InputSpec> specs = input_specs(c.trace);
  if ((int32_t)specs.size() != p.num_inputs) {
    printf("FAIL %-20s %zu inputs in the text, %d in the plan\n", c.name, specs.size(), p.num_inputs);
    return res;
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    if (specs[k].scalar) {  // its 8 bytes live in the slot itself, as on the CPU
      double v = scalar_value(specs[k], (int)k);
      if (specs[k].dtype == "f64") {
        memcpy(&slots[k], &v, 8);
      } else {
        int64_t i = (int64_t)v;
        memcpy(&slots[k], &i, 8);
      }
      continue;
    }
    std::vector<uint8_t> host = make_input(specs[k], (int)k, c);
    size_t bytes = (size_t)specs[k].storage * (size_t)elem_bytes(specs[k].dtype);
    uint64_t d = dev->alloc(bytes);
    bufs.ptrs.push_back(d);
    dev->copy_to_device(d, host.data(), bytes);
    slots[k] = d;
    res.bytes += (double)bytes;
  }
  std::vector<size_t> out_bytes;
  for (size_t k = 0; k < t.outputs.size(); ++k) {
    const jit::Type &ty = t.types[t.outputs[k]];
    int64_t n = 1;
    for (int64_t s : ty.sizes) n *= s;
    size_t bytes = (size_t)n * (size_t)jit::dtype_bytes(ty.dtype);
    uint64_t d = dev->alloc((bytes + 3) & ~size_t(3));
    bufs.ptrs.push_back(d);
    dev->fill32(d, 0xffffffffu, (bytes + 3) / 4);  // an element no kernel writes stays this (cases.h Summary)
    slots[(size_t)p.num_inputs + k] = d;
    out_bytes.push_back(bytes);
    res.bytes += (double)bytes;
  }
  gpu::Loaded::TakenExit taken;
  int32_t st = loaded.run(slots, &taken);
  for (auto [d, bytes] : taken.values) dev->release(d, bytes);
  if (st == DYNAMO_RT_SIDE_EXIT) {  // (the cases' guards hold on their inputs)
    printf("FAIL %-20s left through side exit %d\n", c.name, taken.id);
    return res;
  }
  if (st != DYNAMO_RT_OK) {
    printf("FAIL %-20s runtime status %d\n", c.name, st);
    return res;
  }

  std::vector<Ref> refs;
  if (!read_refs(refdir + "/" + c.name + ".ref", &refs) || refs.size() != t.outputs.size()) {
    printf("FAIL %-20s no reference (%s/%s.ref) with %zu outputs\n", c.name, refdir.c_str(), c.name,
           t.outputs.size());
    return res;
  }
  double max_err = 0;
  int64_t bad = 0, checked = 0;
  std::string first_bad;
  for (size_t k = 0; k < t.outputs.size(); ++k) {
    std::vector<uint8_t> host(out_bytes[k] + 1);
    dev->copy_to_host(host.data(), slots[(size_t)p.num_inputs + k], out_bytes[k]);
    std::string dt = dt_name(t.types[t.outputs[k]].dtype);
    const Ref &r = refs[k];
    std::vector<double> got = elements(host.data(), dt, r.numel);
    if ((int64_t)r.values.size() != (r.period ? r.period : r.numel)) {
      printf("FAIL %-20s output %zu: the reference holds %zu values for %lld elements\n", c.name, k,
             r.values.size(), (long long)r.numel);
      return res;
    }
    struct Part {
      int64_t bad = 0, first = -1;
      double max_err = 0;
    };
    std::vector<Part> parts(kChunks);
    for_chunks(r.numel, [&](int chunk, int64_t lo, int64_t hi) {  // every element (cases.h: references)
      Part &q = parts[(size_t)chunk];
      for (int64_t i = lo; i < hi; ++i) {
        double g = got[(size_t)i], want = r.want(i);
        bool same = (std::isnan(g) && std::isnan(want)) || g == want;
        double err = same ? 0 : std::fabs(g - want);
        if (!same && !(err <= c.atol + c.rtol * std::fabs(want)) && !q.bad++) q.first = i;
        if (!std::isnan(err)) q.max_err = std::max(q.max_err, err);
      }
    });
    checked += r.numel;
    for (const Part &q : parts) {
      if (q.bad && !bad) {
        char buf[200];
        snprintf(buf, sizeof buf, "output %zu element %lld: gpu %.9g cpu %.9g", k, (long long)q.first,
                 got[(size_t)q.first], r.want(q.first));
        first_bad = buf;
      }
      bad += q.bad;
      max_err = std::max(max_err, q.max_err);
    }
    std::string why;  // every element, through what they add up to
    if (!bad && !summary_fits(summarize(host.data(), dt, r.numel), r.whole, dt, r.numel, c.rtol, c.atol, &why)) {
      bad = 1;
      first_bad = "output " + std::to_string(k) + ", all elements: " + why;
    }
  }
  if (bad) {
    printf("FAIL %-20s %lld of %lld elements differ (%s)\n", c.name, (long long)bad, (long long)checked,
           first_bad.c_str());
    return res;
  }
  printf("ok   %-20s %lld elements match the CPU (max abs diff %.2e), all match its sums; PTX %.0f ms, load %.0f ms; %s\n",
         c.name, (long long)checked, max_err, t1 - t0, t2 - t1, launch_shape(prog).c_str());
  res.ok = true;
  if (bench && c.bench) {
    for (int w = 0; w < 5; ++w) loaded.launch(slots);
    dev->synchronize();
    const int iters = 50;  // CUDA events around back-to-back runs
    res.ms = dev->time_ms([&] {
      for (int w = 0; w < iters; ++w) loaded.launch(slots);
    }) / iters;
    // What dynamo_entry_run_alloc costs a caller per call (wall clock): outputs taken from the
    // device's pool and handed back, the run with its wait, as the C API does (less its guards).
    std::vector<uint64_t> call_slots = slots;
    std::vector<double> ts;
    for (int w = 0; w < 25; ++w) {
      double a = now_ms();
      std::vector<uint64_t> held;
      for (size_t k = 0; k < out_bytes.size(); ++k) {
        held.push_back(dev->acquire(out_bytes[k]));
        call_slots[(size_t)p.num_inputs + k] = held.back();
      }
      gpu::Loaded::TakenExit left;
      if (loaded.run(call_slots, &left) != DYNAMO_RT_OK) break;
      for (size_t k = 0; k < held.size(); ++k) dev->release(held[k], out_bytes[k]);
      ts.push_back(now_ms() - a);
    }
    if (!ts.empty()) {
      std::sort(ts.begin(), ts.end());
      res.call_ms = ts[ts.size() / 2];
    }
  }
  return res;
}

// Device-to-device copy of `bytes`: GB/s counting bytes read and written.
double copy_gbs(gpu::Device &dev, size_t bytes) {
  uint64_t a = dev.alloc(bytes), b = dev.alloc(bytes);
  dev.zero(a, bytes);
  for (int w = 0; w < 5; ++w) dev.copy_on_device(b, a, bytes);
  dev.synchronize();
  const int iters = 50;
  double ms = dev.time_ms([&] {
    for (int w = 0; w < iters; ++w) dev.copy_on_device(b, a, bytes);
  }) / iters;
  dev.free(a);
  dev.free(b);
  return 2.0 * (double)bytes / (ms * 1e6);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_check REFDIR [--no-bench] [CASE...]\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string refdir = argv[1];
  bool bench = true;
  std::vector<std::string> only;
  for (int k = 2; k < argc; ++k) {
    std::string a = argv[k];
    if (a == "--no-bench") bench = false;
    else only.push_back(a);
  }
  if (refdir == "--lower-only") {  // gpu_check --lower-only DUMPDIR: PTX for sm_90, no device
    std::string dir = argc > 2 ? argv[2] : ".";
    int bad = 0;
    for (const Case &c : cases()) {
      try {
        jit::Trace t = jit::parse_trace(c.trace);
        jit::verify_trace(t);
        jit::decompose_externs(t);
        jit::simplify_trace(t);
        jit::Plan p = gpu::plan_for_gpu(t);
        gpu::Program prog = gpu::compile_program(t, p, std::string("dynamo_") + c.name, "sm_90");
        std::string path = dir + "/" + c.name + ".ptx";
        if (FILE *f = fopen(path.c_str(), "w")) {
          fwrite(prog.ptx.data(), 1, prog.ptx.size(), f);
          fclose(f);
        }
        printf("%-20s %s\n", c.name, launch_shape(prog).c_str());
      } catch (const std::exception &e) {
        printf("FAIL %-20s %s\n", c.name, e.what());
        ++bad;
      }
    }
    return bad ? 1 : 0;
  }
  std::string why;
  if (!gpu::cuda_driver_available(&why)) {
    printf("gpu_check: SKIPPED: %s\n", why.c_str());
    return 3;
  }
  std::shared_ptr<gpu::Device> dev;
  try {
    dev = gpu::Device::open(0);
  } catch (const std::exception &e) {
    printf("gpu_check: cannot open device 0: %s\n", e.what());
    return 1;
  }
  printf("gpu_check: %s (%s)\n", dev->name().c_str(), dev->arch().c_str());
  int failed = 0, passed = 0;
  struct Row {
    std::string name;
    double ms, gbs, call_ms = 0;
  };
  std::vector<Row> rows;
  size_t max_tensor = 0;
  for (const Case &c : cases()) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
    try {
      Result r = run_case(dev, c, refdir, bench);
      (r.ok ? passed : failed)++;
      if (r.ok && r.ms > 0) {
        rows.push_back({c.name, r.ms, r.bytes / (r.ms * 1e6), r.call_ms});
        for (const InputSpec &s : input_specs(c.trace))
          if (!s.scalar) max_tensor = std::max(max_tensor, (size_t)s.storage * (size_t)elem_bytes(s.dtype));
        // The tuning knobs swept (each variant is checked against the CPU again).
        const char *knob = r.rows ? "DYNAMO_GPU_ROW_BLOCK" : "DYNAMO_GPU_UNROLL";
        std::vector<int> values = r.rows ? std::vector<int>{64, 128, 256, 512} : std::vector<int>{1, 2, 4, 8};
        for (int v : values) {
          setenv(knob, std::to_string(v).c_str(), 1);
          Result rv = run_case(dev, c, refdir, bench);
          unsetenv(knob);
          (rv.ok ? passed : failed)++;
          std::string label = std::string(c.name) + (r.rows ? " block " : " unroll ") + std::to_string(v);
          if (rv.ok) rows.push_back({label, rv.ms, rv.bytes / (rv.ms * 1e6)});
        }
      }
    } catch (const std::exception &e) {
      printf("FAIL %-20s %s\n", c.name, e.what());
      ++failed;
    }
  }
  printf("gpu_check: %d passed, %d failed\n", passed, failed);
  if (!rows.empty()) {
    double copy = copy_gbs(*dev, max_tensor);
    printf("\nbandwidth (bytes of inputs read + outputs written, once each; CUDA events over 50 runs after 5 warm-ups)\n");
    printf("  %-28s %10s %10s %10s %12s\n", "case", "ms", "GB/s", "% of copy", "ms per call");
    printf("  %-28s %10s %10.0f %10s\n", "device copy (D2D)", "", copy, "100%");
    for (const Row &r : rows) {
      printf("  %-28s %10.3f %10.0f %9.0f%%", r.name.c_str(), r.ms, r.gbs, 100 * r.gbs / copy);
      if (r.call_ms > 0) printf(" %12.3f", r.call_ms);
      printf("\n");
    }
    printf("  (ms: kernels and products back to back, CUDA events; ms per call: a caller's run with outputs from "
           "the pool and the wait, wall clock, median of 25)\n");
  }
  return failed ? 1 : 0;
}
