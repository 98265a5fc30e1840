"""Reductions of at most four elements per output (stft's |z| over float pairs, a mean over a
dim of 3, without keepdim) are compiled as pointwise expressions fused with their neighbours, not as row kernels
over tiny rows: same values as eager, including NaN, keepdim, negative and several dims,
non-contiguous and broadcast inputs, and a reduction of one element, which must be a copy."""
import pytest
import torch

import dynamo
from dynamo import native

from conftest import matches_eager


def trace(body, *decls, ret="%r"):
    lines = [f"  %{k} = input {d}" for k, d in enumerate(decls)]
    lines += [f"  {line}" for line in body]
    return native.Trace("trace @py {\n" + "\n".join(lines) + f"\n  return {ret}\n}}\n")


CASES = [  # (op text, reference)
    ("sum(%0, [2], false)", lambda x: x.sum(2)),
    ("sum(%0, [-1], true)", lambda x: x.sum(-1, keepdim=True)),
    ("mean(%0, [2], false)", lambda x: x.mean(2)),
    ("mean(%0, [0], true)", lambda x: x.mean(0, keepdim=True)),
    ("amax(%0, [0], false)", lambda x: x.amax(0)),
    ("amin(%0, [2], true)", lambda x: x.amin(2, keepdim=True)),
    ("prod(%0, [2], false)", lambda x: x.prod(2)),
    ("sum(%0, [0,2], false)", lambda x: x.sum((0, 2))),
    ("amax(%0, [2,0], true)", lambda x: x.amax((2, 0), keepdim=True)),
]


@pytest.mark.parametrize("op,ref", CASES)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_small_reduction_matches_eager_and_is_one_kernel(frame, op, ref, dtype):
    t = trace([f"%s = {op}", "%r = mul(%s, 2.0)"], f"{dtype}[2,5,2]")
    entry = frame.compile(t)
    assert entry.stats().num_kernels == 1  # the reduction fused with its consumer
    torch_dtype = torch.float32 if dtype == "f32" else torch.float64
    x = torch.randn(2, 5, 2, dtype=torch_dtype)
    x[1, 3, 0] = float("nan")
    (out,) = frame.run(x)
    want = ref(x) * 2.0
    assert out.dtype == want.dtype and out.shape == want.shape
    torch.testing.assert_close(out, want, equal_nan=True)


def test_one_element_reduction_is_a_fresh_tensor(frame):
    frame.compile(trace(["%r = sum(%0, [1], false)"], "f32[6,1]"))
    x = torch.randn(6, 1)
    (out,) = frame.run(x)
    torch.testing.assert_close(out, x.sum(1))
    out.add_(1.0)                     # never a view of the input
    torch.testing.assert_close(x.sum(1) + 1.0, out)


def test_larger_and_integer_reductions_stay_reductions(frame):
    entry = frame.compile(trace(["%r = sum(%0, [1], false)"], "f32[3,5]"))  # 5 elements: a reduction
    x = torch.randn(3, 5)
    (out,) = frame.run(x)
    torch.testing.assert_close(out, x.sum(1))
    frame2 = native.Frame(native.Engine())
    frame2.compile(trace(["%r = sum(%0, [1], false)"], "i32[3,2]"))        # int32 widens to int64
    xi = torch.randint(-9, 9, (3, 2), dtype=torch.int32)
    (got,) = frame2.run(xi)
    assert got.dtype == torch.int64 and torch.equal(got, xi.sum(1))


def test_abs_of_complex_pairs_through_optimize():
    """The stft shape: |z|^2 of an FFT's spectrum, transposed, as MelSpectrogram computes it."""
    def spectrum(x):
        z = torch.fft.rfft(x.unfold(-1, 16, 4) * torch.hann_window(16), dim=-1)
        return z.transpose(-1, -2).abs().pow(2.0)

    f = dynamo.optimize(spectrum)
    matches_eager(f, spectrum, lambda: torch.randn(2, 203), calls=3, rtol=1e-4, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= 2


def test_mean_over_rgb_channels_noncontiguous_through_optimize():
    def gray(img):  # a channels-last image: the mean over 3 interleaved values
        return torch.sigmoid(img.permute(0, 3, 1, 2).mean(1, keepdim=True))

    f = dynamo.optimize(gray)
    matches_eager(f, gray, lambda: torch.randn(2, 7, 9, 3), calls=3)
