/* test_gpu_driver.c -- the CUDA driver without a GPU: with no libcuda.so.1, with a stand-in
 * that reports no device, with one lacking a versioned entry point, and with one that reports a
 * device (tests/c/fake_cuda.c: host memory as device memory, kernels logged, not run). The
 * first three check dynamo_gpu_available and the CUDA engine's status and message; the last
 * drives a CUDA engine through the C API: compile (PTX loaded as a module), guards on the
 * device, launch shapes, device outputs, refusals. Whether the kernels compute the right values
 * is tests/gpu/gpu_check's job, on a real GPU. Run once per case (ctest sets DYNAMO_LIBCUDA and
 * GPU_CASE). */
#include <dlfcn.h>
#include <math.h>
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

/* A CUDA engine (device 0 of the stand-in) and a frame on it. */
static void cuda_frame(const char *name, dynamo_engine **eng, dynamo_frame **f) {
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.device_type = kDLCUDA;
  *eng = NULL;
  assert_ok(dynamo_engine_create(&o, eng));
  *f = NULL;
  assert_ok(dynamo_frame_create(*eng, name, f));
}

/* The stand-in driver's launch log (g_log, g_clear), from the library dynamo opened. */
static void bind_launch_log(void) {
  void *h = dlopen(getenv("DYNAMO_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  *(void **)&g_log = dlsym(h, "fake_cuda_log");
  *(void **)&g_clear = dlsym(h, "fake_cuda_clear_log");
  assert_non_null(g_log);
}

/* The stand-in driver's call counts (fake_cuda_counts: allocs, frees, memsets, reads, context waits). */
typedef void (*counts_fn)(int *, int *, int *, int *, int *);
static counts_fn bind_counts(void) {
  void *h = dlopen(getenv("DYNAMO_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(h);
  counts_fn counts;
  *(void **)&counts = dlsym(h, "fake_cuda_counts");
  assert_non_null(counts);
  return counts;
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
  bind_launch_log();
  dynamo_engine *eng = NULL;
  dynamo_frame *f = NULL;
  cuda_frame("gpu", &eng, &f);

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
  t = parse("trace @cs {\n  %0 = input f32[8,3] cuda:0\n"
            "  %1 = extern aten::cumsum(%0, 0) : f32[8,3]\n  return %1\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "aten::cumsum cannot run on the GPU");
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
  void (*counts)(int *, int *, int *, int *, int *) = bind_counts();

  dynamo_engine *eng = NULL;
  dynamo_frame *f = NULL;
  cuda_frame("costs", &eng, &f);
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

/* Matrix products on the device through cuBLASLt (the stand-in computes them on the host, as
 * the stand-in driver's device memory is host memory): mm, addmm with a transposed weight (a
 * linear layer; the bias as the epilogue), bmm; the product writes the output itself (no copy
 * kernel). Without the library, products are refused with its reason and the rest still runs. */
static float uniform(unsigned *s) { *s = *s * 1103515245u + 12345u; return (float)((*s >> 8) % 1000) / 500.0f - 1.0f; }

static void test_products_through_cublaslt(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  if (!c || (strcmp(c, "one") != 0 && strcmp(c, "noblas") != 0)) { print_message("needs a one-device stand-in\n"); return; }
  dynamo_engine *eng = NULL;
  dynamo_frame *f = NULL;
  cuda_frame("products", &eng, &f);
  dynamo_trace *t = parse("trace @mm {\n  %0 = input f32[5,3] cuda:0\n  %1 = input f32[3,4] cuda:0\n"
                          "  %2 = extern aten::mm(%0, %1) : f32[5,4]\n  return %2\n}\n");
  dynamo_entry *e = NULL;
  if (strcmp(c, "noblas") == 0) {
    assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "cuBLASLt is not installed");
    dynamo_trace_destroy(t);
    t = parse("trace @p {\n  %0 = input f32[4] cuda:0\n  %1 = neg(%0)\n  return %1\n}\n");
    assert_ok(dynamo_compile_frame(f, t, NULL));  /* kernels alone still compile */
    dynamo_trace_destroy(t);
    assert_ok(dynamo_frame_destroy(f));
    assert_ok(dynamo_engine_destroy(eng));
    return;
  }
  assert_ok(dynamo_compile_frame(f, t, &e));  /* (loads cuBLASLt) */
  dynamo_trace_destroy(t);
  bind_launch_log();
  void *hb = dlopen(getenv("DYNAMO_LIBCUBLASLT"), RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(hb);
  const char *(*blas_log)(void);
  void (*blas_clear)(void);
  *(void **)&blas_log = dlsym(hb, "fake_cublaslt_log");
  *(void **)&blas_clear = dlsym(hb, "fake_cublaslt_clear_log");

  static float x[2 * 5 * 3], w[4 * 3], y[2 * 3 * 4], b[4], out[2 * 5 * 4];
  unsigned seed = 7;
  for (int i = 0; i < 30; ++i) x[i] = uniform(&seed);
  for (int i = 0; i < 12; ++i) w[i] = uniform(&seed);
  for (int i = 0; i < 24; ++i) y[i] = uniform(&seed);
  for (int i = 0; i < 4; ++i) b[i] = uniform(&seed);
  int64_t sx[3] = {2, 5, 3}, sy[3] = {2, 3, 4}, sw[2] = {4, 3}, sb[1] = {4}, so[3] = {2, 5, 4};
  DLTensor tx = tensor(x, sx + 1, 2, kDLCUDA), ty = tensor(y, sy + 1, 2, kDLCUDA), to = tensor(out, so + 1, 2, kDLCUDA);
  dynamo_arg args[3];
  memset(args, 0, sizeof args);
  args[0].kind = args[1].kind = args[2].kind = DYNAMO_ARG_TENSOR;
  args[0].u.tensor = &tx;
  args[1].u.tensor = &ty;
  g_clear();
  blas_clear();
  memset(out, 0, sizeof out);
  assert_ok(dynamo_entry_run(e, args, 2, &to, 1));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) {
      float s = 0;
      for (int p = 0; p < 3; ++p) s += x[i * 3 + p] * y[p * 4 + j];
      assert_float_equal(out[i * 4 + j], s, 1e-5);
    }
  assert_string_equal(g_log(), "");  /* the product wrote the output: no copy kernel */
  assert_non_null(strstr(blas_log(), "matmul m=4 n=5 k=3 batch=1 transa=0 transb=0 epilogue=1 compute=68"));

  /* A linear layer: x @ w.t() + b, the weight read transposed, the bias by the epilogue. */
  t = parse("trace @lin {\n  %0 = input f32[5,3] cuda:0\n  %1 = input f32[4,3] cuda:0\n  %2 = input f32[4] cuda:0\n"
            "  %3 = transpose(%1, 0, 1)\n  %4 = extern aten::addmm(%2, %0, %3) : f32[5,4]\n  return %4\n}\n");
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  DLTensor tw = tensor(w, sw, 2, kDLCUDA), tb = tensor(b, sb, 1, kDLCUDA);
  args[1].u.tensor = &tw;
  args[2].u.tensor = &tb;
  blas_clear();
  assert_ok(dynamo_entry_run(e, args, 3, &to, 1));
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j) {
      float s = b[j];
      for (int p = 0; p < 3; ++p) s += x[i * 3 + p] * w[j * 3 + p];
      assert_float_equal(out[i * 4 + j], s, 1e-5);
    }
  assert_non_null(strstr(blas_log(), "transa=1 transb=0 epilogue=4"));

  /* bmm over two batches, strided batch offsets. */
  t = parse("trace @bmm {\n  %0 = input f32[2,5,3] cuda:0\n  %1 = input f32[2,3,4] cuda:0\n"
            "  %2 = extern aten::bmm(%0, %1) : f32[2,5,4]\n  return %2\n}\n");
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  DLTensor tx3 = tensor(x, sx, 3, kDLCUDA), ty3 = tensor(y, sy, 3, kDLCUDA), to3 = tensor(out, so, 3, kDLCUDA);
  args[0].u.tensor = &tx3;
  args[1].u.tensor = &ty3;
  assert_ok(dynamo_entry_run(e, args, 2, &to3, 1));
  for (int q = 0; q < 2; ++q)
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 4; ++j) {
        float s = 0;
        for (int p = 0; p < 3; ++p) s += x[q * 15 + i * 3 + p] * y[q * 12 + p * 4 + j];
        assert_float_equal(out[q * 20 + i * 4 + j], s, 1e-5);
      }

  /* Kernels around a product run on the same stream in step order: exp after it. */
  t = parse("trace @mlp {\n  %0 = input f32[5,3] cuda:0\n  %1 = input f32[3,4] cuda:0\n"
            "  %2 = extern aten::mm(%0, %1) : f32[5,4]\n  %3 = exp(%2)\n  return %3\n}\n");
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  args[0].u.tensor = &tx;
  args[1].u.tensor = &ty;
  g_clear();
  blas_clear();
  assert_ok(dynamo_entry_run(e, args, 2, &to, 1));
  assert_non_null(strstr(g_log(), "_k"));
  assert_non_null(strstr(blas_log(), "matmul m=4 n=5 k=3"));

  /* ReLU and tanh-GELU after a product (through a reshape) are its epilogue: no kernel runs, the
   * product writes the activation's buffer (here the output). */
  for (int act = 0; act < 3; ++act) {
    static const char *names[3] = {"relu", "gelu_tanh", "gelu"};
    char text[512];
    snprintf(text, sizeof text,
             "trace @act {\n  %%0 = input f32[5,3] cuda:0\n  %%1 = input f32[4,3] cuda:0\n  %%2 = input f32[4] cuda:0\n"
             "  %%3 = transpose(%%1, 0, 1)\n  %%4 = extern aten::addmm(%%2, %%0, %%3) : f32[5,4]\n"
             "  %%5 = reshape(%%4, [5,2,2])\n  %%6 = %s(%%5)\n  return %%6\n}\n", names[act]);
    t = parse(text);
    assert_ok(dynamo_compile_frame(f, t, &e));
    dynamo_trace_destroy(t);
    args[0].u.tensor = &tx;
    args[1].u.tensor = &tw;
    args[2].u.tensor = &tb;
    int64_t s522[3] = {5, 2, 2};
    DLTensor t20 = tensor(out, s522, 3, kDLCUDA);
    g_clear();
    blas_clear();
    memset(out, 0, sizeof out);
    assert_ok(dynamo_entry_run(e, args, 3, &t20, 1));
    int launches = 0;
    for (const char *l = g_log(); (l = strchr(l, '\n')); ++l) ++launches;
    if (act == 2) {  /* the exact GELU is not cuBLASLt's: its kernel runs after the product */
      assert_int_equal(launches, 1);
      assert_non_null(strstr(blas_log(), "epilogue=4 "));
      continue;
    }
    assert_int_equal(launches, 0);
    assert_non_null(strstr(blas_log(), act == 0 ? "epilogue=6 " : "epilogue=36 "));
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 4; ++j) {
        float s = b[j];
        for (int p = 0; p < 3; ++p) s += x[i * 3 + p] * w[j * 3 + p];
        float want = act == 0 ? (s > 0 ? s : 0) : 0.5f * s * (1.0f + tanhf(0.7978845608f * (s + 0.044715f * s * s * s)));
        assert_float_equal(out[i * 4 + j], want, 1e-5);
      }
  }

  /* Products cuBLASLt is not used for say why. */
  t = parse("trace @f64 {\n  %0 = input f64[5,3] cuda:0\n  %1 = input f64[3,4] cuda:0\n"
            "  %2 = extern aten::mm(%0, %1) : f64[5,4]\n  return %2\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "dtype f64");
  dynamo_trace_destroy(t);
  t = parse("trace @beta {\n  %0 = input f32[5,3] cuda:0\n  %1 = input f32[3,4] cuda:0\n  %2 = input f32[4] cuda:0\n"
            "  %3 = extern aten::addmm(%2, %0, %1, 0.5, 1) : f32[5,4]\n  return %3\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "beta or alpha other than 1");
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));
}

/* Side exits on the device: at the guard's step the exit check (the one kernel the stand-in
 * runs, on its host memory) sets the status word when the condition fails; the kernels after it
 * skip themselves on the device (test_ptx checks that code), the host reads the word once at
 * the end and hands the live values out as device tensors copied from the run's memory. The
 * condition here is an input. */
static void test_side_exits_on_the_device(void **state) {
  (void)state;
  const char *c = getenv("GPU_CASE");
  if (!c || strcmp(c, "one") != 0) { print_message("needs the one-device stand-in (GPU_CASE=one)\n"); return; }
  bind_launch_log();
  dynamo_engine *eng = NULL;
  dynamo_frame *f = NULL;
  cuda_frame("exits", &eng, &f);
  dynamo_trace *t = parse("trace @ex {\n  %0 = input bool[] cuda:0\n  %1 = input f32[6] cuda:0\n"
                          "  %2 = exp(%1)\n  %3 = neg(%2)\n  %4 = guard(%0, true, 0, %1, %2) : bool[]\n"
                          "  %5 = mul(%3, 2.0)\n  return %5\n}\n");
  dynamo_entry *e = NULL;
  assert_ok(dynamo_compile_frame(f, t, &e));
  dynamo_trace_destroy(t);
  assert_int_equal(dynamo_entry_num_exits(e), 1);
  static uint8_t cond;
  static float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
  int64_t s6[1] = {6};
  DLTensor tc = tensor((float *)&cond, NULL, 0, kDLCUDA), tx = tensor(x, s6, 1, kDLCUDA), ty = tensor(y, s6, 1, kDLCUDA);
  tc.dtype.code = DYNAMO_DL_BOOL;
  tc.dtype.bits = 8;
  dynamo_arg args[2];
  memset(args, 0, sizeof args);
  args[0].kind = args[1].kind = DYNAMO_ARG_TENSOR;
  args[0].u.tensor = &tc;
  args[1].u.tensor = &tx;
  /* The guard is decided on the device: the exit check is launched at the guard's step, between
   * the kernel before it and the one after it, and the host waits once per run (no wait at the
   * guard) and reads the status word once. */
  void (*counts)(int *, int *, int *, int *, int *) = bind_counts();
  int (*stream_syncs)(void);
  *(void **)&stream_syncs = dlsym(dlopen(getenv("DYNAMO_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD), "fake_cuda_stream_syncs");
  assert_non_null(stream_syncs);
  cond = 1;
  assert_ok(dynamo_entry_run(e, args, 2, &ty, 1));  /* warm */
  g_clear();
  int a0, f0, m0, r0, c0, a1, f1, m1, r1, c1;
  counts(&a0, &f0, &m0, &r0, &c0);
  int s0 = stream_syncs();
  assert_ok(dynamo_entry_run(e, args, 2, &ty, 1));
  counts(&a1, &f1, &m1, &r1, &c1);
  assert_int_equal(r1 - r0, 1);                      /* the status word, once */
  assert_int_equal(m1 - m0, 1);                      /* cleared once */
  assert_int_equal((c1 - c0) + (stream_syncs() - s0), 1);  /* one wait, at the end */
  const char *log = g_log();
  const char *check = strstr(log, "_exit_check grid=1 block=1 code=256");
  assert_non_null(check);
  assert_true(check > strchr(log, '\n'));           /* after the kernel before the guard */
  assert_non_null(strchr(check, '\n') ? strstr(strchr(check, '\n'), "_k") : NULL);  /* and before the one after it */
  cond = 0;
  assert_status_msg(dynamo_entry_run(e, args, 2, &ty, 1), DYNAMO_EXIT, "side exit 0");
  assert_int_equal(dynamo_entry_exit_count(e, 0), 1);
  int32_t id = -1;
  size_t n = 0;
  DLManagedTensor *vals[2] = {NULL, NULL};
  assert_ok(dynamo_take_exit(&id, vals, 2, &n));
  assert_int_equal(id, 0);
  assert_int_equal(n, 2);
  assert_int_equal(vals[0]->dl_tensor.device.device_type, kDLCUDA);
  assert_int_equal(vals[0]->dl_tensor.shape[0], 6);
  const float *xv = (const float *)vals[0]->dl_tensor.data;
  assert_ptr_not_equal(xv, x);  /* a copy (the stand-in's device memory is host memory) */
  for (int i = 0; i < 6; ++i) assert_true(xv[i] == x[i]);
  vals[0]->deleter(vals[0]);
  vals[1]->deleter(vals[1]);
  /* A live value that is a non-contiguous view is copied out on the CPU only: refused here. */
  t = parse("trace @nc {\n  %0 = input bool[] cuda:0\n  %1 = input f32[4,6] cuda:0\n  %2 = transpose(%1, 0, 1)\n"
            "  %3 = guard(%0, true, 0, %2) : bool[]\n  %4 = neg(%1)\n  return %4\n}\n");
  assert_status_msg(dynamo_compile_frame(f, t, NULL), DYNAMO_ERR_UNSUPPORTED, "non-contiguous view");
  dynamo_trace_destroy(t);
  assert_ok(dynamo_frame_destroy(f));
  assert_ok(dynamo_engine_destroy(eng));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_driver_case), cmocka_unit_test(test_cuda_engine_with_stand_in),
                                     cmocka_unit_test(test_what_a_call_costs),
                                     cmocka_unit_test(test_products_through_cublaslt),
                                     cmocka_unit_test(test_side_exits_on_the_device)};
  return cmocka_run_group_tests_name("gpu_driver", tests, NULL, NULL);
}
