"""A tensor live across a stitch or a side exit keeps eager's layout. Elementwise ops keep their
input's layout (x * 2 of a transposed x is transposed, of a channels-last x channels-last), and
the program after the exit may ask: is_contiguous(), stride(), view() (which raises on such a
tensor in eager). The exit used to hand every live tensor on row-major, so the program after it
took the other branch of `if t.is_contiguous()` (found by the program fuzzer). Each test
compares values, strides and contiguity with eager on every call."""
import pytest
import torch

import dynamo


def same(got, want, where):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), (where, got)
        assert got.shape == want.shape and got.dtype == want.dtype, (where, got.shape, want.shape)
        assert got.stride() == want.stride(), (where, got.stride(), want.stride())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


def run(f, make, calls=6):
    dynamo.reset()
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for k in range(calls):
            args = make(k)
            same(jit(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), f(*args), f"call {k}")
    return dynamo.counters()


@dynamo.disable
def unrecordable(t):  # a stitch: made for real between two traces
    return t.shape[0]


def transposed(k):
    return (torch.randn(3 + k % 2, 5).t(),)


def test_a_transposed_temporary_across_a_stitch_stays_transposed():
    def f(x):
        t = (x * 0).clamp(min=2.0) + x
        n = unrecordable(t)
        y = torch.exp(t) if t.is_contiguous() else torch.tanh(t)
        return y * n, t.stride(), t.is_contiguous()
    c = run(f, transposed)
    assert c["native_runs"] >= 4 and c["stitches"] >= 6, c


def test_a_tensor_read_by_tolist_keeps_its_layout():
    def f(x):
        t = (x * 0).clamp(min=2.0) + 1.0
        n = len(t.tolist())
        return (torch.exp(t) if t.is_contiguous() else torch.tanh(t)) + n, t.stride()
    c = run(f, lambda k: (torch.randn(3, 3).transpose(-1, -2),))
    assert c["native_runs"] >= 4, c


def test_a_channels_last_temporary_across_a_stitch():
    def f(x):
        t = torch.relu(x) * 2
        unrecordable(t)
        cl = t.is_contiguous(memory_format=torch.channels_last)
        return t + 1, t.stride(), cl, t.is_contiguous()
    c = run(f, lambda k: (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),))
    assert c["native_runs"] >= 4, c


def test_view_of_a_transposed_temporary_raises_after_a_stitch_as_in_eager():
    def f(x):
        t = x * 3
        unrecordable(t)
        return t.view(-1)
    jit = dynamo.optimize(f)
    x = torch.randn(4, 6).t()
    with pytest.raises(RuntimeError) as eager:
        f(x)
    for _ in range(3):
        with pytest.raises(RuntimeError) as got:
            jit(x)
        assert type(got.value) is type(eager.value)


def test_a_view_of_a_transposed_temporary_across_a_stitch():
    def f(x):
        t = x * 2 + 1
        v = t[1:]          # a view of a non-contiguous temporary (was: the recording aborted)
        unrecordable(t)
        return v * 3, v.stride(), v.is_contiguous(), t.stride()
    c = run(f, transposed)
    assert c["native_runs"] >= 4, c


def test_a_view_of_a_transposed_temporary_sees_writes_to_it_after_a_stitch():
    def f(x):
        t = x * 2 + 1
        v = t[1:]
        unrecordable(t)
        t.mul_(10)         # v is one memory with t, as in eager
        return v + 0, v.stride(), t.stride()
    run(f, transposed)


def test_a_transposed_temporary_across_a_taken_side_exit():
    def f(x, s):
        t = x * s + 0.5
        if t.sum() > 0:    # taken both ways as s changes sign: a side trace resumes with t live
            y = t * 2
        else:
            y = t - 1
        return y, t.stride(), t.is_contiguous(), (torch.exp(t) if t.is_contiguous() else torch.sin(t))
    c = run(f, lambda k: (torch.rand(4, 5).t() + 0.1, torch.tensor(1.0 if k % 2 else -1.0)), calls=24)
    # (the exit is hot after config.hotexit takes: its side trace is recorded, then runs natively)
    assert c["side_traces_compiled"] >= 1 and c["native_runs"] >= 14, c


def test_a_transposed_temporary_across_a_value_read():
    def f(x):
        t = x * 2
        k = int(t.sum() > 0)   # a value read: the trace goes on behind a side exit
        return t * k, t.stride(), t.is_contiguous()
    run(f, lambda k: (torch.randn(3, 4).t() * (1 if k % 3 else -1),), calls=8)


def test_a_contiguous_temporary_still_goes_across_as_it_is():
    def f(x):
        t = x.t() * 2      # x is row-major: x.t() * 2 is transposed, t.t() row-major again
        u = t.t() + 0
        unrecordable(u)
        return u * 2, u.stride(), t.stride()
    c = run(f, lambda k: (torch.randn(3, 5),))
    assert c["native_runs"] >= 4, c


def test_an_in_place_write_after_a_stitch_into_a_transposed_temporary():
    def f(x):
        t = x * 2 + 1
        unrecordable(t)
        t.add_(3)          # a write through the permute that gives t eager's layout: recorded
        return t * 2, t.stride()
    c = run(f, transposed)
    assert c["native_runs"] >= 4 and c["aborts"] == 0, c
