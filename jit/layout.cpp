// layout.cpp -- activations of convolution chains kept channels-last (NHWC) through a trace
// (CPU). A graph compiler picks one layout per tensor for the whole graph; an extern per op would
// pick it per call. Every aten::convolution of a 4-D or 5-D float32 image (1x1 ones included)
// becomes dynamo::conv_nhwc, which reads and writes [N, H, W, C] ([N, D, H, W, C]) tensors, so
// the convolution kernels (runtime/onednn_conv.cpp: LibTorch's oneDNN with the weight packed
// once, the system oneDNN's channels-last kernel or LibTorch's call, as the step measures) need
// no reorder on either side.
// The pointwise work between convolutions (batch norm folded into a scale and shift,
// activations, residual adds) runs on the same [N, H, W, C] values, and so do reductions over
// them (global pooling), 2-D max and average pooling and concatenations. Only where something
// else reads a value (a view, an extern, an output, a side exit's live values) is it read as the
// original [N, C, H, W] value: a permute view of the channels-last one, which the fused loops and
// LibTorch read with strides.
//
// (A 1x1 convolution of one image as a matrix product -- jit/decompose.cpp does that where this
// pass is off -- made resnext50_32x4d at 64x64 20.7 ms against 12.9 ms as convolutions here.)
//
// Every rewrite states the same value in another memory order, so the trace computes what it
// computed before; a rewrite whose inferred type is not exactly the permuted original is a bug
// caught here, and the trace is then left as it was.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ir.h"

namespace dynamo::jit {

namespace {

// Images are 4-D ([N, C, H, W]) or 5-D ([N, C, D, H, W]); their channels-last forms put C last.
bool image_rank(int r) { return r == 4 || r == 5; }
// The permutation from a rank-r value to its channels-last form ([0, 2, 3, 1] for 4-D).
std::vector<int64_t> to_cl(int r) {
  std::vector<int64_t> p = {0};
  for (int64_t d = 2; d < r; ++d) p.push_back(d);
  p.push_back(1);
  return p;
}
// ...and back ([0, 3, 1, 2]).
std::vector<int64_t> to_orig(int r) {
  std::vector<int64_t> p = {0, r - 1};
  for (int64_t d = 1; d < r - 1; ++d) p.push_back(d);
  return p;
}
// Where dimension d of a rank-r value sits in its channels-last form.
int64_t pos(int r, int64_t d) { return d == 0 ? 0 : d == 1 ? r - 1 : d - 1; }

Operand V(int32_t v) { return Operand::val(v); }
Operand L(std::vector<int64_t> v) {
  Operand o;
  o.kind = Operand::IntList;
  o.list = std::move(v);
  return o;
}

std::vector<int64_t> permuted(const std::vector<int64_t> &s, const std::vector<int64_t> &p) {
  std::vector<int64_t> r;
  for (int64_t d : p) r.push_back(s[(size_t)d]);
  return r;
}

// Is `in` a convolution dynamo::conv_nhwc runs: 2-D or 3-D, float32, not transposed, its stride,
// padding, dilation and groups literals?
bool nhwc_conv(const Trace &t, const Inst &in) {
  if (in.op != Op::extern_ || in.callee != "aten::convolution" || in.args.size() != 9 || in.results.size() != 1)
    return false;
  const Operand &x = in.args[0], &w = in.args[1], &b = in.args[2];
  auto tensor = [&](const Operand &o, int rank) {
    return o.kind == Operand::Value && t.types[o.value].tensor && t.types[o.value].dtype == DType::F32 &&
           t.types[o.value].rank() == rank;
  };
  if (x.kind != Operand::Value || !image_rank(t.types[x.value].rank())) return false;
  const int rank = t.types[x.value].rank();
  if (!tensor(x, rank) || !tensor(w, rank) || !(b.kind == Operand::None || tensor(b, 1))) return false;
  for (int k = 3; k <= 5; ++k)
    if (in.args[k].kind != Operand::IntList) return false;
  if (in.args[6].kind != Operand::Bool || in.args[6].i || in.args[8].kind != Operand::Int) return false;
  const Type &r = t.types[in.results[0]];
  return r.tensor && r.dtype == DType::F32 && r.rank() == t.types[x.value].rank() && r.numel() > 0 &&
         t.types[x.value].numel() > 0;
}

bool reduction_with_dims(Op op) {
  return op == Op::sum || op == Op::prod || op == Op::mean || op == Op::amax || op == Op::amin || op == Op::var ||
         op == Op::std;
}

struct Layouts {
  const Trace &t;
  Trace out;
  std::vector<int32_t> nchw;  // value of t -> the value of out that is it, or -1 (only its NHWC form exists)
  std::vector<int32_t> nhwc;  // value of t -> the value of out that is it permuted to [N, H, W, C], or -1

