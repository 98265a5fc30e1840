"""torch's own Python helpers with bytecode the interpreter does not run (torch._assert imports
inside its body) run for real under recording, and collections.OrderedDict made and returned by
the function (torchvision's IntermediateLayerGetter): compiled, compared with eager every call."""
import collections

import pytest
import torch

import dynamo


def native_runs():
    return dynamo.counters()["native_runs"]


def test_torch_assert_passes_and_is_compiled():
    def f(x):
        torch._assert(x.dim() == 2, "expected a matrix")
        return x * 2 + 1
    jit = dynamo.optimize(f)
    for _ in range(3):
        x = torch.randn(3, 4)
        assert torch.allclose(jit(x), f(x))
    assert native_runs() >= 2


def test_torch_assert_failing_raises_as_eager():
    def f(x):
        torch._assert(x.dim() == 2, "expected a matrix")
        return x * 2
    jit = dynamo.optimize(f)
    jit(torch.randn(2, 2))
    jit(torch.randn(2, 2))
    for _ in range(2):
        with pytest.raises(AssertionError, match="expected a matrix"):
            jit(torch.randn(2, 2, 2))


def test_torch_assert_on_a_tensor_condition_falls_back_correctly():
    def f(x):
        torch._assert(x.sum() > -1000, "sum")  # reads the data: runs eagerly
        return x + 1
    jit = dynamo.optimize(f)
    for _ in range(3):
        x = torch.randn(5)
        assert torch.allclose(jit(x), f(x))


def test_ordered_dict_made_and_returned():
    def f(x):
        out = collections.OrderedDict()
        out["a"] = x.relu()
        out["b"] = x.sigmoid() * 2
        return out
    jit = dynamo.optimize(f)
    for _ in range(3):
        x = torch.randn(6)
        got, want = jit(x), f(x)
        assert type(got) is collections.OrderedDict and list(got) == list(want) == ["a", "b"]
        assert all(torch.allclose(got[k], want[k]) for k in want)
    assert native_runs() >= 2


def test_ordered_dict_from_pairs():
    def f(x, y):
        d = collections.OrderedDict([("y", y * 2), ("x", x + 1)])
        return d["x"] + d["y"], list(d.keys())
    jit = dynamo.optimize(f)
    for _ in range(3):
        x, y = torch.randn(4), torch.randn(4)
        (a, ka), (b, kb) = jit(x, y), f(x, y)
        assert torch.allclose(a, b) and ka == kb == ["y", "x"]
