// aten_extern.cpp -- the LibTorch side of the runtime: extern ops resolved by schema and called
// through the boxed dispatcher, and the thread-parallel loop helper generated code calls.
// The only file of the library that includes ATen.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <ATen/DLConvertor.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "entry.h"
#include "derived.h"
#include "gemm.h"
#include "onednn_conv.h"
#include "openblas.h"
#include "jit/rt_abi.h"

namespace dynamo::runtime {

using jit::ErrorCode;

// A matrix product step: which implementation it measured fastest, and its B packed for the
// own GEMM or for MKL (a linear layer's weight), kept across calls.
struct GemmStep {
  std::mutex mu;
  // The sides, also the index of t[]: LibTorch's BLAS (or OpenBLAS spread over the trace's
  // threads), the own GEMM, MKL's packed GEMM (linear layers' weights only).
  enum Mode { Blas, Own, Mkl, Timing } mode = Timing;
  static constexpr int kSides = 3;
  int timed = 0;
  double t[kSides] = {1e30, 1e30, 1e30};
  // After the choice: the chosen side's fastest of its next kWatchCalls calls. Timing two calls
  // can mislead (another pool's threads asleep then, spinning later): a choice whose calls turn
  // out 1.5x slower than another side measured switches once.
  int watched = 0;
  double t_watch = 1e30;
  // Whether the sides were timed a second time: a step whose B changed between calls (a weight in
  // training) times them again after the watch, the fastest call of each side over both rounds
  // deciding (a training loop's first steps run colder than its later ones, and the own side's
  // first call packs B).
  bool retimed = false;
  Derived<std::vector<float>> packed_b;
  // B as the last call saw it, and for how many calls in a row before it had not changed. A big B
  // that changes between calls (a weight in training) is not packed and kept (that would cost a
  // pass over it on every call): the own side packs it a block at a time or reads it in place,
  // until it stays the same for two calls in a row again.
  ContentKey last_b;
  int b_same = 0;
  bool b_changing = false;
  struct MklPacked {
    at::Tensor w;  // MKL's packed form (an opaque mkldnn tensor)
    int64_t m;     // the row count it was packed for
  };
  Derived<MklPacked> mkl_b;
};

const char *gemm_side_name(GemmStep::Mode m) {
  return m == GemmStep::Own ? "own" : m == GemmStep::Mkl ? "mkl" : m == GemmStep::Blas ? "blas" : "timing";
}

struct ExternOps {
  std::vector<std::optional<c10::OperatorHandle>> ops;  // one per extern step; none: a side exit (guard)
  std::vector<std::shared_ptr<ConvStep>> convs;         // per step: its oneDNN state, for convolutions
  std::vector<std::shared_ptr<GemmStep>> gemms;         // per step: for aten::mm / addmm
  std::vector<char> sums;  // per step: aten::sum.dim_IntList / aten::mean.dim (own_column_sum may take it)
};

namespace {

c10::ScalarType scalar_type_of(jit::DType d) {
  switch (d) {
    case jit::DType::Bool: return c10::kBool;
    case jit::DType::I32: return c10::kInt;
    case jit::DType::I64: return c10::kLong;
    case jit::DType::F32: return c10::kFloat;
    case jit::DType::F64: return c10::kDouble;
    case jit::DType::F16: return c10::kHalf;
    case jit::DType::BF16: return c10::kBFloat16;
  }
  return c10::kFloat;
}

std::string sizes_text(c10::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// A literal operand as the IValue the schema argument expects.
c10::IValue literal_ivalue(const jit::Operand &o, const c10::Argument *arg) {
  c10::TypeKind want = arg ? arg->type()->kind() : c10::TypeKind::AnyType;
  if (want == c10::TypeKind::OptionalType && arg)
    want = arg->type()->castRaw<c10::OptionalType>()->getElementType()->kind();
  switch (o.kind) {
    case jit::Operand::Int:
      if (want == c10::TypeKind::FloatType) return c10::IValue((double)o.i);
      if (want == c10::TypeKind::BoolType) return c10::IValue(o.i != 0);
      return c10::IValue(o.i);
    case jit::Operand::Float: return c10::IValue(o.f);
    case jit::Operand::Bool: return c10::IValue(o.i != 0);
    case jit::Operand::None: return c10::IValue();
    case jit::Operand::IntList:
      if (want == c10::TypeKind::ListType && arg) {  // bool[] (output masks) written as 0/1
        c10::TypePtr t = arg->type();
        if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
        if (t->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::BoolType) {
          c10::List<bool> bools;
          for (int64_t v : o.list) bools.push_back(v != 0);
          return c10::IValue(bools);
        }
      }
      return c10::IValue(o.list);
    case jit::Operand::Str: return c10::IValue(o.s);
    case jit::Operand::Ident: {
      jit::DType d;
      if (jit::dtype_from_name(o.s, &d)) return c10::IValue((int64_t)scalar_type_of(d));
      return c10::IValue(o.s);
    }
    default: return c10::IValue();
  }
}

// -- matrix multiplies -------------------------------------------------------------------
// aten::mm / addmm / bmm on float32 have three sides: LibTorch's BLAS call (MKL in the torch
// wheel; Debian's LibTorch says BLAS_INFO=generic: the reference BLAS or OpenBLAS), the own GEMM
// of runtime/gemm.cpp, and MKL's packed GEMM for a linear layer's weight (below). Which is
// fastest is measured where it matters, in the trace: each product step runs every side that
// takes it on its first two calls (the sides that pack B do so on the first) and keeps the
// fastest, as the convolution steps do. Timing in place sees what a benchmark of the GEMM alone
// does not: a threaded BLAS brings threads of its own, which on a small machine fight the OpenMP
// threads the rest of the trace runs on (2-10x slower products here), and a weight is packed once
// and kept (derived.h). The own side of a one-row product is a GEMV, of up to 32 rows against a
// weight dot products that stream the weight once (sgemm_few_rows). DYNAMO_GEMM=0 (the BLAS
// call), 1 (own) or mkl decides instead.
constexpr int kTimedCalls = 2;
constexpr int kWatchCalls = 8;

// -1: measure; else the GemmStep::Mode DYNAMO_GEMM names (0: blas, 1: own, mkl). Read as each
// entry's product steps are made.
int forced_gemm() {
  const char *env = getenv("DYNAMO_GEMM");
  if (!env || !*env) return -1;
  if (!strcmp(env, "mkl")) return (int)GemmStep::Mkl;
  return env[0] != '0' ? (int)GemmStep::Own : (int)GemmStep::Blas;
}

void parallel(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &body) {
  if (n <= grain || at::get_num_threads() == 1 || at::in_parallel_region()) {
    body(0, n);
    return;
  }
  at::parallel_for(0, n, grain, body);
}

MatView view_of(const at::Tensor &t) {
  return {t.data_ptr<float>(), t.stride(-2), t.stride(-1)};
}

bool is_f32(const c10::IValue &v, int64_t dim) {
  return v.isTensor() && v.toTensor().scalar_type() == at::kFloat && v.toTensor().dim() == dim;
}

bool is_one(const c10::IValue &v) {
  return (v.isDouble() && v.toDouble() == 1.0) || (v.isInt() && v.toInt() == 1);
}

// out[1, N] (+)= a[1, K] * b[K, N] by the GEMV; false when b has no unit stride.
bool one_row(const at::Tensor &a, const at::Tensor &b, at::Tensor &out, bool accumulate) {
  at::Tensor x = a.stride(1) == 1 ? a : a.contiguous();
  return sgemv(b.size(1), b.size(0), x.data_ptr<float>(), view_of(b), out.data_ptr<float>(), accumulate, parallel);
}

// Products of up to kFewRows rows whose B is a weight's transpose take sgemm_few_rows (and products
// of many rows against up to kFewRows columns of one, as their transpose); of up to
// kSmallRows rows against such a B of at least kBigB elements and at least as many columns as A
// has rows that has no version, or changed since it was packed (a weight in training),
// sgemm_small_m: the weight read in place, never packed (a kept packing would be rebuilt on every
// call; only A^T is packed, no bigger than the weight). Another big B that changed since it was
// packed is packed a block at a time by sgemm, into a buffer that stays in cache. A row-major B
// that is not kept (no version, or changing) against up to kFewRows rows or over a K of up to
// kShortK is read in place (sgemm_small_b_in_place: packing it would be most of the work).
constexpr int64_t kFewRows = 32, kSmallRows = 128, kBigB = 1 << 16, kShortK = 16;

// C (+)= a * b by the GEMM, with b packed once and kept when its version is known (b_version).
// bias (or null; n floats, one per column; only without accumulate): C = bias + a * b, the packed
// path adding it as it stores C, the others starting C at it.
void gemm_b_kept(const at::Tensor &a, const at::Tensor &b, float *c, bool accumulate, const float *bias, GemmStep *g,
                 const uint64_t *b_version) {
  int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  auto start_at_bias = [&] {  // (for the paths that add into C)
    if (bias && !accumulate) {
      for (int64_t i = 0; i < m; ++i) memcpy(c + i * n, bias, (size_t)n * sizeof(float));
      accumulate = true;
    }
  };
  if (m <= kFewRows) {  // (no packing to keep or drop: B is read in place)
    start_at_bias();
    if (sgemm_few_rows(m, n, k, view_of(a), view_of(b), c, n, accumulate, parallel)) return;
  }
  if (n <= kFewRows && m > n && k > 0 && a.stride(1) == 1 && b.stride(0) == 1) {
    // many rows against few columns of a weight's transpose (a classifier's head, X W^T): C^T =
    // W X^T by the few-row products, both read in place, then stored transposed
    const MatView w{b.data_ptr<float>(), b.stride(1), 1}, xt{a.data_ptr<float>(), 1, a.stride(0)};
    std::unique_ptr<float[]> ct(new float[(size_t)(n * m)]);
    if (sgemm_few_rows(n, m, k, w, xt, ct.get(), m, false, parallel)) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const float v = ct[(size_t)(j * m + i)];
          c[i * n + j] = accumulate ? c[i * n + j] + v : bias ? bias[j] + v : v;
        }
      return;
    }
  }
  std::optional<ContentKey> key;  // (set: B packed and kept)
  bool changing = false;
  if (g && b_version) {
    key = ContentKey::of(b, *b_version);
    std::lock_guard<std::mutex> l(g->mu);
    const bool same = g->last_b == *key;
    if (!same && g->last_b.ptr) g->b_changing = true;
    g->b_same = same ? g->b_same + 1 : 0;
    if (g->b_same >= 2) g->b_changing = false;
    g->last_b = *key;
    changing = g->b_changing;
    if (changing && n * k >= kBigB) {  // no kept packing (a small B is packed again, cheaply)
      g->packed_b.clear();
      key.reset();
    }
  }
  if ((!key || changing) && (m <= kFewRows || k <= kShortK)) {  // nothing kept: B read in place
    start_at_bias();
    if (sgemm_small_b_in_place(m, n, k, view_of(a), view_of(b), c, n, accumulate, parallel)) return;
  }
  if (m > kFewRows && m <= kSmallRows && n * k >= kBigB && n >= m && !key &&
      sgemm_small_m(m, n, k, view_of(a), view_of(b), c, n, accumulate, bias, parallel))
    return;
  if (!key) {
    start_at_bias();
    sgemm(m, n, k, view_of(a), view_of(b), c, n, accumulate, parallel);
    return;
  }
  auto packed = g->packed_b.get(&*key, [&] { return pack_b(n, k, view_of(b), parallel); });
  sgemm_prepacked(m, n, k, view_of(a), packed->data(), c, n, accumulate, parallel, accumulate ? nullptr : bias);
}

bool is_bf16(const c10::IValue &v, int64_t dim) {
  return v.isTensor() && v.toTensor().scalar_type() == at::kBFloat16 && v.toTensor().dim() == dim;
}

Bf16View bf16_view_of(const at::Tensor &t) {
  return {reinterpret_cast<const uint16_t *>(t.data_ptr<at::BFloat16>()), t.stride(-2), t.stride(-1)};
}

// aten::mm / addmm (alpha = beta = 1) of bfloat16 matrices with up to kFewRows rows: summed in
// float32 by bf16_gemm_few_rows, the bias (addmm) added in float32, each result rounded to
// bfloat16 once (as LibTorch's bf16 products do). false: not such a product, or the strides or
// CPU do not fit (LibTorch's call does it).
bool own_bf16_matmul(const std::string &callee, const torch::jit::Stack &st, at::Tensor *out) {
  const bool mm = callee == "aten::mm" && st.size() == 2;
  const bool addmm = callee == "aten::addmm" && st.size() == 5;
  if (!(mm || addmm) || !bf16_gemm_available()) return false;
  const c10::IValue &va = st[addmm ? 1 : 0], &vb = st[addmm ? 2 : 1];
  if (!is_bf16(va, 2) || !is_bf16(vb, 2)) return false;
  at::Tensor bias;
  if (addmm) {
    if (!st[0].isTensor() || st[0].toTensor().scalar_type() != at::kBFloat16 || !is_one(st[3]) || !is_one(st[4]))
      return false;
    bias = st[0].toTensor();
  }
  at::Tensor a = va.toTensor();
  const at::Tensor &b = vb.toTensor();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k || m > kFewRows) return false;
  if (bias.defined()) {
    if (bias.dim() > 2) return false;
    try {
      bias = bias.expand({m, n}).to(at::kFloat).contiguous();
    } catch (const std::exception &) {  // a bias that does not broadcast: LibTorch's error
      return false;
    }
  }
  if (a.stride(1) != 1 && k > 1) a = a.contiguous();
  if (b.stride(0) != 1 && b.stride(1) != 1 && k > 1) return false;
  std::unique_ptr<float[]> acc(new float[(size_t)std::max<int64_t>(m * n, 1)]);
  if (!bf16_gemm_few_rows(m, n, k, bf16_view_of(a), bf16_view_of(b), acc.get(), n, parallel)) return false;
  *out = at::empty({m, n}, a.options());
  uint16_t *o = reinterpret_cast<uint16_t *>(out->data_ptr<at::BFloat16>());
  const float *bi = bias.defined() ? bias.data_ptr<float>() : nullptr;
  for (int64_t i = 0; i < m * n; ++i) o[i] = bf16_round(bi ? acc[i] + bi[i] : acc[i]);
  return true;
}

