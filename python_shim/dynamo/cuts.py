"""Where a recording ends or splits, for the recording interpreter (interpreter.py): a branch on a
tensor's value (a side exit, or a cut with a snapshot), a Python number read from a tensor and
kept unread while it only moves (ItemRead), cuts at an op budget or a DDP bucket, and stitches --
a call or store that cannot be recorded made for real between two traces. Each function takes the
interpreter as its first argument; the Interpreter class binds them as its methods."""
import operator
import torch
from . import config, snapshot
from .frames import NoSnapshot, ProbeStop
from .frames import ItemRead


_COMPARE = [operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge]


_FLIPPED = [operator.gt, operator.ge, operator.eq, operator.ne, operator.lt, operator.le]  # b op a as a op' b


def _branch_on_tensor(interp, f, v, jump_if, target):
    """`if v:` on a recorded tensor: the trace goes on along the branch taken now, guarded by
    a side exit whose snapshot resumes at the other branch. Returns whether to jump."""
    if interp.probe is not None:
        # (a probe's tensors hold no values: it takes the branch the recorded trace took at its
        # exit of the same number, and records the same exit; none left: the probe ends)
        if not interp.probe_branches:
            raise ProbeStop("a branch on a tensor's value")
        truth = interp.probe_branches.pop(0)
    else:
        interp.rec.paused += 1
        try:
            truth = bool(v)  # as eager: raises for more than one element
        finally:
            interp.rec.paused -= 1
    take = truth == jump_if
    if interp._cut_for_grad():  # the trace ends before the jump, which reads the value again
        interp._value_cut(f, f.ip - 1, v, "bool", f"branch on a tensor (recorded: {truth})")
        return take
    try:
        snap, live, _ = snapshot.take(interp, f, f.ip if take else f.dec.index[target],
                                      f"branch on a tensor (recorded: {truth})")
    except NoSnapshot as e:
        interp.abort(f"data-dependent branch on a tensor: {e}", "data_dependent")
        return take
    snap.branch_truth = truth
    interp.rec.side_exit(v, truth, live, snap)
    return take


def _tensor_value(interp, t, conv):
    """A Python number read from recorded tensor t (t.item(), int(t), ...): the trace goes on
    with this value, behind a side exit taken when t holds another one; the snapshot resumes
    right after the call with the new value."""
    if interp.probe is not None:
        raise ProbeStop("a tensor's value read as a Python number")
    interp.rec.paused += 1
    try:
        raw = t.item()
        value = raw if conv == "item" else {"int": int, "float": float, "bool": bool}[conv](t)
    finally:
        interp.rec.paused -= 1
    f = interp.frames[-1]
    if interp._cut_for_grad():  # the trace ends here: the number is read after it
        interp._value_cut(f, f.ip, t, conv, f"{conv}() of a tensor (recorded: {raw!r})")
        return (value, None)
    if conv in ("item", "float") and t.is_floating_point() and type(value) is float:
        interp.deferred_reads += 1  # (its exit is made where it is used: _settle_items, _compare_item)
        return (value, ItemRead(t, conv))
    try:
        snap, live, index = snapshot.take(interp, f, f.ip, f"{conv}() of a tensor == {raw!r}")
    except NoSnapshot as e:
        interp.abort(f"data-dependent value: {e}", "data_dependent")
        return (value, None)
    snap.frames[-1].stack.append(("item", snapshot.live_number(t, live, index), conv))
    interp.rec.value_exit(t, raw, live, snap)
    return (value, None)


def _settle_items(interp, f):
    """Before a bytecode of frame f that uses (not only moves) a deferred number read on the
    stack: its value exit is made here, with a snapshot that runs this bytecode again with
    the number read anew from its tensor; from here the trace relies on the value, as an
    exit made at the read would have."""
    for v, src in list(f.stack):
        if type(src) is ItemRead:
            interp._item_exit(f, src, v)


