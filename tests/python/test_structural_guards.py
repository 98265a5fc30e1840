"""Plain data objects passed to a compiled function (torchvision's ImageList, a dataclass, any
instance of an ordinary Python class) are guarded by their class and the attributes the trace
reads, not by identity: a fresh object each call runs the same trace. Where the trace depends on
which object it is (`is`, `==`, a dict key, a builtin given the object), it is guarded by
identity as before. Results equal eager's on every call."""
import collections
import dataclasses

import torch

import dynamo


@dataclasses.dataclass(eq=False)
class Batch:
    x: torch.Tensor
    scale: float


class Plain:
    def __init__(self, t, n):
        self.t, self.n = t, n


class Other:  # the same attributes, another class
    def __init__(self, t, n):
        self.t, self.n = t, n


def scaled(b, p):
    return (b.x * b.scale + p.t).relu() * p.n


def test_a_fresh_object_every_call_runs_one_trace():
    jit = dynamo.optimize(scaled)
    with torch.no_grad():
        for _ in range(6):
            b, p = Batch(torch.randn(7), 2.0), Plain(torch.randn(7), 3)
            assert torch.allclose(jit(b, p), scaled(b, p))
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["native_runs"] == 5, c
    assert "class" in str(dynamo.explain(scaled, Batch(torch.randn(7), 2.0), Plain(torch.randn(7), 3)))


def test_attributes_are_guarded_as_read():
    jit = dynamo.optimize(scaled)
    with torch.no_grad():
        for scale, n, size in [(2.0, 3, 7), (2.5, 3, 7), (2.0, 4, 7), (2.0, 3, 1023), (2.0, 3, 7)]:
            b, p = Batch(torch.randn(size), scale), Plain(torch.randn(size), n)
            assert torch.allclose(jit(b, p), scaled(b, p))
        b, p = Batch(torch.randn(7), 2.0), Other(torch.randn(7), 3)  # another class: another trace
        assert torch.allclose(jit(b, p), scaled(b, p))
    c = dynamo.counters()
    assert c["traces_compiled"] == 5 and c["native_runs"] == 1, c


def same_or_not(p, q):
    return p.t + (1.0 if p is q else 2.0)


def test_identity_comparisons_pin_the_object():
    jit = dynamo.optimize(same_or_not)
    with torch.no_grad():
        for i in range(6):
            p = Plain(torch.randn(3), 1)
            q = p if i % 2 else Plain(torch.randn(3), 1)
            assert torch.equal(jit(p, q), same_or_not(p, q)), i


TABLE = {}


def by_key(p):
    return p.t * TABLE.get(p, 5.0)


def test_an_object_used_as_a_dict_key_is_pinned():
    jit = dynamo.optimize(by_key)
    with torch.no_grad():
        first = Plain(torch.randn(4), 0)
        TABLE[first] = 3.0
        assert torch.equal(jit(first), first.t * 3.0)
        assert torch.equal(jit(first), first.t * 3.0)
        other = Plain(torch.randn(4), 0)  # not in the table: the default
        assert torch.equal(jit(other), other.t * 5.0)
    TABLE.clear()


class Sized:
    def __init__(self, t, k):
        self.t, self.k = t, k

    def __len__(self):
        return self.k


def by_len(s):
    return s.t * len(s)


def test_an_object_handed_to_a_builtin_is_pinned():
    jit = dynamo.optimize(by_len)
    with torch.no_grad():
        for k in (2, 3, 2, 5):
            s = Sized(torch.randn(4), k)
            assert torch.equal(jit(s), s.t * k)


def test_mutated_attributes_of_the_same_object_are_seen():
    jit = dynamo.optimize(scaled)
    b, p = Batch(torch.randn(7), 2.0), Plain(torch.randn(7), 3)
    with torch.no_grad():
        assert torch.allclose(jit(b, p), scaled(b, p))
        b.scale, p.t = -1.0, torch.randn(7)
        assert torch.allclose(jit(b, p), scaled(b, p))
        b.x = torch.randn(2, 7)
        assert torch.allclose(jit(b, p), scaled(b, p))


@dataclasses.dataclass
class Config:  # eq=True (the default): an __eq__ of its own, unhashable
    scale: float
    bias: torch.Tensor


def configured(x, cfg):
    return x * cfg.scale + cfg.bias


def configured_same(x, cfg, other):
    return x + (1.0 if cfg == other else 0.0)


def test_a_default_dataclass_made_each_call_runs_one_trace_and_compares_by_its_eq():
    jit = dynamo.optimize(configured)
    with torch.no_grad():
        for _ in range(5):
            x, cfg = torch.randn(6), Config(0.5, torch.randn(6))
            assert torch.allclose(jit(x, cfg), configured(x, cfg))
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["native_runs"] == 4, c
    jit2 = dynamo.optimize(configured_same)
    with torch.no_grad():
        b = (0.0, 0.0)  # (not a tensor: 3.13's dataclass __eq__ compares field by field, which eager cannot)
        for cfg, other in [(Config(1.0, b), Config(1.0, b)), (Config(1.0, b), Config(2.0, b)),
                           (Config(3.0, b), Config(3.0, b))]:
            x = torch.randn(2)
            assert torch.equal(jit2(x, cfg, other), configured_same(x, cfg, other))


class _Output(collections.OrderedDict):
    """As Hugging Face's ModelOutput: an ordered dict whose fields are attributes too, with its
    own __getitem__ (an int gives the tuple's element) and __setattr__."""

    def __init__(self, **fields):
        super().__init__()
        for k, v in fields.items():
            setattr(self, k, v)

    def __setattr__(self, name, value):
        super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else tuple(self.values())[k]


def _read_output(x, out=None):
    y = x + out.hidden + out[0]
    if "extra" in out:
        y = y * out.extra
    return y.relu() * len(out)


def test_a_dict_subclass_made_each_call_is_guarded_by_class_and_keys():
    """A new output object each call with the same keys runs one trace (its attributes guarded
    as read); one with another key set is not taken for it; a value changed is seen."""
    opt = dynamo.optimize(_read_output)
    before = dict(dynamo.counters())
    with torch.no_grad():
        for k in range(6):
            x = torch.randn(4)
            out = _Output(hidden=torch.randn(4)) if k != 4 else _Output(hidden=torch.randn(4), extra=torch.randn(4))
            torch.testing.assert_close(opt(x, out=out), _read_output(x, out=out))
    c = dynamo.counters()
    assert c["traces_compiled"] - before["traces_compiled"] == 2, c
    assert c["native_runs"] - before["native_runs"] >= 3, c
