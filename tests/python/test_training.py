"""Training (training.py): calls with grad on and tensors that require grad run their forward
and backward compiled (AOTAutograd's joint graph of the recorded trace, each half compiled by
dynamo). Gradients are compared with eager's on every step, on a copy of the model trained
side by side. A branch on a tensor's value, a number read from one, or a stitch ends a trace:
the parts compile apart and autograd links them; where a call cannot be compiled with grad
(writes into inputs that require grad, ops whose output size depends on the data), it runs
eagerly and the gradients are eager's."""
import contextlib
import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo


def close(a, b, what=""):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale), (what, (a - b).abs().max().item())


def train_side_by_side(model, make_input, steps=4, loss_fn=lambda y: y.square().mean(), input_grad=False):
    """Runs `steps` forward+backward steps on model (optimized) and on an eager copy with the same
    inputs (tensors copied; anything else, a Python number, passed as it is); compares outputs,
    losses and every gradient after each step. Returns the optimized model."""
    ref = copy.deepcopy(model)
    jit = dynamo.optimize(model)

    def fresh(x):
        return x.detach().clone().requires_grad_(input_grad) if isinstance(x, torch.Tensor) else x
    for step in range(steps):
        xs = make_input()
        xs_ref = [fresh(x) for x in xs]
        xs = [fresh(x) for x in xs]
        for p in list(model.parameters()) + list(ref.parameters()):
            p.grad = None
        y, y_ref = jit(*xs), ref(*xs_ref)
        loss, loss_ref = loss_fn(y), loss_fn(y_ref)
        close(loss, loss_ref, f"step {step}: loss")
        loss.backward()
        loss_ref.backward()
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (p_ref.grad is None), name
            if p.grad is not None:
                close(p.grad, p_ref.grad, f"step {step}: grad of {name}")
        if input_grad:
            for k, (x, x_ref) in enumerate(zip(xs, xs_ref)):
                close(x.grad, x_ref.grad, f"step {step}: grad of input {k}")
    return jit


def counts():
    c = dynamo.counters()
    return c["backward_traces_compiled"], c["backward_native_runs"]


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))


def test_mlp_gradients_match_eager_and_the_backward_runs_natively():
    jit = train_side_by_side(mlp(), lambda: [torch.randn(9, 16)], steps=5)
    traces, runs = counts()
    assert traces == 1 and runs >= 3, dynamo.counters()
    report = dynamo.report()
    assert "forward and backward through AOTAutograd" in report and "backward_graph" in report, report
    assert jit.forward.compiled[0].training


def test_gradients_of_the_inputs_too():
    train_side_by_side(mlp(), lambda: [torch.randn(5, 16)], input_grad=True)
    assert counts()[1] >= 2


def test_odd_sizes_and_broadcasting():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(7, 1))
            self.b = nn.Parameter(torch.randn(1023))

        def forward(self, x):
            return torch.sigmoid(x * self.w + self.b).sum(1) + (x.softmax(-1) * self.b).mean()
    train_side_by_side(M(), lambda: [torch.randn(7, 1023)], input_grad=True)
    assert counts()[1] >= 2


def test_transformer_encoder_block_without_dropout():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    train_side_by_side(layer, lambda: [torch.randn(2, 7, 32)], steps=5)
    assert counts()[1] >= 2, dynamo.report()


def test_cnn_in_eval_mode():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    train_side_by_side(m, lambda: [torch.randn(2, 3, 15, 15)], steps=4, input_grad=True)
    assert counts()[1] >= 2, dynamo.report()


@pytest.fixture
def batch_norm_training():
    old = dynamo.config.training_batch_norm
    dynamo.config.training_batch_norm = True
    yield
    dynamo.config.training_batch_norm = old


def seeded_side_by_side(model, make_input, steps, no_grad=False):
    """As train_side_by_side, each call of both from the same RNG seed (dropout draws the same
    masks); also checks that the RNG is where eager left it after each call."""
    ref = copy.deepcopy(model)
    jit = dynamo.optimize(model)
    for step in range(steps):
        x = make_input()
        for p in list(model.parameters()) + list(ref.parameters()):
            p.grad = None
        outs = []
        for f in (jit, ref):
            torch.manual_seed(100 + step)
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                y = f(x)
            outs.append((y, torch.rand(3)))
            if not no_grad:
                y.square().mean().backward()
        (y, r), (y_ref, r_ref) = outs
        close(y, y_ref, f"step {step}")
        assert torch.equal(r, r_ref), f"step {step}: the RNG moved differently"
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            if p.grad is not None or q.grad is not None:
                close(p.grad, q.grad, f"step {step}: grad of {name}")
    return jit


