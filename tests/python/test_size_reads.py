"""Sizes read in Python (sizeflow.py): a size the program only passes on to torch operations
(views, new tensors, products of sizes) lets the trace join a size family; a size Python decides
something with (a branch, + or -, a builtin, the result, a closure) fixes that dimension, so a
family may not vary it. Every case compares with eager at every size: a family that ignored such
a use would show as a wrong value, shape, or Python number."""
import math

import pytest
import torch

import dynamo

from test_size_families import families_from_recordings, sweep  # noqa: F401 -- (an autouse fixture: probes off)


def counts(c):
    return c["traces_compiled"], c["size_instances"]


def test_unpacked_sizes_into_a_view():
    def f(x):
        b, t, c = x.size()
        return (x * 2).view(b * t, c).softmax(-1)

    c = sweep(f, lambda n: (torch.randn(2, n, 8),), [3, 5, 9, 17, 4])
    assert counts(c) == (2, 3), c


def test_shape_indexed_and_sliced():
    def f(x):
        return x.reshape(x.shape[:1] + (-1,)).relu() + x.new_zeros(x.shape[0], 1) + x.shape[-1]

    c = sweep(f, lambda n: (torch.randn(n, 3, 4),), [2, 3, 5, 8])
    assert counts(c) == (2, 2), c


