"""Classes and the data model (the language reference's "Data model" and "Class definitions"):
attributes on instances and classes, properties, class and static methods, `super()` in single
and multiple inheritance (the MRO), dunder methods the program defines (`__call__`, `__len__`,
`__getitem__`, `__iter__`, `__contains__`, `__add__` and the reflected forms, `__eq__`,
`__bool__`, `__getattr__`), context managers written as classes and with contextlib, and
nn.Module idioms. Compared with eager on three calls."""
import abc
import contextlib
import enum

import pytest
import torch

from compare import matches_eager

LOG = []


class Scale:
    factor = 2.0

    def __init__(self, k):
        self.k = k

    def __call__(self, t):
        return t * self.k * self.factor

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return self.k * (i + 1)

    def __contains__(self, v):
        return v == self.k

    def __bool__(self):
        return self.k != 0

    def __repr__(self):
        return f"Scale({self.k})"


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + (other.t if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return Vec(self.t + other)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __neg__(self):
        return Vec(-self.t)

    def __eq__(self, other):
        return isinstance(other, Vec) and other.t is self.t

    __hash__ = object.__hash__

    def __iter__(self):
        return iter((self.t, self.t * 2))


class Lazy:
    def __init__(self, t):
        self._t = t

    def __getattr__(self, name):
        if name.startswith("twice_"):
            return getattr(self._t, name[len("twice_"):]) * 2
        raise AttributeError(name)


class Animal:
    def speak(self, t):
        return t + 1

    def name(self):
        return "animal"


class Dog(Animal):
    def speak(self, t):
        return super().speak(t) * 2

    def name(self):
        return "dog:" + super().name()


class A:
    def who(self):
        return ["A"]


class B(A):
    def who(self):
        return ["B"] + super().who()


class C(A):
    def who(self):
        return ["C"] + super().who()


class D(B, C):
    def who(self):
        return ["D"] + super().who()


class Temperature:
    def __init__(self, c):
        self._c = c

    @property
    def f(self):
        return self._c * 9 / 5 + 32

    @f.setter
    def f(self, v):
        self._c = (v - 32) * 5 / 9

    @classmethod
    def freezing(cls):
        return cls(0.0)

    @staticmethod
    def offset():
        return 32


class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self, t):
        ...

    def double(self, t):
        return self.area(t) * 2


class Square(Shape):
    def area(self, t):
        return t * t


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Flags(enum.IntFlag):
    R = 1
    W = 2


class Logged:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        LOG.append(("enter", self.name))
        return self

    def __exit__(self, kind, value, tb):
        LOG.append(("exit", self.name, kind.__name__ if kind else None))
        return kind is KeyError  # swallows KeyError only


@contextlib.contextmanager
def logged_cm(name):
    LOG.append(("enter", name))
    try:
        yield name.upper()
    finally:
        LOG.append(("exit", name))


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        return self.lin(x).relu()


def callable_object(a, b):
    s = Scale(3)
    return s(a), len(s), s[1], 3 in s, bool(s), repr(s)


def operator_overloads(a, b):
    v = Vec(a) + Vec(b)
    w = 1.0 + Vec(a)
    u = -(Vec(b) * 2)
    return v.t, w.t, u.t


def eq_and_hash(a, b):
    v = Vec(a)
    return v == Vec(a), v == Vec(b), len({v, v}), a + 0


def iter_protocol(a, b):
    x, y = Vec(a)
    return x + y, list(Vec(b))


def getattr_fallback(a, b):
    lz = Lazy(a)
    try:
        lz.missing
    except AttributeError as e:
        return lz.twice_T if False else lz.twice_data + 0, str(e)


def super_single(a, b):
    d = Dog()
    return d.speak(a), d.name(), isinstance(d, Animal)


def super_diamond(a, b):
    return D().who(), [k.__name__ for k in D.__mro__], a * len(D.__mro__)


def property_get_set(a, b):
    t = Temperature(a)
    f = t.f
    t.f = f + 9
    return f, t._c, Temperature.freezing().f, Temperature.offset()


