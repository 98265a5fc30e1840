// blas_lt.cpp -- cuBLASLt through dlopen (see blas_lt.h). The handful of types and constants
// used are declared here from the library's documented ABI (cublasLt.h, library_types.h), so
// building needs no CUDA headers.
#include "gpu/blas_lt.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "jit/ir.h"

namespace dynamo::gpu {

namespace {

using Status = int;  // cublasStatus_t
using Handle = void *;
using Desc = void *;
using Layout = void *;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;          // cudaDataType
constexpr int kCompute32F = 68, kCompute32FFastTF32 = 77;  // cublasComputeType_t
constexpr int kOpN = 0, kOpT = 1;                          // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescBiasDataType = 26;
constexpr uint32_t kEpilogueDefault = 1, kEpilogueRelu = 2, kEpilogueBias = 4, kEpilogueGelu = 32;  // GELU: tanh form
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;

struct Api {
  Status (*cublasLtCreate)(Handle *);
  Status (*cublasLtDestroy)(Handle);
  const char *(*cublasLtGetStatusString)(Status);
  Status (*cublasLtMatmulDescCreate)(Desc *, int, int);
  Status (*cublasLtMatmulDescDestroy)(Desc);
  Status (*cublasLtMatmulDescSetAttribute)(Desc, int, const void *, size_t);
  Status (*cublasLtMatrixLayoutCreate)(Layout *, int, uint64_t, uint64_t, int64_t);
  Status (*cublasLtMatrixLayoutDestroy)(Layout);
  Status (*cublasLtMatrixLayoutSetAttribute)(Layout, int, const void *, size_t);
  Status (*cublasLtMatmul)(Handle, Desc, const void *, const void *, Layout, const void *, Layout, const void *,
                           const void *, Layout, void *, Layout, const void *, void *, size_t, void *);
};

struct Library {
  Api api{};
  std::string error;
};

const Library &library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    const char *env = getenv("DYNAMO_LIBCUBLASLT");
    std::string path = env && *env ? env : "libcublasLt.so";
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h && !(env && *env)) {  // the versioned names CUDA 11 to 13 install
      for (const char *alt : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11"})
        if ((h = dlopen(alt, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!h) {
      const char *e = dlerror();
      lib.error = "cuBLASLt is not installed: cannot open " + path + " (" + (e ? e : "unknown error") +
                  "); matrix products cannot run on the GPU";
      return;
    }
    auto need = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && lib.error.empty()) lib.error = "cuBLASLt at " + path + " lacks " + name;
    };
    Api &a = lib.api;
    need(a.cublasLtCreate, "cublasLtCreate");
    need(a.cublasLtDestroy, "cublasLtDestroy");
    need(a.cublasLtGetStatusString, "cublasLtGetStatusString");
    need(a.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate");
    need(a.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy");
    need(a.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    need(a.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    need(a.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    need(a.cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
    need(a.cublasLtMatmul, "cublasLtMatmul");
  });
  return lib;
}

const Api &api() {
  const Library &l = library();
  if (!l.error.empty()) jit::fail(jit::ErrorCode::Unsupported, l.error);
  return l.api;
}

void check(Status s, const char *call) {
  if (s == 0) return;
  const char *msg = api().cublasLtGetStatusString ? api().cublasLtGetStatusString(s) : nullptr;
  jit::fail(jit::ErrorCode::Runtime, std::string(call) + " failed: " + (msg ? msg : "status " + std::to_string(s)));
}

int data_type(jit::DType d) { return d == jit::DType::F16 ? kR16F : d == jit::DType::BF16 ? kR16BF : kR32F; }

// One row-major matrix view (rows x cols, strides rs and cs, one of them 1) as a column-major
// operand: (the layout's rows, cols, leading dim, whether it is transposed relative to the
// row-major view's column-major reading).
struct ColMajor {
  int64_t rows, cols, ld;
  int op;
};

bool as_col_major(int64_t rows, int64_t cols, int64_t rs, int64_t cs, ColMajor *out) {
  // Row-major rows x cols with contiguous rows (cs == 1) is column-major cols x rows, ld rs.
  if (cs == 1 || cols == 1) {
    *out = {cols, rows, std::max<int64_t>(rows == 1 ? cols : rs, std::max<int64_t>(cols, 1)), kOpN};
    return rows == 1 || rs >= cols;
  }
  if (rs == 1 || rows == 1) {  // contiguous columns: column-major rows x cols, ld cs, used transposed
    *out = {rows, cols, std::max<int64_t>(cs, std::max<int64_t>(rows, 1)), kOpT};
    return cs >= rows;
  }
  return false;
}

}  // namespace

bool cublaslt_available(std::string *why) {
  const Library &l = library();
  if (!l.error.empty()) {
    if (why) *why = l.error;
    return false;
  }
  return true;
}

bool gemm_of(const jit::Trace &t, const jit::Plan &p, int32_t xi, Gemm *g, std::string *why) {
  const jit::ExternStep &x = p.externs[(size_t)xi];
  auto no = [&](const std::string &w) {
    *why = "extern " + x.callee + " cannot run on the GPU: " + w;
    return false;
  };
  if (x.callee != "aten::mm" && x.callee != "aten::addmm" && x.callee != "aten::bmm")
    return no("only matrix products (aten::mm, addmm, bmm) run there, through cuBLASLt; LibTorch in this build "
              "runs on the CPU only");
  bool addmm = x.callee == "aten::addmm", bmm = x.callee == "aten::bmm";
  size_t first = addmm ? 1 : 0;
  if (x.args.size() < first + 2 || !x.args[first].is_tensor || !x.args[first + 1].is_tensor ||
      x.result_values.size() != 1)
    return no("unexpected arguments");
  if (addmm) {
    for (size_t k = 3; k < x.args.size(); ++k) {  // beta, alpha: 1 only (the bias epilogue)
      const jit::Operand &o = x.args[k].lit;
      double v = o.kind == jit::Operand::Float ? o.f : o.kind == jit::Operand::Int ? (double)o.i : 0.0;
      if (x.args[k].is_tensor || v != 1.0) return no("addmm with beta or alpha other than 1");
    }
    if (!x.args[0].is_tensor) return no("addmm without a bias tensor");
  }
  const jit::Type &ta = t.types[x.args[first].value], &tb = t.types[x.args[first + 1].value];
  const jit::Type &tc = t.types[x.result_values[0]];
  int rank = bmm ? 3 : 2;
  if (ta.rank() != rank || tb.rank() != rank || tc.rank() != rank) return no("operands of an unexpected rank");
  if (ta.dtype != tb.dtype || ta.dtype != tc.dtype ||
      (ta.dtype != jit::DType::F32 && ta.dtype != jit::DType::F16 && ta.dtype != jit::DType::BF16))
    return no(std::string("dtype ") + jit::dtype_name(ta.dtype) + " (float32, float16 and bfloat16 run on the GPU)");
  Gemm G;
  G.step = xi;
  G.dtype = ta.dtype;
  G.batch = bmm ? ta.sizes[0] : 1;
  G.m = ta.sizes[rank - 2];
  G.k = ta.sizes[rank - 1];
  G.n = tb.sizes[rank - 1];
  if (tb.sizes[rank - 2] != G.k || (bmm && tb.sizes[0] != G.batch)) return no("mismatched sizes");
  G.a = x.args[first].view;
  G.b = x.args[first + 1].view;
  G.a_strides = G.a.strides;
  G.b_strides = G.b.strides;
  ColMajor ca{}, cb{};
  if (!as_col_major(G.m, G.k, G.a.strides[rank - 2], G.a.strides[rank - 1], &ca) ||
      !as_col_major(G.k, G.n, G.b.strides[rank - 2], G.b.strides[rank - 1], &cb))
    return no("an operand is a view with neither its rows nor its columns contiguous");
  if (p.views[x.result_values[0]].slot != x.result_slots[0]) return no("the result is not in its own slot");
  G.c = p.views[x.result_values[0]];
  if (addmm) {
    const jit::Type &tbias = t.types[x.args[0].value];
    const jit::BufferView &bv = x.args[0].view;
    bool row = tbias.dtype == G.dtype && tbias.numel() == G.n && (tbias.rank() == 1 || (tbias.rank() == 2 && tbias.sizes[0] == 1)) &&
               (G.n == 1 || bv.strides.back() == 1);
    if (!row) return no("addmm's bias is not one contiguous row of n elements (the bias epilogue)");
    G.bias = bv;
    G.has_bias = true;
  }
  *g = G;
  return true;
}

struct BlasLt::Impl {
  std::shared_ptr<Device> dev;
  std::vector<Gemm> gemms;
  Handle handle = nullptr;
  uint64_t workspace = 0;
  size_t workspace_bytes = size_t(32) << 20;
  struct Descs {
    Desc op = nullptr;
    Layout a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  };
  std::vector<Descs> descs;
  void release() noexcept {
    const Library &l = library();
    if (!l.error.empty()) return;
    for (Descs &d : descs) {
      if (d.op) l.api.cublasLtMatmulDescDestroy(d.op);
      for (Layout x : {d.a, d.b, d.c})
        if (x) l.api.cublasLtMatrixLayoutDestroy(x);
    }
    if (handle) l.api.cublasLtDestroy(handle);
    try {
      dev->free(workspace);
    } catch (...) {  // (the driver failed while freeing: nothing more to do)
    }
  }
};

BlasLt::BlasLt(std::shared_ptr<Device> dev, const std::vector<Gemm> &gemms) : impl_(std::make_unique<Impl>()) {
  Impl &I = *impl_;
  I.dev = std::move(dev);
  I.gemms = gemms;
  if (gemms.empty()) return;
  const Api &a = api();
  try {
    I.dev->activate();
    if (Status s = a.cublasLtCreate(&I.handle)) {  // (a library that cannot start here: a refusal, not a crash)
      const char *msg = a.cublasLtGetStatusString(s);
      jit::fail(jit::ErrorCode::Unsupported, std::string("cuBLASLt cannot start on this device (cublasLtCreate: ") +
                                                 (msg ? msg : "status " + std::to_string(s)) +
                                                 "); matrix products cannot run on the GPU");
    }
    I.workspace = I.dev->alloc(I.workspace_bytes);
    const char *tf32 = getenv("DYNAMO_GPU_TF32");  // float32 products in TF32 only when asked (torch's allow_tf32)
    bool fast = tf32 && *tf32 && strcmp(tf32, "0") != 0;
    for (const Gemm &g : gemms) {
      Impl::Descs d;
      I.descs.push_back(d);
      Impl::Descs &D = I.descs.back();
      int dt = data_type(g.dtype);
      int rank = g.batch > 1 || g.a_strides.size() == 3 ? 3 : 2;
      ColMajor ca{}, cb{};  // (checked by gemm_of)
      as_col_major(g.m, g.k, g.a_strides[rank - 2], g.a_strides[rank - 1], &ca);
      as_col_major(g.k, g.n, g.b_strides[rank - 2], g.b_strides[rank - 1], &cb);
      check(a.cublasLtMatmulDescCreate(&D.op, g.dtype == jit::DType::F32 && fast ? kCompute32FFastTF32 : kCompute32F,
                                       kR32F),
            "cublasLtMatmulDescCreate");
      // C^T (n x m) = op(B^T) op(A^T): cuBLASLt's A is our B, its B our A.
      int32_t opa = cb.op, opb = ca.op;
      check(a.cublasLtMatmulDescSetAttribute(D.op, kDescTransA, &opa, sizeof opa), "cublasLtMatmulDescSetAttribute");
      check(a.cublasLtMatmulDescSetAttribute(D.op, kDescTransB, &opb, sizeof opb), "cublasLtMatmulDescSetAttribute");
      uint32_t act = g.act == Gemm::Relu ? kEpilogueRelu : g.act == Gemm::GeluTanh ? kEpilogueGelu : 0;
      uint32_t epi = g.has_bias ? kEpilogueBias | act : act ? act : kEpilogueDefault;
      check(a.cublasLtMatmulDescSetAttribute(D.op, kDescEpilogue, &epi, sizeof epi), "cublasLtMatmulDescSetAttribute");
      if (g.has_bias) {
        int32_t bdt = dt;
        check(a.cublasLtMatmulDescSetAttribute(D.op, kDescBiasDataType, &bdt, sizeof bdt),
              "cublasLtMatmulDescSetAttribute");
      }
      check(a.cublasLtMatrixLayoutCreate(&D.a, dt, (uint64_t)cb.rows, (uint64_t)cb.cols, cb.ld), "cublasLtMatrixLayoutCreate");
      check(a.cublasLtMatrixLayoutCreate(&D.b, dt, (uint64_t)ca.rows, (uint64_t)ca.cols, ca.ld), "cublasLtMatrixLayoutCreate");
      check(a.cublasLtMatrixLayoutCreate(&D.c, dt, (uint64_t)g.n, (uint64_t)g.m, g.n), "cublasLtMatrixLayoutCreate");
      if (g.batch > 1) {
        int32_t count = (int32_t)g.batch;
        int64_t sa = g.b_strides[0], sb = g.a_strides[0], sc = g.m * g.n;
        for (auto [layout, stride] : {std::pair<Layout, int64_t>{D.a, sa}, {D.b, sb}, {D.c, sc}}) {
          check(a.cublasLtMatrixLayoutSetAttribute(layout, kLayoutBatchCount, &count, sizeof count),
                "cublasLtMatrixLayoutSetAttribute");
          check(a.cublasLtMatrixLayoutSetAttribute(layout, kLayoutStridedBatchOffset, &stride, sizeof stride),
                "cublasLtMatrixLayoutSetAttribute");
        }
      }
    }
  } catch (...) {
    I.release();
    throw;
  }
}

BlasLt::~BlasLt() {
  if (impl_) impl_->release();
}

void BlasLt::run(size_t i, const std::vector<uint64_t> &slots) {
  Impl &I = *impl_;
  const Gemm &g = I.gemms[i];
  Impl::Descs &D = I.descs[i];
  const Api &a = api();
  size_t eb = (size_t)jit::dtype_bytes(g.dtype);
  auto at = [&](const jit::BufferView &v) { return (void *)(uintptr_t)(slots[(size_t)v.slot] + (uint64_t)v.offset * eb); };
  I.dev->activate();
  if (g.has_bias) {
    void *bias = at(g.bias);
    check(a.cublasLtMatmulDescSetAttribute(D.op, kDescBiasPointer, &bias, sizeof bias), "cublasLtMatmulDescSetAttribute");
  }
  float one = 1.0f, zero = 0.0f;
  void *c = at(g.c);
  check(a.cublasLtMatmul(I.handle, D.op, &one, at(g.b), D.a, at(g.a), D.b, &zero, c, D.c, c, D.c, nullptr,
                         (void *)(uintptr_t)I.workspace, I.workspace_bytes, I.dev->stream_handle()),
        "cublasLtMatmul");
}

}  // namespace dynamo::gpu
