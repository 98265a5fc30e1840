// capi.cpp -- the only extern "C" code: handle wrap/unwrap and liveness, status codes, the
// thread-local last error, and the catch-all that keeps C++ exceptions inside the library.
#include <algorithm>
#include <cstddef>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "dynamo.h"
#include "gpu/cuda_driver.h"
#include "gpu/program.h"
#include "runtime/openblas.h"
#include "runtime/entry.h"
#include "runtime/sized.h"

using namespace dynamo;

// The public structs' layout is the ABI: a change here must bump DYNAMO_ABI_VERSION (a field
// appended to a struct that has struct_size: DYNAMO_ABI_MINOR). Sizes for LP64 targets.
static_assert(DYNAMO_MAX_DIMS == jit::kMaxDims, "the header and the engine disagree on the rank limit");
static_assert(sizeof(void *) != 8 || sizeof(dynamo_engine_options) == 40, "dynamo_engine_options layout changed");
static_assert(offsetof(dynamo_engine_options, pool_bytes) == 24 && offsetof(dynamo_engine_options, device_index) == 36,
              "dynamo_engine_options layout changed");
static_assert(sizeof(void *) != 8 || sizeof(dynamo_arg) == 16, "dynamo_arg layout changed");
static_assert(offsetof(dynamo_arg, u) == 8, "dynamo_arg layout changed");
static_assert(sizeof(void *) != 8 || sizeof(dynamo_versioned_tensor) == 56, "dynamo_versioned_tensor layout changed");
static_assert(offsetof(dynamo_versioned_tensor, tensor) == 0, "the DLTensor must come first");
static_assert(sizeof(dynamo_tensor_info) == 8 + 8 * DYNAMO_MAX_DIMS, "dynamo_tensor_info layout changed");
static_assert(sizeof(dynamo_output_alias) == 16 + 8 * DYNAMO_MAX_DIMS && offsetof(dynamo_output_alias, strides) == 16,
              "dynamo_output_alias layout changed");
static_assert(sizeof(dynamo_entry_stats) == 40 && offsetof(dynamo_entry_stats, compile_ms) == 16 &&
                  offsetof(dynamo_entry_stats, from_cache) == 24 && offsetof(dynamo_entry_stats, shared_code) == 28 &&
                  offsetof(dynamo_entry_stats, kept_steps) == 32 && offsetof(dynamo_entry_stats, kept_computes) == 36,
              "dynamo_entry_stats layout changed");
static_assert(sizeof(dynamo_status) == sizeof(int), "dynamo_status must stay an int-sized enum");

/* -- Handles -- */

struct dynamo_engine {
  dynamo_engine_options opts;
  std::shared_ptr<dynamo::gpu::Device> device;  // device_type kDLCUDA: where entries run
  std::unique_ptr<jit::Engine> engine;
  std::shared_ptr<runtime::BufferPool> pool;  // shared with outputs still held by callers
  std::atomic<int> frames{0};
};

struct dynamo_entry {
  std::unique_ptr<runtime::Entry> e;
  dynamo_engine *engine = nullptr;
  const struct dynamo_frame *frame = nullptr;  // the frame that owns it
};

struct dynamo_frame {
  dynamo_engine *engine;
  std::string name;
  uint64_t id;
  mutable std::shared_mutex mu;  // compile takes it exclusively, lookups shared
  std::vector<std::unique_ptr<dynamo_entry>> entries;
  std::vector<std::unique_ptr<runtime::SizedTemplate>> sized;  // dynamo_frame_add_sized, in order
};

struct dynamo_trace {
  jit::Trace t;
};

namespace {

const char *kVersion = "0.1.0";
thread_local std::string t_last_error;
std::atomic<uint64_t> g_next_id{1};

// Live handles with their kind: a destroyed, foreign or wrongly-typed pointer is reported,
// never dereferenced.
enum class Kind : uint8_t { Engine, Frame, Trace, Entry };
template <class T> constexpr Kind kind_of();
template <> constexpr Kind kind_of<dynamo_engine>() { return Kind::Engine; }
template <> constexpr Kind kind_of<dynamo_frame>() { return Kind::Frame; }
template <> constexpr Kind kind_of<dynamo_trace>() { return Kind::Trace; }
template <> constexpr Kind kind_of<dynamo_entry>() { return Kind::Entry; }

std::mutex g_live_mu;
std::unordered_map<const void *, Kind> g_live;

template <class T> void live_add(const T *h) {
  std::lock_guard<std::mutex> l(g_live_mu);
  g_live[h] = kind_of<T>();
}
void live_remove(const void *h) {
  std::lock_guard<std::mutex> l(g_live_mu);
  g_live.erase(h);
}
template <class T> bool live(const T *h) {
  std::lock_guard<std::mutex> l(g_live_mu);
  auto it = g_live.find(h);
  return it != g_live.end() && it->second == kind_of<T>();
}

dynamo_status set_error(dynamo_status s, const std::string &msg) {
  t_last_error = msg;
  return s;
}

dynamo_status status_of(jit::ErrorCode c) {
  switch (c) {
    case jit::ErrorCode::Parse: return DYNAMO_ERR_PARSE;
    case jit::ErrorCode::Verify: return DYNAMO_ERR_VERIFY;
    case jit::ErrorCode::Compile: return DYNAMO_ERR_COMPILE;
    case jit::ErrorCode::Unsupported: return DYNAMO_ERR_UNSUPPORTED;
    case jit::ErrorCode::Runtime: return DYNAMO_ERR_RUNTIME;
    case jit::ErrorCode::Internal: return DYNAMO_ERR_INTERNAL;
  }
  return DYNAMO_ERR_INTERNAL;
}

// Checks a handle argument: NULL and dead handles get distinct, named errors.
#define CHECK_HANDLE(h, what)                                                                   \
  do {                                                                                          \
    if (!(h)) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, std::string(__func__) + ": " what " is NULL"); \
    if (!live(h))                                                                               \
      return set_error(DYNAMO_ERR_INVALID_HANDLE,                                               \
                       std::string(__func__) + ": " what " is not a live handle (destroyed?)"); \
  } while (0)
