/* test_adversarial.c -- what a second adversarial pass over the public header found (2026-12-02),
 * each as the caller would meet it: tensors whose bytes lie past the address space, traces that
 * are long in unusual ways (views returned directly, chains of in-place writes, thousands of
 * outputs), literals at the edge of int64, reductions over nothing, guard values of the wrong
 * type, ranks past DYNAMO_MAX_DIMS, malformed side exits caught when parsed, and messages that
 * name the problem. Public header only; run under `make test-asan` too. */
#include "helpers.h"

#include <math.h>
#include <stdlib.h>

#define assert_fails(call, want, needle)                                                          \
  do {                                                                                            \
    assert_status_msg((call), (want), (needle));                                                  \
    assert_true(strlen(dynamo_last_error()) > 0);                                                 \
  } while (0)

/* A growing text buffer for generated traces. */
typedef struct text_buf {
  char *s;
  size_t n, cap;
} text_buf;

static void tb_add(text_buf *b, const char *fmt, long a, long c) {
  if (b->cap - b->n < 128) {
    b->cap = b->cap ? b->cap * 2 : 1 << 16;
    b->s = realloc(b->s, b->cap);
    assert_non_null(b->s);
  }
  b->n += (size_t)snprintf(b->s + b->n, b->cap - b->n, fmt, a, c);
}

static dynamo_status parse_only(const char *text) {
  dynamo_trace *t = NULL;
  dynamo_status s = dynamo_trace_parse(text, (size_t)-1, &t);
  dynamo_trace_destroy(t);
  return s;
}

/* Runs entry e through dynamo_entry_run_alloc on one 1-D input of n elements (DLPack code/bits)
 * at data; the call must succeed. */
static void run_alloc_1d(dynamo_entry *e, void *data, uint8_t code, uint8_t bits, int64_t n, DLManagedTensor **outs,
                         size_t nouts) {
  int64_t shape[1] = {n};
  test_tensor tx;
  tt_init(&tx, data, code, bits, 1, shape, NULL);
  dynamo_arg a[1] = {arg_tensor(&tx)};
  assert_ok(dynamo_entry_run_alloc(e, a, 1, outs, nouts));
}

static void free_outputs(DLManagedTensor **outs, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (outs[k]) outs[k]->deleter(outs[k]);
}

/* -- Tensors whose bytes are not addressable -------------------------------------------- */

static void test_byte_offset_past_the_address_space(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, "trace @b {\n  %0 = input f32[4]\n  %1 = add(%0, 1.0)\n  return %1\n}\n", &e);
  float x[4] = {1, 2, 3, 4}, o[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, o, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg a[1] = {arg_tensor(&tx)};
  const uint64_t bad[] = {(uint64_t)1 << 63, UINT64_MAX, UINT64_MAX - 7};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
    tx.dl.byte_offset = bad[i];
    assert_fails(dynamo_entry_run(e, a, 1, &to.dl, 1), DYNAMO_ERR_GUARD_MISS, "past the address space");
    DLManagedTensor *out = (DLManagedTensor *)0x1;
    assert_fails(dynamo_entry_run_alloc(e, a, 1, &out, 1), DYNAMO_ERR_GUARD_MISS, "byte_offset");
    assert_null(out);
  }
  tx.dl.byte_offset = 0;
  to.dl.byte_offset = (uint64_t)1 << 63;
  assert_fails(dynamo_entry_run(e, a, 1, &to.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT, "output 0: byte_offset");
  to.dl.byte_offset = 0;
  assert_ok(dynamo_entry_run(e, a, 1, &to.dl, 1));
  for (int k = 0; k < 4; ++k) assert_true(o[k] == x[k] + 1.0f);
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Long traces of unusual shapes ----------------------------------------------------------- */

static void test_long_view_chain_returned_directly(void **state) {
  (void)state;
  enum { N = 30001 };  /* an odd count of transposes: the result is x transposed */
  text_buf b = {0};
  tb_add(&b, "trace @v {\n  %%0 = input f32[2,3]\n", 0, 0);
  for (long i = 1; i <= N; ++i) tb_add(&b, "  %%%ld = transpose(%%%ld, 0, 1)\n", i, i - 1);
  tb_add(&b, "  return %%%ld\n}\n", N, 0);
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, b.s, &e);
  free(b.s);
  float x[6] = {0, 1, 2, 3, 4, 5}, o[6] = {0};
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 2, s23, NULL);
  tt_init(&to, o, kDLFloat, 32, 2, s32, NULL);
  dynamo_arg a[1] = {arg_tensor(&tx)};
  assert_ok(dynamo_entry_run(e, a, 1, &to.dl, 1));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) assert_true(o[i * 2 + j] == x[j * 3 + i]);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_long_chain_of_writes_into_one_input(void **state) {
  (void)state;
  enum { N = 100000 };
  text_buf b = {0};
  tb_add(&b, "trace @w {\n  %%0 = input f32[4]\n  %%1 = add(%%0, 1.0)\n", 0, 0);
  for (long i = 2; i <= N; ++i) tb_add(&b, "  %%%ld = copy_(%%0, %%%ld)\n", i, i - 1);
  tb_add(&b, "  %%%ld = mul(%%%ld, 2.0)\n", N + 1, N);
  tb_add(&b, "  return %%%ld\n}\n", N + 1, 0);
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, b.s, &e);  /* was quadratic: 16,000 writes took 21 s */
  free(b.s);
  float x[4] = {1, 2, 3, 4}, o[4] = {0};
  int64_t s4[1] = {4};
  test_tensor tx, to;
  tt_init(&tx, x, kDLFloat, 32, 1, s4, NULL);
  tt_init(&to, o, kDLFloat, 32, 1, s4, NULL);
  dynamo_arg a[1] = {arg_tensor(&tx)};
  assert_ok(dynamo_entry_run(e, a, 1, &to.dl, 1));
  for (int k = 0; k < 4; ++k) {
    assert_true(x[k] == (float)(k + 2));        /* the input holds the last write: old + 1 */
    assert_true(o[k] == 2.0f * (float)(k + 2));
  }
  assert_ok(dynamo_frame_destroy(f));
}

