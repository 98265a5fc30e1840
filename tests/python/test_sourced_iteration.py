"""enumerate() and zip() over containers the call reads from its arguments (a ModuleList's
layers, lists of tensors): the elements keep their sources, so a layer's weights are trace inputs
and what the loop reads stays guarded; and torch.tensor() of a shape (a torch.Size). Each case is
compared with eager on every call, native after the first, and changed between calls (a layer
replaced, a weight written, another list length) to check the guards."""
import copy

import torch
import torch.nn as nn

import dynamo


def run(module, make, calls=3, change=None):
    ref = copy.deepcopy(module)
    jit = dynamo.optimize(module)
    with torch.no_grad():
        for k in range(calls):
            args = make()
            got, want = jit(*args), ref(*args)
            assert got.shape == want.shape
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (k, (got - want).abs().max())
            if change is not None and k == 0:
                change(module)
                change(ref)
    assert dynamo.counters()["native_runs"] >= 1, dynamo.report()
    assert dynamo.counters()["aborts"] == 0, dynamo.report()


class Enumerated(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x).relu() + i
        return x


def test_enumerate_over_a_module_list():
    run(Enumerated(), lambda: (torch.randn(2, 8),))


def test_enumerate_sees_a_replaced_layer_and_a_written_weight():
    def change(m):
        torch.manual_seed(3)
        m.layers[1] = nn.Linear(8, 8)
        m.layers[2].weight.mul_(-1)
    run(Enumerated(), lambda: (torch.randn(2, 8),), calls=4, change=change)


def test_enumerate_sees_a_layer_appended():
    def change(m):
        torch.manual_seed(4)
        m.layers.append(nn.Linear(8, 8))
    run(Enumerated(), lambda: (torch.randn(2, 8),), calls=4, change=change)


class PickOne(nn.Module):
    """torchvision's FeaturePyramidNetwork.get_result_from_inner_blocks: the layer at idx."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Conv2d(4, 4, 1) for _ in range(3))

    def forward(self, x, idx: int = 1):
        out = x
        for i, module in enumerate(self.blocks, start=-1):
            if i == idx - 1:
                out = module(x)
        return out


def test_enumerate_with_start_picks_a_layer():
    run(PickOne(), lambda: (torch.randn(1, 4, 5, 5),))


class Zipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.ModuleList(nn.Linear(6, 6) for _ in range(2))
        self.outer = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))  # zip stops at the shorter

    def forward(self, xs):
        outs = []
        for a, b, x in zip(self.inner, self.outer, xs):
            outs.append(b(a(x).tanh()))
        return torch.stack(outs).sum(0)


def test_zip_of_module_lists_and_a_tuple_of_tensors():
    run(Zipped(), lambda: ((torch.randn(3, 6), torch.randn(3, 6)),))


def test_zip_sees_another_tuple_length():
    m = Zipped()
    jit, ref = dynamo.optimize(m), copy.deepcopy(m)
    with torch.no_grad():
        for n in (2, 2, 1, 1):  # one tensor: zip stops after one layer pair
            xs = tuple(torch.randn(3, 6) for _ in range(n))
            assert torch.allclose(jit(xs), ref(xs), rtol=1e-5, atol=1e-5)
    assert dynamo.counters()["native_runs"] >= 2, dynamo.report()


def test_zip_over_a_list_is_cpythons():
    """A list may grow during the loop, so zip over one is CPython's own (live); its tensors
    have no sources then and the recording falls back. The answers are eager's."""
    m = Zipped()
    jit, ref = dynamo.optimize(m), copy.deepcopy(m)
    with torch.no_grad():
        for _ in range(3):
            xs = [torch.randn(3, 6), torch.randn(3, 6)]
            assert torch.allclose(jit(xs), ref(xs), rtol=1e-5, atol=1e-5)


class Queue:
    def __init__(self):
        self.items = []


def test_a_loop_sees_appends_to_the_list_it_iterates():
    """for t in q.items: ... q.items.append(...): the append is a stitch, and the loop after it
    goes on over the grown list, as CPython's list iterator does (it used to stop at the length
    the loop started with: a wrong answer on the first call)."""
    q = Queue()

    def f(x):
        out = x * 0
        for t in q.items:
            out = out + t
            if len(q.items) < 4:
                q.items.append(t * 2)
        return out

    jit = dynamo.optimize(f)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3)
            q.items = [x.clone()]
            want = f(x)
            assert len(q.items) == 4
            q.items = [x.clone()]
            got = jit(x)
            assert len(q.items) == 4
            assert torch.allclose(got, want), (got, want)


class SizeAsData(nn.Module):
    """torchvision's detection transform: torch.tensor(image.shape[-2:])."""

    def forward(self, x):
        hw = torch.tensor(x.shape[-2:])
        scale = torch.as_tensor(x.shape[1:], dtype=torch.float32)
        return x * hw.prod() / scale.sum()


def test_tensor_of_a_shape():
    run(SizeAsData(), lambda: (torch.randn(2, 3, 4, 5),))
    with torch.no_grad():  # another shape: another trace, never the first one's numbers
        jit = dynamo.optimize(SizeAsData())
        for shape in ((1, 2, 3, 3), (1, 2, 3, 3), (1, 5, 2, 7)):
            x = torch.randn(shape)
            assert torch.allclose(jit(x), SizeAsData()(x))
