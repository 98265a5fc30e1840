"""Records the ATen operations a call performs into trace IR text (docs/IR.md).

The recorder is a TorchDispatchMode: while the recording interpreter runs the user's code
on real tensors, every ATen op eager PyTorch executes passes through __torch_dispatch__,
runs for real, and is written down with its operands resolved to trace values:

  * tensors the interpreter read from a source are trace inputs (registered beforehand);
  * tensors produced by recorded ops are trace values;
  * Python numbers, and zero-dim tensors of unknown origin (numbers ATen's argument parser
    wrapped: `x + 1`), become literals. A literal cannot fill a Tensor argument of an extern
    (torch hands wrapped numbers to the mode as plain Python numbers), so such an op is
    called through its Scalar overload (`floor_divide.Scalar`), or else the number becomes a
    0-dim tensor made by `aten::scalar_tensor`; either replacement is run once while recording
    and must give exactly eager's outputs (values, dtype, shape);
  * anything else (a tensor made by code we did not record) aborts the trace.

Arguments the IR cannot spell are dropped when they equal what the runtime does without them
(device=cpu, layout=torch.strided, pin_memory=False, memory_format=contiguous/preserve: every
tensor the compiled code makes is dense, CPU and contiguous); other values abort. A creation op
with a dtype the compiler lacks (batch norm's uint8 reserve buffer) is left out of the trace;
only a use of its result aborts.

View ops become IR views, in-place ops become the functional op plus `copy_` into the input,
everything else an `extern aten::op.overload(...)` that the compiler either lowers into its
own fused code (jit/decompose.cpp) or calls in LibTorch.
"""
import math
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .frames import Abort, DataDependentStep, NoSnapshot, ProbeStop, dense_order, dense_strides
from .sizes import p_add, poly

_aten = torch.ops.aten
_PRIM_DEVICE = torch.ops.prim.device.default

DTYPE_NAMES = {
    torch.bool: "bool", torch.int32: "i32", torch.int64: "i64", torch.float32: "f32",
    torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
}


def _poison_kind(message):
    """The kind of a poisoned tensor's reason: a dtype the compiler lacks, or a write."""
    return "dtype" if "is not supported by the compiler" in message else "write"


def type_text(t):
    if t.dtype not in DTYPE_NAMES:
        raise Abort(f"dtype {t.dtype} is not supported by the compiler", "dtype")
    return f"{DTYPE_NAMES[t.dtype]}[{','.join(str(s) for s in t.shape)}]"


