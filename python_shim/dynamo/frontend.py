"""dynamo.optimize and friends: the optimized function, its recordings and compiles.

One call of an optimized function:

  1. for each compiled trace of the function (newest last): its Python guards fetch the tensor
     inputs (or say no), then libdynamo checks tensor metadata natively and runs it, with
     outputs allocated from the engine's recycled buffers (tracetree.py: and on through side
     exits and stitches);
  2. on a miss everywhere: if the function is hot (config.hot_threshold calls), under its
     cache limit and not backing off (backoff.py), the recording interpreter runs the call for
     real and records a trace, which is compiled for the next call; otherwise CPython runs it.

A call never returns anything eager PyTorch would not: anything we cannot record soundly ends
the recording (the call still completes in the interpreter), and the reason is kept for
dynamo.explain and the --report of `python -m dynamo` (explain.py).
"""
import atexit
import collections
import copy
import functools
import gc
import os
import sys
import threading
import time
import types

import torch

from . import config, native, probe, reasons, recording, registry, sizes, snapshot, store, tracetree, training
from ._capi import DynamoError
from . import backoff
from .backoff import AUTOGRAD, Policy
from .frames import Abort, NopythonError, StitchNow
from .guards import EXIT, GuardSet, Source
from .interpreter import Interpreter, release, unsupported_reason
from .log import enabled as log_enabled, log
from .registry import bump
from .tracetree import MISS, NEXT, Attempt, Compiled, OutObjects, RecordSide, Runner, _fastcall, _flatten_result, \
    shape_key

EAGER = object()   # OptimizedFunction.call from the frame hook: "let CPython run this frame"
CHURN = 4          # recordings in a row missed at one guard: the value changes every call


_PACKAGE_DIR = __file__.rsplit("/", 1)[0] + "/"


def program_frames(e):
    """The traceback of exception e without dynamo's own frames (those of this package), so that
    a program's exception reads as under eager. Raised in code the recording interpreter ran, it
    has none of the program's frames: their places (interpreter._note_program_frame) are added to
    the exception as a note, once."""
    kept = []
    t = e.__traceback__
    while t is not None:
        if not t.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(t)
        t = t.tb_next
    places = getattr(e, "_dynamo_program_frames", None)
    if places and not getattr(e, "_dynamo_noted", False):
        e._dynamo_noted = True
        e.add_note("raised where dynamo ran the program's code itself (most recent call last):\n" + "\n".join(
            f'  File "{file}", line {line}, in {name}' for file, line, name in reversed(places)))
    for a, b in zip(kept, kept[1:] + [None]):
        a.tb_next = b
    return kept[0] if kept else None


def _trace_name(of, side_of):
    """How logs name a newly compiled trace (numbers from 1, as report() and explain() count):
    root trace n, or the side or stitch trace of exit k of the trace it leaves from."""
    if side_of is None:
        return f"trace {len(of.compiled) + 1}"
    parent, k = side_of
    snap = parent.exits[k]
    kind = "stitch trace after" if snap.step is not None or snap.value_cut else "side trace of"
    root = parent.root if getattr(parent, "root", None) is not None else parent
    n = next((i + 1 for i, c in enumerate(of.compiled) if c is root), "?")
    return f"{kind} exit {k} (under trace {n})"


def _churn_key(v):
    """What _runs_away compares of a guarded value: a container's length, a number, else the
    object's identity."""
    if type(v) in (list, tuple, dict, collections.OrderedDict, torch.Size):
        return len(v)
    if type(v) in (int, float):
        return v
    return ("id", id(v))


def _runs_away(keys):
    """Numbers stepping by one nonzero amount (an arithmetic progression), or all different
    objects: what a value that changes on every call shows over a few calls."""
    if all(type(k) in (int, float) for k in keys):
        steps = {b - a for a, b in zip(keys, keys[1:])}
        return len(steps) == 1 and 0 not in steps
    return len(set(keys)) == len(keys)


def _store_choices_at_exit():
    """A process that ends before a stored trace's 3rd native run still leaves what its steps
    chose (a short script's next run then skips the timing calls too)."""
    for f in registry.functions():
        for c in f.compiled:
            if c.store_id is not None and c.runs:
                f.runner.store_choices(c)


atexit.register(_store_choices_at_exit)


# DYNAMO_PROFILE=1: compiled code times its steps (the library reads the variable too) and each
# function the wall time of its calls that end in native code; dynamo.report() shows both.
PROFILE = os.environ.get("DYNAMO_PROFILE", "") not in ("", "0")


def _policy_field(name, doc):
    """An OptimizedFunction attribute that is its policy's (explain.py, the hook and tests read it)."""
    return property(lambda self: getattr(self.policy, name), lambda self, v: setattr(self.policy, name, v), doc=doc)


