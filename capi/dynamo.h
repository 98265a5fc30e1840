/* dynamo.h -- the stable C API of the dynamo trace JIT (C99 / C++; installed as <dynamo/dynamo.h>).
 * Opaque handles, a status code from every fallible call, a thread-local last-error message,
 * tensors as DLPack DLTensor. No C++ exception ever crosses this boundary. */
#ifndef DYNAMO_DYNAMO_H
#define DYNAMO_DYNAMO_H

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DYNAMO_API __declspec(dllexport)
#else
#define DYNAMO_API __attribute__((visibility("default")))
#endif

/* -- Versions ------------------------------------------------------------------------- */

#define DYNAMO_ABI_VERSION 1u   /* bumped on any incompatible change of this header */
/* Bumped on every additive change (a new function, status, dtype or struct field at the end);
 * reset to 0 when DYNAMO_ABI_VERSION is bumped. A caller that needs something added in minor M
 * checks dynamo_abi_minor_version() >= M. Minor 1 added dynamo_abi_minor_version itself, minor 2
 * dynamo_entry_stats.shared_code, minor 3 sized traces (dynamo_frame_add_sized), minor 4
 * dynamo_entry_profile, minor 5 dynamo_entry_stats.kept_steps and kept_computes. */
#define DYNAMO_ABI_MINOR 5u

/* The most dimensions a tensor may have anywhere in the API (traces, DLTensors, info structs). */
#define DYNAMO_MAX_DIMS 16

/* DLPack 0.6 (Debian bookworm) has no boolean type code; later DLPack uses 6 (kDLBool).
 * dynamo reads booleans as {code 6, bits 8, lanes 1}, one byte per element (0 or 1). */
#define DYNAMO_DL_BOOL 6u

/* -- Status and errors ---------------------------------------------------------------- */

/* The one table of status codes: X(name, value). It generates the enum below and the library's
 * dynamo_status_name; the Python shim reads the names back through dynamo_status_name. Values
 * are stable; new codes are added at the end (with a DYNAMO_ABI_MINOR bump). */
#define DYNAMO_STATUS_LIST(X)                                                                  \
  X(OK, 0)                                                                                     \
  X(ERR_INVALID_ARGUMENT, 1)  /* NULL pointer, bad count, bad option, a built size past int64 */\
  X(ERR_INVALID_HANDLE, 2)    /* a handle that was destroyed, never created, or of a kind */   \
                              /* other than the function takes */                              \
  X(ERR_PARSE, 3)             /* malformed trace text (message has line:column) */             \
  X(ERR_VERIFY, 4)            /* ill-typed trace (message names the instruction) */            \
  X(ERR_COMPILE, 5)           /* code generation or LLVM failure */                            \
  X(ERR_GUARD_MISS, 6)        /* no entry's guards accept these inputs */                      \
  X(ERR_ARGUMENT_MISMATCH, 7) /* run-time inputs/outputs do not match the entry */             \
  X(ERR_RUNTIME, 8)           /* running failed: an extern raised, int div by 0, bad index */  \
  X(ERR_UNSUPPORTED, 9)       /* valid request this build cannot do (e.g. GPU tensors) */      \
  X(ERR_NO_DEVICE, 10)        /* a GPU was requested and no driver/device is present */        \
  X(ERR_OUT_OF_MEMORY, 11)                                                                     \
  X(ERR_INTERNAL, 12)         /* a bug in dynamo; the message says where */                    \
  X(EXIT, 13)                 /* not an error: the run left through a side exit (a failing */  \
                              /* guard); outputs are not written; dynamo_take_exit() */\
                              /* hands over the exit id and its live values */

typedef enum dynamo_status {
#define DYNAMO_STATUS_ENUMERATOR_(name, value) DYNAMO_##name = value,
  DYNAMO_STATUS_LIST(DYNAMO_STATUS_ENUMERATOR_)
#undef DYNAMO_STATUS_ENUMERATOR_
} dynamo_status;

/* Message for the last failing call on this thread; "" when none. Borrowed: valid until the
 * next dynamo call on this thread. */
