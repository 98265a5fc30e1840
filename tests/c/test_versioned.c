/* test_versioned.c -- DYNAMO_ARG_FLAG_VERSIONED through the C API: an entry keeps data derived
 * from a versioned input (a convolution's weights reordered for oneDNN, a matrix product's B
 * packed for the GEMM) only while the input's address, version and sampled contents stay; a
 * new version, new contents or an unversioned call is computed afresh. Results are checked
 * against plain C loops on every call. Public header only. */
#include <math.h>

#include "helpers.h"

/* A versioned tensor over caller memory (tensor first: &vt.tensor is what the arg points to). */
typedef struct versioned {
  dynamo_versioned_tensor vt;
  int64_t shape[4];
} versioned;

static void vt_init(versioned *v, float *data, int ndim, const int64_t *shape, uint64_t version) {
  memset(v, 0, sizeof *v);
  v->vt.tensor.data = data;
  v->vt.tensor.device.device_type = kDLCPU;
  v->vt.tensor.ndim = ndim;
  v->vt.tensor.dtype.code = kDLFloat;
  v->vt.tensor.dtype.bits = 32;
  v->vt.tensor.dtype.lanes = 1;
  for (int i = 0; i < ndim; ++i) v->shape[i] = shape[i];
  v->vt.tensor.shape = v->shape;
  v->vt.version = version;
}

static dynamo_arg arg_versioned(const versioned *v, int flagged) {
  dynamo_arg a;
  memset(&a, 0, sizeof a);
  a.kind = DYNAMO_ARG_TENSOR;
  a.flags = flagged ? DYNAMO_ARG_FLAG_VERSIONED : 0;
  a.u.tensor = &v->vt.tensor;
  return a;
}

static dynamo_entry *compile(const char *text, dynamo_frame **f) {
  dynamo_trace *t = NULL;
  dynamo_entry *e = NULL;
  assert_ok(dynamo_trace_parse(text, strlen(text), &t));
  assert_ok(dynamo_frame_create(g_engine, "versioned", f));
  assert_ok(dynamo_compile_frame(*f, t, &e));
  dynamo_trace_destroy(t);
  return e;
}

/* y[o, i, j] = sum over c, di, dj of x[c, i + di - 1, j + dj - 1] * w[o, c, di, dj] (padding 1). */
enum { C = 2, O = 3, H = 5, W = 5 };

static void conv_ref(const float *x, const float *w, float *y) {
  for (int o = 0; o < O; ++o)
    for (int i = 0; i < H; ++i)
      for (int j = 0; j < W; ++j) {
        double s = 0;
        for (int c = 0; c < C; ++c)
          for (int di = 0; di < 3; ++di)
            for (int dj = 0; dj < 3; ++dj) {
              int ii = i + di - 1, jj = j + dj - 1;
              if (ii >= 0 && ii < H && jj >= 0 && jj < W)
                s += (double)x[(c * H + ii) * W + jj] * w[((o * C + c) * 3 + di) * 3 + dj];
            }
        y[(o * H + i) * W + j] = (float)s;
      }
}

static const char *kConv =
    "trace @conv {\n"
    "  %0 = input f32[1,2,5,5]\n"
    "  %1 = input f32[3,2,3,3]\n"
    "  %2 = extern aten::convolution(%0, %1, none, [1,1], [1,1], [1,1], false, [0,0], 1) : f32[1,3,5,5]\n"
    "  return %2\n"
    "}\n";

static void run_conv_and_check(dynamo_entry *e, test_tensor *tx, versioned *vw, int flagged, const float *x,
                               const float *w) {
  float y[O * H * W], want[O * H * W];
  static const int64_t sy[4] = {1, O, H, W};
  test_tensor ty;
  tt_init(&ty, y, kDLFloat, 32, 4, sy, NULL);
  dynamo_arg args[2] = {arg_tensor(tx), arg_versioned(vw, flagged)};
  assert_ok(dynamo_entry_run(e, args, 2, &ty.dl, 1));
  conv_ref(x, w, want);
  for (int k = 0; k < O * H * W; ++k) assert_true(fabsf(y[k] - want[k]) <= 1e-4f * (1.0f + fabsf(want[k])));
}

