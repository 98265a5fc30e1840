// kernel.h -- the target-neutral kernel emitter: one fused group of a plan as an LLVM function
//   i32 k(void **slots, i64 begin, i64 end)
// over the group's work items (0 or a runtime status code). kernel.cpp has the pointwise part
// (access patterns, loop nests, the ops), lower_reduce.cpp the row groups (each reduction an
// accumulator family with init/step/merge), lower_math.cpp the inline float32 math.
//
// What differs between machines is the *target*, a subclass answering the hooks at the end of
// the class: the CPU (jit/lower_cpu.cpp, CpuEmitter: vectors of the host's width, SLEEF, a
// kernel-local slot table, sizes as data, per-row scratch buffers) and NVIDIA GPUs
// (gpu/lower_ptx.cpp, PtxEmitter: one lane per thread, libdevice, a block of threads sharing a
// row and merging their states by warp shuffles). As LuaJIT keeps lj_asm.c apart from
// lj_asm_<arch>.h, nothing in this file or its .cpp files names an instruction set.
// Internal to the lowerings.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include "fuse.h"

namespace dynamo::jit::detail {

using namespace llvm;

struct EVal {
  Value *v;
  DType dt;
};

// One memory access pattern of a kernel: coefficients over the (collapsed) loop dims.
struct Pattern {
  int32_t slot;
  int64_t offset;
  DType dt;
  std::vector<int64_t> coef;  // over original domain dims, then over collapsed dims
  bool store = false;         // written by the kernel (never hoisted as a load)
  // The source of a gather (index): the coefficients give the part of the address the loop
  // dims decide; each indexed dim adds (its index, read from an index tensor) * stride, the
  // index checked against the dim's size. Never hoisted or prefetched.
  struct Indexed {
    int64_t stride, size;
  };
  std::vector<Indexed> indexed = {};
  bool gather = false;
  bool offsets32 = false;  // every element offset of the gather's source fits in int32 (dword gathers)
};

class KernelEmitter {
 public:
  KernelEmitter(Module &m, const Trace &t, const Plan &p, int gi)
      : M(m), C(m.getContext()), B(C), t(t), p(p), g(p.groups[gi]), gi(gi) {}
  virtual ~KernelEmitter() = default;

  // Emits the kernel; returns it (nullptr when the domain is empty).
  Function *emit(const std::string &name);
  int64_t outer_size() const { return dims.empty() ? 1 : dims[0].size; }
  int64_t numel() const { return total; }
  Function *partial() const { return part_fn; }  // split reductions: the parallel partial kernel
  const std::vector<int32_t> &slot_table() const { return local_slots; }  // what the caller passes
  const std::vector<int64_t> &slot_offsets() const { return local_offsets; }  // bytes added to each
  bool can_fail() const { return may_fail; }  // emitted code may set the runtime status (after emit)
  // Transcendental ops (exp, erf, tanh, ...) the kernel evaluates per element of its domain: a
  // measure of its work beside its element count (the caller's threshold for using threads).
  int math_ops() const;

 protected:
  struct Dim {
    int64_t size;
  };
  using State = std::vector<Value *>;  // an accumulator's state as values
  using MergeFn = std::function<State(const State &, const State &)>;
  using PackFn = std::function<Value *(Value *)>;               // a state component -> i64 bits
  using UnpackFn = std::function<Value *(Value *, llvm::Type *)>;

