// engine.cpp -- LLJIT set-up (host CPU, SLEEF and runtime symbols by name), the O2/O3 pass
// pipeline, and per-entry resource trackers.
#include "engine.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Support/xxhash.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Transforms/Utils/Cloning.h>
#include <llvm/Transforms/Utils/SplitModule.h>
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

// Conversions to bfloat16 that LLVM's x86 backend calls as compiler-rt builtins on CPUs without
// AVX512-BF16 (a bfloat16 value legalized through float32 in a gather or a select, say), which
// the process need not have (GCC 12's libgcc has none). Rounded to nearest even, NaN quiet, as
// c10::BFloat16. The result is returned as on x86-64 for __bf16: in the low 16 bits of xmm0,
// which a float return fills.
uint16_t bf16_from_float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float bf16_in_xmm(uint16_t h) {
  uint32_t b = h;
  float r;
  std::memcpy(&r, &b, 4);
  return r;
}

extern "C" float dynamo_truncsfbf2(float f) { return bf16_in_xmm(bf16_from_float_bits(f)); }

// From double directly (not through a rounded float: that would round twice): the float nearest
// toward zero with its last bit set when inexact (round to odd), then rounded to bfloat16.
extern "C" float dynamo_truncdfbf2(double d) {
  if (d != d) return bf16_in_xmm(0x7fc0);
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  if ((double)f != d) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    b |= 1u;
    std::memcpy(&f, &b, 4);
  }
  return bf16_in_xmm(bf16_from_float_bits(f));
}

// DYNAMO_DUMP_DIR=dir: each compiled module is written there as <fn>.trace (the trace),
// <fn>.plan (its steps), <fn>.ll (as lowered), <fn>.opt.ll (after the pass pipeline) and <fn>.s
// (host assembly), <fn> being the trace function's symbol (dynamo_trace_<frame>_<n>, capi.cpp). While it is set nothing is loaded from the disk
// cache, so every trace is compiled (and dumped).
const char *dump_dir() {
  const char *d = getenv("DYNAMO_DUMP_DIR");
  return d && *d ? d : nullptr;
}

void dump_text(const std::string &path, const std::function<void(raw_fd_ostream &)> &write) {
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
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC misreads llvm::unique_function's storage
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
#pragma GCC diagnostic pop
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

// -- on-disk cache of compiled objects ----------------------------------------------------------
// Where: $DYNAMO_CACHE_DIR, else $XDG_CACHE_HOME/dynamo, else $HOME/.cache/dynamo;
// DYNAMO_CACHE_DIR=off (or 0, or empty) turns it off. A cached object is code this process
// runs, so the directory must be private: created 0700, and used only while it is owned by
// this user and not writable by group or others (as ccache and Python's bytecode cache check
// theirs); each file read must be owned by this user and not writable by others either.
// Otherwise a warning says why and traces are compiled as if there were no cache.

// Why a file or directory (already stat'ed) cannot be trusted, or "".
std::string untrusted(const struct stat &st, const std::string &what) {
  if (st.st_uid != geteuid())
    return what + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (" + std::to_string(geteuid()) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", (unsigned)(st.st_mode & 07777));
    return what + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (mode " + mode + ")";
  }
  return "";
}

// The cache directory to use ("" = none) and, when it is refused, why (for one warning).
std::string cache_directory(std::string *why) {
  const char *env = getenv("DYNAMO_CACHE_DIR");
  std::string dir;
  bool chosen = env != nullptr;
  if (env) {
    if (!*env || !strcmp(env, "off") || !strcmp(env, "0")) return "";
    dir = env;
  } else if (const char *xdg = getenv("XDG_CACHE_HOME"); xdg && *xdg == '/') {
    dir = std::string(xdg) + "/dynamo";
  } else if (const char *home = getenv("HOME"); home && *home == '/') {
    dir = std::string(home) + "/.cache/dynamo";
  } else {
    return "";
  }
  // Missing parents are made private too; a name without a slash has none to make.
  size_t slash = dir.find_last_of('/');
  std::string parent = slash == std::string::npos ? "" : dir.substr(0, slash);
  if (!parent.empty()) sys::fs::create_directories(parent, true, sys::fs::perms::owner_all);
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    if (chosen) *why = "cannot create " + dir + ": " + strerror(errno);
    return "";
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = dir + " is not a directory";
    return "";
  }
  std::string bad = untrusted(st, dir);
  if (!bad.empty()) {
    *why = bad + "; compiled code found there could be another user's (make it private: chmod 700, or set "
                 "DYNAMO_CACHE_DIR)";
    return "";
  }
  return dir;
}

