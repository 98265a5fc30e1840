"""Training: a recorded call whose tensors require grad, run with its forward and backward
compiled (issue 19).

The recorder keeps, beside the trace, a tape of the ATen ops as they were dispatched (their
tensor arguments as references to trace inputs or to earlier results). A trace replays that
tape as a pure function of its input tensors when it has no side exit and writes into no input
but buffers; a Python number that is a scalar input of the trace is a 0-dim tensor input of the
replay (taped only in Tensor arguments, and a float only beside floating tensors, where ATen
promotes a 0-dim tensor as it does the number; elsewhere the call runs eagerly). With grad on, a branch on a tensor's
value or a number read from one ends the trace (a cut, as at a stitch) instead of a side exit:
the call goes on in a trace recorded from there, one per value, and autograd links the parts.
AOTAutograd (`torch._functorch.aot_autograd.aot_function`) traces the replay's joint forward and
backward at the ATen level, splits them (`min_cut_rematerialization_partition` when networkx
is installed, else `default_partition`) into a forward graph that also returns what the
backward needs and a backward graph, and hands each FX graph to dynamo itself (`optimize`):
both are recorded and compiled natively like any function, under no_grad, the backward on the
first `.backward()` that reaches it. The call then returns AOTAutograd's outputs, whose
grad_fn runs the native backward.

Once both graphs are compiled, the later calls of a trace whose graphs need none of AOTAutograd's
runtime work (no output that aliases an input or another output, no input written by the graph,
no saved numbers, no autocast) run them through a plain autograd.Function of its own
(`_lean_function`): the same two graphs, the same saved tensors and tangents, without
AOTAutograd's Python wrappers around them (~0.2 ms of a 5 ms MLP training step). Anything else
stays on AOTAutograd's runtime.

A TrainedTrace takes a call only when its tensors have the recorded dtypes, shapes, strides and
requires_grad flags and grad mode is on (the trace's own guards said the rest); anything else is
a miss, and the call is recorded again or runs eagerly.
"""
import math
import weakref

import torch

from ._capi import DynamoError
from .frames import dense_order
from .log import log
from .recorder import TapeRef
from .registry import bump
from .tracetree import Compiled


def unsupported(rec, side=False):
    """Why the recorded trace (side: one that goes on from another's exit or cut) cannot run as a
    compiled forward and backward, or None."""
    if rec.tape is None:
        return rec.tape_why or "no tape"
    if rec.exits:  # (branches and value reads end the trace instead, cuts._cut_for_grad)
        return "an op whose output size depends on the data (a side exit) is not compiled with grad yet"
    if rec.device is not None:
        return "CUDA tensors are not compiled with grad yet"
    if rec.effect is not None:
        why = _writes_unsupported(rec)
        if why is not None:
            return why
    if rec.scalar_inputs and rec.tape_scalar_why:
        return rec.tape_scalar_why
    if not rec.tape:
        return "no tensor operations"
    if len(rec.tape) < MIN_OPS and rec.cut is None and not side:
        return SMALL
    return None


# A call of fewer ATen ops (a lone convolution or linear layer: a model's parts compiled apart)
# gains nothing from compiling with grad, and AOTAutograd's wrapper costs more than it saves:
# resnet18 in training mode, its 21 convolutions compiled apart, ran 2.4x slower than eager.
# A part of a call (a trace cut at a stitch or a value read, or the trace after one) compiles
# however short: without it the parts around it could not run compiled either.
MIN_OPS = 4
SMALL = f"fewer than {MIN_OPS} ATen ops: nothing to gain from compiling it with grad"


_BATCH_NORM = torch.ops.aten.native_batch_norm.default


def _input_write(func, a):
    """The input slot an op on the tape writes in place (an in-place op on an input, or batch
    norm's running statistics: a tuple of slots), or None."""
    if func is _BATCH_NORM and len(a) > 5 and a[5]:
        slots = tuple(x.r[1] for x in a[3:5] if isinstance(x, TapeRef) and x.r[0] == "in")
        return slots or None
    args = func._schema.arguments
    if args and args[0].alias_info is not None and args[0].alias_info.is_write and a and \
            isinstance(a[0], TapeRef) and a[0].r[0] == "in":
        return (a[0].r[1],)
    return None


