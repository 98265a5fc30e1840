/* test_guards.c -- entry guards: for each guard kind a passing and a failing case, with the reason
 * checked through dynamo_entry_check_guards, dynamo_check_guards (its `why` buffer) and
 * dynamo_last_error; a frame with two entries picks the right one and explains a miss of both;
 * `why` is truncated safely. Public header only. */
#include "helpers.h"



/* Both ways of checking accept args; dynamo_check_guards returns the frame's only entry. */
static void expect_pass(dynamo_frame *f, dynamo_entry *e, const dynamo_arg *args, size_t n) {
  char why[256];
  dynamo_entry *found = NULL;
  assert_ok(dynamo_entry_check_guards(e, args, n, why, sizeof why));
  assert_ok(dynamo_check_guards(f, args, n, &found, why, sizeof why));
  assert_ptr_equal(found, e);
}

/* Both ways of checking reject args with exactly `reason` (the first failing guard); the last
 * error says the same after "guard miss: ", and dynamo_frame_run refuses to run. */
static void expect_miss(dynamo_frame *f, dynamo_entry *e, const dynamo_arg *args, size_t n, const char *reason) {
  char why[256], want[300];
  dynamo_entry *found = (dynamo_entry *)0x1;

  memset(why, 'x', sizeof why);
  assert_status_msg(dynamo_entry_check_guards(e, args, n, why, sizeof why), DYNAMO_ERR_GUARD_MISS, reason);
  assert_string_equal(why, reason);
  snprintf(want, sizeof want, "guard miss: %s", reason);
  assert_string_equal(dynamo_last_error(), want);

  memset(why, 'x', sizeof why);
  assert_status_msg(dynamo_check_guards(f, args, n, &found, why, sizeof why), DYNAMO_ERR_GUARD_MISS, reason);
  assert_null(found);
  snprintf(want, sizeof want, "entry 0: %s", reason);
  assert_string_equal(why, want);
  snprintf(want, sizeof want, "guard miss: entry 0: %s", reason);
  assert_string_equal(dynamo_last_error(), want);

  assert_status_msg(dynamo_frame_run(f, args, n, NULL, 0), DYNAMO_ERR_GUARD_MISS, reason);
  assert_status_msg(dynamo_entry_run(e, args, n, NULL, 0), DYNAMO_ERR_GUARD_MISS, reason);
}

/* The text between "expected " and ", got " and the text after ", got " in a value-mismatch
 * reason, so a test can check that the two values are told apart. */
static void split_expected_got(const char *why, char *expected, char *got, size_t len) {
  const char *e = strstr(why, "expected ");
  const char *g = strstr(why, ", got ");
  assert_non_null(e);
  assert_non_null(g);
  e += strlen("expected ");
  assert_true(g >= e);
  size_t ne = (size_t)(g - e);
  assert_true(ne < len);
  memcpy(expected, e, ne);
  expected[ne] = 0;
  g += strlen(", got ");
  assert_true(strlen(g) < len);
  strcpy(got, g);
}

static const char *kMat =
    "trace @mat {\n"
    "  %0 = input f32[4,8]\n"
    "  %1 = mul(%0, 2.0) : f32[4,8]\n"
    "  return %1\n"
    "}\n";

/* -- Tensor guards ----------------------------------------------------------------------------- */

