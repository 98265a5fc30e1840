"""Expressions and simple and compound statements of the language reference, each around tensor
work: comprehensions (list, set, dict, nested, with conditions, over zip/enumerate), closures and
nonlocal, globals, unpacking (starred, nested, in for targets), f-strings and format specs,
conditional expressions, chained comparisons, boolean short-circuits, augmented assignment,
walrus, `match`, `del`, `assert`, loops with else, `global`. Compared with eager on three calls.
(PYTEST_DONT_REWRITE: the `assert` statements here are the program's, with Python's own messages.)"""
import functools
import operator

import pytest
import torch

from compare import matches_eager

COUNTER = 0
SCALE = 2.0


def list_comp(a, b):
    return [a * i for i in range(3)]


def list_comp_if(a, b):
    return [x + 1 for x in (a, b, a - b) if x.numel() == 4]


def nested_comp(a, b):
    return [[x * y for y in (1, 2)] for x in (a, b)]


def set_comp(a, b):
    return sorted({int(v) % 3 for v in range(10)}), a * 1


def dict_comp(a, b):
    return {f"k{i}": a * i for i in range(3)}


def dict_comp_zip(a, b):
    return {k: v for k, v in zip("xy", (a, b))}


def comp_enumerate(a, b):
    return [x * i for i, x in enumerate((a, b), start=1)]


def comp_shadowing(a, b):
    x = a
    ys = [x * 2 for x in (b, b)]
    return x, ys


def closure_read(a, b):
    k = 3.0

    def inner(t):
        return t * k
    return inner(a) + inner(b)


def closure_nonlocal(a, b):
    total = a * 0

    def add(t):
        nonlocal total
        total = total + t
    add(a)
    add(b)
    return total


def closure_late_binding(a, b):
    fns = [lambda t: t * i for i in range(3)]
    return [f(a) for f in fns]


def closure_default_binding(a, b):
    fns = [lambda t, i=i: t * i for i in range(3)]
    return [f(b) for f in fns]


def global_read(a, b):
    return a * SCALE


def global_write(a, b):
    global COUNTER
    COUNTER += 1
    return a + b, COUNTER > 0


def unpack_starred(a, b):
    first, *rest = (a, b, a + b, a - b)
    return first, rest


def unpack_nested(a, b):
    (p, q), r = (a, b), a * b
    return p + q + r


def unpack_in_for(a, b):
    out = a * 0
    for i, (x, y) in enumerate([(a, b), (b, a)]):
        out = out + x * y * i
    return out


def unpack_tensor_rows(a, b):
    m = torch.stack([a, b])
    x, y = m
    return x - y


def swap(a, b):
    a, b = b, a
    return a - b


def fstring(a, b):
    n = a.numel()
    return f"{n} elements, {n:03d}, {2.5:.2f}, {'x'!r}", a + b


def fstring_tensor_shape(a, b):
    return f"{tuple(a.shape)}/{a.dtype}", b * 2


def conditional_expr(a, b):
    return a if a.numel() > 3 else b, b if a.numel() > 10 else a


def chained_comparison(a, b):
    n = a.numel()
    return 1 < n <= 4 < 5, a * (0 < n < 3)


def short_circuit(a, b):
    n = a.numel()
    return (n > 0 and a) + 1, (n < 0 or b) * 2


def augmented(a, b):
    c = a * 1
    c += b
    c *= 2
    c -= 1
    c /= 4
    return c


def augmented_list(a, b):
    xs = [a]
    xs += [b]
    xs *= 2
    return xs


def walrus(a, b):
    if (n := a.numel()) > 2:
        return a * n
    return b


def match_literal(a, b):
    match a.dim():
        case 0:
            return b
        case 1:
            return a + 1
        case _:
            return a - 1


def match_sequence(a, b):
    match (a, b):
        case (x, y):
            return x * y
    return a


def match_mapping(a, b):
    match {"kind": "scale", "k": 3}:
        case {"kind": "scale", "k": k}:
            return a * k
        case _:
            return b


def match_class(a, b):
    match a:
        case torch.Tensor():
            return a + 2
        case _:
            return b


