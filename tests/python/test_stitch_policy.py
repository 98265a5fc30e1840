"""A stitch whose continuation cannot be recorded: one failure blacklists it (the continuation
starts from the same state on every call) and drops the root trace, so the rest of each call
is not left to dynamo's interpreter, slower than CPython; the function then backs off and, after
the abort limit, runs in CPython. The results are eager's on every call."""
import torch

import dynamo


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
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(10):
            x = torch.randn(6)
            assert torch.allclose(jit(x), f(x))
    c = dynamo.counters()
    assert c["aborts"] >= dynamo.config.abort_limit, c
    assert c["eager_runs"] >= 2, c  # left to CPython at the end
    assert "cannot be recorded" in dynamo.report(), dynamo.report()
    # each root trace was tried once after its stitch, not once per call
    assert c["exits_resumed"] <= dynamo.config.abort_limit, c
