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
once per trace: a base run at the call's sizes, then one run per dimension of the call's tensor
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
import time

import torch

from . import config
from .frames import Abort, SizeUsed, dense_order
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


def _dense_strides(t, shape):
    """Strides for a tensor of `shape` laid out as t is (t dense in some dim order), or None."""
    if t.dim() == 0:
        return ()
    order = dense_order(t)
    if order is None:
        return None
    out, step = [0] * t.dim(), 1
    for d in order:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _fake_args(mode, args, kwargs, change):
    """args and kwargs with each tensor a fake twin; change: {leaf index: shape} for the ones
    made at other sizes (laid out as the real one)."""
    leaves = _leaves((args, kwargs), [])
    fakes = {}
    for i, t in enumerate(leaves):
        if id(t) in fakes:
            continue
        if i in change:
            shape = change[i]
            with mode:
                f = torch.empty_strided(shape, _dense_strides(t, shape), dtype=t.dtype, device=t.device)
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


def run(name, fn, args, kwargs, change, base_shapes):
    """One probe: fn recorded over fakes of args/kwargs, the leaves in change ({leaf index:
    shape}) at those sizes; base_shapes: the base run's value shapes ({} in the base run itself,
    which may decide on any size). Returns (IR text, output spec, {value
    name: shape}, sizes used as numbers); raises when the probe ends early (ProbeStop) or fails."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from . import recording
    from .interpreter import release
    from .tracetree import _flatten_result
    mode = FakeTensorMode()
    rec, gs, interp = recording.start(name, state_guard=False)  # (named as the recording is)
    rec.probe = mode
    interp.probe = base_shapes
    grad = torch.is_grad_enabled()
    # a probe that fails is an answer (the program differs at those sizes): torch 2.x's FakeTensor
    # logs every meta kernel that raises as an error on stderr, which would look like a fault
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    quiet, fake_log.disabled = fake_log.disabled, True
    try:
        fargs, fkwargs = _fake_args(mode, args, kwargs, change)
        with rec:
            result = interp.run(fn, fargs, fkwargs)
        if torch.is_grad_enabled() != grad:
            raise Abort("the call changes grad mode")
        if rec.abort_reason is not None or rec.cut is not None or rec.exits:
            raise Abort(rec.abort_reason or "a side exit or cut")
        index = {i: gs.tensor_inputs.index(e) for i, e in interp.tensor_src.items() if e in gs.tensor_inputs}
        spec, names = _flatten_result(result, rec, index)
        if not names:
            names = [rec.last_value()]
        sf = interp.sizes
        return rec.text(names), spec, rec.value_shapes(), (dict(sf.size_fixed), (sf.size_guards, sf.size_passed,
                                                                                 sf.size_opaque))
    finally:
        fake_log.disabled = quiet
        torch._C._set_grad_enabled(grad)
        release(rec, interp)
        rec._fakes = {}


def _doubled(leaves, dims):
    """{leaf index: shape} with each of dims ((leaf, dim) pairs) doubled; None when a leaf is not
    laid out densely (its layout at other sizes is unknown)."""
    change = {}
    for i, d in dims:
        t = leaves[i]
        if _dense_strides(t, tuple(t.shape)) is None:
            return None
        shape = list(change.get(i, t.shape))
        shape[d] = 2 * t.shape[d]
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
    return "; ".join(f"argument tensor {i} dim {d}: {why}" for (i, d), why in items[:3])


def _dims_text(dims):
    return ", ".join(f"argument tensor {i} dim {d}" for i, d in dims)


MAX_RUNS = 16  # probes per family (a function of many tensors, such as a backward graph, tries its
# changed dims first and leaves the rest constant)


def family(c, name, fn, args, kwargs, recorded):
    """A size family for trace c (a root recorded at other sizes, whose Python guards accept
    this call) from probes at this call's sizes: (Family or None, why not, probes run).
    recorded: the shapes of the tensors in the recorded call's arguments (the dims that changed
    since are probed first)."""
    from . import sizes
    t0 = time.perf_counter()
    try:
        base_text, spec, base_shapes, (fixed, flow) = run(name, fn, args, kwargs, {}, {})
    except Exception as e:  # noqa: BLE001 -- a probe that cannot run finds nothing
        return None, f"the base probe ended: {type(e).__name__}: {e}", 1
    if spec != c.out_spec:
        return None, "the probe's result has another structure (a view or a number that follows the sizes)", 1
    if list(flow[0]) != list(c.size_guards):
        return None, "the probe's comparisons of sizes in Python differ from the recording's", 1
    fixed = dict(fixed)
    for k, v in c.size_fixed.items():
        fixed.setdefault(k, v)
    search = _Search(name, fn, args, kwargs, spec, base_shapes, sizes.Family.of_trace(_Text(base_text, fixed,
                                                                                            c.input_srcs, flow)))
    search.vary_dims(recorded)
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

    def __init__(self, name, fn, args, kwargs, spec, base_shapes, fam):
        self.name, self.fn, self.args, self.kwargs = name, fn, args, kwargs
        self.spec, self.base_shapes, self.fam = spec, base_shapes, fam
        self.leaves = _leaves((args, kwargs), [])
        self.runs = 1             # (the base run)
        self.origin = []          # per variable: ((leaf, dim) pairs, base size) of the probe that made it
        self.tried = set()
        self.failed = {}          # (leaf, dim) -> why its probe found nothing

    def probe(self, change):
        self.runs += 1
        return run(self.name, self.fn, self.args, self.kwargs, change, self.base_shapes)

    def vary_dims(self, recorded):
        """Each argument dim (those changed since the recording first) probed doubled; one that
        fits becomes a variable of the family."""
        leaves = self.leaves
        changed = [(i, d) for i, t in enumerate(leaves) for d in range(t.dim())
                   if i < len(recorded) and d < len(recorded[i]) and recorded[i][d] != t.shape[d]]
        order = changed + [(i, d) for i, t in enumerate(leaves) for d in range(t.dim()) if (i, d) not in changed]
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
        one batch size: both change)."""
        leaves, t = self.leaves, self.leaves[i]
        same = [(j, e) for j, u in enumerate(leaves) for e in range(u.dim())
                if u.shape[e] == t.shape[d] and (j, e) not in self.tried]
        placed = [(j, e) for j, e in same if e == d and (j == i or leaves[j].dim() == t.dim())]
        groups = [[(i, d)]]
        for g in (placed, same):
            if len(g) > 1 and g not in groups:
                groups.append(g)
        for dims in groups:
            change = _doubled(leaves, dims)
            if change is None:
                return
            try:
                text, s, _, (_, flow) = self.probe(change)
            except Exception as e:  # noqa: BLE001 -- these dims stay constant (or the group is tried)
                log("recompiles", f"{self.name}: size probe of {_dims_text(dims)}: {type(e).__name__}: {e}")
                self.failed[(i, d)] = str(e) if isinstance(e, (SizeUsed, Abort)) else f"{type(e).__name__}: {e}"
                if isinstance(e, SizeUsed):
                    return  # (Python uses it: no group changes that)
                continue
            self.tried.update(dims)
            wide, why = self.fam.widened(_Text(text, flow=flow), least=1) if s == self.spec else \
                (None, "another result structure")
            if wide is None or len(wide.variables) != len(self.fam.variables) + 1:
                log("recompiles", f"{self.name}: size probe of {_dims_text(dims)}: no fit ({why})")
                self.failed[(i, d)] = why or "it changes nothing else"
                return
            self.fam = wide
            self.origin.append((dims, t.shape[d]))
            return

    def least_sizes(self):
        """Per variable, its least size: 1 where the base run was at 1, or a probe at 1 gives
        the family's text at 1 (all such variables at 1 at once checked too), else 2."""
        fam, origin = self.fam, self.origin
        base_env = [v for _, v in origin]
        low = [1 if v == 1 else 2 for v in base_env]
        fam.low = low
        for k, (dims, v) in enumerate(origin):
            if v == 1:
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
        probed_ones = [k for k, (_, v) in enumerate(origin) if v != 1 and low[k] == 1]
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
