// lower_cpu.h -- lowering a planned trace to LLVM IR for the host CPU (the kernel emitter,
// kernel.h, with the CPU target, and the trace function that calls the kernels and externs).
#pragma once

#include <memory>
#include <string>
#include <vector>

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
  // CPU: numbers that follow from sizes (loop bounds, strides, offsets, thread splits) are
  // data the trace function reads from its size table (lower_trace's *size_table), not
  // constants of the code; a trace recorded at other sizes then lowers to the same IR and
  // shares the machine code (Engine::compile). $DYNAMO_SHARE_CODE=0 turns it off.
  bool size_params = true;
  // DYNAMO_PROFILE: the trace function calls dynamo_rt_profile(ctx, step) before each plan
  // step and (-1) before it returns, so the runtime can time every kernel and extern.
  bool profile = false;
};

// The trace function has the C signature
//   int32_t fn(void **slots, void *ctx)
// and returns 0 or a runtime status code (DYNAMO_RT_*); see runtime/rt_abi.h. With
// opt.size_params, slots[p.num_slots] must point to the int64 array *size_table (the numbers
// the code reads instead of constants); without, *size_table is left empty.
std::unique_ptr<llvm::Module> lower_trace(const Trace &t, const Plan &p, llvm::LLVMContext &ctx,
                                          const std::string &fn_name, const LowerOptions &opt,
                                          int *num_kernels, std::vector<int64_t> *size_table = nullptr);

}  // namespace dynamo::jit
