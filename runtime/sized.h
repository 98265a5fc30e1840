// sized.h -- traces with size variables (dynamo_frame_add_sized): IR text whose sizes are
// products of the variables s0..s7, kept as a template of the frame and compiled at the sizes
// of a call that no entry accepts. Binding the variables from the call's tensors checks the
// relations the template declares (one variable equal everywhere it stands as an input's size,
// every size a whole number, every variable at least 2); the instance is an ordinary entry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dynamo.h"

namespace dynamo::runtime {

constexpr int kMaxSizeVars = 8;

// One size expression of the text: coef * prod(vars) / div (vars may repeat).
struct SizeExpr {
  size_t begin = 0, end = 0;  // its span in the template text
  int64_t coef = 1, div = 1;
  std::vector<int> vars;
  std::string text() const;   // as written back: "4*s0", "s0*s1/2"
};

struct SizedTemplate {
  std::string text;
  std::vector<SizeExpr> exprs;  // in text order
  int num_vars = 0;
  // per variable: the input and dim it is read from (the first place it stands alone)
  std::vector<std::pair<int, int>> binding;
  // per input: per dim, the index in exprs of its size (or -1: a plain number)
  std::vector<std::vector<int>> input_dims;
  std::vector<std::vector<int64_t>> input_plain;  // the plain numbers (where input_dims is -1)
  std::vector<std::vector<int>> input_strides;    // same for strides (empty: contiguous)
  std::vector<std::vector<int64_t>> stride_plain;
  size_t instances = 0;
  std::vector<std::vector<int64_t>> refused;  // variable values whose instance did not accept the call
};

// Parses the template (throws jit::Error(Parse) naming the problem: no variable, a variable no
// input's size is, a malformed expression, more than kMaxSizeVars variables) and checks it by
// parsing and verifying the text at a sample of sizes (throws that error, the sizes named).
SizedTemplate make_sized_template(const std::string &text);

// The variables' values for a call, or false with why (a relation that failed).
bool bind_sizes(const SizedTemplate &t, const dynamo_arg *args, size_t nargs, std::vector<int64_t> *values,
                std::string *why);

// The text at those values (throws jit::Error(Verify) when an expression is not a whole number
// or overflows int64).
std::string instantiate_sized(const SizedTemplate &t, const std::vector<int64_t> &values);

}  // namespace dynamo::runtime
