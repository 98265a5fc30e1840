// test_reduce.cpp -- reductions and normalizations against LibTorch eager: every reduction x
// dims x keepdim x dtype, ties and NaNs, large sums, softmax / log_softmax / layer_norm /
// RMS norm on odd row lengths, fusion into one kernel, and thread counts 1 and 2.
#include <functional>

#include "aten_check.h"

using check::Value;

static dynamo_engine *g_engine;

namespace {

const at::ScalarType kDTypes[] = {at::kBool, at::kInt, at::kLong, at::kFloat, at::kDouble};

at::Tensor random(at::IntArrayRef sizes, at::ScalarType dt) {
  if (dt == at::kBool) return at::randint(0, 2, sizes, at::kLong).to(at::kBool);
  if (dt == at::kInt || dt == at::kLong) return at::randint(-3, 4, sizes, at::TensorOptions().dtype(dt));
  return at::randn(sizes, at::TensorOptions().dtype(dt));
}

std::string list(const std::vector<int64_t> &d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

int g_compared = 0;

bool check_case(const std::string &what, const std::vector<Value> &ins, const std::vector<std::string> &body,
                const std::function<at::Tensor()> &eager, double rtol = -1, double atol = -1) {
  at::Tensor want;
  std::string eager_err;
  try {
    want = eager();
  } catch (const std::exception &e) {
    eager_err = e.what();
  }
  check::Result r = check::run_text(g_engine, check::trace_text(ins, body, "%r"), ins);
  if (!eager_err.empty()) {
    if (r.status == DYNAMO_ERR_VERIFY) return true;
    fprintf(stderr, "%s: eager raises (%s) but dynamo gave %s\n", what.c_str(),
            eager_err.substr(0, eager_err.find('\n')).c_str(), dynamo_status_name(r.status));
    return false;
  }
  if (r.status != DYNAMO_OK) {
    fprintf(stderr, "%s: dynamo failed: %s: %s\n", what.c_str(), dynamo_status_name(r.status), r.error.c_str());
    return false;
  }
  ++g_compared;
  return check::same(r.outs[0], want, what, rtol, atol);
}

struct RedCase {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> dims;  // {} = all
  bool transpose;
};

const RedCase kCases[] = {
    {{1}, {{}, {0}}, false},
    {{7}, {{}, {0}, {-1}}, false},
    {{1023}, {{0}}, false},
    {{4097}, {{}}, false},
    {{6, 37}, {{1}, {0}, {}, {0, 1}, {-1}}, false},
    {{5, 3, 17}, {{2}, {0}, {1}, {0, 2}, {1, 2}, {}}, false},
    {{9, 33}, {{1}, {0}}, true},  // transposed (column-major) input
    {{4, 0, 3}, {{1}, {2}}, false},
    {{}, {{}}, false},
};

using RedRef = std::function<at::Tensor(const at::Tensor &, at::IntArrayRef, bool)>;

}  // namespace

static void test_reductions_every_dtype_dims_keepdim(void **state) {
  (void)state;
  struct Op {
    const char *name;
    RedRef ref;
  } ops[] = {
      {"sum", [](const at::Tensor &x, at::IntArrayRef d, bool k) { return at::sum(x, d, k); }},
      {"prod", [](const at::Tensor &x, at::IntArrayRef d, bool k) {
         if (d.size() == (size_t)x.dim() || x.dim() == 0) {  // ATen prod has no multi-dim overload
           at::Tensor r = at::prod(x);
           if (k) r = r.reshape(std::vector<int64_t>(x.dim(), 1));
           return r;
         }
         at::Tensor r = x;
         std::vector<int64_t> ds(d.begin(), d.end());
         for (auto &v : ds) v = v < 0 ? v + x.dim() : v;
         std::sort(ds.rbegin(), ds.rend());
         for (int64_t v : ds) r = at::prod(r, v, k);
         return r;
       }},
      {"mean", [](const at::Tensor &x, at::IntArrayRef d, bool k) { return at::mean(x, d, k); }},
      {"amax", [](const at::Tensor &x, at::IntArrayRef d, bool k) { return at::amax(x, d, k); }},
      {"amin", [](const at::Tensor &x, at::IntArrayRef d, bool k) { return at::amin(x, d, k); }},
  };
  int bad = 0;
  for (const Op &op : ops)
    for (at::ScalarType dt : kDTypes)
      for (const RedCase &c : kCases)
        for (const auto &dims : c.dims)
          for (bool keep : {false, true}) {
            at::Tensor x = random(c.shape, dt);
            if (c.transpose) x = random({c.shape[1], c.shape[0]}, dt).t();
            std::string what = std::string(op.name) + " " + check::type_text(x) + " dims " + list(dims) +
                               (keep ? " keepdim" : "");
            std::vector<Value> ins = {Value::tensor(x)};
            std::string body = "%r = " + std::string(op.name) + "(%0, " + list(dims) + ", " + (keep ? "true" : "false") + ")";
            // Full reduction in ATen: an explicit list of every dim.
            std::vector<int64_t> all = dims;
            if (all.empty())
              for (int64_t d = 0; d < x.dim(); ++d) all.push_back(d);
            bad += !check_case(what, ins, {body}, [&] { return op.ref(x, all, keep); });
          }
  assert_int_equal(bad, 0);
}

static void test_var_std_and_arg_reductions(void **state) {
  (void)state;
  int bad = 0;
  for (at::ScalarType dt : kDTypes)
    for (const RedCase &c : kCases)
      for (const auto &dims : c.dims)
        for (bool keep : {false, true}) {
          at::Tensor x = random(c.shape, dt);
          if (c.transpose) x = random({c.shape[1], c.shape[0]}, dt).t();
          std::vector<int64_t> all = dims;
          if (all.empty())
            for (int64_t d = 0; d < x.dim(); ++d) all.push_back(d);
          std::vector<Value> ins = {Value::tensor(x)};
          std::string k = keep ? "true" : "false";
          for (int64_t corr : {0, 1})
            for (const char *op : {"var", "std"}) {
              std::string what = std::string(op) + " " + check::type_text(x) + " dims " + list(dims) + " c" + std::to_string(corr) + (keep ? " keepdim" : "");
              bool is_var = op[0] == 'v';
              bad += !check_case(what, ins, {"%r = " + std::string(op) + "(%0, " + list(dims) + ", " + std::to_string(corr) + ", " + k + ")"},
                                 [&] { return is_var ? at::var(x, at::OptionalIntArrayRef(all), corr, keep) : at::std(x, at::OptionalIntArrayRef(all), corr, keep); });
            }
          // ATen rejects bool argmax/argmin except for degenerate shapes; we always reject it.
          if (dims.size() <= 1 && dt != at::kBool)
            for (const char *op : {"argmax", "argmin"}) {
              std::string d = dims.empty() ? "none" : std::to_string(dims[0]);
              std::string what = std::string(op) + " " + check::type_text(x) + " dim " + d + (keep ? " keepdim" : "");
              bool mx = op[3] == 'm' && op[4] == 'a';
              c10::optional<int64_t> od;
              if (!dims.empty()) od = dims[0];
              bool kk = dims.empty() ? false : keep;  // keepdim with dim=None differs across versions
              bad += !check_case(what, ins, {"%r = " + std::string(op) + "(%0, " + d + ", " + (kk ? "true" : "false") + ")"},
                                 [&] { return mx ? at::argmax(x, od, kk) : at::argmin(x, od, kk); });
            }
        }
  assert_int_equal(bad, 0);
}

static void test_ties_nans_and_infinities(void **state) {
  (void)state;
  int bad = 0;
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    auto o = at::TensorOptions().dtype(dt);
    std::vector<at::Tensor> rows = {
        at::tensor({1.0, 3.0, 3.0, 2.0, 3.0}, o),                       // ties: first index
        at::tensor({1.0, NAN, 5.0, NAN, -1.0}, o),                      // NaN wins, first one
        at::tensor({INFINITY, 1.0, -INFINITY, 2.0}, o),                 // sum -> nan, max inf
        at::tensor({INFINITY, 1.0, 2.0}, o),                            // sum stays inf
        at::tensor({-INFINITY, -INFINITY, -INFINITY}, o),               // argmax of all -inf: 0
        at::full({40}, 7.0, o),                                         // all equal, > one vector
    };
    for (const at::Tensor &x : rows) {
      std::vector<Value> ins = {Value::tensor(x)};
      std::string w = check::type_text(x) + " " + std::to_string(x[1].item<double>());
      bad += !check_case("argmax " + w, ins, {"%r = argmax(%0, 0, false)"}, [&] { return at::argmax(x, 0); });
      bad += !check_case("argmin " + w, ins, {"%r = argmin(%0, 0, false)"}, [&] { return at::argmin(x, 0); });
      bad += !check_case("amax " + w, ins, {"%r = amax(%0, [0], false)"}, [&] { return at::amax(x, {0}); });
      bad += !check_case("amin " + w, ins, {"%r = amin(%0, [0], false)"}, [&] { return at::amin(x, {0}); });
      bad += !check_case("sum " + w, ins, {"%r = sum(%0, [], false)"}, [&] { return at::sum(x); });
      bad += !check_case("var " + w, ins, {"%r = var(%0, [], 1, false)"}, [&] { return at::var(x); });
    }
    // Ties across vector lanes and rows, in a 2-D argmax over each dim.
    at::Tensor t = at::randint(0, 3, {37, 45}).to(dt);
    for (int64_t d : {0, 1}) {
      std::vector<Value> ins = {Value::tensor(t)};
      bad += !check_case("argmax ties dim " + std::to_string(d), ins, {"%r = argmax(%0, " + std::to_string(d) + ", false)"},
                         [&] { return at::argmax(t, d); });
      bad += !check_case("argmin ties dim " + std::to_string(d), ins, {"%r = argmin(%0, " + std::to_string(d) + ", false)"},
                         [&] { return at::argmin(t, d); });
    }
  }
  assert_int_equal(bad, 0);
}

