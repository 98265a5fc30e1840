// lower_ptx.cpp -- the PTX target of the kernel emitter (jit/kernel.h) and the NVPTX backend.
//
// Each fused group is emitted by the target-neutral KernelEmitter with this file's PtxEmitter
// (one lane per thread, libdevice instead of SLEEF, no scratch buffers, the global address
// space, the trace's slot table) as an internal function k(slots, begin, end) over the group's
// work items. A `.entry` wrapper runs it on one item per thread (or per block) in a grid-stride
// loop and reports a non-zero status (integer division by zero) through a global int.
// libdevice is linked in with only the functions used; the module is optimized at O2 for the
// chosen sm_XX and printed as PTX.
//
// Work split (docs/GPU.md has the measurements behind it): pointwise groups up to 8 elements
// per thread in contiguous tiles; row groups with a long innermost reduced dim one block per
// row (merge_row_threads: warp shuffles + shared memory; rows that split evenly stay in
// registers across passes), short rows one row per thread; split whole-tensor reductions a
// block per chunk, then one block merging the chunks' states.
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Triple.h>

#include <cstdlib>
#include <mutex>

#include "gpu/lower_ptx.h"
#include "jit/kernel.h"

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

namespace dynamo::gpu {

using namespace llvm;
using jit::DType;
using jit::ErrorCode;
using jit::fail;

namespace {

const char *kTriple = "nvptx64-nvidia-cuda";

std::string libdevice_path() {
  const char *env = getenv("DYNAMO_LIBDEVICE");
  if (env && *env) return env;
  const char *cuda = getenv("CUDA_HOME");
  return std::string(cuda && *cuda ? cuda : "/usr/local/cuda") + "/nvvm/libdevice/libdevice.10.bc";
}

struct PtxOptions {
  int row_block = 0;  // threads per block of a block-per-row kernel; 0 = by row length
  int unroll = 0;     // elements per thread in pointwise kernels; 0 = by size
};

class PtxEmitter final : public jit::detail::KernelEmitter {
 public:
  PtxEmitter(Module &m, const jit::Trace &t, const jit::Plan &p, int gi, const PtxOptions &opt)
      : KernelEmitter(m, t, p, gi), opt(opt) {}
  // The launch shape: threads per block when one block computes one row (0: one item per
  // thread), and how many items the .entry's grid-stride loop covers.
  int block_threads() const { return row_threads; }
  int partial_block_threads() const { return part_row_threads; }  // split reductions' partial kernel
  int64_t items() const { return items_; }

 private:
  const PtxOptions &opt;
  int64_t items_ = 0;
  Value *tid = nullptr;
  Function *tid_fn = nullptr;  // the function tid was read in

