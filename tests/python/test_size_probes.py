"""Size probes (probe.py): the first call that misses a trace only on tensor sizes runs the
function on fake tensors, once per argument dim, and the dims that can vary become one size
family -- one recording serves every size. Every case compares with eager on every call; the
probes must leave no trace in the program's state (random numbers, buffers, inputs, Python
objects), and a size Python decides on, a size 1 that changes what eager does, or a probe that
fails must leave the trace specialized (then recorded per size, as before)."""
import copy
import gc

import pytest
import torch

import dynamo
from dynamo import config, probe

from test_size_families import sweep as _sweep


def sweep(fn, make, sizes, **tol):
    """test_size_families.sweep, one call per size (probes happen at the first call of a size)."""
    return _sweep(fn, make, sizes, calls=1, **tol)


def test_encoder_layer_over_lengths_and_batches_records_once():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    shapes = [(2, 5), (1, 1), (4, 9), (2, 1), (1, 17), (3, 2), (8, 33), (1, 2), (5, 64)]
    c = sweep(layer, lambda s: (torch.randn(*s, 64),), shapes, atol=1e-4, rtol=1e-4)
    assert c["traces_compiled"] == 1 and c["size_instances"] == len(shapes) - 1, c
    assert c["eager_runs"] == 0 and c["native_runs"] == len(shapes) - 1, c


def test_cnn_over_batch_sizes_records_once():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(16, 5)).eval()
    c = sweep(net, lambda b: (torch.randn(b, 3, 12, 12),), [3, 1, 2, 7, 16, 5], atol=1e-4, rtol=1e-4)
    assert c["traces_compiled"] == 1 and c["size_instances"] == 5, c


def test_two_arguments_sharing_a_size_are_one_variable():
    def f(x, y):
        return (x + y).softmax(-1) * 3

    c = sweep(f, lambda n: (torch.randn(n, 4), torch.randn(n, 4)), [3, 5, 1, 9, 2])
    assert c["traces_compiled"] == 1 and c["size_instances"] == 4, c


_BIAS = torch.randn(8)


def _biased_relu(x):
    return (x + _BIAS).relu() * 0.5


@pytest.mark.parametrize("shapes", [
    [(4, 8), (4, 8), (2, 8), (4, 8), (1, 8), (8,), (3, 8), (8,)],       # a family of rank 2, then rank 1
    [(8,), (8,), (4, 8), (2, 8), (5, 8), (8,), (2, 3, 8), (3, 8)],      # rank 1, a family of rank 2, rank 3
])
def test_a_call_of_another_rank_misses_the_family(shapes):
    """A size family is of one rank per input: a call of another rank misses it (it was bound
    anyway, and indexing its shape past its rank leaked IndexError to the program)."""
    opt = dynamo.optimize(_biased_relu)
    for s in shapes:
        x = torch.randn(*s)
        torch.testing.assert_close(opt(x), _biased_relu(x))
    c = dynamo.counters()
    assert c["size_instances"] >= 1 and c["eager_runs"] == 0, c


def test_broadcast_from_one_stays_one():
    """y's dim 0 is a broadcast 1: a probe of it at 2 fails against x, so it stays constant."""
    def f(x, y):
        return x * y + 1

    c = sweep(f, lambda n: (torch.randn(n, 3), torch.randn(1, 3)), [2, 5, 8, 13, 1])
    assert c["traces_compiled"] == 1 and c["size_instances"] == 4, c


def test_squeeze_at_one_is_not_an_instance():
    """At size 1, squeeze() drops the dim: the probe at 1 shows it, and size 1 is recorded."""
    def f(x):
        return x.squeeze() * 2

    c = sweep(f, lambda n: (torch.randn(n, 4),), [3, 5, 1, 7, 1])
    assert c["traces_compiled"] == 2 and c["size_instances"] == 2, c