class OptimizedFunction:
    dynamo_optimized_forward = True  # what interpreter.runs_class_forward looks for
    calls = _policy_field("calls", "calls since dynamo.reset()")
    attempts = _policy_field("attempts", "what each recording did (tracetree.Attempt)")
    disabled_reason = _policy_field("disabled_reason", "why the function runs in CPython, or None")
    parts = _policy_field("parts", "a module left to CPython: its submodules compiled apart")
    native_runs = property(lambda self: self.runner.native_runs,
                           doc="calls that ended in native code (the counter's share of this function)")
    profiled = ()  # DYNAMO_PROFILE: wall time (s) of the last calls that ended in native code

    def __init__(self, fn, nopython=False, owner=None, bound=None):
        self.fn = fn
        self.owner = owner        # the module, for optimized nn.Module.forward
        self.bound = bound        # the object of an optimized bound method (optimizer.step), passed first
        self.nopython = nopython
        self._dropped = None      # the limits under which a trace found no room: no more recordings
        self.compiled = []        # the compiled root traces (one list for the function's life)
        self._pending = []        # traces recorded in this call whose code waits for its end (_compile_native)
        self.families = []        # sizes.Family: traces serving other sizes without a recording
        self._warned_marks = False  # said once why dims marked dynamic got no size family
        self.name = getattr(fn, "__qualname__", "fn")
        self.policy = Policy(fn, self.name, owner, nopython, self.compiled, type(self).install)
        self.runner = Runner(self.name, self.compiled, self.policy)
        self.value_cuts = False   # with grad on, recordings end the trace at every read of a tensor's
        #                           value (cuts._cut_for_grad), not only after a tensor requiring grad
        self.frames = {}          # device (None: CPU) -> native.Frame
        self.stored = {}          # call signature -> traces from the store not yet loaded
        self._misses = []         # the guard that rejected the calls of the last recordings (_churns)
        self._unfitted = 0        # recordings in a row of one program at other sizes that made no
        #                           size family (_join_family): at UNFITTED, new sizes run eagerly
        functools.update_wrapper(self, fn)
        registry.register(self)

    @classmethod
    def install(cls, m, nopython=False):
        """Optimizes module m's forward in place (its instance attribute `forward`); returns m."""
        of = cls(type(m).forward, nopython=nopython, owner=m)
        m.forward = of
        m.__prepare_scriptable__ = of._plain_owner  # torch.jit.script asks the module for this
        m.__getstate__ = of._plain_state            # pickle and torch.save: the plain module
        m.__deepcopy__ = of._optimized_copy         # copy.deepcopy: an optimized module again
        return m

    def _plain_state(self):
        """The optimized module's pickled state (pickle and torch.save ask the module for it):
        the plain module's, without dynamo's instance attributes, so that the file loads where
        dynamo is not installed, as the module the user wrote (dynamo.optimize it again there)."""
        state = type(self.owner).__getstate__(self.owner)
        for name in _MODULE_ATTRS:
            state.pop(name, None)
        return state

    def _optimized_copy(self, memo):
        """copy.deepcopy of the optimized module: a deep copy of the plain module, optimized
        afresh (its traces' guards would check the original's identity); this forward's copy
        is the copy's forward."""
        m = self.owner
        twin = type(m).__new__(type(m))
        memo[id(m)] = twin
        twin.__setstate__(copy.deepcopy(self._plain_state(), memo))
        type(self).install(twin, self.nopython)
        memo[id(self)] = twin.__dict__["forward"]
        return twin

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self):
        """Pickles (and copies) no compiled state: a module-level optimized function by reference,
        anything else as a fresh, uncompiled OptimizedFunction of the same function and module."""
        if self.owner is None and self.bound is None and _is_global(self):
            return self.__qualname__
        return type(self), (self.fn, self.nopython, self.owner, self.bound)

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

    def __call__(self, *args, **kwargs):
        if self.owner is not None:
            args = (self.owner,) + args
        elif self.bound is not None:
            args = (self.bound,) + args
        try:
            return self.call(self.fn, args, kwargs, in_frame=False)
        except BaseException as e:  # the program's own (ours never get here): shown as eager shows it
            e.__traceback__ = program_frames(e)
            raise

    def call(self, fn, args, kwargs, in_frame):
        """One call of fn (a function object of this code). in_frame: called from the frame
        hook, which runs the frame itself when we return EAGER instead of a result. In order:
        the compiled traces; traces made without a recording (size families and probes, the
        trace store); the policy (backoff.py: why not record now); a recording."""
        bump("calls")
        policy = self.policy
        policy.calls += 1
        fast = policy.fast_eager
        if fast is not None and policy.calls < fast[0] and fast[1] == config._version:
            return self._eager(fn, args, kwargs, in_frame)  # (left to CPython, nothing to check)
        if PROFILE:
            t0, runs = time.perf_counter(), self.runner.native_runs
            result = self.runner.run(self.compiled, fn, args, kwargs)
            if self.runner.native_runs != runs:
                if not self.profiled:
                    self.profiled = collections.deque(maxlen=10000)
                self.profiled.append(time.perf_counter() - t0)
        else:
            result = self.runner.run(self.compiled, fn, args, kwargs)
        if result is MISS and self.compiled:
            self._missed(fn, args, kwargs)
            if policy.disabled_reason is None:
                try:
                    result = self._from_sizes(fn, args, kwargs)
                except Exception as e:  # noqa: BLE001 -- never leak an internal error: the call is recorded
                    log("recompiles", f"{self.name}: size families failed inside dynamo ({type(e).__name__}: {e}); "
                                      "the call is recorded")
                    result = MISS
        if result is MISS:
            if self._left_to_cpython(args):
                return self._eager(fn, args, kwargs, in_frame)
            result = self._from_store(fn, args, kwargs) if store.enabled() else MISS
        if result is MISS:
            churn_checked = bool(self.compiled)
            if churn_checked and self._churns(fn, args, kwargs):
                return self._eager(fn, args, kwargs, in_frame)
            with _collector_paused():
                try:
                    result = self._record(fn, args, kwargs, in_frame)
                except BaseException:
                    # The program's own exception (eager raises it too): a call that fails says
                    # nothing of state that changes between calls, so its miss is not one of them.
                    if churn_checked and self._misses:
                        self._misses.pop()
                    raise
                finally:
                    if self._pending and type(result) is not RecordSide:
                        self._settle_pending()
        if type(result) is RecordSide:
            with _collector_paused():
                try:
                    while type(result) is RecordSide:  # the runner stopped where a trace is to be recorded now
                        result = self._record_side(result, fn, args, kwargs)
                finally:
                    if self._pending:
                        self._settle_pending()
        return result

    def _missed(self, fn, args, kwargs):
        """Every compiled trace rejected the call: counted, and said per trace under DYNAMO_LOG=guards."""
        bump("guard_misses")
        if log_enabled("guards"):
            for i, c in enumerate(self.compiled):
                why = c.guards.explain_failure(args, kwargs, fn.__globals__, fn) or "tensor metadata (checked natively)"
                log("guards", f"{self.name}: trace {i + 1} rejected the call: {why}")

    def _from_sizes(self, fn, args, kwargs):
        """The call through a size family's instance (a family made now by size probes if none
        serves it yet), or MISS."""
        result = self._from_family(fn, args, kwargs) if self.families else MISS
        if result is MISS and self._probe_sizes(fn, args, kwargs):
            result = self._from_family(fn, args, kwargs)
        return result

    def _left_to_cpython(self, args):
        """True when this call runs in CPython instead of recording: the policy says so
        (backoff.py: left to CPython, aborted in this call's state, backing off), the function
        is not hot yet, or its cache is full."""
        if self.policy.runs_eagerly(args):
            return True
        if self._unfitted >= UNFITTED:
            self.policy.fallback(f"{UNFITTED} recordings in a row of the same program at other sizes made no size family "
                                 "(DYNAMO_LOG=recompiles says why); further sizes run eagerly")
            return True
        if self.calls < config.hot_threshold or self._cache_full():
            if self._cache_full() and not getattr(self, "_warned", False):
                self._warned = True
                print(f"dynamo: {self.name} hit its cache limit ({config.cache_limit} traces"
                      f"{f', {config.size_variants} more sharing their code' if self._shared_count() else ''}); "
                      f"further variants run eagerly", file=sys.stderr)
            self.policy.fallback("cache limit reached" if self.compiled else "not hot yet")
            return True
        return False

    def _churns(self, fn, args, kwargs):
        """Before recording again after a miss: whether the newest trace rejected this call at the
        guard that rejected the calls of the last CHURN recordings too, at values that run away
        (a length or a number stepping by the same amount each time: a list appended to on every
        call, a counter; or a new object each time): then every call would record. Values that
        come and go (batch sizes, a flag) are left to the cache. The function is left to CPython
        (it comes back as any function left, backoff.py), and the reason says which value."""
        newest = self.compiled[-1]
        gs = getattr(newest, "guards", None)
        got = gs.failure(args, kwargs, fn.__globals__, fn) if gs is not None else None
        self._misses = (self._misses + [got and (got[0], _churn_key(got[3]))])[-CHURN:]
        if len(self._misses) < CHURN or None in self._misses or len({m[0] for m in self._misses}) != 1 or \
                not _runs_away([m[1] for m in self._misses]):
            return False
        what = gs.explain_failure(args, kwargs, fn.__globals__, fn)
        why = (f"a value its traces depend on changes on every call -- {what} -- so every call would record (it "
               f"did {CHURN} times in a row); the function runs in CPython. Keep state that changes on every call "
               "(a list appended to, a step counter) out of the optimized function: e.g. return the value and "
               "append it in the caller")
        self._misses = []
        self.compiled.clear()  # (each held a value no later call will have)
        self.families = []
        self.policy.leave(why)
        print(f"dynamo: {self.name}: {why}", file=sys.stderr)
        self.policy.fallback(why)
        return True

    def _from_store(self, fn, args, kwargs):
        """Before recording: the traces an earlier process stored for this code (store.py) whose
        constants bind and whose guards accept this call are compiled (their objects come from
        the disk cache) and run it. MISS when none does."""
        code = getattr(fn, "__code__", None)
        if code is None:
            return MISS
        try:
            at = store.where(code, args, kwargs)
            if at[1] not in self.stored:
                self.stored[at[1]] = store.load(at)
        except Exception as e:  # noqa: BLE001 -- the store only ever saves a recording
            log("store", f"{self.name}: the trace store failed: {type(e).__name__}: {e}")
            return MISS
        pending = self.stored[at[1]]
        for t in list(pending):
            if self._cache_full():
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
                        why = f"its guards reject this call: {gs.explain_failure(args, kwargs, fn.__globals__, fn)}"
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
            c = self._compile_stored(t, gs, at, shape_key(args))
            if c is not None:
                result = self.runner.run_one(c, inputs, fn, args, kwargs)
                if result is not NEXT:
                    return result
        return MISS

    def _compile_stored(self, t, gs, at, key):
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
        c = Compiled(gs, t["text"], entry, t["out_spec"], gs.tensor_inputs, t["ops"], t["inlined"], shape_key=key,
                     mutates=t["mutates"], stored=(at, t["id"], t.get("choices", "")))
        bump("compile_seconds", c.stats.compile_ms / 1e3)
        if c.stats.from_cache:
            bump("cache_hits")
        if c.stats.shared_code:
            bump("code_shared")
        bump("traces_from_store")
        if self.compiled:
            bump("recompiles")
        self.compiled.append(c)
        self.attempts.append(Attempt(None, c, c.ops, c.inlined))
        log("traces", f"{self.name}: trace from the store: {c.stats.num_instructions} IR instruction(s) -> "
                      f"{c.stats.num_kernels} fused kernel(s), {c.stats.num_externs} LibTorch call(s), "
                      f"{c.stats.compile_ms:.1f} ms{_code_note(c.stats)}")
        return c

    @staticmethod
    def _eager(fn, args, kwargs, in_frame):
        bump("eager_runs")
        return EAGER if in_frame else fn(*args, **kwargs)

    def _record(self, fn, args, kwargs, in_frame=False):
        call = recording.CallFacts(shape_key(args), _leaf_shapes(args, kwargs))
        wrapper = _distributed_wrapper(self.owner)
        if wrapper is not None:  # not recorded: its forward is left to CPython, its module compiled
            self.policy.leave(wrapper)
            self.policy._compile_parts()
            self.policy.fallback(wrapper)
            return self._eager(fn, args, kwargs, in_frame)
        why = unsupported_reason(fn.__code__, top=True) if isinstance(fn, types.FunctionType) else "not a Python function"
        if why is not None:
            bump("aborts")
            bump("abort_python")
            self.policy.leave(f"{self.name} uses {why}")
            self.policy.fallback(self.disabled_reason)
            return self._eager(fn, args, kwargs, in_frame)
        if store.enabled() and getattr(fn, "__code__", None) is not None:
            try:  # (the arguments as the call gets them: before it runs)
                call.store_where = store.where(fn.__code__, args, kwargs)
            except Exception as e:  # noqa: BLE001 -- only later processes depend on it
                log("store", f"{self.name}: no place in the trace store: {type(e).__name__}: {e}")
        rec, gs, interp = recording.start(self.name, nopython=self.nopython and self.name,
                                          value_cuts=self.value_cuts, call=call)
        bump("interpreted_runs")
        if self.compiled:
            log("recompiles", f"{self.name}: recording trace {len(self.compiled) + 1} (no compiled trace accepted the call)")
        t0 = time.perf_counter()
        rng = torch.get_rng_state()
        stitched = None
        try:
            result, raised = recording.run(rec, interp, lambda: interp.run(fn, args, kwargs))
        except StitchNow as s:  # a stitch's step was made: the rest of the call from its snapshot
            stitched = s
        if stitched is not None:  # (outside the handler: the program's exceptions do not chain to it)
            log("perf", f"{self.name}: recorded up to a stitch in {(time.perf_counter() - t0) * 1e3:.1f} ms")
            return self._through_stitch(rec, gs, interp, stitched.value, None, fn, args, kwargs)
        if raised is not None:  # the program's own exception, or ours
            return self._recording_raised(raised, rec, interp, rng, fn, args, kwargs, in_frame)
        log("perf", f"{self.name}: recorded in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        try:
            return self._compile(rec, gs, interp, result)
        finally:
            release(rec, interp)

    def _record_side(self, want, fn, args, kwargs):
        """Records the trace the runner asked for (want: a RecordSide) from its exit's snapshot:
        the rest of this call runs in the recording interpreter and is compiled as a side trace
        of that exit (a stitch's continuation likewise). Returns the call's result, or another
        RecordSide when this recording stopped at a stitch of its own."""
        c, exit_id, values = want.c, want.exit_id, want.values
        snap = c.exits[exit_id]
        # (the snapshot's source expressions name its constants)
        rec, gs, interp = recording.start(f"{self.name}_exit{exit_id}", consts=snap.consts, value_cuts=self.value_cuts)
        bump("interpreted_runs")
        env = dict(snap.consts, a=args, k=kwargs, g=fn.__globals__, f=fn, Tensor=torch.Tensor, torch=torch)
        rng = torch.get_rng_state()

        def body():
            # Inputs in the order native linking needs: the parent's, then the live values.
            for expr in c.input_srcs:
                if not expr.startswith("x["):  # a side trace's own exit values are not in scope
                    interp.touch_input(snapshot.eval_source(expr, env, rec), Source(expr))
            for i, t in enumerate(values):
                interp.touch(t, EXIT.item(i))
            interp.param_bytes = 0  # (the parent's parameters: a DDP bucket counts this trace's own)
            return snapshot.resume(snap, fn, args, kwargs, values, interp, recorded=True)
        stitched = None
        try:
            result, raised = recording.run(rec, interp, body)
        except StitchNow as s:  # the side trace reached a stitch of its own and made its step
            stitched = s
        if stitched is not None:  # (outside the handler, as above)
            return self._through_stitch(rec, gs, interp, stitched.value, (c, exit_id), fn, args, kwargs)
        if raised is not None:  # as in _recording_raised, from the exit on
            effect = interp.effect or rec.effect
            interp.abandoned = effect is None  # (as in _recording_raised)
            release(rec, interp)
            self.policy.side_aborted(snap, f"recording failed inside dynamo: {type(raised).__name__}: {raised}",
                                     "internal")
            if effect is not None or isinstance(raised, NopythonError):
                raise raised
            torch.set_rng_state(rng)
            bump("exits_resumed")
            return self.runner.resume(c, snap, fn, args, kwargs, values)
        try:
            return self._compile(rec, gs, interp, result, side_of=(c, exit_id))
        finally:
            release(rec, interp)

    def _through_stitch(self, rec, gs, interp, value, side_of, fn, args, kwargs):
        """A recording (a root, or a side trace of side_of) stopped at a stitch whose step it just
        made (value: its result): the trace so far is compiled, and the rest of this call goes on
        from the stitch's snapshot with the recording's live tensors -- through the runner, which
        asks for the trace after the stitch to be recorded now (RecordSide), so that the next
        call runs natively through the stitch."""
        snap, live = rec.cut
        # (dense and fresh, as native code hands them out: a live value that is a view -- a
        # transposed temporary permuted into its memory order -- is copied)
        values = [t.clone(memory_format=torch.contiguous_format) if t._base is not None or not t.is_contiguous()
                  else t for t in live] + [value] + (snap.pre_now or [])
        snap.pre_now = None  # (this call's: later calls read them before the step)
        try:
            self._compile(rec, gs, interp, None, side_of=side_of)
        finally:
            release(rec, interp)
        bump("stitches")
        snap.count += 1
        owner = snap.owner
        if owner is None:  # not compiled (an abort, counted): the rest in the interpreter
            bump("exits_resumed")
            try:
                return snapshot.resume(snap, fn, args, kwargs, values, Interpreter.unrecorded())
            except snapshot.ResumeFailed as e:
                raise RuntimeError(f"dynamo: {e} (after the call at the stitch was made)") from e
        return self.runner.after_exit(owner, owner.cut_id, values, fn, args, kwargs)

    def _recording_raised(self, e, rec, interp, rng, fn, args, kwargs, in_frame):
        """The recorded call raised e. Without effects outside the call so far (interpreter and
        recorder both say so), the call is run again eagerly from the same RNG state: if eager
        raises too, that exception -- the program's own, with its own traceback -- propagates
        and nothing is counted; if it succeeds, e was dynamo's failure: it is kept as the reason
        and eager's result returned. After effects the call cannot be repeated, so e propagates."""
        effect = interp.effect or rec.effect
        if effect is None:  # (what it ran runs again: its generators' finally blocks must not run twice)
            interp.abandoned = True
        release(rec, interp)
        if isinstance(e, NopythonError):
            raise e
        if effect is not None:
            self.policy.aborted(f"the recorded call raised {type(e).__name__}: {e} (after {effect}, so it was not run "
                          "again eagerly)", rec.ops, interp.inlined)
            raise e
        reason = f"recording failed inside dynamo: {type(e).__name__}: {e}"
        torch.set_rng_state(rng)
        # In a frame of the hook's this runs inside its handler, so CPython runs the whole call
        # (no frame of it is handed to the hook): the same call as the frame's, once.
        out = fn(*args, **kwargs)
        self.policy.aborted(reason, rec.ops, interp.inlined, rec.abort_where, rec.abort_selves, kind="internal")
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
                self.policy.side_aborted(side_of[0].exits[side_of[1]], reason)
            else:
                self.policy.aborted(reason, rec.ops, interp.inlined)
            return result

    def _compile_trace(self, rec, gs, interp, result, side_of):
        # a stitch with nothing recorded before it (print(...) first thing): guards, no native code
        guards_only = rec.abort_reason is None and rec.cut is not None and rec.cut[0].step is not None and \
            not rec.ops and not rec.cut[1]
        out_spec = names = None
        train = False
        if rec.abort_reason is None and not guards_only:
            try:
                outputs = self._trace_outputs(rec, gs, interp, result, side_of)
            except Abort as e:  # (the trace itself fails: also after a cut, which rec.abort would ignore)
                rec.abort_reason, rec.abort_kind = str(e), e.kind
                rec.abort_where = rec.abort_where or "the end of the call"  # (what it returns, grad mode)
            else:
                if outputs is None:  # recorded again at the next call (value cuts)
                    return result
                out_spec, names, train = outputs
        if rec.abort_reason is not None:
            self._recording_aborted(rec, interp, side_of)
            return result
        text = rec.text(names) if not guards_only else "(no native code: a stitch first)"
        if train:
            return self._compile_training(rec, gs, interp, result, text, out_spec, names, side_of)
        c = self._compile_native(rec, gs, interp, text, out_spec, guards_only, side_of)
        if c is None:
            return result
        c.python_effects = getattr(rec, "python_effects", None)
        self._attach_cut(c, rec)
        if side_of is not None:
            self._add_side(c, side_of)
            if not c.is_pending:  # (a pending trace does both once it has its code)
                if c.stats.shared_code:
                    bump("code_shared")
                Runner.link(side_of[0], side_of[1], c)
        else:
            self._keep_root(c, rec, gs, interp, text, out_spec, guards_only)
        return result

    def _trace_outputs(self, rec, gs, interp, result, side_of):
        """(output spec, output value names, whether it trains) of a finished recording, or None
        when it is dropped to be recorded again with value cuts; raises Abort when the recording
        cannot become a trace (grad mode changed, grad without training support, nothing
        recorded)."""
        train = False
        if rec.cut is None and torch.is_grad_enabled() != interp.grad_at_start:
            raise Abort("the call changes grad mode and does not restore it", "python")
        if torch.is_grad_enabled() and any(t.requires_grad for t in rec.keep):
            if config.training and rec.exits and rec.value_exits == len(rec.exits) and not interp.value_cuts:
                # a branch on a tensor came before the first tensor requiring grad, and became a
                # side exit: the trace goes, unannounced, and the next recording ends the trace at
                # such branches, as it would have after that tensor
                self.value_cuts = True
                log("recompiles", f"{self.name}: a side exit came before a tensor requiring grad: "
                                  "recording again with the trace ending at each branch on a tensor")
                return None
            why = training.unsupported(rec, side_of is not None) if config.training else "config.training is off"
            if why is not None:
                rec.quiet = why == training.SMALL  # (nothing for the user to do: not said on stderr)
                raise Abort(f"{AUTOGRAD}: grad mode is on and a tensor requires grad, and {why} (compile "
                            "under torch.no_grad() or torch.inference_mode())", "autograd")
            train = True
        if rec.train_only is not None and not train:
            raise Abort(rec.train_only, "write")
        if rec.cut is not None:  # the trace's outputs are the live values at the cut
            names = [rec.output_name(t) for t in rec.cut[1]]
            out_spec = ("cut",)
        else:
            index = {i: gs.tensor_inputs.index(e) for i, e in interp.tensor_src.items() if e in gs.tensor_inputs}
            # objects from outside the call that it returns (a Hugging Face cache handed back in
            # the ModelOutput), found again at their sources after the native run; only for a root
            # trace, where none of the program's Python runs between the call's start and its end
            # (a side trace may follow a stitch's step)
            objects = OutObjects(interp.obj_srcs) if not train and side_of is None else None
            value = result
            if interp.writebacks:
                value = (result, tuple(v for _, _, v in interp.writebacks))
            out_spec, names = _flatten_result(value, rec, index, objects)
            if interp.writebacks or (objects is not None and objects.exprs):
                if interp.writebacks:
                    gs.guard_distinct()
                rec.python_effects = (gs.getter([s.expr for s, _, _ in interp.writebacks]),
                                      [n for _, n, _ in interp.writebacks],
                                      gs.getter(objects.exprs) if objects is not None and objects.exprs else None)
        if not rec.ops and rec.cut is None:  # (a cut trace may hand its live values on as they are)
            raise Abort("no tensor operations on this path (nothing to compile)", "nothing")
        if not names:  # the work is in place, or returns inputs and Python values only:
            names = [rec.last_value()]  # a trace has an output; this one is not returned
        return out_spec, names, train

    def _recording_aborted(self, rec, interp, side_of):
        """Counts why a finished recording does not become a trace (rec.abort_reason)."""
        if side_of is not None:
            self.policy.side_aborted(side_of[0].exits[side_of[1]], rec.abort_reason, rec.abort_kind)
            return
        if reasons.policy(rec.abort_kind) == "state":
            self.policy.state_aborted(rec.abort_reason, interp.run_args, rec.abort_kind, getattr(rec, "quiet", False))
        else:
            self.policy.aborted(rec.abort_reason, rec.ops, interp.inlined, rec.abort_where, rec.abort_selves,
                          kind=rec.abort_kind)
        self.policy.fallback(rec.abort_reason)

    @staticmethod
    def _storable(rec, side_of, guards_only):
        """Whether the trace goes to the trace store: a root with no exits or cut, on the CPU."""
        return side_of is None and not rec.exits and rec.cut is None and not guards_only and \
            rec.device is None and getattr(rec, "python_effects", None) is None and store.enabled()

    def _compile_native(self, rec, gs, interp, text, out_spec, guards_only, side_of):
        """The Compiled of trace `text` (its guards' function built while LLVM compiles), or None
        when the compile fails (counted, and the recording's reason kept). A trace that ends at
        a cut (a stitch: the call goes on recording the trace after it) is pending instead: built
        when first needed or when the call ends (_settle_pending), and never when the call drops
        its tree meanwhile (config.max_stitches: a detection model's per-class loop)."""
        frame = self._frame_for(rec.device)
        ops, inlined, nexits = rec.ops, interp.inlined, len(rec.exits)
        binder = self._storable(rec, side_of, guards_only)
        kind = _trace_name(self, side_of)

        def build():
            """The guard function and native code: (entry, None), or (None, why not) with the
            failure counted (compile_failures)."""
            t0 = time.perf_counter()
            job = _InBackground(lambda: frame.compile(native.Trace(text)) if not guards_only else None)
            try:
                gs.compile(binder=binder)  # (ctypes drops the GIL meanwhile)
            finally:
                job.thread.join()
            try:
                entry = job.result()
            except DynamoError as e:
                bump("compile_failures")
                bump("compile_seconds", time.perf_counter() - t0)
                return None, f"compile failed: {e.message}"
            if entry is not None:
                st = entry.stats()
                bump("compile_seconds", st.compile_ms / 1e3)  # the native compile (guards were built meanwhile)
                if st.from_cache:
                    bump("cache_hits")
                log("traces", f"{self.name}: compiled {kind}: {len(ops)} ATen op(s), {st.num_instructions} IR "
                              f"instruction(s), {nexits} side exit(s) -> {st.num_kernels} fused kernel(s), "
                              f"{st.num_externs} LibTorch call(s), {st.compile_ms:.1f} ms{_code_note(st)}")
                log("perf", f"{self.name}: {kind} compiled in {st.compile_ms:.1f} ms")
            return entry, None

        def failed(why, c=None):
            """The compile failed: counted as the recording's abort (a pending trace c leaves its tree)."""
            if side_of is not None:
                snap = side_of[0].exits[side_of[1]]
                if c is not None and c in snap.sides:
                    snap.sides.remove(c)
                self.policy.side_aborted(snap, why)
            else:
                if c is not None and c in self.compiled:
                    self.compiled.remove(c)
                self.policy.aborted(why, ops, inlined)
                self.policy.fallback(why)

        out_spec = ("cut",) if guards_only else out_spec
        if rec.cut is None:
            entry, why = build()
            if why is not None:
                failed(why)
                return None
            return Compiled(gs, text, entry, out_spec, gs.tensor_inputs, ops, inlined, rec.exits, mutates=rec.mutated)

        def pending():
            if c.root not in self.compiled:  # the call dropped its tree (or the root found no room)
                bump("compiles_skipped")
                log("perf", f"{self.name}: {kind} not compiled: its trace tree was dropped first")
                return None, "its trace tree was dropped before it was compiled"
            entry, why = build()
            if why is not None:
                failed(why, c)
            return entry, why

        def settled():
            if c.failed is None and c.stats.shared_code:
                bump("code_shared")
            if side_of is not None:
                Runner.link(side_of[0], side_of[1], c)

        c = Compiled(gs, text, None, out_spec, gs.tensor_inputs, ops, inlined, rec.exits, mutates=rec.mutated,
                     pending=(pending, settled))
        self._pending.append(c)
        return c

    def _settle_pending(self):
        """Builds the traces this call left pending (_compile_native), in the order recorded."""
        while self._pending:
            self._pending.pop(0).settle()

    def _keep_root(self, c, rec, gs, interp, text, out_spec, guards_only):
        """A compiled root trace joins the function's traces, when its kind has room (else it
        goes, and no more recordings come), then its size family and the trace store."""
        if (self._shared_count() >= config.size_variants if _shares_code(c)
                else self._own_count() >= config.cache_limit):
            # no room for this kind of trace (the other kind had room): it goes, and no more
            # recordings come (one recording past a limit at most)
            self._dropped = (config.cache_limit, config.size_variants)
            log("recompiles", f"{self.name}: trace dropped: "
                              + (f"{config.size_variants} traces share machine code already (size_variants)"
                                 if _shares_code(c) else
                                 f"{config.cache_limit} traces have machine code of their own already (cache_limit)"))
            return
        if _shares_code(c):
            bump("code_shared")
        self._add_root(c, rec, interp)
        if all(e.plain_branch for e in rec.exits) and rec.cut is None and not guards_only and rec.device is None:
            c.size_fixed = {**rec.size_fixed, **interp.sizes.size_fixed}
            c.size_guards, c.size_passed = interp.sizes.size_guards, interp.sizes.size_passed
            c.size_opaque = interp.sizes.size_opaque
            c.dynamic_marks = dict(rec.input_marks)
            self._join_family(c, interp.sizes.size_read)
        if self._storable(rec, None, guards_only) and rec.call.store_where is not None:
            try:
                c.store_id = store.save(rec.call.store_where, self.name, gs.export(), text, out_spec, rec.ops,
                                        interp.inlined, rec.mutated)
                c.store_where = rec.call.store_where
            except Exception as e:  # noqa: BLE001 -- only later processes depend on it
                log("store", f"{self.name}: trace not stored: {type(e).__name__}: {e}")

    def _compile_training(self, rec, gs, interp, result, text, out_spec, names, side_of):
        """A recorded call (a root, or a side trace of side_of) with tensors that require grad: a
        TrainedTrace (training.py), whose forward and backward compile on its first run. Returns
        the recorded call's result."""
        inputs = list(rec.input_tensors)
        name = self.name if side_of is None else f"{self.name}.after_exit{side_of[1]}"
        try:
            c = training.TrainedTrace(name, rec, gs, text, out_spec, names, interp.inlined, inputs, optimize)
        except Exception as e:  # noqa: BLE001 -- never leak an internal error to the program
            reason = f"{AUTOGRAD}: the forward and backward could not be set up: {type(e).__name__}: {e}"
            if side_of is not None:
                self.policy.side_aborted(side_of[0].exits[side_of[1]], reason, "autograd")
                return result
            self.policy.aborted(reason, rec.ops, interp.inlined, kind="autograd")
            self.policy.fallback(reason)
            return result
        self._attach_cut(c, rec)
        if side_of is not None:
            self._add_side(c, side_of)
        else:
            self._add_root(c, rec, interp)
        return result

    @staticmethod
    def _attach_cut(c, rec):
        """A trace that ends at a cut (a stitch, config.max_trace_ops, a value read with grad on)
        owns the cut's snapshot as its last exit."""
        if rec.cut is not None:
            c.cut_id = len(c.exits)
            c.cut_values = len(rec.cut[1])
            c.exits.append(rec.cut[0])
            rec.cut[0].owner = c

    @staticmethod
    def _add_side(c, side_of):
        """c joins exit side_of = (parent, exit id) as one of its side traces (counted)."""
        parent, k = side_of
        snap = parent.exits[k]
        snap.sides.append(c)
        c.root = parent.root
        if snap.step is not None or snap.value_cut:  # the trace after a stitch or a value read
            c.root.stitch_count += 1
            bump("stitch_traces")
        else:
            c.root.side_count += 1
            bump("side_traces_compiled")

    def _add_root(self, c, rec, interp):
        """A newly compiled root trace joins the function's traces (counted)."""
        c.shape_key = rec.call.shape_key
        c.leaf_shapes = rec.call.leaf_shapes
        if self.compiled:
            bump("recompiles")
        self.compiled.append(c)
        self.attempts.append(Attempt(None, c, rec.ops, interp.inlined))
        bump("traces_compiled")

    def _own_count(self):
        return sum(1 for c in self.compiled if not _shares_code(c) and c.family is None)

    def _join_family(self, c, size_read):
        """After recording root trace c: with an earlier trace of the same program at other sizes
        (or a family of them), a family that serves further sizes without recording (sizes.py)."""
        c.size_read = size_read
        marks = c.dynamic_marks
        if config.dynamic is False and not marks:
            return
        if size_read is not None:
            self._family_refused(c, f"the trace serves its own sizes only: the program read {size_read}")
            return
        why = None
        for k, fam in enumerate(self.families):
            if not sizes.same_program(fam.proto, c):
                continue
            wide, why = fam.widened(c)
            if wide is not None:
                why = _outside_marks(wide, marks)
                if why is not None:
                    continue
                wide.instances = fam.instances
                self.families[k] = wide
                _key_member(wide, wide.proto)
                _key_member(wide, c)
                self._unfitted = 0
                log("recompiles", f"{self.name}: size family widened by this trace: {wide.describe()}")
                return
        for p in self.compiled:
            if p is c or p.family is not None or p.size_read is not None or not _branch_exits_only(p) or \
                    p.cut_id is not None or not sizes.same_program(p, c):
                continue
            try:
                fam, why = sizes.Family.of_trace(p).widened(c)
            except Exception as e:  # noqa: BLE001 -- only later calls' speed depends on it
                fam, why = None, f"{type(e).__name__}: {e}"
            if fam is not None:
                why = _outside_marks(fam, marks)
                if why is not None:
                    fam = None
                    continue
                self.families.append(fam)
                _key_member(fam, p)
                _key_member(fam, c)
                log("recompiles", f"{self.name}: size family from this trace and trace {self.compiled.index(p) + 1}: "
                                  f"{fam.describe()}; other sizes of it compile without a recording")
                self._unfitted = 0
                return
        if why is not None:
            self._family_refused(c, f"no size family with the earlier traces: {why}")
            self._unfitted += 1

    def _probe_sizes(self, fn, args, kwargs):
        """A call that a recorded trace's Python guards accept but its sizes do not: once per
        such trace, probes (probe.py) look for the size family of every argument dim that can
        vary, without recording. Whether one was added."""
        if not config.size_probes or not _has_tensor(args, kwargs) or self._cache_full() or \
                config.dynamic is False and not _has_marks(args, kwargs):
            return False
        for c in self.compiled:
            if type(c) is not Compiled or c.family is not None or c.size_read is not None or \
                    not _branch_exits_only(c) or \
                    c.cut_id is not None or getattr(c, "probed", False):
                continue
            try:
                inputs = c.check(args, kwargs, fn.__globals__, fn)
            except Exception:  # noqa: BLE001 -- (as the trace's own run would judge it: not this one)
                inputs = None
            if inputs is None:
                continue
            now = [tuple(t.shape) if isinstance(t, torch.Tensor) else () for t in inputs]
            recorded = probe.input_shapes(c)
            if now == recorded or len(now) != len(recorded) or \
                    any(len(a) != len(b) for a, b in zip(now, recorded)):
                continue  # (not a miss on sizes: strides, dtypes, another structure)
            c.probed = True
            try:
                fam, why, runs = probe.family(c, self.name, fn, args, kwargs, inputs)
            except Exception as e:  # noqa: BLE001 -- never leak an internal error to the program
                fam, why, runs = None, f"internal error: {type(e).__name__}: {e}", 0
            bump("size_probes", runs)
            if fam is None:
                self._family_refused(c, f"size probes of trace {self.compiled.index(c) + 1} found no family: {why}")
                return False
            why = _outside_marks(fam, c.dynamic_marks)
            if why is not None:
                self._family_refused(c, why)
                return False
            self.families.append(fam)
            _key_member(fam, c)
            log("recompiles", f"{self.name}: size family from {runs} probes of trace {self.compiled.index(c) + 1}: "
                              f"{fam.describe()}; other sizes of it compile without a recording")
            return True
        return False

    def _family_refused(self, c, why):
        """Says why trace c joined no size family: DYNAMO_LOG=recompiles, and once on stderr
        when the call's tensors had dims marked dynamic (dynamo.mark_dynamic)."""
        log("recompiles", f"{self.name}: {why}")
        if c.dynamic_marks and not self._warned_marks:
            self._warned_marks = True
            print(f"dynamo: {self.name}: dims marked dynamic, but the trace serves its own sizes: {why}",
                  file=sys.stderr)

    def _inherit_choices(self, fam, entry, key):
        """A new instance takes what the family's newest member (an instance or the trace it was
        made from) chose for its product and convolution steps (BLAS or the own GEMM, oneDNN,
        Winograd or ATen) instead of timing them in its first runs (which costs more than the
        call at a new size). key: the call's shape_key; only a member with sizes 1 in the same
        places is asked (a choice made for one image or one token is a poor one for a batch).
        Steps no member has decided time themselves -- unless the sizes keep changing (two
        instances made already: a sweep, one call per size, where no step ever finishes timing
        and each would time its three convolution paths, Winograd's weight transform included,
        at every size): then undecided convolutions take oneDNN's direct kernel at once and
        undecided products LibTorch's BLAS (eager's own path; timing their three sides took an
        encoder layer's first two calls at a new size to ~3x a steady call), and Winograd
        (whose setup pays back over many calls at one size) gives way to oneDNN; the instance
        times them after all once it is hot at its size (Compiled.retime_at). Returns the
        inherited choices when it made such defaults, else None."""
        inherited = ""
        for c in reversed(self.compiled):
            if c.family is not fam and c is not fam.proto or _ones(c.shape_key) != _ones(key) or c.defaulted:
                continue
            try:
                inherited = c.entry.choices()
            except DynamoError as e:
                log("recompiles", f"{self.name}: size family instance keeps its own step timing: {e.message}")
                return None
            if inherited:
                break
        sweep = fam.instances >= 2
        words = [w.replace("=winograd", "=onednn") if sweep else w for w in inherited.split()]
        try:
            if words:
                entry.set_choices(" ".join(words))
        except DynamoError as e:  # then it times them itself
            log("recompiles", f"{self.name}: size family instance keeps its own step timing: {e.message}")
            return None
        if not sweep:
            return None
        decided = {w.split("=")[0] for w in words}
        for k in range(entry.stats().num_externs):
            if str(k) not in decided:
                for choice in ("onednn", "blas"):  # (a step refuses what it is not: a convolution, a product)
                    try:
                        entry.set_choices(f"{k}={choice}")
                        break
                    except DynamoError:
                        pass
        return " ".join(w for w in inherited.split() if not w.endswith("=winograd"))

    def _entry_maker(self, text, fam, key):
        """An instance's retimer (tracetree.Compiled._retime): when a member of its family fam
        (for calls of shape_key key) has timed its steps by then, the instance's entry takes
        those choices (a decode step at each new cache length: the products are the same at
        every length); else a fresh entry of trace text that times its steps itself."""
        def make(c):
            choices = self._timed_choices(fam, key)
            if choices:
                c.entry.set_choices(choices)
                return None
            return self._frame_for(None).compile(native.Trace(text))
        return make

    def _timed_choices(self, fam, key):
        """The step choices of the newest member of family fam (at sizes 1 where key has them)
        that timed its steps itself: a recorded trace, or an instance after its retiming."""
        for c in reversed(self.compiled):
            if (c.family is fam or c is fam.proto) and not c.defaulted and _ones(c.shape_key) == _ones(key):
                try:
                    words = c.entry.choices().split()
                except DynamoError:
                    return ""
                if words:
                    return " ".join(w for w in words if not w.endswith("=winograd"))
        return ""

    def _from_family(self, fn, args, kwargs):
        """A call no trace took, at sizes a family serves: an instance of the family compiled
        for these sizes (no recording) runs it. MISS when no family applies."""
        for fam in self.families:
            inputs = fam.proto.check(args, kwargs, fn.__globals__, fn)
            if inputs is None:
                continue
            text, why = fam.instantiate(inputs)
            if text is None:
                log("guards", f"{self.name}: size family does not serve this call: {why}")
                continue
            if self._shared_count() >= config.size_variants:
                log("recompiles", f"{self.name}: size family: {config.size_variants} traces at other sizes already "
                                  "(size_variants)")
                return MISS
            try:
                entry = self._frame_for(None).compile(native.Trace(text))
            except DynamoError as e:
                fam.failures += 1
                log("recompiles", f"{self.name}: size family instance did not compile ({e.message}); "
                                  "the call is recorded")
                if fam.failures >= 3:
                    self.families.remove(fam)
                return MISS
            defaulted = self._inherit_choices(fam, entry, shape_key(args))
            p = fam.proto
            c = Compiled(p.guards, text, entry, p.out_spec, p.input_srcs, p.ops, p.inlined,
                         [e.fresh_copy() for e in p.exits], mutates=p.mutates,
                         family=fam, shape_key=shape_key(args), size_read=None, size_fixed=p.size_fixed,
                         retimer=((RETIME_AFTER, self._entry_maker(text, fam, shape_key(args)))
                                  if defaulted is not None else None))
            c.python_effects = p.python_effects  # (write-backs and returned outside objects, as the proto's)
            c.size_key = fam.key_of(inputs)
            fam.instances += 1
            bump("size_instances")
            bump("compile_seconds", c.stats.compile_ms / 1e3)
            if c.stats.shared_code:
                bump("code_shared")
            self.compiled.append(c)
            log("traces", f"{self.name}: size family instance for {list(shape_key(args))}: "
                          f"{c.stats.compile_ms:.1f} ms{_code_note(c.stats)} (no recording)")
            result = self.runner.run_one(c, inputs, fn, args, kwargs)
            if result is NEXT:  # its native guards disagree with the family's fit: not kept
                self.compiled.remove(c)
                fam.failures += 1
                return MISS
            return result
        return MISS

    def _shared_count(self):
        return len(self.compiled) - self._own_count()

    def _cache_full(self):
        """No further trace may be recorded: config.cache_limit traces with machine code of their
        own and config.size_variants traces sharing theirs (the same program at other sizes,
        which cost a recording but no compile), or, under these limits, a recording found no
        room for its kind."""
        return self._dropped == (config.cache_limit, config.size_variants) or (self._own_count() >= config.cache_limit
                                 and self._shared_count() >= config.size_variants)

    def reset(self):
        self._dropped = None
        self.compiled.clear()
        self.families = []
        self.runner.native_runs = 0
        self.profiled = ()
        self._misses = []
        self._unfitted = 0
        self.value_cuts = False
        self.stored = {}
        self.policy.reset()  # (a module's parts stay optimized: inside a new trace of this forward they are inlined)
        for f in self.frames.values():
            f.close()
        self.frames = {}

    def _frame_for(self, device):
        """This function's frame on the CPU engine (device None) or a CUDA device's engine."""
        if device not in self.frames:
            self.frames[device] = native.Frame(registry.engine(device), self.name)
        return self.frames[device]


def _shares_code(c):
    """Whether trace c runs machine code compiled for another (the same program at other sizes);
    False while its code is pending (it counts as code of its own until built)."""
    return not c.is_pending and bool(c.stats.shared_code)


class _collector_paused:
    """Python's cyclic garbage collector off while a call records and compiles (on again after,
    where it was on): a recording allocates enough objects that live only while it runs to set
    off full collections, and one full collection walks every object of the process (~0.3M
    after importing torch and torchvision: 0.1-0.15 s here, 20% of a detection model's first
    call). Garbage made meanwhile is collected by the collections that follow."""

    def __enter__(self):
        self.was_on = gc.isenabled()
        if self.was_on:
            gc.disable()

    def __exit__(self, *exc):
        if self.was_on:
            gc.enable()


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


UNFITTED = 8  # recordings in a row of one program at other sizes without a family before new sizes run eagerly
RETIME_AFTER = 4  # runs of an instance with default step choices before it times them (_inherit_choices)


def _ones(key):
    """Where a shape_key's sizes are 1."""
    return tuple(tuple(d == 1 for d in shape) for shape in key) if key is not None else None


def _leaf_shapes(args, kwargs):
    """The shapes of the tensors in a call's arguments (nested ones included), in order."""
    return tuple(tuple(t.shape) for t in probe._leaves((args, kwargs), []))


def _key_member(fam, c):
    """Recorded trace c, a member of family fam at its own sizes, is dispatched as the family's
    instances are (Runner.run): a call at other sizes of the family does not try it (a native
    guard miss on every decode step otherwise)."""
    if c.family is not None:
        return
    shapes = probe.input_shapes(c)
    try:
        c.size_key = tuple(shapes[dims[0][0]][dims[0][1]] for dims in fam.variables)
    except (IndexError, TypeError):
        return
    c.keyed_by = fam


def _branch_exits_only(c):
    """Trace c's side exits are all at branches (none a stitch or a cut): it may join a size
    family, whose instances take such exits with their own sizes (snapshot.encode_pair)."""
    return c.cut_id is None and all(e.plain_branch for e in c.exits)


def _has_tensor(args, kwargs):
    return bool(probe._leaves((args, kwargs), []))


def _has_marks(args, kwargs):
    return any(getattr(t, "_dynamo_dynamic", None) for t in probe._leaves((args, kwargs), []))


def _outside_marks(fam, marks):
    """With config.dynamic False, a family may vary only dims marked dynamic: None when it does,
    else why not."""
    if config.dynamic is not False:
        return None
    for dims in fam.variables:
        for slot, d in dims:
            if d not in marks.get(slot, ()):
                return f"input {slot}'s size {d} changed but is not marked dynamic (config.dynamic is False)"
    return None


def _code_note(stats):
    """The compile log's note on where the machine code came from, if not a compile."""
    if stats.from_cache:
        return " (from the disk cache)"
    if stats.shared_code:
        return " (machine code shared with the same trace at other sizes)"
    return ""


def _load_library():
    """libdynamo and the native call path loaded when a function is optimized rather than in its
    first call (loading them, with LLVM, takes ~17 ms); a missing library is reported by the
    first call, as before."""
    try:
        native.lib()
        _fastcall()
    except Exception:  # noqa: BLE001 -- reported by the first call, with the fallback
        pass


def optimize(fn_or_module, *, nopython=False):
    """dynamo.optimize(fn) / dynamo.optimize(module) (api.optimize says what each gives)."""
    _load_library()
    if isinstance(fn_or_module, torch.nn.Module):
        m = fn_or_module
        if isinstance(m.__dict__.get("forward"), OptimizedFunction):
            return m
        return OptimizedFunction.install(m, nopython)
    if isinstance(fn_or_module, OptimizedFunction):
        return fn_or_module
    stepped = training.optimizer_of(fn_or_module) if callable(fn_or_module) else None
    if stepped is not None:  # SGD / Adam / AdamW .step: each parameter group's update compiled
        return training.OptimizedStep(stepped, optimize, nopython=nopython)
    if isinstance(fn_or_module, types.MethodType) and isinstance(fn_or_module.__func__, types.FunctionType):
        # a bound method (optimizer.step): its function, called with the object first
        return OptimizedFunction(fn_or_module.__func__, nopython=nopython, bound=fn_or_module.__self__)
    if not callable(fn_or_module):
        raise TypeError(f"dynamo.optimize: expected a function or nn.Module, got {type(fn_or_module).__name__}")
    return OptimizedFunction(fn_or_module, nopython=nopython)


def _distributed_wrapper(module):
    """Why module's forward is left to CPython with the module it wraps compiled (its one part),
    or None: DistributedDataParallel's forward prepares the reducer for each backward (C++ calls
    the gradient hooks then rely on) around the wrapped module, which does the work."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is not None and isinstance(module, ddp):
        return ("DistributedDataParallel.forward runs in CPython (it prepares the reducer for each backward); "
                "the module it wraps is compiled")
    return None


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
    for f in registry.functions():
        f.compiled[:] = [c for c in f.compiled if name not in c.inlined]
    return fn


def reset():
    """Drops every optimized function's compiled traces and zeroes the counters (the frame
    hook's own table is api.reset's to clear)."""
    for f in registry.functions():
        f.reset()
    tracetree.forget_entries()
    registry.zero_counters()
    backoff.forget_warnings()


# Instance attributes dynamo.optimize gives a module (both refer to its OptimizedFunction).
_MODULE_ATTRS = ("forward", "__prepare_scriptable__", "__getstate__", "__deepcopy__")


def _is_global(of):
    """Whether `module.qualname` names this very optimized function (pickle can refer to it)."""
    obj = sys.modules.get(of.__module__)
    for part in getattr(of, "__qualname__", "").split("."):  # a callable object may have none
        obj = getattr(obj, part, None)
    return obj is of


