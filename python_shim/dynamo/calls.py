"""How the recording interpreter makes a call (interpreter.py), by the kind of callable, tried in
order: reads of state and data (sizes, a tensor's contents), Python code (inlined: functions,
methods, classes made and initialized as type.__call__ does, partials), introspection, torch
functions (run for real, recorded at ATen), builtins and containers, other objects; and what
cannot be recorded: made for real as a stitch or after an abort (_opaque). Binding arguments to
a frame's parameters as CPython does (_bind). Each function takes the interpreter as its first
argument; the Interpreter class binds them as its methods."""
import abc
import builtins
import collections
import contextlib
import functools
import inspect
import math
import operator
import re
import sys
import types
import weakref
from inspect import CO_VARARGS, CO_VARKEYWORDS

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode, _pop_mode_temporarily
from .generators import _Generator, _GENERATOR_LIKE
from .sources import _DICTS, _has_hooks, raw_item_src, recovered_source, runs_class_forward
from .frames import NULL as _NULL, DataDependentStep, StitchNow
from .frames import is_torch_callable as _is_torch_callable
from .frames import plain_class as _plain_class
from .guards import _BY_VALUE, Source, plain, structural_dict

# Tensor methods that read sizes as Python numbers (x.shape is an attribute: load_attr)
_SIZE_METHODS = frozenset(("size", "numel", "nelement", "stride", "storage_offset", "__len__"))
# Sequences torch.tensor(data) reads element by element. A torch.Size (x.shape[-2:]) is a
# trace's static shape: as data it is a tuple of the same ints.
_SEQUENCES = (list, tuple, torch.Size)
_UNHANDLED = object()  # Interpreter.call's handlers: not this kind of callable
# Builtins that only compute on their arguments.
_PURE_BUILTINS = {getattr(builtins, n) for n in (
    "abs", "all", "any", "bool", "callable", "dict", "divmod", "enumerate", "float", "format", "getattr",
    "hasattr", "hash", "int", "isinstance", "issubclass", "iter", "len", "list", "max", "min", "next", "range",
    "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip", "frozenset", "id")}


_PURE_BUILTINS |= {operator.getitem, operator.add, operator.mul, operator.neg, operator.index, torch.Size}
_PURE_BUILTINS.add(torch.device)  # an immutable value (FX graphs write `device(type='cpu')`)
# Containers made by a call (of the call's own, as {} and [] make them): a defaultdict's factory
# runs for real when a missing key is read, so it must be a pure builtin (tuple, list, int ...).
_CONTAINERS = (collections.OrderedDict, collections.deque, collections.defaultdict)
_PURE_BUILTINS |= {torch.finfo, torch.iinfo}  # a dtype's limits (masks filled with finfo(dtype).min)
# torch's autocast setters and the getters that read what they set (torch.autocast.__enter__/__exit__)
_AUTOCAST_SETTERS = {torch.set_autocast_enabled: torch.is_autocast_enabled, torch.set_autocast_dtype: torch.get_autocast_dtype,
                     torch.set_autocast_cache_enabled: torch.is_autocast_cache_enabled}
# inspect.signature(fn) of a function (Hugging Face's apply_chunking_to_forward counts a method's
# parameters): fixed by the function, which its read guards; run for real, not stepped through.
_PURE_BUILTINS.add(inspect.signature)
# builtin exception classes: making one (to raise it, caught or not) changes nothing
_PURE_BUILTINS |= {v for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException)}
# math on Python numbers (a tensor argument would be read through .item(), which aborts).
_PURE_BUILTINS |= {getattr(math, n) for n in (
    "sqrt", "exp", "log", "log2", "log10", "pow", "sin", "cos", "tan", "tanh", "erf", "ceil", "floor", "trunc",
    "fabs", "isfinite", "isinf", "isnan", "prod", "gcd", "isqrt", "copysign", "hypot", "atan2", "radians", "degrees")}
# Tensor methods that read contents into Python objects without dispatching an ATen op.
_READS_CONTENTS = {"tolist", "numpy", "__array__", "data_ptr", "storage", "untyped_storage", "_storage",
                   "__reduce_ex__", "__getstate__", "__repr__", "__str__", "__format__"}
# Python functions of torch's run for real under the recorder, not interpreted: a function
# vmapped by torch.vmap (its Python runs once over batched tensors inside functorch's C++ layers,
# which the interpreter cannot step through; the ATen ops they produce are recorded as any torch
# call's are). Hugging Face's attention masks are made this way.
_RUN_WHOLE = frozenset({torch.vmap(lambda x: x).__code__})


def _control_flow_operators():
    """torch's control-flow operators (torch.cond, while_loop, map): their Python traces the
    branches with torch.compile's own machinery, which the interpreter cannot step through. A
    call of one is made as it is, between traces (a stitch), or the function runs eagerly."""
    found = set()
    for mod, name in (("torch", "cond"), ("torch", "while_loop"), ("torch._higher_order_ops", "cond"),
                      ("torch._higher_order_ops", "while_loop"), ("torch._higher_order_ops.map", "map"),
                      ("torch._higher_order_ops", "scan"), ("torch._higher_order_ops", "associative_scan")):
        m = sys.modules.get(mod)
        fn = getattr(m, name, None) if m is not None else None
        if callable(fn):
            found.add(getattr(fn, "__code__", None) or fn)
    found.discard(None)
    return frozenset(found)


_CONTROL_FLOW = _control_flow_operators()