// Computes the op into *out when it is one we multiply ourselves; false: let LibTorch do it.
// g, b_version: the step's kept packing of its B operand and B's version (or null).
bool own_matmul(const std::string &callee, const torch::jit::Stack &st, at::Tensor *out, GemmStep *g,
                const uint64_t *b_version) {
  if (own_bf16_matmul(callee, st, out)) return true;
  if (callee == "aten::mm" && st.size() == 2 && is_f32(st[0], 2) && is_f32(st[1], 2)) {
    const at::Tensor &a = st[0].toTensor(), &b = st[1].toTensor();
    if (a.size(1) != b.size(0)) return false;
    *out = at::empty({a.size(0), b.size(1)});
    if (a.size(0) == 1 && one_row(a, b, *out, false)) return true;
    gemm_b_kept(a, b, out->data_ptr<float>(), false, nullptr, g, b_version);
    return true;
  }
  if (callee == "aten::addmm" && st.size() == 5 && st[0].isTensor() && st[0].toTensor().scalar_type() == at::kFloat &&
      is_f32(st[1], 2) && is_f32(st[2], 2) && is_one(st[3]) && is_one(st[4])) {
    const at::Tensor &a = st[1].toTensor(), &b = st[2].toTensor();
    if (a.size(1) != b.size(0)) return false;
    int64_t m = a.size(0), n = b.size(1);
    *out = at::empty({m, n});
    const at::Tensor &bias = st[0].toTensor();
    // a bias of one row (a linear layer's) goes into the GEMM; another is copied into the result
    // first (the bias input itself is never written)
    at::Tensor row = bias.dim() <= 2 && bias.numel() == n && n > 0 && (bias.dim() < 2 || bias.size(0) == 1)
                         ? bias.reshape({n}).contiguous()
                         : at::Tensor();
    if (m == 1 || !row.defined()) {
      out->copy_(bias.expand({m, n}));
      if (m == 1 && one_row(a, b, *out, true)) return true;
      gemm_b_kept(a, b, out->data_ptr<float>(), true, nullptr, g, b_version);
      return true;
    }
    gemm_b_kept(a, b, out->data_ptr<float>(), false, row.data_ptr<float>(), g, b_version);
    return true;
  }
  if (callee == "aten::bmm" && st.size() == 2 && is_f32(st[0], 3) && is_f32(st[1], 3)) {
    const at::Tensor &a = st[0].toTensor(), &b = st[1].toTensor();
    int64_t bt = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
    if (b.size(0) != bt || b.size(1) != k) return false;
    *out = at::empty({bt, m, n});
    float *c = out->data_ptr<float>();
    auto one = [&](int64_t i, const ParallelFor &par) {
      MatView va{a.data_ptr<float>() + i * a.stride(0), a.stride(1), a.stride(2)};
      MatView vb{b.data_ptr<float>() + i * b.stride(0), b.stride(1), b.stride(2)};
      sgemm(m, n, k, va, vb, c + i * m * n, n, false, par);
    };
    if (bt >= at::get_num_threads()) {  // whole matrices per thread
      auto serial = [](int64_t n2, int64_t, const std::function<void(int64_t, int64_t)> &body) { body(0, n2); };
      parallel(bt, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t i = b0; i < b1; ++i) one(i, serial);
      });
    } else {
      for (int64_t i = 0; i < bt; ++i) one(i, parallel);
    }
    return true;
  }
  return false;
}

