/* test_header_c.c -- the public header compiles on its own as C99 (with -pedantic). */
#include "dynamo.h"
#include <stdio.h>

int main(void) {
  dynamo_arg a = {DYNAMO_ARG_INT, 0, {0}};
  a.u.i = 1;
  printf("header (C99): ABI %u, library %s, arg kind %d\n", DYNAMO_ABI_VERSION, dynamo_version_string(), (int)a.kind);
  return dynamo_abi_version() == DYNAMO_ABI_VERSION ? 0 : 1;
}
