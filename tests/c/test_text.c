/* test_text.c -- trace IR text form: exact round-trip, the builder, and parse/verify errors with
 * line and column. Public header only. */
#include "helpers.h"

static const char *kRoundTrip[] = {
    "trace @chain {\n"
    "  %0 = input f32[4,8]\n"
    "  %1 = input f32[8] weight\n"
    "  %2 = add(%0, %1) : f32[4,8]\n"
    "  %3 = exp(%2) : f32[4,8]\n"
    "  %4 = mul(%3, 2.5) : f32[4,8]\n"
    "  return %4\n"
    "}\n",
    "trace @views {\n"
    "  %0 = input f64[3,5]{1,3} requires_grad\n"
    "  %1 = input i64 == 7\n"
    "  %2 = input f64\n"
    "  %3 = input bool\n"
    "  %4 = transpose(%0, 0, 1) : f64[5,3]\n"
    "  %5 = slice(%4, 0, 1, 5, 2) : f64[2,3]\n"
    "  %6 = clamp(%5, none, 0.125) : f64[2,3]\n"
    "  %7 = where(%8, %6, -inf) : f64[2,3]\n"
    "  return %7\n"
    "}\n",
    "trace @ext {\n"
    "  %0 = input f32[2,3]\n"
    "  %1 = input f32[3,4]\n"
    "  %2 = extern aten::mm(%0, %1) : f32[2,4]\n"
    "  %3, %4, %5 = extern aten::native_layer_norm(%2, [4], none, none, 1e-05) : f32[2,4], f32[2,1], f32[2,1]\n"
    "  %6 = to(%3, f64) : f64[2,4]\n"
    "  %7 = extern aten::sum.dim_IntList(%6, [1], false, none) : f64[2]\n"
    "  return %7, %4\n"
    "}\n",
    "trace @scalars {\n"
    "  %0 = input i32[0,3]\n"
    "  %1 = input f32[] cuda:1\n"
    "  %2 = pow(%0, 3) : i32[0,3]\n"
    "  %3 = eq(%2, true) : bool[0,3]\n"
    "  %4 = logical_not(%3) : bool[0,3]\n"
    "  %5 = add(%1, nan) : f32[]\n"
    "  %6 = mul(%5, 1e+300) : f32[]\n"
    "  %7 = extern aten::foo.bar(%0, \"a \\\"quoted\\\" text\", [], -3) : f32[1]\n"
    "  return %4, %6\n"
    "}\n",
    "trace @lists {\n"
    "  %0 = input f32[2,3]\n"
    "  %1 = input f32[4,3]\n"
    "  %2 = input i64[2]\n"
    "  %3 = extern aten::cat([%0, %1], 0) : f32[6,3]\n"
    "  %4 = extern aten::index.Tensor(%3, [none, %2]) : f32[6,2]\n"
    "  %5 = extern aten::stack([%4]) : f32[1,6,2]\n"
    "  return %5\n"
    "}\n",
};

static void test_print_parse_roundtrip(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof kRoundTrip / sizeof *kRoundTrip; ++i) {
    const char *src = kRoundTrip[i];
    if (i == 1) continue; /* uses %8 before definition: checked below as an error */
    dynamo_trace *t = NULL;
    assert_ok(dynamo_trace_parse(src, (size_t)-1, &t));
    char *once = NULL, *twice = NULL;
    assert_ok(dynamo_trace_print(t, &once));
    assert_string_equal(once, src);
    dynamo_trace *t2 = NULL;
    assert_ok(dynamo_trace_parse(once, strlen(once), &t2));
    assert_ok(dynamo_trace_print(t2, &twice));
    assert_string_equal(once, twice);
    dynamo_string_free(once);
    dynamo_string_free(twice);
    dynamo_trace_destroy(t);
    dynamo_trace_destroy(t2);
  }
}

static void test_parse_infers_and_canonicalizes(void **state) {
  (void)state;
  /* Types may be omitted, names are free-form, contiguous strides are dropped, comments skipped. */
  const char *src =
      "# a comment\n"
      "trace @t {\n"
      "  %x = input f32[2,3]{3,1}\n"
      "  %y = input f64   # scalar\n"
      "  %z = mul(%x, %y)\n"
      "  %w = unsqueeze(%z, -1)\n"
      "  %v = expand(%w, [4,-1,-1,5])\n"
      "  return %v\n"
      "}";
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_parse(src, (size_t)-1, &t));
  char *s = NULL;
  assert_ok(dynamo_trace_print(t, &s));
  assert_string_equal(s,
                      "trace @t {\n"
                      "  %0 = input f32[2,3]\n"
                      "  %1 = input f64\n"
                      "  %2 = mul(%0, %1) : f32[2,3]\n"
                      "  %3 = unsqueeze(%2, -1) : f32[2,3,1]\n"
                      "  %4 = expand(%3, [4,-1,-1,5]) : f32[4,2,3,5]\n"
                      "  return %4\n"
                      "}\n");
  dynamo_string_free(s);
  dynamo_trace_destroy(t);
}

