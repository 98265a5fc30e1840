// program.cpp -- compiling a planned trace into a GPU program and running it (see program.h).
#include "gpu/program.h"

#include <algorithm>

#include "jit/rt_abi.h"

namespace dynamo::gpu {

Program compile_program(const jit::Trace &t, const jit::Plan &p, const std::string &fn_name,
                        const std::string &arch) {
  Program g;
  g.arch = arch;
  g.ptx = jit::lower_ptx(t, p, fn_name, arch, &g.kernels);
  g.num_inputs = p.num_inputs;
  g.num_outputs = p.num_outputs;
  g.num_slots = p.num_slots;
  g.scratch_bytes = p.scratch_bytes;
  g.scratch_bytes.resize((size_t)p.num_slots, 0);
  for (const jit::GpuKernel &k : g.kernels) g.can_fail = g.can_fail || k.can_fail;
  return g;
}

Loaded::Loaded(std::shared_ptr<Device> dev, const Program &prog) : dev_(std::move(dev)), prog_(prog) {
  scratch_.assign((size_t)prog_.num_slots, 0);
  try {
    mod_ = dev_->load(prog_.ptx);
    for (const jit::GpuKernel &k : prog_.kernels) functions_.push_back(dev_->function(*mod_, k.name));
    slot_table_ = dev_->alloc(sizeof(uint64_t) * (size_t)std::max<int32_t>(1, prog_.num_slots));
    status_ = dev_->alloc(sizeof(int32_t));
    for (size_t k = 0; k < scratch_.size(); ++k)
      if (prog_.scratch_bytes[k] > 0) scratch_[k] = dev_->alloc((size_t)prog_.scratch_bytes[k]);
  } catch (...) {  // no destructor runs for a half-built object: free what was taken
    release();
    throw;
  }
}

void Loaded::release() noexcept {
  try {
    for (uint64_t p : scratch_) dev_->free(p);
    dev_->free(slot_table_);
    dev_->free(status_);
  } catch (...) {  // a driver error while tearing down: nothing more to do
  }
}

Loaded::~Loaded() { release(); }

void Loaded::launch(std::vector<uint64_t> slots) {
  if ((int32_t)slots.size() != prog_.num_slots)
    jit::fail(jit::ErrorCode::Runtime, "GPU program: " + std::to_string(slots.size()) + " slots given, " +
                                                   std::to_string(prog_.num_slots) + " expected");
  for (size_t k = 0; k < slots.size(); ++k)
    if (scratch_[k]) slots[k] = scratch_[k];
  if (slots != uploaded_) {  // the same tensors as last time: the table on the device is current
    dev_->copy_to_device(slot_table_, slots.data(), sizeof(uint64_t) * slots.size());
    uploaded_ = slots;
  }
  for (size_t ki = 0; ki < prog_.kernels.size(); ++ki) {
    const jit::GpuKernel &k = prog_.kernels[ki];
    if (k.items <= 0) continue;
    if (k.optional_slot >= 0 && slots[(size_t)k.optional_slot] == 0) continue;  // elided output
    int64_t items = k.items;
    unsigned block, grid;
    if (k.block_threads > 0) {  // one item per block
      block = (unsigned)k.block_threads;
      grid = (unsigned)std::min<int64_t>(items, 1 << 20);
    } else {
      block = jit::kGpuThreads;
      grid = (unsigned)std::min<int64_t>((items + block - 1) / block, 1 << 20);
    }
    uint64_t table = slot_table_, status = status_;
    dev_->launch(functions_[ki], grid, block, {&table, &items, &status});
  }
}

int32_t Loaded::run(std::vector<uint64_t> slots) {
  if (!prog_.can_fail) {  // no kernel can set the status word: no memset, no read back
    launch(std::move(slots));
    dev_->synchronize_run();
    return DYNAMO_RT_OK;
  }
  dev_->zero(status_, sizeof(int32_t));
  launch(std::move(slots));
  dev_->synchronize_run();
  int32_t st = 0;
  dev_->copy_to_host(&st, status_, sizeof st);
  return st;
}

}  // namespace dynamo::gpu
