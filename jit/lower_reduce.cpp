// lower_reduce.cpp -- row groups to LLVM IR: for each kept index (a "row"), one pass over the
// reduced dims per reduction (vector accumulators + scalar tail, merged as a tree), results kept
// in registers for later stages, then one pass storing the row's full-shape consumers.
// Key idea: softmax / layer norm / x - mean(x) read the row once from memory and again from
// cache, never materializing the row statistics or the intermediate pointwise values.
#include <cmath>
#include <set>

#include <llvm/IR/IntrinsicsNVPTX.h>

#include "kernel.h"

namespace dynamo::jit::detail {

Value *KernelEmitter::alloca_at_entry(llvm::Type *ty) {
  IRBuilder<> eb(&F->getEntryBlock(), F->getEntryBlock().begin());
  return eb.CreateAlloca(ty);
}

namespace {

bool is_math(Op op) {
  switch (op) {
    case Op::exp: case Op::expm1: case Op::log: case Op::log1p: case Op::log2: case Op::sin: case Op::cos:
    case Op::tan: case Op::tanh: case Op::erf: case Op::pow: case Op::sigmoid: case Op::silu: case Op::gelu:
    case Op::gelu_tanh: case Op::softplus:
      return true;
    default:
      return false;
  }
}

}  // namespace

void KernelEmitter::plan_row_cache() {
  if (opt.gpu) return;  // recompute instead: no per-thread heap buffers on the GPU
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
  for (auto &[v, c] : row_cache) {
    FunctionCallee mal = M.getOrInsertFunction("malloc", FunctionType::get(B.getPtrTy(), {B.getInt64Ty()}, false));
    c.ptr = B.CreateCall(mal, {size(std::max<int64_t>(64, extent * reg_bytes(c.dt) + 64))});
  }
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
  if (opt.gpu) {
    gpu_n = n_outer ? dims[0].size : 1;
    // A block per row once the innermost reduced dim is long enough to share out; the
    // per-thread partial states are merged in registers (shuffles) and shared memory.
    int64_t inner = dims.back().size;
    if (dims.size() > n_outer && inner >= 64) {
      gpu_block = 64;  // 8 to 16 elements per thread, at most 256 threads (measured on an H200)
      while (gpu_block < 256 && (int64_t)gpu_block * 16 <= inner) gpu_block *= 2;
      if (opt.gpu_row_block) gpu_block = opt.gpu_row_block;
    }
  }
  begin_function(name);
  plan_row_cache();
  emit_nest(0, n_outer, F->getArg(1), F->getArg(2), [this](Value *, Value *) { emit_row_body(); });
  FunctionCallee fr = M.getOrInsertFunction("free", FunctionType::get(B.getVoidTy(), {B.getPtrTy()}, false));
  for (auto &[v, c] : row_cache) B.CreateCall(fr, {c.ptr});
  B.CreateRet(B.CreateLoad(B.getInt32Ty(), flag));
  return F;
}

// A whole-tensor reduction cut into chunks of the first reduced dim: `name_part` reduces chunks
// [begin, end) into partial states (run in parallel), `name` merges them in chunk order,
// finalizes, and stores the row-shaped results.
Function *KernelEmitter::emit_split(const std::string &name) {
  int64_t n = dims[n_outer].size;
  split = Split::Partial;
  // GPU: a block per chunk, its threads striding the chunk (then merged as a row's are).
  if (opt.gpu && dims.size() == n_outer + 1) gpu_block = gpu_part_block = opt.gpu_row_block ? opt.gpu_row_block : 512;
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
  // GPU: one block; thread t merges chunks t, t + threads, ... in order, then the block merges
  // the threads' states (a tree).
  gpu_block = 0;
  if (opt.gpu)
    for (int b : {256, 128, 64, 32})
      if (g.split_chunks % b == 0) {
        gpu_block = b;
        break;
      }
  gpu_tid = nullptr;
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
  if (gpu_block && !g.row_roots.empty()) {  // every thread holds the row's results; one stores
    BasicBlock *st = BasicBlock::Create(C, "row_store", F);
    skip = BasicBlock::Create(C, "row_stored", F);
    B.CreateCondBr(B.CreateICmpEQ(gpu_lane_first(), B.getInt64(0)), st, skip);
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
    decorate(B.CreateAlignedStore(to_memory(v.v, pt.dt), ptr, Align(dtype_bytes(pt.dt))), true);
  }
  if (skip) {
    B.CreateBr(skip);
    B.SetInsertPoint(skip);
  }
}

void KernelEmitter::emit_prefetch_next_row() {
  if (opt.gpu || n_outer == 0 || dims.size() != n_outer + 1) return;  // one collapsed reduced dim only
  for (size_t k = 0; k < pats.size(); ++k) {
    const Pattern &pt = pats[k];
    bool is_store = pt.store || std::find(root_pat.begin(), root_pat.end(), (int32_t)k) != root_pat.end();
    int64_t next = pt.coef[n_outer - 1];
    if (is_store || pt.coef.back() != 1 || next == 0 || hoisted.count((int32_t)k)) continue;
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
    emit_r_loops(n_outer, [this](int l) { emit_body(l); }, opt.gpu ? 4 : 1);  // GPU: 4 stores in flight
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

// GPU block per row: each thread's state (all lanes of every component) merged across the
// block. A butterfly of warp shuffles leaves the warp's merge in every lane; lane 0 of each
// warp parks it in shared memory; after a barrier every thread merges the warps' states in
// warp order (so all threads agree on the result bit for bit), and a second barrier frees the
// shared slots for the next reduction.
std::vector<Value *> KernelEmitter::block_merge(std::vector<Value *> s, const MergeFn &merge2, const PackFn &pack,
                                                const UnpackFn &unpack) {
  llvm::Type *i32 = B.getInt32Ty(), *i64 = B.getInt64Ty();
  auto shfl = [&](Value *v, int off) -> Value * {
    auto one = [&](Value *x) {
      return B.CreateIntrinsic(Intrinsic::nvvm_shfl_sync_bfly_i32, {},
                               {B.getInt32(-1), x, B.getInt32(off), B.getInt32(0x1f)});
    };
    llvm::Type *vt = v->getType();
    unsigned bits = vt->getPrimitiveSizeInBits();
    if (bits == 64) {
      Value *x = B.CreateBitCast(v, i64);
      Value *lo = one(B.CreateTrunc(x, i32)), *hi = one(B.CreateTrunc(B.CreateLShr(x, 32), i32));
      return B.CreateBitCast(B.CreateOr(B.CreateZExt(lo, i64), B.CreateShl(B.CreateZExt(hi, i64), 32)), vt);
    }
    if (bits == 32) return B.CreateBitCast(one(B.CreateBitCast(v, i32)), vt);
    return B.CreateTrunc(one(B.CreateZExt(v, i32)), vt);
  };
  for (int off = 16; off >= 1; off /= 2) {
    std::vector<Value *> o;
    for (Value *v : s) o.push_back(shfl(v, off));
    s = merge2(s, o);
  }
  constexpr int kMaxWarps = 32, kMaxComps = 4;
  GlobalVariable *sm = M.getNamedGlobal("dynamo_block_states");
  auto *at = ArrayType::get(i64, kMaxWarps * kMaxComps);
  if (!sm) {
    sm = new GlobalVariable(M, at, false, GlobalValue::InternalLinkage, UndefValue::get(at), "dynamo_block_states",
                            nullptr, GlobalValue::NotThreadLocal, 3);
    sm->setAlignment(Align(8));
  }
  Value *tid = gpu_lane_first();
  Value *warp = B.CreateLShr(tid, 5);
  BasicBlock *wr = BasicBlock::Create(C, "park", F), *parked = BasicBlock::Create(C, "parked", F);
  B.CreateCondBr(B.CreateICmpEQ(B.CreateAnd(tid, 31), B.getInt64(0)), wr, parked);
  B.SetInsertPoint(wr);
  for (size_t k = 0; k < s.size(); ++k) {
    Value *idx = B.CreateAdd(B.CreateMul(warp, B.getInt64(kMaxComps)), B.getInt64((int64_t)k));
    B.CreateStore(pack(s[k]), B.CreateInBoundsGEP(at, sm, {B.getInt64(0), idx}));
  }
  B.CreateBr(parked);
  B.SetInsertPoint(parked);
  B.CreateIntrinsic(Intrinsic::nvvm_barrier0, {}, {});
  std::vector<Value *> res;
  for (int w = 0; w < gpu_block / 32; ++w) {
    std::vector<Value *> sw;
    for (size_t k = 0; k < s.size(); ++k) {
      Value *p = B.CreateInBoundsGEP(at, sm, {B.getInt64(0), B.getInt64(w * kMaxComps + (int64_t)k)});
      sw.push_back(unpack(B.CreateLoad(i64, p), s[k]->getType()));
    }
    res = w == 0 ? sw : merge2(res, sw);
  }
  B.CreateIntrinsic(Intrinsic::nvvm_barrier0, {}, {});
  return res;
}

void KernelEmitter::emit_reduction(int32_t r, int32_t also_mean) {
  const Inst &in = t.insts[t.def[r]];
  const int32_t x = in.args[0].value;
  const DType xdt = t.types[x].dtype, rdt = t.types[r].dtype;
  const Op op = in.op;
  const bool index = op == Op::argmax || op == Op::argmin;
  const bool welford = op == Op::var || op == Op::std;
  // Float sums: a cascade. Blocks of 16 unrolled steps add plainly into block sums (one add per
  // vector); each block sum is then Kahan-added into the lane's total; partial blocks go straight
  // into the compensated totals. Rounding errors of the short blocks are independent, so the
  // relative error stays at float32's final rounding, as ATen's cascade sum.
  const bool kahan = (op == Op::sum || op == Op::mean) && is_float(xdt);
  DType adt = xdt;  // accumulator / comparison dtype
  if ((op == Op::sum || op == Op::prod) && !is_float(xdt)) adt = DType::I64;
  // Welford in float32 drifts over millions of elements; like ATen, accumulate it in double.
  if (welford) adt = DType::F64;
  const bool fl = is_float(adt);
  int64_t extent = 1;
  for (int64_t d : g.rdims) extent *= g.domain[d];
  // var/std of a row of up to 2^16 elements: shifted sums instead of Welford. With K the row's
  // first element (0 if not finite), S1 = sum(x - K) and S2 = sum((x - K)^2) in float64 give
  // M2 = S2 - S1^2 / n. Since K is one of the data, n (K - mean)^2 <= n M2, so the cancellation
  // costs at most a factor n: relative error <= n^1.5 * 2^-53 < 2^-29 here -- and no division
  // per element, which is what makes Welford compute-bound in layer norm.
  const bool shifted = welford && split == Split::None && extent > 0 && extent <= 65536;

  auto ty = [&](DType d, int l) -> llvm::Type * {
    int keep = L;
    L = l;
    llvm::Type *r2 = vec_ty(d);
    L = keep;
    return r2;
  };
  auto konst = [&](DType d, double v, int l) {
    int keep = L;
    L = l;
    Value *c = cst(d, v).v;
    L = keep;
    return c;
  };
  double init = 0;
  switch (op) {
    case Op::prod: init = 1; break;
    case Op::amax: case Op::argmax: init = fl ? -INFINITY : (double)INT64_MIN; break;
    case Op::amin: case Op::argmin: init = fl ? INFINITY : (double)INT64_MAX; break;
    default: break;
  }
  auto init_of = [&](DType d, int l) -> Value * {
    if (!fl && (op == Op::amax || op == Op::argmax || op == Op::amin || op == Op::argmin)) {
      llvm::Type *st = scalar_ty(adt);
      bool mx = op == Op::amax || op == Op::argmax;
      Value *c = adt == DType::Bool ? ConstantInt::get(st, mx ? 0 : 1)
                 : mx ? ConstantInt::get(st, APInt::getSignedMinValue(st->getIntegerBitWidth()))
                      : ConstantInt::get(st, APInt::getSignedMaxValue(st->getIntegerBitWidth()));
      return l == 1 ? c : B.CreateVectorSplat(l, c);
    }
    return konst(d, init, l);
  };

  // State: [acc, comp|m2|idx] per width (vector lanes, scalar tail), plus welford counts.
  // Float amax/amin accumulate with one x86 max/min that keeps a NaN already in the
  // accumulator, plus a per-lane "saw NaN" mask for NaN inputs (3 instructions per vector
  // instead of llvm.maximum's 6); the mask turns the lane into NaN when the state is read.
  const bool nan_mask = fl && (op == Op::amax || op == Op::amin);
  struct Acc {
    Value *a = nullptr, *b = nullptr, *n = nullptr, *nan = nullptr;
  };
  constexpr int kCopies = 4;  // independent vector accumulators: hides the add/max latency
  // Welford's float64 state is already two vectors per lane group and has its own latency
  // slack; four copies of it (plus a fused producer's constants) would spill registers.
  const int copies = shifted ? 2 : welford ? 1 : kCopies;
  Acc vs[kCopies], ss;
  auto make = [&](Acc &s, int l) {
    s.a = alloca_at_entry(ty(adt, l));
    B.CreateStore(init_of(adt, l), s.a);
    if (kahan || welford) {
      s.b = alloca_at_entry(ty(adt, l));
      B.CreateStore(konst(adt, 0, l), s.b);
    }
    if (index) {
      s.b = alloca_at_entry(ty(DType::I64, l));
      Value *mx = B.getInt64(INT64_MAX);
      B.CreateStore(l == 1 ? mx : B.CreateVectorSplat(l, mx), s.b);
    }
    if (welford && !shifted) {
      s.n = alloca_at_entry(B.getInt64Ty());
      B.CreateStore(B.getInt64(0), s.n);
    }
    if (nan_mask) {
      llvm::Type *mt = l == 1 ? (llvm::Type *)B.getInt1Ty() : FixedVectorType::get(B.getInt1Ty(), l);
      s.nan = alloca_at_entry(mt);
      B.CreateStore(Constant::getNullValue(mt), s.nan);
    }
  };
  for (int c = 0; c < copies; ++c) make(vs[c], lanes);
  make(ss, 1);

  // better(x, xi) over (v, vi): the argmax/argmin order with NaN first and ties to the lower index.
  auto better = [&](Value *xv, Value *xi, Value *v, Value *vi) -> Value * {
    bool mx = op == Op::argmax;
    Value *gt, *eq;
    if (fl) {
      gt = mx ? B.CreateFCmpOGT(xv, v) : B.CreateFCmpOLT(xv, v);
      Value *xn = fisnan(xv), *vn = fisnan(v);
      gt = B.CreateOr(gt, B.CreateAnd(xn, B.CreateNot(vn)));
      eq = B.CreateOr(B.CreateFCmpOEQ(xv, v), B.CreateAnd(xn, vn));
    } else {
      bool u = adt == DType::Bool;
      gt = mx ? (u ? B.CreateICmpUGT(xv, v) : B.CreateICmpSGT(xv, v)) : (u ? B.CreateICmpULT(xv, v) : B.CreateICmpSLT(xv, v));
      eq = B.CreateICmpEQ(xv, v);
    }
    return B.CreateOr(gt, B.CreateAnd(eq, B.CreateICmpSLT(xi, vi)));
  };
  auto combine = [&](Value *a, Value *b) -> Value * {
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
  };

  // How states are read back and merged (copies lane-wise, lanes as a tree, chunks in order).
  L = 1;
  llvm::Type *st = scalar_ty(adt);
  auto load_state = [&](const Acc &a, int l) -> State {
    llvm::Type *t1 = ty(adt, l);
    Value *va = B.CreateLoad(t1, a.a);
    if (kahan) return {B.CreateFSub(va, B.CreateLoad(t1, a.b))};
    if (shifted) return {va, B.CreateLoad(t1, a.b)};
    if (welford) {
      Value *n = B.CreateSIToFP(B.CreateLoad(B.getInt64Ty(), a.n), st);
      return {l == 1 ? n : B.CreateVectorSplat(l, n), va, B.CreateLoad(t1, a.b)};
    }
    if (index) return {va, B.CreateLoad(ty(DType::I64, l), a.b)};
    if (nan_mask) {
      llvm::Type *mt = l == 1 ? (llvm::Type *)B.getInt1Ty() : FixedVectorType::get(B.getInt1Ty(), l);
      va = B.CreateSelect(B.CreateLoad(mt, a.nan), konst(adt, NAN, l), va);
    }
    return {va};
  };
  auto merge2 = [&](const State &p, const State &q) -> State {
    if (kahan) return {B.CreateFAdd(p[0], q[0])};
    if (shifted) return {B.CreateFAdd(p[0], q[0]), B.CreateFAdd(p[1], q[1])};
    if (welford) {  // Chan et al.: combine (n, mean, M2) of two disjoint parts
      Value *n = B.CreateFAdd(p[0], q[0]);
      Value *zero = Constant::getNullValue(n->getType());
      Value *ratio = B.CreateSelect(B.CreateFCmpOGT(n, zero), B.CreateFDiv(q[0], n), zero);
      Value *delta = B.CreateFSub(q[1], p[1]);
      Value *m = B.CreateFAdd(p[1], B.CreateFMul(delta, ratio));
      Value *m2 = B.CreateFAdd(B.CreateFAdd(p[2], q[2]), B.CreateFMul(B.CreateFMul(delta, delta), B.CreateFMul(p[0], ratio)));
      return {n, m, m2};
    }
    if (index) {
      Value *bt = better(q[0], q[1], p[0], p[1]);
      return {B.CreateSelect(bt, q[0], p[0]), B.CreateSelect(bt, q[1], p[1])};
    }
    return {combine(p[0], q[0])};
  };
  int ncomp = kahan ? 1 : welford ? 3 : index ? 2 : 1;
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
  State all;
  if (split == Split::Merge) {
    std::vector<llvm::Type *> types;
    State proto = load_state(ss, 1);
    for (Value *v : proto) types.push_back(v->getType());
    if (gpu_block) {
      for (int c = 0; c < g.split_chunks / gpu_block; ++c) {
        Value *chunk = B.CreateAdd(gpu_lane_first(), B.getInt64((int64_t)c * gpu_block));
        State st_c;
        for (int k = 0; k < ncomp; ++k) st_c.push_back(unpack(B.CreateLoad(B.getInt64Ty(), part_ptr(chunk, k)), types[k]));
        all = c == 0 ? st_c : merge2(all, st_c);
      }
      all = block_merge(all, merge2, pack, unpack);
    } else {
      for (int c = 0; c < g.split_chunks; ++c) {
        State st_c;
        for (int k = 0; k < ncomp; ++k) st_c.push_back(unpack(B.CreateLoad(B.getInt64Ty(), part_ptr(B.getInt64(c), k)), types[k]));
        all = c == 0 ? st_c : merge2(all, st_c);
      }
    }
  } else {
    std::vector<Value *> saved = outer_off;
    rflat = B.getInt64(0);
    Value *shift = nullptr;  // shifted sums: K, the row's first element
    if (shifted) {
      L = 1;
      memo.clear();
      hoisted.clear();
      jidx = B.getInt64(0);
      Value *k0 = cast(value(x, identity()), adt).v;
      Value *finite = B.CreateFCmpOLT(B.CreateUnaryIntrinsic(Intrinsic::fabs, k0), konst(adt, INFINITY, 1));
      shift = B.CreateSelect(finite, k0, konst(adt, 0, 1));
    }
    // Kahan step: total (a, c) += x; the compensation is dropped at inf/NaN (as ATen's sum).
    auto kahan_add = [&](const Acc &s, Value *xv, int l) {
      llvm::Type *at = ty(adt, l);
      Value *a = B.CreateLoad(at, s.a), *c = B.CreateLoad(at, s.b);
      Value *y = B.CreateFSub(xv, c);
      Value *tt = B.CreateFAdd(a, y);
      Value *cn = B.CreateFSub(B.CreateFSub(tt, a), y);
      Value *fin = B.CreateFCmpOLT(B.CreateUnaryIntrinsic(Intrinsic::fabs, tt), konst(adt, INFINITY, l));
      B.CreateStore(tt, s.a);
      B.CreateStore(B.CreateSelect(fin, cn, konst(adt, 0, l)), s.b);
    };
    Value *blk_acc[kCopies] = {};
    Blocking blocking{16,
                      [&] {
                        for (Value *p : blk_acc) B.CreateStore(konst(adt, 0, lanes), p);
                      },
                      [&] {
                        for (int c = 0; c < kCopies; ++c) kahan_add(vs[c], B.CreateLoad(ty(adt, lanes), blk_acc[c]), lanes);
                      }};
    if (kahan)
      for (Value *&p : blk_acc) p = alloca_at_entry(ty(adt, lanes));
    emit_r_loops(n_outer, [&](int l) {
      L = l;
      memo.clear();
      Acc &s = l == 1 && !gpu_copies ? ss : vs[copy_index];
      Value *xv = cast(value(x, identity()), adt).v;
      llvm::Type *at = ty(adt, l);
      if (kahan && in_block) {  // inside a cascade block: one plain add
        Value *p = blk_acc[copy_index];
        B.CreateStore(B.CreateFAdd(B.CreateLoad(at, p), xv), p);
        return;
      }
      Value *a = B.CreateLoad(at, s.a);
      if (kahan) {
        kahan_add(s, xv, l);
      } else if (shifted) {
        Value *d = B.CreateFSub(xv, l == 1 ? shift : B.CreateVectorSplat(l, shift));
        B.CreateStore(B.CreateFAdd(a, d), s.a);
        B.CreateStore(B.CreateIntrinsic(Intrinsic::fma, {at}, {d, d, B.CreateLoad(at, s.b)}), s.b);
      } else if (welford) {  // Welford: every lane has seen the same count
        Value *n = B.CreateAdd(B.CreateLoad(B.getInt64Ty(), s.n), B.getInt64(1));
        B.CreateStore(n, s.n);
        Value *rn = B.CreateFDiv(ConstantFP::get(scalar_ty(adt), 1.0), B.CreateSIToFP(n, scalar_ty(adt)));
        Value *m2 = B.CreateLoad(at, s.b);
        Value *delta = B.CreateFSub(xv, a);
        Value *mean = B.CreateFAdd(a, B.CreateFMul(delta, splat(rn)));
        B.CreateStore(mean, s.a);
        B.CreateStore(B.CreateFAdd(m2, B.CreateFMul(delta, B.CreateFSub(xv, mean))), s.b);
      } else if (index) {
        Value *vi = B.CreateLoad(ty(DType::I64, l), s.b);
        Value *xi = rflat;
        if (l > 1) {
          std::vector<Constant *> iota;
          for (int k = 0; k < l; ++k) iota.push_back(B.getInt64(k));
          xi = B.CreateAdd(B.CreateVectorSplat(l, rflat), ConstantVector::get(iota));
        }
        Value *bt = better(xv, xi, a, vi);
        B.CreateStore(B.CreateSelect(bt, xv, a), s.a);
        B.CreateStore(B.CreateSelect(bt, xi, vi), s.b);
      } else if (nan_mask) {  // maxps(x, a) = x > a ? x : a: a NaN accumulator stays
        Value *take = op == Op::amax ? B.CreateFCmpOGT(xv, a) : B.CreateFCmpOLT(xv, a);
        B.CreateStore(B.CreateSelect(take, xv, a), s.a);
        llvm::Type *mt = l == 1 ? (llvm::Type *)B.getInt1Ty() : FixedVectorType::get(B.getInt1Ty(), l);
        B.CreateStore(B.CreateOr(B.CreateLoad(mt, s.nan), fisnan(xv)), s.nan);
      } else {
        B.CreateStore(combine(a, xv), s.a);
      }
    }, copies, kahan ? &blocking : nullptr);
    outer_off = saved;
    rflat = nullptr;

    std::vector<State> parts;
    for (int c = 0; c < copies; ++c) parts.push_back(load_state(vs[c], lanes));
    while (parts.size() > 1) {  // pairwise
      std::vector<State> next;
      for (size_t k = 0; k + 1 < parts.size(); k += 2) next.push_back(merge2(parts[k], parts[k + 1]));
      if (parts.size() % 2) next.push_back(parts.back());
      parts = next;
    }
    State v = lanes > 1 ? tree(B, parts[0], merge2) : parts[0];
    all = merge2(v, load_state(ss, 1));
    if (gpu_block) all = block_merge(all, merge2, pack, unpack);
    if (shifted) {  // to Welford's (n, mean, M2)
      Value *n = size_f(extent, st);
      Value *m2 = B.CreateFSub(all[1], B.CreateFDiv(B.CreateFMul(all[0], all[0]), n));
      m2 = B.CreateSelect(B.CreateFCmpOLT(m2, ConstantFP::get(st, 0.0)), ConstantFP::get(st, 0.0), m2);
      all = {n, B.CreateFAdd(shift, B.CreateFDiv(all[0], n)), m2};
    }
  }
  if (split == Split::Partial) {
    for (int k = 0; k < ncomp; ++k) B.CreateStore(pack(all[k]), part_ptr(split_chunk, k));
    return;
  }
  EVal res;
  if (kahan) {
    Value *total = all[0];
    if (op == Op::mean) total = B.CreateFDiv(total, size_f(extent, st));
    res = {total, adt};
  } else if (welford) {
    int64_t corr = reduce_info(t, in).correction;
    Value *nc = B.CreateFSub(all[0], ConstantFP::get(st, (double)corr));
    Value *den = B.CreateSelect(B.CreateFCmpOGT(nc, ConstantFP::get(st, 0.0)), nc, ConstantFP::get(st, 0.0));
    Value *var = B.CreateFDiv(all[2], den);
    res = {op == Op::std ? B.CreateUnaryIntrinsic(Intrinsic::sqrt, var) : var, adt};
  } else if (index) {
    res = {all[1], DType::I64};
  } else {
    Value *v0 = all[0];
    if (op == Op::mean) v0 = B.CreateFDiv(v0, size_f(extent, st));
    res = {v0, adt};
  }
  reg[r] = cast(res, rdt);
  if (welford && also_mean >= 0)  // the mean of nothing is NaN (0 / 0), not Welford's initial 0
    reg[also_mean] = cast({extent == 0 ? (Value *)ConstantFP::get(st, NAN) : all[1], adt}, t.types[also_mean].dtype);
}

}  // namespace dynamo::jit::detail