// -- OpenBLAS spread over the trace's threads ---------------------------------------------
// While a trace runs, OpenBLAS is held to one thread (openblas.h): LibTorch's own call of a
// product would then use one core. The "blas" side of a product step calls OpenBLAS's sgemm
// itself instead, one block of rows or columns per OpenMP thread: every core works, and no
// threads of OpenBLAS's own fight the trace's (64x256x768 on 2 cores: 96 us, as OpenBLAS's two
// threads alone; 285 us through LibTorch on one thread).

// How sgemm reads an operand held as a rows x cols view: (transposed?, leading dimension), or
// false when neither stride is 1 (or a size does not fit sgemm's int).
bool cblas_operand(const MatView &v, int64_t rows, int64_t cols, int *trans, int64_t *ld) {
  if (rows > INT32_MAX || cols > INT32_MAX) return false;
  if ((v.cs == 1 || cols == 1) && (rows == 1 || v.rs >= cols)) {
    *trans = kCblasNoTrans;
    *ld = rows == 1 ? std::max<int64_t>(cols, 1) : v.rs;
  } else if ((v.rs == 1 || rows == 1) && (cols == 1 || v.cs >= rows)) {
    *trans = kCblasTrans;
    *ld = cols == 1 ? std::max<int64_t>(rows, 1) : v.cs;
  } else {
    return false;
  }
  return *ld <= INT32_MAX;
}

// C[M, N] (row stride ldc) (+)= A[M, K] * B[K, N] by OpenBLAS, rows or columns (whichever are
// more) dealt to the threads in blocks of at least 16. false: no OpenBLAS, or a view it cannot
// take (the caller lets LibTorch compute the op).
bool blas_split(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                bool threaded) {
  CblasSgemm sgemm = openblas_sgemm();
  int ta, tb;
  int64_t lda, ldb;
  if (!sgemm || M <= 0 || N <= 0 || K <= 0 || ldc > INT32_MAX || !cblas_operand(A, M, K, &ta, &lda) ||
      !cblas_operand(B, K, N, &tb, &ldb))
    return false;
  const float beta = accumulate ? 1.0f : 0.0f;
  auto block = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    sgemm(kCblasRowMajor, ta, tb, (int)(m1 - m0), (int)(n1 - n0), (int)K, 1.0f, A.data + m0 * A.rs, (int)lda,
          B.data + n0 * B.cs, (int)ldb, beta, C + m0 * ldc + n0, (int)ldc);
  };
  const int64_t threads = threaded ? at::get_num_threads() : 1;
  const bool by_rows = M >= N;
  const int64_t extent = by_rows ? M : N;
  // blocks: one per thread, at least 16 wide; products under ~64k multiply-adds stay whole
  int64_t nblocks = std::min<int64_t>(threads, extent / 16);
  if (M * N * K < (1 << 16) || at::in_parallel_region()) nblocks = 1;
  if (nblocks <= 1) {
    block(0, M, 0, N);
    return true;
  }
  const int64_t width = ((extent + nblocks - 1) / nblocks + 15) / 16 * 16;
  nblocks = (extent + width - 1) / width;
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t lo = b * width, hi = std::min(extent, lo + width);
      if (by_rows)
        block(lo, hi, 0, N);
      else
        block(0, M, lo, hi);
    }
  });
  return true;
}

// The op computed into *out by blas_split when it is a float32 mm / addmm (alpha = beta = 1)
// / bmm whose operands sgemm can read; false: LibTorch computes it.
bool blas_matmul(const std::string &callee, const torch::jit::Stack &st, at::Tensor *out) {
  if (!openblas_sgemm()) return false;
  if (callee == "aten::mm" && st.size() == 2 && is_f32(st[0], 2) && is_f32(st[1], 2)) {
    const at::Tensor &a = st[0].toTensor(), &b = st[1].toTensor();
    if (a.size(1) != b.size(0)) return false;
    at::Tensor c = at::empty({a.size(0), b.size(1)});
    if (!blas_split(a.size(0), b.size(1), a.size(1), view_of(a), view_of(b), c.data_ptr<float>(), b.size(1), false,
                    true))
      return false;
    *out = std::move(c);
    return true;
  }
  if (callee == "aten::addmm" && st.size() == 5 && st[0].isTensor() && st[0].toTensor().scalar_type() == at::kFloat &&
      is_f32(st[1], 2) && is_f32(st[2], 2) && is_one(st[3]) && is_one(st[4])) {
    const at::Tensor &a = st[1].toTensor(), &b = st[2].toTensor();
    int64_t m = a.size(0), n = b.size(1);
    if (a.size(1) != b.size(0)) return false;
    at::Tensor c = at::empty({m, n});
    c.copy_(st[0].toTensor().expand({m, n}));  // a copy: the bias input is never written
    if (!blas_split(m, n, a.size(1), view_of(a), view_of(b), c.data_ptr<float>(), n, true, true)) return false;
    *out = std::move(c);
    return true;
  }
  if (callee == "aten::bmm" && st.size() == 2 && is_f32(st[0], 3) && is_f32(st[1], 3)) {
    const at::Tensor &a = st[0].toTensor(), &b = st[1].toTensor();
    int64_t bt = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
    if (b.size(0) != bt || b.size(1) != k || bt == 0) return false;
    MatView va0{a.data_ptr<float>(), a.stride(1), a.stride(2)}, vb0{b.data_ptr<float>(), b.stride(1), b.stride(2)};
    int t;
    int64_t ld;
    if (!cblas_operand(va0, m, k, &t, &ld) || !cblas_operand(vb0, k, n, &t, &ld) || m == 0 || n == 0 || k == 0)
      return false;
    at::Tensor c = at::empty({bt, m, n});
    float *cp = c.data_ptr<float>();
    auto one = [&](int64_t i, bool threaded) {
      MatView va{a.data_ptr<float>() + i * a.stride(0), a.stride(1), a.stride(2)};
      MatView vb{b.data_ptr<float>() + i * b.stride(0), b.stride(1), b.stride(2)};
      blas_split(m, n, k, va, vb, cp + i * m * n, n, false, threaded);
    };
    if (bt >= at::get_num_threads() && !at::in_parallel_region()) {  // whole matrices per thread
      at::parallel_for(0, bt, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t i = b0; i < b1; ++i) one(i, false);
      });
    } else {
      for (int64_t i = 0; i < bt; ++i) one(i, true);
    }
    *out = std::move(c);
    return true;
  }
  return false;
}

