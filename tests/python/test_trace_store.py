"""The trace store (python_shim/dynamo/store.py): a second process runs a stored trace without
recording it when its constants bind and its guards pass, and records anew, with eager's answer,
whenever anything the trace was recorded under differs: an edited helper, an attribute's value,
which arguments are the same object, an unsafe or damaged file, the store turned off. Each run is
a child process with its own copy of the program, as a user's second run would be."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = r'''
import copy, enum, json, sys, torch, dynamo
import helper

class Mode(enum.Enum):
    A = 1
    B = 2

def with_objects(x, r, s, m):
    y = x * 0
    for i in r:
        y = y + x * i
    y = y + x[s].sum()
    return y + 1 if m is Mode.A else y - 1

class Block(torch.nn.Module):
    def __init__(self, scale, width=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, width, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(width)
        self.fc = torch.nn.Linear(width * 7 * 7, 10)
        self.scale = scale

    def forward(self, x):
        y = helper.act(self.bn(self.conv(x))) * self.scale
        return self.fc(y.flatten(1))

def pick(x, p, q):
    if p is q:
        return x * 2.0
    return x + 1.0

def accumulate(x, buf):
    buf.add_(x)
    return buf * 2.0

class Tag:
    pass

def with_constant(x):
    return x * 2.0 + torch.tensor([1.0, 2.0, 3.0])  # a source made by a torch builtin (torch.tensor)

mode, arg = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
out = {}
with torch.no_grad():
    if mode in ("block", "block-disabled", "block-wide"):
        if mode == "block-disabled":
            dynamo.disable(helper.act)  # not to be compiled nor inlined: the stored trace inlined it
        m = Block(float(arg), 16 if mode == "block-wide" else 8).eval()
        ref = copy.deepcopy(m)
        x = torch.randn(1, 3, 7, 7)
        om = dynamo.optimize(m)
        ys = [om(x) for _ in range(4)]
        out["ok"] = all(torch.allclose(y, ref(x), rtol=1e-4, atol=1e-5) for y in ys)
        out["choices"] = om.forward.compiled[0].entry.choices() if om.forward.compiled else None
        out["report"] = dynamo.report()
        out["guard_lines"] = len(om.forward.compiled[0].guards.source_text().splitlines()) if om.forward.compiled else 0
    elif mode == "pick":
        a, b = Tag(), Tag()
        x = torch.randn(5)
        fp = dynamo.optimize(pick)
        q = a if arg == "same" else b
        ys = [fp(x, a, q) for _ in range(3)]
        out["ok"] = all(torch.equal(y, pick(x, a, q)) for y in ys)
    elif mode == "constant":
        x = torch.randn(3)
        fc = dynamo.optimize(with_constant)
        out["ok"] = all(torch.equal(fc(x), with_constant(x)) for _ in range(3))
    elif mode == "objects":  # Python objects whose value the trace depends on, as arguments
        r, sl, m = range(3), slice(0, 3), Mode.A  # arg changes one of them: r1, s1 or B
        if arg[0] == "r":
            r = range(int(arg[1:]))
        elif arg[0] == "s":
            sl = slice(0, int(arg[1:]))
        else:
            m = Mode[arg]
        x = torch.randn(6)
        objs = (r, sl, m)
        fo = dynamo.optimize(with_objects)
        out["ok"] = all(torch.allclose(fo(x, *objs), with_objects(x, *objs)) for _ in range(3))
    elif mode == "accumulate":
        x = torch.randn(6)
        buf, ref = torch.zeros(6), torch.zeros(6)
        fa = dynamo.optimize(accumulate)
        ys = [fa(x, buf) for _ in range(3)]
        rs = [accumulate(x, ref) for _ in range(3)]
        out["ok"] = all(torch.allclose(y, r) for y, r in zip(ys, rs)) and torch.allclose(buf, ref)
c = dynamo.counters()
out.update(from_store=c["traces_from_store"], recorded=c["interpreted_runs"], compiled=c["traces_compiled"])
print(json.dumps(out))
'''

RELU = "import torch\n\ndef act(x):\n    return torch.relu(x)\n"
SIGMOID = "import torch\n\ndef act(x):\n    return torch.sigmoid(x)\n"


def make_program(tmp_path, helper=RELU):
    (tmp_path / "prog").mkdir(exist_ok=True)
    (tmp_path / "prog" / "main.py").write_text(PROGRAM)
    (tmp_path / "prog" / "helper.py").write_text(helper)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    return cache


def run(tmp_path, mode, arg, **env_overrides):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python_shim"), DYNAMO_CACHE_DIR=str(tmp_path / "cache"),
               DYNAMO_LOG="store", **env_overrides)
    r = subprocess.run([sys.executable, str(tmp_path / "prog" / "main.py"), mode, arg], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    got["log"] = r.stderr
    assert got["ok"], r.stderr
    return got


def stored_files(tmp_path, suffix):
    return [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("py-") and p.name.endswith(suffix)]


def test_second_process_runs_the_stored_trace(tmp_path):
    make_program(tmp_path)
    first = run(tmp_path, "block", "2.0")
    assert first["from_store"] == 0 and first["recorded"] == 1, first
    assert len(stored_files(tmp_path, ".traces")) == 1
    second = run(tmp_path, "block", "2.0")
    assert second["from_store"] == 1 and second["recorded"] == 0 and second["compiled"] == 0, second
    # the convolution's and product's choices were stored and applied before the first run
    assert first["choices"] and second["choices"] == first["choices"], (first, second)
    assert all(w.split("=")[1] in ("onednn", "winograd", "aten", "own", "blas") for w in first["choices"].split())
    assert "from the trace store" in second["report"] and "from the trace store" not in first["report"]
    assert second["guard_lines"] == first["guard_lines"] > 10  # explain's guard texts, read from the store


def test_one_forward_for_models_of_several_sizes_keeps_their_traces_apart(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "block", "2.0")
    wide = run(tmp_path, "block-wide", "2.0")   # the same code, another model: its own place
    assert wide["from_store"] == 0 and wide["recorded"] == 1, wide
    assert len(stored_files(tmp_path, ".traces")) == 2
    assert run(tmp_path, "block", "2.0")["from_store"] == 1
    assert run(tmp_path, "block-wide", "2.0")["from_store"] == 1


def test_an_edited_helper_is_recorded_anew(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "block", "2.0")
    (tmp_path / "prog" / "helper.py").write_text(SIGMOID)  # the forward is the same, what it calls is not
    second = run(tmp_path, "block", "2.0")  # ok: compared with eager's sigmoid
    assert second["from_store"] == 0 and second["recorded"] == 1, second
    assert "does not apply" in second["log"] and "helper" in second["log"], second["log"]


def test_a_helper_disabled_since_is_not_inlined_by_a_stored_trace(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "block", "2.0")
    second = run(tmp_path, "block-disabled", "2.0")
    assert second["from_store"] == 0 and second["recorded"] >= 1, second


def test_disable_drops_the_traces_that_inlined_the_function():
    import torch

    import dynamo

    def helper(x):
        return x * 3

    def f(x):
        return helper(x) + 1

    opt, x = dynamo.optimize(f), torch.randn(4)
    for _ in range(2):
        opt(x)
    assert dynamo.counters()["native_runs"] == 1
    dynamo.disable(helper)
    try:
        assert torch.allclose(opt(x), f(x))
        c = dynamo.counters()
        assert c["native_runs"] == 1 and c["interpreted_runs"] >= 2 and c["traces_compiled"] >= 2, c  # recorded again
        assert all("test_disable_drops_the_traces_that_inlined_the_function.<locals>.helper" not in t.inlined
                   for t in opt.compiled)
    finally:
        helper._dynamo_disable = False


def test_a_changed_attribute_is_recorded_anew(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "block", "2.0")
    other = run(tmp_path, "block", "3.0")
    assert other["from_store"] == 0 and other["recorded"] >= 1, other
    again = run(tmp_path, "block", "2.0")  # both variants are stored now
    assert again["from_store"] == 1 and again["recorded"] == 0, again


def test_which_arguments_are_the_same_object_is_kept(tmp_path):
    make_program(tmp_path)
    distinct = run(tmp_path, "pick", "distinct")  # recorded: p is not q -> x + 1
    assert distinct["recorded"] == 1
    same = run(tmp_path, "pick", "same")  # binding both constants to one object is refused
    assert same["from_store"] == 0 and same["recorded"] == 1, same
    assert "the same object as another constant" in same["log"], same["log"]
    assert run(tmp_path, "pick", "distinct")["from_store"] == 1
    assert run(tmp_path, "pick", "same")["from_store"] == 1  # (stored by the second run)


def test_a_tensor_made_from_numbers_is_made_again_by_a_stored_trace(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "constant", "-")
    second = run(tmp_path, "constant", "-")
    assert second["from_store"] == 1 and second["recorded"] == 0, second


def test_in_place_writes_are_made_by_a_stored_trace(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "accumulate", "-")
    second = run(tmp_path, "accumulate", "-")  # ok compares the buffer too
    assert second["from_store"] == 1 and second["recorded"] == 0, second


def test_an_unsafe_store_file_is_not_loaded(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "accumulate", "-")
    (path,) = stored_files(tmp_path, ".traces")
    os.chmod(path, 0o646)  # others could have written the guards' code
    second = run(tmp_path, "accumulate", "-")
    assert second["from_store"] == 0 and second["recorded"] == 1, second
    assert "not a private file" in second["log"], second["log"]


def test_a_damaged_store_file_is_ignored_and_rewritten(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "accumulate", "-")
    (path,) = stored_files(tmp_path, ".traces")
    path.write_bytes(path.read_bytes()[:100])
    second = run(tmp_path, "accumulate", "-")
    assert second["from_store"] == 0 and second["recorded"] == 1, second
    assert run(tmp_path, "accumulate", "-")["from_store"] == 1


def test_the_store_can_be_turned_off(tmp_path):
    make_program(tmp_path)
    run(tmp_path, "accumulate", "-", DYNAMO_TRACE_STORE="0")
    assert stored_files(tmp_path, ".traces") == []
    run(tmp_path, "accumulate", "-")
    off = run(tmp_path, "accumulate", "-", DYNAMO_TRACE_STORE="0")
    assert off["from_store"] == 0 and off["recorded"] == 1, off


def test_arguments_standing_for_their_value_are_bound_by_value(tmp_path):
    """A range, slice or enum member argument: a stored trace recorded with one value never runs
    a call with another (a range's identity guard, bound to whatever the call passed at that
    place, passed for range(1) with a trace recorded for range(3): a wrong answer)."""
    make_program(tmp_path)
    first = run(tmp_path, "objects", "r3")
    assert first["from_store"] == 0 and first["compiled"] == 1, first
    for other in ("r1", "s1", "B"):  # (run() asserts eager's results)
        got = run(tmp_path, "objects", other)
        assert got["from_store"] == 0 and got["recorded"] >= 1, (other, got)
    again = run(tmp_path, "objects", "r3")
    assert again["from_store"] == 1 and again["recorded"] == 0, again