def _written_slots(tape):
    """The input slots the tape writes in place, in order."""
    out = []
    for func, a, _ in tape:
        for slot in _input_write(func, a) or ():
            if slot not in out:
                out.append(slot)
    return sorted(out)


def _writes_unsupported(rec):
    """Why the call's writes into tensors from outside it cannot be made explicit, or None.
    They can when each writes an input tensor itself that needs no gradient (a module's buffers:
    batch norm's running statistics, num_batches_tracked) with an op that has a functional
    form: the replay computes the new values as further outputs, written back after the
    forward (TrainedTrace.run)."""
    if rec.effect_indirect:
        return "writes into tensors from outside the call through views are not compiled with grad yet"
    from .recorder import _functional
    slots = dict(enumerate(rec.input_tensors))
    for func, a, _ in rec.tape:
        written = _input_write(func, a)
        if written is None:
            continue
        if func is not _BATCH_NORM and _functional(func) is None:
            return f"{func._schema.name} writes into an input and has no functional form"
        for slot in written:
            t = slots.get(slot)
            if t is None or t.requires_grad:
                return "writes into inputs that require grad (in-place ops on them) are not compiled with grad"
    return None


_SEEDED_INPLACE = (torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli_.Tensor)


def _replay(tape, out_refs):
    """The function of the trace's input tensors that runs the tape's ops and returns the
    tensors out_refs name, then the new values of the inputs the tape writes in place
    (_written_slots): those writes are made functional, so that AOTAutograd is handed a pure
    function and the writes are ours to apply (torch 1.13's AOTAutograd took no input writes;
    2.13's would, but a pure function keeps its graph free of them), batch norm's running
    statistics updated as eager's kernel does (momentum times the batch's mean and unbiased
    variance)."""
    from .recorder import _functional
    written = _written_slots(tape)

    def val(v, cur, env):
        if isinstance(v, TapeRef):
            r = v.r
            return cur[r[1]] if r[0] == "in" else env[(r[1], r[2])]
        if type(v) in (list, tuple):
            return type(v)(val(x, cur, env) for x in v)
        return v

    def run(*inputs):
        env, cur = {}, list(inputs)
        for i, (func, a, k) in enumerate(tape):
            args, kw = val(a, cur, env), {n: val(x, cur, env) for n, x in k.items()}
            slots = _input_write(func, a)
            if slots is not None and func is _BATCH_NORM:
                x, rm, rv, momentum = args[0], args[3], args[4], args[6]
                out = func(x, args[1], args[2], None, None, True, momentum, args[7])
                dims = [0] + list(range(2, x.dim()))
                with torch.no_grad():  # (the statistics take no part in the gradients)
                    if isinstance(a[3], TapeRef) and a[3].r[0] == "in":
                        cur[a[3].r[1]] = rm * (1 - momentum) + out[1] * momentum
                    if isinstance(a[4], TapeRef) and a[4].r[0] == "in":
                        var = torch.ops.aten.var.correction(x.detach(), dims, correction=1)
                        cur[a[4].r[1]] = rv * (1 - momentum) + var * momentum
            elif slots is not None:
                out = _functional(func)(*args, **kw)
                cur[slots[0]] = out
            elif func in _SEEDED_INPLACE and not args[0].is_contiguous() and dense_order(args[0]) is not None:
                # dropout's mask drawn in place into a transposed tensor: eager draws in memory
                # order, the functional form AOTAutograd makes of it in logical order; drawn in
                # place through the view that is contiguous, both agree
                func(args[0].permute(dense_order(args[0])[::-1]), *args[1:], **kw)
                out = args[0]
            else:
                out = func(*args, **kw)
            for j, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
                env[(i, j)] = o
        return tuple(val(TapeRef(r), cur, env) for r in out_refs) + tuple(cur[s] for s in written)
    return run


class _GraphCompiler:
    """AOTAutograd's fw_compiler / bw_compiler: the FX graph through dynamo.optimize, as a boxed
    call (a list of arguments); counts the backward's traces and native runs."""

    def __init__(self, name, backward, optimize):
        self.name, self.backward, self.graphs, self.optimize = name, backward, [], optimize
        self.gm = self.run = None  # the last graph handed over, and the boxed call made for it

    def __call__(self, gm, example_inputs):
        opt = self.optimize(gm)
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
            out = opt.forward(*args)  # (the graph module has no hooks: its compiled forward straight)
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
        self.gm, self.run = gm, run
        return run


