"""Machine code shared across sizes: a trace recorded again at other sizes lowers to the same IR
(sizes are data the code reads, lower_cpu.h size_params), so the engine reuses the machine code
compiled for the first one (counter code_shared) instead of compiling again. Every case is
compared with eager at each size: a number the code reads from the wrong place would show."""
import os
import subprocess
import sys

import pytest
import torch

import dynamo
from dynamo import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def record_every_size():
    """Each size recorded (no size families, sizes.py): the recorded traces share machine code.
    (test_size_families.py has the instances, which share it the same way.)"""
    old = config.dynamic
    config.dynamic = False
    yield
    config.dynamic = old


def run_sizes(fn, make, sizes, calls=2, **tol):
    """Runs fn optimized on make(n) for each n (calls times each), comparing with eager."""
    opt = dynamo.optimize(fn)
    with torch.no_grad():
        for n in sizes:
            args = make(n)
            want = fn(*args)
            for _ in range(calls):
                got = opt(*args)
                torch.testing.assert_close(got, want, **tol)
    return dynamo.counters()


def test_matmul_gelu_softmax_over_row_counts():
    w = torch.randn(64, 48)

    def f(x):
        return torch.nn.functional.gelu(x @ w).softmax(-1) * 2 + 1

    c = run_sizes(f, lambda n: (torch.randn(n, 64),), [5, 7, 9, 100, 256, 1023])
    assert c["traces_compiled"] == 6
    assert c["code_shared"] == 5, c
    assert c["native_runs"] >= 6


def test_reductions_over_the_varying_dim():
    """mean / var / std divide by the reduced extent, which is a number of the table."""

    def f(x):
        return (x.mean(0), x.sum(0), x.var(0), x.std(0, unbiased=False), x.amax(0), x.argmax(0),
                x.mean(), x.var())

    c = run_sizes(f, lambda n: (torch.randn(n, 33),), [3, 17, 40, 129], atol=1e-5, rtol=1e-5)
    assert c["code_shared"] >= 2, c


def test_row_reductions_at_other_row_counts():
    ln = torch.nn.LayerNorm(96)

    def f(x):
        return ln(x).relu() + x.softmax(-1) + x.log_softmax(-1)

    c = run_sizes(f, lambda n: (torch.randn(2, n, 96),), [3, 8, 31, 64], atol=1e-5, rtol=1e-5)
    assert c["code_shared"] >= 2, c


def test_split_whole_tensor_reduction():
    """Sums of 2^18+ elements are cut into chunks; the chunk bounds follow from the size."""

    def f(x):
        return x.sum(), (x * x).mean()

    c = run_sizes(f, lambda n: (torch.randn(n),), [300_001, 400_000, 1 << 19], rtol=1e-5, atol=1e-3)
    assert c["code_shared"] >= 1, c


def test_views_slices_and_broadcasts():
    b = torch.randn(40)

    def f(x, y):
        t = x.t() * 2 + y[:, : x.shape[0]]        # a transposed view and a slice
        s = x[1:] - x[:-1]                      # offsets into the same buffer
        return t + b[:, None], s.exp(), x.permute(1, 0).contiguous()

    c = run_sizes(f, lambda n: (torch.randn(n, 40), torch.randn(40, n + 3)), [4, 9, 33, 70])
    assert c["code_shared"] >= 2, c


def test_batch_of_a_small_cnn():
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    c = run_sizes(net, lambda n: (torch.randn(n, 3, 12, 12),), [2, 3, 5, 8], atol=1e-5, rtol=1e-4)
    assert c["code_shared"] >= 2, c


def test_in_place_writes_into_inputs():
    def f(x, y):
        x.mul_(2).add_(y)
        return x.sum(-1)

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for n in [3, 6, 11, 6]:
            x, y = torch.randn(n, 20), torch.randn(20)
            x2 = x.clone()
            for _ in range(2):
                want = f(x2, y)
                got = opt(x, y)
                torch.testing.assert_close(got, want)
                torch.testing.assert_close(x, x2)
    assert dynamo.counters()["code_shared"] >= 1


def test_another_dtype_is_other_code():
    def f(x):
        return (x * 3).tanh()

    opt = dynamo.optimize(f)
    with torch.no_grad():
        for x in (torch.randn(10), torch.randn(10, dtype=torch.float64), torch.randn(10).to(torch.bfloat16)):
            for _ in range(2):
                torch.testing.assert_close(opt(x), f(x))
    c = dynamo.counters()
    assert c["traces_compiled"] == 3 and c["code_shared"] == 0, c


def test_empty_and_size_one_tensors():
    def f(x):
        return x.relu().sum(0) + 1

    c = run_sizes(f, lambda n: (torch.randn(n, 5),), [0, 1, 4, 0, 9])
    assert c["native_runs"] >= 5


