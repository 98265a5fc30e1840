// gpu_refs.cpp -- CPU results for the GPU check: every case of cases.h compiled and run by
// libdynamo's CPU engine (through the C API only), its outputs written to <dir>/<case>.ref.
// Usage: gpu_refs DIR [CASE...]
#include <dlpack/dlpack.h>

#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dynamo.h"
#include "cases.h"

using namespace gpu_cases;

namespace {

DLDataType dl_type(const std::string &dt) {
  if (dt == "f32") return {kDLFloat, 32, 1};
  if (dt == "f64") return {kDLFloat, 64, 1};
  if (dt == "f16") return {kDLFloat, 16, 1};
  if (dt == "bf16") return {kDLBfloat, 16, 1};
  if (dt == "i32") return {kDLInt, 32, 1};
  if (dt == "i64") return {kDLInt, 64, 1};
  return {DYNAMO_DL_BOOL, 8, 1};
}

std::string dt_name(DLDataType t) {
  if (t.code == kDLFloat) return t.bits == 64 ? "f64" : t.bits == 16 ? "f16" : "f32";
  if (t.code == kDLBfloat) return "bf16";
  if (t.code == kDLInt) return t.bits == 64 ? "i64" : "i32";
  return "bool";
}

bool run_case(dynamo_engine *eng, const Case &c, const std::string &dir) {
  auto die = [&](const char *what) {
    fprintf(stderr, "gpu_refs: %s: %s: %s\n", c.name, what, dynamo_last_error());
    return false;
  };
  dynamo_trace *t = nullptr;
  if (dynamo_trace_parse(c.trace, (size_t)-1, &t) != DYNAMO_OK) return die("parse");
  dynamo_frame *f = nullptr;
  dynamo_entry *e = nullptr;
  if (dynamo_frame_create(eng, c.name, &f) != DYNAMO_OK) return die("frame");
  if (dynamo_compile_frame(f, t, &e) != DYNAMO_OK) return die("compile");
  dynamo_trace_destroy(t);

  std::vector<InputSpec> specs = input_specs(c.trace);
  std::vector<std::vector<uint8_t>> data;
  std::vector<DLTensor> tens(specs.size());
  std::vector<dynamo_arg> args(specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    if (specs[k].scalar) {
      double v = scalar_value(specs[k], (int)k);
      if (specs[k].dtype == "f64") {
        args[k].kind = DYNAMO_ARG_FLOAT;
        args[k].u.f = v;
      } else if (specs[k].dtype == "bool") {
        args[k].kind = DYNAMO_ARG_BOOL;
        args[k].u.b = v != 0;
      } else {
        args[k].kind = DYNAMO_ARG_INT;
        args[k].u.i = (int64_t)v;
      }
      args[k].flags = 0;
      data.emplace_back();
      continue;
    }
    data.push_back(make_input(specs[k], (int)k, c));
    DLTensor &d = tens[k];
    d.data = data.back().data();
    d.device = {kDLCPU, 0};
    d.ndim = (int32_t)specs[k].sizes.size();
    d.dtype = dl_type(specs[k].dtype);
    d.shape = specs[k].sizes.data();
    d.strides = specs[k].strides.data();
    d.byte_offset = 0;
    args[k].kind = DYNAMO_ARG_TENSOR;
    args[k].flags = 0;
    args[k].u.tensor = &d;
  }
  size_t nout = dynamo_entry_num_outputs(e);
  std::vector<DLManagedTensor *> outs(nout);
  if (dynamo_entry_run_alloc(e, args.data(), args.size(), outs.data(), nout) != DYNAMO_OK) return die("run");
  std::vector<Ref> refs;
  for (DLManagedTensor *m : outs) {
    if (!m) return die("an output aliases an input (not used in GPU cases)");
    const DLTensor &o = m->dl_tensor;
    Ref r;
    r.numel = 1;
    for (int d = 0; d < o.ndim; ++d) r.numel *= o.shape[d];
    const uint8_t *base = static_cast<const uint8_t *>(o.data) + o.byte_offset;
    std::string dt = dt_name(o.dtype);
    std::vector<double> all = elements(base, dt, r.numel);
    r.period = c.period && r.numel > c.period ? c.period : 0;
    if (r.period) {
      // The output must repeat as its inputs do (rows, sequences): then one period of it is
      // every element's reference. Checked here on every element, within a quarter of the
      // tolerance gpu_check allows (vector and scalar code may round a last bit apart).
      int64_t off = 0;
      for (int64_t i = r.period; i < r.numel; ++i) {
        double a = all[(size_t)i], b = all[(size_t)(i % r.period)];
        bool same = (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= (c.atol + c.rtol * std::fabs(b)) / 4;
        if (!same && !off++)
          fprintf(stderr, "gpu_refs: %s: element %lld is %.9g, element %lld (a period before) %.9g\n", c.name,
                  (long long)i, a, (long long)(i % r.period), b);
      }
      if (off) {
        fprintf(stderr, "gpu_refs: %s: the output does not repeat every %lld elements (%lld elements off)\n",
                c.name, (long long)r.period, (long long)off);
        return false;
      }
      all.resize((size_t)r.period);
    }
    if ((int64_t)all.size() > kMaxShipped) {
      fprintf(stderr, "gpu_refs: %s: %zu values in one output's reference (at most %lld): give the case a period\n",
              c.name, all.size(), (long long)kMaxShipped);
      return false;
    }
    r.values = std::move(all);
    r.whole = summarize(base, dt, r.numel);
    refs.push_back(std::move(r));
    m->deleter(m);
  }
  dynamo_frame_destroy(f);
  std::string path = dir + "/" + c.name + ".ref";
  if (!write_refs(path, refs)) {
    fprintf(stderr, "gpu_refs: cannot write %s\n", path.c_str());
    return false;
  }
  printf("gpu_refs: %-20s %zu output(s) -> %s\n", c.name, refs.size(), path.c_str());
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_refs DIR [CASE...]\n");
    return 2;
  }
  dynamo_engine *eng = nullptr;
  if (dynamo_engine_create(nullptr, &eng) != DYNAMO_OK) {
    fprintf(stderr, "gpu_refs: engine: %s\n", dynamo_last_error());
    return 1;
  }
  int bad = 0;
  for (const Case &c : cases()) {
    bool wanted = argc == 2;
    for (int k = 2; k < argc; ++k) wanted |= std::string(argv[k]) == c.name;
    if (wanted && !run_case(eng, c, argv[1])) ++bad;
  }
  dynamo_engine_destroy(eng);
  return bad ? 1 : 0;
}
