"""Object identity (the language reference's "Objects, values and types": `is` compares
identity): an in-place tensor op returns its input object itself -- as a method, through the
class (`torch.Tensor.add_(y, 1)`), chained, on a view, across a call dynamo cannot record (a
stitch) -- so `is` tests, sets and dicts keyed on it behave as in eager. Compared with eager on
three calls, the inputs' contents after the call included."""
import pytest
import torch

from compare import matches_eager


def method_and_class_form(p, b):
    y = p.add_(1)
    z = torch.Tensor.add_(y, 1)
    return y is p, z is p, p * b


def chained(p, b):
    r = p.mul_(2).add_(1).clamp_(min=0)
    return r is p, p + b


def on_a_view(p, b):
    v = p[1:]
    w = v.mul_(2)
    u = w.relu_()
    return w is v, u is v, v is p, p * b


def keyed_by_identity(p, b):
    seen = {id(p): "p"}
    y = p.sub_(b)
    return seen.get(id(y)), y in [p], p * 1


def in_a_set(p, b):
    s = {p}
    return p.div_(2) in s, len(s), p + b


def out_of_place_is_new(p, b):
    y = p.add(1)
    z = p + 0
    return y is p, z is p, y * b


def across_a_stitch(p, b):
    y = p.add_(1)
    q = p * 2
    print(end="")  # a call dynamo cannot record: the trace stops and goes on after it
    z = torch.Tensor.add_(y, 1)
    return y is p, z is p, z is y, q * b


def setitem_then_identity(p, b):
    p[0] = 5.0
    y = p.neg_()
    return y is p, p + b


def copy_returns_self(p, b):
    y = p.copy_(b)
    return y is p, p * 2


def zero_and_fill(p, b):
    y = p.zero_()
    z = y.fill_(3.0)
    return y is p, z is p, p + b


def transpose_in_place(p, b):
    m = p.view(2, 2)
    t = m.t_()
    return t is m, m + 1, b * 1


CASES = [method_and_class_form, chained, on_a_view, keyed_by_identity, in_a_set, out_of_place_is_new,
         across_a_stitch, setitem_then_identity, copy_returns_self, zero_and_fill, transpose_in_place]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_in_place_results_are_their_inputs(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
