"""Programs that change state between calls (issue 40): every call is compared with eager, and
the state is changed between calls the way a user's program would."""
import math
import types

import torch

import dynamo


def _each_call_matches(opt, plain, calls):
    """calls: a list of (change, args); change() runs before both sides of that call."""
    for i, (change, args) in enumerate(calls):
        change()
        want = plain(*args)
        got = opt(*args)
        assert torch.allclose(got, want), (i, got, want)


# -- a function stored in a user's module attribute is guarded, not taken as fixed -------------

def test_a_users_module_attribute_rebound_between_calls():
    cfg = types.ModuleType("cfg")
    cfg.ACT, cfg.SCALE = torch.relu, 2.0

    def fn(x):
        return cfg.ACT(x) * cfg.SCALE

    x = torch.randn(7)

    def use(act, scale=2.0):
        def change():
            cfg.ACT, cfg.SCALE = act, scale
        return change, (x,)
    _each_call_matches(dynamo.optimize(fn), fn, [use(torch.relu), use(torch.relu), use(torch.tanh),
                                                 use(torch.tanh, 3.0), use(torch.sigmoid), use(torch.relu)])


def test_a_stdlib_modules_function_rebound_between_calls(monkeypatch):
    fake = types.ModuleType("fakemath")
    fake.f = math.sqrt

    def fn(x, n):
        return x * fake.f(n)

    x = torch.randn(5)

    def use(f):
        def change():
            fake.f = f
        return change, (x, 4.0)
    _each_call_matches(dynamo.optimize(fn), fn, [use(math.sqrt), use(math.sqrt), use(math.log), use(math.exp)])


def test_class_global_and_instance_attributes_rebound_between_calls():
    g = {"ACT": torch.relu}

    class Cfg:
        ACT = torch.relu

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.relu

        def forward(self, x):
            return self.act(x) + Cfg.ACT(x) + g["ACT"](x)

    m, ref = M(), M()
    opt = dynamo.optimize(m)
    x = torch.randn(6)
    for act in (torch.relu, torch.relu, torch.tanh, torch.tanh, torch.sigmoid):
        m.act = ref.act = Cfg.ACT = g["ACT"] = act
        assert torch.allclose(opt(x), ref(x)), act


def test_torchs_own_functions_stay_unguarded():
    """torch's own builtins are taken as fixed: no guard per torch function read."""
    def fn(x):
        return torch.tanh(x) + torch.special.expit(x)

    opt = dynamo.optimize(fn)
    x = torch.randn(4)
    opt(x)
    c = opt.compiled[0]
    assert not any("tanh" in chk or "expit" in chk for chk in c.guards._checks), c.guards._checks