_BACKWARD_OPS = ("threshold_backward", "native_batch_norm_backward", "native_layer_norm_backward",
                 "_softmax_backward_data", "_log_softmax_backward_data", "gelu_backward", "tanh_backward",
                 "sigmoid_backward", "silu_backward", "hardtanh_backward", "hardswish_backward",
                 "hardsigmoid_backward", "leaky_relu_backward", "elu_backward", "native_dropout_backward",
                 "mse_loss_backward")


def _decompositions():
    """torch._decomp's decompositions of the pointwise and normalization backward ops: the
    backward graph then holds arithmetic and reductions that dynamo fuses, instead of one
    LibTorch call per op (resnet18's backward: 20 batch-norm and 17 ReLU backward calls)."""
    from torch._decomp import get_decompositions
    aten = torch.ops.aten
    return get_decompositions([getattr(aten, n) for n in _BACKWARD_OPS if hasattr(aten, n)])


def _partition():
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    try:
        import networkx  # noqa: F401 -- the min-cut partitioner needs it
        return min_cut_rematerialization_partition
    except ImportError:
        return default_partition


class _Partition:
    """The partitioner, noting how many of the joint graph's forward outputs AOTAutograd counts as
    the call's own (its outputs, plus the inputs it writes, the bases of outputs that alias each
    other, random-number offsets and effect tokens, which its runtime handles)."""

    def __init__(self):
        self.fn, self.num_fwd_outputs = _partition(), None

    def __call__(self, joint, joint_inputs, **kwargs):
        self.num_fwd_outputs = kwargs.get("num_fwd_outputs")
        return self.fn(joint, joint_inputs, **kwargs)


