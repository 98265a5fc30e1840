// entry.h -- one compiled trace in a frame's cache: its plan, guards, machine code, extern
// operator handles, and the run path (validate, fill slots, call native code).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dynamo.h"
#include "guards/guards.h"
#include "jit/engine.h"
#include "jit/fuse.h"
#include "runtime/buffer_pool.h"

namespace dynamo::runtime {

struct ExternOps;  // resolved LibTorch operators (aten_extern.cpp)

// Per-call state handed to generated code as its `ctx`.
struct RunContext {
  const struct Entry *entry = nullptr;
  std::vector<std::shared_ptr<void>> keep;  // extern results alive until the call returns
  std::string error;                        // set when a helper fails
  int num_threads = 0;                      // 0 = LibTorch's; 1 = serial
};

struct Entry {
  jit::Trace trace;          // simplified
  jit::Plan plan;
  guards::GuardSet guards;
  jit::CompiledCode code;
  std::shared_ptr<ExternOps> externs;
  int num_threads = 0;
  dynamo_entry_stats stats{};

  // Runs with already-checked guards; returns a status and sets *msg on failure. Scratch
  // memory comes from pool (may be null: plain allocation).
  dynamo_status run(const dynamo_arg *args, size_t nargs, const DLTensor *outs, size_t nouts,
                    BufferPool *pool, std::string *msg) const;
};

// Compiles a verified trace into an entry (throws jit::Error).
std::unique_ptr<Entry> compile_entry(jit::Engine &engine, const jit::Trace &trace,
                                     const std::string &fn_name, int num_threads);

// LibTorch side (aten_extern.cpp).
std::shared_ptr<ExternOps> resolve_externs(const jit::Trace &t, const jit::Plan &p);
// Host symbols generated code calls (dynamo_rt_*), for the engine.
std::map<std::string, void *> runtime_symbols();

}  // namespace dynamo::runtime
