// lower_cpu.cpp -- fused groups to vectorized LLVM IR: one loop nest per group, explicit
// vectors of the host's width with a scalar tail, SLEEF u10 functions for transcendental
// math, and one trace function that runs kernels and extern calls in program order.
#include "lower_cpu.h"
#include "kernel.h"
#include "rt_abi.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/StructuralHash.h>
#include <llvm/Transforms/Utils/FunctionComparator.h>

namespace dynamo::jit {

using namespace llvm;

namespace detail {

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
      const std::vector<Operand> &args = t.insts[t.def[v]].args;
      for (size_t k = args.size(); k-- > 0;)
        if (args[k].kind == Operand::Value && t.types[args[k].value].tensor)
          work.emplace_back(args[k].value, compose(m, v, args[k].value));
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
  merge_dims(all, nc);
  for (size_t k = 0; k < pats.size(); ++k) pats[k].coef = nc[k];
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
  lanes = std::max(1, opt.vector_bits / (all64 ? 64 : 32));

  MDBuilder mdb(C);
  // (named by the kernel's index, not the trace's name: equal code prints as equal IR)
  MDNode *domain = mdb.createAnonymousAliasScopeDomain(name.substr(name.rfind("_k") == std::string::npos ? 0 : name.rfind("_k")));
  scope_read = MDNode::get(C, mdb.createAnonymousAliasScope(domain, "reads"));
  scope_write = MDNode::get(C, mdb.createAnonymousAliasScope(domain, "writes"));

  auto *fty = FunctionType::get(B.getInt32Ty(), {B.getPtrTy(), B.getInt64Ty(), B.getInt64Ty()}, false);
  // External (not internal) linkage keeps each kernel a named symbol in the object: perf maps
  // and profilers then name it. Names are unique per trace function.
  F = Function::Create(fty, Function::ExternalLinkage, name, M);
  gpu_tid = nullptr;  // read again in this function's entry block
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
    Value *b = B.CreateLoad(B.getPtrTy(), opt.gpu ? slot_addr(pt.slot) : local_addr(pt.slot),
                            "slot" + std::to_string(pt.slot));
    // GPU: tensors are in global memory; saying so gives ld/st.global instead of generic ones.
    base[pt.slot] = opt.gpu ? B.CreateAddrSpaceCast(b, PointerType::get(C, 1)) : b;
  }
  outer_off.assign(pats.size(), B.getInt64(0));
}