def del_name(a, b):
    c = a + b
    d = c * 2
    del c
    return d, "c" in dir()


def del_item(a, b):
    d = {"x": a, "y": b}
    del d["x"]
    xs = [a, b, a]
    del xs[1:]
    return d, xs


def assert_passes(a, b):
    assert a.numel() == 4, "four"
    return a * 2


def assert_fails(a, b):
    assert a.numel() == 5, "not five"
    return a


def for_else(a, b):
    for i in range(3):
        if i == 5:
            break
    else:
        return a * i
    return b


def while_else(a, b):
    i = 0
    while i < 3:
        i += 1
    else:
        a = a + i
    return a


def loop_break_continue(a, b):
    out = a * 0
    for i in range(6):
        if i % 2:
            continue
        if i > 3:
            break
        out = out + b * i
    return out


def lambda_sorted(a, b):
    xs = [(2, a), (1, b), (3, a + b)]
    return [t for _, t in sorted(xs, key=lambda p: p[0])]


def reduce_functools(a, b):
    return functools.reduce(operator.add, [a, b, a * b])


def operator_module(a, b):
    return operator.mul(a, b), operator.itemgetter(1)((a, b)), operator.attrgetter("shape")(a)


def string_methods(a, b):
    s = "Hello, World"
    return s.lower(), s.split(", "), "-".join(["x", "y"]), s.startswith("He"), a * len(s)


def slicing(a, b):
    xs = [a, b, a + b, a - b]
    return xs[1:3], xs[::-1], xs[-1], a[1:3] + b[:2]


def slice_objects(a, b):
    s = slice(1, None, 2)
    return a[s], [1, 2, 3, 4][s], b


def builtin_min_max(a, b):
    return max(3, 7, 1), min([a.numel(), 2]), max((a, b), key=lambda t: t.numel()) * 1


def builtin_sum_start(a, b):
    return sum([a, b], torch.zeros(4)), sum(range(5))


def builtin_any_all(a, b):
    return any(x > 2 for x in range(4)), all([]), a + 0


def builtin_isinstance(a, b):
    return isinstance(a, torch.Tensor), isinstance(3, (int, float)), issubclass(bool, int), b * 1


def builtin_len_range(a, b):
    r = range(2, 10, 3)
    return len(r), list(r), r[1], 5 in r, a * len(r)


def builtin_reversed_sorted(a, b):
    return list(reversed([1, 2, 3])), sorted([3, 1, 2], reverse=True), a + b


def builtin_divmod_pow(a, b):
    return divmod(17, 5), pow(2, 10), pow(2, -1), round(2.675, 2), abs(-3), a * 1


def builtin_hash_id_stable(a, b):
    return hash((1, "x")) == hash((1, "x")), id(a) == id(a), b * 1


def builtin_getattr_default(a, b):
    return getattr(a, "nope", 7), hasattr(a, "shape"), getattr(a, "ndim") * b


def tuple_methods(a, b):
    t = (1, 2, 2, 3)
    return t.count(2), t.index(3), t + (4,), a * t[-1]


def dict_methods(a, b):
    d = {"a": a}
    d.setdefault("b", b)
    d.update(c=a + b)
    v = d.pop("a")
    return sorted(d), v * 2, d.get("zz", 5), list(d.items())[0][0]


def list_methods(a, b):
    xs = [a]
    xs.append(b)
    xs.extend([a + b])
    xs.insert(0, b * 2)
    last = xs.pop()
    xs.reverse()
    return xs, last, len(xs)


def set_methods(a, b):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    return sorted(s | {9}), sorted(s & {2, 3, 10}), sorted(s - {2}), a * len(s)


def int_float_conversions(a, b):
    return int(3.9), float("2.5"), int("11", 2), float(a.numel()), str(12), bool(0), a + b


def bool_of_containers(a, b):
    return bool([]), bool([0]), bool({}), bool(""), b * (not [])


def string_format_methods(a, b):
    return "{}-{:>4}".format(1, "x"), "%d items" % 3, "%.1f" % 2.25, a * 1


class _Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


