// cases.h -- the traces the GPU check runs, their inputs, and the reference file format.
// Shared by gpu_refs (CPU results through libdynamo's C API, written on the build machine) and
// gpu_check (the same traces lowered to PTX and run on the device). Inputs are not shipped:
// both sides generate them from the element index with the same function.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace gpu_cases {

struct Case {
  const char *name;
  const char *trace;
  double rtol, atol;
  bool bench;  // also timed by gpu_check (large; bytes moved = inputs + outputs)
};

// Correctness cases cover pointwise math (libdevice), broadcasting, odd and zero sizes, strided
// views, integers, bool, half types, rows long (block per row) and short (row per thread), a
// reduction over a non-last dim, Welford rows longer than 2^16, and split whole-tensor sums.
inline const std::vector<Case> &cases() {
  static const std::vector<Case> c = {
      {"chain_math_f32",
       "trace @chain_math_f32 {\n  %0 = input f32[1023,1025]\n  %1 = input f32[1023,1025]\n"
       "  %2 = mul(%0, %1)\n  %3 = sigmoid(%2)\n  %4 = tanh(%0)\n  %5 = add(%3, %4)\n  %6 = gelu(%5)\n"
       "  %7 = erf(%1)\n  %8 = exp(%7)\n  %9 = abs(%0)\n  %10 = log1p(%9)\n  %11 = sqrt(%9)\n"
       "  %12 = add(%6, %8)\n  %13 = sub(%12, %10)\n  %14 = mul(%13, %11)\n  %15 = sin(%1)\n  %16 = cos(%0)\n"
       "  %17 = add(%14, %15)\n  %18 = div(%17, 3.0)\n  %19 = pow(%9, 1.5)\n  %20 = add(%18, %19)\n"
       "  %21 = sub(%20, %16)\n  return %21, %3\n}\n",
       2e-5, 2e-5, false},
      {"chain_f64",
       "trace @chain_f64 {\n  %0 = input f64[4097]\n  %1 = input f64[4097]\n  %2 = exp(%0)\n  %3 = log(%2)\n"
       "  %4 = mul(%3, %1)\n  %5 = tanh(%4)\n  %6 = gelu_tanh(%1)\n  %7 = add(%5, %6)\n  return %7\n}\n",
       1e-12, 1e-12, false},
      {"tiled_bias",
       "trace @tiled_bias {\n  %0 = input f32[512,1024]\n  %1 = input f32[1024]\n  %2 = add(%0, %1)\n"
       "  %3 = silu(%2)\n  return %3\n}\n",
       1e-6, 1e-6, false},
      {"scalar_inputs",
       "trace @scalar_inputs {\n  %0 = input f32[1000,33]\n  %1 = input f64\n  %2 = input i64\n"
       "  %3 = mul(%0, %1)\n  %4 = add(%3, %2)\n  %5 = sum(%4, [1], true)\n  %6 = div(%4, %5)\n  return %6\n}\n",
       1e-5, 1e-6, false},
      {"broadcast",
       "trace @broadcast {\n  %0 = input f32[64,1,7]\n  %1 = input f32[33,7]\n  %2 = input f32[7]\n"
       "  %3 = add(%0, %1)\n  %4 = mul(%3, %2)\n  %5 = relu(%4)\n  %6 = maximum(%5, %1)\n  return %6\n}\n",
       1e-6, 1e-6, false},
      {"strided_view",
       "trace @strided_view {\n  %0 = input f32[300,200]{1,300}\n  %1 = input f32[300,200]\n"
       "  %2 = add(%0, %1)\n  %3 = transpose(%2, 0, 1)\n  %4 = neg(%3)\n  return %4\n}\n",
       0, 0, false},
      {"ints_and_bools",
       "trace @ints_and_bools {\n  %0 = input i64[1000]\n  %1 = input i32[1000]\n  %2 = to(%1, i64) : i64[1000]\n"
       "  %3 = mul(%0, %2)\n  %4 = add(%3, 7)\n  %5 = gt(%4, 0)\n  %6 = where(%5, %4, %0)\n  %7 = floordiv(%6, 13)\n"
       "  return %7, %5\n}\n",
       0, 0, false},
      {"half_types",
       "trace @half_types {\n  %0 = input f16[7,33]\n  %1 = input bf16[33]\n  %2 = add(%0, %1)\n"
       "  %3 = amax(%2, [1], true)\n  %4 = argmax(%2, 1, false)\n  %5 = mul(%2, 0.5)\n  return %3, %4, %5\n}\n",
       1e-2, 1e-2, false},
      {"tiny_and_empty",
       "trace @tiny_and_empty {\n  %0 = input f32[1]\n  %1 = input f32[0,5]\n  %2 = exp(%0)\n  %3 = add(%1, 1.0)\n"
       "  %4 = sum(%1, [1], false)\n  return %2, %3, %4\n}\n",
       1e-6, 1e-6, false},
      {"softmax_rows",
       "trace @softmax_rows {\n  %0 = input f32[1000,4096]\n"
       "  %1 = extern aten::_softmax(%0, 1, false) : f32[1000,4096]\n  return %1\n}\n",
       1e-5, 1e-7, false},
      {"softmax_odd",
       "trace @softmax_odd {\n  %0 = input f32[7,1023]\n"
       "  %1 = extern aten::_softmax(%0, 1, false) : f32[7,1023]\n  return %1\n}\n",
       1e-5, 1e-7, false},
      {"layer_norm",
       "trace @layer_norm {\n  %0 = input f32[512,1024]\n  %1 = input f32[1024]\n  %2 = input f32[1024]\n"
       "  %3 = extern aten::layer_norm(%0, [1024], %1, %2, 1e-05, false) : f32[512,1024]\n  return %3\n}\n",
       1e-4, 1e-5, false},
      {"row_stats",
       "trace @row_stats {\n  %0 = input f32[333,777]\n  %1 = sum(%0, [1], false)\n  %2 = mean(%0, [1], true)\n"
       "  %3 = amax(%0, [1], false)\n  %4 = amin(%0, [1], false)\n  %5 = argmax(%0, 1, false)\n"
       "  %6 = std(%0, [1], 1, false)\n  %7 = sub(%0, %2)\n  return %1, %2, %3, %4, %5, %6, %7\n}\n",
       1e-5, 1e-5, false},
      {"short_rows",
       "trace @short_rows {\n  %0 = input f32[1000,17]\n  %1 = sum(%0, [1], true)\n  %2 = div(%0, %1)\n"
       "  %3 = amax(%0, [1], false)\n  return %2, %3\n}\n",
       1e-4, 1e-5, false},
      {"column_sums",
       "trace @column_sums {\n  %0 = input f32[1024,300]\n  %1 = sum(%0, [0], false)\n  %2 = var(%0, [0], 1, false)\n"
       "  return %1, %2\n}\n",
       1e-5, 1e-5, false},
      {"long_rows_welford",
       "trace @long_rows_welford {\n  %0 = input f32[4,100000]\n  %1 = var(%0, [1], 1, false)\n"
       "  %2 = mean(%0, [1], false)\n  return %1, %2\n}\n",
       1e-5, 1e-6, false},
      {"whole_tensor",
       "trace @whole_tensor {\n  %0 = input f32[1048577]\n  %1 = sum(%0, [], false)\n  %2 = var(%0, [], 1, false)\n"
       "  %3 = amax(%0, [], false)\n  return %1, %2, %3\n}\n",
       1e-5, 1e-4, false},
      {"gelu_ln_fused",
       "trace @gelu_ln_fused {\n  %0 = input f32[256,768]\n  %1 = input f32[768]\n  %2 = input f32[256,768]\n"
       "  %3 = input f32[768]\n  %4 = input f32[768]\n  %5 = add(%0, %1)\n  %6 = gelu(%5)\n  %7 = add(%6, %2)\n"
       "  %8 = extern aten::layer_norm(%7, [768], %3, %4, 1e-05, false) : f32[256,768]\n  return %8\n}\n",
       1e-4, 1e-5, false},
      // Benchmarks (also checked, on sampled elements).
      {"bench_chain",
       "trace @bench_chain {\n  %0 = input f32[67108864]\n  %1 = input f32[67108864]\n  %2 = mul(%0, %1)\n"
       "  %3 = add(%2, 1.0)\n  %4 = sigmoid(%3)\n  %5 = mul(%4, %0)\n  %6 = sub(%5, %1)\n  %7 = mul(%6, 0.5)\n"
       "  return %7\n}\n",
       1e-5, 1e-6, true},
      {"bench_softmax",
       "trace @bench_softmax {\n  %0 = input f32[16384,4096]\n"
       "  %1 = extern aten::_softmax(%0, 1, false) : f32[16384,4096]\n  return %1\n}\n",
       1e-5, 1e-8, true},
      {"bench_bias_gelu",
       "trace @bench_bias_gelu {\n  %0 = input f32[16384,4096]\n  %1 = input f32[4096]\n  %2 = add(%0, %1)\n"
       "  %3 = gelu(%2)\n  return %3\n}\n",
       1e-5, 1e-6, true},
      {"bench_sum",
       "trace @bench_sum {\n  %0 = input f32[67108864]\n  %1 = sum(%0, [], false)\n  %2 = amax(%0, [], false)\n"
       "  return %1, %2\n}\n",
       1e-5, 1e-3, true},
      {"bench_layer_norm",
       "trace @bench_layer_norm {\n  %0 = input f32[65536,1024]\n  %1 = input f32[1024]\n  %2 = input f32[1024]\n"
       "  %3 = extern aten::layer_norm(%0, [1024], %1, %2, 1e-05, false) : f32[65536,1024]\n  return %3\n}\n",
       1e-4, 1e-5, true},
  };
  return c;
}

