// ir.h -- the trace IR: dtypes, value types, operands, instructions and traces (DESIGN.md §4).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dynamo::jit {

/* -- Element types -- */
enum class DType : uint8_t { Bool = 0, I32 = 1, I64 = 2, F32 = 3, F64 = 4, F16 = 5, BF16 = 6 };
constexpr int kNumDTypes = 7;
// The most dimensions a tensor may have at the engine's boundary (inputs, outputs); the C API's
// DYNAMO_MAX_DIMS (capi.cpp checks that they agree).
constexpr int kMaxDims = 16;

const char *dtype_name(DType t);          // "f32"
bool dtype_from_name(const std::string &s, DType *out);
int dtype_bytes(DType t);
inline bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }
// float16/bfloat16 compute in float32, each op's result rounded to its type (as eager rounds it).
inline bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }
inline bool is_int(DType t) { return t == DType::I32 || t == DType::I64; }

/* -- Ops: generated from ops.def -- */
enum class OpKind : uint8_t { INPUT, POINTWISE, REDUCTION, VIEW, EXTERN, GATHER };
enum class DRule : uint8_t { PROMOTE, FLOAT, FLOATONLY, COMPARE, LOGICAL, CAST, RSUM, RSAME, RFLOAT, RINDEX, NONE };

enum class Op : uint16_t {
#define X(name, kind, arity, rule) name,
#include "ops.def"
#undef X
  NUM_OPS
};

struct OpInfo {
  const char *name;
  OpKind kind;
  int arity;
  DRule rule;
};
const OpInfo &op_info(Op op);
bool op_from_name(const std::string &s, Op *out);

/* -- Devices -- */
enum class DeviceKind : uint8_t { CPU = 0, CUDA = 1 };
struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int32_t index = 0;
  bool operator==(const Device &o) const { return kind == o.kind && index == o.index; }
};

/* -- Value types -- */
struct Type {
  bool tensor = true;
  DType dtype = DType::F32;
  std::vector<int64_t> sizes;    // tensors only
  std::vector<int64_t> strides;  // inputs only (elements); empty = contiguous
  Device device;                 // inputs only
  bool requires_grad = false;    // inputs only
  bool weight = false;           // inputs only: a module's parameter or buffer (what is computed from
                                 // weights alone is kept across calls: Plan::step_kept)

  int64_t numel() const;
  int rank() const { return (int)sizes.size(); }
  bool same_shape(const Type &o) const { return sizes == o.sizes; }
};
std::vector<int64_t> contiguous_strides(const std::vector<int64_t> &sizes);
// Why tensor type ty cannot be addressed with int64 byte offsets ("" when it can): more than
// kMaxDims dimensions, a negative
// size, or more than 2^63 - 1 bytes (sizes x element bytes; with strides, up to the furthest
// element). The verifier holds every value of a trace to it, the builder every input.
std::string type_size_problem(const Type &ty);

/* -- Operands -- */
struct Operand {
  // TensorList: an extern's list argument (`[%a, %b]`, ATen's Tensor[] / Tensor?[]) is this
  // marker, with i = n, followed in args by its n elements (Value or None operands), so every
  // pass that walks operands sees the values the list uses.
  enum Kind : uint8_t { Value, Int, Float, Bool, None, IntList, Ident, Str, TensorList } kind = None;
  int32_t value = -1;         // Value
  int64_t i = 0;              // Int, Bool, TensorList (element count)
  double f = 0;               // Float
  std::vector<int64_t> list;  // IntList
  std::string s;              // Ident, Str

  static Operand val(int32_t v) { Operand o; o.kind = Value; o.value = v; return o; }
  static Operand integer(int64_t v) { Operand o; o.kind = Int; o.i = v; return o; }
  static Operand real(double v) { Operand o; o.kind = Float; o.f = v; return o; }
  static Operand boolean(bool v) { Operand o; o.kind = Bool; o.i = v; return o; }
  bool is_scalar_literal() const { return kind == Int || kind == Float || kind == Bool; }
};

