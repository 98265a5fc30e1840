// decompose.cpp -- ATen ops recorded as externs that we generate ourselves are rewritten into
// trace ops before fusion: _softmax, _log_softmax, native_layer_norm, layer_norm, eval-mode
// native_batch_norm, native_group_norm, prelu, gelu, silu, hardswish, mean.dim, var_mean, sum/amax/amin/argmax/var/std
// and common pointwise ops (addcmul, addcdiv, rsub, masked_fill with a number, _to_copy of a dtype),
// indexing by integer tensors (index.Tensor, index_select, embedding: the index op, a gather);
// reductions of at most four elements per output become pointwise. A
// rewrite is kept only if it reproduces the extern's declared result types exactly;
// otherwise the extern stays (it is still correct, just not fused). A float16/bfloat16 extern
// is rewritten in float32 and its results rounded once, as ATen's kernels compute it.
#include <algorithm>
#include <map>
#include <tuple>

#include "ir.h"

namespace dynamo::jit {

namespace {

struct Rewriter {
  Trace &out;
  explicit Rewriter(Trace &o) : out(o) {}

  int32_t emit(Op op, std::vector<Operand> args) {
    Inst in;
    in.op = op;
    in.args = std::move(args);
    std::vector<Type> ty = infer_types(out, in, std::string("decomposition of ") + op_info(op).name);
    int32_t idx = (int32_t)out.insts.size();
    int32_t v = out.new_value(ty[0], idx);
    in.results.push_back(v);
    out.insts.push_back(std::move(in));
    return v;
  }

