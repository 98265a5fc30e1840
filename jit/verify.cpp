// verify.cpp -- type and shape inference for every op (ATen broadcasting and type promotion),
// and the trace verifier. Every error names the instruction it is about.
#include <algorithm>

#include "ir.h"

namespace dynamo::jit {

namespace {

int category(DType t) { return t == DType::Bool ? 0 : is_int(t) ? 1 : 2; }

[[noreturn]] void vfail(const std::string &where, const std::string &msg) {
  fail(ErrorCode::Verify, where + ": " + msg);
}

// Whether expanding sizes `from` to `to` makes several elements of one (a broadcast dim).
bool repeats_elements(const std::vector<int64_t> &from, const std::vector<int64_t> &to) {
  size_t off = to.size() - from.size();
  for (size_t k = 0; k < to.size(); ++k) {
    int64_t f = k < off ? 1 : from[k - off];
    if (f == 1 && to[k] > 1) return true;
  }
  return false;
}

int64_t wrap_dim(int64_t d, int64_t rank, const std::string &where) {
  int64_t r = rank == 0 ? 1 : rank;
  if (d < -r || d >= r)
    vfail(where, "dimension " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
  return d < 0 ? d + r : d;
}

}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (is_half(a) && is_half(b)) return DType::F32;  // half + bfloat16 -> float32, as ATen
  return dtype_bytes(a) >= dtype_bytes(b) ? a : b;  // same category: the wider one
}

bool broadcast_shapes(const std::vector<int64_t> &a, const std::vector<int64_t> &b,
                      std::vector<int64_t> *out) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> r(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return false;
    r[i] = x == 1 ? y : x;
  }
  *out = r;
  return true;
}

// ATen's result_type: tensors with dimensions outrank zero-dim tensors, which outrank Python
// scalars, except that a higher category (bool < integer < float) from a lower tier wins and
// then takes that tier's dtype (Python floats and ints take float32 / int64).
DType result_type(const Trace &t, const std::vector<const Operand *> &ops) {
  int have[3] = {0, 0, 0};
  DType tier[3] = {DType::Bool, DType::Bool, DType::Bool};
  auto add = [&](int k, DType d) {
    tier[k] = have[k] ? promote_types(tier[k], d) : d;
    have[k] = 1;
  };
  for (const Operand *o : ops) {
    if (o->kind == Operand::Value) {
      const Type &ty = t.types[o->value];
      if (ty.tensor) add(ty.rank() > 0 ? 0 : 1, ty.dtype);
      else add(2, ty.dtype == DType::F64 ? DType::F32 : ty.dtype);  // Python float -> default dtype
    } else if (o->kind == Operand::Float) add(2, DType::F32);
    else if (o->kind == Operand::Int) add(2, DType::I64);
    else if (o->kind == Operand::Bool) add(2, DType::Bool);
  }
  auto combine = [](int hh, DType higher, int hl, DType lower) -> std::pair<int, DType> {
    if (!hh) return {hl, lower};
    if (!hl) return {hh, higher};
    if (is_float(higher)) return {1, higher};
    if (higher == DType::Bool || is_float(lower)) return {1, promote_types(higher, lower)};
    return {1, higher};
  };
  auto low = combine(have[1], tier[1], have[2], tier[2]);
  auto all = combine(have[0], tier[0], low.first, low.second);
  return all.second;
}

ReduceInfo reduce_info(const Trace &t, const Inst &in) {
  ReduceInfo ri;
  const Type &x = t.types[in.args[0].value];
  int64_t rank = x.rank();
  bool index = op_info(in.op).rule == DRule::RINDEX;
  bool vars = in.op == Op::var || in.op == Op::std;
  std::vector<int64_t> dims;
  if (index) {
    if (in.args[1].kind == Operand::Int) dims.push_back(in.args[1].i);
  } else {
    dims = in.args[1].list;
  }
  const Operand &kd = in.args[vars ? 3 : 2];
  ri.keepdim = kd.i != 0;
  if (vars) ri.correction = in.args[2].i;
  if (dims.empty() || rank == 0) {
    for (int64_t d = 0; d < rank; ++d) ri.dims.push_back(d);
    return ri;
  }
  for (int64_t d : dims) ri.dims.push_back(d < 0 ? d + rank : d);
  std::sort(ri.dims.begin(), ri.dims.end());
  return ri;
}

