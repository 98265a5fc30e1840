"""try/except/finally and with blocks, and imports inside a function, are recorded rather than
aborting the function: the interpreter runs exception handlers as CPython does (the exception
table), `with` calls __enter__/__exit__, and `import` of a module already loaded reads it from
sys.modules behind an identity guard. Every call must equal eager and run natively after the
first."""
import math
import warnings

import pytest
import torch

import dynamo


def check(fn, make, n=5):
    opt = dynamo.optimize(fn)
    hist = []
    for i in range(n):
        args = make(i)
        want = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        got = opt(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        assert type(got) is type(want)
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6), i
        else:
            assert got == want, i
        hist.append(dynamo.counters())
    return hist


def native_after_first(hist):
    first, last = hist[0], hist[-1]
    assert last["interpreted_runs"] == first["interpreted_runs"] and last["aborts"] == 0, last
    assert last["native_runs"] - first["native_runs"] == len(hist) - 1, (first, last)


def randn(i, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(i))


def test_import_inside_the_function():
    def f(x):
        import torch.nn.functional as F
        from math import sqrt
        return F.gelu(x) * sqrt(2.0)

    native_after_first(check(f, lambda i: (randn(i, 6, 5),)))


def test_try_without_an_exception_and_finally():
    def f(x):
        try:
            y = x * 2
        except RuntimeError:
            y = x
        finally:
            z = y + 1
        return z.relu()

    native_after_first(check(f, lambda i: (randn(i, 9),)))


def test_an_exception_caught_in_the_same_function():
    def f(x, d):
        try:
            s = d["scale"]
        except KeyError:
            s = 0.5
        try:
            raise ValueError("no")
        except (TypeError, ValueError) as e:
            tag = str(e)
        return x * s, tag

    opt = dynamo.optimize(f)
    for i in range(4):
        d = {"scale": 3.0} if i % 2 else {}
        x = randn(i, 4)
        got, want = opt(x, d), f(x, d)
        assert torch.allclose(got[0], want[0]) and got[1] == want[1] == "no"
    assert dynamo.counters()["native_runs"] >= 2


def test_exception_from_a_callee_is_caught_by_the_caller():
    def inner(x, n):
        if n > 2:
            raise IndexError("deep")
        return x + n

    def f(x, n):
        try:
            return inner(x, n) * 2
        except IndexError:
            return x - 1

    opt = dynamo.optimize(f)
    for n in (1, 5, 1, 5, 5):
        x = torch.randn(3)
        assert torch.allclose(opt(x, n), f(x, n))


def test_uncaught_exception_propagates_and_bare_raise_reraises():
    def f(x):
        try:
            y = x * 2
            raise KeyError("k")
        except KeyError:
            raise

    opt = dynamo.optimize(f)
    for _ in range(3):
        with pytest.raises(KeyError):
            opt(torch.ones(2))


def test_with_no_grad_and_a_custom_context_manager():
    log = []

    class Tag:
        def __enter__(self):
            log.append("in")
            return 7

        def __exit__(self, *exc):
            log.append("out")
            return False

    def f(x):
        with torch.no_grad():
            y = x * 3
        with Tag() as t:
            z = y + t
        return z.tanh()

    opt = dynamo.optimize(f)
    for i in range(5):
        x = randn(i, 5)
        log.clear()
        want = f(x)
        e_log = list(log)
        log.clear()
        got = opt(x)
        assert torch.allclose(got, want) and log == e_log == ["in", "out"], i
        assert torch.is_grad_enabled()


def test_with_block_whose_body_raises_runs_exit_and_propagates():
    state = []

    class Guard:
        def __enter__(self):
            state.append("enter")

        def __exit__(self, typ, val, tb):
            state.append(typ.__name__ if typ else "none")
            return typ is ZeroDivisionError  # swallows this one

    def f(x, k):
        with Guard():
            y = x + 1
            if k == 0:
                1 / k
            y = y * 2
        return y

    opt = dynamo.optimize(f)
    for k in (1, 0, 1, 0):
        x = torch.randn(4)
        state.clear()
        want = f(x, k)
        e_state = list(state)
        state.clear()
        got = opt(x, k)
        assert torch.allclose(got, want) and state == e_state, (k, state, e_state)


def test_warnings_catch_inside_the_function():
    def f(x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = x.sum() * math.pi
        return y

    for _ in range(3):
        x = torch.randn(8)
        assert torch.allclose(dynamo.optimize(f)(x), f(x))


def test_tensor_from_guarded_python_numbers_is_an_input_made_again_each_call():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = [1.0, 2.0, 3.0]

        def forward(self, x):
            w = torch.tensor(self.scale, dtype=torch.float32)
            n = torch.tensor(x.shape[0])
            return x * w + torch.as_tensor([[0.5, 0.25, 0.125]]) + n

    m = M()
    opt = dynamo.optimize(m)
    for i in range(6):
        if i == 3:
            m.scale[1] = -7.0  # read by value: the trace must see the change
        x = randn(i, 2 + i % 2, 3)
        got = opt(x)
        m_scale = list(m.scale)
        want = x * torch.tensor(m_scale) + torch.tensor([[0.5, 0.25, 0.125]]) + x.shape[0]
        assert torch.allclose(got, want), i
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 2, c


def test_a_call_that_may_raise_inside_try_is_not_a_stitch():
    # a stitch inside a try block would make the call between two traces, where the handler
    # cannot catch its exception: the recording aborts there instead, and every call is right
    @dynamo.disable
    def risky(t):
        if float(t.sum()) > 0:
            raise ValueError("positive")
        return t * 2

    def f(x):
        y = x + 1
        try:
            y = risky(y)
        except ValueError:
            y = y - 100
        return y * 3

    opt = dynamo.optimize(f)
    for i in range(6):
        x = torch.full((4,), 1.0 if i % 2 else -5.0)
        assert torch.allclose(opt(x), f(x)), i
    assert dynamo.counters()["stitches"] == 0