def _lit_float(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = repr(float(v))
    return r


class TapeRef:
    """A tensor argument on the recorder's tape: ("in", slot) or ("op", tape index, output index)."""

    __slots__ = ("r",)

    def __init__(self, r):
        self.r = r


_DYNAMO_KEPT_OUT = False


def _keep_torch_dynamo_out():
    """Where torch._dynamo is loaded (torch.compile in the process, torch.compile(backend=
    "dynamo") recording a graph), the recorder's dispatch frames are marked for TorchDynamo to
    leave alone, as torch marks every mode's; once per process, and without importing it."""
    global _DYNAMO_KEPT_OUT
    if not _DYNAMO_KEPT_OUT and "torch._dynamo" in sys.modules:
        Recorder.__torch_dispatch__ = torch._disable_dynamo(Recorder.__dict__["__torch_dispatch__"], recursive=True)
        _DYNAMO_KEPT_OUT = True


def _covering_bound(bounds):
    """The polynomial k of a slice that covers its dim when k >= the size: [:k] (start none or
    0, no step) or [-k:] (stop none, no step); None for any other slice or bound."""
    if bounds is None:
        return None
    start, stop, step = bounds
    if step is not None:
        return None
    if stop is not None and (start is None or start == ()):
        return stop
    if start is not None and stop is None:
        return p_add((), start, -1)
    return None


# Recorder.probe for a size probe run on the call's own tensors at their own sizes (probe.run):
# its ops run for real (no FakeTensorMode), each checked to write only into tensors it made.
REAL_PROBE = object()


class Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls):
        """Not at class creation: torch wraps a mode's __torch_dispatch__ so that TorchDynamo does
        not trace it, and the wrapper imports torch._dynamo on its first call (about a second of
        every process's first recording). Done in __init__ instead, once torch._dynamo is loaded."""
        return False

    def __init__(self, name):
        super().__init__()
        _keep_torch_dynamo_out()
        self.name = name
        self.inputs = []        # IR input declarations, in slot order
        self.input_tensors = []  # ... and the tensors (None for a Python number's slot)
        self.input_marks = {}   # slot -> dims marked dynamic on that input (dynamo.mark_dynamic)
        self.lines = []         # IR instructions
        self.vals = {}          # id(tensor) -> IR value name
        self.keep = []          # tensors kept alive so that ids stay unique while recording
        self.device = None      # torch.device of the CUDA inputs (None: a CPU trace)
        self.view_of = {}       # id(view) -> (parent tensor, the op that made it, its argument values)
        self.made = {}          # id(tensor) -> how an op of _PROVENANCE made it (_note_made; weak references)
        self.views = {}         # id(tensor) -> the views taken of it (tensors)
        self.poison = {}        # id(tensor) -> why it cannot be used (a creation op left out of the trace)
        self.pairs = set()      # id(complex tensor) whose trace value is its real view (float pairs)
        self.input_names = set()
        self.mutated = False    # an in-place op was recorded
        self.ops = []           # ATen op names, for explain()
        self.paused = 0
        self.abort_reason = None
        self.abort_where = None   # "file:line" of the bytecode where the recording ended
        self.abort_kind = None    # the reason's row in reasons.KINDS
        self.abort_selves = []    # the first argument of each inlined frame then (modules: where it was)
        self.on_abort = None      # called when the recording first aborts (the interpreter notes where)
        self.exits = []         # Snapshot per side exit (the IR's guard op), by exit id
        self.value_exits = 0    # side exits at a branch on, or a read of, a tensor's value
        self.cut = None         # (Snapshot, live tensors) when the trace was cut at config.max_trace_ops
        self.stitch_reason = None  # why, when the cut is a stitch (before a call not recordable)
        self.snapshot_here = None  # interpreter callback: (Snapshot, live) resuming at the current bytecode
        self.step_mark = None   # inside a torch call the interpreter makes: len(lines) when it began
        self.effect = None      # the first write into a tensor from outside the call (the call cannot be re-run)
        self.effect_indirect = False  # ... and one is not into an input itself (_note_effect)
        self._restride = False  # the op being recorded is an as_strided that keeps its argument's elements
        self.scalar_inputs = {}  # source expr -> IR name of a Python number passed to the trace each call
        self.on_scalar_input = None  # called with the source expr when one is added (the guards fetch it)
        self._scalar_scope = None  # (value, source expr) while one op's Python number is a scalar input
        self.scalar_uses = 0    # how many operands the scope's number filled
        # the ATen ops as dispatched, for a replay (training.py): kept only where grad is on (no
        # training without it); None once it cannot be
        self.tape = [] if torch.is_grad_enabled() else None
        self.tape_refs = {}     # id(tensor) -> ("in", slot) or ("op", tape index, output index)
        self.tape_why = None if self.tape is not None else "grad mode was off when the recording began"
        self.tape_scalar_why = None  # why the tape cannot take the trace's scalar inputs (training.py)
        self._n = 0
        self.train_only = None  # why the trace text is only right as a training trace (a hidden write
        #                         the tape's replay makes explicit: batch norm's running statistics)
        self.probe = None       # a size probe (probe.py): the FakeTensorMode its ops run under
        self._fakes = {}        # ... and there, id(real tensor) -> its fake twin
        self.probe_shapes = {}  # ... id(real tensor) -> the size the probe gives it (probe.run)
        self.alias_dims = None  # the dims an index being made bounds (interpreter's BINARY_SUBSCR)
        self.alias_guard = None  # ... and where a bound that covered its dim goes (sizeflow)
        self.size_fixed = {}    # (value name, dim) -> why: sizes an op's choice depended on (aten::alias)

    # -- values --------------------------------------------------------------------------
    def _new(self):
        self._n += 1
        return f"%v{self._n}"

    def last_value(self):
        """The name of the newest trace value (a tensor), or of the first input."""
        return f"%v{self._n}" if self._n else "%i0"

    def add_input(self, t, weight=False):
        """Registers tensor t (read from a guarded source) as the next trace input. weight: t is
        a module's parameter or buffer (declared `weight`: the native code keeps what it computes
        from weights alone across calls, recomputed when one of them changes)."""
        if id(t) in self.vals:
            return False
        where = ""
        if t.device.type == "cuda":
            from . import config
            if not config.gpu:
                raise Abort(f"tensor on {t.device}: dynamo.config.gpu is False", "device")
            dev = torch.device("cuda", t.device.index or 0)
            if self.device is not None and self.device != dev:
                raise Abort(f"tensors on several devices ({self.device} and {dev})", "device")
            if self.device is None and self.inputs:
                raise Abort(f"CPU and CUDA tensors mixed in one call ({dev})", "device")
            self.device = dev
            where = f" cuda:{dev.index}"
        elif t.device.type != "cpu":
            raise Abort(f"tensor on {t.device}: dynamo compiles CPU and CUDA tensors only", "device")
        elif self.device is not None:
            raise Abort(f"CPU and CUDA tensors mixed in one call ({self.device})", "device")
        if t.layout != torch.strided or t.is_quantized or t.is_sparse:
            raise Abort("only dense strided tensors are supported", "layout")
        name = f"%i{len(self.inputs)}"
        strides = ",".join(str(s) for s in t.stride())
        rg = " requires_grad" if t.requires_grad else ""
        rg += " weight" if weight else ""
        self.inputs.append(f"  {name} = input {type_text(t)}{{{strides}}}{where}{rg}")
        self.input_tensors.append(t)
        self.vals[id(t)] = name
        self.input_names.add(name)
        self.keep.append(t)
        marks = getattr(t, "_dynamo_dynamic", None)
        if marks:
            self.input_marks[len(self.inputs) - 1] = frozenset(marks)
        return True

    def scalar_input(self, expr, value):
        """The trace input (`input f64` / `input i64`) for the Python number read from source
        expr, added as the next input the first time."""
        name = self.scalar_inputs.get(expr)
        if name is None:
            name = f"%i{len(self.inputs)}"
            self.inputs.append(f"  {name} = input {'f64' if type(value) is float else 'i64'}")
            self.input_tensors.append(None)
            self.scalar_inputs[expr] = name
            if self.on_scalar_input is not None:
                self.on_scalar_input(expr)
        return name

    def scalar_scope(self, value, expr):
        """While active (a context), every operand equal to Python number value (same type, same
        bits) is the scalar input of source expr; scalar_uses counts them. The interpreter opens
        it around one tensor operation whose Python-number operand came from expr, and keeps the
        number unguarded only if it filled exactly one operand."""
        rec = self

        class _Scope:
            def __enter__(self):
                rec._scalar_scope, rec.scalar_uses = (value, expr), 0

            def __exit__(self, *exc):
                rec._scalar_scope = None
        return _Scope()

    def _is_scoped(self, v):
        """v is the Python number of the open scalar scope (same type, same bits)."""
        value = self._scalar_scope[0]
        if type(v) is not type(value):
            return False
        return (v == value and math.copysign(1.0, v) == math.copysign(1.0, value)) if type(v) is float else v == value

    def _scoped_scalar(self, v):
        value, expr = self._scalar_scope
        if type(v) is not type(value):
            return None
        same = (v == value and math.copysign(1.0, v) == math.copysign(1.0, value)) if type(v) is float else v == value
        if not same:
            return None
        self.scalar_uses += 1
        return self.scalar_input(expr, value)

    def value_shapes(self):
        """{trace value name: shape} of the tensors the recording holds now."""
        out = {}
        for t in self.keep:
            n = self.vals.get(id(t)) if isinstance(t, torch.Tensor) else None
            if n is not None:
                out[n] = tuple(t.shape)
        return out

    def known(self, t):
        return id(t) in self.vals

    def _wrapped(self, v):
        """v is (taken to be) a Python number ATen's argument parser wrapped into a tensor."""
        return isinstance(v, torch.Tensor) and id(v) not in self.vals and id(v) not in self.poison and \
            v.dim() == 0 and v.device.type == "cpu"

    def abort(self, reason, kind="internal"):
        # after a cut (or a stitch) the trace has ended: what the rest of the call does is the
        # next trace's business
        if self.probe is not None:
            raise ProbeStop(reason)
        if self.abort_reason is None and self.cut is None:
            self.abort_reason = reason
            self.abort_kind = kind
            if self.on_abort is not None:
                self.on_abort()

    # -- operands ------------------------------------------------------------------------
    def _operand(self, v):
        if isinstance(v, torch.Tensor):
            name = self.vals.get(id(v))
            if name is not None:
                if id(v) in self.pairs:
                    raise Abort(f"dtype {v.dtype} is not supported by the compiler (a complex tensor reached an op "
                                "other than abs or a view)", "dtype")
                return name
            if id(v) in self.poison:
                raise Abort(self.poison[id(v)], _poison_kind(self.poison[id(v)]))
            if self._wrapped(v):
                # A Python number ATen wrapped into a tensor (`x + 2.5`).
                x = v.item()
                if isinstance(x, complex):
                    raise Abort("complex numbers are not supported", "dtype")
                return self._operand(x)
            raise Abort("a tensor of unknown origin reached an ATen op (made by code that was not recorded)",
                        "unknown_tensor")
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "true" if v else "false"
        if self._scalar_scope is not None and type(v) in (int, float):
            name = self._scoped_scalar(v)
            if name is not None:
                return name
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return _lit_float(v)
        if isinstance(v, str):
            return '"' + v + '"'
        if isinstance(v, torch.dtype):
            if v not in DTYPE_NAMES:
                raise Abort(f"dtype {v} is not supported", "dtype")
            return DTYPE_NAMES[v]
        if isinstance(v, (list, tuple)):
            if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                return "[" + ",".join(str(x) for x in v) + "]"
            if v and all(isinstance(x, bool) for x in v):  # bool[] (output masks): as 0/1, the schema says bool
                return "[" + ",".join("1" if x else "0" for x in v) + "]"
            if v and all(x is None or isinstance(x, torch.Tensor) for x in v) and \
                    any(isinstance(x, torch.Tensor) for x in v):
                # Tensor[] / Tensor?[] (torch.cat, torch.stack, indexing by tensors): a tensor list
                return "[" + ", ".join(self._operand(x) for x in v) + "]"
            raise Abort("ATen op with a list argument of floats or mixed values is not supported yet", "op_arguments")
        if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            raise Abort(f"ATen op with a {type(v).__name__} argument is not supported yet", "op_arguments")
        raise Abort(f"ATen op with a {type(v).__name__} argument is not supported", "op_arguments")

    def _args(self, func, args, kwargs):
        """Operands in schema order; missing trailing arguments are left to schema defaults.
        Device, layout, pin_memory and memory_format arguments that change nothing in what the
        runtime computes are dropped (left to the schema default); others abort."""
        schema = func._schema
        all_cpu = all(t.device.type == "cpu" for t in _tensors_in((args, kwargs)))
        vals = []
        for i, a in enumerate(schema.arguments):
            if i < len(args):
                v = args[i]
            elif a.name in kwargs:
                v = kwargs[a.name]
            else:
                v = _MISSING
            if v is not _MISSING and _implied(_sig(func), a, v, all_cpu):
                v = _MISSING
            vals.append(v)
        while vals and vals[-1] is _MISSING:
            vals.pop()
        for i, v in enumerate(vals):
            if v is _MISSING:
                d = schema.arguments[i]
                if not d.has_default_value():
                    raise Abort(f"{schema.name}: argument {d.name} missing (or not expressible in the IR)",
                                "op_arguments")
                vals[i] = d.default_value
        return vals

    # -- dispatch ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        writes = _WRITERS.get(func)
        if writes is None:
            writes = _WRITERS[func] = _written_args(func)
        if writes and (self.effect is None or self.tape is not None and not self.effect_indirect):
            self._note_effect(func, args, kwargs)
        if func is _aten.bmm.default and not self.paused and self.abort_reason is None and self.cut is None:
            parts = self._softmax_attention(*args)
            if parts is not None:
                with self:  # recorded as dynamo::attention and a reshape
                    return _attention_as_bmm(*parts)
        decomposition = _DECOMPOSITIONS.get(func)
        if decomposition is not None and not self.paused and self.abort_reason is None and self.cut is None and \
                decomposition[0](*args, **kwargs):
            with self:  # its parts are dispatched (and recorded) one by one
                return decomposition[1](*args, **kwargs)
        if self.step_mark is not None and self.step_mark == len(self.lines) and not self.paused and \
                self.abort_reason is None and self.cut is None and _needs_step(func):
            raise DataDependentStep(f"{_sig(func)}: the output size depends on the data (a step between traces)")
        # judged before the op runs: as_strided_ changes its argument's strides
        self._restride = func in _LAYOUT_DEPENDENT and _restrides_in_place(func, args, kwargs)
        if self.probe is None or self.probe is REAL_PROBE:
            if self.probe is REAL_PROBE:
                self._writes_own_tensors_only(func, args, kwargs)
            run = _RUN_AS.get(func)
            out = func(*args, **kwargs) if run is None else run(func, args, kwargs)
        else:
            out = self._probe_call(func, args, kwargs)
            if func is _PRIM_DEVICE:  # a fake tensor's .device (a real one answers without an op)
                return out
        if self.paused or self.abort_reason is not None or self.cut is not None:
            return out
        if self.tape is not None:
            self._tape(func, args, kwargs, out)
        if func in _PROVENANCE:
            self._note_made(func, args, out)
        try:
            self._record(func, args, kwargs, out)
        except Abort as e:
            self.abort(str(e), e.kind)
        return out

    # -- attention written out: softmax(q @ k^T * scale) @ v ------------------------------------
    def _note_made(self, func, args, out):
        if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            # A view's version counter becomes its base's only after the mode returns (autograd's
            # view handling is above it): a view is checked through its base's counter instead.
            view = bool(func._schema.returns) and func._schema.returns[0].alias_info is not None
            tensors = [args[0]] + [a for a in args[1:] if isinstance(a, torch.Tensor)]
            self.made[id(out)] = (weakref.ref(out), func, [weakref.ref(a) for a in tensors],
                                  tuple(a for a in args[1:] if not isinstance(a, torch.Tensor)),
                                  [None if view else _version(out)] + [_version(t) for t in tensors])

    def _made_by(self, t):
        """(op, its first argument, its other non-tensor arguments, its other tensor arguments) of
        the op of _PROVENANCE that made tensor t while recording, or None -- also None when t or
        an argument was written in place since (its version counter moved: `w.masked_fill_(m,
        -inf)` after `w = q @ k^T` makes w other values than the product), or cannot tell."""
        e = self.made.get(id(t))
        if e is None or e[0]() is not t:
            return None
        tensors = [r() for r in e[2]]
        if any(a is None for a in tensors):
            return None
        now = [None if e[4][0] is None else _version(t)] + [_version(x) for x in tensors]
        if None in now[1:] or now != e[4]:
            return None
        return e[1], tensors[0], e[3], tensors[1:]

    def _heads_of(self, t, rank=4):
        """The [B, H, R, C] tensor whose elements t ([B*H, R, C], how torch's matmul hands a batched
        product to bmm) holds: back through its reshape, contiguous copy and same-shape expand."""
        for _ in range(8):
            m = self._made_by(t)
            if t.dim() == rank and (m is None or m[0] not in (_aten.clone.default, _aten.expand.default)):
                return t
            if m is None:
                return None
            f, src = m[0], m[1]
            if f in (_aten.clone.default, _aten.expand.default):
                if tuple(src.shape) != tuple(t.shape):
                    return None
            elif f in _BATCH_RESHAPES:
                if not (src.dim() == 4 and t.dim() == 3 and src.shape[0] * src.shape[1] == t.shape[0] and
                        tuple(src.shape[2:]) == tuple(t.shape[1:])):
                    return None
            else:
                return None
            t = src
        return None

    def _softmax_attention(self, a, b):
        """bmm(a, b) as the end of attention written out -- a the softmax over the last dim of
        (q @ k^T) times or divided by a number, b the values, all [B, H, rows, head size] tensors
        batched by torch's matmul -- as (q, k, v, scale, result shape) for dynamo::attention
        (runtime/attention.cpp: online softmax, no score matrix), or None. The product and
        softmax recorded before stay in the trace where something else reads them; DCE drops
        them where nothing does."""
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 3 and b.dim() == 3):
            return None
        p, v = self._heads_of(a), self._heads_of(b)
        if p is None or v is None:
            return None
        m = self._made_by(p)
        if m is None or m[0] is not _aten._softmax.default or m[2][:1] not in ((-1,), (3,)) or m[2][1:2] != (False,):
            return None
        s, scale = m[1], 1.0
        m = self._made_by(s)
        if m is not None and m[0] in (_aten.div.Tensor, _aten.mul.Tensor) and not m[3] and len(m[2]) == 1 and \
                type(m[2][0]) in (int, float) and m[2][0] != 0:
            s, scale = m[1], (1.0 / m[2][0] if m[0] is _aten.div.Tensor else float(m[2][0]))
        m = self._made_by(s)
        if m is None or m[0] not in _BATCH_RESHAPES or m[1].dim() != 3 or s.dim() != 4:
            return None
        m = self._made_by(m[1])
        if m is None or m[0] is not _aten.bmm.default:
            return None
        q, kt = self._heads_of(m[1]), self._heads_of(m[3][0])
        if q is None or kt is None:
            return None
        m = self._made_by(kt)
        if m is None or not (m[0] is _aten.transpose.int and sorted(d % 4 for d in m[2][:2]) == [2, 3] or
                             m[0] is _aten.permute.default and [d % 4 for d in m[2][0]] == [0, 1, 3, 2]):
            return None
        k = m[1]
        B, H, L, D = q.shape
        if tuple(k.shape) != (B, H, k.shape[2], D) or tuple(v.shape[:3]) != (B, H, k.shape[2]) or \
                tuple(s.shape) != (B, H, L, k.shape[2]) or tuple(a.shape) != (B * H, L, k.shape[2]):
            return None
        if not all(self.known(t) for t in (q, k, v)) or not _own_attention(q, k, v):
            return None
        return q, k, v, scale, (B * H, L, v.shape[3])

    def probe_twin(self, v):
        """In a size probe: the fake twin of real tensor v, at the probe's size for it where the
        probe changes it (probe_shapes: a trace input read from an object, such as a key/value
        cache's tensor), else at v's own."""
        f = self._fakes.get(id(v))
        if f is None:
            shape = self.probe_shapes.get(id(v))
            self.paused += 1  # (making the twin is not an op of the program)
            try:
                if shape is None:
                    f = self.probe.from_tensor(v)
                else:
                    with self.probe:
                        f = torch.empty_strided(shape, dense_strides(v, shape), dtype=v.dtype, device=v.device)
            finally:
                self.paused -= 1
            self._fakes[id(v)] = f
            self.keep.append(v)
        return f

    def _writes_own_tensors_only(self, func, args, kwargs):
        """In a size probe on real tensors (REAL_PROBE): ProbeStop before an op that writes into a
        tensor the probe did not make (an input, a weight, a constant, or a view of one), and
        before a random op (it could draw from a generator the probe cannot put back: the probe
        goes on fakes instead)."""
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            raise ProbeStop(f"{_sig(func)} draws random numbers")
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if not isinstance(t, torch.Tensor):
                    continue
                for x in (t, t._base):
                    if x is None:
                        continue
                    n = self.vals.get(id(x))
                    if n is None or n in self.input_names:
                        raise ProbeStop(f"{_sig(func)} writes into a tensor from outside the call")

    def _probe_call(self, func, args, kwargs):
        """In a size probe: func run on fake tensors (shapes, dtypes and strides without data) --
        the program's real tensors (parameters, constants) as their fake twins, creation ops
        making fakes too. The recording refers to the real tensors as usual."""
        from torch._subclasses.fake_tensor import FakeTensor

        def fake(v):
            if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor):
                return self.probe_twin(v)
            if type(v) in (list, tuple):
                return type(v)(fake(x) for x in v)
            return v
        with self.probe:
            out = func(*fake(tuple(args)), **{n: fake(v) for n, v in kwargs.items()})
            if func is _aten.native_batch_norm.default and not (args[5] if len(args) > 5 else kwargs["training"]):
                # the CPU kernel returns empty saved statistics in eval mode, its meta kernel [C]
                out = (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)))
        return out

    def _tape(self, func, args, kwargs, out):
        """Keeps the op for a replay (training.py): its tensor arguments as references to trace
        inputs or to the results of earlier ops on the tape. A tensor from anywhere else (made
        while recording was paused) ends the tape."""
        def ref(v, tensor_arg=False):
            if isinstance(v, torch.Tensor):
                r = self.tape_refs.get(id(v))
                if r is None:
                    n = self.vals.get(id(v))
                    if n is None or n not in self.input_names:
                        raise LookupError
                    r = ("in", int(n[2:]))
                return TapeRef(r)
            if type(v) in (list, tuple):
                return type(v)(ref(x) for x in v)
            if self._scalar_scope is not None and type(v) in (int, float) and self._is_scoped(v):
                # the trace's scalar input: the replay reads it as a 0-dim tensor (training.py),
                # which ATen promotes as it does the Python number only in a Tensor argument
                # and, for a float, beside floating tensors
                floats = all(t.is_floating_point() for t in args if isinstance(t, torch.Tensor))
                if not tensor_arg or (type(v) is float and not floats):
                    self.tape_scalar_why = (f"a Python number passed as a trace input meets {_sig(func)} where a "
                                            "tensor cannot stand for it")
                    return v
                value, expr = self._scalar_scope
                return TapeRef(("in", int(self.scalar_input(expr, value)[2:])))
            return v
        schema = func._schema.arguments
        is_tensor = [str(x.type) == "Tensor" for x in schema]
        try:
            a = tuple(ref(x, k < len(is_tensor) and is_tensor[k]) for k, x in enumerate(args))
            names = {x.name: str(x.type) == "Tensor" for x in schema}
            k = {n: ref(v, names.get(n, False)) for n, v in kwargs.items()}
        except LookupError:
            self.tape, self.tape_why = None, f"{_sig(func)} reads a tensor the recording did not make"
            return
        i = len(self.tape)
        self.tape.append((func, a, k))
        for j, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                self.tape_refs[id(o)] = ("op", i, j)
                self.keep.append(o)  # (ids stay unique while recording)

    def tape_ref(self, name):
        """The tape reference of the tensor named `name` in the trace, or None."""
        if name in self.input_names:
            return ("in", int(name[2:]))
        for t in reversed(self.keep):
            if self.vals.get(id(t)) == name and id(t) in self.tape_refs:
                return self.tape_refs[id(t)]
        return None

    def _note_effect(self, func, args, kwargs):
        """func writes tensors: a write into one the call did not make (an input, a tensor of
        unknown origin, a view of one) is an effect the call cannot undo. effect_indirect: one
        such write is not into an input tensor itself (through a view, or into a tensor of
        unknown origin), which a training trace cannot make explicit (training.py); after a cut
        the trace has ended, and what the rest of the call writes is not the trace's."""
        for pos, name in _WRITERS[func]:
            t = args[pos] if pos < len(args) else kwargs.get(name)
            for x in _tensors_in(t):
                base = x._base if x._base is not None else x
                n = self.vals.get(id(base))
                if n is None or n in self.input_names:
                    self.effect = self.effect or f"{_sig(func)} writing into a tensor from outside the call"
                    if self.cut is None and (n is None or x._base is not None or
                                             self.vals.get(id(x)) not in self.input_names):
                        self.effect_indirect = True
                        return

    def _bind(self, t, name):
        self.vals[id(t)] = name
        self.keep.append(t)

    def _refuse_or_fix(self, func, name, args):
        """Ops the recorder refuses (a value read inside a call run whole, a tensor from Python
        data) raise Abort; an alias from indexing fixes the sizes its bound was compared with."""
        if func is _aten.alias.default and isinstance(args[0], torch.Tensor):
            # torch's indexing gives an alias where a slice kept a whole dim (x[:, :6] of 4
            # columns): its bound was compared with the size, which must stay what it was
            why = "an index kept a whole dimension (aten::alias): its bound was compared with the size"
            n = self.vals.get(id(args[0]))
            if n is not None:
                # the dims a slice bounded, where the interpreter knows the index (x[:, :, -n:, :]):
                # a bound that is a polynomial of the sizes covered the dim -- x[:k] with k >= the
                # size, x[-k:] with k >= it -- a guard of size families; any other fixes the dim
                dims = self.alias_dims if self.alias_dims is not None else dict.fromkeys(range(args[0].dim()))
                for d, bounds in dims.items():
                    covered = _covering_bound(bounds)
                    if covered is not None and self.alias_guard is not None:
                        self.alias_guard(p_add(covered, poly(1, (n, d)), -1), why)
                    elif self.probe is not None:
                        raise ProbeStop(why)
                    else:
                        self.size_fixed.setdefault((n, d), why)
        if func is _aten._local_scalar_dense.default:
            raise Abort("data-dependent value: a tensor's contents are read (.item(), bool(), int()) inside a call "
                        "the interpreter runs whole, where it cannot place a side exit", "data_dependent")
        if func is _aten.lift_fresh.default or name in ("aten::lift_fresh_copy",):
            raise Abort("tensor created from Python data inside the function (torch.tensor)", "python")

    def _record(self, func, args, kwargs, out):
        schema = func._schema
        name = schema.name
        overload = func._overloadname
        self.ops.append(name if overload == "default" else f"{name}.{overload}")
        self._refuse_or_fix(func, name, args)
        if self._restride:
            if func is _aten.as_strided_.default:
                return  # the same elements in the same order: nothing changes for the trace
            res = self._new()
            self.lines.append(f"  {res} = view({self._operand(args[0])}, {_shape(outs_of(out)[0])}) : "
                              f"{type_text(outs_of(out)[0])}")
            self._note_view(out, args[0], func, list(args))
            self._bind(out, res)
            return
        if _complex_among(args, out):
            self._record_complex(func, args, kwargs, out)
            return
        if func in _LAYOUT_DEPENDENT and not (func is _aten.as_strided.default and _row_major_strided(args, kwargs)):
            raise Abort(f"{name}: general strided views are not supported (stride arguments describe eager's "
                        "memory layout, which compiled intermediates need not have; over a contiguous tensor, "
                        "inside its elements, they are)", "strided_view")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        masked = self._masked_outputs(func, args, kwargs, outs)
        if masked is not None:  # a backward op asked for some gradients only (output_mask)
            vals, types = masked
            self._extern(func, vals, outs, types)
            return
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise Abort(f"{name} returns a non-tensor value", "op_arguments")
        vals = self._args(func, args, kwargs)

        mutates = bool(schema.arguments) and schema.arguments[0].alias_info is not None and \
            schema.arguments[0].alias_info.is_write
        if any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            raise Abort(f"{name}: out= variants are not supported", "op_arguments")
        if mutates:
            self._record_inplace(func, vals, args[0])
            return

        if self._record_view(func, vals, outs):
            return
        if torch.Tag.dynamic_output_shape in func.tags and not _static_index(func, vals):
            self._shape_exit(func, vals, outs)
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        if not seeded and not _tensors_in(vals):
            # A creation op (no tensor operands, no random numbers): where it runs does not
            # matter, so one whose dtype the compiler lacks is left out; a use of it aborts.
            bad = [o.dtype for o in outs if o.dtype not in DTYPE_NAMES]
            if bad:
                for o in outs:
                    self.poison[id(o)] = f"{_sig(func)} made a {bad[0]} tensor: dtype {bad[0]} is not supported " \
                                         "by the compiler"
                    self.keep.append(o)
                return
        hidden = _hidden_write(func, vals)
        if hidden is not None and self.tape is not None and func is _aten.native_batch_norm.default and \
                _config().training_batch_norm and \
                all(self.vals.get(id(t)) in self.input_names for t in vals[3:5] if t is not None):
            # batch norm in training mode with grad: the tape's replay makes the running
            # statistics' update explicit (training.py); the trace text may not run without it
            self.train_only = self.train_only or hidden
            hidden = None
        why = hidden
        if why is not None:
            raise Abort(why, "write" if "write" in why else "op_arguments")
        orig = func
        func, vals = self._scalar_args(func, vals, outs, check=not seeded)
        self._extern(func, vals, outs)
        self._note_aliases(orig, vals, outs)

    def _record_view(self, func, vals, outs):
        """A view op (or a split into several views) recorded as the view it is; False when func
        is no view the IR writes as one."""
        if func in _SPLITS:  # several views of one input: a slice (or select) each
            src = self._operand(vals[0])
            for o, (text, vf, vv) in zip(outs, _split_views(func, vals, outs, src)):
                res = self._new()
                self.lines.append(f"  {res} = {text} : {type_text(o)}")
                self._note_view(o, vals[0], vf, vv)  # as the slice it is: writes through it are traced
                self._bind(o, res)
            return True
        view = self._view_text(func, vals, outs[0])
        if view is None:
            return False
        self._operand(vals[0])
        res = self._new()
        self.lines.append(f"  {res} = {view} : {type_text(outs[0])}")
        self._note_view(outs[0], vals[0], func, vals)
        self._bind(outs[0], res)
        return True

    # -- complex tensors as float pairs ---------------------------------------------------
    def _record_complex(self, func, args, kwargs, out):
        """A complex tensor is held in the trace as its real view (torch.view_as_real: float
        pairs in a trailing dim of 2): made by the FFT of a real float32 tensor (stft's
        spectrum, extern dynamo::fft_r2c), viewed (transpose, permute, reshape, squeeze,
        unsqueeze, and stft's in-place transpose_), and read by abs (the magnitude, a real
        tensor). Any other use of one aborts as the dtype the compiler lacks; so does returning
        one, or one live at a side exit or stitch (Recorder.output_name, snapshot.encode)."""
        name = _sig(func)
        bad = Abort(f"{name} on a complex tensor: complex dtypes are not supported by the compiler "
                    "(only stft's spectrum, its views and abs are traced)", "dtype")
        outs = outs_of(out)
        if func is _aten._fft_r2c.default:
            x = args[0]
            if x.dtype != torch.float32 or outs[0].dtype != torch.complex64:
                raise bad
            vals = self._args(func, args, kwargs)
            dims = "[" + ",".join(str(d) for d in vals[1]) + "]"
            res = self._new()
            self.lines.append(f"  {res} = extern dynamo::fft_r2c({self._operand(x)}, {dims}, {int(vals[2])}, "
                              f"{self._operand(bool(vals[3]))}) : {_pairs_type(outs[0])}")
            self._bind_pairs(outs[0], res)
            return
        z = args[0] if args else None
        if not isinstance(z, torch.Tensor) or id(z) not in self.pairs or \
                any(isinstance(a, torch.Tensor) and a.is_complex() and a is not z for a in args[1:]):
            raise bad
        src = self.vals[id(z)]
        nd = z.dim()
        if func is _aten.abs.default and outs[0].dtype == torch.float32:
            shape = ",".join(str(d) for d in outs[0].shape)
            sq, total, res = self._new(), self._new(), self._new()
            self.lines.append(f"  {sq} = mul({src}, {src}) : {_pairs_type(z)}")
            self.lines.append(f"  {total} = sum({sq}, [{nd}], false) : f32[{shape}]")
            self.lines.append(f"  {res} = sqrt({total}) : f32[{shape}]")
            self._bind(outs[0], res)
            return
        view = _pairs_view(func, args, nd, outs[0])
        if view is None:
            raise bad
        res = self._new()
        self.lines.append(f"  {res} = {view.format(src)} : {_pairs_type(outs[0])}")
        if func in _PAIRS_IN_PLACE:  # the same tensor, with new metadata
            self.vals[id(z)] = res
        else:
            self._bind_pairs(outs[0], res)

    def _bind_pairs(self, t, name):
        self._bind(t, name)
        self.pairs.add(id(t))

    def _note_aliases(self, func, vals, outs):
        """An op whose result aliases an argument (a view ATen makes that the IR has no view op
        for: aten::_reshape_alias, diagonal, ...) is recorded as a copy; noting it as a view of that
        argument makes a later write into the argument poison it (its eager value would change)."""
        schema = func._schema
        for r, o in zip(schema.returns, outs):
            if r.alias_info is None or not isinstance(o, torch.Tensor):
                continue
            for a, v in zip(schema.arguments, vals):
                if isinstance(v, torch.Tensor) and a.alias_info is not None and \
                        set(a.alias_info.before_set) & set(r.alias_info.before_set):
                    self._note_view(o, v, func, vals)

    def _masked_outputs(self, func, args, kwargs, outs):
        """(operands, result types) for an op whose bool[] output_mask left some results out
        (convolution_backward of a first layer, whose input needs no gradient): the trace asks
        for every result, as the IR's results are tensors, and uses those the call returned;
        the types of the others come from running the op once with the full mask. None for any
        other op."""
        if all(isinstance(o, torch.Tensor) for o in outs):
            return None
        k = next((i for i, a in enumerate(func._schema.arguments) if a.name == "output_mask"), None)
        if k is None or not all(o is None or isinstance(o, torch.Tensor) for o in outs):
            return None
        vals = self._args(func, args, kwargs)
        if k >= len(vals) or not isinstance(vals[k], (list, tuple)):
            return None
        vals[k] = [True] * len(vals[k])
        if self.probe is not None:
            raise ProbeStop("a backward op")
        full = func(*vals)
        full = list(full) if isinstance(full, (tuple, list)) else [full]
        if len(full) != len(outs) or not all(isinstance(o, torch.Tensor) for o in full):
            return None
        return vals, ", ".join(type_text(o) for o in full)

    def _extern(self, func, vals, outs, types=None):
        vals = _scale_as_size(func, vals, outs)
        ops = ", ".join(self._operand(v) for v in vals)
        types = types or ", ".join(type_text(o) for o in outs)
        names = [self._new() for _ in outs]
        self.lines.append(f"  {', '.join(names)} = extern {_sig(func)}({ops}) : {types}")
        for o, n in zip(outs, names):
            if o is not None:
                self._bind(o, n)
        return names

    def _scalar_args(self, func, vals, outs, check):
        """(func, vals) with no wrapped Python number left in a Tensor argument: the runtime
        passes literals as numbers, which a Tensor argument rejects ('Expected Tensor but got
        Int'). The op's Scalar overload takes them as ATen's Python binding would have; failing
        that, each number becomes a 0-dim tensor of its own dtype, made by aten::scalar_tensor
        (not a wrapped number, so type promotion can differ). check: run the replacement now and
        require eager's outputs (dtype, shape, values); without it only the Scalar overload,
        which wraps the number again inside ATen, is used."""
        schema = func._schema
        nums = {}
        for i, v in enumerate(vals):
            if i < len(schema.arguments) and _kind(schema.arguments[i].type)[0] == "TensorType":
                # torch hands wrapped numbers to __torch_dispatch__ as Python numbers
                if self._wrapped(v):
                    v = v.item()
                if isinstance(v, complex):
                    raise Abort(f"{_sig(func)}: complex numbers are not supported", "dtype")
                if isinstance(v, (bool, int, float)):
                    nums[i] = v
        pos = list(nums)
        if not pos:
            return func, vals
        alt = _scalar_overload(func, pos, len(vals))
        if alt is not None:
            new = [nums[i] if i in nums else v for i, v in enumerate(vals)]
            if check and self.probe is None:  # (a probe's tensors hold no values; the recording checked)
                _same_result(alt, new, outs, f"{_sig(func)} as {_sig(alt)}")
            return alt, new
        argn = ", ".join(func._schema.arguments[i].name for i in pos)
        if not check:
            raise Abort(f"{_sig(func)}: a Python number as Tensor argument '{argn}' and no Scalar overload of the op",
                        "op_arguments")
        reps = {i: torch.scalar_tensor(nums[i], dtype=_NUMBER_DTYPE[type(nums[i])]) for i in pos}
        new = [reps[i] if i in reps else v for i, v in enumerate(vals)]
        if self.probe is None:
            _same_result(func, new, outs, f"{_sig(func)} with '{argn}' as a 0-dim tensor")
        for i, t in reps.items():
            self._extern(_aten.scalar_tensor.default, [nums[i], t.dtype], [t])
        return func, new

    def _note_view(self, out, parent, func, vals):
        self.view_of[id(out)] = (parent, func, vals)
        self.views.setdefault(id(parent), []).append(out)

    def _retake_views(self, t, why):
        kids, self.views[id(t)] = self.views.pop(id(t), []), []
        for v in kids:
            parent, vf, vv = self.view_of[id(v)]
            text = self._view_text(vf, [parent] + list(vv[1:]), v) if id(v) not in self.poison else None
            if text is None:
                self.vals.pop(id(v), None)
                self.poison[id(v)] = why
                self._poison_views(v, why)
                continue
            n = self._new()
            self.lines.append(f"  {n} = {text} : {type_text(v)}")
            self._bind(v, n)
            self.views[id(t)].append(v)
            self._retake_views(v, why)

    def _poison_views(self, t, why):
        """Every view taken of t (transitively) aliases memory about to change: later uses abort."""
        for v in self.views.pop(id(t), []):
            self._poison_views(v, why)
            self.vals.pop(id(v), None)
            self.poison[id(v)] = why

    def _seeded_in_memory_order(self, fn, vals, dst, perm):
        """A random op written in place (bernoulli_: dropout's mask) into dst, which is dense in
        the dim order perm (outermost first) but not contiguous (dropout on a transposed attention
        output): eager draws the numbers in dst's memory order, while the functional op (and an
        extern's operands) go in logical order; so the trace draws them over dst permuted into
        memory order and permutes the result back. Returns the result's name."""
        shape = [dst.shape[d] for d in perm]
        ptype = f"{DTYPE_NAMES[dst.dtype]}[{','.join(str(s) for s in shape)}]"
        src, drawn, res = self._new(), self._new(), self._new()
        self.lines.append(f"  {src} = permute({self._operand(dst)}, [{','.join(str(d) for d in perm)}]) : {ptype}")
        ops = ", ".join([src] + [self._operand(v) for v in vals[1:]])
        self.lines.append(f"  {drawn} = extern {_sig(fn)}({ops}) : {ptype}")
        inverse = [perm.index(d) for d in range(dst.dim())]
        self.lines.append(f"  {res} = permute({drawn}, [{','.join(str(d) for d in inverse)}]) : {type_text(dst)}")
        return res

    def _record_inplace(self, func, vals, dst):
        """x.add_(y) -> %t = add(x, y); x = copy_(x, %t) on inputs; a rebinding on temporaries.
        A write through views of x (x[:, 1:3] = y, x[0].mul_(2), x.view(-1)[:5].add_(1)) is rebuilt
        as the new contents of x up the view chain (aten::slice_scatter / select_scatter, or the
        inverse reshape/transpose/permute), then written the same way. Other views of x taken
        earlier would see stale values: they are poisoned."""
        name = func._schema.name
        dname = self.vals.get(id(dst))
        if dname is None:
            raise Abort(self.poison.get(id(dst)) or f"{name} writes into a tensor of unknown origin", "write")
        if func in _INPLACE_VIEWS:
            self._inplace_view(func, _INPLACE_VIEWS[func], vals, dst)
            return
        res = self._written_value(func, name, vals, dst)
        new, base = self._up_the_views(name, res, dst)
        if base._base is not None:  # an input that is itself a view: other inputs may share its memory
            raise Abort(f"{name} writes into an input that is a view of another tensor (aliasing between "
                        "inputs is not traced)", "write")
        bname = self.vals.get(id(base))
        if bname is None:
            raise Abort(self.poison.get(id(base)) or f"{name} writes into a view of a tensor of unknown origin",
                        "write")
        if bname not in self.input_names and new in self.input_names:
            # a temporary now holds an input's values (t.copy_(x)), not its memory: a value of its
            # own, so that a later write into the temporary is not taken for a write into x
            n = self._new()
            self.lines.append(f"  {n} = copy({new}) : {type_text(base)}")
            new = n
        if bname in self.input_names:
            n = self._new()
            self.lines.append(f"  {n} = copy_({bname}, {new}) : {type_text(base)}")
            self.mutated = True
            self.input_names.add(n)  # later in-place ops still write the input's memory
            new = n
        self.vals[id(base)] = new
        # Every view of the base (the ones written through, their siblings -- the other pieces of
        # a split --, views of views) sees the new contents, as in eager, where they share its
        # memory: each is taken again, of the new value of its parent. One that cannot be taken
        # again (a view the IR records as a copy, such as a diagonal) is poisoned: using it aborts.
        self._retake_views(base, f"a view of a tensor that {name} wrote into afterwards (this kind of view is "
                                 "not traced after a write)")

    def _written_value(self, func, name, vals, dst):
        """The IR value an in-place op writes into dst: copy_'s source broadcast and cast to dst,
        or the op's functional form (random ops in dst's memory order)."""
        if name == "aten::copy_":  # the source, broadcast and cast to the destination
            res = self._operand(vals[1])
            src = vals[1]
            if isinstance(src, torch.Tensor) and tuple(src.shape) != tuple(dst.shape):
                n = self._new()
                self.lines.append(f"  {n} = expand({res}, [{','.join(str(d) for d in dst.shape)}]) : "
                                  f"{_dt(src.dtype)}[{','.join(str(d) for d in dst.shape)}]")
                res = n
            if not isinstance(src, torch.Tensor) or src.dtype != dst.dtype:
                n = self._new()
                self.lines.append(f"  {n} = to({res}, {_dt(dst.dtype)}) : {type_text(dst)}")
                res = n
            return res
        fn = _functional(func)
        if fn is None:
            raise Abort(f"{name}: no functional form", "write")
        order = None
        if fn in _SEEDED_FUNCTIONAL.values():
            if not dst.is_contiguous():
                order = dense_order(dst)
                if order is None:
                    raise Abort(f"{name} into a tensor that is no permutation of a dense one: its random "
                                "numbers would land elsewhere", "write")
            vals = _with_defaults(func, vals)
        computed = _functional_dtype(fn, vals, dst.dtype)
        fn, vals = self._scalar_args(fn, vals, None, check=False)
        if order is not None:
            return self._seeded_in_memory_order(fn, vals, dst, order[::-1])
        if computed == dst.dtype or computed not in DTYPE_NAMES:
            return self._extern(fn, vals, [None], types=type_text(dst))[0]
        # the functional op promotes (half.add_(float32) computes add in float32): its own
        # dtype, then cast to dst's as the in-place op stores it
        res = self._extern(fn, vals, [None], types=f"{_dt(computed)}[{','.join(str(d) for d in dst.shape)}]")[0]
        n = self._new()
        self.lines.append(f"  {n} = to({res}, {_dt(dst.dtype)}) : {type_text(dst)}")
        return n

    def _up_the_views(self, name, new, dst):
        """(the new contents of the tensor owning dst's memory, that tensor): a value written into
        view dst rebuilt up its view chain (slice_scatter / select_scatter, or the inverse
        reshape/transpose/permute)."""
        cur = dst
        while id(cur) in self.view_of:  # up the view chain to the tensor that owns the memory
            parent, vf, vv = self.view_of[id(cur)]
            inverse = _inverse_view(vf, vv, parent, new)
            if inverse is None and vf is not _aten.slice.Tensor and vf is not _aten.select.int:
                raise Abort(f"{name} writes through a view made by {vf._schema.name} (writes through slices, "
                            "selects, reshapes and transposes are traced)", "write")
            pname = self._operand(parent)
            n = self._new()
            if inverse is not None:  # the view keeps every element: its new contents, viewed back
                self.lines.append(f"  {n} = {inverse} : {type_text(parent)}")
            elif vf is _aten.slice.Tensor:  # (its bounds as the program gave them: x[:, 1:] ends at the end
                dim, start, end, step = _slice_params(vv, raw=True)  # at every size, as the view does)
                self.lines.append(f"  {n} = extern aten::slice_scatter({pname}, {new}, {dim}, {start}, {end}, "
                                  f"{step}) : {type_text(parent)}")
            else:
                self.lines.append(f"  {n} = extern aten::select_scatter({pname}, {new}, {vv[1]}, {vv[2]}) : "
                                  f"{type_text(parent)}")
            new, cur = n, parent
        return new, cur

    def _inplace_view(self, func, fn, vals, dst):
        """x.squeeze_(0), x.unsqueeze_(1), x.t_(), x.transpose_(0, 1) (torch's matmul of a vector
        squeezes its product so): the tensor becomes a view of its own memory under a new shape,
        no value changes. Recorded as that view, bound to x. Only on a temporary that is no view
        and has none: an input's new shape would be a change the caller sees, and the view
        relations of x (which later writes follow) would be of its old shape."""
        name = func._schema.name
        if self.vals.get(id(dst)) in self.input_names:
            raise Abort(f"{name} changes the shape of an input in place (the caller's tensor)", "write")
        if id(dst) in self.view_of or self.views.get(id(dst)):
            raise Abort(f"{name} changes the shape of a tensor that is a view or has views", "write")
        text = self._view_text(fn, vals, dst)
        if text is None:
            raise Abort(f"{name}: an in-place view of a kind not traced", "write")
        res = self._new()
        self.lines.append(f"  {res} = {text} : {type_text(dst)}")
        self._bind(dst, res)

    def _view_text(self, func, v, out):
        """IR text of a view op (without result type), or None for non-views."""
        x = lambda: self._operand(v[0])  # noqa: E731
        shape = "[" + ",".join(str(s) for s in out.shape) + "]"
        if func in (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
                    _aten._reshape_alias.default):
            # _reshape_alias(x, size, stride) is reshape's no-copy path: its strides describe
            # eager's layout of x, which a compiled intermediate need not have. Its meaning is
            # the row-major reshape by sizes, which the IR reshape gives on any layout.
            return f"reshape({x()}, {shape})"
        if func is _aten.alias.default or func is _aten.detach.default:
            return f"view({x()}, {shape})"
        if func is _aten.expand.default:
            return f"expand({x()}, {shape})"
        if func is _aten.t.default:  # (out's rank: v[0] may be the tensor t_ transposed already)
            return f"transpose({x()}, 0, 1)" if out.dim() == 2 else f"view({x()}, {shape})"
        if func is _aten.transpose.int:
            return f"transpose({x()}, {v[1]}, {v[2]})"
        if func is _aten.permute.default:
            return f"permute({x()}, [{','.join(str(d) for d in v[1])}])"
        if func is _aten.unsqueeze.default:
            return f"unsqueeze({x()}, {v[1]})"
        if func is _aten.squeeze.dim:
            return f"squeeze({x()}, {v[1]})"
        if func is _aten.squeeze.default:
            return f"squeeze({x()})"
        if func is _aten.select.int:
            return f"select({x()}, {v[1]}, {v[2]})"
        if func is _aten.slice.Tensor:
            # start and end as the program gave them (the IR clamps and wraps them as ATen
            # does): "to the end" stays that at other sizes (sizes.py)
            dim, start, end, step = _slice_params(v, raw=True)
            return f"slice({x()}, {dim}, {start}, {end}, {step})"
        if func is _aten.as_strided.default and _row_major_strided(v, {}):
            # over a contiguous x, eager's strides count x's elements in row-major order: the IR's
            # as_strided means just that on any layout (stft's frames, views of a snapshot's values)
            offset = (v[3] if len(v) > 3 and v[3] is not None else v[0].storage_offset()) - v[0].storage_offset()
            return f"as_strided({x()}, {shape}, [{','.join(str(d) for d in v[2])}], {offset})"
        if func is _aten.unfold.default and v[0].dim() > 0:
            # unfold(x, dim, size, step): the windows along dim as a new last dim. Named by x's
            # elements in row-major order (the IR's as_strided, on any layout of x): dim steps by
            # `step` windows, the new dim by one element along dim.
            dim, step = v[1] % v[0].dim(), v[3]
            row = [1] * v[0].dim()
            for d in range(v[0].dim() - 2, -1, -1):
                row[d] = row[d + 1] * v[0].shape[d + 1]
            strides = row[:dim] + [row[dim] * step] + row[dim + 1:] + [row[dim]]
            return f"as_strided({x()}, {shape}, [{','.join(str(d) for d in strides)}], 0)"
        if func is _aten.unfold.default:
            raise Abort(f"{func._schema.name}: general strided views are not supported", "strided_view")
        return None

    def _guard(self, cond_name, shape, truth, live, snapshot, branch=False):
        """Emits `guard(cond, truth, id, live...)` (cond: an IR bool of `shape`, one
        element) and registers the exit's snapshot; `live` are trace tensors the snapshot refers
        to by position. Returns the exit id. (A size probe records a branch's exit as its
        recording did, taking the branch the recording took: cuts._branch_on_tensor.)"""
        if self.probe is not None and not branch:
            raise ProbeStop("a side exit")
        k = len(self.exits)
        ops = [cond_name, "true" if truth else "false", str(k)] + [self._operand(t) for t in live]
        self.lines.append(f"  {self._new()} = guard({', '.join(ops)}) : bool[{shape}]")
        self.ops.append("guard")
        self.exits.append(snapshot)
        return k

    def side_exit(self, cond, truth, live, snapshot):
        """A branch on the one-element trace tensor cond, taken as bool, recorded as `truth`."""
        self.value_exits += 1
        c = self._operand(cond)
        shape = ",".join(str(s) for s in cond.shape)
        if cond.dtype != torch.bool:
            b = self._new()
            self.lines.append(f"  {b} = ne({c}, 0) : bool[{shape}]")
            c = b
        return self._guard(c, shape, truth, live, snapshot, branch=True)

    def _shape_exit(self, func, vals, outs):
        """An op whose output size depends on the data (nonzero, masked_select): the trace keeps
        the size seen now, behind a side exit on the count of nonzero mask elements that resumes
        at the start of the bytecode that called it (which CPython-side re-runs the op)."""
        name = _sig(func)
        if func is _aten.nonzero.default:
            mask, count = vals[0], outs[0].shape[0]
        elif func is _aten.masked_select.default and isinstance(vals[1], torch.Tensor) and \
                vals[1].shape == vals[0].shape:
            mask, count = vals[1], outs[0].numel()
        elif func is _aten.index.Tensor and _one_mask_index(vals):
            # x[mask] (SSD's box filtering), x[:, mask]: the masked dims become one of the
            # mask's count of true elements, at the mask's position
            j = next(i for i, ix in enumerate(vals[1]) if ix is not None)
            mask, count = vals[1][j], outs[0].shape[j]
        else:
            raise Abort(f"{name}: the output size depends on the data (not traced for this op)", "data_dependent")
        if self.snapshot_here is None:
            raise Abort(f"{name}: the output size depends on the data", "data_dependent")
        try:
            snap, live = self.snapshot_here()
        except NoSnapshot as e:
            raise Abort(f"{name}: the output size depends on the data, and {e}", "data_dependent") from None
        m = self._operand(mask)
        shape = ",".join(str(s) for s in mask.shape)
        nz, total, c = self._new(), self._new(), self._new()
        self.lines.append(f"  {nz} = ne({m}, 0) : bool[{shape}]")
        self.lines.append(f"  {total} = sum({nz}, [], false) : i64[]")
        self.lines.append(f"  {c} = eq({total}, {count}) : bool[]")
        self._guard(c, "", True, live, snap)

    def value_exit(self, t, value, live, snapshot):
        """`eq(t, value)` behind a guard: the trace relies on t holding value (a number read by
        .item()). Returns the exit id."""
        self.value_exits += 1
        c = self._new()
        shape = ",".join(str(s) for s in t.shape)
        self.lines.append(f"  {c} = eq({self._operand(t)}, {self._operand(value)}) : bool[{shape}]")
        return self._guard(c, shape, True, live, snapshot)

    def output_name(self, t):
        if id(t) in self.poison:
            raise Abort(self.poison[id(t)], _poison_kind(self.poison[id(t)]))
        if id(t) in self.pairs:
            raise Abort(f"returns a {t.dtype} tensor: dtype {t.dtype} is not supported by the compiler", "dtype")
        return self.vals.get(id(t))

    def text(self, outputs):
        return "trace @%s {\n%s\n  return %s\n}\n" % (
            self.name, "\n".join(self.inputs + self.lines), ", ".join(outputs))