// 2^24 float32 elements: the compensated sum must be at least as accurate as ATen's.
static void test_large_sum_accuracy(void **state) {
  (void)state;
  at::Tensor x = at::rand({1 << 24}) + 0.5;  // all positive: rounding errors do not cancel
  double exact = x.to(at::kDouble).sum().item<double>();
  check::Result r = check::run_text(g_engine, check::trace_text({Value::tensor(x)}, {"%r = sum(%0, [], false)"}, "%r"),
                                    {Value::tensor(x)});
  assert_int_equal(r.status, DYNAMO_OK);
  double ours = r.outs[0].item<double>(), aten = x.sum().item<double>();
  fprintf(stderr, "sum of 2^24: relative error dynamo %.2e, ATen %.2e\n", std::fabs(ours - exact) / exact,
          std::fabs(aten - exact) / exact);
  assert_true(std::fabs(ours - exact) <= std::max(std::fabs(aten - exact), 1e-7 * exact));
  r = check::run_text(g_engine, check::trace_text({Value::tensor(x)}, {"%r = var(%0, [], 1, false)"}, "%r"), {Value::tensor(x)});
  double vexact = x.to(at::kDouble).var().item<double>(), vat = x.var().item<double>(), vo = r.outs[0].item<double>();
  fprintf(stderr, "var of 2^24: relative error dynamo %.2e, ATen %.2e\n", std::fabs(vo - vexact) / vexact,
          std::fabs(vat - vexact) / vexact);
  assert_true(std::fabs(vo - vexact) <= std::max(std::fabs(vat - vexact), 1e-6 * vexact));
}

