// engine.h -- the ORC LLJIT engine: optimizes lowered modules, compiles them to host code, and
// frees each entry's code through its own resource tracker.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lower_cpu.h"

namespace llvm {
class Module;
class TargetMachine;
namespace orc {
class JITDylib;
}  // namespace orc
}  // namespace llvm

namespace dynamo::jit {

struct EngineOptions {
  int opt_level = 2;     // 0..3
  int vector_bits = 0;   // 0 = host's widest
};

struct CompiledCode {
  void *fn = nullptr;               // int32_t (*)(void **slots, void *ctx)
  std::shared_ptr<void> tracker;    // releases the machine code when the last owner drops it
  // The numbers this trace's run reads instead of constants (LowerOptions::size_params): the
  // caller passes sizes.data() as slots[plan.num_slots]. Empty when sizes are constants.
  std::vector<int64_t> sizes;
  // The machine code was compiled earlier for another trace that lowers to the same IR (the
  // same program at other sizes) and is shared with it: no LLVM compile ran.
  bool shared = false;
};

class Engine {
 public:
  // host_symbols: runtime helpers generated code calls, resolved by name.
  Engine(const EngineOptions &opt, const std::map<std::string, void *> &host_symbols);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Lowers, optimizes and compiles a planned trace (a large one in parts, on
  // $DYNAMO_COMPILE_THREADS threads, default the hardware's); thread-safe. With the compile
  // cache on, objects compiled earlier (by any process) for the same trace and build are loaded
  // instead (*from_cache = true), and new ones are written there. A trace whose IR is that of a
  // trace compiled earlier in this process (the same code at other sizes: sizes are data) gets
  // that machine code (result.shared) while any entry still holds it.
  CompiledCode compile(const Trace &t, const Plan &p, const std::string &fn_name, int *num_kernels,
                       bool *from_cache = nullptr);
  const LowerOptions &lower_options() const { return lower_opt_; }

 private:
  llvm::orc::JITDylib &new_dylib();
  CompiledCode finish(llvm::orc::JITDylib &jd, const std::string &symbol, std::string *error);
  std::vector<std::string> compile_parts(std::unique_ptr<llvm::Module> mod);
  std::unique_ptr<llvm::TargetMachine> target_machine();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LowerOptions lower_opt_;
};

// The directory of the on-disk compile cache ("" when it is off or refused; then *why, if not
// empty, says why): $DYNAMO_CACHE_DIR, $XDG_CACHE_HOME/dynamo or ~/.cache/dynamo, created 0700
// and used only while it is this user's and not writable by others.
std::string disk_cache_directory(std::string *why);

// DYNAMO_PROFILE=1 (read once): traces are compiled with a clock read before each step (the
// runtime's dynamo_rt_profile) and entries keep time per step; off by default (no cost then).
bool profile_enabled();
// One line about plan step `step` for a profile: "kernel k3 [64,56,56]: add mul relu" (the ops
// it computes, in trace order) or "extern aten::convolution".
std::string step_summary(const Trace &t, const Plan &p, size_t step);

}  // namespace dynamo::jit