_UPSAMPLE_VEC = {getattr(_aten, n).vec for n in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d") if hasattr(getattr(_aten, n, None), "vec")}


def _scale_as_size(func, vals, outs):
    """An upsample's scale_factors (a float list the IR has no operand for) written as the output
    size they gave, when that is exact: ATen maps output to input coordinates by 1 / scale when
    given a scale and by in / out when given a size, and the two are the same double whenever
    in / out == 1 / scale (F.interpolate(x, scale_factor=2): every size). Otherwise unchanged."""
    if func not in _UPSAMPLE_VEC or len(vals) < 3 or vals[1] is not None or not vals[-1]:
        return vals
    x, scales = vals[0], vals[-1]
    out = outs[0] if outs else None
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or \
            len(scales) != x.dim() - 2 or not all(type(f) is float and f > 0 for f in scales):
        return vals
    size = []
    for n, f, got in zip(x.shape[2:], scales, out.shape[2:]):
        m = int(n * f)
        if m != got or m == 0 or n / m != 1.0 / f:
            return vals
        size.append(m)
    return [x, size] + list(vals[2:-1]) + [None]


def _complex_among(args, out):
    """An op's result or one of its tensor arguments is complex (the recorder holds those as
    float pairs, Recorder._record_complex)."""
    for v in (out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(v, torch.Tensor) and v.is_complex():
            return True
    return any(isinstance(a, torch.Tensor) and a.is_complex() for a in args)


def _pairs_type(z):
    """The IR type of complex64 tensor z's real view: f32[z's sizes, 2]."""
    return f"f32[{','.join(str(d) for d in z.shape)}{',' if z.dim() else ''}2]"


# Views of a complex tensor taken on its real view: the pair dim stays last.
_PAIRS_IN_PLACE = (_aten.transpose_.default, _aten.squeeze_.dim, _aten.unsqueeze_.default)


def _pairs_view(func, args, nd, out):
    """IR text (with {} for the real view's name) of view op func on a complex tensor of nd
    dims, applied to its real view; None for other ops."""
    def dim(d, n=nd):
        return d % n if n else 0
    if func in (_aten.transpose.int, _aten.transpose_.default):
        return f"transpose({{}}, {dim(args[1])}, {dim(args[2])})"
    if func is _aten.permute.default:
        return "permute({}, [" + ",".join(str(dim(d)) for d in args[1]) + f",{nd}])"
    if func in (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
                _aten._reshape_alias.default, _aten.alias.default):
        return "reshape({}, [" + ",".join(str(d) for d in out.shape) + (",2])" if out.dim() else "2])")
    if func in (_aten.squeeze.dim, _aten.squeeze_.dim):
        return f"squeeze({{}}, {dim(args[1])})"
    if func in (_aten.unsqueeze.default, _aten.unsqueeze_.default):
        return f"unsqueeze({{}}, {dim(args[1], nd + 1)})"
    return None


_MISSING = object()
_WRITERS = {}  # ATen op -> [(position, name)] of the arguments it writes (cached)


def outs_of(out):
    """An op's outputs as a list (one tensor, or a tuple of them)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _shape(t):
    """t's sizes as IR text: [2,3]."""
    return "[" + ",".join(str(d) for d in t.shape) + "]"


# Ops whose output size depends on the data, besides those a side exit checks in the trace
# (nonzero, masked_select, a boolean-mask index: _shape_exit): custom ops carry no tags.
_STEP_CUSTOM = ("torchvision::nms",)
_SHAPE_EXITS = (_aten.nonzero.default, _aten.masked_select.default, _aten.index.Tensor)


_NEEDS_STEP = {}  # ATen op -> bool (cached: asked for every op dispatched while recording)


def _needs_step(func):
    hit = _NEEDS_STEP.get(func)
    if hit is None:
        hit = _NEEDS_STEP[func] = func not in _SHAPE_EXITS and (
            torch.Tag.dynamic_output_shape in func.tags or func._schema.name in _STEP_CUSTOM)
    return hit


def _one_mask_index(vals):
    """aten::index.Tensor's indices are one boolean mask, after Nones only (x[mask], x[:, mask])."""
    ix = vals[1] if len(vals) > 1 else None
    if not isinstance(ix, (list, tuple)):
        return False
    tensors = [i for i in ix if i is not None]
    if len(tensors) != 1 or not isinstance(tensors[0], torch.Tensor) or tensors[0].dtype != torch.bool:
        return False
    j = next(k for k, i in enumerate(ix) if i is not None)
    return all(i is None for i in ix[:j]) and len(ix) == j + 1 and tensors[0].dim() >= 1 and \
        tuple(tensors[0].shape) == tuple(vals[0].shape[j:j + tensors[0].dim()])


def _row_major_strided(args, kwargs):
    """as_strided(x, size, stride[, offset]) over a contiguous x that reads only x's own elements
    with strides >= 0: the strides count x's elements in row-major order."""
    x = args[0] if args else kwargs.get("self")
    size = args[1] if len(args) > 1 else kwargs.get("size")
    stride = args[2] if len(args) > 2 else kwargs.get("stride")
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if not isinstance(x, torch.Tensor) or size is None or stride is None or not x.is_contiguous():
        return False
    rel = (x.storage_offset() if offset is None else offset) - x.storage_offset()
    if rel < 0 or len(size) != len(stride) or any(st < 0 for st in stride) or any(n < 0 for n in size):
        return False
    if any(n == 0 for n in size):
        return True
    return rel + sum((n - 1) * st for n, st in zip(size, stride)) < x.numel()


def _restrides_in_place(func, args, kwargs):
    """as_strided(x, size, stride[, offset]) that keeps x's sizes, storage offset and the strides
    of every dimension longer than 1 (adaptive_avg_pool2d re-strides its [N,C,1,1] result so):
    it names the same elements of x in the same order, whatever x's layout."""
    if func not in (_aten.as_strided.default, _aten.as_strided_.default) or not isinstance(args[0], torch.Tensor):
        return False
    x = args[0]
    size = args[1] if len(args) > 1 else kwargs.get("size")
    stride = args[2] if len(args) > 2 else kwargs.get("stride")
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if size is None or stride is None or list(size) != list(x.shape):
        return False
    if offset is not None and offset != x.storage_offset():
        return False
    return all(st == xs for n, st, xs in zip(size, stride, x.stride()) if n > 1)


# In-place view ops (metadata only: the tensor becomes a view of its own memory) and the view op
# each stands for; Recorder._inplace_view. (Looked up with getattr: calling a packet's
# __getattr__ makes a new OpOverload and puts it in place of torch's, so that registries keyed by
# the old one -- DTensor's sharding strategies, which FSDP2 needs -- no longer found it.)
_INPLACE_VIEWS = {getattr(getattr(_aten, a), b): getattr(getattr(_aten, c), d) for a, b, c, d in (
    ("squeeze_", "default", "squeeze", "default"), ("squeeze_", "dim", "squeeze", "dim"),
    ("unsqueeze_", "default", "unsqueeze", "default"), ("t_", "default", "t", "default"),
    ("transpose_", "default", "transpose", "int"), ("detach_", "default", "detach", "default"))}


def _written_args(func):
    """(position, name) of each argument func writes (its schema's alias annotations)."""
    return [(i, a.name) for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]
# Ops whose result depends on the memory layout of a tensor operand (stride and offset
# arguments), not only on its values: recording them would bake eager's layout of an
# intermediate into the trace (issue 14: swin_t's attention).
_LAYOUT_DEPENDENT = tuple(getattr(_aten, n).default for n in (
    "as_strided", "as_strided_", "as_strided_scatter", "as_strided_copy", "_reshape_alias_copy")
    if hasattr(_aten, n))
_SPLITS = (_aten.split.Tensor, _aten.split_with_sizes.default, _aten.unbind.int, _aten.unsafe_split.Tensor,
           _aten.unsafe_split_with_sizes.default)


def _split_views(func, v, outs, src):
    """Each output of a split/unbind of v[0] along its dim as a slice/select view: (IR text, the
    view op, its arguments)."""
    t = v[0]
    if func is _aten.unbind.int:
        dim = (v[1] if len(v) > 1 else 0) % max(t.dim(), 1)
        return [(f"select({src}, {dim}, {k})", _aten.select.int, [t, dim, k]) for k in range(len(outs))]
    dim = (v[2] if len(v) > 2 else 0) % max(t.dim(), 1)
    texts, start = [], 0
    for o in outs:
        end = start + o.shape[dim]
        texts.append((f"slice({src}, {dim}, {start}, {end}, 1)", _aten.slice.Tensor, [t, dim, start, end, 1]))
        start = end
    return texts


_NUMBER_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64}  # of a wrapped number


def _sig(func):
    """aten::name or aten::name.overload, as the IR's extern names it."""
    name = func._schema.name
    return name if func._overloadname == "default" else f"{name}.{func._overloadname}"


def _tensors_in(v):
    """The tensors in an argument value (nested lists, tuples and dicts)."""
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_in(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors_in(x)]
    return []


_RESHAPES = (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default, _aten._reshape_alias.default,
             _aten.squeeze.dim, _aten.squeeze.default, _aten.unsqueeze.default, _aten.alias.default,
             _aten.detach.default)


def _inverse_view(func, vals, parent, new):
    """IR text giving the parent's contents from new contents `new` of a view that keeps all of the
    parent's elements (reshapes and dimension orders), or None for other views. A view made by
    view/reshape keeps the row-major order of the elements, so reshaping back is exact."""
    shape = "[" + ",".join(str(d) for d in parent.shape) + "]"
    if func in _RESHAPES or (func is _aten.t.default and parent.dim() < 2):
        return f"reshape({new}, {shape})"
    if func is _aten.t.default:
        return f"transpose({new}, 0, 1)"
    if func is _aten.transpose.int:
        return f"transpose({new}, {vals[1]}, {vals[2]})"
    if func is _aten.permute.default:
        dims = [d % max(parent.dim(), 1) for d in vals[1]]
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return f"permute({new}, [{','.join(str(d) for d in inv)}])"
    return None


def _slice_params(v, raw=False):
    """aten::slice.Tensor's (dim, start, end, step) arguments, start and end normalized to the
    tensor's size (raw: as given, an absent end the largest int64)."""
    t = v[0]
    dim = v[1] if len(v) > 1 else 0
    dim = dim % max(t.dim(), 1)
    size = t.shape[dim]
    start = v[2] if len(v) > 2 and v[2] is not None else 0
    end = v[3] if len(v) > 3 and v[3] is not None else (_INT64_MAX if raw else size)
    step = v[4] if len(v) > 4 else 1
    if raw:
        return dim, start, end, step
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    return dim, start, end, step


_INT64_MAX = (1 << 63) - 1


_FUNCTIONAL_DTYPES = {}  # (fn, operand kinds) -> the dtype fn computes (None: untold)


def _functional_dtype(fn, vals, default):
    """The dtype functional op fn gives on these operands, or default where that cannot be told.
    What decides it is type promotion: each tensor's dtype and whether it is 0-dim, each Python
    number's type, and the other arguments' values. So fn runs once per such kind of operands on
    one-element CPU stand-ins of the tensors (ones: an integer division by them is defined), on
    meta tensors of the real shapes where those are refused (an op that checks sizes), and the
    answer is kept. (Meta kernels alone cost a second on a process's first use, then ~0.2-1 ms a
    call: a detection model's first call spent 0.3 s there.)"""
    kinds = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            kinds.append(("T", v.dtype, v.dim() == 0))
        elif type(v) in (int, float, complex, bool):
            kinds.append(("N", type(v), v if type(v) is bool else None))
        elif v is None or type(v) is str:
            kinds.append(("V", v))
        elif type(v) in (list, tuple) and all(type(e) in (int, float, bool) for e in v):
            kinds.append(("L", type(v), tuple(v)))
        else:  # (tensors in a list: what promotion reads of them; a dtype, a generator: itself)
            kinds.append(("O", type(v), tuple(("T", e.dtype, e.dim() == 0) if isinstance(e, torch.Tensor) else type(e)
                                              for e in v) if type(v) in (list, tuple) else v))
    try:
        key = (fn, tuple(kinds))
        hash(key)
    except TypeError:
        key = None
    if key in _FUNCTIONAL_DTYPES:
        got = _FUNCTIONAL_DTYPES[key]
        return default if got is None else got
    got = None
    meta = lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")  # noqa: E731
    one = lambda v: torch.ones(() if v.dim() == 0 else (1,) * v.dim(), dtype=v.dtype)  # noqa: E731
    # (a random op on stand-ins would draw from the program's generator: meta tensors only)
    seeded = torch.Tag.nondeterministic_seeded in getattr(fn, "tags", ())
    for stand_in in ((meta,) if seeded else (one, meta)):
        try:
            out = fn(*[stand_in(v) if isinstance(v, torch.Tensor) else v for v in vals])
        except Exception:  # noqa: BLE001 -- arguments it refuses (or no meta kernel): try the next
            continue
        got = out.dtype if isinstance(out, torch.Tensor) else None
        break
    if key is not None and len(_FUNCTIONAL_DTYPES) < 4096:
        _FUNCTIONAL_DTYPES[key] = got
    return default if got is None else got


def _dt(dtype):
    return DTYPE_NAMES[dtype]


def _static_index(func, vals):
    """aten::index.Tensor by integer index tensors: the output size follows the index shapes
    (only boolean masks make it depend on the data), so it is traced like any op."""
    if func is not _aten.index.Tensor or len(vals) < 2 or not isinstance(vals[1], (list, tuple)):
        return False
    return all(i is None or (isinstance(i, torch.Tensor) and not i.is_floating_point() and not i.is_complex()
                             and i.dtype not in (torch.bool, torch.uint8)) for i in vals[1])


def _implied(op, arg, v, all_cpu):
    """True if argument value v may be left to its schema default: it changes nothing in what
    the compiled code computes (compiled code makes dense, contiguous CPU tensors; a default
    device/layout is CPU/strided for a creation op and the input's for the others, and every
    traced tensor is a dense CPU tensor). Aborts for values the compiler cannot honour; False
    for ordinary arguments."""
    if isinstance(v, torch.device):
        if v.type == "cpu" and all_cpu:
            return True
        raise Abort(f"{op}: a device={v} argument (compiled code does not create or move tensors across devices)",
                    "device")
    if isinstance(v, torch.layout):
        if v == torch.strided:
            return True
        raise Abort(f"{op}: layout={v} (only dense strided tensors are supported)", "layout")
    if isinstance(v, torch.memory_format):
        if v in (torch.contiguous_format, torch.preserve_format):
            return True  # same values; compiled results are contiguous either way
        raise Abort(f"{op}: memory_format={v} is not supported (compiled results are contiguous)", "layout")
    if arg.name == "pin_memory" and not isinstance(v, torch.Tensor):
        if v is None or v is False:
            return True
        raise Abort(f"{op}: pin_memory=True is not supported", "layout")
    return False


def _kind(t):
    """(element kind, optional) of a schema type."""
    if t.kind() == "OptionalType":
        return t.getElementType().kind(), True
    return t.kind(), False


def _scalar_overload(func, pos, given):
    """The overload of func's op that takes Scalar where func takes the Tensor arguments at
    positions pos, and is the same otherwise (names, types, defaults of arguments not given,
    returns; no writes), or None."""
    s = func._schema
    packet = getattr(_aten, s.name.split("::")[1], None)
    if packet is None:
        return None
    for ov in packet.overloads():
        alt = getattr(packet, ov)
        a = alt._schema
        if alt is func or len(a.arguments) != len(s.arguments) or len(a.returns) != len(s.returns):
            continue
        if any(x.alias_info is not None for x in list(a.arguments) + list(a.returns)):
            continue
        if any(str(x.type) != str(y.type) for x, y in zip(s.returns, a.returns)):
            continue
        ok = True
        for i, (x, y) in enumerate(zip(s.arguments, a.arguments)):
            if x.name != y.name:
                ok = False
            elif i in pos:
                (kx, ox), (ky, oy) = _kind(x.type), _kind(y.type)
                ok = kx == "TensorType" and ky == "NumberType" and ox == oy
            else:
                ok = str(x.type) == str(y.type)
                if ok and i >= given:
                    ok = x.has_default_value() and y.has_default_value() and x.default_value == y.default_value
            if not ok:
                break
        if ok:
            return alt
    return None


def _call(func, vals):
    """func called with vals in schema order (kwarg-only ones by name)."""
    args, kwargs = [], {}
    for a, v in zip(func._schema.arguments, vals):
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return func(*args, **kwargs)


def _identical(a, b):
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.is_floating_point():
        return torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)
    return torch.equal(a, b)


