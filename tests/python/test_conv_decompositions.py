"""Convolutions rewritten into other steps at compile time (jit/decompose.cpp), compared with eager
on every call:

  * a 1x1 convolution of one image (stride 1, no padding, one group) becomes a matrix product
    step (aten::mm of the weight and the image's [C, H*W] view, bias added by a fused kernel); a
    2-D one only where jit/layout.cpp is off (DYNAMO_LAYOUT=nchw, as these tests set it: it
    keeps 2-D convolutions channels-last instead, test_channels_last_layout.py);
  * a depthwise 1-D convolution (groups = channels) becomes the weighted sum of its taps, views
    of the input zero-padded once: one fused loop.

The compile plan (DYNAMO_DUMP_DIR) shows which steps a trace ran; cases outside the rewrites
(groups, strides, padding, 33 taps) stay convolutions and must be as correct."""
import glob

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo

CALLS = 3


def close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * scale), (got - want).abs().max()


def plan_steps(dump):
    """The extern steps of the trace(s) compiled into dump, as one text."""
    text = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.plan")))
    assert text, "no plan was dumped"
    return text


def compare(fn, make_args, tmp_path, monkeypatch, calls=CALLS):
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("DYNAMO_LAYOUT", "nchw")
    jit = dynamo.optimize(fn)
    before = dynamo.counters()["native_runs"]
    with torch.no_grad():
        for _ in range(calls):
            args = make_args()
            close(jit(*args), fn(*args))
    assert dynamo.counters()["native_runs"] - before >= calls - 1, dynamo.report()
    return plan_steps(tmp_path)


ONE_BY_ONE = [  # (input shape, weight shape)
    ((1, 64, 501), (128, 64, 1)),        # ConvTasNet's bottleneck, 1-D
    ((1, 16, 8, 8), (32, 16, 1, 1)),
    ((1, 7, 1, 1), (5, 7, 1, 1)),        # one pixel
    ((1, 3, 1023), (9, 3, 1)),           # odd length
    ((1, 4, 3, 5, 7), (6, 4, 1, 1, 1)),  # 3-D
]


@pytest.mark.parametrize("xs,ws", ONE_BY_ONE)
@pytest.mark.parametrize("bias", [False, True])
def test_1x1_conv_is_a_product(xs, ws, bias, tmp_path, monkeypatch):
    w = torch.randn(ws)
    b = torch.randn(ws[0]) if bias else None
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(xs)]

    def f(x):
        return torch.relu(conv(x, w, b)) * 2
    steps = compare(f, lambda: (torch.randn(xs),), tmp_path, monkeypatch)
    assert "aten::mm" in steps and "aten::convolution" not in steps and "conv_nhwc" not in steps, steps


def test_1x1_conv_reads_a_strided_image_and_follows_its_weight(tmp_path, monkeypatch):
    """A channels-last image (a permuted view) and a weight changed in place between calls."""
    conv = nn.Conv2d(8, 4, 1).eval()
    bn = nn.BatchNorm2d(4).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    model = nn.Sequential(conv, bn, nn.ReLU())
    jit = dynamo.optimize(model)
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("DYNAMO_LAYOUT", "nchw")
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(1, 6, 5, 8).permute(0, 3, 1, 2)  # [1, 8, 6, 5], not contiguous
            close(jit(x), model(x))
            conv.weight.mul_(1.5)
    assert dynamo.counters()["native_runs"] >= 3, dynamo.report()
    assert "aten::mm" in plan_steps(tmp_path)


@pytest.mark.parametrize("xs,ws,kw", [
    ((2, 16, 8, 8), (32, 16, 1, 1), {}),                 # batch 2
    ((1, 16, 8, 8), (32, 8, 1, 1), dict(groups=2)),      # grouped
    ((1, 16, 9, 9), (32, 16, 1, 1), dict(stride=2)),     # strided
    ((1, 16, 8, 8), (32, 16, 1, 1), dict(padding=1)),    # padded
])
def test_other_1x1_convs_stay_convolutions(xs, ws, kw, tmp_path, monkeypatch):
    w = torch.randn(ws)
    steps = compare(lambda x: F.conv2d(x, w, **kw).sigmoid(), lambda: (torch.randn(xs),), tmp_path, monkeypatch)
    assert "aten::convolution" in steps, steps


DEPTHWISE = [  # (input shape, taps, stride, padding, dilation)
    ((1, 128, 501), 3, 1, 1, 1),
    ((1, 128, 501), 3, 1, 4, 4),      # ConvTasNet's dilated blocks
    ((2, 8, 23), 5, 2, 2, 1),         # batch 2, stride 2
    ((1, 4, 7), 1, 1, 0, 1),          # one tap
    ((1, 6, 40), 31, 1, 15, 1),       # Conformer's depthwise kernel
    ((1, 3, 9), 4, 3, 0, 2),          # even taps, stride leaves a remainder
    ((1, 5, 1), 3, 1, 1, 1),          # one frame
]


@pytest.mark.parametrize("xs,taps,stride,padding,dilation", DEPTHWISE)
@pytest.mark.parametrize("bias", [False, True])
def test_depthwise_conv1d_is_a_fused_sum(xs, taps, stride, padding, dilation, bias, tmp_path, monkeypatch):
    ch = xs[1]
    w = torch.randn(ch, 1, taps)
    b = torch.randn(ch) if bias else None
    prelu = nn.PReLU().eval()

    def f(x):
        y = F.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=ch)
        return F.group_norm(prelu(y), 1)
    steps = compare(f, lambda: (torch.randn(xs),), tmp_path, monkeypatch)
    assert "aten::convolution" not in steps, steps


def test_depthwise_with_33_taps_stays_a_convolution(tmp_path, monkeypatch):
    w = torch.randn(4, 1, 33)
    steps = compare(lambda x: F.conv1d(x, w, padding=16, groups=4).relu(), lambda: (torch.randn(1, 4, 50),),
                    tmp_path, monkeypatch)
    assert "aten::convolution" in steps, steps


def test_channel_multiplier_stays_a_convolution(tmp_path, monkeypatch):
    w = torch.randn(8, 1, 3)  # 4 channels in, 2 filters each
    steps = compare(lambda x: F.conv1d(x, w, padding=1, groups=4).relu(), lambda: (torch.randn(1, 4, 20),),
                    tmp_path, monkeypatch)
    assert "aten::convolution" in steps, steps


@pytest.mark.parametrize("case", ["scalar_tensor", "broadcast", "same", "ints_promoted", "zero_dim_double"])
def test_where_of_tensors_is_fused(case, tmp_path, monkeypatch):
    """aten::where.self (torch.where of tensors; ReLU's backward as torch._decomp writes it:
    where(x <= 0, 0-dim zero, grad)) becomes the IR's where, fused with its neighbours, where its
    result type is ATen's (the rewrite is kept only then); values compared with eager each call."""
    def f(x, y):
        if case == "scalar_tensor":
            return torch.where(x <= 0, torch.scalar_tensor(0.0), y) * 2
        if case == "broadcast":
            return torch.where(x > 0, x, y[:1]) + 1
        if case == "same":
            return torch.where(x > y, x, y).exp()
        if case == "zero_dim_double":  # ATen: float32 (a 0-dim tensor does not widen a dimensioned one)
            return torch.where(x > 0, x, torch.scalar_tensor(0.5, dtype=torch.float64)) * 2
        return torch.where(x > 0, x, y.to(torch.int32)) * 2  # int32 and float32: float32

    steps = compare(f, lambda: (torch.randn(7, 1023), torch.randn(7, 1023)), tmp_path, monkeypatch)
    assert "aten::where" not in steps, steps
