// lower_reduce.cpp -- row groups to LLVM IR: for each kept index (a "row"), one pass over the
// reduced dims per reduction (vector accumulators + scalar tail, merged as a tree), results kept
// in registers for later stages, then one pass storing the row's full-shape consumers.
// Key idea: softmax / layer norm / x - mean(x) read the row once from memory and again from
// cache, never materializing the row statistics or the intermediate pointwise values.
#include <cmath>
#include <set>

#include "kernel.h"

namespace dynamo::jit::detail {

Value *KernelEmitter::alloca_at_entry(llvm::Type *ty) {
  IRBuilder<> eb(&F->getEntryBlock(), F->getEntryBlock().begin());
  return eb.CreateAlloca(ty);
}

namespace {

bool is_math(Op op) {
  switch (op) {
    case Op::exp: case Op::exp_flush: case Op::expm1: case Op::log: case Op::log1p: case Op::log2: case Op::sin: case Op::cos:
    case Op::tan: case Op::tanh: case Op::erf: case Op::pow: case Op::sigmoid: case Op::silu: case Op::gelu:
    case Op::gelu_tanh: case Op::softplus:
      return true;
    default:
      return false;
  }
}

}  // namespace

int KernelEmitter::math_ops() const {
  std::set<int32_t> seen;
  int n = 0;
  std::vector<int32_t> stack;
  auto push_args = [&](int32_t v) {
    for (const Operand &o : t.insts[t.def[v]].args)
      if (o.kind == Operand::Value && t.types[o.value].tensor) stack.push_back(o.value);
  };
  for (const Root &r : g.roots) stack.push_back(r.value);
  for (const Root &r : g.row_roots) stack.push_back(r.value);
  for (int32_t r : g.reductions) push_args(r);
  while (!stack.empty()) {
    int32_t v = stack.back();
    stack.pop_back();
    if (!inline_value(v) || !seen.insert(v).second) continue;
    n += is_math(t.insts[t.def[v]].op);
    push_args(v);
  }
  return n;
}

void KernelEmitter::plan_row_cache() {
  if (!has_row_scratch()) return;  // the later stages compute the values again
  int64_t extent = 1;
  for (int64_t d : g.rdims) extent *= g.domain[d];
  const int64_t kMaxBytes = 1 << 20;  // keep the per-row buffers cache-resident
  Map id = identity();
  auto full_inline = [&](int32_t v) {
    return inline_value(v) && t.types[v].sizes == g.domain;
  };
  std::function<bool(int32_t)> expensive = [&](int32_t v) {
    const Inst &in = t.insts[t.def[v]];
    if (is_math(in.op)) return true;
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value && t.types[o.value].tensor && inline_value(o.value) && expensive(o.value)) return true;
    return false;
  };
  // The stages in order: each reduction's input, then the full-shape roots.
  std::vector<std::vector<int32_t>> tops;
  for (int32_t r : g.reductions) tops.push_back({t.insts[t.def[r]].args[0].value});
  std::vector<int32_t> last;
  for (const Root &r : g.roots) last.push_back(r.value);
  tops.push_back(last);
  // Values each stage evaluates at the identity map (inline, full shape).
  std::vector<std::set<int32_t>> uses(tops.size());
  std::function<void(int32_t, size_t)> walk = [&](int32_t v, size_t s) {
    if (!full_inline(v) || !uses[s].insert(v).second) return;
    for (const Operand &o : t.insts[t.def[v]].args)
      if (o.kind == Operand::Value && t.types[o.value].tensor && t.types[o.value].sizes == g.domain) walk(o.value, s);
  };
  for (size_t s = 0; s < tops.size(); ++s)
    for (int32_t v : tops[s]) {
      if (inline_value(v)) walk(v, s);
      else if (t.types[v].sizes == g.domain) {  // a root: walk its operands
        for (const Operand &o : t.insts[t.def[v]].args)
          if (o.kind == Operand::Value && t.types[o.value].tensor) walk(o.value, s);
      }
    }
  // Cache the top-most shared expensive values of each stage.
  std::function<void(int32_t, size_t)> pick = [&](int32_t v, size_t s) {
    if (!full_inline(v)) return;
    int n = 0;
    for (const auto &u : uses) n += (int)u.count(v);
    if (n >= 2 && expensive(v) && extent * reg_bytes(t.types[v].dtype) <= kMaxBytes) {
      if (!row_cache.count(v)) row_cache[v] = {nullptr, (int)s, t.types[v].dtype};
      return;
    }
    for (const Operand &o : t.insts[t.def[v]].args)
      if (o.kind == Operand::Value && t.types[o.value].tensor && t.types[o.value].sizes == g.domain) pick(o.value, s);
  };
  for (size_t s = 0; s < tops.size(); ++s)
    for (int32_t v : tops[s]) {
      if (inline_value(v)) pick(v, s);
      else
        for (const Operand &o : t.insts[t.def[v]].args)
          if (o.kind == Operand::Value && t.types[o.value].tensor && t.types[o.value].sizes == g.domain) pick(o.value, s);
    }
  // One buffer per cached value for the whole kernel call (rows reuse it).
  for (auto &[v, c] : row_cache) c.ptr = row_scratch(size(std::max<int64_t>(64, extent * reg_bytes(c.dt) + 64)));
}

