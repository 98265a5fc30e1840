// aten_check.h -- helpers for suites that compare compiled traces with LibTorch eager:
// torch tensors as DLPack arguments, running trace text, and tolerant comparison.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>

#include <cstdio>
#include <string>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#include "dynamo.h"

namespace check {

inline const char *dtype_text(at::ScalarType s) {
  switch (s) {
    case at::kBool: return "bool";
    case at::kInt: return "i32";
    case at::kLong: return "i64";
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    default: return "?";
  }
}

inline std::string ints(at::IntArrayRef v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// The trace type of a torch tensor, with strides when it is not contiguous.
inline std::string type_text(const at::Tensor &t) {
  std::string s = std::string(dtype_text(t.scalar_type())) + "[" + ints(t.sizes()) + "]";
  bool contig = true;
  int64_t acc = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) > 1 && t.stride(d) != acc) contig = false;
    acc *= t.size(d);
  }
  if (!contig && t.numel() > 0) s += "{" + ints(t.strides()) + "}";
  return s;
}

// One run-time input: a tensor, or a Python scalar.
struct Value {
  enum Kind { Tensor, Int, Float, Bool } kind = Tensor;
  at::Tensor t;
  int64_t i = 0;
  double f = 0;
  static Value tensor(at::Tensor x) { Value v; v.t = std::move(x); return v; }
  static Value integer(int64_t x) { Value v; v.kind = Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.kind = Float; v.f = x; return v; }
  static Value boolean(bool x) { Value v; v.kind = Bool; v.i = x; return v; }
  std::string decl() const {
    switch (kind) {
      case Tensor: return type_text(t);
      case Int: return "i64";
      case Float: return "f64";
      default: return "bool";
    }
  }
  // As ATen sees a Python scalar argument: a wrapped-number tensor.
  at::Tensor as_aten() const {
    switch (kind) {
      case Tensor: return t;
      case Int: return at::native::wrapped_scalar_tensor(at::Scalar(i));
      case Float: return at::native::wrapped_scalar_tensor(at::Scalar(f));
      default: return at::native::wrapped_scalar_tensor(at::Scalar(i != 0));
    }
  }
};

struct DL {
  DLTensor dl{};
  std::vector<int64_t> shape, strides;
};

inline void fill_dl(DL &d, const at::Tensor &t) {
  d.shape.assign(t.sizes().begin(), t.sizes().end());
  d.strides.assign(t.strides().begin(), t.strides().end());
  d.dl.data = t.data_ptr();
  d.dl.device.device_type = kDLCPU;
  d.dl.ndim = (int32_t)t.dim();
  d.dl.shape = d.shape.data();
  d.dl.strides = d.strides.data();
  d.dl.dtype.lanes = 1;
  switch (t.scalar_type()) {
    case at::kBool: d.dl.dtype.code = DYNAMO_DL_BOOL; d.dl.dtype.bits = 8; break;
    case at::kInt: d.dl.dtype.code = kDLInt; d.dl.dtype.bits = 32; break;
    case at::kLong: d.dl.dtype.code = kDLInt; d.dl.dtype.bits = 64; break;
    case at::kFloat: d.dl.dtype.code = kDLFloat; d.dl.dtype.bits = 32; break;
    case at::kHalf: d.dl.dtype.code = kDLFloat; d.dl.dtype.bits = 16; break;
    case at::kBFloat16: d.dl.dtype.code = kDLBfloat; d.dl.dtype.bits = 16; break;
    default: d.dl.dtype.code = kDLFloat; d.dl.dtype.bits = 64; break;
  }
}

