/* test_gpu_driver.c -- the CUDA driver without a GPU: with no libcuda.so.1, with a stand-in
 * that reports no device, with one lacking a versioned entry point, and with one that reports a
 * device (tests/c/fake_cuda.c: host memory as device memory, kernels logged, not run). The
 * first three check dynamo_gpu_available and the CUDA engine's status and message; the last
 * drives a CUDA engine through the C API: compile (PTX loaded as a module), guards on the
 * device, launch shapes, device outputs, refusals. Whether the kernels compute the right values
 * is tests/gpu/gpu_check's job, on a real GPU. Run once per case (ctest sets DYNAMO_LIBCUDA and
 * GPU_CASE). */
#include <dlfcn.h>
#include <pthread.h>

#include "helpers.h"

static void expect_engine(dynamo_status want, const char *needle) {
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.device_type = kDLCUDA;
  dynamo_engine *e = NULL;
  assert_status_msg(dynamo_engine_create(&o, &e), want, needle);
  assert_null(e);
}

static void test_driver_case(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  char why[256] = "";
  if (!c || strcmp(c, "absent") == 0) {
    dynamo_status s = dynamo_gpu_available(why, sizeof why);
    if (s == DYNAMO_OK) { print_message("a CUDA driver is installed here; skipping the absent-driver case\n"); return; }
    assert_int_equal(s, DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "no device: cannot open"));
    expect_engine(DYNAMO_ERR_NO_DEVICE, "no device");
  } else if (strcmp(c, "nodevice") == 0) {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "0 devices"));
    expect_engine(DYNAMO_ERR_NO_DEVICE, "0 devices");
  } else if (strcmp(c, "old") == 0) {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_ERR_NO_DEVICE);
    assert_non_null(strstr(why, "lacks cuMemAlloc_v2"));
  } else {
    assert_int_equal(dynamo_gpu_available(why, sizeof why), DYNAMO_OK);
    dynamo_engine_options o;
    dynamo_engine_options_init(&o);
    o.device_type = kDLCUDA;
    o.device_index = 3;
    dynamo_engine *e = NULL;
    assert_status_msg(dynamo_engine_create(&o, &e), DYNAMO_ERR_NO_DEVICE, "device 3 does not exist");
  }
  /* CPU engines are unaffected either way. */
  dynamo_engine *cpu = NULL;
  assert_ok(dynamo_engine_create(NULL, &cpu));
  dynamo_engine_destroy(cpu);
}

static dynamo_trace *parse(const char *text) {
  dynamo_trace *t = NULL;
  assert_ok(dynamo_trace_parse(text, (size_t)-1, &t));
  return t;
}

static const char *(*g_log)(void);
static void (*g_clear)(void);

static DLTensor tensor(float *data, int64_t *shape, int ndim, int32_t dev_type) {
  DLTensor d;
  memset(&d, 0, sizeof d);
  d.data = data;
  d.device.device_type = dev_type;
  d.device.device_id = 0;
  d.ndim = ndim;
  d.dtype.code = kDLFloat;
  d.dtype.bits = 32;
  d.dtype.lanes = 1;
  d.shape = shape;
  return d;
}

struct run_job {
  dynamo_entry *e;
  dynamo_arg *args;
  DLTensor *out;
  dynamo_status status;
};

static void *run_on_thread(void *p) {
  struct run_job *j = (struct run_job *)p;
  j->status = dynamo_entry_run(j->e, j->args, 2, j->out, 1);
  return NULL;
}