static void test_thousands_of_outputs(void **state) {
  (void)state;
  enum { N = 5000 };
  text_buf b = {0};
  tb_add(&b, "trace @o {\n  %%0 = input f32[4]\n", 0, 0);
  for (long i = 1; i <= N; ++i) tb_add(&b, "  %%%ld = add(%%0, %ld.0)\n", i, i);
  tb_add(&b, "  return %%1", 0, 0);
  for (long i = 2; i <= N; ++i) tb_add(&b, ", %%%ld", i, 0);
  tb_add(&b, "\n}\n", 0, 0);
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, b.s, &e);  /* one loop storing 2,500 outputs took 4 s */
  free(b.s);
  assert_int_equal(dynamo_entry_num_outputs(e), N);
  float x[4] = {1, 2, 3, 4};
  DLManagedTensor **outs = calloc(N, sizeof *outs);
  run_alloc_1d(e, x, kDLFloat, 32, 4, outs, N);
  for (int k = 0; k < N; k += 997) {
    const float *v = (const float *)outs[k]->dl_tensor.data;
    assert_true(v[3] == 4.0f + (float)(k + 1));
  }
  free_outputs(outs, N);
  free(outs);
  assert_ok(dynamo_frame_destroy(f));
}

/* -- Literals and shapes at the edge of int64 ----------------------------------------------- */

static void test_slice_with_a_huge_step(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine,
                                 "trace @s {\n  %0 = input f32[8]\n  %1 = slice(%0, 0, 0, 8, 9223372036854775807)\n"
                                 "  %2 = slice(%0, 0, 5, 9223372036854775807, 9223372036854775806)\n"
                                 "  %3 = slice(%0, 0, -9223372036854775807, 8, 4)\n  %4 = add(%1, %2)\n"
                                 "  return %4, %3\n}\n",
                                 &e);
  dynamo_tensor_info info;
  assert_ok(dynamo_entry_output_info(e, 0, &info));
  assert_int_equal(info.ndim, 1);
  assert_int_equal(info.sizes[0], 1);  /* x[0::2^63-1] is x[0], as in ATen */
  assert_ok(dynamo_entry_output_info(e, 1, &info));
  assert_int_equal(info.sizes[0], 2);
  float x[8] = {10, 11, 12, 13, 14, 15, 16, 17};
  DLManagedTensor *outs[2] = {0};
  run_alloc_1d(e, x, kDLFloat, 32, 8, outs, 2);
  assert_true(((const float *)outs[0]->dl_tensor.data)[0] == 10.0f + 15.0f);
  assert_null(outs[1]);  /* a view of the input: the caller makes it from the alias */
  dynamo_output_alias al;
  assert_ok(dynamo_entry_output_alias(e, 1, &al));
  assert_true(al.input == 0 && al.ndim == 1 && al.offset == 0 && al.strides[0] == 4);  /* x[0], x[4] */
  free_outputs(outs, 2);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_int64_literals_are_exact(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine,
                                 "trace @i {\n  %0 = input i64[3]\n  %1 = add(%0, 9007199254740993)\n"
                                 "  %2 = eq(%0, 1152921504606846977)\n  %3 = mul(%0, -4611686018427387903)\n"
                                 "  return %1, %2, %3\n}\n",
                                 &e);
  int64_t x[3] = {0, 1, ((int64_t)1 << 60) + 1};
  DLManagedTensor *outs[3] = {0};
  run_alloc_1d(e, x, kDLInt, 64, 3, outs, 3);
  const int64_t *sum = outs[0]->dl_tensor.data, *prod = outs[2]->dl_tensor.data;
  const uint8_t *eq = outs[1]->dl_tensor.data;
  assert_true(sum[0] == 9007199254740993LL && sum[1] == 9007199254740994LL);
  assert_true(eq[0] == 0 && eq[1] == 0 && eq[2] == 1);  /* 2^60 + 1, not 2^60 */
  assert_true(prod[1] == -4611686018427387903LL);
  free_outputs(outs, 3);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_pow_with_the_largest_integer_exponent(void **state) {
  (void)state;
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine,
                                 "trace @p {\n  %0 = input f32[3]\n  %1 = pow(%0, 9223372036854775807)\n"
                                 "  %2 = pow(%0, -9223372036854775808)\n  return %1, %2\n}\n",
                                 &e);
  float x[3] = {2.0f, 0.5f, 1.0f};
  DLManagedTensor *outs[2] = {0};
  run_alloc_1d(e, x, kDLFloat, 32, 3, outs, 2);
  const float *up = outs[0]->dl_tensor.data, *down = outs[1]->dl_tensor.data;
  assert_true(isinf(up[0]) && up[0] > 0 && up[1] == 0.0f && up[2] == 1.0f);
  assert_true(down[0] == 0.0f && isinf(down[1]) && down[2] == 1.0f);
  free_outputs(outs, 2);
  assert_ok(dynamo_frame_destroy(f));
}

