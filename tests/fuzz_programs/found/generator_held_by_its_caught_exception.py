"""Fuzzer reproducer: wrong side-effect count (call 0: LOG 0 vs eager 1).

Status: fixed (python_shim/dynamo/interpreter.py, _without_own_frames; release() drops the
exceptions a call met); kept as a regression reproducer.

A KeyError thrown into the generator is caught there, and the generator stays suspended in the
handler, holding the exception. The exception's traceback went through the interpreter's own
frames, one of which holds the generator object: a cycle, so when the call then raised (the
program's own error, layer_norm on bools) the generator was closed only when the garbage
collector ran, not when the call's frames went, as in eager. An exception the program catches
now holds no interpreter frame.
"""
import torch
import torch.nn.functional as F
LOG = []


def GEN(v):
    try:
        yield v + 1
    except KeyError:
        yield v - 3
    finally:
        LOG.append(1)


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((3, 3), generator=g)
    return (x0,)


def build():
    def fn(x0):
        it2 = GEN(x0)
        t1 = next(it2)
        t1 = t1 + it2.throw(KeyError('k'))
        t3 = (t1 > t1)
        t4 = F.layer_norm(t3, t3.shape[-1:])
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
