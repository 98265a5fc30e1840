"""An optimized module stays an ordinary module to copy, pickle, save and script (issue 14), and
dynamo.explain inspects without changing the caller's tensors or module state."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo
from dynamo import frontend, registry


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)
        self.register_buffer("shift", torch.linspace(-1, 1, 16))

    def forward(self, x):
        h = self.ln(F.gelu(self.fc(x)) + x) + self.shift
        if self.training:
            h = h * 0.5
        return torch.softmax(h, dim=-1)


class Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.block(x))


class Counter(nn.Module):
    """Changes its own state in forward (a running sum, like batch-norm statistics)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        self.seen.add_(x.sum(0))
        return x * 2 + self.seen


@dynamo.optimize
def scaled(x):
    return x * 3 + 1


def plain(x):
    return x - 2


def make():
    """An optimized Block and an eager twin with the same state."""
    torch.manual_seed(0)
    m = Block()
    ref = copy.deepcopy(m)
    return dynamo.optimize(m), ref


def runs(m):
    """Native runs of m's own compiled traces."""
    return sum(c.runs for c in m.forward.compiled)


def check_calls(m, ref, x, calls=3):
    """m(x) equals eager ref(x) in eval and train mode, call after call."""
    with torch.no_grad():
        for mode in (False, True):
            m.train(mode)
            ref.train(mode)
            for _ in range(calls):
                torch.testing.assert_close(m(x), ref(x))


@pytest.mark.parametrize("compiled_calls", [1, 4])
def test_deepcopy_gives_an_independent_optimized_module(compiled_calls):
    m, ref = make()
    x = torch.randn(3, 16)
    with torch.no_grad():
        for _ in range(compiled_calls):  # 1: recorded only; 4: native runs too
            torch.testing.assert_close(m(x), ref(x))
    traces, before = list(m.forward.compiled), runs(m)
    ema = copy.deepcopy(m)
    assert type(ema) is Block and ema is not m and ema.fc.weight is not m.fc.weight
    assert isinstance(ema.forward, frontend.OptimizedFunction) and ema.forward is not m.forward
    assert ema.forward.owner is ema and ema.forward.compiled == []  # fresh: nothing shared
    ref_ema = copy.deepcopy(ref)
    with torch.no_grad():
        ema.fc.weight.mul_(0.5)  # an EMA update: the copy's state only
        ref_ema.fc.weight.mul_(0.5)
    check_calls(ema, ref_ema, x)
    assert runs(ema) >= 4  # the copy compiled its own traces and ran them
    assert m.forward.compiled == traces and runs(m) == before  # the original was not touched
    check_calls(m, ref, x)
    assert runs(m) > before


def test_deepcopy_of_a_parent_with_an_optimized_child():
    torch.manual_seed(0)
    p = Parent()
    ref = copy.deepcopy(p)
    dynamo.optimize(p.block)
    x = torch.randn(2, 16)
    with torch.no_grad():
        p(x)
        p(x)
    q = copy.deepcopy(p)
    assert q.block.forward.owner is q.block and q.block.forward is not p.block.forward
    check_calls(q, ref, x)
    check_calls(p, ref, x)
    assert runs(q.block) >= 1 and runs(p.block) >= 1


def test_deepcopy_of_the_forward_itself_copies_the_module_once():
    m, ref = make()
    x = torch.randn(3, 16)
    check_calls(m, ref, x)
    f = copy.deepcopy(m.forward)
    assert f.owner is not m and f.owner.forward is f and f.compiled == []
    check_calls(f.owner, ref, x)


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_whole_module_round_trip(how):
    m, ref = make()
    x = torch.randn(3, 16)
    check_calls(m, ref, x)
    if how == "pickle":
        m2 = pickle.loads(pickle.dumps(m))
    else:
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        m2 = torch.load(buf, weights_only=False)  # (a whole module, as torch 2.x asks: not weights only)
    # Saves the plain module (what a user deploys: it loads where dynamo is not installed, see
    # test_first_day.py); optimized again after loading, it compiles traces of its own.
    assert type(m2) is Block and not any(a in m2.__dict__ for a in frontend._MODULE_ATTRS)
    assert m2.state_dict().keys() == ref.state_dict().keys()
    check_calls(m2, ref, x)
    m2 = dynamo.optimize(m2)
    check_calls(m2, ref, x)
    assert runs(m2) >= 4
    check_calls(m, ref, x)  # the original still works


