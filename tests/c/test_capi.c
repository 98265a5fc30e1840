/* test_capi.c -- bad input through the C API: every entry point given NULL or dead handles, bad
 * options, malformed text, mismatched run-time inputs and outputs, failing extern ops, integer
 * division by zero and unsupported devices each return a clear status and message, and nothing
 * crashes. Also the happy path: a successful run computes the right numbers. Public header only. */
#include "helpers.h"

#include <dlfcn.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>



/* Asserts that the status is s and the last error contains needle (and is never empty). */
#define assert_fails(call, want, needle)                                                          \
  do {                                                                                            \
    assert_status_msg((call), (want), (needle));                                                  \
    assert_true(strlen(dynamo_last_error()) > 0);                                                 \
  } while (0)

static const char *kAdd =
    "trace @add {\n"
    "  %0 = input f32[4]\n"
    "  %1 = input f32[4]\n"
    "  %2 = add(%0, %1) : f32[4]\n"
    "  return %2\n"
    "}\n";

/* -- Versions and status names ------------------------------------------------------------ */

static void test_abi_version_matches_header(void **state) {
  (void)state;
  assert_int_equal(dynamo_abi_version(), DYNAMO_ABI_VERSION);
  assert_int_equal(dynamo_abi_minor_version(), DYNAMO_ABI_MINOR);
  const char *v = dynamo_version_string();
  assert_non_null(v);
  assert_true(strlen(v) > 0);
}

/* Every code of the one table (DYNAMO_STATUS_LIST) is named by the library as the header spells
 * it, the values are distinct and dense from 0, and the names are what the docs print. */
