"""Control flow and name resolution (the language reference's "Execution model" and "Compound
statements"): return inside try/finally and with, finally overriding a return, break and
continue through finally, nested functions reading enclosing, global and builtin names in LEGB
order, a builtin shadowed by a global or a local, class bodies' scope, names bound in
comprehensions and loops after they end, early returns, recursion through closures, boolean
operators returning operands, grad-mode blocks around tensor work. Compared with eager on three
calls."""
import math

import pytest
import torch

from compare import matches_eager

LOG = []
len_calls = 0
SHADOW = 10


def len(x):  # noqa: A001 -- a global shadowing the builtin, on purpose (resolution order)
    global len_calls
    len_calls += 1
    return __builtins__["len"](x) if isinstance(__builtins__, dict) else __builtins__.len(x)


def return_in_finally_order(a, b):
    LOG.clear()
    try:
        LOG.append("try")
        return a * 2, list(LOG)
    finally:
        LOG.append("finally")


def finally_overrides_return(a, b):
    try:
        return a
    finally:
        return b  # noqa: B012 -- the finally's return wins, on purpose


def finally_after_exception_return(a, b):
    try:
        raise ValueError(1)
    except ValueError:
        return a + 1
    finally:
        LOG.append("cleanup")


def break_through_finally(a, b):
    out = a * 0
    for i in range(5):
        try:
            if i == 2:
                break
            out = out + i
        finally:
            out = out + 0.5
    return out


def continue_through_finally(a, b):
    out = a * 0
    for i in range(4):
        try:
            if i % 2:
                continue
            out = out + b
        finally:
            out = out * 1.5
    return out


def return_inside_with(a, b):
    with torch.no_grad():
        return a * b, torch.is_grad_enabled()


def grad_mode_restored(a, b):
    with torch.no_grad():
        y = a * 2
    return y, torch.is_grad_enabled()


def enable_grad_inside_no_grad(a, b):
    with torch.no_grad():
        with torch.enable_grad():
            inner = torch.is_grad_enabled()
        outer = torch.is_grad_enabled()
    return a + b, inner, outer


def set_grad_enabled_block(a, b):
    with torch.set_grad_enabled(False):
        y = a.exp()
    return y, torch.is_grad_enabled()


def legb_enclosing(a, b):
    x = 2.0

    def outer():
        x = 3.0

        def inner():
            return a * x
        return inner()
    return outer(), x


def legb_global_over_builtin(a, b):
    global len_calls
    before = len_calls
    n = len([1, 2, 3])
    return n, len_calls - before, a * n


def local_shadows_builtin(a, b):
    max = 5  # noqa: A001 -- a local shadowing the builtin
    return a * max, b


def builtin_after_global_deleted(a, b):
    return math.floor(2.7), abs(-3), a * SHADOW


def class_body_scope(a, b):
    y = 4.0

    class K:
        y = 7.0
        z = y * 2  # the class's y

        def get(self):
            return y  # the function's y, not the class's
    return K.z, K().get(), a * K.y


def comprehension_scope(a, b):
    i = 100
    xs = [i for i in range(3)]
    return i, xs, a * i


def loop_variable_after_loop(a, b):
    for i in range(3):
        pass
    return i, a * i


def loop_variable_never_bound(a, b):
    for i in []:
        pass
    try:
        return i  # noqa: F821 -- unbound on purpose
    except UnboundLocalError as e:
        return "i" in str(e), b


def unbound_local_before_assignment(a, b):
    try:
        y = z + 1  # noqa: F821
        z = 3
        return y
    except UnboundLocalError as e:
        return type(e).__name__, a


def early_return_paths(a, b):
    n = a.numel()
    if n == 0:
        return b
    if n > 100:
        return a
    return a * b


def and_or_operands(a, b):
    return (0 or a), (a and 0), ([] or "x"), (None and a), (a.numel() > 2 and b) + 1