// -- MKL's packed GEMM ----------------------------------------------------------------------
// The third side of a product step whose B is a linear layer's weight: the transposed view of a
// contiguous [N, K] tensor the caller versions. MKL (inside the torch wheel) packs it once, for the
// step's row count M (mkl::_mkl_reorder_linear_weight), and multiplies by the packed form
// (mkl::_mkl_linear): what torch.compile runs for a frozen linear layer. At M = 17 (a ViT-B
// block at 64x64) it beats MKL's plain sgemm by 20-30%, which packs B on every call. The packed
// form's nominal size is 2-5x the weight's (at least ~8 MB), but what it touches is about the
// weight's (10 packed 3072x768 weights: +16 MB resident); a step that chose another side drops it.
// Products of fewer than kMklMinWeight weight elements are left to the other sides.
constexpr int64_t kMklMinWeight = int64_t(1) << 12;

struct MklOps {
  std::optional<c10::OperatorHandle> pack, linear;
};

const MklOps &mkl_ops() {  // empty where this LibTorch has no MKL
  static const MklOps ops = [] {
    MklOps o;
    if (!at::hasMKL()) return o;
    auto pack = c10::Dispatcher::singleton().findSchema({"mkl::_mkl_reorder_linear_weight", ""});
    auto linear = c10::Dispatcher::singleton().findSchema({"mkl::_mkl_linear", ""});
    if (pack && linear) {
      o.pack = *pack;
      o.linear = *linear;
    }
    return o;
  }();
  return ops;
}

// The op computed into *out by MKL's packed GEMM when it is a float32 mm, or an addmm (alpha =
// beta = 1) with a bias of one row, whose B is a versioned weight MKL can pack; false otherwise
// (the caller uses another side).
bool mkl_matmul(const std::string &callee, const torch::jit::Stack &st, GemmStep &g, const uint64_t *b_version,
                at::Tensor *out) {
  const MklOps &ops = mkl_ops();
  if (!b_version || !ops.linear) return false;
  bool mm = callee == "aten::mm" && st.size() == 2;
  bool addmm = callee == "aten::addmm" && st.size() == 5 && is_one(st[3]) && is_one(st[4]);
  if (!mm && !addmm) return false;
  const c10::IValue &av = st[mm ? 0 : 1], &bv = st[mm ? 1 : 2];
  if (!is_f32(av, 2) || !is_f32(bv, 2)) return false;
  const at::Tensor &a = av.toTensor(), &b = bv.toTensor();
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k || m == 0 || n * k < kMklMinWeight || b.stride(0) != 1 || b.stride(1) != k) return false;
  c10::IValue bias;
  if (addmm) {
    if (!st[0].isTensor()) return false;
    const at::Tensor &c = st[0].toTensor();
    bool row = c.scalar_type() == at::kFloat && c.numel() == n &&
               (c.dim() == 1 || (c.dim() == 2 && c.size(0) == 1));
    if (!row) return false;
    bias = c.reshape({n});
  }
  at::Tensor w = b.t();  // the weight, [N, K] contiguous
  ContentKey key = ContentKey::of(b, *b_version);
  try {  // (MKL failing is this side not applying: the step's other sides remain)
    auto packed = g.mkl_b.get(&key, [&] {
      torch::jit::Stack p{w, m};
      ops.pack->callBoxed(&p);
      return GemmStep::MklPacked{p.at(0).toTensor(), m};
    });
    // (a row count other than the packed one: MKL's op runs LibTorch's linear instead)
    torch::jit::Stack call{a, packed->w, w, bias, packed->m};
    ops.linear->callBoxed(&call);
    *out = call.at(0).toTensor();
  } catch (const std::exception &) {
    return false;
  }
  return true;
}

// A linear layer's addmm (float32, alpha = beta = 1, a bias of one row) as LibTorch's BLAS
// runs it, without its slowest part: ATen's addmm first copies the bias broadcast over the
// result through TensorIterator (~10 us for [128, 128] here, a quarter of the product), then
// multiplies with beta = 1. Here the rows are filled by memcpy and the product accumulates
// into them in place (addmm_: the same sgemm call). False where the op is not such an addmm.
bool bias_rows_then_addmm(const std::string &callee, const torch::jit::Stack &st, at::Tensor *out) {
  if (callee != "aten::addmm" || st.size() != 5 || !st[0].isTensor() || !is_f32(st[1], 2) || !is_f32(st[2], 2) ||
      !is_one(st[3]) || !is_one(st[4]))
    return false;
  const at::Tensor &bias = st[0].toTensor(), &a = st[1].toTensor(), &b = st[2].toTensor();
  int64_t m = a.size(0), n = b.size(1);
  bool row = bias.scalar_type() == at::kFloat && bias.numel() == n && (bias.dim() == 1 || (bias.dim() == 2 && bias.size(0) == 1)) &&
             bias.stride(-1) == 1;
  if (!row || a.size(1) != b.size(0) || m == 0 || n == 0) return false;
  at::Tensor c = at::empty({m, n});
  const float *src = bias.data_ptr<float>();
  float *dst = c.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * n, src, (size_t)n * sizeof(float));
  c.addmm_(a, b);
  *out = std::move(c);
  return true;
}

