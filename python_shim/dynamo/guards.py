"""Where recorded values come from (sources) and the Python-side guards built on them.

A *source* is a path from the call's roots (the positional arguments `a`, keyword arguments
`k`, the function's globals `g`, the function object `f`) to a value: `a[1]`,
`g['scale']`, `a[0].linear.weight`, `f.__closure__[0].cell_contents`. Every value the
recording interpreter reads from a source is guarded:

  * tensors become trace inputs: the C library guards their dtype, shape, strides and
    device natively; Python only checks the type and fetches them each call;
  * None, bools, ints, floats, strings, dtypes, devices: by value and exact type (floats also
    by sign, so -0.0 is not 0.0, and a NaN matches a NaN); a float or int argument the
    interpreter keeps as a scalar input of the trace (config.dynamic) by exact type only
    (guard_scalar_type), until a use of its value guards that too;
  * tuples and lists: by type and length (elements are guarded when they are read);
  * dicts: by type and key order;
  * sets, and whole containers of plain values: by contents (`guard_contents`);
  * plain data objects (instances of an ordinary Python class, state in their __dict__, such
    as torchvision's ImageList or a dataclass made anew for every call): by class, their
    attributes guarded as they are read; by identity as well once the trace depends on which
    object it is (`is`, `==`, a dict key, passed into a builtin or torch: `pin`);
  * everything else (modules, functions, classes, other objects): by identity.

The guards of one trace are compiled into a single Python function, in the order they were
recorded, so that a guard on `a[0].training` is checked only after `a[0]` passed its own.
"""
import abc
import collections
import math
import re
import types

import torch

_BY_VALUE = (type(None), bool, int, float, str, torch.dtype, torch.device)


def structural(v):
    """Whether v is a plain data object, guarded by its class and the attributes read (see the
    module's text): an instance of a class written in Python with the plain metaclass or ABCMeta
    (an abstract base changes nothing of how its instances' attributes are read or set; no enum),
    its own __dict__, and attribute access and setting of object's own; no module,
    tensor, function or class, nothing of torch itself. (A class's own __eq__ or __hash__, such
    as a dataclass's, is allowed: comparing or hashing the object pins it.)"""
    t = type(v)
    if type(t) not in (type, abc.ABCMeta) or t.__module__ == "builtins" or t.__module__.startswith("torch.") or \
            isinstance(v, (torch.Tensor, torch.nn.Module, BaseException)):
        return False
    try:
        object.__getattribute__(v, "__dict__")
    except AttributeError:
        return False
    return (t.__getattribute__ is object.__getattribute__ and t.__setattr__ is object.__setattr__ and
            getattr(t, "__getattr__", None) is None and "__slots__" not in t.__dict__)


def structural_dict(v):
    """Whether v is a dict of a subclass written in Python whose keys and attributes read as a
    dict's and an object's do (Hugging Face's ModelOutput: its own __getitem__, __setattr__ and
    __setitem__, dict's iteration): guarded by its class and its keys, its attributes and items
    as read, so that a new one each call with the same keys is the same argument."""
    t = type(v)
    if not isinstance(v, dict) or type(t) not in (type, abc.ABCMeta) or t.__module__ == "builtins" or \
            t.__module__.startswith("torch.") or not t.__flags__ & (1 << 9):  # (a class statement's: not defaultdict)
        return False
    base = collections.OrderedDict if isinstance(v, collections.OrderedDict) else dict
    return (t.__getattribute__ in (object.__getattribute__, dict.__getattribute__) and
            getattr(t, "__getattr__", None) is None and
            t.__iter__ is base.__iter__ and t.keys is base.keys and t.items is base.items and
            t.values is base.values and t.__len__ is base.__len__ and t.__contains__ is base.__contains__)


def same_float(x, c):
    """x is the float c exactly: NaN matches NaN, and -0.0 is not 0.0 (x / s, copysign)."""
    if c != c:
        return x != x
    return x == c and math.copysign(1.0, x) == math.copysign(1.0, c)