def _map(fn, *iterables):
    """map(fn, *iterables) in Python: the interpreter runs it as a generator of the call, so
    fn's work is recorded when the map is consumed (list(map(...)), pytree's
    deque(map(fn, leaves), maxlen=0))."""
    for args in zip(*iterables):
        yield fn(*args)


def _self_source(m, msrc):
    """The source of bound method m's object: the object it was read from (`obj.meth`), else
    `<m>.__self__` (a method kept in a closure cell or a container: torch.no_grad's self.clone)."""
    if msrc is None:
        return None
    if msrc.base is not None and msrc.expr == f"{msrc.base.expr}.{m.__func__.__name__}":
        return msrc.base
    return Source(f"{msrc.expr}.__self__", msrc)


def _dict_class(cls):
    """A Python subclass of dict or OrderedDict made by their __new__, with an __init__ in Python."""
    return isinstance(cls, type) and type(cls) in (type, abc.ABCMeta) and issubclass(cls, dict) and \
        cls.__new__ in (dict.__new__, collections.OrderedDict.__new__) and isinstance(cls.__init__, types.FunctionType)
# Methods of containers that do not change them.
_READ_METHODS = {"get", "keys", "values", "items", "index", "count", "copy", "__getitem__", "__len__",
                 "__contains__", "format", "join", "split", "strip", "startswith", "endswith", "lower", "upper",
                 "replace"}
# Reads of torch's dispatch-mode stack, answered without the recorder's own mode (_mode_read).
_MODE_READERS = {f for f in (getattr(torch._C, "_len_torch_dispatch_stack", None),
                             getattr(torch.utils._python_dispatch, "_get_current_dispatch_mode", None),
                             getattr(torch.utils._python_dispatch, "_get_current_dispatch_mode_stack", None),
                             getattr(torch.utils._python_dispatch, "is_in_torch_dispatch_mode", None))
                 if f is not None}
# torch functions (not ATen ops, so not recorded) that change global state: they end the trace
# and run for real (torch.manual_seed, torch.set_default_dtype, torch.use_deterministic_algorithms).
_GLOBAL_SETTER = re.compile(r"^_?(set_|manual_seed$|seed$|use_|random_seed)")
MAX_DEPTH = 32
_FROM_DATA = {torch.tensor, torch.as_tensor}


def _reads_size(fn, args):
    """Whether calling fn on args reads a tensor's size as Python numbers."""
    if isinstance(getattr(fn, "__self__", None), torch.Tensor):
        return getattr(fn, "__name__", None) in _SIZE_METHODS
    if (fn is len or fn is torch.numel) and args:
        return isinstance(args[0][0], torch.Tensor)
    return False


def _numbers(v, depth=0):
    """v is a number or bool, or a (nested) list/tuple/torch.Size of them."""
    if type(v) in (int, float, bool):
        return True
    return type(v) in _SEQUENCES and depth < 8 and all(_numbers(x, depth + 1) for x in v)


def _freeze(v):
    """v with its lists and sizes made tuples (a constant the guards may hold: it cannot change)."""
    return tuple(_freeze(x) for x in v) if type(v) in _SEQUENCES else v


def _missing_message(qual, kind, missing):
    """CPython's message for missing arguments: 'a'; 'a' and 'b'; 'a', 'b', and 'c'."""
    quoted = [f"'{m}'" for m in missing]
    listed = quoted[0] if len(quoted) == 1 else " and ".join(quoted) if len(quoted) == 2 else \
        ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    return f"{qual}() missing {len(missing)} required {kind} argument{'s' if len(missing) != 1 else ''}: {listed}"
# Builtins that read the calling frame (Interpreter._frame_namespace).
_FRAME_READERS = (globals, locals, vars, dir, eval, exec)
# Builtin types whose __new__ a Python subclass's __new__ may call (super().__new__(cls, ...)).
_BUILTIN_BASES = (tuple, list, dict, set, frozenset, int, float, str, bytes)


# -- calls ---------------------------------------------------------------------------
def call(interp, fnp, args, kwargs):
    """Calls fnp[0] with (value, source) pairs; returns a pair. Each kind of callable has a
    handler, tried in this order; one that does not take the call returns _UNHANDLED, and
    what none takes runs unrecorded (_opaque)."""
    fn = fnp[0]
    if interp.sizes.size_read is None and interp.frames and _reads_size(fn, args):
        interp.sizes.note_read("len" if fn is len else getattr(fn, "__name__", "size"))
    for handler in (interp._call_reading_state, interp._call_python_code, interp._call_introspection,
                    interp._call_torch, interp._call_builtin, interp._call_object):
        r = handler(fnp, args, kwargs)
        if r is not _UNHANDLED:
            return r
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return interp._opaque(fnp, args, kwargs, f"call to {name} is not traceable")


