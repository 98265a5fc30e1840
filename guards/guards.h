// guards.h -- entry guards: what a compiled trace assumed about its inputs, checked natively in
// one pass (no allocation), and a separate, state-free path that explains a failure.
#pragma once

#include <string>
#include <vector>

#include "dynamo.h"
#include "jit/ir.h"

namespace dynamo::guards {

enum class GuardKind : uint8_t { Tensor, Int, Float, Bool };

struct InputGuard {
  GuardKind kind = GuardKind::Tensor;
  // Tensors:
  uint8_t dl_code = 0, dl_bits = 0;
  int32_t device_type = kDLCPU, device_id = 0;
  bool requires_grad = false;
  std::vector<int64_t> sizes, strides;  // strides in elements; ignored for dims of size <= 1
  // Scalars:
  bool has_value = false;  // guarded to equal the recorded value (tokens, specialized scalars)
  int64_t i = 0;
  double f = 0;
};

struct GuardSet {
  std::vector<InputGuard> inputs;
};

// The DLPack type code/bits of a trace dtype.
void dl_type_of(jit::DType d, uint8_t *code, uint8_t *bits);
std::string dl_type_name(uint8_t code, uint8_t bits);

GuardSet guards_from_trace(const jit::Trace &t);
// Fast path: true if every guard passes. Never allocates.
bool guards_pass(const GuardSet &g, const dynamo_arg *args, size_t n);
// Verbose path: "" if all pass, else the first failing guard, e.g.
// "input 0: size mismatch at dim 1: expected 128, got 64".
std::string explain_guards(const GuardSet &g, const dynamo_arg *args, size_t n);

}  // namespace dynamo::guards
