"""Fuzzer reproducer: wrong state (a captured tensor after call 1).

Status: fixed by commit 78deca5 (jit/fuse.cpp); kept as a regression reproducer.

Two chained in-place writes into an input (here a tensor captured from the enclosing scope, which
is a trace input) before a side-exit guard:

    w = torch.ones(3, 3)
    def fn(x):
        t = torch.exp(x)
        t[0] = 2.0
        w.add_(t).mul_(0.5)
        if t.sum() > 0:            # any tensor branch after the writes
            return t * 2
        return t * 3

Eager: w = (w + t) * 0.5 each call. dynamo's native runs give w = w * 0.5 (the add is lost),
e.g. after call 1, w[0, 0] = 0.75 instead of 1.75.
Trace: %8 = add(%1, %7); %9 = copy_(%1, %8); %10 = extern aten::mul.Scalar(%9, 0.5);
%11 = copy_(%9, %10); ...; dynamo::guard(...). Same cause as guard_after_input_write.py: with a
guard after them, the writes are flushed just before the guard and %9 is then read from the input's
memory, but the extern mul that reads %9 runs before that flush and sees the old contents.
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0, )


def build():
    w = torch.ones((3, 3))

    def fn(x0):
        t1 = torch.exp(x0)
        t1[0] = 2.0
        w.add_(t1).mul_(0.5)
        if t1.sum() > 0:
            return t1 * 2
        return t1 * 3
    fn.fuzz_cells = {'w': w}
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