def match_class_positional_and_keyword(a, b):
    out = []
    for p in (_Point(a, 1), _Point(b, 2), (a, b), {"k": a, "rest": 3}, 5, "s"):
        match p:
            case _Point(x, y=2):
                out.append(x * 2)
            case _Point(x, y):
                out.append(x + y)
            case (u, v):
                out.append(u - v)
            case {"k": k, **rest}:
                out.append(k * len(rest))
            case int(n) if n > 3:
                out.append(n)
            case str() as t:
                out.append(t)
    return out


def match_class_errors(a, b):
    caught = []
    for bad in (lambda p: _match_too_many(p), lambda p: _match_not_a_class(p)):
        try:
            bad(_Point(a, b))
        except TypeError as e:
            caught.append(str(e))
    return caught, a + b


def _match_too_many(p):
    match p:
        case _Point(x, y, z):
            return x


def _match_not_a_class(p):
    k = 3
    match p:
        case k():  # noqa: F821 -- calling a non-class pattern raises TypeError
            return 1


def match_mapping_duplicate_and_missing(a, b):
    d = {"x": a, "y": b}
    match d:
        case {"z": z}:
            r = z
        case {"x": x, "y": y}:
            r = x * y
    return r


def except_star_partial(a, b):
    seen = []
    try:
        try:
            raise ExceptionGroup("eg", [ValueError(1), TypeError(2), ValueError(3)])
        except* ValueError as g:
            seen.append(("v", [e.args[0] for e in g.exceptions]))
        except* TypeError as g:
            seen.append(("t", [e.args[0] for e in g.exceptions]))
            raise KeyError("new")
    except* KeyError as g:
        seen.append(("k", type(g).__name__, [type(e).__name__ for e in g.exceptions]))
    return seen, a * 2


def except_star_reraise(a, b):
    try:
        try:
            raise ExceptionGroup("eg", [ValueError(1), OSError(2)])
        except* ValueError:
            raise
    except ExceptionGroup as g:
        return [type(e).__name__ for e in g.exceptions], a + b


def except_star_bare_exception(a, b):
    got = None
    try:
        raise ValueError("bare")
    except* ValueError as g:
        got = type(g).__name__, [str(e) for e in g.exceptions]
    return got, a - b


def set_unpacking(a, b):
    s = {*[1, 2], *{3}, 4}
    return sorted(s), a * len(s)


def delete_items(a, b):
    d = {"x": a, "y": b, "z": 3}
    del d["z"]
    xs = [1, 2, 3, 4]
    del xs[1:3]
    return d, xs


def class_in_function(a, b):
    class Scale:
        k = 3

        def __call__(self, t):
            return t * self.k
    return Scale()(a) + b, Scale.__qualname__.split(".")[-1]


def closure_variable_deleted(a, b):
    c = a + 1

    def read():
        return c
    first = read()
    del c
    try:
        read()
    except NameError as e:
        return first, "free variable" in str(e)


CASES = [list_comp, list_comp_if, nested_comp, set_comp, dict_comp, dict_comp_zip, comp_enumerate, comp_shadowing,
         closure_read, closure_nonlocal, closure_late_binding, closure_default_binding, global_read, global_write,
         unpack_starred, unpack_nested, unpack_in_for, unpack_tensor_rows, swap, fstring, fstring_tensor_shape,
         conditional_expr, chained_comparison, short_circuit, augmented, augmented_list, walrus, match_literal,
         match_sequence, match_mapping, match_class, del_name, del_item, assert_passes, assert_fails, for_else,
         while_else, loop_break_continue, lambda_sorted, reduce_functools, operator_module, string_methods,
         slicing, slice_objects, builtin_min_max, builtin_sum_start, builtin_any_all, builtin_isinstance,
         builtin_len_range, builtin_reversed_sorted, builtin_divmod_pow, builtin_hash_id_stable,
         builtin_getattr_default, tuple_methods, dict_methods, list_methods, set_methods, int_float_conversions,
         bool_of_containers, string_format_methods, match_class_positional_and_keyword, match_class_errors,
         match_mapping_duplicate_and_missing, except_star_partial, except_star_reraise, except_star_bare_exception,
         set_unpacking, delete_items, class_in_function, closure_variable_deleted]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_statements_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