def test_dropout_in_training_mode_draws_eagers_masks():
    """Dropout's mask comes from LibTorch's bernoulli on the default generator, at the point
    eager draws it: the same seed gives eager's outputs, gradients and RNG state."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 4), nn.Dropout(0.5))
    jit = seeded_side_by_side(m, lambda: torch.randn(9, 16), steps=5)
    assert jit.forward.compiled and counts()[1] >= 3, dynamo.report()
    dynamo.reset()
    jit = seeded_side_by_side(m, lambda: torch.randn(9, 16), steps=4, no_grad=True)
    assert sum(c.runs for c in jit.forward.compiled) >= 3, dynamo.report()


def test_transformer_encoder_block_with_its_default_dropout():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)  # dropout 0.1
    jit = seeded_side_by_side(layer, lambda: torch.randn(2, 7, 32), steps=5)
    assert jit.forward.compiled and counts()[1] >= 2, dynamo.report()


def test_dropout_after_a_branch_with_grad():
    """The trace after a cut runs its first AOTAutograd trace on detached twins of its inputs:
    that run must not draw random numbers the real one then draws again."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = self.a(x)
            if h.mean() > 0:
                h = h.relu()
            return self.b(F.dropout(h, 0.4, training=True))
    torch.manual_seed(0)
    signs = iter([1, 1, -1, 1, -1, -1, 1, 1])
    jit = seeded_side_by_side(M(), lambda: torch.randn(5, 8) + 2 * next(signs), steps=8)
    assert len(parts(jit)[1]) == 2, dynamo.report()


def test_batch_norm_in_training_mode_runs_eagerly_by_default():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).train()
    jit = train_side_by_side(m, lambda: [torch.randn(2, 3, 9, 9)], steps=3)
    assert not jit.forward.compiled and "running_mean" in dynamo.report(), dynamo.report()


def test_batch_norm_in_training_mode_compiles_and_updates_its_statistics(batch_norm_training):
    """Training-mode batch norm writes its running statistics in place (a write its schema does
    not declare) and num_batches_tracked: the replay makes both explicit outputs, written back
    after each compiled forward; statistics, outputs and gradients are eager's on every step."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)).train()
    ref = copy.deepcopy(m)
    jit = dynamo.optimize(m)
    for step in range(5):
        x = torch.randn(3, 3, 9, 9)
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        y, y_ref = jit(x), ref(x)
        close(y, y_ref, f"step {step}: output")
        y.square().mean().backward()
        y_ref.square().mean().backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            close(p.grad, q.grad, f"step {step}: grad of {name}")
        for (name, b), c in zip(m.named_buffers(), ref.buffers()):
            assert b.dtype == c.dtype and torch.allclose(b.double(), c.double(), rtol=1e-5, atol=1e-6), (step, name)
    assert m[1].num_batches_tracked == 5
    assert jit.forward.compiled and getattr(jit.forward.compiled[0], "training", False)
    assert counts()[1] >= 2, counts()


def test_batch_norm_without_running_statistics_in_training_mode(batch_norm_training):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.GELU(), nn.Linear(8, 2))
    train_side_by_side(m, lambda: [torch.randn(5, 6)], steps=4)
    assert counts()[1] >= 1, counts()


def parts(jit):
    """(root traces, their side traces compiled with grad, native runs of those side traces)."""
    roots = list(jit.forward.compiled)
    sides = [s for c in roots for snap in c.exits for s in snap.sides if s.training]
    return roots, sides, sum(s.runs for s in sides)


class Branchy(nn.Module):
    """A branch on a tensor's value between two layers."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return self.out(y.relu())
        return self.out(y.tanh()) * 2


def test_data_dependent_branch_compiles_both_sides_with_eager_gradients():
    """With grad on, the branch ends the trace (a cut); the trace after it is recorded once per
    branch taken, and autograd links the parts."""
    torch.manual_seed(0)
    signs = iter([1, 1, -1, 1, -1, -1, 1, -1, 1, 1])
    jit = train_side_by_side(Branchy(), lambda: [torch.randn(4, 8) + 3 * next(signs)], steps=10, input_grad=True)
    roots, sides, side_runs = parts(jit)
    assert len(roots) == 1 and len(sides) == 2 and side_runs >= 4, dynamo.report()
    assert roots[0].runs >= 8 and counts()[1] >= 8, dynamo.report()
    assert "the trace ends there with grad on" in dynamo.report()