static const char *kSoftmax =
    "%m = amax(%0, [-1], true)\n  %s = sub(%0, %m)\n  %e = exp(%s)\n  %z = sum(%e, [-1], true)\n  %r = div(%e, %z)";
static const char *kLogSoftmax =
    "%m = amax(%0, [-1], true)\n  %s = sub(%0, %m)\n  %e = exp(%s)\n  %z = sum(%e, [-1], true)\n  %l = log(%z)\n  %r = sub(%s, %l)";
static const char *kLayerNorm =
    "%mu = mean(%0, [-1], true)\n  %v = var(%0, [-1], 0, true)\n  %ve = add(%v, 1e-05)\n  %rs = rsqrt(%ve)\n"
    "  %c = sub(%0, %mu)\n  %n = mul(%c, %rs)\n  %w = mul(%n, %1)\n  %r = add(%w, %2)";
static const char *kRmsNorm =
    "%sq = mul(%0, %0)\n  %ms = mean(%sq, [-1], true)\n  %me = add(%ms, 1e-06)\n  %rs = rsqrt(%me)\n  %n = mul(%0, %rs)\n"
    "  %r = mul(%n, %1)";

static void test_normalizations_odd_rows_one_kernel(void **state) {
  (void)state;
  int bad = 0;
  for (int64_t n : {1, 3, 17, 1000, 4097}) {
    for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
      at::Tensor x = at::randn({13, n}, at::TensorOptions().dtype(dt)) * 3;
      at::Tensor w = at::randn({n}, at::TensorOptions().dtype(dt)), b = at::randn({n}, at::TensorOptions().dtype(dt));
      std::vector<Value> one = {Value::tensor(x)}, three = {Value::tensor(x), Value::tensor(w), Value::tensor(b)};
      std::string sz = check::type_text(x);
      struct {
        const char *name, *body;
        std::vector<Value> ins;
        std::function<at::Tensor()> eager;
      } cases[] = {
          {"softmax", kSoftmax, one, [&] { return at::softmax(x, -1); }},
          {"log_softmax", kLogSoftmax, one, [&] { return at::log_softmax(x, -1); }},
          {"layer_norm", kLayerNorm, three, [&] { return at::layer_norm(x, {n}, w, b, 1e-5); }},
          {"rms_norm", kRmsNorm, {Value::tensor(x), Value::tensor(w)},
           [&] { return x * at::rsqrt((x * x).mean(-1, true) + 1e-6) * w; }},
          {"x - mean", "%mu = mean(%0, [-1], true)\n  %r = sub(%0, %mu)", one, [&] { return x - x.mean(-1, true); }},
      };
      for (auto &c : cases) {
        check::Result r = check::run_text(g_engine, check::trace_text(c.ins, {c.body}, "%r"), c.ins);
        if (r.status != DYNAMO_OK) {
          fprintf(stderr, "%s %s: %s\n", c.name, sz.c_str(), r.error.c_str());
          ++bad;
          continue;
        }
        ++g_compared;
        bad += !check::same(r.outs[0], c.eager(), std::string(c.name) + " " + sz, dt == at::kFloat ? 1e-4 : 1e-10,
                            dt == at::kFloat ? 1e-4 : 1e-12);
        if (r.stats.num_kernels != 1) {
          fprintf(stderr, "%s %s: %u kernels, expected one fused pass per row\n", c.name, sz.c_str(), r.stats.num_kernels);
          ++bad;
        }
      }
    }
  }
  // mean and var of one input share a Welford pass; a later stage's cached value (exp) must
  // still be stored and reloaded at the right stages.
  {
    at::Tensor x = at::randn({16, 300});
    std::string body =
        "%h = gelu(%0)\n  %mu = mean(%h, [1], true)\n  %v = var(%h, [1], 1, true)\n  %x2 = mul(%0, 0.5)\n"
        "  %e = exp(%x2)\n  %z = sum(%e, [1], true)\n  %c = sub(%h, %mu)\n  %n = div(%c, %v)\n  %q = div(%e, %z)\n"
        "  %r = add(%n, %q)";
    at::Tensor h = at::gelu(x), e = at::exp(x * 0.5);
    at::Tensor want = (h - h.mean(1, true)) / h.var(1, true, true) + e / e.sum(1, true);
    bad += !check_case("shared welford + later cached stage", {Value::tensor(x)}, {body}, [&] { return want; }, 1e-4, 1e-5);
  }
  // Softmax over a middle dim and over dim 0 (rows are strided): still exact.
  at::Tensor x = at::randn({6, 40, 7});
  for (int64_t d : {0, 1}) {
    std::string dd = std::to_string(d);
    std::string body = "%m = amax(%0, [" + dd + "], true)\n  %s = sub(%0, %m)\n  %e = exp(%s)\n  %z = sum(%e, [" + dd +
                       "], true)\n  %r = div(%e, %z)";
    bad += !check_case("softmax dim " + dd, {Value::tensor(x)}, {body}, [&] { return at::softmax(x, d); }, 1e-5, 1e-6);
  }
  assert_int_equal(bad, 0);
}