static void test_guard_tensor_dtype(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, kMat, &e);
  float buf[32] = {0};
  double dbuf[32] = {0};
  int64_t shape[2] = {4, 8};
  test_tensor t;

  tt_init(&t, buf, kDLFloat, 32, 2, shape, NULL);
  dynamo_arg a = arg_tensor(&t);
  expect_pass(f, e, &a, 1);

  tt_init(&t, dbuf, kDLFloat, 64, 2, shape, NULL);
  expect_miss(f, e, &a, 1, "input 0: dtype mismatch: expected float32, got float64");
  tt_init(&t, buf, kDLInt, 32, 2, shape, NULL);
  expect_miss(f, e, &a, 1, "input 0: dtype mismatch: expected float32, got int32");
  tt_init(&t, buf, kDLUInt, 32, 2, shape, NULL);
  expect_miss(f, e, &a, 1, "input 0: dtype mismatch: expected float32, got uint32");
  tt_init(&t, buf, DYNAMO_DL_BOOL, 8, 2, shape, NULL);
  expect_miss(f, e, &a, 1, "input 0: dtype mismatch: expected float32, got bool");
  /* Vector lanes are not a plain f32 tensor. */
  tt_init(&t, buf, kDLFloat, 32, 2, shape, NULL);
  t.dl.dtype.lanes = 2;
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, NULL, 0), DYNAMO_ERR_GUARD_MISS);
  assert_non_null(strstr(dynamo_last_error(), "input 0: dtype mismatch"));

  /* A bool tensor trace accepts DYNAMO_DL_BOOL bytes and rejects uint8. */
  const char *btext =
      "trace @b {\n"
      "  %0 = input bool[4]\n"
      "  %1 = logical_not(%0) : bool[4]\n"
      "  return %1\n"
      "}\n";
  dynamo_entry *be = NULL;
  dynamo_frame *bf = compile_text(g_engine, btext, &be);
  uint8_t bits[4] = {0, 1, 1, 0}, bout[4] = {9, 9, 9, 9};
  int64_t s4[1] = {4};
  test_tensor tb, to;
  tt_init(&tb, bits, DYNAMO_DL_BOOL, 8, 1, s4, NULL);
  tt_init(&to, bout, DYNAMO_DL_BOOL, 8, 1, s4, NULL);
  dynamo_arg ba = arg_tensor(&tb);
  expect_pass(bf, be, &ba, 1);
  assert_ok(dynamo_frame_run(bf, &ba, 1, &to.dl, 1));
  assert_true(bout[0] == 1 && bout[1] == 0 && bout[2] == 0 && bout[3] == 1);
  tt_init(&tb, bits, kDLUInt, 8, 1, s4, NULL);
  expect_miss(bf, be, &ba, 1, "input 0: dtype mismatch: expected bool, got uint8");

  assert_ok(dynamo_frame_destroy(bf));
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_device(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, kMat, &e);
  float buf[32] = {0};
  int64_t shape[2] = {4, 8};
  test_tensor t;
  tt_init(&t, buf, kDLFloat, 32, 2, shape, NULL);
  dynamo_arg a = arg_tensor(&t);
  expect_pass(f, e, &a, 1);

  t.dl.device.device_type = kDLCUDA;
  expect_miss(f, e, &a, 1, "input 0: device mismatch: expected cpu:0, got device type 2:0");
  t.dl.device.device_id = 1;
  expect_miss(f, e, &a, 1, "input 0: device mismatch: expected cpu:0, got device type 2:1");
  t.dl.device.device_type = kDLCUDAHost;
  t.dl.device.device_id = 0;
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, NULL, 0), DYNAMO_ERR_GUARD_MISS);
  assert_non_null(strstr(dynamo_last_error(), "input 0: device mismatch: expected cpu:0"));
  t.dl.device.device_type = kDLCPU;
  expect_pass(f, e, &a, 1);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_rank(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, kMat, &e);
  float buf[32] = {0};
  int64_t s2[2] = {4, 8}, s1[1] = {32}, s3[3] = {4, 8, 1};
  test_tensor t;
  dynamo_arg a = arg_tensor(&t);

  tt_init(&t, buf, kDLFloat, 32, 2, s2, NULL);
  expect_pass(f, e, &a, 1);
  tt_init(&t, buf, kDLFloat, 32, 1, s1, NULL);
  expect_miss(f, e, &a, 1, "input 0: rank mismatch: expected 2, got 1");
  tt_init(&t, buf, kDLFloat, 32, 3, s3, NULL);
  expect_miss(f, e, &a, 1, "input 0: rank mismatch: expected 2, got 3");
  tt_init(&t, buf, kDLFloat, 32, 0, NULL, NULL);
  expect_miss(f, e, &a, 1, "input 0: rank mismatch: expected 2, got 0");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_size(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, kMat, &e);
  float buf[40] = {0};
  int64_t good[2] = {4, 8}, wide[2] = {4, 9}, tall[2] = {5, 8}, empty[2] = {0, 8};
  test_tensor t;
  dynamo_arg a = arg_tensor(&t);

  tt_init(&t, buf, kDLFloat, 32, 2, good, NULL);
  expect_pass(f, e, &a, 1);
  tt_init(&t, buf, kDLFloat, 32, 2, wide, NULL);
  expect_miss(f, e, &a, 1, "input 0: size mismatch at dim 1: expected 8, got 9");
  tt_init(&t, buf, kDLFloat, 32, 2, tall, NULL);
  expect_miss(f, e, &a, 1, "input 0: size mismatch at dim 0: expected 4, got 5");
  tt_init(&t, buf, kDLFloat, 32, 2, empty, NULL);
  expect_miss(f, e, &a, 1, "input 0: size mismatch at dim 0: expected 4, got 0");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_strides(void **state) {
  (void)state;
  /* The trace was recorded on a column-major (transposed) f32[4,8]. */
  const char *src =
      "trace @colmajor {\n"
      "  %0 = input f32[4,8]{1,4}\n"
      "  %1 = mul(%0, 2.0) : f32[4,8]\n"
      "  return %1\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float buf[32], out[32];
  for (int k = 0; k < 32; ++k) buf[k] = (float)k;
  int64_t shape[2] = {4, 8}, colmajor[2] = {1, 4}, rowmajor[2] = {8, 1}, padded[2] = {1, 5};
  test_tensor t, to;
  dynamo_arg a = arg_tensor(&t);
  tt_init(&to, out, kDLFloat, 32, 2, shape, NULL);

  tt_init(&t, buf, kDLFloat, 32, 2, shape, colmajor);
  expect_pass(f, e, &a, 1);
  /* The strided input is read correctly: out[i][j] = 2 * buf[i + 4 j]. */
  memset(out, 0, sizeof out);
  assert_ok(dynamo_frame_run(f, &a, 1, &to.dl, 1));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) assert_true(out[i * 8 + j] == 2.0f * buf[i + 4 * j]);

  /* A contiguous buffer, with strides given or left NULL, is rejected. */
  tt_init(&t, buf, kDLFloat, 32, 2, shape, rowmajor);
  expect_miss(f, e, &a, 1, "input 0: stride mismatch at dim 1: expected 4, got 1");
  tt_init(&t, buf, kDLFloat, 32, 2, shape, NULL);
  expect_miss(f, e, &a, 1, "input 0: stride mismatch at dim 1: expected 4, got 1");
  float big[40] = {0};
  tt_init(&t, big, kDLFloat, 32, 2, shape, padded);
  expect_miss(f, e, &a, 1, "input 0: stride mismatch at dim 1: expected 4, got 5");
  assert_ok(dynamo_frame_destroy(f));

  /* The other way round: a contiguous trace rejects the column-major buffer. */
  f = compile_text(g_engine, kMat, &e);
  tt_init(&t, buf, kDLFloat, 32, 2, shape, rowmajor);
  expect_pass(f, e, &a, 1);
  tt_init(&t, buf, kDLFloat, 32, 2, shape, colmajor);
  expect_miss(f, e, &a, 1, "input 0: stride mismatch at dim 1: expected 1, got 4");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_size_one_strides_ignored(void **state) {
  (void)state;
  const char *src =
      "trace @ones {\n"
      "  %0 = input f32[4,1]\n"
      "  %1 = input f32[1,8]\n"
      "  %2 = add(%0, %1) : f32[4,8]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float col[4] = {0, 10, 20, 30}, row[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[32];
  int64_t s41[2] = {4, 1}, s18[2] = {1, 8}, s48[2] = {4, 8};
  int64_t odd41[2] = {1, 77}, odd18[2] = {12345, 1}, bad41[2] = {2, 1};
  test_tensor tc, tr, to;
  dynamo_arg args[2] = {arg_tensor(&tc), arg_tensor(&tr)};
  tt_init(&to, out, kDLFloat, 32, 2, s48, NULL);

  tt_init(&tc, col, kDLFloat, 32, 2, s41, NULL);
  tt_init(&tr, row, kDLFloat, 32, 2, s18, NULL);
  expect_pass(f, e, args, 2);
  /* Any stride on a size-1 dim is accepted, and the result is the same. */
  tt_init(&tc, col, kDLFloat, 32, 2, s41, odd41);
  tt_init(&tr, row, kDLFloat, 32, 2, s18, odd18);
  expect_pass(f, e, args, 2);
  memset(out, 0, sizeof out);
  assert_ok(dynamo_frame_run(f, args, 2, &to.dl, 1));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) assert_true(out[i * 8 + j] == col[i] + row[j]);
  /* The stride of a dim of size > 1 still counts. */
  float colbig[8] = {0};
  tt_init(&tc, colbig, kDLFloat, 32, 2, s41, bad41);
  expect_miss(f, e, args, 2, "input 0: stride mismatch at dim 0: expected 1, got 2");
  assert_ok(dynamo_frame_destroy(f));

  /* Strides of an empty tensor do not matter either. */
  const char *etext =
      "trace @empty {\n"
      "  %0 = input f32[0,3]\n"
      "  %1 = neg(%0) : f32[0,3]\n"
      "  return %1\n"
      "}\n";
  f = compile_text(g_engine, etext, &e);
  float dummy[1] = {0};
  int64_t s03[2] = {0, 3}, weird[2] = {7, 9};
  tt_init(&tc, dummy, kDLFloat, 32, 2, s03, weird);
  expect_pass(f, e, args, 1);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_tensor_requires_grad(void **state) {
  (void)state;
  const char *src =
      "trace @grad {\n"
      "  %0 = input f32[4] requires_grad\n"
      "  %1 = input f32[4]\n"
      "  %2 = mul(%0, %1) : f32[4]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float x[4] = {1, 2, 3, 4}, y[4] = {2, 2, 2, 2}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, ty, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&ty, y, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&tx), arg_tensor(&ty)};

  args[0].flags = DYNAMO_ARG_FLAG_REQUIRES_GRAD;
  expect_pass(f, e, args, 2);
  assert_ok(dynamo_frame_run(f, args, 2, &to.dl, 1));
  assert_true(out[0] == 2.0f && out[1] == 4.0f && out[2] == 6.0f && out[3] == 8.0f);

  args[0].flags = 0;
  expect_miss(f, e, args, 2, "input 0: requires_grad mismatch: expected true, got false");
  args[0].flags = DYNAMO_ARG_FLAG_REQUIRES_GRAD;
  args[1].flags = DYNAMO_ARG_FLAG_REQUIRES_GRAD;
  expect_miss(f, e, args, 2, "input 1: requires_grad mismatch: expected false, got true");
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Scalar guards ----------------------------------------------------------------------------- */

static void test_guard_scalar_kind(void **state) {
  (void)state;
  const char *src =
      "trace @kinds {\n"
      "  %0 = input f32[4]\n"
      "  %1 = input i64\n"
      "  %2 = input f64\n"
      "  %3 = input bool\n"
      "  %4 = mul(%0, %1) : f32[4]\n"
      "  %5 = add(%4, %2) : f32[4]\n"
      "  return %5\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float x[4] = {1, 2, 3, 4}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[4] = {arg_tensor(&tx), arg_int(3), arg_float(0.5), arg_bool(0)};

  expect_pass(f, e, args, 4);
  /* Unguarded scalars take any value, and the value is used at run time. */
  assert_ok(dynamo_frame_run(f, args, 4, &to.dl, 1));
  assert_true(out[0] == 3.5f && out[1] == 6.5f && out[2] == 9.5f && out[3] == 12.5f);
  args[1] = arg_int(-2);
  args[2] = arg_float(0.25);
  args[3] = arg_bool(1);
  expect_pass(f, e, args, 4);
  assert_ok(dynamo_frame_run(f, args, 4, &to.dl, 1));
  assert_true(out[0] == -1.75f && out[1] == -3.75f && out[2] == -5.75f && out[3] == -7.75f);

  args[1] = arg_float(3.0);
  expect_miss(f, e, args, 4, "input 1: kind mismatch: expected int, got float");
  args[1] = arg_bool(1);
  expect_miss(f, e, args, 4, "input 1: kind mismatch: expected int, got bool");
  args[1] = arg_tensor(&tx);
  expect_miss(f, e, args, 4, "input 1: kind mismatch: expected int, got tensor");
  args[1] = arg_int(3);
  args[2] = arg_int(1);
  expect_miss(f, e, args, 4, "input 2: kind mismatch: expected float, got int");
  args[2] = arg_float(0.5);
  args[3] = arg_int(1);
  expect_miss(f, e, args, 4, "input 3: kind mismatch: expected bool, got int");
  args[3] = arg_bool(0);
  args[0] = arg_float(1.0);
  expect_miss(f, e, args, 4, "input 0: kind mismatch: expected tensor, got float");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_scalar_int_value(void **state) {
  (void)state;
  const char *src =
      "trace @ival {\n"
      "  %0 = input f32[4]\n"
      "  %1 = input i64 == 7\n"
      "  %2 = mul(%0, %1) : f32[4]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float x[4] = {1, 2, 3, 4}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[2] = {arg_tensor(&tx), arg_int(7)};

  expect_pass(f, e, args, 2);
  assert_ok(dynamo_frame_run(f, args, 2, &to.dl, 1));
  assert_true(out[0] == 7.0f && out[1] == 14.0f && out[2] == 21.0f && out[3] == 28.0f);
  args[1] = arg_int(8);
  expect_miss(f, e, args, 2, "input 1: value mismatch: expected 7, got 8");
  args[1] = arg_int(-7);
  expect_miss(f, e, args, 2, "input 1: value mismatch: expected 7, got -7");
  args[1] = arg_int(INT64_MIN);
  expect_miss(f, e, args, 2, "input 1: value mismatch: expected 7, got -9223372036854775808");
  /* A float 7.0 is still the wrong kind. */
  args[1] = arg_float(7.0);
  expect_miss(f, e, args, 2, "input 1: kind mismatch: expected int, got float");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_scalar_float_value(void **state) {
  (void)state;
  const char *src =
      "trace @fval {\n"
      "  %0 = input f64[2]\n"
      "  %1 = input f64 == 2.5\n"
      "  %2 = input f64 == nan\n"
      "  %3 = mul(%0, %1) : f64[2]\n"
      "  return %3\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  double x[2] = {1, -2}, out[2] = {0};
  int64_t s2[1] = {2};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 64, 1, s2, NULL);
  tt_init(&to, out, kDLFloat, 64, 1, s2, NULL);
  double nan = strtod("nan", NULL);
  dynamo_arg args[3] = {arg_tensor(&tx), arg_float(2.5), arg_float(nan)};
  char why[256];

  /* 2.5 passes; a NaN guard accepts NaN. */
  expect_pass(f, e, args, 3);
  assert_ok(dynamo_frame_run(f, args, 3, &to.dl, 1));
  assert_true(out[0] == 2.5 && out[1] == -5.0);

  args[1] = arg_float(3.0);
  assert_status_msg(dynamo_entry_check_guards(e, args, 3, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                    "input 1: value mismatch: expected 2.5");
  assert_non_null(strstr(why, "input 1: value mismatch: expected 2.5"));
  assert_non_null(strstr(why, ", got 3"));
  assert_status_msg(dynamo_frame_run(f, args, 3, &to.dl, 1), DYNAMO_ERR_GUARD_MISS, "input 1: value mismatch");
  args[1] = arg_float(2.5);
  args[2] = arg_float(1.0);
  assert_status_msg(dynamo_entry_check_guards(e, args, 3, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                    "input 2: value mismatch: expected nan, got 1");
  args[2] = arg_float(nan);
  args[1] = arg_int(2);
  expect_miss(f, e, args, 3, "input 1: kind mismatch: expected float, got int");
  assert_ok(dynamo_frame_destroy(f));

  /* A float guard written as an integer literal compares as a float. */
  const char *itext =
      "trace @fint {\n"
      "  %0 = input f64[2]\n"
      "  %1 = input f64 == 2\n"
      "  %2 = mul(%0, %1) : f64[2]\n"
      "  return %2\n"
      "}\n";
  f = compile_text(g_engine, itext, &e);
  dynamo_arg iargs[2] = {arg_tensor(&tx), arg_float(2.0)};
  expect_pass(f, e, iargs, 2);
  assert_ok(dynamo_frame_destroy(f));

  /* The reason tells the expected and the actual value apart, however close they are. */
  const char *ptext =
      "trace @fprec {\n"
      "  %0 = input f64[2]\n"
      "  %1 = input f64 == 1e-10\n"
      "  %2 = input f64 == 0.1\n"
      "  %3 = mul(%0, %1) : f64[2]\n"
      "  %4 = mul(%3, %2) : f64[2]\n"
      "  return %4\n"
      "}\n";
  f = compile_text(g_engine, ptext, &e);
  char expected[128], got[128];
  dynamo_arg pargs[3] = {arg_tensor(&tx), arg_float(2e-10), arg_float(0.1)};
  assert_status_msg(dynamo_entry_check_guards(e, pargs, 3, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                    "input 1: value mismatch");
  split_expected_got(why, expected, got, sizeof expected);
  if (strcmp(expected, got) == 0) {
    print_error("reason \"%s\" shows the same value for 1e-10 and 2e-10\n", why);
    fail();
  }
  double near = 0.1;
  near += near * 1e-15; /* a different double that prints as 0.1 with 6 digits */
  assert_true(near != 0.1);
  pargs[1] = arg_float(1e-10);
  pargs[2] = arg_float(near);
  assert_status_msg(dynamo_entry_check_guards(e, pargs, 3, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                    "input 2: value mismatch");
  split_expected_got(why, expected, got, sizeof expected);
  if (strcmp(expected, got) == 0) {
    print_error("reason \"%s\" shows the same value for 0.1 and %.17g\n", why, near);
    fail();
  }
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_scalar_bool_value(void **state) {
  (void)state;
  const char *src =
      "trace @bval {\n"
      "  %0 = input f32[4]\n"
      "  %1 = input bool == true\n"
      "  %2 = input bool == false\n"
      "  %3 = neg(%0) : f32[4]\n"
      "  return %3\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float x[4] = {1, -2, 3, -4}, out[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[3] = {arg_tensor(&tx), arg_bool(1), arg_bool(0)};

  expect_pass(f, e, args, 3);
  assert_ok(dynamo_frame_run(f, args, 3, &to.dl, 1));
  assert_true(out[0] == -1.0f && out[1] == 2.0f && out[2] == -3.0f && out[3] == 4.0f);
  args[1] = arg_bool(0);
  expect_miss(f, e, args, 3, "input 1: value mismatch: expected true, got false");
  args[1] = arg_bool(1);
  args[2] = arg_bool(1);
  expect_miss(f, e, args, 3, "input 2: value mismatch: expected false, got true");
  args[2] = arg_bool(0);
  args[1] = arg_int(1);
  expect_miss(f, e, args, 3, "input 1: kind mismatch: expected bool, got int");
  assert_ok(dynamo_frame_destroy(f));
}

static void test_guard_input_count(void **state) {
  (void)state;
  const char *src =
      "trace @two {\n"
      "  %0 = input f32[4]\n"
      "  %1 = input f32[4]\n"
      "  %2 = sub(%0, %1) : f32[4]\n"
      "  return %2\n"
      "}\n";
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, src, &e);
  float x[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg args[3] = {arg_tensor(&tx), arg_tensor(&tx), arg_tensor(&tx)};

  expect_pass(f, e, args, 2);
  expect_miss(f, e, args, 1, "input count mismatch: expected 2, got 1");
  expect_miss(f, e, args, 3, "input count mismatch: expected 2, got 3");
  expect_miss(f, e, NULL, 0, "input count mismatch: expected 2, got 0");
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Frames with several entries ---------------------------------------------------------------- */

static const char *kAffine4 =
    "trace @affine {\n"
    "  %0 = input f32[4]\n"
    "  %1 = mul(%0, 2.0) : f32[4]\n"
    "  %2 = add(%1, 1.0) : f32[4]\n"
    "  return %2\n"
    "}\n";
static const char *kAffine5 =
    "trace @affine {\n"
    "  %0 = input f32[5]\n"
    "  %1 = mul(%0, 2.0) : f32[5]\n"
    "  %2 = add(%1, 1.0) : f32[5]\n"
    "  return %2\n"
    "}\n";

static dynamo_entry *compile_into(dynamo_frame *f, const char *text) {
  dynamo_trace *t = NULL;
  dynamo_entry *e = NULL;
  assert_ok(dynamo_trace_parse(text, (size_t)-1, &t));
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  assert_non_null(e);
  return e;
}

static void test_check_guards_two_entries(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(g_engine, "two", &f));
  dynamo_entry *e4 = compile_into(f, kAffine4);
  dynamo_entry *e5 = compile_into(f, kAffine5);
  assert_ptr_not_equal(e4, e5);
  assert_int_equal(dynamo_frame_num_entries(f), 2);

  float x[6] = {0, 1, 2, 3, 4, 5}, out[6];
  int64_t s4[1] = {4}, s5[1] = {5}, s6[1] = {6};
  test_tensor t, to;
  dynamo_arg a = arg_tensor(&t);
  dynamo_entry *found = NULL;
  char why[256];

  /* Each shape finds its own entry, and runs it with the right numbers. */
  tt_init(&t, x, kDLFloat, 32, 1, s4, NULL);
  assert_ok(dynamo_check_guards(f, &a, 1, &found, why, sizeof why));
  assert_ptr_equal(found, e4);
  assert_ok(dynamo_entry_check_guards(e4, &a, 1, why, sizeof why));
  assert_status_msg(dynamo_entry_check_guards(e5, &a, 1, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
                    "input 0: size mismatch at dim 0: expected 5, got 4");
  memset(out, 0, sizeof out);
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  assert_ok(dynamo_frame_run(f, &a, 1, &to.dl, 1));
  for (int i = 0; i < 4; ++i) assert_true(out[i] == 2.0f * x[i] + 1.0f);
  assert_true(out[4] == 0.0f && out[5] == 0.0f);

  tt_init(&t, x, kDLFloat, 32, 1, s5, NULL);
  assert_ok(dynamo_check_guards(f, &a, 1, &found, why, sizeof why));
  assert_ptr_equal(found, e5);
  memset(out, 0, sizeof out);
  tt_init(&to, out, kDLFloat, 32, 1, s5, NULL);
  assert_ok(dynamo_frame_run(f, &a, 1, &to.dl, 1));
  for (int i = 0; i < 5; ++i) assert_true(out[i] == 2.0f * x[i] + 1.0f);
  assert_true(out[5] == 0.0f);
  /* The f32[4] entry's output does not fit the f32[5] run. */
  tt_init(&to, out, kDLFloat, 32, 1, s4, NULL);
  assert_status_msg(dynamo_frame_run(f, &a, 1, &to.dl, 1), DYNAMO_ERR_ARGUMENT_MISMATCH,
                    "output 0: size mismatch at dim 0: expected 5, got 4");

  /* A miss explains every entry. */
  tt_init(&t, x, kDLFloat, 32, 1, s6, NULL);
  found = (dynamo_entry *)0x1;
  assert_status_msg(dynamo_check_guards(f, &a, 1, &found, why, sizeof why), DYNAMO_ERR_GUARD_MISS, "entry 1");
  assert_null(found);
  assert_string_equal(why,
                      "entry 0: input 0: size mismatch at dim 0: expected 4, got 6; "
                      "entry 1: input 0: size mismatch at dim 0: expected 5, got 6");
  assert_string_equal(dynamo_last_error(),
                      "guard miss: entry 0: input 0: size mismatch at dim 0: expected 4, got 6; "
                      "entry 1: input 0: size mismatch at dim 0: expected 5, got 6");
  tt_init(&to, out, kDLFloat, 32, 1, s6, NULL);
  assert_status_msg(dynamo_frame_run(f, &a, 1, &to.dl, 1), DYNAMO_ERR_GUARD_MISS,
                    "entry 0: input 0: size mismatch at dim 0: expected 4, got 6; "
                    "entry 1: input 0: size mismatch at dim 0: expected 5, got 6");
  /* Each entry reports its own first failing guard. */
  double d[5] = {0};
  tt_init(&t, d, kDLFloat, 64, 1, s5, NULL);
  assert_status_msg(dynamo_check_guards(f, &a, 1, &found, why, sizeof why), DYNAMO_ERR_GUARD_MISS, "entry 1");
  assert_string_equal(why,
                      "entry 0: input 0: dtype mismatch: expected float32, got float64; "
                      "entry 1: input 0: dtype mismatch: expected float32, got float64");

  /* The first entry that accepts wins: a later duplicate of f32[4] is not picked. */
  dynamo_entry *e4b = compile_into(f, kAffine4);
  assert_int_equal(dynamo_frame_num_entries(f), 3);
  tt_init(&t, x, kDLFloat, 32, 1, s4, NULL);
  assert_ok(dynamo_check_guards(f, &a, 1, &found, why, sizeof why));
  assert_ptr_equal(found, e4);
  assert_ptr_not_equal(found, e4b);
  assert_ok(dynamo_frame_destroy(f));
}

/* -- The why buffer ---------------------------------------------------------------------------- */

static void test_check_guards_why_truncated(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, kMat, &e);
  float buf[40] = {0};
  int64_t wide[2] = {4, 9};
  test_tensor t;
  tt_init(&t, buf, kDLFloat, 32, 2, wide, NULL);
  dynamo_arg a = arg_tensor(&t);
  char why[16];
  dynamo_entry *found = NULL;

  /* 8 bytes: 7 characters and the NUL; nothing past why_len is touched. */
  memset(why, '#', sizeof why);
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, why, 8), DYNAMO_ERR_GUARD_MISS);
  assert_string_equal(why, "input 0");
  assert_int_equal(strlen(why), 7);
  for (size_t i = 8; i < sizeof why; ++i) assert_int_equal(why[i], '#');
  /* The last error keeps the whole reason. */
  assert_string_equal(dynamo_last_error(), "guard miss: input 0: size mismatch at dim 1: expected 8, got 9");

  memset(why, '#', sizeof why);
  assert_int_equal(dynamo_check_guards(f, &a, 1, &found, why, 8), DYNAMO_ERR_GUARD_MISS);
  assert_string_equal(why, "entry 0");
  for (size_t i = 8; i < sizeof why; ++i) assert_int_equal(why[i], '#');
  assert_string_equal(dynamo_last_error(),
                      "guard miss: entry 0: input 0: size mismatch at dim 1: expected 8, got 9");

  /* 1 byte: just the NUL. 0 bytes: nothing is written. */
  memset(why, '#', sizeof why);
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, why, 1), DYNAMO_ERR_GUARD_MISS);
  assert_int_equal(why[0], 0);
  assert_int_equal(why[1], '#');
  memset(why, '#', sizeof why);
  assert_int_equal(dynamo_check_guards(f, &a, 1, &found, why, 0), DYNAMO_ERR_GUARD_MISS);
  for (size_t i = 0; i < sizeof why; ++i) assert_int_equal(why[i], '#');
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, NULL, 8), DYNAMO_ERR_GUARD_MISS);

  /* A reason exactly as long as the buffer allows fits whole. */
  const char *full = "input 0: size mismatch at dim 1: expected 8, got 9";
  char exact[64];
  size_t n = strlen(full);
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, exact, n + 1), DYNAMO_ERR_GUARD_MISS);
  assert_string_equal(exact, full);
  assert_int_equal(dynamo_entry_check_guards(e, &a, 1, exact, n), DYNAMO_ERR_GUARD_MISS);
  assert_int_equal(strlen(exact), n - 1);
  assert_memory_equal(exact, full, n - 1);
  assert_ok(dynamo_frame_destroy(f));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_guard_tensor_dtype),
      cmocka_unit_test(test_guard_tensor_device),
      cmocka_unit_test(test_guard_tensor_rank),
      cmocka_unit_test(test_guard_tensor_size),
      cmocka_unit_test(test_guard_tensor_strides),
      cmocka_unit_test(test_guard_tensor_size_one_strides_ignored),
      cmocka_unit_test(test_guard_tensor_requires_grad),
      cmocka_unit_test(test_guard_scalar_kind),
      cmocka_unit_test(test_guard_scalar_int_value),
      cmocka_unit_test(test_guard_scalar_float_value),
      cmocka_unit_test(test_guard_scalar_bool_value),
      cmocka_unit_test(test_guard_input_count),
      cmocka_unit_test(test_check_guards_two_entries),
      cmocka_unit_test(test_check_guards_why_truncated),
  };
  return cmocka_run_group_tests_name("guards", tests, group_setup, group_teardown);
}