@pytest.mark.parametrize("share", ["0", "1"])
def test_switch_and_second_process(tmp_path, share):
    """DYNAMO_SHARE_CODE=0 compiles every trace; with the disk cache a second process loads
    the trace and its size table (the numbers the code reads) and gets the same values."""
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import json, torch, dynamo\n"
        "dynamo.config.dynamic = False  # every size recorded (or loaded), no size families\n"
        "torch.manual_seed(3)\n"
        "w = torch.randn(16, 16)\n"
        "def f(x):\n"
        "    return (x @ w).softmax(-1) + x.mean(0)\n"
        "opt = dynamo.optimize(f)\n"
        "ok = True\n"
        "with torch.no_grad():\n"
        "    for n in (5, 9, 5, 9, 30):  # (a mean over 4 rows or fewer is unrolled: other code)\n"
        "        x = torch.randn(n, 16)\n"
        "        ok = ok and torch.allclose(opt(x), f(x), atol=1e-6) and torch.allclose(opt(x), f(x), atol=1e-6)\n"
        "c = dynamo.counters()\n"
        "print(json.dumps([ok, c['traces_compiled'] + c['traces_from_store'], c['code_shared'], c['cache_hits']]))\n")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = dict(os.environ, DYNAMO_CACHE_DIR=str(cache), DYNAMO_SHARE_CODE=share,
               PYTHONPATH=os.path.join(ROOT, "python_shim"))
    out = []
    for _ in range(2):
        r = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout.strip().splitlines()[-1])
    first, second = [eval(o.replace("true", "True").replace("false", "False")) for o in out]
    assert first[0] and second[0], out
    assert first[1] == 3 and second[1] == 3, out
    if share == "0":
        assert first[2] == 0 and second[2] == 0, out
        assert second[3] >= 1, out   # the second process loaded objects from the disk cache
    else:
        assert first[2] == 2, out
        # every trace from the disk cache, the two that shared code too (their keys name the
        # first's object), and sharing it again in this process (one object loaded)
        assert second[3] == 3 and second[2] == 2, out


def test_sizes_past_the_cache_limit_run_natively():
    """Traces that share machine code do not count against cache_limit: 20 row counts are 20
    traces (one compile) and every call after each size's first runs natively."""
    def f(x):
        return (x * 2).softmax(-1) - 0.25  # code no other test compiled (the engine outlives reset)

    c = run_sizes(f, lambda n: (torch.randn(n, 24),), range(2, 22), calls=3)
    assert c["traces_compiled"] == 20 and c["code_shared"] == 19, c
    assert c["eager_runs"] == 0 and c["native_runs"] == 40, c


def test_size_variants_bounds_the_shared_traces(capfd):
    def f(x):
        return (x * 5 - 1).log_softmax(-1)  # code no other test compiled

    old = dynamo.config.size_variants
    dynamo.config.size_variants = 3
    try:
        c = run_sizes(f, lambda n: (torch.randn(n, 24),), range(2, 12), calls=2)
    finally:
        dynamo.config.size_variants = old
    # one own trace, 3 sharing ones; the 5th recording has no room and is dropped
    assert c["traces_compiled"] == 4 and c["code_shared"] == 3, c
    assert c["interpreted_runs"] == 5 and c["native_runs"] == 4 and c["eager_runs"] == 11, c
    assert "hit its cache limit (8 traces, 3 more sharing their code)" in capfd.readouterr().err


def test_dispatch_by_shape_keeps_every_guard():
    """Past 4 traces the call tries first the traces recorded at its argument shapes; the
    other guards (here a flag and a float) still decide among them."""
    def f(x, flag, s):
        return (x * s).relu() if flag else (x - s).sigmoid()

    opt = dynamo.optimize(f)
    old = dynamo.config.dynamic
    dynamo.config.dynamic = False  # s a guarded constant: traces that differ only in it
    try:
        with torch.no_grad():
            xs = [torch.randn(n, 6) for n in (3, 5, 8)]
            for _ in range(2):
                for x in xs:
                    for flag in (True, False):
                        for s in (0.5, 2.0):
                            torch.testing.assert_close(opt(x, flag, s), f(x, flag, s))
    finally:
        dynamo.config.dynamic = old
    c = dynamo.counters()
    assert c["traces_compiled"] == 12 and c["native_runs"] == 12, c


def test_report_and_explain_say_which_traces_share_code():
    def f(x):
        return (x * 9).tanh() - 1

    opt = dynamo.optimize(f)  # alive while the report is made
    with torch.no_grad():
        for n in (3, 4, 5):
            x = torch.randn(n, 7)
            torch.testing.assert_close(opt(x), f(x))
    text = dynamo.report()
    assert "3 trace(s) (2 sharing machine code: the same program at other sizes)" in text, text
    assert text.count(", shared code") == 2, text
    with torch.no_grad():  # explain records f again; opt's code is alive, so it is shared
        assert "(machine code shared with the same trace at other sizes)" in str(dynamo.explain(f, torch.randn(6, 7)))