def _same_result(func, vals, outs, what):
    """Runs func(vals) (while recording: not recorded) and requires exactly eager's outputs."""
    try:
        got = _call(func, vals)
    except Exception as e:  # noqa: BLE001 - any failure means: not the same op
        raise Abort(f"{what} fails: {type(e).__name__}: {e}", "op_arguments") from None
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(got) != len(outs) or not all(_identical(g, o) for g, o in zip(got, outs)):
        raise Abort(f"{what} does not reproduce eager's result (type promotion of a Python number)", "op_arguments")


def _functional(func):
    """The functional overload of an in-place op (add_.Tensor -> add.Tensor,
    floor_divide_.Tensor -> floor_divide): same argument names and types, or None."""
    s = func._schema
    packet = getattr(_aten, s.name.split("::")[1][:-1], None)
    if packet is None:
        return None
    if func._overloadname in packet.overloads():
        return getattr(packet, func._overloadname)
    if torch.Tag.nondeterministic_seeded in func.tags:
        # random ops only where the functional op draws the same numbers: ATen's bernoulli(x, p)
        # is empty_like(x).bernoulli_(p) (dropout's mask), so over a contiguous x (checked by
        # the caller) it fills the same values from the same generator
        return _SEEDED_FUNCTIONAL.get(func)
    for ov in packet.overloads():
        alt = getattr(packet, ov)
        a = alt._schema
        if len(a.arguments) == len(s.arguments) and len(a.returns) == len(s.returns) and \
                not any(x.alias_info is not None for x in list(a.arguments) + list(a.returns)) and \
                all(_same_arg(x, y) for x, y in zip(s.arguments, a.arguments)):
            return alt
    return None


