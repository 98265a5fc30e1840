"""Attributes a call sets on objects from outside it (write-backs), objects from outside that
it returns, and what a recording now carries through: objects read back out of the call's own
lists and dicts, unused closures and defaultdicts live at a side exit. Every call is compared
with eager on a copy of the same state (a key/value cache that grows each call, as Hugging
Face's DynamicCache does), over calls whose values and objects change."""
import abc
import collections
import copy
import functools

import pytest
import torch

import dynamo
from dynamo import config


class LayerBase(abc.ABC):  # (transformers' cache layers derive from an ABC)
    @abc.abstractmethod
    def update(self, k, v):
        ...


class Layer(LayerBase):
    def __init__(self):
        self.ready = False
        self.keys = self.values = None

    def update(self, k, v):
        if not self.ready:
            self.dtype = k.dtype
            self.keys = torch.zeros(k.shape[0], 0, k.shape[2])
            self.values = torch.zeros(k.shape[0], 0, k.shape[2])
            self.ready = True
        self.keys = torch.cat([self.keys, k], dim=1)
        self.values = torch.cat([self.values, v], dim=1)
        return self.keys, self.values


class Cache:
    def __init__(self, n):
        self.layers = [Layer() for _ in range(n)]

    def update(self, k, v, i):
        return self.layers[i].update(k, v)

    def length(self):
        return 0 if not self.layers[0].ready else self.layers[0].keys.shape[1]


class Attention(torch.nn.Module):
    def __init__(self, d, i):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.i = i

    def forward(self, x, cache):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        k, v = cache.update(k, v, self.i)
        att = torch.softmax(q @ k.transpose(1, 2) / k.shape[-1] ** 0.5, dim=-1)
        return x + att @ v


class Decoder(torch.nn.Module):
    def __init__(self, d=16, n=2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Attention(d, i) for i in range(n))

    def forward(self, x, cache=None, **kwargs):
        for blk in self.blocks:
            x = blk(x, cache=cache, **kwargs)
        return {"out": x, "cache": cache}


def _steps(model, opt, lengths, fresh_every=None):
    """Runs model (eager) and opt on the same inputs, each with its own cache; compares every
    output and the caches' tensors after every call."""
    torch.manual_seed(0)
    ce, cd = Cache(len(model.blocks)), Cache(len(model.blocks))
    for step, t in enumerate(lengths):
        if fresh_every and step and step % fresh_every == 0:
            ce, cd = Cache(len(model.blocks)), Cache(len(model.blocks))
        x = torch.randn(1, t, 16)
        want, got = model(x.clone(), cache=ce), opt(x.clone(), cache=cd)
        torch.testing.assert_close(got["out"], want["out"])
        assert got["cache"] is cd  # the object the call was given, as eager returns it
        for le, ld in zip(ce.layers, cd.layers):
            torch.testing.assert_close(ld.keys, le.keys)
            torch.testing.assert_close(ld.values, le.values)
            assert (ld.ready, getattr(ld, "dtype", None)) == (le.ready, getattr(le, "dtype", None))


def test_a_growing_cache_is_updated_as_eager_updates_it_and_runs_natively():
    model = Decoder().eval()
    opt = dynamo.optimize(copy.deepcopy(model))
    before = dynamo.counters()["native_runs"]
    with torch.no_grad():
        # a prompt, then one token a call; a new cache every 4 calls (a new generate()): the
        # calls at lengths seen before run natively on the new cache objects
        _steps(model, opt, [3, 1, 1, 1] * 3, fresh_every=4)
    assert dynamo.counters()["native_runs"] - before >= 6, dynamo.explain(opt, torch.randn(1, 1, 16), cache=Cache(2))


def test_without_write_backs_the_store_is_a_stitch_and_still_right():
    model = Decoder().eval()
    opt = dynamo.optimize(copy.deepcopy(model))
    config.write_backs = False
    try:
        with torch.no_grad():
            _steps(model, opt, [3, 1, 1, 1] * 2, fresh_every=4)
    finally:
        config.write_backs = True


class Box:
    def __init__(self, t, scale):
        self.t, self.scale = t, scale


def _swap(a, b):
    a.t = a.t * 2  # (a write-back) ...
    return b.t + a.t * b.scale  # ... then a read of b.t: the new value where a is b