// Reads a cache file if it can be trusted (see above); false with *why otherwise.
bool read_trusted(const std::string &path, std::string *out, std::string *why) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ENOENT ? "" : path + ": " + strerror(errno);
    return false;
  }
  struct stat st {};
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  *why = ok ? untrusted(st, path) : path + " is not a regular file";
  ok = ok && why->empty();
  out->clear();
  char buf[65536];
  ssize_t n;
  while (ok && (n = read(fd, buf, sizeof buf)) > 0) out->append(buf, (size_t)n);
  close(fd);
  return ok;
}

// Key: the canonical trace text, the engine's code-generation settings and host CPU, and the
// identity of this library file (path, size, mtime: a rebuilt library never reuses objects).
// Files: <hash>.key (first line "<symbol> <kernels> <IR fingerprint or -> <object hash> <n> <size
// table: n numbers>", then the full key, compared on load; the object hash names the .o holding
// the code, another key's for a trace that shares its machine code) and
// <hash>.o (the trace's objects, one per part compiled in parallel: a line "dynamo-objects
// <n> <size>...", then their bytes), each written to a temporary name and renamed (concurrent
// writers are safe). A file that does not read back, match or link is ignored with one warning
// line, and recompiled.
struct DiskCache {
  std::string dir;
  uint64_t max_bytes = 512ull << 20;
  std::mutex mu;

  static std::string library_identity() {
    Dl_info info{};
    struct stat st {};
    if (!dladdr(reinterpret_cast<void *>(&library_identity), &info) || !info.dli_fname || stat(info.dli_fname, &st))
      return "unknown-library";
    return std::string(info.dli_fname) + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtime);
  }

  static std::string hex_hash(const std::string &s) {
    uint64_t h1 = 1469598103934665603ull, h2 = 0x9e3779b97f4a7c15ull;
    for (unsigned char c : s) {
      h1 = (h1 ^ c) * 1099511628211ull;
      h2 = (h2 + c) * 0xff51afd7ed558ccdull ^ (h2 >> 29);
    }
    char buf[40];
    snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
    return buf;
  }

  static bool write_atomic(const std::string &path, const char *data, size_t n) {
    static std::atomic<uint64_t> seq{0};
    std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq++);
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    FILE *f = fd < 0 ? nullptr : fdopen(fd, "wb");
    if (!f) {
      if (fd >= 0) close(fd);
      return false;
    }
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
      unlink(tmp.c_str());
      return false;
    }
    return true;
  }

  void store(const std::string &id, const std::string &key, const std::vector<std::string> &objects) {
    std::string blob = "dynamo-objects " + std::to_string(objects.size());
    for (const std::string &o : objects) blob += " " + std::to_string(o.size());
    blob += "\n";
    for (const std::string &o : objects) blob += o;
    // The objects first: a reader that finds the key also finds them complete.
    if (write_atomic(dir + "/" + id + ".o", blob.data(), blob.size())) write_atomic(dir + "/" + id + ".key", key.data(), key.size());
    trim();
  }

  // A key alone, for a trace whose machine code is another key's object (shared code).
  void store_key(const std::string &id, const std::string &key) {
    write_atomic(dir + "/" + id + ".key", key.data(), key.size());
  }

  // The objects of a stored blob; false when it is not one.
  static bool split(const std::string &blob, std::vector<std::string> *objects) {
    size_t nl = blob.find('\n');
    if (nl == std::string::npos || blob.compare(0, 15, "dynamo-objects ") != 0) return false;
    std::istringstream head(blob.substr(15, nl - 15));
    size_t n = 0, at = nl + 1;
    if (!(head >> n) || n == 0 || n > 1024) return false;
    for (size_t i = 0; i < n; ++i) {
      size_t len = 0;
      if (!(head >> len) || len > blob.size() - at) return false;
      objects->push_back(blob.substr(at, len));
      at += len;
    }
    return at == blob.size();
  }

  // Keeps the directory under max_bytes by removing the least recently written entries.
  void trim() {
    std::vector<std::pair<time_t, std::string>> files;
    uint64_t total = 0;
    std::error_code ec;
    for (sys::fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
      struct stat st {};
      if (stat(it->path().c_str(), &st) == 0) {
        total += (uint64_t)st.st_size;
        files.push_back({st.st_mtime, it->path()});
      }
    }
    if (total <= max_bytes) return;
    std::sort(files.begin(), files.end());
    for (auto &[t, path] : files) {
      if (total <= max_bytes * 8 / 10) break;
      struct stat st {};
      if (stat(path.c_str(), &st) == 0 && unlink(path.c_str()) == 0) total -= (uint64_t)st.st_size;
    }
  }
};

