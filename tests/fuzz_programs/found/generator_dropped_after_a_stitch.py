"""Fuzzer reproducer: wrong side-effect count (LOG: 0 vs eager 1) on every call.

Status: fixed (python_shim/dynamo/interpreter.py, Interpreter.finish; snapshot.resume calls it);
kept as a regression reproducer.

`t1.tolist()` is a stitch: the rest of the call runs from a snapshot (snapshot.resume), which
returned the call's result without what Interpreter.run does at the end of a call: close the
generators the call dropped while suspended inside a try block. The generator's `finally`
(which eager runs when fn returns and drops it) never ran. Both ways out of a call now end in
Interpreter.finish.
"""
import torch
LOG = []


def GEN(v):
    try:
        yield v + 1
    finally:
        LOG.append(1)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    x1 = torch.randn((3, 3), generator=g)
    x2 = torch.randn((3, 3), generator=g)
    return (x0, x1, x2)


def build():
    def fn(x0, x1, x2):
        t1 = torch.exp(x2)
        it3 = iter((1.0, 2.0, 3.0, 4.0, 5.0))
        t2 = t1 + next(it3)
        _ = len(t1.tolist())
        t4 = torch.exp(t2)
        it9 = GEN(t4)
        t8 = next(it9)
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
