"""Fuzzer reproducer: wrong result (calls 1..3).

Status: fixed by commit 78deca5 (jit/fuse.cpp); kept as a regression reproducer.

An in-place write into an input followed by a branch on a value computed from it (a side exit):

    def fn(x0):                    # x0 = torch.randn(3, 3)
        x0[0] = 2.0                # or x0.add_(10.0)
        if x0.sum() > 0:           # eager: True on every call
            return torch.exp(x0)
        return torch.tanh(x0)

Eager returns exp(x0) on every call; dynamo takes the side exit on every native call (counters:
side_exits 3, native_runs 0) and returns tanh(x0) (e.g. [0, 0]: 0.964 instead of 7.389).
Trace: %5 = select_scatter(%0, ...); %6 = copy_(%0, %5); %7 = extern aten::sum(%6); %8 = gt(%7, 0);
%9 = dynamo::guard(%8, true, 0). Likely cause (jit/fuse.cpp, flush_mutations_before /
schedule_mutations): writes into inputs are deferred and flushed just before the guard, and after
the flush the copy_ value is read from the input's memory (p.views[c] = mutation_dest); but the
extern aten::sum that feeds the guard comes before the flush, so it reads the input's OLD contents.
Without a guard the same program is right (the write is not flushed early).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0, )


def build():
    def fn(x0):
        x0[0] = 2.0
        if x0.sum() > 0:
            t1 = torch.exp(x0)
        else:
            t1 = torch.tanh(x0)
        return t1
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
