"""torch.compile(model, backend="dynamo"): PyTorch's front end (TorchDynamo's FX graphs) with
dynamo's engine behind it. Every call is compared with eager; native runs are counted."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import dynamo

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.fixture(autouse=True)
def fresh():
    torch.manual_seed(0)
    torch._dynamo.reset()
    dynamo.reset()
    yield
    torch._dynamo.reset()
    dynamo.reset()


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 8))


def test_by_name_matches_eager_on_every_call_and_runs_native_code():
    model = mlp().eval()
    compiled = torch.compile(copy.deepcopy(model), backend="dynamo")
    with torch.no_grad():
        for rows in (7, 7, 7, 1, 1023, 7):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert dynamo.counters()["native_runs"] > 0


def test_backend_function_on_broadcasting_non_contiguous_and_empty_inputs():
    def fn(x, b):
        return torch.sigmoid(x * 2 + b).sum(-1) - x.mean()

    compiled = torch.compile(fn, backend=dynamo.backend)
    b = torch.randn(5)
    for x in (torch.randn(5, 3).t(), torch.randn(6, 5), torch.randn(6, 5)[::2], torch.randn(0, 5)):
        got, want = compiled(x, b), fn(x, b)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_graph_breaks_give_each_graph_to_the_engine():
    def fn(x):
        y = torch.relu(x) + 1
        if y.sum().item() > 10:  # a graph break: TorchDynamo hands two graphs over
            return y * 2
        return y - 3

    compiled = torch.compile(fn, backend="dynamo")
    for scale in (0.0, 10.0, 0.0, 10.0):
        x = torch.randn(8) + scale
        torch.testing.assert_close(compiled(x), fn(x))
    assert dynamo.counters()["traces_compiled"] >= 2


def test_input_mutations_happen_as_in_eager():
    def fn(x, acc):
        acc.add_(x * 2)
        return acc.sum()

    compiled = torch.compile(fn, backend="dynamo")
    acc_e, acc_j = torch.zeros(9), torch.zeros(9)
    for _ in range(3):
        x = torch.randn(9)
        torch.testing.assert_close(compiled(x, acc_j), fn(x, acc_e))
        torch.testing.assert_close(acc_j, acc_e)


def test_training_gives_eager_gradients_and_losses():
    eager = mlp().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="dynamo")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_j = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        x, target = torch.randn(8, 16), torch.randn(8, 8)
        losses = []
        for m, opt in ((eager, opt_e), (compiled, opt_j)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for pe, pj in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(pj, pe, rtol=1e-5, atol=1e-6)


def test_options_are_refused_not_ignored():
    compiled = torch.compile(lambda x: x + 1, backend="dynamo", options={"max_autotune": True})
    with pytest.raises(Exception, match="takes no options"):
        compiled(torch.randn(3))


def test_the_name_is_known_after_import_dynamo_in_a_source_checkout():
    """A source checkout has no entry point (an installed package does: tests/wheel_install.sh):
    `import dynamo` before torch._dynamo is loaded makes the name known once it is."""
    code = ("import sys, torch, dynamo\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "f = torch.compile(lambda x: torch.tanh(x) * 3, backend='dynamo')\n"
            "x = torch.randn(33)\n"
            "for _ in range(3): assert torch.allclose(f(x), torch.tanh(x) * 3)\n"
            "print(dynamo.counters()['native_runs'])\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) >= 1


def _grows(x, cache):
    """A decode step in miniature: a cache one longer each call, sizes used as numbers."""
    kv = torch.cat([cache, x], 0)
    pos = torch.arange(kv.shape[0] + 1)[1:].float()
    return (kv * pos.unsqueeze(-1)).sum(0) / kv.shape[0], kv


def test_dynamic_sizes_passed_as_integers_are_one_size_family():
    """With dynamic shapes TorchDynamo hands each size symbol to the backend as an integer
    argument of its own (here the cache's length, new at every call): the backend reads it from
    the tensor it is a dim of, so one size family serves every length (it was a value that
    changed on every call: recorded 4 times, then left to CPython). Every call matches eager."""
    compiled = torch.compile(_grows, backend="dynamo")
    cache = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(30):
            x = torch.randn(1, 8)
            want = _grows(x, cache)
            got = compiled(x, cache)
            torch.testing.assert_close(got, want)
            cache = want[1]
    c = dynamo.counters()
    assert c["size_instances"] >= 20 and c["traces_compiled"] <= 5, c
    assert c["native_runs"] >= 20, c


def test_a_program_whose_sizes_make_no_family_stops_recording_each_size():
    """Sizes that no family can follow (each a number Python branches on) would be recorded once
    per size: after a few such recordings in a row new sizes run eagerly, the traces made keep
    serving their own sizes, and every call matches eager."""
    def f(x):
        n = x.shape[0]
        return x * (n % 3) + x.sum() * n  # (n % 3 into an op: a number, not a size it follows)

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in list(range(2, 30)) + list(range(2, 6)):
            x = torch.randn(n, 4)
            torch.testing.assert_close(opt(x), f(x))
    c = dynamo.counters()
    assert c["traces_compiled"] <= 12, c
    assert c["eager_runs"] >= 10, c
