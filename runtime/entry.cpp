// entry.cpp -- compiling a trace into an entry, and running an entry on caller buffers.
#include "entry.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "gpu/program.h"
#include "runtime/derived.h"
#include "runtime/openblas.h"
#include "jit/rt_abi.h"

namespace dynamo::runtime {

using jit::ErrorCode;

namespace {
void share_kept(Entry &e);
}  // namespace

std::unique_ptr<Entry> compile_entry(jit::Engine &engine, const jit::Trace &trace,
                                     const std::string &fn_name, int num_threads) {
  auto t0 = std::chrono::steady_clock::now();
  auto e = std::make_unique<Entry>();
  e->trace = trace;
  jit::verify_trace(e->trace);
  for (int32_t v : e->trace.inputs) {
    const jit::Type &ty = e->trace.types[v];
    if (ty.tensor && ty.device.kind != jit::DeviceKind::CPU)
      jit::fail(ErrorCode::Unsupported, "input %" + std::to_string(v) +
                                            " is on a CUDA device; this engine runs on the CPU (create one with "
                                            "device_type kDLCUDA for CUDA tensors)");
    if (ty.tensor && ty.rank() > jit::kMaxDims)
      jit::fail(ErrorCode::Unsupported, "input %" + std::to_string(v) + " has more than " + std::to_string(jit::kMaxDims) + " dimensions");
  }
  for (int32_t v : e->trace.outputs)
    if (e->trace.types[v].rank() > jit::kMaxDims)
      jit::fail(ErrorCode::Unsupported, "output %" + std::to_string(v) + " has more than " + std::to_string(jit::kMaxDims) + " dimensions");
  bool nhwc = jit::nhwc_layouts_enabled();
  jit::decompose_externs(e->trace, !nhwc);
  jit::simplify_trace(e->trace);
  jit::flush_softmax_subnormals(e->trace);
  if (nhwc && jit::nhwc_layouts(e->trace)) jit::simplify_trace(e->trace);
  jit::PlanOptions popt;
  popt.kept_steps = true;
  e->plan = jit::plan_trace(e->trace, popt);
  if (!e->plan.step_kept.empty()) {  // the kept kernel results' memory, allocated once
    e->kept = std::make_shared<Entry::Kept>();
    e->kept->offset.assign((size_t)e->plan.num_slots, 0);
    size_t bytes = 0;
    for (int32_t s = 0; s < e->plan.num_slots; ++s)
      if (e->plan.slot_kept[(size_t)s] && e->plan.scratch_bytes[(size_t)s]) {
        e->kept->offset[(size_t)s] = bytes;
        bytes += ((size_t)e->plan.scratch_bytes[(size_t)s] + 63) & ~size_t(63);
      }
    if (bytes && !(e->kept->memory = aligned_alloc(64, bytes)))
      jit::fail(ErrorCode::Runtime, "out of memory allocating " + std::to_string(bytes) + " bytes for kept results");
  }
  e->guards = guards::guards_from_trace(e->trace);
  e->externs = resolve_externs(e->trace, e->plan);
  e->exits = jit::side_exits(e->trace);  // (verified: ids 0 .. n - 1, each once)
  e->num_exits = (int32_t)e->exits.size();
  e->exit_counts = std::make_unique<std::atomic<int64_t>[]>((size_t)std::max(e->num_exits, 1));
  e->stats.num_externs = (uint32_t)(e->plan.externs.size() - (size_t)e->num_exits);  // LibTorch calls only
  for (int32_t k = 0; k < e->num_exits; ++k) e->exit_counts[k] = 0;
  e->num_threads = num_threads;
  int nk = 0;
  bool cached = false;
  e->code = engine.compile(e->trace, e->plan, fn_name, &nk, &cached);
  share_kept(*e);
  e->stats.struct_size = sizeof(dynamo_entry_stats);
  e->stats.num_kernels = (uint32_t)nk;
  for (char k : e->plan.step_kept) e->stats.kept_steps += k != 0;

  e->stats.num_instructions = (uint32_t)e->trace.insts.size();
  e->stats.from_cache = cached ? 1 : 0;
  e->stats.shared_code = e->code.shared ? 1 : 0;
  e->stats.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (jit::profile_enabled()) e->step_times = std::make_unique<StepTime[]>(std::max<size_t>(1, e->plan.steps.size()));
  return e;
}

// Each instruction of t as its line of the trace's text.
std::vector<std::string> trace_inst_lines(const jit::Trace &t) {
  std::istringstream text(jit::print_trace(t));
  std::vector<std::string> out;
  std::string line;
  std::getline(text, line);  // (the header)
  for (size_t k = 0; k < t.insts.size() && std::getline(text, line); ++k) out.push_back(line);
  out.resize(t.insts.size());
  return out;
}

Entry::~Entry() = default;
Entry::Kept::~Kept() { free(memory); }

namespace {

// Entries whose kept steps are the same -- one machine code (the same program, perhaps at other
// sizes: a size family's instances), the same kept steps and slots with the same bytes, reading
// the same argument slots of the same types -- share one Kept: what one run computed from the
// weights the others reuse while the weights are the same (the keys are checked on every run, as
// for one entry). Registered weakly: the Kept goes with the last entry holding it.
std::mutex kept_registry_mu;
std::map<std::string, std::weak_ptr<Entry::Kept>> kept_registry;

std::string kept_signature(const Entry &e) {
  const jit::Plan &p = e.plan;
  std::ostringstream os;
  os << e.code.tracker.get() << '|';
  for (char k : p.step_kept) os << (int)k;
  os << '|';
  for (int32_t s = 0; s < p.num_slots; ++s)
    if (p.slot_kept[(size_t)s]) os << s << ':' << p.scratch_bytes[(size_t)s] << ',';
  os << '|';
  for (int32_t w : p.kept_weights) os << w << ',';
  // The instructions the kept values come from, as text (types, sizes and constants included:
  // arange(n + 1) kept at one size is not the one at another)
  const jit::Trace &t = e.trace;
  std::vector<int32_t> todo;
  for (size_t si = 0; si < p.steps.size(); ++si) {
    if (!p.step_kept[si]) continue;
    const jit::Step &st = p.steps[si];
    if (st.kind == jit::Step::Extern) {
      for (int32_t v : p.externs[(size_t)st.index].result_values) todo.push_back(v);
    } else {
      for (const jit::Root &r : p.groups[(size_t)st.index].roots) todo.push_back(r.value);
      for (const jit::Root &r : p.groups[(size_t)st.index].row_roots) todo.push_back(r.value);
    }
  }
  std::vector<char> seen(t.insts.size(), 0);
  while (!todo.empty()) {
    int32_t v = todo.back();
    todo.pop_back();
    int32_t k = t.def[(size_t)v];
    if (k < 0 || seen[(size_t)k]) continue;
    seen[(size_t)k] = 1;
    for (const jit::Operand &o : t.insts[(size_t)k].args)
      if (o.kind == jit::Operand::Value) todo.push_back(o.value);
  }
  std::vector<std::string> lines = trace_inst_lines(t);
  for (size_t k = 0; k < t.insts.size(); ++k)
    if (seen[k]) os << lines[k] << '\n';
  return os.str();
}

void share_kept(Entry &e) {
  if (e.code.tracker) share_extern_steps(e, e.code.tracker.get());
  if (!e.kept || !e.code.tracker) return;
  std::string key = kept_signature(e);
  std::lock_guard<std::mutex> lock(kept_registry_mu);
  for (auto it = kept_registry.begin(); it != kept_registry.end();)  // (those whose entries went)
    it = it->second.expired() ? kept_registry.erase(it) : std::next(it);
  auto found = kept_registry.find(key);
  if (found != kept_registry.end()) {
    if (std::shared_ptr<Entry::Kept> k = found->second.lock()) {
      e.kept = std::move(k);
      return;
    }
  }
  kept_registry[key] = e.kept;
}

// What identifies a weight's contents for the kept steps: its address, the caller's version and
// the bytes of the elements derived.h's content keys sample (the same rule: a write the version does not count, through
// .data, still shows in the sample); "" when the caller does not version it (nothing is kept).
std::string weight_key(const dynamo_arg &a) {
  if (a.kind != DYNAMO_ARG_TENSOR || !(a.flags & DYNAMO_ARG_FLAG_VERSIONED)) return "";
  const DLTensor &t = *a.u.tensor;
  uint64_t version = reinterpret_cast<const dynamo_versioned_tensor *>(a.u.tensor)->version;
  const char *base = (const char *)t.data + t.byte_offset;
  std::string key((const char *)&base, sizeof base);
  key.append((const char *)&version, sizeof version);
  int64_t n = 1, contiguous[DYNAMO_MAX_DIMS];
  for (int d = t.ndim - 1; d >= 0; --d) {
    contiguous[d] = n;
    n *= t.shape[d];
  }
  const int64_t *strides = t.strides ? t.strides : contiguous;
  const size_t es = ((size_t)t.dtype.bits * t.dtype.lanes + 7) / 8;
  for (int64_t s = 0; s < kContentSamples && n > 0; ++s)
    key.append(base + content_sample_offset(s, n, t.ndim, t.shape, strides) * (int64_t)es, es);
  return key;
}

}  // namespace

bool Entry::profile_this_run() const {
  if (profile_warm.load(std::memory_order_relaxed) >= 2) return true;
  for (size_t k = 0; k < plan.externs.size(); ++k)  // (one extern step each)
    if (extern_choice(*this, k) == "timing") return false;
  return profile_warm.fetch_add(1) + 1 >= 2;
}

std::string entry_profile(const Entry &en) {
  if (!en.step_times) return "";
  std::string out = "runs " + std::to_string(en.run_time.runs.load()) + " " + std::to_string(en.run_time.ns.load()) + "\n";
  for (size_t i = 0; i < en.plan.steps.size(); ++i) {
    int64_t runs = en.step_times[i].runs.load();
    if (!runs) continue;
    out += "step " + std::to_string(i) + " " + std::to_string(runs) + " " + std::to_string(en.step_times[i].ns.load()) + " " +
           jit::step_summary(en.trace, en.plan, i);
    const jit::Step &s = en.plan.steps[i];
    std::string choice = s.kind == jit::Step::Extern ? extern_choice(en, (size_t)s.index) : "";
    out += (choice.empty() ? "" : " (" + choice + ")") + std::string("\n");
  }
  return out;
}

std::unique_ptr<Entry> compile_gpu_entry(const std::shared_ptr<gpu::Device> &dev, const jit::Trace &trace,
                                         const std::string &fn_name) {
  auto t0 = std::chrono::steady_clock::now();
  auto e = std::make_unique<Entry>();
  e->trace = trace;
  jit::verify_trace(e->trace);
  const std::string here = "cuda:" + std::to_string(dev->index());
  for (int32_t v : e->trace.inputs) {
    const jit::Type &ty = e->trace.types[v];
    if (ty.tensor && (ty.device.kind != jit::DeviceKind::CUDA || ty.device.index != dev->index()))
      jit::fail(ErrorCode::Unsupported, "input %" + std::to_string(v) + " is declared on " +
                                            (ty.device.kind == jit::DeviceKind::CPU ? std::string("the CPU")
                                                                                    : "cuda:" + std::to_string(ty.device.index)) +
                                            "; this engine runs on " + here + " (inputs must be there too)");
    if (ty.tensor && ty.rank() > jit::kMaxDims)
      jit::fail(ErrorCode::Unsupported, "input %" + std::to_string(v) + " has more than " + std::to_string(jit::kMaxDims) + " dimensions");
  }
  jit::decompose_externs(e->trace);
  jit::simplify_trace(e->trace);
  e->plan = gpu::plan_for_gpu(e->trace);  // (extern steps: products through cuBLASLt, else refused)
  e->guards = guards::guards_from_trace(e->trace);
  e->exits = jit::side_exits(e->trace);
  e->num_exits = (int32_t)e->exits.size();
  e->exit_counts = std::make_unique<std::atomic<int64_t>[]>((size_t)std::max(e->num_exits, 1));
  for (int32_t k = 0; k < std::max(e->num_exits, 1); ++k) e->exit_counts[k] = 0;
  gpu::Program prog = gpu::compile_program(e->trace, e->plan, fn_name, dev->arch());
  if (const char *dump = getenv("DYNAMO_DUMP_DIR"); dump && *dump) {
    std::string path = std::string(dump) + "/" + fn_name + "." + dev->arch() + ".ptx";
    if (FILE *f = fopen(path.c_str(), "w")) {
      fwrite(prog.ptx.data(), 1, prog.ptx.size(), f);
      fclose(f);
    }
  }
  e->gpu_device = dev;
  e->gpu = std::make_shared<gpu::Loaded>(dev, prog);
  e->stats.struct_size = sizeof(dynamo_entry_stats);
  e->stats.num_kernels = (uint32_t)prog.kernels.size();
  e->stats.num_instructions = (uint32_t)e->trace.insts.size();
  e->stats.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return e;
}

int32_t Entry::exit_live_count(int32_t id) const {
  return id >= 0 && id < (int32_t)exits.size() ? exits[(size_t)id].live : -1;
}

namespace {

// A side exit's live value copied to device memory from the device's pool, as a DLPack tensor
// whose deleter hands the memory back.
struct DeviceValue {
  DLManagedTensor m{};
  std::vector<int64_t> shape;
  std::shared_ptr<gpu::Device> dev;
  uint64_t ptr = 0;
  size_t bytes = 0;
};

DLManagedTensor *device_value(const std::shared_ptr<gpu::Device> &dev, const jit::Type &ty,
                              std::pair<uint64_t, size_t> block) {
  auto *v = new DeviceValue;
  v->shape = ty.sizes;
  v->dev = dev;
  v->ptr = block.first;
  v->bytes = block.second;
  DLTensor &d = v->m.dl_tensor;
  d.data = reinterpret_cast<void *>((uintptr_t)block.first);
  d.device = DLDevice{kDLCUDA, dev->index()};
  d.ndim = ty.rank();
  guards::dl_type_of(ty.dtype, &d.dtype.code, &d.dtype.bits);
  d.dtype.lanes = 1;
  d.shape = v->shape.data();
  d.strides = nullptr;  // contiguous
  v->m.manager_ctx = v;
  v->m.deleter = [](DLManagedTensor *self) {
    auto *dv = static_cast<DeviceValue *>(self->manager_ctx);
    try {
      dv->dev->release(dv->ptr, dv->bytes);
    } catch (...) {  // (the driver failed while handing it back: nothing more to do)
    }
    delete dv;
  };
  return &v->m;
}

// Byte range [lo, hi) a DLTensor can touch; empty when it has no elements.
bool byte_range(const DLTensor *t, uintptr_t *lo, uintptr_t *hi) {
  int64_t min_off = 0, max_off = 0;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return false;
    int64_t st = t->strides ? t->strides[d] : 1;
    if (!t->strides) {
      st = 1;
      for (int k = d + 1; k < t->ndim; ++k) st *= t->shape[k];
    }
    int64_t span = (t->shape[d] - 1) * st;
    if (span < 0) min_off += span; else max_off += span;
  }
  uintptr_t b = (uintptr_t)t->data + t->byte_offset;
  int64_t es = (t->dtype.bits + 7) / 8;
  *lo = b + min_off * es;
  *hi = b + (max_off + 1) * es;
  return true;
}

}  // namespace

