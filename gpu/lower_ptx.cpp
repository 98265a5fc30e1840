// lower_ptx.cpp -- a planned trace to PTX through LLVM's NVPTX backend.
//
// Each fused group is emitted by the same KernelEmitter as on the CPU, in its GPU form
// (LowerOptions::gpu: one lane, libdevice instead of SLEEF, no heap row caches, global address
// space), as an internal function k(slots, begin, end) over the group's work items. A `.entry`
// wrapper runs it on one item per thread (or per block) in a grid-stride loop and reports a
// non-zero status (integer division by zero) through a global int. libdevice is linked in with
// only the functions used; the module is optimized at O2 for the chosen sm_XX and printed as PTX.
//
// Work split (docs/GPU.md has the measurements behind it): pointwise groups up to 8 elements
// per thread in contiguous tiles; row groups with a long innermost reduced dim one block per
// row (KernelEmitter::block_merge: warp shuffles + shared memory; rows that split evenly stay
// in registers across passes), short rows one row per thread; split whole-tensor reductions a
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

#include "jit/kernel.h"

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

namespace dynamo::jit {

namespace detail {
void set_target_attrs(llvm::Function *f, const LowerOptions &opt);
}

using namespace llvm;

namespace {

const char *kTriple = "nvptx64-nvidia-cuda";

std::string libdevice_path() {
  const char *env = getenv("DYNAMO_LIBDEVICE");
  if (env && *env) return env;
  const char *cuda = getenv("CUDA_HOME");
  return std::string(cuda && *cuda ? cuda : "/usr/local/cuda") + "/nvvm/libdevice/libdevice.10.bc";
}

// The .entry wrapper: for (i = global id; i < n; i += grid size) status |= k(slots, i, i + 1),
// or with per_block, for (i = block id; i < n; i += grid blocks) (the whole block on item i).
// threads: the block size it is launched with, declared as .maxntid so that ptxas keeps the
// registers per thread within what a block of that size can have.
void emit_entry(Module &M, Function *k, const std::string &name, bool per_block, int threads) {
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
  auto sreg = [&](Intrinsic::ID id) { return B.CreateZExt(B.CreateIntrinsic(id, {}, {}), B.getInt64Ty()); };
  Value *tid = sreg(Intrinsic::nvvm_read_ptx_sreg_tid_x), *ntid = sreg(Intrinsic::nvvm_read_ptx_sreg_ntid_x);
  Value *ctaid = sreg(Intrinsic::nvvm_read_ptx_sreg_ctaid_x), *nctaid = sreg(Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
  Value *start = per_block ? ctaid : B.CreateAdd(B.CreateMul(ctaid, ntid), tid);
  Value *stride = per_block ? nctaid : B.CreateMul(nctaid, ntid);
  B.CreateBr(head);
  B.SetInsertPoint(head);
  PHINode *i = B.CreatePHI(B.getInt64Ty(), 2);
  i->addIncoming(start, entry);
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

}  // namespace

std::string lower_ptx(const Trace &t, const Plan &p, const std::string &fn_name, const std::string &gpu_name,
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
  LowerOptions opt;
  opt.gpu = true;
  opt.vector_bits = 32;  // one lane of float32 (and of float64)
  opt.parallel = false;
  // Tuning knobs (gpu_check sweeps them): DYNAMO_GPU_ROW_BLOCK, DYNAMO_GPU_UNROLL.
  if (const char *e = getenv("DYNAMO_GPU_ROW_BLOCK"); e && *e) opt.gpu_row_block = atoi(e);
  if (const char *e = getenv("DYNAMO_GPU_UNROLL"); e && *e) opt.gpu_unroll = atoi(e);
  if (opt.gpu_row_block && (opt.gpu_row_block < 32 || opt.gpu_row_block > 1024 || opt.gpu_row_block % 32))
    fail(ErrorCode::Unsupported, "DYNAMO_GPU_ROW_BLOCK must be a multiple of 32 in [32, 1024]");
  if (opt.gpu_unroll < 0 || opt.gpu_unroll > 16) fail(ErrorCode::Unsupported, "DYNAMO_GPU_UNROLL must be in [0, 16]");
  for (const Step &s : p.steps) {
    if (s.kind == Step::Extern) continue;
    detail::KernelEmitter ke(*mod, t, p, s.index, opt);
    std::string kname = fn_name + "_k" + std::to_string(s.index);
    Function *k = ke.emit(kname + "_body");
    if (!k) continue;
    detail::set_target_attrs(k, opt);
    if (Function *part = ke.partial()) {  // a split reduction: partial states, then the merge
      detail::set_target_attrs(part, opt);
      int pb = ke.gpu_partial_block_threads(), mb = ke.gpu_block_threads();
      emit_entry(*mod, part, kname + "_part", pb > 0, pb > 0 ? pb : kGpuThreads);
      emit_entry(*mod, k, kname, mb > 0, mb > 0 ? mb : kGpuThreads);
      if (kernels) {
        kernels->push_back({kname + "_part", p.groups[s.index].split_chunks, ke.gpu_partial_block_threads(), -1,
                            ke.can_fail(), s.index});
        kernels->push_back({kname, 1, ke.gpu_block_threads(), -1, ke.can_fail(), s.index});
      }
      continue;
    }
    emit_entry(*mod, k, kname, ke.gpu_block_threads() > 0,
               ke.gpu_block_threads() > 0 ? ke.gpu_block_threads() : kGpuThreads);
    if (kernels)
      kernels->push_back({kname, ke.gpu_items(), ke.gpu_block_threads(), p.groups[s.index].optional_slot, ke.can_fail(),
                          s.index});
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

}  // namespace dynamo::jit