  std::vector<char> used;     // value of t -> read by an instruction or an output

  explicit Layouts(const Trace &src)
      : t(src), nchw(src.types.size(), -1), nhwc(src.types.size(), -1), used(src.types.size(), 0) {
    out.name = t.name;
    for (const Inst &in : t.insts)
      for (const Operand &o : in.args)
        if (o.kind == Operand::Value) used[(size_t)o.value] = 1;
    for (int32_t o : t.outputs) used[(size_t)o] = 1;
  }

  int32_t emit(Op op, std::vector<Operand> args) {
    Inst in;
    in.op = op;
    in.args = std::move(args);
    std::vector<Type> ty = infer_types(out, in, std::string("channels-last form of ") + op_info(op).name);
    int32_t v = out.new_value(ty[0], (int32_t)out.insts.size());
    in.results.push_back(v);
    out.insts.push_back(std::move(in));
    return v;
  }

  // v (a value of t) in its original layout: the permute view of its NHWC form when only that exists.
  int32_t original(int32_t v) {
    if (nchw[(size_t)v] < 0) nchw[(size_t)v] = emit(Op::permute, {V(nhwc[(size_t)v]), L(to_orig(t.types[(size_t)v].rank()))});
    return nchw[(size_t)v];
  }

  // Operand o of an op whose result has rank r (an image rank), for the op's channels-last
  // form: broadcast right-aligned to r dims, then permuted. Rank-0 tensors and scalars stay as
  // they are.
  Operand for_nhwc(const Operand &o, int r) {
    if (o.kind != Operand::Value) return o;
    int32_t v = o.value;
    const Type &ty = t.types[(size_t)v];
    if (!ty.tensor || ty.rank() == 0) return V(original(v));
    if (ty.rank() == r && nhwc[(size_t)v] >= 0) return V(nhwc[(size_t)v]);
    int32_t x = original(v);
    if (ty.rank() < r) {
      std::vector<int64_t> s((size_t)(r - ty.rank()), 1);
      s.insert(s.end(), ty.sizes.begin(), ty.sizes.end());
      x = emit(Op::reshape, {V(x), L(s)});
    }
    return V(emit(Op::permute, {V(x), L(to_cl(r))}));
  }

  void expect(int32_t got, int32_t orig, const std::vector<int64_t> &sizes) {
    const Type &g = out.types[(size_t)got], &w = t.types[(size_t)orig];
    if (g.dtype != w.dtype || g.sizes != sizes || g.tensor != w.tensor)
      fail(ErrorCode::Internal, "channels-last form of %" + std::to_string(orig) + " is " + print_type(g, false) +
                                    ", expected " + print_type(w, false) + " permuted");
  }

  // Appends extern `e` (its operands already in `out`) as the one instruction computing the
  // channels-last form of t's result `orig`: its result type is orig's, permuted.
  void emit_channels_last(Inst e, int32_t orig) {
    const Type &r = t.types[(size_t)orig];
    Type ty = r;
    ty.sizes = permuted(r.sizes, to_cl(r.rank()));
    int32_t y = out.new_value(ty, (int32_t)out.insts.size());
    e.results = {y};
    out.insts.push_back(std::move(e));
    nhwc[(size_t)orig] = y;
  }

