"""Fuzzer reproducer: wrong input mutation (on the first call that leaves the trace at its branch).

Status: fixed by commit 1a791a8 (python_shim/dynamo/snapshot.py); kept as a regression reproducer.

    def fn(x0):                    # x0 = torch.randn(3, 3, 3)
        t = x0.view(9, 3)          # a view of the input, live across the branch
        if t.sum() > 0:            # recorded one way; a later call goes the other way
            y = t * 1
        else:
            y = t * 2
        t.mul_(2.0)                # writes the input through the view
        return y

On a call that takes the side exit (the branch goes the other way than recorded), the call resumes
in the interpreter: its result is right, but x0 is NOT doubled (eager doubles it). Smallest form found:

    def fn(x0, x1):
        t1 = x1.reshape(-1)
        if t1.sum() > 0:           # the write happens only on the branch the trace did not record
            t1.mul_(2.0)
        return x1                  # x1 is not doubled

The fuzzer also
found the module form (t1 = x1.reshape(9, 3); t2 = t1.sum(0); if t2.sum() > 0: ...; t1.mul_(2)), and a
second symptom of the same thing: with x1 an expanded (stride-0) input, t2 = x1.reshape(-1) is a view
whose elements share memory; after the exit, `t3 = t2.reshape(-1); t3[0] = 2.0` sets only element 0
instead of all of them (wrong result).
Likely cause: python_shim/dynamo/snapshot.py, encode(): a tensor live at the exit that is not an
input is encoded as ("live", i), the exit's i-th live value computed by the trace; a view of an
input comes back as a separate tensor, so it no longer aliases the input (nor itself, for
stride-0 views) when the interpreter resumes. Views of inputs need to be re-derived from this
call's input (or the exit refused for them).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed + 3)  # call 0 records the else-branch, call 2 takes the exit
    x0 = torch.randn((3, 3, 3), generator=g)
    return (x0, )


def build():
    def fn(x0):
        t = x0.view(9, 3)
        if t.sum() > 0:
            y = t * 1
        else:
            y = t * 2
        t.mul_(2.0)
        return y
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