void KernelEmitter::collapse_row() {
  std::vector<int64_t> cs = contiguous_strides(g.domain);
  for (const Root &r : g.roots) {
    root_pat.push_back((int32_t)pats.size());
    Pattern pt{r.slot, 0, t.types[r.value].dtype, cs};
    pt.store = true;
    pats.push_back(pt);
  }
  for (size_t k = 0; k < g.row_roots.size(); ++k) {
    const Root &r = g.row_roots[k];
    const Type &ty = t.types[r.value];
    Map rm = row_map(g, ty.sizes);
    std::vector<int64_t> rs = contiguous_strides(ty.sizes), coef(g.domain.size(), 0);
    for (size_t j = 0; j < rm.size(); ++j)
      if (rm[j] >= 0) coef[rm[j]] += rs[j];
    Pattern pt{r.slot, 0, ty.dtype, coef};
    pt.store = true;
    row_pat[(int32_t)k] = {(int32_t)pats.size()};
    pats.push_back(pt);
  }
  std::vector<int> outer, red;
  for (size_t d = 0; d < g.domain.size(); ++d)
    (std::binary_search(g.rdims.begin(), g.rdims.end(), (int64_t)d) ? red : outer).push_back((int)d);
  std::vector<std::vector<int64_t>> nc(pats.size());
  merge_dims(outer, nc);
  n_outer = dims.size();
  merge_dims(red, nc);
  for (size_t k = 0; k < pats.size(); ++k) pats[k].coef = nc[k];
}

Function *KernelEmitter::emit_row(const std::string &name) {
  total = 1;
  int64_t outer_n = 1;
  for (size_t d = 0; d < g.domain.size(); ++d) {
    total *= g.domain[d];
    if (!std::binary_search(g.rdims.begin(), g.rdims.end(), (int64_t)d)) outer_n *= g.domain[d];
  }
  std::map<std::pair<int32_t, Map>, char> seen;
  for (int32_t r : g.reductions) collect(t.insts[t.def[r]].args[0].value, identity(), seen);
  for (const Root &r : g.roots) collect(r.value, identity(), seen);
  for (const Root &r : g.row_roots) collect(r.value, row_map(g, t.types[r.value].sizes), seen);
  collapse_row();
  if (outer_n == 0) return nullptr;  // no rows; an empty reduced extent still yields results
  if (g.split_chunks > 0) return emit_split(name);
  shape_rows();
  begin_function(name);
  plan_row_cache();
  emit_nest(0, n_outer, F->getArg(1), F->getArg(2), [this](Value *, Value *) { emit_row_body(); });
  std::vector<Value *> scratch;
  for (auto &[v, c] : row_cache) scratch.push_back(c.ptr);
  free_row_scratch(scratch);
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  return F;
}

// A whole-tensor reduction cut into chunks of the first reduced dim: `name_part` reduces chunks
// [begin, end) into partial states (run in parallel), `name` merges them in chunk order,
// finalizes, and stores the row-shaped results.
Function *KernelEmitter::emit_split(const std::string &name) {
  int64_t n = dims[n_outer].size;
  split = Split::Partial;
  // Threads sharing a chunk (a GPU block), striding it, then merged as a row's are.
  if (dims.size() == n_outer + 1) row_threads = part_row_threads = split_partial_threads();
  begin_function(name + "_part");
  Loop lp = open_loop(F->getArg(1), [&](Value *i) { return B.CreateICmpSLT(i, F->getArg(2)); }, "chunk");
  Value *c = lp.i;
  split_chunk = c;
  Value *nv = size(n);
  split_lo = B.CreateSDiv(B.CreateMul(c, nv), B.getInt64(g.split_chunks));
  split_hi = B.CreateSDiv(B.CreateMul(B.CreateAdd(c, B.getInt64(1)), nv), B.getInt64(g.split_chunks));
  reg.clear();
  reduction_index = 0;
  for (int32_t r : g.reductions) {
    emit_reduction(r);
    ++reduction_index;
  }
  close_loop(lp, B.CreateAdd(c, B.getInt64(1)));
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  part_fn = F;

  split = Split::Merge;  // the main kernel: merge, finalize, store
  // Threads sharing the merge (a GPU block): thread t merges chunks t, t + threads, ... in
  // order, then the threads' states are merged.
  row_threads = split_merge_threads(g.split_chunks);
  base.clear();
  begin_function(name);
  reg.clear();
  reduction_index = 0;
  for (int32_t r : g.reductions) {
    emit_reduction(r);
    ++reduction_index;
  }
  store_row_roots();
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  split = Split::None;
  return F;
}