static void test_mean_of_nothing_is_nan_beside_a_variance(void **state) {
  (void)state;
  static const char *texts[] = {
      "trace @m {\n  %0 = input f32[0]\n  %1 = mean(%0, [], false)\n  %2 = var(%0, [], 0, false)\n  return %1, %2\n}\n",
      "trace @m {\n  %0 = input f32[0]\n  %2 = var(%0, [], 0, false)\n  %1 = mean(%0, [], false)\n  return %2, %1\n}\n",
  };
  for (size_t i = 0; i < 2; ++i) {
    dynamo_entry *e = NULL;
    dynamo_frame *f = compile_text(g_engine, texts[i], &e);
    float x[1] = {0};
    DLManagedTensor *outs[2] = {0};
    run_alloc_1d(e, x, kDLFloat, 32, 0, outs, 2);
    for (int k = 0; k < 2; ++k) assert_true(isnan(((const float *)outs[k]->dl_tensor.data)[0]));
    free_outputs(outs, 2);
    assert_ok(dynamo_frame_destroy(f));
  }
}

/* -- Traces refused when parsed, with the reason ------------------------------------------- */

static void test_guard_values_must_have_the_inputs_type(void **state) {
  (void)state;
  static const char *bad[] = {"input i64 == 1.5", "input i64 == nan", "input i64 == true", "input bool == 2",
                              "input bool == 0.5"};
  char text[200];
  for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
    snprintf(text, sizeof text, "trace @g {\n  %%0 = %s\n  %%1 = input f32[2]\n  %%2 = mul(%%1, 2.0)\n  return %%2\n}\n",
             bad[i]);
    assert_fails(parse_only(text), DYNAMO_ERR_VERIFY, "is not a value of the input's type");
  }
  static const char *good[] = {"input i64 == 3", "input f64 == 2", "input f64 == 2.5", "input bool == true",
                               "input bool == 1"};
  for (size_t i = 0; i < sizeof good / sizeof *good; ++i) {
    snprintf(text, sizeof text, "trace @g {\n  %%0 = %s\n  %%1 = input f32[2]\n  %%2 = mul(%%1, 2.0)\n  return %%2\n}\n",
             good[i]);
    assert_ok(parse_only(text));
  }
}

static void test_ranks_past_the_limit_are_refused_when_parsed(void **state) {
  (void)state;
  char text[400];
  snprintf(text, sizeof text, "trace @r {\n  %%0 = input f32[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]\n  %%1 = neg(%%0)\n"
                              "  return %%1\n}\n");
  assert_fails(parse_only(text), DYNAMO_ERR_VERIFY, "17 dimensions; at most 16");
  /* grown by views: refused at the first value past the limit, long before memory runs out */
  enum { N = 20000 };
  text_buf b = {0};
  tb_add(&b, "trace @u {\n  %%0 = input f32[2]\n", 0, 0);
  for (long i = 1; i <= N; ++i) tb_add(&b, "  %%%ld = unsqueeze(%%%ld, 0)\n", i, i - 1);
  tb_add(&b, "  return %%%ld\n}\n", N, 0);
  assert_fails(parse_only(b.s), DYNAMO_ERR_VERIFY, "17 dimensions");
  free(b.s);
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_create("r", &t));
  int32_t v = -1;
  int64_t ones[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  assert_fails(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 17, ones, NULL, &v), DYNAMO_ERR_INVALID_ARGUMENT,
               "ndim must be 0..16");
  assert_ok(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 16, ones, NULL, &v));
  dynamo_trace_destroy(t);
}