def _with_defaults(func, vals):
    """vals (an op's positional arguments) with the schema's defaults for the positional
    arguments left out."""
    vals = list(vals)
    for a in func._schema.arguments[len(vals):]:
        if a.kwarg_only or not a.has_default_value():
            break
        vals.append(a.default_value)
    return tuple(vals)


_SEEDED_FUNCTIONAL = {_aten.bernoulli_.float: _aten.bernoulli.p, _aten.bernoulli_.Tensor: _aten.bernoulli.Tensor}


def _same_arg(x, y):
    """Schema arguments x and y take the same values (alias annotations aside)."""
    if x.name != y.name or str(x.type) != str(y.type) or x.has_default_value() != y.has_default_value():
        return False
    return not x.has_default_value() or x.default_value == y.default_value


def _config():
    from . import config
    return config


def _hidden_write(func, vals):
    """Why an op writes tensors its schema does not mark as written (batch norm's running
    statistics, unmarked in torch 2.13's schema as in 1.13's), or None."""
    name = func._schema.name
    stats = None
    if name == "aten::native_batch_norm" and len(vals) > 5 and vals[5]:
        stats = vals[3:5]
    elif name == "aten::batch_norm_update_stats":
        stats = vals[1:3]
    if stats is not None and any(t is not None for t in stats):
        return (f"{name} in training mode updates running_mean/running_var in place, which its schema "
                "does not declare (an extern must not write its inputs): batch norm with running "
                "statistics compiles in eval mode only")
    return None


