/* fake_cublaslt.c -- a stand-in for libcublasLt.so, beside fake_cuda.c (whose device memory is
 * host memory), to test how dynamo drives cuBLASLt without a GPU: descriptors keep their
 * attributes, and cublasLtMatmul computes D = alpha op(A) op(B) + beta C (+ the bias epilogue)
 * in float32 column-major on the host, batched with strided offsets, so a test can compare the
 * products a trace asks for with its own. Calls are appended to a log (fake_cublaslt_log). It
 * follows the library's documented ABI only; float32 data (other types: CUBLAS_STATUS_NOT_SUPPORTED). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

typedef int Status;
enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };

struct Desc { int compute, scale, transa, transb; uint32_t epilogue; const float *bias; int bias_type; };
struct Layout { int type; uint64_t rows, cols; int64_t ld; int32_t batch; int64_t stride; };

static char g_log[1 << 14];
const char *fake_cublaslt_log(void) { return g_log; }
void fake_cublaslt_clear_log(void) { g_log[0] = 0; }
static void logf_(const char *s) {
  size_t at = strlen(g_log);
  snprintf(g_log + at, sizeof g_log - at, "%s\n", s);
}

Status cublasLtCreate(void **h) { *h = malloc(1); return OK; }
Status cublasLtDestroy(void *h) { free(h); return OK; }
const char *cublasLtGetStatusString(Status s) { return s == NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "fake cuBLASLt error"; }

Status cublasLtMatmulDescCreate(void **d, int compute, int scale) {
  struct Desc *x = calloc(1, sizeof *x);
  x->compute = compute, x->scale = scale, x->epilogue = 1;
  *d = x;
  return OK;
}
Status cublasLtMatmulDescDestroy(void *d) { free(d); return OK; }
Status cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t n) {
  struct Desc *x = d;
  switch (attr) {
    case 3: if (n != 4) return INVALID_VALUE; memcpy(&x->transa, buf, 4); return OK;
    case 4: if (n != 4) return INVALID_VALUE; memcpy(&x->transb, buf, 4); return OK;
    case 7: if (n != 4) return INVALID_VALUE; memcpy(&x->epilogue, buf, 4); return OK;
    case 8: if (n != sizeof(void *)) return INVALID_VALUE; memcpy(&x->bias, buf, sizeof(void *)); return OK;
    case 26: if (n != 4) return INVALID_VALUE; memcpy(&x->bias_type, buf, 4); return OK;
    default: return INVALID_VALUE;
  }
}
Status cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (ld < (int64_t)rows) return INVALID_VALUE;
  struct Layout *x = calloc(1, sizeof *x);
  x->type = type, x->rows = rows, x->cols = cols, x->ld = ld, x->batch = 1;
  *l = x;
  return OK;
}
Status cublasLtMatrixLayoutDestroy(void *l) { free(l); return OK; }
Status cublasLtMatrixLayoutSetAttribute(void *l, int attr, const void *buf, size_t n) {
  struct Layout *x = l;
  if (attr == 5 && n == 4) { memcpy(&x->batch, buf, 4); return OK; }
  if (attr == 6 && n == 8) { memcpy(&x->stride, buf, 8); return OK; }
  return INVALID_VALUE;
}

/* Element (r, c) of op(M) for a column-major layout. */
static float at(const float *m, const struct Layout *l, int trans, uint64_t r, uint64_t c) {
  return trans ? m[c + r * (uint64_t)l->ld] : m[r + c * (uint64_t)l->ld];
}

Status cublasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *Ad, const void *B, void *Bd,
                      const void *beta, const void *C, void *Cd, void *D, void *Dd, const void *algo, void *ws,
                      size_t wss, void *stream) {
  (void)h; (void)algo; (void)ws; (void)wss; (void)stream;
  struct Desc *d = desc;
  struct Layout *la = Ad, *lb = Bd, *lc = Cd, *ld = Dd;
  if (la->type || lb->type || lc->type || ld->type) return NOT_SUPPORTED;
  uint64_t m = d->transa ? la->cols : la->rows, k = d->transa ? la->rows : la->cols;
  uint64_t kb = d->transb ? lb->cols : lb->rows, n = d->transb ? lb->rows : lb->cols;
  if (k != kb || ld->rows != m || ld->cols != n) return INVALID_VALUE;
  int32_t batch = ld->batch;
  if (la->batch != batch || lb->batch != batch) return INVALID_VALUE;
  float al = *(const float *)alpha, be = *(const float *)beta;
  char msg[160];
  snprintf(msg, sizeof msg, "matmul m=%llu n=%llu k=%llu batch=%d transa=%d transb=%d epilogue=%u compute=%d",
           (unsigned long long)m, (unsigned long long)n, (unsigned long long)k, batch, d->transa, d->transb,
           d->epilogue, d->compute);
  logf_(msg);
  for (int32_t bi = 0; bi < batch; ++bi) {
    const float *a = (const float *)A + bi * la->stride, *b = (const float *)B + bi * lb->stride;
    const float *c = (const float *)C + bi * lc->stride;
    float *out = (float *)D + bi * ld->stride;
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double s = 0;
        for (uint64_t p = 0; p < k; ++p) s += (double)at(a, la, d->transa, i, p) * at(b, lb, d->transb, p, j);
        float v = al * (float)s + (be != 0 ? be * c[i + j * (uint64_t)lc->ld] : 0.0f);
        if (d->epilogue & 4) v += d->bias[i]; /* BIAS: one value per row of D */
        if (d->epilogue & 2) v = v > 0 ? v : 0; /* RELU */
        if (d->epilogue & 32) /* GELU, tanh form */
          v = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
        out[i + j * (uint64_t)ld->ld] = v;
      }
  }
  return OK;
}
