"""Softmax probabilities below float32's normal range (passes.cpp, flush_softmax_subnormals).

A score 100 under its row's max gives a probability near e^-100, a subnormal: eager keeps it,
and a matrix product that reads such values runs at the x86 subnormal penalty. Where only
matrix products read the probabilities, dynamo makes them 0 (the products' results move by
less than row length x 2^-126 x max|values|); where the probabilities themselves can be seen,
they are eager's, subnormals included."""
import torch

import dynamo

TINY = torch.finfo(torch.float32).tiny


def subnormals(t):
    return int(((t != 0) & (t.abs() < TINY)).sum())


def window_attention(q, k, v, mask, w):
    """A shifted window's attention as torchvision's Swin writes it: -100 on the pairs of
    regions that must not see each other, the probabilities into a product, then a projection."""
    b, h, n, d = q.shape
    s = q @ k.transpose(-2, -1) * d ** -0.5 + mask
    p = torch.softmax(s, -1)
    return torch.nn.functional.linear((p @ v).transpose(1, 2).reshape(b, n, h * d), w)


def inputs(n=7, d=8, heads=3):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, heads, n, d, generator=g) for _ in range(2))
    v = torch.randn(2, heads, n, d, generator=g)
    half = n // 2
    v[..., :half, :] = 0  # the first region's values are 0 (a padded region's, with a zero bias)
    region = torch.arange(n) < half
    mask = torch.where(region[:, None] == region[None, :], 0.0, -100.0)
    return q, k, v, mask, torch.randn(heads * d, heads * d, generator=g)


def test_probabilities_read_only_by_products_are_flushed_and_the_results_match():
    q, k, v, mask, w = inputs()
    with torch.no_grad():
        want = window_attention(q, k, v, mask, w)
        assert subnormals(want) > 0  # eager: the first region's rows see only masked values
        fast = dynamo.optimize(window_attention)
        torch.testing.assert_close(fast(q, k, v, mask, w), want, rtol=1e-5, atol=0)  # recorded: eager's
        for _ in range(3):
            got = fast(q, k, v, mask, w)
            tiny = (want != 0) & (want.abs() < TINY)
            assert bool((got[tiny] == 0).all())  # 0 where eager's results are subnormal
            torch.testing.assert_close(got[~tiny], want[~tiny], rtol=1e-4, atol=1e-5)
            assert subnormals(got) == 0
    assert dynamo.counters()["native_runs"] >= 2


def test_probabilities_that_can_be_seen_keep_their_subnormals():
    """Returned, logged, or added to: the probabilities (and their logs) are eager's within
    rounding and with no absolute slack, so their subnormals are there too; the products are
    eager's within rounding."""
    q, k, v, mask, _ = inputs()

    def returned(q, k, v, mask):
        p = torch.softmax(q @ k.transpose(-2, -1) + mask, -1)
        return p @ v, p

    def logged(q, k, v, mask):
        p = torch.softmax(q @ k.transpose(-2, -1) + mask, -1)
        return p @ v, p.log()

    def added(q, k, v, mask):
        p = torch.softmax(q @ k.transpose(-2, -1) + mask, -1)
        return (p + 1e-45) @ v, p + 1e-45

    for fn in (returned, logged, added):
        with torch.no_grad():
            want = fn(q, k, v, mask)
            fast = dynamo.optimize(fn)
            for _ in range(3):
                product, probs = fast(q, k, v, mask)
                torch.testing.assert_close(product, want[0], rtol=1e-4, atol=1e-6)
                torch.testing.assert_close(probs, want[1], rtol=1e-5, atol=0)  # (-inf == -inf: log(0))
                assert subnormals(probs) == subnormals(want[1]), fn.__name__
        if fn is not logged:
            assert subnormals(want[1]) > 0
        else:  # log(e^-100) stays about -100, not -inf
            assert float(probs[torch.isfinite(probs)].min()) < -90
    assert dynamo.counters()["native_runs"] >= 6


def test_a_softmax_without_its_max_subtracted_is_left_alone():
    """e^x / sum(e^x) written out: where every score is far below 0 the probabilities are
    normal only because the subnormals divide each other; nothing may be flushed there."""
    def manual(x, v):
        e = torch.exp(x)
        return (e / e.sum(-1, keepdim=True)) @ v

    x = torch.full((4, 6), -95.0) + torch.arange(6.0)
    v = torch.randn(6, 3)
    with torch.no_grad():
        want = manual(x, v)
        fast = dynamo.optimize(manual)
        for _ in range(3):
            torch.testing.assert_close(fast(x, v), want, rtol=1e-4, atol=1e-6)
    assert bool(torch.isfinite(want).all())