/* -- Instructions and traces -- */
struct Inst {
  Op op = Op::input;
  std::vector<int32_t> results;    // value ids defined here
  std::vector<Operand> args;
  std::string callee;              // extern: "aten::addmm" or "aten::add.Tensor"
  bool has_guard_value = false;    // input scalar: guarded to equal guard_value
  Operand guard_value;
};

struct Trace {
  std::string name = "trace";
  std::vector<Type> types;         // by value id
  std::vector<int32_t> def;        // value id -> defining instruction index
  std::vector<Inst> insts;
  std::vector<int32_t> inputs;     // value ids of input instructions, in slot order
  std::vector<int32_t> outputs;    // value ids returned

  int32_t new_value(const Type &t, int32_t inst) {
    types.push_back(t);
    def.push_back(inst);
    return (int32_t)types.size() - 1;
  }
};

// Each value's readers: (instruction index, operand index) per Value operand, in trace order
// (ir.cpp). The planner and passes.cpp walk a value's uses with it.
using ValueUsers = std::vector<std::vector<std::pair<int32_t, int32_t>>>;
ValueUsers value_users(const Trace &t);

/* Errors inside the JIT are exceptions of this type; capi/ turns them into statuses. */
enum class ErrorCode : uint8_t { Parse, Verify, Compile, Unsupported, Runtime, Internal };
struct Error : std::runtime_error {
  ErrorCode code;
  Error(ErrorCode c, const std::string &m) : std::runtime_error(m), code(c) {}
};
[[noreturn]] void fail(ErrorCode c, const std::string &msg);
// Failure injection for tests: DYNAMO_FAULT=<name>[,<name>...] ("compile", "sleef", "alloc").
bool fault_injected(const char *name);

/* -- Stages (one file each, in pipeline order) -- */
std::string print_trace(const Trace &t);                        // text.cpp
Trace parse_trace(const std::string &text);                     // text.cpp
// Parses one instruction line (no "%r =" prefix) and appends it to t; returns first result.
int32_t parse_instruction_into(Trace &t, const std::string &line);
std::string print_operand(const Operand &o);
std::string format_double(double v);  // shortest text that reads back exactly ("0.1", "1e-10")
std::string print_type(const Type &t, bool input);

// verify.cpp: infers the result types of inst (operands already defined) or throws Verify
// naming the instruction. annotated: result types written in the text, if any.
std::vector<Type> infer_types(const Trace &t, const Inst &inst, const std::string &where);
void verify_trace(const Trace &t);
DType promote_types(DType a, DType b);
// ATen's result_type over operands (tensors with dims, zero-dim tensors, Python scalars).
DType result_type(const Trace &t, const std::vector<const Operand *> &ops);
// A reduction's normalized reduced dims (sorted, unique) and keepdim flag.
struct ReduceInfo {
  std::vector<int64_t> dims;
  bool keepdim = false;
  int64_t correction = 0;  // var/std
};
ReduceInfo reduce_info(const Trace &t, const Inst &in);
bool broadcast_shapes(const std::vector<int64_t> &a, const std::vector<int64_t> &b,
                      std::vector<int64_t> *out);

// passes.cpp: dead code elimination and common subexpression elimination, in place.
void simplify_trace(Trace &t);
// passes.cpp: a softmax whose probabilities only matrix products read computes them with
// exp_flush (no subnormals); returns how many. CPU traces, after decompose_externs.
int flush_softmax_subnormals(Trace &t);
// decompose.cpp: rewrites externs we generate ourselves (softmax, layer norm, ...) into trace
// ops, in place; returns how many were rewritten. conv_as_mm: a 2-D 1x1 convolution of one
// image becomes a matrix product (false where layout.cpp makes it a channels-last convolution).
int decompose_externs(Trace &t, bool conv_as_mm = true);
// layout.cpp (CPU): 2-D and 3-D float32 convolutions become dynamo::conv_nhwc and the work between them
// runs on [N, H, W, C] values; returns how many convolutions (0: the trace is unchanged).
// DYNAMO_LAYOUT=nchw turns it off (nhwc_layouts_enabled).
int nhwc_layouts(Trace &t);
bool nhwc_layouts_enabled();

}  // namespace dynamo::jit
