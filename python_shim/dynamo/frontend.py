"""dynamo.optimize and friends: per-function trace caches, the call path, counters, explain.

One call of an optimized function:

  1. for each compiled trace of the function (newest last): its Python guards fetch the tensor
     inputs (or say no), then libdynamo checks tensor metadata natively and runs it, with
     outputs allocated from the engine's recycled buffers;
  2. on a miss everywhere: if the function is hot (config.hot_threshold calls) and under its
     cache limit, the recording interpreter runs the call for real and records a trace, which
     is compiled for the next call; otherwise CPython runs it.

A call never returns anything eager PyTorch would not: anything we cannot record soundly ends
the recording (the call still completes in the interpreter), and the reason is kept for
dynamo.explain and the --report of `python -m dynamo`.
"""
import atexit
import collections
import copy
import ctypes
import functools
import os
import sys
import threading
import time
import types
import warnings
import weakref

import torch

from . import _capi, config, native, reasons, snapshot, store
from .log import enabled as log_enabled, log
from ._capi import DynamoError
from .guards import EXIT, TORCH_STATE_TEXT, GuardSet, Source, torch_state
from .interpreter import Interpreter, StitchNow, unsupported_reason
from .recorder import Abort, NopythonError, Recorder

_COUNTER_NAMES = ("calls", "native_runs", "interpreted_runs", "eager_runs", "traces_compiled",
                  "side_traces_compiled", "guard_misses", "side_exits", "exits_resumed", "aborts", "recompiles",
                  "compile_failures", "verify_failures", "cache_hits", "compile_seconds", "stitches",
                  "stitch_traces", "traces_from_store") + reasons.COUNTERS
_counters = dict.fromkeys(_COUNTER_NAMES, 0)
_counters["compile_seconds"] = 0.0
_engine = None
_registry = []     # weak references to every OptimizedFunction, for reset() and the report
_GUARD_MISS = 6    # DYNAMO_ERR_GUARD_MISS
_compiled_by_entry = {}  # native entry handle (int) -> Compiled
EAGER = object()   # OptimizedFunction.call from the frame hook: "let CPython run this frame"
_MISS = object()   # no trace accepted the call
_NEXT = object()   # this trace did not (its native guards), try the next
_CHOICES_AT = (3, 12)  # native runs after which a stored trace's step choices are saved


def _store_choices_at_exit():
    """A process that ends before a stored trace's 3rd native run still leaves what its steps
    chose (a short script's next run then skips the timing calls too)."""
    for f in _all():
        for c in f.compiled:
            if c.store_id is not None and c.runs:
                f._store_choices(c)


atexit.register(_store_choices_at_exit)


def _all():
    """The OptimizedFunctions alive now, oldest first (a deep copy or a loaded module that is
    dropped is not kept alive by this list)."""
    live = [r() for r in _registry]
    if None in live:
        _registry[:] = [r for r, f in zip(_registry, live) if f is not None]
    return [f for f in live if f is not None]


def _unlist(of):
    _registry[:] = [r for r in _registry if r() is not of]


def counters():
    """A copy of the global counters (reset by dynamo.reset()). side_exits counts every failing
    mid-trace guard, including those a natively linked side trace took over; abort_<kind> counts
    aborts by their reason's row in reasons.KINDS (dtype, python, data_dependent, ...)."""
    c = dict(_counters)
    c["side_exits"] += sum(t.exits_taken() for f in _all() for t in f.compiled)
    return c


def _bump(name, by=1):
    _counters[name] += by


_gpu_engines = {}  # torch.device -> native.Engine


def engine(device=None):
    """The CPU engine, or the CUDA engine of `device` (raises DynamoError without a GPU)."""
    global _engine
    if device is not None:
        if device not in _gpu_engines:
            _gpu_engines[device] = native.Engine(device)
        return _gpu_engines[device]
    if _engine is None:
        _engine = native.Engine()
    return _engine


class _NoCode:
    """The stats of a trace with no native code (guards, then a stitch)."""
    num_kernels = num_externs = num_instructions = from_cache = 0
    compile_ms = 0.0


class Compiled:
    """One compiled trace: its guards, the native entry, and how to rebuild the result. entry is
    None for a trace that recorded nothing before a stitch: its guards pick the path, and the
    call goes straight to the stitch."""

    def __init__(self, guards, text, entry, out_spec, input_srcs, ops, inlined, exits=()):
        self.guards = guards
        self.exits = list(exits)  # Snapshot per side exit id
        self.check = guards.compile()
        self.text = text
        self.entry = entry
        self.handle = entry.handle if entry is not None else None
        self.out_spec = out_spec
        self.ops = ops
        self.inlined = inlined
        self.input_srcs = input_srcs
        specs = entry.output_specs() if entry is not None else []
        self.nout = len(specs)
        self.shapes = [s for _, s in specs]
        self.aliases = entry.output_aliases() if entry is not None else []
        self.has_alias = any(a is not None for a in self.aliases)
        self._ptrs_type = ctypes.c_void_p * max(self.nout, 1)
        self.stats = entry.stats() if entry is not None else _NoCode()
        self.runs = 0
        self.num_native_exits = len(self.exits)
        self.cut_id = None        # a trace cut at config.max_trace_ops: its snapshot's index in exits
        self.store_id = None      # kept in the trace store (store.py) under this id
        self.store_where = None   # ... at this place (store.where: the code and call signature)
        self.stored_choices = ""  # the step choices stored with it
        self.from_store = False   # loaded from the store (recorded by an earlier process)
        self.root = self          # the root trace of a side-trace tree
        self.side_count = 0       # roots: side traces compiled under this root (all depths)
        self.mutates = False      # the trace writes into its inputs (copy_)
        self.stitch_count = 0     # roots: continuation traces after stitches under this root
        if self.handle is not None:
            _compiled_by_entry[self.handle.value] = self

    def mutates_any(self):
        """Does this trace, or a side trace under it, write into the call's tensors?"""
        return self.mutates or any(side.mutates_any() for snap in self.exits for side in snap.sides)

    def exits_taken(self):
        """Times this trace's guards failed (natively counted), its side traces' included."""
        L = native.lib()
        n = sum(L.dynamo_entry_exit_count(self.handle, k) for k in range(self.num_native_exits))
        return n + sum(side.exits_taken() for snap in self.exits for side in snap.sides)

    def run(self, inputs):
        """Runs natively; returns the flat outputs, or None on a native guard miss."""
        if self.handle is None:
            self.runs += 1
            return []
        fast = _fastcall()
        if fast is not None:
            outs = fast.run(self.handle.value, inputs, self.nout)
            if outs is None:
                return None
            if type(outs) is int:
                if outs == _capi.STATUS_EXIT:
                    return _side_exit()
                native._check(outs)
            if self.has_alias:
                outs = list(outs)
                for k, alias in enumerate(self.aliases):
                    if alias is not None:
                        src = inputs[alias[0]]
                        outs[k] = src.as_strided(self.shapes[k], alias[2], src.storage_offset() + alias[1])
            self.runs += 1
            return outs
        try:
            args, keep = native.make_args(inputs)
        except TypeError:  # a dtype no trace takes (complex, quantized): a guard miss, as natively
            return None
        ptrs = self._ptrs_type()  # per call: the same trace may run on several threads
        st = native.lib().dynamo_entry_run_alloc(self.handle, args, len(inputs), ptrs, self.nout)
        if st == _GUARD_MISS:
            return None
        if st == _capi.STATUS_EXIT:
            return _side_exit()
        if st != 0:
            native._check(st)
        outs = native.collect_outputs(ptrs, self.aliases, self.shapes, inputs)
        self.runs += 1
        return outs


