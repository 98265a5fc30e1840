"""Fuzzer reproducer: wrong side-effect count (call 0): LOG: 0 vs eager 1.

Status: fixed (python_shim/dynamo/snapshot.py, _locals_spec and resume); kept as a regression
reproducer.

A generator suspended inside its `try` block is live at a stitch (here the item assignment
`STATE['calls'] += 1` into a dict from outside the call) and is not used after it. Eager closes
it when the call returns (its last reference goes with the frame), so its `finally` appends to
LOG during the call. The snapshot left that local unbound (nothing reads it after the stitch),
so the generator stayed with the recording's frames and was closed by the collector a call or
two later (LOG: 0, 2, 1, ...). A local whose object has a finalizer is never dropped from a
snapshot now, and the frames a resumed call ran are let go when it returns or raises.
"""
import torch
LOG = []


def GEN(v):
    try:
        yield v + 1
    finally:
        LOG.append(1)


STATE = {'calls': 0}
KEYWORDS = ('x1',)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((1 + seed % 2, 8, 2, 3), generator=g)
    x1 = torch.randn((5, 2), generator=g)
    return (x0, x1, )


def build():
    def fn(x0, **kw):
        x1 = {**kw}['x1']
        it2 = GEN(x1)
        t1 = next(it2)
        STATE['calls'] += 1
    target = fn
    return target


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
