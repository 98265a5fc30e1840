"""Float sums and means over leading dims (every reduced dim of more than one element before
every kept one, at least 16 elements kept) -- a linear layer's bias gradient `g.sum(0)`, layer
norm's weight gradients over [B, T, C] -- stay extern steps `aten::sum.dim_IntList` /
`aten::mean.dim` (jit/decompose.cpp `column_reduction`: a row kernel walks each kept element's
column with strided gathers, ~10x eager's time), run by the runtime's column sum where the input
is contiguous with at least 64 kept elements (runtime/aten_extern.cpp `own_column_sum`), by
LibTorch otherwise. Values compared with eager on random inputs (odd sizes, long columns,
keepdim, negative dims, a fused producer, a transposed input, size-1 dims); the row cases and
tiny reductions stay compiled kernels."""
import pytest
import torch

import dynamo


def run(f, make, libtorch_calls, calls=3):
    dynamo.reset()
    opt = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(calls):
            args = make()
            want, got = f(*args), opt(*args)
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= calls - 1, dynamo.report()
    text = dynamo.report()
    assert f"{libtorch_calls} LibTorch call(s)" in text, text


@pytest.mark.parametrize("shape,dims,keep", [
    ((64, 1024), 0, False), ((7, 1023), 0, True), ((8, 64, 256), (0, 1), False),
    ((1, 33, 48), 1, False), ((2, 5, 16), (0, 1), True), ((300, 17), (0,), False),
    ((8192, 64), 0, False), ((4, 6, 130), (-3, -2), True), ((3, 200), (0,), True)])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_column_reductions_run_as_extern_steps(shape, dims, keep, op):
    def f(x):
        return getattr(x * 2.0, op)(dims, keepdim=keep) + 1.0
    run(f, lambda: (torch.randn(*shape),), libtorch_calls=1)


def test_bias_gradient_after_gelu_backward():
    """The MLP backward's GELU' (as torch._decomp writes it for AOTAutograd) then its column sum:
    the GELU' a kernel, the sum ATen's."""
    def f(g, h):
        cdf = 0.5 * (1.0 + torch.erf(h * 0.7071067811865476))
        pdf = torch.exp(-0.5 * h * h) * 0.3989422804014327
        d = g * (cdf + h * pdf)
        return d, d.sum(0, keepdim=True)

    def make():
        return torch.randn(64, 1024), torch.randn(64, 1024)
    dynamo.reset()
    opt = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(3):
            a = make()
            for w, g in zip(f(*a), opt(*a)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert "1 LibTorch call(s)" in dynamo.report(), dynamo.report()


@pytest.mark.parametrize("case", ["rows", "transposed", "few_kept", "tiny", "empty", "all"])
def test_other_reductions_stay_kernels(case):
    """Reductions over trailing dims, a transposed input's sum(0) (a row reduction in memory,
    but the rule reads logical dims: ATen then, still right), fewer than 16 kept elements,
    reductions small enough to unroll, an empty reduced dim and a whole-tensor sum."""
    fs = {
        "rows": (lambda x: x.sum(1), lambda: (torch.randn(64, 1024),), 0),
        "transposed": (lambda x: x.t().sum(0), lambda: (torch.randn(1024, 64),), 1),
        "few_kept": (lambda x: x.sum(0), lambda: (torch.randn(512, 15),), 0),
        "tiny": (lambda x: x.sum(0), lambda: (torch.randn(3, 64),), 0),
        "empty": (lambda x: x.sum(0), lambda: (torch.randn(0, 64),), 0),
        "all": (lambda x: x.sum(), lambda: (torch.randn(64, 1024),), 0),
    }
    f, make, externs = fs[case]
    run(f, make, libtorch_calls=externs)