class SideExit:
    """A run that left a trace at a data-dependent branch: the entry that left (a linked side
    trace's, perhaps), the exit id and its live values."""

    __slots__ = ("entry", "id", "values")

    def __init__(self, entry, exit_id, values):
        # dense, as the snapshot's views of them ("liveview") and side traces' guards expect
        self.entry, self.id, self.values = entry, exit_id, [t.contiguous() for t in values]


def _side_exit():
    entry = native.lib().dynamo_exit_entry()  # before take_exit, which ends the pending exit
    return SideExit(entry, *native.take_exit())


_fast = False


def _fastcall():
    """The native hot path (build/python/_fastcall*.so), or None: then ctypes does the call."""
    global _fast
    if _fast is False:
        try:
            from . import _ext
            _fast = _ext.load("_fastcall")
        except ImportError as e:
            print(f"dynamo: the native call path is unavailable ({e}); calls go through ctypes "
                  f"(tens of microseconds more per tensor input: milliseconds per call for a model)", file=sys.stderr)
            _fast = None
    return _fast


def _flatten_result(result, rec, input_index):
    """(spec, list of IR output names) for a return value; tensors must be trace values, or
    trace inputs: input_index maps id(tensor) -> input slot, and a returned input is the very
    object the call was given (a Parameter stays a Parameter, an input written in place is the
    same object), as eager returns it."""
    names = []

    def walk(v):
        if isinstance(v, torch.Tensor) and id(v) in input_index:
            return ("I", input_index[id(v)])
        if isinstance(v, torch.Tensor):
            n = rec.output_name(v)
            if n is None:
                raise Abort("returns a tensor that was not recorded", "result")
            if n not in names:  # the same tensor returned twice stays one tensor
                names.append(n)
            return ("T", names.index(n))
        if type(v) in (tuple, list):
            return (type(v).__name__, [walk(x) for x in v])
        if type(v) in (dict, collections.OrderedDict):  # (segmentation models return an OrderedDict)
            return (type(v).__name__, list(v.keys()), [walk(x) for x in v.values()])
        if v is None or type(v) in (bool, int, float, str, torch.dtype, torch.Size):
            return ("C", v)
        raise Abort(f"returns a {type(v).__name__}", "result")

    return walk(result), names


def _rebuild(spec, outs, inputs):
    """The return value from its spec, the trace's outputs and the call's input tensors."""
    kind = spec[0]
    if kind == "T":
        return outs[spec[1]]
    if kind == "I":
        return inputs[spec[1]]
    if kind == "C":
        return spec[1]
    if kind == "tuple":
        return tuple(_rebuild(s, outs, inputs) for s in spec[1])
    if kind == "list":
        return [_rebuild(s, outs, inputs) for s in spec[1]]
    pairs = ((k, _rebuild(s, outs, inputs)) for k, s in zip(spec[1], spec[2]))
    return collections.OrderedDict(pairs) if kind == "OrderedDict" else dict(pairs)


class Attempt:
    """What one recording did: the trace (or why there is none)."""

    def __init__(self, reason, compiled=None, ops=(), inlined=(), where=None):
        self.reason = reason
        self.where = where        # "file:line" where an aborted recording stopped, when known
        self.compiled = compiled
        self.ops = list(ops)
        self.inlined = list(inlined)


