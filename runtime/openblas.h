// openblas.h -- the OpenBLAS in the process: its thread count held to one while dynamo works,
// and its sgemm for products dynamo spreads over its own threads.
//
// LibTorch's matrix products (aten::mm, addmm, bmm, and the im2col + GEMM convolutions it takes
// at batch 1) call the BLAS behind libblas.so.3. A threaded OpenBLAS starts threads of its own
// beside ATen's OpenMP threads, and GNU OpenMP's threads spin for a while after each parallel
// region: on a machine with few cores a product placed between two OpenMP ops fights them for
// the cores and runs 2-6x slower than alone, and which side wins changes from call to call.
// A trace is exactly that (fused kernels on the OpenMP threads, LibTorch calls between them),
// and so is a recording (the forward run op by op). While held, OpenBLAS runs each product on
// the calling thread only; dynamo's own GEMM and kernels keep every OpenMP thread.
//
// The hold is process-wide (OpenBLAS has one thread count) and counted: the first hold saves
// the count and sets 1, the last release restores it, whichever threads they come from. A
// product another thread makes meanwhile also runs on one thread: slower at worst, never
// different. Without OpenBLAS in the process (the reference BLAS, MKL) nothing changes.
//
// With OpenBLAS on one thread, a product step of a trace can still use every core without a
// fight: it splits the product into blocks and calls OpenBLAS's single-threaded sgemm on each,
// on the OpenMP threads the trace's kernels run on (aten_extern.cpp, blas_split).
#pragma once

namespace dynamo::runtime {

// cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc).
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                            float *, int);
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

// OpenBLAS's cblas_sgemm, or null without OpenBLAS in the process.
CblasSgemm openblas_sgemm();

// enter: hold (true) or release (false). Returns false for a release without a hold.
bool blas_hold(bool enter);

// The thread count OpenBLAS had before the first hold (now, when not held); 0 without OpenBLAS.
int blas_threads();

struct BlasHold {
  explicit BlasHold(bool active) : active_(active) { if (active_) blas_hold(true); }
  ~BlasHold() { if (active_) blas_hold(false); }
  BlasHold(const BlasHold &) = delete;
  BlasHold &operator=(const BlasHold &) = delete;

 private:
  bool active_;
};

}  // namespace dynamo::runtime
