"""Where the recording interpreter's values come from (interpreter.py): reading a sourced value
installs its guard and makes a tensor a trace input (touch, touch_input, touch_deep), attribute
reads (load_attr: modules, properties, descriptors), globals and imports, and the sources of
elements of containers, modules' children and zip/enumerate rows. Each function takes the
interpreter as its first argument; the Interpreter class binds them as its methods."""
import builtins
import collections
import importlib.util
import re
import sys
import types
import torch
from . import config
from .frames import Abort
from .frames import SourcedIter as _SourcedIter
from .frames import ItemRead
from .guards import FUNC, GLOBALS, Source, plain, structural_dict


_DICTS = (dict, collections.OrderedDict)  # read key by key, guarded by their keys
_PLAIN_TYPES = (type(None), bool, int, float, str, tuple, list, dict, collections.OrderedDict, torch.dtype,
                torch.device)


# Scalar inputs (config.dynamic): a Python float or int argument of the call that only feeds
# tensor arithmetic is passed to the trace each call instead of being guarded by value. It is
# tracked while it sits on the value stack or in locals; any bytecode that reads it other than
# these (a comparison, Python arithmetic, a call into C, a container) guards its value after all.
_SCALAR_ARG = re.compile(r"[ak]\[(\d+|'[A-Za-z_][A-Za-z_0-9]*')\]\Z")


def _has_hooks(m):
    from torch.nn.modules import module as mm
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
                getattr(mm, "_global_forward_hooks", None) or getattr(mm, "_global_forward_pre_hooks", None) or
                getattr(mm, "_global_backward_hooks", None))


def _is_torch_module(m):
    """Whether m is torch or one of its submodules: their functions are taken as fixed."""
    if not isinstance(m, types.ModuleType):
        return False
    name = getattr(m, "__name__", "")
    return name == "torch" or name.startswith("torch.")


def _static_lookup(cls, name):
    """The attribute `name` as stored on class cls or a base (no descriptor called), or None."""
    for klass in cls.__mro__:
        d = klass.__dict__
        if name in d:
            return d[name]
    return None


def runs_class_forward(m):
    """Whether calling module m runs its class's forward: no forward set on the instance, or the
    one dynamo.optimize(m) set (an optimized function of that very forward, owned by m; inside a
    recording it is inlined like the plain one, its own traces are for calls from CPython)."""
    f = m.__dict__.get("forward")
    return f is None or (getattr(type(f), "dynamo_optimized_forward", False) and f.owner is m and
                         f.fn is type(m).forward)


def touch(interp, v, src, depth=0, scalar_ok=False):
    """v was read from src: guard it (and register tensors as inputs). scalar_ok: a load onto
    the value stack, where a Python number argument may become a scalar input (tracked in
    interp.scalars, its value guarded only by a use that depends on it: settle_scalar)."""
    if src is None or not interp.recording or type(src) is ItemRead:  # (an ItemRead: guarded at its use)
        return
    if type(v) in (float, int):
        if src.expr in interp.scalars:
            if scalar_ok:
                return
            interp.scalars.pop(src.expr)  # read some other way: guarded by value below
        elif scalar_ok and interp.dynamic_scalars and _SCALAR_ARG.match(src.expr) and \
                not interp.guards.value_guarded(src):
            interp.scalars[src.expr] = (v, src)
            interp.guards.guard_scalar_type(src, v)
            return
    try:
        if isinstance(v, torch.Tensor):
            prev = interp.tensor_src.get(id(v))
            if prev is not None and prev != src.expr:
                interp.guards.guard_state(f"({src.expr}) is ({prev})", True, f"{src.expr} is the same tensor as {prev}")
                return
            interp.guards.guard(src, v)
            weight = config.keep_weight_results and (isinstance(v, torch.nn.Parameter) or id(v) in interp._module_tensors)
            if interp.rec.add_input(v, weight=weight):
                interp.guards.add_tensor_input(src)
                interp.tensor_src[id(v)] = src.expr
                interp.input_objs[id(v)] = v
                if v.requires_grad and isinstance(v, torch.nn.Parameter):
                    interp.param_bytes += v.numel() * v.element_size()
            return
        interp.guards.guard(src, v)
        if type(v) not in _PLAIN_TYPES and id(v) not in interp.obj_srcs:
            interp.obj_srcs[id(v)] = (v, src)  # (a result holding it finds it there: OutObjects)
    except Abort as e:
        interp.abort(str(e), e.kind)