def torch_state():
    """The global torch state a recorded trace depends on, as one comparable tuple: grad mode,
    default dtype, CPU and CUDA autocast (enabled, dtype), deterministic algorithms."""
    return (torch.is_grad_enabled(), torch.get_default_dtype(), _autocast_on("cpu"), _autocast_dtype("cpu"),
            _autocast_on("cuda"), _autocast_dtype("cuda"), _deterministic())


_autocast_on, _autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype


# torch.are_deterministic_algorithms_enabled() without its Python wrapper (torch_state() runs in
# every guard function, on every call)
_deterministic = getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled)


TORCH_STATE_TEXT = "grad mode, default dtype, autocast (cpu, cuda), deterministic algorithms"


def plain(v, depth=0):
    """v is made of plain values only (compared by value in a guard: numbers, strings, None,
    dtypes, and tuples/frozensets of them)."""
    if type(v) in _BY_VALUE:
        return True
    if type(v) in (tuple, frozenset) and depth < 4:
        return all(plain(x, depth + 1) for x in v)
    return False


def plain_call(m, forward, runs_class_forward):
    """Whether calling module m runs forward (its class's), with no hooks; _fastcall.plain_call
    is the same expression evaluated natively."""
    return type(m).forward is forward and not (('forward' in m.__dict__ and not runs_class_forward(m)) or
                                               m._forward_hooks or m._forward_pre_hooks or m._backward_hooks)


class _Helpers(dict):
    """Names the compiled guard expressions may use besides their constants. `_at` is getattr for
    the guard functions' named attribute reads: the native _fastcall.module_attr where the
    extension is built (nn.Module.__getattr__ done in C, the same results), else getattr itself;
    `_mc` is plain_call (a module call's guard), natively there too. They are looked up on first
    use, after the library the extension links is loaded (loading the extension first would map a
    second copy when DYNAMO_LIBRARY names another build)."""

    def ready(self):
        if "_at" not in self:
            at, mc = getattr, plain_call
            try:
                from . import _ext, native
                native.lib()
                fast = _ext.load("_fastcall")
                fast.set_module_getattr(torch.nn.Module.__getattr__)
                at = fast.module_attr
                mc = getattr(fast, "plain_call", plain_call)
            except Exception:  # (no extension, or no library: getattr is always right)
                pass
            self["_mc"] = mc
            self["_at"] = at
        return self


_HELPERS = _Helpers(Tensor=torch.Tensor, torch=torch, same_float=same_float, torch_state=torch_state)


class Source:
    """A path to a value; `expr` is Python source evaluated with a, k, g, f in scope."""

    __slots__ = ("expr", "base", "name")

    def __init__(self, expr, base=None, name=None):
        self.expr = expr
        self.base = base
        self.name = name  # the attribute read, for a source made by attr()

    def attr(self, name):
        return Source(f"{self.expr}.{name}" if name.isidentifier() else f"getattr({self.expr}, {name!r})", self, name)

    def item(self, key):
        return Source(f"{self.expr}[{key!r}]", self)

    def __repr__(self):
        return self.expr


ARG = Source("a")
KWARG = Source("k")
GLOBALS = Source("g")
FUNC = Source("f")
EXIT = Source("x")    # a side trace's inputs: the live values of the exit it starts from


def _replace_base(text, expr, name, count=-1):
    """text with source expression expr replaced by name where it stands whole or as the base of
    a longer one (a[0] in a[0].fc, not in a[0]x nor in ca[0]); count: at most that many."""
    out, i, done, n = [], 0, 0, len(expr)
    end_word = _word_end(expr)
    while count < 0 or done < count:
        j = text.find(expr, i)
        if j < 0:
            break
        before = text[j - 1] if j else ""
        after = text[j + n] if j + n < len(text) else ""
        if (before and (_word_char(before) or before in ".'\"]")) or (end_word and after and _word_char(after)):
            out.append(text[i:j + 1])
            i = j + 1
            continue
        out.append(text[i:j])
        out.append(name)
        i = j + n
        done += 1
    out.append(text[i:])
    return "".join(out)