// The three outputs of layer norm (as aten::native_layer_norm returns them), in one kernel.
static void test_layer_norm_three_outputs(void **state) {
  (void)state;
  at::Tensor x = at::randn({32, 257}), w = at::randn({257}), b = at::randn({257});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(w), Value::tensor(b)};
  check::Result r = check::run_text(g_engine, check::trace_text(ins, {kLayerNorm}, "%r, %mu, %rs"), ins);
  assert_int_equal(r.status, DYNAMO_OK);
  auto ln = at::native_layer_norm(x, {257}, w, b, 1e-5);
  assert_true(check::same(r.outs[0], std::get<0>(ln), "ln out", 1e-4, 1e-5));
  assert_true(check::same(r.outs[1], std::get<1>(ln), "ln mean", 1e-5, 1e-6));
  assert_true(check::same(r.outs[2], std::get<2>(ln), "ln rstd", 1e-4, 1e-5));
  assert_int_equal(r.stats.num_kernels, 1);
}

// Reductions read somewhere other than their own row are materialized, and stay correct.
static void test_reduction_results_reused_elsewhere(void **state) {
  (void)state;
  at::Tensor x = at::randn({8, 8}), y = at::randn({8});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(y)};
  int bad = 0;
  // A non-keepdim row sum broadcast along the other dim (a column of the result, not its row).
  bad += !check_case("broadcast transposed", ins, {"%s = sum(%0, [1], false)\n  %r = add(%0, %s)"},
                     [&] { return x + x.sum(1); });
  bad += !check_case("reduce then reduce", ins, {"%s = sum(%0, [1], false)\n  %t = mul(%s, %1)\n  %r = amax(%t, [0], true)"},
                     [&] { return at::amax(x.sum(1) * y, {0}, true); });
  bad += !check_case("view of a reduction", ins, {"%s = mean(%0, [0], false)\n  %u = unsqueeze(%s, 0)\n  %r = sub(%0, %u)"},
                     [&] { return x - x.mean(0).unsqueeze(0); });
  bad += !check_case("extern of a reduction", ins,
                     {"%s = amax(%0, [1], true)\n  %m = extern aten::mm(%0, %s) : f32[8,1]\n  %r = add(%m, %s)"},
                     [&] { at::Tensor s = at::amax(x, {1}, true); return at::mm(x, s) + s; }, 1e-4, 1e-5);
  bad += !check_case("two groups", ins, {"%a = sum(%0, [0], true)\n  %b = sum(%0, [1], true)\n  %c = add(%0, %a)\n  %r = mul(%c, %b)"},
                     [&] { return (x + x.sum(0, true)) * x.sum(1, true); });
  assert_int_equal(bad, 0);
}

