/* test_exits.c -- side exits through the C API: a trace with a guard op passes or leaves at
 * the guard with its live values, counts each exit, does in-place writes before the exit
 * exactly once, refuses plans that would read memory a flushed write replaced, and rejects
 * malformed guards with clear messages. Public header only. */
#include "helpers.h"

#define assert_fails(call, want, needle)                                                          \
  do {                                                                                            \
    assert_status_msg((call), (want), (needle));                                                  \
    assert_true(strlen(dynamo_last_error()) > 0);                                                 \
  } while (0)

static dynamo_status compile_status(const char *text, dynamo_frame **f, dynamo_entry **e) {
  dynamo_trace *t = NULL;
  dynamo_status s = dynamo_trace_parse(text, strlen(text), &t);
  if (s != DYNAMO_OK) return s;
  s = dynamo_frame_create(g_engine, "exits", f);
  if (s == DYNAMO_OK) s = dynamo_compile_frame(*f, t, e);
  dynamo_trace_destroy(t);
  return s;
}

/* sum(x) > 0 ? x * 2 : exit 0 with (sum, x) */
static const char *kBranch =
    "trace @branch {\n"
    "  %0 = input f32[8]\n"
    "  %1 = sum(%0, [], false) : f32[]\n"
    "  %2 = gt(%1, 0.0) : bool[]\n"
    "  %3 = guard(%2, true, 0, %1, %0) : bool[]\n"
    "  %4 = mul(%0, 2.0) : f32[8]\n"
    "  return %4\n"
    "}\n";

/* The earlier spelling, an extern named dynamo::guard, is read as the guard op (printed so). */
static void test_the_earlier_spelling_is_the_guard_op(void **state) {
  (void)state;
  const char *old = "trace @branch {\n  %0 = input f32[8]\n  %1 = sum(%0, [], false) : f32[]\n"
                    "  %2 = gt(%1, 0.0) : bool[]\n  %3 = extern dynamo::guard(%2, true, 0, %1, %0) : bool[]\n"
                    "  %4 = mul(%0, 2.0) : f32[8]\n  return %4\n}\n";
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_parse(old, strlen(old), &t));
  char *text = NULL;
  assert_ok(dynamo_trace_print(t, &text));
  assert_non_null(strstr(text, "%3 = guard(%2, true, 0, %1, %0) : bool[]"));
  assert_null(strstr(text, "extern"));
  dynamo_string_free(text);
  dynamo_trace_destroy(t);
}