// -- inputs --------------------------------------------------------------------------------

struct InputSpec {
  std::string dtype;             // "f32", "f64", "f16", "bf16", "i32", "i64", "bool"
  std::vector<int64_t> sizes, strides;
  int64_t storage = 0;           // elements backing the view
  bool scalar = false;           // `input f64` / `input i64` / `input bool`: passed by value
};

// The value a scalar input `which` gets (both sides use it): f64 0.75, 1.25, ...; i64 3, 4, ...
inline double scalar_value(const InputSpec &s, int which) {
  if (s.dtype == "f64") return 0.75 + 0.5 * which;
  if (s.dtype == "bool") return 1;
  return 3 + which;
}

// The `%k = input <dtype>[sizes]{strides}` lines of a trace, in order.
inline std::vector<InputSpec> input_specs(const char *trace) {
  std::vector<InputSpec> out;
  for (const char *p = strstr(trace, "= input "); p; p = strstr(p + 1, "= input ")) {
    InputSpec s;
    p += 8;
    while (*p && *p != '[' && *p != ' ' && *p != '\n') s.dtype += *p++;
    if (*p != '[') {
      s.scalar = true;
      out.push_back(s);
      continue;
    }
    auto nums = [&](char close) {
      std::vector<int64_t> v;
      ++p;
      while (*p != close) {
        v.push_back(strtoll(p, const_cast<char **>(&p), 10));
        if (*p == ',') ++p;
      }
      ++p;
      return v;
    };
    s.sizes = nums(']');
    if (*p == '{') {
      s.strides = nums('}');
    } else {
      s.strides.assign(s.sizes.size(), 1);
      for (size_t d = s.sizes.size(); d-- > 1;) s.strides[d - 1] = s.strides[d] * s.sizes[d];
    }
    s.storage = 1;
    for (size_t d = 0; d < s.sizes.size(); ++d) {
      if (s.sizes[d] == 0) s.storage = 0;
      if (s.storage) s.storage += (s.sizes[d] - 1) * s.strides[d];
    }
    out.push_back(s);
  }
  return out;
}