def touch_input(interp, v, src):
    """A parent trace's input, read again for a side trace (which takes the same inputs
    first, in order): a tensor as touch does; a number as the same scalar input, still
    unguarded (tracked as if just loaded)."""
    if type(v) in (float, int) and interp.recording:
        interp.scalars[src.expr] = (v, src)
        interp.guards.guard_scalar_type(src, v)
        interp.rec.scalar_input(src.expr, v)
        if not interp.dynamic_scalars:
            interp.settle_scalar((v, src))
        return
    interp.touch(v, src)


def touch_deep(interp, v, src, depth=0):
    """A sourced container escapes into a builtin: guard everything inside it (element by
    element up to 64 elements and 4 levels; beyond that, or for sets, the whole contents by
    value when they are plain values, else the recording ends)."""
    if src is None or not interp.recording:
        return
    t = type(v)
    if t in _DICTS:
        t = dict
    keyed = t is not dict and structural_dict(v)  # (its class and keys guarded: which one it is does not matter)
    if t in (list, tuple, dict, set, frozenset) and (t in (set, frozenset) or depth > 4 or len(v) > 64):
        if plain(tuple(v.items()) if t is dict else tuple(v)):
            interp.guards.guard_contents(src, v)
        else:
            interp.abort(f"reads a {t.__name__} of {len(v)} elements as a whole (too large or too deep to "
                       "guard element by element, and not made of plain values)")
        return
    interp.touch(v, src)
    if not keyed:
        interp.guards.pin(src, v)  # (a plain data object handed to a builtin: which one matters)
    if t in (list, tuple):
        for i, x in enumerate(v):
            interp.touch_deep(x, src.item(i), depth + 1)
    elif t is dict or keyed:
        for key, x in v.items():
            interp.touch_deep(x, raw_item_src(interp, v, src, key), depth + 1)


def _item_src(interp, src, key):
    """The source of src[key]: the key spelled as a literal when it reads back exactly,
    else as a guard constant (tuples of objects, enum members, floats)."""
    if type(key) in (str, int, bool, type(None)):
        return src.item(key)
    return Source(f"{src.expr}[{interp.guards.const_source(key).expr}]", src)


def raw_item_src(interp, d, src, key):
    """The source of the value dict d (read from src) holds at key as dict's own items() gives
    it: src[key] for a dict, dict.__getitem__(src, key) for a subclass (whose own __getitem__
    may answer otherwise: Hugging Face's ModelOutput gives its tuple's element for an int)."""
    item = _item_src(interp, src, key)
    if type(d) in _DICTS:
        return item
    return Source(f"dict.__getitem__({src.expr}, {item.expr[len(src.expr) + 1:-1]})", src)


def recovered_source(interp, obj):
    """The source an object from outside the call was first read from, when its own was dropped
    on the way (it went through a list or dict the call made, or a local of another frame): its
    attributes are then read through that source -- guarded each call, as a direct read is --
    and not taken as constants of the trace. None for tensors, plain values and the call's own
    objects (obj_srcs holds only what touch() saw read from a source)."""
    found = interp.obj_srcs.get(id(obj)) if interp.obj_srcs else None
    return found[1] if found is not None and found[0] is obj else None