def test_untraceable_step_in_the_middle_compiles_the_parts_around_it():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)
            self.out = io.StringIO()

        def forward(self, x):
            h = self.a(x).relu()
            print("rows", h.shape[0], file=self.out)  # not recordable: a stitch
            return self.b(h).tanh() * h.shape[0]
    torch.manual_seed(0)
    m = M()
    jit = train_side_by_side(m, lambda: [torch.randn(3, 8)], steps=5, input_grad=True)
    roots, sides, side_runs = parts(jit)
    assert len(roots) == 1 and len(sides) == 1 and roots[0].runs >= 3 and side_runs >= 3, dynamo.report()
    assert dynamo.counters()["stitches"] >= 4
    assert m.out.getvalue() == "rows 3\n" * 5  # the step made once per call


def test_a_stitch_whose_result_changes_every_call_runs_eagerly_with_eager_gradients():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x):
            h = self.a(x).relu()
            n = len(h.tolist())  # a list of the values (the trace after it is guarded on them)
            return self.b(h) * n
    torch.manual_seed(0)
    train_side_by_side(M(), lambda: [torch.randn(3, 8)], steps=7)


def test_numbers_read_from_tensors_with_grad_on():
    """item() / int() of a tensor ends the trace there; the trace after it is specialized on the
    number. A number that changes every call uses up the variants: the call then runs eagerly,
    with eager's gradients."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)
            self.changing = False

        def forward(self, x):
            h = self.a(x)
            k = int((x > -100).sum())  # the same every call: the element count
            s = h.abs().max().item() if self.changing else 1.0
            return self.b(h.relu() / s) * k
    torch.manual_seed(0)
    m = M()
    jit = train_side_by_side(m, lambda: [torch.randn(4, 6)], steps=5)
    roots, sides, side_runs = parts(jit)
    assert len(sides) == 1 and side_runs >= 3, dynamo.report()
    dynamo.reset()
    m.changing = True
    train_side_by_side(m, lambda: [torch.randn(4, 6)], steps=8)
    assert "none fits this call" in dynamo.report(), dynamo.report()


def test_a_trace_cut_at_max_trace_ops_with_grad(monkeypatch):
    monkeypatch.setattr(dynamo.config, "max_trace_ops", 6)
    monkeypatch.setattr(dynamo.config, "hotexit", 2)
    jit = train_side_by_side(mlp(), lambda: [torch.randn(5, 16)], steps=6, input_grad=True)
    roots, sides, side_runs = parts(jit)
    assert roots and roots[0].cut_id is not None and sides and side_runs >= 2, dynamo.report()


def test_a_branch_on_an_input_that_needs_no_grad():
    """The branch reads the input, not the parameters: the parameters still need the cut."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)

        def forward(self, x):
            h = self.lin(x).sigmoid()
            if x.mean() > 0:
                h = h * x
            return (h - x).exp().sum(-1)
    torch.manual_seed(0)
    signs = iter([1, -1] * 4)
    jit = train_side_by_side(M(), lambda: [torch.randn(7, 5) + next(signs)], steps=8)
    assert len(parts(jit)[1]) == 2, dynamo.report()


def test_a_branch_before_any_tensor_that_requires_grad():
    """The branch comes first (a side exit then), the parameters after it: the trace goes and
    the next recording ends the trace at the branch."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)

        def forward(self, x):
            if x.sum() > 0:
                x = x * 2
            return self.lin(x).sigmoid().square()
    torch.manual_seed(0)
    signs = iter([1, -1] * 5)
    jit = train_side_by_side(M(), lambda: [torch.randn(7, 5) + next(signs)], steps=10)
    roots, sides, side_runs = parts(jit)
    assert len(roots) == 1 and len(sides) == 2 and side_runs >= 4, dynamo.report()
    assert jit.forward.value_cuts and not roots[0].training  # (nothing before the branch requires grad)


def test_python_numbers_passed_each_call_with_grad():
    """A float and an int argument that change every call are the trace's scalar inputs: the
    replay reads them as 0-dim tensors, so one forward and backward serve every value."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.out = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x, s, n):
            return self.out((self.lin(x) * s).tanh() / s + n)
    torch.manual_seed(0)
    step = iter(range(6))

    def make_input():
        k = next(step)
        return [torch.randn(4, 8), 0.5 + 0.25 * k, k]
    jit = train_side_by_side(M(), make_input, steps=6)
    assert len(jit.forward.compiled) == 1 and jit.forward.compiled[0].training, dynamo.report()
    assert counts()[1] >= 4, dynamo.report()


