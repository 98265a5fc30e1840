// test_fusion.cpp -- fused DAGs, views folded into indexing, extern ops between fused groups,
// dynamic scalar inputs and thread counts, each compared with LibTorch eager.
#include "aten_check.h"

using check::Value;

static dynamo_engine *g_engine;

namespace {

at::Tensor randn(at::IntArrayRef s) { return at::randn(s); }

check::Result run(const std::vector<Value> &ins, const std::vector<std::string> &body, const std::string &ret,
                  dynamo_engine *engine = nullptr) {
  return check::run_text(engine ? engine : g_engine, check::trace_text(ins, body, ret), ins);
}

#define EXPECT_OK(r)                                                                       \
  do {                                                                                     \
    if ((r).status != DYNAMO_OK) {                                                         \
      fprintf(stderr, "%s: %s\n", dynamo_status_name((r).status), (r).error.c_str());      \
      fail();                                                                              \
    }                                                                                      \
  } while (0)

}  // namespace

static void test_fused_dag_shared_subexpressions_one_kernel(void **state) {
  (void)state;
  for (int64_t n : {1, 7, 1023, 4097, 0}) {
    at::Tensor x = randn({n}), y = randn({n});
    // a is used four times, b twice; two outputs share everything.
    auto r = run({Value::tensor(x), Value::tensor(y)},
                 {"%a = mul(%0, %1)", "%b = tanh(%a)", "%c = add(%a, %b)", "%d = mul(%c, %a)", "%e = sub(%d, %a)",
                  "%f = sigmoid(%b)", "%g = mul(%f, %a)"},
                 "%e, %g");
    EXPECT_OK(r);
    at::Tensor a = x * y, b = at::tanh(a);
    assert_true(check::same(r.outs[0], (a + b) * a - a, "dag out 0"));
    assert_true(check::same(r.outs[1], at::sigmoid(b) * a, "dag out 1"));
    assert_int_equal(r.stats.num_kernels, n == 0 ? 0 : 1);  // one loop nest, no intermediates
  }
}

static void test_long_chains_and_broadcast_dags(void **state) {
  (void)state;
  at::Tensor x = randn({64, 33}), row = randn({33}), col = randn({64, 1});
  auto r = run({Value::tensor(x), Value::tensor(row), Value::tensor(col)},
               {"%a = add(%0, %1)", "%b = mul(%a, %2)", "%c = gelu(%b)", "%d = exp(%1)", "%e = mul(%c, %d)",
                "%f = clamp(%e, -2, 2)", "%g = where(%h, %f, 0.0)", "%h2 = abs(%g)"},
               "%h2");
  // %h is undefined: the trace must be rejected at parse time.
  assert_int_equal(r.status, DYNAMO_ERR_PARSE);
  r = run({Value::tensor(x), Value::tensor(row), Value::tensor(col)},
          {"%a = add(%0, %1)", "%b = mul(%a, %2)", "%c = gelu(%b)", "%d = exp(%1)", "%e = mul(%c, %d)",
           "%f = clamp(%e, -2, 2)", "%m = gt(%f, 0.1)", "%g = where(%m, %f, 0.0)", "%h = abs(%g)"},
          "%h");
  EXPECT_OK(r);
  at::Tensor e = at::gelu((x + row) * col) * at::exp(row);
  at::Tensor f = at::clamp(e, -2, 2);
  assert_true(check::same(r.outs[0], at::abs(at::where(f > 0.1, f, at::zeros_like(f))), "broadcast dag"));
  // exp(row) has fewer elements than the loop: it is computed once into a buffer, not per element.
  assert_int_equal(r.stats.num_kernels, 2);
}

