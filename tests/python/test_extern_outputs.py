"""A returned tensor that is an extern's result (a product, a convolution, a LibTorch op) is
handed out as the tensor LibTorch made (dynamo_entry_run_alloc, CPU), not copied into an
engine buffer: each call's results are their own memory, later calls never write into an
earlier result, and the edge cases (the same result returned twice, a view beside it, an empty
result, integer results, a trace with a side exit, which keeps the copy) match eager."""
import torch

import dynamo


def product_and_conv(a, b, c, k):
    y = torch.mm(a, b)
    z = torch.nn.functional.conv2d(c, k)
    return y, z, y.sum()


def test_results_are_their_own_memory_call_after_call():
    f = dynamo.optimize(product_and_conv)
    a, b, c, k = torch.randn(8, 16), torch.randn(16, 5), torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    runs = dynamo.counters()["native_runs"]
    got = [f(a * (i + 1), b, c, k) for i in range(4)]
    assert dynamo.counters()["native_runs"] >= runs + 3
    kept = [(g[0].clone(), g[1].clone()) for g in got]
    for i, g in enumerate(got):
        want = product_and_conv(a * (i + 1), b, c, k)
        for x, w in zip(g, want):
            assert x.shape == w.shape and x.dtype == w.dtype and x.is_contiguous()
            assert torch.allclose(x, w, atol=1e-4)
    assert len({g[0].data_ptr() for g in got}) == 4 and len({g[1].data_ptr() for g in got}) == 4
    for g, (y, z) in zip(got, kept):  # nothing wrote into an earlier call's results
        assert torch.equal(g[0], y) and torch.equal(g[1], z)
    got[0][0][0, 0] = 1e6  # a result is the caller's to write
    assert not torch.equal(f(a, b, c, k)[0], got[0][0])


def twice_and_a_view(a, b):
    y = a @ b
    return y, y, y.t(), y * 2


def test_the_same_result_twice_and_a_view_of_it():
    f = dynamo.optimize(twice_and_a_view)
    a, b = torch.randn(7, 3), torch.randn(3, 1023)
    for _ in range(3):
        want, got = twice_and_a_view(a, b), f(a, b)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride() and torch.allclose(g, w, atol=1e-5)


def empty_and_integer(a, b, x):
    return a @ b, torch.argsort(x, dim=1), torch.cumsum(x, 0)


def test_empty_and_integer_results():
    f = dynamo.optimize(empty_and_integer)
    for rows in [0, 1, 7]:
        a, b, x = torch.randn(rows, 4), torch.randn(4, 3), torch.randn(5, 9)
        for _ in range(3):
            want, got = empty_and_integer(a, b, x), f(a, b, x)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype and torch.allclose(g.double(), w.double(), atol=1e-5)


def with_a_branch(a, b):
    y = a @ b
    if y.sum() > 0:
        return y, y + 1
    return y, y - 1


def test_a_trace_with_a_side_exit_keeps_its_copy():
    f = dynamo.optimize(with_a_branch)
    b = torch.randn(6, 4)
    for s in [1.0, -1.0, 1.0, -1.0, 1.0]:
        a = torch.ones(3, 6) * s
        b_pos = b.abs()
        want, got = with_a_branch(a, b_pos), f(a, b_pos)
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-5)


def views_of_computed(x):
    y = x * 2
    return y.diagonal(), y.unfold(0, 2, 1), torch.chunk(y, 2)[1]


def test_results_that_view_computed_tensors_stay_after_later_calls():
    # (a LibTorch view of memory the call only borrowed -- an input, an output, scratch -- is
    # copied before it is handed out: that memory is reused by the next call)
    f = dynamo.optimize(views_of_computed)
    x = torch.randn(6, 6)
    got = [f(x) for _ in range(3)][-1]
    kept = [g.clone() for g in got]
    for _ in range(5):
        f(torch.randn(6, 6))
    for g, k, w in zip(got, kept, views_of_computed(x)):
        assert torch.equal(g, k) and torch.allclose(g, w)