def test_python_numbers_a_tensor_cannot_stand_for_with_grad():
    """A float meeting an integer tensor (a 0-dim float64 tensor would promote differently from
    the number) runs eagerly with grad; a number in a Scalar argument (add's alpha) is guarded by
    its value, a trace per value. Eager's gradients either way."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x, s, idx):
            h = self.lin(x)
            if idx is None:
                return torch.add(h, h.tanh(), alpha=s).relu().sum(1)
            return (h.relu() * (idx * s)).sigmoid().sum(1)
    torch.manual_seed(0)
    for idx in (None, torch.arange(6)):
        dynamo.reset()
        step = iter(range(4))
        jit = train_side_by_side(M(), lambda: [torch.randn(3, 6), 0.3 + 0.1 * next(step), idx], steps=4)
        if idx is not None:
            assert not any(getattr(c, "training", False) for c in jit.forward.compiled), dynamo.report()
            assert "where a tensor cannot stand for it" in dynamo.report(), dynamo.report()


def test_grad_mode_off_then_on_around_a_branch():
    """The same function under no_grad (side exits, natively) and with grad (cuts): each call
    takes traces of its own kind."""
    torch.manual_seed(0)
    m = Branchy()
    ref = copy.deepcopy(m)
    jit = dynamo.optimize(m)
    for step in range(8):
        x = torch.randn(4, 8) + (3 if step % 3 else -3)
        with torch.no_grad():
            close(jit(x), ref(x))
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        jit(x).square().sum().backward()
        ref(x).square().sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            close(p.grad, q.grad)
    kinds = {c.training for c in jit.forward.compiled}
    assert kinds == {True, False}, dynamo.report()


def test_several_outputs_one_unused_and_an_input_returned():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            y = self.lin(x)
            return y.relu(), y.t(), x

    torch.manual_seed(0)
    train_side_by_side(M(), lambda: [torch.randn(4, 6)], loss_fn=lambda out: out[0].sum() + out[2].sum(),
                       input_grad=True)


def test_no_grad_calls_between_training_calls_and_new_shapes():
    torch.manual_seed(0)
    m = mlp()
    ref = copy.deepcopy(m)
    jit = dynamo.optimize(m)
    for step, n in enumerate([4, 4, 4, 6, 4, 6]):
        x = torch.randn(n, 16)
        if step % 2:
            with torch.no_grad():
                close(jit(x), ref(x))
            assert not any(p.grad is not None for p in m.parameters() if p.grad is not None and p.grad.requires_grad)
        for p in list(m.parameters()) + list(ref.parameters()):
            p.grad = None
        jit(x).sum().backward()
        ref(x).sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            close(p.grad, q.grad)
        with torch.no_grad():
            y = jit(x)
        assert not y.requires_grad


def test_training_off_runs_eagerly_and_says_why(monkeypatch):
    monkeypatch.setattr(dynamo.config, "training", False)
    jit = train_side_by_side(mlp(), lambda: [torch.randn(3, 16)], steps=3)
    assert not jit.forward.compiled and "config.training is off" in dynamo.report()
    assert counts() == (0, 0)


def test_second_derivative_raises_instead_of_a_wrong_answer():
    """create_graph=True through a compiled forward: the first derivatives are eager's and
    differentiating them again is refused, never a wrong answer -- on the trace's first compiled
    call, which runs on AOTAutograd's runtime (its backward compiled then: a backward that keeps
    the graph donates no buffers), and on later calls, which run on dynamo's own
    autograd.Function (training._FirstDerivatives); with torch's donated buffers on and off. (The
    recording call itself runs eagerly: eager's graph, eager's second derivative.)"""
    import torch._functorch.config as aot_config
    x = torch.randn(3, 16)
    for donated in (True, False):
        with aot_config.patch(donated_buffer=donated):
            for call in (1, 2, 5):
                dynamo.reset()
                m = mlp()
                ref = copy.deepcopy(m)
                jit = dynamo.optimize(m)
                for _ in range(call - 1):
                    jit(x).square().sum().backward()
                params = list(m.parameters())
                first = torch.autograd.grad(jit(x).square().sum(), params, create_graph=True)
                want = torch.autograd.grad(ref(x).square().sum(), list(ref.parameters()), create_graph=True)
                for a, b in zip(first, want):
                    close(a, b, f"create_graph=True, call {call}, donated buffers {donated}")
                if call == 1:
                    for a, b in zip(torch.autograd.grad(first[0].sum(), params),
                                    torch.autograd.grad(want[0].sum(), list(ref.parameters()))):
                        close(a, b, "second derivative of the recording call")
                else:
                    with pytest.raises(RuntimeError, match="double backward"):
                        torch.autograd.grad(first[0].sum(), params)
                assert (runtime_of(jit) == "lean") == (call > 2), (call, dynamo.report())


def test_parameters_updated_between_steps_are_seen():
    """An SGD step between calls (in place, under no_grad): the next forward uses the new weights."""
    torch.manual_seed(0)
    m = mlp()
    ref = copy.deepcopy(m)
    jit = dynamo.optimize(m)
    opt, opt_ref = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.1,
                                                                                            momentum=0.9)
    for step in range(6):
        x = torch.randn(8, 16)
        for o, mod in ((opt, jit), (opt_ref, ref)):
            o.zero_grad()
            F.mse_loss(mod(x), torch.ones(8, 3)).backward()
            o.step()
        for p, q in zip(m.parameters(), ref.parameters()):
            close(p, q, f"step {step}")


def test_the_min_cut_partitioner_when_networkx_is_installed():
    """The setup installs python3-networkx; with it, AOTAutograd's min-cut partitioner decides
    what the forward saves for the backward (recomputing cheap pointwise ops instead)."""
    pytest.importorskip("networkx")
    from functorch.compile import min_cut_rematerialization_partition
    from dynamo import training
    assert training._partition() is min_cut_rematerialization_partition


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_step_compiled_matches_eager(name):
    """dynamo.optimize(opt.step): each parameter group's update is one compiled trace; the
    parameters and state after every step match torch's own step (a learning-rate scheduler
    changes lr every step: a scalar input, not a new trace)."""
    torch.manual_seed(0)
    model = mlp()
    ref = copy.deepcopy(model)
    opt, opt_ref = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](ref.parameters())
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
    sched_ref = torch.optim.lr_scheduler.ExponentialLR(opt_ref, 0.9)
    step = dynamo.optimize(opt.step)
    for k in range(8):
        x = torch.randn(8, 16)
        for m, o, st, sc in ((model, opt, step, sched), (ref, opt_ref, opt_ref.step, sched_ref)):
            o.zero_grad()
            m(x).square().mean().backward()
            st()
            sc.step()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            close(p, q, f"step {k}: {n}")
        for p, q in zip(model.parameters(), ref.parameters()):
            for key, v in opt_ref.state[q].items():
                if v is not None:  # (SGD without momentum keeps momentum_buffer None)
                    close(opt.state[p][key], v, f"step {k}: state {key}")
    # (torch's own step runs the first, which makes the state: plain SGD keeps none)
    assert len(step.update.compiled) == 1 and step.compiled_steps == (8 if name == "sgd" else 7), dynamo.report()
    assert sum(c.runs for c in step.update.compiled) >= 6


def test_optimizer_step_options_it_does_not_cover_run_torchs_step():
    torch.manual_seed(0)
    model = mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2, amsgrad=True)
    step = dynamo.optimize(opt.step)
    for k in range(4):
        x = torch.randn(8, 16)
        for m, o, st in ((model, opt, step), (ref, opt_ref, opt_ref.step)):
            o.zero_grad()
            m(x).sum().backward()
            st()
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p, q)
    assert step.compiled_steps == 0 and "amsgrad" in dynamo.report(), dynamo.report()
    # a closure: torch's step runs it
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = model(torch.randn(2, 16)).sum()
        loss.backward()
        return loss
    assert isinstance(step(closure), torch.Tensor) and calls


def test_parameters_without_gradients_and_two_groups():
    torch.manual_seed(0)
    model, ref = mlp(), None
    ref = copy.deepcopy(model)

    def groups(m):
        return [{"params": list(m[0].parameters()), "lr": 0.1}, {"params": list(m[2].parameters()) +
                                                                  list(m[4].parameters())}]
    opt = torch.optim.SGD(groups(model), lr=0.01, momentum=0.5)
    opt_ref = torch.optim.SGD(groups(ref), lr=0.01, momentum=0.5)
    step = dynamo.optimize(opt.step)
    for k in range(5):
        x = torch.randn(4, 16)
        for m, o, st in ((model, opt, step), (ref, opt_ref, opt_ref.step)):
            o.zero_grad(set_to_none=True)
            (m[0](x).sum() if k == 2 else m(x).sum()).backward()  # step 2: only the first layer has grads
            st()
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p, q, f"step {k}")


def test_optimizer_step_under_the_frame_hook():
    """Under `with dynamo.optimize():`, an SGD/Adam/AdamW step (torch's code, which the hook
    otherwise leaves alone) runs its compiled update; a scheduler sees the step as eager's."""
    torch.manual_seed(0)

    class Net(nn.Module):  # the program's own class: the hook compiles its forward
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 3)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))
    model = Net()
    ref = copy.deepcopy(model)
    opt, opt_ref = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    sched_ref = torch.optim.lr_scheduler.StepLR(opt_ref, 2, 0.5)
    for k in range(6):
        x = torch.randn(8, 16)
        with dynamo.optimize():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            sched.step()
        opt_ref.zero_grad()
        ref(x).square().mean().backward()
        opt_ref.step()
        sched_ref.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p, q, f"step {k}")
        assert getattr(opt, "_opt_called", None) == getattr(opt_ref, "_opt_called", None)
        assert sched.get_last_lr() == sched_ref.get_last_lr()
    report = dynamo.report()
    assert "AdamW.step" in report and "forward and backward through AOTAutograd" in report, report


