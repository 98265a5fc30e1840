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

The rest of the interpreter's work lives with collaborators, functions that take the
interpreter as their first argument and are bound as its methods (none imports this module):
calls.py (a call, by the kind of callable; what cannot be recorded; argument binding),
sources.py (where values come from: guards, trace inputs, attributes, globals), cuts.py (branches
on tensor values, numbers read from tensors, cuts, stitches) and generators.py (the call's
generators). This module keeps the frames, the loop and the bytecode handlers.

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
import os
import re
import sys
import types
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode, _pop_mode_temporarily

from . import bytecode, calls, config, cuts, snapshot, sources
from .cuts import _COMPARE
from .generators import _HOLDERS, _realize, _holds_generator, _Returned, _Yielded, _suspended_in_block, _Generator, _GENERATOR_LIKE, _CLEANUP_OPS
from .sources import _DICTS, _has_hooks, runs_class_forward
from .frames import CO_GENERATOR, NULL as _NULL, Abort, DataDependentStep, NopythonError, StitchNow  # noqa: F401
from .frames import NoSnapshot, ProbeStop, SourcedIter as _SourcedIter, is_torch_callable as _is_torch_callable
from .frames import ItemRead, plain_class as _plain_class
from .guards import _BY_VALUE, ARG, FUNC, GLOBALS, KWARG, GuardSet, Source, plain, structural, structural_dict
from .recorder import Recorder
from .sizeflow import SizeFlow

# tensors a Python number meets in + - * / as a scalar input (a size probe's are fakes, probe.py)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter, FakeTensor)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # frames of dynamo's own code
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
               "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "CACHE", "COMPARE_OP", "LOAD_FAST_LOAD_FAST",
               "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "LOAD_FAST_AND_CLEAR", "PUSH_NULL_BELOW"}

_SCALAR_MOVES = {"LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL", "NOP",
                 "RESUME", "PRECALL", "EXTENDED_ARG", "KW_NAMES", "STORE_FAST", "POP_TOP", "COPY", "SWAP",
                 "BINARY_OP", "CALL", "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "CACHE",
                 "CALL_KW", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST",
                 "LOAD_FAST_AND_CLEAR", "PUSH_NULL_BELOW"}

# Bytecodes that may run torch operations (their start is where an op of data-dependent output
# size resumes).
_MAY_CALL_TORCH = {"CALL", "CALL_KW", "CALL_FUNCTION_EX", "BINARY_OP", "BINARY_SUBSCR", "COMPARE_OP", "UNARY_NEGATIVE",
                   "UNARY_INVERT", "CONTAINS_OP"}


def _bounded_dims(key, sizes):
    """{dim: (start, stop, step) as polynomials} of the dims of x[key] whose slice has a bound
    (x[:, :, -n:, :] -> {2: (-n, None, None)}), where key is plain slices and ints (sizes: the
    interpreter's SizeFlow, which knows the bounds Python computed from sizes); None for
    anything else (Ellipsis, None, tensors, lists: every dim)."""
    items = key if type(key) is tuple else (key,)
    out, d = {}, 0
    for k in items:
        if type(k) is slice:
            if k.start is not None or k.stop is not None or k.step is not None:
                out[d] = sizes.slice_bound(k)
        elif type(k) is not int:
            return None
        d += 1
    return out


def _stable_key(k):
    """Whether k hashes and compares the same on every call: a class, a string, a number."""
    return isinstance(k, type) or type(k) in (str, int, bool, type(None))


