"""Programs that change state between calls (issue 40): every call is compared with eager, and
the state is changed between calls the way a user's program would."""
import math
import types

import torch

import dynamo


def _each_call_matches(opt, plain, calls):
    """calls: a list of (change, args); change() runs before both sides of that call."""
    for i, (change, args) in enumerate(calls):
        change()
        want = plain(*args)
        got = opt(*args)
        assert torch.allclose(got, want), (i, got, want)


# -- a function stored in a user's module attribute is guarded, not taken as fixed -------------

def test_a_users_module_attribute_rebound_between_calls():
    cfg = types.ModuleType("cfg")
    cfg.ACT, cfg.SCALE = torch.relu, 2.0

    def fn(x):
        return cfg.ACT(x) * cfg.SCALE

    x = torch.randn(7)

    def use(act, scale=2.0):
        def change():
            cfg.ACT, cfg.SCALE = act, scale
        return change, (x,)
    _each_call_matches(dynamo.optimize(fn), fn, [use(torch.relu), use(torch.relu), use(torch.tanh),
                                                 use(torch.tanh, 3.0), use(torch.sigmoid), use(torch.relu)])


def test_a_stdlib_modules_function_rebound_between_calls(monkeypatch):
    fake = types.ModuleType("fakemath")
    fake.f = math.sqrt

    def fn(x, n):
        return x * fake.f(n)

    x = torch.randn(5)

    def use(f):
        def change():
            fake.f = f
        return change, (x, 4.0)
    _each_call_matches(dynamo.optimize(fn), fn, [use(math.sqrt), use(math.sqrt), use(math.log), use(math.exp)])


def test_class_global_and_instance_attributes_rebound_between_calls():
    g = {"ACT": torch.relu}

    class Cfg:
        ACT = torch.relu

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.relu

        def forward(self, x):
            return self.act(x) + Cfg.ACT(x) + g["ACT"](x)

    m, ref = M(), M()
    opt = dynamo.optimize(m)
    x = torch.randn(6)
    for act in (torch.relu, torch.relu, torch.tanh, torch.tanh, torch.sigmoid):
        m.act = ref.act = Cfg.ACT = g["ACT"] = act
        assert torch.allclose(opt(x), ref(x)), act


def test_torchs_own_functions_stay_unguarded():
    """torch's own builtins are taken as fixed: no guard per torch function read."""
    def fn(x):
        return torch.tanh(x) + torch.special.expit(x)

    opt = dynamo.optimize(fn)
    x = torch.randn(4)
    opt(x)
    c = opt.compiled[0]
    assert not any("tanh" in chk or "expit" in chk for chk in c.guards._checks), c.guards._checks


# -- state that lives across a stitch (a call dynamo cannot record) --------------------------------

def _opaque(x):
    """A call dynamo does not record (a Python list of the values): the trace stitches here."""
    return x.tolist()


def _calls(fn, make_args, n=4):
    """fn and dynamo.optimize(fn) on n calls of fresh arguments: the results must agree."""
    opt = dynamo.optimize(fn)
    for i in range(n):
        args = make_args()
        got, want = opt(*args), fn(*args)
        _same(got, want, i)
    return opt


