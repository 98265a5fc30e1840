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


_PROFILED = r'''
import importlib, json, torch, dynamo
explain = importlib.import_module("dynamo.explain")  # (dynamo.explain is also a function)

def f(x, w, s):
    h = torch.tanh(x @ w) * 2 + 1          # an extern (the product) and a fused kernel
    if (h.sum() * s) > 0:                  # a side exit taken when s changes sign
        return h.relu()
    return h.sigmoid()

opt = dynamo.optimize(f)
x, w = torch.randn(64, 32), torch.randn(32, 48)
for k in range(30):
    s = torch.tensor(1.0 if k % 3 else -1.0)
    # (the product's side -- BLAS, own or MKL -- is chosen by timing: sums in another order)
    torch.testing.assert_close(opt(x, w, s), f(x, w, s), rtol=1e-4, atol=1e-4)
print(json.dumps({"report": dynamo.report(), "profile": opt.compiled[0].entry.profile(),
                  "sides": [[lab, cc.entry.profile()] for lab, cc in explain._profiled_traces(opt)]}))
'''


def _profiled_run(profile):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"), DYNAMO_CACHE_DIR="off")
    env.pop("DYNAMO_PROFILE", None)
    if profile:
        env["DYNAMO_PROFILE"] = "1"
    r = subprocess.run([sys.executable, "-c", _PROFILED], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_profile_times_each_step_of_each_trace():
    out = _profiled_run(True)
    runs, ns, steps = out["profile"]
    assert runs >= 20 and ns > 0
    whats = [s[3] for s in steps]
    assert any(w.startswith("extern aten::mm -> [64,48]") or w.startswith("extern aten::addmm") for w in whats), whats
    assert any(w.startswith("kernel k") and "tanh" in w for w in whats), whats
    assert any(w == "side exit check" for w in whats), whats
    assert all(s[1] >= 1 and s[2] >= 0 for s in steps)
    # the steps' times are parts of the runs' time (the clock is read between steps)
    assert sum(s[2] for s in steps) <= ns
    # side traces are profiled too, each under its own label
    labels = [lab for lab, prof in out["sides"] if prof is not None]
    assert any("side trace" in lab for lab in labels), out["sides"]
    report = out["report"]
    assert "profile (DYNAMO_PROFILE):" in report and "in compiled code" in report, report
    assert "kernel steps" in report and "LibTorch calls" in report and "step " in report, report


def test_without_profile_nothing_is_timed():
    out = _profiled_run(False)
    assert out["profile"] is None and all(prof is None for _, prof in out["sides"]), out
    assert "profile (DYNAMO_PROFILE)" not in out["report"]