DYNAMO_API const char *dynamo_last_error(void);
/* Stable name of a status ("DYNAMO_ERR_PARSE"). Borrowed, static storage. */
DYNAMO_API const char *dynamo_status_name(dynamo_status status);
/* DYNAMO_ABI_VERSION of the loaded library; callers compare it with the header's. */
DYNAMO_API uint32_t dynamo_abi_version(void);
/* DYNAMO_ABI_MINOR of the loaded library (since minor 1; a library without this symbol is 0). */
DYNAMO_API uint32_t dynamo_abi_minor_version(void);
/* Library version text ("0.1.0"). Borrowed, static storage. */
DYNAMO_API const char *dynamo_version_string(void);
/* Frees a string the library returned as "owned by the caller". Accepts NULL. */
DYNAMO_API void dynamo_string_free(char *s);

/* -- Handles (opaque) ----------------------------------------------------------------- */

typedef struct dynamo_engine dynamo_engine; /* LLVM ORC JIT + options; shared by frames */
typedef struct dynamo_frame dynamo_frame;   /* one cache of compiled entries (a code site) */
typedef struct dynamo_trace dynamo_trace;   /* a trace in IR form, before compilation */
typedef struct dynamo_entry dynamo_entry;   /* one compiled trace + its guards, owned by a frame */

/* -- Engine --------------------------------------------------------------------------- */

typedef struct dynamo_engine_options {
  uint32_t struct_size; /* sizeof(dynamo_engine_options); lets the struct grow */
  uint32_t opt_level;   /* LLVM optimisation level 0..3; default 2 */
  uint32_t vector_bits; /* 0 = host's widest (512 with AVX-512); else 128/256/512 */
  uint32_t num_threads; /* 0 = LibTorch's at::get_num_threads(); 1 = single-threaded */
  uint32_t reserved;    /* must be 0 */
  uint64_t pool_bytes;  /* cap on released output/scratch buffers the engine keeps for reuse;
                           0 = default (1 GiB); 1 = keep none */
  int32_t device_type;  /* where traces run: 0 or kDLCPU (default); kDLCUDA: an NVIDIA GPU through
                           the CUDA driver (opened at run time; DYNAMO_ERR_NO_DEVICE, saying why, when
                           there is no driver or device). A CUDA engine's traces take and return
                           tensors on that device (inputs declared `cuda:N`; guards check the device);
                           traces with LibTorch externs (but matrix products) or guards are UNSUPPORTED there, and
                           dynamo_entry_run_alloc returns device memory */
  int32_t device_index; /* CUDA device ordinal */
} dynamo_engine_options;

/* Fills *opts with the defaults. */
DYNAMO_API void dynamo_engine_options_init(dynamo_engine_options *opts);
/* Creates an engine. opts: borrowed, may be NULL (defaults). *out: owned by the caller,
 * release with dynamo_engine_destroy; left NULL on failure. */
DYNAMO_API dynamo_status dynamo_engine_create(const dynamo_engine_options *opts,
                                              dynamo_engine **out);
/* Destroys an engine; its frames must be destroyed first (else INVALID_ARGUMENT and nothing
 * is freed). Accepts NULL. */
DYNAMO_API dynamo_status dynamo_engine_destroy(dynamo_engine *engine);

/* -- Traces: text form and builder ---------------------------------------------------- */

/* Parses trace text (see docs/IR.md). text: borrowed, need not be NUL-terminated when len
 * is given; len == (size_t)-1 means NUL-terminated. *out: owned by the caller (release with
 * dynamo_trace_destroy); NULL on failure, with "line L, column C: expected ..." in the last
 * error. The trace is verified (types, shapes, promotion) before it is returned. */
DYNAMO_API dynamo_status dynamo_trace_parse(const char *text, size_t len, dynamo_trace **out);
/* Prints a trace in canonical text form; print(parse(print(t))) == print(t).
 * *out_text: owned by the caller, release with dynamo_string_free. */
DYNAMO_API dynamo_status dynamo_trace_print(const dynamo_trace *trace, char **out_text);
/* Destroys a trace (compiled entries do not depend on it). Accepts NULL. */
DYNAMO_API void dynamo_trace_destroy(dynamo_trace *trace);