def test_cnn_with_adaptive_pool_over_batch_sizes():
    """nn.AdaptiveAvgPool2d reads its input's sizes in Python (_list_with_default) and zips the
    spatial ones: only those are fixed, so the batch size is free."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d((2, 2)),
                              torch.nn.Flatten(), torch.nn.Linear(32, 5)).eval()
    c = sweep(net, lambda b: (torch.randn(b, 3, 12, 12),), [2, 3, 4, 7, 16], atol=1e-4, rtol=1e-4)
    assert counts(c) == (2, 3), c


def test_attention_module_over_lengths():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()

    def f(x):
        return mha(x, x, x, need_weights=False)[0]

    c = sweep(f, lambda n: (torch.randn(2, n, 32),), [4, 6, 9, 13, 30], atol=1e-4, rtol=1e-4)
    assert counts(c) == (2, 3), c


def test_size_through_an_inlined_helper():
    def rows(t, n):
        return t.view(n, -1)

    def f(x):
        return rows(x, x.size(0)).sum(1)

    c = sweep(f, lambda n: (torch.randn(n, 2, 3),), [2, 3, 6, 10])
    assert counts(c) == (2, 2), c


def test_rank_is_not_a_size():
    def f(x):
        if len(x.shape) == 2 and x.dim() == 2:
            return x.view(x.shape[0], -1) * 3
        return x

    c = sweep(f, lambda n: (torch.randn(n, 4),), [2, 3, 6, 11])
    assert counts(c) == (2, 2), c


@pytest.mark.parametrize("use", ["branch", "plus", "math", "result", "closure", "range", "varargs", "dict",
                                 "compare_shapes", "format", "floor_small", "star_branch", "data"])
def test_size_used_as_a_number_keeps_traces_apart(use):
    """The size of the varying dimension decides something in Python: every size is recorded
    (and each result matches eager, Python numbers included)."""
    def helper(*args):
        return args[0] + 1

    def pick(*args):  # reached through f(*shape): the pairs are rebuilt, so the call fixes them
        return 2.0 if args[0] > 5 else 3.0

    def f(x):
        n = x.size(0)
        if use == "branch":
            return x * 2 if n > 5 else x - 1
        if use == "plus":
            return x.new_ones(n + 1)
        if use == "math":
            return x / math.sqrt(n)
        if use == "result":
            return x * 2, n
        if use == "closure":
            return (lambda: x * n)()
        if use == "range":
            return sum(x[i] for i in range(n))
        if use == "varargs":
            return x.new_ones(helper(n))
        if use == "dict":
            return x * {"n": n}["n"]
        if use == "compare_shapes":
            return x * 2 if x.shape == (6, 3) else x + 1
        if use == "format":
            return x * len(f"{n}")
        if use == "star_branch":
            return x * pick(*x.shape)
        if use == "data":
            return x * torch.tensor([n, 1.0]).sum()
        return x.new_ones(n // 100 * 3 + 2)  # the same number at every size swept

    c = sweep(f, lambda n: (torch.randn(n, 3),), [2, 3, 6, 9, 12])
    assert c["size_instances"] == 0, c
    assert c["traces_compiled"] == 5, c


def test_fixed_dimension_that_stays_the_same():
    """The feature size decides a branch but only the batch varies: a family over the batch."""
    def f(x):
        scale = 1.0 / math.sqrt(x.size(-1))
        if x.shape[-1] > 4:
            return (x @ x.transpose(0, 1)) * scale
        return x

    c = sweep(f, lambda n: (torch.randn(n, 8),), [2, 3, 5, 9])
    assert counts(c) == (2, 2), c


def test_explain_says_where_the_size_was_used():
    def f(x):
        return x.new_ones(x.size(0) % 5 + 1)  # (% of a size: used as a number)

    opt = dynamo.optimize(f)
    for n in (2, 3):
        opt(torch.randn(n, 2))
    text = str(dynamo.explain(opt, torch.randn(4, 2)))
    assert "size used as a number in Python at test_size_reads.py" in text and "a[0].size(0)" in text, text


def test_matmul_and_bmm_over_both_sizes():
    w = torch.randn(16, 12)

    def f(x):
        b, t, _ = x.shape
        y = (x @ w).relu()                        # [b, t, 12]
        att = torch.bmm(y, y.transpose(1, 2))     # [b, t, t]
        return att.softmax(-1) @ y, y.reshape(b * t, 12).sum(0)

    pairs = [(2, 5), (3, 9), (4, 7), (2, 13), (5, 3), (6, 6)]
    c = sweep(f, lambda p: (torch.randn(p[0], p[1], 16),), pairs, atol=1e-4, rtol=1e-4)
    assert c["traces_compiled"] == 2 and c["size_instances"] == 4, c


def test_in_place_write_sized_by_python():
    def f(x, y):
        n = x.size(0)
        x.add_(y.view(n, 5))  # n only shapes the view
        return x.sum(1)

    def make(n):
        return torch.randn(n, 5), torch.randn(n * 5)

    opt = dynamo.optimize(f)
    for n in [2, 4, 6, 9]:
        x, y = make(n)
        x2 = x.clone()
        torch.testing.assert_close(opt(x, y), f(x2, y))
        torch.testing.assert_close(x, x2)
    assert dynamo.counters()["size_instances"] == 2, dynamo.counters()


def test_side_exits_at_many_sizes():
    """A data-dependent branch (a side exit) at each size: such traces join size families, and
    every call, on either side of the branch, matches eager."""
    def f(x):
        y = x * 2
        if y.sum() > 0:
            return y.view(x.size(0), -1).relu()
        return y - 1

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in [2, 3, 5, 8, 3, 5]:
            for sign in (1, -1):
                x = sign * (torch.rand(n, 4) + 0.1)
                torch.testing.assert_close(opt(x), f(x))
    c = dynamo.counters()
    assert c["size_instances"] >= 1 and c["eager_runs"] == 0, c


def test_an_instance_resumes_an_exit_with_its_own_sizes():
    """Sizes Python computed are live at a side exit: an instance of the family that takes the
    exit resumes with the numbers of its own sizes (the snapshot reads them from its tensors)."""
    def f(x):
        n = x.shape[0] + 1
        shape = x.shape
        y = x * 2
        if y.sum() > 0:
            return y.sum(0) * 2
        return (y[: n - 2] - 1).reshape(shape[1], -1), n, shape

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in [3, 4, 6, 9, 7, 12, 5]:  # the family forms on the positive path; then both
            for sign in ((1,) if n < 6 else (1, -1)):
                x = sign * (torch.rand(n, 4) + 0.1)
                want, got = f(x), opt(x)
                torch.testing.assert_close(got, want)
    c = dynamo.counters()
    assert c["size_instances"] >= 3 and c["eager_runs"] == 0 and c["side_exits"] >= 1, c


def test_dims_in_step_then_apart():
    """Batch and length double together: one variable with the length a multiple of it; a call
    outside that relation is recorded and pairs with an earlier trace into a family of two
    variables. Every call matches eager."""
    lin = torch.nn.Linear(6, 6)

    def f(x):
        return lin(x).softmax(-1).sum(1)

    pairs = [(2, 4), (4, 8), (8, 16), (3, 8), (5, 7), (6, 11), (3, 6)]
    c = sweep(f, lambda p: (torch.randn(p[0], p[1], 6),), pairs, atol=1e-5, rtol=1e-4)
    assert c["traces_compiled"] == 3 and c["size_instances"] == 4, c


def test_mark_dynamic_under_dynamic_false():
    """config.dynamic = False specializes every size, except dims marked dynamic: a family may
    vary those (and only those)."""
    def f(x):
        return (x * 2).sum(-1)

    old = dynamo.config.dynamic
    dynamo.config.dynamic = False
    try:
        c = sweep(f, lambda n: (dynamo.mark_dynamic(torch.randn(n, 4), 0),), [2, 3, 5, 9])
        assert counts(c) == (2, 2), c
        dynamo.reset()
        # dim 1 changes but only dim 0 is marked: every size recorded
        c = sweep(f, lambda n: (dynamo.mark_dynamic(torch.randn(3, n), 0),), [2, 3, 5, 9])
        assert counts(c) == (4, 0), c
    finally:
        dynamo.config.dynamic = old


def test_mark_dynamic_says_why_no_family(capfd):
    def f(x):
        return x.new_ones(x.size(0) % 5 + 1)  # (% of a size: used as a number)

    opt = dynamo.optimize(f)
    for n in (2, 3, 4):
        torch.testing.assert_close(opt(dynamo.mark_dynamic(torch.randn(n, 2), 0)), f(torch.randn(n, 2)))
    err = capfd.readouterr().err
    assert err.count("dims marked dynamic, but the trace serves its own sizes") == 1, err
    assert "as a number in Python" in err, err


def test_mark_dynamic_bad_arguments():
    with pytest.raises(TypeError):
        dynamo.mark_dynamic([1, 2], 0)
    with pytest.raises(IndexError):
        dynamo.mark_dynamic(torch.randn(2, 3), 2)
    t = dynamo.mark_dynamic(torch.randn(2, 3), -1, 0)
    assert t._dynamo_dynamic == {0, 1}


def test_star_shapes_into_a_view():
    """x.view(*x.shape[:-1], h, d) and a shape built with + then unpacked into view: the sizes
    stay free (the list and tuple carry them)."""
    def f(x):
        y = x.view(*x.shape[:-1], 2, 4).transpose(-2, -3)
        new = y.size()[:-2] + (y.size(-2) * 4,)
        return y.contiguous().view(*new) * 2, [d * 2 for d in x.shape[:1]][0] * x[:, :1]

    c = sweep(f, lambda n: (torch.randn(3, n, 8),), [2, 3, 5, 9])
    # the comprehension's result multiplies a tensor: the number becomes an IR constant (fitted)
    assert counts(c) == (2, 2), c


def test_a_failure_while_following_sizes_is_not_the_programs(monkeypatch):
    """dynamo's own error in following a size never reaches the program: the call is right and
    the trace keeps its own sizes."""
    from dynamo import sizeflow

    def broken(self, f, op, ins):
        if op == "CALL":
            raise KeyError("injected")
        return None

    monkeypatch.setattr(sizeflow.SizeFlow, "_size_step", broken)

    def f(x):
        return x.view(x.size(0), -1) * 2

    c = sweep(f, lambda n: (torch.randn(n, 2, 2),), [2, 3, 5])
    assert c["size_instances"] == 0 and c["eager_runs"] == 0 and c["traces_compiled"] == 3, c