static void test_convolution_weights_kept_only_while_unchanged(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  dynamo_entry *e = compile(kConv, &f);
  float x[C * H * W], w[O * C * 9];
  static const int64_t sx[4] = {1, C, H, W}, sw[4] = {O, C, 3, 3};
  for (int k = 0; k < C * H * W; ++k) x[k] = (float)((k * 37) % 11) - 5.0f;
  for (int k = 0; k < O * C * 9; ++k) w[k] = (float)((k * 13) % 7) - 3.0f;
  test_tensor tx;
  versioned vw;
  tt_init(&tx, x, kDLFloat, 32, 4, sx, NULL);
  vt_init(&vw, w, 4, sw, 1);
  for (int call = 0; call < 4; ++call) run_conv_and_check(e, &tx, &vw, 1, x, w);  /* kept after the first */
  w[2] += 1.0f;  /* one element (not among the sampled ones), with a new version: recomputed */
  vw.vt.version = 2;
  run_conv_and_check(e, &tx, &vw, 1, x, w);
  for (int k = 0; k < O * C * 9; ++k) w[k] = -w[k];  /* every element, same version: the sample sees it */
  run_conv_and_check(e, &tx, &vw, 1, x, w);
  w[2] += 1.0f;  /* without the flag nothing is kept */
  run_conv_and_check(e, &tx, &vw, 0, x, w);
  run_conv_and_check(e, &tx, &vw, 0, x, w);
  assert_ok(dynamo_frame_destroy(f));
}

static const char *kLinear =
    "trace @linear {\n"
    "  %0 = input f32[5,8]\n"
    "  %1 = input f32[6,8]\n"
    "  %2 = input f32[6]\n"
    "  %3 = transpose(%1, 0, 1) : f32[8,6]\n"
    "  %4 = extern aten::addmm(%2, %0, %3) : f32[5,6]\n"
    "  return %4\n"
    "}\n";

static void test_linear_weight_packing_follows_the_version(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  dynamo_entry *e = compile(kLinear, &f);
  float x[40], w[48], b[6], y[30];
  static const int64_t sx[2] = {5, 8}, sw[2] = {6, 8}, sb[1] = {6}, sy[2] = {5, 6};
  for (int k = 0; k < 40; ++k) x[k] = (float)(k % 5) - 2.0f;
  for (int k = 0; k < 48; ++k) w[k] = (float)((k * 7) % 9) - 4.0f;
  for (int k = 0; k < 6; ++k) b[k] = (float)k;
  test_tensor tx, tb, ty;
  versioned vw;
  tt_init(&tx, x, kDLFloat, 32, 2, sx, NULL);
  tt_init(&tb, b, kDLFloat, 32, 1, sb, NULL);
  tt_init(&ty, y, kDLFloat, 32, 2, sy, NULL);
  vt_init(&vw, w, 2, sw, 7);
  for (int call = 0; call < 6; ++call) {
    if (call == 3) {  /* one changed element (not among the sampled ones of B = w^T): new version */
      w[16] += 2.0f;
      vw.vt.version = 8;
    }
    dynamo_arg args[3] = {arg_tensor(&tx), arg_versioned(&vw, 1), arg_tensor(&tb)};
    assert_ok(dynamo_entry_run(e, args, 3, &ty.dl, 1));
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 6; ++j) {
        float want = b[j];
        for (int k = 0; k < 8; ++k) want += x[i * 8 + k] * w[j * 8 + k];
        assert_true(fabsf(y[i * 6 + j] - want) <= 1e-4f * (1.0f + fabsf(want)));
      }
  }
  assert_ok(dynamo_frame_destroy(f));
}

/* What a trace computes from its `weight` inputs alone -- a product of two weights (an extern)
 * and a row sum of one (a kernel) -- is computed on a call and kept: later calls with the same
 * weights skip those steps. A new version, contents the sample sees, an unversioned weight or a
 * weight at another address computes them again; the per-call input x never does. */
static const char *kKept =
    "trace @kept {\n"
    "  %0 = input f32[2,3] weight\n"
    "  %1 = input f32[3,2] weight\n"
    "  %2 = input f32[2,2]\n"
    "  %3 = extern aten::mm(%0, %1) : f32[2,2]\n"
    "  %4 = sum(%0, [1], true) : f32[2,1]\n"
    "  %5 = add(%3, %4) : f32[2,2]\n"
    "  %6 = mul(%5, %2) : f32[2,2]\n"
    "  return %6\n"
    "}\n";

