// entry.h -- one compiled trace in a frame's cache: its plan, guards, machine code, extern
// operator handles, and the run path (validate, fill slots, call native code).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "dynamo.h"
#include "guards/guards.h"
#include "jit/engine.h"
#include "jit/fuse.h"
#include "runtime/buffer_pool.h"

namespace dynamo::gpu {
class Device;
class Loaded;
}  // namespace dynamo::gpu

namespace dynamo::runtime {

struct ExternOps;  // resolved LibTorch operators (aten_extern.cpp)

// A side exit taken by a run: its id and copies of its live values (owned until handed on).
struct Exit {
  const struct Entry *entry = nullptr;  // the entry whose guard failed (a side trace's, when linked)
  int32_t id = -1;
  std::vector<DLManagedTensor *> values;
  void clear() {
    for (DLManagedTensor *m : values)
      if (m && m->deleter) m->deleter(m);
    values.clear();
    id = -1;
    entry = nullptr;
  }
  ~Exit() { clear(); }
};

// Per-call state handed to generated code as its `ctx`.
struct RunContext {
  const struct Entry *entry = nullptr;
  std::vector<std::shared_ptr<void>> keep;  // extern results alive until the call returns
  std::string error;                        // set when a helper fails
  int num_threads = 0;                      // 0 = LibTorch's; 1 = serial
  const dynamo_arg *args = nullptr;         // the call's arguments (slots 0 .. nargs - 1)
  size_t nargs = 0;
  Exit exit;                                // set by a failing guard (side exit)
  int64_t profile_at = 0;                   // DYNAMO_PROFILE: the last mark (steady clock, ns)
  int32_t profile_step = -1;                // and the step it began (-1: none)
  bool profile_on = false;                  // this run is counted (Entry::profile_this_run)
  // Results of kept extern steps (plan.step_kept) this run made: (slot, data, the tensor).
  struct KeptResult {
    int32_t slot;
    void *data;
    std::shared_ptr<void> tensor;
  };
  std::vector<KeptResult> kept_results;
};

// DYNAMO_PROFILE: the time one plan step took over all runs, and how often it ran.
struct StepTime {
  std::atomic<int64_t> ns{0}, runs{0};
};

struct Entry {
  jit::Trace trace;          // simplified
  jit::Plan plan;
  guards::GuardSet guards;
  jit::CompiledCode code;
  std::shared_ptr<ExternOps> externs;
  int num_threads = 0;
  dynamo_entry_stats stats{};
  // Side exits (guard ops): ids are 0 .. num_exits - 1; how often each was taken.
  int32_t num_exits = 0;
  std::vector<jit::SideExit> exits;  // the trace's exits table, by id (jit::side_exits)
  std::unique_ptr<std::atomic<int64_t>[]> exit_counts;
  // Side traces linked to each exit: tried in order (their own guards decide) with this entry's
  // arguments followed by the exit's live values; the first that accepts finishes the call.
  // Copy-on-write so that runs read them without a lock.
  using Links = std::vector<std::vector<const Entry *>>;
  mutable std::shared_ptr<const Links> links;
  mutable std::mutex link_mu;
  const void *api_handle = nullptr;  // the C API's dynamo_entry for this entry
  // A CUDA entry (engine created with device_type kDLCUDA): its program loaded on the device;
  // runs take the device's tensors and are serialized per entry (one slot table).
  std::shared_ptr<gpu::Device> gpu_device;
  std::shared_ptr<gpu::Loaded> gpu;
  mutable std::mutex gpu_mu;
  // Kept steps (plan.step_kept): what the last complete run computed from the weights, kept
  // while they stay the same. Null when the plan keeps nothing.
  struct Kept {
    std::shared_mutex mu;  // a run that skips the kept steps reads them shared; one that computes them, alone
    bool valid = false;    // the kept slots hold what the weights described by `keys` give
    std::vector<std::string> keys;  // per plan.kept_weights: address, version and sampled bytes
    std::vector<RunContext::KeptResult> results;  // the kept extern steps' results
    std::vector<size_t> offset;  // per slot: where a kept kernel result lives in `memory`
    void *memory = nullptr;
    ~Kept();
  };
  // Shared by the entries of one machine code whose kept steps are the same (a size family's
  // instances: the same weights packed once, not once per instance; kept_registry in entry.cpp).
  std::shared_ptr<Kept> kept;
  mutable std::atomic<int64_t> kept_computes{0};  // complete runs that computed the kept steps
  // DYNAMO_PROFILE=1 (jit::profile_enabled): time per plan step (null otherwise), and of the
  // trace function per run; entry_profile() reports them.
  std::unique_ptr<StepTime[]> step_times;
  mutable StepTime run_time;
  mutable std::atomic<int32_t> profile_warm{0};
  // Whether a run starting now is counted: not while a convolution or product step still times
  // its choices (it runs every implementation then), nor the first run after they chose.
  bool profile_this_run() const;
  ~Entry();
  int32_t exit_live_count(int32_t id) const;  // live values of exit `id`

