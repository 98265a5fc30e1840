// blas_lt.h -- matrix products on the GPU through cuBLASLt, opened with dlopen at first use
// (gpu/blas_lt.cpp), as the driver is: nothing links CUDA, and a machine without the library
// says so when a trace with a product is compiled for its GPU. DYNAMO_LIBCUBLASLT overrides the
// library path (tests use a stand-in).
//
// A product of the plan (aten::mm, aten::addmm with beta = alpha = 1 and a bias row, aten::bmm)
// over row-major views whose rows or columns are contiguous becomes one cublasLtMatmul on the
// device's stream, between the trace's kernels; addmm's bias is the BIAS epilogue. Row-major
// C = A B is computed as the column-major C^T = B^T A^T, so B is cuBLASLt's first operand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_driver.h"
#include "jit/fuse.h"

namespace dynamo::gpu {

// True if the library can be opened with every entry point dynamo uses; else *why.
bool cublaslt_available(std::string *why);

// One product step, in the plan's terms: operands are (slot, element offset, strides) views.
struct Gemm {
  int32_t step = -1;             // the plan's extern index
  jit::DType dtype = jit::DType::F32;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  jit::BufferView a, b, bias, c;  // c: the result, contiguous [batch,] m x n
  bool has_bias = false;
  enum Act : uint8_t { None, Relu, GeluTanh } act = None;  // an activation fused as the epilogue
  std::vector<int64_t> a_strides, b_strides;  // (batch,) row, column strides in elements
};

// The product extern step x of plan p as a Gemm, or false with *why (an op or layout cuBLASLt
// is not used for here).
bool gemm_of(const jit::Trace &t, const jit::Plan &p, int32_t extern_index, Gemm *g, std::string *why);

// A device's cuBLASLt handle, workspace and the products of one program (descriptors made once).
class BlasLt {
 public:
  BlasLt(std::shared_ptr<Device> dev, const std::vector<Gemm> &gemms);
  ~BlasLt();
  BlasLt(const BlasLt &) = delete;
  BlasLt &operator=(const BlasLt &) = delete;
  // Enqueues product `i` on the device's stream over the slot table's device pointers.
  void run(size_t i, const std::vector<uint64_t> &slots);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynamo::gpu
