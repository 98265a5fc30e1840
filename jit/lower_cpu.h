// lower_cpu.h -- lowering a planned trace to LLVM IR for the host CPU.
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
  bool gpu = false;             // NVPTX: scalar code, libdevice math, no malloc'd row caches
  int gpu_row_block = 0;        // threads per block-per-row kernel; 0 = by row length
  int gpu_unroll = 0;           // elements per thread in pointwise kernels; 0 = automatic
  // CPU: numbers that follow from sizes (loop bounds, strides, offsets, thread splits) are
  // data the trace function reads from its size table (lower_trace's *size_table), not
  // constants of the code; a trace recorded at other sizes then lowers to the same IR and
  // shares the machine code (Engine::compile). $DYNAMO_SHARE_CODE=0 turns it off.
  bool size_params = true;
};

// The trace function has the C signature
//   int32_t fn(void **slots, void *ctx)
// and returns 0 or a runtime status code (DYNAMO_RT_*); see runtime/rt_abi.h. With
// opt.size_params, slots[p.num_slots] must point to the int64 array *size_table (the numbers
// the code reads instead of constants); without, *size_table is left empty.
std::unique_ptr<llvm::Module> lower_trace(const Trace &t, const Plan &p, llvm::LLVMContext &ctx,
                                          const std::string &fn_name, const LowerOptions &opt,
                                          int *num_kernels, std::vector<int64_t> *size_table = nullptr);

// Threads per block of the GPU kernels that take one item per thread (the launcher uses it,
// and pointwise kernels lay out their unrolled elements in tiles of this many).
constexpr int kGpuThreads = 256;

// One GPU kernel of a trace, in launch order: `items` work items over a grid-stride loop, one
// per thread (block_threads == 0: elements of a pointwise group, rows of a short-row group,
// chunks of a split reduction) or one per block of block_threads threads (long rows).
struct GpuKernel {
  std::string name;
  int64_t items = 0;
  int block_threads = 0;
  int32_t optional_slot = -1;  // skipped when this output slot is NULL (as on the CPU)
  bool can_fail = false;       // may set the status word (integer floor division by zero)
  int32_t group = -1;          // the plan's group (a split reduction: two kernels of one group)
};

// PTX for NVIDIA GPUs (gpu/lower_ptx.cpp): every fused group of a planned trace as a kernel
//   .entry <fn>_k<i>(void **slots, int64 n, int32 *status)
// in step order (a split reduction: <fn>_k<i>_part, then <fn>_k<i>). Extern steps are skipped:
// gpu::compile_program runs matrix products through cuBLASLt and refuses the others.
std::string lower_ptx(const Trace &t, const Plan &p, const std::string &fn_name, const std::string &gpu_name,
                      std::vector<GpuKernel> *kernels);

}  // namespace dynamo::jit
