"""Stitches: a call the recorder cannot record (print, warnings.warn, a dynamo.disable'd helper,
unknown C code, a module with hooks, .tolist()) ends the trace right before it instead of
aborting the whole function. Later calls run the trace natively, make that one call in Python,
and go on in the trace recorded after it. Every call must equal eager, the call's side effects
must happen once per call and in order, and after the first calls nothing is interpreted."""
import contextlib
import copy
import io
import warnings

import pytest
import torch

import dynamo


def run_both(fn, make, n=6, opt=None):
    """Calls eager fn and its optimized twin n times on the same inputs, comparing results and
    the side effects each one logs (into the list `events` the test hands fn through make)."""
    opt = opt or dynamo.optimize(fn)
    history = []
    for i in range(n):
        e_args, e_events = make(i)
        c_args, c_events = make(i)
        want = fn(*e_args)
        got = opt(*c_args)
        assert type(got) is type(want)
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6), f"call {i}"
        else:
            assert got == want or all(torch.allclose(g, w) for g, w in zip(got, want)), f"call {i}"
        assert c_events == e_events, f"call {i}: side effects {c_events} != eager's {e_events}"
        history.append(dynamo.counters())
    return history


def assert_native_after(history, k=2):
    """From call k on: no interpretation, no resumed exits, no eager fallback, one stitch or more per call."""
    first, last = history[k - 1], history[-1]
    for name in ("interpreted_runs", "exits_resumed", "eager_runs", "aborts"):
        assert last[name] == first[name], (name, first, last)
    assert last["stitches"] - first["stitches"] >= len(history) - k, (first, last)
    assert last["native_runs"] - first["native_runs"] == len(history) - k, (first, last)


def inputs(events):
    def make(i):
        ev = []
        events[:] = [ev]
        g = torch.Generator().manual_seed(i)
        return (torch.randn(7, 5, generator=g),), ev
    return make


def test_print_in_the_middle_is_one_step_between_two_native_traces():
    def f(x):
        y = torch.relu(x) * 2
        print("mid", y.shape)
        return torch.tanh(y) + 1

    outs = []

    def make(i):
        g = torch.Generator().manual_seed(i)
        return (torch.randn(7, 5, generator=g),), outs

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        h = run_both(f, make)
    assert buf.getvalue().count("mid torch.Size([7, 5])") == 12  # once per call, each side
    assert_native_after(h)
    assert h[-1]["traces_compiled"] == 1 and h[-1]["stitch_traces"] == 1


def test_print_first_thing_needs_no_trace_before_it():
    def f(x):
        print("start")
        return torch.sigmoid(x) * 3

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        h = run_both(f, lambda i: ((torch.randn(4, 9, generator=torch.Generator().manual_seed(i)),), []))
    assert buf.getvalue().count("start") == 12
    assert_native_after(h)


def test_disabled_helper_result_feeds_the_next_trace():
    log = []

    @dynamo.disable
    def helper(t):
        log.append(round(float(t.sum()), 3))
        return torch.sort(t, dim=1).values

    def f(x):
        y = x * 3 - 1
        z = helper(y)
        return z.exp() + y

    def make(i):
        log.clear()
        g = torch.Generator().manual_seed(i)
        return (torch.randn(7, 5, generator=g),), log

    # each side fills log afresh: compare the log each side left
    opt = dynamo.optimize(f)
    for i in range(6):
        (xe,), _ = make(i)
        want = f(xe)
        e_log = list(log)
        (xc,), _ = make(i)
        got = opt(xc)
        assert torch.allclose(got, want) and log == e_log, i
    c = dynamo.counters()
    assert c["stitches"] >= 5 and c["stitch_traces"] == 1 and c["exits_resumed"] == 0


def test_warnings_and_two_stitches_keep_their_order():
    events = []

    def f(x):
        events.append("a")
        y = x + 1
        warnings.warn("careful")
        y = y * y
        events.append("b")
        print("p", end="")
        return y - x

    def make(i):
        events.clear()
        return (torch.randn(3, 3),), events

    opt = dynamo.optimize(f)
    with warnings.catch_warnings(record=True) as w, contextlib.redirect_stdout(io.StringIO()) as out:
        warnings.simplefilter("always")
        for i in range(5):
            x = torch.randn(3, 3)
            events.clear()
            want = f(x.clone())
            e_events, n = list(events), len(w)
            events.clear()
            got = opt(x.clone())
            assert torch.allclose(got, want) and events == e_events == ["a", "b"], i
            assert [str(m.message) for m in w[n:]] == ["careful"], i
    assert out.getvalue() == "p" * 10
    c = dynamo.counters()
    # events.append, warn, append, print: call 1 records the trace after each one as it passes it
    assert c["stitch_traces"] == 4 and c["stitches"] == 4 * 5 and c["interpreted_runs"] == 1 + 4, c


