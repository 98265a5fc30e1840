"""What a trace computes from a module's parameters and buffers alone (and constants) is computed
on one call and kept for the next ones (config.keep_weight_results): a T5-style relative
position bias, a mask from aranges. Every case compares with eager on every call, and changes
the weights between calls in each way a program can: in place (the version counter moves),
through .data (it does not: the sampled contents show it), a parameter or buffer replaced, an
optimizer step. Random ops, outputs and in-place writes are never kept."""
import copy

import pytest
import torch

import dynamo
from dynamo import config


class RelBias(torch.nn.Module):
    """softmax(x + bias) with bias[h, i, j] = emb[bucket(j - i), h] * scale: the bias reads only a
    parameter, a buffer and aranges (T5's relative attention bias, simplified)."""

    def __init__(self, heads=4, buckets=16):
        super().__init__()
        self.emb = torch.nn.Embedding(buckets, heads)
        self.register_buffer("scale", torch.tensor([1.5]))
        self.buckets = buckets

    def forward(self, x):
        n = x.shape[-1]
        pos = torch.arange(n)
        rel = (pos[None, :] - pos[:, None]).abs().clamp(max=self.buckets - 1)
        bias = self.emb(rel).permute(2, 0, 1) * self.scale
        return torch.softmax(x + bias, -1)


def kept_text():
    text = dynamo.report()
    return [line for line in text.splitlines() if "computed from weights alone" in line]


def check(m, x):
    want = type(m).forward(m, x)  # the class's forward: eager (the instance's is optimized)
    got = m(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("n", [1, 7, 33])
def test_relative_bias_kept_and_recomputed_after_every_kind_of_change(n):
    dynamo.reset()
    torch.manual_seed(0)
    m = dynamo.optimize(RelBias())
    x = torch.randn(2, 4, n, n)
    with torch.no_grad():
        for _ in range(4):
            check(m, torch.randn(2, 4, n, n))
        lines = kept_text()
        assert lines and "(1 time(s)" in lines[0], dynamo.report()
        m.emb.weight.mul_(2)                      # in place: a new version
        check(m, x)
        m.emb.weight.data.add_(0.5)               # through .data: same version, new contents
        check(m, x)
        m.scale.fill_(-1.0)                       # a buffer in place
        check(m, x)
        m.emb.weight = torch.nn.Parameter(torch.randn_like(m.emb.weight))  # replaced
        check(m, x)
        m.scale = torch.tensor([0.25])            # a buffer replaced
        check(m, x)
        check(m, x)
    assert dynamo.counters()["native_runs"] >= 9
    assert "(6 time(s)" in kept_text()[0], dynamo.report()


def kept_steps():
    lines = kept_text()
    return int(lines[0].split(" step(s) computed from weights alone")[0].rsplit(" ", 1)[1]) if lines else 0


def test_off_keeps_only_what_needs_no_tensor():
    """config.keep_weight_results = False: the steps that read the weights run on every call;
    only what reads no tensor at all (the aranges and buckets) is still kept."""
    counts = {}
    for on in (True, False):
        dynamo.reset()
        config.keep_weight_results = on
        try:
            m = dynamo.optimize(RelBias())
            with torch.no_grad():
                for _ in range(3):
                    check(m, torch.randn(1, 4, 5, 5))
                    m.emb.weight.data.mul_(-1)
            counts[on] = kept_steps()
        finally:
            config.keep_weight_results = True
    assert counts[True] > counts[False] > 0, counts


def test_training_steps_follow_the_optimizer():
    """The weights change at every step (SGD in place): the kept bias is computed anew each call,
    and the losses and gradients are eager's."""
    torch.manual_seed(1)
    ref = RelBias()
    m = copy.deepcopy(ref)
    dynamo.reset()
    opt_m = dynamo.optimize(m)
    o_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
    o_m = torch.optim.SGD(m.parameters(), lr=0.5)
    for step in range(4):
        x = torch.randn(2, 4, 6, 6)
        t = torch.randn(2, 4, 6, 6)
        for model, o, fwd in ((ref, o_ref, ref), (m, o_m, opt_m)):
            o.zero_grad()
            loss = ((fwd(x) - t) ** 2).mean()
            loss.backward()
            o.step()
            if model is ref:
                want = loss.item()
            else:
                assert abs(loss.item() - want) <= 1e-5 * max(1.0, abs(want)), (step, loss.item(), want)
        torch.testing.assert_close(m.emb.weight, ref.emb.weight, rtol=1e-5, atol=1e-6)


class Noisy(torch.nn.Module):
    """A weight plus noise drawn each call: the draw must not be kept."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return x + (self.w + torch.rand_like(self.w)).exp()


def test_random_ops_are_not_kept():
    dynamo.reset()
    m = dynamo.optimize(Noisy())
    with torch.no_grad():
        for seed in range(4):
            x = torch.randn(8)
            torch.manual_seed(seed)
            want = Noisy.forward(m, x)
            torch.manual_seed(seed)
            got = m(x)
            torch.testing.assert_close(got, want)


class ReturnsWeightWork(torch.nn.Module):
    """Returns a value computed from the weight alone: an output is never kept (the caller owns
    it and may write into it)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        n = self.w.softmax(-1)
        return n, x @ n


def test_weight_only_outputs_are_fresh_each_call():
    dynamo.reset()
    m = dynamo.optimize(ReturnsWeightWork())
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3, 4)
            n, y = m(x)
            want_n, want_y = ReturnsWeightWork.forward(m, x)
            torch.testing.assert_close(n, want_n)
            torch.testing.assert_close(y, want_y)
            n.add_(100.0)  # the caller's tensor: the next call must not see this


class WritesBuffer(torch.nn.Module):
    """A buffer written in place by the call itself (a running count): never a kept weight."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count.exp()


def test_buffers_the_call_writes_are_not_kept():
    dynamo.reset()
    m = dynamo.optimize(WritesBuffer())
    ref = WritesBuffer()
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3)
            torch.testing.assert_close(m(x), ref(x))
            torch.testing.assert_close(m.count, ref.count)
