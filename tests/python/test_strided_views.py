"""as_strided in traces: over a tensor that is contiguous in eager and inside its elements, eager's
strides count its elements in row-major order, which the IR's as_strided means on any layout
(overlapping frames as stft makes them, views of a side exit's live values). Anything else --
a non-contiguous operand, elements outside it, a write through the view -- still falls back,
with eager's answer."""
import torch

import dynamo


def same(a, b):
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6)


def frames(x):
    y = torch.nn.functional.pad(x * 2, (3, 3))          # a computed, contiguous intermediate
    f = y.as_strided((8, 8), (4, 1))                    # overlapping windows, hop 4
    return (f * torch.hann_window(8)).sum(-1)


def offset_view(x):
    y = x + 1
    return y.as_strided((3, 2), (1, 3), 2) * 2          # a transposed pick with an offset


def non_contiguous(x):
    return x.t().as_strided((2, 2), (1, 2)) + 1         # eager's layout of a transposed view


def outside(x):
    y = (x + 1)[2:6]                                    # a contiguous slice of a bigger storage
    return y.as_strided((4,), (1,), 0) * 2 + y.as_strided((2,), (1,), y.storage_offset() - 2).sum()


def written_through(x):
    y = x * 1
    v = y.as_strided((2, 2), (2, 1))
    v.add_(1)
    return y


def retaken(x):
    y = x * 1
    v = y.as_strided((3,), (2,))
    y.mul_(3)                                           # the view sees the write, as in eager
    return v + 0


def run(fn, x, calls=3):
    opt = dynamo.optimize(fn)
    for _ in range(calls):
        assert same(opt(x.clone()), fn(x.clone())), fn.__name__
    return dynamo.counters()


def test_overlapping_frames_run_natively():
    c = run(frames, torch.randn(30))
    assert c["aborts"] == 0 and c["native_runs"] == 2, c


def test_an_offset_and_transposed_strides():
    c = run(offset_view, torch.randn(12))
    assert c["aborts"] == 0 and c["native_runs"] == 2, c


def test_a_view_retaken_after_a_write_into_its_base():
    c = run(retaken, torch.randn(8))
    assert c["aborts"] == 0 and c["native_runs"] == 2, c


def test_what_strides_cannot_say_falls_back_with_eager_answers():
    for fn, x in ((non_contiguous, torch.randn(3, 4)), (outside, torch.randn(10)), (written_through, torch.randn(6))):
        dynamo.reset()
        c = run(fn, x)
        assert c["aborts"] >= 1 and c["native_runs"] == 0, (fn.__name__, c)


def test_as_strided_ir_op_through_the_native_api():
    from dynamo import native
    text = """trace @w {
  %0 = input f32[2,5]
  %1 = transpose(%0, 0, 1)
  %2 = as_strided(%1, [3,4], [2,1], 1)
  %3 = mul(%2, 2.0)
  return %3
}
"""
    frame = native.Frame(native.Engine(), "strided")
    frame.compile(native.Trace(text))
    x = torch.randn(2, 5)
    (out,) = frame.run(x)
    want = x.t().contiguous().view(-1).as_strided((3, 4), (2, 1), 1) * 2  # row-major order of %1
    assert same(out, want)


def unfold_windows(x):
    w = (x * 2).unfold(-1, 5, 3)                        # overlapping windows of a computed tensor
    return (w * torch.arange(5.0)).sum(-1)


def unfold_transposed(x):
    return x.t().unfold(0, 2, 2).exp() + 1              # dim 0 of a non-contiguous input, step = size


def unfold_whole_and_sparse(x):
    a = x.unfold(1, x.shape[1], 1)                      # one window: the whole dim
    b = x.unfold(0, 1, 3)                               # step past the size: every third row
    return a.sum(-1) + 1, b * 3


def unfold_written(x):
    y = x * 1
    y.unfold(0, 2, 2).mul_(2)                           # a write through the windows: falls back
    return y


def test_unfold_as_row_major_windows_on_any_layout():
    """unfold is layout-independent: the IR's as_strided over the operand's row-major elements."""
    for fn, x in ((unfold_windows, torch.randn(2, 3, 20)), (unfold_transposed, torch.randn(3, 7)),
                  (unfold_windows, torch.randn(5)), (unfold_whole_and_sparse, torch.randn(10, 4))):
        dynamo.reset()
        opt = dynamo.optimize(fn)
        for _ in range(3):
            got, want = opt(x.clone()), fn(x.clone())
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert same(g, w), fn.__name__
        c = dynamo.counters()
        assert c["aborts"] == 0 and c["native_runs"] == 2, (fn.__name__, c)
    dynamo.reset()
    c = run(unfold_written, torch.randn(6))
    assert c["native_runs"] == 0 and c["aborts"] >= 1, c
