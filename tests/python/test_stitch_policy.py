"""A stitch whose continuation cannot be recorded: one failure blacklists it (the continuation
starts from the same state on every call) and drops the root trace, so the rest of each call
is not left to dynamo's interpreter, slower than CPython; the function then runs in CPython
(recording it again would meet the same stitch). The results are eager's on every call."""
import torch

import dynamo
from conftest import matches_eager


@dynamo.disable
def unrecordable(t):  # a stitch
    return t


@dynamo.disable
def helper(t):
    return t * 3


def f(x):
    y = unrecordable(x * 2)
    try:  # a call the recorder cannot make inside a try block cannot be stitched: an abort
        z = helper(y)
    finally:
        pass
    return z + 1


def test_unrecordable_continuation_drops_the_root_trace():
    jit = dynamo.optimize(f)  # held: report() lists the optimized functions alive
    matches_eager(jit, f, lambda: torch.randn(6), calls=10)
    c = dynamo.counters()
    assert c["aborts"] >= 1 and c["traces_compiled"] == 1, c  # recorded once, not again
    assert c["eager_runs"] >= 8, c  # left to CPython from the second call on
    assert "cannot be recorded" in dynamo.report(), dynamo.report()
    assert c["exits_resumed"] <= 1, c  # the rest was interpreted once at most, not every call


def many_steps(x, log):
    for i in range(6):
        x = x * 2 + i
        log.append(i)   # a stitch each time round
    return x


def test_a_call_past_max_stitches_leaves_the_function_to_cpython():
    import dynamo
    old = dynamo.config.max_stitches
    dynamo.config.max_stitches = 3
    try:
        opt = dynamo.optimize(many_steps)
        x = torch.randn(5)
        for _ in range(4):
            got, want = [], []
            assert torch.allclose(opt(x, got), many_steps(x, want)) and got == want
        c = dynamo.counters()
        # not interpreted from the 4th stitch on every call: the root went, CPython runs it
        assert c["aborts"] >= 1 and c["eager_runs"] >= 2 and c["exits_resumed"] <= 1, c
        assert "max_stitches" in dynamo.report()
    finally:
        dynamo.config.max_stitches = old
