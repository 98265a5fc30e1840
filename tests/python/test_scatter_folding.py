"""In-place writes into chunks of a tensor are recorded as slice_scatter chains (one scatter per
chunk, then the chunks read back); slices of such chains fold to the scattered values or to the
base's elements, and the dead scatters go (jit/passes.cpp). Values read again after an extern
are stored once instead of recomputed (jit/fuse.cpp), so an unrolled recurrence does not grow
its expression step by step. Compared with eager on every call; the plan (DYNAMO_DUMP_DIR) shows
which steps ran."""
import glob

import torch
import torch.nn as nn

import dynamo


def compare(fn, make, tmp_path, monkeypatch, calls=3):
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    jit = dynamo.optimize(fn)
    with torch.no_grad():
        for _ in range(calls):
            args = make()
            want = fn(*[a.clone() for a in args])
            got = jit(*[a.clone() for a in args])
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    assert dynamo.counters()["native_runs"] >= calls - 1, dynamo.report()
    return "".join(open(p).read() for p in glob.glob(f"{tmp_path}/*.plan"))


def cell(x, w, c):
    """An LSTM cell as torch writes it: in-place activations of the gate chunks."""
    gates = x @ w
    i, f, g, o = gates.chunk(4, 1)
    i.sigmoid_()
    f.sigmoid_()
    g.tanh_()
    o.sigmoid_()
    c = f * c + i * g
    return o * torch.tanh(c), c


def test_chunk_activations_fold(tmp_path, monkeypatch):
    def f(x, w, c):
        h, c = cell(x, w, c)
        return h + c
    steps = compare(f, lambda: (torch.randn(2, 8), torch.randn(8, 16), torch.randn(2, 4)), tmp_path, monkeypatch)
    assert "slice_scatter" not in steps, steps


def test_overlapping_writes_keep_their_scatters(tmp_path, monkeypatch):
    def f(x):
        y = x * 1
        y[:, 0:6].mul_(2)
        y[:, 4:8].add_(1)  # overlaps the first write
        return y[:, 2:7] * 3
    compare(f, lambda: (torch.randn(3, 8),), tmp_path, monkeypatch)


def test_an_unrolled_recurrence_stays_small(monkeypatch):
    """32 steps of a cell whose state is read by the next step's product: each step's state
    is stored once, so the kernels stay a few and compiling stays quick."""
    w = torch.randn(8, 16) * 0.3

    def f(xs, c):
        h = torch.zeros(2, 4)
        for t in range(xs.shape[0]):
            h, c = cell(torch.cat([xs[t], h], 1), torch.cat([w[:4], w[4:] * 0.5], 0), c)
        return h + c
    monkeypatch.delenv("DYNAMO_DUMP_DIR", raising=False)
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(3):
            xs, c = torch.randn(32, 2, 4), torch.randn(2, 4)
            assert torch.allclose(jit(xs, c.clone()), f(xs, c.clone()), rtol=1e-5, atol=1e-6)
    # distinct kernels after deduplication: the steps' loops are one kernel when each step
    # reads the stored state, 30-odd growing ones when each recomputes the chain before it
    stats = jit.compiled[0].stats
    assert stats.num_kernels <= 8, stats.num_kernels


def test_nn_lstm_matches_eager(tmp_path, monkeypatch):
    lstm = nn.LSTM(6, 10, 2, batch_first=True).eval()
    steps = compare(lambda x: lstm(x)[0], lambda: (torch.randn(1, 9, 6),), tmp_path, monkeypatch)
    assert "slice_scatter" not in steps


def test_nn_lstm_variants_match_eager_on_every_call():
    """torch 2.x runs nn.LSTM on the CPU as one aten::mkldnn_rnn_layer per layer and direction,
    recorded as dynamo::rnn_layer (the same oneDNN call without the workspace a trace cannot
    name): both directions, no biases, 3 layers, other lengths."""
    for kw in (dict(bidirectional=True), dict(bias=False), dict(num_layers=3, batch_first=False)):
        dynamo.reset()
        lstm = nn.LSTM(6, 10, **kw).eval()
        jit = dynamo.optimize(lambda x: lstm(x))
        with torch.no_grad():
            for steps in (9, 9, 9, 1, 5):
                x = torch.randn(steps, 2, 6)
                (got, (h, c)), (want, (he, ce)) = jit(x), lstm(x)
                for a, b in ((got, want), (h, he), (c, ce)):
                    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
        assert dynamo.counters()["native_runs"] >= 2, (kw, dynamo.report())