// Nested loops over the reduced dims [d, end); the innermost is vectorized. rflat tracks the
// row-major index within the reduced extent (argmax/argmin report it).
void KernelEmitter::emit_r_loops(size_t d, const std::function<void(int)> &body, int unroll, const Blocking *blk) {
  bool split_dim = split == Split::Partial && d == n_outer;  // this chunk's part of the first reduced dim
  Value *lo = split_dim ? split_lo : B.getInt64(0), *hi = split_dim ? split_hi : size(dims[d].size);
  if (d + 1 == dims.size()) {
    emit_inner(d, lo, hi, body, unroll, blk);
    return;
  }
  int64_t below = 1;
  for (size_t k = d + 1; k < dims.size(); ++k) below *= dims[k].size;
  Loop lp = open_loop(lo, [&](Value *i) { return B.CreateICmpSLT(i, hi); }, "red" + std::to_string(d));
  Value *i = lp.i;
  std::vector<Value *> saved = outer_off;
  Value *saved_flat = rflat;
  for (size_t k = 0; k < pats.size(); ++k)
    if (pats[k].coef[d]) outer_off[k] = B.CreateAdd(saved[k], B.CreateMul(i, size(pats[k].coef[d])));
  rflat = B.CreateAdd(saved_flat, B.CreateMul(i, size(below)));
  emit_r_loops(d + 1, body, unroll, blk);
  outer_off = saved;
  rflat = saved_flat;
  close_loop(lp, B.CreateAdd(i, B.getInt64(1)));
}

// Values stored once per row: reductions with buffers, and pointwise values of the row shape.
void KernelEmitter::store_row_roots() {
  BasicBlock *skip = nullptr;
  if (row_threads && !g.row_roots.empty()) {  // every thread holds the row's results; one stores
    BasicBlock *st = BasicBlock::Create(C, "row_store", F);
    skip = BasicBlock::Create(C, "row_stored", F);
    B.CreateCondBr(B.CreateICmpEQ(thread_in_row(), B.getInt64(0)), st, skip);
    B.SetInsertPoint(st);
  }
  for (size_t k = 0; k < g.row_roots.size(); ++k) {
    const Root &rr = g.row_roots[k];
    L = 1;
    memo.clear();
    jidx = B.getInt64(0);
    EVal v = cast(value(rr.value, row_map(g, t.types[rr.value].sizes)), t.types[rr.value].dtype);
    int32_t pk = row_pat[(int32_t)k][0];
    const Pattern &pt = pats[pk];
    Value *ptr = B.CreateInBoundsGEP(mem_ty(pt.dt), base[pt.slot], outer_off[pk]);
    decorate(B.CreateAlignedStore(to_memory(v.v, pt.dt), ptr, Align(dtype_bytes(pt.dt))), true, pt.slot);
  }
  if (skip) {
    B.CreateBr(skip);
    B.SetInsertPoint(skip);
  }
}

void KernelEmitter::emit_prefetch_next_row() {
  if (!prefetches_next_row() || n_outer == 0 || dims.size() != n_outer + 1) return;  // one collapsed reduced dim only
  for (size_t k = 0; k < pats.size(); ++k) {
    const Pattern &pt = pats[k];
    bool is_store = pt.store || std::find(root_pat.begin(), root_pat.end(), (int32_t)k) != root_pat.end();
    int64_t next = pt.coef[n_outer - 1];
    if (is_store || pt.gather || pt.coef.back() != 1 || next == 0 || hoisted.count((int32_t)k)) continue;
    Value *off = B.CreateAdd(B.CreateAdd(outer_off[k], size(pt.offset + next)), jidx);
    Value *ptr = B.CreateGEP(mem_ty(pt.dt), base[pt.slot], off);  // may point past the tensor: a hint only
    B.CreateIntrinsic(Intrinsic::prefetch, {B.getPtrTy()}, {ptr, B.getInt32(0), B.getInt32(2), B.getInt32(1)});  // read, into L2, data
  }
}

void KernelEmitter::emit_row_body() {
  reg.clear();
  row_regs.clear();
  stage = 0;
  // A mean and a var/std of the same input (layer norm, var_mean) share one Welford pass.
  // `stage` stays the planned index of each reduction (the row cache's stores and loads use it).
  std::set<int32_t> done;
  for (size_t i = 0; i < g.reductions.size(); ++i) {
    int32_t r = g.reductions[i];
    stage = (int)i;
    if (done.count(r)) continue;
    int32_t partner = -1;
    const Inst &ri = t.insts[t.def[r]];
    if (ri.op == Op::mean)
      for (int32_t v : g.reductions) {
        const Inst &vi = t.insts[t.def[v]];
        if (!done.count(v) && (vi.op == Op::var || vi.op == Op::std) && vi.args[0].value == ri.args[0].value) {
          partner = v;
          break;
        }
      }
    prefetch_next_row = i > 0;
    if (partner >= 0) {
      emit_reduction(partner, r);
      done.insert(partner);
    } else {
      emit_reduction(r);
    }
    done.insert(r);
  }
  stage = (int)g.reductions.size();
  store_row_roots();
  if (!g.roots.empty()) {
    rflat = B.getInt64(0);
    prefetch_next_row = true;
    emit_r_loops(n_outer, [this](int l) { emit_body(l); }, store_pass_copies());
    rflat = nullptr;
  }
  prefetch_next_row = false;
  stage = -1;
}

