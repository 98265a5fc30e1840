// sized.cpp -- size-variable templates: finding the size expressions in the text, binding the
// variables from a call's tensors, and writing the text at those sizes (see sized.h).
#include "runtime/sized.h"

#include <cctype>
#include <numeric>

#include "jit/ir.h"

namespace dynamo::runtime {

namespace {

bool word_char(char c) { return std::isalnum((unsigned char)c) || c == '_' || c == '.'; }
// characters after which a size expression cannot start (names, %values, @traces, a::b, 1.5)
bool joins_before(char c) { return word_char(c) || c == '%' || c == '@' || c == ':' || c == '"'; }

bool read_int(const std::string &s, size_t &i, int64_t *out) {
  size_t j = i;
  __int128 v = 0;
  while (j < s.size() && std::isdigit((unsigned char)s[j])) {
    v = v * 10 + (s[j] - '0');
    if (v > INT64_MAX) return false;
    ++j;
  }
  if (j == i) return false;
  *out = (int64_t)v;
  i = j;
  return true;
}

// A factor at i: digits, or s<digits> (a variable). Returns false when there is none.
bool read_factor(const std::string &s, size_t &i, SizeExpr *e) {
  if (i < s.size() && s[i] == 's' && i + 1 < s.size() && std::isdigit((unsigned char)s[i + 1])) {
    size_t j = i + 1;
    int64_t v = 0;
    if (!read_int(s, j, &v) || v >= kMaxSizeVars)
      jit::fail(jit::ErrorCode::Parse, "sized trace: size variable '" + s.substr(i, j - i) + "': variables are s0..s" +
                                           std::to_string(kMaxSizeVars - 1));
    e->vars.push_back((int)v);
    i = j;
    return true;
  }
  int64_t v = 0;
  size_t j = i;
  if (!read_int(s, j, &v)) return false;
  __int128 c = (__int128)e->coef * v;
  if (c > INT64_MAX) jit::fail(jit::ErrorCode::Parse, "sized trace: a coefficient past int64 at offset " + std::to_string(i));
  e->coef = (int64_t)c;
  i = j;
  return true;
}

// The size expressions of the text (spans holding at least one variable), in order.
std::vector<SizeExpr> find_exprs(const std::string &s) {
  std::vector<SizeExpr> out;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    bool may_start = (std::isdigit((unsigned char)c) || c == 's') && (i == 0 || !joins_before(s[i - 1]));
    if (!may_start) {
      ++i;
      continue;
    }
    SizeExpr e;
    size_t j = i;
    bool ok = read_factor(s, j, &e);
    while (ok && j + 1 < s.size() && s[j] == '*') {
      size_t k = j + 1;
      if (!read_factor(s, k, &e)) break;
      j = k;
    }
    if (ok && !e.vars.empty() && j + 1 < s.size() && s[j] == '/') {
      size_t k = j + 1;
      int64_t d = 0;
      if (!read_int(s, k, &d) || d == 0)
        jit::fail(jit::ErrorCode::Parse, "sized trace: '" + s.substr(i, k - i) + "' divides by zero or by nothing");
      e.div = d;
      j = k;
    }
    if (ok && !e.vars.empty() && (j >= s.size() || !word_char(s[j]))) {
      e.begin = i;
      e.end = j;
      out.push_back(e);
      i = j;
      continue;
    }
    while (i < s.size() && word_char(s[i])) ++i;  // a name or a plain number: skip it whole
  }
  return out;
}

bool eval(const SizeExpr &e, const std::vector<int64_t> &values, int64_t *out) {
  __int128 v = e.coef;
  for (int x : e.vars) {
    v *= values[(size_t)x];
    if (v > INT64_MAX || v < INT64_MIN) return false;
  }
  if (v % e.div != 0) return false;
  *out = (int64_t)(v / e.div);
  return true;
}

std::string join_values(const SizedTemplate &t, const std::vector<int64_t> &values) {
  std::string s;
  for (int v = 0; v < t.num_vars; ++v)
    if (t.binding[(size_t)v].first >= 0) s += (s.empty() ? "s" : ", s") + std::to_string(v) + " = " + std::to_string(values[(size_t)v]);
  return s;
}

// The items of a bracketed list [a,b,...] or {a,b} starting at open: (begin, end) spans.
std::vector<std::pair<size_t, size_t>> list_items(const std::string &s, size_t open, char close_ch) {
  std::vector<std::pair<size_t, size_t>> items;
  size_t close = s.find(close_ch, open);
  if (close == std::string::npos) return items;
  size_t b = open + 1;
  for (size_t k = open + 1; k <= close; ++k)
    if (k == close || s[k] == ',') {
      size_t x = b, y = k;
      while (x < y && std::isspace((unsigned char)s[x])) ++x;
      while (y > x && std::isspace((unsigned char)s[y - 1])) --y;
      if (y > x) items.push_back({x, y});
      b = k + 1;
    }
  return items;
}

}  // namespace