def test_a_call_of_few_ops_runs_eagerly_with_grad_and_quietly(capsys):
    """A lone layer (a model's part compiled apart) has nothing to fuse: compiling it with grad
    only adds AOTAutograd's wrapper, so it runs eagerly in that state, and nothing is said on
    stderr (nothing for the user to do); report() gives the reason."""
    torch.manual_seed(0)
    jit = train_side_by_side(nn.Linear(8, 4), lambda: [torch.randn(3, 8)], steps=3)
    assert not jit.forward.compiled and counts() == (0, 0)
    assert "nothing to gain from compiling it with grad" in dynamo.report()
    assert "runs eagerly" not in capsys.readouterr().err
    with torch.no_grad():  # without grad it compiles as before
        x = torch.randn(3, 8)
        for _ in range(2):
            close(jit(x), torch.nn.functional.linear(x, jit.weight, jit.bias))
    assert jit.forward.compiled


def test_aotautograd_failing_inside_never_reaches_the_program(monkeypatch):
    """AOTAutograd raising while it traces or partitions (here: made to) is dynamo's failure:
    the trace is dropped, the call answers eagerly with eager's gradients, and the reason is
    in report()."""
    import torch._functorch.aot_autograd as aot

    def broken(fn, **kwargs):
        def call(*args):
            raise RuntimeError("injected: joint graph could not be traced")
        return call
    monkeypatch.setattr(aot, "aot_function", broken)
    train_side_by_side(mlp(), lambda: [torch.randn(4, 16)], steps=4)
    assert "AOTAutograd failed" in dynamo.report() and counts() == (0, 0), dynamo.report()