@pytest.mark.parametrize("same_first", [True, False])
def test_a_write_then_a_read_through_another_argument_follows_aliasing(same_first):
    opt = dynamo.optimize(_swap)
    with torch.no_grad():
        for call, same in enumerate([same_first, not same_first, same_first, not same_first]):
            t = torch.randn(5)
            a1 = Box(t.clone(), float(call + 1))
            b1 = a1 if same else Box(t.clone() + 1, 0.5)
            a2 = Box(t.clone(), float(call + 1))
            b2 = a2 if same else Box(t.clone() + 1, 0.5)
            torch.testing.assert_close(opt(a2, b2), _swap(a1, b1))
            torch.testing.assert_close(a2.t, a1.t)


def _write_then_branch(box, x):
    box.t = box.t + x
    if box.t.sum() > 0:  # a branch on a tensor after a write-back: the recording ends there
        return box.t * 2
    return box.t - 1


def test_a_branch_on_a_tensor_after_a_write_back_stays_right():
    opt = dynamo.optimize(_write_then_branch)
    with torch.no_grad():
        for s in (1.0, -3.0, 2.0, -5.0, 1.0):
            e, d = Box(torch.full((3,), s), 1.0), Box(torch.full((3,), s), 1.0)
            x = torch.ones(3)
            torch.testing.assert_close(opt(d, x), _write_then_branch(e, x))
            torch.testing.assert_close(d.t, e.t)


def _through_containers(x, c):
    d = {"c": c}
    lst = [c]
    return x * d["c"].n + lst[0].m


def test_attributes_read_through_the_calls_own_containers_are_guarded():
    opt = dynamo.optimize(_through_containers)
    c = Box(None, 0.0)
    with torch.no_grad():
        for n, m in ((2.0, 1.0), (3.0, 1.0), (3.0, -1.0), (4.0, 5.0)):
            c.n, c.m = n, m  # the same object, its attributes changed between calls
            x = torch.randn(4)
            torch.testing.assert_close(opt(x, c), _through_containers(x, c))


def _wrapped(x, flag):
    def helper(y):  # a closure made in the call, not used after the branch below
        return y * flag.scale
    y = helper(x)
    seen = collections.defaultdict(tuple)
    seen["y"] += (y,)
    if y.sum() > 0:  # a side exit whose snapshot leaves `helper` unbound and carries `seen`
        return seen["y"][0] + 1
    return seen["y"][0] - 1


def test_a_side_exit_past_an_unused_closure_and_a_defaultdict():
    opt = dynamo.optimize(_wrapped)
    flag = Box(None, 2.0)
    with torch.no_grad():
        for s in (1.0, -1.0, 2.0, -2.0, 3.0, -3.0) * 2:
            x = torch.full((4,), s)
            torch.testing.assert_close(opt(x, flag), _wrapped(x, flag))
    assert not any("closure" in r or "defaultdict" in r for r in map(str, dynamo.explain(_wrapped, x, flag).aborts)), \
        dynamo.explain(_wrapped, x, flag)


