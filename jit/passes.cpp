// passes.cpp -- trace simplification: common subexpression elimination, slices of
// slice_scatter chains folded, and dead code elimination, rebuilding value numbers densely.
// Inputs are never removed (they are slots). Also: softmaxes read only by matrix products
// flush their subnormal probabilities (flush_softmax_subnormals).
#include <algorithm>
#include <map>
#include <tuple>

#include "ir.h"

namespace dynamo::jit {

namespace {

// A key that identifies an instruction's computation (op + operands) for CSE.
std::string cse_key(const Inst &in) {
  std::string k = std::to_string((int)in.op) + "|";
  for (const Operand &o : in.args) k += print_operand(o) + ",";
  return k;
}

// Externs without effects, which DCE may drop when nothing reads them.
bool pure_extern(const Inst &in) {
  if (in.op != Op::extern_) return false;
  // ...and allocations nothing reads (nn.TransformerEncoderLayer's fast path makes an empty
  // tensor it never uses), and products: attention written out leaves its q @ k^T unread once
  // the recorder put dynamo::attention in place of the product with the values.
  static const char *const pure[] = {"aten::slice_scatter", "aten::select_scatter", "aten::empty.memory_format",
                                     "aten::zeros", "aten::ones", "aten::empty_like", "aten::zeros_like",
                                     "aten::bmm", "aten::mm"};
  for (const char *p : pure)
    if (in.callee == p) return true;
  return false;
}

// A step-1 range [start, end) along dim of a tensor of size n there, normalized as ATen does
// (negative from the end, clamped); false when the operands are not plain integers or none.
bool unit_range(const Operand &dim, const Operand &start, const Operand &end, const Operand &step, int64_t rank,
                const std::vector<int64_t> &sizes, int64_t *d, int64_t *a, int64_t *b) {
  auto is_int = [](const Operand &o) { return o.kind == Operand::Int; };
  if (!is_int(dim) || (!is_int(step) && step.kind != Operand::None) || (is_int(step) && step.i != 1)) return false;
  if ((!is_int(start) && start.kind != Operand::None) || (!is_int(end) && end.kind != Operand::None)) return false;
  *d = dim.i < 0 ? dim.i + rank : dim.i;
  if (*d < 0 || *d >= rank) return false;
  const int64_t n = sizes[(size_t)*d];
  int64_t s = is_int(start) ? start.i : 0, e = is_int(end) ? end.i : n;
  if (s < 0) s += n;
  if (e < 0) e += n;
  *a = std::clamp<int64_t>(s, 0, n);
  *b = std::clamp<int64_t>(e, *a, n);
  return true;
}

// A step-1 slice of the result of a chain of aten::slice_scatter(base, src, dim, start, end, 1)
// along its own dim: the scattered src when the ranges are equal, else (disjoint ranges) the
// same slice of base, and so on down the chain. An LSTM cell's in-place activations of its
// gate chunks are recorded as such chains (one scatter per chunk, then the chunks read back):
// folded, the scatters are dead. Returns the value the slice equals (-1: none), or rewrites
// the slice's operand to the deepest base it can read instead.
int32_t fold_slice_of_scatter(const Trace &t, Inst &in, const std::vector<int32_t> &rep) {
  if (in.op != Op::slice || in.args.size() != 5 || in.args[0].kind != Operand::Value) return -1;
  for (int guard = 0; guard < 1 << 16; ++guard) {
    int32_t x = in.args[0].value, di = t.def[x];
    if (di < 0) return -1;
    const Inst &sc = t.insts[(size_t)di];
    if (sc.op != Op::extern_ || sc.callee != "aten::slice_scatter" || sc.args.size() != 6 ||
        sc.args[0].kind != Operand::Value || sc.args[1].kind != Operand::Value)
      return -1;
    const Type &xt = t.types[x];
    int64_t d1, a1, b1, d2, a2, b2;
    if (!unit_range(in.args[1], in.args[2], in.args[3], in.args[4], xt.rank(), xt.sizes, &d1, &a1, &b1) ||
        !unit_range(sc.args[2], sc.args[3], sc.args[4], sc.args[5], xt.rank(), xt.sizes, &d2, &a2, &b2) || d1 != d2)
      return -1;
    int32_t base = rep[sc.args[0].value], src = rep[sc.args[1].value];
    if (a1 == a2 && b1 == b2) {
      const Type &st = t.types[src], &rt = t.types[in.results[0]];
      return st.tensor && st.dtype == rt.dtype && st.sizes == rt.sizes ? src : -1;
    }
    if (b1 <= a2 || b2 <= a1 || a1 == b1) {  // disjoint (or empty): the base's elements
      const Type &bt = t.types[base];
      if (!bt.tensor || bt.dtype != xt.dtype || bt.sizes != xt.sizes) return -1;
      in.args[0].value = base;
      continue;
    }
    return -1;  // overlapping ranges: kept
  }
  return -1;
}

}  // namespace

void simplify_trace(Trace &t) {
  // CSE: map each value to a representative; externs and inputs are never merged.
  std::vector<int32_t> rep(t.types.size());
  for (size_t v = 0; v < rep.size(); ++v) rep[v] = (int32_t)v;
  std::map<std::string, int32_t> seen;
  for (Inst &in : t.insts) {
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = rep[o.value];
    if (int32_t same = fold_slice_of_scatter(t, in, rep); same >= 0) {
      rep[in.results[0]] = same;
      continue;
    }
    if (in.op == Op::input || in.op == Op::extern_ || in.op == Op::guard || in.op == Op::copy_) continue;  // effects stay
    auto [it, fresh] = seen.emplace(cse_key(in), in.results[0]);
    if (!fresh) rep[in.results[0]] = it->second;
  }
  for (int32_t &o : t.outputs) o = rep[o];

  // DCE: mark live from outputs backwards; inputs and externs with effects stay.
  std::vector<char> live(t.types.size(), 0);
  for (int32_t o : t.outputs) live[o] = 1;
  std::vector<char> keep(t.insts.size(), 0);
  for (int i = (int)t.insts.size() - 1; i >= 0; --i) {
    const Inst &in = t.insts[i];
    bool k = in.op == Op::input || (in.op == Op::extern_ && !pure_extern(in)) || in.op == Op::guard || in.op == Op::copy_;
    for (int32_t r : in.results) k = k || (live[r] && rep[r] == r);
    if (!k) continue;
    keep[i] = 1;
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value) live[o.value] = 1;
  }