class TrainedTrace(Compiled):
    """A root trace run as AOTAutograd's compiled forward and backward (see the module text)."""

    def __init__(self, name, rec, gs, text, out_spec, names, inlined, inputs, optimize):
        """optimize: frontend.optimize, which compiles the two graphs (passed in: this module
        does not import the front end)."""
        from torch._functorch.aot_autograd import aot_function
        super().__init__(gs, text, None, out_spec, gs.tensor_inputs, rec.ops, inlined)
        refs = [rec.tape_ref(n) for n in names]
        if None in refs:
            raise LookupError("a result is not on the tape")
        self.meta = [_meta(t) for t in inputs]
        self.forward_graphs = _GraphCompiler(name, False, optimize)
        self.backward_graphs = _GraphCompiler(name, True, optimize)
        self.written = _written_slots(rec.tape)  # input slots written back after each forward
        self.n_results = len(refs)
        self.partition = _Partition()
        self.aot = aot_function(_replay(rec.tape, refs), fw_compiler=self.forward_graphs,
                                bw_compiler=self.backward_graphs, partition_fn=self.partition,
                                decompositions=_decompositions())
        self.training = True
        self.traced = False  # AOTAutograd has traced the joint graph (on the first run)
        self.lean = None      # _lean_function's class once the graphs may run without AOTAutograd's runtime
        self.lean_why = None  # why they may not ("" once lean; None while undecided)
        self.lean_tries = 0
        self.out_flags = None  # requires_grad of each output of the first call (None: an output not a tensor,
        #                        or one returned twice)
        log("traces", f"{name}: forward and backward through AOTAutograd: {len(rec.tape)} ATen op(s) on the tape")

    def summary(self):
        """One line for report() and explain()."""
        def graphs(g):
            return ", ".join(f"{o.forward.name} ({sum(c.runs for c in o.forward.compiled)} native run(s))"
                             for o in g.graphs) or "not compiled yet"
        runtime = ("their own autograd.Function" if self.lean is not None else
                   f"AOTAutograd's ({self.lean_why})" if self.lean_why else "AOTAutograd's")
        return (f"forward and backward through AOTAutograd: {len(self.ops)} ATen op(s), {self.runs} run(s); "
                f"forward graph: {graphs(self.forward_graphs)}; backward graph: {graphs(self.backward_graphs)}; "
                f"runtime: {runtime}")

    def run(self, inputs):
        if not torch.is_grad_enabled() or len(inputs) != len(self.meta) or \
                any(_meta(t) != m for t, m in zip(inputs, self.meta)):
            return None
        # Python numbers (scalar inputs) as 0-dim tensors: the replay's and the graphs' inputs
        inputs = [torch.tensor(v, dtype=torch.float64) if type(v) is float else
                  torch.tensor(v, dtype=torch.int64) if type(v) is int else v for v in inputs]
        lean = self.lean
        if lean is None and self.lean_why is None and self.backward_graphs.run is not None:
            self._decide_lean(len(inputs))  # (before the call: only the first runs on AOTAutograd's runtime)
            lean = self.lean
        try:
            if lean is not None and _interpreters() is None:  # (not under functorch's vmap / grad)
                outs = lean.apply(*inputs)
                if type(outs) is not tuple:  # (one output: apply returns it alone)
                    outs = (outs,)
                return self._finish(inputs, outs)
            if not self.traced and any(t is not None and t.grad_fn is not None for t in inputs):
                # AOTAutograd's first call traces the joint graph on the tensors it gets, and
                # its autograd.grad over inputs that have a grad_fn (the outputs of the trace
                # before a cut) would run into their graph: it traces on detached twins first
                # (a run: the random numbers it draws are drawn again by the real one)
                rng = torch.get_rng_state()
                self.aot(*[t.detach().requires_grad_(t.requires_grad) if t is not None and t.grad_fn is not None
                           else t for t in inputs])
                torch.set_rng_state(rng)
            self.traced = True
            outs = self.aot(*inputs)
        except Exception as e:  # noqa: BLE001 -- AOTAutograd failing inside (tracing, partitioning) is
            # dynamo's failure, not the program's: the trace goes and eager answers (tracetree.Runner.run_one)
            raise DynamoError("TRAINING", f"{'the compiled graphs' if lean is not None else 'AOTAutograd'} failed: "
                                          f"{type(e).__name__}: {e}") from e
        if self.out_flags is None:
            self.out_flags = [o.requires_grad for o in outs] if all(isinstance(o, torch.Tensor) for o in outs) \
                and len({id(o) for o in outs}) == len(outs) else []
        return self._finish(inputs, outs)

    def _finish(self, inputs, outs):
        self.runs += 1
        if self.written:  # the buffers the call writes (batch norm's running statistics, ...)
            with torch.no_grad():
                for slot, v in zip(self.written, outs[self.n_results:]):
                    inputs[slot].copy_(v)
        return list(outs[:self.n_results])

    def _decide_lean(self, n_inputs):
        """Once the backward graph is compiled, before a call: may it and later calls run the two
        graphs through _lean_function? (Decided before the call, so that only the first call, which
        compiled the graphs, runs on AOTAutograd's runtime: `retain_graph` and `create_graph` then
        meet one behaviour, see _lean_function.)"""
        self.lean_tries += 1
        try:
            why = _lean_unsupported(self, n_inputs)
        except Exception as e:  # noqa: BLE001 -- only speed depends on it: AOTAutograd's runtime stays
            why = f"the graphs could not be read ({type(e).__name__}: {e})"
        if why is _NOT_YET:
            if self.lean_tries < 8:
                return
            why = "the graphs were not compiled natively"
        if why:
            self.lean_why = why
            log("traces", f"{self.forward_graphs.name}: the graphs stay on AOTAutograd's runtime: {why}")
            return
        n_user = self.n_results + len(self.written)
        nondiff = [i for i in range(n_user) if not self.out_flags[i]]
        bw_in = [n for n in self.backward_graphs.gm.graph.nodes if n.op == "placeholder"]
        strides = [tuple(n.meta["val"].stride()) for n in bw_in[len(bw_in) - (n_user - len(nondiff)):]]
        self.lean = _lean_function(self.forward_graphs.run, self.backward_graphs.run, n_user, nondiff, strides)
        self.lean_why = ""
        log("traces", f"{self.forward_graphs.name}: the graphs run through their own autograd.Function from now on")


def _meta(t):
    return (t.dtype, t.device, tuple(t.shape), t.stride(), t.requires_grad) if isinstance(t, torch.Tensor) else None


