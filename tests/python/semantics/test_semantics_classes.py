"""Making objects (the language reference's "Basic customization": __new__ then __init__, as
type.__call__ runs them): classes with a __new__ of their own, builtin bases, namedtuples,
__slots__, __init_subclass__, class attributes and descriptors. Each function returns what it
built (or reads from it) and is compared with eager on three calls."""
import collections
import dataclasses
import typing

import numpy as np
import pytest
import torch

from compare import matches_eager

P = collections.namedtuple("P", "a b")
Q = collections.namedtuple("Q", ["x", "y", "z"], defaults=[0])


class Typed(typing.NamedTuple):
    a: torch.Tensor
    n: int = 3


class Pair(tuple):
    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))

    def total(self):
        return self[0] + self[1]


class Listed(list):
    def __new__(cls, *items):
        return super().__new__(cls)

    def __init__(self, *items):
        super().__init__(items)


class Counted(dict):
    def __init__(self, **kw):
        super().__init__(**kw)
        self["n"] = len(kw)


class NewOnly:
    def __new__(cls, x):
        obj = super().__new__(cls)
        obj.x = x * 2
        return obj


class NewAndInit:
    def __new__(cls, x):
        obj = super().__new__(cls)
        obj.order = ["new"]
        return obj

    def __init__(self, x):
        self.order.append("init")
        self.x = x + 1


class NewReturnsOther:
    def __new__(cls, x):
        return x * 3  # not an instance: __init__ does not run

    def __init__(self, x):
        raise AssertionError("never called")


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


class Base:
    registry = []

    def __init_subclass__(cls, tag="none", **kw):
        super().__init_subclass__(**kw)
        cls.tag = tag


class Tagged(Base, tag="t"):
    def __init__(self, x):
        self.x = x


class Meter:
    unit = "m"

    @property
    def twice(self):
        return self.v * 2

    def __init__(self, v):
        self.v = v

    @classmethod
    def make(cls, v):
        return cls(v + 1)

    @staticmethod
    def scale(v):
        return v * 10


@dataclasses.dataclass
class Point:
    x: torch.Tensor
    y: torch.Tensor
    label: str = "p"

    def norm(self):
        return (self.x * self.x + self.y * self.y).sqrt()


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: int = 2


def nt_from_nt(a, b):
    t = P(a, b)
    return P(t.a, t[1] + 1)


def nt_defaults(a, b):
    q = Q(a, b)
    return q.z, q.x * q.y, q._fields, q._replace(z=5).z


def nt_unpack(a, b):
    x, y = P(a, b)
    return x - y, P._make([a, b]).b, P(a=b, b=a)


def typed_namedtuple(a, b):
    t = Typed(a)
    return t.a * t.n, Typed(b, 2)


def tuple_subclass(a, b):
    p = Pair(a, b)
    return p.total(), type(p).__name__, len(p), isinstance(p, tuple)


def list_subclass(a, b):
    items = Listed(a, b)
    return len(items), items[0] + items[1], type(items).__name__


def dict_subclass(a, b):
    d = Counted(x=a, y=b)
    return d["n"], d["x"] * d["y"], sorted(d)


def new_only(a, b):
    return NewOnly(a).x + b


def new_and_init(a, b):
    o = NewAndInit(a)
    return o.order, o.x * b


def new_returns_other(a, b):
    return NewReturnsOther(a) + b


def slotted(a, b):
    s = Slotted(a, b)
    s.a = s.a + 1
    return s.a * s.b, hasattr(s, "__dict__")


def init_subclass(a, b):
    return Tagged(a).x + b, Tagged.tag, Base.__dict__.get("tag")


def descriptors(a, b):
    m = Meter.make(a)
    return m.twice, Meter.scale(b), m.unit, type(m).unit


def dataclass_made(a, b):
    p = Point(a, b)
    return p.norm(), p.label, dataclasses.astuple(Point(a, b, "q"))[2]


def frozen_dataclass(a, b):
    f = Frozen(3)
    try:
        f.a = 4
    except dataclasses.FrozenInstanceError:
        pass
    return a * (f.a + f.b), f == Frozen(3, 2)


def numpy_finfo(a, b):
    return a * float(np.finfo("float16").max) + b, float(np.finfo(np.float32).eps)


def object_takes_no_arguments(a, b):
    class Plain:
        pass
    try:
        Plain(a)
    except TypeError as e:
        return a + b, str(e)
    return a


CASES = [nt_from_nt, nt_defaults, nt_unpack, typed_namedtuple, tuple_subclass, list_subclass, dict_subclass,
         new_only, new_and_init, new_returns_other, slotted, init_subclass, descriptors, dataclass_made,
         frozen_dataclass, numpy_finfo, object_takes_no_arguments]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_objects_are_made_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