inline at::ScalarType aten_dtype(int32_t d) {
  static const at::ScalarType k[] = {at::kBool, at::kInt, at::kLong, at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  return k[d];
}

struct Result {
  dynamo_status status = DYNAMO_OK;
  std::string error;
  std::vector<at::Tensor> outs;
  dynamo_entry_stats stats{};
};

// Runs compiled entry on inputs, allocating outputs with at::empty.
inline Result run_entry(dynamo_entry *e, const std::vector<Value> &ins) {
  Result r;
  std::vector<DL> dls(ins.size());
  std::vector<dynamo_arg> args(ins.size());
  for (size_t k = 0; k < ins.size(); ++k) {
    dynamo_arg &a = args[k];
    switch (ins[k].kind) {
      case Value::Tensor:
        fill_dl(dls[k], ins[k].t);
        a.kind = DYNAMO_ARG_TENSOR;
        a.u.tensor = &dls[k].dl;
        break;
      case Value::Int: a.kind = DYNAMO_ARG_INT; a.u.i = ins[k].i; break;
      case Value::Float: a.kind = DYNAMO_ARG_FLOAT; a.u.f = ins[k].f; break;
      case Value::Bool: a.kind = DYNAMO_ARG_BOOL; a.u.b = (int32_t)ins[k].i; break;
    }
  }
  size_t no = dynamo_entry_num_outputs(e);
  std::vector<DL> odl(no);
  std::vector<DLTensor> outs(no);
  for (size_t k = 0; k < no; ++k) {
    dynamo_tensor_info info;
    dynamo_entry_output_info(e, k, &info);
    std::vector<int64_t> sz(info.sizes, info.sizes + info.ndim);
    r.outs.push_back(at::empty(sz, at::TensorOptions().dtype(aten_dtype(info.dtype))));
    fill_dl(odl[k], r.outs.back());
    outs[k] = odl[k].dl;
  }
  r.status = dynamo_entry_run(e, args.data(), args.size(), outs.data(), outs.size());
  if (r.status != DYNAMO_OK) r.error = dynamo_last_error();
  r.stats.struct_size = sizeof r.stats;
  dynamo_entry_get_stats(e, &r.stats);
  return r;
}

// Parses, compiles (into a fresh frame of engine) and runs trace text.
inline Result run_text(dynamo_engine *engine, const std::string &text, const std::vector<Value> &ins) {
  Result r;
  dynamo_trace *t = nullptr;
  r.status = dynamo_trace_parse(text.c_str(), text.size(), &t);
  if (r.status != DYNAMO_OK) {
    r.error = dynamo_last_error();
    return r;
  }
  dynamo_frame *f = nullptr;
  dynamo_frame_create(engine, "check", &f);
  dynamo_entry *e = nullptr;
  r.status = dynamo_compile_frame(f, t, &e);
  dynamo_trace_destroy(t);
  if (r.status != DYNAMO_OK) {
    r.error = dynamo_last_error();
    dynamo_frame_destroy(f);
    return r;
  }
  r = run_entry(e, ins);
  dynamo_frame_destroy(f);
  return r;
}

// A trace over `ins` whose body is `body` (lines using %0.. for the inputs, the result last).
inline std::string trace_text(const std::vector<Value> &ins, const std::vector<std::string> &body,
                              const std::string &ret) {
  std::string s = "trace @check {\n";
  for (size_t k = 0; k < ins.size(); ++k) s += "  %" + std::to_string(k) + " = input " + ins[k].decl() + "\n";
  for (const std::string &l : body) s += "  " + l + "\n";
  return s + "  return " + ret + "\n}\n";
}

// Compares got with want: same dtype and shape; floats within tolerance (NaNs equal), others exact.
inline bool same(const at::Tensor &got, const at::Tensor &want, const std::string &what, double rtol = -1,
                 double atol = -1) {
  if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes()) {
    fprintf(stderr, "%s: got %s[%s], eager gives %s[%s]\n", what.c_str(), dtype_text(got.scalar_type()),
            ints(got.sizes()).c_str(), dtype_text(want.scalar_type()), ints(want.sizes()).c_str());
    return false;
  }
  if (got.numel() == 0) return true;
  bool ok;
  if (at::isFloatingType(got.scalar_type())) {
    bool f32 = got.scalar_type() == at::kFloat;
    bool half = got.scalar_type() == at::kHalf || got.scalar_type() == at::kBFloat16;
    if (rtol < 0) rtol = half ? (got.scalar_type() == at::kHalf ? 2e-3 : 1.6e-2) : f32 ? 2e-5 : 1e-12;
    if (atol < 0) atol = half ? (got.scalar_type() == at::kHalf ? 1e-3 : 1e-2) : f32 ? 1e-5 : 1e-12;
    ok = half ? at::allclose(got.to(at::kFloat), want.to(at::kFloat), rtol, atol, true)
              : at::allclose(got, want, rtol, atol, /*equal_nan=*/true);
  } else {
    ok = at::equal(got, want);
  }
  if (!ok) {
    at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
    at::Tensor diff = (g - w).abs().nan_to_num(1e300, 1e300, 1e300);
    int64_t i = diff.reshape({-1}).argmax().item<int64_t>();
    fprintf(stderr, "%s: mismatch, worst at flat index %lld: got %.9g, eager %.9g\n", what.c_str(), (long long)i,
            g.reshape({-1})[i].item<double>(), w.reshape({-1})[i].item<double>());
  }
  return ok;
}

}  // namespace check