def test_a_size_python_decides_on_stays_fixed():
    def f(x):
        if x.shape[0] % 4 > 1:  # (% of a size: a number Python decides with)
            return x.sum(0) * 2
        return x.mean(0) - 1

    c = sweep(f, lambda n: (torch.randn(n, 6),), [3, 4, 5, 8, 2])
    # dim 0 is decided on: each of its sizes recorded; dim 1 never changed
    assert c["size_instances"] == 0 and c["traces_compiled"] == 5, c


def test_a_comparison_of_a_size_is_a_guard_of_the_family():
    """`if x.shape[0] > 4`: the probes' family holds where the comparison comes out as it did
    when recorded; sizes on the other side are recorded (their own family)."""
    def f(x):
        if x.shape[0] > 4:
            return x.sum(0) * 2
        return x.mean(0) - 1

    c = sweep(f, lambda n: (torch.randn(n, 6),), [5, 6, 9, 3, 2, 4, 12, 7])
    assert c["size_instances"] >= 3, c


def test_size_used_as_a_number_but_another_dim_varies():
    def f(x):
        if x.shape[0] > 4:  # dim 0 steers Python; dim 1 only flows into the ops
            return x.sum(0) * 2
        return x.mean(0) - 1

    c = sweep(f, lambda n: (torch.randn(3, n),), [6, 7, 1, 12, 30])
    assert c["traces_compiled"] == 1 and c["size_instances"] == 4, c


def test_probes_draw_no_random_numbers():
    def f(x):
        return x + torch.rand_like(x) * 0.0 + torch.randn(x.shape[-1])  # (randn's size: a constant dim)

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in (3, 5, 9, 2):
            x = torch.randn(n, 4)
            torch.manual_seed(7)
            got = opt(x)
            after = torch.get_rng_state()
            torch.manual_seed(7)
            want = f(x)
            torch.testing.assert_close(got, want)
            assert torch.equal(after, torch.get_rng_state())
    assert dynamo.counters()["size_probes"] >= 1


def test_probes_leave_buffers_and_inputs_alone():
    """Train-mode batch norm under no_grad writes its running stats, and the function writes
    into its input: after every call both are eager's, probes or not."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4).train()
    ref = copy.deepcopy(bn)

    def f(m, x):
        y = m(x)
        x.mul_(2)
        return y

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in (3, 6, 2, 11):
            x = torch.randn(n, 4)
            x2 = x.clone()
            torch.testing.assert_close(opt(bn, x), f(ref, x2))
            torch.testing.assert_close(x, x2)
            torch.testing.assert_close(bn.running_mean, ref.running_mean)
            torch.testing.assert_close(bn.running_var, ref.running_var)
            assert bn.num_batches_tracked == ref.num_batches_tracked


def test_probes_change_no_python_object():
    seen = []

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1  # a store into the module: a stitch; probes must not repeat it
            seen.append(x.shape[0])
            return self.lin(x).relu()

    m = Block()
    opt = dynamo.optimize(m)
    with torch.no_grad():
        for n in (3, 5, 2, 8):
            opt(torch.randn(n, 4))
    assert m.calls == 4 and seen == [3, 5, 2, 8]


def test_non_contiguous_arguments():
    def f(x):
        return (x * 2).sum(-1)

    c = sweep(f, lambda n: (torch.randn(5, n).t(),), [3, 4, 9, 1, 17])
    assert c["traces_compiled"] == 1 and c["size_instances"] == 4, c


def test_in_place_write_into_a_slice():
    def f(x):
        h = x * 1
        h[:, :2] += 1
        return h.softmax(-1)

    c = sweep(f, lambda n: (torch.randn(n, 5),), [3, 4, 1, 10])
    assert c["traces_compiled"] == 1 and c["size_instances"] == 3, c


def test_matmul_and_views_over_two_sizes():
    w = torch.randn(8, 8)

    def f(x):
        b, n, d = x.shape
        h = (x.reshape(b * n, d) @ w).view(b, n, 2, 4).transpose(1, 2)
        return h.reshape(b, 2, n * 4).sum(-1)

    c = sweep(f, lambda s: (torch.randn(*s, 8),), [(2, 3), (3, 5), (1, 7), (4, 1), (6, 6)], atol=1e-5, rtol=1e-5)
    # at n = 1 the last reshape of the transposed tensor is a view, not a copy: the probe at 1
    # shows another program, so n = 1 is recorded apart
    assert c["traces_compiled"] == 2 and c["size_instances"] == 3, c


def test_cat_and_a_scalar_argument():
    def f(x, y, scale):
        return torch.cat([x, y, x], 1) * scale

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for i, n in enumerate([2, 4, 5, 1]):  # (n = 4: x's other dim has that size too)
            x, y = torch.randn(n, 4), torch.randn(n, 3)
            torch.testing.assert_close(opt(x, y, 0.5 * i), f(x, y, 0.5 * i))
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["size_instances"] == 3, c


def test_cat_of_two_sizes_is_their_sum():
    """cat along a dim two arguments vary in gives their sum: each probe varies one of them, and
    the result's size is fitted as an offset of each (the verifier checks it at every instance)."""
    def f(x, y):
        return torch.cat([x, y], 0) * 2

    c = sweep(f, lambda s: (torch.randn(s[0], 4), torch.randn(s[1], 4)), [(2, 3), (4, 3), (5, 2), (4, 3), (9, 7)])
    assert c["size_instances"] >= 2 and c["traces_compiled"] == 1, c


