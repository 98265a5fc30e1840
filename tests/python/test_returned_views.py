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