// ATen ops recorded as externs are rewritten into fused code (no LibTorch call left).
static void test_aten_decompositions_are_fused(void **state) {
  (void)state;
  at::Tensor x = at::randn({16, 301}), w = at::randn({301}), b = at::randn({301});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(w), Value::tensor(b)};
  struct Case {
    const char *body, *ret;
    std::vector<at::Tensor> want;
  } cases[] = {
      {"%r = extern aten::_softmax(%0, 1, false) : f32[16,301]", "%r", {at::_softmax(x, 1, false)}},
      {"%r = extern aten::_log_softmax(%0, -1, false) : f32[16,301]", "%r", {at::_log_softmax(x, -1, false)}},
      {"%r = extern aten::softmax.int(%0, 0) : f32[16,301]", "%r", {at::softmax(x, 0)}},
      {"%r, %m, %s = extern aten::native_layer_norm(%0, [301], %1, %2, 1e-05) : f32[16,301], f32[16,1], f32[16,1]",
       "%r, %m, %s",
       {std::get<0>(at::native_layer_norm(x, {301}, w, b, 1e-5)), std::get<1>(at::native_layer_norm(x, {301}, w, b, 1e-5)),
        std::get<2>(at::native_layer_norm(x, {301}, w, b, 1e-5))}},
      {"%r = extern aten::layer_norm(%0, [301], none, none, 1e-05, false) : f32[16,301]", "%r",
       {at::layer_norm(x, {301}, {}, {}, 1e-5)}},
      {"%g = extern aten::gelu(%0, \"tanh\") : f32[16,301]\n  %h = extern aten::silu(%g) : f32[16,301]\n"
       "  %r = extern aten::hardswish(%h) : f32[16,301]",
       "%r", {at::hardswish(at::silu(at::gelu(x, "tanh")))}},
      {"%r = extern aten::mean.dim(%0, [1], true) : f32[16,1]", "%r", {x.mean(1, true)}},
      {"%v, %m = extern aten::var_mean.correction(%0, [1], 1, true) : f32[16,1], f32[16,1]", "%v, %m",
       {std::get<0>(at::var_mean(x, at::OptionalIntArrayRef({1}), 1, true)),
        std::get<1>(at::var_mean(x, at::OptionalIntArrayRef({1}), 1, true))}},
      {"%a = extern aten::add.Tensor(%0, %1, 2) : f32[16,301]\n  %r = extern aten::amax(%a, [0], false) : f32[301]", "%r",
       {at::amax(x + 2 * w, {0})}},
  };
  int bad = 0;
  for (const Case &c : cases) {
    check::Result r = check::run_text(g_engine, check::trace_text(ins, {c.body}, c.ret), ins);
    if (r.status != DYNAMO_OK) {
      fprintf(stderr, "%s: %s\n", c.body, r.error.c_str());
      ++bad;
      continue;
    }
    for (size_t k = 0; k < c.want.size(); ++k) bad += !check::same(r.outs[k], c.want[k], c.body, 1e-4, 1e-5);
    if (r.stats.num_externs != 0) {
      fprintf(stderr, "%s: %u extern call(s) left\n", c.body, r.stats.num_externs);
      ++bad;
    }
  }
  // An overload we do not rewrite (an explicit dtype) stays an extern and stays correct.
  check::Result r = check::run_text(
      g_engine, check::trace_text(ins, {"%r = extern aten::sum.dim_IntList(%0, [1], false, f64) : f64[16]"}, "%r"), ins);
  assert_int_equal(r.status, DYNAMO_OK);
  assert_int_equal(r.stats.num_externs, 1);
  assert_true(check::same(r.outs[0], x.sum(1, false, at::kDouble), "sum with dtype"));
  assert_int_equal(bad, 0);
}