static void test_cuda_engine_with_stand_in(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  if (!c || strcmp(c, "one") != 0) { print_message("needs the one-device stand-in (GPU_CASE=one)\n"); return; }
  void *h = dlopen(getenv("DYNAMO_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  *(void **)&g_log = dlsym(h, "fake_cuda_log");
  *(void **)&g_clear = dlsym(h, "fake_cuda_clear_log");
  assert_non_null(g_log);

  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.device_type = kDLCUDA;
  dynamo_engine *eng = NULL;
  assert_ok(dynamo_engine_create(&o, &eng));
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(eng, "gpu", &f));

  /* A pointwise trace on cuda:0: compiled to PTX, loaded, one kernel of 1000 items. */
  dynamo_trace *t = parse("trace @g {\n  %0 = input f32[1000] cuda:0\n  %1 = input f32[1000] cuda:0\n"
                          "  %2 = add(%0, %1)\n  %3 = exp(%2)\n  return %3\n}\n");
  dynamo_entry *e = NULL;
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  dynamo_entry_stats st;
  st.struct_size = sizeof st;
  assert_ok(dynamo_entry_get_stats(e, &st));
  assert_int_equal(st.num_kernels, 1);

  static float a[1000], b[1000], out[1000];
  int64_t shape[1] = {1000};
  DLTensor ta = tensor(a, shape, 1, kDLCUDA), tb = tensor(b, shape, 1, kDLCUDA), to = tensor(out, shape, 1, kDLCUDA);
  dynamo_arg args[2];
  memset(args, 0, sizeof args);
  args[0].kind = args[1].kind = DYNAMO_ARG_TENSOR;
  args[0].u.tensor = &ta;
  args[1].u.tensor = &tb;
  g_clear();
  assert_ok(dynamo_entry_run(e, args, 2, &to, 1));
  assert_non_null(strstr(g_log(), "_k0 grid=4 block=256 n=1000"));

  /* From another thread (the driver's current context is per thread). */
  struct run_job job = {e, args, &to, -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, run_on_thread, &job), 0);
  pthread_join(th, NULL);
  assert_int_equal(job.status, DYNAMO_OK);

  /* The guards check the device: CPU tensors miss, naming it. */
  DLTensor ca = tensor(a, shape, 1, kDLCPU);
  args[0].u.tensor = &ca;
  assert_status_msg(dynamo_entry_run(e, args, 2, &to, 1), DYNAMO_ERR_GUARD_MISS, "device mismatch");
  args[0].u.tensor = &ta;
  /* Outputs must be on the device too. */
  DLTensor co = tensor(out, shape, 1, kDLCPU);
  assert_status_msg(dynamo_entry_run(e, args, 2, &co, 1), DYNAMO_ERR_ARGUMENT_MISMATCH, "must be a CUDA tensor on cuda:0");
  /* Engine-allocated outputs are device tensors. */
  DLManagedTensor *m = NULL;
  assert_ok(dynamo_entry_run_alloc(e, args, 2, &m, 1));
  assert_non_null(m);
  assert_int_equal(m->dl_tensor.device.device_type, kDLCUDA);
  assert_int_equal(m->dl_tensor.shape[0], 1000);
  m->deleter(m);

  /* Softmax rows: one block of 256 threads per row of 4096. */
  t = parse("trace @sm {\n  %0 = input f32[64,4096] cuda:0\n"
            "  %1 = extern aten::_softmax(%0, 1, false) : f32[64,4096]\n  return %1\n}\n");
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  static float x[64 * 4096], y[64 * 4096];
  int64_t s2[2] = {64, 4096};
  DLTensor tx = tensor(x, s2, 2, kDLCUDA), ty = tensor(y, s2, 2, kDLCUDA);
  args[0].u.tensor = &tx;
  g_clear();
  assert_ok(dynamo_entry_run(e, args, 1, &ty, 1));
  assert_non_null(strstr(g_log(), "grid=64 block=256 n=64"));

  /* Refusals, with reasons: LibTorch ops, CPU inputs, a JIT failure with the driver's log. */
  t = parse("trace @mm {\n  %0 = input f32[8,3] cuda:0\n  %1 = input f32[3,5] cuda:0\n"
            "  %2 = extern aten::mm(%0, %1) : f32[8,5]\n  return %2\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "aten::mm cannot run on the GPU");
  dynamo_trace_destroy(t);
  t = parse("trace @cpu {\n  %0 = input f32[4]\n  %1 = neg(%0)\n  return %1\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "declared on the CPU");
  dynamo_trace_destroy(t);
  t = parse("trace @bad {\n  %0 = input f32[4] cuda:0\n  %1 = neg(%0)\n  return %1\n}\n");
  setenv("FAKE_CUDA_BAD_PTX", "1", 1);
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_COMPILE, "fake JIT failure");
  unsetenv("FAKE_CUDA_BAD_PTX");
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));

  /* A CPU engine refuses CUDA inputs, pointing at the CUDA engine. */
  assert_ok(dynamo_engine_create(NULL, &eng));
  assert_ok(dynamo_frame_create(eng, "cpu", &f));
  t = parse("trace @g {\n  %0 = input f32[4] cuda:0\n  %1 = neg(%0)\n  return %1\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "device_type kDLCUDA");
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));
}