def test_in_place_ops_on_tensors_the_call_made():
    """In-place ops on the call's own intermediates (ReLU(inplace=True), `h[:, :3] += 1`,
    `tanh_()`) compile with grad; gradients equal eager's (a backward graph dynamo cannot record
    runs eagerly inside AOTAutograd's function)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.r, self.b = nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 4)

        def forward(self, x):
            h = self.r(self.a(x)) * 2
            h[:, :3] += 1
            return self.b(h).tanh_()
    torch.manual_seed(0)
    jit = train_side_by_side(M(), lambda: [torch.randn(8, 16)], steps=4, input_grad=True)
    assert jit.forward.compiled and jit.forward.compiled[0].training, dynamo.report()


def test_in_place_write_into_an_input_that_needs_no_grad_compiles():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 6)

        def forward(self, x, buf):
            buf.add_(1)  # an input written in place: made explicit, written back after the forward
            return self.a(x).relu() * buf.sum()
    torch.manual_seed(0)
    model = M()
    ref = copy.deepcopy(model)
    jit = dynamo.optimize(model)
    b1, b2 = torch.zeros(3), torch.zeros(3)
    for _ in range(4):
        x = torch.randn(2, 6)
        jit(x, b1).sum().backward()
        ref(x, b2).sum().backward()
        close(b1, b2)
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p.grad, q.grad)
    assert jit.forward.compiled and counts()[1] >= 1, dynamo.report()


def test_in_place_writes_into_inputs_that_need_grad_or_through_views_run_eagerly():
    def f(x, buf):
        x.mul_(2)  # x requires grad (not a leaf): eager's autograd records the write
        return (x * 3).sum() + buf.sum()

    def g(w, buf):
        buf[0].add_(1)  # through a view of an input
        return (w * buf).relu().sum() * 2 + w.mean()

    for fn, why in ((f, "require grad"), (g, "through views")):
        dynamo.reset()
        opt = dynamo.optimize(fn)
        for _ in range(3):
            a = torch.randn(4, requires_grad=True)
            a2 = a.detach().clone().requires_grad_()
            b1, b2 = torch.zeros(4), torch.zeros(4)
            x1, x2 = (a * 1, a2 * 1) if fn is f else (a, a2)
            opt(x1, b1).backward()
            fn(x2, b2).backward()
            close(a.grad, a2.grad)
            close(b1, b2)
        assert why in dynamo.report(), dynamo.report()


torchvision = pytest.importorskip("torchvision")


def test_resnet18_gradients_in_eval_and_train_mode(batch_norm_training):
    """resnet18 at 64x64, batch 8, forward and backward compiled whole: in eval mode (frozen
    batch norm) with the input's gradient too, in train mode with batch norm's statistics
    updated. The gradients are eager's."""
    torch.manual_seed(0)
    train_side_by_side(torchvision.models.resnet18(num_classes=10).eval(), lambda: [torch.randn(8, 3, 64, 64)],
                       steps=3, input_grad=True)
    assert counts() == (1, 1), counts()  # (recorded, then AOTAutograd's graphs recorded, then native)
    dynamo.reset()
    torch.manual_seed(0)
    train_side_by_side(torchvision.models.resnet18(num_classes=10).train(), lambda: [torch.randn(8, 3, 64, 64)],
                       steps=3)
    assert counts() == (1, 1), counts()