static void test_views_fold_into_indexing(void **state) {
  (void)state;
  at::Tensor x = randn({6, 8, 5}), v = randn({8});
  std::vector<Value> ins = {Value::tensor(x)};
  struct Case {
    const char *body;
    std::function<at::Tensor()> eager;
  } cases[] = {
      {"%r = permute(%0, [2,0,1])", [&] { return x.permute({2, 0, 1}); }},
      {"%r = transpose(%0, 0, 2)", [&] { return x.transpose(0, 2); }},
      {"%r = reshape(%0, [48,5])", [&] { return x.reshape({48, 5}); }},
      {"%r = view(%0, [-1])", [&] { return x.view({-1}); }},
      {"%r = slice(%0, 1, 1, 8, 3)", [&] { return x.slice(1, 1, 8, 3); }},
      {"%r = slice(%0, -1, -4, 100, 2)", [&] { return x.slice(-1, -4, 100, 2); }},
      {"%r = select(%0, 1, -2)", [&] { return x.select(1, -2); }},
      {"%r = unsqueeze(%0, 1)", [&] { return x.unsqueeze(1); }},
      {"%u = unsqueeze(%0, 0)\n  %r = expand(%u, [3,-1,-1,-1])", [&] { return x.unsqueeze(0).expand({3, -1, -1, -1}); }},
      {"%s = select(%0, 2, 0)\n  %u = unsqueeze(%s, 2)\n  %r = squeeze(%u, 2)", [&] { return x.select(2, 0); }},
      {"%t = transpose(%0, 1, 2)\n  %r = reshape(%t, [6,40])", [&] { return x.transpose(1, 2).reshape({6, 40}); }},
      {"%t = permute(%0, [1,0,2])\n  %s = slice(%t, 0, 0, 8, 2)\n  %r = mul(%s, 2.0)",
       [&] { return x.permute({1, 0, 2}).slice(0, 0, 8, 2) * 2.0; }},
      {"%e = exp(%0)\n  %t = transpose(%e, 0, 1)\n  %r = add(%t, 1)", [&] { return at::exp(x).transpose(0, 1) + 1; }},
      {"%e = exp(%0)\n  %r = reshape(%e, [2,3,40])", [&] { return at::exp(x).reshape({2, 3, 40}); }},
      {"%s = squeeze(%0)\n  %r = neg(%s)", [&] { return -x.squeeze(); }},
  };
  int bad = 0;
  for (const Case &c : cases) {
    auto r = run(ins, {c.body}, "%r");
    if (r.status != DYNAMO_OK) {
      fprintf(stderr, "%s: %s\n", c.body, r.error.c_str());
      ++bad;
      continue;
    }
    bad += !check::same(r.outs[0], c.eager().contiguous(), c.body);
  }
  // Non-contiguous inputs of every kind: transposed, sliced with a step, expanded (stride 0).
  at::Tensor base = randn({9, 16});
  std::vector<at::Tensor> odd = {base.t(), base.slice(1, 1, 16, 3), v.expand({5, 8}), base.select(1, 3),
                                 base.t().slice(0, 2, 14, 2)};
  for (const at::Tensor &o : odd) {
    std::vector<Value> in1 = {Value::tensor(o)};
    auto r = run(in1, {"%r = sin(%0)"}, "%r");
    if (r.status != DYNAMO_OK) { fprintf(stderr, "odd input: %s\n", r.error.c_str()); ++bad; continue; }
    bad += !check::same(r.outs[0], at::sin(o), "non-contiguous " + check::type_text(o));
  }
  // A square transpose of a buffer written by the same-shaped loop must not share that loop.
  at::Tensor sq = randn({9, 9});
  auto rs = run({Value::tensor(sq)}, {"%e = exp(%0)\n  %t = transpose(%e, 0, 1)\n  %r = add(%t, %e)"}, "%r");
  EXPECT_OK(rs);
  bad += !check::same(rs.outs[0], at::exp(sq).t() + at::exp(sq), "transpose of a same-shape buffer");
  // A view returned directly is copied into the output.
  auto r = run(ins, {"%r = transpose(%0, 0, 1)"}, "%r, %0");
  EXPECT_OK(r);
  bad += !check::same(r.outs[0], x.transpose(0, 1).contiguous(), "view output");
  bad += !check::same(r.outs[1], x, "input output");
  assert_int_equal(bad, 0);
}