#define CHECK_PTR(p, what)                                                                      \
  do {                                                                                          \
    if (!(p)) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, std::string(__func__) + ": " what " is NULL"); \
  } while (0)

#define API_BEGIN try {
#define API_END                                                                                 \
  }                                                                                             \
  catch (const jit::Error &e) { return set_error(status_of(e.code), e.what()); }                \
  catch (const std::bad_alloc &) { return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "out of memory"); } \
  catch (const std::exception &e) {                                                             \
    return set_error(DYNAMO_ERR_INTERNAL, std::string(__func__) + ": " + e.what());             \
  }                                                                                             \
  catch (...) { return set_error(DYNAMO_ERR_INTERNAL, std::string(__func__) + ": unknown exception"); }

char *dup_string(const std::string &s) {
  char *r = static_cast<char *>(malloc(s.size() + 1));
  if (r) memcpy(r, s.c_str(), s.size() + 1);
  return r;
}

void write_why(char *why, size_t why_len, const std::string &s) {
  if (!why || !why_len) return;
  size_t n = std::min(s.size(), why_len - 1);
  memcpy(why, s.data(), n);
  why[n] = 0;
}

}  // namespace

extern "C" {

/* -- Versions and errors -- */

const char *dynamo_last_error(void) { return t_last_error.c_str(); }
uint32_t dynamo_abi_version(void) { return DYNAMO_ABI_VERSION; }
uint32_t dynamo_abi_minor_version(void) { return DYNAMO_ABI_MINOR; }

const char *dynamo_version_string(void) { return kVersion; }
void dynamo_string_free(char *s) { free(s); }

const char *dynamo_status_name(dynamo_status s) {
  switch (s) {
#define DYNAMO_STATUS_NAME_(name, value) \
  case DYNAMO_##name: return "DYNAMO_" #name;
    DYNAMO_STATUS_LIST(DYNAMO_STATUS_NAME_)
#undef DYNAMO_STATUS_NAME_
  }
  return "DYNAMO_ERR_UNKNOWN";
}

/* -- Engine -- */

void dynamo_engine_options_init(dynamo_engine_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->opt_level = 2;
}

dynamo_status dynamo_engine_create(const dynamo_engine_options *opts, dynamo_engine **out) {
  CHECK_PTR(out, "out");
  *out = nullptr;
  API_BEGIN
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  std::shared_ptr<gpu::Device> dev;
  if (opts) {
    if (opts->struct_size < sizeof(uint32_t) * 4 || opts->struct_size > sizeof o)
      return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_create: opts->struct_size is " +
                                                        std::to_string(opts->struct_size) + ", expected " +
                                                        std::to_string(sizeof o));
    memcpy(&o, opts, opts->struct_size);
    if (o.opt_level > 3) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_create: opt_level must be 0..3");
    if (o.vector_bits && o.vector_bits != 128 && o.vector_bits != 256 && o.vector_bits != 512)
      return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_create: vector_bits must be 0, 128, 256 or 512");
    if (o.reserved) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_create: reserved must be 0");
    if (o.device_type != 0 && o.device_type != kDLCPU && o.device_type != kDLCUDA)
      return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_create: device_type must be kDLCPU or kDLCUDA");
    if (o.device_type == kDLCUDA) {
      std::string why;
      if (!gpu::cuda_driver_available(&why)) return set_error(DYNAMO_ERR_NO_DEVICE, "dynamo_engine_create: " + why);
      try {
        dev = gpu::Device::open(o.device_index);
      } catch (const jit::Error &err) {
        std::string m = err.what();
        return set_error(m.rfind("no device", 0) == 0 ? DYNAMO_ERR_NO_DEVICE : status_of(err.code),
                         "dynamo_engine_create: " + m);
      }
    }
  }
  if (!o.pool_bytes) o.pool_bytes = uint64_t(1) << 30;
  auto e = std::make_unique<dynamo_engine>();
  e->opts = o;
  e->device = dev;
  jit::EngineOptions eo;
  eo.opt_level = (int)o.opt_level;
  eo.vector_bits = (int)o.vector_bits;
  e->engine = std::make_unique<jit::Engine>(eo, runtime::runtime_symbols());
  e->pool = std::make_shared<runtime::BufferPool>(o.pool_bytes > 1 ? (size_t)o.pool_bytes : 0);
  *out = e.release();
  live_add(*out);
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_engine_destroy(dynamo_engine *engine) {
  if (!engine) return DYNAMO_OK;
  CHECK_HANDLE(engine, "engine");
  if (engine->frames.load() != 0)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_engine_destroy: " + std::to_string(engine->frames.load()) +
                                                      " frame(s) still use this engine; destroy them first");
  live_remove(engine);
  delete engine;
  return DYNAMO_OK;
}

