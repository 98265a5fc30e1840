"""`with dynamo.optimize():` -- every Python frame that starts inside the block may be compiled.

The PEP 523 hook (_evalframe.c) hands each new frame's function and bound arguments to
`_handle`. Code from the standard library, torch and dynamo itself is marked skip once and never
comes back; a frame whose arguments hold no tensor (and no nn.Module) runs in CPython, and the
frames it calls come back here one by one. The others go through the same per-code
OptimizedFunction as dynamo.optimize(fn): compiled traces with guards, recording when hot, and
fallbacks that let CPython run the frame itself.
"""
import inspect
import importlib.util
import os
import sys
import sysconfig
import threading
import weakref

import torch

from . import _ext, frontend, training

_ev = None
_lock = threading.Lock()
_by_code = {}   # code object -> OptimizedFunction (one per code; closures share it, guarded)
_blocks = threading.local()  # .options: the options of the `with` blocks this thread is inside
_open = 0       # `with` blocks open in all threads (the handler is installed while any is)
_outer = None   # the handler before the first block opened
_steps = weakref.WeakKeyDictionary()  # optimizer -> training.OptimizedStep (its steps under the hook)


def _load():
    """The _evalframe extension (the PEP 523 hook)."""
    global _ev
    if _ev is None:
        _ev = _ext.load("_evalframe")
    return _ev


def _library_roots():
    roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"],
             os.path.dirname(os.path.abspath(torch.__file__)),
             os.path.dirname(os.path.abspath(__file__))}
    # functorch (AOTAutograd, which training.py runs): its autograd.Function's backward and hooks
    # are torch's machinery, called by the autograd engine, not the program's code
    spec = importlib.util.find_spec("functorch")
    if spec is not None and spec.submodule_search_locations:
        roots.update(spec.submodule_search_locations)
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


_ROOTS = None
_NEVER = frozenset(("__init__", "__new__", "__del__", "__repr__", "__str__", "__setattr__", "__getattr__"))


def _user_code(code):
    global _ROOTS
    if _ROOTS is None:
        _ROOTS = _library_roots()
    f = code.co_filename
    if f.startswith("<"):
        return False
    return not os.path.realpath(f).startswith(_ROOTS)


def _called_at_top_level(code, bound):
    """A library module's forward (torch.nn's, timm's, ...) called from a script's top level,
    through nn.Module.__call__: no function of the program holds it, so it is compiled as a
    function of its own. (Decided on its first frame: one first met inside the program's
    functions is left to them.)"""
    if code.co_name != "forward" or not bound or not isinstance(bound[0], torch.nn.Module):
        return False
    f = sys._getframe(2)  # (1: _handle; 2: the caller of the new frame)
    while f is not None and not _user_code(f.f_code) and not f.f_code.co_filename.startswith("<"):
        f = f.f_back
    return f is not None and f.f_code.co_name == "<module>"


def _has_tensor(v, depth=0):
    if isinstance(v, (torch.Tensor, torch.nn.Module)):
        return True
    if depth < 2 and isinstance(v, (tuple, list)):
        return any(_has_tensor(x, depth + 1) for x in v)
    if depth < 2 and isinstance(v, dict):
        return any(_has_tensor(x, depth + 1) for x in v.values())
    return False


def _split(code, bound):
    """The frame's bound arguments back into (args, kwargs) for an equivalent call."""
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    args = list(bound[:npos])
    kwargs = dict(zip(code.co_varnames[npos:npos + nkw], bound[npos:npos + nkw]))
    k = npos + nkw
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(bound[k])
        k += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(bound[k])
    return tuple(args), kwargs


def _optimizer_step(code, bound):
    """An optimizer's step (the body of SGD/Adam/AdamW.step, inside torch's wrappers): its
    update through training.OptimizedStep, kept per optimizer; SKIP where torch's must run."""
    opt = bound[0]
    st = _steps.get(opt)
    if st is None:
        opts = _options()
        st = _steps[opt] = training.OptimizedStep(opt, frontend.optimize, nopython=opts.get("nopython", False))
    args, kwargs = _split(code, bound)
    r = st.compiled(*args[1:], **kwargs)
    return _ev.SKIP if r is training.EAGER_STEP else r


def _is_optimizer_step(code, bound):
    """The frame is the body of a covered optimizer's step (under torch's decorators; AdamW's is
    Adam's)."""
    return code.co_name == "step" and bool(bound) and type(bound[0]) in training.COVERED and \
        getattr(inspect.unwrap(type(bound[0]).step), "__code__", None) is code


def _handle(fn, bound):
    code = fn.__code__
    if _is_optimizer_step(code, bound):  # (torch's code, never marked skip)
        return _optimizer_step(code, bound)
    of = _by_code.get(code)
    if of is None:
        if not _user_code(code) and not _called_at_top_level(code, bound) or code.co_name in _NEVER or \
                getattr(fn, "_dynamo_disable", False):
            _ev.skip(code)
            return _ev.SKIP
        if not _has_tensor(bound):
            return _ev.SKIP
        opts = _options()
        of = frontend.OptimizedFunction(fn, nopython=opts.get("nopython", False))
        _by_code[code] = of
    elif not _has_tensor(bound):
        return _ev.SKIP
    args, kwargs = _split(code, bound)
    try:
        result = of.call(fn, args, kwargs, in_frame=True)
    except BaseException as e:  # the program's own: its traceback as eager shows it
        e.__traceback__ = frontend.program_frames(e)
        raise
    if result is frontend.EAGER:
        if of.disabled_reason is not None and not of.compiled:
            _ev.skip(code)  # never compiled and never will be: stop asking
        return _ev.SKIP
    return result


def _options():
    """The options of the innermost `with dynamo.optimize(...)` block of this thread."""
    stack = getattr(_blocks, "options", None)
    return stack[-1] if stack else {}


class OptimizeContext:
    """What `dynamo.optimize(**options)` returns: a decorator, and a `with` block that installs
    the frame hook for the code the entering thread runs inside it (other threads' code runs
    as before; a thread of its own enters a block of its own)."""

    def __init__(self, **options):
        self.options = options

    def __call__(self, fn):
        return frontend.optimize(fn, **self.options)

    def __enter__(self):
        global _open, _outer
        ev = _load()
        with _lock:
            if _open == 0:
                _outer = ev.set_handler(_handle)
            _open += 1
        if getattr(_blocks, "options", None) is None:
            _blocks.options = []
        _blocks.options.append(self.options)
        ev.enter()
        return self

    def __exit__(self, *exc):
        global _open, _outer
        _ev.leave()
        _blocks.options.pop()
        with _lock:
            _open -= 1
            if _open == 0:
                _ev.set_handler(_outer)
                _outer = None
        return False


def reset():
    """Forgets every frame the hook has seen (dynamo.reset())."""
    _by_code.clear()
    _steps.clear()
    if _ev is not None:
        _ev.clear_skips()