static void test_extern_ops_between_fused_groups(void **state) {
  (void)state;
  at::Tensor x = randn({17, 33}), w = randn({33, 9}), bias = randn({9});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(w), Value::tensor(bias)};
  // pointwise -> mm -> pointwise (fed by the extern's result) -> addmm with default beta/alpha.
  auto r = run(ins,
               {"%h = gelu(%0)", "%m = extern aten::mm(%h, %1) : f32[17,9]", "%a = add(%m, %2)", "%r = relu(%a)",
                "%t = transpose(%1, 0, 1)", "%m2 = extern aten::addmm(%0, %r, %t) : f32[17,33]",
                "%o = mul(%m2, 0.5)"},
               "%o, %m");
  EXPECT_OK(r);
  at::Tensor m = at::mm(at::gelu(x), w), rr = at::relu(m + bias);
  assert_true(check::same(r.outs[1], m, "extern result as output", 1e-4, 1e-4));
  assert_true(check::same(r.outs[0], at::addmm(x, rr, w.t()) * 0.5, "extern chain", 1e-4, 1e-4));
  assert_int_equal(r.stats.num_externs, 2);

  // Several results, keyword defaults, scalar inputs passed through to the extern.
  at::Tensor g = randn({33}), b = randn({33});
  std::vector<Value> ins2 = {Value::tensor(x), Value::tensor(g), Value::tensor(b), Value::real(1e-3)};
  r = run(ins2,
          {"%y, %mu, %rs = extern aten::native_layer_norm(%0, [33], %1, %2, %3) : f32[17,33], f32[17,1], f32[17,1]",
           "%z = mul(%y, %rs)", "%s = extern aten::sum.dim_IntList(%z, [1], true) : f32[17,1]", "%q = sub(%s, %mu)"},
          "%q, %y");
  EXPECT_OK(r);
  auto ln = at::native_layer_norm(x, {33}, g, b, 1e-3);
  at::Tensor want = (std::get<0>(ln) * std::get<2>(ln)).sum({1}, true) - std::get<1>(ln);
  assert_true(check::same(r.outs[0], want, "layer_norm + sum", 1e-4, 1e-4));
  assert_true(check::same(r.outs[1], std::get<0>(ln), "layer_norm out", 1e-4, 1e-4));

  // An extern on a non-contiguous view of an input gets the view (no copy needed first).
  r = run(ins, {"%t = transpose(%0, 0, 1)", "%m = extern aten::mm(%t, %0) : f32[33,33]"}, "%m");
  EXPECT_OK(r);
  assert_true(check::same(r.outs[0], at::mm(x.t(), x), "extern on a view", 1e-4, 1e-4));

  // Tensor lists (Tensor[] and Tensor?[]): fused values, views and inputs as elements.
  at::Tensor idx = at::tensor({4, 0, 16}, at::kLong);
  std::vector<Value> ins3 = {Value::tensor(x), Value::tensor(x * 3), Value::tensor(idx)};
  r = run(ins3,
          {"%e = exp(%0)", "%t = transpose(%1, 0, 1)", "%tt = transpose(%t, 0, 1)",
           "%c = extern aten::cat([%e, %tt, %0], 1) : f32[17,99]", "%s = extern aten::stack([%0, %1], 2) : f32[17,33,2]",
           "%g = extern aten::index.Tensor(%c, [%2, none]) : f32[3,99]", "%o = mul(%g, 2.0)"},
          "%o, %s");
  EXPECT_OK(r);
  at::Tensor cat = at::cat({at::exp(x), x * 3, x}, 1);
  assert_true(check::same(r.outs[0], cat.index({idx}) * 2, "cat -> index", 1e-5, 1e-6));
  assert_true(check::same(r.outs[1], at::stack({x, x * 3}, 2), "stack", 0, 0));
  // A tensor list where the operator takes one tensor is refused at compile time.
  r = run(ins, {"%m = extern aten::relu([%0]) : f32[17,33]"}, "%m");
  assert_int_equal(r.status, DYNAMO_ERR_VERIFY);
  assert_non_null(strstr(r.error.c_str(), "the trace passes a tensor list"));

  // An extern whose real result differs from the trace's declaration is caught at run time.
  r = run(ins, {"%m = extern aten::mm(%0, %1) : f32[17,8]"}, "%m");
  assert_int_equal(r.status, DYNAMO_ERR_RUNTIME);
  assert_non_null(strstr(r.error.c_str(), "the trace expected f32[17,8]"));
}