static void test_status_table_is_the_enum(void **state) {
  (void)state;
  int count = 0, max = -1;
#define CHECK_STATUS_(name, value)                                                \
  assert_int_equal((int)DYNAMO_##name, value);                                    \
  assert_string_equal(dynamo_status_name(DYNAMO_##name), "DYNAMO_" #name);        \
  ++count;                                                                        \
  if (value > max) max = value;
  DYNAMO_STATUS_LIST(CHECK_STATUS_)
#undef CHECK_STATUS_
  assert_int_equal(count, max + 1);
  assert_int_equal(count, 14);
  assert_string_equal(dynamo_status_name((dynamo_status)count), "DYNAMO_ERR_UNKNOWN");
  assert_string_equal(dynamo_status_name((dynamo_status)-1), "DYNAMO_ERR_UNKNOWN");
}

static void test_status_name_values(void **state) {
  (void)state;
  assert_string_equal(dynamo_status_name(DYNAMO_OK), "DYNAMO_OK");
  assert_string_equal(dynamo_status_name(DYNAMO_ERR_PARSE), "DYNAMO_ERR_PARSE");
  assert_string_equal(dynamo_status_name(DYNAMO_ERR_GUARD_MISS), "DYNAMO_ERR_GUARD_MISS");
  assert_string_equal(dynamo_status_name(DYNAMO_ERR_ARGUMENT_MISMATCH), "DYNAMO_ERR_ARGUMENT_MISMATCH");
  assert_string_equal(dynamo_status_name(DYNAMO_ERR_INTERNAL), "DYNAMO_ERR_INTERNAL");
  /* A value outside the enum still gets a name, never NULL. */
  const char *unknown = dynamo_status_name((dynamo_status)1234);
  assert_non_null(unknown);
  assert_true(strlen(unknown) > 0);
  dynamo_string_free(NULL); /* accepted */
}

/* -- Engine ----------------------------------------------------------------------------- */

static void test_engine_create_null_out(void **state) {
  (void)state;
  assert_fails(dynamo_engine_create(NULL, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out is NULL");
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  assert_fails(dynamo_engine_create(&o, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out is NULL");
  dynamo_engine_options_init(NULL); /* accepted, does nothing */
}

static void test_engine_create_bad_options(void **state) {
  (void)state;
  dynamo_engine_options o;
  dynamo_engine *e = (dynamo_engine *)0x1;

  dynamo_engine_options_init(&o);
  assert_int_equal(o.struct_size, sizeof o);
  assert_int_equal(o.opt_level, 2);

  o.struct_size = 0;
  assert_fails(dynamo_engine_create(&o, &e), DYNAMO_ERR_INVALID_ARGUMENT, "struct_size");
  assert_null(e);
  o.struct_size = 8;
  e = (dynamo_engine *)0x1;
  assert_fails(dynamo_engine_create(&o, &e), DYNAMO_ERR_INVALID_ARGUMENT, "struct_size is 8");
  assert_null(e);
  o.struct_size = (uint32_t)sizeof o + 64;
  assert_fails(dynamo_engine_create(&o, &e), DYNAMO_ERR_INVALID_ARGUMENT, "struct_size");
  assert_null(e);

  dynamo_engine_options_init(&o);
  o.opt_level = 7;
  e = (dynamo_engine *)0x1;
  assert_fails(dynamo_engine_create(&o, &e), DYNAMO_ERR_INVALID_ARGUMENT, "opt_level must be 0..3");
  assert_null(e);

  dynamo_engine_options_init(&o);
  o.vector_bits = 100;
  e = (dynamo_engine *)0x1;
  assert_fails(dynamo_engine_create(&o, &e), DYNAMO_ERR_INVALID_ARGUMENT, "vector_bits must be 0, 128, 256 or 512");
  assert_null(e);

  /* Valid non-default options are accepted, and the engine compiles and runs. */
  dynamo_engine_options_init(&o);
  o.opt_level = 0;
  o.vector_bits = 128;
  o.num_threads = 1;
  assert_ok(dynamo_engine_create(&o, &e));
  assert_non_null(e);
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(e, kAdd, &entry);
  float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor ta, tb, to;
  tt_init(&ta, a, kDLFloat, 32, 1, s4, NULL);
  tt_init(&tb, b, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&ta), arg_tensor(&tb)};
  assert_ok(dynamo_entry_run(entry, args, 2, &to.dl, 1));
  assert_true(out[0] == 11.0f && out[1] == 22.0f && out[2] == 33.0f && out[3] == 44.0f);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(e));
}

static void test_engine_destroy_null_ok(void **state) {
  (void)state;
  assert_ok(dynamo_engine_destroy(NULL));
}

static void test_engine_destroy_live_frame(void **state) {
  (void)state;
  dynamo_engine *e = NULL;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_engine_create(NULL, &e));
  assert_ok(dynamo_frame_create(e, "alive", &f));
  assert_fails(dynamo_engine_destroy(e), DYNAMO_ERR_INVALID_ARGUMENT, "1 frame(s) still use this engine");

  /* Nothing was freed: the engine still compiles and runs through the existing frame. */
  dynamo_trace *t = NULL;
  dynamo_entry *entry = NULL;
  assert_ok(dynamo_trace_parse(kAdd, (size_t)-1, &t));
  assert_ok(dynamo_compile_frame(f, t, &entry));
  dynamo_trace_destroy(t);
  float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, 0.25f, 0.125f, -1}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor ta, tb, to;
  tt_init(&ta, a, kDLFloat, 32, 1, s4, NULL);
  tt_init(&tb, b, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&ta), arg_tensor(&tb)};
  assert_ok(dynamo_frame_run(f, args, 2, &to.dl, 1));
  assert_true(out[0] == 1.5f && out[1] == 2.25f && out[2] == 3.125f && out[3] == 3.0f);

  /* A second frame makes it two; each destroy lowers the count. */
  dynamo_frame *g = NULL;
  assert_ok(dynamo_frame_create(e, "second", &g));
  assert_fails(dynamo_engine_destroy(e), DYNAMO_ERR_INVALID_ARGUMENT, "2 frame(s)");
  assert_ok(dynamo_frame_destroy(f));
  assert_fails(dynamo_engine_destroy(e), DYNAMO_ERR_INVALID_ARGUMENT, "1 frame(s)");
  assert_ok(dynamo_frame_destroy(g));
  assert_ok(dynamo_engine_destroy(e));
}

/* -- Traces: text ------------------------------------------------------------------------- */

static void test_trace_parse_null_args(void **state) {
  (void)state;
  dynamo_trace *t = (dynamo_trace *)0x1;
  assert_fails(dynamo_trace_parse(NULL, (size_t)-1, &t), DYNAMO_ERR_INVALID_ARGUMENT, "text is NULL");
  assert_null(t);
  assert_fails(dynamo_trace_parse(kAdd, (size_t)-1, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out is NULL");
  assert_fails(dynamo_trace_parse(NULL, 0, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "is NULL");
  dynamo_trace_destroy(NULL); /* accepted */
}

static void test_trace_parse_malformed(void **state) {
  (void)state;
  static const char *bad[] = {
      "",
      "garbage",
      "trace @t {",
      "trace @t {\n  %0 = input f32[4]\n  %1 = add(%0,\n  return %1\n}",
      "trace @t {\n  %0 = input f32[4\n  return %0\n}",
      "trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0) : \n  return %1\n}",
      "trace @t {\n  %0 = input f32[4]\n  return %5\n}",
      "trace @t {\n  %0 = input f32[-4]\n  return %0\n}",
      "trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0)\n  return %1\n} trailing",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
    dynamo_trace *t = (dynamo_trace *)0x1;
    dynamo_status s = dynamo_trace_parse(bad[i], (size_t)-1, &t);
    if (s != DYNAMO_ERR_PARSE || !strstr(dynamo_last_error(), "line ")) {
      print_error("case %zu: got %s \"%s\", wanted DYNAMO_ERR_PARSE with a line number\n", i, dynamo_status_name(s),
                  dynamo_last_error());
      fail();
    }
    assert_null(t);
  }
  /* len cuts a valid text short: a parse error, and nothing past len is read. */
  dynamo_trace *t = (dynamo_trace *)0x1;
  assert_fails(dynamo_trace_parse(kAdd, 20, &t), DYNAMO_ERR_PARSE, "line ");
  assert_null(t);
  assert_fails(dynamo_trace_parse(kAdd, 0, &t), DYNAMO_ERR_PARSE, "line 1, column 1");
  /* A buffer that is not NUL-terminated parses when len is exact. */
  size_t n = strlen(kAdd);
  char *buf = malloc(n);
  assert_non_null(buf);
  memcpy(buf, kAdd, n);
  assert_ok(dynamo_trace_parse(buf, n, &t));
  assert_non_null(t);
  free(buf);
  dynamo_trace_destroy(t);
}

static void test_trace_print_null_args(void **state) {
  (void)state;
  dynamo_trace *t = NULL;
  char *s = (char *)0x1;
  assert_fails(dynamo_trace_print(NULL, &s), DYNAMO_ERR_INVALID_ARGUMENT, "trace is NULL");
  assert_null(s);
  assert_ok(dynamo_trace_parse(kAdd, (size_t)-1, &t));
  assert_fails(dynamo_trace_print(t, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out_text is NULL");
  assert_ok(dynamo_trace_print(t, &s));
  assert_string_equal(s, kAdd);
  dynamo_string_free(s);
  /* A destroyed trace is reported, not dereferenced. */
  dynamo_trace_destroy(t);
  s = (char *)0x1;
  assert_fails(dynamo_trace_print(t, &s), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_null(s);
  dynamo_trace_destroy(t); /* a second destroy is ignored */
}

/* -- Traces: builder ------------------------------------------------------------------------ */

static void test_trace_add_bad_args(void **state) {
  (void)state;
  int64_t sizes[2] = {4, 8};
  int32_t v = -1;
  dynamo_trace *t = (dynamo_trace *)0x1;

  assert_fails(dynamo_trace_create("x", NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out is NULL");
  assert_fails(dynamo_trace_create("bad name!", &t), DYNAMO_ERR_INVALID_ARGUMENT, "name may only hold");
  assert_null(t);

  /* NULL trace handle for every builder call. */
  assert_fails(dynamo_trace_add_tensor_input(NULL, DYNAMO_FLOAT32, 2, sizes, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "trace is NULL");
  assert_fails(dynamo_trace_add_scalar_input(NULL, DYNAMO_INT64, &v), DYNAMO_ERR_INVALID_ARGUMENT, "trace is NULL");
  assert_fails(dynamo_trace_add_instruction(NULL, "exp(%0)", &v), DYNAMO_ERR_INVALID_ARGUMENT, "trace is NULL");
  assert_fails(dynamo_trace_add_output(NULL, 0), DYNAMO_ERR_INVALID_ARGUMENT, "trace is NULL");

  assert_ok(dynamo_trace_create("built", &t));
  assert_non_null(t);
  /* Bad arguments to a live trace; none of them changes it. */
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, NULL, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "sizes is NULL");
  assert_fails(dynamo_trace_add_tensor_input(t, (dynamo_dtype)42, 2, sizes, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "unknown dtype 42");
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, -1, sizes, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "ndim must be 0..16");
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 17, sizes, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "ndim must be 0..16");
  int64_t negative[2] = {4, -8};
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, negative, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "negative size");
  assert_fails(dynamo_trace_add_scalar_input(t, DYNAMO_FLOAT32, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "scalars are BOOL, INT64 or FLOAT64");
  assert_fails(dynamo_trace_add_instruction(t, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT, "line is NULL");
  assert_fails(dynamo_trace_add_instruction(t, "exp(%0)", &v), DYNAMO_ERR_PARSE, "%0 is used before it is defined");
  assert_fails(dynamo_trace_add_output(t, 0), DYNAMO_ERR_INVALID_ARGUMENT, "%0 is not defined");
  assert_fails(dynamo_trace_add_output(t, -3), DYNAMO_ERR_INVALID_ARGUMENT, "is not defined");

  /* A trace with no outputs does not compile. */
  assert_ok(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, sizes, NULL, &v));
  assert_int_equal(v, 0);
  assert_ok(dynamo_trace_add_instruction(t, "exp(%0)", NULL)); /* out_value may be NULL */
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(g_engine, "builder", &f));
  dynamo_entry *entry = (dynamo_entry *)0x1;
  assert_fails(dynamo_compile_frame(f, t, &entry), DYNAMO_ERR_VERIFY, "returns nothing");
  assert_null(entry);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  assert_ok(dynamo_trace_add_output(t, 1));
  assert_ok(dynamo_compile_frame(f, t, &entry));
  assert_non_null(entry);

  /* Builder calls on a destroyed trace. */
  dynamo_trace_destroy(t);
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, sizes, NULL, &v), DYNAMO_ERR_INVALID_HANDLE,
               "not a live handle");
  assert_fails(dynamo_trace_add_scalar_input(t, DYNAMO_INT64, &v), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_trace_add_instruction(t, "exp(%0)", &v), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_trace_add_output(t, 0), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Frames and compiling ------------------------------------------------------------------- */

static void test_frame_create_null_args(void **state) {
  (void)state;
  dynamo_frame *f = (dynamo_frame *)0x1;
  assert_fails(dynamo_frame_create(NULL, "f", &f), DYNAMO_ERR_INVALID_ARGUMENT, "engine is NULL");
  assert_null(f);
  assert_fails(dynamo_frame_create(g_engine, "f", NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out is NULL");
  /* NULL name is allowed. */
  assert_ok(dynamo_frame_create(g_engine, NULL, &f));
  assert_non_null(f);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_frame_destroy(NULL));
  assert_int_equal(dynamo_frame_num_entries(NULL), 0);
}

static void test_compile_frame_null_args(void **state) {
  (void)state;
  dynamo_trace *t = NULL;
  dynamo_frame *f = NULL;
  dynamo_entry *entry = (dynamo_entry *)0x1;
  assert_ok(dynamo_trace_parse(kAdd, (size_t)-1, &t));
  assert_ok(dynamo_frame_create(g_engine, "c", &f));
  assert_fails(dynamo_compile_frame(NULL, t, &entry), DYNAMO_ERR_INVALID_ARGUMENT, "frame is NULL");
  assert_null(entry);
  entry = (dynamo_entry *)0x1;
  assert_fails(dynamo_compile_frame(f, NULL, &entry), DYNAMO_ERR_INVALID_ARGUMENT, "trace is NULL");
  assert_null(entry);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  /* out_entry may be NULL. */
  assert_ok(dynamo_compile_frame(f, t, NULL));
  assert_int_equal(dynamo_frame_num_entries(f), 1);
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_compile_frame_unknown_extern(void **state) {
  (void)state;
  const char *src =
      "trace @t {\n"
      "  %0 = input f32[2,2]\n"
      "  %1 = extern aten::does_not_exist(%0) : f32[2,2]\n"
      "  return %1\n"
      "}\n";
  dynamo_trace *t = NULL;
  dynamo_frame *f = NULL;
  dynamo_entry *entry = (dynamo_entry *)0x1;
  assert_ok(dynamo_trace_parse(src, (size_t)-1, &t));
  assert_ok(dynamo_frame_create(g_engine, "ext", &f));
  assert_fails(dynamo_compile_frame(f, t, &entry), DYNAMO_ERR_COMPILE, "aten::does_not_exist");
  assert_non_null(strstr(dynamo_last_error(), "no such operator"));
  assert_null(entry);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_compile_frame_cuda_input(void **state) {
  (void)state;
  const char *src =
      "trace @t {\n"
      "  %0 = input f32[4] cuda:0\n"
      "  %1 = exp(%0) : f32[4]\n"
      "  return %1\n"
      "}\n";
  dynamo_trace *t = NULL;
  dynamo_frame *f = NULL;
  dynamo_entry *entry = (dynamo_entry *)0x1;
  assert_ok(dynamo_trace_parse(src, (size_t)-1, &t));
  assert_ok(dynamo_frame_create(g_engine, "cuda", &f));
  assert_fails(dynamo_compile_frame(f, t, &entry), DYNAMO_ERR_UNSUPPORTED, "CUDA");
  assert_null(entry);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Guards and running: NULL arguments ------------------------------------------------------- */

typedef struct add_fixture {
  dynamo_frame *frame;
  dynamo_entry *entry;
  float a[4], b[4], out[4];
  test_tensor ta, tb, to;
  dynamo_arg args[2];
} add_fixture;

static void add_fixture_init(add_fixture *x) {
  static const int64_t s4[1] = {4};
  memset(x, 0, sizeof *x);
  x->frame = compile_text(g_engine, kAdd, &x->entry);
  for (int i = 0; i < 4; ++i) {
    x->a[i] = (float)(i + 1);        /* 1 2 3 4 */
    x->b[i] = 0.5f * (float)(i + 1); /* 0.5 1 1.5 2 */
  }
  tt_init(&x->ta, x->a, kDLFloat, 32, 1, s4, NULL);
  tt_init(&x->tb, x->b, kDLFloat, 32, 1, s4, NULL);
  tt_init(&x->to, x->out, kDLFloat, 32, 1, s4, NULL);
  x->args[0] = arg_tensor(&x->ta);
  x->args[1] = arg_tensor(&x->tb);
}

static void test_check_guards_null_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  dynamo_entry *e = (dynamo_entry *)0x1;
  char why[64];
  assert_fails(dynamo_check_guards(NULL, x.args, 2, &e, why, sizeof why), DYNAMO_ERR_INVALID_ARGUMENT, "frame is NULL");
  assert_null(e);
  assert_fails(dynamo_check_guards(x.frame, x.args, 2, NULL, why, sizeof why), DYNAMO_ERR_INVALID_ARGUMENT,
               "out_entry is NULL");
  e = (dynamo_entry *)0x1;
  assert_fails(dynamo_check_guards(x.frame, NULL, 2, &e, why, sizeof why), DYNAMO_ERR_INVALID_ARGUMENT, "args is NULL");
  assert_null(e);
  /* NULL args with nargs 0 is a count mismatch, not a crash. */
  assert_fails(dynamo_check_guards(x.frame, NULL, 0, &e, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch: expected 2, got 0");
  /* why may be NULL. */
  assert_fails(dynamo_check_guards(x.frame, x.args, 1, &e, NULL, 0), DYNAMO_ERR_GUARD_MISS, "input count mismatch");
  assert_ok(dynamo_check_guards(x.frame, x.args, 2, &e, NULL, 0));
  assert_ptr_equal(e, x.entry);
  /* A frame with no entries explains that. */
  dynamo_frame *empty = NULL;
  assert_ok(dynamo_frame_create(g_engine, "empty", &empty));
  assert_fails(dynamo_check_guards(empty, x.args, 2, &e, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "frame 'empty' has no compiled entries");
  assert_null(e);
  assert_ok(dynamo_frame_destroy(empty));
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_check_guards_null_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  char why[64];
  assert_fails(dynamo_entry_check_guards(NULL, x.args, 2, why, sizeof why), DYNAMO_ERR_INVALID_ARGUMENT,
               "entry is NULL");
  assert_fails(dynamo_entry_check_guards(x.entry, NULL, 2, why, sizeof why), DYNAMO_ERR_INVALID_ARGUMENT,
               "args is NULL");
  assert_fails(dynamo_entry_check_guards(x.entry, NULL, 0, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch");
  assert_ok(dynamo_entry_check_guards(x.entry, x.args, 2, NULL, 0));
  /* A tensor argument whose DLTensor pointer is NULL. */
  dynamo_arg bad[2] = {x.args[0], x.args[1]};
  bad[1].u.tensor = NULL;
  assert_fails(dynamo_entry_check_guards(x.entry, bad, 2, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input 1: tensor pointer is NULL");
  assert_string_equal(why, "input 1: tensor pointer is NULL");
  /* A DLTensor with NULL shape or NULL data. */
  test_tensor noshape = x.tb;
  noshape.dl.shape = NULL;
  bad[1] = arg_tensor(&noshape);
  assert_fails(dynamo_entry_check_guards(x.entry, bad, 2, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input 1: shape pointer is NULL");
  test_tensor nodata = x.tb;
  nodata.dl.shape = nodata.shape;
  nodata.dl.data = NULL;
  bad[1] = arg_tensor(&nodata);
  assert_fails(dynamo_entry_check_guards(x.entry, bad, 2, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input 1: data pointer is NULL");
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_run_null_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  assert_fails(dynamo_entry_run(NULL, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_run(x.entry, NULL, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT, "args is NULL");
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, NULL, 1), DYNAMO_ERR_INVALID_ARGUMENT, "outs is NULL");
  /* An output with NULL data or NULL shape. */
  test_tensor o = x.to;
  o.dl.data = NULL;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT,
               "output 0: data pointer is NULL");
  o = x.to;
  o.dl.shape = NULL;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT,
               "output 0: shape pointer is NULL");
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_run_zero_dim_null_data(void **state) {
  (void)state;
  /* A 0-d tensor input whose data pointer is NULL must be rejected, not read. */
  const char *src =
      "trace @t {\n"
      "  %0 = input f32[]\n"
      "  %1 = add(%0, 1.0) : f32[]\n"
      "  return %1\n"
      "}\n";
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &entry);
  float in = 2.0f, out = 0.0f;
  test_tensor ti, to;
  tt_init(&ti, &in, kDLFloat, 32, 0, NULL, NULL);
  tt_init(&to, &out, kDLFloat, 32, 0, NULL, NULL);
  dynamo_arg a = arg_tensor(&ti);
  assert_ok(dynamo_entry_run(entry, &a, 1, &to.dl, 1));
  assert_true(out == 3.0f);
  ti.dl.data = NULL;
  char why[64];
  assert_fails(dynamo_entry_check_guards(entry, &a, 1, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "input 0: data pointer is NULL");
  assert_fails(dynamo_entry_run(entry, &a, 1, &to.dl, 1), DYNAMO_ERR_GUARD_MISS, "input 0: data pointer is NULL");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_frame_run_null_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  assert_fails(dynamo_frame_run(NULL, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT, "frame is NULL");
  assert_fails(dynamo_frame_run(x.frame, NULL, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT, "args is NULL");
  assert_fails(dynamo_frame_run(x.frame, x.args, 2, NULL, 1), DYNAMO_ERR_INVALID_ARGUMENT, "outs is NULL");
  assert_ok(dynamo_frame_run(x.frame, x.args, 2, &x.to.dl, 1));
  assert_true(x.out[0] == 1.5f && x.out[1] == 3.0f && x.out[2] == 4.5f && x.out[3] == 6.0f);
  assert_ok(dynamo_frame_destroy(x.frame));
  /* The message names the function that was called, as every other entry point's does. */
  assert_fails(dynamo_frame_run(NULL, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT,
               "dynamo_frame_run: frame is NULL");
}

/* A live handle of another kind (a trace passed as a frame) is refused, not used. */
static void test_handle_of_wrong_kind(void **state) {
  (void)state;
  dynamo_trace *t = NULL;
  dynamo_engine *e = NULL;
  assert_ok(dynamo_engine_create(NULL, &e));
  assert_ok(dynamo_trace_parse("trace @t {\n  %0 = input f32[4]\n  return %0\n}", (size_t)-1, &t));
  dynamo_frame *as_frame = (dynamo_frame *)(void *)t;
  dynamo_entry *entry = NULL;
  assert_int_equal(dynamo_frame_num_entries(as_frame), 0);
  assert_fails(dynamo_frame_run(as_frame, NULL, 0, NULL, 0), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_check_guards(as_frame, NULL, 0, &entry, NULL, 0), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_compile_frame((dynamo_frame *)(void *)e, t, NULL), DYNAMO_ERR_INVALID_HANDLE, "frame is not a live handle");
  assert_fails(dynamo_entry_run((dynamo_entry *)(void *)e, NULL, 0, NULL, 0), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_engine_destroy((dynamo_engine *)(void *)t), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  dynamo_trace_destroy(t);
  assert_ok(dynamo_engine_destroy(e));
}

static void test_entry_output_info_bad_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  dynamo_tensor_info info;
  assert_fails(dynamo_entry_output_info(NULL, 0, &info), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_output_info(x.entry, 0, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "info is NULL");
  assert_fails(dynamo_entry_output_info(x.entry, 1, &info), DYNAMO_ERR_INVALID_ARGUMENT,
               "output 1 out of range (entry has 1)");
  assert_fails(dynamo_entry_output_info(x.entry, (size_t)-1, &info), DYNAMO_ERR_INVALID_ARGUMENT, "out of range");
  assert_ok(dynamo_entry_output_info(x.entry, 0, &info));
  assert_int_equal(info.dtype, DYNAMO_FLOAT32);
  assert_int_equal(info.ndim, 1);
  assert_int_equal(info.sizes[0], 4);
  assert_int_equal(dynamo_entry_num_inputs(x.entry), 2);
  assert_int_equal(dynamo_entry_num_outputs(x.entry), 1);
  assert_int_equal(dynamo_entry_num_inputs(NULL), 0);
  assert_int_equal(dynamo_entry_num_outputs(NULL), 0);
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_get_stats_bad_args(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  dynamo_entry_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_fails(dynamo_entry_get_stats(NULL, &st), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_get_stats(x.entry, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "stats is NULL");
  st.struct_size = 0;
  assert_fails(dynamo_entry_get_stats(x.entry, &st), DYNAMO_ERR_INVALID_ARGUMENT, "struct_size");
  st.struct_size = 3;
  assert_fails(dynamo_entry_get_stats(x.entry, &st), DYNAMO_ERR_INVALID_ARGUMENT, "struct_size");
  st.struct_size = sizeof st;
  assert_ok(dynamo_entry_get_stats(x.entry, &st));
  assert_int_equal(st.struct_size, sizeof st);
  assert_true(st.num_kernels >= 1);
  assert_int_equal(st.num_externs, 0);
  assert_true(st.num_instructions >= 3);
  assert_true(st.compile_ms >= 0.0);
  /* An older, shorter struct gets only its own fields; the bytes past it are untouched. */
  dynamo_entry_stats small[2];
  const unsigned char *bytes = (const unsigned char *)small;
  memset(small, 0xAB, sizeof small);
  small[0].struct_size = 4 * sizeof(uint32_t);
  assert_ok(dynamo_entry_get_stats(x.entry, &small[0]));
  assert_int_equal(small[0].struct_size, 4 * sizeof(uint32_t));
  assert_int_equal(small[0].num_kernels, st.num_kernels);
  for (size_t i = 4 * sizeof(uint32_t); i < sizeof small; ++i) assert_int_equal(bytes[i], 0xAB);
  assert_ok(dynamo_frame_destroy(x.frame));
}

/* The same program at two sizes: the second entry shares the first's machine code (sizes are
 * data of the code) and each computes its own size's answer: a row mean of x * 3 + y, where
 * the row count and the row length both differ. */
static void test_same_program_at_other_sizes_shares_code(void **state) {
  (void)state;
  static const char *fmt =
      "trace @rowmean {\n"
      "  %%0 = input f32[%d,%d]\n"
      "  %%1 = input f32[%d]\n"
      "  %%2 = mul(%%0, 3.0) : f32[%d,%d]\n"
      "  %%3 = add(%%2, %%1) : f32[%d,%d]\n"
      "  %%4 = mean(%%3, [1], false) : f32[%d]\n"
      "  return %%4\n"
      "}\n";
  const int rows[2] = {3, 70}, cols[2] = {5, 19};
  dynamo_frame *frames[2];
  for (int k = 0; k < 2; ++k) {
    int r = rows[k], c = cols[k];
    char text[512];
    snprintf(text, sizeof text, fmt, r, c, c, r, c, r, c, r);
    dynamo_entry *entry = NULL;
    frames[k] = compile_text(g_engine, text, &entry);
    dynamo_entry_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_ok(dynamo_entry_get_stats(entry, &st));
    assert_int_equal(st.shared_code, k == 1 ? 1u : 0u);
    float *x = malloc(sizeof(float) * (size_t)(r * c)), y[19], out[70];
    for (int i = 0; i < r * c; ++i) x[i] = (float)((i * 7) % 11) - 5.0f;
    for (int j = 0; j < c; ++j) y[j] = 0.25f * (float)j;
    int64_t sx[2] = {r, c}, sy[1] = {c}, so[1] = {r};
    test_tensor tx, ty, to;
    tt_init(&tx, x, kDLFloat, 32, 2, sx, NULL);
    tt_init(&ty, y, kDLFloat, 32, 1, sy, NULL);
    tt_init(&to, out, kDLFloat, 32, 1, so, NULL);
    dynamo_arg args[2] = {arg_tensor(&tx), arg_tensor(&ty)};
    assert_ok(dynamo_entry_run(entry, args, 2, &to.dl, 1));
    for (int i = 0; i < r; ++i) {
      double want = 0;
      for (int j = 0; j < c; ++j) want += 3.0 * x[i * c + j] + y[j];
      want /= c;
      assert_true(fabs(out[i] - want) < 1e-4);
    }
    free(x);
  }
  for (int k = 0; k < 2; ++k) assert_ok(dynamo_frame_destroy(frames[k]));
}

/* -- Sized traces (size variables) --------------------------------------------------------- */

static const char *kSizedRows =
    "trace @rows {\n"
    "  %0 = input f32[s0,s1]\n"
    "  %1 = input f32[s1]\n"
    "  %2 = mul(%0, 3.0) : f32[s0,s1]\n"
    "  %3 = add(%2, %1) : f32[s0,s1]\n"
    "  %4 = mean(%3, [1], false) : f32[s0]\n"
    "  %5 = reshape(%3, [s0*s1]) : f32[s0*s1]\n"
    "  return %4, %5\n"
    "}\n";

/* One sized trace serves every (rows, cols) pair >= 2: each call's instance is found (or made)
 * by dynamo_check_guards, its outputs allocated at the call's sizes by run_alloc and compared
 * with the same sums in C; a size seen before reuses its entry; instances after the first share
 * machine code. */
static void test_sized_trace_runs_at_many_sizes(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(g_engine, "sized", &f));
  int32_t index = -7;
  assert_ok(dynamo_frame_add_sized(f, kSizedRows, (size_t)-1, &index));
  assert_int_equal(index, 0);
  assert_int_equal(dynamo_frame_num_sized(f), 1);
  assert_int_equal(dynamo_frame_num_entries(f), 0);
  const int rows[6] = {3, 70, 2, 7, 3, 130}, cols[6] = {5, 19, 2, 1023, 5, 33};
  for (int k = 0; k < 6; ++k) {
    int r = rows[k], c = cols[k];
    float *x = malloc(sizeof(float) * (size_t)(r * c)), *y = malloc(sizeof(float) * (size_t)c);
    for (int i = 0; i < r * c; ++i) x[i] = (float)((i * 7) % 11) - 5.0f;
    for (int j = 0; j < c; ++j) y[j] = 0.25f * (float)j;
    int64_t sx[2] = {r, c}, sy[1] = {c};
    test_tensor tx, ty;
    tt_init(&tx, x, kDLFloat, 32, 2, sx, NULL);
    tt_init(&ty, y, kDLFloat, 32, 1, sy, NULL);
    dynamo_arg args[2] = {arg_tensor(&tx), arg_tensor(&ty)};
    dynamo_entry *entry = NULL;
    char why[256];
    assert_ok(dynamo_check_guards(f, args, 2, &entry, why, sizeof why));
    /* (3, 5) comes twice: the second call finds the instance made by the first */
    assert_int_equal(dynamo_frame_num_entries(f), (size_t)(k < 4 ? k + 1 : k));
    if (k == 1) {
      dynamo_entry_stats st;
      memset(&st, 0, sizeof st);
      st.struct_size = sizeof st;
      assert_ok(dynamo_entry_get_stats(entry, &st));
      assert_int_equal(st.shared_code, 1u);
    }
    DLManagedTensor *outs[2] = {NULL, NULL};
    assert_ok(dynamo_entry_run_alloc(entry, args, 2, outs, 2));
    assert_int_equal(outs[0]->dl_tensor.ndim, 1);
    assert_int_equal(outs[0]->dl_tensor.shape[0], r);
    assert_int_equal(outs[1]->dl_tensor.shape[0], (int64_t)r * c);
    const float *mean = (const float *)outs[0]->dl_tensor.data, *flat = (const float *)outs[1]->dl_tensor.data;
    for (int i = 0; i < r; ++i) {
      double want = 0;
      for (int j = 0; j < c; ++j) {
        double v = 3.0 * x[i * c + j] + y[j];
        want += v;
        assert_true(fabs(flat[i * c + j] - v) < 1e-5);
      }
      assert_true(fabs(mean[i] - want / c) < 1e-4);
    }
    for (int o = 0; o < 2; ++o) outs[o]->deleter(outs[o]);
    /* dynamo_frame_run with caller buffers takes the same instance */
    float *m2 = malloc(sizeof(float) * (size_t)r), *f2 = malloc(sizeof(float) * (size_t)(r * c));
    int64_t so[1] = {r}, sf[1] = {(int64_t)r * c};
    test_tensor tm, tf;
    tt_init(&tm, m2, kDLFloat, 32, 1, so, NULL);
    tt_init(&tf, f2, kDLFloat, 32, 1, sf, NULL);
    DLTensor dl[2] = {tm.dl, tf.dl};
    assert_ok(dynamo_frame_run(f, args, 2, dl, 2));
    assert_true(fabs(f2[r * c - 1] - (3.0 * x[r * c - 1] + y[c - 1])) < 1e-5);
    free(m2);
    free(f2);
    free(x);
    free(y);
  }
  assert_ok(dynamo_frame_destroy(f));
}

/* Calls the relations refuse: each is a guard miss whose why text names the relation, and the
 * process carries on (the next good call runs). */
static void test_sized_trace_relations(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(g_engine, "sized-rel", &f));
  assert_ok(dynamo_frame_add_sized(f, kSizedRows, (size_t)-1, NULL));
  assert_ok(dynamo_frame_add_sized(f,
                                   "trace @halves {\n"
                                   "  %0 = input f32[s0,4]\n"
                                   "  %1 = reshape(%0, [s0/2, 8]) : f32[s0/2,8]\n"
                                   "  %2 = mul(%1, 2.0) : f32[s0/2,8]\n"
                                   "  return %2\n"
                                   "}\n",
                                   (size_t)-1, NULL));
  static float buf[64 * 64];
  struct {
    int ndx, ndy;
    int64_t sx[2], sy[2];
    const char *needle;
  } cases[] = {
      {2, 1, {3, 5}, {6}, "input 1's size 0 is 6, the sized trace has 5 = s1"},
      {2, 1, {1, 5}, {5}, "s0 = input 0's size 0 is 1 (a size variable is at least 2"},
      {2, 1, {4, 1}, {1}, "is 1 (a size variable is at least 2"},
      {1, 1, {5}, {5}, "input 0 is not a tensor of rank 2"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    test_tensor tx, ty;
    tt_init(&tx, buf, kDLFloat, 32, cases[k].ndx, cases[k].sx, NULL);
    tt_init(&ty, buf, kDLFloat, 32, cases[k].ndy, cases[k].sy, NULL);
    dynamo_arg args[2] = {arg_tensor(&tx), arg_tensor(&ty)};
    dynamo_entry *entry = (dynamo_entry *)0x1;
    char why[512];
    assert_status_msg(dynamo_check_guards(f, args, 2, &entry, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                      cases[k].needle);
    assert_null(entry);
    assert_non_null(strstr(why, "sized trace 0: "));
    assert_non_null(strstr(why, "sized trace 1: the call has 2 argument(s)"));
  }
  /* the second sized trace: s0/2 at s0 = 5 is not whole; at 6 it runs */
  int64_t s54[2] = {5, 4}, s64[2] = {6, 4};
  test_tensor t5, t6;
  tt_init(&t5, buf, kDLFloat, 32, 2, s54, NULL);
  tt_init(&t6, buf, kDLFloat, 32, 2, s64, NULL);
  dynamo_arg a5 = arg_tensor(&t5), a6 = arg_tensor(&t6);
  dynamo_entry *entry = NULL;
  assert_status_msg(dynamo_check_guards(f, &a5, 1, &entry, NULL, 0), DYNAMO_ERR_GUARD_MISS,
                    "s0/2 is not a whole number at s0 = 5");
  for (int i = 0; i < 24; ++i) buf[i] = (float)i;
  assert_ok(dynamo_check_guards(f, &a6, 1, &entry, NULL, 0));
  DLManagedTensor *out = NULL;
  assert_ok(dynamo_entry_run_alloc(entry, &a6, 1, &out, 1));
  assert_int_equal(out->dl_tensor.shape[0], 3);
  assert_int_equal(out->dl_tensor.shape[1], 8);
  assert_true(((const float *)out->dl_tensor.data)[23] == 46.0f);
  out->deleter(out);
  /* a wrong dtype binds the sizes, but the instance's guards refuse it (said once, not recompiled) */
  int32_t ibuf[24];
  test_tensor ti;
  tt_init(&ti, ibuf, kDLInt, 32, 2, s64, NULL);
  dynamo_arg ai = arg_tensor(&ti);
  size_t before = dynamo_frame_num_entries(f);
  assert_status_msg(dynamo_check_guards(f, &ai, 1, &entry, NULL, 0), DYNAMO_ERR_GUARD_MISS, "dtype");
  assert_status_msg(dynamo_check_guards(f, &ai, 1, &entry, NULL, 0), DYNAMO_ERR_GUARD_MISS, "refused the call before");
  assert_int_equal(dynamo_frame_num_entries(f), before);
  assert_ok(dynamo_frame_destroy(f));
}

/* Malformed sized traces fail when added, naming the problem; bad handles and NULLs too. */
static void test_sized_trace_bad_input(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(g_engine, "sized-bad", &f));
  struct {
    const char *text;
    dynamo_status want;
    const char *needle;
  } bad[] = {
      {"trace @t {\n  %0 = input f32[4]\n  %1 = mul(%0, 2.0) : f32[4]\n  return %1\n}\n", DYNAMO_ERR_PARSE,
       "no size variable"},
      {"trace @t {\n  %0 = input f32[s0]\n  %1 = reshape(%0, [s1, 1]) : f32[s1,1]\n  return %1\n}\n", DYNAMO_ERR_PARSE,
       "s1 is not the size of any input dimension"},
      {"trace @t {\n  %0 = input f32[s9]\n  return %0\n}\n", DYNAMO_ERR_PARSE, "variables are s0..s7"},
      {"trace @t {\n  %0 = input f32[s0,2]\n  %1 = reshape(%0, [s0/0]) : f32[s0/0]\n  return %1\n}\n",
       DYNAMO_ERR_PARSE, "divides by zero"},
      {"trace @t {\n  %0 = input f32[s0,4]\n  %1 = mul(%0, 3.0) : f32[s0,5]\n  return %1\n}\n", DYNAMO_ERR_VERIFY,
       "checked at s0 = 2"},
      {"trace @t {\n  %0 = input f32[s0,x]\n  return %0\n}\n", DYNAMO_ERR_PARSE, "neither a number nor a size"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
    int32_t index = 5;
    assert_status_msg(dynamo_frame_add_sized(f, bad[k].text, (size_t)-1, &index), bad[k].want, bad[k].needle);
    assert_int_equal(index, -1);
  }
  assert_int_equal(dynamo_frame_num_sized(f), 0);
  assert_status_msg(dynamo_frame_add_sized(NULL, kSizedRows, (size_t)-1, NULL), DYNAMO_ERR_INVALID_ARGUMENT,
                    "frame is NULL");
  assert_status_msg(dynamo_frame_add_sized(f, NULL, 0, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "text is NULL");
  /* len counts bytes: the text cut before its end does not parse */
  assert_true(dynamo_frame_add_sized(f, kSizedRows, 40, NULL) != DYNAMO_OK);
  assert_int_equal(dynamo_frame_num_sized(NULL), 0);
  assert_ok(dynamo_frame_destroy(f));
  assert_status_msg(dynamo_frame_add_sized(f, kSizedRows, (size_t)-1, NULL), DYNAMO_ERR_INVALID_HANDLE,
                    "not a live handle");
}

/* -- Running: happy path -------------------------------------------------------------------- */

/* Compiles `text` (a trace of f32[2,3] and f32[3,2] inputs, one f32[2,2] output), runs it `runs`
 * times on [[1,2,3],[4,5,6]] and [[1,0],[0,1],[1,1]], and leaves the output in out. */
static void run_mm_trace(const char *text, int runs, float out[4]) {
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, text, &entry);
  float m0[6] = {1, 2, 3, 4, 5, 6}, m1[6] = {1, 0, 0, 1, 1, 1};
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s22[2] = {2, 2};
  test_tensor t0, t1, tm;
  memset(out, 0, 4 * sizeof(float));
  tt_init(&t0, m0, kDLFloat, 32, 2, s23, NULL);
  tt_init(&t1, m1, kDLFloat, 32, 2, s32, NULL);
  tt_init(&tm, out, kDLFloat, 32, 2, s22, NULL);
  dynamo_arg margs[2] = {arg_tensor(&t0), arg_tensor(&t1)};
  for (int i = 0; i < runs; ++i) assert_ok(dynamo_entry_run(entry, margs, 2, &tm.dl, 1));
  assert_ok(dynamo_frame_destroy(f));
}

/* Sizes past what int64 byte offsets address are refused where they enter (the builder:
 * INVALID_ARGUMENT; trace text and every instruction's result, expand and reductions included:
 * VERIFY naming the value), instead of compiling into code that hangs, writes to address 0 or
 * returns a wrong count. */
static void test_sizes_that_overflow_are_refused(void **state) {
  (void)state;
  static const char *bad_text[] = {
      "trace @t {\n  %0 = input f32[4611686018427387904,4]\n  %1 = exp(%0) : f32[4611686018427387904,4]\n  return %1\n}\n",
      "trace @t {\n  %0 = input f32[4294967296,4294967296]\n  %1 = exp(%0) : f32[4294967296,4294967296]\n  return %1\n}\n",
      "trace @t {\n  %0 = input f32[4]\n  %1 = reshape(%0, [4,1]) : f32[4,1]\n"
      "  %2 = expand(%1, [4,4611686018427387904]) : f32[4,4611686018427387904]\n"
      "  %3 = sum(%2, [], false) : f32[]\n  return %3\n}\n",
      "trace @t {\n  %0 = input f32[4]\n  %1 = expand(%0, [2147483648,2147483648,4]) : f32[2147483648,2147483648,4]\n"
      "  %2 = mean(%1, [], false) : f32[]\n  return %2\n}\n",
      "trace @t {\n  %0 = input f32[4]\n  %1 = expand(%0, [4294967296,4294967296,4]) : f32[4294967296,4294967296,4]\n"
      "  %2 = amax(%1, [], false) : f32[]\n  return %2\n}\n",
      "trace @t {\n  %0 = input f32[4,4]{4611686018427387904,1}\n  %1 = exp(%0) : f32[4,4]\n  return %1\n}\n",
      /* 2^61 floats are 2^63 bytes: one past what int64 addresses */
      "trace @t {\n  %0 = input f32[1]\n  %1 = expand(%0, [2305843009213693952]) : f32[2305843009213693952]\n"
      "  %2 = mul(%1, 2.0) : f32[2305843009213693952]\n  %3 = reshape(%2, [1152921504606846976,2]) : "
      "f32[1152921504606846976,2]\n  return %3\n}\n",
  };
  for (size_t i = 0; i < sizeof bad_text / sizeof *bad_text; ++i) {
    dynamo_trace *t = (dynamo_trace *)0x1;
    assert_fails(dynamo_trace_parse(bad_text[i], (size_t)-1, &t), DYNAMO_ERR_VERIFY, "2^63 - 1 bytes");
    assert_null(t);
  }
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_create("b", &t));
  int32_t v = -1;
  int64_t big[2] = {(int64_t)1 << 62, 4}, huge[2] = {INT64_MAX, INT64_MAX};
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, big, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "dynamo_trace_add_tensor_input: sizes [4611686018427387904,4] hold more than 2^63 - 1 bytes");
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, huge, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "2^63 - 1 bytes");
  int64_t ok_sizes[2] = {0, (int64_t)1 << 40};  /* large, but addressable (and empty) */
  assert_ok(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, ok_sizes, NULL, &v));
  dynamo_trace_destroy(t);
}

/* A write into an input whose elements share memory (stride 0, or through a broadcasting
 * expand) is refused, as ATen refuses it, instead of leaving one of the values. */
static void test_copy_into_repeated_memory_is_refused(void **state) {
  (void)state;
  static const char *bad_text[] = {
      "trace @t {\n  %0 = input f32[4]{0}\n  %1 = input f32[4]\n  %2 = copy_(%0, %1) : f32[4]\n  return %2\n}\n",
      "trace @t {\n  %0 = input f32[1]\n  %1 = input f32[4]\n  %2 = expand(%0, [4]) : f32[4]\n"
      "  %3 = copy_(%2, %1) : f32[4]\n  return %3\n}\n",
  };
  for (size_t i = 0; i < sizeof bad_text / sizeof *bad_text; ++i) {
    dynamo_trace *t = NULL;
    assert_fails(dynamo_trace_parse(bad_text[i], (size_t)-1, &t), DYNAMO_ERR_VERIFY, "single memory location");
  }
}

/* dynamo_entry_run_alloc never writes past the caller's array (a count of SIZE_MAX), and clears
 * the outputs on every failure, a destroyed entry's included. */
static void test_entry_run_alloc_counts(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  DLManagedTensor *outs[2] = {(DLManagedTensor *)0x1, (DLManagedTensor *)0x2};
  assert_fails(dynamo_entry_run_alloc(x.entry, x.args, 2, outs, SIZE_MAX), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "expected 1 output(s)");
  assert_null(outs[0]);
  assert_ptr_equal(outs[1], (DLManagedTensor *)0x2);  /* past what the entry returns: untouched */
  dynamo_entry *dead = x.entry;
  assert_ok(dynamo_frame_destroy(x.frame));
  outs[0] = (DLManagedTensor *)0x1;
  assert_fails(dynamo_entry_run_alloc(dead, x.args, 2, outs, 1), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_null(outs[0]);
}

/* Messages say what is wrong: vector lanes, a result-type count, the function given NULL
 * outputs, a malformed device suffix, a GPU name no target knows (and LLVM prints nothing). */
static void test_messages_name_the_problem(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  x.ta.dl.dtype.lanes = 4;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS, "4 lanes");
  x.ta.dl.dtype.lanes = 0;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS, "0 lanes");
  x.ta.dl.dtype.lanes = 1;
  x.to.dl.dtype.lanes = 4;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH, "output 0: dtype mismatch: 4 lanes");
  x.to.dl.dtype.lanes = 1;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, NULL, 1), DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_entry_run: outs is NULL");
  assert_fails(dynamo_frame_run(x.frame, x.args, 2, NULL, 1), DYNAMO_ERR_INVALID_ARGUMENT, "dynamo_frame_run: outs is NULL");
  assert_ok(dynamo_frame_destroy(x.frame));

  dynamo_trace *t = NULL;
  assert_fails(dynamo_trace_parse("trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0) : f32[4], f32[4]\n  return %1\n}\n",
                                  (size_t)-1, &t),
               DYNAMO_ERR_VERIFY, "2 result types annotated, the op has 1 result(s)");
  static const char *devices[] = {"cuda:abc", "cuda:0x1", "cuda:4294967296", "cuda:99999999999999", "cuda:-1", "cuda:"};
  for (size_t i = 0; i < sizeof devices / sizeof *devices; ++i) {
    char text[160];
    snprintf(text, sizeof text, "trace @t {\n  %%0 = input f32[4] %s\n  %%1 = exp(%%0) : f32[4]\n  return %%1\n}\n", devices[i]);
    assert_fails(dynamo_trace_parse(text, (size_t)-1, &t), DYNAMO_ERR_PARSE, "a device index after 'cuda:'");
  }
  char text[160];
  snprintf(text, sizeof text, "trace @t {\n  %%0 = input f32[4] cuda:7\n  %%1 = exp(%%0) : f32[4]\n  return %%1\n}\n");
  assert_ok(dynamo_trace_parse(text, (size_t)-1, &t));
  char *printed = NULL;
  assert_ok(dynamo_trace_print(t, &printed));
  assert_non_null(strstr(printed, "cuda:7"));
  dynamo_string_free(printed);
  printed = (char *)0x1;  /* a handle of another kind is not a trace */
  assert_fails(dynamo_trace_print((const dynamo_trace *)(const void *)g_engine, &printed), DYNAMO_ERR_INVALID_HANDLE,
               "dynamo_trace_print: trace is not a live handle");
  assert_null(printed);
  char *ptx = (char *)0x1;
  static const char *gpus[] = {"sm_", "sm_99999999999999999999", "sm_abc"};
  for (size_t i = 0; i < sizeof gpus / sizeof *gpus; ++i)
    assert_fails(dynamo_trace_to_ptx(t, gpus[i], &ptx), DYNAMO_ERR_UNSUPPORTED, "not a processor the NVPTX target knows");
  assert_null(ptx);
  dynamo_trace_destroy(t);
}

/* log1p of a huge float is log(x) (88.19 for 2e38), where SLEEF's log1p (and ATen's with it)
 * overflows to inf; small and negative arguments keep log1p's accuracy. */
static void test_log1p_of_huge_values(void **state) {
  (void)state;
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine,
                                 "trace @l {\n  %0 = input f32[5]\n  %1 = log1p(%0) : f32[5]\n  return %1\n}\n", &entry);
  float a[5] = {2e38f, 3.4e38f, 1e-7f, -0.5f, 1e10f}, out[5] = {0};
  int64_t s5[1] = {5};
  test_tensor ta, to;
  tt_init(&ta, a, kDLFloat, 32, 1, s5, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s5, NULL);
  dynamo_arg args[1] = {arg_tensor(&ta)};
  assert_ok(dynamo_entry_run(entry, args, 1, &to.dl, 1));
  const double want[5] = {88.19138068236225, 88.72200895132066, 9.999999616860996e-08, -0.6931471805599453, 23.025850930040455};  /* log1p of the float values, in double */
  for (int k = 0; k < 5; ++k) {
    double d = (double)out[k] - want[k], w = want[k] < 0 ? -want[k] : want[k];
    assert_true(isfinite(out[k]) && (d < 0 ? -d : d) <= 1e-6 * w + 1e-12);
  }
  assert_ok(dynamo_frame_destroy(f));
}

/* A dependency chain 10^5 instructions deep (an unrolled loop, a long model) compiles in well
 * under a second and runs: no pass recurses on the trace's depth (the planner's fusion walk,
 * the kernel emitter's operand walks overflowed an 8 MB stack at ~10^4), and no loop body holds
 * more than 2048 of its ops (one of 10^5 took LLVM's scheduler 24 s). */
static void test_deep_chain_compiles(void **state) {
  (void)state;
  enum { N = 100000 };
  size_t cap = (size_t)N * 48 + 256, n = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  n += (size_t)snprintf(text + n, cap - n, "trace @deep {\n  %%0 = input f32[4]\n");
  for (int i = 1; i <= N; ++i)
    n += (size_t)snprintf(text + n, cap - n, "  %%%d = add(%%%d, 1.0) : f32[4]\n", i, i - 1);
  n += (size_t)snprintf(text + n, cap - n, "  return %%%d\n}\n", N);
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, text, &entry);
  free(text);
  float a[4] = {0, 1, 2, -3}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor ta, to;
  tt_init(&ta, a, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[1] = {arg_tensor(&ta)};
  assert_ok(dynamo_entry_run(entry, args, 1, &to.dl, 1));
  for (int k = 0; k < 4; ++k) assert_true(out[k] == a[k] + (float)N);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_entry_run_happy_path(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  float a_copy[4], b_copy[4];
  memcpy(a_copy, x.a, sizeof a_copy);
  memcpy(b_copy, x.b, sizeof b_copy);
  assert_ok(dynamo_entry_run(x.entry, x.args, 2, &x.to.dl, 1));
  assert_true(x.out[0] == 1.5f && x.out[1] == 3.0f && x.out[2] == 4.5f && x.out[3] == 6.0f);
  /* Inputs are not modified. */
  assert_memory_equal(x.a, a_copy, sizeof a_copy);
  assert_memory_equal(x.b, b_copy, sizeof b_copy);
  /* Explicit contiguous strides on the output are fine. */
  int64_t st1[1] = {1};
  int64_t s4[1] = {4};
  float out2[4] = {0};
  test_tensor o2;
  tt_init(&o2, out2, kDLFloat, 32, 1, s4, st1);
  assert_ok(dynamo_entry_run(x.entry, x.args, 2, &o2.dl, 1));
  assert_memory_equal(out2, x.out, sizeof out2);
  /* Input and output buffers adjacent in one array do not overlap. */
  float buf[8] = {1, 2, 3, 4, 0, 0, 0, 0};
  test_tensor tin, tout;
  tt_init(&tin, buf, kDLFloat, 32, 1, s4, NULL);
  tt_init(&tout, buf + 4, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&tin), arg_tensor(&tin)};
  assert_ok(dynamo_entry_run(x.entry, args, 2, &tout.dl, 1));
  assert_true(buf[4] == 2.0f && buf[5] == 4.0f && buf[6] == 6.0f && buf[7] == 8.0f);
  assert_ok(dynamo_frame_destroy(x.frame));

  /* An extern op (aten::mm) and a fused epilogue compute exact numbers. */
  const char *mm =
      "trace @mm {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = input f32[3,2]\n"
      "  %2 = extern aten::mm(%0, %1) : f32[2,2]\n"
      "  %3 = add(%2, 1.0) : f32[2,2]\n"
      "  return %3\n"
      "}\n";
  float mo[4];
  run_mm_trace(mm, 1, mo);
  /* [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[4,5],[10,11]], plus 1. */
  assert_true(mo[0] == 5.0f && mo[1] == 6.0f && mo[2] == 11.0f && mo[3] == 12.0f);
}

/* Engine-allocated outputs: values, ownership past the engine's lifetime, reuse of released
 * memory, aliases left to the caller, and bad arguments. */
static void test_entry_run_alloc(void **state) {
  (void)state;
  dynamo_engine *eng = NULL;
  assert_ok(dynamo_engine_create(NULL, &eng));
  add_fixture x;
  memset(&x, 0, sizeof x);
  dynamo_frame *f = compile_text(eng, kAdd, &x.entry);
  static const int64_t s4[1] = {4};
  for (int i = 0; i < 4; ++i) x.a[i] = (float)(i + 1), x.b[i] = 10.0f * (float)(i + 1);
  tt_init(&x.ta, x.a, kDLFloat, 32, 1, s4, NULL);
  tt_init(&x.tb, x.b, kDLFloat, 32, 1, s4, NULL);
  x.args[0] = arg_tensor(&x.ta);
  x.args[1] = arg_tensor(&x.tb);

  DLManagedTensor *out = (DLManagedTensor *)0x1;
  assert_fails(dynamo_entry_run_alloc(NULL, x.args, 2, &out, 1), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_run_alloc(x.entry, x.args, 2, NULL, 1), DYNAMO_ERR_INVALID_ARGUMENT, "out_tensors is NULL");
  assert_fails(dynamo_entry_run_alloc(x.entry, NULL, 2, &out, 1), DYNAMO_ERR_INVALID_ARGUMENT, "args is NULL");
  assert_null(out);
  DLManagedTensor *two[2] = {(DLManagedTensor *)0x1, (DLManagedTensor *)0x1};
  assert_fails(dynamo_entry_run_alloc(x.entry, x.args, 2, two, 2), DYNAMO_ERR_ARGUMENT_MISMATCH, "expected 1 output(s), got 2");
  assert_null(two[0]);
  assert_null(two[1]);
  assert_fails(dynamo_entry_run_alloc(x.entry, x.args, 1, &out, 1), DYNAMO_ERR_GUARD_MISS, "input count mismatch");
  assert_null(out);

  assert_ok(dynamo_entry_run_alloc(x.entry, x.args, 2, &out, 1));
  assert_non_null(out);
  assert_non_null(out->deleter);
  const DLTensor *t = &out->dl_tensor;
  assert_int_equal(t->ndim, 1);
  assert_int_equal(t->shape[0], 4);
  assert_int_equal(t->dtype.code, kDLFloat);
  assert_int_equal(t->dtype.bits, 32);
  assert_int_equal(t->device.device_type, kDLCPU);
  assert_int_equal((uintptr_t)t->data % 64, 0);
  const float *v = (const float *)t->data;
  assert_true(v[0] == 11.0f && v[1] == 22.0f && v[2] == 33.0f && v[3] == 44.0f);
  /* A second call while the first output is held gets different memory; after a release the
   * next call reuses the released buffer. */
  DLManagedTensor *out2 = NULL;
  assert_ok(dynamo_entry_run_alloc(x.entry, x.args, 2, &out2, 1));
  assert_ptr_not_equal(out2->dl_tensor.data, t->data);
  void *released = out2->dl_tensor.data;
  out2->deleter(out2);
  DLManagedTensor *out3 = NULL;
  assert_ok(dynamo_entry_run_alloc(x.entry, x.args, 2, &out3, 1));
  assert_ptr_equal(out3->dl_tensor.data, released);
  out3->deleter(out3);

  /* An output that is the input itself is left to the caller (NULL); a fresh one is allocated. */
  const char *alias_text =
      "trace @alias {\n"
      "  %0 = input f32[4]\n"
      "  %1 = mul(%0, 2.0) : f32[4]\n"
      "  return %0, %1\n"
      "}\n";
  dynamo_entry *ae = NULL;
  dynamo_frame *af = compile_text(eng, alias_text, &ae);
  DLManagedTensor *pair[2] = {(DLManagedTensor *)0x1, NULL};
  assert_ok(dynamo_entry_run_alloc(ae, x.args, 1, pair, 2));
  assert_null(pair[0]);
  assert_non_null(pair[1]);
  assert_true(((float *)pair[1]->dl_tensor.data)[3] == 8.0f);
  pair[1]->deleter(pair[1]);
  assert_ok(dynamo_frame_destroy(af));

  /* Outputs may outlive the frame and the engine. */
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));
  assert_true(((const float *)out->dl_tensor.data)[3] == 44.0f);
  out->deleter(out);
}

/* -- Running: inputs that do not match ------------------------------------------------------- */

static void test_entry_run_guard_miss(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  dynamo_arg args[2];

  /* Wrong dtype: f64 where f32 is expected. */
  double d[4] = {1, 2, 3, 4};
  int64_t s4[1] = {4}, s5[1] = {5}, s22[2] = {2, 2};
  test_tensor td;
  tt_init(&td, d, kDLFloat, 64, 1, s4, NULL);
  args[0] = x.args[0];
  args[1] = arg_tensor(&td);
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: dtype mismatch: expected float32, got float64");
  assert_fails(dynamo_frame_run(x.frame, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: dtype mismatch: expected float32, got float64");

  /* Wrong shape. */
  float f5[5] = {0};
  test_tensor t5;
  tt_init(&t5, f5, kDLFloat, 32, 1, s5, NULL);
  args[1] = arg_tensor(&t5);
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: size mismatch at dim 0: expected 4, got 5");
  assert_fails(dynamo_frame_run(x.frame, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: size mismatch at dim 0: expected 4, got 5");

  /* Wrong rank. */
  test_tensor t22;
  tt_init(&t22, x.b, kDLFloat, 32, 2, s22, NULL);
  args[0] = arg_tensor(&t22);
  args[1] = x.args[1];
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 0: rank mismatch: expected 1, got 2");
  assert_fails(dynamo_frame_run(x.frame, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 0: rank mismatch: expected 1, got 2");

  /* Wrong kind: an int, a float or a bool where a tensor is expected. */
  args[0] = x.args[0];
  args[1] = arg_int(4);
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: kind mismatch: expected tensor, got int");
  assert_fails(dynamo_frame_run(x.frame, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: kind mismatch: expected tensor, got int");
  args[1] = arg_float(4.0);
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS, "got float");
  args[1] = arg_bool(1);
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS, "got bool");
  args[1] = x.args[1];
  args[1].kind = 99;
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input 1: kind mismatch: expected tensor, got an unknown kind");
  args[1].kind = -1;
  assert_fails(dynamo_entry_run(x.entry, args, 2, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS, "an unknown kind");

  /* The output was never written. */
  assert_true(x.out[0] == 0.0f && x.out[3] == 0.0f);
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_run_input_count(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  dynamo_arg three[3] = {x.args[0], x.args[1], x.args[1]};
  /* The input count is part of the entry's guards. */
  assert_fails(dynamo_entry_run(x.entry, x.args, 1, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch: expected 2, got 1");
  assert_fails(dynamo_entry_run(x.entry, three, 3, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch: expected 2, got 3");
  assert_fails(dynamo_frame_run(x.frame, x.args, 1, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch: expected 2, got 1");
  assert_fails(dynamo_frame_run(x.frame, NULL, 0, &x.to.dl, 1), DYNAMO_ERR_GUARD_MISS,
               "input count mismatch: expected 2, got 0");
  assert_ok(dynamo_frame_destroy(x.frame));
}

/* -- Running: outputs that do not match ------------------------------------------------------ */

static void test_entry_run_output_count(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  float extra[4];
  int64_t s4[1] = {4};
  DLTensor two[2];
  test_tensor te;
  tt_init(&te, extra, kDLFloat, 32, 1, s4, NULL);
  two[0] = x.to.dl;
  two[1] = te.dl;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, NULL, 0), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "expected 1 output(s), got 0");
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, two, 2), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "expected 1 output(s), got 2");
  assert_fails(dynamo_frame_run(x.frame, x.args, 2, NULL, 0), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "expected 1 output(s), got 0");
  assert_fails(dynamo_frame_run(x.frame, x.args, 2, two, 2), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "expected 1 output(s), got 2");
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_run_output_mismatch(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  double d[4];
  float f6[6];
  int64_t s4[1] = {4}, s3[1] = {3}, s22[2] = {2, 2};
  test_tensor o;

  tt_init(&o, d, kDLFloat, 64, 1, s4, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: dtype mismatch: expected float32, got float64");
  tt_init(&o, x.out, kDLInt, 32, 1, s4, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: dtype mismatch: expected float32, got int32");
  tt_init(&o, f6, kDLFloat, 32, 1, s3, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: size mismatch at dim 0: expected 4, got 3");
  tt_init(&o, f6, kDLFloat, 32, 2, s22, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: rank mismatch: expected 1, got 2");
  tt_init(&o, x.out, kDLFloat, 32, 1, s4, NULL);
  o.dl.device.device_type = kDLCUDA;
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: must be a CPU tensor");

  /* Non-contiguous output strides. */
  float big[8];
  int64_t st2[1] = {2};
  tt_init(&o, big, kDLFloat, 32, 1, s4, st2);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: must be contiguous");

  const char *t2 =
      "trace @t2 {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = mul(%0, 2.0) : f32[2,3]\n"
      "  return %1\n"
      "}\n";
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, t2, &entry);
  float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
  int64_t s23[2] = {2, 3}, colmajor[2] = {1, 2};
  test_tensor ti;
  tt_init(&ti, in, kDLFloat, 32, 2, s23, NULL);
  dynamo_arg a = arg_tensor(&ti);
  tt_init(&o, out, kDLFloat, 32, 2, s23, colmajor);
  assert_fails(dynamo_entry_run(entry, &a, 1, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH, "output 0: must be contiguous");
  assert_fails(dynamo_frame_run(f, &a, 1, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH, "output 0: must be contiguous");
  for (int i = 0; i < 6; ++i) assert_true(out[i] == 0.0f);
  /* The same buffer declared contiguous works. */
  tt_init(&o, out, kDLFloat, 32, 2, s23, NULL);
  assert_ok(dynamo_entry_run(entry, &a, 1, &o.dl, 1));
  for (int i = 0; i < 6; ++i) assert_true(out[i] == 2.0f * in[i]);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_frame_destroy(x.frame));
}

static void test_entry_run_output_overlaps(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  int64_t s4[1] = {4};
  test_tensor o;
  /* The output is the first input's buffer. */
  tt_init(&o, x.a, kDLFloat, 32, 1, s4, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: overlaps the memory of input 0");
  assert_fails(dynamo_frame_run(x.frame, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH, "overlaps");
  /* The output is the second input's buffer. */
  tt_init(&o, x.b, kDLFloat, 32, 1, s4, NULL);
  assert_fails(dynamo_entry_run(x.entry, x.args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: overlaps the memory of input 1");
  /* Partial overlap: the output starts inside an input. */
  float buf[6] = {1, 2, 3, 4, 0, 0};
  test_tensor tin;
  tt_init(&tin, buf, kDLFloat, 32, 1, s4, NULL);
  tt_init(&o, buf + 2, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {x.args[0], arg_tensor(&tin)};
  assert_fails(dynamo_entry_run(x.entry, args, 2, &o.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
               "output 0: overlaps the memory of input 1");
  /* Inputs are untouched by the refused runs. */
  assert_true(buf[0] == 1.0f && buf[1] == 2.0f && buf[2] == 3.0f && buf[3] == 4.0f);
  assert_true(x.a[0] == 1.0f && x.b[0] == 0.5f);
  assert_ok(dynamo_frame_destroy(x.frame));

  /* Two outputs sharing memory. */
  const char *two =
      "trace @two {\n"
      "  %0 = input f32[4]\n"
      "  %1 = exp(%0) : f32[4]\n"
      "  %2 = neg(%0) : f32[4]\n"
      "  return %1, %2\n"
      "}\n";
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, two, &entry);
  float in[4] = {0, 0, 0, 0}, o0[4];
  test_tensor ti, to0;
  tt_init(&ti, in, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to0, o0, kDLFloat, 32, 1, s4, NULL);
  DLTensor outs[2] = {to0.dl, to0.dl};
  dynamo_arg a = arg_tensor(&ti);
  assert_fails(dynamo_entry_run(entry, &a, 1, outs, 2), DYNAMO_ERR_ARGUMENT_MISMATCH, "output 1: overlaps output 0");
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Dead handles ------------------------------------------------------------------------------ */

static void test_frame_run_destroyed_handle(void **state) {
  (void)state;
  add_fixture x;
  add_fixture_init(&x);
  /* Create every handle first: a new handle could reuse a freed address. */
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_parse(kAdd, (size_t)-1, &t));
  assert_ok(dynamo_frame_run(x.frame, x.args, 2, &x.to.dl, 1));
  dynamo_frame *dead_frame = x.frame;
  dynamo_entry *dead_entry = x.entry;
  assert_ok(dynamo_frame_destroy(x.frame));
  memset(x.out, 0, sizeof x.out);

  dynamo_entry *e = (dynamo_entry *)0x1;
  char why[64];
  dynamo_tensor_info info;
  dynamo_entry_stats st;
  st.struct_size = sizeof st;

  assert_fails(dynamo_frame_run(dead_frame, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_check_guards(dead_frame, x.args, 2, &e, why, sizeof why), DYNAMO_ERR_INVALID_HANDLE,
               "not a live handle");
  assert_null(e);
  assert_fails(dynamo_compile_frame(dead_frame, t, &e), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_null(e);
  assert_int_equal(dynamo_frame_num_entries(dead_frame), 0);
  assert_fails(dynamo_entry_run(dead_entry, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_entry_check_guards(dead_entry, x.args, 2, why, sizeof why), DYNAMO_ERR_INVALID_HANDLE,
               "not a live handle");
  assert_fails(dynamo_entry_output_info(dead_entry, 0, &info), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_entry_get_stats(dead_entry, &st), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_int_equal(dynamo_entry_num_inputs(dead_entry), 0);
  assert_int_equal(dynamo_entry_num_outputs(dead_entry), 0);
  /* A second destroy of the same frame is reported, not a double free. */
  assert_fails(dynamo_frame_destroy(dead_frame), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  /* A pointer that was never a handle. */
  assert_fails(dynamo_frame_run((dynamo_frame *)(void *)x.a, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_HANDLE,
               "not a live handle");
  assert_fails(dynamo_entry_run((dynamo_entry *)(void *)x.a, x.args, 2, &x.to.dl, 1), DYNAMO_ERR_INVALID_HANDLE,
               "not a live handle");
  assert_fails(dynamo_engine_destroy((dynamo_engine *)(void *)x.a), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  /* Nothing was written. */
  assert_true(x.out[0] == 0.0f && x.out[3] == 0.0f);
  dynamo_trace_destroy(t);
}

/* -- Failures while running ------------------------------------------------------------------- */

static void test_entry_run_extern_rejected(void **state) {
  (void)state;
  /* mm returns f32[2,4]; the trace declares f32[2,2]. */
  const char *wrong_result =
      "trace @t {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = input f32[3,4]\n"
      "  %2 = extern aten::mm(%0, %1) : f32[2,2]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, wrong_result, &entry);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[12] = {0}, out[4] = {0};
  int64_t s23[2] = {2, 3}, s34[2] = {3, 4}, s22[2] = {2, 2};
  test_tensor ta, tb, to;
  tt_init(&ta, a, kDLFloat, 32, 2, s23, NULL);
  tt_init(&tb, b, kDLFloat, 32, 2, s34, NULL);
  tt_init(&to, out, kDLFloat, 32, 2, s22, NULL);
  dynamo_arg args[2] = {arg_tensor(&ta), arg_tensor(&tb)};
  assert_fails(dynamo_entry_run(entry, args, 2, &to.dl, 1), DYNAMO_ERR_RUNTIME, "extern aten::mm result 0 is");
  assert_non_null(strstr(dynamo_last_error(), "[2,4]"));
  assert_non_null(strstr(dynamo_last_error(), "the trace expected f32[2,2]"));
  /* The entry stays usable: the same failure again, not a crash. */
  assert_fails(dynamo_frame_run(f, args, 2, &to.dl, 1), DYNAMO_ERR_RUNTIME, "the trace expected f32[2,2]");
  assert_ok(dynamo_frame_destroy(f));

  /* A real shape error raised by ATen: [2,3] @ [2,3]. */
  const char *bad_shapes =
      "trace @t {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = input f32[2,3]\n"
      "  %2 = extern aten::mm(%0, %1) : f32[2,3]\n"
      "  return %2\n"
      "}\n";
  f = compile_text(g_engine, bad_shapes, &entry);
  float c[6] = {0}, out6[6] = {0};
  test_tensor tc, to6;
  tt_init(&tc, c, kDLFloat, 32, 2, s23, NULL);
  tt_init(&to6, out6, kDLFloat, 32, 2, s23, NULL);
  args[1] = arg_tensor(&tc);
  assert_fails(dynamo_entry_run(entry, args, 2, &to6.dl, 1), DYNAMO_ERR_RUNTIME, "extern aten::mm failed: ");
  assert_non_null(strstr(dynamo_last_error(), "cannot be multiplied"));
  /* The C++ backtrace is cut off. */
  assert_null(strstr(dynamo_last_error(), "Exception raised from"));
  assert_ok(dynamo_frame_destroy(f));
}

static void test_entry_run_floordiv_by_zero(void **state) {
  (void)state;
  const char *src =
      "trace @t {\n"
      "  %0 = input i64[4]\n"
      "  %1 = input i64[4]\n"
      "  %2 = floordiv(%0, %1) : i64[4]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *entry = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &entry);
  int64_t a[4] = {-7, 7, 7, -7}, b[4] = {2, 2, -2, -2}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor ta, tb, to;
  tt_init(&ta, a, kDLInt, 64, 1, s4, NULL);
  tt_init(&tb, b, kDLInt, 64, 1, s4, NULL);
  tt_init(&to, out, kDLInt, 64, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&ta), arg_tensor(&tb)};
  /* Python semantics: rounds toward negative infinity. */
  assert_ok(dynamo_entry_run(entry, args, 2, &to.dl, 1));
  assert_true(out[0] == -4 && out[1] == 3 && out[2] == -4 && out[3] == 3);
  b[2] = 0;
  assert_fails(dynamo_entry_run(entry, args, 2, &to.dl, 1), DYNAMO_ERR_RUNTIME, "ZeroDivisionError");
  assert_fails(dynamo_frame_run(f, args, 2, &to.dl, 1), DYNAMO_ERR_RUNTIME,
               "ZeroDivisionError: integer floor division by zero");
  /* A later good run succeeds: the failure flag does not stick. */
  b[2] = -2;
  memset(out, 0, sizeof out);
  assert_ok(dynamo_entry_run(entry, args, 2, &to.dl, 1));
  assert_true(out[0] == -4 && out[1] == 3 && out[2] == -4 && out[3] == 3);
  assert_ok(dynamo_frame_destroy(f));
}

/* -- The BLAS hold ------------------------------------------------------------------------- */

/* OpenBLAS's get/set of the process (already mapped through LibTorch), or NULLs without one. */
static int (*ob_get)(void);
static void (*ob_set)(int);
static void find_openblas(void) {
  static const char *names[] = {"libblas.so.3", "libopenblas.so.0", "libopenblasp.so.0"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !ob_get; ++i) {
    void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    *(void **)&ob_get = dlsym(h, "openblas_get_num_threads");
    *(void **)&ob_set = dlsym(h, "openblas_set_num_threads");
    if (!ob_get || !ob_set) ob_get = NULL, ob_set = NULL;
  }
}

/* Holds nest, the last release restores OpenBLAS's count, bad use is refused, and a run of a
 * trace with a LibTorch call leaves the count as it found it. */
static void test_blas_hold(void **state) {
  (void)state;
  assert_fails(dynamo_blas_hold(2), DYNAMO_ERR_INVALID_ARGUMENT, "enter must be 0 or 1, got 2");
  assert_fails(dynamo_blas_hold(-1), DYNAMO_ERR_INVALID_ARGUMENT, "enter must be 0 or 1");
  assert_fails(dynamo_blas_hold(0), DYNAMO_ERR_INVALID_ARGUMENT, "released without a hold");
  find_openblas();
  if (!ob_get) {  /* the reference BLAS or MKL: holds are counted and change nothing */
    assert_int_equal(dynamo_blas_threads(), 0);
    assert_ok(dynamo_blas_hold(1));
    assert_ok(dynamo_blas_hold(0));
    return;
  }
  int before = ob_get();
  if (before < 2) ob_set(2); /* OPENBLAS_NUM_THREADS=1: give the hold something to change */
  int n = ob_get();
  assert_true(n >= 2);
  assert_int_equal(dynamo_blas_threads(), n);
  assert_ok(dynamo_blas_hold(1));
  assert_int_equal(ob_get(), 1);
  assert_int_equal(dynamo_blas_threads(), n); /* the count it returns to */
  assert_ok(dynamo_blas_hold(1));
  assert_ok(dynamo_blas_hold(0));
  assert_int_equal(ob_get(), 1); /* one hold left */
  assert_ok(dynamo_blas_hold(0));
  assert_int_equal(ob_get(), n);
  assert_fails(dynamo_blas_hold(0), DYNAMO_ERR_INVALID_ARGUMENT, "released without a hold");

  const char *mm =
      "trace @mm_hold {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = input f32[3,2]\n"
      "  %2 = extern aten::mm(%0, %1) : f32[2,2]\n"
      "  return %2\n"
      "}\n";
  float mo[4];
  run_mm_trace(mm, 3, mo);
  assert_true(mo[0] == 4.0f && mo[1] == 5.0f && mo[2] == 10.0f && mo[3] == 11.0f);
  assert_int_equal(ob_get(), n);
  ob_set(before);
}

/* What an entry's product step chose by timing, handed to a second entry of the same trace. */
static void test_entry_choices(void **state) {
  (void)state;
  const char *mm =
      "trace @mm_choice {\n"
      "  %0 = input f32[2,3]\n"
      "  %1 = input f32[3,2]\n"
      "  %2 = extern aten::mm(%0, %1) : f32[2,2]\n"
      "  %3 = exp(%2) : f32[2,2]\n"
      "  return %3\n"
      "}\n";
  float m0[6] = {1, 2, 3, 4, 5, 6}, m1[6] = {1, 0, 0, 1, 1, 1}, out[4];
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s22[2] = {2, 2};
  test_tensor t0, t1, tm;
  tt_init(&t0, m0, kDLFloat, 32, 2, s23, NULL);
  tt_init(&t1, m1, kDLFloat, 32, 2, s32, NULL);
  tt_init(&tm, out, kDLFloat, 32, 2, s22, NULL);
  dynamo_arg margs[2] = {arg_tensor(&t0), arg_tensor(&t1)};
  dynamo_entry *e1 = NULL, *e2 = NULL;
  dynamo_frame *f1 = compile_text(g_engine, mm, &e1), *f2 = compile_text(g_engine, mm, &e2);
  char *text = NULL;
  assert_fails(dynamo_entry_choices(NULL, &text), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_choices(e1, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out_text is NULL");
  assert_ok(dynamo_entry_choices(e1, &text));
  assert_string_equal(text, ""); /* nothing timed yet */
  dynamo_string_free(text);
  for (int i = 0; i < 3; ++i) assert_ok(dynamo_entry_run(e1, margs, 2, &tm.dl, 1));
  assert_true(fabsf(out[0] - expf(4.0f)) < 1e-3f * expf(4.0f) && fabsf(out[3] - expf(11.0f)) < 1e-3f * expf(11.0f));
  assert_ok(dynamo_entry_choices(e1, &text));
  assert_true(!strcmp(text, "0=own") || !strcmp(text, "0=blas"));
  const char *other = !strcmp(text, "0=own") ? "0=blas" : "0=own";
  /* The second entry starts from the first's choice, without timing. */
  assert_ok(dynamo_entry_set_choices(e2, text));
  char *text2 = NULL;
  assert_ok(dynamo_entry_choices(e2, &text2));
  assert_string_equal(text2, text);
  dynamo_string_free(text2);
  assert_ok(dynamo_entry_run(e2, margs, 2, &tm.dl, 1));
  assert_true(fabsf(out[1] - expf(5.0f)) < 1e-3f * expf(5.0f));
  /* Bad texts are refused whole, naming what is wrong. */
  assert_fails(dynamo_entry_set_choices(NULL, "0=own"), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_set_choices(e2, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "choices is NULL");
  assert_fails(dynamo_entry_set_choices(e2, "0=onednn"), DYNAMO_ERR_INVALID_ARGUMENT, "cannot take 'onednn' (a product");
  assert_fails(dynamo_entry_set_choices(e2, "7=own"), DYNAMO_ERR_INVALID_ARGUMENT, "step 7 does not exist (the entry has 1");
  assert_fails(dynamo_entry_set_choices(e2, "own"), DYNAMO_ERR_INVALID_ARGUMENT, "'own' is not <step>=<choice>");
  assert_fails(dynamo_entry_set_choices(e2, "=own"), DYNAMO_ERR_INVALID_ARGUMENT, "is not <step>=<choice>");
  assert_fails(dynamo_entry_set_choices(e2, "0x=own"), DYNAMO_ERR_INVALID_ARGUMENT, "is not <step>=<choice>");
  char both[32];
  snprintf(both, sizeof both, "%s 1=own", other);
  assert_fails(dynamo_entry_set_choices(e2, both), DYNAMO_ERR_INVALID_ARGUMENT, "step 1 does not exist");
  assert_ok(dynamo_entry_choices(e2, &text2));
  assert_string_equal(text2, text); /* unchanged */
  dynamo_string_free(text2);
  assert_ok(dynamo_entry_set_choices(e2, other));
  assert_ok(dynamo_entry_set_choices(e2, "")); /* nothing to change */
  assert_ok(dynamo_entry_choices(e2, &text2));
  assert_string_equal(text2, other);
  dynamo_string_free(text2);
  dynamo_string_free(text);
  /* DYNAMO_PROFILE's step times: refused for an entry compiled without it (the profiled path
   * is tested from Python, which sets the variable before the library loads). */
  assert_fails(dynamo_entry_profile(NULL, &text), DYNAMO_ERR_INVALID_ARGUMENT, "entry is NULL");
  assert_fails(dynamo_entry_profile(e1, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out_text is NULL");
  const char *prof = getenv("DYNAMO_PROFILE");
  if (!prof || !*prof || !strcmp(prof, "0")) {
    assert_fails(dynamo_entry_profile(e1, &text), DYNAMO_ERR_UNSUPPORTED, "was not profiled");
  } else {
    assert_ok(dynamo_entry_profile(e1, &text));
    assert_true(!strncmp(text, "runs 3 ", 7) && strstr(text, "extern aten::mm") != NULL);
    dynamo_string_free(text);
  }
  /* A trace without convolutions or products makes no choices. */
  dynamo_entry *e3 = NULL;
  dynamo_frame *f3 = compile_text(g_engine, kAdd, &e3);
  assert_fails(dynamo_entry_set_choices(e3, "0=own"), DYNAMO_ERR_INVALID_ARGUMENT, "step 0 does not exist (the entry has 0");
  assert_ok(dynamo_frame_destroy(f3));
  assert_ok(dynamo_frame_destroy(f1));
  assert_ok(dynamo_frame_destroy(f2));
  assert_fails(dynamo_entry_choices(e1, &text), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
  assert_fails(dynamo_entry_profile(e1, &text), DYNAMO_ERR_INVALID_HANDLE, "not a live handle");
}

/* The cache directory: off, a private one, and one others may write into. */
static void test_cache_directory(void **state) {
  (void)state;
  const char *saved = getenv("DYNAMO_CACHE_DIR");
  char *keep = saved ? strdup(saved) : NULL;
  char *dir = NULL;
  assert_fails(dynamo_cache_directory(NULL), DYNAMO_ERR_INVALID_ARGUMENT, "out_dir is NULL");
  setenv("DYNAMO_CACHE_DIR", "off", 1);
  assert_fails(dynamo_cache_directory(&dir), DYNAMO_ERR_UNSUPPORTED, "the cache is off");
  assert_null(dir);
  char tmpl[] = "/tmp/dynamo-capi-cache-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  char sub[64];
  snprintf(sub, sizeof sub, "%s/c", tmpl);
  setenv("DYNAMO_CACHE_DIR", sub, 1);
  assert_ok(dynamo_cache_directory(&dir)); /* created, 0700 */
  assert_string_equal(dir, sub);
  dynamo_string_free(dir);
  struct stat st;
  assert_int_equal(stat(sub, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  chmod(sub, 0777);
  dir = NULL;
  assert_fails(dynamo_cache_directory(&dir), DYNAMO_ERR_UNSUPPORTED, "writable by others (mode 0777)");
  assert_null(dir);
  rmdir(sub);
  /* a relative name of one component, and missing parents: private too (umask 022 made them 0750) */
  char cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(tmpl), 0);
  mode_t old_mask = umask(022);
  const char *paths[] = {"single", "p/q/r"};
  for (size_t i = 0; i < 2; ++i) {
    setenv("DYNAMO_CACHE_DIR", paths[i], 1);
    assert_ok(dynamo_cache_directory(&dir));
    dynamo_string_free(dir);
  }
  const char *made[] = {"single", "p", "p/q", "p/q/r"};
  for (size_t i = 0; i < 4; ++i) {
    assert_int_equal(stat(made[i], &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
  }
  umask(old_mask);
  rmdir("single");
  rmdir("p/q/r");
  rmdir("p/q");
  rmdir("p");
  assert_int_equal(chdir(cwd), 0);
  rmdir(tmpl);
  if (keep) {
    setenv("DYNAMO_CACHE_DIR", keep, 1);
    free(keep);
  } else {
    unsetenv("DYNAMO_CACHE_DIR");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_abi_version_matches_header),
      cmocka_unit_test(test_status_name_values),
      cmocka_unit_test(test_status_table_is_the_enum),
      cmocka_unit_test(test_engine_create_null_out),
      cmocka_unit_test(test_engine_create_bad_options),
      cmocka_unit_test(test_engine_destroy_null_ok),
      cmocka_unit_test(test_engine_destroy_live_frame),
      cmocka_unit_test(test_trace_parse_null_args),
      cmocka_unit_test(test_trace_parse_malformed),
      cmocka_unit_test(test_trace_print_null_args),
      cmocka_unit_test(test_trace_add_bad_args),
      cmocka_unit_test(test_frame_create_null_args),
      cmocka_unit_test(test_compile_frame_null_args),
      cmocka_unit_test(test_compile_frame_unknown_extern),
      cmocka_unit_test(test_compile_frame_cuda_input),
      cmocka_unit_test(test_check_guards_null_args),
      cmocka_unit_test(test_entry_check_guards_null_args),
      cmocka_unit_test(test_entry_run_null_args),
      cmocka_unit_test(test_entry_run_zero_dim_null_data),
      cmocka_unit_test(test_frame_run_null_args),
      cmocka_unit_test(test_handle_of_wrong_kind),
      cmocka_unit_test(test_entry_output_info_bad_args),
      cmocka_unit_test(test_entry_get_stats_bad_args),
      cmocka_unit_test(test_same_program_at_other_sizes_shares_code),
      cmocka_unit_test(test_sized_trace_runs_at_many_sizes),
      cmocka_unit_test(test_sized_trace_relations),
      cmocka_unit_test(test_sized_trace_bad_input),
      cmocka_unit_test(test_entry_run_happy_path),
      cmocka_unit_test(test_deep_chain_compiles),
      cmocka_unit_test(test_log1p_of_huge_values),
      cmocka_unit_test(test_messages_name_the_problem),
      cmocka_unit_test(test_sizes_that_overflow_are_refused),
      cmocka_unit_test(test_copy_into_repeated_memory_is_refused),
      cmocka_unit_test(test_entry_run_alloc_counts),
      cmocka_unit_test(test_entry_run_alloc),
      cmocka_unit_test(test_entry_run_guard_miss),
      cmocka_unit_test(test_entry_run_input_count),
      cmocka_unit_test(test_entry_run_output_count),
      cmocka_unit_test(test_entry_run_output_mismatch),
      cmocka_unit_test(test_entry_run_output_overlaps),
      cmocka_unit_test(test_frame_run_destroyed_handle),
      cmocka_unit_test(test_entry_run_extern_rejected),
      cmocka_unit_test(test_entry_run_floordiv_by_zero),
      cmocka_unit_test(test_blas_hold),
      cmocka_unit_test(test_entry_choices),
      cmocka_unit_test(test_cache_directory),
  };
  return cmocka_run_group_tests_name("capi", tests, group_setup, group_teardown);
}
