"""Generators (genexprs and plain `yield` functions) run by the recording interpreter: lazily, as
CPython runs them, so short-circuiting consumers stop where eager stops, reads inside them are
guarded, tensor ops inside them are recorded. Each case is compared with eager on every call,
with the state it depends on changed between calls."""
import torch
import torch.nn as nn

import dynamo


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def native_runs():
    return dynamo.counters()["native_runs"]


def test_genexpr_over_tensors_is_recorded():
    def f(xs):
        return torch.stack(list(t * 2 + 1 for t in xs)).sum(0)
    jit = dynamo.optimize(f)
    for _ in range(3):
        xs = [torch.randn(5) for _ in range(3)]
        assert same(jit(xs), f(xs))
    assert native_runs() >= 2


def test_all_of_a_genexpr_guards_what_it_read():
    def f(a, b):
        if all(t.dim() == 2 for t in (a, b)):
            return a @ b
        return a * b
    jit = dynamo.optimize(f)
    for a, b in [(torch.randn(3, 3), torch.randn(3, 3))] * 3 + [(torch.randn(3), torch.randn(3))] * 2:
        assert same(jit(a, b), f(a, b))


def test_any_stops_where_eager_stops():
    seen = []

    def probe(t):
        seen.append(t.shape[0])
        return t.shape[0] > 2

    def f(xs):
        if any(probe(t) for t in xs):
            return xs[0] + 1
        return xs[0] - 1
    jit = dynamo.optimize(f)
    for n in range(4):
        xs = [torch.randn(1), torch.randn(3), torch.randn(5)]
        seen.clear()
        want = f(xs)
        eager_seen = list(seen)
        seen.clear()
        got = jit(xs)
        assert same(got, want) and seen == eager_seen == [1, 3], (n, seen, eager_seen)


def test_generator_function_with_state():
    def pairs(xs):
        prev = None
        for x in xs:
            if prev is not None:
                yield prev * x
            prev = x

    def f(xs):
        total = torch.zeros(4)
        for p in pairs(xs):
            total = total + p
        return total
    jit = dynamo.optimize(f)
    for k in range(2, 6):
        xs = [torch.randn(4) for _ in range(k)]
        assert same(jit(xs), f(xs))


def test_break_out_of_a_generator_loop():
    def gen(xs):
        for x in xs:
            yield x.relu()

    def f(xs, stop):
        out = []
        for k, y in enumerate(gen(xs)):
            if k == stop:
                break
            out.append(y)
        return out
    jit = dynamo.optimize(f)
    for stop in (1, 2, 1, 2):
        xs = [torch.randn(3) for _ in range(4)]
        assert same(jit(xs, stop), f(xs, stop))


def test_exception_inside_a_genexpr_propagates_as_in_eager():
    def f(xs):
        return sum(t.sum() * (1 // len(t.shape[5:])) for t in xs)  # ZeroDivisionError
    jit = dynamo.optimize(f)
    xs = [torch.randn(2)]
    for _ in range(2):
        try:
            f(xs)
        except ZeroDivisionError as e:
            want = str(e)
        try:
            jit(xs)
        except ZeroDivisionError as e:
            assert str(e) == want
        else:
            raise AssertionError("no ZeroDivisionError")


def test_data_dependent_branch_inside_a_generator_falls_back_correctly():
    def f(xs):
        return [t + 1 if bool(t.sum() > 0) else t - 1 for t in xs] + list(t * 2 for t in xs if bool(t.mean() > 0))
    jit = dynamo.optimize(f)
    for _ in range(4):
        xs = [torch.randn(6) for _ in range(3)]
        assert same(jit(xs), f(xs))


def test_transformer_encoder_layer_fast_path_check_runs_natively():
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
    jit = dynamo.optimize(layer)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 7, 32)
            assert same(jit(x), layer(x))
    assert native_runs() >= 2, dynamo.report()


def test_module_requires_grad_check_in_a_genexpr_is_guarded():
    lin = nn.Linear(4, 4)

    def f(x):
        if any(p.requires_grad for p in (lin.weight, lin.bias)):
            return lin(x) + 1
        return lin(x) - 1
    jit = dynamo.optimize(f)
    with torch.no_grad():
        x = torch.randn(2, 4)
        for flag in (True, True, False, False, True):
            lin.weight.requires_grad_(flag)
            lin.bias.requires_grad_(flag)
            assert same(jit(x), f(x)), flag


def test_function_returning_a_genexpr_gives_a_working_generator():
    def f(xs):
        return (t * 2 for t in xs)
    jit = dynamo.optimize(f)
    for _ in range(4):
        xs = [torch.randn(3) for _ in range(3)]
        got = jit(xs)
        assert type(got).__name__ == "generator"
        assert same(list(got), list(f(xs)))


def test_yield_from_generators_lists_and_return_values():
    """`yield from` a generator (its return value handed back), a list and a genexpr, nested as
    Module.named_modules recurses: recorded, native from the second call, eager's every call."""
    def inner(x, n):
        for i in range(n):
            yield x * i
        return x.sum()

    def outer(x):
        total = yield from inner(x, 3)
        yield total
        yield from [x + 1, x - 1]
        yield from (x * k for k in range(2))

    def f(x):
        return sum(outer(x))
    jit = dynamo.optimize(f)
    for _ in range(4):
        x = torch.randn(5)
        assert same(jit(x), f(x))
    assert native_runs() >= 3, dynamo.report()


def test_modules_walk_in_a_forward_is_recorded():
    """A forward that walks self.modules() (yield from inside named_modules), as
    TransformerEncoderLayer's fast-path check does, and reads the hooks of each."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

        def forward(self, x):
            hooked = any(len(m._forward_hooks) for m in self.modules())
            return self.b(self.a(x)) * (2 if hooked else 1)
    net = Net()
    jit = dynamo.optimize(net)
    with torch.no_grad():
        for k in range(4):
            if k == 2:
                net.b[1].register_forward_hook(lambda m, i, o: None)
            x = torch.randn(3, 4)
            assert same(jit(x), net(x)), k
    assert native_runs() >= 1, dynamo.report()
