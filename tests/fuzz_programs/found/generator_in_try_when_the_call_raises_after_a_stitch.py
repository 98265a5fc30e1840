"""Fuzzer reproducer: wrong side-effect count (call 0): LOG: 0 vs eager 1.

Status: fixed (python_shim/dynamo/snapshot.py, resume); kept as a regression reproducer.

After a stitch (`x0.tolist()`) the rest of the call runs from a snapshot; there it makes a
generator, suspends it inside its `try`, and then raises (NameError: `helper` is not defined).
Eager's generator is closed when the caller drops the traceback's frames (the driver clears
them at once), its `finally` appending to LOG. The resumed frames stayed listed in the
interpreter, which the generator refers to: a cycle, collected a call or two later. The
interpreter lets go of a resumed call's frames when it returns or raises.
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
    x0 = torch.randn((8, 7), generator=g).half()
    x1 = torch.randint(-4, 5, (0,), generator=g)
    x2 = torch.randn((1, 8, 8, 2), generator=g).expand(4, 8, 8, 2)
    x3 = torch.randn((1, 7), generator=g).half()
    x4 = torch.randn((8 + seed % 2, 7, 1), generator=g).half()
    return (x0, x1, x2, x3, x4, )


def build():
    def fn(x0, x1, x2, x3, x4):
        _ = len(x0.tolist())
        it6 = GEN(x0)
        t5 = next(it6)
        t9 = helper(t3, alpha)
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
