"""Size probes: a size family found without recording the program again.

A size family (sizes.py) fits the integers of a trace's IR text through samples of the program
at other sizes. Its samples used to be recordings: each variable cost a call recorded for real
at sizes where it changed, and sizes 1 stayed apart. A *probe* is a sample made without running
anything for real: the recording interpreter runs the function once more on *fake* tensors
(torch's FakeTensorMode: shapes, dtypes and strides without data; ops compute only the shapes of
their results), with the call's tensor arguments at chosen sizes. Its IR text is what a
recording at those sizes gives, and nothing of the program's state is touched:

  * every op runs on fakes (parameters and constants get fake twins; creation ops make fakes),
    so no tensor is written and no random number drawn;
  * anything a recording would do outside the trace ends the probe before it happens: a call
    not recorded, a store into an object from outside the call, any other effect, a side exit,
    a value read from a tensor (interpreter and recorder raise ProbeStop when `probe` is set);
  * Python never decides on a size the probe changed: sizeflow.py sees every use of a size as
    a number *before* the bytecode runs, and a changed one ends the probe. So a probe takes the
    path the base run took, whose effects are none (the base run is a probe too).

When a call misses a trace only on tensor sizes (its Python guards pass), the front end probes
once per trace: a base run at the call's sizes (on the call's own tensors where the trace writes
into none of them: Recorder.probe is REAL_PROBE, its ops run for real but none may write into a
tensor the probe did not make, and the random generator's state is put back -- FakeTensor
dispatch costs 2-3x a recording), then one run per dimension of the call's tensor
arguments with that dimension doubled (1 -> 2). Every dimension whose probe fits (sizes.py,
Family.widened) becomes a variable: one miss makes the family for every size that can vary,
however the later calls vary them. A variable whose base size is 1 may be 1 (the base run shows
the program there); any other gets one more probe at 1 and may be 1 when that text is the
family's text at 1 (eager squeezes, broadcasts and picks kernels differently at 1: such a
program shows it in the probe). The family must give the trace's own text at the trace's sizes
-- that checks the probes against the real recording -- and later calls are its instances,
compiled from text (machine code shared) and checked by the verifier and the runtime like any.
"""
import logging
import re
import time

import torch

from . import config
from .frames import Abort, SizeUsed, dense_order, dense_strides
from .log import log


class _Text:
    """What Family.widened reads of a trace: its text (and, for a family's proto, the sizes its
    program used as numbers)."""

    def __init__(self, text, size_fixed=None, input_srcs=(), flow=None):
        self.text, self.size_fixed, self.input_srcs = text, size_fixed or {}, input_srcs
        # what sizeflow.py saw Python do with sizes (the comparisons and what it passed to torch)
        self.size_guards, self.size_passed, self.size_opaque = flow or ([], [], [])


def _leaves(v, out):
    """The tensors in v (nested lists, tuples, dicts), in order."""
    if isinstance(v, torch.Tensor):
        out.append(v)
    elif type(v) in (list, tuple):
        for x in v:
            _leaves(x, out)
    elif type(v) is dict:
        for x in v.values():
            _leaves(x, out)
    return out


def _fake_args(mode, args, kwargs, change):
    """args and kwargs with each tensor a fake twin; change: {id(tensor): shape} for the ones
    made at other sizes (laid out as the real one)."""
    leaves = _leaves((args, kwargs), [])
    fakes = {}
    for t in leaves:
        if id(t) in fakes:
            continue
        if id(t) in change:
            shape = change[id(t)]
            with mode:
                f = torch.empty_strided(shape, dense_strides(t, shape), dtype=t.dtype, device=t.device)
            f.requires_grad_(t.requires_grad)
        else:
            f = mode.from_tensor(t)
        fakes[id(t)] = f

    def swap(v):
        if isinstance(v, torch.Tensor):
            return fakes[id(v)]
        if type(v) in (list, tuple):
            return type(v)(swap(x) for x in v)
        if type(v) is dict:
            return {k: swap(x) for k, x in v.items()}
        return v
    return swap(tuple(args)), swap(dict(kwargs))


