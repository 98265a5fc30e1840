"""Failure injection (DYNAMO_FAULT): an LLVM compile failure, a SLEEF symbol the JIT cannot
resolve, an allocation failure at run time, and a guard that raises in Python. Each is
reported (counters, explain) and the call still returns eager's result."""
import pytest
import torch

import dynamo


def f(x):
    return torch.log1p(x.abs()) * 2 + 1  # log1p goes through SLEEF


@pytest.mark.parametrize("fault,needle", [("compile", "injected fault"), ("sleef", "Sleef_log1pf")])
def test_compile_faults_fall_back(monkeypatch, fault, needle):
    monkeypatch.setenv("DYNAMO_FAULT", fault)
    opt = dynamo.optimize(f)
    x = torch.randn(33)
    for _ in range(3):
        assert torch.allclose(opt(x), f(x))
    c = dynamo.counters()
    assert c["compile_failures"] >= 1 and c["native_runs"] == 0, c
    assert needle in str(dynamo.explain(f, x)), str(dynamo.explain(f, x))


def test_allocation_failure_at_run_time_falls_back(monkeypatch):
    opt = dynamo.optimize(f)
    x = torch.randn(33)
    opt(x)
    assert torch.allclose(opt(x), f(x)) and dynamo.counters()["native_runs"] == 1
    monkeypatch.setenv("DYNAMO_FAULT", "alloc")
    assert torch.allclose(opt(x), f(x))  # the native run fails: the trace goes, eager answers
    assert any("out of memory" in a.reason for a in opt.attempts if a.reason), [a.reason for a in opt.attempts]
    monkeypatch.delenv("DYNAMO_FAULT")
    for _ in range(2):
        assert torch.allclose(opt(x), f(x))
    assert dynamo.counters()["native_runs"] >= 2  # recompiled once the fault is gone


class Flaky:
    def __init__(self):
        self.calls = 0

    @property
    def scale(self):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("scale is gone")
        return 3.0


def test_guard_that_raises_is_a_miss_and_eager_raises_the_same():
    obj = Flaky()

    def g(x):
        return x * obj.scale

    opt = dynamo.optimize(g)
    x = torch.ones(4)
    assert torch.equal(opt(x), x * 3)
    with pytest.raises(RuntimeError, match="scale is gone"):  # guard raises -> miss -> eager's error
        opt(x)