def test_zero_size_stays_specialized():
    def f(x):
        return x.exp().sum(0)

    c = sweep(f, lambda n: (torch.randn(n, 3),), [3, 5, 0, 7])
    assert c["traces_compiled"] == 2 and c["size_instances"] == 2, c


def test_a_failing_probe_leaves_the_call_to_recording(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("injected probe failure")

    monkeypatch.setattr(probe, "run", broken)

    def f(x):
        return (x * 2).relu()

    c = sweep(f, lambda n: (torch.randn(n, 3),), [3, 5, 9])
    # the probe failed: the second size was recorded, a family made from the two recordings
    assert c["traces_compiled"] == 2 and c["size_instances"] == 1 and c["eager_runs"] == 0, c


def test_size_probes_off():
    config.size_probes = False
    try:
        def f(x):
            return (x * 2).relu()

        c = sweep(f, lambda n: (torch.randn(n, 3),), [3, 5, 9])
        assert c["traces_compiled"] == 2 and c["size_instances"] == 1 and c["size_probes"] == 0, c
    finally:
        config.size_probes = True


def test_dynamic_false_probes_only_marked_dims():
    def f(x):
        return (x * 2).sum(-1)

    old = config.dynamic
    config.dynamic = False
    try:
        c = sweep(f, lambda n: (dynamo.mark_dynamic(torch.randn(n, 4), 0),), [2, 3, 5, 9])
        assert c["traces_compiled"] == 1 and c["size_instances"] == 3, c
        dynamo.reset()
        c = sweep(f, lambda n: (dynamo.mark_dynamic(torch.randn(3, n), 0),), [2, 3, 5])
        assert c["traces_compiled"] == 3 and c["size_instances"] == 0, c
        dynamo.reset()
        c = sweep(f, lambda n: (torch.randn(n, 4),), [2, 3])  # nothing marked: no probe
        assert c["size_probes"] == 0 and c["traces_compiled"] == 2, c
    finally:
        config.dynamic = old


def test_explain_and_log_name_the_variables(capfd):
    def f(x):
        return x.softmax(-1) + 1

    old = config.log
    config.log = {"recompiles"}
    try:
        opt = dynamo.optimize(f)
        with torch.no_grad():
            for n in (3, 6, 2):
                opt(torch.randn(n, 5))
    finally:
        config.log = old
    err = capfd.readouterr().err
    assert "size family from" in err and "probes of trace 1" in err, err
    assert "s0 = a[0].size(0) >= 1; s1 = a[0].size(1) >= 1" in err, err
    assert "s0 = a[0].size(0) >= 1" in str(dynamo.explain(opt, torch.randn(4, 5)))


@pytest.mark.parametrize("n", [1, 7, 1023])
def test_odd_sizes_after_a_probe(n):
    def f(x, y):
        return torch.where(x > 0, x * y, y.exp()).sum(0)

    c = sweep(f, lambda m: (torch.randn(m, 3), torch.randn(m, 3)), [4, 6, n], atol=1e-5, rtol=1e-5)
    assert c["traces_compiled"] == 1, c


def test_a_sweep_of_sizes_does_not_time_convolutions_at_every_size():
    """One call per batch size: from the third instance on, convolutions nobody has timed start on
    oneDNN's direct kernel (no timing of three paths at every size); an instance that gets hot at
    its size gets a fresh entry that times them (frontend.RETIME_AFTER runs)."""
    from dynamo import frontend
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1)).eval()
    ref = copy.deepcopy(net)
    opt = dynamo.optimize(net)
    with torch.no_grad():
        for b in range(2, 9):
            x = torch.randn(b, 3, 16, 16)
            torch.testing.assert_close(opt(x), ref(x), atol=1e-4, rtol=1e-4)
    ofs = [o for o in gc.get_objects() if isinstance(o, frontend.OptimizedFunction) and o.families]
    assert len(ofs) == 1
    last = ofs[0].compiled[-1]
    assert last.family is not None and last.retime_at == frontend.RETIME_AFTER, last.retime_at
    choices = last.entry.choices()
    assert "=onednn" in choices and "winograd" not in choices, choices
    handle = last.handle
    x = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        for _ in range(frontend.RETIME_AFTER + 3):
            torch.testing.assert_close(opt(x), ref(x), atol=1e-4, rtol=1e-4)
    assert last.handle is not handle and last.retimer is None