namespace {

// A tree (pairwise) reduction of the lanes of each vector in `state`, combined by `fn`.
using State = std::vector<Value *>;
State tree(IRBuilder<> &B, State s, const std::function<State(const State &, const State &)> &fn) {
  auto width = [](Value *v) { return (int)cast<FixedVectorType>(v->getType())->getNumElements(); };
  while (width(s[0]) > 1) {
    int h = width(s[0]) / 2;
    std::vector<int> lo, hi;
    for (int l = 0; l < h; ++l) {
      lo.push_back(l);
      hi.push_back(l + h);
    }
    State a, b;
    for (Value *v : s) {
      a.push_back(B.CreateShuffleVector(v, lo));
      b.push_back(B.CreateShuffleVector(v, hi));
    }
    s = fn(a, b);
  }
  State out;
  for (Value *v : s) out.push_back(B.CreateExtractElement(v, (uint64_t)0));
  return out;
}

}  // namespace

// -- reductions as accumulator families --
//
// A reduction keeps a state per vector accumulator (each unrolled copy) and one for the scalar
// tail, in allocas (Slots). init() makes the empty part's state, step() folds one element (or
// vector of them) in, read() gives a state as values, merge(p, q) combines the states of two
// disjoint parts, p's elements first (copies pairwise, vector lanes as a tree, the threads
// sharing a row in thread order, the chunks of a split reduction in chunk order), end() turns
// the merged state into the family's final form, and finish() gives the result. The walk over
// the row, the merge order and the split-reduction storage are the emitter's (emit_reduction);
// every target uses the same families.
struct KernelEmitter::Accumulator {
  struct Slots {
    Value *a = nullptr, *b = nullptr, *n = nullptr, *nan = nullptr;
  };
  KernelEmitter &e;
  IRBuilder<> &B;
  const Op op;
  const DType adt;  // accumulator and comparison dtype
  const bool fl;
  const int64_t extent;  // elements per row
  Accumulator(KernelEmitter &e, Op op, DType adt, int64_t extent)
      : e(e), B(e.B), op(op), adt(adt), fl(is_float(adt)), extent(extent) {}
  virtual ~Accumulator() = default;
  virtual int copies() const { return 4; }  // independent vector accumulators: hide the step's latency
  virtual int components() const { return 1; }
  virtual void init(Slots &s, int l) = 0;
  virtual void begin(int32_t) {}  // before the walk over the row (given the reduction's input)
  virtual void step(Slots &s, Value *x, int l) = 0;  // e.rflat: the element's flat index
  virtual State read(const Slots &s, int l) = 0;
  virtual State merge(const State &p, const State &q) = 0;
  virtual State end(State all) { return all; }
  virtual EVal finish(const State &all) = 0;
  virtual Value *mean(const State &) { return nullptr; }  // var/std: the row's mean, from the same state
  virtual const Blocking *blocking() { return nullptr; }

  llvm::Type *ty(DType d, int l) const {
    int keep = e.L;
    e.L = l;
    llvm::Type *r = e.vec_ty(d);
    e.L = keep;
    return r;
  }
  Value *konst(DType d, double v, int l) const {
    int keep = e.L;
    e.L = l;
    Value *c = e.cst(d, v).v;
    e.L = keep;
    return c;
  }
  Value *fresh(llvm::Type *type, Value *v) {  // an alloca holding v
    Value *p = e.alloca_at_entry(type);
    B.CreateStore(v, p);
    return p;
  }
  llvm::Type *scalar() const { return e.scalar_ty(adt); }
  Value *row_extent() { return e.size_f(extent, scalar()); }
};

// Float sum and mean: a cascade. Blocks of 16 unrolled steps add plainly into block sums (one
// add per vector); each block sum is then Kahan-added into the lane's total; partial blocks go
// straight into the compensated totals. Rounding errors of the short blocks are independent,
// so the relative error stays at float32's final rounding, as ATen's cascade sum.
struct KernelEmitter::CompensatedSum final : Accumulator {
  using Accumulator::Accumulator;
  Slots *vector_slots = nullptr;  // the copies' totals, which the block sums fold into
  Value *block[4] = {};
  Blocking cascade;
  void init(Slots &s, int l) override {
    s.a = fresh(ty(adt, l), konst(adt, 0, l));
    s.b = fresh(ty(adt, l), konst(adt, 0, l));  // the compensation
  }
  void begin(int32_t) override {
    for (Value *&p : block) p = e.alloca_at_entry(ty(adt, e.lanes));
  }
  // total (a, c) += x; the compensation is dropped at inf/NaN (as ATen's sum)
  void add(const Slots &s, Value *xv, int l) {
    llvm::Type *at = ty(adt, l);
    Value *a = B.CreateLoad(at, s.a), *c = B.CreateLoad(at, s.b);
    Value *y = B.CreateFSub(xv, c);
    Value *tt = B.CreateFAdd(a, y);
    Value *cn = B.CreateFSub(B.CreateFSub(tt, a), y);
    Value *fin = B.CreateFCmpOLT(B.CreateUnaryIntrinsic(Intrinsic::fabs, tt), konst(adt, INFINITY, l));
    B.CreateStore(tt, s.a);
    B.CreateStore(B.CreateSelect(fin, cn, konst(adt, 0, l)), s.b);
  }
  void step(Slots &s, Value *xv, int l) override {
    if (e.in_block) {  // inside a cascade block: one plain add
      Value *p = block[e.copy_index];
      B.CreateStore(B.CreateFAdd(B.CreateLoad(ty(adt, l), p), xv), p);
      return;
    }
    add(s, xv, l);
  }
  State read(const Slots &s, int l) override {
    llvm::Type *t1 = ty(adt, l);
    Value *va = B.CreateLoad(t1, s.a);
    return {B.CreateFSub(va, B.CreateLoad(t1, s.b))};
  }
  State merge(const State &p, const State &q) override { return {B.CreateFAdd(p[0], q[0])}; }
  EVal finish(const State &all) override {
    Value *total = all[0];
    if (op == Op::mean) total = B.CreateFDiv(total, row_extent());
    return {total, adt};
  }
  // The blocks fold into the copies' totals (vector_slots: set by emit_reduction).
  const Blocking *blocking() override {
    cascade = {16,
               [this] {
                 for (Value *p : block) B.CreateStore(konst(adt, 0, e.lanes), p);
               },
               [this] {
                 for (int c = 0; c < 4; ++c) add(vector_slots[c], B.CreateLoad(ty(adt, e.lanes), block[c]), e.lanes);
               }};
    return &cascade;
  }
};