  // -- the target (a subclass): what the machine decides --
  // Lanes of the innermost loop's vectors (1: scalar code); all64: every access is 8 bytes.
  virtual int vector_lanes(bool all64) const = 0;
  // true: the kernel addresses a table of its own, filled by the caller (slot_table());
  // false: the trace's slot table itself, patterns keeping their element offsets.
  virtual bool own_slot_table() const = 0;
  virtual bool sizes_as_data() const = 0;   // see size()
  // A slot's pointer as the kernel's loads and stores use it (an address space, say).
  virtual Value *tensor_pointer(Value *p) { return p; }
  // A libm function (exp, log1p, pow, ...) of dtype d's compute type on L lanes.
  virtual Value *math(const char *fn, DType d, std::vector<Value *> args) = 0;
  // p * 2^n in one instruction where the machine has one (lower_math.cpp), else nullptr.
  virtual Value *native_scale_pow2(Value *, Value *) { return nullptr; }
  // The pointwise group over work items [arg 1, arg 2) of F: by default a loop nest over the
  // collapsed dims, dim 0 taking the range, the innermost vectorized (emit_nest, emit_inner).
  virtual void emit_pointwise_items();
  // Row groups: called once the dims are collapsed; may set row_threads (threads sharing a row).
  virtual void shape_rows() {}
  // Split reductions: threads sharing one chunk of the partial kernel, and sharing the merge of
  // `chunks` partial states (0: one thread walks it).
  virtual int split_partial_threads() const { return 0; }
  virtual int split_merge_threads(int64_t chunks) const { return 0; }
  // This thread's index among the row_threads sharing a row (only asked when row_threads > 0).
  virtual Value *thread_in_row() { fail(ErrorCode::Internal, "kernel target without threads per row"); }
  // Every thread's state merged across the row_threads sharing a row (in thread order).
  virtual State merge_row_threads(State s, const MergeFn &, const PackFn &, const UnpackFn &) { return s; }
  // Row caches (see below): a scratch buffer of `bytes` per kernel call, released at its end
  // (free_row_scratch runs at the end of every row kernel, with the buffers made). Without
  // them, the later stages compute the values again.
  virtual bool has_row_scratch() const { return false; }
  virtual Value *row_scratch(Value *) { fail(ErrorCode::Internal, "kernel target without scratch buffers"); }
  virtual void free_row_scratch(const std::vector<Value *> &) {}
  virtual bool prefetches_next_row() const { return false; }  // later passes over a row: see below
  virtual int store_pass_copies() const { return 1; }  // unrolled copies of a row's store pass
  virtual bool reorders_short_inner() const { return false; }  // see loop_order()

  Module &M;
  LLVMContext &C;
  mutable IRBuilder<> B;
  const Trace &t;
  const Plan &p;
  const Group &g;
  int gi;

  std::vector<Pattern> pats;                         // leaves first, then root stores
  std::map<std::pair<int32_t, Map>, int32_t> leaf_of;  // (value, map) -> pattern
  std::vector<int32_t> root_pat;
  std::vector<Dim> dims;                             // collapsed loop dims
  int64_t total = 0;
  int lanes = 16;
  Function *F = nullptr;
  Value *slots = nullptr;
  std::map<int32_t, Value *> base;                   // pattern slot -> base pointer
  // With a table of its own (own_slot_table), a kernel addresses the (slot, byte offset) pairs
  // it uses, in order of first use, which the trace function fills before each call with each
  // slot's pointer plus the offset: kernels that differ only in which slots they touch, or where
  // in them they start (the steps of an unrolled loop over slices), are then the same code,
  // compiled once. Each pattern's slot is then its table index and its offset 0 (fold_offsets).
  std::vector<int32_t> local_slots;                  // local index -> global slot
  std::vector<int64_t> local_offsets;                // local index -> bytes past the slot's pointer
  std::map<std::pair<int32_t, int64_t>, int32_t> local_of;  // (global slot, bytes) -> local index
  bool folded = false;
  void fold_offsets();
  int32_t local_index(int32_t global, int64_t bytes);
  Value *slot_addr(int32_t global);                  // &table[the slot] in the current function
  Value *local_addr(int32_t index);                  // &table[index]
  Value *flag = nullptr;                             // alloca i32: runtime error code
  bool may_fail = false;                             // code that can set it was emitted (integer floor division)
  // Sizes as data (sizes_as_data): a number that follows from the trace's sizes (a loop bound,
  // a stride, a row cache's bytes) is read from an entry of the kernel's table that the trace
  // function fills, instead of being a constant of the code. Kernels that differ only in such
  // numbers are then the same code, and so are whole traces recorded at other sizes
  // (Engine::compile shares their machine code). size(v) gives that load (or the constant v
  // when sizes are not data); it may be called anywhere in the function. Any number not passed
  // through size() stays a constant, so it is part of the code and two traces share code only
  // where it agrees: sharing is never wrong, only less frequent.
  Instruction *param_ip = nullptr;                   // the entry block's first non-size instruction
  Value *size(int64_t v);
  Value *size_f(int64_t v, llvm::Type *fty);         // the same number as a float of type fty
  Value *lane_offsets(int64_t c, Value *step);       // {0, c, 2c, ...} for L lanes, c read as data when sizes are
  MDNode *scope_read = nullptr, *scope_write = nullptr;

