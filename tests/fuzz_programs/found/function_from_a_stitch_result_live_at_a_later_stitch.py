"""Fuzzer reproducer: leaked exception (RuntimeError: dynamo: cannot rebuild the frames at
collections/__init__.py: NameError: name 'x' is not defined, after the call at the stitch was made).

Status: fixed (python_shim/dynamo/snapshot.py, _frame_states); kept as a regression reproducer.

`__import__('collections')` is a call dynamo makes between traces (a stitch), so the namedtuple
function is read from that stitch's result (source x[i]); inside it, namedtuple's own eval is a
second stitch, whose snapshot named the running frame's function by that x[i] source, which the
second exit does not have. A frame whose function came from a stitch's result now keeps the
second stitch from being made (the recording ends there; the call goes on correctly).
"""
import torch


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn((2,), generator=g, dtype=torch.float64)
    x1 = torch.randn((1, 2, 10), generator=g)[..., ::2]
    return (x0, x1)


def build():
    def fn(x0, x1):
        t2 = torch.nn.functional.mse_loss(x0, x0)
        __P = __import__('collections').namedtuple('__P', 'u w')
        __p = __P(x1, 2.0)
        t8 = __P(__p.u * __p[1], __p.w)[0]
        return [t2, t8]
    return fn


def mutate(call, target):
    pass


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from run import check_source
    print(check_source(open(__file__).read()) or "no failure: eager and dynamo agree")