  int vector_lanes(bool) const override { return 1; }
  bool own_slot_table() const override { return false; }
  bool sizes_as_data() const override { return false; }
  // Tensors are in global memory; saying so gives ld/st.global instead of generic ones.
  Value *tensor_pointer(Value *p) override { return B.CreateAddrSpaceCast(p, PointerType::get(C, 1)); }
  // NVIDIA's libdevice (linked into the module), scalar.
  Value *math(const char *fn, DType d, std::vector<Value *> args) override {
    bool f32 = d != DType::F64;  // half types compute in float32
    llvm::Type *ety = f32 ? B.getFloatTy() : B.getDoubleTy();
    std::string name = std::string("__nv_") + fn + (f32 ? "f" : "");
    FunctionCallee callee = M.getOrInsertFunction(name, FunctionType::get(ety, std::vector<llvm::Type *>(args.size(), ety), false));
    return B.CreateCall(callee, args);
  }
  void emit_pointwise_items() override;
  // A block per row once the innermost reduced dim is long enough to share out; the
  // per-thread partial states are merged in registers (shuffles) and shared memory.
  void shape_rows() override {
    items_ = n_outer ? dims[0].size : 1;
    int64_t inner = dims.back().size;
    if (dims.size() > n_outer && inner >= 64) {
      row_threads = 64;  // 8 to 16 elements per thread, at most 256 threads (measured on an H200)
      while (row_threads < 256 && (int64_t)row_threads * 16 <= inner) row_threads *= 2;
      if (opt.row_block) row_threads = opt.row_block;
    }
  }
  int split_partial_threads() const override { return opt.row_block ? opt.row_block : 512; }  // a block per chunk
  int split_merge_threads(int64_t chunks) const override {  // one block
    for (int b : {256, 128, 64, 32})
      if (chunks % b == 0) return b;
    return 0;
  }
  Value *thread_in_row() override;
  State merge_row_threads(State s, const MergeFn &merge2, const PackFn &pack, const UnpackFn &unpack) override;
  int store_pass_copies() const override { return 4; }  // 4 stores in flight
};

// GPU pointwise: [begin, end) are flat indices of the collapsed domain (row-major); each is
// split into its dims' indices, so neighbouring threads touch neighbouring elements of every
// contiguous access whatever the domain's rank.
void PtxEmitter::emit_pointwise_items() {
  int64_t n = 1;
  for (const Dim &d : dims) n *= d.size;
  // `unroll` elements per thread, whose loads can all be in flight together. When n splits into
  // whole tiles of unroll x kGpuThreads elements, thread t of tile b takes b*tile + u*threads + t
  // (a block streams one contiguous tile); otherwise the copies are n / unroll apart.
  int unroll = opt.unroll ? opt.unroll : 8;  // best of 1/2/4/8 on an H200 (chain, bias+GELU)
  while (unroll > 1 && (n % unroll || n / unroll < 32768)) unroll /= 2;
  items_ = n / unroll;
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
                 : u   ? B.CreateAdd(j, B.getInt64(u * items_))
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

Value *PtxEmitter::thread_in_row() {
  if (tid_fn != F) {  // tid.x, read once in each function's entry block
    IRBuilder<> eb(&F->getEntryBlock(), F->getEntryBlock().begin());
    tid = eb.CreateZExt(eb.CreateIntrinsic(Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {}), eb.getInt64Ty());
    tid_fn = F;
  }
  return tid;
}

// A block per row: each thread's state (all lanes of every component) merged across the
// block. A butterfly of warp shuffles leaves the warp's merge in every lane; lane 0 of each
// warp parks it in shared memory; after a barrier every thread merges the warps' states in
// warp order (so all threads agree on the result bit for bit), and a second barrier frees the
// shared slots for the next reduction.
PtxEmitter::State PtxEmitter::merge_row_threads(State s, const MergeFn &merge2, const PackFn &pack, const UnpackFn &unpack) {
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
  Value *tid = thread_in_row();
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
  for (int w = 0; w < row_threads / 32; ++w) {
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

// The .entry wrapper: for (i = global id; i < n; i += grid size) status |= k(slots, i, i + 1),
// or with per_block, for (i = block id; i < n; i += grid blocks) (the whole block on item i).
// threads: the block size it is launched with, declared as .maxntid so that ptxas keeps the
// registers per thread within what a block of that size can have. after_exit: the kernel runs
// after a side exit's check, and does nothing when the status word is set (the run has left
// through the exit, or a kernel before it failed).
void emit_entry(Module &M, Function *k, const std::string &name, bool per_block, int threads, bool after_exit) {
  LLVMContext &C = M.getContext();
  IRBuilder<> B(C);
  auto *fty = FunctionType::get(B.getVoidTy(), {B.getPtrTy(), B.getInt64Ty(), B.getPtrTy()}, false);
  Function *e = Function::Create(fty, Function::ExternalLinkage, name, M);
  e->setCallingConv(CallingConv::PTX_Kernel);
  e->addFnAttr(Attribute::NoUnwind);
  M.getOrInsertNamedMetadata("nvvm.annotations")
      ->addOperand(MDNode::get(C, {ValueAsMetadata::get(e), MDString::get(C, "maxntidx"),
                                   ConstantAsMetadata::get(B.getInt32(threads))}));
  BasicBlock *entry = BasicBlock::Create(C, "entry", e), *head = BasicBlock::Create(C, "head", e);
  BasicBlock *body = BasicBlock::Create(C, "body", e), *bad = BasicBlock::Create(C, "bad", e);
  BasicBlock *next = BasicBlock::Create(C, "next", e), *done = BasicBlock::Create(C, "done", e);
  B.SetInsertPoint(entry);
  if (after_exit) {
    BasicBlock *go = BasicBlock::Create(C, "go", e);
    B.CreateCondBr(B.CreateICmpNE(B.CreateLoad(B.getInt32Ty(), e->getArg(2)), B.getInt32(0)), done, go);
    B.SetInsertPoint(go);
  }
  auto sreg = [&](Intrinsic::ID id) { return B.CreateZExt(B.CreateIntrinsic(id, {}, {}), B.getInt64Ty()); };
  Value *tid = sreg(Intrinsic::nvvm_read_ptx_sreg_tid_x), *ntid = sreg(Intrinsic::nvvm_read_ptx_sreg_ntid_x);
  Value *ctaid = sreg(Intrinsic::nvvm_read_ptx_sreg_ctaid_x), *nctaid = sreg(Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
  Value *start = per_block ? ctaid : B.CreateAdd(B.CreateMul(ctaid, ntid), tid);
  Value *stride = per_block ? nctaid : B.CreateMul(nctaid, ntid);
  BasicBlock *start_bb = B.GetInsertBlock();
  B.CreateBr(head);
  B.SetInsertPoint(head);
  PHINode *i = B.CreatePHI(B.getInt64Ty(), 2);
  i->addIncoming(start, start_bb);
  B.CreateCondBr(B.CreateICmpSLT(i, e->getArg(1)), body, done);
  B.SetInsertPoint(body);
  Value *st = B.CreateCall(k, {e->getArg(0), i, B.CreateAdd(i, B.getInt64(1))});
  B.CreateCondBr(B.CreateICmpNE(st, B.getInt32(0)), bad, next);
  B.SetInsertPoint(bad);
  B.CreateStore(st, e->getArg(2));
  B.CreateBr(next);
  B.SetInsertPoint(next);
  i->addIncoming(B.CreateAdd(i, stride), next);
  B.CreateBr(head);
  B.SetInsertPoint(done);
  B.CreateRetVoid();
}

// The side-exit check, launched by the host at each exit's step (gpu::Loaded) with one thread:
//   .entry <fn>_exit_check(u8 *cond, i32 expected, i32 code, i32 *status)
// when the guard's condition is not `expected` and nothing has set the status word yet, it
// writes `code` there (Program::kExitStatus + the exit); the kernels after it then do nothing
// (emit_entry's after_exit) and the host reads the word once, at the end of the run.
void emit_exit_check(Module &M, const std::string &name) {
  LLVMContext &C = M.getContext();
  IRBuilder<> B(C);
  auto *fty = FunctionType::get(B.getVoidTy(), {B.getPtrTy(), B.getInt32Ty(), B.getInt32Ty(), B.getPtrTy()}, false);
  Function *e = Function::Create(fty, Function::ExternalLinkage, name, M);
  e->setCallingConv(CallingConv::PTX_Kernel);
  e->addFnAttr(Attribute::NoUnwind);
  M.getOrInsertNamedMetadata("nvvm.annotations")
      ->addOperand(MDNode::get(C, {ValueAsMetadata::get(e), MDString::get(C, "maxntidx"),
                                   ConstantAsMetadata::get(B.getInt32(1))}));
  BasicBlock *entry = BasicBlock::Create(C, "entry", e), *take = BasicBlock::Create(C, "take", e);
  BasicBlock *done = BasicBlock::Create(C, "done", e);
  B.SetInsertPoint(entry);
  Value *c = B.CreateICmpNE(B.CreateLoad(B.getInt8Ty(), e->getArg(0)), B.getInt8(0));
  Value *fails = B.CreateICmpNE(B.CreateZExt(c, B.getInt32Ty()), e->getArg(1));
  Value *unset = B.CreateICmpEQ(B.CreateLoad(B.getInt32Ty(), e->getArg(3)), B.getInt32(0));
  B.CreateCondBr(B.CreateAnd(fails, unset), take, done);
  B.SetInsertPoint(take);
  B.CreateStore(e->getArg(2), e->getArg(3));
  B.CreateBr(done);
  B.SetInsertPoint(done);
  B.CreateRetVoid();
}

}  // namespace

std::string lower_ptx(const jit::Trace &t, const jit::Plan &p, const std::string &fn_name, const std::string &gpu_name,
                      std::vector<GpuKernel> *kernels) {
  static std::once_flag init;
  std::call_once(init, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
  // (extern steps are the caller's: gpu::compile_program runs matrix products through cuBLASLt)
  if (gpu_name.rfind("sm_", 0) != 0) fail(ErrorCode::Unsupported, "GPU name '" + gpu_name + "': expected sm_XX");

  std::string err;
  const Target *target = TargetRegistry::lookupTarget(kTriple, err);
  if (!target) fail(ErrorCode::Compile, "NVPTX target: " + err);
  {  // asked before a target machine is made for it, which would print LLVM's complaint to stderr
    std::unique_ptr<MCSubtargetInfo> sti(target->createMCSubtargetInfo(kTriple, "", ""));
    if (!sti || !sti->isCPUStringValid(gpu_name))
      fail(ErrorCode::Unsupported, "GPU name '" + gpu_name + "': not a processor the NVPTX target knows "
                                   "(sm_ and the compute capability, as sm_80 or sm_90a)");
  }
  std::unique_ptr<TargetMachine> tm(target->createTargetMachine(kTriple, gpu_name, "", TargetOptions(), std::nullopt));
  if (!tm) fail(ErrorCode::Compile, "NVPTX target machine for " + gpu_name);

  LLVMContext ctx;
  auto mod = std::make_unique<Module>(fn_name, ctx);
  mod->setTargetTriple(kTriple);
  mod->setDataLayout(tm->createDataLayout());
  PtxOptions opt;  // tuning knobs (gpu_check sweeps them)
  if (const char *e = getenv("DYNAMO_GPU_ROW_BLOCK"); e && *e) opt.row_block = atoi(e);
  if (const char *e = getenv("DYNAMO_GPU_UNROLL"); e && *e) opt.unroll = atoi(e);
  if (opt.row_block && (opt.row_block < 32 || opt.row_block > 1024 || opt.row_block % 32))
    fail(ErrorCode::Unsupported, "DYNAMO_GPU_ROW_BLOCK must be a multiple of 32 in [32, 1024]");
  if (opt.unroll < 0 || opt.unroll > 16) fail(ErrorCode::Unsupported, "DYNAMO_GPU_UNROLL must be in [0, 16]");
  bool after_exit = false;  // a side exit's check runs before the kernels that follow it
  for (const jit::Step &s : p.steps) {
    if (s.kind == jit::Step::Extern) {
      after_exit = after_exit || p.externs[(size_t)s.index].is_exit;
      continue;
    }
    PtxEmitter ke(*mod, t, p, s.index, opt);
    std::string kname = fn_name + "_k" + std::to_string(s.index);
    Function *k = ke.emit(kname + "_body");
    if (!k) continue;
    k->addFnAttr(Attribute::NoUnwind);
    if (Function *part = ke.partial()) {  // a split reduction: partial states, then the merge
      part->addFnAttr(Attribute::NoUnwind);
      int pb = ke.partial_block_threads(), mb = ke.block_threads();
      emit_entry(*mod, part, kname + "_part", pb > 0, pb > 0 ? pb : kGpuThreads, after_exit);
      emit_entry(*mod, k, kname, mb > 0, mb > 0 ? mb : kGpuThreads, after_exit);
      if (kernels) {
        kernels->push_back({kname + "_part", p.groups[s.index].split_chunks, ke.partial_block_threads(), -1,
                            ke.can_fail(), s.index});
        kernels->push_back({kname, 1, ke.block_threads(), -1, ke.can_fail(), s.index});
      }
      continue;
    }
    emit_entry(*mod, k, kname, ke.block_threads() > 0, ke.block_threads() > 0 ? ke.block_threads() : kGpuThreads,
               after_exit);
    if (kernels)
      kernels->push_back({kname, ke.items(), ke.block_threads(), p.groups[s.index].optional_slot, ke.can_fail(), s.index});
  }
  if (after_exit) {
    emit_exit_check(*mod, fn_name + "_exit_check");
    if (kernels) kernels->push_back({fn_name + "_exit_check", 1, 0, -1, false, -1, true});
  }

  bool needs_libdevice = false;
  for (Function &f : *mod) needs_libdevice |= f.isDeclaration() && f.getName().starts_with("__nv_");
  if (needs_libdevice) {
    auto buf = MemoryBuffer::getFile(libdevice_path());
    if (!buf) fail(ErrorCode::Compile, "cannot read libdevice at " + libdevice_path() + " (set DYNAMO_LIBDEVICE)");
    auto lib = parseBitcodeFile((*buf)->getMemBufferRef(), ctx);
    if (!lib) fail(ErrorCode::Compile, "libdevice: " + toString(lib.takeError()));
    (*lib)->setTargetTriple(kTriple);
    (*lib)->setDataLayout(mod->getDataLayout());
    if (Linker::linkModules(*mod, std::move(*lib), Linker::LinkOnlyNeeded))
      fail(ErrorCode::Compile, "linking libdevice failed");
  }
  for (Function &f : *mod)  // only the entries are visible: the rest may be inlined and dropped
    if (!f.isDeclaration() && f.getCallingConv() != CallingConv::PTX_Kernel) f.setLinkage(GlobalValue::InternalLinkage);
  std::string verr;
  raw_string_ostream vos(verr);
  if (verifyModule(*mod, &vos)) fail(ErrorCode::Internal, "generated NVPTX IR is invalid: " + vos.str());

  LoopAnalysisManager lam;
  FunctionAnalysisManager fam;
  CGSCCAnalysisManager cgam;
  ModuleAnalysisManager mam;
  PassBuilder pb(tm.get());
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(OptimizationLevel::O2).run(*mod, mam);

  SmallString<0> ptx;
  raw_svector_ostream os(ptx);
  legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, CodeGenFileType::AssemblyFile))
    fail(ErrorCode::Compile, "the NVPTX backend cannot emit assembly");
  pm.run(*mod);
  return std::string(ptx.str());
}

}  // namespace dynamo::gpu