def _call_reading_state(interp, fnp, args, kwargs):
    """Reads of a tensor's value or contents, grad mode set, torch's global setters, weak
    references, reads of the dispatch-mode stack."""
    fn, fsrc = fnp
    # t.item(), int(t), float(t), bool(t) on a recorded one-element tensor: a guarded value
    if not kwargs and interp.recording and interp.frames:
        t = conv = None
        if not args and getattr(fn, "__name__", None) == "item" and isinstance(getattr(fn, "__self__", None),
                                                                               torch.Tensor):
            t, conv = fn.__self__, "item"
        elif fn in (int, float, bool) and len(args) == 1 and isinstance(args[0][0], torch.Tensor):
            t, conv = args[0][0], fn.__name__
        if t is not None and interp.rec.known(t) and t.numel() == 1:
            return interp._tensor_value(t, conv)
    if isinstance(getattr(fn, "__self__", None), torch.Tensor) and \
            getattr(fn, "__name__", None) in _READS_CONTENTS:
        # these read the data without an ATen op the recorder could see
        return interp._opaque(fnp, args, kwargs, f"data-dependent value: Tensor.{fn.__name__}() reads a "
                                               f"tensor's contents")
    if fn is torch._C._set_grad_enabled and len(args) == 1 and not kwargs and type(args[0][0]) is bool:
        # grad mode set inside the call (torch.no_grad(), set_grad_enabled): the ATen ops are
        # the same either way; no snapshot is taken while it differs from the trace's start,
        # and a trace must end with it as it started (frontend)
        interp._touch_elements(*args[0])
        fn(args[0][0])
        return (None, None)
    if fn in _AUTOCAST_SETTERS and not kwargs and all(type(v) in _BY_VALUE for v, _ in args) and interp.recording:
        # `with torch.autocast(..., enabled=False)` where autocast is off already (LLaMA's rotary
        # embedding): a setter given the value torch has is nothing to do, the value guarded
        getter, get_args, v = _AUTOCAST_SETTERS[fn], [a for a, _ in args[:-1]], args[-1][0]
        if getter(*get_args) == v:
            expr = f"{interp.guards.const_source(getter).expr}({', '.join(interp.guards.const_source(a).expr for a in get_args)})"
            interp.guards.guard_state(expr, v, f"{getter.__name__}({', '.join(map(repr, get_args))})")
            return (None, None)
    if _is_torch_callable(fn) and _GLOBAL_SETTER.match(getattr(fn, "__name__", "") or ""):
        return interp._opaque(fnp, args, kwargs, f"torch.{fn.__name__}() changes torch's global state")
    if type(fn) is weakref.ReferenceType and not args and not kwargs:  # ref(): its referent, by source
        r = fn()
        if fsrc is None:
            return (r, None)
        src = Source(f"{fsrc.expr}()", fsrc)
        interp.touch(r, src)
        return (r, src)
    if fn in _MODE_READERS and interp.recording:
        return interp._mode_read(fn, args, kwargs)
    return _UNHANDLED


def _call_python_code(interp, fnp, args, kwargs):
    """Python functions and methods (inlined), and modules whose class forward runs."""
    fn, fsrc = fnp
    if isinstance(fn, types.FunctionType):
        if fn.__code__ in _CONTROL_FLOW:
            return interp._opaque(fnp, args, kwargs, f"torch's control-flow operator {fn.__name__} is not recorded "
                                                   "(it runs as in eager)")
        if fn.__code__ in _RUN_WHOLE or fn in _PURE_BUILTINS:
            return _UNHANDLED  # run for real: recorded at ATen (_call_torch), or pure (_call_builtin)
        return interp._call_python(fn, fsrc, args, kwargs, None)
    if isinstance(fn, types.MethodType) and type(fn.__self__) is _Generator:
        return interp._concrete(fn, args, kwargs)  # g.send / throw / close: they run g's frame here
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return interp._call_python(fn.__func__, None, args, kwargs, (fn.__self__, _self_source(fn, fsrc)))
    if isinstance(fn, torch.nn.Module):
        if _has_hooks(fn):
            return interp._opaque(fnp, args, kwargs, "module with hooks")
        fwd = type(fn).forward
        if interp.bucket_bytes and interp.param_bytes >= interp.bucket_bytes and interp.recording and \
                torch.is_grad_enabled():
            interp._bucket_cut()  # (the call then runs on unrecorded, as after any cut)
        if isinstance(fwd, types.FunctionType) and runs_class_forward(fn):
            interp._guard_module_call(fn, fsrc)
            return interp._call_python(fwd, None, args, kwargs, (fn, fsrc))
    return _UNHANDLED


def _call_introspection(interp, fnp, args, kwargs):
    """type(x), getattr/hasattr, next() of an outside iterator; isinstance's class guard
    (the call itself is a pure builtin's, below)."""
    fn = fnp[0]
    if (fn is type or fn is isinstance) and args and isinstance(args[0][0], _Generator):
        # a generator the interpreter runs is a generator to the program
        if fn is type:
            return (types.GeneratorType, None) if len(args) == 1 and not kwargs else _UNHANDLED
        return interp._concrete(fn, [(_GENERATOR_LIKE, None)] + list(args[1:]), kwargs)
    if fn is type and len(args) == 1 and not kwargs and args[0][1] is not None:
        v, vsrc = args[0]  # type(k).s reads through the class: guard which class it is
        src = Source(f"type({vsrc.expr})", vsrc)
        interp.touch(type(v), src)
        return (type(v), src)
    if fn in (getattr, hasattr) and not kwargs and len(args) in (2, 3) and type(args[1][0]) is str and \
            (fn is getattr or len(args) == 2):
        return interp._getattr_builtin(fn, args)
    if fn is next and args and id(args[0][0]) not in interp.local_objs:
        return interp._opaque(fnp, args, kwargs, "next() advances an iterator from outside the function "
                                               "(its position cannot be guarded)")
    if fn is isinstance and args and args[0][1] is not None and interp.recording:  # o.__class__ = B
        interp.guards.guard(Source(f"type({args[0][1].expr})", args[0][1]), type(args[0][0]))
    return _UNHANDLED