class TinyClassifier(nn.Module):
    """A small transformer classifier: embedding, an encoder layer with its default dropout
    (0.1), layer norm, mean over the sequence, a linear head."""

    def __init__(self, vocab=50, dim=32, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, 4, dim_feedforward=64, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.norm(self.block(self.embed(tokens))).mean(1))


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
def test_loss_curve_over_20_steps(model_name, opt_name):
    """An MLP and a small transformer (dropout on: each step seeded alike on both sides), 20
    steps of SGD with momentum or AdamW, model and optimizer step compiled: eager's losses."""
    torch.manual_seed(0)
    if model_name == "mlp":
        model = mlp()
        data = [(torch.randn(16, 16), torch.randint(0, 3, (16,))) for _ in range(5)]
    else:
        model = TinyClassifier()
        data = [(torch.randint(0, 50, (8, 12)), torch.randint(0, 5, (8,))) for _ in range(5)]
    make = (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)) if opt_name == "SGD" else \
        (lambda p: torch.optim.AdamW(p, lr=3e-3))
    eager = loss_curve(model, make, data, False, seeded=True)
    jit = loss_curve(model, make, data, True, seeded=True)
    for k, (e, j) in enumerate(zip(eager, jit)):
        assert abs(j - e) <= 1e-5 * max(1.0, abs(e)), (k, j, e)
    assert eager[-1] < 0.95 * eager[0]  # (it learns: random labels, five batches)
    assert counts()[1] >= 15 and dynamo.counters()["native_runs"] >= 15, dynamo.report()


def loss_curve(model, make_opt, data, compiled, perturb=0.0, steps=20, seeded=False):
    """`steps` SGD/AdamW steps of a copy of model over data (cycled); the losses. compiled: the
    model and the optimizer step optimized; perturb: every weight scaled by 1 + perturb * N(0, 1);
    seeded: the RNG seeded before each step (dropout's masks alike on both sides)."""
    m = copy.deepcopy(model)
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=g))
    opt = make_opt(m.parameters())
    fwd = dynamo.optimize(m) if compiled else m
    step = dynamo.optimize(opt.step) if compiled else opt.step
    out = []
    for i in range(steps):
        x, y = data[i % len(data)]
        if seeded:
            torch.manual_seed(1000 + i)
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad()
        loss.backward()
        step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_resnet18_loss_curve_over_20_steps(name, batch_norm_training):
    """resnet18 at 64x64, batch 8, 20 steps, against eager. Training it is chaotic in float32 (a
    relative change of 1e-7 in the weights moves the loss by up to ~10% by step 12), so "the same
    curve within float tolerance" is: at every step within 1e-5, or within 10x how far that
    1e-7 perturbation of the weights has moved eager's curve by then. A wrong gradient or update
    shows at the first steps, where the perturbation has moved nothing yet."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    data = [(torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))) for _ in range(4)]
    make = (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)) if name == "SGD" else \
        (lambda p: torch.optim.AdamW(p, lr=1e-3))
    eager = loss_curve(model, make, data, False)
    moved = loss_curve(model, make, data, False, perturb=1e-7)
    jit = loss_curve(model, make, data, True)
    envelope = 0.0
    for k, (e, p, j) in enumerate(zip(eager, moved, jit)):
        envelope = max(envelope, abs(p - e) / abs(e))
        assert abs(j - e) / abs(e) <= max(1e-5, 10 * envelope), (k, j, e, envelope)
    assert eager[-1] < 0.5 * eager[0]  # (it learns: the comparison is over a real curve)
    assert dynamo.counters()["traces_compiled"] >= 1  # the optimizer step


def test_dropout_into_a_transposed_tensor_draws_eagers_masks():
    """Dropout's bernoulli_ into a transposed tensor draws in memory order in eager, its
    functional form (AOTAutograd's graph, an extern's operand) in logical order: the mask is drawn
    through the view that is contiguous, with grad and without, on every call."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 8)

        def forward(self, x):
            return F.dropout(self.l(x).transpose(0, 1), 0.5, training=True) * 3
    for no_grad in (False, True):
        dynamo.reset()
        torch.manual_seed(0)
        seeded_side_by_side(M(), lambda: torch.randn(3, 5, 8), steps=4, no_grad=no_grad)
        assert dynamo.counters()["native_runs"] >= 2, dynamo.report()


