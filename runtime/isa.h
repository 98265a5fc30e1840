// isa.h -- the vector instruction set the runtime's own C++ kernels (gemm.cpp, attention.cpp)
// run with. Their inner loops are written once over a vector type and instantiated per level:
// 16-float vectors for AVX-512 (x86-64-v4), 8-float ones with tiles that fit AVX2's 16 registers
// (x86-64-v3), the portable code otherwise. (GCC keeps a 64-byte vector in memory where the
// target has no 64-byte registers: one body compiled for every level would run AVX2 machines at
// a third of their speed.) The generated kernels (LLVM) pick their width from the host apart.
#pragma once

namespace dynamo::runtime {

enum class Isa { Base = 0, Avx2 = 1, Avx512 = 2 };

// The host's best level, or a lower one named by DYNAMO_KERNEL_ISA ("avx2", "base"; to run the
// other levels' kernels on a machine that has more). Read once.
Isa kernel_isa();

#define DYNAMO_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define DYNAMO_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))

}  // namespace dynamo::runtime