// The first line of a .key file: "<symbol> <kernels> <fingerprint> <object id> <n> <n sizes>".
std::string cache_head(const std::string &symbol, int nk, const std::string &fp, const std::string &object_id,
                       const std::vector<int64_t> &sizes) {
  std::string h = symbol + " " + std::to_string(nk) + " " + fp + " " + object_id + " " + std::to_string(sizes.size());
  for (int64_t v : sizes) h += " " + std::to_string(v);
  return h;
}

// What ORC reports out of band while linking (e.g. "Symbols not found: [...]"), so that a failed
// lookup can say why. Linking runs on the compiling thread.
thread_local std::string t_orc_error;

void warn_cache(const std::string &msg) {
  static std::atomic<int> warned{0};
  if (warned++ < 3) errs() << "dynamo: ignoring a cache entry: " << msg << "\n";
}

}  // namespace

std::string disk_cache_directory(std::string *why) { return cache_directory(why); }

struct Engine::Impl {
  std::unique_ptr<LLJIT> jit;
  std::unique_ptr<TargetMachine> tm;
  std::unique_ptr<JITTargetMachineBuilder> jtmb;  // a target machine per compiling thread
  OptimizationLevel level = OptimizationLevel::O2;
  std::mutex mu;  // serializes the optimizer's use of tm (dumps)
  std::shared_ptr<DiskCache> cache;  // null: no cache (off, or the directory was refused)
  std::string cache_salt;            // settings and library identity, part of every key
  std::atomic<uint64_t> next_dylib{0};
  // Machine code by the fingerprint of the IR it was compiled from (sizes as data), for traces
  // of the same code at other sizes; held weakly: the code lives as long as its entries.
  struct Shared {
    std::weak_ptr<void> tracker;
    void *fn = nullptr;
    int num_kernels = 0;
    std::string symbol, object_id;  // where the code is in the disk cache ("" when it is not)
  };
  std::mutex share_mu;
  std::unordered_map<std::string, Shared> shared;
  // The live machine code of fingerprint fp with this trace's size table, or null (share_mu
  // held; a record whose code is gone is dropped).
  const Shared *take_shared(const std::string &fp, std::vector<int64_t> &sizes, CompiledCode *cc) {
    auto it = shared.find(fp);
    if (it == shared.end()) return nullptr;
    std::shared_ptr<void> live = it->second.tracker.lock();
    if (!live) {
      shared.erase(it);
      return nullptr;
    }
    cc->fn = it->second.fn;
    cc->tracker = std::move(live);
    cc->sizes = std::move(sizes);
    cc->shared = true;
    return &it->second;
  }
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
  if (const char *sc = getenv("DYNAMO_SHARE_CODE")) lower_opt_.size_params = strcmp(sc, "0") != 0;
  lower_opt_.profile = profile_enabled();

