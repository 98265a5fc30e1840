// program.cpp -- compiling a planned trace into a GPU program and running it (see program.h).
#include "gpu/program.h"

#include <algorithm>

#include "jit/rt_abi.h"

namespace dynamo::gpu {

namespace {

// A kernel that only stores one pointwise value (no reductions, rows or split, not an elidable
// output copy, contiguous): what a product's epilogue or its own result buffer can replace.
bool single_store(const jit::Group &gr) {
  return !gr.row && gr.reductions.empty() && gr.row_roots.empty() && gr.roots.size() == 1 && gr.optional_slot < 0 &&
         gr.split_chunks == 0 && !gr.roots[0].strided;
}

// A ReLU (or tanh-form GELU) of a product's result, the result read by nothing else (through
// reshapes of it only), computed by a kernel of its own that stores it contiguously: cuBLASLt
// applies it as the product's epilogue (RELU, GELU; with the bias: RELU_BIAS, GELU_BIAS) and
// writes the activation's buffer itself; the kernel is not launched. The exact (erf) GELU is
// not cuBLASLt's: it stays a kernel.
void fuse_activations(const jit::Trace &t, const jit::Plan &p, Program &g, std::vector<char> &dropped) {
  std::vector<std::vector<int32_t>> users(t.types.size());
  for (size_t i = 0; i < t.insts.size(); ++i)
    for (const jit::Operand &o : t.insts[i].args)
      if (o.kind == jit::Operand::Value) users[(size_t)o.value].push_back((int32_t)i);
  for (int32_t v : t.outputs) users[(size_t)v].push_back(-1);  // (returned: read by the caller)
  for (Gemm &G : g.gemms) {
    int32_t v = p.externs[(size_t)G.step].result_values[0];
    // down the chain of reshapes to the one instruction that reads it
    int32_t cur = v;
    const jit::Inst *act = nullptr;
    for (;;) {
      if (users[(size_t)cur].size() != 1 || users[(size_t)cur][0] < 0) break;
      const jit::Inst &u = t.insts[(size_t)users[(size_t)cur][0]];
      if (u.op == jit::Op::reshape || u.op == jit::Op::view) {
        cur = u.results[0];
        continue;
      }
      if ((u.op == jit::Op::relu || u.op == jit::Op::gelu_tanh) && t.types[u.results[0]].dtype == G.dtype) act = &u;
      break;
    }
    if (!act) continue;
    int32_t a = act->results[0];
    int32_t gi = p.group_of[(size_t)a];
    if (gi < 0 || !p.materialized[(size_t)a]) continue;
    const jit::Group &gr = p.groups[(size_t)gi];
    if (!single_store(gr) || gr.roots[0].value != a) continue;
    const jit::BufferView &av = p.views[(size_t)a];
    if (av.offset != 0 || av.strides != jit::contiguous_strides(t.types[(size_t)a].sizes)) continue;
    G.act = act->op == jit::Op::relu ? Gemm::Relu : Gemm::GeluTanh;
    G.c = jit::BufferView{gr.roots[0].slot, 0, jit::contiguous_strides(t.types[(size_t)v].sizes)};
    dropped[(size_t)gi] = 1;
  }
}

}  // namespace

Program compile_program(const jit::Trace &t, const jit::Plan &p, const std::string &fn_name,
                        const std::string &arch) {
  Program g;
  g.arch = arch;
  std::vector<int32_t> gemm_of_step(p.externs.size(), -1), exit_of_step(p.externs.size(), -1);
  for (const jit::Step &s : p.steps) {
    if (s.kind != jit::Step::Extern) continue;
    const jit::ExternStep &x = p.externs[(size_t)s.index];
    if (x.is_exit) {  // (verified: %cond, true|false, id, %live...)
      Program::ExitStep ex;
      ex.id = (int32_t)x.args[2].lit.i;
      ex.expected = x.args[1].lit.i != 0;
      ex.cond = x.args[0].view;
      ex.result_slot = x.result_slots.empty() ? -1 : x.result_slots[0];
      for (size_t k = 3; k < x.args.size(); ++k) {
        const jit::Type &ty = t.types[(size_t)x.args[k].value];
        if (x.args[k].view.strides != jit::contiguous_strides(ty.sizes))
          jit::fail(jit::ErrorCode::Unsupported, "side exit " + std::to_string(ex.id) + ": live value %" +
                                                     std::to_string(x.args[k].value) +
                                                     " is a non-contiguous view (copied out on the CPU only)");
        ex.live.push_back({x.args[k].view, ty.dtype, ty.sizes});
      }
      exit_of_step[(size_t)s.index] = (int32_t)g.exits.size();
      g.exits.push_back(std::move(ex));
      continue;
    }
    Gemm G;
    std::string why;
    if (!gemm_of(t, p, s.index, &G, &why)) jit::fail(jit::ErrorCode::Unsupported, why);
    gemm_of_step[(size_t)s.index] = (int32_t)g.gemms.size();
    g.gemms.push_back(G);
  }
  g.ptx = lower_ptx(t, p, fn_name, arch, &g.kernels);
  g.num_inputs = p.num_inputs;
  g.num_outputs = p.num_outputs;
  g.num_slots = p.num_slots;
  g.scratch_bytes = p.scratch_bytes;
  g.scratch_bytes.resize((size_t)p.num_slots, 0);
  for (size_t k = 0; k < g.kernels.size(); ++k) {
    g.can_fail = g.can_fail || g.kernels[k].can_fail;
    if (g.kernels[k].exit_check) g.exit_check = (int32_t)k;
  }
  std::vector<char> dropped(p.groups.size(), 0);
  fuse_activations(t, p, g, dropped);
  // Products' results: device memory of their own, or the output the plan would copy them to.
  for (const Gemm &G : g.gemms) {
    if (G.act != Gemm::None) continue;  // (writes the activation's own buffer)
    int32_t v = p.externs[(size_t)G.step].result_values[0];
    int32_t copy = -1, out = -1;
    for (size_t k = 0; k < t.outputs.size() && out < 0; ++k)
      if (t.outputs[k] == v) out = p.num_inputs + (int32_t)k;
    for (size_t gi = 0; gi < p.groups.size() && out >= 0 && copy < 0; ++gi) {
      const jit::Group &gr = p.groups[gi];
      if (single_store(gr) && gr.roots[0].value == v && gr.roots[0].slot == out) copy = (int32_t)gi;
    }
    if (copy >= 0) {
      dropped[(size_t)copy] = 1;
      g.alias_slots.push_back({G.c.slot, out});
    } else {
      g.scratch_bytes[(size_t)G.c.slot] = G.batch * G.m * G.n * jit::dtype_bytes(G.dtype);
    }
  }
  for (const jit::Step &s : p.steps) {
    if (s.kind == jit::Step::Extern) {
      if (exit_of_step[(size_t)s.index] >= 0) g.order.push_back({Program::Launch::Exit, exit_of_step[(size_t)s.index]});
      else g.order.push_back({Program::Launch::Gemm, gemm_of_step[(size_t)s.index]});
      continue;
    }
    if (dropped[(size_t)s.index]) continue;
    for (size_t k = 0; k < g.kernels.size(); ++k)
      if (g.kernels[k].group == s.index) g.order.push_back({Program::Launch::Kernel, (int32_t)k});
  }
  return g;
}

Loaded::Loaded(std::shared_ptr<Device> dev, const Program &prog) : dev_(std::move(dev)), prog_(prog) {
  scratch_.assign((size_t)prog_.num_slots, 0);
  try {
    mod_ = dev_->load(prog_.ptx);
    for (const GpuKernel &k : prog_.kernels) functions_.push_back(dev_->function(*mod_, k.name));
    slot_table_ = dev_->alloc(sizeof(uint64_t) * (size_t)std::max<int32_t>(1, prog_.num_slots));
    status_ = dev_->alloc(sizeof(int32_t));
    for (size_t k = 0; k < scratch_.size(); ++k)
      if (prog_.scratch_bytes[k] > 0) scratch_[k] = dev_->alloc((size_t)prog_.scratch_bytes[k]);
    if (!prog_.gemms.empty()) blas_ = std::make_unique<BlasLt>(dev_, prog_.gemms);
  } catch (...) {  // no destructor runs for a half-built object: free what was taken
    release();
    throw;
  }
}

void Loaded::release() noexcept {
  blas_.reset();
  try {
    for (uint64_t p : scratch_) dev_->free(p);
    dev_->free(slot_table_);
    dev_->free(status_);
  } catch (...) {  // a driver error while tearing down: nothing more to do
  }
}

Loaded::~Loaded() { release(); }

void Loaded::enqueue(std::vector<uint64_t> &slots) {
  if ((int32_t)slots.size() != prog_.num_slots)
    jit::fail(jit::ErrorCode::Runtime, "GPU program: " + std::to_string(slots.size()) + " slots given, " +
                                                   std::to_string(prog_.num_slots) + " expected");
  for (size_t k = 0; k < slots.size(); ++k)
    if (scratch_[k]) slots[k] = scratch_[k];
  for (auto [result, out] : prog_.alias_slots) slots[(size_t)result] = slots[(size_t)out];
  for (const Program::ExitStep &x : prog_.exits)  // a guard's value is its condition
    if (x.result_slot >= 0) slots[(size_t)x.result_slot] = slots[(size_t)x.cond.slot] + (uint64_t)x.cond.offset;
  if (slots != uploaded_) {  // the same tensors as last time: the table on the device is current
    dev_->copy_to_device(slot_table_, slots.data(), sizeof(uint64_t) * slots.size());
    uploaded_ = slots;
  }
  bool unread = false;  // an exit check ran since the host last read the status word
  for (const Program::Launch &step : prog_.order) {
    if (step.kind == Program::Launch::Gemm) {  // a matrix product, on the same stream between the kernels
      if (unread) {  // a product cannot skip itself: leave before it if an exit was taken
        dev_->synchronize();
        int32_t st = 0;
        dev_->copy_to_host(&st, status_, sizeof st);
        if (st != DYNAMO_RT_OK) return;
        unread = false;
      }
      blas_->run((size_t)step.index, slots);
      continue;
    }
    if (step.kind == Program::Launch::Exit) {  // the check sets the status word if the exit is taken
      const Program::ExitStep &x = prog_.exits[(size_t)step.index];
      uint64_t cond = slots[(size_t)x.cond.slot] + (uint64_t)x.cond.offset, status = status_;
      int32_t expected = x.expected ? 1 : 0, code = Program::kExitStatus + step.index;
      dev_->launch(functions_[(size_t)prog_.exit_check], 1, 1, {&cond, &expected, &code, &status});
      unread = true;
      continue;
    }
    size_t ki = (size_t)step.index;
    const GpuKernel &k = prog_.kernels[ki];
    if (k.items <= 0) continue;
    if (k.optional_slot >= 0 && slots[(size_t)k.optional_slot] == 0) continue;  // elided output
    int64_t items = k.items;
    unsigned block, grid;
    if (k.block_threads > 0) {  // one item per block
      block = (unsigned)k.block_threads;
      grid = (unsigned)std::min<int64_t>(items, 1 << 20);
    } else {
      block = kGpuThreads;
      grid = (unsigned)std::min<int64_t>((items + block - 1) / block, 1 << 20);
    }
    uint64_t table = slot_table_, status = status_;
    dev_->launch(functions_[ki], grid, block, {&table, &items, &status});
  }
}

int32_t Loaded::run(std::vector<uint64_t> slots, TakenExit *exit) {
  // The status word: set by a kernel that fails or an exit check that leaves (else no memset, no read).
  const bool word = prog_.can_fail || !prog_.exits.empty();
  if (word) dev_->zero(status_, sizeof(int32_t));
  enqueue(slots);
  dev_->synchronize_run();
  if (!word) return DYNAMO_RT_OK;
  int32_t st = 0;
  dev_->copy_to_host(&st, status_, sizeof st);
  if (st < Program::kExitStatus || st >= Program::kExitStatus + (int32_t)prog_.exits.size()) return st;
  // A side exit: copies of its live values (as they were at its step: nothing after it ran),
  // out of the memory the next run reuses.
  const Program::ExitStep &x = prog_.exits[(size_t)(st - Program::kExitStatus)];
  if (!exit) jit::fail(jit::ErrorCode::Internal, "a side exit was taken with nowhere to put it");
  exit->id = x.id;
  exit->values.clear();
  for (const Program::ExitStep::Live &l : x.live) {
    int64_t n = 1;
    for (int64_t d : l.sizes) n *= d;
    size_t bytes = (size_t)n * (size_t)jit::dtype_bytes(l.dtype);
    uint64_t d = dev_->acquire(bytes);
    exit->values.push_back({d, bytes});
    dev_->copy_on_device(d, slots[(size_t)l.view.slot] + (uint64_t)l.view.offset * (uint64_t)jit::dtype_bytes(l.dtype), bytes);
  }
  dev_->synchronize();
  return DYNAMO_RT_SIDE_EXIT;
}

}  // namespace dynamo::gpu
