"""Reductions over dims on both sides of a kept dim (a batch norm's statistics or weight
gradient: sum over [0, 2, 3] of [N, C, H, W]) followed by row-level work (times a per-channel
tensor, plus a bias): the row's epilogue runs after the loops over the outer reduced dims, and
must not use loads the inner loop hoisted inside them (found by the backward of resnet18's
batch norms: LLVM's verifier refused the kernel, "Instruction does not dominate all uses")."""
import pytest
import torch

import dynamo

SHAPES = [(8, 128, 8, 8), (2, 16, 3, 5), (3, 7, 1, 2), (1, 5, 4, 3), (4, 1, 2, 9)]


def bn_weight_grad(x, g, mean, a):
    return ((x - mean[None, :, None, None]) * g).sum([0, 2, 3]) * a


def scaled_sum(x, a, b):
    return x.sum([0, 2, 3]) * a + b


def channel_max(x, a):
    return x.amax([0, 2]) - a[:, None]


@pytest.mark.parametrize("shape", SHAPES)
def test_reduction_over_outer_and_inner_dims_with_an_epilogue(shape):
    n, c, h, w = shape
    fns = [
        (bn_weight_grad, lambda: (torch.randn(shape), torch.randn(shape), torch.randn(c), torch.rand(c) + 0.5)),
        (scaled_sum, lambda: (torch.randn(shape), torch.randn(c), torch.randn(c))),
        (channel_max, lambda: (torch.randn(shape), torch.randn(c))),
    ]
    for fn, make in fns:
        jit = dynamo.optimize(fn)
        before = dynamo.counters()
        with torch.no_grad():
            for _ in range(3):
                args = make()
                want, got = fn(*args), jit(*args)
                assert got.shape == want.shape
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (fn.__name__, (got - want).abs().max())
        after = dynamo.counters()
        assert after["compile_failures"] == before["compile_failures"], dynamo.report()
        assert after["native_runs"] - before["native_runs"] >= 2, (fn.__name__, dynamo.report())