def _item_exit(interp, f, src, v):
    if not interp.recording:
        interp._forget_read(src)
        return
    cut = interp._cut_for_grad()  # (a tensor requiring grad came since the read: the trace ends here)
    what = f"{src.conv}() of a tensor == {v!r}" if not cut else \
        f"{src.conv}() of a tensor (recorded: {v!r}), the trace ends there with grad on"
    try:  # (taken while src is pending: the snapshot reads the number anew from its tensor)
        snap, live, _ = snapshot.take(interp, f, f.ip - 1, what)
    except NoSnapshot as e:
        interp._forget_read(src)
        interp.abort(f"data-dependent value: {e}", "data_dependent")
        return
    interp._forget_read(src)
    if cut:
        snap.value_cut = True
        interp.rec.cut = (snap, live)
    else:
        interp.rec.value_exit(src.t, v, live, snap)


def _forget_read(interp, src):
    """Every pair holding deferred read src, in every frame, is a plain number from here."""
    for fr in interp.frames:
        for where in (fr.locals, fr.stack):
            for i, p in enumerate(where):
                if p[1] is src:
                    where[i] = (p[0], None)
    interp.deferred_reads = sum(1 for fr in interp.frames for where in (fr.locals, fr.stack)
                              for p in where if type(p[1]) is ItemRead)


def _compare_item(interp, f, arg):
    """COMPARE_OP on a deferred number read and a Python number: the comparison is recorded on
    the tensor (in float64, as Python compares the float) and the trace guards its outcome,
    which repeats from call to call where the number does not (a convergence test). Returns
    the pair to push, or None when the comparison does not qualify (then settled, and
    compared as usual)."""
    stack = f.stack
    a, b = stack[-2], stack[-1]
    mine, other = (a, b) if type(a[1]) is ItemRead else (b, a)
    plain_number = type(other[0]) is float or (type(other[0]) is int and abs(other[0]) < 2 ** 53)
    if type(other[1]) is ItemRead or not plain_number or not interp.recording or interp.probe is not None or \
            not interp.rec.known(mine[1].t) or interp._cut_for_grad():
        interp._settle_items(f)
        return None
    if other[1] is not None and other[1].expr in interp.scalars:
        interp.settle_scalar(other)
    del stack[-2:]
    t = mine[1].t
    wide = t if t.dtype == torch.float64 else t.to(torch.float64)
    op = _COMPARE[arg] if mine is a else _FLIPPED[arg]
    outcome = op(wide, other[0])
    return interp._tensor_value(outcome, "bool")


def _cut_for_grad(interp):
    """Whether a branch on or a read of a tensor's value ends the trace (a cut) instead of
    leaving it through a side exit: with grad on and a tensor of the trace requiring grad, the
    trace compiles as AOTAutograd's forward and backward (training.py), which run whole."""
    return config.training and torch.is_grad_enabled() and \
        (interp.value_cuts or any(isinstance(t, torch.Tensor) and t.requires_grad for t in interp.rec.keep))


def _value_cut(interp, f, resume_ip, t, conv, guard):
    """Ends the trace at a read of one-element tensor t's value (conv: "bool", "item", "int",
    "float"): its outputs are the live tensors, t among them, and its cut's snapshot resumes at
    resume_ip with the number read from t on top of the stack -- recorded again per value
    (the continuation's guards check it, snapshot._decode_pair). The rest of this call runs
    unrecorded. Without a snapshot the recording aborts."""
    try:
        snap, live, index = snapshot.take(interp, f, resume_ip, f"{guard}, the trace ends there with grad on")
    except NoSnapshot as e:
        interp.abort(f"data-dependent value with grad on: {e}", "data_dependent")
        return
    snap.frames[-1].stack.append(("item", snapshot.live_number(t, live, index), conv))
    snap.value_cut = True
    interp.rec.cut = (snap, live)


def _snapshot_at_start(interp):
    """(Snapshot, live tensors) that re-runs the current bytecode (for ops whose output size
    depends on the data); NoSnapshot if it cannot be re-run."""
    if interp._start is None or interp._start[0] is not interp.frames[-1]:
        raise NoSnapshot("it is not called from a bytecode the interpreter can re-run")
    f, ip, stack, kw_names, mutated = interp._start
    if interp.rec.mutated != mutated:
        raise NoSnapshot("an in-place write happened in the same call")
    snap, live, _ = snapshot.take(interp, f, ip, "output size of a data-dependent op", stack, kw_names)
    return snap, live


