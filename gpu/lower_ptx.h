// lower_ptx.h -- a planned trace's fused groups as PTX for NVIDIA GPUs (gpu/lower_ptx.cpp): the
// kernel emitter (jit/kernel.h) with the PTX target.
#pragma once

#include <string>
#include <vector>

#include "jit/fuse.h"

namespace dynamo::gpu {

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
  bool exit_check = false;     // the side-exit check (<fn>_exit_check, lower_ptx.cpp), one per program
};

// Every fused group of a planned trace as a kernel
//   .entry <fn>_k<i>(void **slots, int64 n, int32 *status)
// in step order (a split reduction: <fn>_k<i>_part, then <fn>_k<i>), and when the trace has side
// exits, `.entry <fn>_exit_check(u8 *cond, i32 expected, i32 code, i32 *status)` last, which
// the host launches at each exit's step; kernels after an exit do nothing once the status word
// is set. Extern steps are skipped:
// compile_program (program.h) runs matrix products through cuBLASLt and refuses the others.
// Tuning knobs (gpu_check sweeps them): $DYNAMO_GPU_ROW_BLOCK (threads per row block, a
// multiple of 32 in [32, 1024]), $DYNAMO_GPU_UNROLL (elements per thread of pointwise kernels,
// [0, 16], 0 = by size).
std::string lower_ptx(const jit::Trace &t, const jit::Plan &p, const std::string &fn_name, const std::string &gpu_name,
                      std::vector<GpuKernel> *kernels);

}  // namespace dynamo::gpu