def run(name, fn, args, kwargs, change, base_shapes, branches=(), real=False):
    """One probe: fn recorded over fakes of args/kwargs, the tensors in change ({id(tensor):
    shape}: arguments, or trace inputs read from objects, such as a cache's tensors) at those sizes; base_shapes: the base run's value shapes ({} in the base run itself,
    which may decide on any size); branches: what the recorded trace's branches on tensors took,
    in order (a probe takes the same, and records the same side exits); real: the base run on the
    call's own tensors (no change), its ops run for real -- each stopped before it writes into a
    tensor the probe did not make, the random number generator's state put back after -- at the
    cost of a recording, not FakeTensor dispatch's 2-3x. Returns (IR text, output
    spec, {value name: shape}, (sizes used as numbers, what else sizeflow saw)); raises when the
    probe ends early (ProbeStop) or fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import recording
    from .interpreter import release
    from .tracetree import OutObjects, _flatten_result
    from .recorder import REAL_PROBE
    mode = REAL_PROBE if real else FakeTensorMode()
    rec, gs, interp = recording.start(name, state_guard=False)  # (named as the recording is)
    rec.probe = mode
    rec.probe_shapes = change
    interp.probe = base_shapes
    interp.probe_branches = list(branches)
    grad = torch.is_grad_enabled()
    # a probe that fails is an answer (the program differs at those sizes): torch 2.x's FakeTensor
    # logs every meta kernel that raises as an error on stderr, which would look like a fault
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    quiet, fake_log.disabled = fake_log.disabled, True
    rng = torch.get_rng_state() if real else None
    try:
        fargs, fkwargs = (args, kwargs) if real else _fake_args(mode, args, kwargs, change)
        with rec:
            result = interp.run(fn, fargs, fkwargs)
        if torch.is_grad_enabled() != grad:
            raise Abort("the call changes grad mode")
        if rec.abort_reason is not None or rec.cut is not None or interp.probe_branches:
            raise Abort(rec.abort_reason or ("a cut" if rec.cut is not None else "fewer branches than recorded"))
        # (the result as the recording flattens it: with the write-backs' values, and objects from
        # outside the call found at their sources)
        index = {i: gs.tensor_inputs.index(e) for i, e in interp.tensor_src.items() if e in gs.tensor_inputs}
        value = (result, tuple(v for _, _, v in interp.writebacks)) if interp.writebacks else result
        spec, names = _flatten_result(value, rec, index, OutObjects(interp.obj_srcs))
        if not names:
            names = [rec.last_value()]
        sf = interp.sizes
        return rec.text(names), spec, rec.value_shapes(), (dict(sf.size_fixed), (sf.size_guards, sf.size_passed,
                                                                                 sf.size_opaque))
    finally:
        if rng is not None:
            torch.set_rng_state(rng)
        fake_log.disabled = quiet
        torch._C._set_grad_enabled(grad)
        release(rec, interp)
        rec._fakes = {}


def _grown(leaves, dims, by=None):
    """{leaf index: shape} with each of dims ((leaf, dim) pairs) grown by `by` (None: doubled);
    None when a leaf is not laid out densely (its layout at other sizes is unknown)."""
    change = {}
    for i, d in dims:
        t = leaves[i]
        if dense_strides(t, tuple(t.shape)) is None:
            return None
        shape = list(change.get(i, t.shape))
        shape[d] = t.shape[d] + (t.shape[d] if by is None else by)
        change[i] = tuple(shape)
    return change


def _at_one(leaves, dims, change):
    """change with each of dims at size 1."""
    change = dict(change)
    for i, d in dims:
        shape = list(change.get(i, leaves[i].shape))
        shape[d] = 1
        change[i] = tuple(shape)
    return change


def _failures(failed):
    """The probes' reasons, shortest first, as text."""
    if not failed:
        return "no probe ran"
    items = sorted(failed.items(), key=lambda kv: len(kv[1]))
    return "; ".join(f"input {i} dim {d}: {why}" for (i, d), why in items[:3])


def _dims_text(dims):
    return ", ".join(f"input {i} dim {d}" for i, d in dims)


MAX_RUNS = 16  # probes per family (a function of many tensors, such as a backward graph, tries its
# changed dims first and leaves the rest constant)


def input_shapes(c):
    """The shapes of trace c's inputs (slot order) as its text declares them (None for a number)."""
    from . import sizes
    _, values, kinds = sizes.tokens(c.text)
    dims = {}
    for v, k in zip(values, kinds):
        if k[0] == sizes.DIM:
            dims.setdefault(k[1], []).append(v)
    n = len(c.input_srcs or ())
    return [tuple(dims.get(i, ())) for i in range(n)]


