"""Fuzzer reproducer: leaked exception (TypeError: only integer tensors of a single element can
be converted to an index) on the third call.

Status: fixed (python_shim/dynamo/frontend.py: the rest of a call after a stitch runs outside
the front end's `except StitchNow` block); kept as a regression reproducer.

Three host reads (`tolist()`) are three stitches; by the third call the trace tree is full
(config.max_stitches) and the rest of the call runs in the interpreter from inside the front
end's handler of the StitchNow. The KeyError that `{}['k']` raises for real was then chained by
CPython to that StitchNow, whose args[0] is the tolist() list, so `__e.__context__.args[0]` read
a list instead of the ValueError's 3.
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0,)


def build():
    def fn(x0):
        it2 = iter((1.0, 2.0, 3.0, 4.0, 5.0))
        t1 = x0 + next(it2)
        _ = len(x0.tolist())
        it4 = iter((1.0, 2.0, 3.0, 4.0, 5.0))
        t3 = t1 + next(it4)
        _ = len(t1.tolist())
        t6 = torch.tanh(t3)
        it8 = iter((1.0, 2.0, 3.0, 4.0, 5.0))
        t7 = t6 + next(it8)
        _ = len(t6.tolist())
        try:
            try:
                raise ValueError(3)
            except ValueError:
                {}['k']
        except KeyError as __e:
            t9 = t7 * __e.__context__.args[0]
        return t9
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
