"""Seeing inside: DYNAMO_LOG / dynamo.config.log categories each report their event, the default
is quiet, DYNAMO_DUMP_DIR writes re-parseable trace IR next to the fusion plan, LLVM IR and
assembly, and DYNAMO_PERF_MAP=1 names compiled traces and kernels for Linux perf."""
import os
import subprocess
import sys

import pytest
import torch

import dynamo
from dynamo import native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCALE = 2.0


@pytest.fixture(autouse=True)
def fresh():
    dynamo.reset()
    yield
    dynamo.reset()
    dynamo.config.log = None


def branchy(x):
    if x.sum() > 0:
        return x * SCALE
    return x - SCALE


def noisy(x):
    return x.expand(2, x.shape[0]).as_strided((1,), (1,)).sum() * 2  # storage strides of an expanded view: an abort


def test_each_log_category_reports_its_event(capsys):
    dynamo.config.log = {"all"}
    opt = dynamo.optimize(branchy)
    opt(torch.ones(3))          # traces, perf
    opt(-torch.ones(3))         # exits
    opt(torch.ones(5))          # guards (a shape the trace does not accept), recompiles
    dynamo.optimize(noisy)(torch.ones(2))  # aborts, with the source line
    err = capsys.readouterr().err
    for cat in ("traces", "guards", "exits", "recompiles", "aborts", "perf"):
        assert f"dynamo[{cat}]" in err, (cat, err)
    assert "test_observability.py:" in err and "general strided views" in err  # the fallback names its line
    assert "compiled trace" in err and "left a trace at" in err


def test_default_is_quiet_and_categories_filter(capsys, monkeypatch):
    monkeypatch.delenv("DYNAMO_LOG", raising=False)
    opt = dynamo.optimize(branchy)
    opt(torch.ones(3))
    opt(-torch.ones(3))
    assert "dynamo[" not in capsys.readouterr().err
    monkeypatch.setenv("DYNAMO_LOG", "exits")
    opt(-torch.ones(3))
    opt(torch.ones(7))
    err = capsys.readouterr().err
    assert "dynamo[exits]" in err and "dynamo[traces]" not in err


def test_dumps_are_written_and_the_trace_reparses(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))
    opt = dynamo.optimize(lambda x, w: torch.softmax(x * w, dim=-1))
    opt(torch.randn(4, 8), torch.randn(8))
    names = sorted(os.listdir(tmp_path))
    stems = {n.split(".")[0] for n in names}
    assert len(stems) == 1, names
    stem = stems.pop()
    for ext in (".trace", ".plan", ".ll", ".opt.ll", ".s"):
        assert (tmp_path / (stem + ext)).stat().st_size > 0, ext
    text = (tmp_path / (stem + ".trace")).read_text()
    assert native.Trace(text).text() == text  # the IR dump round-trips through the parser
    assert "row kernel" in (tmp_path / (stem + ".plan")).read_text()


def test_perf_map_names_traces_and_kernels():
    prog = ("import os, torch, dynamo\n"
            "f = dynamo.optimize(lambda x: torch.tanh(x) * 2)\n"
            "f(torch.ones(8))\n"
            "print(os.getpid())\n")
    env = dict(os.environ, DYNAMO_PERF_MAP="1", PYTHONPATH=os.path.join(ROOT, "python_shim"))
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    path = f"/tmp/perf-{r.stdout.strip()}.map"
    try:
        lines = open(path).read().splitlines()
    finally:
        if os.path.exists(path):
            os.remove(path)
    names = [line.split()[2] for line in lines]
    assert any(n.startswith("dynamo_trace_") and n.endswith("_k0") for n in names), lines
    assert all(int(line.split()[1], 16) > 0 for line in lines)