def test_torch_jit_script_scripts_the_class_forward():
    m, ref = make()
    x = torch.randn(3, 16)
    check_calls(m, ref, x)
    before = runs(m)
    for mode in (False, True):
        m.train(mode)
        ref.train(mode)
        s = torch.jit.script(m)
        with torch.no_grad():
            torch.testing.assert_close(s(x), ref(x))
    assert runs(m) == before  # the scripted module runs TorchScript, not dynamo
    assert isinstance(m.__dict__["forward"], frontend.OptimizedFunction)
    check_calls(m, ref, x)
    assert runs(m) > before


def test_torch_jit_script_of_a_parent_with_an_optimized_child():
    torch.manual_seed(0)
    p = Parent()
    ref = copy.deepcopy(p)
    child = dynamo.optimize(p.block)
    s = torch.jit.script(p)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(s(x), ref(x))
    # torch.jit's __prepare_scriptable__ swaps the child, in the parent, for a plain twin that
    # shares its parameters and buffers; the optimized child itself is untouched.
    assert p.block.fc.weight is child.fc.weight and p.block.shift is child.shift
    assert isinstance(child.__dict__["forward"], frontend.OptimizedFunction)
    check_calls(p, ref, x)
    check_calls(child, ref.block, x)
    assert runs(child) >= 4


def test_state_dict_and_module_behaviour_are_unchanged():
    m, ref = make()
    x = torch.randn(3, 16)
    check_calls(m, ref, x)
    sd, want = m.state_dict(), ref.state_dict()
    assert list(sd) == list(want)
    for k in want:
        assert torch.equal(sd[k], want[k]), k
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert isinstance(m, Block) and m.eval() is m and not m.training and m.train() is m and m.training
    fresh = Block()
    fresh.load_state_dict(sd)
    check_calls(fresh, ref, x)


def test_optimized_functions_pickle_and_copy_like_their_functions():
    x = torch.randn(5)
    with torch.no_grad():
        scaled(x)
        scaled(x)
    # a module-level optimized function: by reference, itself
    assert pickle.loads(pickle.dumps(scaled)) is scaled
    assert copy.copy(scaled) is scaled and copy.deepcopy(scaled) is scaled
    # optimize(f) of a module-level f: a fresh optimized f
    g = dynamo.optimize(plain)
    g2 = pickle.loads(pickle.dumps(g))
    assert isinstance(g2, frontend.OptimizedFunction) and g2.fn is plain and g2 is not g
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(g2(x), plain(x))
    assert sum(c.runs for c in g2.compiled) == 2

    def local(x):
        return x + 1
    # a local function: fails as pickling the function itself fails
    with pytest.raises(Exception) as want:
        pickle.dumps(local)
    with pytest.raises(type(want.value)):
        pickle.dumps(dynamo.optimize(local))


def test_explain_leaves_an_input_mutated_in_place_unchanged():
    def f(x, y):
        x.add_(y)
        return x * 2

    x, y = torch.randn(6), torch.randn(6)
    x0 = x.clone()
    e = dynamo.explain(f, x, y)
    assert torch.equal(x, x0)
    assert len(e.traces) == 1 and "add" in str(e)
    # views of one tensor stay views of one (copied) tensor: the same explanation as on them
    base = torch.randn(8)
    base0 = base.clone()
    e = dynamo.explain(lambda a, b: a.mul_(2) + b, base[:4], base[2:6])
    assert torch.equal(base, base0)
    assert e.traces == [] and "a view of another tensor" in str(e), str(e)
    # inside containers, and a tensor of an autograd graph
    w = torch.randn(6, requires_grad=True)
    xs = [w * 1, {"y": torch.randn(6)}]
    e = dynamo.explain(lambda xs: f(xs[0], xs[1]["y"]), xs)
    assert torch.equal(xs[0], w.detach()) and "autograd" in str(e), str(e)