std::vector<Type> infer_types(const Trace &t, const Inst &in, const std::string &where) {
  const OpInfo &info = op_info(in.op);
  if (info.arity >= 0 && (int)in.args.size() != info.arity)
    vfail(where, std::string(info.name) + " takes " + std::to_string(info.arity) + " operand(s), got " +
                     std::to_string(in.args.size()));
  for (const Operand &o : in.args)
    if (o.kind == Operand::Value && (o.value < 0 || o.value >= (int32_t)t.types.size()))
      vfail(where, "operand %" + std::to_string(o.value) + " is not defined");
  auto tensor_arg = [&](size_t k) -> const Type & {
    if (k >= in.args.size() || in.args[k].kind != Operand::Value || !t.types[in.args[k].value].tensor)
      vfail(where, "operand " + std::to_string(k) + " must be a tensor value");
    return t.types[in.args[k].value];
  };
  auto int_arg = [&](size_t k) -> int64_t {
    if (k >= in.args.size() || in.args[k].kind != Operand::Int)
      vfail(where, "operand " + std::to_string(k) + " must be an integer literal");
    return in.args[k].i;
  };
  auto list_arg = [&](size_t k) -> const std::vector<int64_t> & {
    if (k >= in.args.size() || in.args[k].kind != Operand::IntList)
      vfail(where, "operand " + std::to_string(k) + " must be an integer list like [4,8]");
    return in.args[k].list;
  };

  if (info.kind == OpKind::EXTERN) return {};  // result types come from the annotation
  if (info.kind == OpKind::INPUT) vfail(where, "input is written as '%N = input TYPE'");

  if (info.kind == OpKind::REDUCTION) {
    const Type &x = tensor_arg(0);
    bool index = info.rule == DRule::RINDEX;
    bool vars = in.op == Op::var || in.op == Op::std;
    if (index) {
      if (in.args[1].kind != Operand::Int && in.args[1].kind != Operand::None)
        vfail(where, "operand 1 must be a dimension or none");
    } else {
      list_arg(1);
    }
    if (vars) int_arg(2);
    const Operand &kd = in.args[vars ? 3 : 2];
    if (kd.kind != Operand::Bool) vfail(where, "keepdim must be true or false");
    std::vector<int64_t> raw = index ? (in.args[1].kind == Operand::Int ? std::vector<int64_t>{in.args[1].i}
                                                                         : std::vector<int64_t>{})
                                     : in.args[1].list;
    for (int64_t d : raw) wrap_dim(d, x.rank(), where);
    ReduceInfo ri = reduce_info(t, in);
    for (size_t k = 1; k < ri.dims.size(); ++k)
      if (ri.dims[k] == ri.dims[k - 1]) vfail(where, "dim " + std::to_string(ri.dims[k]) + " appears multiple times");
    if (vars && ri.correction < 0) vfail(where, "correction must be non-negative");
    Type r;
    r.device = x.device;
    int64_t extent = 1;
    for (int64_t d = 0; d < x.rank(); ++d) {
      bool red = std::binary_search(ri.dims.begin(), ri.dims.end(), d);
      if (red) extent *= x.sizes[d];
      if (!red) r.sizes.push_back(x.sizes[d]);
      else if (ri.keepdim) r.sizes.push_back(1);
    }
    const char *nm = info.name;
    if ((in.op == Op::amax || in.op == Op::amin || index) && extent == 0)
      vfail(where, std::string(nm) + " of an empty extent has no identity (ATen raises too)");
    if (index && x.dtype == DType::Bool)
      vfail(where, std::string(nm) + " is not implemented for bool tensors (ATen raises too)");
    switch (info.rule) {
      case DRule::RSUM: r.dtype = is_float(x.dtype) ? x.dtype : DType::I64; break;
      case DRule::RSAME: r.dtype = x.dtype; break;
      case DRule::RINDEX: r.dtype = DType::I64; break;
      default:
        if (!is_float(x.dtype))
          vfail(where, std::string(nm) + " is defined for floating tensors only, got " + dtype_name(x.dtype) +
                           " (ATen raises too)");
        r.dtype = x.dtype;
    }
    return {r};
  }

  if (info.kind == OpKind::VIEW) {
    const Type &x = tensor_arg(0);
    Type r;
    r.dtype = x.dtype;
    r.device = x.device;
    std::vector<int64_t> s = x.sizes;
    int64_t rank = x.rank();
    switch (in.op) {
      case Op::reshape:
      case Op::view: {
        const auto &want = list_arg(1);
        int64_t known = 1, infer = -1;
        for (size_t i = 0; i < want.size(); ++i) {
          if (want[i] == -1) {
            if (infer >= 0) vfail(where, "only one size may be -1");
            infer = (int64_t)i;
          } else if (want[i] < 0) vfail(where, "negative size " + std::to_string(want[i]));
          else known *= want[i];
        }
        s = want;
        if (infer >= 0) {
          if (known == 0 || x.numel() % known) vfail(where, "cannot infer the -1 size");
          s[infer] = x.numel() / known;
        } else if (known != x.numel())
          vfail(where, "shape of " + std::to_string(known) + " elements cannot hold " +
                           std::to_string(x.numel()));
        break;
      }
      case Op::permute: {
        const auto &p = list_arg(1);
        if ((int64_t)p.size() != rank) vfail(where, "permute needs one index per dimension");
        std::vector<bool> seen(rank, false);
        for (size_t i = 0; i < p.size(); ++i) {
          int64_t d = wrap_dim(p[i], rank, where);
          if (seen[d]) vfail(where, "permute repeats dimension " + std::to_string(d));
          seen[d] = true;
          s[i] = x.sizes[d];
        }
        break;
      }
      case Op::transpose: {
        if (rank == 0) break;
        int64_t a = wrap_dim(int_arg(1), rank, where), b = wrap_dim(int_arg(2), rank, where);
        std::swap(s[a], s[b]);
        break;
      }
      case Op::expand: {
        const auto &e = list_arg(1);
        if ((int64_t)e.size() < rank) vfail(where, "expand cannot reduce the rank");
        s.assign(e.size(), 0);
        size_t lead = e.size() - rank;
        for (size_t i = 0; i < e.size(); ++i) {
          if (i < lead) {
            if (e[i] < 0) vfail(where, "a new leading dimension cannot be -1");
            s[i] = e[i];
          } else {
            int64_t have = x.sizes[i - lead];
            if (e[i] == -1 || e[i] == have) s[i] = have;
            else if (have == 1 && e[i] >= 0) s[i] = e[i];
            else vfail(where, "cannot expand size " + std::to_string(have) + " to " + std::to_string(e[i]));
          }
        }
        break;
      }
      case Op::squeeze: {
        if (in.args.size() == 1) {
          s.clear();
          for (int64_t v : x.sizes) if (v != 1) s.push_back(v);
        } else if (in.args.size() == 2) {
          if (rank > 0) {
            int64_t d = wrap_dim(int_arg(1), rank, where);
            if (s[d] == 1) s.erase(s.begin() + d);
          }
        } else vfail(where, "squeeze takes (x) or (x, dim)");
        break;
      }
      case Op::unsqueeze: {
        int64_t d = int_arg(1);
        if (d < -(rank + 1) || d > rank) vfail(where, "unsqueeze dimension out of range");
        if (d < 0) d += rank + 1;
        s.insert(s.begin() + d, 1);
        break;
      }
      case Op::slice: {
        if (rank == 0) vfail(where, "slice of a zero-dim tensor");
        int64_t d = wrap_dim(int_arg(1), rank, where);
        int64_t start = int_arg(2), end = int_arg(3), step = int_arg(4);
        if (step <= 0) vfail(where, "slice step must be positive");
        int64_t n = x.sizes[d];
        if (start < 0) start += n;
        if (end < 0) end += n;
        start = std::clamp<int64_t>(start, 0, n);
        end = std::clamp<int64_t>(end, start, n);
        s[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for any step
        break;
      }
      case Op::select: {
        if (rank == 0) vfail(where, "select of a zero-dim tensor");
        int64_t d = wrap_dim(int_arg(1), rank, where);
        int64_t i = int_arg(2), n = x.sizes[d];
        if (i < -n || i >= n) vfail(where, "index " + std::to_string(i) + " out of range for size " + std::to_string(n));
        s.erase(s.begin() + d);
        break;
      }
      case Op::as_strided: {
        const auto &sz = list_arg(1), &st = list_arg(2);
        int64_t off = int_arg(3);
        if (sz.size() != st.size()) vfail(where, "as_strided needs one stride per size");
        if (off < 0) vfail(where, "as_strided offset must be >= 0, got " + std::to_string(off));
        int64_t last = off, n = 1;  // the furthest element read (when none is empty)
        for (size_t i = 0; i < sz.size(); ++i) {
          if (sz[i] < 0) vfail(where, "negative size " + std::to_string(sz[i]));
          if (st[i] < 0) vfail(where, "as_strided stride must be >= 0, got " + std::to_string(st[i]));
          int64_t step;
          if (__builtin_mul_overflow(sz[i] > 0 ? sz[i] - 1 : 0, st[i], &step) || __builtin_add_overflow(last, step, &last) ||
              __builtin_mul_overflow(n, sz[i], &n))
            vfail(where, "as_strided extent overflows int64");
        }
        if (n > 0 && last >= x.numel())
          vfail(where, "as_strided reads element " + std::to_string(last) + " of a tensor of " +
                           std::to_string(x.numel()));
        s = sz;
        break;
      }
      default: vfail(where, "unknown view");
    }
    r.sizes = s;
    return {r};
  }

  if (in.op == Op::copy_) {
    const Type &dst = tensor_arg(0);
    const Operand &src = in.args[1];
    if (src.kind == Operand::Value && t.types[src.value].tensor) {
      std::vector<int64_t> b;
      if (!broadcast_shapes(dst.sizes, t.types[src.value].sizes, &b) || b != dst.sizes)
        vfail(where, "copy_ source does not broadcast to the destination's shape");
    } else if (!(src.kind == Operand::Value || src.is_scalar_literal())) {
      vfail(where, "copy_ source must be a value or a number");
    }
    // The destination must be memory the caller owns: an input, a view of one, or a copy_ result.
    int32_t d = in.args[0].value;
    for (;;) {
      const Inst &def = t.insts[t.def[d]];
      OpKind k = op_info(def.op).kind;
      if (def.op == Op::input) {
        // as ATen: no write into memory where several elements are one (an expanded tensor)
        const Type &it = t.types[d];
        for (size_t k2 = 0; k2 < it.strides.size() && k2 < it.sizes.size(); ++k2)
          if (it.strides[k2] == 0 && it.sizes[k2] > 1)
            vfail(where, "copy_ into input %" + std::to_string(d) + ", whose dim " + std::to_string(k2) +
                             " has stride 0: more than one element of the written-to tensor refers to a single "
                             "memory location");
        break;
      }
      if (def.op == Op::expand && repeats_elements(t.types[def.args[0].value].sizes, t.types[d].sizes))
        vfail(where, "copy_ destination may not be an expand view: more than one element of the written-to tensor "
                     "refers to a single memory location");
      if (def.op == Op::as_strided) vfail(where, "copy_ destination may not be an as_strided view (its elements may repeat)");
      if (k == OpKind::VIEW || def.op == Op::copy_) { d = def.args[0].value; continue; }
      vfail(where, "copy_ destination must be an input tensor or a view of one");
    }
    Type r = dst;
    r.strides.clear();
    r.requires_grad = false;
    r.weight = false;
    return {r};
  }

  if (info.kind == OpKind::GATHER) {  // index(x, first, %i0, ..., %ik-1)
    const Type &x = tensor_arg(0);
    int64_t first = int_arg(1), k = (int64_t)in.args.size() - 2;
    if (k < 1) vfail(where, "index needs at least one index tensor");
    if (first < 0 || first + k > x.rank())
      vfail(where, "index: " + std::to_string(k) + " index tensor(s) from dim " + std::to_string(first) +
                       " do not fit a tensor of rank " + std::to_string(x.rank()));
    std::vector<int64_t> b;
    for (size_t a = 2; a < in.args.size(); ++a) {
      const Type &it = tensor_arg(a);
      if (!is_int(it.dtype))
        vfail(where, "index tensors must be int32 or int64, operand " + std::to_string(a) + " is " + dtype_name(it.dtype));
      if (!(it.device == x.device)) vfail(where, "operands are on different devices");
      if (!broadcast_shapes(b, it.sizes, &b)) vfail(where, "index tensors' shapes do not broadcast");
    }
    Type r;
    r.dtype = x.dtype;
    r.device = x.device;
    r.sizes.assign(x.sizes.begin(), x.sizes.begin() + first);
    r.sizes.insert(r.sizes.end(), b.begin(), b.end());
    r.sizes.insert(r.sizes.end(), x.sizes.begin() + first + k, x.sizes.end());
    return {r};
  }

  // -- pointwise --
  std::vector<const Operand *> promo;   // operands that take part in type promotion
  std::vector<int64_t> shape;
  bool any_tensor = false;
  Device dev;
  for (size_t k = 0; k < in.args.size(); ++k) {
    const Operand &o = in.args[k];
    bool scalar_only = (in.op == Op::leaky_relu && k == 1) || (in.op == Op::softplus && k >= 1);
    if (in.op == Op::to && k == 1) {
      DType d;
      if (o.kind != Operand::Ident || !dtype_from_name(o.s, &d)) vfail(where, "operand 1 must be a dtype");
      continue;
    }
    if (o.kind == Operand::None) {
      if (in.op == Op::clamp && k >= 1) continue;
      vfail(where, "operand " + std::to_string(k) + " may not be none");
    }
    if (o.kind == Operand::Value) {
      const Type &ty = t.types[o.value];
      if (ty.tensor) {
        if (scalar_only) vfail(where, "operand " + std::to_string(k) + " must be a scalar");
        if (any_tensor && !(ty.device == dev)) vfail(where, "operands are on different devices");
        dev = ty.device;
        any_tensor = true;
        if (!broadcast_shapes(shape, ty.sizes, &shape)) {
          std::string a, b;
          for (int64_t v : shape) a += (a.empty() ? "" : ",") + std::to_string(v);
          for (int64_t v : ty.sizes) b += (b.empty() ? "" : ",") + std::to_string(v);
          vfail(where, "shapes [" + a + "] and [" + b + "] do not broadcast");
        }
      }
    } else if (!o.is_scalar_literal()) {
      vfail(where, "operand " + std::to_string(k) + " must be a value or a number");
    }
    bool promotes = !(in.op == Op::where && k == 0) && !scalar_only;
    if (promotes) promo.push_back(&o);
  }
  if (!any_tensor) vfail(where, "a pointwise op needs at least one tensor operand");
  if (in.op == Op::where) {
    const Operand &c = in.args[0];
    if (c.kind != Operand::Value || !t.types[c.value].tensor || t.types[c.value].dtype != DType::Bool)
      vfail(where, "where's condition must be a bool tensor");
  }
  DType p = result_type(t, promo);
  DType r = p;
  const char *nm = info.name;
  switch (info.rule) {
    case DRule::FLOAT: if (!is_float(p)) r = DType::F32; break;
    case DRule::FLOATONLY:
      if (!is_float(p)) vfail(where, std::string(nm) + " is not defined for " + dtype_name(p) + " tensors (ATen raises too)");
      break;
    case DRule::COMPARE: case DRule::LOGICAL: r = DType::Bool; break;
    case DRule::CAST: dtype_from_name(in.args[1].s, &r); break;
    default: break;
  }
  if (in.op == Op::sub) {  // ATen rejects a bool operand of any kind, even when it promotes
    for (const Operand *o : promo)
      if (o->kind == Operand::Bool || (o->kind == Operand::Value && t.types[o->value].dtype == DType::Bool))
        vfail(where, "sub with a bool operand is not supported (ATen raises too); use logical_xor");
  }
  if (p == DType::Bool && in.op == Op::clamp)
    for (size_t k = 1; k < in.args.size(); ++k)
      if (in.args[k].kind == Operand::Value && t.types[in.args[k].value].tensor)
        vfail(where, "clamp of bool tensors by tensor bounds is not defined (ATen raises too)");
  if (p == DType::Bool) {
    if (in.op == Op::sub || in.op == Op::neg)
      vfail(where, std::string(nm) + " on bool tensors is not supported (ATen raises too); use logical_not/logical_xor");
    if (in.op == Op::abs || in.op == Op::relu || in.op == Op::floordiv || in.op == Op::pow ||
        in.op == Op::floor || in.op == Op::ceil || in.op == Op::round || in.op == Op::trunc)
      vfail(where, std::string(nm) + " is not defined for bool tensors (ATen raises too)");
  }
  if (in.op == Op::pow && is_int(r)) {
    const Operand &e = in.args[1];
    if (e.kind != Operand::Int || e.i < 0)
      vfail(where, "integer pow needs a non-negative integer literal exponent");
  }
  Type out;
  out.dtype = r;
  out.sizes = shape;
  out.device = dev;
  return {out};
}

namespace {
// Externs whose stride/offset arguments address a tensor operand's memory directly. Only a
// trace input has a layout fixed by the trace (declared and guarded); every other value's
// layout is the plan's choice (a fused kernel's dense output, a view folded into strides), so
// strides recorded from eager's layout of an intermediate would read the wrong elements.
bool layout_dependent(const std::string &callee) {
  static const char *const names[] = {"aten::as_strided", "aten::as_strided_", "aten::as_strided_scatter",
                                      "aten::as_strided_copy", "aten::_reshape_alias",
                                      "aten::_reshape_alias_copy"};
  std::string base = callee.substr(0, callee.find('.'));
  for (const char *n : names)
    if (base == n) return true;
  return false;
}

void check_layout_args(const Trace &t, const Inst &in, const std::string &where) {
  if (!layout_dependent(in.callee)) return;
  for (const Operand &o : in.args) {
    if (o.kind != Operand::Value || !t.types[o.value].tensor) continue;
    if (t.insts[t.def[o.value]].op != Op::input)
      vfail(where, in.callee + " applies stride arguments to %" + std::to_string(o.value) +
                       ", a value whose memory layout the compiler chooses (only trace inputs have a fixed "
                       "layout); record a reshape by sizes instead");
  }
}
}  // namespace

// The mid-trace guards, guard(%cond, expected, exit_id, %live...): a one-element
// bool condition, a true/false literal, exit ids 0 .. guards - 1 each used once, tensor live
// values, and one result like the condition. Checked when a trace is parsed or built, not only
// when it is compiled.
static void verify_side_exits(const Trace &t) {
  std::vector<size_t> guards;
  for (size_t i = 0; i < t.insts.size(); ++i)
    if (t.insts[i].op == Op::guard) guards.push_back(i);
  std::vector<char> seen(guards.size(), 0);
  for (size_t i : guards) {
    const Inst &in = t.insts[i];
    auto bad = [&](const std::string &why) {
      fail(ErrorCode::Verify, "guard (instruction " + std::to_string(i) + "): " + why);
    };
    auto one_bool = [&](int32_t v) { return t.types[v].tensor && t.types[v].dtype == DType::Bool && t.types[v].numel() == 1; };
    if (in.args.size() < 3) bad("expects (%cond, expected, exit_id, %live...)");
    if (in.args[0].kind != Operand::Value || !one_bool(in.args[0].value))
      bad("the condition must be a one-element bool tensor");
    if (in.args[1].kind != Operand::Bool) bad("the expected value must be true or false");
    const Operand &id = in.args[2];
    if (id.kind != Operand::Int || id.i < 0 || id.i >= (int64_t)guards.size())
      bad("the exit id must be an integer in [0, number of guards = " + std::to_string(guards.size()) + ")");
    if (seen[(size_t)id.i]++) bad("exit id " + std::to_string(id.i) + " is used twice");
    for (size_t k = 3; k < in.args.size(); ++k)
      if (in.args[k].kind != Operand::Value || !t.types[in.args[k].value].tensor)
        bad("live values (operands after the exit id) must be tensors");
    if (in.results.size() != 1 || !one_bool(in.results[0])) bad("returns one one-element bool value (the condition)");
  }
}

void verify_trace(const Trace &t) {
  if (t.def.size() != t.types.size()) fail(ErrorCode::Internal, "trace value table is inconsistent");
  int32_t defined = 0;
  for (size_t i = 0; i < t.insts.size(); ++i) {
    const Inst &in = t.insts[i];
    std::string where = "instruction " + std::to_string(i) + " ('" + op_info(in.op).name + "')";
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value && (o.value < 0 || o.value >= defined))
        vfail(where, "uses %" + std::to_string(o.value) + " before it is defined");
    for (int32_t r : in.results) {
      if (r < 0 || r >= (int32_t)t.types.size()) continue;  // numbering is checked below
      std::string why = type_size_problem(t.types[r]);
      if (!why.empty()) vfail(where, "%" + std::to_string(r) + ": " + why);
    }
    if (in.op != Op::input && op_info(in.op).kind != OpKind::EXTERN) {
      std::vector<Type> ty = infer_types(t, in, where);
      if (ty.size() != in.results.size() || ty[0].sizes != t.types[in.results[0]].sizes ||
          ty[0].dtype != t.types[in.results[0]].dtype)
        vfail(where, "result type does not match its operands");
    }
    if (in.op == Op::extern_ && in.results.empty()) vfail(where, "an extern needs at least one result");
    if (in.op == Op::extern_) check_layout_args(t, in, where);
    for (size_t a = 0; a < in.args.size(); ++a) {
      if (in.args[a].kind != Operand::TensorList) continue;
      if (in.op != Op::extern_) vfail(where, "only externs take tensor lists");
      int64_t n = in.args[a].i;
      if (n < 0 || a + (size_t)n >= in.args.size())
        vfail(where, "tensor list of " + std::to_string(n) + " elements runs past the operands");
      for (int64_t e = 1; e <= n; ++e) {
        const Operand &o = in.args[a + (size_t)e];
        if (!(o.kind == Operand::None || (o.kind == Operand::Value && t.types[o.value].tensor)))
          vfail(where, "tensor list elements must be tensor values or none");
      }
      a += (size_t)n;
    }
    for (int32_t r : in.results) {
      if (r != defined) vfail(where, "results must be numbered in order of definition");
      ++defined;
    }
    if (in.op == Op::input && in.has_guard_value && t.types[in.results[0]].tensor)
      vfail(where, "only scalar inputs can carry a '== value' guard");
    if (in.op == Op::input && in.has_guard_value && !t.types[in.results[0]].tensor) {
      // The literal must be a value of the input's type: i64 an integer, bool true/false (or
      // 0/1), f64 any number. (An i64 guarded "== 1.5" would compare against 0.)
      const Operand &g = in.guard_value;
      DType d = t.types[in.results[0]].dtype;
      bool ok = d == DType::F64 ? g.kind == Operand::Int || g.kind == Operand::Float
                : d == DType::Bool ? g.kind == Operand::Bool || (g.kind == Operand::Int && (g.i == 0 || g.i == 1))
                                   : g.kind == Operand::Int;
      if (!ok)
        vfail(where, "the guard value " + print_operand(g) + " is not a value of the input's type " +
                         print_type(t.types[in.results[0]], true));
    }
  }
  verify_side_exits(t);
  if (t.outputs.empty()) fail(ErrorCode::Verify, "trace @" + t.name + ": returns nothing");
  for (size_t k = 0; k < t.outputs.size(); ++k) {
    int32_t v = t.outputs[k];
    if (v < 0 || v >= defined) fail(ErrorCode::Verify, "return: output " + std::to_string(k) + " is not defined");
    if (!t.types[v].tensor)
      fail(ErrorCode::Verify, "return: output " + std::to_string(k) + " (%" + std::to_string(v) +
                                  ") is a scalar; traces return tensors");
  }
}

}  // namespace dynamo::jit