def load_attr(interp, obj, osrc, name):
    """obj.name as a (value, source) pair, guarded when obj is sourced. Properties defined in
    Python are inlined (their reads are guarded one by one, and a getter with side effects
    ends the trace as any other code would), never re-run by a guard."""
    if name == "shape" and interp.sizes.size_read is None and isinstance(obj, torch.Tensor):
        interp.sizes.note_read("shape")
    if osrc is None:
        osrc = recovered_source(interp, obj)
    if not isinstance(obj, type):
        raw = _static_lookup(type(obj), name)
        if isinstance(raw, property) and isinstance(raw.fget, types.FunctionType):
            return interp._call_python(raw.fget, None, [], {}, (obj, osrc))
    v = getattr(obj, name)
    if osrc is not None and interp.written:
        if (id(obj), name) in interp.written:  # set by this call (a write-back): what the trace made
            return (interp.probe_writes.get((id(obj), name), v) if interp.probe is not None else v, None)
        if name == "__dict__" and any(k[0] == id(obj) for k in interp.written):
            interp.abort(f"reads __dict__ of an object whose attributes the call set ({osrc.expr})")
    if osrc is None:
        if name == "__dict__" and id(obj) in interp.local_objs:
            interp._mark_local(v)  # (functools.update_wrapper updates a new function's __dict__)
        return (v, None)
    if isinstance(obj, torch.Tensor):
        # Tensor metadata is guarded natively; only state Python can change besides it
        # (the .grad slot, attributes set on the tensor object) is read through a source.
        if name != "grad" and name not in getattr(obj, "__dict__", ()):
            return (v, None)
    src = osrc.attr(name)
    if isinstance(v, torch.Tensor) and isinstance(obj, torch.nn.Module) and \
            obj.__dict__.get("_buffers", {}).get(name) is v:
        interp._module_tensors[id(v)] = v  # a module's registered buffer: a weight input
    if isinstance(v, types.MethodType):
        # a bound method is made anew at each read: guard what it calls and on what
        if interp.recording:
            interp.guards.guard(Source(f"{src.expr}.__func__", src), v.__func__)
            if v.__self__ is not obj:
                interp.guards.guard(Source(f"{src.expr}.__self__", src), v.__self__)
        return (v, Source(src.expr, osrc))
    if isinstance(v, types.BuiltinMethodType) and not (v.__self__ is None or
                                                       isinstance(v.__self__, types.ModuleType)):
        # a builtin bound to obj (list.append ...): which one is fixed by obj's type
        if interp.recording:
            interp.guards.guard(Source(f"type({osrc.expr})", osrc), type(obj))
        return (v, Source(src.expr, osrc))
    if isinstance(v, types.BuiltinFunctionType) and _is_torch_module(obj):
        # torch.tanh, torch.nn.functional's builtins: torch's own functions are taken as
        # fixed (not guarded, so a side trace calling another one still links to its parent
        # natively). Any other module's attributes, a user's config module's included
        # (cfg.ACT = torch.tanh between calls), are guarded as any value is.
        return (v, Source(src.expr, osrc))
    if interp.probe is not None and id(v) in interp.rec.probe_shapes:  # (a tensor a size probe changes)
        v = interp.rec.probe_twin(v)
    interp.touch(v, src)
    return (v, src)


# -- attributes ----------------------------------------------------------------------
def _plain_method(interp, obj, osrc, name):
    """(function, source) when obj.name is a plain method call (a function found on the type,
    not shadowed by the instance): guarded to be the same function on obj's type (the class
    may be patched, or obj's __class__ changed), and not shadowed later by an instance
    attribute. None otherwise (static and class methods, properties, instance callables)."""
    if isinstance(obj, type):
        return None
    raw = _static_lookup(type(obj), name)
    if not isinstance(raw, types.FunctionType) or name in getattr(obj, "__dict__", ()):
        return None
    if osrc is None:
        osrc = recovered_source(interp, obj)
    if osrc is not None and interp.recording:  # one guard: this is on every method call's path
        e, c = osrc.expr, interp.guards.const_source(raw).expr
        shadow = f" and {name!r} not in {e}.__dict__" if hasattr(obj, "__dict__") else ""
        interp.guards.guard_state(f"type({e}).{name} is {c}{shadow}", True,
                                f"{e}.{name} is {raw.__qualname__}, not shadowed by the instance", src=osrc)
    return (raw, None)


