// passes.cpp -- trace simplification: common subexpression elimination and dead code
// elimination, rebuilding value numbers densely. Inputs are never removed (they are slots).
#include <map>
#include <tuple>

#include "ir.h"

namespace dynamo::jit {

namespace {

// A key that identifies an instruction's computation (op + operands) for CSE.
std::string cse_key(const Inst &in) {
  std::string k = std::to_string((int)in.op) + "|";
  for (const Operand &o : in.args) k += print_operand(o) + ",";
  return k;
}

}  // namespace

void simplify_trace(Trace &t) {
  // CSE: map each value to a representative; externs and inputs are never merged.
  std::vector<int32_t> rep(t.types.size());
  for (size_t v = 0; v < rep.size(); ++v) rep[v] = (int32_t)v;
  std::map<std::string, int32_t> seen;
  for (Inst &in : t.insts) {
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = rep[o.value];
    if (in.op == Op::input || in.op == Op::extern_ || in.op == Op::copy_) continue;  // effects stay
    auto [it, fresh] = seen.emplace(cse_key(in), in.results[0]);
    if (!fresh) rep[in.results[0]] = it->second;
  }
  for (int32_t &o : t.outputs) o = rep[o];

  // DCE: mark live from outputs backwards; inputs and externs stay.
  std::vector<char> live(t.types.size(), 0);
  for (int32_t o : t.outputs) live[o] = 1;
  std::vector<char> keep(t.insts.size(), 0);
  for (int i = (int)t.insts.size() - 1; i >= 0; --i) {
    const Inst &in = t.insts[i];
    bool k = in.op == Op::input || in.op == Op::extern_ || in.op == Op::copy_;
    for (int32_t r : in.results) k = k || (live[r] && rep[r] == r);
    if (!k) continue;
    keep[i] = 1;
    for (const Operand &o : in.args)
      if (o.kind == Operand::Value) live[o.value] = 1;
  }

  // Rebuild with dense numbering.
  Trace out;
  out.name = t.name;
  std::vector<int32_t> renum(t.types.size(), -1);
  for (size_t i = 0; i < t.insts.size(); ++i) {
    if (!keep[i]) continue;
    Inst in = t.insts[i];
    for (Operand &o : in.args)
      if (o.kind == Operand::Value) o.value = renum[o.value];
    int32_t idx = (int32_t)out.insts.size();
    for (int32_t &r : in.results) {
      int32_t nv = out.new_value(t.types[r], idx);
      renum[r] = nv;
      r = nv;
    }
    if (in.op == Op::input) out.inputs.push_back(in.results[0]);
    out.insts.push_back(std::move(in));
  }
  for (int32_t o : t.outputs) out.outputs.push_back(renum[o]);
  t = std::move(out);
}

}  // namespace dynamo::jit
