// isa.cpp -- the level the runtime's own kernels run with (isa.h).
#include "isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dynamo::runtime {

namespace {

Isa detect() {
  __builtin_cpu_init();
  Isa host = __builtin_cpu_supports("x86-64-v4") ? Isa::Avx512
             : __builtin_cpu_supports("x86-64-v3") ? Isa::Avx2
                                                   : Isa::Base;
  const char *want = getenv("DYNAMO_KERNEL_ISA");
  if (!want || !*want) return host;
  Isa asked = !strcmp(want, "avx512") ? Isa::Avx512 : !strcmp(want, "avx2") ? Isa::Avx2
              : !strcmp(want, "base") ? Isa::Base : host;
  if (asked == host && strcmp(want, "avx512") && strcmp(want, "avx2") && strcmp(want, "base"))
    fprintf(stderr, "dynamo: DYNAMO_KERNEL_ISA=%s is not one of avx512, avx2, base; ignored\n", want);
  return asked < host ? asked : host;  // (never a level the host lacks)
}

}  // namespace

Isa kernel_isa() {
  static const Isa isa = detect();
  return isa;
}

}  // namespace dynamo::runtime
