"""Data-dependent branches (`if t:` on a tensor the trace computed) become side exits: the trace
goes on along the recorded branch behind a native guard (the IR's side exit op); a call that takes the other
branch leaves the trace there and resumes in the interpreter from a snapshot of the Python state;
a hot exit gets a side trace recorded from that snapshot, after which those calls run natively
too. Every call must equal eager, mutations included."""
import torch

import dynamo


def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


h_fn = [None]  # the last optimized function run_calls made


def run_calls(fn, make, n, inplace=False):
    """Calls the compiled fn n times next to eager; returns the counters after each call."""
    opt = dynamo.optimize(fn)
    h_fn[0] = opt
    history = []
    for i in range(n):
        args = make(i)
        e_args = [a.clone() for a in args]
        c_args = [a.clone() for a in args]
        want = fn(*e_args)
        got = opt(*c_args)
        assert same(got, want), f"call {i}"
        if inplace:
            assert all(torch.equal(c, e) for c, e in zip(c_args, e_args)), f"call {i}: mutated inputs differ"
        history.append(dynamo.counters())
    return history


def assert_native_tail(history, tail=10):
    first, last = history[-tail - 1], history[-1]
    assert last["interpreted_runs"] == first["interpreted_runs"], (first, last)
    assert last["exits_resumed"] == first["exits_resumed"], (first, last)
    assert last["side_exits"] > first["side_exits"], (first, last)
    assert last["native_runs"] - first["native_runs"] == tail, (first, last)


def alternating(x, w):
    h = x * w
    if h.sum() > 0:
        y = torch.relu(h) + 1
    else:
        y = torch.tanh(h) - 1
    return y * 2


def test_alternating_signs_become_native():
    g = torch.Generator().manual_seed(0)

    def make(i):
        return (torch.randn(33, generator=g) + (3.0 if i % 2 == 0 else -3.0), torch.rand(33, generator=g) + 0.5)

    h = run_calls(alternating, make, 40)
    assert h[-1]["traces_compiled"] == 1 and h[-1]["side_traces_compiled"] == 1
    assert_native_tail(h)
    text = dynamo.report()
    assert "exit 0 at test_side_exits.py" in text and "linked natively to 1 side trace" in text, text
    tree = str(dynamo.explain(h_fn[0], torch.ones(33), torch.ones(33)))
    assert "as it runs now" in tree and "branch on a tensor" in tree and "linked natively" in tree, tree


def helper(x):
    if x.mean() > 0:
        if x.amax() > 2.5:
            return x.clamp(max=2.0)
        return x * 3
    return -x


def nested(x, b):
    return helper(x + b) + 1


def test_nested_branches_inside_an_inlined_helper():
    g = torch.Generator().manual_seed(1)
    shifts = [4.0, 0.5, -3.0]

    def make(i):
        x = torch.rand(16, generator=g) + shifts[i % 3]
        return x, torch.zeros(16)

    h = run_calls(nested, make, 75)
    assert h[-1]["side_traces_compiled"] >= 2
    assert_native_tail(h)


def mutate_then_branch(x):
    x.add_(1.0)
    if x.sum() > 0:
        return x * 2
    return x - 1


def test_branch_after_inplace_write_never_applies_it_twice():
    g = torch.Generator().manual_seed(2)

    def make(i):
        return (torch.randn(8, generator=g) + (2.0 if i % 2 == 0 else -4.0),)

    h = run_calls(mutate_then_branch, make, 30, inplace=True)
    assert h[-1]["side_exits"] > 0 and h[-1]["native_runs"] > 0
    assert_native_tail(h)


def any_positive(x):
    if (x > 0).any():
        return x.relu()
    return -x


def test_bool_tensor_condition():
    def make(i):
        return (torch.full((5,), 1.0 if i % 3 == 0 else -1.0),)

    h = run_calls(any_positive, make, 40)
    assert_native_tail(h)


def noisy_branch(x):
    if x.sum() > 0:
        return x + 1
    y = x - x[::2].as_strided((2, 2), (2, 1)).sum()  # the side path cannot be traced: its exit resumes in the interpreter
    print("negative")
    return y


def test_side_path_that_cannot_be_traced_is_blacklisted(capsys):
    def make(i):
        return (torch.ones(4) * (1 if i % 2 == 0 else -1),)

    h = run_calls(noisy_branch, make, 60)
    assert capsys.readouterr().out.count("negative") == 2 * 30
    assert h[-1]["side_traces_compiled"] == 0 and h[-1]["exits_resumed"] > 0
    assert "blacklisted" in dynamo.report()


def repeat_by_count(x, counts):
    n = int(counts.sum().item())  # a trip count read from the data
    y = x
    for _ in range(n):
        y = y * 2 + 1
    return y


def test_loop_trip_count_from_item():
    def make(i):
        return torch.randn(8), torch.tensor([1.0, 1.0] if i % 2 == 0 else [1.0, 2.0])

    h = run_calls(repeat_by_count, make, 40)
    assert h[-1]["side_traces_compiled"] == 1
    assert_native_tail(h)


def scale_by_max(x):
    m = x.abs().max().item()  # a float read from the data steers arithmetic
    return x / m if m > 1.0 else x * 2


def test_float_item_guards_its_value():
    vals = [torch.tensor([0.5, -2.0, 1.0]), torch.tensor([0.5, -0.25, 0.125])]
    h = run_calls(scale_by_max, lambda i: (vals[i % 2],), 40)
    assert_native_tail(h)


def test_side_trace_limit_per_root():
    g = torch.Generator().manual_seed(3)
    shifts = [4.0, 0.5, -3.0]

    def make(i):
        return torch.rand(16, generator=g) + shifts[i % 3], torch.zeros(16)

    old = dynamo.config.max_side_traces
    dynamo.config.max_side_traces = 1
    try:
        h = run_calls(nested, make, 60)
    finally:
        dynamo.config.max_side_traces = old
    assert h[-1]["side_traces_compiled"] == 1
    assert h[-1]["exits_resumed"] > h[-11]["exits_resumed"]  # the other exit keeps resuming


def long_loop(x, w):
    for i in range(10):
        x = torch.tanh(x * w + i)
    return x.sum(-1)


def test_long_trace_is_cut_and_continues_in_side_traces():
    old = dynamo.config.max_trace_ops
    dynamo.config.max_trace_ops = 12  # 3 IR instructions per iteration: cut after 4
    try:
        h = run_calls(long_loop, lambda i: (torch.randn(4, 8), torch.randn(8)), 30)
    finally:
        dynamo.config.max_trace_ops = old
    assert h[-1]["traces_compiled"] == 1 and h[-1]["side_traces_compiled"] == 2
    first, last = h[-11], h[-1]
    assert last["interpreted_runs"] == first["interpreted_runs"]
    assert last["exits_resumed"] == first["exits_resumed"]
    assert last["native_runs"] - first["native_runs"] == 10
    assert "trace cut (config.max_trace_ops)" in dynamo.report()


def mask_dependent(x):
    idx = torch.nonzero(x > 0)               # how many rows: the data decides
    picked = torch.masked_select(x, x > 0.5)
    return idx.float().sum() + picked.sum() * 2, idx.shape[0]


def test_mask_dependent_shapes():
    data = [torch.tensor([1.0, -1.0, 2.0, 0.7]), torch.tensor([1.0, 1.0, 2.0, 0.2])]
    h = run_calls(mask_dependent, lambda i: (data[i % 2],), 40)
    assert h[-1]["side_traces_compiled"] == 1
    assert_native_tail(h)
