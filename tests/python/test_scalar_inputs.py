"""Python numbers passed as arguments become scalar inputs of the trace (config.dynamic): a float
or int argument that only meets tensors in + - * / is read each call, so f(x, 0.1), f(x, 0.2), ...
run one trace; any other use (a branch, Python arithmetic, a shape, a call into torch or C, a
container, the result) guards its value as before. Every call is compared with eager."""
import math
import os
import subprocess
import sys

import pytest
import torch

import dynamo
from dynamo import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def counters():
    return dynamo.counters()


def run_all(fn, calls, rtol=1e-5, atol=1e-6):
    """Runs fn optimized over calls (argument tuples) under no_grad; each result against eager."""
    opt = dynamo.optimize(fn)
    with torch.no_grad():
        for args in calls:
            got, want = opt(*args), fn(*args)
            if isinstance(want, tuple):
                assert type(got) is tuple and len(got) == len(want), args[1:]
                pairs = list(zip(got, want))
            else:
                pairs = [(got, want)]
            for g, w in pairs:
                if isinstance(w, torch.Tensor):
                    assert g.dtype == w.dtype and g.shape == w.shape, args[1:]
                    torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
                else:
                    assert type(g) is type(w) and (g == w or (g != g and w != w)), (g, w)
    return opt


def test_fifty_float_scales_compile_once():
    def f(x, scale):
        return torch.softmax(x * scale, -1)

    x = torch.randn(8, 33)
    run_all(f, [(x, 0.05 * i) for i in range(1, 51)])
    c = counters()
    assert c["traces_compiled"] == 1 and c["native_runs"] == 49 and c["eager_runs"] == 0


def test_int_in_arithmetic_is_an_input_int_as_shape_is_guarded():
    def f(x, n, k):
        return (x + n).reshape(k, -1) * 2.0

    x = torch.randn(4, 6)
    run_all(f, [(x, n, 2) for n in range(6)] + [(x, 1, 3), (x, 5, 4)])
    # n is an input (one trace for k=2); each new k is a new shape and a new trace
    assert counters()["traces_compiled"] == 3


@pytest.mark.parametrize("op", ["mul", "rmul", "add", "radd", "sub", "rsub", "div", "rdiv", "imul", "iadd",
                                "isub", "idiv"])
def test_each_arithmetic_form(op):
    forms = {
        "mul": lambda x, s: x * s, "rmul": lambda x, s: s * x, "add": lambda x, s: x + s,
        "radd": lambda x, s: s + x, "sub": lambda x, s: x - s, "rsub": lambda x, s: s - x,
        "div": lambda x, s: x / s, "rdiv": lambda x, s: s / x,
    }

    def inplace(x, s):
        y = x.clone()
        if op == "imul":
            y *= s
        elif op == "iadd":
            y += s
        elif op == "isub":
            y -= s
        else:
            y /= s
        return y

    body = inplace if op.startswith("i") else forms[op]

    def f(x, s):
        return body(x, s).exp()

    x = torch.rand(7, 5) + 0.5
    run_all(f, [(x, s) for s in (0.5, 1.5, -2.25, 3.0, 1e-3)])
    assert counters()["traces_compiled"] == 1


def test_types_follow_eager():
    def f(x, s):
        return x * s

    ints = torch.arange(12).reshape(3, 4)
    run_all(f, [(ints, 2.5), (ints, 0.1)])      # int tensor * float: float32
    run_all(f, [(ints, 3), (ints, -7)])         # int tensor * int: int64
    d = torch.randn(5, dtype=torch.float64)
    run_all(f, [(d, 0.1), (d, 1 / 3)], rtol=0, atol=0)  # float64: the number is not rounded to float32
    h = torch.randn(9).to(torch.bfloat16)
    run_all(f, [(h, 0.3), (h, 7.0)], rtol=0, atol=0)


def test_a_branch_on_the_number_guards_it():
    def f(x, s):
        if s > 1.0:
            return x * s
        return x - s

    x = torch.randn(6)
    run_all(f, [(x, 2.0), (x, 0.5), (x, 3.0), (x, 0.25)])
    assert counters()["traces_compiled"] == 4  # each value is guarded


def test_python_arithmetic_on_the_number_guards_it():
    def f(x, s):
        return x * (s * 2) + math.sqrt(s)

    x = torch.randn(6)
    run_all(f, [(x, 2.0), (x, 0.5), (x, 9.0)])
    assert counters()["traces_compiled"] == 3


def test_used_in_arithmetic_and_elsewhere():
    def f(x, s):
        y = x * s
        return y + torch.full((6,), s)  # torch.full reads the number itself

    x = torch.randn(6)
    run_all(f, [(x, 2.0), (x, 0.5), (x, 0.5)])
    assert counters()["traces_compiled"] == 2