struct bad_case {
  const char *text;
  dynamo_status status;
  const char *needle;
};

static void test_parse_errors_name_line_and_column(void **state) {
  (void)state;
  static const struct bad_case cases[] = {
      {"", DYNAMO_ERR_PARSE, "line 1, column 1: expected 'trace'"},
      {"trace @t {\n  %0 = input f32[4\n}", DYNAMO_ERR_PARSE, "line 3, column 1: expected ',' or ']', found '}'"},
      {"trace @t {\n  %0 = input q32[4]\n}", DYNAMO_ERR_PARSE, "line 2, column 14: expected a dtype"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = frobnicate(%0)\n  return %1\n}", DYNAMO_ERR_PARSE,
       "line 3, column 8: expected an operation name"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = exp(%9)\n  return %1\n}", DYNAMO_ERR_PARSE,
       "line 3, column 12: expected a defined value (%9 is used before it is defined)"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0\n  return %1\n}", DYNAMO_ERR_PARSE,
       "line 4, column 3: expected ',' or ')'"},
      {"trace @t {\n  %0 = input f32[4]\n  %0 = exp(%0)\n  return %0\n}", DYNAMO_ERR_PARSE,
       "expected a new value name (%0 is already defined)"},
      {"trace @t {\n  %0 = input f32[4]\n  return %0\n", DYNAMO_ERR_PARSE, "expected ',' or '}'"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = add(%0, 99999999999999999999)\n  return %1\n}", DYNAMO_ERR_PARSE,
       "an integer that fits in 64 bits"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = extern aten::mm(%0, %0)\n  return %1\n}", DYNAMO_ERR_PARSE,
       "expected ': type' after an extern"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = input f32[5]\n  %2 = add(%0, %1)\n  return %2\n}",
       DYNAMO_ERR_VERIFY, "line 4: instruction '%2 = add': shapes [4] and [5] do not broadcast"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0, %0)\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "exp takes 1 operand(s), got 2"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = exp(%0) : f64[4]\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "annotated type f64[4] differs from the inferred f32[4]"},
      {"trace @t {\n  %0 = input i64[4]\n  %1 = gelu(%0)\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "gelu is not defined for i64 tensors"},
      {"trace @t {\n  %0 = input bool[4]\n  %1 = neg(%0)\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "neg on bool tensors is not supported"},
      {"trace @t {\n  %0 = input f32[4,6]\n  %1 = reshape(%0, [5,-1])\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "cannot infer the -1 size"},
      {"trace @t {\n  %0 = input f32[4,6]\n  %1 = permute(%0, [0,0])\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "permute repeats dimension 0"},
      {"trace @t {\n  %0 = input f32[4,6]\n  %1 = select(%0, 1, 6)\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "index 6 out of range for size 6"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = where(%0, %0, %0)\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "where's condition must be a bool tensor"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = input f64\n  return %1\n}", DYNAMO_ERR_VERIFY,
       "is a scalar; traces return tensors"},
      {"trace @t {\n  %0 = input f32[4]\n  return\n}", DYNAMO_ERR_VERIFY, "returns nothing"},
      {"trace @t {\n  %0 = input f32[4] == 3\n  return %0\n}", DYNAMO_ERR_VERIFY,
       "only scalar inputs can carry a '== value' guard"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = add([%0], 1)\n  return %1\n}", DYNAMO_ERR_PARSE,
       "line 3, column 12: expected a list of values (only extern arguments take tensor lists)"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = extern aten::cat([%0, 2], 0) : f32[4]\n  return %1\n}",
       DYNAMO_ERR_PARSE, "expected a %value or none in a tensor list"},
      {"trace @t {\n  %0 = input f32[4]\n  %1 = input f64\n  %2 = extern aten::cat([%0, %1], 0) : f32[4]\n"
       "  return %2\n}", DYNAMO_ERR_VERIFY, "tensor list elements must be tensor values or none"},
      /* stride arguments recorded from eager's layout of an intermediate (issue 14: swin_t) */
      {"trace @t {\n  %0 = input f32[4,6]\n  %1 = exp(%0)\n"
       "  %2 = extern aten::_reshape_alias(%1, [6,4], [1,6]) : f32[6,4]\n  return %2\n}",
       DYNAMO_ERR_VERIFY, "aten::_reshape_alias applies stride arguments to %1, a value whose memory layout"},
      {"trace @t {\n  %0 = input f32[4,6]\n  %1 = transpose(%0, 0, 1)\n"
       "  %2 = extern aten::as_strided(%1, [2,2], [1,6], 0) : f32[2,2]\n  return %2\n}",
       DYNAMO_ERR_VERIFY, "aten::as_strided applies stride arguments to %1"},
      /* the IR's own as_strided: strides over the row-major order of its operand, inside it */
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [4,4], [2,1], 1)\n  return %1\n}",
       DYNAMO_ERR_VERIFY, "as_strided reads element 10 of a tensor of 10"},
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [4,3], [2,1], -1)\n  return %1\n}",
       DYNAMO_ERR_VERIFY, "as_strided offset must be >= 0, got -1"},
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [4,3], [2,-1], 3)\n  return %1\n}",
       DYNAMO_ERR_VERIFY, "as_strided stride must be >= 0, got -1"},
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [4,3], [2], 0)\n  return %1\n}",
       DYNAMO_ERR_VERIFY, "as_strided needs one stride per size"},
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [4611686018427387904,3], [4611686018427387904,1], 0)\n"
       "  return %1\n}", DYNAMO_ERR_VERIFY, "as_strided extent overflows int64"},
      {"trace @t {\n  %0 = input f32[10]\n  %1 = as_strided(%0, [3,2], [2,1], 0)\n  %2 = copy_(%1, 1.0)\n"
       "  return %2\n}", DYNAMO_ERR_VERIFY, "copy_ destination may not be an as_strided view"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
    dynamo_trace *t = (dynamo_trace *)0x1;
    dynamo_status s = dynamo_trace_parse(cases[i].text, (size_t)-1, &t);
    if (s != cases[i].status || !strstr(dynamo_last_error(), cases[i].needle)) {
      print_error("case %zu: got %s \"%s\", wanted %s \"%s\"\n", i, dynamo_status_name(s), dynamo_last_error(),
                  dynamo_status_name(cases[i].status), cases[i].needle);
      fail();
    }
    assert_null(t);
  }
  /* kRoundTrip[1] uses %8 before it is defined. */
  dynamo_trace *t = NULL;
  assert_status_msg(dynamo_trace_parse(kRoundTrip[1], (size_t)-1, &t), DYNAMO_ERR_PARSE,
                    "line 9, column 14: expected a defined value (%8 is used before it is defined)");
}

