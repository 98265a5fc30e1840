// gemm.h -- float32 matrix multiply for the extern ops aten::mm / addmm / bmm (runtime/gemm.cpp).
// The LibTorch we link may use a reference BLAS (Debian's does: BLAS_INFO=generic, ~4 GFLOP/s
// here); this packed, register-blocked kernel is built for the host's vector ISA at load time.
#pragma once

#include <cstdint>
#include <functional>

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

// y[N] (+)= x[K] * B[K, N]: a matrix-vector product, memory-bound, so it streams B exactly once
// (no packing) on the caller's threads. B must have a unit stride (rs or cs == 1) and x be
// contiguous; returns false otherwise (the caller uses another path).
bool sgemv(int64_t N, int64_t K, const float *x, MatView B, float *y, bool accumulate, const ParallelFor &par);

}  // namespace dynamo::runtime
