"""Size families (sizes.py): after two recordings of one program at other sizes, further sizes get
an instance of the trace compiled without a recording. Every case compares with eager at each
size: a size fitted wrongly, or a trace generalized where the program depends on a size, would
show as a wrong value, shape or count."""
import copy

import pytest
import torch

import dynamo
from dynamo import config


@pytest.fixture(autouse=True)
def families_from_recordings():
    """These tests are about size families made from recordings: size probes are off here
    (test_size_probes.py has the same kinds of programs with probes)."""
    old = dynamo.config.size_probes
    dynamo.config.size_probes = False
    yield
    dynamo.config.size_probes = old


def sweep(fn, make, sizes, calls=2, **tol):
    """fn optimized, called on make(n) for each n (calls times), compared with eager each time
    (a module is optimized in place: eager is a copy made before)."""
    ref = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    opt = dynamo.optimize(fn)
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            want = ref(*args)
            for _ in range(calls):
                torch.testing.assert_close(opt(*args), want, **tol)
    return dynamo.counters()


def test_encoder_layer_over_lengths_records_twice():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).eval()
    lengths = [5, 9, 2, 3, 17, 33, 64, 100, 7]
    c = sweep(layer, lambda n: (torch.randn(2, n, 64),), lengths, atol=1e-4, rtol=1e-4)
    assert c["traces_compiled"] == 2, c
    assert c["size_instances"] == len(lengths) - 2, c
    assert c["interpreted_runs"] == 2 and c["eager_runs"] == 0, c
    assert c["native_runs"] == 2 * len(lengths) - 2, c


def test_batch_then_length_widens_the_family():
    """lengths first (variable s0), then a new batch size: the third recording adds s1, and
    every other (batch, length) pair is an instance."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 24)

    def f(x):
        return torch.softmax(lin(x).relu(), -1).sum(1)

    pairs = [(2, 5), (2, 9), (3, 9), (4, 7), (5, 11), (2, 30), (7, 2)]
    c = sweep(f, lambda p: (torch.randn(p[0], p[1], 16),), pairs)
    assert c["traces_compiled"] == 3, c
    assert c["size_instances"] == len(pairs) - 3, c


def test_cnn_over_batch_sizes():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)).eval()
    c = sweep(net, lambda b: (torch.randn(b, 3, 16, 16),), [2, 3, 4, 9, 16, 5], atol=1e-4, rtol=1e-4)
    assert c["traces_compiled"] == 2 and c["size_instances"] == 4, c


def test_size_one_and_zero_get_traces_of_their_own():
    def f(x, y):
        return (x * y).sum(0) + x.mean()

    sizes = [4, 6, 1, 9, 0, 12]
    c = sweep(f, lambda n: (torch.randn(n, 5), torch.randn(n, 1)), sizes, equal_nan=True)
    assert c["size_instances"] == 2, c  # 9 and 12; 1 and 0 recorded


def test_broadcast_from_one_is_not_a_variable():
    """y's dim 0 is 1 in both samples while x's varies: broadcasting stays as recorded."""
    def f(x, y):
        return x + y

    c = sweep(f, lambda n: (torch.randn(n, 3), torch.randn(1, 3)), [2, 5, 8, 13])
    assert c["size_instances"] == 2, c


def test_a_size_read_in_python_keeps_traces_apart():
    def f(x):
        n = x.shape[1]
        if n > 6:  # a branch on the size: a family serves the small branch only where n <= 6
            return x[:, : n // 2] * 2
        return x.view(x.size(0), -1) + 1

    c = sweep(f, lambda n: (torch.randn(3, n),), [4, 5, 6, 8, 10, 14])
    # 4 and 5 make a family guarded by n > 6 being False: 6 is its instance; the large branch
    # slices at n // 2 (a bound Python computed): its sizes are recorded each
    assert c["size_instances"] == 1 and c["traces_compiled"] == 5, c


def test_a_comparison_of_sizes_is_a_guard_of_the_family():
    """`if n > 6` over sizes on both sides of 6, in an order where a family forms first on one
    side: every call is eager's, and the other side is never served by the family."""
    def f(x, y):
        n, m = x.shape[0], y.shape[0]
        if n + 1 > m:
            return (x[:m - 1] * 2).sum(0) + y.sum()
        return x.sum(0) - y[:n + 1].sum(0)

    pairs = [(3, 5), (4, 6), (5, 7), (6, 5), (9, 11), (7, 3), (12, 9), (2, 9)]
    it = iter(pairs)
    c = sweep(f, lambda _: tuple(torch.randn(k, 4) for k in next(it)), list(range(len(pairs))))
    assert c["size_instances"] >= 2, c