  // An extern call (its result type given: externs are not inferred).
  int32_t emit_extern(const std::string &callee, std::vector<Operand> args, const Type &ty) {
    Inst in;
    in.op = Op::extern_;
    in.callee = callee;
    in.args = std::move(args);
    int32_t v = out.new_value(ty, (int32_t)out.insts.size());
    in.results.push_back(v);
    out.insts.push_back(std::move(in));
    return v;
  }
};

Operand V(int32_t v) { return Operand::val(v); }
Operand I(int64_t v) { return Operand::integer(v); }
Operand Bo(bool v) { return Operand::boolean(v); }
Operand L(std::vector<int64_t> v) {
  Operand o;
  o.kind = Operand::IntList;
  o.list = std::move(v);
  return o;
}

const std::map<std::string, Op> &unary_table() {
  static const std::map<std::string, Op> m = {
      {"aten::relu", Op::relu},       {"aten::sigmoid", Op::sigmoid},   {"aten::tanh", Op::tanh},
      {"aten::exp", Op::exp},         {"aten::log", Op::log},           {"aten::sqrt", Op::sqrt},
      {"aten::rsqrt", Op::rsqrt},     {"aten::neg", Op::neg},           {"aten::abs", Op::abs},
      {"aten::sin", Op::sin},         {"aten::cos", Op::cos},           {"aten::erf", Op::erf},
      {"aten::silu", Op::silu},       {"aten::hardswish", Op::hardswish}, {"aten::reciprocal", Op::reciprocal},
      {"aten::floor", Op::floor},     {"aten::ceil", Op::ceil},         {"aten::trunc", Op::trunc},
      {"aten::round", Op::round},     {"aten::sign", Op::sign},         {"aten::expm1", Op::expm1},
      {"aten::log1p", Op::log1p},     {"aten::log2", Op::log2},         {"aten::logical_not", Op::logical_not},
      {"aten::clone", Op::copy},      {"aten::tan", Op::tan},
  };
  return m;
}

const std::map<std::string, Op> &binary_table() {
  static const std::map<std::string, Op> m = {
      {"aten::mul.Tensor", Op::mul},  {"aten::mul.Scalar", Op::mul},  {"aten::div.Tensor", Op::div},
      {"aten::div.Scalar", Op::div},  {"aten::maximum", Op::maximum}, {"aten::minimum", Op::minimum},
      {"aten::eq.Tensor", Op::eq},    {"aten::eq.Scalar", Op::eq},    {"aten::ne.Tensor", Op::ne},
      {"aten::ne.Scalar", Op::ne},    {"aten::lt.Tensor", Op::lt},    {"aten::lt.Scalar", Op::lt},
      {"aten::le.Tensor", Op::le},    {"aten::le.Scalar", Op::le},    {"aten::gt.Tensor", Op::gt},
      {"aten::gt.Scalar", Op::gt},    {"aten::ge.Tensor", Op::ge},    {"aten::ge.Scalar", Op::ge},
      {"aten::pow.Tensor_Scalar", Op::pow}, {"aten::pow.Tensor_Tensor", Op::pow},
      {"aten::logical_and", Op::logical_and}, {"aten::logical_or", Op::logical_or},
  };
  return m;
}

// The extern's argument k, or none when it was left to its default.
const Operand &arg(const Inst &in, size_t k) {
  static const Operand none;
  return k < in.args.size() ? in.args[k] : none;
}

bool is_tensor(const Trace &t, const Operand &o) { return o.kind == Operand::Value && t.types[o.value].tensor; }

// A multiplier (alpha, value) left to its default or given as 1; float_one: 1.0 counts too (where
// ATen's kernel would not promote by it).
bool is_one(const Operand &o, bool float_one = false) {
  return o.kind == Operand::None || (o.kind == Operand::Int && o.i == 1) ||
         (float_one && o.kind == Operand::Float && o.f == 1.0);
}

// A result the rewrite does not produce (-1 in its list): allowed only where nothing uses it.
constexpr int32_t kUnused = -1;

// A depthwise 1-D convolution (groups = channels in = channels out, aten::convolution on
// [N, C, T]) as the weighted sum of its taps: y = sum_k w[:, k] * xp[:, :, k*d : ... : s] (+ bias)
// over xp, x zero-padded once (aten::constant_pad_nd). The taps are views of xp, so the whole sum
// is one fused loop, with whatever follows it (PReLU, group norm). oneDNN 2.6 and LibTorch both
// take ~100 us for ConvTasNet's [1, 128, 501] dilated 3-tap convolutions (0.4 M multiply-adds).
// {} when the convolution is anything else, or has more than 32 taps.
std::vector<int32_t> depthwise_conv1d(Rewriter &r, const Inst &in) {
  Trace &out = r.out;
  const Operand &x = arg(in, 0), &w = arg(in, 1), &b = arg(in, 2);
  const Operand &stride = arg(in, 3), &pad = arg(in, 4), &dil = arg(in, 5), &transposed = arg(in, 6);
  const Operand &groups = arg(in, 8);
  if (!is_tensor(out, x) || !is_tensor(out, w)) return {};
  const Type xt = out.types[x.value], wt = out.types[w.value];  // copies: emitting grows out.types
  auto one = [](const Operand &o) { return o.kind == Operand::IntList && o.list.size() == 1; };
  if (xt.dtype != DType::F32 || wt.dtype != DType::F32 || xt.rank() != 3 || wt.rank() != 3 || !one(stride) ||
      !one(pad) || !one(dil) || transposed.kind != Operand::Bool || transposed.i || groups.kind != Operand::Int)
    return {};
  const int64_t n = xt.sizes[0], ch = xt.sizes[1], len = xt.sizes[2], taps = wt.sizes[2];
  const int64_t s = stride.list[0], p = pad.list[0], d = dil.list[0];
  if (groups.i != ch || wt.sizes[0] != ch || wt.sizes[1] != 1 || taps < 1 || taps > 32 || s < 1 || p < 0 || d < 1 ||
      n < 1 || ch < 1)
    return {};
  const int64_t span = d * (taps - 1) + 1, padded = len + 2 * p;
  if (padded < span) return {};
  const int64_t out_len = (padded - span) / s + 1;
  Operand xp = x;
  if (p > 0) {
    Type pt;
    pt.sizes = {n, ch, padded};
    xp = V(r.emit_extern("aten::constant_pad_nd", {x, L({p, p}), Operand::real(0.0)}, pt));
  }
  int32_t acc = -1;
  for (int64_t k = 0; k < taps; ++k) {
    int32_t tap = r.emit(Op::slice, {xp, I(2), I(k * d), I(k * d + (out_len - 1) * s + 1), I(s)});
    int32_t wk = r.emit(Op::select, {w, I(2), I(k)});  // [C, 1]: broadcasts over the frames
    int32_t term = r.emit(Op::mul, {V(tap), V(wk)});
    acc = acc < 0 ? term : r.emit(Op::add, {V(acc), V(term)});
  }
  if (is_tensor(out, b)) acc = r.emit(Op::add, {V(acc), V(r.emit(Op::reshape, {b, L({ch, 1})}))});
  return {acc};
}

// Indexing by integer tensors as the index op (a gather fused into the loops that read it):
// aten::index.Tensor whose index tensors are one block of adjacent dims (Nones before it: x[:,
// i, j]; ATen moves the result dims of separated index tensors to the front, which stays an
// extern), aten::index_select and aten::embedding (the forward: rows of the weight). torchvision's
// Python roi_align gathers its bilinear samples this way, relative position biases and
// embeddings their rows. Half and bool sources are gathered as they are (no float32 copy: a
// gather computes nothing). {} for anything else (boolean masks, other index dtypes).
bool is_gather_callee(const std::string &c) {
  return c == "aten::index.Tensor" || c == "aten::index_select" || c == "aten::embedding";
}

// An index tensor for a dim of n elements where ATen refuses negative indices (embedding,
// index_select raise IndexError where index.Tensor counts from the end): negatives made n, out of
// range, so the index op stops with its IndexError status and eager raises its own.
Operand no_negatives(Rewriter &r, const Operand &idx, int64_t n) {
  int32_t neg = r.emit(Op::lt, {idx, I(0)});
  return V(r.emit(Op::where, {V(neg), I(n), idx}));
}

std::vector<int32_t> rewrite_gather(Trace &out, const Inst &in) {
  Rewriter r(out);
  const std::string &c = in.callee;
  const Operand &x0 = arg(in, 0);
  if (c == "aten::embedding") {  // embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
    const Operand &w = arg(in, 0), &ids = arg(in, 1);
    if (!is_tensor(out, w) || !is_tensor(out, ids) || out.types[w.value].rank() != 2 ||
        !is_int(out.types[ids.value].dtype))
      return {};
    return {r.emit(Op::index, {w, I(0), no_negatives(r, ids, out.types[w.value].sizes[0])})};
  }
  if (!is_tensor(out, x0)) return {};
  const int64_t rank = out.types[x0.value].rank();
  if (c == "aten::index_select") {  // index_select(x, dim, index): a 0-dim index keeps the dim (size 1)
    const Operand &dim = arg(in, 1), &ix = arg(in, 2);
    if (dim.kind != Operand::Int || !is_tensor(out, ix) || rank == 0) return {};
    const Type it = out.types[ix.value];
    if (!is_int(it.dtype) || it.rank() > 1) return {};
    int64_t d = dim.i < 0 ? dim.i + rank : dim.i;
    if (d < 0 || d >= rank) return {};
    Operand i1 = it.rank() == 1 ? ix : V(r.emit(Op::reshape, {ix, L({1})}));
    return {r.emit(Op::index, {x0, I(d), no_negatives(r, i1, out.types[x0.value].sizes[(size_t)d])})};
  }
  // index.Tensor(x, [i0, ...]): the list marker, then its elements
  const Operand &list = arg(in, 1);
  if (list.kind != Operand::TensorList) return {};
  std::vector<Operand> args{x0, I(0)};
  int64_t first = -1;
  bool ended = false;
  for (int64_t e = 0; e < list.i; ++e) {
    const Operand &o = arg(in, 2 + (size_t)e);
    if (o.kind == Operand::None) {
      ended = first >= 0;
      continue;
    }
    if (!is_tensor(out, o) || !is_int(out.types[o.value].dtype) || ended) return {};
    if (first < 0) first = e;
    args.push_back(o);
  }
  if (first < 0) return {};
  args[1] = I(first);
  return {r.emit(Op::index, std::move(args))};
}

// A stack/cat's arguments: 2-4 tensors of one dtype (ts) and its dim, made non-negative for a
// result of `rank` dims (rank_extra: 1 for stack's new dim, 0 for cat). false when it is not
// that (another count, a non-tensor, mixed dtypes, a dim out of range).
bool list_and_dim(const Trace &out, const Inst &in, int64_t rank_extra, std::vector<Operand> *ts, int64_t *dim) {
  const Operand &list = arg(in, 0);
  if (list.kind != Operand::TensorList || list.i < 2 || list.i > 4) return false;
  for (int64_t e = 0; e < list.i; ++e) {
    const Operand &o = arg(in, 1 + (size_t)e);
    if (!is_tensor(out, o) || (!ts->empty() && out.types[o.value].dtype != out.types[(*ts)[0].value].dtype))
      return false;
    ts->push_back(o);
  }
  const Operand &d = arg(in, 1 + (size_t)list.i);
  const int64_t rank = out.types[(*ts)[0].value].rank() + rank_extra;
  if (rank == 0 || (d.kind != Operand::Int && d.kind != Operand::None)) return false;
  *dim = d.kind == Operand::Int ? d.i : 0;
  if (*dim < 0) *dim += rank;
  return *dim >= 0 && *dim < rank;
}

// aten::stack(tensors, dim) of 2-4 tensors of one dtype and shape, as where() over the positions
// along the new dim: where(pos == 0, t0, where(pos == 1, t1, ... t_n-1)), each tensor unsqueezed
// at dim (broadcast along it) and pos an aten::arange(n) shaped to lie along dim (computed from
// constants alone: a kept step). It then fuses with its producers and readers where the extern
// copied every element (rotary embeddings' stack of -x[..., 1::2] and x[..., ::2]).
std::vector<int32_t> rewrite_stack(Trace &out, const Inst &in) {
  Rewriter r(out);
  std::vector<Operand> ts;
  int64_t d;
  if (!list_and_dim(out, in, 1, &ts, &d)) return {};
  for (const Operand &o : ts)
    if (out.types[o.value].sizes != out.types[ts[0].value].sizes) return {};
  const int64_t n = (int64_t)ts.size(), rank = out.types[ts[0].value].rank() + 1;
  Type pt;
  pt.dtype = DType::I64;
  pt.sizes = {n};
  int32_t pos = r.emit_extern("aten::arange", {I(n)}, pt);
  std::vector<int64_t> along{n};
  for (int64_t k = d + 1; k < rank; ++k) along.push_back(1);
  const Operand at = V(r.emit(Op::reshape, {V(pos), L(along)}));
  int32_t acc = r.emit(Op::unsqueeze, {ts[(size_t)n - 1], I(d)});
  for (int64_t k = n - 2; k >= 0; --k) {
    int32_t here = r.emit(Op::eq, {at, I(k)});
    acc = r.emit(Op::where, {V(here), V(r.emit(Op::unsqueeze, {ts[(size_t)k], I(d)})), V(acc)});
  }
  return {acc};
}

// aten::cat(tensors, dim) of 2-4 non-empty tensors of one dtype and rank, as where() over the
// positions along dim: input k is gathered (the index op) at pos - offset_k, clamped into its
// extent, and chosen where pos falls in its span; pos, the clamped positions and the spans are
// externs computed from constants alone (kept between calls). Each gather reads whole rows where
// dim is not the last (a contiguous load per row), so the concatenation fuses with its readers
// (rotary embeddings' cat of -x2 and x1, a class token's cat before them). 4-D values along dim
// 1 -- a CNN's channel concatenation -- stay the extern, which the layout pass keeps
// channels-last (jit/layout.cpp).
std::vector<int32_t> rewrite_cat(Trace &out, const Inst &in) {
  Rewriter r(out);
  std::vector<Operand> ts;
  int64_t d;
  if (!list_and_dim(out, in, 0, &ts, &d)) return {};
  const Type &t0 = out.types[ts[0].value];
  const int64_t n = (int64_t)ts.size(), rank = t0.rank();
  if (rank == 4 && d == 1) return {};
  std::vector<int64_t> offset;
  int64_t total = 0;
  for (const Operand &o : ts) {
    const Type &ty = out.types[o.value];
    if (ty.rank() != rank || ty.sizes[(size_t)d] == 0) return {};
    for (int64_t k = 0; k < rank; ++k)
      if (k != d && ty.sizes[(size_t)k] != t0.sizes[(size_t)k]) return {};
    offset.push_back(total);
    total += ty.sizes[(size_t)d];
  }
  Type pt;
  pt.dtype = DType::I64;
  pt.sizes = {total};
  const Operand pos = V(r.emit_extern("aten::arange", {I(total)}, pt));
  std::vector<int64_t> along{total};
  for (int64_t k = d + 1; k < rank; ++k) along.push_back(1);
  // The positions each input is read at, and where each one's span ends, are externs too: their
  // numbers follow from the sizes, and kept as literals in the kernels they would make each
  // size's code its own (no sharing of machine code across a size family).
  auto piece = [&](size_t k) {
    const int64_t extent = out.types[ts[k].value].sizes[(size_t)d];
    int32_t from = r.emit_extern("aten::sub.Scalar", {pos, I(offset[k])}, pt);
    int32_t at = r.emit_extern("aten::clamp", {V(from), I(0), I(extent - 1)}, pt);
    return r.emit(Op::index, {ts[k], I(d), V(at)});
  };
  Type mt;
  mt.dtype = DType::Bool;
  mt.sizes = {total};
  int32_t acc = piece((size_t)n - 1);
  for (int64_t k = n - 2; k >= 0; --k) {
    const int64_t end = offset[(size_t)k] + out.types[ts[(size_t)k].value].sizes[(size_t)d];
    int32_t here = r.emit(Op::reshape, {V(r.emit_extern("aten::lt.Scalar", {pos, I(end)}, mt)), L(along)});
    acc = r.emit(Op::where, {V(here), V(piece((size_t)k)), V(acc)});
  }
  return {acc};
}

std::vector<int32_t> unroll_small_reduction(Trace &out, const Inst &in);

// dims (negative ones counted from the end) as dims of a tensor of rank dims, sorted; false when
// one is out of range or appears twice.
bool normalize_dims(std::vector<int64_t> &dims, int64_t rank) {
  for (int64_t &d : dims) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return false;
  }
  std::sort(dims.begin(), dims.end());
  return std::adjacent_find(dims.begin(), dims.end()) == dims.end();
}

// A reduction op (x, [dims], keepdim); one of at most kUnrolledReduction elements per output
// unrolled into pointwise ops (unroll_small_reduction).
int32_t reduction(Rewriter &r, Op op, std::vector<Operand> args) {
  Inst in;
  in.op = op;
  in.args = args;
  std::vector<int32_t> u = unroll_small_reduction(r.out, in);
  return u.empty() ? r.emit(op, std::move(args)) : u[0];
}

// A float sum or mean over leading dims -- every reduced dim of more than one element before
// every kept one, at least 16 elements kept: a column reduction (a linear layer's bias gradient,
// sum(0) of [64, 1024]; layer norm's weight gradients over [B, T, C]). A row kernel walks each
// kept element's column with strided gathers, ~10x eager's time there (98 against 10 us), so the
// extern stays (its input is stored: in a backward the product that follows reads it anyway) and
// the runtime sums down the columns (aten_extern.cpp own_column_sum; LibTorch's sum where the
// input is strided or has fewer than 64 columns). CPU values only.
bool column_reduction(const Trace &out, const Operand &x, std::vector<int64_t> dims) {
  const Type &xt = out.types[x.value];
  if (xt.device.kind != DeviceKind::CPU || (xt.dtype != DType::F32 && xt.dtype != DType::F64) || dims.empty())
    return false;
  const int64_t rank = xt.rank();
  if (!normalize_dims(dims, rank)) return false;
  int64_t reduced = 1, kept = 1, last_reduced = -1, first_kept = rank;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t n = xt.sizes[(size_t)d];
    if (n == 1) continue;
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
      reduced *= n;
      last_reduced = d;
    } else {
      kept *= n;
      first_kept = std::min(first_kept, d);
    }
  }
  return reduced >= 2 && kept >= 16 && last_reduced < first_kept;
}