  auto tm = jtmb->createTargetMachine();
  if (!tm) compile_fail("creating the target machine", tm.takeError());
  impl_->tm = std::move(*tm);
  impl_->jtmb = std::make_unique<JITTargetMachineBuilder>(*jtmb);

  std::string refused;
  std::string cdir = cache_directory(&refused);
  if (!refused.empty()) {
    static std::atomic<int> warned{0};
    if (warned++ == 0) errs() << "dynamo: not using the compile cache: " << refused << "\n";
  }
  if (!cdir.empty()) {
    impl_->cache = std::make_shared<DiskCache>();
    impl_->cache->dir = cdir;
    if (const char *mb = getenv("DYNAMO_CACHE_MAX_MB")) impl_->cache->max_bytes = std::max(1ull, strtoull(mb, nullptr, 10)) << 20;
    impl_->cache_salt = "dynamo-cache-v2\n" + DiskCache::library_identity() + "\nllvm " LLVM_VERSION_STRING "\n" +
                        lower_opt_.cpu + " " + features + "\nO" + std::to_string(lvl) + " " +
                        std::to_string(lower_opt_.vector_bits) + (lower_opt_.size_params ? " sizes-as-data" : "") +
                        (lower_opt_.profile ? " profiled" : "") + "\n";
  }
  LLJITBuilder builder;
  builder.setJITTargetMachineBuilder(std::move(*jtmb));
  auto jit = builder.create();
  if (!jit) compile_fail("creating the LLJIT", jit.takeError());
  impl_->jit = std::move(*jit);
  impl_->jit->getExecutionSession().setErrorReporter([](llvm::Error e) {
    std::string m = take(std::move(e));
    t_orc_error += (t_orc_error.empty() ? "" : "; ") + m;
  });
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
  syms[impl_->jit->mangleAndIntern("__truncsfbf2")] = {ExecutorAddr::fromPtr(&dynamo_truncsfbf2), JITSymbolFlags::Exported};
  syms[impl_->jit->mangleAndIntern("__truncdfbf2")] = {ExecutorAddr::fromPtr(&dynamo_truncdfbf2), JITSymbolFlags::Exported};
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

// A JITDylib of its own per entry (its symbols may repeat another entry's: a cached object
// keeps the name it was compiled under); runtime, SLEEF and libc symbols come from the main one.
JITDylib &Engine::new_dylib() {
  ExecutionSession &es = impl_->jit->getExecutionSession();
  JITDylib &jd = es.createBareJITDylib("dynamo_entry_" + std::to_string(impl_->next_dylib++));
  jd.addToLinkOrder(impl_->jit->getMainJITDylib());
  return jd;
}

CompiledCode Engine::finish(JITDylib &jd, const std::string &symbol, std::string *error) {
  t_orc_error.clear();
  auto sym = impl_->jit->lookup(jd, symbol);
  ExecutionSession &es = impl_->jit->getExecutionSession();
  if (!sym) {
    *error = t_orc_error.empty() ? take(sym.takeError()) : t_orc_error + " (" + take(sym.takeError()) + ")";
    if (auto e = es.removeJITDylib(jd)) take(std::move(e));
    return {};
  }
  CompiledCode cc;
  cc.fn = sym->toPtr<void *>();
  // The dylib (and its code) is removed when the last owner lets go.
  JITDylib *j = &jd;
  cc.tracker = std::shared_ptr<void>(j, [&es](void *p) {
    if (auto e = es.removeJITDylib(*static_cast<JITDylib *>(p))) take(std::move(e));
  });
  return cc;
}

namespace {

void optimize(Module &m, TargetMachine &tm, OptimizationLevel level) {
  LoopAnalysisManager lam;
  FunctionAnalysisManager fam;
  CGSCCAnalysisManager cgam;
  ModuleAnalysisManager mam;
  // The kernels arrive vectorized and unrolled (lower_cpu.cpp emits the vector loops, their
  // accumulator copies and remainders itself): LLVM's loop vectorizer, SLP vectorizer and unroller
  // find nothing to do there and cost a third of the optimizer's time.
  // (Measured: resnet50's trace 127 -> 71 ms to compile, the reduction suite's kernels as fast.)
  PipelineTuningOptions pto;
  pto.LoopVectorization = false;
  pto.SLPVectorization = false;
  pto.LoopUnrolling = false;
  PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  ModulePassManager mpm = level == OptimizationLevel::O0 ? pb.buildO0DefaultPipeline(OptimizationLevel::O0)
                                                         : pb.buildPerModuleDefaultPipeline(level);
  mpm.run(m, mam);
}

std::string emit_object(Module &m, TargetMachine &tm) {
  SmallVector<char, 0> buf;
  raw_svector_ostream os(buf);
  legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, CodeGenFileType::ObjectFile))
    dynamo::jit::fail(ErrorCode::Compile, "this target cannot emit object files");
  pm.run(m);
  return std::string(buf.data(), buf.size());
}

