"""A returned tensor that is a view of a tensor the trace computed comes back as eager's view of
that tensor: the trace returns the base and the call takes the view with eager's sizes, strides
and offset, so two returned views of one tensor share memory as they do in eager (a write
through one shows in the other) and no copy kernel makes a transposed result dense."""
import torch

import dynamo


def pair(x):
    y = x * 2 + 1
    return y, y.t(), y[1:, ::2]


def transposed_product(x, w):
    return (x @ w).transpose(0, 1)


def test_views_of_a_result_alias_it_as_in_eager():
    f = dynamo.optimize(pair)
    for shape in [(7, 5), (1, 3), (4, 1023)]:
        for _ in range(3):
            x = torch.randn(*shape)
            want, got = pair(x), f(x)
            for w, g in zip(want, got):
                assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w)
            got[0][-1, -1] = 100.0  # one memory, as eager's
            assert got[1][-1, -1] == 100.0
    assert dynamo.counters()["native_runs"] >= 6


def test_a_transposed_extern_result():
    f = dynamo.optimize(transposed_product)
    w = torch.randn(16, 9)
    for _ in range(3):
        x = torch.randn(5, 16)
        want, got = transposed_product(x, w), f(x, w)
        assert got.stride() == want.stride() and torch.allclose(got, want, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= 2


def view_of_input(x):
    return x.t()  # a view of an input: the input itself, viewed (no trace value to return)


def test_a_view_of_an_input_stays_right():
    f = dynamo.optimize(view_of_input)
    for _ in range(3):
        x = torch.randn(3, 4)
        assert torch.equal(f(x), x.t())


def test_in_place_view_ops_change_the_shape_as_in_eager():
    """squeeze_, unsqueeze_, t_, transpose_ on a temporary (torch's vector @ matrix squeezes
    its product in place): the compiled result has eager's shape, not the pre-op one."""
    w = torch.randn(7, 4)

    def vec_mat(x):
        return x @ w

    def chain(x):
        y = x * 2
        y.unsqueeze_(0)
        y.t_()
        return y + 1, y

    def swap(x):
        y = x.exp()
        y.transpose_(0, 1)
        z = y * 3
        z.unsqueeze_(-1)
        z.squeeze_(-1)
        return z

    def of_a_view(x):  # a view's shape changed in place: left to eager (its writes follow the old shape)
        z = (x * 3).unsqueeze(-1)
        z.squeeze_(-1)
        return z

    def on_input(x):  # changes the caller's tensor: left to eager, whose result it must match
        x.unsqueeze_(0)
        return x * 2

    cases = [(vec_mat, lambda: torch.randn(7)), (chain, lambda: torch.randn(5)), (swap, lambda: torch.randn(3, 6)),
             (on_input, lambda: torch.randn(4)), (of_a_view, lambda: torch.randn(3, 6))]
    for fn, make in cases:
        f = dynamo.optimize(fn)
        for _ in range(3):
            x = make()
            x2 = x.clone()
            want, got = fn(x2), f(x)
            want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
            for w_, g in zip(want, got):
                assert g.shape == w_.shape, fn.__name__
                assert [s for s, n in zip(g.stride(), g.shape) if n > 1] == \
                    [s for s, n in zip(w_.stride(), w_.shape) if n > 1], fn.__name__
                torch.testing.assert_close(g, w_)
            assert x.shape == x2.shape, fn.__name__
    assert dynamo.counters()["native_runs"] >= 6


def test_a_view_of_an_input_made_by_a_libtorch_op_is_returned_as_that_view():
    """`g.diagonal()`, `x.unfold(...)`: views the IR has no op for run as LibTorch calls, whose
    result the native call hands out as a copy; eager returns a view of the input, so a later
    write into the input shows through it and a write through it reaches the input. Found by the
    program fuzzer (seed 40404: a global's diagonal returned, the global scaled between calls)."""
    G = torch.randn(3, 3, 4, 4)

    def f(x):
        return torch.exp(x).sum(0), G.diagonal(), x.unfold(0, 2, 1)

    opt = dynamo.optimize(f)
    for k in range(4):
        x = torch.randn(5, 3)
        got, want = opt(x), f(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        assert got[1].stride() == want[1].stride() and got[2].stride() == want[2].stride()
        G.mul_(2)  # the input changes after the call: both calls' views see it
        torch.testing.assert_close(got[1], want[1])
        got[2].zero_()  # a write through the returned view reaches x, as in eager
        assert x.abs().sum() == 0, k
    assert opt.native_runs >= 2, dynamo.report()
