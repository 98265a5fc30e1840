"""Fuzzer reproducer: wrong side-effect count (call 3: LOG 6 vs eager 4).

Status: fixed (python_shim/dynamo/generators.py, _Generator.__del__; frontend.py marks the
recording abandoned); kept as a regression reproducer.

The call raises NameError (t13 is never bound) after advancing a generator that is suspended
inside try/finally. A recording that raises with no effect made is run again eagerly; the
interpreter's generator of the discarded recording was then collected and closed too, so its
finally ran twice per call (when the garbage collector reached it: mutate() collects at once).
A discarded recording's generators close silently now.
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
    x0 = torch.randn((4, 4, 3), generator=g)
    x1 = torch.randperm(4, generator=g)[:2]
    return (x0, x1)


def build():
    def fn(x0, x1):
        it3 = (c * 2 for c in (1.0, 2.0, 3.0))
        t2 = x0 + next(it3)
        it11 = GEN(t2)
        t10 = next(it11)
        t13.reshape(-1, 10007)  # noqa: F821 -- NameError, as eager raises it
    return fn


def mutate(call, target):
    import gc
    gc.collect()  # (the discarded recording's frames sit in a reference cycle: collect them at a known point)


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
