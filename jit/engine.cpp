// engine.cpp -- LLJIT set-up (host CPU, SLEEF and runtime symbols by name), the O2/O3 pass
// pipeline, and per-entry resource trackers.
#include "engine.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/Cloning.h>
#include <llvm/Target/TargetMachine.h>

namespace dynamo::jit {

using namespace llvm;
using namespace llvm::orc;

namespace {

std::string take(llvm::Error e) {
  std::string s;
  handleAllErrors(std::move(e), [&](const ErrorInfoBase &info) { s += info.message(); });
  return s;
}

[[noreturn]] void compile_fail(const std::string &what, llvm::Error e) {
  dynamo::jit::fail(ErrorCode::Compile, what + ": " + take(std::move(e)));
}

// DYNAMO_DUMP_DIR=dir: each compiled module is written there as <fn>.ll (as lowered),
// <fn>.opt.ll (after the pass pipeline) and <fn>.s (host assembly), named by trace function.
const char *dump_dir() {
  const char *d = getenv("DYNAMO_DUMP_DIR");
  return d && *d ? d : nullptr;
}

void dump_text(const std::string &path, const std::function<void(raw_ostream &)> &write) {
  std::error_code ec;
  raw_fd_ostream os(path, ec, sys::fs::OF_Text);
  if (ec) {
    errs() << "dynamo: cannot write " << path << ": " << ec.message() << "\n";
    return;
  }
  write(os);
}

// DYNAMO_PERF_MAP=1: every function of compiled code (trace functions and their kernels) is
// appended to /tmp/perf-<pid>.map as "start size name", so that `perf report` names JIT code.
class PerfMapPlugin : public ObjectLinkingLayer::Plugin {
 public:
  void modifyPassConfig(MaterializationResponsibility &, jitlink::LinkGraph &, jitlink::PassConfiguration &config) override {
    config.PostFixupPasses.push_back([](jitlink::LinkGraph &g) -> llvm::Error {
      static std::mutex mu;
      std::lock_guard<std::mutex> lock(mu);
      std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
      FILE *f = fopen(path.c_str(), "a");
      if (!f) return llvm::Error::success();  // a profiling aid: never a reason to fail a compile
      for (jitlink::Symbol *sym : g.defined_symbols()) {
        if (sym->hasName() && sym->isCallable() && sym->getSize())
          fprintf(f, "%llx %llx %s\n", (unsigned long long)sym->getAddress().getValue(),
                  (unsigned long long)sym->getSize(), sym->getName().str().c_str());
      }
      fclose(f);
      return llvm::Error::success();
    });
  }
  llvm::Error notifyFailed(MaterializationResponsibility &) override { return llvm::Error::success(); }
  llvm::Error notifyRemovingResources(JITDylib &, ResourceKey) override { return llvm::Error::success(); }
  void notifyTransferringResources(JITDylib &, ResourceKey, ResourceKey) override {}
};

bool perf_map_enabled() {
  const char *e = getenv("DYNAMO_PERF_MAP");
  return e && *e && *e != '0';
}

// The fusion partition, one line per step, for DYNAMO_DUMP_DIR.
std::string describe_plan(const Trace &t, const Plan &p) {
  auto shape = [](const std::vector<int64_t> &v) {
    std::string s = "[";
    for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
    return s + "]";
  };
  std::string out = "# " + std::to_string(p.steps.size()) + " step(s), " + std::to_string(p.num_slots) + " slot(s)\n";
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step &s = p.steps[i];
    out += "step " + std::to_string(i) + ": ";
    if (s.kind == Step::Extern) {
      out += "extern " + p.externs[s.index].callee + "\n";
      continue;
    }
    const Group &g = p.groups[s.index];
    out += std::string(g.row ? "row kernel" : "kernel") + " k" + std::to_string(s.index) + " over " + shape(g.domain);
    if (g.row) out += " reducing dims " + shape(g.rdims);
    if (g.split_chunks) out += " (split into " + std::to_string(g.split_chunks) + " chunks)";
    out += ": stores";
    for (const Root &r : g.roots) out += " %" + std::to_string(r.value) + "->slot" + std::to_string(r.slot);
    for (const Root &r : g.row_roots) out += " %" + std::to_string(r.value) + "->slot" + std::to_string(r.slot) + "(per row)";
    if (!g.reductions.empty()) {
      out += "; reduces";
      for (int32_t r : g.reductions) out += " %" + std::to_string(r) + "=" + op_info(t.insts[t.def[r]].op).name;
    }
    out += "\n";
  }
  return out;
}

}  // namespace

struct Engine::Impl {
  std::unique_ptr<LLJIT> jit;
  std::unique_ptr<TargetMachine> tm;
  OptimizationLevel level = OptimizationLevel::O2;
  std::mutex mu;  // serializes the optimizer's use of tm
};