_interpreters = torch._C._functorch.peek_interpreter_stack
_NOT_YET = object()  # _lean_unsupported: ask again after a later call


def _lean_unsupported(tt, n_inputs):
    """Why TrainedTrace tt's two graphs need AOTAutograd's runtime, "" when they do not, or
    _NOT_YET. AOTAutograd's runtime does more than call the graphs where its metadata says so:
    it writes inputs back, regenerates outputs that alias inputs or each other, threads
    random-number offsets and effect tokens, saves numbers beside tensors, and turns autocast off
    around the graphs. _lean_function does none of it, so each is ruled out here from what the
    graphs show (their inputs, outputs and what each saves for the other)."""
    fw, bw = tt.forward_graphs, tt.backward_graphs
    if len(fw.graphs) != 1 or len(bw.graphs) != 1:
        return "graphs compiled again (a second forward or backward graph)"
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return "recorded under autocast"
    if torch._functorch.config.functionalize_rng_ops:
        return "random numbers functionalized"
    n_user = tt.n_results + len(tt.written)
    flags = tt.out_flags
    if flags is None:
        return _NOT_YET
    if not flags:
        return "an output returned twice or not a tensor"
    if tt.partition.num_fwd_outputs != n_user or len(flags) != n_user:
        return "outputs alias each other, or the graph writes inputs"
    fw_in = [n for n in fw.gm.graph.nodes if n.op == "placeholder"]
    fw_out = next(n for n in reversed(fw.gm.graph.nodes) if n.op == "output").args[0]
    bw_in = [n for n in bw.gm.graph.nodes if n.op == "placeholder"]
    bw_out = next(n for n in reversed(bw.gm.graph.nodes) if n.op == "output").args[0]
    saved = list(fw_out[n_user:])
    diff = [f for f in flags if f]
    if len(fw_in) != n_inputs or len(bw_out) != n_inputs:
        return "the graphs take or give more than the call's inputs (effect tokens, random-number states)"
    if not all(isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor) for n in saved):
        return "the forward saves numbers or objects for the backward"
    if any(n.meta.get("saved_tensor_with_no_vc_check") for n in saved):
        return "a saved tensor without a version check"
    if len(bw_in) != len(saved) + len(diff):
        return "an output's gradient is not a tangent of the backward graph (an alias of an input)"
    if not all(isinstance(n.meta.get("val"), torch.Tensor) for n in bw_in[len(saved):]):
        return "a tangent of the backward graph is not a tensor"
    traces = fw.graphs[0].forward.compiled
    if len(traces) != 1 or traces[0].handle is None:
        return _NOT_YET
    c = traces[0]
    spec = c.out_spec
    if spec[0] not in ("tuple", "list") or len(spec[1]) != len(fw_out):
        return "the forward graph's results are not a flat sequence"
    for s in spec[1][:n_user]:  # the call's own outputs: tensors of the graph's own, not views
        if s[0] != "T" or (c.has_alias and c.aliases[s[1]] is not None):
            return "an output is a view (of an input or of another result)"
    if len({s[1] for s in spec[1][:n_user]}) != n_user:
        return "an output returned twice"
    return ""


def _lean_function(fw, bw, n_user, nondiff, strides):
    """An autograd.Function running the compiled forward graph fw and backward graph bw (boxed
    calls, _GraphCompiler.run) as AOTAutograd's runtime would when it has nothing else to do: the
    forward's first n_user results are the call's outputs (those at nondiff need no gradient), the
    rest are saved for the backward (views detached first, as AOTAutograd does); the backward takes
    the saved tensors, then the gradients of the outputs that need one, each in the strides the
    backward graph was traced with (strides: AOTAutograd copies a gradient that comes in others, as
    autograd may give it, into them: the graph's views assume them), and gives one per input."""
    diff = [i for i in range(n_user) if i not in nondiff]
    tangents = list(zip(diff, strides))

    def tangent(g, want):
        if g.stride() == want:
            return g
        return torch.empty_strided(g.shape, want, dtype=g.dtype, device=g.device).copy_(g)

    class CompiledGraphs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            outs = fw(list(inputs))
            ctx.save_for_backward(*[t.detach() if t._is_view() else t for t in outs[n_user:]])
            user = tuple(outs[:n_user])
            if nondiff:
                ctx.mark_non_differentiable(*[user[i] for i in nondiff])
            return user

        @staticmethod
        def backward(ctx, *grads):
            args = [*ctx.saved_tensors, *[tangent(grads[i], want) for i, want in tangents]]
            if torch.is_grad_enabled():  # create_graph=True
                return _FirstDerivatives.apply(bw, _DUMMY, *args)
            if torch.is_autocast_enabled("cpu"):  # (as AOTAutograd: the graph has its casts already)
                with torch.autocast("cpu", enabled=False):
                    return tuple(bw(args))
            return tuple(bw(args))

    return CompiledGraphs