static void test_guard_passes_or_exits_with_live_values(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  dynamo_entry *e = NULL;
  assert_ok(compile_status(kBranch, &f, &e));
  assert_int_equal(dynamo_entry_num_exits(e), 1);
  assert_int_equal(dynamo_entry_exit_count(e, 0), 0);
  float x[8], y[8];
  static const int64_t s8[1] = {8};
  test_tensor tx, ty;
  tt_init(&tx, x, kDLFloat, 32, 1, s8, NULL);
  tt_init(&ty, y, kDLFloat, 32, 1, s8, NULL);
  dynamo_arg a = arg_tensor(&tx);

  for (int i = 0; i < 8; ++i) x[i] = (float)(i + 1);
  assert_ok(dynamo_entry_run(e, &a, 1, &ty.dl, 1));
  for (int i = 0; i < 8; ++i) assert_true(y[i] == 2.0f * x[i]);
  assert_int_equal(dynamo_entry_exit_count(e, 0), 0);
  int32_t id = -1;
  size_t n = 99;
  assert_fails(dynamo_take_exit(&id, NULL, 0, &n), DYNAMO_ERR_INVALID_ARGUMENT, "no side exit is pending");

  for (int i = 0; i < 8; ++i) x[i] = -(float)(i + 1), y[i] = 7.0f;
  assert_status_msg(dynamo_entry_run(e, &a, 1, &ty.dl, 1), DYNAMO_EXIT, "side exit 0");
  for (int i = 0; i < 8; ++i) assert_true(y[i] == 7.0f); /* outputs untouched */
  assert_int_equal(dynamo_entry_exit_count(e, 0), 1);
  DLManagedTensor *vals[2] = {NULL, NULL};
  assert_fails(dynamo_take_exit(&id, vals, 1, &n), DYNAMO_ERR_ARGUMENT_MISMATCH, "2 live value(s)");
  assert_int_equal(n, 2);
  assert_fails(dynamo_take_exit(NULL, vals, 2, &n), DYNAMO_ERR_INVALID_ARGUMENT, "exit_id is NULL");
  assert_fails(dynamo_take_exit(&id, NULL, 2, &n), DYNAMO_ERR_INVALID_ARGUMENT, "values is NULL");
  assert_fails(dynamo_take_exit(&id, vals, 2, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "num_values is NULL");
  assert_ok(dynamo_take_exit(&id, vals, 2, &n));
  assert_int_equal(id, 0);
  assert_int_equal(n, 2);
  assert_int_equal(vals[0]->dl_tensor.ndim, 0);
  assert_true(*(const float *)vals[0]->dl_tensor.data == -36.0f);
  assert_int_equal(vals[1]->dl_tensor.ndim, 1);
  assert_int_equal(vals[1]->dl_tensor.shape[0], 8);
  const float *xv = (const float *)vals[1]->dl_tensor.data;
  assert_ptr_not_equal(xv, x); /* a copy, owned by the caller */
  for (int i = 0; i < 8; ++i) assert_true(xv[i] == x[i]);
  vals[0]->deleter(vals[0]);
  vals[1]->deleter(vals[1]);
  assert_fails(dynamo_take_exit(&id, vals, 2, &n), DYNAMO_ERR_INVALID_ARGUMENT, "no side exit is pending");

  /* Engine-allocated outputs: none on an exit; an untaken exit is dropped by the next run. */
  DLManagedTensor *out = (DLManagedTensor *)0x1;
  assert_int_equal(dynamo_entry_run_alloc(e, &a, 1, &out, 1), DYNAMO_EXIT);
  assert_null(out);
  assert_int_equal(dynamo_entry_exit_count(e, 0), 2);
  for (int i = 0; i < 8; ++i) x[i] = 1.0f;
  assert_ok(dynamo_entry_run_alloc(e, &a, 1, &out, 1));
  assert_true(((const float *)out->dl_tensor.data)[3] == 2.0f);
  out->deleter(out);
  assert_fails(dynamo_take_exit(&id, vals, 2, &n), DYNAMO_ERR_INVALID_ARGUMENT, "no side exit is pending");

  assert_int_equal(dynamo_entry_exit_count(e, 1), -1);
  assert_int_equal(dynamo_entry_exit_count(e, -1), -1);
  assert_int_equal(dynamo_entry_exit_count(NULL, 0), -1);
  assert_int_equal(dynamo_entry_num_exits(NULL), 0);
  assert_ok(dynamo_frame_destroy(f));
}

/* x += 1 in place, then a branch on the new contents: the write happens once, before the exit. */
static const char *kInplace =
    "trace @inplace {\n"
    "  %0 = input f32[4]\n"
    "  %1 = add(%0, 1.0) : f32[4]\n"
    "  %2 = copy_(%0, %1) : f32[4]\n"
    "  %3 = sum(%2, [], false) : f32[]\n"
    "  %4 = gt(%3, 100.0) : bool[]\n"
    "  %5 = extern dynamo::guard(%4, true, 0, %2) : bool[]\n"
    "  %6 = mul(%2, 3.0) : f32[4]\n"
    "  return %6\n"
    "}\n";

static void test_inplace_write_before_exit_happens_once(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  dynamo_entry *e = NULL;
  assert_ok(compile_status(kInplace, &f, &e));
  float x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0};
  static const int64_t s4[1] = {4};
  test_tensor tx, ty;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&ty, y, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg a = arg_tensor(&tx);
  assert_int_equal(dynamo_entry_run(e, &a, 1, &ty.dl, 1), DYNAMO_EXIT);
  for (int i = 0; i < 4; ++i) assert_true(x[i] == (float)(i + 2)); /* written exactly once */
  int32_t id = -1;
  size_t n = 0;
  DLManagedTensor *v = NULL;
  assert_ok(dynamo_take_exit(&id, &v, 1, &n));
  for (int i = 0; i < 4; ++i) assert_true(((const float *)v->dl_tensor.data)[i] == x[i]);
  v->deleter(v);

  for (int i = 0; i < 4; ++i) x[i] = 100.0f;
  assert_ok(dynamo_entry_run(e, &a, 1, &ty.dl, 1));
  for (int i = 0; i < 4; ++i) {
    assert_true(x[i] == 101.0f);
    assert_true(y[i] == 303.0f);
  }
  assert_ok(dynamo_frame_destroy(f));
}