// Returns the values replacing in.results (already remapped operands), or {} if not handled.
std::vector<int32_t> rewrite(Trace &out, const Inst &in, bool conv_as_mm) {
  Rewriter r(out);
  const std::string &c = in.callee;
  const Operand &x = arg(in, 0);
  if (!is_tensor(out, x)) return {};
  auto dims_of = [&](const Operand &o) -> std::vector<int64_t> {
    if (o.kind == Operand::IntList) return o.list;
    if (o.kind == Operand::Int) return {o.i};
    return {};  // none: every dim
  };
  auto keep = [&](size_t k, bool dflt) { return arg(in, k).kind == Operand::Bool ? arg(in, k).i != 0 : dflt; };

  if (c == "aten::_softmax" || c == "aten::_log_softmax" || c == "aten::softmax.int" || c == "aten::log_softmax.int") {
    bool half = c[6] == '_' && arg(in, 2).kind == Operand::Bool && arg(in, 2).i;
    if (half || (c.find(".int") != std::string::npos && arg(in, 2).kind != Operand::None)) return {};
    if (arg(in, 1).kind != Operand::Int) return {};
    Operand d = L({arg(in, 1).i});
    int32_t m = r.emit(Op::amax, {x, d, Bo(true)});
    int32_t s = r.emit(Op::sub, {x, V(m)});
    int32_t e = r.emit(Op::exp, {V(s)});
    int32_t z = r.emit(Op::sum, {V(e), d, Bo(true)});
    if (c.find("log_softmax") != std::string::npos) return {r.emit(Op::sub, {V(s), V(r.emit(Op::log, {V(z)}))})};
    // As ATen's kernel does: one reciprocal per row, then a multiply per element.
    return {r.emit(Op::mul, {V(e), V(r.emit(Op::reciprocal, {V(z)}))})};
  }
  if (c == "aten::native_layer_norm" || c == "aten::layer_norm") {
    const Operand &shape = arg(in, 1), &w = arg(in, 2), &b = arg(in, 3);
    // layer_norm's eps defaults to 1e-5 in its schema (the recorder leaves trailing defaults
    // out, as nn.TransformerEncoderLayer's fast path calls it); native_layer_norm has none.
    const Operand eps = in.args.size() <= 4 && c == "aten::layer_norm" ? Operand::real(1e-5) : arg(in, 4);
    bool eps_ok = eps.kind == Operand::Float || (eps.kind == Operand::Value && !out.types[eps.value].tensor);
    if (shape.kind != Operand::IntList || !eps_ok) return {};
    int64_t rank = out.types[x.value].rank();
    std::vector<int64_t> dims;
    for (int64_t k = rank - (int64_t)shape.list.size(); k < rank; ++k) dims.push_back(k);
    int32_t mu = r.emit(Op::mean, {x, L(dims), Bo(true)});
    int32_t var = r.emit(Op::var, {x, L(dims), I(0), Bo(true)});
    int32_t rs = r.emit(Op::rsqrt, {V(r.emit(Op::add, {V(var), eps}))});
    int32_t y = r.emit(Op::mul, {V(r.emit(Op::sub, {x, V(mu)})), V(rs)});
    if (is_tensor(out, w)) y = r.emit(Op::mul, {V(y), w});
    if (is_tensor(out, b)) y = r.emit(Op::add, {V(y), b});
    if (c == "aten::layer_norm") return {y};
    return {y, mu, rs};
  }
  if (c == "aten::convolution") {
    std::vector<int32_t> dw = depthwise_conv1d(r, in);
    if (!dw.empty()) return dw;
    // A 1x1 convolution of one image (stride 1, no padding, no groups) is a matrix product:
    // y[Cout, S] = w[Cout, Cin] * x[Cin, S] over the S spatial positions, plus the bias per row.
    // As a product step it runs on OpenBLAS spread over the trace's threads or the own GEMM,
    // whichever the step measures faster, and the bias fuses into what follows (batch norm,
    // activation). (mobilenet_v2 at 64x64: 2.02 -> 1.61 ms; resnet18/50 as before.)
    const Operand &w = arg(in, 1), &b = arg(in, 2);
    if (!is_tensor(out, w)) return {};
    const Type xt = out.types[x.value], wt = out.types[w.value];  // copies: emitting grows out.types
    if (xt.dtype != DType::F32 || wt.dtype != DType::F32) return {};
    int64_t rank = xt.rank();
    if (rank < 3 || rank > 5 || xt.sizes[0] != 1 || wt.rank() != rank) return {};
    if (rank == 4 && !conv_as_mm) return {};  // (layout.cpp makes it a channels-last convolution)
    auto all = [](const Operand &o, int64_t v, size_t n) {
      if (o.kind != Operand::IntList || o.list.size() != n) return false;
      for (int64_t e : o.list)
        if (e != v) return false;
      return true;
    };
    size_t sp = (size_t)rank - 2;
    const Operand &groups = arg(in, 8), &transposed = arg(in, 6);
    if (!all(arg(in, 3), 1, sp) || !all(arg(in, 4), 0, sp) || !all(arg(in, 5), 1, sp) ||
        transposed.kind != Operand::Bool || transposed.i || groups.kind != Operand::Int || groups.i != 1)
      return {};
    for (size_t d = 2; d < (size_t)rank; ++d)
      if (wt.sizes[d] != 1) return {};
    int64_t cout = wt.sizes[0], cin = wt.sizes[1], S = 1;
    for (size_t d = 2; d < (size_t)rank; ++d) S *= xt.sizes[d];
    if (xt.sizes[1] != cin || S == 0 || cin == 0 || cout == 0) return {};
    int32_t x2 = r.emit(Op::reshape, {x, L({cin, S})});
    int32_t w2 = r.emit(Op::reshape, {w, L({cout, cin})});
    Type yt;
    yt.dtype = DType::F32;
    yt.sizes = {cout, S};
    int32_t y = r.emit_extern("aten::mm", {V(w2), V(x2)}, yt);
    if (is_tensor(out, b)) y = r.emit(Op::add, {V(y), V(r.emit(Op::reshape, {b, L({cout, 1})}))});
    std::vector<int64_t> shape = xt.sizes;
    shape[1] = cout;
    return {r.emit(Op::reshape, {V(y), L(shape)})};
  }
  if (c == "aten::native_batch_norm" || c == "aten::batch_norm") {
    // Inference with running statistics (training=false), as ATen computes it: per channel
    // alpha = weight / sqrt(running_var + eps), beta = bias - running_mean * alpha; then
    // y = x * alpha + beta, broadcast over dim 1. Fuses with what follows (ReLU, the residual
    // add). native_batch_norm's saved mean/invstd are empty in eval; they must be unused.
    const Operand &w = arg(in, 1), &b = arg(in, 2), &rm = arg(in, 3), &rv = arg(in, 4);
    const Operand &training = arg(in, 5), &eps = arg(in, 7);
    int64_t rank = out.types[x.value].rank();
    if (training.kind != Operand::Bool || training.i || !is_tensor(out, rm) || !is_tensor(out, rv) || rank < 2)
      return {};
    if (eps.kind != Operand::Float && eps.kind != Operand::Int) return {};
    int64_t ch = out.types[x.value].sizes[1];
    std::vector<int64_t> bshape = {ch};
    for (int64_t k = 2; k < rank; ++k) bshape.push_back(1);
    int32_t alpha = r.emit(Op::rsqrt, {V(r.emit(Op::add, {rv, eps}))});
    if (is_tensor(out, w)) alpha = r.emit(Op::mul, {V(alpha), w});
    int32_t beta = r.emit(Op::mul, {rm, V(alpha)});
    beta = is_tensor(out, b) ? r.emit(Op::sub, {b, V(beta)}) : r.emit(Op::neg, {V(beta)});
    int32_t y = r.emit(Op::mul, {x, V(r.emit(Op::reshape, {V(alpha), L(bshape)}))});
    y = r.emit(Op::add, {V(y), V(r.emit(Op::reshape, {V(beta), L(bshape)}))});
    if (c == "aten::batch_norm") return {y};
    return {y, kUnused, kUnused};
  }
  if (c == "aten::native_group_norm" || c == "aten::group_norm") {
    // (x - mean) * rsqrt(var + eps) over each group's channels and positions, then the
    // per-channel affine: as ATen's kernel, with the group statistics as results.
    const Type xt = out.types[x.value];  // a copy: emit() grows out.types
    bool native = c == "aten::native_group_norm";
    const Operand &w = arg(in, native ? 1 : 2), &b = arg(in, native ? 2 : 3);
    const Operand &groups = arg(in, native ? 6 : 1), &eps = arg(in, native ? 7 : 4);
    int64_t rank = xt.rank();
    if (rank < 2 || groups.kind != Operand::Int || groups.i < 1 || xt.sizes[1] % groups.i) return {};
    if (eps.kind != Operand::Float && eps.kind != Operand::Int) return {};
    int64_t n = xt.sizes[0], ch = xt.sizes[1], g = groups.i;
    std::vector<int64_t> bshape = {ch};
    for (int64_t k = 2; k < rank; ++k) bshape.push_back(1);
    int64_t per_group = n * g != 0 ? xt.numel() / (n * g) : 0;
    int32_t xr = r.emit(Op::reshape, {x, L({n, g, per_group})});
    int32_t mu = r.emit(Op::mean, {V(xr), L({2}), Bo(true)});
    int32_t var = r.emit(Op::var, {V(xr), L({2}), I(0), Bo(true)});
    int32_t rs = r.emit(Op::rsqrt, {V(r.emit(Op::add, {V(var), eps}))});
    int32_t y = r.emit(Op::mul, {V(r.emit(Op::sub, {V(xr), V(mu)})), V(rs)});
    y = r.emit(Op::reshape, {V(y), L(xt.sizes)});
    if (is_tensor(out, w)) y = r.emit(Op::mul, {V(y), V(r.emit(Op::reshape, {w, L(bshape)}))});
    if (is_tensor(out, b)) y = r.emit(Op::add, {V(y), V(r.emit(Op::reshape, {b, L(bshape)}))});
    if (!native) return {y};
    return {y, r.emit(Op::reshape, {V(mu), L({n, g})}), r.emit(Op::reshape, {V(rs), L({n, g})})};
  }
  if (c == "aten::prelu" || c == "aten::_prelu_kernel") {  // x > 0 ? x : weight * x, weight per channel
    const Operand &w = arg(in, 1);
    const Type xt = out.types[x.value];  // a copy: emit() grows out.types
    if (!is_tensor(out, w)) return {};
    const Type wt = out.types[w.value];
    int32_t wb = w.value;
    if (wt.numel() != 1) {
      if (xt.rank() < 2 || wt.rank() != 1 || wt.sizes[0] != xt.sizes[1]) return {};
      std::vector<int64_t> bshape = {xt.sizes[1]};
      for (int64_t k = 2; k < xt.rank(); ++k) bshape.push_back(1);
      wb = r.emit(Op::reshape, {w, L(bshape)});
    } else if (wt.rank() != 0) {
      wb = r.emit(Op::reshape, {w, L({})});
    }
    int32_t pos = r.emit(Op::gt, {x, Operand::real(0.0)});
    return {r.emit(Op::where, {V(pos), x, V(r.emit(Op::mul, {V(wb), x}))})};
  }
  if (c == "aten::where.self" && in.args.size() == 3)  // (ReLU's backward, decomposed: where(x <= 0, 0, g))
    return {r.emit(Op::where, {x, arg(in, 1), arg(in, 2)})};
  if (c == "aten::hardtanh" || c == "aten::clamp" || c == "aten::relu6") {  // ReLU6 is hardtanh(0, 6)
    Operand lo = arg(in, 1), hi = arg(in, 2);
    if (c == "aten::relu6") lo = Operand::real(0.0), hi = Operand::real(6.0);
    if (c == "aten::hardtanh") {  // defaults -1, 1
      if (lo.kind == Operand::None) lo = Operand::real(-1.0);
      if (hi.kind == Operand::None) hi = Operand::real(1.0);
    }
    auto scalar = [](const Operand &o) { return o.is_scalar_literal() || o.kind == Operand::None; };
    if (!scalar(lo) || !scalar(hi) || lo.kind == Operand::Bool || hi.kind == Operand::Bool) return {};
    return {r.emit(Op::clamp, {x, lo, hi})};
  }
  if (c == "aten::hardsigmoid") {  // min(max(x + 3, 0), 6) / 6, as ATen
    int32_t t = r.emit(Op::clamp, {V(r.emit(Op::add, {x, Operand::real(3.0)})), Operand::real(0.0), Operand::real(6.0)});
    return {r.emit(Op::div, {V(t), Operand::real(6.0)})};
  }
  if (c == "aten::leaky_relu") {
    const Operand &slope = arg(in, 1);
    return {r.emit(Op::leaky_relu, {x, slope.kind == Operand::None ? Operand::real(0.01) : slope})};
  }
  if (c == "aten::gelu") {
    const Operand &a = arg(in, 1);
    if (a.kind == Operand::Str && a.s == "tanh") return {r.emit(Op::gelu_tanh, {x})};
    if (a.kind == Operand::None || (a.kind == Operand::Str && a.s == "none")) return {r.emit(Op::gelu, {x})};
    return {};
  }
  if (unary_table().count(c) && in.args.size() == 1) return {r.emit(unary_table().at(c), {x})};
  if (binary_table().count(c) && in.args.size() == 2) return {r.emit(binary_table().at(c), {x, arg(in, 1)})};
  if (c == "aten::add.Tensor" || c == "aten::sub.Tensor" || c == "aten::add.Scalar" || c == "aten::sub.Scalar") {
    const Operand &alpha = arg(in, 2);
    Operand y = arg(in, 1);
    bool unit = is_one(alpha);
    if (!unit) y = V(r.emit(Op::mul, {y, alpha}));
    return {r.emit(c[6] == 'a' ? Op::add : Op::sub, {x, y})};
  }
  if (c == "aten::_to_copy" && in.args.size() == 2 && arg(in, 1).kind == Operand::Ident) {
    DType d;  // a dtype conversion alone (no layout, device or memory format given)
    if (!dtype_from_name(arg(in, 1).s, &d)) return {};
    return {r.emit(Op::to, {x, arg(in, 1)})};
  }
  if (c == "aten::rsub.Scalar" && in.args.size() <= 3) {  // other - alpha * self
    const Operand &other = arg(in, 1), &alpha = arg(in, 2);
    if (!other.is_scalar_literal() || other.kind == Operand::Bool) return {};
    bool unit = is_one(alpha);
    if (!unit && !alpha.is_scalar_literal()) return {};
    Operand y = unit ? x : V(r.emit(Op::mul, {x, alpha}));
    return {r.emit(Op::sub, {other, y})};
  }
  if (c == "aten::masked_fill.Scalar" && in.args.size() == 3 && arg(in, 2).is_scalar_literal()) {
    // where(mask, value, self): self's dtype kept (a value of another kind makes where promote,
    // which the result-type check below refuses: the extern stays)
    return {r.emit(Op::where, {arg(in, 1), arg(in, 2), x})};
  }
  if ((c == "aten::addcmul" || c == "aten::addcdiv") && in.args.size() <= 4) {
    // self + value * t1 * t2 (or / t2), in ATen's kernel's order: (value * t1) op t2, then + self
    // (timm's Affine layers, optimizers' moment updates)
    const Operand &value = arg(in, 3);
    if (value.kind != Operand::None && !value.is_scalar_literal()) return {};
    if (value.kind == Operand::Bool) return {};
    bool unit = is_one(value, true);
    Operand t1 = arg(in, 1);
    if (!unit) t1 = V(r.emit(Op::mul, {t1, value}));
    int32_t m = r.emit(c == "aten::addcmul" ? Op::mul : Op::div, {t1, arg(in, 2)});
    return {r.emit(Op::add, {x, V(m)})};
  }
  if (c == "aten::mean.dim" || c == "aten::sum.dim_IntList") {
    if (arg(in, 3).kind != Operand::None) return {};  // an explicit dtype
    const Op op = c == "aten::mean.dim" ? Op::mean : Op::sum;
    std::vector<Operand> args{x, L(dims_of(arg(in, 1))), Bo(keep(2, false))};
    Inst small;
    small.op = op;
    small.args = args;
    std::vector<int32_t> u = unroll_small_reduction(r.out, small);
    if (!u.empty()) return u;
    if (column_reduction(out, x, args[1].list)) return {};
    return {r.emit(op, std::move(args))};
  }
  if (c == "aten::sum" || c == "aten::mean") {
    if (arg(in, 1).kind != Operand::None) return {};
    return {reduction(r, c == "aten::sum" ? Op::sum : Op::mean, {x, L({}), Bo(false)})};
  }
  if (c == "aten::amax" || c == "aten::amin")
    return {reduction(r, c == "aten::amax" ? Op::amax : Op::amin, {x, L(dims_of(arg(in, 1))), Bo(keep(2, false))})};
  if (c == "aten::argmax" || c == "aten::argmin") {
    const Operand &d = arg(in, 1);
    if (d.kind != Operand::Int && d.kind != Operand::None) return {};
    return {r.emit(c == "aten::argmax" ? Op::argmax : Op::argmin, {x, d, Bo(keep(2, false))})};
  }
  if (c == "aten::var.correction" || c == "aten::std.correction" || c == "aten::var_mean.correction") {
    const Operand &corr = arg(in, 2);
    int64_t cc = corr.kind == Operand::Int ? corr.i : corr.kind == Operand::None ? 1 : -1;
    if (cc < 0) return {};
    Operand d = L(dims_of(arg(in, 1)));
    bool k = keep(3, false);
    if (c == "aten::var_mean.correction")
      return {r.emit(Op::var, {x, d, I(cc), Bo(k)}), r.emit(Op::mean, {x, d, Bo(k)})};
    return {r.emit(c[6] == 'v' ? Op::var : Op::std, {x, d, I(cc), Bo(k)})};
  }
  if (c == "aten::var_mean.dim" || c == "aten::var.dim" || c == "aten::std.dim") {
    bool unbiased = arg(in, 2).kind == Operand::Bool ? arg(in, 2).i != 0 : true;
    Operand d = L(dims_of(arg(in, 1)));
    bool k = keep(3, false);
    int64_t cc = unbiased ? 1 : 0;
    if (c == "aten::var_mean.dim") return {r.emit(Op::var, {x, d, I(cc), Bo(k)}), r.emit(Op::mean, {x, d, Bo(k)})};
    return {r.emit(c[6] == 'v' ? Op::var : Op::std, {x, d, I(cc), Bo(k)})};
  }
  return {};
}

