"""torch.stack of 2-4 tensors of one dtype and shape compiled as where() over the positions along
the new dim (jit/decompose.cpp, rewrite_stack): fused with what produces and reads it, no LibTorch
call but the aten::arange of the positions, computed once and kept. Every case compared with eager
(a copy: bit-equal), several calls, each stacking dim, float/half/int/bool values, views; what it
does not cover (5 tensors, mixed dtypes) stays the extern and is still right."""
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