def _call_torch(interp, fnp, args, kwargs):
    """torch.tensor of Python data, and every torch callable (and super()), recorded."""
    fn = fnp[0]
    if fn in _FROM_DATA and interp.recording:
        made = interp._from_data(fn, args, kwargs)
        if made is not None:
            return made
    if _is_torch_callable(fn) or (fn is super and len(args) == 2) or getattr(fn, "__code__", None) in _RUN_WHOLE:
        for v, s in list(args) + list(kwargs.values()):
            interp._touch_elements(v, s)  # lists of sizes, dims, paddings: read by value
        mark, interp.rec.step_mark, why = interp.rec.step_mark, len(interp.rec.lines), None
        try:
            r = interp._concrete(fn, args, kwargs)
        except DataDependentStep as e:  # torch.unique, nms: a stitch step (see the recorder)
            why = str(e)
        except Exception as e:  # noqa: BLE001 -- judged by running it as eager does
            # A call that raised under the recorder (its dispatch mode, a recorder decomposition)
            # is judged by eager: it runs again outside the recorder, raising only if eager
            # raises. (torch 1.13's composite ops took other paths under a dispatch mode; 2.13's
            # take eager's, so this now guards against the recorder's own failures only.)
            name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "a torch call")
            why = f"{name} raised under the recorder ({type(e).__name__}: {e})"
        finally:
            interp.rec.step_mark = mark
        if why is not None:
            return interp._opaque(fnp, args, kwargs, why)
        if not args and not kwargs and type(r[0]) in _BY_VALUE and interp.recording and \
                (getattr(fn, "__self__", None) is None or isinstance(fn.__self__, types.ModuleType)):
            # torch state read by the program (torch.are_deterministic_algorithms_enabled())
            interp.guards.guard_state(f"{interp.guards.const_source(fn).expr}()", r[0],
                                    f"{getattr(fn, '__name__', fn)}() == {r[0]!r}")
        return r
    return _UNHANDLED


def _frame_namespace(interp, fn, args, kwargs):
    """globals(), locals(), vars(), dir() and eval/exec without namespaces read the calling
    frame's: here the program's frame (interp.frames[-1]), not the interpreter's own. None
    where fn is none of these."""
    if not interp.frames or not any(fn is r for r in _FRAME_READERS) or kwargs or \
            ((fn is vars or fn is dir) and args) or ((fn is eval or fn is exec) and not 1 <= len(args) <= 2):
        return None
    f = interp.frames[-1]
    if fn is globals:
        return (f.globals, None)
    names = {}
    for name, (v, _) in zip(f.dec.names, f.locals):
        if v is _NULL:
            continue
        if name in f.code.co_cellvars or name in f.code.co_freevars:
            if type(v) is not types.CellType:
                continue
            try:
                v = v.cell_contents
            except ValueError:
                continue
        names[name] = v
    if fn is locals or fn is vars:
        return (names, None)
    if fn is dir:
        return (sorted(names), None)
    for v, s in args:
        interp._touch_elements(v, s)
    interp._effect(f"{fn.__name__}() of program text")  # (what the text does is not seen)
    glb = args[1][0] if len(args) == 2 else f.globals
    return (fn(args[0][0], glb, names if len(args) == 1 else None), None)


def _call_builtin(interp, fnp, args, kwargs):
    """enumerate/zip of sourced values, pure builtins, and methods of lists, dicts, sets,
    tuples and strings."""
    fn, fsrc = fnp
    made = interp._frame_namespace(fn, args, kwargs)
    if made is not None:
        if fn is eval or fn is exec:
            interp.abort(f"{fn.__name__}() runs program text dynamo does not see")
        return made
    if fn in (enumerate, zip) and interp.recording:
        made = interp._sourced_pairs(fn, args, kwargs)
        if made is not None:
            return made
    if fn in (setattr, object.__setattr__) and len(args) == 3 and not kwargs and type(args[1][0]) is str and \
            id(args[0][0]) in interp.local_objs:
        # setattr(obj, "name", v) on an object the call made, as STORE_ATTR sets it (and
        # object.__setattr__, as a frozen dataclass's __init__ does)
        interp.touch(*args[1])
        fn(args[0][0], args[1][0], args[2][0])
        return (None, None)
    if fn is map and len(args) >= 2 and not kwargs:  # lazily, as map does: see _map
        return interp._call_python(_map, None, list(args), {}, None)
    if fn is collections.defaultdict and args and args[0][0] is not None and args[0][0] not in _PURE_BUILTINS:
        return _UNHANDLED  # (a factory that may do anything when a missing key is read)
    if fn in _PURE_BUILTINS or fn in _CONTAINERS:
        for i, (v, s) in enumerate(list(args) + list(kwargs.values())):
            if i == 0 and (fn in _BY_CLASS or (fn is len and (type(v) in _SIZED or structural_dict(v)))):
                # its class or length decides, which the guard of an object, list, tuple or dict
                # checks (len(cache.layers) reads no element)
                interp.touch(v, s)
            else:
                interp._touch_elements(v, s)
        # (a bound method read anew each call is guarded by its function and object: not pinned)
        r = interp._concrete(fn, args, kwargs, pin=not (fn in _BY_CLASS or fn is inspect.signature or
                                                        (fn is len and (type(args[0][0]) in _SIZED or
                                                                        structural_dict(args[0][0])))))
        if fn in _CONTAINERS:  # a new container of the call's own, as {} makes
            interp._mark_local(r[0])
            if fn is dict and len(args) == 1 and not kwargs:  # dict(d.items()): the values keep their sources
                interp.note_dict_srcs(r[0], _pair_sources(interp, args[0][0]))
        return r
    self_ = getattr(fn, "__self__", None)
    if isinstance(fn, types.BuiltinMethodType) and isinstance(self_, (list, dict, set, tuple, str)):
        if id(self_) in interp.local_objs or fn.__name__ in _READ_METHODS:
            if (fsrc is None or fsrc.base is None) and isinstance(self_, dict) and id(self_) not in interp.local_objs:
                found = recovered_source(interp, self_)  # (self of an inlined method, through a closure cell)
                fsrc = found.attr(fn.__name__) if found is not None else fsrc
            if fsrc is not None and fsrc.base is not None:  # d.values(), d.get(k), ... of a sourced d
                interp._touch_elements(self_, fsrc.base)
                if isinstance(self_, dict) and fn.__name__ in ("items", "values") and not args and not kwargs:
                    return interp._sourced_view(self_, [raw_item_src(interp, self_, fsrc.base, k) for k in self_],
                                                fn.__name__)
            elif type(self_) in _DICTS and id(self_) in interp._dict_srcs:
                return _noted_dict_method(interp, fn, self_, args, kwargs)
            if fn.__name__ in _BY_IDENTITY and not (fn.__name__ == "__contains__" and isinstance(self_, (dict, set))):
                interp._pin_held(self_)  # lst.index(obj), lst == other: which objects it holds
            return interp._concrete(fn, args, kwargs)
        return interp._opaque(fnp, args, kwargs, f"{type(self_).__name__}.{fn.__name__} changes an object "
                                                f"from outside the function")
    return _UNHANDLED