def test_hugging_face_generate_with_a_kv_cache_runs_natively():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 256, (1, 7))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        model.forward = dynamo.optimize(model.forward)
        before = dynamo.counters()["native_runs"]
        for _ in range(2):
            assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0), want)
    # the second generate() runs every forward natively (the first records one trace per length)
    assert dynamo.counters()["native_runs"] - before >= 6


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_generate_with_a_static_cache_is_two_traces_at_every_length(family):
    """generate(cache_implementation="static"): transformers' StaticCache holds the keys and values
    in tensors of a fixed length written in place (index_copy_), so every decode step has the same
    shapes: one trace for the prompt and one for all decode steps (no size family instances),
    every step after the first two native, the tokens eager's."""
    transformers = pytest.importorskip("transformers")
    if family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)
    else:
        cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 256, (1, 7))
    kw = dict(max_new_tokens=9, min_new_tokens=9, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = dynamo.optimize(model.forward)
        for _ in range(3):
            assert torch.equal(model.generate(ids, **kw), want)
    c = dynamo.counters()
    assert c["traces_compiled"] == 2 and c["size_instances"] == 0, c
    assert c["native_runs"] >= 3 * 9 - 2 and c["eager_runs"] == 0, c


def _make_mask(offset):
    def mask(q, k):
        return k <= q + offset
    return mask


def _closure_live_at_exit(x, off):
    m = _make_mask(off)  # a closure the call made, used after the branch (Hugging Face's mask functions)
    y = x * 2 if x.sum() > 0 else x - 1
    return y + m(1, 2)


def _wrapper_live_at_exit(x, s):
    def scale(t):
        return t * s

    @functools.wraps(scale)
    def wrapped(t):
        return scale(t) + 1
    if x.mean() > 0:
        return wrapped(x)
    return wrapped(-x)


@pytest.mark.parametrize("fn,extra", [(_closure_live_at_exit, 1), (_wrapper_live_at_exit, 2.0)],
                         ids=["closure", "wrapper"])
def test_a_closure_the_call_made_is_carried_across_a_side_exit(fn, extra):
    opt = dynamo.optimize(fn)
    with torch.no_grad():
        for s in (1.0, -1.0, 2.0, -2.0) * 6:
            x = torch.full((4,), s)
            torch.testing.assert_close(opt(x, extra), fn(x, extra))
    assert dynamo.counters()["side_traces_compiled"] >= 1
    assert not dynamo.explain(fn, x, extra).aborts


class State:
    def __init__(self):
        self.k = torch.zeros(2, 3)


def _store_forms(x, st, inp):
    st.inp = inp              # an input tensor: the call's own object again
    st.view = x[:, 1:]        # a view of the call's argument
    t = x * 2
    st.k = t                  # then written in place after the store: the object holds the new values
    t.add_(1)
    st.last = t[-1]           # a view of a tensor the trace computed
    st.k = st.k + 0.5         # written twice: the last one holds
    st.n = float(x.shape[0])  # a plain value
    return st.k.sum()


def test_the_forms_a_write_back_takes_match_eager():
    opt = dynamo.optimize(_store_forms)
    with torch.no_grad():
        for _ in range(4):
            x, inp = torch.randn(2, 3), torch.randn(3)
            se, sd = State(), State()
            torch.testing.assert_close(opt(x, sd, inp), _store_forms(x, se, inp))
            assert sd.inp is inp and se.inp is inp
            for name in ("k", "view", "last"):
                torch.testing.assert_close(getattr(sd, name), getattr(se, name))
            assert sd.view._base is x and sd.n == se.n  # a view of the argument, as eager's
    assert dynamo.counters()["native_runs"] >= 2


def _set_scaled(o, x):
    o.h = x * 2 + 1
    return x.sum(0)


def test_a_size_family_instance_makes_the_write_backs_of_its_traces():
    """A size family made from traces with write-backs: its instances (no recording) set the
    attributes as the recorded traces do, and return the call's own result."""
    opt = dynamo.optimize(_set_scaled)
    before = dynamo.counters()["size_instances"]
    with torch.no_grad():
        for n in (3, 5, 7, 9, 11):
            x = torch.randn(n, 4)
            oe, od = State(), State()
            oe.h = od.h = None
            torch.testing.assert_close(opt(od, x), _set_scaled(oe, x))
            torch.testing.assert_close(od.h, oe.h)
    assert dynamo.counters()["size_instances"] - before >= 1


class _Flags:
    def __init__(self):
        self.updated = {0: False, 1: False}
        self.k = None


def _cross_attention_step(x, cache, layer):
    """As Hugging Face's encoder-decoder cache: the first step computes and stores the cross
    keys and marks the layer updated (an item assignment into the cache's dict); later steps
    read them back."""
    if not cache.updated[layer]:
        cache.k = x * 2
        cache.updated[layer] = True
    return x @ cache.k.T + cache.updated[layer]


def test_an_item_set_in_a_dict_from_outside_is_made_again_after_each_native_run():
    opt = dynamo.optimize(_cross_attention_step)
    before = dynamo.counters()["native_runs"]
    with torch.no_grad():
        for step in range(8):
            if step % 4 == 0:  # (a new generate(): a fresh cache)
                ce, cd = _Flags(), _Flags()
            x = torch.randn(2, 3)
            for layer in (0, 1):
                torch.testing.assert_close(opt(x, cd, layer), _cross_attention_step(x, ce, layer))
                assert cd.updated == ce.updated
                torch.testing.assert_close(cd.k, ce.k)
    assert dynamo.counters()["native_runs"] - before >= 8
