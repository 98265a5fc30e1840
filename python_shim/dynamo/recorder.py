"""Records the ATen operations a call performs into trace IR text (docs/IR.md).

The recorder is a TorchDispatchMode: while the recording interpreter runs the user's code
on real tensors, every ATen op eager PyTorch executes passes through __torch_dispatch__,
runs for real, and is written down with its operands resolved to trace values:

  * tensors the interpreter read from a source are trace inputs (registered beforehand);
  * tensors produced by recorded ops are trace values;
  * zero-dim tensors of unknown origin are Python numbers wrapped by ATen's argument parser
    (`x + 1`): they become literals;
  * anything else (a tensor made by code we did not record) aborts the trace.

View ops become IR views, in-place ops become the functional op plus `copy_` into the input,
everything else an `extern aten::op.overload(...)` that the compiler either lowers into its
own fused code (jit/decompose.cpp) or calls in LibTorch.
"""
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten

DTYPE_NAMES = {
    torch.bool: "bool", torch.int32: "i32", torch.int64: "i64", torch.float32: "f32",
    torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
}


class Abort(Exception):
    """The trace cannot be compiled; the call itself still completes correctly."""


def type_text(t):
    if t.dtype not in DTYPE_NAMES:
        raise Abort(f"dtype {t.dtype} is not supported by the compiler")
    return f"{DTYPE_NAMES[t.dtype]}[{','.join(str(s) for s in t.shape)}]"