// -- column sums -------------------------------------------------------------------------
// sum / mean of a contiguous float32 tensor over its leading dims (a linear layer's bias gradient,
// sum(0) of [64, 1024]; layer norm's weight gradients over [B, T, C]): a row-major [R, C] matrix
// summed down its columns. The trace keeps these as externs (a row kernel walks a column with
// strided loads); LibTorch took 18-34 us for [64, 1024] in a training step. Here the threads take
// blocks of columns and add the rows in order, 16 at a time, the partial sums in a cascade.
// False (LibTorch does it) for anything else.
bool own_column_sum(const std::string &callee, const torch::jit::Stack &st, at::Tensor *out) {
  const bool mean = callee == "aten::mean.dim";
  if ((!mean && callee != "aten::sum.dim_IntList") || st.size() != 4 || !st[0].isTensor() || !st[3].isNone() ||
      !st[2].isBool())
    return false;
  const at::Tensor &x = st[0].toTensor();
  if (x.scalar_type() != at::kFloat || !x.is_contiguous() || x.dim() < 2 || !st[1].isIntList()) return false;
  const int64_t rank = x.dim();
  std::vector<char> reduced((size_t)rank, 0);
  for (int64_t d : st[1].toIntVector()) {
    if (d < -rank || d >= rank) return false;
    reduced[(size_t)(d < 0 ? d + rank : d)] = 1;
  }
  int64_t lead = 0;  // the reduced dims must be exactly dims [0, lead)
  while (lead < rank && reduced[(size_t)lead]) ++lead;
  for (int64_t d = lead; d < rank; ++d)
    if (reduced[(size_t)d]) return false;
  if (lead == 0 || lead == rank) return false;
  int64_t R = 1, C = 1;
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < rank; ++d) {
    (d < lead ? R : C) *= x.size(d);
    if (d >= lead) sizes.push_back(x.size(d));
    else if (st[2].toBool()) sizes.push_back(1);
  }
  if (C < 64 || R < 2) return false;
  *out = at::empty(sizes, x.options());
  const float *src = x.data_ptr<float>();
  float *dst = out->data_ptr<float>();
  const float scale = mean ? 1.0f / (float)R : 1.0f;
  constexpr int64_t kBlock = 64, kChunk = 16;
  parallel((C + kBlock - 1) / kBlock, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kBlock, nc = std::min(kBlock, C - c0);
      // a cascade: kChunk rows into level 0's sum, every kChunk sums of a level into the next
      // level's (the error of a long column's sum stays near a pairwise sum's)
      constexpr int kLevels = 4;
      float level[kLevels + 1][kBlock], part[kBlock];
      int filled[kLevels + 1] = {0};
      for (auto &l : level) std::fill(l, l + nc, 0.0f);
      for (int64_t r0 = 0; r0 < R; r0 += kChunk) {
        std::fill(part, part + nc, 0.0f);
        for (int64_t r = r0; r < std::min(R, r0 + kChunk); ++r) {
          const float *row = src + r * C + c0;
          for (int64_t j = 0; j < nc; ++j) part[j] += row[j];
        }
        const float *up = part;
        for (int l = 0; l <= kLevels; ++l) {  // (the top level takes everything)
          for (int64_t j = 0; j < nc; ++j) level[l][j] += up[j];
          if (l == kLevels || ++filled[l] < kChunk) break;
          std::copy(level[l], level[l] + nc, part);
          std::fill(level[l], level[l] + nc, 0.0f);
          filled[l] = 0;
          up = part;
        }
      }
      float total[kBlock];
      std::copy(level[0], level[0] + nc, total);
      for (int l = 1; l <= kLevels; ++l)
        for (int64_t j = 0; j < nc; ++j) total[j] += level[l][j];
      for (int64_t j = 0; j < nc; ++j) dst[c0 + j] = total[j] * scale;
    }
  });
  return true;
}

// The "blas" side of a product step: OpenBLAS on the trace's threads where blas_matmul takes
// the op, else LibTorch's own call (an addmm's bias rows filled here: bias_rows_then_addmm).
void blas_product(const std::string &callee, const c10::OperatorHandle &op, torch::jit::Stack &stack) {
  at::Tensor out;
  if (blas_matmul(callee, stack, &out) || bias_rows_then_addmm(callee, stack, &out)) {
    stack.clear();
    stack.emplace_back(std::move(out));
    return;
  }
  op.callBoxed(&stack);
}

}  // namespace

std::shared_ptr<ExternOps> resolve_externs(const jit::Trace &t, const jit::Plan &p) {
  auto ops = std::make_shared<ExternOps>();
  std::vector<char> exit_seen;
  int32_t num_guards = 0;
  for (const jit::ExternStep &e : p.externs) num_guards += e.is_exit;
  for (const jit::ExternStep &e : p.externs) {
    if (e.is_exit) {
      auto bad = [&](const std::string &why) {
        jit::fail(ErrorCode::Verify, "guard (instruction " + std::to_string(e.inst) +
                                         "): " + why);
      };
      if (e.args.size() < 3) bad("expects (%cond, expected, exit_id, %live...)");
      const jit::ExternArg &c = e.args[0];
      if (!c.is_tensor || t.types[c.value].dtype != jit::DType::Bool || t.types[c.value].numel() != 1)
        bad("the condition must be a one-element bool tensor");
      if (e.args[1].is_tensor || e.args[1].is_scalar_slot || e.args[1].lit.kind != jit::Operand::Bool)
        bad("the expected value must be true or false");
      const jit::Operand &id = e.args[2].lit;
      if (e.args[2].is_tensor || e.args[2].is_scalar_slot || id.kind != jit::Operand::Int || id.i < 0 ||
          id.i >= num_guards)
        bad("the exit id must be an integer in [0, number of guards = " + std::to_string(num_guards) + ")");
      exit_seen.resize((size_t)num_guards, 0);
      if (exit_seen[(size_t)id.i]++) bad("exit id " + std::to_string(id.i) + " is used twice");
      for (size_t k = 3; k < e.args.size(); ++k)
        if (!e.args[k].is_tensor) bad("live values (operands after the exit id) must be tensors");
      if (e.result_values.size() != 1 || t.types[e.result_values[0]].dtype != jit::DType::Bool ||
          t.types[e.result_values[0]].numel() != 1)
        bad("returns one one-element bool value (the condition)");
      ops->ops.push_back(std::nullopt);
      ops->convs.push_back(nullptr);
      ops->gemms.push_back(nullptr);
      ops->sums.push_back(0);
      continue;
    }
    std::string name = e.callee, overload;
    size_t colons = name.find("::");
    size_t dot = name.find('.', colons == std::string::npos ? 0 : colons);
    if (dot != std::string::npos) {
      overload = name.substr(dot + 1);
      name = name.substr(0, dot);
    }
    auto h = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!h)
      jit::fail(ErrorCode::Compile, "extern " + e.callee + ": no such operator in LibTorch " +
                                        "(schema '" + name + "', overload '" + overload + "')");
    const c10::FunctionSchema &s = h->schema();
    if (e.args.size() > s.arguments().size())
      jit::fail(ErrorCode::Verify, "extern " + e.callee + ": " + std::to_string(e.args.size()) +
                                       " arguments given, the schema takes " + std::to_string(s.arguments().size()));
    for (size_t k = 0; k < e.args.size(); ++k) {
      bool list_param = s.arguments()[k].type()->kind() == c10::TypeKind::ListType;
      if (e.args[k].is_list && !list_param)
        jit::fail(ErrorCode::Verify, "extern " + e.callee + ": argument '" + s.arguments()[k].name() +
                                         "' is not a list, the trace passes a tensor list");
    }
    for (size_t k = e.args.size(); k < s.arguments().size(); ++k)
      if (!s.arguments()[k].default_value())
        jit::fail(ErrorCode::Verify, "extern " + e.callee + ": argument '" + s.arguments()[k].name() +
                                         "' is missing and has no default");
    if (s.returns().size() != e.result_values.size())
      jit::fail(ErrorCode::Verify, "extern " + e.callee + " returns " + std::to_string(s.returns().size()) +
                                       " value(s), the trace names " + std::to_string(e.result_values.size()));
    for (const c10::Argument &r : s.returns())
      if (r.type()->kind() != c10::TypeKind::TensorType)
        jit::fail(ErrorCode::Unsupported, "extern " + e.callee + " returns a non-tensor value");
    if (s.is_mutable())
      jit::fail(ErrorCode::Unsupported, "extern " + e.callee + " mutates its arguments; in-place externs are not supported yet");
    ops->ops.push_back(*h);
    ops->convs.push_back(conv_step_for(e.callee));
    bool product = e.callee == "aten::mm" || e.callee == "aten::addmm" || e.callee == "aten::bmm";
    std::shared_ptr<GemmStep> g;
    if (product) {
      g = std::make_shared<GemmStep>();
      if (forced_gemm() >= 0) g->mode = (GemmStep::Mode)forced_gemm();
    }
    ops->gemms.push_back(std::move(g));
    ops->sums.push_back(e.callee == "aten::sum.dim_IntList" || e.callee == "aten::mean.dim");
  }
  return ops;
}

namespace {
// The product steps of entries of one machine code whose instruction and operand types are the
// same (a size family's instances: a decode step's linear layers at every cache length) share
// their state -- the side timed fastest and the weight packed for it -- so a new instance neither
// times them again nor packs its weights again. (Their packed weights are keyed by content, as
// for one entry; every side computes the same product.) Convolution steps are not shared: their
// state holds more than the choice and the packed weight.
std::mutex step_registry_mu;
std::map<std::string, std::weak_ptr<GemmStep>> gemm_registry;

template <class T>
void share_step(std::map<std::string, std::weak_ptr<T>> &reg, const std::string &key, std::shared_ptr<T> &step) {
  auto found = reg.find(key);
  if (found != reg.end())
    if (std::shared_ptr<T> s = found->second.lock()) {
      step = std::move(s);
      return;
    }
  reg[key] = step;
}

}  // namespace