  // Rebuild with dense numbering.
  Trace out;
  out.name = t.name;
  std::vector<int32_t> renum(t.types.size(), -1);
  for (size_t i = 0; i < t.insts.size(); ++i) {
    if (!keep[i]) continue;
    Inst in = t.insts[i];
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = renum[o.value];
    int32_t idx = (int32_t)out.insts.size();
    for (int32_t &r : in.results) {
      int32_t nv = out.new_value(t.types[r], idx);
      renum[r] = nv;
      r = nv;
    }
    if (in.op == Op::input) out.inputs.push_back(in.results[0]);
    out.insts.push_back(std::move(in));
  }
  for (int32_t o : t.outputs) out.outputs.push_back(renum[o]);
  t = std::move(out);
}

namespace {

// Where value p may go for its subnormals not to matter: into a matrix product as one of the two
// matrices (not addmm's or linear's bias), through views and copies; not into an output, a
// guard (the interpreter would see it at a side exit), an in-place write or any other op.
bool read_only_by_products(const Trace &t, int32_t p, const ValueUsers &uses, const std::vector<char> &is_output) {
  std::vector<int32_t> work = {p};
  while (!work.empty()) {
    int32_t v = work.back();
    work.pop_back();
    if (is_output[(size_t)v]) return false;
    for (auto [i, k] : uses[(size_t)v]) {
      const Inst &u = t.insts[(size_t)i];
      OpKind kind = op_info(u.op).kind;
      if ((kind == OpKind::VIEW || u.op == Op::copy) && k == 0 && u.results.size() == 1) {
        work.push_back(u.results[0]);
        continue;
      }
      if (u.op != Op::extern_) return false;
      const std::string &c = u.callee;
      bool both = c == "aten::bmm" || c == "aten::mm" || c == "aten::matmul";
      bool after_bias = c == "aten::addmm" || c == "aten::baddbmm";
      bool ok = (both && (k == 0 || k == 1)) || (after_bias && (k == 1 || k == 2)) ||
                (c == "aten::linear" && (k == 0 || k == 1));
      if (!ok) return false;
    }
  }
  return true;
}

}  // namespace