  // Per inner-loop body:
  std::vector<Value *> outer_off;                    // per pattern, offset from outer loops
  std::map<int32_t, Value *> hoisted;                // pattern -> scalar loaded before the loop
  std::map<std::pair<int32_t, Map>, EVal> memo;
  int L = 1;
  Value *jidx = nullptr;

  bool inline_value(int32_t v) const {
    const Inst &in = t.insts[t.def[v]];
    if (op_info(in.op).kind != OpKind::POINTWISE && op_info(in.op).kind != OpKind::GATHER) return false;
    return !p.materialized[v] || p.group_of[v] == gi;
  }
  Map compose(const Map &m, int32_t v, size_t k) const { return operand_map(t, v, k, m); }  // operand k of v
  static bool gather_source(const Inst &in, size_t k) { return in.op == Op::index && k == 0; }
  std::map<std::pair<int32_t, Map>, int32_t> gather_of;  // (gather value, its map) -> its source's pattern
  bool own_reduction(int32_t v) const {
    return op_info(t.insts[t.def[v]].op).kind == OpKind::REDUCTION && p.group_of[v] == gi;
  }
  void collect(int32_t v, const Map &m, std::map<std::pair<int32_t, Map>, char> &seen);
  void collapse();
  void merge_dims(const std::vector<int> &which, std::vector<std::vector<int64_t>> &nc);
  std::vector<int> loop_order(const std::vector<int> &order);
  void begin_function(const std::string &name);
  // A loop skeleton: its index starts at `from`, the body (emitted between the two calls) runs
  // while cond(index) holds, and close_loop gives the next iteration's index and leaves the
  // builder after the loop. Blocks: name, name_body, name_exit.
  struct Loop {
    PHINode *i;
    BasicBlock *head, *exit;
  };
  Loop open_loop(Value *from, const std::function<Value *(Value *)> &cond, const std::string &name);
  void close_loop(const Loop &l, Value *next);
  void emit_nest(size_t d, size_t stop, Value *begin, Value *end, const std::function<void(Value *, Value *)> &at_stop);
  // The innermost loop over dims[d]: vectors of `lanes` then a scalar tail, body(lanes_now).
  // Blocked accumulation: whole blocks of `iters` unrolled iterations run between begin() and
  // end() (a reduction's cascade: plain adds into block sums, folded into compensated totals).
  struct Blocking {
    int iters;
    std::function<void()> begin, end;
  };
  bool in_block = false;
  // Threads sharing a row (row_threads > 0, set by the target's shape_rows): thread t takes
  // elements t, t + row_threads, ... of the innermost reduced dim, the same split in every pass.
  int row_threads = 0, part_row_threads = 0;
  bool thread_copies = false;  // such a row loop unrolled: scalar bodies use the per-copy accumulators
  // Rows that split evenly over the threads (at most 32 elements each) are walked by
  // straight-line code; element `share_elem` of this thread's share is loaded once per pattern
  // and kept in registers for the later passes over the row (softmax reads x once, not 3x).
  int share_elem = -1;
  std::map<std::pair<int32_t, int>, Value *> row_regs;
  void emit_inner(size_t d, Value *begin, Value *end, const std::function<void(int)> &body, int unroll = 1,
                  const Blocking *blk = nullptr);
  int copy_index = 0;  // which unrolled copy the body is emitting (independent accumulators)
  // Row groups: later passes over a row (served from cache) prefetch the same position of the
  // next row, so DRAM traffic stays in flight while a row is being finished.
  bool prefetch_next_row = false;
  void emit_prefetch_next_row();
  void emit_body(int lanes_now);
  Map identity() const;

