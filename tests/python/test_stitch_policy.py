"""A stitch whose continuation cannot be recorded: one failure blacklists it (the continuation
starts from the same state on every call) and drops the root trace, so the rest of each call
is not left to dynamo's interpreter, slower than CPython; the function then runs in CPython
(recording it again would meet the same stitch) -- unless the tree's stitches stored into outside
objects (a cache filled on the first call), when the next call is recorded once more. The
results are eager's on every call."""
import torch

import dynamo
from conftest import matches_eager


@dynamo.disable
def unrecordable(t):  # a stitch
    return t


@dynamo.disable
def helper(t):
    return t * 3


def f(x):
    y = unrecordable(x * 2)
    try:  # a call the recorder cannot make inside a try block cannot be stitched: an abort
        z = helper(y)
    finally:
        pass
    return z + 1


def test_unrecordable_continuation_drops_the_root_trace():
    jit = dynamo.optimize(f)  # held: report() lists the optimized functions alive
    matches_eager(jit, f, lambda: torch.randn(6), calls=10)
    c = dynamo.counters()
    assert c["aborts"] >= 1 and c["traces_compiled"] == 1, c  # recorded once, not again
    assert c["eager_runs"] >= 8, c  # left to CPython from the second call on
    assert "cannot be recorded" in dynamo.report(), dynamo.report()
    assert c["exits_resumed"] <= 1, c  # the rest was interpreted once at most, not every call


def many_steps(x, log):
    for i in range(6):
        x = x * 2 + i
        log.append(i)   # a stitch each time round
    return x


def test_a_call_past_max_stitches_leaves_the_function_to_cpython():
    import dynamo
    old = dynamo.config.max_stitches
    dynamo.config.max_stitches = 3
    try:
        opt = dynamo.optimize(many_steps)
        x = torch.randn(5)
        for _ in range(4):
            got, want = [], []
            assert torch.allclose(opt(x, got), many_steps(x, want)) and got == want
        c = dynamo.counters()
        # not interpreted from the 4th stitch on every call: the root went, CPython runs it
        assert c["aborts"] >= 1 and c["eager_runs"] >= 2 and c["exits_resumed"] <= 1, c
        assert "max_stitches" in dynamo.report()
    finally:
        dynamo.config.max_stitches = old


class CachedBias(torch.nn.Module):
    """timm's LeViT attention: a per-device cache of a parameter gather, filled on the first call
    (an item assignment into a dict the module keeps: a stitch), read on later calls."""

    def __init__(self, n):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(n))
        self.register_buffer("idx", torch.arange(n).flip(0), persistent=False)
        self.cache = {}

    def forward(self, x):
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias[self.idx]
        return torch.tanh(x + self.cache[key])


def matches_its_twin(make, calls, shape):
    """make() optimized, called `calls` times under no_grad on random inputs of shape beside an
    eager twin with the same state (results equal each call); returns the optimized module."""
    torch.manual_seed(0)
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    opt = dynamo.optimize(model)
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(shape)
            torch.testing.assert_close(opt(x), ref(x))
    return model


def test_a_cache_filled_on_the_first_call_is_recorded_again_once_filled():
    """More cache fills than config.max_stitches on the first call. Without write-backs each fill
    is a stitch: the stitch tree overflows and the root goes, but its stitches were stores into the
    module's own objects -- the next call finds the caches filled and records the forward whole (it
    was left to CPython, run in parts). With write-backs (the default) the fills are item
    write-backs of the first call's trace, and the filled forward is the second trace."""
    n = dynamo.config.max_stitches + 2
    dynamo.config.write_backs = False
    try:
        model = matches_its_twin(lambda: torch.nn.Sequential(*[CachedBias(8) for _ in range(n)]), 5, (3, 8))
    finally:
        dynamo.config.write_backs = True
    f = model.forward
    assert len(f.compiled) == 1 and f.native_runs >= 3 and not f.parts, dynamo.report()
    assert "max_stitches" in dynamo.report()  # (the first call's tree, said)
    dynamo.reset()
    model = matches_its_twin(lambda: torch.nn.Sequential(*[CachedBias(8) for _ in range(n)]), 5, (3, 8))
    f = model.forward
    assert len(f.compiled) == 2 and f.native_runs >= 3 and not f.parts, dynamo.report()


def test_a_tree_the_call_drops_is_not_compiled():
    """The traces of a tree that the same call drops (past config.max_stitches) wait for the
    call's end to be compiled, and are not: no LLVM time, no guard function; the results are
    eager's."""
    old = dynamo.config.max_stitches
    dynamo.config.max_stitches = 3
    try:
        opt = dynamo.optimize(many_steps)
        x = torch.randn(7)
        got, want = [], []
        assert torch.allclose(opt(x, got), many_steps(x, want)) and got == want
        c = dynamo.counters()
        assert c["compile_seconds"] == 0.0 and c["compiles_skipped"] == 4, c  # the root and 3 stitch traces
        assert not opt.compiled and "max_stitches" in dynamo.report()
    finally:
        dynamo.config.max_stitches = old