  // A pointwise op with a 4-D result reading at least one value that has an NHWC form.
  bool pointwise(const Inst &in) {
    if (op_info(in.op).kind != OpKind::POINTWISE || in.op == Op::copy_ || in.results.size() != 1) return false;
    const Type &r = t.types[(size_t)in.results[0]];
    if (!r.tensor || !image_rank(r.rank())) return false;
    bool any = false;
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value && t.types[(size_t)o.value].rank() == r.rank() && nhwc[(size_t)o.value] >= 0)
        any = true;
    if (!any) return false;
    std::vector<Operand> args;
    for (const Operand &o : in.args) args.push_back(for_nhwc(o, r.rank()));
    int32_t y = emit(in.op, std::move(args));
    expect(y, in.results[0], permuted(r.sizes, to_cl(r.rank())));
    nhwc[(size_t)in.results[0]] = y;
    return true;
  }

  // A reduction over literal dims of a 4-D value that has an NHWC form: the same dims of that
  // form. Kept dims stay NHWC; dropped ones give the original result when the dims left are in
  // the same order in both forms ([N, C] after pooling over H and W).
  bool reduction(const Inst &in) {
    if (!reduction_with_dims(in.op) || in.results.size() != 1 || in.args.empty()) return false;
    const Operand &x = in.args[0];
    if (x.kind != Operand::Value || !image_rank(t.types[(size_t)x.value].rank()) || nhwc[(size_t)x.value] < 0)
      return false;
    const int rank = t.types[(size_t)x.value].rank();
    const Operand &dims = in.args[1], &keep = in.args.back();
    if (dims.kind != Operand::IntList || dims.list.empty() || keep.kind != Operand::Bool) return false;
    std::vector<char> reduced((size_t)rank, 0);
    std::vector<int64_t> mapped;
    for (int64_t d : dims.list) {
      if (d < -rank || d >= rank) return false;
      int64_t n = d < 0 ? d + rank : d;
      reduced[(size_t)n] = 1;
      mapped.push_back(pos(rank, n));
    }
    std::sort(mapped.begin(), mapped.end());
    if (std::adjacent_find(mapped.begin(), mapped.end()) != mapped.end()) return false;
    const Type &r = t.types[(size_t)in.results[0]];
    if (!keep.i) {
      int64_t last = -1;
      for (int64_t d = 0; d < rank; ++d) {
        if (reduced[(size_t)d]) continue;
        if (pos(rank, d) < last) return false;  // the dims left would come out in another order
        last = pos(rank, d);
      }
    }
    std::vector<Operand> args = in.args;
    args[0] = V(nhwc[(size_t)x.value]);
    args[1] = L(mapped);
    int32_t y = emit(in.op, std::move(args));
    if (keep.i) {
      expect(y, in.results[0], permuted(r.sizes, to_cl(rank)));
      nhwc[(size_t)in.results[0]] = y;
    } else {
      expect(y, in.results[0], r.sizes);
      nchw[(size_t)in.results[0]] = y;
    }
    return true;
  }

  void convolution(const Inst &in) {
    Inst c;
    c.op = Op::extern_;
    c.callee = "dynamo::conv_nhwc";
    const Operand &b = in.args[2];
    c.args = {for_nhwc(in.args[0], t.types[(size_t)in.results[0]].rank()), V(original(in.args[1].value)),
              b.kind == Operand::Value ? V(original(b.value)) : b, in.args[3], in.args[4], in.args[5], in.args[8]};
    emit_channels_last(std::move(c), in.results[0]);
  }