// Integer sums, products, integer and bool min/max: one combining op, exact in any order.
struct KernelEmitter::Fold final : Accumulator {
  using Accumulator::Accumulator;
  Value *combine(Value *a, Value *b) {
    switch (op) {
      case Op::prod: return fl ? B.CreateFMul(a, b) : B.CreateMul(a, b);
      case Op::amax:
        return fl ? B.CreateBinaryIntrinsic(Intrinsic::maximum, a, b)
                  : B.CreateBinaryIntrinsic(adt == DType::Bool ? Intrinsic::umax : Intrinsic::smax, a, b);
      case Op::amin:
        return fl ? B.CreateBinaryIntrinsic(Intrinsic::minimum, a, b)
                  : B.CreateBinaryIntrinsic(adt == DType::Bool ? Intrinsic::umin : Intrinsic::smin, a, b);
      default: return fl ? B.CreateFAdd(a, b) : B.CreateAdd(a, b);
    }
  }
  void init(Slots &s, int l) override {
    Value *c;
    if (!fl && (op == Op::amax || op == Op::amin)) {
      llvm::Type *st = scalar();
      bool mx = op == Op::amax;
      c = adt == DType::Bool ? ConstantInt::get(st, mx ? 0 : 1)
          : mx ? ConstantInt::get(st, APInt::getSignedMinValue(st->getIntegerBitWidth()))
               : ConstantInt::get(st, APInt::getSignedMaxValue(st->getIntegerBitWidth()));
      if (l > 1) c = B.CreateVectorSplat(l, c);
    } else {
      c = konst(adt, op == Op::prod ? 1 : 0, l);
    }
    s.a = fresh(ty(adt, l), c);
  }
  void step(Slots &s, Value *xv, int l) override {
    Value *a = B.CreateLoad(ty(adt, l), s.a);
    B.CreateStore(combine(a, xv), s.a);
  }
  State read(const Slots &s, int l) override { return {B.CreateLoad(ty(adt, l), s.a)}; }
  State merge(const State &p, const State &q) override { return {combine(p[0], q[0])}; }
  EVal finish(const State &all) override {
    Value *v0 = all[0];
    if (op == Op::mean) v0 = B.CreateFDiv(v0, row_extent());
    return {v0, adt};
  }
};

// Float amax/amin: one x86 max/min that keeps a NaN already in the accumulator, plus a per-lane
// "saw NaN" mask for NaN inputs (3 instructions per vector instead of llvm.maximum's 6); the
// mask turns the lane into NaN when the state is read.
struct KernelEmitter::MinMaxNan final : Accumulator {
  using Accumulator::Accumulator;
  llvm::Type *mask_ty(int l) const {
    return l == 1 ? (llvm::Type *)B.getInt1Ty() : FixedVectorType::get(B.getInt1Ty(), l);
  }
  void init(Slots &s, int l) override {
    s.a = fresh(ty(adt, l), konst(adt, op == Op::amax ? -INFINITY : INFINITY, l));
    s.nan = fresh(mask_ty(l), Constant::getNullValue(mask_ty(l)));
  }
  void step(Slots &s, Value *xv, int l) override {  // maxps(x, a) = x > a ? x : a: a NaN accumulator stays
    Value *a = B.CreateLoad(ty(adt, l), s.a);
    Value *take = op == Op::amax ? B.CreateFCmpOGT(xv, a) : B.CreateFCmpOLT(xv, a);
    B.CreateStore(B.CreateSelect(take, xv, a), s.a);
    B.CreateStore(B.CreateOr(B.CreateLoad(mask_ty(l), s.nan), e.fisnan(xv)), s.nan);
  }
  State read(const Slots &s, int l) override {
    Value *va = B.CreateLoad(ty(adt, l), s.a);
    return {B.CreateSelect(B.CreateLoad(mask_ty(l), s.nan), konst(adt, NAN, l), va)};
  }
  State merge(const State &p, const State &q) override {
    return {B.CreateBinaryIntrinsic(op == Op::amax ? Intrinsic::maximum : Intrinsic::minimum, p[0], q[0])};
  }
  EVal finish(const State &all) override { return {all[0], adt}; }
};