// Threads that compile one trace: $DYNAMO_COMPILE_THREADS, else the hardware's, at most 8.
unsigned compile_threads() {
  static const unsigned n = [] {
    const char *e = getenv("DYNAMO_COMPILE_THREADS");
    long v = e && *e ? strtol(e, nullptr, 10) : (long)std::thread::hardware_concurrency();
    return (unsigned)std::max(1l, std::min(8l, v));
  }();
  return n;
}

}  // namespace

// The module optimized and emitted as objects: split into parts (LLVM's SplitModule, functions
// dealt round-robin by size) that threads compile at once, each in an LLVMContext and target
// machine of its own (a part crosses over as bitcode); one part when it is small.
bool profile_enabled() {
  static const bool on = [] {
    const char *e = getenv("DYNAMO_PROFILE");
    return e && *e && strcmp(e, "0") != 0;
  }();
  return on;
}

std::string step_summary(const Trace &t, const Plan &p, size_t step) {
  const Step &s = p.steps.at(step);
  if (s.kind == Step::Extern) {
    const ExternStep &e = p.externs[(size_t)s.index];
    if (e.is_exit) return "side exit check";
    std::string out = "extern " + e.callee;
    if (!e.result_values.empty()) {
      const Type &ty = t.types[(size_t)e.result_values[0]];
      out += " -> [";
      for (size_t k = 0; k < ty.sizes.size(); ++k) out += (k ? "," : "") + std::to_string(ty.sizes[k]);
      out += "]";
    }
    return out;
  }
  const Group &g = p.groups[(size_t)s.index];
  std::string out = std::string(g.row ? "row kernel" : "kernel") + " k" + std::to_string(s.index) + " [";
  for (size_t k = 0; k < g.domain.size(); ++k) out += (k ? "," : "") + std::to_string(g.domain[k]);
  out += "]:";
  // The values it computes: its stores and reductions, and what they read that no buffer holds
  // (fused into this kernel); a value some buffer holds is a load.
  std::vector<int32_t> todo, insts;
  std::vector<char> seen(t.types.size(), 0);
  for (const Root &r : g.roots) todo.push_back(r.value);
  for (const Root &r : g.row_roots) todo.push_back(r.value);
  for (int32_t r : g.reductions) todo.push_back(r);
  while (!todo.empty()) {
    int32_t v = todo.back();
    todo.pop_back();
    if (v < 0 || (size_t)v >= seen.size() || seen[(size_t)v]) continue;
    seen[(size_t)v] = 1;
    int32_t d = t.def[(size_t)v];
    const Inst &in = t.insts[(size_t)d];
    if (in.op == Op::input) continue;
    insts.push_back(d);
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value && (!p.buffer_backed[(size_t)o.value] || p.group_of[(size_t)o.value] == s.index))
        todo.push_back(o.value);
  }
  std::sort(insts.begin(), insts.end());
  insts.erase(std::unique(insts.begin(), insts.end()), insts.end());
  const size_t shown = 8;
  for (size_t k = 0; k < insts.size() && k < shown; ++k) out += std::string(" ") + op_info(t.insts[(size_t)insts[k]].op).name;
  if (insts.size() > shown) out += " +" + std::to_string(insts.size() - shown) + " more";
  return out;
}

