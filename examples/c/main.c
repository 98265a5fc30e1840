/* main.c -- a C program using the installed dynamo library: build a trace with the builder API,
 * compile it, check guards and run it on its own buffers. Build (after `make install`): see
 * CMakeLists.txt here. */
#include <dynamo/dynamo.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define N 1000

static int check(dynamo_status s, const char *what) {
  if (s != DYNAMO_OK) fprintf(stderr, "%s failed: %s: %s\n", what, dynamo_status_name(s), dynamo_last_error());
  return s == DYNAMO_OK;
}

static DLTensor tensor(float *data, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 1;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t; /* strides NULL: contiguous */
}

int main(void) {
  if (dynamo_abi_version() != DYNAMO_ABI_VERSION) {
    fprintf(stderr, "libdynamo ABI %u, header %u\n", dynamo_abi_version(), DYNAMO_ABI_VERSION);
    return 1;
  }
  dynamo_engine *engine = NULL;
  dynamo_frame *frame = NULL;
  dynamo_trace *trace = NULL;
  int64_t shape[1] = {N};
  int32_t x, scale, a, b, r;
  /* y = sigmoid(x * scale) + 1, built one instruction at a time. */
  if (!check(dynamo_engine_create(NULL, &engine), "engine") || !check(dynamo_frame_create(engine, "example", &frame), "frame") ||
      !check(dynamo_trace_create("example", &trace), "trace") ||
      !check(dynamo_trace_add_tensor_input(trace, DYNAMO_FLOAT32, 1, shape, NULL, &x), "input") ||
      !check(dynamo_trace_add_scalar_input(trace, DYNAMO_FLOAT64, &scale), "scalar") ||
      !check(dynamo_trace_add_instruction(trace, "mul(%0, %1)", &a), "mul") ||
      !check(dynamo_trace_add_instruction(trace, "sigmoid(%2)", &b), "sigmoid") ||
      !check(dynamo_trace_add_instruction(trace, "add(%3, 1)", &r), "add") || !check(dynamo_trace_add_output(trace, r), "output") ||
      !check(dynamo_compile_frame(frame, trace, NULL), "compile"))
    return 1;
  char *text = NULL;
  if (check(dynamo_trace_print(trace, &text), "print")) printf("%s", text);
  dynamo_string_free(text);

  static float in[N], out[N];
  for (int i = 0; i < N; ++i) in[i] = (float)(i - N / 2) / 100.0f;
  DLTensor tin = tensor(in, shape), tout = tensor(out, shape);
  dynamo_arg args[2];
  memset(args, 0, sizeof args);
  args[0].kind = DYNAMO_ARG_TENSOR;
  args[0].u.tensor = &tin;
  args[1].kind = DYNAMO_ARG_FLOAT;
  args[1].u.f = 0.5;

  dynamo_entry *entry = NULL;
  char why[256];
  if (!check(dynamo_check_guards(frame, args, 2, &entry, why, sizeof why), "guards")) return 1;
  if (!check(dynamo_entry_run(entry, args, 2, &tout, 1), "run")) return 1;
  double worst = 0;
  for (int i = 0; i < N; ++i) {
    double want = 1.0 / (1.0 + exp(-(double)in[i] * 0.5)) + 1.0;
    double d = fabs(out[i] - want);
    if (d > worst) worst = d;
  }
  printf("y[0] = %f, y[%d] = %f, max error vs libm: %.2e\n", out[0], N - 1, out[N - 1], worst);

  /* A shape the entry was not compiled for is a guard miss, explained. */
  int64_t other[1] = {N - 1};
  tin.shape = other;
  if (dynamo_check_guards(frame, args, 2, &entry, why, sizeof why) == DYNAMO_ERR_GUARD_MISS) printf("guard miss: %s\n", why);

  dynamo_trace_destroy(trace);
  dynamo_frame_destroy(frame);
  dynamo_engine_destroy(engine);
  return worst < 1e-5 ? 0 : 1;
}