// A reduction with at most kUnrolledReduction elements per output and no kept dims (stft's |z|
// sums float pairs): the combination of that many selects, a pointwise expression the planner fuses with what
// produces and consumes it, where a row kernel would loop over rows of two. Floating dtypes
// only (an integer sum widens to int64); one element is a copy (a reduction never aliases).
constexpr int64_t kUnrolledReduction = 4;
constexpr int kPickDepth = 8;  // pointwise ops and gathers a pick goes up through

// Index i of dim d of v: a select -- or, where v is computed by a pointwise op, that op over
// its operands' picks (an operand broadcast along d: its size-1 dim picked at 0; one that lacks
// d: as it is), and where v is a gather (index), the gather over its source's or its index
// tensors' picks, whichever holds dim d. The unrolled reduction then reads its producers'
// operands and fuses with them (a view of a computed value would be stored first: roi_align's
// [K, C, 7, 7, 2, 2] bilinear samples, summed over the last two dims). depth bounds how far up
// it goes; memo gives each (value, dim, index) one pick.
using PickMemo = std::map<std::tuple<int32_t, int64_t, int64_t>, int32_t>;
int32_t pick(Rewriter &r, int32_t v, int64_t d, int64_t i, int depth, PickMemo &memo) {
  Trace &t = r.out;
  auto key = std::make_tuple(v, d, i);
  if (auto hit = memo.find(key); hit != memo.end()) return hit->second;
  int32_t at = t.def[(size_t)v], got = -1;
  const Inst src = at >= 0 ? t.insts[(size_t)at] : Inst{};  // a copy: emit() grows t.insts
  const int64_t rank = t.types[(size_t)v].rank();
  auto shift = [&](const Operand &o, int64_t od, int d2) {  // o picked along its dim od (< 0: none)
    if (od < 0) return o;
    const Type &ot = t.types[(size_t)o.value];
    return V(pick(r, o.value, od, ot.sizes[(size_t)od] == 1 ? 0 : i, d2, memo));
  };
  if (depth > 0 && at >= 0 && src.results.size() == 1 && src.op != Op::copy_ &&
      op_info(src.op).kind == OpKind::POINTWISE) {
    std::vector<Operand> args = src.args;
    for (Operand &o : args)
      if (o.kind == Operand::Value && t.types[(size_t)o.value].tensor)
        o = shift(o, d - (rank - t.types[(size_t)o.value].rank()), depth - 1);
    got = r.emit(src.op, std::move(args));
  } else if (depth > 0 && at >= 0 && src.op == Op::index) {
    std::vector<Operand> args = src.args;
    const int64_t first = args[1].i, k = (int64_t)args.size() - 2;
    const int64_t block = rank - (t.types[(size_t)args[0].value].rank() - k);
    if (d < first || d >= first + block) {  // a dim of the source: a view of it (the source is memory)
      int64_t xd = d < first ? d : d - block + k;
      args[0] = V(r.emit(Op::select, {args[0], I(xd), I(i)}));
      if (d < first) args[1] = I(first - 1);
    } else {
      for (size_t a = 2; a < args.size(); ++a)
        args[a] = shift(args[a], (d - first) - (block - t.types[(size_t)args[a].value].rank()), depth - 1);
    }
    got = r.emit(Op::index, std::move(args));
  } else {
    got = r.emit(Op::select, {V(v), I(d), I(i)});
  }
  memo[key] = got;
  return got;
}

