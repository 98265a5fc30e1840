"""Calls (the language reference's "Calls" and "Function definitions"): positional, keyword,
default, keyword-only and positional-only parameters, *args and **kwargs in definitions and in
calls, defaults evaluated once, decorators (with functools.wraps, with arguments, stacked),
recursion, functions returned and passed, methods bound and unbound, and the errors a wrong call
raises (CPython's checks in CPython's order, with its messages); the builtins that read the
calling frame (globals, locals, vars, dir, eval, exec). Compared with eager on three calls."""
import functools

import pytest
import torch

from compare import matches_eager

CALLS = []


def _affine(t, k=2.0, *, shift=0.0):
    return t * k + shift


def _only_pos(t, k, /):
    return t * k


def _var(*ts, **opts):
    out = sum(ts)
    for name in sorted(opts):
        out = out + opts[name]
    return out


def _mutable_default(t, acc=[]):  # noqa: B006 -- the default object is shared between calls, on purpose
    acc.append(1)
    return t * len(acc)


def _counting(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        CALLS.append(fn.__name__)
        return fn(*args, **kwargs)
    return wrapper


def _scaled_by(k):
    def deco(fn):
        def wrapper(t):
            return fn(t) * k
        return wrapper
    return deco


@_counting
def _counted(t):
    return t + 1


@_scaled_by(3)
@_scaled_by(2)
def _stacked(t):
    return t - 1


def _fact(n):
    return 1 if n <= 1 else n * _fact(n - 1)


def _tree_sum(t, depth):
    if depth == 0:
        return t
    return _tree_sum(t * 0.5, depth - 1) + _tree_sum(t * 0.25, depth - 1)


def keyword_args(a, b):
    return _affine(a, shift=1.0), _affine(b, k=3.0), _affine(a, 0.5, shift=b)


def keyword_only_refused(a, b):
    try:
        _affine(a, 2.0, 1.0)
    except TypeError as e:
        return "positional" in str(e), b * 1


def positional_only(a, b):
    try:
        _only_pos(a, k=2)
    except TypeError as e:
        return _only_pos(a, 2), "positional-only" in str(e)


def star_args_definition(a, b):
    return _var(a, b), _var(a, b, c=1.0, d=2.0), _var(a)


def star_call(a, b):
    args = (a, b)
    kw = {"z": 1.0}
    return _var(*args, **kw), _var(*[a, b, a])


def star_call_mixed(a, b):
    return _affine(*(a,), **{"k": 4.0}, shift=1.0)


def missing_argument(a, b):
    try:
        _affine()
    except TypeError as e:
        return "missing" in str(e), a + b


def unexpected_keyword(a, b):
    try:
        _affine(a, bogus=1)
    except TypeError as e:
        return "unexpected keyword" in str(e), b


def too_many_arguments(a, b):
    try:
        _only_pos(a, 1, 2)
    except TypeError as e:
        return "positional" in str(e), a


def mutable_default_shared(a, b):
    return _mutable_default(a) is not None, a * 1


def decorator_wraps(a, b):
    CALLS.clear()
    return _counted(a), _counted.__name__, list(CALLS), _counted.__wrapped__(b)


def decorator_stacked(a, b):
    return _stacked(a)


def decorator_lambda_inline(a, b):
    twice = (lambda f: lambda t: f(f(t)))(lambda t: t * 2)
    return twice(a)


def recursion_numbers(a, b):
    return _fact(5), a * _fact(4)


def recursion_tensors(a, b):
    return _tree_sum(a, 3)


def function_returned(a, b):
    def make(k):
        return lambda t: t * k
    return make(2)(a), make(3)(b)


def function_passed(a, b):
    def apply(f, t):
        return f(t)
    return apply(torch.tanh, a), apply(lambda t: t + b, a)


def method_unbound_call(a, b):
    return torch.Tensor.add(a, b), torch.Tensor.mul(a, 2)


def method_bound_stored(a, b):
    add = a.add
    return add(b), add(1)


def builtin_callable_checks(a, b):
    return callable(_affine), callable(a), callable(torch.relu), a * 1


def function_attributes(a, b):
    return _affine.__name__, _affine.__defaults__, _affine.__kwdefaults__, b * 1


def kwargs_order_preserved(a, b):
    def keys(**kw):
        return list(kw)
    return keys(z=1, a=2, m=3), a + b


def default_from_outer_scope(a, b):
    k = 5.0

    def f(t, k=k):
        return t * k
    k = 7.0
    return f(a), k


def nested_function_recursion(a, b):
    def countdown(n, t):
        return t if n == 0 else countdown(n - 1, t + 1)
    return countdown(3, a)


def generator_argument(a, b):
    return _var(*(t * 2 for t in (a, b)))


def dict_unpack_merge(a, b):
    base = {"k": 2.0}
    over = {"shift": 1.0}
    return _affine(a, **base, **over)


def call_with_tensor_method_chain(a, b):
    return a.add(1).mul(b).sum(dim=0, keepdim=True)


def torch_function_kwargs(a, b):
    return torch.clamp(a, min=-0.5, max=0.5), torch.sum(b, dim=0), torch.where(a > 0, a, b)


def torch_function_out_of_order_kwargs(a, b):
    return torch.add(input=a, other=b, alpha=2)


def classmethod_from_instance(a, b):
    class K:
        n = 3

        @classmethod
        def make(cls, t):
            return t * cls.n
    return K().make(a), K.make(b)


def staticmethod_on_instance(a, b):
    class K:
        @staticmethod
        def twice(t):
            return t * 2
    return K().twice(a), K.twice(b)


def _sig(a, b, /, c, d=1, *, e, g=2):
    return a


def _kw(a, **kw):
    return a, kw


BAD_CALLS = ["_only_pos(a, k=2)", "_sig(a, b=2, c=3, e=1)", "_sig(a=1, b=2, c=3, e=1)", "_sig(1, 2, 3, 4, 5, e=1)",
             "_sig(1, 2, 3, 4, 5)", "_sig(1, 2)", "_sig(1, 2, 3)", "_sig(1, 2, 3, c=3, e=1)", "_affine()",
             "_affine(a, 1, 2)", "_affine(a, bogus=1)", "_affine(a, t=a)", "_kw(1, a=2)", "_kw(b=1)",
             "_fact(1, 2, 3)", "_fact()", "_sig(1, 2, 3, 4, 5, 6, e=1, g=2)"]


def _bad_call(src):
    def fn(a, b):
        try:
            eval(src)
        except TypeError as e:
            return a * 2, str(e)
        return b
    fn.__name__ = fn.__qualname__ = "call " + src
    return fn


def frame_globals_and_locals(a, b):
    k = 3
    g = globals()
    loc = locals()
    return "_affine" in g, sorted(loc), loc["k"] * a, vars()["k"], "k" in dir()


def eval_in_frame(a, b):
    k = 2.0
    return eval("a * k + b"), eval("_affine(a)"), eval("k", {"k": 5})


def exec_in_frame(a, b):
    ns = {}
    exec("y = 3 * 4", ns)
    exec("z = len('abc')")
    return a * ns["y"], b


CASES = [keyword_args, keyword_only_refused, positional_only, star_args_definition, star_call, star_call_mixed,
         missing_argument, unexpected_keyword, too_many_arguments, mutable_default_shared, decorator_wraps,
         decorator_stacked, decorator_lambda_inline, recursion_numbers, recursion_tensors, function_returned,
         function_passed, method_unbound_call, method_bound_stored, builtin_callable_checks, function_attributes,
         kwargs_order_preserved, default_from_outer_scope, nested_function_recursion, generator_argument,
         dict_unpack_merge, call_with_tensor_method_chain, torch_function_kwargs,
         torch_function_out_of_order_kwargs, classmethod_from_instance, staticmethod_on_instance,
         frame_globals_and_locals, eval_in_frame, exec_in_frame] + [_bad_call(c) for c in BAD_CALLS]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_calls_behave_as_in_eager(fn):
    matches_eager(fn, lambda: (torch.randn(4), torch.randn(4)))
