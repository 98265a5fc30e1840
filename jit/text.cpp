// text.cpp -- the trace IR's text form: a canonical printer and a parser with line/column errors.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "ir.h"

namespace dynamo::jit {

/* -- Printer -- */

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {  // shortest text that reads back exactly
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

static std::string join_ints(const std::vector<int64_t> &v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string print_operand(const Operand &o) {
  switch (o.kind) {
    case Operand::Value: return "%" + std::to_string(o.value);
    case Operand::Int: return std::to_string(o.i);
    case Operand::Float: return format_double(o.f);
    case Operand::Bool: return o.i ? "true" : "false";
    case Operand::None: return "none";
    case Operand::IntList: return "[" + join_ints(o.list) + "]";
    case Operand::TensorList: return "[" + std::to_string(o.i) + " tensors]";  // printed whole by print_trace
    case Operand::Ident: return o.s;
    case Operand::Str: {
      std::string s = "\"";
      for (char c : o.s) {
        if (c == '"' || c == '\\') s += '\\';
        s += c;
      }
      return s + "\"";
    }
  }
  return "?";
}

std::string print_type(const Type &t, bool input) {
  std::string s = dtype_name(t.dtype);
  if (!t.tensor) return s;
  s += "[" + join_ints(t.sizes) + "]";
  if (input) {
    if (!t.strides.empty() && t.strides != contiguous_strides(t.sizes))
      s += "{" + join_ints(t.strides) + "}";
    if (t.device.kind == DeviceKind::CUDA) s += " cuda:" + std::to_string(t.device.index);
    if (t.requires_grad) s += " requires_grad";
    if (t.weight) s += " weight";
  }
  return s;
}

std::string print_trace(const Trace &t) {
  std::ostringstream os;
  os << "trace @" << t.name << " {\n";
  for (const Inst &in : t.insts) {
    os << "  ";
    for (size_t r = 0; r < in.results.size(); ++r) os << (r ? ", " : "") << "%" << in.results[r];
    os << " = ";
    if (in.op == Op::input) {
      os << "input " << print_type(t.types[in.results[0]], true);
      if (in.has_guard_value) os << " == " << print_operand(in.guard_value);
      os << "\n";
      continue;
    }
    os << op_info(in.op).name;
    if (in.op == Op::extern_) os << " " << in.callee;
    os << "(";
    for (size_t a = 0; a < in.args.size(); ++a) {
      os << (a ? ", " : "");
      if (in.args[a].kind == Operand::TensorList) {  // the marker, then its elements
        size_t n = (size_t)in.args[a].i;
        os << "[";
        for (size_t e = 0; e < n && a + 1 < in.args.size(); ++e) os << (e ? ", " : "") << print_operand(in.args[++a]);
        os << "]";
      } else {
        os << print_operand(in.args[a]);
      }
    }
    os << ") : ";
    for (size_t r = 0; r < in.results.size(); ++r)
      os << (r ? ", " : "") << print_type(t.types[in.results[r]], false);
    os << "\n";
  }
  os << "  return";
  for (size_t i = 0; i < t.outputs.size(); ++i) os << (i ? ", %" : " %") << t.outputs[i];
  os << "\n}\n";
  return os.str();
}

/* -- Parser -- */

namespace {

struct Parser {
  const std::string &src;
  size_t pos = 0;
  Trace &t;
  std::map<std::string, int32_t> names;

  Parser(const std::string &s, Trace &tr) : src(s), t(tr) {}

  [[noreturn]] void error(const std::string &expected, size_t at = std::string::npos) {
    if (at == std::string::npos) at = pos;
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < src.size(); ++i) {
      if (src[i] == '\n') { ++line; col = 1; } else ++col;
    }
    std::string found;
    if (at >= src.size()) found = "end of input";
    else {
      size_t e = at;
      while (e < src.size() && e - at < 12 && src[e] != '\n') ++e;
      found = "'";
      for (size_t i = at; i < e; ++i) {  // bytes that would not print (a NUL, control codes) as \xNN
        unsigned char b = (unsigned char)src[i];
        if (b >= 0x20 && b < 0x7f) {
          found += (char)b;
        } else {
          char hex[8];
          snprintf(hex, sizeof hex, "\\x%02x", b);
          found += hex;
        }
      }
      found += "'";
    }
    fail(ErrorCode::Parse, "line " + std::to_string(line) + ", column " + std::to_string(col) +
                               ": expected " + expected + ", found " + found);
  }

  void skip_space(bool newlines = true) {
    while (pos < src.size()) {
      char c = src[pos];
      if (c == '#') {
        while (pos < src.size() && src[pos] != '\n') ++pos;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos;
      } else break;
    }
  }
  bool peek(char c) { skip_space(); return pos < src.size() && src[pos] == c; }
  bool accept(char c) {
    if (peek(c)) { ++pos; return true; }
    return false;
  }
  void expect(char c, const char *what) {
    if (!accept(c)) error(what);
  }
  static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.' || c == ':'; }
  std::string ident() {
    skip_space();
    size_t s = pos;
    while (pos < src.size() && ident_char(src[pos])) ++pos;
    return src.substr(s, pos - s);
  }
  bool accept_word(const char *w) {
    skip_space();
    size_t save = pos;
    std::string id = ident();
    if (id == w) return true;
    pos = save;
    return false;
  }
  int64_t integer(const char *what) {
    skip_space();
    size_t s = pos;
    if (pos < src.size() && (src[pos] == '-' || src[pos] == '+')) ++pos;
    if (pos >= src.size() || !isdigit((unsigned char)src[pos])) error(what, s);
    while (pos < src.size() && isdigit((unsigned char)src[pos])) ++pos;
    errno = 0;
    long long v = strtoll(src.c_str() + s, nullptr, 10);
    if (errno == ERANGE) error("an integer that fits in 64 bits", s);
    return v;
  }
  std::vector<int64_t> int_list(char open, char close, const char *what) {
    std::vector<int64_t> v;
    expect(open, what);
    if (accept(close)) return v;
    do v.push_back(integer("an integer")); while (accept(','));
    expect(close, close == ']' ? "',' or ']'" : "',' or '}'");
    return v;
  }
  std::string value_name() {
    skip_space();
    if (pos >= src.size() || src[pos] != '%') error("a value name like %3");
    ++pos;
    size_t s = pos;
    while (pos < src.size() && (isalnum((unsigned char)src[pos]) || src[pos] == '_')) ++pos;
    if (pos == s) error("a value name after '%'");
    return src.substr(s, pos - s);
  }
  int32_t value_ref() {
    size_t at = (skip_space(), pos);
    std::string n = value_name();
    auto it = names.find(n);
    if (it == names.end()) error("a defined value (%" + n + " is used before it is defined)", at);
    return it->second;
  }

  Type type(bool input) {
    Type ty;
    size_t at = (skip_space(), pos);
    std::string dn = ident();
    if (!dtype_from_name(dn, &ty.dtype)) error("a dtype (bool, i32, i64, f16, bf16, f32, f64)", at);
    skip_space(false);
    if (pos < src.size() && src[pos] == '[') {
      ty.sizes = int_list('[', ']', "'['");
      for (int64_t s : ty.sizes)
        if (s < 0) error("non-negative sizes", at);
      if (input) {
        skip_space(false);
        if (pos < src.size() && src[pos] == '{') {
          size_t sat = pos;
          ty.strides = int_list('{', '}', "'{'");
          if (ty.strides.size() != ty.sizes.size()) error("one stride per dimension", sat);
          if (ty.strides == contiguous_strides(ty.sizes)) ty.strides.clear();
        }
        if (accept_word("cpu")) {
        } else {
          skip_space(false);
          size_t save = pos;
          std::string w = ident();
          if (w.rfind("cuda:", 0) == 0) {
            // a decimal device index, as torch writes it: not "cuda:0x1", "cuda:abc", "cuda:-1"
            std::string num = w.substr(5);
            bool digits = !num.empty() && num.size() <= 10 &&
                          num.find_first_not_of("0123456789") == std::string::npos;
            long long idx = digits ? std::stoll(num) : -1;
            if (!digits || idx > INT32_MAX) error("a device index after 'cuda:' (a decimal number, 0 to 2147483647)", save);
            ty.device.kind = DeviceKind::CUDA;
            ty.device.index = (int)idx;
          } else pos = save;
        }
        if (accept_word("requires_grad")) ty.requires_grad = true;
        if (accept_word("weight")) ty.weight = true;
      }
    } else {
      ty.tensor = false;
      if (ty.dtype != DType::I64 && ty.dtype != DType::F64 && ty.dtype != DType::Bool)
        error("a scalar type (i64, f64, bool) or a tensor type like f32[4,8]", at);
    }
    return ty;
  }

  // At '[' followed by %value or none (an int list has digits).
  bool tensor_list_ahead() {
    skip_space();
    if (pos >= src.size() || src[pos] != '[') return false;
    size_t q = pos + 1;
    while (q < src.size() && (src[q] == ' ' || src[q] == '\t')) ++q;
    return q < src.size() && (src[q] == '%' || src.compare(q, 4, "none") == 0);
  }

  Operand operand() {
    skip_space();
    if (pos >= src.size()) error("an operand");
    char c = src[pos];
    if (c == '%') return Operand::val(value_ref());
    if (c == '[') { Operand o; o.kind = Operand::IntList; o.list = int_list('[', ']', "'['"); return o; }
    if (c == '"') {
      Operand o; o.kind = Operand::Str;
      ++pos;
      while (pos < src.size() && src[pos] != '"') {
        if (src[pos] == '\\' && pos + 1 < src.size()) ++pos;
        o.s += src[pos++];
      }
      if (pos >= src.size()) error("a closing '\"'");
      ++pos;
      return o;
    }
    if (isdigit((unsigned char)c) || c == '-' || c == '+' || digit_after_point(pos)) return number();
    size_t at = pos;
    std::string id = ident();
    if (id.empty()) error("an operand (%value, number, [list], true/false/none, dtype or \"text\")", at);
    if (id == "true" || id == "false") return Operand::boolean(id == "true");
    if (id == "none") return Operand{};
    if (id == "inf") return Operand::real(INFINITY);
    if (id == "nan") return Operand::real(NAN);
    Operand o; o.kind = Operand::Ident; o.s = id;
    return o;
  }
  bool digit_after_point(size_t at) const {  // ".5": a number without its leading zero
    return at + 1 < src.size() && src[at] == '.' && isdigit((unsigned char)src[at + 1]);
  }
  Operand number() {
    size_t s = pos;
    bool neg = false;
    if (src[pos] == '-' || src[pos] == '+') { neg = src[pos] == '-'; ++pos; }
    if (src.compare(pos, 3, "inf") == 0) { pos += 3; return Operand::real(neg ? -INFINITY : INFINITY); }
    if (src.compare(pos, 3, "nan") == 0) { pos += 3; return Operand::real(NAN); }
    if (pos >= src.size() || !(isdigit((unsigned char)src[pos]) || digit_after_point(pos))) error("a number", s);
    bool is_float = false;
    while (pos < src.size()) {
      char c = src[pos];
      if (isdigit((unsigned char)c)) { ++pos; continue; }
      if (c == '.' ) { is_float = true; ++pos; continue; }
      if ((c == 'e' || c == 'E')) {
        is_float = true; ++pos;
        if (pos < src.size() && (src[pos] == '-' || src[pos] == '+')) ++pos;
        continue;
      }
      break;
    }
    std::string text = src.substr(s, pos - s);
    char *end = nullptr;
    errno = 0;
    if (is_float) {
      double v = strtod(text.c_str(), &end);
      if (*end) error("a number", s);
      return Operand::real(v);
    }
    long long v = strtoll(text.c_str(), &end, 10);
    if (*end || errno == ERANGE) error("an integer that fits in 64 bits", s);
    return Operand::integer(v);
  }

  // Parses "op(args) [: types]" or "input type [== lit]" and appends the instruction.
  void instruction_body(const std::vector<std::string> &result_names, size_t at) {
    Inst in;
    size_t op_at = (skip_space(), pos);
    std::string opname = ident();
    Op op;
    if (opname.empty() || !op_from_name(opname, &op))
      error("an operation name (add, exp, reshape, extern, input, ...)", op_at);
    in.op = op;
    std::vector<Type> annotated;
    if (op == Op::input) {
      annotated.push_back(type(true));
      if (accept('=')) {
        expect('=', "'=='");
        in.has_guard_value = true;
        in.guard_value = operand();
        if (!in.guard_value.is_scalar_literal()) error("a literal guard value", pos);
      }
    } else {
      if (op == Op::extern_) {
        size_t cat = (skip_space(), pos);
        in.callee = ident();
        if (in.callee.find("::") == std::string::npos) error("an op schema name like aten::addmm", cat);
        if (in.callee == "dynamo::guard") {  // the side exit's earlier spelling: the guard op
          op = in.op = Op::guard;
          in.callee.clear();
        }
      }
      expect('(', "'('");
      if (!accept(')')) {
        do {
          if (tensor_list_ahead()) {  // [%a, %b, none]: a TensorList marker and its elements
            if (in.op != Op::extern_) error("a list of values (only extern arguments take tensor lists)");
            ++pos;
            Operand head;
            head.kind = Operand::TensorList;
            size_t at = in.args.size();
            in.args.push_back(head);
            do {
              Operand e = operand();
              if (e.kind != Operand::Value && e.kind != Operand::None) error("a %value or none in a tensor list");
              in.args.push_back(e);
            } while (accept(','));
            expect(']', "',' or ']'");
            in.args[at].i = (int64_t)(in.args.size() - at - 1);
          } else {
            in.args.push_back(operand());
          }
        } while (accept(','));
        expect(')', "',' or ')'");
      }
      skip_space(false);
      if (pos < src.size() && src[pos] == ':') {
        ++pos;
        do annotated.push_back(type(false)); while (accept(','));
      }
    }
    std::string where = "instruction '" + (result_names.empty() ? std::string("?") : "%" + result_names[0]) +
                        " = " + op_info(op).name + "'";
    for (const std::string &n : result_names)
      if (names.count(n)) error("a new value name (%" + n + " is already defined)", at);
    std::vector<Type> types;
    if (op == Op::input) {
      types = annotated;
    } else {
      try {
        types = infer_types(t, in, where);
      } catch (const Error &e) {
        error_verify(e.what(), at);
      }
      if (op_info(op).kind == OpKind::EXTERN) {
        if (annotated.empty()) error("': type' after an extern (its result types)");
        types = annotated;
        // Results are where the tensor operands are (one device, as ATen requires): the
        // annotation names no device.
        Device dev;
        bool have = false, one = true;
        for (const Operand &o : in.args)
          if (o.kind == Operand::Value && t.types[o.value].tensor) {
            one = one && (!have || t.types[o.value].device == dev);
            dev = t.types[o.value].device;
            have = true;
          }
        if (have && one)
          for (Type &r : types)
            if (r.tensor) r.device = dev;
      } else if (!annotated.empty()) {
        if (annotated.size() != types.size())
          error_verify(where + ": " + std::to_string(annotated.size()) + " result types annotated, the op has " +
                       std::to_string(types.size()) + " result(s)", at);
        if (annotated[0].dtype != types[0].dtype ||
            annotated[0].sizes != types[0].sizes || annotated[0].tensor != types[0].tensor)
          error_verify(where + ": annotated type " + print_type(annotated[0], false) +
                       " differs from the inferred " + print_type(types[0], false), at);
      }
    }
    if (!result_names.empty() && result_names.size() != types.size())
      error(std::to_string(types.size()) + " result name(s)", at);
    for (size_t r = 0; r < types.size(); ++r) {  // before anything sizes memory by it
      std::string why = type_size_problem(types[r]);
      if (!why.empty())
        error_verify(where + ": " + (r < result_names.size() ? "%" + result_names[r] + ": " : "") + why, at);
    }
    int32_t idx = (int32_t)t.insts.size();
    for (size_t r = 0; r < types.size(); ++r) {
      int32_t v = t.new_value(types[r], idx);
      in.results.push_back(v);
      if (!result_names.empty()) names[result_names[r]] = v;
    }
    if (op == Op::input) t.inputs.push_back(in.results[0]);
    t.insts.push_back(std::move(in));
  }

  [[noreturn]] void error_verify(const std::string &msg, size_t at) {
    int line = 1;
    for (size_t i = 0; i < at && i < src.size(); ++i) if (src[i] == '\n') ++line;
    fail(ErrorCode::Verify, "line " + std::to_string(line) + ": " + msg);
  }

  void trace() {
    if (!accept_word("trace")) error("'trace'");
    skip_space();
    if (accept('@')) {
      std::string n = ident();
      if (n.empty()) error("a trace name after '@'");
      t.name = n;
    }
    expect('{', "'{'");
    for (;;) {
      skip_space();
      size_t at = pos;
      if (accept_word("return")) {
        skip_space(false);
        if (pos < src.size() && src[pos] == '%') {
          do t.outputs.push_back(value_ref()); while (accept(','));
        }
        expect('}', "',' or '}' after the returned values");
        skip_space();
        if (pos != src.size()) error("end of input after '}'");
        return;
      }
      if (pos >= src.size()) error("an instruction or 'return'");
      std::vector<std::string> rn;
      do rn.push_back(value_name()); while (accept(','));
      expect('=', "'='");
      instruction_body(rn, at);
    }
  }
};

}  // namespace

Trace parse_trace(const std::string &text) {
  Trace t;
  Parser p(text, t);
  p.trace();
  verify_trace(t);
  return t;
}

int32_t parse_instruction_into(Trace &t, const std::string &line) {
  Trace scratch = t;  // the trace is unchanged if the line is rejected
  Parser p(line, scratch);
  for (size_t v = 0; v < scratch.types.size(); ++v) p.names[std::to_string(v)] = (int32_t)v;
  p.instruction_body({}, 0);
  p.skip_space();
  if (p.pos != line.size()) p.error("end of the instruction");
  t = std::move(scratch);
  return t.insts.back().results.empty() ? -1 : t.insts.back().results[0];
}

}  // namespace dynamo::jit
