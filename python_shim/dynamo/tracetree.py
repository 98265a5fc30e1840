"""Compiled traces and how one call runs through a tree of them.

A root trace's Python guards fetch the call's tensor inputs and libdynamo runs it natively
(Compiled.run). A run can leave it through a side exit (a data-dependent branch or value) or at
its cut (config.max_trace_ops, or a stitch: one step it cannot record). From there the call goes
on in a side trace of that exit whose guards pass (natively linked, or dispatched here), in one
to be recorded now once the exit is hot, or in the interpreter from the exit's snapshot
(snapshot.py). `Runner` is that dispatch, one per optimized function: it runs and resumes, it
never records -- where a side trace is due it answers `RecordSide`, and the front end records.
"""
import collections
import ctypes
import dataclasses
import itertools
import sys
import threading

import torch

from . import _capi, config, native, snapshot, store
from ._capi import DynamoError
from .frames import Abort, dense_order
from .guards import tensor_meta
from .interpreter import Interpreter
from .log import enabled as log_enabled, log
from .registry import bump

_compiled_by_entry = {}  # native entry handle (int) -> Compiled
MISS = object()    # no trace accepted the call
NEXT = object()    # this trace did not (its native guards), try the next
_CHOICES_AT = (3, 12)  # native runs after which a stored trace's step choices are saved


def forget_entries():
    """After dynamo.reset(): no native entry maps to a Compiled any more."""
    _compiled_by_entry.clear()


def shape_key(args):
    """The shapes of a call's positional tensor arguments (the dispatch order's key)."""
    return tuple(a.shape for a in args if isinstance(a, torch.Tensor))


class _NoCode:
    """The stats of a trace with no native code (guards, then a stitch)."""
    num_kernels = num_externs = num_instructions = from_cache = shared_code = 0
    compile_ms = 0.0


# A pending Compiled's attributes that exist once its code is built (Compiled.settle).
_FROM_ENTRY = frozenset(("check", "entry", "handle", "input_meta", "nout", "shapes", "aliases", "has_alias",
                         "_ptrs_type", "stats"))
_settle_lock = threading.RLock()  # (settling one trace may settle another: a side trace links to its parent)


def _never(*args, **kwargs):
    """The guard function of a trace that got no code: it takes no call."""
    return None


