"""When a function is recorded again after an abort, when it is left to CPython, and how it
comes back: the abort policy (reasons.py gives each kind of abort its rule), the parts of a
module compiled apart while the module runs in CPython, and the call state that "state" aborts
are keyed by. One `Policy` per optimized function (frontend.OptimizedFunction.policy) holds
that state and decides; it records nothing and runs nothing."""
import sys
import types

import torch

from . import config, native, reasons
from .log import log
from .registry import bump
from .frames import NopythonError
from .tracetree import Attempt

AUTOGRAD = "autograd"  # the prefix of the abort reason Policy.state_aborted handles
_WARNED = set()  # (function name, reason) said on stderr already


def forget_warnings():
    """dynamo.reset(): what was said on stderr may be said again."""
    _WARNED.clear()

# The knobs whose change lets a function left to CPython be recorded again (_comes_back).
_CONFIG_KNOBS = ("stitch", "write_backs", "max_stitches", "max_stitch_variants", "max_trace_ops", "max_side_traces", "gpu",
                 "compile_parts", "abort_limit", "cache_limit", "size_variants", "hotexit")


_key = (-1, None)  # (config._version, the knobs then): read again only after a setting changed


def _config_key():
    global _key
    if _key[0] != config._version:
        _key = (config._version, tuple(getattr(config, n) for n in _CONFIG_KNOBS))
    return _key[1]


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


_STORES = ("setattr", "setitem", "delattr")  # the steps of stitches that store into outside objects


def _stores_in_tree(c):
    """Whether a stitch in the trace tree under c stores into an object from outside the call
    (setattr, setitem or delattr steps)."""
    for snap in c.exits:
        if snap.step is not None and snap.step[0] in _STORES:
            return True
        if any(_stores_in_tree(side) for side in snap.sides):
            return True
    return False


def _plain_stitches(c):
    """Stitches in the trace tree under c that are not stores (their continuations recorded)."""
    n = 0
    for snap in c.exits:
        if snap.step is not None and snap.sides and snap.step[0] not in _STORES:
            n += 1
        n += sum(_plain_stitches(side) for side in snap.sides)
    return n


