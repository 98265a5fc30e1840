"""Complex tensors held in a trace as float pairs: stft's spectrum (the FFT of a real float32
tensor, extern dynamo::fft_r2c) with its views and its magnitude (abs) run natively, so that a
spectrogram compiles whole. Any other use of a complex tensor -- returning it, arithmetic on it,
one live at a side exit -- falls back with eager's answer (the dtype the compiler lacks)."""
import copy

import pytest
import torch

import dynamo


def close(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max())


def check_native(fn, *inputs, calls=3):
    """fn optimized, called with each input `calls` times: equal to eager every call, natively
    after the first, with no dtype abort."""
    f = dynamo.optimize(fn)
    for x in inputs:
        for _ in range(calls):
            want, got = fn(x), f(x)
            assert close(got, want), (got - want).abs().max()
    c = dynamo.counters()
    assert c["abort_dtype"] == 0, dynamo.report()
    assert c["native_runs"] >= len(inputs) * (calls - 1), dynamo.report()


def power_spectrum(x):
    w = torch.hann_window(64)
    z = torch.stft(x, n_fft=64, hop_length=16, window=w, return_complex=True)
    return z.abs().pow(2)


def magnitude_frames_first(x):
    z = torch.stft(x, n_fft=32, hop_length=8, window=torch.hann_window(32), center=False, return_complex=True)
    return z.transpose(-1, -2).abs() * 0.5 + 1


def test_stft_magnitude_runs_natively():
    check_native(power_spectrum, torch.randn(1000), torch.randn(2, 1023))


def test_views_of_the_spectrum_and_odd_sizes():
    check_native(magnitude_frames_first, torch.randn(3, 257), torch.randn(1, 33))


def test_a_non_contiguous_signal():
    check_native(power_spectrum, torch.randn(2, 2046)[:, ::2])


def returns_spectrum(x):
    return torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)


def scales_spectrum(x):
    z = torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)
    return (z * 2).abs()  # arithmetic on a complex tensor: not traced


def real_part(x):
    z = torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)
    return z.real + 1


@pytest.mark.parametrize("fn", [returns_spectrum, scales_spectrum, real_part])
def test_other_uses_of_a_complex_tensor_fall_back_with_eagers_answer(fn):
    f = dynamo.optimize(fn)
    x = torch.randn(2, 100)
    for _ in range(3):
        want, got = fn(x), f(x)
        assert got.dtype == want.dtype and torch.allclose(got, want, atol=1e-5)
    assert dynamo.counters()["abort_dtype"] >= 1
    assert "complex" in dynamo.report()


def test_mel_spectrogram_compiles_whole():
    transforms = pytest.importorskip("torchaudio.transforms")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mel = transforms.MelSpectrogram(sample_rate=16000, n_fft=400)
        mfcc = transforms.MFCC(sample_rate=16000)
    for m in (mel, mfcc):
        dynamo.reset()
        fast = dynamo.optimize(copy.deepcopy(m))
        for seed in range(3):
            x = torch.randn(1, 4000, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                want, got = m(x), fast(x)
            assert close(got, want), (got - want).abs().max()
        c = dynamo.counters()
        assert c["abort_dtype"] == 0 and c["aborts"] == 0, dynamo.report()
        assert c["native_runs"] >= 2 and c["traces_compiled"] == 1, dynamo.report()


def branch_with_spectrum_live(x):
    z = torch.stft(x, n_fft=16, hop_length=4, window=torch.hann_window(16), return_complex=True)
    if x.sum() > 0:  # a side exit would have to carry z, which the trace holds as float pairs
        return z.abs() + 1
    return z.abs() - 1


def test_a_complex_tensor_live_at_a_branch_falls_back_cleanly():
    f = dynamo.optimize(branch_with_spectrum_live)
    for sign in (1, -1, 1, -1):
        x = torch.rand(2, 64) * sign
        assert close(f(x), branch_with_spectrum_live(x))
    report = dynamo.report()
    assert "complex tensor is live" in report and "inside dynamo" not in report, report