class Compiled:
    """One compiled trace: its guards, the native entry, and how to rebuild the result. entry is
    None for a trace that recorded nothing before a stitch: its guards pick the path, and the
    call goes straight to the stitch. What its maker knows (a recording, a size family, the trace
    store) is given here, by keyword; only the tree it joins and the store fill in more later."""

    def __init__(self, guards, text, entry, out_spec, input_srcs, ops, inlined, exits=(), *, mutates=False,
                 shape_key=None, family=None, size_read="?", size_fixed=None, stored=None, retimer=None,
                 pending=None):
        self.guards = guards
        self.exits = list(exits)  # Snapshot per side exit id
        self.text = text
        self.failed = None  # why a pending trace got no code (its compile failed, its tree went first)
        # pending: a trace recorded in a call that goes on recording after it (a stitch's
        # continuation); its guards and native code are built when something first needs them
        # or when that call ends -- pending: (build, then): build() -> (entry, None) or (None, why
        # not); then() after the attributes are set -- so that a tree the same call drops
        # (config.max_stitches) costs no compile
        self._pending = pending
        if pending is None:
            self._take_entry(entry)
        self.out_spec = out_spec
        self.ops = ops
        self.inlined = inlined
        self.input_srcs = input_srcs
        self.runs = 0
        self.num_native_exits = len(self.exits)
        self.cut_id = None        # a trace cut at config.max_trace_ops: its snapshot's index in exits
        self.cut_values = 0       # ... and how many of its outputs are the cut's live values (the others:
        #                           the one a trace with none returns, as every trace has an output)
        # stored: (where, id, step choices) of a trace kept in the trace store (store.py): at the
        # place store.where names (the code and call signature), under that id
        self.store_where, self.store_id, self.stored_choices = stored or (None, None, "")
        self.from_store = stored is not None  # loaded from the store (recorded by an earlier process)
        self.root = self          # the root trace of a side-trace tree
        self.shape_key = shape_key  # shape_key() of the call it was recorded from (dispatch order)
        self.leaf_shapes = None   # roots: the recorded call's leaf shapes (recording.CallFacts)
        self.side_count = 0       # roots: side traces compiled under this root (all depths)
        self.mutates = mutates    # the trace writes into its inputs (copy_)
        self.family = family      # roots compiled from a size family (sizes.py) without a recording
        self.size_key = None      # ... and the family's key_of() at its sizes (Runner.run)
        self.keyed_by = family    # the family whose key_of() size_key is (also a recorded member's)
        self.size_read = size_read  # where its recording read a tensor's size in Python (None: nowhere)
        self.size_fixed = size_fixed if size_fixed is not None else {}  # (trace value, dim) -> where
        #                           Python used that size as a number (sizeflow.py)
        self.size_guards = []     # comparisons of sizes Python made, what passed them to torch
        self.size_passed = []     # calls (sizeflow.SizeFlow: size_guards, size_passed, size_opaque)
        self.size_opaque = []
        # retimer: (runs, make): at that many runs make() gives a fresh entry that times its steps
        self.retime_at, self.retimer = retimer or (0, None)
        self.defaulted = retimer is not None  # its step choices are defaults, not timed (until it retimes)
        self.dynamic_marks = {}   # input slot -> dims marked dynamic on the recorded call (mark_dynamic)
        self.stitch_count = 0     # roots: continuation traces after stitches under this root
        self.training = False     # a TrainedTrace (training.py): forward and backward through AOTAutograd
        # what the trace does in Python after its native run (frontend._trace_outputs): None, or
        # (write-back targets' getter, their attribute names, the getter of the objects from
        # outside that the result holds, or None); see Runner.finish
        self.python_effects = None

    def _take_entry(self, entry):
        """What the native entry says of the trace (None: no native code)."""
        guards = self.guards
        self.check = guards.compile() if self.failed is None else _never
        self.entry = entry
        self.handle = entry.handle if entry is not None else None
        # no native code (nothing recorded before a stitch): the tensor checks a native entry
        # makes are made here (a stitch's step reads the inputs as the recorded call had them)
        meta = getattr(guards, "tensor_meta", {})
        self.input_meta = [meta.get(e) for e in guards.tensor_inputs] if entry is None else None
        specs = entry.output_specs() if entry is not None else []
        self.nout = len(specs)
        self.shapes = [s for _, s in specs]
        self.aliases = entry.output_aliases() if entry is not None else []
        self.has_alias = any(a is not None for a in self.aliases)
        self._ptrs_type = ctypes.c_void_p * max(self.nout, 1)
        self.stats = entry.stats() if entry is not None else _NoCode()
        if self.handle is not None:
            _compiled_by_entry[self.handle.value] = self

    def __getattr__(self, name):
        # (only for attributes not set yet: those of a pending trace's code)
        if name in _FROM_ENTRY and self.__dict__.get("_pending") is not None:
            self.settle()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def is_pending(self):
        return self.__dict__.get("_pending") is not None

    def settle(self):
        """Builds a pending trace's guards and code now (nothing when it has them)."""
        if self.__dict__.get("_pending") is None:
            return
        with _settle_lock:
            make = self.__dict__.get("_pending")
            if make is None:  # (another thread settled it meanwhile)
                return
            build, then = make
            try:
                entry, self.failed = build()
            except Exception as e:  # noqa: BLE001 -- build() counts its own failures; this is a last guard
                entry, self.failed = None, f"internal error while compiling: {type(e).__name__}: {e}"
            self._take_entry(entry)
            self._pending = None
            then()

    def mutates_any(self):
        """Does this trace, or a side trace under it, write into the call's tensors?"""
        return self.mutates or any(side.mutates_any() for snap in self.exits for side in snap.sides)

    def exits_taken(self):
        """Times this trace's guards failed (natively counted), its side traces' included."""
        n = 0
        if self.handle is not None:
            L = native.lib()
            n = sum(L.dynamo_entry_exit_count(self.handle, k) for k in range(self.num_native_exits))
        return n + sum(side.exits_taken() for snap in self.exits for side in snap.sides)

    def run(self, inputs):
        """Runs natively; returns the flat outputs, or None on a native guard miss."""
        if self.handle is None:
            if self.failed is not None:  # (a pending trace that got no code: it takes no call)
                return None
            for t, m in zip(inputs, self.input_meta):
                if isinstance(t, torch.Tensor) and (m is None or tensor_meta(t) != m):
                    return None  # a guard miss, as a native entry's
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
            if self.runs == self.retime_at:
                self._retime()
            return outs
        try:
            args, keep = native.make_args(inputs)
        except TypeError:  # a dtype no trace takes (complex, quantized): a guard miss, as natively
            return None
        ptrs = self._ptrs_type()  # per call: the same trace may run on several threads
        st = native.lib().dynamo_entry_run_alloc(self.handle, args, len(inputs), ptrs, self.nout)
        if st == _capi.STATUS_GUARD_MISS:
            return None
        if st == _capi.STATUS_EXIT:
            return _side_exit()
        if st != 0:
            native._check(st)
        outs = native.collect_outputs(ptrs, self.aliases, self.shapes, inputs)
        self.runs += 1
        if self.runs == self.retime_at:
            self._retime()
        return outs

    def _retime(self):
        """A size-family instance that began with default step choices (a sweep of sizes, see
        frontend._inherit_choices) is hot at its size: a fresh entry of the same text (machine
        code shared) replaces its entry and times its steps in the next runs."""
        make, self.retimer = self.retimer, None
        try:
            entry = make(self)  # (None: the entry it has took its family's timed choices)
        except Exception:  # noqa: BLE001 -- it keeps the entry it has
            return
        self.defaulted = False
        if entry is not None:
            # (the old entry stays alive with the trace: another thread may be running it now)
            self.retired, self.entry, self.handle = self.entry, entry, entry.handle


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


