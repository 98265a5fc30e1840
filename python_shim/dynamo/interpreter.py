"""The recording interpreter: runs CPython bytecode on real values, with provenance (3.11, 3.12
and 3.13: bytecode.py decodes each version into the one vocabulary the handlers are written for).

Each value on the interpreter's stack and in its locals is a pair (value, source): the real
Python object, and where it was read from (guards.Source) or None for values computed during
the call. Reading a sourced value installs its guard (guards.GuardSet.guard); tensors read
from sources become trace inputs. Tensor work is recorded one level down, at ATen, by the
Recorder (a TorchDispatchMode), so the trace holds exactly the ops eager runs.

Python callees are inlined: functions, bound methods, closures, comprehensions,
`nn.Module.__call__` (when the module has no hooks) and its `forward`. Calls into torch run
for real with recording on. Pure builtins run for real. Anything else -- I/O, `print`, a
`dynamo.disable`d helper, unknown C code, a store into an object from outside the call -- also
runs for real (the call must still be right): as a stitch between two traces where the state
can be carried, else it ends the trace (`abort_reason` and its kind say why).

Each bytecode has one handler method, `_op_<NAME>` marked `@_handles(...)`, collected in
`_HANDLERS`; the bytecodes they handle (and the few skipped) are the supported set, which code
is checked against before it is run (`_Code`).

The interpreter always finishes the call: an aborted recording keeps executing concretely
with recording paused, so no effect is performed twice.
"""
import abc
import builtins
import collections
import contextlib
import functools
import gc
import importlib.util
import inspect
import math
import operator
import re
import sys
import types
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode, _pop_mode_temporarily

from . import bytecode, config, cuts, snapshot, sources
from .cuts import _COMPARE
from .sources import _DICTS, _has_hooks, runs_class_forward
from .frames import CO_GENERATOR, NULL as _NULL, Abort, DataDependentStep, NopythonError, StitchNow  # noqa: F401
from .frames import NoSnapshot, ProbeStop, SourcedIter as _SourcedIter, is_torch_callable as _is_torch_callable
from .frames import ItemRead, plain_class as _plain_class
from .guards import _BY_VALUE, ARG, FUNC, GLOBALS, KWARG, GuardSet, Source, plain
from .recorder import Recorder
from .sizeflow import SizeFlow

# tensors a Python number meets in + - * / as a scalar input (a size probe's are fakes, probe.py)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter, FakeTensor)

CO_VARARGS, CO_VARKEYWORDS = 0x04, 0x08
CO_GENERATOR_LIKE = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen

_BINARY = [operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul, operator.mul,
           operator.mod, operator.or_, operator.pow, operator.rshift, operator.sub, operator.truediv,
           operator.xor, operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
           operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift, operator.isub,
           operator.itruediv, operator.ixor]

