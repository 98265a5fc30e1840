// gemm.h -- float32 (and few-row bfloat16) matrix multiply for the extern ops aten::mm / addmm / bmm (runtime/gemm.cpp).
// The LibTorch we link may use a reference BLAS (Debian's does: BLAS_INFO=generic, ~4 GFLOP/s
// here); this packed, register-blocked kernel is built for the host's vector ISA at load time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace dynamo::runtime {

// A strided float32 matrix view: element (i, j) at data[i * rs + j * cs].
struct MatView {
  const float *data;
  int64_t rs, cs;
};

// Runs body(begin, end) over [0, n), possibly on several threads (grain: smallest useful chunk).
using ParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &body)>;

// C[M, N] (row-major, row stride ldc) = A[M, K] * B[K, N], or += when accumulate is set.
void sgemm(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
           const ParallelFor &par);

// B[K, N] packed once for sgemm_prepacked: per 256-deep K block, panels of 32 columns
// (zero-padded), the layout sgemm packs into on every call. Reused while B does not change
// (a linear layer's weight).
std::vector<float> pack_b(int64_t N, int64_t K, MatView B, const ParallelFor &par);
// sgemm with B already packed by pack_b. bias (or null; N values, read when !accumulate): C = bias
// + A * B, the bias added as the first K block is stored (a linear layer's addmm without a pass
// that fills C with it first). A with a unit column stride is read in place (12 rows at a time).
void sgemm_prepacked(int64_t M, int64_t N, int64_t K, MatView A, const float *packed_b, float *C, int64_t ldc,
                     bool accumulate, const ParallelFor &par, const float *bias = nullptr);

// C = A * B with B packed by pack_b and A read in place (row i at A + i * lda, unit column
// stride), on the calling thread: many small products (Winograd's, runtime/winograd.cpp) where
// packing A and a call's setup would cost as much as the product.
void sgemm_prepacked_rows(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *packed_b,
                          float *C, int64_t ldc);

// C[M, N] (+)= A[M, K] * B[K, N] for few rows M (up to ~32) where A's rows and B's columns are
// contiguous (B: a linear layer's weight, transposed): dot products along K, 6 rows by 4 columns
// at a time, B streamed once from the weight itself (no packing: at M = 17 packing B is most of
// the traffic). false when the strides do not fit (the caller uses sgemm).
bool sgemm_few_rows(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                    const ParallelFor &par);

// C[M, N] (+)= A[M, K] * B[K, N] for at most 96 rows and K <= 256 with B's rows contiguous
// (B.cs == 1), B read in place, never packed: a product small enough that packing B would be most
// of its work. false when the shape or strides do not fit (the caller uses another path).
bool sgemm_small_b_in_place(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc,
                            bool accumulate, const ParallelFor &par);

// C[M, N] (+)= A[M, K] * B[K, N] (+ bias: N values, read when !accumulate) for a few dozen rows
// M against a big B = W^T that changes between calls (a linear layer's weight in training),
// computed as C^T = W A^T: only A is packed, W is read once, in place. B's columns must be
// contiguous (B.rs == 1); false otherwise or when K == 0.
bool sgemm_small_m(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float *C, int64_t ldc, bool accumulate,
                   const float *bias, const ParallelFor &par);

// y[N] (+)= x[K] * B[K, N]: a matrix-vector product, memory-bound, so it streams B exactly once
// (no packing) on the caller's threads. B must have a unit stride (rs or cs == 1) and x be
// contiguous; returns false otherwise (the caller uses another path).
bool sgemv(int64_t N, int64_t K, const float *x, MatView B, float *y, bool accumulate, const ParallelFor &par);

// -- bfloat16 (runtime/gemm_bf16.cpp) -------------------------------------------------------
// A strided bfloat16 matrix view (each value its 16-bit pattern).
struct Bf16View {
  const uint16_t *data;
  int64_t rs, cs;
};

// Whether the bf16 products below run on this CPU: with AVX512-BF16's dot products, or with
// AVX2 + FMA on bf16 widened to float32 (the weight still read as bf16).
bool bf16_gemm_available();

// C[M, N] (float32, row stride ldc) = A[M, K] * B[K, N] for bfloat16 A and B, summed in float32,
// for a few rows M (a decode step's products): B streamed once from where it lies. A's rows must
// be contiguous (A.cs == 1) and B's columns (B.rs == 1: a linear layer's weight transposed) or rows
// (B.cs == 1); false otherwise or without bf16_gemm_available() (the caller uses LibTorch).
bool bf16_gemm_few_rows(int64_t M, int64_t N, int64_t K, Bf16View A, Bf16View B, float *C, int64_t ldc,
                        const ParallelFor &par);

// A float rounded to bfloat16, to nearest with ties to even (as LibTorch's conversion).
uint16_t bf16_round(float f);

}  // namespace dynamo::runtime