std::string SizeExpr::text() const {
  std::string s;
  if (coef != 1 || vars.empty()) s = std::to_string(coef);
  for (int v : vars) s += (s.empty() ? "s" : "*s") + std::to_string(v);
  if (div != 1) s += "/" + std::to_string(div);
  return s;
}

SizedTemplate make_sized_template(const std::string &text) {
  SizedTemplate t;
  t.text = text;
  t.exprs = find_exprs(text);
  if (t.exprs.empty())
    jit::fail(jit::ErrorCode::Parse, "sized trace: no size variable (s0..s7) in the text; compile it with "
                                     "dynamo_compile_frame");
  for (const SizeExpr &e : t.exprs)
    for (int v : e.vars) t.num_vars = std::max(t.num_vars, v + 1);
  t.binding.assign((size_t)t.num_vars, {-1, -1});
  // the inputs' declarations, in order: their sizes and strides
  size_t line_begin = 0;
  int input = 0;
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = text.size();
    size_t eq = text.find(" = ", line_begin);
    if (eq != std::string::npos && eq < line_end) {
      size_t k = eq + 3;
      while (k < line_end && text[k] == ' ') ++k;
      if (text.compare(k, 6, "input ") == 0) {
        std::vector<int> dims, strides;
        std::vector<int64_t> dplain, splain;
        size_t open = text.find('[', k);
        auto expr_at = [&](size_t b, size_t e) {
          for (size_t x = 0; x < t.exprs.size(); ++x)
            if (t.exprs[x].begin == b && t.exprs[x].end == e) return (int)x;
          return -1;
        };
        auto fill = [&](size_t o, char close, std::vector<int> *idx, std::vector<int64_t> *plain) {
          for (auto [b, e] : list_items(text, o, close)) {
            int x = expr_at(b, e);
            int64_t v = 0;
            size_t p = b;
            if (x < 0 && !(read_int(text, p, &v) && p == e))
              jit::fail(jit::ErrorCode::Parse, "sized trace: input " + std::to_string(input) + ": '" +
                                                   text.substr(b, e - b) + "' is neither a number nor a size expression");
            idx->push_back(x);
            plain->push_back(v);
          }
        };
        if (open != std::string::npos && open < line_end) {
          fill(open, ']', &dims, &dplain);
          size_t brace = text.find('{', open);
          if (brace != std::string::npos && brace < line_end) fill(brace, '}', &strides, &splain);
        }
        for (size_t d = 0; d < dims.size(); ++d) {
          int x = dims[d];
          if (x < 0) continue;
          const SizeExpr &e = t.exprs[(size_t)x];
          if (e.vars.size() == 1 && e.coef == 1 && e.div == 1 && t.binding[(size_t)e.vars[0]].first < 0)
            t.binding[(size_t)e.vars[0]] = {input, (int)d};
        }
        t.input_dims.push_back(dims);
        t.input_plain.push_back(dplain);
        t.input_strides.push_back(strides);
        t.stride_plain.push_back(splain);
        ++input;
      }
    }
    line_begin = line_end + 1;
  }
  std::vector<bool> used((size_t)t.num_vars, false);
  for (const SizeExpr &e : t.exprs)
    for (int v : e.vars) used[(size_t)v] = true;
  for (int v = 0; v < t.num_vars; ++v)
    if (used[(size_t)v] && t.binding[(size_t)v].first < 0)
      jit::fail(jit::ErrorCode::Parse, "sized trace: s" + std::to_string(v) +
                                           " is not the size of any input dimension (write it alone as one, e.g. "
                                           "input f32[s" + std::to_string(v) + ",...])");
  // parse and verify at a sample: every variable 2 * the divisors' lcm (every size whole)
  int64_t l = 1;
  for (const SizeExpr &e : t.exprs) {
    l = std::lcm(l, e.div < 0 ? -e.div : e.div);
    if (l > (int64_t)1 << 20) jit::fail(jit::ErrorCode::Parse, "sized trace: divisors too large");
  }
  std::vector<int64_t> sample((size_t)t.num_vars, 2 * l);
  std::string inst = instantiate_sized(t, sample);
  try {
    jit::parse_trace(inst);
  } catch (const jit::Error &err) {
    jit::fail(err.code, "sized trace, checked at " + join_values(t, sample) + ": " + err.what());
  }
  return t;
}