def _getattr_builtin(interp, fn, args):
    """getattr(obj, name[, default]) / hasattr(obj, name): the attribute is read as LOAD_ATTR
    reads it (guarded when obj is sourced), and its absence is guarded too."""
    (obj, osrc), name = args[0], args[1][0]
    try:
        pair = interp.load_attr(obj, osrc, name)
    except AttributeError:
        if fn is getattr and len(args) < 3:
            raise
        if osrc is not None and interp.recording:
            interp.guards.guard_state(f"hasattr({osrc.expr}, {name!r})", False, f"{osrc.expr} lacks {name}")
        return (False, None) if fn is hasattr else args[2]
    return (True, None) if fn is hasattr else pair


def _touch_elements(interp, v, s, depth=0):
    """v (with source s, or a tuple whose element sources we know) goes into a builtin: guard
    it and register its elements, so tensors reached through the builtin's result (sum,
    zip, enumerate, dict.values() ...) are trace inputs."""
    if type(v) is tuple and id(v) in interp._tuple_srcs:
        for x, xs in zip(v, interp._tuple_srcs[id(v)]):
            if xs is None and depth < 4:  # (kw.items()'s pairs hold the values' sources)
                _touch_elements(interp, x, None, depth + 1)
            interp.touch(x, xs)
            interp.guards.pin(xs, x)
    elif type(v) in _DICTS and id(v) in interp._dict_srcs:
        srcs = interp.dict_srcs(v)
        for key, x in v.items():
            interp.touch(x, srcs.get(key))
            interp.guards.pin(srcs.get(key), x)
    elif s is None:
        return
    else:
        interp.touch_deep(v, s)
        if type(v) is list and s is not None and id(v) not in interp.local_objs:
            interp.outer_lists.setdefault(id(v), s)
            interp.keep.append(v)  # (its id stays its own while recording)


def _import(interp, f, name, fromlist, level):
    """`import name` / `from name import ...`: a module already loaded is read from
    sys.modules, with an identity guard, so the trace sees it as the program does; one not
    loaded yet is imported for real, which ends the trace (importing runs module code)."""
    absname = name
    if level:
        package = f.globals.get("__package__") or f.globals.get("__name__", "")
        absname = importlib.util.resolve_name("." * level + name, package)
    want = absname if fromlist else absname.partition(".")[0]
    mod = sys.modules.get(want)
    loaded = absname in sys.modules and mod is not None and \
        all(hasattr(sys.modules[absname], n) for n in (fromlist or ()) if n != "*")
    if not loaded:
        interp.abort(f"imports {absname}, which is not loaded yet")
        interp._effect(f"importing {absname}")
        return (builtins.__import__(name, f.globals, None, fromlist, level), None)
    src = interp.guards.const_source(sys.modules).item(want)
    interp.touch(mod, src)
    return (mod, src)


def _import_from(interp, mp, name):
    mod, msrc = mp
    try:
        v = getattr(mod, name)
    except AttributeError:
        full = f"{getattr(mod, '__name__', '')}.{name}"
        if full not in sys.modules:
            raise ImportError(f"cannot import name '{name}' from '{getattr(mod, '__name__', mod)}'") from None
        src = interp.guards.const_source(sys.modules).item(full)
        interp.touch(sys.modules[full], src)
        return (sys.modules[full], src)
    src = msrc.attr(name) if msrc is not None else None
    interp.touch(v, src)
    return (v, src)


