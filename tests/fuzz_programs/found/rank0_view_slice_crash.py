"""Fuzzer reproducer: crash (SIGSEGV in the compiler, native.Frame.compile).

Status: fixed by commit 78deca5 (jit/fuse.cpp); kept as a regression reproducer.

A 0-dim tensor viewed/reshaped to 1-D and then sliced crashes the process while the trace compiles:

    def f(x):                      # x = torch.randn(())
        return x.view(-1)[0:]      # also x.view(-1)[:3].add_(1.0) on an input or a temporary

Trace: %1 = reshape(%0 : f32[], [1]); %2 = slice(%1, 0, 0, 1, 1)  -> segfault.
Likely cause (jit/fuse.cpp): reshape_strides() returns false for a rank-0 source (ATen's computeStride
special-cases an empty old shape), and Planner::fold_view's copy fallback ignores that the second
call fails too, leaving the view's strides empty; folding the slice then reads s[0] out of bounds.
Running this file crashes the process (that is the failure).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g)
    return (x0, )


def build():
    def fn(x0):
        t1 = x0.view(-1)[0:]
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
