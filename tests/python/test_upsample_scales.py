"""F.interpolate with scale_factor: ATen's upsample .vec ops take the scales as a float list,
which the IR has no operand for. When the scale gives an exact output size (in / out == 1 /
scale as doubles: 2x, 4x, 0.5x of even sizes), the recorder writes the output size instead,
and the results are bit-identical to eager; other scales leave the call to eager, correct."""
import pytest
import torch
import torch.nn.functional as F

import dynamo


@pytest.mark.parametrize("mode,align", [("nearest", None), ("bilinear", False), ("bilinear", True),
                                        ("bicubic", False), ("nearest-exact", None)])
@pytest.mark.parametrize("scale", [2, 2.0, (4.0, 0.5), 0.5])
def test_exact_scales_compile_and_match_bit_for_bit(mode, align, scale):
    def f(x):
        return F.interpolate(x, scale_factor=scale, mode=mode, align_corners=align) * 2

    opt = dynamo.optimize(f)
    x = torch.randn(2, 3, 8, 6)
    for _ in range(3):
        got = opt(x)
    assert torch.equal(got, f(x))
    c = dynamo.counters()
    assert c["native_runs"] == 2 and c["aborts"] == 0, c


def test_linear_and_trilinear():
    def f(x, y):
        return (F.interpolate(x, scale_factor=2, mode="linear"),
                F.interpolate(y, scale_factor=(2, 0.5, 4), mode="trilinear"))

    opt = dynamo.optimize(f)
    x, y = torch.randn(2, 3, 7), torch.randn(1, 2, 3, 4, 5)
    for _ in range(3):
        got = opt(x, y)
    for a, b in zip(got, f(x, y)):
        assert torch.equal(a, b)
    assert dynamo.counters()["native_runs"] == 2


def test_inexact_scale_is_right():
    """7 x 1.5 is 10.5: the size 10 maps coordinates by 0.7, the scale by 1/1.5: not the same op.
    torch 2.13 dispatches the scales with the op (upsample_bilinear2d.default), which compiles;
    torch 1.13's .vec form ran eagerly. Either way every call is eager's."""
    def f(x):
        return F.interpolate(x, scale_factor=1.5, mode="bilinear") + 1

    opt = dynamo.optimize(f)
    x = torch.randn(1, 2, 7, 7)
    for _ in range(3):
        torch.testing.assert_close(opt(x), f(x))