def _lit_float(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    r = repr(float(v))
    return r


class Recorder(TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.inputs = []        # IR input declarations, in slot order
        self.lines = []         # IR instructions
        self.vals = {}          # id(tensor) -> IR value name
        self.keep = []          # tensors kept alive so that ids stay unique while recording
        self.viewed = set()     # value names that are views or have views taken of them
        self.input_names = set()
        self.mutated = False    # an in-place op was recorded
        self.ops = []           # ATen op names, for explain()
        self.paused = 0
        self.abort_reason = None
        self._n = 0

    # -- values --------------------------------------------------------------------------
    def _new(self):
        self._n += 1
        return f"%v{self._n}"

    def add_input(self, t):
        """Registers tensor t (read from a guarded source) as the next trace input."""
        if id(t) in self.vals:
            return False
        if t.device.type != "cpu":
            raise Abort(f"tensor on {t.device}: this build compiles CPU tensors only")
        if t.layout != torch.strided or t.is_quantized or t.is_sparse:
            raise Abort("only dense strided tensors are supported")
        name = f"%i{len(self.inputs)}"
        strides = ",".join(str(s) for s in t.stride())
        rg = " requires_grad" if t.requires_grad else ""
        self.inputs.append(f"  {name} = input {type_text(t)}{{{strides}}}{rg}")
        self.vals[id(t)] = name
        self.input_names.add(name)
        self.keep.append(t)
        return True

    def known(self, t):
        return id(t) in self.vals

    def abort(self, reason):
        if self.abort_reason is None:
            self.abort_reason = reason

    # -- operands ------------------------------------------------------------------------
    def _operand(self, v):
        if isinstance(v, torch.Tensor):
            name = self.vals.get(id(v))
            if name is not None:
                return name
            if v.dim() == 0 and v.device.type == "cpu":
                # A Python number ATen wrapped into a tensor (`x + 2.5`).
                x = v.item()
                if isinstance(x, bool):
                    return "true" if x else "false"
                return _lit_float(x) if isinstance(x, float) else str(x)
            raise Abort("a tensor of unknown origin reached an ATen op (made by code that was not recorded)")
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return _lit_float(v)
        if isinstance(v, str):
            return '"' + v + '"'
        if isinstance(v, torch.dtype):
            if v not in DTYPE_NAMES:
                raise Abort(f"dtype {v} is not supported")
            return DTYPE_NAMES[v]
        if isinstance(v, (list, tuple)):
            if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                return "[" + ",".join(str(x) for x in v) + "]"
            raise Abort("ATen op with a list argument of tensors or floats (e.g. torch.cat) is not supported yet")
        if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            raise Abort(f"ATen op with a {type(v).__name__} argument is not supported yet")
        raise Abort(f"ATen op with a {type(v).__name__} argument is not supported")

    def _args(self, func, args, kwargs):
        """Operands in schema order; missing trailing arguments are left to schema defaults."""
        schema = func._schema
        vals = []
        for i, a in enumerate(schema.arguments):
            if i < len(args):
                vals.append(args[i])
            elif a.name in kwargs:
                vals.append(kwargs[a.name])
            else:
                vals.append(_MISSING)
        while vals and vals[-1] is _MISSING:
            vals.pop()
        for i, v in enumerate(vals):
            if v is _MISSING:
                d = schema.arguments[i]
                if not d.has_default_value():
                    raise Abort(f"{schema.name}: argument {d.name} missing")
                vals[i] = d.default_value
        return vals

    # -- dispatch ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused or self.abort_reason is not None:
            return out
        try:
            self._record(func, args, kwargs, out)
        except Abort as e:
            self.abort(str(e))
        return out

    def _bind(self, t, name):
        self.vals[id(t)] = name
        self.keep.append(t)

    def _record(self, func, args, kwargs, out):
        schema = func._schema
        name = schema.name
        overload = func._overloadname
        self.ops.append(name if overload == "default" else f"{name}.{overload}")
        if func is _aten._local_scalar_dense.default:
            raise Abort("data-dependent value: .item() / bool(tensor) / int(tensor) reads a tensor's contents "
                        "(mid-trace guards with side exits are not implemented yet)")
        if func is _aten.lift_fresh.default or name in ("aten::lift_fresh_copy",):
            raise Abort("tensor created from Python data inside the function (torch.tensor)")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise Abort(f"{name} returns a non-tensor value")
        vals = self._args(func, args, kwargs)

        mutates = bool(schema.arguments) and schema.arguments[0].alias_info is not None and \
            schema.arguments[0].alias_info.is_write
        if any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            raise Abort(f"{name}: out= variants are not supported")
        if mutates:
            self._record_inplace(func, vals, args[0])
            return

        view = self._view_text(func, vals, outs[0])
        if view is not None:
            src = self._operand(vals[0])
            res = self._new()
            self.lines.append(f"  {res} = {view} : {type_text(outs[0])}")
            self.viewed.update((src, res))
            self._bind(outs[0], res)
            return
        ops = ", ".join(self._operand(v) for v in vals)
        names = [self._new() for _ in outs]
        types = ", ".join(type_text(o) for o in outs)
        sig = name if overload == "default" else f"{name}.{overload}"
        self.lines.append(f"  {', '.join(names)} = extern {sig}({ops}) : {types}")
        for o, n in zip(outs, names):
            self._bind(o, n)

    def _record_inplace(self, func, vals, dst):
        """x.add_(y) -> %t = add(x, y); x = copy_(x, %t) on inputs; a rebinding on temporaries."""
        name = func._schema.name
        dname = self.vals.get(id(dst))
        if dname is None:
            raise Abort(f"{name} writes into a tensor of unknown origin")
        if dname in self.viewed or dst._base is not None:
            raise Abort(f"{name} writes into a tensor that has views (aliasing through views is not traced yet)")
        if name == "aten::copy_":
            src = self._operand(vals[1])
            res = src
        else:
            base = name[:-1]
            overload = func._overloadname
            fn = getattr(_aten, base.split("::")[1], None)
            if fn is None or (overload not in fn.overloads()):
                raise Abort(f"{name}: no functional form")
            ops = ", ".join(self._operand(v) for v in vals)
            res = self._new()
            sig = base if overload == "default" else f"{base}.{overload}"
            self.lines.append(f"  {res} = extern {sig}({ops}) : {type_text(dst)}")
        if dname in self.input_names:
            new = self._new()
            self.lines.append(f"  {new} = copy_({dname}, {res}) : {type_text(dst)}")
            self.mutated = True
            self.vals[id(dst)] = new
            self.input_names.add(new)  # later in-place ops still write the input's memory
        elif name == "aten::copy_":
            raise Abort("copy_ into a temporary tensor is not traced yet")
        else:
            self.vals[id(dst)] = res

    def _view_text(self, func, v, out):
        """IR text of a view op (without result type), or None for non-views."""
        x = lambda: self._operand(v[0])  # noqa: E731
        shape = "[" + ",".join(str(s) for s in out.shape) + "]"
        if func in (_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default):
            return f"reshape({x()}, {shape})"
        if func is _aten.alias.default or func is _aten.detach.default:
            return f"view({x()}, {shape})"
        if func is _aten.expand.default:
            return f"expand({x()}, {shape})"
        if func is _aten.t.default:
            return f"transpose({x()}, 0, 1)" if v[0].dim() == 2 else f"view({x()}, {shape})"
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
            t = v[0]
            dim = v[1] if len(v) > 1 else 0
            dim = dim % max(t.dim(), 1)
            size = t.shape[dim]
            start = v[2] if len(v) > 2 and v[2] is not None else 0
            end = v[3] if len(v) > 3 and v[3] is not None else size
            step = v[4] if len(v) > 4 else 1
            start = max(0, min(size, start + size if start < 0 else start))
            end = max(start, min(size, end + size if end < 0 else end))
            return f"slice({x()}, {dim}, {start}, {end}, {step})"
        if func is _aten.as_strided.default or func is _aten.unfold.default:
            raise Abort(f"{func._schema.name}: general strided views are not supported")
        return None

    def output_name(self, t):
        return self.vals.get(id(t))

    def text(self, outputs):
        return "trace @%s {\n%s\n  return %s\n}\n" % (
            self.name, "\n".join(self.inputs + self.lines), ", ".join(outputs))


_MISSING = object()