def _pair_sources(interp, pairs):
    """{key: source} of the values of a tuple of (key, value) pairs whose values have sources
    (d.items() of a sourced dict: _sourced_view); {} for anything else."""
    if type(pairs) is not tuple:
        return {}
    out = {}
    for p in pairs:
        srcs = interp._tuple_srcs.get(id(p)) if type(p) is tuple and len(p) == 2 else None
        if srcs is None or srcs[1] is None or type(p[0]) not in (str, int):
            return {}
        out[p[0]] = srcs[1]
    return out


def _call_object(interp, fnp, args, kwargs):
    """Python classes instantiated, object.__new__/__init__ on objects the call made, and
    instances with a __call__ in Python."""
    fn, fsrc = fnp
    if _plain_class(fn):
        return interp._instantiate(fn, args, kwargs)
    if _dict_class(fn):  # a dict subclass with an __init__ in Python (Hugging Face's ModelOutput)
        obj = interp._mark_local(fn.__new__(fn))
        interp._call_python(fn.__init__, None, args, kwargs, (obj, None), init=True)
        return (obj, None)
    if fn is functools.partial and args:
        return interp._make_partial(args, kwargs)
    if type(fn) is functools.partial:  # its function called with its arguments first
        fs, asrcs, ksrcs = interp._partial_sources(fn, fsrc)
        interp.touch(fn.func, fs)
        a = [(v, s) for v, s in zip(fn.args, asrcs)] + list(args)
        k = {n: (v, ksrcs[n]) for n, v in fn.keywords.items()}
        for v, s in a[:len(fn.args)] + [k[n] for n in fn.keywords]:
            interp.touch(v, s)  # (what the partial holds is read as a load of it would be)
        k.update(kwargs)
        return interp.call((fn.func, fs), a, k)
    if fn is object.__new__ and len(args) == 1 and not kwargs and _plain_class(args[0][0]):
        obj = object.__new__(args[0][0])  # super().__new__(cls) in a __new__ of Python
        interp._mark_local(obj)
        interp.keep.append(obj)
        return (obj, None)
    if type(fn) is types.MethodWrapperType and fn.__name__ == "__init__" and not args and not kwargs and \
            id(fn.__self__) in interp.local_objs and fn == object.__init__.__get__(fn.__self__):
        return (None, None)  # super().__init__() reaching object's, on an object made in the call
    base = getattr(fn, "__self__", None)
    if type(fn) is types.BuiltinFunctionType and fn.__name__ == "__new__" and isinstance(base, type) and \
            base in _BUILTIN_BASES and args \
            and _plain_class(args[0][0]) and issubclass(args[0][0], base):
        # super().__new__(cls, ...) in a __new__ of Python over a builtin base (a tuple or list
        # subclass): the new object made for real, a local of the call, its elements guarded
        for v, s in list(args[1:]) + list(kwargs.values()):
            interp._touch_elements(v, s)
        obj = interp._concrete(fn, args, kwargs)[0]
        interp._mark_local(obj)
        interp.keep.append(obj)
        return (obj, None)
    if type(fn) is types.MethodWrapperType and fn.__name__ == "__init__" and id(base) in interp.local_objs and \
            isinstance(base, (list, dict, set)):
        # super().__init__(items) of a list, dict or set subclass the call made: filled for real
        for v, s in list(args) + list(kwargs.values()):
            interp._touch_elements(v, s)
        interp._concrete(fn, args, kwargs)
        return (None, None)
    if type(type(fn)) in (type, abc.ABCMeta) and not isinstance(fn, (torch.Tensor, torch.nn.Module)) and \
            type(fn).__module__ != "builtins":
        # an instance of a Python class with a __call__ in Python (torchvision's LevelMapper):
        # a method call, guarded as one
        call = interp._plain_method(fn, fsrc, "__call__")
        if call is not None:
            return interp._call_python(call[0], None, args, kwargs, (fn, fsrc))
    return _UNHANDLED