def _word_char(c):
    return c.isalnum() or c == "_"


def _word_end(expr):
    """Whether expr ends in a name character (then a longer name does not contain it as a base)."""
    return _word_char(expr[-1])


def _chain(src):
    """src and its bases, innermost first."""
    out = []
    while src is not None:
        out.append(src)
        src = src.base
    return out


def _hoisted(checks, about, input_srcs):
    """The check function's body: one `if not (...): return None` per check, in order, then the
    input list. A source read by two or more of them (a[0].layer1 under 60 guards of a ResNet) is
    evaluated once into a local right before its first use, and the sources built on it are
    spelled from that local (each read of a[0].layer1 walks nn.Module.__getattr__ in Python).
    Linear in the number of checks: each check knows the source it reads (about)."""
    uses = {}
    for s in list(about) + list(input_srcs):
        for n in _chain(s):
            uses[n.expr] = uses.get(n.expr, 0) + 1
    named, lines = {}, []

    def local(src):
        """The text reading src: through the deepest named source on its chain."""
        for n in _chain(src):
            if n.expr in named:
                if n is src:
                    return named[n.expr]
                if src.expr.startswith(n.expr):  # the common case, a[0].layer1 under a[0].layer1.conv
                    rest = src.expr[len(n.expr):]
                    if not rest or not _word_end(n.expr) or not _word_char(rest[0]):
                        return named[n.expr] + rest
                return _replace_base(src.expr, n.expr, named[n.expr], 1 if src.expr.startswith(n.expr) else -1)
        return src.expr

    def name_chain(src):
        """Names (assigns a local to) each source on src's chain read twice or more, outermost first.
        An attribute read is spelled _at(base, name): getattr, with nn.Module's __getattr__ done
        natively (the submodules and parameters of a model, read on every call)."""
        for n in reversed(_chain(src)):
            if n.expr not in named and uses.get(n.expr, 0) >= 2 and not n.expr.isidentifier():
                text = local(n)
                if n.name is not None and n.base is not None and not n.name.startswith("__"):
                    text = f"_at({local(n.base)}, {n.name!r})"
                named[n.expr] = f"_s{len(named)}"
                lines.append(f"{named[n.expr]} = {text}")

    def spelled(src, text):
        if src is None:
            return text
        name_chain(src)
        for n in _chain(src):
            if n.expr in named:
                return _replace_base(text, n.expr, named[n.expr])
        return text

    for check, src in zip(checks, about):
        lines.append(f"if not ({spelled(src, check)}): return None")
    lines.append(f"return [{', '.join(spelled(s, s.expr) for s in input_srcs)}]")
    return lines


def describe_value(v):
    """A value as a guard's description words it: tensors by shape and dtype, plain values by
    repr, containers by length, other objects by class."""
    if isinstance(v, torch.Tensor):
        return f"a tensor {tuple(v.shape)} {v.dtype}"
    t = type(v)
    if t in _BY_VALUE:
        r = repr(v)
        return r if len(r) <= 60 else r[:57] + "..."
    if t in (tuple, list, torch.Size):
        return f"{t.__name__} of {len(v)}"
    if t is dict or t is collections.OrderedDict:
        return f"{t.__name__} with keys {list(v)[:8]!r}"
    return f"a {t.__qualname__} at {id(v):#x}"


_PARTS = re.compile(r"^(a\[(\d+)\]|k\[('[^']*')\]|g\[('[^']*')\])")


