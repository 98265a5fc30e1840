// gemm_bf16.cpp -- bfloat16 products of few rows against a weight (a decode step's linear layers
// and output projection): the weight streamed once from where it lies, float32 accumulation,
// AVX512-BF16 dot products (vdpbf16ps: two products per lane per instruction) where B's columns
// are contiguous along K (a linear layer's weight, B = W^T), float32 FMAs on widened rows where
// B's rows are contiguous (GPT-2's Conv1D, x @ W). Compiled for AVX512-BF16 alone: the caller
// asks bf16_gemm_available() first and leaves other CPUs to LibTorch.
#include "gemm.h"

// (GCC's intrinsics start some results from an "undefined" vector made by self-assignment)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace dynamo::runtime {

namespace {

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int DR = 4, DC = 4;  // dot tile: rows of A, columns of B
constexpr int RR = 2, VC = 16;  // row tile: rows of A, vectors of 16 columns of B

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

// c[i][0:nc] = sum over k of x_i[k] * b_k[0:nc] for R rows of A and up to VC * 16 columns of B's
// rows (contiguous), each B row read once for all R rows: VC * 32 bytes of it at a time (fewer, down
// many rows, would read B in many short pieces far apart, at a fraction of the bandwidth).
template <int R>
BF16_TARGET void row_tile(int64_t K, const uint16_t *const *x, const uint16_t *b, int64_t ldb, int64_t nc, float *c,
                          int64_t ldc) {
  __m512 acc[R][VC];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < VC; ++v) acc[i][v] = _mm512_setzero_ps();
  if (nc == VC * 16) {  // a whole block: plain loads
    for (int64_t k = 0; k < K; ++k) {
      const uint16_t *row = b + k * ldb;
      __m512 xv[R];
      for (int i = 0; i < R; ++i) {
        uint32_t bits = (uint32_t)x[i][k] << 16;
        float xf;
        memcpy(&xf, &bits, 4);
        xv[i] = _mm512_set1_ps(xf);
      }
#pragma GCC unroll 16
      for (int v = 0; v < VC; ++v) {
        const __m512 bv = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + 16 * v))), 16));
        for (int i = 0; i < R; ++i) acc[i][v] = _mm512_fmadd_ps(xv[i], bv, acc[i][v]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < VC; ++v) _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
    return;
  }
  __mmask16 m[VC];
  for (int v = 0; v < VC; ++v) {
    const int64_t left = nc - 16 * v;
    m[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
  }
  for (int64_t k = 0; k < K; ++k) {
    const uint16_t *row = b + k * ldb;
    for (int i = 0; i < R; ++i) {
      uint32_t bits = (uint32_t)x[i][k] << 16;
      float xf;
      memcpy(&xf, &bits, 4);
      const __m512 xv = _mm512_set1_ps(xf);
      for (int v = 0; v < VC; ++v) acc[i][v] = _mm512_fmadd_ps(xv, widen(row + 16 * v, m[v]), acc[i][v]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < VC; ++v) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], acc[i][v]);
}

BF16_TARGET void row_tile_rows(int r, int64_t K, const uint16_t *const *x, const uint16_t *b, int64_t ldb, int64_t nc,
                               float *c, int64_t ldc) {
  if (r == 1)
    row_tile<1>(K, x, b, ldb, nc, c, ldc);
  else
    row_tile<2>(K, x, b, ldb, nc, c, ldc);
}

}  // namespace

bool bf16_gemm_available() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

bool bf16_gemm_few_rows(int64_t M, int64_t N, int64_t K, Bf16View A, Bf16View B, float *C, int64_t ldc,
                        const ParallelFor &par) {
  if (!bf16_gemm_available() || M < 0 || N < 0 || K < 0) return false;
  if (K > 1 && A.cs != 1) return false;
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return true;
  }
  if (B.rs == 1 || K == 1) {  // B's columns contiguous along K: dot products, DC columns at a time
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
          dot_tile_rows(r, K, x, w, out);
          for (int i = 0; i < r; ++i)
            for (int64_t j = 0; j < nc; ++j) C[(i0 + i) * ldc + j0 + j] = out[i][j];
        }
      }
    });
    return true;
  }
  if (B.cs == 1) {  // B's rows contiguous: each block of VC * 16 columns accumulated down K
    constexpr int64_t W = VC * 16;
    par((N + W - 1) / W, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t j0 = b * W, nc = std::min<int64_t>(W, N - j0);
        for (int64_t i0 = 0; i0 < M; i0 += RR) {
          const int r = (int)std::min<int64_t>(RR, M - i0);
          const uint16_t *x[RR];
          for (int i = 0; i < RR; ++i) x[i] = A.data + (i0 + std::min(i, r - 1)) * A.rs;
          row_tile_rows(r, K, x, B.data + j0, B.rs, nc, C + i0 * ldc + j0, ldc);
        }
      }
    });
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
