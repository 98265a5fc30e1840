"""Objects two interpreter frames share stay one object across a side exit or a stitch: a list
passed to a helper that appends to it, a dict, a closure's cell, a plain object the call made.
The snapshot numbers each mutable object once and the frames rebuilt from it hold the same one
again; before, each frame got its own copy and appends made after the exit were lost (a wrong
answer on every call, the first included). Compared with eager on every call."""
import torch

import dynamo


def run(f, make, calls=4):
    jit = dynamo.optimize(f)
    with torch.no_grad():
        for k in range(calls):
            args = make(k)
            got, want = jit(*args), f(*args)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (k, got, want)
    return dynamo.counters()


@dynamo.disable
def unrecordable():  # a stitch: made for real between two traces
    return 1


def append_around_a_stitch(acc, x):
    acc.append(x * 2)
    unrecordable()
    acc.append(x * 3)


def test_list_shared_with_a_helper_across_a_stitch():
    def f(x):
        outs = []
        append_around_a_stitch(outs, x)
        return torch.stack(outs).sum(0)
    c = run(f, lambda k: (torch.randn(5),))
    assert c["native_runs"] >= 2 and c["stitches"] >= 3, c


def fill_around_a_stitch(d, x):
    d["a"] = x + 1
    unrecordable()
    d["b"] = x * 4


def test_dict_shared_with_a_helper_across_a_stitch():
    def f(x):
        parts = {}
        fill_around_a_stitch(parts, x)
        return parts["a"] * parts.get("b", 0)
    c = run(f, lambda k: (torch.randn(5),))
    assert c["native_runs"] >= 2, c


class Box:
    def __init__(self, t):
        self.t = t
        self.extra = []


def grow_around_a_stitch(box, x):
    box.extra.append(x.sin())
    unrecordable()
    box.t = box.t + x
    box.extra.append(x.cos())


def test_plain_object_shared_with_a_helper_across_a_stitch():
    def f(x):
        b = Box(x * 2)
        grow_around_a_stitch(b, x)
        return b.t + torch.stack(b.extra).sum(0)
    c = run(f, lambda k: (torch.randn(5),))
    assert c["native_runs"] >= 2, c


def test_closure_cell_shared_across_a_side_exit():
    def f(x):
        total = x * 0

        def add(v):
            nonlocal total
            total = total + v
        add(x)
        if x.sum() > 0:  # a data-dependent branch: a side exit
            add(x * 10)
        else:
            add(x * -10)
        add(x)
        return total
    # (a closure made inside the call cannot be carried past the exit: the recording falls back;
    # what this checks is that the answers are eager's)
    run(f, lambda k: (torch.randn(5) + (3 if k % 2 else -3),), calls=6)


def test_list_shared_across_a_side_exit():
    def helper(acc, x):
        acc.append(x + 1)
        if acc[-1].sum() > 0:
            acc.append(x * 2)
        else:
            acc.append(x * -2)
        acc.append(x * 5)

    def f(x):
        outs = [x]
        helper(outs, x)
        return torch.stack(outs).sum(0)
    c = run(f, lambda k: (torch.randn(4) + (4 if k % 2 else -4),), calls=8)
    assert c["native_runs"] >= 2 and c["exits_resumed"] >= 2, c  # resumed from the snapshot


@dynamo.disable
def consume(acc, x):  # an unrecordable call that appends to a list the caller keeps
    acc.append(x * 7)


def test_a_step_given_a_list_the_frames_keep_is_not_stitched():
    """The step would get a list decoded for it alone while the frames kept another: no stitch
    there (the recording falls back), and the results are eager's."""
    def f(x):
        outs = [x]
        consume(outs, x)
        return torch.stack(outs).sum(0)
    run(f, lambda k: (torch.randn(3),))