# + - * / (and += ...) between a tensor and the number: exactly one ATen op with it as an operand
_SCALAR_OPS = {0, 5, 10, 11, 13, 18, 23, 24}
# bytecodes that move or drop stack values without reading them
# Bytecodes that only move a deferred number read (frames.ItemRead) or compare it (COMPARE_OP,
# which decides itself): any other settles it first (cuts._settle_items).
_ITEM_MOVES = {"LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL", "NOP", "RESUME",
               "PRECALL", "EXTENDED_ARG", "KW_NAMES", "STORE_FAST", "POP_TOP", "COPY", "SWAP", "JUMP_FORWARD",
               "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "CACHE", "COMPARE_OP"}
_UNHANDLED = object()  # Interpreter.call's handlers: not this kind of callable

_SCALAR_MOVES = {"LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL", "NOP",
                 "RESUME", "PRECALL", "EXTENDED_ARG", "KW_NAMES", "STORE_FAST", "POP_TOP", "COPY", "SWAP",
                 "BINARY_OP", "CALL", "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "CACHE"}

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
# Bytecodes that may run torch operations (their start is where an op of data-dependent output
# size resumes).
_MAY_CALL_TORCH = {"CALL", "CALL_KW", "CALL_FUNCTION_EX", "BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP", "UNARY_NEGATIVE",
                   "UNARY_INVERT", "CONTAINS_OP"}
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


def _stable_key(k):
    """Whether k hashes and compares the same on every call: a class, a string, a number."""
    return isinstance(k, type) or type(k) in (str, int, bool, type(None))


# Methods of containers that do not change them.
_READ_METHODS = {"get", "keys", "values", "items", "index", "count", "copy", "__getitem__", "__len__",
                 "__contains__", "format", "join", "split", "strip", "startswith", "endswith", "lower", "upper",
                 "replace"}

# The bytecodes the interpreter runs: those of its _op_ handlers (_HANDLERS, after the class) and
# the ones it skips; generators (genexprs, `yield`, `yield from` driven by next()); try/except/finally
# and with blocks through the exception table; imports of modules already loaded.
_SKIPPED = frozenset(("NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "CACHE"))

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
MAX_STEPS = 200_000


# what a handler that only restores locals before re-raising runs (Code.catches_at)
_CLEANUP_OPS = frozenset(("SWAP", "POP_TOP", "STORE_FAST", "NOP"))


# ... and a generator's PEP 479 handler (3.12+): closing the generator runs neither
_CLOSE_RUNS_NOTHING = _CLEANUP_OPS | {"CALL_INTRINSIC_1"}


class _Code:
    """Decoded instructions of a code object, cached."""

    __slots__ = ("insts", "index", "unsupported", "names", "handlers")
    _cache = {}

    def __init__(self, code):
        self.insts = bytecode.decode(code)
        self.index = {ins.offset: k for k, ins in enumerate(self.insts)}
        bad = sorted({i.opname for i in self.insts} - _SUPPORTED)
        self.unsupported = None
        if code.co_flags & CO_GENERATOR_LIKE & ~CO_GENERATOR:
            self.unsupported = "coroutines"
        elif bad:
            self.unsupported = "bytecode " + ", ".join(bad)
        self.names = list(code.co_varnames) + [c for c in code.co_cellvars if c not in code.co_varnames] + \
            list(code.co_freevars)
        # (start, end, target, depth, lasti) per protected range, byte offsets, end exclusive
        self.handlers = bytecode.exception_table(code)

    def handler_at(self, offset):
        """The exception-table entry covering bytecode offset (the innermost: the table lists
        nested ranges first), or None."""
        for h in self.handlers:
            if h[0] <= offset < h[1]:
                return h
        return None

    def catches_at(self, offset, depth=0, cleanup=None):
        """Whether an exception at offset can be caught in this frame: a handler covers it that
        does more than put locals back and re-raise (3.12's inlined comprehensions restore their
        loop variable so; the exception still leaves the frame)."""
        h = self.handler_at(offset)
        if h is None:
            return False
        k = self.index[h[2]]
        while k < len(self.insts) and self.insts[k].opname in (cleanup or _CLEANUP_OPS):
            k += 1
        if depth > 8 or k >= len(self.insts) or self.insts[k].opname != "RERAISE":
            return True
        return self.catches_at(self.insts[k].offset, depth + 1, cleanup)

    @classmethod
    def of(cls, code):
        c = cls._cache.get(code)
        if c is None:
            c = cls._cache[code] = cls(code)
        return c


def unsupported_reason(code, top=False):
    """Why code cannot be interpreted (None: it can). top: it is the compiled function itself,
    whose generator would run after the call returns, outside any recording."""
    if top and code.co_flags & CO_GENERATOR:
        return "a generator function (its body runs when the caller iterates, after the call)"
    return _Code.of(code).unsupported


_FROM_DATA = {torch.tensor, torch.as_tensor}


# Tensor methods that read sizes as Python numbers (x.shape is an attribute: load_attr)
_SIZE_METHODS = frozenset(("size", "numel", "nelement", "stride", "storage_offset", "__len__"))


def _reads_size(fn, args):
    """Whether calling fn on args reads a tensor's size as Python numbers."""
    if isinstance(getattr(fn, "__self__", None), torch.Tensor):
        return getattr(fn, "__name__", None) in _SIZE_METHODS
    if (fn is len or fn is torch.numel) and args:
        return isinstance(args[0][0], torch.Tensor)
    return False


# Sequences torch.tensor(data) reads element by element. A torch.Size (x.shape[-2:]) is a
# trace's static shape: as data it is a tuple of the same ints.
_SEQUENCES = (list, tuple, torch.Size)


def _numbers(v, depth=0):
    """v is a number or bool, or a (nested) list/tuple/torch.Size of them."""
    if type(v) in (int, float, bool):
        return True
    return type(v) in _SEQUENCES and depth < 8 and all(_numbers(x, depth + 1) for x in v)


def _freeze(v):
    """v with its lists and sizes made tuples (a constant the guards may hold: it cannot change)."""
    return tuple(_freeze(x) for x in v) if type(v) in _SEQUENCES else v


def _bucket_bytes(config):
    """config.ddp_bucket_mb in bytes when torch.distributed runs with more than one rank, else 0."""
    try:
        import torch.distributed as dist
        if not config.ddp_bucket_mb or not dist.is_available() or not dist.is_initialized() or \
                dist.get_world_size() < 2:
            return 0
    except Exception:  # noqa: BLE001 -- a torch without distributed support: nothing to split for
        return 0
    return int(config.ddp_bucket_mb * 2 ** 20)


def _note_program_frame(e, f):
    """Keeps on exception e the program's place in frame f as e leaves it (innermost first):
    the traceback of an exception raised in code this interpreter ran has only dynamo's frames,
    and the front end shows these instead (frontend.program_frames)."""
    ins = f.dec.insts[f.ip - 1]
    line = ins.positions.lineno if getattr(ins, "positions", None) else None
    try:
        e.__dict__.setdefault("_dynamo_program_frames", []).append((f.code.co_filename, line, f.code.co_name))
    except (AttributeError, TypeError):  # (an exception without a __dict__: its place is not kept)
        pass


def _missing_message(qual, kind, missing):
    """CPython's message for missing arguments: 'a'; 'a' and 'b'; 'a', 'b', and 'c'."""
    quoted = [f"'{m}'" for m in missing]
    listed = quoted[0] if len(quoted) == 1 else " and ".join(quoted) if len(quoted) == 2 else \
        ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    return f"{qual}() missing {len(missing)} required {kind} argument{'s' if len(missing) != 1 else ''}: {listed}"


class _Frame:
    __slots__ = ("code", "fn", "fn_src", "globals", "locals", "stack", "ip", "kw_names", "dec", "init", "thrown")

    def __init__(self, code, fn, fn_src, glb):
        self.code = code
        self.fn = fn
        self.fn_src = fn_src
        self.globals = glb
        self.dec = _Code.of(code)
        self.locals = [(_NULL, None)] * len(self.dec.names)
        self.stack = []
        self.ip = 0
        self.kw_names = ()
        self.init = False  # an __init__ run by cls(...): its caller gets the new object, not its return
        self.thrown = None  # an exception thrown into the suspended generator frame (throw(), close())


def _handles(*opnames):
    """Marks an Interpreter method as the handler of these bytecodes (collected in _HANDLERS)."""
    def mark(fn):
        fn.opnames = opnames
        return fn
    return mark


class Interpreter:
    def __init__(self, recorder, guards):
        self.rec = recorder
        self.guards = guards
        recorder.on_abort = self._note_abort
        self.local_objs = set()   # ids of containers/objects created during the call
        self.keep = []
        self.tensor_src = {}      # id(tensor) -> source expr it was registered under
        self.input_objs = {}      # id(tensor) -> the input tensor itself (snapshots find views of inputs)
        self._module_tensors = {}  # id(tensor) -> modules' registered buffers read (weight inputs)
        self.steps = 0
        self.handled_exc = None   # the exception being handled (CPython's exc_info), for bare raise
        self._exc_seen = {}       # id -> the program's exceptions met so far (each chained once, where raised)
        self.generators = weakref.WeakSet()  # the call's generators (_Generator): closed when dropped, as CPython's
        self.grad_at_start = torch.is_grad_enabled()  # `with torch.no_grad():` inside changes it for a while
        self.run_args = ()        # the call's positional arguments (run)
        self.depth = 0
        self.inlined = []         # qualified names of inlined callees, for explain()
        self._tuple_srcs = {}     # id(tuple) -> element sources (*args, tuples built from sourced values)
        self._dict_srcs = {}      # id(dict) -> value sources (**kwargs)
        self._partial_srcs = {}   # id(partial made in the call) -> (func source, arg sources, keyword sources)
        self._list_srcs = {}      # id(list being built by BUILD_LIST / LIST_EXTEND) -> element sources (f(x, *args))
        self._sliced_modules = {}  # id(ModuleList/Sequential sliced in the call) -> its modules' sources
        self._cell_src = {}       # id(cell) -> source of its contents
        self.outer_lists = {}     # id(list from outside the call handed to a builtin) -> its Source
        #                           (a snapshot makes an iterator over it again over this call's list)
        self.outer_cells = {}     # id(cell) -> source of the cell: closure cells from outside the call
        self.frames = []          # the live frames, outermost first (snapshots at side exits)
        self.deferred_reads = 0   # pairs holding a frames.ItemRead (numbers whose exit is not made yet)
        self.effect = None        # the first effect outside the call (it cannot be run again after it)
        self.nopython = False     # the function's name under nopython=True: an abort raises NopythonError
        from . import config
        self.max_ops = config.max_trace_ops
        self._start = None        # (frame, ip, stack copy, kw_names, mutated) at the current bytecode's start
        recorder.snapshot_here = self._snapshot_at_start
        self.scalars = {}         # source expr -> (value, Source): numbers tracked as scalar inputs, unguarded
        self._moved = set()       # ids of stack pairs a call bound to an inlined frame's parameters
        self.dynamic_scalars = config.dynamic is not False
        self.sizes = SizeFlow(self)  # sizes read in Python (sizeflow.py)
        self.value_cuts = False   # end the trace at a read of a tensor's value whenever grad is on
        self.param_bytes = 0      # bytes of the parameters requiring grad this trace takes (ddp_bucket_mb)
        self.bucket_bytes = _bucket_bytes(config)
        self.probe = None         # a size probe (probe.py): {value name: shape} of its base run
        recorder.on_scalar_input = lambda expr: self.guards.add_tensor_input(self.scalars[expr][1])

    # -- recording state -----------------------------------------------------------------
    @property
    def recording(self):
        return self.rec.abort_reason is None and self.rec.cut is None

    def abort(self, reason, kind="python"):
        """Ends the recording (the call goes on, unrecorded); kind: the row in reasons.KINDS."""
        if not self.recording:  # aborted already, or the trace ended at a cut or stitch
            return
        if self.probe is not None:
            raise ProbeStop(reason)
        if self.nopython and self.rec.abort_reason is None:  # raise before the step is run
            at = f" at {snapshot.where(self.frames[-1], full=True)}" if self.frames else ""
            raise NopythonError(f"dynamo.optimize(nopython=True): cannot compile {self.nopython}{at}: {reason}")
        self.rec.abort(reason, kind)

    def _note_abort(self):
        """Where the recording aborted: the bytecode, and the first argument of every inlined
        frame below the root (the modules whose forwards were running: a part of an optimized
        module that the abort happened in is compiled apart, see backoff.Policy.aborted)."""
        if self.frames:
            self.rec.abort_where = snapshot.where(self.frames[-1])
        self.rec.abort_selves = [f.locals[0][0] for f in self.frames[1:] if f.locals]

    # sources.py: reading sourced values, attributes, globals and imports, elements' sources
    touch = sources.touch
    touch_input = sources.touch_input
    touch_deep = sources.touch_deep
    _item_src = sources._item_src
    load_attr = sources.load_attr
    _plain_method = sources._plain_method
    _getattr_builtin = sources._getattr_builtin
    _touch_elements = sources._touch_elements
    _import = sources._import
    _import_from = sources._import_from
    _guard_module_call = sources._guard_module_call
    _sourced_items = sources._sourced_items
    _submodule_srcs = sources._submodule_srcs
    _element_srcs = sources._element_srcs
    _globals_source = sources._globals_source
    _global_src = sources._global_src
    _guard_absent = sources._guard_absent
    _sourced_pairs = sources._sourced_pairs


    def settle_scalar(self, pair):
        """pair's number is used in a way that depends on its value: guard the value (it stays a
        scalar input of the trace if it is one already)."""
        src = pair[1]
        if src is not None and src.expr in self.scalars and self.recording:
            v, s = self.scalars.pop(src.expr)
            try:
                self.guards.guard(s, v)
            except Abort as e:
                self.abort(str(e), e.kind)

    def _settle_stack(self, f, op):
        """Before bytecode op runs in frame f: the tracked numbers it may read get guarded."""
        if op in _SCALAR_MOVES:
            return
        stack = f.stack
        if op in ("LOAD_ATTR", "LOAD_METHOD"):
            if stack:
                self.settle_scalar(stack[-1])
            return
        for p in stack:
            if p[1] is not None and p[1].expr in self.scalars:
                self.settle_scalar(p)

    def _scalar_operand(self, a, b, arg):
        """For BINARY_OP arg on pairs a, b: the pair holding a tracked number when the other
        operand is a plain tensor and the op one of _SCALAR_OPS, else None."""
        if arg not in _SCALAR_OPS:
            return None
        for n, t in ((a, b), (b, a)):
            if n[1] is not None and n[1].expr in self.scalars and type(t[0]) in _PLAIN_TENSORS \
                    and not (t[1] is not None and t[1].expr in self.scalars):
                return n
        return None


    def _effect(self, what):
        if self.probe is not None:
            raise ProbeStop(what)
        if self.effect is None:
            self.effect = what

    def _mark_local(self, obj):
        self.local_objs.add(id(obj))
        self.keep.append(obj)
        return obj

    # -- entry ---------------------------------------------------------------------------
    def run(self, fn, args, kwargs):
        """Runs fn(*args, **kwargs) (fn a Python function) and returns its real result."""
        self.run_args = args
        a = [(v, ARG.item(i)) for i, v in enumerate(args)]
        self.touch(tuple(args), ARG)  # how many: g(x) and g(x, 3.0) bind parameters differently
        self.touch(kwargs, KWARG)
        k = {name: (v, KWARG.item(name)) for name, v in kwargs.items()}
        return self.finish(self.call_function(fn, FUNC, a, k)[0])

    def finish(self, r):
        """The call's result r as the caller gets it, once the call's frames have returned (from
        run, or from snapshot.resume after an exit or a stitch): a generator made in the call
        handed back as a real one; those the call dropped suspended in a block closed."""
        if _holds_generator(r):
            self.abort("returns a generator made in the call (its body would run outside the trace)", "result")
            r = _realize(r)  # the caller gets real generators, which run the rest lazily
        else:
            self._close_dropped_generators()
        return r

    def _close_dropped_generators(self):
        """The call's generators left suspended inside a try or with block: CPython closes each
        when the call drops it (its locals go at return), so its finally and __exit__ run then;
        here too, within the trace, before the call returns. (An exception there is ignored, as
        CPython ignores one raised while a generator is collected.)"""
        for g in list(self.generators):
            if g.real is None and g.started and not g.done and _suspended_in_block(g.frame):
                try:
                    g.close()
                except Exception:  # noqa: BLE001 -- see above
                    pass

    def call_function(self, fn, fn_src, args, kwargs, self_pair=None, init=False):
        code = fn.__code__
        f = _Frame(code, fn, fn_src, fn.__globals__)
        f.init = init
        if self_pair is not None:
            args = [self_pair] + list(args)
        self._bind(f, fn, fn_src, args, kwargs)
        if fn.__closure__:
            f.locals = list(f.locals)
        if code.co_flags & CO_GENERATOR:  # runs when iterated, as CPython's generator does
            g = _Generator(self, f)
            self.generators.add(g)
            self.local_objs.add(id(g))  # (not kept: dropping its last reference closes it, see _Generator.__del__)
            return (g, None)
        return self._run_frame(f)

    def _run_frame(self, f):
        """Runs (or resumes) frame f until it returns or yields (a _Yielded)."""
        self.depth += 1
        self.frames.append(f)
        try:
            return self._execute(f)
        finally:
            self.frames.pop()
            self.depth -= 1

    def _bind(self, f, fn, fn_src, args, kwargs):
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
            self._mark_local(t)
            loc[pos] = (t, None)
            self._tuple_srcs[id(t)] = [s for _, s in extra]
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
            self._mark_local(d)
            self._dict_srcs[id(d)] = {name: s for name, (_, s) in kw.items()}
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
        if self.scalars:
            for p in loc:
                if p[1] is not None and p[1].expr in self.scalars:
                    self._moved.add(id(p))
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

    # -- calls ---------------------------------------------------------------------------
    def call(self, fnp, args, kwargs):
        """Calls fnp[0] with (value, source) pairs; returns a pair. Each kind of callable has a
        handler, tried in this order; one that does not take the call returns _UNHANDLED, and
        what none takes runs unrecorded (_opaque)."""
        fn = fnp[0]
        if self.sizes.size_read is None and self.frames and _reads_size(fn, args):
            self.sizes.note_read("len" if fn is len else getattr(fn, "__name__", "size"))
        for handler in (self._call_reading_state, self._call_python_code, self._call_introspection,
                        self._call_torch, self._call_builtin, self._call_object):
            r = handler(fnp, args, kwargs)
            if r is not _UNHANDLED:
                return r
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        return self._opaque(fnp, args, kwargs, f"call to {name} is not traceable")

    def _call_reading_state(self, fnp, args, kwargs):
        """Reads of a tensor's value or contents, grad mode set, torch's global setters, weak
        references, reads of the dispatch-mode stack."""
        fn, fsrc = fnp
        # t.item(), int(t), float(t), bool(t) on a recorded one-element tensor: a guarded value
        if not kwargs and self.recording and self.frames:
            t = conv = None
            if not args and getattr(fn, "__name__", None) == "item" and isinstance(getattr(fn, "__self__", None),
                                                                                   torch.Tensor):
                t, conv = fn.__self__, "item"
            elif fn in (int, float, bool) and len(args) == 1 and isinstance(args[0][0], torch.Tensor):
                t, conv = args[0][0], fn.__name__
            if t is not None and self.rec.known(t) and t.numel() == 1:
                return self._tensor_value(t, conv)
        if isinstance(getattr(fn, "__self__", None), torch.Tensor) and \
                getattr(fn, "__name__", None) in _READS_CONTENTS:
            # these read the data without an ATen op the recorder could see
            return self._opaque(fnp, args, kwargs, f"data-dependent value: Tensor.{fn.__name__}() reads a "
                                                   f"tensor's contents")
        if fn is torch._C._set_grad_enabled and len(args) == 1 and not kwargs and type(args[0][0]) is bool:
            # grad mode set inside the call (torch.no_grad(), set_grad_enabled): the ATen ops are
            # the same either way; no snapshot is taken while it differs from the trace's start,
            # and a trace must end with it as it started (frontend)
            self._touch_elements(*args[0])
            fn(args[0][0])
            return (None, None)
        if fn in _AUTOCAST_SETTERS and not kwargs and all(type(v) in _BY_VALUE for v, _ in args) and self.recording:
            # `with torch.autocast(..., enabled=False)` where autocast is off already (LLaMA's rotary
            # embedding): a setter given the value torch has is nothing to do, the value guarded
            getter, get_args, v = _AUTOCAST_SETTERS[fn], [a for a, _ in args[:-1]], args[-1][0]
            if getter(*get_args) == v:
                expr = f"{self.guards.const_source(getter).expr}({', '.join(self.guards.const_source(a).expr for a in get_args)})"
                self.guards.guard_state(expr, v, f"{getter.__name__}({', '.join(map(repr, get_args))})")
                return (None, None)
        if _is_torch_callable(fn) and _GLOBAL_SETTER.match(getattr(fn, "__name__", "") or ""):
            return self._opaque(fnp, args, kwargs, f"torch.{fn.__name__}() changes torch's global state")
        if type(fn) is weakref.ReferenceType and not args and not kwargs:  # ref(): its referent, by source
            r = fn()
            if fsrc is None:
                return (r, None)
            src = Source(f"{fsrc.expr}()", fsrc)
            self.touch(r, src)
            return (r, src)
        if fn in _MODE_READERS and self.recording:
            return self._mode_read(fn, args, kwargs)
        return _UNHANDLED

    def _call_python_code(self, fnp, args, kwargs):
        """Python functions and methods (inlined), and modules whose class forward runs."""
        fn, fsrc = fnp
        if isinstance(fn, types.FunctionType):
            if fn.__code__ in _CONTROL_FLOW:
                return self._opaque(fnp, args, kwargs, f"torch's control-flow operator {fn.__name__} is not recorded "
                                                       "(it runs as in eager)")
            if fn.__code__ in _RUN_WHOLE or fn in _PURE_BUILTINS:
                return _UNHANDLED  # run for real: recorded at ATen (_call_torch), or pure (_call_builtin)
            return self._call_python(fn, fsrc, args, kwargs, None)
        if isinstance(fn, types.MethodType) and type(fn.__self__) is _Generator:
            return self._concrete(fn, args, kwargs)  # g.send / throw / close: they run g's frame here
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            return self._call_python(fn.__func__, None, args, kwargs, (fn.__self__, _self_source(fn, fsrc)))
        if isinstance(fn, torch.nn.Module):
            if _has_hooks(fn):
                return self._opaque(fnp, args, kwargs, "module with hooks")
            fwd = type(fn).forward
            if self.bucket_bytes and self.param_bytes >= self.bucket_bytes and self.recording and \
                    torch.is_grad_enabled():
                self._bucket_cut()  # (the call then runs on unrecorded, as after any cut)
            if isinstance(fwd, types.FunctionType) and runs_class_forward(fn):
                self._guard_module_call(fn, fsrc)
                return self._call_python(fwd, None, args, kwargs, (fn, fsrc))
        return _UNHANDLED

    def _call_introspection(self, fnp, args, kwargs):
        """type(x), getattr/hasattr, next() of an outside iterator; isinstance's class guard
        (the call itself is a pure builtin's, below)."""
        fn = fnp[0]
        if (fn is type or fn is isinstance) and args and isinstance(args[0][0], _Generator):
            # a generator the interpreter runs is a generator to the program
            if fn is type:
                return (types.GeneratorType, None) if len(args) == 1 and not kwargs else _UNHANDLED
            return self._concrete(fn, [(_GENERATOR_LIKE, None)] + list(args[1:]), kwargs)
        if fn is type and len(args) == 1 and not kwargs and args[0][1] is not None:
            v, vsrc = args[0]  # type(k).s reads through the class: guard which class it is
            src = Source(f"type({vsrc.expr})", vsrc)
            self.touch(type(v), src)
            return (type(v), src)
        if fn in (getattr, hasattr) and not kwargs and len(args) in (2, 3) and type(args[1][0]) is str and \
                (fn is getattr or len(args) == 2):
            return self._getattr_builtin(fn, args)
        if fn is next and args and id(args[0][0]) not in self.local_objs:
            return self._opaque(fnp, args, kwargs, "next() advances an iterator from outside the function "
                                                   "(its position cannot be guarded)")
        if fn is isinstance and args and args[0][1] is not None and self.recording:  # o.__class__ = B
            self.guards.guard(Source(f"type({args[0][1].expr})", args[0][1]), type(args[0][0]))
        return _UNHANDLED

    def _call_torch(self, fnp, args, kwargs):
        """torch.tensor of Python data, and every torch callable (and super()), recorded."""
        fn = fnp[0]
        if fn in _FROM_DATA and self.recording:
            made = self._from_data(fn, args, kwargs)
            if made is not None:
                return made
        if _is_torch_callable(fn) or (fn is super and len(args) == 2) or getattr(fn, "__code__", None) in _RUN_WHOLE:
            for v, s in list(args) + list(kwargs.values()):
                self._touch_elements(v, s)  # lists of sizes, dims, paddings: read by value
            mark, self.rec.step_mark, why = self.rec.step_mark, len(self.rec.lines), None
            try:
                r = self._concrete(fn, args, kwargs)
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
                self.rec.step_mark = mark
            if why is not None:
                return self._opaque(fnp, args, kwargs, why)
            if not args and not kwargs and type(r[0]) in _BY_VALUE and self.recording and \
                    (getattr(fn, "__self__", None) is None or isinstance(fn.__self__, types.ModuleType)):
                # torch state read by the program (torch.are_deterministic_algorithms_enabled())
                self.guards.guard_state(f"{self.guards.const_source(fn).expr}()", r[0],
                                        f"{getattr(fn, '__name__', fn)}() == {r[0]!r}")
            return r
        return _UNHANDLED

    def _frame_namespace(self, fn, args, kwargs):
        """globals(), locals(), vars(), dir() and eval/exec without namespaces read the calling
        frame's: here the program's frame (self.frames[-1]), not the interpreter's own. None
        where fn is none of these."""
        if not self.frames or not any(fn is r for r in _FRAME_READERS) or kwargs or \
                ((fn is vars or fn is dir) and args) or ((fn is eval or fn is exec) and not 1 <= len(args) <= 2):
            return None
        f = self.frames[-1]
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
            self._touch_elements(v, s)
        self._effect(f"{fn.__name__}() of program text")  # (what the text does is not seen)
        glb = args[1][0] if len(args) == 2 else f.globals
        return (fn(args[0][0], glb, names if len(args) == 1 else None), None)

    def _call_builtin(self, fnp, args, kwargs):
        """enumerate/zip of sourced values, pure builtins, and methods of lists, dicts, sets,
        tuples and strings."""
        fn, fsrc = fnp
        made = self._frame_namespace(fn, args, kwargs)
        if made is not None:
            if fn is eval or fn is exec:
                self.abort(f"{fn.__name__}() runs program text dynamo does not see")
            return made
        if fn in (enumerate, zip) and self.recording:
            made = self._sourced_pairs(fn, args, kwargs)
            if made is not None:
                return made
        if fn in (setattr, object.__setattr__) and len(args) == 3 and not kwargs and type(args[1][0]) is str and \
                id(args[0][0]) in self.local_objs:
            # setattr(obj, "name", v) on an object the call made, as STORE_ATTR sets it (and
            # object.__setattr__, as a frozen dataclass's __init__ does)
            self.touch(*args[1])
            fn(args[0][0], args[1][0], args[2][0])
            return (None, None)
        if fn is map and len(args) >= 2 and not kwargs:  # lazily, as map does: see _map
            return self._call_python(_map, None, list(args), {}, None)
        if fn is collections.defaultdict and args and args[0][0] is not None and args[0][0] not in _PURE_BUILTINS:
            return _UNHANDLED  # (a factory that may do anything when a missing key is read)
        if fn in _PURE_BUILTINS or fn in _CONTAINERS:
            for i, (v, s) in enumerate(list(args) + list(kwargs.values())):
                if i == 0 and fn in (isinstance, issubclass, callable):
                    self.touch(v, s)  # its class decides, which the class guard checks
                else:
                    self._touch_elements(v, s)
            # (a bound method read anew each call is guarded by its function and object: not pinned)
            r = self._concrete(fn, args, kwargs, pin=fn not in (isinstance, issubclass, callable, inspect.signature))
            if fn in _CONTAINERS:  # a new container of the call's own, as {} makes
                self._mark_local(r[0])
            return r
        self_ = getattr(fn, "__self__", None)
        if isinstance(fn, types.BuiltinMethodType) and isinstance(self_, (list, dict, set, tuple, str)):
            if id(self_) in self.local_objs or fn.__name__ in _READ_METHODS:
                if fsrc is not None and fsrc.base is not None:  # d.values(), d.get(k), ... of a sourced d
                    self._touch_elements(self_, fsrc.base)
                    if type(self_) in _DICTS and fn.__name__ in ("items", "values") and not args and not kwargs:
                        return self._sourced_view(self_, fsrc.base, fn.__name__)
                return self._concrete(fn, args, kwargs)
            return self._opaque(fnp, args, kwargs, f"{type(self_).__name__}.{fn.__name__} changes an object "
                                                    f"from outside the function")
        return _UNHANDLED

    def _call_object(self, fnp, args, kwargs):
        """Python classes instantiated, object.__new__/__init__ on objects the call made, and
        instances with a __call__ in Python."""
        fn, fsrc = fnp
        if _plain_class(fn):
            return self._instantiate(fn, args, kwargs)
        if _dict_class(fn):  # a dict subclass with an __init__ in Python (Hugging Face's ModelOutput)
            obj = self._mark_local(fn.__new__(fn))
            self._call_python(fn.__init__, None, args, kwargs, (obj, None), init=True)
            return (obj, None)
        if fn is functools.partial and args:
            return self._make_partial(args, kwargs)
        if type(fn) is functools.partial:  # its function called with its arguments first
            fs, asrcs, ksrcs = self._partial_sources(fn, fsrc)
            self.touch(fn.func, fs)
            a = [(v, s) for v, s in zip(fn.args, asrcs)] + list(args)
            k = {n: (v, ksrcs[n]) for n, v in fn.keywords.items()}
            for v, s in a[:len(fn.args)] + [k[n] for n in fn.keywords]:
                self.touch(v, s)  # (what the partial holds is read as a load of it would be)
            k.update(kwargs)
            return self.call((fn.func, fs), a, k)
        if fn is object.__new__ and len(args) == 1 and not kwargs and _plain_class(args[0][0]):
            obj = object.__new__(args[0][0])  # super().__new__(cls) in a __new__ of Python
            self._mark_local(obj)
            self.keep.append(obj)
            return (obj, None)
        if type(fn) is types.MethodWrapperType and fn.__name__ == "__init__" and not args and not kwargs and \
                id(fn.__self__) in self.local_objs and fn == object.__init__.__get__(fn.__self__):
            return (None, None)  # super().__init__() reaching object's, on an object made in the call
        base = getattr(fn, "__self__", None)
        if type(fn) is types.BuiltinFunctionType and fn.__name__ == "__new__" and isinstance(base, type) and \
                base in _BUILTIN_BASES and args \
                and _plain_class(args[0][0]) and issubclass(args[0][0], base):
            # super().__new__(cls, ...) in a __new__ of Python over a builtin base (a tuple or list
            # subclass): the new object made for real, a local of the call, its elements guarded
            for v, s in list(args[1:]) + list(kwargs.values()):
                self._touch_elements(v, s)
            obj = self._concrete(fn, args, kwargs)[0]
            self._mark_local(obj)
            self.keep.append(obj)
            return (obj, None)
        if type(fn) is types.MethodWrapperType and fn.__name__ == "__init__" and id(base) in self.local_objs and \
                isinstance(base, (list, dict, set)):
            # super().__init__(items) of a list, dict or set subclass the call made: filled for real
            for v, s in list(args) + list(kwargs.values()):
                self._touch_elements(v, s)
            self._concrete(fn, args, kwargs)
            return (None, None)
        if type(type(fn)) in (type, abc.ABCMeta) and not isinstance(fn, (torch.Tensor, torch.nn.Module)) and \
                type(fn).__module__ != "builtins":
            # an instance of a Python class with a __call__ in Python (torchvision's LevelMapper):
            # a method call, guarded as one
            call = self._plain_method(fn, fsrc, "__call__")
            if call is not None:
                return self._call_python(call[0], None, args, kwargs, (fn, fsrc))
        return _UNHANDLED

    def _make_partial(self, args, kwargs):
        """functools.partial(func, *args, **kwargs) made in the call (functools.wraps makes one
        inside decorators): the real object, its parts' sources kept for when it is called."""
        (func, fs), rest = args[0], list(args[1:])
        p = functools.partial(func, *[v for v, _ in rest], **{n: v for n, (v, _) in kwargs.items()})
        asrcs, ksrcs = [s for _, s in rest], {n: s for n, (_, s) in kwargs.items()}
        if p.func is not func:  # partial(partial(f, a), b) flattens to partial(f, a, b)
            fs, inner_a, inner_k = self._partial_sources(func, fs)
            asrcs, ksrcs = inner_a + asrcs, {**inner_k, **ksrcs}
        self._mark_local(p)
        self._partial_srcs[id(p)] = (fs, asrcs, ksrcs)
        return (p, None)

    def _partial_sources(self, p, psrc):
        """(source of p.func, sources of p.args, sources of p.keywords by name) of a partial."""
        if id(p) in self._partial_srcs:
            return self._partial_srcs[id(p)]
        if psrc is None:
            return None, [None] * len(p.args), dict.fromkeys(p.keywords)
        return (psrc.attr("func"), [psrc.attr("args").item(i) for i in range(len(p.args))],
                {n: psrc.attr("keywords").item(n) for n in p.keywords})

    def _from_data(self, fn, args, kwargs):
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
            self._touch_elements(v, s)
        frozen = [_freeze(v) for v in a]
        self.rec.paused += 1
        try:
            with self._outside_recorder():
                t = fn(*frozen, **k)
        finally:
            self.rec.paused -= 1
        c = self.guards.const_source
        parts = [c(v).expr for v in frozen] + [f"{n}={c(v).expr}" for n, v in k.items()]
        src = Source(f"{c(fn).expr}({', '.join(parts)})")
        self.keep.append(t)
        self.touch(t, src)
        return (t, src)

    def _instantiate(self, cls, args, kwargs):
        """cls(*args) for a plain Python class (no metaclass; object.__new__ or a __new__ in Python,
        interpreted): a new object of the call's own, its __init__ interpreted like any method."""
        if cls.__new__ is not object.__new__:  # a __new__ in Python: interpreted, as type.__call__ runs it
            obj = self._call_python(cls.__new__, None, [(cls, None)] + list(args), kwargs, None)[0]
            if not isinstance(obj, cls):  # (__init__ runs only on an instance of cls)
                return (obj, None)
        else:
            obj = object.__new__(cls)
            self._mark_local(obj)
            self.keep.append(obj)
        init = cls.__init__
        if init is object.__init__:
            # object.__init__ refuses arguments only where __new__ is object's too (a namedtuple's
            # __new__ takes them, and its __init__ is object's)
            if (args or kwargs) and cls.__new__ is object.__new__:
                raise TypeError(f"{cls.__name__}() takes no arguments")
        else:
            self._call_python(init, None, args, kwargs, (obj, None), init=True)
        return (obj, None)

    def _sourced_view(self, d, dsrc, which):
        """d.items() / d.values() of a sourced dict as a tuple whose elements keep their sources
        (d[k]), so that modules and objects taken from it are read through guarded paths (their
        parameters are trace inputs). The keys are guarded by d's own guard."""
        srcs = [self._item_src(dsrc, k) for k in d]
        if which == "values":
            t = tuple(d.values())
            self._tuple_srcs[id(t)] = srcs
        else:
            pairs = []
            for (k, v), s in zip(d.items(), srcs):
                p = (k, v)
                self._tuple_srcs[id(p)] = [None, s]
                pairs.append(p)
            t = tuple(pairs)
            self._tuple_srcs[id(t)] = [None] * len(t)
            self.keep.extend(pairs)
        self.keep.append(t)
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

    def _call_python(self, fn, fsrc, args, kwargs, self_pair, init=False):
        if "_torchdynamo_orig_callable" in getattr(fn, "__dict__", ()):
            # A function torch.compile wrapped is compiled here as part of the caller: what it
            # wraps is recorded (torchvision compiles its Python roi_align on first use; recorded,
            # its gathers fuse into one loop, 10x faster than Inductor's code for it). One marked
            # torch.compiler.disable, or whose code we cannot follow, runs as the program asked,
            # a step between traces.
            orig = fn.__dict__["_torchdynamo_orig_callable"]
            disabled = fn.__dict__.get("_torchdynamo_disable")
            if not disabled and isinstance(orig, types.FunctionType) and unsupported_reason(orig.__code__) is None \
                    and self_pair is None:
                return self._call_python(orig, None, args, kwargs, None, init)
            how = "marked torch.compiler.disable" if disabled else "wrapped by torch.compile"
            return self._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} is {how}", self_pair)
        if getattr(fn, "_dynamo_disable", False):
            return self._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} is marked dynamo.disable",
                                self_pair)
        why = unsupported_reason(fn.__code__)
        if why is None and self.depth >= MAX_DEPTH:
            why = "inlining too deep"
        mod = getattr(fn, "__module__", None) or ""
        if mod.split(".")[:2] in (["torch", "_dynamo"], ["torch", "compiler"]):
            # torch.compile's own queries (is_compiling(), is_compile_supported(): the platform,
            # sysconfig, global flags of this process): run for real, as eager runs them, their
            # answers constants of the trace (torchvision's roi_align asks before choosing its path)
            if self_pair is not None:
                args = [self_pair] + list(args)
            r = self._concrete(fn, args, kwargs)
            if isinstance(r[0], torch.Tensor):  # (a tensor made outside the trace: not a constant of it)
                self.abort(f"{fn.__qualname__} (torch.compile's helper) returned a tensor")
            return r
        if why is not None and (mod == "torch" or mod.startswith("torch.")) and not mod.startswith("torch.nn.modules"):
            # torch's own Python helpers (Tensor.split, ...): run for real with recording on, so
            # the ATen ops they perform are recorded; their arguments are all we pass them.
            # What they read of sizes is not seen: the trace serves its own sizes only.
            self.sizes.note_read("", f"{fn.__qualname__}() (torch's Python code run without being followed)")
            if self_pair is not None:
                args = [self_pair] + list(args)
            return self._concrete(fn, args, kwargs)
        if why is not None:
            return self._opaque((fn, fsrc), args, kwargs, f"{fn.__qualname__} uses {why}", self_pair)
        if self.recording:
            self.inlined.append(fn.__qualname__)
        if fsrc is None and id(fn) not in self.local_objs:
            fsrc = self.guards.const_source(fn)  # reads of its closure and defaults stay guarded
        if fsrc is not None and self.recording:  # the code itself can be replaced (f.__code__ = ...)
            self.guards.guard(Source(f"{fsrc.expr}.__code__", fsrc), fn.__code__)
        return self.call_function(fn, fsrc, args, kwargs, self_pair, init)

    def _concrete(self, fn, args, kwargs, pin=True):
        """fn called for real on the values of args/kwargs ((value, source) pairs). A plain data
        object among them is pinned (its identity guarded): what fn does with it is not seen."""
        if pin and self.guards._structural:
            for v, s in list(args) + list(kwargs.values()):
                self.guards.pin(s, v)
        a = [v for v, _ in args]
        k = {n: v for n, (v, _) in kwargs.items()}
        r = fn(*a, **k)
        if type(r) in (list, dict, set) or hasattr(type(r), "__next__"):
            self._mark_local(r)  # made by this call (an iterator from iter(), zip(), ...)
        return (r, None)

    def _opaque(self, fnp, args, kwargs, why, self_pair=None):
        """Runs a call we cannot record, for real. The trace ends right before it: where the
        interpreter state can be carried to later calls, as a stitch (the call becomes a step
        between this trace and the next, see _stitch), else by an abort."""
        stitched = self._stitch(why)
        if not stitched:
            self.abort(why)
        self._effect(f"a call not recorded ({why})")
        self.rec.paused += 1
        try:
            a = [self._escaping(v) for v, _ in args]  # (a generator of the call goes out as a real one)
            if self_pair is not None:
                a = [self_pair[0]] + a
            with self._outside_recorder():  # exactly as eager runs it
                r = fnp[0](*a, **{n: self._escaping(v) for n, (v, _) in kwargs.items()})
        finally:
            self.rec.paused -= 1
        if stitched:
            raise StitchNow(r)
        return (r, None)

    def _mode_read(self, fn, args, kwargs):
        """A read of torch's dispatch-mode stack (nn.MultiheadAttention asks whether make_fx is
        tracing): answered as the program sees it, without the recorder's own mode, and guarded,
        so that a later call under a mode of the program's records again."""
        for v, s in list(args) + list(kwargs.values()):
            self._touch_elements(v, s)
        with self._outside_recorder():
            r = fn(*[v for v, _ in args], **{n: v for n, (v, _) in kwargs.items()})
        call = f"{self.guards.const_source(fn).expr}({', '.join(repr(v) for v, _ in args)}" \
               f"{', ' if args and kwargs else ''}{', '.join(f'{n}={v!r}' for n, (v, _) in kwargs.items())})"
        name = getattr(fn, "__name__", "a dispatch-mode read")
        if type(r) in _BY_VALUE:
            self.guards.guard_state(call, r, f"{name}() == {r!r}")
        elif type(r) is list and not r:
            self.guards.guard_state(f"len({call})", 0, f"{name}() is empty")
        else:  # a mode of the program's is active: its own modes are not recorded through
            self.abort(f"{name}() finds a dispatch mode of the program's", "python")
        return (r, None)

    def _outside_recorder(self):
        """A context without the recorder's dispatch mode, for calls not recorded: they run
        exactly as in eager, and what they ask of torch's mode stack (make_fx tracing?) is the
        program's answer. (torch 1.13's composite ops also took other, "tensor subclass" paths
        under any Python dispatch mode; 2.13's do not.)"""
        if _current_mode() is self.rec:
            return _pop_mode_temporarily()
        return contextlib.nullcontext()

    # -- the loop ------------------------------------------------------------------------
    def _jump(self, f, target):
        f.ip = f.dec.index[target]

    def _execute(self, f):
        """Runs frame f from f.ip until it returns (or yields). An exception raised by an
        instruction inside a protected range of f's exception table goes to its handler, as in
        CPython: the value stack is cut to the range's depth, the offset pushed when the entry
        says lasti, then the exception; dynamo's own exceptions are never handed to the program."""
        while True:
            try:
                if f.thrown is not None:  # raised where the generator frame is suspended, its yield
                    e, f.thrown = f.thrown, None
                    raise e
                return self._execute_loop(f)
            except (Abort, NopythonError, StitchNow):
                raise
            except BaseException as e:  # noqa: BLE001 -- the program's exception, for its handler
                if id(e) not in self._exc_seen:  # raised here, not passed up from a callee or re-raised
                    self._exc_seen[id(e)] = e
                    self._chain(e)
                h = f.dec.handler_at(f.dec.insts[f.ip - 1].offset) if f.dec.handlers else None
                if h is None:
                    _note_program_frame(e, f)
                    raise
                del f.stack[h[3]:]
                if h[4]:
                    f.stack.append((f.dec.insts[f.ip - 1].offset, None))
                f.stack.append((e, None))
                f.kw_names = ()
                self._jump(f, h[2])

    def _chain(self, e):
        """As CPython sets an exception raised while another is handled: __context__ is the
        handled one (where the program ran CPython's own frames, the interpreter's exc_info is
        virtual: handled_exc), with any cycle through e cut from the chain."""
        ctx = self.handled_exc
        if ctx is None or ctx is e or not isinstance(ctx, BaseException):
            return
        o = ctx
        while o is not None:
            if o.__context__ is e:
                o.__context__ = None
                break
            o = o.__context__
        e.__context__ = ctx

    def _execute_loop(self, f):
        """Runs frame f from f.ip: one handler per bytecode (_HANDLERS, the `_op_` methods below);
        returns the frame's value, or a _Yielded when a generator frame suspends."""
        insts = f.dec.insts
        stack = f.stack
        handlers = _HANDLERS
        while True:
            ins = insts[f.ip]
            f.ip += 1
            self.steps += 1
            if self.steps == MAX_STEPS:
                self.abort(f"trace longer than {MAX_STEPS} bytecodes", "too_long")
            if len(self.rec.lines) >= self.max_ops and self.recording:
                self._cut(f)
            if ins.opname in _MAY_CALL_TORCH and self.recording:
                self._start = (f, f.ip - 1, list(stack), f.kw_names, self.rec.mutated)
            op = ins.opname
            if self.scalars:
                self._settle_stack(f, op)
            if self.deferred_reads and op not in _ITEM_MOVES:
                self._settle_items(f)
            if op in ("NOP", "RESUME", "PRECALL", "EXTENDED_ARG"):
                continue
            handler = handlers.get(op)
            if handler is None:  # pragma: no cover - excluded by the static check
                raise RuntimeError(f"dynamo interpreter: unhandled {op}")
            after = self.sizes.step_safe(f, op, ins) if self.recording else None
            if after is None:
                r = handler(self, f, ins)
            else:
                try:
                    r = handler(self, f, ins)
                finally:
                    self.sizes._origin = False
                self.sizes.after_safe(after)
            if r is not None:
                return r[0]

    def _popv(self, pop):
        """The value on top, its source dropped: a plain data object guarded by class only loses
        track here, so the trace depends on which object it is (GuardSet.pin)."""
        v, s = pop()
        if s is not None and self.guards._structural:
            self.guards.pin(s, v)
        return v

    def _pin(self, *pairs):
        """(value, source) pairs the trace depends on by identity (GuardSet.pin)."""
        if self.guards._structural:
            for v, s in pairs:
                self.guards.pin(s, v)

    # -- one handler per bytecode: f the frame, ins the instruction; None, or (value,) to return

    @_handles('LOAD_FAST')
    def _op_LOAD_FAST(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        p = f.locals[arg]
        if p[0] is _NULL:
            raise UnboundLocalError(f"local variable '{ins.argval}' referenced before assignment")
        self.touch(*p, scalar_ok=True)
        push(p)

    @_handles('STORE_FAST')
    def _op_STORE_FAST(self, f, ins):
        stack = f.stack
        pop = stack.pop
        old = f.locals[ins.arg][0]
        f.locals[ins.arg] = pop()
        if type(old) in _HOLDERS and self.generators:
            self._let_go(old)

    @_handles('LOAD_CONST')
    def _op_LOAD_CONST(self, f, ins):
        stack = f.stack
        push = stack.append
        push((ins.argval, None))

    @_handles('POP_TOP')
    def _op_POP_TOP(self, f, ins):
        stack = f.stack
        pop = stack.pop
        pop()

    @_handles('PUSH_NULL')
    def _op_PUSH_NULL(self, f, ins):
        stack = f.stack
        push = stack.append
        push((_NULL, None))

    @_handles('DELETE_FAST')
    def _op_DELETE_FAST(self, f, ins):
        old = f.locals[ins.arg][0]
        f.locals[ins.arg] = (_NULL, None)
        if type(old) in _HOLDERS and self.generators:
            self._let_go(old)

    def _escaping(self, v):
        """v as it leaves the call for code we do not interpret: a generator of the call becomes
        the real generator that stands for it (_realize), in the call's running frames too, so
        that `is` and `in` see one object on both sides."""
        if type(v) is not _Generator:
            return v
        real = _realize(v, 4)
        for fr in self.frames:
            for place in (fr.locals, fr.stack):
                for i, p in enumerate(place):
                    if type(p) is tuple and p[0] is v:
                        place[i] = (real, p[1])
        return real

    def _let_go(self, old):
        """A local no longer holds container `old`. Where nothing but the interpreter's own
        bookkeeping (keep) holds it either, it goes now, as CPython frees it here: a generator of
        the call inside it is then collected, and closed (_Generator.__del__) at this point."""
        if id(old) not in self.local_objs or not any(
                type(e) is _Generator for e in (old.values() if type(old) is dict else old)):
            return
        for r in gc.get_referrers(old):
            if r is not self.keep and not (type(r) is types.FrameType and r.f_code.co_filename == __file__):
                return  # (held elsewhere: in the program, or by a snapshot; closed at the end at the latest)
        self.local_objs.discard(id(old))
        for i, k in enumerate(self.keep):
            if k is old:
                del self.keep[i]
                break

    @_handles('COPY')
    def _op_COPY(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        push(stack[-arg])

    @_handles('SWAP')
    def _op_SWAP(self, f, ins):
        stack = f.stack
        arg = ins.arg
        stack[-1], stack[-arg] = stack[-arg], stack[-1]

    @_handles('LOAD_GLOBAL')
    def _op_LOAD_GLOBAL(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        if arg & 1:
            push((_NULL, None))
        name = ins.argval
        if name in f.globals:
            v = f.globals[name]
            src = self._global_src(f, name)
        else:
            b = f.globals.get("__builtins__", builtins)
            b = b if isinstance(b, dict) else b.__dict__
            if name not in b:
                raise NameError(f"name '{name}' is not defined")
            v, src = b[name], None
            self._guard_absent(f, name)  # a global of that name would shadow the builtin
        self.touch(v, src)
        push((v, src))

    @_handles('LOAD_ATTR', 'LOAD_METHOD')
    def _op_LOAD_ATTR(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        op = ins.opname
        obj, osrc = pop()
        name = ins.argval
        if op == "LOAD_METHOD":
            meth = self._plain_method(obj, osrc, name)
            if meth is not None:
                push(meth)
                push((obj, osrc))
                return
            push((_NULL, None))
        push(self.load_attr(obj, osrc, name))

    @_handles('STORE_ATTR')
    def _op_STORE_ATTR(self, f, ins):
        stack = f.stack
        pop = stack.pop
        if id(stack[-1][0]) not in self.local_objs:
            why = f"sets attribute {ins.argval} of an object from outside the function"
            stitched = self._stitch_store(f, why, "setattr", ins.argval)
            if not stitched:
                self.abort(why)
            self._effect(f"setting attribute {ins.argval}")
            if stitched:
                obj, _ = pop()
                setattr(obj, ins.argval, self._popv(pop))
                raise StitchNow(None)
        obj, _ = pop()
        v, _ = pop()
        if id(obj) not in self.local_objs:
            v = self._escaping(v)  # (a generator of the call stored outside it goes out as a real one)
        setattr(obj, ins.argval, v)

    @_handles('DELETE_ATTR')
    def _op_DELETE_ATTR(self, f, ins):
        if id(f.stack[-1][0]) not in self.local_objs:  # as STORE_ATTR: a stitch, the step deletes it
            why = f"deletes attribute {ins.argval} of an object from outside the function"
            stitched = self._stitch_at(f, f.ip - 1, f.stack, f.kw_names, why, "delattr", 1, ins.argval, False)
            if not stitched:
                self.abort(why)
            self._effect(f"deleting attribute {ins.argval}")
            if stitched:
                delattr(f.stack.pop()[0], ins.argval)
                raise StitchNow(None)
        obj, _ = f.stack.pop()
        delattr(obj, ins.argval)  # (contextlib's context manager drops its arguments in __enter__)

    @_handles('MAKE_CELL')
    def _op_MAKE_CELL(self, f, ins):
        arg = ins.arg
        v = f.locals[arg]
        if self.scalars:
            self.settle_scalar(v)  # a closure may read it where the interpreter does not see
        cell = types.CellType() if v[0] is _NULL else types.CellType(v[0])
        self._cell_src[id(cell)] = v[1]
        self._mark_local(cell)
        f.locals[arg] = (cell, None)

    @_handles('COPY_FREE_VARS')
    def _op_COPY_FREE_VARS(self, f, ins):
        arg = ins.arg
        closure = f.fn.__closure__
        base = len(f.dec.names) - arg
        for i in range(arg):
            cell = closure[i]
            csrc = f.fn_src.attr("__closure__").item(i) if f.fn_src is not None else None
            if id(cell) not in self._cell_src:
                self._cell_src[id(cell)] = csrc.attr("cell_contents") if csrc is not None else None
            self.outer_cells.setdefault(id(cell), csrc)  # (a snapshot refers to the cell itself)
            f.locals[base + i] = (cell, None)

    @_handles('LOAD_CLOSURE')
    def _op_LOAD_CLOSURE(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        push(f.locals[arg])

    @_handles('LOAD_DEREF')
    def _op_LOAD_DEREF(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        cell = f.locals[arg][0]
        try:
            v = cell.cell_contents
        except ValueError:
            raise NameError(f"free variable '{ins.argval}' referenced before assignment") from None
        src = self._cell_src.get(id(cell))
        self.touch(v, src)
        push((v, src))

    @_handles('STORE_DEREF')
    def _op_STORE_DEREF(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        cell = f.locals[arg][0]
        v, src = pop()
        if id(cell) not in self.local_objs:
            self.abort("assigns a closure variable of an enclosing function")
            self._effect("assigning a closure variable")
        cell.cell_contents = v
        self._cell_src[id(cell)] = src

    @_handles('KW_NAMES')
    def _op_KW_NAMES(self, f, ins):
        arg = ins.arg
        f.kw_names = f.code.co_consts[arg]

    @_handles('CALL')
    def _op_CALL(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        n = arg
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        second = pop()
        first = pop()
        if first[0] is _NULL:
            fnp = second
        else:
            fnp = first
            items = [second] + items
        kw = f.kw_names
        f.kw_names = ()
        if kw:
            pos, kwv = items[:len(items) - len(kw)], items[len(items) - len(kw):]
            kwargs = dict(zip(kw, kwv))
        else:
            pos, kwargs = items, {}
        if fnp[0] is super and not pos and not kwargs:
            pos = self._super_args(f)
        if not self.scalars:
            push(self.call(fnp, pos, kwargs))
            return
        tracked = [p for p in [fnp] + list(pos) + list(kwargs.values())
                   if p[1] is not None and p[1].expr in self.scalars]
        try:
            push(self.call(fnp, pos, kwargs))
        finally:
            for p in tracked:  # read by the callee unless bound to an inlined frame's parameter
                if id(p) not in self._moved:
                    self.settle_scalar(p)
                self._moved.discard(id(p))

    @_handles('CALL_FUNCTION_EX')
    def _op_CALL_FUNCTION_EX(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        kwargs = {}
        if arg & 1:
            d, dsrc = pop()
            srcs = self._dict_srcs.get(id(d), {})
            kwargs = {n: (v, srcs.get(n) or (dsrc.item(n) if dsrc else None)) for n, v in d.items()}
        t, tsrc = pop()
        srcs = self._tuple_srcs.get(id(t))
        pos = [(v, (srcs[i] if srcs else (tsrc.item(i) if tsrc else None))) for i, v in enumerate(t)]
        fnp = pop()
        if stack and stack[-1][0] is _NULL:
            pop()
        push(self.call(fnp, pos, kwargs))

    @_handles('MAKE_FUNCTION')
    def _op_MAKE_FUNCTION(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        code = self._popv(pop)
        closure = self._popv(pop) if arg & 0x08 else None
        if arg & 0x04:
            pop()
        kwdefaults = self._popv(pop) if arg & 0x02 else None
        defaults = self._popv(pop) if arg & 0x01 else None
        fn = types.FunctionType(code, f.globals, code.co_name, defaults, closure)
        if kwdefaults:
            fn.__kwdefaults__ = kwdefaults
        fn.__qualname__ = code.co_qualname
        self._mark_local(fn)
        push((fn, None))

    @_handles('BINARY_OP')
    def _op_BINARY_OP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        b = pop()
        a = pop()
        fn = _BINARY[arg]
        self._pin(a, b)
        if arg >= 13 and id(a[0]) not in self.local_objs and type(a[0]) in (list, dict, set):
            self.abort("augmented assignment changes a container from outside the function")
            self._effect("changing a container in place")
        if self.scalars:
            n = self._scalar_operand(a, b, arg)
            if n is not None and self.recording:
                try:
                    with self.rec.scalar_scope(n[0], n[1].expr):
                        r = fn(a[0], b[0])
                except Exception:  # the program's own error (or handled by it): by value
                    self.settle_scalar(n)
                    raise
                if self.rec.scalar_uses != 1:  # not exactly the op's one operand: by value after all
                    self.settle_scalar(n)
                push((r, None))
                return
            self.settle_scalar(a)
            self.settle_scalar(b)
        push((fn(a[0], b[0]), None))

    @_handles('COMPARE_OP')
    def _op_COMPARE_OP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        if self.deferred_reads and (type(stack[-1][1]) is ItemRead or type(stack[-2][1]) is ItemRead):
            done = self._compare_item(f, arg)
            if done is not None:
                push(done)
                return
        b = pop()
        a = pop()
        self._pin(a, b)
        push((_COMPARE[arg](a[0], b[0]), None))

    @_handles('IS_OP')
    def _op_IS_OP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        b = pop()
        a = pop()
        self._pin(a, b)
        push(((a[0] is not b[0]) if arg else (a[0] is b[0]), None))

    @_handles('CONTAINS_OP')
    def _op_CONTAINS_OP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        b = pop()
        a = pop()
        if isinstance(b[0], torch.Tensor) and isinstance(a[0], (int, float, torch.Tensor)) and self.recording and \
                self.rec.known(b[0]):
            # `v in t` (Tensor.__contains__ reads (t == v).any() as a Python bool): recorded, and
            # the answer read as a guarded value, with `not in` folded into the tensor read
            hit = (b[0] == a[0]).any()
            push(self._tensor_value(torch.logical_not(hit) if arg else hit, "bool"))
            return
        if b[1] is not None and type(b[0]) in _DICTS + (set, frozenset) and _stable_key(a[0]):
            # `k in registry` of a sourced dict or set (torch's pytree node table, 149 types):
            # the answer is guarded, not the whole container
            self.touch(*a)
            r = a[0] in b[0]
            if self.recording:
                self.guards.guard_state(f"{self.guards.const_source(a[0]).expr} in {b[1].expr}", r,
                                        f"{a[0]!r} in {b[1].expr}", b[1])
        else:
            self.touch_deep(*b)
            self._pin(a)
            r = a[0] in b[0]
        push(((not r) if arg else r, None))

    @_handles('UNARY_NEGATIVE')
    def _op_UNARY_NEGATIVE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        push((-self._popv(pop), None))

    @_handles('UNARY_POSITIVE')
    def _op_UNARY_POSITIVE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        push((+self._popv(pop), None))

    @_handles('UNARY_INVERT')
    def _op_UNARY_INVERT(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        push((~self._popv(pop), None))

    @_handles('UNARY_NOT')
    def _op_UNARY_NOT(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        push((not self._popv(pop), None))

    @_handles('BINARY_SUBSCR')
    def _op_BINARY_SUBSCR(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        key = pop()
        self._pin(key)
        obj, osrc = pop()
        v = obj[self._tensor_index(obj, key[0])]
        src = None
        if osrc is not None and type(obj) in (list, tuple) and type(key[0]) is int:
            src = osrc.item(key[0])
        elif osrc is not None and type(obj) in _DICTS:
            src = self._item_src(osrc, key[0])
        elif osrc is not None and isinstance(obj, _MODULE_CONTAINERS) and \
                isinstance(key[0], (int, str)) and not isinstance(key[0], bool):
            src = self._submodule_srcs(obj, osrc)[_module_key(obj, key[0])]
        elif osrc is not None and isinstance(obj, (torch.nn.Sequential, torch.nn.ModuleList)) and \
                type(key[0]) is slice and not _has_hooks(obj):
            # self.layers[:n] (LLaMA's decoder loop): a new container whose modules keep their sources
            self.touch(*key)
            self._sliced_modules[id(v)] = list(self._submodule_srcs(obj, osrc).values())[key[0]]
            self.keep.append(v)
        elif id(obj) in self._sliced_modules and type(key[0]) is int and not _has_hooks(obj):
            src = self._sliced_modules[id(obj)][key[0]]
        elif type(obj) is tuple and id(obj) in self._tuple_srcs and isinstance(key[0], int):
            src = self._tuple_srcs[id(obj)][key[0]]
        elif type(obj) is tuple and id(obj) in self._tuple_srcs and isinstance(key[0], slice):
            self._tuple_srcs[id(v)] = self._tuple_srcs[id(obj)][key[0]]
            self.keep.append(v)
        elif osrc is not None and not isinstance(obj, torch.Tensor):
            self.touch_deep(obj, osrc)
        self.touch(v, src)
        push((v, src))

    def _tensor_index(self, obj, key):
        """key of obj[key], with each list of Python ints or bools in it (x[:, [-1, 0]]) made the
        index tensor torch would make of it, as torch.tensor(list) does: a trace input rebuilt from
        the numbers (_from_data), where Tensor.__getitem__ would make it from Python data unseen."""
        if not isinstance(obj, torch.Tensor) or not self.recording:
            return key

        def index(k):
            if type(k) is list and k and (all(type(e) is int for e in k) or all(type(e) is bool for e in k)):
                made = self._from_data(torch.tensor, [(k, None)], {})
                return k if made is None else made[0]
            return k
        return tuple(index(k) for k in key) if type(key) is tuple else index(key)

    @_handles('STORE_SUBSCR')
    def _op_STORE_SUBSCR(self, f, ins):
        stack = f.stack
        pop = stack.pop
        if id(stack[-2][0]) not in self.local_objs and not isinstance(stack[-2][0], torch.Tensor):
            # (a tensor's item assignment is an in-place write, recorded at ATen)
            why = "item assignment into an object from outside the function"
            stitched = self._stitch_store(f, why, "setitem", None)
            if not stitched:
                self.abort(why)
            self._effect("item assignment")
            if stitched:
                key, obj, v = self._popv(pop), self._popv(pop), self._popv(pop)
                obj[key] = v
                raise StitchNow(None)
        key = pop()
        obj = self._popv(pop)
        v = self._popv(pop)
        if id(obj) not in self.local_objs:
            v = self._escaping(v)  # (as in STORE_ATTR)
        if isinstance(obj, torch.Tensor) and isinstance(v, (bool, int, float)) and self.recording:
            # x[k] = number: the 0-dim tensor torch makes of the number (in x's dtype, as
            # Tensor.__setitem__ does) is made here by a traced op instead of from Python
            # data, so the write is recorded; the number is a constant or a guarded value.
            v = torch.scalar_tensor(v, dtype=obj.dtype, device=obj.device)
        obj[self._tensor_index(obj, key[0])] = v

    @_handles('BUILD_TUPLE')
    def _op_BUILD_TUPLE(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        items = stack[len(stack) - arg:] if arg else []
        del stack[len(stack) - arg:]
        t = tuple(v for v, _ in items)
        if any(s is not None for _, s in items):
            self._tuple_srcs[id(t)] = [s for _, s in items]
            self.keep.append(t)
        push((t, None))

    @_handles('BUILD_LIST')
    def _op_BUILD_LIST(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        items = stack[len(stack) - arg:] if arg else []
        del stack[len(stack) - arg:]
        self._pin(*items)
        lst = self._mark_local([v for v, _ in items])
        if any(s is not None for _, s in items):
            self._list_srcs[id(lst)] = [s for _, s in items]
        push((lst, None))

    @_handles('BUILD_SET')
    def _op_BUILD_SET(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        items = stack[len(stack) - arg:] if arg else []
        del stack[len(stack) - arg:]
        self._pin(*items)
        push((self._mark_local({v for v, _ in items}), None))

    @_handles('BUILD_MAP')
    def _op_BUILD_MAP(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        items = stack[len(stack) - 2 * arg:] if arg else []
        del stack[len(stack) - 2 * arg:]
        self._pin(*items)
        d = {items[2 * i][0]: items[2 * i + 1][0] for i in range(arg)}
        push((self._mark_local(d), None))

    @_handles('BUILD_CONST_KEY_MAP')
    def _op_BUILD_CONST_KEY_MAP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        keys = self._popv(pop)
        items = stack[len(stack) - arg:]
        del stack[len(stack) - arg:]
        self._pin(*items)
        push((self._mark_local(dict(zip(keys, (v for v, _ in items)))), None))

    @_handles('BUILD_STRING')
    def _op_BUILD_STRING(self, f, ins):
        stack = f.stack
        push = stack.append
        arg = ins.arg
        items = stack[len(stack) - arg:] if arg else []
        del stack[len(stack) - arg:]
        push(("".join(v for v, _ in items), None))

    @_handles('BUILD_SLICE')
    def _op_BUILD_SLICE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        items = [self._popv(pop) for _ in range(arg)][::-1]
        push((slice(*items), None))

    @_handles('LIST_APPEND')
    def _op_LIST_APPEND(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        v = self._popv(pop)
        stack[-arg][0].append(v)

    @_handles('SET_ADD')
    def _op_SET_ADD(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        v = self._popv(pop)
        stack[-arg][0].add(v)

    @_handles('MAP_ADD')
    def _op_MAP_ADD(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        v = self._popv(pop)
        k = self._popv(pop)
        stack[-arg][0][k] = v

    @_handles('LIST_EXTEND')
    def _op_LIST_EXTEND(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        v, s = pop()
        target = stack[-arg][0]
        srcs = self._list_srcs.pop(id(target), None)
        to_tuple = f.ip < len(f.dec.insts) and f.dec.insts[f.ip].opname == "LIST_TO_TUPLE"
        if to_tuple and (srcs is not None or id(v) in self._tuple_srcs) and type(v) in (list, tuple) and \
                len(target) == (len(srcs) if srcs is not None else len(target)):
            # f(x, *args): the element sources go with the elements into the call's tuple (each
            # guarded where it is used)
            if id(v) not in self._tuple_srcs:
                self.touch(v, s)  # (its class and length)
            self._list_srcs[id(target)] = (srcs or [None] * len(target)) + self._element_srcs(v, s, len(v))
        else:
            # a list the program keeps ([*args]): what it reads from it has no source, so every
            # element is guarded here (a *args tuple's too, by its elements' sources)
            self._touch_elements(v, s)
        target.extend(v)

    @_handles('DICT_MERGE', 'DICT_UPDATE')
    def _op_DICT_MERGE(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        op = ins.opname
        v, s = pop()
        self.touch_deep(v, s)
        d = stack[-arg][0]
        if op == "DICT_MERGE":
            dup = set(d) & set(v)
            if dup:
                raise TypeError(f"got multiple values for keyword argument '{next(iter(dup))}'")
        d.update(v)

    @_handles('LIST_TO_TUPLE')
    def _op_LIST_TO_TUPLE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        lst = self._popv(pop)
        t = tuple(lst)
        srcs = self._list_srcs.pop(id(lst), None)
        if srcs is not None and len(srcs) == len(t):
            self._tuple_srcs[id(t)] = srcs
            self.keep.append(t)
        push((t, None))

    @_handles('UNPACK_SEQUENCE')
    def _op_UNPACK_SEQUENCE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        v, s = pop()
        items = list(v)
        if len(items) != arg:
            raise ValueError(f"expected {arg} values to unpack, got {len(items)}")
        srcs = self._element_srcs(v, s, len(items))
        for i in reversed(range(arg)):
            self.touch(items[i], srcs[i])
            push((items[i], srcs[i]))

    @_handles('UNPACK_EX')
    def _op_UNPACK_EX(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        v, s = pop()
        self.touch_deep(v, s)
        items = list(v)
        before, after = arg & 0xFF, arg >> 8
        if len(items) < before + after:
            raise ValueError("not enough values to unpack")
        for x in reversed(items[len(items) - after:]):
            push((x, None))
        push((self._mark_local(items[before:len(items) - after]), None))
        for x in reversed(items[:before]):
            push((x, None))

    @_handles('GET_ITER')
    def _op_GET_ITER(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        v, s = pop()
        if s is not None and isinstance(v, (torch.nn.Sequential, torch.nn.ModuleList)):
            srcs = self._submodule_srcs(v, s)
            push((_SourcedIter(list(v._modules.values()), list(srcs.values())), None))
        elif s is not None and type(v) is list and len(v) <= 256:
            push((_SourcedIter.live(v, s), None))
        elif s is not None and type(v) is tuple and len(v) <= 256:
            srcs = self._element_srcs(v, s, len(v))
            push((_SourcedIter(list(v), srcs), None))
        else:
            if type(v) is tuple and id(v) in self._tuple_srcs:
                push((_SourcedIter(list(v), self._tuple_srcs[id(v)]), None))
                return
            if id(v) in self._sliced_modules and not _has_hooks(v):
                push((_SourcedIter(list(v._modules.values()), self._sliced_modules[id(v)]), None))
                return
            self.touch_deep(v, s)
            push((iter(v), None))

    @_handles('FOR_ITER')
    def _op_FOR_ITER(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        try:
            push(self._next_pair(stack[-1][0]))
        except StopIteration:
            pop()
            self._jump(f, ins.argval)

    def _next_pair(self, it):
        """The next (value, source) of an iterator the interpreter drives (FOR_ITER, SEND);
        StopIteration at its end."""
        if isinstance(it, (_SourcedIter, _Generator)):
            try:
                v, src = it.next_pair()
            except StopIteration:
                if type(it) is _SourcedIter and it.src is not None and self.recording:
                    # where the loop over a sourced list ended (it may have grown)
                    self.guards.guard_state(f"len({it.src.expr})", it.i,
                                            f"{it.src.expr} has {it.i} elements", src=it.src)
                raise
            self.touch(v, src)
            return (v, src)
        return (next(it), None)

    @_handles('GET_YIELD_FROM_ITER')
    def _op_GET_YIELD_FROM_ITER(self, f, ins):  # `yield from x`: a generator stays itself, else iter(x)
        v = f.stack[-1][0]
        if not isinstance(v, (_Generator, types.GeneratorType)):
            self._op_GET_ITER(f, ins)

    @_handles('SEND')
    def _op_SEND(self, f, ins):
        """`yield from`'s step: the next value of the iterator under the value sent in (next():
        None; g.send(v): v, sent on), or, at its end, its return value in the iterator's place
        and a jump past the loop."""
        stack = f.stack
        sent = stack.pop()
        it = stack[-1][0]
        try:
            if sent[0] is None:
                stack.append(self._next_pair(it))
            elif isinstance(it, _Generator):  # a value sent on to the generator delegated to
                pair = it.send_pair(sent)
                self.touch(*pair)
                stack.append(pair)
            else:
                stack.append((it.send(sent[0]), None))
        except StopIteration as e:
            stack[-1] = e.value if isinstance(e.value, _Returned) else (e.value, None)
            self._jump(f, ins.argval)

    @_handles('JUMP_FORWARD', 'JUMP_BACKWARD', 'JUMP_BACKWARD_NO_INTERRUPT')
    def _op_JUMP(self, f, ins):
        self._jump(f, ins.argval)

    @_handles('POP_JUMP_BACKWARD_IF_FALSE', 'POP_JUMP_BACKWARD_IF_NONE', 'POP_JUMP_BACKWARD_IF_NOT_NONE', 'POP_JUMP_BACKWARD_IF_TRUE', 'POP_JUMP_FORWARD_IF_FALSE', 'POP_JUMP_FORWARD_IF_NONE', 'POP_JUMP_FORWARD_IF_NOT_NONE', 'POP_JUMP_FORWARD_IF_TRUE')
    def _op_POP_JUMP(self, f, ins):
        stack = f.stack
        pop = stack.pop
        op = ins.opname
        v = self._popv(pop)
        if isinstance(v, torch.Tensor) and op.endswith(("IF_FALSE", "IF_TRUE")) and self.recording and \
                self.rec.known(v):
            take = self._branch_on_tensor(f, v, op.endswith("IF_TRUE"), ins.argval)
            if take:
                self._jump(f, ins.argval)
            return
        if op.endswith("IF_FALSE"):
            take = not v
        elif op.endswith("IF_TRUE"):
            take = bool(v)
        elif op.endswith("IF_NOT_NONE"):
            take = v is not None
        else:
            take = v is None
        if take:
            self._jump(f, ins.argval)

    @_handles('JUMP_IF_FALSE_OR_POP', 'JUMP_IF_TRUE_OR_POP')
    def _op_JUMP_IF_OR_POP(self, f, ins):
        stack = f.stack
        pop = stack.pop
        op = ins.opname
        v = stack[-1][0]
        if bool(v) == (op == "JUMP_IF_TRUE_OR_POP"):
            self._jump(f, ins.argval)
        else:
            pop()

    @_handles('FORMAT_VALUE')
    def _op_FORMAT_VALUE(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        spec = self._popv(pop) if (arg & 0x04) else ""
        v = self._popv(pop)
        conv = arg & 0x03
        v = str(v) if conv == 1 else repr(v) if conv == 2 else ascii(v) if conv == 3 else v
        push((format(v, spec), None))

    @_handles('GET_LEN')
    def _op_GET_LEN(self, f, ins):
        stack = f.stack
        push = stack.append
        push((len(stack[-1][0]), None))

    @_handles('RETURN_VALUE')
    def _op_RETURN_VALUE(self, f, ins):
        stack = f.stack
        pop = stack.pop
        return (pop(),)

    @_handles('RETURN_GENERATOR')
    def _op_RETURN_GENERATOR(self, f, ins):  # reached on the first resume: the value sent in
        stack = f.stack
        push = stack.append
        push((None, None))

    @_handles('YIELD_VALUE')
    def _op_YIELD_VALUE(self, f, ins):  # suspends here; the resume pushes the value sent (None)
        stack = f.stack
        pop = stack.pop
        return (_Yielded(pop()),)

    @_handles('LOAD_ASSERTION_ERROR')
    def _op_LOAD_ASSERTION_ERROR(self, f, ins):
        stack = f.stack
        push = stack.append
        push((AssertionError, None))

    @_handles('RAISE_VARARGS')
    def _op_RAISE_VARARGS(self, f, ins):
        stack = f.stack
        pop = stack.pop
        arg = ins.arg
        if arg == 0:
            if self.handled_exc is None:
                raise RuntimeError("No active exception to reraise")
            raise self.handled_exc
        cause = self._popv(pop) if arg == 2 else None
        exc = self._popv(pop)
        if isinstance(exc, type) and issubclass(exc, BaseException):
            exc = exc()  # `raise ValueError`: the class called with no arguments, as CPython does
        if not isinstance(exc, BaseException):
            raise TypeError("exceptions must derive from BaseException")
        if arg == 2:  # `raise exc from cause`: __cause__ set (None too), the context suppressed
            if isinstance(cause, type) and issubclass(cause, BaseException):
                cause = cause()
            elif cause is not None and not isinstance(cause, BaseException):
                raise TypeError("exception causes must derive from BaseException")
            exc.__cause__ = cause  # (also sets __suppress_context__)
        raise exc

    @_handles('PUSH_EXC_INFO')
    def _op_PUSH_EXC_INFO(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        v = pop()
        push((self.handled_exc, None))
        self.handled_exc = v[0]
        push(v)

    @_handles('POP_EXCEPT')
    def _op_POP_EXCEPT(self, f, ins):
        stack = f.stack
        pop = stack.pop
        self.handled_exc = self._popv(pop)

    @_handles('CHECK_EXC_MATCH')
    def _op_CHECK_EXC_MATCH(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        right = self._popv(pop)
        push((isinstance(stack[-1][0], right), None))

    @_handles('RERAISE')
    def _op_RERAISE(self, f, ins):
        stack = f.stack
        pop = stack.pop
        exc = self._popv(pop)
        raise exc

    # -- operations that 3.12 and 3.13 added (bytecode.py decodes the rest into 3.11's) -------
    @_handles('RETURN_CONST')
    def _op_RETURN_CONST(self, f, ins):
        return ((ins.argval, None),)

    @_handles('BINARY_SLICE')
    def _op_BINARY_SLICE(self, f, ins):  # container[start:end]
        self._op_BUILD_SLICE(f, _As("BUILD_SLICE", 2))
        self._op_BINARY_SUBSCR(f, _As("BINARY_SUBSCR", 0, ins))

    @_handles('STORE_SLICE')
    def _op_STORE_SLICE(self, f, ins):  # container[start:end] = value
        self._op_BUILD_SLICE(f, _As("BUILD_SLICE", 2))
        self._op_STORE_SUBSCR(f, _As("STORE_SUBSCR", 0, ins))

    @_handles('LOAD_FAST_AND_CLEAR')
    def _op_LOAD_FAST_AND_CLEAR(self, f, ins):  # an inlined comprehension saves the name's outer value
        f.stack.append(f.locals[ins.arg])
        f.locals[ins.arg] = (_NULL, None)

    def _fast(self, f, k):
        """Local k as a LOAD_FAST / STORE_FAST argument (3.13's pairs of locals in one)."""
        return _As("LOAD_FAST", k, argval=f.dec.names[k] if k < len(f.dec.names) else k)

    @_handles('LOAD_FAST_LOAD_FAST')
    def _op_LOAD_FAST_LOAD_FAST(self, f, ins):
        self._op_LOAD_FAST(f, self._fast(f, ins.arg >> 4))
        self._op_LOAD_FAST(f, self._fast(f, ins.arg & 15))

    @_handles('STORE_FAST_LOAD_FAST')
    def _op_STORE_FAST_LOAD_FAST(self, f, ins):
        self._op_STORE_FAST(f, self._fast(f, ins.arg >> 4))
        self._op_LOAD_FAST(f, self._fast(f, ins.arg & 15))

    @_handles('STORE_FAST_STORE_FAST')
    def _op_STORE_FAST_STORE_FAST(self, f, ins):
        self._op_STORE_FAST(f, self._fast(f, ins.arg >> 4))
        self._op_STORE_FAST(f, self._fast(f, ins.arg & 15))

    @_handles('PUSH_NULL_BELOW')
    def _op_PUSH_NULL_BELOW(self, f, ins):  # 3.13's PUSH_NULL, after the callable: NULL goes under it
        f.stack.insert(len(f.stack) - 1, (_NULL, None))

    @_handles('CALL_KW')
    def _op_CALL_KW(self, f, ins):  # 3.13: the keyword names are a tuple on the stack
        f.kw_names = self._popv(f.stack.pop)
        self._op_CALL(f, ins)

    @_handles('END_FOR')
    def _op_END_FOR(self, f, ins):
        del f.stack[len(f.stack) - ins.arg:]

    @_handles('END_SEND')
    def _op_END_SEND(self, f, ins):  # receiver, value -> value
        v = f.stack.pop()
        f.stack[-1] = v

    @_handles('CLEANUP_THROW')
    def _op_CLEANUP_THROW(self, f, ins):
        """An exception thrown into `yield from` came back out of the delegate: a StopIteration
        ends the delegation with its value (None, value for END_SEND), anything else goes on."""
        exc = self._popv(f.stack.pop)
        del f.stack[-2:]
        if not isinstance(exc, StopIteration):
            raise exc
        f.stack.append((None, None))
        f.stack.append(exc.value if isinstance(exc.value, _Returned) else (exc.value, None))

    @_handles('CALL_INTRINSIC_1')
    def _op_CALL_INTRINSIC_1(self, f, ins):
        """INTRINSIC_STOPITERATION_ERROR (bytecode.py names the others): PEP 479 in the generator's
        own exception handler -- a StopIteration leaving the body becomes RuntimeError."""
        exc = self._popv(f.stack.pop)
        if isinstance(exc, StopIteration):
            err = RuntimeError("generator raised StopIteration")
            err.__cause__ = err.__context__ = exc
            self._exc_seen[id(err)] = err
            exc = err
        f.stack.append((exc, None))

    @_handles('LOAD_SUPER_ATTR')
    def _op_LOAD_SUPER_ATTR(self, f, ins):
        """super().name (3.12+): the stack holds the global super, the class and self; the super
        object is made as the call super(cls, self) (or, where the global is not the builtin, as
        that call of it), then read like any attribute (a method flag: as LOAD_METHOD)."""
        stack = f.stack
        self_p, cls_p, sup_p = stack.pop(), stack.pop(), stack.pop()
        args = [cls_p, self_p] if sup_p[0] is super or ins.arg & 2 else []
        stack.append(self.call(sup_p, args, {}))
        self._op_LOAD_ATTR(f, _As("LOAD_METHOD" if ins.arg & 1 else "LOAD_ATTR", ins.arg, ins, argval=ins.argval))

    @_handles('CONVERT_VALUE')
    def _op_CONVERT_VALUE(self, f, ins):  # 3.13's f-string conversion: !s, !r, !a
        v = self._popv(f.stack.pop)
        f.stack.append(((str, repr, ascii)[ins.arg - 1](v), None))

    @_handles('FORMAT_SIMPLE')
    def _op_FORMAT_SIMPLE(self, f, ins):
        v = self._popv(f.stack.pop)
        f.stack.append((v if type(v) is str else format(v, ""), None))

    @_handles('FORMAT_WITH_SPEC')
    def _op_FORMAT_WITH_SPEC(self, f, ins):
        spec = self._popv(f.stack.pop)
        v = self._popv(f.stack.pop)
        f.stack.append((format(v, spec), None))

    # -- bytecodes of statements that change state outside the call, and of `match` ----------
    @_handles('STORE_GLOBAL', 'DELETE_GLOBAL')
    def _op_STORE_GLOBAL(self, f, ins):
        """`global g; g = v` (or `del g`): a module's state changes; the recording ends here (the
        call goes on and makes the change, as eager does)."""
        name = ins.argval
        what = "assigns" if ins.opname == "STORE_GLOBAL" else "deletes"
        self.abort(f"{what} the global {name}")
        self._effect(f"{what} a global")
        if ins.opname == "STORE_GLOBAL":
            f.globals[name] = self._escaping(f.stack.pop()[0])
        else:
            try:
                del f.globals[name]
            except KeyError:
                raise NameError(f"name '{name}' is not defined") from None

    @_handles('DELETE_DEREF')
    def _op_DELETE_DEREF(self, f, ins):
        cell = f.locals[ins.arg][0]
        if id(cell) not in self.local_objs:
            self.abort("deletes a closure variable of an enclosing function")
            self._effect("deleting a closure variable")
        try:
            del cell.cell_contents
        except ValueError:
            raise NameError(f"cannot access free variable '{ins.argval}' where it is not associated with a "
                            "value in enclosing scope") from None

    @_handles('DELETE_SUBSCR')
    def _op_DELETE_SUBSCR(self, f, ins):  # del container[key]
        stack = f.stack
        key = self._popv(stack.pop)
        obj = self._popv(stack.pop)
        if id(obj) not in self.local_objs:
            self.abort("deletes an item of an object from outside the function")
            self._effect("deleting an item")
        del obj[key]

    @_handles('SET_UPDATE')
    def _op_SET_UPDATE(self, f, ins):  # {*a, *b}
        v = self._popv(f.stack.pop)
        f.stack[-ins.arg][0].update(v)

    @_handles('LOAD_BUILD_CLASS')
    def _op_LOAD_BUILD_CLASS(self, f, ins):
        """A class statement inside the function: builtins.__build_class__, which the CALL after
        it makes for real (the class body runs in CPython)."""
        b = f.globals.get("__builtins__", builtins)
        b = b if isinstance(b, dict) else b.__dict__
        if "__build_class__" not in b:
            raise NameError("__build_class__ not found")
        f.stack.append((b["__build_class__"], None))

    def _match_subject(self, p):
        """A match statement's subject: one from outside the call (sourced) ends the recording
        (the patterns read it in ways no guard here follows); the call goes on, matched for real."""
        if p[1] is not None:
            self.abort("a match statement on a value from outside the function")
        return p[0]

    @_handles('MATCH_MAPPING', 'MATCH_SEQUENCE')
    def _op_MATCH_MAPPING(self, f, ins):
        flag = _TPFLAGS_MAPPING if ins.opname == "MATCH_MAPPING" else _TPFLAGS_SEQUENCE
        v = self._match_subject(f.stack[-1])
        f.stack.append((bool(type(v).__flags__ & flag), None))

    @_handles('MATCH_KEYS')
    def _op_MATCH_KEYS(self, f, ins):
        """subject, keys -> subject, keys, a tuple of the values (None where a key is missing),
        read through the mapping's get() as CPython does."""
        keys = f.stack[-1][0]
        subject = self._match_subject(f.stack[-2])
        if not keys:
            f.stack.append(((), None))
            return
        if len(set(keys)) != len(keys):
            dup = next(k for i, k in enumerate(keys) if k in keys[:i])
            raise ValueError(f"mapping pattern checks duplicate key ({dup!r})")
        missing = object()
        get = subject.get
        values = []
        for k in keys:
            v = get(k, missing)
            if v is missing:
                f.stack.append((None, None))
                return
            values.append(v)
        f.stack.append((tuple(values), None))

    @_handles('MATCH_CLASS')
    def _op_MATCH_CLASS(self, f, ins):
        """subject, cls, keyword names -> a tuple of the matched attributes (positional ones by
        cls.__match_args__), or None: CPython's match_class."""
        stack = f.stack
        names = self._popv(stack.pop)
        cls = self._popv(stack.pop)
        subject = self._match_subject(stack.pop())
        stack.append((_match_class(subject, cls, ins.arg, names), None))

    @_handles('CHECK_EG_MATCH')
    def _op_CHECK_EG_MATCH(self, f, ins):
        """`except* T`: exc, T -> rest, match (the exception group split by T; a bare exception of
        type T wrapped in a group), the match becoming the exception handled; exc, None where
        nothing matches."""
        stack = f.stack
        match_type = self._popv(stack.pop)
        _check_except_star_type(match_type)
        exc = stack[-1][0]
        match, rest = _exception_group_match(exc, match_type)
        if match is None:
            stack.append((None, None))
            return
        stack[-1] = (rest, None)
        stack.append((match, None))
        self.handled_exc = match

    @_handles('PREP_RERAISE_STAR')
    def _op_PREP_RERAISE_STAR(self, f, ins):
        """After the except* clauses: the original group and the list of what each clause raised
        -> the one exception to raise (or None), as CPython's _PyExc_PrepReraiseStar builds it."""
        stack = f.stack
        excs = self._popv(stack.pop)
        orig = self._popv(stack.pop)
        stack.append((_prep_reraise_star(orig, excs), None))

    @_handles('BEFORE_WITH')
    def _op_BEFORE_WITH(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        mgr, msrc = pop()
        cls = type(mgr)
        if not hasattr(cls, "__enter__") or not hasattr(cls, "__exit__"):
            raise TypeError(f"'{cls.__name__}' object does not support the context manager protocol")
        if msrc is not None and self.recording:
            self.guards.guard(Source(f"type({msrc.expr})", msrc), cls)
        exit_ = cls.__exit__.__get__(mgr, cls)
        push((exit_, None))
        push(self.call((cls.__enter__.__get__(mgr, cls), msrc.attr("__enter__") if msrc else None), [], {}))

    @_handles('WITH_EXCEPT_START')
    def _op_WITH_EXCEPT_START(self, f, ins):
        stack = f.stack
        push = stack.append
        exc = stack[-1][0]
        push(self.call(stack[-4], [(type(exc), None), (exc, None), (exc.__traceback__, None)], {}))

    @_handles('IMPORT_NAME')
    def _op_IMPORT_NAME(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        fromlist = self._popv(pop)
        level = self._popv(pop)
        push(self._import(f, ins.argval, fromlist, level))

    @_handles('IMPORT_FROM')
    def _op_IMPORT_FROM(self, f, ins):
        stack = f.stack
        push = stack.append
        push(self._import_from(stack[-1], ins.argval))


    # cuts.py: branches on tensor values, numbers read from tensors, cuts and stitches
    _branch_on_tensor = cuts._branch_on_tensor
    _tensor_value = cuts._tensor_value
    _settle_items = cuts._settle_items
    _item_exit = cuts._item_exit
    _forget_read = cuts._forget_read
    _compare_item = cuts._compare_item
    _cut_for_grad = cuts._cut_for_grad
    _value_cut = cuts._value_cut
    _snapshot_at_start = cuts._snapshot_at_start
    _cut = cuts._cut
    _bucket_cut = cuts._bucket_cut
    _stitch = cuts._stitch
    _stitch_store = cuts._stitch_store
    _stitch_at = cuts._stitch_at


    def new_frame(self, code, fn, fn_src, glb):
        """A frame of code, to run from its first bytecode (or from a snapshot's, set on it)."""
        return _Frame(code, fn, fn_src, glb)

    @classmethod
    def unrecorded(cls):
        """An interpreter that records nothing: it runs the rest of a call after a side exit."""
        rec = Recorder("resume")
        rec.abort("running on after a side exit")
        return cls(rec, GuardSet())


_TPFLAGS_SEQUENCE, _TPFLAGS_MAPPING = 1 << 5, 1 << 6
# builtin types a class pattern with one positional sub-pattern matches as a whole (C(x): x is the subject)
_MATCH_SELF = (bool, bytearray, bytes, dict, float, frozenset, int, list, set, str, tuple)


def _match_class(subject, cls, nargs, names):
    """CPython's class pattern: None where subject is no instance of cls or lacks an attribute."""
    if not isinstance(cls, type):
        raise TypeError(bytecode.MATCH_NOT_A_CLASS)
    if not isinstance(subject, cls):
        return None
    seen, values = set(), []
    match_self = False
    if nargs:
        match_args = getattr(cls, "__match_args__", None)
        if match_args is None:
            match_self = issubclass(cls, _MATCH_SELF)
            match_args = ()
        elif type(match_args) is not tuple:
            raise TypeError(f"{cls.__name__}.__match_args__ must be a tuple (got {type(match_args).__name__})")
        allowed = 1 if match_self else len(match_args)
        if allowed < nargs:
            plural = "" if allowed == 1 else "s"
            raise TypeError(f"{cls.__name__}() accepts {allowed} positional sub-pattern{plural} ({nargs} given)")
        if match_self:
            values.append(subject)
        else:
            for name in match_args[:nargs]:
                if type(name) is not str:
                    raise TypeError(f"__match_args__ elements must be strings (got {type(name).__name__})")
                if name in seen:
                    raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
                seen.add(name)
                try:
                    values.append(getattr(subject, name))
                except AttributeError:
                    return None
    for name in names:
        if name in seen:
            raise TypeError(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        try:
            values.append(getattr(subject, name))
        except AttributeError:
            return None
    return tuple(values)


def _check_except_star_type(t):
    for c in (t if isinstance(t, tuple) else (t,)):
        if not (isinstance(c, type) and issubclass(c, BaseException)):
            raise TypeError("catching classes that do not inherit from BaseException is not allowed")
        if issubclass(c, BaseExceptionGroup):
            raise TypeError("catching ExceptionGroup with except* is not allowed. Use except instead.")


def _exception_group_match(exc, match_type):
    """(match, rest) of `except* match_type` on exc (CPython's exception_group_match)."""
    if exc is None:
        return None, None
    if isinstance(exc, match_type):
        if isinstance(exc, BaseExceptionGroup):
            return exc, None
        wrapped = BaseExceptionGroup("", [exc])
        if exc.__traceback__ is not None:
            wrapped.__traceback__ = exc.__traceback__
        return wrapped, None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(match_type)
    return None, None


def _leaf_ids(e, ids):
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            _leaf_ids(x, ids)
    else:
        ids.add(id(e))


def _prep_reraise_star(orig, excs):
    """What leaves a try with except* clauses: the exceptions the clauses raised anew, with the
    part of the original group they re-raised (the leaves kept, in the group's own shape)."""
    if not excs:
        return None
    if not isinstance(orig, BaseExceptionGroup):  # a bare exception was wrapped: one clause ran
        return excs[0]
    raised, reraised = [], []
    for e in excs:
        if e is None:
            continue
        # a part of orig re-raised keeps orig's cause, context and notes (split copies them; its
        # traceback grew here, where CPython's bare raise adds none); one raised anew has the
        # group being handled as its context
        same = (e.__cause__ is orig.__cause__ and e.__context__ is orig.__context__
                and getattr(e, "__notes__", None) is getattr(orig, "__notes__", None))
        (reraised if same else raised).append(e)
    reraised_eg = None
    if reraised:
        ids = set()
        for e in reraised:
            _leaf_ids(e, ids)
        reraised_eg = orig.split(lambda leaf: id(leaf) in ids)[0]
    if not raised:
        return reraised_eg
    if reraised_eg is not None:
        raised.append(reraised_eg)
    return BaseExceptionGroup("", raised) if len(raised) > 1 else raised[0]


class _As:
    """An instruction one handler hands another (3.12's BINARY_SLICE to BUILD_SLICE and
    BINARY_SUBSCR, 3.13's LOAD_FAST_LOAD_FAST to LOAD_FAST twice): the fields handlers read,
    the position taken from the instruction being run."""

    __slots__ = ("opname", "arg", "argval", "offset", "positions")

    def __init__(self, opname, arg, like=None, argval=None):
        self.opname, self.arg, self.argval = opname, arg, arg if argval is None else argval
        self.offset = like.offset if like is not None else None
        self.positions = like.positions if like is not None else None


_HANDLERS = {name: fn for fn in vars(Interpreter).values() if callable(fn) and hasattr(fn, "opnames")
             for name in fn.opnames}
_SUPPORTED = frozenset(_HANDLERS) | _SKIPPED


# Builtins that read the calling frame (Interpreter._frame_namespace).
_FRAME_READERS = (globals, locals, vars, dir, eval, exec)
# Builtin types whose __new__ a Python subclass's __new__ may call (super().__new__(cls, ...)).
_BUILTIN_BASES = (tuple, list, dict, set, frozenset, int, float, str, bytes)
_MODULE_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _module_key(m, key):
    """The child name m[key] reads (integer indexes count from the end when negative)."""
    names = list(m._modules)
    if isinstance(m, torch.nn.ModuleDict):
        return key
    if not isinstance(key, int) or not -len(names) <= key < len(names):
        raise IndexError(f"index {key} is out of range")
    return names[key]


_HOLDERS = (list, dict, set, tuple)  # what a dropped local may hold a generator in (_let_go)


def _realize(v, depth=0):
    """v with each interpreted generator in it (also inside lists, tuples and dicts) replaced by
    a real generator that delegates to it (next, send, throw and close pass through `yield
    from`), one per generator: for code outside the call, which sees CPython's type."""
    if isinstance(v, _Generator):
        real = v.real() if v.real is not None else None
        if real is None:
            real = _delegate(v)
            v.real = weakref.ref(real)  # (weak: the delegate holds v, and dropping it must drop v)
        return real
    if depth < 4 and type(v) is tuple:
        return tuple(_realize(e, depth + 1) for e in v)
    if depth < 4 and type(v) is list:
        v[:] = [_realize(e, depth + 1) for e in v]
    elif depth < 4 and type(v) is dict:
        for k in v:
            v[k] = _realize(v[k], depth + 1)
    return v


def _delegate(g):
    return (yield from g)


def _holds_generator(v, depth=0):
    if isinstance(v, _Generator):
        return True
    if depth < 4 and type(v) in (list, tuple, set, frozenset):
        return any(_holds_generator(e, depth + 1) for e in v)
    if depth < 4 and isinstance(v, dict):
        return any(_holds_generator(e, depth + 1) for e in v.values())
    return False


class _Returned(tuple):
    """A generator frame's return (value, source) pair, carried by its StopIteration."""

    __slots__ = ()


class _Yielded:
    """What a generator frame's run returns at YIELD_VALUE: the (value, source) pair."""

    __slots__ = ("pair",)

    def __init__(self, pair):
        self.pair = pair


def _suspended_in_block(f):
    """Generator frame f is suspended at a yield inside a try or with block (closing it runs code)."""
    return bool(f.dec.handlers) and f.dec.catches_at(f.dec.insts[f.ip - 1].offset, cleanup=_CLOSE_RUNS_NOTHING)


def _plain_stop(step, *args):
    """step(*args), a generator's step for the program: the StopIteration at its end carries the
    return value itself (inside the interpreter it carries the (value, source) pair)."""
    try:
        return step(*args)
    except StopIteration as e:
        if not isinstance(e.value, _Returned):
            raise
        value = e.value[0]
    raise StopIteration(value)  # (outside the handler: no context, as CPython's has none)


class _Generator:
    """A generator whose frame the interpreter runs: each next() resumes it under recording
    (its reads are guarded, its tensor ops recorded), lazily as CPython's would, so that all(),
    any(), zip() and early breaks stop it exactly where eager stops. Iterated by the
    interpreter (FOR_ITER) it hands out (value, source) pairs; by a builtin, plain values.
    throw() and close() raise into the suspended frame as CPython's do; a StopIteration that
    leaves the body becomes RuntimeError (PEP 479); resuming it from itself raises ValueError.
    The program sees it as a generator (type(), isinstance: Interpreter._call_introspection)."""

    __slots__ = ("interp", "frame", "done", "started", "running", "real", "__weakref__")

    def __init__(self, interp, frame):
        self.interp, self.frame, self.done, self.started, self.running = interp, frame, False, False, False
        self.real = None  # a weak reference to the real generator standing for it outside the call (_realize)

    # isinstance(g, types.GeneratorType) and inspect.isgenerator, asked by code that is not interpreted
    __class__ = property(lambda self: types.GeneratorType)

    def __del__(self):
        """The last reference is gone: as CPython closes a generator it collects, closing runs
        the finally or __exit__ it is suspended in, there and then, recorded like any code (an
        exception from it is dropped, as CPython reports and ignores one)."""
        self.interp.local_objs.discard(id(self))
        if self.started and not self.done and not self.running and _suspended_in_block(self.frame):
            try:
                self.close()
            except BaseException:  # noqa: BLE001 -- see above
                pass

    def _resume(self, thrown=None, sent=(None, None)):
        if self.running:
            raise ValueError("generator already executing")
        if thrown is None and self.started:
            self.frame.stack.append(sent)  # the value sent in (next(): None)
        self.frame.thrown = thrown
        self.started = True
        self.running = True
        try:
            r = self.interp._run_frame(self.frame)
        except StopIteration as e:  # PEP 479: a StopIteration leaving the body is an error
            self.done = True
            err = RuntimeError("generator raised StopIteration")
            err.__cause__ = e
            raise err
        except BaseException:
            self.done = True
            raise
        finally:
            self.running = False
        if isinstance(r, _Yielded):
            return r.pair
        self.done = True
        raise StopIteration(_Returned(r))  # the frame's (value, source), for `yield from`

    def next_pair(self):
        if self.done:
            raise StopIteration
        return self._resume()

    def throw_pair(self, exc, value=None, tb=None):
        if isinstance(exc, type):  # throw(type[, value[, traceback]]), as contextlib calls it
            exc = value if isinstance(value, exc) else exc() if value is None else exc(value)
        if tb is not None:
            exc = exc.with_traceback(tb)
        if self.done or not self.started:  # raised at once: the body never runs (again)
            self.done = True
            raise exc
        return self._resume(thrown=exc)

    def __iter__(self):
        return self

    def __next__(self):
        return _plain_stop(self.next_pair)[0]

    def send_pair(self, pair):
        if pair[0] is not None and not self.started:
            raise TypeError("can't send non-None value to a just-started generator")
        if self.done:
            raise StopIteration
        return self._resume(sent=pair)

    def send(self, value):
        return _plain_stop(self.send_pair, (value, None))[0]

    def throw(self, exc, value=None, tb=None):
        return _plain_stop(self.throw_pair, exc, value, tb)[0]

    def close(self):
        if self.done or not self.started:
            self.done = True
            return
        try:
            self.throw_pair(GeneratorExit())
        except (GeneratorExit, StopIteration):
            return
        raise RuntimeError("generator ignored GeneratorExit")


# A real generator: what type() and isinstance() answer about an interpreted one (_Generator).
_GENERATOR_LIKE = (lambda: (yield))()
_GENERATOR_LIKE.close()


def release(rec, interp):
    """Drops what a finished recording holds (the call's tensors, frames and stacks), so that a
    caller's `del x` frees x without waiting for the garbage collector (the recorder and the
    interpreter refer to each other)."""
    rec.keep = []
    rec.input_tensors = []
    rec.vals = {}
    rec.view_of, rec.views, rec.poison = {}, {}, {}
    rec.snapshot_here = None
    interp.keep = []
    interp.input_objs = {}
    interp._start = None
    interp.run_args = ()


def signature_text(fn):
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