// argmax/argmin: (best value, its flat index), NaN first and ties to the lower index.
struct KernelEmitter::ArgBest final : Accumulator {
  using Accumulator::Accumulator;
  int components() const override { return 2; }
  // better(x, xi) over (v, vi)
  Value *better(Value *xv, Value *xi, Value *v, Value *vi) {
    bool mx = op == Op::argmax;
    Value *gt, *eq;
    if (fl) {
      gt = mx ? B.CreateFCmpOGT(xv, v) : B.CreateFCmpOLT(xv, v);
      Value *xn = e.fisnan(xv), *vn = e.fisnan(v);
      gt = B.CreateOr(gt, B.CreateAnd(xn, B.CreateNot(vn)));
      eq = B.CreateOr(B.CreateFCmpOEQ(xv, v), B.CreateAnd(xn, vn));
    } else {
      bool u = adt == DType::Bool;
      gt = mx ? (u ? B.CreateICmpUGT(xv, v) : B.CreateICmpSGT(xv, v)) : (u ? B.CreateICmpULT(xv, v) : B.CreateICmpSLT(xv, v));
      eq = B.CreateICmpEQ(xv, v);
    }
    return B.CreateOr(gt, B.CreateAnd(eq, B.CreateICmpSLT(xi, vi)));
  }
  void init(Slots &s, int l) override {
    bool mx = op == Op::argmax;
    Value *c;
    if (!fl) {
      llvm::Type *st = scalar();
      c = adt == DType::Bool ? ConstantInt::get(st, mx ? 0 : 1)
          : mx ? ConstantInt::get(st, APInt::getSignedMinValue(st->getIntegerBitWidth()))
               : ConstantInt::get(st, APInt::getSignedMaxValue(st->getIntegerBitWidth()));
      if (l > 1) c = B.CreateVectorSplat(l, c);
    } else {
      c = konst(adt, mx ? -INFINITY : INFINITY, l);
    }
    s.a = fresh(ty(adt, l), c);
    Value *none = B.getInt64(INT64_MAX);
    s.b = fresh(ty(DType::I64, l), l == 1 ? none : B.CreateVectorSplat(l, none));
  }
  void step(Slots &s, Value *xv, int l) override {
    Value *a = B.CreateLoad(ty(adt, l), s.a);
    Value *vi = B.CreateLoad(ty(DType::I64, l), s.b);
    Value *xi = e.rflat;
    if (l > 1) {
      std::vector<Constant *> iota;
      for (int k = 0; k < l; ++k) iota.push_back(B.getInt64(k));
      xi = B.CreateAdd(B.CreateVectorSplat(l, e.rflat), ConstantVector::get(iota));
    }
    Value *bt = better(xv, xi, a, vi);
    B.CreateStore(B.CreateSelect(bt, xv, a), s.a);
    B.CreateStore(B.CreateSelect(bt, xi, vi), s.b);
  }
  State read(const Slots &s, int l) override {
    Value *va = B.CreateLoad(ty(adt, l), s.a);
    return {va, B.CreateLoad(ty(DType::I64, l), s.b)};
  }
  State merge(const State &p, const State &q) override {
    Value *bt = better(q[0], q[1], p[0], p[1]);
    return {B.CreateSelect(bt, q[0], p[0]), B.CreateSelect(bt, q[1], p[1])};
  }
  EVal finish(const State &all) override { return {all[1], DType::I64}; }
};

// var/std: Welford's (count, mean, M2) in float64 (in float32 it drifts over millions of
// elements; ATen accumulates it in double too); every lane has seen the same count. Parts
// combine by Chan et al.'s formula.
struct KernelEmitter::Welford : Accumulator {
  int64_t correction;
  Welford(KernelEmitter &e, Op op, int64_t extent, int64_t correction)
      : Accumulator(e, op, DType::F64, extent), correction(correction) {}
  int copies() const override { return 1; }  // two float64 vectors per lane group already; more would spill
  int components() const override { return 3; }
  void init(Slots &s, int l) override {
    s.a = fresh(ty(adt, l), konst(adt, 0, l));
    s.b = fresh(ty(adt, l), konst(adt, 0, l));
    s.n = fresh(B.getInt64Ty(), B.getInt64(0));
  }
  void step(Slots &s, Value *xv, int l) override {
    llvm::Type *at = ty(adt, l);
    Value *a = B.CreateLoad(at, s.a);
    Value *n = B.CreateAdd(B.CreateLoad(B.getInt64Ty(), s.n), B.getInt64(1));
    B.CreateStore(n, s.n);
    Value *rn = B.CreateFDiv(ConstantFP::get(scalar(), 1.0), B.CreateSIToFP(n, scalar()));
    Value *m2 = B.CreateLoad(at, s.b);
    Value *delta = B.CreateFSub(xv, a);
    Value *mean = B.CreateFAdd(a, B.CreateFMul(delta, e.splat(rn)));
    B.CreateStore(mean, s.a);
    B.CreateStore(B.CreateFAdd(m2, B.CreateFMul(delta, B.CreateFSub(xv, mean))), s.b);
  }
  State read(const Slots &s, int l) override {
    llvm::Type *t1 = ty(adt, l);
    Value *va = B.CreateLoad(t1, s.a);
    Value *n = B.CreateSIToFP(B.CreateLoad(B.getInt64Ty(), s.n), scalar());
    return {l == 1 ? n : B.CreateVectorSplat(l, n), va, B.CreateLoad(t1, s.b)};
  }
  State merge(const State &p, const State &q) override {
    Value *n = B.CreateFAdd(p[0], q[0]);
    Value *zero = Constant::getNullValue(n->getType());
    Value *ratio = B.CreateSelect(B.CreateFCmpOGT(n, zero), B.CreateFDiv(q[0], n), zero);
    Value *delta = B.CreateFSub(q[1], p[1]);
    Value *m = B.CreateFAdd(p[1], B.CreateFMul(delta, ratio));
    Value *m2 = B.CreateFAdd(B.CreateFAdd(p[2], q[2]), B.CreateFMul(B.CreateFMul(delta, delta), B.CreateFMul(p[0], ratio)));
    return {n, m, m2};
  }
  EVal finish(const State &all) override {
    llvm::Type *st = scalar();
    Value *nc = B.CreateFSub(all[0], ConstantFP::get(st, (double)correction));
    Value *den = B.CreateSelect(B.CreateFCmpOGT(nc, ConstantFP::get(st, 0.0)), nc, ConstantFP::get(st, 0.0));
    Value *var = B.CreateFDiv(all[2], den);
    return {op == Op::std ? B.CreateUnaryIntrinsic(Intrinsic::sqrt, var) : var, adt};
  }
  // the mean of nothing is NaN (0 / 0), not Welford's initial 0
  Value *mean(const State &all) override { return extent == 0 ? (Value *)ConstantFP::get(scalar(), NAN) : all[1]; }
};