  // -- row groups (lower_reduce.cpp) --
  Function *emit_row(const std::string &name);
  size_t n_outer = 0;                                // dims[0, n_outer) are kept, the rest reduced
  std::map<int32_t, EVal> reg;                       // this row's reduction results
  std::map<int32_t, std::vector<int32_t>> row_pat;   // row root index -> pattern
  Value *rflat = nullptr;                            // flat reduced index of the current R iteration
  // Row cache: an expensive full-shape value used by several stages of a row is computed by
  // the first and kept in a per-row scratch buffer (L1/L2 resident) for the later ones.
  struct Cached {
    Value *ptr;
    int first;
    DType dt;
  };
  std::map<int32_t, Cached> row_cache;
  int stage = -1;
  void plan_row_cache();
  // Split reductions: the partial kernel (parallel over chunks) and the range it reduces.
  enum class Split { None, Partial, Merge } split = Split::None;
  Function *part_fn = nullptr;
  Value *split_lo = nullptr, *split_hi = nullptr, *split_chunk = nullptr;
  int32_t reduction_index = 0;
  Function *emit_split(const std::string &name);
  void collapse_row();
  void emit_row_body();
  void store_row_roots();
  void emit_r_loops(size_t d, const std::function<void(int)> &body, int unroll = 1, const Blocking *blk = nullptr);
  // also_mean: a mean of the same input, taken from this var/std's Welford state (one pass).
  void emit_reduction(int32_t r, int32_t also_mean = -1);
  Value *alloca_at_entry(llvm::Type *ty);
  // The accumulator families (lower_reduce.cpp): compensated sums, plain folds, min/max with a
  // NaN mask, argmin/argmax, Welford and shifted sums; each with init, step, read, merge, finish.
  struct Accumulator;
  struct CompensatedSum;
  struct Fold;
  struct MinMaxNan;
  struct ArgBest;
  struct Welford;
  struct ShiftedSums;
  std::unique_ptr<Accumulator> accumulator_for(const Inst &in, int64_t extent);