// float16 / bfloat16: loaded narrow, computed in float32, each op's result rounded to the
// narrow type (as eager rounds it); composite externs (softmax, layer norm) rounded once at their
// end, as ATen's kernels. The reference is eager ATen on the narrow tensors.
static void test_half_and_bfloat16(void **state) {
  (void)state;
  int bad = 0;
  for (at::ScalarType dt : {at::kHalf, at::kBFloat16}) {
    at::Tensor x = at::randn({37, 129}).to(dt), y = at::randn({129}).to(dt), w = at::randn({129}).to(dt);
    at::Tensor xf = x.to(at::kFloat), yf = y.to(at::kFloat);
    std::vector<Value> ins = {Value::tensor(x), Value::tensor(y), Value::tensor(w)};
    std::string tn = check::dtype_text(dt);
    struct Case {
      std::string body;
      at::Tensor want;
    } cases[] = {
        {"%r = add(%0, %1)", x + y},
        {"%a = mul(%0, 1.5)\n  %b = gelu(%a)\n  %r = sub(%b, %1)", at::gelu(x * 1.5) - y},
        {"%a = exp(%0)\n  %r = tanh(%a)", at::tanh(at::exp(x))},
        // exp(exp(x)) overflows the narrow type (float16: inf past 65504) before the multiply.
        {"%a = exp(%0)\n  %b = exp(%a)\n  %r = mul(%b, 0.0)", at::exp(at::exp(x)) * 0.0},
        {"%r = to(%0, f32)", xf},
        {"%a = to(%0, f32)\n  %r = to(%a, " + tn + ")", x},
        {"%r = gt(%0, %1)", xf > yf},
        {"%r = sum(%0, [1], false)", x.sum(1)},
        {"%r = mean(%0, [0], true)", x.mean(0, true)},
        {"%r = amax(%0, [], false)", x.amax()},
        {"%r = var(%0, [1], 1, false)", x.var(1)},
        {"%r = argmax(%0, 1, false)", x.argmax(1)},
        {"%r = extern aten::_softmax(%0, 1, false) : " + tn + "[37,129]", at::softmax(x, 1)},
        {"%r, %m, %s = extern aten::native_layer_norm(%0, [129], %2, %1, 1e-05) : " + tn + "[37,129], " + tn + "[37,1], " + tn + "[37,1]",
         at::layer_norm(x, {129}, w, y, 1e-5)},
    };
    for (const Case &c : cases) {
      check::Result r = check::run_text(g_engine, check::trace_text(ins, {c.body}, "%r"), ins);
      if (r.status != DYNAMO_OK) {
        fprintf(stderr, "%s %s: %s\n", tn.c_str(), c.body.c_str(), r.error.c_str());
        ++bad;
        continue;
      }
      ++g_compared;
      bad += !check::same(r.outs[0], c.want, tn + " " + c.body);
    }
    // Promotion: half + bfloat16 -> float32; half + float32 -> float32; half + Python float -> half.
    at::Tensor hb = at::randn({129}).to(dt == at::kHalf ? at::kBFloat16 : at::kHalf);
    std::vector<Value> mix = {Value::tensor(y), Value::tensor(hb), Value::real(0.25)};
    check::Result r = check::run_text(g_engine, check::trace_text(mix, {"%a = add(%0, %1)\n  %r = mul(%a, %2)"}, "%r"), mix);
    assert_int_equal(r.status, DYNAMO_OK);
    bad += !check::same(r.outs[0], (yf + hb.to(at::kFloat)) * 0.25, "half + bfloat16 promotes to float32");
    r = check::run_text(g_engine, check::trace_text(mix, {"%r = mul(%0, %2)"}, "%r"), mix);
    assert_int_equal(r.status, DYNAMO_OK);
    bad += !check::same(r.outs[0], (yf * 0.25).to(dt), "half * Python float stays half");
  }
  assert_int_equal(bad, 0);
}