/* Element types of trace values. Values chosen to be stable. */
typedef enum dynamo_dtype {
  DYNAMO_BOOL = 0,
  DYNAMO_INT32 = 1,
  DYNAMO_INT64 = 2,
  DYNAMO_FLOAT32 = 3,
  DYNAMO_FLOAT64 = 4,
  DYNAMO_FLOAT16 = 5,  /* IEEE half; computed in float32 */
  DYNAMO_BFLOAT16 = 6  /* bfloat16 (DLPack kDLBfloat); computed in float32 */
} dynamo_dtype;

/* Builder: starts an empty trace. name: borrowed. *out owned by the caller. */
DYNAMO_API dynamo_status dynamo_trace_create(const char *name, dynamo_trace **out);
/* Appends a tensor input. sizes/strides: borrowed arrays of ndim elements; strides NULL =
 * contiguous; strides in elements. *out_value: the new value's id. */
DYNAMO_API dynamo_status dynamo_trace_add_tensor_input(dynamo_trace *trace, dynamo_dtype dtype,
                                                       int32_t ndim, const int64_t *sizes,
                                                       const int64_t *strides,
                                                       int32_t *out_value);
/* Appends a scalar input of dtype BOOL, INT64 or FLOAT64 (a Python bool/int/float). */
DYNAMO_API dynamo_status dynamo_trace_add_scalar_input(dynamo_trace *trace, dynamo_dtype dtype,
                                                       int32_t *out_value);
/* Appends one instruction given in text form without its result name, e.g.
 * "add(%0, 2.5)" or "extern aten::mm(%3, %4) : f32[4,4]"; the result's id goes to *out_value
 * (the first result for multi-result externs). Verified at once; on failure the trace is
 * unchanged. line: borrowed. */
DYNAMO_API dynamo_status dynamo_trace_add_instruction(dynamo_trace *trace, const char *line,
                                                      int32_t *out_value);
/* Marks value as the next trace output. */
DYNAMO_API dynamo_status dynamo_trace_add_output(dynamo_trace *trace, int32_t value);

/* -- Frames, compiling and guards ----------------------------------------------------- */

/* Creates a frame (a cache of compiled entries, e.g. one per Python code object).
 * engine, name: borrowed (engine must outlive the frame). *out owned by the caller. */
DYNAMO_API dynamo_status dynamo_frame_create(dynamo_engine *engine, const char *name,
                                             dynamo_frame **out);
/* Destroys a frame, its entries and their machine code. Accepts NULL. */
DYNAMO_API dynamo_status dynamo_frame_destroy(dynamo_frame *frame);
/* Number of entries currently in the frame. */
DYNAMO_API size_t dynamo_frame_num_entries(const dynamo_frame *frame);

/* Compiles trace into native code and adds it to frame's cache as a new entry whose guards
 * are the trace's input declarations. trace: borrowed. *out_entry (may be NULL): borrowed,
 * owned by the frame, valid until the frame is destroyed. */
DYNAMO_API dynamo_status dynamo_compile_frame(dynamo_frame *frame, const dynamo_trace *trace,
                                              dynamo_entry **out_entry);

/* -- Size variables ---------------------------------------------------------------------
 * A trace written once for many sizes. In its IR text any size -- an input's dims and strides,
 * a result type's dims, the shape list of a reshape/view/expand, any other integer -- may be a
 * size expression: a product of integers and the size variables s0..s7, divided by at most
 * one integer (`s0`, `4*s0`, `s0*s1`, `s0*256/4`). Each variable must stand alone as one of an
 * input's dims (`%0 = input f32[s0,256]`): the first such place is where it is read from.
 *
 * dynamo_frame_add_sized keeps the text as a *sized trace* of frame. When no entry of the frame
 * accepts a call (dynamo_check_guards, dynamo_frame_run), each sized trace in turn binds its
 * variables from the call's tensors and checks the relations its inputs declare: a variable is
 * the same in every place it stands, every input size and stride equals its expression, every
 * expression is a whole number, every variable is at least 2 (sizes 0 and 1 change
 * broadcasting: compile a trace of its own for them). The first that binds is compiled at those
 * sizes as a new entry of the frame (an ordinary entry: dynamo_entry_run_alloc allocates its
 * outputs at the call's sizes; its machine code is shared with the sized trace's other
 * instances, since sizes are data of the code) and returned. When none binds, the why text of
 * dynamo_check_guards says why for each, e.g. "sized trace 0: input 1's size 0 is 5, the sized
 * trace has 7 = s0 at s0 = 7". At most 1024 instances per sized trace and 64 sized traces per
 * frame.
 *
 * The text is checked when added: parsed and verified with every variable at twice the
 * divisors' least common multiple (DYNAMO_ERR_PARSE or DYNAMO_ERR_VERIFY naming the sizes; a
 * variable no input's dim is, or a text without variables, is DYNAMO_ERR_PARSE). len: bytes of
 * text, or (size_t)-1 when NUL-terminated; text: borrowed (copied). *out_index (may be NULL): its
 * index in the frame, -1 on failure. NULL frame or text: DYNAMO_ERR_INVALID_ARGUMENT.
 * Since DYNAMO_ABI_MINOR 3. */
