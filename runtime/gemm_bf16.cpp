// gemm_bf16.cpp -- bfloat16 products of few rows against a weight (a decode step's linear layers
// and output projection): the weight streamed once from where it lies, float32 accumulation,
// AVX512-BF16 dot products (vdpbf16ps: two products per lane per instruction) where B's columns
// are contiguous along K (a linear layer's weight, B = W^T), float32 FMAs on widened rows where
// B's rows are contiguous (GPT-2's Conv1D, x @ W). Where the CPU has AVX2 and FMA but no
// AVX512-BF16, the same walks widen bf16 to float32 (a shift: a bf16 is a float's high half) and
// multiply-add in float32, the weight still read as bf16: half a float32 weight's bytes. The
// caller asks bf16_gemm_available() first and leaves other CPUs to LibTorch.
#include "gemm.h"
#include "isa.h"

// (GCC's intrinsics start some results from an "undefined" vector made by self-assignment)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace dynamo::runtime {

namespace {

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AVX2_TARGET __attribute__((target("avx2,fma")))

constexpr int DR = 4, DC = 4;  // dot tile: rows of A, columns of B
constexpr int64_t kRowRuns = 8;      // runs of B's rows summed apart (the row-contiguous B)
constexpr int64_t kFewRowsBf16 = 32;  // the most rows of A taken

// out[i][j] = sum over k of x_i[k] * w_j[k] (bf16 in, fp32 sums) for R rows and DC weight rows,
// 32 elements of K per instruction, two sums per row of A (even and odd steps of 32) so that the
// dot products do not wait on each other. The weight rows are walked one after the other, each
// from start to end: where they lie back to back (a weight's rows) memory is read in one
// sequential stream (walking them side by side, k by k, read the weight at half the speed).
// The tail of K is read by masked loads (zeros add nothing).
template <int R>
BF16_TARGET void dot_tile(int64_t K, const uint16_t *const *x, const uint16_t *const *w, float out[DR][DC]) {
  for (int j = 0; j < DC; ++j) {
    __m512 acc0[R], acc1[R];
    for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
    const uint16_t *wj = w[j];
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wj + k), w1 = (__m512bh)_mm512_loadu_si512(wj + k + 32);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_loadu_si512(x[i] + k), w0);
        acc1[i] = _mm512_dpbf16_ps(acc1[i], (__m512bh)_mm512_loadu_si512(x[i] + k + 32), w1);
      }
    }
    for (; k < K; k += 32) {
      const __mmask32 m = K - k >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (K - k)) - 1);
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, wj + k);
      for (int i = 0; i < R; ++i)
        acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_maskz_loadu_epi16(m, x[i] + k), wv);
    }
    for (int i = 0; i < R; ++i) out[i][j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
  }
}

BF16_TARGET void dot_tile_rows(int r, int64_t K, const uint16_t *const *x, const uint16_t *const *w,
                               float out[DR][DC]) {
  switch (r) {
    case 1: dot_tile<1>(K, x, w, out); break;
    case 2: dot_tile<2>(K, x, w, out); break;
    case 3: dot_tile<3>(K, x, w, out); break;
    default: dot_tile<4>(K, x, w, out); break;
  }
}

// 16 bf16 values widened to float32 (a bf16 is the high half of a float's bits).
BF16_TARGET inline __m512 widen(const uint16_t *p, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// y_i[0:n] += x_i * b[0:n] for m rows (x_i a float, y_i at y + i * ldy): one row of B widened
// once for all m.
BF16_TARGET void rows_axpy(int64_t n, int m, const float *xs, const uint16_t *b, float *y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 bv = widen(b + j, (__mmask16)0xffff);
    for (int i = 0; i < m; ++i) {
      float *yi = y + i * ldy + j;
      _mm512_storeu_ps(yi, _mm512_fmadd_ps(_mm512_set1_ps(xs[i]), bv, _mm512_loadu_ps(yi)));
    }
  }
  if (j < n) {
    const __mmask16 mk = (__mmask16)((1u << (n - j)) - 1);
    const __m512 bv = widen(b + j, mk);
    for (int i = 0; i < m; ++i) {
      float *yi = y + i * ldy + j;
      _mm512_mask_storeu_ps(yi, mk, _mm512_fmadd_ps(_mm512_set1_ps(xs[i]), bv, _mm512_maskz_loadu_ps(mk, yi)));
    }
  }
}

// y[0:n] += p[0:n].
void add_into(int64_t n, const float *p, float *y) {
  for (int64_t j = 0; j < n; ++j) y[j] += p[j];
}

float bf16_value(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// -- AVX2 + FMA (no bf16 instructions) ----------------------------------------------------

// 8 bf16 values widened to float32.
AVX2_TARGET inline __m256 widen8(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

AVX2_TARGET inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// dot_tile's AVX2 form: A's rows already widened to float32 (xf), each weight row walked end to
// end, 16 of its elements per step into two sums per row of A.
template <int R>
AVX2_TARGET void dot_tile_avx2(int64_t K, const float *const *xf, const uint16_t *const *w, float out[DR][DC]) {
  for (int j = 0; j < DC; ++j) {
    __m256 acc0[R], acc1[R];
    for (int i = 0; i < R; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
    const uint16_t *wj = w[j];
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256 w0 = widen8(wj + k), w1 = widen8(wj + k + 8);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        acc0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xf[i] + k), w0, acc0[i]);
        acc1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(xf[i] + k + 8), w1, acc1[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      float sum = hsum8(_mm256_add_ps(acc0[i], acc1[i]));
      for (int64_t t = k; t < K; ++t) sum += xf[i][t] * bf16_value(wj[t]);
      out[i][j] = sum;
    }
  }
}

void dot_tile_rows_avx2(int r, int64_t K, const float *const *xf, const uint16_t *const *w, float out[DR][DC]) {
  switch (r) {
    case 1: dot_tile_avx2<1>(K, xf, w, out); break;
    case 2: dot_tile_avx2<2>(K, xf, w, out); break;
    case 3: dot_tile_avx2<3>(K, xf, w, out); break;
    default: dot_tile_avx2<4>(K, xf, w, out); break;
  }
}

// rows_axpy's AVX2 form.
AVX2_TARGET void rows_axpy_avx2(int64_t n, int m, const float *xs, const uint16_t *b, float *y, int64_t ldy) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 bv = widen8(b + j);
    for (int i = 0; i < m; ++i) {
      float *yi = y + i * ldy + j;
      _mm256_storeu_ps(yi, _mm256_fmadd_ps(_mm256_set1_ps(xs[i]), bv, _mm256_loadu_ps(yi)));
    }
  }
  for (; j < n; ++j) {
    const float bj = bf16_value(b[j]);
    for (int i = 0; i < m; ++i) y[i * ldy + j] = std::fma(xs[i], bj, y[i * ldy + j]);
  }
}