Engine::Engine(const EngineOptions &opt, const std::map<std::string, void *> &host_symbols)
    : impl_(std::make_unique<Impl>()) {
  static std::once_flag init;
  std::call_once(init, [] {
    InitializeNativeTarget();
    InitializeNativeTargetAsmPrinter();
  });
  auto jtmb = JITTargetMachineBuilder::detectHost();
  if (!jtmb) compile_fail("detecting the host CPU", jtmb.takeError());
  int lvl = opt.opt_level < 0 ? 0 : opt.opt_level > 3 ? 3 : opt.opt_level;
  jtmb->setCodeGenOptLevel(lvl == 0 ? CodeGenOptLevel::None
                           : lvl == 3 ? CodeGenOptLevel::Aggressive
                                      : CodeGenOptLevel::Default);
  impl_->level = lvl == 0 ? OptimizationLevel::O0 : lvl == 1 ? OptimizationLevel::O1
                 : lvl == 3 ? OptimizationLevel::O3 : OptimizationLevel::O2;
  std::string features = jtmb->getFeatures().getString();
  lower_opt_.cpu = jtmb->getCPU();
  lower_opt_.features = features;
  int host_bits = features.find("+avx512f") != std::string::npos ? 512
                  : features.find("+avx2") != std::string::npos ? 256 : 128;
  lower_opt_.vector_bits = opt.vector_bits > 0 ? std::min(opt.vector_bits, host_bits) : host_bits;

  auto tm = jtmb->createTargetMachine();
  if (!tm) compile_fail("creating the target machine", tm.takeError());
  impl_->tm = std::move(*tm);

  auto jit = LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
  if (!jit) compile_fail("creating the LLJIT", jit.takeError());
  impl_->jit = std::move(*jit);
  if (perf_map_enabled())
    if (auto *oll = dynamic_cast<ObjectLinkingLayer *>(&impl_->jit->getObjLinkingLayer()))
      oll->addPlugin(std::make_unique<PerfMapPlugin>());
  JITDylib &jd = impl_->jit->getMainJITDylib();
  const DataLayout &dl = impl_->jit->getDataLayout();

  // Runtime helpers: registered by name (a library loaded RTLD_LOCAL, as by ctypes, is
  // invisible to a process-wide lookup).
  SymbolMap syms;
  for (const auto &[name, addr] : host_symbols)
    syms[impl_->jit->mangleAndIntern(name)] = {ExecutorAddr::fromPtr(addr), JITSymbolFlags::Exported};
  if (auto err = jd.define(absoluteSymbols(std::move(syms)))) compile_fail("defining runtime symbols", std::move(err));

  // SLEEF vector math, by name, from the shared library we link.
  auto sleef = DynamicLibrarySearchGenerator::Load(
      "libsleef.so.3", dl.getGlobalPrefix(),
      [](const SymbolStringPtr &s) { return (*s).starts_with("Sleef_"); });
  if (!sleef) compile_fail("loading libsleef.so.3", sleef.takeError());
  jd.addGenerator(std::move(*sleef));
  // libc/libm for what the backend may call (memcpy, fmod ...).
  auto proc = DynamicLibrarySearchGenerator::GetForCurrentProcess(dl.getGlobalPrefix());
  if (!proc) compile_fail("process symbols", proc.takeError());
  jd.addGenerator(std::move(*proc));
}

Engine::~Engine() = default;

CompiledCode Engine::compile(const Trace &t, const Plan &p, const std::string &fn_name, int *num_kernels) {
  auto ctx = std::make_unique<LLVMContext>();
  std::unique_ptr<Module> mod = lower_trace(t, p, *ctx, fn_name, lower_opt_, num_kernels);
  mod->setDataLayout(impl_->jit->getDataLayout());
  mod->setTargetTriple(impl_->jit->getTargetTriple().str());
  std::string verr;
  raw_string_ostream vos(verr);
  if (verifyModule(*mod, &vos)) dynamo::jit::fail(ErrorCode::Internal, "generated LLVM IR is invalid: " + vos.str());
  const char *dump = dump_dir();
  std::string stem = dump ? std::string(dump) + "/" + fn_name : "";
  if (dump) {
    sys::fs::create_directories(dump);
    dump_text(stem + ".trace", [&](raw_ostream &os) { os << print_trace(t); });
    dump_text(stem + ".plan", [&](raw_ostream &os) { os << describe_plan(t, p); });
    dump_text(stem + ".ll", [&](raw_ostream &os) { mod->print(os, nullptr); });
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    LoopAnalysisManager lam;
    FunctionAnalysisManager fam;
    CGSCCAnalysisManager cgam;
    ModuleAnalysisManager mam;
    PassBuilder pb(impl_->tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    ModulePassManager mpm = impl_->level == OptimizationLevel::O0
                                ? pb.buildO0DefaultPipeline(OptimizationLevel::O0)
                                : pb.buildPerModuleDefaultPipeline(impl_->level);
    mpm.run(*mod, mam);
    if (dump) {
      dump_text(stem + ".opt.ll", [&](raw_ostream &os) { mod->print(os, nullptr); });
      std::unique_ptr<Module> copy = CloneModule(*mod);
      dump_text(stem + ".s", [&](raw_ostream &os) {
        raw_pwrite_stream *ps = static_cast<raw_pwrite_stream *>(&os);
        legacy::PassManager pm;
        if (impl_->tm->addPassesToEmitFile(pm, *ps, nullptr, CodeGenFileType::AssemblyFile))
          os << "; this target cannot emit assembly\n";
        else
          pm.run(*copy);
      });
    }
  }
  JITDylib &jd = impl_->jit->getMainJITDylib();
  ResourceTrackerSP rt = jd.createResourceTracker();
  if (auto err = impl_->jit->addIRModule(rt, ThreadSafeModule(std::move(mod), std::move(ctx))))
    compile_fail("adding the module", std::move(err));
  auto sym = impl_->jit->lookup(fn_name);
  if (!sym) {
    std::string msg = take(sym.takeError());
    if (auto e2 = rt->remove()) take(std::move(e2));
    dynamo::jit::fail(ErrorCode::Compile, "compiling " + fn_name + ": " + msg);
  }
  CompiledCode cc;
  cc.fn = sym->toPtr<void *>();
  // The tracker is released (and the code freed) when the last owner lets go.
  auto *holder = new ResourceTrackerSP(rt);
  cc.tracker = std::shared_ptr<void>(holder, [](void *h) {
    auto *r = static_cast<ResourceTrackerSP *>(h);
    if (auto e = (*r)->remove()) take(std::move(e));
    delete r;
  });
  return cc;
}

}  // namespace dynamo::jit
