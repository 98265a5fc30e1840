"""dynamo.explain and dynamo.report: what was compiled, what fell back, and why."""
import copy
import os
import types
import warnings

import torch

from . import config, native, registry, sizes
from .backoff import AUTOGRAD
from .frontend import PROFILE, OptimizedFunction
from .tracetree import Attempt


def _exit_tree(c, indent):
    """Lines describing trace c's side exits and, under each, its side traces (recursively)."""
    lines = []
    for k, snap in enumerate(c.exits):
        kind = "stitch trace" if snap.step is not None or snap.value_cut else "side trace"  # (as counted)
        state = (f"blacklisted ({snap.blacklisted})" if snap.blacklisted else
                 f"linked natively to {len(snap.sides)} {kind}(s)" if snap.linked else
                 f"{len(snap.sides)} {kind}(s), dispatched from Python" if snap.sides else
                 "resumes in the interpreter")
        taken = native.lib().dynamo_entry_exit_count(c.handle, k) if k < c.num_native_exits else snap.count

        lines.append(f"{indent}exit {k} at {snap.where} [{snap.guard}]: taken {taken} time(s), {state}")
        for side in snap.sides:
            lines.append(f"{indent}  {kind}: {side.summary()}" if side.training else
                         f"{indent}  {kind}: {len(side.ops)} ATen op(s) -> {side.stats.num_kernels} kernel(s)")
            lines.extend(_exit_tree(side, indent + "    "))
    return lines


def _profiled_traces(f):
    """(label, Compiled) of each trace of f with native code: roots, then the side and stitch
    traces under their exits."""
    out = []

    def walk(c, label):
        if getattr(c, "entry", None) is not None and not c.training:
            out.append((label, c))
        for k, snap in enumerate(c.exits):
            for j, side in enumerate(snap.sides, 1):
                walk(side, f"{label}, exit {k} side trace {j}")
    for n, c in enumerate(f.compiled, 1):
        walk(c, f"trace {n}" if c.family is None else f"trace {n} (size instance)")
    return out


def _ms(ns, n):
    return f"{ns / max(n, 1) / 1e6:.3f} ms"


def _profile_lines(f, top=8):
    """DYNAMO_PROFILE's lines for function f: its native calls' mean wall time (from Python:
    guards, arguments, exits and results included) and, per trace, the mean time per counted run
    of its compiled code and of each step (the costliest first; warm-up runs not counted)."""
    traces = [(label, c, c.entry.profile()) for label, c in _profiled_traces(f)]
    traces = [(label, c, p) for label, c, p in traces if p is not None and p[0]]
    if not traces:
        return []
    walls = list(f.profiled)
    head = "  profile (DYNAMO_PROFILE):"
    one = len(traces) == 1 and not traces[0][1].exits  # one trace, all of each call
    runs0, ns0 = traces[0][2][0], traces[0][2][1]
    if one and len(walls) >= runs0:
        walls = walls[-runs0:]  # the calls of the counted runs (the trace's warm-up runs left out)
    else:
        walls = walls[3:] or walls  # (the first calls time the steps' choices)
    if walls:
        head += f" {len(f.profiled)} native call(s), {_ms(sum(walls) * 1e9, len(walls))} each from Python"
        if one:
            head += f", of which {_ms(ns0, runs0)} in compiled code (the rest: guards, arguments, results and Python)"
    lines = [head]
    for label, c, (runs, ns, steps) in traces:
        by_kind = {"kernel steps": [0, 0], "LibTorch calls": [0, 0], "side exit checks": [0, 0]}
        for _, n, t, what in steps:
            kind = "LibTorch calls" if what.startswith("extern") else "side exit checks" if what.startswith("side exit") \
                else "kernel steps"
            by_kind[kind][0] += t
            by_kind[kind][1] += 1
        parts = ", ".join(f"{n} {k} {_ms(t, runs)}" for k, (t, n) in by_kind.items() if n)
        lines.append(f"    {label}: {runs} counted run(s), {_ms(ns, runs)} per run in compiled code; {parts}")
        ranked = sorted(steps, key=lambda s: -s[2])
        for i, n, t, what in ranked[:top]:
            lines.append(f"      {100.0 * t / max(ns, 1):5.1f}%  {_ms(t, runs)}  step {i}: {what}")
        if len(ranked) > top:
            rest = sum(s[2] for s in ranked[top:])
            lines.append(f"      {100.0 * rest / max(ns, 1):5.1f}%  {_ms(rest, runs)}  {len(ranked) - top} more step(s)")
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
                if c.training:
                    out.append(f"  trace: {c.summary()}")
                    out.extend(_exit_tree(c, "    "))
                    out.append("    ops: " + ", ".join(c.ops))
                    continue
                how = "loaded from the trace store" if c.from_store else "compiled"
                shared = " (machine code shared with the same trace at other sizes)" if c.stats.shared_code else ""
                out.append(f"  trace: {len(c.ops)} ATen op(s) -> {c.stats.num_kernels} kernel(s), "
                           f"{c.stats.num_externs} LibTorch call(s), {how} in {c.stats.compile_ms:.1f} ms{shared}")
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
    registry.unlist(of)
    saved = registry.saved_counters()
    of.calls = config.hot_threshold
    of._record(of.fn, ((of.owner,) + args) if of.owner is not None else args, kwargs)
    registry.restore_counters(saved)
    if of.disabled_reason and not of.attempts:
        of.attempts.append(Attempt(of.disabled_reason))
    _name_originals(of.attempts, memo)
    e = Explanation(of.name, of.attempts)
    if of.owner is not None and config.compile_parts and any(not a.startswith(AUTOGRAD) for a in e.aborts):
        e.parts = list(of.policy.part_names().values())
    live = fn.forward if isinstance(fn, torch.nn.Module) else fn
    if isinstance(live, OptimizedFunction) and live.compiled:  # what this optimized function runs now
        for i, c in enumerate(live.compiled):
            if c.family is None:
                e.live.append(f"  trace {i + 1}: {len(c.ops)} ATen op(s), {c.runs} run(s)")
                e.live.extend(_size_lines(c, "    "))
                e.live.extend(_exit_tree(c, "    "))
        e.live.extend(_family_lines(live))
    return e


