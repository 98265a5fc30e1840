"""Training: a recorded call whose tensors require grad, run with its forward and backward
compiled (issue 19, first part).

The recorder keeps, beside the trace, a tape of the ATen ops as they were dispatched (their
tensor arguments as references to trace inputs or to earlier results). A straight-line trace
(no side exit, stitch or cut, nothing written into its inputs, no Python number passed as a
scalar input) replays that tape as a pure function of its input tensors; functorch's
AOTAutograd (`aot_function`, torch 1.13) traces the replay's joint forward and backward at the
ATen level, splits them (`min_cut_rematerialization_partition` when networkx is installed,
else `default_partition`) into a forward graph that also returns what the backward needs and a
backward graph, and hands each FX graph to dynamo itself (`optimize`): both are recorded and
compiled natively like any function, under no_grad, the backward on the first `.backward()`
that reaches it. The call then returns AOTAutograd's outputs, whose grad_fn runs the native
backward.

A TrainedTrace takes a call only when its tensors have the recorded dtypes, shapes, strides and
requires_grad flags and grad mode is on (the trace's own guards said the rest); anything else is
a miss, and the call is recorded again or runs eagerly.
"""
import torch

from .log import log
from .recorder import TapeRef
from .registry import bump
from .tracetree import Compiled


def unsupported(rec, interp):
    """Why the recorded call cannot run as a compiled forward and backward, or None."""
    if rec.tape is None:
        return rec.tape_why or "no tape"
    if rec.exits:
        return "data-dependent branches (side exits) are not compiled with grad yet"
    if rec.cut is not None:
        return "a call cut into parts (a stitch or config.max_trace_ops) is not compiled with grad yet"
    if rec.device is not None:
        return "CUDA tensors are not compiled with grad yet"
    if rec.mutated:
        return "writes into tensors (in-place ops) are not compiled with grad yet"
    if rec.scalar_inputs:
        return "Python numbers passed as trace inputs are not compiled with grad yet"
    if not rec.tape:
        return "no tensor operations"
    return None


def _replay(tape, out_refs):
    """The function of the trace's input tensors that runs the tape's ops and returns the
    tensors out_refs name."""
    def val(v, inputs, env):
        if isinstance(v, TapeRef):
            r = v.r
            return inputs[r[1]] if r[0] == "in" else env[(r[1], r[2])]
        if type(v) in (list, tuple):
            return type(v)(val(x, inputs, env) for x in v)
        return v

    def run(*inputs):
        env = {}
        for i, (func, a, k) in enumerate(tape):
            out = func(*val(a, inputs, env), **{n: val(x, inputs, env) for n, x in k.items()})
            for j, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
                env[(i, j)] = o
        return tuple(val(TapeRef(r), inputs, env) for r in out_refs)
    return run


class _GraphCompiler:
    """AOTAutograd's fw_compiler / bw_compiler: the FX graph through dynamo.optimize, as a boxed
    call (a list of arguments); counts the backward's traces and native runs."""

    def __init__(self, name, backward):
        self.name, self.backward, self.graphs = name, backward, []

    def __call__(self, gm, example_inputs):
        from .frontend import optimize
        opt = optimize(gm)
        opt.forward.name = f"{self.name}.{'backward' if self.backward else 'forward'}_graph"
        self.graphs.append(opt)
        backward, seen = self.backward, [0, 0]  # traces, native runs counted so far

        def run(args):
            if backward and torch.is_grad_enabled():
                # create_graph=True: AOTAutograd's backward is not itself differentiable (its
                # saved tensors are detached), so a second derivative would come out wrong
                raise RuntimeError(f"dynamo: {self.name} ran its forward compiled for training, whose backward "
                                   "cannot be differentiated again (create_graph=True, a second derivative); "
                                   "set dynamo.config.training = False for such a program")
            out = opt(*args)
            args.clear()  # (boxed: the caller's list, freed as AOTAutograd expects)
            if backward:
                traces = opt.forward.compiled
                if len(traces) > seen[0]:
                    bump("backward_traces_compiled", len(traces) - seen[0])
                    seen[0] = len(traces)
                runs = sum(c.runs for c in traces)
                if runs > seen[1]:
                    bump("backward_native_runs", runs - seen[1])
                    seen[1] = runs
            return out
        run._boxed_call = True
        return run


def _partition():
    from functorch.compile import default_partition, min_cut_rematerialization_partition
    try:
        import networkx  # noqa: F401 -- the min-cut partitioner needs it
        return min_cut_rematerialization_partition
    except ImportError:
        return default_partition


class TrainedTrace(Compiled):
    """A root trace run as AOTAutograd's compiled forward and backward (see the module text)."""

    def __init__(self, name, rec, gs, text, out_spec, names, inlined, inputs):
        from functorch.compile import aot_function
        super().__init__(gs, text, None, out_spec, gs.tensor_inputs, rec.ops, inlined)
        refs = [rec.tape_ref(n) for n in names]
        if None in refs:
            raise LookupError("a result is not on the tape")
        self.meta = [_meta(t) for t in inputs]
        self.forward_graphs = _GraphCompiler(name, False)
        self.backward_graphs = _GraphCompiler(name, True)
        self.aot = aot_function(_replay(rec.tape, refs), fw_compiler=self.forward_graphs,
                                bw_compiler=self.backward_graphs, partition_fn=_partition())
        self.training = True
        log("traces", f"{name}: forward and backward through AOTAutograd: {len(rec.tape)} ATen op(s) on the tape")

    def summary(self):
        """One line for report() and explain()."""
        def graphs(g):
            return ", ".join(f"{o.forward.name} ({sum(c.runs for c in o.forward.compiled)} native run(s))"
                             for o in g.graphs) or "not compiled yet"
        return (f"forward and backward through AOTAutograd: {len(self.ops)} ATen op(s), {self.runs} run(s); "
                f"forward graph: {graphs(self.forward_graphs)}; backward graph: {graphs(self.backward_graphs)}")

    def run(self, inputs):
        if not torch.is_grad_enabled() or len(inputs) != len(self.meta) or \
                any(_meta(t) != m for t, m in zip(inputs, self.meta)):
            return None
        outs = self.aot(*inputs)
        self.runs += 1
        return list(outs)


def _meta(t):
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad) if isinstance(t, torch.Tensor) else None
