// program.h -- a trace compiled for one NVIDIA GPU and how it runs: the PTX module (loaded once
// through the driver) and its kernels in launch order, over the plan's slots as device
// pointers. The engine's CUDA entries and tests/gpu/gpu_check both run traces through this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/blas_lt.h"
#include "gpu/cuda_driver.h"
#include "gpu/lower_ptx.h"

namespace dynamo::gpu {

// Whole-tensor reductions are cut into this many chunks on the GPU (a block each; a few per
// multiprocessor), then merged by one block.
constexpr int32_t kSplitChunks = 512;
inline jit::Plan plan_for_gpu(const jit::Trace &t) { return jit::plan_trace(t, jit::PlanOptions{kSplitChunks, false}); }

struct Program {
  std::string arch;                        // "sm_90"
  std::string ptx;
  std::vector<GpuKernel> kernels;     // in step order (the exit check last)
  int32_t num_inputs = 0, num_outputs = 0, num_slots = 0;
  std::vector<int64_t> scratch_bytes;      // by slot (0: the caller's)
  bool can_fail = false;                   // a kernel may set the status word
  std::vector<Gemm> gemms;                 // matrix products (cuBLASLt), by the plan's order
  // A side exit (the guard op): at its step the host launches the exit check
  // (kernels[exit_check]) on the condition, which sets the status word to kExitStatus + the
  // exit's index when the condition is not `expected`; the kernels after it then do nothing, a
  // product after it is not enqueued (the host reads the word before it), and at the end of
  // the run the host reads the word once and copies the exit's live values out.
  static constexpr int32_t kExitStatus = 0x100;  // (never a DYNAMO_RT_* code; run() maps it)
  int32_t exit_check = -1;                 // kernels[exit_check]: the check (-1: no exits)
  struct ExitStep {
    int32_t id = -1;
    bool expected = true;
    jit::BufferView cond;                  // one bool element
    int32_t result_slot = -1;              // the guard's value (the condition's pointer)
    struct Live {
      jit::BufferView view;                // contiguous
      jit::DType dtype;
      std::vector<int64_t> sizes;
    };
    std::vector<Live> live;
  };
  std::vector<ExitStep> exits;
  struct Launch {
    enum Kind : uint8_t { Kernel, Gemm, Exit } kind;  // kernels[index], gemms[index], exits[index]
    int32_t index;
  };
  std::vector<Launch> order;               // kernels, products and exits in the plan's step order
  // A product whose result is an output the plan copies there by a kernel writes the output
  // itself: its result slot takes the output slot's pointer and the copy is not launched.
  std::vector<std::pair<int32_t, int32_t>> alias_slots;  // (result slot, output slot)
};

// Lowers a trace planned by plan_for_gpu for `arch`: its fused groups to PTX kernels, its
// matrix products to cuBLASLt calls (throws jit::Error: Unsupported for any other extern op,
// with the reason).
Program compile_program(const jit::Trace &t, const jit::Plan &p, const std::string &fn_name,
                        const std::string &arch);

// A program loaded on a device: the module plus the slot table, scratch and status word it
// launches with. run() is not reentrant (one slot table); callers serialize per loaded program.
class Loaded {
 public:
  Loaded(std::shared_ptr<Device> dev, const Program &prog);
  ~Loaded();
  Loaded(const Loaded &) = delete;
  Loaded &operator=(const Loaded &) = delete;

  // A side exit taken by run(): its id and copies of its live values in device memory from the
  // device's output pool (the caller hands each back with Device::release).
  struct TakenExit {
    int32_t id = -1;
    std::vector<std::pair<uint64_t, size_t>> values;  // (device pointer, bytes)
  };
  // slots[k] for inputs and outputs (device pointers; 0 = NULL for an elided optional output)
  // and scalar inputs (the value's 8 bytes, as on the CPU); scratch slots are filled here. Launches every kernel on
  // the device's stream and waits. Returns the trace's runtime status (DYNAMO_RT_*):
  // DYNAMO_RT_SIDE_EXIT with *exit filled when a guard fails (exit may be null only for
  // programs without exits).
  int32_t run(std::vector<uint64_t> slots, TakenExit *exit = nullptr);
  // Launches without waiting or reading the status (benchmarks: time many runs, then sync),
  // except that a product after a side exit's check waits to read the status word first.
  void launch(std::vector<uint64_t> slots) { enqueue(slots); }
  Device &device() { return *dev_; }

 private:
  std::shared_ptr<Device> dev_;
  const Program prog_;
  std::shared_ptr<Device::Module> mod_;
  std::vector<void *> functions_;  // by kernel
  uint64_t slot_table_ = 0, status_ = 0;
  std::vector<uint64_t> scratch_;  // by slot
  std::vector<uint64_t> uploaded_;  // the slot table as last copied to the device
  std::unique_ptr<BlasLt> blas_;    // the products' descriptors (none without products)
  // Fills slots (scratch, aliases, guard values), uploads the table when it changed and enqueues
  // the steps; stops before a product when a side exit was taken (or a kernel failed).
  void enqueue(std::vector<uint64_t> &slots);
  void release() noexcept;
};

}  // namespace dynamo::gpu
