"""Fuzzer reproducer: wrong result (call 1): -1.78 vs eager -1.93.

Status: fixed (python_shim/dynamo/sources.py, _touch_elements); kept as a regression reproducer.

`dict(kw.items())['x3']`: kw.items() of a **kwargs dict is a tuple of (key, value) pairs whose
values keep their sources; dict() of it guarded the tuple's elements but not what the pairs
held, so the slice passed by keyword was never guarded and the trace kept the first call's
`slice(0, 2)` when the next call passed `slice(1, 3)`. Elements of such pairs are guarded now.
"""
import torch
KEYWORDS = ('x3',)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((), generator=g)
    x1 = torch.randn((3, 3), generator=g)
    x2 = torch.randn((3, 3), generator=g)
    x3 = slice(seed % 2, 2 + seed % 2)
    return (x0, x1, x2, x3, )


def build():
    def fn(x0, x1, x2, **kw):
        x3 = dict(kw.items())['x3']
        t1 = x2[x3] * 2
        return t1
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