std::vector<int32_t> unroll_small_reduction(Trace &out, const Inst &in) {
  if (in.args.size() != 3 || in.args[0].kind != Operand::Value || in.args[1].kind != Operand::IntList ||
      in.args[2].kind != Operand::Bool)
    return {};
  const Type xt = out.types[in.args[0].value];
  if (!xt.tensor || (xt.dtype != DType::F32 && xt.dtype != DType::F64)) return {};
  int64_t rank = xt.rank();
  std::vector<int64_t> dims = in.args[1].list;
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  if (!normalize_dims(dims, rank)) return {};
  int64_t count = 1;
  for (int64_t d : dims) count *= xt.sizes[(size_t)d];
  if (count < 1 || count > kUnrolledReduction) return {};
  // keepdim: the result is broadcast back against its input (softmax, layer norm), which the
  // planner fuses best as one pass per row: left a reduction.
  if (in.args[2].i) return {};
  Rewriter r(out);
  int32_t x = in.args[0].value, acc = -1;
  Op combine = in.op == Op::prod ? Op::mul : in.op == Op::amax ? Op::maximum : in.op == Op::amin ? Op::minimum : Op::add;
  PickMemo memo;
  for (int64_t flat = 0; flat < count; ++flat) {
    // The element's index along each reduced dim (row-major over them); selected from the last
    // dim first, so the earlier dims keep their numbers.
    std::vector<int64_t> index(dims.size());
    for (int64_t k = (int64_t)dims.size() - 1, rest = flat; k >= 0; --k) {
      int64_t n = xt.sizes[(size_t)dims[(size_t)k]];
      index[(size_t)k] = rest % n;
      rest /= n;
    }
    int32_t term = x;
    for (int64_t k = (int64_t)dims.size() - 1; k >= 0; --k)
      term = pick(r, term, dims[(size_t)k], index[(size_t)k], kPickDepth, memo);
    acc = acc < 0 ? term : r.emit(combine, {V(acc), V(term)});
  }
  if (count == 1) acc = r.emit(Op::copy, {V(acc)});
  if (in.op == Op::mean && count > 1) acc = r.emit(Op::div, {V(acc), Operand::real((double)count)});
  return {acc};
}