// var/std of a row of up to 2^16 elements (not split): shifted sums instead of Welford. With K
// the row's first element (0 if not finite), S1 = sum(x - K) and S2 = sum((x - K)^2) in float64
// give M2 = S2 - S1^2 / n. Since K is one of the data, n (K - mean)^2 <= n M2, so the
// cancellation costs at most a factor n: relative error <= n^1.5 * 2^-53 < 2^-29 here -- and no
// division per element, which is what makes Welford compute-bound in layer norm. end() gives
// Welford's (n, mean, M2), so finish() and mean() are Welford's.
struct KernelEmitter::ShiftedSums final : Welford {
  using Welford::Welford;
  Value *shift = nullptr;  // K
  int copies() const override { return 2; }
  void init(Slots &s, int l) override {
    s.a = fresh(ty(adt, l), konst(adt, 0, l));
    s.b = fresh(ty(adt, l), konst(adt, 0, l));
  }
  void begin(int32_t x) override {  // K: the row's first element
    e.L = 1;
    e.memo.clear();
    e.hoisted.clear();
    e.jidx = B.getInt64(0);
    Value *k0 = e.cast(e.value(x, e.identity()), adt).v;
    Value *finite = B.CreateFCmpOLT(B.CreateUnaryIntrinsic(Intrinsic::fabs, k0), konst(adt, INFINITY, 1));
    shift = B.CreateSelect(finite, k0, konst(adt, 0, 1));
  }
  void step(Slots &s, Value *xv, int l) override {
    llvm::Type *at = ty(adt, l);
    Value *a = B.CreateLoad(at, s.a);
    Value *d = B.CreateFSub(xv, l == 1 ? shift : B.CreateVectorSplat(l, shift));
    B.CreateStore(B.CreateFAdd(a, d), s.a);
    B.CreateStore(B.CreateIntrinsic(Intrinsic::fma, {at}, {d, d, B.CreateLoad(at, s.b)}), s.b);
  }
  State read(const Slots &s, int l) override {
    llvm::Type *t1 = ty(adt, l);
    Value *va = B.CreateLoad(t1, s.a);
    return {va, B.CreateLoad(t1, s.b)};
  }
  State merge(const State &p, const State &q) override { return {B.CreateFAdd(p[0], q[0]), B.CreateFAdd(p[1], q[1])}; }
  State end(State all) override {
    llvm::Type *st = scalar();
    Value *n = row_extent();
    Value *m2 = B.CreateFSub(all[1], B.CreateFDiv(B.CreateFMul(all[0], all[0]), n));
    m2 = B.CreateSelect(B.CreateFCmpOLT(m2, ConstantFP::get(st, 0.0)), ConstantFP::get(st, 0.0), m2);
    return {n, B.CreateFAdd(shift, B.CreateFDiv(all[0], n)), m2};
  }
};

std::unique_ptr<KernelEmitter::Accumulator> KernelEmitter::accumulator_for(const Inst &in, int64_t extent) {
  const Op op = in.op;
  const DType xdt = t.types[in.args[0].value].dtype;
  switch (op) {
    case Op::var: case Op::std: {
      int64_t corr = reduce_info(t, in).correction;
      if (split == Split::None && extent > 0 && extent <= 65536) return std::make_unique<ShiftedSums>(*this, op, extent, corr);
      return std::make_unique<Welford>(*this, op, extent, corr);
    }
    case Op::argmax: case Op::argmin: return std::make_unique<ArgBest>(*this, op, xdt, extent);
    case Op::amax: case Op::amin:
      if (is_float(xdt)) return std::make_unique<MinMaxNan>(*this, op, xdt, extent);
      return std::make_unique<Fold>(*this, op, xdt, extent);
    case Op::sum: case Op::mean:
      if (is_float(xdt)) return std::make_unique<CompensatedSum>(*this, op, xdt, extent);
      return std::make_unique<Fold>(*this, op, DType::I64, extent);
    case Op::prod: return std::make_unique<Fold>(*this, op, is_float(xdt) ? xdt : DType::I64, extent);
    default: fail(ErrorCode::Internal, std::string("no accumulator for ") + op_info(op).name);
  }
}