def not_operator(a, b):
    return not [], not 0.0, not a.numel(), b * (not None)


def while_with_counter(a, b):
    i, out = 0, a
    while i < 4 and out.numel() == 4:
        out = out * 1.1
        i += 1
    return out, i


def nested_break(a, b):
    found = None
    for i in range(3):
        for j in range(3):
            if i * j == 2:
                found = (i, j)
                break
        if found:
            break
    return found, a * (found[0] if found else 0)


def recursion_through_closure(a, b):
    def walk(t, n):
        return t if n == 0 else walk(t + 1, n - 1)
    return walk(a, 4)


def conditional_import(a, b):
    import math as m
    from math import sqrt
    return m.pi * a, sqrt(16.0)


def try_else_order(a, b):
    order = []
    try:
        order.append(1)
    except Exception:
        order.append(2)
    else:
        order.append(3)
    return order, a * len(order)


def exception_variable_cleared(a, b):
    try:
        raise ValueError(1)
    except ValueError as e:
        kept = str(e)
    try:
        e  # noqa: F821 -- cleared after the handler, as Python does
    except NameError:
        return kept, "cleared", a


def lambda_default_capture(a, b):
    k = 2
    f = lambda t, k=k: t * k  # noqa: E731
    k = 5
    return f(a), k


def global_declared_inside(a, b):
    global SHADOW
    old = SHADOW
    SHADOW = old
    return a * SHADOW, SHADOW == old


def chained_assignment(a, b):
    x = y = a * 2
    return x is y, x + y


def swap_list_items(a, b):
    xs = [a, b]
    xs[0], xs[1] = xs[1], xs[0]
    return xs


def augmented_subscript(a, b):
    d = {"k": a}
    d["k"] += b
    xs = [a]
    xs[0] *= 2
    return d["k"], xs[0]


def augmented_attribute(a, b):
    class Box:
        pass
    box = Box()
    box.v = a
    box.v += b
    box.v -= 1
    return box.v


def ternary_chain(a, b):
    n = a.numel()
    kind = "small" if n < 2 else "medium" if n < 8 else "large"
    return kind, a * len(kind)


def in_operator_variants(a, b):
    return 2 in [1, 2], "ab" in "cabd", "k" in {"k": 1}, 3 in range(5), 9 not in (1, 2), a + b


TICKS = 0


def _tick():
    global TICKS
    TICKS += 1  # a store into a global: a call dynamo makes between traces (a stitch)
    return TICKS


def value_read_before_a_stitch(a, b):
    before = TICKS
    now = _tick()
    return now - before, TICKS - before, a * (now - before)


def attribute_read_before_a_stitch(a, b):
    class Box:
        n = 1
    box = Box()
    old = box.n

    def bump():
        box.n = old + 5  # a store into an object from outside the inner call: a stitch
    bump()
    return old, box.n, a * old


def is_operator_variants(a, b):
    x = a
    return x is a, x is not b, None is None, a * 1


CASES = [return_in_finally_order, finally_overrides_return, finally_after_exception_return, break_through_finally,
         continue_through_finally, return_inside_with, grad_mode_restored, enable_grad_inside_no_grad,
         set_grad_enabled_block, legb_enclosing, legb_global_over_builtin, local_shadows_builtin,
         builtin_after_global_deleted, class_body_scope, comprehension_scope, loop_variable_after_loop,
         loop_variable_never_bound, unbound_local_before_assignment, early_return_paths, and_or_operands,
         not_operator, while_with_counter, nested_break, recursion_through_closure, conditional_import,
         try_else_order, exception_variable_cleared, lambda_default_capture, global_declared_inside,
         chained_assignment, swap_list_items, augmented_subscript, augmented_attribute, ternary_chain,
         in_operator_variants, is_operator_variants, value_read_before_a_stitch, attribute_read_before_a_stitch]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_flow_behaves_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4, requires_grad=False), torch.randn(4)))
