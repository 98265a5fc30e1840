"""Convolution chains kept channels-last through a trace (jit/layout.cpp), compared with eager on
every call: each 2-D float32 convolution becomes dynamo::conv_nhwc ([N, H, W, C] in and out; 1x1
ones too), and the
pointwise work and reductions between them run on the [N, H, W, C] values; whatever else reads a
value (views, other LibTorch ops, outputs, side exits) reads the [N, C, H, W] original.

The compile plan (DYNAMO_DUMP_DIR) shows the steps; DYNAMO_LAYOUT=nchw turns the pass off."""
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
    text = "".join(open(p).read() for p in sorted(glob.glob(f"{dump}/*.plan")))
    assert text, "no plan was dumped"
    return text


def compare(fn, make_args, tmp_path, monkeypatch, calls=CALLS, strides=True, native=None):
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    jit = dynamo.optimize(fn)
    before = dynamo.counters()["native_runs"]
    with torch.no_grad():
        for _ in range(calls):
            args = make_args()
            got, want = jit(*args), fn(*args)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                close(g, w)
                if strides:
                    assert g.stride() == w.stride(), (g.stride(), w.stride())
    assert dynamo.counters()["native_runs"] - before >= (calls - 1 if native is None else native), dynamo.report()
    return plan_steps(tmp_path)


def bn(c, kind=nn.BatchNorm2d):
    """Eval batch norm with statistics and affine parameters that are not the identity."""
    m = kind(c).eval()
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    return m


class Block(nn.Module):
    """A residual network in small: stem, max pool, two residual blocks (one downsampling, with
    a 1x1 projection), global pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), bn(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.a = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, bias=False), bn(16), nn.ReLU(),
                               nn.Conv2d(16, 16, 3, 1, 1, bias=False), bn(16))
        self.b = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1, bias=False), bn(32), nn.ReLU(),
                               nn.Conv2d(32, 32, 3, 1, 1, bias=False), bn(32))
        self.proj = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), bn(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = F.relu(self.a(x) + x)
        x = F.relu(self.b(x) + self.proj(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize("shape", [(1, 3, 32, 32), (2, 3, 17, 23), (1, 3, 7, 7), (3, 3, 1, 1)])
def test_residual_network_runs_channels_last(shape, tmp_path, monkeypatch):
    model = Block().eval()
    steps = compare(model, lambda: (torch.randn(shape),), tmp_path, monkeypatch)
    assert "dynamo::conv_nhwc" in steps and "aten::convolution" not in steps, steps


def test_channels_last_and_strided_inputs(tmp_path, monkeypatch):
    model = Block().eval()
    inputs = [torch.randn(1, 3, 20, 20).to(memory_format=torch.channels_last),
              torch.randn(1, 3, 20, 40)[..., ::2],
              torch.randn(1, 20, 20, 3).permute(0, 3, 1, 2)]
    it = iter(inputs * 2)
    compare(model, lambda: (next(it),), tmp_path, monkeypatch, calls=6)


CONVS = [  # (input shape, weight shape, kwargs)
    ((1, 3, 17, 17), (8, 3, 3, 3), dict(padding=1)),
    ((2, 16, 9, 9), (16, 16, 3, 3), dict(stride=2, padding=1)),
    ((1, 16, 8, 8), (32, 16, 1, 1), dict()),                            # 1x1
    ((1, 7, 1, 1), (5, 7, 1, 1), dict()),                               # one pixel
    ((2, 16, 8, 8), (32, 16, 1, 1), dict()),                            # 1x1, batch 2
    ((1, 16, 9, 9), (32, 16, 1, 1), dict(stride=2)),                    # strided 1x1
    ((1, 12, 10, 10), (12, 1, 3, 3), dict(padding=1, groups=12)),       # depthwise
    ((1, 12, 11, 7), (24, 4, 3, 2), dict(padding=(1, 0), groups=3, dilation=(2, 1))),
    ((1, 8, 7, 7), (8, 8, 3, 3), dict(stride=3, padding=1)),
]


@pytest.mark.parametrize("xs,ws,kw", CONVS)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_then_pointwise_matches_eager(xs, ws, kw, bias, tmp_path, monkeypatch):
    w = torch.randn(ws)
    b = torch.randn(ws[0]) if bias else None
    scale = torch.randn(ws[0], 1, 1)

    def f(x):
        return F.silu(F.conv2d(x, w, b, **kw) * scale + 1)
    steps = compare(f, lambda: (torch.randn(xs),), tmp_path, monkeypatch)
    assert "dynamo::conv_nhwc" in steps and "aten::convolution" not in steps and "aten::mm" not in steps, steps


def test_conv_output_returned_and_viewed(tmp_path, monkeypatch):
    """Results read as [N, C, H, W]: returned as they are, flattened, transposed, sliced."""
    conv = nn.Conv2d(4, 6, 3, padding=1).eval()

    def f(x):
        y = conv(x)
        return y, y.flatten(1), y.transpose(1, 2) + 0, y[:, 2:4] * 2
    compare(f, lambda: (torch.randn(2, 4, 5, 7),), tmp_path, monkeypatch)


def test_channels_last_input_gives_eagers_strides(tmp_path, monkeypatch):
    conv = nn.Conv2d(4, 6, 3, padding=1).eval()
    compare(lambda x: F.relu(conv(x)), lambda: (torch.randn(2, 4, 5, 7).to(memory_format=torch.channels_last),),
            tmp_path, monkeypatch)


@pytest.mark.parametrize("reduce", [
    lambda y: y.mean((2, 3), keepdim=True) * y,     # squeeze-and-excitation's scale
    lambda y: y.sum(1),                             # over channels: [N, H, W] either way
    lambda y: y.amax(2),                            # [N, C, W]: another order channels-last
    lambda y: y.var((1, 2, 3), keepdim=True) + y,
    lambda y: y.mean(-1, keepdim=True).sigmoid() * y,
    lambda y: torch.softmax(y, 1),
])
def test_reductions_of_channels_last_values(reduce, tmp_path, monkeypatch):
    conv = nn.Conv2d(5, 8, 3, padding=1).eval()
    compare(lambda x: reduce(F.relu(conv(x))), lambda: (torch.randn(2, 5, 6, 9),), tmp_path, monkeypatch)


def test_side_exit_after_a_channels_last_value(tmp_path, monkeypatch):
    """A branch on a convolution's result: the live value leaves the trace as [N, C, H, W]."""
    conv = nn.Conv2d(3, 4, 3, padding=1).eval()

    def f(x):
        y = F.relu(conv(x))
        if y.mean() > 0.3:
            return y * 2
        return y - 1
    xs = [torch.randn(1, 3, 8, 8) + s for s in (0.0, 5.0, 0.0, 5.0, -3.0)]
    it = iter(xs)
    compare(f, lambda: (next(it),), tmp_path, monkeypatch, calls=5, native=1)
    assert dynamo.counters()["exits_resumed"] >= 1, dynamo.report()


