// fuzz_compile.cpp -- libFuzzer target for the whole C API path: any bytes as trace text through
// dynamo_trace_parse, dynamo_compile_frame and, when every input is small enough to hand over,
// dynamo_entry_run_alloc on zero-filled inputs. Each call must return a status -- never crash,
// hang (libFuzzer's -timeout), or abort. Inputs are read back from the canonical printed text
// (`%k = input f32[2,3]`, `input i64 == 7`, `input f64`, `input bool`); a trace with strided,
// CUDA or large inputs is compiled but not run. Built by `make fuzz` against libdynamo.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dynamo.h"

namespace {

struct Engine {
  dynamo_engine *engine = nullptr;
  dynamo_frame *frame = nullptr;
  long parsed = 0, compiled = 0, ran = 0, ran_ok = 0;
};

Engine &engine();
void print_counts() {
  Engine &e = engine();
  fprintf(stderr, "fuzz_compile: %ld traces parsed, %ld compiled, %ld run (%ld OK)\n", e.parsed, e.compiled, e.ran,
          e.ran_ok);
}

Engine &engine() {
  static Engine e = [] {
    Engine e;
    dynamo_engine_create(nullptr, &e.engine);
    atexit(print_counts);
    return e;
  }();
  return e;
}

// One input of the printed trace, as far as the fuzzer can hand it over.
struct Input {
  bool tensor = false, ok = false;
  int kind = DYNAMO_ARG_FLOAT;
  DLDataType dtype{kDLFloat, 32, 1};
  std::vector<int64_t> shape;
  int64_t value = 0;
};

bool dtype_of(const std::string &name, DLDataType *out) {
  static const struct { const char *name; DLDataType t; } table[] = {
      {"f32", {kDLFloat, 32, 1}}, {"f64", {kDLFloat, 64, 1}}, {"f16", {kDLFloat, 16, 1}},
      {"bf16", {kDLBfloat, 16, 1}}, {"i32", {kDLInt, 32, 1}}, {"i64", {kDLInt, 64, 1}},
      {"bool", {DYNAMO_DL_BOOL, 8, 1}}};
  for (const auto &row : table)
    if (name == row.name) {
      *out = row.t;
      return true;
    }
  return false;
}

// Reads "input <type>..." from one printed line; ok stays false for what is not handed over.
Input read_input(const std::string &line) {
  Input in;
  size_t at = line.find("= input ");
  std::string rest = line.substr(at + 8);
  size_t bracket = rest.find('[');
  if (bracket == std::string::npos) {  // a scalar: i64 [== v] | f64 | bool
    in.ok = true;
    if (rest.rfind("i64", 0) == 0) {
      in.kind = DYNAMO_ARG_INT;
      size_t eq = rest.find("== ");
      if (eq != std::string::npos) in.value = strtoll(rest.c_str() + eq + 3, nullptr, 10);
    } else if (rest.rfind("bool", 0) == 0) {
      in.kind = DYNAMO_ARG_BOOL;
    } else if (rest.rfind("f64", 0) != 0) {
      in.ok = false;
    }
    return in;
  }
  in.tensor = true;
  in.kind = DYNAMO_ARG_TENSOR;
  if (!dtype_of(rest.substr(0, bracket), &in.dtype)) return in;
  size_t close = rest.find(']', bracket);
  if (close == std::string::npos) return in;
  // Contiguous CPU tensors only: anything after the sizes (strides, a device, requires_grad) is
  // left to the compile step.
  if (rest.find_first_not_of(' ', close + 1) != std::string::npos) return in;
  std::string dims = rest.substr(bracket + 1, close - bracket - 1);
  int64_t count = 1;
  for (size_t p = 0; p < dims.size();) {
    size_t comma = dims.find(',', p);
    if (comma == std::string::npos) comma = dims.size();
    int64_t d = strtoll(dims.c_str() + p, nullptr, 10);
    if (d < 0 || d > 4096) return in;
    count *= d;
    if (count > 4096) return in;
    in.shape.push_back(d);
    p = comma + 1;
  }
  in.ok = true;
  return in;
}

alignas(64) uint64_t g_memory[8 * 4096];  // zeros; every input tensor reads from here

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Engine &E = engine();
  if (!E.engine || size > 32768) return 0;
  dynamo_trace *trace = nullptr;
  if (dynamo_trace_parse(reinterpret_cast<const char *>(data), size, &trace) != DYNAMO_OK) return 0;
  ++E.parsed;
  char *text = nullptr;
  if (dynamo_trace_print(trace, &text) != DYNAMO_OK) __builtin_trap();  // a parsed trace prints
  // A frame holds at most a few entries; start a fresh one now and then so lookups stay cheap.
  if (!E.frame || E.parsed % 64 == 0) {
    if (E.frame) dynamo_frame_destroy(E.frame);
    E.frame = nullptr;
    dynamo_frame_create(E.engine, "fuzz", &E.frame);
  }
  dynamo_entry *entry = nullptr;
  bool compiled = E.frame && dynamo_compile_frame(E.frame, trace, &entry) == DYNAMO_OK;
  dynamo_trace_destroy(trace);
  E.compiled += compiled;
  std::vector<Input> inputs;
  bool runnable = compiled;
  for (const char *p = text; runnable && *p;) {
    const char *nl = strchr(p, '\n');
    std::string line(p, nl ? (size_t)(nl - p) : strlen(p));
    p = nl ? nl + 1 : p + line.size();
    if (line.find("= input ") == std::string::npos) continue;
    inputs.push_back(read_input(line));
    runnable = inputs.back().ok;
  }
  dynamo_string_free(text);
  if (!runnable || inputs.size() != dynamo_entry_num_inputs(entry)) return 0;
  std::vector<DLTensor> tensors(inputs.size());
  std::vector<dynamo_arg> args(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    Input &in = inputs[k];
    dynamo_arg &a = args[k];
    memset(&a, 0, sizeof a);
    a.kind = in.kind;
    if (in.kind == DYNAMO_ARG_TENSOR) {
      DLTensor &t = tensors[k];
      memset(&t, 0, sizeof t);
      t.data = g_memory;
      t.device = {kDLCPU, 0};
      t.ndim = (int32_t)in.shape.size();
      t.dtype = in.dtype;
      t.shape = in.shape.data();
      a.u.tensor = &t;
    } else if (in.kind == DYNAMO_ARG_INT) {
      a.u.i = in.value;
    } else if (in.kind == DYNAMO_ARG_FLOAT) {
      a.u.f = 0.5;
    }
  }
  size_t nouts = dynamo_entry_num_outputs(entry);
  std::vector<DLManagedTensor *> outs(nouts ? nouts : 1, nullptr);
  dynamo_status st = dynamo_entry_run_alloc(entry, args.empty() ? nullptr : args.data(), args.size(), outs.data(), nouts);
  ++E.ran;
  E.ran_ok += st == DYNAMO_OK;
  if (st == DYNAMO_EXIT) {
    int32_t id;
    size_t n = 0;
    DLManagedTensor *live[16] = {};
    if (dynamo_take_exit(&id, live, 16, &n) == DYNAMO_OK)
      for (size_t k = 0; k < n && k < 16; ++k)
        if (live[k]) live[k]->deleter(live[k]);
  }
  for (DLManagedTensor *o : outs)
    if (o) {
      if (st != DYNAMO_OK) __builtin_trap();  // the header: every output is NULL on failure
      o->deleter(o);
    }
  return 0;
}
