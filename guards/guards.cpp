// guards.cpp -- building entry guards from a trace's inputs, the fast check and the explainer.
#include "guards.h"

#include <cstring>

namespace dynamo::guards {

void dl_type_of(jit::DType d, uint8_t *code, uint8_t *bits) {
  switch (d) {
    case jit::DType::Bool: *code = DYNAMO_DL_BOOL; *bits = 8; break;
    case jit::DType::I32: *code = kDLInt; *bits = 32; break;
    case jit::DType::I64: *code = kDLInt; *bits = 64; break;
    case jit::DType::F32: *code = kDLFloat; *bits = 32; break;
    case jit::DType::F64: *code = kDLFloat; *bits = 64; break;
    case jit::DType::F16: *code = kDLFloat; *bits = 16; break;
    case jit::DType::BF16: *code = kDLBfloat; *bits = 16; break;
  }
}

std::string dl_type_name(uint8_t code, uint8_t bits) {
  if (code == DYNAMO_DL_BOOL && bits == 8) return "bool";
  const char *c = code == kDLInt ? "int" : code == kDLUInt ? "uint" : code == kDLFloat ? "float"
                  : code == kDLBfloat ? "bfloat" : nullptr;
  if (!c) return "an unknown type (DLPack code " + std::to_string((int)code) + ", " + std::to_string((int)bits) + " bits)";
  return std::string(c) + std::to_string(bits);
}

GuardSet guards_from_trace(const jit::Trace &t) {
  GuardSet g;
  for (int32_t v : t.inputs) {
    const jit::Type &ty = t.types[v];
    const jit::Inst &in = t.insts[t.def[v]];
    InputGuard ig;
    if (ty.tensor) {
      ig.kind = GuardKind::Tensor;
      dl_type_of(ty.dtype, &ig.dl_code, &ig.dl_bits);
      ig.device_type = ty.device.kind == jit::DeviceKind::CUDA ? kDLCUDA : kDLCPU;
      ig.device_id = ty.device.index;
      ig.requires_grad = ty.requires_grad;
      ig.sizes = ty.sizes;
      ig.strides = ty.strides.empty() ? jit::contiguous_strides(ty.sizes) : ty.strides;
    } else {
      ig.kind = ty.dtype == jit::DType::F64 ? GuardKind::Float
                : ty.dtype == jit::DType::Bool ? GuardKind::Bool : GuardKind::Int;
      if (in.has_guard_value) {
        ig.has_value = true;
        ig.i = in.guard_value.i;
        ig.f = in.guard_value.kind == jit::Operand::Float ? in.guard_value.f : (double)in.guard_value.i;
      }
    }
    g.inputs.push_back(std::move(ig));
  }
  return g;
}

namespace {

// The one guard evaluator; `why` is null on the fast path.
bool check_one(const InputGuard &g, const dynamo_arg &a, size_t k, std::string *why) {
// The message is only built on the verbose path (why != nullptr).
#define miss(msg) (why ? (*why = "input " + std::to_string(k) + ": " + (msg), false) : false)
  static const char *kKinds[] = {"tensor", "int", "float", "bool"};
  int want = (int)g.kind;
  if (a.kind != want)
    return miss(std::string("kind mismatch: expected ") + kKinds[want] + ", got " +
                (a.kind >= 0 && a.kind < 4 ? kKinds[a.kind] : "an unknown kind"));
  switch (g.kind) {
    case GuardKind::Int:
      if (g.has_value && a.u.i != g.i)
        return miss("value mismatch: expected " + std::to_string(g.i) + ", got " + std::to_string(a.u.i));
      return true;
    case GuardKind::Float:
      if (g.has_value && !(a.u.f == g.f || (a.u.f != a.u.f && g.f != g.f)))
        return miss("value mismatch: expected " + jit::format_double(g.f) + ", got " + jit::format_double(a.u.f));
      return true;
    case GuardKind::Bool:
      if (g.has_value && (a.u.b != 0) != (g.i != 0))
        return miss(std::string("value mismatch: expected ") + (g.i ? "true" : "false") + ", got " +
                    (a.u.b ? "true" : "false"));
      return true;
    case GuardKind::Tensor: break;
  }
  const DLTensor *t = a.u.tensor;
  if (!t) return miss("tensor pointer is NULL");
  if (t->dtype.lanes != 1)
    return miss("dtype mismatch: " + std::to_string((int)t->dtype.lanes) + " lanes (vector dtypes are not supported; "
                "expected " + dl_type_name(g.dl_code, g.dl_bits) + " with 1 lane)");
  if (t->dtype.code != g.dl_code || t->dtype.bits != g.dl_bits)
    return miss("dtype mismatch: expected " + dl_type_name(g.dl_code, g.dl_bits) + ", got " +
                dl_type_name(t->dtype.code, t->dtype.bits));
  if ((int32_t)t->device.device_type != g.device_type || t->device.device_id != g.device_id)
    return miss("device mismatch: expected " + std::string(g.device_type == kDLCPU ? "cpu" : "cuda") + ":" +
                std::to_string(g.device_id) + ", got device type " + std::to_string((int)t->device.device_type) +
                ":" + std::to_string(t->device.device_id));
  if (t->ndim != (int32_t)g.sizes.size())
    return miss("rank mismatch: expected " + std::to_string(g.sizes.size()) + ", got " + std::to_string(t->ndim));
  bool rg = (a.flags & DYNAMO_ARG_FLAG_REQUIRES_GRAD) != 0;
  if (rg != g.requires_grad)
    return miss(std::string("requires_grad mismatch: expected ") + (g.requires_grad ? "true" : "false") +
                ", got " + (rg ? "true" : "false"));
  if (g.sizes.empty()) return t->data ? true : miss("data pointer is NULL");
  if (!t->shape) return miss("shape pointer is NULL");
  bool empty = false;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (t->shape[d] != g.sizes[d])
      return miss("size mismatch at dim " + std::to_string(d) + ": expected " + std::to_string(g.sizes[d]) +
                  ", got " + std::to_string(t->shape[d]));
    empty = empty || g.sizes[d] == 0;
  }
  if (empty) return true;  // strides of an empty tensor do not matter
  int64_t contig = 1;
  for (int d = (int)g.sizes.size() - 1; d >= 0; --d) {
    int64_t have = t->strides ? t->strides[d] : contig;
    contig *= g.sizes[d];
    if (g.sizes[d] <= 1) continue;
    if (have != g.strides[d])
      return miss("stride mismatch at dim " + std::to_string(d) + ": expected " + std::to_string(g.strides[d]) +
                  ", got " + std::to_string(have));
  }
  if (!t->data) return miss("data pointer is NULL");
  // The bytes the tensor spans must be addressable: data + byte_offset + the strides' reach,
  // without wrapping (a byte_offset of 2^63 would send the compiled code anywhere).
  __int128 lo = (__int128)(uintptr_t)t->data + (__int128)t->byte_offset, hi = lo;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    __int128 reach = (__int128)(g.sizes[d] - 1) * g.strides[d] * ((g.dl_bits + 7) / 8);
    (reach < 0 ? lo : hi) += reach;
  }
  hi += (g.dl_bits + 7) / 8;
  if (t->byte_offset > (uint64_t)INT64_MAX || lo < 0 || hi > (__int128)UINTPTR_MAX)
    return miss("byte_offset " + std::to_string(t->byte_offset) + " puts the tensor's bytes past the address space");
  return true;
#undef miss
}

}  // namespace

bool guards_pass(const GuardSet &g, const dynamo_arg *args, size_t n) {
  if (n != g.inputs.size() || (n && !args)) return false;
  for (size_t k = 0; k < n; ++k)
    if (!check_one(g.inputs[k], args[k], k, nullptr)) return false;
  return true;
}

std::string explain_guards(const GuardSet &g, const dynamo_arg *args, size_t n) {
  if (n != g.inputs.size())
    return "input count mismatch: expected " + std::to_string(g.inputs.size()) + ", got " + std::to_string(n);
  if (n && !args) return "args pointer is NULL";
  std::string why;
  for (size_t k = 0; k < n; ++k)
    if (!check_one(g.inputs[k], args[k], k, &why)) return why;
  return "";
}

}  // namespace dynamo::guards
