"""A module whose forward cannot be compiled whole runs in CPython with its submodules compiled
apart (config.compile_parts): each child gets its own optimized forward, traces and guards; a
child that aborts in turn splits the same way. Results are eager's on every call, and a child
optimized on its own is still inlined when a parent that calls it is recorded."""
import copy

import torch

import dynamo
from conftest import matches_eager


class Boxes:
    """A result object the trace cannot return (the parent's recording aborts on it)."""

    def __init__(self, t):
        self.t = t


class Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)])

    def forward(self, x):
        y = self.stem(x)
        for b in self.blocks:
            y = torch.tanh(b(y))
        return Boxes(y * 2)


class Grand(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Parent()
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        b = self.inner(x)
        return Boxes(self.head(b.t).sigmoid())


def _run(model, calls=8, shape=(5, 16)):
    eager = copy.deepcopy(model)
    jit = dynamo.optimize(model)
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(*shape)
            got, want = jit(x), eager(x)
            assert type(got) is Boxes
            assert torch.allclose(got.t, want.t, rtol=1e-5, atol=1e-6)
    return jit


def test_children_of_a_module_left_to_cpython_run_natively():
    m = _run(Parent())
    c = dynamo.counters()
    assert c["aborts"] >= 1, c
    assert c["native_runs"] >= 3 * 4, c  # stem and both blocks: recorded in the first back-off call
    assert isinstance(m.stem.__dict__.get("forward"), dynamo.frontend.OptimizedFunction)
    assert isinstance(m.blocks[0].__dict__.get("forward"), dynamo.frontend.OptimizedFunction)
    assert "compiled apart: stem, blocks.0, blocks.1" in dynamo.report(), dynamo.report()


def test_a_part_that_aborts_splits_again():
    m = _run(Grand(), calls=12)
    assert isinstance(m.inner.stem.__dict__.get("forward"), dynamo.frontend.OptimizedFunction)
    report = dynamo.report()
    assert "compiled apart: inner, head" in report and "compiled apart: stem, blocks.0, blocks.1" in report, report
    assert dynamo.counters()["native_runs"] >= 4 * 4, dynamo.counters()


def test_compile_parts_off_runs_the_whole_forward_eagerly():
    old = dynamo.config.compile_parts
    dynamo.config.compile_parts = False
    try:
        m = _run(Parent())
    finally:
        dynamo.config.compile_parts = old
    assert "forward" not in m.stem.__dict__
    assert dynamo.counters()["native_runs"] == 0, dynamo.counters()


def test_a_disabled_forward_is_not_split():
    m = Parent()
    eager = copy.deepcopy(m)
    dynamo.disable(dynamo.optimize(m).forward)  # the user said: leave it to CPython
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(5, 16)
            assert torch.allclose(m(x).t, eager(x).t)
    assert "forward" not in m.stem.__dict__
    assert dynamo.counters()["native_runs"] == 0, dynamo.counters()


class Adder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).relu() + 1


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Adder()

    def forward(self, x):
        return self.child(x) * 2


def test_an_optimized_child_is_inlined_into_its_parent():
    outer = Outer()
    eager = copy.deepcopy(outer)
    dynamo.optimize(outer.child)  # the child first, on its own
    jit = dynamo.optimize(outer)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3, 8)
            assert torch.allclose(jit(x), eager(x), rtol=1e-5, atol=1e-6)
        c = dynamo.counters()
        assert c["traces_compiled"] == 1 and c["native_runs"] == 3 and c["stitches"] == 0, c
        # the child's forward replaced by something else: the parent's guard sees it
        outer.child.forward = lambda x: x - 100.0
        x = torch.randn(3, 8)
        assert torch.allclose(jit(x), (x - 100.0) * 2)


class Unfolds(torch.nn.Module):
    def forward(self, x):
        return x.t().as_strided((2, 2), (1, 2)).sum(-1)  # eager's storage strides of a transposed view: not recordable


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.good = torch.nn.Linear(8, 8)
        self.bad = Unfolds()

    def forward(self, x):
        return self.bad(self.good(x).relu()) * 2


def test_an_abort_inside_a_part_splits_the_module_at_once():
    m = Mixed()
    eager = copy.deepcopy(m)
    matches_eager(dynamo.optimize(m), eager, lambda: torch.randn(4, 8), calls=6, atol=1e-6)
    assert "recording aborted inside its part bad" in dynamo.report(), dynamo.report()
    # the parent recorded once; `good` runs natively from the second call on
    assert m.forward.attempts and len(m.forward.attempts) == 1
    assert m.good.forward.compiled and m.good.forward.compiled[0].runs == 4


def test_explain_names_the_parts():
    with torch.no_grad():
        text = str(dynamo.explain(Parent(), torch.randn(2, 16)))
    assert "aborted: returns a Boxes" in text, text
    assert "submodules are then compiled apart: stem, blocks.0, blocks.1" in text, text