def readable(expr, fn=None, consts=None):
    """Guard source expr in the program's words: a[1] -> the parameter's name, k['n'] -> n,
    g['acts'] -> `acts (a global)`, a constant c14 -> what it is."""
    if expr in ("a", "k"):
        return "the positional arguments" if expr == "a" else "the keyword arguments"
    m = _PARTS.match(expr)
    rest = expr[m.end():] if m else expr
    head = expr[:m.end()] if m else ""
    if m and m.group(2) is not None:
        code = getattr(fn, "__code__", None)
        i = int(m.group(2))
        if code is not None and i < code.co_argcount:
            head = code.co_varnames[i]
        elif code is not None and code.co_flags & 0x04:  # CO_VARARGS
            head = f"{code.co_varnames[code.co_argcount + code.co_kwonlyargcount]}[{i - code.co_argcount}]"
        else:
            head = f"argument {i}"
    elif m and m.group(3) is not None:
        head = m.group(3)[1:-1]
    elif m and m.group(4) is not None:
        head = m.group(4)[1:-1]
        rest += " (a global)" if not rest else ""
    if consts:
        def name_of(c):
            obj = consts.get(c.group(0))
            if obj is None:
                return c.group(0)
            return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
        rest = re.sub(r"\bc\d+\b", name_of, rest)
        if not m:
            head, rest = "", rest
    return head + rest


def tensor_meta(t):
    """What a native entry checks of a tensor input: sizes, strides, dtype, device."""
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