DYNAMO_API dynamo_status dynamo_frame_add_sized(dynamo_frame *frame, const char *text, size_t len,
                                                int32_t *out_index);
/* Number of sized traces of the frame (0 for NULL). Since DYNAMO_ABI_MINOR 3. */
DYNAMO_API size_t dynamo_frame_num_sized(const dynamo_frame *frame);

/* Kinds of run-time arguments. */
typedef enum dynamo_arg_kind {
  DYNAMO_ARG_TENSOR = 0, /* u.tensor */
  DYNAMO_ARG_INT = 1,    /* u.i: a Python int, or a 64-bit guard token */
  DYNAMO_ARG_FLOAT = 2,  /* u.f: a Python float */
  DYNAMO_ARG_BOOL = 3    /* u.b: 0 or 1 */
} dynamo_arg_kind;

#define DYNAMO_ARG_FLAG_REQUIRES_GRAD 1u /* the tensor requires grad (guarded) */
/* u.tensor points to the `tensor` member of a dynamo_versioned_tensor: the caller counts writes
 * to the tensor. While a tensor at the same address keeps its version (and its contents look
 * the same: the entry samples them), an entry may reuse what it derived from the contents --
 * convolution weights reordered for oneDNN, a linear layer's weight packed for the GEMM, and
 * what the trace computes from its `weight` inputs alone (dynamo_entry_stats.kept_steps).
 * Without the flag they are derived anew on every call. PyTorch's shim passes each tensor's
 * version counter (Tensor._version). */
#define DYNAMO_ARG_FLAG_VERSIONED 2u

typedef struct dynamo_versioned_tensor {
  DLTensor tensor;  /* first, so that a pointer to it is a pointer to the DLTensor */
  uint64_t version; /* changes whenever the contents change */
} dynamo_versioned_tensor;

/* One flattened run-time input. */
typedef struct dynamo_arg {
  int32_t kind;   /* a dynamo_arg_kind */
  uint32_t flags; /* DYNAMO_ARG_FLAG_* */
  union {
    const DLTensor *tensor; /* borrowed for the duration of the call */
    int64_t i;
    double f;
    int32_t b;
  } u;
} dynamo_arg;

/* Finds the first entry of frame whose entry guards accept args (one native pass, no
 * allocation). On success *out_entry is that entry (borrowed, owned by the frame). On a miss
 * returns DYNAMO_ERR_GUARD_MISS; if why != NULL, writes into why (why_len bytes,
 * NUL-terminated, truncated) the first failing guard of each entry, e.g.
 * "entry 0: input 0: size mismatch at dim 1: expected 128, got 64". args: borrowed. */
DYNAMO_API dynamo_status dynamo_check_guards(dynamo_frame *frame, const dynamo_arg *args,
                                             size_t nargs, dynamo_entry **out_entry,
                                             char *why, size_t why_len);
/* Checks one entry's guards; DYNAMO_OK or DYNAMO_ERR_GUARD_MISS (reason in why). */
DYNAMO_API dynamo_status dynamo_entry_check_guards(const dynamo_entry *entry,
                                                   const dynamo_arg *args, size_t nargs,
                                                   char *why, size_t why_len);