def test_len_of_a_tensor_is_a_size_read():
    """len(x) multiplies x: the scalar of the op line is the size Python computed (sizeflow's
    polynomial), so instances put each call's length there."""
    def f(x):
        return x * len(x) + (x.shape[0] - 1)

    c = sweep(f, lambda n: (torch.randn(n, 2),), [3, 4, 5, 6, 11])
    assert c["size_instances"] == 3, c


def test_a_size_through_floor_division_into_an_op_is_not_varied():
    """n // 4 has no polynomial: at lengths 8 and 9 it is 2 both times, and an instance at 12
    would multiply by 2 where eager multiplies by 3."""
    def f(x):
        return x * (x.shape[0] // 4)

    c = sweep(f, lambda n: (torch.randn(n, 2),), [8, 9, 12, 13])
    assert c["size_instances"] == 0, c


def test_clamped_slice_stays_a_constant():
    """x[:, :6] at lengths 4 and 5 keeps everything; at 8 it keeps 6 columns. The instance for 8
    must not fit the end to the length: the verifier rejects the fitted type and the call is
    recorded."""
    def f(x):
        return x[:, :6] * 3

    c = sweep(f, lambda n: (torch.randn(2, n),), [4, 5, 8, 10, 12])
    assert c["eager_runs"] == 0, c


def test_slices_to_the_end_and_from_the_start():
    def f(x):
        return x[:, 1:] - x[:, :-1], x[:, 2:].sum(1), x[:, :3].sum()

    c = sweep(f, lambda n: (torch.randn(3, n),), [4, 6, 9, 20, 7])
    # x[:, :-1] ends at the length minus one: not a product of sizes, so no family forms
    assert c["traces_compiled"] + c["size_instances"] == 5, c


def test_split_along_the_varying_dim_is_not_generalized():
    def f(x):
        return [p.sum(1) for p in x.split(4, 1)]

    c = sweep(f, lambda n: (torch.randn(2, n),), [6, 7, 12, 13, 5])
    assert c["size_instances"] == 0, c


def test_two_inputs_sharing_a_size():
    def f(x, y):
        return (x @ y).relu()

    c = sweep(f, lambda n: (torch.randn(n, 8), torch.randn(8, n)), [3, 5, 11, 40])
    assert c["size_instances"] == 2, c
    # sizes that differ from each other are not the family's (it needs them equal)
    dynamo.reset()
    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n, m in [(3, 3), (5, 5), (6, 9), (9, 6)]:
            x, y = torch.randn(n, 8), torch.randn(8, m)
            torch.testing.assert_close(opt(x, y), f(x, y))


def test_sizes_changing_in_step_do_not_form_a_family():
    """Both dims double: a token equal to one of them cannot be told from the other."""
    def f(x):
        return x.t().reshape(-1) * 2

    c = sweep(f, lambda n: (torch.randn(n, n + 1 if n % 2 else n * 2),), [2, 4, 8, 3])
    assert c["eager_runs"] == 0


def test_in_place_writes_at_other_sizes():
    def f(x, y):
        x.mul_(2).add_(y)
        return x.sum(1)

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in [3, 4, 7, 9, 30]:
            x, y = torch.randn(n, 5), torch.randn(n, 5)
            x2 = x.clone()
            got = opt(x, y)
            want = f(x2, y)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(x, x2)
    assert dynamo.counters()["size_instances"] == 3


def test_non_contiguous_inputs():
    def f(x):
        return (x * 2).softmax(-1)

    c = sweep(f, lambda n: (torch.randn(7, n).t(),), [3, 5, 9, 12])
    assert c["size_instances"] == 2, c
    # a contiguous input of a size the family serves: its strides are not the family's
    opt = dynamo.optimize(f)
    x = torch.randn(20, 7)
    torch.testing.assert_close(opt(x), f(x))


def test_dynamic_false_specializes_every_size():
    old = config.dynamic
    config.dynamic = False
    try:
        c = sweep(lambda x: x.exp() + 1, lambda n: (torch.randn(n, 4),), [3, 5, 9])
    finally:
        config.dynamic = old
    assert c["size_instances"] == 0 and c["traces_compiled"] == 3, c


def test_fifty_float_scales_compile_once():
    def f(x, scale):
        return torch.softmax(x * scale, -1)

    opt = dynamo.optimize(f)
    x = torch.randn(4, 16)
    for k in range(50):
        s = 0.1 + k * 0.37
        torch.testing.assert_close(opt(x, s), f(x, s))
    assert dynamo.counters()["traces_compiled"] == 1


def test_explain_names_the_size_variables():
    def f(x):
        return x.relu() * 2

    opt = dynamo.optimize(f)
    for n in [3, 4, 5]:
        opt(torch.randn(n, 2))
    fam = opt.families[0]
    assert "a[0].size(0) >= 2" in fam.describe(), fam.describe()


@pytest.mark.parametrize("sizes", [[2, 3, 5], [10, 20, 30, 7]])
def test_pointwise_broadcast_and_reductions(sizes):
    b = torch.randn(6)

    def f(x):
        y = (x + b).exp()
        return y.sum(-1), y.amax(0), (y / y.sum(0, keepdim=True)).mean()

    sweep(f, lambda n: (torch.randn(n, 6),), sizes, atol=1e-5, rtol=1e-4)


def test_cat_and_views_over_the_varying_dim():
    def f(x, y):
        z = torch.cat([x, y], 1)
        return z.transpose(0, 1).reshape(-1, 2).sum(0), z.unsqueeze(0).expand(3, -1, -1).sum(0)

    c = sweep(f, lambda n: (torch.randn(4, n), torch.randn(4, 3)), [2, 6, 9, 21])
    assert c["eager_runs"] == 0


def test_a_rank_0_input_before_the_varying_one():
    """A 0-dim tensor input has no number in its IR line; it is a slot all the same, so the
    sizes of the inputs after it are theirs (they were taken for the one before: an instance
    bound its variables to the wrong tensor, or raised IndexError)."""

    def f(s, x, y):
        return x * s + y.sum(), (s * 2).floor()

    c = sweep(f, lambda n: (torch.tensor(1.5), torch.randn(n, 8), torch.randn(3, n)), [3, 4, 5, 7, 9])
    assert c["size_instances"] >= 2, c


def test_a_rank_0_input_and_a_passed_through_one():
    """(the fuzzer's program: the traced op reads only the 0-dim input, the others are returned)"""

    def f(s, a, b):
        torch.floor(s)
        return b, {"k": [a]}

    opt = dynamo.optimize(f)
    for n in [4, 5, 4, 6, 7]:
        args = (torch.randn(()), torch.randn(n, 1, dtype=torch.float64), torch.randn(1, 8, 1).transpose(-1, -2))
        got, want = opt(*args), f(*args)
        assert got[0] is args[2] or torch.equal(got[0], want[0])
        assert torch.equal(got[1]["k"][0], want[1]["k"][0])


def _cache_step(k, v, mask, q):
    """A decode step in miniature: a cache grown by one, a mask one longer than the cache was,
    sizes Python computes and compares, an arange over a computed length, a slice to a computed
    bound, a branch on the mask's values (a side exit)."""
    past = k.shape[0]
    kv_length = past + q.shape[0]
    if mask.shape[0] - kv_length > 0:  # (never here: the mask is as long as the keys will be)
        mask = mask[:kv_length]
    k = torch.cat([k, q], 0)
    v = torch.cat([v, q * 2], 0)
    pos = torch.arange(past, kv_length)
    scores = (q @ k.T) / k.shape[-1] ** 0.5
    if mask.all():
        w = scores.softmax(-1)
    else:
        w = scores.masked_fill(~mask, -1e9).softmax(-1)
    out = w @ v + pos.float().unsqueeze(-1)
    return out, k[: kv_length - 1].sum(0), k, v


@pytest.mark.parametrize("masked_from", [None, 9])
def test_a_decode_step_over_cache_lengths_is_one_family(masked_from):
    """One family over cache lengths 2..24 (in a shuffled order, after the first two): every
    call matches eager, including the calls that take the side exit (mask with zeros)."""
    opt = dynamo.optimize(_cache_step)
    torch.manual_seed(0)
    lengths = [3, 4] + [12, 2, 7, 24, 5, 16, 9, 6, 21, 10]
    before = dict(dynamo.counters())
    with torch.no_grad():
        for n in lengths:
            k, v, q = torch.randn(n, 8), torch.randn(n, 8), torch.randn(1, 8)
            mask = torch.ones(n + 1, dtype=torch.bool)
            if masked_from is not None and n >= masked_from:
                mask[0] = False
            want = _cache_step(k, v, mask, q)
            got = opt(k, v, mask, q)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)
    c = dynamo.counters()
    assert c["size_instances"] - before["size_instances"] >= 6, c
    assert c["traces_compiled"] - before["traces_compiled"] <= 3, c