dynamo_status Entry::run(const dynamo_arg *args, size_t nargs, const DLTensor *outs, size_t nouts,
                         BufferPool *pool, std::string *msg, Exit *exit, DLManagedTensor **handed) const {
  const jit::Plan &p = plan;
  if (nouts != (size_t)p.num_outputs) {
    *msg = "expected " + std::to_string(p.num_outputs) + " output(s), got " + std::to_string(nouts);
    return DYNAMO_ERR_ARGUMENT_MISMATCH;
  }
  if (nouts && !outs) {
    *msg = "outs is NULL";
    return DYNAMO_ERR_INVALID_ARGUMENT;
  }
  // Outputs: caller buffers, contiguous, matching dtype and shape, not overlapping inputs.
  for (size_t k = 0; k < nouts; ++k) {
    const jit::Type &ty = trace.types[trace.outputs[k]];
    const DLTensor &o = outs[k];
    uint8_t code, bits;
    guards::dl_type_of(ty.dtype, &code, &bits);
    std::string pre = "output " + std::to_string(k) + ": ";
    if (o.dtype.lanes != 1) {
      *msg = pre + "dtype mismatch: " + std::to_string((int)o.dtype.lanes) + " lanes (vector dtypes are not "
             "supported; expected " + guards::dl_type_name(code, bits) + " with 1 lane)";
      return DYNAMO_ERR_ARGUMENT_MISMATCH;
    }
    if (o.dtype.code != code || o.dtype.bits != bits) {
      *msg = pre + "dtype mismatch: expected " + guards::dl_type_name(code, bits) + ", got " +
             guards::dl_type_name(o.dtype.code, o.dtype.bits);
      return DYNAMO_ERR_ARGUMENT_MISMATCH;
    }
    if (!gpu && o.device.device_type != kDLCPU) { *msg = pre + "must be a CPU tensor"; return DYNAMO_ERR_ARGUMENT_MISMATCH; }
    if (gpu && (o.device.device_type != kDLCUDA || o.device.device_id != gpu_device->index())) {
      *msg = pre + "must be a CUDA tensor on cuda:" + std::to_string(gpu_device->index());
      return DYNAMO_ERR_ARGUMENT_MISMATCH;
    }
    if (o.ndim != ty.rank()) {
      *msg = pre + "rank mismatch: expected " + std::to_string(ty.rank()) + ", got " + std::to_string(o.ndim);
      return DYNAMO_ERR_ARGUMENT_MISMATCH;
    }
    if (o.ndim && !o.shape) { *msg = pre + "shape pointer is NULL"; return DYNAMO_ERR_INVALID_ARGUMENT; }
    for (int d = 0; d < o.ndim; ++d)
      if (o.shape[d] != ty.sizes[d]) {
        *msg = pre + "size mismatch at dim " + std::to_string(d) + ": expected " + std::to_string(ty.sizes[d]) +
               ", got " + std::to_string(o.shape[d]);
        return DYNAMO_ERR_ARGUMENT_MISMATCH;
      }
    if (o.strides) {
      std::vector<int64_t> cs = jit::contiguous_strides(ty.sizes);
      for (int d = 0; d < o.ndim; ++d)
        if (ty.sizes[d] > 1 && o.strides[d] != cs[d]) { *msg = pre + "must be contiguous"; return DYNAMO_ERR_ARGUMENT_MISMATCH; }
    }
    if (!o.data && ty.numel() > 0) {
      if (p.output_alias[k].input >= 0) continue;  // copy elided: the caller makes the view
      if (handed && !gpu && p.output_extern_slot[k] >= 0) continue;  // the extern's tensor is handed out
      *msg = pre + "data pointer is NULL (allowed only for outputs that alias an input)";
      return DYNAMO_ERR_INVALID_ARGUMENT;
    }
    if (o.data) {  // its bytes must be addressable, without wrapping
      __int128 end = (__int128)(uintptr_t)o.data + (__int128)o.byte_offset +
                     (__int128)ty.numel() * (int64_t)jit::dtype_bytes(ty.dtype);
      if (o.byte_offset > (uint64_t)INT64_MAX || end > (__int128)UINTPTR_MAX) {
        *msg = pre + "byte_offset " + std::to_string(o.byte_offset) + " puts the output's bytes past the address space";
        return DYNAMO_ERR_INVALID_ARGUMENT;
      }
    }
    uintptr_t olo, ohi;
    if (!byte_range(&o, &olo, &ohi)) continue;
    for (size_t j = 0; j < nargs; ++j) {
      uintptr_t ilo, ihi;
      if (args[j].kind != DYNAMO_ARG_TENSOR || !byte_range(args[j].u.tensor, &ilo, &ihi)) continue;
      if (olo < ihi && ilo < ohi) {
        *msg = pre + "overlaps the memory of input " + std::to_string(j) + " (outputs must be fresh buffers)";
        return DYNAMO_ERR_ARGUMENT_MISMATCH;
      }
    }
    for (size_t j = 0; j < k; ++j) {
      uintptr_t jlo, jhi;
      if (byte_range(&outs[j], &jlo, &jhi) && olo < jhi && jlo < ohi) {
        *msg = pre + "overlaps output " + std::to_string(j);
        return DYNAMO_ERR_ARGUMENT_MISMATCH;
      }
    }
  }

  // An input written in place must not share memory with any other input.
  for (int32_t m : p.mutated_inputs) {
    uintptr_t mlo, mhi;
    if (!byte_range(args[m].u.tensor, &mlo, &mhi)) continue;
    for (size_t j = 0; j < nargs; ++j) {
      uintptr_t lo, hi;
      if ((int32_t)j == m || args[j].kind != DYNAMO_ARG_TENSOR || !byte_range(args[j].u.tensor, &lo, &hi)) continue;
      if (mlo < hi && lo < mhi) {
        *msg = "input " + std::to_string(m) + " is written in place and overlaps input " + std::to_string(j) +
               " (pass separate tensors)";
        return DYNAMO_ERR_ARGUMENT_MISMATCH;
      }
    }
  }

  if (gpu) {  // the slot table as device pointers and scalar bits; scratch lives with the program
    std::vector<uint64_t> slots64((size_t)p.num_slots, 0);
    for (size_t k = 0; k < nargs; ++k) {
      const dynamo_arg &a = args[k];
      switch (a.kind) {
        case DYNAMO_ARG_TENSOR: slots64[k] = (uint64_t)(uintptr_t)a.u.tensor->data + a.u.tensor->byte_offset; break;
        case DYNAMO_ARG_INT: memcpy(&slots64[k], &a.u.i, 8); break;
        case DYNAMO_ARG_FLOAT: memcpy(&slots64[k], &a.u.f, 8); break;
        default: slots64[k] = a.u.b != 0;
      }
    }
    for (size_t k = 0; k < nouts; ++k)
      slots64[p.num_inputs + k] = outs[k].data ? (uint64_t)(uintptr_t)outs[k].data + outs[k].byte_offset : 0;
    int32_t rc;
    gpu::Loaded::TakenExit taken;
    try {
      std::lock_guard<std::mutex> lock(gpu_mu);
      rc = gpu->run(std::move(slots64), &taken);
    } catch (const jit::Error &err) {
      *msg = err.what();
      return DYNAMO_ERR_RUNTIME;
    }
    if (rc == DYNAMO_RT_OK) return DYNAMO_OK;
    if (rc == DYNAMO_RT_SIDE_EXIT) {  // the live values as device tensors (their memory from the pool)
      exit_counts[taken.id].fetch_add(1, std::memory_order_relaxed);
      *msg = "left through side exit " + std::to_string(taken.id);
      const jit::SideExit &info = exits[(size_t)taken.id];
      const jit::Inst &g = trace.insts[(size_t)info.inst];
      std::vector<DLManagedTensor *> values;
      for (size_t k = 0; k < taken.values.size(); ++k)
        values.push_back(device_value(gpu_device, trace.types[(size_t)g.args[3 + k].value], taken.values[k]));
      if (exit) {
        exit->clear();
        exit->entry = this;
        exit->id = taken.id;
        exit->values.swap(values);
      }
      for (DLManagedTensor *m : values) m->deleter(m);  // (no one to take them)
      return DYNAMO_EXIT;
    }
    *msg = rc == DYNAMO_RT_INT_DIV_BY_ZERO      ? "ZeroDivisionError: integer floor division by zero"
           : rc == DYNAMO_RT_INDEX_OUT_OF_RANGE ? "IndexError: index out of range (an index op)"
                                                : "GPU program returned status " + std::to_string(rc);
    return DYNAMO_ERR_RUNTIME;
  }

  // Slots: inputs, outputs, then scratch (one allocation) and extern results; after them the
  // size table the code reads (engine.h CompiledCode::sizes).
  // Then slots[num_slots + 1]: non-null when the kept steps are skipped (their weights unchanged).
  void *stack_slots[64];
  std::vector<void *> heap_slots;
  void **slots = stack_slots;
  if (p.num_slots + 2 > 64) {
    heap_slots.resize(p.num_slots + 2);
    slots = heap_slots.data();
  }
  slots[p.num_slots] = const_cast<int64_t *>(code.sizes.data());
  slots[p.num_slots + 1] = nullptr;
  // Kept steps: skipped when the weights they read are the last complete run's.
  std::shared_lock<std::shared_mutex> kept_shared;
  std::unique_lock<std::shared_mutex> kept_alone;
  std::vector<std::string> kept_keys;
  bool skip_kept = false;
  if (kept) {
    bool keyed = true;
    for (int32_t w : p.kept_weights) {
      kept_keys.push_back(weight_key(args[w]));
      keyed &= !kept_keys.back().empty();
    }
    kept_shared = std::shared_lock<std::shared_mutex>(kept->mu);
    skip_kept = keyed && kept->valid && kept->keys == kept_keys;
    if (!skip_kept) {
      kept_shared.unlock();
      kept_alone = std::unique_lock<std::shared_mutex>(kept->mu);
      kept->valid = false;
    }
  }
  for (size_t k = 0; k < nargs; ++k) {
    const dynamo_arg &a = args[k];
    switch (a.kind) {
      case DYNAMO_ARG_TENSOR: slots[k] = (char *)a.u.tensor->data + a.u.tensor->byte_offset; break;
      case DYNAMO_ARG_INT: memcpy(&slots[k], &a.u.i, 8); break;
      case DYNAMO_ARG_FLOAT: memcpy(&slots[k], &a.u.f, 8); break;
      default: { int64_t b = a.u.b != 0; memcpy(&slots[k], &b, 8); }
    }
  }
  for (size_t k = 0; k < nouts; ++k)
    slots[p.num_inputs + k] = outs[k].data ? (char *)outs[k].data + outs[k].byte_offset : nullptr;
  auto in_arena = [&](int32_t s) { return p.scratch_bytes[s] && !(kept && p.slot_kept[(size_t)s]); };
  size_t scratch = 0;
  for (int32_t s = p.num_inputs + p.num_outputs; s < p.num_slots; ++s)
    if (in_arena(s)) scratch += (p.scratch_bytes[s] + 63) & ~size_t(63);
  Buffer arena_buf;
  if (scratch) {
    arena_buf = pool ? pool->acquire(scratch) : Buffer{aligned_alloc(64, (scratch + 63) & ~size_t(63)), scratch};
    if (!arena_buf.data) { *msg = "out of memory allocating " + std::to_string(scratch) + " bytes of scratch"; return DYNAMO_ERR_OUT_OF_MEMORY; }
  }
  char *arena = (char *)arena_buf.data;
  size_t at = 0;
  for (int32_t s = p.num_inputs + p.num_outputs; s < p.num_slots; ++s) {
    if (kept && p.slot_kept[(size_t)s]) {  // a kept kernel result lives in the entry's memory
      slots[s] = p.scratch_bytes[s] ? (char *)kept->memory + kept->offset[(size_t)s] : nullptr;
      continue;
    }
    slots[s] = in_arena(s) ? arena + at : nullptr;
    if (in_arena(s)) at += (p.scratch_bytes[s] + 63) & ~size_t(63);
  }
  if (skip_kept) {  // the kept extern results, and the flag that skips their steps
    for (const RunContext::KeptResult &r : kept->results) slots[r.slot] = r.data;
    slots[p.num_slots + 1] = (void *)1;
  }

  RunContext ctx;
  ctx.entry = this;
  ctx.num_threads = num_threads;
  ctx.args = args;
  ctx.nargs = nargs;
  auto fn = reinterpret_cast<int32_t (*)(void **, void *)>(code.fn);
  int32_t rc;
  {
    BlasHold hold(stats.num_externs > 0);  // LibTorch's products on this thread, see openblas.h
    ctx.profile_on = step_times && profile_this_run();
    if (ctx.profile_on) {
      auto t0 = std::chrono::steady_clock::now();
      rc = fn(slots, &ctx);
      run_time.ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      run_time.runs += 1;
    } else {
      rc = fn(slots, &ctx);
    }
  }
  if (kept && !skip_kept && rc == DYNAMO_RT_OK) {  // (a side exit or failure leaves them unkept)
    kept->results = std::move(ctx.kept_results);
    kept->keys = std::move(kept_keys);
    kept->valid = std::find(kept->keys.begin(), kept->keys.end(), std::string()) == kept->keys.end();
    kept_computes.fetch_add(1, std::memory_order_relaxed);
  }
  // Extern results handed out as outputs, before the scratch goes back to the pool (a result
  // that views scratch is copied out of it first).
  for (size_t k = 0; rc == DYNAMO_RT_OK && handed && k < nouts; ++k) {
    if (outs[k].data || p.output_extern_slot[k] < 0 || trace.types[trace.outputs[k]].numel() == 0) continue;
    handed[k] = hand_out_extern_result(ctx, slots[p.output_extern_slot[k]]);
    if (!handed[k]) {
      for (size_t j = 0; j < k; ++j)
        if (handed[j] && handed[j]->deleter) handed[j]->deleter(handed[j]), handed[j] = nullptr;
      if (pool) pool->release(arena_buf); else free(arena_buf.data);
      *msg = "output " + std::to_string(k) + ": the extern result it is was not kept";
      return DYNAMO_ERR_INTERNAL;
    }
  }
  if (pool) pool->release(arena_buf); else free(arena_buf.data);
  switch (rc) {
    case DYNAMO_RT_OK: return DYNAMO_OK;
    case DYNAMO_RT_INT_DIV_BY_ZERO: *msg = "ZeroDivisionError: integer floor division by zero"; return DYNAMO_ERR_RUNTIME;
    case DYNAMO_RT_INDEX_OUT_OF_RANGE: *msg = "IndexError: index out of range (an index op)"; return DYNAMO_ERR_RUNTIME;
    case DYNAMO_RT_EXTERN_FAILED: *msg = ctx.error; return DYNAMO_ERR_RUNTIME;
    case DYNAMO_RT_SIDE_EXIT: {
      exit_counts[ctx.exit.id].fetch_add(1, std::memory_order_relaxed);
      std::shared_ptr<const Links> l = std::atomic_load(&links);
      if (l && !(*l)[ctx.exit.id].empty()) {
        // Linked side traces: this call's arguments, then the exit's live values.
        std::vector<dynamo_arg> args2(args, args + nargs);
        for (DLManagedTensor *m : ctx.exit.values) {
          dynamo_arg a{};
          a.kind = DYNAMO_ARG_TENSOR;
          a.u.tensor = &m->dl_tensor;
          args2.push_back(a);
        }
        for (const Entry *side : (*l)[ctx.exit.id])
          if (guards::guards_pass(side->guards, args2.data(), args2.size()))
            return side->run(args2.data(), args2.size(), outs, nouts, pool, msg, exit);
      }
      *msg = "left through side exit " + std::to_string(ctx.exit.id);
      if (exit) {
        exit->clear();
        exit->entry = this;
        exit->id = ctx.exit.id;
        exit->values.swap(ctx.exit.values);
      }
      return DYNAMO_EXIT;
    }
    default: *msg = "trace returned unknown code " + std::to_string(rc); return DYNAMO_ERR_INTERNAL;
  }
}

}  // namespace dynamo::runtime