def test_explain_leaves_module_state_unchanged():
    m = Counter()
    x = torch.ones(2, 8)
    before = registry.functions()  # held: an id of a function that dies meanwhile could be reused
    with torch.no_grad():
        for target in ("plain", "its bound forward", "optimized", "its optimized forward"):
            if target == "optimized":
                dynamo.optimize(m)
            e = dynamo.explain(m.forward if "forward" in target else m, x)
            assert torch.equal(m.seen, torch.zeros(8)) and torch.equal(x, torch.ones(2, 8)), target
            assert len(e.traces) == 1, str(e)
            assert f"Counter at {id(m):#x}" in str(e)  # guards name the caller's module
    listed = [f for f in registry.functions() if not any(f is b for b in before)]
    assert listed == [m.forward]  # the one optimize() above; explain's copies are not listed
    with torch.no_grad():
        torch.testing.assert_close(m(x), x * 2 + 2)  # the real call: state changes now
    assert torch.equal(m.seen, torch.full((8,), 2.0))


def test_a_sequential_with_hooks_of_its_own_is_compiled_whole():
    """Hooks on the optimized container itself run around its forward (in nn.Module.__call__,
    outside the trace), so the forward's loop over its children keeps their sources: FSDP2's
    fully_shard(model) registers such hooks on a Sequential root. (Children were of unknown
    origin before: the forward fell back and ran in parts.)"""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
    m.register_forward_hook(lambda mod, args, out: out * 2)
    ref = copy.deepcopy(m)
    seen = []
    m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
    opt = dynamo.optimize(m)
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(2 + k % 2, 6)
            torch.testing.assert_close(opt(x), ref(x))
    assert len(seen) == 4
    f = m.forward
    assert len(f.compiled) >= 1 and f.native_runs >= 2 and not f.parts, dynamo.report()


def test_guards_native_module_attr_is_getattr():
    """The guard functions read attributes through guards._HELPERS['_at'] (_fastcall.module_attr:
    nn.Module.__getattr__ done natively): every kind of read gives what getattr gives, the value
    or the same exception."""
    from collections import OrderedDict

    from dynamo import guards
    at = guards._HELPERS.ready()["_at"]
    assert at is not getattr  # (the extension is built with the library)

    class Shadow(torch.nn.Module):
        @property
        def gone(self):
            raise AttributeError("a property that fails")

    class OwnGetattr(torch.nn.Linear):
        def __getattr__(self, name):
            return "own:" + name if name.startswith("x") else super().__getattr__(name)

    m = Shadow()
    m.lin = torch.nn.Linear(2, 3, bias=False)
    m.register_buffer("buf", torch.ones(2))
    m.register_parameter("gone", torch.nn.Parameter(torch.zeros(1)))  # found once the property fails
    m.__dict__["shadowed"] = "instance dict"
    m._modules["shadowed"] = torch.nn.ReLU()
    own = OwnGetattr(2, 2)
    odd = torch.nn.Linear(2, 2)
    odd._parameters = OrderedDict(odd._parameters)  # a mapping of another kind: getattr decides
    objects = [(m, "lin"), (m, "buf"), (m, "gone"), (m, "shadowed"), (m.lin, "weight"), (m.lin, "bias"),
               (m, "training"), (m, "forward"), (own, "xyz"), (own, "weight"), (odd, "weight"),
               (3, "real"), (object(), "__class__"), ("text", "upper")]
    for o, name in objects:
        want = getattr(o, name)
        got = at(o, name)
        assert got is want or got == want, (o, name)
    for o, name in [(m, "missing"), (m.lin, "nothing"), (3, "nope"), (own, "absent")]:
        with pytest.raises(AttributeError) as want:
            getattr(o, name)
        with pytest.raises(AttributeError) as got:
            at(o, name)
        assert str(got.value) == str(want.value)