void share_extern_steps(Entry &e, const void *code) {
  if (!e.externs) return;
  const jit::Trace &t = e.trace;
  std::vector<std::string> lines;
  std::lock_guard<std::mutex> lock(step_registry_mu);
  for (auto it = gemm_registry.begin(); it != gemm_registry.end();)
    it = it->second.expired() ? gemm_registry.erase(it) : std::next(it);
  for (size_t k = 0; k < e.plan.externs.size(); ++k) {
    bool gemm = k < e.externs->gemms.size() && e.externs->gemms[k];
    if (!gemm) continue;
    if (lines.empty()) lines = trace_inst_lines(t);
    const jit::Inst &in = t.insts[(size_t)e.plan.externs[k].inst];
    std::ostringstream key;
    key << code << '|' << k << '|' << lines[(size_t)e.plan.externs[k].inst] << '|';
    for (const jit::Operand &o : in.args)
      if (o.kind == jit::Operand::Value) key << jit::print_type(t.types[(size_t)o.value], true) << ';';
    share_step(gemm_registry, key.str(), e.externs->gemms[k]);
  }
}


std::string extern_choice(const Entry &en, size_t k) {
  if (!en.externs || k >= en.externs->ops.size()) return "";
  if (const auto &c = en.externs->convs[k]) {
    std::string ch = conv_step_choice(*c);
    return ch == "onednn" || ch == "winograd" || ch == "packed" || ch == "timing" ? ch : "aten";
  }
  if (const auto &g = en.externs->gemms[k]) {
    std::lock_guard<std::mutex> l(g->mu);
    return gemm_side_name(g->mode);
  }
  return "";
}

std::string entry_choices(const Entry &en) {
  std::string out;
  if (!en.externs) return out;
  auto add = [&](size_t k, const char *choice) {
    if (!out.empty()) out += ' ';
    out += std::to_string(k) + "=" + choice;
  };
  for (size_t k = 0; k < en.externs->ops.size(); ++k) {
    if (const auto &c = en.externs->convs[k]) {
      std::string ch = conv_step_choice(*c);
      if (ch != "timing") add(k, ch == "onednn" || ch == "winograd" || ch == "packed" ? ch.c_str() : "aten");
    } else if (const auto &g = en.externs->gemms[k]) {
      std::lock_guard<std::mutex> l(g->mu);
      if (g->mode != GemmStep::Timing) add(k, gemm_side_name(g->mode));
    }
  }
  return out;
}

bool set_entry_choices(const Entry &en, const std::string &text, std::string *why) {
  std::vector<std::pair<size_t, std::string>> picks;
  std::istringstream in(text);
  std::string word;
  size_t n = en.externs ? en.externs->ops.size() : 0;
  while (in >> word) {
    size_t eq = word.find('=');
    char *end = nullptr;
    unsigned long long k = eq == std::string::npos ? 0 : strtoull(word.c_str(), &end, 10);
    if (eq == std::string::npos || eq == 0 || end != word.c_str() + eq || !isdigit((unsigned char)word[0])) {
      *why = "'" + word + "' is not <step>=<choice>";
      return false;
    }
    std::string choice = word.substr(eq + 1);
    if (k >= n) {
      *why = "step " + word.substr(0, eq) + " does not exist (the entry has " + std::to_string(n) + " extern steps)";
      return false;
    }
    bool conv = en.externs->convs[k] != nullptr, gemm = en.externs->gemms[k] != nullptr;
    bool fits = conv ? (choice == "onednn" || choice == "winograd" || choice == "packed" || choice == "aten")
                     : gemm ? (choice == "own" || choice == "blas" || choice == "mkl") : false;
    if (!fits) {
      *why = "step " + std::to_string(k) + " (" + en.plan.externs[k].callee + ") cannot take '" + choice + "'" +
             (conv ? " (a convolution: onednn, winograd, packed or aten)" : gemm ? " (a product: own, blas or mkl)" : " (it makes no choice)");
      return false;
    }
    picks.push_back({(size_t)k, choice});
  }
  for (auto &[k, choice] : picks) {
    if (const auto &c = en.externs->convs[k]) {
      conv_step_choose(*c, choice);
    } else {
      GemmStep &g = *en.externs->gemms[k];
      std::lock_guard<std::mutex> l(g.mu);
      g.mode = choice == "own" ? GemmStep::Own : choice == "mkl" ? GemmStep::Mkl : GemmStep::Blas;
      g.watched = kWatchCalls;  // nothing measured in this process to compare with
    }
  }
  return true;
}

std::map<std::string, void *> runtime_symbols() {
  return {{"dynamo_rt_parallel_for", (void *)&dynamo_rt_parallel_for},
          {"dynamo_rt_fill_table", (void *)&dynamo_rt_fill_table},
          {"dynamo_rt_extern", (void *)&dynamo_rt_extern},
          {"dynamo_rt_profile", (void *)&dynamo_rt_profile}};
}

}  // namespace dynamo::runtime

using namespace dynamo;

// Ops of our own that traces call as externs, in the namespace dynamo (beside the guard op,
// which the runtime runs itself). dynamo::fft_r2c is aten::_fft_r2c with its complex result as
// float pairs in a trailing dim of 2 (torch.view_as_real): the form in which a trace holds a
// complex tensor (the recorder's stft spectra), the IR having no complex dtype.
namespace {
at::Tensor fft_r2c_pairs(const at::Tensor &x, c10::IntArrayRef dim, int64_t normalization, bool onesided) {
  return at::view_as_real(at::_fft_r2c(x, dim, normalization, onesided));
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(dynamo, m) {
  m.def("fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor", &fft_r2c_pairs);
}

extern "C" void dynamo_rt_fill_table(void **table, void **slots, const int64_t *desc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (desc[2 * i] < 0)  // a number (a size the kernel reads), not a pointer
      memcpy(&table[i], &desc[2 * i + 1], sizeof(int64_t));
    else
      table[i] = static_cast<char *>(slots[desc[2 * i]]) + desc[2 * i + 1];
  }
}

extern "C" void dynamo_rt_profile(void *vctx, int32_t step) {
  auto *ctx = static_cast<runtime::RunContext *>(vctx);
  if (!ctx->profile_on) return;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch()).count();
  const runtime::Entry &en = *ctx->entry;
  if (ctx->profile_step >= 0 && en.step_times) {
    runtime::StepTime &s = en.step_times[(size_t)ctx->profile_step];
    s.ns.fetch_add(now - ctx->profile_at, std::memory_order_relaxed);
    s.runs.fetch_add(1, std::memory_order_relaxed);
  }
  ctx->profile_step = step;
  ctx->profile_at = now;
}

extern "C" int32_t dynamo_rt_parallel_for(void *vctx, dynamo_rt_kernel_fn kernel, void **slots, int64_t n,
                                          int64_t grain) {
  auto *ctx = static_cast<runtime::RunContext *>(vctx);
  if (ctx->num_threads == 1 || n <= grain || at::get_num_threads() == 1 || at::in_parallel_region())
    return kernel(slots, 0, n);
  std::atomic<int32_t> status{0};
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    int32_t r = kernel(slots, b, e);
    if (r) status.store(r);
  });
  return status.load();
}

