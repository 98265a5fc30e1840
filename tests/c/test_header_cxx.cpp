// test_header_cxx.cpp -- the public header compiles on its own as C++ and links with C linkage.
#include "dynamo.h"

#include <cstdio>

int main() {
  dynamo_engine *e = nullptr;
  dynamo_status s = dynamo_engine_create(nullptr, &e);
  std::printf("header (C++): %s\n", dynamo_status_name(s));
  return s == DYNAMO_OK && dynamo_engine_destroy(e) == DYNAMO_OK ? 0 : 1;
}
