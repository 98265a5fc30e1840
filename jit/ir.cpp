// ir.cpp -- tables generated from ops.def, dtype names, small helpers of the trace IR.
#include "ir.h"

#include <cstdlib>

#include <cstring>
#include <string_view>

namespace dynamo::jit {

static const OpInfo kOps[] = {
// The C++ enumerator for the keyword `extern` is extern_; its text name is "extern".
#define X(name, kind, arity, rule) {std::string_view(#name) == "extern_" ? "extern" : #name, OpKind::kind, arity, DRule::rule},
#include "ops.def"
#undef X
};

const OpInfo &op_info(Op op) { return kOps[(int)op]; }

bool op_from_name(const std::string &s, Op *out) {
  for (int i = 0; i < (int)Op::NUM_OPS; ++i)
    if (s == kOps[i].name) { *out = (Op)i; return true; }
  return false;
}

static const char *kDTypeNames[] = {"bool", "i32", "i64", "f32", "f64", "f16", "bf16"};

const char *dtype_name(DType t) { return kDTypeNames[(int)t]; }

bool dtype_from_name(const std::string &s, DType *out) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (s == kDTypeNames[i]) { *out = (DType)i; return true; }
  return false;
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
    case DType::F16: case DType::BF16: return 2;
  }
  return 0;
}

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string type_size_problem(const Type &ty) {
  if (!ty.tensor) return "";
  if (ty.sizes.size() > (size_t)kMaxDims)
    return std::to_string(ty.sizes.size()) + " dimensions; at most " + std::to_string(kMaxDims) + " are supported";
  auto shape = [&] {
    std::string s = "[";
    for (size_t k = 0; k < ty.sizes.size(); ++k) s += (k ? "," : "") + std::to_string(ty.sizes[k]);
    return s + "]";
  };
  const std::string too_big = " hold more than 2^63 - 1 bytes (int64 byte offsets cannot address them)";
  int64_t n = dtype_bytes(ty.dtype);
  for (int64_t s : ty.sizes) {
    if (s < 0) return "negative size " + std::to_string(s) + " in " + shape();
    if (__builtin_mul_overflow(n, s > 1 ? s : 1, &n)) return "sizes " + shape() + too_big;
  }
  if (ty.strides.empty() || ty.numel() == 0) return "";
  int64_t far = 0;  // the furthest element's offset, in elements
  for (size_t k = 0; k < ty.sizes.size() && k < ty.strides.size(); ++k) {
    int64_t st = ty.strides[k], term;
    if (st == INT64_MIN || __builtin_mul_overflow(ty.sizes[k] - 1, st < 0 ? -st : st, &term) ||
        __builtin_add_overflow(far, term, &far))
      return "sizes " + shape() + " with their strides" + too_big;
  }
  int64_t bytes;
  if (__builtin_add_overflow(far, (int64_t)1, &far) || __builtin_mul_overflow(far, (int64_t)dtype_bytes(ty.dtype), &bytes))
    return "sizes " + shape() + " with their strides" + too_big;
  return "";
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t> &sizes) {
  std::vector<int64_t> st(sizes.size());
  int64_t acc = 1;
  for (int i = (int)sizes.size() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return st;
}

void fail(ErrorCode c, const std::string &msg) { throw Error(c, msg); }

bool fault_injected(const char *name) {
  const char *env = getenv("DYNAMO_FAULT");
  if (!env || !*env) return false;
  std::string all = std::string(",") + env + ",";
  return all.find(std::string(",") + name + ",") != std::string::npos;
}

ValueUsers value_users(const Trace &t) {
  ValueUsers users(t.types.size());
  for (size_t i = 0; i < t.insts.size(); ++i)
    for (size_t k = 0; k < t.insts[i].args.size(); ++k)
      if (t.insts[i].args[k].kind == Operand::Value) users[(size_t)t.insts[i].args[k].value].push_back({(int32_t)i, (int32_t)k});
  return users;
}

}  // namespace dynamo::jit