def test_weight_changed_between_calls(tmp_path, monkeypatch):
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), bn(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    jit = dynamo.optimize(model)
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(1, 8, 6, 6)
            close(jit(x), model(x))
            model[0].weight.mul_(1.5)
            model[3].weight.add_(0.25)
            model[1].running_var.mul_(1.3)
    assert "dynamo::conv_nhwc" in plan_steps(tmp_path)


@pytest.mark.parametrize("path", ["packed", "onednn", "aten"])
def test_each_convolution_path_channels_last(path, tmp_path, monkeypatch):
    """Every path a channels-last step can take (DYNAMO_CONV forces one), with a weight changed
    in place between calls: LibTorch's oneDNN with the packed weight, the system oneDNN's
    channels-last kernel, LibTorch's call."""
    monkeypatch.setenv("DYNAMO_CONV", path)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), bn(16), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1, groups=4),
                          nn.ReLU(), nn.Conv2d(16, 8, 1)).eval()
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    jit = dynamo.optimize(model)
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(2, 8, 9, 7)
            close(jit(x), model(x))
            model[0].weight.mul_(1.5)
            model[5].weight.add_(0.25)
    assert dynamo.counters()["native_runs"] >= 3, dynamo.report()
    assert "dynamo::conv_nhwc" in plan_steps(tmp_path)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_system_onednn_without_a_kernel(layout, monkeypatch, capfd):
    """The system oneDNN has no kernel for a step (oneDNN 2.6 has no channels-last one for
    dilated convolutions; injected here for every convolution): a channels-last step still times
    LibTorch's oneDNN against LibTorch's call and keeps the faster, an aten::convolution step
    takes LibTorch's."""
    monkeypatch.setenv("DYNAMO_FAULT", "conv_direct")
    monkeypatch.setenv("DYNAMO_LAYOUT", layout)
    monkeypatch.setenv("DYNAMO_PRINT_CHOICES", "1")
    monkeypatch.delenv("DYNAMO_CONV", raising=False)
    w = torch.randn(16, 8, 3, 3)

    def f(x):
        return F.relu(F.conv2d(x, w, padding=2, dilation=2)) * 2
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(1, 8, 10, 10)
            close(jit(x), f(x))
    assert dynamo.counters()["native_runs"] >= 4, dynamo.report()
    choice = jit.compiled[0].entry.choices().split("=")[1]
    if layout == "nhwc":
        timed = [line for line in capfd.readouterr().err.splitlines() if line.startswith("conv ")]
        assert len(timed) == 1 and ", packed - (" not in timed[0] and choice in ("packed", "aten"), (timed, choice)
    else:
        assert choice == "aten", choice