static void test_reading_replaced_contents_after_exit_is_refused(void **state) {
  (void)state;
  /* A value computed from the old contents and read after the exit is stored before the write
   * (it is read past an extern): 2 * old + new. */
  const char *kept =
      "trace @old {\n"
      "  %0 = input f32[4]\n"
      "  %1 = mul(%0, 2.0) : f32[4]\n"
      "  %2 = add(%0, 1.0) : f32[4]\n"
      "  %3 = copy_(%0, %2) : f32[4]\n"
      "  %4 = sum(%3, [], false) : f32[]\n"
      "  %5 = gt(%4, 0.0) : bool[]\n"
      "  %6 = extern dynamo::guard(%5, true, 0) : bool[]\n"
      "  %7 = add(%1, %3) : f32[4]\n"
      "  return %7\n"
      "}\n";
  dynamo_frame *f = NULL;
  dynamo_entry *e = NULL;
  assert_ok(compile_status(kept, &f, &e));
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  static const int64_t s4[1] = {4};
  test_tensor tx, ty;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&ty, y, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg a = arg_tensor(&tx);
  assert_ok(dynamo_entry_run(e, &a, 1, &ty.dl, 1));
  for (int i = 0; i < 4; ++i) {
    assert_true(x[i] == (float)(i + 2));
    assert_true(y[i] == 2.0f * (float)(i + 1) + (float)(i + 2));
  }
  assert_ok(dynamo_frame_destroy(f));
  /* A view of the input read after the write and the exit would read the new contents: refused. */
  const char *view =
      "trace @old_view {\n"
      "  %0 = input f32[4]\n"
      "  %1 = slice(%0, 0, 0, 2, 1) : f32[2]\n"
      "  %2 = add(%0, 1.0) : f32[4]\n"
      "  %3 = copy_(%0, %2) : f32[4]\n"
      "  %4 = sum(%3, [], false) : f32[]\n"
      "  %5 = gt(%4, 0.0) : bool[]\n"
      "  %6 = extern dynamo::guard(%5, true, 0) : bool[]\n"
      "  %7 = mul(%1, 3.0) : f32[2]\n"
      "  return %7\n"
      "}\n";
  f = NULL;
  e = NULL;
  assert_fails(compile_status(view, &f, &e), DYNAMO_ERR_UNSUPPORTED, "old contents of input 0");
  if (f) dynamo_frame_destroy(f);
}