  // -- values --
  llvm::Type *scalar_ty(DType d) const {
    switch (d) {
      case DType::Bool: return B.getInt1Ty();
      case DType::I32: return B.getInt32Ty();
      case DType::I64: return B.getInt64Ty();
      case DType::F32: return B.getFloatTy();
      case DType::F64: return B.getDoubleTy();
      case DType::F16: case DType::BF16: return B.getFloatTy();  // registers hold float32
    }
    return nullptr;
  }
  llvm::Type *mem_ty(DType d) const {
    if (d == DType::F16) return B.getHalfTy();
    if (d == DType::BF16) return B.getBFloatTy();
    return d == DType::Bool ? B.getInt8Ty() : scalar_ty(d);
  }
  // Bytes of one element as held in registers (and in row caches): half types widen to float32.
  static int64_t reg_bytes(DType d) { return is_half(d) ? 4 : dtype_bytes(d); }
  llvm::Type *vec_ty(DType d) const {
    llvm::Type *s = scalar_ty(d);
    return L == 1 ? s : (llvm::Type *)FixedVectorType::get(s, L);
  }
  Value *splat(Value *s) { return L == 1 ? s : B.CreateVectorSplat(L, s); }
  // A register value of dtype d as stored in memory (bool -> i8, half/bfloat16 narrowed).
  Value *to_memory(Value *v, DType d) {
    if (d != DType::Bool && !is_half(d)) return v;
    llvm::Type *mt = L == 1 ? mem_ty(d) : (llvm::Type *)FixedVectorType::get(mem_ty(d), L);
    if (d == DType::BF16) return B.CreateBitCast(bf16_bits(v), mt);
    return d == DType::Bool ? B.CreateZExt(v, mt) : B.CreateFPTrunc(v, mt);
  }
  // float32 (or <L x float>) to bfloat16 bits, rounded to nearest even as c10::BFloat16 does,
  // subnormals kept (a hardware conversion such as AVX512-BF16's flushes them to zero) and NaN
  // made the quiet 0x7fc0.
  Value *bf16_bits(Value *f) {
    llvm::Type *i32 = f->getType()->isVectorTy() ? (llvm::Type *)FixedVectorType::get(B.getInt32Ty(), L) : B.getInt32Ty();
    llvm::Type *i16 = f->getType()->isVectorTy() ? (llvm::Type *)FixedVectorType::get(B.getInt16Ty(), L) : B.getInt16Ty();
    auto c32 = [&](uint32_t x) { return ConstantInt::get(i32, x); };
    Value *bits = B.CreateBitCast(f, i32);
    Value *lsb = B.CreateAnd(B.CreateLShr(bits, c32(16)), c32(1));
    Value *rounded = B.CreateLShr(B.CreateAdd(B.CreateAdd(bits, c32(0x7fff)), lsb), c32(16));
    // (NaN tested on the bits: a float compare of a value widened from bfloat16 is folded by
    // LLVM into a bfloat16 compare, which x86 has no vector form of -- 16 scalar compares)
    Value *nan = B.CreateICmpUGT(B.CreateAnd(bits, c32(0x7fffffff)), c32(0x7f800000));
    return B.CreateSelect(nan, ConstantInt::get(i16, 0x7fc0), B.CreateTrunc(rounded, i16));
  }
  // bfloat16 bits back to float32 (exact).
  Value *bf16_to_float(Value *h) {
    llvm::Type *i32 = h->getType()->isVectorTy() ? (llvm::Type *)FixedVectorType::get(B.getInt32Ty(), L) : B.getInt32Ty();
    llvm::Type *f32 = h->getType()->isVectorTy() ? (llvm::Type *)FixedVectorType::get(B.getFloatTy(), L) : B.getFloatTy();
    return B.CreateBitCast(B.CreateShl(B.CreateZExt(h, i32), ConstantInt::get(i32, 16)), f32);
  }
  EVal cst(DType d, double x) {
    if (!is_float(d))  // saturating: (int64_t) of 2^63 or NaN is undefined
      return icst(d, x != x ? 0 : x >= 0x1p63 ? INT64_MAX : x < -0x1p63 ? INT64_MIN : (int64_t)x);
    return {splat(ConstantFP::get(scalar_ty(d), x)), d};
  }
  // An integer constant, exactly (an int64 literal past 2^53 has no double).
  EVal icst(DType d, int64_t x) {
    if (is_float(d)) return cast(icst(DType::I64, x), d);
    return {splat(ConstantInt::get(scalar_ty(d), (uint64_t)x, true)), d};
  }
  EVal cast(EVal x, DType to);
  llvm::Value *round_to(llvm::Value *f, DType narrow);  // f (float32) rounded to float16/bfloat16, as float32
  EVal operand(int32_t v, const Map &m, const Operand &o, DType as);
  EVal value(int32_t v, const Map &m);
  EVal load(int32_t pat);
  EVal gather(int32_t v, const Map &m);  // index(x, first, %i...) at map m: an indirect load of x
  // Does v at map m hold one value across the lanes of the innermost loop (none of its leaves
  // moves along it)? false when unsure (an expression deeper than `depth`).
  bool uniform_inner(int32_t v, const Map &m, int depth = 32);
  std::map<std::pair<int32_t, Map>, bool> uniform_memo;
  EVal compute(int32_t v, const Map &m);
  void prime(int32_t v, const Map &m);
  bool priming = false;  // inside prime(): operands are computed deepest first already
  Value *fisnan(Value *x) { return B.CreateFCmpUNO(x, x); }
  // Inline float32 math (lower_math.cpp); x is a float or <L x float>.
  Value *f32c(double x);
  Value *i32c(int32_t x);
  Value *fma32(Value *a, Value *b, Value *c);
  Value *min_c(Value *x, double c);  // min(x, c) and max(x, c); NaN x stays NaN
  Value *max_c(Value *x, double c);
  Value *horner(Value *x, const float *c, int n);  // c[0] + x c[1] + ... + x^(n-1) c[n-1]
  Value *scale_pow2(Value *p, Value *n);           // p * 2^n, n integer-valued
  // flush_subnormal: results below float32's normal range (x < ln FLT_MIN) are 0 (exp_flush).
  Value *exp_f32(Value *x, bool flush_subnormal = false);
  Value *erf_f32(Value *x);
  Value *tanh_f32(Value *x);
  Value *sigmoid_f32(Value *x);
  // In dtype d's compute type: inline for float32 (and the half types), the target's math for float64.
  Value *exp_of(DType d, Value *x) { return d == DType::F64 ? math("exp", d, {x}) : exp_f32(x); }
  Value *erf_of(DType d, Value *x) { return d == DType::F64 ? math("erf", d, {x}) : erf_f32(x); }
  Value *tanh_of(DType d, Value *x) { return d == DType::F64 ? math("tanh", d, {x}) : tanh_f32(x); }
  // Loads and stores promise LLVM that reads and writes do not overlap, except in a slot the
  // kernel both reads and writes (in-place writes of one group, each element read where it is
  // written): those carry no promise, so no load moves below a store of the same element.
  std::vector<int32_t> inplace_slots;
  void decorate(Instruction *I, bool is_store, int32_t slot) {
    if (std::find(inplace_slots.begin(), inplace_slots.end(), slot) != inplace_slots.end()) return;
    I->setMetadata(LLVMContext::MD_alias_scope, is_store ? scope_write : scope_read);
    I->setMetadata(LLVMContext::MD_noalias, is_store ? scope_read : scope_write);
  }
};

}  // namespace dynamo::jit::detail