def test_stitch_in_an_inlined_submodule_and_in_a_loop():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 5)

        def forward(self, x):
            y = self.lin(x).relu()
            print(".", end="")
            return y + x

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x.sum(dim=1)

    net = Net().eval()
    ref = copy.deepcopy(net)  # optimize(net) compiles net's own forward: eager runs on a copy
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()) as buf:
        opt = dynamo.optimize(net)
        hist = []
        for i in range(6):
            x = torch.randn(4, 5)
            want = ref(x)
            got = opt(x)
            assert torch.allclose(got, want, atol=1e-6), i
            hist.append(dynamo.counters())
    assert buf.getvalue().count(".") == 36
    assert_native_after(hist, k=1)  # one stitch per block: call 1 records the traces after them too
    assert hist[-1]["stitch_traces"] == 3


def test_module_with_a_hook_is_called_for_real_between_traces():
    seen = []
    lin = torch.nn.Linear(6, 6)
    lin.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    seq = torch.nn.Sequential(torch.nn.ReLU(), lin, torch.nn.Tanh()).eval()
    ref = copy.deepcopy(seq)
    opt = dynamo.optimize(seq)
    hist = []
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(2, 6)
            seen.clear()
            want = ref(x)
            n = len(seen)
            got = opt(x)
            assert torch.allclose(got, want, atol=1e-6) and len(seen) == 2 * n == 2, i
            hist.append(dynamo.counters())
    assert_native_after(hist)


def test_tolist_value_specializes_the_next_trace():
    def f(x, m):
        y = x * 2
        k = m.tolist()
        return y[:, k[0]:k[1]] + 1

    opt = dynamo.optimize(f)
    for i in range(8):
        x = torch.randn(4, 6)
        m = torch.tensor([1, 4]) if i % 2 else torch.tensor([0, 3 + i % 3])
        assert torch.equal(opt(x, m), f(x, m)), i
    assert dynamo.counters()["stitches"] >= 6


def test_an_exception_from_the_step_propagates_like_eager():
    @dynamo.disable
    def check(t):
        if float(t.max()) > 100:
            raise ValueError("too big")
        return t

    def f(x):
        y = x * 10
        y = check(y)
        return y + 1

    opt = dynamo.optimize(f)
    for _ in range(3):
        x = torch.rand(5)
        assert torch.allclose(opt(x), f(x))
    with pytest.raises(ValueError, match="too big"):
        f(torch.full((5,), 20.0))
    with pytest.raises(ValueError, match="too big"):
        opt(torch.full((5,), 20.0))
    assert torch.allclose(opt(torch.ones(5)), f(torch.ones(5)))


def test_in_place_write_before_the_stitch_is_seen_by_the_step():
    seen = []

    @dynamo.disable
    def peek(t):
        seen.append(t.clone())

    def f(x):
        x.mul_(2)
        peek(x)
        return x + 1

    opt = dynamo.optimize(f)
    for i in range(5):
        base = torch.randn(6)
        xe, xc = base.clone(), base.clone()
        seen.clear()
        want = f(xe)
        got = opt(xc)
        assert torch.equal(got, want) and torch.equal(xc, xe), i
        assert len(seen) == 2 and torch.equal(seen[0], seen[1]), i


def test_stitch_off_aborts_as_before():
    def f(x):
        y = x + 1
        print("x", end="")
        return y * 2

    dynamo.config.stitch = False
    try:
        opt = dynamo.optimize(f)
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(3):
                x = torch.randn(3)
                assert torch.equal(opt(x), f(x))
        c = dynamo.counters()
        assert c["stitches"] == 0 and c["aborts"] >= 1 and c["traces_compiled"] == 0
    finally:
        dynamo.config.stitch = True


def test_setting_an_attribute_of_self_and_an_outside_dict_item():
    store = {}

    class Cache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.last = None

        def forward(self, x):
            y = self.lin(x).relu()
            self.last = y          # a stitch: the store happens between the two traces
            store["y"] = y * 2     # likewise
            return y + 1

    net = Cache().eval()
    ref = copy.deepcopy(net)
    opt = dynamo.optimize(net)
    hist = []
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(3, 4)
            want = ref(x)
            want_store = ref.last * 2
            got = opt(x)
            assert torch.allclose(got, want, atol=1e-6), i
            assert torch.allclose(net.last, ref.last, atol=1e-6) and torch.allclose(store["y"], want_store), i
            hist.append(dynamo.counters())
    assert_native_after(hist, k=1)  # two stitches: call 1 records the traces after them too
    assert hist[-1]["aborts"] == 0

