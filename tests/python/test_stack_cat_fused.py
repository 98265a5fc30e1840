"""torch.stack of 2-4 tensors of one dtype and shape, and torch.cat of 2-4 of one dtype, compiled as
where() over the positions along the dim (jit/decompose.cpp, rewrite_stack / rewrite_cat; cat's
inputs gathered at their clamped positions): fused with what reads them, no LibTorch call but the
aten::arange of the positions, computed once and kept. Every case compared with eager (a copy:
bit-equal), several calls, each dim, float/half/int/bool values, views, uneven pieces; what it
does not cover (5 tensors, mixed dtypes, empty pieces, a 4-D concatenation of channels) stays the
extern and is still right."""
import pytest
import torch

import dynamo


def run(f, make, calls=3, fused=True):
    dynamo.reset()
    opt = dynamo.optimize(f)
    for _ in range(calls):
        args = make()
        want, got = f(*args), opt(*args)
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    assert dynamo.counters()["native_runs"] >= calls - 1, dynamo.report()
    text = dynamo.report()
    # fused: the one LibTorch call left is the positions' arange, kept between calls
    assert ("computed from weights alone" in text) == fused, text


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_dim_and_count(dim, n):
    def f(*ts):
        return torch.stack([t * (k + 1) for k, t in enumerate(ts)], dim) + 1

    run(f, lambda: tuple(torch.randn(3, 1, 7) for _ in range(n)))


def test_rotary_interleave_of_strided_views():
    """The rotary-embedding idiom: -x[..., 1::2] and x[..., ::2] stacked last, then reshaped."""
    def f(x, cos, sin):
        rot = torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)
        return x * cos + rot * sin

    run(f, lambda: (torch.randn(1, 3, 17, 64), torch.randn(17, 64), torch.randn(17, 64)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.int32, torch.bool])
def test_other_dtypes(dtype):
    def f(a, b):
        return torch.stack([a, b], 1)

    def make():
        a, b = torch.randn(4, 5) * 10, torch.randn(4, 5) * 10
        return (a > 0, b > 0) if dtype == torch.bool else (a.to(dtype), b.to(dtype))
    run(f, make)


def test_empty_and_size_one():
    run(lambda a, b: torch.stack([a, b], 0), lambda: (torch.randn(0, 3), torch.randn(0, 3)))
    run(lambda a, b: torch.stack([a, b], -1) * 2, lambda: (torch.randn(1), torch.randn(1)))


def test_what_it_does_not_cover_stays_the_extern():
    run(lambda *ts: torch.stack(ts, 0) * 2, lambda: tuple(torch.randn(2, 3) for _ in range(5)), fused=False)
    run(lambda a, b: torch.stack([a, b], 0) * 2, lambda: (torch.randn(2, 3), torch.randn(2, 3).double()),
        fused=False)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("sizes", [(1, 16), (5, 3, 9), (2, 2, 2, 1)])
def test_cat_each_dim_and_uneven_pieces(dim, sizes):
    def f(*ts):
        return torch.cat([t * (k + 1) for k, t in enumerate(ts)], dim) - 1

    def make():
        shape = [3, 4, 6]
        out = []
        for s in sizes:
            shape[dim] = s
            out.append(torch.randn(shape))
        return tuple(out)
    run(f, make)


def test_cat_rotary_halves_and_a_class_token():
    """llama's rotate_half (cat of -x2 and x1 along the last dim) and a class token kept apart
    (cat along the tokens) -- eva02's rotary embedding."""
    def f(x, cos, sin):
        x1, x2 = x[..., :32], x[..., 32:]
        y = x * cos + torch.cat((-x2, x1), dim=-1) * sin
        return torch.cat([x[:, :, :1], y[:, :, 1:]], dim=2)

    run(f, lambda: (torch.randn(1, 3, 17, 64), torch.randn(17, 64), torch.randn(17, 64)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.bool])
def test_cat_other_dtypes(dtype):
    def make():
        a, b = torch.randn(4, 5) * 10, torch.randn(4, 2) * 10
        return (a > 0, b > 0) if dtype == torch.bool else (a.to(dtype), b.to(dtype))
    run(lambda a, b: torch.cat([a, b], 1), make)


def test_cat_it_does_not_cover_stays_the_extern():
    run(lambda *ts: torch.cat(ts, 0) * 2, lambda: tuple(torch.randn(2, 3) for _ in range(5)), fused=False)
    run(lambda a, b: torch.cat([a, b], 0) * 2, lambda: (torch.randn(2, 3), torch.randn(0, 3)), fused=False)
    run(lambda a, b: torch.cat([a, b], 1) * 2, lambda: (torch.randn(1, 2, 3, 3), torch.randn(1, 4, 3, 3)),
        fused=False)


def test_cat_over_changing_sizes_shares_machine_code():
    """The positions and spans of a cat are computed by externs from its sizes, not written into
    its kernels: the traces of other sizes along the cat dim share one compiled code (with them
    as literals every size compiled its own, and the function hit its cache limit at 8)."""
    dynamo.reset()

    def f(x, y):
        return torch.cat([x[:, :1], y * 2], dim=1) * 2
    opt = dynamo.optimize(f)
    for n in range(2, 16):
        x, y = torch.randn(4, n), torch.randn(4, n + 3)
        assert torch.equal(opt(x, y), f(x, y))
    c = dynamo.counters()
    assert c["code_shared"] >= 10 and c["eager_runs"] == 0, c