# The bytecodes the interpreter runs: those of its _op_ handlers (_HANDLERS, after the class) and
# the ones it skips; generators (genexprs, `yield`, `yield from` driven by next()); try/except/finally
# and with blocks through the exception table; imports of modules already loaded.
_SKIPPED = frozenset(("NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "CACHE"))


MAX_STEPS = 200_000
# instructions that read a local slot named by their argument (cells included: their slot holds
# the cell), and the builtins that read a frame's locals as a whole
_LOCAL_READS = frozenset(("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "MAKE_CELL",
                          "LOAD_CLOSURE", "LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLASSDEREF",
                          "LOAD_FROM_DICT_OR_DEREF"))
_SINGLETONS = (type(None), bool, type(Ellipsis), type(NotImplemented))
_HOLDERS_OF_OBJECTS = (list, tuple, dict, set, frozenset, collections.OrderedDict, collections.defaultdict)
_FRAME_READERS = frozenset(("locals", "vars", "dir", "eval", "exec", "super", "globals"))


class _Code:
    """Decoded instructions of a code object, cached."""

    __slots__ = ("insts", "index", "unsupported", "names", "handlers", "_unread")
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
        self._unread = {}

    def unread_from(self, k):
        """The local slots that no instruction reachable from instruction k reads (a snapshot
        resuming at k may leave them unbound: nothing after it sees them). Reachability is taken
        wide: every instruction may fall through, every jump and exception handler is followed;
        any read of the frame as a whole (locals(), vars(), dir(), eval, exec, zero-argument
        super()) keeps every slot. An empty set when unsure."""
        got = self._unread.get(k)
        if got is None:
            got = self._unread[k] = self._find_unread(k)
        return got

    def _find_unread(self, k):
        n, insts, index = len(self.names), self.insts, self.index
        read, seen, todo = set(), set(), [k]
        while todo:
            j = todo.pop()
            if j in seen or j >= len(insts):
                continue
            seen.add(j)
            ins = insts[j]
            op = ins.opname
            if op in _LOCAL_READS:
                read.add(ins.arg)
            elif op == "LOAD_FAST_LOAD_FAST":
                read.update((ins.arg >> 4, ins.arg & 15))
            elif op == "STORE_FAST_LOAD_FAST":
                read.add(ins.arg & 15)
            elif op in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in _FRAME_READERS:
                return frozenset()
            todo.append(j + 1)
            if "JUMP" in op or op in ("FOR_ITER", "SEND"):
                t = index.get(ins.argval) if type(ins.argval) is int else None
                if t is None:
                    return frozenset()
                todo.append(t)
            h = self.handler_at(ins.offset)
            if h is not None:
                todo.append(index[h[2]])
        return frozenset(range(n)) - read

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


def _without_own_frames(tb):
    """Traceback tb without the frames of dynamo's own code: an exception the program catches
    holds no interpreter frame (which would hold the call's frames and generators alive, in a
    cycle, past where eager frees them)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    for a, b in zip(kept, kept[1:] + [None]):
        a.tb_next = b
    return kept[0] if kept else None


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
        self.abandoned = False    # the call is made again eagerly: the recording's generators close silently
        self.generators = weakref.WeakSet()  # the call's generators (_Generator): closed when dropped, as CPython's
        self.grad_at_start = torch.is_grad_enabled()  # `with torch.no_grad():` inside changes it for a while
        self.run_args = ()        # the call's positional arguments (run)
        self.depth = 0
        self.inlined = []         # qualified names of inlined callees, for explain()
        self._tuple_srcs = {}     # id(tuple) -> element sources (*args, tuples built from sourced values)
        self._dict_srcs = {}      # id(dict) -> {key: (source, value)} (**kwargs, merged from it): see dict_srcs
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
        # write-backs: attributes the call sets on plain data objects from outside it, made by
        # the trace after its native run (source of the object, name, value); `written` has
        # (id(object), name) of each: a read of one gives the value the call set, not a source
        self.writebacks = []
        self.written = set()
        self.obj_srcs = {}        # id(object read from a source, not a tensor) -> (object, its first source)
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
        self.probe_branches = []  # ... the branches on tensors its recorded trace took, in order
        self.probe_writes = {}    # ... the write-backs it made: (id(obj), name) -> value (not set)
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

    def dict_srcs(self, d):
        """{key: source} of the values of dict d (a **kwargs dict, one merged or copied from it, a
        snapshot's) whose source still holds: the value is the very object it was when its source
        was noted. An item the call assigned anew or removed has none, so that it is never read back
        through the argument it replaced."""
        noted = self._dict_srcs.get(id(d))
        if not noted:
            return {}
        return {k: s for k, (s, v) in noted.items() if s is not None and d.get(k, _NULL) is v}

    def note_dict_srcs(self, d, srcs):
        """Notes {key: source} for dict d's current values (d is kept: ids are the keys)."""
        if srcs:
            noted = self._dict_srcs.setdefault(id(d), {})
            for k, s in srcs.items():
                if k in d:
                    noted[k] = (s, d[k])
            self.keep.append(d)

    def _write_back(self, f, name):
        """obj.name = v (the top two of f's stack) on a plain data object from outside the call,
        read from a source (a Hugging Face cache layer: `self.keys = torch.cat([self.keys, k])`):
        made now, as eager makes it, and again by the trace after each native run, with the
        trace's tensor or the constant (a write-back; the value must be a tensor of the trace or
        a plain value, else False: the store ends the trace as before). The rest of the call
        reads obj.name as the value set (load_attr: no source), and no side exit, stitch or cut
        may follow in this trace (snapshot.take: their snapshots do not carry write-backs)."""
        (obj, osrc), (v, _) = f.stack[-1], f.stack[-2]
        if osrc is None or not self.recording or not config.write_backs or not structural(obj) or \
                not (isinstance(v, torch.Tensor) or plain(v)) or self.grad_at_start:
            return False
        raw = sources._static_lookup(type(obj), name)
        if raw is not None and hasattr(type(raw), "__set__"):  # a property or slot: not a plain store
            return False
        f.stack.pop()
        f.stack.pop()
        if self.probe is not None:  # (a probe acts on nothing: the rest of it reads the value from here)
            self.probe_writes[(id(obj), name)] = v
        else:
            self._effect(f"setting attribute {name}")
            setattr(obj, name, v)
        self.writebacks.append((osrc, name, v))
        self.written.add((id(obj), name))
        self.keep.append(obj)
        return True

    def _item_write_back(self, f):
        """d[key] = v (the top three of f's stack) into a dict from outside the call read from a
        source (Hugging Face's EncoderDecoderCache.is_updated[layer] = True), key a plain
        constant, v a trace tensor or a plain value: made now and again after each native run,
        as an attribute write-back is (_write_back). False: the store ends the trace as before."""
        (key, _), (d, dsrc), (v, _) = f.stack[-1], f.stack[-2], f.stack[-3]
        if dsrc is None or type(d) not in _DICTS or not _stable_key(key) or not self.recording or \
                not config.write_backs or not (isinstance(v, torch.Tensor) or plain(v)) or self.grad_at_start:
            return False
        if self.probe is not None:
            raise ProbeStop("item assignment into a dict from outside the function")
        self._effect("item assignment")
        del f.stack[-3:]
        d[key] = v
        self.writebacks.append((dsrc, ("item", key), v))
        self.written.add((id(d), ("item", key)))
        self.keep.append(d)
        return True

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

    # calls.py: calls by the kind of callable, what cannot be recorded, argument binding
    unsupported_reason = staticmethod(unsupported_reason)
    call = calls.call
    _call_reading_state = calls._call_reading_state
    _call_python_code = calls._call_python_code
    _call_introspection = calls._call_introspection
    _call_torch = calls._call_torch
    _frame_namespace = calls._frame_namespace
    _call_builtin = calls._call_builtin
    _call_object = calls._call_object
    _make_partial = calls._make_partial
    _partial_sources = calls._partial_sources
    _from_data = calls._from_data
    _instantiate = calls._instantiate
    _sourced_view = calls._sourced_view
    _super_args = calls._super_args
    _call_python = calls._call_python
    _concrete = calls._concrete
    _opaque = calls._opaque
    _mode_read = calls._mode_read
    _outside_recorder = calls._outside_recorder
    _bind = calls._bind


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
                e.__traceback__ = _without_own_frames(e.__traceback__)
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
        """(value, source) pairs the trace depends on by identity (GuardSet.pin), and what the
        call's own containers among them hold (_pin_held)."""
        if self.guards._structural:
            for v, s in pairs:
                self.guards.pin(s, v)
                if type(v) in _HOLDERS_OF_OBJECTS:
                    self._pin_held(v)

    def _pin_held(self, v, depth=0):
        """The objects a list, tuple, dict or set of the call's holds, pinned (GuardSet.pin finds
        where each was read): building a container drops its elements' sources, and the trace
        depends on which objects they are only where the container is compared, searched or
        handed to a builtin, which pin them here."""
        if not self.guards._structural or depth > 3 or (id(v) not in self.local_objs and type(v) is not tuple):
            return
        for x in (v.values() if isinstance(v, dict) else v):
            if type(x) in _HOLDERS_OF_OBJECTS:
                self._pin_held(x, depth + 1)
            else:
                self.guards.pin(None, x)

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
            if r is not self.keep and not (type(r) is types.FrameType and r.f_code.co_filename.startswith(_PACKAGE_DIR)):
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
        if id(stack[-1][0]) not in self.local_objs and self._write_back(f, ins.argval):
            return
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
            srcs = self.dict_srcs(d)
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
        if type(a[0]) not in _SINGLETONS and type(b[0]) not in _SINGLETONS:
            self._pin(a, b)  # (`x is None` is decided by x's class, which its guard checks)
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
        if b[1] is not None and (type(b[0]) in _DICTS + (set, frozenset) or structural_dict(b[0])) and \
                _stable_key(a[0]):
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
            if type(b[0]) in (list, tuple):  # (compared element by element; a dict or set hashes keys, pinned when stored)
                self._pin_held(b[0])
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
        if isinstance(obj, torch.Tensor) and self.recording:
            self.rec.alias_dims = _bounded_dims(key[0], self.sizes)
            self.rec.alias_guard = self.sizes.alias_guard
            try:
                v = obj[self._tensor_index(obj, key[0])]
            finally:
                self.rec.alias_dims = None
        else:
            v = obj[self._tensor_index(obj, key[0])]
        src = None
        if self.written and type(obj) in _DICTS and _stable_key(key[0]) and (id(obj), ("item", key[0])) in self.written:
            push((v, None))  # set by this call (a write-back): what the trace made, not the argument's
            return
        if osrc is not None and type(obj) in (list, tuple) and type(key[0]) is int:
            src = osrc.item(key[0])
        elif osrc is not None and type(obj) in _DICTS:
            src = self._item_src(osrc, key[0])
        elif type(obj) in _DICTS and id(obj) in self._dict_srcs:  # kwargs['scale'] of a **kwargs dict
            src = self.dict_srcs(obj).get(key[0])
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
            if self._item_write_back(f):
                return
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
        v, vsrc = pop()
        if id(obj) not in self.local_objs:
            v = self._escaping(v)  # (as in STORE_ATTR)
        elif vsrc is not None and type(obj) in _DICTS and id(obj) in self._dict_srcs:
            self._dict_srcs[id(obj)][key[0]] = (vsrc, v)
        if isinstance(obj, torch.Tensor) and isinstance(v, (bool, int, float)) and self.recording:
            # x[k] = number: the 0-dim tensor torch makes of the number (in x's dtype, as
            # Tensor.__setitem__ does) is made here by a traced op instead of from Python
            # data, so the write is recorded; the number is a constant or a guarded value.
            v = torch.scalar_tensor(v, dtype=obj.dtype, device=obj.device)
        if isinstance(obj, torch.Tensor) and self.recording:  # (as a read's index: BINARY_SUBSCR)
            self.rec.alias_dims = _bounded_dims(key[0], self.sizes)
            self.rec.alias_guard = self.sizes.alias_guard
            try:
                obj[self._tensor_index(obj, key[0])] = v
            finally:
                self.rec.alias_dims = None
            return
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
        lst = self._mark_local([v for v, _ in items])  # (its elements pinned where it is compared or handed on)
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
        keys, values = items[0::2], items[1::2]
        self._pin(*keys)  # (hashed; the values are pinned where the dict is compared or handed on: _pin_held)
        d = self._mark_local({k: v for (k, _), (v, _) in zip(keys, values)})
        self.note_dict_srcs(d, {k: s for (k, _), (_, s) in zip(keys, values) if s is not None and type(k) is str})
        push((d, None))

    @_handles('BUILD_CONST_KEY_MAP')
    def _op_BUILD_CONST_KEY_MAP(self, f, ins):
        stack = f.stack
        push, pop = stack.append, stack.pop
        arg = ins.arg
        keys = self._popv(pop)
        items = stack[len(stack) - arg:]
        del stack[len(stack) - arg:]
        d = self._mark_local(dict(zip(keys, (v for v, _ in items))))
        self.note_dict_srcs(d, {k: s for k, (_, s) in zip(keys, items) if s is not None and type(k) is str})
        push((d, None))

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
        d = stack[-arg][0]
        srcs = self.dict_srcs(v) if type(v) in _DICTS else {}
        if s is not None and type(v) in _DICTS:
            self.touch(v, s)  # (its class and keys)
            srcs = {k: self._item_src(s, k) for k in v}
        elif not srcs:
            self.touch_deep(v, s)
        if op == "DICT_MERGE":
            dup = set(d) & set(v)
            if dup:
                raise TypeError(f"got multiple values for keyword argument '{next(iter(dup))}'")
        d.update(v)
        if srcs and type(d) in _DICTS and id(d) in self.local_objs:
            # f(**kwargs), {**kwargs}: each value keeps its source, guarded where it is read (a value
            # read from nowhere would be a constant of the trace, unguarded)
            self.note_dict_srcs(d, srcs)

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
        v, s = pop()
        if s is not None and not op.endswith("NONE") and (hasattr(type(v), "__bool__") or hasattr(type(v), "__len__")):
            self._pin((v, s))  # (None-ness, or the truth of an object without __bool__ or __len__: its class says)
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
    positional = [] if match_self or not nargs else list(match_args[:nargs])
    for i, name in enumerate(positional + list(names)):
        if i < len(positional) and type(name) is not str:
            raise TypeError(f"__match_args__ elements must be strings (got {type(name).__name__})")
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


_MODULE_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _module_key(m, key):
    """The child name m[key] reads (integer indexes count from the end when negative)."""
    names = list(m._modules)
    if isinstance(m, torch.nn.ModuleDict):
        return key
    if not isinstance(key, int) or not -len(names) <= key < len(names):
        raise IndexError(f"index {key} is out of range")
    return names[key]


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
    # the exceptions the call met hold tracebacks through its frames (a generator's, a
    # generator itself): dropped, the call's generators go when the program drops them
    interp._exc_seen = {}
    interp.handled_exc = None
    # objects from outside, and the values a call's dicts held (kept to tell whether a source
    # still holds): a generator among them would be closed only when the recording is collected
    interp.obj_srcs = {}
    interp._dict_srcs = {}
    interp.writebacks = []
    interp.written = set()
    # (the guards stay with the trace; the objects they guarded by class are the call's)
    interp.guards._structural = {}
    interp.guards._structural_at = {}


def signature_text(fn):
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"
