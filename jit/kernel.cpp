// kernel.cpp -- the target-neutral part of the kernel emitter (kernel.h): a fused group's
// access patterns, their collapsed loop dims, loop skeletons, loads and stores, and every
// pointwise op as LLVM IR on L lanes. The target (CpuEmitter, PtxEmitter) decides the lanes,
// the math library, how the work items map to the machine and where slot pointers live.
#include "kernel.h"
#include "rt_abi.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

namespace dynamo::jit::detail {

void KernelEmitter::collect(int32_t v0, const Map &m0, std::map<std::pair<int32_t, Map>, char> &seen) {
  // Preorder over the inline expression with an explicit stack (chains can be 10^5 deep);
  // operands pushed last-first give the recursive walk's order, so the patterns' order too.
  std::vector<std::pair<int32_t, Map>> work{{v0, m0}};
  while (!work.empty()) {
    auto [v, m] = std::move(work.back());
    work.pop_back();
    if (!seen.emplace(std::make_pair(v, m), 1).second) continue;
    if (own_reduction(v)) continue;  // a register of this row; its input is collected by its stage
    if (inline_value(v)) {
      const Inst &in = t.insts[t.def[v]];
      const std::vector<Operand> &args = in.args;
      for (size_t k = args.size(); k-- > 0;) {
        if (gather_source(in, k)) {  // a pattern of its own, whatever else reads the source
          const int32_t x = args[0].value;
          const BufferView &bv = p.views[x];
          const Map xm = compose(m, v, 0);
          Pattern pt{bv.slot, bv.offset, t.types[x].dtype, std::vector<int64_t>(g.domain.size(), 0)};
          for (size_t d = 0; d < xm.size(); ++d)
            if (xm[d] >= 0) pt.coef[xm[d]] += bv.strides[d];
          const int64_t first = args[1].i;
          for (size_t d = (size_t)first; d < (size_t)first + args.size() - 2; ++d)
            pt.indexed.push_back({bv.strides[d], t.types[x].sizes[d]});
          pt.gather = true;
          int64_t last = bv.offset;
          for (size_t d = 0; d < bv.strides.size(); ++d)
            last += std::max<int64_t>(0, t.types[x].sizes[d] - 1) * bv.strides[d];
          pt.offsets32 = last < INT32_MAX;
          gather_of[{v, m}] = (int32_t)pats.size();
          pats.push_back(pt);
          continue;
        }
        if (args[k].kind == Operand::Value && t.types[args[k].value].tensor)
          work.emplace_back(args[k].value, compose(m, v, k));
      }
      continue;
    }
    const BufferView &bv = p.views[v];
    Pattern pt{bv.slot, bv.offset, t.types[v].dtype, std::vector<int64_t>(g.domain.size(), 0)};
    for (size_t k = 0; k < m.size(); ++k)
      if (m[k] >= 0) pt.coef[m[k]] += bv.strides[k];
    leaf_of[{v, m}] = (int32_t)pats.size();
    pats.push_back(pt);
  }
}

// Drops size-1 dims and merges neighbours that every access walks contiguously.
void KernelEmitter::collapse() {
  std::vector<int64_t> cs = contiguous_strides(g.domain);
  for (const Root &r : g.roots) {
    root_pat.push_back((int32_t)pats.size());
    if (r.strided) {  // copy_ into a (possibly strided) view of an input
      std::vector<int64_t> c = r.dest.strides;
      for (size_t d = 0; d < c.size(); ++d)
        if (g.domain[d] == 1) c[d] = 0;
      pats.push_back({r.dest.slot, r.dest.offset, t.types[r.value].dtype, c});
    } else {
      pats.push_back({r.slot, 0, t.types[r.value].dtype, cs});
    }
    pats.back().store = true;
  }
  std::vector<int> all;
  for (size_t d = 0; d < g.domain.size(); ++d) all.push_back((int)d);
  std::vector<std::vector<int64_t>> nc(pats.size());
  merge_dims(loop_order(all), nc);
  for (size_t k = 0; k < pats.size(); ++k) pats[k].coef = nc[k];
}

// The domain's order, unless its innermost collapsed dim is shorter than a short vector, a
// gather's position along it comes from its index tensors (its source's own address does not
// move along it: each lane a gather anyway), and another dim is long (roi_align's [K, C, 7, 7]
// samples): that dim then runs innermost, so the vector loop has lanes to fill (its other
// accesses strided: gathers and scatters, which are slow on some machines -- an embedding's
// [tokens, 4] rows read contiguously stay as they are; what does not move along the new inner
// dim is loaded once before the loop). Only where the target asks (reorders_short_inner: not
// on a GPU, whose threads must walk the contiguous dim).
std::vector<int> KernelEmitter::loop_order(const std::vector<int> &order) {
  constexpr int64_t kShort = 8, kLong = 64;
  if (!reorders_short_inner() || order.size() < 2) return order;
  std::vector<Dim> saved = dims;
  std::vector<std::vector<int64_t>> nc(pats.size());
  merge_dims(order, nc);
  int64_t inner = dims.back().size;
  dims = saved;
  bool indexed_inner = false;
  for (size_t k = 0; k < pats.size(); ++k) indexed_inner = indexed_inner || (pats[k].gather && nc[k].back() == 0);
  if (inner >= kShort || !indexed_inner) return order;
  int best = -1;
  for (int d : order)
    if (g.domain[d] >= kLong && (best < 0 || g.domain[d] > g.domain[best])) best = d;
  if (best < 0 || best == order.back()) return order;
  std::vector<int> r;
  for (int d : order)
    if (d != best) r.push_back(d);
  r.push_back(best);
  return r;
}

// Appends to dims (and each pattern's collapsed coefficients nc) the collapsed form of the
// original dims `which`, in order; at least one dim (of size 1) is always added.
void KernelEmitter::merge_dims(const std::vector<int> &which, std::vector<std::vector<int64_t>> &nc) {
  size_t first = dims.size();
  for (int d : which) {
    int64_t sz = g.domain[d];
    if (sz == 1) continue;
    bool merge = dims.size() > first;
    for (size_t k = 0; merge && k < pats.size(); ++k)
      if (nc[k].back() != pats[k].coef[d] * sz) merge = false;
    if (merge) {
      dims.back().size *= sz;
      for (size_t k = 0; k < pats.size(); ++k) nc[k].back() = pats[k].coef[d];
    } else {
      dims.push_back({sz});
      for (size_t k = 0; k < pats.size(); ++k) nc[k].push_back(pats[k].coef[d]);
    }
  }
  if (dims.size() == first) {
    dims.push_back({1});
    for (auto &c : nc) c.push_back(0);
  }
}

Map KernelEmitter::identity() const {
  Map id(g.domain.size());
  for (size_t k = 0; k < id.size(); ++k) id[k] = g.domain[k] == 1 ? -1 : (int32_t)k;
  return id;
}

void KernelEmitter::begin_function(const std::string &name) {
  bool all64 = true;
  for (const Pattern &pt : pats) all64 = all64 && dtype_bytes(pt.dt) == 8;
  lanes = vector_lanes(all64);

  MDBuilder mdb(C);
  // (named by the kernel's index, not the trace's name: equal code prints as equal IR)
  MDNode *domain = mdb.createAnonymousAliasScopeDomain(name.substr(name.rfind("_k") == std::string::npos ? 0 : name.rfind("_k")));
  scope_read = MDNode::get(C, mdb.createAnonymousAliasScope(domain, "reads"));
  scope_write = MDNode::get(C, mdb.createAnonymousAliasScope(domain, "writes"));
  inplace_slots.clear();
  for (const Pattern &w : pats)
    if (w.store)
      for (const Pattern &r : pats)
        if (!r.store && r.slot == w.slot &&
            std::find(inplace_slots.begin(), inplace_slots.end(), w.slot) == inplace_slots.end())
          inplace_slots.push_back(w.slot);

  auto *fty = FunctionType::get(B.getInt32Ty(), {B.getPtrTy(), B.getInt64Ty(), B.getInt64Ty()}, false);
  // External (not internal) linkage keeps each kernel a named symbol in the object: perf maps
  // and profilers then name it. Names are unique per trace function.
  F = Function::Create(fty, Function::ExternalLinkage, name, M);
  F->addParamAttr(0, Attribute::NoAlias);
  BasicBlock *entry = BasicBlock::Create(C, "entry", F);
  B.SetInsertPoint(entry);
  slots = F->getArg(0);
  flag = B.CreateAlloca(B.getInt32Ty());
  param_ip = llvm::cast<Instruction>(flag);
  B.CreateStore(B.getInt32(0), flag);
  fold_offsets();
  for (const Pattern &pt : pats) {
    if (base.count(pt.slot)) continue;
    Value *b = B.CreateLoad(B.getPtrTy(), local_addr(pt.slot), "slot" + std::to_string(pt.slot));
    base[pt.slot] = tensor_pointer(b);
  }
  outer_off.assign(pats.size(), B.getInt64(0));
}

void KernelEmitter::fold_offsets() {
  if (folded || !own_slot_table()) return;
  folded = true;
  for (Pattern &pt : pats) {
    pt.slot = local_index(pt.slot, pt.offset * (int64_t)dtype_bytes(pt.dt));
    pt.offset = 0;
  }
}

int32_t KernelEmitter::local_index(int32_t global, int64_t bytes) {
  auto it = local_of.find({global, bytes});
  if (it == local_of.end()) {
    it = local_of.emplace(std::make_pair(global, bytes), (int32_t)local_slots.size()).first;
    local_slots.push_back(global);
    local_offsets.push_back(bytes);
  }
  return it->second;
}

Value *KernelEmitter::size(int64_t v) {
  if (!sizes_as_data()) return B.getInt64(v);
  // a table entry of its own (never shared with an equal number: which numbers happen to be
  // equal differs from size to size, and would make the code differ)
  int32_t idx = (int32_t)local_slots.size();
  local_slots.push_back(-1);
  local_offsets.push_back(v);
  IRBuilder<> eb(param_ip);
  return eb.CreateLoad(B.getInt64Ty(), eb.CreateConstInBoundsGEP1_64(B.getPtrTy(), slots, idx));
}

// The L lane offsets {0, c, 2c, ...} of a strided access whose step is `step` (size(c)): constants
// when sizes are compiled in, else the step read from the table times {0, 1, 2, ...} (a stride
// that follows from a size must not be a constant, or the code would differ from size to size).
Value *KernelEmitter::lane_offsets(int64_t c, Value *step) {
  std::vector<Constant *> lane;
  bool constant = !sizes_as_data() || c == 0 || c == 1;
  for (int l = 0; l < L; ++l) lane.push_back(B.getInt64(constant ? l * c : l));
  Value *k = ConstantVector::get(lane);
  return constant ? k : B.CreateMul(B.CreateVectorSplat(L, step), k);
}

Value *KernelEmitter::size_f(int64_t v, llvm::Type *fty) {
  if (!sizes_as_data()) return ConstantFP::get(fty, (double)v);
  Value *n = size(v);
  IRBuilder<> eb(param_ip);
  return eb.CreateSIToFP(n, fty);
}

Value *KernelEmitter::slot_addr(int32_t global) {
  return B.CreateConstInBoundsGEP1_64(B.getPtrTy(), slots, own_slot_table() ? local_index(global, 0) : global);
}

Value *KernelEmitter::local_addr(int32_t index) {
  return B.CreateConstInBoundsGEP1_64(B.getPtrTy(), slots, index);
}

KernelEmitter::Loop KernelEmitter::open_loop(Value *from, const std::function<Value *(Value *)> &cond,
                                             const std::string &name) {
  BasicBlock *pre = B.GetInsertBlock();
  BasicBlock *head = BasicBlock::Create(C, name, F), *body = BasicBlock::Create(C, name + "_body", F);
  BasicBlock *exit = BasicBlock::Create(C, name + "_exit", F);
  B.CreateBr(head);
  B.SetInsertPoint(head);
  PHINode *i = B.CreatePHI(B.getInt64Ty(), 2);
  i->addIncoming(from, pre);
  B.CreateCondBr(cond(i), body, exit);
  B.SetInsertPoint(body);
  return {i, head, exit};
}

void KernelEmitter::close_loop(const Loop &l, Value *next) {
  l.i->addIncoming(next, B.GetInsertBlock());
  B.CreateBr(l.head);
  B.SetInsertPoint(l.exit);
}

Function *KernelEmitter::emit(const std::string &name) {
  if (g.row) return emit_row(name);
  total = 1;
  for (int64_t s : g.domain) total *= s;
  std::map<std::pair<int32_t, Map>, char> seen;
  for (const Root &r : g.roots) collect(r.value, identity(), seen);
  collapse();
  if (total == 0) return nullptr;
  begin_function(name);
  emit_pointwise_items();
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  return F;
}

void KernelEmitter::emit_pointwise_items() {
  size_t last = dims.size() - 1;
  emit_nest(0, last, F->getArg(1), F->getArg(2),
            [&](Value *b, Value *e) { emit_inner(last, b, e, [this](int l) { emit_body(l); }); });
}

// Outer loops: dim 0 runs [begin, end) (the parallel range); the others run fully.
// Loops over dims [d, stop): dim d runs [begin, end), later ones fully, each adding its
// coefficient to every access's offset; at `stop`, at_stop(begin, end) emits what is inside.
void KernelEmitter::emit_nest(size_t d, size_t stop, Value *begin, Value *end,
                              const std::function<void(Value *, Value *)> &at_stop) {
  if (d == stop) {
    at_stop(begin, end);
    return;
  }
  Loop lp = open_loop(begin, [&](Value *i) { return B.CreateICmpSLT(i, end); }, "outer" + std::to_string(d));
  Value *i = lp.i;
  std::vector<Value *> saved = outer_off;
  for (size_t k = 0; k < pats.size(); ++k)
    if (pats[k].coef[d]) outer_off[k] = B.CreateAdd(saved[k], B.CreateMul(i, size(pats[k].coef[d])));
  Value *next_end = d + 1 < dims.size() ? size(dims[d + 1].size) : B.getInt64(0);
  emit_nest(d + 1, stop, B.getInt64(0), next_end, at_stop);
  outer_off = saved;
  close_loop(lp, B.CreateAdd(i, B.getInt64(1)));
}

void KernelEmitter::emit_inner(size_t d, Value *begin, Value *end, const std::function<void(int)> &body, int unroll,
                               const Blocking *blk) {
  if (dims[d].size == 0) return;  // nothing to run, and nothing may be loaded
  // Loads that do not move along the inner dim are done once, before the loop.
  hoisted.clear();
  for (size_t k = 0; k < pats.size(); ++k) {
    bool is_store = std::find(root_pat.begin(), root_pat.end(), (int32_t)k) != root_pat.end() || pats[k].store;
    if (is_store || pats[k].gather || pats[k].coef[d] != 0) continue;
    L = 1;
    jidx = B.getInt64(0);
    hoisted[(int32_t)k] = load((int32_t)k).v;
  }
  Value *row_base = rflat;
  // copies: vectors of lanes_now per iteration (independent accumulators when unrolled), copy u
  // starting `spacing` elements after copy u - 1 (the vector width; row_threads when threads
  // share a row). Runs while the iteration's last element is below limit.
  auto loop = [&](int lanes_now, int copies, Value *from, Value *limit, const char *nm, int64_t spacing) -> Value * {
    int64_t reach = (int64_t)(copies - 1) * spacing + lanes_now;  // elements from j to past the last
    Loop lp = open_loop(from, [&](Value *j) -> Value * {
      if (reach == 1) return B.CreateICmpSLT(j, limit);
      if (lanes_now == 1) return B.CreateICmpSLT(B.CreateAdd(j, B.getInt64(reach - 1)), limit);  // last one
      return B.CreateICmpSLE(B.CreateAdd(j, B.getInt64(reach)), limit);
    }, nm);
    Value *j = lp.i;
    thread_copies = row_threads && copies > 1;
    for (int u = 0; u < copies; ++u) {
      copy_index = u;
      jidx = u ? B.CreateAdd(j, B.getInt64((int64_t)u * spacing)) : j;
      if (row_base) rflat = B.CreateAdd(row_base, jidx);
      if (prefetch_next_row && lanes_now == lanes) emit_prefetch_next_row();
      body(lanes_now);
    }
    thread_copies = false;
    copy_index = 0;
    close_loop(lp, B.CreateAdd(j, B.getInt64((int64_t)copies * spacing)));
    return j;
  };
  Value *after = begin;
  if (row_threads && d + 1 == dims.size()) {
    // Threads sharing a row: thread t takes elements t, t + threads, ... of the innermost
    // reduced dim (coalesced on a GPU); the same split in every pass over the row.
    // `unroll` of them per iteration (independent accumulators: their loads overlap), then
    // the rest one at a time.
    // (`unroll` is the caller's number of accumulator copies; store passes pass 4.)
    const int per_iter = std::max(1, std::min(unroll, 4));
    Value *j = B.CreateAdd(begin, thread_in_row());
    int64_t per_thread = dims[d].size / row_threads;
    if (split == Split::None && dims.size() == n_outer + 1 && dims[d].size % row_threads == 0 && per_thread <= 32) {
      for (int64_t k = 0; k < per_thread; ++k) {  // registers across passes (row_regs)
        thread_copies = per_iter > 1;
        copy_index = (int)(k % per_iter);
        share_elem = (int)k;
        jidx = k ? B.CreateAdd(j, B.getInt64(k * row_threads)) : j;
        if (row_base) rflat = B.CreateAdd(row_base, jidx);
        body(1);
      }
      share_elem = -1;
      thread_copies = false;
      copy_index = 0;
      rflat = row_base;
      return;
    }
    if (per_iter > 1 && (split != Split::None || dims[d].size >= (int64_t)per_iter * row_threads))
      j = loop(1, per_iter, j, end, "blk_row_u", row_threads);
    loop(1, 1, j, end, "blk_row", row_threads);
    rflat = row_base;
    return;
  }
  // Sizes as data: the vector loops are emitted whatever the size (one longer than the row
  // runs no times), so the code does not depend on it. The blocked loop of a reduction (the
  // largest code) is left out for rows shorter than one block, as with constant sizes: rows
  // that cross a block's length are other code.
  const bool any = sizes_as_data();
  if (blk && lanes > 1 && dims[d].size >= (int64_t)lanes * unroll * blk->iters) {
    // Blocks: an outer loop over whole blocks, each an inner loop of blk->iters unrolled steps.
    int64_t step = (int64_t)lanes * unroll, bsize = step * blk->iters;
    Loop lp = open_loop(after, [&](Value *j) { return B.CreateICmpSLE(B.CreateAdd(j, B.getInt64(bsize)), end); },
                        "blk");
    Value *j = lp.i;
    blk->begin();
    in_block = true;
    Value *inner_end = B.CreateAdd(j, B.getInt64(bsize));
    loop(lanes, unroll, j, inner_end, "blk_in", lanes);
    in_block = false;
    blk->end();
    close_loop(lp, inner_end);
    after = j;
  }
  if (lanes > 1 && unroll > 1 && (any || dims[d].size >= (int64_t)lanes * unroll))
    after = loop(lanes, unroll, after, end, "vecu", lanes);
  if (lanes > 1 && (any || dims[d].size >= lanes)) after = loop(lanes, 1, after, end, "vec", lanes);
  loop(1, 1, after, end, "tail", 1);
  rflat = row_base;
  // The hoisted loads were made inside whatever loop encloses this one (an outer reduced dim's):
  // a value computed after it (a row's epilogue) must load again, not use them.
  hoisted.clear();
}

void KernelEmitter::emit_body(int lanes_now) {
  L = lanes_now;
  memo.clear();
  Map id = identity();
  // A group that writes memory it also reads (in-place writes of an optimizer's parameter and
  // its state, each element read where it is written) computes every root before it stores
  // any: each element's old contents are read before they are replaced. Other groups store
  // each root as it is computed (fewer values live at once).
  const bool defer = !inplace_slots.empty();
  std::vector<EVal> vals;
  if (defer)
    for (const Root &root : g.roots) vals.push_back(cast(value(root.value, id), t.types[root.value].dtype));
  for (size_t r = 0; r < g.roots.size(); ++r) {
    const Root &root = g.roots[r];
    EVal v = defer ? vals[r] : cast(value(root.value, id), t.types[root.value].dtype);
    const Pattern &pt = pats[root_pat[r]];
    int64_t c = pt.coef.back();
    Value *step = c == 0 || c == 1 ? B.getInt64(c) : size(c);
    Value *off = B.CreateAdd(B.CreateAdd(outer_off[root_pat[r]], B.getInt64(pt.offset)), B.CreateMul(jidx, step));
    Value *sv = to_memory(v.v, pt.dt);
    if (L > 1 && c != 1) {  // the loop walks a strided output dim (a row group's reduced dim)
      Value *idx = B.CreateAdd(B.CreateVectorSplat(L, off), lane_offsets(c, step));
      Value *ptrs = B.CreateInBoundsGEP(mem_ty(pt.dt), base[pt.slot], idx);
      decorate(B.CreateMaskedScatter(sv, ptrs, Align(dtype_bytes(pt.dt))), true, pt.slot);
      continue;
    }
    Value *ptr = B.CreateInBoundsGEP(mem_ty(pt.dt), base[pt.slot], off);
    decorate(B.CreateAlignedStore(sv, ptr, Align(dtype_bytes(pt.dt))), true, pt.slot);
  }
}

EVal KernelEmitter::load(int32_t k) {
  const Pattern &pt = pats[k];
  auto hit = hoisted.find(k);
  llvm::Type *mt = mem_ty(pt.dt);
  Value *v;
  if (hit != hoisted.end()) {
    return {splat(hit->second), pt.dt};
  }
  if (share_elem >= 0 && !pt.store)
    if (auto r = row_regs.find({k, share_elem}); r != row_regs.end()) return {r->second, pt.dt};
  int64_t c = pt.coef.back();
  Value *off = B.CreateAdd(outer_off[k], B.getInt64(pt.offset));
  if (c == 1 || L == 1) {
    Value *o = c == 0 ? off : B.CreateAdd(off, B.CreateMul(jidx, c == 1 ? B.getInt64(1) : size(c)));
    Value *ptr = B.CreateInBoundsGEP(mt, base[pt.slot], o);
    llvm::Type *lt = L == 1 ? mt : (llvm::Type *)FixedVectorType::get(mt, L);
    auto *ld = B.CreateAlignedLoad(lt, ptr, Align(dtype_bytes(pt.dt)));
    decorate(ld, false, pt.slot);
    v = ld;
  } else {
    Value *step = c == 0 ? B.getInt64(0) : size(c);
    Value *idx = B.CreateAdd(B.CreateVectorSplat(L, B.CreateAdd(off, B.CreateMul(jidx, step))), lane_offsets(c, step));
    Value *ptrs = B.CreateInBoundsGEP(mt, base[pt.slot], idx);
    auto *ld = B.CreateMaskedGather(FixedVectorType::get(mt, L), ptrs, Align(dtype_bytes(pt.dt)));
    decorate(ld, false, pt.slot);
    v = ld;
  }
  if (pt.dt == DType::Bool) v = B.CreateICmpNE(v, Constant::getNullValue(v->getType()));
  if (is_half(pt.dt)) v = B.CreateFPExt(v, vec_ty(pt.dt));
  if (share_elem >= 0 && !pt.store) row_regs[{k, share_elem}] = v;
  return {v, pt.dt};
}

EVal KernelEmitter::cast(EVal x, DType to) {
  if (x.dt == to) return x;
  if (is_half(x.dt)) {
    // value() rounds every half result already; a scalar operand cast to half is rounded here
    // (2.9995 is 3 as a half before it becomes an int). LLVM folds the repeated rounding away.
    x = {round_to(x.v, x.dt), x.dt};
  }
  llvm::Type *ty = vec_ty(to);
  if (to == DType::Bool) {
    Value *z = Constant::getNullValue(x.v->getType());
    return {is_float(x.dt) ? B.CreateFCmpUNE(x.v, z) : B.CreateICmpNE(x.v, z), to};
  }
  if (is_float(to)) {
    Value *f = is_float(x.dt) ? B.CreateFPCast(x.v, ty)
               : x.dt == DType::Bool ? B.CreateUIToFP(x.v, ty) : B.CreateSIToFP(x.v, ty);
    if (is_half(to)) f = round_to(f, to);  // round to the narrow type, keep computing in float32
    return {f, to};
  }
  // Out-of-range and NaN conversions are poison in LLVM; freeze keeps them to what the hardware
  // gives (as ATen's C++ casts do) instead of letting the optimizer assume anything.
  if (is_float(x.dt)) return {B.CreateFreeze(B.CreateFPToSI(x.v, ty)), to};
  return {B.CreateIntCast(x.v, ty, x.dt != DType::Bool), to};
}

Value *KernelEmitter::round_to(Value *f, DType narrow) {
  if (narrow == DType::BF16) return bf16_to_float(bf16_bits(f));
  llvm::Type *nt = L == 1 ? mem_ty(narrow) : (llvm::Type *)FixedVectorType::get(mem_ty(narrow), L);
  return B.CreateFPExt(B.CreateFPTrunc(f, nt), f->getType());
}

EVal KernelEmitter::operand(int32_t v, const Map &m, const Operand &o, DType as) {
  switch (o.kind) {
    case Operand::Value: {
      const Type &ty = t.types[o.value];
      if (ty.tensor) return cast(value(o.value, compose_map(t.types[v], ty, m)), as);  // (pointwise ops)
      // A scalar input: its 8 bytes live in the slot itself.
      Value *bits = B.CreateLoad(B.getInt64Ty(), slot_addr(p.scalar_slot[o.value]));
      EVal s;
      if (ty.dtype == DType::F64) s = {B.CreateBitCast(bits, B.getDoubleTy()), DType::F64};
      else if (ty.dtype == DType::Bool) s = {B.CreateICmpNE(bits, B.getInt64(0)), DType::Bool};
      else s = {bits, DType::I64};
      int keep = L;
      L = 1;
      s = cast(s, as);
      L = keep;
      return {splat(s.v), as};
    }
    case Operand::Int: case Operand::Bool: return cast(icst(o.kind == Operand::Bool ? DType::Bool : DType::I64, o.i), as);
    case Operand::Float: return cast(cst(DType::F64, o.f), as);
    default: fail(ErrorCode::Internal, "bad pointwise operand");
  }
}

EVal KernelEmitter::value(int32_t v, const Map &m) {
  auto key = std::make_pair(v, m);
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  EVal r;
  auto cached = row_cache.find(v);
  bool use_cache = cached != row_cache.end() && rflat && m == identity();
  if (use_cache && stage > cached->second.first) {  // computed by an earlier stage of this row
    llvm::Type *et = scalar_ty(cached->second.dt);
    Value *ptr = B.CreateInBoundsGEP(et, cached->second.ptr, rflat);
    r = {B.CreateAlignedLoad(vec_ty(cached->second.dt), ptr, Align(reg_bytes(cached->second.dt))),
         cached->second.dt};
  } else if (own_reduction(v)) {
    EVal s = reg.at(v);
    r = {splat(s.v), s.dt};
    if (is_half(r.dt)) r.v = round_to(r.v, r.dt);
  } else if (inline_value(v)) {
    if (!priming) prime(v, m);
    r = compute(v, m);
    // A float16/bfloat16 result is computed in float32 and rounded to its type here, as ATen
    // rounds each op's result: exp of a half overflows to inf before the next op reads it. (A
    // composite op ATen computes in float32 -- softmax, layer norm -- is decomposed in float32
    // and rounded once at its end: jit/decompose.cpp.)
    if (is_half(r.dt)) r.v = round_to(r.v, r.dt);
  } else {
    r = load(leaf_of.at(key));
  }
  if (use_cache && stage == cached->second.first) {  // the first stage keeps it for the others
    llvm::Type *et = scalar_ty(cached->second.dt);
    r = cast(r, cached->second.dt);
    B.CreateAlignedStore(r.v, B.CreateInBoundsGEP(et, cached->second.ptr, rflat), Align(reg_bytes(cached->second.dt)));
  }
  memo[key] = r;
  return r;
}

// Computes the inline operands under (v, m) first, deepest first (an iterative post-order walk),
// so that compute(v, m) finds each of them in the memo: compute() calls value() on its operands,
// and a 10^5-op chain computed by recursion would overflow the stack.
void KernelEmitter::prime(int32_t v0, const Map &m0) {
  using Key = std::pair<int32_t, Map>;
  std::set<Key> entered;
  std::vector<std::pair<Key, bool>> work;  // (value at map, its operands pushed already)
  std::vector<Key> order;
  auto push_operands = [&](const Key &k) {
    const Inst &in = t.insts[t.def[k.first]];
    const std::vector<Operand> &args = in.args;
    for (size_t i = args.size(); i-- > 0;) {
      const Operand &o = args[i];
      if (gather_source(in, i)) continue;  // read from memory
      if (o.kind != Operand::Value || !t.types[o.value].tensor || !inline_value(o.value)) continue;
      Key c{o.value, compose(k.second, k.first, i)};
      if (!memo.count(c) && !entered.count(c)) work.push_back({c, false});
    }
  };
  push_operands({v0, m0});
  while (!work.empty()) {
    auto [k, expanded] = work.back();
    work.pop_back();
    if (expanded) {
      order.push_back(k);
      continue;
    }
    if (!entered.insert(k).second) continue;
    work.push_back({k, true});
    push_operands(k);
  }
  priming = true;
  for (const Key &k : order) value(k.first, k.second);
  priming = false;
}

bool KernelEmitter::uniform_inner(int32_t v, const Map &m, int depth) {
  auto key = std::make_pair(v, m);
  if (auto it = uniform_memo.find(key); it != uniform_memo.end()) return it->second;
  bool u = true;
  if (depth <= 0) {
    u = false;
  } else if (own_reduction(v)) {
    u = true;  // this row's register
  } else if (inline_value(v)) {
    const Inst &in = t.insts[t.def[v]];
    if (in.op == Op::index) u = pats[gather_of.at(key)].coef.back() == 0;
    for (size_t k = 0; u && k < in.args.size(); ++k) {
      const Operand &o = in.args[k];
      if (!gather_source(in, k) && o.kind == Operand::Value && t.types[o.value].tensor)
        u = uniform_inner(o.value, compose(m, v, k), depth - 1);
    }
  } else {
    auto it = leaf_of.find(key);
    u = it != leaf_of.end() && pats[it->second].coef.back() == 0;
  }
  uniform_memo[key] = u;
  return u;
}

EVal KernelEmitter::gather(int32_t v, const Map &m) {
  const Inst &in = t.insts[t.def[v]];
  const int32_t k = gather_of.at({v, m});
  const Pattern &pt = pats[k];
  // The loop-decided part of the address, per lane (as load() forms it) ...
  int64_t c = pt.coef.back();
  Value *off = B.CreateAdd(outer_off[k], B.getInt64(pt.offset));
  if (c != 0) off = B.CreateAdd(off, B.CreateMul(jidx, c == 1 ? B.getInt64(1) : size(c)));
  llvm::Type *mt = mem_ty(pt.dt);
  auto finish = [&](Value *r) -> EVal {
    if (pt.dt == DType::Bool) r = B.CreateICmpNE(r, Constant::getNullValue(r->getType()));
    if (is_half(pt.dt)) r = B.CreateFPExt(r, vec_ty(pt.dt));
    return {r, pt.dt};
  };
  may_fail = true;
  bool uniform = L > 1 && (c == 0 || c == 1);
  for (size_t d = 0; uniform && d < pt.indexed.size(); ++d) uniform = uniform_inner(in.args[2 + d].value, compose(m, v, 2 + d));
  if (uniform) {
    // Every lane reads the same row (an embedding's, a bias table's): the index is one number,
    // and the lanes are one contiguous masked load (c == 1) or one element splat (c == 0).
    Value *ok = B.getTrue();
    for (size_t d = 0; d < pt.indexed.size(); ++d) {
      Value *iv = cast(value(in.args[2 + d].value, compose(m, v, 2 + d)), DType::I64).v;
      Value *i = B.CreateExtractElement(iv, (uint64_t)0);
      Value *n = size(pt.indexed[d].size);
      i = B.CreateSelect(B.CreateICmpSLT(i, B.getInt64(0)), B.CreateAdd(i, n), i);
      ok = B.CreateAnd(ok, B.CreateICmpULT(i, n));
      int64_t st = pt.indexed[d].stride;
      off = B.CreateAdd(off, B.CreateMul(i, st == 1 ? B.getInt64(1) : size(st)));
    }
    Value *cur = B.CreateLoad(B.getInt32Ty(), flag);
    B.CreateStore(B.CreateSelect(ok, cur, B.getInt32(DYNAMO_RT_INDEX_OUT_OF_RANGE)), flag);
    Value *ptr = B.CreateInBoundsGEP(mt, base[pt.slot], off);
    int lanes_read = c == 1 ? L : 1;
    auto *ld = B.CreateMaskedLoad(FixedVectorType::get(mt, lanes_read), ptr, Align(dtype_bytes(pt.dt)),
                                  B.CreateVectorSplat(lanes_read, ok));
    decorate(ld, false, pt.slot);
    Value *r = c == 1 ? (Value *)ld : B.CreateVectorSplat(L, B.CreateExtractElement(ld, (uint64_t)0));
    return finish(r);
  }
  Value *addr = splat(off);
  if (L > 1 && c != 0) addr = B.CreateAdd(addr, lane_offsets(c, c == 1 ? B.getInt64(1) : size(c)));
  // ... plus each indexed dim's index (negative: from the end) times its stride; an index
  // outside [-size, size) sets the status and reads nothing.
  Value *ok = nullptr;
  for (size_t d = 0; d < pt.indexed.size(); ++d) {
    const int32_t iv = in.args[2 + d].value;
    Value *i = cast(value(iv, compose(m, v, 2 + d)), DType::I64).v;
    Value *n = splat(size(pt.indexed[d].size));
    i = B.CreateSelect(B.CreateICmpSLT(i, splat(B.getInt64(0))), B.CreateAdd(i, n), i);
    Value *in_range = B.CreateICmpULT(i, n);  // (unsigned: a still-negative index is huge)
    ok = ok ? B.CreateAnd(ok, in_range) : in_range;
    int64_t st = pt.indexed[d].stride;
    addr = B.CreateAdd(addr, B.CreateMul(i, splat(st == 1 ? B.getInt64(1) : size(st))));
  }
  Value *all_ok = L == 1 ? ok : B.CreateAndReduce(ok);
  Value *cur = B.CreateLoad(B.getInt32Ty(), flag);
  B.CreateStore(B.CreateSelect(all_ok, cur, B.getInt32(DYNAMO_RT_INDEX_OUT_OF_RANGE)), flag);
  Value *mask = L == 1 ? B.CreateVectorSplat(1, ok) : ok;
  Value *addrs = L == 1 ? B.CreateVectorSplat(1, addr) : addr;
  // 32-bit offsets where the source allows: one dword gather per 16 lanes instead of two qword ones
  if (L > 1 && pt.offsets32) addrs = B.CreateTrunc(addrs, FixedVectorType::get(B.getInt32Ty(), L));
  Value *ptrs = B.CreateInBoundsGEP(mt, base[pt.slot], addrs);
  auto *ld = B.CreateMaskedGather(FixedVectorType::get(mt, L), ptrs, Align(dtype_bytes(pt.dt)), mask);
  decorate(ld, false, pt.slot);
  return finish(L == 1 ? B.CreateExtractElement(ld, (uint64_t)0) : (Value *)ld);
}

EVal KernelEmitter::compute(int32_t v, const Map &m) {
  const Inst &in = t.insts[t.def[v]];
  if (in.op == Op::index) return gather(v, m);
  const Type &rt = t.types[v];
  // The dtype the op computes in: ATen's promoted type of its (promoting) operands.
  std::vector<const Operand *> promo;
  for (size_t k = 0; k < in.args.size(); ++k) {
    if ((in.op == Op::where && k == 0) || (in.op == Op::leaky_relu && k == 1) ||
        (in.op == Op::softplus && k >= 1) || (in.op == Op::to && k == 1))
      continue;
    if (in.args[k].kind != Operand::None) promo.push_back(&in.args[k]);
  }
  DType ct = result_type(t, promo);
  const DRule rule = op_info(in.op).rule;
  if (rule == DRule::FLOAT) ct = rt.dtype;
  if (rule == DRule::LOGICAL) ct = DType::Bool;
  auto arg = [&](size_t k, DType as) { return operand(v, m, in.args[k], as).v; };
  auto x = [&]() { return arg(0, ct); };
  bool fl = is_float(ct);
  auto R = [&](Value *val) { return EVal{val, ct}; };
  auto one = [&]() { return cst(ct, 1.0).v; };
  auto zero = [&]() { return cst(ct, 0.0).v; };
  switch (in.op) {
    case Op::add: return R(fl ? B.CreateFAdd(x(), arg(1, ct)) : ct == DType::Bool ? B.CreateOr(x(), arg(1, ct)) : B.CreateAdd(x(), arg(1, ct)));
    case Op::sub: return R(fl ? B.CreateFSub(x(), arg(1, ct)) : B.CreateSub(x(), arg(1, ct)));
    case Op::mul: return R(fl ? B.CreateFMul(x(), arg(1, ct)) : ct == DType::Bool ? B.CreateAnd(x(), arg(1, ct)) : B.CreateMul(x(), arg(1, ct)));
    case Op::div: return R(B.CreateFDiv(x(), arg(1, ct)));
    case Op::floordiv: {
      Value *a = x(), *b = arg(1, ct);
      if (!fl) {
        // Python floor division; a zero divisor raises in ATen, so flag it and divide by 1.
        may_fail = true;
        Value *bz = B.CreateICmpEQ(b, zero());
        Value *any = L == 1 ? bz : B.CreateOrReduce(bz);
        Value *cur = B.CreateLoad(B.getInt32Ty(), flag);
        B.CreateStore(B.CreateSelect(any, B.getInt32(DYNAMO_RT_INT_DIV_BY_ZERO), cur), flag);
        // b == -1 is done as a wrapping negation: MIN / -1 would trap (SIGFPE) in sdiv.
        Value *bm1 = B.CreateICmpEQ(b, cst(ct, -1.0).v);
        Value *bs = B.CreateSelect(B.CreateOr(bz, bm1), one(), b);
        Value *q = B.CreateSDiv(a, bs), *r = B.CreateSRem(a, bs);
        q = B.CreateSelect(bm1, B.CreateSub(zero(), a), q);
        Value *adj = B.CreateAnd(B.CreateICmpNE(r, zero()),
                                 B.CreateICmpNE(B.CreateICmpSLT(r, zero()), B.CreateICmpSLT(bs, zero())));
        return R(B.CreateSub(q, B.CreateZExt(adj, q->getType())));
      }
      // ATen's div_floor for floats (matches Python's float //).
      Value *mod = B.CreateFRem(a, b);
      Value *div = B.CreateFDiv(B.CreateFSub(a, mod), b);
      Value *fix = B.CreateAnd(B.CreateFCmpUNE(mod, zero()),
                               B.CreateICmpNE(B.CreateFCmpOLT(b, zero()), B.CreateFCmpOLT(mod, zero())));
      div = B.CreateSelect(fix, B.CreateFSub(div, one()), div);
      Value *fd = B.CreateUnaryIntrinsic(Intrinsic::floor, div);
      fd = B.CreateSelect(B.CreateFCmpOGT(B.CreateFSub(div, fd), cst(ct, 0.5).v), B.CreateFAdd(fd, one()), fd);
      Value *q0 = B.CreateBinaryIntrinsic(Intrinsic::copysign, zero(), B.CreateFDiv(a, b));
      Value *res = B.CreateSelect(B.CreateFCmpUNE(div, zero()), fd, q0);
      return R(B.CreateSelect(B.CreateFCmpOEQ(b, zero()), B.CreateFDiv(a, b), res));
    }
    case Op::neg: return R(fl ? B.CreateFNeg(x()) : B.CreateNeg(x()));
    case Op::abs: {
      Value *a = x();
      if (fl) return R(B.CreateUnaryIntrinsic(Intrinsic::fabs, a));
      return R(B.CreateSelect(B.CreateICmpSLT(a, zero()), B.CreateNeg(a), a));
    }
    case Op::pow: {
      Value *a = x();
      const Operand &e = in.args[1];
      if (!fl) {  // integer base, non-negative literal exponent: square and multiply
        Value *acc = one(), *sq = a;
        for (int64_t n = e.i; n > 0; n >>= 1) {
          if (n & 1) acc = B.CreateMul(acc, sq);
          if (n > 1) sq = B.CreateMul(sq, sq);
        }
        return R(acc);
      }
      if (e.is_scalar_literal()) {  // ATen's special cases for scalar exponents
        double ev = e.kind == Operand::Float ? e.f : (double)e.i;
        if (ev == 2.0) return R(B.CreateFMul(a, a));
        if (ev == 3.0) return R(B.CreateFMul(B.CreateFMul(a, a), a));
        if (ev == 0.5) return R(B.CreateUnaryIntrinsic(Intrinsic::sqrt, a));
        if (ev == -0.5) return R(B.CreateFDiv(one(), B.CreateUnaryIntrinsic(Intrinsic::sqrt, a)));
        if (ev == -1.0) return R(B.CreateFDiv(one(), a));
        if (ev == -2.0) return R(B.CreateFDiv(one(), B.CreateFMul(a, a)));
      }
      return R(math("pow", ct, {a, arg(1, ct)}));
    }
    case Op::maximum: case Op::minimum: {
      bool mx = in.op == Op::maximum;
      Value *a = x(), *b = arg(1, ct);
      if (fl) return R(B.CreateBinaryIntrinsic(mx ? Intrinsic::maximum : Intrinsic::minimum, a, b));
      if (ct == DType::Bool) return R(mx ? B.CreateOr(a, b) : B.CreateAnd(a, b));
      return R(B.CreateBinaryIntrinsic(mx ? Intrinsic::smax : Intrinsic::smin, a, b));
    }
    case Op::clamp: {
      Value *r = x();
      for (int k = 1; k <= 2; ++k) {
        if (in.args[k].kind == Operand::None) continue;
        Value *bnd = arg(k, ct);
        if (fl) r = B.CreateBinaryIntrinsic(k == 1 ? Intrinsic::maximum : Intrinsic::minimum, r, bnd);
        else r = B.CreateBinaryIntrinsic(k == 1 ? Intrinsic::smax : Intrinsic::smin, r, bnd);
      }
      return R(r);
    }
    case Op::where: return R(B.CreateSelect(arg(0, DType::Bool), arg(1, ct), arg(2, ct)));
    case Op::copy: return R(x());
    case Op::copy_: {  // the new contents: the source, cast to the destination's dtype
      const Operand &src = in.args[1];
      DType sd = src.kind == Operand::Value ? t.types[src.value].dtype : src.kind == Operand::Float ? DType::F64
                 : src.kind == Operand::Bool ? DType::Bool : DType::I64;
      if (src.kind == Operand::Value && !t.types[src.value].tensor) sd = t.types[src.value].dtype;
      return cast(operand(v, m, src, sd), rt.dtype);
    }
    case Op::to: return cast(operand(v, m, in.args[0], t.types[in.args[0].value].tensor ? t.types[in.args[0].value].dtype : ct), rt.dtype);
    case Op::eq: case Op::ne: case Op::lt: case Op::le: case Op::gt: case Op::ge: {
      Value *a = x(), *b = arg(1, ct);
      CmpInst::Predicate pr;
      switch (in.op) {
        case Op::eq: pr = fl ? CmpInst::FCMP_OEQ : CmpInst::ICMP_EQ; break;
        case Op::ne: pr = fl ? CmpInst::FCMP_UNE : CmpInst::ICMP_NE; break;
        case Op::lt: pr = fl ? CmpInst::FCMP_OLT : ct == DType::Bool ? CmpInst::ICMP_ULT : CmpInst::ICMP_SLT; break;
        case Op::le: pr = fl ? CmpInst::FCMP_OLE : ct == DType::Bool ? CmpInst::ICMP_ULE : CmpInst::ICMP_SLE; break;
        case Op::gt: pr = fl ? CmpInst::FCMP_OGT : ct == DType::Bool ? CmpInst::ICMP_UGT : CmpInst::ICMP_SGT; break;
        default: pr = fl ? CmpInst::FCMP_OGE : ct == DType::Bool ? CmpInst::ICMP_UGE : CmpInst::ICMP_SGE; break;
      }
      return {B.CreateCmp(pr, a, b), DType::Bool};
    }
    case Op::logical_and: return R(B.CreateAnd(x(), arg(1, ct)));
    case Op::logical_or: return R(B.CreateOr(x(), arg(1, ct)));
    case Op::logical_xor: return R(B.CreateXor(x(), arg(1, ct)));
    case Op::logical_not: return R(B.CreateNot(x()));
    case Op::exp: return R(exp_of(ct, x()));
    case Op::exp_flush: return R(ct == DType::F64 ? math("exp", ct, {x()}) : exp_f32(x(), true));
    case Op::expm1: return R(math("expm1", ct, {x()}));
    case Op::log: return R(math("log", ct, {x()}));
    case Op::log1p: {
      // SLEEF's log1p overflows to inf near the top of the range (log1p(2e38f): inf, as ATen's;
      // the answer is 88.19). Where 1 + x rounds to x anyway, log(x) is log1p(x) to the last bit.
      Value *a = x();
      Value *big = B.CreateFCmpOGT(a, cst(ct, ct == DType::F64 ? 1e17 : 1e9).v);
      return R(B.CreateSelect(big, math("log", ct, {a}), math("log1p", ct, {a})));
    }
    case Op::log2: return R(math("log2", ct, {x()}));
    case Op::sin: return R(math("sin", ct, {x()}));
    case Op::cos: return R(math("cos", ct, {x()}));
    case Op::tan: return R(math("tan", ct, {x()}));
    case Op::tanh: return R(tanh_of(ct, x()));
    case Op::erf: return R(erf_of(ct, x()));
    case Op::sqrt: return R(B.CreateUnaryIntrinsic(Intrinsic::sqrt, x()));
    case Op::rsqrt: return R(B.CreateFDiv(one(), B.CreateUnaryIntrinsic(Intrinsic::sqrt, x())));
    case Op::reciprocal: return R(B.CreateFDiv(one(), x()));
    case Op::sigmoid:
      if (ct != DType::F64) return R(sigmoid_f32(x()));
      return R(B.CreateFDiv(one(), B.CreateFAdd(one(), exp_of(ct, B.CreateFNeg(x())))));
    case Op::silu: {
      Value *a = x();
      if (ct != DType::F64) return R(B.CreateFMul(a, sigmoid_f32(a)));
      return R(B.CreateFDiv(a, B.CreateFAdd(one(), exp_of(ct, B.CreateFNeg(a)))));
    }
    case Op::hardswish: {  // x * clamp(x + 3, 0, 6) / 6
      Value *a = x();
      Value *c = B.CreateBinaryIntrinsic(Intrinsic::maximum, B.CreateFAdd(a, cst(ct, 3.0).v), zero());
      c = B.CreateBinaryIntrinsic(Intrinsic::minimum, c, cst(ct, 6.0).v);
      return R(B.CreateFDiv(B.CreateFMul(a, c), cst(ct, 6.0).v));
    }
    case Op::relu: {
      Value *a = x();
      Value *neg = fl ? B.CreateFCmpOLT(a, zero()) : B.CreateICmpSLT(a, zero());
      return R(B.CreateSelect(neg, zero(), a));
    }
    case Op::leaky_relu: {
      Value *a = x();
      return R(B.CreateSelect(B.CreateFCmpOGT(a, zero()), a, B.CreateFMul(a, arg(1, ct))));
    }
    case Op::gelu: {
      Value *a = x();
      Value *e = erf_of(ct, B.CreateFMul(a, cst(ct, M_SQRT1_2).v));
      return R(B.CreateFMul(B.CreateFMul(a, cst(ct, 0.5).v), B.CreateFAdd(one(), e)));
    }
    case Op::gelu_tanh: {
      Value *a = x();
      Value *cube = B.CreateFMul(B.CreateFMul(a, a), a);
      Value *inner = B.CreateFMul(cst(ct, M_SQRT2 * M_2_SQRTPI * 0.5).v,
                                  B.CreateFAdd(a, B.CreateFMul(cst(ct, 0.044715).v, cube)));
      Value *th = tanh_of(ct, inner);
      return R(B.CreateFMul(B.CreateFMul(a, cst(ct, 0.5).v), B.CreateFAdd(one(), th)));
    }
    case Op::softplus: {
      Value *a = x(), *beta = arg(1, ct), *thr = arg(2, ct);
      Value *xb = B.CreateFMul(a, beta);
      Value *soft = B.CreateFDiv(math("log1p", ct, {exp_of(ct, xb)}), beta);
      return R(B.CreateSelect(B.CreateFCmpOGT(xb, thr), a, soft));
    }
    case Op::floor: return R(fl ? B.CreateUnaryIntrinsic(Intrinsic::floor, x()) : x());
    case Op::ceil: return R(fl ? B.CreateUnaryIntrinsic(Intrinsic::ceil, x()) : x());
    case Op::round: return R(fl ? B.CreateUnaryIntrinsic(Intrinsic::roundeven, x()) : x());
    case Op::trunc: return R(fl ? B.CreateUnaryIntrinsic(Intrinsic::trunc, x()) : x());
    case Op::sign: {
      Value *a = x();
      if (ct == DType::Bool) return R(a);
      Value *pos = fl ? B.CreateFCmpOGT(a, zero()) : B.CreateICmpSGT(a, zero());
      Value *neg = fl ? B.CreateFCmpOLT(a, zero()) : B.CreateICmpSLT(a, zero());
      EVal pv = cast({pos, DType::Bool}, ct), nv = cast({neg, DType::Bool}, ct);
      return R(fl ? B.CreateFSub(pv.v, nv.v) : B.CreateSub(pv.v, nv.v));
    }
    default:
      fail(ErrorCode::Internal, std::string("no kernel lowering for ") + op_info(in.op).name);
  }
}

}  // namespace dynamo::jit::detail