static void test_scalar_inputs_are_dynamic(void **state) {
  (void)state;
  dynamo_trace *t = nullptr;
  at::Tensor x = randn({1000});
  std::vector<Value> ins = {Value::tensor(x), Value::real(0.5), Value::integer(3), Value::boolean(true)};
  std::string text = check::trace_text(
      ins, {"%a = mul(%0, %1)", "%b = add(%a, %2)", "%c = where(%m, %b, %0)", "%m = gt(%0, 0)"}, "%c");
  assert_int_equal(dynamo_trace_parse(text.c_str(), text.size(), &t), DYNAMO_ERR_PARSE);
  text = check::trace_text(ins, {"%a = mul(%0, %1)", "%b = add(%a, %2)", "%m = logical_and(%3, %b)", "%c = where(%m, %b, %0)"},
                           "%c");
  assert_int_equal(dynamo_trace_parse(text.c_str(), text.size(), &t), DYNAMO_OK);
  dynamo_frame *f = nullptr;
  dynamo_entry *e = nullptr;
  assert_int_equal(dynamo_frame_create(g_engine, "scalars", &f), DYNAMO_OK);
  assert_int_equal(dynamo_compile_frame(f, t, &e), DYNAMO_OK);
  for (double s : {0.5, -2.0, 1e3}) {
    for (int64_t k : {3, -7}) {
      for (bool flag : {true, false}) {
        std::vector<Value> in = {Value::tensor(x), Value::real(s), Value::integer(k), Value::boolean(flag)};
        check::Result r = check::run_entry(e, in);
        EXPECT_OK(r);
        at::Tensor b = x * s + k;
        at::Tensor want = at::where(at::logical_and(at::native::wrapped_scalar_tensor(flag), b), b, x);
        assert_true(check::same(r.outs[0], want, "dynamic scalars"));
      }
    }
  }
  assert_int_equal(dynamo_frame_num_entries(f), 1);  // one entry served every value
  dynamo_frame_destroy(f);
  dynamo_trace_destroy(t);
}

static void test_thread_counts_agree(void **state) {
  (void)state;
  dynamo_engine_options o;
  dynamo_engine_options_init(&o);
  o.num_threads = 1;
  dynamo_engine *serial = nullptr;
  assert_int_equal(dynamo_engine_create(&o, &serial), DYNAMO_OK);
  at::Tensor x = randn({1 << 18}), y = randn({512, 1});
  at::Tensor xs = x.reshape({512, 512});
  std::vector<Value> ins = {Value::tensor(xs), Value::tensor(y)};
  std::vector<std::string> body = {"%a = mul(%0, %1)", "%b = exp(%a)", "%c = log1p(%b)", "%r = sub(%c, %a)"};
  auto r1 = run(ins, body, "%r", serial);
  int before = at::get_num_threads();
  at::set_num_threads(2);  // the default engine follows LibTorch's pool: make it parallel
  auto r2 = run(ins, body, "%r");
  at::set_num_threads(before);
  EXPECT_OK(r1);
  EXPECT_OK(r2);
  assert_true(at::equal(r1.outs[0], r2.outs[0]));  // pointwise: bitwise identical across threads
  assert_true(check::same(r2.outs[0], at::log1p(at::exp(xs * y)) - xs * y, "threads"));
  dynamo_engine_destroy(serial);
}

static void test_opt_levels_and_vector_widths_agree(void **state) {
  (void)state;
  at::Tensor x = randn({1031}), y = randn({1031});
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(y)};
  std::vector<std::string> body = {"%a = mul(%0, %1)", "%b = erf(%a)", "%c = pow(%b, %1)", "%r = maximum(%c, %0)"};
  at::Tensor want = at::maximum(at::pow(at::erf(x * y), y), x);
  for (uint32_t lvl : {0u, 1u, 2u, 3u})
    for (uint32_t bits : {128u, 256u, 512u}) {
      dynamo_engine_options o;
      dynamo_engine_options_init(&o);
      o.opt_level = lvl;
      o.vector_bits = bits;
      dynamo_engine *e = nullptr;
      assert_int_equal(dynamo_engine_create(&o, &e), DYNAMO_OK);
      auto r = run(ins, body, "%r", e);
      EXPECT_OK(r);
      assert_true(check::same(r.outs[0], want, "O" + std::to_string(lvl) + " " + std::to_string(bits) + " bits"));
      dynamo_engine_destroy(e);
    }
}

