// fuzz_trace.cpp -- libFuzzer target for the trace IR: parse any bytes; what parses must print,
// re-parse and print the same text again; then verify, decompose and simplify it. Any crash,
// sanitizer report or round-trip mismatch is a bug (errors thrown as jit::Error are fine).
// Built by `make fuzz` with clang -fsanitize=fuzzer,address,undefined from the IR sources.
#include <cstdint>
#include <string>

#include "ir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace dynamo::jit;
  std::string text(reinterpret_cast<const char *>(data), size);
  Trace t;
  try {
    t = parse_trace(text);
  } catch (const Error &) {
    return 0;
  }
  std::string printed = print_trace(t);
  Trace again = parse_trace(printed);  // must not throw: printed text is canonical
  if (print_trace(again) != printed) __builtin_trap();
  try {
    verify_trace(t);
    decompose_externs(t);
    simplify_trace(t);
    verify_trace(t);
  } catch (const Error &) {
  }
  return 0;
}