// Whole-tensor reductions over >= 2^18 elements are split into 32 chunks reduced in parallel and
// merged in order: results match eager and do not depend on the thread count.
static void test_split_reductions(void **state) {
  (void)state;
  int bad = 0;
  const int64_t n = (1 << 19) + 7;
  at::Tensor x = at::randn({n});
  at::Tensor ties = at::randint(0, 3, {n}).to(at::kFloat);
  at::Tensor nan = x.clone();
  nan[n / 2 + 5] = NAN;
  nan[n - 3] = NAN;
  at::Tensor ints = at::randint(-1000, 1000, {n}, at::kLong);
  at::Tensor grid = at::randn({513, 1031});
  at::Tensor gridt = at::randn({1031, 513}).t();
  struct Case {
    const char *name, *body;
    at::Tensor in;
    std::function<at::Tensor(const at::Tensor &)> eager;
    double rtol, atol;
  } cases[] = {
      {"sum", "%r = sum(%0, [], false)", x, [](const at::Tensor &a) { return a.sum(); }, 1e-5, 1e-3},
      {"mean", "%r = mean(%0, [], true)", x, [](const at::Tensor &a) { return a.mean({0}, true); }, 1e-5, 1e-6},
      {"var", "%r = var(%0, [], 1, false)", x, [](const at::Tensor &a) { return a.var(); }, 1e-5, 1e-6},
      {"std", "%r = std(%0, [0], 0, false)", x, [](const at::Tensor &a) { return a.std(0, false); }, 1e-5, 1e-6},
      {"amax", "%r = amax(%0, [], false)", x, [](const at::Tensor &a) { return a.amax(); }, 0, 0},
      {"amin nan", "%r = amin(%0, [], false)", nan, [](const at::Tensor &a) { return a.amin(); }, 0, 0},
      {"argmax ties", "%r = argmax(%0, none, false)", ties, [](const at::Tensor &a) { return a.argmax(); }, 0, 0},
      {"argmin ties", "%r = argmin(%0, 0, false)", ties, [](const at::Tensor &a) { return a.argmin(0); }, 0, 0},
      {"argmax nan", "%r = argmax(%0, none, false)", nan, [](const at::Tensor &a) { return a.argmax(); }, 0, 0},
      {"int sum", "%r = sum(%0, [], false)", ints, [](const at::Tensor &a) { return a.sum(); }, 0, 0},
      {"prod", "%a = mul(%0, 0.001)\n  %b = add(%a, 1.0)\n  %r = prod(%b, [], false)", x,
       [](const at::Tensor &a) { return (a * 0.001 + 1.0).prod(); }, 1e-4, 1e-6},
      {"2-D sum", "%r = sum(%0, [0,1], false)", grid, [](const at::Tensor &a) { return a.sum(); }, 1e-5, 1e-3},
      {"2-D argmax", "%r = argmax(%0, none, false)", grid, [](const at::Tensor &a) { return a.argmax(); }, 0, 0},
      {"transposed var", "%r = var(%0, [], 1, false)", gridt, [](const at::Tensor &a) { return a.var(); }, 1e-5, 1e-6},
      {"fused producer + two reductions", "%e = exp(%0)\n  %r = sum(%e, [], false)\n  %m = amax(%e, [], false)", x,
       [](const at::Tensor &a) { return at::exp(a).sum(); }, 1e-5, 1e-2},
  };
  for (const Case &c : cases) {
    std::vector<Value> ins = {Value::tensor(c.in)};
    std::string text = check::trace_text(ins, {c.body}, "%r");
    int before = at::get_num_threads();
    at::set_num_threads(1);
    check::Result r1 = check::run_text(g_engine, text, ins);
    at::set_num_threads(2);
    check::Result r2 = check::run_text(g_engine, text, ins);
    at::set_num_threads(before);
    if (r1.status != DYNAMO_OK || r2.status != DYNAMO_OK) {
      fprintf(stderr, "%s: %s%s\n", c.name, r1.error.c_str(), r2.error.c_str());
      ++bad;
      continue;
    }
    ++g_compared;
    bad += !check::same(r2.outs[0], c.eager(c.in), std::string("split ") + c.name, c.rtol, c.atol);
    at::Tensor a = r1.outs[0], b = r2.outs[0];
    bool same_bits = a.is_floating_point() ? at::logical_or(a == b, at::logical_and(a.isnan(), b.isnan())).all().item<bool>()
                                           : at::equal(a, b);
    if (!same_bits) {
      fprintf(stderr, "split %s: 1 and 2 threads differ\n", c.name);
      ++bad;
    }
  }
  assert_int_equal(bad, 0);
}