def _make_partial(interp, args, kwargs):
    """functools.partial(func, *args, **kwargs) made in the call (functools.wraps makes one
    inside decorators): the real object, its parts' sources kept for when it is called."""
    (func, fs), rest = args[0], list(args[1:])
    p = functools.partial(func, *[v for v, _ in rest], **{n: v for n, (v, _) in kwargs.items()})
    asrcs, ksrcs = [s for _, s in rest], {n: s for n, (_, s) in kwargs.items()}
    if p.func is not func:  # partial(partial(f, a), b) flattens to partial(f, a, b)
        fs, inner_a, inner_k = interp._partial_sources(func, fs)
        asrcs, ksrcs = inner_a + asrcs, {**inner_k, **ksrcs}
    interp._mark_local(p)
    interp._partial_srcs[id(p)] = (fs, asrcs, ksrcs)
    return (p, None)


def _partial_sources(interp, p, psrc):
    """(source of p.func, sources of p.args, sources of p.keywords by name) of a partial."""
    if id(p) in interp._partial_srcs:
        return interp._partial_srcs[id(p)]
    if psrc is None:
        return None, [None] * len(p.args), dict.fromkeys(p.keywords)
    return (psrc.attr("func"), [psrc.attr("args").item(i) for i in range(len(p.args))],
            {n: psrc.attr("keywords").item(n) for n in p.keywords})


def _from_data(interp, fn, args, kwargs):
    """torch.tensor(data) / as_tensor(data) of Python numbers (nested lists or tuples; dtype
    and device by value): the numbers are constants or guarded reads, so the tensor is the
    same on every call that passes the guards. It becomes a trace input whose source makes
    it again from those numbers, held by the guards (`c7(c8, dtype=c9)`); None when the data
    are anything else (the call is then recorded, and the recorder refuses it)."""
    a = [v for v, _ in args]
    k = {n: v for n, (v, _) in kwargs.items()}
    if not a or set(k) - {"dtype", "device"} or not all(_numbers(v) for v in a[:1]) or \
            not all(plain(v) for v in list(a[1:]) + list(k.values())):
        return None
    for v, s in list(args) + list(kwargs.values()):
        interp._touch_elements(v, s)
    frozen = [_freeze(v) for v in a]
    interp.rec.paused += 1
    try:
        with interp._outside_recorder():
            t = fn(*frozen, **k)
    finally:
        interp.rec.paused -= 1
    c = interp.guards.const_source
    parts = [c(v).expr for v in frozen] + [f"{n}={c(v).expr}" for n, v in k.items()]
    src = Source(f"{c(fn).expr}({', '.join(parts)})")
    interp.keep.append(t)
    interp.touch(t, src)
    return (t, src)


def _instantiate(interp, cls, args, kwargs):
    """cls(*args) for a plain Python class (no metaclass; object.__new__ or a __new__ in Python,
    interpreted): a new object of the call's own, its __init__ interpreted like any method."""
    if cls.__new__ is not object.__new__:  # a __new__ in Python: interpreted, as type.__call__ runs it
        obj = interp._call_python(cls.__new__, None, [(cls, None)] + list(args), kwargs, None)[0]
        if not isinstance(obj, cls):  # (__init__ runs only on an instance of cls)
            return (obj, None)
    else:
        obj = object.__new__(cls)
        interp._mark_local(obj)
        interp.keep.append(obj)
    init = cls.__init__
    if init is object.__init__:
        # object.__init__ refuses arguments only where __new__ is object's too (a namedtuple's
        # __new__ takes them, and its __init__ is object's)
        if (args or kwargs) and cls.__new__ is object.__new__:
            raise TypeError(f"{cls.__name__}() takes no arguments")
    else:
        interp._call_python(init, None, args, kwargs, (obj, None), init=True)
    return (obj, None)


_BY_CLASS = (isinstance, issubclass, callable)
_BY_IDENTITY = frozenset(("index", "count", "remove", "__contains__", "__eq__", "__ne__"))
_SIZED = (list, tuple, dict, collections.OrderedDict, str, range, torch.Size)  # len() of these: the guard's length
# dict methods that read no value of the dict they are called on (get, pop and setdefault read one
# only where the key is there: _noted_dict_method gives it its source then)
_VALUE_BLIND = frozenset(("keys", "__contains__", "__len__", "__iter__", "get", "pop", "setdefault", "update", "clear",
                          "__setitem__", "__delitem__"))


def _noted_dict_method(interp, fn, d, args, kwargs):
    """A method of a dict whose values have sources (a **kwargs dict: interp.dict_srcs), called
    on it: a value read out (get, pop, setdefault, []) keeps its source, and is guarded as any
    read of it; items() and values() keep each value's; a copy keeps them all. Any other method
    that reads values (not _VALUE_BLIND) would hand them on without sources, as constants of the
    trace: all of them are guarded first."""
    name, srcs = fn.__name__, interp.dict_srcs(d)
    if name in ("get", "pop", "setdefault", "__getitem__") and args and not kwargs:
        key = args[0][0]
        src = srcs.get(key) if type(key) in (str, int) else None
        if src is not None:
            v = interp._concrete(fn, args, kwargs)[0]
            interp.touch(v, src)
            return (v, src)
    elif name in ("items", "values") and not args and not kwargs:
        return interp._sourced_view(d, [srcs.get(k) for k in d], name)
    elif name == "copy" and not args and not kwargs:
        r = interp._mark_local(fn())
        interp.note_dict_srcs(r, srcs)
        return (r, None)
    if name not in _VALUE_BLIND:
        interp._touch_elements(d, None)
    return interp._concrete(fn, args, kwargs)