_DUMMY = torch.empty(0, requires_grad=True)


class _FirstDerivatives(torch.autograd.Function):
    """create_graph=True through _lean_function's backward, as AOTAutograd's runtime answers it:
    the backward graph runs with grad off (its saved tensors are detached: its gradients cannot
    be differentiated again) and its results refuse a second derivative instead of giving a wrong
    one. The dummy input that requires grad gives them that refusal even where no other input of
    the backward requires grad."""

    @staticmethod
    def forward(ctx, bw, dummy, *args):
        return tuple(bw(list(args)))

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("dynamo: double backward (a second derivative) through a forward compiled for "
                           "training is not supported; set dynamo.config.training = False for such a program")


# -- the optimizer step ---------------------------------------------------------------------
# torch.optim's SGD, Adam and AdamW update each parameter with a few in-place ops; eager runs
# them one by one, parameter after parameter (`_single_tensor_*`, or grouped by `foreach`). A parameter
# group's update is written here as one Python function over lists of tensors, the same ops
# in the same order, which dynamo records and compiles like any function: a trace whose
# inputs are the parameters, gradients and state tensors, written in place. Numbers that
# change between steps (the learning rate under a scheduler, Adam's bias corrections) are
# computed here in Python doubles as torch does and reach the trace as scalar inputs (they
# meet tensors only in `*` and `/`); the others are guarded by value.

def _sgd_group(params, grads, bufs, neg_lr, momentum, dampening, weight_decay, nesterov):
    for i in range(len(params)):
        d_p = grads[i]
        if weight_decay != 0:
            d_p = d_p.add(params[i], alpha=weight_decay)
        if momentum != 0:
            buf = bufs[i]
            buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
            d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
        params[i].add_(d_p * neg_lr)


def _adam_group(params, grads, exp_avgs, exp_avg_sqs, steps, beta1, beta2, eps, weight_decay, decoupled, decay,
                neg_step_size, bias_correction2_sqrt):
    for i in range(len(params)):
        param, grad, exp_avg, exp_avg_sq = params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]
        steps[i].add_(1)
        if decoupled:  # AdamW's weight decay: param * (1 - lr * weight_decay), decay only in `*`
            param.copy_(param * decay)
        if weight_decay != 0:  # Adam's L2 term
            grad = grad.add(param, alpha=weight_decay)
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).add_(grad * grad, alpha=1 - beta2)  # (addcmul_: a LibTorch call, not fused)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.add_(exp_avg / denom * neg_step_size)


EAGER_STEP = object()  # OptimizedStep.compiled: torch's own step must run