void KernelEmitter::fold_offsets() {
  if (folded || opt.gpu) return;
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

Value *KernelEmitter::size_f(int64_t v, llvm::Type *fty) {
  if (!sizes_as_data()) return ConstantFP::get(fty, (double)v);
  Value *n = size(v);
  IRBuilder<> eb(param_ip);
  return eb.CreateSIToFP(n, fty);
}

Value *KernelEmitter::slot_addr(int32_t global) {
  return B.CreateConstInBoundsGEP1_64(B.getPtrTy(), slots, opt.gpu ? global : local_index(global, 0));
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
  if (opt.gpu) {  // one element per thread
    emit_gpu_flat();
    B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
    return F;
  }
  size_t last = dims.size() - 1;
  emit_nest(0, last, F->getArg(1), F->getArg(2),
            [&](Value *b, Value *e) { emit_inner(last, b, e, [this](int l) { emit_body(l); }); });
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  return F;
}

// GPU pointwise: [begin, end) are flat indices of the collapsed domain (row-major); each is
// split into its dims' indices, so neighbouring threads touch neighbouring elements of every
// contiguous access whatever the domain's rank.
void KernelEmitter::emit_gpu_flat() {
  int64_t n = 1;
  for (const Dim &d : dims) n *= d.size;
  // `unroll` elements per thread, whose loads can all be in flight together. When n splits into
  // whole tiles of unroll x kGpuThreads elements, thread t of tile b takes b*tile + u*threads + t
  // (a block streams one contiguous tile); otherwise the copies are n / unroll apart.
  int unroll = opt.gpu_unroll ? opt.gpu_unroll : 8;  // best of 1/2/4/8 on an H200 (chain, bias+GELU)
  while (unroll > 1 && (n % unroll || n / unroll < 32768)) unroll /= 2;
  gpu_n = n / unroll;
  const int64_t tile = (int64_t)unroll * kGpuThreads;
  const bool tiled = unroll > 1 && n % tile == 0;
  Loop lp = open_loop(F->getArg(1), [&](Value *i) { return B.CreateICmpSLT(i, F->getArg(2)); }, "flat");
  Value *j = lp.i;
  std::vector<Value *> saved = outer_off;
  hoisted.clear();
  rflat = nullptr;
  // Index arithmetic in 32 bits when it fits (64-bit division is a long sequence on GPUs).
  const bool narrow = n <= INT32_MAX;
  llvm::Type *ity = narrow ? B.getInt32Ty() : B.getInt64Ty();
  Value *tile_base = nullptr, *lane = nullptr;
  if (tiled) {
    tile_base = B.CreateMul(B.CreateUDiv(j, B.getInt64(kGpuThreads)), B.getInt64(tile));
    lane = B.CreateURem(j, B.getInt64(kGpuThreads));
  }
  for (int u = 0; u < unroll; ++u) {
    Value *rem = tiled ? B.CreateAdd(tile_base, B.CreateAdd(lane, B.getInt64((int64_t)u * kGpuThreads)))
                 : u   ? B.CreateAdd(j, B.getInt64(u * gpu_n))
                       : (Value *)j;
    if (narrow && dims.size() > 1) rem = B.CreateTrunc(rem, ity);
    for (size_t d = dims.size(); d-- > 0;) {
      Value *idx = d == 0 ? rem : B.CreateURem(rem, ConstantInt::get(ity, dims[d].size));
      if (d > 0) rem = B.CreateUDiv(rem, ConstantInt::get(ity, dims[d].size));
      idx = B.CreateZExt(idx, B.getInt64Ty());  // no-op when already 64-bit
      if (d + 1 == dims.size()) {
        jidx = idx;
        continue;
      }
      for (size_t k = 0; k < pats.size(); ++k)
        if (pats[k].coef[d]) outer_off[k] = B.CreateAdd(outer_off[k], B.CreateMul(idx, B.getInt64(pats[k].coef[d])));
    }
    emit_body(1);
    outer_off = saved;
  }
  close_loop(lp, B.CreateAdd(j, B.getInt64(1)));
}

Value *KernelEmitter::gpu_lane_first() {
  if (!gpu_tid) {
    IRBuilder<> eb(&F->getEntryBlock(), F->getEntryBlock().begin());
    gpu_tid = eb.CreateZExt(eb.CreateIntrinsic(Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {}), eb.getInt64Ty());
  }
  return gpu_tid;
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
    if (is_store || pats[k].coef[d] != 0) continue;
    L = 1;
    jidx = B.getInt64(0);
    hoisted[(int32_t)k] = load((int32_t)k).v;
  }
  Value *row_base = rflat;
  // copies: vectors of lanes_now per iteration (independent accumulators when unrolled), copy u
  // starting `spacing` elements after copy u - 1 (the vector width; a GPU block's thread count
  // when its threads stride a row). Runs while the iteration's last element is below limit.
  auto loop = [&](int lanes_now, int copies, Value *from, Value *limit, const char *nm, int64_t spacing) -> Value * {
    int64_t reach = (int64_t)(copies - 1) * spacing + lanes_now;  // elements from j to past the last
    Loop lp = open_loop(from, [&](Value *j) -> Value * {
      if (reach == 1) return B.CreateICmpSLT(j, limit);
      if (lanes_now == 1) return B.CreateICmpSLT(B.CreateAdd(j, B.getInt64(reach - 1)), limit);  // last one
      return B.CreateICmpSLE(B.CreateAdd(j, B.getInt64(reach)), limit);
    }, nm);
    Value *j = lp.i;
    gpu_copies = gpu_block && copies > 1;
    for (int u = 0; u < copies; ++u) {
      copy_index = u;
      jidx = u ? B.CreateAdd(j, B.getInt64((int64_t)u * spacing)) : j;
      if (row_base) rflat = B.CreateAdd(row_base, jidx);
      if (prefetch_next_row && lanes_now == lanes) emit_prefetch_next_row();
      body(lanes_now);
    }
    gpu_copies = false;
    copy_index = 0;
    close_loop(lp, B.CreateAdd(j, B.getInt64((int64_t)copies * spacing)));
    return j;
  };
  Value *after = begin;
  if (gpu_block && d + 1 == dims.size()) {
    // One block per row: thread t takes elements t, t + threads, ... of the innermost
    // reduced dim (coalesced across the block); the same split in every pass over the row.
    // `unroll` of them per iteration (independent accumulators: their loads overlap), then
    // the rest one at a time.
    // (`unroll` is the caller's number of accumulator copies; store passes pass 4.)
    const int per_iter = std::max(1, std::min(unroll, 4));
    Value *j = B.CreateAdd(begin, gpu_lane_first());
    int64_t per_thread = dims[d].size / gpu_block;
    if (split == Split::None && dims.size() == n_outer + 1 && dims[d].size % gpu_block == 0 && per_thread <= 32) {
      for (int64_t k = 0; k < per_thread; ++k) {  // registers across passes (row_regs)
        gpu_copies = per_iter > 1;
        copy_index = (int)(k % per_iter);
        gpu_elem = (int)k;
        jidx = k ? B.CreateAdd(j, B.getInt64(k * gpu_block)) : j;
        if (row_base) rflat = B.CreateAdd(row_base, jidx);
        body(1);
      }
      gpu_elem = -1;
      gpu_copies = false;
      copy_index = 0;
      rflat = row_base;
      return;
    }
    if (per_iter > 1 && (split != Split::None || dims[d].size >= (int64_t)per_iter * gpu_block))
      j = loop(1, per_iter, j, end, "blk_row_u", gpu_block);
    loop(1, 1, j, end, "blk_row", gpu_block);
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
  for (size_t r = 0; r < g.roots.size(); ++r) {
    const Root &root = g.roots[r];
    EVal v = cast(value(root.value, id), t.types[root.value].dtype);
    const Pattern &pt = pats[root_pat[r]];
    int64_t c = pt.coef.back();
    Value *off = B.CreateAdd(B.CreateAdd(outer_off[root_pat[r]], B.getInt64(pt.offset)),
                             B.CreateMul(jidx, c == 0 || c == 1 || L > 1 ? B.getInt64(c) : size(c)));
    Value *sv = to_memory(v.v, pt.dt);
    if (L > 1 && c != 1) {  // the loop walks a strided output dim (a row group's reduced dim)
      std::vector<Constant *> lane;
      for (int l = 0; l < L; ++l) lane.push_back(B.getInt64(l * c));
      Value *idx = B.CreateAdd(B.CreateVectorSplat(L, off), ConstantVector::get(lane));
      Value *ptrs = B.CreateInBoundsGEP(mem_ty(pt.dt), base[pt.slot], idx);
      decorate(B.CreateMaskedScatter(sv, ptrs, Align(dtype_bytes(pt.dt))), true);
      continue;
    }
    Value *ptr = B.CreateInBoundsGEP(mem_ty(pt.dt), base[pt.slot], off);
    decorate(B.CreateAlignedStore(sv, ptr, Align(dtype_bytes(pt.dt))), true);
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
  if (gpu_elem >= 0 && !pt.store)
    if (auto r = row_regs.find({k, gpu_elem}); r != row_regs.end()) return {r->second, pt.dt};
  int64_t c = pt.coef.back();
  Value *off = B.CreateAdd(outer_off[k], B.getInt64(pt.offset));
  if (c == 1 || L == 1) {
    Value *o = c == 0 ? off : B.CreateAdd(off, B.CreateMul(jidx, c == 1 ? B.getInt64(1) : size(c)));
    Value *ptr = B.CreateInBoundsGEP(mt, base[pt.slot], o);
    llvm::Type *lt = L == 1 ? mt : (llvm::Type *)FixedVectorType::get(mt, L);
    auto *ld = B.CreateAlignedLoad(lt, ptr, Align(dtype_bytes(pt.dt)));
    decorate(ld, false);
    v = ld;
  } else {
    std::vector<Constant *> lane;
    for (int l = 0; l < L; ++l) lane.push_back(B.getInt64(l * c));
    Value *idx = B.CreateAdd(B.CreateVectorSplat(L, B.CreateAdd(off, B.CreateMul(jidx, B.getInt64(c)))),
                             ConstantVector::get(lane));
    Value *ptrs = B.CreateInBoundsGEP(mt, base[pt.slot], idx);
    auto *ld = B.CreateMaskedGather(FixedVectorType::get(mt, L), ptrs, Align(dtype_bytes(pt.dt)));
    decorate(ld, false);
    v = ld;
  }
  if (pt.dt == DType::Bool) v = B.CreateICmpNE(v, Constant::getNullValue(v->getType()));
  if (is_half(pt.dt)) v = B.CreateFPExt(v, vec_ty(pt.dt));
  if (gpu_elem >= 0 && !pt.store) row_regs[{k, gpu_elem}] = v;
  return {v, pt.dt};
}

EVal KernelEmitter::cast(EVal x, DType to) {
  if (x.dt == to) return x;
  llvm::Type *ty = vec_ty(to);
  if (to == DType::Bool) {
    Value *z = Constant::getNullValue(x.v->getType());
    return {is_float(x.dt) ? B.CreateFCmpUNE(x.v, z) : B.CreateICmpNE(x.v, z), to};
  }
  if (is_float(to)) {
    Value *f = is_float(x.dt) ? B.CreateFPCast(x.v, ty)
               : x.dt == DType::Bool ? B.CreateUIToFP(x.v, ty) : B.CreateSIToFP(x.v, ty);
    if (to == DType::BF16) {  // round to the narrow type, keep computing in float32
      f = bf16_to_float(bf16_bits(f));
    } else if (is_half(to)) {
      llvm::Type *nt = L == 1 ? mem_ty(to) : (llvm::Type *)FixedVectorType::get(mem_ty(to), L);
      f = B.CreateFPExt(B.CreateFPTrunc(f, nt), ty);
    }
    return {f, to};
  }
  // Out-of-range and NaN conversions are poison in LLVM; freeze keeps them to what the hardware
  // gives (as ATen's C++ casts do) instead of letting the optimizer assume anything.
  if (is_float(x.dt)) return {B.CreateFreeze(B.CreateFPToSI(x.v, ty)), to};
  return {B.CreateIntCast(x.v, ty, x.dt != DType::Bool), to};
}

EVal KernelEmitter::operand(int32_t v, const Map &m, const Operand &o, DType as) {
  switch (o.kind) {
    case Operand::Value: {
      const Type &ty = t.types[o.value];
      if (ty.tensor) return cast(value(o.value, compose(m, v, o.value)), as);
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
  } else if (inline_value(v)) {
    if (!priming) prime(v, m);
    r = compute(v, m);
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
    const std::vector<Operand> &args = t.insts[t.def[k.first]].args;
    for (size_t i = args.size(); i-- > 0;) {
      const Operand &o = args[i];
      if (o.kind != Operand::Value || !t.types[o.value].tensor || !inline_value(o.value)) continue;
      Key c{o.value, compose(k.second, k.first, o.value)};
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

Value *KernelEmitter::sleef(const char *fn, DType d, std::vector<Value *> args) {
  bool f32 = d != DType::F64;  // half types compute in float32
  if (opt.gpu) {  // NVIDIA's libdevice (linked into the PTX module), scalar
    llvm::Type *ety = f32 ? B.getFloatTy() : B.getDoubleTy();
    std::string name = std::string("__nv_") + fn + (f32 ? "f" : "");
    FunctionCallee callee = M.getOrInsertFunction(name, FunctionType::get(ety, std::vector<llvm::Type *>(args.size(), ety), false));
    return B.CreateCall(callee, args);
  }
  int native = std::max(1, opt.vector_bits / (f32 ? 32 : 64));
  int chunk = L == 1 ? 1 : std::min(L, native);
  llvm::Type *ety = f32 ? B.getFloatTy() : B.getDoubleTy();
  llvm::Type *cty = chunk == 1 ? ety : (llvm::Type *)FixedVectorType::get(ety, chunk);
  std::string width = chunk == 1 ? "" : (f32 ? "" : "d") + std::to_string(chunk);
  std::string name = std::string("Sleef_") + fn + (f32 ? "f" : "") + width + "_u10";
  if (fault_injected("sleef")) name += "_missing";  // tests: a SLEEF symbol the JIT cannot resolve
  std::vector<llvm::Type *> ptys(args.size(), cty);
  FunctionCallee callee = M.getOrInsertFunction(name, FunctionType::get(cty, ptys, false));
  if (auto *cf = dyn_cast<Function>(callee.getCallee())) {
    cf->setDoesNotAccessMemory();
    cf->setDoesNotThrow();
  }
  if (chunk == L) return B.CreateCall(callee, args);
  // Wider than SLEEF's widest: split into native-width pieces and join them.
  Value *out = nullptr;
  std::vector<Value *> parts;
  for (int base_lane = 0; base_lane < L; base_lane += chunk) {
    std::vector<int> mask;
    for (int l = 0; l < chunk; ++l) mask.push_back(base_lane + l);
    std::vector<Value *> a;
    for (Value *x : args) a.push_back(B.CreateShuffleVector(x, mask));
    parts.push_back(B.CreateCall(callee, a));
  }
  while (parts.size() > 1) {
    std::vector<Value *> next;
    for (size_t k = 0; k + 1 < parts.size(); k += 2) {
      int n = (int)llvm::cast<FixedVectorType>(parts[k]->getType())->getNumElements();
      std::vector<int> mask;
      for (int l = 0; l < 2 * n; ++l) mask.push_back(l);
      next.push_back(B.CreateShuffleVector(parts[k], parts[k + 1], mask));
    }
    parts = next;
  }
  out = parts[0];
  return out;
}

EVal KernelEmitter::compute(int32_t v, const Map &m) {
  const Inst &in = t.insts[t.def[v]];
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
      return R(sleef("pow", ct, {a, arg(1, ct)}));
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
    case Op::expm1: return R(sleef("expm1", ct, {x()}));
    case Op::log: return R(sleef("log", ct, {x()}));
    case Op::log1p: {
      // SLEEF's log1p overflows to inf near the top of the range (log1p(2e38f): inf, as ATen's;
      // the answer is 88.19). Where 1 + x rounds to x anyway, log(x) is log1p(x) to the last bit.
      Value *a = x();
      Value *big = B.CreateFCmpOGT(a, cst(ct, ct == DType::F64 ? 1e17 : 1e9).v);
      return R(B.CreateSelect(big, sleef("log", ct, {a}), sleef("log1p", ct, {a})));
    }
    case Op::log2: return R(sleef("log2", ct, {x()}));
    case Op::sin: return R(sleef("sin", ct, {x()}));
    case Op::cos: return R(sleef("cos", ct, {x()}));
    case Op::tan: return R(sleef("tan", ct, {x()}));
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
      Value *soft = B.CreateFDiv(sleef("log1p", ct, {exp_of(ct, xb)}), beta);
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
      fail(ErrorCode::Internal, std::string("no CPU lowering for ") + op_info(in.op).name);
  }
}

void set_target_attrs(Function *f, const LowerOptions &opt) {
  if (opt.gpu) {
    f->addFnAttr(Attribute::NoUnwind);
    return;
  }
  if (!opt.cpu.empty()) f->addFnAttr("target-cpu", opt.cpu);
  if (!opt.features.empty()) f->addFnAttr("target-features", opt.features);
  std::string w = std::to_string(opt.vector_bits);
  f->addFnAttr("prefer-vector-width", w);
  f->addFnAttr("min-legal-vector-width", w);
  f->addFnAttr(Attribute::NoUnwind);
}

}  // namespace detail

using namespace detail;

std::unique_ptr<Module> lower_trace(const Trace &t, const Plan &p, LLVMContext &ctx,
                                    const std::string &fn_name, const LowerOptions &opt,
                                    int *num_kernels, std::vector<int64_t> *size_table) {
  const bool as_data = opt.size_params && !opt.gpu;
  std::vector<int64_t> own_table;
  std::vector<int64_t> &table_out = size_table ? *size_table : own_table;
  table_out.clear();
  auto mod = std::make_unique<Module>(fn_name, ctx);
  IRBuilder<> B(ctx);
  llvm::Type *ptr = B.getPtrTy();
  auto *tfty = FunctionType::get(B.getInt32Ty(), {ptr, ptr}, false);
  Function *tf = Function::Create(tfty, Function::ExternalLinkage, fn_name, *mod);
  FunctionCallee par = mod->getOrInsertFunction(
      "dynamo_rt_parallel_for",
      FunctionType::get(B.getInt32Ty(), {ptr, ptr, ptr, B.getInt64Ty(), B.getInt64Ty()}, false));
  FunctionCallee ext = mod->getOrInsertFunction(
      "dynamo_rt_extern", FunctionType::get(B.getInt32Ty(), {ptr, ptr, B.getInt32Ty()}, false));
  FunctionCallee fill = mod->getOrInsertFunction(
      "dynamo_rt_fill_table", FunctionType::get(B.getVoidTy(), {ptr, ptr, ptr, B.getInt64Ty()}, false));

  // Kernels that are the same code are compiled once: a structural hash buckets them and
  // LLVM's FunctionComparator (MergeFunctions' test of equal behaviour) decides. Kernels address
  // their own slot table, so the slots they touch are not part of their code; every kernel's
  // loads and stores carry the same two alias scopes, so metadata cannot tell equal code apart.
  GlobalNumberState numbering;
  auto same = [&](Function *a, Function *b) {
    if ((a == nullptr) != (b == nullptr)) return false;
    return a == nullptr || FunctionComparator(a, b, &numbering).compare() == 0;
  };
  struct Call {
    bool kernel;
    Function *fn;
    int64_t n0, inner;
    int32_t ext;
    int32_t optional_slot;
    std::vector<int32_t> table;  // kernels: the global slots of their local table
    std::vector<int64_t> offsets;  // and the bytes added to each slot's pointer
  };
  std::vector<Call> calls;
  std::unordered_map<uint64_t, std::vector<std::pair<Function *, Function *>>> emitted;  // hash -> (kernel, partial)
  int nk = 0;
  size_t table_size = 1;
  for (const Step &s : p.steps) {
    if (s.kind == Step::Extern) {
      calls.push_back({false, nullptr, 0, 0, s.index, -1, {}});
      continue;
    }
    KernelEmitter ke(*mod, t, p, s.index, opt);
    Function *k = ke.emit(fn_name + "_k" + std::to_string(s.index));
    if (!k) continue;  // empty domain: nothing to compute
    set_target_attrs(k, opt);
    Function *part = ke.partial();
    if (part) set_target_attrs(part, opt);
    uint64_t h = StructuralHash(*k, true) * 31 + (part ? StructuralHash(*part, true) : 0);
    std::vector<std::pair<Function *, Function *>> &bucket = emitted[h];
    auto it = std::find_if(bucket.begin(), bucket.end(),
                           [&](const std::pair<Function *, Function *> &e) { return same(e.first, k) && same(e.second, part); });
    if (it == bucket.end()) {
      ++nk;
      bucket.emplace_back(k, part);
    } else {  // the same code as an earlier kernel: call that one with this kernel's slots
      k->eraseFromParent();
      if (part) part->eraseFromParent();
      k = it->first;
      part = it->second;
    }
    const std::vector<int32_t> &table = ke.slot_table();
    table_size = std::max(table_size, table.size());
    if (part) {  // a split reduction: partial states in parallel, then the merge
      int64_t chunks = p.groups[s.index].split_chunks;
      calls.push_back({true, part, chunks, std::max<int64_t>(opt.parallel_min_elems, ke.numel() / chunks), -1, -1, table,
                       ke.slot_offsets()});
      calls.push_back({true, k, 1, 1, -1, -1, table, ke.slot_offsets()});
      continue;
    }
    calls.push_back({true, k, ke.outer_size(), std::max<int64_t>(1, ke.numel() / std::max<int64_t>(1, ke.outer_size())), -1,
                     p.groups[s.index].optional_slot, table, ke.slot_offsets()});
  }
  if (num_kernels) *num_kernels = nk;

  BasicBlock *bb = BasicBlock::Create(ctx, "entry", tf);
  B.SetInsertPoint(bb);
  Value *slots = tf->getArg(0), *rtctx = tf->getArg(1);
  llvm::Type *ptr_ty = B.getPtrTy();
  Value *ktable = B.CreateAlloca(ptr_ty, B.getInt64(table_size), "kernel_slots");
  // Sizes as data: per kernel call, the size table holds [outer size, grain, then (slot, byte
  // offset) per entry of the kernel's table, slot -1 giving a number]; the table itself is
  // slots[num_slots].
  Value *sizes = as_data ? B.CreateLoad(ptr_ty, B.CreateConstInBoundsGEP1_64(ptr_ty, slots, p.num_slots), "sizes") : nullptr;
  // one block returns a failing call's status (a block per call made a large trace function)
  BasicBlock *fail_bb = BasicBlock::Create(ctx, "fail", tf);
  PHINode *fail_status = PHINode::Create(B.getInt32Ty(), 0, "status");
  for (const Call &c : calls) {
    BasicBlock *skip = nullptr;
    if (c.optional_slot >= 0) {  // an elided output copy: the caller passed no buffer
      Value *ptr = B.CreateLoad(ptr_ty, B.CreateConstInBoundsGEP1_64(ptr_ty, slots, c.optional_slot));
      BasicBlock *run = BasicBlock::Create(ctx, "copy_out", tf);
      skip = BasicBlock::Create(ctx, "elided", tf);
      B.CreateCondBr(B.CreateIsNull(ptr), skip, run);
      B.SetInsertPoint(run);
    }
    Value *st;
    if (c.kernel && as_data) {
      int64_t at = (int64_t)table_out.size();
      int64_t numel = c.n0 * c.inner;
      bool par_ok = opt.parallel && numel >= opt.parallel_min_elems && c.n0 > 1;
      table_out.push_back(c.n0);
      // a grain of the whole range runs the kernel on this thread (dynamo_rt_parallel_for)
      table_out.push_back(par_ok ? std::max<int64_t>(1, (opt.parallel_min_elems / 2) / c.inner) : std::max<int64_t>(1, c.n0));
      for (size_t i = 0; i < c.table.size(); ++i) {
        table_out.push_back(c.table[i]);
        table_out.push_back(c.offsets[i]);
      }
      auto word = [&](int64_t k) { return B.CreateLoad(B.getInt64Ty(), B.CreateConstInBoundsGEP1_64(B.getInt64Ty(), sizes, k)); };
      B.CreateCall(fill, {ktable, slots, B.CreateConstInBoundsGEP1_64(B.getInt64Ty(), sizes, at + 2),
                          B.getInt64((int64_t)c.table.size())});
      if (opt.parallel)
        st = B.CreateCall(par, {rtctx, c.fn, ktable, word(at), word(at + 1)});
      else
        st = B.CreateCall(c.fn, {ktable, B.getInt64(0), word(at)});
    } else if (c.kernel) {
      if (c.table.size() > 2) {  // one runtime call reading a constant description: a trace of
        // hundreds of kernels keeps a small trace function, quick to compile
        std::vector<int64_t> desc;
        for (size_t i = 0; i < c.table.size(); ++i) {
          desc.push_back(c.table[i]);
          desc.push_back(c.offsets[i]);
        }
        Constant *arr = ConstantDataArray::get(ctx, desc);
        auto *gv = new GlobalVariable(*mod, arr->getType(), true, GlobalValue::PrivateLinkage, arr, "table_desc");
        B.CreateCall(fill, {ktable, slots, gv, B.getInt64((int64_t)c.table.size())});
      } else {
        for (size_t i = 0; i < c.table.size(); ++i) {  // pointers (plus offsets), or a scalar input's 8 bytes
          Value *v = B.CreateLoad(ptr_ty, B.CreateConstInBoundsGEP1_64(ptr_ty, slots, c.table[i]));
          if (c.offsets[i]) v = B.CreateGEP(B.getInt8Ty(), v, B.getInt64(c.offsets[i]));
          B.CreateStore(v, B.CreateConstInBoundsGEP1_64(ptr_ty, ktable, i));
        }
      }
      int64_t numel = c.n0 * c.inner;
      if (opt.parallel && numel >= opt.parallel_min_elems && c.n0 > 1) {
        int64_t grain = std::max<int64_t>(1, (opt.parallel_min_elems / 2) / c.inner);
        st = B.CreateCall(par, {rtctx, c.fn, ktable, B.getInt64(c.n0), B.getInt64(grain)});
      } else {
        st = B.CreateCall(c.fn, {ktable, B.getInt64(0), B.getInt64(c.n0)});
      }
    } else {
      st = B.CreateCall(ext, {rtctx, slots, B.getInt32(c.ext)});
    }
    BasicBlock *ok_bb = BasicBlock::Create(ctx, "ok", tf);
    B.CreateCondBr(B.CreateICmpNE(st, B.getInt32(0)), fail_bb, ok_bb);
    fail_status->addIncoming(st, B.GetInsertBlock());
    B.SetInsertPoint(ok_bb);
    if (skip) {
      B.CreateBr(skip);
      B.SetInsertPoint(skip);
    }
  }
  B.CreateRet(B.getInt32(0));
  if (fail_status->getNumIncomingValues() == 0) {
    fail_bb->eraseFromParent();
  } else {
    B.SetInsertPoint(fail_bb);
    B.Insert(fail_status);
    B.CreateRet(fail_status);
  }
  set_target_attrs(tf, opt);
  // The trace function only sequences calls (hundreds of them in a CNN): optimizing it buys
  // nothing at run time and cost half the compile time of a large trace.
  tf->addFnAttr(Attribute::OptimizeNone);
  tf->addFnAttr(Attribute::NoInline);
  return mod;
}

}  // namespace dynamo::jit
