"""Resource bounds and threads in Python: resident memory stays flat over many compiled calls
and over repeated compile/reset cycles (figures printed), and several Python threads calling
one optimized function get eager's results. `make test` runs a short form; `make soak` the long
one (DYNAMO_SOAK_CALLS, DYNAMO_SOAK_CYCLES)."""
import os
import threading

import torch

import dynamo

CALLS = int(os.environ.get("DYNAMO_SOAK_CALLS", "20000"))
CYCLES = int(os.environ.get("DYNAMO_SOAK_CYCLES", "30"))


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def say(msg):
    from conftest import REPORT  # printed in pytest's summary, visible in `make test`
    REPORT.append(msg)


def f(x, y):
    return torch.tanh(x * y + 1.0).sum(-1)


def test_many_compiled_calls_keep_memory_flat():
    dynamo.reset()
    opt = dynamo.optimize(f)
    x, y = torch.randn(8, 64), torch.randn(64)
    want = f(x, y)
    warm = max(CALLS // 10, 100)
    for _ in range(warm):
        opt(x, y)
    base = rss_mb()
    marks = []
    for i in range(CALLS):
        out = opt(x, y)
        if (i + 1) % max(CALLS // 5, 1) == 0:
            marks.append(rss_mb())
    assert torch.allclose(out, want, atol=1e-6)
    assert dynamo.counters()["native_runs"] == warm + CALLS - 1
    say(f"soak: {CALLS} compiled calls: RSS {base:.1f} MB after warm-up, then " +
        ", ".join(f"{m:.1f}" for m in marks) + " MB")
    assert marks[-1] - base < 8.0, (base, marks)
    dynamo.reset()


def test_compile_reset_cycles_keep_memory_flat():
    x, y = torch.randn(8, 64), torch.randn(64)
    marks = []
    for cycle in range(CYCLES):
        dynamo.reset()  # drops every trace: frames destroyed, their code freed
        opt = dynamo.optimize(lambda a, b, c=cycle: torch.sigmoid(a * b + c) - b)
        for _ in range(3):
            opt(x, y)
        if cycle in (CYCLES // 3, CYCLES - 1):
            marks.append(rss_mb())
    dynamo.reset()
    say(f"soak: {CYCLES} compile/reset cycles: RSS {marks[0]:.1f} MB at cycle {CYCLES // 3}, "
        f"{marks[-1]:.1f} MB at the end")
    assert marks[-1] - marks[0] < 16.0, marks


def test_threads_share_an_optimized_function():
    dynamo.reset()
    opt = dynamo.optimize(f)
    x, y = torch.randn(8, 64), torch.randn(64)
    opt(x, y)
    bad = []

    def work(k):
        a = x * (k + 1)
        want = f(a, y)
        for _ in range(300):
            if not torch.allclose(opt(a, y), want, atol=1e-6):
                bad.append(k)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    c = dynamo.counters()
    assert c["native_runs"] == 1200 and c["traces_compiled"] == 1, c
    dynamo.reset()