def _same(got, want, where):
    if isinstance(want, torch.Tensor):
        assert torch.allclose(got, want), (where, got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for g, w in zip(got, want):
            _same(g, w, where)
    else:
        assert got == want, (where, got, want)


def test_a_tuple_iterator_continues_where_it_stood_after_a_stitch():
    def fn(x):
        it = iter(tuple(range(10)))
        x = x + next(it)
        x = x + next(it)
        x = x + next(it)
        _opaque(x)
        for _ in range(4):
            x = x * 10 + next(it)
        return x, next(it)
    _calls(fn, lambda: (torch.zeros(2),))


def test_iterators_of_every_kind_continue_after_a_stitch():
    def ranges(x):
        rng = iter(range(3, 8, 2))
        x = x + next(rng)
        _opaque(x)
        return x, list(rng)

    def lists(x):
        it = iter([4, 5, 6, 7])
        x = x + next(it)
        _opaque(x)
        x = x * next(it)
        return x, list(it)

    def enumerates(x):
        en = enumerate([1.5, 2.5, 3.5])
        i, v = next(en)
        x = x + i + v
        _opaque(x)
        for i, v in en:
            x = x * v + i
        return x

    def zips(x):
        z = zip((1, 2, 3), (4, 5, 6))
        a, b = next(z)
        x = x + a * b
        _opaque(x)
        return x + sum(p * q for p, q in z)

    def loops(x):
        for k in (1, 2, 3, 4):  # the loop's own iterator, live across the stitch
            x = x + k
            if k == 2:
                _opaque(x)
        return x

    for fn in (ranges, lists, enumerates, zips, loops):
        _calls(fn, lambda: (torch.randn(3),))


def test_a_nonlocal_written_after_a_stitch_is_the_programs():
    def make():
        out = None

        def fn(a, b):
            nonlocal out
            c = torch.tensor(_opaque(a)) * 0 + b.sum()
            out = a + b * 10 + c
            return c
        return fn, lambda: out

    fn, got = make()
    ref, want = make()
    opt = dynamo.optimize(fn)
    for i in range(4):
        a, b = torch.randn(3), torch.randn(3)
        assert torch.allclose(opt(a, b), ref(a, b))
        assert got() is not None and torch.allclose(got(), want()), i


def test_a_nonlocal_read_after_a_stitch_that_wrote_it():
    def make():
        count = [0]
        scale = 1.0

        def bump(x):
            nonlocal scale
            scale = scale + 1.0  # (the opaque call writes the cell the traced code reads)
            count[0] += 1
            return x.tolist()

        def fn(x):
            bump(x)
            return x * scale
        return fn

    fn, ref = make(), make()
    opt = dynamo.optimize(fn)
    for i in range(4):
        x = torch.randn(3)
        assert torch.allclose(opt(x), ref(x)), i


def test_an_object_whose_init_stitches_is_the_object_after_it():
    class Holder:
        def __init__(self, x):
            self.values = _opaque(x)  # the stitch is inside __init__, run by Holder(x)
            self.n = len(self.values)

    def fn(x):
        h = Holder(x)
        return x * h.n

    _calls(fn, lambda: (torch.randn(5),))


def test_profiler_blocks_around_a_call_dynamo_cannot_record():
    def fn(x):
        with torch.autograd.profiler.profile(use_cpu=True):
            with torch.autograd.profiler.record_function("fn"):
                y = (x * 2).tolist()
        return x + len(y)

    _calls(fn, lambda: (torch.randn(4),), n=3)


def test_a_lazy_module_materializes_on_its_first_call():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    opt = dynamo.optimize(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        y = opt(x)
        assert y.shape == (2, 4)
        for _ in range(3):
            x = torch.randn(2, 3)
            assert torch.allclose(opt(x), m(x))


def test_a_rank_change_after_calls_eager_failed_in():
    B = torch.randn(9, 8)

    def fn(x):
        return (x + B).relu()

    opt = dynamo.optimize(fn)
    for shape in ((4, 8), (2, 8), (1, 8), (8,), (8,), (9, 8), (3, 1, 8)):
        x = torch.randn(*shape)
        try:
            want = fn(x)
        except RuntimeError as e:
            try:
                opt(x)
            except RuntimeError as got:
                assert type(got) is type(e)
                continue
            raise AssertionError(f"{shape}: eager raised {e}, dynamo did not")
        assert torch.allclose(opt(x), want), shape


# -- Python objects as arguments, changing between calls: guarded as read -------------------------

def test_python_object_arguments_changing_between_calls():
    import collections
    import dataclasses
    import enum
    import functools

    @dataclasses.dataclass
    class Affine:
        scale: float
        shift: float

    Pair = collections.namedtuple("Pair", "scale shift")

    class Mode(enum.Enum):
        A = 1
        B = 2

    x = torch.randn(6)
    lst = [torch.full((1,), float(i)) for i in range(6)]
    cases = [
        (lambda l, s: l[s] + [torch.ones(1)], [(lst, s) for s in (slice(0, 2), slice(0, 2), slice(1, 5), slice(None, None, 2))]),
        (lambda t, s: t[s] * 2, [(x, s) for s in (slice(0, 2), slice(0, 2), slice(1, 5), slice(4, None))]),
        (lambda t, r: sum([t * i for i in r], t * 0), [(x, r) for r in (range(3), range(3), range(5), range(1, 4))]),
        (lambda t, p: p(t), [(x, functools.partial(torch.mul, other=k)) for k in (1.0, 1.0, 2.0, 3.0)]),
        (lambda t, c: t * c.scale + c.shift, [(x, Affine(a, b)) for a, b in ((1, 2), (1, 2), (3, 4), (1, 5))]),
        (lambda t, c: t * c.scale + c.shift, [(x, Pair(a, b)) for a, b in ((1, 2), (1, 2), (3, 4), (1, 5))]),
        (lambda t, m: t + 1 if m is Mode.A else t - 1, [(x, m) for m in (Mode.A, Mode.A, Mode.B, Mode.A)]),
        (lambda t, d: t * d["scale"][0], [(x, {"scale": (k,)}) for k in (1.0, 1.0, 2.0, 0.5)]),
    ]
    for fn, calls in cases:
        opt = dynamo.optimize(fn)
        for i, args in enumerate(calls):
            _same(opt(*args), fn(*args), (fn, i))


def test_a_stitch_with_no_live_tensor_hands_on_the_steps_result_only():
    """A cut trace with no live tensor still has an output (every trace has one); that output was
    taken for the first live value, and the step's result read as the live value after it: the
    continuation multiplied by len() of the wrong value (18x eager's result; found by the fuzzer)."""
    def fn(x0, x1):
        t1 = x1.reshape(-1)  # (the trace's one op: its output, not live at the stitch)
        return sum([x0 * len(x0.tolist()) * c for c in (1.0, 0.5)])

    opt = dynamo.optimize(fn)
    for i in range(4):
        g = torch.Generator().manual_seed(i)
        x0, x1 = torch.randn(3, 3, generator=g), torch.randn(3, 3, 3, 3, generator=g)
        assert torch.allclose(opt(x0, x1), fn(x0, x1)), i


def test_a_trace_with_no_code_before_a_stitch_checks_its_inputs():
    """Nothing recorded before a stitch (x.tolist() first): the trace has no native code, so its
    tensor checks (sizes, strides, dtype) are made in Python; the step then reads this call's
    input, never the recorded call's geometry (found by the fuzzer: len(x.tolist()) was 3 for a
    4-row x on every other call)."""
    def first(x):
        return x * len(x.tolist())

    def in_a_comprehension(x):
        return sum([x * len(x.tolist()) * c for c in (1.0, 0.5)])

    base = torch.randn(5, 4)
    inputs = [torch.randn(3, 3), torch.randn(4, 3), torch.randn(3, 3), torch.randn(4, 3),
              base.t()[:3, :3], torch.randn(3, 3, dtype=torch.float64), base[:3, :3]]
    for fn in (first, in_a_comprehension):
        opt = dynamo.optimize(fn)
        for i, x in enumerate(inputs):
            got, want = opt(x), fn(x)
            assert got.shape == want.shape and got.dtype == want.dtype and torch.allclose(got, want), (fn.__name__, i)


def test_a_list_made_from_star_arguments_is_guarded():
    """`l = [*args]` then `l[0]`: what the program reads from its own list has no source, so the
    elements are guarded where the list is made (the number was taken as fixed: x * 2 on a call
    that passed 3). A star call's own tuple keeps the sources instead (f(x, *args))."""
    def unpacked(x, *args):
        lst = [*args]
        return x * lst[0] + len(lst)

    def displayed(x, args):
        lst = [1.0, *args]
        return x * lst[1]

    def forwarded(x, *args):
        return torch.add(x, *args)

    x = torch.ones(3)
    opt_u, opt_d, opt_f = dynamo.optimize(unpacked), dynamo.optimize(displayed), dynamo.optimize(forwarded)
    for a in ((2.0,), (2.0,), (3.0,), (3.0, 1.0), (5.0,)):
        assert torch.equal(opt_u(x, *a), unpacked(x, *a)), a
        assert torch.equal(opt_d(x, list(a)), displayed(x, list(a))), a
        assert torch.equal(opt_f(x, a[0] * torch.ones(3)), forwarded(x, a[0] * torch.ones(3))), a


# -- a flag's guard: a bool is guarded by identity (True and False are the only bools) -----------

def test_a_flag_flipped_or_replaced_by_a_number_between_calls():
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.on = True

        def forward(self, x):
            return torch.tanh(x) if self.on else x * 2

    m = Gate()
    opt = dynamo.optimize(Gate())  # (its own copy: flags set on both below)
    x = torch.randn(7)

    def setting(v):
        def change():
            m.on = opt.on = v
        return change, (x,)
    # 1 and 0 are no bools: `1 is True` is False, so they miss the flag's trace (as `type is bool` did)
    _each_call_matches(opt, m, [setting(True), setting(True), setting(False), setting(1), setting(0),
                                setting(True), setting(False)])
    f = opt.forward
    assert len(f.compiled) >= 3 and f.native_runs >= 1, dynamo.report()