def test_a_sweep_of_sizes_does_not_time_products_at_every_size():
    """One call per batch size: from the third instance on, products nobody has timed start on
    LibTorch's BLAS (eager's path) instead of running all three sides on their first calls."""
    from dynamo import frontend
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).eval()
    ref = copy.deepcopy(net)
    opt = dynamo.optimize(net)
    with torch.no_grad():
        for b in range(40, 47):
            x = torch.randn(b, 64)
            torch.testing.assert_close(opt(x), ref(x), atol=1e-5, rtol=1e-5)
    ofs = [o for o in gc.get_objects() if isinstance(o, frontend.OptimizedFunction) and o.families]
    assert len(ofs) == 1
    last = ofs[0].compiled[-1]
    assert last.family is not None and last.retime_at == frontend.RETIME_AFTER, last.retime_at
    choices = last.entry.choices().split()
    assert len(choices) >= 2 and all(w.endswith("=blas") for w in choices), choices


def test_a_miss_on_strides_alone_runs_no_probe():
    """Same sizes, other strides (a backward graph's gradients come in either layout): a new
    recording, no probes (they look for sizes)."""
    def f(x):
        return (x * 2).relu().sum(-1)

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for x in (torch.randn(4, 6), torch.randn(6, 4).t(), torch.randn(4, 6)):
            torch.testing.assert_close(opt(x), f(x))
    c = dynamo.counters()
    assert c["size_probes"] == 0 and c["traces_compiled"] == 2, c


def test_probes_per_family_are_capped():
    def f(*xs):
        return sum((x * (i + 1)).sum(0) for i, x in enumerate(xs))

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in (3, 5, 7):
            xs = [torch.randn(n, 4) for _ in range(12)]
            torch.testing.assert_close(opt(*xs), f(*xs))
    # dims probed up to the cap, then at most one probe at size 1 per variable and one for all at 1
    from dynamo import sizes
    assert dynamo.counters()["size_probes"] <= probe.MAX_RUNS + sizes.MAX_VARS + 1, dynamo.counters()


class _KV:
    """A key/value cache as Hugging Face's layers hold one: tensors in attributes, grown by a
    write-back each step."""

    def __init__(self, k, v):
        self.k, self.v = k, v