def test_layout_pass_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNAMO_LAYOUT", "nchw")
    model = Block().eval()
    steps = compare(model, lambda: (torch.randn(1, 3, 16, 16),), tmp_path, monkeypatch)
    assert "aten::convolution" in steps and "dynamo::conv_nhwc" not in steps, steps


@pytest.mark.parametrize("pool,step", [
    (lambda y: F.max_pool2d(y, 3, 2, 1), "dynamo::max_pool2d_nhwc"),
    (lambda y: F.max_pool2d(y, 2, ceil_mode=True), "dynamo::max_pool2d_nhwc"),
    (lambda y: F.max_pool2d(y, (3, 2), (1, 2), (1, 0), dilation=(2, 1)), "dynamo::max_pool2d_nhwc"),
    (lambda y: F.avg_pool2d(y, 3, 1, 1, count_include_pad=False) - y, "dynamo::avg_pool2d_nhwc"),  # PoolFormer's
    (lambda y: F.avg_pool2d(y, 2, ceil_mode=True, count_include_pad=True), "dynamo::avg_pool2d_nhwc"),
    (lambda y: F.avg_pool2d(y, 3, 2, 1, divisor_override=4), "dynamo::avg_pool2d_nhwc"),
    (lambda y: F.max_pool2d(y, 2, return_indices=True)[1].float(), "aten::max_pool2d_with_indices"),  # indices read
])
def test_pooling_channels_last(pool, step, tmp_path, monkeypatch):
    conv = nn.Conv2d(3, 8, 3, padding=1).eval()
    steps = compare(lambda x: F.relu(pool(F.relu(conv(x)))), lambda: (torch.randn(2, 3, 9, 11),), tmp_path,
                    monkeypatch)
    assert "dynamo::conv_nhwc" in steps and step in steps, steps


@pytest.mark.parametrize("dim", [1, -3, 2, 3, 0])
def test_concatenation_channels_last(dim, tmp_path, monkeypatch):
    """DenseNet's pattern: a convolution's result concatenated with its input, then convolved
    again; along channels and along the other dims (the second operand has no channels-last form)."""
    conv_a = nn.Conv2d(6, 6, 3, padding=1).eval()
    conv_b = nn.Conv2d(12 if dim in (1, -3) else 6, 4, 1).eval()

    def f(x):
        y = torch.cat([F.relu(conv_a(x)), x], dim)
        return conv_b(y), y.sum((2, 3))
    steps = compare(f, lambda: (torch.randn(2, 6, 5, 7),), tmp_path, monkeypatch)
    assert "dynamo::conv_nhwc" in steps, steps


def bn3(c):
    return bn(c, nn.BatchNorm3d)


class Video(nn.Module):
    """3-D convolutions ([N, C, D, H, W], as torchvision's r3d/r2plus1d): stem, a residual block
    with a (2+1)-D factorized pair, global pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), bn3(8), nn.ReLU())
        self.a = nn.Sequential(nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1), bias=False), bn3(8), nn.ReLU(),
                               nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0), bias=False), bn3(8))
        self.down = nn.Conv3d(8, 16, 1, stride=2)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(self.a(x) + x)
        x = F.relu(self.down(x))
        return self.head(torch.flatten(F.adaptive_avg_pool3d(x, 1), 1))


@pytest.mark.parametrize("shape", [(1, 3, 4, 16, 16), (2, 3, 3, 9, 7), (1, 3, 1, 1, 1)])
@pytest.mark.parametrize("path", ["auto", "packed", "onednn", "aten"])
def test_3d_convolutions_channels_last(shape, path, tmp_path, monkeypatch):
    if path == "auto":
        monkeypatch.delenv("DYNAMO_CONV", raising=False)
    else:
        monkeypatch.setenv("DYNAMO_CONV", path)
    model = Video().eval()
    steps = compare(model, lambda: (torch.randn(shape),), tmp_path, monkeypatch)
    assert "dynamo::conv_nhwc" in steps and "aten::convolution" not in steps, steps


def test_3d_reductions_and_concatenation(tmp_path, monkeypatch):
    conv = nn.Conv3d(4, 6, 3, padding=1).eval()

    def f(x):
        y = F.relu(conv(x))
        z = torch.cat([y, y * 2], 1)
        return z.mean((2, 3, 4), keepdim=True) * z, z.sum(1), z.amax(2)
    compare(f, lambda: (torch.randn(2, 4, 3, 5, 6),), tmp_path, monkeypatch)