def _sourced_view(interp, d, srcs, which):
    """d.items() / d.values() of a sourced dict as a tuple whose elements keep their sources
    (srcs, one per key: d[k]), so that modules and objects taken from it are read through guarded
    paths (their parameters are trace inputs). The keys are guarded by d's own guard."""
    if which == "values":
        t = tuple(d.values())
        interp._tuple_srcs[id(t)] = srcs
    else:
        pairs = []
        for (k, v), s in zip(d.items(), srcs):
            p = (k, v)
            interp._tuple_srcs[id(p)] = [None, s]
            pairs.append(p)
        t = tuple(pairs)
        interp._tuple_srcs[id(t)] = [None] * len(t)
        interp.keep.extend(pairs)
    interp.keep.append(t)
    return (t, None)


@staticmethod


def _super_args(f):
    """Zero-argument super() in frame f: (the __class__ cell's class, the first argument)."""
    if "__class__" not in f.dec.names or not f.code.co_argcount:
        raise RuntimeError("super(): __class__ cell not found")
    cls = f.locals[f.dec.names.index("__class__")][0].cell_contents
    first, src = f.locals[0]
    if isinstance(first, types.CellType):  # the first argument is captured by a closure
        first, src = first.cell_contents, None
    return [(cls, None), (first, src)]


def _call_python(interp, fn, fsrc, args, kwargs, self_pair, init=False):
    if "_torchdynamo_orig_callable" in getattr(fn, "__dict__", ()):
        # A function torch.compile wrapped is compiled here as part of the caller: what it
        # wraps is recorded (torchvision compiles its Python roi_align on first use; recorded,
        # its gathers fuse into one loop, 10x faster than Inductor's code for it). One marked
        # torch.compiler.disable, or whose code we cannot follow, runs as the program asked,
        # a step between traces.
        orig = fn.__dict__["_torchdynamo_orig_callable"]
        disabled = fn.__dict__.get("_torchdynamo_disable")
        if not disabled and isinstance(orig, types.FunctionType) and interp.unsupported_reason(orig.__code__) is None \
                and self_pair is None:
            return interp._call_python(orig, None, args, kwargs, None, init)
        how = "marked torch.compiler.disable" if disabled else "wrapped by torch.compile"
        return interp._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} is {how}", self_pair)
    if getattr(fn, "_dynamo_disable", False):
        return interp._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} is marked dynamo.disable",
                            self_pair)
    why = interp.unsupported_reason(fn.__code__)
    if why is None and interp.depth >= MAX_DEPTH:
        why = "inlining too deep"
    mod = getattr(fn, "__module__", None) or ""
    if mod.split(".")[:2] in (["torch", "_dynamo"], ["torch", "compiler"]):
        # torch.compile's own queries (is_compiling(), is_compile_supported(): the platform,
        # sysconfig, global flags of this process): run for real, as eager runs them, their
        # answers constants of the trace (torchvision's roi_align asks before choosing its path)
        if self_pair is not None:
            args = [self_pair] + list(args)
        r = interp._concrete(fn, args, kwargs)
        if isinstance(r[0], torch.Tensor):  # (a tensor made outside the trace: not a constant of it)
            interp.abort(f"{fn.__qualname__} (torch.compile's helper) returned a tensor")
        return r
    if why is not None and (mod == "torch" or mod.startswith("torch.")) and not mod.startswith("torch.nn.modules"):
        # torch's own Python helpers (Tensor.split, ...): run for real with recording on, so
        # the ATen ops they perform are recorded; their arguments are all we pass them.
        # What they read of sizes is not seen: the trace serves its own sizes only.
        interp.sizes.note_read("", f"{fn.__qualname__}() (torch's Python code run without being followed)")
        if self_pair is not None:
            args = [self_pair] + list(args)
        return interp._concrete(fn, args, kwargs)
    if why is not None:
        return interp._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} uses {why}", self_pair)
    if interp.recording:
        interp.inlined.append(fn.__qualname__)
    if fsrc is None and id(fn) not in interp.local_objs:
        fsrc = interp.guards.const_source(fn)  # reads of its closure and defaults stay guarded
    if fsrc is not None and interp.recording:  # the code itself can be replaced (f.__code__ = ...)
        interp.guards.guard(Source(f"{fsrc.expr}.__code__", fsrc), fn.__code__)
    return interp.call_function(fn, fsrc, args, kwargs, self_pair, init)


def _concrete(interp, fn, args, kwargs, pin=True):
    """fn called for real on the values of args/kwargs ((value, source) pairs). A plain data
    object among them is pinned (its identity guarded): what fn does with it is not seen."""
    if pin and interp.guards._structural:
        interp._pin(*args, *kwargs.values())
    a = [v for v, _ in args]
    k = {n: v for n, (v, _) in kwargs.items()}
    r = fn(*a, **k)
    if type(r) in (list, dict, set) or hasattr(type(r), "__next__"):
        interp._mark_local(r)  # made by this call (an iterator from iter(), zip(), ...)
    return (r, None)


def _opaque(interp, fnp, args, kwargs, why, self_pair=None):
    """Runs a call we cannot record, for real. The trace ends right before it: where the
    interpreter state can be carried to later calls, as a stitch (the call becomes a step
    between this trace and the next, see _stitch), else by an abort."""
    stitched = interp._stitch(why)
    if not stitched:
        interp.abort(why)
    interp._effect(f"a call not recorded ({why})")
    interp.rec.paused += 1
    try:
        a = [interp._escaping(v) for v, _ in args]  # (a generator of the call goes out as a real one)
        if self_pair is not None:
            a = [self_pair[0]] + a
        with interp._outside_recorder():  # exactly as eager runs it
            r = fnp[0](*a, **{n: interp._escaping(v) for n, (v, _) in kwargs.items()})
    finally:
        interp.rec.paused -= 1
    if stitched:
        raise StitchNow(r)
    return (r, None)