static void test_thread_counts_agree(void **state) {
  (void)state;
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.num_threads = 1;
  dynamo_engine *serial = nullptr;
  assert_int_equal(dynamo_engine_create(&o, &serial), DYNAMO_OK);
  at::Tensor x = at::randn({512, 1000}), w = at::randn({1000}), b = at::randn({1000});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(w), Value::tensor(b)};
  std::string text = check::trace_text(ins, {kLayerNorm}, "%r");
  check::Result r1 = check::run_text(serial, text, ins);
  int before = at::get_num_threads();
  at::set_num_threads(2);
  check::Result r2 = check::run_text(g_engine, text, ins);
  at::set_num_threads(before);
  assert_int_equal(r1.status, DYNAMO_OK);
  assert_int_equal(r2.status, DYNAMO_OK);
  assert_true(at::equal(r1.outs[0], r2.outs[0]));  // rows are independent: identical bits
  assert_true(check::same(r2.outs[0], at::layer_norm(x, {1000}, w, b, 1e-5), "threads", 1e-4, 1e-5));
  dynamo_engine_destroy(serial);
}

int main(void) {
  at::manual_seed(7);
  if (dynamo_engine_create(NULL, &g_engine) != DYNAMO_OK) {
    fprintf(stderr, "engine: %s\n", dynamo_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reductions_every_dtype_dims_keepdim),
      cmocka_unit_test(test_var_std_and_arg_reductions),
      cmocka_unit_test(test_ties_nans_and_infinities),
      cmocka_unit_test(test_large_sum_accuracy),
      cmocka_unit_test(test_normalizations_odd_rows_one_kernel),
      cmocka_unit_test(test_layer_norm_three_outputs),
      cmocka_unit_test(test_reduction_results_reused_elsewhere),
      cmocka_unit_test(test_aten_decompositions_are_fused),
      cmocka_unit_test(test_half_and_bfloat16),
      cmocka_unit_test(test_split_reductions),
      cmocka_unit_test(test_thread_counts_agree),
  };
  int rc = cmocka_run_group_tests_name("reduce", tests, NULL, NULL);
  printf("reduce: %d compiled results compared with eager\n", g_compared);
  dynamo_engine_destroy(g_engine);
  return rc;
}