def _guard_module_call(interp, m, msrc):
    """What nn.Module.__call__ of sourced module m would do differently on a later call: the
    class's forward replaced, a forward set on the instance, hooks added to it or globally."""
    if not interp.recording:
        return
    from torch.nn.modules import module as mm
    if msrc is not None:  # one guard per module call
        e, c = msrc.expr, interp.guards.const_source(type(m).forward).expr
        h = interp.guards.const_source(runs_class_forward).expr
        interp.guards.guard_state(f"_mc({e}, {c}, {h})", True,  # (guards.plain_call)
                                f"{e} runs {type(m).__qualname__}.forward, with no hooks", src=msrc)
    g = interp.guards.const_source(mm).expr
    interp.guards.guard_state(f"not ({g}._global_forward_hooks or {g}._global_forward_pre_hooks or "
                            f"{g}._global_backward_hooks)", True, "no global module hooks")


def _sourced_items(interp, v, s):
    """(elements, their sources) of iterating v, when v is a sourced ModuleList/Sequential or
    tuple (or a tuple whose elements' sources are known); None otherwise."""
    if s is not None and isinstance(v, (torch.nn.Sequential, torch.nn.ModuleList)):
        return list(v._modules.values()), list(interp._submodule_srcs(v, s).values())
    if id(v) in interp._sliced_modules and not _has_hooks(v):
        return list(v._modules.values()), interp._sliced_modules[id(v)]
    # (a list may grow while the loop runs: its items are not taken ahead of time)
    if type(v) is tuple and len(v) <= 256 and (s is not None or id(v) in interp._tuple_srcs):
        return list(v), interp._element_srcs(v, s, len(v))
    return None


def _submodule_srcs(interp, m, src):
    """Sources of an nn.Sequential/ModuleList/ModuleDict's children by name, with a guard
    on the names (iteration order and indexing depend on them)."""
    msrc = src.attr("_modules")
    names = list(m._modules)
    interp.guards.guard_state(f"list({msrc.expr})", names, f"submodules of {src.expr}")
    return {n: msrc.item(n) for n in names}


def _element_srcs(interp, v, s, n):
    if type(v) is tuple and id(v) in interp._tuple_srcs:
        return interp._tuple_srcs[id(v)]
    if s is not None and type(v) in (list, tuple, torch.Size):
        return [s.item(i) for i in range(n)]
    interp.touch_deep(v, s)
    return [None] * n


def _globals_source(interp, f):
    # A function's globals dict keeps its identity: guards read the current value from it.
    return GLOBALS if f.fn_src is FUNC else interp.guards.const_source(f.globals)


def _global_src(interp, f, name):
    return interp._globals_source(f).item(name)


def _guard_absent(interp, f, name):
    expr = f"({name!r} not in {interp._globals_source(f).expr})"
    interp.guards.guard_state(expr, True, f"no global named {name}")


def _sourced_pairs(interp, fn, args, kwargs):
    """enumerate(xs[, start]) / zip(xs, ys, ...) over sourced containers (a ModuleList's
    layers with their weights, a tuple of tensors passed in): an iterator of tuples whose
    elements keep their sources, so what is read through them stays guarded and their
    tensors are trace inputs. None where an argument's elements have no sources (the call
    is then made as any builtin's)."""
    if fn is enumerate:
        if len(args) not in (1, 2) or set(kwargs) - {"start"}:
            return None
        start = args[1] if len(args) == 2 else kwargs.get("start", (0, None))
        if type(start[0]) is not int:
            return None
        interp.touch(*start)
        parts = [interp._sourced_items(*args[0])]
    else:
        if kwargs or not args:
            return None
        parts = [interp._sourced_items(v, s) for v, s in args]
    if any(p is None for p in parts) or not any(x is not None for p in parts for x in p[1]):
        return None
    if fn is enumerate:
        rows = [((start[0] + i, x), [None, xs]) for i, (x, xs) in enumerate(zip(*parts[0]))]
    else:
        n = min(len(p[0]) for p in parts)
        rows = [(tuple(p[0][i] for p in parts), [p[1][i] for p in parts]) for i in range(n)]
    items = []
    for t, srcs in rows:
        interp._tuple_srcs[id(t)] = srcs
        interp.keep.append(t)
        items.append(t)
    return (interp._mark_local(_SourcedIter(items, [None] * len(items))), None)