static void test_malformed_side_exits_are_refused_when_parsed(void **state) {
  (void)state;
  static const struct { const char *guard; const char *why; } cases[] = {
      {"%3 = extern dynamo::guard(%2, true, 0) : bool[]\n  %4 = extern dynamo::guard(%2, true, 0) : bool[]",
       "exit id 0 is used twice"},
      {"%3 = extern dynamo::guard(%2, true, 5) : bool[]", "exit id must be an integer in [0, number of guards = 1)"},
      {"%3 = extern dynamo::guard(%0, true, 0) : bool[]", "one-element bool tensor"},
      {"%3 = extern dynamo::guard(%2, 1, 0) : bool[]", "true or false"},
      {"%3 = extern dynamo::guard(%2, true, 0, 2.0) : bool[]", "live values"},
  };
  char text[400];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
    snprintf(text, sizeof text,
             "trace @x {\n  %%0 = input f32[3]\n  %%1 = sum(%%0, [], false)\n  %%2 = gt(%%1, 0.0)\n  %s\n"
             "  %%9 = neg(%%0)\n  return %%9\n}\n",
             cases[i].guard);
    assert_fails(parse_only(text), DYNAMO_ERR_VERIFY, cases[i].why);
  }
}

/* -- Messages ---------------------------------------------------------------------------------- */

static void test_messages_say_what_was_found(void **state) {
  (void)state;
  assert_fails(parse_only("trace @d {\n  %0 = input i8[2]\n  return %0\n}\n"), DYNAMO_ERR_PARSE,
               "a dtype (bool, i32, i64, f16, bf16, f32, f64)");
  /* a NUL inside the text (length given) is shown escaped, not cut into the message */
  static const char with_nul[] = "trace @n {\n  %0 = input f32[2]\n  %1 = a\0b(%0)\n  return %1\n}\n";
  dynamo_trace *t = NULL;
  assert_fails(dynamo_trace_parse(with_nul, sizeof with_nul - 1, &t), DYNAMO_ERR_PARSE, "\\x00");
  assert_null(t);
  /* ".5" is a number */
  assert_ok(dynamo_trace_parse("trace @h {\n  %0 = input f32[2]\n  %1 = mul(%0, .5)\n  return %1\n}\n", (size_t)-1, &t));
  char *printed = NULL;
  assert_ok(dynamo_trace_print(t, &printed));
  assert_non_null(strstr(printed, "mul(%0, 0.5)"));
  dynamo_string_free(printed);
  dynamo_trace_destroy(t);
  /* a DLPack type code that does not exist is named by its number */
  dynamo_entry *e = NULL;
  dynamo_frame *f = compile_text(g_engine, "trace @c {\n  %0 = input f32[2]\n  %1 = neg(%0)\n  return %1\n}\n", &e);
  float x[2] = {1, 2};
  int64_t s2[1] = {2};
  test_tensor tx;
  tt_init(&tx, x, 99, 32, 1, s2, NULL);
  dynamo_arg a[1] = {arg_tensor(&tx)};
  char why[256];
  assert_fails(dynamo_entry_check_guards(e, a, 1, why, sizeof why), DYNAMO_ERR_GUARD_MISS,
               "an unknown type (DLPack code 99, 32 bits)");
  assert_ok(dynamo_frame_destroy(f));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_offset_past_the_address_space),
      cmocka_unit_test(test_long_view_chain_returned_directly),
      cmocka_unit_test(test_long_chain_of_writes_into_one_input),
      cmocka_unit_test(test_thousands_of_outputs),
      cmocka_unit_test(test_slice_with_a_huge_step),
      cmocka_unit_test(test_int64_literals_are_exact),
      cmocka_unit_test(test_pow_with_the_largest_integer_exponent),
      cmocka_unit_test(test_mean_of_nothing_is_nan_beside_a_variance),
      cmocka_unit_test(test_guard_values_must_have_the_inputs_type),
      cmocka_unit_test(test_ranks_past_the_limit_are_refused_when_parsed),
      cmocka_unit_test(test_malformed_side_exits_are_refused_when_parsed),
      cmocka_unit_test(test_messages_say_what_was_found),
  };
  return cmocka_run_group_tests_name("adversarial", tests, group_setup, group_teardown);
}
