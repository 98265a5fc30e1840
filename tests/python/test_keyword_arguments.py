"""Values passed through `**kwargs`: read with [], get, pop, setdefault, items, values or a copy,
forwarded with f(**kwargs) or merged into {**kwargs}, replaced before they are forwarded, and
live across a stitch. Each function is called with keyword values that change between calls;
every call must match eager (a value read from the dict without its source would be a constant
of the trace, and the next call would get the first call's answer), and tensors forwarded by a
decorator (Hugging Face's `can_return_tuple`, `check_model_inputs`) must run natively."""
import functools

import pytest
import torch

import dynamo


def _by_item(x, **kw):
    return x * kw["scale"] + 1


def _by_get(x, **kw):
    return x * kw.get("scale", 1.0) + kw.get("shift", 0.0)


def _by_pop(x, **kw):
    s = kw.pop("scale", 1.0)
    return x * s - len(kw)


def _by_setdefault(x, **kw):
    return x * kw.setdefault("scale", 0.5)


def _by_items(x, **kw):
    out = x
    for name, v in kw.items():
        out = out * v if name == "scale" else out + v
    return out


def _by_values(x, **kw):
    return x * sum(kw.values())


def _by_copy(x, **kw):
    c = kw.copy()
    return x * c["scale"]


def _inner(x, scale=1.0, shift=0.0, as_tuple=False):
    y = x * scale + shift
    return (y,) if as_tuple else y


def _forwarded(x, **kw):
    return _inner(x, **kw)


def _merged(x, **kw):
    d = {**kw, "shift": 1.0}
    return x * d["scale"] + d["shift"]


def _replaced_then_forwarded(x, **kw):
    kw["scale"] = kw["scale"] * 2
    kw["shift"] = x.sum()
    return _inner(x, **kw)


def _removed_then_forwarded(x, **kw):
    kw.pop("shift", None)
    return _inner(x, **kw)


def _return_dict_style(x, **kw):
    return_dict = kw.pop("return_dict", True)  # (transformers' can_return_tuple)
    out = _inner(x, **kw)
    return {"y": out} if return_dict else (out,)


def _across_a_stitch(x, **kw):
    kw["scale"] = kw["scale"] + 1
    n = len(x.tolist())  # not recordable: the trace stitches here
    return x * kw["scale"] + n


CASES = [_by_item, _by_get, _by_pop, _by_setdefault, _by_items, _by_values, _by_copy, _forwarded, _merged,
         _replaced_then_forwarded, _removed_then_forwarded, _return_dict_style, _across_a_stitch]
KWARGS = [dict(scale=2.0, shift=0.5), dict(scale=3.0, shift=0.5), dict(scale=3.0, shift=-1.0),
          dict(scale=-1.5, shift=0.25), dict(scale=2.0, shift=0.5)]


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same(got[k], want[k])
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.lstrip("_"))
def test_keyword_values_that_change_between_calls(fn):
    opt = dynamo.optimize(fn)
    x = torch.randn(7)
    with torch.no_grad():
        for kw in KWARGS:
            extra = {"return_dict": kw["scale"] > 0} if fn is _return_dict_style else {}
            _same(opt(x, **kw, **extra), fn(x, **kw, **extra))


def test_a_tensor_forwarded_by_a_decorator_runs_natively():
    def deco(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            kwargs.pop("return_dict", None)
            return func(self, *args, **kwargs)
        return wrapper

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        @deco
        def forward(self, input_ids=None, scale=1.0):
            return self.emb(input_ids) * scale

    m = M()
    opt = dynamo.optimize(m.forward)
    ids = torch.randint(0, 10, (1, 5))
    before = dynamo.counters()["native_runs"]
    with torch.no_grad():
        for s in (1.0, 2.0, 2.0, 2.0):
            torch.testing.assert_close(opt(input_ids=ids, scale=s), m.forward(input_ids=ids, scale=s))
    assert dynamo.counters()["native_runs"] - before >= 2, dynamo.explain(m.forward, input_ids=ids)