inline int elem_bytes(const std::string &dt) {
  if (dt == "f64" || dt == "i64") return 8;
  if (dt == "f16" || dt == "bf16") return 2;
  if (dt == "bool") return 1;
  return 4;
}

inline uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint16_t f32_to_f16(float f) {  // round to nearest even; inputs are small normals
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if (e <= 0) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return (uint16_t)h;
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t x;
  if (e == 0) {
    float f = std::ldexp((float)m, -24);
    return sign ? -f : f;
  }
  if (e == 31) x = sign | 0x7f800000 | (m << 13);
  else x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

// Fills the storage of input `which` (values in [-3, 3), integers in [-50, 50], half types
// rounded to their precision).
inline std::vector<uint8_t> make_input(const InputSpec &s, int which) {
  int eb = elem_bytes(s.dtype);
  std::vector<uint8_t> buf((size_t)(s.storage * eb) + 1);
  for (int64_t i = 0; i < s.storage; ++i) {
    uint64_t r = mix(((uint64_t)which << 40) ^ (uint64_t)i);
    double u = (double)(r >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    uint8_t *p = buf.data() + i * eb;
    if (s.dtype == "f32") {
      float v = (float)(u * 6 - 3);
      memcpy(p, &v, 4);
    } else if (s.dtype == "f64") {
      double v = u * 6 - 3;
      memcpy(p, &v, 8);
    } else if (s.dtype == "f16") {
      uint16_t h = f32_to_f16((float)(u * 6 - 3));
      memcpy(p, &h, 2);
    } else if (s.dtype == "bf16") {
      float v = (float)(u * 6 - 3);
      uint32_t x;
      memcpy(&x, &v, 4);
      uint16_t h = (uint16_t)(x >> 16);  // truncation: exactly representable afterwards
      memcpy(p, &h, 2);
    } else if (s.dtype == "i32") {
      int32_t v = (int32_t)(r % 101) - 50;
      memcpy(p, &v, 4);
    } else if (s.dtype == "i64") {
      int64_t v = (int64_t)(r % 101) - 50;
      memcpy(p, &v, 8);
    } else {
      *p = (uint8_t)(r & 1);
    }
  }
  return buf;
}

// Element i of a contiguous buffer of dtype dt, as a double.
inline double element(const uint8_t *p, const std::string &dt, int64_t i) {
  p += i * elem_bytes(dt);
  if (dt == "f32") { float v; memcpy(&v, p, 4); return v; }
  if (dt == "f64") { double v; memcpy(&v, p, 8); return v; }
  if (dt == "i32") { int32_t v; memcpy(&v, p, 4); return v; }
  if (dt == "i64") { int64_t v; memcpy(&v, p, 8); return (double)v; }
  if (dt == "f16") { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
  if (dt == "bf16") { uint16_t h; memcpy(&h, p, 2); uint32_t x = (uint32_t)h << 16; float v; memcpy(&v, &x, 4); return v; }
  return *p ? 1.0 : 0.0;
}

// -- references ------------------------------------------------------------------------------
// <dir>/<case>.ref: per output, int64 numel, int64 step, int64 count, then `count` doubles:
// elements 0, step, 2 step, ... (all of them for outputs up to 2^18 elements), then the
// Summary of every element (kSummaryFields doubles).
inline int64_t sample_step(int64_t numel) { return numel <= (1 << 18) ? 1 : (numel + (1 << 16) - 1) >> 16; }

// What every element of an output adds up to: the checks of large outputs, whose elements are
// only sampled one by one, still look at all of them. gpu_check fills outputs with all-ones
// words before each checked run (a NaN in every float type, -1 in the integers, 0xff in a
// bool), so an element a kernel skipped shows as a NaN, an invalid bool or a wrong sum.
struct Summary {
  double nan = 0, pos_inf = 0, neg_inf = 0, invalid = 0;  // counts; invalid: bool bytes other than 0/1
  double sum = 0, abs_sum = 0;                            // over the finite elements
};
constexpr int kSummaryFields = 6;

inline Summary summarize(const uint8_t *p, const std::string &dt, int64_t numel) {
  Summary s;
  for (int64_t i = 0; i < numel; ++i) {
    if (dt == "bool" && p[i] > 1) { s.invalid += 1; continue; }
    double v = element(p, dt, i);
    if (std::isnan(v)) s.nan += 1;
    else if (std::isinf(v)) (v > 0 ? s.pos_inf : s.neg_inf) += 1;
    else { s.sum += v; s.abs_sum += std::fabs(v); }
  }
  return s;
}

// Whether summary `got` (the GPU's) fits `want` (the CPU's): the same counts of NaN, infinities
// and invalid bools, and sums apart by no more than every element could be (atol per element,
// rtol of the sum of magnitudes; exact for integers and bools). Else false and *why.
inline bool summary_fits(const Summary &got, const Summary &want, const std::string &dt, int64_t numel, double rtol,
                         double atol, std::string *why) {
  char buf[256];
  if (got.nan != want.nan || got.pos_inf != want.pos_inf || got.neg_inf != want.neg_inf || got.invalid != want.invalid) {
    snprintf(buf, sizeof buf, "NaN/+inf/-inf/invalid counts %.0f/%.0f/%.0f/%.0f, the CPU's %.0f/%.0f/%.0f/%.0f "
             "(an element not written keeps the fill)", got.nan, got.pos_inf, got.neg_inf, got.invalid, want.nan,
             want.pos_inf, want.neg_inf, want.invalid);
    *why = buf;
    return false;
  }
  bool exact = dt == "i32" || dt == "i64" || dt == "bool";
  double slack = exact ? 0 : atol * (double)numel + rtol * want.abs_sum + 1e-12 * want.abs_sum;
  if (std::fabs(got.sum - want.sum) > slack || std::fabs(got.abs_sum - want.abs_sum) > slack) {
    snprintf(buf, sizeof buf, "sum of all elements %.9g (of magnitudes %.9g), the CPU's %.9g (%.9g), allowed %.3g",
             got.sum, got.abs_sum, want.sum, want.abs_sum, slack);
    *why = buf;
    return false;
  }
  return true;
}

struct Ref {
  int64_t numel = 0, step = 1;
  std::vector<double> values;
  Summary whole;
};

inline bool write_refs(const std::string &path, const std::vector<Ref> &refs) {
  FILE *f = fopen(path.c_str(), "wb");
  if (!f) return false;
  for (const Ref &r : refs) {
    int64_t h[3] = {r.numel, r.step, (int64_t)r.values.size()};
    fwrite(h, sizeof h, 1, f);
    fwrite(r.values.data(), sizeof(double), r.values.size(), f);
    double w[kSummaryFields] = {r.whole.nan, r.whole.pos_inf, r.whole.neg_inf, r.whole.invalid, r.whole.sum,
                                r.whole.abs_sum};
    fwrite(w, sizeof w, 1, f);
  }
  return fclose(f) == 0;
}

inline bool read_refs(const std::string &path, std::vector<Ref> *refs) {
  FILE *f = fopen(path.c_str(), "rb");
  if (!f) return false;
  int64_t h[3];
  while (fread(h, sizeof h, 1, f) == 1) {
    Ref r;
    r.numel = h[0];
    r.step = h[1];
    r.values.resize((size_t)h[2]);
    if (fread(r.values.data(), sizeof(double), r.values.size(), f) != r.values.size()) break;
    double w[kSummaryFields];
    if (fread(w, sizeof w, 1, f) != 1) break;
    r.whole = Summary{w[0], w[1], w[2], w[3], w[4], w[5]};
    refs->push_back(std::move(r));
  }
  fclose(f);
  return true;
}

}  // namespace gpu_cases