class Policy:
    """When an optimized function records, backs off, runs in CPython or comes back, and why.
    traces is the function's list of compiled traces (the same list object for its life: an
    abort may drop a root from it); install optimizes a submodule (the parts of a module)."""

    def __init__(self, fn, name, owner, nopython, traces, install):
        self.fn, self.name, self.owner, self.nopython = fn, name, owner, nopython
        self.traces = traces
        self._install = install
        self.reset()

    def reset(self):
        self.calls = 0
        self.attempts = []          # Attempt per recording (and per reason it was not made)
        self.retry_at = 0           # calls before which recording is not tried (back-off)
        self.disabled_reason = None  # left to CPython: why
        self.state_fallbacks = {}   # _call_state() -> (why, kind): recorded in that state, it aborted for it
        self.parts = None           # left to CPython: the submodules compiled apart (_compile_parts)
        self._left_at = None        # left to CPython: (calls then, config then, calls until a new try)
        self._comebacks = 0         # tries since (each waits 4x longer)
        self._abort_base = 0        # aborts before the last try (abort_limit counts those after)
        self.fast_eager = None      # left to CPython with nothing compiled: (calls until a new try, config._version)
        self.split_at_once = {}     # part name -> why: the part, once compiled apart, runs in CPython
        #                             with its own parts compiled apart from its first call (_parts_full)
        if native.load_error() is not None:  # (said at import) for good: see _comes_back
            self.disabled_reason = f"libdynamo is not loaded ({native.load_error()})"

    def fallback(self, why):
        """A call that will not run compiled: with nopython=True that is an error, before the
        function runs."""
        if self.nopython:
            code = getattr(self.fn, "__code__", None)
            at = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
            raise NopythonError(f"dynamo.optimize(nopython=True): cannot compile {self.name}{at}: {why}")

    def runs_eagerly(self, args):
        """Whether this call runs in CPython instead of recording: the function was left to
        CPython (and does not come back now), it aborted before in this call's state, or it is
        backing off after an abort. A module left to CPython has its parts compiled apart."""
        split = self.parts is None and self.owner is not None
        if self.disabled_reason is not None and not self._comes_back():
            self.fallback(self.disabled_reason)
            if split:
                self._compile_parts()
            return True
        seen = self.state_fallbacks.get(_call_state(args)) if self.state_fallbacks else None
        if seen is not None:  # it aborted for the call's state: eager until that state changes
            self.fallback(seen[0])
            if seen[1] != "autograd" and split:
                self._compile_parts()  # (grad mode would stop the parts as well)
            return True
        if self.calls < self.retry_at:  # backing off after an abort
            if split:
                self._compile_parts()  # what failed once mostly fails again: the parts start now
            return True
        return False

    def leave(self, reason):
        """The function is left to CPython for reason (it comes back as any function left)."""
        self.disabled_reason = reason
        self.attempts.append(Attempt(reason))
        log("aborts", f"{self.name}: {reason}")

    def _eager_from_now(self, until):
        """Calls before `until` go straight to CPython (OptimizedFunction.call's first test) while
        dynamo.config stays as it is: when nothing is compiled, nopython is off and a module's
        parts are set up already (what the full path would do on each such call)."""
        if not self.traces and not self.nopython and (self.owner is None or self.parts is not None) and \
                not self.state_fallbacks:
            self.fast_eager = (until, config._version)

    def _comes_back(self):
        """Whether a function left to CPython is recorded again on this call: after a change of
        dynamo.config (what failed may now work), or once config.retry_after calls went by, and
        then after four times as many each time (a path that failed on the first calls, as
        an empty batch, may be recordable later; the cost is one recording per try). A function
        the user disabled never comes back."""
        never = float("inf")
        if self.disabled_reason == "dynamo.disable" or getattr(self.fn, "_dynamo_disable", False) or \
                native.load_error() is not None:
            self._eager_from_now(never)
            return False
        if self._left_at is None:  # left just now: note the config and when to try again
            self._left_at = (self.calls, _config_key(), config.retry_after * 4 ** self._comebacks)
            return False
        at, key, gap = self._left_at
        if key == _config_key() and (not gap or self.calls < at + gap):
            self._eager_from_now(at + gap if gap else never)
            return False
        log("aborts", f"{self.name}: recorded again after {self.calls - at} calls in CPython"
                      f"{' (dynamo.config changed)' if key != _config_key() else ''}")
        self._comebacks += key == _config_key()
        self.disabled_reason, self._left_at, self.fast_eager = None, None, None
        self.retry_at = 0
        self._abort_base = len([a for a in self.attempts if a.compiled is None])
        return True

    def part_names(self):
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
        parts = self.part_names()
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

        names = self.part_names()
        for name, child in self.owner.named_modules():
            if id(child) not in names or getattr(child.__dict__.get("forward"), "dynamo_optimized_forward", False):
                continue  # not a part, or optimized already (by the user, or as another module's part)
            fwd = type(child).forward
            if isinstance(fwd, types.FunctionType) and not getattr(fwd, "_dynamo_disable", False):
                self._install(child)
                self.parts.append(names[id(child)])
                why = self.split_at_once.get(names[id(child)])
                if why is not None:  # recorded alone it would stop where the module did: split it now
                    child.__dict__["forward"].policy.leave(why)
        if self.parts:
            why = self.disabled_reason or self.attempts[-1].reason
            log("aborts", f"{self.name}: runs in CPython ({why}); compiling its submodules apart: "
                          f"{', '.join(self.parts)}")

    def _parts_full(self, root, snap):
        """The module's parts whose own stitches -- in root's trace tree, plus snap, the stitch that
        found no room -- fill config.max_stitches: recorded alone, such a part's tree would overflow
        alike (a detection model's RoIHeads, its per-class nms loop). A stitch belongs to the part
        whose forward is the first of its snapshot's frames under the root's; parts of one class
        are not told apart (none of them is named)."""
        names = self.part_names()
        by_code = {}
        for child in self.owner.modules():
            if id(child) in names:
                code = getattr(type(child).forward, "__code__", None)
                by_code.setdefault(code, []).append(names[id(child)])

        def part_of(s):
            for fs in s.frames[1:]:
                hit = by_code.get(fs.code)
                if hit is not None:
                    return hit[0] if len(hit) == 1 else None
            return None
        counts = {}

        def count(s):
            p = part_of(s)
            if p is not None:
                counts[p] = counts.get(p, 0) + 1

        def walk(c):
            for s in c.exits:
                if s.step is not None and s.sides and s.step[0] not in _STORES:
                    count(s)
                for side in s.sides:
                    walk(side)
        walk(root)
        if snap.step is not None and snap.step[0] not in _STORES:
            count(snap)
        return [p for p, n in counts.items() if n >= config.max_stitches]

    def side_aborted(self, snap, reason, kind="internal", overflow=False):
        """A side-trace recording from snap failed: back off, then blacklist the exit; a stitch's
        continuation is blacklisted at once, and its root trace dropped (see below). overflow:
        it failed for want of room (config.max_stitches)."""
        bump("aborts")
        bump(f"abort_{kind}")
        log("aborts", f"{self.name}: side trace from {snap.where} falls back: {reason}")
        snap.aborts.append(reason)
        if kind == "nothing" and snap.step is None:  # (a branch: what follows it is plain Python)
            snap.blacklisted = ("no tensor operations follow it, so there is nothing to compile: the rest of "
                                "such calls runs in dynamo's interpreter, which costs little without tensor work")
            return
        # A stitch's continuation is recorded from the same state on every call: what failed
        # once fails again, so one failure decides (a branch's side trace may see other values).
        if len(snap.aborts) >= (1 if snap.step is not None else config.abort_limit):
            snap.blacklisted = reason
            root = snap.owner.root if snap.step is not None and snap.owner is not None else None
            if root is not None and root in self.traces:
                # A stitch is taken on every call: without a trace after it, the rest of every
                # call would run in dynamo's interpreter, slower than CPython runs the function
                # whole. The root trace goes, and the function is left to CPython: recording it
                # again would reach the same stitch and the same failure -- unless the tree's
                # stitches stored into objects from outside the call (a cache filled on the first
                # call: timm's attention_bias_cache[key] = ..., a rotary embedding's cos/sin):
                # the next call may find them filled and record without those stores, so it is
                # recorded again once (the abort policy leaves it to CPython if it fails alike).
                self.traces.remove(root)
                why = f"the trace after the stitch at {snap.where} cannot be recorded ({reason})"
                self.aborted(why, root.ops, root.inlined, kind="continuation")
                # Not when it overflowed config.max_stitches and the stitches that are no stores
                # fill it alone (a detection model's per-class loop of nms calls): without the
                # stores it would be full where it overflowed, and overflow again at any stitch
                # after that one.
                again = _stores_in_tree(root) and not (
                    overflow and _plain_stitches(root) + (snap.step[0] not in _STORES) >= config.max_stitches)
                if not self.traces and not again:
                    self.disabled_reason = why
                    if overflow and self.owner is not None and config.compile_parts:
                        for part in self._parts_full(root, snap):
                            self.split_at_once[part] = (
                                f"its own stitches filled config.max_stitches ({config.max_stitches}) in the trace "
                                f"tree of {self.name}, which stopped at {snap.where}: recorded alone it would stop "
                                "there as well")
        else:
            snap.retry_at = snap.count + 2 ** len(snap.aborts)

    def state_aborted(self, reason, args, kind="autograd", quiet=False):
        """An abort caused by the call's state (a kind whose policy is "state": grad mode and
        requires_grad, or the dtype, device or layout of its tensors): it does not count toward
        the function's abort limit; calls in the same state (_call_state) run eagerly without
        recording again, a module's parts compiled apart meanwhile, and a call in another state
        (under torch.no_grad(), float32 instead of complex inputs) records. Autograd the user can
        fix: it is said once on stderr."""
        bump("aborts")
        bump(f"abort_{kind}")
        log("aborts", f"{self.name}: runs eagerly in this state ({kind}): {reason}")
        self.attempts.append(Attempt(reason, ops=[], inlined=[]))
        self.state_fallbacks[_call_state(args)] = (reason, kind)
        if kind == "autograd" and not quiet and (self.name, reason) not in _WARNED:  # once per name and reason
            _WARNED.add((self.name, reason))  # (a model's many ReLU modules say it once)
            print(f"dynamo: {self.name} runs eagerly while this grad state holds: {reason}", file=sys.stderr)

    def aborted(self, reason, ops, inlined, where=None, selves=(), kind="internal"):
        """Counts an abort. The k-th one makes the next 2^(k-1) - 1 calls run in CPython before
        recording is tried again; at config.abort_limit the function is left to CPython, and at
        once when the last two recordings stopped at the same place for the same reason (what
        failed twice alike fails again: the retries only cost recordings). An abort inside the
        forward of one of the module's parts (selves: the first argument of each frame the
        recording had inlined) leaves the module to CPython at once, with its parts compiled
        apart: recording it again would inline that part again, and the part on its own gets
        the retries (and splits in turn)."""
        bump("aborts")
        bump(f"abort_{kind}")
        log("aborts", f"{self.name}: falls back{' at ' + where if where else ''}: {reason}")
        aborts = [a for a in self.attempts if a.compiled is None]
        self.attempts.append(Attempt(reason, ops=ops, inlined=inlined, where=where))
        k = len(aborts) + 1 - self._abort_base
        part = self._part_named(selves) if self.owner is not None and config.compile_parts else None
        if part is not None and not self.traces:
            self.disabled_reason = f"recording aborted inside its part {part}: {reason}"
        elif aborts and where is not None and reasons.policy(kind) == "same" and \
                (aborts[-1].reason, aborts[-1].where) == (reason, where):
            self.disabled_reason = f"recording aborted twice at {where}: {reason}"
        elif k >= config.abort_limit:
            self.disabled_reason = f"recording aborted {k} times; last: {reason}"
        else:
            self.retry_at = self.calls + 2 ** (k - 1)