/* -- Traces -- */

dynamo_status dynamo_trace_parse(const char *text, size_t len, dynamo_trace **out) {
  CHECK_PTR(out, "out");
  *out = nullptr;
  CHECK_PTR(text, "text");
  API_BEGIN
  std::string s = len == (size_t)-1 ? std::string(text) : std::string(text, len);
  auto t = std::make_unique<dynamo_trace>();
  t->t = jit::parse_trace(s);
  *out = t.release();
  live_add(*out);
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_trace_print(const dynamo_trace *trace, char **out_text) {
  CHECK_PTR(out_text, "out_text");
  *out_text = nullptr;
  CHECK_HANDLE(trace, "trace");
  API_BEGIN
  *out_text = dup_string(jit::print_trace(trace->t));
  if (!*out_text) return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "out of memory");
  return DYNAMO_OK;
  API_END
}

void dynamo_trace_destroy(dynamo_trace *trace) {
  if (!trace || !live(trace)) return;
  live_remove(trace);
  delete trace;
}

dynamo_status dynamo_trace_create(const char *name, dynamo_trace **out) {
  CHECK_PTR(out, "out");
  *out = nullptr;
  API_BEGIN
  auto t = std::make_unique<dynamo_trace>();
  if (name && *name) {
    for (const char *c = name; *c; ++c)
      if (!isalnum((unsigned char)*c) && *c != '_' && *c != '.')
        return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_create: name may only hold letters, digits, '_' and '.'");
    t->t.name = name;
  }
  *out = t.release();
  live_add(*out);
  return DYNAMO_OK;
  API_END
}

static dynamo_status add_input(dynamo_trace *trace, const jit::Type &ty, int32_t *out_value) {
  jit::Inst in;
  in.op = jit::Op::input;
  int32_t v = trace->t.new_value(ty, (int32_t)trace->t.insts.size());
  in.results.push_back(v);
  trace->t.insts.push_back(in);
  trace->t.inputs.push_back(v);
  if (out_value) *out_value = v;
  return DYNAMO_OK;
}

static bool valid_dtype(int d) { return d >= DYNAMO_BOOL && d <= DYNAMO_BFLOAT16; }

dynamo_status dynamo_trace_add_tensor_input(dynamo_trace *trace, dynamo_dtype dtype, int32_t ndim,
                                            const int64_t *sizes, const int64_t *strides, int32_t *out_value) {
  CHECK_HANDLE(trace, "trace");
  if (!valid_dtype(dtype)) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_tensor_input: unknown dtype " + std::to_string((int)dtype));
  if (ndim < 0 || ndim > DYNAMO_MAX_DIMS)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT,
                     "dynamo_trace_add_tensor_input: ndim must be 0.." + std::to_string(DYNAMO_MAX_DIMS));
  if (ndim > 0) CHECK_PTR(sizes, "sizes");
  API_BEGIN
  jit::Type ty;
  ty.dtype = (jit::DType)dtype;
  ty.sizes.assign(sizes, sizes + ndim);
  for (int64_t s : ty.sizes)
    if (s < 0) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_tensor_input: negative size");
  if (strides) {
    ty.strides.assign(strides, strides + ndim);
    if (ty.strides == jit::contiguous_strides(ty.sizes)) ty.strides.clear();
  }
  std::string why = jit::type_size_problem(ty);
  if (!why.empty()) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_tensor_input: " + why);
  return add_input(trace, ty, out_value);
  API_END
}

dynamo_status dynamo_trace_add_scalar_input(dynamo_trace *trace, dynamo_dtype dtype, int32_t *out_value) {
  CHECK_HANDLE(trace, "trace");
  if (dtype != DYNAMO_BOOL && dtype != DYNAMO_INT64 && dtype != DYNAMO_FLOAT64)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_scalar_input: scalars are BOOL, INT64 or FLOAT64");
  API_BEGIN
  jit::Type ty;
  ty.tensor = false;
  ty.dtype = (jit::DType)dtype;
  return add_input(trace, ty, out_value);
  API_END
}