/* Runs entry on args, writing its outputs into outs (caller-owned buffers, contiguous, of
 * the dtype and shape given by dynamo_entry_output_info, on the engine's device -- CPU, or the
 * CUDA device of a kDLCUDA engine; data may be NULL for outputs that alias an input, see
 * dynamo_entry_output_alias). The guards are checked first (a miss returns
 * DYNAMO_ERR_GUARD_MISS). Inputs are modified only by in-place ops in the trace (copy_), after
 * every read of their old contents (writes recorded before a side exit are done before it).
 * A trace with a guard (side exit) may return DYNAMO_EXIT: outputs are not written, see
 * dynamo_take_exit. args, outs: borrowed. */
DYNAMO_API dynamo_status dynamo_entry_run(dynamo_entry *entry, const dynamo_arg *args,
                                          size_t nargs, const DLTensor *outs, size_t nouts);
/* Like dynamo_entry_run, but the engine allocates the outputs. out_tensors[k] receives a
 * DLManagedTensor (contiguous, CPU, 64-byte aligned) owned by the caller: release it with
 * out_tensors[k]->deleter(out_tensors[k]) (it may outlive the entry, frame and engine). Its
 * memory returns to the engine's buffer pool, so a later call reuses it instead of taking
 * fresh pages from the kernel; an output that is an extern op's result (a product, a
 * convolution, any LibTorch call) in a trace without side exits is instead the tensor LibTorch
 * made, handed over without a copy (its deleter releases it to LibTorch's allocator). A
 * kDLCUDA engine returns device memory instead (freed by the
 * deleter; the device stays open while one is held). For an output that aliases an input (dynamo_entry_output_alias)
 * out_tensors[k] is set to NULL and the caller makes the view. On failure (and on DYNAMO_EXIT)
 * every out_tensors[k] is NULL (a count above 65536 is not taken on trust: then only as many
 * as the entry returns are cleared, and the call fails with DYNAMO_ERR_ARGUMENT_MISMATCH). */
DYNAMO_API dynamo_status dynamo_entry_run_alloc(dynamo_entry *entry, const dynamo_arg *args,
                                                size_t nargs, DLManagedTensor **out_tensors,
                                                size_t nouts);
/* dynamo_check_guards followed by dynamo_entry_run on the entry found. */
DYNAMO_API dynamo_status dynamo_frame_run(dynamo_frame *frame, const dynamo_arg *args,
                                          size_t nargs, const DLTensor *outs, size_t nouts);

/* Shape of one output of an entry. */
typedef struct dynamo_tensor_info {
  int32_t dtype;      /* a dynamo_dtype */
  int32_t ndim;
  int64_t sizes[DYNAMO_MAX_DIMS];  /* first ndim entries valid */
} dynamo_tensor_info;

DYNAMO_API size_t dynamo_entry_num_inputs(const dynamo_entry *entry);
DYNAMO_API size_t dynamo_entry_num_outputs(const dynamo_entry *entry);
/* Fills *info for output k. */
DYNAMO_API dynamo_status dynamo_entry_output_info(const dynamo_entry *entry, size_t k,
                                                  dynamo_tensor_info *info);
/* Whether output k is, after the call, a view of an input's memory (the input returned, a view
 * of it, or the result of an in-place write into it). For such outputs the caller may pass an
 * output DLTensor with data == NULL to dynamo_entry_run: the copy is skipped and the caller makes
 * the view itself (copy elision), exactly as eager PyTorch would return it. */
typedef struct dynamo_output_alias {
  int32_t input;        /* input index, or -1 when the output is fresh memory */
  int32_t ndim;         /* rank of the output */
  int64_t offset;       /* elements from the input's data pointer (data + byte_offset) */
  int64_t strides[DYNAMO_MAX_DIMS];  /* in elements; first ndim valid */
} dynamo_output_alias;
DYNAMO_API dynamo_status dynamo_entry_output_alias(const dynamo_entry *entry, size_t k,
                                                   dynamo_output_alias *alias);

