/* helpers.h -- small helpers shared by the C test suites (public header only). */
#ifndef DYNAMO_TEST_HELPERS_H
#define DYNAMO_TEST_HELPERS_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "dynamo.h"

/* A DLTensor over caller memory; shape/strides point into the struct's own arrays. */
typedef struct test_tensor {
  DLTensor dl;
  int64_t shape[8];
  int64_t strides[8];
} test_tensor;

static inline void tt_init(test_tensor *t, void *data, uint8_t code, uint8_t bits, int ndim,
                           const int64_t *shape, const int64_t *strides) {
  memset(t, 0, sizeof *t);
  t->dl.data = data;
  t->dl.device.device_type = kDLCPU;
  t->dl.ndim = ndim;
  t->dl.dtype.code = code;
  t->dl.dtype.bits = bits;
  t->dl.dtype.lanes = 1;
  for (int i = 0; i < ndim; ++i) t->shape[i] = shape[i];
  t->dl.shape = t->shape;
  if (strides) {
    for (int i = 0; i < ndim; ++i) t->strides[i] = strides[i];
    t->dl.strides = t->strides;
  }
}

static inline dynamo_arg arg_tensor(const test_tensor *t) {
  dynamo_arg a;
  memset(&a, 0, sizeof a);
  a.kind = DYNAMO_ARG_TENSOR;
  a.u.tensor = &t->dl;
  return a;
}
static inline dynamo_arg arg_int(int64_t v) {
  dynamo_arg a;
  memset(&a, 0, sizeof a);
  a.kind = DYNAMO_ARG_INT;
  a.u.i = v;
  return a;
}
static inline dynamo_arg arg_float(double v) {
  dynamo_arg a;
  memset(&a, 0, sizeof a);
  a.kind = DYNAMO_ARG_FLOAT;
  a.u.f = v;
  return a;
}

static inline dynamo_arg arg_bool(int32_t v) {
  dynamo_arg a;
  memset(&a, 0, sizeof a);
  a.kind = DYNAMO_ARG_BOOL;
  a.u.b = v;
  return a;
}

/* One engine per suite, made by the group set-up (cmocka_run_group_tests_name). */
static dynamo_engine *g_engine;

static inline int group_setup(void **state) {
  (void)state;
  return dynamo_engine_create(NULL, &g_engine) == DYNAMO_OK ? 0 : -1;
}

static inline int group_teardown(void **state) {
  (void)state;
  /* A failed test may leave its frame alive; the engine is then kept, which is harmless. */
  dynamo_engine_destroy(g_engine);
  return 0;
}

/* Asserts status s and that the last error contains `needle`. */
#define assert_status_msg(s, want, needle)                                                        \
  do {                                                                                            \
    dynamo_status s_ = (s);                                                                       \
    if (s_ != (want) || !strstr(dynamo_last_error(), (needle))) {                                 \
      print_error("got %s (%s), wanted %s with \"%s\"\n", dynamo_status_name(s_),                  \
                  dynamo_last_error(), dynamo_status_name(want), (needle));                      \
      fail();                                                                                     \
    }                                                                                             \
  } while (0)

#define assert_ok(s)                                                                              \
  do {                                                                                            \
    dynamo_status s_ = (s);                                                                       \
    if (s_ != DYNAMO_OK) {                                                                        \
      print_error("%s: %s\n", dynamo_status_name(s_), dynamo_last_error());                      \
      fail();                                                                                     \
    }                                                                                             \
  } while (0)

/* Parses text, compiles it into a new frame of engine; returns the frame. */
static inline dynamo_frame *compile_text(dynamo_engine *engine, const char *text, dynamo_entry **entry) {
  dynamo_trace *t = NULL;
  dynamo_frame *f = NULL;
  assert_ok(dynamo_trace_parse(text, (size_t)-1, &t));
  assert_ok(dynamo_frame_create(engine, "test", &f));
  assert_ok(dynamo_compile_frame(f, t, entry));
  dynamo_trace_destroy(t);
  return f;
}

#endif