class GuardSet:
    """The guards of one trace, in recording order, and the tensor inputs to fetch."""

    def __init__(self):
        self.lines = []          # (source expr, kind, description) for explain()
        self._checks = []        # Python boolean expressions
        self._consts = {}        # name -> object referenced by identity/value checks
        self._by_id = {}         # id(object) -> its name in _consts
        self._by_value = {}      # (type, repr) of a plain constant -> its name
        self._indexed = 0        # how many of _consts the two indexes cover
        self._seen = set()       # source exprs already guarded
        self._structural = {}    # source expr -> the plain data object guarded there by class only
        self._structural_at = {}  # id(such an object) -> (its first source expr, the object)
        self.tensor_inputs = []  # source exprs of tensor inputs, in trace input order
        self.tensor_meta = {}    # source expr of a guarded tensor -> tensor_meta() of the recorded one
        self._about = []         # the Source each check reads (None: none), for _hoisted
        self._input_srcs = []    # the Source of each tensor input
        self._where = {}         # const name -> the source expr an identity guard found it at
        self._fn = None
        self._code = None        # the compiled module code of _fn (kept for the trace store)
        self._binder = False     # ... which also defines the _at_<name> functions

    def _const(self, obj, at=None):
        """The name of obj among the constants: an existing one when obj is one of them, or an
        equal plain value (same type and repr; a parent trace's constants are shared); else new.
        at: the source expression obj was read from (an identity guard), kept for the store."""
        name = self._const_name(obj)
        if at is not None:
            self._where.setdefault(name, at)
        return name

    def _const_name(self, obj):
        if self._indexed != len(self._consts):  # names were added from outside (a snapshot's)
            self._by_id, self._by_value, self._indexed = {}, {}, 0
            for name, o in self._consts.items():
                self._index(name, o)
        name = self._by_id.get(id(obj))
        if name is not None and self._consts[name] is obj:
            return name
        key = (type(obj), repr(obj)) if plain(obj) else None
        if key is not None and key in self._by_value:
            return self._by_value[key]
        name = f"c{len(self._consts)}"
        self._consts[name] = obj
        self._index(name, obj)
        return name

    def _index(self, name, obj):
        self._by_id.setdefault(id(obj), name)
        if plain(obj):
            self._by_value.setdefault((type(obj), repr(obj)), name)
        self._indexed += 1

    def const_source(self, obj):
        """A source that is obj itself (held by the guards): for objects whose identity is
        fixed, such as a function's globals dict or a method's function."""
        return Source(self._const(obj))

    def guard(self, src, value):
        """Guards that src still evaluates to something equivalent to value."""
        if src is None or src.expr in self._seen:
            return
        self._seen.add(src.expr)
        e = src.expr
        t = type(value)
        if isinstance(value, torch.Tensor):
            self._add(src, f"isinstance({e}, Tensor)")
            self.lines.append((e, "tensor", f"{tuple(value.shape)} {value.dtype} (checked natively)"))
            self.tensor_meta[e] = tensor_meta(value)  # (checked in Python where a trace has no native code)
        elif t in _BY_VALUE:
            c = self._const(value)
            if value is None:
                self._add(src, f"{e} is None")
            elif t is bool:  # (True and False are the only bools: `is` says both type and value)
                self._add(src, f"{e} is {c}")
            elif t is float and (value != value or value == 0):
                self._add(src, f"type({e}) is float and same_float({e}, {c})")
            else:
                self._add(src, f"type({e}) is {self._const(t)} and {e} == {c}")
            self.lines.append((e, "value", repr(value)))
        elif t is range or (t is slice and all(x is None or type(x) is int
                                                for x in (value.start, value.stop, value.step))):
            # by value: a new range(3) or slice(0, 2) each call is the same argument
            self._add(src, f"type({e}) is {self._const(t)} and {e} == {self._const(value)}")
            self.lines.append((e, "value", repr(value)))
        elif t in (tuple, list, torch.Size):
            self._add(src, f"type({e}) is {self._const(t)} and len({e}) == {len(value)}")
            self.lines.append((e, "length", f"{t.__name__} of {len(value)}"))
        elif t is dict or t is collections.OrderedDict:
            self._add(src, f"type({e}) is {self._const(t)} and list({e}) == {self._const(list(value))}")
            self.lines.append((e, "keys", repr(list(value))))
        elif t is types.MethodType:
            # a bound method is made anew at every read: the same function on the same object
            self._add(src, f"type({e}) is {self._const(t)}")
            self.lines.append((e, "class", "a bound method (its function and object guarded)"))
            self.guard(Source(f"{e}.__func__", src), value.__func__)
            self.guard(Source(f"{e}.__self__", src), value.__self__)
            return
        elif structural(value):
            self._add(src, f"type({e}) is {self._const(t)}")
            self.lines.append((e, "class", f"a {t.__qualname__} (its attributes guarded as read)"))
            self._structural[e] = value
            self._structural_at.setdefault(id(value), (e, value))
        elif structural_dict(value):
            self._add(src, f"type({e}) is {self._const(t)} and list({e}) == {self._const(list(value))}")
            self.lines.append((e, "class", f"a {t.__qualname__} with keys {list(value)!r} (its attributes and "
                                           "items guarded as read)"))
            self._structural[e] = value
            self._structural_at.setdefault(id(value), (e, value))
        else:
            self._add(src, f"{e} is {self._const(value, at=e)}")
            self.lines.append((e, "identity", f"{t.__name__} at {id(value):#x}"))
        self._fn = None

    def guard_scalar_type(self, src, value):
        """src holds a Python float or int the trace takes as a scalar input (its value is read
        each call, not guarded): only its exact type is checked. A later guard(src, ...) still
        adds the value guard (for a use that depends on the value itself)."""
        key = ("type", src.expr)
        if key in self._seen or src.expr in self._seen:
            return
        self._seen.add(key)
        t = type(value)
        self._add(src, f"type({src.expr}) is {self._const(t)}")
        self.lines.append((src.expr, "type", f"{t.__name__}, passed to the trace each call (value not guarded)"))
        self._fn = None

    def value_guarded(self, src):
        """Whether src's value is guarded (guard() ran for it)."""
        return src.expr in self._seen

    def pin(self, src, value):
        """The trace depends on which object src holds (identity compared, hashed, handed to a
        builtin or torch): a plain data object guarded by class only gets an identity guard too."""
        if src is None or self._structural.get(src.expr) is not value:
            # (its source dropped on the way: a list or dict of the call's held it) the source it
            # was guarded at, where it is that very object
            at = self._structural_at.get(id(value))
            if at is None or at[1] is not value:
                return
            src = Source(at[0])
        if ("pin", src.expr) in self._seen:
            return
        self._seen.add(("pin", src.expr))
        e = src.expr
        self._add(src, f"{e} is {self._const(value, at=e)}")
        self.lines.append((e, "identity", f"{type(value).__name__} at {id(value):#x}"))
        self._fn = None

    def guard_contents(self, src, value):
        """Guards that src holds a container equal to value, element by element (a set, or a
        list/tuple/dict too large to guard one element at a time); value must be plain() inside."""
        if src is None or ("contents", src.expr) in self._seen:
            return
        self._seen.add(("contents", src.expr))
        e, t = src.expr, type(value)
        frozen = {set: frozenset, frozenset: frozenset, list: tuple, tuple: tuple}.get(t)
        if frozen is not None:
            snap = frozen(value)
            conv = "frozenset" if frozen is frozenset else "tuple"
            self._add(src, f"type({e}) is {self._const(t)} and {conv}({e}) == {self._const(snap)}")
        else:  # dict
            snap = tuple(value.items())
            self._add(src, f"type({e}) is {self._const(t)} and tuple({e}.items()) == {self._const(snap)}")
        self.lines.append((e, "contents", f"{t.__name__} of {len(value)} plain values"))
        self._fn = None

    def guard_distinct(self):
        """The plain data objects guarded by class only (structural) stand in the same relation
        as in the recorded call: those that were one object are one (`is`), and the others are
        distinct objects. A trace that sets attributes on them (write-backs) relies on it: a read
        of b.x after a.x was set is a read of what the call set only where a is b."""
        if len(self._structural) < 2:
            return
        groups = {}
        for e, v in self._structural.items():
            groups.setdefault(id(v), []).append(e)
        for exprs in groups.values():
            for e in exprs[1:]:
                self.guard_state(f"{e} is {exprs[0]}", True, f"{e} is the same object as {exprs[0]}")
        reps = [exprs[0] for exprs in groups.values()]
        if len(reps) > 1:
            ids = ", ".join(f"id({e})" for e in reps)
            self.guard_state(f"len({{{ids}}})", len(reps), f"{len(reps)} distinct objects at {', '.join(reps)}")

    def getter(self, exprs):
        """A function (a, k, g, f, x=None) -> the tuple of values at source expressions exprs,
        read as the guard function reads them (its constants and helpers in scope)."""
        code = "def get(a, k, g, f, x=None):\n    return (" + "".join(e + ", " for e in exprs) + ")\n"
        env = dict(self._consts, **_HELPERS.ready())
        exec(compile(code, "<dynamo sources>", "exec"), env)  # noqa: S102 -- source expressions dynamo wrote
        return env["get"]

    def guard_state(self, expr, value, what, src=None):
        """A guard that expression expr still evaluates to value (torch state, a method lookup,
        an absence); src: the source it reads, when it reads one (its local is reused)."""
        if expr in self._seen:
            return
        self._seen.add(expr)
        self._add(src, f"({expr}) == {self._const(value)}")
        self.lines.append((expr, "state", f"{what} == {value!r}"))
        self._fn = None

    def _add(self, src, check):
        """Appends a check; src: the Source it is about (or None)."""
        self._checks.append(check)
        self._about.append(src)

    def add_tensor_input(self, src):
        """The next trace input is fetched from src each call (a tensor, or a scalar input)."""
        self.tensor_inputs.append(src.expr)
        self._input_srcs.append(src)
        self._fn = None

    def compile(self, binder=False):
        """Returns check(a, k, g, f, x=None) -> list of input tensors, or None when a guard fails
        (x: the live values of the side exit a side trace starts from). binder: the same code
        also defines _at_<name>() for each constant an identity guard found, returning the
        source it was found at (the trace store binds constants with them in a new process)."""
        if self._fn is None:
            body = ["def check(a, k, g, f, x=None):", "    try:"]
            body += ["        " + line for line in _hoisted(self._checks, self._about, self._input_srcs)]
            body.append("    except Exception:")
            body.append("        return None")
            if binder:
                for name, expr in self._where.items():
                    body.append(f"def _at_{name}():")
                    body.append(f"    return {expr}")
            self._code = compile("\n".join(body), "<dynamo guards>", "exec")
            self._binder = binder
            env = dict(self._consts, **_HELPERS.ready())
            exec(self._code, env)
            self._fn = env["check"]
        return self._fn

    def export(self):
        """What a later process needs to rebuild these guards (see store.py): the checks, the
        constants (objects, with the source each identity guard found them at) and the compiled
        code (check and the binder). None unless compiled with binder=True."""
        if self._fn is None or not self._binder:
            return None
        return dict(checks=list(self._checks), lines=list(self.lines), consts=dict(self._consts),
                    where=dict(self._where), code=self._code, tensor_inputs=list(self.tensor_inputs))

    @classmethod
    def restore(cls, exported, consts, env, texts):
        """Guards rebuilt from export() whose code ran in env and whose constants were bound
        anew there (store.bind); only for checking and explaining (no guards are added). texts()
        gives (checks, lines), read on first use: explain and logs need them, calls do not."""
        gs = StoredGuards()
        del gs._checks, gs.lines, gs._about, gs._seen
        gs._texts = texts
        gs._consts = dict(consts)
        gs.tensor_inputs = list(exported["tensor_inputs"])
        gs._fn = env["check"]
        return gs

    def failure(self, a, k, g, f, x=None):
        """(source expr, what it should be, what it is, the value found) of the first guard that
        rejects these arguments, or None: what `explain_failure` words."""
        env = dict(self._consts, **_HELPERS.ready(), a=a, k=k, g=g, f=f, x=x)
        for c, src in zip(self._checks, self._about):
            try:
                ok = eval(c, env)  # noqa: S307 -- our own guard expressions
            except Exception:  # noqa: BLE001 -- a guard that raises also rejects
                ok = False
            if ok:
                continue
            if src is None:
                return (None, c, None, None)
            want = next((desc for e, kind, desc in reversed(self.lines) if e == src.expr), c)  # (the last
            #                                   says most: a scalar's value guard comes after its type's)
            value = None
            try:
                value = eval(src.expr, env)  # noqa: S307
                found = describe_value(value)
            except Exception as e:  # noqa: BLE001 -- the path itself is gone
                found = f"nothing ({type(e).__name__}: {e})"
            return (src.expr, want, found, value)
        return None

    def explain_failure(self, a, k, g, f, x=None):
        """The first guard that rejects these arguments in the program's words -- `acts (a
        global): expected list of 5, found list of 6`, `n_iter: expected 2, found 3` -- or None."""
        got = self.failure(a, k, g, f, x)
        if got is None:
            return None
        expr, want, found, _ = got
        if expr is None:
            return f"the check {want} fails"
        return f"{readable(expr, f, self._consts)}: expected {want}, found {found}"

    def first_failure(self, a, k, g, f, x=None):
        """The first guard that rejects these arguments (for logs), or None."""
        env = dict(self._consts, **_HELPERS.ready(), a=a, k=k, g=g, f=f, x=x)
        for c in self._checks:
            try:
                if not eval(c, env):  # noqa: S307 -- our own guard expressions
                    return c
            except Exception as e:  # noqa: BLE001 -- a guard that raises also rejects
                return f"{c} (raised {type(e).__name__})"
        return None

    def source_text(self):
        return "\n".join(f"{e}: {kind} {desc}" for e, kind, desc in self.lines)


class StoredGuards(GuardSet):
    """Guards of a trace from the store (GuardSet.restore): the texts of the checks and their
    descriptions are read from the store the first time something asks for them."""

    def __getattr__(self, name):  # only for attributes not set: the texts, once
        if name in ("_checks", "lines", "_about", "_seen") and "_texts" in self.__dict__:
            checks, lines = self.__dict__.pop("_texts")()
            self._checks, self.lines = list(checks), [tuple(x) for x in lines]
            self._about = [None] * len(self._checks)
            self._seen = {e for e, _, _ in self.lines}
            return getattr(self, name)
        raise AttributeError(name)
