// engine.h -- the ORC LLJIT engine: optimizes lowered modules, compiles them to host code, and
// frees each entry's code through its own resource tracker.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lower_cpu.h"

namespace llvm::orc {
class JITDylib;
}  // namespace llvm::orc

namespace dynamo::jit {

struct EngineOptions {
  int opt_level = 2;     // 0..3
  int vector_bits = 0;   // 0 = host's widest
};

struct CompiledCode {
  void *fn = nullptr;               // int32_t (*)(void **slots, void *ctx)
  std::shared_ptr<void> tracker;    // releases the machine code when the last owner drops it
};

class Engine {
 public:
  // host_symbols: runtime helpers generated code calls, resolved by name.
  Engine(const EngineOptions &opt, const std::map<std::string, void *> &host_symbols);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Lowers, optimizes and compiles a planned trace; thread-safe. With DYNAMO_CACHE_DIR set, an
  // object compiled earlier (by any process) for the same trace and build is loaded instead
  // (*from_cache = true), and new objects are written there.
  CompiledCode compile(const Trace &t, const Plan &p, const std::string &fn_name, int *num_kernels,
                       bool *from_cache = nullptr);
  const LowerOptions &lower_options() const { return lower_opt_; }

 private:
  llvm::orc::JITDylib &new_dylib();
  CompiledCode finish(llvm::orc::JITDylib &jd, const std::string &symbol, std::string *error);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LowerOptions lower_opt_;
};

}  // namespace dynamo::jit