def test_a_constant_equal_to_the_number_stays_a_constant():
    def f(x, s, n):
        return x * s + 1.0 - n + 1

    x = torch.randn(6)
    run_all(f, [(x, 1.0, 1), (x, 2.0, 3), (x, -1.0, -1), (x, 1.0, 0)])
    assert counters()["traces_compiled"] == 1


def test_through_an_inlined_helper_and_a_module():
    def helper(t, s):
        return t * s

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x, temperature):
            return torch.softmax(self.lin(x) / temperature, -1)

    def f(x, s):
        return helper(x, s) + helper(x, 2.0)

    x = torch.randn(3, 6)
    run_all(f, [(x, 0.5), (x, 1.5), (x, 2.0)])
    assert counters()["traces_compiled"] == 1
    m = Scaled().eval()
    om = dynamo.optimize(m)
    with torch.no_grad():
        for t in (0.5, 1.0, 2.0, 4.0):
            torch.testing.assert_close(om(x, t), m(x, t))
    assert counters()["traces_compiled"] == 2


def test_keyword_argument():
    def f(x, *, scale=1.0):
        return x * scale

    opt = dynamo.optimize(f)
    x = torch.randn(5)
    with torch.no_grad():
        for s in (0.5, 1.5, 2.5):
            torch.testing.assert_close(opt(x, scale=s), x * s)
        torch.testing.assert_close(opt(x), x)  # the default: guarded by value
    assert counters()["traces_compiled"] == 2


def test_passed_to_a_torch_call_is_guarded():
    def f(x, s):
        return torch.clamp(x, max=s) * 2.0

    x = torch.randn(8)
    run_all(f, [(x, 0.5), (x, -0.5), (x, 0.1)])
    assert counters()["traces_compiled"] == 3


def test_returned_number_is_this_calls():
    def f(x, s):
        return x * s, s

    x = torch.randn(4)
    run_all(f, [(x, 0.5), (x, 2.5), (x, 3.5)])


def test_special_values():
    def f(x, s):
        return x * s

    x = torch.randn(5)
    run_all(f, [(x, 0.0), (x, -0.0), (x, float("nan")), (x, float("inf")), (x, 2.0), (x, -0.0)])


def test_side_exit_and_side_trace_take_the_number():
    def f(x, s):
        y = x * s
        if y.sum() > 0:
            return y + s
        return y - s

    xs = [torch.randn(16) for _ in range(6)]
    calls = [(x, s) for s in (0.5, -1.5, 2.0) for x in xs] * 4
    run_all(f, calls)
    c = counters()
    assert c["traces_compiled"] == 1 and c["eager_runs"] == 0


def test_bools_stay_guarded():
    def f(x, flag):
        return x * flag

    x = torch.randn(4)
    run_all(f, [(x, True), (x, False), (x, True)])
    assert counters()["traces_compiled"] == 2


def test_config_dynamic_false_specializes():
    def f(x, s):
        return x * s

    x = torch.randn(4)
    old = config.dynamic
    config.dynamic = False
    try:
        run_all(f, [(x, 0.5), (x, 1.5), (x, 0.5)])
    finally:
        config.dynamic = old
    assert counters()["traces_compiled"] == 2


def test_explain_says_the_number_is_passed():
    def f(x, s):
        return x * s

    x = torch.randn(4)
    with torch.no_grad():
        text = str(dynamo.explain(f, x, 0.5))
    assert "a[1]: type float, passed to the trace each call (value not guarded)" in text


def test_stored_trace_takes_the_number(tmp_path):
    """A second process runs the stored trace with its own numbers."""
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import json, sys, torch, dynamo\n"
        "def f(x, s, n):\n"
        "    return torch.tanh(x * s) + n\n"
        "opt = dynamo.optimize(f)\n"
        "x = torch.randn(32)\n"
        "ok = True\n"
        "with torch.no_grad():\n"
        "    for s, n in ((float(sys.argv[1]), 1), (0.25, 7), (3.0, -2)):\n"
        "        ok = ok and torch.allclose(opt(x, s, n), f(x, s, n))\n"
        "c = dynamo.counters()\n"
        "print(json.dumps([ok, c['traces_compiled'], c['traces_from_store']]))\n")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = dict(os.environ, DYNAMO_CACHE_DIR=str(cache), PYTHONPATH=os.path.join(ROOT, "python_shim"))
    out = []
    for s in ("0.5", "1.75"):
        r = subprocess.run([sys.executable, str(prog), s], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout.strip().splitlines()[-1])
    assert out[0] == "[true, 1, 0]" and out[1] == "[true, 0, 1]", out


def test_captured_by_a_closure_is_guarded():
    def f(x, s):
        def scale(t):
            return t * s
        return scale(x) + 1.0

    x = torch.randn(5)
    run_all(f, [(x, 0.5), (x, 2.0), (x, 0.5)])
    assert counters()["traces_compiled"] == 2