# -- decompositions ------------------------------------------------------------------------
# Fused ATen kernels that eager calls as one opaque op (nn.TransformerEncoderLayer's fast path in
# eval), recorded as the ops they are made of, so that matmuls, softmax, layer norm and the
# pointwise parts fuse and run on the JIT's kernels. Same math as ATen's kernels
# (aten/src/ATen/native/transformers); results differ by rounding only.


def _mha_covered(q, k, v, embed_dim, num_heads, *rest, **kwargs):
    """Self-attention without a mask on a dense [batch, tokens, dim] input (with or without the
    attention weights returned, averaged over heads or not)."""
    mask = rest[4] if len(rest) > 4 else kwargs.get("mask")
    return q is k and k is v and mask is None and q.dim() == 3 and not q.is_nested and \
        embed_dim % num_heads == 0


def _linear(x, w, b):
    """F.linear on [..., in] as the matrix product the JIT runs itself (aten::addmm on the rows):
    inside a dispatch F.linear is recorded whole, an extern that calls the BLAS."""
    rows = x.reshape(-1, x.shape[-1])
    y = torch.addmm(b, rows, w.t()) if b is not None else torch.mm(rows, w.t())
    return y.view(*x.shape[:-1], w.shape[0])


def _grouped_heads(q, k, v=None, *more):
    """k and v have one number of heads, of which q's is a multiple (the same, or grouped)."""
    return v is not None and not more and k.shape[1] == v.shape[1] and k.shape[1] > 0 and \
        q.shape[1] % k.shape[1] == 0