class OutObjects:
    """The objects from outside the call that its result holds, each found again at the source
    it was read from (spec ("S", k): the k-th of exprs). srcs: the interpreter's obj_srcs."""

    def __init__(self, srcs):
        self.srcs, self.exprs, self._at = srcs, [], {}

    def index(self, v):
        """v's position in exprs, or None when v was not read from a source."""
        k = self._at.get(id(v))
        if k is None:
            found = self.srcs.get(id(v))
            if found is None or found[0] is not v:
                return None
            k = self._at[id(v)] = len(self.exprs)
            self.exprs.append(found[1].expr)
        return k


def _flatten_result(result, rec, input_index, objects=None):
    """(spec, list of IR output names) for a return value; tensors must be trace values, or
    trace inputs: input_index maps id(tensor) -> input slot, and a returned input is the very
    object the call was given (a Parameter stays a Parameter, an input written in place is the
    same object), as eager returns it. objects (OutObjects, or None): the objects read from a
    source that the result may hold as they are."""
    names = []

    def add(n):  # the same tensor returned twice stays one output
        if n not in names:
            names.append(n)
        return names.index(n)

    def walk(v):
        if isinstance(v, torch.Tensor) and id(v) in input_index:
            return ("I", input_index[id(v)])
        if isinstance(v, torch.Tensor):
            n = rec.output_name(v)
            if n is None:
                raise Abort("returns a tensor that was not recorded", "result")
            base = _viewed_base(v, rec)
            if base is not None:  # a view: the trace returns its base, the call views it as eager did
                return ("V", add(rec.output_name(base)), tuple(v.shape), tuple(v.stride()),
                        v.storage_offset() - base.storage_offset())
            inview = _input_view_spec(v, n, rec, input_index)
            if inview is not None:
                return inview
            perm = None if v.is_contiguous() else _memory_order(v)
            if perm is not None:  # eager's layout: the trace returns it in memory order, the call permutes back
                with rec:
                    pn = rec.output_name(v.permute(perm))
                if pn is not None:
                    return ("P", add(pn), tuple(sorted(range(len(perm)), key=perm.__getitem__)))
            return ("T", add(n))
        if type(v) in (tuple, list):
            return (type(v).__name__, [walk(x) for x in v])
        if type(v) in (dict, collections.OrderedDict):  # (segmentation models return an OrderedDict)
            return (type(v).__name__, list(v.keys()), [walk(x) for x in v.values()])
        if v is None or type(v) in (bool, int, float, str, torch.dtype, torch.device, torch.Size):
            return ("C", v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            # a dataclass (Hugging Face's ModelOutput, a dict subclass too): made again as an
            # object of its class holding what eager's held, items and attributes, without
            # running its __init__ or __post_init__ again
            attrs = vars(v) if hasattr(v, "__dict__") else {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
            items = list(v.items()) if isinstance(v, dict) else []
            return ("D", type(v), [k for k, _ in items], [walk(x) for _, x in items],
                    list(attrs), [walk(x) for x in attrs.values()])
        k = objects.index(v) if objects is not None else None
        if k is not None:
            return ("S", k)
        raise Abort(f"returns a {type(v).__name__}", "result")

    return walk(result), names


def _input_view_spec(v, name, rec, input_index):
    """("IV", input slot, sizes, strides, offset) when returned tensor v is a view of an input's
    memory made by an op the trace runs through LibTorch (`x.diagonal()`, `unfold`): the native
    output would be a copy of it, so the call makes the same view of this call's input instead,
    as eager returns it (a later write into the input shows through it, and a write through it
    reaches the input). Views the IR has ops for (slices, transposes) are the plan's output
    aliases already; None for those and for anything else."""
    if v._base is None or v.numel() == 0 or v.layout != torch.strided:
        return None
    line = f"  {name} = extern "
    if not any(s.startswith(line) for s in rec.lines):
        return None
    ptr = v.untyped_storage().data_ptr()
    for t in rec.input_tensors:
        if t is not None and id(t) in input_index and t.untyped_storage().data_ptr() == ptr:
            return ("IV", input_index[id(t)], tuple(v.shape), tuple(v.stride()), v.storage_offset() - t.storage_offset())
    return None


def _memory_order(v):
    """The dims of a non-contiguous tensor v from outermost to innermost in memory, when v is a
    permutation of a dense row-major tensor (a transposed result, channels-last, the layout
    LibTorch's attention gives its output); None for any other layout."""
    if v.layout != torch.strided or v.dim() < 2 or v.numel() < 2:
        return None
    order = dense_order(v)
    return None if order is None else order[::-1]


def _viewed_base(v, rec):
    """The tensor returned tensor v is a view of, when the trace can return that instead and the
    call take v from it as eager does (a transposed or sliced result: no copy kernel, and eager's
    strides and aliasing): a contiguous tensor the trace computed (not an input), of v's dtype.
    None otherwise."""
    b = v._base
    if b is None or b.dtype != v.dtype or not b.is_contiguous() or b.layout != torch.strided:
        return None
    try:
        n = rec.output_name(b)
    except Abort:
        return None
    return b if n is not None and n not in rec.input_names else None


def _sides_miss(snap, fn, args, kwargs, values):
    """', the newest trace recorded after exit snap rejected this call at <the guard, in the
    program's words>' -- or '' when it has none, or only its tensors' metadata differ."""
    for side in reversed(snap.sides):
        gs = getattr(side, "guards", None)
        try:
            why = gs.explain_failure(args, kwargs, fn.__globals__, fn, values) if gs is not None else None
        except Exception:  # noqa: BLE001 -- only the message depends on it
            why = None
        if why is not None:
            return f" (the newest one recorded there rejects this call at {why})"
    return ""


def _rebuild(spec, outs, inputs, objs=()):
    """The return value from its spec, the trace's outputs, the call's input tensors and the
    objects from outside the call that it holds (objs: OutObjects' order)."""
    kind = spec[0]
    if kind == "T":
        return outs[spec[1]]
    if kind == "V":  # eager's view of a returned base (dense row-major, as eager's base was)
        b = outs[spec[1]]
        if not b.is_contiguous():
            b = b.contiguous()
        return b.as_strided(spec[2], spec[3], b.storage_offset() + spec[4])
    if kind == "P":  # eager's dims from the memory order the trace wrote
        return outs[spec[1]].permute(spec[2])
    if kind == "I":
        return inputs[spec[1]]
    if kind == "IV":  # eager's view of this call's input (an extern made it: the output was a copy)
        t = inputs[spec[1]]
        return t.as_strided(spec[2], spec[3], t.storage_offset() + spec[4])
    if kind == "C":
        return spec[1]
    if kind == "S":
        return objs[spec[1]]
    if kind == "tuple":
        return tuple(_rebuild(s, outs, inputs, objs) for s in spec[1])
    if kind == "list":
        return [_rebuild(s, outs, inputs, objs) for s in spec[1]]
    if kind == "D":
        return _rebuild_object(spec, outs, inputs, objs)
    pairs = ((k, _rebuild(s, outs, inputs, objs)) for k, s in zip(spec[1], spec[2]))
    return collections.OrderedDict(pairs) if kind == "OrderedDict" else dict(pairs)


def _rebuild_object(spec, outs, inputs, objs):
    """A dataclass result (spec "D": class, item keys and specs, attribute names and specs)."""
    _, cls, keys, item_specs, names, attr_specs = spec
    base = collections.OrderedDict if issubclass(cls, collections.OrderedDict) else dict if issubclass(cls, dict) else object
    obj = base.__new__(cls)
    for k, s in zip(keys, item_specs):
        base.__setitem__(obj, k, _rebuild(s, outs, inputs, objs))
    for n, s in zip(names, attr_specs):
        object.__setattr__(obj, n, _rebuild(s, outs, inputs, objs))
    return obj


class Attempt:
    """What one recording did: the trace (or why there is none)."""

    def __init__(self, reason, compiled=None, ops=(), inlined=(), where=None):
        self.reason = reason
        self.where = where        # "file:line" where an aborted recording stopped, when known
        self.compiled = compiled
        self.ops = list(ops)
        self.inlined = list(inlined)


class RecordSide:
    """The runner's answer where a trace is to be recorded from an exit now (a hot side exit,
    a stitch's continuation): the call left trace c through exit exit_id with these values."""

    __slots__ = ("c", "exit_id", "values")

    def __init__(self, c, exit_id, values):
        self.c, self.exit_id, self.values = c, exit_id, values


class Runner:
    """The trace-tree dispatch of one optimized function: traces is its list of compiled root
    traces (a trace that fails natively is dropped from it), policy its backoff.Policy (told of
    the aborts that happen while running)."""

    def __init__(self, name, traces, policy):
        self.name, self.traces, self.policy = name, traces, policy
        self.native_runs = 0        # calls that ended in native code (the counter's share of this function)
        self._dispatch_index = None  # (ids of the traces it was built from, {shape_key: [traces]})

    def run(self, traces, fn, args, kwargs):
        """The call run by the first of traces whose guards accept it; MISS when none does.
        With many traces (one per tensor shape: the same program at other sizes), those recorded
        from a call with this call's argument shapes are tried first: a rejected guard check costs
        ~1.5 us, and 40 sizes would cost more than the call. (Any trace that accepts the call is
        right for it; the order only decides which is tried first.)"""
        if len(traces) > 4:
            ids = tuple(map(id, traces))
            index = self._dispatch_index
            if index is None or index[0] != ids:  # rebuilt when the list changed (the index
                by_key = {}                       # holds its traces, so no id is reused meanwhile)
                for c in traces:
                    by_key.setdefault(c.shape_key, []).append(c)
                index = self._dispatch_index = (ids, by_key)
            first = index[1].get(shape_key(args))
            if first:  # the others only if none of these takes the call
                traces = itertools.chain(first, (c for c in traces if c not in first))
        # The instances of a size family share their family's guard function (only their sizes,
        # checked natively, differ): it is called once per call, and an instance at other
        # sizes than the call's is not tried (each would cost a native guard miss); nor is a
        # recorded member of the family (its proto) at other sizes (frontend._key_member).
        last_check = last_inputs = keyed = keyed_inputs = key = None
        for c in traces:
            check = c.check
            if check is last_check:
                inputs = last_inputs
            else:
                inputs = last_inputs = check(args, kwargs, fn.__globals__, fn)
                last_check = check
            if inputs is None:
                continue
            fam = c.keyed_by
            if fam is not None and c.size_key is not None:
                if keyed is not fam or keyed_inputs is not inputs:
                    keyed, keyed_inputs, key = fam, inputs, fam.key_of(inputs)
                if key is not None and key != c.size_key:
                    continue
            result = self.run_one(c, inputs, fn, args, kwargs)
            if result is not NEXT:
                return result
        return MISS

    def run_one(self, c, inputs, fn, args, kwargs):
        """The call run by trace c, whose guards fetched inputs; NEXT on a native guard miss,
        MISS when the trace failed (it is dropped)."""
        try:
            outs = c.run(inputs)
        except DynamoError as e:  # a run-time failure inside the trace: eager decides
            # The trace goes (a user error comes back from eager; a broken trace must not
            # be run, nor recorded again and again).
            self.traces.remove(c)
            self.policy.aborted(f"native run failed: {e.message}", c.ops, c.inlined, kind="native_run")
            return MISS
        if outs is None:
            return NEXT
        if isinstance(outs, SideExit):  # left the trace at a data-dependent branch
            return self._continue_at_exit(_compiled_by_entry.get(outs.entry, c), outs, fn, args, kwargs)
        if c.cut_id is not None:  # a cut trace: the rest of the call starts from its snapshot
            return self._continue_at_exit(c, SideExit(None, c.cut_id, outs[:c.cut_values]), fn, args, kwargs)
        if not c.training:  # (a TrainedTrace's runs are counted by its graphs' own traces)
            bump("native_runs")
            self.native_runs += 1
        if c.store_id is not None and c.runs in _CHOICES_AT:
            self.store_choices(c)
        result = self.finish(c, outs, inputs, fn, args, kwargs)
        if config.verify and c.python_effects is None:  # (eager again would make the write-backs twice)
            self._verify(fn, result, args, kwargs)
        return result

    @staticmethod
    def finish(c, outs, inputs, fn, args, kwargs, values=None):
        """The call's result from trace c's native outputs, and what c does in Python after its
        native run (c.python_effects): the objects from outside that the result holds found at
        their sources, then the write-backs made, in the recorded order, on the objects their
        sources name now (all read before the first is made: a source through an attribute the
        call sets names the object the recording read). values: an exit's live values (x)."""
        fx = c.python_effects
        if fx is None:
            return _rebuild(c.out_spec, outs, inputs)
        targets, names, objects = fx
        g = fn.__globals__
        objs = objects(args, kwargs, g, fn, values) if objects is not None else ()
        if not names:
            return _rebuild(c.out_spec, outs, inputs, objs)
        where = targets(args, kwargs, g, fn, values)
        result, written = _rebuild(c.out_spec, outs, inputs, objs)
        for obj, name, v in zip(where, names, written):
            if type(name) is tuple:  # ("item", key): d[key] = v
                obj[name[1]] = v
            else:
                setattr(obj, name, v)
        return result

    def store_choices(self, c):
        """Keeps what stored trace c's convolution and product steps chose by timing, for the
        next process that loads it from the store (they then skip the timing calls)."""
        try:
            choices = c.entry.choices()
            if choices != c.stored_choices:
                store.save_choices(c.store_where, c.store_id, choices)
                c.stored_choices = choices
        except Exception as e:  # noqa: BLE001 -- only speed depends on it
            log("store", f"{self.name}: choices not stored: {type(e).__name__}: {e}")

    def _verify(self, fn, result, args, kwargs):
        """config.verify: the call again eagerly, its tensors compared with the compiled result's."""
        want = fn(*args, **kwargs)
        flat_r, flat_w = [], []
        _flat_tensors(result, flat_r)
        _flat_tensors(want, flat_w)
        ok = len(flat_r) == len(flat_w) and all(
            r.shape == w.shape and r.dtype == w.dtype and torch.allclose(r, w, rtol=1e-4, atol=1e-5, equal_nan=True)
            for r, w in zip(flat_r, flat_w))
        if not ok:
            bump("verify_failures")
            raise AssertionError(f"dynamo verify: compiled {self.name} differs from eager")

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
            bump("stitches")
            try:
                held = snapshot.read_before_step(snap, fn, args, kwargs, values)
                values = values + [snapshot.run_step(snap, fn, args, kwargs, values)] + held
            except snapshot.ResumeFailed as e:  # nothing of the call was made: eager runs it
                return self._resume_failed(c, snap, e, fn, args, kwargs)
        return self.after_exit(c, ex.id, values, fn, args, kwargs)

    def after_exit(self, c, exit_id, values, fn, args, kwargs):
        """The rest of a call that left trace c through exit exit_id with these values (a
        stitch's step made already): a side trace whose guards pass, RecordSide when one is to
        be recorded now, or the interpreter."""
        snap = c.exits[exit_id]
        for side in list(snap.sides):
            inputs = side.check(args, kwargs, fn.__globals__, fn, values)
            if inputs is None:
                continue
            try:
                outs = side.run(inputs)
            except DynamoError as e:  # a run-time failure inside the side trace: it goes, as a root would
                snap.sides.remove(side)
                self.policy.side_aborted(snap, f"native run failed: {e.message}", "native_run")
                continue  # (it wrote nothing: writes into the call's tensors are a trace's last steps)
            if outs is None:
                continue
            if isinstance(outs, SideExit):
                return self._continue_at_exit(_compiled_by_entry.get(outs.entry, side), outs, fn, args, kwargs)
            if side.cut_id is not None:
                return self._continue_at_exit(side, SideExit(None, side.cut_id, outs[:side.cut_values]), fn, args,
                                              kwargs)
            bump("native_runs")
            self.native_runs += 1
            return self.finish(side, outs, inputs, fn, args, kwargs, values)
        if snap.step is not None or snap.value_cut:  # taken every time: record its continuation at once
            if len(snap.sides) >= config.max_stitch_variants:
                return self._stitch_unfit(c, snap, fn, args, kwargs, values)
            room = c.root.stitch_count < config.max_stitches
            hot = snap.count >= snap.retry_at
            if not room and snap.blacklisted is None:
                # Every later call would interpret the rest from here, slower than CPython runs
                # the whole function (a detection model's post-processing: dozens of nms and
                # unique steps): the root trace goes, as for a continuation that cannot be recorded.
                self.policy.side_aborted(snap, f"the trace tree reached config.max_stitches ({config.max_stitches}) "
                                         f"stitches{_sides_miss(snap, fn, args, kwargs, values)}", "continuation",
                                         overflow=True)
        else:
            room = c.root.side_count < config.max_side_traces
            # (a DDP bucket's cut is taken by every call: its continuation is recorded at once)
            hot = snap.count >= (snap.retry_at if snap.bucket_cut else max(config.hotexit, snap.retry_at))
        if snap.blacklisted is None and hot and room:
            return RecordSide(c, exit_id, values)
        bump("exits_resumed")
        return self.resume(c, snap, fn, args, kwargs, values)

    def resume(self, c, snap, fn, args, kwargs, values):
        """The rest of the call from snapshot snap of trace c. If dynamo cannot rebuild its frames
        (nothing of the program has run from there yet), the exit is blacklisted and, when no
        trace on the way wrote into the call's tensors, the whole call runs again eagerly."""
        try:
            return snapshot.resume(snap, fn, args, kwargs, values, Interpreter.unrecorded())
        except snapshot.ResumeFailed as e:
            if snap.step is not None:  # the stitch's call was made: it must not be made again
                snap.blacklisted = snap.blacklisted or str(e)
                self.policy.aborted(f"resuming after a stitch failed inside dynamo: {e}", c.ops, c.inlined, kind="internal")
                raise RuntimeError(f"dynamo: {e} (after the call at the stitch was made)") from e
            return self._resume_failed(c, snap, e, fn, args, kwargs)

    def _stitch_unfit(self, c, snap, fn, args, kwargs, values):
        """None of the traces recorded after stitch snap fits this call either: what follows the
        stitch depends on values that change between calls (numbers read by .tolist()). The root
        trace goes (an abort, which backs off and, repeated, leaves the function to CPython) and
        the rest of this call runs in the interpreter."""
        root = c.root
        what = f"the stitch at {snap.where} ({snap.guard[len('stitch: '):]})" if snap.step is not None else \
            f"the value read at {snap.where} (grad on: the trace ends there)"
        reason = (f"the trace after {what} was recorded "
                  f"{len(snap.sides)} times and none fits this call: it depends on values that change "
                  f"between calls{_sides_miss(snap, fn, args, kwargs, values)}")
        if root in self.traces:
            self.traces.remove(root)
            self.policy.aborted(reason, root.ops, root.inlined, kind="continuation")
        bump("exits_resumed")
        return self.resume(c, snap, fn, args, kwargs, values)

    def _resume_failed(self, c, snap, e, fn, args, kwargs):
        """dynamo could not rebuild the state at snapshot snap (nothing of the program ran from
        there yet): the exit is blacklisted and, when no trace on the way wrote into the call's
        tensors, the whole call runs again eagerly."""
        snap.blacklisted = snap.blacklisted or str(e)
        self.policy.aborted(f"resuming after a side exit failed inside dynamo: {e}", c.ops, c.inlined, kind="internal")
        if c.root.mutates_any():
            raise RuntimeError(f"dynamo: {e} (after the trace wrote into the call's tensors)") from e
        bump("eager_runs")
        return fn(*args, **kwargs)

    @staticmethod
    def link(parent, k, side):
        """Links side to exit k of parent natively when that is exactly what the Python dispatch
        would do: the same result structure, and no guard the parent's call did not check
        (besides the live values being tensors, which they are)."""
        if parent.handle is None or side.handle is None:  # (a TrainedTrace: no native entry)
            return False
        if parent.python_effects is not None or side.python_effects is not None:
            return False  # (the Python after a native run is Runner.finish's, per trace)
        own = set(parent.guards._checks)
        extra = [chk for chk in side.guards._checks
                 if chk not in own and not (chk.startswith("isinstance(x[") and chk.endswith(", Tensor)"))]
        if extra or side.out_spec != parent.out_spec or side.has_alias or parent.has_alias or \
                k >= parent.num_native_exits or side.cut_id is not None:
            return False
        st = native.lib().dynamo_entry_link_exit(parent.handle, k, side.handle)
        parent.exits[k].linked = st == 0
        return st == 0


def _flat_tensors(v, out):
    """The tensors of a (nested) result, in order."""
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _flat_tensors(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _flat_tensors(x, out)