def steps_then_more(x, log):
    for i in range(4):
        x = x * 2 + i
        log.append(i)   # a stitch each time round
    return torch.tanh(x)


def test_a_stitched_tree_is_compiled_when_its_call_ends():
    """A tree that fits: every trace of it has its code when the recording call returns, and the
    next calls run it natively (the continuations linked as they were before), with eager's results."""
    opt = dynamo.optimize(steps_then_more)
    x = torch.randn(1023)
    got, want = [], []
    assert torch.allclose(opt(x, got), steps_then_more(x, want)) and got == want
    c = dynamo.counters()
    assert c["traces_compiled"] == 1 and c["stitch_traces"] == 4 and c["compiles_skipped"] == 0, c
    root = opt.compiled[0]
    tree, todo = [], [root]
    while todo:
        t = todo.pop()
        tree.append(t)
        todo += [s for snap in t.exits for s in snap.sides]
    assert len(tree) == 5 and not any(t.is_pending for t in tree) and all(t.handle is not None for t in tree)
    for k in range(3):
        x = torch.randn(1023)
        got, want = [], []
        assert torch.allclose(opt(x, got), steps_then_more(x, want)) and got == want
    assert dynamo.counters()["native_runs"] == 3, dynamo.counters()
    assert dynamo.counters()["interpreted_runs"] == c["interpreted_runs"]  # nothing recorded again


def test_a_stitched_tree_whose_compile_fails_runs_eagerly(monkeypatch):
    """The compile of a pending trace fails at the call's end (DYNAMO_FAULT=compile): counted and
    said like a compile failure at once, its tree dropped, and every call returns eager's result."""
    monkeypatch.setenv("DYNAMO_FAULT", "compile")
    opt = dynamo.optimize(steps_then_more)
    for _ in range(3):
        x = torch.randn(7)
        got, want = [], []
        assert torch.allclose(opt(x, got), steps_then_more(x, want)) and got == want
    c = dynamo.counters()
    assert c["compile_failures"] >= 1 and c["native_runs"] == 0, c
    assert "injected fault" in dynamo.report(), dynamo.report()


def steps_and_a_store(x, log, cache):
    cache["seen"] = x.shape[0]  # a store into an outside object: a stitch
    for i in range(6):
        x = x * 2 + i
        log.append(i)   # a stitch each time round (a call, no store)
    return torch.tanh(x)


def test_a_tree_full_without_its_stores_is_not_recorded_again():
    """A tree past config.max_stitches whose stitches include a store into an outside object is
    recorded once more (the store may be gone next time: a cache filled on the first call) --
    unless the stitches that are no stores fill the tree alone: then it would overflow again, and
    the function is left to CPython at once (a detection model's per-class loop of nms calls was
    recorded twice, ~1 s each). Results are eager's on every call."""
    old = dynamo.config.max_stitches
    dynamo.config.max_stitches = 4
    try:
        opt = dynamo.optimize(steps_and_a_store)
        for k in range(4):
            x = torch.randn(5 + k)
            got, want, c1, c2 = [], [], {}, {}
            assert torch.allclose(opt(x, got, c1), steps_and_a_store(x, want, c2)) and got == want and c1 == c2
        c = dynamo.counters()
        assert c["interpreted_runs"] == 1 + 4, c  # the root and 4 continuations, in the first call only
        assert c["eager_runs"] == 3 and "max_stitches" in dynamo.report(), c
    finally:
        dynamo.config.max_stitches = old


class Heads(torch.nn.Module):
    """A detection model's RoIHeads in small: parts of its own, then a loop of stitches (its
    per-class nms calls)."""

    def __init__(self):
        super().__init__()
        self.pool = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.pool(x)
        kept = [unrecordable(y[i] * 2) for i in range(6)]  # a stitch each
        return self.out(torch.stack(kept))


class TwoParts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.heads = Heads()

    def forward(self, x):
        return self.heads(self.backbone(x))


def test_a_part_whose_own_stitches_overflowed_is_split_at_once():
    """The module's first recording overflows config.max_stitches with stitches that are all
    inside one of its parts: the module runs in CPython with its parts compiled apart, and that
    part, which recorded alone would overflow the same way, runs in CPython with its own parts
    compiled apart from its first call (not recorded once more to find that out: a detection
    model's second call recorded RoIHeads in vain)."""
    old = dynamo.config.max_stitches
    dynamo.config.max_stitches = 3
    try:
        model = matches_its_twin(TwoParts, 4, (6, 8))
        heads = model.heads.forward
        assert "filled config.max_stitches" in (heads.policy.disabled_reason or ""), dynamo.report()
        tries = heads.policy.attempts  # never recorded: the one attempt is the split
        assert len(tries) == 1 and "filled config.max_stitches" in tries[0].reason and not tries[0].ops, \
            [a.reason for a in tries]
        assert sorted(heads.parts) == ["out", "pool"], heads.parts
        assert model.heads.pool.forward.native_runs >= 2 and model.backbone.forward.native_runs >= 2, dynamo.report()
    finally:
        dynamo.config.max_stitches = old