static void run_kept_and_check(dynamo_entry *e, versioned *va, versioned *vb, int flagged, const float *x) {
  float y[4];
  static const int64_t sx[2] = {2, 2};
  test_tensor tx, ty;
  tt_init(&tx, (float *)x, kDLFloat, 32, 2, sx, NULL);
  tt_init(&ty, y, kDLFloat, 32, 2, sx, NULL);
  dynamo_arg args[3] = {arg_versioned(va, flagged), arg_versioned(vb, 1), arg_tensor(&tx)};
  assert_ok(dynamo_entry_run(e, args, 3, &ty.dl, 1));
  const float *a = (const float *)va->vt.tensor.data, *b = (const float *)vb->vt.tensor.data;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      float mm = 0, rs = 0;
      for (int k = 0; k < 3; ++k) mm += a[i * 3 + k] * b[k * 2 + j], rs += a[i * 3 + k];
      float want = (mm + rs) * x[i * 2 + j];
      assert_true(fabsf(y[i * 2 + j] - want) <= 1e-5f * (1.0f + fabsf(want)));
    }
}

static uint32_t kept_computes(dynamo_entry *e, uint32_t *steps) {
  dynamo_entry_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  assert_ok(dynamo_entry_get_stats(e, &st));
  *steps = st.kept_steps;
  return st.kept_computes;
}

static void test_steps_from_weights_alone_kept_while_unchanged(void **state) {
  (void)state;
  dynamo_frame *f = NULL;
  dynamo_entry *e = compile(kKept, &f);
  float a[6] = {1, -2, 3, 0.5f, 4, -1}, b[6] = {2, 1, -1, 3, 0.25f, -2}, a2[6], x[4] = {1, 2, -1, 0.5f};
  static const int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
  versioned va, vb;
  vt_init(&va, a, 2, sa, 1);
  vt_init(&vb, b, 2, sb, 1);
  uint32_t steps = 0;
  for (int call = 0; call < 3; ++call) {
    x[0] = (float)call;  /* the per-call input changes; the weights do not */
    run_kept_and_check(e, &va, &vb, 1, x);
  }
  assert_int_equal(kept_computes(e, &steps), 1);
  assert_int_equal(steps, 2);  /* the product and the row sum; the add and mul read x */
  b[3] = 7;  /* new contents, new version */
  vb.vt.version = 2;
  run_kept_and_check(e, &va, &vb, 1, x);
  assert_int_equal(kept_computes(e, &steps), 2);
  for (int k = 0; k < 6; ++k) a[k] *= -1;  /* same version: the sample sees it */
  run_kept_and_check(e, &va, &vb, 1, x);
  assert_int_equal(kept_computes(e, &steps), 3);
  memcpy(a2, a, sizeof a2);  /* the same values at another address */
  vt_init(&va, a2, 2, sa, 1);
  run_kept_and_check(e, &va, &vb, 1, x);
  assert_int_equal(kept_computes(e, &steps), 4);
  run_kept_and_check(e, &va, &vb, 0, x);  /* unversioned: computed on every call */
  run_kept_and_check(e, &va, &vb, 0, x);
  assert_int_equal(kept_computes(e, &steps), 6);
  run_kept_and_check(e, &va, &vb, 1, x);  /* versioned again: computed once more, then kept */
  run_kept_and_check(e, &va, &vb, 1, x);
  assert_int_equal(kept_computes(e, &steps), 7);
  assert_ok(dynamo_frame_destroy(f));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_convolution_weights_kept_only_while_unchanged),
      cmocka_unit_test(test_linear_weight_packing_follows_the_version),
      cmocka_unit_test(test_steps_from_weights_alone_kept_while_unchanged),
  };
  /* Both paths of each step are exercised: forced here to the ones that keep derived data. */
  setenv("DYNAMO_CONV", "onednn", 1);
  setenv("DYNAMO_GEMM", "1", 1);
  return cmocka_run_group_tests_name("versioned", tests, group_setup, group_teardown);
}