bool bind_sizes(const SizedTemplate &t, const dynamo_arg *args, size_t nargs, std::vector<int64_t> *values,
                std::string *why) {
  if (nargs != t.input_dims.size()) {
    *why = "the call has " + std::to_string(nargs) + " argument(s), the sized trace " +
           std::to_string(t.input_dims.size()) + " input(s)";
    return false;
  }
  auto tensor_of = [&](int k) -> const DLTensor * {
    const dynamo_arg &a = args[k];
    if (a.kind != DYNAMO_ARG_TENSOR || !a.u.tensor) return nullptr;
    const DLTensor *x = a.u.tensor;
    if (x->ndim < 0 || x->ndim > DYNAMO_MAX_DIMS || (x->ndim > 0 && !x->shape)) return nullptr;
    return x;
  };
  values->assign((size_t)t.num_vars, 0);
  for (int v = 0; v < t.num_vars; ++v) {
    auto [k, d] = t.binding[(size_t)v];
    if (k < 0) continue;
    const DLTensor *x = tensor_of(k);
    if (!x || x->ndim != (int32_t)t.input_dims[(size_t)k].size()) {
      *why = "input " + std::to_string(k) + " is not a tensor of rank " + std::to_string(t.input_dims[(size_t)k].size());
      return false;
    }
    int64_t n = x->shape[d];
    if (n < 2) {
      *why = "s" + std::to_string(v) + " = input " + std::to_string(k) + "'s size " + std::to_string(d) + " is " +
             std::to_string(n) + " (a size variable is at least 2: sizes 0 and 1 change broadcasting; compile a "
             "trace of its own for them)";
      return false;
    }
    (*values)[(size_t)v] = n;
  }
  for (const SizeExpr &e : t.exprs) {
    int64_t v = 0;
    if (!eval(e, *values, &v)) {
      *why = e.text() + " is not a whole number at " + join_values(t, *values);
      return false;
    }
  }
  for (size_t k = 0; k < t.input_dims.size(); ++k) {
    const auto &dims = t.input_dims[k];
    bool symbolic = false;
    for (int x : dims) symbolic |= x >= 0;
    for (int x : t.input_strides[k]) symbolic |= x >= 0;
    if (!symbolic) continue;  // a plain input: its guards check it
    const DLTensor *x = tensor_of((int)k);
    if (!x || x->ndim != (int32_t)dims.size()) {
      *why = "input " + std::to_string(k) + " is not a tensor of rank " + std::to_string(dims.size());
      return false;
    }
    for (size_t d = 0; d < dims.size(); ++d) {
      int64_t want = t.input_plain[k][d];
      if (dims[d] >= 0 && !eval(t.exprs[(size_t)dims[d]], *values, &want)) {
        *why = "input " + std::to_string(k) + "'s size " + std::to_string(d) + " = " + t.exprs[(size_t)dims[d]].text() +
               " is not a whole number at " + join_values(t, *values);
        return false;
      }
      if (x->shape[d] != want) {
        std::string rel = dims[d] >= 0 ? " = " + t.exprs[(size_t)dims[d]].text() + " at " + join_values(t, *values) : "";
        *why = "input " + std::to_string(k) + "'s size " + std::to_string(d) + " is " + std::to_string(x->shape[d]) +
               ", the sized trace has " + std::to_string(want) + rel;
        return false;
      }
    }
    const auto &strides = t.input_strides[k];
    if (strides.empty()) continue;
    int64_t compact = 1;
    std::vector<int64_t> dense(dims.size());
    for (size_t d = dims.size(); d-- > 0;) {
      dense[d] = compact;
      compact *= x->shape[d];
    }
    for (size_t d = 0; d < strides.size() && d < dims.size(); ++d) {
      int64_t want = t.stride_plain[k][d];
      if (strides[d] >= 0 && !eval(t.exprs[(size_t)strides[d]], *values, &want)) {
        *why = "input " + std::to_string(k) + "'s stride " + std::to_string(d) + " is not a whole number at " +
               join_values(t, *values);
        return false;
      }
      int64_t got = x->strides ? x->strides[d] : dense[d];
      if (x->shape[d] > 1 && got != want) {
        *why = "input " + std::to_string(k) + "'s stride " + std::to_string(d) + " is " + std::to_string(got) +
               ", the sized trace has " + std::to_string(want) + " at " + join_values(t, *values);
        return false;
      }
    }
  }
  return true;
}

std::string instantiate_sized(const SizedTemplate &t, const std::vector<int64_t> &values) {
  std::string out;
  out.reserve(t.text.size() + 64);
  size_t at = 0;
  for (const SizeExpr &e : t.exprs) {
    int64_t v = 0;
    if (!eval(e, values, &v))
      jit::fail(jit::ErrorCode::Verify, "sized trace: " + e.text() + " is not a whole number (or past int64) at " +
                                            join_values(t, values));
    out.append(t.text, at, e.begin - at);
    out += std::to_string(v);
    at = e.end;
  }
  out.append(t.text, at, std::string::npos);
  return out;
}

}  // namespace dynamo::runtime