def _decode(q, mask, cache):
    past = cache.k.shape[0]
    kv_length = past + q.shape[0]
    if mask.shape[0] - kv_length > 0:
        mask = mask[:kv_length]
    if mask.all():  # (a side exit, before the write-backs as in Hugging Face's mask code: the
        bias = torch.zeros(kv_length)  # probes take the branch the recording took)
    else:
        bias = (~mask).float() * -1e9
    cache.k = torch.cat([cache.k, q], 0)  # (write-backs: set again after each native run)
    cache.v = torch.cat([cache.v, q * 2], 0)
    scores = q @ cache.k.T + bias + torch.arange(past, kv_length).float()
    return scores.softmax(-1) @ cache.v


def test_a_decode_step_with_a_cache_object_and_a_side_exit_records_once():
    """The probes vary the cache's tensors (read from an object, not arguments) together with the
    mask one longer (a difference, not a ratio), follow the recorded branch, and keep the
    write-backs to themselves: the second length is served without a second recording, and every
    call (the exit taken too) matches eager, the caches included."""
    opt = dynamo.optimize(_decode)
    torch.manual_seed(0)
    k0, v0 = torch.randn(3, 8), torch.randn(3, 8)
    ce, cd = _KV(k0.clone(), v0.clone()), _KV(k0.clone(), v0.clone())
    before = dict(dynamo.counters())
    with torch.no_grad():
        for step in range(12):
            q = torch.randn(1, 8)
            mask = torch.ones(ce.k.shape[0] + 1, dtype=torch.bool)
            if step >= 8:
                mask[0] = False  # (the exit: the other branch)
            want, got = _decode(q, mask, ce), opt(q, mask.clone(), cd)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(cd.k, ce.k)
            torch.testing.assert_close(cd.v, ce.v)
    c = dynamo.counters()
    assert c["traces_compiled"] - before["traces_compiled"] == 1, c
    assert c["size_instances"] - before["size_instances"] >= 8 and c["eager_runs"] == before["eager_runs"], c


def _decode_in_place(q, cache):
    cache.k[: q.shape[0]].add_(q)  # (writes into the cache's tensor: the trace mutates an input)
    return (q @ cache.k.T).softmax(-1) @ cache.k


@pytest.mark.parametrize("program", ["write-backs", "in place"])
def test_the_base_probe_runs_on_the_call_s_own_tensors_where_the_trace_writes_into_none(monkeypatch, program):
    """A decode step's probe at the call's own sizes runs its ops on the real tensors (a FakeTensor
    run costs 2-3x a recording) -- unless the trace writes into an input, whose probe stays on
    fakes. Either way the probe changes nothing (the caches, the random generator) and every call
    matches eager."""
    calls = []
    real_run = probe.run

    def spy(*a, **k):
        calls.append(k.get("real", False))
        return real_run(*a, **k)
    monkeypatch.setattr(probe, "run", spy)
    fn = _decode if program == "write-backs" else _decode_in_place
    opt = dynamo.optimize(fn)
    torch.manual_seed(0)
    k0, v0 = torch.randn(3, 8), torch.randn(3, 8)
    ce, cd = _KV(k0.clone(), v0.clone()), _KV(k0.clone(), v0.clone())
    with torch.no_grad():
        for step in range(6):
            q = torch.randn(1 if program == "write-backs" else 2 + step, 8)
            args = (torch.ones(ce.k.shape[0] + 1, dtype=torch.bool),) if program == "write-backs" else ()
            if program == "in place":
                ce.k = torch.randn(4 + step, 8)
                cd.k = ce.k.clone()
            state = torch.get_rng_state()
            want = fn(q, *args, ce)
            got = opt(q, *[a.clone() for a in args], cd)
            assert torch.equal(torch.get_rng_state(), state)  # (nothing here draws a number)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(cd.k, ce.k)
    assert calls and calls[0] == (program == "write-backs"), calls
    assert dynamo.counters()["size_instances"] >= 3, dynamo.counters()