def abstract_class(a, b):
    try:
        Shape()
    except TypeError:
        refused = True
    return Square().double(a), refused


def enums(a, b):
    c = Color.GREEN
    return c.value, c.name, Color(1) is Color.RED, a * c.value, int(Flags.R | Flags.W), list(Color)[0].name


def class_attribute_vs_instance(a, b):
    s = Scale(1)
    s.factor = 5.0
    return s(a), Scale.factor, Scale(1)(b)


def setattr_getattr_delattr(a, b):
    s = Scale(2)
    setattr(s, "extra", a)
    v = getattr(s, "extra") * 2
    delattr(s, "extra")
    return v, hasattr(s, "extra")


def vars_and_dict(a, b):
    s = Scale(4)
    return sorted(vars(s)), s.__dict__["k"], type(s).__name__, a * 1


def class_made_in_call(a, b):
    class Local:
        base = 10

        def __init__(self, t):
            self.t = t

        def get(self):
            return self.t + self.base
    return Local(a).get(), Local.__name__


def class_with_type(a, b):
    K = type("K", (), {"k": 3, "mul": lambda self, t: t * self.k})
    return K().mul(a), K.__name__


def context_manager_class(a, b):
    LOG.clear()
    with Logged("x") as cm:
        y = a * 2
    return y, cm.name, list(LOG)


def context_manager_swallows(a, b):
    LOG.clear()
    with Logged("y"):
        raise KeyError("gone")
    return a + b, list(LOG)


def context_manager_propagates(a, b):
    LOG.clear()
    try:
        with Logged("z"):
            raise ValueError("kept")
    except ValueError as e:
        return a * 3, str(e), list(LOG)


def nested_with(a, b):
    LOG.clear()
    with Logged("outer"), Logged("inner"):
        y = a - b
    return y, list(LOG)


def contextmanager_decorator(a, b):
    LOG.clear()
    with logged_cm("cm") as name:
        y = a * len(name)
    return y, name, list(LOG)


def contextmanager_with_error(a, b):
    LOG.clear()
    try:
        with logged_cm("err"):
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    return b * 1, list(LOG)


def exit_stack(a, b):
    LOG.clear()
    with contextlib.ExitStack() as stack:
        stack.enter_context(Logged("s1"))
        stack.callback(LOG.append, "callback")
        y = a + 1
    return y, list(LOG)


def suppress(a, b):
    with contextlib.suppress(ZeroDivisionError):
        1 / 0
    return a * 2


def module_forward(a, b):
    torch.manual_seed(0)
    m = Counter()
    return m(a.view(1, 4)), sorted(n for n, _ in m.named_parameters()), m.steps + 0


def module_children(a, b):
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    names = [type(c).__name__ for c in seq.children()]
    out = a
    for layer in seq:
        out = layer(out)
    return out, names, len(seq), type(seq[0]).__name__


def module_dict_and_list(a, b):
    md = torch.nn.ModuleDict({"r": torch.nn.ReLU(), "s": torch.nn.Sigmoid()})
    ml = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.ReLU()])
    return md["s"](a), [m(b) for m in ml], list(md.keys())


def isinstance_hierarchy(a, b):
    d = D()
    return isinstance(d, B), isinstance(d, C), issubclass(D, A), type(d) is D, a * 1


def instance_method_as_value(a, b):
    m = Dog().speak
    return m(a), m.__name__, callable(m)


def dunder_class_and_name(a, b):
    s = Scale(1)
    return s.__class__.__name__, Scale.__qualname__, Scale.__module__ == __name__, b * 1


CASES = [callable_object, operator_overloads, eq_and_hash, iter_protocol, getattr_fallback, super_single,
         super_diamond, property_get_set, abstract_class, enums, class_attribute_vs_instance,
         setattr_getattr_delattr, vars_and_dict, class_made_in_call, class_with_type, context_manager_class,
         context_manager_swallows, context_manager_propagates, nested_with, contextmanager_decorator,
         contextmanager_with_error, exit_stack, suppress, module_forward, module_children, module_dict_and_list,
         isinstance_hierarchy, instance_method_as_value, dunder_class_and_name]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_objects_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