dynamo_status dynamo_trace_add_instruction(dynamo_trace *trace, const char *line, int32_t *out_value) {
  CHECK_HANDLE(trace, "trace");
  CHECK_PTR(line, "line");
  API_BEGIN
  int32_t v = jit::parse_instruction_into(trace->t, line);
  if (out_value) *out_value = v;
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_trace_add_output(dynamo_trace *trace, int32_t value) {
  CHECK_HANDLE(trace, "trace");
  if (value < 0 || value >= (int32_t)trace->t.types.size())
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_output: %" + std::to_string(value) + " is not defined");
  if (!trace->t.types[value].tensor)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_trace_add_output: %" + std::to_string(value) + " is a scalar");
  API_BEGIN
  trace->t.outputs.push_back(value);
  return DYNAMO_OK;
  API_END
}

/* -- Frames -- */

dynamo_status dynamo_frame_create(dynamo_engine *engine, const char *name, dynamo_frame **out) {
  CHECK_PTR(out, "out");
  *out = nullptr;
  CHECK_HANDLE(engine, "engine");
  API_BEGIN
  auto f = std::make_unique<dynamo_frame>();
  f->engine = engine;
  f->name = name ? name : "frame";
  f->id = g_next_id++;
  engine->frames++;
  *out = f.release();
  live_add(*out);
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_frame_destroy(dynamo_frame *frame) {
  if (!frame) return DYNAMO_OK;
  CHECK_HANDLE(frame, "frame");
  live_remove(frame);
  {
    std::unique_lock<std::shared_mutex> l(frame->mu);
    for (auto &e : frame->entries) live_remove(e.get());
  }
  frame->engine->frames--;
  delete frame;  // entries drop their machine code through their resource trackers
  return DYNAMO_OK;
}

size_t dynamo_frame_num_entries(const dynamo_frame *frame) {
  if (!frame || !live(frame)) return 0;
  std::shared_lock<std::shared_mutex> l(frame->mu);
  return frame->entries.size();
}

// A compiled entry for frame (not yet in its cache).
static std::unique_ptr<dynamo_entry> compile_for(dynamo_frame *frame, const jit::Trace &t) {
  std::string fn = "dynamo_trace_" + std::to_string(frame->id) + "_" + std::to_string(g_next_id++);
  int threads = (int)frame->engine->opts.num_threads;
  auto e = std::make_unique<dynamo_entry>();
  e->e = frame->engine->device ? runtime::compile_gpu_entry(frame->engine->device, t, fn)
                               : runtime::compile_entry(*frame->engine->engine, t, fn, threads);
  e->engine = frame->engine;
  e->frame = frame;
  e->e->api_handle = e.get();
  return e;
}

static dynamo_entry *add_entry(dynamo_frame *frame, std::unique_ptr<dynamo_entry> e) {
  dynamo_entry *h = e.get();
  {
    std::unique_lock<std::shared_mutex> l(frame->mu);
    frame->entries.push_back(std::move(e));
  }
  live_add(h);
  return h;
}

dynamo_status dynamo_compile_frame(dynamo_frame *frame, const dynamo_trace *trace, dynamo_entry **out_entry) {
  if (out_entry) *out_entry = nullptr;
  CHECK_HANDLE(frame, "frame");
  CHECK_HANDLE(trace, "trace");
  API_BEGIN
  dynamo_entry *h = add_entry(frame, compile_for(frame, trace->t));
  if (out_entry) *out_entry = h;
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_frame_add_sized(dynamo_frame *frame, const char *text, size_t len, int32_t *out_index) {
  if (out_index) *out_index = -1;
  CHECK_HANDLE(frame, "frame");
  CHECK_PTR(text, "text");
  API_BEGIN
  std::string s = len == (size_t)-1 ? std::string(text) : std::string(text, len);
  auto t = std::make_unique<runtime::SizedTemplate>(runtime::make_sized_template(s));
  std::unique_lock<std::shared_mutex> l(frame->mu);
  if (frame->sized.size() >= 64)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_frame_add_sized: a frame holds at most 64 sized traces");
  frame->sized.push_back(std::move(t));
  if (out_index) *out_index = (int32_t)frame->sized.size() - 1;
  return DYNAMO_OK;
  API_END
}

size_t dynamo_frame_num_sized(const dynamo_frame *frame) {
  if (!frame || !live(frame)) return 0;
  std::shared_lock<std::shared_mutex> l(frame->mu);
  return frame->sized.size();
}

// The most instances one sized trace compiles (each is an entry of the frame).
constexpr size_t kMaxSizedInstances = 1024;

// A call no entry accepted: the first sized trace whose variables bind to the call's sizes is
// compiled at them (an entry added to the frame) when that entry's guards accept the call.
// Returns it, or nullptr with each template's reason appended to why.
static dynamo_entry *instance_for(dynamo_frame *frame, const dynamo_arg *args, size_t nargs, std::string *why) {
  std::vector<runtime::SizedTemplate *> tmpls;
  {
    std::shared_lock<std::shared_mutex> l(frame->mu);
    for (auto &t : frame->sized) tmpls.push_back(t.get());
  }
  for (size_t k = 0; k < tmpls.size(); ++k) {
    runtime::SizedTemplate &t = *tmpls[k];
    std::string head = "; sized trace " + std::to_string(k) + ": ", w;
    std::vector<int64_t> values;
    if (!runtime::bind_sizes(t, args, nargs, &values, &w)) {
      *why += head + w;
      continue;
    }
    {
      std::shared_lock<std::shared_mutex> l(frame->mu);
      bool refused = std::find(t.refused.begin(), t.refused.end(), values) != t.refused.end();
      if (refused || t.instances >= kMaxSizedInstances) {
        *why += head + (refused ? std::string("its instance at these sizes refused the call before")
                                : "compiled " + std::to_string(kMaxSizedInstances) + " instances already (the limit)");
        continue;
      }
    }
    std::unique_ptr<dynamo_entry> e;
    try {
      e = compile_for(frame, jit::parse_trace(runtime::instantiate_sized(t, values)));
    } catch (const jit::Error &err) {
      w = std::string("its instance at these sizes did not compile: ") + err.what();
    }
    if (e && !guards::guards_pass(e->e->guards, args, nargs)) {
      w = "its instance at these sizes refused the call: " + guards::explain_guards(e->e->guards, args, nargs);
      e.reset();
    }
    if (!e) {
      std::unique_lock<std::shared_mutex> l(frame->mu);
      if (t.refused.size() < 256) t.refused.push_back(values);
      *why += head + w;
      continue;
    }
    {
      std::unique_lock<std::shared_mutex> l(frame->mu);
      t.instances++;
    }
    return add_entry(frame, std::move(e));
  }
  return nullptr;
}

dynamo_status dynamo_check_guards(dynamo_frame *frame, const dynamo_arg *args, size_t nargs, dynamo_entry **out_entry,
                                  char *why, size_t why_len) {
  if (out_entry) *out_entry = nullptr;
  CHECK_HANDLE(frame, "frame");
  CHECK_PTR(out_entry, "out_entry");
  if (nargs && !args) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_check_guards: args is NULL");
  API_BEGIN
  {
    std::shared_lock<std::shared_mutex> l(frame->mu);
    for (auto &e : frame->entries)
      if (guards::guards_pass(e->e->guards, args, nargs)) {
        *out_entry = e.get();
        return DYNAMO_OK;
      }
  }
  std::string sized_why;
  if (dynamo_entry *made = instance_for(frame, args, nargs, &sized_why)) {
    *out_entry = made;
    return DYNAMO_OK;
  }
  // Cold path: explain every entry's first failing guard, and why no sized trace served it.
  std::shared_lock<std::shared_mutex> l(frame->mu);
  std::string msg;
  if (frame->entries.empty() && frame->sized.empty()) msg = "frame '" + frame->name + "' has no compiled entries";
  for (size_t k = 0; k < frame->entries.size(); ++k)
    msg += (k ? "; " : "") + ("entry " + std::to_string(k) + ": ") +
           guards::explain_guards(frame->entries[k]->e->guards, args, nargs);
  if (!sized_why.empty()) msg += msg.empty() ? sized_why.substr(2) : sized_why;
  write_why(why, why_len, msg);
  return set_error(DYNAMO_ERR_GUARD_MISS, "guard miss: " + msg);
  API_END
}

dynamo_status dynamo_entry_check_guards(const dynamo_entry *entry, const dynamo_arg *args, size_t nargs, char *why,
                                        size_t why_len) {
  CHECK_HANDLE(entry, "entry");
  if (nargs && !args) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_check_guards: args is NULL");
  API_BEGIN
  if (guards::guards_pass(entry->e->guards, args, nargs)) return DYNAMO_OK;
  std::string msg = guards::explain_guards(entry->e->guards, args, nargs);
  write_why(why, why_len, msg);
  return set_error(DYNAMO_ERR_GUARD_MISS, "guard miss: " + msg);
  API_END
}

// The side exit of the last run on this thread that took one, until dynamo_take_exit.
thread_local runtime::Exit t_exit;

static dynamo_status run_entry(const dynamo_entry *entry, const dynamo_arg *args, size_t nargs, const DLTensor *outs,
                               size_t nouts, DLManagedTensor **handed = nullptr) {
  std::string msg;
  t_exit.clear();
  dynamo_status s = entry->e->run(args, nargs, outs, nouts, entry->engine->pool.get(), &msg, &t_exit, handed);
  if (s != DYNAMO_OK) return set_error(s, msg);
  return DYNAMO_OK;
}

dynamo_status dynamo_take_exit(int32_t *exit_id, DLManagedTensor **values, size_t capacity, size_t *num_values) {
  CHECK_PTR(exit_id, "exit_id");
  CHECK_PTR(num_values, "num_values");
  if (capacity && !values) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_take_exit: values is NULL");
  if (t_exit.id < 0) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_take_exit: no side exit is pending on this thread");
  *num_values = t_exit.values.size();
  if (capacity < t_exit.values.size())
    return set_error(DYNAMO_ERR_ARGUMENT_MISMATCH, "dynamo_take_exit: the exit has " +
                                                       std::to_string(t_exit.values.size()) +
                                                       " live value(s), capacity is " + std::to_string(capacity));
  *exit_id = t_exit.id;
  for (size_t k = 0; k < t_exit.values.size(); ++k) values[k] = t_exit.values[k];
  t_exit.values.clear();
  t_exit.id = -1;
  return DYNAMO_OK;
}

const dynamo_entry *dynamo_exit_entry(void) {
  return t_exit.id >= 0 && t_exit.entry ? static_cast<const dynamo_entry *>(t_exit.entry->api_handle) : nullptr;
}

dynamo_status dynamo_entry_link_exit(dynamo_entry *parent, int32_t exit_id, dynamo_entry *side) {
  CHECK_HANDLE(parent, "parent");
  CHECK_HANDLE(side, "side");
  API_BEGIN
  const runtime::Entry &P = *parent->e, &S = *side->e;
  auto bad = [](const std::string &why) { return set_error(DYNAMO_ERR_ARGUMENT_MISMATCH, "dynamo_entry_link_exit: " + why); };
  if (exit_id < 0 || exit_id >= P.num_exits)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_link_exit: exit " + std::to_string(exit_id) +
                                                      " does not exist (the parent has " + std::to_string(P.num_exits) + ")");
  if (&P == &S) return bad("an entry cannot be its own side trace");
  if (parent->frame != side->frame) return bad("parent and side trace must be entries of the same frame");
  size_t np = P.trace.inputs.size(), nl = (size_t)P.exit_live_count(exit_id);
  if (S.trace.inputs.size() != np + nl)
    return bad("the side trace takes " + std::to_string(S.trace.inputs.size()) + " input(s); linking needs the parent's " +
               std::to_string(np) + " followed by the exit's " + std::to_string(nl) + " live value(s)");
  for (size_t k = 0; k < np; ++k) {
    const jit::Type &a = P.trace.types[P.trace.inputs[k]], &b = S.trace.types[S.trace.inputs[k]];
    if (a.tensor != b.tensor || a.dtype != b.dtype || a.sizes != b.sizes)
      return bad("input " + std::to_string(k) + " differs between the parent and the side trace");
  }
  if (S.trace.outputs.size() != P.trace.outputs.size()) return bad("the side trace returns a different number of outputs");
  for (size_t k = 0; k < P.trace.outputs.size(); ++k) {
    const jit::Type &a = P.trace.types[P.trace.outputs[k]], &b = S.trace.types[S.trace.outputs[k]];
    if (a.dtype != b.dtype || a.sizes != b.sizes) return bad("output " + std::to_string(k) + " differs in dtype or shape");
    if (P.plan.output_alias[k].input >= 0 || S.plan.output_alias[k].input >= 0)
      return bad("output " + std::to_string(k) + " aliases an input (copy elision), which linking does not carry");
  }
  std::lock_guard<std::mutex> lock(P.link_mu);
  auto next = std::make_shared<runtime::Entry::Links>(P.links ? *P.links : runtime::Entry::Links((size_t)P.num_exits));
  (*next)[(size_t)exit_id].push_back(&S);
  std::atomic_store(&P.links, std::shared_ptr<const runtime::Entry::Links>(next));
  return DYNAMO_OK;
  API_END
}

/* -- The BLAS beside dynamo -- */
dynamo_status dynamo_blas_hold(int enter) {
  if (enter != 0 && enter != 1)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_blas_hold: enter must be 0 or 1, got " + std::to_string(enter));
  if (!runtime::blas_hold(enter == 1))
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_blas_hold: released without a hold");
  return DYNAMO_OK;
}

int dynamo_blas_threads(void) { return runtime::blas_threads(); }

dynamo_status dynamo_cache_directory(char **out_dir) {
  CHECK_PTR(out_dir, "out_dir");
  *out_dir = nullptr;
  API_BEGIN
  std::string why;
  std::string dir = jit::disk_cache_directory(&why);
  if (dir.empty())
    return set_error(DYNAMO_ERR_UNSUPPORTED, why.empty() ? "dynamo_cache_directory: the cache is off" : "dynamo_cache_directory: " + why);
  *out_dir = dup_string(dir);
  if (!*out_dir) return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "dynamo_cache_directory: out of memory");
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_gpu_available(char *why, size_t why_len) {
  API_BEGIN
  std::string msg;
  if (gpu::cuda_driver_available(&msg)) return DYNAMO_OK;
  if (why && why_len) {
    size_t n = std::min(why_len - 1, msg.size());
    memcpy(why, msg.data(), n);
    why[n] = 0;
  }
  return set_error(DYNAMO_ERR_NO_DEVICE, msg);
  API_END
}

dynamo_status dynamo_trace_to_ptx(const dynamo_trace *trace, const char *gpu_name, char **ptx_out) {
  CHECK_PTR(ptx_out, "ptx_out");
  *ptx_out = nullptr;
  CHECK_HANDLE(trace, "trace");
  CHECK_PTR(gpu_name, "gpu_name");
  API_BEGIN
  jit::Trace t = trace->t;
  jit::verify_trace(t);
  jit::decompose_externs(t);
  jit::simplify_trace(t);
  jit::Plan p = gpu::plan_for_gpu(t);
  // (products become cuBLASLt calls, not PTX; any other extern is refused with its reason)
  std::string ptx = gpu::compile_program(t, p, "dynamo_" + t.name, gpu_name).ptx;
  if (const char *dump = getenv("DYNAMO_DUMP_DIR"); dump && *dump) {  // next to the CPU dumps
    std::string path = std::string(dump) + "/dynamo_" + t.name + "." + gpu_name + ".ptx";
    if (FILE *f = fopen(path.c_str(), "w")) {
      fwrite(ptx.data(), 1, ptx.size(), f);
      fclose(f);
    }
  }
  *ptx_out = static_cast<char *>(malloc(ptx.size() + 1));
  if (!*ptx_out) return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "dynamo_trace_to_ptx: out of memory");
  memcpy(*ptx_out, ptx.c_str(), ptx.size() + 1);
  return DYNAMO_OK;
  API_END
}

size_t dynamo_entry_num_exits(const dynamo_entry *entry) {
  return entry && live(entry) ? (size_t)entry->e->num_exits : 0;
}

int64_t dynamo_entry_exit_count(const dynamo_entry *entry, int32_t exit_id) {
  if (!entry || !live(entry) || exit_id < 0 || exit_id >= entry->e->num_exits) return -1;
  return entry->e->exit_counts[exit_id].load(std::memory_order_relaxed);
}

dynamo_status dynamo_entry_choices(const dynamo_entry *entry, char **out_text) {
  CHECK_PTR(out_text, "out_text");
  *out_text = nullptr;
  CHECK_HANDLE(entry, "entry");
  API_BEGIN
  *out_text = dup_string(runtime::entry_choices(*entry->e));
  if (!*out_text) return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "dynamo_entry_choices: out of memory");
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_entry_profile(const dynamo_entry *entry, char **out_text) {
  CHECK_PTR(out_text, "out_text");
  *out_text = nullptr;
  CHECK_HANDLE(entry, "entry");
  API_BEGIN
  if (!entry->e->step_times)
    return set_error(DYNAMO_ERR_UNSUPPORTED, "dynamo_entry_profile: this entry was not profiled (set DYNAMO_PROFILE=1 "
                                             "before the library compiles it; GPU entries are not profiled)");
  *out_text = dup_string(runtime::entry_profile(*entry->e));
  if (!*out_text) return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "dynamo_entry_profile: out of memory");
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_entry_set_choices(dynamo_entry *entry, const char *choices) {
  CHECK_HANDLE(entry, "entry");
  CHECK_PTR(choices, "choices");
  API_BEGIN
  std::string why;
  if (!runtime::set_entry_choices(*entry->e, choices, &why))
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_set_choices: " + why);
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_entry_run(dynamo_entry *entry, const dynamo_arg *args, size_t nargs, const DLTensor *outs,
                               size_t nouts) {
  CHECK_HANDLE(entry, "entry");
  if (nargs && !args) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_run: args is NULL");
  if (nouts && !outs) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_run: outs is NULL");
  API_BEGIN
  if (!guards::guards_pass(entry->e->guards, args, nargs))
    return set_error(DYNAMO_ERR_GUARD_MISS, "guard miss: " + guards::explain_guards(entry->e->guards, args, nargs));
  return run_entry(entry, args, nargs, outs, nouts);
  API_END
}

namespace {

// An engine-allocated output: a buffer from the engine's pool (CPU entries) or device memory
// (CUDA entries, which keep the device open while one is held).
struct OwnedOutput {
  DLManagedTensor m{};
  int64_t shape[DYNAMO_MAX_DIMS] = {};
  std::shared_ptr<runtime::BufferPool> pool;
  runtime::Buffer buf;
  std::shared_ptr<gpu::Device> dev;
  uint64_t dptr = 0;
  size_t dbytes = 0;
  ~OwnedOutput() {
    if (pool) pool->release(buf);
    if (dev) {
      try {
        dev->release(dptr, dbytes);  // to the device's output pool
      } catch (...) {  // the driver failed while freeing; nothing else to do
      }
    }
  }
};

void owned_output_deleter(DLManagedTensor *self) {
  if (self) delete static_cast<OwnedOutput *>(self->manager_ctx);
}

}  // namespace

// The most outputs dynamo_entry_run_alloc clears on the caller's word alone (see there).
constexpr size_t kMaxClearedOutputs = 1 << 16;

dynamo_status dynamo_entry_run_alloc(dynamo_entry *entry, const dynamo_arg *args, size_t nargs,
                                     DLManagedTensor **out_tensors, size_t nouts) {
  if (nouts && !out_tensors) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_run_alloc: out_tensors is NULL");
  // Every output is NULL on failure (the header's promise), before anything else can fail. A
  // count past kMaxClearedOutputs (SIZE_MAX, a negative int cast) is not believed: only as many
  // as a live entry returns are cleared, and the mismatch is reported below.
  {
    size_t clear = nouts;
    if (nouts > kMaxClearedOutputs) clear = entry && live(entry) ? std::min(nouts, entry->e->trace.outputs.size()) : 0;
    for (size_t k = 0; k < clear; ++k) out_tensors[k] = nullptr;
  }
  CHECK_HANDLE(entry, "entry");
  if (nargs && !args) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_run_alloc: args is NULL");
  API_BEGIN
  const runtime::Entry &E = *entry->e;
  if (nouts != E.trace.outputs.size())
    return set_error(DYNAMO_ERR_ARGUMENT_MISMATCH, "dynamo_entry_run_alloc: expected " +
                                                       std::to_string(E.trace.outputs.size()) + " output(s), got " +
                                                       std::to_string(nouts));
  if (!guards::guards_pass(E.guards, args, nargs))
    return set_error(DYNAMO_ERR_GUARD_MISS, "guard miss: " + guards::explain_guards(E.guards, args, nargs));
  std::vector<std::unique_ptr<OwnedOutput>> held(nouts);
  std::vector<DLTensor> outs(nouts);  // on any failure `held` hands the buffers back
  for (size_t k = 0; k < nouts; ++k) {
    const jit::Type &ty = E.trace.types[E.trace.outputs[k]];
    DLTensor &o = outs[k];
    o = DLTensor{};
    o.device = E.gpu_device ? DLDevice{kDLCUDA, E.gpu_device->index()} : DLDevice{kDLCPU, 0};
    guards::dl_type_of(ty.dtype, &o.dtype.code, &o.dtype.bits);
    o.dtype.lanes = 1;
    o.ndim = ty.rank();
    if (E.plan.output_alias[k].input >= 0) {  // the caller makes the view
      o.shape = const_cast<int64_t *>(ty.sizes.data());
      continue;
    }
    if (!E.gpu_device && E.plan.output_extern_slot[k] >= 0 && ty.numel() > 0) {  // the extern's own tensor, no copy
      o.shape = const_cast<int64_t *>(ty.sizes.data());
      continue;
    }
    auto p = std::make_unique<OwnedOutput>();
    for (int d = 0; d < o.ndim; ++d) p->shape[d] = ty.sizes[d];
    size_t bytes = (size_t)ty.numel() * (size_t)((o.dtype.bits + 7) / 8);
    if (E.gpu_device) {
      p->dev = E.gpu_device;
      p->dptr = p->dev->acquire(bytes);  // from the device's output pool; throws when out of memory
      p->dbytes = bytes;
      o.data = reinterpret_cast<void *>((uintptr_t)p->dptr);
    } else {
      p->pool = entry->engine->pool;
      p->buf = p->pool->acquire(bytes);
      if (!p->buf.data)
        return set_error(DYNAMO_ERR_OUT_OF_MEMORY, "dynamo_entry_run_alloc: out of memory allocating output " +
                                                       std::to_string(k) + " (" + std::to_string(bytes) + " bytes)");
      o.data = p->buf.data;
    }
    o.shape = p->shape;
    p->m.dl_tensor = o;
    p->m.manager_ctx = p.get();
    p->m.deleter = owned_output_deleter;
    held[k] = std::move(p);
  }
  std::vector<DLManagedTensor *> handed(nouts, nullptr);
  dynamo_status s = run_entry(entry, args, nargs, outs.data(), nouts, handed.data());
  if (s != DYNAMO_OK) return s;
  for (size_t k = 0; k < nouts; ++k)
    if (held[k]) out_tensors[k] = &held[k].release()->m;
    else if (handed[k]) out_tensors[k] = handed[k];
  return DYNAMO_OK;
  API_END
}

dynamo_status dynamo_frame_run(dynamo_frame *frame, const dynamo_arg *args, size_t nargs, const DLTensor *outs,
                               size_t nouts) {
  CHECK_HANDLE(frame, "frame");
  if (nargs && !args) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_frame_run: args is NULL");
  if (nouts && !outs) return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_frame_run: outs is NULL");
  dynamo_entry *e = nullptr;
  dynamo_status s = dynamo_check_guards(frame, args, nargs, &e, nullptr, 0);
  if (s != DYNAMO_OK) return s;
  API_BEGIN
  return run_entry(e, args, nargs, outs, nouts);
  API_END
}

size_t dynamo_entry_num_inputs(const dynamo_entry *entry) {
  return entry && live(entry) ? entry->e->trace.inputs.size() : 0;
}
size_t dynamo_entry_num_outputs(const dynamo_entry *entry) {
  return entry && live(entry) ? entry->e->trace.outputs.size() : 0;
}

dynamo_status dynamo_entry_output_info(const dynamo_entry *entry, size_t k, dynamo_tensor_info *info) {
  CHECK_HANDLE(entry, "entry");
  CHECK_PTR(info, "info");
  const jit::Trace &t = entry->e->trace;
  if (k >= t.outputs.size())
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_output_info: output " + std::to_string(k) +
                                                      " out of range (entry has " + std::to_string(t.outputs.size()) + ")");
  const jit::Type &ty = t.types[t.outputs[k]];
  memset(info, 0, sizeof *info);
  info->dtype = (int32_t)ty.dtype;
  info->ndim = ty.rank();
  for (int d = 0; d < ty.rank(); ++d) info->sizes[d] = ty.sizes[d];
  return DYNAMO_OK;
}

dynamo_status dynamo_entry_output_alias(const dynamo_entry *entry, size_t k, dynamo_output_alias *alias) {
  CHECK_HANDLE(entry, "entry");
  CHECK_PTR(alias, "alias");
  const jit::Plan &p = entry->e->plan;
  if (k >= p.output_alias.size())
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_output_alias: output " + std::to_string(k) +
                                                      " out of range (entry has " + std::to_string(p.output_alias.size()) + ")");
  const jit::OutputAlias &a = p.output_alias[k];
  memset(alias, 0, sizeof *alias);
  alias->input = a.input;
  alias->ndim = entry->e->trace.types[entry->e->trace.outputs[k]].rank();
  if (a.input >= 0) {
    alias->offset = a.view.offset;
    for (int d = 0; d < alias->ndim; ++d) alias->strides[d] = a.view.strides[d];
  }
  return DYNAMO_OK;
}

dynamo_status dynamo_entry_get_stats(const dynamo_entry *entry, dynamo_entry_stats *stats) {
  CHECK_HANDLE(entry, "entry");
  CHECK_PTR(stats, "stats");
  if (stats->struct_size < sizeof(uint32_t) * 4)
    return set_error(DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_get_stats: set stats->struct_size = sizeof(dynamo_entry_stats)");
  size_t n = std::min<size_t>(stats->struct_size, sizeof(dynamo_entry_stats));
  dynamo_entry_stats s = entry->e->stats;
  s.struct_size = (uint32_t)n;
  s.kept_computes = (uint32_t)std::min<int64_t>(entry->e->kept_computes.load(std::memory_order_relaxed), UINT32_MAX);
  memcpy(stats, &s, n);
  return DYNAMO_OK;
}

}  // extern "C"
