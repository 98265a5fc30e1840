// fuse.h -- the fusion plan: which values are computed inline, which are materialized into
// buffers, how views fold into strided indexing, and the ordered steps (kernels, externs).
#pragma once

#include "ir.h"

namespace dynamo::jit {

// Where a buffer-backed value lives: element (offset + sum_k idx_k * strides[k]) of slot.
struct BufferView {
  int32_t slot = -1;
  int64_t offset = 0;
  std::vector<int64_t> strides;  // per dimension of the value, in elements
};

struct Root {            // one value a kernel stores, contiguous, into a slot
  Root() = default;
  Root(int32_t v, int32_t s) : value(v), slot(s) {}
  int32_t value = -1;
  int32_t slot = -1;
  bool strided = false;   // copy_: stored through `dest` (a view of an input) instead
  BufferView dest;
  bool optional = false;  // an output that aliases an input: skipped if the caller passes NULL
};

// A value's index as a function of a loop nest's domain index: for each dim of the value, the
// domain dim it follows, or -1 (index 0: a broadcast or size-1 dim).
using Map = std::vector<int32_t>;
// The map of `operand` (broadcast right-aligned into `user`) given the user's map.
Map compose_map(const Type &user, const Type &operand, const Map &m);
// The map operand k of value v's instruction is read with, given v's map m: compose_map for a
// pointwise op. For index (a gather) the source x follows v's dims outside the indexed block
// and has -1 on the indexed dims (their positions come from the index tensors: an indirect
// load), and each index tensor is broadcast right-aligned into the block's dims.
Map operand_map(const Trace &t, int32_t v, size_t k, const Map &m);

// One fused loop nest. A pointwise group runs over `domain`. A row group runs over the kept
// dims of `domain` and, for each such row, over the reduced dims `rdims` once per reduction
// (in order, each result staying in a register), then once more to store the full-shape roots.
struct Group {
  bool row = false;
  std::vector<int64_t> domain;
  std::vector<int64_t> rdims;       // row groups: reduced dims of domain (sorted)
  std::vector<int32_t> reductions;  // row groups: in stage order
  std::vector<Root> roots;          // stored over the whole domain
  std::vector<Root> row_roots;      // row groups: stored once per row (reductions, row scalars)
  int32_t optional_slot = -1;       // runs only if this output slot is non-NULL (copy elision)
  // Split reduction: a whole-tensor reduction is cut into `split_chunks` pieces reduced in
  // parallel into partial states (scratch slot `split_slot`), then merged by one thread.
  int32_t split_chunks = 0;
  int32_t split_slot = -1;
};

// An output whose memory, after the call, is part of an input (the input itself, a view of it,
// or the result of an in-place write into it). The caller may skip the copy and make the view.
struct OutputAlias {
  int32_t input = -1;
  BufferView view;  // slot == input
};

// For a row group, the map a value of shape `shape` is read with when it is "this row's"
// value (keepdim or reduced-away shape); empty if `shape` is neither.
Map row_map(const Group &g, const std::vector<int64_t> &shape);

struct ExternArg {       // how to build one argument of an extern call
  Operand lit;           // literal operands (kind != Value)
  bool is_list = false;  // a tensor list: its elements (tensors, or None literals) in `elems`
  std::vector<ExternArg> elems;
  bool is_tensor = false;
  bool is_scalar_slot = false;
  int32_t value = -1;
  BufferView view;       // tensors
  int32_t slot = -1;     // scalar inputs
};

// The side exit is the IR's guard op (ops.def): `%g = guard(%cond, expected, exit_id, %live...)
// : bool[]`. %cond is a one-element bool tensor; when it differs from `expected` the trace stops
// there and returns exit `exit_id` with copies of the %live tensors (the state the interpreter
// resumes from). In-place writes before a guard are done before it. It is planned as an extern
// step (ExternStep::is_exit) between kernels; the trace's exits table: side_exits().
struct SideExit {
  int32_t inst = -1;      // the guard instruction
  int32_t live = 0;       // live values it hands back
};
std::vector<SideExit> side_exits(const Trace &t);  // by exit id

struct ExternStep {
  int32_t inst;                      // index into the trace
  bool is_exit = false;              // a side exit (the guard op), run by the runtime, not LibTorch
  std::string callee;                // "guard" for a side exit
  std::vector<ExternArg> args;
  std::vector<int32_t> result_values;
  std::vector<int32_t> result_slots;
};

struct Step {
  enum Kind : uint8_t { Kernel, Extern } kind;
  int32_t index;  // into groups or externs
};

struct Plan {
  int32_t num_inputs = 0, num_outputs = 0, num_slots = 0;
  std::vector<int64_t> scratch_bytes;      // by slot (0 = not scratch)
  std::vector<Group> groups;
  std::vector<ExternStep> externs;
  std::vector<Step> steps;
  // Per value:
  std::vector<char> buffer_backed;          // has a BufferView (input, extern, view, materialized)
  std::vector<BufferView> views;
  std::vector<int32_t> group_of;            // group computing a pointwise value (if materialized)
                                            // or a reduction; -1 otherwise
  std::vector<char> materialized;
  std::vector<int32_t> scalar_slot;         // scalar inputs: their slot
  std::vector<int32_t> mutated_inputs;      // input slots written by copy_ (checked for aliasing)
  std::vector<OutputAlias> output_alias;    // by output
  // Per output: the slot of the extern result it is (its copy into the output runs only when
  // the caller passed a buffer: a CPU dynamo_entry_run_alloc hands out the extern's own tensor
  // instead), or -1. Only in traces without side exits (a side trace given the root's outputs
  // would not know).
  std::vector<int32_t> output_extern_slot;
  // Kept steps (PlanOptions::kept_steps): steps that compute from weight inputs alone
  // (parameters and buffers: `input ... weight`) and constants, with no random op among them,
  // writing scratch only (no output, no input, no extern result handed out). A run skips them
  // when every weight they read is what the last complete run read (the runtime compares the
  // weights' addresses, versions and sampled contents); their results stay in their slots,
  // which persist across calls (slot_kept). Empty when the plan keeps nothing.
  std::vector<char> step_kept;        // per step
  std::vector<char> slot_kept;        // per slot: written by a kept step
  std::vector<int32_t> kept_weights;  // the input slots the kept steps read (directly or not)
};

struct PlanOptions {
  // Whole-tensor reductions of 2^18+ elements are cut into this many partial reductions
  // (CPU: a few per thread; GPU: a few per multiprocessor, gpu::kSplitChunks).
  int32_t split_chunks = 32;
  // Plan::output_extern_slot (CPU: the runtime can hand out an extern's own tensor; the GPU
  // program writes a product's result straight into the output instead).
  bool extern_outputs = true;
  // Plan::step_kept (CPU: the runtime skips those steps while their weights are unchanged).
  bool kept_steps = false;
};

// Partitions a verified, simplified trace. Slots: inputs [0, nin), outputs [nin, nin+nout),
// then scratch buffers and extern results.
Plan plan_trace(const Trace &t, const PlanOptions &opt = {});

}  // namespace dynamo::jit