def _size_lines(c, indent):
    """What a trace's recording did with tensor sizes in Python (sizeflow.py): sizes it used as
    numbers (a size family keeps them constant), or a read not followed (no family)."""
    lines = []
    if c.size_read not in (None, "?"):
        lines.append(f"{indent}serves its own sizes only: the program read {c.size_read}")
    for (name, d), where in sorted(c.size_fixed.items()):
        lines.append(f"{indent}size used as a number in Python at {where}: {sizes.value_name(c, name)}.size({d}) "
                     "(a size family keeps it constant)")
    return lines


def _family_lines(f):
    """One line per size family of optimized function f: its variables (as guards on the
    inputs) and the instances compiled from it."""
    lines = []
    for fam in f.families:
        members = [c for c in f.compiled if c.family is fam]
        lines.append(f"  size family: {fam.describe()}; {len(members)} instance(s) compiled without a recording, "
                     f"{sum(c.runs for c in members)} run(s)")
    orphans = [c for c in f.compiled if c.family is not None and c.family not in f.families]
    if orphans:
        lines.append(f"  {len(orphans)} instance(s) of size families since dropped, "
                     f"{sum(c.runs for c in orphans)} run(s)")
    return lines


def _kept_note(c):
    """', 3 step(s) computed from weights alone (1 time)' for a trace with kept steps."""
    if c.entry is None or not c.stats.kept_steps:
        return ""
    n = c.entry.stats().kept_computes
    return f", {c.stats.kept_steps} step(s) computed from weights alone ({n} time(s), kept between calls)"


def report():
    """Text summary of every optimized function alive now: compiled traces, fallbacks and why."""
    lines = []
    for f in registry.functions():
        if not f.calls and not f.attempts:  # (not called since dynamo.reset())
            continue
        code = getattr(f.fn, "__code__", None)
        where = f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else ""
        own = [c for c in f.compiled if c.family is None]
        n_shared = sum(1 for c in own if c.stats.shared_code)
        n_inst = len(f.compiled) - len(own)
        lines.append(f"{f.name}{where}: {f.calls} call(s), {len(own)} trace(s)"
                     f"{f' ({n_shared} sharing machine code: the same program at other sizes)' if n_shared else ''}"
                     f"{f' and {n_inst} size instance(s)' if n_inst else ''}, "
                     f"{f.native_runs + sum(c.runs for c in f.compiled if c.training)} native run(s)")
        for n, c in enumerate(f.compiled, 1):
            if c.family is not None:
                continue
            if c.training:
                lines.append(f"  trace {n}: {c.summary()}")
                lines.extend(_exit_tree(c, "    "))
                continue
            lines.append(f"  trace {n}, {'from the trace store' if c.from_store else 'compiled'}: {len(c.ops)} ATen op(s) -> "
                         f"{c.stats.num_kernels} kernel(s), {c.stats.num_externs} LibTorch call(s), {c.runs} run(s)"
                         f"{', shared code' if c.stats.shared_code else ''}{_kept_note(c)}")
            lines.extend(_exit_tree(c, "    "))
        lines.extend(_family_lines(f))
        if PROFILE:
            lines.extend(_profile_lines(f))
        for a in f.attempts:
            if a.compiled is None:
                lines.append(f"  fell back: {a.reason}")
        if f.disabled_reason:
            lines.append(f"  not compiled: {f.disabled_reason}")
        if f.parts:
            lines.append(f"  its submodules are compiled apart: {', '.join(f.parts)}")
    c = registry.counters()
    lines.append("counters: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in c.items() if v or not k.startswith("abort_")))
    return "\n".join(lines)


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
                registry.unlist(v)


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