def _own_attention(*tensors):
    """Whether dynamo::attention (runtime/attention.cpp: fused, online softmax, no score matrix in
    memory) can stand for attention over these [batch, heads, rows, head size] tensors: float32 on
    the CPU, one head size of at most 512, one batch, query heads a multiple of the key/value
    heads (grouped: LLaMA's, Qwen2's), and no gradient to record (the op has no backward)."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 4 for t in tensors) and \
        len({t.shape[-1] for t in tensors}) == 1 and tensors[0].shape[-1] <= 512 and \
        len({t.shape[0] for t in tensors}) == 1 and _grouped_heads(*tensors) and \
        not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _native_mha(q, k, v, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask=None,
                need_weights=True, average_attn_weights=True, mask_type=None):
    b, t, _ = q.shape
    dh = embed_dim // num_heads
    qkv = _linear(q, qkv_weight, qkv_bias).view(b, t, 3, num_heads, dh)
    heads = [qkv[:, :, i].transpose(1, 2) for i in range(3)]  # [b, heads, t, dh] views
    if not need_weights and _own_attention(*heads):
        attn = torch.ops.dynamo.attention(*heads, 1.0 / math.sqrt(dh), False)[0]  # laid out [b, t, heads, dh]
        out = _linear(attn.transpose(1, 2).reshape(b, t, embed_dim), proj_weight, proj_bias)
        return out, torch.empty(0, dtype=q.dtype)
    qh, kh, vh = (h.reshape(b * num_heads, t, dh) for h in heads)
    scores = torch.bmm(qh / math.sqrt(dh), kh.transpose(1, 2))
    probs = torch.softmax(scores, dim=-1)
    attn = torch.bmm(probs, vh).view(b, num_heads, t, dh)
    out = _linear(attn.transpose(1, 2).reshape(b, t, embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, torch.empty(0, dtype=q.dtype)
    weights = probs.view(b, num_heads, t, t)
    return out, (weights.mean(1) if average_attn_weights else weights)


def _layer_covered(src, embed_dim, num_heads, *rest, **kwargs):
    """A dense [batch, tokens, dim] input without a mask."""
    mask = rest[15] if len(rest) > 15 else kwargs.get("mask")
    return mask is None and src.dim() == 3 and not src.is_nested and embed_dim % num_heads == 0


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                   eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                   ffn_bias_2, mask=None, mask_type=None):
    ln = torch.nn.functional.layer_norm
    x = ln(src, (embed_dim,), norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = _native_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, None, False)[0]
    x = x + src
    if not norm_first:
        x = ln(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)
    res = x
    if norm_first:
        x = ln(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    h = _linear(x, ffn_weight_1, ffn_bias_1)
    h = torch.nn.functional.gelu(h) if use_gelu else torch.relu(h)
    x = _linear(h, ffn_weight_2, ffn_bias_2) + res
    if not norm_first:
        x = ln(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    return x


def _flash_covered(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """scaled_dot_product_attention's CPU flash kernel without dropout or a mask (causal or not)."""
    return dropout_p == 0.0 and attn_mask is None and _own_attention(q, k, v)