/* What a user's call costs on the device, counted by the stand-in driver: engine-allocated
 * outputs come from the device's pool (no cuMemAlloc/cuMemFree per call once warm), and the
 * status word is cleared and read back only for a program that can set it (integer floor
 * division). */
static void test_what_a_call_costs(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  if (!c || strcmp(c, "one") != 0) { print_message("needs the one-device stand-in (GPU_CASE=one)\n"); return; }
  void *h = dlopen(getenv("DYNAMO_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  void (*counts)(int *, int *, int *, int *, int *);
  *(void **)&counts = dlsym(h, "fake_cuda_counts");
  assert_non_null(counts);

  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.device_type = kDLCUDA;
  dynamo_engine *eng = NULL;
  assert_ok(dynamo_engine_create(&o, &eng));
  dynamo_frame *f = NULL;
  assert_ok(dynamo_frame_create(eng, "costs", &f));
  dynamo_trace *t = parse("trace @g {\n  %0 = input f32[1000] cuda:0\n  %1 = mul(%0, %0)\n  %2 = neg(%1)\n"
                          "  return %1, %2\n}\n");
  dynamo_entry *e = NULL;
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  static float a[1000];
  int64_t shape[1] = {1000};
  DLTensor ta = tensor(a, shape, 1, kDLCUDA);
  dynamo_arg arg;
  memset(&arg, 0, sizeof arg);
  arg.kind = DYNAMO_ARG_TENSOR;
  arg.u.tensor = &ta;
  int allocs[2], frees[2], memsets[2], reads[2], syncs[2];
  DLManagedTensor *m[2] = {NULL, NULL};
  for (int call = 0; call < 8; ++call) {
    if (call == 2) counts(&allocs[0], &frees[0], &memsets[0], &reads[0], &syncs[0]);
    assert_ok(dynamo_entry_run_alloc(e, &arg, 1, m, 2));
    assert_int_equal(m[0]->dl_tensor.device.device_type, kDLCUDA);
    assert_true(m[0]->dl_tensor.data != m[1]->dl_tensor.data);
    m[0]->deleter(m[0]);
    m[1]->deleter(m[1]);
  }
  counts(&allocs[1], &frees[1], &memsets[1], &reads[1], &syncs[1]);
  assert_int_equal(allocs[1] - allocs[0], 0);   /* warm: the pool serves every output */
  assert_int_equal(frees[1] - frees[0], 0);
  assert_int_equal(memsets[1] - memsets[0], 0); /* a float program cannot fail: no status */
  assert_int_equal(reads[1] - reads[0], 0);
  assert_int_equal(syncs[1] - syncs[0], 6);     /* one wait per call, for the whole context */

  /* Integer floor division can fail (a zero divisor): the status is cleared and read per call. */
  t = parse("trace @d {\n  %0 = input i64[16] cuda:0\n  %1 = floordiv(%0, %0)\n  return %1\n}\n");
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  static int64_t ia[16];
  int64_t s16[1] = {16};
  DLTensor ti = tensor((float *)ia, s16, 1, kDLCUDA);
  ti.dtype.code = kDLInt;
  ti.dtype.bits = 64;
  arg.u.tensor = &ti;
  counts(&allocs[0], &frees[0], &memsets[0], &reads[0], &syncs[0]);
  assert_ok(dynamo_entry_run_alloc(e, &arg, 1, m, 1));
  m[0]->deleter(m[0]);
  counts(&allocs[1], &frees[1], &memsets[1], &reads[1], &syncs[1]);
  assert_int_equal(memsets[1] - memsets[0], 1);
  assert_int_equal(reads[1] - reads[0], 1);

  /* Outputs outliving the engine keep their device; handed back after it is gone. */
  assert_ok(dynamo_entry_run_alloc(e, &arg, 1, m, 1));
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));
  m[0]->deleter(m[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_driver_case), cmocka_unit_test(test_cuda_engine_with_stand_in),
                                     cmocka_unit_test(test_what_a_call_costs)};
  return cmocka_run_group_tests_name("gpu_driver", tests, NULL, NULL);
}