def _variable_inputs(c, args, kwargs, inputs):
    """inputs with None for those the probes leave alone: weights, and tensors a probe could not
    hand the program at other sizes everywhere it reads them -- a probe makes fakes of the
    argument tensors (in lists, tuples and dicts too) and of tensors read as an attribute of an
    argument's object (a cache's `layer.keys`); a global or an element of an object's list is
    read as it is."""
    weights = weight_slots(c)
    leaves = {id(t) for t in _leaves((args, kwargs), [])}
    out = []
    for i, t in enumerate(inputs):
        src = str(c.input_srcs[i]) if i < len(c.input_srcs or ()) else ""
        by_attr = src.startswith(("a[", "k[")) and re.search(r"\.[A-Za-z_]\w*$", src) is not None
        out.append(t if i not in weights and (id(t) in leaves or by_attr) else None)
    return out


def weight_slots(c):
    """The input slots of trace c that are weights (parameters and buffers: ` weight` in their
    input line), which probes leave at their sizes."""
    out, slot = set(), 0
    for line in c.text.splitlines():
        if " = input " in line:
            if line.rstrip().endswith(" weight"):
                out.add(slot)
            slot += 1
    return out


def family(c, name, fn, args, kwargs, inputs):
    """A size family for trace c (a root recorded at other sizes, whose Python guards accept
    this call) from probes at this call's sizes: (Family or None, why not, probes run).
    inputs: the trace's inputs at this call (slot order), which the probes vary (arguments, and
    tensors read from objects); the dims that changed since the recording are probed first."""
    from . import sizes
    t0 = time.perf_counter()
    recorded = input_shapes(c)
    branches = [e.branch_truth for e in c.exits]
    if any(b is None for b in branches):
        return None, "the trace has side exits that are not branches on a tensor", 0
    # (the base run at the call's own sizes on its own tensors where the trace writes into none
    # and they are all on the CPU: a FakeTensor run costs 2-3x a recording, a decode step's ~0.35 s)
    real = not c.mutates_any() and all(t.device.type == "cpu" for t in _leaves((args, kwargs), []))
    try:
        base_text, spec, base_shapes, (fixed, flow) = run(name, fn, args, kwargs, {}, {}, branches, real=real)
    except Exception as e:  # noqa: BLE001 -- a probe that cannot run finds nothing
        if not real:
            return None, f"the base probe ended: {type(e).__name__}: {e}", 1
        try:  # (on fakes, which write nowhere)
            base_text, spec, base_shapes, (fixed, flow) = run(name, fn, args, kwargs, {}, {}, branches)
        except Exception as e2:  # noqa: BLE001
            return None, f"the base probe ended: {type(e2).__name__}: {e2}", 2
    if spec != c.out_spec:
        return None, "the probe's result has another structure (a view or a number that follows the sizes)", 1
    if list(flow[0]) != list(c.size_guards):
        return None, "the probe's comparisons of sizes in Python differ from the recording's", 1
    fixed = dict(fixed)
    for k, v in c.size_fixed.items():
        fixed.setdefault(k, v)
    stateful = bool(c.exits) or c.python_effects is not None
    if stateful:
        # a decode step: the call's own sizes changed as the program changes them (a cache and
        # its mask together), so the recording and the base run are the two samples of the fit
        # (a probe costs what a recording does: one run, not one per dim)
        proto = _Text(c.text, fixed, c.input_srcs, (c.size_guards, c.size_passed, c.size_opaque))
        wide, why = sizes.Family.of_trace(proto).widened(_Text(base_text, flow=flow))
        if wide is not None:
            out = sizes.Family(c, wide.parts, wide.kinds, wide.exprs, wide.variables, wide.low, wide.samples)
            if out.unusable is None:
                log("perf", f"{name}: 1 size probe in {(time.perf_counter() - t0) * 1e3:.1f} ms")
                return out, None, 1
        log("recompiles", f"{name}: the recording and the probe at this call's sizes make no family ({why}); "
                          "probing dim by dim")
    search = _Search(name, fn, args, kwargs, spec, base_shapes, sizes.Family.of_trace(_Text(base_text, fixed,
                                                                                            c.input_srcs, flow)),
                     branches, _variable_inputs(c, args, kwargs, inputs))
    search.vary_dims(recorded, changed_only=stateful)
    if not search.fam.variables:
        return None, f"no argument dimension can vary ({_failures(search.failed)})", search.runs
    low = search.least_sizes()
    why = _agrees(c, search.fam, low, search.failed)
    if why is not None:
        return None, why, search.runs
    fam = search.fam
    out = sizes.Family(c, fam.parts, fam.kinds, fam.exprs, fam.variables, low, fam.samples)
    if out.unusable is not None:
        return None, out.unusable, search.runs
    log("perf", f"{name}: {search.runs} size probe(s) in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    return out, None, search.runs


class _Search:
    """The probes of one family: the base run's family, widened one argument dim at a time."""

    def __init__(self, name, fn, args, kwargs, spec, base_shapes, fam, branches, inputs):
        self.name, self.fn, self.args, self.kwargs = name, fn, args, kwargs
        self.branches = branches
        self.spec, self.base_shapes, self.fam = spec, base_shapes, fam
        # what the probes vary: the trace's inputs (numbers and weights among them are left alone)
        self.leaves = [t if isinstance(t, torch.Tensor) else torch.empty(()) for t in inputs]
        self.runs = 1             # (the base run)
        self.origin = []          # per variable: ((leaf, dim) pairs, base size) of the probe that made it
        self.tried = set()
        self.failed = {}          # (leaf, dim) -> why its probe found nothing
        self.offsets_first = False  # groups grown by one amount tried before doubled ones

    def probe(self, change):
        self.runs += 1
        by_id = {id(self.leaves[i]): shape for i, shape in change.items()}
        return run(self.name, self.fn, self.args, self.kwargs, by_id, self.base_shapes, self.branches)

    def vary_dims(self, recorded, changed_only=False):
        """Each input dim (those changed since the recording first) probed doubled; one that
        fits becomes a variable of the family. changed_only: those alone (a trace that sets
        attributes or has side exits -- a decode step -- whose probes each cost about what a
        recording does: its other dims wait until a call changes them)."""
        leaves = self.leaves
        changed = [(i, d) for i, t in enumerate(leaves) for d in range(t.dim())
                   if i < len(recorded) and d < len(recorded[i]) and recorded[i][d] != t.shape[d]]
        order = changed + ([] if changed_only else
                           [(i, d) for i, t in enumerate(leaves) for d in range(t.dim()) if (i, d) not in changed])
        self.offsets_first = changed_only
        for i, d in order:
            t = leaves[i]
            marks = getattr(t, "_dynamo_dynamic", None) or ()
            if (i, d) in self.tried or config.dynamic is False and d not in marks or t.shape[d] == 0:
                continue
            if self.runs >= MAX_RUNS:
                self.failed.setdefault((i, d), f"not probed (more than {MAX_RUNS} probes)")
                break
            self._vary(i, d)

    def _vary(self, i, d):
        """The dim alone; when that probe cannot run, with the other arguments' dims of its size
        at the same place, then with every argument dim of its size (x + y of two arguments of
        one batch size: both change), then also with the dims one or two from it, each grown by
        the same amount (a key/value cache of n and an attention mask of n + 1)."""
        leaves, t = self.leaves, self.leaves[i]
        n = t.shape[d]
        same = [(j, e) for j, u in enumerate(leaves) for e in range(u.dim())
                if u.shape[e] == n and (j, e) not in self.tried]
        placed = [(j, e) for j, e in same if e == d and (j == i or leaves[j].dim() == t.dim())]
        varied = {x for dims in self.fam.variables for x in dims}
        base = placed or [(i, d)]
        singles = [(j, e) for j, u in enumerate(leaves) for e in range(u.dim())
                   if 0 < abs(u.shape[e] - n) <= 2 and u.shape[e] >= 2 and (j, e) not in varied]
        # (every dim one amount away at once -- all layers' caches -- then each alone)
        near = [base + [x for x in singles if leaves[x[0]].shape[x[1]] == n + delta] for delta in (1, -1, 2, -2)]
        near = [g for g in near if len(g) > len(base)]
        near += [base + [x] for x in singles if len(singles) > 1]
        groups = [[(i, d)]]
        for g in (placed, same):
            if len(g) > 1 and g not in groups:
                groups.append(g)
        grown = [False] * len(groups) + [True] * len(near)
        if self.offsets_first:  # (a decode step: its dims that changed did so by one amount)
            groups, grown = near + groups, [True] * len(near) + [False] * len(groups)
        else:
            groups += near
        for k, dims in enumerate(groups):
            if k and self.runs >= MAX_RUNS:
                return
            change = _grown(leaves, dims, n if grown[k] else None)
            if change is None:
                return
            try:
                text, s, _, (_, flow) = self.probe(change)
            except Exception as e:  # noqa: BLE001 -- these dims stay constant (or the group is tried)
                log("recompiles", f"{self.name}: size probe of {_dims_text(dims)}: {type(e).__name__}: {e}")
                self.failed[(i, d)] = str(e) if isinstance(e, (SizeUsed, Abort)) else f"{type(e).__name__}: {e}"
                continue  # (a larger group may keep Python's comparisons as they were: a mask with its cache)
            wide, why = self.fam.widened(_Text(text, flow=flow), least=1) if s == self.spec else \
                (None, "another result structure")
            if wide is None or len(wide.variables) != len(self.fam.variables) + 1:
                log("recompiles", f"{self.name}: size probe of {_dims_text(dims)}: no fit ({why})")
                self.failed[(i, d)] = why or "it changes nothing else"
                continue  # (a larger group may fit: the cache's tensors and their mask together)
            self.tried.update(dims)
            self.fam = wide
            # (a group grown by one amount has dims at other sizes than t's: none is probed at 1)
            self.origin.append((dims, None if grown[k] else t.shape[d]))
            return

    def least_sizes(self):
        """Per variable, its least size: 1 where the base run was at 1, or a probe at 1 gives
        the family's text at 1 (all such variables at 1 at once checked too), else 2."""
        fam, origin = self.fam, self.origin
        base_env = [int(v) for v in fam.samples[0]]  # (the variables at the base run: its sample)
        low = [1 if v == 1 else 2 for v in base_env]
        fam.low = low
        for k, (dims, v) in enumerate(origin):
            if v == 1 or v is None:
                continue
            try:
                text, s, _, _ = self.probe(_at_one(self.leaves, dims, {}))
            except Exception as e:  # noqa: BLE001 -- the variable stays >= 2
                log("recompiles", f"{self.name}: size probe of {_dims_text(dims)} at 1: {type(e).__name__}: {e}")
                continue
            env = list(base_env)
            env[k] = 1
            fam.low[k] = 1
            want, _ = fam.text_at(env)
            fam.low[k] = 2
            if s == self.spec and want == text:
                low[k] = 1
        probed_ones = [k for k, (_, v) in enumerate(origin) if v is not None and v != 1 and low[k] == 1]
        if probed_ones and sum(1 for x in low if x == 1) > 1:  # every variable at 1 at once
            change = {}
            for k, (dims, _) in enumerate(origin):
                if low[k] == 1:
                    change = _at_one(self.leaves, dims, change)
            env = [1 if x == 1 else v for x, v in zip(low, base_env)]
            fam.low = low
            want, _ = fam.text_at(env)
            try:
                text, s, _, _ = self.probe(change)
            except Exception:  # noqa: BLE001 -- then not every one at 1
                text = None
            if text != want:
                for k in probed_ones:
                    low[k] = 2
        fam.low = low
        return low


def _agrees(c, fam, low, failed):
    """None when family fam gives trace c's own text at c's own sizes (the probes agree with the
    real recording), else why not."""
    from . import sizes
    env = []
    parts, values, kinds = sizes.tokens(c.text)
    if parts != fam.parts:
        return "the probe's text is not the recorded trace's at other sizes"
    for k, dims in enumerate(fam.variables):
        env.append(values[sizes._dim_token(kinds, *dims[0])])
    ok = all(v >= low[k] for k, v in enumerate(env))
    text, why = fam.text_at(env) if ok else (None, "a size below a variable's least")
    if text != c.text:
        return (f"a dimension that changed since the recording cannot vary ({_failures(failed)})" if failed
                else f"the family does not give the recorded trace at its own sizes ({why or 'other text'})")
    return None