def _flash(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """(output, logsumexp) as ATen's CPU flash attention, from dynamo's own fused kernel."""
    return torch.ops.dynamo.attention(q, k, v, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
                                      bool(is_causal))


def _rnn_layer_covered(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size, num_layers,
                       has_biases, bidirectional, batch_first, train):
    """One layer and direction in inference (no workspace to keep), no packed sequence."""
    return not train and not batch_sizes and input.dim() == 3 and \
        not (torch.is_grad_enabled() and any(t.requires_grad for t in (input, w_ih, w_hh, hx, cx)))


def _rnn_layer(*args):
    """aten::mkldnn_rnn_layer (how torch 2.x runs nn.LSTM on the CPU: one call per layer and
    direction, oneDNN's fused LSTM) as dynamo::rnn_layer (runtime/rnn.cpp): the same call without
    its fourth result, the workspace, which inference leaves undefined and a trace cannot name.
    (output, h, c, no workspace)."""
    return (*torch.ops.dynamo.rnn_layer(*args), None)


def _version(t):
    """t's version counter (moves at every in-place write into its memory), or None where torch
    keeps none (inference tensors)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _attention_as_bmm(q, k, v, scale, shape):
    """softmax(q @ k^T * scale) @ v by dynamo::attention, in the [B*H, L, D] shape of the bmm it replaces."""
    return torch.ops.dynamo.attention(q, k, v, scale, False)[0].reshape(shape)


_BATCH_RESHAPES = (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default)
# Ops whose results Recorder._note_made remembers: the parts of attention written out.
_PROVENANCE = frozenset((_aten.bmm.default, _aten._softmax.default, _aten.div.Tensor, _aten.mul.Tensor,
                         _aten.clone.default, _aten.expand.default, _aten.transpose.int, _aten.permute.default)
                        + _BATCH_RESHAPES)


def _index_long(func, args, kwargs):
    """aten::index / index_put run with their int32 indices (torchvision's roi_align `y.int()`)
    widened to int64 first: ATen widens them itself, but after broadcasting them to the result's
    shape -- four gathers of [K, 256, 7, 7, 2, 2] copied 12 tensors of 27 MB at ~1 GB/s, a third
    of a Faster R-CNN's first call. Same positions, same values, and (index tensors laid out
    row-major, the common case, else ATen's own call) the same layout of the result; the trace
    keeps the op as the program called it. A large gather over every dim: _flat_gather."""
    if len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return func(*args, **kwargs)
    tensors = [i for i in args[1] if isinstance(i, torch.Tensor)]
    narrow = any(i.dtype == torch.int32 for i in tensors)
    if (not narrow and func is not _aten.index.Tensor) or \
            not all(i.dtype in (torch.int32, torch.int64) for i in tensors):  # (a mask indexes otherwise)
        return func(*args, **kwargs)
    if not narrow and (kwargs or not isinstance(args[0], torch.Tensor) or len(args[1]) != args[0].dim() or
                       not args[0].is_contiguous()):  # (nothing to widen, and no flat gather: _flat_gather)
        return func(*args, **kwargs)
    try:
        idx = [i.to(torch.int64, memory_format=torch.contiguous_format)
               if isinstance(i, torch.Tensor) and i.dtype == torch.int32 else i for i in args[1]]
        shape = _broadcast(i.shape for i in idx if isinstance(i, torch.Tensor))
        if shape is None or not all(_row_major(i, shape) for i in idx if isinstance(i, torch.Tensor)):
            return func(*args, **kwargs)
        if func is _aten.index.Tensor and not kwargs:
            out = _flat_gather(args[0], idx, shape)
            if out is not None:
                return out
    except RuntimeError:  # (not expected: then ATen's own call decides, its errors the program's)
        return func(*args, **kwargs)
    return func(args[0], idx, *args[2:], **kwargs) if narrow else func(*args, **kwargs)


def _row_major(i, shape):
    """Whether index tensor i, broadcast to shape, steps its own dims in row-major order: ATen lays
    an index's result out in the order its index tensors' strides give (row-major when each is)."""
    if len(shape) < i.dim():
        return False
    e = i.expand(shape)
    st = [e.stride(d) for d in range(len(shape)) if shape[d] > 1 and e.stride(d) != 0]
    return all(a > b for a, b in zip(st, st[1:]))


def _flat_gather(src, idx, shape):
    """src[i0, i1, ..., in] (one int64 index tensor per dim of a contiguous src, each row-major,
    broadcast to shape, a large result) as one flat take at linear offsets summed from the small
    index tensors up, or None where that is not the same result: ATen's TensorIterator walks the
    result's dims, and with broadcast indices its inner dim is the last one (2 in roi_align's
    gathers), ~110 ms for 6.7M elements against ~45 ms flat. Indices out of [0, size) (negative
    ones wrap, larger ones raise) take ATen's own path."""
    if not (isinstance(src, torch.Tensor) and src.is_contiguous() and len(idx) == src.dim() and src.numel()
            and all(isinstance(i, torch.Tensor) and i.dtype == torch.int64 and i.device == src.device
                    for i in idx)) or math.prod(shape) < _FLAT_GATHER_MIN:
        return None
    for i, n in zip(idx, src.shape):
        if i.numel():
            lo, hi = torch.aminmax(i)
            if int(lo) < 0 or int(hi) >= n:
                return None
    parts = sorted((i * st for i, st in zip(idx, src.stride())), key=lambda t: t.numel())
    offsets = parts[0]
    for t in parts[1:]:
        offsets = offsets + t
    return src.reshape(-1).take(offsets.expand(shape))


def _broadcast(shapes):
    """The shape the shapes broadcast to, or None where they do not."""
    out = []
    for sh in shapes:
        sh = list(sh)
        if len(sh) > len(out):
            out = [1] * (len(sh) - len(out)) + out
        for k, n in enumerate(sh, len(out) - len(sh)):
            if out[k] == 1:
                out[k] = n
            elif n != 1 and n != out[k]:
                return None
    return tuple(out)


_FLAT_GATHER_MIN = 1 << 16
# op -> how the recorder runs it for its values (the same values as func(*args, **kwargs))
_RUN_AS = {_aten.index.Tensor: _index_long, _aten.index_put_.default: _index_long,
           _aten.index_put.default: _index_long}


# op -> (whether the decomposition covers the call's arguments, the decomposition); calls it
# does not cover are recorded as the fused op (an extern).
_DECOMPOSITIONS = {}
for _name, _covers, _fn in (("_transformer_encoder_layer_fwd", _layer_covered, _encoder_layer),
                            ("_native_multi_head_attention", _mha_covered, _native_mha),
                            ("_scaled_dot_product_flash_attention_for_cpu", _flash_covered, _flash),
                            ("mkldnn_rnn_layer", _rnn_layer_covered, _rnn_layer)):
    _op = getattr(_aten, _name, None)
    if _op is not None:
        _DECOMPOSITIONS[_op.default] = (_covers, _fn)
