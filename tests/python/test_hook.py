"""`with dynamo.optimize():` (the PEP 523 frame hook) and `python -m dynamo SCRIPT.py`: frames
started inside the block are compiled without touching the code, results equal eager's, and the
hook leaves no trace once the block ends."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFSET = 1.0


def block(x, w, b):
    h = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.sigmoid(h) * h + OFFSET


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return torch.tanh(self.fc(x)).softmax(-1)


def driver(x, w, b, net, n):
    out = []
    for _ in range(n):
        out.append((block(x, w, b), net(x)))
    return out


def test_frames_inside_the_block_run_native():
    x, w, b = torch.randn(16, 32), torch.randn(32), torch.randn(32)
    net = Net().eval()
    with torch.no_grad():
        want = [(block(x, w, b), net(x))] * 4
        with dynamo.optimize():
            got = [driver(x, w, b, net, 2) for _ in range(4)]
    for run in got:
        for (g1, g2), (w1, w2) in zip(run, want):
            assert torch.allclose(g1, w1, atol=1e-6) and torch.allclose(g2, w2, atol=1e-6)
    c = dynamo.counters()
    # driver (its loop unrolled, block and Net.forward inlined) is recorded on the first call
    # and runs natively on the next three.
    assert c["traces_compiled"] == 1 and c["native_runs"] == 3 and c["calls"] == 4, c


def test_hook_is_gone_after_the_block():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    with torch.no_grad():
        with dynamo.optimize():
            block(x, w, b)
            block(x, w, b)
        calls = dynamo.counters()["calls"]
        for _ in range(3):
            block(x, w, b)
    assert dynamo.counters()["calls"] == calls


def test_changed_global_inside_the_block_is_not_stale():
    global OFFSET
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    try:
        with torch.no_grad(), dynamo.optimize():
            for off in (1.0, 1.0, 5.0, 5.0, -2.0):
                OFFSET = off
                got = block(x, w, b)
                h = F.layer_norm(x, (8,), w, b)
                assert torch.allclose(got, torch.sigmoid(h) * h + off, atol=1e-6)
    finally:
        OFFSET = 1.0
    assert dynamo.counters()["native_runs"] >= 2


def gen(x):
    yield x * 2


def no_tensors(n):
    return sum(range(n))


def raises(x):
    if x.shape[0] > 3:
        raise ValueError("too big")
    return x + 1


def test_generators_plain_python_and_exceptions_behave_as_cpython():
    x = torch.randn(5)
    with dynamo.optimize():
        assert torch.equal(next(gen(x)), x * 2)
        assert no_tensors(10) == 45
        with pytest.raises(ValueError, match="too big"):
            raises(x)
        assert torch.equal(raises(x[:2]), x[:2] + 1)
        assert torch.equal(raises(x[:2]), x[:2] + 1)


def test_nested_blocks_restore_the_previous_state():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    with torch.no_grad(), dynamo.optimize():
        with dynamo.optimize():
            block(x, w, b)
        n = dynamo.counters()["calls"]
        block(x, w, b)  # still inside the outer block: still hooked
        assert dynamo.counters()["calls"] == n + 1


def test_python_dash_m_dynamo_runs_an_unmodified_script_and_reports():
    script = os.path.join(ROOT, "examples", "python", "score_batches.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"))
    plain = subprocess.run([sys.executable, script, "8"], capture_output=True, text=True, env=env, timeout=300)
    jit = subprocess.run([sys.executable, "-m", "dynamo", "--report", script, "8"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert plain.returncode == 0 and jit.returncode == 0, jit.stderr
    want = float(re.search(r"checksum (\S+)", plain.stdout).group(1))
    got = float(re.search(r"checksum (\S+)", jit.stdout).group(1))
    assert abs(got - want) <= 1e-3 * max(1.0, abs(want))
    assert "== dynamo report ==" in jit.stderr
    assert re.search(r"Classifier\.forward .*: 8 call\(s\), 1 trace\(s\), 7 native run\(s\)", jit.stderr), jit.stderr
    assert "log_progress" in jit.stderr and "fell back" in jit.stderr
    bad = subprocess.run([sys.executable, "-m", "dynamo", "no/such/script.py"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert bad.returncode != 0 and "no such script" in bad.stderr