def _mode_read(interp, fn, args, kwargs):
    """A read of torch's dispatch-mode stack (nn.MultiheadAttention asks whether make_fx is
    tracing): answered as the program sees it, without the recorder's own mode, and guarded,
    so that a later call under a mode of the program's records again."""
    for v, s in list(args) + list(kwargs.values()):
        interp._touch_elements(v, s)
    with interp._outside_recorder():
        r = fn(*[v for v, _ in args], **{n: v for n, (v, _) in kwargs.items()})
    call = f"{interp.guards.const_source(fn).expr}({', '.join(repr(v) for v, _ in args)}" \
           f"{', ' if args and kwargs else ''}{', '.join(f'{n}={v!r}' for n, (v, _) in kwargs.items())})"
    name = getattr(fn, "__name__", "a dispatch-mode read")
    if type(r) in _BY_VALUE:
        interp.guards.guard_state(call, r, f"{name}() == {r!r}")
    elif type(r) is list and not r:
        interp.guards.guard_state(f"len({call})", 0, f"{name}() is empty")
    else:  # a mode of the program's is active: its own modes are not recorded through
        interp.abort(f"{name}() finds a dispatch mode of the program's", "python")
    return (r, None)


def _outside_recorder(interp):
    """A context without the recorder's dispatch mode, for calls not recorded: they run
    exactly as in eager, and what they ask of torch's mode stack (make_fx tracing?) is the
    program's answer. (torch 1.13's composite ops also took other, "tensor subclass" paths
    under any Python dispatch mode; 2.13's do not.)"""
    if _current_mode() is interp.rec:
        return _pop_mode_temporarily()
    return contextlib.nullcontext()


def _bind(interp, f, fn, fn_src, args, kwargs):
    """Binds the call's (value, source) pairs to frame f's parameters as CPython binds them,
    with CPython's checks in its order and its messages (a wrong call raises the TypeError
    eager raises): keywords, then too many positional arguments, then missing ones."""
    code = fn.__code__
    n = code.co_argcount
    nk = code.co_kwonlyargcount
    names = code.co_varnames
    qual = code.co_qualname
    loc = list(f.locals)
    for i in range(min(n, len(args))):
        loc[i] = args[i]
    extra = list(args[n:])
    pos = n + nk
    if code.co_flags & CO_VARARGS:
        t = tuple(v for v, _ in extra)
        interp._mark_local(t)
        loc[pos] = (t, None)
        interp._tuple_srcs[id(t)] = [s for _, s in extra]
        pos += 1
    kw = dict(kwargs)
    settable = names[code.co_posonlyargcount:n + nk]
    for name in list(kw):
        if name in settable:
            i = names.index(name, code.co_posonlyargcount)
            if loc[i][0] is not _NULL:
                raise TypeError(f"{qual}() got multiple values for argument '{name}'")
            loc[i] = kw.pop(name)
        elif not code.co_flags & CO_VARKEYWORDS:
            posonly = [k for k in kwargs if k in names[:code.co_posonlyargcount]]
            if posonly:
                raise TypeError(f"{qual}() got some positional-only arguments passed as keyword arguments: "
                                f"'{', '.join(posonly)}'")
            raise TypeError(f"{qual}() got an unexpected keyword argument '{name}'")
    if code.co_flags & CO_VARKEYWORDS:
        d = {name: v for name, (v, _) in kw.items()}
        interp._mark_local(d)
        interp.note_dict_srcs(d, {name: s for name, (_, s) in kw.items()})
        loc[pos] = (d, None)
    defaults = fn.__defaults__ or ()
    if extra and not code.co_flags & CO_VARARGS:
        kw_given = sum(loc[i][0] is not _NULL for i in range(n, n + nk))
        sig = f"from {n - len(defaults)} to {n}" if defaults else f"{n}"
        plural = "s" if defaults or n != 1 else ""
        given = (f"{len(args)} positional argument{'s' if len(args) != 1 else ''} (and {kw_given} keyword-only "
                 f"argument{'s' if kw_given != 1 else ''}) were") if kw_given else \
            f"{len(args)} {'was' if len(args) == 1 else 'were'}"
        raise TypeError(f"{qual}() takes {sig} positional argument{plural} but {given} given")
    if interp.scalars:
        for p in loc:
            if p[1] is not None and p[1].expr in interp.scalars:
                interp._moved.add(id(p))
    missing = [names[i] for i in range(n - len(defaults)) if loc[i][0] is _NULL]
    if missing:
        raise TypeError(_missing_message(qual, "positional", missing))
    for i in range(n - len(defaults), n):
        if loc[i][0] is _NULL:
            j = i - (n - len(defaults))
            src = fn_src.attr("__defaults__").item(j) if fn_src is not None else None
            loc[i] = (defaults[j], src)
    kwdefaults = fn.__kwdefaults__ or {}
    missing = [names[i] for i in range(n, n + nk) if loc[i][0] is _NULL and names[i] not in kwdefaults]
    if missing:
        raise TypeError(_missing_message(qual, "keyword-only", missing))
    for i in range(n, n + nk):
        if loc[i][0] is _NULL:
            src = fn_src.attr("__kwdefaults__").item(names[i]) if fn_src is not None else None
            loc[i] = (kwdefaults[names[i]], src)
    f.locals = loc