namespace {

// A tensor over trace memory (no copy): the extern argument or guard operand `a`.
at::Tensor arg_tensor(const runtime::Entry &en, void **slots, const jit::ExternArg &a) {
  const jit::Type &ty = en.trace.types[a.value];
  char *base = static_cast<char *>(slots[a.view.slot]);
  int64_t es = jit::dtype_bytes(ty.dtype);
  auto opts = at::TensorOptions().dtype(runtime::scalar_type_of(ty.dtype)).device(at::kCPU);
  return at::from_blob(base + a.view.offset * es, ty.sizes, a.view.strides, opts);
}

// The caller's version of extern argument k, when it is a whole trace input the caller versions
// (DYNAMO_ARG_FLAG_VERSIONED); else null.
const uint64_t *arg_version(const runtime::RunContext *ctx, const jit::ExternStep &e, size_t k) {
  if (k >= e.args.size()) return nullptr;
  const jit::ExternArg &w = e.args[k];
  if (!w.is_tensor || w.view.offset != 0 || (size_t)w.view.slot >= ctx->nargs) return nullptr;
  const dynamo_arg &a = ctx->args[w.view.slot];
  if (a.kind != DYNAMO_ARG_TENSOR || !(a.flags & DYNAMO_ARG_FLAG_VERSIONED)) return nullptr;
  return &reinterpret_cast<const dynamo_versioned_tensor *>(a.u.tensor)->version;
}

}  // namespace

DLManagedTensor *dynamo::runtime::hand_out_extern_result(const runtime::RunContext &ctx, const void *data) {
  for (const std::shared_ptr<void> &k : ctx.keep) {
    at::Tensor t = *static_cast<const at::Tensor *>(k.get());  // (keep holds only tensors)
    if (t.data_ptr() != data) continue;
    // A result that is a view of memory the call only borrowed (an input, an output buffer,
    // the scratch arena: tensors made by from_blob, whose storage has no allocator context) would
    // dangle once the call returns: that one is copied.
    if (!t.storage().data_ptr().get_context()) t = t.clone(at::MemoryFormat::Contiguous);
    bool is_bool = t.scalar_type() == at::kBool;
    DLManagedTensor *m = at::toDLPack(is_bool ? t.view(at::kByte) : t);
    if (is_bool) m->dl_tensor.dtype = {DYNAMO_DL_BOOL, 8, 1};  // the C API's bool
    return m;
  }
  return nullptr;
}