  // Max pooling (its indices unused) and average pooling of a value that has an NHWC form, by
  // their channels-last namesakes (runtime/channels_last_ops.cpp): the stem's max pool, a
  // PoolFormer block's token mixer, a DenseNet transition stay in the layout.
  bool pooling(const Inst &in) {
    const bool max = in.callee == "aten::max_pool2d_with_indices";
    if (in.op != Op::extern_ || (!max && in.callee != "aten::avg_pool2d") || in.args.empty()) return false;
    if (in.results.size() != (max ? 2u : 1u) || (max && used[(size_t)in.results[1]])) return false;
    const Operand &x = in.args[0];
    if (x.kind != Operand::Value || t.types[(size_t)x.value].rank() != 4 || nhwc[(size_t)x.value] < 0) return false;
    for (size_t k = 1; k < in.args.size(); ++k)
      if (in.args[k].kind == Operand::Value || in.args[k].kind == Operand::TensorList) return false;
    const Type &r = t.types[(size_t)in.results[0]];
    if (!r.tensor || r.rank() != 4) return false;
    Inst p = in;
    p.callee = max ? "dynamo::max_pool2d_nhwc" : "dynamo::avg_pool2d_nhwc";
    p.args[0] = V(nhwc[(size_t)x.value]);
    emit_channels_last(std::move(p), in.results[0]);
    return true;
  }

  // aten::cat of 4-D values, one at least with an NHWC form: the same concatenation of the NHWC
  // forms along the dim's place there (DenseNet's and Inception's channel concatenations).
  bool concat(const Inst &in) {
    if (in.op != Op::extern_ || in.callee != "aten::cat" || in.results.size() != 1 || in.args.empty() ||
        in.args[0].kind != Operand::TensorList)
      return false;
    const size_t n = (size_t)in.args[0].i;
    if (n == 0 || in.args.size() < 1 + n || in.args.size() > 2 + n) return false;
    const Type &r = t.types[(size_t)in.results[0]];
    if (!r.tensor || !image_rank(r.rank())) return false;
    const int rank = r.rank();
    bool any = false;
    for (size_t k = 1; k <= n; ++k) {
      const Operand &o = in.args[k];
      if (o.kind != Operand::Value || t.types[(size_t)o.value].rank() != rank) return false;
      any |= nhwc[(size_t)o.value] >= 0;
    }
    int64_t d = 0;
    if (in.args.size() == 2 + n) {
      if (in.args[1 + n].kind != Operand::Int) return false;
      d = in.args[1 + n].i < 0 ? in.args[1 + n].i + rank : in.args[1 + n].i;
    }
    if (!any || d < 0 || d >= rank) return false;
    Inst c = in;
    for (size_t k = 1; k <= n; ++k) c.args[k] = for_nhwc(in.args[k], rank);
    if (in.args.size() == 2 + n)
      c.args[1 + n] = Operand::integer(pos(rank, d));
    else
      c.args.push_back(Operand::integer(pos(rank, d)));
    emit_channels_last(std::move(c), in.results[0]);
    return true;
  }

  // Any other instruction, on original values.
  void copy(const Inst &orig) {
    Inst in = orig;
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = original(o.value);
    int32_t idx = (int32_t)out.insts.size();
    for (int32_t &r : in.results) {
      int32_t nv = out.new_value(t.types[(size_t)r], idx);
      nchw[(size_t)r] = nv;
      r = nv;
    }
    if (in.op == Op::input) out.inputs.push_back(in.results[0]);
    out.insts.push_back(std::move(in));
  }
};

}  // namespace

bool nhwc_layouts_enabled() {
  const char *env = getenv("DYNAMO_LAYOUT");
  return !(env && !strcmp(env, "nchw"));
}

int nhwc_layouts(Trace &t) {
  int convs = 0;
  for (const Inst &in : t.insts) convs += nhwc_conv(t, in);
  if (!convs) return 0;
  try {
    Layouts l(t);
    for (const Inst &in : t.insts) {
      if (nhwc_conv(t, in)) {
        l.convolution(in);
        continue;
      }
      if (l.pointwise(in) || l.reduction(in) || l.pooling(in) || l.concat(in)) continue;
      l.copy(in);
    }
    for (int32_t o : t.outputs) l.out.outputs.push_back(l.original(o));
    verify_trace(l.out);
    t = std::move(l.out);
    return convs;
  } catch (const Error &) {
    return 0;  // (a bug here: the trace runs as it was recorded, in its recorded layouts)
  }
}

}  // namespace dynamo::jit