// A softmax as decompose.cpp writes it -- e = exp(x - amax(x, d)), p = e * reciprocal(sum(e, d))
// (or e / sum(e, d)) -- whose p reaches only matrix products: its exp becomes exp_flush, so
// probabilities below float32's normal range (x more than 87.3 under the row's max) are 0.
// Eager keeps them as subnormals, and every product that reads them (and what reads the
// product's subnormal results, such as the rows of a shifted-window attention that see only
// masked keys) runs at the x86 subnormal penalty: 10-50x per element. The products' results
// differ by less than (row length) x 2^-126 x max|other operand|, below any float tolerance,
// and the row sums not at all (the row's max gives e = 1, so the sum is >= 1). Not where the
// probabilities themselves can be seen: an output, a side exit's live values, a log of them.
int flush_softmax_subnormals(Trace &t) {
  const size_t nv = t.types.size();
  const ValueUsers uses = value_users(t);
  std::vector<char> is_output(nv, 0);
  for (int32_t o : t.outputs) is_output[(size_t)o] = 1;
  auto def = [&](const Operand &o) -> const Inst * {
    return o.kind == Operand::Value && t.def[(size_t)o.value] >= 0 ? &t.insts[(size_t)t.def[(size_t)o.value]] : nullptr;
  };
  int changed = 0;
  for (Inst &ex : t.insts) {
    if (ex.op != Op::exp || ex.results.size() != 1) continue;
    int32_t e = ex.results[0];
    DType dt = t.types[(size_t)e].dtype;
    if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16) continue;
    // x - amax(x, d, keepdim)
    const Inst *sub = def(ex.args[0]);
    if (!sub || sub->op != Op::sub || sub->args.size() != 2 || sub->args[0].kind != Operand::Value) continue;
    const Inst *mx = def(sub->args[1]);
    if (!mx || mx->op != Op::amax || mx->args.empty() || mx->args[0].kind != Operand::Value ||
        mx->args[0].value != sub->args[0].value)
      continue;
    ReduceInfo dm = reduce_info(t, *mx);
    if (!dm.keepdim || is_output[(size_t)e] || uses[(size_t)e].size() != 2) continue;
    // e's two readers: sum(e, d, keepdim) and e * reciprocal(that sum) / e / that sum.
    int32_t s = -1, p = -1;
    const Inst *other = nullptr;
    for (auto [i, k] : uses[(size_t)e]) {
      const Inst &u = t.insts[(size_t)i];
      if (u.op == Op::sum && k == 0) {
        ReduceInfo ds = reduce_info(t, u);
        if (ds.keepdim && ds.dims == dm.dims) s = u.results[0];
      } else {
        other = &u;
      }
    }
    if (s < 0 || !other || other->args.size() != 2 || other->args[0].kind != Operand::Value || other->args[0].value != e)
      continue;
    if (other->op == Op::div && other->args[1].kind == Operand::Value && other->args[1].value == s) {
      p = other->results[0];
    } else if (other->op == Op::mul) {
      const Inst *rc = def(other->args[1]);
      if (rc && rc->op == Op::reciprocal && rc->args[0].kind == Operand::Value && rc->args[0].value == s) p = other->results[0];
    }
    if (p < 0 || t.types[(size_t)p].sizes != t.types[(size_t)e].sizes || !read_only_by_products(t, p, uses, is_output))
      continue;
    ex.op = Op::exp_flush;
    ++changed;
  }
  return changed;
}

}  // namespace dynamo::jit