namespace {

// The guard op: passes (result = the condition) or takes the side exit with copies of the
// live values, which outlive the call's scratch memory.
int32_t run_guard(runtime::RunContext *ctx, void **slots, const jit::ExternStep &e) {
  const runtime::Entry &en = *ctx->entry;
  const jit::ExternArg &c = e.args[0];
  const char *cond = static_cast<const char *>(slots[c.view.slot]) + c.view.offset;
  slots[e.result_slots[0]] = const_cast<char *>(cond);
  if ((*cond != 0) == (e.args[1].lit.i != 0)) return DYNAMO_RT_OK;
  ctx->exit.clear();
  ctx->exit.id = (int32_t)e.args[2].lit.i;
  for (size_t k = 3; k < e.args.size(); ++k) {
    at::Tensor v = arg_tensor(en, slots, e.args[k]).clone(at::MemoryFormat::Contiguous);
    bool is_bool = v.scalar_type() == at::kBool;
    DLManagedTensor *m = at::toDLPack(is_bool ? v.view(at::kByte) : v);
    if (is_bool) m->dl_tensor.dtype = {DYNAMO_DL_BOOL, 8, 1};  // the C API's bool
    ctx->exit.values.push_back(m);
  }
  return DYNAMO_RT_SIDE_EXIT;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs side m of a product step on stack (its arguments; after, its result); false when that
// side cannot take the op (the caller uses another).
bool run_side(runtime::GemmStep::Mode m, runtime::GemmStep &g, const std::string &callee, const uint64_t *b_version,
              const c10::OperatorHandle &op, torch::jit::Stack &stack) {
  if (m == runtime::GemmStep::Blas) {
    runtime::blas_product(callee, op, stack);
    return true;
  }
  at::Tensor out;
  bool ok = m == runtime::GemmStep::Own ? runtime::own_matmul(callee, stack, &out, &g, b_version)
                                        : runtime::mkl_matmul(callee, stack, g, b_version, &out);
  if (!ok) return false;
  stack.clear();
  stack.emplace_back(std::move(out));
  return true;
}

// After the choice, the kept packing of a side not taken is dropped (MKL's is several times the
// weight's size). Called with g.mu held.
void drop_unused_packings(runtime::GemmStep &g) {
  if (g.mode != runtime::GemmStep::Own) g.packed_b.clear();
  if (g.mode != runtime::GemmStep::Mkl) g.mkl_b.clear();
}

// Whether the product on the stack is one row (aten::mm / addmm with A of one row) of a dtype the
// own GEMV takes on this CPU: float32, or bfloat16 where bf16_gemm_available().
bool one_row_product(const std::string &callee, const torch::jit::Stack &stack) {
  const bool addmm = callee == "aten::addmm";
  if (!(addmm || callee == "aten::mm") || stack.size() < (addmm ? 3u : 2u)) return false;
  const c10::IValue &a = stack[addmm ? 1 : 0];
  if (!a.isTensor() || a.toTensor().dim() != 2 || a.toTensor().size(0) != 1) return false;
  const at::ScalarType t = a.toTensor().scalar_type();
  return t == at::kFloat || (t == at::kBFloat16 && runtime::bf16_gemm_available());
}

// A matrix product step (GemmStep): LibTorch's BLAS, the own GEMM or MKL's packed one, as the
// step measured; the stack holds the arguments and, after, the result.
void run_product(runtime::GemmStep &g, const jit::ExternStep &e, const runtime::RunContext *ctx,
                 const c10::OperatorHandle &op, torch::jit::Stack &stack) {
  using Mode = runtime::GemmStep::Mode;
  Mode mode;
  {
    std::lock_guard<std::mutex> l(g.mu);
    mode = g.mode;
  }
  const uint64_t *b_version = arg_version(ctx, e, e.callee == "aten::addmm" ? 2 : 1);
  if (mode == Mode::Timing && one_row_product(e.callee, stack)) {
    // One row against a weight (a decode step's linear layers) is bound by the weight's bytes:
    // the own GEMV streams them once, at the memory's speed (26-40 GB/s here against LibTorch's
    // 9 for a 32000 x 512 weight), and is taken untimed: timing every side cost a decode step's
    // first two runs ~40x a steady one (MKL's side packs every weight first).
    std::lock_guard<std::mutex> l(g.mu);
    if (g.mode == Mode::Timing) {
      g.mode = Mode::Own;
      drop_unused_packings(g);
    }
    mode = g.mode;
  }
  if (mode != Mode::Timing) {
    bool watch;
    {
      std::lock_guard<std::mutex> l(g.mu);
      watch = g.watched < runtime::kWatchCalls;
    }
    double t0 = watch ? seconds_now() : 0;
    if (!run_side(mode, g, e.callee, b_version, op, stack)) run_side(Mode::Blas, g, e.callee, b_version, op, stack);
    if (watch) {
      double t = seconds_now() - t0;
      std::lock_guard<std::mutex> l(g.mu);
      g.t_watch = std::min(g.t_watch, t);
      if (++g.watched == runtime::kWatchCalls) {
        Mode other = Mode::Timing;  // the fastest side measured besides the chosen one
        for (int s = 0; s < runtime::GemmStep::kSides; ++s)
          if (s != g.mode && g.t[s] < 1e30 && (other == Mode::Timing || g.t[s] < g.t[other])) other = (Mode)s;
        if (other != Mode::Timing && g.t_watch > 1.5 * g.t[other]) {
          if (getenv("DYNAMO_PRINT_CHOICES"))
            fprintf(stderr, "%s switched to %s: its %d calls took %.1f us at best, %s measured %.1f us\n",
                    e.callee.c_str(), runtime::gemm_side_name(other), runtime::kWatchCalls, g.t_watch * 1e6,
                    runtime::gemm_side_name(other), g.t[other] * 1e6);
          g.mode = other;
          drop_unused_packings(g);
        } else if (g.b_changing && !g.retimed) {
          g.retimed = true;
          g.mode = Mode::Timing;
          g.timed = 0;
          g.watched = 0;
          g.t_watch = 1e30;
        }
      }
    }
    return;
  }
  // Timing: every side that takes the op, the fastest one's result kept (they agree within
  // rounding). The order rotates between the timed calls: a later side can find an earlier
  // one's threads still spinning (OpenBLAS's after a BLAS call, OpenMP's after ours) and lose
  // for that alone.
  int first;
  {
    std::lock_guard<std::mutex> l(g.mu);
    first = g.timed % runtime::GemmStep::kSides;
  }
  torch::jit::Stack results[runtime::GemmStep::kSides];
  double t[runtime::GemmStep::kSides] = {1e30, 1e30, 1e30};
  for (int i = 0; i < runtime::GemmStep::kSides; ++i) {
    int s = (first + i) % runtime::GemmStep::kSides;
    results[s] = stack;
    double t0 = seconds_now();
    if (run_side((Mode)s, g, e.callee, b_version, op, results[s])) t[s] = seconds_now() - t0;
  }
  std::lock_guard<std::mutex> l(g.mu);
  int best = Mode::Blas;  // (always measured: it takes every op)
  for (int s = 0; s < runtime::GemmStep::kSides; ++s) {
    g.t[s] = std::min(g.t[s], t[s]);
    if (t[s] < t[best]) best = s;
  }
  // (The own GEMM's and MKL's first calls also pack B: the second call, B kept, decides for them.)
  if (++g.timed >= runtime::kTimedCalls) {
    int chosen = Mode::Blas;
    for (int s = 0; s < runtime::GemmStep::kSides; ++s)
      if (g.t[s] < g.t[chosen]) chosen = s;
    g.mode = (Mode)chosen;
    drop_unused_packings(g);
    if (getenv("DYNAMO_PRINT_CHOICES")) {
      fprintf(stderr, "%s %s (B kept: %s%s):", e.callee.c_str(), runtime::gemm_side_name(g.mode), b_version ? "yes" : "no",
              g.retimed ? "; timed again, B changing" : "");
      for (int s = 0; s < runtime::GemmStep::kSides; ++s)
        if (g.t[s] < 1e30) fprintf(stderr, " %s %.1f us", runtime::gemm_side_name((Mode)s), g.t[s] * 1e6);
      fprintf(stderr, "\n");
    }
  }
  stack = std::move(results[best]);
}

}  // namespace

extern "C" int32_t dynamo_rt_extern(void *vctx, void **slots, int32_t index) {
  auto *ctx = static_cast<runtime::RunContext *>(vctx);
  const runtime::Entry &en = *ctx->entry;
  const jit::ExternStep &e = en.plan.externs[index];
  if (!en.externs->ops[index]) {
    try {
      return run_guard(ctx, slots, e);
    } catch (const std::exception &ex) {
      ctx->error = std::string("side exit: ") + ex.what();
      return DYNAMO_RT_EXTERN_FAILED;
    }
  }
  const c10::OperatorHandle &op = *en.externs->ops[index];
  const c10::FunctionSchema &schema = op.schema();
  try {
    torch::jit::Stack stack;
    for (size_t k = 0; k < e.args.size(); ++k) {
      const jit::ExternArg &a = e.args[k];
      const c10::Argument *sa = &schema.arguments()[k];
      if (a.is_list) {  // Tensor[] or Tensor?[] (schema says which)
        const c10::TypePtr &lt = sa->type();
        bool optional = lt->kind() == c10::TypeKind::ListType &&
                        lt->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::OptionalType;
        if (optional) {
          c10::List<c10::optional<at::Tensor>> l;
          for (const jit::ExternArg &x : a.elems)
            l.push_back(x.is_tensor ? c10::optional<at::Tensor>(arg_tensor(en, slots, x)) : c10::nullopt);
          stack.emplace_back(std::move(l));
        } else {
          c10::List<at::Tensor> l;
          for (const jit::ExternArg &x : a.elems) {
            if (!x.is_tensor) {
              ctx->error = "extern " + e.callee + ": argument '" + sa->name() + "' takes tensors, not none";
              return DYNAMO_RT_EXTERN_FAILED;
            }
            l.push_back(arg_tensor(en, slots, x));
          }
          stack.emplace_back(std::move(l));
        }
      } else if (a.is_tensor) {
        stack.emplace_back(arg_tensor(en, slots, a));
      } else if (a.is_scalar_slot) {
        const jit::Type &ty = en.trace.types[a.value];
        int64_t bits;
        memcpy(&bits, &slots[a.slot], 8);
        if (ty.dtype == jit::DType::F64) {
          double d;
          memcpy(&d, &bits, 8);
          stack.emplace_back(d);
        } else if (ty.dtype == jit::DType::Bool) {
          stack.emplace_back(bits != 0);
        } else if (sa->type()->kind() == c10::TypeKind::FloatType) {
          stack.emplace_back((double)bits);
        } else {
          stack.emplace_back(bits);
        }
      } else {
        stack.push_back(runtime::literal_ivalue(a.lit, sa));
      }
    }
    for (size_t k = e.args.size(); k < schema.arguments().size(); ++k)
      stack.push_back(*schema.arguments()[k].default_value());
    at::Tensor own;
    if (const auto &conv = en.externs->convs[index]) {
      runtime::run_conv(*conv, stack, arg_version(ctx, e, 1), [&] {
        torch::jit::Stack copy = stack;
        op.callBoxed(&copy);
        return copy.at(0).toTensor();
      }, &own);
      stack.clear();
      stack.emplace_back(std::move(own));
    } else if (const auto &g = en.externs->gemms[index]) {
      run_product(*g, e, ctx, op, stack);
    } else if (en.externs->sums[index] && runtime::own_column_sum(e.callee, stack, &own)) {
      stack.clear();
      stack.emplace_back(std::move(own));
    } else {
      op.callBoxed(&stack);
    }
    if (stack.size() != e.result_values.size()) {
      ctx->error = "extern " + e.callee + " returned " + std::to_string(stack.size()) + " values";
      return DYNAMO_RT_EXTERN_FAILED;
    }
    for (size_t r = 0; r < stack.size(); ++r) {
      at::Tensor res = stack[r].toTensor();
      const jit::Type &ty = en.trace.types[e.result_values[r]];
      if (res.scalar_type() != runtime::scalar_type_of(ty.dtype) || res.sizes() != c10::IntArrayRef(ty.sizes)) {
        ctx->error = "extern " + e.callee + " result " + std::to_string(r) + " is " +
                     std::string(c10::toString(res.scalar_type())) + runtime::sizes_text(res.sizes()) +
                     ", the trace expected " + jit::print_type(ty, false);
        return DYNAMO_RT_EXTERN_FAILED;
      }
      res = res.contiguous();
      slots[e.result_slots[r]] = res.data_ptr();
      ctx->keep.push_back(std::make_shared<at::Tensor>(std::move(res)));
      if (!en.plan.slot_kept.empty() && en.plan.slot_kept[(size_t)e.result_slots[r]])  // (kept across calls)
        ctx->kept_results.push_back({e.result_slots[r], slots[e.result_slots[r]], ctx->keep.back()});
    }
    return DYNAMO_RT_OK;
  } catch (const std::exception &ex) {
    std::string what = ex.what();
    size_t nl = what.find("\nException raised from");
    if (nl != std::string::npos) what = what.substr(0, nl);
    ctx->error = "extern " + e.callee + " failed: " + what;
    return DYNAMO_RT_EXTERN_FAILED;
  }
}