static void test_malformed_guards_are_rejected(void **state) {
  (void)state;
  static const struct {
    const char *body, *needle;
  } cases[] = {
      {"  %2 = extern dynamo::guard(%1, true, 0) : bool[]\n", "one-element bool tensor"},
      {"  %c = gt(%1, 0.0) : bool[]\n  %2 = extern dynamo::guard(%c, 1, 0) : bool[]\n", "true or false"},
      {"  %c = gt(%1, 0.0) : bool[]\n  %2 = extern dynamo::guard(%c, true, 1) : bool[]\n", "exit id must be"},
      {"  %c = gt(%1, 0.0) : bool[]\n  %2 = extern dynamo::guard(%c, true, 0, 3) : bool[]\n", "must be tensors"},
      {"  %c = gt(%1, 0.0) : bool[]\n  %2 = extern dynamo::guard(%c, true, 0) : bool[]\n"
       "  %3 = extern dynamo::guard(%c, false, 0) : bool[]\n", "used twice"},
      {"  %c = gt(%1, 0.0) : bool[]\n  %2 = extern dynamo::guard(%c) : bool[]\n", "expects (%cond"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    char text[1024];
    snprintf(text, sizeof text,
             "trace @bad {\n  %%0 = input f32[4]\n  %%1 = sum(%%0, [], false) : f32[]\n%s  return %%1\n}\n",
             cases[k].body);
    dynamo_frame *f = NULL;
    dynamo_entry *e = NULL;
    assert_fails(compile_status(text, &f, &e), DYNAMO_ERR_VERIFY, cases[k].needle);
    if (f) dynamo_frame_destroy(f);
  }
}

/* The other branch as a side trace: the parent's input, then the exit's live values (sum, x). */
static const char *kSide =
    "trace @side {\n"
    "  %0 = input f32[8]\n"
    "  %1 = input f32[]\n"
    "  %2 = input f32[8]\n"
    "  %3 = sub(%2, %1) : f32[8]\n"
    "  return %3\n"
    "}\n";

static void test_linked_side_trace_finishes_the_call_natively(void **state) {
  (void)state;
  dynamo_frame *f = NULL, *other = NULL;
  dynamo_entry *parent = NULL, *side = NULL, *foreign = NULL, *wrong = NULL;
  assert_ok(compile_status(kBranch, &f, &parent));
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_parse(kSide, strlen(kSide), &t));
  assert_ok(dynamo_compile_frame(f, t, &side));
  dynamo_trace_destroy(t);
  assert_ok(compile_status(kSide, &other, &foreign));
  const char *wrong_text = "trace @w {\n  %0 = input f32[8]\n  %1 = input f32[]\n  return %1\n}\n";
  assert_ok(dynamo_trace_parse(wrong_text, strlen(wrong_text), &t));
  assert_ok(dynamo_compile_frame(f, t, &wrong));
  dynamo_trace_destroy(t);

  assert_fails(dynamo_entry_link_exit(NULL, 0, side), DYNAMO_ERR_INVALID_ARGUMENT, "parent is NULL");
  assert_fails(dynamo_entry_link_exit(parent, 0, NULL), DYNAMO_ERR_INVALID_ARGUMENT, "side is NULL");
  assert_fails(dynamo_entry_link_exit(parent, 1, side), DYNAMO_ERR_INVALID_ARGUMENT, "exit 1 does not exist");
  assert_fails(dynamo_entry_link_exit(parent, 0, parent), DYNAMO_ERR_ARGUMENT_MISMATCH, "its own side trace");
  assert_fails(dynamo_entry_link_exit(parent, 0, foreign), DYNAMO_ERR_ARGUMENT_MISMATCH, "same frame");
  assert_fails(dynamo_entry_link_exit(parent, 0, wrong), DYNAMO_ERR_ARGUMENT_MISMATCH, "takes 2 input(s)");

  float x[8], y[8];
  static const int64_t s8[1] = {8};
  test_tensor tx, ty;
  tt_init(&tx, x, kDLFloat, 32, 1, s8, NULL);
  tt_init(&ty, y, kDLFloat, 32, 1, s8, NULL);
  dynamo_arg a = arg_tensor(&tx);
  for (int i = 0; i < 8; ++i) x[i] = -(float)(i + 1);
  assert_int_equal(dynamo_entry_run(parent, &a, 1, &ty.dl, 1), DYNAMO_EXIT);
  assert_ptr_equal(dynamo_exit_entry(), parent);

  assert_ok(dynamo_entry_link_exit(parent, 0, side));
  assert_ok(dynamo_entry_run(parent, &a, 1, &ty.dl, 1)); /* native -> native */
  for (int i = 0; i < 8; ++i) assert_true(y[i] == x[i] + 36.0f);
  assert_null(dynamo_exit_entry());
  assert_int_equal(dynamo_entry_exit_count(parent, 0), 2); /* counted natively either way */
  for (int i = 0; i < 8; ++i) x[i] = 1.0f;
  assert_ok(dynamo_entry_run(parent, &a, 1, &ty.dl, 1)); /* the recorded branch is unaffected */
  for (int i = 0; i < 8; ++i) assert_true(y[i] == 2.0f);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_frame_destroy(other));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_guard_passes_or_exits_with_live_values),
      cmocka_unit_test(test_the_earlier_spelling_is_the_guard_op),
      cmocka_unit_test(test_inplace_write_before_exit_happens_once),
      cmocka_unit_test(test_reading_replaced_contents_after_exit_is_refused),
      cmocka_unit_test(test_malformed_guards_are_rejected),
      cmocka_unit_test(test_linked_side_trace_finishes_the_call_natively),
  };
  return cmocka_run_group_tests_name("exits", tests, group_setup, group_teardown);
}