static void test_builder_matches_text(void **state) {
  (void)state;
  dynamo_trace *t = NULL;
  int32_t x, y, a, b, c;
  int64_t sizes[2] = {4, 8}, strides[2] = {1, 4};
  assert_ok(dynamo_trace_create("built", &t));
  assert_ok(dynamo_trace_add_tensor_input(t, DYNAMO_FLOAT32, 2, sizes, strides, &x));
  assert_ok(dynamo_trace_add_scalar_input(t, DYNAMO_FLOAT64, &y));
  assert_ok(dynamo_trace_add_instruction(t, "mul(%0, %1)", &a));
  assert_ok(dynamo_trace_add_instruction(t, "tanh(%2)", &b));
  assert_status_msg(dynamo_trace_add_instruction(t, "tanh(%2, %2)", &c), DYNAMO_ERR_VERIFY, "tanh takes 1 operand");
  assert_status_msg(dynamo_trace_add_instruction(t, "tanh(%7)", &c), DYNAMO_ERR_PARSE, "%7 is used before it is defined");
  assert_ok(dynamo_trace_add_instruction(t, "extern aten::mm(%3, %3) : f32[4,4]", &c));
  assert_status_msg(dynamo_trace_add_output(t, 99), DYNAMO_ERR_INVALID_ARGUMENT, "%99 is not defined");
  assert_status_msg(dynamo_trace_add_output(t, y), DYNAMO_ERR_INVALID_ARGUMENT, "is a scalar");
  assert_ok(dynamo_trace_add_output(t, b));
  char *s = NULL;
  assert_ok(dynamo_trace_print(t, &s));
  assert_string_equal(s,
                      "trace @built {\n"
                      "  %0 = input f32[4,8]{1,4}\n"
                      "  %1 = input f64\n"
                      "  %2 = mul(%0, %1) : f32[4,8]\n"
                      "  %3 = tanh(%2) : f32[4,8]\n"
                      "  %4 = extern aten::mm(%3, %3) : f32[4,4]\n"
                      "  return %3\n"
                      "}\n");
  (void)x;
  (void)a;
  dynamo_string_free(s);
  dynamo_trace_destroy(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_print_parse_roundtrip),
      cmocka_unit_test(test_parse_infers_and_canonicalizes),
      cmocka_unit_test(test_parse_errors_name_line_and_column),
      cmocka_unit_test(test_builder_matches_text),
  };
  return cmocka_run_group_tests_name("text", tests, NULL, NULL);
}
