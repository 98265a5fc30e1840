"""What a new user meets on the first day (issue 39): each finding of a user trying dynamo on
their own scripts, reproduced and checked against eager."""
import glob
import os
import subprocess
import sys
import traceback

import pytest
import torch

import dynamo

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = os.path.dirname(os.path.abspath(dynamo.__file__))


def _frames(e):
    return [(os.path.abspath(f.filename), f.name) for f in traceback.extract_tb(e.__traceback__)]


# -- 6: a program's own exception comes out once, with the program's own traceback ----------------

def test_a_programs_exception_is_raised_once_with_its_own_frames():
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise ValueError("mine")
        return y

    g = dynamo.optimize(f)
    for _ in range(3):  # cold (eager), then recorded: each time eager's exception, alone
        with pytest.raises(ValueError, match="mine") as info:
            g(torch.randn(3))
        e = info.value
        assert e.__context__ is None and e.__cause__ is None, "raised during handling of another exception"
        frames = _frames(e)
        assert not [fr for fr in frames if fr[0].startswith(PACKAGE)], frames
        assert frames[-1][1] == "f"
    assert torch.equal(g(torch.ones(4)), torch.ones(4) + 1)


def test_an_exception_after_a_side_exit_is_raised_once():
    def f(x):
        if x.sum() > 0:
            return x * 2
        raise KeyError("negative")

    g = dynamo.optimize(f)
    for _ in range(3):
        g(torch.ones(5))
    for _ in range(4):  # the exit's side trace is recorded on a later one of these calls
        with pytest.raises(KeyError, match="negative") as info:
            g(-torch.ones(5))
        assert info.value.__context__ is None
        assert not [fr for fr in _frames(info.value) if fr[0].startswith(PACKAGE)]


# -- 3: a libdynamo that cannot load is said once, at import; everything then runs eagerly --------

def _python(code, **env):
    e = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_a_library_that_cannot_load_is_said_once_at_import():
    r = _python("import sys, torch, dynamo\n"
                "print('imported', flush=True)\n"
                "g = dynamo.optimize(lambda x: x * 2 + 1)\n"
                "with dynamo.optimize():\n"
                "    for _ in range(4):\n"
                "        assert torch.equal(g(torch.ones(3)), torch.full((3,), 3.0))\n"
                "c = dynamo.counters()\n"
                "assert c['eager_runs'] == 4 and c['aborts'] == 0 and c['interpreted_runs'] == 0, c\n"
                "assert 'libdynamo is not loaded' in dynamo.report()\n"
                "try:\n"
                "    dynamo.optimize(lambda x: x + 1, nopython=True)(torch.ones(1))\n"
                "except dynamo.NopythonError as e:\n"
                "    print('refused', 'cannot load' in str(e))\n",
                DYNAMO_LIBRARY="/nonexistent/libdynamo.so.0")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "libdynamo" in ln]
    assert len(lines) == 1 and "/nonexistent/libdynamo.so.0" in lines[0] and "eagerly" in lines[0], r.stderr
    assert "refused True" in r.stdout


# -- 1: an optimizer's step with any argument torch passes runs, never raises ------------------------

@pytest.fixture
def step_with_a_keyword():
    """Adam's step taking a keyword-only argument, as torch 1.13's took grad_scaler: the frame
    hook meets the body of a covered optimizer's step with that keyword bound."""
    plain = torch.optim.Adam.step

    def step(self, closure=None, *, grad_scaler=None):
        assert grad_scaler is None
        return plain(self, closure)

    # torch wraps a class's step for its profiler on its first instance (AdamW's own attribute
    # then wraps this one): each class's step is put back as it was
    classes = (torch.optim.Adam, torch.optim.AdamW)
    before = {cls: cls.__dict__.get("step") for cls in classes}
    torch.optim.Adam.step = step
    yield
    for cls, was in before.items():
        if was is None:
            if "step" in cls.__dict__:
                delattr(cls, "step")
        else:
            cls.step = was