@pytest.mark.parametrize("seed", range(6))
def test_sizes_python_computes_follow_each_call(seed):
    """Programs over two lengths n and m with the size arithmetic and comparisons that size
    families now follow (sums, differences, comparisons both ways, computed slice bounds and
    op arguments), called at random sizes: every call is eager's."""
    import random
    rnd = random.Random(seed)

    def f(x, y):
        n, m = x.shape[0], y.shape[0]
        d = n - m
        if d > 1:
            z = x[: m + 1] * 2 + y.sum()
        elif n + m >= 9:
            z = torch.cat([x, y], 0)[1:n] - 1
        else:
            z = x.new_zeros(n + 2) + torch.arange(n + 2).float()
        return z.sum() * (n + m), torch.arange(m, n + m).float().mean(), y[m // 2:] + 1

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(14):
            n, m = rnd.randint(2, 9), rnd.randint(2, 9)
            x, y = torch.randn(n), torch.randn(m)
            want, got = f(x, y), opt(x, y)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b)


def _masked_scores(q, k, mask):
    m = mask[:, : k.shape[0]]  # (the whole mask where it is as long as k: an alias whose bound is a size)
    return (q @ k.T) + m


def test_a_slice_that_keeps_a_whole_dim_by_a_computed_bound_is_a_guard():
    """x[:, :n] with n the size of that dim is an alias: the family holds where the bound still
    covers the dim, and a longer mask (a real slice) is recorded apart; every call is eager's."""
    opt = dynamo.optimize(_masked_scores)
    before = dynamo.counters()["size_instances"]
    with torch.no_grad():
        for n, extra in [(3, 0), (4, 0), (7, 0), (5, 2), (9, 0), (6, 1), (12, 0)]:
            q, k, mask = torch.randn(2, 8), torch.randn(n, 8), torch.randn(1, n + extra)
            torch.testing.assert_close(opt(q, k, mask), _masked_scores(q, k, mask))
    assert dynamo.counters()["size_instances"] - before >= 3