// Integer corners that trap or are poison at the machine level must not crash the process.
static void test_integer_edge_cases(void **state) {
  (void)state;
  for (at::ScalarType dt : {at::kInt, at::kLong}) {
    int64_t mn = dt == at::kInt ? INT32_MIN : INT64_MIN;
    at::Tensor a = at::tensor({mn, (int64_t)7, (int64_t)-7, (int64_t)-7, mn}, at::TensorOptions().dtype(at::kLong)).to(dt);
    at::Tensor b = at::tensor({(int64_t)-1, (int64_t)-1, (int64_t)2, (int64_t)-2, (int64_t)1}, at::TensorOptions().dtype(at::kLong)).to(dt);
    auto r = run({Value::tensor(a), Value::tensor(b)}, {"%r = floordiv(%0, %1)"}, "%r");
    EXPECT_OK(r);
    // MIN // -1 wraps to MIN (two's complement), as the hardware-independent answer.
    at::Tensor want = at::tensor({mn, (int64_t)-7, (int64_t)-4, (int64_t)3, mn}, at::TensorOptions().dtype(at::kLong)).to(dt);
    assert_true(at::equal(r.outs[0], want));
  }
  at::Tensor f = at::tensor({NAN, INFINITY, -INFINITY, 3e10f, -2.7f});
  auto r = run({Value::tensor(f)}, {"%r = to(%0, i32)"}, "%r");
  EXPECT_OK(r);  // out-of-range values are unspecified (as in ATen), but in-range ones are exact
  assert_int_equal(r.outs[0][4].item<int>(), -2);
}

// In-place ops (op + copy_ into an input or a view of one): the input ends up as eager leaves
// it, every read in the trace sees the old contents (SSA), and overlapping reads go via scratch.
static void test_in_place_writes_into_inputs(void **state) {
  (void)state;
  int bad = 0;
  struct Case {
    const char *name, *body, *ret;
    std::function<void(at::Tensor &, at::Tensor &)> eager;  // mutates x; returns via y for ret
  } cases[] = {
      {"add_", "%t = add(%0, %1)\n  %c = copy_(%0, %t)", "%c", [](at::Tensor &x, at::Tensor &r) { r = x.add_(1.5).clone(); }},
      {"clamp_", "%t = clamp(%0, -0.5, 0.5)\n  %c = copy_(%0, %t)", "%c",
       [](at::Tensor &x, at::Tensor &r) { r = x.clamp_(-0.5, 0.5).clone(); }},
      {"slice mul_", "%s = slice(%0, 1, 0, 9, 2)\n  %t = mul(%s, 3)\n  %c = copy_(%s, %t)", "%c",
       [](at::Tensor &x, at::Tensor &r) { r = x.slice(1, 0, 9, 2).mul_(3).clone(); }},
      {"fill", "%c = copy_(%0, 0.25)", "%c", [](at::Tensor &x, at::Tensor &r) { r = x.fill_(0.25).clone(); }},
      {"read old after write", "%t = add(%0, 1)\n  %c = copy_(%0, %t)\n  %r = mul(%0, 2)", "%r",
       [](at::Tensor &x, at::Tensor &r) { r = x * 2; x.add_(1); }},
      {"two in a row", "%a = add(%0, 1)\n  %c1 = copy_(%0, %a)\n  %b = mul(%c1, 2)\n  %c2 = copy_(%c1, %b)", "%c2",
       [](at::Tensor &x, at::Tensor &r) { r = x.add_(1).mul_(2).clone(); }},
      {"from own transpose", "%t = transpose(%0, 0, 1)\n  %u = mul(%t, 1.0)\n  %c = copy_(%0, %u)", "%c",
       [](at::Tensor &x, at::Tensor &r) { x.copy_(x.t().clone()); r = x.clone(); }},
      {"row sums into a column", "%s = sum(%0, [1], true)\n  %c0 = slice(%0, 1, 0, 1, 1)\n  %c = copy_(%c0, %s)", "%c",
       [](at::Tensor &x, at::Tensor &r) { at::Tensor s = x.sum(1, true); x.slice(1, 0, 1).copy_(s); r = s.clone(); }},
  };
  for (const Case &c : cases) {
    for (bool transposed : {false, true}) {
      at::Tensor base = randn({9, 9});
      at::Tensor x = transposed ? base.t() : base;
      at::Tensor xe = x.clone(), re;
      std::vector<Value> ins = {Value::tensor(x), Value::real(1.5)};
      check::Result r = check::run_text(g_engine, check::trace_text(ins, {c.body}, c.ret), ins);
      if (r.status != DYNAMO_OK) {
        fprintf(stderr, "%s: %s\n", c.name, r.error.c_str());
        ++bad;
        continue;
      }
      c.eager(xe, re);
      std::string what = std::string(c.name) + (transposed ? " (transposed input)" : "");
      bad += !check::same(x, xe, what + ": input after the call");
      bad += !check::same(r.outs[0], re, what + ": result");
    }
  }
  // A dtype-converting copy_: float input receives int64 values.
  at::Tensor x = randn({33}), k = at::randint(-5, 5, {33});
  at::Tensor xe = x.clone();
  std::vector<Value> ins = {Value::tensor(x), Value::tensor(k)};
  check::Result r = check::run_text(g_engine, check::trace_text(ins, {"%c = copy_(%0, %1)"}, "%c"), ins);
  EXPECT_OK(r);
  bad += !check::same(x, xe.copy_(k), "copy_ from int64");
  // An input written in place may not alias another input.
  at::Tensor a = randn({8});
  std::vector<Value> alias = {Value::tensor(a), Value::tensor(a.slice(0, 2, 6))};
  r = check::run_text(g_engine, check::trace_text(alias, {"%t = add(%0, 1)\n  %c = copy_(%0, %t)"}, "%c"), alias);
  assert_int_equal(r.status, DYNAMO_ERR_ARGUMENT_MISMATCH);
  assert_non_null(strstr(r.error.c_str(), "written in place and overlaps input 1"));
  // The destination must be an input (or a view of one).
  dynamo_trace *t = nullptr;
  std::string bad_text = check::trace_text({Value::tensor(a)}, {"%e = exp(%0)\n  %c = copy_(%e, 1.0)"}, "%c");
  assert_int_equal(dynamo_trace_parse(bad_text.c_str(), bad_text.size(), &t), DYNAMO_ERR_VERIFY);
  assert_non_null(strstr(dynamo_last_error(), "copy_ destination must be an input tensor or a view of one"));
  assert_int_equal(bad, 0);
}