/* Statistics of an entry's compilation. */
typedef struct dynamo_entry_stats {
  uint32_t struct_size;     /* sizeof(dynamo_entry_stats) */
  uint32_t num_kernels;     /* fused loop nests generated */
  uint32_t num_externs;     /* LibTorch calls */
  uint32_t num_instructions;/* trace instructions after simplification */
  double compile_ms;        /* verify -> native, wall clock */
  uint32_t from_cache;      /* 1: the object came from the on-disk cache (DYNAMO_CACHE_DIR) */
  uint32_t shared_code;     /* 1: the machine code is an earlier entry's, compiled for the same
                               program at other sizes (sizes are data of the code): no LLVM
                               compile ran. Since minor 2 (a library of minor 1 leaves it 0). */
  uint32_t kept_steps;      /* steps computed from `weight` inputs alone (and constants): run only
                               when one of those weights changed, their results kept across
                               calls. Since minor 5. */
  uint32_t kept_computes;   /* complete runs that computed the kept steps (the others reused
                               their results). Since minor 5. */
} dynamo_entry_stats;
DYNAMO_API dynamo_status dynamo_entry_get_stats(const dynamo_entry *entry,
                                                dynamo_entry_stats *stats);

/* -- Side exits -----------------------------------------------------------------------------
 * A trace may contain mid-trace guards:
 *     %g = guard(%cond, true, 0, %a, %b) : bool[]
 * (an IR op; the earlier spelling `extern dynamo::guard(...)` is read as it)
 * %cond is a one-element bool tensor computed by the trace (a data-dependent branch); when it
 * differs from the expected value the run stops there: in-place writes recorded before the
 * guard have been done (and only those), outputs are not written, and the run returns
 * DYNAMO_EXIT. Exit ids are 0 .. dynamo_entry_num_exits() - 1, one per guard; the operands
 * after the id are the exit's live values (the state an interpreter resumes from). */

/* After a run on this thread returned DYNAMO_EXIT: the exit's id and its live values, as
 * DLManagedTensors (contiguous, CPU) the caller owns and releases with their deleter. At most
 * `capacity` values are written; *num_values receives the count. A capacity too small returns
 * DYNAMO_ERR_ARGUMENT_MISMATCH and takes nothing. Values not taken are freed by the next run
 * on this thread. DYNAMO_ERR_INVALID_ARGUMENT when no exit is pending. */
DYNAMO_API dynamo_status dynamo_take_exit(int32_t *exit_id, DLManagedTensor **values, size_t capacity,
                                          size_t *num_values);
/* The entry whose side exit is pending on this thread (a linked side trace's when the exit
 * was taken inside one), or NULL. Borrowed. */
DYNAMO_API const dynamo_entry *dynamo_exit_entry(void);
/* Attaches `side` (an entry of the same frame) to exit `exit_id` of `parent`: when that guard
 * fails, the run continues natively in the first linked side trace whose guards accept the
 * parent's arguments followed by the exit's live values (its inputs must be exactly those),
 * writing the parent's outputs (same count, dtypes and shapes; no aliased outputs). If none
 * accepts, the run returns DYNAMO_EXIT as before. A side trace may have exits and links of
 * its own. Thread-safe against concurrent runs of the parent. */
DYNAMO_API dynamo_status dynamo_entry_link_exit(dynamo_entry *parent, int32_t exit_id, dynamo_entry *side);
/* Number of side exits of an entry (0 for a trace without guards). */
DYNAMO_API size_t dynamo_entry_num_exits(const dynamo_entry *entry);
/* How often exit `exit_id` of the entry was taken (all threads); -1 for a bad id or handle. */
DYNAMO_API int64_t dynamo_entry_exit_count(const dynamo_entry *entry, int32_t exit_id);

/* What an entry's convolution and matrix product steps chose by timing both implementations
 * on their first calls, as text a later process can hand to dynamo_entry_set_choices so that
 * it starts from the choice instead of timing again: "<step>=<choice>" separated by spaces,
 * step = index among the entry's extern steps, choice = onednn | winograd | aten
 * (convolutions), own | blas (products); steps still timing are left out ("" when none has chosen). *out_text:
 * owned by the caller (dynamo_string_free). */
