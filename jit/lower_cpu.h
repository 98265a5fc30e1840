// lower_cpu.h -- lowering a planned trace to LLVM IR for the host CPU.
#pragma once

#include <memory>
#include <string>

#include "fuse.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace dynamo::jit {

struct LowerOptions {
  int vector_bits = 512;        // widest vector the host runs well
  bool parallel = true;         // large kernels go through dynamo_rt_parallel_for
  int64_t parallel_min_elems = 1 << 16;
  std::string cpu, features;    // attached to every function (target-cpu/-features)
};

// The trace function has the C signature
//   int32_t fn(void **slots, void *ctx)
// and returns 0 or a runtime status code (DYNAMO_RT_*); see runtime/rt_abi.h.
std::unique_ptr<llvm::Module> lower_trace(const Trace &t, const Plan &p, llvm::LLVMContext &ctx,
                                          const std::string &fn_name, const LowerOptions &opt,
                                          int *num_kernels);

}  // namespace dynamo::jit