void KernelEmitter::emit_reduction(int32_t r, int32_t also_mean) {
  const Inst &in = t.insts[t.def[r]];
  const int32_t x = in.args[0].value;
  int64_t extent = 1;
  for (int64_t d : g.rdims) extent *= g.domain[d];
  std::unique_ptr<Accumulator> acc = accumulator_for(in, extent);
  const DType adt = acc->adt;
  using Slots = Accumulator::Slots;
  constexpr int kMaxCopies = 4;
  const int copies = acc->copies();
  Slots vs[kMaxCopies], ss;  // per unrolled vector copy; the scalar tail
  for (int c = 0; c < copies; ++c) acc->init(vs[c], lanes);
  acc->init(ss, 1);

  L = 1;
  const int ncomp = acc->components();
  auto part_ptr = [&](Value *chunk, int comp) {  // split reductions: [chunk][reduction][4] x 8 bytes
    Value *basep = B.CreateLoad(B.getPtrTy(), slot_addr(g.split_slot));
    Value *idx = B.CreateAdd(B.CreateMul(chunk, B.getInt64((int64_t)g.reductions.size() * 4)),
                             B.getInt64((int64_t)reduction_index * 4 + comp));
    return B.CreateInBoundsGEP(B.getInt64Ty(), basep, idx);
  };
  auto pack = [&](Value *v) -> Value * {
    llvm::Type *vt = v->getType();
    if (vt->isFloatTy()) v = B.CreateFPExt(v, B.getDoubleTy());
    if (v->getType()->isDoubleTy()) return B.CreateBitCast(v, B.getInt64Ty());
    return B.CreateIntCast(v, B.getInt64Ty(), !vt->isIntegerTy(1));
  };
  auto unpack = [&](Value *bits, llvm::Type *want) -> Value * {
    if (want->isDoubleTy()) return B.CreateBitCast(bits, want);
    if (want->isFloatTy()) return B.CreateFPTrunc(B.CreateBitCast(bits, B.getDoubleTy()), want);
    return B.CreateTrunc(bits, want);
  };
  MergeFn merge2 = [&](const State &a, const State &b) { return acc->merge(a, b); };
  State all;
  if (split == Split::Merge) {
    std::vector<llvm::Type *> types;
    State proto = acc->read(ss, 1);
    for (Value *v : proto) types.push_back(v->getType());
    auto chunk_state = [&](Value *chunk) {
      State st_c;
      for (int k = 0; k < ncomp; ++k) st_c.push_back(unpack(B.CreateLoad(B.getInt64Ty(), part_ptr(chunk, k)), types[k]));
      return st_c;
    };
    if (row_threads) {
      for (int c = 0; c < g.split_chunks / row_threads; ++c) {
        State st_c = chunk_state(B.CreateAdd(thread_in_row(), B.getInt64((int64_t)c * row_threads)));
        all = c == 0 ? st_c : merge2(all, st_c);
      }
      all = merge_row_threads(all, merge2, pack, unpack);
    } else {
      for (int c = 0; c < g.split_chunks; ++c) {
        State st_c = chunk_state(B.getInt64(c));
        all = c == 0 ? st_c : merge2(all, st_c);
      }
    }
  } else {
    std::vector<Value *> saved = outer_off;
    rflat = B.getInt64(0);
    acc->begin(x);
    auto *ca = dynamic_cast<CompensatedSum *>(acc.get());
    if (ca) ca->vector_slots = vs;
    emit_r_loops(n_outer, [&](int l) {
      L = l;
      memo.clear();
      Slots &s = l == 1 && !thread_copies ? ss : vs[copy_index];
      acc->step(s, cast(value(x, identity()), adt).v, l);
    }, copies, acc->blocking());
    outer_off = saved;
    rflat = nullptr;

    std::vector<State> parts;
    for (int c = 0; c < copies; ++c) parts.push_back(acc->read(vs[c], lanes));
    while (parts.size() > 1) {  // pairwise
      std::vector<State> next;
      for (size_t k = 0; k + 1 < parts.size(); k += 2) next.push_back(merge2(parts[k], parts[k + 1]));
      if (parts.size() % 2) next.push_back(parts.back());
      parts = next;
    }
    State v = lanes > 1 ? tree(B, parts[0], merge2) : parts[0];
    all = merge2(v, acc->read(ss, 1));
    if (row_threads) all = merge_row_threads(all, merge2, pack, unpack);
    all = acc->end(all);
  }
  if (split == Split::Partial) {
    for (int k = 0; k < ncomp; ++k) B.CreateStore(pack(all[k]), part_ptr(split_chunk, k));
    return;
  }
  reg[r] = cast(acc->finish(all), t.types[r].dtype);
  if (also_mean >= 0)  // a mean of the same input, from this var/std's state
    reg[also_mean] = cast({acc->mean(all), adt}, t.types[also_mean].dtype);
}

}  // namespace dynamo::jit::detail