// ATen computes a float16/bfloat16 op in float32 and rounds its result once (softmax, layer
// norm, batch norm, add with alpha ...), while the kernels round every trace op's half result
// (jit/kernel.cpp). So a decomposition reads its half tensor operands as float32 (a `to` each,
// fused into the loop) and narrow_results rounds what it returns to the declared type at its end.
Inst widened(Trace &out, const Inst &in) {
  Inst w = in;
  Rewriter r(out);
  for (Operand &o : w.args)
    if (o.kind == Operand::Value && out.types[o.value].tensor && is_half(out.types[o.value].dtype)) {
      Operand f32;
      f32.kind = Operand::Ident;  // (a dtype operand, as the text form `to(%0, f32)` has it)
      f32.s = "f32";
      o = V(r.emit(Op::to, {o, f32}));
    }
  return w;
}

void narrow_results(Trace &out, std::vector<int32_t> &repl, const Trace &t, const Inst &orig) {
  if (repl.size() != orig.results.size()) return;
  Rewriter r(out);
  for (size_t k = 0; k < repl.size(); ++k) {
    if (repl[k] == kUnused) continue;
    DType want = t.types[orig.results[k]].dtype;
    if (!is_half(want) || out.types[repl[k]].dtype != DType::F32) continue;
    Operand name;
    name.kind = Operand::Ident;
    name.s = dtype_name(want);
    repl[k] = r.emit(Op::to, {V(repl[k]), name});
  }
}

}  // namespace