// Outputs that alias inputs: the entry reports the view, and a NULL output buffer elides the copy.
static void test_output_aliases_and_copy_elision(void **state) {
  (void)state;
  struct Case {
    const char *body, *ret;
    bool alias;
    std::function<at::Tensor(at::Tensor &)> eager;  // may mutate x; returns the output
  } cases[] = {
      {"", "%0", true, [](at::Tensor &x) { return x; }},
      {"%r = transpose(%0, 0, 1)", "%r", true, [](at::Tensor &x) { return x.t(); }},
      {"%r = slice(%0, 1, 2, 9, 3)", "%r", true, [](at::Tensor &x) { return x.slice(1, 2, 9, 3); }},
      {"%t = mul(%0, 2)\n  %c = copy_(%0, %t)", "%c", true, [](at::Tensor &x) { return x.mul_(2); }},
      {"%s = select(%0, 0, 3)\n  %t = add(%s, 1)\n  %c = copy_(%s, %t)", "%c", true,
       [](at::Tensor &x) { return x.select(0, 3).add_(1); }},
      {"%t = mul(%0, 2)\n  %c = copy_(%0, %t)\n  %u = add(%c, 1)\n  %c2 = copy_(%c, %u)", "%c", false,
       [](at::Tensor &x) { at::Tensor r = x.mul_(2).clone(); x.add_(1); return r; }},
      {"%r = transpose(%0, 0, 1)\n  %t = mul(%0, 2)\n  %c = copy_(%0, %t)", "%r", false,
       [](at::Tensor &x) { at::Tensor r = x.t().clone(); x.mul_(2); return r; }},
      {"%r = exp(%0)", "%r", false, [](at::Tensor &x) { return at::exp(x); }},
  };
  int bad = 0;
  for (const Case &c : cases) {
    for (bool elide : {true, false}) {
      at::Tensor x = randn({6, 9}), xe = x.clone();
      std::vector<Value> ins = {Value::tensor(x)};
      std::string text = check::trace_text(ins, c.body[0] ? std::vector<std::string>{c.body} : std::vector<std::string>{}, c.ret);
      dynamo_trace *t = nullptr;
      dynamo_frame *f = nullptr;
      dynamo_entry *e = nullptr;
      assert_int_equal(dynamo_trace_parse(text.c_str(), text.size(), &t), DYNAMO_OK);
      assert_int_equal(dynamo_frame_create(g_engine, "alias", &f), DYNAMO_OK);
      assert_int_equal(dynamo_compile_frame(f, t, &e), DYNAMO_OK);
      dynamo_trace_destroy(t);
      dynamo_output_alias a;
      assert_int_equal(dynamo_entry_output_alias(e, 0, &a), DYNAMO_OK);
      if ((a.input == 0) != c.alias) {
        fprintf(stderr, "%s: alias reported %d, expected %d\n", c.body, a.input, (int)c.alias);
        ++bad;
      }
      dynamo_tensor_info info;
      dynamo_entry_output_info(e, 0, &info);
      std::vector<int64_t> sz(info.sizes, info.sizes + info.ndim);
      at::Tensor out = at::empty(sz);
      check::DL dx, dout;
      check::fill_dl(dx, x);
      check::fill_dl(dout, out);
      if (elide && a.input == 0) dout.dl.data = nullptr;
      dynamo_arg arg{};
      arg.kind = DYNAMO_ARG_TENSOR;
      arg.u.tensor = &dx.dl;
      dynamo_status s = dynamo_entry_run(e, &arg, 1, &dout.dl, 1);
      if (s != DYNAMO_OK) {
        fprintf(stderr, "%s: %s\n", c.body, dynamo_last_error());
        ++bad;
      } else {
        at::Tensor want = c.eager(xe);
        at::Tensor got = out;
        if (elide && a.input == 0)
          got = x.as_strided(sz, std::vector<int64_t>(a.strides, a.strides + a.ndim), x.storage_offset() + a.offset);
        bad += !check::same(got, want.contiguous(), std::string(c.body) + (elide ? " (elided)" : " (copied)"));
        bad += !check::same(x, xe, std::string(c.body) + ": input after the call");
      }
      dynamo_frame_destroy(f);
    }
  }
  // NULL data is refused for an output that does not alias an input.
  at::Tensor x = randn({4});
  std::vector<Value> ins = {Value::tensor(x)};
  std::string text = check::trace_text(ins, {"%r = exp(%0)"}, "%r");
  dynamo_trace *t = nullptr;
  dynamo_frame *f = nullptr;
  dynamo_entry *e = nullptr;
  dynamo_trace_parse(text.c_str(), text.size(), &t);
  dynamo_frame_create(g_engine, "alias", &f);
  dynamo_compile_frame(f, t, &e);
  dynamo_trace_destroy(t);
  check::DL dx, dout;
  check::fill_dl(dx, x);
  check::fill_dl(dout, x);
  dout.dl.data = nullptr;
  dynamo_arg arg{};
  arg.kind = DYNAMO_ARG_TENSOR;
  arg.u.tensor = &dx.dl;
  assert_int_equal(dynamo_entry_run(e, &arg, 1, &dout.dl, 1), DYNAMO_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(dynamo_last_error(), "allowed only for outputs that alias an input"));
  dynamo_frame_destroy(f);
  assert_int_equal(bad, 0);
}

int main(void) {
  at::manual_seed(99);
  if (dynamo_engine_create(NULL, &g_engine) != DYNAMO_OK) {
    fprintf(stderr, "engine: %s\n", dynamo_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fused_dag_shared_subexpressions_one_kernel),
      cmocka_unit_test(test_long_chains_and_broadcast_dags),
      cmocka_unit_test(test_views_fold_into_indexing),
      cmocka_unit_test(test_extern_ops_between_fused_groups),
      cmocka_unit_test(test_scalar_inputs_are_dynamic),
      cmocka_unit_test(test_thread_counts_agree),
      cmocka_unit_test(test_opt_levels_and_vector_widths_agree),
      cmocka_unit_test(test_integer_edge_cases),
      cmocka_unit_test(test_in_place_writes_into_inputs),
      cmocka_unit_test(test_output_aliases_and_copy_elision),
  };
  int rc = cmocka_run_group_tests_name("fusion", tests, NULL, NULL);
  dynamo_engine_destroy(g_engine);
  return rc;
}