DYNAMO_API dynamo_status dynamo_entry_choices(const dynamo_entry *entry, char **out_text);
/* Applies such a text (all or nothing). DYNAMO_ERR_INVALID_ARGUMENT, naming the word, for a
 * malformed word, a step that does not exist or a choice the step cannot make (an entry
 * compiled from the same trace text has the same steps). */
DYNAMO_API dynamo_status dynamo_entry_set_choices(dynamo_entry *entry, const char *choices);

/* Where an entry's runs spent their time, when the library was loaded with DYNAMO_PROFILE=1
 * (read once per process; entries then time each step of their plan, at a clock read per step;
 * without it nothing is timed and this returns DYNAMO_ERR_UNSUPPORTED). Text, one item per line:
 * "runs <n> <ns>" (runs of the trace's code and their total time; runs while a convolution or
 * product step still times its implementations, and the first run after, are not counted), then
 * for each step that ran
 * "step <i> <runs> <ns> <what>", <what> being "kernel k<g> [<domain>]: <ops>", "row kernel ...",
 * "extern <aten::op>" or "side exit check". CPU entries only (a GPU entry has no step times).
 * *out_text: owned by the caller (dynamo_string_free). Since DYNAMO_ABI_MINOR 4. */
DYNAMO_API dynamo_status dynamo_entry_profile(const dynamo_entry *entry, char **out_text);

/* -- The disk cache ------------------------------------------------------------------------
 * The directory the compile cache uses: $DYNAMO_CACHE_DIR, else $XDG_CACHE_HOME/dynamo, else
 * ~/.cache/dynamo; created 0700, and refused while it is not owned by this user or is
 * writable by group or others. Front ends keep their own cached files there (they must check
 * each file they read the same way). *out_dir: owned by the caller (dynamo_string_free).
 * DYNAMO_ERR_UNSUPPORTED when the cache is off (DYNAMO_CACHE_DIR=off) or the directory is
 * refused (the message says why). */
DYNAMO_API dynamo_status dynamo_cache_directory(char **out_dir);

/* -- The BLAS beside dynamo ------------------------------------------------------------------
 * A threaded OpenBLAS (behind LibTorch's matrix products and batch-1 convolutions) starts
 * threads of its own beside ATen's OpenMP threads; on few cores the two fight and a product
 * between two OpenMP ops runs 2-6x slower than alone. While held, OpenBLAS runs each product on
 * the calling thread; dynamo's kernels and own GEMM keep every OpenMP thread. dynamo_entry_run
 * and dynamo_frame_run hold it themselves around traces that call LibTorch; a caller that runs
 * eager ATen code for dynamo (a recording interpreter) holds it around that.
 * The hold is process-wide and counted: enter=1 holds, enter=0 releases; the last release
 * restores OpenBLAS's thread count. A product made by another thread meanwhile also runs on one
 * thread (slower at worst, never a different result). Without OpenBLAS in the process nothing
 * changes. DYNAMO_ERR_INVALID_ARGUMENT: enter is not 0 or 1, or a release without a hold. */
DYNAMO_API dynamo_status dynamo_blas_hold(int enter);
/* OpenBLAS's own thread count (the count it returns to when no hold is left); 0 when the
 * process has no OpenBLAS. */
DYNAMO_API int dynamo_blas_threads(void);

/* -- GPU ------------------------------------------------------------------------------------ */

/* DYNAMO_OK if an NVIDIA driver (libcuda.so.1, opened at run time) is present; otherwise
 * DYNAMO_ERR_NO_DEVICE, and why[0 .. why_len) (if why != NULL) says what was tried. */
DYNAMO_API dynamo_status dynamo_gpu_available(char *why, size_t why_len);
/* PTX for a trace (no device needed): its fused groups as `.entry` kernels for gpu_name
 * ("sm_90"), each `(void **slots, int64 n, int32 *status)` over n outer indices. *ptx_out is
 * owned by the caller (dynamo_string_free). Traces with extern ops: DYNAMO_ERR_UNSUPPORTED. */
DYNAMO_API dynamo_status dynamo_trace_to_ptx(const dynamo_trace *trace, const char *gpu_name, char **ptx_out);

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* DYNAMO_DYNAMO_H */