int decompose_externs(Trace &t, bool conv_as_mm) {
  Trace out;
  out.name = t.name;
  std::vector<int32_t> remap(t.types.size(), -1);
  std::vector<char> used(t.types.size(), 0);
  for (const Inst &in : t.insts)
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value) used[o.value] = 1;  // tensor lists' elements are Value operands too
  for (int32_t o : t.outputs) used[o] = 1;
  int rewritten = 0;
  for (const Inst &orig : t.insts) {
    Inst in = orig;
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = remap[o.value];
    bool small_reduction = in.op == Op::sum || in.op == Op::mean || in.op == Op::prod || in.op == Op::amax ||
                           in.op == Op::amin;
    if (in.op == Op::extern_ || small_reduction) {
      size_t mark_insts = out.insts.size(), mark_vals = out.types.size();
      std::vector<int32_t> repl;
      try {
        repl = small_reduction                ? unroll_small_reduction(out, in)
               : is_gather_callee(in.callee) ? rewrite_gather(out, in)
               : in.callee == "aten::stack"  ? rewrite_stack(out, in)
               : in.callee == "aten::cat"    ? rewrite_cat(out, in)
                                              : rewrite(out, widened(out, in), conv_as_mm);
        if (!small_reduction) narrow_results(out, repl, t, orig);
      } catch (const Error &) {
        repl.clear();  // not expressible with our ops (dtype, shape): keep the extern
      }
      bool ok = repl.size() == in.results.size();
      for (size_t k = 0; ok && k < repl.size(); ++k) {
        if (repl[k] == kUnused) {
          ok = !used[orig.results[k]];
          continue;
        }
        const Type &want = t.types[orig.results[k]], &got = out.types[repl[k]];
        ok = want.dtype == got.dtype && want.sizes == got.sizes && got.tensor;
      }
      if (ok) {
        for (size_t k = 0; k < repl.size(); ++k) remap[orig.results[k]] = repl[k];
        rewritten += !small_reduction;
        continue;
      }
      out.insts.resize(mark_insts);
      out.types.resize(mark_vals);
      out.def.resize(mark_vals);
    }
    int32_t idx = (int32_t)out.insts.size();
    for (int32_t &r : in.results) {
      int32_t nv = out.new_value(t.types[r], idx);
      remap[r] = nv;
      r = nv;
    }
    if (in.op == Op::input) out.inputs.push_back(in.results[0]);
    out.insts.push_back(std::move(in));
  }
  for (int32_t o : t.outputs) out.outputs.push_back(remap[o]);
  t = std::move(out);
  return rewritten;
}

}  // namespace dynamo::jit