def test_guards_native_plain_call_is_the_python_expression():
    """A module call's guard (guards._HELPERS['_mc'], _fastcall.plain_call) gives what
    guards.plain_call -- the Python expression -- gives for every way a call can stop running the
    class's forward: a hook of each kind, a forward set on the instance (an optimized one of this
    very forward is no change), another forward on the class; and raises what it raises."""
    from dynamo import guards
    from dynamo.interpreter import runs_class_forward
    mc = guards._HELPERS.ready()["_mc"]
    assert mc is not guards.plain_call  # (the extension is built with the library)

    class Sub(torch.nn.Linear):
        pass

    fwd = torch.nn.Linear.forward
    cases = []
    plain = torch.nn.Linear(2, 2)
    cases.append((plain, fwd))
    cases.append((Sub(2, 2), fwd))
    cases.append((torch.nn.ReLU(), fwd))  # another class's forward
    hooked = [torch.nn.Linear(2, 2) for _ in range(3)]
    hooked[0].register_forward_hook(lambda m, i, o: None)
    hooked[1].register_forward_pre_hook(lambda m, i: None)
    hooked[2].register_full_backward_hook(lambda m, gi, go: None)
    cases += [(h, fwd) for h in hooked]
    own = torch.nn.Linear(2, 2)
    own.forward = lambda x: x  # a forward on the instance
    cases.append((own, fwd))
    opt = torch.nn.Linear(2, 2)
    dynamo.optimize(opt)  # its forward: an optimized function of the class's own
    cases.append((opt, fwd))
    removed = torch.nn.Linear(2, 2)
    removed.register_forward_hook(lambda m, i, o: None).remove()  # (an emptied hook dict)
    cases.append((removed, fwd))
    for m, f in cases:
        want = guards.plain_call(m, f, runs_class_forward)
        assert mc(m, f, runs_class_forward) is want, (m, want)
    assert [mc(m, f, runs_class_forward) for m, f in cases] == \
        [True, True, False, False, False, False, False, True, True]

    def boom(m):
        raise RuntimeError("runs_class_forward failed")

    for helper in (mc, guards.plain_call):  # an exception from any read propagates from both
        with pytest.raises(RuntimeError, match="runs_class_forward failed"):
            helper(own, fwd, boom)
    bare = torch.nn.Linear(2, 2)
    del bare.__dict__["_backward_hooks"]
    for helper in (mc, guards.plain_call):
        with pytest.raises(AttributeError, match="_backward_hooks"):
            helper(bare, fwd, runs_class_forward)


def test_guards_load_the_extension_beside_the_library_dynamo_library_names(tmp_path):
    """A build copied elsewhere and named by DYNAMO_LIBRARY (as an installed copy is): the guard
    functions' native helper is loaded after that library, so its extension links the same copy
    (loading the extension first mapped the build tree's library as a second copy, whose operator
    registrations aborted the process)."""
    import os
    import shutil
    import subprocess
    import sys
    lib = os.environ["DYNAMO_LIBRARY"]
    build = os.path.dirname(os.path.abspath(lib))
    for name in os.listdir(build):
        if name.startswith("libdynamo.so"):  # (the soname links stay links)
            shutil.copy(os.path.join(build, name), tmp_path / name, follow_symlinks=False)
    shutil.copytree(os.path.join(build, "python"), tmp_path / "python")
    code = ("import torch, dynamo\n"
            "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())\n"
            "want = m(torch.ones(2, 3))\n"
            "f = dynamo.optimize(m)\n"
            "for _ in range(3):\n"
            "    assert torch.allclose(f(torch.ones(2, 3)), want)\n"
            "print('ok', dynamo.counters()['native_runs'])\n")
    env = dict(os.environ, DYNAMO_LIBRARY=str(tmp_path / os.path.basename(lib)), DYNAMO_CACHE_DIR="off")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == "ok" and int(r.stdout.split()[1]) >= 1, r.stdout