def _cut(interp, f):
    """The trace reached config.max_trace_ops: it ends before the current instruction and
    hands its live values to a snapshot that continues from there (an exit always taken);
    the call itself goes on unrecorded."""
    if interp.probe is not None:
        raise ProbeStop("the trace is cut (config.max_trace_ops)")
    try:
        snap, live, _ = snapshot.take(interp, f, f.ip - 1, "trace cut (config.max_trace_ops)")
    except NoSnapshot as e:
        interp.abort(f"trace longer than {interp.max_ops} ops and not cut here: {e}", "too_long")
        return
    if not live:
        interp.abort(f"trace longer than {interp.max_ops} ops with no tensor live at the cut", "too_long")
        return
    interp.rec.cut = (snap, live)


def _bucket_cut(interp):
    """Under data-parallel training (config.ddp_bucket_mb): the trace ends before this
    submodule call, its parameters so far about one DDP bucket; the rest of the call is the
    trace after the cut (recorded as the cut's side trace), whose backward runs first."""
    if interp.probe is not None or interp._start is None or not interp.frames or interp._start[0] is not interp.frames[-1]:
        return
    f, ip, stack, kw_names, mutated = interp._start
    if interp.rec.mutated != mutated:
        return
    try:
        snap, live, _ = snapshot.take(interp, f, ip, "trace cut (a DDP bucket's parameters)", stack, kw_names)
    except NoSnapshot:
        return  # (not cut here: perhaps at the next submodule)
    if live:
        snap.bucket_cut = True
        interp.rec.cut = (snap, live)


def _stitch(interp, why):
    """Ends the trace right before the current CALL, which is not recordable (why), as a
    *stitch*: the trace's outputs are the live tensors, and its cut exit carries a snapshot of
    the frames as they will be *after* the call, with the call's result as one more live
    value (("live", n)), plus the call itself (`step`: its callable and arguments, encoded like
    the frames). On later calls the front end runs the trace, makes that one call for real,
    and goes on in a trace recorded from after it (tracetree.Runner._continue_at_exit). False when
    the state cannot be carried (then the recording aborts, as before)."""
    if interp._start is None or not interp.frames or interp._start[0] is not interp.frames[-1]:
        return False
    f, ip, stack, kw_names, mutated = interp._start
    ins = f.dec.insts[ip]
    if ins.opname not in ("CALL", "CALL_KW") or interp.rec.mutated != mutated:
        return False
    if ins.opname == "CALL_KW":  # 3.13: the keyword names are the top of the stack, consumed with the call
        if not stack or type(stack[-1][0]) is not tuple:
            return False
        stack, kw_names = stack[:-1], stack[-1][0]
    return interp._stitch_at(f, ip, stack, kw_names, why, "call", ins.arg + 2, tuple(kw_names or ()), True)


def _stitch_store(interp, f, why, kind, extra):
    """A stitch at the STORE_ATTR (kind "setattr", extra the name) or STORE_SUBSCR ("setitem")
    now at f.ip - 1, into an object from outside the call, before its operands are popped:
    the step makes the store for real on later calls, between the two traces."""
    return interp._stitch_at(f, f.ip - 1, f.stack, f.kw_names, why, kind, 2 if kind == "setattr" else 3, extra,
                           False)


def _stitch_at(interp, f, ip, stack, kw_names, why, kind, nops, extra, pushes):
    if interp.probe is not None:  # (before the call or store is made)
        raise ProbeStop(why)
    if not config.stitch or interp.nopython or not interp.recording or len(stack) < nops:
        return False
    # inside a try or with block the step's exception would belong to a handler of the
    # frame, which a step made between two traces cannot reach
    if any(fr.dec.handlers and fr.dec.catches_at(fr.dec.insts[ip if fr is f else fr.ip - 1].offset)
           for fr in interp.frames):
        return False
    cut = snapshot.for_stitch(interp, f, ip, stack, kw_names, why, (kind, nops, extra, pushes))
    if cut is None:
        return False
    interp.rec.cut = cut
    interp.rec.stitch_reason = why
    return True