class OptimizedStep:
    """dynamo.optimize(optimizer.step) for torch.optim.SGD, Adam and AdamW: each parameter
    group's update as one compiled trace (the functions above). A step the compiled update does
    not cover runs torch's own `step`: the first (it creates the state), a closure, a sparse or
    complex gradient, state missing for a parameter, and the options amsgrad, maximize,
    foreach, capturable, differentiable and fused; `reasons` says which, once each."""

    def __init__(self, optimizer, optimize, nopython=False):
        """optimize: frontend.optimize (passed in: this module does not import the front end)."""
        self.optimizer = optimizer
        self.eager_step = optimizer.step
        self.kind = type(optimizer).__name__
        fn = _sgd_group if self.kind == "SGD" else _adam_group
        self.update = optimize(fn, nopython=nopython)
        self.update.name = f"{self.kind}.step"
        self.reasons = []
        self.steps = self.compiled_steps = 0

    def _eager(self, why):
        if why not in self.reasons:
            self.reasons.append(why)
            log("traces", f"{self.kind}.step runs eagerly: {why}")
            if not why.startswith("the first step"):  # (report() lists it under the update)
                from .tracetree import Attempt
                self.update.attempts.append(Attempt(f"torch's own step ran: {why}"))
        return EAGER_STEP

    def __call__(self, *args, **kwargs):
        if self.compiled(*args, **kwargs) is EAGER_STEP:
            return self.eager_step(*args, **kwargs)
        if getattr(self.optimizer.step, "_wrapped_by_lr_sched", False):
            self.optimizer._opt_called = True  # what a scheduler's wrapper of the step marks
        return None

    def compiled(self, closure=None, *more, **kwargs):
        """The step through the compiled updates (None), or EAGER_STEP where torch's own step
        must run (the caller runs it, with the same arguments): a closure, or any argument the
        compiled update does not know (torch's own step takes it, or raises as eager does)."""
        self.steps += 1
        if closure is not None:
            return self._eager("a closure (it re-evaluates the model)")
        if more or kwargs:
            return self._eager("step called with arguments other than closure: "
                               + ", ".join([repr(type(a).__name__) for a in more] + sorted(kwargs)))
        groups = []
        for g in self.optimizer.param_groups:
            why = _unsupported_options(self.kind, g)
            if why:
                return self._eager(why)
            params, grads = [], []
            for p in g["params"]:
                grad = p.grad  # (a property: read once per parameter and step)
                if grad is None:
                    continue
                if grad.is_sparse or p.is_complex() or grad.dtype != p.dtype or grad.device != p.device:
                    return self._eager("a sparse or complex gradient, or one of another dtype or device")
                params.append(p)
                grads.append(grad)
            state = [self.optimizer.state.get(p) or {} for p in params]
            stateless = self.kind == "SGD" and g["momentum"] == 0  # (SGD keeps no state then)
            if not stateless and any(not s for s in state):
                return self._eager("the first step (torch's step creates the optimizer state)")
            if self.kind == "SGD" and g["momentum"] != 0 and any(s.get("momentum_buffer") is None for s in state):
                return self._eager("a parameter without a momentum buffer yet")
            if self.kind != "SGD" and len({int(s["step"].item()) for s in state}) > 1:
                return self._eager("parameters of one group at different step counts")
            groups.append((g, params, grads, state))
        with torch.no_grad():
            for g, params, grads, state in groups:
                if params:
                    self._group(g, params, grads, state)
        self.compiled_steps += 1
        return None

    def _group(self, g, params, grads, state):
        if self.kind == "SGD":
            bufs = [s.get("momentum_buffer") for s in state]
            self.update(params, grads, bufs, -g["lr"], g["momentum"], g["dampening"], g["weight_decay"],
                        g["nesterov"])
            return
        beta1, beta2 = g["betas"]
        step = int(state[0]["step"].item()) + 1  # (every parameter of the group: checked in compiled())
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        adamw = self.kind == "AdamW"
        self.update(params, grads, [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state],
                    [s["step"] for s in state], beta1, beta2, g["eps"], 0 if adamw else g["weight_decay"],
                    adamw and g["weight_decay"] != 0, 1 - g["lr"] * g["weight_decay"] if adamw else 1.0,
                    -(g["lr"] / bias_correction1), math.sqrt(bias_correction2))


def _unsupported_options(kind, g):
    on = [k for k in ("amsgrad", "maximize", "capturable", "differentiable", "fused") if g.get(k)]
    if g.get("foreach"):
        on.append("foreach")
    return f"{kind} with {', '.join(on)}" if on else None


def optimizer_of(method):
    """The optimizer whose step `method` is, when OptimizedStep covers it, else None: the bound
    method, or the wrapper a learning-rate scheduler puts in its place (a function holding a weak
    reference to the optimizer, marked `_wrapped_by_lr_sched`)."""
    obj = getattr(method, "__self__", None)
    if obj is None and getattr(method, "_wrapped_by_lr_sched", False):
        for cell in getattr(method, "__closure__", None) or ():
            ref = cell.cell_contents
            if isinstance(ref, weakref.ref) and isinstance(ref(), torch.optim.Optimizer):
                obj = ref()
    if type(obj) in COVERED and getattr(method, "__name__", "") in ("step", "_use_grad", "wrapper"):
        return obj
    return None


COVERED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