def test_a_call_tries_only_the_instance_at_its_sizes(monkeypatch):
    """With many instances of one family, a call checks the family's guards once and runs
    natively only the trace at its own sizes, an instance or the recorded trace the family was
    made from: one at other sizes would only cost a native guard miss (by keyword, as generate()
    calls a forward: the positional shapes order nothing). Every call still matches eager."""
    from dynamo import tracetree
    tried = []
    real_run = tracetree.Compiled.run

    def counting_run(self, inputs):
        tried.append(self)
        return real_run(self, inputs)

    def step(k, mask, q):
        return (q @ k.T).masked_fill(~mask[: k.shape[0]], -1e9).softmax(-1) @ k

    opt = dynamo.optimize(step)
    torch.manual_seed(0)
    lengths = [3, 4] + list(range(5, 25))
    with torch.no_grad():
        for n in lengths:  # recordings, then an instance per length
            k, q, mask = torch.randn(n, 8), torch.randn(1, 8), torch.ones(n + 1, dtype=torch.bool)
            torch.testing.assert_close(opt(k=k, mask=mask, q=q), step(k, mask, q))
        monkeypatch.setattr(tracetree.Compiled, "run", counting_run)
        for n in reversed(lengths):
            k, q, mask = torch.randn(n, 8), torch.randn(1, 8), torch.ones(n + 1, dtype=torch.bool)
            tried.clear()
            torch.testing.assert_close(opt(k=k, mask=mask, q=q), step(k, mask, q))
            assert len(tried) == 1, (n, len(tried))
    assert dynamo.counters()["size_instances"] >= len(lengths) - 3
