// fuzz_run.cpp -- libFuzzer target for the C API's run path: entries compiled once (a fused
// pointwise chain, a reduction, a trace with a side exit) are called with argument arrays whose
// kinds, tensor pointers, dtypes, ranks, sizes, strides, devices and output descriptions come
// from the fuzzer. dynamo_check_guards / dynamo_entry_run / dynamo_entry_run_alloc must return a
// status for all of them -- never crash, read or write out of bounds, or hang.
#include <cstdint>
#include <cstring>
#include <vector>

#include "dynamo.h"

namespace {

struct Compiled {
  dynamo_engine *engine = nullptr;
  dynamo_frame *frame = nullptr;
  std::vector<dynamo_entry *> entries;
};

Compiled &compiled() {
  static Compiled c = [] {
    Compiled c;
    dynamo_engine_create(nullptr, &c.engine);
    dynamo_frame_create(c.engine, "fuzz", &c.frame);
    const char *texts[] = {
        "trace @a {\n  %0 = input f32[4,3]\n  %1 = input f32[3]\n  %2 = mul(%0, %1)\n  %3 = tanh(%2)\n  return %3\n}\n",
        "trace @b {\n  %0 = input f64[5]{2}\n  %1 = input i64 == 3\n  %2 = sum(%0, [0], true)\n  %3 = mul(%2, %1)\n"
        "  return %3\n}\n",
        "trace @c {\n  %0 = input f32[6]\n  %1 = sum(%0, [], false) : f32[]\n  %2 = gt(%1, 0.0) : bool[]\n"
        "  %3 = extern dynamo::guard(%2, true, 0, %1) : bool[]\n  %4 = neg(%0)\n  return %4\n}\n",
    };
    for (const char *t : texts) {
      dynamo_trace *tr = nullptr;
      dynamo_entry *e = nullptr;
      if (dynamo_trace_parse(t, strlen(t), &tr) == DYNAMO_OK && dynamo_compile_frame(c.frame, tr, &e) == DYNAMO_OK)
        c.entries.push_back(e);
      dynamo_trace_destroy(tr);
    }
    return c;
  }();
  return c;
}

struct Reader {
  const uint8_t *p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  int64_t small(int lo, int hi) { return lo + byte() % (hi - lo + 1); }
};

alignas(64) float g_memory[4096];  // every data pointer handed out points in here, with room

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Compiled &c = compiled();
  if (c.entries.empty()) return 0;
  Reader r{data, size};
  dynamo_entry *e = c.entries[r.byte() % c.entries.size()];
  size_t nargs = (size_t)r.small(0, 4), nouts = (size_t)r.small(0, 2);
  std::vector<DLTensor> tensors(nargs + nouts);
  std::vector<int64_t> shapes((nargs + nouts) * 4), strides((nargs + nouts) * 4);
  std::vector<dynamo_arg> args(nargs);
  auto fill = [&](size_t k) {
    DLTensor &t = tensors[k];
    memset(&t, 0, sizeof t);
    t.ndim = (int32_t)r.small(0, 4);
    // Now and then a size or stride from the edge of int64 (products that overflow, strides
    // that reach outside any buffer): the guards must refuse them without computing past it.
    static const int64_t huge[] = {INT64_MAX, INT64_MIN, INT64_C(1) << 62, INT64_C(1) << 32,
                                   INT64_C(1) << 31, -1, INT64_MAX / 4 + 1, 3037000500};
    for (int d = 0; d < t.ndim; ++d) {
      shapes[k * 4 + d] = r.byte() % 16 ? r.small(0, 7) : huge[r.byte() % 8];
      strides[k * 4 + d] = r.byte() % 16 ? r.small(-2, 8) : huge[r.byte() % 8];
    }
    t.shape = r.byte() % 8 ? &shapes[k * 4] : nullptr;
    t.strides = r.byte() % 2 ? &strides[k * 4] : nullptr;
    static const uint8_t codes[] = {kDLInt, kDLUInt, kDLFloat, kDLBfloat, 6, 9};
    static const uint8_t bits[] = {8, 16, 32, 64, 1, 13};
    t.dtype = {codes[r.byte() % 6], bits[r.byte() % 6], (uint16_t)(r.byte() % 4 ? 1 : r.small(0, 3))};
    t.device = {r.byte() % 8 ? kDLCPU : kDLCUDA, 0};
    t.data = r.byte() % 8 ? (void *)(g_memory + 1024) : nullptr;  // 4 KB of slack on both sides
    t.byte_offset = (uint64_t)r.small(0, 3) * 4;
  };
  for (size_t k = 0; k < nargs; ++k) {
    fill(k);
    dynamo_arg &a = args[k];
    memset(&a, 0, sizeof a);
    a.kind = (int32_t)r.small(0, 5);  // includes kinds that do not exist
    a.flags = r.byte() % 4 ? 0 : 1;
    if (a.kind == DYNAMO_ARG_TENSOR) a.u.tensor = r.byte() % 8 ? &tensors[k] : nullptr;
    else a.u.i = (int64_t)r.small(0, 6);
  }
  for (size_t k = 0; k < nouts; ++k) fill(nargs + k);
  dynamo_entry *found = nullptr;
  char why[128];
  dynamo_check_guards(c.frame, nargs ? args.data() : nullptr, nargs, &found, why, sizeof why);
  // Only outputs that do not overlap the inputs' memory may be written: give them their own.
  for (size_t k = 0; k < nouts; ++k)
    if (tensors[nargs + k].data) tensors[nargs + k].data = g_memory + 3072;
  if (dynamo_entry_run(e, nargs ? args.data() : nullptr, nargs, nouts ? &tensors[nargs] : nullptr, nouts) == DYNAMO_EXIT) {
    int32_t id;
    size_t n = 0;
    DLManagedTensor *v[4] = {};
    if (dynamo_take_exit(&id, v, 4, &n) == DYNAMO_OK)
      for (size_t k = 0; k < n; ++k) v[k]->deleter(v[k]);
  }
  DLManagedTensor *outs[2] = {};
  if (dynamo_entry_run_alloc(e, nargs ? args.data() : nullptr, nargs, nouts ? outs : nullptr, nouts) == DYNAMO_OK)
    for (size_t k = 0; k < nouts; ++k)
      if (outs[k]) outs[k]->deleter(outs[k]);
  return 0;
}