class OptimizedFunction:
    dynamo_optimized_forward = True  # what interpreter.runs_class_forward looks for

    def __init__(self, fn, nopython=False, owner=None):
        self.fn = fn
        self.owner = owner        # the module, for optimized nn.Module.forward
        self.nopython = nopython
        self.compiled = []
        self.attempts = []
        self.calls = 0
        self.retry_at = 0         # calls before which recording is not tried (back-off)
        self.disabled_reason = None
        self.state_fallbacks = {}  # _call_state() -> (why, kind): recorded in that state, it aborted for it
        self.frames = {}          # device (None: CPU) -> native.Frame
        self.stored = {}          # call signature -> traces from the store not yet loaded
        self.parts = None         # left to CPython: the submodules compiled apart (_compile_parts)
        self._left_at = None      # left to CPython: (calls then, config then, calls until a new try)
        self._comebacks = 0       # tries since (each waits 4x longer)
        self._abort_base = 0      # aborts before the last try (abort_limit counts those after)
        self._recording_where = None
        self.name = getattr(fn, "__qualname__", "fn")
        functools.update_wrapper(self, fn)
        _registry.append(weakref.ref(self))

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self):
        """Pickles (and copies) no compiled state: a module-level optimized function by reference,
        anything else as a fresh, uncompiled OptimizedFunction of the same function and module."""
        if self.owner is None and _is_global(self):
            return self.__qualname__
        return type(self), (self.fn, self.nopython, self.owner)

    def __deepcopy__(self, memo):
        """A deep copy of an optimized module gets its own fresh OptimizedFunction (its traces'
        guards check the module's identity); a plain function's copies as itself, like functions."""
        if self.owner is None:
            return self
        owner = copy.deepcopy(self.owner, memo)
        made = memo.get(id(self))  # copying the owner copied its forward, this object
        return made if made is not None else type(self)(self.fn, self.nopython, owner)

    def _plain_owner(self):
        """The module as torch.jit.script should see it (its __prepare_scriptable__): a shallow
        copy without dynamo's instance attributes, so that the class's forward is scripted."""
        plain = copy.copy(self.owner)
        for name in _MODULE_ATTRS:
            plain.__dict__.pop(name, None)
        # jit.script replaces submodules in this table in place: not in the original's
        plain.__dict__["_modules"] = type(plain._modules)(plain._modules)
        return plain

    def _fallback(self, why):
        if self.nopython:
            raise NopythonError(f"dynamo.optimize(nopython=True): cannot compile {self.name}: {why}")

    def __call__(self, *args, **kwargs):
        if self.owner is not None:
            args = (self.owner,) + args
        return self.call(self.fn, args, kwargs, in_frame=False)

    def call(self, fn, args, kwargs, in_frame):
        """One call of fn (a function object of this code). in_frame: called from the frame
        hook, which runs the frame itself when we return EAGER instead of a result."""
        _bump("calls")
        self.calls += 1
        result = self._run_traces(self.compiled, fn, args, kwargs)
        if result is not _MISS:
            return result
        if self.compiled:
            _bump("guard_misses")
            if log_enabled("guards"):
                for i, c in enumerate(self.compiled):
                    why = c.guards.first_failure(args, kwargs, fn.__globals__, fn) or "tensor metadata (native guards)"
                    log("guards", f"{self.name}: trace {i} rejected the call: {why}")
        if self.disabled_reason is not None and not self._comes_back():
            self._fallback(self.disabled_reason)
            if self.parts is None and self.owner is not None:
                self._compile_parts()
            return self._eager(fn, args, kwargs, in_frame)
        if self.state_fallbacks:  # it aborted for the call's state: eager until that state changes
            seen = self.state_fallbacks.get(_call_state(args))
            if seen is not None:
                self._fallback(seen[0])
                if seen[1] != "autograd" and self.parts is None and self.owner is not None:
                    self._compile_parts()  # (grad mode would stop the parts as well)
                return self._eager(fn, args, kwargs, in_frame)
        if self.calls < self.retry_at:  # backing off after an abort
            if self.parts is None and self.owner is not None:
                self._compile_parts()  # what failed once mostly fails again: the parts start now
            return self._eager(fn, args, kwargs, in_frame)
        if self.calls < config.hot_threshold or len(self.compiled) >= config.cache_limit:
            if len(self.compiled) >= config.cache_limit and not getattr(self, "_warned", False):
                self._warned = True
                print(f"dynamo: {self.name} hit its cache limit ({config.cache_limit} traces); "
                      f"further variants run eagerly", file=sys.stderr)
            self._fallback("cache limit reached" if self.compiled else "not hot yet")
            return self._eager(fn, args, kwargs, in_frame)
        if store.enabled():
            result = self._from_store(fn, args, kwargs)
            if result is not _MISS:
                return result
        return self._record(fn, args, kwargs, in_frame)

    def _comes_back(self):
        """Whether a function left to CPython is recorded again on this call: after a change of
        dynamo.config (what failed may now work), or once config.retry_after calls went by, and
        then after four times as many each time (a path that failed on the first calls, as
        an empty batch, may be recordable later; the cost is one recording per try). A function
        the user disabled never comes back."""
        if self.disabled_reason == "dynamo.disable" or getattr(self.fn, "_dynamo_disable", False):
            return False
        if self._left_at is None:  # left just now: note the config and when to try again
            self._left_at = (self.calls, _config_key(), config.retry_after * 4 ** self._comebacks)
            return False
        at, key, gap = self._left_at
        if key == _config_key() and (not gap or self.calls < at + gap):
            return False
        log("aborts", f"{self.name}: recorded again after {self.calls - at} calls in CPython"
                      f"{' (dynamo.config changed)' if key != _config_key() else ''}")
        self._comebacks += key == _config_key()
        self.disabled_reason, self._left_at = None, None
        self.retry_at = 0
        self._abort_base = len([a for a in self.attempts if a.compiled is None])
        return True

    def _parts(self):
        """{id(module): name} of the module's parts: its direct children, through containers."""
        found = {}

        def visit(prefix, m):
            for name, child in m.named_children():
                if type(child).forward is torch.nn.Module.forward:
                    visit(f"{prefix}{name}.", child)
                else:
                    found[id(child)] = prefix + name
        visit("", self.owner)
        return found

    def _part_named(self, selves):
        """The name of the first of the module's parts among selves, or None."""
        parts = self._parts()
        for v in selves:
            if isinstance(v, torch.nn.Module) and id(v) in parts:
                return parts[id(v)]
        return None

    def _compile_parts(self):
        """The module's forward runs in CPython (it aborted: backing off, or left to CPython for
        good): its submodules are compiled apart meanwhile
        (dynamo.optimize on each direct child, through ModuleList/ModuleDict containers), so that
        what cannot be recorded whole (a detection model's post-processing, a complex-valued
        spectrogram) still runs its backbone and heads natively. A child that is left to CPython
        in turn splits the same way, down to the leaves. Not for functions the user disabled or
        when config.compile_parts is False."""
        self.parts = []
        if not config.compile_parts or getattr(self.fn, "_dynamo_disable", False) or \
                self.disabled_reason == "dynamo.disable":
            return

        names = self._parts()
        for name, child in self.owner.named_modules():
            if id(child) not in names or isinstance(child.__dict__.get("forward"), OptimizedFunction):
                continue  # not a part, or optimized already (by the user, or as another module's part)
            fwd = type(child).forward
            if isinstance(fwd, types.FunctionType) and not getattr(fwd, "_dynamo_disable", False):
                optimize(child, nopython=False)
                self.parts.append(names[id(child)])
        if self.parts:
            why = self.disabled_reason or self.attempts[-1].reason
            log("aborts", f"{self.name}: runs in CPython ({why}); compiling its submodules apart: "
                          f"{', '.join(self.parts)}")

    def _from_store(self, fn, args, kwargs):
        """Before recording: the traces an earlier process stored for this code (store.py) whose
        constants bind and whose guards accept this call are compiled (their objects come from
        the disk cache) and run it. _MISS when none does."""
        code = getattr(fn, "__code__", None)
        if code is None:
            return _MISS
        try:
            at = store.where(code, args, kwargs)
            if at[1] not in self.stored:
                self.stored[at[1]] = store.load(at)
        except Exception as e:  # noqa: BLE001 -- the store only ever saves a recording
            log("store", f"{self.name}: the trace store failed: {type(e).__name__}: {e}")
            return _MISS
        pending = self.stored[at[1]]
        for t in list(pending):
            if len(self.compiled) >= config.cache_limit:
                break
            inputs = None
            try:
                env, consts = store.bind(t, args, kwargs, fn.__globals__, fn)
                why = consts
                tid = t["id"]
                gs = GuardSet.restore(t, consts, env, lambda: store.texts(at, tid)) if env is not None else None
                if gs is not None:
                    inputs = gs.compile()(args, kwargs, fn.__globals__, fn)
                    if inputs is None and log_enabled("store"):
                        why = f"its guards reject this call: {gs.first_failure(args, kwargs, fn.__globals__, fn)}"
            except Exception as e:  # noqa: BLE001 -- a stored trace that does not load is dropped
                if t in pending:
                    pending.remove(t)
                log("store", f"{self.name}: stored trace {t.get('id')} dropped: {type(e).__name__}: {e}")
                continue
            if inputs is None:
                if log_enabled("store"):
                    log("store", f"{self.name}: stored trace {t['id']} does not apply: {why}")
                continue
            if t not in pending:  # another thread took it meanwhile
                continue
            pending.remove(t)
            c = self._compile_stored(t, gs, at)
            if c is not None:
                result = self._run_one(c, inputs, fn, args, kwargs)
                if result is not _NEXT:
                    return result
        return _MISS

    def _compile_stored(self, t, gs, at):
        """A Compiled for stored trace t whose guards gs were bound for this process, or None."""
        try:
            entry = self._frame_for(None).compile(native.Trace(t["text"]))
        except DynamoError as e:
            log("store", f"{self.name}: stored trace {t['id']} does not compile: {e.message}")
            return None
        if t.get("choices"):
            try:
                entry.set_choices(t["choices"])
            except DynamoError as e:  # then the steps time both ways again
                log("store", f"{self.name}: stored choices not applied: {e.message}")
        c = Compiled(gs, t["text"], entry, t["out_spec"], gs.tensor_inputs, t["ops"], t["inlined"])
        c.mutates = t["mutates"]
        c.store_where, c.store_id, c.stored_choices = at, t["id"], t.get("choices", "")
        c.from_store = True
        _bump("compile_seconds", c.stats.compile_ms / 1e3)
        if c.stats.from_cache:
            _bump("cache_hits")
        _bump("traces_from_store")
        if self.compiled:
            _bump("recompiles")
        self.compiled.append(c)
        self.attempts.append(Attempt(None, c, c.ops, c.inlined))
        log("traces", f"{self.name}: trace from the store: {c.stats.num_instructions} IR instruction(s) -> "
                      f"{c.stats.num_kernels} fused kernel(s), {c.stats.num_externs} LibTorch call(s), "
                      f"{c.stats.compile_ms:.1f} ms{' (from the disk cache)' if c.stats.from_cache else ''}")
        return c

    def _store_choices(self, c):
        """Keeps what the trace's convolution and product steps chose by timing, for the next
        process that loads it from the store (they then skip the timing calls)."""
        try:
            choices = c.entry.choices()
            if choices != c.stored_choices:
                store.save_choices(c.store_where, c.store_id, choices)
                c.stored_choices = choices
        except Exception as e:  # noqa: BLE001 -- only speed depends on it
            log("store", f"{self.name}: choices not stored: {type(e).__name__}: {e}")

    def _run_traces(self, traces, fn, args, kwargs):
        """The call run by the first of traces whose guards accept it; _MISS when none does."""
        for c in traces:
            inputs = c.check(args, kwargs, fn.__globals__, fn)
            if inputs is None:
                continue
            result = self._run_one(c, inputs, fn, args, kwargs)
            if result is not _NEXT:
                return result
        return _MISS

    def _run_one(self, c, inputs, fn, args, kwargs):
        """The call run by trace c, whose guards fetched inputs; _NEXT on a native guard miss,
        _MISS when the trace failed (it is dropped)."""
        try:
            outs = c.run(inputs)
        except DynamoError as e:  # a run-time failure inside the trace: eager decides
            # The trace goes (a user error comes back from eager; a broken trace must not
            # be run, nor recorded again and again).
            self.compiled.remove(c)
            self._aborted(f"native run failed: {e.message}", c.ops, c.inlined, kind="native_run")
            return _MISS
        if outs is None:
            return _NEXT
        if isinstance(outs, SideExit):  # left the trace at a data-dependent branch
            return self._continue_at_exit(_compiled_by_entry.get(outs.entry, c), outs, fn, args, kwargs)
        if c.cut_id is not None:  # a cut trace: the rest of the call starts from its snapshot
            return self._continue_at_exit(c, SideExit(None, c.cut_id, outs), fn, args, kwargs)
        _bump("native_runs")
        if c.store_id is not None and c.runs in _CHOICES_AT:
            self._store_choices(c)
        result = _rebuild(c.out_spec, outs, inputs)
        if config.verify:
            self._verify(fn, result, args, kwargs)
        return result

    def _continue_at_exit(self, c, ex, fn, args, kwargs):
        """Trace c left through side exit ex: run a compiled side trace of that exit whose guards
        pass; else, once the exit is hot, record one from the exit's snapshot; else resume the
        rest of the call in the interpreter."""
        snap = c.exits[ex.id]
        snap.count += 1
        if log_enabled("exits"):  # a hot path: no message built unless asked for
            log("exits", f"{self.name}: left a trace at {snap.where} [{snap.guard}] (exit {ex.id})")
        values = ex.values
        if snap.step is not None:  # a stitch: the one call the trace stopped before, for real
            _bump("stitches")
            try:
                values = values + [snapshot.run_step(snap, fn, args, kwargs, values)]
            except snapshot.ResumeFailed as e:  # nothing of the call was made: eager runs it
                return self._resume_failed(c, snap, e, fn, args, kwargs)
        return self._after_exit(c, ex.id, values, fn, args, kwargs)

    def _through_stitch(self, rec, gs, interp, value, side_of, fn, args, kwargs):
        """A recording (a root, or a side trace of side_of) stopped at a stitch whose step it just
        made (value: its result): the trace so far is compiled, and the rest of this call goes on
        from the stitch's snapshot with the recording's live tensors -- recording the trace after
        it now, so that the next call runs natively through the stitch."""
        snap, live = rec.cut
        values = [t.contiguous() for t in live] + [value]
        try:
            self._compile(rec, gs, interp, None, side_of=side_of)
        finally:
            _release(rec, interp)
        _bump("stitches")
        snap.count += 1
        owner = snap.owner
        if owner is None:  # not compiled (an abort, counted): the rest in the interpreter
            _bump("exits_resumed")
            try:
                return snapshot.resume(snap, fn, args, kwargs, values)
            except snapshot.ResumeFailed as e:
                raise RuntimeError(f"dynamo: {e} (after the call at the stitch was made)") from e
        return self._after_exit(owner, owner.cut_id, values, fn, args, kwargs)

    def _after_exit(self, c, exit_id, values, fn, args, kwargs):
        """The rest of a call that left trace c through exit exit_id with these values (a
        stitch's step made already): a side trace whose guards pass, a new one recorded, or the
        interpreter."""
        snap = c.exits[exit_id]
        for side in snap.sides:
            inputs = side.check(args, kwargs, fn.__globals__, fn, values)
            if inputs is None:
                continue
            outs = side.run(inputs)
            if outs is None:
                continue
            if isinstance(outs, SideExit):
                return self._continue_at_exit(_compiled_by_entry.get(outs.entry, side), outs, fn, args, kwargs)
            if side.cut_id is not None:
                return self._continue_at_exit(side, SideExit(None, side.cut_id, outs), fn, args, kwargs)
            _bump("native_runs")
            return _rebuild(side.out_spec, outs, inputs)
        if snap.step is not None:  # a stitch is taken every time: record its continuation at once
            if len(snap.sides) >= config.max_stitch_variants:
                return self._stitch_unfit(c, snap, fn, args, kwargs, values)
            room = c.root.stitch_count < config.max_stitches
            hot = snap.count >= snap.retry_at
            if not room and snap.blacklisted is None:
                # Every later call would interpret the rest from here, slower than CPython runs
                # the whole function (a detection model's post-processing: dozens of nms and
                # unique steps): the root trace goes, as for a continuation that cannot be recorded.
                self._side_aborted(snap, f"the trace tree reached config.max_stitches ({config.max_stitches}) "
                                         "stitches", "continuation")
        else:
            room = c.root.side_count < config.max_side_traces
            hot = snap.count >= max(config.hotexit, snap.retry_at)
        if snap.blacklisted is None and hot and room:
            rec = Recorder(f"{self.name}_exit{exit_id}".replace(".", "_").replace("<", "").replace(">", ""))
            gs = GuardSet()
            gs._consts.update(snap.consts)  # the snapshot's source expressions name them
            gs.guard_state("torch_state()", torch_state(), TORCH_STATE_TEXT)
            interp = Interpreter(rec, gs)
            _bump("interpreted_runs")
            env = dict(snap.consts, a=args, k=kwargs, g=fn.__globals__, f=fn, Tensor=torch.Tensor, torch=torch)
            rng = torch.get_rng_state()
            try:
                with rec, native.blas_one_thread():
                    # Inputs in the order native linking needs: the parent's, then the live values.
                    for expr in c.input_srcs:
                        if not expr.startswith("x["):  # a side trace's own exit values are not in scope
                            interp.touch(snapshot.eval_source(expr, env, rec), Source(expr))
                    for i, t in enumerate(values):
                        interp.touch(t, EXIT.item(i))
                    result = snapshot.resume(snap, fn, args, kwargs, values, interp=interp)
            except StitchNow as s:  # the side trace reached a stitch of its own and made its step
                return self._through_stitch(rec, gs, interp, s.value, (c, exit_id), fn, args, kwargs)
            except Exception as e:  # noqa: BLE001 -- as in _recording_raised, from the exit on
                torch._C._set_grad_enabled(interp.grad_at_start)  # a `with torch.no_grad():` left midway
                effect = interp.effect or rec.effect
                _release(rec, interp)
                self._side_aborted(snap, f"recording failed inside dynamo: {type(e).__name__}: {e}", "internal")
                if effect is not None or isinstance(e, NopythonError):
                    raise
                torch.set_rng_state(rng)
                _bump("exits_resumed")
                return self._resume(c, snap, fn, args, kwargs, values)
            try:
                return self._compile(rec, gs, interp, result, side_of=(c, exit_id))
            finally:
                _release(rec, interp)
        _bump("exits_resumed")
        return self._resume(c, snap, fn, args, kwargs, values)

    def _resume(self, c, snap, fn, args, kwargs, values):
        """The rest of the call from snapshot snap of trace c. If dynamo cannot rebuild its frames
        (nothing of the program has run from there yet), the exit is blacklisted and, when no
        trace on the way wrote into the call's tensors, the whole call runs again eagerly."""
        try:
            return snapshot.resume(snap, fn, args, kwargs, values)
        except snapshot.ResumeFailed as e:
            if snap.step is not None:  # the stitch's call was made: it must not be made again
                snap.blacklisted = snap.blacklisted or str(e)
                self._aborted(f"resuming after a stitch failed inside dynamo: {e}", c.ops, c.inlined, kind="internal")
                raise RuntimeError(f"dynamo: {e} (after the call at the stitch was made)") from e
            return self._resume_failed(c, snap, e, fn, args, kwargs)

    def _stitch_unfit(self, c, snap, fn, args, kwargs, values):
        """None of the traces recorded after stitch snap fits this call either: what follows the
        stitch depends on values that change between calls (numbers read by .tolist()). The root
        trace goes (an abort, which backs off and, repeated, leaves the function to CPython) and
        the rest of this call runs in the interpreter."""
        root = c.root
        reason = (f"the trace after the stitch at {snap.where} ({snap.guard[len('stitch: '):]}) was recorded "
                  f"{len(snap.sides)} times and none fits this call: it depends on values that change "
                  f"between calls")
        if root in self.compiled:
            self.compiled.remove(root)
            self._aborted(reason, root.ops, root.inlined, kind="continuation")
        _bump("exits_resumed")
        return self._resume(c, snap, fn, args, kwargs, values)

    def _resume_failed(self, c, snap, e, fn, args, kwargs):
        """dynamo could not rebuild the state at snapshot snap (nothing of the program ran from
        there yet): the exit is blacklisted and, when no trace on the way wrote into the call's
        tensors, the whole call runs again eagerly."""
        snap.blacklisted = snap.blacklisted or str(e)
        self._aborted(f"resuming after a side exit failed inside dynamo: {e}", c.ops, c.inlined, kind="internal")
        if c.root.mutates_any():
            raise RuntimeError(f"dynamo: {e} (after the trace wrote into the call's tensors)") from e
        _bump("eager_runs")
        return fn(*args, **kwargs)

    @staticmethod
    def _link(parent, k, side):
        """Links side to exit k of parent natively when that is exactly what the Python dispatch
        would do: the same result structure, and no guard the parent's call did not check
        (besides the live values being tensors, which they are)."""
        own = set(parent.guards._checks)
        extra = [chk for chk in side.guards._checks
                 if chk not in own and not (chk.startswith("isinstance(x[") and chk.endswith(", Tensor)"))]
        if extra or side.out_spec != parent.out_spec or side.has_alias or parent.has_alias or \
                k >= parent.num_native_exits or side.cut_id is not None:
            return False
        st = native.lib().dynamo_entry_link_exit(parent.handle, k, side.handle)
        parent.exits[k].linked = st == 0
        return st == 0

    def _side_aborted(self, snap, reason, kind="internal"):
        """A side-trace recording from snap failed: back off, then blacklist the exit; a stitch's
        continuation is blacklisted at once, and its root trace dropped (see below)."""
        _bump("aborts")
        _bump(f"abort_{kind}")
        log("aborts", f"{self.name}: side trace from {snap.where} falls back: {reason}")
        snap.aborts.append(reason)
        # A stitch's continuation is recorded from the same state on every call: what failed
        # once fails again, so one failure decides (a branch's side trace may see other values).
        if len(snap.aborts) >= (1 if snap.step is not None else config.abort_limit):
            snap.blacklisted = reason
            root = snap.owner.root if snap.step is not None and snap.owner is not None else None
            if root is not None and root in self.compiled:
                # A stitch is taken on every call: without a trace after it, the rest of every
                # call would run in dynamo's interpreter, slower than CPython runs the function
                # whole. The root trace goes, and the function is left to CPython: recording it
                # again would reach the same stitch and the same failure.
                self.compiled.remove(root)
                why = f"the trace after the stitch at {snap.where} cannot be recorded ({reason})"
                self._aborted(why, root.ops, root.inlined, kind="continuation")
                if not self.compiled:
                    self.disabled_reason = why
        else:
            snap.retry_at = snap.count + 2 ** len(snap.aborts)

    def _state_aborted(self, reason, args, kind="autograd"):
        """An abort caused by the call's state (a kind whose policy is "state": grad mode and
        requires_grad, or the dtype, device or layout of its tensors): it does not count toward
        the function's abort limit; calls in the same state (_call_state) run eagerly without
        recording again, a module's parts compiled apart meanwhile, and a call in another state
        (under torch.no_grad(), float32 instead of complex inputs) records. Autograd the user can
        fix: it is said once on stderr."""
        _bump("aborts")
        _bump(f"abort_{kind}")
        log("aborts", f"{self.name}: runs eagerly in this state ({kind}): {reason}")
        self.attempts.append(Attempt(reason, ops=[], inlined=[]))
        self.state_fallbacks[_call_state(args)] = (reason, kind)
        if kind == "autograd" and not getattr(self, "_warned_state", False):
            self._warned_state = True
            print(f"dynamo: {self.name} runs eagerly while grad mode is on and a tensor it uses requires grad; "
                  f"call it under torch.no_grad() or torch.inference_mode() to compile it", file=sys.stderr)

    def _aborted(self, reason, ops, inlined, where=None, selves=(), kind="internal"):
        """Counts an abort. The k-th one makes the next 2^(k-1) - 1 calls run in CPython before
        recording is tried again; at config.abort_limit the function is left to CPython, and at
        once when the last two recordings stopped at the same place for the same reason (what
        failed twice alike fails again: the retries only cost recordings). An abort inside the
        forward of one of the module's parts (selves: the first argument of each frame the
        recording had inlined) leaves the module to CPython at once, with its parts compiled
        apart: recording it again would inline that part again, and the part on its own gets
        the retries (and splits in turn)."""
        _bump("aborts")
        _bump(f"abort_{kind}")
        log("aborts", f"{self.name}: falls back{' at ' + where if where else ''}: {reason}")
        aborts = [a for a in self.attempts if a.compiled is None]
        self.attempts.append(Attempt(reason, ops=ops, inlined=inlined, where=where))
        k = len(aborts) + 1 - self._abort_base
        part = self._part_named(selves) if self.owner is not None and config.compile_parts else None
        if part is not None and not self.compiled:
            self.disabled_reason = f"recording aborted inside its part {part}: {reason}"
        elif aborts and where is not None and reasons.policy(kind) == "same" and \
                (aborts[-1].reason, aborts[-1].where) == (reason, where):
            self.disabled_reason = f"recording aborted twice at {where}: {reason}"
        elif k >= config.abort_limit:
            self.disabled_reason = f"recording aborted {k} times; last: {reason}"
        else:
            self.retry_at = self.calls + 2 ** (k - 1)

    @staticmethod
    def _eager(fn, args, kwargs, in_frame):
        _bump("eager_runs")
        return EAGER if in_frame else fn(*args, **kwargs)

    def _verify(self, fn, result, args, kwargs):
        want = fn(*args, **kwargs)
        flat_r, flat_w = [], []
        _flat_tensors(result, flat_r)
        _flat_tensors(want, flat_w)
        ok = len(flat_r) == len(flat_w) and all(
            r.shape == w.shape and r.dtype == w.dtype and torch.allclose(r, w, rtol=1e-4, atol=1e-5, equal_nan=True)
            for r, w in zip(flat_r, flat_w))
        if not ok:
            _bump("verify_failures")
            raise AssertionError(f"dynamo verify: compiled {self.name} differs from eager")

    def _record(self, fn, args, kwargs, in_frame=False):
        why = unsupported_reason(fn.__code__, top=True) if isinstance(fn, types.FunctionType) else "not a Python function"
        if why is not None:
            self.disabled_reason = f"{self.name} uses {why}"
            self.attempts.append(Attempt(self.disabled_reason))
            _bump("aborts")
            _bump("abort_python")
            self._fallback(self.disabled_reason)
            return self._eager(fn, args, kwargs, in_frame)
        self._recording_where = None
        if store.enabled() and getattr(fn, "__code__", None) is not None:
            try:  # (the arguments as the call gets them: before it runs)
                self._recording_where = store.where(fn.__code__, args, kwargs)
            except Exception as e:  # noqa: BLE001 -- only later processes depend on it
                log("store", f"{self.name}: no place in the trace store: {type(e).__name__}: {e}")
        rec = Recorder(self.name.replace(".", "_").replace("<", "").replace(">", ""))
        gs = GuardSet()
        gs.guard_state("torch_state()", torch_state(), TORCH_STATE_TEXT)
        interp = Interpreter(rec, gs)
        interp.nopython = self.nopython and self.name
        _bump("interpreted_runs")
        if self.compiled:
            log("recompiles", f"{self.name}: recording trace {len(self.compiled) + 1} (no compiled trace accepted the call)")
        t0 = time.perf_counter()
        rng = torch.get_rng_state()
        try:
            with rec, native.blas_one_thread():
                result = interp.run(fn, args, kwargs)
        except StitchNow as s:  # a stitch's step was made: the rest of the call from its snapshot
            log("perf", f"{self.name}: recorded up to a stitch in {(time.perf_counter() - t0) * 1e3:.1f} ms")
            return self._through_stitch(rec, gs, interp, s.value, None, fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 -- the program's own exception, or ours
            torch._C._set_grad_enabled(interp.grad_at_start)  # a `with torch.no_grad():` left midway
            return self._recording_raised(e, rec, interp, rng, fn, args, kwargs, in_frame)
        log("perf", f"{self.name}: recorded in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        try:
            return self._compile(rec, gs, interp, result)
        finally:
            _release(rec, interp)

    def _recording_raised(self, e, rec, interp, rng, fn, args, kwargs, in_frame):
        """The recorded call raised e. Without effects outside the call so far (interpreter and
        recorder both say so), the call is run again eagerly from the same RNG state: if eager
        raises too, that exception -- the program's own, with its own traceback -- propagates
        and nothing is counted; if it succeeds, e was dynamo's failure: it is kept as the reason
        and eager's result returned. After effects the call cannot be repeated, so e propagates."""
        effect = interp.effect or rec.effect
        _release(rec, interp)
        if isinstance(e, NopythonError):
            raise e
        if effect is not None:
            self._aborted(f"the recorded call raised {type(e).__name__}: {e} (after {effect}, so it was not run "
                          "again eagerly)", rec.ops, interp.inlined)
            raise e
        reason = f"recording failed inside dynamo: {type(e).__name__}: {e}"
        torch.set_rng_state(rng)
        if in_frame:  # CPython runs the frame; an internal failure is then counted at the next call
            self._aborted(reason, rec.ops, interp.inlined, rec.abort_where, kind="internal")
            return EAGER
        out = fn(*args, **kwargs)
        self._aborted(reason, rec.ops, interp.inlined, rec.abort_where, rec.abort_selves, kind="internal")
        return out

    def _compile(self, rec, gs, interp, result, side_of=None):
        """After a recording: compile its trace (a root, or a side trace of exit side_of =
        (parent Compiled, exit id)) or count why not. Returns the recorded call's result; a
        failure inside dynamo is counted as an abort, never raised."""
        try:
            return self._compile_trace(rec, gs, interp, result, side_of)
        except NopythonError:
            raise
        except Exception as e:  # noqa: BLE001 -- never leak an internal error to the program
            reason = f"internal error while compiling: {type(e).__name__}: {e}"
            if side_of is not None:
                self._side_aborted(side_of[0].exits[side_of[1]], reason)
            else:
                self._aborted(reason, rec.ops, interp.inlined)
            return result

    def _compile_trace(self, rec, gs, interp, result, side_of):
        out_spec = names = None
        # a stitch with nothing recorded before it (print(...) first thing): guards, no native code
        guards_only = rec.abort_reason is None and rec.cut is not None and rec.cut[0].step is not None and \
            not rec.ops and not rec.cut[1]
        if rec.abort_reason is None and not guards_only:
            try:
                if rec.cut is None and torch.is_grad_enabled() != interp.grad_at_start:
                    raise Abort("the call changes grad mode and does not restore it", "python")
                if torch.is_grad_enabled() and any(t.requires_grad for t in rec.keep):
                    raise Abort(f"{_AUTOGRAD}: grad mode is on and a tensor requires grad (compile under "
                                "torch.no_grad() or torch.inference_mode())", "autograd")
                if rec.cut is not None:  # the trace's outputs are the live values at the cut
                    names = [rec.output_name(t) for t in rec.cut[1]]
                    out_spec = ("cut",)
                else:
                    index = {i: gs.tensor_inputs.index(e) for i, e in interp.tensor_src.items()
                             if e in gs.tensor_inputs}
                    out_spec, names = _flatten_result(result, rec, index)
                if not rec.ops:
                    raise Abort("no tensor operations on this path (nothing to compile)", "nothing")
                if not names:  # the work is in place, or returns inputs and Python values only:
                    names = [rec.last_value()]  # a trace has an output; this one is not returned
            except Abort as e:
                rec.abort(str(e), e.kind)
                rec.abort_where = rec.abort_where or "the end of the call"  # (what it returns, grad mode)
        if rec.abort_reason is not None:
            if side_of is not None:
                self._side_aborted(side_of[0].exits[side_of[1]], rec.abort_reason, rec.abort_kind)
                return result
            if reasons.policy(rec.abort_kind) == "state":
                self._state_aborted(rec.abort_reason, interp.run_args, rec.abort_kind)
            else:
                self._aborted(rec.abort_reason, rec.ops, interp.inlined, rec.abort_where, rec.abort_selves,
                              kind=rec.abort_kind)
            self._fallback(rec.abort_reason)
            return result
        text = rec.text(names) if not guards_only else "(no native code: a stitch first)"
        t0 = time.perf_counter()
        frame = self._frame_for(rec.device)
        job = _InBackground(lambda: frame.compile(native.Trace(text)) if not guards_only else None)
        storable = side_of is None and not rec.exits and rec.cut is None and not guards_only and \
            rec.device is None and store.enabled()
        try:
            gs.compile(binder=storable)  # the guards' function, built while LLVM compiles (ctypes drops the GIL)
        finally:
            job.thread.join()
        entry = None
        try:
            entry = job.result()
        except DynamoError as e:
            _bump("compile_failures")
            reason = f"compile failed: {e.message}"
            if side_of is not None:
                self._side_aborted(side_of[0].exits[side_of[1]], reason)
                return result
            self._aborted(reason, rec.ops, interp.inlined)
            self._fallback(reason)
            return result
        finally:
            if entry is None and not guards_only:
                _bump("compile_seconds", time.perf_counter() - t0)
        c = Compiled(gs, text, entry, ("cut",) if guards_only else out_spec, gs.tensor_inputs, rec.ops,
                     interp.inlined, rec.exits)
        _bump("compile_seconds", c.stats.compile_ms / 1e3)  # the native compile (guards were built meanwhile)
        c.mutates = rec.mutated
        kind = f"side trace of exit {side_of[1]}" if side_of is not None else "trace"
        if c.stats.from_cache:
            _bump("cache_hits")
        log("traces", f"{self.name}: compiled {kind}: {len(rec.ops)} ATen op(s), {c.stats.num_instructions} IR "
                      f"instruction(s), {len(rec.exits)} side exit(s) -> {c.stats.num_kernels} fused kernel(s), "
                      f"{c.stats.num_externs} LibTorch call(s), {c.stats.compile_ms:.1f} ms"
                      f"{' (from the disk cache)' if c.stats.from_cache else ''}")
        log("perf", f"{self.name}: {kind} compiled in {c.stats.compile_ms:.1f} ms")
        if rec.cut is not None:
            c.cut_id = len(c.exits)
            c.exits.append(rec.cut[0])
            rec.cut[0].owner = c
        if side_of is not None:
            parent, k = side_of
            parent.exits[k].sides.append(c)
            c.root = parent.root
            if parent.exits[k].step is not None:  # the trace after a stitch
                c.root.stitch_count += 1
                _bump("stitch_traces")
            else:
                c.root.side_count += 1
                _bump("side_traces_compiled")
            self._link(parent, k, c)
            return result
        if self.compiled:
            _bump("recompiles")
        self.compiled.append(c)
        self.attempts.append(Attempt(None, c, rec.ops, interp.inlined))
        _bump("traces_compiled")
        if storable and self._recording_where is not None:
            try:
                c.store_id = store.save(self._recording_where, self.name, gs.export(), text, out_spec, rec.ops,
                                        interp.inlined, rec.mutated)
                c.store_where = self._recording_where
            except Exception as e:  # noqa: BLE001 -- only later processes depend on it
                log("store", f"{self.name}: trace not stored: {type(e).__name__}: {e}")
        return result

    def reset(self):
        self.compiled = []
        self.attempts = []
        self.calls = 0
        self.retry_at = 0         # calls before which recording is not tried (back-off)
        self.disabled_reason = None
        self.state_fallbacks = {}
        self.stored = {}
        self.parts = None  # the parts stay optimized: inside a new trace of this forward they are inlined
        self._left_at, self._comebacks, self._abort_base = None, 0, 0
        for f in self.frames.values():
            f.close()
        self.frames = {}

    def _frame_for(self, device):
        """This function's frame on the CPU engine (device None) or a CUDA device's engine."""
        if device not in self.frames:
            self.frames[device] = native.Frame(engine(device), self.name)
        return self.frames[device]


class _InBackground:
    """fn() run on a thread of its own; result() returns its value or raises its exception."""

    def __init__(self, fn):
        self._fn, self._value, self._error = fn, None, None
        self.thread = threading.Thread(target=self._run, name="dynamo-compile", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self._value = self._fn()
        except BaseException as e:  # noqa: BLE001 -- handed to the caller by result()
            self._error = e

    def result(self):
        self.thread.join()
        if self._error is not None:
            raise self._error
        return self._value


_AUTOGRAD = "autograd"  # the prefix of the abort reason _state_aborted handles


def _call_state(args):
    """What a "state" abort depends on: grad mode, and the dtype, device, layout and
    requires_grad of the tensor arguments (also inside argument lists, tuples and dicts) and of
    a module argument's first parameter."""
    seen = []

    def add(t):
        seen.append((t.dtype, t.device, t.layout, t.requires_grad))
    for a in args:
        if isinstance(a, torch.Tensor):
            add(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, torch.Tensor):
                    add(x)
        elif isinstance(a, dict):
            for x in a.values():
                if isinstance(x, torch.Tensor):
                    add(x)
        elif isinstance(a, torch.nn.Module):
            p = next(a.parameters(), None)
            if p is not None:
                add(p)
    return (torch.is_grad_enabled(), tuple(seen))


def _release(rec, interp):
    """Drops what a finished recording holds (the call's tensors, frames and stacks), so that a
    caller's `del x` frees x without waiting for the garbage collector (the recorder and the
    interpreter refer to each other)."""
    rec.keep = []
    rec.vals = {}
    rec.view_of, rec.views, rec.poison = {}, {}, {}
    rec.snapshot_here = None
    interp.keep = []
    interp.input_objs = {}
    interp._start = None
    interp.run_args = ()


def _flat_tensors(v, out):
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (tuple, list)):
        for x in v:
            _flat_tensors(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _flat_tensors(x, out)


def _load_library():
    """libdynamo and the native call path loaded when a function is optimized rather than in its
    first call (loading them, with LLVM, takes ~17 ms); a missing library is reported by the
    first call, as before."""
    try:
        native.lib()
        _fastcall()
    except Exception:  # noqa: BLE001 -- reported by the first call, with the fallback
        pass


def optimize(fn_or_module=None, *, nopython=False):
    """Returns a version of a function (or nn.Module) that records and compiles its hot paths.

    Usable as `optimize(fn)`, `@optimize`, `@optimize(nopython=True)`, and as
    `with optimize():`, which compiles the frames that start inside the block (PEP 523 hook).
    For an nn.Module, the module itself is returned with its forward compiled (it stays the same
    module: attributes, state_dict, train()/eval() all work; `self.training` is guarded). The
    compiled state is kept out of copies and pickles: copy.deepcopy(module) gives a module whose
    forward is optimized afresh (its own traces); pickle.dumps / torch.save of the whole module
    load as an optimized module with nothing compiled yet (where dynamo can be imported);
    torch.jit.script(module) scripts the class's forward (scripting a parent module puts a plain
    twin of the optimized one, sharing its parameters and buffers, in the parent's place).
    """
    _load_library()
    if fn_or_module is None:
        from .hook import OptimizeContext
        return OptimizeContext(nopython=nopython)
    if isinstance(fn_or_module, torch.nn.Module):
        m = fn_or_module
        if isinstance(m.__dict__.get("forward"), OptimizedFunction):
            return m
        of = OptimizedFunction(type(m).forward, nopython=nopython, owner=m)
        m.forward = of
        m.__prepare_scriptable__ = of._plain_owner  # torch.jit.script asks the module for this
        return m
    if isinstance(fn_or_module, OptimizedFunction):
        return fn_or_module
    if not callable(fn_or_module):
        raise TypeError(f"dynamo.optimize: expected a function or nn.Module, got {type(fn_or_module).__name__}")
    return OptimizedFunction(fn_or_module, nopython=nopython)


def disable(fn):
    """Marks fn so that dynamo never compiles it nor inlines it (it runs eagerly, untraced)."""
    target = fn.fn if isinstance(fn, OptimizedFunction) else fn
    try:
        target._dynamo_disable = True
    except AttributeError:
        pass
    if isinstance(fn, OptimizedFunction):
        fn.disabled_reason = "dynamo.disable"
    # Traces that inlined it were recorded before it was disabled: they go (the next call records
    # with fn as a stitch). The trace store checks the mark in a function's fingerprint.
    name = getattr(target, "__qualname__", None)
    for f in _all():
        f.compiled = [c for c in f.compiled if name not in c.inlined]
    return fn


def reset():
    """Drops every compiled trace and zeroes the counters."""
    from . import hook
    hook.reset()
    for f in _all():
        f.reset()
    _compiled_by_entry.clear()
    for k in _counters:
        _counters[k] = 0
    _counters["compile_seconds"] = 0.0


def _exit_tree(c, indent):
    """Lines describing trace c's side exits and, under each, its side traces (recursively)."""
    lines = []
    for k, snap in enumerate(c.exits):
        state = (f"blacklisted ({snap.blacklisted})" if snap.blacklisted else
                 f"linked natively to {len(snap.sides)} side trace(s)" if snap.linked else
                 f"{len(snap.sides)} side trace(s), dispatched from Python" if snap.sides else
                 "resumes in the interpreter")
        taken = native.lib().dynamo_entry_exit_count(c.handle, k) if k < c.num_native_exits else snap.count

        lines.append(f"{indent}exit {k} at {snap.where} [{snap.guard}]: taken {taken} time(s), {state}")
        for side in snap.sides:
            lines.append(f"{indent}  side trace: {len(side.ops)} ATen op(s) -> {side.stats.num_kernels} kernel(s)")
            lines.extend(_exit_tree(side, indent + "    "))
    return lines


class Explanation:
    """What dynamo did with one call: traces (ops, guards, inlined callees) and aborts."""

    def __init__(self, name, attempts):
        self.name = name
        self.attempts = attempts
        self.traces = [a.compiled for a in attempts if a.compiled is not None]
        self.aborts = [a.reason for a in attempts if a.compiled is None]
        self.live = []  # for an optimized function: its compiled trace tree as it runs now
        self.parts = []  # a module that aborted: the submodules its calls compile apart

    def __str__(self):
        out = [f"dynamo.explain({self.name}): {len(self.traces)} trace(s), {len(self.aborts)} abort(s)"]
        for a in self.attempts:
            if a.compiled is not None:
                c = a.compiled
                how = "loaded from the trace store" if c.from_store else "compiled"
                out.append(f"  trace: {len(c.ops)} ATen op(s) -> {c.stats.num_kernels} kernel(s), "
                           f"{c.stats.num_externs} LibTorch call(s), {how} in {c.stats.compile_ms:.1f} ms")
                if c.inlined:
                    out.append("    inlined: " + ", ".join(dict.fromkeys(c.inlined)))
                out.extend(_exit_tree(c, "    "))
                out.append("    ops: " + ", ".join(c.ops))
                out.append("    guards:")
                out.extend("      " + line for line in c.guards.source_text().splitlines())
            else:
                out.append(f"  aborted: {a.reason}")
                if a.ops:
                    out.append("    ops recorded before: " + ", ".join(a.ops))
        if self.parts:
            out.append(f"  {self.name} runs in CPython when it aborts; its submodules are then compiled apart: "
                       + ", ".join(self.parts))
        if self.live:
            out.append(f"{self.name} as it runs now (roots, exits, side traces):")
            out.extend(self.live)
        return "\n".join(out)

    __repr__ = __str__


def explain(fn, *args, **kwargs):
    """Records one call of fn(*args, **kwargs) and reports what dynamo would compile: traces with
    their ops and guards, or why it cannot.

    The call runs for real, on deep copies: of the module explained (fn, or the module fn is the
    forward or a method of) and of the tensors and modules among the arguments (through tuples,
    lists and dicts; views stay views of one copied base), so the caller's tensors, parameters
    and buffers are unchanged afterwards, and identity guards name the caller's objects. Globals
    and other objects are not copied (guards check their identity): a function that changes them
    changes them. When copying fails, explain warns and records on the originals."""
    target, owner = _explain_target(fn)
    (owner, args, kwargs), memo = _explain_copies((owner, args, kwargs))
    of = OptimizedFunction(target, owner=owner)
    _unlist(of)
    saved = dict(_counters)
    of.calls = config.hot_threshold
    of._record(of.fn, ((of.owner,) + args) if of.owner is not None else args, kwargs)
    _counters.update(saved)
    if of.disabled_reason and not of.attempts:
        of.attempts.append(Attempt(of.disabled_reason))
    _name_originals(of.attempts, memo)
    e = Explanation(of.name, of.attempts)
    if of.owner is not None and config.compile_parts and any(not a.startswith(_AUTOGRAD) for a in e.aborts):
        e.parts = list(of._parts().values())
    live = fn.forward if isinstance(fn, torch.nn.Module) else fn
    if isinstance(live, OptimizedFunction) and live.compiled:  # what this optimized function runs now
        for i, c in enumerate(live.compiled):
            e.live.append(f"  trace {i}: {len(c.ops)} ATen op(s), {c.runs} run(s)")
            e.live.extend(_exit_tree(c, "    "))
    return e


def report():
    """Text summary of every optimized function alive now: compiled traces, fallbacks and why."""
    lines = []
    for f in _all():
        code = getattr(f.fn, "__code__", None)
        where = f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else ""
        lines.append(f"{f.name}{where}: {f.calls} call(s), {len(f.compiled)} trace(s), "
                     f"{sum(c.runs for c in f.compiled)} native run(s)")
        for c in f.compiled:
            lines.append(f"  {'from the trace store' if c.from_store else 'compiled'}: {len(c.ops)} ATen op(s) -> "
                         f"{c.stats.num_kernels} kernel(s), {c.stats.num_externs} LibTorch call(s), {c.runs} run(s)")
            lines.extend(_exit_tree(c, "    "))
        for a in f.attempts:
            if a.compiled is None:
                lines.append(f"  fell back: {a.reason}")
        if f.disabled_reason:
            lines.append(f"  not compiled: {f.disabled_reason}")
        if f.parts:
            lines.append(f"  its submodules are compiled apart: {', '.join(f.parts)}")
    c = counters()
    lines.append("counters: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in c.items() if v or not k.startswith("abort_")))
    return "\n".join(lines)


# The knobs whose change lets a function left to CPython be recorded again (_comes_back).
_CONFIG_KNOBS = ("stitch", "max_stitches", "max_stitch_variants", "max_trace_ops", "max_side_traces", "gpu",
                 "compile_parts", "abort_limit", "cache_limit", "hotexit")


def _config_key():
    return tuple(getattr(config, n) for n in _CONFIG_KNOBS)


# Instance attributes dynamo.optimize gives a module (both refer to its OptimizedFunction).
_MODULE_ATTRS = ("forward", "__prepare_scriptable__")


def _is_global(of):
    """Whether `module.qualname` names this very optimized function (pickle can refer to it)."""
    obj = sys.modules.get(of.__module__)
    for part in getattr(of, "__qualname__", "").split("."):  # a callable object may have none
        obj = getattr(obj, part, None)
    return obj is of


def _explain_target(fn):
    """(the function explain records, the module or object it is a method of, or None)."""
    if isinstance(fn, torch.nn.Module):
        return type(fn).forward, fn
    if isinstance(fn, types.MethodType):
        return _explain_target(fn.__func__)[0], fn.__self__
    if isinstance(fn, OptimizedFunction):
        return fn.fn, fn.owner
    return fn, None


def _explain_copies(values):
    """(copy of values to record on, the deepcopy memo: id of an original -> its copy); values
    themselves, with a warning, when they cannot be copied."""
    memo = {}
    try:
        return _copy_tensors(values, memo), memo
    except Exception as e:  # noqa: BLE001 -- deepcopy may raise anything: explain still explains
        warnings.warn(f"dynamo.explain: cannot copy the arguments ({type(e).__name__}: {e}); "
                      f"recording on them, which may change them")
        return values, {}
    finally:
        # Copying an optimized module made it a fresh OptimizedFunction: explain's own, not listed.
        for v in memo.values():
            if isinstance(v, OptimizedFunction):
                _unlist(v)


def _copy_tensors(v, memo):
    """v with its tensors and modules deep-copied (through tuples, lists and dicts; one memo keeps
    the aliasing between them); other objects stay themselves."""
    if isinstance(v, torch.nn.Module):
        return copy.deepcopy(v, memo)
    if isinstance(v, torch.Tensor):
        return _copy_tensor(v, memo)
    if type(v) in (tuple, list):
        return type(v)(_copy_tensors(x, memo) for x in v)
    if type(v) is dict:
        return {k: _copy_tensors(x, memo) for k, x in v.items()}
    return v


def _copy_tensor(t, memo):
    """A deep copy of tensor t; a view stays a view, of the copy of its base (the recorder treats
    inputs that are views differently)."""
    base = t._base
    if base is not None and base.dtype == t.dtype:
        twin = _copy_tensor(base, memo)
        offset = twin.storage_offset() + t.storage_offset() - base.storage_offset()
        return memo.setdefault(id(t), twin.as_strided(t.size(), t.stride(), offset))
    try:
        return copy.deepcopy(t, memo)
    except RuntimeError:  # a non-leaf tensor of an autograd graph: a clone stays in the graph
        return memo.setdefault(id(t), t.clone())


def _name_originals(attempts, memo):
    """Rewords the identity guards of traces recorded on explain's copies to name the caller's
    objects (by address), as a recording on the originals would."""
    original = {id(c): i for i, c in memo.items()}
    for a in attempts:
        lines = a.compiled.guards.lines if a.compiled is not None else []
        for k, (expr, kind, desc) in enumerate(lines):
            what, _, addr = desc.rpartition(" at ")
            if kind == "identity" and int(addr, 16) in original:
                lines[k] = (expr, kind, f"{what} at {original[int(addr, 16)]:#x}")