def test_functional_bernoulli_of_a_transposed_tensor():
    """aten::bernoulli.p (not in place) gives a contiguous result drawn in logical order."""
    aten = torch.ops.aten

    def g(x):
        t = aten.transpose.int(x, 0, 1)
        b = aten.bernoulli.p(aten.empty_like.default(t), 0.5)
        return t * b, b
    jit = dynamo.optimize(g)
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(3, 5, 8)
            torch.manual_seed(k)
            want = g(x)
            torch.manual_seed(k)
            got = jit(x)
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    assert dynamo.counters()["native_runs"] >= 2


def runtime_of(jit):
    """How the root trace's two graphs run: None (AOTAutograd's runtime, undecided or with the
    reason) or "lean" (training._lean_function)."""
    (c,) = [c for c in jit.forward.compiled if c.training]
    return "lean" if c.lean is not None else c.lean_why


def test_graphs_run_through_their_own_autograd_function():
    """Once both graphs are compiled, a call whose graphs need nothing of AOTAutograd's runtime runs
    them through training._lean_function: gradients stay eager's, including a gradient that
    autograd hands over in other strides than the backward graph was traced with (y.t() * w), an
    output whose gradient is never asked for, and a backward run twice (retain_graph); with
    create_graph=True the first derivatives are eager's and a second derivative is refused."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(12, 7), nn.Linear(7, 7)

        def forward(self, x):
            h = F.gelu(self.a(x))
            return self.b(h), h.sum(-1), (x * 2).detach()

    torch.manual_seed(0)
    w = torch.randn(7, 5)
    jit = train_side_by_side(M(), lambda: [torch.randn(5, 12)], steps=6,
                             loss_fn=lambda out: (out[0].t() * w).sum() + out[2].sum())
    assert runtime_of(jit) == "lean", dynamo.report()
    assert "runtime: their own autograd.Function" in dynamo.report()
    model = jit.forward.owner if hasattr(jit.forward, "owner") else jit
    ref = copy.deepcopy(model)
    x = torch.randn(5, 12)
    for m in (model, ref):
        for p in m.parameters():
            p.grad = None
    y, y_ref = jit(x), ref(x)
    assert not y[2].requires_grad and y[0].requires_grad and y[1].requires_grad
    for out in (y, y_ref):
        loss = out[0].square().sum() + out[1].sum()
        loss.backward(retain_graph=True)
        loss.backward()
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        close(p.grad, p_ref.grad, "backward twice")
    params = list(model.parameters())
    first = torch.autograd.grad(jit(x)[0].square().sum(), params, create_graph=True)
    want = torch.autograd.grad(ref(x)[0].square().sum(), list(ref.parameters()))
    for a, b in zip(first, want):
        close(a, b, "create_graph=True")
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(first[0].sum(), params)


def test_graphs_that_need_aotautograds_runtime_keep_it():
    """An output that aliases an input needing grad: AOTAutograd's runtime rebuilds it, so the
    call stays on that runtime (with the reason in report()), and the gradients stay eager's. An
    output that is a view of another is rebuilt by the trace itself (its result spec), so that
    call runs lean, and its outputs share memory as eager's do."""
    class Alias(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            return self.lin(x).relu(), x.view(-1)

    class View(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            h = self.lin(x).tanh()
            return h, h[1:].t()

    torch.manual_seed(0)
    jit = train_side_by_side(Alias(), lambda: [torch.randn(4, 6)], steps=6, input_grad=True,
                             loss_fn=lambda out: out[0].sum() + (out[1] * 3).sum())
    why = runtime_of(jit)
    assert why not in (None, "lean") and "alias" in why, (why, dynamo.report())
    assert f"runtime: AOTAutograd's ({why})" in dynamo.report()
    dynamo.reset()
    jit = train_side_by_side(View(), lambda: [torch.randn(4, 6)], steps=6,
                             loss_fn=lambda out: out[0].sum() + (out[1] * 2).sum())
    assert runtime_of(jit) == "lean", dynamo.report()
    h, v = jit(torch.randn(4, 6))
    assert v._is_view() and v.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()
    h.data.fill_(7.0)
    assert bool((v == 7.0).all())