@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("how", ["optimize_step", "with_block"])
def test_an_optimizer_step_with_keywords_runs_as_eager(kind, how, step_with_a_keyword):
    def train(steps, wrap):
        torch.manual_seed(1)
        m = torch.nn.Linear(6, 3)
        opt = {"SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
               "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
               "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01)}[kind](m.parameters())
        step = wrap(opt)
        x = torch.randn(10, 6)
        for i in range(steps):
            opt.zero_grad()
            m(x).square().mean().backward()
            if kind == "Adam" and i % 2:
                step(closure=None, grad_scaler=None)
            else:
                step()
        return m.weight.detach().clone()

    want = train(5, lambda opt: opt.step)
    if how == "optimize_step":
        got = train(5, lambda opt: dynamo.optimize(opt.step))
    else:
        with dynamo.optimize():
            got = train(5, lambda opt: opt.step)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_step_argument_torch_refuses_is_refused_as_eager_refuses_it():
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    with pytest.raises(TypeError) as eager:
        opt.step(grad_scaler=None)
    with pytest.raises(TypeError) as ours:
        dynamo.optimize(opt.step)(grad_scaler=None)
    assert str(ours.value) == str(eager.value)


# -- 5: `with dynamo.optimize():` covers the thread that entered it ---------------------------------

def test_a_with_block_compiles_only_the_thread_that_entered_it():
    import threading

    def other_threads_work(x):
        return torch.relu(x) * 3

    def mine(x):
        return torch.tanh(x) + 1

    seen = {}
    started, stop = threading.Event(), threading.Event()

    def worker():
        x = torch.randn(16)
        started.set()
        n = 0
        while not stop.is_set() or n < 20:
            assert torch.equal(other_threads_work(x), torch.relu(x) * 3)
            n += 1
        seen["calls"] = n

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    x = torch.randn(16)
    with dynamo.optimize():
        for _ in range(20):
            assert torch.allclose(mine(x), torch.tanh(x) + 1)
        stop.set()
        t.join()
    names = dynamo.report()
    assert "mine" in names and "other_threads_work" not in names, names
    assert dynamo.counters()["calls"] == 20 and dynamo.counters()["native_runs"] > 0

    def in_its_own_block():  # a thread entering a block of its own is compiled in it
        with dynamo.optimize():
            for _ in range(5):
                other_threads_work(torch.ones(8))
    t = threading.Thread(target=in_its_own_block)
    t.start()
    t.join()
    assert "other_threads_work" in dynamo.report()


# -- 4: `python -m dynamo` on a script that calls a module at its top level -------------------------

def _run_script(tmp_path, text):
    script = tmp_path / "script.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"))
    return subprocess.run([sys.executable, "-m", "dynamo", "--report", str(script)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_python_m_dynamo_compiles_a_module_called_at_the_top_level(tmp_path):
    r = _run_script(tmp_path, "import torch\n"
                              "torch.manual_seed(0)\n"
                              "net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
                              "x = torch.randn(4, 8)\n"
                              "want = net(x)\n"
                              "with torch.no_grad():\n"
                              "    for i in range(20):\n"
                              "        y = net(x)\n"
                              "assert torch.allclose(y, want), (y, want)\n"
                              "print('ok')\n")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("counters:")][0]
    native = int(line.split("native_runs=")[1].split(",")[0])
    assert native >= 15, r.stderr


def test_python_m_dynamo_says_why_nothing_was_compiled(tmp_path):
    r = _run_script(tmp_path, "import torch\nx = torch.randn(8)\nfor i in range(5):\n    x = torch.relu(x) + 1\nprint('ok')\n")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    assert "nothing was compiled" in r.stderr and "move it into a function" in r.stderr, r.stderr


# -- 2 and 7: a value that changes on every call does not make every call record -------------------

class _Collects(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.acts = []

    def forward(self, x):
        h = torch.relu(x) * 2
        self.acts.append(h)
        return h + 1


_GLOBAL_ACTS = []


def _appends_to_a_global(x):
    h = torch.relu(x) * 2
    _GLOBAL_ACTS.append(h)
    return h + 1


def _appends_to_an_argument(x, acts):
    h = torch.relu(x) * 2
    acts.append(h)
    return h + 1


_STEP = {"n": 0}


def _reads_a_counter(x):
    _STEP["n"] += 1
    return x * _STEP["n"]


@pytest.mark.parametrize("case", ["global_list", "list_argument", "module_attribute", "counter"])
def test_a_value_changing_on_every_call_stops_the_recordings_and_says_why(case, capfd):
    x = torch.randn(32)
    if case == "global_list":
        eager, opt, name = _appends_to_a_global, dynamo.optimize(_appends_to_a_global), "_GLOBAL_ACTS"
        args_e = args_o = (x,)
    elif case == "list_argument":
        eager, opt, name = _appends_to_an_argument, dynamo.optimize(_appends_to_an_argument), "acts"
        args_e, args_o = (x, []), (x, [])
    elif case == "module_attribute":
        eager, opt, name = _Collects(), dynamo.optimize(_Collects()), "self.acts"
        args_e = args_o = (x,)
    else:
        eager, opt, name = _reads_a_counter, dynamo.optimize(_reads_a_counter), "_STEP['n']"
        args_e = args_o = (x,)
    for i in range(60):
        _STEP["n"] = i
        got = opt(*args_o)
        _STEP["n"] = i
        assert torch.equal(got, eager(*args_e))
    if case == "list_argument":
        assert len(args_o[1]) == len(args_e[1]) == 60
    c = dynamo.counters()
    assert c["interpreted_runs"] <= 2 * 4 and c["eager_runs"] >= 50, c
    said = dynamo.report()
    assert "changes on every call" in said and name in said, said
    assert said.count("changes on every call") >= 1 and "expected" in said and "found" in said
    err = capfd.readouterr().err
    assert err.count("so every call would record") == 1, err  # said once on stderr
    _GLOBAL_ACTS.clear()


def test_values_that_come_and_go_keep_their_traces():
    """Numbers that change between calls but repeat (a loop count, a batch size) are cached, not
    taken for a value that changes on every call."""
    def f(x, n):
        for _ in range(n):
            x = torch.tanh(x) * 1.5
        return x

    opt = dynamo.optimize(f)
    import random
    rng = random.Random(3)
    for _ in range(80):
        n = rng.randint(1, 6)
        x = torch.randn(rng.choice([3, 5, 8]), 4)
        assert torch.allclose(opt(x, n), f(x, n))
    assert "changes on every call" not in dynamo.report()
    c = dynamo.counters()
    assert c["native_runs"] + c["size_instances"] >= 50, c


# -- 7: messages in the program's words, settings checked, report() agreeing with counters() -------

def test_a_guard_failure_names_the_parameter_and_both_values(capfd):
    def f(x, flags, n_iter=2):
        for _ in range(n_iter):
            x = x * 2
        return x + 1 if flags[1] else x - 1

    opt = dynamo.optimize(f)
    old = dynamo.config.log
    dynamo.config.log = {"guards", "recompiles", "traces"}
    try:
        opt(torch.ones(3), [0, 1], n_iter=2)
        opt(torch.ones(3), [0, 0], n_iter=2)
        opt(torch.ones(3), [0, 0], n_iter=3)
    finally:
        dynamo.config.log = old
    err = capfd.readouterr().err
    assert "flags[1]: expected 1, found 0" in err, err
    assert "n_iter: expected 2, found 3" in err, err
    assert "a[1]" not in err and "k['n_iter']" not in err and not __import__("re").search(r"\bc\d+\b", err), err
    # trace numbers agree between the log lines and the report
    assert "compiled trace 1:" in err and "recording trace 2" in err and "compiled trace 2:" in err, err
    assert "trace 1 rejected the call" in err and "trace 2 rejected the call" in err, err
    said = dynamo.report()
    assert "trace 1, compiled" in said and "trace 3, compiled" in said, said


def test_unknown_settings_are_refused_with_the_valid_names():
    with pytest.raises(AttributeError, match=r"hot_treshold.*did you mean 'hot_threshold'.*cache_limit"):
        dynamo.config.hot_treshold = 5
    with pytest.raises(ValueError, match=r"did you mean 'aborts'"):
        dynamo.config.log = {"abort"}
    with pytest.raises(TypeError, match="set of categories"):
        dynamo.config.log = "traces"
    assert dynamo.config.log is None and not hasattr(dynamo.config, "hot_treshold")
    r = _python("import dynamo", DYNAMO_LOG="abort,traces", DYNAMO_LOGS="all",
                DYNAMO_LIBRARY=os.path.join(ROOT, "build", "libdynamo.so.0"))
    assert r.returncode == 0, r.stderr
    assert "DYNAMO_LOG" in r.stderr and "'abort'" in r.stderr and "did you mean 'aborts'" in r.stderr, r.stderr
    assert "DYNAMO_LOGS" in r.stderr and "did you mean DYNAMO_LOG?" in r.stderr, r.stderr


@pytest.mark.parametrize("name, value, error, says", [
    ("verify", "yes", TypeError, "True or False"),
    ("verify", 1, TypeError, "True or False"),
    ("training", None, TypeError, "True or False"),
    ("cache_limit", -1, ValueError, ">= 0"),
    ("cache_limit", 2.5, TypeError, "whole number"),
    ("cache_limit", True, TypeError, "whole number"),
    ("abort_limit", 0, ValueError, ">= 1"),
    ("hotexit", "8", TypeError, "whole number"),
    ("max_trace_ops", 0, ValueError, ">= 1"),
    ("ddp_bucket_mb", -1, ValueError, "MiB >= 0"),
    ("ddp_bucket_mb", float("nan"), ValueError, "MiB >= 0"),
    ("dynamic", "auto", TypeError, "None"),
    ("log", "trace", TypeError, r"\{'traces'\}"),
    ("log", {"trace"}, ValueError, r"did you mean 'traces'"),
    ("log", 3, TypeError, "set of categories"),
])
def test_settings_refuse_values_of_the_wrong_type_or_range(name, value, error, says):
    before = getattr(dynamo.config, name)
    with pytest.raises(error, match=says):
        setattr(dynamo.config, name, value)
    assert getattr(dynamo.config, name) == before  # left as it was


def test_settings_take_every_valid_value():
    saved = {n: getattr(dynamo.config, n) for n in dynamo.config._SETTINGS}
    try:
        for name, value in [("verify", True), ("cache_limit", 0), ("hot_threshold", 3), ("dynamic", None),
                            ("dynamic", False), ("ddp_bucket_mb", 12 / 1024), ("ddp_bucket_mb", 0),
                            ("log", {"traces", "exits"}), ("log", ["all"]), ("log", None)]:
            setattr(dynamo.config, name, value)
            assert getattr(dynamo.config, name) == value
        for name, value in saved.items():  # every default passes its own check
            setattr(dynamo.config, name, value)
    finally:
        for name, value in saved.items():
            setattr(dynamo.config, name, value)


def test_nopython_error_is_exported_and_says_where():
    @dynamo.optimize(nopython=True)
    def f(x):
        print("side effect")
        return x + 1

    with pytest.raises(dynamo.NopythonError, match=r"test_first_day\.py:\d+: call to print"):
        f(torch.ones(2))


def test_report_agrees_with_counters_and_forgets_what_reset_forgot():
    def f(x):
        if x.sum() > 0:  # a side exit, taken by the negative calls
            x = x + 1
        print("", end="")  # a stitch
        return x * 2

    opt = dynamo.optimize(f)
    for i in range(5):
        opt(torch.ones(4))
    for i in range(12):
        opt(-torch.ones(4))
    c = dynamo.counters()
    said = dynamo.report()
    head = said.splitlines()[0]
    assert f"{c['calls']} call(s)" in head and f"{c['native_runs']} native run(s)" in head, (head, c)
    sides = sum(1 for ln in said.splitlines() if ln.strip().startswith("side trace:"))
    stitches = sum(1 for ln in said.splitlines() if ln.strip().startswith("stitch trace:"))
    assert sides == c["side_traces_compiled"] and stitches == c["stitch_traces"], (said, c)
    dynamo.reset()
    assert not [ln for ln in dynamo.report().splitlines() if not ln.startswith("counters:")]


# -- 9: torch.save of an optimized module saves the module the user wrote -------------------------

def test_a_saved_optimized_module_loads_where_dynamo_is_not_installed(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.LayerNorm(5))
    opt = dynamo.optimize(net)
    x = torch.randn(3, 6)
    with torch.no_grad():
        for _ in range(3):
            want = opt(x)
    torch.save(opt, tmp_path / "model.pt")
    torch.save(x, tmp_path / "x.pt")
    torch.save(want, tmp_path / "want.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DYNAMO_LIBRARY")}
    r = subprocess.run([sys.executable, "-c",
                        "import sys\n"
                        "sys.modules['dynamo'] = None  # (as if not installed, even after a make install)\n"
                        "import torch\n"
                        "m = torch.load(sys.argv[1] + '/model.pt', weights_only=False)\n"
                        "try:\n"
                        "    import dynamo\n"
                        "    raise SystemExit('dynamo is importable here: the test proves nothing')\n"
                        "except ImportError:\n"
                        "    pass\n"
                        "assert 'forward' not in m.__dict__, m.__dict__.keys()\n"
                        "x, want = torch.load(sys.argv[1] + '/x.pt'), torch.load(sys.argv[1] + '/want.pt')\n"
                        "with torch.no_grad():\n"
                        "    torch.testing.assert_close(m(x), want)\n"
                        "print('loaded and ran without dynamo')\n", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "without dynamo" in r.stdout, r.stdout + r.stderr
    # the optimized module in this process goes on compiled, and a deep copy stays optimized
    twin = __import__("copy").deepcopy(opt)
    assert isinstance(twin.__dict__["forward"], dynamo.frontend.OptimizedFunction) and twin.forward.owner is twin
    with torch.no_grad():
        torch.testing.assert_close(twin(x), want)


# -- 8: what the docs say is what the code does ----------------------------------------------------

def test_dump_dir_files_are_named_as_the_readme_says(tmp_path, monkeypatch):
    import glob
    import re
    monkeypatch.setenv("DYNAMO_DUMP_DIR", str(tmp_path))

    def scaled_gelu(x):
        return torch.nn.functional.gelu(x) * 3

    f = dynamo.optimize(scaled_gelu)
    f(torch.randn(40))
    traces = glob.glob(str(tmp_path / "dynamo_trace_*_*.trace"))
    assert len(traces) == 1, os.listdir(tmp_path)
    stem = traces[0][:-len(".trace")]
    for ext in (".plan", ".ll", ".opt.ll", ".s"):
        assert os.path.exists(stem + ext), (ext, os.listdir(tmp_path))
    first = open(traces[0]).readline()
    assert first.startswith("trace @") and "scaled_gelu" in first, first
    readme = open(os.path.join(ROOT, "docs", "SETTINGS.md")).read()
    row = [ln for ln in readme.splitlines() if ln.startswith("| `DYNAMO_DUMP_DIR`")][0]
    assert "dynamo_trace_<frame>_<n>" in row and all(e in row for e in ("`.plan`", "`.ll`", "`.opt.ll`", "`.s`"))
    assert re.fullmatch(r"dynamo_trace_\d+_\d+", os.path.basename(stem))


# -- 10: a loop that runs until a tensor condition holds ---------------------------------------------

def _newton_item(a, tol=1e-5):
    x = a.clone()
    err = 1.0
    while err > tol:  # err: a number read by .item() each iteration
        nx = x - (x * x * x - a) / (3 * x * x)
        err = ((nx - x).abs() / nx.abs()).max().item()
        x = nx
    return x


def _newton_tensor(a, tol=1e-5):
    x = a.clone()
    while True:
        nx = x - (x * x * x - a) / (3 * x * x)
        if not ((nx - x).abs() > tol * nx.abs()).any():  # a branch on a tensor
            return nx
        x = nx


@pytest.mark.parametrize("fn", [_newton_item, _newton_tensor])
def test_a_convergence_loop_runs_native_for_every_iteration_count(fn):
    import random
    rng = random.Random(0)
    inputs = [torch.rand(64) * 10 ** rng.uniform(0, 8) + 1 for _ in range(12)]  # 5 to 45 iterations
    opt = dynamo.optimize(fn)
    for _ in range(4):
        for a in inputs:
            assert torch.equal(opt(a), fn(a))
    c = dynamo.counters()
    # one recording serves every call: the trace's exits guard each comparison's outcome (which
    # repeats), not the number compared (which never does); a call that converges sooner leaves
    # at its last comparison, where only `return` is left
    assert c["interpreted_runs"] <= 3 and c["native_runs"] + c["side_exits"] >= c["calls"] - 2, c
    assert "of a tensor == 0." not in dynamo.report() and "of a tensor == 1." not in dynamo.report()


def test_a_number_read_by_item_is_still_guarded_where_its_value_matters():
    def f(x, y):
        s = x.abs().max().item()
        if s > 0.5:              # compared: guarded by the outcome
            y = y * s            # used as a number: guarded by its value (an exit here)
        print("", end="")        # a stitch while it is live
        return y + s, round(s, 3)

    opt = dynamo.optimize(f)
    for scale in (1.0, 1.0, 2.0, 0.1, 3.0, 0.2, 1.0, 5.0, 0.3, 2.0):
        x, y = torch.randn(8) * scale, torch.randn(8)
        got, want = opt(x, y), f(x, y)
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_comparing_two_numbers_read_by_item():
    def f(x, y):
        a, b = x.max().item(), y.max().item()
        return x * 2 if a > b else y * 3

    opt = dynamo.optimize(f)
    for i in range(12):
        x, y = torch.randn(5), torch.randn(5)
        assert torch.equal(opt(x, y), f(x, y))


# -- the maintainer's side: no per-call state on the shared OptimizedFunction ------------------------

def test_two_threads_recording_one_function_keep_their_own_call():
    """Both threads record the same function at once (each waits for the other at a stitch, in
    the middle of its recording): each trace keeps the shapes of the call it was recorded from."""
    import threading
    barrier = threading.Barrier(2, timeout=60)

    @dynamo.disable
    def meet():
        barrier.wait()

    def f(x):
        y = torch.relu(x) * 2
        meet()  # a stitch: the trace before it is compiled while the other thread records
        return y + 1

    opt = dynamo.optimize(f)
    results, errors = {}, []

    def worker(n):
        try:
            x = torch.randn(n)
            results[n] = (opt(x), f(x))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (3, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for n, (got, want) in results.items():
        assert torch.equal(got, want)
    keys = sorted(c.shape_key for c in opt.compiled)
    from dynamo.tracetree import shape_key
    assert keys == sorted([shape_key((torch.empty(3),)), shape_key((torch.empty(7),))]), keys


def test_import_names_the_supported_python_and_torch():
    """`import dynamo` on a Python or torch it does not support raises an ImportError naming what
    it supports (before anything that would fail less clearly)."""
    other = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[04]*/bin/python3.1[04]")))
    for py in other[:1]:  # an unsupported CPython, where there is one (no torch there: the version is checked first)
        r = subprocess.run([py, "-c", "import dynamo"], env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim")),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "dynamo supports CPython 3.11, 3.12, 3.13; this is cpython 3.1" in r.stderr, \
            r.stderr[-500:]
    code = ("import torch\ntorch.__version__ = '2.13.0+cpu'\n"
            "try:\n    import dynamo\nexcept ImportError as e:\n    print(e)\n")
    r = _python(code, DYNAMO_LIBRARY=os.path.join(ROOT, "build", "libdynamo.so.0"))
    assert "dynamo supports torch 2.14.x" in r.stdout and "2.13.0+cpu" in r.stdout, (r.stdout, r.stderr)
