// lower_cpu.cpp -- the CPU target of the kernel emitter (kernel.h) and the trace function.
// Kernels: vectors of the host's width with a scalar tail, SLEEF u10 functions for the math
// not inlined, a kernel-local slot table, sizes read as data (so traces recorded at other sizes
// share machine code), per-call row-cache buffers, prefetches of the next row. The trace
// function runs the kernels (through the runtime's thread pool when large) and the extern
// calls in program order.
#include "lower_cpu.h"
#include "kernel.h"
#include "rt_abi.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/StructuralHash.h>
#include <llvm/Transforms/Utils/FunctionComparator.h>

namespace dynamo::jit {

using namespace llvm;

// A kernel's elements count this many times more per transcendental op each one evaluates, in the
// threshold for running it on threads (LowerOptions::parallel_min_elems) and in its grain.
constexpr int64_t kMathWeight = 4;

namespace detail {

namespace {

class CpuEmitter final : public KernelEmitter {
 public:
  CpuEmitter(Module &m, const Trace &t, const Plan &p, int gi, const LowerOptions &opt)
      : KernelEmitter(m, t, p, gi), opt(opt) {}

 private:
  const LowerOptions &opt;
  int vector_lanes(bool all64) const override { return std::max(1, opt.vector_bits / (all64 ? 64 : 32)); }
  bool own_slot_table() const override { return true; }
  bool sizes_as_data() const override { return opt.size_params; }
  Value *math(const char *fn, DType d, std::vector<Value *> args) override;
  // AVX-512's vscalefps: a single rounding, right for denormal results.
  Value *native_scale_pow2(Value *p, Value *n) override {
    if (L != 16 || opt.features.find("+avx512f") == std::string::npos) return nullptr;
    Value *all = B.getInt16(0xffff), *cur_direction = B.getInt32(4);
    return B.CreateIntrinsic(Intrinsic::x86_avx512_mask_scalef_ps_512, {}, {p, n, p, all, cur_direction});
  }
  bool has_row_scratch() const override { return true; }
  Value *row_scratch(Value *bytes) override {
    FunctionCallee mal = M.getOrInsertFunction("malloc", FunctionType::get(B.getPtrTy(), {B.getInt64Ty()}, false));
    return B.CreateCall(mal, {bytes});
  }
  void free_row_scratch(const std::vector<Value *> &bufs) override {
    FunctionCallee fr = M.getOrInsertFunction("free", FunctionType::get(B.getVoidTy(), {B.getPtrTy()}, false));
    for (Value *b : bufs) B.CreateCall(fr, {b});
  }
  bool prefetches_next_row() const override { return true; }
  bool reorders_short_inner() const override { return true; }
};

// SLEEF's u10 functions (1.0 ulp), as wide as SLEEF goes for this host.
Value *CpuEmitter::math(const char *fn, DType d, std::vector<Value *> args) {
  bool f32 = d != DType::F64;  // half types compute in float32
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

}  // namespace

void set_target_attrs(Function *f, const LowerOptions &opt) {
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
  const bool as_data = opt.size_params;
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
  FunctionCallee prof = opt.profile ? mod->getOrInsertFunction(
      "dynamo_rt_profile", FunctionType::get(B.getVoidTy(), {ptr, B.getInt32Ty()}, false)) : FunctionCallee();

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
    int64_t n0, inner;  // inner: elements per index of dim 0, weighted by the work per element
    int32_t ext;
    int32_t optional_slot;
    int32_t step;                // the plan step it runs (a split reduction: two calls, one step)
    std::vector<int32_t> table;  // kernels: the global slots of their local table
    std::vector<int64_t> offsets;  // and the bytes added to each slot's pointer
  };
  std::vector<Call> calls;
  std::unordered_map<uint64_t, std::vector<std::pair<Function *, Function *>>> emitted;  // hash -> (kernel, partial)
  int nk = 0;
  size_t table_size = 1;
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const Step &s = p.steps[si];
    const int32_t step = (int32_t)si;
    if (s.kind == Step::Extern) {
      calls.push_back({false, nullptr, 0, 0, s.index, -1, step, {}, {}});
      continue;
    }
    CpuEmitter ke(*mod, t, p, s.index, opt);
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
      calls.push_back({true, part, chunks, std::max<int64_t>(opt.parallel_min_elems, ke.numel() / chunks), -1, -1, step,
                       table, ke.slot_offsets()});
      calls.push_back({true, k, 1, 1, -1, -1, step, table, ke.slot_offsets()});
      continue;
    }
    // A transcendental costs several plain ops: a kernel of them takes threads at fewer elements
    // (erf's GELU over [128, 384]: 31 us on one thread).
    const int64_t weight = 1 + kMathWeight * ke.math_ops();
    calls.push_back({true, k, ke.outer_size(),
                     std::max<int64_t>(1, ke.numel() / std::max<int64_t>(1, ke.outer_size())) * weight, -1,
                     p.groups[s.index].optional_slot, step, table, ke.slot_offsets()});
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
  int32_t marked = -1;
  // Kept steps (Plan::step_kept): each run of them is skipped when slots[num_slots + 1] is
  // non-null (the runtime found their weights unchanged; their results are in kept slots).
  auto kept = [&](const Call &c) { return !p.step_kept.empty() && p.step_kept[(size_t)c.step]; };
  BasicBlock *after_kept = nullptr;
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    const Call &c = calls[ci];
    if (kept(c) && !after_kept) {
      Value *flag = B.CreateLoad(ptr_ty, B.CreateConstInBoundsGEP1_64(ptr_ty, slots, p.num_slots + 1), "kept");
      BasicBlock *run = BasicBlock::Create(ctx, "compute_kept", tf);
      after_kept = BasicBlock::Create(ctx, "after_kept", tf);
      B.CreateCondBr(B.CreateIsNull(flag), run, after_kept);
      B.SetInsertPoint(run);
    }
    if (opt.profile && c.step != marked) {
      B.CreateCall(prof, {rtctx, B.getInt32(c.step)});
      marked = c.step;
    }
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
    if (after_kept && (ci + 1 == calls.size() || !kept(calls[ci + 1]))) {
      B.CreateBr(after_kept);
      B.SetInsertPoint(after_kept);
      after_kept = nullptr;
    }
  }
  if (opt.profile) B.CreateCall(prof, {rtctx, B.getInt32(-1)});
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
