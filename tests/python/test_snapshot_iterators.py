"""Snapshots carry zip and enumerate objects and the call's own cells: a branch or a
data-dependent size inside `for a, b in zip(xs, ys)` (torchvision's detection heads filter their
proposals so) gets a side exit instead of aborting, and a frame resumed after a stitch may assign
a variable a nested function reads. Each result is compared with eager over calls that take the
exits both ways."""
import torch

import dynamo


def close(a, b):
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6)


def branch_in_zip(x, y):
    xs, ys = [x, x * 2, x + 1], [y, y - 1, y * 3]
    out = []
    for a, b in zip(xs, ys):
        if (a * b).sum() > 0:  # data-dependent: a side exit with the zip live
            out.append(a + b)
        else:
            out.append(a - b)
    return out


def nonzero_in_zip(x, y):
    kept = []
    for a, b in zip([x, x * 2], [y, y + 1]):
        keep = torch.where(a > b)[0]  # nonzero: its size behind a side exit, the zip live
        kept.append(a[keep] * 2)
    return kept


def branch_in_enumerate(x):
    parts = [x, x * 3, -x]
    total = x * 0
    for i, p in enumerate(parts, 1):
        if p.mean() > 0:
            total = total + p * i
    return total


def test_branch_with_a_zip_live():
    opt = dynamo.optimize(branch_in_zip)
    torch.manual_seed(0)
    for k in range(12):
        x, y = torch.randn(5), torch.randn(5)
        assert close(opt(x, y), branch_in_zip(x, y)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 3 and c["side_exits"] >= 1, c


def test_data_dependent_size_with_a_zip_live():
    opt = dynamo.optimize(nonzero_in_zip)
    x, y = torch.randn(16), torch.randn(16)
    for k in range(6):
        if k == 3:
            x = torch.randn(16)  # other sizes: the exits are taken
        assert close(opt(x, y), nonzero_in_zip(x, y)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 2, c


def test_branch_with_an_enumerate_live():
    opt = dynamo.optimize(branch_in_enumerate)
    torch.manual_seed(1)
    for k in range(12):
        x = torch.randn(6)
        assert close(opt(x), branch_in_enumerate(x)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 3 and c["side_exits"] >= 1, c


def cell_after_stitch(x, log):
    acc = x + 1

    def doubled():
        return acc * 2

    y = doubled()
    del doubled
    log.append(float(y.sum()))  # a stitch: a write into an outside list
    acc = acc + y               # STORE_DEREF in the frame resumed after it: the call's own cell
    return acc * 3


def test_a_cell_the_call_made_is_assigned_after_a_stitch():
    opt = dynamo.optimize(cell_after_stitch)
    x = torch.randn(4)
    for _ in range(4):
        got, want = [], []
        assert close(opt(x, got), cell_after_stitch(x, want))
        assert got == want
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["stitch_traces"] >= 1 and c["native_runs"] >= 3, c


def mask_index(x, scores):
    keep = scores > 0.2          # SSD's `boxes[keep]`: a boolean-mask index, sized by the data
    return x[keep] * 2, x[:, keep[:3]].sum()


def test_boolean_mask_index_keeps_its_size_behind_an_exit():
    opt = dynamo.optimize(mask_index)
    x, s = torch.randn(8, 3), torch.rand(8)
    for k in range(6):
        if k == 3:
            s = torch.rand(8)    # another count: the exit is taken, the call still right
        assert close(opt(x, s), mask_index(x, s)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 2, c


def uniques(x):
    y = x * 2
    u = torch.unique(y.round())   # data-dependent size: a step between two traces
    return u + 1, y.sum()


def test_unique_is_a_step_between_traces():
    opt = dynamo.optimize(uniques)
    torch.manual_seed(0)
    for k in range(8):
        x = torch.randint(0, 5, (40,)).float() / 2  # new values each call, five distinct ones
        assert close(list(opt(x)), list(uniques(x))), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["stitches"] >= 1 and c["native_runs"] >= 4, c


class Scale:
    """A plain Python class with __call__ (torchvision's LevelMapper is one)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k + 1


def test_calling_an_instance_of_a_python_class_is_inlined():
    s = Scale(3.0)

    def f(x):
        return s(x).relu()

    opt = dynamo.optimize(f)
    x = torch.randn(7)
    for _ in range(3):
        assert close(opt(x), f(x))
    s.k = -2.0  # read through a guarded source: a new trace, not a stale one
    assert close(opt(x), f(x))
    orig = Scale.__call__
    Scale.__call__ = lambda self, x: x - self.k  # the method itself is guarded
    try:
        assert close(opt(x), f(x))
    finally:
        Scale.__call__ = orig
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 2 and c["traces_compiled"] >= 3, c


class Levels(torch.nn.Module):
    """torchvision's MultiScaleRoIAlign shape: a loop zipping the call's own list with a list
    the module holds (its scales), a data-dependent size inside the loop."""

    def __init__(self):
        super().__init__()
        self.scales = [0.5, 0.25, 2.0]

    def forward(self, x, levels):
        out = []
        for k, (part, scale) in enumerate(zip([x, x * 2, x - 1], self.scales)):
            idx = torch.where(levels == k)[0]   # nonzero: the iterator over self.scales is live
            out.append(part[idx] * scale)
        return torch.cat(out)


def test_an_iterator_over_a_list_from_outside_the_call_is_live_at_an_exit():
    m = Levels()
    opt = dynamo.optimize(m)
    x = torch.randn(12)
    for k in range(8):
        levels = torch.randint(0, 3, (12,))   # other counts per level: the exits are taken
        if k == 5:
            m.scales[1] = -3.0                # the program's list, read again: not a stale copy
        if k == 6:
            m.scales.append(9.0)              # a longer list: the loop still stops at the shorter
        assert close(opt(x, levels), m(x, levels)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 3, c


def sum_over_given_list(x, weights):
    total = x * 0
    for w, t in zip(weights, [x, x * 3]):
        keep = torch.where(t > 0)[0]   # sized by the data, with zip(weights, ...) live
        total = total + w * t[keep].sum()
    return total


def test_a_list_argument_zipped_keeps_its_source_across_exits():
    opt = dynamo.optimize(sum_over_given_list)
    weights = [1.5, -2.0]
    for k in range(8):
        x = torch.randn(9)
        if k == 4:
            weights[0] = 7.0    # by value, guarded: a new trace or a guarded miss, never a stale one
        assert close(opt(x, weights), sum_over_given_list(x, weights)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 2, c


def test_torch_compile_queries_and_wrapped_functions():
    """torchvision's roi_align asks torch._dynamo's is_compile_supported() and calls a function it
    compiled with torch.compile: the query runs as eager runs it, and what the compiled function
    wraps is recorded with the rest (compiled here, as the program asked)."""
    import torch._dynamo.utils as dynamo_utils

    inner = torch.compile(lambda t: t.sin() * 2, backend="eager")

    def f(x):
        y = x.relu() + 1
        if dynamo_utils.is_compile_supported(x.device.type) and not torch.compiler.is_compiling():
            y = inner(y)
        return y * 3

    opt = dynamo.optimize(f)
    for k in range(4):
        x = torch.randn(33)
        assert close(opt(x), f(x)), k
    c = dynamo.counters()
    assert c["aborts"] == 0 and c["native_runs"] >= 3 and c["stitches"] == 0, c
    assert "aten::sin" in str(dynamo.explain(f, torch.randn(33)))


def test_a_function_marked_torch_compiler_disable_is_a_step():
    calls = []

    @torch.compiler.disable
    def log_and_scale(t):
        calls.append(t.shape[0])   # an effect eager makes once per call
        return t * 2

    def f(x):
        return log_and_scale(x.relu() + 1).sum(0)

    opt = dynamo.optimize(f)
    for k in range(4):
        x = torch.randn(5, 3)
        assert close(opt(x), f(x)), k
    assert calls == [5] * 8            # once per call on either side, never while recording twice
    assert "marked torch.compiler.disable" in dynamo.report()
    assert dynamo.counters()["aborts"] == 0