std::vector<std::string> Engine::compile_parts(std::unique_ptr<Module> mod) {
  size_t bodies = 0, insts = 0;
  for (const Function &f : *mod)
    if (!f.isDeclaration()) {
      ++bodies;
      insts += f.getInstructionCount();
    }
  unsigned n = (unsigned)std::min<size_t>({compile_threads(), bodies, std::max<size_t>(1, insts / 2000)});
  if (n <= 1) {
    std::unique_ptr<TargetMachine> tm = target_machine();
    optimize(*mod, *tm, impl_->level);
    return {emit_object(*mod, *tm)};
  }
  std::vector<SmallVector<char, 0>> parts;
  SplitModule(*mod, n, [&](std::unique_ptr<Module> part) {
    parts.emplace_back();
    raw_svector_ostream os(parts.back());
    WriteBitcodeToFile(*part, os);
  }, /*PreserveLocals=*/false, /*RoundRobin=*/true);
  mod.reset();
  std::vector<std::string> objects(parts.size()), errors(parts.size());
  auto work = [&](size_t i) {
    try {
      LLVMContext ctx;
      auto m = parseBitcodeFile(MemoryBufferRef(StringRef(parts[i].data(), parts[i].size()), "part"), ctx);
      if (!m) {
        errors[i] = "reading a part back: " + take(m.takeError());
        return;
      }
      std::unique_ptr<TargetMachine> tm = target_machine();
      optimize(**m, *tm, impl_->level);
      objects[i] = emit_object(**m, *tm);
    } catch (const std::exception &e) {
      errors[i] = e.what();
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < parts.size(); ++i) pool.emplace_back(work, i);
  work(0);
  for (std::thread &th : pool) th.join();
  for (const std::string &e : errors)
    if (!e.empty()) dynamo::jit::fail(ErrorCode::Compile, "compiling in parallel: " + e);
  return objects;
}

std::unique_ptr<TargetMachine> Engine::target_machine() {
  auto tm = impl_->jtmb->createTargetMachine();
  if (!tm) compile_fail("creating a target machine", tm.takeError());
  return std::move(*tm);
}

CompiledCode Engine::compile(const Trace &t, const Plan &p, const std::string &fn_name, int *num_kernels,
                             bool *from_cache) {
  if (from_cache) *from_cache = false;
  if (fault_injected("compile")) dynamo::jit::fail(ErrorCode::Compile, "injected fault: LLVM compilation failed");
  std::string key, id;
  if (impl_->cache) {
    key = impl_->cache_salt + print_trace(t);
    id = DiskCache::hex_hash(key);
    std::string stored, why;
    // DYNAMO_DUMP_DIR asks to see the compilation: a cached object would skip it (the result
    // is still stored for later processes).
    if (!dump_dir() && read_trusted(impl_->cache->dir + "/" + id + ".key", &stored, &why)) {
      std::string symbol, object, fp, object_id;
      int nk = -1;
      size_t nl = stored.find('\n'), nsizes = 0;
      std::istringstream head(stored.substr(0, nl == std::string::npos ? 0 : nl));
      head >> symbol >> nk >> fp >> object_id >> nsizes;
      std::vector<int64_t> sizes(std::min<size_t>(nsizes, stored.size()));
      for (int64_t &v : sizes) head >> v;
      if (!head || object_id.size() != id.size() || object_id.find_first_not_of("0123456789abcdef") != std::string::npos)
        nk = -1;  // a malformed head line
      if (nk >= 0 && fp != "-" && stored.compare(nl + 1, std::string::npos, key) == 0) {
        // code this process holds already (the same program at other sizes): no object to load
        std::lock_guard<std::mutex> lock(impl_->share_mu);
        CompiledCode cc;
        if (const Impl::Shared *hit = impl_->take_shared(fp, sizes, &cc)) {
          if (num_kernels) *num_kernels = hit->num_kernels;
          if (from_cache) *from_cache = true;
          return cc;
        }
      }
      bool have_obj = nk >= 0 && read_trusted(impl_->cache->dir + "/" + object_id + ".o", &object, &why);
      if (nl == std::string::npos || stored.compare(nl + 1, std::string::npos, key) != 0 || symbol.empty() || nk < 0) {
        warn_cache(id + ".key does not match this trace and build");
      } else if (!have_obj) {
        warn_cache(why.empty() ? id + ".o is missing" : why);
      } else if (std::vector<std::string> objects; !DiskCache::split(object, &objects)) {
        warn_cache(id + ".o is not a dynamo object file");
      } else {
        JITDylib &jd = new_dylib();
        std::string err;
        for (const std::string &o : objects)
          if (auto e = impl_->jit->addObjectFile(jd, MemoryBuffer::getMemBufferCopy(o, id + ".o")); e && err.empty())
            err = take(std::move(e));
        if (!err.empty()) {
          warn_cache(id + ".o: " + err);
          if (auto e = impl_->jit->getExecutionSession().removeJITDylib(jd)) take(std::move(e));
        } else {
          CompiledCode cc = finish(jd, symbol, &why);
          cc.sizes = std::move(sizes);
          if (cc.fn) {
            if (num_kernels) *num_kernels = nk;
            if (from_cache) *from_cache = true;
            if (fp != "-") {  // later traces of this process at other sizes may share it
              std::lock_guard<std::mutex> lock(impl_->share_mu);
              auto it = impl_->shared.find(fp);
              if (it == impl_->shared.end() || it->second.tracker.expired())
                impl_->shared[fp] = {cc.tracker, cc.fn, nk, symbol, object_id};
            }
            return cc;
          }
          warn_cache(id + ".o does not link: " + why);
        }
      }
    } else if (!why.empty()) {
      warn_cache(why);
    }
  }
  auto ctx = std::make_unique<LLVMContext>();
  // Without names the IR is cheaper to build; dumps keep them for reading.
  ctx->setDiscardValueNames(dump_dir() == nullptr);
  std::vector<int64_t> sizes;
  std::unique_ptr<Module> mod = lower_trace(t, p, *ctx, fn_name, lower_opt_, num_kernels, &sizes);
  mod->setDataLayout(impl_->jit->getDataLayout());
  mod->setTargetTriple(impl_->jit->getTargetTriple().str());
  std::string verr;
  raw_string_ostream vos(verr);
  const char *dump = dump_dir();
  if (verifyModule(*mod, &vos)) {
    if (dump) {  // the module as generated, for whoever debugs the emitter
      std::error_code ec;
      raw_fd_ostream out(std::string(dump) + "/" + fn_name + ".invalid.ll", ec);
      if (!ec) mod->print(out, nullptr);
    }
    dynamo::jit::fail(ErrorCode::Internal, "generated LLVM IR is invalid: " + vos.str());
  }
  // Sizes as data: the same IR (up to the trace's own name) is the same machine code.
  // (XXH3-128 of its bitcode.)
  std::string fingerprint;
  if (lower_opt_.size_params && !dump) {
    std::vector<std::pair<Function *, std::string>> renamed;
    for (Function &f : *mod)
      if (!f.isDeclaration() && f.getName().starts_with(fn_name)) renamed.push_back({&f, f.getName().str()});
    for (auto &[f, name] : renamed) f->setName("T" + name.substr(fn_name.size()));
    std::string module_id = mod->getModuleIdentifier();
    mod->setModuleIdentifier("T");
    mod->setSourceFileName("T");
    std::string text;  // the module's bitcode: exact, and written ~5x faster than its text
    raw_string_ostream os(text);
    WriteBitcodeToFile(*mod, os);
    os.flush();
    for (auto &[f, name] : renamed) f->setName(name);
    mod->setModuleIdentifier(module_id);
    mod->setSourceFileName(module_id);
    XXH128_hash_t h = xxh3_128bits(ArrayRef<uint8_t>((const uint8_t *)text.data(), text.size()));
    fingerprint = std::to_string(h.high64) + "." + std::to_string(h.low64) + "." + std::to_string(text.size());
    std::lock_guard<std::mutex> lock(impl_->share_mu);
    CompiledCode cc;
    if (const Impl::Shared *hit = impl_->take_shared(fingerprint, sizes, &cc)) {
      if (num_kernels) *num_kernels = hit->num_kernels;
      if (impl_->cache && !hit->object_id.empty())  // a key naming the shared object
        impl_->cache->store_key(id, cache_head(hit->symbol, hit->num_kernels, fingerprint, hit->object_id, cc.sizes) +
                                        "\n" + key);
      return cc;
    }
  }
  std::string stem = dump ? std::string(dump) + "/" + fn_name : "";
  if (dump) {
    sys::fs::create_directories(dump);
    dump_text(stem + ".trace", [&](raw_ostream &os) { os << print_trace(t); });
    dump_text(stem + ".plan", [&](raw_ostream &os) { os << describe_plan(t, p); });
    dump_text(stem + ".ll", [&](raw_ostream &os) { mod->print(os, nullptr); });
  }
  std::vector<std::string> objects;
  if (dump) {  // one module, optimized and emitted here, so that the dumps show all of it
    std::lock_guard<std::mutex> lock(impl_->mu);
    optimize(*mod, *impl_->tm, impl_->level);
    dump_text(stem + ".opt.ll", [&](raw_ostream &os) { mod->print(os, nullptr); });
    dump_text(stem + ".s", [&](raw_fd_ostream &os) {
      std::unique_ptr<Module> copy = CloneModule(*mod);
      legacy::PassManager pm;
      if (impl_->tm->addPassesToEmitFile(pm, os, nullptr, CodeGenFileType::AssemblyFile))
        os << "; this target cannot emit assembly\n";
      else
        pm.run(*copy);
    });
    objects.push_back(emit_object(*mod, *impl_->tm));
  } else {
    objects = compile_parts(std::move(mod));
  }
  if (impl_->cache)
    impl_->cache->store(id, cache_head(fn_name, num_kernels ? *num_kernels : 0, fingerprint.empty() ? "-" : fingerprint, id, sizes) +
                                "\n" + key, objects);
  JITDylib &jd = new_dylib();  // its default tracker owns the code; removing the dylib frees it
  for (size_t i = 0; i < objects.size(); ++i)
    if (auto err = impl_->jit->addObjectFile(jd, MemoryBuffer::getMemBufferCopy(objects[i], fn_name + ".part" + std::to_string(i)))) {
      if (auto e = impl_->jit->getExecutionSession().removeJITDylib(jd)) take(std::move(e));
      compile_fail("adding the object", std::move(err));
    }
  std::string why;
  CompiledCode cc = finish(jd, fn_name, &why);
  if (!cc.fn) dynamo::jit::fail(ErrorCode::Compile, "compiling " + fn_name + ": " + why);
  cc.sizes = std::move(sizes);
  if (!fingerprint.empty()) {
    std::lock_guard<std::mutex> lock(impl_->share_mu);
    if (impl_->shared.size() > 4096)  // forget code no entry holds any more
      for (auto it = impl_->shared.begin(); it != impl_->shared.end();)
        it = it->second.tracker.expired() ? impl_->shared.erase(it) : std::next(it);
    impl_->shared[fingerprint] = {cc.tracker, cc.fn, num_kernels ? *num_kernels : 0, fn_name, impl_->cache ? id : ""};
  }
  return cc;
}

}  // namespace dynamo::jit