// Which form runs: 2 AVX512-BF16, 1 AVX2 + FMA, 0 none (LibTorch's call). Below the kernels'
// level (DYNAMO_KERNEL_ISA, isa.h) the AVX512-BF16 form is not taken.
int bf16_level() {
  static const int level = [] {
    const Isa isa = kernel_isa();
    if (isa == Isa::Avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return 2;
    return isa >= Isa::Avx2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
  }();
  return level;
}

}  // namespace

bool bf16_gemm_available() { return bf16_level() > 0; }

bool bf16_gemm_few_rows(int64_t M, int64_t N, int64_t K, Bf16View A, Bf16View B, float *C, int64_t ldc,
                        const ParallelFor &par) {
  if (!bf16_gemm_available() || M < 0 || N < 0 || K < 0 || M > kFewRowsBf16) return false;
  if (K > 1 && A.cs != 1) return false;
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return true;
  }
  const bool avx2 = bf16_level() == 1;
  if (B.rs == 1 || K == 1) {  // B's columns contiguous along K: dot products, DC columns at a time
    std::unique_ptr<float[]> xf;  // (AVX2: A's rows widened once, read by every tile)
    if (avx2) {
      xf.reset(new float[(size_t)(M * K)]);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) xf[(size_t)(i * K + k)] = bf16_value(A.data[i * A.rs + k * A.cs]);
    }
    par((N + DC - 1) / DC, 16, [&](int64_t b0, int64_t b1) {
      auto cols = [&](int64_t b, const uint16_t **w) {  // block b's columns of B (the last repeated)
        const int64_t j0 = b * DC, nc = std::min<int64_t>(DC, N - j0);
        for (int j = 0; j < DC; ++j) w[j] = B.data + (j0 + std::min<int64_t>(j, nc - 1)) * B.cs;
      };
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t j0 = b * DC, nc = std::min<int64_t>(DC, N - j0);
        const uint16_t *w[DC];
        cols(b, w);
        for (int64_t i0 = 0; i0 < M; i0 += DR) {
          const int r = (int)std::min<int64_t>(DR, M - i0);
          const uint16_t *x[DR];
          for (int i = 0; i < DR; ++i) x[i] = A.data + (i0 + std::min(i, r - 1)) * A.rs;
          float out[DR][DC];
          if (avx2) {
            const float *xr[DR];
            for (int i = 0; i < DR; ++i) xr[i] = xf.get() + (i0 + std::min(i, r - 1)) * K;
            dot_tile_rows_avx2(r, K, xr, w, out);
          } else {
            dot_tile_rows(r, K, x, w, out);
          }
          for (int i = 0; i < r; ++i)
            for (int64_t j = 0; j < nc; ++j) C[(i0 + i) * ldc + j0 + j] = out[i][j];
        }
      }
    });
    return true;
  }
  if (B.cs == 1) {
    // B's rows contiguous (x @ W, GPT-2's Conv1D): K cut into a fixed number of runs of rows
    // (as many on any machine: the same sums on any number of threads), each summed over whole
    // rows, for all M rows of A, into partial results of its own; the partials then added in run
    // order. A run of whole rows is one sequential stream where the rows lie back to back.
    const int64_t runs = std::clamp<int64_t>(K / 64, 1, kRowRuns);
    if (runs * M * N > (int64_t)1 << 22) return false;  // (LibTorch's call: a big product)
    std::unique_ptr<float[]> part(new float[(size_t)(runs * M * N)]);
    par(runs, 1, [&](int64_t r0, int64_t r1) {
      float xs[kFewRowsBf16];
      for (int64_t r = r0; r < r1; ++r) {
        float *pr = part.get() + r * M * N;
        std::fill(pr, pr + M * N, 0.0f);
        for (int64_t k = K * r / runs; k < K * (r + 1) / runs; ++k) {
          for (int64_t i = 0; i < M; ++i) xs[i] = bf16_value(A.data[i * A.rs + k * A.cs]);
          if (avx2)
            rows_axpy_avx2(N, (int)M, xs, B.data + k * B.rs, pr, N);
          else
            rows_axpy(N, (int)M, xs, B.data + k * B.rs, pr, N);
        }
      }
    });
    for (int64_t i = 0; i < M; ++i) {
      float *ci = C + i * ldc;
      std::fill(ci, ci + N, 0.0f);
      for (int64_t r = 0; r < runs; ++r) add_into(N, part.get() + (r * M + i) * N, ci);
    }
    return true;
  }
  return false;
}

uint16_t bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return (uint16_t)(u >> 16);
}

}  // namespace dynamo::runtime