  // Runs with already-checked guards; returns a status and sets *msg on failure. Scratch
  // memory comes from pool (may be null: plain allocation). DYNAMO_EXIT: a side exit was
  // taken; its id and live values go to *exit (freed if exit is null), outputs are not written.
  // handed (CPU; dynamo_entry_run_alloc): an output whose plan.output_extern_slot is set may be
  // passed with data NULL; handed[k] then receives the extern's own result tensor (the caller
  // owns it; no copy is made). Set only when the call returns DYNAMO_OK.
  dynamo_status run(const dynamo_arg *args, size_t nargs, const DLTensor *outs, size_t nouts,
                    BufferPool *pool, std::string *msg, Exit *exit = nullptr,
                    DLManagedTensor **handed = nullptr) const;
};

// Compiles a verified trace into an entry (throws jit::Error).
std::unique_ptr<Entry> compile_entry(jit::Engine &engine, const jit::Trace &trace,
                                     const std::string &fn_name, int num_threads);
// The same for a CUDA device: PTX for the device's arch, loaded as a module. Inputs must be
// declared on that device; traces with extern ops (LibTorch, side exits) are Unsupported.
std::unique_ptr<Entry> compile_gpu_entry(const std::shared_ptr<gpu::Device> &dev, const jit::Trace &trace,
                                         const std::string &fn_name);

// Each instruction of t as its line of the trace's text (jit::print_trace).
std::vector<std::string> trace_inst_lines(const jit::Trace &t);

// LibTorch side (aten_extern.cpp).
std::shared_ptr<ExternOps> resolve_externs(const jit::Trace &t, const jit::Plan &p);
// Entry e's product steps take the state of the same steps of earlier entries of the machine
// code `code` (see there).
void share_extern_steps(Entry &e, const void *code);
// The extern result of this call whose memory starts at `data`, as a DLPack tensor sharing it
// (a copy when it is a view of memory the call borrowed: an input, an output, scratch; nullptr
// when the call kept no such tensor).
DLManagedTensor *hand_out_extern_result(const RunContext &ctx, const void *data);
// The measured choices of an entry's convolution and product steps, for a later process:
// "<step>=<choice>" separated by spaces (conv: onednn | winograd | packed | aten; product: own | blas), steps still
// timing left out. set_entry_choices applies such a text; false with *why for a malformed one
// or a step that is not of that kind (then nothing is changed).
std::string entry_choices(const Entry &en);
// What extern step k chose by timing ("onednn", "winograd", "packed", "aten", "own", "blas", "timing"), or
// "" for a step that makes no choice.
std::string extern_choice(const Entry &en, size_t k);
// DYNAMO_PROFILE's times of an entry, as text: a first line "runs <n> <ns>" (runs of the trace
// function and their total time), then one line per plan step that ran,
// "step <i> <runs> <ns> <what>" (<what>: jit::step_summary). "" when the entry was not profiled.
std::string entry_profile(const Entry &en);
bool set_entry_choices(const Entry &en, const std::string &text, std::string *why);
// Host symbols generated code calls (dynamo_rt_*), for the engine.
std::map<std::string, void *> runtime_symbols();

}  // namespace dynamo::runtime
